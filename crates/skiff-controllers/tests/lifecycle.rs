//! The garbage collector, Jobs, Endpoints/EndpointSlices, namespaces'
//! defaults and node controllers through a real API server.

mod sim;

use std::time::Duration;

use k8s_openapi::api::apps::v1::{Deployment, ReplicaSet};
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{
    ConfigMap, Endpoints, Namespace, Node, Pod, Service, ServiceAccount,
};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams, PropagationPolicy};
use kube::ResourceExt;
use serde_json::json;
use sim::*;

fn rs(name: &str, replicas: i32) -> serde_json::Value {
    json!({
        "apiVersion": "apps/v1", "kind": "ReplicaSet",
        "metadata": {"name": name},
        "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": name}},
            "template": {"metadata": {"labels": {"app": name}},
                "spec": {"containers": [{"name": "c", "image": "busybox", "ports": [{"name": "web", "containerPort": 8080}]}]}}}
    })
}

async fn ready_pods(c: &kube::Client, app: &str, n: usize) -> Vec<Pod> {
    eventually("ready pods", 20, || async {
        let p = pods(c, "default", &format!("app={app}")).await;
        (p.len() == n && p.iter().all(is_ready)).then_some(p)
    })
    .await
}

fn delete_with(policy: PropagationPolicy) -> DeleteParams {
    DeleteParams {
        propagation_policy: Some(policy),
        ..Default::default()
    }
}

#[tokio::test]
async fn deleting_an_owner_in_the_background_collects_its_dependents() {
    let h = start().await;
    let c = &h.client;
    let _: ReplicaSet = create(c, "default", rs("bg", 2)).await;
    ready_pods(c, "bg", 2).await;
    Api::<ReplicaSet>::namespaced(c.clone(), "default")
        .delete("bg", &delete_with(PropagationPolicy::Background))
        .await
        .unwrap();
    eventually("the pods collected", 20, || async {
        pods(c, "default", "app=bg").await.is_empty().then_some(())
    })
    .await;
}

#[tokio::test]
async fn foreground_deletion_removes_dependents_before_the_owner() {
    let h = start().await;
    let c = &h.client;
    let _: Deployment = create(
        c,
        "default",
        json!({
            "apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": "fg"},
            "spec": {"replicas": 2, "selector": {"matchLabels": {"app": "fg"}},
                "template": {"metadata": {"labels": {"app": "fg"}},
                    "spec": {"containers": [{"name": "c", "image": "busybox"}]}}}
        }),
    )
    .await;
    ready_pods(c, "fg", 2).await;
    let deployments = Api::<Deployment>::namespaced(c.clone(), "default");
    deployments
        .delete("fg", &delete_with(PropagationPolicy::Foreground))
        .await
        .unwrap();
    // While dependents exist, the owner is still there, deleting.
    let d = deployments.get_opt("fg").await.unwrap();
    if let Some(d) = d {
        assert!(d.metadata.deletion_timestamp.is_some());
        assert!(d.finalizers().iter().any(|f| f == "foregroundDeletion"));
    }
    eventually("everything gone", 30, || async {
        let gone = deployments.get_opt("fg").await.ok()?.is_none();
        let sets = Api::<ReplicaSet>::namespaced(c.clone(), "default")
            .list(&ListParams::default().labels("app=fg"))
            .await
            .ok()?
            .items;
        (gone && sets.is_empty() && pods(c, "default", "app=fg").await.is_empty()).then_some(())
    })
    .await;
}

#[tokio::test]
async fn orphan_deletion_leaves_the_dependents_without_the_owner_reference() {
    let h = start().await;
    let c = &h.client;
    let _: ReplicaSet = create(c, "default", rs("orph", 2)).await;
    ready_pods(c, "orph", 2).await;
    Api::<ReplicaSet>::namespaced(c.clone(), "default")
        .delete("orph", &delete_with(PropagationPolicy::Orphan))
        .await
        .unwrap();
    eventually("the set gone and its pods orphaned", 20, || async {
        let gone = Api::<ReplicaSet>::namespaced(c.clone(), "default")
            .get_opt("orph")
            .await
            .ok()?
            .is_none();
        let p = pods(c, "default", "app=orph").await;
        (gone && p.len() == 2 && p.iter().all(|p| p.owner_references().is_empty())).then_some(())
    })
    .await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(
        pods(c, "default", "app=orph").await.len(),
        2,
        "orphans were collected"
    );
}

#[tokio::test]
async fn a_dependent_whose_owner_has_another_uid_is_collected() {
    let h = start().await;
    let c = &h.client;
    let _: ConfigMap = create(c, "default", json!({"metadata": {"name": "owner"}})).await;
    let _: ConfigMap = create(c, "default", json!({"metadata": {"name": "dep", "labels": {"app": "dep"},
        "ownerReferences": [{"apiVersion": "v1", "kind": "ConfigMap", "name": "owner", "uid": "not-the-uid"}]}})).await;
    // The owner kind (ConfigMap) is not cached: the collector looks it up.
    // ConfigMaps are not dependents it sweeps either, so use a pod.
    let _: Pod = create(c, "default", json!({"metadata": {"name": "dep-pod", "labels": {"app": "dep"},
        "ownerReferences": [{"apiVersion": "v1", "kind": "ConfigMap", "name": "owner", "uid": "not-the-uid"}]},
        "spec": {"containers": [{"name": "c", "image": "busybox"}]}})).await;
    eventually("the pod collected", 20, || async {
        pods(c, "default", "app=dep").await.is_empty().then_some(())
    })
    .await;
}

fn job(name: &str, spec: serde_json::Value, exit: &str) -> serde_json::Value {
    let mut j = json!({
        "apiVersion": "batch/v1", "kind": "Job",
        "metadata": {"name": name},
        "spec": {"template": {"metadata": {"annotations": {"sim/exit": exit}},
            "spec": {"restartPolicy": "Never", "containers": [{"name": "c", "image": "busybox"}]}}}
    });
    for (k, v) in spec.as_object().unwrap() {
        j["spec"][k] = v.clone();
    }
    j
}

fn condition(j: &Job, t: &str) -> Option<String> {
    j.status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == t && c.status == "True")
        .and_then(|c| c.reason.clone())
}

#[tokio::test]
async fn a_job_completes_and_another_fails_after_its_backoff_limit() {
    let h = start_with(
        skiff_controllers::Options {
            job_backoff_base: Duration::from_millis(300),
            ..Default::default()
        },
        2,
    )
    .await;
    let c = &h.client;
    let jobs = Api::<Job>::namespaced(c.clone(), "default");
    let _: Job = create(
        c,
        "default",
        job("ok", json!({"completions": 3, "parallelism": 2}), "0"),
    )
    .await;
    let t0 = std::time::Instant::now();
    let _: Job = create(c, "default", job("bad", json!({"backoffLimit": 1}), "1")).await;
    let ok = eventually("the job to complete", 30, || async {
        let j = jobs.get("ok").await.ok()?;
        condition(&j, "Complete").map(|_| j)
    })
    .await;
    let s = ok.status.clone().unwrap();
    assert_eq!(s.succeeded, Some(3));
    assert!(s.start_time.is_some() && s.completion_time.is_some());
    assert!(condition(&ok, "SuccessCriteriaMet").is_some());
    let bad = eventually("the job to fail", 30, || async {
        let j = jobs.get("bad").await.ok()?;
        condition(&j, "Failed").map(|_| j)
    })
    .await;
    assert_eq!(
        condition(&bad, "Failed").as_deref(),
        Some("BackoffLimitExceeded")
    );
    assert_eq!(
        condition(&bad, "FailureTarget").as_deref(),
        Some("BackoffLimitExceeded")
    );
    assert_eq!(bad.status.unwrap().failed, Some(2));
    // The retry waited for the back-off (300 ms) after the first failure.
    assert!(
        t0.elapsed() >= Duration::from_millis(300),
        "no back-off: {:?}",
        t0.elapsed()
    );
    assert_eq!(
        pods(c, "default", "batch.kubernetes.io/job-name=bad")
            .await
            .len(),
        2
    );
}

#[tokio::test]
async fn a_work_queue_job_runs_parallel_pods_until_one_succeeds() {
    let h = start().await;
    let c = &h.client;
    let _: Job = create(c, "default", job("queue", json!({"parallelism": 3}), "0")).await;
    let j = eventually("the job to complete", 30, || async {
        let j = Api::<Job>::namespaced(c.clone(), "default")
            .get("queue")
            .await
            .ok()?;
        condition(&j, "Complete").map(|_| j)
    })
    .await;
    assert!(j.status.unwrap().succeeded.unwrap_or(0) >= 1);
    assert_eq!(
        pods(c, "default", "batch.kubernetes.io/job-name=queue")
            .await
            .len(),
        3
    );
}

#[tokio::test]
async fn an_indexed_job_gives_each_pod_its_completion_index() {
    let h = start().await;
    let c = &h.client;
    let _: Job = create(
        c,
        "default",
        job(
            "idx",
            json!({"completions": 3, "parallelism": 3, "completionMode": "Indexed"}),
            "0",
        ),
    )
    .await;
    let j = eventually("the job to complete", 30, || async {
        let j = Api::<Job>::namespaced(c.clone(), "default")
            .get("idx")
            .await
            .ok()?;
        condition(&j, "Complete").map(|_| j)
    })
    .await;
    assert_eq!(
        j.status.unwrap().completed_indexes.as_deref(),
        Some("0,1,2")
    );
    let p = pods(c, "default", "batch.kubernetes.io/job-name=idx").await;
    let mut idx: Vec<String> = p
        .iter()
        .filter_map(|p| {
            p.annotations()
                .get("batch.kubernetes.io/job-completion-index")
                .cloned()
        })
        .collect();
    idx.sort();
    assert_eq!(idx, ["0", "1", "2"]);
    for p in &p {
        let env = p.spec.as_ref().unwrap().containers[0].env.clone().unwrap();
        assert!(env.iter().any(|e| e.name == "JOB_COMPLETION_INDEX"));
    }
}

#[tokio::test]
async fn a_suspended_job_runs_nothing_until_resumed() {
    let h = start().await;
    let c = &h.client;
    let _: Job = create(c, "default", job("later", json!({"suspend": true}), "0")).await;
    // Once the controller has marked it Suspended it has decided: no pods.
    eventually("the Suspended condition", 20, || async {
        let j = Api::<Job>::namespaced(c.clone(), "default")
            .get("later")
            .await
            .ok()?;
        j.status?
            .conditions?
            .iter()
            .any(|c| c.type_ == "Suspended" && c.status == "True")
            .then_some(())
    })
    .await;
    assert!(pods(c, "default", "batch.kubernetes.io/job-name=later")
        .await
        .is_empty());
    let jobs = Api::<Job>::namespaced(c.clone(), "default");
    jobs.patch(
        "later",
        &PatchParams::default(),
        &Patch::Merge(&json!({"spec": {"suspend": false}})),
    )
    .await
    .unwrap();
    eventually("the job to complete", 30, || async {
        condition(&jobs.get("later").await.ok()?, "Complete")
    })
    .await;
}

#[tokio::test]
async fn endpoints_and_slices_follow_pod_readiness() {
    let h = start().await;
    let c = &h.client;
    let _: Service = create(c, "default", json!({"metadata": {"name": "web"},
        "spec": {"selector": {"app": "web"}, "ports": [{"name": "http", "port": 80, "targetPort": "web"}]}})).await;
    let _: ReplicaSet = create(c, "default", rs("web", 2)).await;
    let p = ready_pods(c, "web", 2).await;
    let eps = Api::<Endpoints>::namespaced(c.clone(), "default");
    eventually("two ready addresses", 20, || async {
        let e = eps.get("web").await.ok()?;
        let s = e.subsets?.into_iter().next()?;
        (s.addresses?.len() == 2 && s.ports?[0].port == 8080).then_some(())
    })
    .await;
    Api::<Pod>::namespaced(c.clone(), "default")
        .patch(
            &p[0].name_any(),
            &PatchParams::default(),
            &Patch::Merge(&json!({"metadata": {"annotations": {"sim/ready": "false"}}})),
        )
        .await
        .unwrap();
    eventually("one ready, one not", 20, || async {
        let e = eps.get("web").await.ok()?;
        let s = e.subsets?.into_iter().next()?;
        (s.addresses?.len() == 1 && s.not_ready_addresses?.len() == 1).then_some(())
    })
    .await;
    let slices = Api::<EndpointSlice>::namespaced(c.clone(), "default");
    // One slice with both pods, one ready and one not: the slice may be
    // written before the second pod's readiness reaches it, so wait for
    // what a user would see once the controller caught up.
    let ready_of = |s: &EndpointSlice| -> Vec<bool> {
        s.endpoints
            .iter()
            .map(|e| e.conditions.as_ref().and_then(|c| c.ready).unwrap_or(false))
            .collect()
    };
    let l = eventually(
        "a slice with a ready and an unready endpoint",
        20,
        || async {
            let l = slices
                .list(&ListParams::default().labels("kubernetes.io/service-name=web"))
                .await
                .ok()?
                .items;
            let mixed = l.len() == 1 && {
                let r = ready_of(&l[0]);
                r.len() == 2 && r.contains(&true) && r.contains(&false)
            };
            mixed.then_some(l)
        },
    )
    .await;
    assert_eq!(
        l[0].labels()
            .get("endpointslice.kubernetes.io/managed-by")
            .map(String::as_str),
        Some("endpointslice-controller.k8s.io")
    );
    let ready: Vec<bool> = l[0]
        .endpoints
        .iter()
        .map(|e| e.conditions.as_ref().unwrap().ready.unwrap())
        .collect();
    assert!(ready.contains(&true) && ready.contains(&false));
    // The service goes: so do its endpoints.
    Api::<Service>::namespaced(c.clone(), "default")
        .delete("web", &DeleteParams::default())
        .await
        .unwrap();
    eventually("endpoints deleted", 20, || async {
        eps.get_opt("web").await.ok()?.is_none().then_some(())
    })
    .await;
}

#[tokio::test]
async fn every_namespace_gets_a_default_service_account_and_the_root_ca() {
    let opts = skiff_controllers::Options {
        root_ca_pem: Some("-----BEGIN CERTIFICATE-----\nTEST\n-----END CERTIFICATE-----\n".into()),
        ..Default::default()
    };
    let h = start_with(opts, 0).await;
    let c = &h.client;
    let ns: Namespace = serde_json::from_value(json!({"metadata": {"name": "team"}})).unwrap();
    Api::<Namespace>::all(c.clone())
        .create(&PostParams::default(), &ns)
        .await
        .unwrap();
    eventually("the default service account and the CA", 20, || async {
        let sa = Api::<ServiceAccount>::namespaced(c.clone(), "team")
            .get_opt("default")
            .await
            .ok()??;
        let cm = Api::<ConfigMap>::namespaced(c.clone(), "team")
            .get_opt("kube-root-ca.crt")
            .await
            .ok()??;
        (sa.name_any() == "default" && cm.data?.get("ca.crt")?.contains("TEST")).then_some(())
    })
    .await;
}

#[tokio::test]
async fn nodes_get_pod_cidrs_and_a_node_with_a_stale_lease_is_tainted_and_emptied() {
    let h = start_one_node_short_grace().await;
    let c = &h.client;
    let nodes = Api::<Node>::all(c.clone());
    let n = eventually("a pod CIDR", 20, || async {
        nodes.get("node-0").await.ok()?.spec?.pod_cidr
    })
    .await;
    assert_eq!(n, "10.42.0.0/24");
    // A second node that stays healthy: when every node is down, Kubernetes
    // blames the control plane and taints none (see the next test).
    let healthy = keep_node_healthy(c, "node-healthy").await;
    // (Admission adds 300 s tolerations by default; this pod asks for 1 s.)
    let _: Pod = create(c, "default", json!({"metadata": {"name": "victim", "labels": {"app": "victim"}},
        "spec": {"containers": [{"name": "c", "image": "busybox"}],
            "tolerations": [{"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 1},
                            {"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 1}]}})).await;
    // node-0 never had a Lease: once the grace period passes it is Unknown.
    eventually("the unreachable taint", 20, || async {
        let n = nodes.get("node-0").await.ok()?;
        n.spec?
            .taints?
            .iter()
            .any(|t| t.key == "node.kubernetes.io/unreachable" && t.effect == "NoExecute")
            .then_some(())
    })
    .await;
    eventually("the pod evicted", 20, || async {
        pods(c, "default", "app=victim")
            .await
            .is_empty()
            .then_some(())
    })
    .await;
    let n = nodes.get("node-0").await.unwrap();
    let ready = n
        .status
        .unwrap()
        .conditions
        .unwrap()
        .into_iter()
        .find(|c| c.type_ == "Ready")
        .unwrap();
    assert_eq!(
        (ready.status.as_str(), ready.reason.as_deref()),
        ("Unknown", Some("NodeStatusNeverUpdated"))
    );
    // The node renews its Lease again (and reports Ready): the taint goes.
    let renewing = renew_forever(c, "node-0").await;
    eventually("the taint removed", 20, || async {
        let n = nodes.get("node-0").await.ok()?;
        (!n.spec?
            .taints
            .unwrap_or_default()
            .iter()
            .any(|t| t.key == "node.kubernetes.io/unreachable"))
        .then_some(())
    })
    .await;
    renewing.abort();
    healthy.abort();
}

/// One simulated node, and a node monitor grace period of 1 s.
async fn start_one_node_short_grace() -> Harness {
    let opts = skiff_controllers::Options {
        node_monitor_grace_period: Duration::from_secs(1),
        ..Default::default()
    };
    start_with(opts, 1).await
}

/// Creates node `name`, then keeps it healthy ([`renew_forever`]).
async fn keep_node_healthy(c: &kube::Client, name: &str) -> tokio::task::JoinHandle<()> {
    let node: Node = serde_json::from_value(json!({"metadata": {"name": name}})).unwrap();
    Api::<Node>::all(c.clone())
        .create(&PostParams::default(), &node)
        .await
        .unwrap();
    renew_forever(c, name).await
}

/// Reports node `name` Ready and renews its Lease every 200 ms until the
/// returned task is aborted.
async fn renew_forever(c: &kube::Client, name: &str) -> tokio::task::JoinHandle<()> {
    Api::<Node>::all(c.clone())
        .patch_status(name, &PatchParams::default(), &Patch::Merge(&json!({"status": {"conditions": [
            {"type": "Ready", "status": "True", "reason": "KubeletReady", "lastHeartbeatTime": k8s_openapi::jiff::Timestamp::now().to_string()}]}})))
        .await
        .unwrap();
    let leases =
        Api::<k8s_openapi::api::coordination::v1::Lease>::namespaced(c.clone(), "kube-node-lease");
    let name = name.to_string();
    tokio::spawn(async move {
        loop {
            let body = json!({"metadata": {"name": name}, "spec": {"holderIdentity": name, "leaseDurationSeconds": 40,
                "renewTime": k8s_openapi::jiff::Timestamp::now().to_string()}});
            if leases
                .patch(&name, &PatchParams::default(), &Patch::Merge(&body))
                .await
                .is_err()
            {
                let _ = leases
                    .create(
                        &PostParams::default(),
                        &serde_json::from_value(body).unwrap(),
                    )
                    .await;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    })
}

#[tokio::test]
async fn when_every_node_is_down_no_node_is_tainted_and_no_pod_evicted() {
    // Kubernetes' "master disruption mode": with no node Ready anywhere the
    // control plane is the likelier culprit, so nothing is evicted.
    let h = start_one_node_short_grace().await;
    let c = &h.client;
    let nodes = Api::<Node>::all(c.clone());
    let _: Pod = create(c, "default", json!({"metadata": {"name": "survivor", "labels": {"app": "survivor"}},
        "spec": {"containers": [{"name": "c", "image": "busybox"}],
            "tolerations": [{"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 1}]}})).await;
    // The only node goes Unknown (it never had a Lease)…
    eventually("node-0 Unknown", 20, || async {
        let n = nodes.get("node-0").await.ok()?;
        n.status?
            .conditions?
            .iter()
            .any(|c| c.type_ == "Ready" && c.status == "Unknown")
            .then_some(())
    })
    .await;
    // …and stays untainted, its pod kept, well past the pod's tolerance.
    tokio::time::sleep(Duration::from_secs(4)).await;
    let n = nodes.get("node-0").await.unwrap();
    assert!(
        n.spec
            .and_then(|s| s.taints)
            .unwrap_or_default()
            .iter()
            .all(|t| t.key != "node.kubernetes.io/unreachable"),
        "no unreachable taint when every node is down"
    );
    assert_eq!(pods(c, "default", "app=survivor").await.len(), 1);
    // A healthy node appears: node-0 is tainted and its pod evicted.
    let healthy = keep_node_healthy(c, "node-healthy").await;
    eventually(
        "the survivor evicted once another node is Ready",
        30,
        || async {
            pods(c, "default", "app=survivor")
                .await
                .is_empty()
                .then_some(())
        },
    )
    .await;
    healthy.abort();
}
