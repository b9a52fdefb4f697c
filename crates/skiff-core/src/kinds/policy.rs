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
}

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
}

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
