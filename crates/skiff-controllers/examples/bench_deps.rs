//! B12: declared dependencies (issue 26). In one process: a real API
//! server on a durable embedded store, the real controller manager
//! (deployment, replicaset, endpointslice, dependencies, ...), clients over
//! the in-process router. No nodes: pods stay Pending, which changes
//! nothing of what is measured.
//!
//! Part 1, admission: pod creates with and without a declaration
//! (`skiff.io/depends-on: db:5432, cache`), alternated in blocks over
//! `--rounds`, 32 in flight: pods/s and p50/p99 per mode, with every
//! controller running but the dependencies controller (whose writes per
//! declaring pod are not admission's).
//!
//! Part 2, enforcement at scale: `--workloads` Deployments in a namespace
//! labelled `skiff.io/dependencies=enforce`, each declaring the next one's
//! Service (a chain, no cycle), until every generated NetworkPolicy is
//! there; then a bare pod is given a declaration `--probes` times (and has
//! it removed again): the time from the annotation's write to its
//! generated egress policy reaching a NetworkPolicy watch (what every
//! node's agent watches), and from the removal to its deletion. Last, one
//! node's policy rendering (`skiff_agent::proxy::policy::model::render`)
//! of all those policies over the namespace's pods, 10 of them local.
//!
//! ```sh
//! cargo run --release -p skiff-controllers --example bench_deps -- \
//!     [--workloads 1000] [--pods 2000] [--rounds 3] [--probes 20]
//! ```

#[global_allocator]
static ALLOC: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

use std::collections::BTreeMap;
use std::net::Ipv4Addr;
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Namespace, Pod, Service};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::watcher;
use serde_json::json;
use skiff_agent::proxy::policy::model::{render, PodInfo};

fn arg(name: &str, default: usize) -> usize {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn pct(v: &mut [Duration], p: f64) -> f64 {
    v.sort();
    if v.is_empty() {
        return 0.0;
    }
    let i = ((v.len() as f64 - 1.0) * p).round() as usize;
    v[i].as_secs_f64() * 1000.0
}

async fn creates(api: &Api<Pod>, prefix: &str, n: usize, declare: bool) -> (f64, Vec<Duration>) {
    let start = Instant::now();
    let lat: Vec<Duration> = futures::stream::iter(0..n)
        .map(|i| {
            let api = api.clone();
            let name = format!("{prefix}-{i}");
            async move {
                let mut p = json!({"metadata": {"name": name, "labels": {"bench": "b12"}},
                    "spec": {"containers": [{"name": "c", "image": "busybox", "command": ["sleep", "1"]}]}});
                if declare {
                    p["metadata"]["annotations"] = json!({"skiff.io/depends-on": "db:5432, cache"});
                }
                let pod: Pod = serde_json::from_value(p).expect("a pod");
                let t = Instant::now();
                api.create(&PostParams::default(), &pod).await.expect("create");
                t.elapsed()
            }
        })
        .buffer_unordered(32)
        .collect()
        .await;
    (n as f64 / start.elapsed().as_secs_f64(), lat)
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let workloads = arg("--workloads", 1000);
    let pods = arg("--pods", 2000);
    let rounds = arg("--rounds", 3);
    let probes = arg("--probes", 20);
    let cluster = skiff_kube::testing::TestCluster::start().await?;
    let admin = cluster.client("bench");
    // Part 1 measures admission: every controller but the dependencies
    // one (whose status writes and Events per declaring pod would load
    // the same server); part 2 runs them all.
    let controllers = |list: Vec<String>| {
        let c = cluster.client("kube-controller-manager");
        tokio::spawn(async move {
            let options = skiff_controllers::Options {
                controllers: list,
                ..Default::default()
            };
            if let Err(e) = skiff_controllers::run(c, options).await {
                eprintln!("controller manager: {e}");
            }
        })
    };
    let without_dependencies = controllers(vec!["*".into(), "-dependencies".into()]);
    let ns_api: Api<Namespace> = Api::all(admin.clone());
    for ns in ["adm", "bench"] {
        ns_api
            .create(
                &PostParams::default(),
                &serde_json::from_value(json!({"metadata": {"name": ns}}))?,
            )
            .await?;
    }
    // The namespace's default ServiceAccount (pods wait for it).
    tokio::time::sleep(Duration::from_secs(2)).await;

    println!("B12 part 1 — pod creates, 32 in flight, {pods} per block, {rounds} rounds, in-process API server on a durable embedded store\n");
    println!("| round | mode | pods/s | p50 ms | p99 ms |");
    println!("|---|---|---:|---:|---:|");
    let api: Api<Pod> = Api::namespaced(admin.clone(), "adm");
    let mut rates: BTreeMap<&str, Vec<f64>> = BTreeMap::new();
    for r in 0..rounds {
        for (mode, declare) in [("plain", false), ("declared", true)] {
            let (rate, mut lat) = creates(&api, &format!("{mode}-{r}"), pods, declare).await;
            println!(
                "| {} | {mode} | {rate:.0} | {:.2} | {:.2} |",
                r + 1,
                pct(&mut lat, 0.5),
                pct(&mut lat, 0.99)
            );
            rates.entry(mode).or_default().push(rate);
        }
    }
    let median = |v: &mut Vec<f64>| {
        v.sort_by(|a, b| a.total_cmp(b));
        v[v.len() / 2]
    };
    let plain = median(rates.get_mut("plain").expect("plain"));
    let declared = median(rates.get_mut("declared").expect("declared"));
    println!(
        "\nmedian pods/s: plain {plain:.0}, declared {declared:.0} (declared/plain {:.2})\n",
        declared / plain
    );
    let size = |name: &'static str| {
        let api = api.clone();
        async move {
            api.get(name)
                .await
                .map(|p| serde_json::to_vec(&p).map(|v| v.len()).unwrap_or(0))
                .unwrap_or(0)
        }
    };
    println!(
        "a pod as served: plain {} bytes, declared {} bytes (the label, the token volume with two tokens, its mounts)\n",
        size("plain-0-0").await,
        size("declared-0-0").await
    );

    // Part 2.
    without_dependencies.abort();
    let _ = without_dependencies.await;
    let _all = controllers(vec![]);
    ns_api
        .patch(
            "bench",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"skiff.io/dependencies": "enforce"}}})),
        )
        .await?;
    let svc_api: Api<Service> = Api::namespaced(admin.clone(), "bench");
    let dep_api: Api<Deployment> = Api::namespaced(admin.clone(), "bench");
    let started = Instant::now();
    futures::stream::iter(0..workloads)
        .for_each_concurrent(32, |i| {
            let (svc_api, dep_api) = (svc_api.clone(), dep_api.clone());
            async move {
                let svc: Service = serde_json::from_value(json!({"metadata": {"name": format!("w{i}")},
                    "spec": {"selector": {"app": format!("w{i}")}, "ports": [{"name": "http", "port": 80, "targetPort": 8080}]}}))
                .expect("a service");
                svc_api.create(&PostParams::default(), &svc).await.expect("service");
                let mut template = json!({"metadata": {"labels": {"app": format!("w{i}")}},
                    "spec": {"containers": [{"name": "c", "image": "busybox"}]}});
                if i + 1 < workloads {
                    template["metadata"]["annotations"] = json!({"skiff.io/depends-on": format!("w{}:http", i + 1)});
                }
                let d: Deployment = serde_json::from_value(json!({"metadata": {"name": format!("w{i}")},
                    "spec": {"replicas": 1, "selector": {"matchLabels": {"app": format!("w{i}")}}, "template": template}}))
                .expect("a deployment");
                dep_api.create(&PostParams::default(), &d).await.expect("deployment");
            }
        })
        .await;
    // Baseline, an egress policy per declaring workload, an ingress one per
    // declared Service.
    let want = 1 + 2 * workloads.saturating_sub(1);
    let np_api: Api<NetworkPolicy> = Api::namespaced(admin.clone(), "bench");
    loop {
        let n = np_api.list(&ListParams::default()).await?.items.len();
        if n >= want {
            break;
        }
        if started.elapsed() > Duration::from_secs(600) {
            anyhow::bail!("only {n} of {want} policies after 10 minutes");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    println!(
        "B12 part 2 — {workloads} Deployments in an enforcing namespace: all {want} generated NetworkPolicies {:.1} s after the first create\n",
        started.elapsed().as_secs_f64()
    );

    // A watch of the namespace's policies, as an agent's.
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<(String, bool, Instant)>();
    let watch_api = np_api.clone();
    tokio::spawn(async move {
        let mut s = watcher(watch_api, watcher::Config::default()).boxed();
        while let Some(Ok(ev)) = s.next().await {
            let now = Instant::now();
            match ev {
                watcher::Event::Apply(p) => {
                    let _ = tx.send((p.metadata.name.unwrap_or_default(), true, now));
                }
                watcher::Event::Delete(p) => {
                    let _ = tx.send((p.metadata.name.unwrap_or_default(), false, now));
                }
                _ => {}
            }
        }
    });
    let pod_api: Api<Pod> = Api::namespaced(admin.clone(), "bench");
    let probe: Pod = serde_json::from_value(
        json!({"metadata": {"name": "probe", "labels": {"role": "probe"}},
        "spec": {"containers": [{"name": "c", "image": "busybox"}]}}),
    )?;
    pod_api.create(&PostParams::default(), &probe).await?;
    let mut add = vec![];
    let mut remove = vec![];
    for k in 0..probes {
        let target = format!("w{}", (k * 37) % workloads);
        // Without a port: no workload declares exactly this, so its
        // policy is the probe's own (made and deleted, not shared).
        let decl = target.clone();
        let hash = skiff_helpers::dependencies::label_value(&skiff_helpers::dependencies::parse(
            &decl, "bench",
        )?);
        let name = format!("skiff-deps-{hash}");
        while rx.try_recv().is_ok() {}
        let t = Instant::now();
        pod_api
            .patch(
                "probe",
                &PatchParams::default(),
                &Patch::Merge(json!({"metadata": {"annotations": {"skiff.io/depends-on": decl}}})),
            )
            .await?;
        loop {
            let (n, present, at) = tokio::time::timeout(Duration::from_secs(30), rx.recv())
                .await?
                .ok_or_else(|| anyhow::anyhow!("the watch ended"))?;
            if n == name && present {
                add.push(at - t);
                break;
            }
        }
        let t = Instant::now();
        pod_api
            .patch(
                "probe",
                &PatchParams::default(),
                &Patch::Merge(json!({"metadata": {"annotations": {"skiff.io/depends-on": null}}})),
            )
            .await?;
        loop {
            let (n, present, at) = tokio::time::timeout(Duration::from_secs(30), rx.recv())
                .await?
                .ok_or_else(|| anyhow::anyhow!("the watch ended"))?;
            if n == name && !present {
                remove.push(at - t);
                break;
            }
        }
    }
    println!("| change | n | p50 ms | p99 ms | max ms |");
    println!("|---|---:|---:|---:|---:|");
    for (what, v) in [
        ("declaration added → its egress policy watched", &mut add),
        (
            "declaration removed → its policy's deletion watched",
            &mut remove,
        ),
    ] {
        let max = v.iter().max().copied().unwrap_or_default().as_secs_f64() * 1000.0;
        println!(
            "| {what} | {} | {:.1} | {:.1} | {max:.1} |",
            v.len(),
            pct(v, 0.5),
            pct(v, 0.99)
        );
    }

    // One node's rendering of every policy over the namespace's pods.
    let all_pods = pod_api.list(&ListParams::default()).await?.items;
    let infos: Vec<PodInfo> = all_pods
        .iter()
        .enumerate()
        .map(|(i, p)| PodInfo {
            namespace: "bench".into(),
            name: p.metadata.name.clone().unwrap_or_default(),
            ip: Ipv4Addr::new(10, 42, (i / 250) as u8, (i % 250 + 1) as u8),
            labels: p.metadata.labels.clone().unwrap_or_default(),
            ports: vec![],
            local: i % (all_pods.len() / 10).max(1) == 0,
        })
        .collect();
    let namespaces = BTreeMap::from([(
        "bench".to_string(),
        BTreeMap::from([
            (
                "kubernetes.io/metadata.name".to_string(),
                "bench".to_string(),
            ),
            ("skiff.io/dependencies".to_string(), "enforce".to_string()),
        ]),
    )]);
    let policies = np_api.list(&ListParams::default()).await?.items;
    let mut renders = vec![];
    let mut chains = 0;
    for _ in 0..20 {
        let t = Instant::now();
        let r = render(&infos, &namespaces, &policies, &[]);
        renders.push(t.elapsed());
        chains = r.rules.chains.len();
    }
    println!(
        "\none node's policy rendering: {} policies over {} pods ({} local, {chains} chains): p50 {:.1} ms, max {:.1} ms (of 20)",
        policies.len(),
        infos.len(),
        infos.iter().filter(|p| p.local).count(),
        pct(&mut renders, 0.5),
        pct(&mut renders, 1.0)
    );
    Ok(())
}
