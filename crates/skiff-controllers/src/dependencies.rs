//! The dependencies controller: writes what the dependency graph
//! (`skiff_helpers::dependencies::graph`) decides. One pass over the
//! declaring pods, the Services they name, those Services' EndpointSlices
//! and the namespaces, queued by any change to them (changes coalesce in
//! the queue) and every minute:
//!
//! - each declaring pod's `skiff.io/DependenciesReady` condition (the
//!   agent starts its containers once it is True), with a Normal
//!   `WaitingForDependency` Event when it starts to wait;
//! - the same condition on each declaring workload (Deployment,
//!   StatefulSet, DaemonSet, ReplicaSet, Job), summarising its pods;
//! - one Warning `DependencyCycle` Event per cycle among workloads (once
//!   per controller run; ordering is skipped inside the cycle);
//! - the `skiff.io/dependents` annotation of each declared Service;
//! - the NetworkPolicies of enforcing namespaces (labelled
//!   `skiff.io/generated-by=dependencies`): created, replaced when they
//!   differ, deleted when nothing calls for them.
//!
//! While nothing declares a dependency, only pod changes queue a pass, so
//! a cluster without declarations pays one annotation lookup per pod
//! event.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::apps::v1::{DaemonSet, Deployment, ReplicaSet, StatefulSet};
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{Pod, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube::ResourceExt;
use serde_json::{json, Value};
use skiff_helpers::dependencies::graph::{Graph, Inputs};
use skiff_helpers::dependencies::{
    self as deps, ANNOTATION, CONDITION, DEPENDENTS_ANNOTATION, GENERATED_BY, GENERATED_LABEL,
    LABEL,
};

use crate::controller::Controller;
use crate::framework::{Key, Next};
use crate::{common, Ctx, Error};

const COMPONENT: &str = "dependencies-controller";

#[derive(Default)]
pub struct State {
    /// Whether the last pass saw anything to look after: until it does,
    /// Service and EndpointSlice changes queue nothing.
    active: AtomicBool,
    /// Cycles already reported (by their description).
    reported: Mutex<BTreeSet<String>>,
}

fn declares(p: Option<&Pod>) -> bool {
    p.is_some_and(|p| {
        p.metadata
            .annotations
            .as_ref()
            .is_some_and(|a| a.contains_key(ANNOTATION))
            || p.metadata
                .labels
                .as_ref()
                .is_some_and(|l| l.contains_key(LABEL))
    })
}

pub fn register(ctx: &Arc<Ctx>, tasks: &mut tokio::task::JoinSet<()>) {
    let state = Arc::new(State::default());
    let s1 = state.clone();
    let s2 = state.clone();
    let s3 = state.clone();
    Controller::periodic(ctx, "dependencies", Duration::from_secs(60))
        .watches(&ctx.caches.pods, move |_, old, new| {
            (declares(old) || declares(new)).then(Key::new)
        })
        .watches(&ctx.caches.services, move |_, _, _| {
            s1.active.load(Ordering::Relaxed).then(Key::new)
        })
        .watches(&ctx.caches.endpoint_slices, move |_, _, _| {
            s2.active.load(Ordering::Relaxed).then(Key::new)
        })
        .watches(&ctx.caches.namespaces, move |_, _, _| {
            s3.active.load(Ordering::Relaxed).then(Key::new)
        })
        .watches(&ctx.caches.network_policies, move |_, old, new| {
            let ours = |p: Option<&NetworkPolicy>| {
                p.is_some_and(|p| {
                    p.metadata
                        .labels
                        .as_ref()
                        .and_then(|l| l.get(GENERATED_LABEL))
                        == Some(&GENERATED_BY.to_string())
                })
            };
            (ours(old) || ours(new)).then(Key::new)
        })
        .run(tasks, state, |ctx, state, _| async move {
            pass(&ctx, &state).await
        });
}

fn generated(ctx: &Ctx) -> Vec<Arc<NetworkPolicy>> {
    ctx.caches.network_policies.filter(|p| {
        p.metadata
            .labels
            .as_ref()
            .and_then(|l| l.get(GENERATED_LABEL))
            .map(String::as_str)
            == Some(GENERATED_BY)
    })
}

async fn pass(ctx: &Arc<Ctx>, state: &State) -> Result<Next, Error> {
    let pods = ctx.caches.pods.filter(|p| declares(Some(p)));
    let existing = generated(ctx);
    let annotated = ctx.caches.services.filter(|s| {
        s.metadata
            .annotations
            .as_ref()
            .is_some_and(|a| a.contains_key(DEPENDENTS_ANNOTATION))
    });
    let active = !pods.is_empty() || !existing.is_empty() || !annotated.is_empty();
    state.active.store(active, Ordering::Relaxed);
    if !active {
        return Ok(None);
    }
    // The Services the pods name, their slices, and the API server's.
    let mut named: HashSet<(String, String)> = HashSet::new();
    for p in &pods {
        let ns = p.namespace().unwrap_or_default();
        if let Some(list) = deps::declared(p.metadata.annotations.as_ref(), &ns) {
            named.extend(list.into_iter().map(|d| (d.namespace, d.service)));
        }
    }
    let services: Vec<Arc<Service>> = named
        .iter()
        .filter_map(|(ns, n)| ctx.caches.services.get(&format!("{ns}/{n}")))
        .collect();
    let mut slices: Vec<Arc<EndpointSlice>> = vec![];
    let mut api_endpoints: Vec<(String, i32)> = vec![];
    for (ns, svc) in named
        .iter()
        .map(|(a, b)| (a.as_str(), b.as_str()))
        .chain([("default", "kubernetes")])
    {
        for sl in ctx.caches.endpoint_slices.in_namespace(ns) {
            let of = sl
                .metadata
                .labels
                .as_ref()
                .and_then(|l| l.get("kubernetes.io/service-name"));
            if of.map(String::as_str) != Some(svc) {
                continue;
            }
            if (ns, svc) == ("default", "kubernetes") {
                for e in &sl.endpoints {
                    for a in &e.addresses {
                        for p in sl.ports.iter().flatten() {
                            api_endpoints.push((a.clone(), p.port.unwrap_or(443)));
                        }
                    }
                }
            }
            if named.contains(&(ns.to_string(), svc.to_string())) {
                slices.push(sl);
            }
        }
    }
    api_endpoints.sort();
    api_endpoints.dedup();
    let namespaces = ctx.caches.namespaces.list();
    let owner_of = |ns: &str, r: &OwnerReference| -> Option<OwnerReference> {
        let key = format!("{ns}/{}", r.name);
        let meta = match r.kind.as_str() {
            "ReplicaSet" => ctx.caches.replicasets.get(&key).map(|o| o.metadata.clone()),
            "Job" => ctx.caches.jobs.get(&key).map(|o| o.metadata.clone()),
            _ => None,
        }?;
        common::controller_of(&meta).cloned()
    };
    let pod_refs: Vec<&Pod> = pods.iter().map(|p| p.as_ref()).collect();
    let svc_refs: Vec<&Service> = services.iter().map(|s| s.as_ref()).collect();
    let slice_refs: Vec<&EndpointSlice> = slices.iter().map(|s| s.as_ref()).collect();
    let ns_refs: Vec<_> = namespaces.iter().map(|n| n.as_ref()).collect();
    let graph = Graph::build(&Inputs {
        pods: &pod_refs,
        services: &svc_refs,
        slices: &slice_refs,
        namespaces: &ns_refs,
        owner_of: &owner_of,
    });
    let mut failed: Option<Error> = None;
    let mut note = |r: Result<(), Error>| {
        if let Err(e) = r {
            failed.get_or_insert(e);
        }
    };
    note(pod_conditions(ctx, &graph).await);
    note(workload_conditions(ctx, &graph).await);
    report_cycles(ctx, state, &graph);
    note(service_dependents(ctx, &graph, &annotated).await);
    note(policies(ctx, &graph, &api_endpoints, &existing).await);
    match failed {
        Some(e) => Err(e),
        None => Ok(None),
    }
}

/// A condition as it stands on an object.
struct Current<'a> {
    status: &'a str,
    reason: Option<&'a str>,
    message: Option<&'a str>,
    since: Option<String>,
}

/// The condition as it should be, keeping its transition time while its
/// status holds. `None`: already so.
fn condition_patch(
    current: Option<Current<'_>>,
    ready: bool,
    reason: &str,
    message: &str,
) -> Option<Value> {
    let status = if ready { "True" } else { "False" };
    if let Some(c) = &current {
        if c.status == status && c.reason == Some(reason) && c.message == Some(message) {
            return None;
        }
    }
    let since = current
        .filter(|c| c.status == status)
        .and_then(|c| c.since)
        .unwrap_or_else(|| common::now().to_string());
    Some(
        json!({"type": CONDITION, "status": status, "reason": reason, "message": message,
                "lastTransitionTime": since}),
    )
}

async fn pod_conditions(ctx: &Arc<Ctx>, g: &Graph) -> Result<(), Error> {
    for v in &g.verdicts {
        let Some(pod) = ctx.caches.pods.get(&format!("{}/{}", v.namespace, v.name)) else {
            continue;
        };
        let cur = pod
            .status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .and_then(|cs| cs.iter().find(|c| c.type_ == CONDITION));
        let current = cur.map(|c| Current {
            status: c.status.as_str(),
            reason: c.reason.as_deref(),
            message: c.message.as_deref(),
            since: c.last_transition_time.as_ref().map(|t| t.0.to_string()),
        });
        let Some(mut cond) = condition_patch(current, v.ready, v.reason, &v.message) else {
            continue;
        };
        cond["lastProbeTime"] = Value::Null;
        let api: Api<Pod> = Api::namespaced(ctx.client.clone(), &v.namespace);
        let patch = json!({"status": {"conditions": [cond]}});
        match api
            .patch_status(&v.name, &PatchParams::default(), &Patch::Strategic(&patch))
            .await
        {
            Ok(_) => {}
            Err(e) if common::is_not_found(&e) => continue,
            Err(e) => return Err(e.into()),
        }
        if !v.ready && cur.is_none_or(|c| c.status == "True") {
            ctx.events.normal(
                COMPONENT,
                pod.as_ref(),
                deps::WAITING_REASON,
                v.message.clone(),
            );
        }
    }
    Ok(())
}

async fn workload_conditions(ctx: &Arc<Ctx>, g: &Graph) -> Result<(), Error> {
    // Each unit's verdict: ready when all of its pods are.
    let mut verdict: BTreeMap<usize, (bool, String)> = BTreeMap::new();
    for v in &g.verdicts {
        let e = verdict
            .entry(v.unit)
            .or_insert_with(|| (true, String::new()));
        if !v.ready && e.0 {
            *e = (false, format!("pod {}: {}", v.name, v.message));
        }
    }
    for (i, (ready, message)) in verdict {
        let w = &g.units[i].workload;
        let (reason, message) = if ready {
            (
                "DependenciesReady",
                "every pod's declared dependencies have ready endpoints".to_string(),
            )
        } else {
            (deps::WAITING_REASON, message)
        };
        let key = format!("{}/{}", w.namespace, w.name);
        // (status, reason, message, lastTransitionTime) of the condition,
        // from each kind's own condition type.
        macro_rules! current {
            ($cache:ident) => {
                ctx.caches.$cache.get(&key).map(|o| {
                    o.status
                        .as_ref()
                        .and_then(|s| s.conditions.as_ref())
                        .and_then(|cs| cs.iter().find(|c| c.type_ == CONDITION))
                        .map(|c| {
                            (
                                c.status.clone(),
                                c.reason.clone(),
                                c.message.clone(),
                                c.last_transition_time.as_ref().map(|t| t.0.to_string()),
                            )
                        })
                })
            };
        }
        let found = match w.kind.as_str() {
            "Deployment" => current!(deployments),
            "StatefulSet" => current!(statefulsets),
            "DaemonSet" => current!(daemonsets),
            "ReplicaSet" => current!(replicasets),
            "Job" => current!(jobs),
            _ => None,
        };
        // Not a kind skiff writes the condition on, or not cached.
        let Some(found) = found else { continue };
        let cur_t = found.as_ref().map(|(st, r, m, t)| Current {
            status: st.as_str(),
            reason: r.as_deref(),
            message: m.as_deref(),
            since: t.clone(),
        });
        let Some(mut cond) = condition_patch(cur_t, ready, reason, &message) else {
            continue;
        };
        if w.kind == "Deployment" {
            cond["lastUpdateTime"] = json!(common::now().to_string());
        }
        let patch = json!({"status": {"conditions": [cond]}});
        let pp = PatchParams::default();
        let p = Patch::Strategic(&patch);
        let c = ctx.client.clone();
        let ns = w.namespace.as_str();
        let r = match w.kind.as_str() {
            "Deployment" => Api::<Deployment>::namespaced(c, ns)
                .patch_status(&w.name, &pp, &p)
                .await
                .map(drop),
            "StatefulSet" => Api::<StatefulSet>::namespaced(c, ns)
                .patch_status(&w.name, &pp, &p)
                .await
                .map(drop),
            "DaemonSet" => Api::<DaemonSet>::namespaced(c, ns)
                .patch_status(&w.name, &pp, &p)
                .await
                .map(drop),
            "ReplicaSet" => Api::<ReplicaSet>::namespaced(c, ns)
                .patch_status(&w.name, &pp, &p)
                .await
                .map(drop),
            _ => Api::<Job>::namespaced(c, ns)
                .patch_status(&w.name, &pp, &p)
                .await
                .map(drop),
        };
        match r {
            Ok(()) => {}
            Err(e) if common::is_not_found(&e) => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

fn report_cycles(ctx: &Arc<Ctx>, state: &State, g: &Graph) {
    let mut reported = state.reported.lock().unwrap_or_else(|e| e.into_inner());
    for c in &g.cycles {
        let text = g.describe_cycle(c);
        if !reported.insert(text.clone()) {
            continue;
        }
        let message = format!(
            "dependency cycle {text}: start-up ordering is skipped between these workloads"
        );
        let w = &g.units[c[0]].workload;
        let key = format!("{}/{}", w.namespace, w.name);
        let ev = &ctx.events;
        let reason = "DependencyCycle";
        match w.kind.as_str() {
            "Deployment" => {
                if let Some(o) = ctx.caches.deployments.get(&key) {
                    ev.warning(COMPONENT, o.as_ref(), reason, message);
                }
            }
            "StatefulSet" => {
                if let Some(o) = ctx.caches.statefulsets.get(&key) {
                    ev.warning(COMPONENT, o.as_ref(), reason, message);
                }
            }
            "DaemonSet" => {
                if let Some(o) = ctx.caches.daemonsets.get(&key) {
                    ev.warning(COMPONENT, o.as_ref(), reason, message);
                }
            }
            "ReplicaSet" => {
                if let Some(o) = ctx.caches.replicasets.get(&key) {
                    ev.warning(COMPONENT, o.as_ref(), reason, message);
                }
            }
            "Job" => {
                if let Some(o) = ctx.caches.jobs.get(&key) {
                    ev.warning(COMPONENT, o.as_ref(), reason, message);
                }
            }
            _ => {
                if let Some(o) = ctx.caches.pods.get(&key) {
                    ev.warning(COMPONENT, o.as_ref(), reason, message);
                }
            }
        }
    }
}

async fn service_dependents(
    ctx: &Arc<Ctx>,
    g: &Graph,
    annotated: &[Arc<Service>],
) -> Result<(), Error> {
    let mut want: BTreeMap<(String, String), String> = BTreeMap::new();
    for ((ns, svc), units) in &g.dependents {
        let keys: BTreeSet<String> = units.iter().map(|&i| g.units[i].workload.key()).collect();
        want.insert(
            (ns.clone(), svc.clone()),
            keys.into_iter().collect::<Vec<_>>().join(","),
        );
    }
    let mut writes: Vec<(String, String, Value)> = vec![];
    for ((ns, svc), value) in &want {
        let Some(s) = ctx.caches.services.get(&format!("{ns}/{svc}")) else {
            continue;
        };
        let cur = s
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(DEPENDENTS_ANNOTATION));
        if cur != Some(value) {
            writes.push((ns.clone(), svc.clone(), json!(value)));
        }
    }
    for s in annotated {
        let key = (s.namespace().unwrap_or_default(), s.name_any());
        if !want.contains_key(&key) {
            writes.push((key.0, key.1, Value::Null));
        }
    }
    for (ns, name, value) in writes {
        let api: Api<Service> = Api::namespaced(ctx.client.clone(), &ns);
        let patch = json!({"metadata": {"annotations": {DEPENDENTS_ANNOTATION: value}}});
        match api
            .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            Ok(_) => {}
            Err(e) if common::is_not_found(&e) => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

/// Whether a stored policy is what the controller decides (the rest of
/// it is the server's).
fn same(a: &NetworkPolicy, b: &NetworkPolicy) -> bool {
    a.spec == b.spec
        && a.metadata.labels == b.metadata.labels
        && a.metadata.owner_references == b.metadata.owner_references
}

async fn policies(
    ctx: &Arc<Ctx>,
    g: &Graph,
    api_endpoints: &[(String, i32)],
    existing: &[Arc<NetworkPolicy>],
) -> Result<(), Error> {
    let want = g.network_policies(api_endpoints);
    let have: BTreeMap<(String, String), &Arc<NetworkPolicy>> = existing
        .iter()
        .map(|p| ((p.namespace().unwrap_or_default(), p.name_any()), p))
        .collect();
    let mut wanted = BTreeSet::new();
    for p in want {
        let key = (p.namespace().unwrap_or_default(), p.name_any());
        wanted.insert(key.clone());
        let api: Api<NetworkPolicy> = Api::namespaced(ctx.client.clone(), &key.0);
        match have.get(&key) {
            None => match api.create(&PostParams::default(), &p).await {
                Ok(_) => {}
                Err(e) if common::is_conflict(&e) || is_already_exists(&e) => {}
                Err(e) => return Err(e.into()),
            },
            Some(cur) if !same(cur, &p) => {
                let mut next = p.clone();
                next.metadata.resource_version = cur.metadata.resource_version.clone();
                match api.replace(&key.1, &PostParams::default(), &next).await {
                    Ok(_) => {}
                    Err(e) if common::is_conflict(&e) || common::is_not_found(&e) => {}
                    Err(e) => return Err(e.into()),
                }
            }
            Some(_) => {}
        }
    }
    for (key, _) in have.iter().filter(|(k, _)| !wanted.contains(*k)) {
        let api: Api<NetworkPolicy> = Api::namespaced(ctx.client.clone(), &key.0);
        match api.delete(&key.1, &DeleteParams::default()).await {
            Ok(_) => {}
            Err(e) if common::is_not_found(&e) => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

fn is_already_exists(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(r) if r.code == 409)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cur<'a>(status: &'a str, message: &'a str) -> Current<'a> {
        Current {
            status,
            reason: Some(if status == "True" {
                "DependenciesReady"
            } else {
                deps::WAITING_REASON
            }),
            message: Some(message),
            since: Some("2026-01-01T00:00:00Z".into()),
        }
    }

    #[test]
    fn a_condition_is_written_only_when_it_changes_and_keeps_its_transition_time() {
        let waiting = "waiting for shop/db (no ready endpoint)";
        // As it stands: nothing to write.
        assert!(condition_patch(
            Some(cur("False", waiting)),
            false,
            deps::WAITING_REASON,
            waiting
        )
        .is_none());
        // Still waiting, for something else: the message changes, the
        // transition time stays.
        let other = "waiting for shop/cache (no such Service)";
        let c = condition_patch(
            Some(cur("False", waiting)),
            false,
            deps::WAITING_REASON,
            other,
        )
        .unwrap();
        assert_eq!(c["message"], other);
        assert_eq!(c["lastTransitionTime"], "2026-01-01T00:00:00Z");
        assert_eq!(c["type"], CONDITION);
        // Ready now: a new transition time.
        let c =
            condition_patch(Some(cur("False", waiting)), true, "DependenciesReady", "ok").unwrap();
        assert_eq!(c["status"], "True");
        assert_ne!(c["lastTransitionTime"], "2026-01-01T00:00:00Z");
        // None yet: written.
        assert!(condition_patch(None, false, deps::WAITING_REASON, waiting).is_some());
    }
}
