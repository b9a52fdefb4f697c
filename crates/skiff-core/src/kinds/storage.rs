//! PersistentVolumes, PersistentVolumeClaims and StorageClasses: defaults,
//! the claim's `spec.volumeName` field selector, the claim's table and quota.

use super::prelude::*;

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

    fn returns_deleted_object(&self) -> bool {
        true
    }
}

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
}

pub static PERSISTENT_VOLUME_CLAIM_PRINTER: Printer = Printer {
    columns: &[
        NAME,
        col("Status", "string", 0),
        col("Volume", "string", 0),
        col("Capacity", "string", 0),
        col("Access Modes", "string", 0),
        col("StorageClass", "string", 0),
        AGE,
    ],
    cells: persistent_volume_claim_cells,
};

fn persistent_volume_claim_cells(obj: &Value, now: DateTime<Utc>) -> Vec<Value> {
    let name = json!(s(obj, "/metadata/name"));
    let created = json!(age(obj, "/metadata/creationTimestamp", now));
    let modes: Vec<String> = obj
        .pointer("/status/accessModes")
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(Value::as_str)
                .map(|m| {
                    match m {
                        "ReadWriteOnce" => "RWO",
                        "ReadOnlyMany" => "ROX",
                        "ReadWriteMany" => "RWX",
                        "ReadWriteOncePod" => "RWOP",
                        o => o,
                    }
                    .to_string()
                })
                .collect()
        })
        .unwrap_or_default();
    vec![
        name,
        json!(s(obj, "/status/phase")),
        json!(s(obj, "/spec/volumeName")),
        json!(s(obj, "/status/capacity/storage")),
        json!(modes.join(",")),
        json!(or_none(s(obj, "/spec/storageClassName"))),
        created,
    ]
}
