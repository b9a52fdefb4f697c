//! Leases: created by a PUT as well, and their holder in the table.

use super::prelude::*;

pub struct Lease;

impl KindRules for Lease {
    fn kind(&self) -> &'static str {
        "Lease"
    }

    fn allow_create_on_update(&self) -> bool {
        true
    }

    fn printer(&self) -> &'static Printer {
        &LEASE_PRINTER
    }
}

pub static LEASE_PRINTER: Printer = Printer {
    columns: &[NAME, col("Holder", "string", 0), AGE],
    cells: lease_cells,
};

fn lease_cells(obj: &Value, now: DateTime<Utc>) -> Vec<Value> {
    let name = json!(s(obj, "/metadata/name"));
    let created = json!(age(obj, "/metadata/creationTimestamp", now));
    vec![name, json!(s(obj, "/spec/holderIdentity")), created]
}
