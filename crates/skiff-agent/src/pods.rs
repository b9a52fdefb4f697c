//! Driving one pod to its spec, after kubelet's `SyncPod`. Each pod bound
//! to the node has a worker that, on every change of the pod and every few
//! seconds, observes what the runtime has for the pod (by the pod-uid
//! label, so an agent restart adopts what is running), runs the probes that
//! are due, asks [`plan::compute_pod_actions`] what to do (sandbox, init
//! containers in order, containers, restarts with back-off, kills by
//! probes, graceful termination), executes that, and writes the status
//! [`plan::pod_status`] computes when it changed. Deciding is pure; the
//! runtime, the host ([`Host`]), the clock ([`Clock`]) and the API are
//! touched only here.

pub mod plan;
pub mod resize;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Container, LifecycleHandler, Pod};
use kube::api::{Api, DeleteParams, Patch, PatchParams, Preconditions};
use serde_json::json;
use skiff_helpers::dependencies;

use crate::clock::Clock;
use crate::credentials;
use crate::host::Host;
use crate::inputs::{self, Fetcher};
use crate::probes::{self, Kind, ProbeState};
use crate::runtime::{cri, Runtime, ANNOTATION_SPEC_HASH};
use crate::spec::{self, name, namespace, uid};
use plan::{
    KillContainer, KillReason, Observed, PodActions, ProbeRecord, ResizeContainer, Role,
    SandboxAction, SandboxSeen, Seen, StartContainer, StatusInput, Step, SyncActions, Termination,
    Waiting,
};

/// What every pod worker of a node shares.
pub struct NodeContext {
    pub client: kube::Client,
    pub runtime: Arc<dyn Runtime>,
    pub node_name: String,
    pub host_ip: String,
    /// Pod directories (volumes) live under `<data>/pods/<uid>`, logs under
    /// `<data>/logs`.
    pub data_dir: PathBuf,
    pub allocatable: BTreeMap<String, f64>,
    /// Emit Events (off for hollow nodes at scale).
    pub events: bool,
    /// How often a pod is looked at without a change.
    pub resync: Duration,
    /// Cluster DNS settings for pods' resolv.conf.
    pub dns: crate::dns::ClusterDns,
    /// The Services whose variables containers get.
    pub services: crate::svcenv::Services,
    /// The node's filesystem and mounts.
    pub host: Arc<dyn Host>,
    /// The time of back-off, probes and grace periods.
    pub clock: Arc<dyn Clock>,
    /// The node's allocatable cpu and memory and what each pod holds of
    /// it: in-place resizes are decided against it.
    pub allocations: resize::Book,
    /// The cgroup batch pods' sandboxes are placed under (the agent made
    /// it idle), if any.
    pub batch_cgroup_parent: Option<String>,
}

impl NodeContext {
    pub fn logs_root(&self) -> PathBuf {
        self.data_dir.join("logs")
    }
    pub fn pod_dir(&self, uid: &str) -> PathBuf {
        self.data_dir.join("pods").join(uid)
    }

    /// Records a core/v1 Event about a pod, in the background.
    pub fn event(&self, pod: &Pod, type_: &str, reason: &str, message: String) {
        if !self.events {
            return;
        }
        let client = self.client.clone();
        let ns = namespace(pod).to_string();
        let now = k8s_openapi::jiff::Timestamp::now();
        let ev = json!({
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"generateName": format!("{}.", name(pod)), "namespace": ns},
            "involvedObject": {
                "apiVersion": "v1", "kind": "Pod", "name": name(pod), "namespace": ns,
                "uid": uid(pod), "resourceVersion": pod.metadata.resource_version,
            },
            "reason": reason,
            "message": message,
            "type": type_,
            "source": {"component": "kubelet", "host": self.node_name},
            "reportingComponent": "kubelet",
            "reportingInstance": self.node_name,
            "firstTimestamp": now.to_string(),
            "lastTimestamp": now.to_string(),
            "count": 1,
        });
        tokio::spawn(async move {
            let api: Api<k8s_openapi::api::core::v1::Event> = Api::namespaced(client, &ns);
            if let Ok(ev) = serde_json::from_value(ev) {
                let _ = api.create(&Default::default(), &ev).await;
            }
        });
    }
}

/// Why a sync of a pod failed; each is retried at the next sync.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("observing the pod's sandboxes and containers: {0:#}")]
    ObserveFailed(anyhow::Error),
    #[error("creating the pod's log directory {path:?}: {source}")]
    LogDirectoryFailed {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("reading the status of sandbox {id}: {error:#}")]
    SandboxStatusFailed { id: String, error: anyhow::Error },
    #[error("writing the pod's status: {0}")]
    WriteStatusFailed(#[source] kube::Error),
    #[error("deleting the terminated pod: {0}")]
    DeleteFailed(#[source] kube::Error),
}

/// Why a container could not be started. Each is the waiting reason its
/// status shows (kubelet's words) and is retried at a later sync; an image
/// pull failure after a pull back-off.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StartError {
    #[error("{0}")]
    ImageNeverPull(String),
    #[error("{0}")]
    ImagePull(String),
    #[error("{0}")]
    ImagePullBackOff(String),
    #[error("{0}")]
    Config(String),
    #[error("{0}")]
    Create(String),
    #[error("{0}")]
    Run(String),
}

impl StartError {
    /// The container's waiting reason.
    pub fn reason(&self) -> &'static str {
        match self {
            StartError::ImageNeverPull(_) => "ErrImageNeverPull",
            StartError::ImagePull(_) => "ErrImagePull",
            StartError::ImagePullBackOff(_) => "ImagePullBackOff",
            StartError::Config(_) => "CreateContainerConfigError",
            StartError::Create(_) => "CreateContainerError",
            StartError::Run(_) => "RunContainerError",
        }
    }

    /// The reason and message of the Warning event about it.
    fn event(&self) -> (&'static str, String) {
        match self {
            StartError::ImageNeverPull(m) => ("ErrImageNeverPull", m.clone()),
            StartError::ImagePull(m) => ("Failed", m.clone()),
            StartError::ImagePullBackOff(m) => ("BackOff", m.clone()),
            StartError::Config(m) | StartError::Create(m) | StartError::Run(m) => {
                ("Failed", format!("Error: {m}"))
            }
        }
    }

    fn pulling(&self) -> bool {
        matches!(
            self,
            StartError::ImagePull(_) | StartError::ImagePullBackOff(_)
        )
    }
}

/// What a sync prepared for containers that read from the node.
struct PodInputs {
    fetcher: Fetcher,
    volumes: std::collections::HashMap<String, PathBuf>,
}

/// The worker of one pod.
pub struct PodWorker {
    ctx: Arc<NodeContext>,
    memory: plan::Memory,
    /// A hash of the status last written (the status itself, as a JSON
    /// tree, was a few KB per pod kept only for this comparison).
    last_status: Option<u64>,
    /// The pod's ServiceAccount tokens (projected volumes).
    tokens: crate::satoken::TokenCache,
}

fn seen_of(c: &cri::Container, st: cri::ContainerStatus) -> Seen {
    let meta = st.metadata.unwrap_or_default();
    Seen {
        id: c.id.clone(),
        name: meta.name,
        attempt: meta.attempt,
        state: plan::State::from_cri(st.state),
        created_at: st.created_at,
        started_at: st.started_at,
        finished_at: st.finished_at,
        exit_code: st.exit_code,
        reason: st.reason,
        message: st.message,
        image_ref: st.image_ref,
        hash: c
            .annotations
            .get(ANNOTATION_SPEC_HASH)
            .cloned()
            .unwrap_or_default(),
    }
}

/// The pod's IP: its sandbox's, else the node's with host networking.
fn pod_ip(pod: &Pod, sandbox_ip: &str, host_ip: &str) -> String {
    let host_network = pod
        .spec
        .as_ref()
        .and_then(|s| s.host_network)
        .unwrap_or(false);
    if !sandbox_ip.is_empty() {
        sandbox_ip.to_string()
    } else if host_network {
        host_ip.to_string()
    } else {
        String::new()
    }
}

fn probe_name(kind: Kind) -> &'static str {
    match kind {
        Kind::Liveness => "Liveness",
        Kind::Readiness => "Readiness",
        Kind::Startup => "Startup",
    }
}

impl PodWorker {
    pub fn new(ctx: Arc<NodeContext>) -> PodWorker {
        PodWorker {
            ctx,
            memory: Default::default(),
            last_status: None,
            tokens: Default::default(),
        }
    }

    /// The node's order to evict the pod; the first one stands.
    pub fn order_eviction(&mut self, eviction: &plan::Eviction) {
        if self.memory.eviction.is_none() {
            self.memory.eviction = Some(eviction.clone());
        }
    }

    async fn observe_containers(&self, pod_uid: &str) -> Result<Vec<Seen>, Error> {
        let rt = &self.ctx.runtime;
        let listed = rt
            .list_containers(Some(pod_uid))
            .await
            .map_err(Error::ObserveFailed)?;
        let mut seen = Vec::with_capacity(listed.len());
        for c in listed {
            let st = rt
                .container_status(&c.id)
                .await
                .map_err(Error::ObserveFailed)?;
            if let Some(st) = st {
                seen.push(seen_of(&c, st));
            }
        }
        Ok(seen)
    }

    async fn observe(&self, pod_uid: &str) -> Result<Observed, Error> {
        let rt = &self.ctx.runtime;
        let sandboxes = rt
            .list_sandboxes(Some(pod_uid))
            .await
            .map_err(Error::ObserveFailed)?
            .into_iter()
            .map(|sb| SandboxSeen {
                ready: sb.state == cri::PodSandboxState::SandboxReady as i32,
                created_at: sb.created_at,
                attempt: sb.metadata.as_ref().map(|m| m.attempt).unwrap_or(0),
                id: sb.id,
            })
            .collect();
        let mut observed = Observed {
            sandboxes,
            containers: self.observe_containers(pod_uid).await?,
            sandbox_ip: None,
        };
        if let Some(id) = observed.ready_sandbox().map(|s| s.id.clone()) {
            observed.sandbox_ip = Some(self.sandbox_ip(&id).await?);
        }
        Ok(observed)
    }

    async fn sandbox_ip(&self, id: &str) -> Result<String, Error> {
        let status = self.ctx.runtime.sandbox_status(id).await.map_err(|error| {
            Error::SandboxStatusFailed {
                id: id.to_string(),
                error,
            }
        })?;
        Ok(status
            .and_then(|s| s.network)
            .map(|n| n.ip)
            .unwrap_or_default())
    }

    /// Tears down everything the runtime has for a pod that is gone from the
    /// API: containers, sandboxes, the pod's directory.
    pub async fn cleanup(&self, pod_uid: &str) {
        self.ctx.allocations.remove(pod_uid);
        let rt = &self.ctx.runtime;
        if let Ok(cs) = rt.list_containers(Some(pod_uid)).await {
            for c in cs {
                let _ = rt.stop_container(&c.id, 0).await;
                let _ = rt.remove_container(&c.id).await;
            }
        }
        if let Ok(sbs) = rt.list_sandboxes(Some(pod_uid)).await {
            for s in sbs {
                let _ = rt.stop_sandbox(&s.id).await;
                let _ = rt.remove_sandbox(&s.id).await;
            }
        }
        if rt.capabilities().reads_pod_inputs {
            let dir = self.ctx.pod_dir(pod_uid);
            self.ctx.host.unmount_all(&dir);
            if let Err(e) = self.ctx.host.remove_dir_all(&dir) {
                tracing::warn!(dir = %dir.display(), error = %e, "removing a pod's directory failed");
            }
        }
    }

    /// One pass over the pod; returns when to look again.
    pub async fn sync(&mut self, pod: &Pod) -> Duration {
        match self.sync_pod(pod).await {
            Ok(d) => d,
            Err(e) => {
                tracing::warn!(pod = %format!("{}/{}", namespace(pod), name(pod)), error = %e, "syncing pod failed");
                Duration::from_secs(2)
            }
        }
    }

    async fn sync_pod(&mut self, pod: &Pod) -> Result<Duration, Error> {
        let deleting = pod.metadata.deletion_timestamp.is_some();
        let observed = match self.observe(uid(pod)).await {
            Ok(o) => o,
            // A pod being deleted is deleted even when the runtime does not
            // answer; what it had is swept up later.
            Err(e) if deleting => {
                tracing::debug!(error = %e, "terminating a pod the runtime does not list");
                Observed::default()
            }
            Err(e) => return Err(e),
        };
        self.memory.probes.retain(|(id, _), _| {
            observed
                .containers
                .iter()
                .any(|s| s.running() && &s.id == id)
        });
        // The node runs the pod as allocated: a resize that is not
        // admitted leaves its containers as they are.
        let allocated = self.allocate(pod);
        let pod = allocated.as_ref();
        resize::adopt(&mut self.memory.resize, pod, &observed.containers);
        let probed = self.run_probes(pod, &observed).await;
        let now = self.ctx.clock.now();
        let caps = self.ctx.runtime.capabilities();
        match plan::compute_pod_actions(pod, &observed, now, &self.memory, caps) {
            PodActions::Terminate(t) => {
                self.memory.terminating = true;
                self.terminate(pod, &t).await;
                if let Err(e) = self.delete(pod).await {
                    self.memory.terminating = false;
                    return Err(e);
                }
                Ok(Duration::from_secs(1))
            }
            PodActions::AwaitDeletion => Ok(Duration::from_secs(1)),
            PodActions::StopFinished {
                containers,
                sandboxes,
            } => {
                for id in containers {
                    let _ = self.ctx.runtime.stop_container(&id, 0).await;
                }
                for id in sandboxes {
                    let _ = self.ctx.runtime.stop_sandbox(&id).await;
                }
                Ok(Duration::from_secs(30))
            }
            PodActions::Evict {
                termination,
                initialized,
            } => {
                self.evict(pod, observed, &termination, initialized).await?;
                Ok(Duration::from_secs(1))
            }
            PodActions::Sync(actions) => self.execute(pod, observed, actions, probed).await,
        }
    }

    /// Kubelet's eviction: the Warning Event first, then the pod killed
    /// with the eviction's grace period, then its final status (Failed,
    /// `Evicted`, `DisruptionTarget`). Repeated until the status is
    /// written; a second pass finds nothing running and writes it again.
    async fn evict(
        &mut self,
        pod: &Pod,
        observed: Observed,
        termination: &Termination,
        initialized: bool,
    ) -> Result<(), Error> {
        let Some(eviction) = self.memory.eviction.clone() else {
            return Ok(());
        };
        if !self.memory.eviction_announced {
            self.memory.eviction_announced = true;
            tracing::info!(pod = %format!("{}/{}", namespace(pod), name(pod)), message = %eviction.message, "evicting pod");
            self.ctx
                .event(pod, "Warning", plan::EVICTED, eviction.message.clone());
        }
        self.terminate(pod, termination).await;
        let containers = if termination.containers.is_empty() {
            observed.containers
        } else {
            self.observe_containers(uid(pod)).await?
        };
        let ip = pod_ip(
            pod,
            observed.sandbox_ip.as_deref().unwrap_or_default(),
            &self.ctx.host_ip,
        );
        let ip = (!ip.is_empty()).then_some(ip);
        self.write_status(pod, ip.as_deref(), &containers, initialized)
            .await
    }

    /// Every container of the pod waits for the same reason.
    fn wait_all(&mut self, pod: &Pod, message: &str) {
        let Some(spec) = pod.spec.as_ref() else {
            return;
        };
        for c in spec
            .containers
            .iter()
            .chain(spec.init_containers.iter().flatten())
        {
            self.memory
                .waiting
                .insert(c.name.clone(), Waiting::new("ContainerCreating", message));
        }
    }

    async fn execute(
        &mut self,
        pod: &Pod,
        observed: Observed,
        actions: SyncActions,
        probed: bool,
    ) -> Result<Duration, Error> {
        let rt = self.ctx.runtime.clone();
        let logs_root = self.ctx.logs_root();
        let (sandbox_id, sandbox_cfg, sandbox_ip) = match &actions.sandbox {
            SandboxAction::Keep { id, attempt } => (
                id.clone(),
                spec::sandbox_config(
                    pod,
                    *attempt,
                    &logs_root,
                    &self.ctx.dns,
                    self.ctx.batch_cgroup_parent.as_deref(),
                ),
                observed.sandbox_ip.clone().unwrap_or_default(),
            ),
            SandboxAction::Create {
                attempt,
                remove_containers,
                remove_sandboxes,
            } => {
                for id in remove_containers {
                    let _ = rt.remove_container(id).await;
                }
                for id in remove_sandboxes {
                    let _ = rt.stop_sandbox(id).await;
                    let _ = rt.remove_sandbox(id).await;
                }
                let cfg = spec::sandbox_config(
                    pod,
                    *attempt,
                    &logs_root,
                    &self.ctx.dns,
                    self.ctx.batch_cgroup_parent.as_deref(),
                );
                if actions.prepare_inputs {
                    let path = PathBuf::from(&cfg.log_directory);
                    self.ctx
                        .host
                        .create_dir_all(&path)
                        .map_err(|source| Error::LogDirectoryFailed { path, source })?;
                }
                match rt.run_sandbox(&cfg).await {
                    Ok(id) => {
                        let ip = self.sandbox_ip(&id).await?;
                        (id, cfg, ip)
                    }
                    Err(e) => {
                        let msg = format!("Failed to create pod sandbox: {e}");
                        self.ctx
                            .event(pod, "Warning", "FailedCreatePodSandBox", msg.clone());
                        self.wait_all(pod, &msg);
                        self.write_status(pod, None, &[], false).await?;
                        return Ok(Duration::from_secs(5));
                    }
                }
            }
        };
        let pod_ip = pod_ip(pod, &sandbox_ip, &self.ctx.host_ip);
        for (name, w) in &actions.waiting {
            self.memory.waiting.insert(name.clone(), w.clone());
        }
        let mut inputs = if actions.prepare_inputs {
            let mut fetcher =
                Fetcher::with_tokens(self.ctx.client.clone(), std::mem::take(&mut self.tokens));
            fetcher.node = self.ctx.node_name.clone();
            let prepared = inputs::prepare_volumes(
                &mut fetcher,
                self.ctx.host.as_ref(),
                pod,
                &self.ctx.pod_dir(uid(pod)).join("volumes"),
                &self.ctx.host_ip,
                &pod_ip,
            )
            .await;
            self.tokens = std::mem::take(&mut fetcher.tokens);
            match prepared {
                Ok(volumes) => Some(PodInputs { fetcher, volumes }),
                Err(msg) => {
                    self.ctx.event(pod, "Warning", "FailedMount", msg.clone());
                    self.wait_all(pod, &msg);
                    self.write_status(pod, Some(&pod_ip), &observed.containers, true)
                        .await?;
                    return Ok(Duration::from_secs(3));
                }
            }
        } else {
            None
        };
        for step in &actions.steps {
            match step {
                Step::Start(start) => {
                    if let Some(b) = start.backoff {
                        self.memory.backoff.insert(start.container.name.clone(), b);
                    }
                    self.start(
                        pod,
                        start,
                        (sandbox_id.as_str(), &sandbox_cfg),
                        &pod_ip,
                        inputs.as_mut(),
                    )
                    .await;
                }
                Step::StartCreated { id, .. } => {
                    let _ = rt.start_container(id).await;
                }
                Step::Kill(kill) => self.kill(pod, kill).await,
                Step::Resize(r) => self.resize(pod, r).await,
            }
        }
        let acted = actions.acts() || probed;
        let containers = if acted {
            self.observe_containers(uid(pod)).await?
        } else {
            observed.containers
        };
        for id in plan::dead_to_remove(&containers) {
            let _ = rt.remove_container(&id).await;
        }
        self.write_status(pod, Some(&pod_ip), &containers, actions.initialized)
            .await?;
        if acted {
            return Ok(Duration::from_millis(500));
        }
        let quiet = rt.quiet_for(uid(pod)).await;
        let spec = pod.spec.clone().unwrap_or_default();
        Ok(plan::idle_wait(&spec, self.ctx.resync, quiet))
    }

    /// Runs the probes that are due and records their results; returns
    /// whether a verdict changed.
    async fn run_probes(&mut self, pod: &Pod, observed: &Observed) -> bool {
        let now = self.ctx.clock.now();
        let due = plan::due_probes(pod, observed, now, &self.memory);
        if due.is_empty() {
            return false;
        }
        let ip = pod_ip(
            pod,
            observed.sandbox_ip.as_deref().unwrap_or_default(),
            &self.ctx.host_ip,
        );
        let mut changed = false;
        for d in due {
            let Some(c) = pod
                .spec
                .as_ref()
                .and_then(|s| s.containers.iter().find(|c| c.name == d.container))
            else {
                continue;
            };
            let Some(probe) = probes::probe_of(c, d.kind) else {
                continue;
            };
            let key = (d.container_id.clone(), d.kind);
            self.memory
                .probes
                .entry(key.clone())
                .or_insert_with(|| ProbeRecord {
                    state: ProbeState::new(),
                    started: d.started,
                })
                .state
                .last_run = Some(now.at);
            let (ok, msg) =
                probes::run(self.ctx.runtime.as_ref(), &d.container_id, c, probe, &ip).await;
            if !ok {
                self.ctx.event(
                    pod,
                    "Warning",
                    "Unhealthy",
                    format!("{} probe failed: {msg}", probe_name(d.kind)),
                );
            }
            if let Some(record) = self.memory.probes.get_mut(&key) {
                let before = record.state.ok;
                record.state.record(probe, ok, msg);
                changed |= before != record.state.ok;
            }
        }
        changed
    }

    async fn kill(&mut self, pod: &Pod, kill: &KillContainer) {
        self.ctx
            .event(pod, "Normal", "Killing", kill.reason.message(&kill.name));
        let _ = self
            .ctx
            .runtime
            .stop_container(&kill.id, kill.grace_seconds)
            .await;
        match kill.reason {
            // A new spec (or size) starts without the old one's back-off.
            KillReason::SpecChanged | KillReason::ResizeRestart => {
                self.memory.backoff.remove(&kill.name);
            }
            KillReason::LivenessFailed | KillReason::StartupFailed => {
                self.memory.probes.retain(|(id, _), _| id != &kill.id);
            }
        }
    }

    /// Decides a pending resize (kubelet's `handlePodResourcesResize`):
    /// the desired resources are allocated if the pod's requests with them
    /// fit the node beside the other pods' allocations, else the resize is
    /// `Infeasible` or `Deferred` (tried again at every sync). Returns the
    /// pod as allocated.
    fn allocate<'a>(&mut self, pod: &'a Pod) -> std::borrow::Cow<'a, Pod> {
        let book = &self.ctx.allocations;
        let st = &mut self.memory.resize;
        let alloc = st.allocated.get_or_insert_with(|| resize::restore(pod));
        let gone = pod.metadata.deletion_timestamp.is_some() || resize::finished(pod);
        let want = resize::desired(pod);
        if gone || resize::same_allocation(&want, alloc) {
            st.pending = None;
        } else if book.ready() {
            let others = book.others(uid(pod));
            match resize::admit(&resize::requests(pod, &want), &book.allocatable, &others) {
                Ok(()) => {
                    *alloc = want;
                    st.pending = None;
                    st.error = None;
                }
                Err(p) => {
                    if st.pending.as_ref() != Some(&p) {
                        let type_ = if p.reason == "Infeasible" {
                            "ResizeInfeasible"
                        } else {
                            "ResizeDeferred"
                        };
                        self.ctx.event(
                            pod,
                            "Warning",
                            type_,
                            format!("Pod resize {}: {}", p.reason, p.message),
                        );
                    }
                    st.pending = Some(p);
                }
            }
        }
        if resize::finished(pod) {
            book.remove(uid(pod));
        } else {
            book.set(uid(pod), resize::requests(pod, alloc));
        }
        resize::with_allocation(pod, alloc)
    }

    /// Gives a running container its allocated cpu and memory in place; a
    /// failure is the `PodResizeInProgress` condition's `Error`, retried at
    /// the next sync.
    async fn resize(&mut self, pod: &Pod, r: &ResizeContainer) {
        let applied = match &r.linux {
            Some(linux) => {
                self.ctx
                    .runtime
                    .update_container_resources(&r.id, linux)
                    .await
            }
            None => Ok(()),
        };
        match applied {
            Ok(()) => {
                self.memory
                    .resize
                    .actual
                    .insert(r.id.clone(), r.resources.clone());
                self.memory.resize.error = None;
            }
            Err(e) => {
                let msg = format!("resizing container {}: {e:#}", r.name);
                self.ctx.event(pod, "Warning", "ResizeError", msg.clone());
                self.memory.resize.error = Some(msg);
            }
        }
    }

    /// Deletes the terminated pod object for good (grace 0, for this uid
    /// only); it may be gone already.
    async fn delete(&self, pod: &Pod) -> Result<(), Error> {
        let api: Api<Pod> = Api::namespaced(self.ctx.client.clone(), namespace(pod));
        let dp = DeleteParams {
            grace_period_seconds: Some(0),
            preconditions: Some(Preconditions {
                uid: Some(uid(pod).to_string()),
                resource_version: None,
            }),
            ..Default::default()
        };
        match api.delete(name(pod), &dp).await {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(e)) if e.code == 404 || e.code == 409 => Ok(()),
            Err(e) => Err(Error::DeleteFailed(e)),
        }
    }

    /// Starts a container; a failure becomes its waiting reason.
    async fn start(
        &mut self,
        pod: &Pod,
        start: &StartContainer,
        sandbox: (&str, &cri::PodSandboxConfig),
        pod_ip: &str,
        inputs: Option<&mut PodInputs>,
    ) {
        let c = &start.container;
        match self
            .create_and_start(pod, start, sandbox, pod_ip, inputs)
            .await
        {
            Ok(id) => {
                self.memory.waiting.remove(&c.name);
                self.memory.pull_backoff.remove(&c.name);
                // Created as allocated.
                self.memory
                    .resize
                    .actual
                    .insert(id.clone(), resize::cpu_memory(c.resources.as_ref()));
                if let Some(h) = c.lifecycle.as_ref().and_then(|l| l.post_start.as_ref()) {
                    let (ok, msg) = self.run_hook(&id, c, h, pod_ip, 30).await;
                    if !ok {
                        self.ctx.event(pod, "Warning", "FailedPostStartHook", msg);
                        let _ = self.ctx.runtime.stop_container(&id, 2).await;
                    }
                }
            }
            Err(e) => {
                let (reason, message) = e.event();
                self.ctx.event(pod, "Warning", reason, message);
                if e.pulling() {
                    let until = self.ctx.clock.now().at + plan::PULL_BACKOFF;
                    self.memory.pull_backoff.insert(c.name.clone(), until);
                }
                self.memory
                    .waiting
                    .insert(c.name.clone(), Waiting::new(e.reason(), e.to_string()));
            }
        }
    }

    /// Pulls (if needed), creates and starts a container; its id.
    async fn create_and_start(
        &mut self,
        pod: &Pod,
        start: &StartContainer,
        (sandbox_id, sandbox_cfg): (&str, &cri::PodSandboxConfig),
        pod_ip: &str,
        mut inputs: Option<&mut PodInputs>,
    ) -> Result<String, StartError> {
        let rt = self.ctx.runtime.clone();
        let c = &start.container;
        let image = c.image.clone().unwrap_or_default();
        self.ensure_image(pod, c, &image, inputs.as_deref_mut())
            .await?;
        let (env, mounts) = match inputs {
            Some(inputs) => {
                let env = self.environment(pod, c, pod_ip, inputs).await?;
                let mounts = inputs::mounts(c, &inputs.volumes).map_err(StartError::Config)?;
                (env, mounts)
            }
            // Containers that read nothing from the node get nothing.
            None => (vec![], vec![]),
        };
        let cfg = spec::container_config(
            pod,
            c,
            spec::ContainerInputs {
                env,
                mounts,
                image: &image,
                attempt: start.attempt,
                init: start.role == Role::Init,
                spec_hash: spec::spec_hash(c),
                pid_target: start.pid_target.clone(),
            },
        );
        let id = rt
            .create_container(sandbox_id, &cfg, sandbox_cfg)
            .await
            .map_err(|e| StartError::Create(e.to_string()))?;
        self.ctx.event(
            pod,
            "Normal",
            "Created",
            format!("Created container {}", c.name),
        );
        rt.start_container(&id)
            .await
            .map_err(|e| StartError::Run(e.to_string()))?;
        self.ctx.event(
            pod,
            "Normal",
            "Started",
            format!("Started container {}", c.name),
        );
        Ok(id)
    }

    /// Makes the container's image present as its pull policy says.
    async fn ensure_image(
        &self,
        pod: &Pod,
        c: &Container,
        image: &str,
        inputs: Option<&mut PodInputs>,
    ) -> Result<(), StartError> {
        let rt = self.ctx.runtime.clone();
        let policy = c.image_pull_policy.as_deref().unwrap_or("IfNotPresent");
        let present = rt.image_present(image).await.ok().flatten();
        if present.is_some() && policy != "Always" {
            self.ctx.event(
                pod,
                "Normal",
                "Pulled",
                format!("Container image \"{image}\" already present on machine"),
            );
            return Ok(());
        }
        if policy == "Never" {
            return Err(StartError::ImageNeverPull(format!(
                "Container image \"{image}\" is not present with pull policy of Never"
            )));
        }
        let keyring = match inputs {
            Some(inputs) => self.pull_keyring(pod, &mut inputs.fetcher).await,
            None => Ok(credentials::Keyring::default()),
        };
        let pulled = match keyring {
            Ok(keyring) => {
                self.ctx.event(
                    pod,
                    "Normal",
                    "Pulling",
                    format!("Pulling image \"{image}\""),
                );
                keyring
                    .pull(image, |auth| rt.pull_image_auth(image, auth))
                    .await
            }
            Err(e) => Err(anyhow::anyhow!("{e}")),
        };
        match pulled {
            Ok(_) => {
                self.ctx.event(
                    pod,
                    "Normal",
                    "Pulled",
                    format!("Successfully pulled image \"{image}\""),
                );
                Ok(())
            }
            Err(e) if present.is_some() && policy == "Always" => {
                // No registry reachable, but the image is here: a pull
                // failure with a local copy is reported and tolerated.
                tracing::debug!(%image, error = %e, "pull failed; using the local image");
                Ok(())
            }
            Err(e) => {
                let again = matches!(
                    self.memory.waiting.get(&c.name).map(|w| w.reason.as_str()),
                    Some("ErrImagePull" | "ImagePullBackOff")
                );
                Err(if again {
                    StartError::ImagePullBackOff(format!("Back-off pulling image \"{image}\": {e}"))
                } else if e.to_string().starts_with("failed to pull") {
                    // containerd's message names the image already.
                    StartError::ImagePull(e.to_string())
                } else {
                    StartError::ImagePull(format!(
                        "failed to pull and unpack image \"{image}\": {e}"
                    ))
                })
            }
        }
    }

    /// The container's environment: its own variables, then the Service
    /// variables and those of its declared dependencies.
    async fn environment(
        &self,
        pod: &Pod,
        c: &Container,
        pod_ip: &str,
        inputs: &mut PodInputs,
    ) -> Result<Vec<(String, String)>, StartError> {
        let links = pod
            .spec
            .as_ref()
            .and_then(|s| s.enable_service_links)
            .unwrap_or(true);
        let mut services = self
            .ctx
            .services
            .variables(namespace(pod), links, Duration::from_secs(10))
            .await
            .map_err(StartError::Config)?;
        // The declared dependencies' `SKIFF_DEP_*`, beside the Service
        // variables (the container's own variables still win).
        if let Some(deps) =
            dependencies::declared(pod.metadata.annotations.as_ref(), namespace(pod))
        {
            services.extend(
                self.ctx
                    .services
                    .dependency_variables(&deps, &self.ctx.dns.domain),
            );
        }
        inputs::container_env(
            &mut inputs.fetcher,
            pod,
            c,
            &self.ctx.host_ip,
            pod_ip,
            &self.ctx.allocatable,
            &services,
        )
        .await
        .map_err(StartError::Config)
    }

    /// The registry credentials of the pod's `imagePullSecrets`, as
    /// kubelet reads them: a secret that cannot be read is skipped with a
    /// `FailedToRetrieveImagePullSecret` warning (the pull goes on without
    /// it); a pull secret whose docker config does not parse fails the pull.
    async fn pull_keyring(
        &self,
        pod: &Pod,
        fetcher: &mut Fetcher,
    ) -> Result<credentials::Keyring, String> {
        let mut keyring = credentials::Keyring::default();
        let refs = pod
            .spec
            .as_ref()
            .and_then(|s| s.image_pull_secrets.as_ref())
            .map(|r| r.as_slice())
            .unwrap_or_default();
        let ns = namespace(pod);
        let mut failed = Vec::new();
        for r in refs {
            if r.name.is_empty() {
                continue;
            }
            let secret = match fetcher.secret(ns, &r.name).await {
                Ok(Some(s)) => s,
                Ok(None) | Err(_) => {
                    failed.push(r.name.clone());
                    continue;
                }
            };
            let data: BTreeMap<String, Vec<u8>> = secret
                .data
                .unwrap_or_default()
                .into_iter()
                .map(|(k, v)| (k, v.0))
                .collect();
            let type_ = secret.type_.unwrap_or_default();
            if let Some(cfg) = credentials::config_of_secret(&type_, &data)? {
                keyring.add(&cfg);
            }
        }
        if !failed.is_empty() {
            self.ctx.event(
                pod,
                "Warning",
                "FailedToRetrieveImagePullSecret",
                format!(
                    "Unable to retrieve some image pull secrets ({}); attempting to pull the image may not succeed.",
                    failed.join(", ")
                ),
            );
        }
        Ok(keyring)
    }

    async fn run_hook(
        &self,
        id: &str,
        c: &Container,
        h: &LifecycleHandler,
        pod_ip: &str,
        timeout: i64,
    ) -> (bool, String) {
        if let Some(sl) = &h.sleep {
            tokio::time::sleep(Duration::from_secs(sl.seconds.max(0) as u64)).await;
            return (true, String::new());
        }
        let probe = k8s_openapi::api::core::v1::Probe {
            exec: h.exec.clone(),
            http_get: h.http_get.clone(),
            tcp_socket: h.tcp_socket.clone(),
            timeout_seconds: Some(timeout as i32),
            ..Default::default()
        };
        probes::run(self.ctx.runtime.as_ref(), id, c, &probe, pod_ip).await
    }

    /// Whole seconds until `deadline` on the worker's clock, rounded up.
    fn seconds_left(&self, deadline: Instant) -> i64 {
        whole_seconds_up(deadline.saturating_duration_since(self.ctx.clock.now().at))
    }

    /// Graceful termination: preStop hooks, then SIGTERM with what is left
    /// of the grace period, then SIGKILL (the runtime's stop with a
    /// timeout), all containers at once; then the sandboxes.
    async fn terminate(&self, pod: &Pod, t: &Termination) {
        let deadline = self.ctx.clock.now().at + Duration::from_secs(t.grace_seconds as u64);
        let ip = match t.sandboxes.first() {
            Some(id) => self.sandbox_ip(id).await.unwrap_or_default(),
            None => String::new(),
        };
        let mut stops = vec![];
        for stop in &t.containers {
            self.ctx.event(
                pod,
                "Normal",
                "Killing",
                format!("Stopping container {}", stop.name),
            );
            let ip = ip.as_str();
            stops.push(async move {
                if let (Some(c), Some(h)) = (&stop.container, stop.pre_stop()) {
                    let left = self.seconds_left(deadline).max(1);
                    let _ = tokio::time::timeout(
                        Duration::from_secs(left as u64),
                        self.run_hook(&stop.id, c, h, ip, left),
                    )
                    .await;
                }
                // What is left of the grace period, rounded up, and never
                // under kubelet's minimal shutdown window.
                let left = self.seconds_left(deadline);
                let _ = self
                    .ctx
                    .runtime
                    .stop_container(&stop.id, left.max(plan::MIN_STOP_SECONDS))
                    .await;
            });
        }
        futures::future::join_all(stops).await;
        for id in &t.sandboxes {
            let _ = self.ctx.runtime.stop_sandbox(id).await;
        }
    }

    async fn write_status(
        &mut self,
        pod: &Pod,
        pod_ip: Option<&str>,
        containers: &[Seen],
        initialized: bool,
    ) -> Result<(), Error> {
        let status = plan::pod_status(
            pod,
            &self.memory,
            StatusInput {
                host_ip: &self.ctx.host_ip,
                pod_ip,
                containers,
                initialized,
                now: self.ctx.clock.now(),
            },
        );
        // What the agent decides, without the conditions other components
        // own (carried over from the pod as last seen): their changes alone
        // are no reason to write.
        let digest = {
            use std::hash::{Hash, Hasher};
            let mut own = status.clone();
            if let Some(cs) = own.get_mut("conditions").and_then(|c| c.as_array_mut()) {
                cs.retain(|c| {
                    let t = c["type"].as_str().unwrap_or("");
                    plan::KUBELET_CONDITIONS.contains(&t) || t == "DisruptionTarget"
                });
            }
            let mut h = std::collections::hash_map::DefaultHasher::new();
            own.to_string().hash(&mut h);
            h.finish()
        };
        if self.last_status == Some(digest) {
            return Ok(());
        }
        let api: Api<Pod> = Api::namespaced(self.ctx.client.clone(), namespace(pod));
        let patch = json!({ "status": status });
        match api
            .patch_status(name(pod), &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            Ok(_) => {
                self.last_status = Some(digest);
                Ok(())
            }
            Err(kube::Error::Api(e)) if e.code == 404 => Ok(()),
            Err(e) => Err(Error::WriteStatusFailed(e)),
        }
    }
}

fn whole_seconds_up(d: Duration) -> i64 {
    d.as_millis().div_ceil(1000) as i64
}

#[cfg(test)]
mod grace_tests {
    use super::*;

    #[test]
    fn what_is_left_of_a_grace_period_rounds_up_to_whole_seconds() {
        assert_eq!(whole_seconds_up(Duration::from_millis(0)), 0);
        assert_eq!(whole_seconds_up(Duration::from_millis(1)), 1);
        assert_eq!(whole_seconds_up(Duration::from_millis(1900)), 2);
        assert_eq!(whole_seconds_up(Duration::from_millis(3000)), 3);
    }
}

#[cfg(test)]
mod tests {
    //! The executor against the simulated runtime, a recording host, a
    //! fake API server and a clock the tests move.

    use super::*;
    use crate::clock::ManualClock;
    use crate::host::fake::{Call, RecordingHost};
    use crate::runtime::Capabilities;
    use crate::sim::Sim;
    use async_trait::async_trait;
    use http_body_util::BodyExt;
    use serde_json::Value;
    use std::sync::atomic::{AtomicI32, Ordering};
    use std::sync::Mutex;

    /// The simulated runtime, with the capabilities and exec results a
    /// test asks for.
    struct Fake {
        sim: Sim,
        caps: Capabilities,
        exec_exit: AtomicI32,
    }

    #[async_trait]
    impl Runtime for Fake {
        async fn version(&self) -> anyhow::Result<String> {
            self.sim.version().await
        }
        async fn image_present(&self, image: &str) -> anyhow::Result<Option<String>> {
            self.sim.image_present(image).await
        }
        async fn pull_image(&self, image: &str) -> anyhow::Result<String> {
            self.sim.pull_image(image).await
        }
        async fn run_sandbox(&self, config: &cri::PodSandboxConfig) -> anyhow::Result<String> {
            self.sim.run_sandbox(config).await
        }
        async fn sandbox_status(&self, id: &str) -> anyhow::Result<Option<cri::PodSandboxStatus>> {
            self.sim.sandbox_status(id).await
        }
        async fn stop_sandbox(&self, id: &str) -> anyhow::Result<()> {
            self.sim.stop_sandbox(id).await
        }
        async fn remove_sandbox(&self, id: &str) -> anyhow::Result<()> {
            self.sim.remove_sandbox(id).await
        }
        async fn list_sandboxes(&self, uid: Option<&str>) -> anyhow::Result<Vec<cri::PodSandbox>> {
            self.sim.list_sandboxes(uid).await
        }
        async fn create_container(
            &self,
            sandbox: &str,
            config: &cri::ContainerConfig,
            sandbox_config: &cri::PodSandboxConfig,
        ) -> anyhow::Result<String> {
            self.sim
                .create_container(sandbox, config, sandbox_config)
                .await
        }
        async fn start_container(&self, id: &str) -> anyhow::Result<()> {
            self.sim.start_container(id).await
        }
        async fn stop_container(&self, id: &str, timeout: i64) -> anyhow::Result<()> {
            self.sim.stop_container(id, timeout).await
        }
        async fn remove_container(&self, id: &str) -> anyhow::Result<()> {
            self.sim.remove_container(id).await
        }
        async fn list_containers(&self, uid: Option<&str>) -> anyhow::Result<Vec<cri::Container>> {
            self.sim.list_containers(uid).await
        }
        async fn container_status(&self, id: &str) -> anyhow::Result<Option<cri::ContainerStatus>> {
            self.sim.container_status(id).await
        }
        async fn exec_sync(
            &self,
            _id: &str,
            _cmd: Vec<String>,
            _timeout: i64,
        ) -> anyhow::Result<(i32, Vec<u8>, Vec<u8>)> {
            Ok((self.exec_exit.load(Ordering::Relaxed), vec![], vec![]))
        }
        async fn exec(&self, req: cri::ExecRequest) -> anyhow::Result<String> {
            self.sim.exec(req).await
        }
        async fn attach(&self, req: cri::AttachRequest) -> anyhow::Result<String> {
            self.sim.attach(req).await
        }
        async fn port_forward(&self, sandbox: &str, ports: Vec<i32>) -> anyhow::Result<String> {
            self.sim.port_forward(sandbox, ports).await
        }
        async fn list_container_stats(
            &self,
            uid: Option<&str>,
        ) -> anyhow::Result<Vec<cri::ContainerStats>> {
            self.sim.list_container_stats(uid).await
        }
        fn capabilities(&self) -> Capabilities {
            self.caps
        }
    }

    /// What the fake API server was asked: method, path and body.
    type Requests = Arc<Mutex<Vec<(String, String, Value)>>>;

    /// An API server that answers every request with `pod`.
    fn fake_api(pod: &Pod) -> (kube::Client, Requests) {
        let requests = Requests::default();
        let seen = requests.clone();
        let reply = serde_json::to_vec(pod).unwrap();
        let svc = tower::service_fn(move |req: http::Request<kube::client::Body>| {
            let seen = seen.clone();
            let reply = reply.clone();
            async move {
                let method = req.method().to_string();
                let path = req.uri().path().to_string();
                let body = req.into_body().collect().await?.to_bytes();
                let body = serde_json::from_slice(&body).unwrap_or(Value::Null);
                seen.lock().unwrap().push((method, path, body));
                Ok::<_, kube::Error>(
                    http::Response::builder()
                        .header("content-type", "application/json")
                        .body(kube::client::Body::from(reply))
                        .unwrap(),
                )
            }
        });
        (kube::Client::new(svc, "default"), requests)
    }

    struct Node {
        ctx: Arc<NodeContext>,
        clock: Arc<ManualClock>,
        runtime: Arc<Fake>,
        host: Arc<RecordingHost>,
        requests: Requests,
    }

    fn node(pod: &Pod, reads_pod_inputs: bool) -> Node {
        let (client, requests) = fake_api(pod);
        let runtime = Arc::new(Fake {
            sim: Sim::new(0, Duration::ZERO),
            caps: Capabilities {
                reads_pod_inputs,
                applies_resources: reads_pod_inputs,
            },
            exec_exit: AtomicI32::new(0),
        });
        let host = Arc::new(RecordingHost::default());
        // The wall time where the simulated runtime's is; it moves only
        // when a test says.
        let clock = Arc::new(ManualClock::starting_at(
            k8s_openapi::jiff::Timestamp::now().as_nanosecond() as i64,
        ));
        let ctx = Arc::new(NodeContext {
            client,
            runtime: runtime.clone(),
            node_name: "n1".into(),
            host_ip: "192.0.2.10".into(),
            data_dir: PathBuf::from("/nonexistent/skiff-test"),
            allocatable: BTreeMap::new(),
            events: false,
            resync: Duration::from_secs(10),
            dns: Default::default(),
            services: crate::svcenv::Services::fixed(Default::default()),
            host: host.clone(),
            clock: clock.clone(),
            allocations: resize::Book::new(4000, 8 << 30),
            batch_cgroup_parent: None,
        });
        Node {
            ctx,
            clock,
            runtime,
            host,
            requests,
        }
    }

    impl Node {
        /// The statuses written, oldest first.
        fn statuses(&self) -> Vec<Value> {
            self.requests
                .lock()
                .unwrap()
                .iter()
                .filter(|(m, p, _)| m == "PATCH" && p.ends_with("/status"))
                .map(|(_, _, b)| b["status"].clone())
                .collect()
        }
        /// (attempt, running) of the pod's containers of this name.
        async fn instances(&self, name: &str) -> Vec<(u32, bool)> {
            let mut out = vec![];
            for c in self.runtime.list_containers(None).await.unwrap() {
                let st = self.runtime.container_status(&c.id).await.unwrap().unwrap();
                let meta = st.metadata.unwrap();
                if meta.name == name {
                    out.push((
                        meta.attempt,
                        st.state == cri::ContainerState::ContainerRunning as i32,
                    ));
                }
            }
            out.sort();
            out
        }
    }

    fn pod(v: Value) -> Pod {
        serde_json::from_value(v).unwrap()
    }

    fn app_pod() -> Pod {
        pod(json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "web", "namespace": "shop", "uid": "u-1"},
            "spec": {"containers": [{"name": "app", "image": "busybox"}]},
        }))
    }

    #[tokio::test]
    async fn a_new_pod_runs_and_its_status_says_so() {
        let p = app_pod();
        let n = node(&p, false);
        let mut w = PodWorker::new(n.ctx.clone());
        assert_eq!(w.sync(&p).await, Duration::from_millis(500));
        assert_eq!(n.instances("app").await, [(0, true)]);
        let st = n.statuses().pop().expect("a status was written");
        assert_eq!(st["phase"], "Running");
        assert!(st["podIP"].as_str().unwrap().starts_with("10."));
        assert_eq!(st["containerStatuses"][0]["ready"], true);
        // Nothing changed: no second write, and the resync paces it.
        assert_eq!(w.sync(&p).await, Duration::from_secs(10));
        assert_eq!(n.statuses().len(), 1);
        // Hollow containers read nothing from the node.
        assert_eq!(n.host.calls(), []);
    }

    #[tokio::test]
    async fn a_crashing_container_is_restarted_after_its_back_off() {
        let mut p = app_pod();
        p.metadata.annotations = Some(
            [
                (
                    crate::sim::ANNOTATION_RUN_SECONDS.to_string(),
                    "0".to_string(),
                ),
                (
                    crate::sim::ANNOTATION_EXIT_CODE.to_string(),
                    "1".to_string(),
                ),
            ]
            .into(),
        );
        let n = node(&p, false);
        let mut w = PodWorker::new(n.ctx.clone());
        w.sync(&p).await; // started, exits at once
        w.sync(&p).await; // restarted at once: back-off 10 s
        assert_eq!(n.instances("app").await, [(0, false), (1, false)]);
        w.sync(&p).await;
        assert_eq!(n.instances("app").await.len(), 2);
        let st = n.statuses().pop().unwrap();
        assert_eq!(
            st["containerStatuses"][0]["state"]["waiting"]["reason"],
            "CrashLoopBackOff"
        );
        n.clock.advance(Duration::from_secs(9));
        w.sync(&p).await;
        assert_eq!(n.instances("app").await.len(), 2);
        n.clock.advance(Duration::from_secs(1));
        w.sync(&p).await;
        // The oldest instance is collected; current and previous stay.
        assert_eq!(n.instances("app").await, [(1, false), (2, false)]);
        // Now 20 s.
        n.clock.advance(Duration::from_secs(19));
        w.sync(&p).await;
        assert_eq!(n.instances("app").await.last(), Some(&(2, false)));
        n.clock.advance(Duration::from_secs(1));
        w.sync(&p).await;
        assert_eq!(n.instances("app").await.last(), Some(&(3, false)));
    }

    #[tokio::test]
    async fn a_failing_liveness_probe_restarts_the_container() {
        let p = pod(json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "web", "namespace": "shop", "uid": "u-1"},
            "spec": {"containers": [{"name": "app", "image": "busybox", "livenessProbe": {
                "exec": {"command": ["check"]}, "periodSeconds": 1, "failureThreshold": 2,
            }}]},
        }));
        let n = node(&p, false);
        let mut w = PodWorker::new(n.ctx.clone());
        w.sync(&p).await;
        // Probing every second; passing: nothing happens.
        w.sync(&p).await;
        n.clock.advance(Duration::from_secs(1));
        w.sync(&p).await;
        assert_eq!(n.instances("app").await, [(0, true)]);
        n.runtime.exec_exit.store(1, Ordering::Relaxed);
        n.clock.advance(Duration::from_secs(1));
        w.sync(&p).await; // one failure of two
        assert_eq!(n.instances("app").await, [(0, true)]);
        n.clock.advance(Duration::from_secs(1));
        w.sync(&p).await; // killed
        assert_eq!(n.instances("app").await, [(0, false)]);
        w.sync(&p).await; // restarted by restartPolicy Always
        assert_eq!(n.instances("app").await, [(0, false), (1, true)]);
        let st = n.statuses().pop().unwrap();
        assert_eq!(st["containerStatuses"][0]["restartCount"], 1);
    }

    #[tokio::test]
    async fn a_deleted_pod_is_stopped_then_deleted_once_for_its_uid_only() {
        let p = app_pod();
        let n = node(&p, false);
        let mut w = PodWorker::new(n.ctx.clone());
        w.sync(&p).await;
        let mut gone = p.clone();
        gone.metadata.deletion_timestamp =
            Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                k8s_openapi::jiff::Timestamp::now(),
            ));
        gone.metadata.deletion_grace_period_seconds = Some(30);
        assert_eq!(w.sync(&gone).await, Duration::from_secs(1));
        assert_eq!(n.instances("app").await, [(0, false)]);
        let sandboxes = n.runtime.list_sandboxes(None).await.unwrap();
        assert!(sandboxes
            .iter()
            .all(|s| s.state == cri::PodSandboxState::SandboxNotready as i32));
        w.sync(&gone).await;
        let deletes: Vec<Value> = n
            .requests
            .lock()
            .unwrap()
            .iter()
            .filter(|(m, p, _)| m == "DELETE" && p.ends_with("/namespaces/shop/pods/web"))
            .map(|(_, _, b)| b.clone())
            .collect();
        assert_eq!(deletes.len(), 1);
        assert_eq!(deletes[0]["gracePeriodSeconds"], 0);
        assert_eq!(deletes[0]["preconditions"]["uid"], "u-1");
    }

    #[tokio::test]
    async fn a_runtime_whose_containers_read_the_node_gets_log_directory_and_memory_volume_through_the_host(
    ) {
        let p = pod(json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "web", "namespace": "shop", "uid": "u-1"},
            "spec": {
                "containers": [{"name": "app", "image": "busybox",
                    "volumeMounts": [{"name": "cache", "mountPath": "/cache"}]}],
                "volumes": [{"name": "cache", "emptyDir": {"medium": "Memory", "sizeLimit": "1Mi"}}],
            },
        }));
        let n = node(&p, true);
        let mut w = PodWorker::new(n.ctx.clone());
        w.sync(&p).await;
        let pod_dir = PathBuf::from("/nonexistent/skiff-test/pods/u-1");
        let volume = pod_dir.join("volumes/cache");
        assert_eq!(
            n.host.calls(),
            [
                Call::CreateDir(PathBuf::from("/nonexistent/skiff-test/logs/shop_web_u-1")),
                Call::CreateDir(volume.clone()),
                Call::MountTmpfs(volume.clone(), Some(1 << 20)),
            ]
        );
        assert_eq!(n.instances("app").await, [(0, true)]);
        // A second sync finds the tmpfs mounted and leaves it.
        w.sync(&p).await;
        assert_eq!(
            n.host
                .calls()
                .iter()
                .filter(|c| matches!(c, Call::MountTmpfs(..)))
                .count(),
            1
        );
        w.cleanup("u-1").await;
        let calls = n.host.calls();
        assert_eq!(
            calls[calls.len() - 2..],
            [Call::Unmount(volume), Call::RemoveDir(pod_dir)]
        );
        assert_eq!(n.instances("app").await, []);
    }

    fn sized_pod(policy: Value, resources: Value) -> Pod {
        pod(json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "web", "namespace": "shop", "uid": "u-1"},
            "spec": {"containers": [{"name": "app", "image": "busybox",
                "resizePolicy": policy, "resources": resources}]},
        }))
    }

    fn condition(st: &Value, type_: &str) -> Option<Value> {
        st["conditions"]
            .as_array()?
            .iter()
            .find(|c| c["type"] == type_)
            .cloned()
    }

    #[tokio::test]
    async fn a_resize_that_fits_is_applied_in_place_and_one_beyond_the_node_waits() {
        let before = json!({"requests": {"cpu": "100m", "memory": "32Mi"},
                            "limits": {"cpu": "200m", "memory": "64Mi"}});
        let p = sized_pod(json!([]), before);
        let n = node(&p, false);
        n.ctx.allocations.set_ready();
        let mut w = PodWorker::new(n.ctx.clone());
        w.sync(&p).await;
        let st = n.statuses().pop().unwrap();
        assert_eq!(
            st["containerStatuses"][0]["resources"]["limits"]["cpu"],
            "200m"
        );
        assert_eq!(
            st["containerStatuses"][0]["allocatedResources"]["cpu"],
            "100m"
        );

        let bigger = sized_pod(
            json!([]),
            json!({"requests": {"cpu": "300m", "memory": "32Mi"},
                   "limits": {"cpu": "1", "memory": "128Mi"}}),
        );
        w.sync(&bigger).await; // admitted and applied
        w.sync(&bigger).await;
        let st = n.statuses().pop().unwrap();
        let cs = &st["containerStatuses"][0];
        assert_eq!(cs["resources"]["limits"]["cpu"], "1");
        assert_eq!(cs["resources"]["limits"]["memory"], "128Mi");
        assert_eq!(cs["allocatedResources"]["cpu"], "300m");
        assert_eq!(cs["restartCount"], 0);
        assert!(condition(&st, "PodResizeInProgress").is_none(), "{st}");
        assert!(condition(&st, "PodResizePending").is_none(), "{st}");
        assert_eq!(n.instances("app").await, [(0, true)], "no restart");

        // 5 cpus on a 4-cpu node: Infeasible, the allocation stays.
        let huge = sized_pod(
            json!([]),
            json!({"requests": {"cpu": "5", "memory": "32Mi"},
                   "limits": {"cpu": "5", "memory": "128Mi"}}),
        );
        w.sync(&huge).await;
        let st = n.statuses().pop().unwrap();
        let pending = condition(&st, "PodResizePending").expect("pending");
        assert_eq!(pending["reason"], "Infeasible");
        assert_eq!(
            pending["message"],
            "Node didn't have enough capacity: cpu, requested: 5000, capacity: 4000"
        );
        assert_eq!(
            st["containerStatuses"][0]["allocatedResources"]["cpu"],
            "300m"
        );
        assert_eq!(
            st["containerStatuses"][0]["resources"]["limits"]["cpu"],
            "1"
        );
        assert_eq!(n.ctx.allocations.others("someone-else").milli_cpu, 300);

        // Another pod takes most of the node: 2 cpus are Deferred, and
        // admitted once it is gone.
        n.ctx.allocations.set(
            "u-2",
            skiff_helpers::resources::Resource {
                milli_cpu: 3000,
                ..Default::default()
            },
        );
        let two = sized_pod(
            json!([]),
            json!({"requests": {"cpu": "2", "memory": "32Mi"},
                   "limits": {"cpu": "2", "memory": "128Mi"}}),
        );
        w.sync(&two).await;
        let st = n.statuses().pop().unwrap();
        let pending = condition(&st, "PodResizePending").expect("pending");
        assert_eq!(pending["reason"], "Deferred");
        assert_eq!(
            pending["message"],
            "Node didn't have enough resource: cpu, requested: 2000, used: 3000, capacity: 4000"
        );
        n.ctx.allocations.remove("u-2");
        w.sync(&two).await;
        w.sync(&two).await;
        let st = n.statuses().pop().unwrap();
        assert!(condition(&st, "PodResizePending").is_none(), "{st}");
        assert_eq!(
            st["containerStatuses"][0]["resources"]["limits"]["cpu"],
            "2"
        );
        assert_eq!(n.instances("app").await, [(0, true)]);
    }

    #[tokio::test]
    async fn a_restart_container_policy_restarts_the_container_with_its_new_size() {
        let policy = json!([{"resourceName": "memory", "restartPolicy": "RestartContainer"}]);
        let p = sized_pod(
            policy.clone(),
            json!({"requests": {"memory": "32Mi"}, "limits": {"memory": "64Mi"}}),
        );
        let n = node(&p, false);
        n.ctx.allocations.set_ready();
        let mut w = PodWorker::new(n.ctx.clone());
        w.sync(&p).await;
        let resized = sized_pod(
            policy,
            json!({"requests": {"memory": "32Mi"}, "limits": {"memory": "48Mi"}}),
        );
        w.sync(&resized).await; // killed for the resize
        assert_eq!(n.instances("app").await, [(0, false)]);
        w.sync(&resized).await; // started again, as allocated
        assert_eq!(n.instances("app").await, [(0, false), (1, true)]);
        w.sync(&resized).await;
        let st = n.statuses().pop().unwrap();
        let cs = &st["containerStatuses"][0];
        assert_eq!(cs["restartCount"], 1);
        assert_eq!(cs["resources"]["limits"]["memory"], "48Mi");
        assert!(condition(&st, "PodResizeInProgress").is_none(), "{st}");
    }

    #[tokio::test]
    async fn no_resize_is_decided_before_the_nodes_pods_are_all_known() {
        let p = sized_pod(json!([]), json!({"limits": {"cpu": "200m"}}));
        let n = node(&p, false);
        let mut w = PodWorker::new(n.ctx.clone());
        w.sync(&p).await;
        let bigger = sized_pod(json!([]), json!({"limits": {"cpu": "400m"}}));
        w.sync(&bigger).await;
        let st = n.statuses().pop().unwrap();
        assert_eq!(
            st["containerStatuses"][0]["resources"]["limits"]["cpu"],
            "200m"
        );
        assert!(condition(&st, "PodResizePending").is_none());
        n.ctx.allocations.set_ready();
        w.sync(&bigger).await;
        w.sync(&bigger).await;
        let st = n.statuses().pop().unwrap();
        assert_eq!(
            st["containerStatuses"][0]["resources"]["limits"]["cpu"],
            "400m"
        );
    }

    #[tokio::test]
    async fn cleaning_up_a_simulated_pod_leaves_the_host_alone() {
        let p = app_pod();
        let n = node(&p, false);
        let mut w = PodWorker::new(n.ctx.clone());
        w.sync(&p).await;
        w.cleanup("u-1").await;
        assert_eq!(n.instances("app").await, []);
        assert!(n.runtime.list_sandboxes(None).await.unwrap().is_empty());
        assert_eq!(n.host.calls(), []);
    }
}
