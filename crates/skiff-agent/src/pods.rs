//! Driving one pod to its spec. Each pod bound to the node has a worker
//! that, on every change of the pod and every few seconds, observes what the
//! runtime has for the pod (by the pod-uid label, so an agent restart adopts
//! what is running), acts (sandbox, init containers in order, containers,
//! restarts with back-off, probes, graceful termination) and writes the
//! pod's status when it changed.

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Container, LifecycleHandler, Pod};
use kube::api::{Api, DeleteParams, Patch, PatchParams, Preconditions};
use serde_json::{json, Value};

use crate::credentials;
use crate::inputs::{self, Fetcher};
use crate::probes::{self, Kind, ProbeState};
use crate::runtime::{cri, Runtime, ANNOTATION_SPEC_HASH};
use crate::spec::{self, name, namespace, uid};

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

/// Restart back-off of one container name.
#[derive(Debug, Clone)]
struct Backoff {
    delay: Duration,
    restarted_at: Instant,
}

const BACKOFF_START: Duration = Duration::from_secs(10);
const BACKOFF_MAX: Duration = Duration::from_secs(300);
const BACKOFF_RESET_AFTER: i64 = 600;

/// A container of the pod as the runtime reports it.
#[derive(Debug, Clone)]
struct Seen {
    id: String,
    name: String,
    attempt: u32,
    state: i32,
    created_at: i64,
    started_at: i64,
    finished_at: i64,
    exit_code: i32,
    reason: String,
    message: String,
    image_ref: String,
    hash: String,
}

fn is_running(s: &Seen) -> bool {
    s.state == cri::ContainerState::ContainerRunning as i32
}
fn is_exited(s: &Seen) -> bool {
    s.state == cri::ContainerState::ContainerExited as i32
        || s.state == cri::ContainerState::ContainerUnknown as i32
}

fn rfc3339(nanos: i64) -> String {
    k8s_openapi::jiff::Timestamp::from_nanosecond(nanos as i128)
        .map(|t| {
            t.round(k8s_openapi::jiff::Unit::Second)
                .unwrap_or(t)
                .to_string()
        })
        .unwrap_or_default()
}

fn now_rfc3339() -> String {
    let t = k8s_openapi::jiff::Timestamp::now();
    t.round(k8s_openapi::jiff::Unit::Second)
        .unwrap_or(t)
        .to_string()
}

/// The worker of one pod.
pub struct PodWorker {
    ctx: Arc<NodeContext>,
    backoff: HashMap<String, Backoff>,
    probes: HashMap<(String, &'static str), (ProbeState, Instant)>,
    /// Why a container could not be started (reason, message).
    waiting: HashMap<String, (String, String)>,
    pull_backoff: HashMap<String, Instant>,
    /// A hash of the status last written (the status itself, as a JSON
    /// tree, was a few KB per pod kept only for this comparison).
    last_status: Option<u64>,
    terminating: bool,
    /// The pod's ServiceAccount tokens (projected volumes).
    tokens: crate::satoken::TokenCache,
}

fn kind_key(k: Kind) -> &'static str {
    match k {
        Kind::Liveness => "liveness",
        Kind::Readiness => "readiness",
        Kind::Startup => "startup",
    }
}

impl PodWorker {
    pub fn new(ctx: Arc<NodeContext>) -> PodWorker {
        PodWorker {
            ctx,
            backoff: HashMap::new(),
            probes: HashMap::new(),
            waiting: HashMap::new(),
            pull_backoff: HashMap::new(),
            last_status: None,
            terminating: false,
            tokens: Default::default(),
        }
    }

    async fn observe(&self, pod_uid: &str) -> anyhow::Result<(Vec<cri::PodSandbox>, Vec<Seen>)> {
        let rt = &self.ctx.runtime;
        let sandboxes = rt.list_sandboxes(Some(pod_uid)).await?;
        let listed = rt.list_containers(Some(pod_uid)).await?;
        let mut seen = Vec::with_capacity(listed.len());
        for c in listed {
            let Some(st) = rt.container_status(&c.id).await? else {
                continue;
            };
            let meta = st.metadata.clone().unwrap_or_default();
            seen.push(Seen {
                id: c.id.clone(),
                name: meta.name,
                attempt: meta.attempt,
                state: st.state,
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
            });
            let _ = &c.pod_sandbox_id;
        }
        Ok((sandboxes, seen))
    }

    /// Tears down everything the runtime has for a pod that is gone from the
    /// API: containers, sandboxes, the pod's directory.
    pub async fn cleanup(&self, pod_uid: &str) {
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
        if rt.is_real() {
            let dir = self.ctx.pod_dir(pod_uid);
            inputs::unmount_all(&dir);
            let _ = std::fs::remove_dir_all(&dir);
        }
    }

    /// One pass over the pod; returns when to look again.
    pub async fn sync(&mut self, pod: &Pod) -> Duration {
        match self.sync_inner(pod).await {
            Ok(d) => d,
            Err(e) => {
                tracing::warn!(pod = %format!("{}/{}", namespace(pod), name(pod)), error = %e, "syncing pod failed");
                Duration::from_secs(2)
            }
        }
    }

    async fn sync_inner(&mut self, pod: &Pod) -> anyhow::Result<Duration> {
        let pod_uid = uid(pod).to_string();
        let spec = pod.spec.clone().unwrap_or_default();
        if pod.metadata.deletion_timestamp.is_some() {
            if !self.terminating {
                self.terminating = true;
                self.terminate(pod).await;
                let api: Api<Pod> = Api::namespaced(self.ctx.client.clone(), namespace(pod));
                let dp = DeleteParams {
                    grace_period_seconds: Some(0),
                    preconditions: Some(Preconditions {
                        uid: Some(pod_uid.clone()),
                        resource_version: None,
                    }),
                    ..Default::default()
                };
                match api.delete(name(pod), &dp).await {
                    Ok(_) => {}
                    Err(kube::Error::Api(e)) if e.code == 404 || e.code == 409 => {}
                    Err(e) => {
                        self.terminating = false;
                        return Err(e.into());
                    }
                }
            }
            return Ok(Duration::from_secs(1));
        }
        let phase = pod
            .status
            .as_ref()
            .and_then(|s| s.phase.clone())
            .unwrap_or_default();
        let (sandboxes, seen) = self.observe(&pod_uid).await?;
        if phase == "Succeeded" || phase == "Failed" {
            // A finished pod keeps its status; its sandbox is stopped.
            for s in &seen {
                if is_running(s) {
                    let _ = self.ctx.runtime.stop_container(&s.id, 0).await;
                }
            }
            for sb in &sandboxes {
                if sb.state == cri::PodSandboxState::SandboxReady as i32 {
                    let _ = self.ctx.runtime.stop_sandbox(&sb.id).await;
                }
            }
            return Ok(Duration::from_secs(30));
        }

        // The sandbox.
        let ready = sandboxes
            .iter()
            .filter(|s| s.state == cri::PodSandboxState::SandboxReady as i32)
            .max_by_key(|s| s.created_at)
            .cloned();
        let logs_root = self.ctx.logs_root();
        let (sandbox_id, sandbox_cfg) = match ready {
            Some(sb) => {
                let attempt = sb.metadata.as_ref().map(|m| m.attempt).unwrap_or(0);
                (
                    sb.id.clone(),
                    spec::sandbox_config(pod, attempt, &logs_root, &self.ctx.dns),
                )
            }
            None => {
                // A sandbox that died takes its containers with it.
                for s in &seen {
                    let _ = self.ctx.runtime.remove_container(&s.id).await;
                }
                for sb in &sandboxes {
                    let _ = self.ctx.runtime.stop_sandbox(&sb.id).await;
                    let _ = self.ctx.runtime.remove_sandbox(&sb.id).await;
                }
                let cfg =
                    spec::sandbox_config(pod, sandboxes.len() as u32, &logs_root, &self.ctx.dns);
                if self.ctx.runtime.is_real() {
                    std::fs::create_dir_all(&cfg.log_directory)?;
                }
                match self.ctx.runtime.run_sandbox(&cfg).await {
                    Ok(id) => (id, cfg),
                    Err(e) => {
                        let msg = format!("Failed to create pod sandbox: {e}");
                        self.ctx
                            .event(pod, "Warning", "FailedCreatePodSandBox", msg.clone());
                        for c in spec
                            .containers
                            .iter()
                            .chain(spec.init_containers.iter().flatten())
                        {
                            self.waiting
                                .insert(c.name.clone(), ("ContainerCreating".into(), msg.clone()));
                        }
                        self.write_status(pod, None, &[], false).await?;
                        return Ok(Duration::from_secs(5));
                    }
                }
            }
        };
        let sb_status = self.ctx.runtime.sandbox_status(&sandbox_id).await?;
        let pod_ip = sb_status
            .as_ref()
            .and_then(|s| s.network.as_ref())
            .map(|n| n.ip.clone())
            .filter(|ip| !ip.is_empty())
            .unwrap_or_else(|| {
                if spec.host_network.unwrap_or(false) {
                    self.ctx.host_ip.clone()
                } else {
                    String::new()
                }
            });
        let seen: Vec<Seen> = seen;
        let mut fetcher =
            Fetcher::with_tokens(self.ctx.client.clone(), std::mem::take(&mut self.tokens));
        fetcher.node = self.ctx.node_name.clone();
        let volumes = if self.ctx.runtime.is_real() {
            let prepared = inputs::prepare_volumes(
                &mut fetcher,
                pod,
                &self.ctx.pod_dir(&pod_uid).join("volumes"),
                &self.ctx.host_ip,
                &pod_ip,
            )
            .await;
            self.tokens = std::mem::take(&mut fetcher.tokens);
            match prepared {
                Ok(v) => v,
                Err(msg) => {
                    self.ctx.event(pod, "Warning", "FailedMount", msg.clone());
                    for c in spec
                        .containers
                        .iter()
                        .chain(spec.init_containers.iter().flatten())
                    {
                        self.waiting
                            .insert(c.name.clone(), ("ContainerCreating".into(), msg.clone()));
                    }
                    self.write_status(pod, Some(&pod_ip), &seen, true).await?;
                    return Ok(Duration::from_secs(3));
                }
            }
        } else {
            HashMap::new()
        };
        let restart_policy = spec
            .restart_policy
            .clone()
            .unwrap_or_else(|| "Always".into());
        let mut acted = false;

        // Init containers, in order.
        let mut initialized = true;
        for ic in spec.init_containers.iter().flatten() {
            let latest = latest(&seen, &ic.name);
            match latest {
                None => {
                    self.start(
                        pod,
                        ic,
                        0,
                        true,
                        &sandbox_id,
                        &sandbox_cfg,
                        &volumes,
                        &pod_ip,
                        &mut fetcher,
                        None,
                    )
                    .await;
                    acted = true;
                    initialized = false;
                    break;
                }
                Some(s) if is_exited(s) && s.exit_code == 0 => continue,
                Some(s) if is_exited(s) => {
                    initialized = false;
                    if restart_policy != "Never" && self.may_restart(&ic.name, s) {
                        self.start(
                            pod,
                            ic,
                            s.attempt + 1,
                            true,
                            &sandbox_id,
                            &sandbox_cfg,
                            &volumes,
                            &pod_ip,
                            &mut fetcher,
                            None,
                        )
                        .await;
                        acted = true;
                    }
                    break;
                }
                Some(s) if s.state == cri::ContainerState::ContainerCreated as i32 => {
                    let _ = self.ctx.runtime.start_container(&s.id).await;
                    acted = true;
                    initialized = false;
                    break;
                }
                Some(_) => {
                    initialized = false;
                    break;
                }
            }
        }

        // Containers.
        if initialized {
            for c in &spec.containers {
                match latest(&seen, &c.name) {
                    None => {
                        if self.waiting_on_pull(&c.name) {
                            continue;
                        }
                        self.start(
                            pod,
                            c,
                            0,
                            false,
                            &sandbox_id,
                            &sandbox_cfg,
                            &volumes,
                            &pod_ip,
                            &mut fetcher,
                            None,
                        )
                        .await;
                        acted = true;
                    }
                    Some(s) if s.state == cri::ContainerState::ContainerCreated as i32 => {
                        let _ = self.ctx.runtime.start_container(&s.id).await;
                        acted = true;
                    }
                    Some(s)
                        if is_running(s) && !s.hash.is_empty() && s.hash != spec::spec_hash(c) =>
                    {
                        // The spec changed (an image update): replace it.
                        self.ctx.event(
                            pod,
                            "Normal",
                            "Killing",
                            format!("Container {} definition changed, will be restarted", c.name),
                        );
                        let grace = spec.termination_grace_period_seconds.unwrap_or(30);
                        let _ = self
                            .ctx
                            .runtime
                            .stop_container(&s.id, grace.max(MIN_STOP_SECONDS))
                            .await;
                        self.backoff.remove(&c.name);
                        acted = true;
                    }
                    Some(s) if is_running(s) => {
                        let s = s.clone();
                        if self.check_probes(pod, c, &s, &pod_ip).await {
                            acted = true;
                        }
                    }
                    Some(s) => {
                        let restart = match restart_policy.as_str() {
                            "Never" => false,
                            "OnFailure" => s.exit_code != 0,
                            _ => true,
                        };
                        if restart && self.may_restart(&c.name, s) {
                            let next = s.attempt + 1;
                            self.start(
                                pod,
                                c,
                                next,
                                false,
                                &sandbox_id,
                                &sandbox_cfg,
                                &volumes,
                                &pod_ip,
                                &mut fetcher,
                                None,
                            )
                            .await;
                            acted = true;
                        }
                    }
                }
            }
        }

        // Ephemeral containers: each started once, even before the pod is
        // initialized (as kubelet does), and never restarted. One with a
        // `targetContainerName` waits until that container runs, to join
        // its PID namespace.
        for ec in spec.ephemeral_containers.iter().flatten() {
            match latest(&seen, &ec.name) {
                None => {
                    if self.waiting_on_pull(&ec.name) {
                        continue;
                    }
                    let target = match ec.target_container_name.as_deref() {
                        None | Some("") => None,
                        Some(t) => match latest(&seen, t).filter(|s| is_running(s)) {
                            Some(s) => Some(s.id.clone()),
                            None => {
                                self.waiting.insert(
                                    ec.name.clone(),
                                    (
                                        "CreateContainerConfigError".into(),
                                        format!("unable to find target container {t}"),
                                    ),
                                );
                                continue;
                            }
                        },
                    };
                    let c = spec::ephemeral_as_container(ec);
                    self.start(
                        pod,
                        &c,
                        0,
                        false,
                        &sandbox_id,
                        &sandbox_cfg,
                        &volumes,
                        &pod_ip,
                        &mut fetcher,
                        target,
                    )
                    .await;
                    acted = true;
                }
                Some(s) if s.state == cri::ContainerState::ContainerCreated as i32 => {
                    let _ = self.ctx.runtime.start_container(&s.id).await;
                    acted = true;
                }
                Some(_) => {}
            }
        }

        let seen = if acted {
            self.observe(&pod_uid).await?.1
        } else {
            seen
        };
        self.gc_dead(&seen).await;
        self.write_status(pod, Some(&pod_ip), &seen, initialized)
            .await?;
        Ok(if acted {
            Duration::from_millis(500)
        } else {
            self.idle_wait(&spec, &pod_uid).await
        })
    }

    /// How long a pod with nothing to do waits before it is looked at
    /// again (a watch event wakes it sooner). A runtime that can say when
    /// the pod's containers will next change (the simulated one) is
    /// believed, so hollow nodes wake only for events and scheduled exits;
    /// probes are due at least every second; otherwise `resync`.
    async fn idle_wait(
        &self,
        spec: &k8s_openapi::api::core::v1::PodSpec,
        pod_uid: &str,
    ) -> Duration {
        let probed = spec.containers.iter().any(|c| {
            c.liveness_probe.is_some() || c.readiness_probe.is_some() || c.startup_probe.is_some()
        });
        let idle = if probed {
            self.ctx.resync.min(Duration::from_secs(1))
        } else {
            self.ctx.resync
        };
        match self.ctx.runtime.quiet_for(pod_uid).await {
            // A little after the change, so the change is seen.
            Some(q) => idle.min(q.saturating_add(Duration::from_millis(10))),
            None => idle,
        }
    }

    fn waiting_on_pull(&self, name: &str) -> bool {
        self.pull_backoff
            .get(name)
            .map(|until| Instant::now() < *until)
            .unwrap_or(false)
    }

    /// Whether an exited container may be restarted now (its back-off has
    /// passed); notes the restart if so.
    fn may_restart(&mut self, name: &str, s: &Seen) -> bool {
        let now = Instant::now();
        let ran = (s.finished_at - s.started_at) / 1_000_000_000;
        let b = self.backoff.get(name).cloned();
        match b {
            Some(b) if ran < BACKOFF_RESET_AFTER => {
                if now < b.restarted_at + b.delay {
                    return false;
                }
                self.backoff.insert(
                    name.to_string(),
                    Backoff {
                        delay: (b.delay * 2).min(BACKOFF_MAX),
                        restarted_at: now,
                    },
                );
                true
            }
            _ => {
                self.backoff.insert(
                    name.to_string(),
                    Backoff {
                        delay: BACKOFF_START,
                        restarted_at: now,
                    },
                );
                true
            }
        }
    }

    /// Pulls (if needed), creates and starts a container; failures become
    /// the container's waiting reason.
    #[allow(clippy::too_many_arguments)]
    async fn start(
        &mut self,
        pod: &Pod,
        c: &Container,
        attempt: u32,
        init: bool,
        sandbox_id: &str,
        sandbox_cfg: &cri::PodSandboxConfig,
        volumes: &HashMap<String, PathBuf>,
        pod_ip: &str,
        fetcher: &mut Fetcher,
        pid_target: Option<String>,
    ) {
        let rt = self.ctx.runtime.clone();
        let image = c.image.clone().unwrap_or_default();
        let policy = c
            .image_pull_policy
            .clone()
            .unwrap_or_else(|| "IfNotPresent".into());
        let present = rt.image_present(&image).await.ok().flatten();
        if present.is_none() || policy == "Always" {
            if policy == "Never" {
                let msg =
                    format!("Container image \"{image}\" is not present with pull policy of Never");
                self.ctx
                    .event(pod, "Warning", "ErrImageNeverPull", msg.clone());
                self.waiting
                    .insert(c.name.clone(), ("ErrImageNeverPull".into(), msg));
                return;
            }
            let pulled = match self.pull_keyring(pod, fetcher).await {
                Ok(keyring) => {
                    self.ctx.event(
                        pod,
                        "Normal",
                        "Pulling",
                        format!("Pulling image \"{image}\""),
                    );
                    keyring
                        .pull(&image, |auth| rt.pull_image_auth(&image, auth))
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
                }
                Err(e) if present.is_some() && policy == "Always" => {
                    // No registry reachable, but the image is here: a pull
                    // failure with a local copy is reported and tolerated.
                    tracing::debug!(%image, error = %e, "pull failed; using the local image");
                }
                Err(e) => {
                    let was = self.waiting.get(&c.name).map(|w| w.0.clone());
                    let reason = if was.as_deref() == Some("ErrImagePull")
                        || was.as_deref() == Some("ImagePullBackOff")
                    {
                        "ImagePullBackOff"
                    } else {
                        "ErrImagePull"
                    };
                    let msg = if reason == "ImagePullBackOff" {
                        format!("Back-off pulling image \"{image}\": {e}")
                    } else if e.to_string().starts_with("failed to pull") {
                        // containerd's message names the image already.
                        e.to_string()
                    } else {
                        format!("failed to pull and unpack image \"{image}\": {e}")
                    };
                    self.ctx.event(
                        pod,
                        "Warning",
                        if reason == "ErrImagePull" {
                            "Failed"
                        } else {
                            "BackOff"
                        },
                        msg.clone(),
                    );
                    self.waiting.insert(c.name.clone(), (reason.into(), msg));
                    self.pull_backoff
                        .insert(c.name.clone(), Instant::now() + Duration::from_secs(10));
                    return;
                }
            }
        } else {
            self.ctx.event(
                pod,
                "Normal",
                "Pulled",
                format!("Container image \"{image}\" already present on machine"),
            );
        }
        let env = if rt.is_real() {
            let links = pod
                .spec
                .as_ref()
                .and_then(|s| s.enable_service_links)
                .unwrap_or(true);
            let services = self
                .ctx
                .services
                .variables(spec::namespace(pod), links, Duration::from_secs(10))
                .await;
            let env = match services {
                Ok(services) => {
                    inputs::container_env(
                        fetcher,
                        pod,
                        c,
                        &self.ctx.host_ip,
                        pod_ip,
                        &self.ctx.allocatable,
                        &services,
                    )
                    .await
                }
                Err(e) => Err(e),
            };
            match env {
                Ok(e) => e,
                Err(msg) => {
                    self.ctx
                        .event(pod, "Warning", "Failed", format!("Error: {msg}"));
                    self.waiting
                        .insert(c.name.clone(), ("CreateContainerConfigError".into(), msg));
                    return;
                }
            }
        } else {
            vec![]
        };
        // Hollow nodes materialize no volumes: nothing to mount or check.
        let mounts = match inputs::mounts(c, volumes) {
            _ if !rt.is_real() => vec![],
            Ok(m) => m,
            Err(msg) => {
                self.waiting
                    .insert(c.name.clone(), ("CreateContainerConfigError".into(), msg));
                return;
            }
        };
        let cfg = spec::container_config(
            pod,
            c,
            spec::ContainerInputs {
                env,
                mounts,
                image: &image,
                attempt,
                init,
                spec_hash: spec::spec_hash(c),
                pid_target,
            },
        );
        let id = match rt.create_container(sandbox_id, &cfg, sandbox_cfg).await {
            Ok(id) => id,
            Err(e) => {
                let msg = format!("{e}");
                self.ctx
                    .event(pod, "Warning", "Failed", format!("Error: {msg}"));
                self.waiting
                    .insert(c.name.clone(), ("CreateContainerError".into(), msg));
                return;
            }
        };
        self.ctx.event(
            pod,
            "Normal",
            "Created",
            format!("Created container {}", c.name),
        );
        if let Err(e) = rt.start_container(&id).await {
            let msg = format!("{e}");
            self.ctx
                .event(pod, "Warning", "Failed", format!("Error: {msg}"));
            self.waiting
                .insert(c.name.clone(), ("RunContainerError".into(), msg));
            return;
        }
        self.ctx.event(
            pod,
            "Normal",
            "Started",
            format!("Started container {}", c.name),
        );
        self.waiting.remove(&c.name);
        self.pull_backoff.remove(&c.name);
        if let Some(h) = c.lifecycle.as_ref().and_then(|l| l.post_start.as_ref()) {
            let (ok, msg) = self.run_hook(&id, c, h, pod_ip, 30).await;
            if !ok {
                self.ctx.event(pod, "Warning", "FailedPostStartHook", msg);
                let _ = rt.stop_container(&id, 2).await;
            }
        }
    }

    /// The registry credentials of the pod's `imagePullSecrets`, as
    /// kubelet reads them: a secret that cannot be read is skipped with a
    /// `FailedToRetrieveImagePullSecret` warning (the pull goes on without
    /// it); a pull secret whose docker config does not parse fails the pull.
    /// Hollow nodes read no secrets.
    async fn pull_keyring(
        &self,
        pod: &Pod,
        fetcher: &mut Fetcher,
    ) -> Result<credentials::Keyring, String> {
        let mut keyring = credentials::Keyring::default();
        if !self.ctx.runtime.is_real() {
            return Ok(keyring);
        }
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

    /// Runs the probes that are due; kills a container whose liveness (or
    /// startup) probe failed. Returns whether it acted.
    async fn check_probes(&mut self, pod: &Pod, c: &Container, s: &Seen, pod_ip: &str) -> bool {
        let now = Instant::now();
        let started_for = Duration::from_nanos((chrono_now_nanos() - s.started_at).max(0) as u64);
        let started = now.checked_sub(started_for).unwrap_or(now);
        let startup_ok = match probes::probe_of(c, Kind::Startup) {
            None => true,
            Some(_) => {
                self.probes
                    .get(&(s.id.clone(), kind_key(Kind::Startup)))
                    .and_then(|(p, _)| p.ok)
                    == Some(true)
            }
        };
        for kind in [Kind::Startup, Kind::Liveness, Kind::Readiness] {
            let Some(probe) = probes::probe_of(c, kind) else {
                continue;
            };
            if kind == Kind::Startup && startup_ok {
                continue;
            }
            if kind != Kind::Startup && !startup_ok {
                continue;
            }
            let key = (s.id.clone(), kind_key(kind));
            let entry = self
                .probes
                .entry(key.clone())
                .or_insert_with(|| (ProbeState::new(), started));
            if !entry.0.due(probe, entry.1, now) {
                continue;
            }
            entry.0.last_run = Some(now);
            let (ok, msg) = probes::run(self.ctx.runtime.as_ref(), &s.id, c, probe, pod_ip).await;
            let Some(entry) = self.probes.get_mut(&key) else {
                continue;
            };
            let before = entry.0.ok;
            entry.0.record(probe, ok, msg.clone());
            if !ok {
                let what = match kind {
                    Kind::Liveness => "Liveness",
                    Kind::Readiness => "Readiness",
                    Kind::Startup => "Startup",
                };
                self.ctx.event(
                    pod,
                    "Warning",
                    "Unhealthy",
                    format!("{what} probe failed: {msg}"),
                );
            }
            if entry.0.ok == Some(false) && kind != Kind::Readiness {
                let what = if kind == Kind::Liveness {
                    "liveness"
                } else {
                    "startup"
                };
                self.ctx.event(
                    pod,
                    "Normal",
                    "Killing",
                    format!(
                        "Container {} failed {what} probe, will be restarted",
                        c.name
                    ),
                );
                let grace = pod
                    .spec
                    .as_ref()
                    .and_then(|s| s.termination_grace_period_seconds)
                    .unwrap_or(30);
                let _ = self
                    .ctx
                    .runtime
                    .stop_container(&s.id, grace.max(MIN_STOP_SECONDS))
                    .await;
                self.probes.retain(|(id, _), _| id != &s.id);
                return true;
            }
            if before != entry.0.ok {
                return true;
            }
        }
        false
    }

    /// Graceful termination: preStop hooks, then SIGTERM with the grace
    /// period, then SIGKILL (the runtime's stop with a timeout), all
    /// containers at once; then the sandbox.
    async fn terminate(&mut self, pod: &Pod) {
        let grace = pod
            .metadata
            .deletion_grace_period_seconds
            .or(pod
                .spec
                .as_ref()
                .and_then(|s| s.termination_grace_period_seconds))
            .unwrap_or(30)
            .max(0);
        let Ok((sandboxes, seen)) = self.observe(uid(pod)).await else {
            return;
        };
        let spec = pod.spec.clone().unwrap_or_default();
        let deadline = Instant::now() + Duration::from_secs(grace as u64);
        let pod_ip = match sandboxes.first() {
            Some(sb) => self
                .ctx
                .runtime
                .sandbox_status(&sb.id)
                .await
                .ok()
                .flatten()
                .and_then(|s| s.network)
                .map(|n| n.ip)
                .unwrap_or_default(),
            None => String::new(),
        };
        let mut stops = vec![];
        for s in seen.iter().filter(|s| is_running(s)) {
            let c = spec
                .containers
                .iter()
                .chain(spec.init_containers.iter().flatten())
                .find(|c| c.name == s.name)
                .cloned();
            self.ctx.event(
                pod,
                "Normal",
                "Killing",
                format!("Stopping container {}", s.name),
            );
            let rt = self.ctx.runtime.clone();
            let id = s.id.clone();
            let pod_ip = pod_ip.clone();
            let me = &*self;
            stops.push(async move {
                if let Some(c) = &c {
                    if let Some(h) = c.lifecycle.as_ref().and_then(|l| l.pre_stop.as_ref()) {
                        let left = seconds_left(deadline);
                        let _ = tokio::time::timeout(
                            Duration::from_secs(left.max(1) as u64),
                            me.run_hook(&id, c, h, &pod_ip, left.max(1)),
                        )
                        .await;
                    }
                }
                // What is left of the grace period, rounded up, and never
                // under kubelet's minimal shutdown window of 2 s.
                let left = seconds_left(deadline);
                let _ = rt.stop_container(&id, left.max(MIN_STOP_SECONDS)).await;
            });
        }
        futures::future::join_all(stops).await;
        for sb in sandboxes {
            let _ = self.ctx.runtime.stop_sandbox(&sb.id).await;
        }
    }

    /// Keeps, per container name, the current and the previous instance
    /// (for `kubectl logs --previous` and lastState); removes older ones.
    async fn gc_dead(&self, seen: &[Seen]) {
        let mut by_name: HashMap<&str, Vec<&Seen>> = HashMap::new();
        for s in seen {
            by_name.entry(s.name.as_str()).or_default().push(s);
        }
        for (_, mut list) in by_name {
            list.sort_by_key(|s| std::cmp::Reverse((s.attempt, s.created_at)));
            for s in list.iter().skip(2) {
                if is_exited(s) {
                    let _ = self.ctx.runtime.remove_container(&s.id).await;
                }
            }
        }
    }

    async fn write_status(
        &mut self,
        pod: &Pod,
        pod_ip: Option<&str>,
        seen: &[Seen],
        initialized: bool,
    ) -> anyhow::Result<()> {
        let status = self.status(pod, pod_ip, seen, initialized);
        let digest = {
            use std::hash::{Hash, Hasher};
            let mut h = std::collections::hash_map::DefaultHasher::new();
            status.to_string().hash(&mut h);
            h.finish()
        };
        if self.last_status == Some(digest) {
            return Ok(());
        }
        let api: Api<Pod> = Api::namespaced(self.ctx.client.clone(), namespace(pod));
        let patch = json!({"status": status});
        match api
            .patch_status(name(pod), &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            Ok(_) => {
                self.last_status = Some(digest);
                Ok(())
            }
            Err(kube::Error::Api(e)) if e.code == 404 => Ok(()),
            Err(e) => Err(e.into()),
        }
    }

    fn restart_pending(&self, name: &str) -> Option<Duration> {
        let b = self.backoff.get(name)?;
        let until = b.restarted_at + b.delay;
        let now = Instant::now();
        (now < until).then_some(b.delay)
    }

    fn container_status(
        &self,
        pod: &Pod,
        c: &Container,
        seen: &[Seen],
        init: bool,
        restart_policy: &str,
    ) -> (Value, bool, bool, bool) {
        // Returns (status, ready, finished_ok, finished) for the phase.
        let mut all: Vec<&Seen> = seen.iter().filter(|s| s.name == c.name).collect();
        all.sort_by_key(|s| std::cmp::Reverse((s.attempt, s.created_at)));
        let cur = all.first().copied();
        let prev = all.get(1).copied();
        let terminated = |s: &Seen| {
            let reason = if !s.reason.is_empty() && s.reason != "Completed" && s.reason != "Error" {
                s.reason.clone()
            } else if s.exit_code == 0 {
                "Completed".to_string()
            } else {
                "Error".to_string()
            };
            let mut t = json!({
                "exitCode": s.exit_code,
                "reason": reason,
                "startedAt": rfc3339(s.started_at),
                "finishedAt": rfc3339(s.finished_at),
                "containerID": format!("containerd://{}", s.id),
            });
            if !s.message.is_empty() {
                t["message"] = json!(s.message);
            }
            json!({"terminated": t})
        };
        let image = c.image.clone().unwrap_or_default();
        let mut st = json!({
            "name": c.name,
            "image": image,
            "imageID": cur.map(|s| s.image_ref.clone()).unwrap_or_default(),
            "restartCount": cur.map(|s| s.attempt).unwrap_or(0),
            "ready": false,
            "started": false,
            "lastState": {},
            "state": {},
        });
        let mut ready = false;
        let mut finished = false;
        let mut finished_ok = false;
        match cur {
            None => {
                let (reason, message) = self.waiting.get(&c.name).cloned().unwrap_or_else(|| {
                    (
                        if init {
                            "PodInitializing"
                        } else {
                            "ContainerCreating"
                        }
                        .to_string(),
                        String::new(),
                    )
                });
                let mut w = json!({"reason": reason});
                if !message.is_empty() {
                    w["message"] = json!(message);
                }
                st["state"] = json!({"waiting": w});
            }
            Some(s) => {
                st["containerID"] = json!(format!("containerd://{}", s.id));
                if let Some(p) = prev {
                    st["lastState"] = terminated(p);
                }
                if is_running(s) {
                    let startup_ok = c.startup_probe.is_none()
                        || self
                            .probes
                            .get(&(s.id.clone(), "startup"))
                            .and_then(|(p, _)| p.ok)
                            == Some(true);
                    let readiness_ok = if c.readiness_probe.is_none() {
                        true
                    } else {
                        self.probes
                            .get(&(s.id.clone(), "readiness"))
                            .and_then(|(p, _)| p.ok)
                            == Some(true)
                    };
                    ready = startup_ok && readiness_ok && !init;
                    st["state"] = json!({"running": {"startedAt": rfc3339(s.started_at)}});
                    st["started"] = json!(startup_ok);
                    st["ready"] = json!(ready);
                } else if is_exited(s) {
                    let restarts = match restart_policy {
                        "Never" => false,
                        "OnFailure" => s.exit_code != 0,
                        _ => true,
                    } && !(init && s.exit_code == 0);
                    if restarts {
                        st["lastState"] = terminated(s);
                        let (reason, message) = match self.waiting.get(&c.name) {
                            Some(w) => w.clone(),
                            None => match self.restart_pending(&c.name) {
                                Some(delay) => (
                                    "CrashLoopBackOff".to_string(),
                                    format!(
                                        "back-off {}s restarting failed container={} pod={}_{}({})",
                                        delay.as_secs(),
                                        c.name,
                                        name(pod),
                                        namespace(pod),
                                        uid(pod)
                                    ),
                                ),
                                None => ("ContainerCreating".to_string(), String::new()),
                            },
                        };
                        let mut w = json!({"reason": reason});
                        if !message.is_empty() {
                            w["message"] = json!(message);
                        }
                        st["state"] = json!({"waiting": w});
                    } else {
                        st["state"] = terminated(s);
                        finished = true;
                        finished_ok = s.exit_code == 0;
                        if init && s.exit_code == 0 {
                            ready = true;
                            st["ready"] = json!(true);
                        }
                    }
                } else {
                    st["state"] = json!({"waiting": {"reason": "ContainerCreating"}});
                }
            }
        }
        (st, ready, finished_ok, finished)
    }

    fn status(&self, pod: &Pod, pod_ip: Option<&str>, seen: &[Seen], initialized: bool) -> Value {
        let spec = pod.spec.clone().unwrap_or_default();
        let restart_policy = spec
            .restart_policy
            .clone()
            .unwrap_or_else(|| "Always".into());
        let old = pod.status.clone().unwrap_or_default();
        let mut init_statuses = vec![];
        let mut init_failed = false;
        for ic in spec.init_containers.iter().flatten() {
            let (st, _, ok, finished) = self.container_status(pod, ic, seen, true, &restart_policy);
            if finished && !ok {
                init_failed = true;
            }
            init_statuses.push(st);
        }
        let mut statuses = vec![];
        let mut all_ready = true;
        let mut all_finished = true;
        let mut all_ok = true;
        let mut any_started = false;
        for c in &spec.containers {
            let (st, ready, ok, finished) =
                self.container_status(pod, c, seen, false, &restart_policy);
            all_ready &= ready;
            all_finished &= finished;
            all_ok &= ok;
            any_started |= st.pointer("/state/running").is_some()
                || st.pointer("/state/terminated").is_some()
                || st["restartCount"].as_u64().unwrap_or(0) > 0;
            statuses.push(st);
        }
        let phase = if init_failed && restart_policy == "Never" {
            "Failed"
        } else if !initialized || !any_started {
            "Pending"
        } else if all_finished && !spec.containers.is_empty() {
            if all_ok {
                "Succeeded"
            } else {
                "Failed"
            }
        } else {
            "Running"
        };
        let terminal = phase == "Succeeded" || phase == "Failed";
        let ready = all_ready && initialized && !terminal;
        let old_conds = old.conditions.clone().unwrap_or_default();
        let cond = |type_: &str, ok: bool, reason: Option<&str>| {
            let status = if ok { "True" } else { "False" };
            let since = old_conds
                .iter()
                .find(|c| c.type_ == type_ && c.status == status)
                .and_then(|c| c.last_transition_time.as_ref())
                .map(|t| t.0.to_string())
                .unwrap_or_else(now_rfc3339);
            let mut c = json!({"type": type_, "status": status, "lastProbeTime": null, "lastTransitionTime": since});
            if let (false, Some(r)) = (ok, reason) {
                c["reason"] = json!(r);
            }
            c
        };
        let has_ip = pod_ip.is_some();
        let mut conditions = vec![
            cond("PodReadyToStartContainers", has_ip && !terminal, None),
            cond("Initialized", initialized, Some("ContainersNotInitialized")),
            cond(
                "Ready",
                ready,
                Some(if terminal {
                    "PodCompleted"
                } else {
                    "ContainersNotReady"
                }),
            ),
            cond(
                "ContainersReady",
                ready,
                Some(if terminal {
                    "PodCompleted"
                } else {
                    "ContainersNotReady"
                }),
            ),
        ];
        if let Some(c) = old_conds.iter().find(|c| c.type_ == "PodScheduled") {
            conditions.push(serde_json::to_value(c).unwrap_or(Value::Null));
        } else {
            conditions.push(cond("PodScheduled", true, None));
        }
        let start_time = old
            .start_time
            .as_ref()
            .map(|t| t.0.to_string())
            .unwrap_or_else(now_rfc3339);
        let qos = pod
            .spec
            .as_ref()
            .map(skiff_helpers::qos::of_spec)
            .unwrap_or(skiff_helpers::qos::BEST_EFFORT);
        let mut status = json!({
            "phase": phase,
            "conditions": conditions,
            "hostIP": self.ctx.host_ip,
            "hostIPs": [{"ip": self.ctx.host_ip}],
            "startTime": start_time,
            "containerStatuses": statuses,
            "qosClass": qos,
        });
        if !init_statuses.is_empty() {
            status["initContainerStatuses"] = json!(init_statuses);
        }
        // Ephemeral containers never restart and are never ready; they
        // count for neither the phase nor the conditions.
        let ephemeral: Vec<Value> = spec
            .ephemeral_containers
            .iter()
            .flatten()
            .map(|ec| {
                let c = spec::ephemeral_as_container(ec);
                let (mut st, ..) = self.container_status(pod, &c, seen, false, "Never");
                st["ready"] = json!(false);
                st
            })
            .collect();
        if !ephemeral.is_empty() {
            status["ephemeralContainerStatuses"] = json!(ephemeral);
        }
        if let Some(ip) = pod_ip.filter(|ip| !ip.is_empty()) {
            status["podIP"] = json!(ip);
            status["podIPs"] = json!([{"ip": ip}]);
        }
        status
    }
}

fn latest<'a>(seen: &'a [Seen], name: &str) -> Option<&'a Seen> {
    seen.iter()
        .filter(|s| s.name == name)
        .max_by_key(|s| (s.attempt, s.created_at))
}

fn chrono_now_nanos() -> i64 {
    k8s_openapi::jiff::Timestamp::now().as_nanosecond() as i64
}

/// Kubelet's minimal shutdown window: a container always gets this long
/// between SIGTERM and SIGKILL, whatever remains of its grace period.
const MIN_STOP_SECONDS: i64 = 2;

/// Whole seconds until `deadline`, rounded up (a grace period is never
/// shortened by truncation).
fn seconds_left(deadline: Instant) -> i64 {
    whole_seconds_up(deadline.saturating_duration_since(Instant::now()))
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
