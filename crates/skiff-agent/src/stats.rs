//! Node and container resource usage as kubelet reports it: the Summary API
//! (`/stats/summary`, stats/v1alpha1 JSON) and the resource metrics
//! (`/metrics/resource`, Prometheus text) that metrics-server scrapes.
//!
//! Where the numbers come from:
//! - Containers: the runtime (CRI `ListContainerStats`). Only running
//!   containers of a pod's newest ready sandbox are reported, as kubelet
//!   drops terminated ones.
//! - Pods: the sum of their running containers (the sandbox's own pause
//!   process is left out — it is a few hundred KiB and no CPU).
//! - The node: `/proc`. CPU time is the non-idle time of `/proc/stat`'s
//!   `cpu` line (user, nice, system, irq, softirq, steal; guest time is
//!   already part of user) in USER_HZ, which Linux fixes at 100 for this
//!   file. Memory comes from `/proc/meminfo`: usage = MemTotal − MemFree,
//!   working set = usage − Inactive(file) (kubelet subtracts inactive file
//!   pages the same way), RSS = AnonPages, available = MemTotal − working
//!   set. The start time is the boot time (`btime`); `fs` is the
//!   filesystem of the agent's data directory.
//!
//! usageNanoCores is a rate and needs two samples. Like cadvisor, the
//! collector keeps the previous cumulative CPU sample of the node and of
//! every container and reports the rate between it and the current one
//! (for containers only when the runtime gives no rate itself). It also
//! samples by itself every [`HOUSEKEEPING`] (kubelet's housekeeping
//! interval, [`Collector::housekeep_forever`]), so a request has rates
//! without an earlier request: a tool that reads the Summary once gets
//! usageNanoCores for the node and for every container that has run
//! through a housekeeping. A request less than a second after the kept
//! sample reports the rate last computed, so close requests do not
//! produce noisy rates.

use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::sync::Mutex;

use serde::Serialize;

use crate::runtime::{
    cri, Runtime, LABEL_CONTAINER_NAME, LABEL_POD_NAME, LABEL_POD_NAMESPACE, LABEL_POD_UID,
};

/// A point in time (Unix nanoseconds), serialized as Kubernetes' metav1.Time
/// (RFC 3339, whole seconds).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Default)]
pub struct Time(pub i64);

impl Serialize for Time {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let secs = self.0.div_euclid(1_000_000_000);
        let t = k8s_openapi::jiff::Timestamp::from_second(secs)
            .unwrap_or(k8s_openapi::jiff::Timestamp::UNIX_EPOCH);
        s.collect_str(&t)
    }
}

#[derive(Debug, Clone, Default, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Summary {
    pub node: NodeStats,
    pub pods: Vec<PodStats>,
}

#[derive(Debug, Clone, Default, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct NodeStats {
    pub node_name: String,
    pub start_time: Time,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cpu: Option<CpuStats>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub memory: Option<MemoryStats>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fs: Option<FsStats>,
}

#[derive(Debug, Clone, Default, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct CpuStats {
    pub time: Time,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub usage_nano_cores: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub usage_core_nano_seconds: Option<u64>,
}

#[derive(Debug, Clone, Default, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct MemoryStats {
    pub time: Time,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub available_bytes: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub usage_bytes: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub working_set_bytes: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rss_bytes: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub page_faults: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub major_page_faults: Option<u64>,
}

#[derive(Debug, Clone, Default, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct FsStats {
    pub time: Time,
    pub available_bytes: u64,
    pub capacity_bytes: u64,
    pub used_bytes: u64,
    pub inodes_free: u64,
    pub inodes: u64,
    pub inodes_used: u64,
}

#[derive(Debug, Clone, Default, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct PodStats {
    pub pod_ref: PodRef,
    pub start_time: Time,
    pub containers: Vec<ContainerStats>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cpu: Option<CpuStats>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub memory: Option<MemoryStats>,
    /// Skiff's reservation of the pod (see `reclaim`), beyond kubelet's
    /// API: what the node keeps for it, its resource recommendation.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reservation: Option<ReservationStats>,
}

/// A pod's reservation in the Summary.
#[derive(Debug, Clone, Copy, Default, Serialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct ReservationStats {
    pub cpu_milli_cores: u64,
    pub memory_bytes: u64,
}

#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct PodRef {
    pub name: String,
    pub namespace: String,
    pub uid: String,
}

#[derive(Debug, Clone, Default, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ContainerStats {
    pub name: String,
    pub start_time: Time,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cpu: Option<CpuStats>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub memory: Option<MemoryStats>,
}

/// The previous cumulative CPU sample of each thing measured (the node,
/// containers by id), for usageNanoCores.
#[derive(Debug, Default)]
pub struct Rates {
    prev: HashMap<String, RateSample>,
}

#[derive(Debug, Clone, Copy)]
struct RateSample {
    time: i64,
    usage: u64,
    rate: Option<u64>,
}

/// Samples closer together than this keep the last rate.
const MIN_RATE_WINDOW_NS: i64 = 1_000_000_000;

impl Rates {
    /// Records cumulative CPU `usage` (ns) of `key` at `time` (Unix ns) and
    /// returns its usage in nanocores since the kept sample.
    pub fn observe(&mut self, key: &str, time: i64, usage: u64) -> Option<u64> {
        let Some(p) = self.prev.get_mut(key) else {
            self.prev.insert(
                key.to_string(),
                RateSample {
                    time,
                    usage,
                    rate: None,
                },
            );
            return None;
        };
        let dt = time - p.time;
        if usage < p.usage || dt < 0 {
            // A reset counter or a clock step: start over.
            *p = RateSample {
                time,
                usage,
                rate: None,
            };
            return None;
        }
        if dt < MIN_RATE_WINDOW_NS {
            return p.rate;
        }
        let rate = ((usage - p.usage) as u128 * 1_000_000_000 / dt as u128) as u64;
        *p = RateSample {
            time,
            usage,
            rate: Some(rate),
        };
        Some(rate)
    }

    /// Forgets everything not in `keys`.
    fn retain(&mut self, keys: &HashSet<String>) {
        self.prev.retain(|k, _| keys.contains(k));
    }
}

/// The key of the node's own sample in [`Rates`].
const NODE_KEY: &str = "";

/// What `/proc` and the data directory's filesystem say about the node.
#[derive(Debug, Clone, Default)]
pub struct NodeSample {
    pub time: i64,
    /// Boot time, Unix ns.
    pub boot_time: i64,
    /// Cumulative non-idle CPU time of all cores, ns.
    pub cpu_usage_ns: Option<u64>,
    pub memory: Option<MemInfo>,
    pub fs: Option<FsStats>,
}

/// The `/proc/meminfo` fields the node's memory stats use, in bytes.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct MemInfo {
    pub total: u64,
    pub free: u64,
    pub inactive_file: u64,
    pub anon: u64,
}

/// `/proc/stat`: (non-idle CPU ns, boot time in Unix seconds).
pub fn parse_proc_stat(text: &str) -> (Option<u64>, Option<i64>) {
    // USER_HZ: the unit of /proc/stat, 100 on every Linux architecture.
    const NS_PER_TICK: u64 = 10_000_000;
    let mut cpu = None;
    let mut btime = None;
    for line in text.lines() {
        let mut f = line.split_whitespace();
        match f.next() {
            Some("cpu") => {
                let v: Vec<u64> = f.map(|x| x.parse().unwrap_or(0)).collect();
                let at = |i: usize| v.get(i).copied().unwrap_or(0);
                // user nice system idle iowait irq softirq steal guest guest_nice
                if v.len() >= 4 {
                    let busy = at(0) + at(1) + at(2) + at(5) + at(6) + at(7);
                    cpu = Some(busy * NS_PER_TICK);
                }
            }
            Some("btime") => btime = f.next().and_then(|x| x.parse().ok()),
            _ => {}
        }
    }
    (cpu, btime)
}

/// `/proc/meminfo`, values converted from kB to bytes.
pub fn parse_meminfo(text: &str) -> Option<MemInfo> {
    let mut fields: HashMap<&str, u64> = HashMap::new();
    for line in text.lines() {
        let Some((k, v)) = line.split_once(':') else {
            continue;
        };
        let n = v
            .split_whitespace()
            .next()
            .and_then(|n| n.parse::<u64>().ok());
        if let Some(n) = n {
            fields.insert(k.trim(), n * 1024);
        }
    }
    Some(MemInfo {
        total: *fields.get("MemTotal")?,
        free: *fields.get("MemFree")?,
        inactive_file: fields.get("Inactive(file)").copied().unwrap_or(0),
        anon: fields.get("AnonPages").copied().unwrap_or(0),
    })
}

fn now_nanos() -> i64 {
    k8s_openapi::jiff::Timestamp::now().as_nanosecond() as i64
}

fn value(v: &Option<cri::UInt64Value>) -> Option<u64> {
    v.as_ref().map(|v| v.value)
}

fn add(a: Option<u64>, b: Option<u64>) -> Option<u64> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a + b),
        (a, None) => a,
        (None, b) => b,
    }
}

/// The Summary from a node sample and what the runtime listed.
pub fn build_summary(
    node_name: &str,
    node: &NodeSample,
    sandboxes: &[cri::PodSandbox],
    containers: &[cri::Container],
    stats: &[cri::ContainerStats],
    rates: &mut Rates,
) -> Summary {
    let mut seen: HashSet<String> = HashSet::new();
    seen.insert(NODE_KEY.to_string());
    let node_cpu = node.cpu_usage_ns.map(|usage| CpuStats {
        time: Time(node.time),
        usage_nano_cores: rates.observe(NODE_KEY, node.time, usage),
        usage_core_nano_seconds: Some(usage),
    });
    let node_memory = node.memory.map(|m| {
        let usage = m.total.saturating_sub(m.free);
        let working_set = usage.saturating_sub(m.inactive_file);
        MemoryStats {
            time: Time(node.time),
            available_bytes: Some(m.total.saturating_sub(working_set)),
            usage_bytes: Some(usage),
            working_set_bytes: Some(working_set),
            rss_bytes: Some(m.anon),
            ..Default::default()
        }
    });

    // The newest ready sandbox of each pod.
    let mut newest: HashMap<String, &cri::PodSandbox> = HashMap::new();
    for sb in sandboxes
        .iter()
        .filter(|s| s.state == cri::PodSandboxState::SandboxReady as i32)
    {
        let uid = sb
            .metadata
            .as_ref()
            .map(|m| m.uid.clone())
            .filter(|u| !u.is_empty())
            .or_else(|| sb.labels.get(LABEL_POD_UID).cloned())
            .unwrap_or_default();
        match newest.get(&uid) {
            Some(old) if old.created_at >= sb.created_at => {}
            _ => {
                newest.insert(uid, sb);
            }
        }
    }
    let by_id: HashMap<&str, &cri::ContainerStats> = stats
        .iter()
        .filter_map(|s| Some((s.attributes.as_ref()?.id.as_str(), s)))
        .collect();

    let mut pods = Vec::new();
    for (uid, sb) in newest {
        let meta = sb.metadata.clone().unwrap_or_default();
        let label = |k: &str| sb.labels.get(k).cloned().unwrap_or_default();
        let pod_ref = PodRef {
            name: Some(meta.name)
                .filter(|n| !n.is_empty())
                .unwrap_or_else(|| label(LABEL_POD_NAME)),
            namespace: Some(meta.namespace)
                .filter(|n| !n.is_empty())
                .unwrap_or_else(|| label(LABEL_POD_NAMESPACE)),
            uid,
        };
        let mut by_name: HashMap<String, &cri::Container> = HashMap::new();
        for c in containers.iter().filter(|c| {
            c.pod_sandbox_id == sb.id && c.state == cri::ContainerState::ContainerRunning as i32
        }) {
            let name = c
                .metadata
                .as_ref()
                .map(|m| m.name.clone())
                .filter(|n| !n.is_empty())
                .or_else(|| c.labels.get(LABEL_CONTAINER_NAME).cloned())
                .unwrap_or_default();
            match by_name.get(&name) {
                Some(old) if old.created_at >= c.created_at => {}
                _ => {
                    by_name.insert(name, c);
                }
            }
        }
        let mut out: Vec<ContainerStats> = by_name
            .into_iter()
            .map(|(name, c)| {
                let s = by_id.get(c.id.as_str());
                let cpu = s.and_then(|s| s.cpu.as_ref()).map(|u| {
                    let usage = value(&u.usage_core_nano_seconds);
                    let own = usage.and_then(|usage| {
                        seen.insert(c.id.clone());
                        rates.observe(&c.id, u.timestamp, usage)
                    });
                    CpuStats {
                        time: Time(u.timestamp),
                        usage_nano_cores: value(&u.usage_nano_cores).filter(|v| *v > 0).or(own),
                        usage_core_nano_seconds: usage,
                    }
                });
                let memory = s.and_then(|s| s.memory.as_ref()).map(|m| MemoryStats {
                    time: Time(m.timestamp),
                    available_bytes: value(&m.available_bytes),
                    usage_bytes: value(&m.usage_bytes),
                    working_set_bytes: value(&m.working_set_bytes),
                    rss_bytes: value(&m.rss_bytes),
                    page_faults: value(&m.page_faults),
                    major_page_faults: value(&m.major_page_faults),
                });
                ContainerStats {
                    name,
                    start_time: Time(c.created_at),
                    cpu,
                    memory,
                }
            })
            .collect();
        out.sort_by(|a, b| a.name.cmp(&b.name));
        let cpu =
            out.iter()
                .filter_map(|c| c.cpu.as_ref())
                .fold(None, |acc: Option<CpuStats>, c| {
                    let a = acc.unwrap_or_default();
                    Some(CpuStats {
                        time: a.time.max(c.time),
                        usage_nano_cores: add(a.usage_nano_cores, c.usage_nano_cores),
                        usage_core_nano_seconds: add(
                            a.usage_core_nano_seconds,
                            c.usage_core_nano_seconds,
                        ),
                    })
                });
        let memory = out.iter().filter_map(|c| c.memory.as_ref()).fold(
            None,
            |acc: Option<MemoryStats>, m| {
                let a = acc.unwrap_or_default();
                Some(MemoryStats {
                    time: a.time.max(m.time),
                    available_bytes: None,
                    usage_bytes: add(a.usage_bytes, m.usage_bytes),
                    working_set_bytes: add(a.working_set_bytes, m.working_set_bytes),
                    rss_bytes: add(a.rss_bytes, m.rss_bytes),
                    page_faults: add(a.page_faults, m.page_faults),
                    major_page_faults: add(a.major_page_faults, m.major_page_faults),
                })
            },
        );
        pods.push(PodStats {
            pod_ref,
            start_time: Time(sb.created_at),
            containers: out,
            cpu,
            memory,
            reservation: None,
        });
    }
    pods.sort_by(|a, b| {
        (&a.pod_ref.namespace, &a.pod_ref.name).cmp(&(&b.pod_ref.namespace, &b.pod_ref.name))
    });
    rates.retain(&seen);
    Summary {
        node: NodeStats {
            node_name: node_name.to_string(),
            start_time: Time(node.boot_time),
            cpu: node_cpu,
            memory: node_memory,
            fs: node.fs.clone(),
        },
        pods,
    }
}

/// One metric family of the Prometheus text format.
struct Family {
    name: &'static str,
    help: &'static str,
    kind: &'static str,
    samples: Vec<String>,
}

fn escape(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

fn labels(pairs: &[(&str, &str)]) -> String {
    if pairs.is_empty() {
        return String::new();
    }
    let inner: Vec<String> = pairs
        .iter()
        .map(|(k, v)| format!("{k}=\"{}\"", escape(v)))
        .collect();
    format!("{{{}}}", inner.join(","))
}

fn sample(labels: &str, v: f64, time: Option<Time>) -> String {
    match time {
        Some(t) => format!("{labels} {v} {}", t.0.div_euclid(1_000_000)),
        None => format!("{labels} {v}"),
    }
}

/// kubelet's `/metrics/resource`: cumulative CPU seconds and working sets
/// of the node, pods and containers, with the sample times (ms) the
/// numbers were taken at; `scrape_error` is 1 when the runtime could not
/// be asked.
pub fn render_resource_metrics(summary: &Summary, scrape_error: bool) -> String {
    let fam = |name, help, kind| Family {
        name,
        help,
        kind,
        samples: Vec::new(),
    };
    let mut c_cpu = fam(
        "container_cpu_usage_seconds_total",
        "[STABLE] CPU time the container has used, in core-seconds",
        "counter",
    );
    let mut c_mem = fam(
        "container_memory_working_set_bytes",
        "[STABLE] The container's current working set, in bytes",
        "gauge",
    );
    let mut c_start = fam(
        "container_start_time_seconds",
        "[STABLE] When the container started, in seconds since the Unix epoch",
        "gauge",
    );
    let mut n_cpu = fam(
        "node_cpu_usage_seconds_total",
        "[STABLE] CPU time the node has used, in core-seconds",
        "counter",
    );
    let mut n_mem = fam(
        "node_memory_working_set_bytes",
        "[STABLE] The node's current working set, in bytes",
        "gauge",
    );
    let mut p_cpu = fam(
        "pod_cpu_usage_seconds_total",
        "[STABLE] CPU time the pod has used, in core-seconds",
        "counter",
    );
    let mut p_mem = fam(
        "pod_memory_working_set_bytes",
        "[STABLE] The pod's current working set, in bytes",
        "gauge",
    );
    let mut r_err = fam(
        "resource_scrape_error",
        "[STABLE] 1 when the container stats could not be read, else 0",
        "gauge",
    );
    let mut s_err = fam(
        "scrape_error",
        "[ALPHA] 1 when the container stats could not be read, else 0 (deprecated alias of resource_scrape_error)",
        "gauge",
    );
    const NS: f64 = 1e9;
    if let Some(cpu) = &summary.node.cpu {
        if let Some(u) = cpu.usage_core_nano_seconds {
            n_cpu
                .samples
                .push(sample("", u as f64 / NS, Some(cpu.time)));
        }
    }
    if let Some(m) = &summary.node.memory {
        if let Some(w) = m.working_set_bytes {
            n_mem.samples.push(sample("", w as f64, Some(m.time)));
        }
    }
    for pod in &summary.pods {
        let (p, ns) = (pod.pod_ref.name.as_str(), pod.pod_ref.namespace.as_str());
        for c in &pod.containers {
            let l = labels(&[("container", &c.name), ("namespace", ns), ("pod", p)]);
            if c.start_time.0 > 0 {
                c_start
                    .samples
                    .push(sample(&l, c.start_time.0 as f64 / NS, None));
            }
            if let Some(cpu) = &c.cpu {
                if let Some(u) = cpu.usage_core_nano_seconds {
                    c_cpu
                        .samples
                        .push(sample(&l, u as f64 / NS, Some(cpu.time)));
                }
            }
            if let Some(m) = &c.memory {
                if let Some(w) = m.working_set_bytes {
                    c_mem.samples.push(sample(&l, w as f64, Some(m.time)));
                }
            }
        }
        let l = labels(&[("namespace", ns), ("pod", p)]);
        if let Some(cpu) = &pod.cpu {
            if let Some(u) = cpu.usage_core_nano_seconds {
                p_cpu
                    .samples
                    .push(sample(&l, u as f64 / NS, Some(cpu.time)));
            }
        }
        if let Some(m) = &pod.memory {
            if let Some(w) = m.working_set_bytes {
                p_mem.samples.push(sample(&l, w as f64, Some(m.time)));
            }
        }
    }
    let err = if scrape_error { 1.0 } else { 0.0 };
    r_err.samples.push(sample("", err, None));
    s_err.samples.push(sample("", err, None));
    let mut out = String::new();
    for f in [
        c_cpu, c_mem, c_start, n_cpu, n_mem, p_cpu, p_mem, r_err, s_err,
    ] {
        if f.samples.is_empty() {
            continue;
        }
        out.push_str(&format!(
            "# HELP {} {}\n# TYPE {} {}\n",
            f.name, f.help, f.name, f.kind
        ));
        for s in f.samples {
            out.push_str(f.name);
            out.push_str(&s);
            out.push('\n');
        }
    }
    out
}

/// How often the collector samples without a request (kubelet's
/// housekeeping interval).
pub const HOUSEKEEPING: std::time::Duration = std::time::Duration::from_secs(10);

/// Collects the node's and the runtime's numbers, keeping the previous CPU
/// samples between requests.
pub struct Collector {
    node_name: String,
    data_dir: PathBuf,
    /// The pods' reservations, as reclamation last estimated them.
    reservations: crate::reclaim::Reservations,
    rates: Mutex<Rates>,
    latest: tokio::sync::watch::Sender<Option<std::sync::Arc<Summary>>>,
}

impl Collector {
    pub fn new(node_name: &str, data_dir: PathBuf) -> Collector {
        Collector {
            node_name: node_name.to_string(),
            data_dir,
            reservations: Default::default(),
            rates: Mutex::new(Rates::default()),
            latest: tokio::sync::watch::channel(None).0,
        }
    }

    /// Where reclamation puts the pods' reservations for the Summary.
    pub fn reservations(&self) -> crate::reclaim::Reservations {
        self.reservations.clone()
    }

    /// The latest summary taken, and each one after it.
    pub fn subscribe(&self) -> tokio::sync::watch::Receiver<Option<std::sync::Arc<Summary>>> {
        self.latest.subscribe()
    }

    /// The node's numbers now.
    // statvfs's field types differ between targets.
    #[allow(clippy::unnecessary_cast)]
    pub fn node_sample(&self) -> NodeSample {
        let time = now_nanos();
        let (cpu, btime) = std::fs::read_to_string("/proc/stat")
            .map(|t| parse_proc_stat(&t))
            .unwrap_or((None, None));
        let memory = std::fs::read_to_string("/proc/meminfo")
            .ok()
            .and_then(|t| parse_meminfo(&t));
        let fs = nix::sys::statvfs::statvfs(&self.data_dir).ok().map(|v| {
            let frsize = v.fragment_size() as u64;
            let blocks = v.blocks() as u64;
            let files = v.files() as u64;
            let files_free = v.files_free() as u64;
            FsStats {
                time: Time(time),
                available_bytes: v.blocks_available() as u64 * frsize,
                capacity_bytes: blocks * frsize,
                used_bytes: blocks.saturating_sub(v.blocks_free() as u64) * frsize,
                inodes_free: files_free,
                inodes: files,
                inodes_used: files.saturating_sub(files_free),
            }
        });
        NodeSample {
            time,
            boot_time: btime.unwrap_or(0) * 1_000_000_000,
            cpu_usage_ns: cpu,
            memory,
            fs,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Rates> {
        self.rates.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// kubelet's Summary: the node, and the pods with their containers.
    pub async fn summary(&self, runtime: &dyn Runtime) -> anyhow::Result<Summary> {
        let (sandboxes, containers, stats) = tokio::try_join!(
            runtime.list_sandboxes(None),
            runtime.list_containers(None),
            runtime.list_container_stats(None),
        )?;
        let node = self.node_sample();
        let mut summary = build_summary(
            &self.node_name,
            &node,
            &sandboxes,
            &containers,
            &stats,
            &mut self.lock(),
        );
        {
            let r = self.reservations.read().unwrap_or_else(|e| e.into_inner());
            for p in &mut summary.pods {
                p.reservation = r.get(&p.pod_ref.uid).map(|a| ReservationStats {
                    cpu_milli_cores: a.cpu.max(0.0).ceil() as u64,
                    memory_bytes: a.memory.max(0.0).ceil() as u64,
                });
            }
        }
        self.latest
            .send_replace(Some(std::sync::Arc::new(summary.clone())));
        Ok(summary)
    }

    /// Samples the node and the runtime every `every` (the first at once),
    /// as kubelet's housekeeping does, so that the rates are there when a
    /// request comes. Runs until dropped.
    pub async fn housekeep_forever(&self, runtime: &dyn Runtime, every: std::time::Duration) {
        loop {
            if let Err(e) = self.summary(runtime).await {
                tracing::debug!("stats housekeeping: the runtime's stats: {e:#}");
            }
            tokio::time::sleep(every).await;
        }
    }

    /// kubelet's resource metrics; when the runtime fails, the node's
    /// numbers and `scrape_error 1`.
    pub async fn resource_metrics(&self, runtime: &dyn Runtime) -> String {
        match self.summary(runtime).await {
            Ok(s) => render_resource_metrics(&s, false),
            Err(e) => {
                tracing::warn!("resource metrics: the runtime's stats: {e:#}");
                let node = self.node_sample();
                let s = build_summary(&self.node_name, &node, &[], &[], &[], &mut self.lock());
                render_resource_metrics(&s, true)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const SEC: i64 = 1_000_000_000;
    const T0: i64 = 1_767_225_600 * SEC; // 2026-01-01T00:00:00Z

    fn sandbox(id: &str, name: &str, uid: &str, created: i64, ready: bool) -> cri::PodSandbox {
        cri::PodSandbox {
            id: id.into(),
            metadata: Some(cri::PodSandboxMetadata {
                name: name.into(),
                uid: uid.into(),
                namespace: "default".into(),
                attempt: 0,
            }),
            state: if ready { 0 } else { 1 },
            created_at: created,
            ..Default::default()
        }
    }

    fn container(id: &str, sb: &str, name: &str, created: i64, running: bool) -> cri::Container {
        cri::Container {
            id: id.into(),
            pod_sandbox_id: sb.into(),
            metadata: Some(cri::ContainerMetadata {
                name: name.into(),
                attempt: 0,
            }),
            state: if running {
                cri::ContainerState::ContainerRunning as i32
            } else {
                cri::ContainerState::ContainerExited as i32
            },
            created_at: created,
            ..Default::default()
        }
    }

    fn stat(id: &str, t: i64, cpu_ns: u64, ws: u64) -> cri::ContainerStats {
        let v = |v| Some(cri::UInt64Value { value: v });
        cri::ContainerStats {
            attributes: Some(cri::ContainerAttributes {
                id: id.into(),
                ..Default::default()
            }),
            cpu: Some(cri::CpuUsage {
                timestamp: t,
                usage_core_nano_seconds: v(cpu_ns),
                usage_nano_cores: None,
            }),
            memory: Some(cri::MemoryUsage {
                timestamp: t,
                working_set_bytes: v(ws),
                usage_bytes: v(ws + 100),
                rss_bytes: v(ws / 2),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn node(t: i64, cpu: u64) -> NodeSample {
        NodeSample {
            time: t,
            boot_time: T0 - 3600 * SEC,
            cpu_usage_ns: Some(cpu),
            memory: Some(MemInfo {
                total: 1000,
                free: 300,
                inactive_file: 200,
                anon: 150,
            }),
            fs: None,
        }
    }

    #[test]
    fn proc_files_parse_into_busy_cpu_time_boot_time_and_memory() {
        let stat = "cpu  100 5 50 9000 40 1 2 3 7 0\ncpu0 50 2 25 4500 20 0 1 1 0 0\nintr 1 2\nbtime 1767225600\n";
        let (cpu, btime) = parse_proc_stat(stat);
        // user+nice+system+irq+softirq+steal = 161 ticks of 10 ms.
        assert_eq!(cpu, Some(161 * 10_000_000));
        assert_eq!(btime, Some(1_767_225_600));
        let mem = "MemTotal:       2048 kB\nMemFree:         512 kB\nMemAvailable:   1024 kB\nInactive(file):  256 kB\nAnonPages:       128 kB\n";
        assert_eq!(
            parse_meminfo(mem),
            Some(MemInfo {
                total: 2048 * 1024,
                free: 512 * 1024,
                inactive_file: 256 * 1024,
                anon: 128 * 1024
            })
        );
        assert_eq!(parse_meminfo("nothing: 1 kB\n"), None);
    }

    #[test]
    fn rates_need_two_samples_a_second_apart() {
        let mut r = Rates::default();
        assert_eq!(r.observe("c", T0, 1_000), None);
        // Too close: no rate yet, and the kept sample stays.
        assert_eq!(r.observe("c", T0 + SEC / 2, 2_000), None);
        // Half a core over two seconds.
        assert_eq!(
            r.observe("c", T0 + 2 * SEC, 1_000 + SEC as u64),
            Some(500_000_000)
        );
        assert_eq!(
            r.observe("c", T0 + 2 * SEC + 10, u64::MAX / 2),
            Some(500_000_000)
        );
        // A counter that went backwards starts over.
        assert_eq!(r.observe("c", T0 + 5 * SEC, 5), None);
    }

    #[test]
    fn the_summary_has_the_node_and_running_containers_of_ready_pods() {
        let sandboxes = vec![
            sandbox("sb-old", "web", "uid-web", T0, false),
            sandbox("sb-web", "web", "uid-web", T0 + SEC, true),
            sandbox("sb-gone", "gone", "uid-gone", T0, false),
        ];
        let containers = vec![
            container("c1", "sb-web", "app", T0 + 2 * SEC, true),
            container("c2", "sb-web", "side", T0 + 3 * SEC, true),
            container("c3", "sb-web", "done", T0 + 3 * SEC, false),
            container("c4", "sb-old", "app", T0, true),
        ];
        let mut rates = Rates::default();
        let s1 = build_summary(
            "n1",
            &node(T0 + 10 * SEC, 4 * SEC as u64),
            &sandboxes,
            &containers,
            &[
                stat("c1", T0 + 10 * SEC, 2_000_000_000, 4096),
                stat("c2", T0 + 10 * SEC, 500, 1024),
            ],
            &mut rates,
        );
        assert_eq!(s1.pods.len(), 1);
        assert!(s1.node.cpu.as_ref().unwrap().usage_nano_cores.is_none());
        let s = build_summary(
            "n1",
            &node(T0 + 12 * SEC, 6 * SEC as u64),
            &sandboxes,
            &containers,
            &[
                stat("c1", T0 + 12 * SEC, 3_000_000_000, 8192),
                stat("c2", T0 + 12 * SEC, 500, 1024),
            ],
            &mut rates,
        );
        let v = serde_json::to_value(&s).unwrap();
        assert_eq!(
            v["node"],
            json!({
                "nodeName": "n1",
                "startTime": "2025-12-31T23:00:00Z",
                "cpu": {"time": "2026-01-01T00:00:12Z", "usageNanoCores": 1_000_000_000u64, "usageCoreNanoSeconds": 6_000_000_000u64},
                "memory": {"time": "2026-01-01T00:00:12Z", "availableBytes": 500, "usageBytes": 700, "workingSetBytes": 500, "rssBytes": 150}
            })
        );
        assert_eq!(
            v["pods"],
            json!([{
                "podRef": {"name": "web", "namespace": "default", "uid": "uid-web"},
                "startTime": "2026-01-01T00:00:01Z",
                "containers": [
                    {"name": "app", "startTime": "2026-01-01T00:00:02Z",
                     "cpu": {"time": "2026-01-01T00:00:12Z", "usageNanoCores": 500_000_000u64, "usageCoreNanoSeconds": 3_000_000_000u64},
                     "memory": {"time": "2026-01-01T00:00:12Z", "usageBytes": 8292, "workingSetBytes": 8192, "rssBytes": 4096}},
                    {"name": "side", "startTime": "2026-01-01T00:00:03Z",
                     "cpu": {"time": "2026-01-01T00:00:12Z", "usageNanoCores": 0, "usageCoreNanoSeconds": 500},
                     "memory": {"time": "2026-01-01T00:00:12Z", "usageBytes": 1124, "workingSetBytes": 1024, "rssBytes": 512}}
                ],
                "cpu": {"time": "2026-01-01T00:00:12Z", "usageNanoCores": 500_000_000u64, "usageCoreNanoSeconds": 3_000_000_500u64},
                "memory": {"time": "2026-01-01T00:00:12Z", "usageBytes": 9416, "workingSetBytes": 9216, "rssBytes": 4608}
            }])
        );
        // The runtime's own rate wins over the computed one.
        let mut with_rate = stat("c1", T0 + 14 * SEC, 3_000_000_000, 1);
        with_rate.cpu.as_mut().unwrap().usage_nano_cores = Some(cri::UInt64Value { value: 7 });
        let s = build_summary(
            "n1",
            &node(T0 + 14 * SEC, 0),
            &sandboxes,
            &containers,
            &[with_rate],
            &mut rates,
        );
        assert_eq!(
            s.pods[0].containers[0]
                .cpu
                .as_ref()
                .unwrap()
                .usage_nano_cores,
            Some(7)
        );
        // A container without stats is listed without numbers.
        assert!(s.pods[0].containers[1].cpu.is_none());
    }

    #[test]
    fn resource_metrics_render_prometheus_text_with_kubelets_names_and_labels() {
        let summary = Summary {
            node: NodeStats {
                node_name: "n1".into(),
                start_time: Time(T0),
                cpu: Some(CpuStats {
                    time: Time(T0 + 5 * SEC),
                    usage_nano_cores: Some(1),
                    usage_core_nano_seconds: Some(12_500_000_000),
                }),
                memory: Some(MemoryStats {
                    time: Time(T0 + 5 * SEC),
                    working_set_bytes: Some(1 << 30),
                    ..Default::default()
                }),
                fs: None,
            },
            pods: vec![PodStats {
                pod_ref: PodRef {
                    name: "web".into(),
                    namespace: "default".into(),
                    uid: "u".into(),
                },
                start_time: Time(T0),
                containers: vec![ContainerStats {
                    name: "a\"b".into(),
                    start_time: Time(T0 + SEC / 2),
                    cpu: Some(CpuStats {
                        time: Time(T0 + 5 * SEC),
                        usage_nano_cores: None,
                        usage_core_nano_seconds: Some(250_000_000),
                    }),
                    memory: Some(MemoryStats {
                        time: Time(T0 + 5 * SEC),
                        working_set_bytes: Some(4096),
                        ..Default::default()
                    }),
                }],
                cpu: Some(CpuStats {
                    time: Time(T0 + 5 * SEC),
                    usage_nano_cores: None,
                    usage_core_nano_seconds: Some(250_000_000),
                }),
                memory: Some(MemoryStats {
                    time: Time(T0 + 5 * SEC),
                    working_set_bytes: Some(4096),
                    ..Default::default()
                }),
                reservation: None,
            }],
        };
        let text = render_resource_metrics(&summary, false);
        let ms = (T0 + 5 * SEC) / 1_000_000;
        let samples: Vec<&str> = text.lines().filter(|l| !l.starts_with('#')).collect();
        assert_eq!(
            samples,
            [
                format!("container_cpu_usage_seconds_total{{container=\"a\\\"b\",namespace=\"default\",pod=\"web\"}} 0.25 {ms}"),
                format!("container_memory_working_set_bytes{{container=\"a\\\"b\",namespace=\"default\",pod=\"web\"}} 4096 {ms}"),
                "container_start_time_seconds{container=\"a\\\"b\",namespace=\"default\",pod=\"web\"} 1767225600.5".to_string(),
                format!("node_cpu_usage_seconds_total 12.5 {ms}"),
                format!("node_memory_working_set_bytes 1073741824 {ms}"),
                format!("pod_cpu_usage_seconds_total{{namespace=\"default\",pod=\"web\"}} 0.25 {ms}"),
                format!("pod_memory_working_set_bytes{{namespace=\"default\",pod=\"web\"}} 4096 {ms}"),
                "resource_scrape_error 0".to_string(),
                "scrape_error 0".to_string(),
            ]
        );
        assert!(text.contains("# TYPE container_cpu_usage_seconds_total counter\n"));
        assert!(text.contains("# TYPE node_memory_working_set_bytes gauge\n"));
        // Every family's HELP and TYPE come right before its samples.
        for name in [
            "container_cpu_usage_seconds_total",
            "pod_memory_working_set_bytes",
            "scrape_error",
        ] {
            let help = text.find(&format!("# HELP {name} ")).unwrap();
            let first = text.find(&format!("\n{name}")).unwrap();
            assert!(help < first, "{name}");
        }

        let failed = render_resource_metrics(
            &Summary {
                node: summary.node.clone(),
                pods: vec![],
            },
            true,
        );
        assert!(failed.contains("\nscrape_error 1\n"), "{failed}");
        assert!(
            failed.contains("\nnode_cpu_usage_seconds_total 12.5 "),
            "{failed}"
        );
        assert!(!failed.contains("container_"), "{failed}");
    }
}
