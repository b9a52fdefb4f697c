//! ReplicaSets and ReplicationControllers through a real API server.

mod sim;

use k8s_openapi::api::apps::v1::ReplicaSet;
use k8s_openapi::api::core::v1::{Pod, ReplicationController};
use kube::api::{Api, DeleteParams, Patch, PatchParams};
use kube::ResourceExt;
use serde_json::json;
use sim::*;

fn rs(name: &str, replicas: i32) -> serde_json::Value {
    json!({
        "apiVersion": "apps/v1", "kind": "ReplicaSet",
        "metadata": {"name": name},
        "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": name}},
            "template": {"metadata": {"labels": {"app": name}},
                "spec": {"containers": [{"name": "c", "image": "busybox"}]}}}
    })
}

#[tokio::test]
async fn a_replicaset_creates_its_pods_and_replaces_a_deleted_one() {
    let h = start().await;
    let c = &h.client;
    let _: ReplicaSet = create(c, "default", rs("web", 3)).await;
    let first = eventually("3 ready pods", 20, || async {
        let p = pods(c, "default", "app=web").await;
        (p.len() == 3 && p.iter().all(is_ready)).then_some(p)
    })
    .await;
    for p in &first {
        assert!(p.name_any().starts_with("web-"));
        let r = &p.owner_references()[0];
        assert_eq!(
            (r.kind.as_str(), r.controller, r.block_owner_deletion),
            ("ReplicaSet", Some(true), Some(true))
        );
    }
    let pods_api: Api<Pod> = Api::namespaced(c.clone(), "default");
    pods_api
        .delete(&first[0].name_any(), &DeleteParams::default())
        .await
        .unwrap();
    eventually("a replacement", 20, || async {
        let p = pods(c, "default", "app=web").await;
        (p.len() == 3
            && p.iter().all(is_ready)
            && !p.iter().any(|p| p.name_any() == first[0].name_any()))
        .then_some(())
    })
    .await;
    let rs = eventually("status", 20, || async {
        let rs = Api::<ReplicaSet>::namespaced(c.clone(), "default")
            .get("web")
            .await
            .ok()?;
        let s = rs.status.clone()?;
        (s.replicas == 3
            && s.ready_replicas == Some(3)
            && s.available_replicas == Some(3)
            && s.fully_labeled_replicas == Some(3)
            && s.observed_generation == rs.metadata.generation)
            .then_some(rs)
    })
    .await;
    assert_eq!(rs.name_any(), "web");
    // Events name what was done.
    let events = Api::<k8s_openapi::api::core::v1::Event>::namespaced(c.clone(), "default");
    eventually("SuccessfulCreate events", 10, || async {
        let l = events.list(&Default::default()).await.ok()?;
        (l.items
            .iter()
            .filter(|e| {
                e.reason.as_deref() == Some("SuccessfulCreate")
                    && e.source.as_ref().and_then(|s| s.component.as_deref())
                        == Some("replicaset-controller")
            })
            .count()
            >= 4)
            .then_some(())
    })
    .await;
}

#[tokio::test]
async fn scaling_down_deletes_the_not_ready_pods_first() {
    let h = start().await;
    let c = &h.client;
    let _: ReplicaSet = create(c, "default", rs("db", 4)).await;
    eventually("4 ready pods", 20, || async {
        let p = pods(c, "default", "app=db").await;
        (p.len() == 4 && p.iter().all(is_ready)).then_some(())
    })
    .await;
    // Two pods stop being ready.
    let p = pods(c, "default", "app=db").await;
    let pods_api: Api<Pod> = Api::namespaced(c.clone(), "default");
    let sick: Vec<String> = p.iter().take(2).map(|p| p.name_any()).collect();
    for n in &sick {
        pods_api
            .patch(
                n,
                &PatchParams::default(),
                &Patch::Merge(&json!({"metadata": {"annotations": {"sim/ready": "false"}}})),
            )
            .await
            .unwrap();
    }
    eventually("2 not ready", 20, || async {
        let p = pods(c, "default", "app=db").await;
        (p.iter().filter(|p| !is_ready(p)).count() == 2).then_some(())
    })
    .await;
    Api::<ReplicaSet>::namespaced(c.clone(), "default")
        .patch(
            "db",
            &PatchParams::default(),
            &Patch::Merge(&json!({"spec": {"replicas": 2}})),
        )
        .await
        .unwrap();
    let left = eventually("2 pods left", 20, || async {
        let p = pods(c, "default", "app=db").await;
        (p.len() == 2).then_some(p)
    })
    .await;
    for p in &left {
        assert!(
            !sick.contains(&p.name_any()),
            "a not-ready pod survived: {}",
            p.name_any()
        );
        assert!(is_ready(p));
    }
}

#[tokio::test]
async fn orphans_are_adopted_and_pods_whose_labels_change_are_released() {
    let h = start().await;
    let c = &h.client;
    let _: Pod = create(
        c,
        "default",
        json!({"metadata": {"name": "stray", "labels": {"app": "cache"}},
        "spec": {"containers": [{"name": "c", "image": "busybox"}]}}),
    )
    .await;
    let _: ReplicaSet = create(c, "default", rs("cache", 2)).await;
    eventually("2 pods, one adopted", 20, || async {
        let p = pods(c, "default", "app=cache").await;
        (p.len() == 2
            && p.iter().all(|p| !p.owner_references().is_empty())
            && p.iter().any(|p| p.name_any() == "stray"))
        .then_some(())
    })
    .await;
    let pods_api: Api<Pod> = Api::namespaced(c.clone(), "default");
    pods_api
        .patch(
            "stray",
            &PatchParams::default(),
            &Patch::Merge(&json!({"metadata": {"labels": {"app": "other"}}})),
        )
        .await
        .unwrap();
    eventually("released and replaced", 20, || async {
        let stray = pods_api.get("stray").await.ok()?;
        let p = pods(c, "default", "app=cache").await;
        (stray.owner_references().is_empty() && p.len() == 2).then_some(())
    })
    .await;
}

#[tokio::test]
async fn a_replication_controller_keeps_its_replicas() {
    let h = start().await;
    let c = &h.client;
    let _: ReplicationController = create(
        c,
        "default",
        json!({
            "apiVersion": "v1", "kind": "ReplicationController",
            "metadata": {"name": "legacy"},
            "spec": {"replicas": 2, "selector": {"app": "legacy"},
                "template": {"metadata": {"labels": {"app": "legacy"}},
                    "spec": {"containers": [{"name": "c", "image": "busybox"}]}}}
        }),
    )
    .await;
    eventually("2 ready pods and status", 20, || async {
        let p = pods(c, "default", "app=legacy").await;
        let rc = Api::<ReplicationController>::namespaced(c.clone(), "default")
            .get("legacy")
            .await
            .ok()?;
        (p.len() == 2 && p.iter().all(is_ready) && rc.status?.ready_replicas == Some(2))
            .then_some(())
    })
    .await;
}
