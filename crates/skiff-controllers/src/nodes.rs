//! Node controllers. IPAM: every node without a pod CIDR gets the next
//! free /24 of the cluster CIDR. Lifecycle: a node whose Lease (in
//! kube-node-lease) has not been renewed within the grace period gets its
//! conditions set to Unknown (reason NodeStatusUnknown) and the
//! `node.kubernetes.io/unreachable` NoExecute taint (`not-ready` when it
//! reports Ready=False); the taints go when it is healthy again. New taints
//! are paced by zone as Kubernetes paces them ([`crate::disruption_zones`]:
//! 0.1 nodes a second, slower when much of a zone is down, none when every
//! node is). Pods on a tainted node that do not tolerate the taint are
//! evicted at once, those that tolerate it for `tolerationSeconds` once
//! that time has passed.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, DeleteParams, Patch, PatchParams, Preconditions};
use kube::ResourceExt;
use serde_json::{json, Value};

use crate::common;
use crate::controller::Controller;
use crate::disruption_zones::{zone_key, Decision, Zones};
use crate::{Caches, Ctx};

pub fn register_ipam(ctx: &Arc<Ctx>, tasks: &mut tokio::task::JoinSet<()>) {
    Controller::periodic(ctx, "nodeipam", Duration::from_millis(500)).run(
        tasks,
        (),
        |c, _, _| async move {
            node_ipam_pass(&c.client, &c.caches, &c.options.cluster_cidr).await;
            Ok(None)
        },
    );
}

pub fn register_lifecycle(ctx: &Arc<Ctx>, tasks: &mut tokio::task::JoinSet<()>) {
    let zones = Arc::new(tokio::sync::Mutex::new(Zones::default()));
    Controller::periodic(ctx, "nodelifecycle", Duration::from_secs(1)).run(
        tasks,
        zones,
        |c, zones, _| async move {
            let grace = c.options.node_monitor_grace_period;
            node_lifecycle_pass(&c, grace, &mut *zones.lock().await).await;
            Ok(None)
        },
    );
}

/// The conditions of a node whose kubelet went silent: every condition
/// Unknown (NodeStatusUnknown), and those it never posted added as Unknown
/// (NodeStatusNeverUpdated).
pub fn unknown_conditions(
    conditions: &[k8s_openapi::api::core::v1::NodeCondition],
    now: k8s_openapi::jiff::Timestamp,
) -> Vec<Value> {
    let mut out: Vec<Value> = conditions
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
    for t in ["Ready", "MemoryPressure", "DiskPressure", "PIDPressure"] {
        if !conditions.iter().any(|c| c.type_ == t) {
            out.push(json!({
                "type": t, "status": "Unknown", "reason": "NodeStatusNeverUpdated",
                "message": "Kubelet never posted node status.",
                "lastHeartbeatTime": now.to_string(),
                "lastTransitionTime": now.to_string(),
            }));
        }
    }
    out
}

/// The /24s of a /16 cluster CIDR, in order (empty when malformed).
pub fn pod_cidrs(cluster_cidr: &str) -> Vec<String> {
    let (addr, bits) = cluster_cidr.split_once('/').unwrap_or((cluster_cidr, "16"));
    let base: Vec<u8> = addr.split('.').filter_map(|p| p.parse().ok()).collect();
    let Ok(bits) = bits.parse::<u32>() else {
        return vec![];
    };
    if base.len() != 4 || bits > 24 {
        return vec![];
    }
    let ip = u32::from_be_bytes([base[0], base[1], base[2], base[3]]);
    let mask = if bits == 0 {
        0
    } else {
        u32::MAX << (32 - bits)
    };
    let start = ip & mask;
    let count = 1u64 << (24 - bits);
    (0..count.min(65536))
        .map(|i| {
            let a = (start + ((i as u32) << 8)).to_be_bytes();
            format!("{}.{}.{}.0/24", a[0], a[1], a[2])
        })
        .collect()
}

/// Gives each node without one a /24 of the cluster CIDR.
pub async fn node_ipam_pass(client: &kube::Client, c: &Caches, cluster_cidr: &str) {
    let all = pod_cidrs(cluster_cidr);
    let nodes = c.nodes.list();
    let mut used: HashSet<String> = nodes
        .iter()
        .filter_map(|n| n.spec.as_ref()?.pod_cidr.clone())
        .collect();
    let api: Api<Node> = Api::all(client.clone());
    for n in nodes
        .iter()
        .filter(|n| n.spec.as_ref().and_then(|s| s.pod_cidr.as_ref()).is_none())
    {
        let Some(free) = all.iter().find(|c| !used.contains(*c)).cloned() else {
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

const UNREACHABLE: &str = "node.kubernetes.io/unreachable";
const NOT_READY: &str = "node.kubernetes.io/not-ready";
/// TaintNodesByCondition: a node whose kubelet reports one of these
/// conditions True gets the NoSchedule taint beside it (kubelet's
/// eviction manager sets the conditions).
const PRESSURE_TAINTS: [(&str, &str); 3] = [
    ("MemoryPressure", "node.kubernetes.io/memory-pressure"),
    ("DiskPressure", "node.kubernetes.io/disk-pressure"),
    ("PIDPressure", "node.kubernetes.io/pid-pressure"),
];

/// The NoSchedule condition taints `conditions` call for.
pub fn pressure_taints(
    conditions: &[k8s_openapi::api::core::v1::NodeCondition],
) -> Vec<&'static str> {
    PRESSURE_TAINTS
        .iter()
        .filter(|(type_, _)| {
            conditions
                .iter()
                .any(|c| c.type_ == *type_ && c.status == "True")
        })
        .map(|(_, key)| *key)
        .collect()
}

/// The node lifecycle controller's pass: a node whose Lease has not been
/// renewed within `grace` gets its conditions set to Unknown and the
/// `unreachable` NoExecute taint (`not-ready` when it reports Ready=False),
/// as fast as its zone's state allows; the taints go when the node is
/// healthy again (or when every node is down). Pods on a tainted node that
/// do not tolerate the taint are evicted at once, those that tolerate it
/// for `tolerationSeconds` once that time has passed.
pub async fn node_lifecycle_pass(ctx: &Ctx, grace: std::time::Duration, zones: &mut Zones) {
    let client = &ctx.client;
    let c = &ctx.caches;
    let now = k8s_openapi::jiff::Timestamp::now();
    let instant = std::time::Instant::now();
    let nodes_api: Api<Node> = Api::all(client.clone());
    let mut tainted: HashMap<String, Vec<k8s_openapi::api::core::v1::Taint>> = HashMap::new();
    // Each node's health, and each zone's (Ready, not Ready) counts.
    let mut health = Vec::new();
    let mut counts: HashMap<String, (usize, usize)> = HashMap::new();
    for n in c.nodes.list() {
        let name = n.name_any();
        let lease = c.leases.get(&format!("kube-node-lease/{name}"));
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
            let conds = unknown_conditions(&conditions, now);
            let _ = nodes_api
                .patch_status(
                    &name,
                    &PatchParams::default(),
                    &Patch::Merge(&json!({"status": {"conditions": conds}})),
                )
                .await;
            ctx.events.normal(
                "node-controller",
                &*n,
                "NodeNotReady",
                format!("Node {name} status is now: NodeNotReady"),
            );
            tracing::info!(
                node = name,
                "node stopped renewing its lease; marked Unknown"
            );
        }
        let zone = zone_key(&n);
        let count = counts.entry(zone.clone()).or_default();
        if !stale && ready == "True" {
            count.0 += 1;
        } else {
            count.1 += 1;
        }
        // A silent node's conditions are Unknown: no pressure taints.
        let pressure = if stale {
            vec![]
        } else {
            pressure_taints(&conditions)
        };
        health.push((n, zone, want_taint, pressure));
    }
    let decision = zones.observe(&counts, instant);
    for (n, zone, want_taint, pressure) in health {
        let name = n.name_any();
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
        // Trading one of the two taints for the other is not a new taint:
        // it is not paced (as Kubernetes swaps them at once).
        let swapping = has(UNREACHABLE, &taints) || has(NOT_READY, &taints);
        let mut changed = false;
        for key in [UNREACHABLE, NOT_READY] {
            let want = decision == Decision::Taint && want_taint == Some(key);
            if want && !has(key, &taints) {
                if swapping || zones.may_taint(&zone, instant) {
                    taints.push(k8s_openapi::api::core::v1::Taint {
                        key: key.into(),
                        effect: "NoExecute".into(),
                        time_added: Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(now)),
                        value: None,
                    });
                    changed = true;
                }
            } else if !want && has(key, &taints) {
                taints.retain(|t| !(t.key == key && t.effect == "NoExecute"));
                changed = true;
            }
        }
        // Condition taints are not paced (Kubernetes' NoSchedule tainting
        // pass follows every node update).
        for (_, key) in PRESSURE_TAINTS {
            let want = pressure.contains(&key);
            let has = taints
                .iter()
                .any(|t| t.key == key && t.effect == "NoSchedule");
            if want && !has {
                taints.push(k8s_openapi::api::core::v1::Taint {
                    key: key.into(),
                    effect: "NoSchedule".into(),
                    time_added: None,
                    value: None,
                });
                changed = true;
            } else if !want && has {
                taints.retain(|t| !(t.key == key && t.effect == "NoSchedule"));
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
    for p in c.pods.list() {
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
            let tol = tolerations
                .iter()
                .find(|tol| skiff_helpers::scheduling::tolerates(tol, t));
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
                ctx.events.normal(
                    "taint-eviction-controller",
                    &*p,
                    "TaintManagerEviction",
                    format!("Marking for deletion Pod {ns}/{}", p.name_any()),
                );
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_node_under_pressure_gets_the_matching_no_schedule_taints_and_only_those() {
        let conds = |v: Value| -> Vec<k8s_openapi::api::core::v1::NodeCondition> {
            serde_json::from_value(v).unwrap()
        };
        let cases = [
            (
                "no pressure",
                json!([{"type": "MemoryPressure", "status": "False"}, {"type": "Ready", "status": "True"}]),
                vec![],
            ),
            (
                "memory",
                json!([{"type": "MemoryPressure", "status": "True"}, {"type": "DiskPressure", "status": "False"}]),
                vec!["node.kubernetes.io/memory-pressure"],
            ),
            (
                "disk and pids",
                json!([{"type": "DiskPressure", "status": "True"}, {"type": "PIDPressure", "status": "True"}]),
                vec![
                    "node.kubernetes.io/disk-pressure",
                    "node.kubernetes.io/pid-pressure",
                ],
            ),
            (
                "unknown is no pressure",
                json!([{"type": "MemoryPressure", "status": "Unknown"}]),
                vec![],
            ),
        ];
        for (name, c, want) in cases {
            assert_eq!(pressure_taints(&conds(c)), want, "{name}");
        }
    }

    #[test]
    fn a_silent_node_reports_every_condition_unknown_and_the_missing_ones_never_updated() {
        let now = k8s_openapi::jiff::Timestamp::UNIX_EPOCH;
        let have: Vec<k8s_openapi::api::core::v1::NodeCondition> =
            serde_json::from_value(json!([{"type": "Ready", "status": "True"}])).unwrap();
        let out = unknown_conditions(&have, now);
        assert_eq!(out.len(), 4);
        assert!(out.iter().all(|c| c["status"] == "Unknown"));
        assert_eq!(out[0]["reason"], "NodeStatusUnknown");
        assert_eq!(out[1]["reason"], "NodeStatusNeverUpdated");
    }

    #[test]
    fn a_slash_sixteen_gives_two_hundred_fifty_six_slash_twenty_fours_in_order() {
        let all = pod_cidrs("10.42.0.0/16");
        assert_eq!(all.len(), 256);
        assert_eq!(all[0], "10.42.0.0/24");
        assert_eq!(all[255], "10.42.255.0/24");
        assert_eq!(pod_cidrs("10.0.0.0/23"), vec!["10.0.0.0/24", "10.0.1.0/24"]);
        assert!(pod_cidrs("nonsense").is_empty());
        assert!(pod_cidrs("10.0.0.0/28").is_empty());
    }
}
