//! `x-kubernetes-validations`: CEL rules evaluated on a custom resource,
//! with `self` (and `oldSelf` for transition rules) typed from the schema,
//! messages, messageExpression, reason and fieldPath as Kubernetes reports
//! them (`apiextensions-apiserver/pkg/apiserver/schema/cel/validation.go`),
//! and Kubernetes' runtime cost budget.

use std::collections::HashMap;
use std::sync::Arc;

use ::cel::common::ast::Expr;
use ::cel::objects::{Key, Map, OptionalValue};
use ::cel::Value as CelValue;
use serde_json::Value;

use super::node::{ListType, Node, Rule, Type};
use super::validate::{correlate, json_eq};
use crate::cel::cost::{Shape, PER_CALL_LIMIT, RUNTIME_COST_BUDGET};
use crate::cel::escape_property;
use crate::Cause;

/// A value as the rule sees it: objects with their properties (names
/// escaped), numbers as `double`, date-times as timestamps, durations as
/// durations; the root's metadata reduced to name and generateName.
pub(crate) fn typed(n: &Node, v: &Value, root: bool) -> CelValue {
    match v {
        Value::Object(m) => {
            let mut map: HashMap<Key, CelValue> = HashMap::with_capacity(m.len());
            let schemaless = n.properties.is_empty() && n.additional.is_none();
            for (k, x) in m {
                if (root || n.embedded) && matches!(k.as_str(), "apiVersion" | "kind") {
                    map.insert(key(k), crate::cel::to_cel(x));
                } else if (root || n.embedded) && k == "metadata" {
                    let mut meta = HashMap::new();
                    if let Some(mm) = x.as_object() {
                        for f in ["name", "generateName"] {
                            if let Some(s) = mm.get(f) {
                                meta.insert(key(f), crate::cel::to_cel(s));
                            }
                        }
                    }
                    map.insert(
                        key(k),
                        CelValue::Map(Map {
                            map: Arc::new(meta),
                        }),
                    );
                } else if let Some(p) = n.properties.get(k) {
                    if let Some(e) = escape_property(k) {
                        map.insert(key(&e), typed(p, x, false));
                    }
                } else if let Some(a) = &n.additional {
                    map.insert(key(k), typed(a, x, false));
                } else if schemaless {
                    map.insert(key(k), crate::cel::to_cel(x));
                }
            }
            CelValue::Map(Map { map: Arc::new(map) })
        }
        Value::Array(a) => match &n.items {
            Some(i) => CelValue::List(Arc::new(a.iter().map(|x| typed(i, x, false)).collect())),
            None => crate::cel::to_cel(v),
        },
        Value::Number(num) if n.ty == Some(Type::Number) => {
            CelValue::Float(num.as_f64().unwrap_or(0.0))
        }
        Value::String(s) if n.ty == Some(Type::String) => match n.format.as_deref() {
            Some("date-time") => chrono::DateTime::parse_from_rfc3339(s)
                .map(CelValue::Timestamp)
                .unwrap_or_else(|_| crate::cel::to_cel(v)),
            Some("duration") => super::formats::parse_go_duration(s)
                .and_then(|secs| chrono::Duration::try_milliseconds((secs * 1000.0) as i64))
                .map(CelValue::Duration)
                .unwrap_or_else(|| crate::cel::to_cel(v)),
            Some("byte") => {
                use base64::Engine;
                base64::engine::general_purpose::STANDARD
                    .decode(s)
                    .map(|b| CelValue::Bytes(Arc::new(b)))
                    .unwrap_or_else(|_| crate::cel::to_cel(v))
            }
            _ => crate::cel::to_cel(v),
        },
        _ => crate::cel::to_cel(v),
    }
}

fn key(k: &str) -> Key {
    Key::String(Arc::new(k.to_string()))
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
    walk(&mut run, root, obj, old, "", true);
}

fn join(path: &str, name: &str) -> String {
    if path.is_empty() {
        name.to_string()
    } else {
        format!("{path}.{name}")
    }
}

fn walk(run: &mut Run<'_>, n: &Node, v: &Value, old: Option<&Value>, path: &str, root: bool) {
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
                let o = old_m.and_then(|o| o.get(k));
                if let Some(p) = n.properties.get(k) {
                    walk(run, p, x, o, &join(path, k), false);
                } else if let Some(a) = &n.additional {
                    walk(run, a, x, o, &join(path, k), false);
                }
            }
        }
        Value::Array(a) => {
            if let Some(items) = &n.items {
                for (i, x) in a.iter().enumerate() {
                    let o = match (n.list_type, old.and_then(Value::as_array)) {
                        (Some(ListType::Map), Some(olds)) => correlate(n, x, olds),
                        _ => None,
                    };
                    walk(run, items, x, o, &format!("{path}[{i}]"), false);
                }
            }
        }
        _ => {}
    }
}

fn eval_rules(run: &mut Run<'_>, n: &Node, v: &Value, old: Option<&Value>, path: &str, root: bool) {
    let unchanged = old.is_some_and(|o| json_eq(o, v));
    let self_val = typed(n, v, root);
    let old_val = old.map(|o| typed(n, o, root));
    let type_name = Value::String(n.type_name().to_string());
    let mut shape: Option<Shape> = None;
    for rule in &n.rules {
        if run.stopped {
            return;
        }
        // Transition rules run only on update with a correlated old value,
        // unless optionalOldSelf lets them see an absent one.
        if rule.uses_old_self && old_val.is_none() && !rule.optional_old_self {
            continue;
        }
        // Ratcheting: an unchanged value is not re-judged by rules that do
        // not look at oldSelf.
        if unchanged && !rule.uses_old_self {
            continue;
        }
        let cost = runtime_cost(rule, n, v, &mut shape);
        if cost > PER_CALL_LIMIT {
            run.out.push(Cause::invalid(
                path,
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
                path,
                &type_name,
                "validation failed due to running out of cost budget, no further validation rules will be run",
            ));
            run.stopped = true;
            return;
        }
        run.budget -= cost;
        let mut vars = vec![("self", self_val.clone())];
        if rule.uses_old_self {
            let o = match (&old_val, rule.optional_old_self) {
                (Some(o), true) => CelValue::Opaque(Arc::new(OptionalValue::of(o.clone()))),
                (None, _) => CelValue::Opaque(Arc::new(OptionalValue::none())),
                (Some(o), false) => o.clone(),
            };
            vars.push(("oldSelf", o));
        }
        let field = match &rule.field_path {
            Some(fp) => join(path, fp),
            None => path.to_string(),
        };
        match rule.program.eval_cel(vars.clone()) {
            Ok(CelValue::Bool(true)) => {}
            Ok(CelValue::Bool(false)) => {
                let detail = rule
                    .message_expression
                    .as_ref()
                    .and_then(|me| match me.eval_cel(vars) {
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
                path,
                &type_name,
                &format!(
                    "rule did not evaluate to a boolean evaluating rule: {}",
                    rule_error_string(rule)
                ),
            )),
            Err(e) => run.out.push(Cause::invalid(
                path,
                &type_name,
                &format!("{e} evaluating rule: {}", rule_error_string(rule)),
            )),
        }
    }
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

/// Kubernetes type-checks rules against the schema; this checks what a
/// schema makes certain: selecting a field `self` cannot have is
/// `undefined field`.
pub(crate) fn check_fields(p: &crate::cel::Program, n: &Node, is_root: bool) -> Result<(), String> {
    fn resolve<'a>(e: &::cel::IdedExpr, n: &'a Node) -> Option<&'a Node> {
        match &e.expr {
            Expr::Ident(name) if name == "self" || name == "oldSelf" => Some(n),
            Expr::Select(s) if !s.test => {
                let parent = resolve(&s.operand, n)?;
                lookup(parent, &s.field)
            }
            _ => None,
        }
    }
    fn lookup<'a>(parent: &'a Node, field: &str) -> Option<&'a Node> {
        parent
            .properties
            .iter()
            .find(|(k, _)| escape_property(k).as_deref() == Some(field))
            .map(|(_, v)| v)
            .or(parent.additional.as_deref())
    }
    fn visit(e: &::cel::IdedExpr, n: &Node, is_root: bool) -> Result<(), String> {
        match &e.expr {
            Expr::Select(s) => {
                let on_root =
                    matches!(&s.operand.expr, Expr::Ident(i) if i == "self" || i == "oldSelf");
                if on_root
                    && is_root
                    && matches!(s.field.as_str(), "apiVersion" | "kind" | "metadata")
                {
                    return Ok(());
                }
                if let Some(parent) = resolve(&s.operand, n) {
                    let closed = parent.ty == Some(Type::Object)
                        && parent.additional.is_none()
                        && !parent.additional_any
                        && !parent.preserve_unknown
                        && !parent.embedded;
                    if closed && lookup(parent, &s.field).is_none() {
                        return Err(format!("undefined field '{}'", s.field));
                    }
                }
                visit(&s.operand, n, is_root)
            }
            Expr::Call(c) => {
                if let Some(t) = &c.target {
                    visit(t, n, is_root)?;
                }
                c.args.iter().try_for_each(|a| visit(a, n, is_root))
            }
            Expr::List(l) => l.elements.iter().try_for_each(|a| visit(a, n, is_root)),
            Expr::Comprehension(c) => {
                visit(&c.iter_range, n, is_root)?;
                visit(&c.accu_init, n, is_root)?;
                visit(&c.loop_cond, n, is_root)?;
                visit(&c.loop_step, n, is_root)?;
                visit(&c.result, n, is_root)
            }
            _ => Ok(()),
        }
    }
    visit(p.ast(), n, is_root)
}

/// A rule's `fieldPath` (`.spec.x`, `.a['b-c']`, `.list[0]` is refused as
/// Kubernetes refuses it) as a field path below the rule's node.
pub(crate) fn normalize_field_path(fp: &str, n: &Node) -> Result<String, String> {
    let invalid = |why: &str| format!("must be a valid path: {why}");
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
