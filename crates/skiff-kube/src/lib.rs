//! What every API client inside skiff shares: a `kube::Client` built from a
//! kubeconfig file or wired straight into an in-process API server, leader
//! election through a `coordination.k8s.io` Lease, and a throwaway cluster for
//! tests.
//!
//! The scheduler, the controllers and the agent take a `kube::Client` and do
//! not care which transport is under it: in `skiff server` and `skiff up` the
//! client calls the API server's router directly (still through
//! authentication, admission and validation), alone they go over HTTPS.
//! The in-process parts are behind the `in-process` feature, which only the
//! `skiff` binary and tests enable: the scheduler, controllers and agent do
//! not link the API server or the store.

pub mod leader;
#[cfg(feature = "in-process")]
pub mod testing;

use std::path::Path;

use anyhow::{Context, Result};

/// A client for the cluster a kubeconfig file points at.
pub async fn client_from_kubeconfig(path: &Path) -> Result<kube::Client> {
    let kubeconfig = kube::config::Kubeconfig::read_from(path)
        .with_context(|| format!("reading kubeconfig {}", path.display()))?;
    let config = kube::Config::from_custom_kubeconfig(
        kubeconfig,
        &kube::config::KubeConfigOptions::default(),
    )
    .await
    .with_context(|| format!("loading kubeconfig {}", path.display()))?;
    kube::Client::try_from(config).context("building a client from the kubeconfig")
}

/// A client whose requests go straight into `api`'s router, authenticated as
/// `system:<component>` (feature `in-process`).
#[cfg(feature = "in-process")]
pub fn in_process(api: &skiff_apiserver::ApiServer, component: &str) -> kube::Client {
    kube::Client::new(api.in_process_router(component), "default")
}
