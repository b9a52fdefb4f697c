//! TaintToleration: NoSchedule and NoExecute taints keep out pods that do
//! not tolerate them; PreferNoSchedule taints lower a node's score.

use k8s_openapi::api::core::v1::Toleration;

use crate::cache::Snapshot;
use crate::framework::{
    default_normalize, ClusterEvent, CycleState, FilterPlugin, Plugin, PreScorePlugin, ScorePlugin,
    Status,
};
use crate::types::{tolerated, NodeInfo, PodInfo};

pub const NAME: &str = "TaintToleration";

pub struct TaintToleration;

impl Plugin for TaintToleration {
    fn name(&self) -> &'static str {
        NAME
    }
    fn events(&self) -> &'static [ClusterEvent] {
        &[ClusterEvent::NodeAdd, ClusterEvent::NodeTaintChange]
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

impl FilterPlugin for TaintToleration {
    fn filter(&self, _: &CycleState, pod: &PodInfo, node: &NodeInfo, _: &Snapshot) -> Status {
        if node.taints.is_empty() {
            return Status::success();
        }
        let tols = pod.tolerations();
        for t in &node.taints {
            if (t.effect == "NoSchedule" || t.effect == "NoExecute") && !tolerated(tols, t) {
                return Status::unresolvable(format!(
                    "node(s) had untolerated taint {{{}: {}}}",
                    t.key,
                    t.value.as_deref().unwrap_or("")
                ));
            }
        }
        Status::success()
    }
}

#[derive(Clone)]
struct PreferTolerations(Vec<Toleration>);

impl PreScorePlugin for TaintToleration {
    fn pre_score(
        &self,
        state: &mut CycleState,
        pod: &PodInfo,
        _: &[&NodeInfo],
        _: &Snapshot,
    ) -> Status {
        let tols = pod
            .tolerations()
            .iter()
            .filter(|t| {
                matches!(
                    t.effect.as_deref(),
                    None | Some("") | Some("PreferNoSchedule")
                )
            })
            .cloned()
            .collect();
        state.write(NAME, PreferTolerations(tols));
        Status::success()
    }
}

impl ScorePlugin for TaintToleration {
    fn score(&self, state: &CycleState, _: &PodInfo, node: &NodeInfo, _: &Snapshot) -> i64 {
        if node.taints.is_empty() {
            return 0;
        }
        let empty = PreferTolerations(vec![]);
        let tols = state.read::<PreferTolerations>(NAME).unwrap_or(&empty);
        node.taints
            .iter()
            .filter(|t| t.effect == "PreferNoSchedule" && !tolerated(&tols.0, t))
            .count() as i64
    }
    fn normalize(&self, _: &CycleState, _: &PodInfo, scores: &mut [i64]) {
        default_normalize(scores, true);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::framework::Code;
    use crate::plugins::testutil::*;

    #[test]
    fn an_untolerated_no_schedule_or_no_execute_taint_keeps_the_pod_out() {
        struct Case {
            taint: (&'static str, &'static str, &'static str),
            tol: Option<(&'static str, &'static str, &'static str, &'static str)>,
            code: Code,
        }
        let cases = [
            Case {
                taint: ("node-role", "x", "NoSchedule"),
                tol: None,
                code: Code::UnschedulableAndUnresolvable,
            },
            Case {
                taint: ("node-role", "x", "NoExecute"),
                tol: None,
                code: Code::UnschedulableAndUnresolvable,
            },
            Case {
                taint: ("node-role", "x", "PreferNoSchedule"),
                tol: None,
                code: Code::Success,
            },
            Case {
                taint: ("node-role", "x", "NoSchedule"),
                tol: Some(("node-role", "Equal", "x", "NoSchedule")),
                code: Code::Success,
            },
            Case {
                taint: ("node-role", "x", "NoSchedule"),
                tol: Some(("node-role", "Equal", "y", "NoSchedule")),
                code: Code::UnschedulableAndUnresolvable,
            },
            Case {
                taint: ("node-role", "x", "NoSchedule"),
                tol: Some(("node-role", "Exists", "", "")),
                code: Code::Success,
            },
            Case {
                taint: ("node-role", "x", "NoSchedule"),
                tol: Some(("node-role", "Exists", "", "NoExecute")),
                code: Code::UnschedulableAndUnresolvable,
            },
        ];
        for c in cases {
            let mut b = PodBuilder::new("p");
            if let Some((k, op, v, e)) = c.tol {
                b = b.toleration(k, op, v, e);
            }
            let pod = pod_info(b.build());
            let n = node_info(
                NodeBuilder::new("n")
                    .taint(c.taint.0, c.taint.1, c.taint.2)
                    .build(),
                &[],
            );
            let st = TaintToleration.filter(&CycleState::default(), &pod, &n, &Snapshot::default());
            assert_eq!(st.code, c.code, "taint {:?} tol {:?}", c.taint, c.tol);
            if c.code != Code::Success {
                assert_eq!(
                    st.reasons,
                    vec![format!(
                        "node(s) had untolerated taint {{{}: {}}}",
                        c.taint.0, c.taint.1
                    )]
                );
            }
        }
    }

    #[test]
    fn nodes_with_more_untolerated_prefer_no_schedule_taints_score_lower() {
        let pod = pod_info(
            PodBuilder::new("p")
                .toleration("a", "Exists", "", "PreferNoSchedule")
                .build(),
        );
        let nodes = [
            node_info(NodeBuilder::new("clean").build(), &[]),
            node_info(
                NodeBuilder::new("tolerated")
                    .taint("a", "", "PreferNoSchedule")
                    .build(),
                &[],
            ),
            node_info(
                NodeBuilder::new("one")
                    .taint("b", "", "PreferNoSchedule")
                    .build(),
                &[],
            ),
            node_info(
                NodeBuilder::new("two")
                    .taint("b", "", "PreferNoSchedule")
                    .taint("c", "", "PreferNoSchedule")
                    .build(),
                &[],
            ),
        ];
        let refs: Vec<&NodeInfo> = nodes.iter().collect();
        let snap = Snapshot::default();
        let mut state = CycleState::default();
        TaintToleration.pre_score(&mut state, &pod, &refs, &snap);
        let mut scores: Vec<i64> = refs
            .iter()
            .map(|n| TaintToleration.score(&state, &pod, n, &snap))
            .collect();
        TaintToleration.normalize(&state, &pod, &mut scores);
        assert_eq!(scores, vec![100, 100, 50, 0]);
    }
}
