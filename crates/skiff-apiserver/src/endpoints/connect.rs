//! CONNECT-style subresources relayed to a node agent: a pod's `log`,
//! `exec`, `attach`, `portforward` and `proxy` (exec, attach and
//! port-forward admitted by dynamic admission first, with their options
//! object), and a node's `proxy`.

use std::sync::Arc;

use axum::body::Body;
use axum::http::{Method, Request};
use skiff_core::ApiError;

use crate::auth::Identity;
use crate::response::Resp;
use crate::state::AppState;

/// Serves `path` if it is a pod's or a node's connect subresource with a
/// method it takes; `None` otherwise (the request is routed on).
pub async fn serve(
    state: &Arc<AppState>,
    req: Request<Body>,
    path: &str,
) -> Result<Result<Resp, ApiError>, Request<Body>> {
    if let Some((ns, pod, sub)) = crate::nodeproxy::parse(path) {
        let method = req.method().clone();
        let allowed = match sub {
            "log" => method == Method::GET,
            _ => method == Method::GET || method == Method::POST,
        };
        if allowed {
            return Ok(serve_pod(state, req, &ns, &pod, sub).await);
        }
    }
    if let Some((node, port, agent_path)) = crate::nodeproxy::parse_node(path) {
        return Ok(crate::nodeproxy::proxy_node(state, req, &node, port, &agent_path).await);
    }
    Err(req)
}

async fn serve_pod(
    state: &Arc<AppState>,
    req: Request<Body>,
    ns: &str,
    pod: &str,
    sub: &str,
) -> Result<Resp, ApiError> {
    let user = req.extensions().get::<Identity>().cloned();
    let q = req.uri().query().map(str::to_string);
    let reg = &*state.registry;
    crate::webhook::admit_connect(reg, ns, pod, sub, q.as_deref(), user.as_ref()).await?;
    crate::nodeproxy::proxy(state, req, ns, pod, sub).await
}
