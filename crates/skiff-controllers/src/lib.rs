//! The controller manager: level-triggered reconcile loops over watches.
//! Every controller can be stopped at any moment and resumes from what it
//! observes: decisions come from the informer caches (one watch per kind,
//! shared by all controllers), expectations keep a controller from acting
//! twice on a change its cache has not shown yet, and names are
//! deterministic where Kubernetes makes them so.
//!
//! `framework` holds the caches, work queues and workers, `controller`
//! the builder every controller is assembled with; `events` the
//! Event recorder; `metrics` the Prometheus text; one module per
//! controller. Namespace deletion is done by the API server itself.

pub mod clusterroleaggregation;
pub mod common;
pub mod controller;
pub mod cron;
pub mod cronjob;
pub mod daemonset;
pub mod dependencies;
pub mod deployment;
pub mod disruption;
pub mod disruption_zones;
pub mod endpoints;
pub mod events;
pub mod framework;
pub mod gc;
pub mod hpa;
pub mod job;
pub mod metrics;
pub mod namespaces;
pub mod nodes;
pub mod podgc;
pub mod protection;
pub mod replicaset;
pub mod resourcequota;
pub mod statefulset;
pub mod volumes;

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::apps::v1::{
    ControllerRevision, DaemonSet, Deployment, ReplicaSet, StatefulSet,
};
use k8s_openapi::api::batch::v1::{CronJob, Job};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{
    ConfigMap, Namespace, Node, PersistentVolumeClaim, Pod, ReplicationController, ResourceQuota,
    Secret, Service,
};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::api::Api;
use kube::core::PartialObjectMeta;

use framework::Cache;

/// Options of the controller manager.
#[derive(Debug, Clone)]
pub struct Options {
    /// Controllers to run, as kube-controller-manager's `--controllers`:
    /// empty or `*` means all, a name enables one, `-name` disables one.
    /// Names: replicaset, replicationcontroller, deployment, job, cronjob,
    /// daemonset, statefulset, garbagecollector, serviceaccount,
    /// root-ca-cert-publisher, nodeipam, nodelifecycle, endpoints,
    /// endpointslice, disruption, podgc, resourcequota,
    /// clusterrole-aggregation, horizontalpodautoscaling,
    /// persistentvolume-binder, pvc-protection, pv-protection,
    /// dependencies (skiff's declared dependencies).
    pub controllers: Vec<String>,
    /// The cluster CA, published as `kube-root-ca.crt` in every namespace.
    pub root_ca_pem: Option<String>,
    /// Pod addresses; each node gets a /24 of it.
    pub cluster_cidr: String,
    /// How long a node may go without renewing its Lease before it is
    /// marked Unknown and tainted unreachable.
    pub node_monitor_grace_period: Duration,
    /// Terminated pods kept before the pod GC deletes the oldest.
    pub terminated_pod_gc_threshold: usize,
    /// Concurrent reconciles per workload controller.
    pub workers: usize,
    /// The time the CronJob controller goes by (tests move it forward).
    pub clock: Clock,
    /// A Job's first retry after a failed pod waits this long, doubling per
    /// failure up to 6 minutes (Kubernetes: 10 s).
    pub job_backoff_base: Duration,
}

/// Wall-clock time plus an offset that tests can advance.
#[derive(Clone, Default)]
pub struct Clock(Arc<std::sync::atomic::AtomicI64>);

impl std::fmt::Debug for Clock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Clock(+{}s)", self.offset())
    }
}

impl Clock {
    pub fn now(&self) -> k8s_openapi::jiff::Timestamp {
        common::plus(common::now(), self.offset())
    }
    pub fn offset(&self) -> i64 {
        self.0.load(std::sync::atomic::Ordering::SeqCst)
    }
    /// Moves this clock (and every copy of it) `secs` seconds forward.
    pub fn advance(&self, secs: i64) {
        self.0.fetch_add(secs, std::sync::atomic::Ordering::SeqCst);
    }
}

impl Default for Options {
    fn default() -> Self {
        Options {
            controllers: vec![],
            root_ca_pem: None,
            cluster_cidr: "10.42.0.0/16".into(),
            node_monitor_grace_period: Duration::from_secs(50),
            terminated_pod_gc_threshold: 12500,
            workers: 8,
            clock: Clock::default(),
            job_backoff_base: Duration::from_secs(10),
        }
    }
}

/// All controller names, in the order they start.
pub const CONTROLLERS: &[&str] = &[
    "replicaset",
    "replicationcontroller",
    "deployment",
    "job",
    "cronjob",
    "daemonset",
    "statefulset",
    "garbagecollector",
    "serviceaccount",
    "root-ca-cert-publisher",
    "nodeipam",
    "nodelifecycle",
    "endpoints",
    "endpointslice",
    "disruption",
    "podgc",
    "resourcequota",
    "clusterrole-aggregation",
    "horizontalpodautoscaling",
    "persistentvolume-binder",
    "pvc-protection",
    "pv-protection",
    "dependencies",
];

impl Options {
    /// Whether controller `name` runs under these options.
    pub fn enabled(&self, name: &str) -> bool {
        if self.controllers.iter().any(|c| c == &format!("-{name}")) {
            return false;
        }
        self.controllers.is_empty()
            || self.controllers.iter().any(|c| c == name || c == "*")
            || self.controllers.iter().all(|c| c.starts_with('-'))
    }
}

/// Why a reconcile failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("API: {0}")]
    Kube(#[from] kube::Error),
    #[error("encoding: {0}")]
    Json(#[from] serde_json::Error),
    #[error("{0}")]
    Other(String),
}

/// The informer caches the controllers share (one watch per kind).
pub struct Caches {
    pub pods: Arc<Cache<Pod>>,
    pub replicasets: Arc<Cache<ReplicaSet>>,
    pub replication_controllers: Arc<Cache<ReplicationController>>,
    pub deployments: Arc<Cache<Deployment>>,
    pub jobs: Arc<Cache<Job>>,
    pub cronjobs: Arc<Cache<CronJob>>,
    pub daemonsets: Arc<Cache<DaemonSet>>,
    pub statefulsets: Arc<Cache<StatefulSet>>,
    pub controller_revisions: Arc<Cache<ControllerRevision>>,
    pub pvcs: Arc<Cache<PersistentVolumeClaim>>,
    pub pdbs: Arc<Cache<PodDisruptionBudget>>,
    pub namespaces: Arc<Cache<Namespace>>,
    pub services: Arc<Cache<Service>>,
    pub endpoint_slices: Arc<Cache<EndpointSlice>>,
    pub network_policies: Arc<Cache<NetworkPolicy>>,
    pub nodes: Arc<Cache<Node>>,
    pub leases: Arc<Cache<Lease>>,
    pub resource_quotas: Arc<Cache<ResourceQuota>>,
    /// ConfigMaps and Secrets by their metadata only (what quotas count).
    pub configmaps: Arc<Cache<PartialObjectMeta<ConfigMap>>>,
    pub secrets: Arc<Cache<PartialObjectMeta<Secret>>>,
}

impl Caches {
    fn new() -> Caches {
        Caches {
            pods: Cache::new(),
            replicasets: Cache::new(),
            replication_controllers: Cache::new(),
            deployments: Cache::new(),
            jobs: Cache::new(),
            cronjobs: Cache::new(),
            daemonsets: Cache::new(),
            statefulsets: Cache::new(),
            controller_revisions: Cache::new(),
            pvcs: Cache::new(),
            pdbs: Cache::new(),
            namespaces: Cache::new(),
            services: Cache::new(),
            endpoint_slices: Cache::new(),
            network_policies: Cache::new(),
            nodes: Cache::new(),
            leases: Cache::new(),
            resource_quotas: Cache::new(),
            configmaps: Cache::new(),
            secrets: Cache::new(),
        }
    }

    fn start(&self, client: &kube::Client, tasks: &mut tokio::task::JoinSet<()>) {
        let c = || client.clone();
        self.pods.start(Api::all(c()), tasks);
        self.replicasets.start(Api::all(c()), tasks);
        self.replication_controllers.start(Api::all(c()), tasks);
        self.deployments.start(Api::all(c()), tasks);
        self.jobs.start(Api::all(c()), tasks);
        self.cronjobs.start(Api::all(c()), tasks);
        self.daemonsets.start(Api::all(c()), tasks);
        self.statefulsets.start(Api::all(c()), tasks);
        self.controller_revisions.start(Api::all(c()), tasks);
        self.pvcs.start(Api::all(c()), tasks);
        self.pdbs.start(Api::all(c()), tasks);
        self.namespaces.start(Api::all(c()), tasks);
        self.services.start(Api::all(c()), tasks);
        self.endpoint_slices.start(Api::all(c()), tasks);
        self.network_policies.start(Api::all(c()), tasks);
        self.nodes.start(Api::all(c()), tasks);
        self.leases
            .start(Api::namespaced(c(), "kube-node-lease"), tasks);
        self.resource_quotas.start(Api::all(c()), tasks);
        self.configmaps.start(Api::all(c()), tasks);
        self.secrets.start(Api::all(c()), tasks);
    }

    /// Waits until every cache has its first list.
    pub async fn ready(&self) {
        self.pods.ready().await;
        self.replicasets.ready().await;
        self.replication_controllers.ready().await;
        self.deployments.ready().await;
        self.jobs.ready().await;
        self.cronjobs.ready().await;
        self.daemonsets.ready().await;
        self.statefulsets.ready().await;
        self.controller_revisions.ready().await;
        self.pvcs.ready().await;
        self.pdbs.ready().await;
        self.namespaces.ready().await;
        self.services.ready().await;
        self.endpoint_slices.ready().await;
        self.network_policies.ready().await;
        self.nodes.ready().await;
        self.leases.ready().await;
        self.resource_quotas.ready().await;
        self.configmaps.ready().await;
        self.secrets.ready().await;
    }
}

/// What every controller gets.
pub struct Ctx {
    pub client: kube::Client,
    pub caches: Caches,
    pub events: events::Recorder,
    pub options: Options,
}

impl Ctx {
    /// A future that resolves once the caches are listed.
    pub fn ready(self: &Arc<Self>) -> impl std::future::Future<Output = ()> + Send + 'static {
        let me = self.clone();
        async move { me.caches.ready().await }
    }
}

/// The controllers' metrics in Prometheus' text format.
pub fn metrics_text() -> String {
    metrics::text()
}

/// Runs every enabled controller until one stops (which is a bug: they
/// retry errors forever) or the future is dropped.
pub async fn run(client: kube::Client, options: Options) -> anyhow::Result<()> {
    let mut tasks = tokio::task::JoinSet::new();
    let events = events::Recorder::new(client.clone(), &mut tasks);
    let ctx = Arc::new(Ctx {
        client: client.clone(),
        caches: Caches::new(),
        events,
        options: options.clone(),
    });
    let on = |n: &str| options.enabled(n);
    let t = &mut tasks;
    if on("replicaset") {
        replicaset::register(&ctx, t, replicaset::Flavor::ReplicaSet);
    }
    if on("replicationcontroller") {
        replicaset::register(&ctx, t, replicaset::Flavor::ReplicationController);
    }
    if on("deployment") {
        deployment::register(&ctx, t);
    }
    if on("job") {
        job::register(&ctx, t);
    }
    if on("cronjob") {
        cronjob::register(&ctx, t);
    }
    if on("daemonset") {
        daemonset::register(&ctx, t);
    }
    if on("statefulset") {
        statefulset::register(&ctx, t);
    }
    if on("garbagecollector") {
        gc::register(&ctx, t);
    }
    if on("serviceaccount") || on("root-ca-cert-publisher") {
        namespaces::register(&ctx, t, on("serviceaccount"), on("root-ca-cert-publisher"));
    }
    if on("nodeipam") {
        nodes::register_ipam(&ctx, t);
    }
    if on("nodelifecycle") {
        nodes::register_lifecycle(&ctx, t);
    }
    if on("endpoints") || on("endpointslice") {
        endpoints::register(&ctx, t, on("endpoints"), on("endpointslice"));
    }
    if on("disruption") {
        disruption::register(&ctx, t);
    }
    if on("podgc") {
        podgc::register(&ctx, t);
    }
    if on("resourcequota") {
        resourcequota::register(&ctx, t);
    }
    if on("clusterrole-aggregation") {
        clusterroleaggregation::register(&ctx, t);
    }
    if on("horizontalpodautoscaling") {
        hpa::register(&ctx, t);
    }
    if on("persistentvolume-binder") {
        volumes::register(&ctx, t);
    }
    if on("pvc-protection") {
        protection::register_pvc(&ctx, t);
    }
    if on("pv-protection") {
        protection::register_pv(&ctx, t);
    }
    if on("dependencies") {
        dependencies::register(&ctx, t);
    }
    ctx.caches.start(&client, t);
    match tasks.join_next().await {
        Some(Err(e)) if e.is_panic() => anyhow::bail!("a controller panicked: {e}"),
        _ => anyhow::bail!("a controller stopped"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn controllers_are_chosen_like_kube_controller_managers_flag() {
        let o = |v: &[&str]| Options {
            controllers: v.iter().map(|s| s.to_string()).collect(),
            ..Default::default()
        };
        assert!(o(&[]).enabled("job"));
        assert!(o(&["*"]).enabled("job"));
        assert!(o(&["*", "-job"]).enabled("deployment"));
        assert!(!o(&["*", "-job"]).enabled("job"));
        assert!(!o(&["-job"]).enabled("job"));
        assert!(o(&["-job"]).enabled("cronjob"));
        assert!(o(&["job"]).enabled("job"));
        assert!(!o(&["job"]).enabled("deployment"));
    }
}
