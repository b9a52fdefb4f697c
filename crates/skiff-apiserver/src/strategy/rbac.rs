//! Roles, ClusterRoles and their bindings: escalation prevention on every
//! write by a user other than `system:masters` (kube-apiserver's
//! `policybased` storage), on rules read after the watch cache has caught
//! up, so a role created just before its binding is seen.

use async_trait::async_trait;
use serde_json::Value;
use skiff_core::resources::ResourceInfo;
use skiff_core::ApiResult;

use super::{AdmissionCtx, Strategy};
use crate::auth::Identity;

pub struct RbacStrategy;

#[async_trait]
impl Strategy for RbacStrategy {
    async fn authorize_write(
        &self,
        cx: &dyn AdmissionCtx,
        res: &ResourceInfo,
        ns: Option<&str>,
        obj: &Value,
        who: Option<&Identity>,
    ) -> ApiResult<()> {
        match who {
            Some(who) if !who.is_master() => {
                cx.cache_is_current(res).await?;
                crate::authz::escalation::check(
                    cx.authorizer(),
                    Some(who),
                    res,
                    ns.unwrap_or(""),
                    obj,
                )
            }
            _ => Ok(()),
        }
    }
}
