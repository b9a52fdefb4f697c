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

use crate::registry::Registry;
use crate::watchcache::Filter;

const INGRESS_DEFAULT: &[&str] = &["ingressclass.kubernetes.io/is-default-class"];
const STORAGE_DEFAULT: &[&str] = &[
    "storageclass.kubernetes.io/is-default-class",
    "storageclass.beta.kubernetes.io/is-default-class",
];

/// The registry's create hook.
pub async fn admit_create(reg: &Registry, res: &ResourceInfo, obj: &mut Value) -> ApiResult<()> {
    let annotation = |o: &Value, key: &str| {
        o.pointer("/metadata/annotations")
            .and_then(|a| a.get(key))
            .is_some()
    };
    let (classes, marks, field) = match (res.group, res.kind) {
        ("networking.k8s.io", "Ingress") => {
            if obj.pointer("/spec/ingressClassName").is_some()
                || annotation(obj, "kubernetes.io/ingress.class")
            {
                return Ok(());
            }
            ("ingressclasses", INGRESS_DEFAULT, "ingressClassName")
        }
        ("", "PersistentVolumeClaim") => {
            if obj.pointer("/spec/storageClassName").is_some()
                || annotation(obj, "volume.beta.kubernetes.io/storage-class")
            {
                return Ok(());
            }
            ("storageclasses", STORAGE_DEFAULT, "storageClassName")
        }
        _ => return Ok(()),
    };
    let group = if classes == "ingressclasses" {
        "networking.k8s.io"
    } else {
        "storage.k8s.io"
    };
    let class_res = resources::lookup(group, "v1", classes).expect("class resource is served");
    let list = reg
        .list(class_res, &Filter::default(), 0, None, None, false)
        .await?;
    let classes: Vec<Value> = list
        .items
        .iter()
        .filter_map(|b| serde_json::from_slice(b).ok())
        .collect();
    let Some(name) = newest_default(&classes, marks) else {
        return Ok(());
    };
    if let Some(m) = obj.as_object_mut() {
        let spec = m.entry("spec").or_insert_with(|| json!({}));
        if let Some(spec) = spec.as_object_mut() {
            spec.insert(field.into(), json!(name));
        }
    }
    Ok(())
}

/// The name of the newest class marked default by any of `marks`.
fn newest_default(classes: &[Value], marks: &[&str]) -> Option<String> {
    let mut defaults: Vec<(&str, &str)> = classes
        .iter()
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
        assert_eq!(newest_default(&all, STORAGE_DEFAULT).as_deref(), Some("a"));
        assert_eq!(newest_default(&all[3..], STORAGE_DEFAULT), None);
    }
}
