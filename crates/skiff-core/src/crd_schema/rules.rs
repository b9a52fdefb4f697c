//! `x-kubernetes-validations`: CEL rules evaluated on a custom resource,
//! with `self` (and `oldSelf` for transition rules) typed from the schema,
//! messages, messageExpression, reason and fieldPath as Kubernetes reports
//! them (`apiextensions-apiserver/pkg/apiserver/schema/cel/validation.go`),
//! and Kubernetes' runtime cost budget.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;

use ::cel::common::ast::Expr;
use ::cel::common::types::{
    CelBytes, CelDouble, CelDuration, CelList, CelMap, CelMapKey, CelOptional, CelTimestamp,
};
use ::cel::common::value::Val;
use ::cel::Value as CelValue;
use serde_json::Value;

use super::node::{CelKey, ListType, Node, Rule, Type};
use super::validate::{correlate, json_eq, P};
use crate::cel::cost::{Shape, PER_CALL_LIMIT, RUNTIME_COST_BUDGET};
use crate::cel::{escape_property, Bindings};
use crate::Cause;

/// A value as the rule sees it, borrowing the object's strings: objects
/// with their properties (names escaped), numbers as `double`, date-times as
/// timestamps, durations as durations; the root's metadata reduced to name
/// and generateName. With `only`, just those fields (CEL names) of `self`
/// are converted: a rule reading `self.replicas` of a large `spec` costs no
/// conversion of the rest.
pub(crate) fn typed<'a>(
    n: &Node,
    v: &'a Value,
    root: bool,
    only: Option<&BTreeSet<String>>,
) -> Box<dyn Val + 'a> {
    match v {
        Value::Object(m) => {
            let cap = only.map_or(m.len(), |o| o.len().min(m.len()));
            let mut map: HashMap<CelMapKey<'a>, Box<dyn Val + 'a>> = HashMap::with_capacity(cap);
            let schemaless = n.properties.is_empty() && n.additional.is_none();
            let resource = root || n.embedded;
            for (k, x) in m {
                let wanted = |name: &str| only.is_none_or(|o| o.contains(name));
                if resource && matches!(k.as_str(), "apiVersion" | "kind") {
                    if wanted(k) {
                        map.insert(CelMapKey::from(k.as_str()), crate::cel::json_val(x));
                    }
                } else if resource && k == "metadata" {
                    if !wanted(k) {
                        continue;
                    }
                    let mut meta: HashMap<CelMapKey<'a>, Box<dyn Val + 'a>> = HashMap::new();
                    if let Some(mm) = x.as_object() {
                        for f in ["name", "generateName"] {
                            if let Some(s) = mm.get(f) {
                                meta.insert(CelMapKey::from(f), crate::cel::json_val(s));
                            }
                        }
                    }
                    map.insert(CelMapKey::from(k.as_str()), Box::new(CelMap::from(meta)));
                } else if let Some(p) = n.properties.get(k) {
                    let key = match &p.cel_key {
                        CelKey::Same => CelMapKey::from(k.as_str()),
                        CelKey::Escaped(e) => CelMapKey::from(e.clone()),
                        CelKey::Hidden => continue,
                    };
                    if only.is_some() && !(wanted(key_str(&key)) || wanted(k)) {
                        continue;
                    }
                    map.insert(key, typed(p, x, false, None));
                } else if let Some(a) = &n.additional {
                    if wanted(k) {
                        map.insert(CelMapKey::from(k.as_str()), typed(a, x, false, None));
                    }
                } else if schemaless && wanted(k) {
                    map.insert(CelMapKey::from(k.as_str()), crate::cel::json_val(x));
                }
            }
            Box::new(CelMap::from(map))
        }
        Value::Array(a) => match &n.items {
            Some(i) => Box::new(CelList::from(
                a.iter()
                    .map(|x| typed(i, x, false, None))
                    .collect::<Vec<Box<dyn Val + 'a>>>(),
            )),
            None => crate::cel::json_val(v),
        },
        Value::Number(num) if n.ty == Some(Type::Number) => {
            Box::new(CelDouble::from(num.as_f64().unwrap_or(0.0)))
        }
        Value::String(s) if n.ty == Some(Type::String) => match n.format.as_deref() {
            Some("date-time") => match chrono::DateTime::parse_from_rfc3339(s) {
                Ok(t) => Box::new(CelTimestamp::from(t)),
                Err(_) => crate::cel::json_val(v),
            },
            Some("duration") => match super::formats::parse_go_duration(s)
                .and_then(|secs| chrono::Duration::try_milliseconds((secs * 1000.0) as i64))
            {
                Some(d) => Box::new(CelDuration::from(d)),
                None => crate::cel::json_val(v),
            },
            Some("byte") => {
                use base64::Engine;
                match base64::engine::general_purpose::STANDARD.decode(s) {
                    Ok(b) => Box::new(CelBytes::from(b)),
                    Err(_) => crate::cel::json_val(v),
                }
            }
            _ => crate::cel::json_val(v),
        },
        _ => crate::cel::json_val(v),
    }
}

fn key_str<'k>(k: &'k CelMapKey<'_>) -> &'k str {
    match k {
        CelMapKey::String(s) => s.inner(),
        _ => "",
    }
}

struct Run<'a> {
    out: &'a mut Vec<Cause>,
    budget: u64,
    stopped: bool,
}

/// Evaluates every rule of the schema on `obj` (and `old` on update).
pub(crate) fn validate_rules(root: &Node, obj: &Value, old: Option<&Value>, out: &mut Vec<Cause>) {
    let mut run = Run {
        out,
        budget: RUNTIME_COST_BUDGET,
        stopped: false,
    };
    walk(&mut run, root, obj, old, &P::Root(""), true);
}

/// Evaluates the rules of `n` and below on a value (a default), as if it
/// sat at the root of a path; `resource` when it is a whole resource.
pub(crate) fn validate_rules_at(n: &Node, v: &Value, resource: bool, out: &mut Vec<Cause>) {
    let mut run = Run {
        out,
        budget: RUNTIME_COST_BUDGET,
        stopped: false,
    };
    walk(&mut run, n, v, None, &P::Root(""), resource);
}

fn join(path: &str, name: &str) -> String {
    if path.is_empty() {
        name.to_string()
    } else {
        format!("{path}.{name}")
    }
}

fn walk(run: &mut Run<'_>, n: &Node, v: &Value, old: Option<&Value>, path: &P<'_>, root: bool) {
    if run.stopped || !n.has_rules_below || (v.is_null() && n.nullable) {
        return;
    }
    if !n.rules.is_empty() {
        eval_rules(run, n, v, old, path, root);
    }
    match v {
        Value::Object(m) => {
            let old_m = old.and_then(Value::as_object);
            for (k, x) in m {
                if root && matches!(k.as_str(), "apiVersion" | "kind" | "metadata") {
                    continue;
                }
                let Some(p) = n.properties.get(k).or(n.additional.as_deref()) else {
                    continue;
                };
                if !p.has_rules_below {
                    continue;
                }
                let o = old_m.and_then(|o| o.get(k));
                walk(run, p, x, o, &P::Field(path, k), false);
            }
        }
        Value::Array(a) => {
            if let Some(items) = n.items.as_deref().filter(|i| i.has_rules_below) {
                for (i, x) in a.iter().enumerate() {
                    let o = match (n.list_type, old.and_then(Value::as_array)) {
                        (Some(ListType::Map), Some(olds)) => correlate(n, x, olds),
                        _ => None,
                    };
                    walk(run, items, x, o, &P::Index(path, i), false);
                }
            }
        }
        _ => {}
    }
}

fn eval_rules(run: &mut Run<'_>, n: &Node, v: &Value, old: Option<&Value>, at: &P<'_>, root: bool) {
    let unchanged = old.is_some_and(|o| json_eq(o, v));
    // Ratcheting: an unchanged value is judged only by rules that look at
    // oldSelf; with nothing to run, nothing is converted.
    let runnable = |rule: &Rule| {
        if rule.uses_old_self {
            old.is_some() || rule.optional_old_self
        } else {
            !unchanged
        }
    };
    if !n.rules.iter().any(runnable) {
        return;
    }
    let only = n.rule_fields.as_ref();
    // `self` and `oldSelf` are converted once for all of this node's rules.
    let self_val: Arc<dyn Val + '_> = Arc::from(typed(n, v, root, only));
    let old_val: Option<Arc<dyn Val + '_>> = old.map(|o| Arc::from(typed(n, o, root, only)));
    let mut plain = Bindings::default();
    plain.bind("self", Arc::clone(&self_val));
    if let Some(o) = &old_val {
        plain.bind("oldSelf", Arc::clone(o));
    }
    // For optionalOldSelf rules `oldSelf` is an optional, built on first use.
    let mut optional: Option<Bindings<'_>> = None;
    let type_name = Value::String(n.type_name().to_string());
    let mut shape: Option<Shape> = None;
    for rule in &n.rules {
        if run.stopped {
            return;
        }
        if !runnable(rule) {
            continue;
        }
        let cost = runtime_cost(rule, n, v, &mut shape);
        // The path is written out only for an error.
        let path = || at.to_string();
        if cost > PER_CALL_LIMIT {
            run.out.push(Cause::invalid(
                path(),
                &type_name,
                &format!(
                    "'operation cancelled: actual cost limit exceeded': no further validation rules will be run due to call cost exceeds limit for rule: {}",
                    rule_error_string(rule)
                ),
            ));
            run.stopped = true;
            return;
        }
        if cost > run.budget {
            run.out.push(Cause::invalid(
                path(),
                &type_name,
                "validation failed due to running out of cost budget, no further validation rules will be run",
            ));
            run.stopped = true;
            return;
        }
        run.budget -= cost;
        let vars = if rule.uses_old_self && rule.optional_old_self {
            optional.get_or_insert_with(|| {
                let mut b = Bindings::default();
                b.bind("self", Arc::clone(&self_val));
                let o = match &old_val {
                    Some(o) => CelOptional::of(o.clone_as_boxed()),
                    None => CelOptional::none(),
                };
                b.bind("oldSelf", Arc::new(o));
                b
            })
        } else {
            &plain
        };
        match rule.program.eval_bound(vars) {
            Ok(CelValue::Bool(true)) => {}
            Ok(CelValue::Bool(false)) => {
                let field = match &rule.field_path {
                    Some(fp) => join(&path(), fp),
                    None => path(),
                };
                let detail = rule
                    .message_expression
                    .as_ref()
                    .and_then(|me| match me.eval_bound(vars) {
                        Ok(CelValue::String(s)) => {
                            let t = s.trim();
                            (!t.is_empty() && !t.contains('\n') && t.len() <= 5 * 1024)
                                .then(|| t.to_string())
                        }
                        _ => None,
                    })
                    .unwrap_or_else(|| match &rule.message {
                        Some(m) if !m.is_empty() => m.clone(),
                        _ => format!("failed rule: {}", rule_error_string(rule)),
                    });
                run.out.push(error_for_reason(
                    n,
                    v,
                    &field,
                    &detail,
                    rule.reason.as_deref(),
                ));
            }
            Ok(_) => run.out.push(Cause::invalid(
                path(),
                &type_name,
                &format!(
                    "rule did not evaluate to a boolean evaluating rule: {}",
                    rule_error_string(rule)
                ),
            )),
            Err(e) => run.out.push(Cause::invalid(
                path(),
                &type_name,
                &format!("{e} evaluating rule: {}", rule_error_string(rule)),
            )),
        }
    }
}

/// The fields of `self`/`oldSelf` a rule (and its messageExpression) reads,
/// when it reads them only by selection; `None` when it uses them whole.
pub(crate) fn selected_fields(rule: &Rule) -> Option<std::collections::BTreeSet<String>> {
    let names = ["self", "oldSelf"];
    let mut out = crate::cel::selected_fields(rule.program.ast(), &names)?;
    if let Some(me) = &rule.message_expression {
        out.extend(crate::cel::selected_fields(me.ast(), &names)?);
    }
    Some(out)
}

/// The cost charged for one evaluation: the static estimate when it is
/// small, else an estimate from the actual value's sizes.
fn runtime_cost(rule: &Rule, n: &Node, v: &Value, shape: &mut Option<Shape>) -> u64 {
    let stat = rule.static_cost();
    if stat <= 10_000 {
        return stat;
    }
    let s = shape.get_or_insert_with(|| {
        let _ = n;
        Shape::of(v)
    });
    let vars = [("self", s.clone()), ("oldSelf", s.clone())];
    let mut c = rule.program.estimate_cost(&vars);
    if let Some(me) = &rule.message_expression {
        c = c.saturating_add(me.estimate_cost(&vars));
    }
    c
}

fn rule_error_string(rule: &Rule) -> String {
    match &rule.message {
        Some(m) if !m.is_empty() => m.trim().to_string(),
        _ => rule.rule.trim().to_string(),
    }
}

/// `fieldErrorForReason`: the rule's reason picks the error type; objects
/// and arrays are not printed.
fn error_for_reason(n: &Node, v: &Value, field: &str, detail: &str, reason: Option<&str>) -> Cause {
    match reason {
        Some("FieldValueForbidden") => Cause::forbidden(field, detail),
        Some("FieldValueRequired") => Cause::new(
            "FieldValueRequired",
            field,
            format!("Required value: {detail}"),
        ),
        Some("FieldValueDuplicate") => Cause::duplicate(field, v),
        _ => {
            if matches!(n.ty, Some(Type::Object) | Some(Type::Array))
                || v.is_object()
                || v.is_array()
            {
                Cause::new(
                    "FieldValueInvalid",
                    field,
                    format!("Invalid value: {detail}"),
                )
            } else {
                Cause::invalid(field, v, detail)
            }
        }
    }
}

/// What the checker knows of an expression's type.
#[derive(Clone, Copy, Debug)]
enum Ty<'a> {
    Int,
    Uint,
    Double,
    Str,
    Bool,
    Bytes,
    Null,
    Duration,
    Timestamp,
    List(Option<&'a Node>),
    Map(Option<&'a Node>),
    Object(&'a Node),
    Dyn,
}

impl Ty<'_> {
    fn name(&self) -> &'static str {
        match self {
            Ty::Int => "int",
            Ty::Uint => "uint",
            Ty::Double => "double",
            Ty::Str => "string",
            Ty::Bool => "bool",
            Ty::Bytes => "bytes",
            Ty::Null => "null_type",
            Ty::Duration => "google.protobuf.Duration",
            Ty::Timestamp => "google.protobuf.Timestamp",
            Ty::List(_) => "list",
            Ty::Map(_) | Ty::Object(_) => "map",
            Ty::Dyn => "dyn",
        }
    }
    /// Types that never mix in comparisons or arithmetic (numbers together).
    fn category(&self) -> u8 {
        match self {
            Ty::Int | Ty::Uint | Ty::Double => 1,
            Ty::Str => 2,
            Ty::Bool => 3,
            Ty::Bytes => 4,
            Ty::Duration => 5,
            Ty::Timestamp => 6,
            Ty::List(_) => 7,
            Ty::Map(_) | Ty::Object(_) => 8,
            Ty::Null | Ty::Dyn => 0,
        }
    }
}

fn node_ty(n: &Node) -> Ty<'_> {
    if n.int_or_string {
        return Ty::Dyn;
    }
    match n.ty {
        Some(Type::Integer) => Ty::Int,
        Some(Type::Number) => Ty::Double,
        Some(Type::Boolean) => Ty::Bool,
        Some(Type::String) => match n.format.as_deref() {
            Some("date-time") => Ty::Timestamp,
            Some("duration") => Ty::Duration,
            Some("byte") => Ty::Bytes,
            _ => Ty::Str,
        },
        Some(Type::Array) => Ty::List(n.items.as_deref()),
        Some(Type::Object) if n.additional.is_some() => Ty::Map(n.additional.as_deref()),
        Some(Type::Object)
            if n.additional_any || (n.preserve_unknown && n.properties.is_empty()) =>
        {
            Ty::Dyn
        }
        Some(Type::Object) => Ty::Object(n),
        _ => Ty::Dyn,
    }
}

/// A type check of a rule against the schema, for the mistakes the schema
/// makes certain (Kubernetes type-checks rules fully): fields a closed object
/// does not have (`undefined field`), operands of kinds no overload accepts
/// together (`'a' > 1`, `self.name + 1`, `!self.count`), inside macros too,
/// reported as cel-go reports them.
///
/// `Ok(false)` when the expression cannot be a bool (`self.replicas + 1`).
pub(crate) fn check_types(
    p: &crate::cel::Program,
    n: &Node,
    is_root: bool,
) -> Result<bool, String> {
    struct Cx<'p, 'a> {
        p: &'p crate::cel::Program,
        n: &'a Node,
        is_root: bool,
        /// Comprehension variables and their types, innermost last.
        scope: Vec<(String, Ty<'a>)>,
    }
    fn closed(o: &Node) -> bool {
        o.additional.is_none() && !o.additional_any && !o.preserve_unknown && !o.embedded
    }
    fn ty<'a>(e: &::cel::IdedExpr, cx: &mut Cx<'_, 'a>) -> Result<Ty<'a>, String> {
        use ::cel::common::ast::LiteralValue as L;
        let n = cx.n;
        Ok(match &e.expr {
            Expr::Literal(l) => match l {
                L::Int(_) => Ty::Int,
                L::UInt(_) => Ty::Uint,
                L::Double(_) => Ty::Double,
                L::String(_) => Ty::Str,
                L::Boolean(_) => Ty::Bool,
                L::Bytes(_) => Ty::Bytes,
                L::Null => Ty::Null,
            },
            Expr::Ident(i) => match cx.scope.iter().rev().find(|(v, _)| v == i) {
                Some((_, t)) => *t,
                None if i == "self" || i == "oldSelf" => node_ty(n),
                None => Ty::Dyn,
            },
            Expr::Select(s) if s.test => {
                ty(&s.operand, cx)?;
                Ty::Bool
            }
            Expr::Select(s) => {
                let operand = ty(&s.operand, cx)?;
                let on_root_self = cx.is_root
                    && matches!(&s.operand.expr, Expr::Ident(i) if (i == "self" || i == "oldSelf")
                        && !cx.scope.iter().any(|(v, _)| v == i));
                match operand {
                    Ty::Object(o) => match o
                        .properties
                        .iter()
                        .find(|(k, _)| escape_property(k).as_deref() == Some(s.field.as_str()))
                    {
                        Some((_, v)) => node_ty(v),
                        None if on_root_self
                            && matches!(s.field.as_str(), "apiVersion" | "kind" | "metadata") =>
                        {
                            Ty::Dyn
                        }
                        None if closed(o) => {
                            return Err(format!(
                                "ERROR: <input>:{}: undefined field '{}'",
                                cx.p.position(e.id),
                                s.field
                            ))
                        }
                        None => Ty::Dyn,
                    },
                    Ty::Map(Some(v)) => node_ty(v),
                    _ => Ty::Dyn,
                }
            }
            Expr::List(l) => {
                for x in &l.elements {
                    ty(x, cx)?;
                }
                Ty::List(None)
            }
            Expr::Map(m) => {
                for en in &m.entries {
                    if let ::cel::common::ast::EntryExpr::MapEntry(me) = &en.expr {
                        ty(&me.key, cx)?;
                        ty(&me.value, cx)?;
                    }
                }
                Ty::Map(None)
            }
            Expr::Comprehension(c) => {
                let range = ty(&c.iter_range, cx)?;
                let elem = match range {
                    Ty::List(Some(i)) => node_ty(i),
                    Ty::Map(_) | Ty::Object(_) => Ty::Str,
                    _ => Ty::Dyn,
                };
                ty(&c.accu_init, cx)?;
                let base = cx.scope.len();
                match &c.iter_var2 {
                    Some(v2) => {
                        cx.scope.push((c.iter_var.clone(), Ty::Dyn));
                        cx.scope.push((v2.clone(), Ty::Dyn));
                    }
                    None => cx.scope.push((c.iter_var.clone(), elem)),
                }
                cx.scope.push((c.accu_var.clone(), Ty::Dyn));
                let r = (|| -> Result<(), String> {
                    ty(&c.loop_cond, cx)?;
                    ty(&c.loop_step, cx)?;
                    ty(&c.result, cx)?;
                    Ok(())
                })();
                cx.scope.truncate(base);
                r?;
                Ty::Dyn
            }
            Expr::Call(c) => {
                let mut args = Vec::with_capacity(c.args.len() + 1);
                if let Some(t) = &c.target {
                    args.push(ty(t, cx)?);
                }
                for a in &c.args {
                    args.push(ty(a, cx)?);
                }
                let f = c.func_name.as_str();
                let a0 = args.first().copied().unwrap_or(Ty::Dyn);
                let mismatch = |args: &[Ty<'_>]| {
                    format!(
                        "ERROR: <input>:{}: found no matching overload for '{f}' applied to '({})'",
                        cx.p.position(e.id),
                        args.iter().map(Ty::name).collect::<Vec<_>>().join(", ")
                    )
                };
                match f {
                    "_<_" | "_<=_" | "_>_" | "_>=_" | "_==_" | "_!=_" => {
                        let (a, b) = (a0.category(), args.get(1).map_or(0, Ty::category));
                        if a != 0 && b != 0 && a != b {
                            return Err(mismatch(&args));
                        }
                        Ty::Bool
                    }
                    "_&&_" | "_||_" | "!_" => {
                        if args
                            .iter()
                            .any(|a| a.category() != 0 && !matches!(a, Ty::Bool))
                        {
                            return Err(mismatch(&args));
                        }
                        Ty::Bool
                    }
                    "_+_" | "_-_" | "_*_" | "_/_" | "_%_" => {
                        let known: Vec<u8> =
                            args.iter().map(Ty::category).filter(|c| *c != 0).collect();
                        let time = |c: &u8| *c == 5 || *c == 6;
                        if known.len() == 2
                            && known[0] != known[1]
                            && !(time(&known[0]) && time(&known[1]))
                        {
                            return Err(mismatch(&args));
                        }
                        if f != "_+_" && known.iter().any(|c| matches!(c, 2 | 3 | 4 | 7 | 8)) {
                            return Err(mismatch(&args));
                        }
                        if known.contains(&3) {
                            return Err(mismatch(&args));
                        }
                        args.iter()
                            .copied()
                            .find(|a| a.category() != 0)
                            .unwrap_or(Ty::Dyn)
                    }
                    "-_" => {
                        if !matches!(a0.category(), 0 | 1 | 5) {
                            return Err(mismatch(&args));
                        }
                        a0
                    }
                    "_[_]" => match a0 {
                        Ty::List(Some(i)) => node_ty(i),
                        Ty::Map(Some(v)) => node_ty(v),
                        _ => Ty::Dyn,
                    },
                    "size" => Ty::Int,
                    "contains" | "startsWith" | "endsWith" | "matches" | "@in" => Ty::Bool,
                    "int" => Ty::Int,
                    "uint" => Ty::Uint,
                    "double" => Ty::Double,
                    "string" => Ty::Str,
                    "duration" => Ty::Duration,
                    "timestamp" => Ty::Timestamp,
                    _ => Ty::Dyn,
                }
            }
            _ => Ty::Dyn,
        })
    }
    let mut cx = Cx {
        p,
        n,
        is_root,
        scope: Vec::new(),
    };
    ty(p.ast(), &mut cx).map(|t| matches!(t, Ty::Bool | Ty::Dyn))
}

/// A rule's `fieldPath` (`.spec.x`, `.a['b-c']`, `.list[0]` is refused as
/// Kubernetes refuses it) as a field path below the rule's node.
pub(crate) fn normalize_field_path(fp: &str, n: &Node) -> Result<String, String> {
    // Kubernetes says only this, whatever is wrong with the path.
    let invalid = |_why: &str| "must be a valid path".to_string();
    let mut out = String::new();
    let mut node = n;
    let mut rest = fp;
    if rest.is_empty() {
        return Err(invalid("unexpected end of JSON path"));
    }
    while !rest.is_empty() {
        let name;
        if let Some(r) = rest.strip_prefix('.') {
            let end = r.find(['.', '[']).unwrap_or(r.len());
            name = r[..end].to_string();
            rest = &r[end..];
        } else if let Some(r) = rest.strip_prefix("['") {
            let end = r
                .find("']")
                .ok_or_else(|| invalid("expected ] but got end"))?;
            name = r[..end].to_string();
            rest = &r[end + 2..];
        } else if rest.starts_with('[') {
            return Err(invalid("array notation is not allowed"));
        } else {
            return Err(invalid(&format!(
                "expected [ or . but got: {}",
                rest.chars().next().unwrap_or(' ')
            )));
        }
        if name.is_empty() {
            return Err(invalid("unexpected end of JSON path"));
        }
        node = match node.properties.get(&name).or(node.additional.as_deref()) {
            Some(x) => x,
            None => return Err(invalid("does not refer to a valid field")),
        };
        if name.contains('.') || name.contains(' ') {
            out.push_str(&format!("[{name}]"));
        } else {
            if !out.is_empty() {
                out.push('.');
            }
            out.push_str(&name);
        }
    }
    Ok(out)
}
