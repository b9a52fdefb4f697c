//! Conversion between the versions of a resource served from one storage:
//! autoscaling/v1 HorizontalPodAutoscalers are stored as autoscaling/v2, and
//! events.k8s.io/v1 Events as core/v1 Events.
//!
//! v1 knows only a CPU utilization target; converting a v2 object with other
//! metrics to v1 shows the CPU target alone, and a v1 write replaces the
//! metrics with the CPU target (Kubernetes keeps the others in annotations;
//! skiff does not yet).

use serde_json::{json, Value};

use crate::resources::{ResourceInfo, RESOURCES};

/// The resource whose version is stored for `res` (the first served version
/// with the same storage, which is the preferred one).
pub fn storage_resource(res: &'static ResourceInfo) -> &'static ResourceInfo {
    if let Some(c) = res.rules.custom() {
        // Custom resources: the definition's storage version (conversion
        // `None` rewrites apiVersion and nothing else).
        return c.storage_resource().unwrap_or(res);
    }
    RESOURCES
        .iter()
        .find(|r| r.storage == res.storage)
        .unwrap_or(res)
}

/// Whether requests for `res` need conversion.
pub fn needed(res: &'static ResourceInfo) -> bool {
    let s = storage_resource(res);
    s.version != res.version || s.group != res.group
}

/// Moves `from` to `to` within an object map, if present.
fn rename(m: &mut serde_json::Map<String, Value>, from: &str, to: &str) {
    if let Some(v) = m.remove(from) {
        m.insert(to.to_string(), v);
    }
}

/// events.k8s.io/v1 → core/v1.
pub(crate) fn event_to_core(obj: &mut Value) {
    let Some(m) = obj.as_object_mut() else { return };
    rename(m, "regarding", "involvedObject");
    rename(m, "note", "message");
    rename(m, "deprecatedCount", "count");
    rename(m, "deprecatedFirstTimestamp", "firstTimestamp");
    rename(m, "deprecatedLastTimestamp", "lastTimestamp");
    rename(m, "deprecatedSource", "source");
    rename(m, "reportingController", "reportingComponent");
}

/// core/v1 → events.k8s.io/v1.
fn event_from_core(obj: &mut Value) {
    let Some(m) = obj.as_object_mut() else { return };
    rename(m, "involvedObject", "regarding");
    rename(m, "message", "note");
    rename(m, "count", "deprecatedCount");
    rename(m, "firstTimestamp", "deprecatedFirstTimestamp");
    rename(m, "lastTimestamp", "deprecatedLastTimestamp");
    rename(m, "reportingComponent", "reportingController");
    if !m.contains_key("reportingController") {
        if let Some(c) = m.get("source").and_then(|s| s.get("component")).cloned() {
            m.insert("reportingController".into(), c);
        }
    }
    if !m.contains_key("reportingInstance") {
        if let Some(h) = m.get("source").and_then(|s| s.get("host")).cloned() {
            m.insert("reportingInstance".into(), h);
        }
    }
    rename(m, "source", "deprecatedSource");
}

/// A field selector's field for `res` as the stored version names it.
pub fn storage_field(res: &'static ResourceInfo, field: &str) -> String {
    if res.group == "events.k8s.io" {
        if let Some(rest) = field.strip_prefix("regarding.") {
            return format!("involvedObject.{rest}");
        }
        if field == "reportingController" {
            return "reportingComponent".into();
        }
    }
    field.to_string()
}

/// Converts an object sent for `res` to the stored version.
pub fn to_storage(res: &'static ResourceInfo, mut obj: Value) -> Value {
    if !needed(res) {
        return obj;
    }
    let storage = storage_resource(res);
    if res.group == "events.k8s.io" {
        event_to_core(&mut obj);
    }
    if res.kind == "HorizontalPodAutoscaler" && res.version == "v1" {
        if let Some(spec) = obj.get_mut("spec").and_then(Value::as_object_mut) {
            let cpu = spec.remove("targetCPUUtilizationPercentage");
            if let Some(cpu) = cpu.filter(|c| !c.is_null()) {
                spec.insert(
                    "metrics".into(),
                    json!([{"type": "Resource", "resource": {"name": "cpu", "target": {"type": "Utilization", "averageUtilization": cpu}}}]),
                );
            }
        }
        if let Some(status) = obj.get_mut("status").and_then(Value::as_object_mut) {
            if let Some(cpu) = status
                .remove("currentCPUUtilizationPercentage")
                .filter(|c| !c.is_null())
            {
                status.insert(
                    "currentMetrics".into(),
                    json!([{"type": "Resource", "resource": {"name": "cpu", "current": {"averageUtilization": cpu}}}]),
                );
            }
        }
    }
    if let Some(m) = obj.as_object_mut() {
        m.insert("apiVersion".into(), json!(storage.api_version()));
    }
    obj
}

fn cpu_of(list: Option<&Value>, field: &str) -> Option<Value> {
    list?.as_array()?.iter().find_map(|m| {
        let r = m.get("resource")?;
        (m.get("type")?.as_str()? == "Resource" && r.get("name")?.as_str()? == "cpu")
            .then(|| r.get(field)?.get("averageUtilization").cloned())
            .flatten()
    })
}

/// Converts a stored object to the version `res` serves.
pub fn from_storage(res: &'static ResourceInfo, mut obj: Value) -> Value {
    if let Some(c) = res.rules.custom() {
        // Conversion `None`: the apiVersion changes; then the served
        // version's defaults (defaulting on read from storage).
        if needed(res) {
            if let Some(m) = obj.as_object_mut() {
                m.insert("apiVersion".into(), json!(res.api_version()));
            }
        }
        if let Some(s) = &c.compiled {
            s.apply_defaults(&mut obj);
        }
        return obj;
    }
    if !needed(res) {
        return obj;
    }
    if res.group == "events.k8s.io" {
        event_from_core(&mut obj);
    }
    if res.kind == "HorizontalPodAutoscaler" && res.version == "v1" {
        if let Some(spec) = obj.get_mut("spec").and_then(Value::as_object_mut) {
            let cpu = cpu_of(spec.get("metrics"), "target");
            spec.remove("metrics");
            spec.remove("behavior");
            if let Some(cpu) = cpu {
                spec.insert("targetCPUUtilizationPercentage".into(), cpu);
            }
        }
        if let Some(status) = obj.get_mut("status").and_then(Value::as_object_mut) {
            let cpu = cpu_of(status.get("currentMetrics"), "current");
            status.remove("currentMetrics");
            status.remove("conditions");
            if let Some(cpu) = cpu {
                status.insert("currentCPUUtilizationPercentage".into(), cpu);
            }
        }
    }
    if let Some(m) = obj.as_object_mut() {
        m.insert("apiVersion".into(), json!(res.api_version()));
    }
    obj
}

/// Converts serialized stored objects for `res` (lists and watches).
pub fn bytes_from_storage(res: &'static ResourceInfo, b: &[u8]) -> Vec<u8> {
    match serde_json::from_slice::<Value>(b) {
        Ok(v) => serde_json::to_vec(&from_storage(res, v)).unwrap_or_else(|_| b.to_vec()),
        Err(_) => b.to_vec(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resources::lookup;

    #[test]
    fn a_v1_cpu_target_is_stored_as_a_v2_resource_metric_and_back() {
        let v1 = lookup("autoscaling", "v1", "horizontalpodautoscalers").unwrap();
        let obj = json!({"apiVersion": "autoscaling/v1", "kind": "HorizontalPodAutoscaler", "metadata": {"name": "h"},
            "spec": {"scaleTargetRef": {"kind": "Deployment", "name": "d", "apiVersion": "apps/v1"}, "maxReplicas": 5, "targetCPUUtilizationPercentage": 60}});
        let stored = to_storage(v1, obj.clone());
        assert_eq!(stored["apiVersion"], "autoscaling/v2");
        assert_eq!(
            stored["spec"]["metrics"][0]["resource"]["target"]["averageUtilization"],
            60
        );
        assert_eq!(from_storage(v1, stored), obj);
    }

    #[test]
    fn an_events_k8s_io_event_is_a_core_event_with_other_names() {
        let ev = lookup("events.k8s.io", "v1", "events").unwrap();
        assert_eq!(storage_resource(ev).group, "");
        let obj = json!({"apiVersion": "events.k8s.io/v1", "kind": "Event", "metadata": {"name": "e"},
            "regarding": {"kind": "Pod", "name": "p"}, "note": "hi", "reason": "R", "reportingController": "skiff",
            "reportingInstance": "n1", "action": "Do", "type": "Normal", "eventTime": "2026-01-01T00:00:00.000000Z"});
        let core = to_storage(ev, obj.clone());
        assert_eq!(core["apiVersion"], "v1");
        assert_eq!(core["involvedObject"]["name"], "p");
        assert_eq!(core["message"], "hi");
        assert_eq!(core["reportingComponent"], "skiff");
        assert_eq!(from_storage(ev, core), obj);
        assert_eq!(storage_field(ev, "regarding.name"), "involvedObject.name");
    }

    #[test]
    fn the_preferred_version_needs_no_conversion() {
        let v2 = lookup("autoscaling", "v2", "horizontalpodautoscalers").unwrap();
        assert!(!needed(v2));
        assert!(!needed(lookup("", "v1", "pods").unwrap()));
    }
}
