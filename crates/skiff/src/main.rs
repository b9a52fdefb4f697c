//! The `skiff` binary: one program that is the API server and store (and, as
//! they land, the scheduler, controllers and node agent), plus the commands
//! around them.

/// jemalloc: the API server's work is many short-lived JSON values. glibc's
/// malloc spent about a fifth of B1's CPU on them; mimalloc was faster but
/// returned freed pages so eagerly that refaulting them cost ~10% more.
#[global_allocator]
static ALLOC: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use clap::{Args, Parser, Subcommand};

mod bootstrap;
mod cluster;
mod deps;

#[derive(Parser)]
#[command(
    name = "skiff",
    version,
    about = "A Kubernetes-compatible container orchestrator in one binary"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

// Parsed once at start and matched once: the size of its largest
// variant (`skiff up`'s flags) costs nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Subcommand)]
enum Command {
    /// Run the API server on its embedded store, with the scheduler and the
    /// controller manager.
    Server(ServerArgs),
    /// Run a node agent (real containers through containerd, or hollow
    /// nodes with --simulate).
    Agent(AgentArgs),
    /// Run a single-node cluster in one process: server, scheduler,
    /// controllers and an agent.
    Up(UpArgs),
    /// Stop what `skiff up` left running (containers, containerd); with
    /// --purge also remove its data.
    Down(DownArgs),
    /// Run the scheduler alone against a cluster.
    Scheduler(SchedulerArgs),
    /// Run the controller manager alone against a cluster.
    ControllerManager(ControllerManagerArgs),
    /// Images without a registry.
    #[command(subcommand)]
    Image(ImageCommand),
    /// Print a kubeconfig for a new user: a client certificate from the
    /// cluster CA (CN = user, O = each group). RBAC decides what it may do.
    Kubeconfig(KubeconfigArgs),
    /// Print the declared-dependency graph (`skiff.io/depends-on`):
    /// workloads, the Services they use, each edge's state, cycles.
    Deps(deps::DepsArgs),
    /// Print skiff's version.
    Version,
}

#[derive(Args, Clone)]
struct KubeconfigArgs {
    /// The user name (the certificate's CN).
    #[arg(long)]
    user: String,
    /// Groups of the user (the certificate's O; repeatable).
    #[arg(long = "group")]
    groups: Vec<String>,
    /// The server's data directory (default as for `skiff server`).
    #[arg(long)]
    data_dir: Option<PathBuf>,
    /// The server URL (default: the admin kubeconfig's).
    #[arg(long)]
    server: Option<String>,
    /// Days the certificate is valid.
    #[arg(long, default_value_t = 365)]
    days: i64,
}

#[derive(Args, Clone)]
struct ServerArgs {
    /// Where the store, certificates and kubeconfig live
    /// (default: /var/lib/skiff as root, ~/.skiff otherwise).
    #[arg(long)]
    data_dir: Option<PathBuf>,
    /// Address and port to serve HTTPS on.
    #[arg(long, default_value = "127.0.0.1:6443")]
    listen: SocketAddr,
    /// Extra names or IPs for the serving certificate (repeatable).
    #[arg(long = "tls-san")]
    tls_san: Vec<String>,
    /// The address pods reach the API server at (the `kubernetes`
    /// Service's endpoint, also put in the certificate). Default: the
    /// listen address, or the node's address when listening on loopback or
    /// on every address; when listening on loopback the server also
    /// listens on it (same port).
    #[arg(long)]
    advertise_address: Option<std::net::IpAddr>,
    /// Where to write the admin kubeconfig (default: DATA/admin.kubeconfig).
    #[arg(long)]
    write_kubeconfig: Option<PathBuf>,
    /// ClusterIP range for services.
    #[arg(long, default_value = "10.43.0.0/16")]
    service_cidr: String,
    /// Pod addresses: each node gets a /24 of this range.
    #[arg(long, default_value = "10.42.0.0/16")]
    cluster_cidr: String,
    /// Do not run the scheduler in this process.
    #[arg(long)]
    disable_scheduler: bool,
    /// Do not run the controller manager in this process.
    #[arg(long)]
    disable_controllers: bool,
    /// Seconds a node may go without renewing its Lease before it is
    /// marked Unknown and its pods are evicted.
    #[arg(long, default_value_t = 50)]
    node_monitor_grace_period: u64,
    /// Seconds of history kept for watches (Kubernetes keeps 5 minutes).
    #[arg(long, default_value_t = 300, hide = true)]
    compact_keep: u64,
    /// Seconds between compactions (default: 60 on the embedded store, 300
    /// on etcd, as kube-apiserver's --etcd-compaction-interval).
    #[arg(long, hide = true)]
    compact_every: Option<u64>,
    /// Keep the cluster's state in etcd at these client URLs
    /// (comma-separated) instead of the embedded store in DATA.
    #[arg(long = "etcd-servers", value_delimiter = ',')]
    etcd_servers: Vec<String>,
    /// CA bundle (PEM) verifying the etcd servers' certificates.
    #[arg(long = "etcd-cafile")]
    etcd_cafile: Option<PathBuf>,
    /// Client certificate (PEM) presented to etcd.
    #[arg(long = "etcd-certfile")]
    etcd_certfile: Option<PathBuf>,
    /// Key (PEM) of the etcd client certificate.
    #[arg(long = "etcd-keyfile")]
    etcd_keyfile: Option<PathBuf>,
    /// The etcd key prefix objects are stored under.
    #[arg(long = "etcd-prefix", default_value = "/registry")]
    etcd_prefix: String,
    /// The cluster's shared secret (with --etcd-servers): the first server
    /// stores the cluster CA, service-account and encryption keys in etcd
    /// encrypted with it; servers started later with the same token load
    /// them, so every server is the same cluster to its clients.
    #[arg(long, env = "SKIFF_TOKEN", hide_env_values = true)]
    token: Option<String>,
    /// Start a new HA control plane: run and supervise a local etcd member
    /// (DATA/etcd, TLS from the cluster CA) and keep the cluster in it.
    /// Without --token a token is made (DATA/server-token).
    #[arg(long, conflicts_with_all = ["etcd_servers", "server"])]
    cluster_init: bool,
    /// Join the HA control plane of this server (https://HOST:PORT) with
    /// --token: take the cluster's credentials, add a local etcd member.
    #[arg(long, requires = "token", conflicts_with = "etcd_servers")]
    server: Option<String>,
    /// Client port of the local etcd member (--cluster-init, --server).
    #[arg(long, default_value_t = 2379)]
    etcd_client_port: u16,
    /// Peer port of the local etcd member (--cluster-init, --server).
    #[arg(long, default_value_t = 2380)]
    etcd_peer_port: u16,
    /// When stopped (SIGTERM), leave the cluster for good: remove the
    /// local etcd member and its data.
    #[arg(long)]
    remove_member_on_stop: bool,
    #[command(flatten)]
    dns: DnsArgs,
    #[command(flatten)]
    protect: ProtectArgs,
}

/// Encryption at rest and audit logging, as kube-apiserver's flags.
#[derive(Args, Clone)]
struct ProtectArgs {
    /// An EncryptionConfiguration (apiserver.config.k8s.io/v1) saying which
    /// resources are encrypted in the store and with which keys. Default:
    /// DATA/pki/encryption-config.yaml, created at first start, encrypting
    /// Secrets with a random secretbox key.
    #[arg(long = "encryption-provider-config")]
    encryption_provider_config: Option<PathBuf>,
    /// An audit.k8s.io/v1 Policy: which requests are audited, at what level.
    #[arg(long = "audit-policy-file")]
    audit_policy_file: Option<PathBuf>,
    /// Where audit events go, as JSON lines (`-` for stdout).
    #[arg(long = "audit-log-path")]
    audit_log_path: Option<PathBuf>,
    /// Megabytes an audit log file may reach before it is rotated (0: 100).
    #[arg(long = "audit-log-maxsize", default_value_t = 0)]
    audit_log_maxsize: u64,
    /// Rotated audit log files kept (0: all).
    #[arg(long = "audit-log-maxbackup", default_value_t = 0)]
    audit_log_maxbackup: usize,
    /// Days rotated audit log files are kept (0: no limit).
    #[arg(long = "audit-log-maxage", default_value_t = 0)]
    audit_log_maxage: u64,
}

impl ProtectArgs {
    /// The audit backend, when both a policy and a log path are given (as
    /// kube-apiserver, either alone records nothing).
    fn auditor(&self) -> Result<Option<Arc<skiff_apiserver::audit::Auditor>>> {
        match (&self.audit_policy_file, &self.audit_log_path) {
            (Some(policy), Some(path)) => Ok(Some(skiff_apiserver::audit::Auditor::start(
                &skiff_apiserver::audit::Options {
                    policy_file: policy.clone(),
                    log_path: path.clone(),
                    max_size_mb: self.audit_log_maxsize,
                    max_backup: self.audit_log_maxbackup,
                    max_age_days: self.audit_log_maxage,
                },
            )?)),
            (None, None) => Ok(None),
            (Some(_), None) => {
                eprintln!("skiff: --audit-policy-file without --audit-log-path: no audit events are written");
                Ok(None)
            }
            (None, Some(_)) => {
                eprintln!("skiff: --audit-log-path without --audit-policy-file: no audit events are written");
                Ok(None)
            }
        }
    }
}

/// Cluster DNS: the server gives the `kube-dns` Service this address; the
/// agent serves DNS on it and writes it into pods' resolv.conf.
#[derive(Args, Clone)]
struct DnsArgs {
    /// The cluster DNS address (default: the 10th address of the service
    /// CIDR, 10.43.0.10; an agent alone asks the kube-dns Service).
    #[arg(long)]
    cluster_dns: Option<std::net::Ipv4Addr>,
    /// The cluster's DNS domain.
    #[arg(long, default_value = "cluster.local")]
    cluster_domain: String,
}

#[derive(Args, Clone)]
struct NodeArgs {
    /// The node's name (default: this machine's hostname).
    #[arg(long)]
    node_name: Option<String>,
    /// Use this containerd socket instead of running one for the agent.
    #[arg(long)]
    containerd: Option<PathBuf>,
    /// The node's address (default: the address of the default route).
    #[arg(long)]
    node_ip: Option<String>,
    /// Port of the agent's HTTPS endpoint (0: any free port).
    #[arg(long, default_value_t = 10250)]
    agent_port: u16,
    /// Pod CIDR of this node when no controller assigns one.
    #[arg(long)]
    pod_cidr: Option<String>,
    /// Labels for the Node (key=value, repeatable).
    #[arg(long = "node-label")]
    node_labels: Vec<String>,
    #[command(flatten)]
    proxy: ProxyArgs,
    #[command(flatten)]
    network: NetworkArgs,
    #[command(flatten)]
    reclaim: ReclaimArgs,
    #[command(flatten)]
    eviction: EvictionArgs,
}

/// Node-pressure eviction, with kubelet's flags.
#[derive(Args, Clone)]
struct EvictionArgs {
    /// Hard eviction thresholds, `signal<quantity` or `signal<percent%`,
    /// comma-separated (signals: memory.available, nodefs.available,
    /// nodefs.inodesFree, imagefs.available, imagefs.inodesFree,
    /// pid.available). Given, it replaces the defaults
    /// (memory.available<100Mi,nodefs.available<10%,imagefs.available<15%,nodefs.inodesFree<5%).
    #[arg(long)]
    eviction_hard: Option<String>,
    /// Soft eviction thresholds, as --eviction-hard; each needs a grace
    /// period in --eviction-soft-grace-period.
    #[arg(long)]
    eviction_soft: Option<String>,
    /// How long each soft threshold must be met before pods are evicted
    /// (`memory.available=1m30s`, comma-separated).
    #[arg(long)]
    eviction_soft_grace_period: Option<String>,
    /// How long a pressure condition stays after its threshold was last
    /// met (a Go duration).
    #[arg(long, default_value = "5m0s")]
    eviction_pressure_transition_period: String,
    /// How far above a met threshold the signal must come back before the
    /// threshold is no longer met (`memory.available=0Mi,nodefs.available=500Mi`).
    #[arg(long)]
    eviction_minimum_reclaim: Option<String>,
}

impl EvictionArgs {
    fn config(&self) -> Result<skiff_agent::pressure::Config> {
        let thresholds = skiff_agent::pressure::parse_config(
            self.eviction_hard.as_deref(),
            self.eviction_soft.as_deref(),
            self.eviction_soft_grace_period.as_deref(),
            self.eviction_minimum_reclaim.as_deref(),
        )
        .map_err(anyhow::Error::msg)?;
        let transition =
            skiff_agent::pressure::parse_duration(&self.eviction_pressure_transition_period)
                .ok_or_else(|| {
                    anyhow::anyhow!(
                        "--eviction-pressure-transition-period {:?} is not a duration (e.g. 5m0s)",
                        self.eviction_pressure_transition_period
                    )
                })?;
        Ok(skiff_agent::pressure::Config {
            thresholds,
            transition,
        })
    }
}

/// Reclaiming what prod pods reserve but do not use, for batch pods
/// (`skiff.io/batch-cpu`, `skiff.io/batch-memory` on the Node).
#[derive(Args, Clone)]
struct ReclaimArgs {
    /// Safety margin of a pod's reservation above its peak usage, as a
    /// fraction of the peak (at least 50m cpu and 64Mi memory).
    #[arg(long, default_value_t = 0.1)]
    reservation_margin: f64,
    /// Seconds an idle pod's reservation takes to fall from its request
    /// to its usage plus margin (also the window of the peak usage).
    #[arg(long, default_value_t = 120)]
    reservation_decay_seconds: u64,
    /// Fraction of the node's allocatable cpu shared by prod reservations
    /// and batch pods.
    #[arg(long, default_value_t = 0.60)]
    batch_cpu_threshold: f64,
    /// Fraction of the node's allocatable memory shared by prod
    /// reservations and batch pods.
    #[arg(long, default_value_t = 0.65)]
    batch_memory_threshold: f64,
}

impl ReclaimArgs {
    fn config(&self) -> Result<skiff_agent::reclaim::Config> {
        let fraction = |name: &str, v: f64| {
            if (0.0..=1.0).contains(&v) {
                Ok(v)
            } else {
                Err(anyhow::anyhow!("--{name} must be between 0 and 1, not {v}"))
            }
        };
        if self.reservation_decay_seconds == 0 {
            anyhow::bail!("--reservation-decay-seconds must be at least 1");
        }
        if !(self.reservation_margin >= 0.0 && self.reservation_margin.is_finite()) {
            anyhow::bail!(
                "--reservation-margin must be 0 or more, not {}",
                self.reservation_margin
            );
        }
        Ok(skiff_agent::reclaim::Config {
            margin: self.reservation_margin,
            decay: Duration::from_secs(self.reservation_decay_seconds),
            threshold: skiff_agent::reclaim::Amount::new(
                fraction("batch-cpu-threshold", self.batch_cpu_threshold)?,
                fraction("batch-memory-threshold", self.batch_memory_threshold)?,
            ),
            ..Default::default()
        })
    }
}

/// Pod routing between nodes (skiff's flannel).
#[derive(Args, Clone)]
struct NetworkArgs {
    /// How pods reach other nodes' pods: host-gw (direct routes; nodes
    /// share a subnet), vxlan, or auto (direct routes to nodes on this
    /// node's subnet, VXLAN to the others).
    #[arg(long, default_value = "auto")]
    flannel_backend: skiff_agent::net::plan::Backend,
}

/// The agent's service proxy (nftables).
#[derive(Args, Clone)]
struct ProxyArgs {
    /// Run no service proxy on this node (ClusterIPs and NodePorts are
    /// then not reachable through it).
    #[arg(long)]
    disable_proxy: bool,
}

#[derive(Args, Clone)]
struct AgentArgs {
    /// Kubeconfig of the cluster to join (or --server with --token).
    #[arg(long, required_unless_present = "token")]
    kubeconfig: Option<PathBuf>,
    /// The API server to join with --token (https://HOST:PORT).
    #[arg(long, requires = "token")]
    server: Option<String>,
    /// The server's join token (`DATA/token`): the agent verifies the
    /// server's CA by its hash and obtains its own client certificate.
    #[arg(long, requires = "server", conflicts_with = "kubeconfig")]
    token: Option<String>,
    /// Where the agent keeps its containerd, logs and volumes.
    #[arg(long)]
    data_dir: Option<PathBuf>,
    #[command(flatten)]
    node: NodeArgs,
    /// The cluster's pod range, for the service proxy's masquerading.
    #[arg(long, default_value = "10.42.0.0/16")]
    cluster_cidr: String,
    #[command(flatten)]
    dns: DnsArgs,
    /// Run hollow nodes (simulated runtime) instead of a real one.
    #[arg(long)]
    simulate: bool,
    /// With --simulate: how many nodes (named NODE-NAME-0 …).
    #[arg(long, default_value_t = 1)]
    nodes: u32,
    /// With --simulate: how long a container takes to start, in ms.
    #[arg(long, default_value_t = 0)]
    start_delay_ms: u64,
    /// Reach the API servers through the agent's balancer, which follows
    /// every server of the `kubernetes` Endpoints (the default). With
    /// `--api-balancer=false` and `--simulate`, the hollow nodes talk to the
    /// kubeconfig's server directly, as kubemark's do: through the balancer
    /// each connection takes three descriptors of the process, too many for
    /// 10,000 nodes' watches.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set, num_args = 0..=1, default_missing_value = "true")]
    api_balancer: bool,
}

#[derive(Args, Clone)]
struct UpArgs {
    #[command(flatten)]
    server: ServerArgs,
    #[command(flatten)]
    node: NodeArgs,
}

#[derive(Args, Clone)]
struct DownArgs {
    #[arg(long)]
    data_dir: Option<PathBuf>,
    /// Also remove the data directory (store, certificates, images).
    #[arg(long)]
    purge: bool,
}

#[derive(Args, Clone)]
struct SchedulerArgs {
    #[arg(long)]
    kubeconfig: PathBuf,
    /// A KubeSchedulerConfiguration file.
    #[arg(long)]
    config: Option<PathBuf>,
    /// Run only while holding the `kube-scheduler` Lease (kube-scheduler's
    /// flag; overrides the config file's `leaderElection.leaderElect`;
    /// on unless either says otherwise). Without it, the instances running
    /// the same profiles share their pods (each holds a Lease of its own).
    #[arg(long, action = clap::ArgAction::Set, num_args = 0..=1, default_missing_value = "true")]
    leader_elect: Option<bool>,
}

#[derive(Args, Clone)]
struct ControllerManagerArgs {
    #[arg(long)]
    kubeconfig: PathBuf,
    /// Pod addresses: each node gets a /24 of this range.
    #[arg(long, default_value = "10.42.0.0/16")]
    cluster_cidr: String,
    /// Seconds a node may go without renewing its Lease before it is
    /// marked Unknown and its pods are evicted.
    #[arg(long, default_value_t = 50)]
    node_monitor_grace_period: u64,
    /// Run only while holding the `kube-controller-manager` Lease
    /// (kube-controller-manager's flag).
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set, num_args = 0..=1, default_missing_value = "true")]
    leader_elect: bool,
}

#[derive(Subcommand)]
enum ImageCommand {
    /// Load a docker-archive or OCI archive into the node's containerd.
    Import {
        file: PathBuf,
        /// The data dir of the agent whose containerd gets the image.
        #[arg(long)]
        data_dir: Option<PathBuf>,
        /// A containerd socket instead.
        #[arg(long)]
        containerd: Option<PathBuf>,
    },
    /// Build the busybox test image from a static busybox (Debian's
    /// busybox-static) as a docker-archive.
    BuildBusybox {
        #[arg(long, default_value = "/bin/busybox")]
        busybox: PathBuf,
        #[arg(long, default_value = skiff_agent::image::BUSYBOX_IMAGE)]
        tag: String,
        #[arg(long, short)]
        output: PathBuf,
    },
    /// Write skiff's pause image as a docker-archive.
    BuildPause {
        #[arg(long, short)]
        output: PathBuf,
    },
}

fn default_data_dir() -> PathBuf {
    let is_root = std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("Uid:"))
                .map(|l| l.split_whitespace().nth(1) == Some("0"))
        })
        .unwrap_or(false);
    if is_root {
        return PathBuf::from("/var/lib/skiff");
    }
    match std::env::var_os("HOME") {
        Some(h) => PathBuf::from(h).join(".skiff"),
        None => PathBuf::from(".skiff"),
    }
}

fn parse_cidr(s: &str) -> Result<(std::net::Ipv4Addr, u8)> {
    let (ip, bits) = s
        .split_once('/')
        .context("a CIDR looks like 10.43.0.0/16")?;
    let ip: std::net::Ipv4Addr = ip.parse().context("bad CIDR address")?;
    let bits: u8 = bits.parse().context("bad CIDR prefix length")?;
    anyhow::ensure!(
        (8..=30).contains(&bits),
        "service CIDR prefix must be between /8 and /30"
    );
    Ok((ip, bits))
}

/// A started API server: its router, PKI and where clients find it.
struct Started {
    api: skiff_apiserver::ApiServer,
    pki: skiff_apiserver::tls::Pki,
    listener: tokio::net::TcpListener,
    /// The listener on the advertise address when the main one is loopback.
    pod_listener: Option<tokio::net::TcpListener>,
    kubeconfig_path: PathBuf,
    data_dir: PathBuf,
    /// The local etcd member (--cluster-init, --server) and the join
    /// endpoints served beside the API.
    etcd: Option<(
        cluster::Supervisor,
        Arc<cluster::JoinState>,
        cluster::Member,
    )>,
}

impl Started {
    /// The API's router, with the join endpoints when this server runs an
    /// etcd member.
    fn router(&self) -> axum::Router {
        let router = self.api.router();
        match &self.etcd {
            Some((_, join, _)) => router.merge(cluster::routes(join.clone())),
            None => router,
        }
    }
}

/// `--cluster-init` or `--server`: starts the local etcd member (joining
/// the cluster first when it is new) and points `args` at it.
async fn start_member(
    args: &mut ServerArgs,
    data_dir: &Path,
    peer_ip: std::net::IpAddr,
    sans: &[String],
) -> Result<Option<(cluster::Supervisor, cluster::Member)>> {
    if !args.cluster_init && args.server.is_none() {
        return Ok(None);
    }
    let token = match &args.token {
        Some(t) => t.clone(),
        None => {
            let path = data_dir.join("server-token");
            match std::fs::read_to_string(&path) {
                Ok(t) if !t.trim().is_empty() => t.trim().to_string(),
                _ => {
                    let t = bootstrap::random_token()?;
                    skiff_apiserver::tls::write_secret_file(&path, &format!("{t}\n"))?;
                    eprintln!(
                        "skiff: the cluster's token is in {} (other servers join with --token)",
                        path.display()
                    );
                    t
                }
            }
        }
    };
    let member = cluster::Member::new(
        data_dir,
        peer_ip,
        args.etcd_client_port,
        args.etcd_peer_port,
    )?;
    let settings = [
        ("service-cidr".to_string(), args.service_cidr.clone()),
        ("cluster-cidr".to_string(), args.cluster_cidr.clone()),
    ]
    .into();
    if let Some(server) = &args.server {
        if !member.initialized() {
            cluster::fetch_credentials(server, &token, data_dir, &settings).await?;
        }
    }
    let pki = skiff_apiserver::tls::Pki::load_or_create(&data_dir.join("pki"), sans)?;
    member.write_certificates(&pki.ca)?;
    let own = format!("{}={}", member.name, member.peer_url());
    let (initial, state) = match &args.server {
        Some(server) if !member.initialized() => (
            cluster::add_member(server, &token, pki.ca.cert_pem.as_bytes(), &member).await?,
            "existing",
        ),
        _ => (own, "new"),
    };
    let supervisor = cluster::Supervisor::start(&member, &initial, state)?;
    cluster::wait_ready(&member, 90).await?;
    eprintln!(
        "skiff: etcd member {} serving at {} (peers at {})",
        member.name,
        member.local_client_url(),
        member.peer_url()
    );
    let (ca, cert, key) = member.client_files();
    args.etcd_servers = vec![member.local_client_url()];
    args.etcd_cafile = Some(ca);
    args.etcd_certfile = Some(cert);
    args.etcd_keyfile = Some(key);
    args.token = Some(token);
    Ok(Some((supervisor, member)))
}

/// The embedded store in DATA, or etcd with `--etcd-servers`.
async fn open_store(args: &ServerArgs, data_dir: &Path) -> Result<Arc<dyn skiff_store::Store>> {
    if args.etcd_servers.is_empty() {
        let store = skiff_store::RedbStore::open(&data_dir.join("store.redb"), Default::default())
            .with_context(|| format!("opening the store in {}", data_dir.display()))?;
        return Ok(store);
    }
    let opts = etcd_options(args)?;
    let store = skiff_store::EtcdStore::connect(opts)
        .await
        .with_context(|| format!("connecting to etcd at {}", args.etcd_servers.join(",")))?;
    Ok(store)
}

/// How to reach etcd, from the `--etcd-*` flags.
fn etcd_options(args: &ServerArgs) -> Result<skiff_store::EtcdOptions> {
    let read = |flag: &str, p: &Option<PathBuf>| -> Result<Option<Vec<u8>>> {
        p.as_ref()
            .map(|p| std::fs::read(p).with_context(|| format!("reading {flag} {}", p.display())))
            .transpose()
    };
    let tls = skiff_store::EtcdTls {
        ca_pem: read("--etcd-cafile", &args.etcd_cafile)?,
        cert_pem: read("--etcd-certfile", &args.etcd_certfile)?,
        key_pem: read("--etcd-keyfile", &args.etcd_keyfile)?,
    };
    if tls.cert_pem.is_some() != tls.key_pem.is_some() {
        anyhow::bail!("--etcd-certfile and --etcd-keyfile go together");
    }
    let https = args.etcd_servers.iter().any(|u| u.starts_with("https://"));
    let use_tls = https || tls.ca_pem.is_some() || tls.cert_pem.is_some();
    if !args.etcd_prefix.starts_with('/') {
        anyhow::bail!(
            "--etcd-prefix must start with '/', not {:?}",
            args.etcd_prefix
        );
    }
    Ok(skiff_store::EtcdOptions {
        endpoints: args.etcd_servers.clone(),
        prefix: args.etcd_prefix.clone(),
        tls: use_tls.then_some(tls),
        ..Default::default()
    })
}

async fn start_server(args: &ServerArgs) -> Result<Started> {
    let mut args = args.clone();
    let args = &mut args;
    let data_dir = args.data_dir.clone().unwrap_or_else(default_data_dir);
    std::fs::create_dir_all(&data_dir)
        .with_context(|| format!("creating {}", data_dir.display()))?;
    let (service_base, _) = parse_cidr(&args.service_cidr)?;
    let endpoint_ip: Option<std::net::IpAddr> = match args.advertise_address {
        Some(ip) => Some(ip),
        None if args.listen.ip().is_loopback() || args.listen.ip().is_unspecified() => {
            skiff_agent::default_node_ip()
                .parse::<std::net::IpAddr>()
                .ok()
                .filter(|ip| !ip.is_loopback())
        }
        None => Some(args.listen.ip()),
    };
    let mut sans = args.tls_san.clone();
    // Pods reach the server as https://10.43.0.1 (the `kubernetes`
    // Service) or at the advertise address.
    sans.push(std::net::Ipv4Addr::from(u32::from(service_base) + 1).to_string());
    if let Some(ip) = endpoint_ip {
        sans.push(ip.to_string());
    }
    let peer_ip = args
        .advertise_address
        .or(endpoint_ip)
        .unwrap_or(std::net::Ipv4Addr::LOCALHOST.into());
    let supervisor = start_member(args, &data_dir, peer_ip, &sans).await?;
    let store = open_store(args, &data_dir).await?;
    let raw_store = store.clone();
    if let Some(token) = &args.token {
        anyhow::ensure!(
            !args.etcd_servers.is_empty(),
            "--token shares the cluster's credentials through etcd: give --etcd-servers too"
        );
        let settings = [
            ("service-cidr".to_string(), args.service_cidr.clone()),
            ("cluster-cidr".to_string(), args.cluster_cidr.clone()),
        ]
        .into();
        let key = bootstrap::key_for(&args.etcd_prefix);
        if bootstrap::sync(&*store, &key, token, &data_dir, settings).await? {
            eprintln!("skiff: stored the cluster's credentials in etcd ({key})");
        } else {
            eprintln!("skiff: loaded the cluster's credentials from etcd ({key})");
        }
    }
    let pki = skiff_apiserver::tls::Pki::load_or_create(&data_dir.join("pki"), &sans)?;
    let store = skiff_apiserver::encryption::wrap(
        store,
        match &args.protect.encryption_provider_config {
            Some(path) => skiff_apiserver::encryption::EncryptionConfig::load(path)?,
            None => skiff_apiserver::encryption::EncryptionConfig::load_or_create_default(
                &data_dir.join("pki"),
            )?,
        },
    );
    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .with_context(|| format!("listening on {}", args.listen))?;
    let addr = listener.local_addr()?;
    let mut pod_listener = None;
    let mut endpoint = endpoint_ip;
    if let Some(ip) = endpoint_ip.filter(|_| addr.ip().is_loopback()) {
        match tokio::net::TcpListener::bind((ip, addr.port())).await {
            Ok(l) => pod_listener = Some(l),
            Err(e) => {
                eprintln!(
                    "skiff: not listening on {ip}:{} ({e}); pods cannot reach the API server",
                    addr.port()
                );
                endpoint = None;
            }
        }
    }
    let host = if addr.ip().is_unspecified() {
        "127.0.0.1".to_string()
    } else {
        addr.ip().to_string()
    };
    let host = if host.contains(':') {
        format!("[{host}]")
    } else {
        host
    };
    let advertise = format!("{host}:{}", addr.port());
    let service_cidr = parse_cidr(&args.service_cidr)?;
    if let Some(ip) = args.dns.cluster_dns {
        let (base, bits) = service_cidr;
        let mask = u32::MAX << (32 - bits);
        anyhow::ensure!(
            u32::from(ip) & mask == u32::from(base) & mask,
            "--cluster-dns {ip} is outside the service CIDR {}",
            args.service_cidr
        );
    }
    let config = skiff_apiserver::Config {
        advertise: advertise.clone(),
        compact_keep: Duration::from_secs(args.compact_keep),
        compact_every: Duration::from_secs(
            args.compact_every
                .unwrap_or(if args.etcd_servers.is_empty() {
                    60
                } else {
                    300
                })
                .max(1),
        ),
        registry: skiff_apiserver::registry::RegistryConfig {
            service_cidr,
            cluster_dns: args.dns.cluster_dns,
            ..Default::default()
        },
        kubelet_client: Some((
            pki.kubelet_client.cert_pem.clone(),
            pki.kubelet_client.key_pem.clone(),
        )),
        // The controllers run in this process unless disabled; their
        // reconcile, error, duration and queue-depth families go here.
        metrics: (!args.disable_controllers)
            .then_some(skiff_controllers::metrics_text as fn() -> String),
        kubernetes_endpoint: endpoint.map(|ip| (ip.to_string(), addr.port())),
        service_account_key_dir: Some(data_dir.join("pki").join("service-account")),
        audit: args.protect.auditor()?,
        cluster_signing: Some((pki.ca.cert_pem.clone(), pki.ca.key_pem.clone())),
        front_proxy_dir: Some(data_dir.join("pki").join("front-proxy")),
        ..Default::default()
    };
    let api = skiff_apiserver::ApiServer::start(store, config).await?;
    // The join token agents use (`skiff agent --server --token`).
    skiff_apiserver::bootstrap_token::ensure(
        &api.state.registry,
        &data_dir,
        &pki.ca.cert_pem,
        &format!("https://{advertise}"),
    )
    .await?;
    let kubeconfig_path = args
        .write_kubeconfig
        .clone()
        .unwrap_or_else(|| data_dir.join("admin.kubeconfig"));
    let kubeconfig = skiff_apiserver::tls::kubeconfig(
        &format!("https://{advertise}"),
        &pki.ca.cert_pem,
        "admin",
        &pki.admin,
    );
    skiff_apiserver::tls::write_secret_file(&kubeconfig_path, &kubeconfig)?;
    let etcd = match supervisor {
        Some((sup, member)) => {
            let etcd = etcd_options(args)?;
            Some((
                sup,
                Arc::new(cluster::JoinState {
                    secret: bootstrap::join_secret(args.token.as_deref().unwrap_or_default()),
                    store: raw_store,
                    key: bootstrap::key_for(&args.etcd_prefix),
                    etcd,
                }),
                member,
            ))
        }
        None => None,
    };
    Ok(Started {
        api,
        pki,
        listener,
        pod_listener,
        kubeconfig_path,
        data_dir,
        etcd,
    })
}

async fn shutdown_signal() {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).ok();
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = async { match term.as_mut() { Some(t) => { t.recv().await; } None => std::future::pending::<()>().await } } => {}
    }
}

fn identity() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
    format!("{}_{}", host.trim(), uuid_like())
}

fn uuid_like() -> String {
    format!(
        "{:016x}",
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(0)
            ^ (std::process::id() as u64) << 32
    )
}

/// Runs the scheduler and the controller manager on `client`, each behind
/// its own leader election, until one of them fails.
/// A client into this process's API server acting as `user` (the
/// in-process components' own identities, as standalone ones would have).
fn in_process_as(api: &skiff_apiserver::ApiServer, user: &str) -> kube::Client {
    let id = skiff_apiserver::auth::Identity::new(user, Vec::new());
    kube::Client::new(api.router_as(id), "default")
}

fn spawn_control_loops(
    client: kube::Client,
    scheduler_client: kube::Client,
    scheduler: bool,
    controllers: bool,
    cluster_cidr: &str,
    root_ca: Option<String>,
    grace: u64,
) {
    let id = identity();
    if scheduler {
        let c = scheduler_client;
        let id = id.clone();
        tokio::spawn(async move {
            lead_forever("kube-scheduler", &c, &id, "the scheduler", || {
                skiff_scheduler::run(c.clone(), Default::default())
            })
            .await
        });
    }
    if controllers {
        let c = client.clone();
        let options = controller_options(cluster_cidr, root_ca, grace);
        tokio::spawn(async move {
            lead_forever(
                "kube-controller-manager",
                &c,
                &id,
                "the controller manager",
                || skiff_controllers::run(c.clone(), options.clone()),
            )
            .await
        });
    }
}

/// Runs `work` whenever this server holds the Lease `lease`: a lost lease
/// (another holder, or no renewal within the renew deadline) drops the
/// work at once and this server campaigns again, while its API server
/// keeps serving.
async fn lead_forever<F, Fut>(lease: &str, client: &kube::Client, id: &str, what: &str, work: F)
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = Result<()>>,
{
    loop {
        let timing = skiff_kube::leader::Timing::default();
        let retry = timing.retry;
        match skiff_kube::leader::run_elected(client.clone(), lease, id, timing, work()).await {
            Ok(()) => return,
            Err(e) => {
                tracing::error!(error = %e, "{what} stopped");
                eprintln!("skiff: {what} stopped: {e:#}; campaigning again");
            }
        }
        tokio::time::sleep(retry).await;
    }
}

fn controller_options(
    cluster_cidr: &str,
    root_ca: Option<String>,
    grace: u64,
) -> skiff_controllers::Options {
    skiff_controllers::Options {
        root_ca_pem: root_ca,
        cluster_cidr: cluster_cidr.to_string(),
        node_monitor_grace_period: Duration::from_secs(grace.max(1)),
        ..Default::default()
    }
}

async fn server(args: ServerArgs) -> Result<()> {
    let started = std::time::Instant::now();
    let s = start_server(&args).await?;
    let tls = s.pki.server_tls()?;
    let addr = s.listener.local_addr()?;
    spawn_control_loops(
        in_process_as(&s.api, "system:kube-controller-manager"),
        in_process_as(&s.api, "system:kube-scheduler"),
        !args.disable_scheduler,
        !args.disable_controllers,
        &args.cluster_cidr,
        Some(s.pki.ca.cert_pem.clone()),
        args.node_monitor_grace_period,
    );
    tracing::info!(%addr, kubeconfig = %s.kubeconfig_path.display(), elapsed_ms = started.elapsed().as_millis() as u64, "serving");
    eprintln!(
        "skiff: serving https://{addr} (kubeconfig: {})",
        s.kubeconfig_path.display()
    );
    let router = s.router();
    if let Some(l) = s.pod_listener {
        let (tls, router) = (tls.clone(), router.clone());
        tokio::spawn(async move {
            skiff_apiserver::serve::serve_tls_checked(l, tls, router, std::future::pending()).await;
        });
    }
    let shutdown = async {
        shutdown_signal().await;
        eprintln!("skiff: shutting down");
    };
    skiff_apiserver::serve::serve_tls_checked(s.listener, tls, router, shutdown).await;
    s.api.leave().await;
    if let Some((etcd, _, member)) = s.etcd {
        if args.remove_member_on_stop {
            match cluster::remove(&member).await {
                Ok(()) => eprintln!(
                    "skiff: removed etcd member {} from the cluster",
                    member.name
                ),
                Err(e) => eprintln!("skiff: removing etcd member {}: {e:#}", member.name),
            }
        }
        etcd.stop().await;
        if args.remove_member_on_stop {
            let _ = std::fs::remove_dir_all(member.etcd_dir());
        }
    }
    Ok(())
}

fn parse_labels(pairs: &[String]) -> Result<std::collections::BTreeMap<String, String>> {
    pairs
        .iter()
        .map(|p| {
            p.split_once('=')
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .with_context(|| format!("a node label looks like key=value, not {p:?}"))
        })
        .collect()
}

fn hostname() -> String {
    let h = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
    let h = h.trim().to_lowercase();
    if h.is_empty() {
        "skiff-node".into()
    } else {
        h
    }
}

fn agent_options(
    node: &NodeArgs,
    dns: &DnsArgs,
    data_dir: PathBuf,
    ca_pem: Option<String>,
    cluster_cidr: &str,
) -> Result<skiff_agent::AgentOptions> {
    Ok(skiff_agent::AgentOptions {
        node_name: node.node_name.clone().unwrap_or_else(hostname),
        data_dir,
        containerd: node.containerd.clone(),
        node_ip: node.node_ip.clone(),
        port: node.agent_port,
        pod_cidr: node.pod_cidr.clone(),
        client_ca_pem: ca_pem,
        labels: parse_labels(&node.node_labels)?,
        proxy: (!node.proxy.disable_proxy).then(|| skiff_agent::proxy::Settings {
            cluster_cidr: Some(cluster_cidr.to_string()),
            address: None,
        }),
        cluster_dns: dns.cluster_dns.map(Into::into),
        cluster_domain: dns.cluster_domain.clone(),
        serve_dns: true,
        network: Some(skiff_agent::net::Settings {
            backend: node.network.flannel_backend,
            cluster_cidr: skiff_agent::net::plan::Cidr::parse(cluster_cidr)
                .with_context(|| format!("--cluster-cidr {cluster_cidr:?} is not an IPv4 CIDR"))?,
        }),
        reclaim: node.reclaim.config()?,
        eviction: node.eviction.config()?,
    })
}

fn ca_from_kubeconfig(path: &std::path::Path) -> Result<Option<String>> {
    let kc = kube::config::Kubeconfig::read_from(path)?;
    let Some(cluster) = kc.clusters.first().and_then(|c| c.cluster.clone()) else {
        return Ok(None);
    };
    if let Some(data) = cluster.certificate_authority_data {
        use base64::Engine;
        let pem = base64::engine::general_purpose::STANDARD.decode(data.trim())?;
        return Ok(Some(String::from_utf8(pem)?));
    }
    if let Some(file) = cluster.certificate_authority {
        return Ok(Some(std::fs::read_to_string(file)?));
    }
    Ok(None)
}

fn hollow_options(args: &AgentArgs) -> Result<skiff_agent::hollow::HollowOptions> {
    // Hollow nodes measure no pressure, but a malformed flag is refused
    // all the same.
    args.node.eviction.config()?;
    Ok(skiff_agent::hollow::HollowOptions {
        nodes: args.nodes,
        prefix: args
            .node
            .node_name
            .clone()
            .unwrap_or_else(|| "hollow".into()),
        start_delay: Duration::from_millis(args.start_delay_ms),
        // Hollow nodes sample every 10 s: 10,000 of them share a process.
        reclaim: Some(skiff_agent::reclaim::Config {
            tick: Duration::from_secs(10),
            ..args.node.reclaim.config()?
        }),
        ..Default::default()
    })
}

/// Runs `--nodes` hollow nodes (`agent --simulate`).
async fn run_hollow(args: &AgentArgs, client: kube::Client) -> Result<()> {
    let options = hollow_options(args)?;
    eprintln!(
        "skiff: running {} hollow node(s) {}-0…",
        options.nodes, options.prefix
    );
    tokio::select! {
        r = skiff_agent::hollow::run(client, options) => r,
        _ = shutdown_signal() => Ok(()),
    }
}

/// Hollow nodes joined with a token (`agent --simulate --server --token`):
/// each node obtains its own credentials through its own
/// CertificateSigningRequest (kept under DATA/hollow/NODE and renewed like a
/// real node's), as each hollow kubelet of kubemark has its own, so the
/// Node authorizer and NodeRestriction treat each as the node it is.
async fn run_hollow_joined(args: &AgentArgs, server: &str, token: &str) -> Result<()> {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    let dir = args
        .data_dir
        .clone()
        .unwrap_or_else(|| default_data_dir().join("agent"));
    let ca = Arc::new(skiff_agent::join::trusted_ca(server, token, &dir).await?);
    // One balancer for all the nodes, unless --api-balancer=false.
    let lb = match args.api_balancer {
        true => Some(
            skiff_agent::apilb::for_server(
                &server
                    .parse::<http::Uri>()
                    .context("--server is not a URL")?,
            )
            .await?,
        ),
        false => None,
    };
    let following = Arc::new(AtomicBool::new(false));
    let (server, token) = (server.to_string(), token.to_string());
    let connect: skiff_agent::hollow::Connect = Box::new(move |node: String| {
        let (server, token, ca, lb) = (server.clone(), token.clone(), ca.clone(), lb.clone());
        let following = following.clone();
        let ndir = skiff_agent::hollow::node_dir(&dir, &node);
        let joined: std::pin::Pin<
            Box<dyn std::future::Future<Output = Result<kube::Client>> + Send>,
        > = Box::pin(async move {
            let kc = skiff_agent::join::join_with_ca(&server, &token, &node, &ndir, &ca).await?;
            let client = match &lb {
                Some(lb) => lb.client_for(&kc).await?,
                None => skiff_kube::client_from_kubeconfig(&kc).await?,
            };
            let rotating = skiff_agent::join::Rotating::new(client);
            let renew_lb = lb.clone();
            tokio::spawn(skiff_agent::join::keep_renewed(
                rotating.clone(),
                server,
                node,
                ndir,
                move |kc| {
                    let lb = renew_lb.clone();
                    async move {
                        match lb {
                            Some(lb) => lb.client_for(&kc).await,
                            None => skiff_kube::client_from_kubeconfig(&kc).await,
                        }
                    }
                },
            ));
            let client = rotating.client();
            // The first node's client keeps the balancer's servers current.
            if let Some(lb) = lb {
                if !following.swap(true, Ordering::SeqCst) {
                    let follow = client.clone();
                    tokio::spawn(async move { lb.follow_endpoints(follow).await });
                }
            }
            Ok(client)
        });
        joined
    });
    let options = hollow_options(args)?;
    eprintln!(
        "skiff: running {} hollow node(s) {}-0…, each joining with its own identity",
        options.nodes, options.prefix
    );
    tokio::select! {
        r = skiff_agent::hollow::run_as(skiff_agent::hollow::Identities::PerNode(connect), options) => r,
        _ = shutdown_signal() => Ok(()),
    }
}

async fn agent(args: AgentArgs) -> Result<()> {
    // Bad node flags stop the start before anything runs.
    args.node.eviction.config()?;
    args.node.reclaim.config()?;
    if args.simulate {
        if let (Some(server), Some(token)) = (&args.server, &args.token) {
            return run_hollow_joined(&args, server, token).await;
        }
    }
    let mut joined = None;
    let kubeconfig = match (&args.kubeconfig, &args.server, &args.token) {
        (Some(k), _, _) => k.clone(),
        (None, Some(server), Some(token)) => {
            let dir = args
                .data_dir
                .clone()
                .unwrap_or_else(|| default_data_dir().join("agent"));
            let node = args.node.node_name.clone().unwrap_or_else(hostname);
            let kc = skiff_agent::join::join(server, token, &node, &dir).await?;
            joined = Some((server.clone(), node, dir));
            kc
        }
        _ => anyhow::bail!("give --kubeconfig, or --server and --token"),
    };
    if args.simulate && !args.api_balancer && joined.is_none() {
        // Hollow nodes talk to the kubeconfig's server directly, as
        // kubemark's do: through the balancer each of 10,000 nodes' watch
        // connections took three descriptors of this process (client,
        // balancer's accepted and upstream sockets), past the 20,000 limit.
        let client = skiff_kube::client_from_kubeconfig(&kubeconfig).await?;
        return run_hollow(&args, client).await;
    }
    // Through the balancer that follows every API server.
    let (client, balancer) = skiff_agent::apilb::client_for_kubeconfig(&kubeconfig).await?;
    // A joined node renews its own client certificate while it runs.
    let client = match joined {
        Some((server, node, dir)) => {
            let rotating = skiff_agent::join::Rotating::new(client);
            let lb = balancer.clone();
            tokio::spawn(skiff_agent::join::keep_renewed(
                rotating.clone(),
                server,
                node,
                dir,
                move |kc| {
                    let lb = lb.clone();
                    async move { lb.client_for(&kc).await }
                },
            ));
            rotating.client()
        }
        None => client,
    };
    let follow = client.clone();
    tokio::spawn(async move { balancer.follow_endpoints(follow).await });
    if args.simulate {
        return run_hollow(&args, client).await;
    }
    let data_dir = args
        .data_dir
        .clone()
        .unwrap_or_else(|| default_data_dir().join("agent"));
    let options = agent_options(
        &args.node,
        &args.dns,
        data_dir,
        ca_from_kubeconfig(&kubeconfig)?,
        &args.cluster_cidr,
    )?;
    let t0 = std::time::Instant::now();
    let progress = move |m: &str| eprintln!("[{:6.2}s] {m}", t0.elapsed().as_secs_f64());
    tokio::select! {
        r = skiff_agent::run(client, options, &progress) => r,
        _ = shutdown_signal() => {
            eprintln!("skiff: agent stopping; containers keep running");
            Ok(())
        }
    }
}

async fn up(args: UpArgs) -> Result<()> {
    // Bad node flags stop the start before the server runs.
    args.node.eviction.config()?;
    args.node.reclaim.config()?;
    let t0 = std::time::Instant::now();
    let progress = move |m: &str| eprintln!("[{:6.2}s] {m}", t0.elapsed().as_secs_f64());
    let s = start_server(&args.server).await?;
    let addr = s.listener.local_addr()?;
    progress(&format!(
        "API server on https://{addr}, store in {}",
        s.data_dir.display()
    ));
    let tls = s.pki.server_tls()?;
    let router = s.router();
    let listener = s.listener;
    if let Some(l) = s.pod_listener {
        let (tls, router) = (tls.clone(), router.clone());
        tokio::spawn(async move {
            skiff_apiserver::serve::serve_tls_checked(l, tls, router, std::future::pending()).await;
        });
    }
    tokio::spawn(async move {
        skiff_apiserver::serve::serve_tls_checked(listener, tls, router, std::future::pending())
            .await;
    });
    spawn_control_loops(
        in_process_as(&s.api, "system:kube-controller-manager"),
        in_process_as(&s.api, "system:kube-scheduler"),
        !args.server.disable_scheduler,
        !args.server.disable_controllers,
        &args.server.cluster_cidr,
        Some(s.pki.ca.cert_pem.clone()),
        args.server.node_monitor_grace_period,
    );
    progress("scheduler and controllers started");
    let mut node = args.node.clone();
    if node.pod_cidr.is_none() {
        // The single node of `skiff up` takes the first /24 of the cluster
        // CIDR, as the node IPAM controller would give it.
        node.pod_cidr = Some(first_subnet(&args.server.cluster_cidr));
    }
    // One cluster DNS address for the kube-dns Service and the agent.
    let mut dns = args.server.dns.clone();
    dns.cluster_dns = Some(skiff_apiserver::lifecycle::cluster_dns_ip(
        &s.api.state.registry.config,
    ));
    let options = agent_options(
        &node,
        &dns,
        s.data_dir.join("agent"),
        Some(s.pki.ca.cert_pem.clone()),
        &args.server.cluster_cidr,
    )?;
    let node_name = options.node_name.clone();
    // The agent acts as its node, as a joined agent does: the Node
    // authorizer and NodeRestriction apply to it.
    let client = kube::Client::new(
        s.api.router_as(skiff_apiserver::auth::Identity::new(
            format!("system:node:{node_name}"),
            vec!["system:nodes".into()],
        )),
        "default",
    );
    let agent_client = client.clone();
    let agent =
        tokio::spawn(async move { skiff_agent::run(agent_client, options, &progress).await });
    // Wait for the node to be Ready.
    let nodes: kube::Api<k8s_openapi::api::core::v1::Node> = kube::Api::all(client.clone());
    let ready = async {
        loop {
            if let Ok(Some(n)) = nodes.get_opt(&node_name).await {
                let is_ready = n
                    .status
                    .and_then(|s| s.conditions)
                    .unwrap_or_default()
                    .iter()
                    .any(|c| c.type_ == "Ready" && c.status == "True");
                let has_cidr = n.spec.and_then(|s| s.pod_cidr).is_some();
                if is_ready && has_cidr {
                    return;
                }
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    };
    tokio::select! {
        _ = ready => {}
        r = agent => {
            return match r {
                Ok(Ok(())) => Ok(()),
                Ok(Err(e)) => Err(e.context("the agent stopped")),
                Err(e) => Err(anyhow::anyhow!("the agent failed: {e}")),
            };
        }
    }
    progress(&format!("node {node_name} Ready"));
    eprintln!(
        "skiff is up. Use it with:\n  export KUBECONFIG={}\n  kubectl get nodes\nCtrl-C stops skiff; containers keep running until `skiff down`.",
        s.kubeconfig_path.display()
    );
    shutdown_signal().await;
    eprintln!("skiff: stopping (containers keep running; `skiff down` stops them)");
    Ok(())
}

fn first_subnet(cluster_cidr: &str) -> String {
    let ip = cluster_cidr.split('/').next().unwrap_or("10.42.0.0");
    let parts: Vec<&str> = ip.split('.').collect();
    if parts.len() == 4 {
        format!("{}.{}.0.0/24", parts[0], parts[1])
    } else {
        "10.42.0.0/24".into()
    }
}

async fn down(args: DownArgs) -> Result<()> {
    let data_dir = args.data_dir.clone().unwrap_or_else(default_data_dir);
    let layout = skiff_agent::containerd::Layout::new(&data_dir.join("agent"));
    if layout.socket().exists() {
        if let Ok(cri) = skiff_agent::cri::Cri::connect(&layout.socket()).await {
            use skiff_agent::runtime::Runtime;
            let sandboxes = cri.list_sandboxes(None).await.unwrap_or_default();
            for sb in &sandboxes {
                let _ = cri.stop_sandbox(&sb.id).await;
                let _ = cri.remove_sandbox(&sb.id).await;
            }
            eprintln!("skiff: removed {} pod sandbox(es)", sandboxes.len());
        }
        skiff_agent::containerd::stop(&layout)?;
        eprintln!("skiff: stopped containerd");
        let bridge = skiff_agent::bridge_name(&data_dir.join("agent"));
        let _ = std::process::Command::new("ip")
            .args(["link", "del", &bridge])
            .output();
    }
    let table = skiff_agent::proxy::table_name(&data_dir.join("agent"));
    match skiff_agent::proxy::nft::delete_table(&table) {
        Ok(()) => eprintln!("skiff: removed the service proxy's rules"),
        Err(e) => eprintln!("skiff: could not remove the nftables table {table}: {e}"),
    }
    match skiff_agent::net::teardown(&data_dir.join("agent")).await {
        Ok(()) => {}
        Err(e) => eprintln!("skiff: removing pod routes: {e}"),
    }
    if let Err(e) = skiff_agent::dns::teardown(&data_dir.join("agent")).await {
        eprintln!("skiff: removing the cluster DNS address: {e}");
    }
    let pods = data_dir.join("agent").join("pods");
    skiff_agent::inputs::unmount_all(&pods);
    if args.purge {
        // Mounts under the containerd root (overlay snapshots) go with it.
        skiff_agent::inputs::unmount_all(&data_dir);
        std::fs::remove_dir_all(&data_dir)
            .or_else(|e| {
                if e.kind() == std::io::ErrorKind::NotFound {
                    Ok(())
                } else {
                    Err(e)
                }
            })
            .with_context(|| format!("removing {}", data_dir.display()))?;
        eprintln!("skiff: removed {}", data_dir.display());
    }
    Ok(())
}

async fn image(cmd: ImageCommand) -> Result<()> {
    match cmd {
        ImageCommand::Import {
            file,
            data_dir,
            containerd,
        } => {
            let socket = match containerd {
                Some(s) => s,
                None => {
                    let d = data_dir.unwrap_or_else(default_data_dir);
                    // `skiff up` keeps the agent under DATA/agent.
                    let nested = skiff_agent::containerd::Layout::new(&d.join("agent")).socket();
                    if nested.exists() {
                        nested
                    } else {
                        skiff_agent::containerd::Layout::new(&d).socket()
                    }
                }
            };
            skiff_agent::image::import(&socket, &file)?;
            eprintln!("skiff: imported {}", file.display());
            Ok(())
        }
        ImageCommand::BuildBusybox {
            busybox,
            tag,
            output,
        } => {
            std::fs::write(
                &output,
                skiff_agent::image::busybox_archive(&busybox, &tag)?,
            )?;
            eprintln!("skiff: wrote {tag} to {}", output.display());
            Ok(())
        }
        ImageCommand::BuildPause { output } => {
            std::fs::write(&output, skiff_agent::image::pause_archive()?)?;
            Ok(())
        }
    }
}

async fn scheduler(args: SchedulerArgs) -> Result<()> {
    let client = skiff_kube::client_from_kubeconfig(&args.kubeconfig).await?;
    // The file is read here too for its leader election (and is refused
    // before anything starts if it is malformed).
    let from_file = match &args.config {
        Some(path) => skiff_scheduler::config::Config::load(path)?.leader_elect,
        None => None,
    };
    let id = identity();
    let leader_elect = args.leader_elect.or(from_file).unwrap_or(true);
    let options = skiff_scheduler::Options {
        config_file: args.config.clone(),
        instance: (!leader_elect).then(|| id.clone()),
        ..Default::default()
    };
    if !leader_elect {
        return tokio::select! {
            r = skiff_scheduler::run(client, options) => r,
            _ = shutdown_signal() => Ok(()),
        };
    }
    tokio::select! {
        r = skiff_kube::leader::run_elected(client.clone(), "kube-scheduler", &id, Default::default(), skiff_scheduler::run(client, options)) => r,
        _ = shutdown_signal() => Ok(()),
    }
}

async fn controller_manager(args: ControllerManagerArgs) -> Result<()> {
    let client = skiff_kube::client_from_kubeconfig(&args.kubeconfig).await?;
    let ca = ca_from_kubeconfig(&args.kubeconfig)?;
    let options = controller_options(&args.cluster_cidr, ca, args.node_monitor_grace_period);
    let id = identity();
    if !args.leader_elect {
        return tokio::select! {
            r = skiff_controllers::run(client, options) => r,
            _ = shutdown_signal() => Ok(()),
        };
    }
    tokio::select! {
        r = skiff_kube::leader::run_elected(client.clone(), "kube-controller-manager", &id, Default::default(), skiff_controllers::run(client, options)) => r,
        _ = shutdown_signal() => Ok(()),
    }
}

fn main() -> Result<()> {
    // jemalloc returns freed pages to the kernel only when an allocation
    // passes by its arena unless a background thread purges them on time:
    // without it a server that went quiet after a churn kept ~7 KB per pod
    // of freed memory resident (issue 16, B6; BENCHMARKS.md).
    let _ = tikv_jemalloc_ctl::background_thread::write(true);
    let cli = Cli::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("SKIFF_LOG")
                .unwrap_or_else(|_| "warn,skiff=info".into()),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    let _ = rustls::crypto::ring::default_provider().install_default();
    let rt = || {
        tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build()
    };
    match cli.command {
        Command::Version => {
            println!("skiff {} (Kubernetes API v1.33)", env!("CARGO_PKG_VERSION"));
            Ok(())
        }
        Command::Server(args) => rt()?.block_on(server(args)),
        Command::Agent(args) => rt()?.block_on(agent(args)),
        Command::Up(args) => rt()?.block_on(up(args)),
        Command::Down(args) => rt()?.block_on(down(args)),
        Command::Scheduler(args) => rt()?.block_on(scheduler(args)),
        Command::ControllerManager(args) => rt()?.block_on(controller_manager(args)),
        Command::Image(cmd) => rt()?.block_on(image(cmd)),
        Command::Deps(args) => rt()?.block_on(deps::run(args, default_data_dir())),
        Command::Kubeconfig(args) => {
            let data_dir = args.data_dir.unwrap_or_else(default_data_dir);
            let server = match args.server {
                Some(s) => s,
                None => std::fs::read_to_string(data_dir.join("admin.kubeconfig"))
                    .ok()
                    .and_then(|k| {
                        k.lines()
                            .find_map(|l| l.trim().strip_prefix("server: ").map(str::to_string))
                    })
                    .context("no --server and no admin kubeconfig to take it from")?,
            };
            let groups: Vec<&str> = args.groups.iter().map(String::as_str).collect();
            print!(
                "{}",
                skiff_apiserver::tls::user_kubeconfig(
                    &data_dir.join("pki"),
                    &server,
                    &args.user,
                    &groups,
                    args.days
                )?
            );
            Ok(())
        }
    }
}
