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

/// Registers the nodes `PREFIX-0` … `PREFIX-(N-1)` and runs them until an
/// unrecoverable error.
pub async fn run(client: kube::Client, options: HollowOptions) -> Result<()> {
    let mut loops = tokio::task::JoinSet::new();
    let mut tasks = vec![];
    for i in 0..options.nodes {
        let name = format!("{}-{i}", options.prefix);
        let facts = NodeFacts::hollow(&name, 0);
        let n = node::register(&client, &facts).await?;
        let uid = n.metadata.uid.clone().unwrap_or_default();
        // Spread the nodes' heartbeats over the period, as independent
        // kubelets' are, rather than in one burst.
        // The first renewal at once (the Lease exists from registration
        // on, as kubelet's does).
        let jitter = options.lease_every.mul_f64(rand::random::<f64>());
        let leases: kube::Api<k8s_openapi::api::coordination::v1::Lease> =
            kube::Api::namespaced(client.clone(), "kube-node-lease");
        let lease = node::renew_lease_forever(
            client.clone(),
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
        let status = node::report_status_forever(client.clone(), facts, options.status_every);
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
        });
        tasks.push(crate::manage_pods(ctx));
    }
    // Dropping this future (cancellation) drops the loops with it.
    futures::future::try_join_all(tasks).await?;
    drop(loops);
    Ok(())
}
