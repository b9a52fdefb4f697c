//! NodeAffinity: `nodeSelector` and required node affinity filter nodes;
//! preferred node affinity terms add their weights to a node's score.

use std::collections::HashSet;

use serde_json::Value;

use crate::cache::Snapshot;
use crate::framework::{
    default_normalize, ClusterEvent, CycleState, FilterPlugin, Plugin, PreFilterPlugin,
    PreFilterResult, PreScorePlugin, ScorePlugin, Status,
};
use crate::types::{NodeInfo, NodeTerm, PodInfo, RequiredNodeAffinity, SelOp};

pub const NAME: &str = "NodeAffinity";
pub const ERR_REASON: &str = "node(s) didn't match Pod's node affinity/selector";

/// Args: `addedAffinity` (a NodeAffinity every pod of the profile must also
/// satisfy).
#[derive(Default)]
pub struct NodeAffinity {
    added_required: Option<Vec<NodeTerm>>,
    added_preferred: Vec<(i32, NodeTerm)>,
}

impl NodeAffinity {
    pub fn from_args(args: &Value) -> anyhow::Result<NodeAffinity> {
        let mut out = NodeAffinity::default();
        if let Some(a) = args.get("addedAffinity").filter(|v| !v.is_null()) {
            let aff: k8s_openapi::api::core::v1::NodeAffinity =
                serde_json::from_value(a.clone())
                    .map_err(|e| anyhow::anyhow!("NodeAffinity args.addedAffinity: {e}"))?;
            out.added_required = aff
                .required_during_scheduling_ignored_during_execution
                .map(|r| {
                    r.node_selector_terms
                        .iter()
                        .map(NodeTerm::compile)
                        .collect()
                });
            out.added_preferred = aff
                .preferred_during_scheduling_ignored_during_execution
                .unwrap_or_default()
                .iter()
                .map(|p| (p.weight, NodeTerm::compile(&p.preference)))
                .collect();
        }
        Ok(out)
    }
}

impl Plugin for NodeAffinity {
    fn name(&self) -> &'static str {
        NAME
    }
    fn events(&self) -> &'static [ClusterEvent] {
        &[ClusterEvent::NodeAdd, ClusterEvent::NodeLabelChange]
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

/// Node names a term allows by `metadata.name In`, if it restricts them.
fn term_names(t: &NodeTerm) -> Option<HashSet<String>> {
    let mut out: Option<HashSet<String>> = None;
    for f in &t.fields {
        if f.op == SelOp::In {
            let set: HashSet<String> = f.values.iter().cloned().collect();
            out = Some(match out {
                None => set,
                Some(prev) => prev.intersection(&set).cloned().collect(),
            });
        }
    }
    out
}

impl PreFilterPlugin for NodeAffinity {
    fn pre_filter(
        &self,
        _: &mut CycleState,
        pod: &PodInfo,
        _: &Snapshot,
    ) -> (PreFilterResult, Status) {
        if pod.node_affinity.is_empty() && self.added_required.is_none() {
            return (None, Status::skip());
        }
        // If every required term names its nodes, only those can fit.
        if let Some(terms) = &pod.node_affinity.terms {
            let mut union = HashSet::new();
            for t in terms {
                match term_names(t) {
                    Some(names) => union.extend(names),
                    None => return (None, Status::success()),
                }
            }
            if union.is_empty() {
                return (
                    None,
                    Status::unresolvable(
                        "node(s) didn't match Pod's node affinity/selector (no node name matches)",
                    ),
                );
            }
            return (Some(union), Status::success());
        }
        (None, Status::success())
    }
}

impl FilterPlugin for NodeAffinity {
    fn filter(&self, _: &CycleState, pod: &PodInfo, node: &NodeInfo, _: &Snapshot) -> Status {
        if let Some(terms) = &self.added_required {
            if !terms.iter().any(|t| t.matches(&node.name, node.labels())) {
                return Status::unresolvable(
                    "node(s) didn't match scheduler-enforced node affinity",
                );
            }
        }
        if pod.node_affinity.matches(&node.name, node.labels()) {
            Status::success()
        } else {
            Status::unresolvable(ERR_REASON)
        }
    }
}

#[derive(Clone)]
struct Preferred(Vec<(i32, NodeTerm)>);

impl PreScorePlugin for NodeAffinity {
    fn pre_score(
        &self,
        state: &mut CycleState,
        pod: &PodInfo,
        _: &[&NodeInfo],
        _: &Snapshot,
    ) -> Status {
        let mut terms = self.added_preferred.clone();
        if let Some(na) = pod
            .pod
            .spec
            .as_ref()
            .and_then(|s| s.affinity.as_ref())
            .and_then(|a| a.node_affinity.as_ref())
        {
            for p in na
                .preferred_during_scheduling_ignored_during_execution
                .iter()
                .flatten()
            {
                if p.weight != 0 {
                    terms.push((p.weight, NodeTerm::compile(&p.preference)));
                }
            }
        }
        if terms.is_empty() {
            return Status::skip();
        }
        state.write(NAME, Preferred(terms));
        Status::success()
    }
}

impl ScorePlugin for NodeAffinity {
    fn score(&self, state: &CycleState, _: &PodInfo, node: &NodeInfo, _: &Snapshot) -> i64 {
        let Some(p) = state.read::<Preferred>(NAME) else {
            return 0;
        };
        p.0.iter()
            .filter(|(_, t)| t.matches(&node.name, node.labels()))
            .map(|(w, _)| *w as i64)
            .sum()
    }
    fn normalize(&self, _: &CycleState, _: &PodInfo, scores: &mut [i64]) {
        default_normalize(scores, false);
    }
}

/// Whether a pod's required node constraints allow `node` (used by
/// PodTopologySpread's nodeAffinityPolicy).
pub fn pod_matches_node(aff: &RequiredNodeAffinity, node: &NodeInfo) -> bool {
    aff.matches(&node.name, node.labels())
}

#[cfg(test)]
#[allow(clippy::type_complexity)]
mod tests {
    use super::*;
    use crate::framework::Code;
    use crate::plugins::testutil::*;
    use serde_json::json;

    fn run(pod: PodInfo, node_labels: &[(&str, &str)], node_name: &str) -> Code {
        let mut nb = NodeBuilder::new(node_name);
        for (k, v) in node_labels {
            nb = nb.label(k, v);
        }
        let n = node_info(nb.build(), &[]);
        let plugin = NodeAffinity::default();
        let snap = Snapshot::default();
        let mut state = CycleState::default();
        let (names, st) = plugin.pre_filter(&mut state, &pod, &snap);
        if st.is_skip() {
            return Code::Success;
        }
        if !st.is_success() {
            return st.code;
        }
        if let Some(names) = names {
            if !names.contains(node_name) {
                return Code::UnschedulableAndUnresolvable;
            }
        }
        plugin.filter(&state, &pod, &n, &snap).code
    }

    #[test]
    fn a_node_selector_must_match_every_label() {
        let ok = Code::Success;
        let no = Code::UnschedulableAndUnresolvable;
        let cases: Vec<(Vec<(&str, &str)>, Vec<(&str, &str)>, Code)> = vec![
            (vec![], vec![], ok),
            (
                vec![("disk", "ssd")],
                vec![("disk", "ssd"), ("zone", "a")],
                ok,
            ),
            (vec![("disk", "ssd")], vec![("disk", "hdd")], no),
            (
                vec![("disk", "ssd"), ("zone", "a")],
                vec![("disk", "ssd")],
                no,
            ),
        ];
        for (sel, labels, want) in cases {
            let mut b = PodBuilder::new("p");
            for (k, v) in &sel {
                b = b.node_selector(k, v);
            }
            assert_eq!(
                run(pod_info(b.build()), &labels, "n1"),
                want,
                "{sel:?} on {labels:?}"
            );
        }
    }

    #[test]
    fn required_terms_are_ored_and_expressions_within_a_term_are_anded() {
        let ok = Code::Success;
        let no = Code::UnschedulableAndUnresolvable;
        let cases = vec![
            (
                json!([{"matchExpressions":[{"key":"zone","operator":"In","values":["a","b"]}]}]),
                vec![("zone", "b")],
                ok,
            ),
            (
                json!([{"matchExpressions":[{"key":"zone","operator":"NotIn","values":["a"]}]}]),
                vec![("zone", "a")],
                no,
            ),
            (
                json!([{"matchExpressions":[{"key":"gpu","operator":"Exists"}]}]),
                vec![("gpu", "1")],
                ok,
            ),
            (
                json!([{"matchExpressions":[{"key":"gpu","operator":"DoesNotExist"}]}]),
                vec![("gpu", "1")],
                no,
            ),
            (
                json!([{"matchExpressions":[{"key":"cores","operator":"Gt","values":["8"]}]}]),
                vec![("cores", "16")],
                ok,
            ),
            (
                json!([{"matchExpressions":[{"key":"cores","operator":"Lt","values":["8"]}]}]),
                vec![("cores", "16")],
                no,
            ),
            (
                json!([{"matchExpressions":[{"key":"cores","operator":"Gt","values":["x"]}]}]),
                vec![("cores", "16")],
                no,
            ),
            (
                json!([{"matchExpressions":[{"key":"zone","operator":"In","values":["a"]},{"key":"gpu","operator":"Exists"}]}]),
                vec![("zone", "a")],
                no,
            ),
            (
                json!([{"matchExpressions":[{"key":"zone","operator":"In","values":["x"]}]},{"matchExpressions":[{"key":"gpu","operator":"Exists"}]}]),
                vec![("gpu", "1")],
                ok,
            ),
            (
                json!([{"matchFields":[{"key":"metadata.name","operator":"In","values":["n1"]}]}]),
                vec![],
                ok,
            ),
            (
                json!([{"matchFields":[{"key":"metadata.name","operator":"In","values":["n2"]}]}]),
                vec![],
                no,
            ),
            (json!([{}]), vec![], no),
            (
                json!([{"matchExpressions":[{"key":"zone","operator":"Bogus","values":["a"]}]}]),
                vec![("zone", "a")],
                no,
            ),
        ];
        for (terms, labels, want) in cases {
            let pod = PodBuilder::new("p").affinity(json!({"nodeAffinity":{"requiredDuringSchedulingIgnoredDuringExecution":{"nodeSelectorTerms": terms.clone()}}})).build();
            assert_eq!(
                run(pod_info(pod), &labels, "n1"),
                want,
                "{terms} on {labels:?}"
            );
        }
    }

    #[test]
    fn preferred_terms_raise_the_score_of_matching_nodes() {
        let pod = pod_info(PodBuilder::new("p").affinity(json!({"nodeAffinity":{"preferredDuringSchedulingIgnoredDuringExecution":[
            {"weight": 10, "preference": {"matchExpressions":[{"key":"zone","operator":"In","values":["a"]}]}},
            {"weight": 30, "preference": {"matchExpressions":[{"key":"disk","operator":"In","values":["ssd"]}]}}
        ]}})).build());
        let nodes = [
            node_info(NodeBuilder::new("a").label("zone", "a").build(), &[]),
            node_info(NodeBuilder::new("ssd").label("disk", "ssd").build(), &[]),
            node_info(
                NodeBuilder::new("both")
                    .label("zone", "a")
                    .label("disk", "ssd")
                    .build(),
                &[],
            ),
            node_info(NodeBuilder::new("none").build(), &[]),
        ];
        let refs: Vec<&NodeInfo> = nodes.iter().collect();
        let snap = Snapshot::default();
        let mut state = CycleState::default();
        let p = NodeAffinity::default();
        assert!(p.pre_score(&mut state, &pod, &refs, &snap).is_success());
        let mut s: Vec<i64> = refs
            .iter()
            .map(|n| p.score(&state, &pod, n, &snap))
            .collect();
        p.normalize(&state, &pod, &mut s);
        assert_eq!(s, vec![25, 75, 100, 0]);
    }
}
