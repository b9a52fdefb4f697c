//! The dependency graph of a cluster, from its objects alone: which
//! workloads declare which Services, each edge's state (the Service
//! missing, without a ready endpoint, or ready), the cycles among
//! workloads, each dependent pod's `skiff.io/DependenciesReady` verdict,
//! and the NetworkPolicies that enforce the declarations in namespaces
//! labelled `skiff.io/dependencies=enforce`. The dependencies controller
//! writes what this decides; `skiff deps` prints it.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use k8s_openapi::api::core::v1::{Namespace, Pod, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use serde_json::{json, Value};

use super::{
    cycles, declared, Dependency, Port, ENFORCE, GENERATED_BY, GENERATED_LABEL, LABEL,
    NAMESPACE_LABEL,
};
use crate::scheduling::Selector;

/// The object a group of dependent pods belongs to: the top of their
/// controller chain (a Deployment rather than its ReplicaSet, a CronJob
/// rather than its Job), or the pod itself.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Workload {
    pub namespace: String,
    pub kind: String,
    pub name: String,
    pub api_version: String,
    pub uid: String,
}

impl Workload {
    /// `namespace/kind/name`, as `skiff deps` and the annotations show it.
    pub fn key(&self) -> String {
        format!(
            "{}/{}/{}",
            self.namespace,
            self.kind.to_ascii_lowercase(),
            self.name
        )
    }

    pub fn owner_reference(&self) -> OwnerReference {
        OwnerReference {
            api_version: self.api_version.clone(),
            kind: self.kind.clone(),
            name: self.name.clone(),
            uid: self.uid.clone(),
            controller: None,
            block_owner_deletion: None,
        }
    }
}

/// The state of one declared dependency.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum State {
    /// No such Service.
    Missing,
    /// The Service has no ready endpoint (for the declared port).
    Waiting,
    Ready,
}

impl State {
    pub fn as_str(self) -> &'static str {
        match self {
            State::Missing => "missing",
            State::Waiting => "waiting",
            State::Ready => "ready",
        }
    }
}

/// A workload's edge to one dependency.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Edge {
    pub from: usize,
    pub to: Dependency,
    pub state: State,
    /// The dependency's pods belong to a workload in a cycle with this one:
    /// start-up ordering is skipped along this edge.
    pub in_cycle: bool,
    /// The workload's namespace enforces declarations.
    pub enforced: bool,
}

/// A dependent pod's verdict: its `skiff.io/DependenciesReady` condition.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Verdict {
    /// The pod's unit (index into [`Graph::units`]).
    pub unit: usize,
    pub namespace: String,
    pub name: String,
    pub ready: bool,
    pub reason: &'static str,
    pub message: String,
}

/// A group of dependent pods (one workload).
#[derive(Clone, Debug)]
pub struct Unit {
    pub workload: Workload,
    /// Everything its pods declare.
    pub declared: BTreeSet<Dependency>,
    /// The `skiff.io/deps` label values its pods wear.
    pub hashes: BTreeSet<String>,
    /// Distinct label sets of its pods (what Services select).
    labels: Vec<BTreeMap<String, String>>,
    /// Whether a pod of it mounts an API token.
    pub api_token: bool,
}

/// What a Service offers its dependents.
#[derive(Clone, Debug, Default)]
struct Offer {
    uid: String,
    selector: Option<BTreeMap<String, String>>,
    external_name: bool,
    /// (name, port, target, protocol) of each port.
    ports: Vec<(String, i32, Value, String)>,
    /// Port names with a ready endpoint ("" for the unnamed port).
    ready_ports: BTreeSet<String>,
    ready_any: bool,
    /// Ready endpoint addresses (for Services without a selector).
    addresses: BTreeSet<String>,
}

/// Everything decided about the cluster's declarations.
#[derive(Clone, Debug, Default)]
pub struct Graph {
    pub units: Vec<Unit>,
    pub edges: Vec<Edge>,
    /// Cycles among units, each a sorted list of unit indices.
    pub cycles: Vec<Vec<usize>>,
    pub verdicts: Vec<Verdict>,
    /// Each declared Service (`namespace/name`) and the units declaring it.
    pub dependents: BTreeMap<(String, String), BTreeSet<usize>>,
    offers: HashMap<(String, String), Offer>,
    enforcing: BTreeSet<String>,
    namespaces: BTreeMap<String, String>,
}

/// The cluster objects a graph is built from. `owner_of` answers the
/// controller owner of an owner (a ReplicaSet's Deployment, a Job's
/// CronJob), given its namespace and reference.
pub struct Inputs<'a> {
    pub pods: &'a [&'a Pod],
    pub services: &'a [&'a Service],
    pub slices: &'a [&'a EndpointSlice],
    pub namespaces: &'a [&'a Namespace],
    pub owner_of: &'a dyn Fn(&str, &OwnerReference) -> Option<OwnerReference>,
}

fn active(p: &Pod) -> bool {
    let phase = p
        .status
        .as_ref()
        .and_then(|s| s.phase.as_deref())
        .unwrap_or("");
    phase != "Succeeded" && phase != "Failed" && p.metadata.deletion_timestamp.is_none()
}

fn workload_of(
    pod: &Pod,
    owner_of: &dyn Fn(&str, &OwnerReference) -> Option<OwnerReference>,
) -> Workload {
    let ns = pod.metadata.namespace.clone().unwrap_or_default();
    let mut top = pod
        .metadata
        .owner_references
        .iter()
        .flatten()
        .find(|r| r.controller == Some(true))
        .cloned();
    // Follow the chain a few steps (ReplicaSet → Deployment, Job → CronJob).
    for _ in 0..4 {
        let Some(r) = &top else { break };
        match owner_of(&ns, r) {
            Some(up) => top = Some(up),
            None => break,
        }
    }
    match top {
        Some(r) => Workload {
            namespace: ns,
            kind: r.kind,
            name: r.name,
            api_version: r.api_version,
            uid: r.uid,
        },
        None => Workload {
            namespace: ns,
            kind: "Pod".into(),
            name: pod.metadata.name.clone().unwrap_or_default(),
            api_version: "v1".into(),
            uid: pod.metadata.uid.clone().unwrap_or_default(),
        },
    }
}

fn mounts_api_token(pod: &Pod) -> bool {
    pod.spec
        .iter()
        .flat_map(|s| s.volumes.iter().flatten())
        .any(|v| {
            v.projected
                .iter()
                .flat_map(|p| p.sources.iter().flatten())
                .any(|s| {
                    s.service_account_token
                        .as_ref()
                        .is_some_and(|t| t.audience.as_deref().unwrap_or("").is_empty())
                })
        })
}

fn offers(services: &[&Service], slices: &[&EndpointSlice]) -> HashMap<(String, String), Offer> {
    let mut out: HashMap<(String, String), Offer> = HashMap::new();
    for s in services {
        let key = (
            s.metadata.namespace.clone().unwrap_or_default(),
            s.metadata.name.clone().unwrap_or_default(),
        );
        let spec = s.spec.clone().unwrap_or_default();
        out.insert(
            key,
            Offer {
                uid: s.metadata.uid.clone().unwrap_or_default(),
                selector: spec.selector.clone().filter(|m| !m.is_empty()),
                external_name: spec.type_.as_deref() == Some("ExternalName"),
                ports: spec
                    .ports
                    .iter()
                    .flatten()
                    .map(|p| {
                        (
                            p.name.clone().unwrap_or_default(),
                            p.port,
                            p.target_port
                                .as_ref()
                                .and_then(|t| serde_json::to_value(t).ok())
                                .unwrap_or(json!(p.port)),
                            p.protocol.clone().unwrap_or_else(|| "TCP".into()),
                        )
                    })
                    .collect(),
                ..Offer::default()
            },
        );
    }
    for sl in slices {
        let Some(svc) = sl
            .metadata
            .labels
            .as_ref()
            .and_then(|l| l.get("kubernetes.io/service-name"))
        else {
            continue;
        };
        let key = (
            sl.metadata.namespace.clone().unwrap_or_default(),
            svc.clone(),
        );
        let Some(o) = out.get_mut(&key) else { continue };
        let ready: Vec<&String> = sl
            .endpoints
            .iter()
            .filter(|e| e.conditions.as_ref().and_then(|c| c.ready).unwrap_or(true))
            .flat_map(|e| e.addresses.iter())
            .collect();
        if ready.is_empty() {
            continue;
        }
        o.ready_any = true;
        o.addresses.extend(ready.into_iter().cloned());
        for p in sl.ports.iter().flatten() {
            o.ready_ports.insert(p.name.clone().unwrap_or_default());
        }
    }
    out
}

impl Offer {
    /// The Service ports a dependency names (all of them for none).
    fn ports_of(&self, d: &Dependency) -> Vec<&(String, i32, Value, String)> {
        self.ports
            .iter()
            .filter(|(name, port, _, _)| match &d.port {
                None => true,
                Some(Port::Number(n)) => *port == *n as i32,
                Some(Port::Name(s)) => name == s,
            })
            .collect()
    }

    fn state(&self, d: &Dependency) -> State {
        if self.external_name {
            return State::Ready;
        }
        if !self.ready_any {
            return State::Waiting;
        }
        let Some(_) = &d.port else {
            return State::Ready;
        };
        let named = self.ports_of(d);
        // A port the Service does not have is never ready.
        if named.is_empty() {
            return State::Waiting;
        }
        if named
            .iter()
            .any(|(name, _, _, _)| self.ready_ports.contains(name) || self.ready_ports.is_empty())
        {
            State::Ready
        } else {
            State::Waiting
        }
    }
}

impl Graph {
    pub fn build(inputs: &Inputs<'_>) -> Graph {
        let mut g = Graph {
            offers: offers(inputs.services, inputs.slices),
            ..Graph::default()
        };
        for ns in inputs.namespaces {
            let name = ns.metadata.name.clone().unwrap_or_default();
            if ns
                .metadata
                .labels
                .as_ref()
                .and_then(|l| l.get(NAMESPACE_LABEL))
                .map(String::as_str)
                == Some(ENFORCE)
            {
                g.enforcing.insert(name.clone());
            }
            g.namespaces
                .insert(name.clone(), ns.metadata.uid.clone().unwrap_or_default());
        }
        // Units, from the active pods that declare something.
        let mut index: HashMap<Workload, usize> = HashMap::new();
        let mut pods: Vec<(&Pod, usize, Vec<Dependency>)> = vec![];
        for p in inputs.pods.iter().copied().filter(|p| active(p)) {
            let ns = p.metadata.namespace.as_deref().unwrap_or("default");
            let Some(deps) = declared(p.metadata.annotations.as_ref(), ns) else {
                continue;
            };
            let w = workload_of(p, inputs.owner_of);
            let i = *index.entry(w.clone()).or_insert_with(|| {
                g.units.push(Unit {
                    workload: w,
                    declared: BTreeSet::new(),
                    hashes: BTreeSet::new(),
                    labels: vec![],
                    api_token: false,
                });
                g.units.len() - 1
            });
            let u = &mut g.units[i];
            u.declared.extend(deps.iter().cloned());
            if let Some(h) = p.metadata.labels.as_ref().and_then(|l| l.get(LABEL)) {
                u.hashes.insert(h.clone());
            }
            let labels = p.metadata.labels.clone().unwrap_or_default();
            if !u.labels.contains(&labels) {
                u.labels.push(labels);
            }
            u.api_token |= mounts_api_token(p);
            pods.push((p, i, deps));
        }
        // Unit → unit edges: a declared Service selects pods of a unit.
        let mut by_ns: HashMap<&str, Vec<usize>> = HashMap::new();
        let mut by_label: HashMap<(&str, &str, &str), Vec<usize>> = HashMap::new();
        for (i, u) in g.units.iter().enumerate() {
            let ns = u.workload.namespace.as_str();
            by_ns.entry(ns).or_default().push(i);
            let mut pairs: BTreeSet<(&str, &str)> = BTreeSet::new();
            for l in &u.labels {
                pairs.extend(l.iter().map(|(k, v)| (k.as_str(), v.as_str())));
            }
            for (k, v) in pairs {
                by_label.entry((ns, k, v)).or_default().push(i);
            }
        }
        let mut selects: HashMap<(String, String), Vec<usize>> = HashMap::new();
        let mut edges = vec![];
        for (i, u) in g.units.iter().enumerate() {
            for d in &u.declared {
                let key = (d.namespace.clone(), d.service.clone());
                g.dependents.entry(key.clone()).or_default().insert(i);
                let targets = selects.entry(key.clone()).or_insert_with(|| {
                    let Some(sel) = g.offers.get(&key).and_then(|o| o.selector.as_ref()) else {
                        return vec![];
                    };
                    // A Service's selector is label equalities: start
                    // from the units wearing its first pair (an index),
                    // then check them whole.
                    let candidates: Vec<usize> = match sel.iter().next() {
                        Some((k, v)) => by_label
                            .get(&(d.namespace.as_str(), k.as_str(), v.as_str()))
                            .cloned()
                            .unwrap_or_default(),
                        None => by_ns.get(d.namespace.as_str()).cloned().unwrap_or_default(),
                    };
                    let sel = Selector::from_map(sel);
                    candidates
                        .into_iter()
                        .filter(|&j| g.units[j].labels.iter().any(|l| sel.matches(Some(l))))
                        .collect()
                });
                edges.extend(targets.iter().map(|&j| (i, j)));
            }
        }
        g.cycles = cycles(g.units.len(), &edges);
        let mut component = vec![usize::MAX; g.units.len()];
        for (c, members) in g.cycles.iter().enumerate() {
            for &m in members {
                component[m] = c;
            }
        }
        let in_cycle = |i: usize, d: &Dependency| {
            component[i] != usize::MAX
                && selects
                    .get(&(d.namespace.clone(), d.service.clone()))
                    .is_some_and(|ts| ts.iter().any(|&j| component[j] == component[i]))
        };
        let state = |d: &Dependency| match g.offers.get(&(d.namespace.clone(), d.service.clone())) {
            None => State::Missing,
            Some(o) => o.state(d),
        };
        for (i, u) in g.units.iter().enumerate() {
            for d in &u.declared {
                g.edges.push(Edge {
                    from: i,
                    to: d.clone(),
                    state: state(d),
                    in_cycle: in_cycle(i, d),
                    enforced: g.enforcing.contains(&u.workload.namespace),
                });
            }
        }
        for (p, i, deps) in pods {
            let mut waiting = vec![];
            let mut skipped = vec![];
            for d in &deps {
                if in_cycle(i, d) {
                    skipped.push(d.to_string());
                    continue;
                }
                match state(d) {
                    State::Ready => {}
                    State::Missing => waiting.push(format!("{d} (no such Service)")),
                    State::Waiting => waiting.push(format!("{d} (no ready endpoint)")),
                }
            }
            let (ready, reason, mut message) = if waiting.is_empty() {
                (
                    true,
                    "DependenciesReady",
                    "every declared dependency has a ready endpoint".to_string(),
                )
            } else {
                (
                    false,
                    super::WAITING_REASON,
                    format!("waiting for {}", waiting.join(", ")),
                )
            };
            if !skipped.is_empty() {
                message.push_str(&format!(
                    "; start-up ordering skipped inside a dependency cycle for {}",
                    skipped.join(", ")
                ));
            }
            g.verdicts.push(Verdict {
                unit: i,
                namespace: p.metadata.namespace.clone().unwrap_or_default(),
                name: p.metadata.name.clone().unwrap_or_default(),
                ready,
                reason,
                message,
            });
        }
        g
    }

    /// A cycle as a sentence: `a → b → a` by workload keys.
    pub fn describe_cycle(&self, cycle: &[usize]) -> String {
        let mut names: Vec<String> = cycle
            .iter()
            .map(|&i| self.units[i].workload.key())
            .collect();
        if let Some(first) = names.first().cloned() {
            names.push(first);
        }
        names.join(" → ")
    }

    /// Whether namespace `ns` enforces declarations.
    pub fn enforcing(&self, ns: &str) -> bool {
        self.enforcing.contains(ns)
    }

    /// The NetworkPolicies enforcing the declarations: in every enforcing
    /// namespace a baseline (its pods may reach cluster DNS and the API
    /// server's `endpoints`, nothing else), per declaration (`skiff.io/deps`
    /// value) one allowing its dependencies' pods on their target ports,
    /// and per declared Service of an enforcing namespace one letting only
    /// its declarers in. Each is owned by what it goes with.
    pub fn network_policies(&self, api_endpoints: &[(String, i32)]) -> Vec<NetworkPolicy> {
        let mut out = vec![];
        let meta = |ns: &str, name: String, owners: Vec<OwnerReference>| ObjectMeta {
            name: Some(name),
            namespace: Some(ns.to_string()),
            labels: Some(BTreeMap::from([(
                GENERATED_LABEL.to_string(),
                GENERATED_BY.to_string(),
            )])),
            owner_references: Some(owners),
            ..ObjectMeta::default()
        };
        let policy = |m: ObjectMeta, spec: Value| -> Option<NetworkPolicy> {
            serde_json::from_value(json!({"metadata": m, "spec": spec})).ok()
        };
        for ns in &self.enforcing {
            let uid = self.namespaces.get(ns).cloned().unwrap_or_default();
            let owner = OwnerReference {
                api_version: "v1".into(),
                kind: "Namespace".into(),
                name: ns.clone(),
                uid,
                ..OwnerReference::default()
            };
            let mut egress = vec![json!({
                "to": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "kube-system"}},
                        "podSelector": {"matchLabels": {"k8s-app": "kube-dns"}}}],
                "ports": [{"protocol": "UDP", "port": 53}, {"protocol": "TCP", "port": 53}],
            })];
            for (ip, port) in api_endpoints {
                egress.push(json!({"to": [{"ipBlock": {"cidr": format!("{ip}/32")}}],
                                   "ports": [{"protocol": "TCP", "port": port}]}));
            }
            out.extend(policy(
                meta(ns, "skiff-dependencies-baseline".into(), vec![owner]),
                json!({"podSelector": {}, "policyTypes": ["Egress"], "egress": egress}),
            ));
        }
        // Per declaration: what its pods may reach.
        let mut by_hash: BTreeMap<(String, String), (BTreeSet<Dependency>, BTreeSet<Workload>)> =
            BTreeMap::new();
        for u in &self.units {
            if !self.enforcing.contains(&u.workload.namespace) {
                continue;
            }
            for h in &u.hashes {
                let e = by_hash
                    .entry((u.workload.namespace.clone(), h.clone()))
                    .or_default();
                e.0.extend(u.declared.iter().cloned());
                e.1.insert(u.workload.clone());
            }
        }
        for ((ns, hash), (deps, owners)) in &by_hash {
            let mut egress = vec![];
            for d in deps {
                let Some(o) = self.offers.get(&(d.namespace.clone(), d.service.clone())) else {
                    continue;
                };
                let ports: Vec<Value> = o
                    .ports_of(d)
                    .iter()
                    .map(|(_, _, target, proto)| json!({"protocol": proto, "port": target}))
                    .collect();
                let to = match &o.selector {
                    Some(sel) => vec![json!({
                        "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": d.namespace}},
                        "podSelector": {"matchLabels": sel},
                    })],
                    None => o
                        .addresses
                        .iter()
                        .map(|a| json!({"ipBlock": {"cidr": format!("{a}/32")}}))
                        .collect(),
                };
                if to.is_empty() || ports.is_empty() && !o.ports.is_empty() {
                    continue;
                }
                let mut rule = json!({ "to": to });
                if !ports.is_empty() {
                    rule["ports"] = json!(ports);
                }
                egress.push(rule);
            }
            out.extend(policy(
                meta(
                    ns,
                    format!("skiff-deps-{hash}"),
                    owners.iter().map(Workload::owner_reference).collect(),
                ),
                json!({"podSelector": {"matchLabels": {LABEL: hash}},
                       "policyTypes": ["Egress"], "egress": egress}),
            ));
        }
        // Per declared Service of an enforcing namespace: who may come in.
        for ((ns, svc), units) in &self.dependents {
            if !self.enforcing.contains(ns) {
                continue;
            }
            let Some(o) = self.offers.get(&(ns.clone(), svc.clone())) else {
                continue;
            };
            let Some(sel) = &o.selector else { continue };
            let mut from = BTreeSet::new();
            let mut ports = BTreeSet::new();
            let mut all_ports = false;
            for &i in units {
                let u = &self.units[i];
                for h in &u.hashes {
                    from.insert((u.workload.namespace.clone(), h.clone()));
                }
                for d in u
                    .declared
                    .iter()
                    .filter(|d| &d.namespace == ns && &d.service == svc)
                {
                    if d.port.is_none() {
                        all_ports = true;
                    }
                    for (_, _, target, proto) in o.ports_of(d) {
                        ports.insert((proto.clone(), target.to_string()));
                    }
                }
            }
            let peers: Vec<Value> = from
                .iter()
                .map(|(pns, h)| {
                    json!({
                        "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": pns}},
                        "podSelector": {"matchLabels": {LABEL: h}},
                    })
                })
                .collect();
            let mut rule = json!({ "from": peers });
            if !all_ports && !ports.is_empty() {
                rule["ports"] = json!(ports
                    .iter()
                    .map(|(proto, port)| json!({"protocol": proto,
                        "port": serde_json::from_str::<Value>(port).unwrap_or(Value::Null)}))
                    .collect::<Vec<_>>());
            }
            let uid = self.service_uid(ns, svc);
            let owner = OwnerReference {
                api_version: "v1".into(),
                kind: "Service".into(),
                name: svc.clone(),
                uid,
                ..OwnerReference::default()
            };
            out.extend(policy(
                meta(ns, format!("skiff-deps-to-{svc}"), vec![owner]),
                json!({"podSelector": {"matchLabels": sel}, "policyTypes": ["Ingress"], "ingress": [rule]}),
            ));
        }
        out
    }

    fn service_uid(&self, ns: &str, svc: &str) -> String {
        self.offers
            .get(&(ns.to_string(), svc.to_string()))
            .map(|o| o.uid.clone())
            .unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(
        ns: &str,
        name: &str,
        labels: Value,
        deps: Option<&str>,
        owner: Option<(&str, &str)>,
    ) -> Pod {
        let mut p = json!({"metadata": {"name": name, "namespace": ns, "uid": format!("uid-{name}"), "labels": labels},
                           "spec": {"containers": [{"name": "c", "image": "i"}]},
                           "status": {"phase": "Pending"}});
        if let Some(d) = deps {
            p["metadata"]["annotations"] = json!({ super::super::ANNOTATION: d });
            let list = super::super::parse(d, ns).unwrap();
            p["metadata"]["labels"][LABEL] = json!(super::super::label_value(&list));
        }
        if let Some((kind, n)) = owner {
            p["metadata"]["ownerReferences"] = json!([{"apiVersion": "apps/v1", "kind": kind, "name": n, "uid": format!("uid-{n}"), "controller": true}]);
        }
        serde_json::from_value(p).unwrap()
    }

    fn service(ns: &str, name: &str, selector: Value, ports: Value) -> Service {
        serde_json::from_value(
            json!({"metadata": {"name": name, "namespace": ns, "uid": format!("svc-{name}")},
                                      "spec": {"selector": selector, "ports": ports}}),
        )
        .unwrap()
    }

    fn slice(ns: &str, svc: &str, ready: bool, port: &str) -> EndpointSlice {
        serde_json::from_value(json!({"metadata": {"name": format!("{svc}-x"), "namespace": ns,
                                                   "labels": {"kubernetes.io/service-name": svc}},
                                      "addressType": "IPv4",
                                      "endpoints": [{"addresses": ["10.42.0.9"], "conditions": {"ready": ready}}],
                                      "ports": [{"name": port, "port": 8080}]})).unwrap()
    }

    fn ns(name: &str, enforce: bool) -> Namespace {
        let mut n = json!({"metadata": {"name": name, "uid": format!("ns-{name}")}});
        if enforce {
            n["metadata"]["labels"] = json!({NAMESPACE_LABEL: ENFORCE});
        }
        serde_json::from_value(n).unwrap()
    }

    fn no_owner(_: &str, r: &OwnerReference) -> Option<OwnerReference> {
        // ReplicaSet "web-1" belongs to Deployment "web".
        (r.kind == "ReplicaSet").then(|| OwnerReference {
            api_version: "apps/v1".into(),
            kind: "Deployment".into(),
            name: r.name.trim_end_matches("-1").into(),
            uid: format!("uid-{}", r.name.trim_end_matches("-1")),
            controller: Some(true),
            block_owner_deletion: None,
        })
    }

    fn build(
        pods: &[Pod],
        services: &[Service],
        slices: &[EndpointSlice],
        nss: &[Namespace],
    ) -> Graph {
        let pods: Vec<&Pod> = pods.iter().collect();
        let services: Vec<&Service> = services.iter().collect();
        let slices: Vec<&EndpointSlice> = slices.iter().collect();
        let nss: Vec<&Namespace> = nss.iter().collect();
        Graph::build(&Inputs {
            pods: &pods,
            services: &services,
            slices: &slices,
            namespaces: &nss,
            owner_of: &no_owner,
        })
    }

    #[test]
    fn a_three_tier_app_waits_tier_by_tier() {
        let pods = [
            pod(
                "shop",
                "web-1-a",
                json!({"app": "web"}),
                Some("api:http"),
                Some(("ReplicaSet", "web-1")),
            ),
            pod(
                "shop",
                "api-1-a",
                json!({"app": "api"}),
                Some("db"),
                Some(("ReplicaSet", "api-1")),
            ),
            pod(
                "shop",
                "db-0",
                json!({"app": "db"}),
                None,
                Some(("StatefulSet", "db")),
            ),
        ];
        let services = [
            service(
                "shop",
                "api",
                json!({"app": "api"}),
                json!([{"name": "http", "port": 80, "targetPort": 8080}]),
            ),
            service(
                "shop",
                "db",
                json!({"app": "db"}),
                json!([{"name": "pg", "port": 5432}]),
            ),
        ];
        let g = build(
            &pods,
            &services,
            &[slice("shop", "db", true, "pg")],
            &[ns("shop", false)],
        );
        let v = |name: &str| g.verdicts.iter().find(|v| v.name == name).unwrap().clone();
        assert!(!v("web-1-a").ready);
        assert_eq!(
            v("web-1-a").message,
            "waiting for shop/api:http (no ready endpoint)"
        );
        assert!(v("api-1-a").ready, "{:?}", v("api-1-a"));
        assert!(g.cycles.is_empty());
        let keys: Vec<String> = g.units.iter().map(|u| u.workload.key()).collect();
        assert_eq!(keys, ["shop/deployment/web", "shop/deployment/api"]);
        // The missing Service is named as such; nothing enforces here.
        let g = build(&pods[..1], &[], &[], &[ns("shop", false)]);
        assert_eq!(
            g.verdicts[0].message,
            "waiting for shop/api:http (no such Service)"
        );
        assert!(g.network_policies(&[]).is_empty());
    }

    #[test]
    fn a_cycle_is_found_and_does_not_hold_its_members() {
        let pods = [
            pod("x", "a", json!({"app": "a"}), Some("b"), None),
            pod("x", "b", json!({"app": "b"}), Some("a, c"), None),
            pod("x", "c", json!({"app": "c"}), None, None),
        ];
        let services = [
            service("x", "a", json!({"app": "a"}), json!([{"port": 80}])),
            service("x", "b", json!({"app": "b"}), json!([{"port": 80}])),
            service("x", "c", json!({"app": "c"}), json!([{"port": 80}])),
        ];
        let g = build(&pods, &services, &[], &[ns("x", false)]);
        assert_eq!(g.cycles, vec![vec![0, 1]]);
        assert_eq!(
            g.describe_cycle(&g.cycles[0]),
            "x/pod/a → x/pod/b → x/pod/a"
        );
        let a = &g.verdicts[0];
        assert!(a.ready && a.message.contains("cycle for x/b"), "{a:?}");
        // b still waits for c, which is outside the cycle.
        let b = &g.verdicts[1];
        assert!(
            !b.ready && b.message.starts_with("waiting for x/c"),
            "{b:?}"
        );
    }

    #[test]
    fn an_enforcing_namespace_gets_a_baseline_egress_and_ingress_policies() {
        let pods = [
            pod("shop", "web", json!({"app": "web"}), Some("api:http"), None),
            pod("shop", "api", json!({"app": "api"}), None, None),
        ];
        let services = [service(
            "shop",
            "api",
            json!({"app": "api"}),
            json!([{"name": "http", "port": 80, "targetPort": 8080}, {"name": "admin", "port": 9000}]),
        )];
        let g = build(
            &pods,
            &services,
            &[slice("shop", "api", true, "http")],
            &[ns("shop", true)],
        );
        let pols = g.network_policies(&[("192.0.2.1".into(), 6443)]);
        let names: Vec<&str> = pols
            .iter()
            .map(|p| p.metadata.name.as_deref().unwrap())
            .collect();
        let hash = super::super::label_value(&super::super::parse("api:http", "shop").unwrap());
        assert_eq!(
            names,
            [
                "skiff-dependencies-baseline",
                &format!("skiff-deps-{hash}"),
                "skiff-deps-to-api"
            ]
        );
        let v = |i: usize| serde_json::to_value(&pols[i]).unwrap();
        assert_eq!(
            v(0)["spec"]["egress"][1]["to"][0]["ipBlock"]["cidr"],
            "192.0.2.1/32"
        );
        assert_eq!(v(0)["metadata"]["ownerReferences"][0]["kind"], "Namespace");
        // Egress to the api pods on the target port of the declared port only.
        assert_eq!(
            v(1)["spec"]["egress"][0]["ports"],
            json!([{"protocol": "TCP", "port": 8080}])
        );
        assert_eq!(
            v(1)["spec"]["egress"][0]["to"][0]["podSelector"]["matchLabels"],
            json!({"app": "api"})
        );
        assert_eq!(v(1)["metadata"]["ownerReferences"][0]["name"], "web");
        // Ingress to the api pods from the declaring pods only.
        assert_eq!(
            v(2)["spec"]["ingress"][0]["from"][0]["podSelector"]["matchLabels"][LABEL],
            json!(hash)
        );
        assert_eq!(v(2)["metadata"]["ownerReferences"][0]["uid"], "svc-api");
        assert!(g.edges[0].enforced);
    }
}
