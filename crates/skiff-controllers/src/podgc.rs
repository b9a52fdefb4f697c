//! The pod garbage collector, a sweep every few seconds:
//! - terminated pods (Succeeded or Failed) beyond the threshold go, oldest
//!   first;
//! - pods bound to a node that does not exist (absent from the cache on two
//!   sweeps in a row and confirmed by a live GET) are marked Failed with a
//!   DisruptionTarget condition and force-deleted;
//! - terminating pods that were never scheduled are force-deleted.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, DeleteParams, Patch, PatchParams, Preconditions};
use kube::ResourceExt;
use serde_json::json;

use crate::common;
use crate::controller::Controller;
use crate::Ctx;

const EVERY: Duration = Duration::from_secs(2);

pub fn register(ctx: &Arc<Ctx>, tasks: &mut tokio::task::JoinSet<()>) {
    let suspects = Arc::new(tokio::sync::Mutex::new(HashSet::new()));
    Controller::periodic(ctx, "podgc", EVERY).run(tasks, suspects, |c, suspects, _| async move {
        sweep(&c, &mut *suspects.lock().await).await;
        Ok(None)
    });
}

/// The terminated pods to delete to get down to `threshold` (oldest first).
pub fn over_threshold(pods: &[Arc<Pod>], threshold: usize) -> Vec<Arc<Pod>> {
    let mut done: Vec<Arc<Pod>> = pods
        .iter()
        .filter(|p| {
            let ph = common::phase(p);
            (ph == "Succeeded" || ph == "Failed") && !common::is_terminating(&p.metadata)
        })
        .cloned()
        .collect();
    if done.len() <= threshold {
        return vec![];
    }
    done.sort_by_key(|p| p.metadata.creation_timestamp.as_ref().map(|t| t.0));
    let n = done.len() - threshold;
    done.truncate(n);
    done
}

async fn force_delete(ctx: &Ctx, p: &Pod) {
    let api: Api<Pod> = Api::namespaced(
        ctx.client.clone(),
        p.metadata.namespace.as_deref().unwrap_or(""),
    );
    let dp = DeleteParams {
        grace_period_seconds: Some(0),
        preconditions: Some(Preconditions {
            uid: p.metadata.uid.clone(),
            resource_version: None,
        }),
        ..Default::default()
    };
    if let Err(e) = api.delete(&p.name_any(), &dp).await {
        if !common::is_not_found(&e) {
            tracing::debug!(pod = p.name_any(), error = %e, "pod GC failed");
        }
    }
}

async fn sweep(ctx: &Ctx, suspects: &mut HashSet<String>) {
    let pods = ctx.caches.pods.list();
    // Terminated pods over the threshold.
    for p in over_threshold(&pods, ctx.options.terminated_pod_gc_threshold) {
        let api: Api<Pod> = Api::namespaced(
            ctx.client.clone(),
            p.metadata.namespace.as_deref().unwrap_or(""),
        );
        let dp = DeleteParams {
            preconditions: Some(Preconditions {
                uid: p.metadata.uid.clone(),
                resource_version: None,
            }),
            ..Default::default()
        };
        let _ = api.delete(&p.name_any(), &dp).await;
    }
    // Pods on nodes that do not exist; unscheduled terminating pods.
    let nodes_api: Api<Node> = Api::all(ctx.client.clone());
    let mut now_suspect = HashSet::new();
    let mut checked: std::collections::HashMap<String, bool> = Default::default();
    for p in &pods {
        let node = p
            .spec
            .as_ref()
            .and_then(|s| s.node_name.clone())
            .unwrap_or_default();
        if node.is_empty() {
            if common::is_terminating(&p.metadata) {
                force_delete(ctx, p).await;
            }
            continue;
        }
        if ctx.caches.nodes.get(&node).is_some() {
            continue;
        }
        let uid = p.metadata.uid.clone().unwrap_or_default();
        if !suspects.contains(&uid) {
            now_suspect.insert(uid);
            continue;
        }
        let gone = match checked.get(&node) {
            Some(g) => *g,
            None => {
                let g = matches!(nodes_api.get_opt(&node).await, Ok(None));
                checked.insert(node.clone(), g);
                g
            }
        };
        if !gone {
            continue;
        }
        let api: Api<Pod> = Api::namespaced(
            ctx.client.clone(),
            p.metadata.namespace.as_deref().unwrap_or(""),
        );
        let ph = common::phase(p);
        if ph != "Succeeded" && ph != "Failed" {
            let now = common::now().to_string();
            let status = json!({"status": {"phase": "Failed", "conditions": [{
                "type": "DisruptionTarget", "status": "True", "reason": "DeletionByPodGC",
                "message": "PodGC: node no longer exists", "lastTransitionTime": now}]}});
            let _ = api
                .patch_status(
                    &p.name_any(),
                    &PatchParams::default(),
                    &Patch::Strategic(status),
                )
                .await;
        }
        ctx.events.normal(
            "pod-garbage-collector",
            &**p,
            "PodGCNodeGone",
            format!(
                "deleting pod {}/{} bound to node {node}, which no longer exists",
                p.namespace().unwrap_or_default(),
                p.name_any()
            ),
        );
        force_delete(ctx, p).await;
    }
    *suspects = now_suspect;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(name: &str, phase: &str, created: i64) -> Arc<Pod> {
        Arc::new(
            serde_json::from_value(json!({
                "metadata": {"name": name, "creationTimestamp": k8s_openapi::jiff::Timestamp::from_second(created).unwrap().to_string()},
                "status": {"phase": phase}
            }))
            .unwrap(),
        )
    }

    #[test]
    fn the_oldest_terminated_pods_beyond_the_threshold_are_collected() {
        let pods = vec![
            pod("new-done", "Succeeded", 300),
            pod("running", "Running", 1),
            pod("old-failed", "Failed", 100),
            pod("mid-done", "Succeeded", 200),
        ];
        let names: Vec<String> = over_threshold(&pods, 1)
            .iter()
            .map(|p| p.name_any())
            .collect();
        assert_eq!(names, ["old-failed", "mid-done"]);
        assert!(over_threshold(&pods, 3).is_empty());
    }
}
