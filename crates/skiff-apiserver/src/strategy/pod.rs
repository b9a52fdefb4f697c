//! Pods' server-side hooks: the admission plugins that read other objects
//! (ServiceAccount, DefaultTolerationSeconds, Priority, LimitRanger),
//! graceful deletion confirmed by the node, and binding. Eviction is
//! [`super::eviction`].

use async_trait::async_trait;
use serde_json::{json, Value};
use skiff_core::admission as core;
use skiff_core::resources::{self, ResourceInfo};
use skiff_core::{ApiError, ApiResult, Cause};

use super::{AdmissionCtx, DeletePlan, Strategy};
use crate::admission::forbidden;
use crate::object::{meta_str, metadata_mut};
use crate::registry::DeleteOptions;

pub struct PodStrategy;

fn lookup(group: &str, version: &str, plural: &str) -> &'static ResourceInfo {
    resources::lookup(group, version, plural).expect("built-in resource")
}

#[async_trait]
impl Strategy for PodStrategy {
    async fn admit_create(
        &self,
        cx: &dyn AdmissionCtx,
        res: &'static ResourceInfo,
        ns: Option<&str>,
        obj: &mut Value,
    ) -> ApiResult<()> {
        let name = meta_str(obj, "name").to_string();
        let ns = ns.unwrap_or("");
        let Some(spec) = obj.get_mut("spec").filter(|s| s.is_object()) else {
            return Ok(());
        };
        core::default_service_account(spec);
        core::default_tolerations(spec);
        let classes = cx
            .consistent_list(
                lookup("scheduling.k8s.io", "v1", "priorityclasses"),
                None,
                true,
            )
            .await?;
        core::resolve_priority(spec, &classes).map_err(|m| forbidden(res, &name, &m))?;
        let ranges = cx
            .consistent_list(lookup("", "v1", "limitranges"), Some(ns), true)
            .await?;
        if !ranges.is_empty() {
            if let Some(note) = core::apply_limit_range_defaults(obj, &ranges) {
                let m = metadata_mut(obj);
                let ann = m.entry("annotations").or_insert_with(|| json!({}));
                if let Some(a) = ann.as_object_mut() {
                    a.insert("kubernetes.io/limit-ranger".into(), json!(note));
                }
            }
            core::validate_limit_ranges(obj, &ranges).map_err(|m| forbidden(res, &name, &m))?;
        }
        // The QoS class follows the resources admission settled on.
        let qos = obj
            .get("spec")
            .map(skiff_core::defaults::qos_class)
            .unwrap_or("BestEffort");
        if obj.get("status").map(Value::is_object).unwrap_or(false) {
            obj["status"]["qosClass"] = json!(qos);
        }
        Ok(())
    }

    /// A pod on a node goes when the node confirms it stopped, within its
    /// grace period; any other pod at once.
    fn delete_plan(&self, pod: &Value, opts: &DeleteOptions) -> DeletePlan {
        if !pod_awaits_node(pod) {
            return DeletePlan::Now;
        }
        let default = pod
            .pointer("/spec/terminationGracePeriodSeconds")
            .and_then(Value::as_i64)
            .unwrap_or(30);
        match opts.grace_period_seconds.unwrap_or(default).max(0) {
            0 => DeletePlan::Now,
            g => DeletePlan::Graceful(g),
        }
    }

    /// A pod still running on its node goes only once its grace period is
    /// 0 (the node confirmed the end, or the delete was forced).
    fn may_remove(&self, pod: &Value) -> bool {
        let grace_over = pod
            .pointer("/metadata/deletionGracePeriodSeconds")
            .and_then(Value::as_i64)
            == Some(0);
        !pod_awaits_node(pod) || grace_over
    }
}

/// A pod that a node agent must confirm stopped before it goes away.
pub(crate) fn pod_awaits_node(pod: &Value) -> bool {
    let bound = !pod
        .pointer("/spec/nodeName")
        .and_then(Value::as_str)
        .unwrap_or("")
        .is_empty();
    let phase = pod
        .pointer("/status/phase")
        .and_then(Value::as_str)
        .unwrap_or("");
    bound && phase != "Succeeded" && phase != "Failed"
}

/// Whether a pod may be bound now (Kubernetes' binding storage checks).
pub(crate) fn bindable(pod: &Value, name: &str, wanted_uid: &str) -> ApiResult<()> {
    if !wanted_uid.is_empty() && wanted_uid != meta_str(pod, "uid") {
        return Err(ApiError::conflict(
            "",
            "pods",
            name,
            &format!(
                "Precondition failed: UID in precondition: {wanted_uid}, UID in object meta: {}",
                meta_str(pod, "uid")
            ),
        ));
    }
    if !meta_str(pod, "deletionTimestamp").is_empty() {
        return Err(ApiError::conflict(
            "",
            "pods",
            name,
            "pod is being deleted, cannot be assigned to a host",
        ));
    }
    let current = pod
        .pointer("/spec/nodeName")
        .and_then(Value::as_str)
        .unwrap_or("");
    if !current.is_empty() {
        return Err(ApiError::conflict(
            "",
            "pods",
            name,
            &format!("pod {name} is already assigned to node {current:?}"),
        ));
    }
    Ok(())
}

/// A pod bound as `binding` says (`pods/binding`): the node, the binding's
/// annotations and the `PodScheduled` condition. Checks the binding first.
pub(crate) fn bind_to(pod: &mut Value, binding: &Value) {
    let node = binding
        .pointer("/target/name")
        .and_then(Value::as_str)
        .unwrap_or("");
    pod["spec"]["nodeName"] = json!(node);
    if let Some(ann) = binding
        .pointer("/metadata/annotations")
        .and_then(Value::as_object)
    {
        let m = metadata_mut(pod);
        let entry = m.entry("annotations").or_insert_with(|| json!({}));
        if let Some(a) = entry.as_object_mut() {
            for (k, v) in ann {
                a.insert(k.clone(), v.clone());
            }
        }
    }
    crate::registry::set_condition(pod, "PodScheduled", "True", None, None);
}

/// The checks of a binding itself: a target node, of kind Node.
pub(crate) fn check_binding(name: &str, binding: &Value) -> ApiResult<()> {
    let node = binding
        .pointer("/target/name")
        .and_then(Value::as_str)
        .unwrap_or("");
    if node.is_empty() {
        return Err(ApiError::invalid(
            "",
            "Binding",
            name,
            vec![Cause::required("target.name")],
        ));
    }
    let kind = binding
        .pointer("/target/kind")
        .and_then(Value::as_str)
        .unwrap_or("");
    if !kind.is_empty() && kind != "Node" {
        return Err(ApiError::invalid(
            "",
            "Binding",
            name,
            vec![Cause::not_supported(
                "target.kind",
                &json!(kind),
                &["Node", "<empty>"],
            )],
        ));
    }
    Ok(())
}
