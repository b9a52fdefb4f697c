//! The scheduling loop: watches feed the cache and the queue; one task pops
//! pods, runs the profile's plugins against the cache, assumes the pod on
//! the chosen node and binds asynchronously while the next pod is scheduled.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::core::v1::{
    Namespace, Node, PersistentVolume, PersistentVolumeClaim, Pod, Service,
};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::api::scheduling::v1::PriorityClass;
use k8s_openapi::api::storage::v1::StorageClass;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, DeleteParams, Patch, PatchParams};
use kube::runtime::watcher;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use serde_json::json;
use tokio::sync::mpsc;

use crate::cache::Cache;
use crate::events::Recorder;
use crate::framework::{
    ClusterEvent, Code, CycleState, Framework, NodeStatuses, QueuedPod, Status,
};
use crate::lean_pod::LeanPod;
use crate::metrics::Metrics;
use crate::plugins::default_preemption::{histogram, PdbInfo};
use crate::plugins::volume_binding::{Claim, Class, Volume, Volumes};
use crate::queue::{event_helps, SchedulingQueue};
use crate::types::{NodeInfo, PodInfo, Selector};

/// Priorities of the built-in classes, when they are not API objects.
const BUILTIN_CLASSES: &[(&str, i32)] = &[
    ("system-node-critical", 2_000_001_000),
    ("system-cluster-critical", 2_000_000_000),
];

/// Kubernetes' adaptive share of nodes to look at: 50% minus 1% per 125
/// nodes, at least 5%, and at least 100 nodes.
pub fn num_feasible_nodes_to_find(percentage: Option<i32>, num_nodes: usize) -> usize {
    const MIN_NODES: usize = 100;
    if num_nodes < MIN_NODES {
        return num_nodes;
    }
    let pct = match percentage {
        Some(p) if p > 0 => p as usize,
        _ => (50usize.saturating_sub(num_nodes / 125)).max(5),
    };
    if pct >= 100 {
        return num_nodes;
    }
    (num_nodes * pct / 100).max(MIN_NODES)
}

/// Why a pod fits nowhere.
#[derive(Debug, Default)]
pub struct FitError {
    pub num_all_nodes: usize,
    pub statuses: NodeStatuses,
    pub pre_filter_msg: Option<String>,
    pub post_filter_msg: Option<String>,
    pub rejectors: HashSet<&'static str>,
}

impl FitError {
    /// kube-scheduler's message: "0/3 nodes are available: 1 node(s) had
    /// untolerated taint {a: b}, 2 Insufficient cpu. preemption: …".
    pub fn message(&self) -> String {
        if self.num_all_nodes == 0 {
            return "no nodes available to schedule pods".into();
        }
        let mut msg = format!("0/{} nodes are available:", self.num_all_nodes);
        match &self.pre_filter_msg {
            Some(p) => msg.push_str(&format!(" {p}.")),
            None => {
                let mut reasons: BTreeMap<String, usize> = BTreeMap::new();
                for st in self.statuses.values() {
                    for r in &st.reasons {
                        *reasons.entry(r.clone()).or_default() += 1;
                    }
                }
                msg.push_str(&format!(" {}.", histogram(&reasons)));
            }
        }
        if let Some(p) = self.post_filter_msg.as_ref().filter(|p| !p.is_empty()) {
            msg.push(' ');
            msg.push_str(p);
        }
        msg
    }
}

pub enum ScheduleOutcome {
    Fit(String),
    NoFit(FitError),
    Error(Status),
}

/// One scheduling cycle's algorithm (filter, score, select) for `pod`.
pub fn find_node(
    fw: &Framework,
    state: &mut CycleState,
    pod: &PodInfo,
    cache: &Cache,
    next_start: &mut usize,
    rng: &mut SmallRng,
) -> ScheduleOutcome {
    let snap = &cache.snap;
    let num_all = snap.num_real_nodes();
    if num_all == 0 {
        return ScheduleOutcome::NoFit(FitError::default());
    }
    let allowed = match fw.run_pre_filter(state, pod, snap) {
        Ok(a) => a,
        Err(st) if st.is_rejection() => {
            let mut fe = FitError {
                num_all_nodes: num_all,
                pre_filter_msg: Some(st.message()),
                ..Default::default()
            };
            fe.rejectors.insert(st.plugin);
            for n in snap.real_nodes() {
                fe.statuses.insert(n.name.clone(), st.clone());
            }
            return ScheduleOutcome::NoFit(fe);
        }
        Err(st) => return ScheduleOutcome::Error(st),
    };
    let filters = fw.active_filters(state);
    let mut statuses = NodeStatuses::new();
    let mut feasible: Vec<usize> = Vec::new();
    let total = snap.nodes.len();
    let to_find = num_feasible_nodes_to_find(fw.percentage_of_nodes_to_score, num_all);
    let start = if total == 0 { 0 } else { *next_start % total };
    let mut processed = 0;
    for k in 0..total {
        let i = (start + k) % total;
        let node = &snap.nodes[i];
        if node.node.is_none() {
            continue;
        }
        processed = k + 1;
        if let Some(set) = &allowed {
            if !set.contains(&node.name) {
                statuses.insert(
                    node.name.clone(),
                    Status::unresolvable("node(s) didn't satisfy plugin(s) [NodeAffinity]")
                        .with_plugin(crate::plugins::node_affinity::NAME),
                );
                continue;
            }
        }
        let st = fw.run_filters_with_nominated(&filters, state, pod, node, snap);
        if st.is_success() {
            feasible.push(i);
            if feasible.len() >= to_find {
                break;
            }
        } else if st.code == Code::Error {
            return ScheduleOutcome::Error(st);
        } else {
            statuses.insert(node.name.clone(), st);
        }
    }
    if total > 0 {
        *next_start = (start + processed) % total;
    }
    if feasible.is_empty() {
        let rejectors = statuses.values().map(|s| s.plugin).collect();
        return ScheduleOutcome::NoFit(FitError {
            num_all_nodes: num_all,
            statuses,
            rejectors,
            ..Default::default()
        });
    }
    if feasible.len() == 1 {
        return ScheduleOutcome::Fit(snap.nodes[feasible[0]].name.clone());
    }
    let nodes: Vec<&NodeInfo> = feasible.iter().map(|i| &snap.nodes[*i]).collect();
    let scores = match fw.run_scores(state, pod, &nodes, snap) {
        Ok(s) => s,
        Err(st) => return ScheduleOutcome::Error(st),
    };
    // The best score; ties broken at random (reservoir sampling).
    let mut best = 0;
    let mut ties = 0u32;
    for (i, s) in scores.iter().enumerate() {
        if *s > scores[best] {
            best = i;
            ties = 1;
        } else if *s == scores[best] {
            ties += 1;
            if rng.random_range(0..ties) == 0 {
                best = i;
            }
        }
    }
    ScheduleOutcome::Fit(nodes[best].name.clone())
}

// ---- volumes ----------------------------------------------------------------------------

/// A watched kind that VolumeBinding keeps in `Snapshot::volumes`.
trait VolumeKind {
    fn key(&self) -> String;
    fn put(&self, v: &mut Volumes);
    fn remove(v: &mut Volumes, key: &str);
    fn keys(v: &Volumes) -> Vec<String>;
}

impl VolumeKind for PersistentVolumeClaim {
    fn key(&self) -> String {
        format!(
            "{}/{}",
            self.metadata.namespace.as_deref().unwrap_or(""),
            self.metadata.name.as_deref().unwrap_or("")
        )
    }
    fn put(&self, v: &mut Volumes) {
        v.put_claim(Claim::of(self));
    }
    fn remove(v: &mut Volumes, key: &str) {
        v.claims.remove(key);
    }
    fn keys(v: &Volumes) -> Vec<String> {
        v.claims.keys().cloned().collect()
    }
}

impl VolumeKind for PersistentVolume {
    fn key(&self) -> String {
        name_of(self)
    }
    fn put(&self, v: &mut Volumes) {
        v.put_volume(Volume::of(self));
    }
    fn remove(v: &mut Volumes, key: &str) {
        v.volumes.remove(key);
    }
    fn keys(v: &Volumes) -> Vec<String> {
        v.volumes.keys().cloned().collect()
    }
}

impl VolumeKind for StorageClass {
    fn key(&self) -> String {
        name_of(self)
    }
    fn put(&self, v: &mut Volumes) {
        v.classes.insert(name_of(self), Class::of(self));
    }
    fn remove(v: &mut Volumes, key: &str) {
        v.classes.remove(key);
    }
    fn keys(v: &Volumes) -> Vec<String> {
        v.classes.keys().cloned().collect()
    }
}

// ---- the running scheduler -------------------------------------------------------------

#[allow(clippy::large_enum_variant)]
pub enum Input {
    Pod(watcher::Event<LeanPod>),
    Node(watcher::Event<Node>),
    Namespace(watcher::Event<Namespace>),
    PriorityClass(watcher::Event<PriorityClass>),
    Pdb(watcher::Event<PodDisruptionBudget>),
    Service(watcher::Event<Service>),
    Pvc(watcher::Event<PersistentVolumeClaim>),
    Pv(watcher::Event<PersistentVolume>),
    StorageClass(watcher::Event<StorageClass>),
    BindDone {
        qp: QueuedPod,
        node: String,
        profile: String,
        status: Status,
    },
}

pub struct Scheduler {
    client: kube::Client,
    profiles: HashMap<String, Arc<Framework>>,
    plugin_events: HashMap<&'static str, &'static [ClusterEvent]>,
    pub cache: Cache,
    queue: SchedulingQueue,
    priority_classes: HashMap<String, (i32, bool)>,
    /// Unbound pods of our profiles we know exist (uid).
    pending: HashSet<String>,
    next_start: usize,
    rng: SmallRng,
    metrics: Arc<Metrics>,
    recorder: Recorder,
    tx: mpsc::UnboundedSender<Input>,
    rx: mpsc::UnboundedReceiver<Input>,
    /// Keys seen since a watch (re)started listing, per kind.
    relist: HashMap<&'static str, HashSet<String>>,
    synced: HashSet<&'static str>,
    /// Pods nominated by preemption: uid → node.
    nominated: HashMap<String, String>,
    /// When instances share the profiles' pods: which are this one's.
    ownership: Option<crate::shard::Ownership>,
    /// Pending pods another instance owns now, kept to be looked at again
    /// when the instances change.
    not_mine: HashMap<String, Arc<PodInfo>>,
}

fn spawn_watch<K>(
    api: Api<K>,
    tx: mpsc::UnboundedSender<Input>,
    wrap: fn(watcher::Event<K>) -> Input,
) where
    K: kube::Resource
        + Clone
        + std::fmt::Debug
        + serde::de::DeserializeOwned
        + Send
        + Sync
        + 'static,
    K::DynamicType: Default,
{
    tokio::spawn(async move {
        let mut stream = std::pin::pin!(watcher::watcher(api, watcher::Config::default()));
        let mut backoff = Duration::from_millis(100);
        while let Some(ev) = stream.next().await {
            match ev {
                Ok(ev) => {
                    backoff = Duration::from_millis(100);
                    if tx.send(wrap(ev)).is_err() {
                        return;
                    }
                }
                Err(e) => {
                    tracing::debug!(error = %e, kind = %K::kind(&Default::default()), "watch failed; retrying");
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(Duration::from_secs(5));
                }
            }
        }
    });
}

fn uid_of<K: kube::Resource>(o: &K) -> String {
    let m = o.meta();
    m.uid.clone().unwrap_or_else(|| {
        format!(
            "{}/{}",
            m.namespace.as_deref().unwrap_or(""),
            m.name.as_deref().unwrap_or("")
        )
    })
}

fn name_of<K: kube::Resource>(o: &K) -> String {
    o.meta().name.clone().unwrap_or_default()
}

/// A bound pod as the cache keeps it: of its status only what the plugins
/// read of pods already placed (the start time orders preemption victims;
/// the phase). Conditions, container statuses and addresses change with
/// every kubelet report and were most of a cached pod's status.
fn bound_lean(mut p: Pod) -> Pod {
    if let Some(st) = p.status.take() {
        p.status = Some(k8s_openapi::api::core::v1::PodStatus {
            phase: st.phase,
            start_time: st.start_time,
            ..Default::default()
        });
    }
    p
}

fn is_terminal(p: &Pod) -> bool {
    matches!(
        p.status.as_ref().and_then(|s| s.phase.as_deref()),
        Some("Succeeded") | Some("Failed")
    )
}

fn node_changes(old: &Node, new: &Node) -> Vec<ClusterEvent> {
    let mut out = Vec::new();
    if old.metadata.labels != new.metadata.labels {
        out.push(ClusterEvent::NodeLabelChange);
    }
    let taints = |n: &Node| n.spec.as_ref().and_then(|s| s.taints.clone());
    if taints(old) != taints(new) {
        out.push(ClusterEvent::NodeTaintChange);
    }
    let unsched = |n: &Node| {
        n.spec
            .as_ref()
            .and_then(|s| s.unschedulable)
            .unwrap_or(false)
    };
    if unsched(old) != unsched(new) {
        out.push(ClusterEvent::NodeSpecUnschedulableChange);
    }
    let alloc = |n: &Node| n.status.as_ref().and_then(|s| s.allocatable.clone());
    if alloc(old) != alloc(new) {
        out.push(ClusterEvent::NodeAllocatableChange);
    }
    // The local storage an agent publishes after registering (what
    // VolumeBinding checks for skiff's provisioner); other annotations
    // change nothing the plugins read.
    let storage = |n: &Node| {
        n.metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(skiff_core::kinds::storage::LOCAL_STORAGE_ANNOTATION))
            .cloned()
    };
    if storage(old) != storage(new) {
        out.push(ClusterEvent::NodeOtherChange);
    }
    out
}

impl Scheduler {
    pub fn new(
        client: kube::Client,
        profiles: Vec<Arc<Framework>>,
        metrics: Arc<Metrics>,
    ) -> anyhow::Result<Scheduler> {
        let sort = profiles
            .iter()
            .find_map(|p| p.queue_sort.clone())
            .unwrap_or_else(|| Arc::new(crate::plugins::priority_sort::PrioritySort));
        let mut plugin_events = HashMap::new();
        for fw in &profiles {
            for p in fw.all_plugins() {
                plugin_events.insert(p.name(), p.events());
            }
        }
        let (tx, rx) = mpsc::unbounded_channel();
        let priority_classes = BUILTIN_CLASSES
            .iter()
            .map(|(n, v)| (n.to_string(), (*v, false)))
            .collect();
        Ok(Scheduler {
            recorder: Recorder::start(Some(client.clone()), metrics.clone()),
            client,
            profiles: profiles
                .into_iter()
                .map(|p| (p.scheduler_name.clone(), p))
                .collect(),
            plugin_events,
            cache: Cache::new(),
            queue: SchedulingQueue::new(sort),
            priority_classes,
            pending: HashSet::new(),
            next_start: 0,
            rng: SmallRng::from_os_rng(),
            metrics,
            tx,
            rx,
            relist: HashMap::new(),
            synced: HashSet::new(),
            nominated: HashMap::new(),
            ownership: None,
            not_mine: HashMap::new(),
        })
    }

    /// Schedules only the pods `ownership` gives this instance.
    pub fn with_ownership(mut self, ownership: crate::shard::Ownership) -> Scheduler {
        self.ownership = Some(ownership);
        self
    }

    /// The instances sharing the pods changed: every pod set aside as
    /// another's is looked at again.
    fn instances_changed(&mut self) {
        for (uid, info) in std::mem::take(&mut self.not_mine) {
            if self.pending.contains(&uid) {
                self.queue.add_or_update(info);
            }
        }
    }

    fn start_watches(&self) {
        let c = &self.client;
        spawn_watch::<LeanPod>(Api::all(c.clone()), self.tx.clone(), Input::Pod);
        spawn_watch::<Node>(Api::all(c.clone()), self.tx.clone(), Input::Node);
        spawn_watch::<Namespace>(Api::all(c.clone()), self.tx.clone(), Input::Namespace);
        spawn_watch::<PriorityClass>(Api::all(c.clone()), self.tx.clone(), Input::PriorityClass);
        spawn_watch::<PodDisruptionBudget>(Api::all(c.clone()), self.tx.clone(), Input::Pdb);
        spawn_watch::<Service>(Api::all(c.clone()), self.tx.clone(), Input::Service);
        spawn_watch::<PersistentVolumeClaim>(Api::all(c.clone()), self.tx.clone(), Input::Pvc);
        spawn_watch::<PersistentVolume>(Api::all(c.clone()), self.tx.clone(), Input::Pv);
        spawn_watch::<StorageClass>(Api::all(c.clone()), self.tx.clone(), Input::StorageClass);
    }

    fn priority_of(&self, pod: &Pod) -> i32 {
        if let Some(p) = PodInfo::spec_priority(pod) {
            return p;
        }
        match pod
            .spec
            .as_ref()
            .and_then(|s| s.priority_class_name.as_deref())
        {
            Some(name) if !name.is_empty() => self
                .priority_classes
                .get(name)
                .map(|(v, _)| *v)
                .unwrap_or(0),
            _ => self
                .priority_classes
                .values()
                .find(|(_, global)| *global)
                .map(|(v, _)| *v)
                .unwrap_or(0),
        }
    }

    fn nominate(&mut self, info: &Arc<PodInfo>, node: &str) {
        self.clear_nomination(&info.uid);
        self.nominated.insert(info.uid.clone(), node.to_string());
        self.cache
            .snap
            .nominated
            .entry(node.to_string())
            .or_default()
            .push(info.clone());
    }

    fn clear_nomination(&mut self, uid: &str) {
        if let Some(node) = self.nominated.remove(uid) {
            if let Some(list) = self.cache.snap.nominated.get_mut(&node) {
                list.retain(|p| p.uid != uid);
                if list.is_empty() {
                    self.cache.snap.nominated.remove(&node);
                }
            }
        }
    }

    fn cluster_event(&mut self, ev: ClusterEvent) {
        let pe = &self.plugin_events;
        self.queue.on_event(|_, rej| event_helps(ev, rej, pe));
    }

    // ---- inputs ------------------------------------------------------------------

    fn relist_begin(&mut self, kind: &'static str) {
        self.relist.insert(kind, HashSet::new());
    }

    fn relist_seen(&mut self, kind: &'static str, key: String) {
        if let Some(s) = self.relist.get_mut(kind) {
            s.insert(key);
        }
    }

    fn relist_end(&mut self, kind: &'static str) -> HashSet<String> {
        self.synced.insert(kind);
        self.relist.remove(kind).unwrap_or_default()
    }

    fn handle(&mut self, input: Input) {
        self.metrics.watch_events.fetch_add(1, Relaxed);
        match input {
            Input::Pod(ev) => match ev {
                watcher::Event::Init => self.relist_begin("pod"),
                watcher::Event::InitApply(p) => {
                    self.relist_seen("pod", uid_of(&p));
                    self.pod_apply(p.0);
                }
                watcher::Event::Apply(p) => self.pod_apply(p.0),
                watcher::Event::Delete(p) => self.pod_delete(&uid_of(&p)),
                watcher::Event::InitDone => {
                    let seen = self.relist_end("pod");
                    let gone: Vec<String> = self
                        .pending
                        .iter()
                        .filter(|u| !seen.contains(*u))
                        .cloned()
                        .collect();
                    for u in gone {
                        self.pod_delete(&u);
                    }
                }
            },
            Input::Node(ev) => match ev {
                watcher::Event::Init => self.relist_begin("node"),
                watcher::Event::InitApply(n) => {
                    self.relist_seen("node", name_of(&n));
                    self.node_apply(n);
                }
                watcher::Event::Apply(n) => self.node_apply(n),
                watcher::Event::Delete(n) => self.cache.remove_node(&name_of(&n)),
                watcher::Event::InitDone => {
                    let seen = self.relist_end("node");
                    let gone: Vec<String> = self
                        .cache
                        .snap
                        .real_nodes()
                        .filter(|n| !seen.contains(&n.name))
                        .map(|n| n.name.clone())
                        .collect();
                    for n in gone {
                        self.cache.remove_node(&n);
                    }
                }
            },
            Input::Namespace(ev) => {
                match ev {
                    watcher::Event::Apply(n) | watcher::Event::InitApply(n) => {
                        let labels = n.metadata.labels.clone().unwrap_or_default();
                        self.cache.set_namespace(name_of(&n), labels);
                    }
                    watcher::Event::Delete(n) => self.cache.remove_namespace(&name_of(&n)),
                    watcher::Event::InitDone => {
                        self.synced.insert("namespace");
                    }
                    watcher::Event::Init => {}
                }
                self.cluster_event(ClusterEvent::NamespaceChange);
            }
            Input::PriorityClass(ev) => match ev {
                watcher::Event::Apply(pc) | watcher::Event::InitApply(pc) => {
                    self.priority_classes
                        .insert(name_of(&pc), (pc.value, pc.global_default.unwrap_or(false)));
                }
                watcher::Event::Delete(pc) => {
                    let name = name_of(&pc);
                    self.priority_classes.remove(&name);
                    if let Some((n, v)) = BUILTIN_CLASSES.iter().find(|(n, _)| *n == name) {
                        self.priority_classes.insert(n.to_string(), (*v, false));
                    }
                }
                watcher::Event::InitDone => {
                    self.synced.insert("priorityclass");
                }
                watcher::Event::Init => {}
            },
            Input::Pdb(ev) => match ev {
                watcher::Event::Init => self.cache.snap.pdbs.clear(),
                watcher::Event::Apply(p) | watcher::Event::InitApply(p) => {
                    let ns = p.metadata.namespace.clone().unwrap_or_default();
                    let name = name_of(&p);
                    self.cache
                        .snap
                        .pdbs
                        .retain(|x| !(x.namespace == ns && x.name == name));
                    let spec = p.spec.as_ref();
                    let status = p.status.as_ref();
                    self.cache.snap.pdbs.push(PdbInfo {
                        namespace: ns,
                        name,
                        selector: spec
                            .and_then(|s| s.selector.as_ref())
                            .map(|s| Selector::from_label_selector(Some(s)))
                            .unwrap_or_default(),
                        disruptions_allowed: status
                            .map(|s| s.disruptions_allowed as i64)
                            .unwrap_or(0),
                        disrupted_pods: status
                            .and_then(|s| s.disrupted_pods.as_ref())
                            .map(|m| m.keys().cloned().collect())
                            .unwrap_or_default(),
                    });
                }
                watcher::Event::Delete(p) => {
                    let ns = p.metadata.namespace.clone().unwrap_or_default();
                    let name = name_of(&p);
                    self.cache
                        .snap
                        .pdbs
                        .retain(|x| !(x.namespace == ns && x.name == name));
                }
                watcher::Event::InitDone => {}
            },
            Input::Service(ev) => {
                match ev {
                    watcher::Event::Init => self.cache.snap.services.clear(),
                    watcher::Event::Apply(s) | watcher::Event::InitApply(s) => {
                        let ns = s.metadata.namespace.clone().unwrap_or_default();
                        let sel = s
                            .spec
                            .as_ref()
                            .and_then(|sp| sp.selector.as_ref())
                            .filter(|m| !m.is_empty())
                            .map(Selector::from_map);
                        let m = self.cache.snap.services.entry(ns).or_default();
                        match sel {
                            Some(sel) => {
                                m.insert(name_of(&s), sel);
                            }
                            None => {
                                m.remove(&name_of(&s));
                            }
                        }
                    }
                    watcher::Event::Delete(s) => {
                        let ns = s.metadata.namespace.clone().unwrap_or_default();
                        if let Some(m) = self.cache.snap.services.get_mut(&ns) {
                            m.remove(&name_of(&s));
                        }
                    }
                    watcher::Event::InitDone => {}
                }
                self.cluster_event(ClusterEvent::ServiceChange);
            }
            Input::Pvc(ev) => self.volume_event("pvc", ev, ClusterEvent::PvcChange),
            Input::Pv(ev) => self.volume_event("pv", ev, ClusterEvent::PvChange),
            Input::StorageClass(ev) => {
                self.volume_event("storageclass", ev, ClusterEvent::StorageClassChange)
            }
            Input::BindDone {
                qp,
                node,
                profile,
                status,
            } => self.bind_done(qp, node, profile, status),
        }
    }

    /// Claims, volumes and classes into the snapshot (as the few fields
    /// VolumeBinding reads); objects gone during a relist are dropped at
    /// its end.
    fn volume_event<K: VolumeKind>(
        &mut self,
        kind: &'static str,
        ev: watcher::Event<K>,
        change: ClusterEvent,
    ) {
        match ev {
            watcher::Event::Init => self.relist_begin(kind),
            watcher::Event::InitApply(o) => {
                self.relist_seen(kind, o.key());
                o.put(&mut self.cache.snap.volumes);
            }
            watcher::Event::Apply(o) => o.put(&mut self.cache.snap.volumes),
            watcher::Event::Delete(o) => K::remove(&mut self.cache.snap.volumes, &o.key()),
            watcher::Event::InitDone => {
                let seen = self.relist_end(kind);
                let vols = &mut self.cache.snap.volumes;
                for key in K::keys(vols) {
                    if !seen.contains(&key) {
                        K::remove(vols, &key);
                    }
                }
            }
        }
        self.cluster_event(change);
    }

    fn pod_apply(&mut self, pod: Pod) {
        let uid = uid_of(&pod);
        let bound = pod
            .spec
            .as_ref()
            .and_then(|s| s.node_name.as_deref())
            .is_some_and(|n| !n.is_empty());
        if is_terminal(&pod) {
            self.pod_delete(&uid);
            return;
        }
        let priority = self.priority_of(&pod);
        if bound {
            self.queue.delete(&uid);
            self.not_mine.remove(&uid);
            self.pending.remove(&uid);
            self.clear_nomination(&uid);
            let was_known = self.cache.contains_pod(&uid);
            let was_assumed = self.cache.is_assumed(&uid);
            self.cache
                .add_or_update_bound_pod(PodInfo::new(bound_lean(pod), priority));
            if !was_assumed {
                self.cluster_event(if was_known {
                    ClusterEvent::AssignedPodUpdate
                } else {
                    ClusterEvent::AssignedPodAdd
                });
            }
            return;
        }
        let info = PodInfo::new(pod, priority);
        if info.terminating || !self.profiles.contains_key(&info.scheduler_name) {
            self.queue.delete(&uid);
            self.pending.remove(&uid);
            return;
        }
        self.pending.insert(uid.clone());
        let info = Arc::new(info);
        let nominated = info
            .pod
            .status
            .as_ref()
            .and_then(|s| s.nominated_node_name.as_deref())
            .filter(|n| !n.is_empty());
        match nominated {
            Some(n) => self.nominate(&info, n),
            None => self.clear_nomination(&uid),
        }
        if self.cache.is_assumed(&uid) {
            // Being bound; the watch has not caught up yet.
            return;
        }
        if let Some(slot) = self.not_mine.get_mut(&uid) {
            *slot = info;
            return;
        }
        self.queue.add_or_update(info);
    }

    fn pod_delete(&mut self, uid: &str) {
        self.queue.delete(uid);
        self.not_mine.remove(uid);
        self.pending.remove(uid);
        self.clear_nomination(uid);
        if self.cache.remove_pod(uid).is_some() {
            self.cluster_event(ClusterEvent::AssignedPodDelete);
        }
    }

    fn node_apply(&mut self, mut node: Node) {
        // Never read here; a node's managedFields are as large as the rest
        // of it, times 10,000 nodes.
        node.metadata.managed_fields = None;
        let new = node.clone();
        match self.cache.upsert_node(node) {
            None => self.cluster_event(ClusterEvent::NodeAdd),
            Some(old) => {
                for ev in node_changes(&old, &new) {
                    self.cluster_event(ev);
                }
            }
        }
    }

    // ---- scheduling ----------------------------------------------------------------------

    fn schedule_one(&mut self, qp: QueuedPod) {
        let uid = qp.info.uid.clone();
        let Some(fw) = self.profiles.get(&qp.info.scheduler_name).cloned() else {
            self.queue.delete(&uid);
            return;
        };
        if !self.pending.contains(&uid) || self.cache.contains_pod(&uid) {
            self.queue.done(&uid);
            return;
        }
        if let Some(o) = &self.ownership {
            if !o.owns(&uid) {
                self.queue.done(&uid);
                self.not_mine.insert(uid, qp.info);
                return;
            }
        }
        let t0 = Instant::now();
        let mut state = CycleState::default();
        let outcome = find_node(
            &fw,
            &mut state,
            &qp.info,
            &self.cache,
            &mut self.next_start,
            &mut self.rng,
        );
        match outcome {
            ScheduleOutcome::Fit(node) => {
                self.clear_nomination(&uid);
                self.cache.assume(qp.info.clone(), &node);
                let mut st = fw.run_reserve(&mut state, &qp.info, &node);
                if st.is_success() {
                    st = fw.run_permit(&state, &qp.info, &node);
                    if !st.is_success() {
                        fw.run_unreserve(&mut state, &qp.info, &node);
                    }
                }
                self.metrics.add_algorithm(t0.elapsed());
                if !st.is_success() {
                    self.cache.forget(&uid);
                    self.fail(
                        &fw,
                        qp,
                        st.message(),
                        st.is_rejection(),
                        [st.plugin].into(),
                        None,
                    );
                    return;
                }
                self.queue.done(&uid);
                let fut = fw.bind_future(qp.info.clone(), node.clone());
                let tx = self.tx.clone();
                let profile = fw.scheduler_name.clone();
                tokio::spawn(async move {
                    let status = fut.await;
                    let _ = tx.send(Input::BindDone {
                        qp,
                        node,
                        profile,
                        status,
                    });
                });
            }
            ScheduleOutcome::NoFit(mut fe) => {
                // PostFilter (preemption).
                let mut nominated = None;
                for p in &fw.post_filter {
                    let Some(pf) = p.as_post_filter() else {
                        continue;
                    };
                    let (res, st) =
                        pf.post_filter(&fw, &state, &qp.info, &fe.statuses, &self.cache.snap);
                    if st.is_success() {
                        if let Some(node) = res.nominated_node.clone() {
                            self.nominate(&qp.info, &node);
                            self.preempt(&fw, &qp.info, &node, res.victims);
                            nominated = Some(node);
                        }
                        break;
                    }
                    fe.post_filter_msg = Some(st.message());
                    if st.code != Code::Unschedulable {
                        break;
                    }
                }
                self.metrics.add_algorithm(t0.elapsed());
                self.metrics.unschedulable.fetch_add(1, Relaxed);
                let msg = fe.message();
                let rejectors = std::mem::take(&mut fe.rejectors);
                self.fail(&fw, qp, msg, true, rejectors, nominated);
            }
            ScheduleOutcome::Error(st) => {
                self.metrics.add_algorithm(t0.elapsed());
                self.fail(&fw, qp, st.message(), false, HashSet::new(), None);
            }
        }
    }

    /// Records a failed attempt (event + condition) and requeues the pod.
    fn fail(
        &mut self,
        fw: &Framework,
        qp: QueuedPod,
        message: String,
        unschedulable: bool,
        rejectors: HashSet<&'static str>,
        nominated: Option<String>,
    ) {
        let info = qp.info.clone();
        self.recorder.pod_event(
            &info,
            &fw.scheduler_name,
            "Warning",
            "FailedScheduling",
            "Scheduling",
            message.clone(),
        );
        self.update_condition(
            &info,
            &message,
            if unschedulable {
                "Unschedulable"
            } else {
                "SchedulerError"
            },
            nominated,
        );
        if unschedulable {
            self.queue.add_unschedulable(qp, rejectors);
        } else {
            self.queue.add_backoff(qp);
        }
    }

    fn update_condition(
        &self,
        info: &PodInfo,
        message: &str,
        reason: &str,
        nominated: Option<String>,
    ) {
        let status = info.pod.status.as_ref();
        let same = status
            .and_then(|s| s.conditions.as_ref())
            .and_then(|cs| cs.iter().find(|c| c.type_ == "PodScheduled"))
            .is_some_and(|c| {
                c.status == "False"
                    && c.reason.as_deref() == Some(reason)
                    && c.message.as_deref() == Some(message)
            });
        let cur_nominated = status.and_then(|s| s.nominated_node_name.clone());
        if same && (nominated.is_none() || nominated == cur_nominated) {
            return;
        }
        let mut st = json!({"conditions": [{
            "type": "PodScheduled",
            "status": "False",
            "reason": reason,
            "message": message,
            "lastTransitionTime": Timestamp::now().to_string(),
        }]});
        if let Some(n) = nominated {
            st["nominatedNodeName"] = json!(n);
        }
        let api: Api<Pod> = Api::namespaced(self.client.clone(), &info.namespace);
        let name = info.name.clone();
        tokio::spawn(async move {
            let patch = Patch::Strategic(json!({"status": st}));
            if let Err(e) = api
                .patch_status(&name, &PatchParams::default(), &patch)
                .await
            {
                tracing::debug!(pod = %name, error = %e, "updating PodScheduled failed");
            }
        });
    }

    fn preempt(&self, fw: &Framework, pod: &PodInfo, node: &str, victims: Vec<Arc<PodInfo>>) {
        for v in &victims {
            self.recorder.pod_event(
                v,
                &fw.scheduler_name,
                "Normal",
                "Preempted",
                "Preempting",
                format!("Preempted by pod {} on node {node}", pod.uid),
            );
        }
        let client = self.client.clone();
        tokio::spawn(async move {
            for v in victims {
                let api: Api<Pod> = Api::namespaced(client.clone(), &v.namespace);
                let dp = DeleteParams {
                    preconditions: Some(kube::api::Preconditions {
                        uid: Some(v.uid.clone()),
                        resource_version: None,
                    }),
                    ..Default::default()
                };
                if let Err(e) = api.delete(&v.name, &dp).await {
                    tracing::debug!(pod = %v.key, error = %e, "deleting a preemption victim failed");
                }
            }
        });
    }

    fn bind_done(&mut self, qp: QueuedPod, node: String, profile: String, status: Status) {
        let fw = self.profiles.get(&profile).cloned();
        if status.is_success() {
            self.metrics.scheduled.fetch_add(1, Relaxed);
            self.recorder.pod_event(
                &qp.info,
                &profile,
                "Normal",
                "Scheduled",
                "Binding",
                format!("Successfully assigned {} to {node}", qp.info.key),
            );
            return;
        }
        self.metrics.bind_errors.fetch_add(1, Relaxed);
        let uid = qp.info.uid.clone();
        self.cache.forget(&uid);
        if let Some(fw) = fw {
            fw.run_unreserve(&mut CycleState::default(), &qp.info, &node);
            if status.code == Code::Conflict {
                // Omega's failed transaction: the node's committed state
                // moved under this scheduler's copy. Retry at once on the
                // refreshed state (the watch brings the winner's pod), a
                // few times before backing off.
                self.metrics.bind_conflicts.fetch_add(1, Relaxed);
                tracing::debug!(pod = %qp.info.key, node = %node, reason = %status.message(), "binding conflict");
                if self.pending.contains(&uid) {
                    if qp.attempts <= 3 {
                        self.queue.add_retry(qp);
                    } else {
                        self.queue.add_backoff(qp);
                    }
                }
            } else if self.pending.contains(&uid) {
                self.recorder.pod_event(
                    &qp.info,
                    &profile,
                    "Warning",
                    "FailedScheduling",
                    "Binding",
                    format!("Binding rejected: {}", status.message()),
                );
                self.queue.add_backoff(qp);
            }
        }
        self.cluster_event(ClusterEvent::AssignedPodDelete);
    }

    // ---- the loop ----------------------------------------------------------------------------

    fn synced_all(&self) -> bool {
        ["pod", "node"].iter().all(|k| self.synced.contains(k))
    }

    /// Runs until the inputs end.
    pub async fn run(mut self) -> anyhow::Result<()> {
        self.start_watches();
        let mut last_flush = Instant::now();
        loop {
            if let Some(o) = &mut self.ownership {
                if o.members.has_changed().unwrap_or(false) {
                    o.members.mark_unchanged();
                    self.instances_changed();
                }
            }
            let t = Instant::now();
            let mut n = 0;
            while let Ok(input) = self.rx.try_recv() {
                self.handle(input);
                n += 1;
                if n >= 20_000 {
                    break;
                }
            }
            if n > 0 {
                self.metrics
                    .events_ns
                    .fetch_add(t.elapsed().as_nanos() as u64, Relaxed);
            }
            let now = Instant::now();
            if now.duration_since(last_flush) >= Duration::from_millis(100)
                || !self.queue.has_active()
            {
                self.queue.flush(now);
                last_flush = now;
            }
            let mut did = false;
            if self.synced_all() {
                let start = Instant::now();
                while start.elapsed() < Duration::from_millis(5) {
                    let Some(qp) = self.queue.pop() else { break };
                    self.schedule_one(qp);
                    did = true;
                }
            }
            if did {
                tokio::task::yield_now().await;
                continue;
            }
            let wake = self
                .queue
                .next_backoff()
                .map(tokio::time::Instant::from_std)
                .unwrap_or_else(|| tokio::time::Instant::now() + Duration::from_secs(1))
                .min(tokio::time::Instant::now() + Duration::from_secs(1));
            tokio::select! {
                input = self.rx.recv() => match input {
                    Some(i) => self.handle(i),
                    None => anyhow::bail!("the scheduler's inputs ended"),
                },
                _ = tokio::time::sleep_until(wake) => {}
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bound_pod_is_cached_with_its_phase_and_start_time_only() {
        let pod: Pod = serde_json::from_value(json!({
            "metadata": {"name": "p", "namespace": "ns", "uid": "u", "labels": {"a": "b"}},
            "spec": {"nodeName": "n1", "containers": [{"name": "c", "image": "i"}]},
            "status": {"phase": "Running", "startTime": "2026-01-01T00:00:00Z",
                "podIP": "10.0.0.1",
                "conditions": [{"type": "Ready", "status": "True"}],
                "containerStatuses": [{"name": "c", "image": "i", "imageID": "",
                    "ready": true, "restartCount": 0}]}
        }))
        .unwrap();
        let lean = bound_lean(pod.clone());
        assert_eq!(lean.metadata, pod.metadata);
        assert_eq!(lean.spec, pod.spec);
        let st = lean.status.clone().unwrap();
        assert_eq!(st.phase.as_deref(), Some("Running"));
        assert_eq!(st.start_time, pod.status.as_ref().unwrap().start_time);
        assert_eq!(st.conditions, None);
        assert_eq!(st.container_statuses, None);
        assert_eq!(st.pod_ip, None);
        let info = PodInfo::new(lean, 0);
        assert_eq!(
            info.start_time(),
            pod.status.unwrap().start_time.map(|t| t.0)
        );
    }
}
