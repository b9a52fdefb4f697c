//! A new ResourceQuota's status, computed at once from the objects of its
//! namespace (the one default PriorityClass is the Priority admission
//! plugin's, `crate::admission::pod`).

use async_trait::async_trait;
use serde_json::{json, Value};
use skiff_core::resources::ResourceInfo;
use skiff_core::ApiResult;

use super::{AdmissionCtx, Strategy};
use crate::admission::quota::usage_in_namespace;

pub struct ResourceQuotaStrategy;

#[async_trait]
impl Strategy for ResourceQuotaStrategy {
    /// What the quota controller would report at once: hard from spec,
    /// used from the namespace's objects.
    async fn admit_create(
        &self,
        cx: &dyn AdmissionCtx,
        _res: &'static ResourceInfo,
        ns: Option<&str>,
        obj: &mut Value,
    ) -> ApiResult<()> {
        let hard = obj
            .pointer("/spec/hard")
            .and_then(Value::as_object)
            .cloned()
            .unwrap_or_default();
        let used = usage_in_namespace(cx, ns.unwrap_or(""), &hard).await?;
        obj["status"] =
            json!({"hard": hard, "used": skiff_core::admission::used_json(&hard, &used)});
        Ok(())
    }
}
