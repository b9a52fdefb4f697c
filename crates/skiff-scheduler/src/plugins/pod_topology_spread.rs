//! PodTopologySpread: spreads matching pods evenly over topology domains.
//! DoNotSchedule constraints filter (skew ≤ maxSkew, minDomains);
//! ScheduleAnyway constraints, and the cluster's default constraints for pods
//! selected by a Service, score.

use std::collections::HashMap;

use serde_json::Value;

use crate::cache::Snapshot;
use crate::framework::{
    ClusterEvent, CycleState, FilterPlugin, Plugin, PreFilterPlugin, PreFilterResult,
    PreScorePlugin, ScorePlugin, Status, MAX_NODE_SCORE,
};
use crate::types::{tolerated, NodeInfo, PodInfo, Requirement, SelOp, Selector};

pub const NAME: &str = "PodTopologySpread";
pub const ERR_CONSTRAINTS: &str = "node(s) didn't match pod topology spread constraints";
pub const ERR_MISSING_LABEL: &str =
    "node(s) didn't match pod topology spread constraints (missing required label)";
pub const HOSTNAME: &str = "kubernetes.io/hostname";

#[derive(Debug, Clone)]
pub struct Constraint {
    pub max_skew: i64,
    pub topology_key: String,
    pub selector: Selector,
    pub min_domains: i64,
    pub honor_node_affinity: bool,
    pub honor_taints: bool,
}

#[derive(Debug, Clone)]
struct DefaultConstraint {
    max_skew: i64,
    topology_key: String,
    hard: bool,
}

pub struct PodTopologySpread {
    defaults: Vec<DefaultConstraint>,
}

fn system_defaults() -> Vec<DefaultConstraint> {
    vec![
        DefaultConstraint {
            max_skew: 3,
            topology_key: HOSTNAME.into(),
            hard: false,
        },
        DefaultConstraint {
            max_skew: 5,
            topology_key: "topology.kubernetes.io/zone".into(),
            hard: false,
        },
    ]
}

impl PodTopologySpread {
    pub fn from_args(args: &Value) -> anyhow::Result<PodTopologySpread> {
        let ty = args
            .get("defaultingType")
            .and_then(Value::as_str)
            .unwrap_or("System");
        let listed = args.get("defaultConstraints").and_then(Value::as_array);
        let defaults = match ty {
            "System" => {
                if listed.is_some_and(|l| !l.is_empty()) {
                    anyhow::bail!("defaultConstraints must be empty with defaultingType System");
                }
                system_defaults()
            }
            "List" => {
                let mut out = Vec::new();
                for c in listed.into_iter().flatten() {
                    let max_skew = c.get("maxSkew").and_then(Value::as_i64).unwrap_or(0);
                    if max_skew < 1 {
                        anyhow::bail!("defaultConstraints[].maxSkew must be at least 1");
                    }
                    let key = c
                        .get("topologyKey")
                        .and_then(Value::as_str)
                        .filter(|k| !k.is_empty())
                        .ok_or_else(|| {
                            anyhow::anyhow!("defaultConstraints[].topologyKey is required")
                        })?;
                    if c.get("labelSelector").is_some() {
                        anyhow::bail!("defaultConstraints[].labelSelector must not be set");
                    }
                    out.push(DefaultConstraint {
                        max_skew,
                        topology_key: key.to_string(),
                        hard: c.get("whenUnsatisfiable").and_then(Value::as_str)
                            == Some("DoNotSchedule"),
                    });
                }
                out
            }
            other => anyhow::bail!("unknown defaultingType {other:?}"),
        };
        Ok(PodTopologySpread { defaults })
    }

    /// The pod's constraints (hard or soft), or the defaults if it has none.
    pub fn constraints(&self, pod: &PodInfo, snap: &Snapshot, hard: bool) -> Vec<Constraint> {
        let spec_constraints = pod
            .pod
            .spec
            .as_ref()
            .and_then(|s| s.topology_spread_constraints.as_ref())
            .filter(|c| !c.is_empty());
        let labels = pod.labels();
        if let Some(list) = spec_constraints {
            let want = if hard {
                "DoNotSchedule"
            } else {
                "ScheduleAnyway"
            };
            return list
                .iter()
                .filter(|c| c.when_unsatisfiable == want)
                .map(|c| {
                    let mut selector = Selector::from_label_selector(c.label_selector.as_ref());
                    if !selector.never {
                        for k in c.match_label_keys.iter().flatten() {
                            if let Some(v) = labels.and_then(|l| l.get(k)) {
                                selector.reqs.push(Requirement {
                                    key: k.clone(),
                                    op: SelOp::In,
                                    values: vec![v.clone()],
                                });
                            }
                        }
                    }
                    Constraint {
                        max_skew: c.max_skew.max(1) as i64,
                        topology_key: c.topology_key.clone(),
                        selector,
                        min_domains: c.min_domains.unwrap_or(1).max(1) as i64,
                        honor_node_affinity: c.node_affinity_policy.as_deref() != Some("Ignore"),
                        honor_taints: c.node_taints_policy.as_deref() == Some("Honor"),
                    }
                })
                .collect();
        }
        // Defaults: only for pods selected by a Service (their spread matters).
        let selector = snap.service_selector_for(pod);
        let Some(selector) = selector else {
            return vec![];
        };
        self.defaults
            .iter()
            .filter(|d| d.hard == hard)
            .map(|d| Constraint {
                max_skew: d.max_skew,
                topology_key: d.topology_key.clone(),
                selector: selector.clone(),
                min_domains: 1,
                honor_node_affinity: true,
                honor_taints: false,
            })
            .collect()
    }
}

impl Plugin for PodTopologySpread {
    fn name(&self) -> &'static str {
        NAME
    }
    fn events(&self) -> &'static [ClusterEvent] {
        &[
            ClusterEvent::NodeAdd,
            ClusterEvent::NodeLabelChange,
            ClusterEvent::NodeTaintChange,
            ClusterEvent::AssignedPodAdd,
            ClusterEvent::AssignedPodUpdate,
            ClusterEvent::AssignedPodDelete,
        ]
    }
    fn as_pre_filter(&self) -> Option<&dyn PreFilterPlugin> {
        Some(self)
    }
    fn as_filter(&self) -> Option<&dyn FilterPlugin> {
        Some(self)
    }
    fn as_pre_score(&self) -> Option<&dyn PreScorePlugin> {
        Some(self)
    }
    fn as_score(&self) -> Option<&dyn ScorePlugin> {
        Some(self)
    }
}

fn node_in_scope(c: &Constraint, pod: &PodInfo, node: &NodeInfo) -> bool {
    if c.honor_node_affinity && !pod.node_affinity.matches(&node.name, node.labels()) {
        return false;
    }
    if c.honor_taints {
        let tols = pod.tolerations();
        if node
            .taints
            .iter()
            .any(|t| (t.effect == "NoSchedule" || t.effect == "NoExecute") && !tolerated(tols, t))
        {
            return false;
        }
    }
    true
}

fn has_all_keys(cs: &[Constraint], node: &NodeInfo) -> bool {
    cs.iter().all(|c| node.label(&c.topology_key).is_some())
}

fn count_matching(c: &Constraint, ns: &str, node: &NodeInfo) -> i64 {
    node.pods
        .iter()
        .filter(|p| !p.terminating && p.namespace == ns && c.selector.matches(p.labels()))
        .count() as i64
}

#[derive(Clone, Debug)]
struct FilterState {
    constraints: Vec<Constraint>,
    /// Per constraint: domain value → matching pods.
    counts: Vec<HashMap<String, i64>>,
}

impl FilterState {
    fn min_match(&self, i: usize) -> i64 {
        let c = &self.constraints[i];
        let m = &self.counts[i];
        if (m.len() as i64) < c.min_domains {
            return 0;
        }
        m.values().copied().min().unwrap_or(0)
    }

    fn update(&mut self, pod: &PodInfo, other: &PodInfo, node: &NodeInfo, delta: i64) {
        if other.namespace != pod.namespace || !has_all_keys(&self.constraints, node) {
            return;
        }
        for (i, c) in self.constraints.iter().enumerate() {
            if !node_in_scope(c, pod, node) || !c.selector.matches(other.labels()) {
                continue;
            }
            if let Some(v) = node.label(&c.topology_key) {
                *self.counts[i].entry(v.to_string()).or_insert(0) += delta;
            }
        }
    }
}

impl PreFilterPlugin for PodTopologySpread {
    fn pre_filter(
        &self,
        state: &mut CycleState,
        pod: &PodInfo,
        snap: &Snapshot,
    ) -> (PreFilterResult, Status) {
        let constraints = self.constraints(pod, snap, true);
        if constraints.is_empty() {
            return (None, Status::skip());
        }
        let mut counts = vec![HashMap::new(); constraints.len()];
        for node in snap.real_nodes() {
            if !has_all_keys(&constraints, node) {
                continue;
            }
            for (i, c) in constraints.iter().enumerate() {
                if !node_in_scope(c, pod, node) {
                    continue;
                }
                let v = node.label(&c.topology_key).unwrap_or_default();
                let n = count_matching(c, &pod.namespace, node);
                *counts[i].entry(v.to_string()).or_insert(0) += n;
            }
        }
        state.write(
            NAME,
            FilterState {
                constraints,
                counts,
            },
        );
        (None, Status::success())
    }

    fn has_extensions(&self) -> bool {
        true
    }

    fn add_pod(
        &self,
        state: &mut CycleState,
        pod: &PodInfo,
        added: &PodInfo,
        node: &NodeInfo,
        _: &Snapshot,
    ) {
        if let Some(st) = state.read_mut::<FilterState>(NAME) {
            st.update(pod, added, node, 1);
        }
    }

    fn remove_pod(
        &self,
        state: &mut CycleState,
        pod: &PodInfo,
        removed: &PodInfo,
        node: &NodeInfo,
        _: &Snapshot,
    ) {
        if let Some(st) = state.read_mut::<FilterState>(NAME) {
            st.update(pod, removed, node, -1);
        }
    }
}

impl FilterPlugin for PodTopologySpread {
    fn filter(&self, state: &CycleState, pod: &PodInfo, node: &NodeInfo, _: &Snapshot) -> Status {
        let Some(st) = state.read::<FilterState>(NAME) else {
            return Status::success();
        };
        for (i, c) in st.constraints.iter().enumerate() {
            let Some(v) = node.label(&c.topology_key) else {
                return Status::unresolvable(ERR_MISSING_LABEL);
            };
            let self_match = c.selector.matches(pod.labels()) as i64;
            let matched = st.counts[i].get(v).copied().unwrap_or(0);
            let skew = matched + self_match - st.min_match(i);
            if skew > c.max_skew {
                return Status::unschedulable(ERR_CONSTRAINTS);
            }
        }
        Status::success()
    }
}

#[derive(Clone)]
struct ScoreState {
    constraints: Vec<Constraint>,
    counts: Vec<HashMap<String, i64>>,
    weights: Vec<f64>,
}

impl PreScorePlugin for PodTopologySpread {
    fn pre_score(
        &self,
        state: &mut CycleState,
        pod: &PodInfo,
        nodes: &[&NodeInfo],
        snap: &Snapshot,
    ) -> Status {
        let constraints = self.constraints(pod, snap, false);
        if constraints.is_empty() {
            return Status::skip();
        }
        let mut counts: Vec<HashMap<String, i64>> = vec![HashMap::new(); constraints.len()];
        let mut host_domains = 0usize;
        // Domains of the candidate nodes.
        for n in nodes {
            if !has_all_keys(&constraints, n) {
                continue;
            }
            host_domains += 1;
            for (i, c) in constraints.iter().enumerate() {
                if c.topology_key == HOSTNAME {
                    continue;
                }
                if let Some(v) = n.label(&c.topology_key) {
                    counts[i].entry(v.to_string()).or_insert(0);
                }
            }
        }
        // Matching pods in those domains, over all nodes in scope.
        for node in snap.real_nodes() {
            if !has_all_keys(&constraints, node) {
                continue;
            }
            for (i, c) in constraints.iter().enumerate() {
                if c.topology_key == HOSTNAME || !node_in_scope(c, pod, node) {
                    continue;
                }
                let v = node.label(&c.topology_key).unwrap_or_default();
                if let Some(slot) = counts[i].get_mut(v) {
                    *slot += count_matching(c, &pod.namespace, node);
                }
            }
        }
        let weights = constraints
            .iter()
            .enumerate()
            .map(|(i, c)| {
                let size = if c.topology_key == HOSTNAME {
                    host_domains
                } else {
                    counts[i].len()
                };
                ((size + 2) as f64).ln()
            })
            .collect();
        state.write(
            NAME,
            ScoreState {
                constraints,
                counts,
                weights,
            },
        );
        Status::success()
    }
}

impl ScorePlugin for PodTopologySpread {
    fn score(&self, state: &CycleState, pod: &PodInfo, node: &NodeInfo, _: &Snapshot) -> i64 {
        let Some(st) = state.read::<ScoreState>(NAME) else {
            return 0;
        };
        if !has_all_keys(&st.constraints, node) {
            return -1; // ignored: scores 0 after normalization
        }
        let mut score = 0f64;
        for (i, c) in st.constraints.iter().enumerate() {
            let cnt = if c.topology_key == HOSTNAME {
                if node_in_scope(c, pod, node) {
                    count_matching(c, &pod.namespace, node)
                } else {
                    0
                }
            } else {
                node.label(&c.topology_key)
                    .and_then(|v| st.counts[i].get(v))
                    .copied()
                    .unwrap_or(0)
            };
            score += cnt as f64 * st.weights[i] + (c.max_skew - 1) as f64;
        }
        score.round() as i64
    }

    fn normalize(&self, _: &CycleState, _: &PodInfo, scores: &mut [i64]) {
        let valid = scores.iter().copied().filter(|s| *s >= 0);
        let (min, max) = valid.fold((i64::MAX, i64::MIN), |(lo, hi), s| (lo.min(s), hi.max(s)));
        for s in scores.iter_mut() {
            if *s < 0 {
                *s = 0;
            } else if max == 0 {
                *s = MAX_NODE_SCORE;
            } else {
                *s = MAX_NODE_SCORE * (max + min - *s) / max;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cache::Cache;
    use crate::framework::Code;
    use crate::plugins::testutil::*;
    use serde_json::json;

    fn spread(key: &str, skew: i32, when: &str) -> serde_json::Value {
        json!({"maxSkew": skew, "topologyKey": key, "whenUnsatisfiable": when, "labelSelector": {"matchLabels": {"app": "web"}}})
    }

    fn cluster(pods_per_node: &[(&str, &str, usize)]) -> Cache {
        let mut c = Cache::new();
        for (n, zone, count) in pods_per_node {
            let mut nb = NodeBuilder::new(n).label(HOSTNAME, n);
            if !zone.is_empty() {
                nb = nb.label("zone", zone);
            }
            c.upsert_node(nb.build());
            for i in 0..*count {
                c.add_or_update_bound_pod(pod_info(
                    PodBuilder::new(&format!("{n}-{i}"))
                        .label("app", "web")
                        .node_name(n)
                        .build(),
                ));
            }
        }
        c
    }

    fn filter(c: &Cache, pod: &PodInfo, node: &str) -> Code {
        let p = PodTopologySpread::from_args(&json!({})).unwrap();
        let mut state = CycleState::default();
        let (_, st) = p.pre_filter(&mut state, pod, &c.snap);
        assert!(st.is_success());
        p.filter(&state, pod, c.snap.node(node).unwrap(), &c.snap)
            .code
    }

    #[test]
    fn a_pod_that_would_raise_the_skew_above_max_skew_does_not_fit() {
        let c = cluster(&[("n1", "a", 2), ("n2", "a", 0), ("n3", "b", 1)]);
        let pod = pod_info(
            PodBuilder::new("new")
                .label("app", "web")
                .spread(spread("zone", 1, "DoNotSchedule"))
                .build(),
        );
        // zone a has 2, zone b has 1: adding to a → skew 3-1 = 2 > 1
        assert_eq!(filter(&c, &pod, "n1"), Code::Unschedulable);
        assert_eq!(filter(&c, &pod, "n2"), Code::Unschedulable);
        assert_eq!(filter(&c, &pod, "n3"), Code::Success);
    }

    #[test]
    fn a_node_without_the_topology_label_is_unresolvable() {
        let c = cluster(&[("n1", "a", 0), ("bare", "", 0)]);
        let pod = pod_info(
            PodBuilder::new("new")
                .label("app", "web")
                .spread(spread("zone", 1, "DoNotSchedule"))
                .build(),
        );
        assert_eq!(filter(&c, &pod, "bare"), Code::UnschedulableAndUnresolvable);
    }

    #[test]
    fn min_domains_counts_missing_domains_as_empty() {
        let c = cluster(&[("n1", "a", 1), ("n2", "b", 1)]);
        let mut s = spread("zone", 1, "DoNotSchedule");
        s["minDomains"] = json!(3);
        let pod = pod_info(PodBuilder::new("new").label("app", "web").spread(s).build());
        // only 2 domains < 3: global minimum is 0, so 1 + 1 - 0 = 2 > 1
        assert_eq!(filter(&c, &pod, "n1"), Code::Unschedulable);
        let pod = pod_info(
            PodBuilder::new("new")
                .label("app", "web")
                .spread(spread("zone", 1, "DoNotSchedule"))
                .build(),
        );
        assert_eq!(filter(&c, &pod, "n1"), Code::Success);
    }

    #[test]
    fn node_affinity_policy_honor_leaves_out_nodes_the_pod_cannot_use() {
        let c = cluster(&[("n1", "a", 0), ("n2", "b", 3)]);
        // The pod may only go to zone a nodes: zone b is out of scope, so its 3 pods don't count.
        let pod = pod_info(
            PodBuilder::new("new")
                .label("app", "web")
                .node_selector("zone", "a")
                .spread(spread("zone", 1, "DoNotSchedule"))
                .build(),
        );
        assert_eq!(filter(&c, &pod, "n1"), Code::Success);
        let mut s = spread("zone", 1, "DoNotSchedule");
        s["nodeAffinityPolicy"] = json!("Ignore");
        let pod = pod_info(
            PodBuilder::new("new")
                .label("app", "web")
                .node_selector("zone", "a")
                .spread(s)
                .build(),
        );
        // with Ignore, zone b counts: min is 0 (zone a) so 0+1-0 = 1 ≤ 1 still fits in a
        assert_eq!(filter(&c, &pod, "n1"), Code::Success);
    }

    #[test]
    fn schedule_anyway_prefers_the_emptier_domain() {
        let c = cluster(&[("n1", "a", 3), ("n2", "b", 0)]);
        let pod = pod_info(
            PodBuilder::new("new")
                .label("app", "web")
                .spread(spread("zone", 1, "ScheduleAnyway"))
                .build(),
        );
        let p = PodTopologySpread::from_args(&json!({})).unwrap();
        let nodes: Vec<&NodeInfo> = ["n1", "n2"]
            .iter()
            .map(|n| c.snap.node(n).unwrap())
            .collect();
        let mut state = CycleState::default();
        assert!(p.pre_score(&mut state, &pod, &nodes, &c.snap).is_success());
        let mut s: Vec<i64> = nodes
            .iter()
            .map(|n| p.score(&state, &pod, n, &c.snap))
            .collect();
        p.normalize(&state, &pod, &mut s);
        assert!(s[1] > s[0], "{s:?}");
        assert_eq!(s[1], 100);
    }

    #[test]
    fn invalid_default_constraints_are_refused() {
        assert!(PodTopologySpread::from_args(&json!({"defaultingType": "List", "defaultConstraints": [{"maxSkew": 0, "topologyKey": "zone"}]})).is_err());
        assert!(PodTopologySpread::from_args(&json!({"defaultingType": "Weird"})).is_err());
    }
}
