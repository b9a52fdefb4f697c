//! In-place pod resize on the node, after kubelet 1.33's allocation
//! manager and resize actuation: decisions from data alone.
//!
//! A container's resources go through three states (Kubernetes' words):
//! **desired** (the pod's spec, changed through `pods/<n>/resize`),
//! **allocated** (what the agent admitted: the desired resources once they
//! fit the node, reported as `allocatedResources`; containers start with
//! them) and **actual** (what the runtime was last given for a running
//! instance, reported as `resources`). A resize whose pod requests exceed
//! the node's allocatable is `Infeasible`; one that does not fit beside
//! the other pods' allocations is `Deferred` and retried at every sync
//! (both in a `PodResizePending` condition, with kubelet's messages). An
//! admitted one is actuated by CRI `UpdateContainerResources`, or by a
//! restart where a changed resource's `resizePolicy` says
//! `RestartContainer`; `PodResizeInProgress` is set until every running
//! container has its allocation.
//!
//! The allocation survives an agent restart the way the status does: it is
//! read back from `status.containerStatuses[*].resources` (what was
//! actuated; a resize admitted but not yet actuated is admitted again).

use std::borrow::Cow;
use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

use k8s_openapi::api::core::v1::{Container, Pod, ResourceRequirements};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use serde_json::{json, Value};
use skiff_helpers::resources::{pod_requests, Resource};

use crate::runtime::cri;

/// The resources resize may change.
const RESIZABLE: [&str; 2] = ["cpu", "memory"];

/// The allocated cpu and memory of a pod's resizable containers, by name.
pub type PodAllocation = BTreeMap<String, ResourceRequirements>;

/// Why a resize waits (a `PodResizePending` condition).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pending {
    /// `Infeasible` or `Deferred`.
    pub reason: &'static str,
    pub message: String,
}

/// What the pod worker remembers of its pod's resize.
#[derive(Debug, Default)]
pub struct State {
    /// `None` until the first sync reads it from the pod.
    pub allocated: Option<PodAllocation>,
    /// What each running container instance was last given, by id.
    pub actual: HashMap<String, ResourceRequirements>,
    /// The desired resources that wait, and why.
    pub pending: Option<Pending>,
    /// The last actuation's failure (`PodResizeInProgress` reason `Error`).
    pub error: Option<String>,
}

/// The containers whose resources may be resized: the regular ones and
/// sidecars (restartable init containers).
pub fn resizable(pod: &Pod) -> impl Iterator<Item = &Container> {
    let spec = pod.spec.as_ref();
    spec.into_iter()
        .flat_map(|s| s.init_containers.iter().flatten())
        .filter(|c| c.restart_policy.as_deref() == Some("Always"))
        .chain(spec.into_iter().flat_map(|s| s.containers.iter()))
}

/// The cpu and memory of `r`, nothing else.
pub fn cpu_memory(r: Option<&ResourceRequirements>) -> ResourceRequirements {
    let keep = |m: Option<&BTreeMap<String, Quantity>>| {
        let kept: BTreeMap<String, Quantity> = m
            .into_iter()
            .flatten()
            .filter(|(k, _)| RESIZABLE.contains(&k.as_str()))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        (!kept.is_empty()).then_some(kept)
    };
    ResourceRequirements {
        requests: keep(r.and_then(|r| r.requests.as_ref())),
        limits: keep(r.and_then(|r| r.limits.as_ref())),
        ..Default::default()
    }
}

/// cpu in millicores and memory in bytes, each of requests and limits.
fn amounts(r: &ResourceRequirements) -> [Option<i64>; 4] {
    let get = |m: &Option<BTreeMap<String, Quantity>>, k: &str| {
        m.as_ref().and_then(|m| m.get(k)).and_then(|q| match k {
            "cpu" => skiff_helpers::quantity::milli(&q.0),
            _ => skiff_helpers::quantity::units(&q.0),
        })
    };
    [
        get(&r.requests, "cpu"),
        get(&r.limits, "cpu"),
        get(&r.requests, "memory"),
        get(&r.limits, "memory"),
    ]
}

/// Whether two settings are the same amounts ("500m" is "0.5").
pub fn same(a: &ResourceRequirements, b: &ResourceRequirements) -> bool {
    amounts(a) == amounts(b)
}

/// Whether two allocations are the same amounts.
pub fn same_allocation(a: &PodAllocation, b: &PodAllocation) -> bool {
    a.len() == b.len()
        && a.iter()
            .zip(b)
            .all(|((n1, r1), (n2, r2))| n1 == n2 && same(r1, r2))
}

/// What the pod's spec asks for.
pub fn desired(pod: &Pod) -> PodAllocation {
    resizable(pod)
        .map(|c| (c.name.clone(), cpu_memory(c.resources.as_ref())))
        .collect()
}

/// The allocation a worker starts from: per container what its status
/// says was actuated, else what the spec asks for.
pub fn restore(pod: &Pod) -> PodAllocation {
    let statuses = pod
        .status
        .as_ref()
        .and_then(|s| s.container_statuses.as_ref())
        .into_iter()
        .flatten()
        .chain(
            pod.status
                .as_ref()
                .and_then(|s| s.init_container_statuses.as_ref())
                .into_iter()
                .flatten(),
        );
    let mut reported: HashMap<&str, ResourceRequirements> = HashMap::new();
    for s in statuses {
        if let Some(r) = &s.resources {
            reported.insert(s.name.as_str(), cpu_memory(Some(r)));
        }
    }
    resizable(pod)
        .map(|c| {
            let r = reported
                .remove(c.name.as_str())
                .unwrap_or_else(|| cpu_memory(c.resources.as_ref()));
            (c.name.clone(), r)
        })
        .collect()
}

/// The pod as the node runs it: its containers' cpu and memory as
/// allocated (borrowed when that is the spec).
pub fn with_allocation<'a>(pod: &'a Pod, alloc: &PodAllocation) -> Cow<'a, Pod> {
    if same_allocation(&desired(pod), alloc) {
        return Cow::Borrowed(pod);
    }
    let mut p = pod.clone();
    if let Some(spec) = p.spec.as_mut() {
        let set = |c: &mut Container| {
            let Some(a) = alloc.get(&c.name) else { return };
            let mut r = c.resources.clone().unwrap_or_default();
            for (mine, theirs) in [(&mut r.requests, &a.requests), (&mut r.limits, &a.limits)] {
                let mut m = mine.take().unwrap_or_default();
                m.retain(|k, _| !RESIZABLE.contains(&k.as_str()));
                m.extend(theirs.iter().flatten().map(|(k, v)| (k.clone(), v.clone())));
                *mine = (!m.is_empty()).then_some(m);
            }
            c.resources = Some(r);
        };
        spec.containers.iter_mut().for_each(set);
        spec.init_containers
            .iter_mut()
            .flatten()
            .filter(|c| c.restart_policy.as_deref() == Some("Always"))
            .for_each(set);
    }
    Cow::Owned(p)
}

/// The requests of the pod with this allocation (Kubernetes' PodRequests).
pub fn requests(pod: &Pod, alloc: &PodAllocation) -> Resource {
    let mut r = pod_requests(&with_allocation(pod, alloc), false);
    // Only what resize moves counts here.
    r.ephemeral_storage = 0;
    r.pods = 0;
    r.scalar.clear();
    r
}

/// Whether a pod whose requests become `wanted` may have them on a node
/// with `allocatable`, where the other pods hold `others`: kubelet's
/// checks and messages (cpu in millicores, memory in bytes).
pub fn admit(wanted: &Resource, allocatable: &Resource, others: &Resource) -> Result<(), Pending> {
    // More than the node has at all: never (memory is named first).
    let infeasible = if wanted.memory > allocatable.memory {
        Some(("memory", wanted.memory, allocatable.memory))
    } else if wanted.milli_cpu > allocatable.milli_cpu {
        Some(("cpu", wanted.milli_cpu, allocatable.milli_cpu))
    } else {
        None
    };
    if let Some((what, requested, capacity)) = infeasible {
        return Err(Pending {
            reason: "Infeasible",
            message: format!(
                "Node didn't have enough capacity: {what}, requested: {requested}, capacity: {capacity}"
            ),
        });
    }
    // Not beside the others now: later, maybe (cpu is named first, as the
    // scheduler's fit checks it first).
    for (what, requested, used, capacity) in [
        (
            "cpu",
            wanted.milli_cpu,
            others.milli_cpu,
            allocatable.milli_cpu,
        ),
        ("memory", wanted.memory, others.memory, allocatable.memory),
    ] {
        if requested > 0 && requested > capacity.saturating_sub(used) {
            return Err(Pending {
                reason: "Deferred",
                message: format!(
                    "Node didn't have enough resource: {what}, requested: {requested}, used: {used}, capacity: {capacity}"
                ),
            });
        }
    }
    Ok(())
}

/// How a running container gets its allocation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Actuation {
    /// It has it.
    None,
    /// `UpdateContainerResources`, no restart.
    InPlace,
    /// A changed resource's `resizePolicy` is `RestartContainer`.
    Restart,
}

/// What `c` (as allocated) needs, running with `actual`. The cpu counts
/// as changed when its request or limit did, memory when its limit did
/// (a memory request is no container setting: it changes in place).
pub fn actuation(c: &Container, actual: &ResourceRequirements) -> Actuation {
    let want = cpu_memory(c.resources.as_ref());
    if same(&want, actual) {
        return Actuation::None;
    }
    let [cpu_req, cpu_lim, _, mem_lim] = amounts(&want);
    let [a_cpu_req, a_cpu_lim, _, a_mem_lim] = amounts(actual);
    let restarts = |resource: &str| {
        c.resize_policy
            .iter()
            .flatten()
            .any(|p| p.resource_name == resource && p.restart_policy == "RestartContainer")
    };
    let cpu_changed = cpu_req != a_cpu_req || cpu_lim != a_cpu_lim;
    let mem_changed = mem_lim != a_mem_lim;
    if (cpu_changed && restarts("cpu")) || (mem_changed && restarts("memory")) {
        Actuation::Restart
    } else {
        Actuation::InPlace
    }
}

/// The resize conditions of the pod's status, after kubelet:
/// `PodResizePending` while desired resources wait, `PodResizeInProgress`
/// while a running container lacks its allocation (reason `Error` with the
/// runtime's message when applying failed). `since` gives an unchanged
/// condition's transition time back.
pub fn conditions(
    state: &State,
    in_progress: bool,
    since: impl Fn(&str) -> Option<String>,
    now: &str,
) -> Vec<Value> {
    let at = |t: &str| since(t).unwrap_or_else(|| now.to_string());
    let mut out = vec![];
    if let Some(p) = &state.pending {
        out.push(json!({
            "type": "PodResizePending", "status": "True", "lastProbeTime": null,
            "lastTransitionTime": at("PodResizePending"),
            "reason": p.reason, "message": p.message,
        }));
    }
    if in_progress || state.error.is_some() {
        let mut c = json!({
            "type": "PodResizeInProgress", "status": "True", "lastProbeTime": null,
            "lastTransitionTime": at("PodResizeInProgress"),
        });
        if let Some(e) = &state.error {
            c["reason"] = json!("Error");
            c["message"] = json!(e);
        }
        out.push(c);
    }
    out
}

/// A container status's `allocatedResources` (the allocated requests) and
/// `resources` (`actual` for a running instance, else the allocation).
pub fn status_fields(
    alloc: Option<&ResourceRequirements>,
    actual: Option<&ResourceRequirements>,
) -> Option<(Value, Value)> {
    let alloc = alloc?;
    let requests = alloc.requests.clone().unwrap_or_default();
    let resources = actual.unwrap_or(alloc);
    Some((
        serde_json::to_value(requests).unwrap_or(Value::Null),
        serde_json::to_value(resources).unwrap_or(Value::Null),
    ))
}

/// Learns what running containers were given that the worker did not
/// start itself (after an agent restart): what the status reported for
/// that very instance, else its allocation. Forgets instances that no
/// longer run.
pub fn adopt(state: &mut State, pod: &Pod, seen: &[super::plan::Seen]) {
    state
        .actual
        .retain(|id, _| seen.iter().any(|s| s.running() && &s.id == id));
    let statuses: Vec<_> = pod
        .status
        .iter()
        .flat_map(|s| {
            s.container_statuses
                .iter()
                .flatten()
                .chain(s.init_container_statuses.iter().flatten())
        })
        .collect();
    for s in seen.iter().filter(|s| s.running()) {
        if state.actual.contains_key(&s.id) {
            continue;
        }
        let container_id = format!("containerd://{}", s.id);
        let reported = statuses
            .iter()
            .find(|st| st.container_id.as_deref() == Some(container_id.as_str()))
            .and_then(|st| st.resources.as_ref());
        let actual = match reported {
            Some(r) => cpu_memory(Some(r)),
            None => match state.allocated.as_ref().and_then(|a| a.get(&s.name)) {
                Some(a) => a.clone(),
                None => continue,
            },
        };
        state.actual.insert(s.id.clone(), actual);
    }
}

/// The CRI setting of a container as allocated.
pub fn linux_resources(c: &Container) -> cri::LinuxContainerResources {
    crate::spec::resources(c)
}

/// What each pod on the node holds: the requests of its allocation. The
/// pod workers keep it; a resize is decided against the rest.
#[derive(Debug, Default)]
pub struct Book {
    /// The node's allocatable cpu (millicores) and memory (bytes).
    pub allocatable: Resource,
    pods: Mutex<HashMap<String, Resource>>,
    /// The first complete list of the node's pods has been seeded: before
    /// it, a resize waits (the book may miss pods still to be listed).
    ready: AtomicBool,
}

impl Book {
    pub fn new(milli_cpu: i64, memory: i64) -> Book {
        Book {
            allocatable: Resource {
                milli_cpu,
                memory,
                ..Default::default()
            },
            ..Default::default()
        }
    }

    fn pods(&self) -> std::sync::MutexGuard<'_, HashMap<String, Resource>> {
        self.pods.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A listed pod, with what it holds as its status tells (if the book
    /// does not know it yet): finished pods hold nothing.
    pub fn seed(&self, pod: &Pod) {
        let uid = crate::spec::uid(pod).to_string();
        if finished(pod) {
            self.pods().remove(&uid);
            return;
        }
        let mut pods = self.pods();
        pods.entry(uid)
            .or_insert_with(|| requests(pod, &restore(pod)));
    }

    pub fn set(&self, uid: &str, requests: Resource) {
        self.pods().insert(uid.to_string(), requests);
    }

    pub fn remove(&self, uid: &str) {
        self.pods().remove(uid);
    }

    /// What the pods other than `uid` hold.
    pub fn others(&self, uid: &str) -> Resource {
        let mut sum = Resource::default();
        for (u, r) in self.pods().iter() {
            if u != uid {
                sum.add(r);
            }
        }
        sum
    }

    pub fn set_ready(&self) {
        self.ready.store(true, Ordering::Release);
    }

    pub fn ready(&self) -> bool {
        self.ready.load(Ordering::Acquire)
    }
}

/// Succeeded or Failed: its resources are free.
pub fn finished(pod: &Pod) -> bool {
    matches!(
        pod.status.as_ref().and_then(|s| s.phase.as_deref()),
        Some("Succeeded" | "Failed")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(containers: Value) -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": "web", "namespace": "shop", "uid": "u-1"},
            "spec": {"containers": containers},
        }))
        .unwrap()
    }

    fn res(v: Value) -> ResourceRequirements {
        serde_json::from_value(v).unwrap()
    }

    fn node(milli_cpu: i64, memory: i64) -> Resource {
        Resource {
            milli_cpu,
            memory,
            ..Default::default()
        }
    }

    const MI: i64 = 1 << 20;

    #[test]
    fn a_resize_that_fits_beside_the_other_pods_is_admitted() {
        assert_eq!(
            admit(
                &node(500, 256 * MI),
                &node(2000, 1024 * MI),
                &node(1500, 512 * MI)
            ),
            Ok(())
        );
    }

    #[test]
    fn a_resize_that_does_not_fit_now_is_deferred_with_kubelets_message() {
        assert_eq!(
            admit(&node(600, 256 * MI), &node(2000, 1024 * MI), &node(1500, 512 * MI)),
            Err(Pending {
                reason: "Deferred",
                message: "Node didn't have enough resource: cpu, requested: 600, used: 1500, capacity: 2000".into(),
            })
        );
        let e = admit(
            &node(100, 600 * MI),
            &node(2000, 1024 * MI),
            &node(0, 512 * MI),
        )
        .unwrap_err();
        assert_eq!(e.reason, "Deferred");
        assert!(
            e.message.starts_with(
                "Node didn't have enough resource: memory, requested: 629145600, used: 536870912"
            ),
            "{}",
            e.message
        );
    }

    #[test]
    fn a_resize_beyond_the_node_is_infeasible_memory_named_first() {
        assert_eq!(
            admit(&node(5000, 64 * MI), &node(4000, 1024 * MI), &node(0, 0)),
            Err(Pending {
                reason: "Infeasible",
                message: "Node didn't have enough capacity: cpu, requested: 5000, capacity: 4000"
                    .into(),
            })
        );
        assert_eq!(
            admit(&node(5000, 2048 * MI), &node(4000, 1024 * MI), &node(0, 0))
                .unwrap_err()
                .message,
            "Node didn't have enough capacity: memory, requested: 2147483648, capacity: 1073741824"
        );
    }

    #[test]
    fn a_pod_that_requests_nothing_always_fits_beside_others() {
        assert_eq!(admit(&node(0, 0), &node(1000, MI), &node(1000, MI)), Ok(()));
    }

    #[test]
    fn quantities_compare_by_amount_not_by_spelling() {
        assert!(same(
            &res(json!({"limits": {"cpu": "0.5", "memory": "1Gi"}})),
            &res(json!({"limits": {"cpu": "500m", "memory": "1073741824"}}))
        ));
        assert!(!same(
            &res(json!({"limits": {"cpu": "500m"}})),
            &res(json!({"limits": {"cpu": "600m"}}))
        ));
    }

    fn container(v: Value) -> Container {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn a_changed_resource_restarts_the_container_only_where_its_policy_says_so() {
        let c = container(json!({"name": "app", "resizePolicy": [
                {"resourceName": "cpu", "restartPolicy": "NotRequired"},
                {"resourceName": "memory", "restartPolicy": "RestartContainer"}],
            "resources": {"requests": {"cpu": "200m", "memory": "64Mi"},
                          "limits": {"cpu": "1", "memory": "256Mi"}}}));
        let actual = |v| res(v);
        assert_eq!(
            actuation(&c, &cpu_memory(c.resources.as_ref())),
            Actuation::None
        );
        // cpu alone: in place.
        assert_eq!(
            actuation(
                &c,
                &actual(json!({"requests": {"cpu": "100m", "memory": "64Mi"},
                "limits": {"cpu": "1", "memory": "256Mi"}}))
            ),
            Actuation::InPlace
        );
        // memory's limit: a restart (with cpu too).
        assert_eq!(
            actuation(
                &c,
                &actual(json!({"requests": {"cpu": "100m", "memory": "64Mi"},
                "limits": {"cpu": "1", "memory": "128Mi"}}))
            ),
            Actuation::Restart
        );
        // memory's request alone is no container setting.
        assert_eq!(
            actuation(
                &c,
                &actual(json!({"requests": {"cpu": "200m", "memory": "32Mi"},
                "limits": {"cpu": "1", "memory": "256Mi"}}))
            ),
            Actuation::InPlace
        );
        // Without policies everything is in place.
        let plain = container(json!({"name": "app",
            "resources": {"limits": {"cpu": "1", "memory": "256Mi"}}}));
        assert_eq!(
            actuation(
                &plain,
                &actual(json!({"limits": {"cpu": "1", "memory": "512Mi"}}))
            ),
            Actuation::InPlace
        );
    }

    #[test]
    fn the_allocation_comes_back_from_the_status_after_a_restart() {
        let mut p = pod(json!([
            {"name": "a", "image": "x", "resources": {"requests": {"cpu": "300m"}}},
            {"name": "b", "image": "x", "resources": {"requests": {"cpu": "100m"}}},
        ]));
        p.status = serde_json::from_value(json!({"containerStatuses": [
            {"name": "a", "image": "x", "imageID": "", "ready": true, "restartCount": 0,
             "resources": {"requests": {"cpu": "200m"}}},
        ]}))
        .unwrap();
        let alloc = restore(&p);
        assert!(same(
            &alloc["a"],
            &res(json!({"requests": {"cpu": "200m"}}))
        ));
        assert!(same(
            &alloc["b"],
            &res(json!({"requests": {"cpu": "100m"}}))
        ));
        // The node runs the allocated shape; the rest of the spec is kept.
        let run = with_allocation(&p, &alloc);
        assert!(matches!(run, Cow::Owned(_)));
        let a = &run.spec.as_ref().unwrap().containers[0];
        assert_eq!(
            a.resources.as_ref().unwrap().requests.as_ref().unwrap()["cpu"].0,
            "200m"
        );
        assert_eq!(a.image.as_deref(), Some("x"));
        assert_eq!(requests(&p, &alloc).milli_cpu, 300);
        // As asked: borrowed.
        assert!(matches!(
            with_allocation(&p, &desired(&p)),
            Cow::Borrowed(_)
        ));
    }

    #[test]
    fn other_resources_stay_as_the_spec_has_them() {
        let p = pod(json!([{"name": "a", "image": "x", "resources": {
            "requests": {"cpu": "1", "example.com/gpu": "1"},
            "limits": {"cpu": "2", "example.com/gpu": "1"}}}]));
        let mut alloc = desired(&p);
        assert_eq!(alloc["a"].requests.as_ref().unwrap().len(), 1, "cpu only");
        alloc.insert(
            "a".into(),
            res(json!({"requests": {"cpu": "500m"}, "limits": {"cpu": "2"}})),
        );
        let run = with_allocation(&p, &alloc);
        let r = run.spec.as_ref().unwrap().containers[0]
            .resources
            .clone()
            .unwrap();
        assert_eq!(r.requests.as_ref().unwrap()["cpu"].0, "500m");
        assert_eq!(r.requests.as_ref().unwrap()["example.com/gpu"].0, "1");
    }

    #[test]
    fn the_book_counts_other_unfinished_pods() {
        let book = Book::new(4000, 1024 * MI);
        let mut p = pod(json!([{"name": "a", "image": "x",
            "resources": {"requests": {"cpu": "1", "memory": "100Mi"}}}]));
        book.seed(&p);
        book.set("u-2", node(500, 10 * MI));
        assert_eq!(book.others("u-3").milli_cpu, 1500);
        assert_eq!(book.others("u-1").milli_cpu, 500);
        p.status = serde_json::from_value(json!({"phase": "Succeeded"})).unwrap();
        book.seed(&p);
        assert_eq!(book.others("u-3").milli_cpu, 500);
        assert!(!book.ready());
    }

    #[test]
    fn conditions_say_pending_and_in_progress_with_errors() {
        let mut st = State {
            pending: Some(Pending {
                reason: "Infeasible",
                message: "too big".into(),
            }),
            ..Default::default()
        };
        let c = conditions(&st, false, |_| Some("t0".into()), "t1");
        assert_eq!(c.len(), 1);
        assert_eq!(c[0]["type"], "PodResizePending");
        assert_eq!(c[0]["reason"], "Infeasible");
        assert_eq!(c[0]["lastTransitionTime"], "t0");
        st.pending = None;
        assert!(conditions(&st, false, |_| None, "t1").is_empty());
        let c = conditions(&st, true, |_| None, "t1");
        assert_eq!(c[0]["type"], "PodResizeInProgress");
        assert!(c[0].get("reason").is_none());
        st.error = Some("cgroup write failed".into());
        let c = conditions(&st, true, |_| None, "t1");
        assert_eq!(c[0]["reason"], "Error");
        assert_eq!(c[0]["message"], "cgroup write failed");
    }
}
