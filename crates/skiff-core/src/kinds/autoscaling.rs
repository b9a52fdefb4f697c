//! HorizontalPodAutoscalers (`autoscaling/v2`, also served as `v1`):
//! generation tracking and `kubectl get hpa`'s table, read from either
//! version's form (v1's single CPU target is v2's one resource metric).

use super::prelude::*;

pub struct HorizontalPodAutoscaler;

impl KindRules for HorizontalPodAutoscaler {
    fn kind(&self) -> &'static str {
        "HorizontalPodAutoscaler"
    }

    fn tracks_generation(&self) -> bool {
        true
    }

    fn printer(&self) -> &'static Printer {
        &HPA_PRINTER
    }
}

pub static HPA_PRINTER: Printer = Printer {
    columns: &[
        NAME,
        col("Reference", "string", 0),
        col("Targets", "string", 0),
        col("MinPods", "string", 0),
        col("MaxPods", "string", 0),
        col("Replicas", "string", 0),
        AGE,
    ],
    cells: |obj, now| {
        let min = obj
            .pointer("/spec/minReplicas")
            .and_then(Value::as_i64)
            .map_or_else(|| "<unset>".to_string(), |m| m.to_string());
        vec![
            json!(s(obj, "/metadata/name")),
            json!(format!(
                "{}/{}",
                s(obj, "/spec/scaleTargetRef/kind"),
                s(obj, "/spec/scaleTargetRef/name")
            )),
            json!(targets(obj)),
            json!(min),
            json!(i(obj, "/spec/maxReplicas")),
            json!(i(obj, "/status/currentReplicas")),
            json!(age(obj, "/metadata/creationTimestamp", now)),
        ]
    },
};

/// Each metric as `current/target` (at most two, then how many more).
fn targets(obj: &Value) -> String {
    // autoscaling/v1: one CPU utilization target.
    if obj.pointer("/spec/metrics").is_none() {
        if let Some(t) = obj
            .pointer("/spec/targetCPUUtilizationPercentage")
            .and_then(Value::as_i64)
        {
            let current = obj
                .pointer("/status/currentCPUUtilizationPercentage")
                .and_then(Value::as_i64)
                .map_or_else(|| "<unknown>".to_string(), |c| format!("{c}%"));
            return format!("cpu: {current}/{t}%");
        }
    }
    let specs = obj
        .pointer("/spec/metrics")
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or(&[]);
    if specs.is_empty() {
        return "<none>".into();
    }
    let statuses = obj
        .pointer("/status/currentMetrics")
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or(&[]);
    let mut list: Vec<String> = specs
        .iter()
        .enumerate()
        .map(|(n, spec)| metric(spec, statuses.get(n)))
        .collect();
    let count = list.len();
    if count > 2 {
        list.truncate(2);
        return format!("{} + {} more...", list.join(", "), count - 2);
    }
    list.join(", ")
}

fn metric(spec: &Value, status: Option<&Value>) -> String {
    let unknown = || "<unknown>".to_string();
    // The status entry of the same source, if it reports the field.
    let current = |source: &str, field: &str| {
        status
            .and_then(|st| st.get(source))
            .and_then(|src| src.pointer(&format!("/current/{field}")))
            .map(|v| match v {
                Value::String(q) => q.clone(),
                other => other.to_string(),
            })
    };
    let source_of = |key: &str| spec.get(key).unwrap_or(&Value::Null);
    match s(spec, "/type") {
        t @ ("External" | "Object") => {
            let key = if t == "External" {
                "external"
            } else {
                "object"
            };
            let src = source_of(key);
            match src.pointer("/target/averageValue").and_then(Value::as_str) {
                Some(avg) => format!(
                    "{}/{avg} (avg)",
                    current(key, "averageValue").unwrap_or_else(unknown)
                ),
                None => format!(
                    "{}/{}",
                    current(key, "value").unwrap_or_else(unknown),
                    s(src, "/target/value")
                ),
            }
        }
        "Pods" => format!(
            "{}/{}",
            current("pods", "averageValue").unwrap_or_else(unknown),
            s(source_of("pods"), "/target/averageValue")
        ),
        t @ ("Resource" | "ContainerResource") => {
            let key = if t == "Resource" {
                "resource"
            } else {
                "containerResource"
            };
            let src = source_of(key);
            let name = s(src, "/name");
            match src.pointer("/target/averageValue").and_then(Value::as_str) {
                Some(avg) => format!(
                    "{name}: {}/{avg}",
                    current(key, "averageValue").unwrap_or_else(unknown)
                ),
                None => {
                    let current = current(key, "averageUtilization")
                        .map_or_else(unknown, |c| format!("{c}%"));
                    let target = src
                        .pointer("/target/averageUtilization")
                        .and_then(Value::as_i64)
                        .map_or_else(|| "<auto>".to_string(), |t| format!("{t}%"));
                    format!("{name}: {current}/{target}")
                }
            }
        }
        _ => "<unknown type>".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hpa(spec: Value, status: Value) -> Value {
        json!({"metadata": {"name": "web"}, "spec": spec, "status": status})
    }

    #[test]
    fn a_cpu_target_prints_as_kubectl_shows_it_in_both_versions() {
        let v2 = hpa(
            json!({"scaleTargetRef": {"kind": "Deployment", "name": "web"}, "minReplicas": 1, "maxReplicas": 3,
                "metrics": [{"type": "Resource", "resource": {"name": "cpu", "target": {"type": "Utilization", "averageUtilization": 50}}}]}),
            json!({"currentReplicas": 2}),
        );
        let cells = (HPA_PRINTER.cells)(&v2, Utc::now());
        assert_eq!(
            cells[..6],
            [
                json!("web"),
                json!("Deployment/web"),
                json!("cpu: <unknown>/50%"),
                json!("1"),
                json!(3),
                json!(2)
            ]
        );
        let v1 = hpa(
            json!({"scaleTargetRef": {"kind": "Deployment", "name": "web"}, "maxReplicas": 3, "targetCPUUtilizationPercentage": 80}),
            json!({"currentReplicas": 1, "currentCPUUtilizationPercentage": 12}),
        );
        let cells = (HPA_PRINTER.cells)(&v1, Utc::now());
        assert_eq!(cells[2], "cpu: 12%/80%");
        assert_eq!(cells[3], "<unset>");
    }

    #[test]
    fn several_metrics_show_two_and_count_the_rest() {
        let obj = hpa(
            json!({"metrics": [
                {"type": "Resource", "resource": {"name": "memory", "target": {"type": "AverageValue", "averageValue": "500Mi"}}},
                {"type": "Pods", "pods": {"metric": {"name": "qps"}, "target": {"type": "AverageValue", "averageValue": "10"}}},
                {"type": "External", "external": {"metric": {"name": "queue"}, "target": {"type": "Value", "value": "30"}}}
            ]}),
            json!({"currentMetrics": [
                {"type": "Resource", "resource": {"name": "memory", "current": {"averageValue": "200Mi"}}},
                {"type": "Pods", "pods": {"metric": {"name": "qps"}, "current": {"averageValue": "7"}}}
            ]}),
        );
        assert_eq!(targets(&obj), "memory: 200Mi/500Mi, 7/10 + 1 more...");
        assert_eq!(targets(&hpa(json!({}), json!({}))), "<none>");
    }
}
