//! The agent against a real, private containerd: pods become containers
//! with their own IPs, restart with back-off, probes act, volumes and env
//! values are right inside the container, graceful deletion runs preStop,
//! a restarted agent adopts what runs, and a busy container's CPU and
//! memory show in the runtime's stats and the node's Summary.
//!
//! Needs root, containerd, runc and the CNI plugins (`.ci/run` installs
//! them), and Debian's busybox-static for the test image.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams, PostParams};
use serde_json::json;
use skiff_agent::AgentOptions;
use skiff_kube::testing::TestCluster;

struct Node {
    _cluster: TestCluster,
    client: kube::Client,
    dir: tempfile::TempDir,
    options: AgentOptions,
    agent: Option<tokio::task::JoinHandle<()>>,
}

fn test_ca() -> String {
    let key = rcgen::KeyPair::generate().unwrap();
    let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    params.self_signed(&key).unwrap().pem()
}

/// A distinct /24 per test run so concurrent tests' bridges do not clash.
fn pod_cidr() -> String {
    let n: u32 = rand::random::<u32>() % 200;
    format!("10.{}.{}.0/24", 100 + n % 50, n)
}

impl Node {
    async fn start() -> Node {
        assert!(
            std::path::Path::new("/usr/bin/containerd").exists(),
            "containerd is missing: apt-get install containerd runc containernetworking-plugins (.ci/run does)"
        );
        let _ = rustls::crypto::ring::default_provider().install_default();
        let cluster = TestCluster::start().await.unwrap();
        let client = cluster.client("node:test");
        let dir = tempfile::Builder::new()
            .prefix("skf")
            .tempdir_in("/tmp")
            .unwrap();
        let options = AgentOptions {
            node_name: "test-node".into(),
            data_dir: dir.path().join("agent"),
            containerd: None,
            node_ip: Some("127.0.0.1".into()),
            port: 0,
            pod_cidr: Some(pod_cidr()),
            client_ca_pem: Some(test_ca()),
            labels: Default::default(),
            proxy: None,
            cluster_dns: None,
            cluster_domain: "cluster.local".into(),
            // Concurrent test agents would fight over the DNS address.
            serve_dns: false,
            network: None,
            reclaim: Default::default(),
            // Only kubelet's memory threshold: a test machine's nearly
            // full disk must not put the node under DiskPressure.
            eviction: skiff_agent::pressure::Config {
                thresholds: skiff_agent::pressure::parse_config(
                    Some("memory.available<100Mi"),
                    None,
                    None,
                    None,
                )
                .expect("a memory threshold"),
                ..Default::default()
            },
        };
        let mut node = Node {
            _cluster: cluster,
            client,
            dir,
            options,
            agent: None,
        };
        node.run_agent();
        // The busybox test image, built from Debian's busybox-static.
        let socket = skiff_agent::containerd::Layout::new(&node.options.data_dir).socket();
        let deadline = Instant::now() + Duration::from_secs(30);
        while !socket.exists() && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let archive = skiff_agent::image::busybox_archive(
            std::path::Path::new("/bin/busybox"),
            skiff_agent::image::BUSYBOX_IMAGE,
        )
        .expect("busybox-static is missing: apt-get install busybox-static");
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            match skiff_agent::image::import_bytes(
                &socket,
                &node.dir.path().join("tmp"),
                "busybox.tar",
                &archive,
            ) {
                Ok(()) => break,
                Err(e) if Instant::now() > deadline => panic!("importing busybox: {e}"),
                Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
            }
        }
        node
    }

    fn run_agent(&mut self) {
        let client = self.client.clone();
        let options = self.options.clone();
        self.agent = Some(tokio::spawn(async move {
            if let Err(e) =
                skiff_agent::run(client, options, &|m: &str| eprintln!("agent: {m}")).await
            {
                eprintln!("agent stopped: {e:#}");
            }
        }));
    }

    fn stop_agent(&mut self) {
        if let Some(a) = self.agent.take() {
            a.abort();
        }
    }

    fn pods(&self) -> Api<Pod> {
        Api::namespaced(self.client.clone(), "default")
    }

    async fn create(&self, pod: serde_json::Value) -> Pod {
        let mut pod = pod;
        pod["apiVersion"] = json!("v1");
        pod["kind"] = json!("Pod");
        pod["spec"]["nodeName"] = json!("test-node");
        let p: Pod = serde_json::from_value(pod).unwrap();
        self.pods()
            .create(&PostParams::default(), &p)
            .await
            .unwrap()
    }

    async fn wait_for(&self, name: &str, what: &str, secs: u64, f: impl Fn(&Pod) -> bool) -> Pod {
        let deadline = Instant::now() + Duration::from_secs(secs);
        loop {
            let p = self.pods().get(name).await.unwrap();
            if f(&p) {
                return p;
            }
            if Instant::now() > deadline {
                panic!(
                    "pod {name}: timed out waiting for {what}; status: {}",
                    serde_json::to_string_pretty(&p.status).unwrap()
                );
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        self.stop_agent();
        // Remove every sandbox this test's containerd has, then stop it.
        let layout = skiff_agent::containerd::Layout::new(&self.options.data_dir);
        let socket = layout.socket();
        let handle = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async {
                use skiff_agent::runtime::Runtime;
                if let Ok(cri) = skiff_agent::cri::Cri::connect(&socket).await {
                    for sb in cri.list_sandboxes(None).await.unwrap_or_default() {
                        let _ = cri.stop_sandbox(&sb.id).await;
                        let _ = cri.remove_sandbox(&sb.id).await;
                    }
                }
            });
        });
        let _ = handle.join();
        let _ = skiff_agent::containerd::stop(&layout);
        skiff_agent::inputs::unmount_all(self.dir.path());
        let _ = std::process::Command::new("ip")
            .args(["link", "del", &bridge(&self.options.data_dir)])
            .status();
    }
}

fn bridge(data_dir: &std::path::Path) -> String {
    let conf = std::fs::read_to_string(
        skiff_agent::containerd::Layout::new(data_dir)
            .cni_conf_dir()
            .join("10-skiff.conflist"),
    )
    .unwrap_or_default();
    let v: serde_json::Value = serde_json::from_str(&conf).unwrap_or_default();
    v["plugins"][0]["bridge"]
        .as_str()
        .unwrap_or("none")
        .to_string()
}

fn running(p: &Pod) -> bool {
    p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")
}

fn ready(p: &Pod) -> bool {
    p.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .map(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
        .unwrap_or(false)
}

fn restarts(p: &Pod) -> i32 {
    p.status
        .as_ref()
        .and_then(|s| s.container_statuses.as_ref())
        .and_then(|c| c.first())
        .map(|c| c.restart_count)
        .unwrap_or(0)
}

async fn http_get(ip: &str, port: u16, path: &str) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect((ip, port)).await.unwrap();
    s.write_all(format!("GET {path} HTTP/1.0\r\nHost: {ip}\r\n\r\n").as_bytes())
        .await
        .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).await.unwrap();
    out
}

async fn exec(node: &Node, pod: &Pod, cmd: &[&str]) -> String {
    use skiff_agent::runtime::Runtime;
    let socket = skiff_agent::containerd::Layout::new(&node.options.data_dir).socket();
    let cri = skiff_agent::cri::Cri::connect(&socket).await.unwrap();
    let id = pod
        .status
        .as_ref()
        .unwrap()
        .container_statuses
        .as_ref()
        .unwrap()[0]
        .container_id
        .clone()
        .unwrap()
        .trim_start_matches("containerd://")
        .to_string();
    let (code, out, err) = cri
        .exec_sync(&id, cmd.iter().map(|s| s.to_string()).collect(), 10)
        .await
        .unwrap();
    assert_eq!(code, 0, "{cmd:?}: {}", String::from_utf8_lossy(&err));
    String::from_utf8_lossy(&out).into_owned()
}

const BB: &str = skiff_agent::image::BUSYBOX_IMAGE;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_pod_runs_with_its_own_ip_that_answers_http_and_sees_its_config() {
    let node = Node::start().await;
    let cm = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "web"}, "data": {"index.html": "hello from skiff\n", "color": "blue"}});
    let cms: Api<k8s_openapi::api::core::v1::ConfigMap> =
        Api::namespaced(node.client.clone(), "default");
    cms.create(&PostParams::default(), &serde_json::from_value(cm).unwrap())
        .await
        .unwrap();
    let sec = json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "creds"}, "stringData": {"password": "s3cret"}});
    let secrets: Api<k8s_openapi::api::core::v1::Secret> =
        Api::namespaced(node.client.clone(), "default");
    secrets
        .create(
            &PostParams::default(),
            &serde_json::from_value(sec).unwrap(),
        )
        .await
        .unwrap();
    node.create(json!({
        "metadata": {"name": "web", "labels": {"app": "web"}},
        "spec": {
            "containers": [{
                "name": "httpd", "image": BB, "imagePullPolicy": "IfNotPresent",
                "command": ["httpd", "-f", "-p", "8080", "-h", "/www"],
                "env": [
                    {"name": "COLOR", "valueFrom": {"configMapKeyRef": {"name": "web", "key": "color"}}},
                    {"name": "PASSWORD", "valueFrom": {"secretKeyRef": {"name": "creds", "key": "password"}}},
                    {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
                    {"name": "GREETING", "value": "hi $(POD_NAME)"}
                ],
                "volumeMounts": [{"name": "www", "mountPath": "/www"}, {"name": "creds", "mountPath": "/creds"}],
                "readinessProbe": {"httpGet": {"path": "/index.html", "port": 8080}, "periodSeconds": 1}
            }],
            "volumes": [
                {"name": "www", "configMap": {"name": "web"}},
                {"name": "creds", "secret": {"secretName": "creds"}}
            ]
        }
    })).await;
    let pod = node
        .wait_for("web", "Running and Ready", 90, |p| running(p) && ready(p))
        .await;
    let ip = pod
        .status
        .as_ref()
        .unwrap()
        .pod_ip
        .clone()
        .expect("a pod IP");
    assert_ne!(ip, "127.0.0.1");
    let resp = http_get(&ip, 8080, "/index.html").await;
    assert!(resp.contains("hello from skiff"), "{resp}");
    let env = exec(&node, &pod, &["env"]).await;
    assert!(env.contains("COLOR=blue"), "{env}");
    assert!(env.contains("PASSWORD=s3cret"), "{env}");
    assert!(env.contains("GREETING=hi web"), "{env}");
    assert_eq!(
        exec(&node, &pod, &["cat", "/creds/password"]).await,
        "s3cret"
    );
    // A ConfigMap change reaches the volume of the running pod.
    cms.patch(
        "web",
        &Default::default(),
        &kube::api::Patch::Merge(json!({"data": {"index.html": "changed\n"}})),
    )
    .await
    .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if http_get(&ip, 8080, "/index.html").await.contains("changed") {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the configMap volume never changed"
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    let cs = &pod
        .status
        .as_ref()
        .unwrap()
        .container_statuses
        .as_ref()
        .unwrap()[0];
    assert!(cs
        .container_id
        .as_deref()
        .unwrap_or("")
        .starts_with("containerd://"));
    assert!(cs.ready);
    assert_eq!(
        pod.status.as_ref().unwrap().qos_class.as_deref(),
        Some("BestEffort")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_crashing_container_backs_off_and_a_failing_liveness_probe_restarts() {
    let node = Node::start().await;
    node.create(json!({
        "metadata": {"name": "crash"},
        "spec": {"containers": [{"name": "c", "image": BB, "command": ["sh", "-c", "echo boom; exit 3"]}]}
    })).await;
    node.create(json!({
        "metadata": {"name": "sick"},
        "spec": {"containers": [{
            "name": "c", "image": BB, "command": ["sleep", "3600"],
            "livenessProbe": {"exec": {"command": ["cat", "/nonexistent"]}, "periodSeconds": 1, "failureThreshold": 2}
        }]}
    })).await;
    let p = node
        .wait_for("crash", "CrashLoopBackOff", 90, |p| {
            p.status
                .as_ref()
                .and_then(|s| s.container_statuses.as_ref())
                .and_then(|c| c.first())
                .and_then(|c| c.state.as_ref())
                .and_then(|s| s.waiting.as_ref())
                .map(|w| w.reason.as_deref() == Some("CrashLoopBackOff"))
                .unwrap_or(false)
                && restarts(p) >= 1
        })
        .await;
    let cs = &p
        .status
        .as_ref()
        .unwrap()
        .container_statuses
        .as_ref()
        .unwrap()[0];
    let last = cs.last_state.as_ref().unwrap().terminated.as_ref().unwrap();
    assert_eq!(last.exit_code, 3);
    assert_eq!(last.reason.as_deref(), Some("Error"));
    let msg = cs
        .state
        .as_ref()
        .unwrap()
        .waiting
        .as_ref()
        .unwrap()
        .message
        .clone()
        .unwrap_or_default();
    assert!(
        msg.starts_with("back-off 10s restarting failed container=c pod=crash_default"),
        "{msg}"
    );
    // A liveness restart: the container was killed and runs again, its end
    // reported as the last state, as `kubectl describe pod` shows it.
    let p = node
        .wait_for("sick", "a liveness restart, running again", 60, |p| {
            restarts(p) >= 1 && running(p)
        })
        .await;
    let cs = &p
        .status
        .as_ref()
        .unwrap()
        .container_statuses
        .as_ref()
        .unwrap()[0];
    let ended = cs
        .last_state
        .as_ref()
        .and_then(|s| s.terminated.as_ref())
        .expect("the killed container's end is its lastState");
    assert_ne!(ended.exit_code, 0, "{ended:?}");
    assert!(
        cs.state.as_ref().and_then(|s| s.running.as_ref()).is_some(),
        "{cs:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn graceful_deletion_runs_prestop_and_a_restarted_agent_adopts_running_pods() {
    let mut node = Node::start().await;
    let hostdir = node.dir.path().join("hooks");
    std::fs::create_dir_all(&hostdir).unwrap();
    node.create(json!({
        "metadata": {"name": "keeper"},
        "spec": {"containers": [{"name": "c", "image": BB, "command": ["sleep", "3600"]}]}
    }))
    .await;
    node.create(json!({
        "metadata": {"name": "polite"},
        "spec": {
            "terminationGracePeriodSeconds": 5,
            "containers": [{
                "name": "c", "image": BB, "command": ["sleep", "3600"],
                "lifecycle": {"preStop": {"exec": {"command": ["sh", "-c", "echo bye > /hooks/prestop"]}}},
                "volumeMounts": [{"name": "hooks", "mountPath": "/hooks"}]
            }],
            "volumes": [{"name": "hooks", "hostPath": {"path": hostdir.to_string_lossy()}}]
        }
    })).await;
    let before = node.wait_for("keeper", "Running", 90, running).await;
    node.wait_for("polite", "Running", 90, running).await;
    let id_before = before
        .status
        .as_ref()
        .unwrap()
        .container_statuses
        .as_ref()
        .unwrap()[0]
        .container_id
        .clone();

    // The agent goes away and comes back: the container is adopted, not restarted.
    node.stop_agent();
    tokio::time::sleep(Duration::from_secs(2)).await;
    node.run_agent();
    tokio::time::sleep(Duration::from_secs(4)).await;
    let after = node.wait_for("keeper", "Running", 30, running).await;
    let cs = &after
        .status
        .as_ref()
        .unwrap()
        .container_statuses
        .as_ref()
        .unwrap()[0];
    assert_eq!(cs.container_id, id_before, "the container was replaced");
    assert_eq!(cs.restart_count, 0);

    node.pods()
        .delete("polite", &DeleteParams::default())
        .await
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while node.pods().get_opt("polite").await.unwrap().is_some() {
        assert!(Instant::now() < deadline, "the pod was never removed");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(
        std::fs::read_to_string(hostdir.join("prestop"))
            .unwrap()
            .trim(),
        "bye"
    );
    let _ = Arc::new(PathBuf::new());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_busy_containers_stats_show_its_memory_and_growing_cpu_time() {
    use skiff_agent::runtime::Runtime;
    let node = Node::start().await;
    node.create(json!({
        "metadata": {"name": "busy"},
        "spec": {"containers": [{"name": "spin", "image": BB, "command": ["sh", "-c", "while :; do :; done"]}]}
    }))
    .await;
    let pod = node.wait_for("busy", "Running", 90, running).await;
    let uid = pod.metadata.uid.clone().unwrap();
    let socket = skiff_agent::containerd::Layout::new(&node.options.data_dir).socket();
    let cri = skiff_agent::cri::Cri::connect(&socket).await.unwrap();
    let sample = || async {
        let stats = cri.list_container_stats(Some(&uid)).await.unwrap();
        assert_eq!(stats.len(), 1, "{stats:?}");
        let s = &stats[0];
        let name = s
            .attributes
            .as_ref()
            .unwrap()
            .metadata
            .as_ref()
            .unwrap()
            .name
            .clone();
        assert_eq!(name, "spin");
        let cpu = s.cpu.as_ref().unwrap();
        let mem = s.memory.as_ref().unwrap();
        assert!(cpu.timestamp > 0 && mem.timestamp > 0, "{s:?}");
        (
            cpu.usage_core_nano_seconds
                .as_ref()
                .map(|v| v.value)
                .unwrap_or(0),
            mem.working_set_bytes.as_ref().map(|v| v.value).unwrap_or(0),
        )
    };
    let (cpu1, ws) = sample().await;
    assert!(ws > 0, "working set {ws}");
    tokio::time::sleep(Duration::from_secs(2)).await;
    let (cpu2, _) = sample().await;
    // A busy loop on a shared 2-core machine still gets well over 100 ms in 2 s.
    assert!(cpu2 > cpu1 + 100_000_000, "cpu time {cpu1} -> {cpu2}");

    // The Summary the agent serves: the pod, its container, a rate on the
    // second look.
    let collector = skiff_agent::stats::Collector::new("test-node", node.options.data_dir.clone());
    let first = collector.summary(&cri).await.unwrap();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let s = collector.summary(&cri).await.unwrap();
    assert_eq!(first.pods.len(), 1);
    assert_eq!(s.node.node_name, "test-node");
    let node_cpu = s.node.cpu.as_ref().unwrap();
    assert!(node_cpu.usage_core_nano_seconds.unwrap() > 0);
    assert!(node_cpu.usage_nano_cores.unwrap() > 0, "{node_cpu:?}");
    assert!(s.node.memory.as_ref().unwrap().working_set_bytes.unwrap() > 0);
    let p = &s.pods[0];
    assert_eq!(
        (p.pod_ref.name.as_str(), p.pod_ref.namespace.as_str()),
        ("busy", "default")
    );
    assert_eq!(p.pod_ref.uid, uid);
    assert_eq!(p.containers.len(), 1);
    let c = &p.containers[0];
    assert_eq!(c.name, "spin");
    let cpu = c.cpu.as_ref().unwrap();
    assert!(cpu.usage_core_nano_seconds.unwrap() > cpu2, "{cpu:?}");
    // At least a tenth of a core.
    assert!(cpu.usage_nano_cores.unwrap() > 100_000_000, "{cpu:?}");
    assert!(c.memory.as_ref().unwrap().working_set_bytes.unwrap() > 0);
    let text = skiff_agent::stats::render_resource_metrics(&s, false);
    assert!(
        text.contains("container_cpu_usage_seconds_total{container=\"spin\",namespace=\"default\",pod=\"busy\"} "),
        "{text}"
    );
}
