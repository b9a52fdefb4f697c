//! WATCH of a collection (`?watch=true` or a `/watch/` path), or of one
//! object (a collection watch with `metadata.name=<name>` added to its
//! field selector, as Kubernetes serves it).

use std::sync::Arc;

use skiff_core::selector::FieldSelector;
use skiff_core::ApiError;

use super::RequestScope;
use crate::request::filter_from_query;
use crate::response::Resp;
use crate::state::AppState;

pub async fn serve(state: &Arc<AppState>, s: &RequestScope) -> Result<Resp, ApiError> {
    let q = &s.query;
    let mut filter = filter_from_query(s.api_res, s.namespace.clone(), q)?;
    if let Some(name) = &s.name {
        let existing = q.get("fieldSelector").filter(|s| !s.trim().is_empty());
        let combined = match existing {
            Some(s) => format!("{s},metadata.name={name}"),
            None => format!("metadata.name={name}"),
        };
        filter.fields = Some(FieldSelector::parse(&combined).map_err(ApiError::bad_request)?);
    }
    crate::watch::serve(state.clone(), s.api_res, filter, q, s.output).await
}
