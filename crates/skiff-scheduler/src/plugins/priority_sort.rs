//! PrioritySort: higher priority first, then the pod that has waited longest.

use crate::framework::{Plugin, QueueSortPlugin, QueuedPod};

pub const NAME: &str = "PrioritySort";

pub struct PrioritySort;

impl Plugin for PrioritySort {
    fn name(&self) -> &'static str {
        NAME
    }
    fn as_queue_sort(&self) -> Option<&dyn QueueSortPlugin> {
        Some(self)
    }
}

impl QueueSortPlugin for PrioritySort {
    fn less(&self, a: &QueuedPod, b: &QueuedPod) -> bool {
        let (pa, pb) = (a.info.priority, b.info.priority);
        pa > pb || (pa == pb && a.timestamp < b.timestamp)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plugins::testutil::*;

    fn queued(priority: i32, ts: u64) -> QueuedPod {
        QueuedPod {
            info: std::sync::Arc::new(pod_info(PodBuilder::new("p").priority(priority).build())),
            timestamp: ts,
            attempts: 0,
        }
    }

    #[test]
    fn a_higher_priority_pod_goes_first_and_equal_ones_go_in_arrival_order() {
        let cases = [
            ((10, 5), (1, 1), true),
            ((1, 1), (10, 5), false),
            ((5, 1), (5, 2), true),
            ((5, 2), (5, 1), false),
        ];
        for ((pa, ta), (pb, tb), want) in cases {
            assert_eq!(
                PrioritySort.less(&queued(pa, ta), &queued(pb, tb)),
                want,
                "{pa}@{ta} before {pb}@{tb}"
            );
        }
    }
}
