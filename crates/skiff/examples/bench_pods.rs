//! Benchmark B4: pod start-up latency on a real node, beside the raw CRI
//! floor on the same containerd.
//!
//! `sudo cargo run --release -p skiff --example bench_pods -- [--pods N]`
//!
//! In this process: an API server on a fresh durable store, the scheduler,
//! and an agent with its own containerd (all in a temp dir). Then:
//! 1. the floor: N times RunPodSandbox + CreateContainer + StartContainer
//!    straight through CRI, one after another;
//! 2. N pods created one after another through the API, each timed from
//!    its create call until a watch shows it Running with its container
//!    running;
//! 3. N pods created at once, each timed the same way.
//!
//! Reports p50/p99 of each and the ratios to the floor.

/// The allocator the `skiff` binary uses, so the benchmark measures it.
#[global_allocator]
static ALLOC: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, PostParams};
use kube::runtime::watcher;
use serde_json::json;
use skiff_agent::runtime::{cri, Runtime};

fn pct(sorted: &[Duration], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    sorted[((sorted.len() as f64 - 1.0) * p).round() as usize].as_secs_f64() * 1000.0
}

fn pod(name: &str) -> Pod {
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "labels": {"bench": "b4"}},
        "spec": {
            "terminationGracePeriodSeconds": 0,
            "containers": [{"name": "c", "image": skiff_agent::image::BUSYBOX_IMAGE,
                "imagePullPolicy": "IfNotPresent", "command": ["sleep", "3600"]}]
        }
    }))
    .unwrap()
}

fn running(p: &Pod) -> bool {
    let Some(s) = p.status.as_ref() else {
        return false;
    };
    s.phase.as_deref() == Some("Running")
        && s.container_statuses
            .as_ref()
            .map(|c| {
                !c.is_empty()
                    && c.iter()
                        .all(|c| c.state.as_ref().and_then(|s| s.running.as_ref()).is_some())
            })
            .unwrap_or(false)
}

async fn floor(
    cri: &skiff_agent::cri::Cri,
    n: usize,
    logs: &std::path::Path,
    at_once: bool,
) -> Vec<Duration> {
    if at_once {
        let futs: Vec<_> = (0..n).map(|i| one_floor(cri, i + 1000, logs)).collect();
        let results = futures::future::join_all(futs).await;
        let mut lat = vec![];
        for (d, id) in results {
            lat.push(d);
            let _ = cri.stop_sandbox(&id).await;
            let _ = cri.remove_sandbox(&id).await;
        }
        return lat;
    }
    let mut lat = vec![];
    let mut sandboxes = vec![];
    for i in 0..n {
        let (d, id) = one_floor(cri, i, logs).await;
        lat.push(d);
        sandboxes.push(id);
    }
    for id in sandboxes {
        let _ = cri.stop_sandbox(&id).await;
        let _ = cri.remove_sandbox(&id).await;
    }
    lat
}

async fn one_floor(
    cri: &skiff_agent::cri::Cri,
    i: usize,
    logs: &std::path::Path,
) -> (Duration, String) {
    {
        let uid = format!("floor-{i}-{}", rand::random::<u32>());
        let sb = cri::PodSandboxConfig {
            metadata: Some(cri::PodSandboxMetadata {
                name: format!("floor-{i}"),
                uid: uid.clone(),
                namespace: "bench".into(),
                attempt: 0,
            }),
            hostname: format!("floor-{i}"),
            log_directory: logs.join(&uid).to_string_lossy().into_owned(),
            labels: [("io.kubernetes.pod.uid".to_string(), uid.clone())]
                .into_iter()
                .collect(),
            linux: Some(cri::LinuxPodSandboxConfig::default()),
            ..Default::default()
        };
        let c = cri::ContainerConfig {
            metadata: Some(cri::ContainerMetadata {
                name: "c".into(),
                attempt: 0,
            }),
            image: Some(cri::ImageSpec {
                image: skiff_agent::image::BUSYBOX_IMAGE.into(),
                ..Default::default()
            }),
            command: vec!["sleep".into(), "3600".into()],
            log_path: "c/0.log".into(),
            labels: [("io.kubernetes.pod.uid".to_string(), uid.clone())]
                .into_iter()
                .collect(),
            linux: Some(cri::LinuxContainerConfig::default()),
            ..Default::default()
        };
        let t = Instant::now();
        let id = cri.run_sandbox(&sb).await.expect("RunPodSandbox");
        let cid = cri
            .create_container(&id, &c, &sb)
            .await
            .expect("CreateContainer");
        cri.start_container(&cid).await.expect("StartContainer");
        (t.elapsed(), id)
    }
}

/// Creates pods named `prefix-i` (all at once or one after another) and
/// returns each one's time from create to observed Running.
async fn through_api(
    client: &kube::Client,
    prefix: &str,
    n: usize,
    at_once: bool,
) -> Vec<Duration> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<(String, Instant)>();
    let w = pods.clone();
    let prefix_owned = prefix.to_string();
    let watch = tokio::spawn(async move {
        let mut s = watcher(w, watcher::Config::default().labels("bench=b4")).boxed();
        while let Some(ev) = s.next().await {
            if let Ok(watcher::Event::Apply(p)) | Ok(watcher::Event::InitApply(p)) = ev {
                if running(&p) {
                    let name = p.metadata.name.clone().unwrap_or_default();
                    if name.starts_with(&prefix_owned) {
                        let _ = tx.send((name, Instant::now()));
                    }
                }
            }
        }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    let mut created: HashMap<String, Instant> = HashMap::new();
    let mut done: HashMap<String, Duration> = HashMap::new();
    let pp = PostParams::default();
    if at_once {
        let t = Instant::now();
        let futs: Vec<_> = (0..n)
            .map(|i| {
                let pods = pods.clone();
                let name = format!("{prefix}-{i}");
                let pp = pp.clone();
                async move { pods.create(&pp, &pod(&name)).await.map(|_| name) }
            })
            .collect();
        for r in futures::future::join_all(futs).await {
            created.insert(r.expect("create pod"), t);
        }
        while done.len() < n {
            let (name, at) = tokio::time::timeout(Duration::from_secs(120), rx.recv())
                .await
                .expect("pods did not start")
                .unwrap();
            if let Some(c) = created.get(&name) {
                done.entry(name).or_insert(at - *c);
            }
        }
    } else {
        for i in 0..n {
            let name = format!("{prefix}-{i}");
            let t = Instant::now();
            pods.create(&pp, &pod(&name)).await.expect("create pod");
            created.insert(name.clone(), t);
            while !done.contains_key(&name) {
                let (got, at) = tokio::time::timeout(Duration::from_secs(60), rx.recv())
                    .await
                    .expect("pod did not start")
                    .unwrap();
                if let Some(c) = created.get(&got) {
                    done.entry(got).or_insert(at - *c);
                }
            }
        }
    }
    watch.abort();
    let mut v: Vec<Duration> = done.into_values().collect();
    v.sort();
    v
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let mut n = 30usize;
    let args: Vec<String> = std::env::args().collect();
    if let Some(i) = args.iter().position(|a| a == "--pods") {
        n = args.get(i + 1).and_then(|v| v.parse().ok()).unwrap_or(30);
    }
    let _ = rustls::crypto::ring::default_provider().install_default();
    let dir = tempfile::Builder::new()
        .prefix("skfb4")
        .tempdir_in("/tmp")?;
    let store = skiff_store::RedbStore::open(&dir.path().join("store.redb"), Default::default())?;
    let store: Arc<dyn skiff_store::Store> = store;
    let api = skiff_apiserver::ApiServer::start(store, Default::default()).await?;
    let sched_client = skiff_kube::in_process(&api, "kube-scheduler");
    tokio::spawn(skiff_scheduler::run(sched_client, Default::default()));
    let ca = {
        let key = rcgen::KeyPair::generate()?;
        let mut p = rcgen::CertificateParams::new(Vec::<String>::new())?;
        p.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        p.self_signed(&key)?.pem()
    };
    let options = skiff_agent::AgentOptions {
        node_name: "bench-node".into(),
        data_dir: dir.path().join("agent"),
        containerd: None,
        node_ip: Some("127.0.0.1".into()),
        port: 0,
        pod_cidr: Some("10.250.0.0/24".into()),
        client_ca_pem: Some(ca),
        labels: Default::default(),
        proxy: None,
        cluster_dns: None,
        cluster_domain: "cluster.local".into(),
        serve_dns: false,
        network: None,
        reclaim: Default::default(),
        eviction: Default::default(),
    };
    let client = skiff_kube::in_process(&api, "node:bench-node");
    let agent_client = client.clone();
    let agent_options = options.clone();
    let agent = tokio::spawn(async move {
        skiff_agent::run(agent_client, agent_options, &|m: &str| {
            eprintln!("agent: {m}")
        })
        .await
    });
    let layout = skiff_agent::containerd::Layout::new(&options.data_dir);
    let t = Instant::now();
    while !layout.socket().exists() && t.elapsed() < Duration::from_secs(30) {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    let archive = skiff_agent::image::busybox_archive(
        std::path::Path::new("/bin/busybox"),
        skiff_agent::image::BUSYBOX_IMAGE,
    )?;
    skiff_agent::image::import_bytes(
        &layout.socket(),
        &dir.path().join("tmp"),
        "bb.tar",
        &archive,
    )?;
    let cri = skiff_agent::cri::Cri::connect(&layout.socket()).await?;
    // Warm up: one pod through the API so the image is unpacked and the
    // network is set up.
    through_api(&client, "warm", 1, false).await;

    let logs = dir.path().join("floor-logs");
    std::fs::create_dir_all(&logs)?;
    let mut f = floor(&cri, n, &logs, false).await;
    f.sort();
    let mut fpar = floor(&cri, n, &logs, true).await;
    fpar.sort();
    let seq = through_api(&client, "seq", n, false).await;
    let par = through_api(&client, "par", n, true).await;
    println!("| run | pods | p50 ms | p99 ms | p50 / floor | p99 / floor |");
    println!("| --- | ---: | ---: | ---: | ---: | ---: |");
    for (name, v, floor) in [
        ("raw CRI floor, one after another", &f, &f),
        ("skiff, one after another", &seq, &f),
        ("raw CRI floor, all at once", &fpar, &fpar),
        ("skiff, all at once", &par, &fpar),
    ] {
        let (p50, p99) = (pct(v, 0.5), pct(v, 0.99));
        println!(
            "| {name} | {} | {p50:.0} | {p99:.0} | {:.2} | {:.2} |",
            v.len(),
            p50 / pct(floor, 0.5),
            p99 / pct(floor, 0.99)
        );
    }
    agent.abort();
    // Leave nothing behind: sandboxes, then this benchmark's containerd.
    for sb in cri.list_sandboxes(None).await.unwrap_or_default() {
        let _ = cri.stop_sandbox(&sb.id).await;
        let _ = cri.remove_sandbox(&sb.id).await;
    }
    skiff_agent::containerd::stop(&layout)?;
    skiff_agent::inputs::unmount_all(dir.path());
    let bridge = skiff_agent::bridge_name(&options.data_dir);
    let _ = std::process::Command::new("ip")
        .args(["link", "del", &bridge])
        .output();
    Ok(())
}
