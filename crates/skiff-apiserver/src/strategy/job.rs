//! Jobs: the generated selector and pod template labels (unless
//! `manualSelector`), set on create once the name and uid are final.

use serde_json::{json, Value};

use super::Strategy;
use crate::object::meta_str;
use crate::options::DeleteOptions;

pub struct JobStrategy;

impl Strategy for JobStrategy {
    /// Jobs orphan their pods when a delete names no policy, and
    /// Kubernetes says so.
    fn delete_warnings(&self, o: &DeleteOptions) -> Vec<String> {
        if o.propagation_policy.is_none() && o.orphan_dependents.is_none() {
            return vec!["child pods are preserved by default when jobs are deleted; set propagationPolicy=Background to remove them or set propagationPolicy=Orphan to suppress this warning".into()];
        }
        Vec::new()
    }

    fn named_defaults(&self, obj: &mut Value) {
        if obj.pointer("/spec/manualSelector").and_then(Value::as_bool) == Some(true) {
            return;
        }
        let name = meta_str(obj, "name").to_string();
        let uid = meta_str(obj, "uid").to_string();
        let Some(spec) = obj.get_mut("spec").and_then(Value::as_object_mut) else {
            return;
        };
        let template = spec.entry("template").or_insert_with(|| json!({}));
        if let Some(t) = template.as_object_mut() {
            let meta = t.entry("metadata").or_insert_with(|| json!({}));
            if let Some(meta) = meta.as_object_mut() {
                let labels = meta.entry("labels").or_insert_with(|| json!({}));
                if !labels.is_object() {
                    *labels = json!({});
                }
                if let Some(l) = labels.as_object_mut() {
                    for k in ["job-name", "batch.kubernetes.io/job-name"] {
                        l.entry(k).or_insert_with(|| json!(name));
                    }
                    for k in ["controller-uid", "batch.kubernetes.io/controller-uid"] {
                        l.entry(k).or_insert_with(|| json!(uid));
                    }
                }
            }
        }
        let selector = spec.entry("selector").or_insert_with(|| json!({}));
        if !selector.is_object() {
            *selector = json!({});
        }
        if let Some(sel) = selector.as_object_mut() {
            let ml = sel.entry("matchLabels").or_insert_with(|| json!({}));
            if !ml.is_object() {
                *ml = json!({});
            }
            if let Some(ml) = ml.as_object_mut() {
                ml.entry("batch.kubernetes.io/controller-uid")
                    .or_insert_with(|| json!(uid));
            }
        }
    }
}
