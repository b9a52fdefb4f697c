//! RBAC's roles and bindings: names are path segments (`system:...`), and
//! their tables.

use super::prelude::*;

/// Role and ClusterRole.
pub struct Role(pub &'static str);

impl KindRules for Role {
    fn kind(&self) -> &'static str {
        self.0
    }

    fn name_rule(&self) -> NameRule {
        NameRule::PathSegment
    }

    fn printer(&self) -> &'static Printer {
        &ROLE_PRINTER
    }
}

/// RoleBinding and ClusterRoleBinding.
pub struct RoleBinding(pub &'static str);

impl KindRules for RoleBinding {
    fn kind(&self) -> &'static str {
        self.0
    }

    fn name_rule(&self) -> NameRule {
        NameRule::PathSegment
    }

    fn printer(&self) -> &'static Printer {
        &ROLE_BINDING_PRINTER
    }
}

pub static ROLE_PRINTER: Printer = Printer {
    columns: &[NAME, col("Created At", "date", 0)],
    cells: role_cells,
};

fn role_cells(obj: &Value, _now: DateTime<Utc>) -> Vec<Value> {
    let name = json!(s(obj, "/metadata/name"));
    vec![name, json!(s(obj, "/metadata/creationTimestamp"))]
}

pub static ROLE_BINDING_PRINTER: Printer = Printer {
    columns: &[NAME, col("Role", "string", 0), AGE],
    cells: role_binding_cells,
};

fn role_binding_cells(obj: &Value, now: DateTime<Utc>) -> Vec<Value> {
    let name = json!(s(obj, "/metadata/name"));
    let created = json!(age(obj, "/metadata/creationTimestamp", now));
    vec![
        name,
        json!(format!(
            "{}/{}",
            s(obj, "/roleRef/kind"),
            s(obj, "/roleRef/name")
        )),
        created,
    ]
}
