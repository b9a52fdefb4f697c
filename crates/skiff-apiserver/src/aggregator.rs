//! API aggregation (kube-aggregator): APIServices
//! (`apiregistration.k8s.io/v1`) name the server answering a group/version.
//! The built-in groups have local APIServices (no `service`), created at
//! start as kube-apiserver shows them. Requests for the group/version of a
//! registered non-local APIService are proxied, streaming both ways, to a
//! ready endpoint of its Service (resolved as [`crate::outbound`] resolves
//! webhooks) over TLS checked against its `caBundle` (or not at all with
//! `insecureSkipTLSVerify`), authenticated with the front-proxy client
//! certificate and carrying the already authenticated and authorized user in
//! `X-Remote-User`, `X-Remote-Group` and `X-Remote-Extra-*`. The
//! `extension-apiserver-authentication` ConfigMap in kube-system publishes
//! the front-proxy CA and those header names, as kube-apiserver does.
//!
//! Every few seconds each non-local APIService's backend is asked for its
//! discovery document (`/apis/<group>/<version>`): the answer sets the
//! `Available` condition and is kept, so `/apis` and aggregated discovery
//! list the aggregated groups and their resources.
//!
//! An Available backend's OpenAPI is fetched every [`OPENAPI_EVERY`] (as
//! kube-aggregator's OpenAPI controllers refresh theirs): its `/openapi/v2`
//! definitions and paths are merged into the server's `/openapi/v2`, and its
//! `/openapi/v3/apis/<group>/<version>` is served as the server's, listed in
//! the `/openapi/v3` index. Both go when the backend stops being Available.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Body;
use http::{header, HeaderName, HeaderValue, Request, Response};
use serde_json::{json, Value};
use skiff_core::resources::{self, ResourceInfo};
use skiff_core::ApiError;

use crate::options::WriteOptions;
use crate::outbound::{self, ClientIdentity, OutboundError};
use crate::registry::Registry;
use crate::request::Subresource;
use crate::tls::CertPair;
use crate::watchcache::Filter;

/// The name kube-apiserver's front-proxy client certificate carries (and
/// `requestheader-allowed-names` lists).
pub const FRONT_PROXY_CLIENT: &str = "front-proxy-client";

/// How often backends' discovery is checked.
const CHECK_EVERY: Duration = Duration::from_secs(3);

/// How often an Available backend's OpenAPI documents are fetched again.
pub const OPENAPI_EVERY: Duration = Duration::from_secs(60);

/// What one backend publishes of its OpenAPI.
#[derive(Default, Clone)]
struct Published {
    group: String,
    version: String,
    v2: Option<Arc<Value>>,
    v3: Option<Arc<Value>>,
    fetched: Option<std::time::Instant>,
}

/// The last merged `/openapi/v2`: built from the base document (the
/// custom resources' or the static one) and the backends' at a generation.
type MergedV2 = (
    Option<Arc<skiff_core::openapi::V2Docs>>,
    u64,
    Arc<skiff_core::openapi::V2Docs>,
);

/// The aggregator's state: the front-proxy identity and each APIService's
/// last discovery document.
pub struct Aggregator {
    /// The requestheader client CA (PEM) aggregated servers trust.
    pub front_proxy_ca_pem: String,
    client: ClientIdentity,
    discovery: Mutex<HashMap<String, Value>>,
    /// Each Available backend's OpenAPI, by APIService name.
    openapi: Mutex<HashMap<String, Published>>,
    /// Bumped whenever `openapi` changes.
    openapi_generation: std::sync::atomic::AtomicU64,
    merged_v2: Mutex<Option<MergedV2>>,
}

impl Aggregator {
    /// The front-proxy CA under `dir` (`ca.crt`, `ca.key`), made at first
    /// start, so every server sharing the PKI presents certificates the
    /// aggregated servers keep trusting across restarts.
    pub fn load_or_create(dir: Option<&std::path::Path>) -> anyhow::Result<Aggregator> {
        let Some(dir) = dir else {
            return Aggregator::new(None);
        };
        let (crt, key) = (dir.join("ca.crt"), dir.join("ca.key"));
        let ca = match (std::fs::read_to_string(&crt), std::fs::read_to_string(&key)) {
            (Ok(cert_pem), Ok(key_pem)) => CertPair { cert_pem, key_pem },
            _ => {
                std::fs::create_dir_all(dir)?;
                let ca = new_front_proxy_ca()?;
                crate::tls::write_secret_file(&key, &ca.key_pem)?;
                crate::tls::write_secret_file(&crt, &ca.cert_pem)?;
                ca
            }
        };
        Aggregator::new(Some(ca))
    }

    /// An aggregator presenting a client certificate from `front_proxy_ca`
    /// (a CA made now when none is given: aggregated servers then need the
    /// ConfigMap re-read after a restart).
    pub fn new(front_proxy_ca: Option<CertPair>) -> anyhow::Result<Aggregator> {
        let ca = match front_proxy_ca {
            Some(ca) => ca,
            None => new_front_proxy_ca()?,
        };
        let client = crate::tls::issue(&ca, FRONT_PROXY_CLIENT, &[], &[], true, 365)?;
        Ok(Aggregator {
            front_proxy_ca_pem: ca.cert_pem,
            client: ClientIdentity {
                cert_pem: client.cert_pem,
                key_pem: client.key_pem,
            },
            discovery: Mutex::new(HashMap::new()),
            openapi: Mutex::new(HashMap::new()),
            openapi_generation: Default::default(),
            merged_v2: Mutex::new(None),
        })
    }
}

/// A new front-proxy CA (ten years, as kubeadm's).
fn new_front_proxy_ca() -> anyhow::Result<CertPair> {
    use rcgen::{
        BasicConstraints, CertificateParams, DistinguishedName, DnType, IsCa, KeyPair,
        KeyUsagePurpose,
    };
    let key = KeyPair::generate()?;
    let mut params = CertificateParams::new(Vec::<String>::new())?;
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, "front-proxy-ca");
    params.distinguished_name = dn;
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    let now = time::OffsetDateTime::now_utc();
    params.not_before = now - Duration::from_secs(3600);
    params.not_after = now + Duration::from_secs(3650 * 86400);
    let cert = params.self_signed(&key)?;
    Ok(CertPair {
        cert_pem: cert.pem(),
        key_pem: key.serialize_pem(),
    })
}

fn apiservices() -> &'static ResourceInfo {
    resources::lookup("apiregistration.k8s.io", "v1", "apiservices").expect("apiservices")
}

fn s<'a>(v: &'a Value, ptr: &str) -> &'a str {
    v.pointer(ptr).and_then(Value::as_str).unwrap_or("")
}

/// A non-local APIService.
#[derive(Debug, Clone)]
pub struct Backend {
    pub name: String,
    pub group: String,
    pub version: String,
    pub client: outbound::ClientConfig,
    pub insecure: bool,
    pub version_priority: i64,
}

fn backend_of(obj: &Value) -> Option<Backend> {
    let svc = obj.pointer("/spec/service").filter(|v| v.is_object())?;
    let mut cc = json!({"service": {"namespace": s(svc, "/namespace"), "name": s(svc, "/name"),
        "port": svc.get("port").and_then(Value::as_i64).unwrap_or(443), "path": "/"}});
    if let Some(ca) = obj.pointer("/spec/caBundle").and_then(Value::as_str) {
        cc["caBundle"] = json!(ca);
    }
    Some(Backend {
        name: s(obj, "/metadata/name").to_string(),
        group: s(obj, "/spec/group").to_string(),
        version: s(obj, "/spec/version").to_string(),
        client: outbound::ClientConfig::from_json(&cc).ok()?,
        insecure: obj
            .pointer("/spec/insecureSkipTLSVerify")
            .and_then(Value::as_bool)
            .unwrap_or(false),
        version_priority: obj
            .pointer("/spec/versionPriority")
            .and_then(Value::as_i64)
            .unwrap_or(0),
    })
}

/// Every non-local APIService in the watch cache.
pub fn backends(reg: &Registry) -> Vec<Backend> {
    reg.cache()
        .resource(apiservices())
        .snapshot(&Filter::default())
        .iter()
        .filter_map(|o| o.value())
        .filter_map(|v| backend_of(&v))
        .collect()
}

fn backend_for(reg: &Registry, group: &str, version: &str) -> Option<Backend> {
    let res = apiservices();
    let o = reg.cache().resource(res).get(&crate::object::object_key(
        res,
        None,
        &format!("{version}.{group}"),
    ))?;
    backend_of(&*o.value()?)
}

/// What the aggregator answers for a path.
pub enum Target {
    /// `/apis/<group>` of an aggregated group.
    Group(String),
    /// Anything under `/apis/<group>/<version>` of a non-local APIService.
    Proxy(Backend),
}

/// Whether `path` belongs to an aggregated API.
pub fn target(reg: &Registry, path: &str) -> Option<Target> {
    let rest = path.strip_prefix("/apis/")?;
    let mut parts = rest.trim_end_matches('/').splitn(3, '/');
    let group = parts.next().filter(|g| !g.is_empty())?;
    match parts.next() {
        Some(version) => backend_for(reg, group, version).map(Target::Proxy),
        None => backends(reg)
            .iter()
            .any(|b| b.group == group)
            .then(|| Target::Group(group.to_string())),
    }
}

/// The versions of an aggregated group, preferred first: native ones and
/// those of its APIServices (by versionPriority).
fn group_versions(reg: &Registry, group: &str) -> Vec<String> {
    let mut bs: Vec<Backend> = backends(reg)
        .into_iter()
        .filter(|b| b.group == group)
        .collect();
    bs.sort_by_key(|b| std::cmp::Reverse(b.version_priority));
    bs.into_iter().map(|b| b.version).collect()
}

fn group_doc(group: &str, versions: &[String]) -> Value {
    let vs: Vec<Value> = versions
        .iter()
        .map(|v| json!({"groupVersion": format!("{group}/{v}"), "version": v}))
        .collect();
    json!({"name": group, "versions": vs,
        "preferredVersion": {"groupVersion": format!("{group}/{}", versions[0]), "version": versions[0]}})
}

/// Serves an aggregated path: the group document itself, or the proxy.
pub async fn serve(
    reg: &Registry,
    agg: &Aggregator,
    req: Request<Body>,
    target: Target,
) -> Result<Response<Body>, ApiError> {
    match target {
        Target::Group(group) => {
            let versions = group_versions(reg, &group);
            if versions.is_empty() {
                return Err(crate::request::not_found_path(req.uri().path()));
            }
            let mut doc = group_doc(&group, &versions);
            doc["kind"] = json!("APIGroup");
            doc["apiVersion"] = json!("v1");
            Ok(crate::response::json_response(200, &doc))
        }
        Target::Proxy(b) => proxy(reg, agg, req, &b).await,
    }
}

fn unavailable(e: impl std::fmt::Display) -> ApiError {
    ApiError::new(
        503,
        "ServiceUnavailable",
        format!("the server is currently unable to handle the request ({e})"),
    )
}

fn tls_for(agg: &Aggregator, b: &Backend) -> Result<Arc<rustls::ClientConfig>, OutboundError> {
    if b.insecure {
        outbound::insecure_tls_config(&agg.client)
    } else {
        outbound::tls_config(&b.client.ca_bundle, Some(&agg.client))
    }
}

/// Headers a proxy never passes on, and credentials meant for this server.
fn dropped(name: &HeaderName) -> bool {
    let n = name.as_str();
    matches!(
        n,
        "connection"
            | "keep-alive"
            | "proxy-connection"
            | "te"
            | "trailer"
            | "transfer-encoding"
            | "upgrade"
            | "authorization"
            | "host"
    ) || n.starts_with("impersonate-")
        || n.starts_with("x-remote-")
}

async fn proxy(
    reg: &Registry,
    agg: &Aggregator,
    req: Request<Body>,
    b: &Backend,
) -> Result<Response<Body>, ApiError> {
    let who = req
        .extensions()
        .get::<crate::auth::Identity>()
        .cloned()
        .unwrap_or_else(crate::auth::Identity::anonymous);
    let tls = tls_for(agg, b).map_err(unavailable)?;
    let ep = outbound::endpoint(&b.client, reg)
        .await
        .map_err(unavailable)?;
    let url = format!("https://{}{}", ep.host, req.uri().path());
    let mut sender = tokio::time::timeout(
        Duration::from_secs(10),
        outbound::dial::<Body>(&tls, &ep, &url),
    )
    .await
    .map_err(|_| unavailable(format!("dial {}: timeout", ep.addr)))?
    .map_err(unavailable)?;
    let (parts, body) = req.into_parts();
    let mut out = Request::builder().method(parts.method).uri(
        parts
            .uri
            .path_and_query()
            .map(|p| p.as_str().to_string())
            .unwrap_or_else(|| "/".into()),
    );
    for (k, v) in &parts.headers {
        if !dropped(k) {
            out = out.header(k, v);
        }
    }
    out = out.header(header::HOST, &ep.host);
    out = out.header("X-Remote-User", who.user.as_str());
    for g in &who.groups {
        out = out.header("X-Remote-Group", g.as_str());
    }
    for (k, vs) in &who.extra {
        let name = format!("X-Remote-Extra-{}", escape_extra_key(k));
        for v in vs {
            if let Ok(v) = HeaderValue::from_str(v) {
                out = out.header(name.as_str(), v);
            }
        }
    }
    let out = out.body(body).map_err(|e| unavailable(e.to_string()))?;
    let resp = sender
        .send_request(out)
        .await
        .map_err(|e| unavailable(e.to_string()))?;
    crate::response::relayed(resp).map_err(|e| unavailable(e.to_string()))
}

/// An extra's key in a header name: percent-encoded as kube-apiserver
/// does (`X-Remote-Extra-` keys are case-insensitive in HTTP).
fn escape_extra_key(k: &str) -> String {
    let mut out = String::new();
    for b in k.bytes() {
        if b.is_ascii_alphanumeric() || b"-!#$&'*+.^_`|~".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// Asks a backend for its discovery document: `Ok(APIResourceList)` or why
/// not as (reason, message) of a failed Available condition.
async fn check(reg: &Registry, agg: &Aggregator, b: &Backend) -> Result<Value, (String, String)> {
    let outbound::Target::Service {
        namespace, name, ..
    } = &b.client.target
    else {
        return Err(("ServiceNotFound".into(), "no service".into()));
    };
    let services = resources::lookup("", "v1", "services").expect("services");
    if reg
        .cache()
        .resource(services)
        .get(&crate::object::object_key(services, Some(namespace), name))
        .is_none()
    {
        return Err((
            "ServiceNotFound".into(),
            format!("service/{name} in {namespace:?} is not present"),
        ));
    }
    let path = format!("/apis/{}/{}", b.group, b.version);
    let fail = |e: String| ("FailedDiscoveryCheck".to_string(), e);
    let tls = tls_for(agg, b).map_err(|e| fail(e.to_string()))?;
    let ep = outbound::endpoint(&b.client, reg)
        .await
        .map_err(|e| ("MissingEndpoints".to_string(), e.to_string()))?;
    let url = format!("https://{}{path}", ep.addr);
    match tokio::time::timeout(Duration::from_secs(5), get_json(&tls, &ep, &path)).await {
        Ok(Ok(doc)) => Ok(doc),
        Ok(Err(e)) => Err(fail(format!("failing or missing response from {url}: {e}"))),
        Err(_) => Err(fail(format!(
            "failing or missing response from {url}: timeout"
        ))),
    }
}

/// GETs `path` from a backend as the aggregator (JSON).
async fn get_json(
    tls: &Arc<rustls::ClientConfig>,
    ep: &outbound::Endpoint,
    path: &str,
) -> Result<Value, OutboundError> {
    let url = format!("https://{}{path}", ep.addr);
    let (tls, ep) = (tls.clone(), ep.clone());
    let call = async move {
        let mut sender =
            outbound::dial::<http_body_util::Empty<bytes::Bytes>>(&tls, &ep, &url).await?;
        let req = Request::get(path)
            .header(header::HOST, &ep.host)
            .header(header::ACCEPT, "application/json")
            .header("X-Remote-User", "system:kube-aggregator")
            .header("X-Remote-Group", "system:masters")
            .body(http_body_util::Empty::new())
            .map_err(|e| OutboundError::Config(e.to_string()))?;
        let resp = sender
            .send_request(req)
            .await
            .map_err(|e| OutboundError::Http {
                url: url.clone(),
                reason: e.to_string(),
            })?;
        let status = resp.status();
        let body = http_body_util::BodyExt::collect(http_body_util::Limited::new(
            resp.into_body(),
            outbound::MAX_RESPONSE,
        ))
        .await
        .map_err(|e| OutboundError::Http {
            url: url.clone(),
            reason: e.to_string(),
        })?
        .to_bytes();
        if !status.is_success() {
            return Err(OutboundError::Status {
                code: status.as_u16(),
                body: String::new(),
            });
        }
        serde_json::from_slice::<Value>(&body).map_err(|e| OutboundError::Decode(e.to_string()))
    };
    call.await
}

/// Fetches a backend's OpenAPI documents when they are due.
async fn refresh_openapi(reg: &Registry, agg: &Aggregator, b: &Backend) {
    let due = agg
        .openapi
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .get(&b.name)
        .and_then(|p| p.fetched)
        .is_none_or(|t| t.elapsed() >= OPENAPI_EVERY);
    if !due {
        return;
    }
    let (Ok(tls), Ok(ep)) = (tls_for(agg, b), outbound::endpoint(&b.client, reg).await) else {
        return;
    };
    let fetch = |path: String| {
        let (tls, ep) = (tls.clone(), ep.clone());
        async move {
            match tokio::time::timeout(Duration::from_secs(10), get_json(&tls, &ep, &path)).await {
                Ok(Ok(doc)) if doc.is_object() => Some(Arc::new(doc)),
                Ok(Err(e)) => {
                    tracing::debug!(path, error = %e, "aggregated OpenAPI");
                    None
                }
                _ => None,
            }
        }
    };
    let v2 = fetch("/openapi/v2".into()).await;
    let v3 = fetch(format!("/openapi/v3/apis/{}/{}", b.group, b.version)).await;
    let mut all = agg.openapi.lock().unwrap_or_else(|e| e.into_inner());
    let before = all.get(&b.name).cloned().unwrap_or_default();
    let changed = before.v2 != v2 || before.v3 != v3;
    all.insert(
        b.name.clone(),
        Published {
            group: b.group.clone(),
            version: b.version.clone(),
            v2,
            v3,
            fetched: Some(std::time::Instant::now()),
        },
    );
    if changed {
        agg.openapi_generation
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }
}

/// Forgets the OpenAPI of backends no longer Available.
fn drop_openapi(agg: &Aggregator, keep: impl Fn(&str) -> bool) {
    let mut all = agg.openapi.lock().unwrap_or_else(|e| e.into_inner());
    let n = all.len();
    all.retain(|name, _| keep(name));
    if all.len() != n {
        agg.openapi_generation
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }
}

/// `/openapi/v2` of the server: the custom resources' document (or none,
/// meaning the static built-in one) with the Available backends'
/// definitions and their group-version's paths merged in (a definition
/// the server has already is kept as the server's).
pub fn openapi_v2(
    agg: &Aggregator,
    cat: &skiff_core::resources::Catalog,
) -> Option<Arc<skiff_core::openapi::V2Docs>> {
    let base = skiff_core::openapi::openapi_v2_in(cat);
    let generation = agg
        .openapi_generation
        .load(std::sync::atomic::Ordering::Relaxed);
    let published: Vec<Published> = {
        let all = agg.openapi.lock().unwrap_or_else(|e| e.into_inner());
        let mut names: Vec<&String> = all.keys().collect();
        names.sort();
        names
            .into_iter()
            .filter_map(|n| all.get(n))
            .filter(|p| p.v2.is_some())
            .cloned()
            .collect()
    };
    if published.is_empty() {
        return base;
    }
    let same_base = |a: &Option<Arc<skiff_core::openapi::V2Docs>>| match (a, &base) {
        (Some(x), Some(y)) => Arc::ptr_eq(x, y),
        (None, None) => true,
        _ => false,
    };
    if let Some((b, g, docs)) = agg
        .merged_v2
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .as_ref()
    {
        if *g == generation && same_base(b) {
            return Some(docs.clone());
        }
    }
    let bytes: &[u8] = match &base {
        Some(d) => &d.json,
        None => skiff_core::openapi::openapi_v2_bytes(),
    };
    let mut doc: Value = serde_json::from_slice(bytes).unwrap_or_else(|_| json!({}));
    for p in &published {
        let Some(theirs) = &p.v2 else { continue };
        if let (Some(defs), Some(their_defs)) = (
            doc.get_mut("definitions").and_then(Value::as_object_mut),
            theirs.get("definitions").and_then(Value::as_object),
        ) {
            for (k, v) in their_defs {
                defs.entry(k.clone()).or_insert_with(|| v.clone());
            }
        }
        let prefix = format!("/apis/{}/{}", p.group, p.version);
        if let (Some(paths), Some(their_paths)) = (
            doc.get_mut("paths").and_then(Value::as_object_mut),
            theirs.get("paths").and_then(Value::as_object),
        ) {
            for (k, v) in their_paths {
                if k == &prefix || k.starts_with(&format!("{prefix}/")) {
                    paths.insert(k.clone(), v.clone());
                }
            }
        }
    }
    let docs = Arc::new(skiff_core::openapi::V2Docs {
        json: serde_json::to_vec(&doc).unwrap_or_default(),
        protobuf: skiff_core::openapi_pb::document(&doc),
    });
    *agg.merged_v2.lock().unwrap_or_else(|e| e.into_inner()) =
        Some((base, generation, docs.clone()));
    Some(docs)
}

/// An Available backend's `/openapi/v3/apis/<group>/<version>`.
pub fn openapi_v3(agg: &Aggregator, group: &str, version: &str) -> Option<Arc<Value>> {
    agg.openapi
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .values()
        .find(|p| p.group == group && p.version == version)
        .and_then(|p| p.v3.clone())
}

/// The `/openapi/v3` index with the Available backends' group-versions.
pub fn merge_v3_index(agg: &Aggregator, mut index: Value) -> Value {
    let all = agg.openapi.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(paths) = index.get_mut("paths").and_then(Value::as_object_mut) {
        for p in all.values() {
            let Some(doc) = &p.v3 else { continue };
            // The hash changes with the document, so clients re-read it.
            let mut h: u64 = 0xcbf29ce484222325;
            for b in doc.to_string().bytes() {
                h ^= b as u64;
                h = h.wrapping_mul(0x100000001b3);
            }
            paths.insert(
                format!("apis/{}/{}", p.group, p.version),
                json!({"serverRelativeURL": format!("/openapi/v3/apis/{}/{}?hash={h:016X}", p.group, p.version)}),
            );
        }
    }
    index
}

fn server_opts() -> WriteOptions {
    WriteOptions {
        field_manager: "kube-apiserver".into(),
        ..Default::default()
    }
}

/// Sets the Available condition of an APIService when it changed.
async fn set_available(reg: &Registry, name: &str, ok: bool, reason: &str, message: &str) {
    let res = apiservices();
    let Ok(mut obj) = reg.get(res, None, name).await else {
        return;
    };
    let status = if ok { "True" } else { "False" };
    let same = obj
        .pointer("/status/conditions")
        .and_then(Value::as_array)
        .and_then(|a| a.iter().find(|c| s(c, "/type") == "Available"))
        .is_some_and(|c| {
            s(c, "/status") == status && s(c, "/reason") == reason && s(c, "/message") == message
        });
    if same {
        return;
    }
    crate::object::set_condition(&mut obj, "Available", status, Some(reason), Some(message));
    if let Err(e) = reg
        .update(res, None, name, obj, Subresource::Status, &server_opts())
        .await
    {
        tracing::debug!(apiservice = name, error = %e.message, "writing the Available condition");
    }
}

/// `<version>.<group>` of each built-in group/version (`v1.` for core).
fn local_names() -> Vec<(String, String, String)> {
    let mut out = vec![("v1.".to_string(), String::new(), "v1".to_string())];
    for (g, vs) in resources::groups() {
        for v in vs {
            out.push((format!("{v}.{g}"), g.to_string(), v.to_string()));
        }
    }
    for (g, v, _) in skiff_core::discovery::COMPUTED {
        out.push((format!("{v}.{g}"), g.to_string(), v.to_string()));
    }
    out
}

/// Creates the local APIServices and the `extension-apiserver-authentication`
/// ConfigMap, then checks the non-local APIServices for as long as the
/// server runs.
pub async fn start(reg: Arc<Registry>, agg: Arc<Aggregator>, client_ca_pem: Option<String>) {
    let res = apiservices();
    for (name, group, version) in local_names() {
        let obj = json!({"apiVersion": "apiregistration.k8s.io/v1", "kind": "APIService",
            "metadata": {"name": name, "labels": {"kube-aggregator.kubernetes.io/automanaged": "onstart"}},
            "spec": {"group": group, "version": version, "groupPriorityMinimum": 18000,
                "versionPriority": 15, "service": null}});
        match reg.create(res, None, obj, &server_opts()).await {
            Ok(_) => {}
            Err(e) if e.code == 409 => {}
            Err(e) => {
                tracing::warn!(apiservice = name, error = %e.message, "creating a local APIService")
            }
        }
        set_available(
            &reg,
            &name,
            true,
            "Local",
            "Local APIServices are always available",
        )
        .await;
    }
    publish_authentication(&reg, &agg, client_ca_pem.as_deref()).await;
    let mut tick = tokio::time::interval(CHECK_EVERY);
    loop {
        tick.tick().await;
        let live = backends(&reg);
        for b in &live {
            match check(&reg, &agg, b).await {
                Ok(doc) => {
                    agg.discovery
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .insert(b.name.clone(), doc);
                    set_available(&reg, &b.name, true, "Passed", "all checks passed").await;
                    refresh_openapi(&reg, &agg, b).await;
                }
                Err((reason, message)) => {
                    agg.discovery
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .remove(&b.name);
                    drop_openapi(&agg, |n| n != b.name);
                    set_available(&reg, &b.name, false, &reason, &message).await;
                }
            }
        }
        agg.discovery
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .retain(|name, _| live.iter().any(|b| &b.name == name));
        drop_openapi(&agg, |n| live.iter().any(|b| b.name == n));
    }
}

/// The `extension-apiserver-authentication` ConfigMap in kube-system, as
/// kube-apiserver writes it: the client CA and the request-header settings.
async fn publish_authentication(reg: &Registry, agg: &Aggregator, client_ca: Option<&str>) {
    let res = resources::lookup("", "v1", "configmaps").expect("configmaps");
    let mut data = json!({
        "requestheader-client-ca-file": agg.front_proxy_ca_pem,
        "requestheader-username-headers": "[\"X-Remote-User\"]",
        "requestheader-group-headers": "[\"X-Remote-Group\"]",
        "requestheader-extra-headers-prefix": "[\"X-Remote-Extra-\"]",
        "requestheader-allowed-names": format!("[\"{FRONT_PROXY_CLIENT}\"]"),
    });
    if let Some(ca) = client_ca {
        data["client-ca-file"] = json!(ca);
    }
    let name = "extension-apiserver-authentication";
    let obj = json!({"apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": name, "namespace": "kube-system"}, "data": data});
    let opts = server_opts();
    let r = match reg
        .create(res, Some("kube-system"), obj.clone(), &opts)
        .await
    {
        Err(e) if e.code == 409 => reg
            .update(
                res,
                Some("kube-system"),
                name,
                obj,
                Subresource::Main,
                &opts,
            )
            .await
            .map(|_| json!({})),
        other => other,
    };
    if let Err(e) = r {
        tracing::warn!(error = %e.message, "publishing {name}");
    }
}

/// `/apis` (APIGroupList) with the aggregated groups added.
pub fn merge_group_list(reg: &Registry, mut doc: Value) -> Value {
    let groups = aggregated_groups(reg);
    if let Some(list) = doc.get_mut("groups").and_then(Value::as_array_mut) {
        for (g, versions) in groups {
            list.retain(|e| e.get("name").and_then(Value::as_str) != Some(g.as_str()));
            list.push(group_doc(&g, &versions));
        }
    }
    doc
}

fn aggregated_groups(reg: &Registry) -> Vec<(String, Vec<String>)> {
    let mut groups: Vec<String> = backends(reg).into_iter().map(|b| b.group).collect();
    groups.sort();
    groups.dedup();
    groups
        .into_iter()
        .map(|g| {
            let vs = group_versions(reg, &g);
            (g, vs)
        })
        .collect()
}

/// Aggregated discovery (`/apis`, apidiscovery v2) with the aggregated
/// groups' resources from their last discovery documents.
pub fn merge_aggregated(reg: &Registry, agg: &Aggregator, mut doc: Value) -> Value {
    let groups = aggregated_groups(reg);
    if groups.is_empty() {
        return doc;
    }
    let docs = agg
        .discovery
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .clone();
    let Some(items) = doc.get_mut("items").and_then(Value::as_array_mut) else {
        return doc;
    };
    for (g, versions) in groups {
        let vs: Vec<Value> = versions
            .iter()
            .map(|v| match docs.get(&format!("{v}.{g}")) {
                Some(list) => json!({"version": v, "resources": v2_resources(&g, v, list),
                    "freshness": "Current"}),
                None => json!({"version": v, "resources": [], "freshness": "Stale"}),
            })
            .collect();
        items.retain(|i| s(i, "/metadata/name") != g);
        items.push(json!({"metadata": {"name": g, "creationTimestamp": null}, "versions": vs}));
    }
    doc
}

/// An APIResourceList's resources in apidiscovery v2's form.
fn v2_resources(group: &str, version: &str, list: &Value) -> Vec<Value> {
    let all: Vec<&Value> = list
        .get("resources")
        .and_then(Value::as_array)
        .map(|a| a.iter().collect())
        .unwrap_or_default();
    let mut out = Vec::new();
    for r in all.iter().filter(|r| !s(r, "/name").contains('/')) {
        let name = s(r, "/name");
        let mut e = json!({
            "resource": name,
            "responseKind": {"group": group, "version": version, "kind": s(r, "/kind")},
            "scope": if r.get("namespaced").and_then(Value::as_bool).unwrap_or(false) { "Namespaced" } else { "Cluster" },
            "singularResource": s(r, "/singularName"),
            "verbs": r.get("verbs").cloned().unwrap_or(json!([])),
        });
        for k in ["shortNames", "categories"] {
            if let Some(v) = r.get(k).filter(|v| v.is_array()) {
                e[k] = v.clone();
            }
        }
        let subs: Vec<Value> = all
            .iter()
            .filter_map(|sr| {
                let sub = s(sr, "/name").strip_prefix(&format!("{name}/"))?;
                Some(json!({"subresource": sub,
                    "responseKind": {"group": group, "version": version, "kind": s(sr, "/kind")},
                    "verbs": sr.get("verbs").cloned().unwrap_or(json!([]))}))
            })
            .collect();
        if !subs.is_empty() {
            e["subresources"] = Value::Array(subs);
        }
        out.push(e);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resource_lists_become_v2_discovery_with_subresources() {
        let list = json!({"resources": [
            {"name": "widgets", "singularName": "widget", "namespaced": true, "kind": "Widget",
                "verbs": ["get", "list"], "shortNames": ["wd"]},
            {"name": "widgets/status", "namespaced": true, "kind": "Widget", "verbs": ["get"]},
        ]});
        let v2 = v2_resources("example.com", "v1", &list);
        assert_eq!(v2.len(), 1);
        assert_eq!(v2[0]["scope"], "Namespaced");
        assert_eq!(v2[0]["shortNames"], json!(["wd"]));
        assert_eq!(v2[0]["subresources"][0]["subresource"], "status");
    }

    #[test]
    fn the_front_proxy_ca_is_kept_across_starts() {
        let dir = tempfile::tempdir().unwrap();
        let a = Aggregator::load_or_create(Some(dir.path())).unwrap();
        let b = Aggregator::load_or_create(Some(dir.path())).unwrap();
        assert_eq!(a.front_proxy_ca_pem, b.front_proxy_ca_pem);
        let mode = std::os::unix::fs::PermissionsExt::mode(
            &std::fs::metadata(dir.path().join("ca.key"))
                .unwrap()
                .permissions(),
        );
        assert_eq!(mode & 0o077, 0);
    }

    #[test]
    fn extra_keys_are_escaped_for_header_names() {
        assert_eq!(escape_extra_key("scopes"), "scopes");
        assert_eq!(
            escape_extra_key("example.com/tenant"),
            "example.com%2Ftenant"
        );
    }
}
