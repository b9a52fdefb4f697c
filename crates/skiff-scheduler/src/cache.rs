//! The scheduler's view of the cluster: every node with the pods on it
//! (bound, and assumed while their binding is in flight), namespaces'
//! labels, and what the plugins need across nodes. The scheduling loop owns
//! it, so a scheduling cycle reads it directly instead of a copy.

use std::collections::HashMap;
use std::sync::Arc;

use k8s_openapi::api::core::v1::Node;

use crate::types::{Labels, NodeInfo, PodInfo};

/// What plugins read: all nodes, plus indices.
#[derive(Default)]
pub struct Snapshot {
    pub nodes: Vec<NodeInfo>,
    pub index: HashMap<String, usize>,
    /// Labels of each namespace (for namespaceSelector).
    pub namespaces: HashMap<String, Labels>,
    /// How many nodes hold each (normalized) image.
    pub image_nodes: HashMap<String, usize>,
    /// Total pods in the cache with any pod affinity / required anti-affinity.
    pub pods_with_affinity: usize,
    pub pods_with_required_anti_affinity: usize,
    /// Pods nominated to a node by preemption: node → pods.
    pub nominated: HashMap<String, Vec<Arc<PodInfo>>>,
    /// PodDisruptionBudgets (for preemption).
    pub pdbs: Vec<crate::plugins::default_preemption::PdbInfo>,
    /// Service selectors: namespace → service name → selector.
    pub services: HashMap<String, HashMap<String, crate::types::Selector>>,
    /// Claims, volumes and storage classes (for VolumeBinding).
    pub volumes: crate::plugins::volume_binding::Volumes,
    real_count: usize,
}

impl Snapshot {
    pub fn node(&self, name: &str) -> Option<&NodeInfo> {
        self.index.get(name).map(|i| &self.nodes[*i])
    }

    pub fn namespace_labels(&self, ns: &str) -> Option<Labels> {
        self.namespaces.get(ns).cloned()
    }

    /// Only nodes that exist as Node objects (pods may reference others).
    pub fn real_nodes(&self) -> impl Iterator<Item = &NodeInfo> {
        self.nodes.iter().filter(|n| n.node.is_some())
    }

    pub fn num_real_nodes(&self) -> usize {
        self.real_count
    }

    /// The selectors of the Services that select `pod`, combined (for
    /// PodTopologySpread's default constraints). `None` if none does.
    pub fn service_selector_for(&self, pod: &PodInfo) -> Option<crate::types::Selector> {
        let svcs = self.services.get(&pod.namespace)?;
        let mut out: Option<crate::types::Selector> = None;
        for sel in svcs.values() {
            if sel.is_everything() || !sel.matches(pod.labels()) {
                continue;
            }
            let o = out.get_or_insert_with(Default::default);
            for r in &sel.reqs {
                if !o.reqs.contains(r) {
                    o.reqs.push(r.clone());
                }
            }
        }
        out
    }
}

#[derive(Debug, Clone)]
struct PodEntry {
    info: Arc<PodInfo>,
    node: String,
    assumed: bool,
}

/// The snapshot plus pod bookkeeping.
#[derive(Default)]
pub struct Cache {
    pub snap: Snapshot,
    pods: HashMap<String, PodEntry>,
}

impl Snapshot {
    fn node_mut(&mut self, name: &str) -> &mut NodeInfo {
        let i = match self.index.get(name) {
            Some(i) => *i,
            None => {
                self.nodes.push(NodeInfo::empty(name));
                self.index.insert(name.to_string(), self.nodes.len() - 1);
                self.nodes.len() - 1
            }
        };
        &mut self.nodes[i]
    }

    fn remove_node_entry(&mut self, name: &str) {
        if let Some(i) = self.index.remove(name) {
            self.nodes.swap_remove(i);
            if i < self.nodes.len() {
                let moved = self.nodes[i].name.clone();
                self.index.insert(moved, i);
            }
        }
    }

    fn count_images(&mut self, n: &NodeInfo, delta: isize) {
        let mut seen = std::collections::HashSet::new();
        for (img, _) in &n.images {
            if !seen.insert(img.as_str()) {
                continue;
            }
            let c = self.image_nodes.entry(img.clone()).or_insert(0);
            *c = (*c as isize + delta).max(0) as usize;
        }
    }
}

impl Cache {
    pub fn new() -> Cache {
        Cache::default()
    }

    /// Adds or replaces a node. Returns the previous Node object.
    pub fn upsert_node(&mut self, node: Node) -> Option<Arc<Node>> {
        let name = node.metadata.name.clone().unwrap_or_default();
        let old = self.snap.node(&name).and_then(|n| n.node.clone());
        if let Some(i) = self.snap.index.get(&name).copied() {
            let prev = self.snap.nodes[i].clone();
            self.snap.count_images(&prev, -1);
        }
        let ni = self.snap.node_mut(&name);
        ni.set_node(Arc::new(node));
        let ni = ni.clone();
        self.snap.count_images(&ni, 1);
        if old.is_none() {
            self.snap.real_count += 1;
        }
        old
    }

    pub fn remove_node(&mut self, name: &str) {
        let Some(i) = self.snap.index.get(name).copied() else {
            return;
        };
        let prev = self.snap.nodes[i].clone();
        self.snap.count_images(&prev, -1);
        if prev.node.is_some() {
            self.snap.real_count -= 1;
        }
        if prev.pods.is_empty() {
            self.snap.remove_node_entry(name);
        } else {
            // Keep the pods' accounting until they go; the node is gone.
            let n = &mut self.snap.nodes[i];
            n.node = None;
            n.images.clear();
            n.generation += 1;
        }
    }

    fn add_to_node(&mut self, info: &Arc<PodInfo>, node: &str) {
        if !info.affinity.is_empty() {
            self.snap.pods_with_affinity += 1;
        }
        if !info.affinity.required_anti_affinity.is_empty() {
            self.snap.pods_with_required_anti_affinity += 1;
        }
        self.snap.node_mut(node).add_pod(info.clone());
    }

    fn remove_from_node(&mut self, uid: &str, node: &str) {
        let Some(i) = self.snap.index.get(node).copied() else {
            return;
        };
        if let Some(p) = self.snap.nodes[i].remove_pod(uid) {
            if !p.affinity.is_empty() {
                self.snap.pods_with_affinity -= 1;
            }
            if !p.affinity.required_anti_affinity.is_empty() {
                self.snap.pods_with_required_anti_affinity -= 1;
            }
        }
        if self.snap.nodes[i].node.is_none() && self.snap.nodes[i].pods.is_empty() {
            self.snap.remove_node_entry(node);
        }
    }

    /// A pod bound to a node (observed from the API). Confirms an assumed
    /// pod or replaces an older version.
    pub fn add_or_update_bound_pod(&mut self, info: impl Into<Arc<PodInfo>>) {
        let info: Arc<PodInfo> = info.into();
        let uid = info.uid.clone();
        if let Some(prev) = self.pods.remove(&uid) {
            self.remove_from_node(&uid, &prev.node);
        }
        let node = info.node_name.clone();
        self.add_to_node(&info, &node);
        self.pods.insert(
            uid,
            PodEntry {
                info,
                node,
                assumed: false,
            },
        );
    }

    /// Removes a pod (deleted, finished, or forgotten). Returns where it was.
    pub fn remove_pod(&mut self, uid: &str) -> Option<(Arc<PodInfo>, String)> {
        let prev = self.pods.remove(uid)?;
        self.remove_from_node(uid, &prev.node);
        Some((prev.info, prev.node))
    }

    /// Counts a pod on `node` before its binding is confirmed.
    pub fn assume(&mut self, info: Arc<PodInfo>, node: &str) {
        let uid = info.uid.clone();
        if let Some(prev) = self.pods.remove(&uid) {
            self.remove_from_node(&uid, &prev.node);
        }
        self.add_to_node(&info, node);
        self.pods.insert(
            uid,
            PodEntry {
                info,
                node: node.to_string(),
                assumed: true,
            },
        );
    }

    /// Undoes `assume` after a failed binding (only if still assumed).
    pub fn forget(&mut self, uid: &str) {
        if self.pods.get(uid).is_some_and(|e| e.assumed) {
            self.remove_pod(uid);
        }
    }

    pub fn is_assumed(&self, uid: &str) -> bool {
        self.pods.get(uid).is_some_and(|e| e.assumed)
    }

    pub fn contains_pod(&self, uid: &str) -> bool {
        self.pods.contains_key(uid)
    }

    pub fn set_namespace(&mut self, name: String, labels: Labels) {
        self.snap.namespaces.insert(name, labels);
    }

    pub fn remove_namespace(&mut self, name: &str) {
        self.snap.namespaces.remove(name);
    }

    pub fn pod_count(&self) -> usize {
        self.pods.len()
    }
}
