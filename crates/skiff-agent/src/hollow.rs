//! Hollow nodes: many simulated nodes in one process, each with its own
//! Node, Lease, pod watch and simulated runtime. They behave as real nodes
//! to the API (registration, heartbeats, pod status), without containers.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Result;

use crate::node::{self, NodeFacts};
use crate::pods::NodeContext;
use crate::sim::Sim;

/// Settings of a set of hollow nodes.
#[derive(Debug, Clone)]
pub struct HollowOptions {
    pub nodes: u32,
    pub prefix: String,
    /// How long a container takes to start.
    pub start_delay: Duration,
    /// How often each pod is looked at without a change (kubelet's sync
    /// frequency). Pods wake sooner for their watch events and for the
    /// simulated runtime's scheduled exits, so this is a backstop.
    pub resync: Duration,
    /// How often each node posts its status when nothing changed
    /// (kubelet's nodeStatusReportFrequency).
    pub status_every: Duration,
    pub lease_every: Duration,
    /// Record Events for pods (kubelet does; off by default at scale).
    pub events: bool,
    pub pod_cidr_base: Option<String>,
    /// Reservations from pods' `skiff.io/simulated-usage` and the
    /// reclaimable capacity published (None: not published).
    pub reclaim: Option<crate::reclaim::Config>,
}

impl Default for HollowOptions {
    fn default() -> Self {
        HollowOptions {
            nodes: 1,
            prefix: "hollow".into(),
            start_delay: Duration::from_millis(0),
            resync: Duration::from_secs(60),
            status_every: Duration::from_secs(300),
            lease_every: Duration::from_secs(10),
            events: false,
            pod_cidr_base: None,
            reclaim: Some(crate::reclaim::Config {
                tick: Duration::from_secs(10),
                ..Default::default()
            }),
        }
    }
}

/// Requests (other than watches) the hollow nodes of one process have in
/// flight at once. Each in-flight request holds a connection: when the
/// server slowed, 10,000 nodes' heartbeats opened connections until the
/// process ran out of file descriptors (20,000 here, beside 10,000 watch
/// connections). Kubelets are separate processes with a connection each;
/// hollow ones share this bound instead (kubemark's hollow nodes share a
/// client rate limit the same way).
pub const MAX_IN_FLIGHT: usize = 512;

/// `client` with at most `limit` requests in flight, watches apart (they
/// last as long as the watch, and each node holds one).
pub fn limited(client: kube::Client, limit: usize) -> kube::Client {
    limited_by(client, Arc::new(tokio::sync::Semaphore::new(limit)))
}

/// `client` taking one of `seats` for each request but watches: clients of
/// several nodes share one bound this way.
pub fn limited_by(client: kube::Client, seats: Arc<tokio::sync::Semaphore>) -> kube::Client {
    let namespace = client.default_namespace().to_string();
    let svc = tower::service_fn(move |req: http::Request<kube::client::Body>| {
        let client = client.clone();
        let seats = seats.clone();
        async move {
            let watch = req
                .uri()
                .query()
                .is_some_and(|q| q.split('&').any(|kv| kv == "watch=true" || kv == "watch=1"));
            let _seat = if watch {
                None
            } else {
                Some(seats.acquire_owned().await.map_err(|e| {
                    kube::Error::Service(Box::new(e) as Box<dyn std::error::Error + Send + Sync>)
                })?)
            };
            client.send(req).await
        }
    });
    kube::Client::new(svc, namespace)
}

/// Makes the API client of the hollow node it is given the name of.
pub type Connect =
    Box<dyn Fn(String) -> futures::future::BoxFuture<'static, Result<kube::Client>> + Send + Sync>;

/// Who the hollow nodes are to the API server.
pub enum Identities {
    /// One client for every node: a kubeconfig whose user may act for all
    /// of them (the admin's, as kubemark's scale tests use).
    Shared(kube::Client),
    /// A client per node with its own credentials (joined with a token,
    /// each through its own CertificateSigningRequest, as each hollow
    /// kubelet of kubemark has its own), so the Node authorizer and
    /// NodeRestriction see each node as itself.
    PerNode(Connect),
}

/// How many nodes obtain their credentials at once.
const JOINS_AT_ONCE: usize = 16;

/// The directory of hollow node `node`'s credentials under the agent's
/// data dir.
pub fn node_dir(data_dir: &std::path::Path, node: &str) -> std::path::PathBuf {
    data_dir.join("hollow").join(node)
}

/// Registers the nodes `PREFIX-0` … `PREFIX-(N-1)` and runs them until an
/// unrecoverable error.
pub async fn run(client: kube::Client, options: HollowOptions) -> Result<()> {
    run_as(Identities::Shared(client), options).await
}

/// [`run`] with the nodes' identities given.
pub async fn run_as(identities: Identities, options: HollowOptions) -> Result<()> {
    use futures::StreamExt;
    // Heartbeats (registration, Leases, node status) have their own bound,
    // as kubelet has its own heartbeat client: with one shared bound, a
    // server slowed by the pod churn queued the Leases behind thousands of
    // pod status writes until they expired and the nodes went Unknown.
    let heartbeat_seats = Arc::new(tokio::sync::Semaphore::new(MAX_IN_FLIGHT / 2));
    let seats = Arc::new(tokio::sync::Semaphore::new(MAX_IN_FLIGHT));
    let names: Vec<String> = (0..options.nodes)
        .map(|i| format!("{}-{i}", options.prefix))
        .collect();
    // Each node's client, in order; per-node credentials are obtained a
    // few at a time ahead of the registrations.
    let mut clients = match identities {
        Identities::Shared(client) => futures::stream::iter(
            names
                .clone()
                .into_iter()
                .map(move |_| Ok::<_, anyhow::Error>(client.clone())),
        )
        .boxed(),
        Identities::PerNode(connect) => futures::stream::iter(names.clone())
            .map(move |name| {
                let joined = connect(name.clone());
                async move {
                    joined
                        .await
                        .map_err(|e| e.context(format!("hollow node {name} joining the cluster")))
                }
            })
            .buffered(JOINS_AT_ONCE)
            .boxed(),
    };
    let mut loops = tokio::task::JoinSet::new();
    let mut pods = tokio::task::JoinSet::new();
    for (i, name) in names.into_iter().enumerate() {
        let own = match clients.next().await {
            Some(c) => c?,
            None => break,
        };
        let heartbeats = limited_by(own.clone(), heartbeat_seats.clone());
        let client = limited_by(own, seats.clone());
        let facts = NodeFacts::hollow(&name, 0);
        // Registration is retried, as kubelet retries it: one refused
        // request (a server busy with 10,000 nodes' first heartbeats) must
        // not stop the other nodes. A refusal of this identity is not
        // retried: it will not change, and the user must hear why.
        let mut failures = 0u32;
        let n = loop {
            match node::register(&heartbeats, &facts).await {
                Ok(n) => break n,
                Err(e) if node::is_refusal(&e) => {
                    return Err(node::refusal(&heartbeats, &name, e).await);
                }
                Err(e) if failures < 30 => {
                    failures += 1;
                    tracing::warn!(node = name, error = %e, "registering the node failed; retrying");
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
                Err(e) => return Err(e),
            }
        };
        let uid = n.metadata.uid.clone().unwrap_or_default();
        // Spread the nodes' heartbeats over the period, as independent
        // kubelets' are, rather than in one burst.
        // The first renewal at once (the Lease exists from registration
        // on, as kubelet's does).
        let jitter = options.lease_every.mul_f64(rand::random::<f64>());
        let leases: kube::Api<k8s_openapi::api::coordination::v1::Lease> =
            kube::Api::namespaced(heartbeats.clone(), "kube-node-lease");
        let lease = node::renew_lease_forever(
            heartbeats.clone(),
            name.clone(),
            uid.clone(),
            options.lease_every,
        );
        let first = name.clone();
        loops.spawn(async move {
            if let Err(e) = node::renew_lease(&leases, &first, &uid).await {
                tracing::warn!(node = first, error = %e, "creating the node lease failed");
            }
            tokio::time::sleep(jitter).await;
            lease.await
        });
        let jitter = options.status_every.mul_f64(rand::random::<f64>());
        let status = node::report_status_forever(heartbeats.clone(), facts, options.status_every);
        loops.spawn(async move {
            tokio::time::sleep(jitter).await;
            status.await
        });
        let mut allocatable = BTreeMap::new();
        allocatable.insert("cpu".to_string(), 4.0);
        let ctx = Arc::new(NodeContext {
            client: client.clone(),
            runtime: Arc::new(Sim::new(i as u32, options.start_delay)),
            node_name: name,
            host_ip: "127.0.0.1".into(),
            data_dir: std::env::temp_dir(),
            allocatable,
            events: options.events,
            resync: options.resync,
            // Hollow nodes serve no DNS (their pods run nothing).
            dns: Default::default(),
            // Nor set containers' environments.
            services: crate::svcenv::Services::fixed(Default::default()),
            host: Arc::new(crate::host::RealHost),
            clock: Arc::new(crate::clock::SystemClock),
            // What `NodeFacts::hollow` registers.
            allocations: crate::pods::resize::Book::new(4000, 32 << 30),
            batch_cgroup_parent: None,
        });
        // Each node's pod watch starts as the node registers (kubelets do
        // not all start at once) and runs as its own task: started all
        // together after the last registration, 10,000 nodes' lists and
        // watches arrived in one burst of new connections, and as one
        // joined future they were all driven by a single thread.
        let index = crate::reclaim::PodIndex::default();
        let (evict_tx, evict_rx) = tokio::sync::mpsc::unbounded_channel();
        if let Some(config) = options.reclaim.clone() {
            loops.spawn(crate::reclaim::run(
                client.clone(),
                ctx.node_name.clone(),
                crate::reclaim::Amount::new(4000.0, 32.0 * 1024.0 * 1024.0 * 1024.0),
                index.clone(),
                crate::reclaim::UsageSource::Simulated,
                config,
                evict_tx,
                Default::default(),
            ));
        }
        pods.spawn(crate::manage_pods_indexed(ctx, index, evict_rx));
    }
    // Dropping this future (cancellation) drops the loops with it.
    let outcome = match pods.join_next().await {
        Some(Ok(r)) => r,
        Some(Err(e)) => Err(anyhow::anyhow!("a hollow node's pod manager failed: {e}")),
        None => Ok(()),
    };
    drop(loops);
    outcome
}
