//! `/openapi/v2` as protobuf: the `openapi.v2.Document` message of Google's
//! gnostic, which client-go asks for
//! (`application/com.github.proto-openapi.spec.v2@v1.0+protobuf`) and
//! kubectl uses for client-side validation and `explain` of group-versions
//! missing from OpenAPI v3.
//!
//! The document carries `swagger`, `info` and every definition with its
//! vendor extensions (`x-kubernetes-group-version-kind`, the patch
//! strategies and list types); paths are left out, as nothing on the
//! client reads them from v2. Vendor extension values, defaults, enums and
//! examples travel in gnostic's `Any.yaml` as JSON text, which is YAML.

use std::sync::LazyLock;

use serde_json::{Map, Value};

/// A protobuf message being written: fields in order, zero values left out
/// as proto3 does.
#[derive(Default)]
struct Msg(Vec<u8>);

impl Msg {
    fn varint(&mut self, mut v: u64) {
        while v >= 0x80 {
            self.0.push((v as u8) | 0x80);
            v >>= 7;
        }
        self.0.push(v as u8);
    }

    fn key(&mut self, field: u64, wire: u64) {
        self.varint(field << 3 | wire);
    }

    fn bytes(&mut self, field: u64, b: &[u8]) {
        self.key(field, 2);
        self.varint(b.len() as u64);
        self.0.extend_from_slice(b);
    }

    fn string(&mut self, field: u64, s: &str) {
        if !s.is_empty() {
            self.bytes(field, s.as_bytes());
        }
    }

    fn message(&mut self, field: u64, m: Msg) {
        self.bytes(field, &m.0);
    }

    fn boolean(&mut self, field: u64, b: bool) {
        if b {
            self.key(field, 0);
            self.varint(1);
        }
    }

    fn int64(&mut self, field: u64, v: i64) {
        if v != 0 {
            self.key(field, 0);
            self.varint(v as u64);
        }
    }

    fn double(&mut self, field: u64, v: f64) {
        if v != 0.0 {
            self.key(field, 1);
            self.0.extend_from_slice(&v.to_le_bytes());
        }
    }
}

/// gnostic's `Any`: the value as YAML text (field 2).
fn any(v: &Value) -> Msg {
    let mut m = Msg::default();
    m.string(2, &v.to_string());
    m
}

/// `NamedAny` (name 1, value 2).
fn named_any(name: &str, v: &Value) -> Msg {
    let mut m = Msg::default();
    m.string(1, name);
    m.message(2, any(v));
    m
}

/// `NamedSchema` (name 1, value 2).
fn named_schema(name: &str, s: &Value) -> Msg {
    let mut m = Msg::default();
    m.string(1, name);
    m.message(2, schema(s));
    m
}

fn str_of<'a>(o: &'a Map<String, Value>, k: &str) -> &'a str {
    o.get(k).and_then(Value::as_str).unwrap_or("")
}

/// gnostic's `Schema` message from a Swagger 2.0 schema object.
fn schema(v: &Value) -> Msg {
    let mut m = Msg::default();
    let Some(o) = v.as_object() else {
        return m;
    };
    m.string(1, str_of(o, "$ref"));
    m.string(2, str_of(o, "format"));
    m.string(3, str_of(o, "title"));
    m.string(4, str_of(o, "description"));
    if let Some(d) = o.get("default") {
        m.message(5, any(d));
    }
    let f = |k: &str| o.get(k).and_then(Value::as_f64).unwrap_or(0.0);
    let i = |k: &str| o.get(k).and_then(Value::as_i64).unwrap_or(0);
    let b = |k: &str| o.get(k).and_then(Value::as_bool).unwrap_or(false);
    m.double(6, f("multipleOf"));
    m.double(7, f("maximum"));
    m.boolean(8, b("exclusiveMaximum"));
    m.double(9, f("minimum"));
    m.boolean(10, b("exclusiveMinimum"));
    m.int64(11, i("maxLength"));
    m.int64(12, i("minLength"));
    m.string(13, str_of(o, "pattern"));
    m.int64(14, i("maxItems"));
    m.int64(15, i("minItems"));
    m.boolean(16, b("uniqueItems"));
    m.int64(17, i("maxProperties"));
    m.int64(18, i("minProperties"));
    for r in o
        .get("required")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        m.string(19, r.as_str().unwrap_or(""));
    }
    for e in o
        .get("enum")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        m.message(20, any(e));
    }
    match o.get("additionalProperties") {
        Some(Value::Bool(flag)) => {
            let mut item = Msg::default();
            // A oneof: the boolean is written even when false.
            item.key(2, 0);
            item.varint(*flag as u64);
            m.message(21, item);
        }
        Some(s @ Value::Object(_)) => {
            let mut item = Msg::default();
            item.message(1, schema(s));
            m.message(21, item);
        }
        _ => {}
    }
    let types: Vec<&str> = match o.get("type") {
        Some(Value::String(t)) => vec![t.as_str()],
        Some(Value::Array(a)) => a.iter().filter_map(Value::as_str).collect(),
        _ => Vec::new(),
    };
    if !types.is_empty() {
        let mut t = Msg::default();
        for ty in types {
            t.string(1, ty);
        }
        m.message(22, t);
    }
    let items: Vec<&Value> = match o.get("items") {
        Some(Value::Array(a)) => a.iter().collect(),
        Some(s @ Value::Object(_)) => vec![s],
        _ => Vec::new(),
    };
    if !items.is_empty() {
        let mut it = Msg::default();
        for s in items {
            it.message(1, schema(s));
        }
        m.message(23, it);
    }
    for s in o
        .get("allOf")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        m.message(24, schema(s));
    }
    if let Some(props) = o.get("properties").and_then(Value::as_object) {
        let mut p = Msg::default();
        for (name, s) in props {
            p.message(1, named_schema(name, s));
        }
        m.message(25, p);
    }
    m.string(26, str_of(o, "discriminator"));
    m.boolean(27, b("readOnly"));
    if let Some(e) = o.get("example") {
        m.message(30, any(e));
    }
    for (k, v) in o.iter().filter(|(k, _)| k.starts_with("x-")) {
        m.message(31, named_any(k, v));
    }
    m
}

/// The `Document` message of a Swagger 2.0 document.
pub fn document(doc: &Value) -> Vec<u8> {
    let mut d = Msg::default();
    d.string(1, doc["swagger"].as_str().unwrap_or("2.0"));
    let mut info = Msg::default();
    info.string(1, doc["info"]["title"].as_str().unwrap_or(""));
    info.string(2, doc["info"]["version"].as_str().unwrap_or(""));
    d.message(2, info);
    if let Some(defs) = doc["definitions"].as_object() {
        let mut ds = Msg::default();
        for (name, s) in defs {
            ds.message(1, named_schema(name, s));
        }
        d.message(9, ds);
    }
    d.0
}

static V2_PROTOBUF: LazyLock<Vec<u8>> = LazyLock::new(|| {
    let doc: Value = serde_json::from_slice(crate::openapi::openapi_v2_bytes()).unwrap_or_default();
    document(&doc)
});

/// `/openapi/v2` as gnostic's protobuf `Document`, encoded once.
pub fn openapi_v2_protobuf() -> &'static [u8] {
    &V2_PROTOBUF
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A minimal protobuf reader for the test: (field, wire, payload).
    fn fields(mut b: &[u8]) -> Vec<(u64, u64, Vec<u8>)> {
        fn varint(b: &mut &[u8]) -> u64 {
            let mut v = 0u64;
            let mut shift = 0;
            loop {
                let byte = b[0];
                *b = &b[1..];
                v |= ((byte & 0x7f) as u64) << shift;
                if byte < 0x80 {
                    return v;
                }
                shift += 7;
            }
        }
        let mut out = Vec::new();
        while !b.is_empty() {
            let key = varint(&mut b);
            let (field, wire) = (key >> 3, key & 7);
            let payload = match wire {
                0 => varint(&mut b).to_le_bytes().to_vec(),
                1 => {
                    let p = b[..8].to_vec();
                    b = &b[8..];
                    p
                }
                2 => {
                    let n = varint(&mut b) as usize;
                    let p = b[..n].to_vec();
                    b = &b[n..];
                    p
                }
                w => panic!("wire type {w}"),
            };
            out.push((field, wire, payload));
        }
        out
    }

    fn field(b: &[u8], n: u64) -> Vec<Vec<u8>> {
        fields(b)
            .into_iter()
            .filter(|(f, _, _)| *f == n)
            .map(|(_, _, p)| p)
            .collect()
    }

    #[test]
    fn the_document_holds_every_definition_with_its_extensions() {
        let doc = openapi_v2_protobuf();
        assert_eq!(field(doc, 1), [b"2.0".to_vec()]);
        let defs = &field(doc, 9)[0];
        let named = field(defs, 1);
        let json: Value = serde_json::from_slice(crate::openapi::openapi_v2_bytes()).unwrap();
        assert_eq!(named.len(), json["definitions"].as_object().unwrap().len());
        let deployment = named
            .iter()
            .find(|n| field(n, 1)[0] == b"io.k8s.api.apps.v1.Deployment")
            .expect("Deployment is defined");
        let schema = &field(deployment, 2)[0];
        // type: object
        assert_eq!(field(&field(schema, 22)[0], 1), [b"object".to_vec()]);
        // properties include spec, with a $ref
        let props = field(&field(schema, 25)[0], 1);
        let spec = props
            .iter()
            .find(|p| field(p, 1)[0] == b"spec")
            .expect("spec");
        // (a `$ref`, or one inside `allOf` when the property has its own
        // description)
        let spec = &field(spec, 2)[0];
        let refs: Vec<Vec<u8>> = field(spec, 1)
            .into_iter()
            .chain(field(spec, 24).iter().flat_map(|s| field(s, 1)))
            .collect();
        assert_eq!(
            refs,
            [b"#/definitions/io.k8s.api.apps.v1.DeploymentSpec".to_vec()]
        );
        // the group-version-kind extension, as YAML (JSON) text
        let ext = field(schema, 31)
            .into_iter()
            .find(|e| field(e, 1)[0] == b"x-kubernetes-group-version-kind")
            .expect("gvk extension");
        let yaml = &field(&field(&ext, 2)[0], 2)[0];
        let v: Value = serde_json::from_slice(yaml).unwrap();
        assert_eq!(v[0]["kind"], "Deployment");
        assert_eq!(v[0]["group"], "apps");
    }

    #[test]
    fn additional_properties_false_is_written() {
        let s = schema(&serde_json::json!({"additionalProperties": false}));
        let item = &field(&s.0, 21)[0];
        assert_eq!(fields(item), [(2, 0, 0u64.to_le_bytes().to_vec())]);
    }
}
