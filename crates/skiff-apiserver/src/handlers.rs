//! The HTTP surface: one entry point that authenticates, admits the
//! request to flow control, authorizes it, and routes a Kubernetes URL to
//! discovery, OpenAPI, health, a relayed connection or a resource verb
//! ([`crate::endpoints`]).

use std::sync::Arc;

use axum::body::Body;
use axum::extract::State;
use axum::http::{header, Method, Request, Response};
use bytes::Bytes;
use serde_json::{json, Value};
use skiff_core::ApiError;

use crate::auth::{self, Identity};
use crate::negotiate::{self, Output};
use crate::request::{self, Query};
use crate::response::{add_warnings, bytes_response, error_response, json_response, text, Resp};
pub use crate::state::AppState;

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
        if let Err(e) = crate::noderestriction::admit_request(&*state.registry, a).await {
            return error_response(&e);
        }
    } else if let Some(slot) = &audit {
        slot.authorized(true);
    }
    req.extensions_mut().insert(who);
    let req = match crate::endpoints::connect::serve(&state, req, &path).await {
        Ok(r) => return r.unwrap_or_else(|e| error_response(&e)),
        Err(req) => req,
    };
    if let Some(t) = crate::aggregator::target(&state.registry, &path) {
        return match crate::aggregator::serve(&state.registry, &state.aggregator, req, t).await {
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
    let r = crate::endpoints::serve(state, rr, query, accept, req).await;
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
