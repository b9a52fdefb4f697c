//! The ReplicaSet and ReplicationController controllers: keep `replicas`
//! pods matching the selector alive, adopt matching orphans, release pods
//! whose labels stop matching, delete the least valuable pods first when
//! scaling down, create in slow-start batches, and report status.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::apps::v1::ReplicaSet;
use k8s_openapi::api::core::v1::{Pod, PodTemplateSpec, ReplicationController};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use kube::api::{Api, DeleteParams, PostParams, Preconditions};
use kube::ResourceExt;
use serde_json::json;

use crate::common::{self, Expectations};
use crate::controller::Controller;
use crate::framework::{self, Next};
use crate::{Ctx, Error};
use skiff_helpers::workloads::pod_from_template;

/// Which of the two kinds a controller manages.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Flavor {
    ReplicaSet,
    ReplicationController,
}

impl Flavor {
    fn name(self) -> &'static str {
        match self {
            Flavor::ReplicaSet => "replicaset",
            Flavor::ReplicationController => "replicationcontroller",
        }
    }
    fn component(self) -> &'static str {
        match self {
            Flavor::ReplicaSet => "replicaset-controller",
            Flavor::ReplicationController => "replication-controller",
        }
    }
    fn kind(self) -> &'static str {
        match self {
            Flavor::ReplicaSet => "ReplicaSet",
            Flavor::ReplicationController => "ReplicationController",
        }
    }
    fn api_version(self) -> &'static str {
        match self {
            Flavor::ReplicaSet => "apps/v1",
            Flavor::ReplicationController => "v1",
        }
    }
}

/// What the controller needs of a ReplicaSet or ReplicationController.
struct View {
    meta: ObjectMeta,
    replicas: i32,
    selector: LabelSelector,
    template: PodTemplateSpec,
    min_ready_seconds: i32,
    status: (i32, i32, i32, i32, Option<i64>),
}

fn view_rs(rs: &ReplicaSet) -> View {
    let spec = rs.spec.clone().unwrap_or_default();
    let st = rs.status.clone().unwrap_or_default();
    View {
        meta: rs.metadata.clone(),
        replicas: spec.replicas.unwrap_or(1).max(0),
        selector: spec.selector,
        template: spec.template.unwrap_or_default(),
        min_ready_seconds: spec.min_ready_seconds.unwrap_or(0),
        status: (
            st.replicas,
            st.fully_labeled_replicas.unwrap_or(0),
            st.ready_replicas.unwrap_or(0),
            st.available_replicas.unwrap_or(0),
            st.observed_generation,
        ),
    }
}

fn view_rc(rc: &ReplicationController) -> View {
    let spec = rc.spec.clone().unwrap_or_default();
    let st = rc.status.clone().unwrap_or_default();
    let template = spec.template.unwrap_or_default();
    // An RC without a selector selects its template's labels.
    let selector = spec
        .selector
        .filter(|s| !s.is_empty())
        .or_else(|| template.metadata.as_ref().and_then(|m| m.labels.clone()));
    View {
        meta: rc.metadata.clone(),
        replicas: spec.replicas.unwrap_or(1).max(0),
        selector: LabelSelector {
            match_labels: selector,
            match_expressions: None,
        },
        template,
        min_ready_seconds: spec.min_ready_seconds.unwrap_or(0),
        status: (
            st.replicas,
            st.fully_labeled_replicas.unwrap_or(0),
            st.ready_replicas.unwrap_or(0),
            st.available_replicas.unwrap_or(0),
            st.observed_generation,
        ),
    }
}

/// Pods ordered from first to delete to last: unscheduled before scheduled,
/// pending before unknown before running, not ready before ready, recently
/// ready before long ready, more restarts first, newer before older.
pub fn deletion_order(pods: &mut [Arc<Pod>]) {
    pods.sort_by_key(|p| {
        let phase_rank = match common::phase(p) {
            "Pending" => 0,
            "Running" => 2,
            _ => 1,
        };
        let ready_since = common::ready_since(p)
            .map(|t| std::cmp::Reverse(t.as_second()))
            .unwrap_or(std::cmp::Reverse(0));
        let restarts: i32 = p
            .status
            .as_ref()
            .and_then(|s| s.container_statuses.as_ref())
            .map(|c| c.iter().map(|c| c.restart_count).sum())
            .unwrap_or(0);
        let created = p
            .metadata
            .creation_timestamp
            .as_ref()
            .map(|t| t.0.as_second())
            .unwrap_or(0);
        (
            common::is_scheduled(p),
            phase_rank,
            common::pod_ready(p),
            ready_since,
            std::cmp::Reverse(restarts),
            std::cmp::Reverse(created),
        )
    });
}

/// The sizes of slow-start batches for `n` creations: 1, 2, 4, … (at most
/// 500 at once), so a template the API rejects costs one call, not `n`.
pub fn slow_start_batches(n: usize) -> Vec<usize> {
    let mut out = vec![];
    let mut left = n;
    let mut batch = 1usize;
    while left > 0 {
        let b = batch.min(left);
        out.push(b);
        left -= b;
        batch = (batch * 2).min(500);
    }
    out
}

/// The most pods a single reconcile creates or deletes (as Kubernetes'
/// burstReplicas).
pub const BURST: usize = 500;

pub struct State {
    flavor: Flavor,
    expectations: Expectations,
}

/// Registers the controller: its queue, handlers and workers.
pub fn register(ctx: &Arc<Ctx>, tasks: &mut tokio::task::JoinSet<()>, flavor: Flavor) {
    let st = Arc::new(State {
        flavor,
        expectations: Expectations::default(),
    });
    let controller = match flavor {
        Flavor::ReplicaSet => Controller::new(ctx, flavor.name(), &ctx.caches.replicasets),
        Flavor::ReplicationController => {
            Controller::new(ctx, flavor.name(), &ctx.caches.replication_controllers)
        }
    };
    // Pods: their controller; an orphan, every set of its namespace that
    // might adopt it.
    let seen = st.clone();
    controller
        .watches(&ctx.caches.pods, move |c, old, new| {
            seen.expectations
                .observe_pod_change(flavor.kind(), old, new);
            let mut keys = common::owner_keys(flavor.kind(), old, new);
            for p in [old, new].into_iter().flatten() {
                if common::controller_of(&p.metadata).is_some() || new.is_none() {
                    continue;
                }
                let ns = p.metadata.namespace.as_deref().unwrap_or_default();
                let sets: Vec<(ObjectMeta, LabelSelector)> = match flavor {
                    Flavor::ReplicaSet => c
                        .caches
                        .replicasets
                        .in_namespace(ns)
                        .iter()
                        .map(|r| (r.metadata.clone(), view_rs(r).selector))
                        .collect(),
                    Flavor::ReplicationController => c
                        .caches
                        .replication_controllers
                        .in_namespace(ns)
                        .iter()
                        .map(|r| (r.metadata.clone(), view_rc(r).selector))
                        .collect(),
                };
                for (m, sel) in sets {
                    if !common::selector_is_empty(&sel)
                        && common::selector_matches(&sel, p.labels())
                    {
                        keys.push(framework::key_of(&m));
                    }
                }
            }
            keys
        })
        .workers(ctx.options.workers)
        .resync(Duration::from_secs(60))
        .run(tasks, st, |c, st, key| async move {
            reconcile(&c, &st, &key).await
        });
}

async fn reconcile(ctx: &Ctx, st: &State, key: &str) -> Result<Next, Error> {
    let flavor = st.flavor;
    let (rs_obj, rc_obj, v) = match flavor {
        Flavor::ReplicaSet => match ctx.caches.replicasets.get(key) {
            Some(o) => {
                let v = view_rs(&o);
                (Some(o), None, v)
            }
            None => {
                st.expectations.forget(key);
                return Ok(None);
            }
        },
        Flavor::ReplicationController => match ctx.caches.replication_controllers.get(key) {
            Some(o) => {
                let v = view_rc(&o);
                (None, Some(o), v)
            }
            None => {
                st.expectations.forget(key);
                return Ok(None);
            }
        },
    };
    let (ns, name) = framework::split_key(key);
    let uid = v.meta.uid.clone().unwrap_or_default();
    let pods_api: Api<Pod> = Api::namespaced(ctx.client.clone(), ns);
    let settled = st.expectations.satisfied(key);

    let selector = v.selector.clone();
    let matches = |l: &BTreeMap<String, String>| {
        !common::selector_is_empty(&selector) && common::selector_matches(&selector, l)
    };
    let owned = ctx.caches.pods.owned_by(&uid);
    let orphans = if common::is_terminating(&v.meta) {
        vec![]
    } else {
        ctx.caches.pods.orphans_in(ns)
    };
    let client = ctx.client.clone();
    let claimed = common::claim(
        |ns| Api::<Pod>::namespaced(client.clone(), ns),
        &v.meta,
        flavor.api_version(),
        flavor.kind(),
        matches,
        owned,
        orphans,
    )
    .await;
    let mut active: Vec<Arc<Pod>> = claimed
        .iter()
        .filter(|p| common::pod_is_active(p))
        .cloned()
        .collect();

    let mut result: Result<(), Error> = Ok(());
    if settled && !common::is_terminating(&v.meta) {
        let want = v.replicas as usize;
        if active.len() < want {
            let missing = (want - active.len()).min(BURST);
            let pod = pod_from_template(&v.template, &v.meta, flavor.api_version(), flavor.kind());
            let pp = PostParams::default();
            st.expectations.expect_creations(key, missing);
            let mut sent = 0;
            'batches: for n in slow_start_batches(missing) {
                sent += n;
                let futs: Vec<_> = (0..n).map(|_| pods_api.create(&pp, &pod)).collect();
                let mut failed = None;
                for r in futures::future::join_all(futs).await {
                    match r {
                        Ok(p) => {
                            record(
                                ctx,
                                flavor,
                                &rs_obj,
                                &rc_obj,
                                "Normal",
                                "SuccessfulCreate",
                                format!("Created pod: {}", p.name_any()),
                            );
                        }
                        Err(e) => {
                            st.expectations.creation_observed(key);
                            failed = Some(e)
                        }
                    }
                }
                if let Some(e) = failed {
                    // The batches not sent will not be seen either.
                    for _ in sent..missing {
                        st.expectations.creation_observed(key);
                    }
                    record(
                        ctx,
                        flavor,
                        &rs_obj,
                        &rc_obj,
                        "Warning",
                        "FailedCreate",
                        format!("Error creating: {e}"),
                    );
                    result = Err(e.into());
                    break 'batches;
                }
            }
        } else if active.len() > want {
            deletion_order(&mut active);
            let extra = (active.len() - want).min(BURST);
            let futs: Vec<_> = active
                .iter()
                .take(extra)
                .map(|p| {
                    let dp = DeleteParams {
                        preconditions: Some(Preconditions {
                            uid: p.metadata.uid.clone(),
                            resource_version: None,
                        }),
                        ..Default::default()
                    };
                    let api = pods_api.clone();
                    let pname = p.name_any();
                    st.expectations.expect_delete(key, &pname);
                    async move { (pname.clone(), api.delete(&pname, &dp).await) }
                })
                .collect();
            for (pname, r) in futures::future::join_all(futs).await {
                match r {
                    Ok(_) => record(
                        ctx,
                        flavor,
                        &rs_obj,
                        &rc_obj,
                        "Normal",
                        "SuccessfulDelete",
                        format!("Deleted pod: {pname}"),
                    ),
                    Err(e) if common::is_not_found(&e) || common::is_conflict(&e) => {
                        st.expectations.deletion_observed(key, &pname);
                    }
                    Err(e) => {
                        st.expectations.deletion_observed(key, &pname);
                        record(
                            ctx,
                            flavor,
                            &rs_obj,
                            &rc_obj,
                            "Warning",
                            "FailedDelete",
                            format!("Error deleting: {e}"),
                        );
                        result = Err(e.into());
                    }
                }
            }
        }
    }
    write_status(ctx, flavor, ns, name, &v, &claimed).await?;
    result?;
    if !settled {
        return Ok(Some(Duration::from_secs(1)));
    }
    // Availability with minReadySeconds changes with time alone.
    Ok((v.min_ready_seconds > 0
        && active.iter().any(|p| {
            common::pod_ready(p) && !common::pod_available(p, v.min_ready_seconds, common::now())
        }))
    .then_some(Duration::from_secs(1)))
}

#[allow(clippy::too_many_arguments)]
fn record(
    ctx: &Ctx,
    flavor: Flavor,
    rs: &Option<Arc<ReplicaSet>>,
    rc: &Option<Arc<ReplicationController>>,
    type_: &str,
    reason: &str,
    msg: String,
) {
    let warn = type_ == "Warning";
    match (rs, rc) {
        (Some(o), _) if warn => ctx.events.warning(flavor.component(), &**o, reason, msg),
        (Some(o), _) => ctx.events.normal(flavor.component(), &**o, reason, msg),
        (_, Some(o)) if warn => ctx.events.warning(flavor.component(), &**o, reason, msg),
        (_, Some(o)) => ctx.events.normal(flavor.component(), &**o, reason, msg),
        _ => {}
    }
}

/// The status counters of a set over the pods it controls.
pub fn status_counts(
    pods: &[Arc<Pod>],
    template_labels: &BTreeMap<String, String>,
    min_ready_seconds: i32,
    now: k8s_openapi::jiff::Timestamp,
) -> (i32, i32, i32, i32) {
    let active: Vec<&Arc<Pod>> = pods.iter().filter(|p| common::pod_is_active(p)).collect();
    let fully = active
        .iter()
        .filter(|p| {
            template_labels
                .iter()
                .all(|(k, v)| p.labels().get(k) == Some(v))
        })
        .count() as i32;
    let ready = active.iter().filter(|p| common::pod_ready(p)).count() as i32;
    let available = active
        .iter()
        .filter(|p| common::pod_available(p, min_ready_seconds, now))
        .count() as i32;
    (active.len() as i32, fully, ready, available)
}

async fn write_status(
    ctx: &Ctx,
    flavor: Flavor,
    ns: &str,
    name: &str,
    v: &View,
    pods: &[Arc<Pod>],
) -> Result<(), Error> {
    let labels = v
        .template
        .metadata
        .as_ref()
        .and_then(|m| m.labels.clone())
        .unwrap_or_default();
    let (replicas, fully, ready, available) =
        status_counts(pods, &labels, v.min_ready_seconds, common::now());
    let want = (replicas, fully, ready, available, v.meta.generation);
    if v.status == want {
        return Ok(());
    }
    let status = json!({
        "replicas": replicas,
        "fullyLabeledReplicas": fully,
        "readyReplicas": ready,
        "availableReplicas": available,
        "observedGeneration": v.meta.generation,
    });
    match flavor {
        Flavor::ReplicaSet => {
            let api: Api<ReplicaSet> = Api::namespaced(ctx.client.clone(), ns);
            common::patch_status(&api, name, status).await
        }
        Flavor::ReplicationController => {
            let api: Api<ReplicationController> = Api::namespaced(ctx.client.clone(), ns);
            common::patch_status(&api, name, status).await
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(name: &str, node: Option<&str>, phase: &str, ready: bool, created: i64) -> Arc<Pod> {
        let mut conditions = vec![];
        if ready {
            conditions.push(json!({"type": "Ready", "status": "True", "lastTransitionTime": "2026-01-01T00:00:00Z"}));
        }
        Arc::new(
            serde_json::from_value(json!({
                "metadata": {"name": name, "labels": {"app": "a"}, "creationTimestamp": k8s_openapi::jiff::Timestamp::from_second(created).unwrap().to_string()},
                "spec": {"nodeName": node, "containers": []},
                "status": {"phase": phase, "conditions": conditions}
            }))
            .unwrap(),
        )
    }

    #[test]
    fn scaling_down_deletes_unscheduled_then_pending_then_not_ready_then_newest_pods() {
        let mut pods = vec![
            pod("ready-old", Some("n"), "Running", true, 100),
            pod("ready-new", Some("n"), "Running", true, 200),
            pod("not-ready", Some("n"), "Running", false, 50),
            pod("pending", Some("n"), "Pending", false, 10),
            pod("unscheduled", None, "Pending", false, 5),
        ];
        deletion_order(&mut pods);
        let names: Vec<_> = pods.iter().map(|p| p.name_any()).collect();
        assert_eq!(
            names,
            [
                "unscheduled",
                "pending",
                "not-ready",
                "ready-new",
                "ready-old"
            ]
        );
    }

    #[test]
    fn slow_start_doubles_batches_up_to_five_hundred() {
        assert_eq!(slow_start_batches(0), Vec::<usize>::new());
        assert_eq!(slow_start_batches(1), vec![1]);
        assert_eq!(slow_start_batches(10), vec![1, 2, 4, 3]);
        let big = slow_start_batches(2000);
        assert_eq!(big.iter().sum::<usize>(), 2000);
        assert!(big.iter().all(|b| *b <= 500));
    }

    #[test]
    fn status_counts_ready_available_and_fully_labeled_pods() {
        let pods = vec![
            pod("a", Some("n"), "Running", true, 1),
            pod("b", Some("n"), "Running", false, 1),
            pod("c", Some("n"), "Succeeded", false, 1),
        ];
        let mut labels = BTreeMap::new();
        labels.insert("app".to_string(), "a".to_string());
        let now = k8s_openapi::jiff::Timestamp::from_second(1_767_225_605).unwrap();
        assert_eq!(status_counts(&pods, &labels, 0, now), (2, 2, 1, 1));
        // Ready since 2026-01-01T00:00:00Z, 5 s before `now`.
        assert_eq!(status_counts(&pods, &labels, 10, now).3, 0);
        labels.insert("tier".into(), "x".into());
        assert_eq!(status_counts(&pods, &labels, 0, now).1, 0);
    }

    #[test]
    fn created_pods_carry_the_template_and_a_blocking_controller_reference() {
        let t: PodTemplateSpec = serde_json::from_value(json!({
            "metadata": {"labels": {"app": "a"}},
            "spec": {"containers": [{"name": "c", "image": "i"}]}
        }))
        .unwrap();
        let owner: ObjectMeta =
            serde_json::from_value(json!({"name": "web", "namespace": "ns", "uid": "u1"})).unwrap();
        let p = pod_from_template(&t, &owner, "apps/v1", "ReplicaSet");
        assert_eq!(p.metadata.generate_name.as_deref(), Some("web-"));
        assert_eq!(p.metadata.namespace.as_deref(), Some("ns"));
        let r = &p.metadata.owner_references.unwrap()[0];
        assert_eq!(
            (r.controller, r.block_owner_deletion),
            (Some(true), Some(true))
        );
        assert_eq!(r.uid, "u1");
    }
}
