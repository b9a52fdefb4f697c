//! Omega's commit check: a pod is bound to a node only if the node's
//! committed state has room for it, decided in the same store commit that
//! binds it, so that several schedulers racing for the same free cpu never
//! overcommit a node (Kubernetes lets both bindings through and the
//! kubelet rejects one afterwards with `OutOfcpu`).
//!
//! Every node has an allocation record, a store key of its own
//! ([`RECORD_PREFIX`]`<node>`, outside every served resource): the pods
//! bound to it with their requests and host ports. A write that binds a
//! pod (`pods/binding`, or a create or update that sets `spec.nodeName`
//! on a pod that had none) reads the record, checks the pod against the
//! node's allocatable, and commits the pod and the grown record together,
//! each guarded by the revision it was read at. A record changed by a
//! racing binding fails the commit, and the check runs again on the new
//! record: the conflict is the transaction's, as in Omega. A bind costs one
//! record read (none when this server wrote the record last) and one more
//! key in the commit, whatever the cluster's size: the record is bounded
//! by the node's pod capacity.
//!
//! The record is an upper bound: binds add to it; nothing is taken off
//! when a pod ends or goes. When a bind would not fit, the pods of the
//! record that are gone, finished or bound elsewhere are dropped first
//! (one store read each) and the check runs again; since that empties the
//! record of every departed pod, the next such pass waits until binds
//! have filled the node again, so pruning costs O(1) per bind amortized.
//! Mirror pods are counted but never refused (their node already runs
//! them), and a node this server does not know (yet) is not checked.

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;

use bytes::Bytes;
use k8s_openapi::api::core::v1::{Container, ContainerPort, Pod, PodSpec, ResourceRequirements};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use skiff_core::{resources, ApiError};
use skiff_helpers::resources::{pod_requests, Resource};
use skiff_store::{KeyValue, Write};

use super::{Registry, WriteError};
use crate::object;

/// Where the nodes' allocation records live: under the store's root, but
/// under no served resource (a group has a dot, `_skiff` has none).
pub const RECORD_PREFIX: &str = "/registry/_skiff/nodeallocations/";

/// The annotation of a mirror pod (a static pod's copy in the API).
const MIRROR: &str = "kubernetes.io/config.mirror";

// ---- the pure model ----------------------------------------------------------------------

/// A host port a pod takes on its node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HostPort {
    pub protocol: String,
    pub ip: String,
    pub port: i32,
}

impl HostPort {
    /// Two uses of a port collide on the same protocol and port when
    /// either listens on every address or both on the same one.
    fn collides(&self, o: &HostPort) -> bool {
        let any = |ip: &str| ip.is_empty() || ip == "0.0.0.0" || ip == "::";
        self.protocol == o.protocol
            && self.port == o.port
            && (any(&self.ip) || any(&o.ip) || self.ip == o.ip)
    }
}

/// One pod as a node's record counts it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Entry {
    /// `namespace/name`, to look the pod up when pruning.
    pub pod: String,
    /// What it requests: `cpu` in millicores, the rest in units; zero
    /// amounts left out.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub requests: BTreeMap<String, i64>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ports: Vec<HostPort>,
}

/// A node's allocation record: the pods bound to it, by uid.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Record {
    #[serde(default)]
    pub pods: BTreeMap<String, Entry>,
}

/// A pod about to be bound, as the check needs it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Claim {
    pub uid: String,
    pub entry: Entry,
    /// A mirror pod: counted, never refused.
    pub mirror: bool,
}

/// What a node offers: its allocatable, and which of the standard
/// resources (cpu, memory, ephemeral-storage, pods) it declares at all —
/// one it leaves out is not checked (a node object made by hand), while an
/// extended resource it lacks is none to give.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Capacity {
    pub allocatable: Resource,
    pub declared: std::collections::BTreeSet<String>,
}

impl Capacity {
    pub fn from_map(m: &BTreeMap<String, Quantity>) -> Capacity {
        Capacity {
            allocatable: Resource::from_map(Some(m)),
            declared: m.keys().cloned().collect(),
        }
    }

    fn checks(&self, resource: &str) -> bool {
        let standard = matches!(resource, "cpu" | "memory" | "ephemeral-storage" | "pods");
        !standard || self.declared.contains(resource)
    }
}

/// Why a pod does not fit: the resource (or `pods`, or a host port) and
/// the numbers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal(pub String);

fn requests_map(r: &Resource) -> BTreeMap<String, i64> {
    let mut m = BTreeMap::new();
    for (name, v) in [
        ("cpu", r.milli_cpu),
        ("memory", r.memory),
        ("ephemeral-storage", r.ephemeral_storage),
    ] {
        if v > 0 {
            m.insert(name.to_string(), v);
        }
    }
    for (name, v) in &r.scalar {
        if *v > 0 {
            m.insert(name.clone(), *v);
        }
    }
    m
}

fn show(resource: &str, v: i64) -> String {
    if resource == "cpu" {
        format!("{v}m")
    } else {
        v.to_string()
    }
}

impl Record {
    /// Whether `claim` fits beside the other pods of the record on a node
    /// with `allocatable` (NodeResourcesFit's and NodePorts' rules: the pod
    /// count; each resource the pod requests; host ports). The pod's own
    /// earlier entry, if any, is not counted against it.
    pub fn refusal(&self, capacity: &Capacity, claim: &Claim) -> Option<Refusal> {
        let allocatable = &capacity.allocatable;
        let others = || {
            self.pods
                .iter()
                .filter(move |(uid, _)| **uid != claim.uid)
                .map(|(_, e)| e)
        };
        let count = others().count() as i64;
        if capacity.checks("pods") && count + 1 > allocatable.pods {
            return Some(Refusal(format!(
                "Too many pods ({count} of {} allowed are bound)",
                allocatable.pods
            )));
        }
        for (resource, want) in &claim.entry.requests {
            if !capacity.checks(resource) {
                continue;
            }
            let used: i64 = others()
                .filter_map(|e| e.requests.get(resource))
                .fold(0i64, |a, b| a.saturating_add(*b));
            let have = allocatable.get(resource);
            if *want > have.saturating_sub(used) {
                return Some(Refusal(format!(
                    "Insufficient {resource} (the pod requests {}, {} of the node's {} allocatable are taken)",
                    show(resource, *want),
                    show(resource, used),
                    show(resource, have)
                )));
            }
        }
        for p in &claim.entry.ports {
            if others().any(|e| e.ports.iter().any(|q| q.collides(p))) {
                return Some(Refusal(format!(
                    "host port {}/{}:{} is taken",
                    p.protocol,
                    if p.ip.is_empty() { "0.0.0.0" } else { &p.ip },
                    p.port
                )));
            }
        }
        None
    }

    pub fn insert(&mut self, claim: &Claim) {
        self.pods.insert(claim.uid.clone(), claim.entry.clone());
    }

    /// A resized pod's entry: each amount the larger of what it had and
    /// what it asks for now (its node decides whether the resize is
    /// applied; until then either may be in use).
    pub fn grow(&mut self, claim: &Claim) {
        let entry = self
            .pods
            .entry(claim.uid.clone())
            .or_insert_with(|| claim.entry.clone());
        for (resource, v) in &claim.entry.requests {
            let cur = entry.requests.entry(resource.clone()).or_insert(0);
            *cur = (*cur).max(*v);
        }
    }
}

// ---- reading pods and nodes -----------------------------------------------------------------

#[derive(Deserialize, Default)]
#[serde(default, rename_all = "camelCase")]
struct LeanMeta {
    name: String,
    namespace: String,
    uid: String,
    annotations: BTreeMap<String, String>,
}

#[derive(Deserialize, Default)]
#[serde(default, rename_all = "camelCase")]
struct LeanContainer {
    resources: Option<ResourceRequirements>,
    ports: Option<Vec<ContainerPort>>,
    restart_policy: Option<String>,
}

#[derive(Deserialize, Default)]
#[serde(default, rename_all = "camelCase")]
struct LeanSpec {
    containers: Vec<LeanContainer>,
    init_containers: Vec<LeanContainer>,
    overhead: Option<BTreeMap<String, Quantity>>,
    node_name: String,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct LeanStatus {
    phase: String,
}

/// Just what the check reads of a pod (its containers' resources and
/// ports, not the rest of a pod's few kilobytes).
#[derive(Deserialize, Default)]
#[serde(default)]
struct LeanPod {
    metadata: LeanMeta,
    spec: LeanSpec,
    status: LeanStatus,
}

impl LeanPod {
    fn claim(self) -> Claim {
        let container = |c: LeanContainer| Container {
            resources: c.resources,
            restart_policy: c.restart_policy,
            ports: c.ports,
            ..Default::default()
        };
        let containers: Vec<Container> = self.spec.containers.into_iter().map(container).collect();
        let ports = containers
            .iter()
            .flat_map(|c| c.ports.iter().flatten())
            .filter(|p| p.host_port.is_some_and(|h| h > 0))
            .map(|p| HostPort {
                protocol: p.protocol.clone().unwrap_or_else(|| "TCP".into()),
                ip: p.host_ip.clone().unwrap_or_default(),
                port: p.host_port.unwrap_or(0),
            })
            .collect();
        let init: Vec<Container> = self
            .spec
            .init_containers
            .into_iter()
            .map(container)
            .collect();
        let pod = Pod {
            spec: Some(PodSpec {
                containers,
                init_containers: (!init.is_empty()).then_some(init),
                overhead: self.spec.overhead,
                ..Default::default()
            }),
            ..Default::default()
        };
        Claim {
            uid: self.metadata.uid,
            mirror: self.metadata.annotations.contains_key(MIRROR),
            entry: Entry {
                pod: format!("{}/{}", self.metadata.namespace, self.metadata.name),
                requests: requests_map(&pod_requests(&pod, false)),
                ports,
            },
        }
    }
}

/// A pod as the writer has it: its stored (JSON) bytes, or decoded.
#[derive(Clone, Copy)]
pub enum PodForm<'a> {
    Stored(&'a [u8]),
    Decoded(&'a Value),
}

impl PodForm<'_> {
    fn claim(self) -> Result<Claim, ApiError> {
        match self {
            PodForm::Stored(b) => claim_of_stored(b),
            PodForm::Decoded(v) => claim_of(v),
        }
    }
}

/// The claim of a pod from its stored (JSON) bytes.
pub fn claim_of_stored(stored: &[u8]) -> Result<Claim, ApiError> {
    serde_json::from_slice::<LeanPod>(stored)
        .map(LeanPod::claim)
        .map_err(|e| ApiError::internal(format!("reading the stored pod: {e}")))
}

/// The claim of a decoded pod.
pub fn claim_of(pod: &Value) -> Result<Claim, ApiError> {
    LeanPod::deserialize(pod)
        .map(LeanPod::claim)
        .map_err(|e| ApiError::internal(format!("reading the pod: {e}")))
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct LeanNodeStatus {
    allocatable: Option<BTreeMap<String, Quantity>>,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct LeanNode {
    status: LeanNodeStatus,
}

// ---- the commit ---------------------------------------------------------------------------

/// What this server remembers between binds: the records it wrote last
/// (the next bind on the node starts from them; a stale one only costs a
/// failed commit) and the nodes' allocatable as parsed at a revision.
#[derive(Default)]
pub struct Book {
    records: Mutex<HashMap<String, KeyValue>>,
    capacities: Mutex<HashMap<String, (i64, Option<Capacity>)>>,
}

/// What a write does to the pod's place in the record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Change {
    /// The pod becomes bound: checked, then counted.
    Bind,
    /// A bound pod's requests change: counted at the larger.
    Resize,
}

/// A bind that did not happen.
pub enum BindFailure {
    /// The store's answer about the pod's own key (the pod changed,
    /// exists already, is gone) or a fault.
    Store(skiff_store::Error),
    /// The node has no room: a 409 naming the resource.
    Refused(ApiError),
}

impl BindFailure {
    /// The answer to the client.
    pub fn into_api_error(self, res: &resources::ResourceInfo, name: &str) -> ApiError {
        match self {
            BindFailure::Store(e) => super::store_err(res, name, e),
            BindFailure::Refused(e) => e,
        }
    }

    /// For a write inside a guaranteed update: the pod's own conflict is
    /// a retry from a fresh read.
    pub fn into_write_error(self, res: &resources::ResourceInfo, name: &str) -> WriteError {
        match self {
            BindFailure::Store(skiff_store::Error::Conflict { .. })
            | BindFailure::Store(skiff_store::Error::NotFound(_)) => WriteError::Retry,
            other => WriteError::Api(other.into_api_error(res, name)),
        }
    }
}

fn record_value(kv: Option<&KeyValue>) -> Record {
    kv.and_then(|kv| serde_json::from_slice(&kv.value).ok())
        .unwrap_or_default()
}

impl Registry {
    /// The node's allocatable as this server's cache has it; `None` for a
    /// node it does not know or that publishes no allocatable.
    fn node_capacity(&self, node: &str) -> Option<Capacity> {
        let res = resources::lookup("", "v1", "nodes")?;
        let cached = self
            .cache()
            .resource(res)
            .get(&object::object_key(res, None, node))?;
        let mut book = self
            .allocations
            .capacities
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        if let Some((rev, c)) = book.get(node) {
            if *rev == cached.revision {
                return c.clone();
            }
        }
        let lean: LeanNode = serde_json::from_slice(&cached.bytes()).unwrap_or_default();
        let c = lean
            .status
            .allocatable
            .filter(|m| !m.is_empty())
            .map(|m| Capacity::from_map(&m));
        book.insert(node.to_string(), (cached.revision, c.clone()));
        c
    }

    /// Drops from `record` the pods (other than `keep`) that are gone,
    /// finished, or not bound to `node`, reading each from the store.
    /// Whether anything was dropped.
    async fn prune(
        &self,
        record: &mut Record,
        node: &str,
        keep: &str,
    ) -> Result<bool, BindFailure> {
        let Some(pods) = resources::lookup("", "v1", "pods") else {
            return Ok(false);
        };
        let mut gone = Vec::new();
        for (uid, e) in &record.pods {
            if uid == keep {
                continue;
            }
            let (ns, name) = e.pod.split_once('/').unwrap_or(("", &e.pod));
            let key = object::object_key(pods, Some(ns), name);
            let live = match self.store.get(&key).await.map_err(BindFailure::Store)? {
                None => false,
                Some(kv) => match serde_json::from_slice::<LeanPod>(&kv.value) {
                    Ok(p) => {
                        p.metadata.uid == *uid
                            && p.spec.node_name == node
                            && p.status.phase != "Succeeded"
                            && p.status.phase != "Failed"
                    }
                    // What cannot be read is kept: the record stays an
                    // upper bound.
                    Err(_) => true,
                },
            };
            if !live {
                gone.push(uid.clone());
            }
        }
        for uid in &gone {
            record.pods.remove(uid);
        }
        Ok(!gone.is_empty())
    }

    /// Writes a pod (its stored form `bytes`, replacing `cur`, or
    /// created when `cur` is `None`) in one commit with the record of the
    /// node it is bound to: a pod becoming bound only if the node has room
    /// for it, a resized one growing its entry (never refused: the node
    /// decides whether the resize fits). The pod's claim is read from
    /// `pod` only when the node is checked at all.
    pub(crate) async fn write_with_record(
        &self,
        key: &str,
        cur: Option<&KeyValue>,
        bytes: Bytes,
        pod: PodForm<'_>,
        node: &str,
        change: Change,
    ) -> Result<KeyValue, BindFailure> {
        let pod_write = || match cur {
            Some(cur) => Write::Update {
                key: key.to_string(),
                value: bytes.clone(),
                expected_revision: cur.mod_revision,
            },
            None => Write::Create {
                key: key.to_string(),
                value: bytes.clone(),
            },
        };
        let capacity = if self.config.commit_check {
            self.node_capacity(node)
        } else {
            None
        };
        let Some(capacity) = capacity else {
            // A node this server does not know: nothing to check against.
            let mut items = self
                .store
                .commit(vec![pod_write()])
                .await
                .map_err(BindFailure::Store)?;
            return Ok(items.remove(0));
        };
        let claim = &pod.claim().map_err(BindFailure::Refused)?;
        let record_key = format!("{RECORD_PREFIX}{node}");
        let mut remembered = self
            .allocations
            .records
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(node)
            .cloned();
        loop {
            let read = match remembered.take() {
                Some(kv) => Some(kv),
                None => self
                    .store
                    .get(&record_key)
                    .await
                    .map_err(BindFailure::Store)?,
            };
            let mut record = record_value(read.as_ref());
            if change == Change::Resize {
                record.grow(claim);
            } else if let Some(first) = record.refusal(&capacity, claim) {
                let refusal = if claim.mirror {
                    None
                } else if self.prune(&mut record, node, &claim.uid).await? {
                    record.refusal(&capacity, claim)
                } else {
                    Some(first)
                };
                if let Some(Refusal(why)) = refusal {
                    let name = claim
                        .entry
                        .pod
                        .split_once('/')
                        .map(|(_, n)| n)
                        .unwrap_or("");
                    return Err(BindFailure::Refused(ApiError::conflict(
                        "",
                        "pods",
                        name,
                        &format!(
                            "pod {} {} {node:?}: {why}",
                            claim.entry.pod,
                            skiff_core::kinds::pod::DOES_NOT_FIT
                        ),
                    )));
                }
            }
            if change == Change::Bind {
                record.insert(claim);
            }
            let value = Bytes::from(
                serde_json::to_vec(&record)
                    .map_err(|e| BindFailure::Refused(ApiError::internal(e.to_string())))?,
            );
            let record_write = match &read {
                Some(kv) => Write::Update {
                    key: record_key.clone(),
                    value,
                    expected_revision: kv.mod_revision,
                },
                None => Write::Create {
                    key: record_key.clone(),
                    value,
                },
            };
            match self.store.commit(vec![pod_write(), record_write]).await {
                Ok(mut items) => {
                    let record_kv = items.pop();
                    let mut book = self
                        .allocations
                        .records
                        .lock()
                        .unwrap_or_else(|e| e.into_inner());
                    if let Some(kv) = record_kv {
                        book.insert(node.to_string(), kv);
                    }
                    return Ok(items.remove(0));
                }
                // Another binding to the node committed first: check
                // again against what it left.
                Err(
                    skiff_store::Error::Conflict { key, .. }
                    | skiff_store::Error::AlreadyExists(key)
                    | skiff_store::Error::NotFound(key),
                ) if key == record_key => {
                    self.allocations
                        .records
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .remove(node);
                    continue;
                }
                Err(e) => return Err(BindFailure::Store(e)),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn node(cpu: &str, memory: &str, pods: &str, extra: &[(&str, &str)]) -> Capacity {
        let mut m: BTreeMap<String, Quantity> = [("cpu", cpu), ("memory", memory), ("pods", pods)]
            .iter()
            .map(|(k, v)| (k.to_string(), Quantity(v.to_string())))
            .collect();
        for (k, v) in extra {
            m.insert(k.to_string(), Quantity(v.to_string()));
        }
        Capacity::from_map(&m)
    }

    fn claim(uid: &str, pod: Value) -> Claim {
        let mut pod = pod;
        pod["metadata"]["uid"] = json!(uid);
        pod["metadata"]["namespace"] = json!("default");
        pod["metadata"]["name"] = json!(format!("p-{uid}"));
        claim_of(&pod).unwrap()
    }

    fn asking(cpu: &str) -> Value {
        json!({"metadata": {}, "spec": {"containers": [
            {"name": "c", "resources": {"requests": {"cpu": cpu, "memory": "64Mi"}}}
        ]}})
    }

    #[test]
    fn a_pod_is_refused_once_the_record_holds_the_node_s_cpu() {
        let n = node("2", "4Gi", "110", &[]);
        let mut r = Record::default();
        for i in 0..3 {
            let c = claim(&format!("u{i}"), asking("600m"));
            assert_eq!(r.refusal(&n, &c), None);
            r.insert(&c);
        }
        let Refusal(why) = r.refusal(&n, &claim("u9", asking("300m"))).unwrap();
        assert_eq!(
            why,
            "Insufficient cpu (the pod requests 300m, 1800m of the node's 2000m allocatable are taken)"
        );
        // Its own earlier entry does not count against a pod (a retry).
        assert_eq!(r.refusal(&n, &claim("u2", asking("600m"))), None);
        assert_eq!(r.refusal(&n, &claim("u9", asking("200m"))), None);
    }

    #[test]
    fn pods_memory_extended_resources_and_host_ports_are_each_checked() {
        let n = node("8", "1Gi", "2", &[("example.com/widget", "2")]);
        let mut r = Record::default();
        let big = claim(
            "a",
            json!({"metadata": {}, "spec": {"containers": [{"name": "c",
                "resources": {"requests": {"memory": "768Mi", "example.com/widget": "2"}},
                "ports": [{"containerPort": 80, "hostPort": 8080}]}]}}),
        );
        r.insert(&big);
        let why = |c: &Claim| r.refusal(&n, c).map(|Refusal(w)| w).unwrap_or_default();
        assert!(
            why(&claim("b", asking("100m"))).is_empty(),
            "256Mi are left"
        );
        assert!(why(&claim(
            "b",
            json!({"metadata": {}, "spec": {"containers": [{"name": "c",
                "resources": {"requests": {"memory": "512Mi"}}}]}})
        ))
        .starts_with("Insufficient memory"));
        assert!(why(&claim(
            "b",
            json!({"metadata": {}, "spec": {"containers": [{"name": "c",
                "resources": {"limits": {"example.com/widget": "1"}}}]}})
        ))
        .starts_with("Insufficient example.com/widget"));
        assert_eq!(
            why(&claim(
                "b",
                json!({"metadata": {}, "spec": {"containers": [{"name": "c",
                    "ports": [{"containerPort": 1, "hostPort": 8080, "hostIP": "10.0.0.1"}]}]}})
            )),
            "host port TCP/10.0.0.1:8080 is taken"
        );
        // Another protocol on the same port is free.
        assert!(why(&claim(
            "b",
            json!({"metadata": {}, "spec": {"containers": [{"name": "c",
                "ports": [{"containerPort": 1, "hostPort": 8080, "protocol": "UDP"}]}]}})
        ))
        .is_empty());
        let mut r = r.clone();
        r.insert(&claim("b", asking("1m")));
        let Refusal(full) = r.refusal(&n, &claim("c", asking("1m"))).unwrap();
        assert_eq!(full, "Too many pods (2 of 2 allowed are bound)");
    }

    #[test]
    fn a_node_without_a_standard_resource_is_not_checked_for_it() {
        let mut m = BTreeMap::new();
        m.insert("cpu".to_string(), Quantity("1".into()));
        let n = Capacity::from_map(&m);
        let mut r = Record::default();
        for i in 0..200 {
            r.insert(&claim(
                &format!("u{i}"),
                json!({"metadata": {}, "spec": {"containers": [
                {"name": "c", "resources": {"requests": {"memory": "1Gi"}}}]}}),
            ));
        }
        assert_eq!(r.refusal(&n, &claim("x", asking("1"))), None);
        assert!(r.refusal(&n, &claim("x", asking("1001m"))).is_some());
    }

    #[test]
    fn a_claim_counts_init_containers_and_overhead_as_kubernetes_does() {
        let c = claim(
            "a",
            json!({"metadata": {"annotations": {"kubernetes.io/config.mirror": "x"}}, "spec": {
                "overhead": {"cpu": "50m"},
                "initContainers": [{"name": "i", "resources": {"requests": {"cpu": "700m"}}}],
                "containers": [{"name": "c", "resources": {"requests": {"cpu": "200m"}}},
                               {"name": "d", "resources": {"requests": {"cpu": "300m"}}}]}}),
        );
        assert!(c.mirror);
        assert_eq!(c.entry.pod, "default/p-a");
        assert_eq!(c.entry.requests.get("cpu"), Some(&750));
        // From the stored bytes, the same.
        let stored = serde_json::to_vec(&json!({"metadata": {"uid": "a", "namespace": "default", "name": "p-a",
            "annotations": {"kubernetes.io/config.mirror": "x"}, "managedFields": [{"manager": "m"}]},
            "spec": {"overhead": {"cpu": "50m"},
                "initContainers": [{"name": "i", "resources": {"requests": {"cpu": "700m"}}}],
                "containers": [{"name": "c", "image": "i", "env": [{"name": "A", "value": "1"}],
                    "resources": {"requests": {"cpu": "200m"}}},
                  {"name": "d", "resources": {"requests": {"cpu": "300m"}}}]},
            "status": {"phase": "Pending"}}))
        .unwrap();
        assert_eq!(claim_of_stored(&stored).unwrap(), c);
    }

    #[test]
    fn a_resize_grows_the_entry_and_never_shrinks_it() {
        let mut r = Record::default();
        r.insert(&claim("a", asking("500m")));
        r.grow(&claim("a", asking("800m")));
        r.grow(&claim("a", asking("200m")));
        assert_eq!(r.pods["a"].requests.get("cpu"), Some(&800));
        assert_eq!(r.pods["a"].requests.get("memory"), Some(&(64 << 20)));
    }

    #[test]
    fn a_record_reads_back_as_written() {
        let mut r = Record::default();
        r.insert(&claim(
            "a",
            json!({"metadata": {}, "spec": {"containers": [{"name": "c",
                "resources": {"requests": {"cpu": "1"}}, "ports": [{"containerPort": 5, "hostPort": 5}]}]}}),
        ));
        let kv = KeyValue {
            key: "k".into(),
            value: Bytes::from(serde_json::to_vec(&r).unwrap()),
            create_revision: 1,
            mod_revision: 1,
        };
        assert_eq!(record_value(Some(&kv)), r);
        assert_eq!(record_value(None), Record::default());
    }
}
