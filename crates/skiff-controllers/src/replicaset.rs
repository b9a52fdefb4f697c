//! The ReplicaSet controller: keeps `replicas` pods matching the selector
//! alive, adopts matching orphans, releases pods whose labels stop matching,
//! deletes the least valuable pods first when scaling down, creates in
//! slow-start batches, and reports status.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::ReplicaSet;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams, Preconditions};
use kube::runtime::controller::Action;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::ResourceExt;
use serde_json::json;

use crate::common::{self, Expectations};
use crate::Error;

pub struct Ctx {
    pub client: kube::Client,
    pub pods: Store<Pod>,
    pub expectations: Expectations,
    pub metrics: Arc<common::Metrics>,
}

const NAME: &str = "replicaset";

/// Pods ordered from first to delete to last: unscheduled before scheduled,
/// pending before running, not ready before ready, recently ready before
/// long ready, more restarts first, newer before older.
pub fn deletion_order(pods: &mut [Arc<Pod>]) {
    pods.sort_by_key(|p| {
        let assigned = p
            .spec
            .as_ref()
            .and_then(|s| s.node_name.as_ref())
            .map(|n| !n.is_empty())
            .unwrap_or(false);
        let phase_rank = match p.status.as_ref().and_then(|s| s.phase.as_deref()) {
            Some("Pending") => 0,
            Some("Running") => 2,
            _ => 1,
        };
        let ready = common::pod_ready(p);
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
            assigned,
            phase_rank,
            ready,
            ready_since,
            std::cmp::Reverse(restarts),
            std::cmp::Reverse(created),
        )
    });
}

pub async fn reconcile(rs: Arc<ReplicaSet>, ctx: Arc<Ctx>) -> Result<Action, Error> {
    let t = Instant::now();
    let r = reconcile_inner(&rs, &ctx).await;
    ctx.metrics.record(NAME, r.is_ok(), t.elapsed());
    r
}

async fn reconcile_inner(rs: &ReplicaSet, ctx: &Ctx) -> Result<Action, Error> {
    let ns = rs.namespace().unwrap_or_default();
    let name = rs.name_any();
    let key = format!("{ns}/{name}");
    if common::is_terminating(&rs.metadata) {
        ctx.expectations.forget(&key);
        return Ok(Action::await_change());
    }
    let uid = rs.metadata.uid.clone().unwrap_or_default();
    let spec = rs.spec.clone().unwrap_or_default();
    let selector = spec.selector.clone();
    let all: Vec<Arc<Pod>> = ctx
        .pods
        .state()
        .into_iter()
        .filter(|p| p.metadata.namespace.as_deref() == Some(ns.as_str()))
        .collect();
    let present = |n: &str| {
        all.iter()
            .any(|p| p.metadata.name.as_deref() == Some(n) && !common::is_terminating(&p.metadata))
    };
    if !ctx.expectations.satisfied(&key, present) {
        return Ok(Action::requeue(Duration::from_millis(500)));
    }
    let pods_api: Api<Pod> = Api::namespaced(ctx.client.clone(), &ns);
    let mut owned: Vec<Arc<Pod>> = vec![];
    for p in &all {
        let labels = p.labels().clone();
        let matches =
            !common::selector_is_empty(&selector) && common::selector_matches(&selector, &labels);
        match common::controller_of(&p.metadata) {
            Some(r) if r.uid == uid => {
                if matches {
                    owned.push(p.clone());
                } else if !common::is_terminating(&p.metadata) {
                    // Release: the pod's labels no longer match.
                    let refs: Vec<_> = p
                        .owner_references()
                        .iter()
                        .filter(|r| r.uid != uid)
                        .cloned()
                        .collect();
                    let patch =
                        json!({"metadata": {"ownerReferences": refs, "uid": p.metadata.uid}});
                    let _ = pods_api
                        .patch(
                            &p.name_any(),
                            &PatchParams::default(),
                            &Patch::Merge(&patch),
                        )
                        .await;
                }
            }
            None if matches && !common::is_terminating(&p.metadata) && common::pod_is_active(p) => {
                // Adopt an orphan.
                let mut refs = p.owner_references().to_vec();
                refs.push(common::controller_ref(
                    "apps/v1",
                    "ReplicaSet",
                    &rs.metadata,
                ));
                let patch = json!({"metadata": {"ownerReferences": refs, "uid": p.metadata.uid}});
                if pods_api
                    .patch(
                        &p.name_any(),
                        &PatchParams::default(),
                        &Patch::Merge(&patch),
                    )
                    .await
                    .is_ok()
                {
                    owned.push(p.clone());
                }
            }
            _ => {}
        }
    }
    let mut active: Vec<Arc<Pod>> = owned
        .iter()
        .filter(|p| common::pod_is_active(p))
        .cloned()
        .collect();
    let want = spec.replicas.unwrap_or(1).max(0) as usize;
    let involved = json!({"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": name, "namespace": ns, "uid": uid});
    if active.len() < want {
        let missing = want - active.len();
        let template = spec.template.clone().unwrap_or_default();
        let mut meta = template.metadata.clone().unwrap_or_default();
        meta.name = None;
        meta.generate_name = Some(format!("{name}-"));
        meta.namespace = Some(ns.clone());
        meta.owner_references = Some(vec![common::controller_ref(
            "apps/v1",
            "ReplicaSet",
            &rs.metadata,
        )]);
        let pod = Pod {
            metadata: meta,
            spec: template.spec.clone(),
            status: None,
        };
        // Slow start: 1, 2, 4, … so a failing template costs few calls.
        let mut created = 0;
        let mut batch = 1;
        let mut failed = None;
        let pp = PostParams::default();
        while created < missing && failed.is_none() {
            let n = batch.min(missing - created);
            let futs: Vec<_> = (0..n).map(|_| pods_api.create(&pp, &pod)).collect();
            for r in futures::future::join_all(futs).await {
                match r {
                    Ok(p) => {
                        let pname = p.name_any();
                        ctx.expectations.expect_add(&key, &pname);
                        common::event(
                            &ctx.client,
                            "replicaset-controller",
                            involved.clone(),
                            &ns,
                            "Normal",
                            "SuccessfulCreate",
                            format!("Created pod: {pname}"),
                        );
                        created += 1;
                    }
                    Err(e) => failed = Some(e),
                }
            }
            batch *= 2;
        }
        if let Some(e) = failed {
            common::event(
                &ctx.client,
                "replicaset-controller",
                involved.clone(),
                &ns,
                "Warning",
                "FailedCreate",
                format!("Error creating: {e}"),
            );
            write_status(rs, ctx, &owned).await?;
            return Err(Error::Kube(e));
        }
    } else if active.len() > want {
        deletion_order(&mut active);
        let extra: Vec<Arc<Pod>> = active
            .into_iter()
            .take(owned.iter().filter(|p| common::pod_is_active(p)).count() - want)
            .collect();
        let futs: Vec<_> = extra
            .iter()
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
                async move { (pname.clone(), api.delete(&pname, &dp).await) }
            })
            .collect();
        for (pname, r) in futures::future::join_all(futs).await {
            match r {
                Ok(_) => {
                    ctx.expectations.expect_delete(&key, &pname);
                    common::event(
                        &ctx.client,
                        "replicaset-controller",
                        involved.clone(),
                        &ns,
                        "Normal",
                        "SuccessfulDelete",
                        format!("Deleted pod: {pname}"),
                    );
                }
                Err(kube::Error::Api(e)) if e.code == 404 || e.code == 409 => {}
                Err(e) => return Err(Error::Kube(e)),
            }
        }
    }
    write_status(rs, ctx, &owned).await?;
    // Availability with minReadySeconds changes with time alone.
    let min_ready = spec.min_ready_seconds.unwrap_or(0);
    Ok(if min_ready > 0 {
        Action::requeue(Duration::from_secs(1))
    } else {
        Action::requeue(Duration::from_secs(60))
    })
}

async fn write_status(rs: &ReplicaSet, ctx: &Ctx, owned: &[Arc<Pod>]) -> Result<(), Error> {
    let spec = rs.spec.clone().unwrap_or_default();
    let now = k8s_openapi::jiff::Timestamp::now();
    let active: Vec<&Arc<Pod>> = owned.iter().filter(|p| common::pod_is_active(p)).collect();
    let template_labels: BTreeMap<String, String> = spec
        .template
        .as_ref()
        .and_then(|t| t.metadata.as_ref())
        .and_then(|m| m.labels.clone())
        .unwrap_or_default();
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
        .filter(|p| common::pod_available(p, spec.min_ready_seconds.unwrap_or(0), now))
        .count() as i32;
    let status = json!({
        "replicas": active.len(),
        "fullyLabeledReplicas": fully,
        "readyReplicas": ready,
        "availableReplicas": available,
        "observedGeneration": rs.metadata.generation,
    });
    let cur = rs.status.clone().unwrap_or_default();
    if cur.replicas as usize == active.len()
        && cur.fully_labeled_replicas.unwrap_or(0) == fully
        && cur.ready_replicas.unwrap_or(0) == ready
        && cur.available_replicas.unwrap_or(0) == available
        && cur.observed_generation == rs.metadata.generation
    {
        return Ok(());
    }
    let api: Api<ReplicaSet> =
        Api::namespaced(ctx.client.clone(), &rs.namespace().unwrap_or_default());
    match api
        .patch_status(
            &rs.name_any(),
            &PatchParams::default(),
            &Patch::Merge(&json!({"status": status})),
        )
        .await
    {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(e)) if e.code == 404 => Ok(()),
        Err(e) => Err(Error::Kube(e)),
    }
}

/// The ReplicaSet that controls a pod, for mapping pod events.
pub fn owner_of(p: &Pod) -> Option<ObjectRef<ReplicaSet>> {
    let r = common::controller_of(&p.metadata)?;
    if r.kind != "ReplicaSet" {
        return None;
    }
    Some(ObjectRef::new(&r.name).within(p.metadata.namespace.as_deref().unwrap_or("default")))
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
                "metadata": {"name": name, "creationTimestamp": k8s_openapi::jiff::Timestamp::from_second(created).unwrap().to_string()},
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
}
