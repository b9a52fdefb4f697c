//! What the scheduler knows about pods and nodes, computed once per object
//! version so that filters and scores do arithmetic, not parsing.

use std::collections::BTreeMap;
use std::sync::Arc;

use k8s_openapi::api::core::v1::{Node, Pod, PodAffinityTerm, Taint, Toleration};

pub type Labels = BTreeMap<String, String>;

// ---- resources ---------------------------------------------------------------

pub use skiff_helpers::resources::{
    pod_requests, Resource, DEFAULT_MEMORY_REQUEST, DEFAULT_MILLI_CPU_REQUEST,
};

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
