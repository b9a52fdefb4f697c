//! Pods: defaults (the pod spec, requests from limits, the initial status),
//! validation (the spec and what an update may change), field selectors,
//! the table and quota usage.

use serde_json::Map;

use super::prelude::*;
use crate::admission::{milli, pod_totals};

pub struct Pod;

/// The words of the API server's 409 for a binding its node has no room
/// for (Omega's commit check): the scheduler tells a lost race by them.
pub const DOES_NOT_FIT: &str = "does not fit on node";

/// The words of the 409 for binding a pod that is bound already
/// (Kubernetes' binding storage's).
pub const ALREADY_ASSIGNED: &str = "is already assigned to node";

impl KindRules for Pod {
    fn kind(&self) -> &'static str {
        "Pod"
    }

    fn defaults(&self, obj: &mut Value) {
        if let Some(spec) = obj.get_mut("spec") {
            crate::defaults::pod_spec(spec);
            crate::defaults::requests_from_limits(spec);
        }
        crate::defaults::pod_status(obj);
    }

    fn validate(&self, obj: &Value) -> Vec<Cause> {
        let mut c = Vec::new();
        let ns = obj
            .pointer("/metadata/namespace")
            .and_then(Value::as_str)
            .unwrap_or("default");
        crate::validation::declared_dependencies(obj.get("metadata"), "metadata", ns, &mut c);
        if let Some(spec) = obj.get("spec") {
            crate::validation::pod_spec(spec, "spec", &[], &mut c);
        } else {
            c.push(Cause::required("spec.containers"));
        }
        c
    }

    /// Ephemeral containers come only through `pods/ephemeralcontainers`.
    fn validate_create(&self, obj: &Value) -> Vec<Cause> {
        match obj
            .pointer("/spec/ephemeralContainers")
            .and_then(Value::as_array)
        {
            Some(a) if !a.is_empty() => vec![Cause::forbidden(
                "spec.ephemeralContainers",
                "cannot be set on create",
            )],
            _ => Vec::new(),
        }
    }

    fn validate_update(&self, new: &Value, old: &Value) -> Vec<Cause> {
        crate::validation::pod_update(new, old)
    }

    /// Kubernetes 1.33 sets a pod's generation to 1 at creation and moves
    /// it with every spec change (an image, ephemeral containers, a
    /// resize) and with a graceful deletion.
    fn tracks_generation(&self) -> bool {
        true
    }

    fn selectable_fields(&self) -> &'static [&'static str] {
        &[
            "spec.nodeName",
            "spec.restartPolicy",
            "spec.schedulerName",
            "spec.serviceAccountName",
            "spec.hostNetwork",
            "status.phase",
            "status.podIP",
            "status.nominatedNodeName",
        ]
    }

    fn printer(&self) -> &'static Printer {
        &POD_PRINTER
    }

    /// A finished pod (Succeeded or Failed) counts for nothing.
    fn quota_usage(&self, obj: &Value) -> Option<BTreeMap<String, i128>> {
        let phase = obj
            .pointer("/status/phase")
            .and_then(Value::as_str)
            .unwrap_or("");
        if phase == "Succeeded" || phase == "Failed" {
            return None;
        }
        let mut u = BTreeMap::from([("pods".to_string(), 1000)]);
        let mut add = |name: &str, totals: &Map<String, Value>, r: &str| {
            if let Some(m) = totals.get(r).and_then(milli) {
                u.insert(name.into(), m);
            }
        };
        let req = pod_totals(obj, "requests");
        let lim = pod_totals(obj, "limits");
        add("requests.cpu", &req, "cpu");
        add("cpu", &req, "cpu");
        add("requests.memory", &req, "memory");
        add("memory", &req, "memory");
        add("requests.ephemeral-storage", &req, "ephemeral-storage");
        add("ephemeral-storage", &req, "ephemeral-storage");
        add("limits.cpu", &lim, "cpu");
        add("limits.memory", &lim, "memory");
        add("limits.ephemeral-storage", &lim, "ephemeral-storage");
        Some(u)
    }

    fn quota_tracks(&self, resource: &str) -> bool {
        matches!(
            resource,
            "pods"
                | "cpu"
                | "memory"
                | "ephemeral-storage"
                | "requests.cpu"
                | "requests.memory"
                | "requests.ephemeral-storage"
                | "limits.cpu"
                | "limits.memory"
                | "limits.ephemeral-storage"
        )
    }

    fn quota_constraints(&self, obj: &Value, tracked: &[String]) -> Result<(), String> {
        crate::admission::pod_quota_constraints(obj, tracked)
    }

    fn returns_deleted_object(&self) -> bool {
        true
    }
}

pub static POD_PRINTER: Printer = Printer {
    columns: &[
        NAME,
        col("Ready", "string", 0),
        col("Status", "string", 0),
        col("Restarts", "string", 0),
        AGE,
        col("IP", "string", 1),
        col("Node", "string", 1),
        col("Nominated Node", "string", 1),
        col("Readiness Gates", "string", 1),
    ],
    cells: pod_cells,
};

/// Kubernetes' pod STATUS column.
pub fn pod_status(pod: &Value) -> String {
    let mut reason = pod
        .pointer("/status/reason")
        .and_then(Value::as_str)
        .map(str::to_string)
        .unwrap_or_else(|| s(pod, "/status/phase").to_string());
    let init_total = pod
        .pointer("/spec/initContainers")
        .and_then(Value::as_array)
        .map(|a| a.len())
        .unwrap_or(0);
    let mut initializing = false;
    if let Some(ics) = pod
        .pointer("/status/initContainerStatuses")
        .and_then(Value::as_array)
    {
        for (n, c) in ics.iter().enumerate() {
            if c.pointer("/state/terminated/exitCode")
                .and_then(Value::as_i64)
                == Some(0)
            {
                continue;
            }
            initializing = true;
            if let Some(t) = c.pointer("/state/terminated") {
                reason = match t.get("reason").and_then(Value::as_str) {
                    Some(r) if !r.is_empty() => format!("Init:{r}"),
                    _ => format!(
                        "Init:ExitCode:{}",
                        t.get("exitCode").and_then(Value::as_i64).unwrap_or(0)
                    ),
                };
            } else if let Some(r) = c
                .pointer("/state/waiting/reason")
                .and_then(Value::as_str)
                .filter(|r| *r != "PodInitializing")
            {
                reason = format!("Init:{r}");
            } else {
                reason = format!("Init:{n}/{init_total}");
            }
            break;
        }
    }
    if !initializing {
        let mut has_running = false;
        if let Some(cs) = pod
            .pointer("/status/containerStatuses")
            .and_then(Value::as_array)
        {
            for c in cs.iter().rev() {
                if let Some(r) = c
                    .pointer("/state/waiting/reason")
                    .and_then(Value::as_str)
                    .filter(|r| !r.is_empty())
                {
                    reason = r.to_string();
                } else if let Some(t) = c.pointer("/state/terminated") {
                    reason = match t.get("reason").and_then(Value::as_str) {
                        Some(r) if !r.is_empty() => r.to_string(),
                        _ => match t.get("signal").and_then(Value::as_i64).filter(|s| *s != 0) {
                            Some(sig) => format!("Signal:{sig}"),
                            None => format!(
                                "ExitCode:{}",
                                t.get("exitCode").and_then(Value::as_i64).unwrap_or(0)
                            ),
                        },
                    };
                } else if c.pointer("/state/running").is_some()
                    && c.get("ready") == Some(&json!(true))
                {
                    has_running = true;
                }
            }
        }
        if reason == "Completed" && has_running {
            reason = "Running".into();
        }
    }
    if pod
        .pointer("/metadata/deletionTimestamp")
        .and_then(Value::as_str)
        .is_some()
    {
        reason = if s(pod, "/status/reason") == "NodeLost" {
            "Unknown".into()
        } else {
            "Terminating".into()
        };
    }
    reason
}

fn pod_cells(obj: &Value, now: DateTime<Utc>) -> Vec<Value> {
    let total = obj
        .pointer("/spec/containers")
        .and_then(Value::as_array)
        .map(|a| a.len())
        .unwrap_or(0);
    let statuses = obj
        .pointer("/status/containerStatuses")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let ready = statuses
        .iter()
        .filter(|c| c.get("ready") == Some(&json!(true)))
        .count();
    let restarts: i64 = statuses
        .iter()
        .map(|c| c.get("restartCount").and_then(Value::as_i64).unwrap_or(0))
        .sum();
    let last_restart = statuses
        .iter()
        .filter_map(|c| {
            c.pointer("/lastState/terminated/finishedAt")
                .and_then(Value::as_str)
        })
        .filter_map(|t| DateTime::parse_from_rfc3339(t).ok())
        .max();
    let restarts_s = match (restarts, last_restart) {
        (r, Some(t)) if r > 0 => {
            format!("{r} ({} ago)", human_duration(now - t.with_timezone(&Utc)))
        }
        (r, _) => r.to_string(),
    };
    let gates = obj
        .pointer("/spec/readinessGates")
        .and_then(Value::as_array)
        .map(|a| a.len())
        .unwrap_or(0);
    vec![
        json!(s(obj, "/metadata/name")),
        json!(format!("{ready}/{total}")),
        json!(pod_status(obj)),
        json!(restarts_s),
        json!(age(obj, "/metadata/creationTimestamp", now)),
        json!(or_none(s(obj, "/status/podIP"))),
        json!(or_none(s(obj, "/spec/nodeName"))),
        json!(or_none(s(obj, "/status/nominatedNodeName"))),
        json!(if gates == 0 {
            "<none>".to_string()
        } else {
            format!("0/{gates}")
        }),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn now() -> DateTime<Utc> {
        DateTime::parse_from_rfc3339("2026-01-01T01:00:00Z")
            .unwrap()
            .with_timezone(&Utc)
    }

    #[test]
    fn a_crashing_pod_shows_crash_loop_back_off() {
        let pod = json!({"metadata": {"name": "p", "creationTimestamp": "2026-01-01T00:00:00Z"},
            "spec": {"containers": [{"name": "c"}]},
            "status": {"phase": "Running", "containerStatuses": [{"name": "c", "ready": false, "restartCount": 3,
                "state": {"waiting": {"reason": "CrashLoopBackOff"}},
                "lastState": {"terminated": {"finishedAt": "2026-01-01T00:55:00Z"}}}]}});
        let c = (POD_PRINTER.cells)(&pod, now());
        assert_eq!(c[1], "0/1");
        assert_eq!(c[2], "CrashLoopBackOff");
        assert_eq!(c[3], "3 (5m ago)");
        assert_eq!(c[4], "60m");
        assert_eq!(c.len(), POD_PRINTER.columns.len());
    }
}
