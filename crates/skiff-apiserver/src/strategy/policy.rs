//! Admission of policy kinds that reads other objects: one default
//! PriorityClass at most; a new ResourceQuota's status computed at once.

use async_trait::async_trait;
use serde_json::{json, Value};
use skiff_core::resources::ResourceInfo;
use skiff_core::ApiResult;

use super::{AdmissionCtx, Strategy};
use crate::admission::{forbidden, usage_in_namespace};
use crate::object::meta_str;

pub struct PriorityClassStrategy;

#[async_trait]
impl Strategy for PriorityClassStrategy {
    async fn admit_create(
        &self,
        cx: &dyn AdmissionCtx,
        res: &'static ResourceInfo,
        _ns: Option<&str>,
        obj: &mut Value,
    ) -> ApiResult<()> {
        if obj.get("globalDefault").and_then(Value::as_bool) != Some(true) {
            return Ok(());
        }
        let name = meta_str(obj, "name").to_string();
        let classes = cx.consistent_list(res, None, true).await?;
        if let Some(other) = classes.iter().find(|c| {
            c.get("globalDefault").and_then(Value::as_bool) == Some(true)
                && meta_str(c, "name") != name
        }) {
            return Err(forbidden(
                res,
                &name,
                &format!(
                    "PriorityClass {} is already marked as default. Only one default can exist",
                    meta_str(other, "name")
                ),
            ));
        }
        Ok(())
    }
}

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
