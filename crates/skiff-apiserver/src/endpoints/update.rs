//! PUT: a replace of an object or of its `status`, `finalize` or
//! `ephemeralcontainers`; of a `scale`; of a CertificateSigningRequest's
//! `approval`.

use std::sync::Arc;

use axum::body::Body;
use axum::http::Request;
use skiff_core::ApiError;

use super::{read_write_body, RequestScope, WriteBody};
use crate::crd::conversion;
use crate::response::{add_warnings, json_response, render_object, Resp};
use crate::state::AppState;

/// Replaces an object or a subresource of it; 201 when it created it.
pub async fn update(
    state: &Arc<AppState>,
    s: &RequestScope,
    req: Request<Body>,
) -> Result<Resp, ApiError> {
    let reg = &*state.registry;
    let WriteBody {
        obj,
        opts,
        warnings,
    } = read_write_body(s, req, true).await?;
    let obj = conversion::to_storage(reg, s.api_res, obj).await?;
    let updated = reg.update(s.res, s.ns(), s.name(), obj, s.sub, &opts).await;
    s.written(reg, updated, &opts.admission, warnings).await
}

/// Replaces the Scale of an object.
pub async fn scale(
    state: &Arc<AppState>,
    s: &RequestScope,
    req: Request<Body>,
) -> Result<Resp, ApiError> {
    let WriteBody { obj, opts, .. } = read_write_body(s, req, false).await?;
    let out = s.admitted(
        crate::strategy::scale::update(&state.registry, s.res, s.ns(), s.name(), obj, &opts).await,
        &opts.admission,
    )?;
    let warnings = s.finish(&opts.admission);
    Ok(add_warnings(json_response(200, &out), &warnings))
}

/// Approves or denies a CertificateSigningRequest.
pub async fn approval(
    state: &Arc<AppState>,
    s: &RequestScope,
    req: Request<Body>,
) -> Result<Resp, ApiError> {
    let WriteBody { obj, opts, .. } = read_write_body(s, req, false).await?;
    let out = crate::certificates::approve(&state.registry, s.name(), obj, &opts).await?;
    render_object(s.api_res, 200, &out, s.output)
}
