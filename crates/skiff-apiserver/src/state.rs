//! What every request handler shares: the registry, the server's own
//! settings and the services beside the registry (tokens, aggregation,
//! flow control, node agents' TLS). A leaf the handlers and the modules
//! that serve their own paths read, so none of them imports the handlers.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::registry::Registry;

/// What every handler shares.
pub struct AppState {
    pub registry: Arc<Registry>,
    /// `host:port` clients reach the server at (for `/api`'s serverAddressByClientCIDRs).
    pub advertise: String,
    pub ready: std::sync::atomic::AtomicBool,
    /// TLS client settings for reaching node agents (logs, exec, …).
    pub kubelet_tls: Option<Arc<rustls::ClientConfig>>,
    /// What `/metrics` serves, if anything.
    pub metrics: Option<fn() -> String>,
    /// The metrics API's record of when it last read each node's stats.
    pub metrics_windows: MetricsWindows,
    /// The ServiceAccount token issuer and verifier, if the server has keys.
    pub tokens: Option<Arc<crate::tokens::Tokens>>,
    /// APIServices: the front-proxy identity and aggregated discovery.
    pub aggregator: Arc<crate::aggregator::Aggregator>,
    /// Priority and fairness: seats per level, fair queues per user.
    pub flow: Arc<crate::flowcontrol::FlowControl>,
}

impl AppState {
    /// The resources this server serves (built-ins and custom resources).
    pub fn catalog(&self) -> &skiff_core::resources::Catalog {
        self.registry.cache().catalog()
    }
}

/// The metrics API's record: when this server last read each node's
/// Summary, and the window it reported for it then.
#[derive(Default)]
pub struct MetricsWindows(pub(crate) Mutex<HashMap<String, (Instant, Duration)>>);
