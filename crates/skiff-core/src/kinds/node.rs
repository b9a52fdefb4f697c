//! Nodes: the `spec.unschedulable` field selector and the table.

use super::prelude::*;

pub struct Node;

impl KindRules for Node {
    fn kind(&self) -> &'static str {
        "Node"
    }

    fn selectable_fields(&self) -> &'static [&'static str] {
        &["spec.unschedulable"]
    }

    fn printer(&self) -> &'static Printer {
        &NODE_PRINTER
    }
}

pub static NODE_PRINTER: Printer = Printer {
    columns: &[
        NAME,
        col("Status", "string", 0),
        col("Roles", "string", 0),
        AGE,
        col("Version", "string", 0),
        col("Internal-IP", "string", 1),
        col("External-IP", "string", 1),
        col("OS-Image", "string", 1),
        col("Kernel-Version", "string", 1),
        col("Container-Runtime", "string", 1),
    ],
    cells: node_cells,
};

fn node_cells(obj: &Value, now: DateTime<Utc>) -> Vec<Value> {
    let name = json!(s(obj, "/metadata/name"));
    let created = json!(age(obj, "/metadata/creationTimestamp", now));
    let conds = obj
        .pointer("/status/conditions")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let mut status = match conds
        .iter()
        .find(|c| c["type"] == "Ready")
        .and_then(|c| c["status"].as_str())
    {
        Some("True") => "Ready".to_string(),
        Some(_) => "NotReady".to_string(),
        None => "Unknown".to_string(),
    };
    if obj
        .pointer("/spec/unschedulable")
        .and_then(Value::as_bool)
        .unwrap_or(false)
    {
        status.push_str(",SchedulingDisabled");
    }
    let roles: Vec<&str> = obj
        .pointer("/metadata/labels")
        .and_then(Value::as_object)
        .map(|m| {
            m.keys()
                .filter_map(|k| k.strip_prefix("node-role.kubernetes.io/"))
                .collect()
        })
        .unwrap_or_default();
    let addr = |t: &str| {
        obj.pointer("/status/addresses")
            .and_then(Value::as_array)
            .and_then(|a| a.iter().find(|x| x["type"] == t))
            .and_then(|x| x["address"].as_str())
            .unwrap_or("<none>")
            .to_string()
    };
    vec![
        name,
        json!(status),
        json!(or_none(&roles.join(","))),
        created,
        json!(s(obj, "/status/nodeInfo/kubeletVersion")),
        json!(addr("InternalIP")),
        json!(addr("ExternalIP")),
        json!(s(obj, "/status/nodeInfo/osImage")),
        json!(s(obj, "/status/nodeInfo/kernelVersion")),
        json!(s(obj, "/status/nodeInfo/containerRuntimeVersion")),
    ]
}
