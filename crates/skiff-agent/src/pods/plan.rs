//! The pod worker's decisions, after kubelet's `computePodActions`: from
//! the pod, what the runtime has for it ([`Observed`]), what the worker
//! remembers ([`Memory`]: back-off, probe verdicts, why containers wait)
//! and the time, what to do next ([`PodActions`]) and the status to
//! report ([`pod_status`]). Nothing here touches the runtime, the host or
//! the API: [`super`] observes, then executes the plan.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Container, Pod, PodSpec};
use serde_json::{json, Value};
use skiff_helpers::dependencies;

use crate::clock::{rfc3339, Now};
use crate::probes::{self, Kind, ProbeState};
use crate::runtime::{cri, Capabilities};
use crate::spec::{self, name, namespace, uid};

use super::resize::{self, Actuation};

/// The first restart back-off, doubled at every restart up to
/// [`BACKOFF_MAX`].
pub const BACKOFF_START: Duration = Duration::from_secs(10);
pub const BACKOFF_MAX: Duration = Duration::from_secs(300);
/// A container that ran this many seconds before it exited starts its
/// back-off afresh.
pub const BACKOFF_RESET_AFTER: i64 = 600;
/// How long a container whose image could not be pulled waits before the
/// next pull.
pub const PULL_BACKOFF: Duration = Duration::from_secs(10);
/// Kubelet's minimal shutdown window: a container always gets this long
/// between SIGTERM and SIGKILL, whatever remains of its grace period.
pub const MIN_STOP_SECONDS: i64 = 2;
/// The grace period of a pod that names none.
pub const DEFAULT_GRACE_SECONDS: i64 = 30;
/// The grace period of an eviction by the node (kubelet's
/// `immediateEvictionGracePeriodSeconds`, which hard thresholds use); the
/// container still gets [`MIN_STOP_SECONDS`] after its preStop hook.
pub const EVICTION_GRACE_SECONDS: i64 = 1;
/// The status reason of a pod the node evicted (kubelet's eviction
/// `Reason`).
pub const EVICTED: &str = "Evicted";

/// A container's state as the runtime reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum State {
    Created,
    Running,
    Exited,
    Unknown,
}

impl State {
    pub fn from_cri(state: i32) -> State {
        match cri::ContainerState::try_from(state) {
            Ok(cri::ContainerState::ContainerCreated) => State::Created,
            Ok(cri::ContainerState::ContainerRunning) => State::Running,
            Ok(cri::ContainerState::ContainerExited) => State::Exited,
            _ => State::Unknown,
        }
    }
}

/// One container instance of the pod as the runtime reports it.
#[derive(Debug, Clone, PartialEq)]
pub struct Seen {
    pub id: String,
    pub name: String,
    pub attempt: u32,
    pub state: State,
    /// Wall times in nanoseconds since the epoch (0: not yet).
    pub created_at: i64,
    pub started_at: i64,
    pub finished_at: i64,
    pub exit_code: i32,
    pub reason: String,
    pub message: String,
    pub image_ref: String,
    /// The spec hash the container was created with ("" if unknown).
    pub hash: String,
}

impl Seen {
    pub fn running(&self) -> bool {
        self.state == State::Running
    }
    /// Exited, or in a state the runtime cannot tell (counted as exited, as
    /// kubelet does).
    pub fn exited(&self) -> bool {
        matches!(self.state, State::Exited | State::Unknown)
    }
}

/// One sandbox of the pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SandboxSeen {
    pub id: String,
    pub ready: bool,
    pub created_at: i64,
    pub attempt: u32,
}

/// What the runtime has for the pod.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Observed {
    pub sandboxes: Vec<SandboxSeen>,
    pub containers: Vec<Seen>,
    /// The IP of the newest ready sandbox ("" when it has none, as with
    /// host networking); `None` without a ready sandbox.
    pub sandbox_ip: Option<String>,
}

impl Observed {
    /// The newest ready sandbox.
    pub fn ready_sandbox(&self) -> Option<&SandboxSeen> {
        self.sandboxes
            .iter()
            .filter(|s| s.ready)
            .max_by_key(|s| s.created_at)
    }

    /// The newest instance of the container of this name.
    pub fn latest(&self, name: &str) -> Option<&Seen> {
        latest(&self.containers, name)
    }
}

fn latest<'a>(containers: &'a [Seen], name: &str) -> Option<&'a Seen> {
    containers
        .iter()
        .filter(|s| s.name == name)
        .max_by_key(|s| (s.attempt, s.created_at))
}

/// Restart back-off of one container name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backoff {
    /// How long after `restarted_at` the next restart may happen.
    pub delay: Duration,
    pub restarted_at: Instant,
}

/// Why a container is waiting, as its status shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Waiting {
    pub reason: String,
    pub message: String,
}

impl Waiting {
    pub fn new(reason: impl Into<String>, message: impl Into<String>) -> Waiting {
        Waiting {
            reason: reason.into(),
            message: message.into(),
        }
    }
}

/// One probe of one container instance: its results so far, and when the
/// container started (on the monotonic clock) for `initialDelaySeconds`.
#[derive(Debug, Clone)]
pub struct ProbeRecord {
    pub state: ProbeState,
    pub started: Instant,
}

/// What the worker remembers between syncs; everything else it reads
/// from the pod and the runtime again.
#[derive(Debug, Default)]
pub struct Memory {
    /// Restart back-off by container name.
    pub backoff: HashMap<String, Backoff>,
    /// Probe results by container id and kind.
    pub probes: HashMap<(String, Kind), ProbeRecord>,
    /// Why a container of this name could not be started.
    pub waiting: HashMap<String, Waiting>,
    /// Until when a container of this name waits for its next image pull.
    pub pull_backoff: HashMap<String, Instant>,
    /// The pod's graceful termination has been done.
    pub terminating: bool,
    /// The node ordered the pod evicted (reclaimed capacity or node
    /// pressure): it is killed and its status becomes Failed/Evicted.
    pub eviction: Option<Eviction>,
    /// The eviction's Event has been recorded.
    pub eviction_announced: bool,
    /// The pod's allocated and actuated resources (in-place resize).
    pub resize: resize::State,
}

/// An order to evict a pod, as kubelet's eviction manager gives it: the
/// message of its status, its Event and its `DisruptionTarget` condition,
/// and the grace period that overrides the pod's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Eviction {
    pub message: String,
    pub grace_seconds: i64,
}

impl Eviction {
    /// An eviction with kubelet's immediate grace period.
    pub fn now(message: impl Into<String>) -> Eviction {
        Eviction {
            message: message.into(),
            grace_seconds: EVICTION_GRACE_SECONDS,
        }
    }
}

impl Memory {
    fn verdict(&self, container_id: &str, kind: Kind) -> Option<bool> {
        self.probes
            .get(&(container_id.to_string(), kind))
            .and_then(|p| p.state.ok)
    }

    fn waiting_on_pull(&self, name: &str, now: Instant) -> bool {
        self.pull_backoff
            .get(name)
            .is_some_and(|until| now < *until)
    }

    /// Whether a container has passed its startup probe (or has none).
    fn started(&self, c: &Container, s: &Seen) -> bool {
        c.startup_probe.is_none() || self.verdict(&s.id, Kind::Startup) == Some(true)
    }
}

/// What to do with a pod in one sync.
#[derive(Debug, Clone, PartialEq)]
pub enum PodActions {
    /// The pod is being deleted: run preStop hooks, stop its containers
    /// within the grace period, stop its sandboxes, then delete the pod
    /// object for good.
    Terminate(Termination),
    /// The termination is done; the pod object is on its way out.
    AwaitDeletion,
    /// The pod has finished (Succeeded or Failed): stop whatever still runs
    /// and keep the status.
    StopFinished {
        containers: Vec<String>,
        sandboxes: Vec<String>,
    },
    /// The node evicts the pod: Warning Event `Evicted`, its containers
    /// and sandboxes stopped with the eviction's grace period (preStop
    /// hooks within it), then the status Failed with reason `Evicted`.
    Evict {
        termination: Termination,
        /// Every init container had succeeded (for the status).
        initialized: bool,
    },
    /// Drive the pod towards its spec.
    Sync(SyncActions),
}

/// A pod's graceful termination.
#[derive(Debug, Clone, PartialEq)]
pub struct Termination {
    /// The grace period in seconds: the deletion's, else the spec's, else
    /// 30.
    pub grace_seconds: i64,
    /// The running containers, each stopped at once with what is left of
    /// the grace period after its preStop hook.
    pub containers: Vec<ContainerStop>,
    pub sandboxes: Vec<String>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct ContainerStop {
    pub id: String,
    pub name: String,
    /// The container's spec, when the pod still names it (for its preStop
    /// hook).
    pub container: Option<Container>,
}

impl ContainerStop {
    pub fn pre_stop(&self) -> Option<&k8s_openapi::api::core::v1::LifecycleHandler> {
        self.container
            .as_ref()
            .and_then(|c| c.lifecycle.as_ref())
            .and_then(|l| l.pre_stop.as_ref())
    }
}

/// The steps of a pod that runs.
#[derive(Debug, Clone, PartialEq)]
pub struct SyncActions {
    pub sandbox: SandboxAction,
    /// Prepare the pod's volumes, environment, log directory and pull
    /// credentials (the runtime's containers read them).
    pub prepare_inputs: bool,
    /// In order.
    pub steps: Vec<Step>,
    /// Every init container has succeeded.
    pub initialized: bool,
    /// Containers that cannot start yet, and why.
    pub waiting: Vec<(String, Waiting)>,
}

impl SyncActions {
    /// Whether executing this changes anything in the runtime.
    pub fn acts(&self) -> bool {
        matches!(self.sandbox, SandboxAction::Create { .. }) || !self.steps.is_empty()
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SandboxAction {
    /// The newest ready sandbox serves.
    Keep { id: String, attempt: u32 },
    /// No sandbox is ready: remove these containers and sandboxes (a
    /// sandbox that died takes its containers with it), then create one.
    Create {
        attempt: u32,
        remove_containers: Vec<String>,
        remove_sandboxes: Vec<String>,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    Init,
    Regular,
    Ephemeral,
}

#[derive(Debug, Clone, PartialEq)]
pub enum Step {
    /// Pull (as the policy says), create and start a container.
    Start(StartContainer),
    /// Start a container the runtime created but did not start.
    StartCreated { id: String, name: String },
    /// Stop a running container (it restarts by the restart policy).
    Kill(KillContainer),
    /// Give a running container its allocated cpu and memory in place.
    Resize(Box<ResizeContainer>),
}

#[derive(Debug, Clone, PartialEq)]
pub struct ResizeContainer {
    pub id: String,
    pub name: String,
    /// The allocated cpu and memory, which the container has once done.
    pub resources: k8s_openapi::api::core::v1::ResourceRequirements,
    /// The CRI setting to apply; `None` where the runtime's containers
    /// have no cgroups (bookkeeping only).
    pub linux: Option<cri::LinuxContainerResources>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct StartContainer {
    /// Boxed: a container spec is a few KB, the other steps a few words.
    pub container: Box<Container>,
    pub role: Role,
    /// The restart count: one more than the previous instance's.
    pub attempt: u32,
    /// The back-off to remember for this container name (a restart).
    pub backoff: Option<Backoff>,
    /// The container whose PID namespace an ephemeral container joins.
    pub pid_target: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KillContainer {
    pub id: String,
    pub name: String,
    pub grace_seconds: i64,
    pub reason: KillReason,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KillReason {
    /// Its spec changed (an image update): it is replaced.
    SpecChanged,
    LivenessFailed,
    StartupFailed,
    /// A resize changed a resource whose `resizePolicy` is
    /// `RestartContainer`.
    ResizeRestart,
}

impl KillReason {
    /// The message of the `Killing` event.
    pub fn message(&self, container: &str) -> String {
        match self {
            KillReason::SpecChanged => {
                format!("Container {container} definition changed, will be restarted")
            }
            KillReason::LivenessFailed => {
                format!("Container {container} failed liveness probe, will be restarted")
            }
            KillReason::StartupFailed => {
                format!("Container {container} failed startup probe, will be restarted")
            }
            KillReason::ResizeRestart => {
                format!("Container {container} resize requires restart")
            }
        }
    }
}

fn phase(pod: &Pod) -> &str {
    pod.status
        .as_ref()
        .and_then(|s| s.phase.as_deref())
        .unwrap_or_default()
}

fn restart_policy(spec: &PodSpec) -> &str {
    spec.restart_policy.as_deref().unwrap_or("Always")
}

/// Whether a container that exited with `exit_code` restarts under the
/// pod's restart policy.
pub fn restarts(policy: &str, exit_code: i32) -> bool {
    match policy {
        "Never" => false,
        "OnFailure" => exit_code != 0,
        _ => true,
    }
}

/// The grace period of a pod's termination.
pub fn termination_grace(pod: &Pod) -> i64 {
    pod.metadata
        .deletion_grace_period_seconds
        .or(pod
            .spec
            .as_ref()
            .and_then(|s| s.termination_grace_period_seconds))
        .unwrap_or(DEFAULT_GRACE_SECONDS)
        .max(0)
}

/// The back-off of restarting the exited container `s` now: `None` while
/// the previous back-off lasts; else the back-off to remember, 10 s at
/// first (and after a run of 10 minutes), doubled at each restart up to
/// 5 minutes.
pub fn restart_backoff(memory: &Memory, s: &Seen, now: Instant) -> Option<Backoff> {
    let ran = (s.finished_at - s.started_at) / 1_000_000_000;
    match memory.backoff.get(&s.name) {
        Some(b) if ran < BACKOFF_RESET_AFTER => {
            if now < b.restarted_at + b.delay {
                return None;
            }
            Some(Backoff {
                delay: (b.delay * 2).min(BACKOFF_MAX),
                restarted_at: now,
            })
        }
        _ => Some(Backoff {
            delay: BACKOFF_START,
            restarted_at: now,
        }),
    }
}

/// Why the containers of a pod with declared dependencies may not start
/// yet: the pod's `skiff.io/DependenciesReady` condition is not True
/// (its message, or that it is not set yet) and none of its containers
/// ever started (the wait is for the first start only: a restart, or an
/// agent adopting running containers, never waits). `None`: go.
pub fn dependency_wait(pod: &Pod, seen: &[Seen]) -> Option<String> {
    let ns = pod.metadata.namespace.as_deref().unwrap_or("default");
    dependencies::declared(pod.metadata.annotations.as_ref(), ns)?;
    let spec = pod.spec.as_ref()?;
    if spec
        .containers
        .iter()
        .any(|c| seen.iter().any(|s| s.name == c.name))
    {
        return None;
    }
    let cond = pod
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|cs| cs.iter().find(|c| c.type_ == dependencies::CONDITION));
    match cond {
        Some(c) if c.status == "True" => None,
        Some(c) => Some(c.message.clone().unwrap_or_default()),
        None => Some(
            "waiting for the dependencies controller to check the declared dependencies".into(),
        ),
    }
}

/// What to do with `pod` now.
pub fn compute_pod_actions(
    pod: &Pod,
    observed: &Observed,
    now: Now,
    memory: &Memory,
    caps: Capabilities,
) -> PodActions {
    if pod.metadata.deletion_timestamp.is_some() {
        if memory.terminating {
            return PodActions::AwaitDeletion;
        }
        return PodActions::Terminate(termination(pod, observed));
    }
    if matches!(phase(pod), "Succeeded" | "Failed") {
        return PodActions::StopFinished {
            containers: observed
                .containers
                .iter()
                .filter(|s| s.running())
                .map(|s| s.id.clone())
                .collect(),
            sandboxes: observed
                .sandboxes
                .iter()
                .filter(|s| s.ready)
                .map(|s| s.id.clone())
                .collect(),
        };
    }
    let default_spec = PodSpec::default();
    let spec = pod.spec.as_ref().unwrap_or(&default_spec);
    if let Some(e) = &memory.eviction {
        let mut termination = termination(pod, observed);
        termination.grace_seconds = e.grace_seconds.max(0);
        return PodActions::Evict {
            termination,
            initialized: init_done(spec, &observed.containers),
        };
    }
    let policy = restart_policy(spec);
    let sandbox = match observed.ready_sandbox() {
        Some(sb) => SandboxAction::Keep {
            id: sb.id.clone(),
            attempt: sb.attempt,
        },
        None => SandboxAction::Create {
            attempt: observed.sandboxes.len() as u32,
            remove_containers: observed.containers.iter().map(|s| s.id.clone()).collect(),
            remove_sandboxes: observed.sandboxes.iter().map(|s| s.id.clone()).collect(),
        },
    };
    let mut steps = vec![];
    let mut waiting = vec![];
    let start = |c: &Container, role, attempt, backoff| {
        Step::Start(StartContainer {
            container: Box::new(c.clone()),
            role,
            attempt,
            backoff,
            pid_target: None,
        })
    };

    // Init containers, one at a time and in order.
    let mut initialized = true;
    for ic in spec.init_containers.iter().flatten() {
        match observed.latest(&ic.name) {
            Some(s) if s.exited() && s.exit_code == 0 => continue,
            None => {
                if !memory.waiting_on_pull(&ic.name, now.at) {
                    steps.push(start(ic, Role::Init, 0, None));
                }
            }
            Some(s) if s.exited() => {
                if policy != "Never" {
                    if let Some(b) = restart_backoff(memory, s, now.at) {
                        steps.push(start(ic, Role::Init, s.attempt + 1, Some(b)));
                    }
                }
            }
            Some(s) if s.state == State::Created => steps.push(Step::StartCreated {
                id: s.id.clone(),
                name: s.name.clone(),
            }),
            Some(_) => {}
        }
        initialized = false;
        break;
    }

    // The containers, once the pod is initialized.
    if initialized {
        let pod_grace = spec
            .termination_grace_period_seconds
            .unwrap_or(DEFAULT_GRACE_SECONDS);
        // Declared dependencies hold the first start of the containers
        // (not the init containers) until the dependencies controller
        // says they are ready.
        let held = dependency_wait(pod, &observed.containers).is_some();
        for c in &spec.containers {
            let Some(s) = observed.latest(&c.name) else {
                if !held && !memory.waiting_on_pull(&c.name, now.at) {
                    steps.push(start(c, Role::Regular, 0, None));
                }
                continue;
            };
            let kill = |reason, grace: i64| {
                Step::Kill(KillContainer {
                    id: s.id.clone(),
                    name: c.name.clone(),
                    grace_seconds: grace.max(MIN_STOP_SECONDS),
                    reason,
                })
            };
            if s.state == State::Created {
                steps.push(Step::StartCreated {
                    id: s.id.clone(),
                    name: s.name.clone(),
                });
            } else if s.running() {
                if !spec::hash_matches(c, &s.hash) {
                    steps.push(kill(KillReason::SpecChanged, pod_grace));
                    continue;
                }
                // An admitted resize: in place, or by a restart where a
                // changed resource's policy says so.
                if let Some(actual) = memory.resize.actual.get(&s.id) {
                    match resize::actuation(c, actual) {
                        Actuation::None => {}
                        Actuation::Restart => {
                            steps.push(kill(KillReason::ResizeRestart, pod_grace));
                            continue;
                        }
                        Actuation::InPlace => steps.push(Step::Resize(Box::new(ResizeContainer {
                            id: s.id.clone(),
                            name: c.name.clone(),
                            resources: resize::cpu_memory(c.resources.as_ref()),
                            linux: caps.applies_resources.then(|| resize::linux_resources(c)),
                        }))),
                    }
                }
                // A probe's own terminationGracePeriodSeconds wins over
                // the pod's when it kills.
                let probe_grace = |kind| {
                    probes::probe_of(c, kind)
                        .and_then(|p| p.termination_grace_period_seconds)
                        .unwrap_or(pod_grace)
                };
                if !memory.started(c, s) {
                    if memory.verdict(&s.id, Kind::Startup) == Some(false) {
                        steps.push(kill(KillReason::StartupFailed, probe_grace(Kind::Startup)));
                    }
                } else if c.liveness_probe.is_some()
                    && memory.verdict(&s.id, Kind::Liveness) == Some(false)
                {
                    steps.push(kill(
                        KillReason::LivenessFailed,
                        probe_grace(Kind::Liveness),
                    ));
                }
            } else if restarts(policy, s.exit_code) {
                if let Some(b) = restart_backoff(memory, s, now.at) {
                    steps.push(start(c, Role::Regular, s.attempt + 1, Some(b)));
                }
            }
        }
    }

    // Ephemeral containers: each started once, even before the pod is
    // initialized (as kubelet does), and never restarted. One with a
    // `targetContainerName` waits until that container runs, to join its
    // PID namespace.
    for ec in spec.ephemeral_containers.iter().flatten() {
        match observed.latest(&ec.name) {
            None => {
                if memory.waiting_on_pull(&ec.name, now.at) {
                    continue;
                }
                let target = match ec.target_container_name.as_deref() {
                    None | Some("") => None,
                    Some(t) => match observed.latest(t).filter(|s| s.running()) {
                        Some(s) => Some(s.id.clone()),
                        None => {
                            waiting.push((
                                ec.name.clone(),
                                Waiting::new(
                                    "CreateContainerConfigError",
                                    format!("unable to find target container {t}"),
                                ),
                            ));
                            continue;
                        }
                    },
                };
                steps.push(Step::Start(StartContainer {
                    container: Box::new(spec::ephemeral_as_container(ec)),
                    role: Role::Ephemeral,
                    attempt: 0,
                    backoff: None,
                    pid_target: target,
                }));
            }
            Some(s) if s.state == State::Created => steps.push(Step::StartCreated {
                id: s.id.clone(),
                name: s.name.clone(),
            }),
            Some(_) => {}
        }
    }

    PodActions::Sync(SyncActions {
        sandbox,
        prepare_inputs: caps.reads_pod_inputs,
        steps,
        initialized,
        waiting,
    })
}

fn termination(pod: &Pod, observed: &Observed) -> Termination {
    let spec = pod.spec.as_ref();
    let find = |name: &str| {
        spec.and_then(|s| {
            s.containers
                .iter()
                .chain(s.init_containers.iter().flatten())
                .find(|c| c.name == name)
                .cloned()
        })
    };
    Termination {
        grace_seconds: termination_grace(pod),
        containers: observed
            .containers
            .iter()
            .filter(|s| s.running())
            .map(|s| ContainerStop {
                id: s.id.clone(),
                name: s.name.clone(),
                container: find(&s.name),
            })
            .collect(),
        sandboxes: observed.sandboxes.iter().map(|s| s.id.clone()).collect(),
    }
}

/// A probe to run now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DueProbe {
    pub container_id: String,
    pub container: String,
    pub kind: Kind,
    /// When the container started, on the monotonic clock.
    pub started: Instant,
}

/// The probes due now, of the running containers of an initialized pod
/// whose spec they were created with: the startup probe until it has
/// succeeded, then liveness and readiness, each after its
/// `initialDelaySeconds` and every `periodSeconds`.
pub fn due_probes(pod: &Pod, observed: &Observed, now: Now, memory: &Memory) -> Vec<DueProbe> {
    let Some(spec) = pod.spec.as_ref() else {
        return vec![];
    };
    if pod.metadata.deletion_timestamp.is_some()
        || matches!(phase(pod), "Succeeded" | "Failed")
        || observed.ready_sandbox().is_none()
        || !init_done(spec, &observed.containers)
    {
        return vec![];
    }
    let mut due = vec![];
    for c in &spec.containers {
        let Some(s) = observed.latest(&c.name).filter(|s| s.running()) else {
            continue;
        };
        if !spec::hash_matches(c, &s.hash) {
            continue;
        }
        let ran_for = Duration::from_nanos((now.wall_nanos - s.started_at).max(0) as u64);
        let started = now.at.checked_sub(ran_for).unwrap_or(now.at);
        let kinds: &[Kind] = if memory.started(c, s) {
            &[Kind::Liveness, Kind::Readiness]
        } else {
            &[Kind::Startup]
        };
        for &kind in kinds {
            let Some(probe) = probes::probe_of(c, kind) else {
                continue;
            };
            let record = memory.probes.get(&(s.id.clone(), kind));
            let started = record.map(|r| r.started).unwrap_or(started);
            let fresh = ProbeState::new();
            let state = record.map(|r| &r.state).unwrap_or(&fresh);
            if state.due(probe, started, now.at) {
                due.push(DueProbe {
                    container_id: s.id.clone(),
                    container: c.name.clone(),
                    kind,
                    started,
                });
            }
        }
    }
    due
}

/// Whether every init container's latest instance has succeeded.
fn init_done(spec: &PodSpec, containers: &[Seen]) -> bool {
    spec.init_containers
        .iter()
        .flatten()
        .all(|ic| latest(containers, &ic.name).is_some_and(|s| s.exited() && s.exit_code == 0))
}

/// The instances to remove: per container name the current and the
/// previous one are kept (for `kubectl logs --previous` and lastState),
/// older exited ones go.
pub fn dead_to_remove(containers: &[Seen]) -> Vec<String> {
    let mut by_name: HashMap<&str, Vec<&Seen>> = HashMap::new();
    for s in containers {
        by_name.entry(s.name.as_str()).or_default().push(s);
    }
    let mut out = vec![];
    for (_, mut list) in by_name {
        list.sort_by_key(|s| std::cmp::Reverse((s.attempt, s.created_at)));
        out.extend(
            list.iter()
                .skip(2)
                .filter(|s| s.exited())
                .map(|s| s.id.clone()),
        );
    }
    out.sort();
    out
}

/// How long a pod with nothing to do waits before it is looked at again
/// (a watch event wakes it sooner): probes are due at least every second,
/// else `resync`; a runtime that knows how long the pod's containers stay
/// as they are (`quiet`) is believed, and the pod is looked at a little
/// after that.
pub fn idle_wait(spec: &PodSpec, resync: Duration, quiet: Option<Duration>) -> Duration {
    let probed = spec.containers.iter().any(|c| {
        c.liveness_probe.is_some() || c.readiness_probe.is_some() || c.startup_probe.is_some()
    });
    let idle = if probed {
        resync.min(Duration::from_secs(1))
    } else {
        resync
    };
    match quiet {
        Some(q) => idle.min(q.saturating_add(Duration::from_millis(10))),
        None => idle,
    }
}

/// What the status is made of besides the pod and the worker's memory.
#[derive(Debug, Clone, Copy)]
pub struct StatusInput<'a> {
    pub host_ip: &'a str,
    /// `None` without a sandbox.
    pub pod_ip: Option<&'a str>,
    pub containers: &'a [Seen],
    pub initialized: bool,
    pub now: Now,
}

/// One container's status and what it means for the pod's phase.
struct ContainerVerdict {
    status: Value,
    ready: bool,
    finished: bool,
    finished_ok: bool,
}

fn terminated(s: &Seen) -> Value {
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
    json!({ "terminated": t })
}

fn waiting_state(reason: &str, message: &str) -> Value {
    let mut w = json!({ "reason": reason });
    if !message.is_empty() {
        w["message"] = json!(message);
    }
    json!({ "waiting": w })
}

fn container_status(
    pod: &Pod,
    c: &Container,
    memory: &Memory,
    input: &StatusInput,
    init: bool,
    policy: &str,
) -> ContainerVerdict {
    let mut all: Vec<&Seen> = input
        .containers
        .iter()
        .filter(|s| s.name == c.name)
        .collect();
    all.sort_by_key(|s| std::cmp::Reverse((s.attempt, s.created_at)));
    let cur = all.first().copied();
    let prev = all.get(1).copied();
    let mut st = json!({
        "name": c.name,
        "image": c.image.clone().unwrap_or_default(),
        "imageID": cur.map(|s| s.image_ref.clone()).unwrap_or_default(),
        "restartCount": cur.map(|s| s.attempt).unwrap_or(0),
        "ready": false,
        "started": false,
        "lastState": {},
        "state": {},
    });
    // In-place resize: the allocated requests and what the container runs
    // with (its allocation when it does not run).
    let alloc = memory
        .resize
        .allocated
        .as_ref()
        .and_then(|a| a.get(&c.name));
    let actual = cur
        .filter(|s| s.running())
        .and_then(|s| memory.resize.actual.get(&s.id));
    if let Some((requests, resources)) = resize::status_fields(alloc, actual) {
        if requests.as_object().is_some_and(|m| !m.is_empty()) {
            st["allocatedResources"] = requests;
        }
        st["resources"] = resources;
    }
    let mut v = ContainerVerdict {
        status: Value::Null,
        ready: false,
        finished: false,
        finished_ok: false,
    };
    match cur {
        None => {
            st["state"] = match memory.waiting.get(&c.name) {
                Some(w) => waiting_state(&w.reason, &w.message),
                None if init => waiting_state("PodInitializing", ""),
                None => match dependency_wait(pod, input.containers) {
                    Some(m) => waiting_state(dependencies::WAITING_REASON, &m),
                    None => waiting_state("ContainerCreating", ""),
                },
            };
        }
        Some(s) => {
            st["containerID"] = json!(format!("containerd://{}", s.id));
            if let Some(p) = prev {
                st["lastState"] = terminated(p);
            }
            if s.running() {
                let started = memory.started(c, s);
                let readiness_ok = c.readiness_probe.is_none()
                    || memory.verdict(&s.id, Kind::Readiness) == Some(true);
                v.ready = started && readiness_ok && !init;
                st["state"] = json!({"running": {"startedAt": rfc3339(s.started_at)}});
                st["started"] = json!(started);
                st["ready"] = json!(v.ready);
            } else if s.exited() {
                // An evicted pod's containers are not restarted.
                let restarting = memory.eviction.is_none()
                    && restarts(policy, s.exit_code)
                    && !(init && s.exit_code == 0);
                if restarting {
                    st["lastState"] = terminated(s);
                    st["state"] = match memory.waiting.get(&c.name) {
                        Some(w) => waiting_state(&w.reason, &w.message),
                        None => match memory.backoff.get(&c.name) {
                            Some(b) if input.now.at < b.restarted_at + b.delay => waiting_state(
                                "CrashLoopBackOff",
                                &format!(
                                    "back-off {}s restarting failed container={} pod={}_{}({})",
                                    b.delay.as_secs(),
                                    c.name,
                                    name(pod),
                                    namespace(pod),
                                    uid(pod)
                                ),
                            ),
                            _ => waiting_state("ContainerCreating", ""),
                        },
                    };
                } else {
                    st["state"] = terminated(s);
                    v.finished = true;
                    v.finished_ok = s.exit_code == 0;
                    if init && s.exit_code == 0 {
                        v.ready = true;
                        st["ready"] = json!(true);
                    }
                }
            } else {
                st["state"] = waiting_state("ContainerCreating", "");
            }
        }
    }
    v.status = st;
    v
}

/// The pod conditions the agent decides (kubelet's
/// `PodConditionsByKubelet`); every other condition of a pod is kept.
pub const KUBELET_CONDITIONS: &[&str] = &[
    "PodScheduled",
    "PodReadyToStartContainers",
    "Initialized",
    "Ready",
    "ContainersReady",
    "PodResizePending",
    "PodResizeInProgress",
];

/// The pod's status as Kubernetes reports it: phase, conditions (keeping
/// the transition times of those that did not change), container states,
/// IPs and QoS class.
pub fn pod_status(pod: &Pod, memory: &Memory, input: StatusInput) -> Value {
    let default_spec = PodSpec::default();
    let spec = pod.spec.as_ref().unwrap_or(&default_spec);
    let policy = restart_policy(spec);
    let old = pod.status.clone().unwrap_or_default();
    let mut init_statuses = vec![];
    let mut init_failed = false;
    for ic in spec.init_containers.iter().flatten() {
        let v = container_status(pod, ic, memory, &input, true, policy);
        init_failed |= v.finished && !v.finished_ok;
        init_statuses.push(v.status);
    }
    let mut statuses = vec![];
    let mut all_ready = true;
    let mut all_finished = true;
    let mut all_ok = true;
    let mut any_started = false;
    for c in &spec.containers {
        let v = container_status(pod, c, memory, &input, false, policy);
        all_ready &= v.ready;
        all_finished &= v.finished;
        all_ok &= v.finished_ok;
        any_started |= v.status.pointer("/state/running").is_some()
            || v.status.pointer("/state/terminated").is_some()
            || v.status["restartCount"].as_u64().unwrap_or(0) > 0;
        statuses.push(v.status);
    }
    let phase = if memory.eviction.is_some() || init_failed && policy == "Never" {
        "Failed"
    } else if !input.initialized || !any_started {
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
    let containers_ready = all_ready && input.initialized && !terminal;
    let old_conds = old.conditions.clone().unwrap_or_default();
    // Readiness gates (kubelet's `GeneratePodReadyCondition`): Ready also
    // needs each gate's condition, which other controllers set, True.
    let gate_fault = spec.readiness_gates.iter().flatten().find_map(|g| {
        match old_conds.iter().find(|c| c.type_ == g.condition_type) {
            None => Some(format!(
                "corresponding condition of pod readiness gate {:?} does not exist.",
                g.condition_type
            )),
            Some(c) if c.status != "True" => Some(format!(
                "the status of pod readiness gate {:?} is not \"True\", but {}",
                g.condition_type, c.status
            )),
            Some(_) => None,
        }
    });
    let ready = containers_ready && gate_fault.is_none();
    let now = input.now.rfc3339();
    let cond = |type_: &str, ok: bool, reason: Option<&str>| {
        let status = if ok { "True" } else { "False" };
        let since = old_conds
            .iter()
            .find(|c| c.type_ == type_ && c.status == status)
            .and_then(|c| c.last_transition_time.as_ref())
            .map(|t| t.0.to_string())
            .unwrap_or_else(|| now.clone());
        let mut c = json!({"type": type_, "status": status, "lastProbeTime": null, "lastTransitionTime": since});
        if let (false, Some(r)) = (ok, reason) {
            c["reason"] = json!(r);
        }
        c
    };
    let not_ready = if terminal {
        "PodCompleted"
    } else {
        "ContainersNotReady"
    };
    let mut conditions = vec![
        cond(
            "PodReadyToStartContainers",
            input.pod_ip.is_some() && !terminal,
            None,
        ),
        cond(
            "Initialized",
            input.initialized,
            Some("ContainersNotInitialized"),
        ),
        match (&gate_fault, containers_ready) {
            (Some(m), true) => {
                let mut c = cond("Ready", false, Some("ReadinessGatesNotReady"));
                c["message"] = json!(m);
                c
            }
            _ => cond("Ready", ready, Some(not_ready)),
        },
        cond("ContainersReady", containers_ready, Some(not_ready)),
    ];
    match old_conds.iter().find(|c| c.type_ == "PodScheduled") {
        Some(c) => conditions.push(serde_json::to_value(c).unwrap_or(Value::Null)),
        None => conditions.push(cond("PodScheduled", true, None)),
    }
    // Kubelet's eviction manager: the pod is a disruption target,
    // terminated by the kubelet, with the eviction's message.
    if let Some(e) = &memory.eviction {
        let mut c = cond("DisruptionTarget", true, None);
        c["reason"] = json!("TerminationByKubelet");
        c["message"] = json!(e.message);
        conditions.push(c);
    }
    // A running container without its allocation yet: a resize is under
    // way.
    let in_progress = !terminal
        && resize::resizable(pod).any(|c| {
            let running = latest(input.containers, &c.name).filter(|s| s.running());
            match (running, memory.resize.allocated.as_ref()) {
                (Some(s), Some(alloc)) => {
                    match (memory.resize.actual.get(&s.id), alloc.get(&c.name)) {
                        (Some(actual), Some(want)) => !resize::same(actual, want),
                        _ => false,
                    }
                }
                _ => false,
            }
        });
    conditions.extend(resize::conditions(
        &memory.resize,
        in_progress,
        |t| {
            old_conds
                .iter()
                .find(|c| c.type_ == t && c.status == "True")
                .and_then(|c| c.last_transition_time.as_ref())
                .map(|t| t.0.to_string())
        },
        &now,
    ));
    // Conditions other components own (readiness gates', the dependencies
    // controller's, a DisruptionTarget the API server or the taint
    // manager set) are kept as they are, as kubelet keeps them.
    for c in &old_conds {
        let ours = KUBELET_CONDITIONS.contains(&c.type_.as_str())
            || c.type_ == "DisruptionTarget" && memory.eviction.is_some();
        if !ours {
            conditions.push(serde_json::to_value(c).unwrap_or(Value::Null));
        }
    }
    let start_time = old
        .start_time
        .as_ref()
        .map(|t| t.0.to_string())
        .unwrap_or_else(|| now.clone());
    let mut status = json!({
        "phase": phase,
        "conditions": conditions,
        "hostIP": input.host_ip,
        "hostIPs": [{"ip": input.host_ip}],
        "startTime": start_time,
        "containerStatuses": statuses,
        "qosClass": skiff_helpers::qos::of_spec(spec),
    });
    if let Some(e) = &memory.eviction {
        status["reason"] = json!(EVICTED);
        status["message"] = json!(e.message);
    }
    if !init_statuses.is_empty() {
        status["initContainerStatuses"] = json!(init_statuses);
    }
    // Ephemeral containers never restart and are never ready; they count
    // for neither the phase nor the conditions.
    let ephemeral: Vec<Value> = spec
        .ephemeral_containers
        .iter()
        .flatten()
        .map(|ec| {
            let c = spec::ephemeral_as_container(ec);
            let mut st = container_status(pod, &c, memory, &input, false, "Never").status;
            st["ready"] = json!(false);
            st
        })
        .collect();
    if !ephemeral.is_empty() {
        status["ephemeralContainerStatuses"] = json!(ephemeral);
    }
    if let Some(ip) = input.pod_ip.filter(|ip| !ip.is_empty()) {
        status["podIP"] = json!(ip);
        status["podIPs"] = json!([{ "ip": ip }]);
    }
    status
}

#[cfg(test)]
mod tests {
    use super::*;

    const REAL: Capabilities = Capabilities {
        reads_pod_inputs: true,
        applies_resources: true,
    };
    const SIMULATED: Capabilities = Capabilities {
        reads_pod_inputs: false,
        applies_resources: false,
    };
    /// 2023-11-14T22:13:20Z.
    const WALL0: i64 = 1_700_000_000 * 1_000_000_000;
    const SEC: i64 = 1_000_000_000;

    struct T0(Instant);

    impl T0 {
        fn new() -> T0 {
            T0(Instant::now())
        }
        /// `secs` seconds after the start, on both clocks.
        fn at(&self, secs: u64) -> Now {
            Now {
                at: self.0 + Duration::from_secs(secs),
                wall_nanos: WALL0 + secs as i64 * SEC,
            }
        }
    }

    fn pod(spec: Value) -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": "web", "namespace": "shop", "uid": "u-1"},
            "spec": spec,
        }))
        .unwrap()
    }

    fn one(name: &str) -> Value {
        json!({"containers": [{"name": name, "image": "busybox"}]})
    }

    fn seen(name: &str, attempt: u32, state: State) -> Seen {
        Seen {
            id: format!("{name}-{attempt}"),
            name: name.into(),
            attempt,
            state,
            created_at: WALL0 + attempt as i64,
            started_at: WALL0,
            finished_at: 0,
            exit_code: 0,
            reason: String::new(),
            message: String::new(),
            image_ref: "sha256:busybox".into(),
            hash: String::new(),
        }
    }

    fn running(name: &str, attempt: u32) -> Seen {
        seen(name, attempt, State::Running)
    }

    /// An instance that ran `ran` seconds and exited with `code`.
    fn exited(name: &str, attempt: u32, code: i32, ran: i64) -> Seen {
        Seen {
            exit_code: code,
            finished_at: WALL0 + ran * SEC,
            ..seen(name, attempt, State::Exited)
        }
    }

    fn with_sandbox(containers: Vec<Seen>) -> Observed {
        Observed {
            sandboxes: vec![SandboxSeen {
                id: "sb-1".into(),
                ready: true,
                created_at: WALL0,
                attempt: 0,
            }],
            containers,
            sandbox_ip: Some("10.42.0.7".into()),
        }
    }

    fn sync_of(a: PodActions) -> SyncActions {
        match a {
            PodActions::Sync(s) => s,
            other => panic!("expected a sync, got {other:?}"),
        }
    }

    fn plan(pod: &Pod, observed: &Observed, now: Now, memory: &Memory) -> SyncActions {
        sync_of(compute_pod_actions(pod, observed, now, memory, REAL))
    }

    /// The starts of a plan: (name, role, attempt).
    fn starts(a: &SyncActions) -> Vec<(String, Role, u32)> {
        a.steps
            .iter()
            .filter_map(|s| match s {
                Step::Start(s) => Some((s.container.name.clone(), s.role, s.attempt)),
                _ => None,
            })
            .collect()
    }

    fn kills(a: &SyncActions) -> Vec<KillContainer> {
        a.steps
            .iter()
            .filter_map(|s| match s {
                Step::Kill(k) => Some(k.clone()),
                _ => None,
            })
            .collect()
    }

    /// Executes the back-off bookkeeping of a plan, as the executor does.
    fn remember(memory: &mut Memory, a: &SyncActions) {
        for s in &a.steps {
            if let Step::Start(s) = s {
                if let Some(b) = s.backoff {
                    memory.backoff.insert(s.container.name.clone(), b);
                }
            }
        }
    }

    fn verdict(memory: &mut Memory, id: &str, kind: Kind, ok: bool, t0: &T0) {
        let mut state = ProbeState::new();
        state.ok = Some(ok);
        memory.probes.insert(
            (id.into(), kind),
            ProbeRecord {
                state,
                started: t0.0,
            },
        );
    }

    fn status(pod: &Pod, memory: &Memory, containers: &[Seen], initialized: bool) -> Value {
        pod_status(
            pod,
            memory,
            StatusInput {
                host_ip: "192.0.2.10",
                pod_ip: Some("10.42.0.7"),
                containers,
                initialized,
                now: T0::new().at(0),
            },
        )
    }

    fn condition(status: &Value, type_: &str) -> (String, String) {
        let c = status["conditions"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["type"] == type_)
            .unwrap();
        (
            c["status"].as_str().unwrap_or_default().to_string(),
            c["reason"].as_str().unwrap_or_default().to_string(),
        )
    }

    // Sandboxes.

    #[test]
    fn a_new_pod_gets_a_sandbox_and_all_its_containers_started_in_one_pass() {
        let p = pod(json!({"containers": [
            {"name": "app", "image": "busybox"},
            {"name": "sidecar", "image": "busybox"},
        ]}));
        let a = plan(
            &p,
            &Observed::default(),
            T0::new().at(0),
            &Memory::default(),
        );
        assert_eq!(
            a.sandbox,
            SandboxAction::Create {
                attempt: 0,
                remove_containers: vec![],
                remove_sandboxes: vec![],
            }
        );
        assert_eq!(
            starts(&a),
            [
                ("app".to_string(), Role::Regular, 0),
                ("sidecar".to_string(), Role::Regular, 0)
            ]
        );
        assert!(a.initialized && a.acts());
    }

    #[test]
    fn a_dead_sandbox_is_replaced_with_the_next_attempt_and_takes_its_containers_along() {
        let p = pod(one("app"));
        let mut observed = with_sandbox(vec![exited("app", 0, 137, 5)]);
        observed.sandboxes[0].ready = false;
        observed.sandbox_ip = None;
        let a = plan(&p, &observed, T0::new().at(0), &Memory::default());
        assert_eq!(
            a.sandbox,
            SandboxAction::Create {
                attempt: 1,
                remove_containers: vec!["app-0".into()],
                remove_sandboxes: vec!["sb-1".into()],
            }
        );
        // The restart count goes on from the instance that died.
        assert_eq!(starts(&a), [("app".to_string(), Role::Regular, 1)]);
    }

    #[test]
    fn the_newest_ready_sandbox_is_kept() {
        let p = pod(one("app"));
        let mut observed = with_sandbox(vec![running("app", 0)]);
        observed.sandboxes.push(SandboxSeen {
            id: "sb-2".into(),
            ready: true,
            created_at: WALL0 + SEC,
            attempt: 1,
        });
        let a = plan(&p, &observed, T0::new().at(0), &Memory::default());
        assert_eq!(
            a.sandbox,
            SandboxAction::Keep {
                id: "sb-2".into(),
                attempt: 1
            }
        );
        assert!(!a.acts());
    }

    #[test]
    fn a_simulated_runtime_is_planned_without_pod_inputs() {
        let p = pod(one("app"));
        let now = T0::new().at(0);
        let real = sync_of(compute_pod_actions(
            &p,
            &Observed::default(),
            now,
            &Memory::default(),
            REAL,
        ));
        let sim = sync_of(compute_pod_actions(
            &p,
            &Observed::default(),
            now,
            &Memory::default(),
            SIMULATED,
        ));
        assert!(real.prepare_inputs);
        assert!(!sim.prepare_inputs);
        assert_eq!(real.steps, sim.steps);
    }

    // Init containers.

    #[test]
    fn init_containers_start_one_at_a_time_and_hold_back_the_app_containers() {
        let p = pod(json!({
            "initContainers": [{"name": "one", "image": "busybox"}, {"name": "two", "image": "busybox"}],
            "containers": [{"name": "app", "image": "busybox"}],
        }));
        let a = plan(
            &p,
            &with_sandbox(vec![]),
            T0::new().at(0),
            &Memory::default(),
        );
        assert_eq!(starts(&a), [("one".to_string(), Role::Init, 0)]);
        assert!(!a.initialized);

        let a = plan(
            &p,
            &with_sandbox(vec![running("one", 0)]),
            T0::new().at(0),
            &Memory::default(),
        );
        assert!(a.steps.is_empty(), "{:?}", a.steps);
        assert!(!a.initialized);
    }

    #[test]
    fn the_next_init_container_starts_when_the_previous_succeeded() {
        let p = pod(json!({
            "initContainers": [{"name": "one", "image": "busybox"}, {"name": "two", "image": "busybox"}],
            "containers": [{"name": "app", "image": "busybox"}],
        }));
        let a = plan(
            &p,
            &with_sandbox(vec![exited("one", 0, 0, 1)]),
            T0::new().at(0),
            &Memory::default(),
        );
        assert_eq!(starts(&a), [("two".to_string(), Role::Init, 0)]);
        let a = plan(
            &p,
            &with_sandbox(vec![exited("one", 0, 0, 1), exited("two", 0, 0, 1)]),
            T0::new().at(0),
            &Memory::default(),
        );
        assert_eq!(starts(&a), [("app".to_string(), Role::Regular, 0)]);
        assert!(a.initialized);
    }

    #[test]
    fn a_failed_init_container_is_retried_unless_the_policy_is_never() {
        let spec = |policy: &str| {
            pod(json!({
                "restartPolicy": policy,
                "initContainers": [{"name": "one", "image": "busybox"}],
                "containers": [{"name": "app", "image": "busybox"}],
            }))
        };
        let observed = with_sandbox(vec![exited("one", 0, 1, 1)]);
        let now = T0::new().at(0);
        for policy in ["Always", "OnFailure"] {
            let a = plan(&spec(policy), &observed, now, &Memory::default());
            assert_eq!(starts(&a), [("one".to_string(), Role::Init, 1)], "{policy}");
        }
        let never = spec("Never");
        let a = plan(&never, &observed, now, &Memory::default());
        assert!(a.steps.is_empty());
        assert!(!a.initialized);
        let st = status(&never, &Memory::default(), &observed.containers, false);
        assert_eq!(st["phase"], "Failed");
        assert_eq!(
            st["initContainerStatuses"][0]["state"]["terminated"]["reason"],
            "Error"
        );
    }

    #[test]
    fn a_succeeded_init_container_is_not_run_again_under_restart_policy_always() {
        let p = pod(json!({
            "initContainers": [{"name": "one", "image": "busybox"}],
            "containers": [{"name": "app", "image": "busybox"}],
        }));
        let observed = with_sandbox(vec![exited("one", 0, 0, 1), running("app", 0)]);
        let a = plan(&p, &observed, T0::new().at(0), &Memory::default());
        assert!(a.steps.is_empty(), "{:?}", a.steps);
        let st = status(&p, &Memory::default(), &observed.containers, true);
        assert_eq!(
            st["initContainerStatuses"][0]["state"]["terminated"]["reason"],
            "Completed"
        );
        assert_eq!(st["initContainerStatuses"][0]["ready"], true);
        assert_eq!(st["phase"], "Running");
    }

    #[test]
    fn an_init_container_created_but_not_started_is_started() {
        let p = pod(json!({
            "initContainers": [{"name": "one", "image": "busybox"}],
            "containers": [{"name": "app", "image": "busybox"}],
        }));
        let observed = with_sandbox(vec![seen("one", 0, State::Created)]);
        let a = plan(&p, &observed, T0::new().at(0), &Memory::default());
        assert_eq!(
            a.steps,
            [Step::StartCreated {
                id: "one-0".into(),
                name: "one".into()
            }]
        );
        assert!(!a.initialized);
    }

    #[test]
    fn a_pending_pod_shows_its_init_containers_and_app_containers_waiting() {
        let p = pod(json!({
            "initContainers": [{"name": "one", "image": "busybox"}],
            "containers": [{"name": "app", "image": "busybox"}],
        }));
        let observed = [running("one", 0)];
        let st = status(&p, &Memory::default(), &observed, false);
        assert_eq!(st["phase"], "Pending");
        assert_eq!(
            condition(&st, "Initialized"),
            ("False".into(), "ContainersNotInitialized".into())
        );
        assert_eq!(
            st["containerStatuses"][0]["state"]["waiting"]["reason"],
            "ContainerCreating"
        );
        assert_eq!(st["initContainerStatuses"][0]["ready"], false);
    }

    // Restart policies.

    #[test]
    fn restart_policy_always_restarts_a_container_that_succeeded() {
        let p = pod(one("app"));
        let a = plan(
            &p,
            &with_sandbox(vec![exited("app", 0, 0, 3)]),
            T0::new().at(0),
            &Memory::default(),
        );
        assert_eq!(starts(&a), [("app".to_string(), Role::Regular, 1)]);
    }

    #[test]
    fn restart_policy_on_failure_restarts_only_a_failed_container() {
        let p = pod(json!({"restartPolicy": "OnFailure", "containers": [
            {"name": "ok", "image": "busybox"},
            {"name": "bad", "image": "busybox"},
        ]}));
        let observed = with_sandbox(vec![exited("ok", 0, 0, 3), exited("bad", 0, 2, 3)]);
        let a = plan(&p, &observed, T0::new().at(0), &Memory::default());
        assert_eq!(starts(&a), [("bad".to_string(), Role::Regular, 1)]);
    }

    #[test]
    fn restart_policy_never_restarts_nothing_and_the_pod_fails_when_one_failed() {
        let p = pod(json!({"restartPolicy": "Never", "containers": [
            {"name": "ok", "image": "busybox"},
            {"name": "bad", "image": "busybox"},
        ]}));
        let observed = with_sandbox(vec![exited("ok", 0, 0, 3), exited("bad", 0, 2, 3)]);
        let a = plan(&p, &observed, T0::new().at(0), &Memory::default());
        assert!(a.steps.is_empty());
        let st = status(&p, &Memory::default(), &observed.containers, true);
        assert_eq!(st["phase"], "Failed");
        assert_eq!(
            condition(&st, "Ready"),
            ("False".into(), "PodCompleted".into())
        );
        assert_eq!(
            st["containerStatuses"][1]["state"]["terminated"]["exitCode"],
            2
        );
    }

    #[test]
    fn a_pod_whose_containers_all_succeeded_under_never_has_succeeded() {
        let p = pod(
            json!({"restartPolicy": "Never", "containers": [{"name": "job", "image": "busybox"}]}),
        );
        let observed = [exited("job", 0, 0, 3)];
        let st = status(&p, &Memory::default(), &observed, true);
        assert_eq!(st["phase"], "Succeeded");
        assert_eq!(
            condition(&st, "PodReadyToStartContainers"),
            ("False".into(), String::new())
        );
    }

    #[test]
    fn a_finished_pod_stops_what_still_runs_and_starts_nothing() {
        let mut p = pod(one("app"));
        p.status = Some(k8s_openapi::api::core::v1::PodStatus {
            phase: Some("Succeeded".into()),
            ..Default::default()
        });
        let observed = with_sandbox(vec![running("app", 0)]);
        assert_eq!(
            compute_pod_actions(&p, &observed, T0::new().at(0), &Memory::default(), REAL),
            PodActions::StopFinished {
                containers: vec!["app-0".into()],
                sandboxes: vec!["sb-1".into()],
            }
        );
    }

    // Back-off.

    #[test]
    fn the_first_restart_is_immediate_and_starts_a_ten_second_back_off() {
        let t0 = T0::new();
        let p = pod(one("app"));
        let a = plan(
            &p,
            &with_sandbox(vec![exited("app", 0, 1, 1)]),
            t0.at(0),
            &Memory::default(),
        );
        match &a.steps[..] {
            [Step::Start(s)] => assert_eq!(
                s.backoff,
                Some(Backoff {
                    delay: BACKOFF_START,
                    restarted_at: t0.at(0).at
                })
            ),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_container_crashing_again_waits_out_its_back_off_in_crash_loop_back_off() {
        let t0 = T0::new();
        let p = pod(one("app"));
        let mut memory = Memory::default();
        memory.backoff.insert(
            "app".into(),
            Backoff {
                delay: Duration::from_secs(10),
                restarted_at: t0.at(0).at,
            },
        );
        let observed = with_sandbox(vec![exited("app", 0, 1, 1), exited("app", 1, 1, 2)]);
        let a = plan(&p, &observed, t0.at(9), &memory);
        assert!(a.steps.is_empty(), "{:?}", a.steps);
        let st = pod_status(
            &p,
            &memory,
            StatusInput {
                host_ip: "192.0.2.10",
                pod_ip: Some("10.42.0.7"),
                containers: &observed.containers,
                initialized: true,
                now: t0.at(9),
            },
        );
        let c = &st["containerStatuses"][0];
        assert_eq!(c["state"]["waiting"]["reason"], "CrashLoopBackOff");
        assert_eq!(
            c["state"]["waiting"]["message"],
            "back-off 10s restarting failed container=app pod=web_shop(u-1)"
        );
        assert_eq!(c["restartCount"], 1);
        assert_eq!(c["lastState"]["terminated"]["exitCode"], 1);

        let a = plan(&p, &observed, t0.at(10), &memory);
        assert_eq!(starts(&a), [("app".to_string(), Role::Regular, 2)]);
    }

    #[test]
    fn back_off_doubles_at_each_restart_up_to_five_minutes() {
        let t0 = T0::new();
        let p = pod(one("app"));
        let mut memory = Memory::default();
        let mut secs = 0;
        let mut delays = vec![];
        for attempt in 0..8 {
            let observed = with_sandbox(vec![exited("app", attempt, 1, 1)]);
            // Not a second before the back-off is over.
            if let Some(b) = memory.backoff.get("app") {
                let early = secs + b.delay.as_secs() - 1;
                assert!(plan(&p, &observed, t0.at(early), &memory).steps.is_empty());
                secs += b.delay.as_secs();
            }
            let a = plan(&p, &observed, t0.at(secs), &memory);
            assert_eq!(
                starts(&a),
                [("app".to_string(), Role::Regular, attempt + 1)]
            );
            remember(&mut memory, &a);
            delays.push(memory.backoff["app"].delay.as_secs());
        }
        assert_eq!(delays, [10, 20, 40, 80, 160, 300, 300, 300]);
    }

    #[test]
    fn back_off_starts_afresh_after_a_container_ran_ten_minutes() {
        let t0 = T0::new();
        let p = pod(one("app"));
        let mut memory = Memory::default();
        memory.backoff.insert(
            "app".into(),
            Backoff {
                delay: Duration::from_secs(160),
                restarted_at: t0.at(0).at,
            },
        );
        // It ran 600 s: restarted at once, back to 10 s.
        let a = plan(
            &p,
            &with_sandbox(vec![exited("app", 3, 1, 600)]),
            t0.at(1),
            &memory,
        );
        remember(&mut memory, &a);
        assert_eq!(starts(&a), [("app".to_string(), Role::Regular, 4)]);
        assert_eq!(memory.backoff["app"].delay, BACKOFF_START);
        // One that ran 599 s waits.
        memory.backoff.insert(
            "app".into(),
            Backoff {
                delay: Duration::from_secs(160),
                restarted_at: t0.at(0).at,
            },
        );
        let a = plan(
            &p,
            &with_sandbox(vec![exited("app", 3, 1, 599)]),
            t0.at(1),
            &memory,
        );
        assert!(a.steps.is_empty());
    }

    #[test]
    fn a_container_whose_image_pull_failed_waits_for_the_pull_back_off() {
        let t0 = T0::new();
        let p = pod(one("app"));
        let mut memory = Memory::default();
        memory.pull_backoff.insert("app".into(), t0.at(10).at);
        memory.waiting.insert(
            "app".into(),
            Waiting::new("ErrImagePull", "failed to pull and unpack image \"nope\""),
        );
        let a = plan(&p, &with_sandbox(vec![]), t0.at(5), &memory);
        assert!(a.steps.is_empty());
        let st = status(&p, &memory, &[], true);
        assert_eq!(
            st["containerStatuses"][0]["state"]["waiting"],
            json!({"reason": "ErrImagePull", "message": "failed to pull and unpack image \"nope\""})
        );
        let a = plan(&p, &with_sandbox(vec![]), t0.at(10), &memory);
        assert_eq!(starts(&a), [("app".to_string(), Role::Regular, 0)]);
    }

    #[test]
    fn a_container_created_but_not_started_is_started() {
        let p = pod(one("app"));
        let observed = with_sandbox(vec![seen("app", 0, State::Created)]);
        let a = plan(&p, &observed, T0::new().at(0), &Memory::default());
        assert_eq!(
            a.steps,
            [Step::StartCreated {
                id: "app-0".into(),
                name: "app".into()
            }]
        );
    }

    // Spec changes and probes.

    #[test]
    fn a_container_whose_spec_changed_is_killed_with_the_pods_grace_period() {
        let p = pod(
            json!({"terminationGracePeriodSeconds": 1, "containers": [{"name": "app", "image": "busybox:2"}]}),
        );
        let mut old = running("app", 0);
        old.hash = "old-hash".into();
        let a = plan(
            &p,
            &with_sandbox(vec![old]),
            T0::new().at(0),
            &Memory::default(),
        );
        assert_eq!(
            kills(&a),
            [KillContainer {
                id: "app-0".into(),
                name: "app".into(),
                // Never under the minimal shutdown window.
                grace_seconds: MIN_STOP_SECONDS,
                reason: KillReason::SpecChanged,
            }]
        );
        assert_eq!(
            KillReason::SpecChanged.message("app"),
            "Container app definition changed, will be restarted"
        );
    }

    #[test]
    fn a_container_running_its_current_spec_is_left_alone() {
        let p = pod(one("app"));
        let mut cur = running("app", 0);
        cur.hash = spec::spec_hash(&p.spec.as_ref().unwrap().containers[0]);
        let a = plan(
            &p,
            &with_sandbox(vec![cur]),
            T0::new().at(0),
            &Memory::default(),
        );
        assert!(a.steps.is_empty());
    }

    fn probed(probes: Value) -> Pod {
        let mut c = json!({"name": "app", "image": "busybox"});
        for (k, v) in probes.as_object().unwrap() {
            c[k] = v.clone();
        }
        pod(json!({"terminationGracePeriodSeconds": 45, "containers": [c]}))
    }

    #[test]
    fn a_failed_liveness_probe_kills_the_container_with_the_probes_grace_period() {
        let t0 = T0::new();
        let p = probed(json!({"livenessProbe": {
            "exec": {"command": ["true"]}, "terminationGracePeriodSeconds": 5,
        }}));
        let mut memory = Memory::default();
        verdict(&mut memory, "app-0", Kind::Liveness, false, &t0);
        let a = plan(
            &p,
            &with_sandbox(vec![running("app", 0)]),
            t0.at(0),
            &memory,
        );
        assert_eq!(
            kills(&a),
            [KillContainer {
                id: "app-0".into(),
                name: "app".into(),
                grace_seconds: 5,
                reason: KillReason::LivenessFailed,
            }]
        );
        // A passing one does not.
        verdict(&mut memory, "app-0", Kind::Liveness, true, &t0);
        let a = plan(
            &p,
            &with_sandbox(vec![running("app", 0)]),
            t0.at(0),
            &memory,
        );
        assert!(a.steps.is_empty());
    }

    #[test]
    fn a_failed_startup_probe_kills_and_liveness_is_not_heard_before_startup_succeeds() {
        let t0 = T0::new();
        let p = probed(json!({
            "startupProbe": {"exec": {"command": ["true"]}},
            "livenessProbe": {"exec": {"command": ["true"]}},
        }));
        let mut memory = Memory::default();
        // Liveness failing before startup succeeded: ignored.
        verdict(&mut memory, "app-0", Kind::Liveness, false, &t0);
        let observed = with_sandbox(vec![running("app", 0)]);
        assert!(plan(&p, &observed, t0.at(0), &memory).steps.is_empty());
        verdict(&mut memory, "app-0", Kind::Startup, false, &t0);
        let k = kills(&plan(&p, &observed, t0.at(0), &memory));
        assert_eq!(k.len(), 1);
        assert_eq!(k[0].reason, KillReason::StartupFailed);
        assert_eq!(k[0].grace_seconds, 45);
    }

    #[test]
    fn a_failed_readiness_probe_keeps_the_container_but_not_ready() {
        let t0 = T0::new();
        let p = probed(json!({"readinessProbe": {"exec": {"command": ["true"]}}}));
        let observed = with_sandbox(vec![running("app", 0)]);
        let mut memory = Memory::default();
        verdict(&mut memory, "app-0", Kind::Readiness, false, &t0);
        assert!(plan(&p, &observed, t0.at(0), &memory).steps.is_empty());
        let st = status(&p, &memory, &observed.containers, true);
        assert_eq!(st["phase"], "Running");
        assert_eq!(st["containerStatuses"][0]["ready"], false);
        assert_eq!(st["containerStatuses"][0]["started"], true);
        assert_eq!(
            condition(&st, "Ready"),
            ("False".into(), "ContainersNotReady".into())
        );
        verdict(&mut memory, "app-0", Kind::Readiness, true, &t0);
        let st = status(&p, &memory, &observed.containers, true);
        assert_eq!(st["containerStatuses"][0]["ready"], true);
        assert_eq!(condition(&st, "Ready"), ("True".into(), String::new()));
        assert_eq!(
            condition(&st, "ContainersReady"),
            ("True".into(), String::new())
        );
    }

    #[test]
    fn a_container_with_a_startup_probe_is_not_started_until_it_passes() {
        let t0 = T0::new();
        let p = probed(json!({"startupProbe": {"exec": {"command": ["true"]}}}));
        let observed = with_sandbox(vec![running("app", 0)]);
        let mut memory = Memory::default();
        let st = status(&p, &memory, &observed.containers, true);
        assert_eq!(st["containerStatuses"][0]["started"], false);
        assert_eq!(st["containerStatuses"][0]["ready"], false);
        verdict(&mut memory, "app-0", Kind::Startup, true, &t0);
        let st = status(&p, &memory, &observed.containers, true);
        assert_eq!(st["containerStatuses"][0]["started"], true);
        assert_eq!(st["containerStatuses"][0]["ready"], true);
    }

    #[test]
    fn only_the_startup_probe_is_due_until_it_succeeds_then_liveness_and_readiness() {
        let t0 = T0::new();
        let p = probed(json!({
            "startupProbe": {"exec": {"command": ["true"]}},
            "livenessProbe": {"exec": {"command": ["true"]}},
            "readinessProbe": {"exec": {"command": ["true"]}},
        }));
        let observed = with_sandbox(vec![running("app", 0)]);
        let mut memory = Memory::default();
        let kinds = |memory: &Memory| -> Vec<Kind> {
            due_probes(&p, &observed, t0.at(0), memory)
                .into_iter()
                .map(|d| d.kind)
                .collect()
        };
        assert_eq!(kinds(&memory), [Kind::Startup]);
        verdict(&mut memory, "app-0", Kind::Startup, true, &t0);
        assert_eq!(kinds(&memory), [Kind::Liveness, Kind::Readiness]);
    }

    #[test]
    fn a_probe_waits_its_initial_delay_and_then_its_period() {
        let t0 = T0::new();
        let p = probed(json!({"livenessProbe": {
            "exec": {"command": ["true"]}, "initialDelaySeconds": 5, "periodSeconds": 3,
        }}));
        // The container started at t0 (wall) on the clocks of T0.
        let observed = with_sandbox(vec![running("app", 0)]);
        let mut memory = Memory::default();
        assert!(due_probes(&p, &observed, t0.at(4), &memory).is_empty());
        let due = due_probes(&p, &observed, t0.at(5), &memory);
        assert_eq!(due.len(), 1);
        assert_eq!(due[0].started, t0.0);
        let mut state = ProbeState::new();
        state.last_run = Some(t0.at(5).at);
        memory.probes.insert(
            ("app-0".into(), Kind::Liveness),
            ProbeRecord {
                state,
                started: due[0].started,
            },
        );
        assert!(due_probes(&p, &observed, t0.at(7), &memory).is_empty());
        assert_eq!(due_probes(&p, &observed, t0.at(8), &memory).len(), 1);
    }

    #[test]
    fn no_probe_is_due_before_the_pod_is_initialized_or_for_a_stale_spec() {
        let t0 = T0::new();
        let p = pod(json!({
            "initContainers": [{"name": "init", "image": "busybox"}],
            "containers": [{"name": "app", "image": "busybox", "livenessProbe": {"exec": {"command": ["true"]}}}],
        }));
        let observed = with_sandbox(vec![running("init", 0), running("app", 0)]);
        assert!(due_probes(&p, &observed, t0.at(0), &Memory::default()).is_empty());
        let mut old = running("app", 0);
        old.hash = "old-hash".into();
        let observed = with_sandbox(vec![exited("init", 0, 0, 1), old]);
        assert!(due_probes(&p, &observed, t0.at(0), &Memory::default()).is_empty());
    }

    // Graceful deletion.

    fn deleted(mut p: Pod, grace: Option<i64>) -> Pod {
        p.metadata.deletion_timestamp = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
            k8s_openapi::jiff::Timestamp::from_second(1_700_000_000).unwrap(),
        ));
        p.metadata.deletion_grace_period_seconds = grace;
        p
    }

    #[test]
    fn a_deleted_pod_is_terminated_with_the_deletions_grace_period_and_its_pre_stop_hooks() {
        let p = deleted(
            pod(json!({"terminationGracePeriodSeconds": 60, "containers": [
                {"name": "app", "image": "busybox",
                 "lifecycle": {"preStop": {"exec": {"command": ["sleep", "1"]}}}},
                {"name": "sidecar", "image": "busybox"},
            ]})),
            Some(7),
        );
        let observed = with_sandbox(vec![
            running("app", 0),
            running("sidecar", 0),
            exited("app", 1, 1, 1),
        ]);
        let PodActions::Terminate(t) =
            compute_pod_actions(&p, &observed, T0::new().at(0), &Memory::default(), REAL)
        else {
            panic!("expected a termination");
        };
        assert_eq!(t.grace_seconds, 7);
        assert_eq!(t.sandboxes, ["sb-1"]);
        let stops: Vec<(&str, bool)> = t
            .containers
            .iter()
            .map(|s| (s.id.as_str(), s.pre_stop().is_some()))
            .collect();
        assert_eq!(stops, [("app-0", true), ("sidecar-0", false)]);
    }

    fn evicted(message: &str) -> Memory {
        Memory {
            eviction: Some(Eviction::now(message)),
            ..Default::default()
        }
    }

    #[test]
    fn an_evicted_pod_is_killed_with_the_eviction_grace_period_whatever_its_spec_says() {
        let p = pod(
            json!({"terminationGracePeriodSeconds": 60, "restartPolicy": "Always",
            "containers": [
                {"name": "app", "image": "busybox",
                 "lifecycle": {"preStop": {"exec": {"command": ["sleep", "1"]}}}},
            ]}),
        );
        let observed = with_sandbox(vec![running("app", 0)]);
        let memory = evicted("The node reclaimed it");
        let PodActions::Evict {
            termination,
            initialized,
        } = compute_pod_actions(&p, &observed, T0::new().at(0), &memory, REAL)
        else {
            panic!("expected an eviction");
        };
        assert_eq!(termination.grace_seconds, EVICTION_GRACE_SECONDS);
        assert_eq!(termination.sandboxes, ["sb-1"]);
        assert_eq!(termination.containers.len(), 1);
        assert!(termination.containers[0].pre_stop().is_some());
        assert!(initialized);
        // Once killed, nothing restarts it: the plan is the eviction
        // again, with nothing left to stop.
        let after = with_sandbox(vec![exited("app", 0, 137, 5)]);
        let PodActions::Evict { termination, .. } =
            compute_pod_actions(&p, &after, T0::new().at(1), &memory, REAL)
        else {
            panic!("expected an eviction");
        };
        assert!(termination.containers.is_empty());
    }

    #[test]
    fn a_deletion_wins_over_an_eviction_and_a_finished_pod_is_not_evicted_again() {
        let memory = evicted("m");
        let gone = deleted(pod(one("app")), Some(5));
        let observed = with_sandbox(vec![running("app", 0)]);
        assert!(matches!(
            compute_pod_actions(&gone, &observed, T0::new().at(0), &memory, REAL),
            PodActions::Terminate(_)
        ));
        let mut failed = pod(one("app"));
        failed.status = Some(k8s_openapi::api::core::v1::PodStatus {
            phase: Some("Failed".into()),
            ..Default::default()
        });
        assert!(matches!(
            compute_pod_actions(&failed, &observed, T0::new().at(0), &memory, REAL),
            PodActions::StopFinished { .. }
        ));
    }

    #[test]
    fn an_evicted_pods_status_is_failed_evicted_with_kubelets_disruption_condition() {
        let p = pod(
            json!({"restartPolicy": "Always", "containers": [{"name": "app", "image": "busybox"}]}),
        );
        let msg =
            "The node was low on resource: memory. Threshold quantity: 100Mi, available: 50Mi. ";
        let st = status(&p, &evicted(msg), &[exited("app", 0, 137, 5)], true);
        assert_eq!(st["phase"], "Failed");
        assert_eq!(st["reason"], "Evicted");
        assert_eq!(st["message"], msg);
        let dt = st["conditions"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["type"] == "DisruptionTarget")
            .expect("a DisruptionTarget condition");
        assert_eq!(dt["status"], "True");
        assert_eq!(dt["reason"], "TerminationByKubelet");
        assert_eq!(dt["message"], msg);
        assert_eq!(condition(&st, "Ready").0, "False");
        // The container shows how it ended, not a restart to come.
        assert_eq!(
            st["containerStatuses"][0]["state"]["terminated"]["exitCode"],
            137
        );
        // A pod that is not evicted has neither.
        let plain = status(&p, &Memory::default(), &[running("app", 0)], true);
        assert_eq!(plain["phase"], "Running");
        assert!(plain.get("reason").is_none());
        assert!(plain["conditions"]
            .as_array()
            .unwrap()
            .iter()
            .all(|c| c["type"] != "DisruptionTarget"));
    }

    #[test]
    fn the_grace_period_falls_back_to_the_spec_then_thirty_seconds() {
        let with_spec = deleted(
            pod(json!({"terminationGracePeriodSeconds": 12, "containers": []})),
            None,
        );
        assert_eq!(termination_grace(&with_spec), 12);
        let bare = deleted(pod(json!({"containers": []})), None);
        assert_eq!(termination_grace(&bare), DEFAULT_GRACE_SECONDS);
        let forced = deleted(
            pod(json!({"terminationGracePeriodSeconds": 12, "containers": []})),
            Some(0),
        );
        assert_eq!(termination_grace(&forced), 0);
    }

    #[test]
    fn a_pod_already_terminated_only_waits_for_its_deletion() {
        let p = deleted(pod(one("app")), Some(30));
        let memory = Memory {
            terminating: true,
            ..Default::default()
        };
        let observed = with_sandbox(vec![running("app", 0)]);
        assert_eq!(
            compute_pod_actions(&p, &observed, T0::new().at(0), &memory, REAL),
            PodActions::AwaitDeletion
        );
        assert!(due_probes(&p, &observed, T0::new().at(0), &memory).is_empty());
    }

    // Ephemeral containers.

    #[test]
    fn an_ephemeral_container_waits_for_its_target_and_then_joins_it() {
        let p = pod(json!({
            "containers": [{"name": "app", "image": "busybox"}],
            "ephemeralContainers": [{"name": "debugger", "image": "busybox", "targetContainerName": "app"}],
        }));
        let a = plan(
            &p,
            &with_sandbox(vec![]),
            T0::new().at(0),
            &Memory::default(),
        );
        assert_eq!(starts(&a), [("app".to_string(), Role::Regular, 0)]);
        assert_eq!(
            a.waiting,
            [(
                "debugger".to_string(),
                Waiting::new(
                    "CreateContainerConfigError",
                    "unable to find target container app"
                )
            )]
        );
        let a = plan(
            &p,
            &with_sandbox(vec![running("app", 0)]),
            T0::new().at(0),
            &Memory::default(),
        );
        match &a.steps[..] {
            [Step::Start(s)] => {
                assert_eq!(s.role, Role::Ephemeral);
                assert_eq!(s.pid_target.as_deref(), Some("app-0"));
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn an_ephemeral_container_is_never_restarted_and_never_ready() {
        let p = pod(json!({
            "containers": [{"name": "app", "image": "busybox"}],
            "ephemeralContainers": [{"name": "debugger", "image": "busybox"}],
        }));
        let observed = with_sandbox(vec![running("app", 0), exited("debugger", 0, 1, 1)]);
        let a = plan(&p, &observed, T0::new().at(0), &Memory::default());
        assert!(a.steps.is_empty());
        let st = status(&p, &Memory::default(), &observed.containers, true);
        let e = &st["ephemeralContainerStatuses"][0];
        assert_eq!(e["state"]["terminated"]["exitCode"], 1);
        assert_eq!(e["ready"], false);
        assert_eq!(st["phase"], "Running");
    }

    // Status details.

    #[test]
    fn status_reports_restarts_the_previous_instance_ips_and_qos() {
        let p = pod(one("app"));
        let observed = [exited("app", 0, 1, 1), running("app", 1)];
        let st = status(&p, &Memory::default(), &observed, true);
        let c = &st["containerStatuses"][0];
        assert_eq!(c["restartCount"], 1);
        assert_eq!(c["containerID"], "containerd://app-1");
        assert_eq!(c["state"]["running"]["startedAt"], "2023-11-14T22:13:20Z");
        assert_eq!(c["lastState"]["terminated"]["reason"], "Error");
        assert_eq!(
            c["lastState"]["terminated"]["finishedAt"],
            "2023-11-14T22:13:21Z"
        );
        assert_eq!(st["podIP"], "10.42.0.7");
        assert_eq!(st["hostIP"], "192.0.2.10");
        assert_eq!(st["qosClass"], "BestEffort");
        assert_eq!(st["phase"], "Running");
    }

    /// A pod declaring a dependency, with its DependenciesReady condition
    /// (`None`: not written yet).
    fn declaring(ready: Option<&str>) -> Pod {
        let mut p = pod(
            json!({"initContainers": [{"name": "migrate", "image": "busybox"}],
                               "containers": [{"name": "app", "image": "busybox"}]}),
        );
        p.metadata.annotations =
            Some([("skiff.io/depends-on".to_string(), "db".to_string())].into());
        if let Some(st) = ready {
            p.status = Some(
                serde_json::from_value(json!({"conditions": [
                    {"type": "skiff.io/DependenciesReady", "status": st, "message": "waiting for shop/db (no ready endpoint)"},
                ]}))
                .unwrap(),
            );
        }
        p
    }

    #[test]
    fn declared_dependencies_hold_the_first_start_of_the_containers_only() {
        let t0 = T0::new();
        let done = exited("migrate", 0, 0, 1);
        // Init containers run; the app waits, with the condition's message.
        for ready in [None, Some("False")] {
            let p = declaring(ready);
            assert_eq!(
                starts(&plan(
                    &p,
                    &with_sandbox(vec![]),
                    t0.at(0),
                    &Memory::default()
                ))
                .len(),
                1
            );
            let a = plan(
                &p,
                &with_sandbox(vec![done.clone()]),
                t0.at(1),
                &Memory::default(),
            );
            assert!(starts(&a).is_empty(), "{ready:?}: {:?}", starts(&a));
            let st = status(&p, &Memory::default(), std::slice::from_ref(&done), true);
            let w = &st["containerStatuses"][0]["state"]["waiting"];
            assert_eq!(w["reason"], "WaitingForDependency");
            if ready.is_some() {
                assert_eq!(w["message"], "waiting for shop/db (no ready endpoint)");
            }
        }
        // Ready: it starts.
        let p = declaring(Some("True"));
        let a = plan(
            &p,
            &with_sandbox(vec![done.clone()]),
            t0.at(1),
            &Memory::default(),
        );
        assert_eq!(starts(&a), vec![("app".into(), Role::Regular, 0)]);
        // Once started, a dependency going away holds nothing: a restart
        // goes ahead.
        let p = declaring(Some("False"));
        let a = plan(
            &p,
            &with_sandbox(vec![done.clone(), exited("app", 0, 1, 30)]),
            t0.at(40),
            &Memory::default(),
        );
        assert_eq!(starts(&a).len(), 1, "{:?}", starts(&a));
        // Without a declaration nothing waits.
        let a = plan(
            &pod(one("app")),
            &with_sandbox(vec![]),
            t0.at(0),
            &Memory::default(),
        );
        assert_eq!(starts(&a).len(), 1);
    }

    #[test]
    fn other_components_conditions_are_kept_and_readiness_gates_hold_ready() {
        let mut p = pod(json!({"containers": [{"name": "app", "image": "busybox"}],
                               "readinessGates": [{"conditionType": "example.com/lb"}]}));
        p.status = Some(
            serde_json::from_value(json!({"conditions": [
                {"type": "skiff.io/DependenciesReady", "status": "True", "lastTransitionTime": "2023-01-01T00:00:05Z"},
                {"type": "DisruptionTarget", "status": "True", "reason": "EvictionByEvictionAPI"},
            ]}))
            .unwrap(),
        );
        let st = status(&p, &Memory::default(), &[running("app", 0)], true);
        assert_eq!(condition(&st, "skiff.io/DependenciesReady").0, "True");
        assert_eq!(
            condition(&st, "DisruptionTarget").1,
            "EvictionByEvictionAPI"
        );
        // The gate's condition does not exist: containers ready, pod not.
        assert_eq!(condition(&st, "ContainersReady").0, "True");
        assert_eq!(
            condition(&st, "Ready"),
            ("False".into(), "ReadinessGatesNotReady".into())
        );
        let ready = st["conditions"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["type"] == "Ready")
            .unwrap()
            .clone();
        assert_eq!(
            ready["message"],
            "corresponding condition of pod readiness gate \"example.com/lb\" does not exist."
        );
        // The gate's condition True: Ready.
        p.status
            .as_mut()
            .unwrap()
            .conditions
            .as_mut()
            .unwrap()
            .push(
                serde_json::from_value(json!({"type": "example.com/lb", "status": "True"}))
                    .unwrap(),
            );
        let st = status(&p, &Memory::default(), &[running("app", 0)], true);
        assert_eq!(condition(&st, "Ready").0, "True");
        // The agent's own conditions are not doubled.
        let n = st["conditions"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|c| c["type"] == "Ready")
            .count();
        assert_eq!(n, 1);
    }

    #[test]
    fn conditions_keep_their_transition_time_while_unchanged() {
        let mut p = pod(one("app"));
        p.status = Some(
            serde_json::from_value(json!({
                "startTime": "2023-01-01T00:00:00Z",
                "conditions": [
                    {"type": "Ready", "status": "True", "lastTransitionTime": "2023-01-01T00:00:01Z"},
                    {"type": "Initialized", "status": "False", "lastTransitionTime": "2023-01-01T00:00:02Z"},
                    {"type": "PodScheduled", "status": "True", "lastTransitionTime": "2023-01-01T00:00:00Z"},
                ],
            }))
            .unwrap(),
        );
        let st = status(&p, &Memory::default(), &[running("app", 0)], true);
        let time = |t: &str| {
            st["conditions"]
                .as_array()
                .unwrap()
                .iter()
                .find(|c| c["type"] == t)
                .unwrap()["lastTransitionTime"]
                .clone()
        };
        assert_eq!(time("Ready"), "2023-01-01T00:00:01Z");
        // Initialized went from False to True: now.
        assert_eq!(time("Initialized"), "2023-11-14T22:13:20Z");
        assert_eq!(time("PodScheduled"), "2023-01-01T00:00:00Z");
        assert_eq!(st["startTime"], "2023-01-01T00:00:00Z");
    }

    #[test]
    fn a_container_that_could_not_start_shows_why() {
        let p = pod(one("app"));
        let mut memory = Memory::default();
        memory.waiting.insert(
            "app".into(),
            Waiting::new("CreateContainerConfigError", "secret \"db\" not found"),
        );
        let st = status(&p, &memory, &[], true);
        assert_eq!(
            st["containerStatuses"][0]["state"]["waiting"],
            json!({"reason": "CreateContainerConfigError", "message": "secret \"db\" not found"})
        );
        assert_eq!(st["phase"], "Pending");
    }

    // Garbage collection and pacing.

    #[test]
    fn dead_instances_beyond_the_current_and_previous_are_removed() {
        let containers = vec![
            exited("app", 0, 1, 1),
            exited("app", 1, 1, 1),
            exited("app", 2, 1, 1),
            running("app", 3),
            exited("other", 0, 0, 1),
        ];
        assert_eq!(dead_to_remove(&containers), ["app-0", "app-1"]);
    }

    #[test]
    fn an_idle_pod_is_looked_at_every_resync_every_second_with_probes_or_when_the_runtime_says() {
        let plain = pod(one("app")).spec.unwrap();
        let probed = probed(json!({"readinessProbe": {"exec": {"command": ["true"]}}}))
            .spec
            .unwrap();
        let resync = Duration::from_secs(10);
        assert_eq!(idle_wait(&plain, resync, None), resync);
        assert_eq!(idle_wait(&probed, resync, None), Duration::from_secs(1));
        assert_eq!(
            idle_wait(&plain, resync, Some(Duration::from_secs(3))),
            Duration::from_millis(3010)
        );
        assert_eq!(idle_wait(&plain, resync, Some(Duration::MAX)), resync);
    }

    #[test]
    fn an_allocation_a_running_container_lacks_is_applied_in_place_or_by_a_restart() {
        let t0 = T0::new();
        let p = pod(json!({"containers": [{"name": "app", "image": "busybox",
            "resizePolicy": [{"resourceName": "memory", "restartPolicy": "RestartContainer"}],
            "resources": {"requests": {"cpu": "250m"}, "limits": {"cpu": "1", "memory": "64Mi"}}}]}));
        let obs = with_sandbox(vec![running("app", 0)]);
        let res = |v: Value| -> k8s_openapi::api::core::v1::ResourceRequirements {
            serde_json::from_value(v).unwrap()
        };
        let mut memory = Memory::default();
        // Unknown (not started by this worker, nothing reported): nothing.
        assert!(plan(&p, &obs, t0.at(0), &memory).steps.is_empty());
        // As allocated: nothing.
        memory.resize.actual.insert(
            "app-0".into(),
            res(json!({"requests": {"cpu": "250m"}, "limits": {"cpu": "1", "memory": "64Mi"}})),
        );
        assert!(plan(&p, &obs, t0.at(0), &memory).steps.is_empty());
        // Less cpu than allocated: CRI's setting, in place.
        memory.resize.actual.insert(
            "app-0".into(),
            res(json!({"requests": {"cpu": "100m"}, "limits": {"cpu": "500m", "memory": "64Mi"}})),
        );
        let a = plan(&p, &obs, t0.at(0), &memory);
        let [Step::Resize(r)] = a.steps.as_slice() else {
            panic!("expected one resize, got {:?}", a.steps);
        };
        assert_eq!(r.id, "app-0");
        let linux = r
            .linux
            .as_ref()
            .expect("a runtime with cgroups gets the setting");
        assert_eq!((linux.cpu_shares, linux.cpu_quota), (256, 100_000));
        assert_eq!(linux.memory_limit_in_bytes, 64 << 20);
        // Simulated containers: bookkeeping only.
        let a = sync_of(compute_pod_actions(&p, &obs, t0.at(0), &memory, SIMULATED));
        assert!(matches!(a.steps.as_slice(), [Step::Resize(r)] if r.linux.is_none()));
        // A memory limit under a RestartContainer policy: a restart.
        memory.resize.actual.insert(
            "app-0".into(),
            res(json!({"requests": {"cpu": "250m"}, "limits": {"cpu": "1", "memory": "32Mi"}})),
        );
        let k = kills(&plan(&p, &obs, t0.at(0), &memory));
        assert_eq!(k.len(), 1);
        assert_eq!(k[0].reason, KillReason::ResizeRestart);
        assert_eq!(
            k[0].reason.message("app"),
            "Container app resize requires restart"
        );
    }

    #[test]
    fn a_resized_container_is_not_replaced_as_a_changed_spec() {
        let t0 = T0::new();
        let small = json!({"containers": [{"name": "app", "image": "busybox",
            "resources": {"limits": {"cpu": "1"}}}]});
        let c: Container = serde_json::from_value(small["containers"][0].clone()).unwrap();
        let mut s = running("app", 0);
        s.hash = spec::spec_hash(&c);
        let big = pod(json!({"containers": [{"name": "app", "image": "busybox",
            "resources": {"limits": {"cpu": "2"}}}]}));
        assert!(kills(&plan(
            &big,
            &with_sandbox(vec![s.clone()]),
            t0.at(0),
            &Memory::default()
        ))
        .is_empty());
        // An image change still replaces it.
        let other = pod(json!({"containers": [{"name": "app", "image": "nginx",
            "resources": {"limits": {"cpu": "1"}}}]}));
        let k = kills(&plan(
            &other,
            &with_sandbox(vec![s]),
            t0.at(0),
            &Memory::default(),
        ));
        assert_eq!(k[0].reason, KillReason::SpecChanged);
    }
}
