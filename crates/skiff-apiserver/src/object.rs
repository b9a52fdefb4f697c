//! How objects are keyed and encoded in the store, and the few metadata
//! accessors the registry needs on hot paths.
//!
//! Objects are stored as JSON without `metadata.resourceVersion`: the store's
//! mod revision is the resourceVersion and is written into the object on read.

use bytes::Bytes;
use serde_json::{json, Map, Value};
use skiff_core::resources::ResourceInfo;
use skiff_core::ApiError;
use skiff_store::KeyValue;

/// Every object lives under this prefix.
pub const ROOT: &str = "/registry/";

/// Groups whose resources Kubernetes keeps directly under `/registry/`
/// (the built-in ones); any other group's resources are kept under
/// `/registry/<group>/<plural>/`.
const UNPREFIXED_GROUPS: &[&str] = &[
    "",
    "apps",
    "autoscaling",
    "batch",
    "coordination.k8s.io",
    "discovery.k8s.io",
    "events.k8s.io",
    "policy",
    "scheduling.k8s.io",
    "rbac.authorization.k8s.io",
    "storage.k8s.io",
    "networking.k8s.io",
    "node.k8s.io",
    "certificates.k8s.io",
    "admissionregistration.k8s.io",
    "flowcontrol.apiserver.k8s.io",
    "authentication.k8s.io",
    "authorization.k8s.io",
];

/// Where Kubernetes keeps a storage's objects under `/registry/` (as
/// kube-apiserver lays out etcd): mostly the plural, with its historical
/// names for services, endpoints, nodes and replication controllers, and
/// the group in front for groups that are not built in.
fn storage_path(storage: &str) -> String {
    let (group, plural) = storage.split_once('/').unwrap_or(("", storage));
    match (group, plural) {
        ("", "services") => "services/specs".into(),
        ("", "endpoints") => "services/endpoints".into(),
        ("", "nodes") => "minions".into(),
        ("", "replicationcontrollers") => "controllers".into(),
        ("networking.k8s.io", "ingresses") => "ingress".into(),
        (g, p) if UNPREFIXED_GROUPS.contains(&g) => p.to_string(),
        (g, p) => format!("{g}/{p}"),
    }
}

/// Every served storage by its path under `/registry/`.
fn storages_by_path() -> &'static std::collections::HashMap<String, &'static str> {
    static MAP: std::sync::OnceLock<std::collections::HashMap<String, &'static str>> =
        std::sync::OnceLock::new();
    MAP.get_or_init(|| {
        skiff_core::resources::RESOURCES
            .iter()
            .map(|r| (storage_path(r.storage), r.storage))
            .collect()
    })
}

/// `/registry/<path>/` — the prefix of one resource's objects (e.g.
/// `/registry/pods/`, `/registry/services/specs/`, `/registry/deployments/`).
pub fn resource_prefix(res: &ResourceInfo) -> String {
    format!("{ROOT}{}/", storage_path(res.storage))
}

/// The prefix of one namespace's objects of a resource (or all, for `None`).
pub fn list_prefix(res: &ResourceInfo, namespace: Option<&str>) -> String {
    match (res.namespaced, namespace) {
        (true, Some(ns)) => format!("{}{ns}/", resource_prefix(res)),
        _ => resource_prefix(res),
    }
}

/// The key of one object.
pub fn object_key(res: &ResourceInfo, namespace: Option<&str>, name: &str) -> String {
    match (res.namespaced, namespace) {
        (true, Some(ns)) => format!("{}{ns}/{name}", resource_prefix(res)),
        _ => format!("{}{name}", resource_prefix(res)),
    }
}

/// The storage id (`<group>/<plural>`, as in `ResourceInfo::storage`) of a key.
pub fn storage_of_key(key: &str) -> Option<String> {
    let rest = key.strip_prefix(ROOT)?;
    let map = storages_by_path();
    let mut cut = rest.match_indices('/').map(|(i, _)| i);
    let first = cut.next()?;
    // Two segments (`services/specs`, `<group>/<plural>`) before one.
    if let Some(second) = cut.next() {
        if let Some(s) = map.get(&rest[..second]) {
            return Some(s.to_string());
        }
        if let Some(s) = map.get(&rest[..first]) {
            return Some(s.to_string());
        }
        // Custom resources: `/registry/<group with a dot>/<plural>/…`.
        if rest[..first].contains('.') {
            return Some(rest[..second].to_string());
        }
        return None;
    }
    map.get(&rest[..first]).map(|s| s.to_string())
}

/// Where skiff's first key layout (`/registry/<group|core>/<plural>/…`)
/// kept a storage's objects, when that differs from today's.
pub fn legacy_prefix(storage: &str) -> Option<String> {
    let (group, plural) = storage.split_once('/').unwrap_or(("", storage));
    let old = format!(
        "{ROOT}{}/{plural}/",
        if group.is_empty() { "core" } else { group }
    );
    let new = format!("{ROOT}{}/", storage_path(storage));
    (old != new).then_some(old)
}

/// Serializes an object for the store (without its resourceVersion), with
/// `apiVersion`, `kind` and `metadata` first so that
/// [`with_resource_version`] can find `metadata` without parsing.
pub fn encode(obj: &Value) -> Result<Bytes, ApiError> {
    encode_marked(obj).map(|(b, _)| b)
}

/// [`encode`], and, when those bytes are exactly what `serde_json` writes
/// for `obj` (its fields already in the order `encode` puts them, no
/// `resourceVersion` or `selfLink` in its `metadata`), the offset of the
/// metadata's closing brace: [`answer_with_resource_version`] then gives the
/// bytes of `obj` after [`set_resource_version`] without serializing it again.
pub fn encode_marked(obj: &Value) -> Result<(Bytes, Option<usize>), ApiError> {
    let err = |e: serde_json::Error| ApiError::internal(format!("encoding object: {e}"));
    let Some(map) = obj.as_object() else {
        return serde_json::to_vec(obj)
            .map(|b| (Bytes::from(b), None))
            .map_err(err);
    };
    let mut meta_close = None;
    let mut out = Vec::with_capacity(512);
    out.push(b'{');
    let mut first = true;
    for k in ["apiVersion", "kind"] {
        if let Some(v) = map.get(k) {
            put_field(&mut out, &mut first, k, v).map_err(err)?;
        }
    }
    if let Some(meta) = map.get("metadata") {
        match meta.as_object() {
            Some(m) if m.contains_key("resourceVersion") || m.contains_key("selfLink") => {
                // The bytes of the map without those two keys, written
                // without copying it (managedFields make it large).
                if !first {
                    out.push(b',');
                }
                first = false;
                out.extend_from_slice(b"\"metadata\":{");
                let mut first_field = true;
                for (k, v) in m {
                    if !matches!(k.as_str(), "resourceVersion" | "selfLink") {
                        put_field(&mut out, &mut first_field, k, v).map_err(err)?;
                    }
                }
                out.push(b'}');
            }
            _ => {
                put_field(&mut out, &mut first, "metadata", meta).map_err(err)?;
                if meta.is_object() {
                    meta_close = Some(out.len() - 1);
                }
            }
        }
    }
    // Only when the map's own order starts as encode writes it.
    if meta_close.is_some() {
        let lead = ["apiVersion", "kind", "metadata"]
            .into_iter()
            .filter(|k| map.contains_key(*k));
        if !map
            .keys()
            .map(String::as_str)
            .zip(lead)
            .all(|(a, b)| a == b)
        {
            meta_close = None;
        }
    }
    for (k, v) in map {
        if !matches!(k.as_str(), "apiVersion" | "kind" | "metadata") {
            put_field(&mut out, &mut first, k, v).map_err(err)?;
        }
    }
    out.push(b'}');
    if out.len() > MAX_OBJECT {
        return Err(ApiError::too_large(format!(
            "Request entity too large: the object is {} bytes, more than the store's limit of {MAX_OBJECT} bytes",
            out.len()
        )));
    }
    Ok((Bytes::from(out), meta_close))
}

/// The bytes `serde_json` writes for an object that [`encode_marked`]
/// encoded as `stored` (its metadata closing at `close`) once
/// [`set_resource_version`] added `rev`, last in its metadata.
pub fn answer_with_resource_version(stored: &[u8], close: usize, rev: i64) -> Bytes {
    let rv = format!("\"resourceVersion\":\"{rev}\"");
    let mut out = Vec::with_capacity(stored.len() + rv.len() + 1);
    out.extend_from_slice(&stored[..close]);
    if stored[close - 1] != b'{' {
        out.push(b',');
    }
    out.extend_from_slice(rv.as_bytes());
    out.extend_from_slice(&stored[close..]);
    Bytes::from(out)
}

/// The largest object the store keeps: etcd's default request limit
/// (1.5 MiB), which every backend enforces alike.
pub const MAX_OBJECT: usize = 1536 * 1024;

/// Writes `"k":v` into a JSON object being written (a comma before all but
/// the first field).
fn put_field(
    out: &mut Vec<u8>,
    first: &mut bool,
    k: &str,
    v: &Value,
) -> Result<(), serde_json::Error> {
    if !*first {
        out.push(b',');
    }
    *first = false;
    serde_json::to_writer(&mut *out, k)?;
    out.push(b':');
    serde_json::to_writer(&mut *out, v)
}

/// Stored bytes with `metadata.resourceVersion` set, without parsing them:
/// `None` unless they start as [`encode`] writes them.
pub fn with_resource_version(stored: &[u8], rev: i64) -> Option<Vec<u8>> {
    const META: &[u8] = b"\"metadata\":{";
    let at = stored.windows(META.len()).position(|w| w == META)?;
    // Only apiVersion and kind (strings) may come before metadata.
    if stored.first() != Some(&b'{')
        || stored[..at]
            .iter()
            .filter(|b| **b == b'{' || **b == b'[')
            .count()
            != 1
    {
        return None;
    }
    let insert_at = at + META.len();
    let rv = format!("\"resourceVersion\":\"{rev}\"");
    let mut out = Vec::with_capacity(stored.len() + rv.len() + 1);
    out.extend_from_slice(&stored[..insert_at]);
    out.extend_from_slice(rv.as_bytes());
    if stored.get(insert_at) != Some(&b'}') {
        out.push(b',');
    }
    out.extend_from_slice(&stored[insert_at..]);
    Some(out)
}

/// What [`decode`] returns for the bytes [`encode`] wrote of `obj` at
/// revision `rev`, without serializing and parsing it again: `apiVersion`,
/// `kind` and `metadata` first, no `selfLink`, the resourceVersion last in
/// `metadata`.
pub fn into_stored(obj: Value, rev: i64) -> Value {
    let Value::Object(mut map) = obj else {
        return obj;
    };
    let mut out = Map::with_capacity(map.len());
    for k in ["apiVersion", "kind", "metadata"] {
        if let Some(v) = map.shift_remove(k) {
            out.insert(k.to_string(), v);
        }
    }
    if let Some(Value::Object(m)) = out.get_mut("metadata") {
        m.shift_remove("resourceVersion");
        m.shift_remove("selfLink");
    }
    out.extend(map);
    let mut v = Value::Object(out);
    set_resource_version(&mut v, rev);
    v
}

/// Decodes a stored object and sets its resourceVersion.
pub fn decode(kv: &KeyValue) -> Result<Value, ApiError> {
    let mut obj: Value = serde_json::from_slice(&kv.value)
        .map_err(|e| ApiError::internal(format!("decoding stored object {}: {e}", kv.key)))?;
    set_resource_version(&mut obj, kv.mod_revision);
    Ok(obj)
}

pub fn set_resource_version(obj: &mut Value, rev: i64) {
    metadata_mut(obj).insert("resourceVersion".into(), Value::String(rev.to_string()));
}

/// `metadata` as a map, created if missing or not an object.
pub fn metadata_mut(obj: &mut Value) -> &mut Map<String, Value> {
    if !obj.is_object() {
        *obj = Value::Object(Map::new());
    }
    let m = obj.as_object_mut().expect("object");
    if !m.get("metadata").map(Value::is_object).unwrap_or(false) {
        m.insert("metadata".into(), Value::Object(Map::new()));
    }
    m.get_mut("metadata")
        .and_then(Value::as_object_mut)
        .expect("metadata object")
}

/// A string field of `metadata` ("" when absent).
pub fn meta_str<'a>(obj: &'a Value, field: &str) -> &'a str {
    obj.get("metadata")
        .and_then(|m| m.get(field))
        .and_then(Value::as_str)
        .unwrap_or("")
}

/// `metadata.labels` (empty when absent).
pub fn labels(obj: &Value) -> Map<String, Value> {
    obj.get("metadata")
        .and_then(|m| m.get("labels"))
        .and_then(Value::as_object)
        .cloned()
        .unwrap_or_default()
}

/// `metadata.finalizers` (empty when absent).
pub fn finalizers(obj: &Value) -> Vec<String> {
    obj.get("metadata")
        .and_then(|m| m.get("finalizers"))
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(|v| v.as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default()
}

/// Now, as Kubernetes writes timestamps (RFC 3339, seconds, UTC).
pub fn now_rfc3339() -> String {
    chrono::Utc::now().format("%Y-%m-%dT%H:%M:%SZ").to_string()
}

/// A time `secs` seconds from now, in the same format.
pub fn rfc3339_in(secs: i64) -> String {
    (chrono::Utc::now() + chrono::Duration::seconds(secs))
        .format("%Y-%m-%dT%H:%M:%SZ")
        .to_string()
}

/// Sets or updates a condition of `status.conditions`.
pub fn set_condition(
    obj: &mut Value,
    ty: &str,
    status: &str,
    reason: Option<&str>,
    message: Option<&str>,
) {
    if !obj.get("status").map(Value::is_object).unwrap_or(false) {
        obj["status"] = json!({});
    }
    let now = now_rfc3339();
    let conds = obj["status"]
        .as_object_mut()
        .expect("status object")
        .entry("conditions")
        .or_insert_with(|| json!([]));
    if !conds.is_array() {
        *conds = json!([]);
    }
    let arr = conds.as_array_mut().expect("array");
    let mut cond =
        json!({"type": ty, "status": status, "lastProbeTime": null, "lastTransitionTime": now});
    if let Some(r) = reason {
        cond["reason"] = json!(r);
    }
    if let Some(m) = message {
        cond["message"] = json!(m);
    }
    match arr
        .iter_mut()
        .find(|c| c.get("type").and_then(Value::as_str) == Some(ty))
    {
        Some(existing) => {
            if existing.get("status").and_then(Value::as_str) == Some(status) {
                cond["lastTransitionTime"] = existing
                    .get("lastTransitionTime")
                    .cloned()
                    .unwrap_or(json!(now));
            }
            *existing = cond;
        }
        None => arr.push(cond),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use skiff_core::resources::lookup;

    #[test]
    fn the_resource_version_is_spliced_into_stored_bytes() {
        let obj = serde_json::json!({"data": {"metadata": {"x": 1}}, "metadata": {"name": "a", "resourceVersion": "9"}, "kind": "ConfigMap", "apiVersion": "v1"});
        let stored = encode(&obj).unwrap();
        let with = with_resource_version(&stored, 42).unwrap();
        let v: Value = serde_json::from_slice(&with).unwrap();
        assert_eq!(v["metadata"]["resourceVersion"], "42");
        assert_eq!(v["metadata"]["name"], "a");
        assert_eq!(v["data"]["metadata"]["x"], 1);
        let empty = encode(&serde_json::json!({"metadata": {}})).unwrap();
        let v: Value = serde_json::from_slice(&with_resource_version(&empty, 1).unwrap()).unwrap();
        assert_eq!(v["metadata"]["resourceVersion"], "1");
        // Bytes written some other way are not touched.
        assert!(with_resource_version(br#"{"data":{"metadata":{}},"metadata":{}}"#, 1).is_none());
    }

    #[test]
    fn an_object_as_stored_is_what_decoding_its_stored_bytes_gives() {
        for obj in [
            serde_json::json!({"spec": {"a": [1, 2.5, "x"]}, "metadata": {"selfLink": "/x", "name": "a", "resourceVersion": "9", "labels": {"k": "v"}}, "kind": "ConfigMap", "apiVersion": "v1", "data": {"metadata": {"resourceVersion": "1"}}}),
            serde_json::json!({"kind": "Pod", "metadata": {"name": "b"}}),
            serde_json::json!({"data": {}}),
        ] {
            let kv = KeyValue {
                key: "/registry/core/configmaps/ns/a".into(),
                value: encode(&obj).unwrap(),
                create_revision: 3,
                mod_revision: 7,
            };
            let decoded = decode(&kv).unwrap();
            let stored = into_stored(obj, 7);
            assert_eq!(stored, decoded);
            // The same order of keys, too.
            assert_eq!(
                serde_json::to_string(&stored).unwrap(),
                serde_json::to_string(&decoded).unwrap()
            );
        }
    }

    #[test]
    fn keys_are_laid_out_as_kubernetes_lays_out_etcd() {
        let pods = lookup("", "v1", "pods").unwrap();
        assert_eq!(object_key(pods, Some("ns1"), "p"), "/registry/pods/ns1/p");
        assert_eq!(list_prefix(pods, None), "/registry/pods/");
        let deploy = lookup("apps", "v1", "deployments").unwrap();
        assert_eq!(
            object_key(deploy, Some("a"), "d"),
            "/registry/deployments/a/d"
        );
        assert_eq!(
            storage_of_key("/registry/deployments/a/d").unwrap(),
            "apps/deployments"
        );
        let nodes = lookup("", "v1", "nodes").unwrap();
        assert_eq!(nodes.storage, "/nodes");
        assert_eq!(object_key(nodes, None, "n1"), "/registry/minions/n1");
        assert_eq!(storage_of_key("/registry/minions/n1").unwrap(), "/nodes");
        let svc = lookup("", "v1", "services").unwrap();
        assert_eq!(
            object_key(svc, Some("default"), "kubernetes"),
            "/registry/services/specs/default/kubernetes"
        );
        let eps = lookup("", "v1", "endpoints").unwrap();
        assert_eq!(
            storage_of_key(&object_key(eps, Some("specs"), "x")).unwrap(),
            "/endpoints"
        );
        assert_eq!(
            storage_of_key("/registry/services/specs/specs/x").unwrap(),
            "/services"
        );
        // Both event versions share one storage.
        let ev = lookup("events.k8s.io", "v1", "events").unwrap();
        assert_eq!(object_key(ev, Some("n"), "e"), "/registry/events/n/e");
        // Every served resource's keys map back to its storage, and no two
        // storages share a prefix.
        let mut prefixes = std::collections::HashSet::new();
        for r in skiff_core::resources::RESOURCES {
            let key = object_key(r, Some("ns"), "name");
            assert_eq!(storage_of_key(&key).as_deref(), Some(r.storage), "{key}");
            prefixes.insert((resource_prefix(r), r.storage));
        }
        let distinct: std::collections::HashSet<_> = prefixes.iter().map(|(p, _)| p).collect();
        assert_eq!(distinct.len(), prefixes.len());
        // The first layout's prefixes, for moving old data.
        assert_eq!(
            legacy_prefix("apps/deployments").unwrap(),
            "/registry/apps/deployments/"
        );
        assert_eq!(legacy_prefix("/pods").unwrap(), "/registry/core/pods/");
        assert_eq!(legacy_prefix("example.com/widgets"), None);
    }

    /// The create answer spliced from the stored bytes is byte for byte
    /// what serializing the created object gives.
    #[test]
    fn answers_spliced_from_stored_bytes_are_the_serialized_object() {
        let pod = serde_json::json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "p", "namespace": "d", "uid": "u", "labels": {"a": "\"q\\u00e9"},
                "managedFields": [{"manager": "m", "fieldsV1": {"f:spec": {}}}]},
            "spec": {"containers": [{"name": "c", "image": "i"}]}, "status": {}});
        let cases = [
            pod,
            serde_json::json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {}}),
            serde_json::json!({"kind": "Namespace", "metadata": {"name": "n"}, "spec": 1}),
            serde_json::json!({"metadata": {"name": "n"}}),
        ];
        for obj in cases {
            let (stored, close) = encode_marked(&obj).unwrap();
            assert_eq!(stored, encode(&obj).unwrap());
            let close = close.expect("in encode's order");
            let mut created = obj.clone();
            set_resource_version(&mut created, 42);
            assert_eq!(
                answer_with_resource_version(&stored, close, 42),
                serde_json::to_vec(&created).unwrap(),
                "{obj}"
            );
        }
        // Fields in another order, or a metadata that already has a
        // resourceVersion or is not an object: no splice.
        for obj in [
            serde_json::json!({"metadata": {"name": "n"}, "apiVersion": "v1"}),
            serde_json::json!({"apiVersion": "v1", "spec": {}, "metadata": {"name": "n"}}),
            serde_json::json!({"kind": "K", "apiVersion": "v1", "metadata": {}}),
            serde_json::json!({"apiVersion": "v1", "metadata": {"resourceVersion": "1"}}),
            serde_json::json!({"apiVersion": "v1", "metadata": 1}),
            serde_json::json!({"apiVersion": "v1"}),
        ] {
            assert_eq!(encode_marked(&obj).unwrap().1, None, "{obj}");
        }
    }
}
