//! Benchmark B6: many hollow nodes and many pods on one machine.
//!
//! ```sh
//! cargo build --release -p skiff
//! cargo run --release -p skiff --example bench_scale -- \
//!     [--nodes 10000] [--pods 150000] [--replicas 100] [--steady 30] \
//!     [--hollow-nice 10] [--progress 15]
//! ```
//!
//! Starts `skiff server` (embedded durable store), `skiff scheduler`,
//! `skiff controller-manager` (as separate processes, so the server's
//! memory is the API server's, store's and watch cache's alone) and
//! `skiff agent --simulate --nodes N` (hollow nodes: each
//! registers its Node, renews its Lease every 10 s, watches its pods,
//! posts node status every 5 minutes) as child processes of this one, from
//! the `skiff` binary beside this example. Then:
//! 1. waits for every node to be Ready;
//! 2. creates Deployments of `--replicas` pods until `--pods` pods exist,
//!    while a background client times a mutating call (a ConfigMap patch)
//!    and a read (a ConfigMap get) ten times a second each;
//! 3. waits until every Deployment reports all replicas available;
//! 4. samples the server's CPU for `--steady` seconds of steady state;
//! 5. times a LIST of all pods, unpaged and in pages of 500;
//! 6. reports the server's RSS (peak and now) and its memory per stored
//!    pod against the pods' JSON size.
//!
//! The hollow nodes run at a lower CPU priority (`nice`, `--hollow-nice`,
//! 0 to turn off): in a real cluster the kubelets are on other machines and
//! take no CPU from the control plane; here the four processes share the
//! machine's cores, and a simulated kubelet must not delay the server it
//! is measuring. Every `--progress` seconds of the churn a line gives the
//! pods created and available and each process's CPU over the interval.
//!
//! Everything it starts lives in a temp dir and is stopped by PID.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Node};
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::watcher;
use serde_json::json;

fn arg(name: &str, default: usize) -> usize {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// A child process killed (by its PID) when dropped.
struct Proc(Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn skiff_binary() -> PathBuf {
    // target/release/examples/bench_scale → target/release/skiff
    let exe = std::env::current_exe().expect("current exe");
    let bin = exe
        .parent()
        .and_then(Path::parent)
        .map(|d| d.join("skiff"))
        .expect("target dir");
    assert!(
        bin.exists(),
        "{} is missing: run `cargo build --release -p skiff` first",
        bin.display()
    );
    bin
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// (resident KiB, peak resident KiB) of a process.
fn rss_kib(pid: u32) -> (u64, u64) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let field = |name: &str| {
        status
            .lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    };
    (field("VmRSS:"), field("VmHWM:"))
}

/// CPU seconds (user + system) a process has used.
fn cpu_seconds(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // Fields after the command name (which may hold spaces) close with ')'.
    let rest = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or("");
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| f.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    // utime and stime are fields 14 and 15 of stat; 12 and 13 after ')'.
    (ticks(11) + ticks(12)) / 100.0
}

fn pct(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    sorted[((sorted.len() as f64 - 1.0) * p).round() as usize]
}

#[derive(Default)]
struct Latencies {
    mutating: Vec<f64>,
    reads: Vec<f64>,
    errors: usize,
}

/// Times a ConfigMap patch and get ten times a second each until `stop`.
async fn probe(client: kube::Client, stop: Arc<AtomicBool>, out: Arc<Mutex<Latencies>>) {
    let cms: Api<ConfigMap> = Api::namespaced(client, "default");
    let _ = cms
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": "b6-probe"}, "data": {"n": "0"}}))
                .unwrap(),
        )
        .await;
    let mut tick = tokio::time::interval(Duration::from_millis(100));
    let mut n = 0u64;
    while !stop.load(Ordering::Relaxed) {
        tick.tick().await;
        n += 1;
        let t = Instant::now();
        let patched = cms
            .patch(
                "b6-probe",
                &PatchParams::default(),
                &Patch::Merge(json!({"data": {"n": n.to_string()}})),
            )
            .await;
        let m = t.elapsed().as_secs_f64() * 1000.0;
        let t = Instant::now();
        let got = cms.get("b6-probe").await;
        let r = t.elapsed().as_secs_f64() * 1000.0;
        let mut l = out.lock().unwrap();
        match (patched, got) {
            (Ok(_), Ok(_)) => {
                l.mutating.push(m);
                l.reads.push(r);
            }
            _ => l.errors += 1,
        }
    }
}

fn report(label: &str, l: &Latencies) {
    let mut m = l.mutating.clone();
    let mut r = l.reads.clone();
    m.sort_by(f64::total_cmp);
    r.sort_by(f64::total_cmp);
    println!(
        "{label}: mutating p50 {:.1} ms p99 {:.1} ms (n={}); read p50 {:.1} ms p99 {:.1} ms (n={}); errors {}",
        pct(&m, 0.5),
        pct(&m, 0.99),
        m.len(),
        pct(&r, 0.5),
        pct(&r, 0.99),
        r.len(),
        l.errors
    );
}

#[derive(serde::Deserialize)]
struct ListPage {
    #[serde(default)]
    metadata: ListMeta,
    #[serde(default)]
    items: Vec<serde::de::IgnoredAny>,
}

#[derive(serde::Deserialize, Default)]
struct ListMeta {
    #[serde(rename = "continue")]
    continue_: Option<String>,
}

/// GETs `path` and returns (seconds, bytes, items).
async fn timed_list(client: &kube::Client, path: &str) -> anyhow::Result<(f64, usize, usize)> {
    let t = Instant::now();
    let mut bytes = 0;
    let mut items = 0;
    let mut next: Option<String> = None;
    loop {
        let url = match &next {
            Some(c) => format!("{path}&continue={c}"),
            None => path.to_string(),
        };
        let req = http::Request::get(url).body(Vec::new())?;
        let text = client.request_text(req).await?;
        bytes += text.len();
        // Counted without building the items: 150,000 pods as a JSON tree
        // took ~7 GiB in this process (beside the cluster it measures).
        let page: ListPage = serde_json::from_str(&text)?;
        drop(text);
        items += page.items.len();
        match page.metadata.continue_ {
            Some(c) if !c.is_empty() => next = Some(c),
            _ => break,
        }
    }
    Ok((t.elapsed().as_secs_f64(), bytes, items))
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let nodes = arg("--nodes", 10_000);
    let pods = arg("--pods", 150_000);
    let replicas = arg("--replicas", 100).max(1);
    let steady = arg("--steady", 30);
    let hollow_nice = arg("--hollow-nice", 10);
    let progress = arg("--progress", 15).max(1) as u64;
    let deployments = pods.div_ceil(replicas);
    println!(
        "B6: {nodes} hollow nodes, {deployments} Deployments x {replicas} replicas = {} pods",
        deployments * replicas
    );

    let dir = tempfile::tempdir()?;
    let bin = skiff_binary();
    let port = free_port();
    let server = Proc(
        Command::new(&bin)
            .args(["server", "--data-dir"])
            .arg(dir.path().join("data"))
            .args(["--listen", &format!("127.0.0.1:{port}")])
            .args(["--disable-scheduler", "--disable-controllers"])
            .env("RUST_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(dir.path().join("server.log"))?)
            .spawn()?,
    );
    let spid = server.0.id();
    let kubeconfig = dir.path().join("data/admin.kubeconfig");
    let started = Instant::now();
    while !kubeconfig.exists() {
        anyhow::ensure!(
            started.elapsed() < Duration::from_secs(60),
            "the server did not start"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let client = skiff_kube::client_from_kubeconfig(&kubeconfig).await?;
    let (idle_rss, _) = rss_kib(spid);
    println!(
        "server up in {:.1} s, RSS {} MiB",
        started.elapsed().as_secs_f64(),
        idle_rss / 1024
    );

    let component = |args: &[&str], log: &str| -> anyhow::Result<Proc> {
        Ok(Proc(
            Command::new(&bin)
                .args(args)
                .arg("--kubeconfig")
                .arg(&kubeconfig)
                .env("RUST_LOG", "warn")
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(std::fs::File::create(dir.path().join(log))?)
                .spawn()?,
        ))
    };
    // One instance each: no leader election (a server slowed by the load,
    // or by the disk's fsyncs under other work, past the 10 s renew
    // deadline would stop them in the middle of the run, as it stops
    // kube-scheduler).
    let scheduler = component(&["scheduler", "--leader-elect=false"], "scheduler.log")?;
    // A /24 per node for 10,000 nodes needs more than the default /16.
    let controllers = component(
        &[
            "controller-manager",
            "--leader-elect=false",
            "--cluster-cidr",
            "10.0.0.0/8",
        ],
        "controllers.log",
    )?;

    // Hollow nodes, in their own process.
    let t = Instant::now();
    let mut hollow = if hollow_nice > 0 {
        // nice execs the binary: the child's PID is the agent's.
        let mut c = Command::new("nice");
        c.arg("-n").arg(hollow_nice.to_string()).arg(&bin);
        c
    } else {
        Command::new(&bin)
    };
    let agents = Proc(
        hollow
            .args([
                "agent",
                "--simulate",
                // Straight to the server: through the agent's balancer each
                // of 10,000 watch connections takes three descriptors.
                "--api-balancer=false",
                "--nodes",
                &nodes.to_string(),
                "--kubeconfig",
            ])
            .arg(&kubeconfig)
            .env("RUST_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(dir.path().join("agents.log"))?)
            .spawn()?,
    );
    let apid = agents.0.id();
    let node_api: Api<Node> = Api::all(client.clone());
    loop {
        let mut ready = 0;
        let mut lp = ListParams::default().limit(500);
        loop {
            let page = node_api.list_metadata(&lp).await;
            let Ok(page) = page else { break };
            ready += page.items.len();
            match page.metadata.continue_ {
                Some(c) if !c.is_empty() => lp = lp.continue_token(&c),
                _ => break,
            }
        }
        if ready >= nodes {
            break;
        }
        anyhow::ensure!(
            t.elapsed() < Duration::from_secs(1800),
            "only {ready} of {nodes} nodes registered"
        );
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
    let (nodes_rss, _) = rss_kib(spid);
    // The other processes' RSS with the nodes alone, so their growth per
    // pod can be told from what the nodes cost.
    let others = [
        ("scheduler", scheduler.0.id()),
        ("controller manager", controllers.0.id()),
        ("hollow nodes", apid),
    ];
    let others_nodes: Vec<u64> = others.iter().map(|(_, pid)| rss_kib(*pid).0).collect();
    println!(
        "{nodes} nodes registered in {:.1} s; server RSS {} MiB, scheduler {} MiB, controller manager {} MiB, hollow nodes {} MiB",
        t.elapsed().as_secs_f64(),
        nodes_rss / 1024,
        others_nodes[0] / 1024,
        others_nodes[1] / 1024,
        others_nodes[2] / 1024
    );

    // Churn: create the Deployments while probing.
    let stop = Arc::new(AtomicBool::new(false));
    let lat = Arc::new(Mutex::new(Latencies::default()));
    let prober = tokio::spawn(probe(client.clone(), stop.clone(), lat.clone()));
    let deps: Api<Deployment> = Api::namespaced(client.clone(), "default");
    let peak = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let sampler = {
        let peak = peak.clone();
        let stop = stop.clone();
        tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                peak.fetch_max(rss_kib(spid).0, Ordering::Relaxed);
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        })
    };
    let t = Instant::now();
    let cpu0 = cpu_seconds(spid);
    // Pods created (the Deployments' status.replicas) and available, by
    // Deployment, for the progress lines and the end of the churn.
    let counts: Arc<Mutex<std::collections::HashMap<String, (i64, i64)>>> = Default::default();
    let reporter = {
        let counts = counts.clone();
        let stop = stop.clone();
        let pids = [
            ("server", spid),
            ("scheduler", others[0].1),
            ("controllers", others[1].1),
            ("hollow", apid),
        ];
        tokio::spawn(async move {
            let mut last: Vec<f64> = pids.iter().map(|(_, p)| cpu_seconds(*p)).collect();
            let mut at = Instant::now();
            while !stop.load(Ordering::Relaxed) {
                tokio::time::sleep(Duration::from_secs(progress)).await;
                let (created, available) = counts
                    .lock()
                    .unwrap()
                    .values()
                    .fold((0, 0), |(c, a), (dc, da)| (c + dc, a + da));
                let dt = at.elapsed().as_secs_f64();
                at = Instant::now();
                let mut cpu = String::new();
                for (i, (name, pid)) in pids.iter().enumerate() {
                    let now = cpu_seconds(*pid);
                    cpu += &format!(" {name} {:.2}", (now - last[i]) / dt);
                    last[i] = now;
                }
                println!(
                    "  {:.0} s: {created} pods created, {available} available; cores:{cpu}; server RSS {} MiB",
                    t.elapsed().as_secs_f64(),
                    rss_kib(spid).0 / 1024
                );
            }
        })
    };
    futures::stream::iter(0..deployments)
        .for_each_concurrent(4, |i| {
            let deps = deps.clone();
            async move {
                let d: Deployment = serde_json::from_value(json!({
                    "metadata": {"name": format!("b6-{i}")},
                    "spec": {
                        "replicas": replicas,
                        "selector": {"matchLabels": {"app": format!("b6-{i}")}},
                        "template": {
                            "metadata": {"labels": {"app": format!("b6-{i}"), "bench": "b6"}},
                            "spec": {"containers": [{"name": "c", "image": "skiff.local/busybox:1",
                                "resources": {"requests": {"cpu": "1m", "memory": "1Mi"}}}]}
                        }
                    }
                }))
                .unwrap();
                while let Err(e) = deps.create(&PostParams::default(), &d).await {
                    if matches!(&e, kube::Error::Api(s) if s.code == 409) {
                        break;
                    }
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
            }
        })
        .await;
    println!(
        "{deployments} Deployments created in {:.1} s",
        t.elapsed().as_secs_f64()
    );

    // Until every replica is available.
    let want = (deployments * replicas) as i64;
    let mut stream = watcher(deps.clone(), watcher::Config::default()).boxed();
    while let Some(ev) = stream.next().await {
        match ev {
            Ok(watcher::Event::Apply(d)) | Ok(watcher::Event::InitApply(d)) => {
                let s = d.status.unwrap_or_default();
                counts.lock().unwrap().insert(
                    d.metadata.name.unwrap_or_default(),
                    (
                        s.replicas.unwrap_or(0) as i64,
                        s.available_replicas.unwrap_or(0) as i64,
                    ),
                );
            }
            Ok(_) => {}
            Err(e) => eprintln!("deployment watch: {e}"),
        }
        let sum: i64 = counts.lock().unwrap().values().map(|(_, a)| a).sum();
        if sum >= want {
            break;
        }
    }
    drop(stream);
    let churn = t.elapsed().as_secs_f64();
    let churn_cpu = cpu_seconds(spid) - cpu0;
    stop.store(true, Ordering::Relaxed);
    let _ = prober.await;
    let _ = sampler.await;
    reporter.abort();
    println!(
        "{want} pods available {:.1} s after the first create ({:.0} pods/s); server CPU {:.2} cores over the churn",
        churn,
        want as f64 / churn,
        churn_cpu / churn
    );
    report("latency during the churn", &lat.lock().unwrap());

    // Steady state.
    let c0 = cpu_seconds(spid);
    let a0 = cpu_seconds(apid);
    let lat = Arc::new(Mutex::new(Latencies::default()));
    let stop = Arc::new(AtomicBool::new(false));
    let prober = tokio::spawn(probe(client.clone(), stop.clone(), lat.clone()));
    tokio::time::sleep(Duration::from_secs(steady as u64)).await;
    stop.store(true, Ordering::Relaxed);
    let _ = prober.await;
    println!(
        "steady state over {steady} s: server CPU {:.2} cores, hollow nodes' CPU {:.2} cores",
        (cpu_seconds(spid) - c0) / steady as f64,
        (cpu_seconds(apid) - a0) / steady as f64
    );
    report("latency at steady state", &lat.lock().unwrap());
    // Before the LIST below (whose response the allocator keeps): with a
    // steady phase longer than the watch cache's 75 s history window,
    // this is the memory of the live objects alone.
    let (steady_rss, _) = rss_kib(spid);
    println!(
        "server RSS after the steady state: {} MiB ({:.0} bytes per pod above the nodes-only RSS)",
        steady_rss / 1024,
        steady_rss.saturating_sub(nodes_rss) as f64 * 1024.0 / want.max(1) as f64
    );

    // LIST all pods.
    let (secs, bytes, items) = timed_list(&client, "/api/v1/pods?").await?;
    println!(
        "LIST all pods: {items} pods, {:.1} MiB JSON, {:.2} s",
        bytes as f64 / 1048576.0,
        secs
    );
    let (psecs, _, pitems) = timed_list(&client, "/api/v1/pods?limit=500").await?;
    println!(
        "LIST all pods in pages of 500: {pitems} pods, {:.2} s",
        psecs
    );

    let (rss, hwm) = rss_kib(spid);
    let per_pod_json = bytes as f64 / items.max(1) as f64;
    let per_pod_mem = (rss.saturating_sub(nodes_rss)) as f64 * 1024.0 / items.max(1) as f64;
    println!(
        "server RSS now {} MiB, peak {} MiB (sampled peak {} MiB); hollow nodes' RSS {} MiB",
        rss / 1024,
        hwm / 1024,
        peak.load(Ordering::Relaxed) / 1024,
        rss_kib(apid).0 / 1024
    );
    println!(
        "memory per pod: {:.0} bytes of server RSS growth per pod (all its objects: pod, its share of ReplicaSets, caches) vs {:.0} bytes of pod JSON = {:.2}x",
        per_pod_mem,
        per_pod_json,
        per_pod_mem / per_pod_json
    );
    for ((name, pid), before) in others.iter().zip(&others_nodes) {
        let (now, peak) = rss_kib(*pid);
        println!(
            "{name} RSS {} MiB (peak {} MiB): {:.0} bytes per pod above its nodes-only RSS",
            now / 1024,
            peak / 1024,
            now.saturating_sub(*before) as f64 * 1024.0 / want.max(1) as f64
        );
    }
    drop(agents);
    drop(scheduler);
    drop(controllers);
    drop(server);
    Ok(())
}
