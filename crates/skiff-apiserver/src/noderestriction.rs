//! The NodeRestriction admission plugin: what a node (`system:node:<name>`
//! in `system:nodes`) may write, beyond what the Node authorizer lets it
//! attempt. Its own Node only (no restricted labels, no taint changes
//! after registration), its own Lease and CSINode, the status of pods bound
//! to it, mirror pods bound to it and owned by its Node (referencing no
//! ServiceAccount, Secret, ConfigMap or claim), deletes and evictions of
//! its own pods, and tokens bound to its own pods. Messages are
//! kube-apiserver's.

use serde_json::Value;
use skiff_core::rbac::Attributes;
use skiff_core::resources::{self, ResourceInfo};
use skiff_core::ApiResult;

use crate::admission::context::AdmissionCtx;
use crate::admission::plugin::{forbidden, AdmissionPlugin, Attributes as Admitted, Operation};
use crate::auth::Identity;
use crate::authz::node::{node_identity, pod_refs, Ref};
use crate::object::meta_str;

const MIRROR: &str = "kubernetes.io/config.mirror";

/// Labels kubelets may set on their Node (`kubeletapis.KubeletLabels`).
const KUBELET_LABELS: &[&str] = &[
    "kubernetes.io/hostname",
    "topology.kubernetes.io/zone",
    "topology.kubernetes.io/region",
    "failure-domain.beta.kubernetes.io/zone",
    "failure-domain.beta.kubernetes.io/region",
    "beta.kubernetes.io/instance-type",
    "node.kubernetes.io/instance-type",
    "beta.kubernetes.io/os",
    "beta.kubernetes.io/arch",
    "kubernetes.io/os",
    "kubernetes.io/arch",
];
/// Label namespaces kubelets may use (`kubeletapis.KubeletLabelNamespaces`).
const KUBELET_NAMESPACES: &[&str] = &["kubelet.kubernetes.io", "node.kubernetes.io"];

fn label_namespace(label: &str) -> &str {
    label.split_once('/').map(|(ns, _)| ns).unwrap_or("")
}

fn in_namespace(ns: &str, base: &str) -> bool {
    ns == base || ns.ends_with(&format!(".{base}"))
}

/// Whether a node may set (or change) this label on its Node.
pub fn label_allowed(label: &str) -> bool {
    let ns = label_namespace(label);
    if in_namespace(ns, "node-restriction.kubernetes.io") {
        return false;
    }
    let kubernetes = in_namespace(ns, "kubernetes.io") || in_namespace(ns, "k8s.io");
    let kubelet =
        KUBELET_LABELS.contains(&label) || KUBELET_NAMESPACES.iter().any(|n| in_namespace(ns, n));
    !kubernetes || kubelet
}

/// The labels added, removed or changed between `old` and `new`.
fn modified_labels(old: Option<&Value>, new: &Value) -> Vec<String> {
    let labels = |v: Option<&Value>| {
        v.and_then(|v| v.pointer("/metadata/labels"))
            .and_then(Value::as_object)
            .cloned()
            .unwrap_or_default()
    };
    let (o, n) = (labels(old), labels(Some(new)));
    let mut out: Vec<String> = n
        .iter()
        .filter(|(k, v)| o.get(*k) != Some(*v))
        .map(|(k, _)| k.clone())
        .chain(o.keys().filter(|k| !n.contains_key(*k)).cloned())
        .collect();
    out.sort();
    out.dedup();
    out
}

fn lookup(group: &str, plural: &str) -> &'static ResourceInfo {
    resources::lookup(group, "v1", plural).expect("built-in resource")
}

/// The node a writer is, if the writer is a node.
fn node_of(who: Option<&Identity>) -> Option<&str> {
    who.and_then(|w| node_identity(&w.user, &w.groups))
}

fn check_node_object(
    res: &ResourceInfo,
    node: &str,
    old: Option<&Value>,
    new: &Value,
) -> ApiResult<()> {
    let name = meta_str(new, "name");
    if name != node {
        return Err(forbidden(
            res,
            name,
            &format!("node {node:?} is not allowed to modify node {name:?}"),
        ));
    }
    let bad: Vec<String> = modified_labels(old, new)
        .into_iter()
        .filter(|l| !label_allowed(l))
        .collect();
    if !bad.is_empty() {
        let verb = if old.is_some() { "modify" } else { "set" };
        let what = if old.is_some() {
            "labels"
        } else {
            "the following labels"
        };
        return Err(forbidden(
            res,
            name,
            &format!(
                "node {node:?} is not allowed to {verb} {what}: {}",
                bad.join(", ")
            ),
        ));
    }
    if let Some(old) = old {
        if old.pointer("/spec/taints") != new.pointer("/spec/taints") {
            return Err(forbidden(
                res,
                name,
                &format!("node {node:?} is not allowed to modify taints"),
            ));
        }
    }
    Ok(())
}

/// The plugin in the admission chain: creates and updates by nodes.
pub struct NodeRestriction;

#[async_trait::async_trait]
impl AdmissionPlugin for NodeRestriction {
    fn name(&self) -> &'static str {
        "NodeRestriction"
    }

    fn handles(&self, a: &Admitted<'_>) -> bool {
        matches!(a.op, Operation::Create | Operation::Update) && node_of(a.user()).is_some()
    }

    async fn mutate(
        &self,
        cx: &dyn AdmissionCtx,
        a: &Admitted<'_>,
        obj: &mut Value,
    ) -> ApiResult<()> {
        match a.old {
            None => admit_create(cx, a.res, obj, a.user()).await,
            Some(old) => admit_update(a.res, a.sub.as_str(), old, obj, a.user()),
        }
    }
}

/// Admission of an object a node creates.
async fn admit_create(
    cx: &dyn AdmissionCtx,
    res: &'static ResourceInfo,
    obj: &Value,
    who: Option<&Identity>,
) -> ApiResult<()> {
    let Some(node) = node_of(who) else {
        return Ok(());
    };
    let name = meta_str(obj, "name");
    match (res.group, res.plural) {
        ("", "nodes") => check_node_object(res, node, None, obj),
        ("", "pods") => admit_mirror_pod(cx, res, node, obj).await,
        ("coordination.k8s.io", "leases") => check_lease(res, node, obj),
        ("storage.k8s.io", "csinodes") if name != node => Err(forbidden(
            res,
            name,
            "can only access CSINode with the same name as the requesting node",
        )),
        _ => Ok(()),
    }
}

/// The Lease skiff's agents elect their ServiceLB with (k3s runs ServiceLB
/// in its server; skiff runs it in whichever agent holds this Lease).
const SERVICE_LB_LEASE: (&str, &str) = ("kube-system", "skiff-service-lb");

/// A node writes only its own Lease in kube-node-lease (and skiff's
/// ServiceLB Lease, which RBAC grants to nodes).
fn check_lease(res: &ResourceInfo, node: &str, lease: &Value) -> ApiResult<()> {
    let (ns, name) = (meta_str(lease, "namespace"), meta_str(lease, "name"));
    if (ns, name) == SERVICE_LB_LEASE {
        return Ok(());
    }
    if ns != "kube-node-lease" {
        return Err(forbidden(
            res,
            name,
            "can only access leases in the \"kube-node-lease\" system namespace",
        ));
    }
    if name != node {
        return Err(forbidden(
            res,
            name,
            "can only access node lease with the same name as the requesting node",
        ));
    }
    Ok(())
}

async fn admit_mirror_pod(
    cx: &dyn AdmissionCtx,
    res: &'static ResourceInfo,
    node: &str,
    pod: &Value,
) -> ApiResult<()> {
    let name = meta_str(pod, "name");
    let deny = |m: String| Err(forbidden(res, name, &m));
    let mirror = pod
        .pointer("/metadata/annotations")
        .and_then(|a| a.get(MIRROR))
        .is_some();
    if !mirror {
        return deny(format!(
            "pod does not have {MIRROR:?} annotation, node {node:?} can only create mirror pods"
        ));
    }
    if pod.pointer("/spec/nodeName").and_then(Value::as_str) != Some(node) {
        return deny(format!(
            "node {node:?} can only create pods with spec.nodeName set to itself"
        ));
    }
    let owners = pod
        .pointer("/metadata/ownerReferences")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    if owners.len() > 1 {
        return deny(format!(
            "node {node:?} can only create pods with a single owner reference set to itself"
        ));
    }
    let Some(owner) = owners.first() else {
        return deny(format!(
            "node {node:?} can only create pods with an owner reference set to itself"
        ));
    };
    let s = |f: &str| owner.get(f).and_then(Value::as_str).unwrap_or("");
    if s("apiVersion") != "v1" || s("kind") != "Node" || s("name") != node {
        return deny(format!(
            "node {node:?} can only create pods with an owner reference set to itself"
        ));
    }
    if owner.get("controller").and_then(Value::as_bool) != Some(true) {
        return deny(format!(
            "node {node:?} can only create pods with a controller owner reference set to itself"
        ));
    }
    if owner.get("blockOwnerDeletion").and_then(Value::as_bool) == Some(true) {
        return deny(format!(
            "node {node:?} must not set blockOwnerDeletion on an owner reference"
        ));
    }
    let current = cx.get(lookup("", "nodes"), None, node).await?;
    if meta_str(&current, "uid") != s("uid") {
        return deny(format!(
            "the UID in the owner reference ({}) does not match the current node ({})",
            s("uid"),
            meta_str(&current, "uid")
        ));
    }
    if pod
        .pointer("/spec/serviceAccountName")
        .and_then(Value::as_str)
        .is_some_and(|s| !s.is_empty())
    {
        return deny(format!(
            "node {node:?} can not create pods that reference a service account"
        ));
    }
    for r in pod_refs(pod) {
        let what = match r {
            Ref::Secret(..) => "secrets",
            Ref::ConfigMap(..) => "configmaps",
            Ref::Pvc(..) => "persistentvolumeclaims",
            // `pod_refs` names the default account when none is set.
            Ref::ServiceAccount(..) => continue,
        };
        return deny(format!(
            "node {node:?} can not create pods that reference {what}"
        ));
    }
    Ok(())
}

/// Admission of an update a node makes (`sub`: the subresource).
fn admit_update(
    res: &ResourceInfo,
    sub: Option<&str>,
    old: &Value,
    new: &Value,
    who: Option<&Identity>,
) -> ApiResult<()> {
    let Some(node) = node_of(who) else {
        return Ok(());
    };
    match (res.group, res.plural, sub) {
        ("", "nodes", None | Some("status")) => check_node_object(res, node, Some(old), new),
        ("coordination.k8s.io", "leases", None) => check_lease(res, node, old),
        ("", "pods", Some("status")) => {
            if old.pointer("/spec/nodeName").and_then(Value::as_str) != Some(node) {
                return Err(forbidden(
                    res,
                    meta_str(old, "name"),
                    &format!(
                        "node {node:?} can only update pod status for pods with spec.nodeName set to itself"
                    ),
                ));
            }
            Ok(())
        }
        _ => Ok(()),
    }
}

/// Admission of requests a node makes that carry no object to inspect:
/// deleting pods or Nodes, evicting pods (run after authorization).
pub async fn admit_request(cx: &dyn AdmissionCtx, a: &Attributes) -> ApiResult<()> {
    let Some(node) = node_identity(&a.user, &a.groups).filter(|n| !n.is_empty()) else {
        return Ok(());
    };
    if !a.resource_request || !a.api_group.is_empty() {
        return Ok(());
    }
    match (a.verb.as_str(), a.resource.as_str(), a.subresource.as_str()) {
        ("delete", "nodes", "") if a.name != node => Err(forbidden(
            lookup("", "nodes"),
            &a.name,
            &format!("node {node:?} is not allowed to modify node {:?}", a.name),
        )),
        ("delete", "pods", "") | ("create", "pods", "eviction") if !a.name.is_empty() => {
            let res = lookup("", "pods");
            let pod = cx.get(res, Some(&a.namespace), &a.name).await?;
            if pod.pointer("/spec/nodeName").and_then(Value::as_str) == Some(node) {
                return Ok(());
            }
            let what = if a.verb == "delete" {
                "delete"
            } else {
                "evict"
            };
            Err(forbidden(
                res,
                &a.name,
                &format!("node {node:?} can only {what} pods with spec.nodeName set to itself"),
            ))
        }
        _ => Ok(()),
    }
}

/// A TokenRequest by a node must bind the token to a pod on that node.
pub async fn admit_token_request(
    cx: &dyn AdmissionCtx,
    sa: &str,
    ns: &str,
    tr: &Value,
    who: Option<&Identity>,
) -> ApiResult<()> {
    let Some(node) = node_of(who) else {
        return Ok(());
    };
    let res = lookup("", "serviceaccounts");
    let deny = |m: &str| Err(forbidden(res, sa, m));
    let Some(r) = tr.pointer("/spec/boundObjectRef").filter(|r| r.is_object()) else {
        return deny("node requested token not bound to a pod");
    };
    if r.get("kind").and_then(Value::as_str) != Some("Pod") {
        return deny("node requested token not bound to a pod");
    }
    let pname = r.get("name").and_then(Value::as_str).unwrap_or("");
    let uid = r.get("uid").and_then(Value::as_str).unwrap_or("");
    let pod = cx.get(lookup("", "pods"), Some(ns), pname).await?;
    if pod.pointer("/spec/nodeName").and_then(Value::as_str) != Some(node) {
        return deny("node requested token bound to a pod scheduled on a different node");
    }
    if uid != meta_str(&pod, "uid") {
        return deny(&format!(
            "the UID in the bound object reference ({uid}) does not match the UID in record. The object might have been deleted and then recreated"
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn kubelet_labels_are_allowed_and_restricted_ones_are_not() {
        for l in [
            "kubernetes.io/hostname",
            "node.kubernetes.io/instance-type",
            "kubelet.kubernetes.io/x",
            "foo.node.kubernetes.io/y",
            "example.com/anything",
            "plain",
            "topology.kubernetes.io/zone",
        ] {
            assert!(label_allowed(l), "{l}");
        }
        for l in [
            "node-restriction.kubernetes.io/x",
            "a.node-restriction.kubernetes.io/x",
            "node-role.kubernetes.io/control-plane",
            "kubernetes.io/other",
            "k8s.io/x",
            "foo.k8s.io/x",
        ] {
            assert!(!label_allowed(l), "{l}");
        }
    }

    #[test]
    fn only_changed_labels_count() {
        let old = json!({"metadata": {"labels": {"node-role.kubernetes.io/x": "", "a": "1"}}});
        let new =
            json!({"metadata": {"labels": {"node-role.kubernetes.io/x": "", "a": "2", "b": "3"}}});
        assert_eq!(modified_labels(Some(&old), &new), vec!["a", "b"]);
        let gone = json!({"metadata": {}});
        assert_eq!(
            modified_labels(Some(&old), &gone),
            vec!["a", "node-role.kubernetes.io/x"]
        );
    }
}
