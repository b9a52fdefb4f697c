//! GET of one object, its `status` or `ephemeralcontainers`, a
//! CertificateSigningRequest's `approval`, and a `scale`.

use std::sync::Arc;

use skiff_core::ApiError;

use super::RequestScope;
use crate::crd::conversion;
use crate::negotiate::Output;
use crate::response::{json_response, render_object, table_of, Resp};
use crate::state::AppState;

/// The object (or its status or ephemeral containers, which read as the
/// object), in the version asked for.
pub async fn get(state: &Arc<AppState>, s: &RequestScope) -> Result<Resp, ApiError> {
    let reg = &*state.registry;
    let obj = reg.get(s.res, s.ns(), s.name()).await?;
    let obj = conversion::from_storage(reg, s.api_res, obj).await?;
    render_object(s.api_res, 200, &obj, s.output)
}

/// The approval subresource reads as the whole request, as Kubernetes'
/// approval REST does.
pub async fn approval(state: &Arc<AppState>, s: &RequestScope) -> Result<Resp, ApiError> {
    let obj = state.registry.get(s.res, s.ns(), s.name()).await?;
    render_object(s.api_res, 200, &obj, s.output)
}

/// The autoscaling/v1 Scale, or its Table.
pub async fn scale(state: &Arc<AppState>, s: &RequestScope) -> Result<Resp, ApiError> {
    let scale = crate::strategy::scale::get(&state.registry, s.res, s.ns(), s.name()).await?;
    Ok(match s.output {
        Output::Table { v1beta1 } => json_response(
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
        ),
        _ => json_response(200, &scale),
    })
}
