//! The agent's HTTPS endpoint, which the API server calls for `kubectl
//! logs`, `exec`, `attach` and `port-forward`, and for the node's stats
//! (`/stats/summary`, `/metrics/resource`, see [`crate::stats`]) —
//! kubelet's paths. Clients authenticate as kubelet's do: a certificate of
//! the cluster CA (CN = user, O = groups) or a bearer token the API
//! server's TokenReview accepts (a ServiceAccount token, say, as
//! Prometheus scrapes with); neither is 401. The API server's
//! kubelet-client certificate may use every path; anyone else what a
//! SubjectAccessReview allows on this node's `nodes` subresource for the
//! path (`stats`, `metrics`, `log`, `spec`, else `proxy`) with the
//! method's verb, as kubelet's webhook authorization does (else 403).
//! Both answers are cached as kubelet caches them (tokens 2 minutes;
//! allowed 5 minutes, denied 30 s).
//!
//! Logs are read from the CRI log files. Exec, attach and port-forward are
//! handed to the runtime's streaming server: the agent asks CRI for a
//! session URL and relays the client's upgrade request (WebSocket or SPDY)
//! to it, then copies bytes both ways.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use axum::body::Body;
use axum::extract::{Path, Query, Request, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{any, get};
use axum::Router;
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncSeekExt};

use crate::runtime::{cri, Runtime, LABEL_CONTAINER_NAME, LABEL_POD_NAME, LABEL_POD_NAMESPACE};
use crate::AgentOptions;

/// The common name of the API server's client certificate.
pub const APISERVER_CLIENT_CN: &str = "kube-apiserver-kubelet-client";

struct Ctx {
    runtime: Arc<dyn Runtime>,
    stats: crate::stats::Collector,
}

/// Answers of the API server, kept for a while (kubelet's webhook caches).
struct Cache<K, V> {
    entries: std::sync::Mutex<HashMap<K, (V, std::time::Instant)>>,
}

impl<K: std::hash::Hash + Eq + Clone, V: Clone> Cache<K, V> {
    fn new() -> Self {
        Cache {
            entries: std::sync::Mutex::new(HashMap::new()),
        }
    }

    fn get(&self, k: &K) -> Option<V> {
        let m = self.entries.lock().unwrap_or_else(|e| e.into_inner());
        m.get(k)
            .filter(|(_, until)| *until > std::time::Instant::now())
            .map(|(v, _)| v.clone())
    }

    fn put(&self, k: K, v: V, ttl: Duration) {
        let now = std::time::Instant::now();
        let mut m = self.entries.lock().unwrap_or_else(|e| e.into_inner());
        // Bounded: expired entries go when it grows.
        if m.len() >= 4096 {
            m.retain(|_, (_, until)| *until > now);
            if m.len() >= 4096 {
                m.clear();
            }
        }
        m.insert(k, (v, now + ttl));
    }
}

/// How the endpoint decides who may do what, for clients other than the
/// API server: TokenReviews and SubjectAccessReviews, cached.
struct Guard {
    client: kube::Client,
    node: String,
    /// Token (its SHA-256) → who it is (`None`: not accepted).
    tokens: Cache<[u8; 32], Option<Peer>>,
    /// (user, groups, verb, subresource) → allowed.
    decisions: Cache<(String, Vec<String>, &'static str, &'static str), bool>,
}

const TOKEN_TTL: Duration = Duration::from_secs(120);
const ALLOWED_TTL: Duration = Duration::from_secs(300);
const DENIED_TTL: Duration = Duration::from_secs(30);

/// A bound, not yet serving, endpoint.
pub struct Endpoint {
    ctx: Arc<Ctx>,
    listener: tokio::net::TcpListener,
    tls: Arc<rustls::ServerConfig>,
    serving: Arc<crate::serving::ServingCert>,
    router: Router,
    node_name: String,
    /// Asks the API server's TokenReview and SubjectAccessReview for
    /// other clients.
    authorizer: Option<kube::Client>,
}

/// Who is calling: from the client certificate or a reviewed token.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Peer {
    user: String,
    groups: Vec<String>,
}

/// The `nodes` subresource kubelet maps a path to, for other clients.
fn subresource_of(path: &str) -> &'static str {
    let under = |p: &str| path == p || path.starts_with(&format!("{p}/"));
    if under("/stats") {
        "stats"
    } else if under("/metrics") {
        "metrics"
    } else if under("/logs") {
        "log"
    } else if under("/spec") {
        "spec"
    } else {
        "proxy"
    }
}

/// The verb kubelet's authorizer asks about for a request method.
fn verb_of(method: &axum::http::Method) -> &'static str {
    use axum::http::Method;
    match *method {
        Method::GET | Method::HEAD => "get",
        Method::POST => "create",
        Method::PUT => "update",
        Method::PATCH => "patch",
        Method::DELETE => "delete",
        _ => "get",
    }
}

/// kubelet's answer to a request without credentials or with a token the
/// API server does not accept.
fn unauthorized() -> Response {
    status(StatusCode::UNAUTHORIZED, "Unauthorized".into())
}

/// The bearer token of a request, if any.
fn bearer(headers: &HeaderMap) -> Option<&str> {
    let v = headers.get(http::header::AUTHORIZATION)?.to_str().ok()?;
    let (scheme, token) = v.split_once(' ')?;
    (scheme.eq_ignore_ascii_case("bearer") && !token.trim().is_empty()).then(|| token.trim())
}

/// kubelet's answer to a denied request.
fn forbidden(peer: &Peer, verb: &str, sub: &str) -> Response {
    status(
        StatusCode::FORBIDDEN,
        format!(
            "Forbidden (user={}, verb={verb}, resource=nodes, subresource={sub})",
            peer.user
        ),
    )
}

impl Guard {
    /// Who `token` belongs to, by the API server's TokenReview.
    async fn authenticate(&self, token: &str) -> Option<Peer> {
        let mut key = [0u8; 32];
        key.copy_from_slice(ring::digest::digest(&ring::digest::SHA256, token.as_bytes()).as_ref());
        if let Some(known) = self.tokens.get(&key) {
            return known;
        }
        use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec};
        let tr = TokenReview {
            spec: TokenReviewSpec {
                token: Some(token.to_string()),
                ..Default::default()
            },
            ..Default::default()
        };
        let api: kube::Api<TokenReview> = kube::Api::all(self.client.clone());
        let peer = match api.create(&Default::default(), &tr).await {
            Ok(r) => r
                .status
                .filter(|s| s.authenticated == Some(true))
                .and_then(|s| s.user)
                .and_then(|u| {
                    Some(Peer {
                        user: u.username.filter(|n| !n.is_empty())?,
                        groups: u.groups.unwrap_or_default(),
                    })
                }),
            Err(e) => {
                // Not cached: the API server may be back for the next one.
                tracing::warn!(error = %e, "TokenReview for the agent endpoint failed");
                return None;
            }
        };
        self.tokens.put(key, peer.clone(), TOKEN_TTL);
        peer
    }

    /// Whether the API server allows `peer` to `verb` `nodes/<sub>` of
    /// this node.
    async fn allows(&self, peer: &Peer, verb: &'static str, sub: &'static str) -> bool {
        let key = (peer.user.clone(), peer.groups.clone(), verb, sub);
        if let Some(known) = self.decisions.get(&key) {
            return known;
        }
        use k8s_openapi::api::authorization::v1::{
            ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec,
        };
        let sar = SubjectAccessReview {
            spec: SubjectAccessReviewSpec {
                user: Some(peer.user.clone()),
                groups: Some(peer.groups.clone()),
                resource_attributes: Some(ResourceAttributes {
                    verb: Some(verb.into()),
                    resource: Some("nodes".into()),
                    subresource: Some(sub.into()),
                    name: Some(self.node.clone()),
                    ..Default::default()
                }),
                ..Default::default()
            },
            ..Default::default()
        };
        let api: kube::Api<SubjectAccessReview> = kube::Api::all(self.client.clone());
        let allowed = match api.create(&Default::default(), &sar).await {
            Ok(r) => r.status.is_some_and(|s| s.allowed),
            Err(e) => {
                tracing::warn!(error = %e, "SubjectAccessReview for the agent endpoint failed");
                return false;
            }
        };
        let ttl = if allowed { ALLOWED_TTL } else { DENIED_TTL };
        self.decisions.put(key, allowed, ttl);
        allowed
    }

    /// Authenticates (the connection's certificate, else the request's
    /// token) and authorizes one request; the response to send instead
    /// when it may not pass.
    async fn check(
        &self,
        cert: Option<&Peer>,
        verb: &'static str,
        sub: &'static str,
        token: Option<String>,
    ) -> Result<(), Response> {
        let peer = match (cert, token) {
            (Some(p), _) => p.clone(),
            (None, Some(token)) => self.authenticate(&token).await.ok_or_else(unauthorized)?,
            (None, None) => return Err(unauthorized()),
        };
        if self.allows(&peer, verb, sub).await {
            Ok(())
        } else {
            Err(forbidden(&peer, verb, sub))
        }
    }
}

impl Endpoint {
    pub async fn bind(options: &AgentOptions, runtime: Arc<dyn Runtime>) -> Result<Endpoint> {
        let listener = tokio::net::TcpListener::bind(("0.0.0.0", options.port))
            .await
            .with_context(|| {
                format!("listening on port {} for the agent endpoint", options.port)
            })?;
        let (tls, serving) = tls_config(options)?;
        let stats = crate::stats::Collector::new(&options.node_name, options.data_dir.clone());
        let ctx = Arc::new(Ctx { runtime, stats });
        let router = router(ctx.clone());
        Ok(Endpoint {
            ctx,
            listener,
            tls: Arc::new(tls),
            serving,
            router,
            node_name: options.node_name.clone(),
            authorizer: None,
        })
    }

    /// Lets clients other than the API server read `/stats` and
    /// `/metrics` when `client`'s SubjectAccessReviews allow them.
    pub fn authorizing_with(mut self, client: kube::Client) -> Endpoint {
        self.authorizer = Some(client);
        self
    }

    /// The endpoint's certificate: self-signed at first, replaced by one
    /// from the cluster CA (`serving`) while it serves.
    pub fn serving_cert(&self) -> Arc<crate::serving::ServingCert> {
        self.serving.clone()
    }

    /// The stats' latest summary, as the endpoint's housekeeping samples
    /// it (for the reservations of [`crate::reclaim`]).
    /// Where reclamation puts the pods' reservations for `/stats/summary`.
    pub fn reservations(&self) -> crate::reclaim::Reservations {
        self.ctx.stats.reservations()
    }

    pub fn usage_feed(&self) -> tokio::sync::watch::Receiver<Option<Arc<crate::stats::Summary>>> {
        self.ctx.stats.subscribe()
    }

    pub fn port(&self) -> u16 {
        self.listener.local_addr().map(|a| a.port()).unwrap_or(0)
    }

    pub async fn serve(self) {
        // The stats' own sampling lives as long as the endpoint.
        let mut housekeeping = tokio::task::JoinSet::new();
        let ctx = self.ctx.clone();
        housekeeping.spawn(async move {
            ctx.stats
                .housekeep_forever(ctx.runtime.as_ref(), crate::stats::HOUSEKEEPING)
                .await
        });
        let acceptor = tokio_rustls::TlsAcceptor::from(self.tls.clone());
        let guard = self.authorizer.clone().map(|client| {
            Arc::new(Guard {
                client,
                node: self.node_name.clone(),
                tokens: Cache::new(),
                decisions: Cache::new(),
            })
        });
        loop {
            let Ok((tcp, _)) = self.listener.accept().await else {
                continue;
            };
            let acceptor = acceptor.clone();
            let router = self.router.clone();
            let guard = guard.clone();
            tokio::spawn(async move {
                let Ok(Ok(tls)) =
                    tokio::time::timeout(Duration::from_secs(10), acceptor.accept(tcp)).await
                else {
                    return;
                };
                let cert = tls
                    .get_ref()
                    .1
                    .peer_certificates()
                    .and_then(|c| c.first())
                    .and_then(|c| subject(c.as_ref()));
                let router = if cert.as_ref().is_some_and(|p| p.user == APISERVER_CLIENT_CN) {
                    router
                } else {
                    // Another client: who it is by its certificate or token,
                    // what it may do by a SubjectAccessReview.
                    let Some(guard) = guard else {
                        return;
                    };
                    router.layer(axum::middleware::from_fn(
                        move |req: Request, next: axum::middleware::Next| {
                            let (guard, cert) = (guard.clone(), cert.clone());
                            async move {
                                // Nothing of the request is held across the
                                // reviews (its body is not Sync).
                                let verb = verb_of(req.method());
                                let sub = subresource_of(req.uri().path());
                                let token = bearer(req.headers()).map(str::to_string);
                                match guard.check(cert.as_ref(), verb, sub, token).await {
                                    Ok(()) => next.run(req).await,
                                    Err(refused) => refused,
                                }
                            }
                        },
                    ))
                };
                let service = hyper_util::service::TowerToHyperService::new(router);
                let _ = hyper_util::server::conn::auto::Builder::new(
                    hyper_util::rt::TokioExecutor::new(),
                )
                .serve_connection_with_upgrades(TokioIo::new(tls), service)
                .await;
            });
        }
    }
}

/// The user (CN) and groups (O) of a client certificate.
fn subject(der: &[u8]) -> Option<Peer> {
    let (_, cert) = x509_parser::parse_x509_certificate(der).ok()?;
    let user = cert
        .subject()
        .iter_common_name()
        .next()?
        .as_str()
        .ok()?
        .to_string();
    let groups = cert
        .subject()
        .iter_organization()
        .filter_map(|o| o.as_str().ok())
        .map(str::to_string)
        .collect();
    Some(Peer { user, groups })
}

fn tls_config(
    options: &AgentOptions,
) -> Result<(rustls::ServerConfig, Arc<crate::serving::ServingCert>)> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut names = vec!["localhost".to_string(), options.node_name.clone()];
    if let Some(ip) = &options.node_ip {
        names.push(ip.clone());
    }
    names.push("127.0.0.1".into());
    let key = rcgen::KeyPair::generate()?;
    let params = rcgen::CertificateParams::new(names)?;
    let cert = params.self_signed(&key)?;
    let serving = Arc::new(crate::serving::ServingCert::new(
        &cert.pem(),
        &key.serialize_pem(),
    )?);
    let mut roots = rustls::RootCertStore::empty();
    let ca_pem = options
        .client_ca_pem
        .clone()
        .context("the agent endpoint needs the cluster CA to check the API server's certificate")?;
    for c in rustls_pki_types::pem::PemObject::pem_slice_iter(ca_pem.as_bytes()) {
        let c: rustls_pki_types::CertificateDer<'static> =
            c.map_err(|e| anyhow::anyhow!("cluster CA: {e:?}"))?;
        roots.add(c)?;
    }
    let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
        Arc::new(roots),
        provider.clone(),
    )
    // A client without a certificate may still come with a bearer token.
    .allow_unauthenticated()
    .build()
    .map_err(|e| anyhow::anyhow!("client verifier: {e}"))?;
    let config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_client_cert_verifier(verifier)
        .with_cert_resolver(serving.clone());
    Ok((config, serving))
}

fn router(ctx: Arc<Ctx>) -> Router {
    Router::new()
        .route("/containerLogs/{ns}/{pod}/{container}", get(logs))
        .route("/exec/{ns}/{pod}/{container}", any(exec))
        .route("/attach/{ns}/{pod}/{container}", any(attach))
        .route("/portForward/{ns}/{pod}", any(port_forward))
        .route("/stats/summary", get(stats_summary))
        .route("/metrics/resource", get(resource_metrics))
        .route("/metrics", get(node_metrics))
        .route("/healthz", get(|| async { "ok" }))
        .with_state(ctx)
}

fn status(code: StatusCode, message: String) -> Response {
    (code, message).into_response()
}

async fn stats_summary(State(ctx): State<Arc<Ctx>>) -> Response {
    match ctx.stats.summary(ctx.runtime.as_ref()).await {
        Ok(s) => match serde_json::to_vec(&s) {
            Ok(b) => ([(http::header::CONTENT_TYPE, "application/json")], b).into_response(),
            Err(e) => status(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
        },
        Err(e) => status(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("failed to get the node's stats: {e:#}"),
        ),
    }
}

async fn resource_metrics(State(ctx): State<Arc<Ctx>>) -> Response {
    let text = ctx.stats.resource_metrics(ctx.runtime.as_ref()).await;
    (
        [(
            http::header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        text,
    )
        .into_response()
}

/// The agent's own metrics: the undeclared connections its pods made
/// (see `proxy::policy::undeclared`).
async fn node_metrics() -> Response {
    (
        [(
            http::header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        crate::proxy::policy::undeclared::metrics_text(),
    )
        .into_response()
}

/// The containers of a pod's container name, newest first.
async fn instances(
    rt: &dyn Runtime,
    ns: &str,
    pod: &str,
    container: &str,
) -> Result<Vec<cri::Container>> {
    let mut v: Vec<cri::Container> = rt
        .list_containers(None)
        .await?
        .into_iter()
        .filter(|c| {
            c.labels.get(LABEL_POD_NAMESPACE).map(String::as_str) == Some(ns)
                && c.labels.get(LABEL_POD_NAME).map(String::as_str) == Some(pod)
                && c.labels.get(LABEL_CONTAINER_NAME).map(String::as_str) == Some(container)
        })
        .collect();
    v.sort_by_key(|c| {
        std::cmp::Reverse((
            c.metadata.as_ref().map(|m| m.attempt).unwrap_or(0),
            c.created_at,
        ))
    });
    Ok(v)
}

/// One parsed line of a CRI log file.
struct LogLine {
    time: String,
    content: String,
    partial: bool,
}

fn parse_line(line: &str) -> Option<LogLine> {
    let mut parts = line.splitn(4, ' ');
    let time = parts.next()?.to_string();
    let _stream = parts.next()?;
    let tag = parts.next()?;
    let content = parts.next().unwrap_or("").to_string();
    Some(LogLine {
        time,
        content,
        partial: tag == "P",
    })
}

fn render(l: &LogLine, timestamps: bool) -> String {
    let mut s = String::new();
    if timestamps {
        s.push_str(&l.time);
        s.push(' ');
    }
    s.push_str(&l.content);
    if !l.partial {
        s.push('\n');
    }
    s
}

fn since_filter(q: &HashMap<String, String>) -> Option<k8s_openapi::jiff::Timestamp> {
    if let Some(t) = q.get("sinceTime") {
        return t.parse().ok();
    }
    let secs: i64 = q.get("sinceSeconds")?.parse().ok()?;
    Some(k8s_openapi::jiff::Timestamp::now() - k8s_openapi::jiff::SignedDuration::from_secs(secs))
}

async fn logs(
    State(ctx): State<Arc<Ctx>>,
    Path((ns, pod, container)): Path<(String, String, String)>,
    Query(q): Query<HashMap<String, String>>,
) -> Response {
    let flag = |k: &str| q.get(k).map(|v| v == "true" || v == "1").unwrap_or(false);
    let previous = flag("previous");
    let follow = flag("follow") && !previous;
    let timestamps = flag("timestamps");
    let tail: Option<usize> = q.get("tailLines").and_then(|v| v.parse().ok());
    let limit: Option<usize> = q.get("limitBytes").and_then(|v| v.parse().ok());
    let since = since_filter(&q);
    let list = match instances(ctx.runtime.as_ref(), &ns, &pod, &container).await {
        Ok(l) => l,
        Err(e) => return status(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
    };
    let chosen = if previous { list.get(1) } else { list.first() };
    let Some(chosen) = chosen.cloned() else {
        let msg = if previous {
            format!("previous terminated container \"{container}\" in pod \"{pod}\" not found")
        } else {
            format!(
                "container \"{container}\" in pod \"{pod}\" is waiting to start: ContainerCreating"
            )
        };
        return status(StatusCode::BAD_REQUEST, msg);
    };
    let st = match ctx.runtime.container_status(&chosen.id).await {
        Ok(Some(s)) => s,
        _ => {
            return status(
                StatusCode::NOT_FOUND,
                format!("container {container} not found"),
            )
        }
    };
    let path = PathBuf::from(&st.log_path);
    let runtime = ctx.runtime.clone();
    let id = chosen.id.clone();
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<bytes::Bytes, std::io::Error>>(16);
    tokio::spawn(async move {
        let mut sent = 0usize;
        let mut send = |s: String| {
            let mut b = s.into_bytes();
            if let Some(limit) = limit {
                if sent >= limit {
                    return None;
                }
                b.truncate(limit - sent);
            }
            sent += b.len();
            Some(bytes::Bytes::from(b))
        };
        let keep = |l: &LogLine| match since {
            Some(t) => l
                .time
                .parse::<k8s_openapi::jiff::Timestamp>()
                .map(|lt| lt >= t)
                .unwrap_or(true),
            None => true,
        };
        let Ok(mut file) = tokio::fs::File::open(&path).await else {
            return;
        };
        let mut content = String::new();
        if file.read_to_string(&mut content).await.is_err() {
            return;
        }
        let mut lines: Vec<LogLine> = content
            .lines()
            .filter_map(parse_line)
            .filter(keep)
            .collect();
        if let Some(n) = tail {
            let skip = lines.len().saturating_sub(n);
            lines.drain(..skip);
        }
        for l in &lines {
            let Some(b) = send(render(l, timestamps)) else {
                return;
            };
            if tx.send(Ok(b)).await.is_err() {
                return;
            }
        }
        if !follow {
            return;
        }
        let mut pos = content.len() as u64;
        let mut pending = String::new();
        loop {
            let running = matches!(
                runtime.container_status(&id).await,
                Ok(Some(s)) if s.state == cri::ContainerState::ContainerRunning as i32
            );
            let Ok(mut f) = tokio::fs::File::open(&path).await else {
                return;
            };
            if f.seek(std::io::SeekFrom::Start(pos)).await.is_err() {
                return;
            }
            let mut reader = tokio::io::BufReader::new(f);
            loop {
                let mut line = String::new();
                match reader.read_line(&mut line).await {
                    Ok(0) | Err(_) => break,
                    Ok(n) => {
                        pos += n as u64;
                        pending.push_str(&line);
                        if pending.ends_with('\n') {
                            let full = std::mem::take(&mut pending);
                            if let Some(l) = parse_line(full.trim_end_matches('\n')) {
                                let Some(b) = send(render(&l, timestamps)) else {
                                    return;
                                };
                                if tx.send(Ok(b)).await.is_err() {
                                    return;
                                }
                            }
                        }
                    }
                }
            }
            if !running {
                return;
            }
            if tx.is_closed() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    });
    Response::builder()
        .header("content-type", "text/plain")
        .body(Body::from_stream(tokio_stream_from(rx)))
        .unwrap_or_else(|_| StatusCode::INTERNAL_SERVER_ERROR.into_response())
}

fn tokio_stream_from(
    mut rx: tokio::sync::mpsc::Receiver<Result<bytes::Bytes, std::io::Error>>,
) -> impl futures::Stream<Item = Result<bytes::Bytes, std::io::Error>> {
    futures::stream::poll_fn(move |cx| rx.poll_recv(cx))
}

fn query_all(req: &Request) -> Vec<(String, String)> {
    let q = req.uri().query().unwrap_or("");
    skiff_core::query::pairs(q)
}

fn flag_of(pairs: &[(String, String)], k: &str) -> bool {
    pairs
        .iter()
        .any(|(key, v)| key == k && (v == "true" || v == "1"))
}

async fn exec(
    State(ctx): State<Arc<Ctx>>,
    Path((ns, pod, container)): Path<(String, String, String)>,
    req: Request,
) -> Response {
    let q = query_all(&req);
    let list = match instances(ctx.runtime.as_ref(), &ns, &pod, &container).await {
        Ok(l) => l,
        Err(e) => return status(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
    };
    let Some(c) = list.first() else {
        return status(
            StatusCode::NOT_FOUND,
            format!("container {container} not found in pod {pod}"),
        );
    };
    let cmd: Vec<String> = q
        .iter()
        .filter(|(k, _)| k == "command")
        .map(|(_, v)| v.clone())
        .collect();
    let streams = streams_of(&q);
    let r = cri::ExecRequest {
        container_id: c.id.clone(),
        cmd,
        tty: streams.tty,
        stdin: streams.stdin,
        stdout: streams.stdout,
        stderr: streams.stderr,
    };
    match ctx.runtime.exec(r).await {
        Ok(url) => stream_session(url, req, streams).await,
        Err(e) => status(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
    }
}

async fn attach(
    State(ctx): State<Arc<Ctx>>,
    Path((ns, pod, container)): Path<(String, String, String)>,
    req: Request,
) -> Response {
    let q = query_all(&req);
    let list = match instances(ctx.runtime.as_ref(), &ns, &pod, &container).await {
        Ok(l) => l,
        Err(e) => return status(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
    };
    let Some(c) = list.first() else {
        return status(
            StatusCode::NOT_FOUND,
            format!("container {container} not found in pod {pod}"),
        );
    };
    let streams = streams_of(&q);
    let r = cri::AttachRequest {
        container_id: c.id.clone(),
        tty: streams.tty,
        stdin: streams.stdin,
        stdout: streams.stdout,
        stderr: streams.stderr,
    };
    match ctx.runtime.attach(r).await {
        Ok(url) => stream_session(url, req, streams).await,
        Err(e) => status(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
    }
}

async fn port_forward(
    State(ctx): State<Arc<Ctx>>,
    Path((ns, pod)): Path<(String, String)>,
    req: Request,
) -> Response {
    let q = query_all(&req);
    let sandboxes = match ctx.runtime.list_sandboxes(None).await {
        Ok(s) => s,
        Err(e) => return status(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
    };
    let Some(sb) = sandboxes
        .iter()
        .filter(|s| {
            s.state == cri::PodSandboxState::SandboxReady as i32
                && s.labels.get(LABEL_POD_NAMESPACE).map(String::as_str) == Some(ns.as_str())
                && s.labels.get(LABEL_POD_NAME).map(String::as_str) == Some(pod.as_str())
        })
        .max_by_key(|s| s.created_at)
    else {
        return status(
            StatusCode::NOT_FOUND,
            format!("pod {ns}/{pod} has no running sandbox"),
        );
    };
    let ports: Vec<i32> = q
        .iter()
        .filter(|(k, _)| k == "port")
        .filter_map(|(_, v)| v.parse().ok())
        .collect();
    match ctx.runtime.port_forward(&sb.id, ports).await {
        Ok(url) => relay(url, req).await,
        Err(e) => status(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
    }
}

/// The streams an exec or attach asks for.
fn streams_of(q: &[(String, String)]) -> crate::streams::Streams {
    crate::streams::Streams {
        tty: flag_of(q, "tty"),
        stdin: flag_of(q, "stdin") || flag_of(q, "input"),
        stdout: flag_of(q, "stdout") || flag_of(q, "output"),
        stderr: flag_of(q, "stderr") || flag_of(q, "error"),
    }
}

/// An exec or attach session: a WebSocket client offering v5 is answered
/// here (the runtime speaks at most v4, see [`crate::streams`]); any other
/// upgrade is relayed to the runtime as it is.
async fn stream_session(url: String, req: Request, streams: crate::streams::Streams) -> Response {
    if crate::streams::offers_v5(req.headers()) {
        return crate::streams::serve_v5(url, req, streams).await;
    }
    relay(url, req).await
}

/// Sends the client's (upgrade) request to the runtime's streaming URL; on
/// 101 joins the two upgraded connections.
async fn relay(url: String, mut req: Request) -> Response {
    let Ok(uri) = url.parse::<http::Uri>() else {
        return status(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("bad streaming URL {url}"),
        );
    };
    let host = uri.host().unwrap_or("127.0.0.1").to_string();
    let port = uri.port_u16().unwrap_or(80);
    let path = uri
        .path_and_query()
        .map(|p| p.as_str().to_string())
        .unwrap_or_else(|| "/".into());
    let client_upgrade = hyper::upgrade::on(&mut req);
    let tcp = match tokio::net::TcpStream::connect((host.as_str(), port)).await {
        Ok(t) => t,
        Err(e) => {
            return status(
                StatusCode::BAD_GATEWAY,
                format!("connecting to the runtime's streaming server: {e}"),
            )
        }
    };
    let (mut sender, conn) = match hyper::client::conn::http1::handshake(TokioIo::new(tcp)).await {
        Ok(x) => x,
        Err(e) => return status(StatusCode::BAD_GATEWAY, e.to_string()),
    };
    tokio::spawn(async move {
        let _ = conn.with_upgrades().await;
    });
    let mut out = http::Request::builder()
        .method(req.method().clone())
        .uri(path);
    let headers: &HeaderMap = req.headers();
    for (k, v) in headers {
        if k == http::header::HOST {
            continue;
        }
        out = out.header(k, v);
    }
    out = out.header(http::header::HOST, format!("{host}:{port}"));
    let Ok(out) = out.body(http_body_util::Empty::<bytes::Bytes>::new()) else {
        return status(
            StatusCode::INTERNAL_SERVER_ERROR,
            "building the relay request".into(),
        );
    };
    let mut resp = match sender.send_request(out).await {
        Ok(r) => r,
        Err(e) => return status(StatusCode::BAD_GATEWAY, e.to_string()),
    };
    if resp.status() != StatusCode::SWITCHING_PROTOCOLS {
        let (parts, body) = resp.into_parts();
        return Response::from_parts(parts, Body::new(body));
    }
    let runtime_upgrade = hyper::upgrade::on(&mut resp);
    tokio::spawn(async move {
        let (Ok(a), Ok(b)) = (client_upgrade.await, runtime_upgrade.await) else {
            return;
        };
        let mut a = TokioIo::new(a);
        let mut b = TokioIo::new(b);
        let _ = tokio::io::copy_bidirectional(&mut a, &mut b).await;
    });
    let mut builder = Response::builder().status(StatusCode::SWITCHING_PROTOCOLS);
    for (k, v) in resp.headers() {
        builder = builder.header(k, v);
    }
    builder
        .body(Body::empty())
        .unwrap_or_else(|_| StatusCode::INTERNAL_SERVER_ERROR.into_response())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cri_log_lines_render_with_and_without_timestamps_and_partials_join() {
        let full = parse_line("2026-01-01T00:00:00.000000001Z stdout F hello world").unwrap();
        assert_eq!(render(&full, false), "hello world\n");
        assert_eq!(
            render(&full, true),
            "2026-01-01T00:00:00.000000001Z hello world\n"
        );
        let part = parse_line("2026-01-01T00:00:00Z stderr P abc").unwrap();
        assert_eq!(render(&part, false), "abc");
        let empty = parse_line("2026-01-01T00:00:00Z stdout F").unwrap();
        assert_eq!(render(&empty, false), "\n");
    }

    #[test]
    fn repeated_command_parameters_keep_their_order_and_decode() {
        let q = skiff_core::query::pairs("command=sh&command=-c&command=echo+hi%21&stdin=true");
        let cmd: Vec<_> = q
            .iter()
            .filter(|(k, _)| k == "command")
            .map(|(_, v)| v.as_str())
            .collect();
        assert_eq!(cmd, ["sh", "-c", "echo hi!"]);
        assert!(flag_of(&q, "stdin"));
        assert!(!flag_of(&q, "tty"));
    }
}
