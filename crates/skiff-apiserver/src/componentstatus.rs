//! `componentstatuses` (core v1 ComponentStatus): deprecated since
//! Kubernetes 1.19 and still served by 1.33, read by `kubectl get cs` and
//! by clients' tests. Nothing is stored: each get or list checks the
//! components now, as kube-apiserver probes them.
//!
//! - `scheduler` and `controller-manager`: the component holds its leader
//!   Lease (`kube-system/kube-scheduler`, `kube-system/kube-controller-manager`)
//!   and renewed it within the lease's duration — the scheduler and the
//!   controller manager of every skiff server campaign for those Leases, so
//!   a renewed one means a live component doing its work (kube-apiserver
//!   asks their `/healthz` instead).
//! - `etcd-0`: the store answers a read of its current revision within 2 s
//!   (the embedded store and etcd alike, as `/readyz`'s `etcd` check).

use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use bytes::Bytes;
use http::{header, HeaderValue, Method, Request, Response};
use serde_json::{json, Value};
use skiff_core::error::ApiError;
use skiff_core::resources;

use crate::negotiate::{self, Output};
use crate::request::Query;
use crate::state::AppState;

const WARNING: &str = "v1 ComponentStatus is deprecated in v1.19+";
const COMPONENTS: [&str; 3] = ["scheduler", "controller-manager", "etcd-0"];

/// `/api/v1/componentstatuses[/NAME]`: `Some(None)` for the list,
/// `Some(Some(name))` for one.
pub fn parse(path: &str) -> Option<Option<String>> {
    let rest = path.strip_prefix("/api/v1/componentstatuses")?;
    match rest.trim_end_matches('/') {
        "" => Some(None),
        r => {
            let name = r.strip_prefix('/')?;
            (!name.contains('/')).then(|| Some(name.to_string()))
        }
    }
}

/// Serves a get or a list (a watch and every write are 405, as Kubernetes'
/// componentstatus REST implements get and list only).
pub async fn serve(
    state: &Arc<AppState>,
    req: Request<Body>,
    name: Option<String>,
) -> Result<Response<Body>, ApiError> {
    let query = Query::parse(req.uri().query());
    if req.method() != Method::GET || query.flag("watch") {
        return Err(ApiError::method_not_allowed(format!(
            "{} is not supported on componentstatuses: they serve get and list",
            if query.flag("watch") {
                "watch".to_string()
            } else {
                req.method().to_string()
            }
        )));
    }
    let accept = req
        .headers()
        .get(header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    let output = negotiate::choose_output(accept.as_deref())?;
    let items: Vec<Value> = match &name {
        Some(n) => {
            if !COMPONENTS.contains(&n.as_str()) {
                return Err(ApiError::not_found("", "componentstatuses", n));
            }
            vec![status_of(state, n).await]
        }
        None => {
            let mut out = Vec::new();
            for c in COMPONENTS {
                out.push(status_of(state, c).await);
            }
            out
        }
    };
    let body = match (output, &name) {
        (Output::Table { v1beta1 }, _) => crate::response::table_of(
            &skiff_core::table::COMPONENT_STATUS_PRINTER,
            &items,
            v1beta1,
            None,
            None,
            None,
            true,
            "Metadata",
        ),
        (_, Some(_)) => items.into_iter().next().unwrap_or(Value::Null),
        (_, None) => json!({"kind": "ComponentStatusList", "apiVersion": "v1",
            "metadata": {}, "items": items}),
    };
    let mut r = Response::builder()
        .header(header::CONTENT_TYPE, "application/json")
        .body(Body::from(Bytes::from(
            serde_json::to_vec(&body).unwrap_or_default(),
        )))
        .unwrap_or_else(|_| Response::new(Body::empty()));
    if let Ok(v) = HeaderValue::from_str(&format!("299 - \"{WARNING}\"")) {
        r.headers_mut().append(header::WARNING, v);
    }
    Ok(r)
}

/// One component's ComponentStatus, checked now.
async fn status_of(state: &AppState, component: &str) -> Value {
    let health = match component {
        "scheduler" => lease_health(state, "kube-scheduler", "the scheduler").await,
        "controller-manager" => {
            lease_health(state, "kube-controller-manager", "the controller manager").await
        }
        _ => store_health(state).await,
    };
    let condition = match health {
        Ok(()) => json!({"type": "Healthy", "status": "True", "message": "ok"}),
        Err(e) => json!({"type": "Healthy", "status": "False", "error": e}),
    };
    json!({"kind": "ComponentStatus", "apiVersion": "v1",
        "metadata": {"name": component}, "conditions": [condition]})
}

async fn store_health(state: &AppState) -> Result<(), String> {
    match tokio::time::timeout(Duration::from_secs(2), state.registry.current_revision()).await {
        Ok(Ok(_)) => Ok(()),
        Ok(Err(e)) => Err(format!("the store does not answer: {e}")),
        Err(_) => Err("the store gave no answer within 2s".into()),
    }
}

/// Whether the leader Lease `kube-system/<lease>` is held and renewed
/// within its duration.
async fn lease_health(state: &AppState, lease: &str, what: &str) -> Result<(), String> {
    let leases = resources::lookup("coordination.k8s.io", "v1", "leases").expect("leases");
    let l = match state.registry.get(leases, Some("kube-system"), lease).await {
        Ok(l) => l,
        Err(e) if e.code == 404 => {
            return Err(format!(
                "{what} is not running: no holder of the Lease kube-system/{lease}"
            ))
        }
        Err(e) => return Err(e.message),
    };
    lease_fresh(&l, chrono::Utc::now()).map_err(|e| format!("{what} is not running: {e}"))
}

/// A held Lease renewed no longer ago than its duration.
fn lease_fresh(lease: &Value, now: chrono::DateTime<chrono::Utc>) -> Result<(), String> {
    let spec = lease.get("spec").cloned().unwrap_or(json!({}));
    let holder = spec
        .get("holderIdentity")
        .and_then(Value::as_str)
        .unwrap_or("");
    if holder.is_empty() {
        return Err("its Lease has no holder".into());
    }
    let duration = spec
        .get("leaseDurationSeconds")
        .and_then(Value::as_i64)
        .unwrap_or(15);
    let renewed = spec
        .get("renewTime")
        .and_then(Value::as_str)
        .and_then(|t| chrono::DateTime::parse_from_rfc3339(t).ok())
        .ok_or("its Lease was never renewed")?;
    let age = now.signed_duration_since(renewed.with_timezone(&chrono::Utc));
    if age.num_milliseconds() > duration * 1000 {
        return Err(format!(
            "its Lease (holder {holder}) was last renewed {}s ago, past its {duration}s duration",
            age.num_seconds()
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_name_the_list_or_one_component() {
        assert_eq!(parse("/api/v1/componentstatuses"), Some(None));
        assert_eq!(
            parse("/api/v1/componentstatuses/etcd-0"),
            Some(Some("etcd-0".into()))
        );
        assert_eq!(parse("/api/v1/componentstatuses/a/b"), None);
        assert_eq!(parse("/api/v1/configmaps"), None);
    }

    #[test]
    fn a_lease_is_fresh_while_renewed_within_its_duration() {
        let now = chrono::Utc::now();
        let lease = |holder: &str, ago: i64| {
            json!({"spec": {"holderIdentity": holder, "leaseDurationSeconds": 15,
                "renewTime": (now - chrono::Duration::seconds(ago)).to_rfc3339()}})
        };
        assert!(lease_fresh(&lease("s1", 3), now).is_ok());
        assert!(lease_fresh(&lease("s1", 40), now)
            .unwrap_err()
            .contains("past its 15s duration"));
        assert!(lease_fresh(&lease("", 1), now).is_err());
        assert!(lease_fresh(&json!({"spec": {"holderIdentity": "s1"}}), now).is_err());
    }
}
