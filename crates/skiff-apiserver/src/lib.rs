//! skiff's Kubernetes-compatible API server: authentication, discovery and
//! OpenAPI, the generic registry with per-kind strategies, the watch cache and
//! watch streams, over HTTPS.
//!
//! Entry points: [`ApiServer::start`] builds everything on a store;
//! [`ApiServer::router`] is the axum router (usable in-process as a
//! `tower::Service`); [`serve::serve_tls`] puts it on a socket.

// `ApiError` carries a whole Kubernetes Status (reason, message, details,
// causes); errors are the slow path, so returning it unboxed is deliberate.
#![allow(clippy::result_large_err)]

pub mod admission;
pub mod aggregator;
pub mod audit;
pub mod auth;
pub mod authz;
pub mod bootstrap_token;
pub mod certificates;
pub mod componentstatus;
pub mod crd;
pub mod defaultclass;
pub mod encryption;
pub mod endpoints;
pub mod fieldmanager;
pub mod flowcontrol;
pub mod handlers;
pub mod kubernetes_endpoints;
pub mod lifecycle;
pub mod metricsapi;
pub mod negotiate;
pub mod nodeproxy;
pub mod noderestriction;
pub mod object;
pub mod options;
pub mod outbound;
pub mod podtoken;
pub mod rawjson;
pub mod registry;
pub mod request;
pub mod response;
pub mod serve;
pub mod slowlog;
pub mod state;
pub mod storageprotection;
pub mod strategy;
pub mod testing;
pub mod tls;
pub mod tokens;
pub mod watch;
pub mod watchcache;
pub mod webhook;

use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use skiff_store::Store;

use crate::options::RegistryConfig;
use crate::registry::Registry;
use crate::state::AppState;
use crate::watchcache::WatchCache;

/// Settings of an API server.
#[derive(Debug, Clone)]
pub struct Config {
    /// `host:port` clients use to reach this server.
    pub advertise: String,
    /// History kept for watches and consistent paging (Kubernetes: 5 minutes).
    pub compact_keep: Duration,
    pub compact_every: Duration,
    pub registry: RegistryConfig,
    /// The client certificate and key (PEM) the server presents to node
    /// agents for logs, exec, attach and port-forward.
    pub kubelet_client: Option<(String, String)>,
    /// Prometheus text served at `/metrics` (the components running in this
    /// process register theirs here); without it `/metrics` is 404.
    pub metrics: Option<fn() -> String>,
    /// Where the ServiceAccount token keys live (created at first start);
    /// without it the server issues and accepts no ServiceAccount tokens.
    pub service_account_key_dir: Option<std::path::PathBuf>,
    /// The `iss` of ServiceAccount tokens (`--service-account-issuer`).
    pub service_account_issuer: String,
    /// Address and port pods reach this server at: the endpoint of the
    /// `kubernetes` Service (none: the Service has no endpoints).
    pub kubernetes_endpoint: Option<(String, u16)>,
    /// Audit logging (`--audit-policy-file`, `--audit-log-path`): every
    /// request through [`ApiServer::router`] is audited.
    pub audit: Option<Arc<audit::Auditor>>,
    /// The cluster CA (certificate and key, PEM) that signs approved
    /// CertificateSigningRequests; without it none is signed.
    pub cluster_signing: Option<(String, String)>,
    /// Where the front-proxy CA (requestheader client CA) lives, made at
    /// first start; without it one is made in memory at every start.
    pub front_proxy_dir: Option<std::path::PathBuf>,
    /// Priority and fairness: seats, queues, watches per user.
    pub flow: flowcontrol::Limits,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            advertise: "127.0.0.1:6443".into(),
            compact_keep: Duration::from_secs(300),
            compact_every: Duration::from_secs(60),
            registry: RegistryConfig::default(),
            kubelet_client: None,
            metrics: None,
            service_account_key_dir: None,
            service_account_issuer: tokens::DEFAULT_ISSUER.into(),
            kubernetes_endpoint: None,
            audit: None,
            cluster_signing: None,
            front_proxy_dir: None,
            flow: flowcontrol::Limits::default(),
        }
    }
}

/// A running API server (without its socket).
pub struct ApiServer {
    pub state: Arc<AppState>,
    audit: Option<Arc<audit::Auditor>>,
    /// This server's entry in the `kubernetes` Service's endpoints.
    kubernetes_endpoint: Option<(String, u16)>,
}

impl ApiServer {
    /// Loads the watch cache from `store`, creates the built-in namespaces,
    /// and starts the server's own loops.
    pub async fn start(store: Arc<dyn Store>, config: Config) -> anyhow::Result<ApiServer> {
        lifecycle::migrate_key_layout(&*store)
            .await
            .map_err(|e| anyhow::anyhow!("moving objects to Kubernetes' key layout: {e}"))?;
        let cache = WatchCache::start(store.clone()).await?;
        let mut registry_config = config.registry.clone();
        registry_config.service_account_tokens = config.service_account_key_dir.is_some();
        let registry = Arc::new(Registry::new(store, cache, registry_config));
        registry
            .repair()
            .await
            .map_err(|e| anyhow::anyhow!("repairing the allocation ranges: {}", e.message))?;
        lifecycle::bootstrap(&registry)
            .await
            .map_err(|e| anyhow::anyhow!("bootstrapping: {e}"))?;
        if let Some((ip, port)) = &config.kubernetes_endpoint {
            kubernetes_endpoints::reconcile(&registry, ip, *port)
                .await
                .map_err(|e| anyhow::anyhow!("writing the kubernetes service's endpoints: {e}"))?;
            tokio::spawn(kubernetes_endpoints::run(
                registry.clone(),
                ip.clone(),
                *port,
            ));
        }
        tokio::spawn(lifecycle::namespace_finalizer(registry.clone()));
        tokio::spawn(crd::run(Arc::downgrade(&registry)));
        let weak = Arc::downgrade(&registry);
        let ranges: std::sync::Weak<dyn admission::AdmissionCtx> = weak;
        tokio::spawn(strategy::service::repair_forever(ranges));
        if let Some((cert, key)) = config.cluster_signing.clone() {
            tokio::spawn(certificates::run(registry.clone(), cert, key));
        }
        tokio::spawn(lifecycle::compactor(
            registry.clone(),
            config.compact_keep,
            config.compact_every,
        ));
        let aggregator = Arc::new(aggregator::Aggregator::load_or_create(
            config.front_proxy_dir.as_deref(),
        )?);
        tokio::spawn(aggregator::start(
            registry.clone(),
            aggregator.clone(),
            config
                .cluster_signing
                .as_ref()
                .map(|(cert, _)| cert.clone()),
        ));
        let state = Arc::new(AppState {
            aggregator,
            registry,
            advertise: config.advertise.clone(),
            ready: AtomicBool::new(true),
            kubelet_tls: match &config.kubelet_client {
                Some((cert, key)) => Some(Arc::new(nodeproxy::client_config(
                    cert,
                    key,
                    config.cluster_signing.as_ref().map(|(ca, _)| ca.as_str()),
                )?)),
                None => None,
            },
            metrics: config.metrics,
            metrics_windows: Default::default(),
            tokens: match &config.service_account_key_dir {
                Some(dir) => Some(Arc::new(tokens::Tokens::load_or_create(
                    dir,
                    &config.service_account_issuer,
                )?)),
                None => None,
            },
            flow: flowcontrol::FlowControl::new(&config.flow),
        });
        Ok(ApiServer {
            state,
            audit: config.audit.clone(),
            kubernetes_endpoint: config.kubernetes_endpoint.clone(),
        })
    }

    /// A clean stop: takes this server out of the `kubernetes` Service's
    /// endpoints at once (rather than after its lease lapses).
    pub async fn leave(&self) {
        if let Some((ip, port)) = &self.kubernetes_endpoint {
            if let Err(e) = kubernetes_endpoints::leave(&self.state.registry, ip, *port).await {
                tracing::warn!(error = %e.message, "removing this server from the kubernetes endpoints");
            }
        }
    }

    /// The router serving every path. Requests must carry an
    /// [`auth::Identity`] extension to be authenticated.
    pub fn router(&self) -> Router {
        let router = Router::new()
            .fallback(handlers::handle)
            .with_state(self.state.clone());
        match &self.audit {
            Some(a) => router.layer(axum::middleware::from_fn_with_state(
                a.clone(),
                audit::layer,
            )),
            None => router,
        }
    }

    /// A router for in-process clients: every request is authenticated as
    /// `system:<component>`.
    pub fn in_process_router(&self, component: &str) -> Router {
        self.router_as(auth::Identity::system(component))
    }

    /// A router on which every request is authenticated as `id` (in-process
    /// components with their own identities, tests).
    pub fn router_as(&self, id: auth::Identity) -> Router {
        self.router().layer(axum::middleware::from_fn(
            move |mut req: axum::extract::Request, next: axum::middleware::Next| {
                let id = id.clone();
                async move {
                    req.extensions_mut().insert(id);
                    next.run(req).await
                }
            },
        ))
    }
}
