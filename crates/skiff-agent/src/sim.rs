//! The simulated runtime of hollow nodes: sandboxes and containers exist
//! only in memory. A container is running after a configurable delay; a
//! pod's annotations can make its containers exit after some seconds with a
//! given code (`skiff.io/simulate-run-seconds`, `skiff.io/simulate-exit-code`),
//! so Jobs complete and fail as on a real node.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use async_trait::async_trait;

use crate::runtime::{cri, Runtime};

pub const ANNOTATION_RUN_SECONDS: &str = "skiff.io/simulate-run-seconds";
pub const ANNOTATION_EXIT_CODE: &str = "skiff.io/simulate-exit-code";

struct SimSandbox {
    config: cri::PodSandboxConfig,
    ready: bool,
    created_at: i64,
    ip: String,
}

struct SimContainer {
    sandbox: String,
    config: cri::ContainerConfig,
    state: cri::ContainerState,
    created_at: i64,
    started_at: i64,
    finished_at: i64,
    exit_code: i32,
    run_for: Option<i64>,
    exit_with: i32,
}

/// An in-memory runtime.
pub struct Sim {
    sandboxes: Mutex<HashMap<String, SimSandbox>>,
    containers: Mutex<HashMap<String, SimContainer>>,
    next: AtomicU32,
    ip_base: [u8; 2],
    start_delay: Duration,
}

fn now_nanos() -> i64 {
    k8s_openapi::jiff::Timestamp::now().as_nanosecond() as i64
}

impl Sim {
    /// `index` spreads pod IPs of different hollow nodes apart.
    pub fn new(index: u32, start_delay: Duration) -> Sim {
        Sim {
            sandboxes: Mutex::new(HashMap::new()),
            containers: Mutex::new(HashMap::new()),
            next: AtomicU32::new(1),
            ip_base: [(128 + (index / 256) % 128) as u8, (index % 256) as u8],
            start_delay,
        }
    }

    fn id(&self) -> String {
        format!(
            "sim-{:08x}-{}",
            rand::random::<u32>(),
            self.next.fetch_add(1, Ordering::Relaxed)
        )
    }

    /// Applies the passage of time: containers whose run time is over exit.
    fn settle(c: &mut SimContainer) {
        if c.state == cri::ContainerState::ContainerRunning {
            if let Some(run) = c.run_for {
                let end = c.started_at + run * 1_000_000_000;
                if now_nanos() >= end {
                    c.state = cri::ContainerState::ContainerExited;
                    c.finished_at = end;
                    c.exit_code = c.exit_with;
                }
            }
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

#[async_trait]
impl Runtime for Sim {
    async fn version(&self) -> anyhow::Result<String> {
        Ok("simulated://1.0".into())
    }
    async fn image_present(&self, image: &str) -> anyhow::Result<Option<String>> {
        Ok(Some(format!("sha256:sim-{image}")))
    }
    async fn pull_image(&self, image: &str) -> anyhow::Result<String> {
        Ok(format!("sha256:sim-{image}"))
    }
    async fn run_sandbox(&self, config: &cri::PodSandboxConfig) -> anyhow::Result<String> {
        let id = self.id();
        let n = self.next.fetch_add(1, Ordering::Relaxed);
        let ip = format!(
            "10.{}.{}.{}",
            self.ip_base[0],
            (self.ip_base[1] as u32 + n / 254) % 256,
            n % 254 + 1
        );
        lock(&self.sandboxes).insert(
            id.clone(),
            SimSandbox {
                // Only what the listings and statuses return: the rest of
                // the config (DNS, Linux settings, log paths) is never read
                // back, and 150,000 hollow pods held it all.
                config: cri::PodSandboxConfig {
                    metadata: config.metadata.clone(),
                    labels: config.labels.clone(),
                    ..Default::default()
                },
                ready: true,
                created_at: now_nanos(),
                ip,
            },
        );
        Ok(id)
    }
    async fn sandbox_status(&self, id: &str) -> anyhow::Result<Option<cri::PodSandboxStatus>> {
        Ok(lock(&self.sandboxes)
            .get(id)
            .map(|s| cri::PodSandboxStatus {
                id: id.to_string(),
                metadata: s.config.metadata.clone(),
                state: if s.ready { 0 } else { 1 },
                created_at: s.created_at,
                network: Some(cri::PodSandboxNetworkStatus {
                    ip: s.ip.clone(),
                    ..Default::default()
                }),
                labels: s.config.labels.clone(),
                ..Default::default()
            }))
    }
    async fn stop_sandbox(&self, id: &str) -> anyhow::Result<()> {
        if let Some(s) = lock(&self.sandboxes).get_mut(id) {
            s.ready = false;
        }
        let now = now_nanos();
        for c in lock(&self.containers).values_mut() {
            if c.sandbox == id && c.state == cri::ContainerState::ContainerRunning {
                c.state = cri::ContainerState::ContainerExited;
                c.finished_at = now;
                c.exit_code = 137;
            }
        }
        Ok(())
    }
    async fn remove_sandbox(&self, id: &str) -> anyhow::Result<()> {
        lock(&self.sandboxes).remove(id);
        lock(&self.containers).retain(|_, c| c.sandbox != id);
        Ok(())
    }
    async fn list_sandboxes(&self, pod_uid: Option<&str>) -> anyhow::Result<Vec<cri::PodSandbox>> {
        Ok(lock(&self.sandboxes)
            .iter()
            .filter(|(_, s)| of_pod(&s.config.labels, pod_uid))
            .map(|(id, s)| cri::PodSandbox {
                id: id.clone(),
                metadata: s.config.metadata.clone(),
                state: if s.ready { 0 } else { 1 },
                created_at: s.created_at,
                labels: s.config.labels.clone(),
                ..Default::default()
            })
            .collect())
    }
    async fn create_container(
        &self,
        sandbox: &str,
        config: &cri::ContainerConfig,
        _sandbox_config: &cri::PodSandboxConfig,
    ) -> anyhow::Result<String> {
        if !lock(&self.sandboxes).contains_key(sandbox) {
            anyhow::bail!("sandbox {sandbox} not found");
        }
        let id = self.id();
        let run_for = config
            .annotations
            .get(ANNOTATION_RUN_SECONDS)
            .and_then(|v| v.parse::<i64>().ok());
        let exit_with = config
            .annotations
            .get(ANNOTATION_EXIT_CODE)
            .and_then(|v| v.parse::<i32>().ok())
            .unwrap_or(0);
        lock(&self.containers).insert(
            id.clone(),
            SimContainer {
                sandbox: sandbox.to_string(),
                // As for sandboxes: env, mounts, command and Linux settings
                // are never read back.
                config: cri::ContainerConfig {
                    metadata: config.metadata.clone(),
                    image: config.image.clone(),
                    labels: config.labels.clone(),
                    annotations: config.annotations.clone(),
                    ..Default::default()
                },
                state: cri::ContainerState::ContainerCreated,
                created_at: now_nanos(),
                started_at: 0,
                finished_at: 0,
                exit_code: 0,
                run_for,
                exit_with,
            },
        );
        Ok(id)
    }
    async fn start_container(&self, id: &str) -> anyhow::Result<()> {
        if !self.start_delay.is_zero() {
            tokio::time::sleep(self.start_delay).await;
        }
        let mut cs = lock(&self.containers);
        let c = cs
            .get_mut(id)
            .ok_or_else(|| anyhow::anyhow!("container {id} not found"))?;
        c.state = cri::ContainerState::ContainerRunning;
        c.started_at = now_nanos();
        Ok(())
    }
    async fn stop_container(&self, id: &str, _timeout_seconds: i64) -> anyhow::Result<()> {
        if let Some(c) = lock(&self.containers).get_mut(id) {
            Sim::settle(c);
            if c.state == cri::ContainerState::ContainerRunning {
                c.state = cri::ContainerState::ContainerExited;
                c.finished_at = now_nanos();
                c.exit_code = 143;
            }
        }
        Ok(())
    }
    async fn remove_container(&self, id: &str) -> anyhow::Result<()> {
        lock(&self.containers).remove(id);
        Ok(())
    }
    async fn list_containers(&self, pod_uid: Option<&str>) -> anyhow::Result<Vec<cri::Container>> {
        let mut cs = lock(&self.containers);
        Ok(cs
            .iter_mut()
            .filter(|(_, c)| of_pod(&c.config.labels, pod_uid))
            .map(|(id, c)| {
                Sim::settle(c);
                cri::Container {
                    id: id.clone(),
                    pod_sandbox_id: c.sandbox.clone(),
                    metadata: c.config.metadata.clone(),
                    image: c.config.image.clone(),
                    state: c.state as i32,
                    created_at: c.created_at,
                    labels: c.config.labels.clone(),
                    annotations: c.config.annotations.clone(),
                    ..Default::default()
                }
            })
            .collect())
    }
    async fn container_status(&self, id: &str) -> anyhow::Result<Option<cri::ContainerStatus>> {
        let mut cs = lock(&self.containers);
        Ok(cs.get_mut(id).map(|c| {
            Sim::settle(c);
            cri::ContainerStatus {
                id: id.to_string(),
                metadata: c.config.metadata.clone(),
                state: c.state as i32,
                created_at: c.created_at,
                started_at: c.started_at,
                finished_at: c.finished_at,
                exit_code: c.exit_code,
                image: c.config.image.clone(),
                image_ref: format!(
                    "sha256:sim-{}",
                    c.config
                        .image
                        .as_ref()
                        .map(|i| i.image.as_str())
                        .unwrap_or("")
                ),
                labels: c.config.labels.clone(),
                annotations: c.config.annotations.clone(),
                ..Default::default()
            }
        }))
    }
    async fn exec_sync(
        &self,
        _id: &str,
        _cmd: Vec<String>,
        _timeout: i64,
    ) -> anyhow::Result<(i32, Vec<u8>, Vec<u8>)> {
        Ok((0, vec![], vec![]))
    }
    async fn exec(&self, _req: cri::ExecRequest) -> anyhow::Result<String> {
        anyhow::bail!("hollow nodes have no containers to exec into")
    }
    async fn attach(&self, _req: cri::AttachRequest) -> anyhow::Result<String> {
        anyhow::bail!("hollow nodes have no containers to attach to")
    }
    async fn port_forward(&self, _sandbox: &str, _ports: Vec<i32>) -> anyhow::Result<String> {
        anyhow::bail!("hollow nodes have no ports to forward")
    }
    /// Simulated usage, so a hollow node's stats look like a quiet real
    /// one's: each running container uses one millicore (its cumulative CPU
    /// time grows by 1 ms per second it has run) and a fixed 8 MiB working
    /// set (10 MiB usage, 6 MiB RSS). Exited containers report nothing.
    async fn list_container_stats(
        &self,
        pod_uid: Option<&str>,
    ) -> anyhow::Result<Vec<cri::ContainerStats>> {
        const MIB: u64 = 1 << 20;
        let now = now_nanos();
        let mut cs = lock(&self.containers);
        Ok(cs
            .iter_mut()
            .filter(|(_, c)| of_pod(&c.config.labels, pod_uid))
            .filter_map(|(id, c)| {
                Sim::settle(c);
                if c.state != cri::ContainerState::ContainerRunning {
                    return None;
                }
                let value = |v: u64| Some(cri::UInt64Value { value: v });
                let ran = (now - c.started_at).max(0) as u64;
                Some(cri::ContainerStats {
                    attributes: Some(cri::ContainerAttributes {
                        id: id.clone(),
                        metadata: c.config.metadata.clone(),
                        labels: c.config.labels.clone(),
                        annotations: c.config.annotations.clone(),
                    }),
                    cpu: Some(cri::CpuUsage {
                        timestamp: now,
                        usage_core_nano_seconds: value(ran / 1000),
                        usage_nano_cores: value(1_000_000),
                    }),
                    memory: Some(cri::MemoryUsage {
                        timestamp: now,
                        working_set_bytes: value(8 * MIB),
                        available_bytes: None,
                        usage_bytes: value(10 * MIB),
                        rss_bytes: value(6 * MIB),
                        page_faults: value(0),
                        major_page_faults: value(0),
                    }),
                    ..Default::default()
                })
            })
            .collect())
    }
    async fn quiet_for(&self, pod_uid: &str) -> Option<Duration> {
        let now = now_nanos();
        let cs = lock(&self.containers);
        let next_exit = cs
            .values()
            .filter(|c| of_pod(&c.config.labels, Some(pod_uid)))
            .filter(|c| c.state == cri::ContainerState::ContainerRunning)
            .filter_map(|c| c.run_for.map(|run| c.started_at + run * 1_000_000_000))
            .min();
        Some(match next_exit {
            Some(end) => Duration::from_nanos((end - now).max(0) as u64),
            None => Duration::MAX,
        })
    }
    /// Simulated containers read nothing from the node.
    fn capabilities(&self) -> crate::runtime::Capabilities {
        crate::runtime::Capabilities {
            reads_pod_inputs: false,
            applies_resources: false,
        }
    }
}

/// Whether an object with these labels belongs to `pod_uid` (any pod when
/// `None`), as CRI's label selector on the pod-uid label answers.
fn of_pod(labels: &HashMap<String, String>, pod_uid: Option<&str>) -> bool {
    pod_uid.is_none_or(|u| {
        labels
            .get(crate::runtime::LABEL_POD_UID)
            .map(String::as_str)
            == Some(u)
    })
}
