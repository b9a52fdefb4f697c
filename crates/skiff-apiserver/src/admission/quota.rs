//! Kubernetes' ResourceQuota admission plugin, generic over kinds: the
//! usage a new object brings (its kind's rules say) checked against every
//! quota of its namespace, and the quotas' `status.used` charged at once
//! (as Kubernetes' quota evaluator does; the quota controller reconciles
//! it later). The decisions are in `skiff_core::admission`.

use std::collections::BTreeMap;

use async_trait::async_trait;
use serde_json::{Map, Value};
use skiff_core::admission as core;
use skiff_core::resources::{self, ResourceInfo};
use skiff_core::ApiResult;

use super::context::AdmissionCtx;
use super::plugin::{forbidden, AdmissionPlugin, Attributes, Operation};
use crate::object::meta_str;

fn lookup(group: &str, version: &str, plural: &str) -> &'static ResourceInfo {
    resources::lookup(group, version, plural).expect("built-in resource")
}

/// The kinds whose objects a quota resource name counts.
fn counted_resources(resource: &str) -> Option<&'static ResourceInfo> {
    let plural_group = match resource {
        "pods" | "cpu" | "memory" | "ephemeral-storage" => "pods",
        r if r.starts_with("requests.") || r.starts_with("limits.") => {
            if r == "requests.storage" {
                "persistentvolumeclaims"
            } else {
                "pods"
            }
        }
        "services.nodeports" | "services.loadbalancers" => "services",
        r => r.strip_prefix("count/").unwrap_or(r),
    };
    let (plural, group) = plural_group.split_once('.').unwrap_or((plural_group, ""));
    resources::RESOURCES
        .iter()
        .find(|r| r.plural == plural && r.group == group && r.namespaced)
}

/// Usage of the hard resources in a namespace, from its current objects.
pub(crate) async fn usage_in_namespace(
    cx: &dyn AdmissionCtx,
    ns: &str,
    hard: &Map<String, Value>,
) -> ApiResult<BTreeMap<String, i128>> {
    let mut used: BTreeMap<String, i128> = BTreeMap::new();
    let mut seen: Vec<&'static str> = Vec::new();
    for r in hard.keys() {
        let Some(kind_res) = counted_resources(r) else {
            continue;
        };
        if seen.contains(&kind_res.plural) {
            continue;
        }
        seen.push(kind_res.plural);
        let res = skiff_core::convert::storage_resource(kind_res);
        for o in cx.consistent_list(res, Some(ns), false).await? {
            for (k, v) in core::usage(kind_res, &o) {
                if hard.contains_key(&k) {
                    *used.entry(k).or_default() += v;
                }
            }
        }
    }
    Ok(used)
}

/// A quota whose status the create will update: (name, new status.used).
struct QuotaCharge {
    name: String,
    used: Value,
    hard: Map<String, Value>,
}

/// ResourceQuota admission of a new object: every quota of the namespace
/// that limits what the object consumes must leave room for it.
async fn check_quota(
    cx: &dyn AdmissionCtx,
    res: &'static ResourceInfo,
    ns: Option<&str>,
    obj: &Value,
) -> ApiResult<Vec<QuotaCharge>> {
    let Some(ns) = ns.filter(|_| res.namespaced) else {
        return Ok(Vec::new());
    };
    let quota_res = lookup("", "v1", "resourcequotas");
    let quotas = cx.consistent_list(quota_res, Some(ns), true).await?;
    if quotas.is_empty() {
        return Ok(Vec::new());
    }
    let name = meta_str(obj, "name").to_string();
    let requested = core::usage(res, obj);
    let mut charges = Vec::new();
    for q in &quotas {
        let qname = meta_str(q, "name").to_string();
        let hard = q
            .pointer("/status/hard")
            .or_else(|| q.pointer("/spec/hard"))
            .and_then(Value::as_object)
            .cloned()
            .unwrap_or_default();
        let tracked: Vec<String> = hard
            .keys()
            .filter(|r| core::quota_tracks(res, r))
            .cloned()
            .collect();
        if tracked.is_empty() {
            continue;
        }
        res.rules
            .quota_constraints(obj, &tracked)
            .map_err(|m| forbidden(res, &name, &format!("failed quota: {qname}: {m}")))?;
        let requested: BTreeMap<String, i128> = requested
            .iter()
            .filter(|(k, v)| tracked.contains(k) && **v != 0)
            .map(|(k, v)| (k.clone(), *v))
            .collect();
        if requested.is_empty() {
            continue;
        }
        let used = usage_in_namespace(cx, ns, &hard).await?;
        let new_used = core::check_quota(&qname, &hard, &used, &requested)
            .map_err(|m| forbidden(res, &name, &m))?;
        charges.push(QuotaCharge {
            name: qname,
            used: core::used_json(&hard, &new_used),
            hard,
        });
    }
    Ok(charges)
}

/// ResourceQuota: a create must fit every quota of its namespace that
/// tracks what it consumes; the quotas' usage is charged when it does.
pub struct ResourceQuota;

#[async_trait]
impl AdmissionPlugin for ResourceQuota {
    fn name(&self) -> &'static str {
        "ResourceQuota"
    }

    fn handles(&self, a: &Attributes<'_>) -> bool {
        a.op == Operation::Create && a.res.namespaced
    }

    async fn validate(
        &self,
        cx: &dyn AdmissionCtx,
        a: &Attributes<'_>,
        obj: Option<&Value>,
    ) -> ApiResult<()> {
        let Some(obj) = obj else {
            return Ok(());
        };
        let charges = check_quota(cx, a.res, a.namespace, obj).await?;
        if a.dry_run() {
            return Ok(());
        }
        let quotas = lookup("", "v1", "resourcequotas");
        for c in charges {
            let status = serde_json::json!({"hard": c.hard, "used": c.used});
            let mut change = |mut q: Value| {
                q["status"] = status.clone();
                Ok(Some(q))
            };
            // Best effort: admission recomputes usage from the objects.
            if let Err(e) = cx
                .update_object(quotas, a.namespace, &c.name, &mut change)
                .await
            {
                tracing::debug!("recording quota usage in {}: {}", c.name, e.message);
            }
        }
        Ok(())
    }
}
