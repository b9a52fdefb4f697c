//! ImageLocality: prefers nodes that already have the pod's images, scaled
//! by how widely each image is spread (to avoid piling pods on one node).

use crate::cache::Snapshot;
use crate::framework::{ClusterEvent, CycleState, Plugin, ScorePlugin, MAX_NODE_SCORE};
use crate::types::{normalize_image, NodeInfo, PodInfo};

pub const NAME: &str = "ImageLocality";

const MB: i64 = 1024 * 1024;
const MIN_THRESHOLD: i64 = 23 * MB;
const MAX_CONTAINER_THRESHOLD: i64 = 1000 * MB;

pub struct ImageLocality;

impl Plugin for ImageLocality {
    fn name(&self) -> &'static str {
        NAME
    }
    fn events(&self) -> &'static [ClusterEvent] {
        &[ClusterEvent::NodeAdd]
    }
    fn as_score(&self) -> Option<&dyn ScorePlugin> {
        Some(self)
    }
}

impl ScorePlugin for ImageLocality {
    fn score(&self, _: &CycleState, pod: &PodInfo, node: &NodeInfo, snap: &Snapshot) -> i64 {
        if node.images.is_empty() {
            return 0;
        }
        let Some(spec) = pod.pod.spec.as_ref() else {
            return 0;
        };
        let containers: Vec<_> = spec
            .init_containers
            .iter()
            .flatten()
            .chain(spec.containers.iter())
            .collect();
        if node.images.is_empty() || containers.is_empty() {
            return 0;
        }
        let total_nodes = snap.num_real_nodes().max(1) as i64;
        let mut sum: i64 = 0;
        for c in &containers {
            let Some(img) = c.image.as_deref() else {
                continue;
            };
            let img = normalize_image(img);
            if let Some((_, size)) = node.images.iter().find(|(n, _)| *n == img) {
                let spread = snap.image_nodes.get(&img).copied().unwrap_or(1) as i64;
                sum = sum.saturating_add(
                    ((*size as i128 * spread as i128) / total_nodes as i128) as i64,
                );
            }
        }
        let n = containers.len() as i64;
        let (lo, hi) = (MIN_THRESHOLD, MAX_CONTAINER_THRESHOLD.saturating_mul(n));
        let sum = sum.clamp(lo, hi);
        MAX_NODE_SCORE * (sum - lo) / (hi - lo)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cache::Cache;
    use crate::plugins::testutil::*;

    #[test]
    fn a_node_with_the_image_scores_higher_than_one_without() {
        let mut cache = Cache::new();
        cache.upsert_node(
            NodeBuilder::new("has")
                .image("nginx:1.25", 500 * MB)
                .build(),
        );
        cache.upsert_node(NodeBuilder::new("lacks").build());
        let pod = pod_info(
            PodBuilder::new("p")
                .image("docker.io/library/nginx:1.25")
                .build(),
        );
        let s = |n: &str| {
            ImageLocality.score(
                &CycleState::default(),
                &pod,
                cache.snap.node(n).unwrap(),
                &cache.snap,
            )
        };
        // 500MB spread over 1 of 2 nodes = 250MB; (250-23)/(1000-23) → 23
        assert_eq!(s("has"), 23);
        assert_eq!(s("lacks"), 0);
    }
}
