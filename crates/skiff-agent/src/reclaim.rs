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
        }
    }
}

/// One pod as the estimator sees it at a tick.
#[derive(Debug, Clone)]
pub struct PodInput {
    pub uid: String,
    /// It asks for batch resources: it runs in reclaimed capacity and
    /// reserves none.
    pub batch: bool,
    /// Its effective request (its limit where it has no request).
    pub request: Amount,
    /// What it uses now, if measured.
    pub usage: Option<Amount>,
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
}

/// Reservations and reclaimable capacity over time.
#[derive(Debug, Clone)]
pub struct Estimator {
    config: Config,
    pods: HashMap<String, PodState>,
    published: Option<(f64, Amount)>,
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
        Estimate {
            reservations,
            reclaimable,
            publish: publish.then_some(reclaimable),
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

/// Samples every `config.tick` and publishes the reclaimable capacity on
/// Node `node` until dropped.
pub async fn run(
    client: kube::Client,
    node: String,
    allocatable: Amount,
    pods: PodIndex,
    usage: UsageSource,
    config: Config,
) {
    let nodes: Api<Node> = Api::all(client);
    let tick = config.tick;
    let mut est = Estimator::new(config);
    let start = tokio::time::Instant::now();
    let mut pending: Option<Amount> = None;
    loop {
        let listed: Vec<Arc<Pod>> = pods
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .values()
            .filter(|p| holds_resources(p))
            .cloned()
            .collect();
        let (used, node_usage) = usage.sample(&listed);
        let inputs: Vec<PodInput> = listed
            .iter()
            .map(|p| {
                let uid = p.metadata.uid.clone().unwrap_or_default();
                PodInput {
                    batch: is_batch(p),
                    request: request_of(p),
                    usage: used.get(&uid).copied(),
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
                Ok(_) => pending = None,
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
