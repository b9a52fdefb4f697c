//! Kubernetes' NamespaceLifecycle admission plugin: no new objects in a
//! namespace that does not exist or is being deleted, read live (cheap on
//! the embedded store, and never stale).

use async_trait::async_trait;
use serde_json::Value;
use skiff_core::resources;
use skiff_core::{ApiError, ApiResult, Cause};

use super::context::AdmissionCtx;
use super::plugin::{AdmissionPlugin, Attributes, Operation};
use crate::object::meta_str;

pub struct NamespaceLifecycle;

#[async_trait]
impl AdmissionPlugin for NamespaceLifecycle {
    fn name(&self) -> &'static str {
        "NamespaceLifecycle"
    }

    fn handles(&self, a: &Attributes<'_>) -> bool {
        a.op == Operation::Create && a.res.namespaced
    }

    async fn mutate(
        &self,
        cx: &dyn AdmissionCtx,
        a: &Attributes<'_>,
        _obj: &mut Value,
    ) -> ApiResult<()> {
        let ns = a.namespace.unwrap_or("");
        let found = match cx.get_stored(namespaces(), None, ns).await? {
            // Only whether it is being deleted matters: read that one field
            // from the stored bytes rather than decoding the namespace.
            Some(bytes) => match terminating_in_stored(&bytes) {
                Some(false) => return Ok(()),
                _ => Some(
                    serde_json::from_slice::<Value>(&bytes)
                        .map_err(|e| ApiError::internal(format!("decoding namespace {ns}: {e}")))?,
                ),
            },
            None => None,
        };
        check_open(ns, found.as_ref())
    }
}

/// No new objects in a namespace that does not exist or is being
/// deleted. `found` is the namespace, read live (a namespace deleted a
/// moment ago is already terminating).
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
    use serde_json::json;

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
