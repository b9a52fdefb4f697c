//! The API server's calls out to extension servers: admission webhooks
//! (AdmissionReview), conversion webhooks (ConversionReview) and, for the
//! TLS part, aggregated API servers. A webhook `clientConfig` names either
//! a `url` (https only) or a `service` that the server resolves itself to a
//! ready endpoint (the Service's Endpoints from the watch cache, falling
//! back to its ClusterIP), as kube-apiserver does with aggregator routing;
//! the TLS server name of a service is `<name>.<namespace>.svc`.
//!
//! The `caBundle` is the only trust root: skiff never trusts the system's
//! roots for webhooks, so a configuration without one is refused. One
//! timeout bounds resolve, connect, TLS and the whole response; the
//! response body is limited to [`MAX_RESPONSE`] bytes.
//!
//! Connections to webhooks are kept (HTTP/1.1 keep-alive) in a pool keyed
//! by the resolved address, the CA bundle and the TLS server name, and
//! reused by later calls until idle for [`IDLE_TIMEOUT`]; a call on a kept
//! connection that the webhook closed meanwhile is retried once on a new one.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use base64::Engine;
use http::{header, Request};
use http_body_util::{BodyExt, Full, Limited};
use hyper_util::rt::TokioIo;
use serde_json::Value;

/// The largest response body read from a webhook (as kube-apiserver's
/// limit on a webhook's answer, 3 MiB plus room for its envelope).
pub const MAX_RESPONSE: usize = 3 * 1024 * 1024 + 64 * 1024;

/// How long a kept connection to a webhook may stay idle (Go's
/// `http.Transport` default `IdleConnTimeout`).
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(90);

/// Idle connections kept per pool key at most.
const MAX_IDLE_PER_KEY: usize = 32;

/// Where a webhook lives: Kubernetes' `WebhookClientConfig`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientConfig {
    pub target: Target,
    /// The PEM trust roots (decoded from `caBundle`'s base64).
    pub ca_bundle: Vec<u8>,
}

/// A `url` or a `service` reference.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    Url(http::Uri),
    Service {
        namespace: String,
        name: String,
        path: String,
        port: u16,
    },
}

/// Why an outbound call failed; every variant is retryable by a later call
/// (the webhook's failurePolicy decides what the failure means).
#[derive(Debug, thiserror::Error)]
pub enum OutboundError {
    /// The clientConfig itself is unusable.
    #[error("invalid webhook client config: {0}")]
    Config(String),
    /// The service could not be resolved to an address.
    #[error("failed to resolve {target}: {reason}")]
    Resolve { target: String, reason: String },
    #[error("Post \"{url}\": dial tcp {addr}: {reason}")]
    Connect {
        url: String,
        addr: String,
        reason: String,
    },
    #[error("Post \"{url}\": tls: {reason}")]
    Tls { url: String, reason: String },
    #[error("Post \"{url}\": {reason}")]
    Http { url: String, reason: String },
    /// The server answered with a code other than 200.
    #[error(
        "the server responded with the status code {code} but did not return more information"
    )]
    Status { code: u16, body: String },
    #[error("failed to decode the response: {0}")]
    Decode(String),
    #[error("Post \"{url}\": context deadline exceeded (timeout {timeout:?})")]
    Timeout { url: String, timeout: Duration },
}

impl ClientConfig {
    /// Parses a `clientConfig` as it is stored (caBundle in base64).
    pub fn from_json(v: &Value) -> Result<ClientConfig, OutboundError> {
        let bad = |m: &str| OutboundError::Config(m.to_string());
        let url = v
            .get("url")
            .and_then(Value::as_str)
            .filter(|s| !s.is_empty());
        let service = v.get("service").filter(|s| !s.is_null());
        let target = match (url, service) {
            (Some(_), Some(_)) => return Err(bad("exactly one of url or service is allowed")),
            (None, None) => return Err(bad("exactly one of url or service is required")),
            (Some(u), None) => Target::Url(parse_url(u).map_err(OutboundError::Config)?),
            (None, Some(s)) => {
                let str_of = |k: &str| s.get(k).and_then(Value::as_str).unwrap_or("").to_string();
                let (namespace, name) = (str_of("namespace"), str_of("name"));
                if namespace.is_empty() || name.is_empty() {
                    return Err(bad("service namespace and name are required"));
                }
                let port = match s.get("port").and_then(Value::as_i64) {
                    None => 443,
                    Some(p) if (1..=65535).contains(&p) => p as u16,
                    Some(p) => return Err(OutboundError::Config(format!("bad port {p}"))),
                };
                let mut path = str_of("path");
                if !path.starts_with('/') {
                    path.insert(0, '/');
                }
                Target::Service {
                    namespace,
                    name,
                    path,
                    port,
                }
            }
        };
        let ca = v.get("caBundle").and_then(Value::as_str).unwrap_or("");
        let ca_bundle = base64::engine::general_purpose::STANDARD
            .decode(ca.trim())
            .map_err(|e| OutboundError::Config(format!("caBundle is not base64: {e}")))?;
        Ok(ClientConfig { target, ca_bundle })
    }

    /// The URL as Kubernetes names the call in its errors.
    pub fn display_url(&self) -> String {
        match &self.target {
            Target::Url(u) => u.to_string(),
            Target::Service {
                namespace,
                name,
                path,
                port,
            } => format!("https://{name}.{namespace}.svc:{port}{path}"),
        }
    }
}

/// Checks a webhook `url` as Kubernetes validates it: https, a host, no
/// user info, no fragment, no query.
pub fn parse_url(u: &str) -> Result<http::Uri, String> {
    let uri: http::Uri = u.parse().map_err(|e| format!("url {u:?}: {e}"))?;
    if uri.scheme_str() != Some("https") {
        return Err("'https' is the only allowed URL scheme".into());
    }
    let Some(auth) = uri.authority() else {
        return Err("host must be specified".into());
    };
    if auth.as_str().contains('@') {
        return Err("user information is not permitted in the URL".into());
    }
    if auth.host().is_empty() {
        return Err("host must be specified".into());
    }
    if u.contains('#') {
        return Err("fragments are not permitted in the URL".into());
    }
    if uri.query().is_some() {
        return Err("query parameters are not permitted in the URL".into());
    }
    Ok(uri)
}

/// Resolves a Service port to an address the server can dial.
pub trait ServiceResolver: Send + Sync {
    fn resolve(&self, namespace: &str, name: &str, port: u16) -> Result<SocketAddr, String>;
}

/// Resolves Services from the watch cache: a ready address of the
/// Service's Endpoints for the service port's name (as kube-apiserver's
/// endpoint routing), else the ClusterIP and the port itself.
impl ServiceResolver for crate::watchcache::WatchCache {
    fn resolve(&self, namespace: &str, name: &str, port: u16) -> Result<SocketAddr, String> {
        let services = skiff_core::resources::lookup("", "v1", "services").expect("services");
        let endpoints = skiff_core::resources::lookup("", "v1", "endpoints").expect("endpoints");
        let cached = |res| {
            self.resource(res)
                .get(&crate::object::object_key(res, Some(namespace), name))
                .and_then(|o| o.value())
        };
        let svc = cached(services).ok_or_else(|| format!("service \"{name}\" not found"))?;
        let ep = cached(endpoints);
        resolve_from(&svc, ep.as_deref(), port, random_index)
    }
}

fn random_index(n: usize) -> usize {
    rand::random_range(0..n.max(1))
}

/// The address for service port `port` from a Service and its Endpoints.
pub fn resolve_from(
    svc: &Value,
    endpoints: Option<&Value>,
    port: u16,
    pick: fn(usize) -> usize,
) -> Result<SocketAddr, String> {
    let name = svc
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or("");
    let ports = svc
        .pointer("/spec/ports")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let svc_port = ports
        .iter()
        .find(|p| p.get("port").and_then(Value::as_i64) == Some(port as i64))
        .ok_or_else(|| format!("no service port {port} found for service \"{name}\""))?;
    let port_name = svc_port.get("name").and_then(Value::as_str).unwrap_or("");
    let mut candidates = Vec::new();
    for subset in endpoints
        .and_then(|e| e.get("subsets"))
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        let target = subset
            .get("ports")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .find(|p| p.get("name").and_then(Value::as_str).unwrap_or("") == port_name)
            .and_then(|p| p.get("port").and_then(Value::as_i64));
        let Some(target) = target else { continue };
        for a in subset
            .get("addresses")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            if let Some(ip) = a
                .get("ip")
                .and_then(Value::as_str)
                .and_then(|s| s.parse::<IpAddr>().ok())
            {
                candidates.push(SocketAddr::new(ip, target as u16));
            }
        }
    }
    if !candidates.is_empty() {
        return Ok(candidates[pick(candidates.len()) % candidates.len()]);
    }
    let cluster_ip = svc
        .pointer("/spec/clusterIP")
        .and_then(Value::as_str)
        .and_then(|s| s.parse::<IpAddr>().ok());
    match cluster_ip {
        Some(ip) => Ok(SocketAddr::new(ip, port)),
        None => Err(format!(
            "service \"{name}\" has no ready endpoints and no cluster IP"
        )),
    }
}

type TlsKey = (Vec<u8>, Option<String>);

fn tls_cache() -> &'static Mutex<HashMap<TlsKey, Arc<rustls::ClientConfig>>> {
    static CACHE: OnceLock<Mutex<HashMap<TlsKey, Arc<rustls::ClientConfig>>>> = OnceLock::new();
    CACHE.get_or_init(Default::default)
}

/// A client certificate the server presents (the front-proxy one towards
/// aggregated API servers).
#[derive(Debug, Clone)]
pub struct ClientIdentity {
    pub cert_pem: String,
    pub key_pem: String,
}

/// The TLS client configuration trusting only `ca_pem`, cached per bundle
/// (and client certificate): a webhook called on every write does not
/// parse its bundle every time.
pub fn tls_config(
    ca_pem: &[u8],
    client: Option<&ClientIdentity>,
) -> Result<Arc<rustls::ClientConfig>, OutboundError> {
    use rustls_pki_types::pem::PemObject;
    let key = (ca_pem.to_vec(), client.map(|c| c.cert_pem.clone()));
    if let Some(c) = tls_cache()
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .get(&key)
    {
        return Ok(c.clone());
    }
    let mut roots = rustls::RootCertStore::empty();
    for c in rustls_pki_types::CertificateDer::pem_slice_iter(ca_pem) {
        let c = c.map_err(|e| OutboundError::Config(format!("caBundle: {e:?}")))?;
        roots
            .add(c)
            .map_err(|e| OutboundError::Config(format!("caBundle: {e}")))?;
    }
    if roots.is_empty() {
        return Err(OutboundError::Config(
            "caBundle holds no certificate (skiff trusts no system roots for webhooks)".into(),
        ));
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| OutboundError::Config(e.to_string()))?
        .with_root_certificates(roots);
    let mut cfg = match client {
        None => builder.with_no_client_auth(),
        Some(id) => {
            let certs = rustls_pki_types::CertificateDer::pem_slice_iter(id.cert_pem.as_bytes())
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| OutboundError::Config(format!("client certificate: {e:?}")))?;
            let key = rustls_pki_types::PrivateKeyDer::from_pem_slice(id.key_pem.as_bytes())
                .map_err(|e| OutboundError::Config(format!("client key: {e:?}")))?;
            builder
                .with_client_auth_cert(certs, key)
                .map_err(|e| OutboundError::Config(format!("client certificate: {e}")))?
        }
    };
    cfg.alpn_protocols = vec![b"http/1.1".to_vec()];
    let cfg = Arc::new(cfg);
    let mut cache = tls_cache().lock().unwrap_or_else(|e| e.into_inner());
    if cache.len() >= 256 {
        cache.clear();
    }
    cache.insert(key, cfg.clone());
    Ok(cfg)
}

/// A TLS client configuration that does not verify the server's
/// certificate (an APIService with `insecureSkipTLSVerify`), presenting
/// `client`.
pub fn insecure_tls_config(
    client: &ClientIdentity,
) -> Result<Arc<rustls::ClientConfig>, OutboundError> {
    use rustls_pki_types::pem::PemObject;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let certs = rustls_pki_types::CertificateDer::pem_slice_iter(client.cert_pem.as_bytes())
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| OutboundError::Config(format!("client certificate: {e:?}")))?;
    let key = rustls_pki_types::PrivateKeyDer::from_pem_slice(client.key_pem.as_bytes())
        .map_err(|e| OutboundError::Config(format!("client key: {e:?}")))?;
    let mut cfg = rustls::ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| OutboundError::Config(e.to_string()))?
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(crate::tls::AnyServer(provider)))
        .with_client_auth_cert(certs, key)
        .map_err(|e| OutboundError::Config(format!("client certificate: {e}")))?;
    cfg.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(cfg))
}

/// Where a call goes: the address to dial, the TLS server name, the Host
/// header and the request path.
#[derive(Debug, Clone)]
pub struct Endpoint {
    pub addr: SocketAddr,
    pub server_name: String,
    pub host: String,
    pub path: String,
}

/// Resolves a client config to the address to dial.
pub async fn endpoint(
    cfg: &ClientConfig,
    resolver: &dyn ServiceResolver,
) -> Result<Endpoint, OutboundError> {
    match &cfg.target {
        Target::Url(u) => {
            let auth = u.authority().expect("checked by parse_url");
            let host = auth.host().trim_start_matches('[').trim_end_matches(']');
            let port = auth.port_u16().unwrap_or(443);
            let addr = match host.parse::<IpAddr>() {
                Ok(ip) => SocketAddr::new(ip, port),
                Err(_) => tokio::net::lookup_host((host, port))
                    .await
                    .map_err(|e| OutboundError::Resolve {
                        target: host.to_string(),
                        reason: e.to_string(),
                    })?
                    .next()
                    .ok_or_else(|| OutboundError::Resolve {
                        target: host.to_string(),
                        reason: "no address".into(),
                    })?,
            };
            Ok(Endpoint {
                addr,
                server_name: host.to_string(),
                host: auth.as_str().to_string(),
                path: u
                    .path_and_query()
                    .map(|p| p.as_str().to_string())
                    .unwrap_or_else(|| "/".into()),
            })
        }
        Target::Service {
            namespace,
            name,
            path,
            port,
        } => {
            let addr = resolver.resolve(namespace, name, *port).map_err(|reason| {
                OutboundError::Resolve {
                    target: format!("service {namespace}/{name}:{port}"),
                    reason,
                }
            })?;
            let server_name = format!("{name}.{namespace}.svc");
            Ok(Endpoint {
                addr,
                host: format!("{server_name}:{port}"),
                server_name,
                path: path.clone(),
            })
        }
    }
}

/// POSTs `body` as JSON to the webhook and returns its JSON answer; the
/// whole call (resolve, connect, TLS, request, response) is bounded by
/// `timeout`.
pub async fn post_json(
    cfg: &ClientConfig,
    resolver: &dyn ServiceResolver,
    body: &Value,
    timeout: Duration,
) -> Result<Value, OutboundError> {
    let url = cfg.display_url();
    match tokio::time::timeout(timeout, post_inner(cfg, resolver, body, &url)).await {
        Ok(r) => r,
        Err(_) => Err(OutboundError::Timeout { url, timeout }),
    }
}

type Sender = hyper::client::conn::http1::SendRequest<Full<bytes::Bytes>>;

/// Kept connections: (address, CA bundle, server name) → idle senders with
/// the time each was put back.
type PoolKey = (SocketAddr, Vec<u8>, String);

type Pool = Mutex<HashMap<PoolKey, Vec<(Sender, std::time::Instant)>>>;

fn pool() -> &'static Pool {
    static POOL: OnceLock<Pool> = OnceLock::new();
    POOL.get_or_init(Default::default)
}

/// Whether calls reuse kept connections (off only to measure the
/// difference).
static REUSE: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(true);

/// Turns connection reuse on or off (for measurements).
pub fn set_connection_reuse(on: bool) {
    REUSE.store(on, std::sync::atomic::Ordering::Relaxed);
}

/// An idle kept connection for `key`, if one is still open and fresh.
fn take_idle(key: &PoolKey) -> Option<Sender> {
    let mut p = pool().lock().unwrap_or_else(|e| e.into_inner());
    let list = p.get_mut(key)?;
    let now = std::time::Instant::now();
    list.retain(|(s, at)| !s.is_closed() && now.duration_since(*at) < IDLE_TIMEOUT);
    let got = list.pop().map(|(s, _)| s);
    if list.is_empty() {
        p.remove(key);
    }
    got
}

fn put_back(key: PoolKey, sender: Sender) {
    if sender.is_closed() || !REUSE.load(std::sync::atomic::Ordering::Relaxed) {
        return;
    }
    let mut p = pool().lock().unwrap_or_else(|e| e.into_inner());
    // Forget keys nobody used for long (their connections are closed or stale).
    if p.len() > 256 {
        let now = std::time::Instant::now();
        p.retain(|_, l| {
            l.retain(|(s, at)| !s.is_closed() && now.duration_since(*at) < IDLE_TIMEOUT);
            !l.is_empty()
        });
    }
    let list = p.entry(key).or_default();
    if list.len() < MAX_IDLE_PER_KEY {
        list.push((sender, std::time::Instant::now()));
    }
}

async fn post_inner(
    cfg: &ClientConfig,
    resolver: &dyn ServiceResolver,
    body: &Value,
    url: &str,
) -> Result<Value, OutboundError> {
    let tls = tls_config(&cfg.ca_bundle, None)?;
    let ep = endpoint(cfg, resolver).await?;
    let bytes = bytes::Bytes::from(
        serde_json::to_vec(body).map_err(|e| OutboundError::Decode(e.to_string()))?,
    );
    let req = || {
        Request::post(&ep.path)
            .header(header::HOST, &ep.host)
            .header(header::CONTENT_TYPE, "application/json")
            .header(header::ACCEPT, "application/json, */*")
            .header(header::USER_AGENT, "skiff-apiserver")
            .body(Full::new(bytes.clone()))
            .map_err(|e| OutboundError::Config(e.to_string()))
    };
    let http_err = |e: String| OutboundError::Http {
        url: url.to_string(),
        reason: e,
    };
    let key: PoolKey = (ep.addr, cfg.ca_bundle.clone(), ep.server_name.clone());
    let reuse = REUSE.load(std::sync::atomic::Ordering::Relaxed);
    // A kept connection first; if the webhook closed it meanwhile (the
    // request never got an answer), once more on a new connection.
    let mut kept = if reuse { take_idle(&key) } else { None };
    let (mut sender, resp) = loop {
        let (mut sender, was_kept) = match kept.take() {
            Some(s) => (s, true),
            None => (dial(&tls, &ep, url).await?, false),
        };
        if was_kept && sender.ready().await.is_err() {
            continue;
        }
        match sender.send_request(req()?).await {
            Ok(resp) => break (sender, resp),
            Err(e)
                if was_kept && (e.is_closed() || e.is_canceled() || e.is_incomplete_message()) =>
            {
                continue
            }
            Err(e) => return Err(http_err(e.to_string())),
        }
    };
    let status = resp.status();
    let body = Limited::new(resp.into_body(), MAX_RESPONSE)
        .collect()
        .await
        .map_err(|e| http_err(format!("reading the response: {e}")))?
        .to_bytes();
    if let Ok(Ok(())) = tokio::time::timeout(Duration::from_secs(1), sender.ready()).await {
        put_back(key, sender);
    }
    if !status.is_success() {
        return Err(OutboundError::Status {
            code: status.as_u16(),
            body: String::from_utf8_lossy(&body[..body.len().min(1024)]).into_owned(),
        });
    }
    serde_json::from_slice(&body).map_err(|e| OutboundError::Decode(e.to_string()))
}

/// A TLS connection to `ep` speaking HTTP/1.1, ready for requests.
pub async fn dial<B>(
    tls: &Arc<rustls::ClientConfig>,
    ep: &Endpoint,
    url: &str,
) -> Result<hyper::client::conn::http1::SendRequest<B>, OutboundError>
where
    B: hyper::body::Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let tcp =
        tokio::net::TcpStream::connect(ep.addr)
            .await
            .map_err(|e| OutboundError::Connect {
                url: url.to_string(),
                addr: ep.addr.to_string(),
                reason: go_dial_error(&e),
            })?;
    let _ = tcp.set_nodelay(true);
    let tls_err = |reason: String| OutboundError::Tls {
        url: url.to_string(),
        reason,
    };
    let server_name = rustls_pki_types::ServerName::try_from(ep.server_name.clone())
        .map_err(|e| tls_err(format!("server name {:?}: {e}", ep.server_name)))?;
    let stream = tokio_rustls::TlsConnector::from(tls.clone())
        .connect(server_name, tcp)
        .await
        .map_err(|e| tls_err(e.to_string()))?;
    let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(|e| OutboundError::Http {
            url: url.to_string(),
            reason: e.to_string(),
        })?;
    tokio::spawn(async move {
        let _ = conn.with_upgrades().await;
    });
    Ok(sender)
}

/// A connect error as Go's net package words it (what kube-apiserver's
/// messages show): `connect: connection refused`.
fn go_dial_error(e: &std::io::Error) -> String {
    use std::io::ErrorKind;
    match e.kind() {
        ErrorKind::ConnectionRefused => "connect: connection refused".into(),
        ErrorKind::TimedOut => "i/o timeout".into(),
        ErrorKind::AddrNotAvailable => "connect: cannot assign requested address".into(),
        _ => match e.raw_os_error() {
            Some(113) => "connect: no route to host".into(),
            Some(101) => "connect: network is unreachable".into(),
            _ => format!("connect: {e}"),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    struct NoServices;
    impl ServiceResolver for NoServices {
        fn resolve(&self, _: &str, name: &str, _: u16) -> Result<SocketAddr, String> {
            Err(format!("service \"{name}\" not found"))
        }
    }

    struct Fixed(SocketAddr);
    impl ServiceResolver for Fixed {
        fn resolve(&self, _: &str, _: &str, _: u16) -> Result<SocketAddr, String> {
            Ok(self.0)
        }
    }

    /// A CA made for the test and a serving certificate for `sans`.
    fn ca_and_server(sans: &[&str]) -> (String, crate::tls::CertPair) {
        use rcgen::{BasicConstraints, CertificateParams, IsCa, KeyPair, KeyUsagePurpose};
        let key = KeyPair::generate().unwrap();
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let cert = params.self_signed(&key).unwrap();
        let ca = crate::tls::CertPair {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
        };
        let sans: Vec<String> = sans.iter().map(|s| s.to_string()).collect();
        let server = crate::tls::issue(&ca, "webhook", &[], &sans, false, 1).unwrap();
        (ca.cert_pem, server)
    }

    /// A one-connection-at-a-time HTTPS server on a free loopback port that
    /// answers every request with `answer` (status, body) after `delay`.
    async fn serve(
        server: crate::tls::CertPair,
        answer: (u16, String),
        delay: Duration,
    ) -> (SocketAddr, tokio::sync::mpsc::UnboundedReceiver<String>) {
        use rustls_pki_types::pem::PemObject;
        let certs = rustls_pki_types::CertificateDer::pem_slice_iter(server.cert_pem.as_bytes())
            .collect::<Result<Vec<_>, _>>()
            .unwrap();
        let key =
            rustls_pki_types::PrivateKeyDer::from_pem_slice(server.key_pem.as_bytes()).unwrap();
        let cfg = rustls::ServerConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .unwrap();
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(cfg));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        tokio::spawn(async move {
            while let Ok((tcp, _)) = listener.accept().await {
                let acceptor = acceptor.clone();
                let (answer, tx) = (answer.clone(), tx.clone());
                tokio::spawn(async move {
                    let Ok(mut tls) = acceptor.accept(tcp).await else {
                        return;
                    };
                    let mut buf = Vec::new();
                    let mut chunk = [0u8; 4096];
                    // Read the head and the body (Content-Length).
                    loop {
                        let n = tls.read(&mut chunk).await.unwrap_or(0);
                        if n == 0 {
                            return;
                        }
                        buf.extend_from_slice(&chunk[..n]);
                        let text = String::from_utf8_lossy(&buf).to_string();
                        if let Some(i) = text.find("\r\n\r\n") {
                            let len = text[..i]
                                .lines()
                                .find_map(|l| {
                                    l.to_ascii_lowercase()
                                        .strip_prefix("content-length:")
                                        .map(|v| v.trim().parse::<usize>().unwrap())
                                })
                                .unwrap_or(0);
                            if buf.len() >= i + 4 + len {
                                let _ = tx.send(text);
                                break;
                            }
                        }
                    }
                    tokio::time::sleep(delay).await;
                    let (code, body) = answer;
                    let resp = format!(
                        "HTTP/1.1 {code} X\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                        body.len()
                    );
                    let _ = tls.write_all(resp.as_bytes()).await;
                    let _ = tls.shutdown().await;
                });
            }
        });
        (addr, rx)
    }

    fn cfg_url(url: &str, ca: &str) -> ClientConfig {
        ClientConfig::from_json(&json!({
            "url": url,
            "caBundle": base64::engine::general_purpose::STANDARD.encode(ca),
        }))
        .unwrap()
    }

    #[tokio::test]
    async fn a_url_webhook_gets_the_body_and_its_answer_is_returned() {
        let (ca, server) = ca_and_server(&["127.0.0.1"]);
        let (addr, mut seen) = serve(server, (200, r#"{"ok":true}"#.into()), Duration::ZERO).await;
        let cfg = cfg_url(&format!("https://{addr}/validate"), &ca);
        let out = post_json(
            &cfg,
            &NoServices,
            &json!({"hello": 1}),
            Duration::from_secs(5),
        )
        .await
        .unwrap();
        assert_eq!(out, json!({"ok": true}));
        let request = seen.recv().await.unwrap();
        assert!(request.starts_with("POST /validate HTTP/1.1"), "{request}");
        assert!(request.contains(r#"{"hello":1}"#), "{request}");
    }

    #[tokio::test]
    async fn a_service_webhook_is_dialled_at_its_endpoint_with_the_service_name() {
        let (ca, server) = ca_and_server(&["hook.team.svc"]);
        let (addr, mut seen) = serve(server, (200, "{}".into()), Duration::ZERO).await;
        let cfg = ClientConfig::from_json(&json!({
            "service": {"namespace": "team", "name": "hook", "path": "/mutate"},
            "caBundle": base64::engine::general_purpose::STANDARD.encode(&ca),
        }))
        .unwrap();
        post_json(&cfg, &Fixed(addr), &json!({}), Duration::from_secs(5))
            .await
            .unwrap();
        let request = seen.recv().await.unwrap();
        assert!(request.starts_with("POST /mutate HTTP/1.1"), "{request}");
        assert!(request
            .to_ascii_lowercase()
            .contains("host: hook.team.svc:443"));
        let err = post_json(&cfg, &NoServices, &json!({}), Duration::from_secs(5))
            .await
            .unwrap_err();
        assert!(matches!(err, OutboundError::Resolve { .. }), "{err}");
    }

    #[tokio::test]
    async fn a_certificate_from_another_ca_or_name_fails_tls() {
        let (_, server) = ca_and_server(&["127.0.0.1"]);
        let (other_ca, _) = ca_and_server(&["127.0.0.1"]);
        let (addr, _seen) = serve(server, (200, "{}".into()), Duration::ZERO).await;
        let cfg = cfg_url(&format!("https://{addr}/"), &other_ca);
        let err = post_json(&cfg, &NoServices, &json!({}), Duration::from_secs(5))
            .await
            .unwrap_err();
        assert!(matches!(err, OutboundError::Tls { .. }), "{err}");

        let (ca, server) = ca_and_server(&["elsewhere.example"]);
        let (addr, _seen) = serve(server, (200, "{}".into()), Duration::ZERO).await;
        let err = post_json(
            &cfg_url(&format!("https://{addr}/"), &ca),
            &NoServices,
            &json!({}),
            Duration::from_secs(5),
        )
        .await
        .unwrap_err();
        assert!(matches!(err, OutboundError::Tls { .. }), "{err}");
    }

    #[tokio::test]
    async fn errors_say_what_failed() {
        let (ca, server) = ca_and_server(&["127.0.0.1"]);
        let (addr, _seen) = serve(server.clone(), (500, "boom".into()), Duration::ZERO).await;
        let err = post_json(
            &cfg_url(&format!("https://{addr}/"), &ca),
            &NoServices,
            &json!({}),
            Duration::from_secs(5),
        )
        .await
        .unwrap_err();
        assert!(
            matches!(err, OutboundError::Status { code: 500, .. }),
            "{err}"
        );

        let (addr, _seen) = serve(server.clone(), (200, "not json".into()), Duration::ZERO).await;
        let err = post_json(
            &cfg_url(&format!("https://{addr}/"), &ca),
            &NoServices,
            &json!({}),
            Duration::from_secs(5),
        )
        .await
        .unwrap_err();
        assert!(matches!(err, OutboundError::Decode(_)), "{err}");

        // Nothing listens on a port just released.
        let free = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = free.local_addr().unwrap().port();
        drop(free);
        let err = post_json(
            &cfg_url(&format!("https://127.0.0.1:{port}/"), &ca),
            &NoServices,
            &json!({}),
            Duration::from_secs(5),
        )
        .await
        .unwrap_err();
        assert!(matches!(err, OutboundError::Connect { .. }), "{err}");
    }

    /// A keep-alive webhook written for the test, answering `{"ok": true}`.
    async fn keep_alive_hook() -> crate::testing::TestServer {
        crate::testing::serve(
            "127.0.0.1:0",
            &["127.0.0.1"],
            None,
            Duration::ZERO,
            Arc::new(|_: &crate::testing::Seen| (200, json!({"ok": true}))),
        )
        .await
    }

    #[tokio::test]
    async fn calls_to_a_webhook_reuse_one_kept_connection() {
        let hook = keep_alive_hook().await;
        let cfg = cfg_url(&format!("https://{}/convert", hook.addr), &hook.ca_pem);
        for i in 0..20 {
            let out = post_json(&cfg, &NoServices, &json!({"i": i}), Duration::from_secs(5))
                .await
                .unwrap();
            assert_eq!(out, json!({"ok": true}));
        }
        assert_eq!(hook.requests().len(), 20);
        assert_eq!(
            hook.connections.load(std::sync::atomic::Ordering::Relaxed),
            1
        );
    }

    #[tokio::test]
    async fn a_webhook_that_closes_its_connections_is_redialled() {
        let (ca, server) = ca_and_server(&["127.0.0.1"]);
        let (addr, mut seen) = serve(server, (200, r#"{"ok":true}"#.into()), Duration::ZERO).await;
        let cfg = cfg_url(&format!("https://{addr}/x"), &ca);
        for _ in 0..3 {
            let out = post_json(&cfg, &NoServices, &json!({}), Duration::from_secs(5))
                .await
                .unwrap();
            assert_eq!(out, json!({"ok": true}));
            assert!(seen.recv().await.is_some());
        }
    }

    /// Calls per second to a keep-alive webhook with and without reuse
    /// (run alone: `cargo test -p skiff-apiserver --lib -- --ignored
    /// --nocapture webhook_call_rate`); prints, asserts nothing about time.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    #[ignore]
    async fn webhook_call_rate() {
        let hook = keep_alive_hook().await;
        let cfg = cfg_url(&format!("https://{}/convert", hook.addr), &hook.ca_pem);
        let body = json!({"apiVersion": "apiextensions.k8s.io/v1", "kind": "ConversionReview",
            "request": {"uid": "u", "desiredAPIVersion": "example.com/v2",
                "objects": [{"apiVersion": "example.com/v1", "kind": "Gadget", "metadata": {"name": "g"}, "spec": {"size": 1}}]}});
        for reuse in [false, true, false, true] {
            set_connection_reuse(reuse);
            let n = 2000;
            let started = std::time::Instant::now();
            for _ in 0..n {
                post_json(&cfg, &NoServices, &body, Duration::from_secs(5))
                    .await
                    .unwrap();
            }
            let secs = started.elapsed().as_secs_f64();
            println!(
                "reuse={reuse}: {n} sequential calls in {secs:.2}s = {:.0} calls/s",
                n as f64 / secs
            );
        }
        set_connection_reuse(true);
    }

    #[tokio::test]
    async fn a_slow_webhook_costs_at_most_its_timeout() {
        let (ca, server) = ca_and_server(&["127.0.0.1"]);
        let (addr, _seen) = serve(server, (200, "{}".into()), Duration::from_secs(30)).await;
        let started = std::time::Instant::now();
        let err = post_json(
            &cfg_url(&format!("https://{addr}/"), &ca),
            &NoServices,
            &json!({}),
            Duration::from_millis(300),
        )
        .await
        .unwrap_err();
        assert!(matches!(err, OutboundError::Timeout { .. }), "{err}");
        assert!(started.elapsed() < Duration::from_secs(5));
        assert!(err.to_string().contains("context deadline exceeded"));
    }

    #[test]
    fn client_configs_are_checked() {
        let parse = |v: Value| ClientConfig::from_json(&v);
        assert!(parse(json!({"url": "http://x/"})).is_err());
        assert!(parse(json!({"url": "https://x/?a=b"})).is_err());
        assert!(parse(json!({"url": "https://u@x/"})).is_err());
        assert!(parse(json!({})).is_err());
        assert!(
            parse(json!({"url": "https://x/", "service": {"namespace": "a", "name": "b"}}))
                .is_err()
        );
        let svc = parse(json!({"service": {"namespace": "a", "name": "b"}})).unwrap();
        assert_eq!(svc.display_url(), "https://b.a.svc:443/");
        // No caBundle: refused when called, not trusted to the system roots.
        assert!(matches!(
            tls_config(b"", None),
            Err(OutboundError::Config(_))
        ));
    }

    #[test]
    fn services_resolve_to_a_ready_endpoint_else_the_cluster_ip() {
        let svc = json!({"metadata": {"name": "hook"}, "spec": {
            "clusterIP": "10.43.0.9",
            "ports": [{"name": "https", "port": 443, "targetPort": 8443}]}});
        let ep = json!({"subsets": [{
            "addresses": [{"ip": "10.42.0.5"}],
            "notReadyAddresses": [{"ip": "10.42.0.6"}],
            "ports": [{"name": "https", "port": 8443}]}]});
        assert_eq!(
            resolve_from(&svc, Some(&ep), 443, |_| 0).unwrap(),
            "10.42.0.5:8443".parse().unwrap()
        );
        assert_eq!(
            resolve_from(&svc, None, 443, |_| 0).unwrap(),
            "10.43.0.9:443".parse().unwrap()
        );
        assert!(resolve_from(&svc, Some(&ep), 444, |_| 0).is_err());
    }
}
