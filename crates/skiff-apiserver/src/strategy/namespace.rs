//! Namespaces: the `kubernetes.io/metadata.name` label, deletion through
//! the `kubernetes` finalizer (`Terminating` until the namespace controller
//! empties it), and no new content in a namespace being deleted.

use serde_json::{json, Value};
use skiff_core::resources;
use skiff_core::{ApiError, ApiResult, Cause};

use super::{DeletePlan, Strategy};
use crate::object::{meta_str, metadata_mut};
use crate::registry::DeleteOptions;
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

/// NamespaceLifecycle admission: no new objects in a namespace that does
/// not exist or is being deleted. `found` is the namespace, read live (a
/// namespace deleted a moment ago is already terminating).
pub fn check_open(ns: &str, found: Option<&Value>) -> ApiResult<()> {
    let Some(obj) = found else {
        return Err(ApiError::not_found("", "namespaces", ns));
    };
    if !meta_str(obj, "deletionTimestamp").is_empty() {
        let mut e = ApiError::forbidden(format!(
            "unable to create new content in namespace {ns} because it is being terminated"
        ));
        e.reason = "Forbidden".into();
        e.name = Some(ns.to_string());
        e.kind = Some("namespaces".into());
        e.causes = vec![Cause::new(
            "NamespaceTerminating",
            "metadata.namespace",
            format!("namespace {ns} is being terminated"),
        )];
        return Err(e);
    }
    Ok(())
}

/// Whether the stored bytes of a namespace say it is being deleted (a
/// non-empty string `metadata.deletionTimestamp`, what [`check_open`]
/// reads), found without decoding them; `None` when the bytes are not laid
/// out as the store writes them (the caller decodes).
pub fn terminating_in_stored(stored: &[u8]) -> Option<bool> {
    let doc = crate::rawjson::document(stored)?;
    let meta = doc.get(stored, "metadata")?;
    let meta = crate::rawjson::object(stored, meta.value.start)?;
    Some(match meta.get(stored, "deletionTimestamp") {
        // `""` is two bytes: anything longer is a non-empty string.
        Some(f) => stored[f.value.start] == b'"' && f.value.len() > 2,
        None => false,
    })
}

/// The namespaces resource.
pub fn namespaces() -> &'static resources::ResourceInfo {
    resources::lookup("", "v1", "namespaces").expect("namespaces")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The byte probe agrees with `check_open` on the decoded namespace.
    #[test]
    fn terminating_is_read_from_the_stored_bytes_as_check_open_reads_it() {
        let cases = [
            (
                json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "a"}}),
                false,
            ),
            (
                json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "a",
                "deletionTimestamp": "2026-11-26T00:00:00Z", "managedFields": [{"manager": "m"}]},
                "spec": {"finalizers": ["kubernetes"]}, "status": {"phase": "Terminating"}}),
                true,
            ),
            (
                json!({"metadata": {"name": "a", "deletionTimestamp": ""}}),
                false,
            ),
            (
                json!({"metadata": {"name": "a", "deletionTimestamp": null}}),
                false,
            ),
            (
                json!({"metadata": {"deletionTimestamp": 3, "name": "a"}}),
                false,
            ),
            (json!({"metadata": {}}), false),
        ];
        for (obj, terminating) in cases {
            let bytes = crate::object::encode(&obj).unwrap();
            assert_eq!(terminating_in_stored(&bytes), Some(terminating), "{obj}");
            assert_eq!(check_open("a", Some(&obj)).is_err(), terminating, "{obj}");
        }
        // Not laid out as stored: the caller decodes.
        assert_eq!(terminating_in_stored(b"{\"metadata\": 1}"), None);
        assert_eq!(terminating_in_stored(b"not json"), None);
    }
}
