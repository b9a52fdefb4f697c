//! Patches as Kubernetes applies them: JSON patch (RFC 6902), JSON merge
//! patch (RFC 7386) and strategic merge patch (merge keys and directives of
//! the built-in types), plus the unknown- and duplicate-field checks behind
//! `fieldValidation`. Server-side apply is in [`apply`].

pub mod apply;

use serde_json::{Map, Value};

use crate::schema::TypeRef;
use crate::ApiError;

/// Applies an RFC 6902 JSON patch.
pub fn apply_json_patch(doc: &Value, patch: &Value) -> Result<Value, ApiError> {
    let ops: json_patch::Patch = serde_json::from_value(patch.clone()).map_err(|e| {
        ApiError::bad_request(format!(
            "the server rejected our request due to an error in our request: {e}"
        ))
    })?;
    let mut out = doc.clone();
    json_patch::patch(&mut out, &ops.0).map_err(|e| {
        // Kubernetes answers a patch that cannot be applied with 422 Invalid.
        ApiError::new(
            422,
            "Invalid",
            format!("the server rejected our request due to an error in our request: {e}"),
        )
    })?;
    Ok(out)
}

/// Applies an RFC 7386 merge patch (null deletes).
pub fn apply_merge_patch(doc: &Value, patch: &Value) -> Result<Value, ApiError> {
    if !patch.is_object() {
        return Err(ApiError::bad_request(
            "the merge patch must be a JSON object",
        ));
    }
    let mut out = doc.clone();
    json_patch::merge(&mut out, patch);
    Ok(out)
}

/// Applies a strategic merge patch, guided by the type's merge keys.
pub fn apply_strategic_merge_patch(
    doc: &Value,
    patch: &Value,
    t: Option<TypeRef>,
) -> Result<Value, ApiError> {
    let (Some(d), Some(p)) = (doc.as_object(), patch.as_object()) else {
        return Err(ApiError::bad_request(
            "the strategic merge patch must be a JSON object",
        ));
    };
    Ok(Value::Object(merge_map(d, p, t)?))
}

fn bad(msg: impl Into<String>) -> ApiError {
    ApiError::bad_request(msg.into())
}

fn merge_map(
    doc: &Map<String, Value>,
    patch: &Map<String, Value>,
    t: Option<TypeRef>,
) -> Result<Map<String, Value>, ApiError> {
    // `$patch: replace` replaces the whole map; `$patch: delete` empties it.
    match patch.get("$patch").and_then(Value::as_str) {
        Some("replace") => {
            let mut m = patch.clone();
            m.remove("$patch");
            return Ok(m);
        }
        Some("delete") => return Ok(Map::new()),
        Some("merge") | None => {}
        Some(other) => return Err(bad(format!("unknown patch type: {other:?}"))),
    }
    let mut out = doc.clone();
    // `$retainKeys`: fields not listed are cleared.
    if let Some(keep) = patch.get("$retainKeys").and_then(Value::as_array) {
        let keep: Vec<&str> = keep.iter().filter_map(Value::as_str).collect();
        out.retain(|k, _| keep.contains(&k.as_str()));
    }
    for (k, pv) in patch {
        if k == "$patch" || k == "$retainKeys" {
            continue;
        }
        if let Some(field) = k.strip_prefix("$deleteFromPrimitiveList/") {
            let remove: Vec<&Value> = pv
                .as_array()
                .map(|a| a.iter().collect())
                .unwrap_or_default();
            if let Some(list) = out.get_mut(field).and_then(Value::as_array_mut) {
                list.retain(|x| !remove.contains(&x));
            }
            continue;
        }
        if k.starts_with("$setElementOrder/") {
            continue;
        }
        if pv.is_null() {
            out.remove(k);
            continue;
        }
        let field = t.and_then(|t| t.field(k));
        let ft = field.as_ref().map(|(ft, _)| *ft);
        let meta = field.as_ref().map(|(_, m)| m.clone()).unwrap_or_default();
        let merged = match (out.get(k), pv) {
            (Some(Value::Object(dm)), Value::Object(pm)) => {
                let opaque = ft.map(|t| t.is_opaque()).unwrap_or(false);
                if opaque {
                    pv.clone()
                } else {
                    let child = ft
                        .filter(|t| t.is_object())
                        .or_else(|| ft.and_then(|t| t.additional()));
                    Value::Object(merge_map(
                        dm,
                        pm,
                        if ft.map(|t| t.is_map()).unwrap_or(false) {
                            None
                        } else {
                            child
                        },
                    )?)
                }
            }
            (Some(Value::Array(dl)), Value::Array(pl))
                if meta
                    .patch_strategy
                    .map(|s| s.contains("merge"))
                    .unwrap_or(false) =>
            {
                let order = patch
                    .get(&format!("$setElementOrder/{k}"))
                    .and_then(Value::as_array);
                Value::Array(merge_list(
                    dl,
                    pl,
                    meta.merge_key,
                    ft.and_then(|t| t.items()),
                    order,
                )?)
            }
            (None, Value::Object(pm)) => {
                let child = ft.filter(|t| t.is_object());
                Value::Object(merge_map(&Map::new(), pm, child)?)
            }
            (None, Value::Array(pl))
                if meta
                    .patch_strategy
                    .map(|s| s.contains("merge"))
                    .unwrap_or(false) =>
            {
                Value::Array(merge_list(
                    &[],
                    pl,
                    meta.merge_key,
                    ft.and_then(|t| t.items()),
                    None,
                )?)
            }
            _ => strip(pv),
        };
        out.insert(k.clone(), merged);
    }
    Ok(out)
}

/// Removes directives from a value placed as is.
fn strip(v: &Value) -> Value {
    match v {
        Value::Object(m) => Value::Object(
            m.iter()
                .filter(|(k, _)| !k.starts_with('$'))
                .map(|(k, v)| (k.clone(), strip(v)))
                .collect(),
        ),
        Value::Array(a) => Value::Array(
            a.iter()
                .filter(|x| x.get("$patch").is_none())
                .map(strip)
                .collect(),
        ),
        other => other.clone(),
    }
}

fn merge_list(
    doc: &[Value],
    patch: &[Value],
    key: Option<&str>,
    items: Option<TypeRef>,
    order: Option<&Vec<Value>>,
) -> Result<Vec<Value>, ApiError> {
    let Some(key) = key else {
        // A merged list of primitives is a union.
        let mut out: Vec<Value> = doc.to_vec();
        for p in patch {
            if !out.contains(p) {
                out.push(p.clone());
            }
        }
        return Ok(out);
    };
    if patch
        .iter()
        .any(|p| p.get("$patch").and_then(Value::as_str) == Some("replace"))
    {
        return Ok(patch
            .iter()
            .filter(|p| p.get("$patch").is_none())
            .map(strip)
            .collect());
    }
    let mut out: Vec<Value> = doc.to_vec();
    for p in patch {
        let Some(pm) = p.as_object() else {
            return Err(bad("a merge-keyed list item must be an object"));
        };
        let kv = pm.get(key).cloned().ok_or_else(|| {
            bad(format!(
                "map: {p} does not contain declared merge key: {key}"
            ))
        })?;
        let pos = out.iter().position(|d| d.get(key) == Some(&kv));
        if pm.get("$patch").and_then(Value::as_str) == Some("delete") {
            if let Some(i) = pos {
                out.remove(i);
            }
            continue;
        }
        match pos {
            Some(i) => {
                let merged = merge_map(out[i].as_object().unwrap_or(&Map::new()), pm, items)?;
                out[i] = Value::Object(merged);
            }
            None => out.push(Value::Object(merge_map(&Map::new(), pm, items)?)),
        }
    }
    if let Some(order) = order {
        let pos = |v: &Value| {
            order
                .iter()
                .position(|o| o.get(key) == v.get(key))
                .unwrap_or(usize::MAX)
        };
        out.sort_by_key(pos);
    }
    Ok(out)
}

/// A step of the path being walked: written out only when something is
/// reported there, so a clean object costs no path strings.
enum Step<'a> {
    Key(&'a str),
    Index(usize),
}

/// `.a.b[0].c` for the steps walked so far.
fn path_text(steps: &[Step]) -> String {
    let mut p = String::new();
    for s in steps {
        match s {
            Step::Key(k) => {
                p.push('.');
                p.push_str(k);
            }
            Step::Index(i) => {
                p.push('[');
                p.push_str(&i.to_string());
                p.push(']');
            }
        }
    }
    p
}

/// Fields of `obj` the schema does not know, as `.a.b[0].c` paths.
pub fn unknown_fields(t: TypeRef, obj: &Value) -> Vec<String> {
    let mut out = Vec::new();
    walk(t, obj, &mut Vec::new(), &mut out);
    out
}

fn walk<'a>(t: TypeRef, v: &'a Value, path: &mut Vec<Step<'a>>, out: &mut Vec<String>) {
    match v {
        Value::Object(m) if t.is_object() => {
            for (k, child) in m {
                match t.field_type(k) {
                    Some(ft) => {
                        path.push(Step::Key(k));
                        walk(ft, child, path, out);
                        path.pop();
                    }
                    None if path.is_empty() && (k == "apiVersion" || k == "kind") => {}
                    None => out.push(format!("{}.{k}", path_text(path))),
                }
            }
        }
        Value::Object(m) if t.is_map() => {
            if let Some(vt) = t.additional() {
                for (k, child) in m {
                    path.push(Step::Key(k));
                    walk(vt, child, path, out);
                    path.pop();
                }
            }
        }
        Value::Array(a) => {
            if let Some(it) = t.items() {
                for (i, child) in a.iter().enumerate() {
                    path.push(Step::Index(i));
                    walk(it, child, path, out);
                    path.pop();
                }
            }
        }
        _ => {}
    }
}

/// Values whose JSON type is not the one the schema declares, each as
/// Kubernetes' decoder words it (`json: cannot unmarshal string into Go
/// struct field DeploymentSpec.spec.replicas of type int32`). Nulls are
/// unset values and opaque types (quantities, int-or-string) accept anything.
pub fn type_errors(t: TypeRef, obj: &Value) -> Vec<String> {
    let mut out = Vec::new();
    check_types(t, obj, &mut Vec::new(), &mut out);
    out
}

fn json_kind(v: &Value) -> &'static str {
    match v {
        Value::String(_) => "string",
        Value::Number(_) => "number",
        Value::Bool(_) => "bool",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
        Value::Null => "null",
    }
}

fn go_type(t: &TypeRef) -> String {
    let sv = t.schema_value();
    let fmt = sv.get("format").and_then(Value::as_str);
    match sv.get("type").and_then(Value::as_str) {
        Some("string") => "string".into(),
        Some("integer") => fmt.unwrap_or("int64").into(),
        Some("number") => "float64".into(),
        Some("boolean") => "bool".into(),
        Some("array") => format!(
            "[]{}",
            t.items()
                .map(|i| go_type(&i))
                .unwrap_or_else(|| "interface {}".into())
        ),
        _ if t.is_map() => format!(
            "map[string]{}",
            t.additional()
                .map(|a| go_type(&a))
                .unwrap_or_else(|| "string".into())
        ),
        _ => t
            .definition()
            .map(|d| format!("v1.{}", d.rsplit('.').next().unwrap_or(d)))
            .unwrap_or_else(|| "struct".into()),
    }
}

fn check_types<'a>(t: TypeRef, v: &'a Value, path: &mut Vec<Step<'a>>, out: &mut Vec<String>) {
    let sv = t.schema_value();
    if v.is_null() || t.is_opaque() {
        return;
    }
    let ok = match sv.get("type").and_then(Value::as_str) {
        Some("string") => v.is_string(),
        Some("integer") => v.is_i64() || v.is_u64(),
        Some("number") => v.is_number(),
        Some("boolean") => v.is_boolean(),
        Some("array") => v.is_array(),
        _ if t.is_object() || t.is_map() => v.is_object(),
        _ => true,
    };
    if !ok {
        out.push(format!(
            "json: cannot unmarshal {} into Go struct field {} of type {}",
            json_kind(v),
            path_text(path).trim_start_matches('.'),
            go_type(&t)
        ));
        return;
    }
    match v {
        Value::Object(m) if t.is_object() => {
            for (k, child) in m {
                if let Some(ft) = t.field_type(k) {
                    path.push(Step::Key(k));
                    check_types(ft, child, path, out);
                    path.pop();
                }
            }
        }
        Value::Object(m) if t.is_map() => {
            if let Some(vt) = t.additional() {
                for (k, child) in m {
                    path.push(Step::Key(k));
                    check_types(vt, child, path, out);
                    path.pop();
                }
            }
        }
        Value::Array(a) => {
            if let Some(it) = t.items() {
                for (i, child) in a.iter().enumerate() {
                    path.push(Step::Index(i));
                    check_types(it, child, path, out);
                    path.pop();
                }
            }
        }
        _ => {}
    }
}

/// Keys that appear twice in one JSON object of `body`, as paths. Keys are
/// borrowed from the body and a path is only written out for a duplicate.
pub fn duplicate_fields(body: &[u8]) -> Vec<String> {
    let mut out = Vec::new();
    let mut de = serde_json::Deserializer::from_slice(body);
    let _ = serde::de::DeserializeSeed::deserialize(
        DupVisitor {
            path: &mut Vec::new(),
            out: &mut out,
        },
        &mut de,
    );
    out
}

/// `duplicate_fields` for a body that was already parsed into `parsed`
/// (or into that with fields removed, never added). A repeated key makes
/// the parsed object lose a member, so when the body's members (its
/// colons outside strings) are as many as the parsed object's, no key
/// repeats and the body is not parsed a second time; otherwise the paths
/// are looked for.
pub fn duplicate_fields_of(body: &[u8], parsed: &Value) -> Vec<String> {
    if members_in(body) == members_of(parsed) {
        return Vec::new();
    }
    duplicate_fields(body)
}

/// The members of the JSON text `body`: its colons outside strings.
fn members_in(body: &[u8]) -> usize {
    let (mut n, mut in_string, mut escaped) = (0, false, false);
    for &b in body {
        if in_string {
            if escaped {
                escaped = false;
            } else if b == b'\\' {
                escaped = true;
            } else if b == b'"' {
                in_string = false;
            }
        } else if b == b'"' {
            in_string = true;
        } else if b == b':' {
            n += 1;
        }
    }
    n
}

/// The members of every object in `v`.
fn members_of(v: &Value) -> usize {
    match v {
        Value::Object(m) => m.len() + m.values().map(members_of).sum::<usize>(),
        Value::Array(a) => a.iter().map(members_of).sum(),
        _ => 0,
    }
}

enum Seg<'de> {
    Key(std::borrow::Cow<'de, str>),
    Index(usize),
}

fn path_string(path: &[Seg], last: &str) -> String {
    let mut p = String::new();
    for seg in path {
        match seg {
            Seg::Key(k) => {
                if !p.is_empty() {
                    p.push('.');
                }
                p.push_str(k);
            }
            Seg::Index(i) => p.push_str(&format!("[{i}]")),
        }
    }
    if !p.is_empty() {
        p.push('.');
    }
    p.push_str(last);
    p
}

struct DupVisitor<'p, 'de> {
    path: &'p mut Vec<Seg<'de>>,
    out: &'p mut Vec<String>,
}

impl<'de> serde::de::DeserializeSeed<'de> for DupVisitor<'_, 'de> {
    type Value = ();
    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> serde::de::Visitor<'de> for DupVisitor<'_, 'de> {
    type Value = ();
    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("any JSON value")
    }
    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        let mut seen = std::collections::HashSet::new();
        while let Some(crate::fields::Key(k)) = map.next_key()? {
            if seen.contains(&k) {
                self.out.push(path_string(self.path, &k));
            }
            self.path.push(Seg::Key(k.clone()));
            let r = map.next_value_seed(DupVisitor {
                path: &mut *self.path,
                out: &mut *self.out,
            });
            self.path.pop();
            r?;
            seen.insert(k);
        }
        Ok(())
    }
    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        let mut i = 0;
        loop {
            self.path.push(Seg::Index(i));
            let r = seq.next_element_seed(DupVisitor {
                path: &mut *self.path,
                out: &mut *self.out,
            });
            self.path.pop();
            if r?.is_none() {
                return Ok(());
            }
            i += 1;
        }
    }
    fn visit_bool<E>(self, _: bool) -> Result<(), E> {
        Ok(())
    }
    fn visit_i64<E>(self, _: i64) -> Result<(), E> {
        Ok(())
    }
    fn visit_u64<E>(self, _: u64) -> Result<(), E> {
        Ok(())
    }
    fn visit_f64<E>(self, _: f64) -> Result<(), E> {
        Ok(())
    }
    fn visit_str<E>(self, _: &str) -> Result<(), E> {
        Ok(())
    }
    fn visit_unit<E>(self) -> Result<(), E> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::schema::root;
    use serde_json::json;

    #[test]
    fn duplicates_are_found_with_or_without_the_parsed_body() {
        for (body, want) in [
            (r#"{"a": 1, "b": {"c": ":", "d": "\\\":"}}"#, vec![]),
            (r#"{"a": 1, "a": 2}"#, vec!["a"]),
            (r#"{"s": {"x": [{"k": 1, "k": 2}]}}"#, vec!["s.x[0].k"]),
            (r#"{"a": {"x": 1}, "a": {"y": "a:b"}}"#, vec!["a"]),
            (r#"[{"q": "\"", "q": 1}]"#, vec!["[0].q"]),
        ] {
            let parsed: Value = serde_json::from_str(body).unwrap();
            assert_eq!(
                duplicate_fields_of(body.as_bytes(), &parsed),
                want,
                "{body}"
            );
            assert_eq!(duplicate_fields(body.as_bytes()), want, "{body}");
        }
    }

    fn deploy() -> Value {
        json!({"spec": {"replicas": 1, "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": "25%"}},
            "template": {"spec": {"containers": [
                {"name": "a", "image": "a:1", "env": [{"name": "X", "value": "1"}], "ports": [{"containerPort": 80}, {"containerPort": 81}]},
                {"name": "b", "image": "b:1"}]}}}})
    }

    #[test]
    fn changing_one_containers_image_keeps_the_others() {
        let t = root("apps", "v1", "Deployment");
        let p = json!({"spec": {"template": {"spec": {"containers": [{"name": "b", "image": "b:2"}]}}}});
        let out = apply_strategic_merge_patch(&deploy(), &p, t).unwrap();
        let cs = &out["spec"]["template"]["spec"]["containers"];
        assert_eq!(cs[0]["image"], "a:1");
        assert_eq!(cs[1]["image"], "b:2");
    }

    #[test]
    fn an_env_var_is_added_by_name_and_a_port_removed_by_directive() {
        let t = root("apps", "v1", "Deployment");
        let p = json!({"spec": {"template": {"spec": {"containers": [{"name": "a",
            "env": [{"name": "Y", "value": "2"}],
            "ports": [{"containerPort": 81, "$patch": "delete"}]}]}}}});
        let out = apply_strategic_merge_patch(&deploy(), &p, t).unwrap();
        let a = &out["spec"]["template"]["spec"]["containers"][0];
        assert_eq!(a["env"].as_array().unwrap().len(), 2);
        assert_eq!(a["ports"], json!([{"containerPort": 80}]));
    }

    #[test]
    fn retain_keys_drops_the_rolling_update_when_switching_to_recreate() {
        let t = root("apps", "v1", "Deployment");
        let p = json!({"spec": {"strategy": {"$retainKeys": ["type"], "type": "Recreate", "rollingUpdate": null}}});
        let out = apply_strategic_merge_patch(&deploy(), &p, t).unwrap();
        assert_eq!(out["spec"]["strategy"], json!({"type": "Recreate"}));
    }

    #[test]
    fn a_merge_patch_with_null_deletes() {
        let out =
            apply_merge_patch(&json!({"a": 1, "b": {"c": 2}}), &json!({"b": {"c": null}})).unwrap();
        assert_eq!(out, json!({"a": 1, "b": {}}));
    }

    #[test]
    fn a_failed_json_patch_test_is_invalid() {
        let e = apply_json_patch(
            &json!({"a": 1}),
            &json!([{"op": "test", "path": "/a", "value": 2}]),
        )
        .unwrap_err();
        assert_eq!(e.code, 422);
        assert_eq!(
            apply_json_patch(&json!({}), &json!({"op": 1}))
                .unwrap_err()
                .code,
            400
        );
    }

    #[test]
    fn misspelled_fields_are_unknown_and_labels_are_free() {
        let t = root("", "v1", "Pod").unwrap();
        let pod = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "labels": {"any": "x"}},
            "spec": {"containers": [{"name": "c", "imagee": "x", "resources": {"limits": {"cpu": "1"}}}]}});
        assert_eq!(
            unknown_fields(t, &pod),
            vec![".spec.containers[0].imagee".to_string()]
        );
    }

    #[test]
    fn unknown_fields_at_every_depth_are_named_in_order() {
        let t = root("", "v1", "Pod").unwrap();
        let pod = json!({"apiVersion": "v1", "kind": "Pod", "extra": 1,
            "metadata": {"name": "p", "bogus": {}},
            "spec": {"containers": [{"name": "a"}, {"name": "b", "ports": [{"containerPort": 1, "x": 2}]}],
                "nodeSelector": {"k": "v"}}});
        assert_eq!(
            unknown_fields(t, &pod),
            vec![
                ".extra".to_string(),
                ".metadata.bogus".to_string(),
                ".spec.containers[1].ports[0].x".to_string(),
            ]
        );
        assert!(unknown_fields(t, &json!({"apiVersion": "v1", "kind": "Pod"})).is_empty());
    }

    #[test]
    fn values_of_the_wrong_type_are_named_with_their_path() {
        let t = root("apps", "v1", "Deployment").unwrap();
        let d = json!({"metadata": {"name": "d", "labels": {"a": "b"}}, "spec": {"replicas": "three", "paused": null,
            "template": {"spec": {"containers": [{"name": "c", "ports": [{"containerPort": 80.5}],
                "resources": {"limits": {"cpu": 1, "memory": "1Gi"}}}]}}}});
        let e = type_errors(t, &d);
        assert_eq!(e, vec![
            "json: cannot unmarshal string into Go struct field spec.replicas of type int32".to_string(),
            "json: cannot unmarshal number into Go struct field spec.template.spec.containers[0].ports[0].containerPort of type int32".to_string(),
        ]);
        assert!(type_errors(t, &json!({"metadata": {"labels": {"a": 1}}})).len() == 1);
    }

    #[test]
    fn duplicate_keys_are_found_with_their_path() {
        assert_eq!(
            duplicate_fields(br#"{"a": {"b": 1, "b": 2}, "c": [{"d": 1, "d": 1}]}"#),
            vec!["a.b", "c[0].d"]
        );
    }
}
