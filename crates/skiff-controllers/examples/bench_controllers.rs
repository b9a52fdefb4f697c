//! B8: 1,000 Deployments × 10 replicas. How long until all 10,000 pods
//! are Running, and how many pods per second the controllers sustain.
//!
//! The API server is real (in this process, on a durable redb store in a
//! temporary directory). By default nodes are simulated in-process: N plain
//! Node objects; a simulator binds each new pod round-robin through
//! pods/binding and reports it Running and Ready through pods/status (no
//! scheduler, no agent). With `--hollow`, the real scheduler
//! (`skiff_scheduler::run`) and N real hollow nodes (`skiff_agent::hollow`,
//! each with its own Node, Lease, pod watch and simulated runtime) run in
//! the same process instead, so the whole path is measured. Usage:
//!   cargo run --release -p skiff-controllers --example bench_controllers \
//!     [-- --deployments 1000 --replicas 10 --nodes 100 --hollow \
//!         --workers 8 --controllers a,-b]

/// The allocator the `skiff` binary uses, so the benchmark measures it.
#[global_allocator]
static ALLOC: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::runtime::watcher;
use kube::ResourceExt;
use serde_json::json;

fn arg(name: &str, default: usize) -> usize {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let deployments = arg("--deployments", 1000);
    let replicas = arg("--replicas", 10);
    let nodes = arg("--nodes", 100).max(1);
    let total = deployments * replicas;
    let hollow = std::env::args().any(|a| a == "--hollow");
    println!("B8: {deployments} Deployments x {replicas} replicas = {total} pods on {nodes} simulated nodes");
    if hollow {
        println!("nodes: {nodes} hollow nodes (skiff_agent::hollow: Node, Lease, pod watch, simulated runtime), the real scheduler, all in this process over in-process clients");
    } else {
        println!("nodes: plain Node objects; pods bound round-robin via pods/binding and marked Running+Ready via pods/status by an in-process simulator (no scheduler, no agent)");
    }

    let etcd = if std::env::args().any(|a| a == "--etcd") {
        println!("store: a single-member etcd on loopback");
        Some(skiff_store::testsuite::EtcdServer::start().await)
    } else {
        println!("store: embedded (redb, durable)");
        None
    };
    let cluster = match &etcd {
        Some(e) => skiff_kube::testing::TestCluster::on_store(e.store().await).await?,
        None => skiff_kube::testing::TestCluster::start().await?,
    };
    let admin = cluster.client("bench");
    let node_api: Api<Node> = Api::all(admin.clone());
    let names: Vec<String> = (0..nodes).map(|i| format!("hollow-{i}")).collect();
    let mut side_tasks = tokio::task::JoinSet::new();
    if hollow {
        let options = skiff_agent::hollow::HollowOptions {
            nodes: nodes as u32,
            prefix: "hollow".into(),
            ..Default::default()
        };
        let client = cluster.client("hollow-nodes");
        side_tasks.spawn(async move {
            if let Err(e) = skiff_agent::hollow::run(client, options).await {
                eprintln!("hollow nodes: {e}");
            }
        });
        let client = cluster.client("kube-scheduler");
        side_tasks.spawn(async move {
            if let Err(e) = skiff_scheduler::run(client, Default::default()).await {
                eprintln!("scheduler: {e}");
            }
        });
        // Until every node has registered and reports Ready.
        let t = Instant::now();
        loop {
            let ready = node_api
                .list(&Default::default())
                .await?
                .items
                .iter()
                .filter(|n| {
                    n.status
                        .as_ref()
                        .and_then(|s| s.conditions.as_ref())
                        .map(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
                        .unwrap_or(false)
                })
                .count();
            if ready >= nodes {
                break;
            }
            anyhow::ensure!(
                t.elapsed() < Duration::from_secs(60),
                "only {ready} of {nodes} nodes Ready after 60 s"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        println!(
            "{nodes} hollow nodes Ready after {:.2} s",
            t.elapsed().as_secs_f64()
        );
    } else {
        for n in &names {
            let node: Node = serde_json::from_value(json!({"metadata": {"name": n},
                "status": {"conditions": [{"type": "Ready", "status": "True"}]}}))?;
            node_api.create(&PostParams::default(), &node).await?;
        }
    }

    // The node simulator.
    let sim_client = cluster.client("hollow-nodes");
    let running = Arc::new(AtomicUsize::new(0));
    let t0 = Instant::now();
    {
        let running = running.clone();
        let names = names.clone();
        tokio::spawn(async move {
            let sem = Arc::new(tokio::sync::Semaphore::new(128));
            let next = Arc::new(AtomicUsize::new(0));
            // Pods handed to a worker, and pods seen Running and Ready.
            let mut started: std::collections::HashSet<String> = Default::default();
            let mut seen_running: std::collections::HashSet<String> = Default::default();
            let mut stream = watcher(
                Api::<Pod>::all(sim_client.clone()),
                watcher::Config::default(),
            )
            .boxed();
            while let Some(ev) = stream.next().await {
                let p = match ev {
                    Ok(watcher::Event::Apply(p)) | Ok(watcher::Event::InitApply(p)) => p,
                    _ => continue,
                };
                let phase = p
                    .status
                    .as_ref()
                    .and_then(|s| s.phase.clone())
                    .unwrap_or_default();
                let uid = p.metadata.uid.clone().unwrap_or_default();
                if phase == "Running" {
                    if seen_running.insert(uid) {
                        running.store(seen_running.len(), Ordering::Relaxed);
                    }
                    continue;
                }
                // With hollow nodes, the scheduler and the nodes do the rest.
                if hollow || p.metadata.deletion_timestamp.is_some() || !started.insert(uid) {
                    continue;
                }
                let permit = sem.clone().acquire_owned().await;
                let client = sim_client.clone();
                let names = names.clone();
                let next = next.clone();
                tokio::spawn(async move {
                    let _permit = permit;
                    let ns = p.namespace().unwrap_or_default();
                    let name = p.name_any();
                    let api: Api<Pod> = Api::namespaced(client, &ns);
                    if p.spec.as_ref().and_then(|s| s.node_name.as_ref()).is_none() {
                        let n = &names[next.fetch_add(1, Ordering::Relaxed) % names.len()];
                        let binding = json!({"apiVersion": "v1", "kind": "Binding",
                            "metadata": {"name": name, "namespace": ns},
                            "target": {"apiVersion": "v1", "kind": "Node", "name": n}});
                        if api
                            .create_subresource::<serde_json::Value, serde_json::Value>(
                                "binding",
                                &name,
                                &PostParams::default(),
                                &binding,
                            )
                            .await
                            .is_err()
                        {
                            return;
                        }
                    }
                    let now = k8s_openapi::jiff::Timestamp::now().to_string();
                    let i = next.load(Ordering::Relaxed);
                    let ip = format!("10.{}.{}.{}", 42 + i / 65000, (i / 250) % 256, i % 250 + 1);
                    let status = json!({"status": {"phase": "Running", "podIP": ip, "podIPs": [{"ip": ip}], "startTime": now,
                        "conditions": [
                            {"type": "PodScheduled", "status": "True", "lastTransitionTime": now},
                            {"type": "Initialized", "status": "True", "lastTransitionTime": now},
                            {"type": "ContainersReady", "status": "True", "lastTransitionTime": now},
                            {"type": "Ready", "status": "True", "lastTransitionTime": now}]}});
                    if let Err(e) = api
                        .patch_status(&name, &PatchParams::default(), &Patch::Merge(&status))
                        .await
                    {
                        eprintln!("status of {name}: {e}");
                    }
                });
            }
        });
    }

    // The controller manager.
    let cm_client = cluster.client("kube-controller-manager");
    // `--controllers a,-b` as kube-controller-manager's flag.
    let args: Vec<String> = std::env::args().collect();
    let controllers: Vec<String> = args
        .iter()
        .position(|a| a == "--controllers")
        .and_then(|i| args.get(i + 1))
        .map(|v| v.split(',').map(String::from).collect())
        .unwrap_or_default();
    let mut options = skiff_controllers::Options {
        controllers,
        ..Default::default()
    };
    options.workers = arg("--workers", options.workers);
    let cm = tokio::spawn(async move {
        if let Err(e) = skiff_controllers::run(cm_client, options).await {
            eprintln!("controller manager: {e}");
        }
    });
    tokio::time::sleep(Duration::from_millis(500)).await;

    // The Deployments, 32 creations in flight.
    let started = Instant::now();
    let dep_api: Api<Deployment> = Api::namespaced(admin.clone(), "default");
    futures::stream::iter(0..deployments)
        .for_each_concurrent(32, |i| {
            let dep_api = dep_api.clone();
            async move {
                let d: Deployment = serde_json::from_value(json!({
                    "metadata": {"name": format!("bench-{i}")},
                    "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": format!("bench-{i}")}},
                        "template": {"metadata": {"labels": {"app": format!("bench-{i}")}},
                            "spec": {"containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10"}]}}}
                }))
                .expect("deployment");
                if let Err(e) = dep_api.create(&PostParams::default(), &d).await {
                    eprintln!("creating bench-{i}: {e}");
                }
            }
        })
        .await;
    let created_in = started.elapsed();
    println!(
        "{deployments} Deployments created in {:.2} s",
        created_in.as_secs_f64()
    );

    // Progress until every pod runs.
    let mut last = 0;
    let mut last_t = Instant::now();
    let mut peak = 0.0f64;
    let deadline = Instant::now() + Duration::from_secs(600);
    loop {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let n = running.load(Ordering::Relaxed);
        let rate = (n - last) as f64 / last_t.elapsed().as_secs_f64();
        peak = peak.max(rate);
        let m = skiff_controllers::metrics_text();
        let depth = |c: &str| {
            m.lines()
                .find(|l| {
                    l.starts_with("skiff_controller_queue_depth") && l.contains(&format!("\"{c}\""))
                })
                .and_then(|l| l.rsplit(' ').next())
                .unwrap_or("-")
                .to_string()
        };
        println!(
            "  t={:>6.1}s running={n:>6} ({rate:>6.0} pods/s) queue rs={} deploy={}",
            started.elapsed().as_secs_f64(),
            depth("replicaset"),
            depth("deployment")
        );
        last = n;
        last_t = Instant::now();
        if n >= total || Instant::now() > deadline {
            break;
        }
    }
    let all_running = started.elapsed();
    let n = running.load(Ordering::Relaxed);
    // And until every Deployment reports its rollout complete.
    let mut complete = 0;
    while Instant::now() < deadline {
        let list = dep_api.list(&Default::default()).await?;
        complete = list
            .items
            .iter()
            .filter(|d| {
                let s = d.status.clone().unwrap_or_default();
                s.available_replicas == Some(replicas as i32)
                    && s.updated_replicas == Some(replicas as i32)
                    && s.conditions
                        .iter()
                        .flatten()
                        .any(|c| c.reason.as_deref() == Some("NewReplicaSetAvailable"))
            })
            .count();
        if complete == deployments {
            break;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let all_available = started.elapsed();
    println!();
    println!("pods Running:            {n} / {total}");
    println!(
        "time to all Running:     {:.2} s",
        all_running.as_secs_f64()
    );
    println!(
        "sustained:               {:.0} pods/s (peak {:.0} pods/s over 1 s)",
        n as f64 / all_running.as_secs_f64(),
        peak
    );
    println!(
        "Deployments complete:    {complete} / {deployments} after {:.2} s ({:.1} Deployments/s)",
        all_available.as_secs_f64(),
        complete as f64 / all_available.as_secs_f64()
    );
    let listed = Api::<Pod>::namespaced(admin.clone(), "default")
        .list(&Default::default())
        .await?
        .items
        .len();
    println!("pods in the API:         {listed} (exactly {total} expected: nothing created twice)");
    let m = skiff_controllers::metrics_text();
    for l in m.lines().filter(|l| {
        l.starts_with("skiff_controller_reconciles_total")
            || l.starts_with("skiff_controller_reconcile_errors_total")
            || l.starts_with("skiff_controller_reconcile_duration_seconds_sum")
            || l.starts_with("skiff_controller_events")
    }) {
        println!("  {l}");
    }
    let _ = t0;
    cm.abort();
    side_tasks.abort_all();
    Ok(())
}
