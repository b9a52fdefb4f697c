//! The disruption controller: PodDisruptionBudget status. For each budget,
//! the pods its selector matches in its namespace; expectedPods (the
//! pods, or with a percentage or maxUnavailable the replicas their
//! controllers ask for); currentHealthy (ready, not terminating);
//! desiredHealthy from minAvailable or maxUnavailable; disruptionsAllowed;
//! and the DisruptionAllowed condition that the eviction API reads.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::api::Api;
use kube::ResourceExt;
use serde_json::json;

use crate::common;
use crate::controller::Controller;
use crate::framework::{self, Next};
use crate::{Ctx, Error};

pub fn register(ctx: &Arc<Ctx>, tasks: &mut tokio::task::JoinSet<()>) {
    Controller::new(ctx, "disruption", &ctx.caches.pdbs)
        // Every budget of the pod's namespace that selects it, before or after.
        .watches(&ctx.caches.pods, |c, old, new| {
            let Some(p) = new.or(old) else { return vec![] };
            let ns = p.metadata.namespace.as_deref().unwrap_or_default();
            c.caches
                .pdbs
                .in_namespace(ns)
                .iter()
                .filter(|b| {
                    let sel = b.spec.as_ref().and_then(|s| s.selector.as_ref());
                    sel.is_some_and(|sel| {
                        [old, new]
                            .into_iter()
                            .flatten()
                            .any(|p| common::selector_matches(sel, p.labels()))
                    })
                })
                .map(|b| framework::key_of(&b.metadata))
                .collect()
        })
        .resync(Duration::from_secs(30))
        .run(
            tasks,
            (),
            |c, _, key| async move { reconcile(&c, &key).await },
        );
}

/// The replicas the controller of a pod asks for, if the controller is of
/// a kind with a scale (ReplicaSet, its Deployment, ReplicationController,
/// StatefulSet).
fn controller_scale(ctx: &Ctx, p: &Pod) -> Option<(String, i32)> {
    let r = common::controller_of(&p.metadata)?;
    let ns = p.metadata.namespace.clone().unwrap_or_default();
    let key = format!("{ns}/{}", r.name);
    match r.kind.as_str() {
        "ReplicaSet" => {
            let rs = ctx.caches.replicasets.get(&key)?;
            // A Deployment's set: the Deployment's scale counts.
            if let Some(d) = common::controller_of(&rs.metadata).filter(|d| d.kind == "Deployment")
            {
                let dep = ctx.caches.deployments.get(&format!("{ns}/{}", d.name))?;
                return Some((d.uid.clone(), dep.spec.as_ref()?.replicas.unwrap_or(1)));
            }
            Some((r.uid.clone(), rs.spec.as_ref()?.replicas.unwrap_or(1)))
        }
        "ReplicationController" => {
            let rc = ctx.caches.replication_controllers.get(&key)?;
            Some((r.uid.clone(), rc.spec.as_ref()?.replicas.unwrap_or(1)))
        }
        "StatefulSet" => {
            let s = ctx.caches.statefulsets.get(&key)?;
            Some((r.uid.clone(), s.spec.as_ref()?.replicas.unwrap_or(1)))
        }
        _ => None,
    }
}

/// (expected, desiredHealthy) from a budget's spec; an error for a
/// percentage over pods without a scalable controller, as Kubernetes.
pub fn desired_healthy(
    min_available: Option<&IntOrString>,
    max_unavailable: Option<&IntOrString>,
    pods: i32,
    scale: Option<i32>,
) -> Result<(i32, i32), String> {
    match (min_available, max_unavailable) {
        (Some(IntOrString::Int(n)), _) => Ok((pods, *n)),
        (Some(v @ IntOrString::String(_)), _) => {
            let expected = scale.ok_or("pods without a scalable controller")?;
            Ok((expected, common::scaled_value(v, expected, true)?))
        }
        (None, Some(v)) => {
            let expected = scale.ok_or("pods without a scalable controller")?;
            let u = common::scaled_value(v, expected, true)?;
            Ok((expected, (expected - u).max(0)))
        }
        (None, None) => Ok((pods, 1.min(pods))),
    }
}

async fn reconcile(ctx: &Ctx, key: &str) -> Result<Next, Error> {
    let Some(pdb) = ctx.caches.pdbs.get(key) else {
        return Ok(None);
    };
    let (ns, name) = framework::split_key(key);
    let spec = pdb.spec.clone().unwrap_or_default();
    let pods: Vec<Arc<Pod>> = match &spec.selector {
        Some(sel) if !common::selector_is_empty(sel) => ctx
            .caches
            .pods
            .in_namespace(ns)
            .into_iter()
            .filter(|p| common::selector_matches(sel, p.labels()))
            .filter(|p| {
                let ph = common::phase(p);
                ph != "Succeeded" && ph != "Failed"
            })
            .collect(),
        _ => vec![],
    };
    let healthy = pods
        .iter()
        .filter(|p| common::pod_ready(p) && !common::is_terminating(&p.metadata))
        .count() as i32;
    // Scale: the sum over distinct controllers; pods without one make the
    // scale unknown.
    let mut scales: HashMap<String, i32> = HashMap::new();
    let mut unknown = false;
    for p in &pods {
        match controller_scale(ctx, p) {
            Some((uid, n)) => {
                scales.insert(uid, n);
            }
            None => unknown = true,
        }
    }
    let scale = (!unknown).then(|| scales.values().sum::<i32>());
    let (expected, desired, error) = match desired_healthy(
        spec.min_available.as_ref(),
        spec.max_unavailable.as_ref(),
        pods.len() as i32,
        scale,
    ) {
        Ok((e, d)) => (e, d, None),
        Err(e) => (0, 0, Some(e)),
    };
    let allowed = if error.is_some() {
        0
    } else {
        (healthy - desired).max(0)
    };
    let (cstatus, reason, message) = match &error {
        Some(e) => ("False", "SyncFailed", e.clone()),
        None if allowed > 0 => ("True", "SufficientPods", String::new()),
        None => ("False", "InsufficientPods", String::new()),
    };
    let old = pdb.status.clone().unwrap_or_default();
    let prev = old
        .conditions
        .iter()
        .flatten()
        .find(|c| c.type_ == "DisruptionAllowed");
    let transition = prev
        .filter(|c| c.status == cstatus)
        .map(|c| c.last_transition_time.0.to_string())
        .unwrap_or_else(|| common::now().to_string());
    let unchanged = old.current_healthy == healthy
        && old.desired_healthy == desired
        && old.expected_pods == expected
        && old.disruptions_allowed == allowed
        && old.observed_generation == pdb.metadata.generation
        && prev
            .map(|c| c.status == cstatus && c.reason == reason)
            .unwrap_or(false);
    if !unchanged {
        if let Some(e) = &error {
            ctx.events.warning(
                "controllermanager",
                &*pdb,
                "CalculateExpectedPodCountFailed",
                format!("Failed to calculate the number of expected pods: {e}"),
            );
        }
        let api: Api<PodDisruptionBudget> = Api::namespaced(ctx.client.clone(), ns);
        common::patch_status(
            &api,
            name,
            json!({
                "currentHealthy": healthy,
                "desiredHealthy": desired,
                "expectedPods": expected,
                "disruptionsAllowed": allowed,
                "observedGeneration": pdb.metadata.generation,
                "conditions": [{
                    "type": "DisruptionAllowed", "status": cstatus, "reason": reason,
                    "message": message, "lastTransitionTime": transition,
                    "observedGeneration": pdb.metadata.generation,
                }],
            }),
        )
        .await?;
    }
    Ok(None)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn desired_healthy_follows_min_available_or_max_unavailable() {
        let int = IntOrString::Int;
        let pct = |s: &str| IntOrString::String(s.into());
        assert_eq!(desired_healthy(Some(&int(2)), None, 3, None), Ok((3, 2)));
        assert_eq!(
            desired_healthy(Some(&pct("50%")), None, 3, Some(3)),
            Ok((3, 2))
        );
        assert_eq!(desired_healthy(None, Some(&int(1)), 3, Some(4)), Ok((4, 3)));
        assert_eq!(
            desired_healthy(None, Some(&pct("30%")), 3, Some(10)),
            Ok((10, 7))
        );
        assert!(desired_healthy(None, Some(&int(1)), 3, None).is_err());
        assert!(desired_healthy(Some(&pct("half")), None, 3, Some(3)).is_err());
    }
}
