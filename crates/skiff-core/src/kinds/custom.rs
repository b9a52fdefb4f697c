//! Custom resources: the rules of a kind defined by a
//! CustomResourceDefinition, and the served resources built from one.
//!
//! `ResourceInfo` holds `&'static` data, so each served version of an
//! Established definition is leaked once, interned by the content it is
//! built from: re-reading or re-applying the same definition leaks nothing
//! more. The set of served resources is each server's [`crate::resources::Catalog`].

use std::collections::HashMap;
use std::sync::{Mutex, OnceLock};

use super::prelude::*;
use crate::resources::ResourceInfo;
use crate::table::Column;

/// A JSONPath as printer columns and selectable fields use them (kubectl's
/// subset: `.a.b`, `.a[0]`, `.a[*].b`, `.a['x.y']`, optionally in `{}`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JsonPath(Vec<Step>);

#[derive(Debug, Clone, PartialEq, Eq)]
enum Step {
    Field(String),
    Index(i64),
    All,
    /// `[?(@.a.b=="v")]` (or `!=`): the elements whose field compares so.
    Filter {
        path: Vec<String>,
        equal: bool,
        value: String,
    },
}

/// `?(@.type=="Ready")` → the filter step.
fn parse_filter(inner: &str) -> Option<Step> {
    let body = inner.strip_prefix('?')?.trim();
    let body = body.strip_prefix('(')?.strip_suffix(')')?.trim();
    let rest = body.strip_prefix("@.")?;
    let (lhs, rhs, equal) = match rest.split_once("==") {
        Some((l, r)) => (l, r, true),
        None => {
            let (l, r) = rest.split_once("!=")?;
            (l, r, false)
        }
    };
    let rhs = rhs.trim();
    let value = rhs
        .strip_prefix('"')
        .and_then(|x| x.strip_suffix('"'))
        .or_else(|| rhs.strip_prefix('\'').and_then(|x| x.strip_suffix('\'')))
        .unwrap_or(rhs)
        .to_string();
    let path: Vec<String> = lhs.trim().split('.').map(str::to_string).collect();
    if path.iter().any(String::is_empty) {
        return None;
    }
    Some(Step::Filter { path, equal, value })
}

impl JsonPath {
    pub fn parse(p: &str) -> Result<JsonPath, String> {
        let mut s = p.trim();
        if let Some(inner) = s.strip_prefix('{').and_then(|x| x.strip_suffix('}')) {
            s = inner.trim();
        }
        if !s.starts_with('.') && !s.starts_with('[') {
            return Err(format!("path {p:?} must start with '.'"));
        }
        let b = s.as_bytes();
        let mut i = 0;
        let mut steps = Vec::new();
        while i < b.len() {
            match b[i] {
                b'.' => {
                    let start = i + 1;
                    let mut j = start;
                    while j < b.len() && b[j] != b'.' && b[j] != b'[' {
                        j += 1;
                    }
                    if j == start {
                        if start == b.len() && steps.is_empty() {
                            // `.`: the whole object.
                            i = j;
                            continue;
                        }
                        return Err(format!("empty field name in {p:?}"));
                    }
                    let name = &s[start..j];
                    if !name
                        .bytes()
                        .all(|c| c.is_ascii_alphanumeric() || c == b'_' || c == b'-' || c == b'$')
                    {
                        return Err(format!("unexpected character in {name:?}"));
                    }
                    steps.push(Step::Field(name.to_string()));
                    i = j;
                }
                b'[' => {
                    let end = s[i..]
                        .find(']')
                        .map(|e| e + i)
                        .ok_or_else(|| format!("unterminated [ in {p:?}"))?;
                    let inner = s[i + 1..end].trim();
                    if inner.starts_with('?') {
                        steps.push(
                            parse_filter(inner)
                                .ok_or_else(|| format!("unsupported filter {inner:?} in {p:?}"))?,
                        );
                    } else if inner == "*" {
                        steps.push(Step::All);
                    } else if let Some(q) = inner
                        .strip_prefix('\'')
                        .and_then(|x| x.strip_suffix('\''))
                        .or_else(|| inner.strip_prefix('"').and_then(|x| x.strip_suffix('"')))
                    {
                        steps.push(Step::Field(q.to_string()));
                    } else if let Ok(n) = inner.parse::<i64>() {
                        steps.push(Step::Index(n));
                    } else {
                        return Err(format!("unsupported index {inner:?} in {p:?}"));
                    }
                    i = end + 1;
                }
                c => return Err(format!("unexpected {:?} in {p:?}", c as char)),
            }
        }
        Ok(JsonPath(steps))
    }

    /// Every value the path reaches in `obj`.
    pub fn eval<'a>(&self, obj: &'a Value) -> Vec<&'a Value> {
        let mut cur = vec![obj];
        for step in &self.0 {
            let mut next = Vec::new();
            for v in cur {
                match step {
                    Step::Field(f) => {
                        if let Some(x) = v.get(f.as_str()) {
                            next.push(x);
                        }
                    }
                    Step::Index(n) => {
                        if let Some(a) = v.as_array() {
                            let idx = if *n < 0 { a.len() as i64 + n } else { *n };
                            if let Some(x) = usize::try_from(idx).ok().and_then(|i| a.get(i)) {
                                next.push(x);
                            }
                        }
                    }
                    Step::All => match v {
                        Value::Array(a) => next.extend(a.iter()),
                        Value::Object(m) => next.extend(m.values()),
                        _ => {}
                    },
                    Step::Filter { path, equal, value } => {
                        let items: Vec<&Value> = match v {
                            Value::Array(a) => a.iter().collect(),
                            other => vec![other],
                        };
                        for item in items {
                            let mut f = Some(item);
                            for p in path {
                                f = f.and_then(|x| x.get(p.as_str()));
                            }
                            let shown = match f {
                                Some(Value::String(s)) => Some(s.clone()),
                                Some(Value::Null) | None => None,
                                Some(other) => Some(other.to_string()),
                            };
                            if (shown.as_deref() == Some(value.as_str())) == *equal {
                                next.push(item);
                            }
                        }
                    }
                }
            }
            cur = next;
        }
        cur
    }

    /// The JSON pointer of a path of fields only (selectable fields, scale).
    pub fn pointer(&self) -> Option<String> {
        let mut out = String::new();
        for s in &self.0 {
            match s {
                Step::Field(f) => {
                    out.push('/');
                    out.push_str(&f.replace('~', "~0").replace('/', "~1"));
                }
                Step::Index(n) if *n >= 0 => out.push_str(&format!("/{n}")),
                _ => return None,
            }
        }
        Some(out)
    }
}

/// One additional printer column.
pub struct PrinterColumn {
    pub column: Column,
    pub path: JsonPath,
}

/// The scale subresource's paths (JSON pointers).
#[derive(Debug, Clone)]
pub struct ScalePaths {
    pub spec_replicas: String,
    pub status_replicas: String,
    pub label_selector: Option<String>,
}

/// The rules of one served version of a custom resource.
pub struct CustomRules {
    pub kind: &'static str,
    /// The CRD's name (`<plural>.<group>`).
    pub crd_name: String,
    /// Selectable fields, without their leading dot (`spec.color`).
    pub selectable: &'static [&'static str],
    /// Pointers of the selectable fields, in the same order.
    selectable_ptrs: Vec<String>,
    /// The table: Name, then the additional columns (or Age without any).
    pub columns: &'static [Column],
    pub printer_columns: Vec<PrinterColumn>,
    pub scale: Option<ScalePaths>,
    pub status: bool,
    /// The `Warning` a request for a deprecated version gets.
    pub deprecation: Option<String>,
    /// The version's `openAPIV3Schema` (or the definition's top-level one),
    /// with `metadata` as Kubernetes' ObjectMeta and `apiVersion`/`kind`.
    pub schema: Option<&'static Value>,
    /// The compiled schema: pruning, defaults and validation.
    pub compiled: Option<crate::crd_schema::Schema>,
    /// Conversion strategy `Webhook` and its settings (`spec.conversion`).
    pub conversion: Value,
    /// The served resource of the storage version.
    storage: OnceLock<&'static ResourceInfo>,
}

/// A CRD schema as published and as server-side apply reads it: `metadata`
/// is ObjectMeta, `apiVersion` and `kind` strings.
fn with_object_meta(mut s: Value) -> Value {
    if let Some(m) = s.as_object_mut() {
        let props = m.entry("properties").or_insert_with(|| json!({}));
        if let Some(p) = props.as_object_mut() {
            p.insert(
                "metadata".into(),
                json!({"$ref": "#/definitions/io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta"}),
            );
            p.entry("apiVersion")
                .or_insert_with(|| json!({"type": "string"}));
            p.entry("kind").or_insert_with(|| json!({"type": "string"}));
        }
    }
    s
}

impl CustomRules {
    /// The schema as server-side apply navigates it.
    pub fn type_ref(&self) -> Option<crate::schema::TypeRef> {
        self.schema.map(crate::schema::TypeRef::custom)
    }

    /// Fields of `obj` the schema does not specify (what pruning would
    /// drop), as `.spec.colour`: field validation's unknown fields.
    /// `metadata` is ObjectMeta's business; `x-kubernetes-preserve-unknown-fields`
    /// keeps a node's unspecified fields (its specified properties are
    /// still checked below it, as pruning does).
    pub fn unknown_fields(&self, obj: &Value) -> Vec<String> {
        if let Some(c) = &self.compiled {
            return c.unknown_fields(obj);
        }
        let mut out = Vec::new();
        if let Some(s) = self.schema {
            unknown_walk(s, obj, String::new(), true, &mut out);
        }
        out
    }

    /// The OpenAPI definition name Kubernetes gives the kind
    /// (`com.example.v1.Widget` for `example.com/v1 Widget`).
    pub fn definition_name(res: &ResourceInfo) -> String {
        let mut g: Vec<&str> = res.group.split('.').collect();
        g.reverse();
        format!("{}.{}.{}", g.join("."), res.version, res.kind)
    }

    /// The resource whose version is stored.
    pub fn storage_resource(&self) -> Option<&'static ResourceInfo> {
        self.storage.get().copied()
    }

    /// The cells of one object's table row.
    pub fn cells(&self, obj: &Value, now: DateTime<Utc>) -> Vec<Value> {
        let mut out = vec![json!(crate::table::s(obj, "/metadata/name"))];
        if self.printer_columns.is_empty() {
            out.push(json!(crate::table::age(
                obj,
                "/metadata/creationTimestamp",
                now
            )));
            return out;
        }
        for c in &self.printer_columns {
            let found = c.path.eval(obj);
            let cell = match found.first() {
                None => Value::Null,
                Some(v) => match c.column.type_ {
                    "date" => match v.as_str() {
                        Some(t) => json!(crate::table::age(&json!({ "t": t }), "/t", now)),
                        None => Value::Null,
                    },
                    "integer" => v.as_i64().map(|n| json!(n)).unwrap_or(Value::Null),
                    "number" => v.as_f64().map(|n| json!(n)).unwrap_or(Value::Null),
                    "boolean" => v.as_bool().map(|b| json!(b)).unwrap_or(Value::Null),
                    _ => match v {
                        Value::String(s) => json!(s),
                        other => json!(other.to_string()),
                    },
                },
            };
            out.push(cell);
        }
        out
    }
}

fn unknown_walk(s: &Value, v: &Value, path: String, root: bool, out: &mut Vec<String>) {
    if s.get("x-kubernetes-preserve-unknown-fields") == Some(&json!(true)) {
        return;
    }
    let embedded = root || s.get("x-kubernetes-embedded-resource") == Some(&json!(true));
    match v {
        Value::Object(m) => {
            let props = s.get("properties").and_then(Value::as_object);
            let additional = s.get("additionalProperties");
            for (k, child) in m {
                if embedded && matches!(k.as_str(), "apiVersion" | "kind" | "metadata") {
                    continue;
                }
                match (props.and_then(|p| p.get(k)), additional) {
                    (Some(ps), _) => unknown_walk(ps, child, format!("{path}.{k}"), false, out),
                    (None, Some(a @ Value::Object(_))) => {
                        unknown_walk(a, child, format!("{path}.{k}"), false, out)
                    }
                    (None, Some(Value::Bool(true))) => {}
                    (None, _) if props.is_some() || additional.is_some() => {
                        out.push(format!("{path}.{k}"))
                    }
                    // An object schema naming no fields at all: everything is unknown.
                    (None, _) => out.push(format!("{path}.{k}")),
                }
            }
        }
        Value::Array(a) => {
            if let Some(items) = s.get("items") {
                for (i, child) in a.iter().enumerate() {
                    unknown_walk(items, child, format!("{path}[{i}]"), false, out);
                }
            }
        }
        _ => {}
    }
}

impl KindRules for CustomRules {
    fn kind(&self) -> &'static str {
        self.kind
    }

    fn selectable_fields(&self) -> &'static [&'static str] {
        self.selectable
    }

    fn field_value(&self, obj: &Value, field: &str) -> Option<String> {
        let i = self.selectable.iter().position(|f| *f == field)?;
        match obj.pointer(&self.selectable_ptrs[i]) {
            Some(Value::String(s)) => Some(s.clone()),
            Some(Value::Bool(b)) => Some(b.to_string()),
            Some(Value::Number(n)) => Some(n.to_string()),
            _ => Some(String::new()),
        }
    }

    /// Kubernetes' order on every write: unknown fields pruned, then the
    /// schema's defaults.
    fn defaults(&self, obj: &mut Value) {
        if let Some(s) = &self.compiled {
            s.prune_and_default(obj);
        }
    }

    fn validate(&self, obj: &Value) -> Vec<Cause> {
        match &self.compiled {
            Some(s) => s.validate(obj, None),
            None => Vec::new(),
        }
    }

    /// On update the whole check, with `oldSelf` for transition rules and
    /// unchanged invalid values let through (ratcheting); `validate` is not
    /// called on updates of custom resources.
    fn validate_update(&self, new: &Value, old: &Value) -> Vec<Cause> {
        match &self.compiled {
            Some(s) => s.validate(new, Some(old)),
            None => Vec::new(),
        }
    }

    fn tracks_generation(&self) -> bool {
        true
    }

    fn custom(&self) -> Option<&CustomRules> {
        Some(self)
    }
}

fn leak(s: &str) -> &'static str {
    Box::leak(s.to_string().into_boxed_str())
}

fn leak_list(v: Option<&Value>) -> &'static [&'static str] {
    let items: Vec<&'static str> = v
        .and_then(Value::as_array)
        .map(|a| a.iter().filter_map(Value::as_str).map(leak).collect())
        .unwrap_or_default();
    Box::leak(items.into_boxed_slice())
}

/// What a definition's served resources are built from: a change to any of
/// it builds (and leaks) new ones.
fn intern_key(crd: &Value) -> String {
    let spec = crd.get("spec").cloned().unwrap_or(json!({}));
    let names = crd
        .pointer("/status/acceptedNames")
        .cloned()
        .unwrap_or(json!({}));
    json!({"spec": spec, "names": names}).to_string()
}

type Interned = HashMap<String, Vec<&'static ResourceInfo>>;

fn interned() -> &'static Mutex<Interned> {
    static MAP: OnceLock<Mutex<Interned>> = OnceLock::new();
    MAP.get_or_init(Default::default)
}

/// The served resources of a definition (one per served version, most
/// preferred first), built once per distinct definition. The names are the
/// accepted ones (`status.acceptedNames`), falling back to `spec.names`.
pub fn resources_of(crd: &Value) -> Vec<&'static ResourceInfo> {
    let key = intern_key(crd);
    let mut map = interned().lock().unwrap_or_else(|e| e.into_inner());
    if let Some(v) = map.get(&key) {
        return v.clone();
    }
    let built = build(crd);
    map.insert(key, built.clone());
    built
}

fn names_field<'a>(crd: &'a Value, field: &str) -> Option<&'a Value> {
    let accepted = crd
        .pointer(&format!("/status/acceptedNames/{field}"))
        .filter(|v| !v.is_null() && v.as_str() != Some(""));
    accepted.or_else(|| crd.pointer(&format!("/spec/names/{field}")))
}

fn build(crd: &Value) -> Vec<&'static ResourceInfo> {
    let s = |v: Option<&Value>| v.and_then(Value::as_str).unwrap_or("").to_string();
    let group = leak(&s(crd.pointer("/spec/group")));
    let plural = leak(&s(names_field(crd, "plural")));
    let singular = leak(&s(names_field(crd, "singular")));
    let kind = leak(&s(names_field(crd, "kind")));
    let short_names = leak_list(names_field(crd, "shortNames"));
    let categories = leak_list(names_field(crd, "categories"));
    let namespaced = crd.pointer("/spec/scope").and_then(Value::as_str) == Some("Namespaced");
    let storage = leak(&format!("{group}/{plural}"));
    let crd_name = s(crd.pointer("/metadata/name"));
    let conversion = crd
        .pointer("/spec/conversion")
        .cloned()
        .unwrap_or(json!({"strategy": "None"}));
    let top_schema = crd.pointer("/spec/validation/openAPIV3Schema").cloned();
    let mut versions: Vec<&Value> = crd
        .pointer("/spec/versions")
        .and_then(Value::as_array)
        .map(|a| a.iter().collect())
        .unwrap_or_default();
    let mut order: Vec<&str> = versions
        .iter()
        .map(|v| v.get("name").and_then(Value::as_str).unwrap_or(""))
        .collect();
    super::crd::sort_versions(&mut order);
    versions.sort_by_key(|v| {
        let n = v.get("name").and_then(Value::as_str).unwrap_or("");
        order.iter().position(|o| *o == n)
    });
    let mut rules_of = Vec::new();
    let mut out = Vec::new();
    let mut storage_idx = None;
    for v in versions {
        let version = leak(&s(v.get("name")));
        let is_storage = v.get("storage").and_then(Value::as_bool) == Some(true);
        let served = v.get("served").and_then(Value::as_bool) == Some(true);
        if !served && !is_storage {
            continue;
        }
        let status = v.pointer("/subresources/status").is_some();
        let scale = v.pointer("/subresources/scale").map(|sc| ScalePaths {
            spec_replicas: path_pointer(sc.get("specReplicasPath")),
            status_replicas: path_pointer(sc.get("statusReplicasPath")),
            label_selector: sc
                .get("labelSelectorPath")
                .and_then(Value::as_str)
                .filter(|p| !p.is_empty())
                .map(|p| path_pointer(Some(&json!(p)))),
        });
        let mut subs: Vec<&'static str> = Vec::new();
        if status {
            subs.push("status");
        }
        if scale.is_some() {
            subs.push("scale");
        }
        let fields: Vec<String> = v
            .get("selectableFields")
            .and_then(Value::as_array)
            .map(|a| {
                a.iter()
                    .filter_map(|f| f.get("jsonPath").and_then(Value::as_str))
                    .map(|p| p.trim_start_matches('.').to_string())
                    .collect()
            })
            .unwrap_or_default();
        let selectable: Vec<&'static str> = fields.iter().map(|f| leak(f)).collect();
        let selectable_ptrs = fields
            .iter()
            .map(|f| format!("/{}", f.replace('.', "/")))
            .collect();
        let mut columns = vec![crate::table::NAME];
        let mut printer_columns = Vec::new();
        if let Some(cols) = v.get("additionalPrinterColumns").and_then(Value::as_array) {
            for c in cols {
                let Ok(path) = JsonPath::parse(&s(c.get("jsonPath"))) else {
                    continue;
                };
                let column = Column {
                    name: leak(&s(c.get("name"))),
                    type_: leak(&s(c.get("type"))),
                    format: leak(&s(c.get("format"))),
                    description: leak(&s(c.get("description"))),
                    priority: c.get("priority").and_then(Value::as_i64).unwrap_or(0) as i32,
                };
                columns.push(column.clone());
                printer_columns.push(PrinterColumn { column, path });
            }
        } else {
            columns.push(crate::table::AGE);
        }
        let deprecation = (v.get("deprecated").and_then(Value::as_bool) == Some(true)).then(|| {
            v.get("deprecationWarning")
                .and_then(Value::as_str)
                .map(str::to_string)
                .unwrap_or_else(|| format!("{group}/{version} {kind} is deprecated"))
        });
        let rules: &'static CustomRules = Box::leak(Box::new(CustomRules {
            kind,
            crd_name: crd_name.clone(),
            selectable: Box::leak(selectable.into_boxed_slice()),
            selectable_ptrs,
            columns: Box::leak(columns.into_boxed_slice()),
            printer_columns,
            scale,
            status,
            deprecation,
            schema: v
                .pointer("/schema/openAPIV3Schema")
                .cloned()
                .or_else(|| top_schema.clone())
                .map(|s| &*Box::leak(Box::new(with_object_meta(s)))),
            conversion: conversion.clone(),
            compiled: v
                .pointer("/schema/openAPIV3Schema")
                .or(top_schema.as_ref())
                .and_then(|s| crate::crd_schema::Schema::compile(s, "").ok()),
            storage: OnceLock::new(),
        }));
        let info: &'static ResourceInfo = Box::leak(Box::new(ResourceInfo {
            group,
            version,
            kind,
            plural,
            singular,
            namespaced,
            short_names,
            categories,
            subresources: Box::leak(subs.into_boxed_slice()),
            storage,
            rules,
        }));
        if is_storage {
            storage_idx = Some(out.len());
        }
        rules_of.push((rules, served));
        out.push(info);
    }
    if let Some(i) = storage_idx {
        for (r, _) in &rules_of {
            let _ = r.storage.set(out[i]);
        }
    }
    // Only served versions are served; the storage version's resource stays
    // reachable through the others' rules.
    out.into_iter()
        .zip(rules_of)
        .filter(|(_, (_, served))| *served)
        .map(|(r, _)| r)
        .collect()
}

/// `.spec.replicas` → `/spec/replicas`.
fn path_pointer(v: Option<&Value>) -> String {
    let p = v.and_then(Value::as_str).unwrap_or("");
    JsonPath::parse(p)
        .ok()
        .and_then(|j| j.pointer())
        .unwrap_or_default()
}

/// Whether a definition is Established (its condition True).
pub fn is_established(crd: &Value) -> bool {
    condition_true(crd, "Established")
}

pub fn condition_true(crd: &Value, t: &str) -> bool {
    crd.pointer("/status/conditions")
        .and_then(Value::as_array)
        .map(|cs| {
            cs.iter().any(|c| {
                c.get("type").and_then(Value::as_str) == Some(t)
                    && c.get("status").and_then(Value::as_str) == Some("True")
            })
        })
        .unwrap_or(false)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn crd() -> Value {
        json!({
            "metadata": {"name": "widgets.example.com"},
            "spec": {
                "group": "example.com",
                "scope": "Namespaced",
                "names": {"plural": "widgets", "singular": "widget", "kind": "Widget", "shortNames": ["wd"]},
                "versions": [
                    {"name": "v1beta1", "served": true, "storage": false, "deprecated": true},
                    {"name": "v1", "served": true, "storage": true,
                     "subresources": {"status": {}, "scale": {"specReplicasPath": ".spec.size", "statusReplicasPath": ".status.size"}},
                     "selectableFields": [{"jsonPath": ".spec.color"}],
                     "additionalPrinterColumns": [
                        {"name": "Color", "type": "string", "jsonPath": ".spec.color"},
                        {"name": "Size", "type": "integer", "jsonPath": ".spec.size", "priority": 1}]},
                ],
            }
        })
    }

    #[test]
    fn one_resource_per_served_version_preferred_first_and_interned() {
        let rs = resources_of(&crd());
        assert_eq!(rs.len(), 2);
        assert_eq!(rs[0].version, "v1");
        assert_eq!(rs[1].version, "v1beta1");
        assert_eq!(rs[0].storage, "example.com/widgets");
        assert_eq!(rs[0].subresources, ["status", "scale"]);
        assert_eq!(rs[0].short_names, ["wd"]);
        let c = rs[1].rules.custom().unwrap();
        assert_eq!(c.storage_resource().unwrap().version, "v1");
        assert_eq!(
            c.deprecation.as_deref(),
            Some("example.com/v1beta1 Widget is deprecated")
        );
        let again = resources_of(&crd());
        assert!(
            std::ptr::eq(rs[0], again[0]),
            "the same definition leaks once"
        );
        let scale = rs[0].rules.custom().unwrap().scale.clone().unwrap();
        assert_eq!(scale.spec_replicas, "/spec/size");
    }

    #[test]
    fn printer_columns_and_selectable_fields_read_the_object() {
        let rs = resources_of(&crd());
        let c = rs[0].rules.custom().unwrap();
        let obj = json!({"metadata": {"name": "w"}, "spec": {"color": "red", "size": 3}});
        let cells = c.cells(&obj, chrono::Utc::now());
        assert_eq!(cells, vec![json!("w"), json!("red"), json!(3)]);
        assert_eq!(c.columns[2].priority, 1);
        assert_eq!(
            rs[0].rules.field_value(&obj, "spec.color").as_deref(),
            Some("red")
        );
    }

    #[test]
    fn unknown_fields_are_what_pruning_drops() {
        let c = json!({
            "metadata": {"name": "things.example.com"},
            "spec": {"group": "example.com", "scope": "Cluster",
                "names": {"plural": "things", "singular": "thing", "kind": "Thing"},
                "versions": [{"name": "v1", "served": true, "storage": true,
                    "schema": {"openAPIV3Schema": {"type": "object", "properties": {
                        "spec": {"type": "object", "properties": {
                            "a": {"type": "string"},
                            "free": {"type": "object", "x-kubernetes-preserve-unknown-fields": true},
                            "list": {"type": "array", "items": {"type": "object", "properties": {"n": {"type": "string"}}}},
                            "labels": {"type": "object", "additionalProperties": {"type": "string"}}}}}}}}]}
        });
        let rs = resources_of(&c);
        let rules = rs[0].rules.custom().unwrap();
        let obj = json!({"apiVersion": "example.com/v1", "kind": "Thing", "metadata": {"name": "t", "odd": 1},
            "spec": {"a": "x", "b": 1, "free": {"anything": [1]}, "list": [{"n": "1", "m": 2}], "labels": {"k": "v"}},
            "extra": true});
        assert_eq!(
            rules.unknown_fields(&obj),
            [".spec.b", ".spec.list[0].m", ".extra"]
        );
    }

    #[test]
    fn json_paths_of_kubectl() {
        let obj = json!({"a": {"b.c": [1, {"d": 2}, {"d": 3}]}});
        let p = JsonPath::parse(".a['b.c'][*].d").unwrap();
        assert_eq!(p.eval(&obj), vec![&json!(2), &json!(3)]);
        assert_eq!(
            JsonPath::parse("{.a['b.c'][-1].d}").unwrap().eval(&obj),
            vec![&json!(3)]
        );
        let conds = json!({"status": {"conditions": [
            {"type": "Issuing", "status": "False"}, {"type": "Ready", "status": "True"}]}});
        let p = JsonPath::parse(".status.conditions[?(@.type==\"Ready\")].status").unwrap();
        assert_eq!(p.eval(&conds), vec![&json!("True")]);
        assert!(JsonPath::parse("a.b").is_err());
        assert!(JsonPath::parse(".a[").is_err());
    }
}
