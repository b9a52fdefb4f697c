//! B1: kube-scheduler's SchedulingBasic (5,000 nodes, 1,000 pods bound
//! first, then 10,000 measured) through the in-process API server on a
//! durable redb store, plus two more workloads:
//!
//! ```sh
//! cargo run --release -p skiff-scheduler --example bench_scheduler
//! cargo run --release -p skiff-scheduler --example bench_scheduler -- --workload anti-affinity
//! cargo run --release -p skiff-scheduler --example bench_scheduler -- --workload topology-spread
//! ```
//!
//! Options: `--nodes N --init-pods N --pods N --creators N`,
//! `--existing-pods N` (that many pods already bound, spread over the
//! nodes, created before the scheduler starts), `--etcd` (the
//! API server on a single-member etcd the benchmark starts on loopback
//! instead of the embedded store), and `--authz`:
//! the pod creators and the scheduler act as ordinary users
//! (`bench-creator`, `system:kube-scheduler`) whose rights come from RBAC
//! bindings, so every request of the measured path is authorized by RBAC
//! instead of passing as `system:masters`; `--schedulers N`: N instances
//! of the default profile sharing its pods without leader election (each
//! with its own cache; the API server's commit check settles their races;
//! the conflicts are reported); `--no-commit-check`: the API server binds
//! as Kubernetes does, without checking the node's committed state.

/// The allocator the `skiff` binary uses, so the benchmark measures it.
#[global_allocator]
static ALLOC: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use futures::StreamExt;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, PostParams};
use serde_json::json;
use skiff_scheduler::testing::{NodeBuilder, PodBuilder};
use skiff_scheduler::Metrics;
use skiff_store::{KeyValue, ListOptions, ListResult, Store, WatchStream};

/// The store, timed: how long requests spend inside it.
struct TimedStore {
    inner: Arc<dyn Store>,
    write_ns: AtomicU64,
    writes: AtomicU64,
    read_ns: AtomicU64,
    reads: AtomicU64,
}

impl TimedStore {
    fn write(&self, t: Instant) {
        self.write_ns
            .fetch_add(t.elapsed().as_nanos() as u64, Relaxed);
        self.writes.fetch_add(1, Relaxed);
    }
    fn read(&self, t: Instant) {
        self.read_ns
            .fetch_add(t.elapsed().as_nanos() as u64, Relaxed);
        self.reads.fetch_add(1, Relaxed);
    }
}

#[async_trait]
impl Store for TimedStore {
    async fn get(&self, key: &str) -> skiff_store::Result<Option<KeyValue>> {
        let t = Instant::now();
        let r = self.inner.get(key).await;
        self.read(t);
        r
    }
    async fn list(&self, prefix: &str, opts: ListOptions) -> skiff_store::Result<ListResult> {
        let t = Instant::now();
        let r = self.inner.list(prefix, opts).await;
        self.read(t);
        r
    }
    async fn count(&self, prefix: &str) -> skiff_store::Result<i64> {
        self.inner.count(prefix).await
    }
    async fn create(&self, key: &str, value: bytes::Bytes) -> skiff_store::Result<KeyValue> {
        let t = Instant::now();
        let r = self.inner.create(key, value).await;
        self.write(t);
        r
    }
    async fn update(
        &self,
        key: &str,
        value: bytes::Bytes,
        rev: i64,
    ) -> skiff_store::Result<KeyValue> {
        let t = Instant::now();
        let r = self.inner.update(key, value, rev).await;
        self.write(t);
        r
    }
    async fn commit(&self, writes: Vec<skiff_store::Write>) -> skiff_store::Result<Vec<KeyValue>> {
        let t = Instant::now();
        let r = self.inner.commit(writes).await;
        self.write(t);
        r
    }
    async fn delete(&self, key: &str, rev: Option<i64>) -> skiff_store::Result<(KeyValue, i64)> {
        let t = Instant::now();
        let r = self.inner.delete(key, rev).await;
        self.write(t);
        r
    }
    async fn watch(
        &self,
        prefix: &str,
        after: i64,
        progress: Option<Duration>,
    ) -> skiff_store::Result<WatchStream> {
        self.inner.watch(prefix, after, progress).await
    }
    async fn current_revision(&self) -> skiff_store::Result<i64> {
        self.inner.current_revision().await
    }
    async fn request_progress(&self) -> skiff_store::Result<i64> {
        self.inner.request_progress().await
    }
    async fn compact(&self, revision: i64) -> skiff_store::Result<()> {
        self.inner.compact(revision).await
    }
    async fn compacted_revision(&self) -> skiff_store::Result<i64> {
        self.inner.compacted_revision().await
    }
}

#[derive(Clone, Copy, PartialEq, Debug)]
enum Workload {
    Basic,
    AntiAffinity,
    TopologySpread,
}

struct Args {
    workload: Workload,
    nodes: usize,
    init_pods: usize,
    pods: usize,
    creators: usize,
    authz: bool,
    etcd: bool,
    existing_pods: usize,
    schedulers: usize,
    commit_check: bool,
}

fn args() -> Args {
    let mut a = Args {
        workload: Workload::Basic,
        nodes: 5000,
        init_pods: 1000,
        pods: 10_000,
        creators: 256,
        authz: false,
        etcd: false,
        existing_pods: 0,
        schedulers: 1,
        commit_check: true,
    };
    let mut pods_set = false;
    let argv: Vec<String> = std::env::args().skip(1).collect();
    let mut i = 0;
    while i < argv.len() {
        let v = argv.get(i + 1).cloned().unwrap_or_default();
        let num = || {
            v.parse::<usize>()
                .unwrap_or_else(|_| panic!("{} needs a number", argv[i]))
        };
        match argv[i].as_str() {
            "--workload" => {
                a.workload = match v.as_str() {
                    "basic" => Workload::Basic,
                    "anti-affinity" => Workload::AntiAffinity,
                    "topology-spread" => Workload::TopologySpread,
                    other => {
                        panic!("unknown workload {other} (basic, anti-affinity, topology-spread)")
                    }
                }
            }
            "--nodes" => a.nodes = num(),
            "--init-pods" => a.init_pods = num(),
            "--pods" => {
                a.pods = num();
                pods_set = true;
            }
            "--creators" => a.creators = num(),
            "--existing-pods" => a.existing_pods = num(),
            "--schedulers" => a.schedulers = num().max(1),
            // Read where the store is opened.
            "--store-cache-mib" => {
                num();
            }
            "--authz" => {
                a.authz = true;
                i += 1;
                continue;
            }
            "--etcd" => {
                a.etcd = true;
                i += 1;
                continue;
            }
            "--no-commit-check" => {
                a.commit_check = false;
                i += 1;
                continue;
            }
            other => panic!("unknown option {other}"),
        }
        i += 2;
    }
    if !pods_set && a.workload == Workload::AntiAffinity {
        // One pod per node at most: 1,000 + 3,000 fit 5,000 nodes.
        a.pods = 3000;
    }
    if !pods_set && a.workload == Workload::TopologySpread {
        a.pods = 5000;
    }
    a
}

fn node(i: usize, w: Workload) -> Node {
    let name = format!("node-{i}");
    let mut b = NodeBuilder::new(&name);
    if w != Workload::Basic {
        b = b.label("kubernetes.io/hostname", &name);
    }
    if w == Workload::TopologySpread {
        b = b.label("topology.kubernetes.io/zone", &format!("zone-{}", i % 3));
    }
    b.build()
}

fn pod(name: &str, w: Workload) -> Pod {
    let mut b = PodBuilder::new(name)
        .for_api()
        .container_port(80)
        .request_and_limit("cpu", "100m")
        .request_and_limit("memory", "500Mi");
    match w {
        Workload::Basic => {}
        Workload::AntiAffinity => {
            b = b
                .label("color", "green")
                .affinity(json!({"podAntiAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": [{
                    "labelSelector": {"matchLabels": {"color": "green"}},
                    "topologyKey": "kubernetes.io/hostname"}]}}));
        }
        Workload::TopologySpread => {
            b = b.label("app", "spread").spread(json!({
                "maxSkew": 1, "topologyKey": "topology.kubernetes.io/zone",
                "whenUnsatisfiable": "DoNotSchedule",
                "labelSelector": {"matchLabels": {"app": "spread"}}}));
        }
    }
    b.build()
}

fn cpu_seconds() -> f64 {
    // utime + stime of this process, in clock ticks (100 Hz).
    let s = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    let after = s.rsplit(')').next().unwrap_or("");
    let f: Vec<&str> = after.split_whitespace().collect();
    let t = |i: usize| f.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    (t(11) + t(12)) / 100.0
}

/// RBAC for `--authz`: the rights kube-scheduler's bootstrap role gives it
/// (reads of what it schedules against, bindings, pod status, events,
/// leases), and pod creation in `default` for the creators.
async fn grant(admin: &kube::Client) {
    use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, RoleBinding};
    let read = json!(["get", "list", "watch"]);
    let role: ClusterRole = serde_json::from_value(json!({
        "metadata": {"name": "bench:kube-scheduler"},
        "rules": [
            {"apiGroups": ["*"], "resources": ["*"], "verbs": read},
            {"apiGroups": [""], "resources": ["pods/binding", "bindings"], "verbs": ["create"]},
            {"apiGroups": [""], "resources": ["pods/status"], "verbs": ["patch", "update"]},
            {"apiGroups": [""], "resources": ["pods"], "verbs": ["delete", "patch", "update"]},
            {"apiGroups": ["", "events.k8s.io"], "resources": ["events"], "verbs": ["create", "patch", "update"]},
            {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["create", "update"]},
        ]
    }))
    .unwrap();
    let creator: ClusterRole = serde_json::from_value(json!({
        "metadata": {"name": "bench:pod-creator"},
        "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["create"]}]
    }))
    .unwrap();
    let crb: ClusterRoleBinding = serde_json::from_value(json!({
        "metadata": {"name": "bench:kube-scheduler"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "bench:kube-scheduler"},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": "system:kube-scheduler"}]
    }))
    .unwrap();
    let rb: RoleBinding = serde_json::from_value(json!({
        "metadata": {"name": "bench:pod-creator", "namespace": "default"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "bench:pod-creator"},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": "bench-creator"}]
    }))
    .unwrap();
    let pp = PostParams::default();
    for r in [role, creator] {
        Api::<ClusterRole>::all(admin.clone())
            .create(&pp, &r)
            .await
            .unwrap();
    }
    Api::<ClusterRoleBinding>::all(admin.clone())
        .create(&pp, &crb)
        .await
        .unwrap();
    Api::<RoleBinding>::namespaced(admin.clone(), "default")
        .create(&pp, &rb)
        .await
        .unwrap();
}

async fn create_pods(
    client: kube::Client,
    prefix: &str,
    n: usize,
    w: Workload,
    creators: usize,
    lat: Arc<AtomicU64>,
) {
    let api: Api<Pod> = Api::namespaced(client, "default");
    futures::stream::iter(0..n)
        .for_each_concurrent(creators, |i| {
            let api = api.clone();
            let lat = lat.clone();
            let p = pod(&format!("{prefix}-{i}"), w);
            async move {
                let t = Instant::now();
                if let Err(e) = api.create(&PostParams::default(), &p).await {
                    eprintln!("create failed: {e}");
                }
                lat.fetch_add(t.elapsed().as_nanos() as u64, Relaxed);
            }
        })
        .await;
}

/// `--existing-pods N`: N pods already bound (`spec.nodeName` set at
/// create, round-robin over the benchmark's nodes, the measured pods'
/// shape) created through the API before the scheduler starts, so the
/// server's store and watch cache hold them and the scheduler's first list
/// brings them all into its cache, as after a restart in a full cluster.
async fn load_existing(
    client: &kube::Client,
    n: usize,
    nodes: usize,
    w: Workload,
    creators: usize,
) {
    let t = Instant::now();
    let api: Api<Pod> = Api::namespaced(client.clone(), "default");
    futures::stream::iter(0..n)
        .for_each_concurrent(creators, |i| {
            let api = api.clone();
            let mut p = pod(&format!("existing-{i}"), w);
            if let Some(s) = p.spec.as_mut() {
                s.node_name = Some(format!("node-{}", i % nodes.max(1)));
            }
            async move {
                while let Err(e) = api.create(&PostParams::default(), &p).await {
                    if matches!(&e, kube::Error::Api(s) if s.code == 409) {
                        break;
                    }
                    eprintln!("creating an existing pod failed: {e}");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
        })
        .await;
    println!(
        "created {n} bound pods (existing, {:.1} per node) in {:.1}s ({:.0} pods/s)",
        n as f64 / nodes.max(1) as f64,
        t.elapsed().as_secs_f64(),
        n as f64 / t.elapsed().as_secs_f64()
    );
}

async fn wait_scheduled(m: &Metrics, target: u64, timeout: Duration) -> bool {
    let end = Instant::now() + timeout;
    while Metrics::get(&m.scheduled) < target {
        if Instant::now() > end {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    true
}

fn pct(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let i = ((p / 100.0) * (sorted.len() - 1) as f64).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

#[tokio::main]
async fn main() {
    let a = args();
    let dir = tempfile::tempdir().unwrap();
    // With --etcd, a single-member etcd on loopback (Debian's /usr/bin/etcd).
    let etcd = if a.etcd {
        Some(skiff_store::testsuite::EtcdServer::start().await)
    } else {
        None
    };
    let inner: Arc<dyn Store> = match &etcd {
        Some(e) => e.store().await,
        None => {
            // --store-cache-mib N: redb's page cache (to compare sizes side by side).
            let argv: Vec<String> = std::env::args().collect();
            let mut opts = skiff_store::RedbOptions::default();
            if let Some(mib) = argv
                .iter()
                .position(|x| x == "--store-cache-mib")
                .and_then(|i| argv.get(i + 1))
                .and_then(|v| v.parse::<usize>().ok())
            {
                opts.cache_bytes = mib << 20;
            }
            skiff_store::RedbStore::open(&dir.path().join("store.redb"), opts).unwrap()
        }
    };
    let timed = Arc::new(TimedStore {
        inner,
        write_ns: AtomicU64::new(0),
        writes: AtomicU64::new(0),
        read_ns: AtomicU64::new(0),
        reads: AtomicU64::new(0),
    });
    let store: Arc<dyn Store> = timed.clone();
    let mut config = skiff_apiserver::Config::default();
    config.registry.commit_check = a.commit_check;
    let api = skiff_apiserver::ApiServer::start(store, config)
        .await
        .unwrap();
    if !a.commit_check {
        println!("the API server binds without the commit check (--no-commit-check)");
    }
    let client = skiff_kube::in_process(&api, "bench");
    // With --authz, the measured clients are RBAC users, not system:masters.
    let as_user = |user: &str| {
        kube::Client::new(
            api.router_as(skiff_apiserver::auth::Identity::new(user, vec![])),
            "default",
        )
    };
    let (creator_client, scheduler_client) = if a.authz {
        grant(&client).await;
        println!("authorization: creators and scheduler are RBAC users (--authz)");
        (as_user("bench-creator"), as_user("system:kube-scheduler"))
    } else {
        (client.clone(), skiff_kube::in_process(&api, "scheduler"))
    };
    println!(
        "workload {:?}: {} nodes, {} pods first, {} measured; {}",
        a.workload,
        a.nodes,
        a.init_pods,
        a.pods,
        if a.etcd {
            "a single-member etcd on loopback".to_string()
        } else {
            format!("durable redb store in {}", dir.path().display())
        }
    );

    let t = Instant::now();
    let nodes: Api<Node> = Api::all(client.clone());
    futures::stream::iter(0..a.nodes)
        .for_each_concurrent(a.creators, |i| {
            let nodes = nodes.clone();
            async move {
                nodes
                    .create(&PostParams::default(), &node(i, a.workload))
                    .await
                    .unwrap();
            }
        })
        .await;
    println!(
        "created {} nodes in {:.1}s",
        a.nodes,
        t.elapsed().as_secs_f64()
    );

    if a.existing_pods > 0 {
        load_existing(&client, a.existing_pods, a.nodes, a.workload, a.creators).await;
    }

    // One set of counters for all instances: `scheduled` is the total.
    let metrics = Arc::new(Metrics::default());
    for i in 0..a.schedulers {
        let opts = skiff_scheduler::Options {
            config_file: None,
            metrics: Some(metrics.clone()),
            // One instance runs alone, as B1 always ran; several share.
            instance: (a.schedulers > 1).then(|| format!("bench-{i}")),
        };
        tokio::spawn(skiff_scheduler::run(scheduler_client.clone(), opts));
    }
    if a.schedulers > 1 {
        // Every instance sees the others' Leases before pods come.
        tokio::time::sleep(skiff_scheduler::shard::RENEW * 3).await;
        println!("{} scheduler instances share the pods", a.schedulers);
    }

    let lat = Arc::new(AtomicU64::new(0));
    let t = Instant::now();
    create_pods(
        creator_client.clone(),
        "init",
        a.init_pods,
        a.workload,
        a.creators,
        lat.clone(),
    )
    .await;
    if !wait_scheduled(&metrics, a.init_pods as u64, Duration::from_secs(300)).await {
        panic!(
            "initial pods not scheduled: {}",
            Metrics::get(&metrics.scheduled)
        );
    }
    println!(
        "{} initial pods bound in {:.1}s",
        a.init_pods,
        t.elapsed().as_secs_f64()
    );

    // Measured phase.
    let base = |m: &AtomicU64| Metrics::get(m);
    let (alg0, att0, bind0, binds0, ev0, evn0) = (
        base(&metrics.algorithm_ns),
        base(&metrics.attempts),
        base(&metrics.bind_ns),
        base(&metrics.binds),
        base(&metrics.events_ns),
        base(&metrics.watch_events),
    );
    let (sw0, swn0) = (base(&timed.write_ns), base(&timed.writes));
    let (ew0, ed0) = (base(&metrics.events_written), base(&metrics.events_dropped));
    let conflicts0 = base(&metrics.bind_conflicts);
    lat.store(0, Relaxed);
    let cpu0 = cpu_seconds();
    let start_count = Metrics::get(&metrics.scheduled);
    let target = start_count + a.pods as u64;
    let t0 = Instant::now();
    let creator = tokio::spawn(create_pods(
        creator_client.clone(),
        "pod",
        a.pods,
        a.workload,
        a.creators,
        lat.clone(),
    ));
    let mut samples = Vec::new();
    let mut last = start_count;
    let mut next = t0 + Duration::from_secs(1);
    let deadline = t0 + Duration::from_secs(600);
    // Poll often, so the end is timed to the millisecond; count per second.
    let done_at = loop {
        tokio::time::sleep(Duration::from_millis(5)).await;
        let now = Instant::now();
        let count = Metrics::get(&metrics.scheduled);
        if count >= target {
            break now;
        }
        if now >= next {
            samples.push((count - last) as f64);
            last = count;
            next += Duration::from_secs(1);
        }
        if now > deadline {
            println!(
                "timed out with {} of {} scheduled",
                count - start_count,
                a.pods
            );
            break now;
        }
    };
    let elapsed = done_at.duration_since(t0).as_secs_f64();
    let cpu = cpu_seconds() - cpu0;
    creator.await.unwrap();
    let done = Metrics::get(&metrics.scheduled) - start_count;
    let mut sorted = samples.clone();
    sorted.sort_by(|a, b| a.partial_cmp(b).unwrap());
    println!();
    println!("scheduled {done} pods in {elapsed:.2}s");
    println!("throughput: avg {:.0} pods/s; full seconds ({}): p50 {:.0}, p90 {:.0}, p99 {:.0} (min {:.0}, max {:.0})",
        done as f64 / elapsed,
        samples.len(),
        pct(&sorted, 50.0),
        pct(&sorted, 90.0),
        pct(&sorted, 99.0),
        sorted.first().copied().unwrap_or(0.0),
        sorted.last().copied().unwrap_or(0.0));
    let ms = |ns: u64| ns as f64 / 1e6;
    let d = |m: &AtomicU64, b: u64| Metrics::get(m) - b;
    let attempts = d(&metrics.attempts, att0).max(1);
    let binds = d(&metrics.binds, binds0).max(1);
    let writes = (base(&timed.writes) - swn0).max(1);
    println!(
        "time split (measured phase, {elapsed:.2}s wall, {cpu:.2}s CPU of the process on 2 cores):"
    );
    println!(
        "  filter/score (scheduling algorithm, one task): {:.0} ms total, {:.1} µs per pod ({} attempts)",
        ms(d(&metrics.algorithm_ns, alg0)),
        d(&metrics.algorithm_ns, alg0) as f64 / 1e3 / attempts as f64,
        attempts
    );
    println!(
        "  watch events into cache/queue (scheduling task): {:.0} ms total ({} events)",
        ms(d(&metrics.events_ns, ev0)),
        d(&metrics.watch_events, evn0)
    );
    println!(
        "  bind (API request → durable, async, overlapping): mean latency {:.2} ms over {} binds",
        ms(d(&metrics.bind_ns, bind0)) / binds as f64,
        binds
    );
    println!(
        "  pod creation (API, {} concurrent creators): mean latency {:.2} ms",
        a.creators,
        ms(lat.load(Relaxed)) / a.pods.max(1) as f64
    );
    println!(
        "  store writes (inside the API server): {} writes, mean {:.2} ms, {:.0} ms summed",
        writes,
        ms(base(&timed.write_ns) - sw0) / writes as f64,
        ms(base(&timed.write_ns) - sw0)
    );
    println!(
        "  events: {} written, {} dropped by the recorder (back-pressure)",
        d(&metrics.events_written, ew0),
        d(&metrics.events_dropped, ed0)
    );
    let conflicts = d(&metrics.bind_conflicts, conflicts0);
    println!(
        "  commit conflicts ({} scheduler instance(s)): {conflicts} of {binds} binds refused ({:.2}%), \
         {:.4} retries per pod, {:.3} attempts per pod",
        a.schedulers,
        100.0 * conflicts as f64 / binds as f64,
        conflicts as f64 / done.max(1) as f64,
        attempts as f64 / done.max(1) as f64
    );
}
