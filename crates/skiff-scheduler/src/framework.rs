//! The plugin framework: extension points as small traits, a typed status,
//! per-cycle state, and a profile's plugins put together (`Framework`).

use std::any::Any;
use std::collections::{HashMap, HashSet};
use std::fmt;
use std::sync::Arc;

use futures::future::BoxFuture;

use crate::cache::Snapshot;
use crate::types::{NodeInfo, PodInfo};

/// The best score a node can get from one plugin after normalization.
pub const MAX_NODE_SCORE: i64 = 100;

// ---- status ------------------------------------------------------------------

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Code {
    Success,
    /// The pod does not fit now; preemption might help.
    Unschedulable,
    /// The pod does not fit and removing pods would not change that.
    UnschedulableAndUnresolvable,
    /// Something went wrong (not the pod's fault).
    Error,
    /// From PreFilter/PreScore: this plugin has nothing to do for this pod.
    Skip,
    /// From Permit: wait before binding (not supported: treated as an error).
    Wait,
    /// From Bind: the API server refused the binding because the node's
    /// committed state had no room left (another scheduler got there
    /// first) — Omega's failed transaction: refresh and retry.
    Conflict,
}

/// What a plugin says, with reasons users read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Status {
    pub code: Code,
    pub reasons: Vec<String>,
    /// The plugin that failed the pod.
    pub plugin: &'static str,
}

impl Status {
    pub const fn success() -> Status {
        Status {
            code: Code::Success,
            reasons: Vec::new(),
            plugin: "",
        }
    }
    pub const fn skip() -> Status {
        Status {
            code: Code::Skip,
            reasons: Vec::new(),
            plugin: "",
        }
    }
    pub fn new(code: Code, reason: impl Into<String>) -> Status {
        Status {
            code,
            reasons: vec![reason.into()],
            plugin: "",
        }
    }
    pub fn unschedulable(reason: impl Into<String>) -> Status {
        Status::new(Code::Unschedulable, reason)
    }
    pub fn unresolvable(reason: impl Into<String>) -> Status {
        Status::new(Code::UnschedulableAndUnresolvable, reason)
    }
    pub fn error(reason: impl Into<String>) -> Status {
        Status::new(Code::Error, reason)
    }
    pub fn with_plugin(mut self, p: &'static str) -> Status {
        self.plugin = p;
        self
    }
    pub fn is_success(&self) -> bool {
        self.code == Code::Success
    }
    pub fn is_skip(&self) -> bool {
        self.code == Code::Skip
    }
    pub fn is_rejection(&self) -> bool {
        matches!(
            self.code,
            Code::Unschedulable | Code::UnschedulableAndUnresolvable
        )
    }
    pub fn message(&self) -> String {
        self.reasons.join(", ")
    }
}

impl fmt::Display for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}: {}", self.code, self.message())
    }
}

// ---- cycle state ----------------------------------------------------------------

/// Data a plugin keeps for one scheduling cycle.
pub trait StateData: Any + Send + Sync {
    fn clone_data(&self) -> Box<dyn StateData>;
    fn as_any(&self) -> &dyn Any;
    fn as_any_mut(&mut self) -> &mut dyn Any;
}

impl<T: Any + Clone + Send + Sync> StateData for T {
    fn clone_data(&self) -> Box<dyn StateData> {
        Box::new(self.clone())
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
    fn as_any_mut(&mut self) -> &mut dyn Any {
        self
    }
}

/// Per-cycle state: each plugin's data under its name, and which plugins
/// asked to be skipped.
#[derive(Default)]
pub struct CycleState {
    data: HashMap<&'static str, Box<dyn StateData>>,
    pub skip_filter: HashSet<&'static str>,
    pub skip_score: HashSet<&'static str>,
}

impl Clone for CycleState {
    fn clone(&self) -> Self {
        CycleState {
            data: self
                .data
                .iter()
                .map(|(k, v)| (*k, (**v).clone_data()))
                .collect(),
            skip_filter: self.skip_filter.clone(),
            skip_score: self.skip_score.clone(),
        }
    }
}

impl CycleState {
    pub fn write<T: StateData>(&mut self, key: &'static str, v: T) {
        self.data.insert(key, Box::new(v));
    }
    pub fn read<T: 'static>(&self, key: &'static str) -> Option<&T> {
        self.data
            .get(key)
            .and_then(|v| (**v).as_any().downcast_ref())
    }
    pub fn read_mut<T: 'static>(&mut self, key: &'static str) -> Option<&mut T> {
        self.data
            .get_mut(key)
            .and_then(|v| (**v).as_any_mut().downcast_mut())
    }
}

// ---- extension points -------------------------------------------------------------

/// Kinds of cluster changes that can make an unschedulable pod schedulable.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ClusterEvent {
    NodeAdd,
    NodeLabelChange,
    NodeTaintChange,
    NodeAllocatableChange,
    NodeSpecUnschedulableChange,
    NodeOtherChange,
    AssignedPodAdd,
    AssignedPodUpdate,
    AssignedPodDelete,
    NamespaceChange,
    ServiceChange,
    /// A PersistentVolumeClaim was added, changed or deleted.
    PvcChange,
    /// A PersistentVolume was added, changed or deleted.
    PvChange,
    /// A StorageClass was added, changed or deleted.
    StorageClassChange,
}

pub const ALL_NODE_EVENTS: &[ClusterEvent] = &[
    ClusterEvent::NodeAdd,
    ClusterEvent::NodeLabelChange,
    ClusterEvent::NodeTaintChange,
    ClusterEvent::NodeAllocatableChange,
    ClusterEvent::NodeSpecUnschedulableChange,
    ClusterEvent::NodeOtherChange,
];

/// Every plugin: a name, the extension points it implements, and the
/// cluster events after which a pod it rejected is worth retrying.
pub trait Plugin: Send + Sync + 'static {
    fn name(&self) -> &'static str;
    fn events(&self) -> &'static [ClusterEvent] {
        &[]
    }
    fn as_queue_sort(&self) -> Option<&dyn QueueSortPlugin> {
        None
    }
    fn as_pre_filter(&self) -> Option<&dyn PreFilterPlugin> {
        None
    }
    fn as_filter(&self) -> Option<&dyn FilterPlugin> {
        None
    }
    fn as_post_filter(&self) -> Option<&dyn PostFilterPlugin> {
        None
    }
    fn as_pre_score(&self) -> Option<&dyn PreScorePlugin> {
        None
    }
    fn as_score(&self) -> Option<&dyn ScorePlugin> {
        None
    }
    fn as_reserve(&self) -> Option<&dyn ReservePlugin> {
        None
    }
    fn as_permit(&self) -> Option<&dyn PermitPlugin> {
        None
    }
    fn as_pre_bind(&self) -> Option<&dyn PreBindPlugin> {
        None
    }
    fn as_bind(&self) -> Option<&dyn BindPlugin> {
        None
    }
    fn as_post_bind(&self) -> Option<&dyn PostBindPlugin> {
        None
    }
}

/// A pod waiting in the active queue.
#[derive(Debug, Clone)]
pub struct QueuedPod {
    pub info: Arc<PodInfo>,
    /// When the pod entered the queue first (monotonic sequence).
    pub timestamp: u64,
    pub attempts: u32,
}

pub trait QueueSortPlugin {
    /// Whether `a` should be scheduled before `b`.
    fn less(&self, a: &QueuedPod, b: &QueuedPod) -> bool;
}

/// The nodes a PreFilter plugin restricts the pod to (`None`: all).
pub type PreFilterResult = Option<HashSet<String>>;

pub trait PreFilterPlugin {
    fn pre_filter(
        &self,
        state: &mut CycleState,
        pod: &PodInfo,
        snap: &Snapshot,
    ) -> (PreFilterResult, Status);
    /// Whether `add_pod`/`remove_pod` must be called when preemption tries
    /// adding or removing pods (the plugin's state depends on other pods).
    fn has_extensions(&self) -> bool {
        false
    }
    fn add_pod(
        &self,
        _state: &mut CycleState,
        _pod: &PodInfo,
        _added: &PodInfo,
        _node: &NodeInfo,
        _snap: &Snapshot,
    ) {
    }
    fn remove_pod(
        &self,
        _state: &mut CycleState,
        _pod: &PodInfo,
        _removed: &PodInfo,
        _node: &NodeInfo,
        _snap: &Snapshot,
    ) {
    }
}

pub trait FilterPlugin {
    fn filter(&self, state: &CycleState, pod: &PodInfo, node: &NodeInfo, snap: &Snapshot)
        -> Status;
}

/// Nodes that failed filtering, with why.
pub type NodeStatuses = HashMap<String, Status>;

/// What a PostFilter plugin decided: a node to nominate, pods to evict.
#[derive(Debug, Default)]
pub struct PostFilterResult {
    pub nominated_node: Option<String>,
    pub victims: Vec<Arc<PodInfo>>,
}

pub trait PostFilterPlugin {
    fn post_filter(
        &self,
        fw: &Framework,
        state: &CycleState,
        pod: &PodInfo,
        statuses: &NodeStatuses,
        snap: &Snapshot,
    ) -> (PostFilterResult, Status);
}

pub trait PreScorePlugin {
    fn pre_score(
        &self,
        state: &mut CycleState,
        pod: &PodInfo,
        nodes: &[&NodeInfo],
        snap: &Snapshot,
    ) -> Status;
}

pub trait ScorePlugin {
    fn score(&self, state: &CycleState, pod: &PodInfo, node: &NodeInfo, snap: &Snapshot) -> i64;
    /// Rescales raw scores (in node order) to 0..=MAX_NODE_SCORE.
    fn normalize(&self, _state: &CycleState, _pod: &PodInfo, _scores: &mut [i64]) {}
}

pub trait ReservePlugin {
    fn reserve(&self, state: &mut CycleState, pod: &PodInfo, node: &str) -> Status;
    fn unreserve(&self, state: &mut CycleState, pod: &PodInfo, node: &str);
}

pub trait PermitPlugin {
    fn permit(&self, state: &CycleState, pod: &PodInfo, node: &str) -> Status;
}

pub trait PreBindPlugin {
    fn pre_bind(&self, pod: Arc<PodInfo>, node: String) -> BoxFuture<'static, Status>;
}

pub trait BindPlugin {
    /// Skip: another bind plugin should bind.
    fn bind(&self, pod: Arc<PodInfo>, node: String) -> BoxFuture<'static, Status>;
}

pub trait PostBindPlugin {
    fn post_bind(&self, pod: &PodInfo, node: &str);
}

/// Scales scores to 0..=MAX_NODE_SCORE by the largest; `reverse` makes the
/// largest raw score the worst.
pub fn default_normalize(scores: &mut [i64], reverse: bool) {
    let max = scores.iter().copied().max().unwrap_or(0);
    if max == 0 {
        if reverse {
            scores.iter_mut().for_each(|s| *s = MAX_NODE_SCORE);
        }
        return;
    }
    for s in scores.iter_mut() {
        let v = MAX_NODE_SCORE * *s / max;
        *s = if reverse { MAX_NODE_SCORE - v } else { v };
    }
}

// ---- a profile's framework ----------------------------------------------------------

pub struct ScorePluginEntry {
    pub plugin: Arc<dyn Plugin>,
    pub weight: i64,
}

/// One profile: its scheduler name and its plugins per extension point.
pub struct Framework {
    pub scheduler_name: String,
    pub queue_sort: Option<Arc<dyn Plugin>>,
    pub pre_filter: Vec<Arc<dyn Plugin>>,
    pub filter: Vec<Arc<dyn Plugin>>,
    pub post_filter: Vec<Arc<dyn Plugin>>,
    pub pre_score: Vec<Arc<dyn Plugin>>,
    pub score: Vec<ScorePluginEntry>,
    pub reserve: Vec<Arc<dyn Plugin>>,
    pub permit: Vec<Arc<dyn Plugin>>,
    pub pre_bind: Vec<Arc<dyn Plugin>>,
    pub bind: Vec<Arc<dyn Plugin>>,
    pub post_bind: Vec<Arc<dyn Plugin>>,
    pub percentage_of_nodes_to_score: Option<i32>,
}

impl Framework {
    /// Runs PreFilter plugins. Returns the allowed node names (if restricted)
    /// or the rejecting status.
    pub fn run_pre_filter(
        &self,
        state: &mut CycleState,
        pod: &PodInfo,
        snap: &Snapshot,
    ) -> Result<PreFilterResult, Status> {
        let mut allowed: PreFilterResult = None;
        for p in &self.pre_filter {
            let Some(pf) = p.as_pre_filter() else {
                continue;
            };
            let (res, st) = pf.pre_filter(state, pod, snap);
            match st.code {
                Code::Success => {}
                Code::Skip => {
                    state.skip_filter.insert(p.name());
                    continue;
                }
                _ => return Err(st.with_plugin(p.name())),
            }
            if let Some(set) = res {
                allowed = Some(match allowed {
                    None => set,
                    Some(prev) => prev.intersection(&set).cloned().collect(),
                });
            }
        }
        Ok(allowed)
    }

    /// The filters that run for this cycle (those whose PreFilter did not
    /// ask to be skipped), looked up once per cycle instead of per node.
    pub fn active_filters(&self, state: &CycleState) -> Vec<(&'static str, &dyn FilterPlugin)> {
        self.filter
            .iter()
            .filter(|p| !state.skip_filter.contains(p.name()))
            .filter_map(|p| p.as_filter().map(|f| (p.name(), f)))
            .collect()
    }

    /// Runs `filters` on one node; the first failure wins.
    pub fn run_filter_list(
        filters: &[(&'static str, &dyn FilterPlugin)],
        state: &CycleState,
        pod: &PodInfo,
        node: &NodeInfo,
        snap: &Snapshot,
    ) -> Status {
        for (name, f) in filters {
            let st = f.filter(state, pod, node, snap);
            if !st.is_success() {
                return st.with_plugin(name);
            }
        }
        Status::success()
    }

    /// Runs Filter plugins on one node; the first failure wins.
    pub fn run_filters(
        &self,
        state: &CycleState,
        pod: &PodInfo,
        node: &NodeInfo,
        snap: &Snapshot,
    ) -> Status {
        for p in &self.filter {
            let name = p.name();
            if !state.skip_filter.is_empty() && state.skip_filter.contains(name) {
                continue;
            }
            let Some(f) = p.as_filter() else { continue };
            let st = f.filter(state, pod, node, snap);
            if !st.is_success() {
                return st.with_plugin(name);
            }
        }
        Status::success()
    }

    /// Runs the filters as Kubernetes does when pods are nominated to the
    /// node: with the nominated pods of at least this pod's priority
    /// counted, and (if that passes) without them.
    pub fn run_filters_with_nominated(
        &self,
        filters: &[(&'static str, &dyn FilterPlugin)],
        state: &CycleState,
        pod: &PodInfo,
        node: &NodeInfo,
        snap: &Snapshot,
    ) -> Status {
        if snap.nominated.is_empty() {
            return Self::run_filter_list(filters, state, pod, node, snap);
        }
        let Some(nominated) = snap.nominated.get(&node.name) else {
            return Self::run_filter_list(filters, state, pod, node, snap);
        };
        let relevant: Vec<&Arc<PodInfo>> = nominated
            .iter()
            .filter(|p| p.uid != pod.uid && p.priority >= pod.priority)
            .collect();
        if relevant.is_empty() {
            return Self::run_filter_list(filters, state, pod, node, snap);
        }
        let mut st = state.clone();
        let mut n = node.clone();
        for p in relevant {
            n.add_pod((*p).clone());
            self.run_pre_filter_add_pod(&mut st, pod, p, &n, snap);
        }
        let with = self.run_filters(&st, pod, &n, snap);
        if !with.is_success() {
            return with;
        }
        Self::run_filter_list(filters, state, pod, node, snap)
    }

    pub fn run_pre_filter_add_pod(
        &self,
        state: &mut CycleState,
        pod: &PodInfo,
        added: &PodInfo,
        node: &NodeInfo,
        snap: &Snapshot,
    ) {
        for p in &self.pre_filter {
            if state.skip_filter.contains(p.name()) {
                continue;
            }
            if let Some(pf) = p.as_pre_filter().filter(|pf| pf.has_extensions()) {
                pf.add_pod(state, pod, added, node, snap);
            }
        }
    }

    pub fn run_pre_filter_remove_pod(
        &self,
        state: &mut CycleState,
        pod: &PodInfo,
        removed: &PodInfo,
        node: &NodeInfo,
        snap: &Snapshot,
    ) {
        for p in &self.pre_filter {
            if state.skip_filter.contains(p.name()) {
                continue;
            }
            if let Some(pf) = p.as_pre_filter().filter(|pf| pf.has_extensions()) {
                pf.remove_pod(state, pod, removed, node, snap);
            }
        }
    }

    /// Runs PreScore, Score, normalization and weights; returns the total
    /// score of each node in `nodes` order.
    pub fn run_scores(
        &self,
        state: &mut CycleState,
        pod: &PodInfo,
        nodes: &[&NodeInfo],
        snap: &Snapshot,
    ) -> Result<Vec<i64>, Status> {
        for p in &self.pre_score {
            let Some(ps) = p.as_pre_score() else { continue };
            let st = ps.pre_score(state, pod, nodes, snap);
            match st.code {
                Code::Success => {}
                Code::Skip => {
                    state.skip_score.insert(p.name());
                }
                _ => return Err(st.with_plugin(p.name())),
            }
        }
        let mut total = vec![0i64; nodes.len()];
        let mut buf = vec![0i64; nodes.len()];
        for e in &self.score {
            if state.skip_score.contains(e.plugin.name()) {
                continue;
            }
            let Some(s) = e.plugin.as_score() else {
                continue;
            };
            for (i, n) in nodes.iter().enumerate() {
                buf[i] = s.score(state, pod, n, snap);
            }
            s.normalize(state, pod, &mut buf);
            for (t, b) in total.iter_mut().zip(&buf) {
                *t += b.clamp(&0, &MAX_NODE_SCORE) * e.weight;
            }
        }
        Ok(total)
    }

    pub fn run_reserve(&self, state: &mut CycleState, pod: &PodInfo, node: &str) -> Status {
        for (i, p) in self.reserve.iter().enumerate() {
            if let Some(r) = p.as_reserve() {
                let st = r.reserve(state, pod, node);
                if !st.is_success() {
                    for q in self.reserve[..=i].iter().rev() {
                        if let Some(r) = q.as_reserve() {
                            r.unreserve(state, pod, node);
                        }
                    }
                    return st.with_plugin(p.name());
                }
            }
        }
        Status::success()
    }

    pub fn run_unreserve(&self, state: &mut CycleState, pod: &PodInfo, node: &str) {
        for p in self.reserve.iter().rev() {
            if let Some(r) = p.as_reserve() {
                r.unreserve(state, pod, node);
            }
        }
    }

    pub fn run_permit(&self, state: &CycleState, pod: &PodInfo, node: &str) -> Status {
        for p in &self.permit {
            if let Some(pm) = p.as_permit() {
                let st = pm.permit(state, pod, node);
                match st.code {
                    Code::Success | Code::Skip => {}
                    Code::Wait => {
                        return Status::error("waiting in Permit is not supported")
                            .with_plugin(p.name())
                    }
                    _ => return st.with_plugin(p.name()),
                }
            }
        }
        Status::success()
    }

    /// PreBind, Bind (the first bind plugin that does not skip), PostBind.
    pub fn bind_future(&self, pod: Arc<PodInfo>, node: String) -> BoxFuture<'static, Status> {
        let pre: Vec<Arc<dyn Plugin>> = self.pre_bind.clone();
        let bind: Vec<Arc<dyn Plugin>> = self.bind.clone();
        let post: Vec<Arc<dyn Plugin>> = self.post_bind.clone();
        Box::pin(async move {
            for p in &pre {
                if let Some(pb) = p.as_pre_bind() {
                    let st = pb.pre_bind(pod.clone(), node.clone()).await;
                    if !st.is_success() && !st.is_skip() {
                        return st.with_plugin(p.name());
                    }
                }
            }
            let mut bound = false;
            for p in &bind {
                if let Some(b) = p.as_bind() {
                    let st = b.bind(pod.clone(), node.clone()).await;
                    if st.is_skip() {
                        continue;
                    }
                    if !st.is_success() {
                        return st.with_plugin(p.name());
                    }
                    bound = true;
                    break;
                }
            }
            if !bound {
                return Status::error("no bind plugin bound the pod");
            }
            for p in &post {
                if let Some(pb) = p.as_post_bind() {
                    pb.post_bind(&pod, &node);
                }
            }
            Status::success()
        })
    }

    /// The plugins of this profile, each once.
    pub fn all_plugins(&self) -> Vec<Arc<dyn Plugin>> {
        let mut seen = HashSet::new();
        let mut out = Vec::new();
        let lists = [
            &self.pre_filter,
            &self.filter,
            &self.post_filter,
            &self.pre_score,
            &self.reserve,
            &self.permit,
            &self.pre_bind,
            &self.bind,
            &self.post_bind,
        ];
        let all = self
            .queue_sort
            .iter()
            .chain(lists.into_iter().flatten())
            .chain(self.score.iter().map(|e| &e.plugin));
        for p in all {
            if seen.insert(p.name()) {
                out.push(p.clone());
            }
        }
        out
    }

    /// Whether `event` could help a pod rejected by `plugins`.
    pub fn event_may_help(&self, event: ClusterEvent, plugins: &HashSet<&'static str>) -> bool {
        if plugins.is_empty() {
            return true;
        }
        self.all_plugins()
            .iter()
            .any(|p| plugins.contains(p.name()) && p.events().contains(&event))
    }
}
