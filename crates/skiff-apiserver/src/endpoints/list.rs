//! LIST of a collection: from the watch cache, or one store snapshot for
//! pages and exact old revisions; in the version and form asked for.

use std::sync::Arc;

use skiff_core::ApiError;

use super::RequestScope;
use crate::crd::conversion;
use crate::request::filter_from_query;
use crate::response::{render_list, Resp};
use crate::state::AppState;

pub async fn list(state: &Arc<AppState>, s: &RequestScope) -> Result<Resp, ApiError> {
    let reg = &*state.registry;
    let q = &s.query;
    let filter = filter_from_query(s.api_res, s.namespace.clone(), q)?;
    let limit = q.int("limit")?.unwrap_or(0).max(0);
    let exact = q.get("resourceVersionMatch") == Some("Exact");
    let mut out = reg
        .list(
            s.res,
            &filter,
            limit,
            q.get("continue").filter(|c| !c.is_empty()),
            q.get("resourceVersion"),
            exact,
        )
        .await?;
    out.items = conversion::list_from_storage(reg, s.api_res, out.items).await?;
    render_list(s.api_res, out, s.output, q)
}
