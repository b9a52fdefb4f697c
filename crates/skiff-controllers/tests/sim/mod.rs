//! Test support: a real API server (TestCluster), the controller manager
//! in a task that can be killed and restarted, and a node simulator that
//! binds pods round-robin to plain Node objects and reports them Running
//! and Ready through pods/status (annotations change that: `sim/ready:
//! "false"` keeps a pod not ready, `sim/exit: "0"|"1"` makes it succeed or
//! fail), and finishes the deletion of terminating pods.

#![allow(dead_code)]

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube::runtime::watcher;
use kube::ResourceExt;
use serde_json::json;
use skiff_kube::testing::TestCluster;

pub struct Harness {
    pub cluster: TestCluster,
    pub client: kube::Client,
    pub manager: Option<tokio::task::JoinHandle<()>>,
    pub nodes: Option<tokio::task::JoinHandle<()>>,
    /// While false, the simulator leaves new pods Pending (not bound).
    pub running: Arc<AtomicBool>,
}

impl Drop for Harness {
    fn drop(&mut self) {
        if let Some(m) = self.manager.take() {
            m.abort();
        }
        if let Some(n) = self.nodes.take() {
            n.abort();
        }
    }
}

pub async fn start() -> Harness {
    start_with(skiff_controllers::Options::default(), 2).await
}

pub async fn start_with(options: skiff_controllers::Options, nodes: usize) -> Harness {
    let cluster = TestCluster::start().await.expect("test cluster");
    let client = cluster.client("controller-manager");
    let mut h = Harness {
        cluster,
        client: client.clone(),
        manager: None,
        nodes: None,
        running: Arc::new(AtomicBool::new(true)),
    };
    let names: Vec<String> = (0..nodes).map(|i| format!("node-{i}")).collect();
    for n in &names {
        let node: Node = serde_json::from_value(json!({"metadata": {"name": n}})).unwrap();
        Api::<Node>::all(client.clone())
            .create(&PostParams::default(), &node)
            .await
            .expect("node");
    }
    if nodes > 0 {
        h.nodes = Some(tokio::spawn(simulate_nodes(
            h.cluster.client("sim-nodes"),
            names,
            h.running.clone(),
        )));
    }
    h.start_manager(options);
    h
}

impl Harness {
    pub fn start_manager(&mut self, options: skiff_controllers::Options) {
        let c = self.client.clone();
        self.manager = Some(tokio::spawn(async move {
            if let Err(e) = skiff_controllers::run(c, options).await {
                eprintln!("controller manager stopped: {e}");
            }
        }));
    }

    pub async fn kill_manager(&mut self) {
        if let Some(m) = self.manager.take() {
            m.abort();
            let _ = m.await;
        }
    }
}

/// Binds, runs and finishes pods as nodes would.
pub async fn simulate_nodes(client: kube::Client, nodes: Vec<String>, running: Arc<AtomicBool>) {
    let all: Api<Pod> = Api::all(client.clone());
    let next = AtomicU32::new(0);
    let ip = AtomicU32::new(1);
    // Like a node agent, the final delete of a pod is sent once.
    let mut finished: std::collections::HashSet<String> = Default::default();
    let mut stream = watcher(all, watcher::Config::default()).boxed();
    while let Some(ev) = stream.next().await {
        let pods = match ev {
            Ok(watcher::Event::Apply(p)) | Ok(watcher::Event::InitApply(p)) => vec![p],
            _ => continue,
        };
        for p in pods {
            let ns = p.namespace().unwrap_or_default();
            let api: Api<Pod> = Api::namespaced(client.clone(), &ns);
            let name = p.name_any();
            if p.metadata.deletion_timestamp.is_some() {
                if !finished.insert(p.metadata.uid.clone().unwrap_or_default()) {
                    continue;
                }
                let _ = api
                    .delete(
                        &name,
                        &DeleteParams {
                            grace_period_seconds: Some(0),
                            ..Default::default()
                        },
                    )
                    .await;
                continue;
            }
            let node = p.spec.as_ref().and_then(|s| s.node_name.clone());
            let Some(_node) = node else {
                if !running.load(Ordering::SeqCst) {
                    continue;
                }
                // Daemon pods name their node in required affinity.
                let target = skiff_controllers::daemonset::node_of(&p).unwrap_or_else(|| {
                    let i = next.fetch_add(1, Ordering::SeqCst) as usize % nodes.len();
                    nodes[i].clone()
                });
                let binding = json!({"apiVersion": "v1", "kind": "Binding",
                    "metadata": {"name": name, "namespace": ns},
                    "target": {"apiVersion": "v1", "kind": "Node", "name": target}});
                let _ = api
                    .create_subresource::<serde_json::Value, serde_json::Value>(
                        "binding",
                        &name,
                        &PostParams::default(),
                        &binding,
                    )
                    .await;
                continue;
            };
            let phase = p
                .status
                .as_ref()
                .and_then(|s| s.phase.clone())
                .unwrap_or_default();
            let ann = p.annotations();
            let now = k8s_openapi::jiff::Timestamp::now().to_string();
            let ready = ann.get("sim/ready").map(String::as_str) != Some("false");
            let want_phase = match ann.get("sim/exit").map(String::as_str) {
                Some("0") => "Succeeded",
                Some(_) => "Failed",
                None => "Running",
            };
            let has_ip = p.status.as_ref().and_then(|s| s.pod_ip.as_ref()).is_some();
            let ready_now = p
                .status
                .as_ref()
                .and_then(|s| s.conditions.as_ref())
                .map(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
                .unwrap_or(false);
            let want_ready = ready && want_phase == "Running";
            if phase == want_phase && has_ip && ready_now == want_ready {
                continue;
            }
            if phase == "Succeeded" || phase == "Failed" {
                continue;
            }
            let n = ip.fetch_add(1, Ordering::SeqCst);
            let pod_ip = p
                .status
                .as_ref()
                .and_then(|s| s.pod_ip.clone())
                .unwrap_or_else(|| format!("10.42.{}.{}", n / 250, n % 250 + 1));
            let status = json!({"status": {
                "phase": want_phase,
                "podIP": pod_ip,
                "podIPs": [{"ip": pod_ip}],
                "startTime": now,
                "conditions": [
                    {"type": "PodScheduled", "status": "True", "lastTransitionTime": now},
                    {"type": "Initialized", "status": "True", "lastTransitionTime": now},
                    {"type": "ContainersReady", "status": if want_ready {"True"} else {"False"}, "lastTransitionTime": now},
                    {"type": "Ready", "status": if want_ready {"True"} else {"False"}, "lastTransitionTime": now},
                ],
            }});
            let _ = api
                .patch_status(&name, &PatchParams::default(), &Patch::Merge(&status))
                .await;
        }
    }
}

/// Polls `f` every 100 ms until it returns Some, or panics after `secs`.
pub async fn eventually<T, F, Fut>(what: &str, secs: u64, mut f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + Duration::from_secs(secs);
    loop {
        if let Some(v) = f().await {
            return v;
        }
        if tokio::time::Instant::now() > deadline {
            panic!(
                "timed out waiting for {what}; metrics:\n{}",
                skiff_controllers::metrics_text()
                    .lines()
                    .filter(|l| l.contains("total"))
                    .collect::<Vec<_>>()
                    .join("\n")
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

pub async fn pods(client: &kube::Client, ns: &str, selector: &str) -> Vec<Pod> {
    Api::<Pod>::namespaced(client.clone(), ns)
        .list(&kube::api::ListParams::default().labels(selector))
        .await
        .map(|l| l.items)
        .unwrap_or_default()
}

pub fn is_ready(p: &Pod) -> bool {
    p.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .map(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
        .unwrap_or(false)
        && p.metadata.deletion_timestamp.is_none()
}

pub async fn create<K>(client: &kube::Client, ns: &str, v: serde_json::Value) -> K
where
    K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope>
        + Clone
        + serde::de::DeserializeOwned
        + serde::Serialize
        + std::fmt::Debug,
    K::DynamicType: Default,
{
    let obj: K = serde_json::from_value(v).expect("object");
    Api::<K>::namespaced(client.clone(), ns)
        .create(&PostParams::default(), &obj)
        .await
        .expect("create")
}
