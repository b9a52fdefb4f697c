//! NodeResourcesBalancedAllocation: prefers nodes whose resources would be
//! used in similar proportions after placing the pod.

use serde_json::Value;

use crate::cache::Snapshot;
use crate::framework::{
    ClusterEvent, CycleState, Plugin, PreScorePlugin, ScorePlugin, Status, MAX_NODE_SCORE,
};
use crate::plugins::node_resources_fit::{parse_resources, requested_and_allocatable};
use crate::types::{NodeInfo, PodInfo};

pub const NAME: &str = "NodeResourcesBalancedAllocation";

pub struct BalancedAllocation {
    pub resources: Vec<(String, i64)>,
}

impl BalancedAllocation {
    pub fn from_args(args: &Value) -> anyhow::Result<BalancedAllocation> {
        Ok(BalancedAllocation {
            resources: parse_resources(args.get("resources"))?,
        })
    }
}

impl Plugin for BalancedAllocation {
    fn name(&self) -> &'static str {
        NAME
    }
    fn events(&self) -> &'static [ClusterEvent] {
        &[ClusterEvent::NodeAdd, ClusterEvent::NodeAllocatableChange]
    }
    fn as_pre_score(&self) -> Option<&dyn PreScorePlugin> {
        Some(self)
    }
    fn as_score(&self) -> Option<&dyn ScorePlugin> {
        Some(self)
    }
}

impl PreScorePlugin for BalancedAllocation {
    fn pre_score(
        &self,
        _: &mut CycleState,
        pod: &PodInfo,
        _: &[&NodeInfo],
        _: &Snapshot,
    ) -> Status {
        // A pod that requests none of the resources changes no balance.
        if self.resources.iter().all(|(n, _)| pod.requests.get(n) == 0) {
            Status::skip()
        } else {
            Status::success()
        }
    }
}

impl ScorePlugin for BalancedAllocation {
    fn score(&self, _: &CycleState, pod: &PodInfo, node: &NodeInfo, _: &Snapshot) -> i64 {
        let mut fractions = [0f64; 8];
        let mut n = 0;
        for (name, _) in &self.resources {
            if n == fractions.len() {
                break;
            }
            let Some((req, cap)) = requested_and_allocatable(pod, node, name, false) else {
                continue;
            };
            fractions[n] = (req as f64 / cap as f64).min(1.0);
            n += 1;
        }
        let f = &fractions[..n];
        let std = match n {
            0 | 1 => 0.0,
            2 => ((f[0] - f[1]) / 2.0).abs(),
            _ => {
                let mean = f.iter().sum::<f64>() / n as f64;
                (f.iter().map(|x| (x - mean) * (x - mean)).sum::<f64>() / n as f64).sqrt()
            }
        };
        ((1.0 - std) * MAX_NODE_SCORE as f64) as i64
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plugins::testutil::*;
    use serde_json::json;

    #[test]
    fn a_node_left_evenly_used_scores_higher_than_a_lopsided_one() {
        let p = BalancedAllocation::from_args(&json!({})).unwrap();
        let cpu_heavy = PodBuilder::new("old")
            .request("cpu", "3")
            .node_name("n")
            .build();
        let nodes = [
            node_info(
                NodeBuilder::new("even")
                    .allocatable("cpu", "4")
                    .allocatable("memory", "8Gi")
                    .build(),
                &[],
            ),
            node_info(
                NodeBuilder::new("lopsided")
                    .allocatable("cpu", "4")
                    .allocatable("memory", "8Gi")
                    .build(),
                &[cpu_heavy],
            ),
        ];
        let pod = pod_info(
            PodBuilder::new("p")
                .request("cpu", "1")
                .request("memory", "2Gi")
                .build(),
        );
        let s: Vec<i64> = nodes
            .iter()
            .map(|n| p.score(&CycleState::default(), &pod, n, &Snapshot::default()))
            .collect();
        // even: cpu 1/4, mem 2/8 → std 0 → 100; lopsided: cpu 4/4, mem 2/8 → std .375 → 62
        assert_eq!(s, vec![100, 62]);
    }

    #[test]
    fn a_pod_requesting_nothing_skips_balanced_allocation() {
        let p = BalancedAllocation::from_args(&json!({})).unwrap();
        let pod = pod_info(PodBuilder::new("p").build());
        assert!(p
            .pre_score(&mut CycleState::default(), &pod, &[], &Snapshot::default())
            .is_skip());
    }
}
