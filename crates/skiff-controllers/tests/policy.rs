//! PodDisruptionBudget status, the pod GC and ResourceQuota usage through
//! a real API server.

mod sim;

use std::time::Duration;

use k8s_openapi::api::apps::v1::ReplicaSet;
use k8s_openapi::api::core::v1::{ConfigMap, Node, Pod, ResourceQuota};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::api::{Api, DeleteParams, Patch, PatchParams};
use kube::ResourceExt;
use serde_json::json;
use sim::*;

#[tokio::test]
async fn a_disruption_budget_reports_how_many_pods_may_go() {
    let h = start().await;
    let c = &h.client;
    let _: ReplicaSet = create(c, "default", json!({
        "apiVersion": "apps/v1", "kind": "ReplicaSet", "metadata": {"name": "web"},
        "spec": {"replicas": 3, "selector": {"matchLabels": {"app": "web"}},
            "template": {"metadata": {"labels": {"app": "web"}}, "spec": {"containers": [{"name": "c", "image": "x"}]}}}
    })).await;
    let _: PodDisruptionBudget = create(
        c,
        "default",
        json!({
            "apiVersion": "policy/v1", "kind": "PodDisruptionBudget", "metadata": {"name": "web"},
            "spec": {"maxUnavailable": 1, "selector": {"matchLabels": {"app": "web"}}}
        }),
    )
    .await;
    let api = Api::<PodDisruptionBudget>::namespaced(c.clone(), "default");
    let s = eventually("one disruption allowed", 20, || async {
        let s = api.get("web").await.ok()?.status?;
        (s.current_healthy == 3 && s.disruptions_allowed == 1).then_some(s)
    })
    .await;
    assert_eq!((s.desired_healthy, s.expected_pods), (2, 3));
    let cond = s
        .conditions
        .unwrap()
        .into_iter()
        .find(|c| c.type_ == "DisruptionAllowed")
        .unwrap();
    assert_eq!(
        (cond.status.as_str(), cond.reason.as_str()),
        ("True", "SufficientPods")
    );
    // One pod becomes unready: nothing may go.
    let p = pods(c, "default", "app=web").await;
    Api::<Pod>::namespaced(c.clone(), "default")
        .patch(
            &p[0].name_any(),
            &PatchParams::default(),
            &Patch::Merge(&json!({"metadata": {"annotations": {"sim/ready": "false"}}})),
        )
        .await
        .unwrap();
    eventually("no disruption allowed", 20, || async {
        let s = api.get("web").await.ok()?.status?;
        let c = s
            .conditions?
            .into_iter()
            .find(|c| c.type_ == "DisruptionAllowed")?;
        (s.current_healthy == 2 && s.disruptions_allowed == 0 && c.reason == "InsufficientPods")
            .then_some(())
    })
    .await;
}

#[tokio::test]
async fn pods_bound_to_a_deleted_node_are_collected() {
    let h = start_with(Default::default(), 2).await;
    let c = &h.client;
    let _: Pod = create(
        c,
        "default",
        json!({"metadata": {"name": "stranded", "labels": {"app": "stranded"}},
        "spec": {"nodeName": "node-1", "containers": [{"name": "c", "image": "x"}]}}),
    )
    .await;
    eventually("running", 20, || async {
        pods(c, "default", "app=stranded")
            .await
            .first()
            .filter(|p| is_ready(p))
            .map(|_| ())
    })
    .await;
    Api::<Node>::all(c.clone())
        .delete("node-1", &DeleteParams::default())
        .await
        .unwrap();
    eventually("the pod collected", 20, || async {
        pods(c, "default", "app=stranded")
            .await
            .is_empty()
            .then_some(())
    })
    .await;
}

#[tokio::test]
async fn terminated_pods_over_the_threshold_are_collected_oldest_first() {
    let opts = skiff_controllers::Options {
        terminated_pod_gc_threshold: 1,
        ..Default::default()
    };
    let h = start_with(opts, 1).await;
    let c = &h.client;
    for i in 0..3 {
        let _: Pod = create(
            c,
            "default",
            json!({"metadata": {"name": format!("done-{i}"), "labels": {"app": "done"},
            "annotations": {"sim/exit": "0"}},
            "spec": {"restartPolicy": "Never", "containers": [{"name": "c", "image": "x"}]}}),
        )
        .await;
        tokio::time::sleep(Duration::from_millis(1100)).await;
    }
    let left = eventually("one terminated pod left", 20, || async {
        let p = pods(c, "default", "app=done").await;
        (p.len() == 1).then_some(p)
    })
    .await;
    assert_eq!(left[0].name_any(), "done-2");
}

#[tokio::test]
async fn a_quota_reports_what_its_namespace_uses() {
    let h = start().await;
    let c = &h.client;
    let _: ResourceQuota = create(c, "default", json!({"metadata": {"name": "q"},
        "spec": {"hard": {"pods": "10", "requests.cpu": "4", "limits.memory": "1Gi", "configmaps": "5", "services": "3"}}})).await;
    for (i, cpu) in ["250m", "500m"].iter().enumerate() {
        let _: Pod = create(
            c,
            "default",
            json!({"metadata": {"name": format!("q-{i}")},
            "spec": {"containers": [{"name": "c", "image": "x",
                "resources": {"requests": {"cpu": cpu}, "limits": {"memory": "128Mi"}}}]}}),
        )
        .await;
    }
    let api = Api::<ResourceQuota>::namespaced(c.clone(), "default");
    let used = eventually("usage", 20, || async {
        let s = api.get("q").await.ok()?.status?;
        let u = s.used?;
        (u.get("pods")?.0 == "2").then_some(u)
    })
    .await;
    assert_eq!(used["requests.cpu"].0, "750m");
    assert_eq!(used["limits.memory"].0, "256Mi");
    // The `kubernetes` service lives in default.
    assert_eq!(used["services"].0, "1");
    assert!(used.contains_key("configmaps"));

    // What deletions free comes back at once (a quota is queued when an
    // object it counts changes; its resync is minutes away).
    let gone = DeleteParams {
        grace_period_seconds: Some(0),
        ..Default::default()
    };
    Api::<Pod>::namespaced(c.clone(), "default")
        .delete("q-0", &gone)
        .await
        .unwrap();
    let used = eventually("usage after a pod's deletion", 10, || async {
        let u = api.get("q").await.ok()?.status?.used?;
        (u.get("pods")?.0 == "1").then_some(u)
    })
    .await;
    assert_eq!(used["requests.cpu"].0, "500m");
    assert_eq!(used["limits.memory"].0, "128Mi");
    let configmaps = |u: &std::collections::BTreeMap<String, _>| {
        u.get("configmaps")
            .map(|q: &k8s_openapi::apimachinery::pkg::api::resource::Quantity| q.0.clone())
    };
    let before = configmaps(&used).unwrap();
    let _: ConfigMap = create(c, "default", json!({"metadata": {"name": "q-cm"}})).await;
    eventually("a configmap counted", 10, || async {
        let u = api.get("q").await.ok()?.status?.used?;
        (configmaps(&u)? != before).then_some(())
    })
    .await;
    Api::<ConfigMap>::namespaced(c.clone(), "default")
        .delete("q-cm", &DeleteParams::default())
        .await
        .unwrap();
    eventually("a deleted configmap given back", 10, || async {
        let u = api.get("q").await.ok()?.status?.used?;
        (configmaps(&u)? == before).then_some(())
    })
    .await;
}
