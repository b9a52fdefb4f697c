//! ConfigMaps, Secrets and ServiceAccounts: data keys and size, a Secret's
//! type and `stringData`, the Secret `type` field selector, tables and the
//! legacy quota names.

use super::prelude::*;

pub struct ConfigMap;

impl KindRules for ConfigMap {
    fn kind(&self) -> &'static str {
        "ConfigMap"
    }

    fn validate(&self, obj: &Value) -> Vec<Cause> {
        let mut c = Vec::new();
        crate::validation::data_keys(obj, false, &mut c);
        c
    }

    fn printer(&self) -> &'static Printer {
        &CONFIG_MAP_PRINTER
    }

    fn quota_usage(&self, _obj: &Value) -> Option<BTreeMap<String, i128>> {
        one("configmaps")
    }

    fn quota_tracks(&self, resource: &str) -> bool {
        resource == "configmaps"
    }
}

pub struct Secret;

impl KindRules for Secret {
    fn kind(&self) -> &'static str {
        "Secret"
    }

    fn defaults(&self, obj: &mut Value) {
        if let Some(m) = obj.as_object_mut() {
            set_default(m, "type", json!("Opaque"));
            crate::defaults::string_data_into_data(m);
        }
    }

    fn validate(&self, obj: &Value) -> Vec<Cause> {
        let mut c = Vec::new();
        crate::validation::data_keys(obj, true, &mut c);
        c
    }

    fn selectable_fields(&self) -> &'static [&'static str] {
        &["type"]
    }

    fn printer(&self) -> &'static Printer {
        &SECRET_PRINTER
    }

    fn quota_usage(&self, _obj: &Value) -> Option<BTreeMap<String, i128>> {
        one("secrets")
    }

    fn quota_tracks(&self, resource: &str) -> bool {
        resource == "secrets"
    }
}

pub struct ServiceAccount;

impl KindRules for ServiceAccount {
    fn kind(&self) -> &'static str {
        "ServiceAccount"
    }

    fn printer(&self) -> &'static Printer {
        &SERVICE_ACCOUNT_PRINTER
    }

    fn returns_deleted_object(&self) -> bool {
        true
    }
}

pub static CONFIG_MAP_PRINTER: Printer = Printer {
    columns: &[NAME, col("Data", "integer", 0), AGE],
    cells: config_map_cells,
};

fn config_map_cells(obj: &Value, now: DateTime<Utc>) -> Vec<Value> {
    let name = json!(s(obj, "/metadata/name"));
    let created = json!(age(obj, "/metadata/creationTimestamp", now));
    let n = obj
        .get("data")
        .and_then(Value::as_object)
        .map(|m| m.len())
        .unwrap_or(0)
        + obj
            .get("binaryData")
            .and_then(Value::as_object)
            .map(|m| m.len())
            .unwrap_or(0);
    vec![name, json!(n), created]
}

pub static SECRET_PRINTER: Printer = Printer {
    columns: &[
        NAME,
        col("Type", "string", 0),
        col("Data", "integer", 0),
        AGE,
    ],
    cells: secret_cells,
};

fn secret_cells(obj: &Value, now: DateTime<Utc>) -> Vec<Value> {
    let name = json!(s(obj, "/metadata/name"));
    let created = json!(age(obj, "/metadata/creationTimestamp", now));
    let n = obj
        .get("data")
        .and_then(Value::as_object)
        .map(|m| m.len())
        .unwrap_or(0);
    vec![name, json!(s(obj, "/type")), json!(n), created]
}

pub static SERVICE_ACCOUNT_PRINTER: Printer = Printer {
    columns: &[NAME, col("Secrets", "integer", 0), AGE],
    cells: service_account_cells,
};

fn service_account_cells(obj: &Value, now: DateTime<Utc>) -> Vec<Value> {
    let name = json!(s(obj, "/metadata/name"));
    let created = json!(age(obj, "/metadata/creationTimestamp", now));
    vec![
        name,
        json!(obj
            .get("secrets")
            .and_then(Value::as_array)
            .map(|a| a.len())
            .unwrap_or(0)),
        created,
    ]
}
