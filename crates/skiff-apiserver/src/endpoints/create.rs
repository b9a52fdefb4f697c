//! POST: a create of an object, and the creates of special bodies that
//! answer rather than store (reviews) or act on another object
//! (`pods/binding`, `pods/eviction`, `serviceaccounts/token`).

use std::sync::Arc;

use axum::body::Body;
use axum::http::Request;
use skiff_core::ApiError;

use super::{created_status, read_body, read_write_body, RequestScope, WriteBody};
use crate::auth::Identity;
use crate::crd::conversion;
use crate::negotiate::{BodyKind, Output};
use crate::response::{add_warnings, bytes_response, json_response, render_object, Resp};
use crate::state::AppState;

/// Creates an object: decoded in the request's version, stored in the
/// storage version, answered in the request's.
pub async fn create(
    state: &Arc<AppState>,
    s: &RequestScope,
    req: Request<Body>,
) -> Result<Resp, ApiError> {
    let reg = &*state.registry;
    let WriteBody {
        obj,
        opts,
        mut warnings,
    } = read_write_body(s, req, true).await?;
    let stored = conversion::to_storage(reg, s.api_res, obj).await?;
    let (created, answer) = s.admitted(
        reg.create_answered(s.res, s.ns(), stored, &opts).await,
        &opts.admission,
    )?;
    warnings.extend(s.finish(&opts.admission));
    // Served as stored (no conversion) in JSON: the bytes the store got,
    // with the resourceVersion added, are the answer.
    if let Some(body) = answer.filter(|_| {
        matches!(s.output, Output::Json)
            && !conversion::needed(s.api_res)
            && !conversion::uses_webhook(s.api_res)
    }) {
        return Ok(add_warnings(
            bytes_response(201, "application/json", body),
            &warnings,
        ));
    }
    let created = conversion::from_storage(reg, s.api_res, created).await?;
    Ok(add_warnings(
        render_object(s.api_res, 201, &created, s.output)?,
        &warnings,
    ))
}

/// A review (TokenReview, SubjectAccessReview and the like): answered,
/// never stored.
pub async fn review(
    state: &Arc<AppState>,
    s: &RequestScope,
    req: Request<Body>,
) -> Result<Resp, ApiError> {
    let identity = s.user.clone().unwrap_or_else(Identity::anonymous);
    let mut obj = read_body(req).await?.decode(BodyKind::of(s.api_res))?;
    crate::registry::check_type_meta(s.api_res, &mut obj)?;
    // TokenReviews are the token authenticator's; the others RBAC's.
    if s.api_res.plural == "tokenreviews" {
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
    let answered = crate::authz::reviews::answer(
        &state.registry.authz,
        s.api_res.kind,
        s.ns(),
        obj,
        &identity,
    )?;
    Ok(json_response(201, &answered))
}

/// `pods/binding`: the scheduler binds a pod to a node.
pub async fn binding(
    state: &Arc<AppState>,
    s: &RequestScope,
    req: Request<Body>,
) -> Result<Resp, ApiError> {
    let body = read_body(req).await?;
    let binding = body.decode(BodyKind::BINDING)?;
    let opts = super::write_options(&s.query, &body.headers, false)?;
    let ns = s.ns().unwrap_or("");
    crate::strategy::binding::bind(&state.registry, ns, s.name(), &binding, &opts).await?;
    Ok(json_response(201, &created_status()))
}

/// `serviceaccounts/token`: a TokenRequest, answered with a token.
pub async fn token(
    state: &Arc<AppState>,
    s: &RequestScope,
    req: Request<Body>,
) -> Result<Resp, ApiError> {
    let tr = read_body(req).await?.decode(BodyKind::TOKEN_REQUEST)?;
    let Some(t) = &state.tokens else {
        return Err(ApiError::new(
            501,
            "NotImplemented",
            "the server has no ServiceAccount token issuer",
        ));
    };
    let (reg, ns) = (&*state.registry, s.ns().unwrap_or(""));
    crate::noderestriction::admit_token_request(reg, s.name(), ns, &tr, s.user.as_ref()).await?;
    let out = t.request(reg, ns, s.name(), &tr).await?;
    Ok(json_response(201, &out))
}

/// `pods/eviction`: the pod is deleted if its disruption budgets allow.
pub async fn eviction(
    state: &Arc<AppState>,
    s: &RequestScope,
    req: Request<Body>,
) -> Result<Resp, ApiError> {
    let eviction = read_body(req).await?.decode(BodyKind::EVICTION)?;
    let dopts = super::delete::options(&s.query, eviction.get("deleteOptions"))?;
    let ns = s.ns().unwrap_or("");
    crate::strategy::eviction::evict(&state.registry, ns, s.name(), &eviction, &dopts).await?;
    Ok(json_response(201, &created_status()))
}
