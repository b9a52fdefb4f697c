//! Hollow nodes against a real API server: they register, renew their
//! Leases, and run pods through the simulated runtime, including pods that
//! finish (for Jobs) or fail with a chosen exit code.

use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, ListParams, PostParams};
use serde_json::json;
use skiff_agent::hollow::{self, HollowOptions};
use skiff_kube::testing::TestCluster;

async fn until<T>(what: &str, mut f: impl AsyncFnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if let Some(v) = f().await {
            return v;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn pod(name: &str, node: &str, policy: &str, annotations: serde_json::Value) -> Pod {
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "annotations": annotations},
        "spec": {"nodeName": node, "restartPolicy": policy, "containers": [{"name": "c", "image": "pause"}]}
    }))
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hollow_nodes_register_renew_leases_and_run_pods_to_completion_or_failure() {
    let cluster = TestCluster::start().await.unwrap();
    let client = cluster.client("hollow");
    let options = HollowOptions {
        nodes: 3,
        prefix: "h".into(),
        // No periodic look at pods within the test: they must move on
        // their watch events and the simulated runtime's scheduled exits
        // alone (event-driven, so 10,000 nodes cost little when idle).
        resync: Duration::from_secs(3600),
        lease_every: Duration::from_millis(500),
        ..Default::default()
    };
    let run = tokio::spawn(hollow::run(client.clone(), options));
    let nodes: Api<Node> = Api::all(client.clone());
    let names = until("three Ready nodes", async || {
        let list = nodes.list(&ListParams::default()).await.ok()?;
        let ready: Vec<String> = list
            .items
            .iter()
            .filter(|n| {
                n.status
                    .as_ref()
                    .and_then(|s| s.conditions.as_ref())
                    .map(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
                    .unwrap_or(false)
            })
            .filter_map(|n| n.metadata.name.clone())
            .collect();
        (ready.len() == 3).then_some(ready)
    })
    .await;
    assert_eq!(names, ["h-0", "h-1", "h-2"]);
    let n = nodes.get("h-1").await.unwrap();
    let alloc = n.status.unwrap().allocatable.unwrap();
    assert_eq!(alloc["pods"].0, "110");
    assert_eq!(alloc["cpu"].0, "4");

    let leases: Api<Lease> = Api::namespaced(client.clone(), "kube-node-lease");
    let first = leases
        .get("h-2")
        .await
        .unwrap()
        .spec
        .unwrap()
        .renew_time
        .unwrap();
    until("a renewed lease", async || {
        let t = leases.get("h-2").await.ok()?.spec?.renew_time?;
        (t.0 > first.0).then_some(())
    })
    .await;

    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let pp = PostParams::default();
    pods.create(&pp, &pod("runs", "h-0", "Always", json!({})))
        .await
        .unwrap();
    pods.create(
        &pp,
        &pod(
            "done",
            "h-1",
            "Never",
            json!({"skiff.io/simulate-run-seconds": "1"}),
        ),
    )
    .await
    .unwrap();
    pods.create(
        &pp,
        &pod(
            "fails",
            "h-2",
            "Never",
            json!({"skiff.io/simulate-run-seconds": "1", "skiff.io/simulate-exit-code": "3"}),
        ),
    )
    .await
    .unwrap();
    let phase = |name: &'static str, want: &'static str| {
        let pods = pods.clone();
        async move {
            until(&format!("{name} {want}"), async || {
                let p = pods.get(name).await.ok()?;
                (p.status.as_ref()?.phase.as_deref()? == want).then_some(p)
            })
            .await
        }
    };
    let running = phase("runs", "Running").await;
    let st = running.status.unwrap();
    assert!(st.pod_ip.is_some());
    assert!(st
        .conditions
        .unwrap()
        .iter()
        .any(|c| c.type_ == "Ready" && c.status == "True"));
    let done = phase("done", "Succeeded").await;
    let cs = &done.status.unwrap().container_statuses.unwrap()[0];
    assert_eq!(
        cs.state
            .as_ref()
            .unwrap()
            .terminated
            .as_ref()
            .unwrap()
            .reason
            .as_deref(),
        Some("Completed")
    );
    let failed = phase("fails", "Failed").await;
    let cs = &failed.status.unwrap().container_statuses.unwrap()[0];
    assert_eq!(
        cs.state
            .as_ref()
            .unwrap()
            .terminated
            .as_ref()
            .unwrap()
            .exit_code,
        3
    );

    // Deleting a pod on a hollow node removes it once "terminated".
    pods.delete("runs", &Default::default()).await.unwrap();
    until("runs gone", async || {
        pods.get_opt("runs").await.ok()?.is_none().then_some(())
    })
    .await;
    run.abort();
}
