//! Pods' server-side hooks: the QoS class at create, graceful deletion
//! confirmed by the node, and binding (`pods/binding`, [`bind`]).
//! Eviction is [`super::eviction`]; the admission plugins of pods are
//! `crate::admission::pod` and `crate::podtoken`.

use async_trait::async_trait;
use serde_json::{json, Value};
use skiff_core::resources::ResourceInfo;
use skiff_core::{ApiError, ApiResult, Cause};

use super::{AdmissionCtx, DeletePlan, Strategy};
use crate::object::{meta_str, metadata_mut};
use crate::options::DeleteOptions;

pub struct PodStrategy;

#[async_trait]
impl Strategy for PodStrategy {
    fn bound_node<'a>(&self, obj: &'a Value) -> Option<&'a str> {
        obj.pointer("/spec/nodeName")
            .and_then(Value::as_str)
            .filter(|n| !n.is_empty())
    }

    /// The QoS class follows the resources admission settled on.
    async fn admit_create(
        &self,
        _cx: &dyn AdmissionCtx,
        _res: &'static ResourceInfo,
        _ns: Option<&str>,
        obj: &mut Value,
    ) -> ApiResult<()> {
        if !obj.get("spec").is_some_and(Value::is_object) {
            return Ok(());
        }
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
            &format!(
                "pod {name} {} {current:?}",
                skiff_core::kinds::pod::ALREADY_ASSIGNED
            ),
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
    crate::object::set_condition(pod, "PodScheduled", "True", None, None);
}

/// [`bindable`] and [`bind_to`] on a stored pod's bytes, for a binding
/// without annotations: the same checks and the same bytes `encode` would
/// write of the bound pod (the node set or added last in `spec`, the
/// `PodScheduled` condition, `metadata.resourceVersion` and `selfLink`
/// left out), but only `status` and the few fields read are decoded: a
/// pod's managedFields and spec stay as they were written. `Ok(None)`:
/// bytes of a shape this does not handle (the caller decodes them).
pub(crate) fn bind_stored(
    stored: &[u8],
    name: &str,
    wanted_uid: &str,
    node: &str,
) -> ApiResult<Option<Vec<u8>>> {
    use crate::rawjson::{document, object, Edits};
    let b = stored;
    let Some(top) = document(b) else {
        return Ok(None);
    };
    // `encode` writes apiVersion, kind and metadata first: so must this.
    let leading = top
        .fields
        .iter()
        .take_while(|f| matches!(&b[f.key.clone()], b"apiVersion" | b"kind" | b"metadata"))
        .count();
    if top.fields[leading..]
        .iter()
        .any(|f| matches!(&b[f.key.clone()], b"apiVersion" | b"kind" | b"metadata"))
    {
        return Ok(None);
    }
    let sub = |field: &str| match top.get(b, field) {
        Some(f) => object(b, f.value.start).map(Some),
        None => Some(None),
    };
    let (Some(Some(meta)), Some(Some(spec))) = (sub("metadata"), sub("spec")) else {
        return Ok(None);
    };
    let read = |o: &crate::rawjson::Object, field: &str| -> Option<Value> {
        match o.get(b, field) {
            Some(f) => serde_json::from_slice(&b[f.value.clone()]).ok(),
            None => Some(Value::Null),
        }
    };
    // What `bindable` reads, in a pod of its own.
    let (Some(uid), Some(deleting), Some(current)) = (
        read(&meta, "uid"),
        read(&meta, "deletionTimestamp"),
        read(&spec, "nodeName"),
    ) else {
        return Ok(None);
    };
    let mut small = json!({"metadata": {}, "spec": {}});
    for (k, v) in [("uid", uid), ("deletionTimestamp", deleting)] {
        if !v.is_null() {
            small["metadata"][k] = v;
        }
    }
    if !current.is_null() {
        small["spec"]["nodeName"] = current;
    }
    bindable(&small, name, wanted_uid)?;

    let mut edits = Edits::default();
    for (i, f) in meta.fields.iter().enumerate() {
        if matches!(&b[f.key.clone()], b"resourceVersion" | b"selfLink") {
            edits.remove_field(&meta, i);
        }
    }
    let node_json = serde_json::to_vec(node).unwrap_or_default();
    match spec.get(b, "nodeName") {
        Some(f) => edits.replace(f.value.clone(), node_json),
        None => edits.append_field(&spec, "nodeName", &node_json),
    }
    let status_field = top.get(b, "status");
    let mut pod = json!({});
    if let Some(f) = status_field {
        match serde_json::from_slice::<Value>(&b[f.value.clone()]) {
            Ok(v) => pod["status"] = v,
            Err(_) => return Ok(None),
        }
    }
    crate::object::set_condition(&mut pod, "PodScheduled", "True", None, None);
    let status = serde_json::to_vec(&pod["status"]).unwrap_or_default();
    match status_field {
        Some(f) => edits.replace(f.value.clone(), status),
        None => edits.append_field(&top, "status", &status),
    }
    Ok(edits.apply(b))
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::object::{decode, encode};
    use skiff_store::KeyValue;

    /// The bytes-only binding gives what decoding, binding and encoding gives.
    fn both(stored: &Value, uid: &str) -> (ApiResult<Option<Vec<u8>>>, ApiResult<Vec<u8>>) {
        let bytes = serde_json::to_vec(stored).unwrap();
        let fast = bind_stored(&bytes, "p", uid, "node-7");
        let kv = KeyValue {
            key: "/registry/pods/default/p".into(),
            value: bytes.into(),
            create_revision: 1,
            mod_revision: 5,
        };
        let binding = json!({"target": {"kind": "Node", "name": "node-7"}});
        let slow = (|| {
            let mut pod = decode(&kv)?;
            bindable(&pod, "p", uid)?;
            bind_to(&mut pod, &binding);
            Ok(encode(&pod)?.to_vec())
        })();
        (fast, slow)
    }

    fn same_time(b: &[u8]) -> String {
        let mut v: Value = serde_json::from_slice(b).unwrap();
        for c in v["status"]["conditions"].as_array_mut().unwrap() {
            if c["type"] == "PodScheduled" && c["status"] == "True" {
                c["lastTransitionTime"] = json!("T");
            }
        }
        serde_json::to_string(&v).unwrap()
    }

    #[test]
    fn binding_the_stored_bytes_writes_what_the_decoded_binding_writes() {
        let base = json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "p", "namespace": "default", "uid": "u1",
                "resourceVersion": "5", "labels": {"a": "}{\"["},
                "managedFields": [{"manager": "m", "fieldsV1": {"f:spec": {}}}]},
            "spec": {"containers": [{"name": "c", "image": "pause"}], "schedulerName": "default-scheduler"},
            "status": {"phase": "Pending", "qosClass": "Guaranteed"}
        });
        let mut cases = vec![base.clone()];
        let mut v = base.clone();
        v.as_object_mut().unwrap().remove("status");
        cases.push(v);
        let mut v = base.clone();
        v["spec"]["nodeName"] = json!("");
        v["status"]["conditions"] = json!([{"type": "PodScheduled", "status": "False",
            "reason": "Unschedulable", "lastProbeTime": null, "lastTransitionTime": "2020-01-01T00:00:00Z"},
            {"type": "Other", "status": "True"}]);
        cases.push(v);
        let mut v = base.clone();
        v["metadata"]
            .as_object_mut()
            .unwrap()
            .remove("resourceVersion");
        v["metadata"]["selfLink"] = json!("/x");
        v["status"] = Value::Null;
        cases.push(v);
        for (i, c) in cases.iter().enumerate() {
            let (fast, slow) = both(c, "u1");
            let fast = fast
                .unwrap()
                .unwrap_or_else(|| panic!("case {i}: not handled"));
            assert_eq!(same_time(&fast), same_time(&slow.unwrap()), "case {i}");
        }
        // Refusals are the decoded path's, word for word.
        let mut bound = base.clone();
        bound["spec"]["nodeName"] = json!("node-1");
        let mut deleting = base.clone();
        deleting["metadata"]["deletionTimestamp"] = json!("2020-01-01T00:00:00Z");
        for (c, uid) in [(&bound, "u1"), (&deleting, "u1"), (&base, "other-uid")] {
            let (fast, slow) = both(c, uid);
            let (fast, slow) = (fast.unwrap_err(), slow.unwrap_err());
            assert_eq!(fast.code, 409);
            assert_eq!(fast.message, slow.message);
        }
        // A shape it does not handle goes to the decoding path.
        let odd = json!({"spec": {}, "metadata": {"uid": "u1"}, "kind": "Pod"});
        assert!(both(&odd, "u1").0.unwrap().is_none());
    }
}
