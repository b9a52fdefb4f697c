//! Reclaiming what prod pods reserve but do not use (Borg's reservations):
//! the agent estimates each pod's *reservation* from its measured usage and
//! publishes what is left of the node as the extended resources
//! `skiff.io/batch-cpu` (millicores) and `skiff.io/batch-memory` (bytes),
//! which batch pods request.
//!
//! The model ([`Estimator`]) is pure: it is given the time, the node's
//! allocatable and usage, and each pod's request and usage, and answers the
//! reservations, the reclaimable amount and whether to publish it. The shell
//! ([`run`]) samples and patches the Node.
//!
//! For each pod and each of cpu and memory:
//! - `initial` is the pod's effective request (its limit where it has no
//!   request), as the scheduler adds it up;
//! - `peak` is the highest usage sampled in the last `decay` (2 min);
//! - `target = peak + max(margin × peak, margin_min)` (10%, at least 50m
//!   cpu and 64 MiB memory);
//! - the reservation starts at `initial`; a sample whose target is above it
//!   raises it to the target at once; otherwise it falls linearly toward
//!   the target at `max(initial, last raise) / decay` per second, so an idle
//!   pod's reservation reaches its usage plus margin within `decay`;
//! - a pod with no usage sample (not started, restarting) keeps its
//!   reservation.
//!
//! Reclaimable, as Koordinator computes batch resources:
//! `allocatable × threshold − Σ reservations of non-batch pods − system
//! usage` (60% for cpu, 65% for memory), where system usage is the node's
//! usage less its pods' (0 on hollow nodes), floored at 0, cpu in whole
//! millicores and memory in whole MiB. It is published when it first is
//! known, then when it moved by at least `hysteresis` (5%) of allocatable
//! or to or from zero, and never more often than every `publish_every`
//! (10 s).
//!
//! Batch pods are evicted when reclaimable capacity shrinks below what
//! they hold ([`batch_evictions`]): cpu is what a batch pod requested (its
//! usage above that only takes idle cpu, which prod takes back at once),
//! memory the larger of its request and its usage (memory cannot be taken
//! back without killing something, and it is never a prod container).
//! Lowest priority first, then newest first, until the rest fits; a pod
//! holding nothing of the overflowing resource is left alone. Only an
//! overflow that lasted `evict_after` (10 s) evicts, so one noisy sample
//! of system usage evicts nothing; and no pod is evicted during the first
//! `decay` after the agent starts: the reservations start from the
//! requests again and would evict every batch pod at each agent restart.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, Patch, PatchParams};
use serde_json::json;

use crate::stats::Summary;

/// The extended resource of reclaimable cpu, in millicores.
pub const BATCH_CPU: &str = "skiff.io/batch-cpu";
/// The extended resource of reclaimable memory, in bytes.
pub const BATCH_MEMORY: &str = "skiff.io/batch-memory";
/// A pod annotation giving a hollow node's simulated usage of the pod
/// (`cpu=100m,memory=50Mi`).
pub const SIMULATED_USAGE: &str = "skiff.io/simulated-usage";
/// The pod annotation the agent writes with the pod's reservation
/// (`cpu=120m,memory=80Mi`), the recommendation a user reads.
pub const RESERVATION: &str = "skiff.io/reservation";

/// The agent's API writes for reclamation since it started, for the write
/// cost at scale: reservation annotations and Node publications.
pub static RESERVATION_WRITES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
pub static NODE_WRITES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

const MIB: f64 = 1024.0 * 1024.0;

/// An amount of cpu (millicores) and memory (bytes).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Amount {
    pub cpu: f64,
    pub memory: f64,
}

impl Amount {
    pub fn new(cpu: f64, memory: f64) -> Amount {
        Amount { cpu, memory }
    }

    fn zip(self, o: Amount, f: impl Fn(f64, f64) -> f64) -> Amount {
        Amount::new(f(self.cpu, o.cpu), f(self.memory, o.memory))
    }

    fn add(self, o: Amount) -> Amount {
        self.zip(o, |a, b| a + b)
    }
}

/// The knobs of reclamation (agent flags `--reservation-margin`,
/// `--reservation-decay`, `--batch-cpu-threshold`, `--batch-memory-threshold`).
#[derive(Debug, Clone)]
pub struct Config {
    /// Margin above the peak usage, as a fraction of it.
    pub margin: f64,
    /// The least margin.
    pub margin_min: Amount,
    /// How long an idle pod's reservation takes to fall from its request to
    /// its usage plus margin; also the window of the peak usage.
    pub decay: Duration,
    /// The part of allocatable (cpu, memory) that prod reservations and
    /// batch pods share.
    pub threshold: Amount,
    /// The least time between two publications.
    pub publish_every: Duration,
    /// The least change worth publishing, as a fraction of allocatable.
    pub hysteresis: f64,
    /// How often usage is sampled.
    pub tick: Duration,
    /// The least time between two writes of a pod's reservation
    /// annotation.
    pub annotate_every: Duration,
    /// How long batch pods must hold more than is reclaimable before they
    /// are evicted (one noisy sample of system usage evicts nothing).
    pub evict_after: Duration,
}

impl Default for Config {
    fn default() -> Config {
        Config {
            margin: 0.1,
            margin_min: Amount::new(50.0, 64.0 * MIB),
            decay: Duration::from_secs(120),
            threshold: Amount::new(0.60, 0.65),
            publish_every: Duration::from_secs(10),
            hysteresis: 0.05,
            tick: Duration::from_secs(5),
            annotate_every: Duration::from_secs(60),
            evict_after: Duration::from_secs(10),
        }
    }
}

/// One pod as the estimator sees it at a tick.
#[derive(Debug, Clone, Default)]
pub struct PodInput {
    pub uid: String,
    /// It asks for batch resources: it runs in reclaimed capacity and
    /// reserves none.
    pub batch: bool,
    /// Its effective request (its limit where it has no request); for a
    /// batch pod, its request of [`BATCH_CPU`] and [`BATCH_MEMORY`].
    pub request: Amount,
    /// What it uses now, if measured.
    pub usage: Option<Amount>,
    /// Its priority (`spec.priority`, 0 without one).
    pub priority: i32,
    /// When it was created (Unix seconds): the newest goes first.
    pub created: i64,
}

/// The node at a tick.
#[derive(Debug, Clone, Copy)]
pub struct NodeInput {
    pub allocatable: Amount,
    /// The whole node's usage, if measured (pods and system).
    pub usage: Option<Amount>,
}

#[derive(Debug, Clone)]
struct PodState {
    reservation: Amount,
    /// Where the current fall began (the request, or the last raise).
    high: Amount,
    samples: VecDeque<(f64, Amount)>,
    /// The reservation last annotated on the pod, and when.
    annotated: Option<(f64, Amount)>,
}

/// What one tick concluded.
#[derive(Debug, Clone, PartialEq)]
pub struct Estimate {
    /// The reservation of each non-batch pod, by uid.
    pub reservations: BTreeMap<String, Amount>,
    /// Reclaimable now (whole millicores, whole MiB).
    pub reclaimable: Amount,
    /// What to publish now, if anything.
    pub publish: Option<Amount>,
    /// Batch pods to evict now (uid, message), in order.
    pub evict: Vec<(String, String)>,
    /// Reservations to annotate on their pods now (uid, text).
    pub annotate: Vec<(String, String)>,
}

/// Reservations and reclaimable capacity over time.
#[derive(Debug, Clone)]
pub struct Estimator {
    config: Config,
    pods: HashMap<String, PodState>,
    published: Option<(f64, Amount)>,
    /// The time of the first tick.
    started: Option<f64>,
    /// Since when batch pods hold more than is reclaimable.
    overflow_since: Option<f64>,
}

/// One resource's step: raised to `target` at once, else falling toward it
/// at `max(high, initial) / decay` per second. Gives (reservation, high).
fn step(res: f64, high: f64, initial: f64, target: f64, dt: f64, decay: f64) -> (f64, f64) {
    if target >= res {
        return (target, target);
    }
    let rate = high.max(initial) / decay.max(1e-9);
    ((res - rate * dt).max(target), high)
}

impl Estimator {
    pub fn new(config: Config) -> Estimator {
        Estimator {
            config,
            pods: HashMap::new(),
            published: None,
            started: None,
            overflow_since: None,
        }
    }

    pub fn config(&self) -> &Config {
        &self.config
    }

    /// Takes the samples of time `now` (seconds on a monotonic clock).
    pub fn tick(&mut self, now: f64, node: &NodeInput, pods: &[PodInput]) -> Estimate {
        let c = &self.config;
        let window = c.decay.as_secs_f64();
        self.pods
            .retain(|uid, _| pods.iter().any(|p| !p.batch && &p.uid == uid));
        let mut reservations = BTreeMap::new();
        let mut annotate = vec![];
        let mut pods_usage = Amount::default();
        for p in pods {
            if let Some(u) = p.usage {
                pods_usage = pods_usage.add(u);
            }
            if p.batch {
                continue;
            }
            let st = self.pods.entry(p.uid.clone()).or_insert_with(|| PodState {
                reservation: p.request,
                high: p.request,
                samples: VecDeque::new(),
                annotated: None,
            });
            let last = st.samples.back().map(|(t, _)| *t);
            if let Some(u) = p.usage {
                st.samples.push_back((now, u));
                while st.samples.front().is_some_and(|(t, _)| now - t > window) {
                    st.samples.pop_front();
                }
                let peak = st
                    .samples
                    .iter()
                    .fold(Amount::default(), |m, (_, s)| m.zip(*s, f64::max));
                let target = peak.zip(
                    Amount::new(
                        (peak.cpu * c.margin).max(c.margin_min.cpu),
                        (peak.memory * c.margin).max(c.margin_min.memory),
                    ),
                    |a, b| a + b,
                );
                let dt = last.map(|t| (now - t).max(0.0)).unwrap_or(0.0);
                let (cpu, hc) = step(
                    st.reservation.cpu,
                    st.high.cpu,
                    p.request.cpu,
                    target.cpu,
                    dt,
                    window,
                );
                let (mem, hm) = step(
                    st.reservation.memory,
                    st.high.memory,
                    p.request.memory,
                    target.memory,
                    dt,
                    window,
                );
                st.reservation = Amount::new(cpu, mem);
                st.high = Amount::new(hc, hm);
                // Only a measured reservation is worth showing: a pod
                // without samples (hollow benchmarks) costs no write.
                if annotation_due(c, now, st.annotated, st.reservation) {
                    st.annotated = Some((now, st.reservation));
                    annotate.push((p.uid.clone(), reservation_text(st.reservation)));
                }
            }
            reservations.insert(p.uid.clone(), st.reservation);
        }
        let reserved = reservations
            .values()
            .fold(Amount::default(), |a, r| a.add(*r));
        let system = node
            .usage
            .map(|u| u.zip(pods_usage, |n, p| (n - p).max(0.0)))
            .unwrap_or_default();
        let raw = Amount::new(
            node.allocatable.cpu * c.threshold.cpu - reserved.cpu - system.cpu,
            node.allocatable.memory * c.threshold.memory - reserved.memory - system.memory,
        );
        let reclaimable = Amount::new(
            raw.cpu.max(0.0).floor(),
            (raw.memory.max(0.0) / MIB).floor() * MIB,
        );
        let publish = self.should_publish(now, node.allocatable, reclaimable);
        if publish {
            self.published = Some((now, reclaimable));
        }
        let started = *self.started.get_or_insert(now);
        let batch: Vec<&PodInput> = pods.iter().filter(|p| p.batch).collect();
        let mut evict = batch_evictions(reclaimable, &batch);
        if evict.is_empty() {
            self.overflow_since = None;
        } else {
            let since = *self.overflow_since.get_or_insert(now);
            if now - started < window || now - since < c.evict_after.as_secs_f64() {
                evict.clear();
            }
        }
        Estimate {
            reservations,
            reclaimable,
            publish: publish.then_some(reclaimable),
            evict,
            annotate,
        }
    }

    fn should_publish(&self, now: f64, allocatable: Amount, new: Amount) -> bool {
        let Some((at, old)) = self.published else {
            return true;
        };
        if now - at < self.config.publish_every.as_secs_f64() || new == old {
            return false;
        }
        let h = self.config.hysteresis;
        let moved =
            |n: f64, o: f64, alloc: f64| (n - o).abs() >= h * alloc || ((n == 0.0) != (o == 0.0));
        moved(new.cpu, old.cpu, allocatable.cpu)
            || moved(new.memory, old.memory, allocatable.memory)
    }
}

/// Whether a pod's reservation is to be annotated again: the first time,
/// then when it moved by at least `hysteresis` of the last one (and at
/// least `margin_min`, so noise does not rewrite it), no sooner than
/// `annotate_every` after the last write.
fn annotation_due(c: &Config, now: f64, last: Option<(f64, Amount)>, r: Amount) -> bool {
    let Some((at, old)) = last else {
        return true;
    };
    if now - at < c.annotate_every.as_secs_f64() {
        return false;
    }
    let moved = |n: f64, o: f64, least: f64| (n - o).abs() >= (o * c.hysteresis).max(least);
    moved(r.cpu, old.cpu, c.margin_min.cpu) || moved(r.memory, old.memory, c.margin_min.memory)
}

/// `cpu=120m,memory=80Mi`: whole millicores and MiB, rounded up.
pub fn reservation_text(r: Amount) -> String {
    let mib = (r.memory.max(0.0) / MIB).ceil() as i128;
    format!(
        "cpu={}m,memory={}",
        r.cpu.max(0.0).ceil() as i64,
        skiff_helpers::Quantity::from_units(
            mib * 1024 * 1024,
            skiff_helpers::quantity::Format::BinarySI
        )
        .canonical()
    )
}

/// What a batch pod holds of the reclaimed capacity: its cpu request, and
/// the larger of its memory request and usage.
fn held(p: &PodInput) -> Amount {
    let used = p.usage.unwrap_or_default();
    Amount::new(p.request.cpu, p.request.memory.max(used.memory))
}

fn milli_text(m: f64) -> String {
    format!("{}m", m.max(0.0).round() as i64)
}

fn mem_text(b: f64) -> String {
    skiff_helpers::Quantity::from_units(
        b.max(0.0).round() as i128,
        skiff_helpers::quantity::Format::BinarySI,
    )
    .canonical()
}

/// The batch pods to evict so that what they hold fits in `reclaimable`:
/// lowest priority first, then newest first (then by uid, so the answer is
/// stable); a pod that holds none of an overflowing resource stays. Each
/// with the message its status and Event carry.
pub fn batch_evictions(reclaimable: Amount, batch: &[&PodInput]) -> Vec<(String, String)> {
    let mut total = batch.iter().fold(Amount::default(), |a, p| a.add(held(p)));
    let over = |t: Amount| (t.cpu > reclaimable.cpu, t.memory > reclaimable.memory);
    if over(total) == (false, false) {
        return vec![];
    }
    let mut order: Vec<&PodInput> = batch.to_vec();
    order.sort_by(|a, b| {
        a.priority
            .cmp(&b.priority)
            .then(b.created.cmp(&a.created))
            .then(a.uid.cmp(&b.uid))
    });
    let mut out = vec![];
    for p in order {
        let (cpu_over, mem_over) = over(total);
        if !cpu_over && !mem_over {
            break;
        }
        let h = held(p);
        if !(cpu_over && h.cpu > 0.0 || mem_over && h.memory > 0.0) {
            continue;
        }
        let (resource, reclaimable, all, this) = if cpu_over && h.cpu > 0.0 {
            (
                BATCH_CPU,
                milli_text(reclaimable.cpu),
                milli_text(total.cpu),
                milli_text(h.cpu),
            )
        } else {
            (
                BATCH_MEMORY,
                mem_text(reclaimable.memory),
                mem_text(total.memory),
                mem_text(h.memory),
            )
        };
        out.push((
            p.uid.clone(),
            format!(
                "The node reclaimed {resource} for its prod pods: {reclaimable} is left for batch pods, \
                 which held {all}; this pod held {this}. "
            ),
        ));
        total = total.zip(h, |a, b| a - b);
    }
    out
}

// ---- inputs from the API types and the stats -------------------------------------

/// Whether `pod` asks for batch resources.
pub fn is_batch(pod: &Pod) -> bool {
    let Some(spec) = pod.spec.as_ref() else {
        return false;
    };
    spec.containers
        .iter()
        .chain(spec.init_containers.iter().flatten())
        .filter_map(|c| c.resources.as_ref())
        .flat_map(|r| r.requests.iter().chain(r.limits.iter()))
        .any(|m| m.contains_key(BATCH_CPU) || m.contains_key(BATCH_MEMORY))
}

/// Whether `pod` still holds resources on the node (not finished).
fn holds_resources(pod: &Pod) -> bool {
    !matches!(
        pod.status.as_ref().and_then(|s| s.phase.as_deref()),
        Some("Succeeded") | Some("Failed")
    )
}

/// A pod's effective request of cpu and memory.
pub fn request_of(pod: &Pod) -> Amount {
    let r = skiff_helpers::resources::pod_requests(pod, false);
    Amount::new(r.milli_cpu as f64, r.memory as f64)
}

/// A batch pod's effective request of [`BATCH_CPU`] (millicores) and
/// [`BATCH_MEMORY`] (bytes).
pub fn batch_request_of(pod: &Pod) -> Amount {
    let r = skiff_helpers::resources::pod_requests(pod, false);
    Amount::new(r.scalar(BATCH_CPU) as f64, r.scalar(BATCH_MEMORY) as f64)
}

/// A pod's priority (0 without one).
pub fn priority_of(pod: &Pod) -> i32 {
    pod.spec.as_ref().and_then(|s| s.priority).unwrap_or(0)
}

/// When a pod was created, in Unix seconds (0 unknown).
pub fn created_of(pod: &Pod) -> i64 {
    pod.metadata
        .creation_timestamp
        .as_ref()
        .map(|t| t.0.as_second())
        .unwrap_or(0)
}

/// A hollow pod's usage from its [`SIMULATED_USAGE`] annotation.
pub fn simulated_usage(pod: &Pod) -> Option<Amount> {
    let text = pod.metadata.annotations.as_ref()?.get(SIMULATED_USAGE)?;
    let mut a = Amount::default();
    for part in text.split(',') {
        let (k, v) = part.split_once('=')?;
        let q = skiff_helpers::Quantity::parse(v.trim()).ok()?;
        match k.trim() {
            "cpu" => a.cpu = q.milli_ceil() as f64,
            "memory" => a.memory = q.value_ceil() as f64,
            _ => return None,
        }
    }
    Some(a)
}

/// The pods' usage from a stats summary, by uid, and the node's.
pub fn usage_of(summary: &Summary) -> (HashMap<String, Amount>, Option<Amount>) {
    let amount = |cpu: Option<u64>, mem: Option<u64>| {
        Amount::new(cpu.unwrap_or(0) as f64 / 1e6, mem.unwrap_or(0) as f64)
    };
    let pods = summary
        .pods
        .iter()
        .filter(|p| p.cpu.as_ref().is_some_and(|c| c.usage_nano_cores.is_some()))
        .map(|p| {
            (
                p.pod_ref.uid.clone(),
                amount(
                    p.cpu.as_ref().and_then(|c| c.usage_nano_cores),
                    p.memory.as_ref().and_then(|m| m.working_set_bytes),
                ),
            )
        })
        .collect();
    let node = summary
        .node
        .cpu
        .as_ref()
        .and_then(|c| c.usage_nano_cores)
        .map(|cpu| {
            amount(
                Some(cpu),
                summary
                    .node
                    .memory
                    .as_ref()
                    .and_then(|m| m.working_set_bytes),
            )
        });
    (pods, node)
}

// ---- the shell ---------------------------------------------------------------------

/// The pods bound to this node, by uid, as the pod manager last saw them.
pub type PodIndex = Arc<RwLock<PodMap>>;

/// The node's pods by uid.
pub type PodMap = HashMap<String, Arc<Pod>>;

/// The latest reservation of each non-batch pod, by uid, for the stats
/// summary.
pub type Reservations = Arc<RwLock<BTreeMap<String, Amount>>>;

/// Where usage comes from.
pub enum UsageSource {
    /// The stats collector's latest summary (real nodes).
    Stats(tokio::sync::watch::Receiver<Option<Arc<Summary>>>),
    /// Pods' [`SIMULATED_USAGE`] annotations (hollow nodes; no system
    /// usage). A pod without one is not measured and keeps its request as
    /// its reservation, so hollow pods of benchmarks that do not simulate
    /// usage cause no decay and no extra Node writes.
    Simulated,
}

impl UsageSource {
    fn sample(&self, pods: &[Arc<Pod>]) -> (HashMap<String, Amount>, Option<Amount>) {
        match self {
            UsageSource::Stats(rx) => match rx.borrow().as_ref() {
                Some(s) => usage_of(s),
                None => (HashMap::new(), None),
            },
            UsageSource::Simulated => {
                let pods = pods
                    .iter()
                    .filter(|p| {
                        p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")
                    })
                    // A pod without the annotation has no measured usage:
                    // its reservation stays its request.
                    .filter_map(|p| Some((p.metadata.uid.clone()?, simulated_usage(p)?)))
                    .collect();
                (pods, None)
            }
        }
    }
}

/// The patch that publishes `a` on the Node's capacity and allocatable.
pub fn status_patch(a: Amount) -> serde_json::Value {
    let r = json!({
        BATCH_CPU: format!("{}", a.cpu as i64),
        BATCH_MEMORY: format!("{}", a.memory as i64),
    });
    json!({"status": {"capacity": r, "allocatable": r}})
}

/// Writes a pod's reservation annotation (a merge patch of the pod's
/// metadata, for this uid only). Whether to go on annotating: an identity
/// that may not patch pods (a node's own, in Kubernetes' node rules) is
/// told once and stops.
async fn annotate(client: &kube::Client, pod: &Pod, text: &str) -> bool {
    let ns = pod.metadata.namespace.clone().unwrap_or_default();
    let name = pod.metadata.name.clone().unwrap_or_default();
    let api: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let patch = json!({"metadata": {
        "uid": pod.metadata.uid,
        "annotations": {RESERVATION: text},
    }});
    match api
        .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
    {
        Ok(_) => {
            RESERVATION_WRITES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            true
        }
        Err(kube::Error::Api(e)) if e.code == 403 => {
            tracing::debug!(error = %e.message, "the agent may not annotate pods; reservations are shown in /stats/summary only");
            false
        }
        Err(e) => {
            tracing::debug!(pod = %format!("{ns}/{name}"), error = %e, "annotating a pod's reservation failed");
            true
        }
    }
}

/// Samples every `config.tick` and publishes the reclaimable capacity on
/// Node `node` until dropped.
// The loop's eight inputs are each wired once, by the agent's start.
#[allow(clippy::too_many_arguments)]
pub async fn run(
    client: kube::Client,
    node: String,
    allocatable: Amount,
    pods: PodIndex,
    usage: UsageSource,
    config: Config,
    evictions: crate::EvictionSender,
    shown: Reservations,
) {
    let nodes: Api<Node> = Api::all(client.clone());
    let mut may_annotate = true;
    let tick = config.tick;
    let mut est = Estimator::new(config);
    let start = tokio::time::Instant::now();
    let mut pending: Option<Amount> = None;
    // Pods already ordered evicted: they hold nothing any more.
    let mut evicting: std::collections::HashSet<String> = Default::default();
    loop {
        let listed: Vec<Arc<Pod>> = pods
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .values()
            .filter(|p| holds_resources(p))
            .cloned()
            .collect();
        evicting.retain(|uid| {
            listed
                .iter()
                .any(|p| p.metadata.uid.as_deref() == Some(uid.as_str()))
        });
        let (used, node_usage) = usage.sample(&listed);
        let inputs: Vec<PodInput> = listed
            .iter()
            .filter(|p| !evicting.contains(p.metadata.uid.as_deref().unwrap_or_default()))
            .map(|p| {
                let uid = p.metadata.uid.clone().unwrap_or_default();
                let batch = is_batch(p);
                PodInput {
                    batch,
                    request: if batch {
                        batch_request_of(p)
                    } else {
                        request_of(p)
                    },
                    usage: used.get(&uid).copied(),
                    priority: priority_of(p),
                    created: created_of(p),
                    uid,
                }
            })
            .collect();
        let now = start.elapsed().as_secs_f64();
        let e = est.tick(
            now,
            &NodeInput {
                allocatable,
                usage: node_usage,
            },
            &inputs,
        );
        *shown.write().unwrap_or_else(|e| e.into_inner()) = e.reservations.clone();
        if may_annotate {
            for (uid, text) in &e.annotate {
                let Some(p) = listed
                    .iter()
                    .find(|p| p.metadata.uid.as_deref() == Some(uid.as_str()))
                else {
                    continue;
                };
                may_annotate = annotate(&client, p, text).await;
                if !may_annotate {
                    break;
                }
            }
        }
        for (uid, message) in e.evict {
            evicting.insert(uid.clone());
            let _ = evictions.send((uid, crate::pods::plan::Eviction::now(message)));
        }
        if let Some(a) = e.publish {
            pending = Some(a);
        }
        if let Some(a) = pending {
            match nodes
                .patch_status(
                    &node,
                    &PatchParams::default(),
                    &Patch::Merge(&status_patch(a)),
                )
                .await
            {
                Ok(_) => {
                    NODE_WRITES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    pending = None
                }
                Err(e) => {
                    tracing::warn!(node, error = %e, "publishing the reclaimable capacity failed")
                }
            }
        }
        tokio::time::sleep(tick).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GI: f64 = 1024.0 * MIB;

    fn node() -> NodeInput {
        NodeInput {
            allocatable: Amount::new(4000.0, 16.0 * GI),
            usage: None,
        }
    }

    fn prod(uid: &str, request: Amount, usage: Option<Amount>) -> PodInput {
        PodInput {
            uid: uid.into(),
            batch: false,
            request,
            usage,
            ..Default::default()
        }
    }

    #[test]
    fn an_idle_pods_reservation_falls_from_its_request_to_usage_plus_margin_within_the_decay() {
        let mut e = Estimator::new(Config::default());
        let req = Amount::new(2000.0, 4.0 * GI);
        let use_ = Some(Amount::new(100.0, 1.0 * GI));
        let r0 = e.tick(0.0, &node(), &[prod("a", req, use_)]).reservations["a"];
        // The first sample: the target is below the request, no time passed.
        assert_eq!(r0, req);
        let r60 = e.tick(60.0, &node(), &[prod("a", req, use_)]).reservations["a"];
        assert!(r60.cpu < 1100.0 && r60.cpu > 900.0, "{r60:?}");
        let r120 = e.tick(120.0, &node(), &[prod("a", req, use_)]).reservations["a"];
        // 100m + max(10m, 50m) and 1 GiB + 10%.
        assert_eq!(r120.cpu, 150.0);
        assert!((r120.memory - 1.1 * GI).abs() < 1.0, "{r120:?}");
    }

    #[test]
    fn a_spike_raises_the_reservation_at_once_and_it_falls_again_afterwards() {
        let mut e = Estimator::new(Config::default());
        let req = Amount::new(1000.0, GI);
        let quiet = Some(Amount::new(10.0, 100.0 * MIB));
        for t in 0..=24 {
            e.tick(t as f64 * 5.0, &node(), &[prod("a", req, quiet)]);
        }
        let spike = Some(Amount::new(3000.0, 2.0 * GI));
        let r = e
            .tick(125.0, &node(), &[prod("a", req, spike)])
            .reservations["a"];
        assert_eq!(r.cpu, 3300.0);
        assert!((r.memory - 2.2 * GI).abs() < 1.0);
        // The spike is the peak for a whole window, then the fall begins.
        let r = e
            .tick(240.0, &node(), &[prod("a", req, quiet)])
            .reservations["a"];
        assert_eq!(r.cpu, 3300.0);
        let r = e
            .tick(250.0, &node(), &[prod("a", req, quiet)])
            .reservations["a"];
        assert!(r.cpu < 3300.0, "{r:?}");
        let r = e
            .tick(400.0, &node(), &[prod("a", req, quiet)])
            .reservations["a"];
        assert_eq!(r.cpu, 60.0);
    }

    #[test]
    fn a_pod_without_a_sample_keeps_its_reservation() {
        let mut e = Estimator::new(Config::default());
        let req = Amount::new(500.0, GI);
        for t in 0..10 {
            let r = e.tick(t as f64 * 30.0, &node(), &[prod("a", req, None)]);
            assert_eq!(r.reservations["a"], req);
        }
    }

    #[test]
    fn reclaimable_is_the_threshold_less_reservations_and_system_usage_and_batch_pods_reserve_nothing(
    ) {
        let mut e = Estimator::new(Config::default());
        let n = NodeInput {
            allocatable: Amount::new(4000.0, 16.0 * GI),
            usage: Some(Amount::new(700.0, 3.0 * GI)),
        };
        let pods = [
            prod(
                "a",
                Amount::new(1000.0, 2.0 * GI),
                Some(Amount::new(200.0, GI)),
            ),
            PodInput {
                uid: "b".into(),
                batch: true,
                request: Amount::default(),
                usage: Some(Amount::new(300.0, GI)),
                ..Default::default()
            },
        ];
        let est = e.tick(0.0, &n, &pods);
        assert_eq!(est.reservations.len(), 1);
        // cpu: 4000 × 0.6 − 1000 − (700 − 500) = 1200
        assert_eq!(est.reclaimable.cpu, 1200.0);
        // memory: 16 GiB × 0.65 − 2 GiB − (3 − 2) GiB, whole MiB
        let want = ((16.0 * GI * 0.65 - 3.0 * GI) / MIB).floor() * MIB;
        assert_eq!(est.reclaimable.memory, want);
        assert_eq!(est.publish, Some(est.reclaimable));
    }

    #[test]
    fn reclaimable_never_goes_below_zero() {
        let mut e = Estimator::new(Config::default());
        let big = Amount::new(8000.0, 64.0 * GI);
        let est = e.tick(0.0, &node(), &[prod("a", big, None)]);
        assert_eq!(est.reclaimable, Amount::default());
    }

    #[test]
    fn publication_waits_ten_seconds_and_ignores_small_moves() {
        let mut e = Estimator::new(Config::default());
        let at = |e: &mut Estimator, t: f64, req_cpu: f64| {
            let uid = format!("p{req_cpu}");
            e.tick(t, &node(), &[prod(&uid, Amount::new(req_cpu, GI), None)])
                .publish
        };
        assert!(at(&mut e, 0.0, 1000.0).is_some());
        // A big move, but too soon.
        assert!(at(&mut e, 5.0, 2000.0).is_none());
        // Late enough and big enough.
        assert_eq!(at(&mut e, 10.0, 2000.0).map(|a| a.cpu), Some(400.0));
        // 100m is under 5% of 4 cpus.
        assert!(at(&mut e, 30.0, 2100.0).is_none());
        assert!(at(&mut e, 40.0, 2300.0).is_some());
        // To zero is always worth saying.
        let mut z = Estimator::new(Config {
            hysteresis: 0.5,
            ..Config::default()
        });
        assert!(at(&mut z, 0.0, 2380.0).is_some());
        assert_eq!(at(&mut z, 20.0, 2400.0).map(|a| a.cpu), Some(0.0));
    }

    #[test]
    fn pods_that_left_are_forgotten() {
        let mut e = Estimator::new(Config::default());
        e.tick(0.0, &node(), &[prod("a", Amount::new(1000.0, GI), None)]);
        let est = e.tick(20.0, &node(), &[]);
        assert!(est.reservations.is_empty());
        assert_eq!(est.reclaimable.cpu, 2400.0);
    }

    fn batch(uid: &str, request: Amount, usage: Amount, priority: i32, created: i64) -> PodInput {
        PodInput {
            uid: uid.into(),
            batch: true,
            request,
            usage: Some(usage),
            priority,
            created,
        }
    }

    fn uids(v: &[(String, String)]) -> Vec<&str> {
        v.iter().map(|(u, _)| u.as_str()).collect()
    }

    #[test]
    fn batch_pods_are_evicted_lowest_priority_then_newest_first_until_the_rest_fits() {
        let small = Amount::new(0.0, 0.0);
        let cases: &[(&str, Amount, Vec<PodInput>, Vec<&str>)] = &[
            (
                "everything fits: nobody goes",
                Amount::new(1000.0, GI),
                vec![batch("a", Amount::new(500.0, 0.0), small, 0, 1)],
                vec![],
            ),
            (
                "the newest of equal priority goes first",
                Amount::new(600.0, GI),
                vec![
                    batch("old", Amount::new(500.0, 0.0), small, 0, 1),
                    batch("new", Amount::new(500.0, 0.0), small, 0, 2),
                ],
                vec!["new"],
            ),
            (
                "lower priority goes before newer",
                Amount::new(600.0, GI),
                vec![
                    batch("old-low", Amount::new(500.0, 0.0), small, -5, 1),
                    batch("new", Amount::new(500.0, 0.0), small, 0, 2),
                ],
                vec!["old-low"],
            ),
            (
                "as many as it takes",
                Amount::new(100.0, GI),
                vec![
                    batch("a", Amount::new(300.0, 0.0), small, 0, 1),
                    batch("b", Amount::new(300.0, 0.0), small, 0, 2),
                    batch("c", Amount::new(50.0, 0.0), small, 9, 3),
                ],
                vec!["b", "a"],
            ),
            (
                "a starved batch pod still holds its cpu request",
                Amount::new(0.0, GI),
                vec![batch("a", Amount::new(200.0, 0.0), small, 0, 1)],
                vec!["a"],
            ),
            (
                "cpu used above the request is idle cpu and holds nothing",
                Amount::new(1000.0, GI),
                vec![batch(
                    "a",
                    Amount::new(0.0, 100.0 * MIB),
                    Amount::new(3000.0, 10.0 * MIB),
                    0,
                    1,
                )],
                vec![],
            ),
            (
                "memory used above the request counts",
                Amount::new(1000.0, GI),
                vec![batch(
                    "a",
                    Amount::new(100.0, 0.0),
                    Amount::new(0.0, 2.0 * GI),
                    0,
                    1,
                )],
                vec!["a"],
            ),
            (
                "a pod holding none of the overflowing resource stays",
                Amount::new(100.0, 4.0 * GI),
                vec![
                    batch("mem-only", Amount::new(0.0, GI), small, -1, 1),
                    batch("cpu", Amount::new(500.0, 0.0), small, 0, 2),
                ],
                vec!["cpu"],
            ),
        ];
        for (name, reclaimable, pods, want) in cases {
            let refs: Vec<&PodInput> = pods.iter().collect();
            let got = batch_evictions(*reclaimable, &refs);
            assert_eq!(uids(&got), *want, "{name}");
        }
    }

    #[test]
    fn the_eviction_message_says_what_was_reclaimed_and_what_the_pod_held() {
        let a = batch("a", Amount::new(400.0, 0.0), Amount::default(), 0, 1);
        let got = batch_evictions(Amount::new(300.0, GI), &[&a]);
        assert_eq!(
            got[0].1,
            "The node reclaimed skiff.io/batch-cpu for its prod pods: 300m is left for batch pods, \
             which held 400m; this pod held 400m. "
        );
        let m = batch("m", Amount::new(0.0, 2.0 * GI), Amount::default(), 0, 1);
        let got = batch_evictions(Amount::new(300.0, GI), &[&m]);
        assert!(
            got[0].1.starts_with(
                "The node reclaimed skiff.io/batch-memory for its prod pods: 1Gi is left"
            ),
            "{}",
            got[0].1
        );
    }

    #[test]
    fn no_batch_pod_is_evicted_before_the_reservations_had_a_decay_to_settle() {
        let mut e = Estimator::new(Config::default());
        let req = Amount::new(3000.0, GI);
        let idle = Some(Amount::new(10.0, 100.0 * MIB));
        let b = batch("b", Amount::new(1000.0, 0.0), Amount::default(), 0, 1);
        // At first the prod pod reserves its whole request: nothing is
        // reclaimable, yet the batch pod (placed before a restart) stays.
        let est = e.tick(0.0, &node(), &[prod("p", req, idle), b.clone()]);
        assert_eq!(est.reclaimable.cpu, 0.0);
        assert!(est.evict.is_empty());
        for t in 1..24 {
            let est = e.tick(t as f64 * 5.0, &node(), &[prod("p", req, idle), b.clone()]);
            assert!(est.evict.is_empty(), "at {t}");
        }
        // Settled: the reservation is down, the batch pod fits.
        let est = e.tick(120.0, &node(), &[prod("p", req, idle), b.clone()]);
        assert!(est.evict.is_empty());
        // The prod pod spins: its reservation jumps at once, and the
        // batch pod goes once that lasted 10 s.
        let busy = Some(Amount::new(2500.0, 100.0 * MIB));
        let est = e.tick(125.0, &node(), &[prod("p", req, busy), b.clone()]);
        assert_eq!(est.reclaimable.cpu, 0.0);
        assert!(est.evict.is_empty());
        let est = e.tick(130.0, &node(), &[prod("p", req, busy), b.clone()]);
        assert!(est.evict.is_empty());
        let est = e.tick(135.0, &node(), &[prod("p", req, busy), b.clone()]);
        assert_eq!(uids(&est.evict), ["b"]);
    }

    #[test]
    fn a_reservation_is_annotated_when_first_measured_then_only_on_a_real_move_at_most_each_minute()
    {
        let mut e = Estimator::new(Config::default());
        let req = Amount::new(1000.0, GI);
        let idle = Some(Amount::new(100.0, 200.0 * MIB));
        // No sample: nothing to show, no write.
        assert!(e
            .tick(0.0, &node(), &[prod("a", req, None)])
            .annotate
            .is_empty());
        let first = e.tick(5.0, &node(), &[prod("a", req, idle)]).annotate;
        assert_eq!(
            first,
            [("a".to_string(), "cpu=1000m,memory=1Gi".to_string())]
        );
        // Falling, but the next write waits a minute.
        let mut writes = vec![];
        let mut t = 10.0;
        while t <= 600.0 {
            let est = e.tick(t, &node(), &[prod("a", req, idle)]);
            writes.extend(est.annotate.into_iter().map(|(_, text)| (t, text)));
            t += 5.0;
        }
        assert!(
            writes.windows(2).all(|w| w[1].0 - w[0].0 >= 60.0),
            "{writes:?}"
        );
        // Settled at usage plus margin, then quiet.
        assert_eq!(
            writes.last().map(|w| w.1.as_str()),
            Some("cpu=150m,memory=264Mi")
        );
        assert!(writes.len() <= 4, "{writes:?}");
        assert!(writes.iter().all(|w| w.0 <= 300.0), "{writes:?}");
        // A small wobble (under the 50m / 64Mi floor) is not rewritten.
        let wobble = Some(Amount::new(120.0, 210.0 * MIB));
        assert!(e
            .tick(700.0, &node(), &[prod("a", req, wobble)])
            .annotate
            .is_empty());
        assert_eq!(reservation_text(Amount::new(0.4, 1.0)), "cpu=1m,memory=1Mi");
    }

    fn pod(json: serde_json::Value) -> Pod {
        serde_json::from_value(json).unwrap()
    }

    #[test]
    fn batch_pods_requests_and_simulated_usage_are_read_from_the_pod() {
        let p = pod(json!({
            "metadata": {"uid": "u", "annotations": {SIMULATED_USAGE: "cpu=250m,memory=64Mi"}},
            "spec": {"containers": [
                {"name": "a", "resources": {"requests": {"cpu": "500m", "memory": "1Gi"}}},
                {"name": "b", "resources": {"limits": {"cpu": "1", "memory": "512Mi"}}},
            ]},
        }));
        assert!(!is_batch(&p));
        assert_eq!(request_of(&p), Amount::new(1500.0, 1.5 * GI));
        assert_eq!(simulated_usage(&p), Some(Amount::new(250.0, 64.0 * MIB)));
        let b = pod(json!({
            "spec": {"containers": [
                {"name": "a", "resources": {"requests": {BATCH_CPU: "2000"}, "limits": {BATCH_CPU: "2000"}}},
            ]},
        }));
        assert!(is_batch(&b));
        let bad = pod(json!({"metadata": {"annotations": {SIMULATED_USAGE: "cpu=lots"}}}));
        assert_eq!(simulated_usage(&bad), None);
    }

    #[test]
    fn the_status_patch_sets_capacity_and_allocatable_as_integers() {
        let p = status_patch(Amount::new(1200.0, 3.0 * GI));
        assert_eq!(p["status"]["capacity"][BATCH_CPU], "1200");
        assert_eq!(p["status"]["allocatable"][BATCH_MEMORY], "3221225472");
    }
}
