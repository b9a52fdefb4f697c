//! What the workload controllers share, after Kubernetes'
//! `controller/history` and `controller.GetPodFromTemplate`: the hash that
//! names a pod template's revision, and the pod a controller makes from its
//! template. Deployments, ReplicaSets, DaemonSets and StatefulSets all use
//! these, so none of them imports another.

use k8s_openapi::api::core::v1::{Pod, PodTemplateSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};

/// The label a Deployment puts on its ReplicaSets and their pods.
pub const POD_TEMPLATE_HASH: &str = "pod-template-hash";
/// The label DaemonSets and StatefulSets put on their pods: the revision
/// (ControllerRevision) the pod was made from.
pub const CONTROLLER_REVISION_HASH: &str = "controller-revision-hash";

/// `t` without the `pod-template-hash` label (what two templates are
/// compared by).
pub fn without_template_hash(t: &PodTemplateSpec) -> PodTemplateSpec {
    let mut t = t.clone();
    if let Some(l) = t.metadata.as_mut().and_then(|m| m.labels.as_mut()) {
        l.remove(POD_TEMPLATE_HASH);
    }
    t
}

/// The hash of a pod template (and the collision count), as a short
/// name-safe string: FNV-1a over the template's JSON without the hash label,
/// written in the alphabet Kubernetes uses for generated names.
pub fn template_hash(t: &PodTemplateSpec, collision_count: Option<i32>) -> String {
    let mut bytes = serde_json::to_vec(&without_template_hash(t)).unwrap_or_default();
    if let Some(c) = collision_count {
        bytes.extend_from_slice(&c.to_le_bytes());
    }
    let mut h: u32 = 0x811c9dc5;
    for b in bytes {
        h ^= b as u32;
        h = h.wrapping_mul(0x01000193);
    }
    const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
    let mut s = String::new();
    let mut v = h as u64;
    while v > 0 {
        s.push(ALPHABET[(v % ALPHABET.len() as u64) as usize] as char);
        v /= ALPHABET.len() as u64;
    }
    if s.is_empty() {
        s.push('b');
    }
    s
}

/// The owner reference a controller puts on what it makes.
pub fn controller_ref(api_version: &str, kind: &str, owner: &ObjectMeta) -> OwnerReference {
    OwnerReference {
        api_version: api_version.to_string(),
        kind: kind.to_string(),
        name: owner.name.clone().unwrap_or_default(),
        uid: owner.uid.clone().unwrap_or_default(),
        controller: Some(true),
        block_owner_deletion: Some(true),
    }
}

/// The pod a controller (`kind` in `api_version`) makes from `template`:
/// the template's metadata, named after the owner by `generateName`, in the
/// owner's namespace, controlled by it.
pub fn pod_from_template(
    template: &PodTemplateSpec,
    owner: &ObjectMeta,
    api_version: &str,
    kind: &str,
) -> Pod {
    let mut meta = template.metadata.clone().unwrap_or_default();
    let owner_name = owner.name.clone().unwrap_or_default();
    meta.name = None;
    meta.resource_version = None;
    meta.uid = None;
    meta.generate_name = Some(format!("{owner_name}-"));
    meta.namespace = owner.namespace.clone();
    meta.owner_references = Some(vec![controller_ref(api_version, kind, owner)]);
    meta.finalizers = None;
    Pod {
        metadata: meta,
        spec: template.spec.clone(),
        status: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn template(v: serde_json::Value) -> PodTemplateSpec {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn the_hash_ignores_its_own_label_and_follows_the_template_and_collisions() {
        let t = template(
            json!({"metadata": {"labels": {"app": "a"}}, "spec": {"containers": [{"name": "c", "image": "i:1"}]}}),
        );
        let labelled = template(
            json!({"metadata": {"labels": {"app": "a", "pod-template-hash": "zzz"}}, "spec": {"containers": [{"name": "c", "image": "i:1"}]}}),
        );
        let changed = template(
            json!({"metadata": {"labels": {"app": "a"}}, "spec": {"containers": [{"name": "c", "image": "i:2"}]}}),
        );
        assert_eq!(template_hash(&t, None), template_hash(&labelled, None));
        assert_ne!(template_hash(&t, None), template_hash(&changed, None));
        assert_ne!(template_hash(&t, None), template_hash(&t, Some(1)));
        let h = template_hash(&t, Some(0));
        assert!(
            !h.is_empty()
                && h.bytes()
                    .all(|b| b"bcdfghjklmnpqrstvwxz2456789".contains(&b)),
            "{h}"
        );
    }

    #[test]
    fn a_pod_from_a_template_belongs_to_its_owner() {
        let t = template(
            json!({"metadata": {"name": "ignored", "labels": {"app": "a"}, "finalizers": ["x"]}, "spec": {"containers": [{"name": "c", "image": "i:1"}]}}),
        );
        let owner: ObjectMeta =
            serde_json::from_value(json!({"name": "web", "namespace": "ns", "uid": "u1"})).unwrap();
        let p = pod_from_template(&t, &owner, "apps/v1", "ReplicaSet");
        assert_eq!(p.metadata.name, None);
        assert_eq!(p.metadata.generate_name.as_deref(), Some("web-"));
        assert_eq!(p.metadata.namespace.as_deref(), Some("ns"));
        assert_eq!(p.metadata.finalizers, None);
        assert_eq!(p.metadata.labels.unwrap()["app"], "a");
        let r = &p.metadata.owner_references.unwrap()[0];
        assert_eq!(
            (
                r.kind.as_str(),
                r.name.as_str(),
                r.uid.as_str(),
                r.controller
            ),
            ("ReplicaSet", "web", "u1", Some(true))
        );
    }
}
