//! Lifecycle controllers that are simple sweeps over cached objects: the
//! garbage collector (dependents of vanished owners; foregroundDeletion and
//! orphan finalizers), a `default` ServiceAccount and the `kube-root-ca.crt`
//! ConfigMap in every namespace, node pod-CIDR allocation, and Endpoints and
//! EndpointSlices from services and ready pods.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;

use k8s_openapi::api::apps::v1::{Deployment, ReplicaSet};
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{
    ConfigMap, Endpoints, Namespace, Node, Pod, Service, ServiceAccount,
};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams, Preconditions};
use kube::runtime::reflector::Store;
use kube::ResourceExt;
use serde_json::{json, Value};

use crate::common;

/// The caches the sweeps read.
pub struct Caches {
    pub pods: Store<Pod>,
    pub replicasets: Store<ReplicaSet>,
    pub deployments: Store<Deployment>,
    pub jobs: Store<Job>,
    pub namespaces: Store<Namespace>,
    pub services: Store<Service>,
    pub nodes: Store<Node>,
}

fn owner_exists(c: &Caches, ns: &str, r: &OwnerReference) -> Option<bool> {
    let find = |name: &str, uid: &str, metas: Vec<ObjectMeta>| {
        metas.iter().any(|m| {
            m.name.as_deref() == Some(name)
                && m.uid.as_deref() == Some(uid)
                && m.namespace.as_deref().map(|n| n == ns).unwrap_or(true)
        })
    };
    let metas: Vec<ObjectMeta> = match (r.api_version.as_str(), r.kind.as_str()) {
        ("apps/v1", "ReplicaSet") => c
            .replicasets
            .state()
            .iter()
            .map(|o| o.metadata.clone())
            .collect(),
        ("apps/v1", "Deployment") => c
            .deployments
            .state()
            .iter()
            .map(|o| o.metadata.clone())
            .collect(),
        ("batch/v1", "Job") => c.jobs.state().iter().map(|o| o.metadata.clone()).collect(),
        ("v1", "Node") => c.nodes.state().iter().map(|o| o.metadata.clone()).collect(),
        _ => return None,
    };
    Some(find(&r.name, &r.uid, metas))
}

/// One pass of the garbage collector over the dependents it caches (pods,
/// ReplicaSets, Jobs) and owners with deletion finalizers (Deployments,
/// ReplicaSets, Jobs).
pub async fn gc_pass(client: &kube::Client, c: &Caches) {
    // Dependents whose every owner is gone (owners of kinds the collector
    // does not cache are left alone).
    let mut doomed: Vec<(String, String, String, String)> = vec![];
    let mut consider = |kind: &str, meta: &ObjectMeta| {
        let refs = meta.owner_references.clone().unwrap_or_default();
        if refs.is_empty() || meta.deletion_timestamp.is_some() {
            return;
        }
        let ns = meta.namespace.clone().unwrap_or_default();
        let verdicts: Vec<Option<bool>> = refs.iter().map(|r| owner_exists(c, &ns, r)).collect();
        if verdicts.iter().all(|v| *v == Some(false)) {
            doomed.push((
                kind.to_string(),
                ns,
                meta.name.clone().unwrap_or_default(),
                meta.uid.clone().unwrap_or_default(),
            ));
        }
    };
    for p in c.pods.state() {
        consider("pods", &p.metadata);
    }
    for rs in c.replicasets.state() {
        consider("replicasets", &rs.metadata);
    }
    for j in c.jobs.state() {
        consider("jobs", &j.metadata);
    }
    for (kind, ns, name, uid) in doomed {
        let dp = DeleteParams {
            preconditions: Some(Preconditions {
                uid: Some(uid),
                resource_version: None,
            }),
            propagation_policy: Some(kube::api::PropagationPolicy::Background),
            ..Default::default()
        };
        let r = match kind.as_str() {
            "pods" => Api::<Pod>::namespaced(client.clone(), &ns)
                .delete(&name, &dp)
                .await
                .map(|_| ()),
            "replicasets" => Api::<ReplicaSet>::namespaced(client.clone(), &ns)
                .delete(&name, &dp)
                .await
                .map(|_| ()),
            _ => Api::<Job>::namespaced(client.clone(), &ns)
                .delete(&name, &dp)
                .await
                .map(|_| ()),
        };
        if let Err(e) = r {
            tracing::debug!(kind, ns, name, error = %e, "garbage collecting failed");
        }
    }

    // Owners being deleted in the foreground or orphaning their dependents.
    let owners: Vec<(String, ObjectMeta)> = c
        .deployments
        .state()
        .iter()
        .map(|o| ("deployments".to_string(), o.metadata.clone()))
        .chain(
            c.replicasets
                .state()
                .iter()
                .map(|o| ("replicasets".to_string(), o.metadata.clone())),
        )
        .chain(
            c.jobs
                .state()
                .iter()
                .map(|o| ("jobs".to_string(), o.metadata.clone())),
        )
        .filter(|(_, m)| m.deletion_timestamp.is_some())
        .collect();
    for (kind, m) in owners {
        let finalizers = m.finalizers.clone().unwrap_or_default();
        let uid = m.uid.clone().unwrap_or_default();
        let ns = m.namespace.clone().unwrap_or_default();
        let dependents: Vec<(String, ObjectMeta)> = c
            .pods
            .state()
            .iter()
            .map(|o| ("pods".to_string(), o.metadata.clone()))
            .chain(
                c.replicasets
                    .state()
                    .iter()
                    .map(|o| ("replicasets".to_string(), o.metadata.clone())),
            )
            .chain(
                c.jobs
                    .state()
                    .iter()
                    .map(|o| ("jobs".to_string(), o.metadata.clone())),
            )
            .filter(|(_, d)| {
                d.namespace.as_deref() == Some(ns.as_str())
                    && d.owner_references.iter().flatten().any(|r| r.uid == uid)
            })
            .collect();
        let done = if finalizers.iter().any(|f| f == "orphan") {
            for (dk, d) in &dependents {
                let refs: Vec<OwnerReference> = d
                    .owner_references
                    .iter()
                    .flatten()
                    .filter(|r| r.uid != uid)
                    .cloned()
                    .collect();
                // An empty list is removed, as Kubernetes omits it.
                let refs = if refs.is_empty() {
                    Value::Null
                } else {
                    json!(refs)
                };
                let patch = json!({"metadata": {"ownerReferences": refs}});
                let _ = patch_any(client, dk, &ns, d.name.as_deref().unwrap_or(""), &patch).await;
            }
            Some("orphan")
        } else if finalizers.iter().any(|f| f == "foregroundDeletion") {
            if dependents.is_empty() {
                Some("foregroundDeletion")
            } else {
                for (dk, d) in &dependents {
                    if d.deletion_timestamp.is_none() {
                        let dp = DeleteParams {
                            propagation_policy: Some(kube::api::PropagationPolicy::Foreground),
                            ..Default::default()
                        };
                        let name = d.name.clone().unwrap_or_default();
                        let _ = match dk.as_str() {
                            "pods" => Api::<Pod>::namespaced(client.clone(), &ns)
                                .delete(&name, &dp)
                                .await
                                .map(|_| ()),
                            "replicasets" => Api::<ReplicaSet>::namespaced(client.clone(), &ns)
                                .delete(&name, &dp)
                                .await
                                .map(|_| ()),
                            _ => Api::<Job>::namespaced(client.clone(), &ns)
                                .delete(&name, &dp)
                                .await
                                .map(|_| ()),
                        };
                    }
                }
                None
            }
        } else {
            None
        };
        if let Some(f) = done {
            let rest: Vec<String> = finalizers.into_iter().filter(|x| x != f).collect();
            let rest = if rest.is_empty() {
                Value::Null
            } else {
                json!(rest)
            };
            let patch = json!({"metadata": {"finalizers": rest}});
            let _ = patch_any(client, &kind, &ns, m.name.as_deref().unwrap_or(""), &patch).await;
        }
    }
}

async fn patch_any(
    client: &kube::Client,
    kind: &str,
    ns: &str,
    name: &str,
    patch: &Value,
) -> Result<(), kube::Error> {
    let pp = PatchParams::default();
    let p = Patch::Merge(patch);
    match kind {
        "pods" => Api::<Pod>::namespaced(client.clone(), ns)
            .patch(name, &pp, &p)
            .await
            .map(|_| ()),
        "replicasets" => Api::<ReplicaSet>::namespaced(client.clone(), ns)
            .patch(name, &pp, &p)
            .await
            .map(|_| ()),
        "deployments" => Api::<Deployment>::namespaced(client.clone(), ns)
            .patch(name, &pp, &p)
            .await
            .map(|_| ()),
        _ => Api::<Job>::namespaced(client.clone(), ns)
            .patch(name, &pp, &p)
            .await
            .map(|_| ()),
    }
}

/// Every active namespace gets a `default` ServiceAccount and, when the
/// cluster CA is known, the `kube-root-ca.crt` ConfigMap.
pub async fn namespace_defaults_pass(
    client: &kube::Client,
    c: &Caches,
    root_ca: Option<&str>,
    done: &mut HashSet<String>,
) {
    for ns in c.namespaces.state() {
        let name = ns.name_any();
        if ns.metadata.deletion_timestamp.is_some() || done.contains(&name) {
            continue;
        }
        let sa: Api<ServiceAccount> = Api::namespaced(client.clone(), &name);
        let mut ok = true;
        match sa.get_opt("default").await {
            Ok(Some(_)) => {}
            Ok(None) => {
                let obj: ServiceAccount = serde_json::from_value(
                    json!({"metadata": {"name": "default", "namespace": name}}),
                )
                .unwrap_or_default();
                if let Err(e) = sa.create(&PostParams::default(), &obj).await {
                    if !matches!(&e, kube::Error::Api(a) if a.code == 409) {
                        ok = false;
                    }
                }
            }
            Err(_) => ok = false,
        }
        if let Some(ca) = root_ca {
            let cms: Api<ConfigMap> = Api::namespaced(client.clone(), &name);
            match cms.get_opt("kube-root-ca.crt").await {
                Ok(Some(cm))
                    if cm
                        .data
                        .as_ref()
                        .and_then(|d| d.get("ca.crt"))
                        .map(String::as_str)
                        == Some(ca) => {}
                Ok(Some(_)) => {
                    let patch = json!({"data": {"ca.crt": ca}});
                    ok &= cms
                        .patch(
                            "kube-root-ca.crt",
                            &PatchParams::default(),
                            &Patch::Merge(&patch),
                        )
                        .await
                        .is_ok();
                }
                Ok(None) => {
                    let obj: ConfigMap = serde_json::from_value(json!({
                        "metadata": {"name": "kube-root-ca.crt", "namespace": name,
                            "annotations": {"kubernetes.io/description": "Contains a CA bundle that can be used to verify the kube-apiserver when using internal endpoints such as the internal service IP or kubernetes.default.svc. No other usage is guaranteed across distributions of Kubernetes clusters."}},
                        "data": {"ca.crt": ca}
                    }))
                    .unwrap_or_default();
                    if let Err(e) = cms.create(&PostParams::default(), &obj).await {
                        if !matches!(&e, kube::Error::Api(a) if a.code == 409) {
                            ok = false;
                        }
                    }
                }
                Err(_) => ok = false,
            }
        }
        if ok {
            done.insert(name);
        }
    }
    // Namespaces deleted and recreated must be looked at again.
    let live: HashSet<String> = c
        .namespaces
        .state()
        .iter()
        .filter(|n| n.metadata.deletion_timestamp.is_none())
        .map(|n| n.name_any())
        .collect();
    done.retain(|n| live.contains(n));
}

/// Gives each node without one a /24 of the cluster CIDR (a /16).
pub async fn node_ipam_pass(client: &kube::Client, c: &Caches, cluster_cidr: &str) {
    let base: Vec<u8> = cluster_cidr
        .split('/')
        .next()
        .unwrap_or("10.42.0.0")
        .split('.')
        .filter_map(|p| p.parse().ok())
        .collect();
    if base.len() != 4 {
        return;
    }
    let nodes = c.nodes.state();
    let mut used: HashSet<String> = nodes
        .iter()
        .filter_map(|n| n.spec.as_ref()?.pod_cidr.clone())
        .collect();
    let api: Api<Node> = Api::all(client.clone());
    for n in nodes
        .iter()
        .filter(|n| n.spec.as_ref().and_then(|s| s.pod_cidr.as_ref()).is_none())
    {
        let Some(free) = (0..=255u16)
            .map(|i| format!("{}.{}.{i}.0/24", base[0], base[1]))
            .find(|c| !used.contains(c))
        else {
            tracing::warn!(node = n.name_any(), "no pod CIDR left in {cluster_cidr}");
            return;
        };
        let patch = json!({"spec": {"podCIDR": free, "podCIDRs": [free]}});
        if api
            .patch(
                &n.name_any(),
                &PatchParams::default(),
                &Patch::Merge(&patch),
            )
            .await
            .is_ok()
        {
            used.insert(free);
        }
    }
}

fn resolve_port(p: &Pod, target: &IntOrString) -> Option<i32> {
    match target {
        IntOrString::Int(i) => Some(*i),
        IntOrString::String(name) => p
            .spec
            .as_ref()?
            .containers
            .iter()
            .flat_map(|c| c.ports.iter().flatten())
            .find(|cp| cp.name.as_deref() == Some(name.as_str()))
            .map(|cp| cp.container_port),
    }
}

/// Endpoints and EndpointSlices of every service with a selector.
pub async fn endpoints_pass(client: &kube::Client, c: &Caches, last: &mut HashMap<String, Value>) {
    let pods = c.pods.state();
    let mut seen = HashSet::new();
    for svc in c.services.state() {
        let ns = svc.namespace().unwrap_or_default();
        let name = svc.name_any();
        let spec = svc.spec.clone().unwrap_or_default();
        let Some(selector) = spec.selector.clone().filter(|s| !s.is_empty()) else {
            continue;
        };
        let key = format!("{ns}/{name}");
        seen.insert(key.clone());
        let publish = spec.publish_not_ready_addresses.unwrap_or(false);
        let mut ready_addrs = vec![];
        let mut not_ready = vec![];
        let mut slice_eps = vec![];
        let mut ports_per_pod: Vec<Vec<(String, i32, String)>> = vec![];
        let selected: Vec<&Arc<Pod>> = pods
            .iter()
            .filter(|p| p.metadata.namespace.as_deref() == Some(ns.as_str()))
            .filter(|p| selector.iter().all(|(k, v)| p.labels().get(k) == Some(v)))
            .filter(|p| common::pod_is_active(p) || common::is_terminating(&p.metadata))
            .filter(|p| p.status.as_ref().and_then(|s| s.pod_ip.as_ref()).is_some())
            .collect();
        for p in &selected {
            let ip = p
                .status
                .as_ref()
                .and_then(|s| s.pod_ip.clone())
                .unwrap_or_default();
            let ready = common::pod_ready(p) && !common::is_terminating(&p.metadata);
            let addr = json!({
                "ip": ip,
                "nodeName": p.spec.as_ref().and_then(|s| s.node_name.clone()),
                "targetRef": {"kind": "Pod", "namespace": ns, "name": p.name_any(), "uid": p.metadata.uid},
            });
            if ready || publish {
                ready_addrs.push(addr);
            } else {
                not_ready.push(addr);
            }
            slice_eps.push(json!({
                "addresses": [ip],
                "conditions": {"ready": ready || publish, "serving": common::pod_ready(p), "terminating": common::is_terminating(&p.metadata)},
                "nodeName": p.spec.as_ref().and_then(|s| s.node_name.clone()),
                "targetRef": {"kind": "Pod", "namespace": ns, "name": p.name_any(), "uid": p.metadata.uid},
            }));
            let mut ports = vec![];
            for sp in spec.ports.iter().flatten() {
                let target = sp.target_port.clone().unwrap_or(IntOrString::Int(sp.port));
                if let Some(port) = resolve_port(p, &target) {
                    ports.push((
                        sp.name.clone().unwrap_or_default(),
                        port,
                        sp.protocol.clone().unwrap_or_else(|| "TCP".into()),
                    ));
                }
            }
            ports_per_pod.push(ports);
        }
        let ports: Vec<Value> = ports_per_pod
            .first()
            .cloned()
            .unwrap_or_default()
            .into_iter()
            .map(|(n, p, proto)| {
                let mut v = json!({"port": p, "protocol": proto});
                if !n.is_empty() {
                    v["name"] = json!(n);
                }
                v
            })
            .collect();
        let mut subset = json!({});
        if !ready_addrs.is_empty() {
            subset["addresses"] = json!(ready_addrs);
        }
        if !not_ready.is_empty() {
            subset["notReadyAddresses"] = json!(not_ready);
        }
        subset["ports"] = json!(ports);
        let subsets = if ready_addrs.is_empty() && not_ready.is_empty() {
            json!([])
        } else {
            json!([subset])
        };
        let owner = json!([{"apiVersion": "v1", "kind": "Service", "name": name, "uid": svc.metadata.uid, "controller": true, "blockOwnerDeletion": true}]);
        let ep = json!({
            "apiVersion": "v1", "kind": "Endpoints",
            "metadata": {"name": name, "namespace": ns, "labels": svc.labels()},
            "subsets": subsets,
        });
        let slice = json!({
            "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
            "metadata": {"name": format!("{name}-skiff"), "namespace": ns,
                "labels": {"kubernetes.io/service-name": name, "endpointslice.kubernetes.io/managed-by": "endpointslice-controller.k8s.io"},
                "ownerReferences": owner},
            "addressType": "IPv4",
            "endpoints": slice_eps,
            "ports": ports,
        });
        let fingerprint = json!([ep, slice]);
        if last.get(&key) == Some(&fingerprint) {
            continue;
        }
        let eps: Api<Endpoints> = Api::namespaced(client.clone(), &ns);
        let slices: Api<EndpointSlice> = Api::namespaced(client.clone(), &ns);
        let mut ok = true;
        ok &= upsert(&eps, &name, &ep).await;
        ok &= upsert(&slices, &format!("{name}-skiff"), &slice).await;
        if ok {
            last.insert(key, fingerprint);
        }
    }
    last.retain(|k, _| seen.contains(k));
}

async fn upsert<K>(api: &Api<K>, name: &str, body: &Value) -> bool
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + serde::Serialize + std::fmt::Debug,
{
    let Ok(obj) = serde_json::from_value::<K>(body.clone()) else {
        return false;
    };
    match api.get_opt(name).await {
        Ok(Some(_)) => {
            let mut merged = body.clone();
            merged.as_object_mut().map(|o| o.remove("apiVersion"));
            api.patch(name, &PatchParams::default(), &Patch::Merge(&merged))
                .await
                .is_ok()
        }
        Ok(None) => match api.create(&PostParams::default(), &obj).await {
            Ok(_) => true,
            Err(kube::Error::Api(e)) if e.code == 409 => false,
            Err(_) => false,
        },
        Err(_) => false,
    }
}

/// Labels as a map, for callers that need owned values.
pub fn labels_of(meta: &ObjectMeta) -> BTreeMap<String, String> {
    meta.labels.clone().unwrap_or_default()
}

const UNREACHABLE: &str = "node.kubernetes.io/unreachable";
const NOT_READY: &str = "node.kubernetes.io/not-ready";

/// The node lifecycle controller's pass: a node whose Lease has not been
/// renewed within `grace` gets its conditions set to Unknown and the
/// `unreachable` NoExecute taint (`not-ready` when it reports Ready=False);
/// the taints go when the node is healthy again. Pods on a tainted node
/// that do not tolerate the taint are evicted at once, those that tolerate
/// it for `tolerationSeconds` once that time has passed.
pub async fn node_lifecycle_pass(
    client: &kube::Client,
    c: &Caches,
    leases: &Store<k8s_openapi::api::coordination::v1::Lease>,
    grace: std::time::Duration,
) {
    let now = k8s_openapi::jiff::Timestamp::now();
    let nodes_api: Api<Node> = Api::all(client.clone());
    let mut tainted: HashMap<String, Vec<k8s_openapi::api::core::v1::Taint>> = HashMap::new();
    for n in c.nodes.state() {
        let name = n.name_any();
        let lease = leases
            .state()
            .into_iter()
            .find(|l| l.name_any() == name && l.namespace().as_deref() == Some("kube-node-lease"));
        let renewed = lease
            .as_ref()
            .and_then(|l| l.spec.as_ref()?.renew_time.as_ref().map(|t| t.0))
            .or_else(|| n.metadata.creation_timestamp.as_ref().map(|t| t.0))
            .unwrap_or(now);
        let stale =
            renewed + k8s_openapi::jiff::SignedDuration::try_from(grace).unwrap_or_default() < now;
        let conditions = n
            .status
            .as_ref()
            .and_then(|s| s.conditions.clone())
            .unwrap_or_default();
        let ready = conditions
            .iter()
            .find(|c| c.type_ == "Ready")
            .map(|c| c.status.clone())
            .unwrap_or_default();
        let want_taint = if stale {
            Some(UNREACHABLE)
        } else if ready == "False" {
            Some(NOT_READY)
        } else {
            None
        };
        if stale && ready != "Unknown" {
            let conds: Vec<Value> = conditions
                .iter()
                .map(|c| {
                    json!({
                        "type": c.type_, "status": "Unknown", "reason": "NodeStatusUnknown",
                        "message": "Kubelet stopped posting node status.",
                        "lastHeartbeatTime": c.last_heartbeat_time.as_ref().map(|t| t.0.to_string()),
                        "lastTransitionTime": now.to_string(),
                    })
                })
                .collect();
            let _ = nodes_api
                .patch_status(
                    &name,
                    &PatchParams::default(),
                    &Patch::Merge(&json!({"status": {"conditions": conds}})),
                )
                .await;
            tracing::info!(
                node = name,
                "node stopped renewing its lease; marked Unknown"
            );
        }
        let mut taints = n
            .spec
            .as_ref()
            .and_then(|s| s.taints.clone())
            .unwrap_or_default();
        let has = |key: &str, taints: &Vec<k8s_openapi::api::core::v1::Taint>| {
            taints
                .iter()
                .any(|t| t.key == key && t.effect == "NoExecute")
        };
        let mut changed = false;
        for key in [UNREACHABLE, NOT_READY] {
            let want = want_taint == Some(key);
            if want && !has(key, &taints) {
                taints.push(k8s_openapi::api::core::v1::Taint {
                    key: key.into(),
                    effect: "NoExecute".into(),
                    time_added: Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(now)),
                    value: None,
                });
                changed = true;
            } else if !want && has(key, &taints) {
                taints.retain(|t| !(t.key == key && t.effect == "NoExecute"));
                changed = true;
            }
        }
        if changed {
            let t = if taints.is_empty() {
                Value::Null
            } else {
                json!(taints)
            };
            let _ = nodes_api
                .patch(
                    &name,
                    &PatchParams::default(),
                    &Patch::Merge(&json!({"spec": {"taints": t}})),
                )
                .await;
        }
        let no_exec: Vec<_> = taints
            .into_iter()
            .filter(|t| t.effect == "NoExecute")
            .collect();
        if !no_exec.is_empty() {
            tainted.insert(name, no_exec);
        }
    }
    if tainted.is_empty() {
        return;
    }
    for p in c.pods.state() {
        let Some(node) = p.spec.as_ref().and_then(|s| s.node_name.clone()) else {
            continue;
        };
        let Some(taints) = tainted.get(&node) else {
            continue;
        };
        if common::is_terminating(&p.metadata) || !common::pod_is_active(&p) {
            continue;
        }
        let tolerations = p
            .spec
            .as_ref()
            .and_then(|s| s.tolerations.clone())
            .unwrap_or_default();
        let mut evict_at: Option<k8s_openapi::jiff::Timestamp> = None;
        let mut never = true;
        for t in taints {
            let tol = tolerations.iter().find(|tol| {
                let key_ok = tol.key.as_deref().map(|k| k == t.key).unwrap_or(true)
                    || tol.key.as_deref() == Some("");
                let effect_ok = tol
                    .effect
                    .as_deref()
                    .map(|e| e.is_empty() || e == t.effect)
                    .unwrap_or(true);
                let op_ok = match tol.operator.as_deref() {
                    Some("Exists") => true,
                    _ => tol.value.as_deref().unwrap_or("") == t.value.as_deref().unwrap_or(""),
                };
                key_ok && effect_ok && op_ok
            });
            let added = t.time_added.as_ref().map(|x| x.0).unwrap_or(now);
            match tol {
                None => {
                    evict_at = Some(now);
                    never = false;
                }
                Some(tol) => {
                    if let Some(secs) = tol.toleration_seconds {
                        let at = added + k8s_openapi::jiff::SignedDuration::from_secs(secs.max(0));
                        evict_at = Some(evict_at.map(|e| e.min(at)).unwrap_or(at));
                        never = false;
                    }
                }
            }
        }
        if never {
            continue;
        }
        if evict_at.map(|t| t <= now).unwrap_or(false) {
            let ns = p.namespace().unwrap_or_default();
            let api: Api<Pod> = Api::namespaced(client.clone(), &ns);
            let dp = DeleteParams {
                preconditions: Some(Preconditions {
                    uid: p.metadata.uid.clone(),
                    resource_version: None,
                }),
                ..Default::default()
            };
            if api.delete(&p.name_any(), &dp).await.is_ok() {
                let involved = json!({"apiVersion": "v1", "kind": "Pod", "name": p.name_any(), "namespace": ns, "uid": p.metadata.uid});
                common::event(
                    client,
                    "taint-eviction-controller",
                    involved,
                    &ns,
                    "Normal",
                    "TaintManagerEviction",
                    format!("Marking for deletion Pod {ns}/{}", p.name_any()),
                );
            }
        }
    }
}
