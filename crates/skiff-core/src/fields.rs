//! Which field selectors each kind supports, an object's value for each, and
//! a parse of stored objects that keeps only what selectors look at.

use std::borrow::Cow;
use std::fmt;

use serde::de::{DeserializeSeed, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde::Deserialize;
use serde_json::{Map, Value};

use crate::resources::ResourceInfo;
use crate::ApiError;

/// The per-kind fields (beyond `metadata.name` and `metadata.namespace`) that
/// field selectors may use: the kind's rules say.
pub fn index_fields(res: &ResourceInfo) -> &'static [&'static str] {
    res.rules.selectable_fields()
}

pub(crate) fn scalar(v: Option<&Value>) -> Option<String> {
    match v? {
        Value::String(s) => Some(s.clone()),
        Value::Bool(b) => Some(b.to_string()),
        Value::Number(n) => Some(n.to_string()),
        _ => None,
    }
}

/// The value of `field` for `obj` as field selectors compare it.
pub fn field_value(res: &ResourceInfo, obj: &Value, field: &str) -> Option<String> {
    let ptr = format!("/{}", field.replace('.', "/"));
    match field {
        "metadata.name" | "metadata.namespace" => scalar(obj.pointer(&ptr)).or(Some(String::new())),
        "spec.hostNetwork" | "spec.unschedulable" => {
            Some(scalar(obj.pointer(&ptr)).unwrap_or_else(|| "false".into()))
        }
        "status.replicas" | "status.successful" => {
            Some(scalar(obj.pointer(&ptr)).unwrap_or_else(|| "0".into()))
        }
        _ if index_fields(res).contains(&field) => res
            .rules
            .field_value(obj, field)
            .or_else(|| Some(scalar(obj.pointer(&ptr)).unwrap_or_default())),
        _ => None,
    }
}

/// The parts of a stored object that selectors read: a tree of field names.
/// A node marked `whole` keeps everything under it.
#[derive(Debug, Default)]
pub struct SelectorView {
    whole: bool,
    children: Vec<(&'static str, SelectorView)>,
}

impl SelectorView {
    /// What label and field selectors on `res` read: name, namespace,
    /// labels and the kind's indexed fields.
    pub fn of(res: &ResourceInfo) -> SelectorView {
        let mut view = SelectorView::default();
        let common = ["metadata.name", "metadata.namespace", "metadata.labels"];
        for path in common.iter().chain(index_fields(res)) {
            view.keep(path.split('.'));
        }
        view
    }

    fn keep(&mut self, mut path: impl Iterator<Item = &'static str>) {
        if self.whole {
            return;
        }
        let Some(name) = path.next() else {
            self.whole = true;
            self.children.clear();
            return;
        };
        let i = match self.children.iter().position(|(n, _)| *n == name) {
            Some(i) => i,
            None => {
                self.children.push((name, SelectorView::default()));
                self.children.len() - 1
            }
        };
        self.children[i].1.keep(path);
    }

    fn child(&self, name: &str) -> Option<&SelectorView> {
        self.children
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, v)| v)
    }

    /// Parses `json` keeping only this view's fields. The whole document is
    /// still checked to be JSON; the rest is skipped without being built
    /// (managed fields, the pod spec, …), which is most of a parse's cost.
    pub fn parse(&self, json: &[u8]) -> serde_json::Result<Value> {
        let mut de = serde_json::Deserializer::from_slice(json);
        let v = self.deserialize(&mut de)?;
        de.end()?;
        Ok(v)
    }
}

impl<'de> DeserializeSeed<'de> for &SelectorView {
    type Value = Value;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Value, D::Error> {
        if self.whole {
            Value::deserialize(d)
        } else {
            d.deserialize_any(self)
        }
    }
}

/// A map key, borrowed from the input when it has no escapes.
pub(crate) struct Key<'de>(pub(crate) Cow<'de, str>);

impl<'de> Deserialize<'de> for Key<'de> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Key<'de>;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a string key")
            }
            fn visit_borrowed_str<E>(self, v: &'de str) -> Result<Key<'de>, E> {
                Ok(Key(Cow::Borrowed(v)))
            }
            fn visit_str<E>(self, v: &str) -> Result<Key<'de>, E> {
                Ok(Key(Cow::Owned(v.to_string())))
            }
            fn visit_string<E>(self, v: String) -> Result<Key<'de>, E> {
                Ok(Key(Cow::Owned(v)))
            }
        }
        d.deserialize_str(V)
    }
}

/// Below a kept node: objects keep only the view's children; any other
/// value is kept as it is.
impl<'de> Visitor<'de> for &SelectorView {
    type Value = Value;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a JSON value")
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        let mut out = Map::new();
        while let Some(Key(name)) = map.next_key()? {
            match self.child(&name) {
                Some(view) => {
                    let v = map.next_value_seed(view)?;
                    out.insert(name.into_owned(), v);
                }
                None => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        Ok(Value::Object(out))
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        let mut out = Vec::new();
        while let Some(v) = seq.next_element::<Value>()? {
            out.push(v);
        }
        Ok(Value::Array(out))
    }
    fn visit_bool<E>(self, v: bool) -> Result<Value, E> {
        Ok(Value::Bool(v))
    }
    fn visit_i64<E>(self, v: i64) -> Result<Value, E> {
        Ok(Value::from(v))
    }
    fn visit_u64<E>(self, v: u64) -> Result<Value, E> {
        Ok(Value::from(v))
    }
    fn visit_f64<E>(self, v: f64) -> Result<Value, E> {
        Ok(Value::from(v))
    }
    fn visit_str<E>(self, v: &str) -> Result<Value, E> {
        Ok(Value::String(v.to_string()))
    }
    fn visit_string<E>(self, v: String) -> Result<Value, E> {
        Ok(Value::String(v))
    }
    fn visit_unit<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }
}

/// 400 BadRequest for a field selector on a field the kind does not support.
pub fn check_supported(res: &ResourceInfo, field: &str) -> Result<(), ApiError> {
    let common = field == "metadata.name" || (field == "metadata.namespace" && res.namespaced);
    if common || index_fields(res).contains(&field) {
        Ok(())
    } else {
        Err(ApiError::bad_request(format!(
            "field label not supported: {field}"
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resources::lookup;
    use serde_json::json;

    #[test]
    fn an_unscheduled_pod_has_an_empty_node_name() {
        let pods = lookup("", "v1", "pods").unwrap();
        let pod = json!({"metadata": {"name": "p"}, "spec": {}, "status": {"phase": "Pending"}});
        assert_eq!(
            field_value(pods, &pod, "spec.nodeName").as_deref(),
            Some("")
        );
        assert_eq!(
            field_value(pods, &pod, "status.phase").as_deref(),
            Some("Pending")
        );
        assert_eq!(
            field_value(pods, &pod, "spec.hostNetwork").as_deref(),
            Some("false")
        );
    }

    #[test]
    fn unsupported_fields_are_a_bad_request() {
        let cms = lookup("", "v1", "configmaps").unwrap();
        let e = check_supported(cms, "data.x").unwrap_err();
        assert_eq!(
            (e.code, e.message.as_str()),
            (400, "field label not supported: data.x")
        );
        assert!(check_supported(cms, "metadata.name").is_ok());
    }

    #[test]
    fn the_selector_view_of_a_pod_keeps_exactly_what_selectors_read() {
        let pods = lookup("", "v1", "pods").unwrap();
        let pod = json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "web-1", "namespace": "prod",
                "labels": {"app": "web", "tier": "front"},
                "managedFields": [{"manager": "kubectl", "fieldsV1": {"f:spec": {}}}],
                "annotations": {"a": "b"}},
            "spec": {"nodeName": "n1", "hostNetwork": true, "restartPolicy": "Always",
                "containers": [{"name": "c", "image": "pause"}]},
            "status": {"phase": "Running", "podIP": "10.0.0.7",
                "conditions": [{"type": "Ready", "status": "True"}]}
        });
        let bytes = serde_json::to_vec(&pod).unwrap();
        let view = SelectorView::of(pods).parse(&bytes).unwrap();
        assert_eq!(
            view,
            json!({
                "metadata": {"name": "web-1", "namespace": "prod",
                    "labels": {"app": "web", "tier": "front"}},
                "spec": {"nodeName": "n1", "hostNetwork": true, "restartPolicy": "Always"},
                "status": {"phase": "Running", "podIP": "10.0.0.7"}
            })
        );
        for f in index_fields(pods) {
            assert_eq!(
                field_value(pods, &view, f),
                field_value(pods, &pod, f),
                "{f}"
            );
        }
    }

    #[test]
    fn the_selector_view_keeps_a_whole_subtree_a_field_reads_into() {
        // An Event's `source` selector reads source.component.
        let events = lookup("", "v1", "events").unwrap();
        let ev = json!({"metadata": {"name": "e"}, "source": {"component": "kubelet", "host": "n"},
            "involvedObject": {"kind": "Pod", "name": "p", "extra": 1}, "message": "m"});
        let view = SelectorView::of(events)
            .parse(&serde_json::to_vec(&ev).unwrap())
            .unwrap();
        assert_eq!(view["source"], ev["source"]);
        assert_eq!(view["involvedObject"], json!({"kind": "Pod", "name": "p"}));
        assert_eq!(view.get("message"), None);
        assert_eq!(
            field_value(events, &view, "source").as_deref(),
            Some("kubelet")
        );
    }

    #[test]
    fn the_selector_view_rejects_what_is_not_json_even_in_skipped_parts() {
        let pods = lookup("", "v1", "pods").unwrap();
        let view = SelectorView::of(pods);
        assert!(view
            .parse(br#"{"metadata":{"name":"p"},"spec":{"x":[1,}}"#)
            .is_err());
        assert!(view
            .parse(br#"{"metadata":{"name":"p"}} trailing"#)
            .is_err());
        // Escaped keys are still recognised.
        let v = view.parse(br#"{"metadata":{"n\u0061me":"p"}}"#).unwrap();
        assert_eq!(v, json!({"metadata": {"name": "p"}}));
    }
}
