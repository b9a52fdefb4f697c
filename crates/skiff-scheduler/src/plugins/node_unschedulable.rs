//! NodeUnschedulable: cordoned nodes (`spec.unschedulable`) take only pods
//! that tolerate the `node.kubernetes.io/unschedulable` taint.

use k8s_openapi::api::core::v1::Taint;

use crate::cache::Snapshot;
use crate::framework::{ClusterEvent, CycleState, FilterPlugin, Plugin, Status};
use crate::types::{tolerated, NodeInfo, PodInfo};

pub const NAME: &str = "NodeUnschedulable";
pub const ERR_REASON: &str = "node(s) were unschedulable";
pub const TAINT_KEY: &str = "node.kubernetes.io/unschedulable";

pub struct NodeUnschedulable;

impl Plugin for NodeUnschedulable {
    fn name(&self) -> &'static str {
        NAME
    }
    fn events(&self) -> &'static [ClusterEvent] {
        &[
            ClusterEvent::NodeAdd,
            ClusterEvent::NodeSpecUnschedulableChange,
            ClusterEvent::NodeTaintChange,
        ]
    }
    fn as_filter(&self) -> Option<&dyn FilterPlugin> {
        Some(self)
    }
}

impl FilterPlugin for NodeUnschedulable {
    fn filter(&self, _: &CycleState, pod: &PodInfo, node: &NodeInfo, _: &Snapshot) -> Status {
        if !node.unschedulable {
            return Status::success();
        }
        let taint = Taint {
            key: TAINT_KEY.into(),
            effect: "NoSchedule".into(),
            ..Default::default()
        };
        if tolerated(pod.tolerations(), &taint) {
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
    fn a_cordoned_node_refuses_pods_unless_they_tolerate_the_unschedulable_taint() {
        let cases = [
            (false, None, Code::Success),
            (true, None, Code::UnschedulableAndUnresolvable),
            (
                true,
                Some((TAINT_KEY, "Exists", "", "NoSchedule")),
                Code::Success,
            ),
            (true, Some(("", "Exists", "", "")), Code::Success),
            (
                true,
                Some(("other", "Exists", "", "")),
                Code::UnschedulableAndUnresolvable,
            ),
        ];
        for (cordoned, tol, code) in cases {
            let mut b = PodBuilder::new("p");
            if let Some((k, op, v, e)) = tol {
                b = b.toleration(k, op, v, e);
            }
            let pod = pod_info(b.build());
            let n = node_info(NodeBuilder::new("n").unschedulable(cordoned).build(), &[]);
            let st =
                NodeUnschedulable.filter(&CycleState::default(), &pod, &n, &Snapshot::default());
            assert_eq!(st.code, code, "cordoned={cordoned} tol={tol:?}");
            if code != Code::Success {
                assert_eq!(st.reasons, vec![ERR_REASON.to_string()]);
            }
        }
    }
}
