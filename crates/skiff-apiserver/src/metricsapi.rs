//! `metrics.k8s.io/v1beta1`, served natively: NodeMetrics (`nodes`) and
//! PodMetrics (`pods`, namespaced), read-only (get and list with label and
//! field selectors), so `kubectl top nodes|pods` work without
//! metrics-server and an aggregation layer.
//!
//! Nothing is stored. A request lists the Node or Pod objects it selects
//! (selectors are those of the objects, as metrics-server filters its
//! informers), reads each node agent's kubelet Summary (`/stats/summary`)
//! through [`nodeproxy::agent_get`], and converts: node usage is the node's
//! `cpu.usageNanoCores` and `memory.workingSetBytes`; a pod's containers
//! are its containers' ones. Quantities are printed as Kubernetes prints
//! them (`12345n` nanocores, `1234Ki` bytes).
//!
//! What is left out, as metrics-server leaves it out: nodes whose agent
//! cannot be reached (no endpoint, hollow nodes, errors, 5 s timeout),
//! pods not bound to a reachable node or terminated, and anything whose CPU
//! rate does not exist yet. A `get` of something left out is NotFound.
//!
//! The CPU rate and the window. The agent computes usageNanoCores between
//! its kept cumulative sample and the current one, keeping the last rate
//! for requests less than a second apart; its first sample has no rate.
//! The API server remembers, per node, when it last read that node's
//! Summary and the window it reported then. When it has read the node
//! before and the agent gives a rate, the window is the time since that
//! read (or the previous window, for reads less than a second apart, when
//! the agent repeats its last rate). When it has not (first request after
//! the server starts) or the agent has no rate yet (first sample after the
//! agent starts), it reads the Summary a second time one second later, so
//! the agent's rate covers exactly that second, and reports that as the
//! window — the first `kubectl top` is a second slower, none is empty for
//! want of a sample. Pods and containers still without a rate after that
//! (started in between) are skipped, never reported as 0. Other clients
//! reading the same agent's Summary in between shorten the agent's
//! interval, so the window is then an upper bound.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::Body;
use bytes::Bytes;
use http::{header, Method, Request, Response};
use serde_json::{json, Map, Value};
use skiff_core::error::ApiError;
use skiff_core::resources;

use crate::negotiate::{self, Output};
use crate::request::{Query, ResourceRequest};
use crate::state::AppState;

pub const GROUP: &str = "metrics.k8s.io";
pub const VERSION: &str = "v1beta1";
const API_VERSION: &str = "metrics.k8s.io/v1beta1";

/// How long one agent may take to answer.
const AGENT_TIMEOUT: Duration = Duration::from_secs(5);
/// The gap between two reads when a rate has to be measured afresh (the
/// agent computes no rate over less than a second).
const SECOND_SAMPLE_AFTER: Duration = Duration::from_millis(1_050);
const MIN_WINDOW: Duration = Duration::from_secs(1);

/// What a metrics path asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    Nodes {
        name: Option<String>,
    },
    /// `namespace` is `None` for `/pods` across all namespaces.
    Pods {
        namespace: Option<String>,
        name: Option<String>,
    },
}

/// `/apis/metrics.k8s.io/v1beta1/{nodes[/N] | pods | namespaces/NS/pods[/N]}`.
pub fn parse(path: &str) -> Option<Target> {
    let rest = path
        .strip_prefix("/apis/metrics.k8s.io/v1beta1/")?
        .trim_end_matches('/');
    let segs: Vec<&str> = rest.split('/').collect();
    let name = |s: &str| Some(s.to_string()).filter(|s| !s.is_empty());
    match segs.as_slice() {
        ["nodes"] => Some(Target::Nodes { name: None }),
        ["nodes", n] => Some(Target::Nodes { name: name(n) }),
        ["pods"] => Some(Target::Pods {
            namespace: None,
            name: None,
        }),
        ["namespaces", ns, "pods"] if !ns.is_empty() => Some(Target::Pods {
            namespace: name(ns),
            name: None,
        }),
        ["namespaces", ns, "pods", n] if !ns.is_empty() => Some(Target::Pods {
            namespace: name(ns),
            name: name(n),
        }),
        _ => None,
    }
}

/// A GET (or list) of NodeMetrics or PodMetrics.
pub async fn serve(
    state: &Arc<AppState>,
    req: Request<Body>,
    target: Target,
) -> Result<Response<Body>, ApiError> {
    let query = Query::parse(req.uri().query());
    if req.method() != Method::GET || query.flag("watch") {
        return Err(ApiError::method_not_allowed(format!(
            "{} is not supported on {}: the metrics API serves get and list",
            if query.flag("watch") {
                "watch".to_string()
            } else {
                req.method().to_string()
            },
            req.uri().path()
        )));
    }
    let accept = req
        .headers()
        .get(header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    let output = negotiate::choose_output(accept.as_deref())?;
    let (value, kind) = match target {
        Target::Nodes { name: Some(name) } => (get_node(state, &name).await?, "NodeMetrics"),
        Target::Nodes { name: None } => (list_nodes(state, &query).await?, "NodeMetrics"),
        Target::Pods {
            namespace: Some(ns),
            name: Some(name),
        } => (get_pod(state, &ns, &name).await?, "PodMetrics"),
        Target::Pods { namespace, .. } => (
            list_pods(state, namespace.as_deref(), &query).await?,
            "PodMetrics",
        ),
    };
    let body = match output {
        Output::Table { v1beta1 } => table(&value, kind, v1beta1),
        _ => value,
    };
    Ok(Response::builder()
        .header(header::CONTENT_TYPE, "application/json")
        .body(Body::from(Bytes::from(
            serde_json::to_vec(&body).unwrap_or_default(),
        )))
        .unwrap_or_else(|_| Response::new(Body::empty())))
}

fn node_not_found(name: &str) -> ApiError {
    ApiError::not_found(GROUP, "nodemetrics", name)
}

fn pod_not_found(ns: &str, name: &str) -> ApiError {
    ApiError::not_found(GROUP, "podmetrics", &format!("{ns}/{name}"))
}

async fn get_node(state: &AppState, name: &str) -> Result<Value, ApiError> {
    let nodes = resources::lookup("", "v1", "nodes").expect("nodes");
    let node = match state.registry.get(nodes, None, name).await {
        Ok(n) => n,
        Err(e) if e.code == 404 => return Err(node_not_found(name)),
        Err(e) => return Err(e),
    };
    let (summary, window) = summary(state, name)
        .await
        .ok_or_else(|| node_not_found(name))?;
    node_metrics(&node, &summary, window, &crate::object::now_rfc3339())
        .ok_or_else(|| node_not_found(name))
}

async fn get_pod(state: &AppState, ns: &str, name: &str) -> Result<Value, ApiError> {
    let pods = resources::lookup("", "v1", "pods").expect("pods");
    let pod = match state.registry.get(pods, Some(ns), name).await {
        Ok(p) => p,
        Err(e) if e.code == 404 => return Err(pod_not_found(ns, name)),
        Err(e) => return Err(e),
    };
    let node = node_of(&pod).ok_or_else(|| pod_not_found(ns, name))?;
    let (summary, window) = summary(state, &node)
        .await
        .ok_or_else(|| pod_not_found(ns, name))?;
    pod_metrics(&pod, &summary, window, &crate::object::now_rfc3339())
        .ok_or_else(|| pod_not_found(ns, name))
}

/// The objects of `plural` (core v1) the query's selectors pick.
async fn select(
    state: &AppState,
    plural: &str,
    namespace: Option<&str>,
    query: &Query,
) -> Result<Vec<Value>, ApiError> {
    let res = resources::lookup("", "v1", plural).expect("core resource");
    let rr = ResourceRequest {
        res,
        namespace: namespace.map(str::to_string),
        name: None,
        subresource: None,
        sub: crate::request::Subresource::Main,
        watch_path: false,
    };
    let filter = crate::request::filter_from_query(rr.res, rr.namespace.clone(), query)?;
    let out = state
        .registry
        .list(res, &filter, 0, None, None, false)
        .await?;
    Ok(out
        .items
        .iter()
        .filter_map(|b| serde_json::from_slice(b).ok())
        .collect())
}

async fn list_nodes(state: &AppState, query: &Query) -> Result<Value, ApiError> {
    let nodes = select(state, "nodes", None, query).await?;
    let summaries = futures::future::join_all(nodes.iter().map(|n| {
        summary(
            state,
            n.pointer("/metadata/name")
                .and_then(Value::as_str)
                .unwrap_or(""),
        )
    }))
    .await;
    let now = crate::object::now_rfc3339();
    let items: Vec<Value> = nodes
        .iter()
        .zip(summaries)
        .filter_map(|(node, s)| {
            let (summary, window) = s?;
            node_metrics(node, &summary, window, &now)
        })
        .collect();
    Ok(list("NodeMetricsList", items))
}

async fn list_pods(
    state: &AppState,
    namespace: Option<&str>,
    query: &Query,
) -> Result<Value, ApiError> {
    let pods = select(state, "pods", namespace, query).await?;
    let mut node_names: Vec<String> = pods.iter().filter_map(node_of).collect();
    node_names.sort();
    node_names.dedup();
    let summaries: HashMap<String, (Value, Duration)> = futures::future::join_all(
        node_names
            .iter()
            .map(|n| async move { (n.clone(), summary(state, n).await) }),
    )
    .await
    .into_iter()
    .filter_map(|(n, s)| Some((n, s?)))
    .collect();
    let now = crate::object::now_rfc3339();
    let items: Vec<Value> = pods
        .iter()
        .filter_map(|pod| {
            let (summary, window) = summaries.get(&node_of(pod)?)?;
            pod_metrics(pod, summary, *window, &now)
        })
        .collect();
    Ok(list("PodMetricsList", items))
}

fn list(kind: &str, items: Vec<Value>) -> Value {
    json!({"kind": kind, "apiVersion": API_VERSION, "metadata": {}, "items": items})
}

/// The node a pod runs on, unless it is unbound or terminated.
fn node_of(pod: &Value) -> Option<String> {
    let phase = pod.pointer("/status/phase").and_then(Value::as_str);
    if matches!(phase, Some("Succeeded") | Some("Failed")) {
        return None;
    }
    pod.pointer("/spec/nodeName")
        .and_then(Value::as_str)
        .filter(|n| !n.is_empty())
        .map(str::to_string)
}

async fn read_summary(state: &AppState, node: &str) -> Option<Value> {
    let body = tokio::time::timeout(
        AGENT_TIMEOUT,
        crate::nodeproxy::agent_get(state, node, "/stats/summary"),
    )
    .await
    .ok()?
    .ok()?;
    serde_json::from_slice(&body).ok()
}

fn node_rate(summary: &Value) -> bool {
    summary.pointer("/node/cpu/usageNanoCores").is_some()
}

/// A node's Summary with a CPU rate, and the window that rate covers; `None`
/// when the agent cannot be reached or has no rate (see the module notes).
async fn summary(state: &AppState, node: &str) -> Option<(Value, Duration)> {
    if node.is_empty() {
        return None;
    }
    let first = read_summary(state, node).await?;
    let read_at = Instant::now();
    let known = state.metrics_windows.0.lock().unwrap().get(node).copied();
    if let (true, Some((last, window))) = (node_rate(&first), known) {
        let gap = read_at.saturating_duration_since(last);
        if gap < MIN_WINDOW {
            return Some((first, window));
        }
        state
            .metrics_windows
            .0
            .lock()
            .unwrap()
            .insert(node.to_string(), (read_at, gap));
        return Some((first, gap));
    }
    tokio::time::sleep(SECOND_SAMPLE_AFTER).await;
    let second = read_summary(state, node).await?;
    let again_at = Instant::now();
    let window = again_at.saturating_duration_since(read_at);
    state
        .metrics_windows
        .0
        .lock()
        .unwrap()
        .insert(node.to_string(), (again_at, window));
    node_rate(&second).then_some((second, window))
}

// ---- conversion (pure) -------------------------------------------------------

/// A quantity in the canonical decimal form Kubernetes prints, from a value
/// in units of 10^-9 (CPU in nanocores: `12345n`, `250m`, `2`).
pub fn cpu_quantity(nanocores: u64) -> String {
    decimal(nanocores, 0)
}

/// `value × 1000^(index - 3)` with the largest suffix that keeps it whole.
fn decimal(mut value: u64, mut index: usize) -> String {
    const SUFFIXES: [&str; 10] = ["n", "u", "m", "", "k", "M", "G", "T", "P", "E"];
    if value == 0 {
        return "0".to_string();
    }
    while value.is_multiple_of(1000) && index + 1 < SUFFIXES.len() {
        value /= 1000;
        index += 1;
    }
    format!("{value}{}", SUFFIXES[index])
}

/// Bytes in the canonical binary form Kubernetes prints (`1234Ki`, `5Mi`,
/// `1500`); below 1024 the decimal form, as Kubernetes does (`1k`).
pub fn memory_quantity(bytes: u64) -> String {
    if bytes < 1024 {
        return decimal(bytes, 3);
    }
    const SUFFIXES: [&str; 7] = ["", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei"];
    let mut value = bytes;
    let mut index = 0;
    while value.is_multiple_of(1024) && index + 1 < SUFFIXES.len() {
        value /= 1024;
        index += 1;
    }
    format!("{value}{}", SUFFIXES[index])
}

/// A duration as Go prints it (metav1.Duration): `1.05s`, `20.064s`,
/// `1m5s`, `500ms`; milliseconds at most.
pub fn go_duration(d: Duration) -> String {
    let ms = d.as_millis() as u64;
    if ms == 0 {
        return "0s".to_string();
    }
    if ms < 1000 {
        return format!("{ms}ms");
    }
    let (h, m, s, frac) = (ms / 3_600_000, ms / 60_000 % 60, ms / 1000 % 60, ms % 1000);
    let mut out = String::new();
    if h > 0 {
        out.push_str(&format!("{h}h"));
    }
    if h > 0 || m > 0 {
        out.push_str(&format!("{m}m"));
    }
    out.push_str(&s.to_string());
    if frac > 0 {
        out.push_str(format!(".{frac:03}").trim_end_matches('0'));
    }
    out.push('s');
    out
}

fn metadata(obj: &Value, now: &str) -> Value {
    let mut m = Map::new();
    m.insert(
        "name".into(),
        obj.pointer("/metadata/name")
            .cloned()
            .unwrap_or(Value::Null),
    );
    if let Some(ns) = obj.pointer("/metadata/namespace") {
        m.insert("namespace".into(), ns.clone());
    }
    m.insert("creationTimestamp".into(), json!(now));
    if let Some(labels) = obj.pointer("/metadata/labels").filter(|l| l.is_object()) {
        m.insert("labels".into(), labels.clone());
    }
    Value::Object(m)
}

/// (timestamp, cpu nanocores, working set bytes) of a stats entry with a CPU
/// rate and a working set.
fn usage(stats: &Value) -> Option<(String, u64, u64)> {
    let cpu = stats.pointer("/cpu/usageNanoCores")?.as_u64()?;
    let memory = stats.pointer("/memory/workingSetBytes")?.as_u64()?;
    let time = stats
        .pointer("/cpu/time")
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_string();
    Some((time, cpu, memory))
}

/// NodeMetrics of `node` (the Node object) from its agent's Summary; `None`
/// without a CPU rate or a working set.
pub fn node_metrics(node: &Value, summary: &Value, window: Duration, now: &str) -> Option<Value> {
    let (time, cpu, memory) = usage(summary.get("node")?)?;
    Some(json!({
        "kind": "NodeMetrics",
        "apiVersion": API_VERSION,
        "metadata": metadata(node, now),
        "timestamp": if time.is_empty() { now.to_string() } else { time },
        "window": go_duration(window),
        "usage": {"cpu": cpu_quantity(cpu), "memory": memory_quantity(memory)},
    }))
}

/// PodMetrics of `pod` (the Pod object) from its node's Summary; `None`
/// when the Summary does not list the pod (by namespace, name and, when
/// both know it, uid), lists no container, or a container lacks a rate.
pub fn pod_metrics(pod: &Value, summary: &Value, window: Duration, now: &str) -> Option<Value> {
    let field = |v: &Value, p: &str| {
        v.pointer(p)
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string()
    };
    let (ns, name, uid) = (
        field(pod, "/metadata/namespace"),
        field(pod, "/metadata/name"),
        field(pod, "/metadata/uid"),
    );
    let stats = summary.get("pods")?.as_array()?.iter().find(|p| {
        let their_uid = field(p, "/podRef/uid");
        field(p, "/podRef/namespace") == ns
            && field(p, "/podRef/name") == name
            && (uid.is_empty() || their_uid.is_empty() || their_uid == uid)
    })?;
    let mut latest = String::new();
    let mut containers = Vec::new();
    for c in stats.get("containers")?.as_array()? {
        let (time, cpu, memory) = usage(c)?;
        latest = latest.max(time);
        containers.push(json!({
            "name": c.get("name")?,
            "usage": {"cpu": cpu_quantity(cpu), "memory": memory_quantity(memory)},
        }));
    }
    if containers.is_empty() {
        return None;
    }
    Some(json!({
        "kind": "PodMetrics",
        "apiVersion": API_VERSION,
        "metadata": metadata(pod, now),
        "timestamp": if latest.is_empty() { now.to_string() } else { latest },
        "window": go_duration(window),
        "containers": containers,
    }))
}

/// A `kubectl get` Table of metrics (one object or a list): name, CPU,
/// memory (a pod's summed over its containers) and window.
fn table(value: &Value, kind: &str, v1beta1: bool) -> Value {
    let items: Vec<&Value> = match value.get("items").and_then(Value::as_array) {
        Some(items) => items.iter().collect(),
        None => vec![value],
    };
    let rows: Vec<Value> = items
        .iter()
        .map(|m| {
            let (cpu, memory) = if kind == "NodeMetrics" {
                (
                    m.pointer("/usage/cpu").cloned().unwrap_or(Value::Null),
                    m.pointer("/usage/memory").cloned().unwrap_or(Value::Null),
                )
            } else {
                let names = |r: &str| -> String {
                    m.get("containers")
                        .and_then(Value::as_array)
                        .map(|cs| {
                            cs.iter()
                                .map(|c| {
                                    c.pointer(&format!("/usage/{r}"))
                                        .and_then(Value::as_str)
                                        .unwrap_or("")
                                        .to_string()
                                })
                                .collect::<Vec<_>>()
                                .join(",")
                        })
                        .unwrap_or_default()
                };
                (json!(names("cpu")), json!(names("memory")))
            };
            json!({
                "cells": [m.pointer("/metadata/name"), cpu, memory, m.get("window")],
                "object": {"kind": "PartialObjectMetadata", "apiVersion": if v1beta1 { "meta.k8s.io/v1beta1" } else { "meta.k8s.io/v1" }, "metadata": m.get("metadata")},
            })
        })
        .collect();
    let column = |name: &str, ty: &str, format: &str, description: &str| json!({"name": name, "type": ty, "format": format, "description": description, "priority": 0});
    json!({
        "kind": "Table",
        "apiVersion": if v1beta1 { "meta.k8s.io/v1beta1" } else { "meta.k8s.io/v1" },
        "metadata": {},
        "columnDefinitions": [
            column("Name", "string", "name", "Name of the resource"),
            column("CPU", "string", "", "CPU usage"),
            column("Memory", "string", "", "Memory usage (working set)"),
            column("Window", "string", "", "The interval the usage was measured over"),
        ],
        "rows": rows,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: &str = "2026-01-01T00:01:00Z";

    fn summary() -> Value {
        json!({
            "node": {"nodeName": "n1", "startTime": "2026-01-01T00:00:00Z",
                "cpu": {"time": "2026-01-01T00:00:12Z", "usageNanoCores": 1_250_000_000u64, "usageCoreNanoSeconds": 6_000_000_000u64},
                "memory": {"time": "2026-01-01T00:00:12Z", "workingSetBytes": 2_814_136_320u64, "usageBytes": 3_000_000_000u64}},
            "pods": [
                {"podRef": {"name": "web", "namespace": "default", "uid": "u1"}, "startTime": "2026-01-01T00:00:01Z",
                 "containers": [
                    {"name": "app", "cpu": {"time": "2026-01-01T00:00:11Z", "usageNanoCores": 12345, "usageCoreNanoSeconds": 99},
                     "memory": {"time": "2026-01-01T00:00:11Z", "workingSetBytes": 1_048_576}},
                    {"name": "side", "cpu": {"time": "2026-01-01T00:00:12Z", "usageNanoCores": 250_000_000u64},
                     "memory": {"time": "2026-01-01T00:00:12Z", "workingSetBytes": 1_536}}]},
                {"podRef": {"name": "web", "namespace": "other", "uid": "u2"},
                 "containers": [{"name": "app", "cpu": {"usageNanoCores": 7}, "memory": {"workingSetBytes": 4096}}]},
                {"podRef": {"name": "new", "namespace": "default", "uid": "u3"},
                 "containers": [{"name": "app", "cpu": {"time": "2026-01-01T00:00:12Z", "usageCoreNanoSeconds": 5},
                     "memory": {"workingSetBytes": 4096}}]}
            ]
        })
    }

    fn pod(ns: &str, name: &str, uid: &str) -> Value {
        json!({"metadata": {"name": name, "namespace": ns, "uid": uid, "labels": {"app": name}},
            "spec": {"nodeName": "n1"}, "status": {"phase": "Running"}})
    }

    #[test]
    fn quantities_print_as_kubernetes_prints_them() {
        assert_eq!(cpu_quantity(0), "0");
        assert_eq!(cpu_quantity(12345), "12345n");
        assert_eq!(cpu_quantity(329_087_452), "329087452n");
        assert_eq!(cpu_quantity(250_000_000), "250m");
        assert_eq!(cpu_quantity(12_345_000), "12345u");
        assert_eq!(cpu_quantity(2_000_000_000), "2");
        assert_eq!(memory_quantity(2_814_136_320), "2748180Ki");
        assert_eq!(memory_quantity(1_048_576), "1Mi");
        assert_eq!(memory_quantity(1_536), "1536");
        assert_eq!(memory_quantity(1_000), "1k");
        assert_eq!(memory_quantity(0), "0");
        assert_eq!(go_duration(Duration::from_millis(1_050)), "1.05s");
        assert_eq!(go_duration(Duration::from_millis(20_064)), "20.064s");
        assert_eq!(go_duration(Duration::from_secs(65)), "1m5s");
        assert_eq!(go_duration(Duration::from_millis(500)), "500ms");
    }

    #[test]
    fn node_metrics_come_from_the_nodes_cpu_rate_and_working_set() {
        let node = json!({"metadata": {"name": "n1", "labels": {"zone": "a"}, "uid": "x"}});
        let m = node_metrics(&node, &summary(), Duration::from_millis(1_050), NOW).unwrap();
        assert_eq!(
            m,
            json!({"kind": "NodeMetrics", "apiVersion": "metrics.k8s.io/v1beta1",
                "metadata": {"name": "n1", "creationTimestamp": NOW, "labels": {"zone": "a"}},
                "timestamp": "2026-01-01T00:00:12Z", "window": "1.05s",
                "usage": {"cpu": "1250m", "memory": "2748180Ki"}})
        );
        // The agent's first sample: no rate, no metrics (not zero).
        let mut first = summary();
        first["node"]["cpu"]
            .as_object_mut()
            .unwrap()
            .remove("usageNanoCores");
        assert_eq!(
            node_metrics(&node, &first, Duration::from_secs(1), NOW),
            None
        );
    }

    #[test]
    fn pod_metrics_match_namespace_name_and_uid_and_skip_pods_without_a_rate() {
        let w = Duration::from_secs(2);
        let m = pod_metrics(&pod("default", "web", "u1"), &summary(), w, NOW).unwrap();
        assert_eq!(
            m,
            json!({"kind": "PodMetrics", "apiVersion": "metrics.k8s.io/v1beta1",
                "metadata": {"name": "web", "namespace": "default", "creationTimestamp": NOW, "labels": {"app": "web"}},
                "timestamp": "2026-01-01T00:00:12Z", "window": "2s",
                "containers": [
                    {"name": "app", "usage": {"cpu": "12345n", "memory": "1Mi"}},
                    {"name": "side", "usage": {"cpu": "250m", "memory": "1536"}}]})
        );
        // The same name in another namespace is another pod.
        let other = pod_metrics(&pod("other", "web", "u2"), &summary(), w, NOW).unwrap();
        assert_eq!(other["metadata"]["namespace"], "other");
        assert_eq!(other["containers"][0]["usage"]["cpu"], "7n");
        assert_eq!(other["timestamp"], NOW);
        // A pod recreated under the same name (another uid) is not the one measured.
        assert_eq!(
            pod_metrics(&pod("default", "web", "u9"), &summary(), w, NOW),
            None
        );
        // A container without a rate yet: the pod is skipped, not reported as 0.
        assert_eq!(
            pod_metrics(&pod("default", "new", "u3"), &summary(), w, NOW),
            None
        );
        assert_eq!(
            pod_metrics(&pod("default", "absent", ""), &summary(), w, NOW),
            None
        );
    }

    #[test]
    fn only_unbound_or_terminated_pods_have_no_node() {
        assert_eq!(node_of(&pod("d", "p", "u")), Some("n1".to_string()));
        let mut done = pod("d", "p", "u");
        done["status"]["phase"] = json!("Succeeded");
        assert_eq!(node_of(&done), None);
        assert_eq!(node_of(&json!({"spec": {}})), None);
    }

    #[test]
    fn metrics_paths_name_nodes_and_namespaced_pods() {
        assert_eq!(
            parse("/apis/metrics.k8s.io/v1beta1/nodes"),
            Some(Target::Nodes { name: None })
        );
        assert_eq!(
            parse("/apis/metrics.k8s.io/v1beta1/nodes/n1"),
            Some(Target::Nodes {
                name: Some("n1".into())
            })
        );
        assert_eq!(
            parse("/apis/metrics.k8s.io/v1beta1/pods"),
            Some(Target::Pods {
                namespace: None,
                name: None
            })
        );
        assert_eq!(
            parse("/apis/metrics.k8s.io/v1beta1/namespaces/default/pods/web"),
            Some(Target::Pods {
                namespace: Some("default".into()),
                name: Some("web".into())
            })
        );
        assert_eq!(parse("/apis/metrics.k8s.io/v1beta1"), None);
        assert_eq!(
            parse("/apis/metrics.k8s.io/v1beta1/namespaces/default"),
            None
        );
        assert_eq!(parse("/apis/metrics.k8s.io/v1beta1/nodes/n1/x"), None);
        assert_eq!(parse("/api/v1/nodes"), None);
    }

    #[test]
    fn a_table_shows_name_cpu_memory_and_window() {
        let node = json!({"metadata": {"name": "n1"}});
        let m = node_metrics(&node, &summary(), Duration::from_secs(1), NOW).unwrap();
        let t = table(&list("NodeMetricsList", vec![m]), "NodeMetrics", false);
        assert_eq!(
            t["rows"][0]["cells"],
            json!(["n1", "1250m", "2748180Ki", "1s"])
        );
        assert_eq!(t["columnDefinitions"].as_array().unwrap().len(), 4);
    }
}
