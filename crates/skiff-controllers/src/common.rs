//! What the controllers share: label selector matching, owner references,
//! adoption and release, pod readiness and availability, expectations
//! (what a controller has asked for and not yet seen), error helpers.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::ControllerRevision;
use k8s_openapi::api::core::v1::{Pod, PodTemplateSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta, OwnerReference};
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::{Resource, ResourceExt};
use serde_json::json;

use crate::framework::Key;
use crate::{Ctx, Error};

/// Whether `labels` satisfy a LabelSelector (an empty selector matches
/// everything, as Kubernetes' LabelSelectorAsSelector does), by the one
/// label-selector matcher.
pub fn selector_matches(sel: &LabelSelector, labels: &BTreeMap<String, String>) -> bool {
    skiff_helpers::scheduling::Selector::from_label_selector(Some(sel)).matches(Some(labels))
}

/// Whether a selector is empty (selects everything).
pub fn selector_is_empty(sel: &LabelSelector) -> bool {
    sel.match_labels
        .as_ref()
        .map(|m| m.is_empty())
        .unwrap_or(true)
        && sel
            .match_expressions
            .as_ref()
            .map(|m| m.is_empty())
            .unwrap_or(true)
}

/// The controller owner reference of an object, if any.
pub fn controller_of(meta: &ObjectMeta) -> Option<&OwnerReference> {
    meta.owner_references
        .iter()
        .flatten()
        .find(|r| r.controller == Some(true))
}

pub use skiff_helpers::workloads::controller_ref;

pub fn is_terminating(meta: &ObjectMeta) -> bool {
    meta.deletion_timestamp.is_some()
}

pub fn pod_is_active(p: &Pod) -> bool {
    let phase = p
        .status
        .as_ref()
        .and_then(|s| s.phase.as_deref())
        .unwrap_or("");
    phase != "Succeeded" && phase != "Failed" && !is_terminating(&p.metadata)
}

/// The time since which a pod has been Ready, if it is.
pub fn ready_since(p: &Pod) -> Option<k8s_openapi::jiff::Timestamp> {
    let c = p
        .status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == "Ready")?;
    if c.status != "True" {
        return None;
    }
    Some(
        c.last_transition_time
            .as_ref()
            .map(|t| t.0)
            .unwrap_or(k8s_openapi::jiff::Timestamp::UNIX_EPOCH),
    )
}

pub fn pod_ready(p: &Pod) -> bool {
    ready_since(p).is_some()
}

/// Ready for at least `min_ready_seconds`.
pub fn pod_available(p: &Pod, min_ready_seconds: i32, now: k8s_openapi::jiff::Timestamp) -> bool {
    match ready_since(p) {
        None => false,
        Some(_) if min_ready_seconds <= 0 => true,
        Some(t) => {
            t + k8s_openapi::jiff::SignedDuration::from_secs(min_ready_seconds as i64) <= now
        }
    }
}

/// What a controller asked the API for and has not yet seen in its cache,
/// so a second reconcile does not create or delete the same pods again
/// (Kubernetes' ControllerExpectations): creations are counted before they
/// are sent and lowered as the watch shows new pods (or a create fails);
/// deletions are tracked by name. Entries expire, so a lost watch event
/// cannot block a controller forever.
#[derive(Default)]
pub struct Expectations {
    inner: Mutex<HashMap<String, Pending>>,
}

struct Pending {
    adds: i64,
    deletes: HashSet<String>,
    since: Instant,
}

const EXPECTATION_TTL: Duration = Duration::from_secs(30);

impl Expectations {
    fn with(&self, key: &str, f: impl FnOnce(&mut Pending)) {
        let mut m = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        let p = m.entry(key.to_string()).or_insert_with(|| Pending {
            adds: 0,
            deletes: HashSet::new(),
            since: Instant::now(),
        });
        f(p);
    }
    /// Before sending `n` creations for `key`.
    pub fn expect_creations(&self, key: &str, n: usize) {
        self.with(key, |p| {
            p.adds += n as i64;
            p.since = Instant::now();
        });
    }
    /// A creation was seen in the cache, or failed.
    pub fn creation_observed(&self, key: &str) {
        let mut m = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(p) = m.get_mut(key) {
            p.adds = (p.adds - 1).max(0);
        }
    }
    /// Before deleting `name` for `key`.
    pub fn expect_delete(&self, key: &str, name: &str) {
        self.with(key, |p| {
            p.deletes.insert(name.to_string());
            p.since = Instant::now();
        });
    }
    /// A deletion was seen in the cache (or the delete failed).
    pub fn deletion_observed(&self, key: &str, name: &str) {
        let mut m = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(p) = m.get_mut(key) {
            p.deletes.remove(name);
        }
    }
    /// Whether everything expected for `key` has been seen (or expired).
    pub fn satisfied(&self, key: &str) -> bool {
        let mut m = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        let Some(p) = m.get(key) else {
            return true;
        };
        if (p.adds <= 0 && p.deletes.is_empty()) || p.since.elapsed() > EXPECTATION_TTL {
            m.remove(key);
            return true;
        }
        false
    }
    pub fn forget(&self, key: &str) {
        self.inner
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(key);
    }
    /// Lowers the expectations of the controller (of `kind`) of a pod
    /// from a cache change.
    pub fn observe_pod_change(&self, kind: &str, old: Option<&Pod>, new: Option<&Pod>) {
        let p = match (old, new) {
            (_, Some(p)) | (Some(p), None) => p,
            (None, None) => return,
        };
        let Some(r) = controller_of(&p.metadata) else {
            return;
        };
        if r.kind != kind {
            return;
        }
        let key = format!(
            "{}/{}",
            p.metadata.namespace.as_deref().unwrap_or(""),
            r.name
        );
        let name = p.metadata.name.as_deref().unwrap_or("");
        match (old, new) {
            (None, Some(n)) => {
                self.creation_observed(&key);
                if is_terminating(&n.metadata) {
                    self.deletion_observed(&key, name);
                }
            }
            (Some(_), None) => self.deletion_observed(&key, name),
            (Some(o), Some(n)) => {
                if !is_terminating(&o.metadata) && is_terminating(&n.metadata) {
                    self.deletion_observed(&key, name);
                }
            }
            (None, None) => {}
        }
    }
}

/// Whether an API error is a 404.
pub fn is_not_found(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(a) if a.code == 404)
}

/// Whether an API error is a 409 (conflict or already exists).
pub fn is_conflict(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(a) if a.code == 409)
}

/// The key of the controller (of `kind`) of `meta`, if it has one.
pub fn owner_key(kind: &str, meta: &ObjectMeta) -> Option<Key> {
    let r = controller_of(meta).filter(|r| r.kind == kind)?;
    Some(match meta.namespace.as_deref() {
        Some(ns) if !ns.is_empty() => format!("{ns}/{}", r.name),
        _ => r.name.clone(),
    })
}

/// The keys of the controller (of `kind`) of an object before and after a
/// change (kube-runtime's `trigger_owners`).
pub fn owner_keys<K: Resource>(kind: &str, old: Option<&K>, new: Option<&K>) -> Vec<Key> {
    [old, new]
        .into_iter()
        .flatten()
        .filter_map(|o| owner_key(kind, o.meta()))
        .collect()
}

/// The phase of a pod ("" when unknown).
pub fn phase(p: &Pod) -> &str {
    p.status
        .as_ref()
        .and_then(|s| s.phase.as_deref())
        .unwrap_or("")
}

/// Whether a pod is assigned to a node.
pub fn is_scheduled(p: &Pod) -> bool {
    p.spec
        .as_ref()
        .and_then(|s| s.node_name.as_deref())
        .map(|n| !n.is_empty())
        .unwrap_or(false)
}

/// Adopts matching orphans and releases owned objects whose labels no
/// longer match, returning what `owner` controls afterwards (what the
/// ControllerRefManager of Kubernetes does, over a cache).
pub async fn claim<K>(
    api_for: impl Fn(&str) -> Api<K>,
    owner: &ObjectMeta,
    owner_api_version: &str,
    owner_kind: &str,
    matches: impl Fn(&BTreeMap<String, String>) -> bool,
    owned: Vec<Arc<K>>,
    orphans: Vec<Arc<K>>,
) -> Vec<Arc<K>>
where
    K: Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let uid = owner.uid.clone().unwrap_or_default();
    let mut out = vec![];
    let empty = BTreeMap::new();
    for o in owned {
        let m = o.meta();
        if controller_of(m).map(|r| r.uid != uid).unwrap_or(true) {
            continue;
        }
        if matches(m.labels.as_ref().unwrap_or(&empty)) {
            out.push(o);
            continue;
        }
        if is_terminating(m) {
            continue;
        }
        // Release: keep the other owners, drop ours.
        let refs: Vec<OwnerReference> = m
            .owner_references
            .iter()
            .flatten()
            .filter(|r| r.uid != uid)
            .cloned()
            .collect();
        let refs = if refs.is_empty() {
            serde_json::Value::Null
        } else {
            json!(refs)
        };
        let patch = json!({"metadata": {"ownerReferences": refs, "uid": m.uid}});
        let ns = m.namespace.clone().unwrap_or_default();
        let name = m.name.clone().unwrap_or_default();
        if let Err(e) = api_for(&ns)
            .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            tracing::debug!(name, error = %e, "releasing failed");
        }
    }
    if is_terminating(owner) {
        return out;
    }
    for o in orphans {
        let m = o.meta();
        if controller_of(m).is_some()
            || is_terminating(m)
            || !matches(m.labels.as_ref().unwrap_or(&empty))
        {
            continue;
        }
        let mut refs: Vec<OwnerReference> = m.owner_references.clone().unwrap_or_default();
        refs.push(controller_ref(owner_api_version, owner_kind, owner));
        let patch = json!({"metadata": {"ownerReferences": refs, "uid": m.uid}});
        let ns = m.namespace.clone().unwrap_or_default();
        let name = m.name.clone().unwrap_or_default();
        match api_for(&ns)
            .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            Ok(adopted) => out.push(Arc::new(adopted)),
            Err(e) => tracing::debug!(name, error = %e, "adoption failed"),
        }
    }
    out
}

/// A string-or-int (`5`, `"25%"`) resolved against `total`, rounding up
/// or down; a malformed value is an error.
pub fn scaled_value(
    v: &k8s_openapi::apimachinery::pkg::util::intstr::IntOrString,
    total: i32,
    round_up: bool,
) -> Result<i32, String> {
    use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
    match v {
        IntOrString::Int(i) => Ok(*i),
        IntOrString::String(s) => {
            let Some(p) = s.strip_suffix('%') else {
                return Err(format!("invalid value for IntOrString: {s:?}"));
            };
            let pct: i64 = p
                .parse()
                .map_err(|_| format!("invalid value for IntOrString: {s:?}"))?;
            let x = pct * total as i64;
            let r = if round_up {
                (x + 99).div_euclid(100)
            } else {
                x.div_euclid(100)
            };
            Ok(r.clamp(i32::MIN as i64, i32::MAX as i64) as i32)
        }
    }
}

/// A merge patch of `status` through the status subresource; a vanished
/// object is not an error.
pub async fn patch_status<K>(
    api: &Api<K>,
    name: &str,
    status: serde_json::Value,
) -> Result<(), crate::Error>
where
    K: Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    match api
        .patch_status(
            name,
            &PatchParams::default(),
            &Patch::Merge(&json!({ "status": status })),
        )
        .await
    {
        Ok(_) => Ok(()),
        Err(e) if is_not_found(&e) => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// A resource quantity (`500m`, `1Gi`) in units (cores, bytes), as a float
/// for ratios.
pub fn quantity_units(q: &str) -> Option<f64> {
    skiff_helpers::Quantity::parse(q).ok().map(|q| q.as_f64())
}

/// Now, as the API's timestamps.
pub fn now() -> k8s_openapi::jiff::Timestamp {
    k8s_openapi::jiff::Timestamp::now()
}

/// `t + secs` seconds.
pub fn plus(t: k8s_openapi::jiff::Timestamp, secs: i64) -> k8s_openapi::jiff::Timestamp {
    t.checked_add(k8s_openapi::jiff::SignedDuration::from_secs(secs))
        .unwrap_or(t)
}

/// How long from now until `t` (zero if past).
pub fn until(t: k8s_openapi::jiff::Timestamp) -> Duration {
    let d = t.duration_since(now());
    if d.is_negative() {
        Duration::ZERO
    } else {
        Duration::try_from(d).unwrap_or(Duration::ZERO)
    }
}

/// Whether a node satisfies a pod's nodeSelector and required node
/// affinity (labels, and `metadata.name` through matchFields), by the
/// scheduler's own matcher.
pub fn node_fits(
    node: &k8s_openapi::api::core::v1::Node,
    spec: &k8s_openapi::api::core::v1::PodSpec,
) -> bool {
    skiff_helpers::scheduling::RequiredNodeAffinity::of(Some(spec)).matches(
        node.metadata.name.as_deref().unwrap_or(""),
        node.metadata.labels.as_ref(),
    )
}

/// Records a template as a ControllerRevision named `<owner>-<hash>` and
/// returns its revision number (a template seen before becomes the newest
/// revision again, as a rollback does).
pub async fn ensure_revision(
    ctx: &Ctx,
    owner: &ObjectMeta,
    kind: &str,
    hash: &str,
    template: &PodTemplateSpec,
) -> Result<i64, Error> {
    let uid = owner.uid.clone().unwrap_or_default();
    let ns = owner.namespace.clone().unwrap_or_default();
    let name = format!("{}-{hash}", owner.name.as_deref().unwrap_or(""));
    let revisions = ctx.caches.controller_revisions.owned_by(&uid);
    let max = revisions.iter().map(|r| r.revision).max().unwrap_or(0);
    let api: Api<ControllerRevision> = Api::namespaced(ctx.client.clone(), &ns);
    if let Some(r) = revisions.iter().find(|r| r.name_any() == name) {
        if r.revision < max {
            let patch = json!({"revision": max + 1});
            api.patch(
                &name,
                &kube::api::PatchParams::default(),
                &kube::api::Patch::Merge(&patch),
            )
            .await?;
            return Ok(max + 1);
        }
        return Ok(r.revision);
    }
    let mut t = serde_json::to_value(template)?;
    t["$patch"] = json!("replace");
    let labels = template
        .metadata
        .as_ref()
        .and_then(|m| m.labels.clone())
        .unwrap_or_default();
    let cr: ControllerRevision = serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": ns, "labels": labels,
            "ownerReferences": [controller_ref("apps/v1", kind, owner)]},
        "data": {"spec": {"template": t}},
        "revision": max + 1,
    }))?;
    match api.create(&PostParams::default(), &cr).await {
        Ok(_) => Ok(max + 1),
        Err(e) if is_conflict(&e) => Ok(max + 1),
        Err(e) => Err(e.into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelectorRequirement;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn selectors_match_labels_and_expressions_like_kubernetes() {
        let sel = LabelSelector {
            match_labels: Some(labels(&[("app", "web")])),
            match_expressions: Some(vec![LabelSelectorRequirement {
                key: "tier".into(),
                operator: "NotIn".into(),
                values: Some(vec!["db".into()]),
            }]),
        };
        assert!(selector_matches(&sel, &labels(&[("app", "web")])));
        assert!(selector_matches(
            &sel,
            &labels(&[("app", "web"), ("tier", "front")])
        ));
        assert!(!selector_matches(
            &sel,
            &labels(&[("app", "web"), ("tier", "db")])
        ));
        assert!(!selector_matches(&sel, &labels(&[("app", "api")])));
        assert!(selector_matches(&LabelSelector::default(), &labels(&[])));
    }

    #[test]
    fn expectations_hold_until_the_cache_shows_the_change() {
        let e = Expectations::default();
        e.expect_creations("ns/rs", 2);
        assert!(!e.satisfied("ns/rs"));
        e.creation_observed("ns/rs");
        assert!(!e.satisfied("ns/rs"));
        e.creation_observed("ns/rs");
        assert!(e.satisfied("ns/rs"));
        e.expect_delete("ns/rs", "rs-old");
        assert!(!e.satisfied("ns/rs"));
        e.deletion_observed("ns/rs", "rs-old");
        assert!(e.satisfied("ns/rs"));
    }

    #[test]
    fn a_pod_watch_event_lowers_its_controllers_expectations() {
        let e = Expectations::default();
        let pod: Pod = serde_json::from_value(json!({"metadata": {"name": "rs-a", "namespace": "ns",
            "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "rs", "uid": "u", "controller": true}]}})).unwrap();
        e.expect_creations("ns/rs", 1);
        e.observe_pod_change("Job", None, Some(&pod));
        assert!(!e.satisfied("ns/rs"), "another kind's pod does not count");
        e.observe_pod_change("ReplicaSet", None, Some(&pod));
        assert!(e.satisfied("ns/rs"));
        e.expect_delete("ns/rs", "rs-a");
        e.observe_pod_change("ReplicaSet", Some(&pod), None);
        assert!(e.satisfied("ns/rs"));
    }
}
