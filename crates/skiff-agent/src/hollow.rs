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
    let namespace = client.default_namespace().to_string();
    let seats = Arc::new(tokio::sync::Semaphore::new(limit));
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

/// Registers the nodes `PREFIX-0` … `PREFIX-(N-1)` and runs them until an
/// unrecoverable error.
pub async fn run(client: kube::Client, options: HollowOptions) -> Result<()> {
    // Heartbeats (registration, Leases, node status) have their own bound,
    // as kubelet has its own heartbeat client: with one shared bound, a
    // server slowed by the pod churn queued the Leases behind thousands of
    // pod status writes until they expired and the nodes went Unknown.
    let heartbeats = limited(client.clone(), MAX_IN_FLIGHT / 2);
    let client = limited(client, MAX_IN_FLIGHT);
    let mut loops = tokio::task::JoinSet::new();
    let mut pods = tokio::task::JoinSet::new();
    for i in 0..options.nodes {
        let name = format!("{}-{i}", options.prefix);
        let facts = NodeFacts::hollow(&name, 0);
        // Registration is retried, as kubelet retries it: one refused
        // request (a server busy with 10,000 nodes' first heartbeats) must
        // not stop the other nodes.
        let mut failures = 0u32;
        let n = loop {
            match node::register(&heartbeats, &facts).await {
                Ok(n) => break n,
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
            runtime: Arc::new(Sim::new(i, options.start_delay)),
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
        });
        // Each node's pod watch starts as the node registers (kubelets do
        // not all start at once) and runs as its own task: started all
        // together after the last registration, 10,000 nodes' lists and
        // watches arrived in one burst of new connections, and as one
        // joined future they were all driven by a single thread.
        pods.spawn(crate::manage_pods(ctx));
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
