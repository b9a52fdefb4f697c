//! The workload kinds: PodTemplate, ReplicationController, Deployment,
//! ReplicaSet, StatefulSet and DaemonSet. Defaults (replicas, strategies,
//! the pod template), selector and template checks, the immutable apps
//! selector, tables and initial status.

use super::prelude::*;
use crate::selector::LabelSelector;
use crate::validation::{replicas, template};

fn default_template(obj: &mut Value) {
    crate::defaults::template(obj.pointer_mut("/spec/template"));
}

fn default_replicas(obj_v: &mut Value) {
    if let Some(spec) = child(obj_v, "spec") {
        set_default(spec, "replicas", json!(1));
    }
}

/// The checks of the `apps` workloads: replicas (not for DaemonSets), a
/// non-empty selector matching the template, the claim templates' volumes.
fn validate_apps(obj: &Value, has_replicas: bool) -> Vec<Cause> {
    let mut c = Vec::new();
    if has_replicas {
        replicas(obj, &mut c);
    }
    let sel = obj.pointer("/spec/selector");
    let ls = match sel {
        None | Some(Value::Null) => {
            c.push(Cause::required("spec.selector"));
            None
        }
        Some(s) => match LabelSelector::from_label_selector_json(s) {
            Ok(ls) if ls.is_empty() => {
                c.push(Cause::invalid(
                    "spec.selector",
                    s,
                    "empty selector is invalid for deployment",
                ));
                None
            }
            Ok(ls) => Some(ls),
            Err(e) => {
                c.push(Cause::invalid("spec.selector", s, &e));
                None
            }
        },
    };
    let claims: Vec<String> = obj
        .pointer("/spec/volumeClaimTemplates")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|t| t.pointer("/metadata/name").and_then(Value::as_str))
        .map(str::to_string)
        .collect();
    template(
        obj.pointer("/spec/template"),
        "spec.template",
        ls.as_ref(),
        &claims,
        &mut c,
    );
    c
}

/// An `apps` workload's selector is immutable.
fn selector_immutable(new: &Value, old: &Value) -> Vec<Cause> {
    if new.pointer("/spec/selector") != old.pointer("/spec/selector") {
        return vec![Cause::invalid(
            "spec.selector",
            new.pointer("/spec/selector").unwrap_or(&Value::Null),
            "field is immutable",
        )];
    }
    Vec::new()
}

pub struct PodTemplate;

impl KindRules for PodTemplate {
    fn kind(&self) -> &'static str {
        "PodTemplate"
    }

    fn defaults(&self, obj: &mut Value) {
        crate::defaults::template(obj.get_mut("template"));
    }

    fn validate(&self, obj: &Value) -> Vec<Cause> {
        let mut c = Vec::new();
        template(obj.get("template"), "template", None, &[], &mut c);
        c
    }

    fn returns_deleted_object(&self) -> bool {
        true
    }

    fn printer(&self) -> &'static Printer {
        &POD_TEMPLATE_PRINTER
    }
}

pub static POD_TEMPLATE_PRINTER: Printer = Printer {
    columns: &[
        NAME,
        col("Containers", "string", 0),
        col("Images", "string", 0),
        col("Pod Labels", "string", 0),
    ],
    cells: |obj, _now| {
        let (containers, images) = containers_images(obj, "/template/spec");
        vec![
            json!(s(obj, "/metadata/name")),
            json!(containers),
            json!(images),
            json!(or_none(&crate::selector::selector_string(
                obj.pointer("/template/metadata/labels")
            ))),
        ]
    },
};

pub struct ControllerRevision;

impl KindRules for ControllerRevision {
    fn kind(&self) -> &'static str {
        "ControllerRevision"
    }

    fn tracks_generation(&self) -> bool {
        true
    }

    fn printer(&self) -> &'static Printer {
        &CONTROLLER_REVISION_PRINTER
    }
}

/// The controller as `kind.group/name` (lower-case kind), the revision.
pub static CONTROLLER_REVISION_PRINTER: Printer = Printer {
    columns: &[
        NAME,
        col("Controller", "string", 0),
        col("Revision", "string", 0),
        AGE,
    ],
    cells: |obj, now| {
        let controller = obj
            .pointer("/metadata/ownerReferences")
            .and_then(Value::as_array)
            .and_then(|refs| {
                refs.iter()
                    .find(|r| r.get("controller").and_then(Value::as_bool) == Some(true))
            })
            .map(|r| {
                let kind = s(r, "/kind").to_lowercase();
                let group = s(r, "/apiVersion")
                    .rsplit_once('/')
                    .map(|(g, _)| g)
                    .unwrap_or("");
                let name = s(r, "/name");
                match (kind.is_empty(), group.is_empty()) {
                    (true, _) => name.to_string(),
                    (false, true) => format!("{kind}/{name}"),
                    (false, false) => format!("{kind}.{group}/{name}"),
                }
            })
            .unwrap_or_else(|| "<none>".into());
        vec![
            json!(s(obj, "/metadata/name")),
            json!(controller),
            json!(i(obj, "/revision")),
            json!(age(obj, "/metadata/creationTimestamp", now)),
        ]
    },
};

pub struct ReplicationController;

impl KindRules for ReplicationController {
    fn kind(&self) -> &'static str {
        "ReplicationController"
    }

    fn defaults(&self, obj: &mut Value) {
        default_replicas(obj);
        default_template(obj);
    }

    fn initial_status(&self) -> Option<Value> {
        Some(json!({"replicas": 0}))
    }

    fn validate(&self, obj: &Value) -> Vec<Cause> {
        let mut c = Vec::new();
        replicas(obj, &mut c);
        let sel = obj.pointer("/spec/selector").cloned();
        let ls = sel
            .as_ref()
            .and_then(|s| LabelSelector::from_label_selector_json(&json!({"matchLabels": s})).ok());
        template(
            obj.pointer("/spec/template"),
            "spec.template",
            ls.as_ref(),
            &[],
            &mut c,
        );
        c
    }

    fn selectable_fields(&self) -> &'static [&'static str] {
        &["status.replicas"]
    }

    fn printer(&self) -> &'static Printer {
        &REPLICA_SET_PRINTER
    }

    fn quota_usage(&self, _obj: &Value) -> Option<BTreeMap<String, i128>> {
        one("replicationcontrollers")
    }

    fn quota_tracks(&self, resource: &str) -> bool {
        resource == "replicationcontrollers"
    }

    fn tracks_generation(&self) -> bool {
        true
    }

    fn orphans_by_default(&self) -> bool {
        true
    }
}

pub struct Deployment;

impl KindRules for Deployment {
    fn kind(&self) -> &'static str {
        "Deployment"
    }

    fn defaults(&self, obj_v: &mut Value) {
        if let Some(spec) = child(obj_v, "spec") {
            set_default(spec, "replicas", json!(1));
            set_default(spec, "revisionHistoryLimit", json!(10));
            set_default(spec, "progressDeadlineSeconds", json!(600));
            let strategy = spec.entry("strategy").or_insert_with(|| json!({}));
            if let Some(s) = strategy.as_object_mut() {
                set_default(s, "type", json!("RollingUpdate"));
                if s.get("type") == Some(&json!("RollingUpdate")) {
                    let ru = s.entry("rollingUpdate").or_insert_with(|| json!({}));
                    if let Some(ru) = ru.as_object_mut() {
                        set_default(ru, "maxUnavailable", json!("25%"));
                        set_default(ru, "maxSurge", json!("25%"));
                    }
                }
            }
        }
        default_template(obj_v);
    }

    fn initial_status(&self) -> Option<Value> {
        Some(json!({}))
    }

    fn validate(&self, obj: &Value) -> Vec<Cause> {
        validate_apps(obj, true)
    }

    fn validate_update(&self, new: &Value, old: &Value) -> Vec<Cause> {
        selector_immutable(new, old)
    }

    fn printer(&self) -> &'static Printer {
        &DEPLOYMENT_PRINTER
    }

    fn tracks_generation(&self) -> bool {
        true
    }
}

pub struct ReplicaSet;

impl KindRules for ReplicaSet {
    fn kind(&self) -> &'static str {
        "ReplicaSet"
    }

    fn defaults(&self, obj: &mut Value) {
        default_replicas(obj);
        default_template(obj);
    }

    fn initial_status(&self) -> Option<Value> {
        Some(json!({"replicas": 0}))
    }

    fn validate(&self, obj: &Value) -> Vec<Cause> {
        validate_apps(obj, true)
    }

    fn validate_update(&self, new: &Value, old: &Value) -> Vec<Cause> {
        selector_immutable(new, old)
    }

    fn selectable_fields(&self) -> &'static [&'static str] {
        &["status.replicas"]
    }

    fn printer(&self) -> &'static Printer {
        &REPLICA_SET_PRINTER
    }

    fn tracks_generation(&self) -> bool {
        true
    }
}

pub struct StatefulSet;

impl KindRules for StatefulSet {
    fn kind(&self) -> &'static str {
        "StatefulSet"
    }

    fn defaults(&self, obj_v: &mut Value) {
        if let Some(spec) = child(obj_v, "spec") {
            set_default(spec, "replicas", json!(1));
            set_default(spec, "podManagementPolicy", json!("OrderedReady"));
            set_default(spec, "revisionHistoryLimit", json!(10));
            set_default(
                spec,
                "updateStrategy",
                json!({"type": "RollingUpdate", "rollingUpdate": {"partition": 0}}),
            );
            set_default(
                spec,
                "persistentVolumeClaimRetentionPolicy",
                json!({"whenDeleted": "Retain", "whenScaled": "Retain"}),
            );
        }
        default_template(obj_v);
    }

    fn initial_status(&self) -> Option<Value> {
        Some(json!({"replicas": 0, "availableReplicas": 0}))
    }

    fn validate(&self, obj: &Value) -> Vec<Cause> {
        validate_apps(obj, true)
    }

    fn validate_update(&self, new: &Value, old: &Value) -> Vec<Cause> {
        selector_immutable(new, old)
    }

    fn printer(&self) -> &'static Printer {
        &STATEFUL_SET_PRINTER
    }

    fn tracks_generation(&self) -> bool {
        true
    }
}

pub struct DaemonSet;

impl KindRules for DaemonSet {
    fn kind(&self) -> &'static str {
        "DaemonSet"
    }

    fn defaults(&self, obj_v: &mut Value) {
        if let Some(spec) = child(obj_v, "spec") {
            set_default(spec, "revisionHistoryLimit", json!(10));
            set_default(
                spec,
                "updateStrategy",
                json!({"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 1, "maxSurge": 0}}),
            );
        }
        default_template(obj_v);
    }

    fn initial_status(&self) -> Option<Value> {
        Some(json!({
            "currentNumberScheduled": 0,
            "numberMisscheduled": 0,
            "desiredNumberScheduled": 0,
            "numberReady": 0,
        }))
    }

    fn validate(&self, obj: &Value) -> Vec<Cause> {
        validate_apps(obj, false)
    }

    fn validate_update(&self, new: &Value, old: &Value) -> Vec<Cause> {
        selector_immutable(new, old)
    }

    fn printer(&self) -> &'static Printer {
        &DAEMON_SET_PRINTER
    }

    fn tracks_generation(&self) -> bool {
        true
    }
}

pub static DEPLOYMENT_PRINTER: Printer = Printer {
    columns: &[
        NAME,
        col("Ready", "string", 0),
        col("Up-to-date", "integer", 0),
        col("Available", "integer", 0),
        AGE,
        col("Containers", "string", 1),
        col("Images", "string", 1),
        col("Selector", "string", 1),
    ],
    cells: deployment_cells,
};

fn deployment_cells(obj: &Value, now: DateTime<Utc>) -> Vec<Value> {
    let name = json!(s(obj, "/metadata/name"));
    let created = json!(age(obj, "/metadata/creationTimestamp", now));
    let (c, im) = containers_images(obj, "/spec/template/spec");
    vec![
        name,
        json!(format!(
            "{}/{}",
            i(obj, "/status/readyReplicas"),
            i(obj, "/spec/replicas")
        )),
        json!(i(obj, "/status/updatedReplicas")),
        json!(i(obj, "/status/availableReplicas")),
        created,
        json!(c),
        json!(im),
        json!(selector(obj)),
    ]
}

pub static REPLICA_SET_PRINTER: Printer = Printer {
    columns: &[
        NAME,
        col("Desired", "integer", 0),
        col("Current", "integer", 0),
        col("Ready", "integer", 0),
        AGE,
        col("Containers", "string", 1),
        col("Images", "string", 1),
        col("Selector", "string", 1),
    ],
    cells: replica_set_cells,
};

fn replica_set_cells(obj: &Value, now: DateTime<Utc>) -> Vec<Value> {
    let name = json!(s(obj, "/metadata/name"));
    let created = json!(age(obj, "/metadata/creationTimestamp", now));
    let (c, im) = containers_images(obj, "/spec/template/spec");
    vec![
        name,
        json!(i(obj, "/spec/replicas")),
        json!(i(obj, "/status/replicas")),
        json!(i(obj, "/status/readyReplicas")),
        created,
        json!(c),
        json!(im),
        json!(selector(obj)),
    ]
}

pub static STATEFUL_SET_PRINTER: Printer = Printer {
    columns: &[
        NAME,
        col("Ready", "string", 0),
        AGE,
        col("Containers", "string", 1),
        col("Images", "string", 1),
    ],
    cells: stateful_set_cells,
};

fn stateful_set_cells(obj: &Value, now: DateTime<Utc>) -> Vec<Value> {
    let name = json!(s(obj, "/metadata/name"));
    let created = json!(age(obj, "/metadata/creationTimestamp", now));
    let (c, im) = containers_images(obj, "/spec/template/spec");
    vec![
        name,
        json!(format!(
            "{}/{}",
            i(obj, "/status/readyReplicas"),
            i(obj, "/spec/replicas")
        )),
        created,
        json!(c),
        json!(im),
    ]
}

pub static DAEMON_SET_PRINTER: Printer = Printer {
    columns: &[
        NAME,
        col("Desired", "integer", 0),
        col("Current", "integer", 0),
        col("Ready", "integer", 0),
        col("Up-to-date", "integer", 0),
        col("Available", "integer", 0),
        col("Node Selector", "string", 0),
        AGE,
        col("Containers", "string", 1),
        col("Images", "string", 1),
        col("Selector", "string", 1),
    ],
    cells: daemon_set_cells,
};

fn daemon_set_cells(obj: &Value, now: DateTime<Utc>) -> Vec<Value> {
    let name = json!(s(obj, "/metadata/name"));
    let created = json!(age(obj, "/metadata/creationTimestamp", now));
    let (c, im) = containers_images(obj, "/spec/template/spec");
    let ns = obj
        .pointer("/spec/template/spec/nodeSelector")
        .and_then(Value::as_object)
        .map(|m| {
            m.iter()
                .map(|(k, v)| format!("{k}={}", v.as_str().unwrap_or("")))
                .collect::<Vec<_>>()
                .join(",")
        })
        .unwrap_or_default();
    vec![
        name,
        json!(i(obj, "/status/desiredNumberScheduled")),
        json!(i(obj, "/status/currentNumberScheduled")),
        json!(i(obj, "/status/numberReady")),
        json!(i(obj, "/status/updatedNumberScheduled")),
        json!(i(obj, "/status/numberAvailable")),
        json!(or_none(&ns)),
        created,
        json!(c),
        json!(im),
        json!(selector(obj)),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_deployment_shows_ready_over_desired() {
        let d = json!({"metadata": {"name": "d"}, "spec": {"replicas": 3}, "status": {"readyReplicas": 2}});
        assert_eq!((DEPLOYMENT_PRINTER.cells)(&d, Utc::now())[1], "2/3");
    }
}

#[cfg(test)]
mod printer_tests {
    use super::*;

    #[test]
    fn revisions_name_their_controller_and_templates_their_pods() {
        let cr = json!({"metadata": {"name": "web-5d4f", "ownerReferences": [
            {"apiVersion": "apps/v1", "kind": "StatefulSet", "name": "web", "controller": true}]}, "revision": 3});
        let cells = (CONTROLLER_REVISION_PRINTER.cells)(&cr, Utc::now());
        assert_eq!(cells[1..3], [json!("statefulset.apps/web"), json!(3)]);
        let orphan = json!({"metadata": {"name": "x"}, "revision": 1});
        assert_eq!(
            (CONTROLLER_REVISION_PRINTER.cells)(&orphan, Utc::now())[1],
            "<none>"
        );
        let pt = json!({"metadata": {"name": "t"}, "template": {"metadata": {"labels": {"b": "2", "a": "1"}},
            "spec": {"containers": [{"name": "c1", "image": "busybox"}, {"name": "c2", "image": "nginx"}]}}});
        let cells = (POD_TEMPLATE_PRINTER.cells)(&pt, Utc::now());
        assert_eq!(
            cells[1..4],
            [json!("c1,c2"), json!("busybox,nginx"), json!("a=1,b=2")]
        );
    }
}
