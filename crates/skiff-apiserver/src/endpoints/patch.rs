//! PATCH: JSON, merge, strategic-merge and apply patches of an object or
//! of its `status` or `ephemeralcontainers`; of a `scale`; of a
//! CertificateSigningRequest's `approval`.

use std::sync::Arc;

use axum::body::Body;
use axum::http::Request;
use serde_json::Value;
use skiff_core::ApiError;

use super::{check_fields, read_body, RequestBody, RequestScope};
use crate::negotiate;
use crate::options::{PatchType, WriteOptions};
use crate::request::Subresource;
use crate::response::{add_warnings, json_response, render_object, Resp};
use crate::state::AppState;

/// A patch request's type, patch and options.
struct PatchBody {
    pt: PatchType,
    patch: Value,
    opts: WriteOptions,
    body: RequestBody,
}

async fn read_patch(s: &RequestScope, req: Request<Body>) -> Result<PatchBody, ApiError> {
    let body = read_body(req).await?;
    let pt = negotiate::patch_type(body.content_type())?;
    let patch = negotiate::decode_patch(pt, &body.bytes)?;
    let opts = s.write_options(&body.headers, pt == PatchType::Apply)?;
    if s.query.get("force").is_some() && pt != PatchType::Apply {
        return Err(ApiError::bad_request(
            "force flag can only be set for apply patches",
        ));
    }
    Ok(PatchBody {
        pt,
        patch,
        opts,
        body,
    })
}

/// Patches an object or a subresource of it, in the request's version;
/// 201 when an apply created it.
pub async fn patch(
    state: &Arc<AppState>,
    s: &RequestScope,
    req: Request<Body>,
) -> Result<Resp, ApiError> {
    let reg = &*state.registry;
    let PatchBody {
        pt,
        patch,
        opts,
        body,
    } = read_patch(s, req).await?;
    let mut warnings = Vec::new();
    if matches!(
        pt,
        PatchType::Merge | PatchType::Strategic | PatchType::Apply
    ) {
        let obj_like = strip_directives(&patch);
        warnings = check_fields(
            s.api_res,
            &body.bytes,
            &obj_like,
            opts.field_validation,
            pt != PatchType::Apply,
        )?;
    }
    let patched = reg
        .patch(s.api_res, s.ns(), s.name(), pt, &patch, s.sub, &opts)
        .await;
    s.written(reg, patched, &opts.admission, warnings).await
}

/// Patches the Scale of an object.
pub async fn scale(
    state: &Arc<AppState>,
    s: &RequestScope,
    req: Request<Body>,
) -> Result<Resp, ApiError> {
    let PatchBody {
        pt, patch, opts, ..
    } = read_patch(s, req).await?;
    debug_assert_eq!(s.sub, Subresource::Scale);
    let out = s.admitted(
        crate::strategy::scale::patch(&state.registry, s.res, s.ns(), s.name(), pt, &patch, &opts)
            .await,
        &opts.admission,
    )?;
    let warnings = s.finish(&opts.admission);
    Ok(add_warnings(json_response(200, &out), &warnings))
}

/// Patches a CertificateSigningRequest's approval conditions.
pub async fn approval(
    state: &Arc<AppState>,
    s: &RequestScope,
    req: Request<Body>,
) -> Result<Resp, ApiError> {
    let body = read_body(req).await?;
    let pt = negotiate::patch_type(body.content_type())?;
    let patch = negotiate::decode_patch(pt, &body.bytes)?;
    let opts = s.write_options(&body.headers, pt == PatchType::Apply)?;
    let out =
        crate::certificates::patch_approval(&state.registry, s.name(), pt, &patch, &opts).await?;
    render_object(s.api_res, 200, &out, s.output)
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
