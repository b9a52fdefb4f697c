//! PersistentVolumes, PersistentVolumeClaims and StorageClasses: defaults,
//! the claim's `spec.volumeName` field selector, the claim's table and quota.

use super::prelude::*;

/// The provisioner of skiff's built-in `local-path` StorageClass (the
/// controller manager makes the volumes, the node's agent their directories).
pub const LOCAL_PROVISIONER: &str = "skiff.io/local-path";
/// The Node annotation naming where that node keeps local volumes (set by
/// its agent, read by the provisioner).
pub const LOCAL_STORAGE_ANNOTATION: &str = "skiff.io/local-storage-path";
/// The Node annotation listing directories of deleted local volumes for
/// the node's agent to remove (comma-separated names; the provisioner
/// adds, the agent empties).
pub const LOCAL_RELEASED_ANNOTATION: &str = "skiff.io/local-volumes-released";

pub struct PersistentVolumeClaim;

impl KindRules for PersistentVolumeClaim {
    fn kind(&self) -> &'static str {
        "PersistentVolumeClaim"
    }

    fn defaults(&self, obj_v: &mut Value) {
        if let Some(spec) = child(obj_v, "spec") {
            set_default(spec, "volumeMode", json!("Filesystem"));
        }
        if let Some(status) = child(obj_v, "status") {
            set_default(status, "phase", json!("Pending"));
        }
    }

    fn selectable_fields(&self) -> &'static [&'static str] {
        &["spec.volumeName"]
    }

    fn printer(&self) -> &'static Printer {
        &PERSISTENT_VOLUME_CLAIM_PRINTER
    }

    fn quota_usage(&self, obj: &Value) -> Option<BTreeMap<String, i128>> {
        let mut u = BTreeMap::from([("persistentvolumeclaims".to_string(), 1000)]);
        if let Some(m) = obj
            .pointer("/spec/resources/requests/storage")
            .and_then(crate::admission::milli)
        {
            u.insert("requests.storage".into(), m);
        }
        Some(u)
    }

    fn quota_tracks(&self, resource: &str) -> bool {
        matches!(resource, "persistentvolumeclaims" | "requests.storage")
    }

    fn default_class(&self) -> Option<&'static super::DefaultClass> {
        Some(&DEFAULT_CLASS)
    }

    fn returns_deleted_object(&self) -> bool {
        true
    }
}

/// DefaultStorageClass: a claim that asks for no class (not even `""`).
static DEFAULT_CLASS: super::DefaultClass = super::DefaultClass {
    classes: ("storage.k8s.io", "v1", "storageclasses"),
    marks: &[
        "storageclass.kubernetes.io/is-default-class",
        "storageclass.beta.kubernetes.io/is-default-class",
    ],
    field: "storageClassName",
    chosen_by: "volume.beta.kubernetes.io/storage-class",
};

pub struct PersistentVolume;

impl KindRules for PersistentVolume {
    fn kind(&self) -> &'static str {
        "PersistentVolume"
    }

    fn defaults(&self, obj_v: &mut Value) {
        if let Some(spec) = child(obj_v, "spec") {
            set_default(spec, "volumeMode", json!("Filesystem"));
            set_default(spec, "persistentVolumeReclaimPolicy", json!("Retain"));
        }
        if let Some(status) = child(obj_v, "status") {
            set_default(status, "phase", json!("Pending"));
        }
    }

    fn returns_deleted_object(&self) -> bool {
        true
    }

    fn printer(&self) -> &'static Printer {
        &PERSISTENT_VOLUME_PRINTER
    }
}

pub struct StorageClass;

impl KindRules for StorageClass {
    fn kind(&self) -> &'static str {
        "StorageClass"
    }

    fn returns_deleted_object(&self) -> bool {
        true
    }

    fn printer(&self) -> &'static Printer {
        &STORAGE_CLASS_PRINTER
    }
}

/// `RWO,ROX,RWX,RWOP`: the modes present, always in this order.
fn access_modes(obj: &Value, ptr: &str) -> String {
    let modes: Vec<&str> = obj
        .pointer(ptr)
        .and_then(Value::as_array)
        .map(|a| a.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    [
        ("ReadWriteOnce", "RWO"),
        ("ReadOnlyMany", "ROX"),
        ("ReadWriteMany", "RWX"),
        ("ReadWriteOncePod", "RWOP"),
    ]
    .into_iter()
    .filter(|(m, _)| modes.contains(m))
    .map(|(_, short)| short)
    .collect::<Vec<_>>()
    .join(",")
}

/// The phase, or `Terminating` once deletion has begun.
fn phase(obj: &Value) -> &str {
    if obj.pointer("/metadata/deletionTimestamp").is_some() {
        "Terminating"
    } else {
        s(obj, "/status/phase")
    }
}

/// `spec.<field>`, or `<unset>`.
fn or_unset<'a>(obj: &'a Value, ptr: &str) -> &'a str {
    match s(obj, ptr) {
        "" => "<unset>",
        v => v,
    }
}

/// The class: the beta annotation first, as Kubernetes' helper reads it.
fn class(obj: &Value) -> &str {
    obj.pointer("/metadata/annotations/volume.beta.kubernetes.io~1storage-class")
        .and_then(Value::as_str)
        .unwrap_or_else(|| s(obj, "/spec/storageClassName"))
}

pub static PERSISTENT_VOLUME_PRINTER: Printer = Printer {
    columns: &[
        NAME,
        col("Capacity", "string", 0),
        col("Access Modes", "string", 0),
        col("Reclaim Policy", "string", 0),
        col("Status", "string", 0),
        col("Claim", "string", 0),
        col("StorageClass", "string", 0),
        col("VolumeAttributesClass", "string", 0),
        col("Reason", "string", 0),
        AGE,
        col("VolumeMode", "string", 1),
    ],
    cells: |obj, now| {
        let claim = match obj.pointer("/spec/claimRef") {
            Some(r) if r.is_object() => format!("{}/{}", s(r, "/namespace"), s(r, "/name")),
            _ => String::new(),
        };
        vec![
            json!(s(obj, "/metadata/name")),
            json!(s(obj, "/spec/capacity/storage")),
            json!(access_modes(obj, "/spec/accessModes")),
            json!(s(obj, "/spec/persistentVolumeReclaimPolicy")),
            json!(phase(obj)),
            json!(claim),
            json!(class(obj)),
            json!(or_unset(obj, "/spec/volumeAttributesClassName")),
            json!(s(obj, "/status/reason")),
            json!(age(obj, "/metadata/creationTimestamp", now)),
            json!(or_unset(obj, "/spec/volumeMode")),
        ]
    },
};

pub static STORAGE_CLASS_PRINTER: Printer = Printer {
    columns: &[
        NAME,
        col("Provisioner", "string", 0),
        col("ReclaimPolicy", "string", 0),
        col("VolumeBindingMode", "string", 0),
        col("AllowVolumeExpansion", "string", 0),
        AGE,
    ],
    cells: |obj, now| {
        let default = [
            "storageclass.kubernetes.io/is-default-class",
            "storageclass.beta.kubernetes.io/is-default-class",
        ]
        .iter()
        .any(|a| {
            obj.pointer("/metadata/annotations")
                .and_then(|m| m.get(*a))
                .and_then(Value::as_str)
                == Some("true")
        });
        let mut name = s(obj, "/metadata/name").to_string();
        if default {
            name.push_str(" (default)");
        }
        let or = |ptr: &str, d: &'static str| match s(obj, ptr) {
            "" => d.to_string(),
            v => v.to_string(),
        };
        vec![
            json!(name),
            json!(s(obj, "/provisioner")),
            json!(or("/reclaimPolicy", "Delete")),
            json!(or("/volumeBindingMode", "Immediate")),
            json!(obj
                .get("allowVolumeExpansion")
                .and_then(Value::as_bool)
                .unwrap_or(false)),
            json!(age(obj, "/metadata/creationTimestamp", now)),
        ]
    },
};

pub static PERSISTENT_VOLUME_CLAIM_PRINTER: Printer = Printer {
    columns: &[
        NAME,
        col("Status", "string", 0),
        col("Volume", "string", 0),
        col("Capacity", "string", 0),
        col("Access Modes", "string", 0),
        col("StorageClass", "string", 0),
        col("VolumeAttributesClass", "string", 0),
        AGE,
        col("VolumeMode", "string", 1),
    ],
    cells: persistent_volume_claim_cells,
};

fn persistent_volume_claim_cells(obj: &Value, now: DateTime<Utc>) -> Vec<Value> {
    // Capacity and modes only once the claim is bound to a volume.
    let bound = !s(obj, "/spec/volumeName").is_empty();
    let (capacity, modes) = if bound {
        (
            s(obj, "/status/capacity/storage").to_string(),
            access_modes(obj, "/status/accessModes"),
        )
    } else {
        (String::new(), String::new())
    };
    vec![
        json!(s(obj, "/metadata/name")),
        json!(phase(obj)),
        json!(s(obj, "/spec/volumeName")),
        json!(capacity),
        json!(modes),
        json!(or_none(class(obj))),
        json!(or_unset(obj, "/spec/volumeAttributesClassName")),
        json!(age(obj, "/metadata/creationTimestamp", now)),
        json!(or_unset(obj, "/spec/volumeMode")),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn volumes_and_classes_print_as_kubectl_shows_them() {
        let pv = json!({"metadata": {"name": "pv1"}, "spec": {"capacity": {"storage": "5Gi"},
            "accessModes": ["ReadWriteMany", "ReadWriteOnce"], "persistentVolumeReclaimPolicy": "Retain",
            "claimRef": {"namespace": "default", "name": "data"}, "storageClassName": "fast", "volumeMode": "Filesystem"},
            "status": {"phase": "Bound"}});
        let cells = (PERSISTENT_VOLUME_PRINTER.cells)(&pv, Utc::now());
        assert_eq!(
            cells[1..9],
            [
                json!("5Gi"),
                json!("RWO,RWX"),
                json!("Retain"),
                json!("Bound"),
                json!("default/data"),
                json!("fast"),
                json!("<unset>"),
                json!("")
            ]
        );
        assert_eq!(cells[10], "Filesystem");
        let sc = json!({"metadata": {"name": "local", "annotations": {"storageclass.kubernetes.io/is-default-class": "true"}},
            "provisioner": "rancher.io/local-path"});
        let cells = (STORAGE_CLASS_PRINTER.cells)(&sc, Utc::now());
        assert_eq!(
            cells[..5],
            [
                json!("local (default)"),
                json!("rancher.io/local-path"),
                json!("Delete"),
                json!("Immediate"),
                json!(false)
            ]
        );
        let pending = json!({"metadata": {"name": "data"}, "spec": {"volumeMode": "Filesystem"},
            "status": {"phase": "Pending", "capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"]}});
        let cells = (PERSISTENT_VOLUME_CLAIM_PRINTER.cells)(&pending, Utc::now());
        assert_eq!(
            cells[1..5],
            [json!("Pending"), json!(""), json!(""), json!("")],
            "no capacity before binding"
        );
    }
}
