//! Namespaces: the `kubernetes` finalizer and `Active` phase by default,
//! DNS-label names, the phase field selector and table. The server's hooks
//! (the name label, finalize, closed namespaces) are in `skiff-apiserver`.

use super::prelude::*;

pub struct Namespace;

impl KindRules for Namespace {
    fn kind(&self) -> &'static str {
        "Namespace"
    }

    fn defaults(&self, obj_v: &mut Value) {
        if let Some(spec) = child(obj_v, "spec") {
            set_default(spec, "finalizers", json!(["kubernetes"]));
        }
        if let Some(status) = child(obj_v, "status") {
            set_default(status, "phase", json!("Active"));
        }
    }

    fn selectable_fields(&self) -> &'static [&'static str] {
        &["status.phase"]
    }

    fn name_rule(&self) -> NameRule {
        NameRule::Label
    }

    fn printer(&self) -> &'static Printer {
        &NAMESPACE_PRINTER
    }
}

pub static NAMESPACE_PRINTER: Printer = Printer {
    columns: &[NAME, col("Status", "string", 0), AGE],
    cells: namespace_cells,
};

fn namespace_cells(obj: &Value, now: DateTime<Utc>) -> Vec<Value> {
    let name = json!(s(obj, "/metadata/name"));
    let created = json!(age(obj, "/metadata/creationTimestamp", now));
    vec![name, json!(s(obj, "/status/phase")), created]
}
