//! The ResourceQuota controller: status.hard (from spec) and status.used
//! for every resource a quota names: object counts (`pods`, `services`,
//! `count/<resource>[.<group>]`, …), compute requests and limits of
//! non-terminal pods (`requests.cpu`, `memory`, `limits.memory`, …),
//! storage requests of claims, NodePort and LoadBalancer services, with the
//! Terminating/NotTerminating/BestEffort/NotBestEffort scopes. Recomputed
//! every two seconds (admission reads the status).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Pod, ResourceQuota};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use kube::api::Api;
use kube::{Resource, ResourceExt};
use serde_json::json;

use crate::common;
use crate::controller::Controller;
use crate::framework::{key_of, Key};
use crate::Ctx;

pub fn register(ctx: &Arc<Ctx>, tasks: &mut tokio::task::JoinSet<()>) {
    let c = &ctx.caches;
    Controller::new(ctx, "resourcequota", &c.resource_quotas)
        // A finished pod frees its compute resources; a resized one
        // changes them.
        .watches(&c.pods, |c, old, new| {
            let terminal = |p: &Pod| matches!(common::phase(p), "Succeeded" | "Failed");
            quotas_of(c, old, new, |o, n| {
                terminal(o) != terminal(n) || o.spec != n.spec
            })
        })
        .watches(&c.services, |c, old, new| {
            quotas_of(c, old, new, |o, n| o.spec != n.spec)
        })
        .watches(&c.pvcs, |c, old, new| {
            quotas_of(c, old, new, |o, n| o.spec != n.spec)
        })
        .watches(&c.resource_quotas, |c, o, n| quotas_of(c, o, n, counted))
        .watches(&c.configmaps, |c, o, n| quotas_of(c, o, n, counted))
        .watches(&c.secrets, |c, o, n| quotas_of(c, o, n, counted))
        .watches(&c.replication_controllers, |c, o, n| {
            quotas_of(c, o, n, counted)
        })
        .watches(&c.deployments, |c, o, n| quotas_of(c, o, n, counted))
        .watches(&c.replicasets, |c, o, n| quotas_of(c, o, n, counted))
        .watches(&c.statefulsets, |c, o, n| quotas_of(c, o, n, counted))
        .watches(&c.daemonsets, |c, o, n| quotas_of(c, o, n, counted))
        .watches(&c.jobs, |c, o, n| quotas_of(c, o, n, counted))
        .watches(&c.cronjobs, |c, o, n| quotas_of(c, o, n, counted))
        .resync(Duration::from_secs(5 * 60))
        .run(tasks, (), |c, _, key| async move {
            let Some(quota) = c.caches.resource_quotas.get(&key) else {
                return Ok(None);
            };
            reconcile(&c, &quota).await.map(|_| None)
        });
}

/// Objects that a quota only counts: their updates change nothing.
fn counted<K>(_: &K, _: &K) -> bool {
    false
}

/// The quotas of an object's namespace, when the object was added or
/// deleted or `changed(old, new)` says its update may change what it uses.
fn quotas_of<K: Resource>(
    ctx: &Ctx,
    old: Option<&K>,
    new: Option<&K>,
    changed: impl Fn(&K, &K) -> bool,
) -> Vec<Key> {
    if let (Some(o), Some(n)) = (old, new) {
        if !changed(o, n) {
            return vec![];
        }
    }
    let Some(obj) = new.or(old) else {
        return vec![];
    };
    let ns = obj.meta().namespace.as_deref().unwrap_or_default();
    ctx.caches
        .resource_quotas
        .in_namespace(ns)
        .iter()
        .map(|q| key_of(&q.metadata))
        .collect()
}

/// A quantity in thousandths, rounded up ("500m" → 500, "1Gi" →
/// 1073741824000).
fn milli(q: &str) -> Option<i128> {
    skiff_helpers::quantity::milli(q).map(i128::from)
}

/// Thousandths back to a quantity in Kubernetes' canonical form (binary
/// suffixes for byte amounts).
pub fn format_quantity(milli: i128, binary: bool) -> String {
    use skiff_helpers::quantity::Format;
    let format = if binary {
        Format::BinarySI
    } else {
        Format::DecimalSI
    };
    skiff_helpers::Quantity::from_milli(milli, format).canonical()
}

fn q(map: Option<&BTreeMap<String, Quantity>>, key: &str) -> i128 {
    map.and_then(|m| m.get(key))
        .and_then(|v| milli(&v.0))
        .unwrap_or(0)
}

/// A pod's effective request or limit of `resource`: the larger of the sum
/// over containers and the largest init container, plus overhead.
pub fn pod_amount(p: &Pod, limits: bool, resource: &str) -> i128 {
    let Some(spec) = p.spec.as_ref() else {
        return 0;
    };
    let of = |c: &k8s_openapi::api::core::v1::Container| {
        let r = c.resources.as_ref();
        let m = if limits {
            r.and_then(|r| r.limits.as_ref())
        } else {
            r.and_then(|r| r.requests.as_ref())
        };
        q(m, resource)
    };
    let sum: i128 = spec.containers.iter().map(of).sum();
    let init = spec
        .init_containers
        .iter()
        .flatten()
        .map(of)
        .max()
        .unwrap_or(0);
    sum.max(init) + q(spec.overhead.as_ref(), resource)
}

fn best_effort(p: &Pod) -> bool {
    p.spec
        .as_ref()
        .map(|s| {
            s.containers
                .iter()
                .chain(s.init_containers.iter().flatten())
                .all(|c| {
                    c.resources
                        .as_ref()
                        .map(|r| {
                            r.requests.as_ref().map(|m| m.is_empty()).unwrap_or(true)
                                && r.limits.as_ref().map(|m| m.is_empty()).unwrap_or(true)
                        })
                        .unwrap_or(true)
                })
        })
        .unwrap_or(true)
}

/// Whether a pod falls in a quota's scopes.
pub fn in_scopes(p: &Pod, scopes: &[String]) -> bool {
    scopes.iter().all(|s| match s.as_str() {
        "Terminating" => p
            .spec
            .as_ref()
            .and_then(|s| s.active_deadline_seconds)
            .is_some(),
        "NotTerminating" => p
            .spec
            .as_ref()
            .and_then(|s| s.active_deadline_seconds)
            .is_none(),
        "BestEffort" => best_effort(p),
        "NotBestEffort" => !best_effort(p),
        _ => true,
    })
}

async fn reconcile(ctx: &Ctx, quota: &ResourceQuota) -> Result<(), crate::Error> {
    let ns = quota.namespace().unwrap_or_default();
    let hard = quota
        .spec
        .as_ref()
        .and_then(|s| s.hard.clone())
        .unwrap_or_default();
    let scopes = quota
        .spec
        .as_ref()
        .and_then(|s| s.scopes.clone())
        .unwrap_or_default();
    let pods: Vec<Arc<Pod>> = ctx
        .caches
        .pods
        .in_namespace(&ns)
        .into_iter()
        .filter(|p| {
            let ph = common::phase(p);
            ph != "Succeeded" && ph != "Failed"
        })
        .filter(|p| in_scopes(p, &scopes))
        .collect();
    let services = ctx.caches.services.in_namespace(&ns);
    let pvcs = ctx.caches.pvcs.in_namespace(&ns);
    let mut used: BTreeMap<String, String> = BTreeMap::new();
    for key in hard.keys() {
        let count = |n: usize| format_quantity(n as i128 * 1000, false);
        let v = match key.as_str() {
            "pods" | "count/pods" => count(pods.len()),
            "services" | "count/services" => count(services.len()),
            "services.nodeports" => count(
                services
                    .iter()
                    .filter(|s| {
                        matches!(
                            s.spec.as_ref().and_then(|s| s.type_.as_deref()),
                            Some("NodePort") | Some("LoadBalancer")
                        )
                    })
                    .map(|s| {
                        s.spec
                            .as_ref()
                            .and_then(|s| s.ports.as_ref())
                            .map(|p| p.len())
                            .unwrap_or(0)
                    })
                    .sum(),
            ),
            "services.loadbalancers" => count(
                services
                    .iter()
                    .filter(|s| {
                        s.spec.as_ref().and_then(|s| s.type_.as_deref()) == Some("LoadBalancer")
                    })
                    .count(),
            ),
            "persistentvolumeclaims" | "count/persistentvolumeclaims" => count(pvcs.len()),
            "requests.storage" => format_quantity(
                pvcs.iter()
                    .map(|p| {
                        q(
                            p.spec
                                .as_ref()
                                .and_then(|s| s.resources.as_ref())
                                .and_then(|r| r.requests.as_ref()),
                            "storage",
                        )
                    })
                    .sum(),
                true,
            ),
            "replicationcontrollers" | "count/replicationcontrollers" => {
                count(ctx.caches.replication_controllers.in_namespace(&ns).len())
            }
            "resourcequotas" | "count/resourcequotas" => {
                count(ctx.caches.resource_quotas.in_namespace(&ns).len())
            }
            "count/deployments.apps" => count(ctx.caches.deployments.in_namespace(&ns).len()),
            "count/replicasets.apps" => count(ctx.caches.replicasets.in_namespace(&ns).len()),
            "count/statefulsets.apps" => count(ctx.caches.statefulsets.in_namespace(&ns).len()),
            "count/daemonsets.apps" => count(ctx.caches.daemonsets.in_namespace(&ns).len()),
            "count/jobs.batch" => count(ctx.caches.jobs.in_namespace(&ns).len()),
            "count/cronjobs.batch" => count(ctx.caches.cronjobs.in_namespace(&ns).len()),
            "configmaps" | "count/configmaps" => {
                count(ctx.caches.configmaps.in_namespace(&ns).len())
            }
            "secrets" | "count/secrets" => count(ctx.caches.secrets.in_namespace(&ns).len()),
            k => {
                let (limits, resource) = match k.split_once('.') {
                    Some(("requests", r)) => (false, r),
                    Some(("limits", r)) => (true, r),
                    None if k == "cpu" || k == "memory" || k == "ephemeral-storage" => (false, k),
                    _ => continue,
                };
                let total: i128 = pods.iter().map(|p| pod_amount(p, limits, resource)).sum();
                format_quantity(total, resource != "cpu")
            }
        };
        used.insert(key.clone(), v);
    }
    let old = quota.status.clone().unwrap_or_default();
    let same = |a: Option<&BTreeMap<String, Quantity>>, b: &BTreeMap<String, String>| {
        a.map(|a| {
            a.len() == b.len()
                && a.iter()
                    .all(|(k, v)| b.get(k).and_then(|w| milli(w)) == milli(&v.0))
        })
        .unwrap_or(b.is_empty())
    };
    let hard_s: BTreeMap<String, String> =
        hard.iter().map(|(k, v)| (k.clone(), v.0.clone())).collect();
    if same(old.used.as_ref(), &used) && same(old.hard.as_ref(), &hard_s) {
        return Ok(());
    }
    let api: Api<ResourceQuota> = Api::namespaced(ctx.client.clone(), &ns);
    // Replace both maps (a merge patch would keep keys no longer named).
    let patch = json!({"status": {"hard": hard_s, "used": used}});
    match api
        .replace_status(&quota.name_any(), &Default::default(), &{
            let mut q = quota.clone();
            q.status = serde_json::from_value(patch["status"].clone()).ok();
            q
        })
        .await
    {
        Ok(_) => Ok(()),
        Err(e) if common::is_not_found(&e) || common::is_conflict(&e) => Ok(()),
        Err(e) => Err(e.into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantities_parse_to_thousandths_and_format_back() {
        assert_eq!(milli("500m"), Some(500));
        assert_eq!(milli("2"), Some(2000));
        assert_eq!(milli("1.5"), Some(1500));
        assert_eq!(milli("1Gi"), Some(1_073_741_824_000));
        assert_eq!(milli("128Mi"), Some(134_217_728_000));
        assert_eq!(milli("1k"), Some(1_000_000));
        assert_eq!(milli("1e3"), Some(1_000_000));
        assert_eq!(milli("100n"), Some(1), "rounded up");
        assert_eq!(milli("bogus"), None);
        assert_eq!(milli("1Zi"), None);
        assert_eq!(format_quantity(1500, false), "1500m");
        assert_eq!(format_quantity(3000, false), "3");
        assert_eq!(format_quantity(1_073_741_824_000, true), "1Gi");
        assert_eq!(format_quantity(1_000_000, true), "1k", "below 1Ki: decimal");
        assert_eq!(format_quantity(3_000_000, false), "3k");
    }

    #[test]
    fn a_pods_request_is_the_larger_of_its_containers_sum_and_its_largest_init_container() {
        let p: Pod = serde_json::from_value(json!({"spec": {
            "containers": [
                {"name": "a", "resources": {"requests": {"cpu": "100m", "memory": "64Mi"}, "limits": {"memory": "128Mi"}}},
                {"name": "b", "resources": {"requests": {"cpu": "200m"}}}],
            "initContainers": [{"name": "i", "resources": {"requests": {"cpu": "500m"}}}]}}))
        .unwrap();
        assert_eq!(pod_amount(&p, false, "cpu"), 500);
        assert_eq!(pod_amount(&p, false, "memory"), 64 * 1024 * 1024 * 1000);
        assert_eq!(pod_amount(&p, true, "memory"), 128 * 1024 * 1024 * 1000);
        assert!(!best_effort(&p));
        assert!(in_scopes(
            &p,
            &["NotBestEffort".into(), "NotTerminating".into()]
        ));
        assert!(!in_scopes(&p, &["BestEffort".into()]));
    }
}
