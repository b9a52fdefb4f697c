//! NodeResourcesFit: the pod's requests must fit in what the node has left;
//! scoring by LeastAllocated (default), MostAllocated or
//! RequestedToCapacityRatio.

use serde_json::Value;

use crate::cache::Snapshot;
use crate::framework::{
    ClusterEvent, CycleState, FilterPlugin, Plugin, ScorePlugin, Status, MAX_NODE_SCORE,
};
use crate::types::{NodeInfo, PodInfo};

pub const NAME: &str = "NodeResourcesFit";

#[derive(Debug, Clone, PartialEq)]
pub enum Strategy {
    LeastAllocated,
    MostAllocated,
    /// (utilization 0..=100, score 0..=MAX_NODE_SCORE) points, ascending.
    RequestedToCapacityRatio(Vec<(i64, i64)>),
}

#[derive(Debug, Clone)]
pub struct NodeResourcesFit {
    pub strategy: Strategy,
    pub resources: Vec<(String, i64)>,
    pub ignored: Vec<String>,
    pub ignored_groups: Vec<String>,
}

impl Default for NodeResourcesFit {
    fn default() -> Self {
        NodeResourcesFit {
            strategy: Strategy::LeastAllocated,
            resources: default_resources(),
            ignored: vec![],
            ignored_groups: vec![],
        }
    }
}

/// Kubernetes' cpu and memory, and skiff's reclaimed capacity (only pods
/// that request it are scored by it: it spreads batch pods over the nodes
/// with the most of it left).
pub fn default_resources() -> Vec<(String, i64)> {
    vec![
        ("cpu".into(), 1),
        ("memory".into(), 1),
        ("skiff.io/batch-cpu".into(), 1),
        ("skiff.io/batch-memory".into(), 1),
    ]
}

/// `[{name, weight}]` as in the plugins' args.
pub fn parse_resources(v: Option<&Value>) -> anyhow::Result<Vec<(String, i64)>> {
    let Some(list) = v.and_then(Value::as_array) else {
        return Ok(default_resources());
    };
    let mut out = Vec::new();
    for r in list {
        let name = r
            .get("name")
            .and_then(Value::as_str)
            .ok_or_else(|| anyhow::anyhow!("resources[].name is required"))?;
        let weight = r.get("weight").and_then(Value::as_i64).unwrap_or(1);
        if !(1..=100).contains(&weight) {
            anyhow::bail!("resource {name}: weight must be in 1..=100, got {weight}");
        }
        out.push((name.to_string(), weight));
    }
    if out.is_empty() {
        return Ok(default_resources());
    }
    Ok(out)
}

impl NodeResourcesFit {
    pub fn from_args(args: &Value) -> anyhow::Result<NodeResourcesFit> {
        let mut out = NodeResourcesFit::default();
        let strs = |v: Option<&Value>| -> Vec<String> {
            v.and_then(Value::as_array)
                .map(|a| {
                    a.iter()
                        .filter_map(Value::as_str)
                        .map(String::from)
                        .collect()
                })
                .unwrap_or_default()
        };
        out.ignored = strs(args.get("ignoredResources"));
        out.ignored_groups = strs(args.get("ignoredResourceGroups"));
        if let Some(s) = args.get("scoringStrategy").filter(|v| !v.is_null()) {
            out.resources = parse_resources(s.get("resources"))?;
            out.strategy = match s
                .get("type")
                .and_then(Value::as_str)
                .unwrap_or("LeastAllocated")
            {
                "LeastAllocated" => Strategy::LeastAllocated,
                "MostAllocated" => Strategy::MostAllocated,
                "RequestedToCapacityRatio" => {
                    let shape = s
                        .pointer("/requestedToCapacityRatio/shape")
                        .and_then(Value::as_array)
                        .ok_or_else(|| {
                            anyhow::anyhow!(
                                "RequestedToCapacityRatio needs requestedToCapacityRatio.shape"
                            )
                        })?;
                    let mut pts = Vec::new();
                    for p in shape {
                        let u = p.get("utilization").and_then(Value::as_i64).unwrap_or(0);
                        let sc = p.get("score").and_then(Value::as_i64).unwrap_or(0);
                        if !(0..=100).contains(&u) || !(0..=10).contains(&sc) {
                            anyhow::bail!(
                                "shape point out of range: utilization 0..=100, score 0..=10"
                            );
                        }
                        pts.push((u, sc * (MAX_NODE_SCORE / 10)));
                    }
                    if pts.is_empty() {
                        anyhow::bail!("requestedToCapacityRatio.shape must not be empty");
                    }
                    if pts.windows(2).any(|w| w[0].0 >= w[1].0) {
                        anyhow::bail!("shape utilization values must be strictly increasing");
                    }
                    Strategy::RequestedToCapacityRatio(pts)
                }
                other => anyhow::bail!("unknown scoringStrategy.type {other:?}"),
            };
        }
        Ok(out)
    }

    fn is_ignored(&self, name: &str) -> bool {
        self.ignored.iter().any(|i| i == name)
            || name
                .split_once('/')
                .is_some_and(|(g, _)| self.ignored_groups.iter().any(|i| i == g))
    }
}

impl Plugin for NodeResourcesFit {
    fn name(&self) -> &'static str {
        NAME
    }
    fn events(&self) -> &'static [ClusterEvent] {
        &[
            ClusterEvent::NodeAdd,
            ClusterEvent::NodeAllocatableChange,
            ClusterEvent::AssignedPodDelete,
            ClusterEvent::AssignedPodUpdate,
        ]
    }
    fn as_filter(&self) -> Option<&dyn FilterPlugin> {
        Some(self)
    }
    fn as_score(&self) -> Option<&dyn ScorePlugin> {
        Some(self)
    }
}

/// The reasons `pod` does not fit `node` (empty: it fits).
pub fn insufficient(fit: &NodeResourcesFit, pod: &PodInfo, node: &NodeInfo) -> Vec<String> {
    let mut reasons = Vec::new();
    if node.pods.len() as i64 + 1 > node.allocatable.pods {
        reasons.push("Too many pods".to_string());
    }
    let r = &pod.requests;
    let (a, u) = (&node.allocatable, &node.requested);
    if r.milli_cpu > 0 && r.milli_cpu > a.milli_cpu - u.milli_cpu {
        reasons.push("Insufficient cpu".into());
    }
    if r.memory > 0 && r.memory > a.memory - u.memory {
        reasons.push("Insufficient memory".into());
    }
    if r.ephemeral_storage > 0 && r.ephemeral_storage > a.ephemeral_storage - u.ephemeral_storage {
        reasons.push("Insufficient ephemeral-storage".into());
    }
    for (name, q) in &r.scalar {
        if *q > 0 && !fit.is_ignored(name) && *q > a.scalar(name) - u.scalar(name) {
            reasons.push(format!("Insufficient {name}"));
        }
    }
    reasons
}

impl FilterPlugin for NodeResourcesFit {
    fn filter(&self, _: &CycleState, pod: &PodInfo, node: &NodeInfo, _: &Snapshot) -> Status {
        let reasons = insufficient(self, pod, node);
        if reasons.is_empty() {
            Status::success()
        } else {
            Status {
                code: crate::framework::Code::Unschedulable,
                reasons,
                plugin: NAME,
            }
        }
    }
}

/// Requested (node + pod) and allocatable of one resource for scoring;
/// `None` when the resource should not count. cpu and memory use the
/// non-zero defaults; `non_zero` = false uses plain requests throughout.
pub fn requested_and_allocatable(
    pod: &PodInfo,
    node: &NodeInfo,
    name: &str,
    non_zero: bool,
) -> Option<(i64, i64)> {
    // Resources the pod does not ask for (the batch ones, for most pods)
    // are skipped before any lookup on the node: this runs for every
    // node scored.
    if !matches!(name, "cpu" | "memory") && pod.requests.get(name) == 0 {
        return None;
    }
    let alloc = node.allocatable.get(name);
    let (node_req, pod_req) = match name {
        "cpu" if non_zero => (
            node.non_zero_requested.milli_cpu,
            pod.non_zero_requests.milli_cpu,
        ),
        "memory" if non_zero => (node.non_zero_requested.memory, pod.non_zero_requests.memory),
        _ => (node.requested.get(name), pod.requests.get(name)),
    };
    if alloc == 0 {
        return None;
    }
    Some((node_req.saturating_add(pod_req), alloc))
}

fn least(requested: i64, capacity: i64) -> i64 {
    if capacity == 0 || requested > capacity {
        return 0;
    }
    (capacity - requested) * MAX_NODE_SCORE / capacity
}

fn most(requested: i64, capacity: i64) -> i64 {
    if capacity == 0 {
        return 0;
    }
    requested.min(capacity) * MAX_NODE_SCORE / capacity
}

fn shape_score(shape: &[(i64, i64)], utilization: i64) -> i64 {
    let first = shape[0];
    if utilization <= first.0 {
        return first.1;
    }
    for w in shape.windows(2) {
        let ((u0, s0), (u1, s1)) = (w[0], w[1]);
        if utilization <= u1 {
            return s0 + (s1 - s0) * (utilization - u0) / (u1 - u0);
        }
    }
    shape[shape.len() - 1].1
}

impl ScorePlugin for NodeResourcesFit {
    fn score(&self, _: &CycleState, pod: &PodInfo, node: &NodeInfo, _: &Snapshot) -> i64 {
        let mut sum = 0i64;
        let mut weights = 0i64;
        for (name, w) in &self.resources {
            let Some((req, cap)) = requested_and_allocatable(pod, node, name, true) else {
                continue;
            };
            let s = match &self.strategy {
                Strategy::LeastAllocated => least(req, cap),
                Strategy::MostAllocated => most(req, cap),
                Strategy::RequestedToCapacityRatio(shape) => {
                    let util = if req > cap {
                        100
                    } else {
                        ((req as i128 * 100) / cap as i128) as i64
                    };
                    shape_score(shape, util)
                }
            };
            sum += s * w;
            weights += w;
        }
        if weights == 0 {
            return 0;
        }
        match self.strategy {
            Strategy::RequestedToCapacityRatio(_) => (sum + weights / 2) / weights,
            _ => sum / weights,
        }
    }
}

#[cfg(test)]
#[allow(clippy::type_complexity)]
mod tests {
    use super::*;
    use crate::framework::Code;
    use crate::plugins::testutil::*;
    use serde_json::json;

    fn node(cpu: &str, mem: &str, pods: &str) -> NodeBuilder {
        NodeBuilder::new("n")
            .allocatable("cpu", cpu)
            .allocatable("memory", mem)
            .allocatable("pods", pods)
    }

    #[test]
    fn a_pod_requesting_more_cpu_than_free_does_not_fit() {
        let existing = PodBuilder::new("old")
            .request("cpu", "3")
            .node_name("n")
            .build();
        let n = node_info(node("4", "8Gi", "110").build(), &[existing]);
        let pod = pod_info(PodBuilder::new("p").request("cpu", "1500m").build());
        let st = NodeResourcesFit::default().filter(
            &CycleState::default(),
            &pod,
            &n,
            &Snapshot::default(),
        );
        assert_eq!(st.code, Code::Unschedulable);
        assert_eq!(st.reasons, vec!["Insufficient cpu"]);
    }

    #[test]
    fn requests_are_checked_resource_by_resource_with_kubernetes_reasons() {
        let cases: Vec<(Vec<(&str, &str)>, Vec<&str>)> = vec![
            (vec![("cpu", "1"), ("memory", "1Gi")], vec![]),
            (vec![("cpu", "5")], vec!["Insufficient cpu"]),
            (vec![("memory", "9Gi")], vec!["Insufficient memory"]),
            (
                vec![("cpu", "5"), ("memory", "9Gi")],
                vec!["Insufficient cpu", "Insufficient memory"],
            ),
            (
                vec![("ephemeral-storage", "1Gi")],
                vec!["Insufficient ephemeral-storage"],
            ),
            (
                vec![("nvidia.com/gpu", "1")],
                vec!["Insufficient nvidia.com/gpu"],
            ),
            (vec![("example.com/widget", "2")], vec![]),
            (
                vec![("example.com/widget", "3")],
                vec!["Insufficient example.com/widget"],
            ),
        ];
        for (reqs, want) in cases {
            let mut b = PodBuilder::new("p");
            for (k, v) in &reqs {
                b = b.request(k, v);
            }
            let n = node_info(
                node("4", "8Gi", "110")
                    .allocatable("example.com/widget", "2")
                    .build(),
                &[],
            );
            let st = NodeResourcesFit::default().filter(
                &CycleState::default(),
                &pod_info(b.build()),
                &n,
                &Snapshot::default(),
            );
            assert_eq!(st.reasons, want, "{reqs:?}");
        }
    }

    #[test]
    fn a_full_node_reports_too_many_pods() {
        let existing = PodBuilder::new("old").node_name("n").build();
        let n = node_info(node("4", "8Gi", "1").build(), &[existing]);
        let st = NodeResourcesFit::default().filter(
            &CycleState::default(),
            &pod_info(PodBuilder::new("p").build()),
            &n,
            &Snapshot::default(),
        );
        assert_eq!(st.reasons, vec!["Too many pods"]);
    }

    #[test]
    fn an_init_container_larger_than_the_containers_sets_the_request_and_overhead_adds() {
        // containers sum to 1 cpu; the init container wants 3; overhead 500m.
        let pod = PodBuilder::new("p")
            .request("cpu", "500m")
            .container_request("cpu", "500m")
            .init_request("cpu", "3")
            .overhead("cpu", "500m")
            .build();
        let info = pod_info(pod);
        assert_eq!(info.requests.milli_cpu, 3500);
        let n = node_info(node("3", "8Gi", "110").build(), &[]);
        let st = NodeResourcesFit::default().filter(
            &CycleState::default(),
            &info,
            &n,
            &Snapshot::default(),
        );
        assert_eq!(st.reasons, vec!["Insufficient cpu"]);
    }

    fn scores(plugin: &NodeResourcesFit, pod: &PodInfo, nodes: &[NodeInfo]) -> Vec<i64> {
        nodes
            .iter()
            .map(|n| plugin.score(&CycleState::default(), pod, n, &Snapshot::default()))
            .collect()
    }

    #[test]
    fn batch_pods_fit_and_score_by_the_reclaimed_capacity_plain_pods_ignore_it() {
        let with_batch = |cpu: &str| {
            node("4", "8Gi", "110")
                .allocatable("skiff.io/batch-cpu", cpu)
                .build()
        };
        let nodes = vec![
            node_info(with_batch("1000"), &[]),
            node_info(with_batch("3000"), &[]),
        ];
        let batch = pod_info(
            PodBuilder::new("b")
                .request("skiff.io/batch-cpu", "1500")
                .build(),
        );
        let fit = NodeResourcesFit::default();
        assert_eq!(
            insufficient(&fit, &batch, &nodes[0]),
            vec!["Insufficient skiff.io/batch-cpu".to_string()]
        );
        assert!(insufficient(&fit, &batch, &nodes[1]).is_empty());
        let s = scores(&fit, &batch, &nodes);
        assert!(s[1] > s[0], "{s:?}");
        // A plain pod scores the same on both: it asks for no batch-cpu.
        let plain = pod_info(PodBuilder::new("p").request("cpu", "1").build());
        let s = scores(&fit, &plain, &nodes);
        assert_eq!(s[0], s[1]);
    }

    #[test]
    fn least_allocated_prefers_the_emptier_node_and_most_allocated_the_fuller() {
        let busy = PodBuilder::new("old")
            .request("cpu", "2")
            .request("memory", "4Gi")
            .node_name("n")
            .build();
        let nodes = vec![
            node_info(node("4", "8Gi", "110").build(), &[]),
            node_info(node("4", "8Gi", "110").build(), &[busy]),
        ];
        let pod = pod_info(
            PodBuilder::new("p")
                .request("cpu", "1")
                .request("memory", "2Gi")
                .build(),
        );
        // empty: cpu (4-1)/4 = 75, mem 75 → 75; busy: cpu (4-3)/4 = 25, mem 25 → 25
        assert_eq!(
            scores(&NodeResourcesFit::default(), &pod, &nodes),
            vec![75, 25]
        );
        let most =
            NodeResourcesFit::from_args(&json!({"scoringStrategy": {"type": "MostAllocated"}}))
                .unwrap();
        assert_eq!(scores(&most, &pod, &nodes), vec![25, 75]);
    }

    #[test]
    fn requested_to_capacity_ratio_follows_the_configured_shape() {
        let args = json!({"scoringStrategy": {"type": "RequestedToCapacityRatio",
            "resources": [{"name": "cpu", "weight": 1}],
            "requestedToCapacityRatio": {"shape": [{"utilization": 0, "score": 10}, {"utilization": 100, "score": 0}]}}});
        let p = NodeResourcesFit::from_args(&args).unwrap();
        let pod = pod_info(PodBuilder::new("p").request("cpu", "1").build());
        let nodes = vec![node_info(node("4", "8Gi", "110").build(), &[])];
        // utilization 25% → 100 - 25 = 75
        assert_eq!(scores(&p, &pod, &nodes), vec![75]);
    }

    #[test]
    fn bad_scoring_args_are_refused_not_panicked_on() {
        for args in [
            json!({"scoringStrategy": {"type": "Nope"}}),
            json!({"scoringStrategy": {"type": "RequestedToCapacityRatio"}}),
            json!({"scoringStrategy": {"type": "RequestedToCapacityRatio", "requestedToCapacityRatio": {"shape": [{"utilization": 50, "score": 1}, {"utilization": 10, "score": 2}]}}}),
            json!({"scoringStrategy": {"resources": [{"name": "cpu", "weight": 0}]}}),
        ] {
            assert!(NodeResourcesFit::from_args(&args).is_err(), "{args}");
        }
    }
}
