//! The HTTP surface: one entry point that authenticates, routes a Kubernetes
//! URL to discovery, OpenAPI, health or a resource verb, and renders the
//! answer in the form the client accepts.

use std::sync::Arc;

use axum::body::Body;
use axum::extract::State;
use axum::http::{header, HeaderMap, HeaderValue, Method, Request, Response, StatusCode};
use bytes::Bytes;
use http_body_util::BodyExt;
use serde_json::{json, Value};
use skiff_core::convert;
use skiff_core::resources::ResourceInfo;
use skiff_core::selector::{FieldSelector, LabelSelector};
use skiff_core::ApiError;

use crate::auth::{self, Identity};
use crate::crd::conversion;
use crate::negotiate::{self, Output};
use crate::registry::{DeleteOptions, Deleted, FieldValidation, PatchType, Registry, WriteOptions};
use crate::request::Subresource;
use crate::request::{self, Query, ResourceRequest};
use crate::watch;
use crate::watchcache::Filter;

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
    pub metrics_windows: crate::metricsapi::Windows,
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

type Resp = Response<Body>;

/// A JSON response.
pub fn json_response(code: u16, v: &Value) -> Resp {
    bytes_response(
        code,
        "application/json",
        Bytes::from(serde_json::to_vec(v).unwrap_or_default()),
    )
}

fn bytes_response(code: u16, content_type: &str, body: Bytes) -> Resp {
    Response::builder()
        .status(StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR))
        .header(header::CONTENT_TYPE, content_type)
        .body(Body::from(body))
        .unwrap_or_else(|_| Response::new(Body::empty()))
}

/// An error as a `Status` response.
pub fn error_response(e: &ApiError) -> Resp {
    let mut r = json_response(e.code, &e.to_status());
    if let Some(s) = e.retry_after_seconds {
        if let Ok(v) = HeaderValue::from_str(&s.to_string()) {
            r.headers_mut().insert(header::RETRY_AFTER, v);
        }
    }
    add_warnings(r, &e.warnings)
}

/// A write's outcome; a failed one still carries what admission said
/// (its warnings as headers, its audit annotations), as kube-apiserver's
/// do when a webhook warns and then denies.
fn admitted<T>(
    r: Result<T, ApiError>,
    admission: &crate::webhook::Admission,
    audit: Option<&crate::audit::Slot>,
) -> Result<T, ApiError> {
    r.map_err(|e| e.with_warnings(admission.finish(audit)))
}

fn text(code: u16, s: &str) -> Resp {
    bytes_response(
        code,
        "text/plain; charset=utf-8",
        Bytes::from(s.to_string()),
    )
}

/// `/readyz`: the store answers (Kubernetes' `etcd` check) and the
/// server is ready (`informer-sync`), as kube-apiserver lists its checks.
async fn readyz(state: &AppState, verbose: bool) -> Resp {
    let store = tokio::time::timeout(
        std::time::Duration::from_secs(2),
        state.registry.current_revision(),
    )
    .await;
    let etcd = match store {
        Ok(Ok(_)) => Ok(()),
        Ok(Err(e)) => Err(e.to_string()),
        Err(_) => Err("no answer within 2s".to_string()),
    };
    let synced = state.ready.load(std::sync::atomic::Ordering::Relaxed);
    if etcd.is_ok() && synced && !verbose {
        return text(200, "ok");
    }
    let mut out = String::from("[+]ping ok\n");
    match &etcd {
        Ok(()) => out.push_str("[+]etcd ok\n"),
        Err(e) => {
            tracing::warn!(error = %e, "readyz: the store does not answer");
            out.push_str("[-]etcd failed: reason withheld\n");
        }
    }
    out.push_str(if synced {
        "[+]informer-sync ok\n"
    } else {
        "[-]informer-sync failed: not ready\n"
    });
    if etcd.is_ok() && synced {
        out.push_str("readyz check passed");
        text(200, &out)
    } else {
        out.push_str("readyz check failed");
        text(500, &out)
    }
}

/// The one handler behind the router.
pub async fn handle(State(state): State<Arc<AppState>>, req: Request<Body>) -> Resp {
    if !crate::slowlog::enabled() {
        return handle_request(state, req).await;
    }
    let (method, path) = (req.method().clone(), req.uri().path().to_string());
    crate::slowlog::traced(method.as_str(), &path, handle_request(state, req)).await
}

async fn handle_request(state: Arc<AppState>, mut req: Request<Body>) -> Resp {
    let path = req.uri().path().to_string();
    let who = match authenticate(&state, &mut req).await {
        Ok(who) => who,
        Err(e) => return error_response(&e),
    };
    let audit = req.extensions().get::<crate::audit::Slot>().cloned();
    let original = audit.as_ref().map(|a| {
        a.authenticated(&who);
        who.clone()
    });
    let who = match auth::impersonate(&state.registry.authz, who, req.headers()) {
        Ok(who) => who,
        Err(e) => return error_response(&e),
    };
    if let (Some(a), Some(o)) = (&audit, &original) {
        a.impersonated(o, &who);
    }
    let mut a = skiff_core::rbac::request_info(req.method().as_str(), &path, req.uri().query());
    // Priority and fairness before authorization, as kube-apiserver's
    // filters run: a seat (or a watch's place) is held until the request
    // is done; a refused one is a 429 with Retry-After.
    let admitted = {
        let limit = crate::flowcontrol::query_limit(req.uri().query());
        let objects = || {
            crate::request::parse_path(&path)
                .ok()
                .flatten()
                .map(|rr| state.registry.cache().resource(rr.res).len())
                .unwrap_or(0)
        };
        match state.flow.admit(&who, &a, objects, limit).await {
            Ok(x) => x,
            Err(e) => return error_response(&e),
        }
    };
    crate::slowlog::mark("admitted");
    let response = authorize_and_serve(state.clone(), req, who, &mut a, path, audit).await;
    // A watch keeps its place, and a request its seats, until its body is
    // sent (or the client goes): so a list's bytes waiting for a slow
    // reader still count against its level, which bounds their memory.
    let guard: Box<dyn Send + Sync + Unpin> = match admitted {
        crate::flowcontrol::Admitted::Watch(slot) => Box::new(slot),
        crate::flowcontrol::Admitted::Seat(seat) => Box::new(seat),
        _ => return response,
    };
    let (parts, body) = response.into_parts();
    Response::from_parts(
        parts,
        Body::new(crate::flowcontrol::Guarded::new(body, guard)),
    )
}

/// Authorization (RBAC, the Node authorizer, NodeRestriction's request
/// checks), then the request itself.
async fn authorize_and_serve(
    state: Arc<AppState>,
    mut req: Request<Body>,
    who: Identity,
    a: &mut skiff_core::rbac::Attributes,
    path: String,
    audit: Option<crate::audit::Slot>,
) -> Resp {
    if !who.is_master() {
        a.user = who.user.clone();
        a.groups = who.groups.clone();
        let a = &*a;
        let allowed = state.registry.authz.authorize(a);
        if let Some(slot) = &audit {
            slot.authorized(allowed);
        }
        if !allowed {
            let why = state.registry.authz.reason(a);
            return error_response(&skiff_core::rbac::forbidden(a, &why));
        }
        if let Err(e) = crate::noderestriction::admit_request(&state.registry, a).await {
            return error_response(&e);
        }
    } else if let Some(slot) = &audit {
        slot.authorized(true);
    }
    req.extensions_mut().insert(who);
    if let Some((ns, pod, sub)) = crate::nodeproxy::parse(&path) {
        let method = req.method().clone();
        let allowed = match sub {
            "log" => method == Method::GET,
            _ => method == Method::GET || method == Method::POST,
        };
        if allowed {
            let user = req.extensions().get::<Identity>().cloned();
            let q = req.uri().query().map(str::to_string);
            let admitted = crate::webhook::admit_connect(
                &state.registry,
                &ns,
                &pod,
                sub,
                q.as_deref(),
                user.as_ref(),
            );
            if let Err(e) = admitted.await {
                return error_response(&e);
            }
            return match crate::nodeproxy::proxy(&state, req, &ns, &pod, sub).await {
                Ok(r) => r,
                Err(e) => error_response(&e),
            };
        }
    }
    if let Some((node, port, agent_path)) = crate::nodeproxy::parse_node(&path) {
        return match crate::nodeproxy::proxy_node(&state, req, &node, port, &agent_path).await {
            Ok(r) => r,
            Err(e) => error_response(&e),
        };
    }
    if let Some(t) = crate::aggregator::target(&state.registry, &path) {
        return match crate::aggregator::serve(&state, req, t).await {
            Ok(r) => r,
            Err(e) => error_response(&e),
        };
    }
    if let Some(name) = crate::componentstatus::parse(&path) {
        return match crate::componentstatus::serve(&state, req, name).await {
            Ok(r) => r,
            Err(e) => error_response(&e),
        };
    }
    if let Some(target) = crate::metricsapi::parse(&path) {
        return match crate::metricsapi::serve(&state, req, target).await {
            Ok(r) => r,
            Err(e) => error_response(&e),
        };
    }
    match route(&state, req).await {
        Ok(r) => r,
        Err(e) => error_response(&e),
    }
}

/// The caller: the identity the connection established (client
/// certificate, in-process component), else a bearer token's, else
/// `system:anonymous`. Credentials that prove nothing are 401.
async fn authenticate(state: &AppState, req: &mut Request<Body>) -> Result<Identity, ApiError> {
    if let Some(id) = req.extensions_mut().remove::<Identity>() {
        return Ok(id);
    }
    // Nothing borrowed from the request lives across the await (a body is
    // not Sync).
    let token = auth::bearer_token(req.headers()).map(str::to_string);
    let has_authorization = req.headers().contains_key(header::AUTHORIZATION);
    match token {
        Some(token) => {
            if let Some(r) = crate::bootstrap_token::authenticate(&state.registry, &token).await {
                return r;
            }
            match &state.tokens {
                Some(t) => t.authenticate(&state.registry, &token).await,
                None => Err(ApiError::unauthorized()),
            }
        }
        None if has_authorization => Err(ApiError::unauthorized()),
        None => Ok(Identity::anonymous()),
    }
}

async fn route(state: &Arc<AppState>, req: Request<Body>) -> Result<Resp, ApiError> {
    let path = req.uri().path().trim_end_matches('/').to_string();
    let path = if path.is_empty() {
        "/".to_string()
    } else {
        path
    };
    let query = Query::parse(req.uri().query());
    let accept = req
        .headers()
        .get(header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    let get = req.method() == Method::GET;
    match path.as_str() {
        "/healthz" | "/livez" => return Ok(text(200, "ok")),
        "/readyz" => return Ok(readyz(state.as_ref(), query.0.contains_key("verbose")).await),
        "/version" if get => return Ok(json_response(200, &version())),
        "/.well-known/openid-configuration" | "/openid/v1/jwks" if get => {
            let Some(t) = &state.tokens else {
                return Err(crate::request::not_found_path(&path));
            };
            return Ok(if path == "/openid/v1/jwks" {
                bytes_response(
                    200,
                    "application/jwk-set+json",
                    Bytes::from(t.jwks().to_string()),
                )
            } else {
                json_response(200, &t.openid_configuration())
            });
        }
        "/metrics" if get => {
            return match state.metrics {
                Some(metrics) => Ok(bytes_response(
                    200,
                    "text/plain; version=0.0.4; charset=utf-8",
                    Bytes::from(metrics()),
                )),
                None => Err(crate::request::not_found_path(&path)),
            };
        }
        "/api" if get => {
            return match negotiate::choose_output(accept.as_deref())? {
                Output::Discovery { v2beta1 } => Ok(discovery_response(
                    skiff_core::discovery::aggregated_discovery_in(state.catalog(), true),
                    v2beta1,
                )),
                _ => Ok(json_response(
                    200,
                    &skiff_core::discovery::api_versions(&state.advertise),
                )),
            };
        }
        "/apis" if get => {
            return match negotiate::choose_output(accept.as_deref())? {
                Output::Discovery { v2beta1 } => Ok(discovery_response(
                    crate::aggregator::merge_aggregated(
                        &state.registry,
                        &state.aggregator,
                        skiff_core::discovery::aggregated_discovery_in(state.catalog(), false),
                    ),
                    v2beta1,
                )),
                _ => Ok(json_response(
                    200,
                    &crate::aggregator::merge_group_list(
                        &state.registry,
                        skiff_core::discovery::api_group_list_in(state.catalog()),
                    ),
                )),
            };
        }
        "/openapi/v2" if get => {
            // client-go asks for gnostic's protobuf Document (Accept:
            // `...spec.v2@v1.0+protobuf`); the answer's type has a dot for the
            // `@`, which Go's media type parser refuses. JSON otherwise.
            const PB: &str = "application/com.github.proto-openapi.spec.v2.v1.0+protobuf";
            let a = accept.as_deref().unwrap_or("");
            let pb = a.find("application/com.github.proto-openapi.spec.v2");
            let json = a.find("application/json");
            let want_pb = matches!((pb, json), (Some(p), j) if j.is_none_or(|j| p < j));
            // With custom resources (and aggregated servers' definitions),
            // the document of this moment; else the static built-in one.
            let docs = crate::aggregator::openapi_v2(&state.aggregator, state.catalog());
            return Ok(match (docs, want_pb) {
                (Some(d), true) => bytes_response(200, PB, Bytes::from(d.protobuf.clone())),
                (Some(d), false) => {
                    bytes_response(200, "application/json", Bytes::from(d.json.clone()))
                }
                (None, true) => bytes_response(
                    200,
                    PB,
                    Bytes::from_static(skiff_core::openapi_pb::openapi_v2_protobuf()),
                ),
                (None, false) => bytes_response(
                    200,
                    "application/json",
                    Bytes::from_static(skiff_core::openapi::openapi_v2_bytes()),
                ),
            });
        }
        "/openapi/v3" if get => {
            return Ok(json_response(
                200,
                &crate::aggregator::merge_v3_index(
                    &state.aggregator,
                    skiff_core::openapi::openapi_v3_index_in(state.catalog()),
                ),
            ))
        }
        _ => {}
    }
    if get {
        if let Some(rest) = path.strip_prefix("/openapi/v3/") {
            let gv = match rest.split('/').collect::<Vec<_>>().as_slice() {
                ["api", v] => Some(("", *v)),
                ["apis", g, v] => Some((*g, *v)),
                _ => None,
            };
            if let Some((g, v)) = gv {
                if let Some(doc) = crate::aggregator::openapi_v3(&state.aggregator, g, v) {
                    return Ok(json_response(200, &doc));
                }
                if let Some(doc) =
                    skiff_core::openapi::openapi_v3_group_version_in(state.catalog(), g, v)
                {
                    return Ok(json_response(200, &doc));
                }
            }
            return Err(request::not_found_path(&path));
        }
        let segs: Vec<&str> = path.trim_start_matches('/').split('/').collect();
        match segs.as_slice() {
            ["api", v] => {
                return skiff_core::discovery::api_resource_list_in(state.catalog(), "", v)
                    .map(|d| json_response(200, &d))
                    .ok_or_else(|| request::not_found_path(&path))
            }
            ["apis", g] => {
                return skiff_core::discovery::api_group_in(state.catalog(), g)
                    .map(|d| json_response(200, &d))
                    .ok_or_else(|| request::not_found_path(&path))
            }
            ["apis", g, v] => {
                return skiff_core::discovery::api_resource_list_in(state.catalog(), g, v)
                    .map(|d| json_response(200, &d))
                    .ok_or_else(|| request::not_found_path(&path))
            }
            _ => {}
        }
    }
    let Some(rr) = request::parse_path_in(state.catalog(), &path)? else {
        return Err(request::not_found_path(&path));
    };
    // A deprecated version of a custom resource answers with its warning.
    let deprecation = rr.res.rules.custom().and_then(|c| c.deprecation.clone());
    let r = resource(state, rr, query, accept, req).await;
    match deprecation {
        Some(w) => r.map(|r| add_warnings(r, &[w])),
        None => r,
    }
}

fn discovery_response(doc: Value, v2beta1: bool) -> Resp {
    let mut doc = doc;
    let v = if v2beta1 { "v2beta1" } else { "v2" };
    doc["apiVersion"] = json!(format!("apidiscovery.k8s.io/{v}"));
    let ct = format!("application/json;g=apidiscovery.k8s.io;v={v};as=APIGroupDiscoveryList");
    bytes_response(
        200,
        &ct,
        Bytes::from(serde_json::to_vec(&doc).unwrap_or_default()),
    )
}

/// `/version`.
pub fn version() -> Value {
    json!({
        "major": "1",
        "minor": "33",
        "gitVersion": format!("v1.33.0-skiff.{}", env!("CARGO_PKG_VERSION")),
        "gitCommit": "",
        "gitTreeState": "clean",
        "buildDate": "2026-01-01T00:00:00Z",
        "goVersion": "n/a (rust)",
        "compiler": "rustc",
        "platform": format!("{}/{}", std::env::consts::OS, if std::env::consts::ARCH == "x86_64" { "amd64" } else { std::env::consts::ARCH }),
    })
}

async fn read_body(req: Request<Body>) -> Result<(HeaderMap, Bytes), ApiError> {
    let (parts, mut body) = req.into_parts();
    let declared = parts
        .headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<usize>().ok());
    let mut too_large = declared.is_some_and(|len| len > negotiate::MAX_BODY);
    let mut buf = bytes::BytesMut::new();
    let mut discarded = 0usize;
    // A body over the limit is still read (and dropped, up to a bound) so
    // the client gets its 413 Status: refusing mid-upload resets the
    // HTTP/2 stream or the connection before the answer can arrive.
    while let Some(frame) = body.frame().await {
        let frame = match frame {
            Ok(f) => f,
            Err(e) if too_large => {
                tracing::debug!("request body over the limit ended early: {e}");
                break;
            }
            Err(e) => {
                return Err(ApiError::bad_request(format!(
                    "error reading request body: {e}"
                )))
            }
        };
        let Ok(data) = frame.into_data() else {
            continue;
        };
        if !too_large && buf.len() + data.len() <= negotiate::MAX_BODY {
            buf.extend_from_slice(&data);
            continue;
        }
        too_large = true;
        discarded += data.len();
        if discarded > DRAIN_LIMIT {
            break;
        }
    }
    if too_large {
        return Err(ApiError::too_large(format!(
            "Request entity too large: limit is {}",
            negotiate::MAX_BODY
        )));
    }
    Ok((parts.headers, buf.freeze()))
}

/// How much of a body over the limit is read and thrown away before the
/// 413 is sent anyway.
const DRAIN_LIMIT: usize = 64 * 1024 * 1024;

/// A create or replace request's body: the object, the write options, and
/// the raw bytes (for the duplicate-field check) with whether they are JSON.
struct WriteBody {
    obj: Value,
    opts: WriteOptions,
    body: Bytes,
    json_body: bool,
}

async fn read_write_body(
    req: Request<Body>,
    res: &ResourceInfo,
    q: &Query,
) -> Result<WriteBody, ApiError> {
    let (headers, body) = read_body(req).await?;
    let ct = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    let obj = negotiate::decode_body(ct.as_deref(), &body, res)?;
    let opts = write_options(q, &headers, false)?;
    let json_body = ct
        .as_deref()
        .map(|c| c.starts_with("application/json"))
        .unwrap_or(true);
    Ok(WriteBody {
        obj,
        opts,
        body,
        json_body,
    })
}

fn field_validation(q: &Query) -> Result<FieldValidation, ApiError> {
    match q.get("fieldValidation") {
        None | Some("") | Some("Warn") => Ok(FieldValidation::Warn),
        Some("Strict") => Ok(FieldValidation::Strict),
        Some("Ignore") => Ok(FieldValidation::Ignore),
        Some(other) => Err(ApiError::bad_request(format!(
            "fieldValidation parameter unsupported: {other:?}; supported values: \"Ignore\", \"Strict\", \"Warn\""
        ))),
    }
}

/// The manager name Kubernetes derives from a User-Agent (`kubectl/v1.33 (...)` → `kubectl`).
fn manager_from_user_agent(headers: &HeaderMap) -> String {
    let ua = headers
        .get(header::USER_AGENT)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("unknown");
    let first = ua.split('/').next().unwrap_or("unknown");
    let m: String = first
        .chars()
        .filter(|c| !c.is_control())
        .take(128)
        .collect();
    if m.is_empty() {
        "unknown".into()
    } else {
        m
    }
}

fn write_options(q: &Query, headers: &HeaderMap, apply: bool) -> Result<WriteOptions, ApiError> {
    let field_manager = match q.get("fieldManager") {
        Some(m) if !m.is_empty() => {
            if m.chars().count() > 128 || m.chars().any(|c| c.is_control()) {
                return Err(ApiError::invalid("", "PatchOptions", "", vec![skiff_core::Cause::invalid("fieldManager", &json!(m), "must be no more than 128 characters")]));
            }
            m.to_string()
        }
        _ if apply => {
            return Err(ApiError::invalid("", "PatchOptions", "", vec![skiff_core::Cause::required("fieldManager")]).with_message("PatchOptions.meta.k8s.io \"\" is invalid: fieldManager: Required value: is required for apply patch"))
        }
        _ => manager_from_user_agent(headers),
    };
    Ok(WriteOptions {
        dry_run: q.dry_run()?,
        field_manager,
        field_validation: field_validation(q)?,
        force: q.flag("force"),
        user: None,
        admission: Default::default(),
    })
}

trait WithMessage {
    fn with_message(self, m: &str) -> Self;
}
impl WithMessage for ApiError {
    fn with_message(mut self, m: &str) -> Self {
        self.message = m.to_string();
        self
    }
}

/// Unknown and duplicate fields, per `fieldValidation`: Strict fails, Warn warns.
fn check_fields(
    res: &ResourceInfo,
    body: &Bytes,
    obj: &Value,
    fv: FieldValidation,
    json_body: bool,
) -> Result<Vec<String>, ApiError> {
    if fv == FieldValidation::Ignore {
        return Ok(Vec::new());
    }
    let mut problems = Vec::new();
    if json_body {
        for d in skiff_core::patch::duplicate_fields_of(body, obj) {
            problems.push(format!("json: duplicate field \"{d}\""));
        }
    }
    if let Some(t) = skiff_core::schema::root(res.group, res.version, res.kind) {
        for u in skiff_core::patch::unknown_fields(t, obj) {
            problems.push(format!("unknown field \"{}\"", u.trim_start_matches('.')));
        }
    } else if let Some(c) = res.rules.custom() {
        // A custom resource: the fields its schema would prune.
        for u in c.unknown_fields(obj) {
            problems.push(format!("unknown field \"{}\"", u.trim_start_matches('.')));
        }
    }
    if problems.is_empty() {
        return Ok(problems);
    }
    if fv == FieldValidation::Strict {
        return Err(ApiError::bad_request(format!(
            "strict decoding error: {}",
            problems.join(", ")
        )));
    }
    Ok(problems)
}

/// A create's or update's decoding error, worded as kube-apiserver's
/// decoder reports it: the body's kind and version, then the resource's
/// kind (patches report the bare error).
fn decode_failure(res: &ResourceInfo, obj: &Value, e: ApiError) -> ApiError {
    let kind = obj.get("kind").and_then(Value::as_str).unwrap_or(res.kind);
    let version = obj
        .get("apiVersion")
        .and_then(Value::as_str)
        .map(|v| v.rsplit('/').next().unwrap_or(v))
        .unwrap_or(res.version);
    let message = format!(
        "{kind} in version \"{version}\" cannot be handled as a {}: {}",
        res.kind, e.message
    );
    e.with_message(&message)
}

fn add_warnings(mut r: Resp, warnings: &[String]) -> Resp {
    for w in warnings {
        let v = format!("299 - \"{}\"", w.replace('\\', "\\\\").replace('"', "\\\""));
        if let Ok(hv) = HeaderValue::from_str(&v) {
            r.headers_mut().append(header::WARNING, hv);
        }
    }
    r
}

pub(crate) fn filter_from_query(rr: &ResourceRequest, q: &Query) -> Result<Filter, ApiError> {
    let labels = match q.get("labelSelector") {
        Some(s) if !s.trim().is_empty() => Some(
            LabelSelector::parse(s)
                .map_err(|e| ApiError::bad_request(format!("unable to parse requirement: {e}")))?,
        ),
        _ => None,
    };
    let fields = match q.get("fieldSelector") {
        Some(s) if !s.trim().is_empty() => {
            let f = FieldSelector::parse(s).map_err(ApiError::bad_request)?;
            for (field, _, _) in f.requirements() {
                skiff_core::fields::check_supported(rr.res, field)?;
            }
            // The cache indexes fields as the stored version names them.
            Some(f.map_fields(|field| convert::storage_field(rr.res, field)))
        }
        _ => None,
    };
    Ok(Filter {
        namespace: rr.namespace.clone(),
        labels,
        fields,
    })
}

async fn resource(
    state: &Arc<AppState>,
    rr: ResourceRequest,
    q: Query,
    accept: Option<String>,
    req: Request<Body>,
) -> Result<Resp, ApiError> {
    let reg = &state.registry;
    // Requests name the version they speak (`api_res`); the registry works in
    // the stored version (`res`); bodies and answers are converted between.
    let api_res = rr.res;
    let res = convert::storage_resource(api_res);
    let ns = rr.namespace.as_deref();
    let method = req.method().clone();
    let who = req.extensions().get::<Identity>().cloned();
    let audit = req.extensions().get::<crate::audit::Slot>().cloned();
    let output = negotiate::choose_output(accept.as_deref())?;
    if api_res.is_review() {
        if method != Method::POST || rr.name.is_some() {
            return Err(ApiError::method_not_allowed(format!(
                "{} only answer create",
                api_res.plural
            )));
        }
        let identity = req
            .extensions()
            .get::<Identity>()
            .cloned()
            .unwrap_or_else(Identity::anonymous);
        let (headers, body) = read_body(req).await?;
        let ct = headers
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string);
        let mut obj = if ct
            .as_deref()
            .unwrap_or("")
            .starts_with("application/vnd.kubernetes.protobuf")
        {
            let t = skiff_core::schema::root(api_res.group, api_res.version, api_res.kind)
                .ok_or_else(|| {
                    ApiError::unsupported_media_type("application/vnd.kubernetes.protobuf")
                })?;
            skiff_core::protobuf::decode_with(&body, t, &api_res.api_version(), api_res.kind, true)?
        } else {
            negotiate::decode_body(ct.as_deref(), &body, api_res)?
        };
        crate::registry::check_type_meta(api_res, &mut obj)?;
        if api_res.storage == "authentication.k8s.io/tokenreviews" {
            let answered = match &state.tokens {
                Some(t) => t.review(&state.registry, obj).await,
                None => Err(ApiError::new(
                    503,
                    "ServiceUnavailable",
                    "the server has no ServiceAccount token issuer",
                )),
            }?;
            return Ok(json_response(201, &answered));
        }
        return Ok(json_response(
            201,
            &crate::authz::reviews::answer(
                &state.registry.authz,
                api_res.kind,
                ns,
                obj,
                &identity,
            )?,
        ));
    }
    match (&method, rr.name.as_deref(), rr.subresource.as_deref()) {
        // ---- collections
        (&Method::GET, None, None) => {
            let filter = filter_from_query(&rr, &q)?;
            if q.flag("watch") || rr.watch_path {
                return watch::serve(state.clone(), api_res, filter, &q, output).await;
            }
            let limit = q.int("limit")?.unwrap_or(0).max(0);
            let exact = q.get("resourceVersionMatch") == Some("Exact");
            let out = reg
                .list(
                    res,
                    &filter,
                    limit,
                    q.get("continue").filter(|c| !c.is_empty()),
                    q.get("resourceVersion"),
                    exact,
                )
                .await?;
            let mut out = out;
            out.items = conversion::list_from_storage(&**reg, api_res, out.items).await?;
            render_list(api_res, out, output, &q)
        }
        (&Method::POST, None, None) => {
            let WriteBody {
                obj,
                mut opts,
                body,
                json_body,
            } = read_write_body(req, api_res, &q).await?;
            opts.user = who;
            opts.admission.request = Some(api_res);
            let mut warnings = check_fields(api_res, &body, &obj, opts.field_validation, json_body)
                .map_err(|e| decode_failure(api_res, &obj, e))?;
            let stored = conversion::to_storage(&**reg, api_res, obj).await?;
            let (created, answer) = admitted(
                reg.create_answered(res, ns, stored, &opts).await,
                &opts.admission,
                audit.as_ref(),
            )?;
            warnings.extend(opts.admission.finish(audit.as_ref()));
            // Served as stored (no conversion) in JSON: the bytes the store
            // got, with the resourceVersion added, are the answer.
            if let Some(body) = answer.filter(|_| {
                matches!(output, Output::Json)
                    && !conversion::needed(api_res)
                    && !conversion::uses_webhook(api_res)
            }) {
                return Ok(add_warnings(
                    bytes_response(201, "application/json", body),
                    &warnings,
                ));
            }
            Ok(add_warnings(
                render_object(
                    api_res,
                    201,
                    &conversion::from_storage(&**reg, api_res, created).await?,
                    output,
                )?,
                &warnings,
            ))
        }
        (&Method::DELETE, None, None) => {
            let filter = filter_from_query(&rr, &q)?;
            let (headers, body) = read_body(req).await?;
            let mut dopts = delete_options(&q, &headers, &body)?;
            dopts.user = who;
            dopts.admission.request = Some(api_res);
            admitted(
                crate::webhook::admit_delete(reg, res, ns, "", &dopts).await,
                &dopts.admission,
                audit.as_ref(),
            )?;
            let out = reg.list(res, &filter, 0, None, None, false).await?;
            let mut gone = Vec::new();
            for item in out.items {
                let v: Value =
                    serde_json::from_slice(&item).map_err(|e| ApiError::internal(e.to_string()))?;
                let name = v
                    .pointer("/metadata/name")
                    .and_then(Value::as_str)
                    .unwrap_or("")
                    .to_string();
                let ins = v
                    .pointer("/metadata/namespace")
                    .and_then(Value::as_str)
                    .map(str::to_string);
                match reg.delete(res, ins.as_deref(), &name, &dopts).await {
                    Ok(Deleted::Gone(o)) | Ok(Deleted::Pending(o)) => gone.push(o),
                    Err(e) if e.code == 404 => {}
                    Err(e) => return Err(e),
                }
            }
            let list = json!({"kind": res.list_kind(), "apiVersion": res.api_version(), "metadata": {"resourceVersion": reg.cache().revision().to_string()}, "items": gone});
            Ok(add_warnings(
                json_response(200, &list),
                &delete_warnings(res, &dopts),
            ))
        }
        // ---- one object
        (&Method::GET, Some(name), None) => {
            if q.flag("watch") || rr.watch_path {
                let mut filter = filter_from_query(&rr, &q)?;
                let existing = q.get("fieldSelector").filter(|s| !s.trim().is_empty());
                let combined = match existing {
                    Some(s) => format!("{s},metadata.name={name}"),
                    None => format!("metadata.name={name}"),
                };
                filter.fields =
                    Some(FieldSelector::parse(&combined).map_err(ApiError::bad_request)?);
                return watch::serve(state.clone(), api_res, filter, &q, output).await;
            }
            let obj = reg.get(res, ns, name).await?;
            render_object(
                api_res,
                200,
                &conversion::from_storage(&**reg, api_res, obj).await?,
                output,
            )
        }
        (&Method::GET, Some(name), Some("approval")) if rr.sub == Subresource::Approval => {
            // The approval subresource reads as the whole request, as
            // Kubernetes' approval REST does.
            let obj = reg.get(res, ns, name).await?;
            render_object(api_res, 200, &obj, output)
        }
        (&Method::PUT, Some(name), Some("approval")) => {
            let WriteBody { obj, mut opts, .. } = read_write_body(req, api_res, &q).await?;
            opts.user = who;
            opts.admission.request = Some(api_res);
            let out = crate::certificates::approve(reg, name, obj, &opts).await?;
            render_object(api_res, 200, &out, output)
        }
        (&Method::PATCH, Some(name), Some("approval")) => {
            let (headers, body) = read_body(req).await?;
            let ct = headers
                .get(header::CONTENT_TYPE)
                .and_then(|v| v.to_str().ok())
                .map(str::to_string);
            let pt = negotiate::patch_type(ct.as_deref())?;
            let patch = negotiate::decode_patch(pt, &body)?;
            let mut opts = write_options(&q, &headers, pt == PatchType::Apply)?;
            opts.user = who;
            opts.admission.request = Some(api_res);
            let out = crate::certificates::patch_approval(reg, name, pt, &patch, &opts).await?;
            render_object(api_res, 200, &out, output)
        }
        (&Method::PUT, Some(name), _)
            if matches!(
                rr.sub,
                Subresource::Main
                    | Subresource::Status
                    | Subresource::Scale
                    | Subresource::Finalize
                    | Subresource::EphemeralContainers
            ) =>
        {
            let sub = rr.sub;
            let WriteBody {
                obj,
                mut opts,
                body,
                json_body,
            } = read_write_body(req, api_res, &q).await?;
            opts.user = who;
            opts.admission.request = Some(api_res);
            let mut warnings = if sub == Subresource::Scale {
                Vec::new()
            } else {
                check_fields(api_res, &body, &obj, opts.field_validation, json_body)
                    .map_err(|e| decode_failure(api_res, &obj, e))?
            };
            let obj = if sub == Subresource::Scale {
                obj
            } else {
                conversion::to_storage(&**reg, api_res, obj).await?
            };
            let (out, created) = admitted(
                reg.update(res, ns, name, obj, sub, &opts).await,
                &opts.admission,
                audit.as_ref(),
            )?;
            warnings.extend(opts.admission.finish(audit.as_ref()));
            let r = render_written(reg, api_res, sub, out, created, output).await?;
            Ok(add_warnings(r, &warnings))
        }
        (&Method::PATCH, Some(name), _)
            if matches!(
                rr.sub,
                Subresource::Main
                    | Subresource::Status
                    | Subresource::Scale
                    | Subresource::EphemeralContainers
            ) =>
        {
            let sub = rr.sub;
            let (headers, body) = read_body(req).await?;
            let ct = headers
                .get(header::CONTENT_TYPE)
                .and_then(|v| v.to_str().ok())
                .map(str::to_string);
            let pt = negotiate::patch_type(ct.as_deref())?;
            let patch = negotiate::decode_patch(pt, &body)?;
            let mut opts = write_options(&q, &headers, pt == PatchType::Apply)?;
            opts.user = who;
            opts.admission.request = Some(api_res);
            if q.get("force").is_some() && pt != PatchType::Apply {
                return Err(ApiError::bad_request(
                    "force flag can only be set for apply patches",
                ));
            }
            let mut warnings = Vec::new();
            if matches!(
                pt,
                PatchType::Merge | PatchType::Strategic | PatchType::Apply
            ) && sub != Subresource::Scale
            {
                let obj_like = strip_directives(&patch);
                warnings = check_fields(
                    api_res,
                    &body,
                    &obj_like,
                    opts.field_validation,
                    pt != PatchType::Apply,
                )?;
            }
            let patched = if (convert::needed(api_res) || conversion::uses_webhook(api_res))
                && sub != Subresource::Scale
            {
                patch_converted(reg, api_res, ns, name, pt, &patch, sub, &opts).await
            } else {
                reg.patch(res, ns, name, pt, &patch, sub, &opts).await
            };
            let (out, created) = admitted(patched, &opts.admission, audit.as_ref())?;
            warnings.extend(opts.admission.finish(audit.as_ref()));
            let r = render_written(reg, api_res, sub, out, created, output).await?;
            Ok(add_warnings(r, &warnings))
        }
        (&Method::GET, Some(name), Some("status" | "ephemeralcontainers")) => {
            let obj = reg.get(res, ns, name).await?;
            render_object(
                api_res,
                200,
                &conversion::from_storage(&**reg, api_res, obj).await?,
                output,
            )
        }
        (&Method::GET, Some(name), Some("scale")) => {
            let obj = reg.get(res, ns, name).await?;
            let scale = crate::registry::to_scale(res, &obj)?;
            match output {
                Output::Table { v1beta1 } => Ok(json_response(
                    200,
                    &table_of(
                        &skiff_core::table::SCALE_PRINTER,
                        std::slice::from_ref(&scale),
                        v1beta1,
                        None,
                        None,
                        None,
                        true,
                        "Metadata",
                    ),
                )),
                _ => Ok(json_response(200, &scale)),
            }
        }
        (&Method::POST, Some(name), Some("binding")) => {
            let (headers, body) = read_body(req).await?;
            let ct = headers
                .get(header::CONTENT_TYPE)
                .and_then(|v| v.to_str().ok())
                .map(str::to_string);
            let binding = if ct
                .as_deref()
                .unwrap_or("")
                .starts_with("application/vnd.kubernetes.protobuf")
            {
                let t = skiff_core::schema::root("", "v1", "Binding")
                    .ok_or_else(|| ApiError::internal("no Binding schema"))?;
                skiff_core::protobuf::decode(&body, t, "v1", "Binding")?
            } else {
                negotiate::decode_body(ct.as_deref(), &body, res)?
            };
            let opts = write_options(&q, &headers, false)?;
            reg.bind(ns.unwrap_or(""), name, &binding, &opts).await?;
            Ok(json_response(
                201,
                &json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201}),
            ))
        }
        (&Method::POST, Some(name), _) if rr.sub == Subresource::Token => {
            let (headers, body) = read_body(req).await?;
            let ct = headers
                .get(header::CONTENT_TYPE)
                .and_then(|v| v.to_str().ok())
                .map(str::to_string);
            let tr = if ct
                .as_deref()
                .unwrap_or("")
                .starts_with("application/vnd.kubernetes.protobuf")
            {
                let t = skiff_core::schema::root("authentication.k8s.io", "v1", "TokenRequest")
                    .ok_or_else(|| ApiError::internal("no TokenRequest schema"))?;
                skiff_core::protobuf::decode(&body, t, "authentication.k8s.io/v1", "TokenRequest")?
            } else {
                serde_json::from_slice::<Value>(&body).map_err(|e| {
                    ApiError::bad_request(format!("error decoding TokenRequest: {e}"))
                })?
            };
            let Some(t) = &state.tokens else {
                return Err(ApiError::new(
                    501,
                    "NotImplemented",
                    "the server has no ServiceAccount token issuer",
                ));
            };
            crate::noderestriction::admit_token_request(
                reg,
                name,
                ns.unwrap_or(""),
                &tr,
                who.as_ref(),
            )
            .await?;
            let out = t.request(reg, ns.unwrap_or(""), name, &tr).await?;
            Ok(json_response(201, &out))
        }
        (&Method::POST, Some(name), _) if rr.sub == Subresource::Eviction => {
            let (headers, body) = read_body(req).await?;
            let ct = headers
                .get(header::CONTENT_TYPE)
                .and_then(|v| v.to_str().ok())
                .map(str::to_string);
            let eviction = if ct
                .as_deref()
                .unwrap_or("")
                .starts_with("application/vnd.kubernetes.protobuf")
            {
                let t = skiff_core::schema::root("policy", "v1", "Eviction")
                    .ok_or_else(|| ApiError::internal("no Eviction schema"))?;
                skiff_core::protobuf::decode(&body, t, "policy/v1", "Eviction")?
            } else {
                serde_json::from_slice::<Value>(&body)
                    .map_err(|e| ApiError::bad_request(format!("error decoding Eviction: {e}")))?
            };
            let json_ct = HeaderMap::new();
            let dopts_body = match eviction.get("deleteOptions") {
                Some(d) if d.is_object() => Bytes::from(d.to_string()),
                _ => Bytes::new(),
            };
            let dopts = delete_options(&q, &json_ct, &dopts_body)?;
            crate::strategy::eviction::evict(reg, ns.unwrap_or(""), name, &eviction, &dopts)
                .await?;
            Ok(json_response(
                201,
                &json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201}),
            ))
        }
        (&Method::DELETE, Some(name), None) => {
            let (headers, body) = read_body(req).await?;
            let mut dopts = delete_options(&q, &headers, &body)?;
            dopts.user = who;
            dopts.admission.request = Some(api_res);
            let mut warnings = delete_warnings(res, &dopts);
            let deleted = admitted(
                async {
                    crate::webhook::admit_delete(reg, res, ns, name, &dopts).await?;
                    reg.delete(res, ns, name, &dopts).await
                }
                .await,
                &dopts.admission,
                audit.as_ref(),
            )?;
            warnings.extend(dopts.admission.finish(audit.as_ref()));
            let r = match deleted {
                Deleted::Pending(obj) => render_object(
                    api_res,
                    200,
                    &conversion::from_storage(&**reg, api_res, obj).await?,
                    output,
                ),
                Deleted::Gone(obj) => {
                    if res.returns_deleted_object() {
                        return render_object(
                            api_res,
                            200,
                            &conversion::from_storage(&**reg, api_res, obj).await?,
                            output,
                        );
                    }
                    let uid = obj.pointer("/metadata/uid").cloned().unwrap_or(json!(""));
                    let mut details = json!({"name": name, "kind": res.plural, "uid": uid});
                    if !res.group.is_empty() {
                        details["group"] = json!(res.group);
                    }
                    Ok(json_response(
                        200,
                        &json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "details": details}),
                    ))
                }
            };
            r.map(|r| add_warnings(r, &warnings))
        }
        (_, _, Some(sub))
            if matches!(
                sub,
                "log"
                    | "exec"
                    | "attach"
                    | "portforward"
                    | "proxy"
                    | "eviction"
                    | "token"
                    | "resize"
            ) =>
        {
            Err(ApiError::new(
                501,
                "NotImplemented",
                format!("the {sub} subresource is not served yet"),
            ))
        }
        _ => Err(ApiError::method_not_allowed(
            "the server does not allow this method on the requested resource",
        )),
    }
}

/// A patch on a version other than the stored one: the patch applies to the
/// object as that version shows it, and the result is written back guarded
/// by the revision read.
#[allow(clippy::too_many_arguments)]
async fn patch_converted(
    reg: &Registry,
    api_res: &'static ResourceInfo,
    ns: Option<&str>,
    name: &str,
    pt: PatchType,
    patch: &Value,
    sub: Subresource,
    opts: &WriteOptions,
) -> Result<(Value, bool), ApiError> {
    let res = convert::storage_resource(api_res);
    let schema = skiff_core::schema::root(api_res.group, api_res.version, api_res.kind)
        .or_else(|| api_res.rules.custom().and_then(|c| c.type_ref()));
    for _ in 0..16 {
        let cur = match reg.get(res, ns, name).await {
            // Server-side apply creates: applied in the request's version,
            // stored in the storage version.
            Err(e) if e.code == 404 && pt == PatchType::Apply && sub == Subresource::Main => {
                let mut obj = crate::registry::apply_patch(api_res, None, pt, patch, schema, opts)?;
                crate::object::metadata_mut(&mut obj).insert("name".into(), json!(name));
                let stored = conversion::to_storage(reg, api_res, obj).await?;
                match reg.create_applied(res, ns, stored, opts).await {
                    Err(e) if e.reason == "AlreadyExists" => continue,
                    other => return Ok((other?, true)),
                }
            }
            other => other?,
        };
        let view = conversion::from_storage(reg, api_res, cur.clone()).await?;
        let patched = crate::registry::apply_patch(api_res, Some(&view), pt, patch, schema, opts)?;
        let mut stored = conversion::to_storage(reg, api_res, patched).await?;
        let rv = cur
            .pointer("/metadata/resourceVersion")
            .cloned()
            .unwrap_or(Value::Null);
        if stored.pointer("/metadata/resourceVersion") != Some(&rv) {
            return Err(ApiError::conflict(
                res.group,
                res.plural,
                name,
                ApiError::STALE,
            ));
        }
        crate::object::metadata_mut(&mut stored).insert("resourceVersion".into(), rv);
        match reg.update(res, ns, name, stored, sub, opts).await {
            Err(e) if e.code == 409 && e.reason == "Conflict" => continue,
            other => return other,
        }
    }
    Err(ApiError::conflict(
        res.group,
        res.plural,
        name,
        ApiError::STALE,
    ))
}

/// A merge/strategic/apply patch without its `$` directives, for unknown-field checks.
fn strip_directives(v: &Value) -> Value {
    match v {
        Value::Object(m) => Value::Object(
            m.iter()
                .filter(|(k, _)| !k.starts_with('$'))
                .map(|(k, v)| (k.clone(), strip_directives(v)))
                .collect(),
        ),
        Value::Array(a) => Value::Array(a.iter().map(strip_directives).collect()),
        other => other.clone(),
    }
}

/// What a delete should warn about (the kind's strategy says).
fn delete_warnings(res: &ResourceInfo, o: &DeleteOptions) -> Vec<String> {
    crate::strategy::strategy_for(res).delete_warnings(o)
}

fn delete_options(q: &Query, headers: &HeaderMap, body: &Bytes) -> Result<DeleteOptions, ApiError> {
    let mut o = DeleteOptions {
        dry_run: q.dry_run()?,
        ..Default::default()
    };
    o.grace_period_seconds = q.int("gracePeriodSeconds")?;
    o.propagation_policy = q.get("propagationPolicy").map(str::to_string);
    o.orphan_dependents = match q.get("orphanDependents") {
        None => None,
        Some("true") => Some(true),
        Some("false") => Some(false),
        Some(v) => {
            return Err(ApiError::bad_request(format!(
                "orphanDependents: invalid boolean value {v:?}"
            )))
        }
    };
    if !body.is_empty() {
        let ct = headers
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("");
        let v: Value = if ct.starts_with("application/vnd.kubernetes.protobuf") {
            let t = skiff_core::schema::root("meta.k8s.io", "v1", "DeleteOptions")
                .ok_or_else(|| ApiError::internal("no DeleteOptions schema"))?;
            skiff_core::protobuf::decode(body, t, "v1", "DeleteOptions")?
        } else {
            serde_json::from_slice(body)
                .map_err(|e| ApiError::bad_request(format!("error decoding DeleteOptions: {e}")))?
        };
        if let Some(g) = v.get("gracePeriodSeconds").and_then(Value::as_i64) {
            o.grace_period_seconds = Some(g);
        }
        if let Some(p) = v.get("propagationPolicy").and_then(Value::as_str) {
            o.propagation_policy = Some(p.to_string());
        }
        if let Some(b) = v.get("orphanDependents").and_then(Value::as_bool) {
            o.orphan_dependents = Some(b);
        }
        if let Some(u) = v.pointer("/preconditions/uid").and_then(Value::as_str) {
            o.precondition_uid = Some(u.to_string());
        }
        if let Some(r) = v
            .pointer("/preconditions/resourceVersion")
            .and_then(Value::as_str)
        {
            o.precondition_resource_version = Some(r.to_string());
        }
        if let Some(d) = v.get("dryRun").and_then(Value::as_array) {
            if d.iter().any(|x| x == "All") {
                o.dry_run = true;
            }
        }
    }
    if let (Some(p), Some(_)) = (&o.propagation_policy, o.orphan_dependents) {
        return Err(ApiError::invalid(
            "meta.k8s.io",
            "DeleteOptions",
            "",
            vec![skiff_core::Cause::invalid(
                "propagationPolicy",
                &json!(p),
                "orphanDependents and deletionPropagation cannot be both set",
            )],
        ));
    }
    if let Some(p) = &o.propagation_policy {
        if !matches!(p.as_str(), "Orphan" | "Background" | "Foreground") {
            return Err(ApiError::invalid(
                "meta.k8s.io",
                "DeleteOptions",
                "",
                vec![skiff_core::Cause::not_supported(
                    "propagationPolicy",
                    &json!(p),
                    &["Foreground", "Background", "Orphan"],
                )],
            ));
        }
    }
    Ok(o)
}

fn render_object(
    res: &ResourceInfo,
    code: u16,
    obj: &Value,
    output: Output,
) -> Result<Resp, ApiError> {
    match output {
        Output::Json | Output::Discovery { .. } => Ok(json_response(code, obj)),
        Output::Yaml => Ok(bytes_response(
            code,
            "application/yaml",
            Bytes::from(serde_yaml::to_string(obj).unwrap_or_default()),
        )),
        Output::Table { v1beta1 } => {
            let t = table(
                res,
                std::slice::from_ref(obj),
                v1beta1,
                None,
                None,
                None,
                true,
                "Metadata",
            );
            Ok(json_response(code, &t))
        }
        Output::PartialMetadata { v1beta1 } => {
            Ok(json_response(code, &partial_metadata(obj, v1beta1)))
        }
    }
}

/// The answer to a replace or patch: the Scale as is, an object in the
/// version asked for (201 when the write created it).
async fn render_written(
    reg: &Registry,
    api_res: &'static ResourceInfo,
    sub: Subresource,
    out: Value,
    created: bool,
    output: Output,
) -> Result<Resp, ApiError> {
    if sub == Subresource::Scale {
        return Ok(json_response(200, &out));
    }
    let code = if created { 201 } else { 200 };
    render_object(
        api_res,
        code,
        &conversion::from_storage(reg, api_res, out).await?,
        output,
    )
}

/// The `PartialObjectMetadata` of an object.
pub fn partial_metadata(obj: &Value, v1beta1: bool) -> Value {
    json!({
        "kind": "PartialObjectMetadata",
        "apiVersion": if v1beta1 { "meta.k8s.io/v1beta1" } else { "meta.k8s.io/v1" },
        "metadata": obj.get("metadata").cloned().unwrap_or(json!({})),
    })
}

/// A meta.k8s.io Table of objects; `include` is `includeObject` (None, Metadata, Object).
#[allow(clippy::too_many_arguments)]
pub fn table(
    res: &ResourceInfo,
    objs: &[Value],
    v1beta1: bool,
    rv: Option<i64>,
    cont: Option<&str>,
    remaining: Option<i64>,
    with_columns: bool,
    include: &str,
) -> Value {
    if let Some(c) = res.rules.custom() {
        // A custom resource's additionalPrinterColumns.
        return table_with(
            c.columns,
            &|o, now| c.cells(o, now),
            objs,
            v1beta1,
            rv,
            cont,
            remaining,
            with_columns,
            include,
        );
    }
    table_of(
        res.rules.printer(),
        objs,
        v1beta1,
        rv,
        cont,
        remaining,
        with_columns,
        include,
    )
}

/// [`table`] with a printer (also of kinds without a resource of their
/// own, as the `Scale` of the scale subresource).
#[allow(clippy::too_many_arguments)]
pub fn table_of(
    printer: &skiff_core::table::Printer,
    objs: &[Value],
    v1beta1: bool,
    rv: Option<i64>,
    cont: Option<&str>,
    remaining: Option<i64>,
    with_columns: bool,
    include: &str,
) -> Value {
    table_with(
        printer.columns,
        &|o, now| (printer.cells)(o, now),
        objs,
        v1beta1,
        rv,
        cont,
        remaining,
        with_columns,
        include,
    )
}

/// [`table_of`] with the columns and the cells apart.
#[allow(clippy::too_many_arguments)]
fn table_with(
    cols: &[skiff_core::table::Column],
    cells: &dyn Fn(&Value, chrono::DateTime<chrono::Utc>) -> Vec<Value>,
    objs: &[Value],
    v1beta1: bool,
    rv: Option<i64>,
    cont: Option<&str>,
    remaining: Option<i64>,
    with_columns: bool,
    include: &str,
) -> Value {
    let now = chrono::Utc::now();
    let rows: Vec<Value> = objs
        .iter()
        .map(|o| {
            let object = match include {
                "None" => Value::Null,
                "Object" => o.clone(),
                _ => partial_metadata(o, v1beta1),
            };
            let mut row = json!({"cells": cells(o, now), "object": object});
            if object_is_null(&row) {
                row.as_object_mut().map(|m| m.remove("object"));
            }
            row
        })
        .collect();
    let mut meta = json!({});
    if let Some(rv) = rv {
        meta["resourceVersion"] = json!(rv.to_string());
    }
    if let Some(c) = cont {
        meta["continue"] = json!(c);
    }
    if let Some(r) = remaining {
        meta["remainingItemCount"] = json!(r);
    }
    json!({
        "kind": "Table",
        "apiVersion": if v1beta1 { "meta.k8s.io/v1beta1" } else { "meta.k8s.io/v1" },
        "metadata": meta,
        "columnDefinitions": if with_columns { skiff_core::table::column_definitions_json(cols) } else { json!([]) },
        "rows": rows,
    })
}

fn object_is_null(row: &Value) -> bool {
    row.get("object").map(Value::is_null).unwrap_or(true)
}

fn render_list(
    res: &'static ResourceInfo,
    out: crate::registry::ListOutput,
    output: Output,
    q: &Query,
) -> Result<Resp, ApiError> {
    // The items are in `res`'s version already (conversion::list_from_storage).
    match output {
        Output::Table { v1beta1 } => {
            let objs: Vec<Value> = out
                .items
                .iter()
                .filter_map(|b| serde_json::from_slice(b).ok())
                .collect();
            let include = q.get("includeObject").unwrap_or("Metadata");
            let t = table(
                res,
                &objs,
                v1beta1,
                Some(out.resource_version),
                out.continue_token.as_deref(),
                out.remaining,
                true,
                include,
            );
            Ok(json_response(200, &t))
        }
        Output::PartialMetadata { v1beta1 } => {
            let items: Vec<Value> = out
                .items
                .iter()
                .filter_map(|b| serde_json::from_slice::<Value>(b).ok())
                .map(|o| partial_metadata(&o, v1beta1))
                .collect();
            let mut meta = json!({"resourceVersion": out.resource_version.to_string()});
            if let Some(c) = &out.continue_token {
                meta["continue"] = json!(c);
            }
            Ok(json_response(
                200,
                &json!({"kind": "PartialObjectMetadataList", "apiVersion": if v1beta1 { "meta.k8s.io/v1beta1" } else { "meta.k8s.io/v1" }, "metadata": meta, "items": items}),
            ))
        }
        Output::Yaml => {
            let items: Vec<Value> = out
                .items
                .iter()
                .filter_map(|b| serde_json::from_slice(b).ok())
                .collect();
            let v = json!({"kind": res.list_kind(), "apiVersion": res.api_version(), "metadata": {"resourceVersion": out.resource_version.to_string()}, "items": items});
            Ok(bytes_response(
                200,
                "application/yaml",
                Bytes::from(serde_yaml::to_string(&v).unwrap_or_default()),
            ))
        }
        Output::Json | Output::Discovery { .. } => {
            // Assemble the list from the stored bytes without decoding them.
            let mut meta = serde_json::Map::new();
            meta.insert(
                "resourceVersion".into(),
                json!(out.resource_version.to_string()),
            );
            if let Some(c) = &out.continue_token {
                meta.insert("continue".into(), json!(c));
            }
            if let Some(r) = out.remaining {
                meta.insert("remainingItemCount".into(), json!(r));
            }
            let head = format!(
                "{{\"kind\":{},\"apiVersion\":{},\"metadata\":{},\"items\":[",
                Value::from(res.list_kind()),
                Value::from(res.api_version()),
                Value::Object(meta)
            );
            let mut buf = Vec::with_capacity(
                head.len() + out.items.iter().map(|b| b.len() + 1).sum::<usize>() + 2,
            );
            buf.extend_from_slice(head.as_bytes());
            for (i, item) in out.items.iter().enumerate() {
                if i > 0 {
                    buf.push(b',');
                }
                buf.extend_from_slice(item);
            }
            buf.extend_from_slice(b"]}");
            Ok(bytes_response(200, "application/json", Bytes::from(buf)))
        }
    }
}
