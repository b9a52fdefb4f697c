//! Kubernetes' DefaultIngressClass and DefaultStorageClass admission
//! plugins: a new Ingress that names no class gets the IngressClass marked
//! `ingressclass.kubernetes.io/is-default-class: "true"`, and a new
//! PersistentVolumeClaim that asks for no class (neither
//! `spec.storageClassName`, not even `""`, nor the beta annotation) gets
//! the StorageClass marked `storageclass.kubernetes.io/is-default-class`.
//! With several defaults the newest wins (then the first name), as
//! Kubernetes chooses since 1.28.

use serde_json::{json, Value};
use skiff_core::resources::{self, ResourceInfo};
use skiff_core::ApiResult;

use crate::admission::context::AdmissionCtx;
use crate::admission::plugin::{AdmissionPlugin, Attributes, Operation};

/// One of the two plugins: `classes` is the plural of the class resource
/// it defaults from.
pub struct DefaultClass {
    name: &'static str,
    classes: &'static str,
}

/// DefaultStorageClass (PersistentVolumeClaims).
pub static DEFAULT_STORAGE_CLASS: DefaultClass = DefaultClass {
    name: "DefaultStorageClass",
    classes: "storageclasses",
};

/// DefaultIngressClass (Ingresses).
pub static DEFAULT_INGRESS_CLASS: DefaultClass = DefaultClass {
    name: "DefaultIngressClass",
    classes: "ingressclasses",
};

#[async_trait::async_trait]
impl AdmissionPlugin for DefaultClass {
    fn name(&self) -> &'static str {
        self.name
    }

    fn handles(&self, a: &Attributes<'_>) -> bool {
        a.op == Operation::Create
            && a.res
                .rules
                .default_class()
                .is_some_and(|dc| dc.classes.2 == self.classes)
    }

    async fn mutate(
        &self,
        cx: &dyn AdmissionCtx,
        a: &Attributes<'_>,
        obj: &mut Value,
    ) -> ApiResult<()> {
        admit_create(cx, a.res, obj).await
    }
}

async fn admit_create(cx: &dyn AdmissionCtx, res: &ResourceInfo, obj: &mut Value) -> ApiResult<()> {
    let Some(dc) = res.rules.default_class() else {
        return Ok(());
    };
    let chosen = obj
        .pointer("/metadata/annotations")
        .and_then(|a| a.get(dc.chosen_by))
        .is_some();
    if chosen || obj.get("spec").and_then(|s| s.get(dc.field)).is_some() {
        return Ok(());
    }
    let (group, version, plural) = dc.classes;
    let class_res = resources::lookup(group, version, plural).expect("class resource is served");
    let classes = cx.consistent_list(class_res, None, false).await?;
    let Some(name) = newest_default(&classes, dc.marks) else {
        return Ok(());
    };
    if let Some(m) = obj.as_object_mut() {
        let spec = m.entry("spec").or_insert_with(|| json!({}));
        if let Some(spec) = spec.as_object_mut() {
            spec.insert(dc.field.into(), json!(name));
        }
    }
    Ok(())
}

/// The name of the newest class marked default by any of `marks`.
fn newest_default(classes: &[impl std::borrow::Borrow<Value>], marks: &[&str]) -> Option<String> {
    let mut defaults: Vec<(&str, &str)> = classes
        .iter()
        .map(std::borrow::Borrow::<Value>::borrow)
        .filter(|c| {
            marks.iter().any(|m| {
                c.pointer("/metadata/annotations")
                    .and_then(|a| a.get(*m))
                    .and_then(Value::as_str)
                    == Some("true")
            })
        })
        .map(|c| {
            let meta = |f: &str| {
                c.pointer(&format!("/metadata/{f}"))
                    .and_then(Value::as_str)
                    .unwrap_or("")
            };
            (meta("creationTimestamp"), meta("name"))
        })
        .collect();
    // RFC 3339 timestamps of one format sort as they are.
    defaults.sort_by(|a, b| b.0.cmp(a.0).then(a.1.cmp(b.1)));
    defaults.first().map(|(_, n)| n.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_newest_default_wins_then_the_first_name() {
        let class = |name: &str, at: &str, default: bool| {
            json!({"metadata": {"name": name, "creationTimestamp": at,
                "annotations": {"storageclass.kubernetes.io/is-default-class": if default { "true" } else { "false" }}}})
        };
        let all = [
            class("old", "2026-01-01T00:00:00Z", true),
            class("b", "2026-02-01T00:00:00Z", true),
            class("a", "2026-02-01T00:00:00Z", true),
            class("newest-but-not-default", "2026-03-01T00:00:00Z", false),
        ];
        let marks = &["storageclass.kubernetes.io/is-default-class"];
        assert_eq!(newest_default(&all, marks).as_deref(), Some("a"));
        assert_eq!(newest_default(&all[3..], marks), None);
    }
}
