//! Kubernetes 1.33's two-variable comprehensions (cel-go's
//! `ext.TwoVarComprehensions`): `all(k, v, p)`, `exists(k, v, p)`,
//! `existsOne(k, v, p)`, `transformList(i, v, [filter,] e)`,
//! `transformMap(k, v, [filter,] e)` and `transformMapEntry(k, v, [filter,] e)`,
//! over lists (index and element) and maps (key and value).
//!
//! The `cel` crate parses macros through `Env::add_macro` but its
//! interpreter runs one-variable comprehensions only, so each call is
//! rewritten when it is parsed into what the interpreter runs: the target
//! is bound once to a hidden variable, the loop runs over its indices (a
//! list) or keys (a map), the first variable is the index or key and the
//! second reads the element at it. Hidden names carry the call's id, so
//! nested comprehensions never capture each other's variables.

use ::cel::common::ast::{
    operators, CallExpr, ComprehensionExpr, EntryExpr, Expr, IdedExpr, ListExpr, LiteralValue,
    MapExpr,
};
use ::cel::common::functions::Function;
use ::cel::common::types::DYN_TYPE;
use ::cel::common::value::{CowVal, Val};
use ::cel::objects::{Key, Map};
use ::cel::parser::{Macro, MacroExprHelper, ParseError};
use ::cel::{Env, ExecutionError, Value};
use std::collections::HashMap;
use std::sync::Arc;

/// The indices of a list or the keys of a map, as a list.
pub(crate) const KEYS: &str = "@twoVarKeys";
/// A map with one more entry; an existing key is an error.
pub(crate) const INSERT: &str = "@twoVarInsert";
/// A map with another map's entries; an existing key is an error.
pub(crate) const MERGE: &str = "@twoVarMerge";

#[derive(Clone, Copy)]
enum Kind {
    All,
    Exists,
    ExistsOne,
    TransformList,
    TransformMap,
    TransformMapEntry,
}

/// Registers the macros and the functions their expansions call.
pub(super) fn register(env: &mut Env) {
    let kinds = [
        ("all", Kind::All, &[3][..]),
        ("exists", Kind::Exists, &[3][..]),
        ("existsOne", Kind::ExistsOne, &[3][..]),
        ("exists_one", Kind::ExistsOne, &[3][..]),
        ("transformList", Kind::TransformList, &[3, 4][..]),
        ("transformMap", Kind::TransformMap, &[3, 4][..]),
        ("transformMapEntry", Kind::TransformMapEntry, &[3, 4][..]),
    ];
    for (name, kind, arities) in kinds {
        for &n in arities {
            let _ = env.add_macro(Macro::receiver(name, n, move |h, t, a| {
                expand(kind, h, t, a).map(Some)
            }));
        }
    }
    let functions: [(&str, Vec<_>, Function); 3] = [
        (KEYS, vec![DYN_TYPE], wrap_keys as Function),
        (
            INSERT,
            vec![DYN_TYPE, DYN_TYPE, DYN_TYPE],
            wrap_insert as Function,
        ),
        (MERGE, vec![DYN_TYPE, DYN_TYPE], wrap_merge as Function),
    ];
    for (name, args, f) in functions {
        let _ = env.add_overload(name, name, args, f);
    }
}

fn wrap<'b, 'v>(
    args: Vec<CowVal<'b, 'v>>,
    f: fn(&[Value]) -> Result<Value, ExecutionError>,
) -> Result<CowVal<'b, 'v>, ExecutionError> {
    let vals = args
        .iter()
        .map(|a| Value::try_from(a.as_ref()))
        .collect::<Result<Vec<_>, _>>()?;
    let boxed: Box<dyn Val> = f(&vals)?.try_into()?;
    Ok(CowVal::Owned(boxed))
}

fn wrap_keys<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Result<CowVal<'b, 'v>, ExecutionError> {
    wrap(args, keys)
}

fn wrap_insert<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Result<CowVal<'b, 'v>, ExecutionError> {
    wrap(args, insert)
}

fn wrap_merge<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Result<CowVal<'b, 'v>, ExecutionError> {
    wrap(args, merge)
}

fn key_value(k: &Key) -> Value {
    match k {
        Key::String(s) => Value::String(s.clone()),
        Key::Int(i) => Value::Int(*i),
        Key::Uint(u) => Value::UInt(*u),
        Key::Bool(b) => Value::Bool(*b),
    }
}

fn keys(args: &[Value]) -> Result<Value, ExecutionError> {
    match args.first() {
        Some(Value::List(l)) => Ok(Value::List(Arc::new(
            (0..l.len() as i64).map(Value::Int).collect(),
        ))),
        Some(Value::Map(m)) => Ok(Value::List(Arc::new(m.map.keys().map(key_value).collect()))),
        Some(other) => Err(ExecutionError::function_error(
            "comprehension",
            format!("cannot iterate over {}", other.type_of()),
        )),
        None => Err(ExecutionError::invalid_argument_count(1, 0)),
    }
}

fn map_key(v: &Value) -> Result<Key, ExecutionError> {
    Ok(match v {
        Value::String(s) => Key::String(s.clone()),
        Value::Int(i) => Key::Int(*i),
        Value::UInt(u) => Key::Uint(*u),
        Value::Bool(b) => Key::Bool(*b),
        other => {
            return Err(ExecutionError::function_error(
                "transformMap",
                format!("unsupported key type: {}", other.type_of()),
            ))
        }
    })
}

fn put(m: &mut HashMap<Key, Value>, k: Key, v: Value) -> Result<(), ExecutionError> {
    if m.contains_key(&k) {
        let shown = match &k {
            Key::String(s) => s.to_string(),
            Key::Int(i) => i.to_string(),
            Key::Uint(u) => u.to_string(),
            Key::Bool(b) => b.to_string(),
        };
        // cel-go's wording.
        return Err(ExecutionError::function_error(
            "transformMapEntry",
            format!("insert failed: key {shown} already exists"),
        ));
    }
    m.insert(k, v);
    Ok(())
}

fn insert(args: &[Value]) -> Result<Value, ExecutionError> {
    let [Value::Map(m), k, v] = args else {
        return Err(ExecutionError::invalid_argument_count(3, args.len()));
    };
    let mut out = (*m.map).clone();
    put(&mut out, map_key(k)?, v.clone())?;
    Ok(Value::Map(Map { map: Arc::new(out) }))
}

fn merge(args: &[Value]) -> Result<Value, ExecutionError> {
    let [Value::Map(m), entry] = args else {
        return Err(ExecutionError::invalid_argument_count(2, args.len()));
    };
    let Value::Map(e) = entry else {
        return Err(ExecutionError::function_error(
            "transformMapEntry",
            format!(
                "transformMapEntry result must be a map, got {}",
                entry.type_of()
            ),
        ));
    };
    let mut out = (*m.map).clone();
    for (k, v) in e.map.iter() {
        put(&mut out, k.clone(), v.clone())?;
    }
    Ok(Value::Map(Map { map: Arc::new(out) }))
}

fn ident(h: &mut MacroExprHelper<'_>, name: &str) -> IdedExpr {
    h.next_expr(Expr::Ident(name.to_string()))
}

fn call(h: &mut MacroExprHelper<'_>, f: &str, args: Vec<IdedExpr>) -> IdedExpr {
    h.next_expr(Expr::Call(CallExpr {
        func_name: f.to_string(),
        target: None,
        args,
    }))
}

fn literal(h: &mut MacroExprHelper<'_>, l: LiteralValue) -> IdedExpr {
    h.next_expr(Expr::Literal(l))
}

/// Which of the two variables a subtree still sees (an inner
/// comprehension binding the same name hides it).
#[derive(Clone, Copy)]
struct Names<'a> {
    first: Option<&'a str>,
    second: Option<&'a str>,
    target: &'a str,
    index: &'a str,
}

/// Replaces the first variable by the hidden index and the second by the
/// element at it.
fn substitute(e: &mut IdedExpr, n: Names<'_>, h: &mut MacroExprHelper<'_>) {
    match &mut e.expr {
        Expr::Ident(name) => {
            if n.first == Some(name.as_str()) {
                *name = n.index.to_string();
            } else if n.second == Some(name.as_str()) {
                let t = ident(h, n.target);
                let i = ident(h, n.index);
                e.expr = Expr::Call(CallExpr {
                    func_name: operators::INDEX.to_string(),
                    target: None,
                    args: vec![t, i],
                });
            }
        }
        Expr::Select(s) => substitute(&mut s.operand, n, h),
        Expr::Call(c) => {
            if let Some(t) = c.target.as_deref_mut() {
                substitute(t, n, h);
            }
            for a in &mut c.args {
                substitute(a, n, h);
            }
        }
        Expr::List(l) => {
            for x in &mut l.elements {
                substitute(x, n, h);
            }
        }
        Expr::Map(m) => {
            for en in &mut m.entries {
                match &mut en.expr {
                    EntryExpr::MapEntry(me) => {
                        substitute(&mut me.key, n, h);
                        substitute(&mut me.value, n, h);
                    }
                    EntryExpr::StructField(f) => substitute(&mut f.value, n, h),
                }
            }
        }
        Expr::Struct(s) => {
            for en in &mut s.entries {
                match &mut en.expr {
                    EntryExpr::MapEntry(me) => substitute(&mut me.value, n, h),
                    EntryExpr::StructField(f) => substitute(&mut f.value, n, h),
                }
            }
        }
        Expr::Comprehension(c) => {
            substitute(&mut c.iter_range, n, h);
            substitute(&mut c.accu_init, n, h);
            let bound =
                |x: &str| c.iter_var == x || c.iter_var2.as_deref() == Some(x) || c.accu_var == x;
            let inner = Names {
                first: n.first.filter(|x| !bound(x)),
                second: n.second.filter(|x| !bound(x)),
                ..n
            };
            substitute(&mut c.loop_cond, inner, h);
            substitute(&mut c.loop_step, inner, h);
            substitute(&mut c.result, inner, h);
        }
        Expr::Literal(_) | Expr::Unspecified => {}
    }
}

fn expand(
    kind: Kind,
    h: &mut MacroExprHelper<'_>,
    target: &mut Option<IdedExpr>,
    args: &mut Vec<IdedExpr>,
) -> Result<IdedExpr, ParseError> {
    let name_of = |e: &IdedExpr| match &e.expr {
        Expr::Ident(n) => Some(n.clone()),
        _ => None,
    };
    let (Some(first), Some(second)) = (name_of(&args[0]), name_of(&args[1])) else {
        let bad = if name_of(&args[0]).is_none() {
            args[0].id
        } else {
            args[1].id
        };
        return Err(h.new_error(bad, "argument must be a simple name"));
    };
    if first == second {
        return Err(h.new_error(args[1].id, format!("duplicate variable name: {second}")));
    }
    let Some(range_target) = target.take() else {
        return Err(h.new_error(args[0].id, "a two-variable comprehension needs a target"));
    };
    let mut rest: Vec<IdedExpr> = args.drain(2..).collect();
    args.clear();
    let uid = h.next_expr(Expr::Unspecified).id;
    let t = format!("@t{uid}");
    let i = format!("@i{uid}");
    let names = Names {
        first: Some(&first),
        second: Some(&second),
        target: &t,
        index: &i,
    };
    for e in &mut rest {
        substitute(e, names, h);
    }
    let accu = "@result";
    let body = rest.pop().expect("three or four arguments");
    let filter = rest.pop();
    let guarded =
        |h: &mut MacroExprHelper<'_>, step: IdedExpr, filter: Option<IdedExpr>| match filter {
            Some(f) => {
                let keep = ident(h, accu);
                call(h, operators::CONDITIONAL, vec![f, step, keep])
            }
            None => step,
        };
    let (init, cond, step, result) = match kind {
        Kind::All | Kind::Exists => {
            let all = matches!(kind, Kind::All);
            let init = literal(h, LiteralValue::Boolean(all.into()));
            let a = ident(h, accu);
            let cond_arg = if all {
                a
            } else {
                call(h, operators::LOGICAL_NOT, vec![a])
            };
            let cond = call(h, operators::NOT_STRICTLY_FALSE, vec![cond_arg]);
            let a = ident(h, accu);
            let op = if all {
                operators::LOGICAL_AND
            } else {
                operators::LOGICAL_OR
            };
            let step = call(h, op, vec![a, body]);
            (init, cond, step, ident(h, accu))
        }
        Kind::ExistsOne => {
            let init = literal(h, LiteralValue::Int(0i64.into()));
            let cond = literal(h, LiteralValue::Boolean(true.into()));
            let a = ident(h, accu);
            let one = literal(h, LiteralValue::Int(1i64.into()));
            let plus = call(h, operators::ADD, vec![a, one]);
            let keep = ident(h, accu);
            let step = call(h, operators::CONDITIONAL, vec![body, plus, keep]);
            let a = ident(h, accu);
            let one = literal(h, LiteralValue::Int(1i64.into()));
            (init, cond, step, call(h, operators::EQUALS, vec![a, one]))
        }
        Kind::TransformList => {
            let init = h.next_expr(Expr::List(ListExpr::new(Vec::new())));
            let cond = literal(h, LiteralValue::Boolean(true.into()));
            let a = ident(h, accu);
            let item = h.next_expr(Expr::List(ListExpr::new(vec![body])));
            let append = call(h, operators::ADD, vec![a, item]);
            let step = guarded(h, append, filter);
            (init, cond, step, ident(h, accu))
        }
        Kind::TransformMap | Kind::TransformMapEntry => {
            let init = h.next_expr(Expr::Map(MapExpr::default()));
            let cond = literal(h, LiteralValue::Boolean(true.into()));
            let a = ident(h, accu);
            let add = if matches!(kind, Kind::TransformMap) {
                let k = ident(h, &i);
                call(h, INSERT, vec![a, k, body])
            } else {
                call(h, MERGE, vec![a, body])
            };
            let step = guarded(h, add, filter);
            (init, cond, step, ident(h, accu))
        }
    };
    let t_ident = ident(h, &t);
    let range = call(h, KEYS, vec![t_ident]);
    let inner = h.next_expr(Expr::Comprehension(Box::new(ComprehensionExpr {
        iter_range: range,
        iter_var: i.clone(),
        iter_var2: None,
        accu_var: accu.to_string(),
        accu_init: init,
        loop_cond: cond,
        loop_step: step,
        result,
    })));
    // cel.bind(t, target, inner): evaluates the target once.
    let empty = h.next_expr(Expr::List(ListExpr::new(Vec::new())));
    let never = literal(h, LiteralValue::Boolean(false.into()));
    let same = ident(h, &t);
    Ok(h.next_expr(Expr::Comprehension(Box::new(ComprehensionExpr {
        iter_range: empty,
        iter_var: "#unused".to_string(),
        iter_var2: None,
        accu_var: t,
        accu_init: range_target,
        loop_cond: never,
        loop_step: same,
        result: inner,
    }))))
}
