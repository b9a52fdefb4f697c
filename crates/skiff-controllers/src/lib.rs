//! The controller manager: level-triggered reconcile loops over watches
//! (kube-runtime's reflectors and controllers). Each can be stopped at any
//! moment and resumes from what it observes: decisions come from the
//! caches, and expectations keep a controller from acting twice on a change
//! its cache has not shown yet.
//!
//! Controllers: ReplicaSet, Deployment, Job; the garbage collector,
//! ServiceAccount and `kube-root-ca.crt` per namespace, node pod-CIDR
//! allocation, Endpoints and EndpointSlices. Namespace deletion is done by
//! the API server itself.

pub mod common;
pub mod deployment;
pub mod job;
pub mod lifecycle;
pub mod replicaset;

use std::collections::{HashMap, HashSet};
use std::fmt::Debug;
use std::hash::Hash;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::apps::v1::{Deployment, ReplicaSet};
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{Namespace, Node, Pod, Service};
use kube::api::Api;
use kube::runtime::controller::{Action, Controller};
use kube::runtime::reflector::{self, Store};
use kube::runtime::{watcher, WatchStreamExt};
use kube::Resource;

/// Options of the controller manager.
#[derive(Debug, Clone)]
pub struct Options {
    /// Controllers to run (empty: all). Names: replicaset, deployment, job,
    /// garbagecollector, serviceaccount, nodeipam, endpoints, nodelifecycle.
    pub controllers: Vec<String>,
    /// The cluster CA, published as `kube-root-ca.crt` in every namespace.
    pub root_ca_pem: Option<String>,
    /// Pod addresses; each node gets a /24.
    pub cluster_cidr: String,
    /// How long a node may go without renewing its Lease before it is
    /// marked Unknown and tainted unreachable.
    pub node_monitor_grace_period: Duration,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            controllers: vec![],
            root_ca_pem: None,
            cluster_cidr: "10.42.0.0/16".into(),
            node_monitor_grace_period: Duration::from_secs(50),
        }
    }
}

/// Why a reconcile failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("API: {0}")]
    Kube(#[from] kube::Error),
    #[error("encoding: {0}")]
    Json(#[from] serde_json::Error),
}

fn metrics() -> &'static Arc<common::Metrics> {
    static M: OnceLock<Arc<common::Metrics>> = OnceLock::new();
    M.get_or_init(Default::default)
}

/// The controllers' metrics in Prometheus' text format.
pub fn metrics_text() -> String {
    metrics().text()
}

fn cache<K>(api: Api<K>, tasks: &mut tokio::task::JoinSet<()>) -> Store<K>
where
    K: Resource + Clone + serde::de::DeserializeOwned + Debug + Send + Sync + 'static,
    K::DynamicType: Default + Eq + Hash + Clone,
{
    let (reader, writer) = reflector::store();
    let stream = reflector::reflector(
        writer,
        watcher(api, watcher::Config::default()).default_backoff(),
    );
    tasks.spawn(async move {
        stream.for_each(|_| async {}).await;
    });
    reader
}

/// Retries a failed reconcile after a few seconds.
fn retry<K, C>(_obj: Arc<K>, err: &Error, _ctx: Arc<C>) -> Action {
    tracing::debug!(error = %err, "reconcile failed; retrying");
    Action::requeue(Duration::from_secs(2))
}

/// Runs every controller until an unrecoverable error.
pub async fn run(client: kube::Client, options: Options) -> anyhow::Result<()> {
    let on = |n: &str| options.controllers.is_empty() || options.controllers.iter().any(|c| c == n);
    let mut tasks = tokio::task::JoinSet::new();
    let caches = Arc::new(lifecycle::Caches {
        pods: cache(Api::<Pod>::all(client.clone()), &mut tasks),
        replicasets: cache(Api::<ReplicaSet>::all(client.clone()), &mut tasks),
        deployments: cache(Api::<Deployment>::all(client.clone()), &mut tasks),
        jobs: cache(Api::<Job>::all(client.clone()), &mut tasks),
        namespaces: cache(Api::<Namespace>::all(client.clone()), &mut tasks),
        services: cache(Api::<Service>::all(client.clone()), &mut tasks),
        nodes: cache(Api::<Node>::all(client.clone()), &mut tasks),
    });
    let leases = cache(
        Api::<k8s_openapi::api::coordination::v1::Lease>::namespaced(
            client.clone(),
            "kube-node-lease",
        ),
        &mut tasks,
    );
    for ready in [
        caches.pods.wait_until_ready().await,
        caches.replicasets.wait_until_ready().await,
        caches.deployments.wait_until_ready().await,
        caches.jobs.wait_until_ready().await,
    ] {
        ready.map_err(|e| anyhow::anyhow!("waiting for the caches: {e}"))?;
    }
    let m = metrics().clone();
    if on("replicaset") {
        let ctx = Arc::new(replicaset::Ctx {
            client: client.clone(),
            pods: caches.pods.clone(),
            expectations: Default::default(),
            metrics: m.clone(),
        });
        let c = Controller::new(
            Api::<ReplicaSet>::all(client.clone()),
            watcher::Config::default(),
        )
        .owns(Api::<Pod>::all(client.clone()), watcher::Config::default())
        .run(replicaset::reconcile, retry, ctx);
        tasks.spawn(async move { c.for_each(|_| async {}).await });
    }
    if on("deployment") {
        let ctx = Arc::new(deployment::Ctx {
            client: client.clone(),
            replicasets: caches.replicasets.clone(),
            pods: caches.pods.clone(),
            metrics: m.clone(),
        });
        let c = Controller::new(
            Api::<Deployment>::all(client.clone()),
            watcher::Config::default(),
        )
        .owns(
            Api::<ReplicaSet>::all(client.clone()),
            watcher::Config::default(),
        )
        .run(deployment::reconcile, retry, ctx);
        tasks.spawn(async move { c.for_each(|_| async {}).await });
    }
    if on("job") {
        let ctx = Arc::new(job::Ctx {
            client: client.clone(),
            pods: caches.pods.clone(),
            expectations: Default::default(),
            metrics: m.clone(),
        });
        let c = Controller::new(Api::<Job>::all(client.clone()), watcher::Config::default())
            .owns(Api::<Pod>::all(client.clone()), watcher::Config::default())
            .run(job::reconcile, retry, ctx);
        tasks.spawn(async move { c.for_each(|_| async {}).await });
    }
    // The sweeps: cheap passes over the caches, once a second.
    {
        let client = client.clone();
        let caches = caches.clone();
        let options = options.clone();
        let gc = on("garbagecollector");
        let sa = on("serviceaccount");
        let ipam = on("nodeipam");
        let eps = on("endpoints");
        let lifecycle_on = on("nodelifecycle");
        let m = m.clone();
        tasks.spawn(async move {
            let mut defaulted: HashSet<String> = HashSet::new();
            let mut endpoints: HashMap<String, serde_json::Value> = HashMap::new();
            loop {
                let t = std::time::Instant::now();
                if gc {
                    lifecycle::gc_pass(&client, &caches).await;
                    m.record("garbagecollector", true, t.elapsed());
                }
                if sa {
                    lifecycle::namespace_defaults_pass(
                        &client,
                        &caches,
                        options.root_ca_pem.as_deref(),
                        &mut defaulted,
                    )
                    .await;
                }
                if ipam {
                    lifecycle::node_ipam_pass(&client, &caches, &options.cluster_cidr).await;
                }
                if eps {
                    lifecycle::endpoints_pass(&client, &caches, &mut endpoints).await;
                }
                if lifecycle_on {
                    lifecycle::node_lifecycle_pass(
                        &client,
                        &caches,
                        &leases,
                        options.node_monitor_grace_period,
                    )
                    .await;
                }
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        });
    }
    // The controllers run until the process ends; if one stops, report it.
    match tasks.join_next().await {
        Some(Err(e)) if e.is_panic() => anyhow::bail!("a controller panicked: {e}"),
        _ => anyhow::bail!("a controller stopped"),
    }
}
