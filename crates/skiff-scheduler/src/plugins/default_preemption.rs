//! DefaultPreemption: when a pod fits nowhere, find a node where evicting
//! lower-priority pods would make it fit, choosing the cheapest victims
//! (PodDisruptionBudgets respected where possible). The scheduler then
//! nominates the node on the pod and deletes the victims gracefully.

use std::collections::BTreeMap;
use std::sync::Arc;

use serde_json::Value;

use crate::cache::Snapshot;
use crate::framework::{
    Code, CycleState, Framework, NodeStatuses, Plugin, PostFilterPlugin, PostFilterResult, Status,
};
use crate::types::{NodeInfo, PodInfo};

pub const NAME: &str = "DefaultPreemption";
pub const NOT_HELPFUL: &str = "Preemption is not helpful for scheduling";
pub const NO_VICTIMS: &str = "No preemption victims found for incoming pod";

pub struct DefaultPreemption {
    pub min_candidate_nodes_percentage: i64,
    pub min_candidate_nodes_absolute: i64,
}

impl DefaultPreemption {
    pub fn from_args(args: &Value) -> anyhow::Result<DefaultPreemption> {
        let pct = args
            .get("minCandidateNodesPercentage")
            .and_then(Value::as_i64)
            .unwrap_or(10);
        let abs = args
            .get("minCandidateNodesAbsolute")
            .and_then(Value::as_i64)
            .unwrap_or(100);
        if !(0..=100).contains(&pct) || abs < 0 || (pct == 0 && abs == 0) {
            anyhow::bail!("minCandidateNodesPercentage must be in 0..=100 and minCandidateNodesAbsolute ≥ 0, not both 0");
        }
        Ok(DefaultPreemption {
            min_candidate_nodes_percentage: pct,
            min_candidate_nodes_absolute: abs,
        })
    }
}

impl Plugin for DefaultPreemption {
    fn name(&self) -> &'static str {
        NAME
    }
    fn as_post_filter(&self) -> Option<&dyn PostFilterPlugin> {
        Some(self)
    }
}

/// A PodDisruptionBudget as preemption reads it.
#[derive(Debug, Clone)]
pub struct PdbInfo {
    pub namespace: String,
    pub name: String,
    pub selector: crate::types::Selector,
    pub disruptions_allowed: i64,
    pub disrupted_pods: Vec<String>,
}

#[derive(Debug)]
struct Candidate {
    node: String,
    victims: Vec<Arc<PodInfo>>,
    pdb_violations: usize,
}

/// Splits pods into (violating a PDB, not violating), keeping order.
fn split_by_pdb(pods: &[Arc<PodInfo>], pdbs: &[PdbInfo]) -> (Vec<Arc<PodInfo>>, Vec<Arc<PodInfo>>) {
    let mut allowed: Vec<i64> = pdbs.iter().map(|p| p.disruptions_allowed).collect();
    let (mut bad, mut ok) = (vec![], vec![]);
    for p in pods {
        let mut violating = false;
        for (i, pdb) in pdbs.iter().enumerate() {
            // A PDB with an empty selector matches nothing.
            if pdb.namespace != p.namespace || pdb.selector.is_everything() {
                continue;
            }
            if !pdb.selector.matches(p.labels()) {
                continue;
            }
            if pdb.disrupted_pods.iter().any(|n| *n == p.name) {
                continue;
            }
            allowed[i] -= 1;
            if allowed[i] < 0 {
                violating = true;
            }
        }
        if violating {
            bad.push(p.clone());
        } else {
            ok.push(p.clone());
        }
    }
    (bad, ok)
}

fn by_importance(a: &Arc<PodInfo>, b: &Arc<PodInfo>) -> std::cmp::Ordering {
    // Higher priority first; among equals, the longer-running first.
    b.priority
        .cmp(&a.priority)
        .then_with(|| a.start_time().cmp(&b.start_time()))
}

impl DefaultPreemption {
    fn select_victims(
        &self,
        fw: &Framework,
        state: &CycleState,
        pod: &PodInfo,
        node: &NodeInfo,
        snap: &Snapshot,
    ) -> Result<Candidate, Status> {
        let mut potential: Vec<Arc<PodInfo>> = node
            .pods
            .iter()
            .filter(|p| p.priority < pod.priority)
            .cloned()
            .collect();
        if potential.is_empty() {
            return Err(Status::unresolvable(NO_VICTIMS));
        }
        potential.sort_by(by_importance);
        let mut st = state.clone();
        let mut n = node.clone();
        for v in &potential {
            n.remove_pod(&v.uid);
            fw.run_pre_filter_remove_pod(&mut st, pod, v, &n, snap);
        }
        let fits = fw.run_filters(&st, pod, &n, snap);
        if !fits.is_success() {
            return Err(fits);
        }
        let (violating, fine) = split_by_pdb(&potential, &snap.pdbs);
        let mut victims = Vec::new();
        let mut pdb_violations = 0;
        for (group, is_violating) in [(violating, true), (fine, false)] {
            for p in group {
                n.add_pod(p.clone());
                fw.run_pre_filter_add_pod(&mut st, pod, &p, &n, snap);
                if !fw.run_filters(&st, pod, &n, snap).is_success() {
                    n.remove_pod(&p.uid);
                    fw.run_pre_filter_remove_pod(&mut st, pod, &p, &n, snap);
                    if is_violating {
                        pdb_violations += 1;
                    }
                    victims.push(p);
                }
            }
        }
        Ok(Candidate {
            node: node.name.clone(),
            victims,
            pdb_violations,
        })
    }
}

/// Kubernetes' order of preference among candidates.
fn pick(mut cands: Vec<Candidate>) -> Option<Candidate> {
    let key = |c: &Candidate| {
        let highest = c
            .victims
            .iter()
            .map(|v| v.priority)
            .max()
            .unwrap_or(i32::MIN);
        let sum: i64 = c
            .victims
            .iter()
            .map(|v| v.priority as i64 + i32::MAX as i64 + 1)
            .sum();
        // Earliest start among the highest-priority victims; later is better.
        let earliest = c
            .victims
            .iter()
            .filter(|v| v.priority == highest)
            .filter_map(|v| v.start_time())
            .min();
        (
            c.pdb_violations,
            highest,
            sum,
            c.victims.len(),
            std::cmp::Reverse(earliest),
        )
    };
    let best = cands
        .iter()
        .enumerate()
        .min_by(|(ia, a), (ib, b)| key(a).cmp(&key(b)).then(ia.cmp(ib)))
        .map(|(i, _)| i)?;
    Some(cands.swap_remove(best))
}

/// "3 Preemption is not helpful for scheduling, 1 Insufficient cpu" sorted.
pub fn histogram(reasons: &BTreeMap<String, usize>) -> String {
    let mut parts: Vec<String> = reasons.iter().map(|(r, n)| format!("{n} {r}")).collect();
    parts.sort();
    parts.join(", ")
}

impl PostFilterPlugin for DefaultPreemption {
    fn post_filter(
        &self,
        fw: &Framework,
        state: &CycleState,
        pod: &PodInfo,
        statuses: &NodeStatuses,
        snap: &Snapshot,
    ) -> (PostFilterResult, Status) {
        if pod.preemption_never() {
            return (
                PostFilterResult::default(),
                Status::unschedulable("not eligible due to preemptionPolicy=Never."),
            );
        }
        // A pod already nominated where lower-priority pods are terminating
        // waits for them instead of preempting more.
        let nominated = pod
            .pod
            .status
            .as_ref()
            .and_then(|s| s.nominated_node_name.as_deref())
            .unwrap_or("");
        if let Some(n) = snap.node(nominated) {
            if n.pods
                .iter()
                .any(|p| p.terminating && p.priority < pod.priority)
            {
                return (
                    PostFilterResult::default(),
                    Status::unschedulable(
                        "not eligible due to a terminating pod on the nominated node.",
                    ),
                );
            }
        }
        let total = snap.num_real_nodes();
        let mut reasons: BTreeMap<String, usize> = BTreeMap::new();
        let mut potential: Vec<&NodeInfo> = Vec::new();
        for node in snap.real_nodes() {
            match statuses.get(&node.name) {
                Some(st) if st.code == Code::UnschedulableAndUnresolvable => {
                    *reasons.entry(NOT_HELPFUL.into()).or_default() += 1;
                }
                _ => potential.push(node),
            }
        }
        let wanted = ((potential.len() as i64 * self.min_candidate_nodes_percentage) / 100)
            .max(self.min_candidate_nodes_absolute)
            .min(potential.len() as i64) as usize;
        let mut cands = Vec::new();
        for node in potential {
            if cands.len() >= wanted.max(1) {
                break;
            }
            match self.select_victims(fw, state, pod, node, snap) {
                Ok(c) => cands.push(c),
                Err(st) => {
                    for r in st.reasons {
                        *reasons.entry(r).or_default() += 1;
                    }
                }
            }
        }
        match pick(cands) {
            Some(c) => (
                PostFilterResult {
                    nominated_node: Some(c.node),
                    victims: c.victims,
                },
                Status::success(),
            ),
            None => (
                PostFilterResult::default(),
                Status::unschedulable(format!(
                    "preemption: 0/{total} nodes are available: {}.",
                    histogram(&reasons)
                )),
            ),
        }
    }
}
