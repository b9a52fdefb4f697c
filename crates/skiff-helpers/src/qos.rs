//! A pod's quality-of-service class, after Kubernetes' `GetPodQOS`: from the
//! cpu and memory requests and limits of its containers and init
//! containers (ephemeral containers have none). Guaranteed when every
//! container limits both and each request equals its limit (an absent
//! request is the limit, as defaulting makes it); BestEffort when none
//! requests or limits either; Burstable otherwise. Zero quantities count as
//! absent and values are compared as quantities, not text (`1` = `1000m`).
//!
//! Defined once over [`ContainerResources`], with views of a typed
//! [`PodSpec`] and of a pod spec as JSON (the API server's form), so the
//! agent, the API server and the controllers agree.

use k8s_openapi::api::core::v1::PodSpec;
use serde_json::Value;

use crate::quantity::{self, Quantity};

/// The QoS classes, as `status.qosClass` writes them.
pub const GUARANTEED: &str = "Guaranteed";
pub const BURSTABLE: &str = "Burstable";
pub const BEST_EFFORT: &str = "BestEffort";

/// One container's cpu and memory requests and limits (unparsable or
/// zero quantities are `None`).
#[derive(Debug, Clone, Copy, Default)]
pub struct ContainerResources {
    pub cpu_request: Option<Quantity>,
    pub cpu_limit: Option<Quantity>,
    pub memory_request: Option<Quantity>,
    pub memory_limit: Option<Quantity>,
}

fn nonzero(q: Option<Quantity>) -> Option<Quantity> {
    q.filter(|q| !q.is_zero())
}

/// The class of a pod whose containers (and init containers) have `containers`.
pub fn qos_class(containers: impl IntoIterator<Item = ContainerResources>) -> &'static str {
    let mut any = false;
    let mut guaranteed = true;
    for c in containers {
        for (req, lim) in [
            (nonzero(c.cpu_request), nonzero(c.cpu_limit)),
            (nonzero(c.memory_request), nonzero(c.memory_limit)),
        ] {
            any |= req.is_some() || lim.is_some();
            match (req, lim) {
                (_, None) => guaranteed = false,
                (Some(r), Some(l)) if r.nano() != l.nano() => guaranteed = false,
                _ => {}
            }
        }
    }
    if !any {
        BEST_EFFORT
    } else if guaranteed {
        GUARANTEED
    } else {
        BURSTABLE
    }
}

/// The class of a typed pod spec.
pub fn of_spec(spec: &PodSpec) -> &'static str {
    let containers = spec
        .containers
        .iter()
        .chain(spec.init_containers.iter().flatten());
    qos_class(containers.map(|c| {
        let res = c.resources.as_ref();
        let get = |which: Option<
            &std::collections::BTreeMap<
                String,
                k8s_openapi::apimachinery::pkg::api::resource::Quantity,
            >,
        >,
                   name: &str| {
            which
                .and_then(|m| m.get(name))
                .and_then(|q| Quantity::parse(&q.0).ok())
        };
        let req = res.and_then(|r| r.requests.as_ref());
        let lim = res.and_then(|r| r.limits.as_ref());
        ContainerResources {
            cpu_request: get(req, "cpu"),
            cpu_limit: get(lim, "cpu"),
            memory_request: get(req, "memory"),
            memory_limit: get(lim, "memory"),
        }
    }))
}

/// The class of a pod spec as JSON.
pub fn of_json(spec: &Value) -> &'static str {
    let containers = ["containers", "initContainers"]
        .into_iter()
        .filter_map(|k| spec.get(k).and_then(Value::as_array))
        .flatten();
    qos_class(containers.map(|c| {
        let get = |which: &str, name: &str| {
            c.pointer(&format!("/resources/{which}/{name}"))
                .and_then(quantity::from_json)
        };
        ContainerResources {
            cpu_request: get("requests", "cpu"),
            cpu_limit: get("limits", "cpu"),
            memory_request: get("requests", "memory"),
            memory_limit: get("limits", "memory"),
        }
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn both(spec: Value) -> &'static str {
        let typed: PodSpec = serde_json::from_value(spec.clone()).unwrap();
        let (a, b) = (of_json(&spec), of_spec(&typed));
        assert_eq!(a, b, "the JSON and typed views disagree on {spec}");
        a
    }

    fn c(res: Value) -> Value {
        json!({"name": "c", "resources": res})
    }

    #[test]
    fn classes_as_kubernetes_computes_them() {
        let cases = [
            (json!({"containers": [c(json!({}))]}), BEST_EFFORT),
            (
                json!({"containers": [c(json!({"requests": {"cpu": "1", "memory": "1Gi"}, "limits": {"cpu": "1", "memory": "1Gi"}}))]}),
                GUARANTEED,
            ),
            // Limits alone: requests default to them.
            (
                json!({"containers": [c(json!({"limits": {"cpu": "500m", "memory": "64Mi"}}))]}),
                GUARANTEED,
            ),
            // Equal as quantities, different as text.
            (
                json!({"containers": [c(json!({"requests": {"cpu": "1", "memory": "1024Mi"}, "limits": {"cpu": "1000m", "memory": "1Gi"}}))]}),
                GUARANTEED,
            ),
            (
                json!({"containers": [c(json!({"requests": {"cpu": "1"}}))]}),
                BURSTABLE,
            ),
            (
                json!({"containers": [c(json!({"limits": {"cpu": "1"}}))]}),
                BURSTABLE,
            ),
            (
                json!({"containers": [c(json!({"requests": {"cpu": "500m", "memory": "1Gi"}, "limits": {"cpu": "1", "memory": "1Gi"}}))]}),
                BURSTABLE,
            ),
            // Zero counts as unset.
            (
                json!({"containers": [c(json!({"requests": {"cpu": "0", "memory": "0"}}))]}),
                BEST_EFFORT,
            ),
            // Other resources do not count.
            (
                json!({"containers": [c(json!({"limits": {"ephemeral-storage": "1Gi"}}))]}),
                BEST_EFFORT,
            ),
            // One guaranteed container and one best-effort one: burstable.
            (
                json!({"containers": [c(json!({"limits": {"cpu": "1", "memory": "1Gi"}})), c(json!({}))]}),
                BURSTABLE,
            ),
            // Init containers count.
            (
                json!({"containers": [c(json!({}))], "initContainers": [c(json!({"requests": {"memory": "1Mi"}}))]}),
                BURSTABLE,
            ),
        ];
        for (spec, want) in cases {
            assert_eq!(both(spec.clone()), want, "{spec}");
        }
    }
}
