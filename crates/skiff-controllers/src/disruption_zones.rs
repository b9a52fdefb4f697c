//! The node lifecycle controller's zone disruption handling, as
//! kube-controller-manager's: nodes are grouped into zones (region and zone
//! labels); a zone's state follows the share of its nodes that are not
//! Ready, and the state sets how fast the zone's unhealthy nodes get their
//! NoExecute taint (which is what evicts their pods):
//!
//! - Normal: `--node-eviction-rate` (0.1 nodes a second, one at once);
//! - PartialDisruption (more than two nodes and at least 55% of the zone
//!   not Ready): `--secondary-node-eviction-rate` (0.01/s) in a zone of
//!   more than 50 nodes, none in a smaller one;
//! - FullDisruption (no node Ready): the normal rate, unless *every* zone is
//!   fully disrupted: then the control plane is the likelier culprit (a
//!   partitioned or starved controller, a server that lost its nodes'
//!   heartbeats), so every node's unreachable/not-ready taint is removed and
//!   no node is tainted until some node is Ready again.
//!
//! Without this, a control plane that fell behind the nodes' Lease renewals
//! (the 10,000-node benchmark on two cores) tainted every node at once and
//! evicted every pod in the cluster.

use std::collections::HashMap;
use std::time::Instant;

use k8s_openapi::api::core::v1::Node;

/// kube-controller-manager's `--node-eviction-rate`.
pub const NODE_EVICTION_RATE: f64 = 0.1;
/// kube-controller-manager's `--secondary-node-eviction-rate`.
pub const SECONDARY_NODE_EVICTION_RATE: f64 = 0.01;
/// kube-controller-manager's `--large-cluster-size-threshold`.
pub const LARGE_CLUSTER_SIZE_THRESHOLD: usize = 50;
/// kube-controller-manager's `--unhealthy-zone-threshold`.
pub const UNHEALTHY_ZONE_THRESHOLD: f64 = 0.55;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ZoneState {
    Initial,
    Normal,
    PartialDisruption,
    FullDisruption,
}

/// A zone's state from its nodes' Ready conditions.
pub fn zone_state(ready: usize, not_ready: usize) -> ZoneState {
    if ready == 0 && not_ready > 0 {
        ZoneState::FullDisruption
    } else if not_ready > 2
        && not_ready as f64 / (ready + not_ready) as f64 >= UNHEALTHY_ZONE_THRESHOLD
    {
        ZoneState::PartialDisruption
    } else {
        ZoneState::Normal
    }
}

/// The zone a node is in: its region and zone labels (the GA ones, else the
/// deprecated failure-domain ones); nodes without them share the zone "".
pub fn zone_key(node: &Node) -> String {
    let labels = node.metadata.labels.as_ref();
    let get = |ga: &str, beta: &str| {
        labels
            .and_then(|l| l.get(ga).or_else(|| l.get(beta)))
            .cloned()
            .unwrap_or_default()
    };
    let region = get(
        "topology.kubernetes.io/region",
        "failure-domain.beta.kubernetes.io/region",
    );
    let zone = get(
        "topology.kubernetes.io/zone",
        "failure-domain.beta.kubernetes.io/zone",
    );
    if region.is_empty() && zone.is_empty() {
        String::new()
    } else {
        format!("{region}:\x00:{zone}")
    }
}

/// A token bucket holding at most one token (Kubernetes' eviction limiter
/// burst), refilled at `qps`; a rate of 0 never gives one.
#[derive(Debug, Clone)]
struct Limiter {
    qps: f64,
    tokens: f64,
    at: Instant,
}

impl Limiter {
    fn new(qps: f64, now: Instant) -> Limiter {
        Limiter {
            qps,
            tokens: 1.0,
            at: now,
        }
    }

    fn take(&mut self, now: Instant) -> bool {
        if self.qps <= 0.0 {
            return false;
        }
        let dt = now.saturating_duration_since(self.at).as_secs_f64();
        self.tokens = (self.tokens + dt * self.qps).min(1.0);
        self.at = now;
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            true
        } else {
            false
        }
    }
}

#[derive(Debug, Clone)]
struct Zone {
    state: ZoneState,
    limiter: Limiter,
}

/// What the lifecycle pass should do this time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    /// Taint unhealthy nodes as each zone's limiter allows.
    Taint,
    /// Every zone just became fully disrupted: remove every node's
    /// unreachable/not-ready NoExecute taint and taint none.
    UntaintAll,
}

/// The zones' states and tainting limiters, kept across lifecycle passes.
#[derive(Debug, Default)]
pub struct Zones {
    zones: HashMap<String, Zone>,
}

fn rate_for(state: ZoneState, size: usize) -> f64 {
    match state {
        ZoneState::PartialDisruption if size > LARGE_CLUSTER_SIZE_THRESHOLD => {
            SECONDARY_NODE_EVICTION_RATE
        }
        ZoneState::PartialDisruption => 0.0,
        _ => NODE_EVICTION_RATE,
    }
}

impl Zones {
    /// Updates the zones from this pass's counts (zone → (Ready, not Ready)
    /// nodes), as kube-controller-manager's handleDisruption does.
    pub fn observe(&mut self, counts: &HashMap<String, (usize, usize)>, now: Instant) -> Decision {
        let new: HashMap<&String, ZoneState> = counts
            .iter()
            .map(|(k, (r, n))| (k, zone_state(*r, *n)))
            .collect();
        let all_are_full = new.values().all(|s| *s == ZoneState::FullDisruption);
        for k in counts.keys() {
            self.zones.entry(k.clone()).or_insert_with(|| Zone {
                state: ZoneState::Initial,
                limiter: Limiter::new(NODE_EVICTION_RATE, now),
            });
        }
        let all_were_full = self
            .zones
            .values()
            .all(|z| z.state == ZoneState::FullDisruption);
        let size = |k: &String| counts.get(k).map_or(0, |(r, n)| r + n);
        if all_are_full && all_were_full {
            // Still in master disruption mode: nothing is tainted.
            return Decision::Taint;
        }
        if all_are_full {
            tracing::info!(
                "every node is not Ready: entering master disruption mode (no node is tainted)"
            );
            for z in self.zones.values_mut() {
                z.state = ZoneState::FullDisruption;
                z.limiter = Limiter::new(0.0, now);
            }
            return Decision::UntaintAll;
        }
        for (k, z) in self.zones.iter_mut() {
            let Some(state) = new.get(k).copied() else {
                continue;
            };
            if all_were_full || z.state != state {
                if all_were_full {
                    tracing::info!("some nodes are Ready: leaving master disruption mode");
                }
                z.limiter = Limiter::new(rate_for(state, size(k)), now);
                z.state = state;
            }
        }
        self.zones.retain(|k, _| counts.contains_key(k));
        Decision::Taint
    }

    /// Whether a node of `zone` may be tainted now (takes a token).
    pub fn may_taint(&mut self, zone: &str, now: Instant) -> bool {
        self.zones
            .get_mut(zone)
            .is_some_and(|z| z.limiter.take(now))
    }

    pub fn state(&self, zone: &str) -> Option<ZoneState> {
        self.zones.get(zone).map(|z| z.state)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn counts(v: &[(&str, usize, usize)]) -> HashMap<String, (usize, usize)> {
        v.iter()
            .map(|(k, r, n)| (k.to_string(), (*r, *n)))
            .collect()
    }

    #[test]
    fn zone_states_follow_kubernetes_thresholds() {
        assert_eq!(zone_state(10, 0), ZoneState::Normal);
        // Two unhealthy nodes never make a disruption, whatever the share.
        assert_eq!(zone_state(1, 2), ZoneState::Normal);
        assert_eq!(zone_state(2, 3), ZoneState::PartialDisruption);
        assert_eq!(zone_state(100, 54), ZoneState::Normal);
        assert_eq!(zone_state(45, 55), ZoneState::PartialDisruption);
        assert_eq!(zone_state(0, 1), ZoneState::FullDisruption);
        assert_eq!(zone_state(0, 0), ZoneState::Normal);
    }

    #[test]
    fn a_normal_zone_taints_one_node_at_once_then_one_per_ten_seconds() {
        let mut z = Zones::default();
        let t0 = Instant::now();
        assert_eq!(z.observe(&counts(&[("", 9, 1)]), t0), Decision::Taint);
        assert!(z.may_taint("", t0));
        assert!(!z.may_taint("", t0 + Duration::from_secs(5)));
        assert!(z.may_taint("", t0 + Duration::from_secs(10)));
        assert!(
            !z.may_taint("elsewhere", t0),
            "an unknown zone taints nothing"
        );
    }

    #[test]
    fn when_every_zone_is_down_nothing_is_tainted_until_a_node_is_ready() {
        let mut z = Zones::default();
        let t0 = Instant::now();
        z.observe(&counts(&[("a", 5, 0), ("b", 5, 0)]), t0);
        // Zone a goes down alone: full disruption there, normal rate.
        assert_eq!(
            z.observe(&counts(&[("a", 0, 5), ("b", 5, 0)]), t0),
            Decision::Taint
        );
        assert_eq!(z.state("a"), Some(ZoneState::FullDisruption));
        assert!(z.may_taint("a", t0));
        // Then b: every zone is down. Taints go, none are added.
        let t1 = t0 + Duration::from_secs(100);
        assert_eq!(
            z.observe(&counts(&[("a", 0, 5), ("b", 0, 5)]), t1),
            Decision::UntaintAll
        );
        assert_eq!(
            z.observe(&counts(&[("a", 0, 5), ("b", 0, 5)]), t1),
            Decision::Taint
        );
        assert!(!z.may_taint("a", t1 + Duration::from_secs(100)));
        assert!(!z.may_taint("b", t1 + Duration::from_secs(100)));
        // One node of b is back: a is fully disrupted at the normal rate
        // again, b partially (5 nodes: small, so not at all).
        let t2 = t1 + Duration::from_secs(200);
        assert_eq!(
            z.observe(&counts(&[("a", 0, 5), ("b", 1, 4)]), t2),
            Decision::Taint
        );
        assert_eq!(z.state("b"), Some(ZoneState::PartialDisruption));
        assert!(z.may_taint("a", t2));
        assert!(!z.may_taint("b", t2 + Duration::from_secs(1000)));
    }

    #[test]
    fn a_large_partially_disrupted_zone_taints_one_node_per_hundred_seconds() {
        let mut z = Zones::default();
        let t0 = Instant::now();
        z.observe(&counts(&[("", 100, 0)]), t0);
        z.observe(&counts(&[("", 40, 60)]), t0);
        assert_eq!(z.state(""), Some(ZoneState::PartialDisruption));
        assert!(z.may_taint("", t0));
        assert!(!z.may_taint("", t0 + Duration::from_secs(50)));
        assert!(z.may_taint("", t0 + Duration::from_secs(100)));
    }

    #[test]
    fn a_lone_node_that_goes_silent_is_never_tainted() {
        let mut z = Zones::default();
        let t0 = Instant::now();
        z.observe(&counts(&[("", 1, 0)]), t0);
        assert_eq!(z.observe(&counts(&[("", 0, 1)]), t0), Decision::UntaintAll);
        assert!(!z.may_taint("", t0 + Duration::from_secs(1000)));
    }

    #[test]
    fn zone_keys_come_from_region_and_zone_labels() {
        let node = |labels: serde_json::Value| -> Node {
            serde_json::from_value(serde_json::json!({"metadata": {"name": "n", "labels": labels}}))
                .unwrap()
        };
        assert_eq!(zone_key(&node(serde_json::json!({}))), "");
        assert_eq!(
            zone_key(&node(
                serde_json::json!({"topology.kubernetes.io/region": "r", "topology.kubernetes.io/zone": "z"})
            )),
            "r:\x00:z"
        );
        assert_eq!(
            zone_key(&node(
                serde_json::json!({"failure-domain.beta.kubernetes.io/zone": "z"})
            )),
            ":\x00:z"
        );
    }
}
