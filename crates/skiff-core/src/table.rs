//! Server-side printing for `kubectl get`: the columns Kubernetes' printers
//! show per kind, and each object's cells.

use chrono::{DateTime, Utc};
use serde_json::{json, Value};

/// One table column (`metav1.TableColumnDefinition`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Column {
    pub name: &'static str,
    pub type_: &'static str,
    pub format: &'static str,
    pub description: &'static str,
    /// 0 for default columns, 1 for `-o wide` ones.
    pub priority: i32,
}

pub(crate) const fn col(name: &'static str, type_: &'static str, priority: i32) -> Column {
    Column {
        name,
        type_,
        format: "",
        description: "",
        priority,
    }
}

pub(crate) const NAME: Column = Column {
    name: "Name",
    type_: "string",
    format: "name",
    description: "Name must be unique within a namespace.",
    priority: 0,
};
pub(crate) const AGE: Column = Column { name: "Age", type_: "string", format: "", description: "CreationTimestamp is a timestamp representing the server time when this object was created.", priority: 0 };

/// A kind's table: its columns and each object's cells, kept together as
/// Kubernetes' `TableHandler(columnDefinitions, printFunc)` keeps them.
pub struct Printer {
    pub columns: &'static [Column],
    pub cells: fn(&Value, DateTime<Utc>) -> Vec<Value>,
}

/// Name and age: the table of every kind without a printer of its own.
pub static DEFAULT_PRINTER: Printer = Printer {
    columns: &[NAME, AGE],
    cells: |obj, now| {
        vec![
            json!(s(obj, "/metadata/name")),
            json!(age(obj, "/metadata/creationTimestamp", now)),
        ]
    },
};

/// ComponentStatuses (`kubectl get cs`): Kubernetes' printer shows the
/// Healthy condition as Healthy/Unhealthy (Unknown without one), its
/// message and its error.
pub static COMPONENT_STATUS_PRINTER: Printer = Printer {
    columns: &[
        NAME,
        col("Status", "string", 0),
        col("Message", "string", 0),
        col("Error", "string", 0),
    ],
    cells: |obj, _| {
        let healthy = obj
            .get("conditions")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .find(|c| c.get("type").and_then(Value::as_str) == Some("Healthy"));
        let (status, message, error) = match healthy {
            Some(c) => (
                if c.get("status").and_then(Value::as_str) == Some("True") {
                    "Healthy"
                } else {
                    "Unhealthy"
                },
                c.get("message").and_then(Value::as_str).unwrap_or(""),
                c.get("error").and_then(Value::as_str).unwrap_or(""),
            ),
            None => ("Unknown", "", ""),
        };
        vec![
            json!(s(obj, "/metadata/name")),
            json!(status),
            json!(message),
            json!(error),
        ]
    },
};

/// The `autoscaling/v1` `Scale` of the scale subresource.
pub static SCALE_PRINTER: Printer = Printer {
    columns: &[
        NAME,
        col("Desired", "integer", 0),
        col("Available", "integer", 0),
        AGE,
    ],
    cells: |obj, now| {
        vec![
            json!(s(obj, "/metadata/name")),
            json!(i(obj, "/spec/replicas")),
            json!(i(obj, "/status/replicas")),
            json!(age(obj, "/metadata/creationTimestamp", now)),
        ]
    },
};

/// `[{name, type, format, description, priority}]`.
pub fn column_definitions_json(cols: &[Column]) -> Value {
    Value::Array(
        cols.iter()
            .map(|c| json!({"name": c.name, "type": c.type_, "format": c.format, "description": c.description, "priority": c.priority}))
            .collect(),
    )
}

/// Kubernetes' `duration.HumanDuration`.
pub fn human_duration(d: chrono::Duration) -> String {
    let s = d.num_seconds();
    if s < -1 {
        return "<invalid>".into();
    }
    let s = s.max(0);
    if s < 60 * 2 {
        return format!("{s}s");
    }
    let m = s / 60;
    if m < 10 {
        let rs = s % 60;
        return if rs == 0 {
            format!("{m}m")
        } else {
            format!("{m}m{rs}s")
        };
    }
    if m < 60 * 3 {
        return format!("{m}m");
    }
    let h = s / 3600;
    if h < 8 {
        let rm = m % 60;
        return if rm == 0 {
            format!("{h}h")
        } else {
            format!("{h}h{rm}m")
        };
    }
    if h < 48 {
        return format!("{h}h");
    }
    if h < 24 * 8 {
        let rh = h % 24;
        return if rh == 0 {
            format!("{}d", h / 24)
        } else {
            format!("{}d{rh}h", h / 24)
        };
    }
    if h < 24 * 365 * 2 {
        return format!("{}d", h / 24);
    }
    if h < 24 * 365 * 8 {
        let dy = (h / 24) % 365;
        return if dy == 0 {
            format!("{}y", h / 24 / 365)
        } else {
            format!("{}y{dy}d", h / 24 / 365)
        };
    }
    format!("{}y", h / 24 / 365)
}

pub(crate) fn age(obj: &Value, field: &str, now: DateTime<Utc>) -> String {
    match obj
        .pointer(field)
        .and_then(Value::as_str)
        .and_then(|t| DateTime::parse_from_rfc3339(t).ok())
    {
        Some(t) => human_duration(now - t.with_timezone(&Utc)),
        None => "<unknown>".into(),
    }
}

pub(crate) fn s<'a>(obj: &'a Value, ptr: &str) -> &'a str {
    obj.pointer(ptr).and_then(Value::as_str).unwrap_or("")
}

pub(crate) fn i(obj: &Value, ptr: &str) -> i64 {
    obj.pointer(ptr).and_then(Value::as_i64).unwrap_or(0)
}

pub(crate) fn or_none(v: &str) -> String {
    if v.is_empty() {
        "<none>".into()
    } else {
        v.to_string()
    }
}

pub(crate) fn containers_images(obj: &Value, spec_ptr: &str) -> (String, String) {
    let cs = obj
        .pointer(&format!("{spec_ptr}/containers"))
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let names: Vec<&str> = cs
        .iter()
        .filter_map(|c| c.get("name").and_then(Value::as_str))
        .collect();
    let images: Vec<&str> = cs
        .iter()
        .filter_map(|c| c.get("image").and_then(Value::as_str))
        .collect();
    (names.join(","), images.join(","))
}

pub(crate) fn selector(obj: &Value) -> String {
    or_none(&crate::selector::selector_string(
        obj.pointer("/spec/selector"),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ages_read_as_kubernetes_prints_them() {
        assert_eq!(human_duration(chrono::Duration::seconds(5)), "5s");
        assert_eq!(human_duration(chrono::Duration::seconds(182)), "3m2s");
        assert_eq!(human_duration(chrono::Duration::hours(51)), "2d3h");
    }
}
