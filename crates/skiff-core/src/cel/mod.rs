//! CEL as Kubernetes runs it: expressions compiled once on the `cel` crate,
//! extended with Kubernetes' libraries (lists, regex, url, quantity, strings)
//! and bounded by cost limits, for CRD validation rules and for admission
//! (matchConditions, ValidatingAdmissionPolicy).
//!
//! `compile(expr, &["object", "oldObject"])` checks the expression and its
//! free variables once; `Program::eval(&[("object", &json)])` binds JSON
//! values and returns the result as JSON. Nothing here panics on user input:
//! a bad expression is an `Err` with Kubernetes-like wording.

mod comprehensions;
pub mod cost;
mod library;

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, OnceLock};

use ::cel::common::ast::{EntryExpr, Expr};
use ::cel::common::types::{
    CelBool, CelDouble, CelInt, CelList, CelMap, CelMapKey, CelNull, CelString, CelUInt,
};
use ::cel::common::value::{CowVal, Val};
use ::cel::context::VariableResolver;
use ::cel::objects::{Key, Map};
use ::cel::{Context, Env, Value as CelValue};
use serde_json::Value;

pub use cost::{Shape, PER_CALL_LIMIT, RUNTIME_COST_BUDGET};

/// The environment every program is compiled and run in: the standard
/// library, the strings and lists extensions, and Kubernetes' libraries.
fn env() -> &'static Arc<Env> {
    static ENV: OnceLock<Arc<Env>> = OnceLock::new();
    ENV.get_or_init(|| {
        let mut env = Env::stdlib();
        // Each extension registers distinct names; a clash would be a bug in
        // this file, found by the first test, so failures are ignored rather
        // than panicking in a server.
        let _ = env.add_extension(::cel::extensions::strings);
        library::register(&mut env);
        comprehensions::register(&mut env);
        Arc::new(env)
    })
}

/// A compiled CEL expression: cheap to clone, `Send + Sync`.
#[derive(Clone)]
pub struct Program {
    inner: Arc<Inner>,
}

struct Inner {
    source: String,
    program: ::cel::Program,
    /// Free variables the expression reads.
    reads: BTreeSet<String>,
    /// Per variable read, the top-level fields the expression selects when
    /// it only ever selects fields of it (`None`: it uses the value whole).
    /// Only those fields are converted for evaluation.
    fields: Vec<(String, Option<BTreeSet<String>>)>,
    /// The estimated cost with every variable unbounded: when within the
    /// per-call limit, no evaluation can exceed it and values need no sizing.
    unbounded_cost: u64,
}

impl std::fmt::Debug for Program {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Program({:?})", self.inner.source)
    }
}

/// Identifiers that name types or namespaces rather than variables.
const BUILTIN_IDENTS: &[&str] = &[
    "int",
    "uint",
    "double",
    "bool",
    "string",
    "bytes",
    "list",
    "map",
    "null_type",
    "type",
    "duration",
    "timestamp",
    "dyn",
    "optional",
    "strings",
    "math",
    "base64",
    "lists",
    "format",
    "ip",
    "sets",
];

/// Compiles `expr` for an environment declaring `vars`. Errors read as
/// Kubernetes' compilation errors (`compilation failed: ...`).
pub fn compile(expr: &str, vars: &[&str]) -> Result<Program, String> {
    if expr.trim().is_empty() {
        return Err("compilation failed: expression is empty".to_string());
    }
    // cel-go's limit on an expression's size (in code points).
    let size = expr.chars().count();
    if size > 100_000 {
        return Err(format!(
            "compilation failed: expression code point size exceeds limit: size: {size}, limit 100000"
        ));
    }
    // The parser and the checks below recurse over the expression, and
    // evaluation will recurse over its tree: refuse trees deeper than
    // evaluation may safely recurse (cel-go refuses them too). A long
    // expression is parsed on a thread with a large stack, so no input can
    // overflow the caller's; a short one cannot nest deeply enough to.
    let source = expr.to_string();
    let parse = move || -> Result<(::cel::Program, BTreeSet<String>), String> {
        let program = env()
            .compile(&source)
            .map_err(|e| format!("compilation failed: {e}"))?;
        if depth(program.expression()) > MAX_DEPTH {
            return Err(format!(
                "compilation failed: ERROR: <input>:1:1: expression nested more than {MAX_DEPTH} levels deep (max recursion depth exceeded)"
            ));
        }
        let mut reads = BTreeSet::new();
        let mut scope = Vec::new();
        free_idents(program.expression(), &mut scope, &mut reads);
        Ok((program, reads))
    };
    let parsed = if expr.len() <= 512 {
        parse()
    } else {
        std::thread::Builder::new()
            .stack_size(256 * 1024 * 1024)
            .spawn(parse)
            .map_err(|e| format!("compilation failed: {e}"))?
            .join()
            .map_err(|_| "compilation failed: the expression could not be parsed".to_string())?
    };
    let (program, reads) = parsed?;
    for name in &reads {
        if !vars.contains(&name.as_str()) && !BUILTIN_IDENTS.contains(&name.as_str()) {
            return Err(format!(
                "compilation failed: ERROR: <input>:1:1: undeclared reference to '{name}' (in container '')"
            ));
        }
    }
    let fields = reads
        .iter()
        .map(|v| {
            (
                v.clone(),
                selected_fields(program.expression(), &[v.as_str()]),
            )
        })
        .collect();
    let unbounded_cost = cost::estimate(program.expression(), &[]);
    Ok(Program {
        inner: Arc::new(Inner {
            source: expr.to_string(),
            program,
            reads,
            fields,
            unbounded_cost,
        }),
    })
}

/// The fields of the named variables an expression reads, when it reads
/// them only by selecting fields (`v.f`, `has(v.f)`); `None` when it uses a
/// variable whole (compared, iterated, passed to a function...).
pub(crate) fn selected_fields(e: &::cel::IdedExpr, names: &[&str]) -> Option<BTreeSet<String>> {
    fn visit(e: &::cel::IdedExpr, names: &[&str], out: &mut BTreeSet<String>) -> bool {
        let is_var =
            |x: &::cel::IdedExpr| matches!(&x.expr, Expr::Ident(i) if names.contains(&i.as_str()));
        match &e.expr {
            Expr::Ident(i) => !names.contains(&i.as_str()),
            Expr::Select(s) => {
                if is_var(&s.operand) {
                    out.insert(s.field.clone());
                    true
                } else {
                    visit(&s.operand, names, out)
                }
            }
            Expr::Call(c) => {
                c.target.as_deref().is_none_or(|t| visit(t, names, out))
                    && c.args.iter().all(|a| visit(a, names, out))
            }
            Expr::List(l) => l.elements.iter().all(|a| visit(a, names, out)),
            Expr::Map(m) => m.entries.iter().all(|en| match &en.expr {
                EntryExpr::MapEntry(me) => {
                    visit(&me.key, names, out) && visit(&me.value, names, out)
                }
                EntryExpr::StructField(f) => visit(&f.value, names, out),
            }),
            Expr::Struct(_) => false,
            Expr::Comprehension(c) => {
                // A comprehension variable shadowing one of the names makes
                // its uses inside refer to something else: stay whole.
                if names.contains(&c.iter_var.as_str()) || names.contains(&c.accu_var.as_str()) {
                    return false;
                }
                visit(&c.iter_range, names, out)
                    && visit(&c.accu_init, names, out)
                    && visit(&c.loop_cond, names, out)
                    && visit(&c.loop_step, names, out)
                    && visit(&c.result, names, out)
            }
            Expr::Literal(_) | Expr::Unspecified => true,
        }
    }
    let mut out = BTreeSet::new();
    visit(e, names, &mut out).then_some(out)
}

/// How a function is called: `f(..)`, `ns.f(..)` or `x.f(..)`.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
enum Probe<'a> {
    Global,
    Namespaced(&'a str),
    Member,
}

/// Whether the environment declares `name` for calls of this kind. The
/// `cel` crate lists no declarations, so the answer is what calling it
/// with no arguments says: anything but "undeclared reference" (a missing
/// overload, say) means it exists. Answers are kept: the probes run once
/// per name.
fn function_declared(name: &str, call: Probe<'_>) -> bool {
    type Known = std::sync::Mutex<HashMap<(String, String), bool>>;
    static KNOWN: OnceLock<Known> = OnceLock::new();
    let (source, kind) = match call {
        Probe::Global => (format!("{name}()"), String::new()),
        Probe::Namespaced(ns) => (format!("{ns}.{name}()"), ns.to_string()),
        Probe::Member => (format!("null.{name}()"), ".".to_string()),
    };
    let key = (name.to_string(), kind);
    let known = KNOWN.get_or_init(Default::default);
    if let Some(k) = known.lock().unwrap_or_else(|e| e.into_inner()).get(&key) {
        return *k;
    }
    let declared = match env().compile(&source) {
        // The name cannot be spelled as a call: nothing to say about it.
        Err(_) => true,
        Ok(program) => {
            let ctx = Context::with_env(Arc::clone(env()));
            match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| program.execute(&ctx))) {
                Ok(Err(::cel::ExecutionError::UndeclaredReference(r))) => {
                    let qualified = match call {
                        Probe::Namespaced(ns) => {
                            r.as_str() != ns && r.as_str() != format!("{ns}.{name}")
                        }
                        _ => true,
                    };
                    r.as_str() != name && qualified
                }
                _ => true,
            }
        }
    };
    known
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .insert(key, declared);
    declared
}

/// The deepest nesting of an expression evaluation may recurse through.
pub const MAX_DEPTH: usize = 100;

/// The depth of an expression tree.
fn depth(e: &::cel::IdedExpr) -> usize {
    let children: Vec<&::cel::IdedExpr> = match &e.expr {
        Expr::Select(s) => vec![&s.operand],
        Expr::Call(c) => c.target.iter().map(|t| &**t).chain(c.args.iter()).collect(),
        Expr::List(l) => l.elements.iter().collect(),
        Expr::Map(m) => m
            .entries
            .iter()
            .flat_map(|en| match &en.expr {
                EntryExpr::MapEntry(me) => vec![&me.key, &me.value],
                EntryExpr::StructField(f) => vec![&f.value],
            })
            .collect(),
        Expr::Struct(s) => s
            .entries
            .iter()
            .map(|en| match &en.expr {
                EntryExpr::MapEntry(me) => &me.value,
                EntryExpr::StructField(f) => &f.value,
            })
            .collect(),
        Expr::Comprehension(c) => vec![
            &c.iter_range,
            &c.accu_init,
            &c.loop_cond,
            &c.loop_step,
            &c.result,
        ],
        Expr::Ident(_) | Expr::Literal(_) | Expr::Unspecified => vec![],
    };
    1 + children.into_iter().map(depth).max().unwrap_or(0)
}

/// Collects the identifiers an expression reads that no comprehension binds.
fn free_idents(e: &::cel::IdedExpr, scope: &mut Vec<String>, out: &mut BTreeSet<String>) {
    match &e.expr {
        Expr::Ident(name) => {
            if !scope.iter().any(|s| s == name) {
                out.insert(name.clone());
            }
        }
        Expr::Select(s) => free_idents(&s.operand, scope, out),
        Expr::Call(c) => {
            if let Some(t) = &c.target {
                free_idents(t, scope, out);
            }
            for a in &c.args {
                free_idents(a, scope, out);
            }
        }
        Expr::List(l) => {
            for x in &l.elements {
                free_idents(x, scope, out);
            }
        }
        Expr::Map(m) => {
            for en in &m.entries {
                if let EntryExpr::MapEntry(me) = &en.expr {
                    free_idents(&me.key, scope, out);
                    free_idents(&me.value, scope, out);
                }
            }
        }
        Expr::Struct(s) => {
            for en in &s.entries {
                match &en.expr {
                    EntryExpr::StructField(f) => free_idents(&f.value, scope, out),
                    EntryExpr::MapEntry(me) => free_idents(&me.value, scope, out),
                }
            }
        }
        Expr::Comprehension(c) => {
            free_idents(&c.iter_range, scope, out);
            free_idents(&c.accu_init, scope, out);
            let n = scope.len();
            scope.push(c.iter_var.clone());
            if let Some(v2) = &c.iter_var2 {
                scope.push(v2.clone());
            }
            scope.push(c.accu_var.clone());
            free_idents(&c.loop_cond, scope, out);
            free_idents(&c.loop_step, scope, out);
            free_idents(&c.result, scope, out);
            scope.truncate(n);
        }
        Expr::Literal(_) | Expr::Unspecified => {}
    }
}

impl Program {
    /// The expression as written.
    pub fn source(&self) -> &str {
        &self.inner.source
    }

    /// Whether the expression reads variable `name` (e.g. `oldSelf`).
    pub fn reads(&self, name: &str) -> bool {
        self.inner.reads.contains(name)
    }

    /// The compiled AST (for cost estimation).
    pub(crate) fn ast(&self) -> &::cel::IdedExpr {
        self.inner.program.expression()
    }

    /// The first call of a function the environment does not declare, as
    /// cel-go's checker reports it (`ERROR: <input>:1:5: undeclared
    /// reference to 'foo' (in container '')`): a CRD rule calling one is
    /// refused when the CRD is written, not when a resource is.
    pub(crate) fn undeclared_function(&self) -> Option<String> {
        fn visit(p: &Program, e: &::cel::IdedExpr) -> Option<String> {
            match &e.expr {
                Expr::Call(c) => {
                    // Operators and the expansions' internal functions are
                    // not spelled by users.
                    let user = c.func_name.starts_with(|ch: char| ch.is_ascii_alphabetic());
                    let namespace = match c.target.as_deref().map(|t| &t.expr) {
                        Some(Expr::Ident(ns)) if BUILTIN_IDENTS.contains(&ns.as_str()) => {
                            Some(ns.as_str())
                        }
                        _ => None,
                    };
                    let call = if c.target.is_none() {
                        Probe::Global
                    } else if let Some(ns) = namespace {
                        Probe::Namespaced(ns)
                    } else {
                        Probe::Member
                    };
                    if user && !function_declared(&c.func_name, call) {
                        return Some(format!(
                            "ERROR: <input>:{}: undeclared reference to '{}' (in container '')",
                            p.position(e.id),
                            c.func_name
                        ));
                    }
                    c.target
                        .as_deref()
                        .filter(|_| namespace.is_none())
                        .and_then(|t| visit(p, t))
                        .or_else(|| c.args.iter().find_map(|a| visit(p, a)))
                }
                Expr::Select(s) => visit(p, &s.operand),
                Expr::List(l) => l.elements.iter().find_map(|x| visit(p, x)),
                Expr::Map(m) => m.entries.iter().find_map(|en| match &en.expr {
                    EntryExpr::MapEntry(me) => visit(p, &me.key).or_else(|| visit(p, &me.value)),
                    EntryExpr::StructField(f) => visit(p, &f.value),
                }),
                Expr::Struct(s) => s.entries.iter().find_map(|en| match &en.expr {
                    EntryExpr::MapEntry(me) => visit(p, &me.value),
                    EntryExpr::StructField(f) => visit(p, &f.value),
                }),
                Expr::Comprehension(c) => [
                    &c.iter_range,
                    &c.accu_init,
                    &c.loop_cond,
                    &c.loop_step,
                    &c.result,
                ]
                .into_iter()
                .find_map(|x| visit(p, x)),
                Expr::Ident(_) | Expr::Literal(_) | Expr::Unspecified => None,
            }
        }
        visit(self, self.ast())
    }

    /// `line:column` (1-based) of an expression node, as cel-go reports
    /// positions in its errors.
    pub(crate) fn position(&self, id: u64) -> String {
        let Some((start, _)) = self.inner.program.source_info().offset_for(id) else {
            return "1:1".to_string();
        };
        let mut line = 1;
        let mut col = 1;
        for (i, c) in self.inner.source.chars().enumerate() {
            if i as u32 >= start {
                break;
            }
            if c == '\n' {
                line += 1;
                col = 1;
            } else {
                col += 1;
            }
        }
        format!("{line}:{col}")
    }

    /// The estimated worst-case cost of one evaluation with variables of the
    /// given shapes (unknown variables are unbounded).
    pub fn estimate_cost(&self, vars: &[(&str, Shape)]) -> u64 {
        cost::estimate(self.ast(), vars)
    }

    /// Evaluates with JSON variables and returns the result as JSON. Fails
    /// when a variable the expression reads is missing, on a runtime error,
    /// or when the evaluation would exceed the per-call cost limit.
    pub fn eval(&self, vars: &[(&str, &Value)]) -> Result<Value, String> {
        if self.inner.unbounded_cost > PER_CALL_LIMIT {
            let shapes: Vec<(&str, Shape)> = vars
                .iter()
                .filter(|(n, _)| self.reads(n))
                .map(|(n, v)| (*n, Shape::of(v)))
                .collect();
            if self.estimate_cost(&shapes) > PER_CALL_LIMIT {
                return Err("operation cancelled: actual cost limit exceeded".to_string());
            }
        }
        let mut bound = Bindings::default();
        for (n, v) in vars.iter().filter(|(n, _)| self.reads(n)) {
            let only = self
                .inner
                .fields
                .iter()
                .find(|(name, _)| name == n)
                .and_then(|(_, f)| f.as_ref());
            let value: Box<dyn Val + '_> = match (only, v) {
                (Some(only), Value::Object(m)) => {
                    let map: HashMap<CelMapKey<'_>, Box<dyn Val + '_>> = m
                        .iter()
                        .filter(|(k, _)| only.contains(k.as_str()))
                        .map(|(k, x)| (CelMapKey::from(k.as_str()), json_val(x)))
                        .collect();
                    Box::new(CelMap::from(map))
                }
                _ => json_val(v),
            };
            bound.bind(n, Arc::from(value));
        }
        let out = self.eval_bound(&bound)?;
        Ok(from_cel(&out))
    }

    /// Evaluates with values already bound (the CRD validator builds them
    /// once per schema node, typed from the schema, and shares them between
    /// that node's rules). No cost check: the caller budgets.
    pub(crate) fn eval_bound(&self, vars: &Bindings<'_>) -> Result<CelValue, String> {
        for name in &self.inner.reads {
            if !BUILTIN_IDENTS.contains(&name.as_str()) && !vars.has(name) {
                return Err(format!("no such attribute(s): {name}"));
            }
        }
        let mut ctx = Context::with_env(Arc::clone(env()));
        ctx.set_variable_resolver(vars);
        // A bug in the interpreter must cost one request an error, never the
        // server a thread: a panic becomes an evaluation error.
        match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            self.inner.program.execute(&ctx)
        })) {
            Ok(r) => r.map_err(runtime_error),
            Err(_) => Err("internal error evaluating the expression".to_string()),
        }
    }
}

/// A runtime error in cel-go's words, as Kubernetes reports them.
fn runtime_error(e: ::cel::ExecutionError) -> String {
    use ::cel::ExecutionError as E;
    match e {
        E::NoSuchKey(k) => format!("no such key: {k}"),
        E::UndeclaredReference(r) => format!("no such attribute(s): {r}"),
        E::DivisionByZero(_) => "division by zero".to_string(),
        E::RemainderByZero(_) => "modulus by zero".to_string(),
        E::Overflow(..) => "integer overflow".to_string(),
        E::IndexOutOfBounds(i) => format!("index out of range: {}", from_cel(&i)),
        E::FunctionError { message, .. } => message,
        E::NoSuchOverload(o) => o.to_string(),
        other => other.to_string(),
    }
}

/// Variables bound for an evaluation: built once, borrowed by every
/// program evaluated with them (no copy per evaluation).
#[derive(Default)]
pub(crate) struct Bindings<'a> {
    vars: Vec<(String, Arc<dyn Val + 'a>)>,
}

impl<'a> Bindings<'a> {
    /// Binds (or rebinds) `name`.
    pub(crate) fn bind(&mut self, name: &str, v: Arc<dyn Val + 'a>) {
        self.vars.retain(|(n, _)| n != name);
        self.vars.push((name.to_string(), v));
    }

    fn has(&self, name: &str) -> bool {
        self.vars.iter().any(|(n, _)| n == name)
    }
}

impl VariableResolver for Bindings<'_> {
    fn resolve<'b>(&'b self, variable: &str) -> Option<CowVal<'b, 'b>> {
        self.vars
            .iter()
            .find(|(n, _)| n == variable)
            .map(|(_, v)| CowVal::Borrowed(&**v as &(dyn Val + 'b)))
    }
}

/// A JSON value as a CEL value borrowing its strings: objects are maps with
/// string keys, integers `int`, other numbers `double`.
pub(crate) fn json_val(v: &Value) -> Box<dyn Val + '_> {
    match v {
        Value::Null => Box::new(CelNull),
        Value::Bool(b) => Box::new(CelBool::from(*b)),
        Value::Number(n) => number_val(n),
        Value::String(s) => Box::new(CelString::from(s.as_str())),
        Value::Array(a) => Box::new(CelList::from(
            a.iter().map(json_val).collect::<Vec<Box<dyn Val + '_>>>(),
        )),
        Value::Object(m) => Box::new(CelMap::from(
            m.iter()
                .map(|(k, x)| (CelMapKey::from(k.as_str()), json_val(x)))
                .collect::<HashMap<CelMapKey<'_>, Box<dyn Val + '_>>>(),
        )),
    }
}

/// A JSON number as CEL sees it: `int`, else `uint`, else `double`.
pub(crate) fn number_val(n: &serde_json::Number) -> Box<dyn Val + 'static> {
    if let Some(i) = n.as_i64() {
        Box::new(CelInt::from(i))
    } else if let Some(u) = n.as_u64() {
        Box::new(CelUInt::from(u))
    } else {
        Box::new(CelDouble::from(n.as_f64().unwrap_or(0.0)))
    }
}

/// A JSON value as a CEL value: objects are maps with string keys, integers
/// `int`, other numbers `double`.
pub fn to_cel(v: &Value) -> CelValue {
    match v {
        Value::Null => CelValue::Null,
        Value::Bool(b) => CelValue::Bool(*b),
        Value::Number(n) => {
            if let Some(i) = n.as_i64() {
                CelValue::Int(i)
            } else if let Some(u) = n.as_u64() {
                CelValue::UInt(u)
            } else {
                CelValue::Float(n.as_f64().unwrap_or(0.0))
            }
        }
        Value::String(s) => CelValue::String(Arc::new(s.clone())),
        Value::Array(a) => CelValue::List(Arc::new(a.iter().map(to_cel).collect())),
        Value::Object(m) => {
            let map: HashMap<Key, CelValue> = m
                .iter()
                .map(|(k, v)| (Key::String(Arc::new(k.clone())), to_cel(v)))
                .collect();
            CelValue::Map(Map { map: Arc::new(map) })
        }
    }
}

/// A CEL value as JSON (durations and timestamps as strings, bytes as
/// base64, opaque values such as quantities by their string form).
pub fn from_cel(v: &CelValue) -> Value {
    use base64::Engine;
    match v {
        CelValue::Null => Value::Null,
        CelValue::Bool(b) => Value::Bool(*b),
        CelValue::Int(i) => Value::from(*i),
        CelValue::UInt(u) => Value::from(*u),
        CelValue::Float(f) => serde_json::Number::from_f64(*f)
            .map(Value::Number)
            .unwrap_or(Value::Null),
        CelValue::String(s) => Value::String(s.to_string()),
        CelValue::Bytes(b) => {
            Value::String(base64::engine::general_purpose::STANDARD.encode(b.as_slice()))
        }
        CelValue::List(l) => Value::Array(l.iter().map(from_cel).collect()),
        CelValue::Map(m) => {
            let mut out = serde_json::Map::new();
            for (k, v) in m.map.iter() {
                let key = match k {
                    Key::String(s) => s.to_string(),
                    Key::Int(i) => i.to_string(),
                    Key::Uint(u) => u.to_string(),
                    Key::Bool(b) => b.to_string(),
                };
                out.insert(key, from_cel(v));
            }
            Value::Object(out)
        }
        CelValue::Duration(d) => Value::String(library::format_duration(*d)),
        CelValue::Timestamp(t) => Value::String(t.to_rfc3339()),
        CelValue::Opaque(o) => match o.as_ref().downcast_ref::<::cel::objects::OptionalValue>() {
            // an optional is its value, or null when absent
            Some(opt) => opt.value().map(from_cel).unwrap_or(Value::Null),
            None => library::opaque_to_json(o.as_ref()),
        },
        other => Value::String(format!("{other:?}")),
    }
}

/// The name under which CEL sees an object property, as Kubernetes escapes
/// it (`x-y` → `x__dash__y`, `a.b` → `a__dot__b`, reserved words as
/// `__word__`); `None` when the property cannot be accessed from CEL.
pub fn escape_property(name: &str) -> Option<String> {
    const RESERVED: &[&str] = &[
        "true",
        "false",
        "null",
        "in",
        "as",
        "break",
        "const",
        "continue",
        "else",
        "for",
        "function",
        "if",
        "import",
        "let",
        "loop",
        "package",
        "namespace",
        "return",
        "var",
        "void",
        "while",
    ];
    if RESERVED.contains(&name) {
        return Some(format!("__{name}__"));
    }
    let mut chars = name.chars();
    let first = chars.next()?;
    if !(first.is_ascii_alphabetic() || matches!(first, '_' | '.' | '-' | '/')) {
        return None;
    }
    if !name
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-' | '/'))
    {
        return None;
    }
    if !name.contains(['_', '.', '-', '/']) {
        return Some(name.to_string());
    }
    let mut out = String::with_capacity(name.len() + 8);
    let mut rest = name;
    while let Some(c) = rest.chars().next() {
        if let Some(r) = rest.strip_prefix("__") {
            out.push_str("__underscores__");
            rest = r;
            continue;
        }
        match c {
            '.' => out.push_str("__dot__"),
            '-' => out.push_str("__dash__"),
            '/' => out.push_str("__slash__"),
            c => out.push(c),
        }
        rest = &rest[c.len_utf8()..];
    }
    Some(out)
}

#[cfg(test)]
mod tests;
