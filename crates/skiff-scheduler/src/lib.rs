//! The scheduler: a plugin framework with Kubernetes' extension points and
//! placement semantics, a scheduling queue, and a node cache with assumed
//! pods; it binds through `pods/binding`.
//!
//! - `framework` — extension-point traits, `Status`, `CycleState`, `Framework`.
//! - `plugins` — the built-in plugins and their registry.
//! - `config` — profiles from a KubeSchedulerConfiguration file.
//! - `queue` — active / back-off / unschedulable pods.
//! - `cache` — nodes with their pods (bound and assumed).
//! - `scheduler` — watches, the scheduling loop, binding, events.
//! - `lean_pod` — pods as the scheduler watches them (no managedFields).

pub mod cache;
pub mod config;
pub mod events;
pub mod framework;
pub mod lean_pod;
pub mod metrics;
pub mod plugins;
pub mod quantity;
pub mod queue;
pub mod scheduler;
pub mod shard;
pub mod testing;
pub mod types;

use std::sync::Arc;

pub use metrics::Metrics;

/// The scheduler name of the default profile.
pub const DEFAULT_SCHEDULER_NAME: &str = "default-scheduler";

/// Options of the scheduler.
#[derive(Debug, Clone, Default)]
pub struct Options {
    /// A KubeSchedulerConfiguration file (YAML or JSON).
    pub config_file: Option<std::path::PathBuf>,
    /// Counters to report into (the benchmark reads them); fresh if unset.
    pub metrics: Option<Arc<Metrics>>,
    /// Share the profiles' pods with the other instances running them
    /// (no leader election), as this instance name ([`shard`]).
    pub instance: Option<String>,
}

/// Runs the scheduler until an unrecoverable error.
pub async fn run(client: kube::Client, options: Options) -> anyhow::Result<()> {
    let config = match &options.config_file {
        Some(path) => config::Config::load(path)?,
        None => config::Config::default(),
    };
    let metrics = options.metrics.clone().unwrap_or_default();
    let ctx = plugins::FactoryContext {
        client: Some(client.clone()),
        metrics: metrics.clone(),
    };
    let profiles = config.build(&ctx)?;
    tracing::info!(
        profiles = ?profiles.iter().map(|p| p.scheduler_name.as_str()).collect::<Vec<_>>(),
        "scheduler starting"
    );
    let mut scheduler = scheduler::Scheduler::new(client.clone(), profiles.clone(), metrics)?;
    if let Some(me) = options.instance.clone() {
        let group = shard::group_of(profiles.iter().map(|p| p.scheduler_name.as_str()));
        let (tx, members) = tokio::sync::watch::channel(Vec::new());
        tokio::spawn(shard::run(client, group, me.clone(), tx));
        scheduler = scheduler.with_ownership(shard::Ownership { me, members });
    }
    scheduler.run().await
}
