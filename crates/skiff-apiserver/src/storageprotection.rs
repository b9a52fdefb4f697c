//! Kubernetes' StorageObjectInUseProtection admission plugin: every new
//! PersistentVolumeClaim gets the finalizer `kubernetes.io/pvc-protection`
//! and every new PersistentVolume `kubernetes.io/pv-protection` (on create
//! only, as Kubernetes), so that deleting one leaves it Terminating until
//! the controller manager's protection controllers see it unused.

use serde_json::{json, Value};
use skiff_core::resources::ResourceInfo;
use skiff_core::ApiResult;

use crate::admission::context::AdmissionCtx;
use crate::admission::plugin::{AdmissionPlugin, Attributes};

pub const PVC_FINALIZER: &str = "kubernetes.io/pvc-protection";
pub const PV_FINALIZER: &str = "kubernetes.io/pv-protection";

/// The plugin.
pub struct StorageObjectInUseProtection;

#[async_trait::async_trait]
impl AdmissionPlugin for StorageObjectInUseProtection {
    fn name(&self) -> &'static str {
        "StorageObjectInUseProtection"
    }

    fn handles(&self, a: &Attributes<'_>) -> bool {
        a.creates("", "persistentvolumeclaims") || a.creates("", "persistentvolumes")
    }

    async fn mutate(
        &self,
        _cx: &dyn AdmissionCtx,
        a: &Attributes<'_>,
        obj: &mut Value,
    ) -> ApiResult<()> {
        admit_create(a.res, obj);
        Ok(())
    }
}

fn admit_create(res: &ResourceInfo, obj: &mut Value) {
    let finalizer = match (res.group, res.plural) {
        ("", "persistentvolumeclaims") => PVC_FINALIZER,
        ("", "persistentvolumes") => PV_FINALIZER,
        _ => return,
    };
    let Some(meta) = obj.get_mut("metadata").and_then(Value::as_object_mut) else {
        return;
    };
    let list = meta.entry("finalizers").or_insert_with(|| json!([]));
    if list.is_null() {
        *list = json!([]);
    }
    if let Some(list) = list.as_array_mut() {
        if !list.iter().any(|f| f.as_str() == Some(finalizer)) {
            list.push(json!(finalizer));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use skiff_core::resources;

    #[test]
    fn claims_and_volumes_get_their_finalizer_once_and_other_kinds_none() {
        let pvcs = resources::lookup("", "v1", "persistentvolumeclaims").unwrap();
        let pvs = resources::lookup("", "v1", "persistentvolumes").unwrap();
        let pods = resources::lookup("", "v1", "pods").unwrap();
        let mut c = json!({"metadata": {"name": "c", "finalizers": ["example.com/keep"]}});
        admit_create(pvcs, &mut c);
        admit_create(pvcs, &mut c);
        assert_eq!(
            c["metadata"]["finalizers"],
            json!(["example.com/keep", PVC_FINALIZER])
        );
        let mut v = json!({"metadata": {"name": "v"}});
        admit_create(pvs, &mut v);
        assert_eq!(v["metadata"]["finalizers"], json!([PV_FINALIZER]));
        let mut p = json!({"metadata": {"name": "p"}});
        admit_create(pods, &mut p);
        assert!(p["metadata"].get("finalizers").is_none());
    }
}
