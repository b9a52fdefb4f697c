//! The OpenAPI documents kubectl reads: `/openapi/v2` (Swagger 2.0) and
//! `/openapi/v3` (an index plus one OpenAPI 3.0 document per group-version),
//! built once from [`crate::schema`], with Kubernetes' extensions
//! (`x-kubernetes-group-version-kind` on root types and operations) and the
//! `fieldValidation` parameter kubectl looks for to use server-side
//! field validation.

use std::sync::LazyLock;

use serde_json::{json, Map, Value};

use crate::resources::{Catalog, ResourceInfo, RESOURCES};
use crate::schema;

fn gvk(group: &str, version: &str, kind: &str) -> Value {
    json!({"group": group, "version": version, "kind": kind})
}

/// Definitions with `x-kubernetes-group-version-kind` added to root types.
fn definitions_with_gvk() -> Map<String, Value> {
    let mut defs = schema::definitions().clone();
    let mut tag = |name: Option<&str>, g: &str, v: &str, k: &str| {
        if let Some(d) = name
            .and_then(|n| defs.get_mut(n))
            .and_then(Value::as_object_mut)
        {
            let list = d
                .entry("x-kubernetes-group-version-kind")
                .or_insert_with(|| json!([]));
            if let Some(a) = list.as_array_mut() {
                let e = gvk(g, v, k);
                if !a.contains(&e) {
                    a.push(e);
                }
            }
        }
    };
    for r in RESOURCES {
        tag(
            schema::definition_name(r.group, r.version, r.kind),
            r.group,
            r.version,
            r.kind,
        );
    }
    for (g, v, k) in [
        ("", "v1", "Binding"),
        ("autoscaling", "v1", "Scale"),
        ("policy", "v1", "Eviction"),
    ] {
        tag(schema::definition_name(g, v, k), g, v, k);
    }
    for (g, v, k) in [
        ("meta.k8s.io", "v1", "Status"),
        ("meta.k8s.io", "v1", "DeleteOptions"),
        ("meta.k8s.io", "v1", "WatchEvent"),
    ] {
        tag(schema::definition_name(g, v, k), "", "v1", k);
    }
    defs
}

fn query(name: &str, description: &str) -> Value {
    json!({"name": name, "in": "query", "description": description, "type": "string", "uniqueItems": true})
}

fn query_v3(name: &str, description: &str) -> Value {
    json!({"name": name, "in": "query", "description": description, "schema": {"type": "string", "uniqueItems": true}})
}

fn write_params(v3: bool) -> Vec<Value> {
    let q = if v3 { query_v3 } else { query };
    vec![
        q("dryRun", "When present, indicates that modifications should not be persisted."),
        q("fieldManager", "fieldManager is a name associated with the actor or entity that is making these changes."),
        q("fieldValidation", "fieldValidation instructs the server on how to handle objects in the request containing unknown or duplicate fields. Valid values are: Ignore, Warn, Strict."),
    ]
}

fn base_path(r: &ResourceInfo) -> String {
    if r.group.is_empty() {
        format!("/api/{}", r.version)
    } else {
        format!("/apis/{}/{}", r.group, r.version)
    }
}

/// The definition of a resource's kind: a built-in type's, or the custom
/// resource's `<reversed group>.<version>.<Kind>`.
fn def_name(r: &ResourceInfo) -> Option<String> {
    match r.rules.custom() {
        Some(c) => c
            .schema
            .map(|_| crate::kinds::custom::CustomRules::definition_name(r)),
        None => schema::definition_name(r.group, r.version, r.kind).map(str::to_string),
    }
}

fn op(r: &ResourceInfo, action: &str, id: &str, params: Vec<Value>, v3: bool) -> Value {
    let reff = |name: Option<&str>| {
        let n = name.unwrap_or("io.k8s.apimachinery.pkg.apis.meta.v1.Status");
        if v3 {
            json!({"content": {"application/json": {"schema": {"$ref": format!("#/components/schemas/{n}")}}}, "description": "OK"})
        } else {
            json!({"schema": {"$ref": format!("#/definitions/{n}")}, "description": "OK"})
        }
    };
    let mut o = json!({
        "operationId": id,
        "x-kubernetes-action": action,
        "x-kubernetes-group-version-kind": gvk(r.group, r.version, r.kind),
        "parameters": params,
        "responses": {"200": reff(def_name(r).as_deref())},
    });
    if !v3 {
        o["consumes"] = json!(["*/*"]);
        o["produces"] = json!(["application/json", "application/yaml"]);
    }
    o
}

fn paths(v3: bool, filter: impl Fn(&ResourceInfo) -> bool) -> Map<String, Value> {
    paths_of(RESOURCES.iter(), v3, filter)
}

fn paths_of<'a>(
    all: impl Iterator<Item = &'a ResourceInfo>,
    v3: bool,
    filter: impl Fn(&ResourceInfo) -> bool,
) -> Map<String, Value> {
    let mut out = Map::new();
    for r in all.filter(|r| filter(r)) {
        let ns = if r.namespaced {
            "/namespaces/{namespace}"
        } else {
            ""
        };
        let coll = format!("{}{ns}/{}", base_path(r), r.plural);
        let item = format!("{coll}/{{name}}");
        let id = format!("{}{}", r.kind, r.version);
        let mut pp = write_params(v3);
        let force = if v3 {
            query_v3("force", "Force is going to \"force\" Apply requests.")
        } else {
            query("force", "Force is going to \"force\" Apply requests.")
        };
        pp.push(force);
        out.insert(
            coll,
            json!({
                "get": op(r, "list", &format!("list{id}"), vec![], v3),
                "post": op(r, "post", &format!("create{id}"), write_params(v3), v3),
                "delete": op(r, "deletecollection", &format!("deletecollection{id}"), vec![], v3),
            }),
        );
        out.insert(
            item,
            json!({
                "get": op(r, "get", &format!("read{id}"), vec![], v3),
                "put": op(r, "put", &format!("replace{id}"), write_params(v3), v3),
                "patch": op(r, "patch", &format!("patch{id}"), pp, v3),
                "delete": op(r, "delete", &format!("delete{id}"), vec![], v3),
            }),
        );
    }
    out
}

fn rewrite_refs(v: &mut Value) {
    match v {
        Value::Object(m) => {
            if let Some(Value::String(r)) = m.get_mut("$ref") {
                if let Some(rest) = r.strip_prefix("#/definitions/") {
                    *r = format!("#/components/schemas/{rest}");
                }
            }
            for child in m.values_mut() {
                rewrite_refs(child);
            }
        }
        Value::Array(a) => a.iter_mut().for_each(rewrite_refs),
        _ => {}
    }
}

/// Swagger 2.0 as kube-apiserver writes it: a property that refers to
/// another definition carries the `$ref` beside its description, where
/// OpenAPI 3 wraps it in a one-element `allOf`. kubectl's v2 reader follows
/// only the former.
fn ref_beside_description(v: &mut Value) {
    match v {
        Value::Object(m) => {
            let single_ref = match m.get("allOf").and_then(Value::as_array) {
                Some(a) if a.len() == 1 => a[0].get("$ref").cloned(),
                _ => None,
            };
            if let Some(r) = single_ref {
                m.remove("allOf");
                m.insert("$ref".into(), r);
            }
            m.values_mut().for_each(ref_beside_description);
        }
        Value::Array(a) => a.iter_mut().for_each(ref_beside_description),
        _ => {}
    }
}

static V2: LazyLock<Vec<u8>> = LazyLock::new(|| {
    let mut definitions = Value::Object(definitions_with_gvk());
    ref_beside_description(&mut definitions);
    let doc = json!({
        "swagger": "2.0",
        "info": {"title": "Kubernetes", "version": "v1.33.0"},
        "paths": paths(false, |_| true),
        "definitions": definitions,
    });
    serde_json::to_vec(&doc).unwrap_or_default()
});

static V3_SCHEMAS: LazyLock<Value> = LazyLock::new(|| {
    let mut defs = Value::Object(definitions_with_gvk());
    rewrite_refs(&mut defs);
    defs
});

fn gv_hash(group: &str, version: &str) -> String {
    let mut h: u64 = 0xcbf29ce484222325;
    for b in format!("{group}/{version}/{}", env!("CARGO_PKG_VERSION")).bytes() {
        h ^= b as u64;
        h = h.wrapping_mul(0x100000001b3);
    }
    format!("{h:016X}")
}

/// `/openapi/v2`, serialized once.
pub fn openapi_v2_bytes() -> &'static [u8] {
    &V2
}

/// `/openapi/v3` of the built-in resources.
pub fn openapi_v3_index() -> Value {
    openapi_v3_index_in(&Catalog::new())
}

/// `/openapi/v3`: where each group-version's document is.
pub fn openapi_v3_index_in(cat: &Catalog) -> Value {
    let mut paths = Map::new();
    let mut seen = Vec::new();
    for r in cat.all() {
        let (key, url) = if r.group.is_empty() {
            (
                format!("api/{}", r.version),
                format!("/openapi/v3/api/{}", r.version),
            )
        } else {
            (
                format!("apis/{}/{}", r.group, r.version),
                format!("/openapi/v3/apis/{}/{}", r.group, r.version),
            )
        };
        if seen.contains(&key) {
            continue;
        }
        seen.push(key.clone());
        paths.insert(
            key,
            json!({"serverRelativeURL": format!("{url}?hash={}", match r.rules.custom() {
                None => gv_hash(r.group, r.version),
                Some(_) => custom_hash(cat, r.group, r.version),
            })}),
        );
    }
    json!({"paths": paths})
}

/// The OpenAPI 3.0 document of one group-version.
pub fn openapi_v3_group_version(group: &str, version: &str) -> Option<Value> {
    if !RESOURCES
        .iter()
        .any(|r| r.group == group && r.version == version)
    {
        return None;
    }
    let mut p = Value::Object(paths(true, |r| r.group == group && r.version == version));
    rewrite_refs(&mut p);
    Some(json!({
        "openapi": "3.0.0",
        "info": {"title": "Kubernetes", "version": "v1.33.0"},
        "paths": p,
        "components": {"schemas": V3_SCHEMAS.clone()},
    }))
}

/// A custom group-version's hash changes with its definitions, so clients
/// caching by hash read the new document.
fn custom_hash(cat: &Catalog, group: &str, version: &str) -> String {
    let mut h: u64 = 0xcbf29ce484222325;
    for r in cat.custom().iter() {
        if r.group == group && r.version == version {
            let s = r
                .rules
                .custom()
                .and_then(|c| c.schema)
                .map(Value::to_string);
            for b in format!("{}/{}/{:?}/{:?}", r.plural, r.kind, s, r.subresources).bytes() {
                h ^= b as u64;
                h = h.wrapping_mul(0x100000001b3);
            }
        }
    }
    format!("{h:016X}")
}

/// The OpenAPI 3.0 document of one group-version, custom resources included.
pub fn openapi_v3_group_version_in(cat: &Catalog, group: &str, version: &str) -> Option<Value> {
    let custom: Vec<&'static ResourceInfo> = cat
        .custom()
        .iter()
        .copied()
        .filter(|r| r.group == group && r.version == version)
        .collect();
    if custom.is_empty() {
        return openapi_v3_group_version(group, version);
    }
    let mut p = Value::Object(paths_of(custom.iter().copied(), true, |_| true));
    rewrite_refs(&mut p);
    let mut schemas = V3_SCHEMAS.clone();
    for r in &custom {
        let Some(s) = r.rules.custom().and_then(|c| c.schema) else {
            continue;
        };
        let mut d = s.clone();
        d["x-kubernetes-group-version-kind"] = json!([gvk(r.group, r.version, r.kind)]);
        rewrite_refs(&mut d);
        schemas[crate::kinds::custom::CustomRules::definition_name(r)] = d;
    }
    Some(json!({
        "openapi": "3.0.0",
        "info": {"title": "Kubernetes", "version": "v1.33.0"},
        "paths": p,
        "components": {"schemas": schemas},
    }))
}

/// `/openapi/v2` of a server: JSON and gnostic's protobuf.
#[derive(Debug)]
pub struct V2Docs {
    pub json: Vec<u8>,
    pub protobuf: Vec<u8>,
}

/// The last document built with custom resources, and the catalog
/// snapshot it was built from (held, so its address is not reused).
type V2Cache = std::sync::Mutex<
    Option<(
        std::sync::Arc<Vec<&'static ResourceInfo>>,
        std::sync::Arc<V2Docs>,
    )>,
>;

/// `/openapi/v2` with the custom resources `cat` serves: each served
/// version's schema as Kubernetes publishes it in v2 (its structural
/// schema without what Swagger 2.0 cannot say, see [`to_v2_schema`]) under
/// `<reversed group>.<version>.<Kind>` with its
/// `x-kubernetes-group-version-kind`, the list kind beside it, and the
/// paths. Built again when the catalog changes (the next request after a
/// definition is established, changed or deleted). `None` when only the
/// built-ins are served ([`openapi_v2_bytes`] and the static protobuf).
pub fn openapi_v2_in(cat: &Catalog) -> Option<std::sync::Arc<V2Docs>> {
    static CACHE: V2Cache = std::sync::Mutex::new(None);
    let custom = cat.custom();
    if custom.is_empty() {
        return None;
    }
    if let Some((snap, docs)) = CACHE.lock().unwrap_or_else(|e| e.into_inner()).as_ref() {
        if std::sync::Arc::ptr_eq(snap, &custom) {
            return Some(docs.clone());
        }
    }
    let docs = std::sync::Arc::new(build_v2(&custom));
    *CACHE.lock().unwrap_or_else(|e| e.into_inner()) = Some((custom, docs.clone()));
    Some(docs)
}

fn build_v2(custom: &[&'static ResourceInfo]) -> V2Docs {
    let mut doc: Value = serde_json::from_slice(&V2).unwrap_or_else(|_| json!({}));
    let paths = paths_of(custom.iter().copied(), false, |_| true);
    if let Some(p) = doc["paths"].as_object_mut() {
        p.extend(paths);
    }
    if let Some(defs) = doc["definitions"].as_object_mut() {
        for r in custom {
            let Some(s) = r.rules.custom().and_then(|c| c.schema) else {
                continue;
            };
            let name = crate::kinds::custom::CustomRules::definition_name(r);
            let mut d = to_v2_schema(s);
            d["x-kubernetes-group-version-kind"] = json!([gvk(r.group, r.version, r.kind)]);
            let list_kind = r.list_kind();
            defs.insert(
                format!("{name}List"),
                json!({
                    "description": format!("{list_kind} is a list of {}", r.kind),
                    "type": "object",
                    "required": ["items"],
                    "properties": {
                        "apiVersion": {"description": "APIVersion defines the versioned schema of this representation of an object. Servers should convert recognized schemas to the latest internal value, and may reject unrecognized values. More info: https://git.k8s.io/community/contributors/devel/sig-architecture/api-conventions.md#resources", "type": "string"},
                        "items": {"description": format!("List of {}. More info: https://git.k8s.io/community/contributors/devel/sig-architecture/api-conventions.md", r.plural.to_lowercase()),
                            "type": "array", "items": {"$ref": format!("#/definitions/{name}")}},
                        "kind": {"description": "Kind is a string value representing the REST resource this object represents. Servers may infer this from the endpoint the client submits requests to. Cannot be updated. In CamelCase. More info: https://git.k8s.io/community/contributors/devel/sig-architecture/api-conventions.md#types-kinds", "type": "string"},
                        "metadata": {"description": "Standard list metadata. More info: https://git.k8s.io/community/contributors/devel/sig-architecture/api-conventions.md#types-kinds",
                            "$ref": "#/definitions/io.k8s.apimachinery.pkg.apis.meta.v1.ListMeta"},
                    },
                    "x-kubernetes-group-version-kind": [gvk(r.group, r.version, &list_kind)],
                }),
            );
            defs.insert(name, d);
        }
    }
    let json = serde_json::to_vec(&doc).unwrap_or_default();
    let protobuf = crate::openapi_pb::document(&doc);
    V2Docs { json, protobuf }
}

/// A custom resource's schema as kube-apiserver publishes it in OpenAPI
/// v2: `allOf`, `oneOf`, `anyOf` and `not` dropped; a nullable value
/// loses its type, items and properties (and is no longer required);
/// a value preserving unknown fields loses its items and properties (and
/// its type when an object); an array without items loses its type.
pub fn to_v2_schema(s: &Value) -> Value {
    let mut out = s.clone();
    v2_walk(&mut out);
    out
}

fn v2_walk(v: &mut Value) {
    let Some(m) = v.as_object_mut() else { return };
    for j in ["allOf", "oneOf", "anyOf", "not"] {
        m.remove(j);
    }
    let flag = |m: &Map<String, Value>, k: &str| m.get(k).and_then(Value::as_bool) == Some(true);
    if flag(m, "nullable") {
        m.remove("type");
        m.remove("nullable");
        m.remove("items");
        m.remove("properties");
    }
    let preserve = flag(m, "x-kubernetes-preserve-unknown-fields");
    if preserve {
        m.remove("items");
        m.remove("properties");
    }
    let ty = m
        .get("type")
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_string();
    if (ty == "array" && !m.contains_key("items")) || (preserve && ty == "object") {
        m.remove("type");
    }
    // Nullable properties are not required.
    let nullable_props: Vec<String> = m
        .get("properties")
        .and_then(Value::as_object)
        .map(|p| {
            p.iter()
                .filter(|(_, s)| s.get("nullable").and_then(Value::as_bool) == Some(true))
                .map(|(k, _)| k.clone())
                .collect()
        })
        .unwrap_or_default();
    let additional_nullable = m
        .get("additionalProperties")
        .and_then(|a| a.get("nullable"))
        .and_then(Value::as_bool)
        == Some(true);
    if additional_nullable {
        m.remove("required");
    } else if !nullable_props.is_empty() {
        if let Some(req) = m.get_mut("required").and_then(Value::as_array_mut) {
            req.retain(|r| !nullable_props.iter().any(|n| r.as_str() == Some(n)));
            if req.is_empty() {
                m.remove("required");
            }
        }
    }
    if let Some(p) = m.get_mut("properties").and_then(Value::as_object_mut) {
        p.values_mut().for_each(v2_walk);
    }
    if let Some(i) = m.get_mut("items") {
        match i {
            Value::Array(a) => a.iter_mut().for_each(v2_walk),
            other => v2_walk(other),
        }
    }
    if let Some(a) = m.get_mut("additionalProperties") {
        v2_walk(a);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn v2_schemas_drop_what_swagger_2_cannot_say() {
        let s = json!({"type": "object", "required": ["a", "n"], "properties": {
            "a": {"type": "string", "oneOf": [{"pattern": "x"}], "not": {"enum": ["y"]}},
            "n": {"type": "object", "nullable": true, "properties": {"x": {"type": "string"}}},
            "free": {"type": "object", "x-kubernetes-preserve-unknown-fields": true,
                "properties": {"k": {"type": "string"}}},
            "list": {"type": "array", "x-kubernetes-preserve-unknown-fields": true,
                "items": {"type": "string"}},
            "deep": {"type": "array", "items": {"type": "object",
                "anyOf": [{"required": ["q"]}], "properties": {"q": {"type": "integer"}}}},
        }});
        let v2 = to_v2_schema(&s);
        assert_eq!(v2["required"], json!(["a"]));
        let p = &v2["properties"];
        assert_eq!(p["a"], json!({"type": "string"}));
        assert_eq!(p["n"], json!({}));
        assert_eq!(
            p["free"],
            json!({"x-kubernetes-preserve-unknown-fields": true})
        );
        assert_eq!(
            p["list"],
            json!({"x-kubernetes-preserve-unknown-fields": true})
        );
        assert!(p["deep"]["items"].get("anyOf").is_none());
        assert_eq!(p["deep"]["items"]["properties"]["q"]["type"], "integer");
    }

    #[test]
    fn custom_resources_are_in_v2_and_leave_with_their_definition() {
        let crd = json!({"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
            "metadata": {"name": "gizmos.openapi.example.com"},
            "spec": {"group": "openapi.example.com", "scope": "Namespaced",
                "names": {"plural": "gizmos", "singular": "gizmo", "kind": "Gizmo", "listKind": "GizmoList"},
                "versions": [{"name": "v1", "served": true, "storage": true,
                    "schema": {"openAPIV3Schema": {"type": "object", "properties": {
                        "spec": {"type": "object", "properties": {"size": {"type": "integer", "nullable": true}}}}}}}]}});
        let cat = Catalog::new();
        assert!(openapi_v2_in(&cat).is_none());
        cat.set_custom(crate::kinds::custom::resources_of(&crd));
        let docs = openapi_v2_in(&cat).unwrap();
        let doc: Value = serde_json::from_slice(&docs.json).unwrap();
        let d = &doc["definitions"]["com.example.openapi.v1.Gizmo"];
        assert_eq!(
            d["x-kubernetes-group-version-kind"],
            json!([{"group": "openapi.example.com", "version": "v1", "kind": "Gizmo"}])
        );
        assert_eq!(d["properties"]["spec"]["properties"]["size"], json!({}));
        assert_eq!(
            doc["definitions"]["com.example.openapi.v1.GizmoList"]
                ["x-kubernetes-group-version-kind"][0]["kind"],
            "GizmoList"
        );
        assert!(doc["paths"]
            .get("/apis/openapi.example.com/v1/namespaces/{namespace}/gizmos/{name}")
            .is_some());
        // Built-ins are still there, and the protobuf carries the new kind.
        assert!(doc["definitions"]
            .get("io.k8s.api.apps.v1.Deployment")
            .is_some());
        let needle = b"com.example.openapi.v1.Gizmo";
        assert!(docs.protobuf.windows(needle.len()).any(|w| w == needle));
        // Cached while the catalog is unchanged; gone with the definition.
        assert!(std::sync::Arc::ptr_eq(&docs, &openapi_v2_in(&cat).unwrap()));
        cat.set_custom(Vec::new());
        assert!(openapi_v2_in(&cat).is_none());
    }

    #[test]
    fn the_apps_v1_document_describes_deployments_with_their_gvk() {
        let doc = openapi_v3_group_version("apps", "v1").unwrap();
        let d = &doc["components"]["schemas"]["io.k8s.api.apps.v1.Deployment"];
        assert_eq!(
            d["x-kubernetes-group-version-kind"][0]["kind"],
            "Deployment"
        );
        let patch =
            &doc["paths"]["/apis/apps/v1/namespaces/{namespace}/deployments/{name}"]["patch"];
        assert!(patch["parameters"]
            .as_array()
            .unwrap()
            .iter()
            .any(|p| p["name"] == "fieldValidation"));
        assert!(!serde_json::to_string(&doc)
            .unwrap()
            .contains("#/definitions/"));
    }

    #[test]
    fn every_served_kind_is_in_its_v3_document_with_its_gvk() {
        for r in RESOURCES.iter().filter(|r| !r.is_review()) {
            let doc = openapi_v3_group_version(r.group, r.version).unwrap();
            let tagged = doc["components"]["schemas"]
                .as_object()
                .unwrap()
                .values()
                .any(|d| {
                    d["x-kubernetes-group-version-kind"]
                        .as_array()
                        .into_iter()
                        .flatten()
                        .any(|g| *g == gvk(r.group, r.version, r.kind))
                });
            assert!(
                tagged,
                "{}/{} {} has no schema in OpenAPI v3",
                r.group, r.version, r.kind
            );
        }
    }

    #[test]
    fn the_index_points_at_every_group_version() {
        let idx = openapi_v3_index();
        assert!(idx["paths"]["api/v1"]["serverRelativeURL"]
            .as_str()
            .unwrap()
            .starts_with("/openapi/v3/api/v1?hash="));
        assert!(idx["paths"].get("apis/apps/v1").is_some());
        let v2: Value = serde_json::from_slice(openapi_v2_bytes()).unwrap();
        assert_eq!(v2["swagger"], "2.0");
    }
}
