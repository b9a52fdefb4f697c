//! NodeName: a pod that names its node fits only there.

use crate::cache::Snapshot;
use crate::framework::{ClusterEvent, CycleState, FilterPlugin, Plugin, Status};
use crate::types::{NodeInfo, PodInfo};

pub const NAME: &str = "NodeName";
pub const ERR_REASON: &str = "node(s) didn't match the requested node name";

pub struct NodeName;

impl Plugin for NodeName {
    fn name(&self) -> &'static str {
        NAME
    }
    fn events(&self) -> &'static [ClusterEvent] {
        &[ClusterEvent::NodeAdd]
    }
    fn as_filter(&self) -> Option<&dyn FilterPlugin> {
        Some(self)
    }
}

impl FilterPlugin for NodeName {
    fn filter(&self, _: &CycleState, pod: &PodInfo, node: &NodeInfo, _: &Snapshot) -> Status {
        if pod.node_name.is_empty() || pod.node_name == node.name {
            Status::success()
        } else {
            Status::unresolvable(ERR_REASON)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::framework::Code;
    use crate::plugins::testutil::*;

    #[test]
    fn a_pod_naming_a_node_fits_only_that_node() {
        let cases = [
            ("", "n1", Code::Success),
            ("n1", "n1", Code::Success),
            ("n2", "n1", Code::UnschedulableAndUnresolvable),
        ];
        for (wanted, node, code) in cases {
            let pod = pod_info(PodBuilder::new("p").node_name(wanted).build());
            let n = node_info(NodeBuilder::new(node).build(), &[]);
            let st = NodeName.filter(&CycleState::default(), &pod, &n, &Snapshot::default());
            assert_eq!(st.code, code, "{wanted} on {node}");
        }
    }
}
