//! CustomResourceDefinitions' delete: the definition is marked
//! `Terminating` with the cleanup finalizer, and `crate::crd::run`
//! deletes its custom resources, then removes the finalizer.

use serde_json::{json, Value};

use super::{DeletePlan, Strategy};
use crate::object::{metadata_mut, set_condition};
use crate::options::DeleteOptions;

/// The finalizer a definition being deleted carries until its objects are gone.
pub const CLEANUP_FINALIZER: &str = "customresourcecleanup.apiextensions.k8s.io";

/// A definition's delete: marked `Terminating` with the cleanup finalizer;
/// `crate::crd::run` empties it and removes the finalizer.
pub struct CrdStrategy;

impl Strategy for CrdStrategy {
    fn delete_plan(&self, _obj: &Value, _opts: &DeleteOptions) -> DeletePlan {
        DeletePlan::Finalize
    }

    fn prepare_for_delete(&self, obj: &mut Value) {
        let mut f = crate::object::finalizers(obj);
        if !f.iter().any(|x| x == CLEANUP_FINALIZER) {
            f.push(CLEANUP_FINALIZER.to_string());
            metadata_mut(obj).insert("finalizers".into(), json!(f));
        }
        set_condition(
            obj,
            "Terminating",
            "True",
            Some("InstanceDeletionPending"),
            Some("CustomResourceDefinition marked for deletion; CustomResource deletion will begin soon"),
        );
        strip_probe_time(obj);
    }
}

/// CRD conditions carry no `lastProbeTime`.
pub fn strip_probe_time(obj: &mut Value) {
    if let Some(cs) = obj
        .pointer_mut("/status/conditions")
        .and_then(Value::as_array_mut)
    {
        for c in cs {
            if let Some(m) = c.as_object_mut() {
                m.remove("lastProbeTime");
            }
        }
    }
}
