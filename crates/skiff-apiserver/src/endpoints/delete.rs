//! DELETE of one object or of a collection, with DeleteOptions from the
//! query and the body; mutating webhooks are called first, with neither
//! object (as kube-apiserver's handler calls them).

use std::sync::Arc;

use axum::body::Body;
use axum::http::Request;
use serde_json::{json, Value};
use skiff_core::ApiError;

use super::{read_body, RequestScope};
use crate::crd::conversion;
use crate::negotiate::BodyKind;
use crate::options::{DeleteOptions, Deleted};
use crate::request::{filter_from_query, Query};
use crate::response::{add_warnings, json_response, render_object, Resp};
use crate::state::AppState;
use crate::strategy::strategy_for;

/// A request's DeleteOptions: its body's (if any) over its query's.
async fn request_options(s: &RequestScope, req: Request<Body>) -> Result<DeleteOptions, ApiError> {
    let body = read_body(req).await?;
    let from_body = match body.bytes.is_empty() {
        true => None,
        false => Some(body.decode(BodyKind::DELETE_OPTIONS)?),
    };
    let mut o = options(&s.query, from_body.as_ref())?;
    o.user = s.user.clone();
    o.admission.request = Some(s.api_res);
    Ok(o)
}

/// Deletes one object: the object, gone or still being deleted, or a
/// `Status` for kinds that answer with one.
pub async fn delete(
    state: &Arc<AppState>,
    s: &RequestScope,
    req: Request<Body>,
) -> Result<Resp, ApiError> {
    let reg = &*state.registry;
    let (res, name) = (s.res, s.name());
    let dopts = request_options(s, req).await?;
    let mut warnings = strategy_for(res).delete_warnings(&dopts);
    let deleted = s.admitted(
        async {
            crate::webhook::admit_delete(reg, res, s.ns(), name, &dopts).await?;
            reg.delete(res, s.ns(), name, &dopts).await
        }
        .await,
        &dopts.admission,
    )?;
    warnings.extend(s.finish(&dopts.admission));
    let r = match deleted {
        Deleted::Gone(obj) if !res.returns_deleted_object() => {
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
        Deleted::Pending(obj) | Deleted::Gone(obj) => {
            let obj = conversion::from_storage(reg, s.api_res, obj).await?;
            render_object(s.api_res, 200, &obj, s.output)
        }
    };
    r.map(|r| add_warnings(r, &warnings))
}

/// Deletes every object of a collection that the selectors match.
pub async fn collection(
    state: &Arc<AppState>,
    s: &RequestScope,
    req: Request<Body>,
) -> Result<Resp, ApiError> {
    let reg = &*state.registry;
    let res = s.res;
    let filter = filter_from_query(s.api_res, s.namespace.clone(), &s.query)?;
    let dopts = request_options(s, req).await?;
    s.admitted(
        crate::webhook::admit_delete(reg, res, s.ns(), "", &dopts).await,
        &dopts.admission,
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
        let ns = v
            .pointer("/metadata/namespace")
            .and_then(Value::as_str)
            .map(str::to_string);
        match reg.delete(res, ns.as_deref(), &name, &dopts).await {
            Ok(Deleted::Gone(o)) | Ok(Deleted::Pending(o)) => gone.push(o),
            Err(e) if e.code == 404 => {}
            Err(e) => return Err(e),
        }
    }
    let list = json!({"kind": res.list_kind(), "apiVersion": res.api_version(), "metadata": {"resourceVersion": reg.cache().revision().to_string()}, "items": gone});
    Ok(add_warnings(
        json_response(200, &list),
        &strategy_for(res).delete_warnings(&dopts),
    ))
}

/// DeleteOptions from the query, then from a DeleteOptions object (a
/// DELETE's body, an Eviction's `deleteOptions`) where it sets them.
pub fn options(q: &Query, body: Option<&Value>) -> Result<DeleteOptions, ApiError> {
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
    if let Some(v) = body {
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
