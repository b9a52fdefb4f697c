//! Admission on create: the built-in plugins kube-apiserver enables by
//! default that decide from other objects (ServiceAccount,
//! DefaultTolerationSeconds, Priority, LimitRanger, ResourceQuota). The
//! decisions are in `skiff_core::admission`; this module reads what they
//! need, consistently, and records quota usage.

use std::collections::BTreeMap;
use std::sync::Arc;

use serde_json::{json, Map, Value};
use skiff_core::admission as core;
use skiff_core::error::group_resource;
use skiff_core::resources::{self, ResourceInfo};
use skiff_core::{ApiError, ApiResult};

use crate::object::{meta_str, metadata_mut};
use crate::registry::Registry;
use crate::watchcache::Filter;

/// 403 as an admission plugin answers it: `pods "x" is forbidden: ...`.
pub fn forbidden(res: &ResourceInfo, name: &str, msg: &str) -> ApiError {
    let mut e = ApiError::forbidden(format!(
        "{} {name:?} is forbidden: {msg}",
        group_resource(res.group, res.plural)
    ));
    e.name = Some(name.to_string());
    e.kind = Some(res.plural.to_string());
    if !res.group.is_empty() {
        e.group = Some(res.group.to_string());
    }
    e
}

fn lookup(group: &str, version: &str, plural: &str) -> &'static ResourceInfo {
    resources::lookup(group, version, plural).expect("built-in resource")
}

/// The current objects of a resource (in a namespace), read consistently.
/// Policy objects are parsed once per version and shared; other kinds (the
/// pods a quota counts, say) are parsed per call and not kept.
async fn current(
    reg: &Registry,
    res: &'static ResourceInfo,
    ns: Option<&str>,
) -> ApiResult<Vec<Arc<Value>>> {
    let filter = Filter {
        namespace: ns.map(str::to_string),
        ..Default::default()
    };
    let keep = matches!(
        (res.group, res.kind),
        ("scheduling.k8s.io", "PriorityClass") | ("", "LimitRange" | "ResourceQuota")
    );
    if let Some(objs) = reg.consistent_snapshot(res, &filter).await? {
        return Ok(objs
            .iter()
            .filter_map(|o| match keep {
                true => o.value(),
                false => serde_json::from_slice(&o.bytes).ok().map(Arc::new),
            })
            .collect());
    }
    // The cache is behind (it already waited): read the store.
    let out = reg.list_from_store(res, &filter, 0, None, None).await?;
    Ok(out
        .items
        .iter()
        .filter_map(|b| serde_json::from_slice(b).ok().map(Arc::new))
        .collect())
}

/// Mutating admission of a new object (before validation).
pub async fn mutate_create(
    reg: &Registry,
    res: &'static ResourceInfo,
    ns: Option<&str>,
    obj: &mut Value,
) -> ApiResult<()> {
    let name = meta_str(obj, "name").to_string();
    match (res.group, res.kind) {
        ("", "Pod") => {
            let ns = ns.unwrap_or("");
            let Some(spec) = obj.get_mut("spec").filter(|s| s.is_object()) else {
                return Ok(());
            };
            core::default_service_account(spec);
            core::default_tolerations(spec);
            let classes = current(
                reg,
                lookup("scheduling.k8s.io", "v1", "priorityclasses"),
                None,
            )
            .await?;
            core::resolve_priority(spec, &classes).map_err(|m| forbidden(res, &name, &m))?;
            let ranges = current(reg, lookup("", "v1", "limitranges"), Some(ns)).await?;
            if !ranges.is_empty() {
                if let Some(note) = core::apply_limit_range_defaults(obj, &ranges) {
                    let m = metadata_mut(obj);
                    let ann = m.entry("annotations").or_insert_with(|| json!({}));
                    if let Some(a) = ann.as_object_mut() {
                        a.insert("kubernetes.io/limit-ranger".into(), json!(note));
                    }
                }
                core::validate_limit_ranges(obj, &ranges).map_err(|m| forbidden(res, &name, &m))?;
            }
            // The QoS class follows the resources admission settled on.
            let qos = obj
                .get("spec")
                .map(skiff_core::defaults::qos_class)
                .unwrap_or("BestEffort");
            if obj.get("status").map(Value::is_object).unwrap_or(false) {
                obj["status"]["qosClass"] = json!(qos);
            }
            crate::podtoken::admit(reg, ns, obj).await;
        }
        ("scheduling.k8s.io", "PriorityClass")
            if obj.get("globalDefault").and_then(Value::as_bool) == Some(true) =>
        {
            let classes = current(reg, res, None).await?;
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
        }
        ("", "ResourceQuota") => {
            // What the quota controller would report at once: hard from
            // spec, used from the namespace's objects.
            let hard = obj
                .pointer("/spec/hard")
                .and_then(Value::as_object)
                .cloned()
                .unwrap_or_default();
            let used = usage_in_namespace(reg, ns.unwrap_or(""), &hard).await?;
            obj["status"] = json!({"hard": hard, "used": core::used_json(&hard, &used)});
        }
        _ => {}
    }
    Ok(())
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
async fn usage_in_namespace(
    reg: &Registry,
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
        for o in current(reg, res, Some(ns)).await? {
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
pub struct QuotaCharge {
    pub name: String,
    pub used: Value,
    pub hard: Map<String, Value>,
}

/// ResourceQuota admission of a new object: every quota of the namespace
/// that limits what the object consumes must leave room for it.
pub async fn check_quota(
    reg: &Registry,
    res: &'static ResourceInfo,
    ns: Option<&str>,
    obj: &Value,
) -> ApiResult<Vec<QuotaCharge>> {
    let Some(ns) = ns.filter(|_| res.namespaced) else {
        return Ok(Vec::new());
    };
    let quota_res = lookup("", "v1", "resourcequotas");
    let quotas = current(reg, quota_res, Some(ns)).await?;
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
        if res.group.is_empty() && res.kind == "Pod" {
            core::pod_quota_constraints(obj, &tracked)
                .map_err(|m| forbidden(res, &name, &format!("failed quota: {qname}: {m}")))?;
        }
        let requested: BTreeMap<String, i128> = requested
            .iter()
            .filter(|(k, v)| tracked.contains(k) && **v != 0)
            .map(|(k, v)| (k.clone(), *v))
            .collect();
        if requested.is_empty() {
            continue;
        }
        let used = usage_in_namespace(reg, ns, &hard).await?;
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

/// Records the usage admitted objects brought in the quotas' status
/// (best effort: admission recomputes usage from the objects themselves).
pub async fn record_charges(reg: &Registry, ns: Option<&str>, charges: Vec<QuotaCharge>) {
    let quota_res = lookup("", "v1", "resourcequotas");
    for c in charges {
        let key = crate::object::object_key(quota_res, ns, &c.name);
        let Ok(Some(kv)) = reg.store.get(&key).await else {
            continue;
        };
        let Ok(mut q) = crate::object::decode(&kv) else {
            continue;
        };
        q["status"] = json!({"hard": c.hard, "used": c.used});
        if let Ok(bytes) = crate::object::encode(&q) {
            let _ = reg.store.update(&key, bytes, kv.mod_revision).await;
        }
    }
}
