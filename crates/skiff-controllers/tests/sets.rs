//! DaemonSets and StatefulSets through a real API server.

mod sim;

use k8s_openapi::api::apps::v1::{ControllerRevision, DaemonSet, StatefulSet};
use k8s_openapi::api::core::v1::{Node, PersistentVolumeClaim};
use kube::api::{Api, ListParams, Patch, PatchParams};
use kube::ResourceExt;
use serde_json::json;
use sim::*;

#[tokio::test]
async fn a_daemonset_runs_one_pod_per_eligible_node_and_rolls_node_by_node() {
    let h = start_with(Default::default(), 3).await;
    let c = &h.client;
    // node-2 is tainted: daemons without a toleration stay away.
    Api::<Node>::all(c.clone())
        .patch("node-2", &PatchParams::default(), &Patch::Merge(&json!({"spec": {"taints": [{"key": "dedicated", "value": "db", "effect": "NoSchedule"}]}})))
        .await
        .unwrap();
    let _: DaemonSet = create(
        c,
        "default",
        json!({
            "apiVersion": "apps/v1", "kind": "DaemonSet",
            "metadata": {"name": "agent"},
            "spec": {"selector": {"matchLabels": {"app": "agent"}},
                "template": {"metadata": {"labels": {"app": "agent"}},
                    "spec": {"containers": [{"name": "c", "image": "agent:1"}]}}}
        }),
    )
    .await;
    let p = eventually("two daemon pods", 20, || async {
        let p = pods(c, "default", "app=agent").await;
        (p.len() == 2 && p.iter().all(is_ready)).then_some(p)
    })
    .await;
    let mut nodes: Vec<String> = p
        .iter()
        .filter_map(|p| p.spec.as_ref()?.node_name.clone())
        .collect();
    nodes.sort();
    assert_eq!(nodes, ["node-0", "node-1"]);
    let ds_api = Api::<DaemonSet>::namespaced(c.clone(), "default");
    eventually("status", 20, || async {
        let s = ds_api.get("agent").await.ok()?.status?;
        (s.desired_number_scheduled == 2
            && s.number_ready == 2
            && s.current_number_scheduled == 2
            && s.updated_number_scheduled == Some(2)
            && s.number_available == Some(2))
        .then_some(())
    })
    .await;
    // Untainting node-2 adds a pod there.
    Api::<Node>::all(c.clone())
        .patch(
            "node-2",
            &PatchParams::default(),
            &Patch::Merge(&json!({"spec": {"taints": null}})),
        )
        .await
        .unwrap();
    eventually("three daemon pods", 20, || async {
        let p = pods(c, "default", "app=agent").await;
        (p.len() == 3 && p.iter().all(is_ready)).then_some(())
    })
    .await;
    // An update rolls through every node.
    ds_api
        .patch("agent", &PatchParams::default(), &Patch::Merge(&json!({"spec": {"template": {"spec": {"containers": [{"name": "c", "image": "agent:2"}]}}}})))
        .await
        .unwrap();
    eventually("every pod updated", 30, || async {
        let p = pods(c, "default", "app=agent").await;
        (p.len() == 3
            && p.iter().all(|p| {
                is_ready(p)
                    && p.spec.as_ref().unwrap().containers[0].image.as_deref() == Some("agent:2")
            }))
        .then_some(())
    })
    .await;
    let revs = Api::<ControllerRevision>::namespaced(c.clone(), "default")
        .list(&ListParams::default().labels("app=agent"))
        .await
        .unwrap()
        .items;
    let mut numbers: Vec<i64> = revs.iter().map(|r| r.revision).collect();
    numbers.sort();
    assert_eq!(numbers, [1, 2]);
}

#[tokio::test]
async fn a_statefulset_creates_ordinals_in_order_with_claims_and_updates_down_to_its_partition() {
    let h = start().await;
    let c = &h.client;
    let _: StatefulSet = create(c, "default", json!({
        "apiVersion": "apps/v1", "kind": "StatefulSet",
        "metadata": {"name": "db"},
        "spec": {"replicas": 3, "serviceName": "db", "selector": {"matchLabels": {"app": "db"}},
            "template": {"metadata": {"labels": {"app": "db"}},
                "spec": {"containers": [{"name": "c", "image": "db:1"}]}},
            "volumeClaimTemplates": [{"metadata": {"name": "data"},
                "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}}}]}
    })).await;
    let p = eventually("three ordered pods", 30, || async {
        let p = pods(c, "default", "app=db").await;
        (p.len() == 3 && p.iter().all(is_ready)).then_some(p)
    })
    .await;
    let mut names: Vec<String> = p.iter().map(|p| p.name_any()).collect();
    names.sort();
    assert_eq!(names, ["db-0", "db-1", "db-2"]);
    // One revision: writing status (collisionCount 0) changes no hash, so
    // no pod is replaced by a spurious rolling update.
    let revisions = Api::<ControllerRevision>::namespaced(c.clone(), "default")
        .list(&Default::default())
        .await
        .unwrap()
        .items;
    let revisions: Vec<String> = revisions
        .iter()
        .map(|r| r.name_any())
        .filter(|n| n.starts_with("db-"))
        .collect();
    assert_eq!(revisions.len(), 1, "{revisions:?}");
    let api = Api::<StatefulSet>::namespaced(c.clone(), "default");
    let st = eventually("status with revisions", 20, || async {
        let s = api.get("db").await.ok()?.status?;
        (s.ready_replicas == Some(3)).then_some(s)
    })
    .await;
    assert_eq!(st.current_revision, st.update_revision);
    assert_eq!(st.current_revision.as_deref(), Some(revisions[0].as_str()));
    // Ordered: each pod was created after its predecessor.
    let created = |n: &str| {
        p.iter()
            .find(|p| p.name_any() == n)
            .unwrap()
            .metadata
            .creation_timestamp
            .clone()
            .unwrap()
            .0
    };
    assert!(created("db-0") <= created("db-1") && created("db-1") <= created("db-2"));
    let db1 = p.iter().find(|p| p.name_any() == "db-1").unwrap();
    let spec = db1.spec.as_ref().unwrap();
    assert_eq!(
        (spec.hostname.as_deref(), spec.subdomain.as_deref()),
        (Some("db-1"), Some("db"))
    );
    let pvcs = Api::<PersistentVolumeClaim>::namespaced(c.clone(), "default")
        .list(&Default::default())
        .await
        .unwrap()
        .items;
    let mut claims: Vec<String> = pvcs.iter().map(|p| p.name_any()).collect();
    claims.sort();
    assert_eq!(claims, ["data-db-0", "data-db-1", "data-db-2"]);

    // Update with partition 1: db-2 and db-1 change, db-0 stays.
    api.patch(
        "db",
        &PatchParams::default(),
        &Patch::Merge(&json!({"spec": {
        "updateStrategy": {"type": "RollingUpdate", "rollingUpdate": {"partition": 1}},
        "template": {"spec": {"containers": [{"name": "c", "image": "db:2"}]}}}})),
    )
    .await
    .unwrap();
    let image = |p: &k8s_openapi::api::core::v1::Pod| {
        p.spec.as_ref().unwrap().containers[0]
            .image
            .clone()
            .unwrap()
    };
    eventually("db-1 and db-2 updated", 30, || async {
        let p = pods(c, "default", "app=db").await;
        let img = |n: &str| p.iter().find(|p| p.name_any() == n).map(image);
        (p.len() == 3
            && p.iter().all(is_ready)
            && img("db-0").as_deref() == Some("db:1")
            && img("db-1").as_deref() == Some("db:2")
            && img("db-2").as_deref() == Some("db:2"))
        .then_some(())
    })
    .await;
    let s = eventually("status", 20, || async {
        let s = api.get("db").await.ok()?.status?;
        (s.updated_replicas == Some(2) && s.ready_replicas == Some(3)).then_some(s)
    })
    .await;
    assert_ne!(s.current_revision, s.update_revision);
    // Scaling down removes the highest ordinal.
    api.patch(
        "db",
        &PatchParams::default(),
        &Patch::Merge(&json!({"spec": {"replicas": 2}})),
    )
    .await
    .unwrap();
    eventually("db-2 gone", 20, || async {
        let p = pods(c, "default", "app=db").await;
        let mut n: Vec<String> = p.iter().map(|p| p.name_any()).collect();
        n.sort();
        (n == ["db-0", "db-1"]).then_some(())
    })
    .await;
}
