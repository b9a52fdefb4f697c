//! VolumeRestrictions (its ReadWriteOncePod part): a claim with access
//! mode `ReadWriteOncePod` is used by one pod in the whole cluster, so a
//! second pod naming it fits no node while the first is there (preemption
//! may remove it, as in Kubernetes).

use crate::cache::Snapshot;
use crate::framework::{
    ClusterEvent, CycleState, FilterPlugin, Plugin, PreFilterPlugin, PreFilterResult, Status,
};
use crate::plugins::volume_binding::pod_claims;
use crate::types::{NodeInfo, PodInfo};

pub const NAME: &str = "VolumeRestrictions";
pub const ERR_RWOP_CONFLICT: &str =
    "node has pod using PersistentVolumeClaim with the same name and ReadWriteOncePod access mode";
const STATE_KEY: &str = "PreFilterVolumeRestrictions";

/// The pod's ReadWriteOncePod claims and how many other pods use them.
#[derive(Debug, Clone, Default)]
struct State {
    claims: Vec<String>,
    conflicts: usize,
}

fn uses(other: &PodInfo, ns: &str, claims: &[String]) -> usize {
    if other.namespace != ns {
        return 0;
    }
    pod_claims(other)
        .iter()
        .filter(|(c, _)| claims.contains(c))
        .count()
}

pub struct VolumeRestrictions;

impl Plugin for VolumeRestrictions {
    fn name(&self) -> &'static str {
        NAME
    }
    fn events(&self) -> &'static [ClusterEvent] {
        &[ClusterEvent::AssignedPodDelete, ClusterEvent::PvcChange]
    }
    fn as_pre_filter(&self) -> Option<&dyn PreFilterPlugin> {
        Some(self)
    }
    fn as_filter(&self) -> Option<&dyn FilterPlugin> {
        Some(self)
    }
}

impl PreFilterPlugin for VolumeRestrictions {
    fn pre_filter(
        &self,
        state: &mut CycleState,
        pod: &PodInfo,
        snap: &Snapshot,
    ) -> (PreFilterResult, Status) {
        let claims: Vec<String> = pod_claims(pod)
            .into_iter()
            .map(|(c, _)| c)
            .filter(|c| {
                snap.volumes
                    .claim(&pod.namespace, c)
                    .is_some_and(|c| c.access_modes.iter().any(|m| m == "ReadWriteOncePod"))
            })
            .collect();
        if claims.is_empty() {
            return (None, Status::skip());
        }
        let conflicts = snap
            .nodes
            .iter()
            .flat_map(|n| n.pods.iter())
            .filter(|p| p.uid != pod.uid)
            .map(|p| uses(p, &pod.namespace, &claims))
            .sum();
        state.write(STATE_KEY, State { claims, conflicts });
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
        _: &NodeInfo,
        _: &Snapshot,
    ) {
        if let Some(s) = state.read_mut::<State>(STATE_KEY) {
            s.conflicts += uses(added, &pod.namespace, &s.claims);
        }
    }
    fn remove_pod(
        &self,
        state: &mut CycleState,
        pod: &PodInfo,
        removed: &PodInfo,
        _: &NodeInfo,
        _: &Snapshot,
    ) {
        if let Some(s) = state.read_mut::<State>(STATE_KEY) {
            s.conflicts = s
                .conflicts
                .saturating_sub(uses(removed, &pod.namespace, &s.claims));
        }
    }
}

impl FilterPlugin for VolumeRestrictions {
    fn filter(&self, state: &CycleState, _: &PodInfo, _: &NodeInfo, _: &Snapshot) -> Status {
        match state.read::<State>(STATE_KEY) {
            Some(s) if s.conflicts > 0 => Status::unschedulable(ERR_RWOP_CONFLICT),
            _ => Status::success(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::framework::Code;
    use crate::plugins::testutil::*;
    use crate::plugins::volume_binding::Claim;

    fn with_claim(name: &str, claim: &str) -> PodInfo {
        let mut p = PodBuilder::new(name).build();
        p.spec.as_mut().unwrap().volumes = Some(vec![serde_json::from_value(
            serde_json::json!({"name": "v", "persistentVolumeClaim": {"claimName": claim}}),
        )
        .unwrap()]);
        pod_info(p)
    }

    #[test]
    fn a_read_write_once_pod_claim_admits_one_pod_in_the_cluster() {
        let mut snap = Snapshot::default();
        for (name, mode) in [("solo", "ReadWriteOncePod"), ("shared", "ReadWriteOnce")] {
            snap.volumes.put_claim(Claim {
                namespace: "default".into(),
                name: name.into(),
                access_modes: vec![mode.into()],
                ..Default::default()
            });
        }
        let mut n = node_info(NodeBuilder::new("a").build(), &[]);
        n.add_pod(std::sync::Arc::new(with_claim("first", "solo")));
        n.add_pod(std::sync::Arc::new(with_claim("other", "shared")));
        snap.nodes.push(n.clone());
        let check = |pod: &PodInfo| {
            let mut state = CycleState::default();
            let (_, st) = VolumeRestrictions.pre_filter(&mut state, pod, &snap);
            if st.is_skip() {
                return Code::Skip;
            }
            VolumeRestrictions.filter(&state, pod, &n, &snap).code
        };
        assert_eq!(check(&with_claim("second", "solo")), Code::Unschedulable);
        assert_eq!(check(&with_claim("second", "shared")), Code::Skip);
    }
}
