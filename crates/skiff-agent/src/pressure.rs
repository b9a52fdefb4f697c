//! Node-pressure eviction, after kubelet's eviction manager: the node
//! protects itself when memory, disk or process ids run low.
//!
//! This module is the pure half ([`Manager`]): given the time, the signals
//! observed ([`Observations`]) and the node's active pods with their usage
//! ([`PodSample`]), it answers which node conditions hold
//! (`MemoryPressure`, `DiskPressure`, `PIDPressure`) and which pod, if any,
//! to evict now. The measurement is behind [`Measure`]; [`run`] is the
//! shell that samples every [`MONITORING_INTERVAL`], publishes the
//! conditions and hands evictions to the pod workers.
//!
//! As kubelet does it:
//! - thresholds `signal<value` with a quantity or a percentage of the
//!   signal's capacity; `--eviction-hard` (default
//!   `memory.available<100Mi,nodefs.available<10%,imagefs.available<15%,nodefs.inodesFree<5%`;
//!   a flag given replaces the whole set, `0%` and `100%` are ignored),
//!   `--eviction-soft` with `--eviction-soft-grace-period` (a soft
//!   threshold must be met that long), `--eviction-minimum-reclaim` (a met
//!   threshold stays met until the signal is that much above it);
//! - a condition holds while one of its thresholds is met, and for
//!   `--eviction-pressure-transition-period` (5 min) after;
//! - memory thresholds are dealt with first; at most one pod is evicted
//!   per interval, ranked for memory by usage above request, then
//!   priority, then usage above request; for disk the same with the pod's
//!   disk usage; for pids by priority, then process count; a pod without
//!   stats goes first. Critical pods (priority 2000000000 or more) are
//!   never evicted;
//! - the pod's status: Failed, reason `Evicted`, message "The node was low
//!   on resource: memory. Threshold quantity: 100Mi, available: 12Ki. "
//!   (and, for memory, each container using more than it requested), a
//!   `DisruptionTarget` condition; hard thresholds evict with a grace
//!   period of 1 s, soft ones with 0 (kubelet's
//!   `--eviction-max-pod-grace-period` default); the container still gets
//!   kubelet's 2 s stop window.
//!
//! Skiff measures no per-pod disk usage yet, so for disk signals every
//! pod is "without stats" and the ranking comes down to priority.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use skiff_helpers::quantity::Format;
use skiff_helpers::Quantity;

/// How often kubelet's eviction manager looks.
pub const MONITORING_INTERVAL: Duration = Duration::from_secs(10);
/// Kubelet's default hard thresholds.
pub const DEFAULT_HARD: &str =
    "memory.available<100Mi,nodefs.available<10%,imagefs.available<15%,nodefs.inodesFree<5%";
/// Priority at and above which a pod is critical and never evicted
/// (kubelet's `SystemCriticalPriority`).
pub const CRITICAL_PRIORITY: i32 = 2_000_000_000;
/// How long kubelet waits for an evicted pod to be cleaned up before it
/// evicts another.
pub const CLEANUP_TIMEOUT: Duration = Duration::from_secs(30);

/// An eviction signal (kubelet's names).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Signal {
    MemoryAvailable,
    NodeFsAvailable,
    NodeFsInodesFree,
    ImageFsAvailable,
    ImageFsInodesFree,
    PidAvailable,
}

impl Signal {
    pub const ALL: [Signal; 6] = [
        Signal::MemoryAvailable,
        Signal::NodeFsAvailable,
        Signal::NodeFsInodesFree,
        Signal::ImageFsAvailable,
        Signal::ImageFsInodesFree,
        Signal::PidAvailable,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Signal::MemoryAvailable => "memory.available",
            Signal::NodeFsAvailable => "nodefs.available",
            Signal::NodeFsInodesFree => "nodefs.inodesFree",
            Signal::ImageFsAvailable => "imagefs.available",
            Signal::ImageFsInodesFree => "imagefs.inodesFree",
            Signal::PidAvailable => "pid.available",
        }
    }

    pub fn parse(s: &str) -> Option<Signal> {
        Signal::ALL.into_iter().find(|x| x.name() == s)
    }

    /// The node condition the signal drives.
    pub fn condition(self) -> Condition {
        match self {
            Signal::MemoryAvailable => Condition::Memory,
            Signal::PidAvailable => Condition::Pid,
            _ => Condition::Disk,
        }
    }

    /// The resource reclaimed (kubelet's `signalToResource`).
    pub fn resource(self) -> &'static str {
        match self {
            Signal::MemoryAvailable => "memory",
            Signal::NodeFsAvailable | Signal::ImageFsAvailable => "ephemeral-storage",
            Signal::NodeFsInodesFree | Signal::ImageFsInodesFree => "inodes",
            Signal::PidAvailable => "pids",
        }
    }

    fn format(self) -> Format {
        match self {
            Signal::MemoryAvailable | Signal::NodeFsAvailable | Signal::ImageFsAvailable => {
                Format::BinarySI
            }
            _ => Format::DecimalSI,
        }
    }
}

/// A node condition the eviction manager reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Condition {
    Memory,
    Disk,
    Pid,
}

impl Condition {
    pub const ALL: [Condition; 3] = [Condition::Memory, Condition::Disk, Condition::Pid];

    /// The condition's type on the Node.
    pub fn type_(self) -> &'static str {
        match self {
            Condition::Memory => "MemoryPressure",
            Condition::Disk => "DiskPressure",
            Condition::Pid => "PIDPressure",
        }
    }

    /// Kubelet's (reason, message) for the condition holding or not.
    pub fn reason(self, holds: bool) -> (&'static str, &'static str) {
        match (self, holds) {
            (Condition::Memory, true) => (
                "KubeletHasInsufficientMemory",
                "kubelet has insufficient memory available",
            ),
            (Condition::Memory, false) => (
                "KubeletHasSufficientMemory",
                "kubelet has sufficient memory available",
            ),
            (Condition::Disk, true) => ("KubeletHasDiskPressure", "kubelet has disk pressure"),
            (Condition::Disk, false) => {
                ("KubeletHasNoDiskPressure", "kubelet has no disk pressure")
            }
            (Condition::Pid, true) => (
                "KubeletHasInsufficientPID",
                "kubelet has insufficient PID available",
            ),
            (Condition::Pid, false) => (
                "KubeletHasSufficientPID",
                "kubelet has sufficient PID available",
            ),
        }
    }

    /// The taint the node lifecycle controller puts on a node with the
    /// condition (TaintNodesByCondition; effect NoSchedule).
    pub fn taint(self) -> &'static str {
        match self {
            Condition::Memory => "node.kubernetes.io/memory-pressure",
            Condition::Disk => "node.kubernetes.io/disk-pressure",
            Condition::Pid => "node.kubernetes.io/pid-pressure",
        }
    }
}

/// A threshold's value: an amount, or a fraction of the signal's capacity
/// (a 32-bit float, as kubelet keeps it, so the amounts are kubelet's to
/// the byte).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Value {
    Quantity(i64),
    Percentage(f32),
}

impl Value {
    /// The amount it stands for on a resource of `capacity`.
    pub fn amount(self, capacity: i64) -> i64 {
        match self {
            Value::Quantity(q) => q,
            Value::Percentage(p) => (capacity as f64 * p as f64) as i64,
        }
    }
}

/// One eviction threshold: met when the signal's available amount is
/// below the value.
#[derive(Debug, Clone, PartialEq)]
pub struct Threshold {
    pub signal: Signal,
    pub value: Value,
    /// How long it must be met before pods are evicted; zero for a hard
    /// threshold.
    pub grace: Duration,
    pub min_reclaim: Option<Value>,
}

impl Threshold {
    pub fn hard(&self) -> bool {
        self.grace.is_zero()
    }
}

/// The eviction manager's settings.
#[derive(Debug, Clone)]
pub struct Config {
    pub thresholds: Vec<Threshold>,
    /// How long a condition stays after its last threshold was met.
    pub transition: Duration,
}

impl Default for Config {
    fn default() -> Config {
        Config {
            thresholds: parse_config(Some(DEFAULT_HARD), None, None, None)
                .expect("kubelet's default thresholds parse"),
            transition: Duration::from_secs(300),
        }
    }
}

/// `a<b,c<d` (`sep` '<') or `a=b,c=d` (`sep` '='), as kubelet's map flags.
fn pairs(flag: &str, text: &str, sep: char) -> Result<Vec<(String, String)>, String> {
    text.split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|item| {
            item.split_once(sep)
                .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
                .ok_or_else(|| {
                    format!("--{flag}: malformed pair {item:?}, expect string{sep}string")
                })
        })
        .collect()
}

fn signal_of(flag: &str, name: &str) -> Result<Signal, String> {
    Signal::parse(name).ok_or_else(|| {
        format!(
            "--{flag}: unsupported eviction signal {name} (known: {})",
            Signal::ALL.map(|s| s.name()).join(", ")
        )
    })
}

fn percentage(flag: &str, signal: Signal, v: &str) -> Result<f32, String> {
    let p: f32 = v
        .trim_end_matches('%')
        .parse()
        .map_err(|_| format!("--{flag}: {} has no percentage in {v:?}", signal.name()))?;
    if !p.is_finite() {
        return Err(format!(
            "--{flag}: {} has no percentage in {v:?}",
            signal.name()
        ));
    }
    Ok(p / 100.0)
}

fn quantity(flag: &str, signal: Signal, v: &str) -> Result<i64, String> {
    Quantity::parse(v)
        .map(|q| q.value_ceil())
        .map_err(|_| format!("--{flag}: {} has no quantity in {v:?}", signal.name()))
}

/// A Go duration (`90s`, `1m30s`, `1h`, `500ms`).
pub fn parse_duration(text: &str) -> Option<Duration> {
    let mut total = 0f64;
    let mut rest = text.trim();
    if rest.is_empty() {
        return None;
    }
    if rest == "0" {
        return Some(Duration::ZERO);
    }
    while !rest.is_empty() {
        let n = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        let v: f64 = rest[..n].parse().ok()?;
        rest = &rest[n..];
        let u = rest
            .find(|c: char| c.is_ascii_digit())
            .unwrap_or(rest.len());
        let unit = match &rest[..u] {
            "ns" => 1e-9,
            "us" | "µs" => 1e-6,
            "ms" => 1e-3,
            "s" => 1.0,
            "m" => 60.0,
            "h" => 3600.0,
            _ => return None,
        };
        total += v * unit;
        rest = &rest[u..];
    }
    Duration::try_from_secs_f64(total).ok()
}

/// The thresholds of kubelet's flags (`None`: the flag not given; hard
/// then has kubelet's defaults). Errors say which flag and why, in
/// kubelet's words where it has them.
pub fn parse_config(
    hard: Option<&str>,
    soft: Option<&str>,
    soft_grace: Option<&str>,
    min_reclaim: Option<&str>,
) -> Result<Vec<Threshold>, String> {
    let statements = |flag: &str, text: &str| -> Result<Vec<Threshold>, String> {
        let mut out = vec![];
        for (k, v) in pairs(flag, text, '<')? {
            let signal = signal_of(flag, &k)?;
            let value = if v.ends_with('%') {
                // Kubelet ignores 0% and 100%.
                if v == "0%" || v == "100%" {
                    continue;
                }
                let p = percentage(flag, signal, &v)?;
                if p < 0.0 {
                    return Err(format!(
                        "--{flag}: eviction percentage threshold {} must be >= 0%: {v}",
                        signal.name()
                    ));
                }
                if p > 1.0 {
                    return Err(format!(
                        "--{flag}: eviction percentage threshold {} must be <= 100%: {v}",
                        signal.name()
                    ));
                }
                Value::Percentage(p)
            } else {
                let q = quantity(flag, signal, &v)?;
                if q <= 0 {
                    return Err(format!(
                        "--{flag}: eviction threshold {} must be positive: {v}",
                        signal.name()
                    ));
                }
                Value::Quantity(q)
            };
            out.push(Threshold {
                signal,
                value,
                grace: Duration::ZERO,
                min_reclaim: None,
            });
        }
        Ok(out)
    };
    let mut all = statements("eviction-hard", hard.unwrap_or(DEFAULT_HARD))?;
    let mut graces = HashMap::new();
    for (k, v) in pairs("eviction-soft-grace-period", soft_grace.unwrap_or(""), '=')? {
        let signal = signal_of("eviction-soft-grace-period", &k)?;
        let d = parse_duration(&v).ok_or_else(|| {
            format!("--eviction-soft-grace-period: {k} has no duration in {v:?} (e.g. 1m30s)")
        })?;
        graces.insert(signal, d);
    }
    for mut t in statements("eviction-soft", soft.unwrap_or(""))? {
        match graces.get(&t.signal) {
            Some(d) if !d.is_zero() => t.grace = *d,
            _ => {
                return Err(format!(
                    "--eviction-soft: grace period must be specified for the soft eviction threshold {} (--eviction-soft-grace-period)",
                    t.signal.name()
                ))
            }
        }
        all.push(t);
    }
    let flag = "eviction-minimum-reclaim";
    for (k, v) in pairs(flag, min_reclaim.unwrap_or(""), '=')? {
        let signal = signal_of(flag, &k)?;
        let value = if v.ends_with('%') {
            let p = percentage(flag, signal, &v)?;
            if p <= 0.0 {
                return Err(format!(
                    "--{flag}: eviction percentage minimum reclaim {} must be positive: {v}",
                    signal.name()
                ));
            }
            Value::Percentage(p)
        } else {
            let q = quantity(flag, signal, &v)?;
            if q < 0 {
                return Err(format!(
                    "--{flag}: negative eviction minimum reclaim specified for {}",
                    signal.name()
                ));
            }
            Value::Quantity(q)
        };
        for t in all.iter_mut().filter(|t| t.signal == signal) {
            t.min_reclaim = Some(value);
        }
    }
    Ok(all)
}

/// What a signal measured: what is available of what capacity.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Observation {
    pub available: i64,
    pub capacity: i64,
}

pub type Observations = BTreeMap<Signal, Observation>;

/// An active pod as the ranking sees it.
#[derive(Debug, Clone, Default)]
pub struct PodSample {
    pub uid: String,
    pub priority: i32,
    /// The pod's memory request and its containers' (name, request).
    pub memory_request: i64,
    pub container_requests: Vec<(String, i64)>,
    /// Measured memory working set of the pod and of its containers (by
    /// name); None: no stats for the pod.
    pub memory: Option<(i64, Vec<(String, i64)>)>,
    pub disk_request: i64,
    /// Measured disk usage (None: no stats).
    pub disk: Option<i64>,
    /// Measured process count (None: no stats).
    pub processes: Option<u64>,
}

/// What one pass concluded.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Decision {
    /// The conditions that hold.
    pub conditions: BTreeSet<Condition>,
    /// The pod to evict now: (uid, message, grace seconds).
    pub evict: Option<(String, String, i64)>,
    /// The resource being reclaimed, if a threshold is met past its grace.
    pub reclaiming: Option<&'static str>,
}

/// Kubelet's eviction manager state between passes.
#[derive(Debug, Clone)]
pub struct Manager {
    config: Config,
    /// When each threshold (by index) was first met, of those met now.
    first_met: HashMap<usize, f64>,
    /// When each condition was last observed.
    condition_seen: HashMap<Condition, f64>,
    /// The thresholds met past their grace at the last pass (they stay met
    /// until their minimum reclaim is reached).
    met: Vec<usize>,
}

fn met(t: &Threshold, obs: &Observations, min_reclaim: bool) -> bool {
    let Some(o) = obs.get(&t.signal) else {
        return false;
    };
    let mut q = t.value.amount(o.capacity);
    if min_reclaim {
        if let Some(m) = t.min_reclaim {
            q += m.amount(o.capacity);
        }
    }
    q > o.available
}

fn text(v: i64, f: Format) -> String {
    Quantity::from_units(v as i128, f).canonical()
}

impl Manager {
    pub fn new(config: Config) -> Manager {
        Manager {
            config,
            first_met: HashMap::new(),
            condition_seen: HashMap::new(),
            met: vec![],
        }
    }

    /// One pass at `now` (seconds on a monotonic clock).
    pub fn synchronize(&mut self, now: f64, obs: &Observations, pods: &[PodSample]) -> Decision {
        let ts = &self.config.thresholds;
        let mut met_now: Vec<usize> = (0..ts.len()).filter(|i| met(&ts[*i], obs, false)).collect();
        // Those met before stay until the minimum reclaim is reached.
        for i in &self.met {
            if !met_now.contains(i) && met(&ts[*i], obs, true) {
                met_now.push(*i);
            }
        }
        self.first_met = met_now
            .iter()
            .map(|i| (*i, self.first_met.get(i).copied().unwrap_or(now)))
            .collect();
        for i in &met_now {
            self.condition_seen.insert(ts[*i].signal.condition(), now);
        }
        let transition = self.config.transition.as_secs_f64();
        let conditions = self
            .condition_seen
            .iter()
            .filter(|(_, at)| now - **at < transition)
            .map(|(c, _)| *c)
            .collect();
        let mut due: Vec<usize> = met_now
            .iter()
            .copied()
            .filter(|i| now - self.first_met[i] >= ts[*i].grace.as_secs_f64())
            .collect();
        self.met = due.clone();
        let mut decision = Decision {
            conditions,
            ..Default::default()
        };
        // Memory first (kubelet's byEvictionPriority), else as configured.
        due.sort_by_key(|i| (ts[*i].signal != Signal::MemoryAvailable, *i));
        let Some(&first) = due.first() else {
            return decision;
        };
        let t = &ts[first];
        decision.reclaiming = Some(t.signal.resource());
        let ranked = rank(t.signal, pods);
        let Some(pod) = ranked.into_iter().find(|p| p.priority < CRITICAL_PRIORITY) else {
            return decision;
        };
        let o = obs[&t.signal];
        let mut message = format!(
            "The node was low on resource: {}. Threshold quantity: {}, available: {}. ",
            t.signal.resource(),
            text(t.value.amount(o.capacity), t.signal.format()),
            text(o.available, t.signal.format()),
        );
        if t.signal == Signal::MemoryAvailable {
            if let Some((_, containers)) = &pod.memory {
                for (name, used) in containers {
                    let req = pod
                        .container_requests
                        .iter()
                        .find(|(n, _)| n == name)
                        .map(|(_, r)| *r)
                        .unwrap_or(0);
                    if *used > req {
                        message += &format!(
                            "Container {name} was using {}, request is {}, has larger consumption of memory. ",
                            text(*used, Format::BinarySI),
                            text(req, Format::BinarySI),
                        );
                    }
                }
            }
        }
        let grace = if t.hard() {
            crate::pods::plan::EVICTION_GRACE_SECONDS
        } else {
            0
        };
        decision.evict = Some((pod.uid.clone(), message, grace));
        decision
    }
}

/// The pods in the order kubelet evicts them for `signal`.
pub fn rank(signal: Signal, pods: &[PodSample]) -> Vec<&PodSample> {
    // Pods without stats first, as kubelet's comparators put them.
    let no_stats_first = |a: bool, b: bool| b.cmp(&a);
    let mut out: Vec<&PodSample> = pods.iter().collect();
    let by_priority = |a: &PodSample, b: &PodSample| a.priority.cmp(&b.priority);
    match signal {
        Signal::MemoryAvailable => out.sort_by(|a, b| {
            let (ua, ub) = (a.memory.as_ref(), b.memory.as_ref());
            let exceeds = match (ua, ub) {
                (Some((x, _)), Some((y, _))) => {
                    (*y > b.memory_request).cmp(&(*x > a.memory_request))
                }
                _ => no_stats_first(ua.is_none(), ub.is_none()),
            };
            exceeds
                .then(by_priority(a, b))
                .then_with(|| match (ua, ub) {
                    (Some((x, _)), Some((y, _))) => {
                        (y - b.memory_request).cmp(&(x - a.memory_request))
                    }
                    _ => no_stats_first(ua.is_none(), ub.is_none()),
                })
        }),
        Signal::PidAvailable => out.sort_by(|a, b| {
            by_priority(a, b).then_with(|| match (a.processes, b.processes) {
                (Some(x), Some(y)) => y.cmp(&x),
                (x, y) => no_stats_first(x.is_none(), y.is_none()),
            })
        }),
        _ => out.sort_by(|a, b| {
            let exceeds = match (a.disk, b.disk) {
                (Some(x), Some(y)) => (y > b.disk_request).cmp(&(x > a.disk_request)),
                (x, y) => no_stats_first(x.is_none(), y.is_none()),
            };
            exceeds
                .then(by_priority(a, b))
                .then_with(|| match (a.disk, b.disk) {
                    (Some(x), Some(y)) => (y - b.disk_request).cmp(&(x - a.disk_request)),
                    (x, y) => no_stats_first(x.is_none(), y.is_none()),
                })
        }),
    }
    out
}

// ---- measurement -------------------------------------------------------------------

/// Where the signals and the pods' usage come from.
pub trait Measure: Send + Sync {
    /// The signals now, and the pods' samples by uid (usage only; the
    /// shell fills in requests and priorities).
    fn measure(&self) -> (Observations, HashMap<String, PodSample>);
}

/// The signals of a real node: memory and nodefs from the stats
/// collector's latest summary (memory.available = capacity − the root
/// cgroup's working set, as kubelet computes it), imagefs from `statvfs`
/// of the container runtime's root, pid.available from
/// `/proc/sys/kernel/{pid_max,threads-max}` less the threads in
/// `/proc/loadavg`.
pub struct NodeMeasure {
    pub summary: tokio::sync::watch::Receiver<Option<Arc<crate::stats::Summary>>>,
    /// The runtime's image filesystem (containerd's root).
    pub image_dir: std::path::PathBuf,
}

fn read_u64(path: &str) -> Option<u64> {
    std::fs::read_to_string(path).ok()?.trim().parse().ok()
}

impl Measure for NodeMeasure {
    // statvfs's field types differ between targets.
    #[allow(clippy::unnecessary_cast)]
    fn measure(&self) -> (Observations, HashMap<String, PodSample>) {
        let mut obs = Observations::new();
        let mut pods = HashMap::new();
        if let Some(s) = self.summary.borrow().as_ref() {
            if let Some(m) = &s.node.memory {
                if let (Some(avail), Some(ws)) = (m.available_bytes, m.working_set_bytes) {
                    obs.insert(
                        Signal::MemoryAvailable,
                        Observation {
                            available: avail as i64,
                            capacity: (avail + ws) as i64,
                        },
                    );
                }
            }
            if let Some(fs) = &s.node.fs {
                obs.insert(
                    Signal::NodeFsAvailable,
                    Observation {
                        available: fs.available_bytes as i64,
                        capacity: fs.capacity_bytes as i64,
                    },
                );
                obs.insert(
                    Signal::NodeFsInodesFree,
                    Observation {
                        available: fs.inodes_free as i64,
                        capacity: fs.inodes as i64,
                    },
                );
            }
            for p in &s.pods {
                let containers = p
                    .containers
                    .iter()
                    .filter_map(|c| {
                        Some((c.name.clone(), c.memory.as_ref()?.working_set_bytes? as i64))
                    })
                    .collect();
                let memory = p
                    .memory
                    .as_ref()
                    .and_then(|m| m.working_set_bytes)
                    .map(|w| (w as i64, containers));
                pods.insert(
                    p.pod_ref.uid.clone(),
                    PodSample {
                        uid: p.pod_ref.uid.clone(),
                        memory,
                        ..Default::default()
                    },
                );
            }
        }
        if let Ok(v) = nix::sys::statvfs::statvfs(&self.image_dir) {
            let f = v.fragment_size() as u64;
            obs.insert(
                Signal::ImageFsAvailable,
                Observation {
                    available: (v.blocks_available() as u64 * f) as i64,
                    capacity: (v.blocks() as u64 * f) as i64,
                },
            );
            obs.insert(
                Signal::ImageFsInodesFree,
                Observation {
                    available: v.files_free() as i64,
                    capacity: v.files() as i64,
                },
            );
        }
        let max = match (
            read_u64("/proc/sys/kernel/pid_max"),
            read_u64("/proc/sys/kernel/threads-max"),
        ) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        let running = std::fs::read_to_string("/proc/loadavg").ok().and_then(|t| {
            t.split_whitespace()
                .nth(3)?
                .split_once('/')?
                .1
                .parse::<u64>()
                .ok()
        });
        if let (Some(max), Some(n)) = (max, running) {
            obs.insert(
                Signal::PidAvailable,
                Observation {
                    available: max as i64 - n as i64,
                    capacity: max as i64,
                },
            );
        }
        (obs, pods)
    }
}

/// A pod's sample for ranking: its requests and priority from the spec,
/// its usage from `measured` (None: no stats).
pub fn sample_of(pod: &Pod, measured: Option<&PodSample>) -> PodSample {
    let r = skiff_helpers::resources::pod_requests(pod, false);
    let container_requests = pod
        .spec
        .iter()
        .flat_map(|s| {
            s.containers
                .iter()
                .chain(s.init_containers.iter().flatten())
        })
        .map(|c| {
            let req = skiff_helpers::resources::Resource::from_map(
                c.resources.as_ref().and_then(|r| r.requests.as_ref()),
            );
            (c.name.clone(), req.memory)
        })
        .collect();
    PodSample {
        uid: pod.metadata.uid.clone().unwrap_or_default(),
        priority: crate::reclaim::priority_of(pod),
        memory_request: r.memory,
        container_requests,
        memory: measured.and_then(|m| m.memory.clone()),
        disk_request: r.ephemeral_storage,
        disk: measured.and_then(|m| m.disk),
        processes: measured.and_then(|m| m.processes),
    }
}

/// The node's pressure conditions as the eviction manager last decided
/// them (None: not measured yet; the node reports no pressure).
pub type Conditions = tokio::sync::watch::Receiver<Option<BTreeSet<Condition>>>;

/// Watches the node every [`MONITORING_INTERVAL`]: publishes the
/// conditions on `conditions` and evicts at most one pod per interval
/// through `evictions`, waiting up to [`CLEANUP_TIMEOUT`] for an evicted
/// pod to finish before the next. Runs until dropped.
pub async fn run(
    measure: Box<dyn Measure>,
    config: Config,
    pods: crate::reclaim::PodIndex,
    conditions: tokio::sync::watch::Sender<Option<BTreeSet<Condition>>>,
    evictions: crate::EvictionSender,
) {
    let mut manager = Manager::new(config);
    let start = tokio::time::Instant::now();
    let mut evicting: HashSet<String> = HashSet::new();
    let mut waiting: Option<(String, tokio::time::Instant)> = None;
    loop {
        let active: Vec<Arc<Pod>> = pods
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .values()
            .filter(|p| {
                p.metadata.deletion_timestamp.is_none()
                    && !matches!(
                        p.status.as_ref().and_then(|s| s.phase.as_deref()),
                        Some("Succeeded") | Some("Failed")
                    )
            })
            .cloned()
            .collect();
        evicting.retain(|uid| {
            active
                .iter()
                .any(|p| p.metadata.uid.as_deref() == Some(uid.as_str()))
        });
        if waiting.as_ref().is_some_and(|(uid, until)| {
            !evicting.contains(uid) || *until <= tokio::time::Instant::now()
        }) {
            waiting = None;
        }
        let (obs, measured) = measure.measure();
        let samples: Vec<PodSample> = active
            .iter()
            .filter(|p| !evicting.contains(p.metadata.uid.as_deref().unwrap_or_default()))
            .map(|p| {
                sample_of(
                    p,
                    measured.get(p.metadata.uid.as_deref().unwrap_or_default()),
                )
            })
            .collect();
        let now = start.elapsed().as_secs_f64();
        let d = manager.synchronize(now, &obs, &samples);
        conditions.send_if_modified(|c| {
            let changed = c.as_ref() != Some(&d.conditions);
            *c = Some(d.conditions.clone());
            changed
        });
        if let (Some((uid, message, grace)), None) = (d.evict, &waiting) {
            tracing::info!(resource = d.reclaiming.unwrap_or_default(), pod_uid = %uid, "node-pressure eviction");
            evicting.insert(uid.clone());
            waiting = Some((uid.clone(), tokio::time::Instant::now() + CLEANUP_TIMEOUT));
            let _ = evictions.send((
                uid,
                crate::pods::plan::Eviction {
                    message,
                    grace_seconds: grace,
                },
            ));
        }
        tokio::time::sleep(MONITORING_INTERVAL).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MI: i64 = 1 << 20;
    const GI: i64 = 1 << 30;

    fn obs(pairs: &[(Signal, i64, i64)]) -> Observations {
        pairs
            .iter()
            .map(|(s, a, c)| {
                (
                    *s,
                    Observation {
                        available: *a,
                        capacity: *c,
                    },
                )
            })
            .collect()
    }

    fn mem(available: i64) -> Observations {
        obs(&[(Signal::MemoryAvailable, available, 8 * GI)])
    }

    fn pod(uid: &str, priority: i32, request: i64, usage: Option<i64>) -> PodSample {
        PodSample {
            uid: uid.into(),
            priority,
            memory_request: request,
            container_requests: vec![("app".into(), request)],
            memory: usage.map(|u| (u, vec![("app".into(), u)])),
            ..Default::default()
        }
    }

    #[test]
    fn kubelets_flags_parse_and_bad_ones_say_why() {
        let ok = |hard: &str| parse_config(Some(hard), None, None, None);
        let defaults = parse_config(None, None, None, None).unwrap();
        assert_eq!(
            defaults
                .iter()
                .map(|t| (t.signal, t.value))
                .collect::<Vec<_>>(),
            [
                (Signal::MemoryAvailable, Value::Quantity(100 * MI)),
                (Signal::NodeFsAvailable, Value::Percentage(0.10)),
                (Signal::ImageFsAvailable, Value::Percentage(0.15)),
                (Signal::NodeFsInodesFree, Value::Percentage(0.05)),
            ]
        );
        assert!(defaults.iter().all(Threshold::hard));
        // Given, the flag replaces the defaults; 0% and 100% are ignored.
        let one = ok("memory.available<1Gi, nodefs.available<100%").unwrap();
        assert_eq!(one.len(), 1);
        assert_eq!(one[0].value, Value::Quantity(GI));
        assert_eq!(ok("").unwrap(), vec![]);
        let cases = [
            ("memory.available=1Gi", "malformed pair"),
            ("memory.free<1Gi", "unsupported eviction signal memory.free"),
            ("memory.available<lots", "has no quantity"),
            ("memory.available<0", "must be positive"),
            ("memory.available<-5Mi", "must be positive"),
            ("nodefs.available<150%", "must be <= 100%"),
            ("nodefs.available<-5%", "must be >= 0%"),
            ("nodefs.available<x%", "has no percentage"),
        ];
        for (flag, want) in cases {
            let e = ok(flag).unwrap_err();
            assert!(
                e.starts_with("--eviction-hard: ") && e.contains(want),
                "{flag}: {e}"
            );
        }
        let soft = parse_config(
            Some(""),
            Some("memory.available<1Gi"),
            Some("memory.available=1m30s"),
            Some("memory.available=200Mi"),
        )
        .unwrap();
        assert_eq!(soft[0].grace, Duration::from_secs(90));
        assert_eq!(soft[0].min_reclaim, Some(Value::Quantity(200 * MI)));
        let e = parse_config(Some(""), Some("memory.available<1Gi"), None, None).unwrap_err();
        assert!(e.contains("grace period must be specified"), "{e}");
        let e = parse_config(Some(""), None, Some("memory.available=soon"), None).unwrap_err();
        assert!(e.contains("no duration"), "{e}");
    }

    #[test]
    fn go_durations_parse() {
        let cases = [
            ("90s", Some(90.0)),
            ("1m30s", Some(90.0)),
            ("5m0s", Some(300.0)),
            ("1h", Some(3600.0)),
            ("500ms", Some(0.5)),
            ("0", Some(0.0)),
            ("", None),
            ("5", None),
            ("5x", None),
        ];
        for (text, want) in cases {
            assert_eq!(
                parse_duration(text).map(|d| d.as_secs_f64()),
                want,
                "{text}"
            );
        }
    }

    #[test]
    fn a_hard_threshold_met_sets_the_condition_and_evicts_one_pod_with_kubelets_message() {
        let mut m = Manager::new(Config::default());
        let pods = [pod("a", 0, 100 * MI, Some(50 * MI))];
        let d = m.synchronize(0.0, &mem(GI), &pods);
        assert!(d.conditions.is_empty());
        assert_eq!(d.evict, None);
        let d = m.synchronize(10.0, &mem(50 * MI), &pods);
        assert_eq!(d.conditions, [Condition::Memory].into());
        assert_eq!(d.reclaiming, Some("memory"));
        let (uid, message, grace) = d.evict.unwrap();
        assert_eq!(uid, "a");
        assert_eq!(grace, 1);
        assert_eq!(
            message,
            "The node was low on resource: memory. Threshold quantity: 100Mi, available: 50Mi. "
        );
    }

    #[test]
    fn the_message_names_containers_using_more_than_they_requested() {
        let mut m = Manager::new(Config::default());
        let pods = [pod("a", 0, 10 * MI, Some(300 * MI))];
        let (_, message, _) = m.synchronize(0.0, &mem(MI), &pods).evict.unwrap();
        assert_eq!(
            message,
            "The node was low on resource: memory. Threshold quantity: 100Mi, available: 1Mi. \
             Container app was using 300Mi, request is 10Mi, has larger consumption of memory. "
        );
    }

    #[test]
    fn the_condition_stays_for_the_transition_period_after_the_pressure_goes() {
        let mut m = Manager::new(Config::default());
        m.synchronize(0.0, &mem(MI), &[]);
        let d = m.synchronize(10.0, &mem(GI), &[]);
        assert_eq!(d.conditions, [Condition::Memory].into());
        assert_eq!(d.evict, None);
        assert_eq!(m.synchronize(299.0, &mem(GI), &[]).conditions.len(), 1);
        assert!(m.synchronize(300.0, &mem(GI), &[]).conditions.is_empty());
    }

    #[test]
    fn a_soft_threshold_evicts_only_after_its_grace_period_and_with_no_grace() {
        let thresholds = parse_config(
            Some(""),
            Some("memory.available<1Gi"),
            Some("memory.available=30s"),
            None,
        )
        .unwrap();
        let mut m = Manager::new(Config {
            thresholds,
            transition: Duration::from_secs(300),
        });
        let pods = [pod("a", 0, 0, Some(MI))];
        let d = m.synchronize(0.0, &mem(512 * MI), &pods);
        // The condition at once, the eviction after the grace.
        assert_eq!(d.conditions, [Condition::Memory].into());
        assert_eq!(d.evict, None);
        assert_eq!(m.synchronize(20.0, &mem(512 * MI), &pods).evict, None);
        let (_, _, grace) = m.synchronize(30.0, &mem(512 * MI), &pods).evict.unwrap();
        assert_eq!(grace, 0);
        // Relieved, then met again: the grace starts over.
        m.synchronize(40.0, &mem(2 * GI), &pods);
        assert_eq!(m.synchronize(50.0, &mem(512 * MI), &pods).evict, None);
    }

    #[test]
    fn a_met_threshold_stays_met_until_its_minimum_reclaim() {
        let thresholds = parse_config(
            Some("memory.available<100Mi"),
            None,
            None,
            Some("memory.available=1Gi"),
        )
        .unwrap();
        let mut m = Manager::new(Config {
            thresholds,
            transition: Duration::ZERO,
        });
        let pods = [pod("a", 0, 0, Some(MI))];
        assert!(m.synchronize(0.0, &mem(50 * MI), &pods).evict.is_some());
        // Above 100Mi but below 100Mi + 1Gi: still reclaiming.
        assert!(m.synchronize(10.0, &mem(500 * MI), &pods).evict.is_some());
        assert!(m.synchronize(20.0, &mem(2 * GI), &pods).evict.is_none());
        // Once resolved, 500Mi is fine again.
        assert!(m.synchronize(30.0, &mem(500 * MI), &pods).evict.is_none());
    }

    #[test]
    fn memory_ranking_is_usage_above_request_then_priority_then_how_far_above() {
        let cases: &[(&str, Vec<PodSample>, Vec<&str>)] = &[
            (
                "over its request goes before a lower priority under it",
                vec![
                    pod("under-low", -10, GI, Some(MI)),
                    pod("over", 100, MI, Some(2 * MI)),
                ],
                vec!["over", "under-low"],
            ),
            (
                "then lower priority first",
                vec![pod("high", 10, 0, Some(5 * MI)), pod("low", 1, 0, Some(MI))],
                vec!["low", "high"],
            ),
            (
                "then the one furthest above its request",
                vec![
                    pod("little", 0, MI, Some(2 * MI)),
                    pod("lots", 0, MI, Some(90 * MI)),
                ],
                vec!["lots", "little"],
            ),
            (
                "a pod without stats goes first",
                vec![pod("measured", 0, 0, Some(GI)), pod("unknown", 0, 0, None)],
                vec!["unknown", "measured"],
            ),
        ];
        for (name, pods, want) in cases {
            let got: Vec<&str> = rank(Signal::MemoryAvailable, pods)
                .iter()
                .map(|p| p.uid.as_str())
                .collect();
            assert_eq!(got, *want, "{name}");
        }
    }

    #[test]
    fn disk_and_pid_ranking_come_down_to_priority_without_stats() {
        let pods = vec![pod("b", 5, 0, None), pod("a", 1, 0, None)];
        for s in [
            Signal::NodeFsAvailable,
            Signal::ImageFsInodesFree,
            Signal::PidAvailable,
        ] {
            let got: Vec<&str> = rank(s, &pods).iter().map(|p| p.uid.as_str()).collect();
            assert_eq!(got, ["a", "b"], "{s:?}");
        }
        let mut busy = pod("busy", 5, 0, None);
        busy.processes = Some(900);
        let mut idle = pod("idle", 5, 0, None);
        idle.processes = Some(3);
        let got: Vec<String> = rank(Signal::PidAvailable, &[idle, busy])
            .iter()
            .map(|p| p.uid.clone())
            .collect();
        assert_eq!(got, ["busy", "idle"]);
    }

    #[test]
    fn signals_map_to_kubelets_conditions_with_memory_first() {
        let mut m = Manager::new(Config::default());
        let o = obs(&[
            (Signal::MemoryAvailable, MI, 8 * GI),
            (Signal::NodeFsAvailable, GI, 100 * GI),
            (Signal::PidAvailable, 10, 1000),
        ]);
        let d = m.synchronize(0.0, &o, &[pod("a", 0, 0, Some(MI))]);
        // No pid threshold by default; nodefs 1% < 10%.
        assert_eq!(d.conditions, [Condition::Memory, Condition::Disk].into());
        assert_eq!(d.reclaiming, Some("memory"));
        let disk_only = obs(&[(Signal::NodeFsAvailable, GI, 100 * GI)]);
        let mut m = Manager::new(Config::default());
        let (_, message, _) = m
            .synchronize(0.0, &disk_only, &[pod("a", 0, 0, None)])
            .evict
            .unwrap();
        // 10% as kubelet's 32-bit float of 100Gi, to the byte.
        assert_eq!(
            message,
            "The node was low on resource: ephemeral-storage. Threshold quantity: 10737418400, available: 1Gi. "
        );
        assert_eq!(
            Condition::Memory.reason(true).0,
            "KubeletHasInsufficientMemory"
        );
        assert_eq!(Condition::Disk.reason(false).0, "KubeletHasNoDiskPressure");
        assert_eq!(Condition::Pid.taint(), "node.kubernetes.io/pid-pressure");
    }

    #[test]
    fn critical_pods_are_never_evicted() {
        let mut m = Manager::new(Config::default());
        let pods = [
            pod("crit", CRITICAL_PRIORITY, 0, None),
            pod("user", 0, 0, Some(MI)),
        ];
        let (uid, _, _) = m.synchronize(0.0, &mem(MI), &pods).evict.unwrap();
        assert_eq!(uid, "user");
        let mut m = Manager::new(Config::default());
        let d = m.synchronize(0.0, &mem(MI), &pods[..1]);
        assert_eq!(d.evict, None);
        assert_eq!(d.conditions, [Condition::Memory].into());
    }
}
