//! Everything pure skiff knows about one kind, in one place: defaults,
//! validation, selectable fields, the name rule, the table printer, quota
//! usage and the kind's flags. Each served resource names its rules in its
//! row of [`crate::resources::RESOURCES`]; the generic code (defaulting,
//! validation, printing, the registry) asks `res.rules` and never matches on
//! a kind's name. Adding a built-in kind is one module here and one row.
//!
//! Dependencies run one way: these modules use the helpers of `defaults`,
//! `validation`, `table` and `admission`; those never import `kinds`.

use std::collections::BTreeMap;

use serde_json::Value;

use crate::table::Printer;
use crate::Cause;

pub mod admissionregistration;
pub mod apiservice;
pub mod autoscaling;
pub mod batch;
pub mod certificates;
pub mod config;
pub mod crd;
pub mod custom;
pub mod event;
pub mod ingress;
pub mod ingress_class;
pub mod lease;
pub mod namespace;
pub mod network;
pub mod node;
pub mod plain;
pub mod pod;
pub mod policy;
pub mod rbac;
pub mod service;
pub mod storage;
pub mod workloads;

pub use plain::{Plain, PLAIN};

/// What the kind modules share.
mod prelude {
    pub(crate) use std::collections::BTreeMap;

    pub(crate) use chrono::{DateTime, Utc};
    pub(crate) use serde_json::{json, Value};

    pub(crate) use super::{one, KindRules, NameRule};
    pub(crate) use crate::defaults::{obj as child, set_default};
    pub(crate) use crate::table::{
        age, col, containers_images, human_duration, i, or_none, s, selector, Printer, AGE, NAME,
    };
    pub(crate) use crate::Cause;
}

/// A kind's class defaulting (DefaultIngressClass, DefaultStorageClass).
#[derive(Debug)]
pub struct DefaultClass {
    /// (group, version, plural) of the class resource.
    pub classes: (&'static str, &'static str, &'static str),
    /// Annotations marking a class the default (with the value `"true"`).
    pub marks: &'static [&'static str],
    /// The `spec` field naming the class.
    pub field: &'static str,
    /// The older annotation that, when present, already chose a class.
    pub chosen_by: &'static str,
}

/// How a kind's object names are checked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NameRule {
    /// A DNS-1123 subdomain (most kinds).
    Subdomain,
    /// A DNS-1123 label (Namespaces, Services: their names become DNS labels).
    Label,
    /// Any path segment name (RBAC kinds: `system:...` names with colons).
    PathSegment,
}

/// A kind's pure rules. Every method has a no-op or `false` default, so a
/// kind without special rules is an empty impl ([`Plain`]).
pub trait KindRules: Sync + Send + 'static {
    /// The kind these rules are written for (`Plain` for the generic ones);
    /// a test checks each table row is bound to its own kind's rules.
    fn kind(&self) -> &'static str;

    /// Kubernetes' defaults for the kind, idempotent and never overwriting
    /// a value that is set.
    fn defaults(&self, _obj: &mut Value) {}

    /// The zero status Go serializes for the kind before anything reports
    /// one (fields without `omitempty`); filled in on every write.
    fn initial_status(&self) -> Option<Value> {
        None
    }

    /// The kind's checks on create and update (metadata is checked generically).
    fn validate(&self, _obj: &Value) -> Vec<Cause> {
        Vec::new()
    }

    /// The kind's extra checks on create only (fields only a subresource
    /// may set later).
    fn validate_create(&self, _obj: &Value) -> Vec<Cause> {
        Vec::new()
    }

    /// The kind's extra checks on update (immutable fields).
    fn validate_update(&self, _new: &Value, _old: &Value) -> Vec<Cause> {
        Vec::new()
    }

    /// Fields (beyond `metadata.name` and `metadata.namespace`) field
    /// selectors may use.
    fn selectable_fields(&self) -> &'static [&'static str] {
        &[]
    }

    /// The value of one of [`Self::selectable_fields`] whose value is not
    /// simply the field at its path (`None`: read the path).
    fn field_value(&self, _obj: &Value, _field: &str) -> Option<String> {
        None
    }

    fn name_rule(&self) -> NameRule {
        NameRule::Subdomain
    }

    /// The columns `kubectl get` shows and each object's cells, together.
    fn printer(&self) -> &'static Printer {
        &crate::table::DEFAULT_PRINTER
    }

    /// What an object adds to a quota beyond `count/<resource>`, in
    /// milli-units; `None` when the object counts for nothing at all (a
    /// finished pod).
    fn quota_usage(&self, _obj: &Value) -> Option<BTreeMap<String, i128>> {
        Some(BTreeMap::new())
    }

    /// Whether a quota's `hard` resource (other than `count/<resource>`)
    /// limits this kind.
    fn quota_tracks(&self, _resource: &str) -> bool {
        false
    }

    /// The kind's own check when a quota tracks `tracked` (the pod
    /// evaluator: every container must state what is limited).
    fn quota_constraints(&self, _obj: &Value, _tracked: &[String]) -> Result<(), String> {
        Ok(())
    }

    /// Kubernetes' Default*Class admission for this kind: which class
    /// resource's default a new object that names none gets.
    fn default_class(&self) -> Option<&'static DefaultClass> {
        None
    }

    /// Whether `metadata.generation` moves with spec changes.
    fn tracks_generation(&self) -> bool {
        false
    }

    /// Whether a PUT may create (`AllowCreateOnUpdate`).
    fn allow_create_on_update(&self) -> bool {
        false
    }

    /// Whether a delete naming no propagation policy orphans dependents
    /// (`DefaultGarbageCollectionPolicy`).
    fn orphans_by_default(&self) -> bool {
        false
    }

    /// Whether a delete that removes the object at once answers with the
    /// deleted object (`ReturnDeletedObject`) rather than a `Success` Status.
    fn returns_deleted_object(&self) -> bool {
        false
    }

    /// A custom resource's rules (a kind a CustomResourceDefinition
    /// defines): its table, scale paths, deprecation and schema.
    fn custom(&self) -> Option<&custom::CustomRules> {
        None
    }
}

/// Inserts `(name, 1000)`: one object of a legacy quota name (`pods`).
pub(crate) fn one(name: &str) -> Option<BTreeMap<String, i128>> {
    Some(BTreeMap::from([(name.to_string(), 1000)]))
}

#[cfg(test)]
mod tests {
    use crate::resources::RESOURCES;

    #[test]
    fn every_served_resource_is_bound_to_its_own_kinds_rules_or_plain() {
        for r in RESOURCES {
            let k = r.rules.kind();
            assert!(
                k == r.kind || k == "Plain",
                "{}/{} is bound to the rules of {k}",
                r.group,
                r.kind
            );
        }
    }

    #[test]
    fn kinds_with_special_rules_are_not_left_plain() {
        for kind in [
            "Pod",
            "Service",
            "Namespace",
            "Node",
            "Secret",
            "ConfigMap",
            "Deployment",
            "ReplicaSet",
            "ReplicationController",
            "StatefulSet",
            "DaemonSet",
            "Job",
            "CronJob",
            "Event",
            "PersistentVolumeClaim",
        ] {
            for r in RESOURCES.iter().filter(|r| r.kind == kind) {
                assert_eq!(r.rules.kind(), kind, "{}/{} has no rules", r.group, kind);
            }
        }
    }

    #[test]
    fn every_printer_has_as_many_cells_as_columns() {
        let now = chrono::Utc::now();
        for r in RESOURCES {
            let p = r.rules.printer();
            let obj = serde_json::json!({"metadata": {"name": "x"}});
            assert_eq!((p.cells)(&obj, now).len(), p.columns.len(), "{}", r.kind);
        }
    }
}
