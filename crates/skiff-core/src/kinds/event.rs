//! Events of both APIs (`v1` and `events.k8s.io/v1`): created by a PUT as
//! well, their field selectors and the `v1` table.

use super::prelude::*;

/// The core `v1` Event.
pub struct CoreEvent;

impl KindRules for CoreEvent {
    fn kind(&self) -> &'static str {
        "Event"
    }

    fn allow_create_on_update(&self) -> bool {
        true
    }

    fn selectable_fields(&self) -> &'static [&'static str] {
        &[
            "involvedObject.kind",
            "involvedObject.namespace",
            "involvedObject.name",
            "involvedObject.uid",
            "involvedObject.apiVersion",
            "involvedObject.resourceVersion",
            "involvedObject.fieldPath",
            "reason",
            "reportingComponent",
            "source",
            "type",
        ]
    }

    /// `source` selects on `source.component`.
    fn field_value(&self, obj: &Value, field: &str) -> Option<String> {
        (field == "source")
            .then(|| crate::fields::scalar(obj.pointer("/source/component")).unwrap_or_default())
    }

    fn printer(&self) -> &'static Printer {
        &EVENT_PRINTER
    }
}

/// The `events.k8s.io/v1` Event (the same objects, another shape).
pub struct EventsEvent;

impl KindRules for EventsEvent {
    fn kind(&self) -> &'static str {
        "Event"
    }

    fn allow_create_on_update(&self) -> bool {
        true
    }

    fn selectable_fields(&self) -> &'static [&'static str] {
        &[
            "regarding.kind",
            "regarding.namespace",
            "regarding.name",
            "reason",
            "type",
        ]
    }

    fn printer(&self) -> &'static Printer {
        &EVENTS_EVENT_PRINTER
    }
}

pub static EVENT_PRINTER: Printer = Printer {
    columns: &[
        col("Last Seen", "string", 0),
        col("Type", "string", 0),
        col("Reason", "string", 0),
        col("Object", "string", 0),
        col("Subobject", "string", 1),
        col("Source", "string", 1),
        col("Message", "string", 0),
        col("First Seen", "string", 1),
        col("Count", "string", 1),
        col("Name", "string", 1),
    ],
    cells: event_cells,
};

/// The `events.k8s.io/v1` table: the same as the core one (Kubernetes
/// prints both from the one internal Event).
pub static EVENTS_EVENT_PRINTER: Printer = Printer {
    columns: EVENT_PRINTER.columns,
    cells: |obj, now| {
        let mut core = obj.clone();
        crate::convert::event_to_core(&mut core);
        event_cells(&core, now)
    },
};

fn event_cells(obj: &Value, now: DateTime<Utc>) -> Vec<Value> {
    let since = |p: &str| {
        obj.pointer(p)
            .and_then(Value::as_str)
            .filter(|t| !t.is_empty())
            .map(|_| age(obj, p, now))
    };
    let unknown = || "<unknown>".to_string();
    let first = since("/firstTimestamp")
        .or_else(|| since("/eventTime"))
        .unwrap_or_else(unknown);
    let mut last = since("/lastTimestamp").unwrap_or_else(|| first.clone());
    let mut count = i(obj, "/count");
    if obj.get("series").is_some_and(Value::is_object) {
        last = since("/series/lastObservedTime").unwrap_or_else(unknown);
        count = i(obj, "/series/count");
    } else if count == 0 {
        // Singleton events of the new API carry no count.
        count = 1;
    }
    let kind = s(obj, "/involvedObject/kind").to_lowercase();
    let name = s(obj, "/involvedObject/name");
    let object = if name.is_empty() {
        kind
    } else {
        format!("{kind}/{name}")
    };
    let first_of = |a: &str, b: &str| {
        let a = s(obj, a);
        if a.is_empty() {
            s(obj, b).to_string()
        } else {
            a.to_string()
        }
    };
    let component = first_of("/source/component", "/reportingComponent");
    let host = first_of("/source/host", "/reportingInstance");
    let source = if host.is_empty() {
        component
    } else {
        format!("{component}, {host}")
    };
    vec![
        json!(last),
        json!(s(obj, "/type")),
        json!(s(obj, "/reason")),
        json!(object),
        json!(s(obj, "/involvedObject/fieldPath")),
        json!(source),
        json!(s(obj, "/message").trim()),
        json!(first),
        json!(count),
        json!(s(obj, "/metadata/name")),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_apis_print_an_event_the_same_way() {
        let now = Utc::now();
        let t = (now - chrono::Duration::seconds(90))
            .to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
        let core = json!({"metadata": {"name": "web.1"}, "type": "Normal", "reason": "Scheduled",
            "involvedObject": {"kind": "Pod", "name": "web", "fieldPath": "spec.containers{c}"},
            "source": {"component": "default-scheduler"}, "message": "placed ",
            "firstTimestamp": t, "lastTimestamp": t, "count": 2});
        let cells = event_cells(&core, now);
        assert_eq!(
            cells,
            [
                json!("90s"),
                json!("Normal"),
                json!("Scheduled"),
                json!("pod/web"),
                json!("spec.containers{c}"),
                json!("default-scheduler"),
                json!("placed"),
                json!("90s"),
                json!(2),
                json!("web.1")
            ]
        );
        let new = json!({"metadata": {"name": "web.2"}, "type": "Warning", "reason": "BackOff",
            "regarding": {"kind": "Pod", "name": "web"}, "note": "restarting",
            "reportingController": "kubelet", "reportingInstance": "node-1", "eventTime": t,
            "series": {"count": 5, "lastObservedTime": t}});
        let cells = (EVENTS_EVENT_PRINTER.cells)(&new, now);
        assert_eq!(cells[5], "kubelet, node-1");
        assert_eq!(cells[6], "restarting");
        assert_eq!(
            (cells[0].clone(), cells[8].clone()),
            (json!("90s"), json!(5))
        );
        let bare = json!({"metadata": {"name": "x"}, "involvedObject": {"kind": "Node"}});
        let cells = event_cells(&bare, now);
        assert_eq!(
            (cells[0].clone(), cells[3].clone(), cells[8].clone()),
            (json!("<unknown>"), json!("node"), json!(1))
        );
    }
}
