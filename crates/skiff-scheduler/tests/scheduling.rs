//! The scheduler against a real in-process API server: what a user sees
//! (spec.nodeName, events, the PodScheduled condition) for each feature.

use std::future::Future;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Event, Node, Pod};
use k8s_openapi::api::scheduling::v1::PriorityClass;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use serde_json::json;
use skiff_kube::testing::TestCluster;
use skiff_scheduler::testing::{NodeBuilder, PodBuilder};

struct Env {
    _cluster: TestCluster,
    client: kube::Client,
    _task: tokio::task::JoinHandle<anyhow::Result<()>>,
    _dir: tempfile::TempDir,
}

async fn start(config: Option<&str>) -> Env {
    let cluster = TestCluster::start().await.unwrap();
    let client = cluster.client("test");
    let dir = tempfile::tempdir().unwrap();
    let config_file = config.map(|c| {
        let p = dir.path().join("config.yaml");
        std::fs::write(&p, c).unwrap();
        p
    });
    let opts = skiff_scheduler::Options {
        config_file,
        ..Default::default()
    };
    let task = tokio::spawn(skiff_scheduler::run(cluster.client("scheduler"), opts));
    Env {
        _cluster: cluster,
        client,
        _task: task,
        _dir: dir,
    }
}

impl Env {
    async fn node(&self, n: NodeBuilder) {
        let api: Api<Node> = Api::all(self.client.clone());
        api.create(&PostParams::default(), &n.build())
            .await
            .unwrap();
    }
    async fn pod(&self, p: PodBuilder) {
        self.pods()
            .create(&PostParams::default(), &p.for_api().build())
            .await
            .unwrap();
    }
    fn pods(&self) -> Api<Pod> {
        Api::namespaced(self.client.clone(), "default")
    }
    async fn node_of(&self, name: &str) -> Option<String> {
        self.pods()
            .get(name)
            .await
            .ok()
            .and_then(|p| p.spec.and_then(|s| s.node_name))
    }
    /// Waits until the pod is bound; its node.
    async fn bound(&self, name: &str) -> String {
        eventually(Duration::from_secs(10), || async {
            self.node_of(name).await
        })
        .await
        .unwrap_or_else(|| panic!("pod {name} was not scheduled"))
    }
    /// The message of the pod's newest FailedScheduling event, once there is one.
    async fn failed_message(&self, name: &str) -> String {
        eventually(Duration::from_secs(10), || async {
            let evs: Api<Event> = Api::namespaced(self.client.clone(), "default");
            let list = evs.list(&ListParams::default()).await.ok()?;
            list.items
                .into_iter()
                .filter(|e| {
                    e.involved_object.name.as_deref() == Some(name)
                        && e.reason.as_deref() == Some("FailedScheduling")
                })
                .max_by_key(|e| e.metadata.creation_timestamp.clone().map(|t| t.0))
                .and_then(|e| e.message)
        })
        .await
        .unwrap_or_else(|| panic!("no FailedScheduling event for {name}"))
    }
}

async fn eventually<T, F, Fut>(timeout: Duration, mut f: F) -> Option<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let end = tokio::time::Instant::now() + timeout;
    loop {
        if let Some(v) = f().await {
            return Some(v);
        }
        if tokio::time::Instant::now() > end {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn small(name: &str, cpu: &str) -> NodeBuilder {
    NodeBuilder::new(name)
        .label("kubernetes.io/hostname", name)
        .allocatable("cpu", cpu)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_that_fits_is_bound_with_a_scheduled_event_and_one_that_does_not_stays_pending_with_the_reason(
) {
    let env = start(None).await;
    env.node(small("n1", "2")).await;
    env.node(small("n2", "2")).await;
    env.pod(PodBuilder::new("fits").request("cpu", "1500m"))
        .await;
    let node = env.bound("fits").await;
    assert!(node == "n1" || node == "n2");

    let evs: Api<Event> = Api::namespaced(env.client.clone(), "default");
    let scheduled = eventually(Duration::from_secs(5), || async {
        evs.list(&ListParams::default())
            .await
            .ok()?
            .items
            .into_iter()
            .find(|e| e.reason.as_deref() == Some("Scheduled"))
    })
    .await
    .expect("a Scheduled event");
    assert_eq!(
        scheduled.message.as_deref(),
        Some(format!("Successfully assigned default/fits to {node}").as_str())
    );
    assert_eq!(scheduled.type_.as_deref(), Some("Normal"));
    assert_eq!(scheduled.involved_object.kind.as_deref(), Some("Pod"));
    assert_eq!(
        scheduled.source.and_then(|s| s.component).as_deref(),
        Some("default-scheduler")
    );
    let bound = env.pods().get("fits").await.unwrap();
    let cond = bound.status.unwrap().conditions.unwrap();
    assert!(cond
        .iter()
        .any(|c| c.type_ == "PodScheduled" && c.status == "True"));

    env.pod(PodBuilder::new("too-big").request("cpu", "3"))
        .await;
    let msg = env.failed_message("too-big").await;
    assert_eq!(
        msg,
        "0/2 nodes are available: 2 Insufficient cpu. preemption: 0/2 nodes are available: 2 No preemption victims found for incoming pod."
    );
    let cond = eventually(Duration::from_secs(5), || async {
        let p = env.pods().get("too-big").await.ok()?;
        p.status?
            .conditions?
            .into_iter()
            .find(|c| c.type_ == "PodScheduled" && c.status == "False")
    })
    .await
    .expect("PodScheduled=False");
    assert_eq!(cond.reason.as_deref(), Some("Unschedulable"));
    assert_eq!(cond.message.as_deref(), Some(msg.as_str()));
    assert_eq!(env.node_of("too-big").await, None);

    // A bigger node arrives: the pending pod is retried and placed there.
    env.node(small("big", "8")).await;
    assert_eq!(env.bound("too-big").await, "big");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_selector_picks_the_labelled_node() {
    let env = start(None).await;
    env.node(small("hdd", "4").label("disk", "hdd")).await;
    env.node(small("ssd", "4").label("disk", "ssd")).await;
    for i in 0..4 {
        env.pod(PodBuilder::new(&format!("p{i}")).node_selector("disk", "ssd"))
            .await;
    }
    for i in 0..4 {
        assert_eq!(env.bound(&format!("p{i}")).await, "ssd");
    }
    env.pod(PodBuilder::new("nowhere").node_selector("disk", "nvme"))
        .await;
    let msg = env.failed_message("nowhere").await;
    assert!(
        msg.starts_with(
            "0/2 nodes are available: 2 node(s) didn't match Pod's node affinity/selector."
        ),
        "{msg}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn anti_affinity_spreads_replicas_over_hosts_and_affinity_joins_them() {
    let env = start(None).await;
    for n in ["n1", "n2", "n3"] {
        env.node(small(n, "4")).await;
    }
    let anti = json!({"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
        {"labelSelector": {"matchLabels": {"app": "web"}}, "topologyKey": "kubernetes.io/hostname"}]}});
    for i in 0..3 {
        env.pod(
            PodBuilder::new(&format!("web{i}"))
                .label("app", "web")
                .affinity(anti.clone()),
        )
        .await;
    }
    let mut nodes = Vec::new();
    for i in 0..3 {
        nodes.push(env.bound(&format!("web{i}")).await);
    }
    nodes.sort();
    assert_eq!(nodes, vec!["n1", "n2", "n3"]);
    env.pod(
        PodBuilder::new("web3")
            .label("app", "web")
            .affinity(anti.clone()),
    )
    .await;
    let msg = env.failed_message("web3").await;
    // The placed replicas' own anti-affinity is checked first, as in Kubernetes.
    assert!(
        msg.starts_with(
            "0/3 nodes are available: 3 node(s) didn't satisfy existing pods anti-affinity rules."
        ),
        "{msg}"
    );

    let web1_node = env.node_of("web1").await.unwrap();
    env.pod(PodBuilder::new("sidecar").affinity(json!({"podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
        {"labelSelector": {"matchLabels": {"app": "web"}}, "topologyKey": "kubernetes.io/hostname"}]}})))
        .await;
    let n = env.bound("sidecar").await;
    assert!(nodes.contains(&n));
    let _ = web1_node;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn taints_keep_out_pods_that_do_not_tolerate_them() {
    let env = start(None).await;
    env.node(small("tainted", "4").taint("node-role", "x", "NoSchedule"))
        .await;
    env.pod(PodBuilder::new("plain")).await;
    let msg = env.failed_message("plain").await;
    assert_eq!(msg, "0/1 nodes are available: 1 node(s) had untolerated taint {node-role: x}. preemption: 0/1 nodes are available: 1 Preemption is not helpful for scheduling.");
    env.pod(PodBuilder::new("tolerant").toleration("node-role", "Equal", "x", "NoSchedule"))
        .await;
    assert_eq!(env.bound("tolerant").await, "tainted");
    assert_eq!(env.node_of("plain").await, None);
    env.node(small("clean", "4")).await;
    assert_eq!(env.bound("plain").await, "clean");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn topology_spread_balances_pods_over_zones() {
    let env = start(None).await;
    for (n, z) in [("a1", "a"), ("a2", "a"), ("a3", "a"), ("b1", "b")] {
        env.node(small(n, "4").label("topology.kubernetes.io/zone", z))
            .await;
    }
    let spread = json!({"maxSkew": 1, "topologyKey": "topology.kubernetes.io/zone",
        "whenUnsatisfiable": "DoNotSchedule", "labelSelector": {"matchLabels": {"app": "s"}}});
    let mut per_zone = std::collections::HashMap::<char, usize>::new();
    for i in 0..6 {
        let name = format!("s{i}");
        env.pod(
            PodBuilder::new(&name)
                .label("app", "s")
                .spread(spread.clone()),
        )
        .await;
        // One at a time, so each placement sees the previous ones.
        let node = env.bound(&name).await;
        *per_zone.entry(node.chars().next().unwrap()).or_default() += 1;
    }
    assert_eq!(per_zone.get(&'a'), Some(&3));
    assert_eq!(per_zone.get(&'b'), Some(&3));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_pods_cannot_share_a_host_port_on_one_node() {
    let env = start(None).await;
    env.node(small("only", "4")).await;
    env.pod(PodBuilder::new("first").host_port("", "TCP", 8080))
        .await;
    assert_eq!(env.bound("first").await, "only");
    env.pod(PodBuilder::new("second").host_port("", "TCP", 8080))
        .await;
    let msg = env.failed_message("second").await;
    assert!(
        msg.starts_with("0/1 nodes are available: 1 node(s) didn't have free ports for the requested pod ports."),
        "{msg}"
    );
    // Another protocol on the same port is fine.
    env.pod(PodBuilder::new("udp").host_port("", "UDP", 8080))
        .await;
    assert_eq!(env.bound("udp").await, "only");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_higher_priority_pod_preempts_a_lower_priority_one() {
    let env = start(None).await;
    let pcs: Api<PriorityClass> = Api::all(env.client.clone());
    // A pod's preemptionPolicy comes from its PriorityClass (Priority
    // admission refuses a pod that sets another).
    for (name, value, policy) in [
        ("low", 10, "PreemptLowerPriority"),
        ("high", 1000, "PreemptLowerPriority"),
        ("high-polite", 1000, "Never"),
    ] {
        let pc: PriorityClass = serde_json::from_value(json!({
            "apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass",
            "metadata": {"name": name}, "value": value, "preemptionPolicy": policy}))
        .unwrap();
        pcs.create(&PostParams::default(), &pc).await.unwrap();
    }
    env.node(small("n1", "1")).await;
    env.pod(
        PodBuilder::new("victim")
            .priority_class("low")
            .grace_period(0)
            .request("cpu", "800m"),
    )
    .await;
    assert_eq!(env.bound("victim").await, "n1");
    env.pod(
        PodBuilder::new("polite")
            .priority_class("high-polite")
            .request("cpu", "800m"),
    )
    .await;
    let msg = env.failed_message("polite").await;
    assert!(
        msg.ends_with("not eligible due to preemptionPolicy=Never."),
        "{msg}"
    );
    assert!(env.pods().get("victim").await.is_ok());

    env.pod(
        PodBuilder::new("boss")
            .priority_class("high")
            .request("cpu", "800m"),
    )
    .await;
    let nominated = eventually(Duration::from_secs(10), || async {
        let p = env.pods().get("boss").await.ok()?;
        if p.spec.as_ref()?.node_name.is_some() {
            return Some("bound".to_string());
        }
        p.status?.nominated_node_name
    })
    .await;
    assert!(nominated.is_some());
    assert_eq!(env.bound("boss").await, "n1");
    let gone = eventually(Duration::from_secs(5), || async {
        env.pods().get("victim").await.err().map(|_| ())
    })
    .await;
    assert!(gone.is_some(), "the victim was not deleted");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cordoned_node_takes_no_new_pods_until_uncordoned() {
    let env = start(None).await;
    env.node(small("n1", "4").unschedulable(true)).await;
    env.pod(PodBuilder::new("waiting")).await;
    // The pod may be tried before the scheduler has seen the node ("no
    // nodes available"); the node's arrival retries it.
    let want = "0/1 nodes are available: 1 node(s) were unschedulable.";
    let msg = eventually(Duration::from_secs(10), || async {
        let m = env.failed_message("waiting").await;
        m.starts_with(want).then_some(m)
    })
    .await;
    assert!(msg.is_some(), "no FailedScheduling event saying: {want}");
    let nodes: Api<Node> = Api::all(env.client.clone());
    nodes
        .patch(
            "n1",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"unschedulable": null}})),
        )
        .await
        .unwrap();
    assert_eq!(env.bound("waiting").await, "n1");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_profile_binds_only_its_own_pods_and_unknown_scheduler_names_are_left_alone() {
    let config = r#"
apiVersion: kubescheduler.config.k8s.io/v1
kind: KubeSchedulerConfiguration
profiles:
- schedulerName: default-scheduler
- schedulerName: bin-packer
  pluginConfig:
  - name: NodeResourcesFit
    args:
      scoringStrategy:
        type: MostAllocated
"#;
    let env = start(Some(config)).await;
    env.node(small("n1", "4")).await;
    env.node(small("n2", "4")).await;
    env.pod(
        PodBuilder::new("packed-0")
            .scheduler_name("bin-packer")
            .request("cpu", "1"),
    )
    .await;
    let first = env.bound("packed-0").await;
    for i in 1..3 {
        let name = format!("packed-{i}");
        env.pod(
            PodBuilder::new(&name)
                .scheduler_name("bin-packer")
                .request("cpu", "1"),
        )
        .await;
        // MostAllocated keeps filling the same node.
        assert_eq!(env.bound(&name).await, first);
    }
    env.pod(PodBuilder::new("elsewhere").scheduler_name("someone-else"))
        .await;
    env.pod(PodBuilder::new("normal")).await;
    env.bound("normal").await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(env.node_of("elsewhere").await, None);
    let evs: Api<Event> = Api::namespaced(env.client.clone(), "default");
    let about: Vec<_> = evs
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|e| e.involved_object.name.as_deref() == Some("elsewhere"))
        .collect();
    assert!(about.is_empty(), "{about:?}");
    let packed_event = evs
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .find(|e| e.involved_object.name.as_deref() == Some("packed-0"))
        .unwrap();
    assert_eq!(
        packed_event.source.and_then(|s| s.component).as_deref(),
        Some("bin-packer")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pods_go_to_the_node_of_their_bound_local_volume_and_wait_for_missing_claims() {
    use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
    use k8s_openapi::api::storage::v1::StorageClass;
    let env = start(None).await;
    env.node(small("a", "2")).await;
    env.node(small("b", "2")).await;
    let pvs: Api<PersistentVolume> = Api::all(env.client.clone());
    let pvcs: Api<PersistentVolumeClaim> = Api::namespaced(env.client.clone(), "default");
    let local_pv = |name: &str, host: &str| -> PersistentVolume {
        serde_json::from_value(json!({"metadata": {"name": name}, "spec": {
            "capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"],
            "storageClassName": "manual", "hostPath": {"path": "/tmp/x"},
            "nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [
                {"key": "kubernetes.io/hostname", "operator": "In", "values": [host]}]}]}}}}))
        .unwrap()
    };
    let claim = |name: &str, class: &str, volume: Option<&str>| -> PersistentVolumeClaim {
        let mut spec = json!({"storageClassName": class, "accessModes": ["ReadWriteOnce"],
            "resources": {"requests": {"storage": "1Gi"}}});
        if let Some(v) = volume {
            spec["volumeName"] = json!(v);
        }
        serde_json::from_value(json!({"metadata": {"name": name}, "spec": spec})).unwrap()
    };
    let with_claim = |pod: &str, claim: &str| {
        let mut p = PodBuilder::new(pod).for_api().build();
        p.spec.as_mut().unwrap().volumes = Some(vec![serde_json::from_value(
            json!({"name": "data", "persistentVolumeClaim": {"claimName": claim}}),
        )
        .unwrap()]);
        p
    };
    let pp = PostParams::default();

    // A claim bound to a volume on b: the pod goes to b, every time.
    pvs.create(&pp, &local_pv("pv-b", "b")).await.unwrap();
    pvcs.create(&pp, &claim("on-b", "manual", Some("pv-b")))
        .await
        .unwrap();
    for i in 0..3 {
        let name = format!("uses-b-{i}");
        env.pods()
            .create(&pp, &with_claim(&name, "on-b"))
            .await
            .unwrap();
        assert_eq!(env.bound(&name).await, "b");
    }

    // A missing claim: pending with Kubernetes' reason, until it appears.
    env.pods()
        .create(&pp, &with_claim("waits", "later"))
        .await
        .unwrap();
    let msg = env.failed_message("waits").await;
    assert!(
        msg.starts_with(r#"0/2 nodes are available: persistentvolumeclaim "later" not found."#),
        "{msg}"
    );
    pvcs.create(&pp, &claim("later", "manual", Some("pv-b")))
        .await
        .unwrap();
    assert_eq!(env.bound("waits").await, "b");

    // A volume on a node that is not there: no node fits.
    pvs.create(&pp, &local_pv("pv-gone", "gone")).await.unwrap();
    pvcs.create(&pp, &claim("on-gone", "manual", Some("pv-gone")))
        .await
        .unwrap();
    env.pods()
        .create(&pp, &with_claim("stranded", "on-gone"))
        .await
        .unwrap();
    let msg = env.failed_message("stranded").await;
    assert!(
        msg.starts_with("0/2 nodes are available: 2 node(s) had volume node affinity conflict."),
        "{msg}"
    );

    // An unbound claim of an Immediate class is the binder's to bind.
    pvcs.create(&pp, &claim("unbound", "manual", None))
        .await
        .unwrap();
    env.pods()
        .create(&pp, &with_claim("early", "unbound"))
        .await
        .unwrap();
    let msg = env.failed_message("early").await;
    assert!(
        msg.starts_with(
            "0/2 nodes are available: pod has unbound immediate PersistentVolumeClaims."
        ),
        "{msg}"
    );

    // WaitForFirstConsumer with skiff's provisioner: only b publishes local
    // storage; the claim learns the chosen node.
    let sc: StorageClass = serde_json::from_value(json!({"metadata": {"name": "wffc"},
        "provisioner": "skiff.io/local-path", "volumeBindingMode": "WaitForFirstConsumer"}))
    .unwrap();
    Api::<StorageClass>::all(env.client.clone())
        .create(&pp, &sc)
        .await
        .unwrap();
    pvcs.create(&pp, &claim("late", "wffc", None))
        .await
        .unwrap();
    env.pods()
        .create(&pp, &with_claim("first", "late"))
        .await
        .unwrap();
    let msg = env.failed_message("first").await;
    assert!(
        msg.starts_with("0/2 nodes are available: 2 node(s) did not have enough free storage."),
        "{msg}"
    );
    // b's agent publishes its storage directory: the pod is retried.
    let nodes: Api<Node> = Api::all(env.client.clone());
    nodes
        .patch(
            "b",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"annotations": {"skiff.io/local-storage-path": "/var/lib/skiff/storage"}}})),
        )
        .await
        .unwrap();
    assert_eq!(env.bound("first").await, "b");
    let selected = pvcs
        .get("late")
        .await
        .unwrap()
        .metadata
        .annotations
        .unwrap_or_default()
        .get("volume.kubernetes.io/selected-node")
        .cloned();
    assert_eq!(selected.as_deref(), Some("b"));
}

/// The cpu requested on each node by the pods bound to it, and the
/// pods bound, read from the API (the stored bindings).
async fn cpu_by_node(client: &kube::Client) -> (std::collections::BTreeMap<String, i64>, usize) {
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let mut by_node = std::collections::BTreeMap::new();
    let mut bound = 0;
    for p in pods.list(&ListParams::default()).await.unwrap().items {
        let spec = p.spec.unwrap_or_default();
        let Some(node) = spec.node_name.filter(|n| !n.is_empty()) else {
            continue;
        };
        bound += 1;
        let milli: i64 = spec
            .containers
            .iter()
            .filter_map(|c| c.resources.as_ref()?.requests.as_ref()?.get("cpu"))
            .map(|q| skiff_helpers::quantity::milli(&q.0).unwrap())
            .sum();
        *by_node.entry(node).or_default() += milli;
    }
    (by_node, bound)
}

/// Omega's race: two schedulers with separate caches (two profiles, as two
/// teams run them) fill the same nodes as fast as they can, both packing
/// the fullest node. Each sees only its own bindings in flight, so both
/// pick the same free cpu; the API server's commit check refuses the loser
/// (a conflict it counts and retries), and no node is ever overcommitted.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_schedulers_racing_for_the_same_nodes_never_overcommit_one() {
    let cluster = TestCluster::start().await.unwrap();
    let client = cluster.client("test");
    let dir = tempfile::tempdir().unwrap();
    let mut tasks = Vec::new();
    let mut metrics = Vec::new();
    for name in ["red", "blue"] {
        let path = dir.path().join(format!("{name}.yaml"));
        std::fs::write(
            &path,
            format!(
                "apiVersion: kubescheduler.config.k8s.io/v1\nkind: KubeSchedulerConfiguration\nprofiles:\n\
                 - schedulerName: {name}\n  pluginConfig:\n  - name: NodeResourcesFit\n    args:\n      \
                 scoringStrategy:\n        type: MostAllocated\n"
            ),
        )
        .unwrap();
        let m = std::sync::Arc::new(skiff_scheduler::Metrics::default());
        metrics.push(m.clone());
        let opts = skiff_scheduler::Options {
            config_file: Some(path),
            metrics: Some(m),
            ..Default::default()
        };
        tasks.push(tokio::spawn(skiff_scheduler::run(
            cluster.client(&format!("scheduler-{name}")),
            opts,
        )));
    }
    let nodes: Api<Node> = Api::all(client.clone());
    for i in 0..4 {
        nodes
            .create(
                &PostParams::default(),
                &small(&format!("n{i}"), "2").build(),
            )
            .await
            .unwrap();
    }
    // 64 pods of 250m on 8 cpus: room for 32, asked for by both at once.
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let creates = (0..64).map(|i| {
        let pods = pods.clone();
        async move {
            let who = if i % 2 == 0 { "red" } else { "blue" };
            let p = PodBuilder::new(&format!("{who}-{i}"))
                .scheduler_name(who)
                .request("cpu", "250m")
                .for_api()
                .build();
            pods.create(&PostParams::default(), &p).await.unwrap();
        }
    });
    futures::future::join_all(creates).await;
    // Never overcommitted, looked at all along; in the end every cpu used.
    let full = eventually(Duration::from_secs(30), || async {
        let (by_node, bound) = cpu_by_node(&client).await;
        for (node, milli) in &by_node {
            assert!(
                *milli <= 2000,
                "node {node} overcommitted: {milli}m of 2000m bound"
            );
        }
        (bound == 32).then_some(by_node)
    })
    .await
    .expect("32 pods bound");
    assert!(full.values().all(|m| *m == 2000), "{full:?}");
    tokio::time::sleep(Duration::from_millis(500)).await;
    let (by_node, bound) = cpu_by_node(&client).await;
    assert_eq!((bound, by_node), (32, full));
    let conflicts: u64 = metrics
        .iter()
        .map(|m| skiff_scheduler::Metrics::get(&m.bind_conflicts))
        .sum();
    eprintln!("binding conflicts: {conflicts}");
    for t in tasks {
        t.abort();
    }
}

/// Instances of one profile without leader election share its pods: each
/// binds its own share; when one stops, its Lease lapses and the others
/// take its pods over.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn instances_of_one_profile_share_its_pods_and_take_over_a_stopped_one_s() {
    let cluster = TestCluster::start().await.unwrap();
    let client = cluster.client("test");
    let mut tasks = Vec::new();
    let mut metrics = Vec::new();
    for me in ["one", "two"] {
        let m = std::sync::Arc::new(skiff_scheduler::Metrics::default());
        metrics.push(m.clone());
        let opts = skiff_scheduler::Options {
            metrics: Some(m),
            instance: Some(me.to_string()),
            ..Default::default()
        };
        tasks.push(tokio::spawn(skiff_scheduler::run(
            cluster.client(&format!("scheduler-{me}")),
            opts,
        )));
    }
    let nodes: Api<Node> = Api::all(client.clone());
    nodes
        .create(&PostParams::default(), &small("n1", "64").build())
        .await
        .unwrap();
    // Both instances hold their Leases.
    let leases: Api<k8s_openapi::api::coordination::v1::Lease> =
        Api::namespaced(client.clone(), "kube-system");
    eventually(Duration::from_secs(10), || async {
        let l = leases
            .list(&ListParams::default().labels(skiff_scheduler::shard::GROUP_LABEL))
            .await
            .ok()?;
        (l.items.len() == 2).then_some(())
    })
    .await
    .expect("two instance Leases");
    // Let both see each other before the pods come.
    tokio::time::sleep(skiff_scheduler::shard::RENEW * 2).await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let make = |name: String| {
        let pods = pods.clone();
        async move {
            let p = PodBuilder::new(&name)
                .request("cpu", "100m")
                .for_api()
                .build();
            pods.create(&PostParams::default(), &p).await.unwrap();
        }
    };
    futures::future::join_all((0..40).map(|i| make(format!("a-{i}")))).await;
    let scheduled = |m: &skiff_scheduler::Metrics| skiff_scheduler::Metrics::get(&m.scheduled);
    eventually(Duration::from_secs(20), || async {
        (cpu_by_node(&client).await.1 == 40).then_some(())
    })
    .await
    .expect("40 pods bound");
    let (one, two) = (scheduled(&metrics[0]), scheduled(&metrics[1]));
    assert_eq!(one + two, 40, "each pod bound once: {one} + {two}");
    assert!(
        one >= 5 && two >= 5,
        "both instances took a share: {one} and {two}"
    );
    // Instance two stops; its Lease lapses and one takes everything.
    tasks.pop().unwrap().abort();
    futures::future::join_all((0..20).map(|i| make(format!("b-{i}")))).await;
    eventually(
        skiff_scheduler::shard::LEASE + Duration::from_secs(15),
        || async { (cpu_by_node(&client).await.1 == 60).then_some(()) },
    )
    .await
    .expect("the stopped instance's pods bound by the other");
    assert_eq!(scheduled(&metrics[0]), one + 20);
    for t in tasks {
        t.abort();
    }
}
