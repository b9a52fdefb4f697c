//! Namespaces: the `kubernetes.io/metadata.name` label and deletion through
//! the `kubernetes` finalizer (`Terminating` until the namespace controller
//! empties it). No new content in a namespace being deleted is
//! NamespaceLifecycle admission (`crate::admission::namespace`).

use serde_json::{json, Value};

use super::{DeletePlan, Strategy};
use crate::object::{meta_str, metadata_mut};
use crate::options::DeleteOptions;
use crate::request::Subresource;

pub struct NamespaceStrategy;

impl Strategy for NamespaceStrategy {
    fn prepare_for_update(&self, _old: &Value, new: &mut Value, _sub: Subresource) {
        name_label(new);
    }

    fn named_defaults(&self, obj: &mut Value) {
        name_label(obj);
    }

    fn delete_plan(&self, _obj: &Value, _opts: &DeleteOptions) -> DeletePlan {
        DeletePlan::Finalize
    }

    fn prepare_for_delete(&self, obj: &mut Value) {
        obj["status"]["phase"] = json!("Terminating");
    }
}

/// A namespace carries `kubernetes.io/metadata.name=<name>`, always.
fn name_label(obj: &mut Value) {
    let name = meta_str(obj, "name").to_string();
    if name.is_empty() {
        return;
    }
    let m = metadata_mut(obj);
    let labels = m.entry("labels").or_insert_with(|| json!({}));
    if !labels.is_object() {
        *labels = json!({});
    }
    if let Some(l) = labels.as_object_mut() {
        l.insert("kubernetes.io/metadata.name".into(), json!(name));
    }
}
