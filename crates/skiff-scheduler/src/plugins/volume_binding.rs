//! VolumeBinding: pods go where their persistent volumes can be, as
//! kube-scheduler's plugin of that name decides.
//!
//! PreFilter sorts the pod's claims: a missing claim, a claim being
//! deleted and an unbound claim of an `Immediate` class (its binding is
//! the binder's job, not the scheduler's) reject the pod on every node.
//! Filter checks each node: a bound claim's volume must exist and its
//! `nodeAffinity` must match the node; an unbound `WaitForFirstConsumer`
//! claim needs an Available volume reachable from the node or a
//! provisioner whose class's `allowedTopologies` admit the node (and, for
//! skiff's local-path provisioner, a node that publishes local storage).
//! PreBind writes the chosen node to those claims as the annotation
//! `volume.kubernetes.io/selected-node`, which the binder and the
//! provisioner read. It scores nothing, as Kubernetes' default profile.
//!
//! The claims, volumes and classes are watched by the scheduler into
//! [`Volumes`] (each kept as the few fields read here).

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};

use futures::future::BoxFuture;
use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use k8s_openapi::api::storage::v1::StorageClass;
use kube::api::{Api, Patch, PatchParams};
use serde_json::json;

use crate::cache::Snapshot;
use crate::framework::{
    ClusterEvent, CycleState, FilterPlugin, Plugin, PreBindPlugin, PreFilterPlugin,
    PreFilterResult, ReservePlugin, Status,
};
use crate::quantity;
use crate::types::{Labels, NodeInfo, NodeTerm, PodInfo, Selector};

pub const NAME: &str = "VolumeBinding";
pub const ERR_UNBOUND_IMMEDIATE: &str = "pod has unbound immediate PersistentVolumeClaims";
pub const ERR_NODE_CONFLICT: &str = "node(s) had volume node affinity conflict";
pub const ERR_BIND_CONFLICT: &str = "node(s) didn't find available persistent volumes to bind";
pub const ERR_PV_NOT_EXIST: &str =
    "node(s) unavailable due to one or more pvc(s) bound to non-existent pv(s)";
pub const ERR_NOT_ENOUGH_SPACE: &str = "node(s) did not have enough free storage";
/// The claim annotation naming the node the scheduler chose.
pub const SELECTED_NODE: &str = "volume.kubernetes.io/selected-node";
/// The provisioner of classes whose volumes are all made by hand.
const NO_PROVISIONER: &str = "kubernetes.io/no-provisioner";
const STATE_KEY: &str = "PreFilterVolumeBinding";

// ---- what the scheduler keeps of claims, volumes and classes ------------------------

/// A PersistentVolumeClaim, as far as scheduling reads it.
#[derive(Debug, Clone, Default)]
pub struct Claim {
    pub namespace: String,
    pub name: String,
    pub uid: String,
    pub deleting: bool,
    /// The class (the beta annotation wins, as in Kubernetes); "" for none.
    pub class: String,
    pub volume_name: String,
    pub access_modes: Vec<String>,
    /// Requested bytes.
    pub request: i64,
    pub selector: Option<Selector>,
    pub volume_mode: String,
    pub selected_node: Option<String>,
    /// The uid of the controlling owner (a generic ephemeral volume's pod).
    pub controller: Option<String>,
}

impl Claim {
    pub fn of(c: &PersistentVolumeClaim) -> Claim {
        let spec = c.spec.as_ref();
        let ann = c.metadata.annotations.as_ref();
        let class = ann
            .and_then(|a| a.get("volume.beta.kubernetes.io/storage-class"))
            .cloned()
            .or_else(|| spec.and_then(|s| s.storage_class_name.clone()))
            .unwrap_or_default();
        Claim {
            namespace: c.metadata.namespace.clone().unwrap_or_default(),
            name: c.metadata.name.clone().unwrap_or_default(),
            uid: c.metadata.uid.clone().unwrap_or_default(),
            deleting: c.metadata.deletion_timestamp.is_some(),
            class,
            volume_name: spec.and_then(|s| s.volume_name.clone()).unwrap_or_default(),
            access_modes: spec
                .and_then(|s| s.access_modes.clone())
                .unwrap_or_default(),
            request: spec
                .and_then(|s| s.resources.as_ref())
                .and_then(|r| r.requests.as_ref())
                .and_then(|r| r.get("storage"))
                .map(|q| quantity::units(&q.0))
                .unwrap_or(0),
            selector: spec
                .and_then(|s| s.selector.as_ref())
                .map(|s| Selector::from_label_selector(Some(s))),
            volume_mode: spec
                .and_then(|s| s.volume_mode.clone())
                .unwrap_or_else(|| "Filesystem".into()),
            selected_node: ann.and_then(|a| a.get(SELECTED_NODE)).cloned(),
            controller: c
                .metadata
                .owner_references
                .iter()
                .flatten()
                .find(|o| o.controller == Some(true))
                .map(|o| o.uid.clone()),
        }
    }
}

/// A PersistentVolume, as far as scheduling reads it.
#[derive(Debug, Clone, Default)]
pub struct Volume {
    pub name: String,
    pub class: String,
    /// `spec.nodeAffinity.required` terms (`None`: any node).
    pub node_terms: Option<Vec<NodeTerm>>,
    /// `spec.claimRef` as (namespace, name, uid).
    pub claim_ref: Option<(String, String, String)>,
    pub phase: String,
    pub capacity: i64,
    pub access_modes: Vec<String>,
    pub volume_mode: String,
    pub labels: Labels,
    pub deleting: bool,
}

impl Volume {
    pub fn of(v: &PersistentVolume) -> Volume {
        let spec = v.spec.as_ref();
        Volume {
            name: v.metadata.name.clone().unwrap_or_default(),
            class: spec
                .and_then(|s| s.storage_class_name.clone())
                .unwrap_or_default(),
            node_terms: spec
                .and_then(|s| s.node_affinity.as_ref())
                .and_then(|a| a.required.as_ref())
                .map(|r| {
                    r.node_selector_terms
                        .iter()
                        .map(NodeTerm::compile)
                        .collect()
                }),
            claim_ref: spec.and_then(|s| s.claim_ref.as_ref()).map(|r| {
                (
                    r.namespace.clone().unwrap_or_default(),
                    r.name.clone().unwrap_or_default(),
                    r.uid.clone().unwrap_or_default(),
                )
            }),
            phase: v
                .status
                .as_ref()
                .and_then(|s| s.phase.clone())
                .unwrap_or_default(),
            capacity: spec
                .and_then(|s| s.capacity.as_ref())
                .and_then(|c| c.get("storage"))
                .map(|q| quantity::units(&q.0))
                .unwrap_or(0),
            access_modes: spec
                .and_then(|s| s.access_modes.clone())
                .unwrap_or_default(),
            volume_mode: spec
                .and_then(|s| s.volume_mode.clone())
                .unwrap_or_else(|| "Filesystem".into()),
            labels: v.metadata.labels.clone().unwrap_or_default(),
            deleting: v.metadata.deletion_timestamp.is_some(),
        }
    }

    /// Whether the volume's node affinity admits `node` (Kubernetes'
    /// CheckNodeAffinity: any one required term must match).
    pub fn reachable_from(&self, node: &NodeInfo) -> bool {
        match &self.node_terms {
            None => true,
            Some(terms) => {
                let labels = node.node.as_ref().and_then(|n| n.metadata.labels.as_ref());
                terms.iter().any(|t| t.matches(&node.name, labels))
            }
        }
    }

    fn bound_to(&self, c: &Claim) -> bool {
        self.claim_ref.as_ref().is_some_and(|(ns, name, uid)| {
            *ns == c.namespace && *name == c.name && (uid.is_empty() || *uid == c.uid)
        })
    }

    /// Whether this volume could be bound to claim `c` (on any node).
    fn fits(&self, c: &Claim) -> bool {
        if self.deleting || self.class != c.class || self.volume_mode != c.volume_mode {
            return false;
        }
        if self.bound_to(c) {
            return true;
        }
        self.claim_ref.is_none()
            && matches!(self.phase.as_str(), "" | "Pending" | "Available")
            && self.capacity >= c.request
            && c.access_modes.iter().all(|m| self.access_modes.contains(m))
            && c.selector
                .as_ref()
                .is_none_or(|s| s.matches(Some(&self.labels)))
    }
}

/// A StorageClass, as far as scheduling reads it.
#[derive(Debug, Clone, Default)]
pub struct Class {
    pub provisioner: String,
    pub wait_for_first_consumer: bool,
    /// `allowedTopologies`: terms of (key, allowed values).
    pub allowed_topologies: Vec<Vec<(String, Vec<String>)>>,
}

impl Class {
    pub fn of(c: &StorageClass) -> Class {
        Class {
            provisioner: c.provisioner.clone(),
            wait_for_first_consumer: c.volume_binding_mode.as_deref()
                == Some("WaitForFirstConsumer"),
            allowed_topologies: c
                .allowed_topologies
                .iter()
                .flatten()
                .map(|t| {
                    t.match_label_expressions
                        .iter()
                        .flatten()
                        .map(|e| (e.key.clone(), e.values.clone()))
                        .collect()
                })
                .collect(),
        }
    }

    /// Kubernetes' MatchTopologySelectorTerms: no terms admit every node.
    fn admits(&self, node: &NodeInfo) -> bool {
        if self.allowed_topologies.is_empty() {
            return true;
        }
        let labels = node.node.as_ref().and_then(|n| n.metadata.labels.as_ref());
        self.allowed_topologies.iter().any(|term| {
            term.iter().all(|(k, vals)| {
                labels
                    .and_then(|l| l.get(k))
                    .is_some_and(|v| vals.contains(v))
            })
        })
    }
}

/// The claims (by `namespace/name`), volumes and classes (by name) the
/// scheduler watches.
#[derive(Debug, Default)]
pub struct Volumes {
    pub claims: HashMap<String, Claim>,
    pub volumes: HashMap<String, Volume>,
    pub classes: HashMap<String, Class>,
}

impl Volumes {
    pub fn claim(&self, ns: &str, name: &str) -> Option<&Claim> {
        self.claims.get(&format!("{ns}/{name}"))
    }
    pub fn put_claim(&mut self, c: Claim) {
        self.claims.insert(format!("{}/{}", c.namespace, c.name), c);
    }
    pub fn put_volume(&mut self, v: Volume) {
        self.volumes.insert(v.name.clone(), v);
    }
}

// ---- the plugin -------------------------------------------------------------------

/// The claim names a pod's volumes use (`persistentVolumeClaim`, and a
/// generic ephemeral volume's `<pod>-<volume>`), with whether each is
/// ephemeral.
pub fn pod_claims(pod: &PodInfo) -> Vec<(String, bool)> {
    let Some(spec) = pod.pod.spec.as_ref() else {
        return Vec::new();
    };
    spec.volumes
        .iter()
        .flatten()
        .filter_map(|v| {
            if let Some(c) = &v.persistent_volume_claim {
                Some((c.claim_name.clone(), false))
            } else if v.ephemeral.is_some() {
                Some((format!("{}-{}", pod.name, v.name), true))
            } else {
                None
            }
        })
        .collect()
}

/// What PreFilter found, for Filter and Reserve.
#[derive(Debug, Clone, Default)]
struct PreFilterState {
    /// Claims with a volume.
    bound: Vec<Claim>,
    /// Unbound claims of WaitForFirstConsumer classes, smallest first.
    to_bind: Vec<Claim>,
}

#[derive(Default)]
pub struct VolumeBinding {
    pub client: Option<kube::Client>,
    /// Claims to annotate with the chosen node: pod uid → claim keys,
    /// written in Reserve and taken in PreBind.
    pending: Mutex<HashMap<String, Vec<(String, String)>>>,
}

impl VolumeBinding {
    pub fn new(client: Option<kube::Client>) -> VolumeBinding {
        VolumeBinding {
            client,
            pending: Mutex::new(HashMap::new()),
        }
    }

    /// The node's verdict for the claims PreFilter sorted: Kubernetes'
    /// FindPodVolumes (each reason once).
    fn find_pod_volumes(
        &self,
        s: &PreFilterState,
        node: &NodeInfo,
        vols: &Volumes,
    ) -> Vec<&'static str> {
        let mut reasons = Vec::new();
        for c in &s.bound {
            match vols.volumes.get(&c.volume_name) {
                None => {
                    if !reasons.contains(&ERR_PV_NOT_EXIST) {
                        reasons.push(ERR_PV_NOT_EXIST);
                    }
                }
                Some(v) if !v.reachable_from(node) => {
                    if !reasons.contains(&ERR_NODE_CONFLICT) {
                        reasons.push(ERR_NODE_CONFLICT);
                    }
                }
                Some(_) => {}
            }
        }
        // Each unbound claim: the smallest matching volume this node can
        // reach (not chosen for another claim of the pod), else a
        // provisioner that can make one here.
        let mut chosen: HashSet<&str> = HashSet::new();
        let mut bind_conflict = false;
        let mut no_space = false;
        for c in &s.to_bind {
            let best = vols
                .volumes
                .values()
                .filter(|v| {
                    !chosen.contains(v.name.as_str()) && v.fits(c) && v.reachable_from(node)
                })
                .min_by_key(|v| (!v.bound_to(c), v.capacity));
            if let Some(v) = best {
                chosen.insert(&v.name);
                continue;
            }
            let Some(class) = vols.classes.get(&c.class) else {
                bind_conflict = true;
                continue;
            };
            if class.provisioner.is_empty()
                || class.provisioner == NO_PROVISIONER
                || !class.admits(node)
            {
                bind_conflict = true;
                continue;
            }
            // skiff's provisioner makes a directory in the storage the
            // node's agent publishes: a node without it has no room.
            let publishes = node.node.as_ref().is_some_and(|n| {
                n.metadata.annotations.as_ref().is_some_and(|a| {
                    a.contains_key(skiff_core::kinds::storage::LOCAL_STORAGE_ANNOTATION)
                })
            });
            if class.provisioner == skiff_core::kinds::storage::LOCAL_PROVISIONER && !publishes {
                no_space = true;
            }
        }
        if bind_conflict {
            reasons.push(ERR_BIND_CONFLICT);
        }
        if no_space {
            reasons.push(ERR_NOT_ENOUGH_SPACE);
        }
        reasons
    }
}

impl Plugin for VolumeBinding {
    fn name(&self) -> &'static str {
        NAME
    }
    fn events(&self) -> &'static [ClusterEvent] {
        &[
            ClusterEvent::PvcChange,
            ClusterEvent::PvChange,
            ClusterEvent::StorageClassChange,
            ClusterEvent::NodeAdd,
            ClusterEvent::NodeLabelChange,
            ClusterEvent::NodeOtherChange,
        ]
    }
    fn as_pre_filter(&self) -> Option<&dyn PreFilterPlugin> {
        Some(self)
    }
    fn as_filter(&self) -> Option<&dyn FilterPlugin> {
        Some(self)
    }
    fn as_reserve(&self) -> Option<&dyn ReservePlugin> {
        Some(self)
    }
    fn as_pre_bind(&self) -> Option<&dyn PreBindPlugin> {
        Some(self)
    }
}

impl PreFilterPlugin for VolumeBinding {
    fn pre_filter(
        &self,
        state: &mut CycleState,
        pod: &PodInfo,
        snap: &Snapshot,
    ) -> (PreFilterResult, Status) {
        let names = pod_claims(pod);
        if names.is_empty() {
            return (None, Status::skip());
        }
        let vols = &snap.volumes;
        let mut s = PreFilterState::default();
        let mut immediate = false;
        for (name, ephemeral) in names {
            let Some(c) = vols.claim(&pod.namespace, &name) else {
                return (
                    None,
                    Status::unresolvable(format!("persistentvolumeclaim \"{name}\" not found")),
                );
            };
            if c.deleting {
                return (
                    None,
                    Status::unresolvable(format!(
                        "persistentvolumeclaim \"{name}\" is being deleted"
                    )),
                );
            }
            if ephemeral && c.controller.as_deref() != Some(pod.uid.as_str()) {
                return (
                    None,
                    Status::unresolvable(format!(
                        "PVC {}/{name} was not created for pod {}/{} (pod is not owner)",
                        pod.namespace, pod.namespace, pod.name
                    )),
                );
            }
            if !c.volume_name.is_empty() {
                s.bound.push(c.clone());
            } else if vols
                .classes
                .get(&c.class)
                .is_some_and(|k| k.wait_for_first_consumer)
            {
                s.to_bind.push(c.clone());
            } else {
                // No class, an unknown class or an Immediate one: the
                // binder binds it (or not) without the pod.
                immediate = true;
            }
        }
        if immediate {
            return (None, Status::unresolvable(ERR_UNBOUND_IMMEDIATE));
        }
        s.to_bind.sort_by_key(|c| c.request);
        state.write(STATE_KEY, s);
        (None, Status::success())
    }
}

impl FilterPlugin for VolumeBinding {
    fn filter(&self, state: &CycleState, _: &PodInfo, node: &NodeInfo, snap: &Snapshot) -> Status {
        let Some(s) = state.read::<PreFilterState>(STATE_KEY) else {
            return Status::success();
        };
        let reasons = self.find_pod_volumes(s, node, &snap.volumes);
        if reasons.is_empty() {
            return Status::success();
        }
        let mut st = Status::unresolvable(reasons[0]);
        st.reasons = reasons.into_iter().map(str::to_string).collect();
        st
    }
}

impl ReservePlugin for VolumeBinding {
    fn reserve(&self, state: &mut CycleState, pod: &PodInfo, node: &str) -> Status {
        let Some(s) = state.read::<PreFilterState>(STATE_KEY) else {
            return Status::success();
        };
        let todo: Vec<(String, String)> = s
            .to_bind
            .iter()
            .filter(|c| c.selected_node.as_deref() != Some(node))
            .map(|c| (c.namespace.clone(), c.name.clone()))
            .collect();
        if !todo.is_empty() {
            self.pending
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .insert(pod.uid.clone(), todo);
        }
        Status::success()
    }
    fn unreserve(&self, _: &mut CycleState, pod: &PodInfo, _: &str) {
        self.pending
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&pod.uid);
    }
}

impl PreBindPlugin for VolumeBinding {
    fn pre_bind(&self, pod: Arc<PodInfo>, node: String) -> BoxFuture<'static, Status> {
        let todo = self
            .pending
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&pod.uid);
        let client = self.client.clone();
        Box::pin(async move {
            let Some(todo) = todo else {
                return Status::success();
            };
            let Some(client) = client else {
                return Status::error("no API client to annotate claims with");
            };
            // The binder and provisioner bind or provision each claim on
            // this node (Kubernetes' AnnSelectedNode).
            let patch = json!({"metadata": {"annotations": {SELECTED_NODE: node}}});
            for (ns, name) in todo {
                let api: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), &ns);
                if let Err(e) = api
                    .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                    .await
                {
                    return Status::error(format!(
                        "selecting node {node} for persistentvolumeclaim \"{name}\": {e}"
                    ));
                }
            }
            Status::success()
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::framework::Code;
    use crate::plugins::testutil::*;
    use serde_json::Value;

    fn claim(v: Value) -> Claim {
        let mut c: PersistentVolumeClaim = serde_json::from_value(v).unwrap();
        c.metadata.namespace.get_or_insert_with(|| "default".into());
        Claim::of(&c)
    }

    fn volume(v: Value) -> Volume {
        Volume::of(&serde_json::from_value(v).unwrap())
    }

    fn on_host(name: &str, host: &str, extra: Value) -> Volume {
        let mut v = json!({"metadata": {"name": name}, "spec": {
            "capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"],
            "storageClassName": "local",
            "nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [
                {"key": "kubernetes.io/hostname", "operator": "In", "values": [host]}]}]}}}});
        json_merge(&mut v, extra);
        volume(v)
    }

    fn json_merge(a: &mut Value, b: Value) {
        match (a, b) {
            (Value::Object(a), Value::Object(b)) => {
                for (k, v) in b {
                    json_merge(a.entry(k).or_insert(Value::Null), v);
                }
            }
            (a, b) => *a = b,
        }
    }

    fn node(name: &str, storage: bool) -> NodeInfo {
        let mut n = NodeBuilder::new(name)
            .label("kubernetes.io/hostname", name)
            .build();
        if storage {
            n.metadata.annotations = Some(
                [(
                    skiff_core::kinds::storage::LOCAL_STORAGE_ANNOTATION.to_string(),
                    "/var/lib/skiff/storage".to_string(),
                )]
                .into(),
            );
        }
        node_info(n, &[])
    }

    fn pod_with(claims: &[&str]) -> PodInfo {
        let mut p = PodBuilder::new("p").build();
        p.spec.as_mut().unwrap().volumes = Some(
            claims
                .iter()
                .map(|c| {
                    serde_json::from_value(json!({"name": format!("v-{c}"),
                        "persistentVolumeClaim": {"claimName": c}}))
                    .unwrap()
                })
                .collect(),
        );
        pod_info(p)
    }

    /// Runs PreFilter, then Filter on each node; the PreFilter status if
    /// it rejected, else each node's status.
    fn run(snap: &Snapshot, pod: &PodInfo, nodes: &[NodeInfo]) -> Result<Vec<Status>, Status> {
        let pl = VolumeBinding::new(None);
        let mut state = CycleState::default();
        let (_, st) = pl.pre_filter(&mut state, pod, snap);
        if !st.is_success() {
            return Err(st);
        }
        Ok(nodes
            .iter()
            .map(|n| pl.filter(&state, pod, n, snap))
            .collect())
    }

    fn classes(snap: &mut Snapshot) {
        snap.volumes.classes.insert(
            "local".into(),
            Class::of(
                &serde_json::from_value(json!({"metadata": {"name": "local"},
                    "provisioner": NO_PROVISIONER, "volumeBindingMode": "WaitForFirstConsumer"}))
                .unwrap(),
            ),
        );
        snap.volumes.classes.insert(
            "local-path".into(),
            Class::of(
                &serde_json::from_value(json!({"metadata": {"name": "local-path"},
                    "provisioner": skiff_core::kinds::storage::LOCAL_PROVISIONER,
                    "volumeBindingMode": "WaitForFirstConsumer",
                    "allowedTopologies": [{"matchLabelExpressions": [
                        {"key": "kubernetes.io/hostname", "values": ["a", "b"]}]}]}))
                .unwrap(),
            ),
        );
        snap.volumes.classes.insert(
            "fast".into(),
            Class::of(
                &serde_json::from_value(
                    json!({"metadata": {"name": "fast"}, "provisioner": "example.com/fast"}),
                )
                .unwrap(),
            ),
        );
    }

    #[test]
    fn a_pod_without_claims_is_skipped() {
        let pl = VolumeBinding::new(None);
        let (_, st) = pl.pre_filter(
            &mut CycleState::default(),
            &pod_info(PodBuilder::new("p").build()),
            &Snapshot::default(),
        );
        assert!(st.is_skip());
    }

    #[test]
    fn a_bound_claim_fits_only_the_nodes_its_volume_is_reachable_from() {
        let mut snap = Snapshot::default();
        classes(&mut snap);
        snap.volumes
            .put_claim(claim(json!({"metadata": {"name": "data"},
            "spec": {"storageClassName": "local", "volumeName": "pv-a"}})));
        snap.volumes.put_volume(on_host("pv-a", "a", json!({})));
        let nodes = [node("a", true), node("b", true)];
        let st = run(&snap, &pod_with(&["data"]), &nodes).unwrap();
        assert!(st[0].is_success(), "{:?}", st[0]);
        assert_eq!(st[1].code, Code::UnschedulableAndUnresolvable);
        assert_eq!(st[1].reasons, vec![ERR_NODE_CONFLICT.to_string()]);
        // A volume without node affinity is reachable from every node.
        snap.volumes
            .put_volume(volume(json!({"metadata": {"name": "pv-a"},
            "spec": {"storageClassName": "local"}})));
        let st = run(&snap, &pod_with(&["data"]), &nodes).unwrap();
        assert!(st.iter().all(Status::is_success));
    }

    #[test]
    fn a_claim_bound_to_a_missing_volume_fits_no_node() {
        let mut snap = Snapshot::default();
        snap.volumes
            .put_claim(claim(json!({"metadata": {"name": "data"},
            "spec": {"volumeName": "gone"}})));
        let st = run(&snap, &pod_with(&["data"]), &[node("a", true)]).unwrap();
        assert_eq!(st[0].reasons, vec![ERR_PV_NOT_EXIST.to_string()]);
    }

    #[test]
    fn a_missing_or_deleted_claim_rejects_the_pod_on_every_node() {
        let mut snap = Snapshot::default();
        let st = run(&snap, &pod_with(&["data"]), &[]).unwrap_err();
        assert_eq!(st.code, Code::UnschedulableAndUnresolvable);
        assert_eq!(
            st.reasons,
            vec![r#"persistentvolumeclaim "data" not found"#.to_string()]
        );
        snap.volumes
            .put_claim(claim(json!({"metadata": {"name": "data",
            "deletionTimestamp": "2026-01-01T00:00:00Z"}, "spec": {"volumeName": "pv"}})));
        let st = run(&snap, &pod_with(&["data"]), &[]).unwrap_err();
        assert_eq!(
            st.reasons,
            vec![r#"persistentvolumeclaim "data" is being deleted"#.to_string()]
        );
    }

    #[test]
    fn an_unbound_claim_of_an_immediate_or_unknown_class_waits_for_the_binder() {
        let mut snap = Snapshot::default();
        classes(&mut snap);
        for class in ["fast", "nonexistent", ""] {
            snap.volumes
                .put_claim(claim(json!({"metadata": {"name": "data"},
                "spec": {"storageClassName": class}})));
            let st = run(&snap, &pod_with(&["data"]), &[]).unwrap_err();
            assert_eq!(
                st.code,
                Code::UnschedulableAndUnresolvable,
                "class {class:?}"
            );
            assert_eq!(st.reasons, vec![ERR_UNBOUND_IMMEDIATE.to_string()]);
        }
    }

    #[test]
    fn a_wait_for_first_consumer_claim_goes_where_a_volume_can_be_bound_or_provisioned() {
        let mut snap = Snapshot::default();
        classes(&mut snap);
        // Static local volumes (no provisioner): only a node with a
        // matching Available volume.
        snap.volumes
            .put_claim(claim(json!({"metadata": {"name": "data"},
            "spec": {"storageClassName": "local", "accessModes": ["ReadWriteOnce"],
                "resources": {"requests": {"storage": "500Mi"}}}})));
        snap.volumes.put_volume(on_host("pv-b", "b", json!({})));
        snap.volumes.put_volume(on_host(
            "pv-small-a",
            "a",
            json!({"spec": {"capacity": {"storage": "100Mi"}}}),
        ));
        snap.volumes.put_volume(on_host(
            "pv-taken-a",
            "a",
            json!({"spec": {"claimRef": {"namespace": "default", "name": "other"}}}),
        ));
        let nodes = [node("a", true), node("b", true)];
        let st = run(&snap, &pod_with(&["data"]), &nodes).unwrap();
        assert_eq!(st[0].reasons, vec![ERR_BIND_CONFLICT.to_string()]);
        assert!(st[1].is_success(), "{:?}", st[1]);

        // Provisioned: any node the class's allowedTopologies admit and
        // whose agent publishes local storage.
        snap.volumes
            .put_claim(claim(json!({"metadata": {"name": "data"},
            "spec": {"storageClassName": "local-path"}})));
        let nodes = [node("a", true), node("b", false), node("c", true)];
        let st = run(&snap, &pod_with(&["data"]), &nodes).unwrap();
        assert!(st[0].is_success(), "{:?}", st[0]);
        assert_eq!(st[1].reasons, vec![ERR_NOT_ENOUGH_SPACE.to_string()]);
        assert_eq!(st[2].reasons, vec![ERR_BIND_CONFLICT.to_string()]);
    }

    #[test]
    fn two_claims_of_a_pod_need_two_volumes() {
        let mut snap = Snapshot::default();
        classes(&mut snap);
        for n in ["one", "two"] {
            snap.volumes.put_claim(claim(json!({"metadata": {"name": n},
                "spec": {"storageClassName": "local"}})));
        }
        snap.volumes.put_volume(on_host("pv-1", "a", json!({})));
        let st = run(&snap, &pod_with(&["one", "two"]), &[node("a", true)]).unwrap();
        assert_eq!(st[0].reasons, vec![ERR_BIND_CONFLICT.to_string()]);
        snap.volumes.put_volume(on_host("pv-2", "a", json!({})));
        let st = run(&snap, &pod_with(&["one", "two"]), &[node("a", true)]).unwrap();
        assert!(st[0].is_success());
    }

    #[test]
    fn reserve_remembers_the_claims_prebind_annotates() {
        let mut snap = Snapshot::default();
        classes(&mut snap);
        snap.volumes
            .put_claim(claim(json!({"metadata": {"name": "data"},
            "spec": {"storageClassName": "local-path"}})));
        let pl = VolumeBinding::new(None);
        let pod = pod_with(&["data"]);
        let mut state = CycleState::default();
        let (_, st) = pl.pre_filter(&mut state, &pod, &snap);
        assert!(st.is_success());
        assert!(pl.reserve(&mut state, &pod, "a").is_success());
        assert_eq!(
            pl.pending.lock().unwrap().get(&pod.uid),
            Some(&vec![("default".to_string(), "data".to_string())])
        );
        pl.unreserve(&mut state, &pod, "a");
        assert!(pl.pending.lock().unwrap().is_empty());
    }
}
