//! `pods/eviction` (policy/v1 Eviction): a pod deletion that respects the
//! PodDisruptionBudget covering the pod, as `kubectl drain` relies on.
//! A pod that is not running (or already terminating) goes without a
//! budget check; otherwise the one matching budget must allow a disruption,
//! which is taken from its status (guarded by its resourceVersion) before
//! the pod is deleted with the eviction's delete options.

use serde_json::{json, Value};
use skiff_core::resources::{self, ResourceInfo};
use skiff_core::selector::{selector_string, LabelSelector};
use skiff_core::{ApiError, ApiResult, Cause};

use crate::object::{self, decode, meta_str};
use crate::options::DeleteOptions;
use crate::registry::Registry;
use crate::watchcache::Filter;

fn pods() -> &'static ResourceInfo {
    resources::lookup("", "v1", "pods").expect("pods")
}

fn pdbs() -> &'static ResourceInfo {
    resources::lookup("policy", "v1", "poddisruptionbudgets").expect("pdbs")
}

/// 429 with the DisruptionBudget cause, as Kubernetes refuses an eviction.
fn too_many(cause: String) -> ApiError {
    let mut e = ApiError::new(
        429,
        "TooManyRequests",
        "Cannot evict pod as it would violate the pod's disruption budget.",
    );
    e.causes = vec![Cause::new("DisruptionBudget", "", cause)];
    e
}

fn is_ready(pod: &Value) -> bool {
    pod.pointer("/status/conditions")
        .and_then(Value::as_array)
        .map(|cs| {
            cs.iter().any(|c| {
                c.get("type").and_then(Value::as_str) == Some("Ready")
                    && c.get("status").and_then(Value::as_str) == Some("True")
            })
        })
        .unwrap_or(false)
}

/// Evicts pod `name` in `ns` per `eviction` (its `deleteOptions` already
/// parsed into `opts`).
pub async fn evict(
    reg: &Registry,
    ns: &str,
    name: &str,
    eviction: &Value,
    opts: &DeleteOptions,
) -> ApiResult<()> {
    let named = eviction
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or("");
    if !named.is_empty() && named != name {
        return Err(ApiError::bad_request(
            "name in URL does not match name in Eviction object",
        ));
    }
    let pod = reg.get(pods(), Some(ns), name).await?;
    let phase = pod
        .pointer("/status/phase")
        .and_then(Value::as_str)
        .unwrap_or("");
    let ignore_budget = matches!(phase, "Succeeded" | "Failed" | "Pending")
        || !meta_str(&pod, "deletionTimestamp").is_empty();
    if !ignore_budget {
        take_disruption(reg, ns, name, &pod, opts.dry_run).await?;
    }
    reg.delete(pods(), Some(ns), name, opts).await?;
    Ok(())
}

/// Takes one disruption from the budget covering `pod`, if any.
async fn take_disruption(
    reg: &Registry,
    ns: &str,
    name: &str,
    pod: &Value,
    dry_run: bool,
) -> ApiResult<()> {
    let labels = object::labels(pod);
    for _attempt in 0..16 {
        let filter = Filter {
            namespace: Some(ns.to_string()),
            ..Default::default()
        };
        let listed = reg.list(pdbs(), &filter, 0, None, None, false).await?;
        let matching: Vec<Value> = listed
            .items
            .iter()
            .filter_map(|b| serde_json::from_slice::<Value>(b).ok())
            .filter(|pdb| {
                // A budget without a selector covers nothing.
                let s = selector_string(pdb.pointer("/spec/selector"));
                if s.is_empty() {
                    return false;
                }
                LabelSelector::parse(&s)
                    .map(|sel| sel.matches(&labels))
                    .unwrap_or(false)
            })
            .collect();
        let pdb = match matching.as_slice() {
            [] => return Ok(()),
            [one] => one,
            _ => {
                return Err(ApiError::new(
                    500,
                    "InternalError",
                    "This pod has more than one PodDisruptionBudget, which the eviction subresource does not support.",
                ))
            }
        };
        let pdb_name = meta_str(pdb, "name").to_string();
        let status = pdb.get("status").cloned().unwrap_or(json!({}));
        let int = |k: &str| status.get(k).and_then(Value::as_i64).unwrap_or(0);
        // An unhealthy pod may go when the budget allows it.
        if !is_ready(pod) {
            let policy = pdb
                .pointer("/spec/unhealthyPodEvictionPolicy")
                .and_then(Value::as_str)
                .unwrap_or("IfHealthyBudget");
            let healthy_enough =
                int("desiredHealthy") > 0 && int("currentHealthy") >= int("desiredHealthy");
            if policy == "AlwaysAllow" || healthy_enough {
                return Ok(());
            }
        }
        let generation = pdb
            .pointer("/metadata/generation")
            .and_then(Value::as_i64)
            .unwrap_or(0);
        if int("observedGeneration") < generation {
            return Err(too_many(format!(
                "The disruption budget {pdb_name} is still being processed by the server."
            )));
        }
        let allowed = int("disruptionsAllowed");
        if allowed < 0 {
            let mut e = ApiError::forbidden(format!(
                "poddisruptionbudget.policy {pdb_name:?} is forbidden: pdb disruptions allowed is negative"
            ));
            e.name = Some(pdb_name);
            e.group = Some("policy".into());
            e.kind = Some("poddisruptionbudget".into());
            return Err(e);
        }
        if allowed == 0 {
            return Err(too_many(format!(
                "The disruption budget {pdb_name} needs {} healthy pods and has {} currently",
                int("desiredHealthy"),
                int("currentHealthy")
            )));
        }
        if dry_run {
            return Ok(());
        }
        // Take the disruption, guarded by the budget's revision; a budget
        // that changed since it was listed is looked at again.
        let listed = pdb;
        let taken = reg
            .guaranteed_update(pdbs(), Some(ns), &pdb_name, None, |kv| async move {
                let Some(kv) = kv else {
                    return Ok(false);
                };
                let mut current = decode(&kv)?;
                if current != *listed {
                    return Ok(false);
                }
                let now = object::now_rfc3339();
                let left = allowed - 1;
                {
                    if !current.get("status").map(Value::is_object).unwrap_or(false) {
                        current["status"] = json!({});
                    }
                    let st = &mut current["status"];
                    st["disruptionsAllowed"] = json!(left);
                    if !st
                        .get("disruptedPods")
                        .map(Value::is_object)
                        .unwrap_or(false)
                    {
                        st["disruptedPods"] = json!({});
                    }
                    st["disruptedPods"][name] = json!(now);
                }
                if left == 0 {
                    crate::object::set_condition(
                        &mut current,
                        "DisruptionAllowed",
                        "False",
                        Some("InsufficientPods"),
                        Some(""),
                    );
                    if let Some(conds) = current
                        .pointer_mut("/status/conditions")
                        .and_then(Value::as_array_mut)
                    {
                        for c in conds.iter_mut() {
                            if c.get("type").and_then(Value::as_str) == Some("DisruptionAllowed") {
                                if let Some(m) = c.as_object_mut() {
                                    m.remove("lastProbeTime");
                                    m.insert("observedGeneration".into(), json!(generation));
                                }
                            }
                        }
                    }
                }
                reg.write_at(pdbs(), &kv, &current).await.map(|_| true)
            })
            .await?;
        if taken {
            return Ok(());
        }
    }
    Err(ApiError::conflict(
        "policy",
        "poddisruptionbudgets",
        name,
        ApiError::STALE,
    ))
}
