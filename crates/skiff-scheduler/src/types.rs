//! What the scheduler knows about pods and nodes, computed once per object
//! version so that filters and scores do arithmetic, not parsing.

use std::collections::BTreeMap;
use std::sync::Arc;

use k8s_openapi::api::core::v1::{Container, Node, Pod, PodAffinityTerm, Taint, Toleration};

use crate::quantity;

pub type Labels = BTreeMap<String, String>;

// ---- resources ---------------------------------------------------------------

/// Quantities of resources: cpu in millicores, the rest in units.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Resource {
    pub milli_cpu: i64,
    pub memory: i64,
    pub ephemeral_storage: i64,
    pub pods: i64,
    /// Extended and other named resources, sorted by name.
    pub scalar: Vec<(String, i64)>,
}

impl Resource {
    pub fn from_map(
        m: Option<&BTreeMap<String, k8s_openapi::apimachinery::pkg::api::resource::Quantity>>,
    ) -> Resource {
        let mut r = Resource::default();
        if let Some(m) = m {
            for (k, v) in m {
                r.set(k, &v.0);
            }
        }
        r
    }

    fn set(&mut self, name: &str, q: &str) {
        match name {
            "cpu" => self.milli_cpu = quantity::milli(q),
            "memory" => self.memory = quantity::units(q),
            "ephemeral-storage" => self.ephemeral_storage = quantity::units(q),
            "pods" => self.pods = quantity::units(q),
            _ => self.set_scalar(name, quantity::units(q)),
        }
    }

    pub fn get(&self, name: &str) -> i64 {
        match name {
            "cpu" => self.milli_cpu,
            "memory" => self.memory,
            "ephemeral-storage" => self.ephemeral_storage,
            "pods" => self.pods,
            _ => self.scalar(name),
        }
    }

    pub fn scalar(&self, name: &str) -> i64 {
        self.scalar
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| *v)
            .unwrap_or(0)
    }

    pub fn set_scalar(&mut self, name: &str, v: i64) {
        match self.scalar.binary_search_by(|(n, _)| n.as_str().cmp(name)) {
            Ok(i) => self.scalar[i].1 = v,
            Err(i) => self.scalar.insert(i, (name.to_string(), v)),
        }
    }

    pub fn add(&mut self, o: &Resource) {
        self.milli_cpu = self.milli_cpu.saturating_add(o.milli_cpu);
        self.memory = self.memory.saturating_add(o.memory);
        self.ephemeral_storage = self.ephemeral_storage.saturating_add(o.ephemeral_storage);
        self.pods = self.pods.saturating_add(o.pods);
        for (n, v) in &o.scalar {
            let cur = self.scalar(n);
            self.set_scalar(n, cur.saturating_add(*v));
        }
    }

    pub fn sub(&mut self, o: &Resource) {
        self.milli_cpu = self.milli_cpu.saturating_sub(o.milli_cpu);
        self.memory = self.memory.saturating_sub(o.memory);
        self.ephemeral_storage = self.ephemeral_storage.saturating_sub(o.ephemeral_storage);
        self.pods = self.pods.saturating_sub(o.pods);
        for (n, v) in &o.scalar {
            let cur = self.scalar(n);
            self.set_scalar(n, cur.saturating_sub(*v));
        }
    }

    /// Each field the larger of the two.
    pub fn max_with(&mut self, o: &Resource) {
        self.milli_cpu = self.milli_cpu.max(o.milli_cpu);
        self.memory = self.memory.max(o.memory);
        self.ephemeral_storage = self.ephemeral_storage.max(o.ephemeral_storage);
        self.pods = self.pods.max(o.pods);
        for (n, v) in &o.scalar {
            let cur = self.scalar(n);
            self.set_scalar(n, cur.max(*v));
        }
    }
}

/// The cpu and memory assumed for a container that requests none, for
/// scoring only (Kubernetes' 100m and 200Mi).
pub const DEFAULT_MILLI_CPU_REQUEST: i64 = 100;
pub const DEFAULT_MEMORY_REQUEST: i64 = 200 * 1024 * 1024;

fn container_requests(c: &Container) -> Resource {
    Resource::from_map(
        c.resources
            .as_ref()
            .and_then(|r| r.requests.as_ref())
            .or_else(|| {
                // Requests default to limits (the API server usually does this).
                c.resources.as_ref().and_then(|r| r.limits.as_ref())
            }),
    )
}

fn is_restartable_init(c: &Container) -> bool {
    c.restart_policy.as_deref() == Some("Always")
}

/// The effective request of a pod as Kubernetes computes it: the sum of its
/// containers (and sidecars), or the largest init container if that is
/// larger, plus the pod overhead. `non_zero` substitutes the scoring
/// defaults for containers requesting no cpu or memory.
pub fn pod_requests(pod: &Pod, non_zero: bool) -> Resource {
    let Some(spec) = pod.spec.as_ref() else {
        return Resource::default();
    };
    let one = |c: &Container| {
        let mut r = container_requests(c);
        if non_zero {
            if r.milli_cpu == 0 {
                r.milli_cpu = DEFAULT_MILLI_CPU_REQUEST;
            }
            if r.memory == 0 {
                r.memory = DEFAULT_MEMORY_REQUEST;
            }
        }
        r
    };
    let mut sum = Resource::default();
    for c in &spec.containers {
        sum.add(&one(c));
    }
    // Init containers run one after another; sidecars (restartable init
    // containers) keep running and add up.
    let mut sidecars = Resource::default();
    let mut init_max = Resource::default();
    for c in spec.init_containers.iter().flatten() {
        let r = one(c);
        if is_restartable_init(c) {
            sidecars.add(&r);
            sum.add(&r);
        } else {
            let mut peak = r;
            peak.add(&sidecars);
            init_max.max_with(&peak);
        }
    }
    sum.max_with(&init_max);
    if let Some(o) = spec.overhead.as_ref() {
        sum.add(&Resource::from_map(Some(o)));
    }
    sum
}

// ---- selectors, node affinity, taints and tolerations ------------------------------

pub use skiff_helpers::scheduling::{
    tolerated, tolerates, NodeTerm, RequiredNodeAffinity, Requirement, SelOp, Selector,
};

// ---- pod affinity ------------------------------------------------------------------

/// A compiled pod (anti-)affinity term.
#[derive(Debug, Clone)]
pub struct AffinityTerm {
    pub selector: Selector,
    pub topology_key: String,
    /// Namespaces listed; with no namespaceSelector and no list, the pod's own.
    pub namespaces: Vec<String>,
    pub namespace_selector: Option<Selector>,
    pub weight: i32,
}

impl AffinityTerm {
    fn compile(t: &PodAffinityTerm, pod: &Pod, weight: i32) -> AffinityTerm {
        let mut selector = Selector::from_label_selector(t.label_selector.as_ref());
        let labels = pod.metadata.labels.as_ref();
        // matchLabelKeys / mismatchLabelKeys: the pod's own values join the
        // selector.
        if !selector.never {
            for k in t.match_label_keys.iter().flatten() {
                if let Some(v) = labels.and_then(|l| l.get(k)) {
                    selector.reqs.push(Requirement {
                        key: k.clone(),
                        op: SelOp::In,
                        values: vec![v.clone()],
                    });
                }
            }
            for k in t.mismatch_label_keys.iter().flatten() {
                if let Some(v) = labels.and_then(|l| l.get(k)) {
                    selector.reqs.push(Requirement {
                        key: k.clone(),
                        op: SelOp::NotIn,
                        values: vec![v.clone()],
                    });
                }
            }
        }
        let mut namespaces = t.namespaces.clone().unwrap_or_default();
        let namespace_selector = t
            .namespace_selector
            .as_ref()
            .map(|s| Selector::from_label_selector(Some(s)));
        if namespaces.is_empty() && namespace_selector.is_none() {
            namespaces.push(pod.metadata.namespace.clone().unwrap_or_default());
        }
        AffinityTerm {
            selector,
            topology_key: t.topology_key.clone(),
            namespaces,
            namespace_selector,
            weight,
        }
    }

    /// Whether `pod` (in a namespace with `ns_labels`) is selected by this term.
    pub fn matches(
        &self,
        pod: &PodInfo,
        ns_labels: &std::collections::HashMap<String, Labels>,
    ) -> bool {
        let ns_ok = self.namespaces.iter().any(|n| n == &pod.namespace)
            || self
                .namespace_selector
                .as_ref()
                .is_some_and(|s| s.is_everything() || s.matches(ns_labels.get(&pod.namespace)));
        ns_ok && self.selector.matches(pod.labels())
    }
}

#[derive(Debug, Clone, Default)]
pub struct PodAffinity {
    pub required_affinity: Vec<AffinityTerm>,
    pub required_anti_affinity: Vec<AffinityTerm>,
    pub preferred_affinity: Vec<AffinityTerm>,
    pub preferred_anti_affinity: Vec<AffinityTerm>,
}

impl PodAffinity {
    fn of(pod: &Pod) -> PodAffinity {
        let mut out = PodAffinity::default();
        let Some(aff) = pod.spec.as_ref().and_then(|s| s.affinity.as_ref()) else {
            return out;
        };
        if let Some(a) = &aff.pod_affinity {
            for t in a
                .required_during_scheduling_ignored_during_execution
                .iter()
                .flatten()
            {
                out.required_affinity.push(AffinityTerm::compile(t, pod, 0));
            }
            for w in a
                .preferred_during_scheduling_ignored_during_execution
                .iter()
                .flatten()
            {
                out.preferred_affinity.push(AffinityTerm::compile(
                    &w.pod_affinity_term,
                    pod,
                    w.weight,
                ));
            }
        }
        if let Some(a) = &aff.pod_anti_affinity {
            for t in a
                .required_during_scheduling_ignored_during_execution
                .iter()
                .flatten()
            {
                out.required_anti_affinity
                    .push(AffinityTerm::compile(t, pod, 0));
            }
            for w in a
                .preferred_during_scheduling_ignored_during_execution
                .iter()
                .flatten()
            {
                out.preferred_anti_affinity.push(AffinityTerm::compile(
                    &w.pod_affinity_term,
                    pod,
                    w.weight,
                ));
            }
        }
        out
    }

    pub fn is_empty(&self) -> bool {
        self.required_affinity.is_empty()
            && self.required_anti_affinity.is_empty()
            && self.preferred_affinity.is_empty()
            && self.preferred_anti_affinity.is_empty()
    }
}

// ---- pods ------------------------------------------------------------------------

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct HostPort {
    pub ip: String,
    pub protocol: String,
    pub port: i32,
}

impl HostPort {
    pub fn conflicts(&self, o: &HostPort) -> bool {
        let any = |ip: &str| ip.is_empty() || ip == "0.0.0.0" || ip == "::";
        self.port == o.port
            && self.protocol == o.protocol
            && (self.ip == o.ip || any(&self.ip) || any(&o.ip))
    }
}

/// A pod with everything the plugins need, computed once.
#[derive(Debug)]
pub struct PodInfo {
    pub pod: Pod,
    pub uid: String,
    pub namespace: String,
    pub name: String,
    /// `namespace/name`.
    pub key: String,
    pub node_name: String,
    pub scheduler_name: String,
    /// `spec.priority`, or resolved from the priority class by the scheduler.
    pub priority: i32,
    pub requests: Resource,
    pub non_zero_requests: Resource,
    pub host_ports: Vec<HostPort>,
    pub affinity: PodAffinity,
    pub node_affinity: RequiredNodeAffinity,
    pub terminating: bool,
}

impl PodInfo {
    pub fn new(pod: Pod, priority: i32) -> PodInfo {
        let meta = &pod.metadata;
        let namespace = meta.namespace.clone().unwrap_or_default();
        let name = meta.name.clone().unwrap_or_default();
        let spec = pod.spec.as_ref();
        let mut host_ports = Vec::new();
        for c in spec.map(|s| s.containers.as_slice()).unwrap_or_default() {
            for p in c.ports.iter().flatten() {
                if let Some(hp) = p.host_port.filter(|p| *p > 0) {
                    host_ports.push(HostPort {
                        ip: p.host_ip.clone().unwrap_or_default(),
                        protocol: p.protocol.clone().unwrap_or_else(|| "TCP".into()),
                        port: hp,
                    });
                }
            }
        }
        PodInfo {
            uid: meta.uid.clone().unwrap_or_default(),
            key: format!("{namespace}/{name}"),
            namespace,
            name,
            node_name: spec.and_then(|s| s.node_name.clone()).unwrap_or_default(),
            scheduler_name: spec
                .and_then(|s| s.scheduler_name.clone())
                .filter(|s| !s.is_empty())
                .unwrap_or_else(|| crate::DEFAULT_SCHEDULER_NAME.to_string()),
            priority,
            requests: pod_requests(&pod, false),
            non_zero_requests: pod_requests(&pod, true),
            host_ports,
            affinity: PodAffinity::of(&pod),
            node_affinity: RequiredNodeAffinity::of(pod.spec.as_ref()),
            terminating: meta.deletion_timestamp.is_some(),
            pod,
        }
    }

    pub fn labels(&self) -> Option<&Labels> {
        self.pod.metadata.labels.as_ref()
    }

    pub fn tolerations(&self) -> &[Toleration] {
        self.pod
            .spec
            .as_ref()
            .and_then(|s| s.tolerations.as_deref())
            .unwrap_or_default()
    }

    pub fn spec_priority(pod: &Pod) -> Option<i32> {
        pod.spec.as_ref().and_then(|s| s.priority)
    }

    pub fn preemption_never(&self) -> bool {
        self.pod
            .spec
            .as_ref()
            .and_then(|s| s.preemption_policy.as_deref())
            == Some("Never")
    }

    pub fn start_time(&self) -> Option<k8s_openapi::jiff::Timestamp> {
        self.pod
            .status
            .as_ref()
            .and_then(|s| s.start_time.as_ref())
            .map(|t| t.0)
            .or_else(|| self.pod.metadata.creation_timestamp.as_ref().map(|t| t.0))
    }
}

// ---- nodes -----------------------------------------------------------------------

/// A node with the pods on it (bound and assumed) and what they use.
#[derive(Debug, Clone)]
pub struct NodeInfo {
    pub name: String,
    pub node: Option<Arc<Node>>,
    pub allocatable: Resource,
    pub requested: Resource,
    pub non_zero_requested: Resource,
    pub pods: Vec<Arc<PodInfo>>,
    /// How many of `pods` have any pod affinity / required anti-affinity.
    pub pods_with_affinity: usize,
    pub pods_with_required_anti_affinity: usize,
    pub used_ports: Vec<HostPort>,
    /// Normalized image names on the node, with sizes.
    pub images: Vec<(String, i64)>,
    pub unschedulable: bool,
    pub taints: Vec<Taint>,
    /// Bumped on every change.
    pub generation: u64,
}

/// `nginx` → `docker.io/library/nginx:latest`, as images are compared.
pub fn normalize_image(name: &str) -> String {
    let mut n = name.to_string();
    let last = n.rsplit('/').next().unwrap_or("");
    if !last.contains(':') && !n.contains('@') {
        n.push_str(":latest");
    }
    let first = n.split('/').next().unwrap_or("");
    let has_registry =
        n.contains('/') && (first.contains('.') || first.contains(':') || first == "localhost");
    if !has_registry {
        if n.contains('/') {
            n = format!("docker.io/{n}");
        } else {
            n = format!("docker.io/library/{n}");
        }
    }
    n
}

impl NodeInfo {
    pub fn empty(name: &str) -> NodeInfo {
        NodeInfo {
            name: name.to_string(),
            node: None,
            allocatable: Resource::default(),
            requested: Resource::default(),
            non_zero_requested: Resource::default(),
            pods: Vec::new(),
            pods_with_affinity: 0,
            pods_with_required_anti_affinity: 0,
            used_ports: Vec::new(),
            images: Vec::new(),
            unschedulable: false,
            taints: Vec::new(),
            generation: 0,
        }
    }

    pub fn set_node(&mut self, node: Arc<Node>) {
        let status = node.status.as_ref();
        self.allocatable = Resource::from_map(
            status
                .and_then(|s| s.allocatable.as_ref())
                .or_else(|| status.and_then(|s| s.capacity.as_ref())),
        );
        self.unschedulable = node
            .spec
            .as_ref()
            .and_then(|s| s.unschedulable)
            .unwrap_or(false);
        self.taints = node
            .spec
            .as_ref()
            .and_then(|s| s.taints.clone())
            .unwrap_or_default();
        self.images = status
            .and_then(|s| s.images.as_ref())
            .map(|imgs| {
                imgs.iter()
                    .flat_map(|i| {
                        let size = i.size_bytes.unwrap_or(0);
                        i.names
                            .iter()
                            .flatten()
                            .map(move |n| (normalize_image(n), size))
                    })
                    .collect()
            })
            .unwrap_or_default();
        self.node = Some(node);
        self.generation += 1;
    }

    pub fn labels(&self) -> Option<&Labels> {
        self.node.as_ref().and_then(|n| n.metadata.labels.as_ref())
    }

    pub fn label(&self, key: &str) -> Option<&str> {
        self.labels().and_then(|l| l.get(key)).map(String::as_str)
    }

    pub fn add_pod(&mut self, p: Arc<PodInfo>) {
        self.requested.add(&p.requests);
        self.non_zero_requested.milli_cpu += p.non_zero_requests.milli_cpu;
        self.non_zero_requested.memory += p.non_zero_requests.memory;
        if !p.affinity.is_empty() {
            self.pods_with_affinity += 1;
        }
        if !p.affinity.required_anti_affinity.is_empty() {
            self.pods_with_required_anti_affinity += 1;
        }
        self.used_ports.extend(p.host_ports.iter().cloned());
        self.pods.push(p);
        self.generation += 1;
    }

    /// Removes the pod with `uid`; returns it if it was here.
    pub fn remove_pod(&mut self, uid: &str) -> Option<Arc<PodInfo>> {
        let i = self.pods.iter().position(|p| p.uid == uid)?;
        let p = self.pods.swap_remove(i);
        self.requested.sub(&p.requests);
        self.non_zero_requested.milli_cpu -= p.non_zero_requests.milli_cpu;
        self.non_zero_requested.memory -= p.non_zero_requests.memory;
        if !p.affinity.is_empty() {
            self.pods_with_affinity -= 1;
        }
        if !p.affinity.required_anti_affinity.is_empty() {
            self.pods_with_required_anti_affinity -= 1;
        }
        for hp in &p.host_ports {
            if let Some(j) = self.used_ports.iter().position(|u| u == hp) {
                self.used_ports.swap_remove(j);
            }
        }
        self.generation += 1;
        Some(p)
    }
}
