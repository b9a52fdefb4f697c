//! NodePorts: two pods cannot take the same host port (protocol, IP) on a node.

use crate::cache::Snapshot;
use crate::framework::{
    ClusterEvent, CycleState, FilterPlugin, Plugin, PreFilterPlugin, PreFilterResult, Status,
};
use crate::types::{NodeInfo, PodInfo};

pub const NAME: &str = "NodePorts";
pub const ERR_REASON: &str = "node(s) didn't have free ports for the requested pod ports";

pub struct NodePorts;

impl Plugin for NodePorts {
    fn name(&self) -> &'static str {
        NAME
    }
    fn events(&self) -> &'static [ClusterEvent] {
        &[ClusterEvent::NodeAdd, ClusterEvent::AssignedPodDelete]
    }
    fn as_pre_filter(&self) -> Option<&dyn PreFilterPlugin> {
        Some(self)
    }
    fn as_filter(&self) -> Option<&dyn FilterPlugin> {
        Some(self)
    }
}

impl PreFilterPlugin for NodePorts {
    fn pre_filter(
        &self,
        _: &mut CycleState,
        pod: &PodInfo,
        _: &Snapshot,
    ) -> (PreFilterResult, Status) {
        if pod.host_ports.is_empty() {
            (None, Status::skip())
        } else {
            (None, Status::success())
        }
    }
}

impl FilterPlugin for NodePorts {
    fn filter(&self, _: &CycleState, pod: &PodInfo, node: &NodeInfo, _: &Snapshot) -> Status {
        let conflict = pod
            .host_ports
            .iter()
            .any(|want| node.used_ports.iter().any(|used| used.conflicts(want)));
        if conflict {
            Status::unschedulable(ERR_REASON)
        } else {
            Status::success()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::framework::Code;
    use crate::plugins::testutil::*;

    #[test]
    fn a_host_port_already_taken_on_the_node_does_not_fit() {
        let cases = [
            // (existing ip, proto, port), (wanted ip, proto, port), fits
            (("", "TCP", 80), ("", "TCP", 80), false),
            (("", "TCP", 80), ("", "UDP", 80), true),
            (("", "TCP", 80), ("", "TCP", 8080), true),
            (("10.0.0.1", "TCP", 80), ("10.0.0.2", "TCP", 80), true),
            (("10.0.0.1", "TCP", 80), ("0.0.0.0", "TCP", 80), false),
            (("0.0.0.0", "TCP", 80), ("10.0.0.2", "TCP", 80), false),
        ];
        for (have, want, fits) in cases {
            let existing = PodBuilder::new("old")
                .host_port(have.0, have.1, have.2)
                .node_name("n")
                .build();
            let n = node_info(NodeBuilder::new("n").build(), &[existing]);
            let pod = pod_info(
                PodBuilder::new("new")
                    .host_port(want.0, want.1, want.2)
                    .build(),
            );
            let st = NodePorts.filter(&CycleState::default(), &pod, &n, &Snapshot::default());
            assert_eq!(st.code == Code::Success, fits, "{have:?} vs {want:?}");
        }
    }

    #[test]
    fn a_pod_without_host_ports_skips_the_check() {
        let pod = pod_info(PodBuilder::new("p").build());
        let (_, st) = NodePorts.pre_filter(&mut CycleState::default(), &pod, &Snapshot::default());
        assert!(st.is_skip());
    }
}
