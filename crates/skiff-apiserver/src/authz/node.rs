//! The Node authorizer (kube-apiserver's `--authorization-mode=Node`): a
//! request by `system:node:<name>` in group `system:nodes` may read the
//! Secrets, ConfigMaps, PersistentVolumeClaims (and their
//! PersistentVolumes), and create tokens for the ServiceAccounts, of pods
//! bound to that node, and its own Lease and CSINode; everything else is
//! checked against `system:node`'s static rules (Kubernetes' `NodeRules`),
//! which the NodeRestriction admission plugin narrows further. Anything
//! else gets no opinion (RBAC decides next).
//!
//! The graph, as kube-apiserver keeps it: for each node, the objects its
//! bound pods reference, counted per referencing pod. It follows the watch
//! cache's pod events incrementally (a pod's references are read once, when
//! it is bound: what a pod references does not change after that), and is
//! rebuilt from a snapshot only when the cache's history no longer reaches
//! back to what the graph has applied.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use serde_json::Value;
use skiff_core::rbac::{self, Attributes, PolicyRule};
use skiff_core::resources::{self, ResourceInfo};

use crate::watchcache::{EventType, Filter, Since, WatchCache};

/// The group every node identity is in.
pub const NODES_GROUP: &str = "system:nodes";
/// The prefix of a node's user name.
pub const NODE_USER_PREFIX: &str = "system:node:";

/// The node a user is, if it is one: `Some("")` for a member of
/// `system:nodes` whose name is not a node's.
pub fn node_identity<'a>(user: &'a str, groups: &[String]) -> Option<&'a str> {
    if !groups.iter().any(|g| g == NODES_GROUP) {
        return None;
    }
    Some(user.strip_prefix(NODE_USER_PREFIX).unwrap_or(""))
}

/// What the Node authorizer says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    Allow,
    /// No opinion, with the reason shown in a 403 if nothing else allows.
    NoOpinion(String),
}

/// An object a pod refers to.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Ref {
    Secret(String, String),
    ConfigMap(String, String),
    Pvc(String, String),
    ServiceAccount(String, String),
}

/// The objects a pod's spec references (kubelet's `VisitPodSecretNames`,
/// `VisitPodConfigmapNames`, claims and its ServiceAccount).
pub fn pod_refs(pod: &Value) -> Vec<Ref> {
    let ns = pod
        .pointer("/metadata/namespace")
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_string();
    let pod_name = pod
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or("");
    let mut out = Vec::new();
    let Some(spec) = pod.get("spec") else {
        return out;
    };
    let name_of = |v: &Value, field: &str| -> Option<String> {
        v.get(field)
            .and_then(Value::as_str)
            .filter(|s| !s.is_empty())
            .map(str::to_string)
    };
    let sa = spec
        .get("serviceAccountName")
        .and_then(Value::as_str)
        .filter(|s| !s.is_empty())
        .unwrap_or("default");
    out.push(Ref::ServiceAccount(ns.clone(), sa.to_string()));
    for s in spec
        .get("imagePullSecrets")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        if let Some(n) = name_of(s, "name") {
            out.push(Ref::Secret(ns.clone(), n));
        }
    }
    for list in ["initContainers", "containers", "ephemeralContainers"] {
        for c in spec
            .get(list)
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            for e in c
                .get("envFrom")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
            {
                if let Some(n) = e.get("secretRef").and_then(|r| name_of(r, "name")) {
                    out.push(Ref::Secret(ns.clone(), n));
                }
                if let Some(n) = e.get("configMapRef").and_then(|r| name_of(r, "name")) {
                    out.push(Ref::ConfigMap(ns.clone(), n));
                }
            }
            for e in c.get("env").and_then(Value::as_array).into_iter().flatten() {
                let from = e.get("valueFrom");
                if let Some(n) = from
                    .and_then(|f| f.get("secretKeyRef"))
                    .and_then(|r| name_of(r, "name"))
                {
                    out.push(Ref::Secret(ns.clone(), n));
                }
                if let Some(n) = from
                    .and_then(|f| f.get("configMapKeyRef"))
                    .and_then(|r| name_of(r, "name"))
                {
                    out.push(Ref::ConfigMap(ns.clone(), n));
                }
            }
        }
    }
    for v in spec
        .get("volumes")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        if let Some(n) = v.get("secret").and_then(|s| name_of(s, "secretName")) {
            out.push(Ref::Secret(ns.clone(), n));
        }
        if let Some(n) = v.get("configMap").and_then(|s| name_of(s, "name")) {
            out.push(Ref::ConfigMap(ns.clone(), n));
        }
        for src in v
            .pointer("/projected/sources")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            if let Some(n) = src.get("secret").and_then(|s| name_of(s, "name")) {
                out.push(Ref::Secret(ns.clone(), n));
            }
            if let Some(n) = src.get("configMap").and_then(|s| name_of(s, "name")) {
                out.push(Ref::ConfigMap(ns.clone(), n));
            }
        }
        if let Some(n) = v
            .get("persistentVolumeClaim")
            .and_then(|s| name_of(s, "claimName"))
        {
            out.push(Ref::Pvc(ns.clone(), n));
        }
        if v.get("ephemeral").is_some() {
            let vname = v.get("name").and_then(Value::as_str).unwrap_or("");
            out.push(Ref::Pvc(ns.clone(), format!("{pod_name}-{vname}")));
        }
        // Volume plugins that name a secret of their own.
        for (plugin, field) in [
            ("azureFile", "secretName"),
            ("cephfs", "secretRef"),
            ("cinder", "secretRef"),
            ("flexVolume", "secretRef"),
            ("iscsi", "secretRef"),
            ("rbd", "secretRef"),
            ("scaleIO", "secretRef"),
            ("storageos", "secretRef"),
            ("csi", "nodePublishSecretRef"),
        ] {
            let Some(p) = v.get(plugin) else { continue };
            let n = match p.get(field) {
                Some(Value::String(s)) => Some(s.clone()),
                Some(r) => name_of(r, "name"),
                None => None,
            };
            if let Some(n) = n.filter(|n| !n.is_empty()) {
                out.push(Ref::Secret(ns.clone(), n));
            }
        }
    }
    out.sort();
    out.dedup();
    out
}

/// Pods bound to nodes and what they reference.
#[derive(Default)]
struct Graph {
    /// The pod revision applied last (-1: nothing yet).
    applied: i64,
    /// Pod key → (node, references).
    pods: HashMap<String, (String, Vec<Ref>)>,
    /// Node → reference → how many of its pods hold it.
    by_node: HashMap<String, HashMap<Ref, usize>>,
}

impl Graph {
    fn add(&mut self, key: &str, node: String, refs: Vec<Ref>) {
        self.remove(key);
        let counts = self.by_node.entry(node.clone()).or_default();
        for r in &refs {
            *counts.entry(r.clone()).or_default() += 1;
        }
        self.pods.insert(key.to_string(), (node, refs));
    }

    fn remove(&mut self, key: &str) {
        let Some((node, refs)) = self.pods.remove(key) else {
            return;
        };
        if let Some(counts) = self.by_node.get_mut(&node) {
            for r in refs {
                if let Some(c) = counts.get_mut(&r) {
                    *c -= 1;
                    if *c == 0 {
                        counts.remove(&r);
                    }
                }
            }
            if counts.is_empty() {
                self.by_node.remove(&node);
            }
        }
    }

    fn has(&self, node: &str, r: &Ref) -> bool {
        self.by_node.get(node).is_some_and(|m| m.contains_key(r))
    }

    fn refs_of(&self, node: &str) -> impl Iterator<Item = &Ref> {
        self.by_node.get(node).into_iter().flat_map(|m| m.keys())
    }
}

fn res(group: &str, plural: &str) -> &'static ResourceInfo {
    resources::lookup(group, "v1", plural).expect("built-in resource")
}

/// The Node authorizer.
pub struct NodeAuthorizer {
    cache: Arc<WatchCache>,
    graph: Mutex<Graph>,
    rules: Vec<PolicyRule>,
}

impl NodeAuthorizer {
    pub fn new(cache: Arc<WatchCache>) -> NodeAuthorizer {
        NodeAuthorizer {
            cache,
            graph: Mutex::new(Graph {
                applied: -1,
                ..Default::default()
            }),
            rules: skiff_core::bootstrap_nodes::node_rules(),
        }
    }

    /// Brings the graph up to the watch cache's pods.
    fn catch_up(&self, g: &mut Graph) {
        let pods = self.cache.resource(res("", "pods"));
        if g.applied >= 0 {
            if let Since::Events(evs) = pods.since(g.applied, usize::MAX) {
                for ev in evs {
                    let o = &ev.object;
                    match ev.kind {
                        EventType::Deleted => g.remove(&o.key),
                        _ => {
                            let node = o.field("spec.nodeName").unwrap_or_default();
                            if node.is_empty() {
                                g.remove(&o.key);
                            } else if g.pods.get(&o.key).is_none_or(|(n, _)| *n != node) {
                                if let Ok(v) = serde_json::from_slice::<Value>(&o.bytes()) {
                                    g.add(&o.key, node, pod_refs(&v));
                                }
                            }
                        }
                    }
                    g.applied = g.applied.max(ev.revision);
                }
                return;
            }
        }
        // First use, or the history no longer reaches back: rebuild.
        let (objs, rev) = pods.snapshot_at(&Filter::default());
        *g = Graph {
            applied: rev,
            ..Default::default()
        };
        for o in objs {
            let node = o.field("spec.nodeName").unwrap_or_default();
            if node.is_empty() {
                continue;
            }
            if let Ok(v) = serde_json::from_slice::<Value>(&o.bytes()) {
                g.add(&o.key, node, pod_refs(&v));
            }
        }
    }

    /// Whether `node` has a path to `target` (a PersistentVolume is reached
    /// through a claim bound to it; a Secret also through such a volume).
    fn has_path(&self, node: &str, target: &Ref) -> bool {
        let mut g = self.graph.lock().unwrap_or_else(|e| e.into_inner());
        self.catch_up(&mut g);
        if g.has(node, target) {
            return true;
        }
        // Secrets a node's persistent volumes name.
        if let Ref::Secret(ns, name) = target {
            return self.volumes_of(&g, node).iter().any(|pv| {
                pv_secret_refs(pv)
                    .iter()
                    .any(|(sns, sname)| sns == ns && sname == name)
            });
        }
        false
    }

    /// The PersistentVolumes bound to the node's claims.
    fn volumes_of(&self, g: &Graph, node: &str) -> Vec<Arc<Value>> {
        let pvcs = self.cache.resource(res("", "persistentvolumeclaims"));
        let pvs = self.cache.resource(res("", "persistentvolumes"));
        let mut out = Vec::new();
        for r in g.refs_of(node) {
            let Ref::Pvc(ns, name) = r else { continue };
            let key = crate::object::object_key(pvcs.res, Some(ns), name);
            let Some(pvc) = pvcs.get(&key).and_then(|o| o.value()) else {
                continue;
            };
            let Some(vol) = pvc.pointer("/spec/volumeName").and_then(Value::as_str) else {
                continue;
            };
            let key = crate::object::object_key(pvs.res, None, vol);
            if let Some(pv) = pvs.get(&key).and_then(|o| o.value()) {
                out.push(pv);
            }
        }
        out
    }

    fn pv_allowed(&self, node: &str, name: &str) -> bool {
        let mut g = self.graph.lock().unwrap_or_else(|e| e.into_inner());
        self.catch_up(&mut g);
        self.volumes_of(&g, node)
            .iter()
            .any(|pv| pv.pointer("/metadata/name").and_then(Value::as_str) == Some(name))
    }

    /// Kubernetes' `NodeAuthorizer.Authorize`.
    pub fn authorize(&self, a: &Attributes) -> Decision {
        let Some(node) = node_identity(&a.user, &a.groups) else {
            return Decision::NoOpinion(String::new());
        };
        if node.is_empty() {
            return Decision::NoOpinion(format!("unknown node for user {:?}", a.user));
        }
        let no = |m: &str| Decision::NoOpinion(m.to_string());
        if a.resource_request {
            match (a.api_group.as_str(), a.resource.as_str()) {
                ("", "secrets") | ("", "configmaps") => {
                    if !matches!(a.verb.as_str(), "get" | "list" | "watch") {
                        return no("can only read resources of this type");
                    }
                    if !a.subresource.is_empty() {
                        return no("cannot read subresource");
                    }
                    if a.namespace.is_empty() {
                        return no("can only read namespaced object of this type");
                    }
                    if a.name.is_empty() {
                        return no("No Object name found");
                    }
                    let target = if a.resource == "secrets" {
                        Ref::Secret(a.namespace.clone(), a.name.clone())
                    } else {
                        Ref::ConfigMap(a.namespace.clone(), a.name.clone())
                    };
                    return self.path_decision(node, &target);
                }
                ("", "persistentvolumeclaims") => {
                    let verbs: &[&str] = if a.subresource == "status" {
                        &["get", "update", "patch"]
                    } else if a.subresource.is_empty() {
                        &["get"]
                    } else {
                        return no("cannot get subresource");
                    };
                    if !verbs.contains(&a.verb.as_str()) {
                        return no("can only get individual resources of this type");
                    }
                    if a.name.is_empty() {
                        return no("No Object name found");
                    }
                    return self
                        .path_decision(node, &Ref::Pvc(a.namespace.clone(), a.name.clone()));
                }
                ("", "persistentvolumes") => {
                    if a.verb != "get" {
                        return no("can only get individual resources of this type");
                    }
                    if !a.subresource.is_empty() {
                        return no("cannot get subresource");
                    }
                    return if self.pv_allowed(node, &a.name) {
                        Decision::Allow
                    } else {
                        no(&format!(
                            "no relationship found between node '{node}' and this object"
                        ))
                    };
                }
                ("", "serviceaccounts") => {
                    if a.verb != "create" {
                        return no(&format!(
                            "can only create tokens for individual service accounts, not {}",
                            a.verb
                        ));
                    }
                    if a.subresource != "token" {
                        return no(&format!(
                            "can only create token subresource of serviceaccount, not {}",
                            a.subresource
                        ));
                    }
                    return self.path_decision(
                        node,
                        &Ref::ServiceAccount(a.namespace.clone(), a.name.clone()),
                    );
                }
                ("coordination.k8s.io", "leases") => {
                    if !matches!(
                        a.verb.as_str(),
                        "get" | "create" | "update" | "patch" | "delete"
                    ) {
                        return no("can only get, create, update, patch, or delete a node lease");
                    }
                    if a.namespace != "kube-node-lease" {
                        return no("can only access leases in the kube-node-lease namespace");
                    }
                    if a.verb != "create" && a.name != node {
                        return no(
                            "can only access node lease with the same name as the requesting node",
                        );
                    }
                    return Decision::Allow;
                }
                ("storage.k8s.io", "csinodes") => {
                    if !matches!(
                        a.verb.as_str(),
                        "get" | "create" | "update" | "patch" | "delete"
                    ) {
                        return no("can only get, create, update, patch, or delete a CSINode");
                    }
                    if a.verb != "create" && a.name != node {
                        return no(
                            "can only access CSINode with the same name as the requesting node",
                        );
                    }
                    return Decision::Allow;
                }
                _ => {}
            }
        }
        if self.rules.iter().any(|r| rbac::rule_allows(r, a)) {
            Decision::Allow
        } else {
            Decision::NoOpinion(String::new())
        }
    }

    fn path_decision(&self, node: &str, target: &Ref) -> Decision {
        if self.has_path(node, target) {
            Decision::Allow
        } else {
            Decision::NoOpinion(format!(
                "no relationship found between node '{node}' and this object"
            ))
        }
    }
}

/// Secrets a PersistentVolume names (`secretRef`s with a namespace, as the
/// CSI and other plugins carry them).
fn pv_secret_refs(pv: &Value) -> Vec<(String, String)> {
    let mut out = Vec::new();
    fn walk(v: &Value, out: &mut Vec<(String, String)>) {
        match v {
            Value::Object(m) => {
                for (k, x) in m {
                    if k.ends_with("SecretRef") || k == "secretRef" {
                        let name = x.get("name").and_then(Value::as_str).unwrap_or("");
                        let ns = x.get("namespace").and_then(Value::as_str).unwrap_or("");
                        if !name.is_empty() && !ns.is_empty() {
                            out.push((ns.to_string(), name.to_string()));
                        }
                    }
                    walk(x, out);
                }
            }
            Value::Array(a) => a.iter().for_each(|x| walk(x, out)),
            _ => {}
        }
    }
    if let Some(spec) = pv.get("spec") {
        walk(spec, &mut out);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_pods_references_are_its_secrets_configmaps_claims_and_service_account() {
        let pod = json!({
            "metadata": {"name": "p", "namespace": "ns"},
            "spec": {
                "serviceAccountName": "sa",
                "imagePullSecrets": [{"name": "pull"}],
                "containers": [{
                    "name": "c",
                    "envFrom": [{"secretRef": {"name": "s-from"}}, {"configMapRef": {"name": "c-from"}}],
                    "env": [
                        {"name": "A", "valueFrom": {"secretKeyRef": {"name": "s-key", "key": "k"}}},
                        {"name": "B", "valueFrom": {"configMapKeyRef": {"name": "c-key", "key": "k"}}},
                    ],
                }],
                "volumes": [
                    {"name": "v1", "secret": {"secretName": "s-vol"}},
                    {"name": "v2", "configMap": {"name": "c-vol"}},
                    {"name": "v3", "projected": {"sources": [{"secret": {"name": "s-proj"}}, {"configMap": {"name": "c-proj"}}]}},
                    {"name": "v4", "persistentVolumeClaim": {"claimName": "claim"}},
                    {"name": "v5", "ephemeral": {}},
                    {"name": "v6", "csi": {"driver": "d", "nodePublishSecretRef": {"name": "s-csi"}}},
                ],
            }
        });
        let refs = pod_refs(&pod);
        let ns = || "ns".to_string();
        for r in [
            Ref::ServiceAccount(ns(), "sa".into()),
            Ref::Secret(ns(), "pull".into()),
            Ref::Secret(ns(), "s-from".into()),
            Ref::Secret(ns(), "s-key".into()),
            Ref::Secret(ns(), "s-vol".into()),
            Ref::Secret(ns(), "s-proj".into()),
            Ref::Secret(ns(), "s-csi".into()),
            Ref::ConfigMap(ns(), "c-from".into()),
            Ref::ConfigMap(ns(), "c-key".into()),
            Ref::ConfigMap(ns(), "c-vol".into()),
            Ref::ConfigMap(ns(), "c-proj".into()),
            Ref::Pvc(ns(), "claim".into()),
            Ref::Pvc(ns(), "p-v5".into()),
        ] {
            assert!(refs.contains(&r), "{r:?} missing from {refs:?}");
        }
        assert_eq!(refs.len(), 13);
    }

    #[test]
    fn the_graph_counts_references_per_pod() {
        let mut g = Graph::default();
        let s = Ref::Secret("ns".into(), "s".into());
        g.add("a", "n1".into(), vec![s.clone()]);
        g.add("b", "n1".into(), vec![s.clone()]);
        assert!(g.has("n1", &s));
        assert!(!g.has("n2", &s));
        g.remove("a");
        assert!(g.has("n1", &s), "b still holds it");
        g.remove("b");
        assert!(!g.has("n1", &s));
        assert!(g.by_node.is_empty());
    }

    #[test]
    fn node_identities_need_the_group_and_the_prefix() {
        let nodes = vec![NODES_GROUP.to_string()];
        assert_eq!(node_identity("system:node:n1", &nodes), Some("n1"));
        assert_eq!(node_identity("bob", &nodes), Some(""));
        assert_eq!(node_identity("system:node:n1", &[]), None);
    }
}
