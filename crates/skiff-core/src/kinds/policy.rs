//! Policy kinds: ResourceQuota, LimitRange, PodDisruptionBudget and
//! PriorityClass (defaults, initial status, tables, quota names).

use super::prelude::*;

pub struct ResourceQuota;

impl KindRules for ResourceQuota {
    fn kind(&self) -> &'static str {
        "ResourceQuota"
    }

    fn initial_status(&self) -> Option<Value> {
        Some(json!({}))
    }

    fn quota_usage(&self, _obj: &Value) -> Option<BTreeMap<String, i128>> {
        one("resourcequotas")
    }

    fn quota_tracks(&self, resource: &str) -> bool {
        resource == "resourcequotas"
    }

    fn returns_deleted_object(&self) -> bool {
        true
    }

    fn printer(&self) -> &'static Printer {
        &RESOURCE_QUOTA_PRINTER
    }
}

/// `resource: used/hard` for every resource of `status.hard`, sorted;
/// `limits.*` ones in the Limit column, the rest in Request.
pub static RESOURCE_QUOTA_PRINTER: Printer = Printer {
    columns: &[
        NAME,
        AGE,
        col("Request", "string", 0),
        col("Limit", "string", 0),
    ],
    cells: |obj, now| {
        let hard = obj
            .pointer("/status/hard")
            .and_then(Value::as_object)
            .cloned()
            .unwrap_or_default();
        let mut names: Vec<&String> = hard.keys().collect();
        names.sort();
        let (mut request, mut limit) = (Vec::new(), Vec::new());
        for name in names {
            let used = obj
                .pointer("/status/used")
                .and_then(|u| u.get(name.as_str()))
                .and_then(Value::as_str)
                .unwrap_or("0");
            let cell = format!("{name}: {used}/{}", hard[name].as_str().unwrap_or(""));
            if name.split('.').count() > 1 && name.starts_with("limits.") {
                limit.push(cell);
            } else {
                request.push(cell);
            }
        }
        vec![
            json!(s(obj, "/metadata/name")),
            json!(age(obj, "/metadata/creationTimestamp", now)),
            json!(request.join(", ")),
            json!(limit.join(", ")),
        ]
    },
};

pub struct LimitRange;

impl KindRules for LimitRange {
    fn kind(&self) -> &'static str {
        "LimitRange"
    }

    fn defaults(&self, obj_v: &mut Value) {
        if let Some(items) = obj_v
            .pointer_mut("/spec/limits")
            .and_then(Value::as_array_mut)
        {
            items
                .iter_mut()
                .for_each(crate::admission::limit_range_item_defaults);
        }
    }

    fn printer(&self) -> &'static Printer {
        &LIMIT_RANGE_PRINTER
    }
}

pub static LIMIT_RANGE_PRINTER: Printer = Printer {
    columns: &[NAME, col("Created At", "date", 0)],
    cells: |obj, _now| {
        vec![
            json!(s(obj, "/metadata/name")),
            json!(s(obj, "/metadata/creationTimestamp")),
        ]
    },
};

pub struct PodDisruptionBudget;

impl KindRules for PodDisruptionBudget {
    fn kind(&self) -> &'static str {
        "PodDisruptionBudget"
    }

    fn initial_status(&self) -> Option<Value> {
        Some(json!({
            "disruptionsAllowed": 0,
            "currentHealthy": 0,
            "desiredHealthy": 0,
            "expectedPods": 0,
        }))
    }

    fn tracks_generation(&self) -> bool {
        true
    }

    fn printer(&self) -> &'static Printer {
        &POD_DISRUPTION_BUDGET_PRINTER
    }
}

pub struct PriorityClass;

impl KindRules for PriorityClass {
    fn kind(&self) -> &'static str {
        "PriorityClass"
    }

    fn defaults(&self, obj: &mut Value) {
        if let Some(m) = obj.as_object_mut() {
            set_default(m, "preemptionPolicy", json!("PreemptLowerPriority"));
        }
    }

    fn printer(&self) -> &'static Printer {
        &PRIORITY_CLASS_PRINTER
    }
}

pub static POD_DISRUPTION_BUDGET_PRINTER: Printer = Printer {
    columns: &[
        NAME,
        col("Min Available", "string", 0),
        col("Max Unavailable", "string", 0),
        col("Allowed Disruptions", "integer", 0),
        AGE,
    ],
    cells: pod_disruption_budget_cells,
};

fn pod_disruption_budget_cells(obj: &Value, now: DateTime<Utc>) -> Vec<Value> {
    let name = json!(s(obj, "/metadata/name"));
    let created = json!(age(obj, "/metadata/creationTimestamp", now));
    let show = |p: &str| {
        obj.pointer(p)
            .map(|v| v.as_str().map(str::to_string).unwrap_or(v.to_string()))
            .unwrap_or_else(|| "N/A".into())
    };
    vec![
        name,
        json!(show("/spec/minAvailable")),
        json!(show("/spec/maxUnavailable")),
        json!(i(obj, "/status/disruptionsAllowed")),
        created,
    ]
}

pub static PRIORITY_CLASS_PRINTER: Printer = Printer {
    columns: &[
        NAME,
        col("Value", "integer", 0),
        col("Global-Default", "boolean", 0),
        AGE,
    ],
    cells: priority_class_cells,
};

fn priority_class_cells(obj: &Value, now: DateTime<Utc>) -> Vec<Value> {
    let name = json!(s(obj, "/metadata/name"));
    let created = json!(age(obj, "/metadata/creationTimestamp", now));
    vec![
        name,
        json!(i(obj, "/value")),
        json!(obj
            .get("globalDefault")
            .and_then(Value::as_bool)
            .unwrap_or(false)),
        created,
    ]
}

#[cfg(test)]
mod printer_tests {
    use super::*;

    #[test]
    fn a_quota_splits_requests_from_limits_in_name_order() {
        let rq = json!({"metadata": {"name": "q"}, "status": {
            "hard": {"pods": "10", "limits.cpu": "2", "requests.memory": "1Gi", "limits.memory": "2Gi"},
            "used": {"pods": "3", "limits.cpu": "500m"}}});
        let cells = (RESOURCE_QUOTA_PRINTER.cells)(&rq, Utc::now());
        assert_eq!(cells[2], "pods: 3/10, requests.memory: 0/1Gi");
        assert_eq!(cells[3], "limits.cpu: 500m/2, limits.memory: 0/2Gi");
    }
}
