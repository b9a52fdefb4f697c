//! Server-side printing for `kubectl get`: the columns Kubernetes' printers
//! show per kind, and each object's cells.

use chrono::{DateTime, Utc};
use serde_json::{json, Value};

/// One table column (`metav1.TableColumnDefinition`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Column {
    pub name: &'static str,
    pub type_: &'static str,
    pub format: &'static str,
    pub description: &'static str,
    /// 0 for default columns, 1 for `-o wide` ones.
    pub priority: i32,
}

const fn col(name: &'static str, type_: &'static str, priority: i32) -> Column {
    Column {
        name,
        type_,
        format: "",
        description: "",
        priority,
    }
}

const NAME: Column = Column {
    name: "Name",
    type_: "string",
    format: "name",
    description: "Name must be unique within a namespace.",
    priority: 0,
};
const AGE: Column = Column { name: "Age", type_: "string", format: "", description: "CreationTimestamp is a timestamp representing the server time when this object was created.", priority: 0 };

/// The columns for a kind.
pub fn columns(group: &str, kind: &str) -> Vec<Column> {
    let mut c = vec![NAME];
    match (group, kind) {
        ("", "Pod") => c.extend([
            col("Ready", "string", 0),
            col("Status", "string", 0),
            col("Restarts", "string", 0),
            AGE,
            col("IP", "string", 1),
            col("Node", "string", 1),
            col("Nominated Node", "string", 1),
            col("Readiness Gates", "string", 1),
        ]),
        ("autoscaling", "Scale") => c.extend([
            col("Desired", "integer", 0),
            col("Available", "integer", 0),
            AGE,
        ]),
        ("apps", "Deployment") => c.extend([
            col("Ready", "string", 0),
            col("Up-to-date", "integer", 0),
            col("Available", "integer", 0),
            AGE,
            col("Containers", "string", 1),
            col("Images", "string", 1),
            col("Selector", "string", 1),
        ]),
        ("apps", "ReplicaSet") | ("", "ReplicationController") => c.extend([
            col("Desired", "integer", 0),
            col("Current", "integer", 0),
            col("Ready", "integer", 0),
            AGE,
            col("Containers", "string", 1),
            col("Images", "string", 1),
            col("Selector", "string", 1),
        ]),
        ("apps", "StatefulSet") => c.extend([
            col("Ready", "string", 0),
            AGE,
            col("Containers", "string", 1),
            col("Images", "string", 1),
        ]),
        ("apps", "DaemonSet") => c.extend([
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
        ]),
        ("batch", "Job") => c.extend([
            col("Status", "string", 0),
            col("Completions", "string", 0),
            col("Duration", "string", 0),
            AGE,
            col("Containers", "string", 1),
            col("Images", "string", 1),
            col("Selector", "string", 1),
        ]),
        ("batch", "CronJob") => c.extend([
            col("Schedule", "string", 0),
            col("Timezone", "string", 0),
            col("Suspend", "boolean", 0),
            col("Active", "integer", 0),
            col("Last Schedule", "string", 0),
            AGE,
            col("Containers", "string", 1),
            col("Images", "string", 1),
            col("Selector", "string", 1),
        ]),
        ("", "Service") => c.extend([
            col("Type", "string", 0),
            col("Cluster-IP", "string", 0),
            col("External-IP", "string", 0),
            col("Port(s)", "string", 0),
            AGE,
            col("Selector", "string", 1),
        ]),
        ("", "Endpoints") => c.extend([col("Endpoints", "string", 0), AGE]),
        ("", "Node") => c.extend([
            col("Status", "string", 0),
            col("Roles", "string", 0),
            AGE,
            col("Version", "string", 0),
            col("Internal-IP", "string", 1),
            col("External-IP", "string", 1),
            col("OS-Image", "string", 1),
            col("Kernel-Version", "string", 1),
            col("Container-Runtime", "string", 1),
        ]),
        ("", "Namespace") => c.extend([col("Status", "string", 0), AGE]),
        ("", "ConfigMap") => c.extend([col("Data", "integer", 0), AGE]),
        ("", "Secret") => c.extend([col("Type", "string", 0), col("Data", "integer", 0), AGE]),
        ("", "ServiceAccount") => c.extend([col("Secrets", "integer", 0), AGE]),
        ("", "Event") => {
            return vec![
                col("Last Seen", "string", 0),
                col("Type", "string", 0),
                col("Reason", "string", 0),
                col("Object", "string", 0),
                col("Message", "string", 0),
            ]
        }
        ("coordination.k8s.io", "Lease") => c.extend([col("Holder", "string", 0), AGE]),
        ("", "PersistentVolumeClaim") => c.extend([
            col("Status", "string", 0),
            col("Volume", "string", 0),
            col("Capacity", "string", 0),
            col("Access Modes", "string", 0),
            col("StorageClass", "string", 0),
            AGE,
        ]),
        ("scheduling.k8s.io", "PriorityClass") => c.extend([
            col("Value", "integer", 0),
            col("Global-Default", "boolean", 0),
            AGE,
        ]),
        ("policy", "PodDisruptionBudget") => c.extend([
            col("Min Available", "string", 0),
            col("Max Unavailable", "string", 0),
            col("Allowed Disruptions", "integer", 0),
            AGE,
        ]),
        ("discovery.k8s.io", "EndpointSlice") => c.extend([
            col("AddressType", "string", 0),
            col("Ports", "string", 0),
            col("Endpoints", "string", 0),
            AGE,
        ]),
        ("rbac.authorization.k8s.io", "Role" | "ClusterRole") => {
            c.push(col("Created At", "date", 0))
        }
        ("rbac.authorization.k8s.io", "RoleBinding" | "ClusterRoleBinding") => {
            c.extend([col("Role", "string", 0), AGE])
        }
        _ => c.push(AGE),
    }
    c
}

/// `[{name, type, format, description, priority}]`.
pub fn column_definitions_json(cols: &[Column]) -> Value {
    Value::Array(
        cols.iter()
            .map(|c| json!({"name": c.name, "type": c.type_, "format": c.format, "description": c.description, "priority": c.priority}))
            .collect(),
    )
}

/// Kubernetes' `duration.HumanDuration`.
pub fn human_duration(d: chrono::Duration) -> String {
    let s = d.num_seconds();
    if s < -1 {
        return "<invalid>".into();
    }
    let s = s.max(0);
    if s < 60 * 2 {
        return format!("{s}s");
    }
    let m = s / 60;
    if m < 10 {
        let rs = s % 60;
        return if rs == 0 {
            format!("{m}m")
        } else {
            format!("{m}m{rs}s")
        };
    }
    if m < 60 * 3 {
        return format!("{m}m");
    }
    let h = s / 3600;
    if h < 8 {
        let rm = m % 60;
        return if rm == 0 {
            format!("{h}h")
        } else {
            format!("{h}h{rm}m")
        };
    }
    if h < 48 {
        return format!("{h}h");
    }
    if h < 24 * 8 {
        let rh = h % 24;
        return if rh == 0 {
            format!("{}d", h / 24)
        } else {
            format!("{}d{rh}h", h / 24)
        };
    }
    if h < 24 * 365 * 2 {
        return format!("{}d", h / 24);
    }
    if h < 24 * 365 * 8 {
        let dy = (h / 24) % 365;
        return if dy == 0 {
            format!("{}y", h / 24 / 365)
        } else {
            format!("{}y{dy}d", h / 24 / 365)
        };
    }
    format!("{}y", h / 24 / 365)
}

fn age(obj: &Value, field: &str, now: DateTime<Utc>) -> String {
    match obj
        .pointer(field)
        .and_then(Value::as_str)
        .and_then(|t| DateTime::parse_from_rfc3339(t).ok())
    {
        Some(t) => human_duration(now - t.with_timezone(&Utc)),
        None => "<unknown>".into(),
    }
}

fn s<'a>(obj: &'a Value, ptr: &str) -> &'a str {
    obj.pointer(ptr).and_then(Value::as_str).unwrap_or("")
}

fn i(obj: &Value, ptr: &str) -> i64 {
    obj.pointer(ptr).and_then(Value::as_i64).unwrap_or(0)
}

fn or_none(v: &str) -> String {
    if v.is_empty() {
        "<none>".into()
    } else {
        v.to_string()
    }
}

fn containers_images(obj: &Value, spec_ptr: &str) -> (String, String) {
    let cs = obj
        .pointer(&format!("{spec_ptr}/containers"))
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let names: Vec<&str> = cs
        .iter()
        .filter_map(|c| c.get("name").and_then(Value::as_str))
        .collect();
    let images: Vec<&str> = cs
        .iter()
        .filter_map(|c| c.get("image").and_then(Value::as_str))
        .collect();
    (names.join(","), images.join(","))
}

fn selector(obj: &Value) -> String {
    or_none(&crate::selector::selector_string(
        obj.pointer("/spec/selector"),
    ))
}

/// Kubernetes' pod STATUS column.
pub fn pod_status(pod: &Value) -> String {
    let mut reason = pod
        .pointer("/status/reason")
        .and_then(Value::as_str)
        .map(str::to_string)
        .unwrap_or_else(|| s(pod, "/status/phase").to_string());
    let init_total = pod
        .pointer("/spec/initContainers")
        .and_then(Value::as_array)
        .map(|a| a.len())
        .unwrap_or(0);
    let mut initializing = false;
    if let Some(ics) = pod
        .pointer("/status/initContainerStatuses")
        .and_then(Value::as_array)
    {
        for (n, c) in ics.iter().enumerate() {
            if c.pointer("/state/terminated/exitCode")
                .and_then(Value::as_i64)
                == Some(0)
            {
                continue;
            }
            initializing = true;
            if let Some(t) = c.pointer("/state/terminated") {
                reason = match t.get("reason").and_then(Value::as_str) {
                    Some(r) if !r.is_empty() => format!("Init:{r}"),
                    _ => format!(
                        "Init:ExitCode:{}",
                        t.get("exitCode").and_then(Value::as_i64).unwrap_or(0)
                    ),
                };
            } else if let Some(r) = c
                .pointer("/state/waiting/reason")
                .and_then(Value::as_str)
                .filter(|r| *r != "PodInitializing")
            {
                reason = format!("Init:{r}");
            } else {
                reason = format!("Init:{n}/{init_total}");
            }
            break;
        }
    }
    if !initializing {
        let mut has_running = false;
        if let Some(cs) = pod
            .pointer("/status/containerStatuses")
            .and_then(Value::as_array)
        {
            for c in cs.iter().rev() {
                if let Some(r) = c
                    .pointer("/state/waiting/reason")
                    .and_then(Value::as_str)
                    .filter(|r| !r.is_empty())
                {
                    reason = r.to_string();
                } else if let Some(t) = c.pointer("/state/terminated") {
                    reason = match t.get("reason").and_then(Value::as_str) {
                        Some(r) if !r.is_empty() => r.to_string(),
                        _ => match t.get("signal").and_then(Value::as_i64).filter(|s| *s != 0) {
                            Some(sig) => format!("Signal:{sig}"),
                            None => format!(
                                "ExitCode:{}",
                                t.get("exitCode").and_then(Value::as_i64).unwrap_or(0)
                            ),
                        },
                    };
                } else if c.pointer("/state/running").is_some()
                    && c.get("ready") == Some(&json!(true))
                {
                    has_running = true;
                }
            }
        }
        if reason == "Completed" && has_running {
            reason = "Running".into();
        }
    }
    if pod
        .pointer("/metadata/deletionTimestamp")
        .and_then(Value::as_str)
        .is_some()
    {
        reason = if s(pod, "/status/reason") == "NodeLost" {
            "Unknown".into()
        } else {
            "Terminating".into()
        };
    }
    reason
}

fn pod_cells(obj: &Value, now: DateTime<Utc>) -> Vec<Value> {
    let total = obj
        .pointer("/spec/containers")
        .and_then(Value::as_array)
        .map(|a| a.len())
        .unwrap_or(0);
    let statuses = obj
        .pointer("/status/containerStatuses")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let ready = statuses
        .iter()
        .filter(|c| c.get("ready") == Some(&json!(true)))
        .count();
    let restarts: i64 = statuses
        .iter()
        .map(|c| c.get("restartCount").and_then(Value::as_i64).unwrap_or(0))
        .sum();
    let last_restart = statuses
        .iter()
        .filter_map(|c| {
            c.pointer("/lastState/terminated/finishedAt")
                .and_then(Value::as_str)
        })
        .filter_map(|t| DateTime::parse_from_rfc3339(t).ok())
        .max();
    let restarts_s = match (restarts, last_restart) {
        (r, Some(t)) if r > 0 => {
            format!("{r} ({} ago)", human_duration(now - t.with_timezone(&Utc)))
        }
        (r, _) => r.to_string(),
    };
    let gates = obj
        .pointer("/spec/readinessGates")
        .and_then(Value::as_array)
        .map(|a| a.len())
        .unwrap_or(0);
    vec![
        json!(s(obj, "/metadata/name")),
        json!(format!("{ready}/{total}")),
        json!(pod_status(obj)),
        json!(restarts_s),
        json!(age(obj, "/metadata/creationTimestamp", now)),
        json!(or_none(s(obj, "/status/podIP"))),
        json!(or_none(s(obj, "/spec/nodeName"))),
        json!(or_none(s(obj, "/status/nominatedNodeName"))),
        json!(if gates == 0 {
            "<none>".to_string()
        } else {
            format!("0/{gates}")
        }),
    ]
}

fn service_ports(obj: &Value) -> String {
    let ports = obj
        .pointer("/spec/ports")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    if ports.is_empty() {
        return "<none>".into();
    }
    ports
        .iter()
        .map(|p| {
            let proto = p.get("protocol").and_then(Value::as_str).unwrap_or("TCP");
            let port = p.get("port").and_then(Value::as_i64).unwrap_or(0);
            match p.get("nodePort").and_then(Value::as_i64) {
                Some(np) => format!("{port}:{np}/{proto}"),
                None => format!("{port}/{proto}"),
            }
        })
        .collect::<Vec<_>>()
        .join(",")
}

/// An object's cells, in the order of [`columns`].
pub fn cells(group: &str, kind: &str, obj: &Value, now: DateTime<Utc>) -> Vec<Value> {
    let name = json!(s(obj, "/metadata/name"));
    let created = json!(age(obj, "/metadata/creationTimestamp", now));
    match (group, kind) {
        ("", "Pod") => pod_cells(obj, now),
        ("autoscaling", "Scale") => vec![
            name,
            json!(i(obj, "/spec/replicas")),
            json!(i(obj, "/status/replicas")),
            created,
        ],
        ("apps", "Deployment") => {
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
        ("apps", "ReplicaSet") | ("", "ReplicationController") => {
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
        ("apps", "StatefulSet") => {
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
        ("apps", "DaemonSet") => {
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
        ("batch", "Job") => {
            let (c, im) = containers_images(obj, "/spec/template/spec");
            let conds = obj
                .pointer("/status/conditions")
                .and_then(Value::as_array)
                .cloned()
                .unwrap_or_default();
            let has = |t: &str| {
                conds
                    .iter()
                    .any(|c| c["type"] == t && c["status"] == "True")
            };
            let status = if has("Complete") {
                "Complete"
            } else if has("Failed") {
                "Failed"
            } else if has("Suspended") {
                "Suspended"
            } else {
                "Running"
            };
            let completions = match obj.pointer("/spec/completions").and_then(Value::as_i64) {
                Some(n) => format!("{}/{n}", i(obj, "/status/succeeded")),
                None => format!(
                    "{}/1 of {}",
                    i(obj, "/status/succeeded"),
                    i(obj, "/spec/parallelism").max(1)
                ),
            };
            let start = obj
                .pointer("/status/startTime")
                .and_then(Value::as_str)
                .and_then(|t| DateTime::parse_from_rfc3339(t).ok());
            let end = obj
                .pointer("/status/completionTime")
                .and_then(Value::as_str)
                .and_then(|t| DateTime::parse_from_rfc3339(t).ok());
            let duration = match (start, end) {
                (Some(a), Some(b)) => human_duration(b - a),
                (Some(a), None) => human_duration(now - a.with_timezone(&Utc)),
                _ => String::new(),
            };
            vec![
                name,
                json!(status),
                json!(completions),
                json!(duration),
                created,
                json!(c),
                json!(im),
                json!(selector(obj)),
            ]
        }
        ("batch", "CronJob") => {
            let (c, im) = containers_images(obj, "/spec/jobTemplate/spec/template/spec");
            let last = match obj.pointer("/status/lastScheduleTime") {
                Some(_) => age(obj, "/status/lastScheduleTime", now),
                None => "<none>".into(),
            };
            vec![
                name,
                json!(s(obj, "/spec/schedule")),
                json!(or_none(s(obj, "/spec/timeZone"))),
                json!(obj
                    .pointer("/spec/suspend")
                    .and_then(Value::as_bool)
                    .unwrap_or(false)),
                json!(obj
                    .pointer("/status/active")
                    .and_then(Value::as_array)
                    .map(|a| a.len())
                    .unwrap_or(0)),
                json!(last),
                created,
                json!(c),
                json!(im),
                json!(selector(obj)),
            ]
        }
        ("", "Service") => {
            let ty = s(obj, "/spec/type");
            let ext: Vec<String> = obj
                .pointer("/status/loadBalancer/ingress")
                .and_then(Value::as_array)
                .map(|a| {
                    a.iter()
                        .filter_map(|x| {
                            x.get("ip")
                                .or(x.get("hostname"))
                                .and_then(Value::as_str)
                                .map(str::to_string)
                        })
                        .collect()
                })
                .unwrap_or_default();
            let external = match ty {
                "ExternalName" => s(obj, "/spec/externalName").to_string(),
                "LoadBalancer" if ext.is_empty() => "<pending>".into(),
                _ if !ext.is_empty() => ext.join(","),
                _ => "<none>".into(),
            };
            vec![
                name,
                json!(ty),
                json!(or_none(s(obj, "/spec/clusterIP"))),
                json!(external),
                json!(service_ports(obj)),
                created,
                json!(selector(obj)),
            ]
        }
        ("", "Endpoints") => {
            let mut eps = Vec::new();
            for sub in obj
                .pointer("/subsets")
                .and_then(Value::as_array)
                .cloned()
                .unwrap_or_default()
            {
                let ports: Vec<i64> = sub
                    .get("ports")
                    .and_then(Value::as_array)
                    .map(|a| {
                        a.iter()
                            .filter_map(|p| p.get("port").and_then(Value::as_i64))
                            .collect()
                    })
                    .unwrap_or_default();
                for a in sub
                    .get("addresses")
                    .and_then(Value::as_array)
                    .cloned()
                    .unwrap_or_default()
                {
                    let ip = s(&a, "/ip");
                    if ports.is_empty() {
                        eps.push(ip.to_string());
                    }
                    for p in &ports {
                        eps.push(format!("{ip}:{p}"));
                    }
                }
            }
            let shown = if eps.len() > 3 {
                format!("{} + {} more...", eps[..3].join(","), eps.len() - 3)
            } else {
                or_none(&eps.join(","))
            };
            vec![name, json!(shown), created]
        }
        ("", "Node") => {
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
        ("", "Namespace") => vec![name, json!(s(obj, "/status/phase")), created],
        ("", "ConfigMap") => {
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
        ("", "Secret") => {
            let n = obj
                .get("data")
                .and_then(Value::as_object)
                .map(|m| m.len())
                .unwrap_or(0);
            vec![name, json!(s(obj, "/type")), json!(n), created]
        }
        ("", "ServiceAccount") => {
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
        ("", "Event") => {
            let last = [
                "/lastTimestamp",
                "/eventTime",
                "/metadata/creationTimestamp",
            ]
            .iter()
            .find(|p| obj.pointer(p).and_then(Value::as_str).is_some())
            .map(|p| age(obj, p, now))
            .unwrap_or_else(|| "<unknown>".into());
            let object = format!(
                "{}/{}",
                s(obj, "/involvedObject/kind").to_lowercase(),
                s(obj, "/involvedObject/name")
            );
            vec![
                json!(last),
                json!(s(obj, "/type")),
                json!(s(obj, "/reason")),
                json!(object),
                json!(s(obj, "/message")),
            ]
        }
        ("coordination.k8s.io", "Lease") => {
            vec![name, json!(s(obj, "/spec/holderIdentity")), created]
        }
        ("", "PersistentVolumeClaim") => {
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
        ("scheduling.k8s.io", "PriorityClass") => {
            vec![
                name,
                json!(i(obj, "/value")),
                json!(obj
                    .get("globalDefault")
                    .and_then(Value::as_bool)
                    .unwrap_or(false)),
                created,
            ]
        }
        ("policy", "PodDisruptionBudget") => {
            let show = |p: &str| {
                obj.pointer(p)
                    .map(|v| v.as_str().map(str::to_string).unwrap_or(v.to_string()))
                    .unwrap_or_else(|| "N/A".into())
            };
            vec![
                name,
                json!(show("/spec/minAvailable")),
                json!(show("/spec/maxUnavailable")),
                json!(i(obj, "/status/disruptionsAllowed")),
                created,
            ]
        }
        ("discovery.k8s.io", "EndpointSlice") => {
            let ports: Vec<String> = obj
                .get("ports")
                .and_then(Value::as_array)
                .map(|a| {
                    a.iter()
                        .filter_map(|p| p.get("port").and_then(Value::as_i64))
                        .map(|p| p.to_string())
                        .collect()
                })
                .unwrap_or_default();
            let eps: Vec<String> = obj
                .get("endpoints")
                .and_then(Value::as_array)
                .map(|a| {
                    a.iter()
                        .flat_map(|e| {
                            e.get("addresses")
                                .and_then(Value::as_array)
                                .cloned()
                                .unwrap_or_default()
                        })
                        .filter_map(|x| x.as_str().map(str::to_string))
                        .collect()
                })
                .unwrap_or_default();
            vec![
                name,
                json!(s(obj, "/addressType")),
                json!(or_none(&ports.join(","))),
                json!(or_none(&eps.join(","))),
                created,
            ]
        }
        ("rbac.authorization.k8s.io", "Role" | "ClusterRole") => {
            vec![name, json!(s(obj, "/metadata/creationTimestamp"))]
        }
        ("rbac.authorization.k8s.io", "RoleBinding" | "ClusterRoleBinding") => {
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
        _ => vec![name, created],
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn now() -> DateTime<Utc> {
        DateTime::parse_from_rfc3339("2026-01-01T01:00:00Z")
            .unwrap()
            .with_timezone(&Utc)
    }

    #[test]
    fn a_crashing_pod_shows_crash_loop_back_off() {
        let pod = json!({"metadata": {"name": "p", "creationTimestamp": "2026-01-01T00:00:00Z"},
            "spec": {"containers": [{"name": "c"}]},
            "status": {"phase": "Running", "containerStatuses": [{"name": "c", "ready": false, "restartCount": 3,
                "state": {"waiting": {"reason": "CrashLoopBackOff"}},
                "lastState": {"terminated": {"finishedAt": "2026-01-01T00:55:00Z"}}}]}});
        let c = cells("", "Pod", &pod, now());
        assert_eq!(c[1], "0/1");
        assert_eq!(c[2], "CrashLoopBackOff");
        assert_eq!(c[3], "3 (5m ago)");
        assert_eq!(c[4], "60m");
        assert_eq!(c.len(), columns("", "Pod").len());
    }

    #[test]
    fn a_deployment_shows_ready_over_desired() {
        let d = json!({"metadata": {"name": "d"}, "spec": {"replicas": 3}, "status": {"readyReplicas": 2}});
        assert_eq!(cells("apps", "Deployment", &d, now())[1], "2/3");
    }

    #[test]
    fn ages_read_as_kubernetes_prints_them() {
        assert_eq!(human_duration(chrono::Duration::seconds(5)), "5s");
        assert_eq!(human_duration(chrono::Duration::seconds(182)), "3m2s");
        assert_eq!(human_duration(chrono::Duration::hours(51)), "2d3h");
    }

    #[test]
    fn every_kind_has_as_many_cells_as_columns() {
        for r in crate::resources::RESOURCES {
            let obj = json!({"metadata": {"name": "x"}});
            assert_eq!(
                cells(r.group, r.kind, &obj, now()).len(),
                columns(r.group, r.kind).len(),
                "{}",
                r.kind
            );
        }
    }
}
