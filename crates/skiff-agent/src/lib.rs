//! The node agent: skiff's kubelet. It registers its Node, renews its Lease,
//! watches the pods bound to it and drives them to their spec through a
//! container runtime: containerd over CRI on a real node ([`cri`]), a
//! simulated runtime on hollow nodes ([`sim`]).
//!
//! Fail-static: nothing here stops a container because the API server is
//! unreachable. Containers of pods that are gone are removed only after a
//! complete, successful list of the node's pods.

pub mod apilb;
pub mod cgroups;
pub mod clock;
pub mod containerd;
pub mod credentials;
pub mod cri;
pub mod dns;
pub mod hollow;
pub mod host;
pub mod image;
pub mod inputs;
pub mod join;
pub mod mirror;
pub mod net;
pub mod node;
pub mod pods;
pub mod pressure;
pub mod probes;
pub mod proxy;
pub mod reclaim;
pub mod runtime;
pub mod satoken;
pub mod server;
pub mod serving;
pub mod sim;
pub mod spec;
pub mod stats;
pub mod storage;
pub mod streams;
pub mod svcenv;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use futures::StreamExt;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::Api;
use kube::runtime::watcher;
use tokio::sync::watch;

use crate::pods::{NodeContext, PodWorker};
use crate::runtime::Runtime;

/// Settings of a real agent.
#[derive(Debug, Clone)]
pub struct AgentOptions {
    pub node_name: String,
    pub data_dir: PathBuf,
    /// A containerd to use instead of starting one.
    pub containerd: Option<PathBuf>,
    /// The address other nodes and the API server reach this node at.
    pub node_ip: Option<String>,
    /// Port of the agent's HTTPS endpoint (logs, exec, port-forward).
    pub port: u16,
    /// Pod CIDR to use when no controller assigns one.
    pub pod_cidr: Option<String>,
    /// PEM of the CA whose client certificates the endpoint accepts.
    pub client_ca_pem: Option<String>,
    pub labels: BTreeMap<String, String>,
    /// The service proxy's settings; None runs no proxy.
    pub proxy: Option<proxy::Settings>,
    /// The cluster DNS address (kubelet's `--cluster-dns`); None: the
    /// `kube-dns` Service's ClusterIP.
    pub cluster_dns: Option<std::net::IpAddr>,
    /// The cluster domain (kubelet's `--cluster-domain`).
    pub cluster_domain: String,
    /// Serve cluster DNS on this node (`dns`); off in tests that run
    /// several agents on one machine.
    pub serve_dns: bool,
    /// Pod routing between nodes and masquerading (`net`); None leaves
    /// the pods of a lone node masqueraded by the CNI bridge.
    pub network: Option<net::Settings>,
    /// Reservations and the reclaimable capacity published for batch pods.
    pub reclaim: reclaim::Config,
    /// Node-pressure eviction (kubelet's `--eviction-*` flags).
    pub eviction: pressure::Config,
}

/// The IPv4 address of the interface holding the default route, else
/// 127.0.0.1.
pub fn default_node_ip() -> String {
    let routes = std::fs::read_to_string("/proc/net/route").unwrap_or_default();
    let iface = routes
        .lines()
        .skip(1)
        .find(|l| l.split_whitespace().nth(1) == Some("00000000"))
        .and_then(|l| l.split_whitespace().next().map(str::to_string));
    if let Some(iface) = iface {
        if let Ok(out) = std::process::Command::new("ip")
            .args(["-4", "-o", "addr", "show", "dev", &iface])
            .output()
        {
            let s = String::from_utf8_lossy(&out.stdout);
            if let Some(addr) = s.split_whitespace().skip_while(|w| *w != "inet").nth(1) {
                if let Some((ip, _)) = addr.split_once('/') {
                    return ip.to_string();
                }
            }
        }
    }
    "127.0.0.1".into()
}

/// A name for the node's bridge, unique per data dir (several agents on one
/// machine in tests), within the kernel's 15 characters.
pub fn bridge_name(data_dir: &std::path::Path) -> String {
    let d = ring::digest::digest(&ring::digest::SHA256, data_dir.to_string_lossy().as_bytes());
    let hex: String = d.as_ref()[..4].iter().map(|b| format!("{b:02x}")).collect();
    format!("skf{hex}")
}

/// The cgroup batch pods run under, made idle: only with the agent's own
/// containerd, whose cgroupfs driver takes a plain path as a sandbox's
/// cgroup parent (a system containerd may use systemd's slices).
fn batch_cgroup_parent(options: &AgentOptions) -> Option<String> {
    if options.containerd.is_some() {
        return None;
    }
    match cgroups::prepare_batch_parent(std::path::Path::new("/sys/fs/cgroup")) {
        Ok(cgroups::BatchTier::Idle) => {
            tracing::info!(
                group = cgroups::BATCH_PARENT,
                "batch pods run at idle cpu priority"
            );
        }
        Ok(cgroups::BatchTier::LeastWeight(why)) => {
            tracing::warn!(
                group = cgroups::BATCH_PARENT,
                "no idle cpu priority for batch pods ({why}); they run at the least cpu weight"
            );
        }
        Err(e) => {
            tracing::warn!(
                group = cgroups::BATCH_PARENT,
                "preparing the batch pods' cgroup: {e}; they run at the least cpu weight beside prod pods"
            );
            return None;
        }
    }
    Some(cgroups::BATCH_PARENT.to_string())
}

/// Prepares the node (containerd, images, pod network) and returns the
/// runtime. Progress lines go to `progress`.
pub async fn prepare_runtime(
    options: &AgentOptions,
    tasks: &mut tokio::task::JoinSet<()>,
    progress: &(dyn Fn(&str) + Sync),
) -> Result<Arc<cri::Cri>> {
    std::fs::create_dir_all(&options.data_dir)?;
    let socket = match &options.containerd {
        Some(s) => s.clone(),
        None => {
            let layout = containerd::Layout::new(&options.data_dir);
            let t = std::time::Instant::now();
            containerd::ensure_running(&layout, image::PAUSE_IMAGE).await?;
            progress(&format!(
                "containerd ready ({} ms)",
                t.elapsed().as_millis()
            ));
            tasks.spawn(containerd::supervise(
                layout,
                image::PAUSE_IMAGE.to_string(),
            ));
            containerd::Layout::new(&options.data_dir).socket()
        }
    };
    let cri = Arc::new(cri::Cri::connect(&socket).await?);
    let t = std::time::Instant::now();
    if cri.image_present(image::PAUSE_IMAGE).await?.is_none() {
        let scratch = options.data_dir.join("tmp");
        image::import_bytes(&socket, &scratch, "pause.tar", &image::pause_archive()?)
            .context("importing skiff's pause image")?;
        progress(&format!(
            "pause image imported ({} ms)",
            t.elapsed().as_millis()
        ));
    }
    Ok(cri)
}

/// Writes the CNI config of the node once its pod CIDR is known (set by
/// the node IPAM controller, or `--pod-cidr`).
async fn configure_network(client: &kube::Client, options: &AgentOptions) -> Result<String> {
    let nodes: Api<Node> = Api::all(client.clone());
    let mut warned = false;
    let cidr = loop {
        if let Some(node) = nodes.get_opt(&options.node_name).await? {
            if let Some(c) = node.spec.and_then(|s| s.pod_cidr) {
                break c;
            }
        }
        if !warned {
            tracing::info!(node = options.node_name, "waiting for the node's podCIDR");
            warned = true;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let conf_dir = match &options.containerd {
        Some(_) => options.data_dir.join("cni"),
        None => containerd::Layout::new(&options.data_dir).cni_conf_dir(),
    };
    std::fs::create_dir_all(&conf_dir)?;
    let mtu = match &options.network {
        Some(n) => net::pod_mtu(n, options.node_ip.as_deref().and_then(|i| i.parse().ok())).await,
        None => None,
    };
    let conflist = containerd::cni_conflist(
        &bridge_name(&options.data_dir),
        &cidr,
        &options.data_dir.join("cni-ipam"),
        options.network.is_none(),
        mtu,
    );
    std::fs::write(conf_dir.join("10-skiff.conflist"), conflist)?;
    Ok(cidr)
}

/// Runs a real agent until an unrecoverable error.
pub async fn run(
    client: kube::Client,
    options: AgentOptions,
    progress: &(dyn Fn(&str) + Sync),
) -> Result<()> {
    // Every loop of the agent lives in this set: when `run` ends or is
    // cancelled, they stop with it (the containers do not).
    let mut tasks = tokio::task::JoinSet::new();
    let cri = prepare_runtime(&options, &mut tasks, progress).await?;
    let runtime: Arc<dyn Runtime> = cri.clone();
    let version = runtime.version().await?;
    let node_ip = match (&options.node_ip, &options.network) {
        (Some(ip), _) => ip.clone(),
        (None, Some(_)) => match net::detect_node_ip(None).await {
            Some(ip) => ip.to_string(),
            None => default_node_ip(),
        },
        (None, None) => default_node_ip(),
    };
    let endpoint = server::Endpoint::bind(&options, runtime.clone())
        .await?
        .authorizing_with(client.clone());
    let port = endpoint.port();
    let mut facts = node::NodeFacts::of_this_machine(
        &options.node_name,
        &options.data_dir,
        node_ip.clone(),
        port,
        version,
    );
    facts.labels = options.labels.clone();
    facts.pod_cidr = options.pod_cidr.clone();
    let t = std::time::Instant::now();
    let node = match node::register(&client, &facts).await {
        Ok(n) => n,
        // Asking again as the same identity gets the same answer.
        Err(e) if node::is_refusal(&e) => {
            return Err(node::refusal(&client, &options.node_name, e).await)
        }
        Err(e) => return Err(e),
    };
    progress(&format!(
        "node {} registered ({} ms)",
        options.node_name,
        t.elapsed().as_millis()
    ));
    let storage = storage::root(&options.data_dir);
    if let Err(e) = storage::advertise(&client, &options.node_name, &storage).await {
        tracing::warn!("publishing the local storage directory: {e:#}");
    }
    tasks.spawn(storage::remove_released_forever(
        client.clone(),
        options.node_name.clone(),
        storage,
    ));
    let cidr = configure_network(&client, &options).await?;
    progress(&format!("pod network {cidr} configured"));
    let uid = node.metadata.uid.clone().unwrap_or_default();
    tasks.spawn(node::renew_lease_forever(
        client.clone(),
        options.node_name.clone(),
        uid,
        Duration::from_secs(10),
    ));
    // The node's address as pod routing re-detects it, for the status
    // heartbeat and the proxy's NodePorts.
    let (address_tx, address_rx) = watch::channel(node_ip.clone());
    // The endpoint's certificate from the cluster CA, which the API server
    // verifies (a self-signed one until then), renewed after 80% of its
    // life and for a new node address. In the background: a cluster without
    // a signer never answers, and the node must not wait for it.
    tasks.spawn(serving::obtain_and_renew(
        client.clone(),
        endpoint.serving_cert(),
        options.node_name.clone(),
        address_rx.clone(),
        options.data_dir.clone(),
    ));
    let (pressure_tx, pressure_rx) = watch::channel(None);
    tasks.spawn(node::report_status_following(
        client.clone(),
        facts.clone(),
        Duration::from_secs(60),
        address_rx.clone(),
        Some(pressure_rx),
    ));
    if let Some(n) = options.network.clone() {
        tasks.spawn(net::run_for_agent(
            client.clone(),
            options.node_name.clone(),
            options.node_ip.as_deref().and_then(|i| i.parse().ok()),
            options.data_dir.clone(),
            n,
            address_tx,
        ));
    }
    let usage = endpoint.usage_feed();
    let endpoint_usage = endpoint.usage_feed();
    let reservations = endpoint.reservations();
    tasks.spawn(endpoint.serve());
    if let Some(mut p) = options.proxy.clone() {
        p.address = Some(address_rx.clone());
        tasks.spawn(proxy::run_for_agent(
            client.clone(),
            options.node_name.clone(),
            node_ip.clone(),
            options.data_dir.clone(),
            p,
        ));
    }
    let dns = dns::start(&client, &options, &mut tasks).await;
    let services = svcenv::Services::watched(client.clone(), &mut tasks);
    let mut allocatable = BTreeMap::new();
    allocatable.insert("cpu".to_string(), facts.cpu.parse().unwrap_or(1.0));
    let ctx = Arc::new(NodeContext {
        client: client.clone(),
        runtime,
        node_name: options.node_name.clone(),
        host_ip: node_ip,
        data_dir: options.data_dir.clone(),
        allocatable,
        events: true,
        resync: Duration::from_secs(1),
        dns,
        services,
        host: Arc::new(host::RealHost),
        clock: Arc::new(clock::SystemClock),
        allocations: pods::resize::Book::new(
            skiff_helpers::quantity::milli(&facts.cpu).unwrap_or(1000),
            skiff_helpers::quantity::units(&facts.memory).unwrap_or(0),
        ),
        batch_cgroup_parent: batch_cgroup_parent(&options),
    });
    let index = reclaim::PodIndex::default();
    let (evict_tx, evict_rx) = tokio::sync::mpsc::unbounded_channel();
    tasks.spawn(reclaim::run(
        client.clone(),
        options.node_name.clone(),
        reclaim::Amount::new(
            facts.cpu.parse::<f64>().unwrap_or(1.0) * 1000.0,
            skiff_helpers::quantity::units(&facts.memory).unwrap_or(0) as f64,
        ),
        index.clone(),
        reclaim::UsageSource::Stats(usage),
        options.reclaim.clone(),
        evict_tx.clone(),
        reservations,
    ));
    // The runtime's image filesystem: the managed containerd's root, else
    // containerd's usual one.
    let image_dir = match &options.containerd {
        None => containerd::Layout::new(&options.data_dir).dir.join("root"),
        Some(_) => ["/var/lib/containerd", "/"]
            .iter()
            .map(PathBuf::from)
            .find(|p| p.exists())
            .unwrap_or_else(|| options.data_dir.clone()),
    };
    tasks.spawn(pressure::run(
        Box::new(pressure::NodeMeasure {
            summary: endpoint_usage,
            image_dir,
        }),
        options.eviction.clone(),
        index.clone(),
        pressure_tx,
        evict_tx,
    ));
    let r = manage_pods_indexed(ctx, index, evict_rx).await;
    tasks.abort_all();
    r
}

/// Where the node's eviction managers (reclaimed capacity, node pressure)
/// send their orders: a pod's uid and how it is evicted. The pod manager
/// hands each to the pod's worker, which kills the pod and writes its
/// final status through its own plan.
pub type EvictionSender = tokio::sync::mpsc::UnboundedSender<(String, pods::plan::Eviction)>;
/// The pod manager's end of [`EvictionSender`].
pub type EvictionReceiver = tokio::sync::mpsc::UnboundedReceiver<(String, pods::plan::Eviction)>;

/// What a pod's worker is given: the pod as last seen (None: it is gone)
/// and the node's order to evict it, if one came.
#[derive(Clone, Default)]
struct WorkerInput {
    pod: Option<Arc<Pod>>,
    eviction: Option<Arc<pods::plan::Eviction>>,
}

/// Watches the pods bound to the node and keeps one worker per pod.
pub async fn manage_pods(ctx: Arc<NodeContext>) -> Result<()> {
    let (_, evictions) = tokio::sync::mpsc::unbounded_channel();
    manage_pods_indexed(ctx, reclaim::PodIndex::default(), evictions).await
}

/// [`manage_pods`], keeping `index` current with the node's pods and
/// handing `evictions` to the pods' workers.
pub async fn manage_pods_indexed(
    ctx: Arc<NodeContext>,
    index: reclaim::PodIndex,
    mut evictions: EvictionReceiver,
) -> Result<()> {
    let indexed = |f: &mut dyn FnMut(&mut reclaim::PodMap)| {
        f(&mut index.write().unwrap_or_else(|e| e.into_inner()))
    };
    let pods: Api<Pod> = Api::all(ctx.client.clone());
    let config = watcher::Config::default().fields(&format!("spec.nodeName={}", ctx.node_name));
    let mut stream = watcher(pods, config).boxed();
    let mut workers: HashMap<String, watch::Sender<WorkerInput>> = HashMap::new();
    let mut listing: Option<HashSet<String>> = None;
    let mut swept = false;
    loop {
        let ev = tokio::select! {
            ev = stream.next() => match ev {
                Some(ev) => ev,
                None => break,
            },
            Some((uid, eviction)) = evictions.recv() => {
                // The first order stands; a pod that is gone needs none.
                if let Some(tx) = workers.get(&uid) {
                    tx.send_if_modified(|w| {
                        let new = w.eviction.is_none() && w.pod.is_some();
                        if new {
                            w.eviction = Some(Arc::new(eviction));
                        }
                        new
                    });
                }
                continue;
            }
        };
        let ev = match ev {
            Ok(ev) => ev,
            Err(e) => {
                // The API server is unreachable or the watch broke: keep
                // everything running and try again.
                tracing::debug!(node = ctx.node_name, error = %e, "pod watch error");
                tokio::time::sleep(Duration::from_millis(500)).await;
                continue;
            }
        };
        match ev {
            watcher::Event::Init => listing = Some(HashSet::new()),
            watcher::Event::InitApply(mut pod) | watcher::Event::Apply(mut pod) => {
                // The pod worker never reads managedFields; with 150,000
                // pods on hollow nodes they were a good part of the
                // process's memory (kubelet's informer drops them too).
                pod.metadata.managed_fields = None;
                let uid = spec::uid(&pod).to_string();
                if let Some(l) = listing.as_mut() {
                    l.insert(uid.clone());
                }
                let pod = Arc::new(pod);
                ctx.allocations.seed(&pod);
                indexed(&mut |m| {
                    m.insert(uid.clone(), pod.clone());
                });
                match workers.get(&uid) {
                    Some(tx) if !tx.is_closed() => {
                        tx.send_modify(|w| w.pod = Some(pod));
                    }
                    _ => {
                        let (tx, rx) = watch::channel(WorkerInput {
                            pod: Some(pod),
                            eviction: None,
                        });
                        workers.insert(uid.clone(), tx);
                        tokio::spawn(pod_loop(ctx.clone(), uid, rx));
                    }
                }
            }
            watcher::Event::Delete(pod) => {
                let uid = spec::uid(&pod).to_string();
                ctx.allocations.remove(&uid);
                indexed(&mut |m| {
                    m.remove(&uid);
                });
                if let Some(tx) = workers.remove(&uid) {
                    tx.send_modify(|w| w.pod = None);
                }
            }
            watcher::Event::InitDone => {
                let seen = listing.take().unwrap_or_default();
                indexed(&mut |m| m.retain(|uid, _| seen.contains(uid)));
                // Every pod of the node is in the allocation book now.
                ctx.allocations.set_ready();
                workers.retain(|uid, tx| {
                    if seen.contains(uid) {
                        true
                    } else {
                        tx.send_modify(|w| w.pod = None);
                        false
                    }
                });
                if !swept {
                    swept = true;
                    sweep_orphans(&ctx, &seen).await;
                }
            }
        }
    }
    Ok(())
}

/// Removes sandboxes of pods that no longer exist (after a complete list).
async fn sweep_orphans(ctx: &Arc<NodeContext>, live: &HashSet<String>) {
    let Ok(sandboxes) = ctx.runtime.list_sandboxes(None).await else {
        return;
    };
    let mut gone = HashSet::new();
    for sb in sandboxes {
        let uid = sb
            .labels
            .get(runtime::LABEL_POD_UID)
            .cloned()
            .unwrap_or_default();
        if !uid.is_empty() && !live.contains(&uid) {
            gone.insert(uid);
        }
    }
    for uid in gone {
        tracing::info!(
            node = ctx.node_name,
            pod_uid = uid,
            "removing containers of a pod that no longer exists"
        );
        PodWorker::new(ctx.clone()).cleanup(&uid).await;
    }
}

async fn pod_loop(ctx: Arc<NodeContext>, uid: String, mut rx: watch::Receiver<WorkerInput>) {
    let mut worker = PodWorker::new(ctx.clone());
    loop {
        let WorkerInput { pod, eviction } = rx.borrow_and_update().clone();
        if let Some(e) = eviction {
            worker.order_eviction(&e);
        }
        let Some(pod) = pod else {
            Box::pin(worker.cleanup(&uid)).await;
            return;
        };
        // Boxed: the sync's state machine is large (tens of KiB), and this
        // task lives as long as its pod. Inline, every idle pod's task
        // would carry that much; boxed, only a syncing one does.
        let wait = Box::pin(worker.sync(&pod)).await;
        tokio::select! {
            changed = rx.changed() => {
                if changed.is_err() {
                    // The manager dropped this pod's channel without a
                    // verdict (it is shutting down): leave everything.
                    return;
                }
            }
            _ = tokio::time::sleep(wait) => {}
        }
    }
}
