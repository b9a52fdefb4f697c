//! InterPodAffinity: required pod affinity and anti-affinity (of the pod,
//! and of the pods already placed) filter nodes by topology domain;
//! preferred terms score them.

use std::collections::HashMap;

use serde_json::Value;

use crate::cache::Snapshot;
use crate::framework::{
    ClusterEvent, CycleState, FilterPlugin, Plugin, PreFilterPlugin, PreFilterResult,
    PreScorePlugin, ScorePlugin, Status, MAX_NODE_SCORE,
};
use crate::types::{AffinityTerm, Labels, NodeInfo, PodInfo};

pub const NAME: &str = "InterPodAffinity";
pub const ERR_AFFINITY: &str = "node(s) didn't match pod affinity rules";
pub const ERR_ANTI_AFFINITY: &str = "node(s) didn't match pod anti-affinity rules";
pub const ERR_EXISTING_ANTI_AFFINITY: &str =
    "node(s) didn't satisfy existing pods anti-affinity rules";

pub struct InterPodAffinity {
    pub hard_pod_affinity_weight: i64,
}

impl InterPodAffinity {
    pub fn from_args(args: &Value) -> anyhow::Result<InterPodAffinity> {
        let w = args
            .get("hardPodAffinityWeight")
            .and_then(Value::as_i64)
            .unwrap_or(1);
        if !(0..=100).contains(&w) {
            anyhow::bail!("hardPodAffinityWeight must be in 0..=100, got {w}");
        }
        Ok(InterPodAffinity {
            hard_pod_affinity_weight: w,
        })
    }
}

impl Plugin for InterPodAffinity {
    fn name(&self) -> &'static str {
        NAME
    }
    fn events(&self) -> &'static [ClusterEvent] {
        &[
            ClusterEvent::NodeAdd,
            ClusterEvent::NodeLabelChange,
            ClusterEvent::AssignedPodAdd,
            ClusterEvent::AssignedPodUpdate,
            ClusterEvent::AssignedPodDelete,
            ClusterEvent::NamespaceChange,
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

/// topology key → value → count.
#[derive(Clone, Default, Debug)]
pub struct TopologyCounts(HashMap<String, HashMap<String, i64>>);

impl TopologyCounts {
    fn add(&mut self, key: &str, value: &str, n: i64) {
        // Look up before allocating: most adds hit existing entries.
        if let Some(m) = self.0.get_mut(key) {
            if let Some(c) = m.get_mut(value) {
                *c += n;
            } else {
                m.insert(value.to_string(), n);
            }
            return;
        }
        let m = self.0.entry(key.to_string()).or_default();
        m.insert(value.to_string(), n);
    }
    fn get(&self, key: &str, value: &str) -> i64 {
        self.0
            .get(key)
            .and_then(|m| m.get(value))
            .copied()
            .unwrap_or(0)
    }
    fn any_positive(&self) -> bool {
        self.0.values().any(|m| m.values().any(|c| *c > 0))
    }
    /// Whether any of the node's (label, value) pairs has a positive count.
    fn hits_node(&self, labels: Option<&Labels>) -> bool {
        let Some(labels) = labels else { return false };
        self.0.iter().any(|(k, vals)| {
            labels
                .get(k)
                .is_some_and(|v| vals.get(v).is_some_and(|c| *c > 0))
        })
    }
}

#[derive(Clone, Default, Debug)]
struct FilterState {
    existing_anti: TopologyCounts,
    affinity: TopologyCounts,
    anti: TopologyCounts,
}

fn matches_all(terms: &[AffinityTerm], p: &PodInfo, ns: &HashMap<String, Labels>) -> bool {
    terms.iter().all(|t| t.matches(p, ns))
}

fn update_with(
    st: &mut FilterState,
    incoming: &PodInfo,
    existing: &PodInfo,
    node: &NodeInfo,
    ns: &HashMap<String, Labels>,
    m: i64,
) {
    let Some(labels) = node.labels() else { return };
    for t in &existing.affinity.required_anti_affinity {
        if let Some(v) = labels.get(&t.topology_key) {
            if t.matches(incoming, ns) {
                st.existing_anti.add(&t.topology_key, v, m);
            }
        }
    }
    let aff = &incoming.affinity;
    if !aff.required_affinity.is_empty() && matches_all(&aff.required_affinity, existing, ns) {
        for t in &aff.required_affinity {
            if let Some(v) = labels.get(&t.topology_key) {
                st.affinity.add(&t.topology_key, v, m);
            }
        }
    }
    for t in &aff.required_anti_affinity {
        if let Some(v) = labels.get(&t.topology_key) {
            if t.matches(existing, ns) {
                st.anti.add(&t.topology_key, v, m);
            }
        }
    }
}

impl PreFilterPlugin for InterPodAffinity {
    fn pre_filter(
        &self,
        state: &mut CycleState,
        pod: &PodInfo,
        snap: &Snapshot,
    ) -> (PreFilterResult, Status) {
        let aff = &pod.affinity;
        let own = !aff.required_affinity.is_empty() || !aff.required_anti_affinity.is_empty();
        if !own && snap.pods_with_required_anti_affinity == 0 {
            return (None, Status::skip());
        }
        let mut st = FilterState::default();
        for node in snap.real_nodes() {
            if !own && node.pods_with_required_anti_affinity == 0 {
                continue;
            }
            for existing in &node.pods {
                if !own && existing.affinity.required_anti_affinity.is_empty() {
                    continue;
                }
                update_with(&mut st, pod, existing, node, &snap.namespaces, 1);
            }
        }
        state.write(NAME, st);
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
        snap: &Snapshot,
    ) {
        if let Some(st) = state.read_mut::<FilterState>(NAME) {
            update_with(st, pod, added, node, &snap.namespaces, 1);
        }
    }

    fn remove_pod(
        &self,
        state: &mut CycleState,
        pod: &PodInfo,
        removed: &PodInfo,
        node: &NodeInfo,
        snap: &Snapshot,
    ) {
        if let Some(st) = state.read_mut::<FilterState>(NAME) {
            update_with(st, pod, removed, node, &snap.namespaces, -1);
        }
    }
}

impl FilterPlugin for InterPodAffinity {
    fn filter(
        &self,
        state: &CycleState,
        pod: &PodInfo,
        node: &NodeInfo,
        snap: &Snapshot,
    ) -> Status {
        let Some(st) = state.read::<FilterState>(NAME) else {
            return Status::success();
        };
        if st.existing_anti.hits_node(node.labels()) {
            return Status::unschedulable(ERR_EXISTING_ANTI_AFFINITY);
        }
        for t in &pod.affinity.required_anti_affinity {
            if let Some(v) = node.label(&t.topology_key) {
                if st.anti.get(&t.topology_key, v) > 0 {
                    return Status::unschedulable(ERR_ANTI_AFFINITY);
                }
            }
        }
        let terms = &pod.affinity.required_affinity;
        if !terms.is_empty() {
            let mut pods_exist = true;
            for t in terms {
                match node.label(&t.topology_key) {
                    Some(v) => {
                        if st.affinity.get(&t.topology_key, v) <= 0 {
                            pods_exist = false;
                        }
                    }
                    None => return Status::unresolvable(ERR_AFFINITY),
                }
            }
            // The first pod of a group with affinity to itself may go
            // anywhere its topology keys exist.
            if !pods_exist
                && (st.affinity.any_positive() || !matches_all(terms, pod, &snap.namespaces))
            {
                return Status::unresolvable(ERR_AFFINITY);
            }
        }
        Status::success()
    }
}

#[derive(Clone, Default)]
struct ScoreState(TopologyCounts);

impl InterPodAffinity {
    fn score_existing(
        &self,
        scores: &mut TopologyCounts,
        pod: &PodInfo,
        existing: &PodInfo,
        node: &NodeInfo,
        ns: &HashMap<String, Labels>,
    ) {
        let Some(labels) = node.labels() else { return };
        let mut add = |t: &AffinityTerm, target: &PodInfo, w: i64| {
            if w == 0 {
                return;
            }
            if let Some(v) = labels.get(&t.topology_key) {
                if t.matches(target, ns) {
                    scores.add(&t.topology_key, v, w);
                }
            }
        };
        for t in &pod.affinity.preferred_affinity {
            add(t, existing, t.weight as i64);
        }
        for t in &pod.affinity.preferred_anti_affinity {
            add(t, existing, -(t.weight as i64));
        }
        for t in &existing.affinity.required_affinity {
            add(t, pod, self.hard_pod_affinity_weight);
        }
        for t in &existing.affinity.preferred_affinity {
            add(t, pod, t.weight as i64);
        }
        for t in &existing.affinity.preferred_anti_affinity {
            add(t, pod, -(t.weight as i64));
        }
    }
}

impl PreScorePlugin for InterPodAffinity {
    fn pre_score(
        &self,
        state: &mut CycleState,
        pod: &PodInfo,
        _: &[&NodeInfo],
        snap: &Snapshot,
    ) -> Status {
        let has_preferred = !pod.affinity.preferred_affinity.is_empty()
            || !pod.affinity.preferred_anti_affinity.is_empty();
        if !has_preferred && snap.pods_with_affinity == 0 {
            return Status::skip();
        }
        let mut scores = TopologyCounts::default();
        for node in snap.real_nodes() {
            if !has_preferred && node.pods_with_affinity == 0 {
                continue;
            }
            for existing in &node.pods {
                if !has_preferred && existing.affinity.is_empty() {
                    continue;
                }
                self.score_existing(&mut scores, pod, existing, node, &snap.namespaces);
            }
        }
        if scores.0.is_empty() {
            return Status::skip();
        }
        state.write(NAME, ScoreState(scores));
        Status::success()
    }
}

impl ScorePlugin for InterPodAffinity {
    fn score(&self, state: &CycleState, _: &PodInfo, node: &NodeInfo, _: &Snapshot) -> i64 {
        let (Some(st), Some(labels)) = (state.read::<ScoreState>(NAME), node.labels()) else {
            return 0;
        };
        st.0 .0
            .iter()
            .filter_map(|(k, vals)| labels.get(k).and_then(|v| vals.get(v)))
            .sum()
    }
    fn normalize(&self, _: &CycleState, _: &PodInfo, scores: &mut [i64]) {
        let max = scores.iter().copied().max().unwrap_or(0);
        let min = scores.iter().copied().min().unwrap_or(0);
        let diff = max - min;
        for s in scores.iter_mut() {
            *s = if diff > 0 {
                MAX_NODE_SCORE * (*s - min) / diff
            } else {
                0
            };
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

    fn cluster(pods: Vec<k8s_openapi::api::core::v1::Pod>) -> Cache {
        let mut c = Cache::new();
        for (n, zone) in [("n1", "a"), ("n2", "a"), ("n3", "b")] {
            c.upsert_node(
                NodeBuilder::new(n)
                    .label("zone", zone)
                    .label("kubernetes.io/hostname", n)
                    .build(),
            );
        }
        for p in pods {
            c.add_or_update_bound_pod(pod_info(p));
        }
        c
    }

    fn filter_all(c: &Cache, pod: &PodInfo) -> Vec<(String, Code)> {
        let p = InterPodAffinity::from_args(&json!({})).unwrap();
        let mut state = CycleState::default();
        let (_, st) = p.pre_filter(&mut state, pod, &c.snap);
        let mut out: Vec<(String, Code)> = ["n1", "n2", "n3"]
            .iter()
            .map(|n| {
                let code = if st.is_skip() {
                    Code::Success
                } else {
                    p.filter(&state, pod, c.snap.node(n).unwrap(), &c.snap).code
                };
                (n.to_string(), code)
            })
            .collect();
        out.sort();
        out
    }

    fn term(key: &str, labels: serde_json::Value) -> serde_json::Value {
        json!({"labelSelector": {"matchLabels": labels}, "topologyKey": key})
    }

    #[test]
    fn required_affinity_places_the_pod_in_the_zone_of_the_matching_pods() {
        let c = cluster(vec![PodBuilder::new("db")
            .label("app", "db")
            .node_name("n3")
            .build()]);
        let pod = pod_info(PodBuilder::new("web").affinity(json!({"podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [term("zone", json!({"app": "db"}))]}})).build());
        let got = filter_all(&c, &pod);
        assert_eq!(
            got,
            vec![
                ("n1".into(), Code::UnschedulableAndUnresolvable),
                ("n2".into(), Code::UnschedulableAndUnresolvable),
                ("n3".into(), Code::Success),
            ]
        );
    }

    #[test]
    fn the_first_pod_of_a_self_affine_group_may_go_anywhere() {
        let c = cluster(vec![]);
        let pod = pod_info(PodBuilder::new("web").label("app", "web").affinity(json!({"podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [term("zone", json!({"app": "web"}))]}})).build());
        assert!(filter_all(&c, &pod)
            .iter()
            .all(|(_, c)| *c == Code::Success));
    }

    #[test]
    fn required_anti_affinity_keeps_the_pod_out_of_domains_with_matching_pods() {
        let c = cluster(vec![PodBuilder::new("web-1")
            .label("app", "web")
            .node_name("n1")
            .build()]);
        let pod = pod_info(PodBuilder::new("web-2").label("app", "web").affinity(json!({"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [term("zone", json!({"app": "web"}))]}})).build());
        assert_eq!(
            filter_all(&c, &pod),
            vec![
                ("n1".into(), Code::Unschedulable),
                ("n2".into(), Code::Unschedulable),
                ("n3".into(), Code::Success),
            ]
        );
    }

    #[test]
    fn an_existing_pods_anti_affinity_keeps_matching_newcomers_away() {
        let c = cluster(vec![PodBuilder::new("loner").affinity(json!({"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [term("kubernetes.io/hostname", json!({"app": "noisy"}))]}})).node_name("n2").build()]);
        let noisy = pod_info(PodBuilder::new("noisy").label("app", "noisy").build());
        let got = filter_all(&c, &noisy);
        assert_eq!(got[1], ("n2".into(), Code::Unschedulable));
        assert_eq!(got[0].1, Code::Success);
        let quiet = pod_info(PodBuilder::new("quiet").label("app", "quiet").build());
        assert!(filter_all(&c, &quiet)
            .iter()
            .all(|(_, c)| *c == Code::Success));
    }

    #[test]
    fn terms_only_see_pods_in_their_namespaces() {
        let c = cluster(vec![PodBuilder::new("web-1")
            .namespace("other")
            .label("app", "web")
            .node_name("n1")
            .build()]);
        let anti = json!({"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [term("kubernetes.io/hostname", json!({"app": "web"}))]}});
        let same_ns = pod_info(PodBuilder::new("web-2").affinity(anti.clone()).build());
        assert!(filter_all(&c, &same_ns)
            .iter()
            .all(|(_, c)| *c == Code::Success));
        let mut t = term("kubernetes.io/hostname", json!({"app": "web"}));
        t["namespaces"] = json!(["other"]);
        let listed = pod_info(PodBuilder::new("web-3").affinity(json!({"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [t]}})).build());
        assert_eq!(filter_all(&c, &listed)[0].1, Code::Unschedulable);
        let mut t = term("kubernetes.io/hostname", json!({"app": "web"}));
        t["namespaceSelector"] = json!({});
        let all_ns = pod_info(PodBuilder::new("web-4").affinity(json!({"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [t]}})).build());
        assert_eq!(filter_all(&c, &all_ns)[0].1, Code::Unschedulable);
    }

    #[test]
    fn preferred_affinity_scores_nodes_in_the_matching_domain_highest() {
        let c = cluster(vec![PodBuilder::new("cache")
            .label("app", "cache")
            .node_name("n3")
            .build()]);
        let pod = pod_info(PodBuilder::new("web").affinity(json!({"podAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [{"weight": 50, "podAffinityTerm": term("zone", json!({"app": "cache"}))}]}})).build());
        let p = InterPodAffinity::from_args(&json!({})).unwrap();
        let nodes: Vec<&NodeInfo> = ["n1", "n2", "n3"]
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
        assert_eq!(s, vec![0, 0, 100]);
    }
}
