//! Cost of CEL expressions, after cel-go's model as Kubernetes applies it:
//! every call, selection and comprehension iteration costs, string and list
//! functions cost in proportion to their sizes. Sizes come from a `Shape`:
//! from the schema at CRD creation (maxItems, maxLength, maxProperties, or
//! the largest request when unbounded), or from the actual value at run
//! time, so an expression is refused before it could run unbounded.

use std::collections::BTreeMap;

use ::cel::common::ast::{EntryExpr, Expr, LiteralValue};
use ::cel::IdedExpr;
use serde_json::Value;

/// Kubernetes' `PerCallLimit`: the most one evaluation may cost.
pub const PER_CALL_LIMIT: u64 = 1_000_000;
/// Kubernetes' `RuntimeCELCostBudget`: the most all rules on one object may cost.
pub const RUNTIME_COST_BUDGET: u64 = 10_000_000;
/// Kubernetes' `StaticEstimatedCostLimit`: the most one rule may be estimated at.
pub const STATIC_ESTIMATED_COST_LIMIT: u64 = 10_000_000;
/// Kubernetes' `StaticEstimatedCRDCostLimit`: the most all rules of a schema
/// (each times the number of times it can run) may be estimated at.
pub const STATIC_ESTIMATED_CRD_COST_LIMIT: u64 = 100_000_000;
/// The largest request body the API server accepts (3 MiB), which bounds
/// every unbounded list, map and string.
pub const MAX_REQUEST_BYTES: u64 = 3 * 1024 * 1024;

/// The size of a value, as far as cost is concerned.
#[derive(Debug, Clone, PartialEq)]
pub enum Shape {
    /// A number, boolean or null.
    Scalar,
    /// A string of at most `max_len` bytes.
    Str { max_len: u64 },
    /// A list of at most `max_items` elements shaped `elem`.
    List { max_items: u64, elem: Box<Shape> },
    /// A map or object of at most `max_props` entries: known `fields`, other
    /// values shaped `values`.
    Map {
        max_props: u64,
        fields: BTreeMap<String, Shape>,
        values: Box<Shape>,
    },
    /// Anything up to `max_size` bytes of JSON.
    Unknown { max_size: u64 },
}

impl Shape {
    /// The unbounded shape: anything a request can carry.
    pub fn unbounded() -> Shape {
        Shape::Unknown {
            max_size: MAX_REQUEST_BYTES,
        }
    }

    /// The shape of an actual value (lists' elements merged to their largest).
    pub fn of(v: &Value) -> Shape {
        match v {
            Value::String(s) => Shape::Str {
                max_len: s.len() as u64,
            },
            Value::Array(a) => {
                let mut elem: Option<Shape> = None;
                for x in a {
                    let s = Shape::of(x);
                    elem = Some(match elem {
                        None => s,
                        Some(e) => e.merge(s),
                    });
                }
                Shape::List {
                    max_items: a.len() as u64,
                    elem: Box::new(elem.unwrap_or(Shape::Scalar)),
                }
            }
            Value::Object(m) => {
                let mut values: Option<Shape> = None;
                let mut fields = BTreeMap::new();
                for (k, x) in m {
                    let s = Shape::of(x);
                    values = Some(match values {
                        None => s.clone(),
                        Some(e) => e.merge(s.clone()),
                    });
                    fields.insert(k.clone(), s);
                }
                Shape::Map {
                    max_props: m.len() as u64,
                    fields,
                    values: Box::new(values.unwrap_or(Shape::Scalar)),
                }
            }
            _ => Shape::Scalar,
        }
    }

    /// The smallest shape covering both.
    pub fn merge(self, other: Shape) -> Shape {
        match (self, other) {
            (Shape::Scalar, Shape::Scalar) => Shape::Scalar,
            (Shape::Str { max_len: a }, Shape::Str { max_len: b }) => {
                Shape::Str { max_len: a.max(b) }
            }
            (
                Shape::List {
                    max_items: a,
                    elem: ea,
                },
                Shape::List {
                    max_items: b,
                    elem: eb,
                },
            ) => Shape::List {
                max_items: a.max(b),
                elem: Box::new(ea.merge(*eb)),
            },
            (
                Shape::Map {
                    max_props: a,
                    fields: mut fa,
                    values: va,
                },
                Shape::Map {
                    max_props: b,
                    fields: fb,
                    values: vb,
                },
            ) => {
                for (k, s) in fb {
                    let merged = match fa.remove(&k) {
                        Some(x) => x.merge(s),
                        None => s,
                    };
                    fa.insert(k, merged);
                }
                Shape::Map {
                    max_props: a.max(b),
                    fields: fa,
                    values: Box::new(va.merge(*vb)),
                }
            }
            (a, b) => Shape::Unknown {
                max_size: a.size().max(b.size()),
            },
        }
    }

    /// A bound on the serialized size of a value of this shape.
    pub fn size(&self) -> u64 {
        match self {
            Shape::Scalar => 8,
            Shape::Str { max_len } => *max_len,
            Shape::List { max_items, elem } => max_items.saturating_mul(elem.size().max(1)),
            Shape::Map {
                max_props, values, ..
            } => max_props.saturating_mul(values.size().max(1)),
            Shape::Unknown { max_size } => *max_size,
        }
    }

    /// How many elements iterating this value visits, and their shape.
    fn iteration(&self) -> (u64, Shape) {
        match self {
            Shape::List { max_items, elem } => (*max_items, (**elem).clone()),
            // Kubernetes sizes map keys at zero when estimating (their
            // declared type has no length); actual keys are measured at run time.
            Shape::Map {
                max_props, fields, ..
            } => (
                *max_props,
                Shape::Str {
                    max_len: fields.keys().map(|k| k.len() as u64).max().unwrap_or(0),
                },
            ),
            Shape::Str { max_len } => (*max_len, Shape::Str { max_len: 1 }),
            Shape::Scalar => (0, Shape::Scalar),
            Shape::Unknown { max_size } => (
                max_size / 2,
                Shape::Unknown {
                    max_size: *max_size,
                },
            ),
        }
    }

    fn field(&self, name: &str) -> Shape {
        match self {
            Shape::Map { fields, values, .. } => fields
                .get(name)
                .cloned()
                .unwrap_or_else(|| (**values).clone()),
            Shape::List { elem, .. } => (**elem).clone(),
            Shape::Unknown { max_size } => Shape::Unknown {
                max_size: *max_size,
            },
            _ => Shape::Scalar,
        }
    }

    /// Length in bytes or elements, for the functions that cost per unit.
    fn len(&self) -> u64 {
        match self {
            Shape::Str { max_len } => *max_len,
            Shape::List { max_items, .. } => *max_items,
            Shape::Map { max_props, .. } => *max_props,
            Shape::Unknown { max_size } => *max_size,
            Shape::Scalar => 1,
        }
    }
}

/// Worst-case cost of one evaluation of `e` with variables of the given shapes.
pub fn estimate(e: &IdedExpr, vars: &[(&str, Shape)]) -> u64 {
    let mut scope: Vec<(String, Shape)> = vars
        .iter()
        .map(|(n, s)| (n.to_string(), s.clone()))
        .collect();
    let mut est = Estimator { accu: Vec::new() };
    est.walk(e, &mut scope).0
}

struct Estimator {
    /// The accumulator variables of the comprehensions being walked: appending
    /// to them costs once per element, as in cel-go.
    accu: Vec<String>,
}

fn tenth(n: u64) -> u64 {
    n.div_ceil(10)
}

impl Estimator {
    fn walk(&mut self, e: &IdedExpr, scope: &mut Vec<(String, Shape)>) -> (u64, Shape) {
        match &e.expr {
            Expr::Literal(l) => (
                0,
                match l {
                    LiteralValue::String(s) => Shape::Str {
                        max_len: s.len() as u64,
                    },
                    LiteralValue::Bytes(b) => Shape::Str {
                        max_len: b.len() as u64,
                    },
                    _ => Shape::Scalar,
                },
            ),
            Expr::Ident(name) => {
                let s = scope
                    .iter()
                    .rev()
                    .find(|(n, _)| n == name)
                    .map(|(_, s)| s.clone())
                    .unwrap_or_else(Shape::unbounded);
                (1, s)
            }
            Expr::Select(sel) => {
                let (c, s) = self.walk(&sel.operand, scope);
                if sel.test {
                    (c + 1, Shape::Scalar)
                } else {
                    (c + 1, s.field(&sel.field))
                }
            }
            Expr::List(l) => {
                let mut cost = 10u64;
                let mut elem: Option<Shape> = None;
                for x in &l.elements {
                    let (c, s) = self.walk(x, scope);
                    cost = cost.saturating_add(c);
                    elem = Some(match elem {
                        None => s,
                        Some(e) => e.merge(s),
                    });
                }
                (
                    cost,
                    Shape::List {
                        max_items: l.elements.len() as u64,
                        elem: Box::new(elem.unwrap_or(Shape::Scalar)),
                    },
                )
            }
            Expr::Map(m) => {
                let mut cost = 30u64;
                let mut values: Option<Shape> = None;
                for en in &m.entries {
                    if let EntryExpr::MapEntry(me) = &en.expr {
                        let (ck, _) = self.walk(&me.key, scope);
                        let (cv, s) = self.walk(&me.value, scope);
                        cost = cost.saturating_add(ck).saturating_add(cv);
                        values = Some(match values {
                            None => s,
                            Some(e) => e.merge(s),
                        });
                    }
                }
                (
                    cost,
                    Shape::Map {
                        max_props: m.entries.len() as u64,
                        fields: BTreeMap::new(),
                        values: Box::new(values.unwrap_or(Shape::Scalar)),
                    },
                )
            }
            Expr::Struct(s) => {
                let mut cost = 40u64;
                for en in &s.entries {
                    let v = match &en.expr {
                        EntryExpr::StructField(f) => &f.value,
                        EntryExpr::MapEntry(me) => &me.value,
                    };
                    cost = cost.saturating_add(self.walk(v, scope).0);
                }
                (cost, Shape::unbounded())
            }
            Expr::Comprehension(c) => {
                let (c_range, range) = self.walk(&c.iter_range, scope);
                let (n, elem) = range.iteration();
                let (c_init, init) = self.walk(&c.accu_init, scope);
                let base = scope.len();
                match &c.iter_var2 {
                    // Two-variable comprehensions bind the index or key first.
                    Some(v2) => {
                        scope.push((c.iter_var.clone(), Shape::Str { max_len: 256 }));
                        scope.push((v2.clone(), elem));
                    }
                    None => scope.push((c.iter_var.clone(), elem)),
                }
                scope.push((c.accu_var.clone(), init.clone()));
                self.accu.push(c.accu_var.clone());
                let (c_cond, _) = self.walk(&c.loop_cond, scope);
                let (c_step, step) = self.walk(&c.loop_step, scope);
                self.accu.pop();
                // A step that is the accumulator itself (`cel.bind`, the
                // two-variable comprehensions' binding of their target)
                // leaves it as initialised.
                let binds = matches!(&c.loop_step.expr, Expr::Ident(v) if *v == c.accu_var);
                let accu = match step {
                    _ if binds => init,
                    Shape::List { elem, .. } => Shape::List { max_items: n, elem },
                    Shape::Map { values, fields, .. } => Shape::Map {
                        max_props: n,
                        fields,
                        values,
                    },
                    other => other.merge(init),
                };
                if let Some(slot) = scope.last_mut() {
                    slot.1 = accu;
                }
                let (c_result, result) = self.walk(&c.result, scope);
                scope.truncate(base);
                let per_iter = c_cond.saturating_add(c_step).max(1);
                let cost = c_range
                    .saturating_add(c_init)
                    .saturating_add(n.saturating_mul(per_iter))
                    .saturating_add(c_result);
                (cost, result)
            }
            Expr::Call(call) => self.call(call, scope),
            Expr::Unspecified => (0, Shape::Scalar),
        }
    }

    fn call(
        &mut self,
        call: &::cel::common::ast::CallExpr,
        scope: &mut Vec<(String, Shape)>,
    ) -> (u64, Shape) {
        let mut cost = 0u64;
        let target = call.target.as_ref().map(|t| {
            let (c, s) = self.walk(t, scope);
            cost = cost.saturating_add(c);
            s
        });
        let mut args = Vec::with_capacity(call.args.len());
        for a in &call.args {
            let (c, s) = self.walk(a, scope);
            cost = cost.saturating_add(c);
            args.push(s);
        }
        let first = target.clone().or_else(|| args.first().cloned());
        let first_len = first.as_ref().map(Shape::len).unwrap_or(1);
        let arg_len = |i: usize| args.get(i).map(Shape::len).unwrap_or(1);
        let (own, shape) = match call.func_name.as_str() {
            "_+_" => {
                let appends_to_accu = matches!(&call.args.first().map(|a| &a.expr),
                    Some(Expr::Ident(n)) if self.accu.contains(n));
                let a = args.first().cloned().unwrap_or(Shape::Scalar);
                let b = args.get(1).cloned().unwrap_or(Shape::Scalar);
                let own = if appends_to_accu {
                    1
                } else {
                    1 + tenth(a.len().saturating_add(b.len()))
                };
                let shape = match (a, b) {
                    (Shape::Str { max_len: x }, Shape::Str { max_len: y }) => Shape::Str {
                        max_len: x.saturating_add(y),
                    },
                    (
                        Shape::List {
                            max_items: x,
                            elem: ex,
                        },
                        Shape::List {
                            max_items: y,
                            elem: ey,
                        },
                    ) => Shape::List {
                        max_items: x.saturating_add(y),
                        elem: Box::new(ex.merge(*ey)),
                    },
                    (Shape::Scalar, Shape::Scalar) => Shape::Scalar,
                    (x, y) => Shape::Unknown {
                        max_size: x.size().saturating_add(y.size()),
                    },
                };
                (own, shape)
            }
            // cel-go estimates equality as constant (an actual comparison is
            // bounded by the values' sizes, which a request bounds).
            "_==_" | "_!=_" => (1, Shape::Scalar),
            // Ordering: constant for scalars, a tenth per byte of the smaller
            // operand for strings and bytes.
            "_<_" | "_<=_" | "_>_" | "_>=_" => {
                let scalar = args.iter().all(|a| matches!(a, Shape::Scalar));
                let own = if scalar {
                    1
                } else {
                    tenth(args.iter().map(Shape::size).min().unwrap_or(1)).max(1)
                };
                (own, Shape::Scalar)
            }
            "@in" => {
                let needle = args.first().map(Shape::size).unwrap_or(1);
                let container = args.get(1).cloned().unwrap_or(Shape::Scalar);
                let own = match container {
                    Shape::List { max_items, elem } => {
                        1 + max_items.saturating_mul(1 + tenth(elem.size().min(needle)))
                    }
                    Shape::Unknown { max_size } => 1 + max_size / 2,
                    _ => 1,
                };
                (own, Shape::Scalar)
            }
            "_[_]" | "_[?_]" => {
                let s = args.first().cloned().unwrap_or(Shape::Scalar);
                (1, s.field(""))
            }
            "size"
            | "has"
            | "!_"
            | "-_"
            | "_&&_"
            | "_||_"
            | "_?_:_"
            | "@not_strictly_false"
            | "_-_"
            | "_*_"
            | "_/_"
            | "_%_"
            | "int"
            | "uint"
            | "double"
            | "bool"
            | "type"
            | "dyn"
            | "isSorted" => {
                // cel-go: logical operators and the conditional cost only
                // their operands; a comprehension's loop condition is free.
                let own = match call.func_name.as_str() {
                    "isSorted" => first_len,
                    "_&&_" | "_||_" | "_?_:_" | "@not_strictly_false" => 0,
                    _ => 1,
                };
                let shape = if call.func_name == "_?_:_" {
                    args.get(1)
                        .cloned()
                        .unwrap_or(Shape::Scalar)
                        .merge(args.get(2).cloned().unwrap_or(Shape::Scalar))
                } else {
                    Shape::Scalar
                };
                (own, shape)
            }
            "string" | "bytes" => (1 + tenth(first_len), first.unwrap_or(Shape::Scalar)),
            "matches" | "find" | "findAll" => {
                let (s, re) = if target.is_some() {
                    (first_len, arg_len(0))
                } else {
                    (arg_len(0), arg_len(1))
                };
                let own = tenth(s).max(1).saturating_mul(re.div_ceil(4).max(1));
                let shape = if call.func_name == "findAll" {
                    Shape::List {
                        max_items: s,
                        elem: Box::new(Shape::Str { max_len: s }),
                    }
                } else {
                    Shape::Str { max_len: s }
                };
                (own, shape)
            }
            "contains" | "startsWith" | "endsWith" | "lowerAscii" | "upperAscii" | "trim"
            | "charAt" | "substring" | "url" | "isURL" | "quantity" | "isQuantity" | "ip"
            | "isIP" | "cidr" | "isCIDR" | "getScheme" | "getHost" | "getHostname" | "getPort"
            | "getEscapedPath" | "getQuery" | "reverse" | "format" | "quote" => (
                1 + tenth(first_len.saturating_add(arg_len(0))),
                Shape::Str { max_len: first_len },
            ),
            "indexOf" | "lastIndexOf" => {
                let own = match &first {
                    Some(Shape::List { max_items, elem }) => {
                        1 + max_items.saturating_mul(1 + tenth(elem.size()))
                    }
                    _ => 1 + tenth(first_len.saturating_mul(arg_len(0).max(1))),
                };
                (own, Shape::Scalar)
            }
            "replace" => {
                let grow = arg_len(1).max(1);
                (
                    1 + tenth(first_len.saturating_mul(grow)),
                    Shape::Str {
                        max_len: first_len.saturating_mul(grow),
                    },
                )
            }
            "split" => (
                1 + first_len,
                Shape::List {
                    max_items: first_len,
                    elem: Box::new(Shape::Str { max_len: first_len }),
                },
            ),
            "join" => {
                let total = first.as_ref().map(Shape::size).unwrap_or(1);
                (1 + tenth(total), Shape::Str { max_len: total })
            }
            "sum" | "min" | "max" | "distinct" | "flatten" | "sort" | "slice" => {
                let own = match &first {
                    Some(Shape::List { max_items, .. }) => 1 + *max_items,
                    _ => 1 + first_len,
                };
                let shape = match (call.func_name.as_str(), &first) {
                    ("distinct" | "sort" | "slice" | "flatten", Some(s)) => s.clone(),
                    (_, Some(Shape::List { elem, .. })) => (**elem).clone(),
                    _ => Shape::Scalar,
                };
                (own, shape)
            }
            // The two-variable comprehensions' expansions: the indices or
            // keys to iterate, and the map a transform builds.
            super::comprehensions::KEYS => {
                let (n, key) = match &first {
                    Some(Shape::List { max_items, .. }) => (*max_items, Shape::Scalar),
                    Some(s) => s.iteration(),
                    None => (0, Shape::Scalar),
                };
                (
                    1 + n,
                    Shape::List {
                        max_items: n,
                        elem: Box::new(key),
                    },
                )
            }
            super::comprehensions::INSERT | super::comprehensions::MERGE => {
                let values = match call.func_name.as_str() {
                    super::comprehensions::INSERT => args.get(2).cloned(),
                    _ => args.get(1).map(|e| e.field("")),
                };
                (
                    1 + tenth(first_len),
                    Shape::Map {
                        max_props: first_len.saturating_add(1),
                        fields: BTreeMap::new(),
                        values: Box::new(values.unwrap_or(Shape::Scalar)),
                    },
                )
            }
            // Everything else (duration, timestamp, conversions, quantity
            // and url accessors...) is constant-cost with a small result.
            _ => (1, Shape::Scalar),
        };
        (cost.saturating_add(own), shape)
    }
}
