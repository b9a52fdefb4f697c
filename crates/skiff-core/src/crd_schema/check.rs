//! The checks kube-apiserver makes on a CRD version's `openAPIV3Schema`
//! before accepting it: the OpenAPI keywords CRDs may use, the
//! `x-kubernetes-*` extensions, and the structural-schema rules
//! (`apiextensions-apiserver/pkg/apis/apiextensions/validation` and
//! `pkg/apiserver/schema/validation.go`), worded as Kubernetes words them.

use serde_json::Value;

use crate::Cause;

const TYPES: &[&str] = &["array", "boolean", "integer", "number", "object", "string"];
const META_FIELDS: &[&str] = &["metadata", "apiVersion", "kind"];

#[derive(Clone, Copy, PartialEq, Eq)]
enum Level {
    Root,
    Items,
    Field,
}

#[derive(Clone)]
struct Ctx {
    /// Why defaults are forbidden here (inside top-level metadata).
    no_defaults: Option<String>,
    inside_meta: bool,
}

fn child(path: &str, name: &str) -> String {
    if path.is_empty() {
        name.to_string()
    } else {
        format!("{path}.{name}")
    }
}

fn key(path: &str, k: &str) -> String {
    format!("{path}[{k}]")
}

fn index(path: &str, i: usize) -> String {
    format!("{path}[{i}]")
}

fn required(path: String, detail: &str) -> Cause {
    let msg = if detail.is_empty() {
        "Required value".to_string()
    } else {
        format!("Required value: {detail}")
    };
    Cause::new("FieldValueRequired", path, msg)
}

/// Every reason the schema is refused (empty when it is acceptable, CEL
/// rules aside: they are compiled by the caller).
pub(crate) fn check(schema: &Value, path: &str) -> Vec<Cause> {
    let mut out = Vec::new();
    if !schema.is_object() {
        out.push(Cause::invalid(path, schema, "must be an object"));
        return out;
    }
    if schema.get("nullable").and_then(Value::as_bool) == Some(true) {
        out.push(Cause::forbidden(
            child(path, "nullable"),
            "nullable cannot be true at the root",
        ));
    }
    let ctx = Ctx {
        no_defaults: None,
        inside_meta: false,
    };
    props(schema, path, Level::Root, &ctx, &mut out);
    if out.is_empty() {
        let mut st = Vec::new();
        structural(schema, path, Level::Root, &mut st);
        completeness(schema, path, &mut st);
        // Kubernetes sorts these by their text, for a stable answer.
        st.sort_by_key(|c| format!("{}: {}", c.field, c.message));
        out.extend(st);
    }
    out
}

/// `ValidateCustomResourceDefinitionOpenAPISchema`: per-keyword rules.
fn props(s: &Value, path: &str, lvl: Level, ctx: &Ctx, out: &mut Vec<Cause>) {
    let Some(m) = s.as_object() else {
        out.push(Cause::invalid(path, s, "must be a schema object"));
        return;
    };
    let is_root = lvl == Level::Root;
    // specStandardValidatorV3
    if let Some(t) = m.get("type") {
        match t.as_str() {
            Some("null") => out.push(Cause::forbidden(
                child(path, "type"),
                "type cannot be set to null, use nullable as an alternative",
            )),
            Some(ty) if ty.is_empty() || TYPES.contains(&ty) => {}
            _ => out.push(Cause::not_supported(child(path, "type"), t, TYPES)),
        }
    }
    if m.contains_key("default") {
        if let Some(why) = &ctx.no_defaults {
            out.push(Cause::forbidden(child(path, "default"), why));
        }
    }
    for (kw, what) in [
        ("id", "id is not supported"),
        ("additionalItems", "additionalItems is not supported"),
        ("patternProperties", "patternProperties is not supported"),
        ("definitions", "definitions is not supported"),
        ("dependencies", "dependencies is not supported"),
        ("$ref", "$ref is not supported"),
        ("$schema", "$schema is not supported"),
    ] {
        if m.contains_key(kw) {
            out.push(Cause::forbidden(child(path, kw), what));
        }
    }
    if let Some(Value::Array(_)) = m.get("items") {
        out.push(Cause::forbidden(
            child(path, "items"),
            "items must be a schema object and not an array",
        ));
    }
    if ctx.inside_meta
        && m.get("x-kubernetes-embedded-resource")
            .and_then(Value::as_bool)
            == Some(true)
    {
        out.push(Cause::forbidden(
            child(path, "x-kubernetes-embedded-resource"),
            "must not be used inside of resource meta",
        ));
    }
    if m.get("uniqueItems").and_then(Value::as_bool) == Some(true) {
        out.push(Cause::forbidden(
            child(path, "uniqueItems"),
            "uniqueItems cannot be set to true since the runtime complexity becomes quadratic",
        ));
    }
    if let Some(p) = m.get("pattern") {
        match p.as_str() {
            Some(re) => {
                if let Err(e) = regex::Regex::new(re) {
                    out.push(Cause::invalid(
                        child(path, "pattern"),
                        p,
                        &format!("must be a valid regular expression, but isn't: {e}"),
                    ));
                }
            }
            None => out.push(Cause::invalid(
                child(path, "pattern"),
                p,
                "must be a string",
            )),
        }
    }
    let has_props = m
        .get("properties")
        .and_then(Value::as_object)
        .is_some_and(|p| !p.is_empty());
    if let Some(ap) = m.get("additionalProperties") {
        if has_props && (ap == &Value::Bool(false) || ap.is_object()) {
            out.push(Cause::forbidden(
                child(path, "additionalProperties"),
                "additionalProperties and properties are mutual exclusive",
            ));
        }
        if ap.is_object() {
            let mut sub = ctx.clone();
            if ctx.inside_meta {
                sub.no_defaults =
                    Some("inside additionalProperties applying to object metadata".into());
            }
            props(
                ap,
                &child(path, "additionalProperties"),
                Level::Field,
                &sub,
                out,
            );
        }
    }
    let embedded = m
        .get("x-kubernetes-embedded-resource")
        .and_then(Value::as_bool)
        == Some(true);
    if let Some(p) = m.get("properties") {
        match p.as_object() {
            Some(p) => {
                for (name, sub_schema) in p {
                    let mut sub = ctx.clone();
                    if (is_root || embedded) && META_FIELDS.contains(&name.as_str()) {
                        sub.inside_meta = true;
                        if is_root {
                            sub.no_defaults = Some(format!("in top-level {name}"));
                        }
                    }
                    props(
                        sub_schema,
                        &key(&child(path, "properties"), name),
                        Level::Field,
                        &sub,
                        out,
                    );
                }
            }
            None => out.push(Cause::invalid(
                child(path, "properties"),
                p,
                "must be an object",
            )),
        }
    }
    if let Some(n) = m.get("not") {
        props(n, &child(path, "not"), Level::Field, ctx, out);
    }
    for kw in ["allOf", "oneOf", "anyOf"] {
        if let Some(list) = m.get(kw) {
            match list.as_array() {
                Some(list) => {
                    for (i, sub) in list.iter().enumerate() {
                        props(sub, &index(&child(path, kw), i), Level::Field, ctx, out);
                    }
                }
                None => out.push(Cause::invalid(child(path, kw), list, "must be a list")),
            }
        }
    }
    if let Some(items) = m.get("items").filter(|i| i.is_object()) {
        props(items, &child(path, "items"), Level::Items, ctx, out);
    }
    if m.get("x-kubernetes-preserve-unknown-fields") == Some(&Value::Bool(false)) {
        out.push(Cause::invalid(
            child(path, "x-kubernetes-preserve-unknown-fields"),
            &Value::Bool(false),
            "must be true or undefined",
        ));
    }
    let ty = m.get("type").and_then(Value::as_str).unwrap_or("");
    if let Some(mt) = m.get("x-kubernetes-map-type") {
        if ty.is_empty() {
            out.push(required(
                child(path, "type"),
                "must be object if x-kubernetes-map-type is specified",
            ));
        } else if ty != "object" {
            out.push(Cause::invalid(
                child(path, "type"),
                &Value::String(ty.into()),
                "must be object if x-kubernetes-map-type is specified",
            ));
        }
        if !matches!(mt.as_str(), Some("atomic" | "granular")) {
            out.push(Cause::not_supported(
                child(path, "x-kubernetes-map-type"),
                mt,
                &["atomic", "granular"],
            ));
        }
    }
    let list_type = m.get("x-kubernetes-list-type");
    if let Some(lt) = list_type {
        if ty.is_empty() {
            out.push(required(
                child(path, "type"),
                "must be array if x-kubernetes-list-type is specified",
            ));
        } else if ty != "array" {
            out.push(Cause::invalid(
                child(path, "type"),
                &Value::String(ty.into()),
                "must be array if x-kubernetes-list-type is specified",
            ));
        } else if lt.as_str() == Some("set") {
            if let Some(items) = m.get("items").and_then(Value::as_object) {
                if let Some(ilt) = items.get("x-kubernetes-list-type") {
                    if ilt.as_str() != Some("atomic") {
                        out.push(Cause::invalid(
                            child(&child(path, "items"), "x-kubernetes-list-type"),
                            ilt,
                            "must be atomic as item of a list with x-kubernetes-list-type=set",
                        ));
                    }
                }
                if let Some(imt) = items.get("x-kubernetes-map-type") {
                    if imt.as_str() != Some("atomic") {
                        out.push(Cause::invalid(
                            child(&child(path, "items"), "x-kubernetes-map-type"),
                            imt,
                            "must be atomic as item of a list with x-kubernetes-list-type=set",
                        ));
                    }
                }
            }
        }
        if !matches!(lt.as_str(), Some("atomic" | "set" | "map")) {
            out.push(Cause::not_supported(
                child(path, "x-kubernetes-list-type"),
                lt,
                &["atomic", "set", "map"],
            ));
        }
    }
    let keys: Vec<&str> = m
        .get("x-kubernetes-list-map-keys")
        .and_then(Value::as_array)
        .map(|a| a.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    if !keys.is_empty() {
        match list_type {
            None => out.push(required(
                child(path, "x-kubernetes-list-type"),
                "must be map if x-kubernetes-list-map-keys is non-empty",
            )),
            Some(lt) if lt.as_str() != Some("map") => out.push(Cause::invalid(
                child(path, "x-kubernetes-list-type"),
                lt,
                "must be map if x-kubernetes-list-map-keys is non-empty",
            )),
            _ => {}
        }
    }
    if list_type.and_then(Value::as_str) == Some("map") {
        if keys.is_empty() {
            out.push(required(
                child(path, "x-kubernetes-list-map-keys"),
                "must not be empty if x-kubernetes-list-type is map",
            ));
        }
        match m.get("items") {
            None => out.push(required(
                child(path, "items"),
                "must have a schema if x-kubernetes-list-type is map",
            )),
            Some(Value::Array(a)) => out.push(Cause::invalid(
                child(path, "items"),
                &Value::Array(a.clone()),
                "must only have a single schema if x-kubernetes-list-type is map",
            )),
            Some(items) => {
                let ity = items.get("type").and_then(Value::as_str).unwrap_or("");
                if ity != "object" {
                    out.push(Cause::invalid(
                        child(&child(path, "items"), "type"),
                        &Value::String(ity.into()),
                        "must be object if parent array's x-kubernetes-list-type is map",
                    ));
                } else {
                    let iprops = items.get("properties").and_then(Value::as_object);
                    let ireq: Vec<&str> = items
                        .get("required")
                        .and_then(Value::as_array)
                        .map(|a| a.iter().filter_map(Value::as_str).collect())
                        .unwrap_or_default();
                    let mut seen = Vec::new();
                    let mut dup = false;
                    let mut unknown = false;
                    for k in &keys {
                        if seen.contains(k) {
                            dup = true;
                        }
                        seen.push(k);
                        match iprops.and_then(|p| p.get(*k)) {
                            None => unknown = true,
                            Some(ps) => {
                                let pty = ps.get("type").and_then(Value::as_str).unwrap_or("");
                                let int_or_string = ps
                                    .get("x-kubernetes-int-or-string")
                                    .and_then(Value::as_bool)
                                    == Some(true);
                                if !int_or_string
                                    && !matches!(pty, "string" | "integer" | "number" | "boolean")
                                {
                                    out.push(Cause::invalid(
                                        child(
                                            &key(&child(&child(path, "items"), "properties"), k),
                                            "type",
                                        ),
                                        &Value::String(pty.into()),
                                        "must be a scalar type if parent array's x-kubernetes-list-type is map",
                                    ));
                                }
                                if ps.get("nullable").and_then(Value::as_bool) == Some(true) {
                                    out.push(Cause::forbidden(
                                        child(
                                            &key(&child(&child(path, "items"), "properties"), k),
                                            "nullable",
                                        ),
                                        "this property is in x-kubernetes-list-map-keys, so it cannot be nullable",
                                    ));
                                }
                                if !ireq.contains(k) && ps.get("default").is_none() {
                                    out.push(required(
                                        child(
                                            &key(&child(&child(path, "items"), "properties"), k),
                                            "default",
                                        ),
                                        "this property is in x-kubernetes-list-map-keys, so it must have a default or be a required property",
                                    ));
                                }
                            }
                        }
                    }
                    let keys_value = m
                        .get("x-kubernetes-list-map-keys")
                        .cloned()
                        .unwrap_or_default();
                    if unknown {
                        out.push(Cause::invalid(
                            child(path, "x-kubernetes-list-map-keys"),
                            &keys_value,
                            "entries must all be names of item properties",
                        ));
                    }
                    if dup {
                        out.push(Cause::invalid(
                            child(path, "x-kubernetes-list-map-keys"),
                            &keys_value,
                            "must not contain duplicate entries",
                        ));
                    }
                }
            }
        }
    }
    if matches!(list_type.and_then(Value::as_str), Some("set" | "map")) {
        if let Some(items) = m.get("items") {
            if items.get("nullable").and_then(Value::as_bool) == Some(true) {
                out.push(Cause::forbidden(
                    child(&child(path, "items"), "nullable"),
                    &format!(
                        "cannot be nullable when x-kubernetes-list-type is {}",
                        list_type.and_then(Value::as_str).unwrap_or("")
                    ),
                ));
            }
        }
    }
    if let Some(v) = m.get("x-kubernetes-validations") {
        match v.as_array() {
            Some(rules) => {
                let vpath = child(path, "x-kubernetes-validations");
                for (i, r) in rules.iter().enumerate() {
                    rule_fields(r, &index(&vpath, i), out);
                }
            }
            None => out.push(Cause::invalid(
                child(path, "x-kubernetes-validations"),
                v,
                "must be a list",
            )),
        }
    }
}

/// The static parts of one `x-kubernetes-validations` entry.
fn rule_fields(r: &Value, path: &str, out: &mut Vec<Cause>) {
    let rule = r.get("rule").and_then(Value::as_str).unwrap_or("");
    if rule.trim().is_empty() {
        out.push(required(child(path, "rule"), "rule is not specified"));
    }
    if let Some(msg) = r.get("message") {
        let s = msg.as_str().unwrap_or("");
        if s.trim().is_empty() {
            out.push(Cause::invalid(
                child(path, "message"),
                msg,
                "must be non-empty if specified",
            ));
        } else if s.contains(['\n', '\r']) {
            out.push(Cause::invalid(
                child(path, "message"),
                msg,
                "must not contain line breaks",
            ));
        }
    } else if rule.contains(['\n', '\r']) {
        out.push(required(
            child(path, "message"),
            "message must be specified if rule contains line breaks",
        ));
    }
    if let Some(me) = r.get("messageExpression") {
        if me.as_str().unwrap_or("").trim().is_empty() {
            out.push(required(
                child(path, "messageExpression"),
                "messageExpression must be non-empty if specified",
            ));
        }
    }
    if let Some(reason) = r.get("reason") {
        const REASONS: &[&str] = &[
            "FieldValueDuplicate",
            "FieldValueForbidden",
            "FieldValueInvalid",
            "FieldValueRequired",
        ];
        if !reason.as_str().is_some_and(|s| REASONS.contains(&s)) {
            out.push(Cause::not_supported(child(path, "reason"), reason, REASONS));
        }
    }
    if let Some(fp) = r.get("fieldPath") {
        let s = fp.as_str().unwrap_or("");
        if s.is_empty() {
            out.push(Cause::invalid(
                child(path, "fieldPath"),
                fp,
                "must be non-empty if specified",
            ));
        } else if s.contains('\n') {
            out.push(Cause::invalid(
                child(path, "fieldPath"),
                fp,
                "must not contain line breaks",
            ));
        }
    }
}

fn is_int_or_string_anyof(list: Option<&Value>) -> bool {
    let Some(list) = list.and_then(Value::as_array) else {
        return false;
    };
    if list.len() != 2 {
        return false;
    }
    let only_type = |s: &Value, t: &str| {
        s.as_object()
            .is_some_and(|m| m.get("type").and_then(Value::as_str) == Some(t))
    };
    only_type(&list[0], "integer") && only_type(&list[1], "string")
}

/// `validateStructuralInvariants` and friends: every specified field has a
/// type, arrays have items, value validations stay value validations.
fn structural(s: &Value, path: &str, lvl: Level, out: &mut Vec<Cause>) {
    let Some(m) = s.as_object() else { return };
    let flag = |k: &str| m.get(k).and_then(Value::as_bool) == Some(true);
    let ty = m.get("type").and_then(Value::as_str).unwrap_or("");
    let int_or_string = flag("x-kubernetes-int-or-string");
    let preserve = flag("x-kubernetes-preserve-unknown-fields");
    let embedded = flag("x-kubernetes-embedded-resource");

    if ty == "array" && !m.contains_key("items") {
        out.push(required(child(path, "items"), "must be specified"));
    }
    if let Some(items) = m.get("items") {
        structural(items, &child(path, "items"), Level::Items, out);
    }
    if let Some(p) = m.get("properties").and_then(Value::as_object) {
        for (k, v) in p {
            structural(v, &key(&child(path, "properties"), k), Level::Field, out);
        }
    }
    if let Some(ap) = m.get("additionalProperties") {
        if lvl == Level::Root {
            out.push(Cause::forbidden(
                child(path, "additionalProperties"),
                "must not be used at the root",
            ));
        } else if ap.is_object() {
            structural(ap, &child(path, "additionalProperties"), Level::Field, out);
        }
    }
    if int_or_string {
        if preserve {
            out.push(Cause::invalid(
                child(path, "x-kubernetes-preserve-unknown-fields"),
                &Value::Bool(true),
                "must be false if x-kubernetes-int-or-string is true",
            ));
        }
        if embedded {
            out.push(Cause::invalid(
                child(path, "x-kubernetes-embedded-resource"),
                &Value::Bool(true),
                "must be false if x-kubernetes-int-or-string is true",
            ));
        }
    }
    // value validations
    let skip_any_of = int_or_string && is_int_or_string_anyof(m.get("anyOf"));
    let skip_first_all_of_any_of = int_or_string
        && m.get("allOf")
            .and_then(Value::as_array)
            .and_then(|a| a.first())
            .is_some_and(|f| is_int_or_string_anyof(f.get("anyOf")));
    if !skip_any_of {
        for (i, sub) in m
            .get("anyOf")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .enumerate()
        {
            nested(sub, &index(&child(path, "anyOf"), i), false, out);
        }
    }
    for (i, sub) in m
        .get("allOf")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .enumerate()
    {
        nested(
            sub,
            &index(&child(path, "allOf"), i),
            i == 0 && skip_first_all_of_any_of,
            out,
        );
    }
    for (i, sub) in m
        .get("oneOf")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .enumerate()
    {
        nested(sub, &index(&child(path, "oneOf"), i), false, out);
    }
    if let Some(n) = m.get("not") {
        nested(n, &child(path, "not"), false, out);
    }

    if embedded && ty != "object" {
        if ty.is_empty() {
            out.push(required(
                child(path, "type"),
                "must be object if x-kubernetes-embedded-resource is true",
            ));
        } else {
            out.push(Cause::invalid(
                child(path, "type"),
                &Value::String(ty.into()),
                "must be object if x-kubernetes-embedded-resource is true",
            ));
        }
    } else if ty.is_empty() && !int_or_string && !preserve {
        let detail = match lvl {
            Level::Root => "must not be empty at the root",
            Level::Items => "must not be empty for specified array items",
            Level::Field => "must not be empty for specified object fields",
        };
        out.push(required(child(path, "type"), detail));
    }
    if embedded && m.contains_key("additionalProperties") {
        out.push(Cause::forbidden(
            child(path, "additionalProperties"),
            "must not be used if x-kubernetes-embedded-resource is set",
        ));
    }
    if lvl == Level::Root && !ty.is_empty() && ty != "object" {
        out.push(Cause::invalid(
            child(path, "type"),
            &Value::String(ty.into()),
            "must be object at the root",
        ));
    }
    if lvl == Level::Root || embedded {
        let props = m.get("properties").and_then(Value::as_object);
        for name in ["kind", "apiVersion"] {
            if let Some(p) = props.and_then(|p| p.get(name)) {
                let pty = p.get("type").and_then(Value::as_str).unwrap_or("");
                if !pty.is_empty() && pty != "string" {
                    out.push(Cause::invalid(
                        child(&key(&child(path, "properties"), name), "type"),
                        &Value::String(pty.into()),
                        "must be string",
                    ));
                }
            }
        }
        if let Some(meta) = props.and_then(|p| p.get("metadata")) {
            let mty = meta.get("type").and_then(Value::as_str).unwrap_or("");
            let mpath = key(&child(path, "properties"), "metadata");
            if !mty.is_empty() && mty != "object" {
                out.push(Cause::invalid(
                    child(&mpath, "type"),
                    &Value::String(mty.into()),
                    "must be object",
                ));
            }
            if lvl == Level::Root {
                let only_names = meta.as_object().is_some_and(|mm| {
                    mm.keys().all(|k| k == "type" || k == "properties")
                        && mm
                            .get("properties")
                            .and_then(Value::as_object)
                            .is_none_or(|p| {
                                p.iter().all(|(k, v)| {
                                    (k == "name" || k == "generateName")
                                        && v.as_object().is_some_and(|vm| {
                                            vm.keys().all(|x| {
                                                !matches!(
                                                    x.as_str(),
                                                    "properties"
                                                        | "items"
                                                        | "additionalProperties"
                                                        | "default"
                                                )
                                            })
                                        })
                                })
                            })
                });
                if !only_names {
                    out.push(Cause::forbidden(
                        mpath,
                        "must not specify anything other than name and generateName, but metadata is implicitly specified",
                    ));
                }
            }
        }
        if embedded
            && !preserve
            && m.get("properties")
                .and_then(Value::as_object)
                .is_none_or(|p| p.is_empty())
        {
            out.push(required(
                child(path, "properties"),
                "must not be empty if x-kubernetes-embedded-resource is true without x-kubernetes-preserve-unknown-fields",
            ));
        }
    }
}

fn forbid_key_metadata(path: &str, out: &mut Vec<Cause>) {
    out.push(Cause::forbidden(
        key(&child(path, "properties"), "metadata"),
        "must not be specified in a nested context",
    ));
}

/// `validateStructuralCompleteness`: every property or items a value
/// validation mentions is specified in the structural schema beside it.
fn completeness(s: &Value, path: &str, out: &mut Vec<Cause>) {
    let Some(m) = s.as_object() else { return };
    value_complete(s, Some(s), path, path, out);
    if let Some(items) = m.get("items") {
        completeness(items, &child(path, "items"), out);
    }
    if let Some(p) = m.get("properties").and_then(Value::as_object) {
        for (k, v) in p {
            completeness(v, &key(&child(path, "properties"), k), out);
        }
    }
    if let Some(ap) = m.get("additionalProperties").filter(|a| a.is_object()) {
        completeness(ap, &child(path, "additionalProperties"), out);
    }
}

fn value_complete(v: &Value, s: Option<&Value>, s_path: &str, v_path: &str, out: &mut Vec<Cause>) {
    let Some(vm) = v.as_object() else { return };
    if let Some(n) = vm.get("not") {
        nested_complete(n, s, s_path, &child(v_path, "not"), out);
    }
    for kw in ["allOf", "anyOf", "oneOf"] {
        for (i, sub) in vm
            .get(kw)
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .enumerate()
        {
            nested_complete(sub, s, s_path, &index(&child(v_path, kw), i), out);
        }
    }
}

fn nested_complete(v: &Value, s: Option<&Value>, s_path: &str, v_path: &str, out: &mut Vec<Cause>) {
    let Some(s) = s else {
        out.push(required(
            s_path.to_string(),
            &format!("because it is defined in {v_path}"),
        ));
        return;
    };
    value_complete(v, Some(s), s_path, v_path, out);
    let Some(vm) = v.as_object() else { return };
    if let Some(items) = vm.get("items") {
        nested_complete(
            items,
            s.get("items"),
            &child(s_path, "items"),
            &child(v_path, "items"),
            out,
        );
    }
    if let Some(p) = vm.get("properties").and_then(Value::as_object) {
        for (k, sub) in p {
            let sp = key(&child(s_path, "properties"), k);
            let vp = key(&child(v_path, "properties"), k);
            match s.get("properties").and_then(|p| p.get(k)) {
                None => out.push(required(sp, &format!("because it is defined in {vp}"))),
                Some(sf) => nested_complete(sub, Some(sf), &sp, &vp, out),
            }
        }
    }
}

/// A schema under `allOf`/`anyOf`/`oneOf`/`not`: only value validations.
fn nested(s: &Value, path: &str, skip_any_of: bool, out: &mut Vec<Cause>) {
    let Some(m) = s.as_object() else { return };
    let forbid = |k: &str, detail: &str, out: &mut Vec<Cause>| {
        out.push(Cause::forbidden(child(path, k), detail));
    };
    if m.get("type")
        .and_then(Value::as_str)
        .is_some_and(|t| !t.is_empty())
    {
        forbid("type", "must be empty to be structural", out);
    }
    if m.contains_key("additionalProperties") {
        forbid(
            "additionalProperties",
            "must be undefined to be structural",
            out,
        );
    }
    if m.contains_key("default") {
        forbid("default", "must be undefined to be structural", out);
    }
    if m.get("title")
        .and_then(Value::as_str)
        .is_some_and(|t| !t.is_empty())
    {
        forbid("title", "must be empty to be structural", out);
    }
    if m.get("description")
        .and_then(Value::as_str)
        .is_some_and(|t| !t.is_empty())
    {
        forbid("description", "must be empty to be structural", out);
    }
    if m.get("nullable").and_then(Value::as_bool) == Some(true) {
        forbid("nullable", "must be false to be structural", out);
    }
    for (k, detail) in [
        (
            "x-kubernetes-preserve-unknown-fields",
            "must be false to be structural",
        ),
        (
            "x-kubernetes-embedded-resource",
            "must be false to be structural",
        ),
        (
            "x-kubernetes-int-or-string",
            "must be false to be structural",
        ),
    ] {
        if m.get(k).and_then(Value::as_bool) == Some(true) {
            forbid(k, detail, out);
        }
    }
    if m.get("x-kubernetes-list-map-keys")
        .and_then(Value::as_array)
        .is_some_and(|a| !a.is_empty())
    {
        forbid(
            "x-kubernetes-list-map-keys",
            "must be empty to be structural",
            out,
        );
    }
    if m.contains_key("x-kubernetes-list-type") {
        forbid(
            "x-kubernetes-list-type",
            "must be undefined to be structural",
            out,
        );
    }
    if m.contains_key("x-kubernetes-map-type") {
        forbid(
            "x-kubernetes-map-type",
            "must be undefined to be structural",
            out,
        );
    }
    if m.get("x-kubernetes-validations")
        .and_then(Value::as_array)
        .is_some_and(|a| !a.is_empty())
    {
        forbid(
            "x-kubernetes-validations",
            "must be empty to be structural",
            out,
        );
    }
    if m.get("properties")
        .and_then(Value::as_object)
        .is_some_and(|p| p.contains_key("metadata"))
    {
        forbid_key_metadata(path, out);
    }
    if let Some(items) = m.get("items") {
        nested(items, &child(path, "items"), false, out);
    }
    if let Some(p) = m.get("properties").and_then(Value::as_object) {
        for (k, v) in p {
            nested(v, &key(&child(path, "properties"), k), false, out);
        }
    }
    if !skip_any_of {
        for (i, sub) in m
            .get("anyOf")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .enumerate()
        {
            nested(sub, &index(&child(path, "anyOf"), i), false, out);
        }
    }
    for kw in ["allOf", "oneOf"] {
        for (i, sub) in m
            .get(kw)
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .enumerate()
        {
            nested(sub, &index(&child(path, kw), i), false, out);
        }
    }
    if let Some(n) = m.get("not") {
        nested(n, &child(path, "not"), false, out);
    }
}
