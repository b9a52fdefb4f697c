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
}

pub static EVENT_PRINTER: Printer = Printer {
    columns: &[
        col("Last Seen", "string", 0),
        col("Type", "string", 0),
        col("Reason", "string", 0),
        col("Object", "string", 0),
        col("Message", "string", 0),
    ],
    cells: event_cells,
};

fn event_cells(obj: &Value, now: DateTime<Utc>) -> Vec<Value> {
    let last = [
        "/lastTimestamp",
        "/eventTime",
        "/metadata/creationTimestamp",
    ]
    .iter()
    .find(|p| obj.pointer(p).and_then(Value::as_str).is_some())
    .map(|p| age(obj, p, now))
    .unwrap_or_else(|| "<unknown>".into());
    let object = format!(
        "{}/{}",
        s(obj, "/involvedObject/kind").to_lowercase(),
        s(obj, "/involvedObject/name")
    );
    vec![
        json!(last),
        json!(s(obj, "/type")),
        json!(s(obj, "/reason")),
        json!(object),
        json!(s(obj, "/message")),
    ]
}
