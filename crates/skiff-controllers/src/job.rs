//! The Job controller: runs pods until `completions` succeed (at most
//! `parallelism` at once), gives up after `backoffLimit` failures or
//! `activeDeadlineSeconds`, honours `suspend` and Indexed completion mode,
//! reports status and the Complete/Failed conditions, and deletes finished
//! Jobs after `ttlSecondsAfterFinished`.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams, PropagationPolicy};
use kube::ResourceExt;
use serde_json::json;

use crate::common::{self, Expectations};
use crate::controller::Controller;
use crate::framework::Next;
use crate::{Ctx, Error};

const COMPONENT: &str = "job-controller";

pub struct State {
    expectations: Expectations,
}

pub fn register(ctx: &Arc<Ctx>, tasks: &mut tokio::task::JoinSet<()>) {
    let st = Arc::new(State {
        expectations: Expectations::default(),
    });
    let seen = st.clone();
    Controller::new(ctx, "job", &ctx.caches.jobs)
        .watches(&ctx.caches.pods, move |_, old, new| {
            seen.expectations.observe_pod_change("Job", old, new);
            common::owner_keys("Job", old, new)
        })
        .workers(ctx.options.workers)
        .resync(Duration::from_secs(60))
        .run(tasks, st, |c, st, key| async move {
            reconcile(&c, &st, &key).await
        });
}

const INDEX: &str = "batch.kubernetes.io/job-completion-index";

use common::phase;

fn index_of(p: &Pod) -> Option<i32> {
    p.annotations().get(INDEX).and_then(|v| v.parse().ok())
}

/// When a pod finished: its containers' latest finishedAt, else its
/// Ready condition's last transition.
fn finished_time(p: &Pod) -> Option<k8s_openapi::jiff::Timestamp> {
    let st = p.status.as_ref()?;
    st.container_statuses
        .iter()
        .flatten()
        .filter_map(|c| {
            c.state
                .as_ref()?
                .terminated
                .as_ref()?
                .finished_at
                .as_ref()
                .map(|t| t.0)
        })
        .max()
        .or_else(|| {
            st.conditions
                .iter()
                .flatten()
                .find(|c| c.type_ == "Ready")
                .and_then(|c| c.last_transition_time.as_ref().map(|t| t.0))
        })
}

/// The finished condition of a Job ("Complete" or "Failed"), if any.
pub fn finished(job: &Job) -> Option<&str> {
    job.status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find_map(|c| {
            ((c.type_ == "Complete" || c.type_ == "Failed") && c.status == "True")
                .then_some(c.type_.as_str())
        })
}

/// What a Job's pods call for, decided without I/O from the Job, the
/// pods it controls and the time.
#[derive(Debug, Default, PartialEq)]
pub struct Decision {
    /// Pods (or, Indexed, distinct indexes) that succeeded.
    pub succeeded: i32,
    /// Pods that failed.
    pub failed: i32,
    /// Pods still running or pending (not terminating).
    pub active: i32,
    /// Why the Job fails: (reason, message) of its Failed condition.
    pub failure: Option<(&'static str, &'static str)>,
    /// Whether enough pods succeeded.
    pub complete: bool,
    /// How many pods should be active now.
    pub want_active: i32,
    /// How long new pods wait after failures (Kubernetes' pod failure back-off).
    pub backoff_wait: Option<Duration>,
    /// Indexed: the completion indexes that succeeded.
    pub succeeded_indexes: BTreeSet<i32>,
    /// Indexed: the indexes new pods take, lowest first.
    pub free_indexes: Vec<i32>,
    pub indexed: bool,
}

/// The longest wait before a pod replaces a failed one.
const MAX_BACKOFF: Duration = Duration::from_secs(360);

pub fn decide(
    job: &Job,
    pods: &[Arc<Pod>],
    now: k8s_openapi::jiff::Timestamp,
    backoff_base: Duration,
) -> Decision {
    let spec = job.spec.clone().unwrap_or_default();
    let old_status = job.status.clone().unwrap_or_default();
    let indexed = spec.completion_mode.as_deref() == Some("Indexed");
    // Without completions (a work queue) the Job is done once a pod
    // succeeded and the others finished.
    let work_queue = spec.completions.is_none() && !indexed;
    let completions = spec.completions.unwrap_or(1).max(0);
    // An index outside [0, completions) counts for nothing.
    let valid =
        |p: &&Arc<Pod>| !indexed || index_of(p).is_some_and(|i| (0..completions).contains(&i));
    let succeeded_pods: Vec<&Arc<Pod>> = pods
        .iter()
        .filter(|p| phase(p) == "Succeeded")
        .filter(valid)
        .collect();
    let failed_pods: Vec<&Arc<Pod>> = pods.iter().filter(|p| phase(p) == "Failed").collect();
    // Counts never go down, even if finished pods are deleted.
    let failed = (failed_pods.len() as i32).max(old_status.failed.unwrap_or(0));
    let active: Vec<&Arc<Pod>> = pods.iter().filter(|p| common::pod_is_active(p)).collect();
    let active_count = active.len() as i32;
    let succeeded_indexes: BTreeSet<i32> =
        succeeded_pods.iter().filter_map(|p| index_of(p)).collect();
    let succeeded = if indexed {
        succeeded_indexes.len() as i32
    } else {
        (succeeded_pods.len() as i32).max(old_status.succeeded.unwrap_or(0))
    };
    let parallelism = spec.parallelism.unwrap_or(1).max(0);
    let backoff_limit = spec.backoff_limit.unwrap_or(6);
    let start_time = old_status.start_time.as_ref().map(|t| t.0);
    let suspended = spec.suspend == Some(true);

    let on_failure = spec
        .template
        .spec
        .as_ref()
        .and_then(|s| s.restart_policy.as_deref())
        == Some("OnFailure");
    let mut failure = None;
    if failed > backoff_limit
        || (on_failure && past_backoff_limit_on_failure(&active, backoff_limit))
    {
        failure = Some((
            "BackoffLimitExceeded",
            "Job has reached the specified backoff limit",
        ));
    } else if let (Some(deadline), Some(start)) = (spec.active_deadline_seconds, start_time) {
        if start + k8s_openapi::jiff::SignedDuration::from_secs(deadline) <= now && !suspended {
            failure = Some((
                "DeadlineExceeded",
                "Job was active longer than specified deadline",
            ));
        }
    }
    let complete = failure.is_none()
        && if work_queue {
            succeeded >= 1
        } else {
            succeeded >= completions
        };
    let mut want_active = if suspended || failure.is_some() || complete {
        0
    } else if work_queue {
        parallelism
    } else {
        parallelism.min(completions - succeeded).max(0)
    };
    if work_queue && complete && !suspended {
        // The pods still running finish on their own.
        want_active = active_count;
    }
    // After failures, new pods wait: base × 2^(failures − 1), at most 6
    // min; the failures counted are those since the last success.
    let mut backoff_wait = None;
    if failed > 0 && want_active > active_count {
        let last_success = succeeded_pods.iter().filter_map(|p| finished_time(p)).max();
        let since: Vec<_> = failed_pods
            .iter()
            .filter_map(|p| finished_time(p))
            .filter(|t| last_success.is_none_or(|s| *t > s))
            .collect();
        let failures = if last_success.is_some() {
            since.len() as i32
        } else {
            failed
        };
        if let (Some(at), true) = (since.iter().max(), failures > 0) {
            let delay = backoff_base
                .saturating_mul(1u32 << (failures - 1).clamp(0, 16) as u32)
                .min(MAX_BACKOFF);
            let ready_at = at
                .checked_add(k8s_openapi::jiff::SignedDuration::try_from(delay).unwrap_or_default())
                .unwrap_or(*at);
            if ready_at > now {
                let left = Duration::try_from(ready_at.duration_since(now)).unwrap_or_default();
                backoff_wait = Some(left.max(Duration::from_millis(10)));
                want_active = active_count;
            }
        }
    }
    let free_indexes = if indexed {
        let active_indexes: BTreeSet<i32> = active.iter().filter_map(|p| index_of(p)).collect();
        (0..completions)
            .filter(|i| !succeeded_indexes.contains(i) && !active_indexes.contains(i))
            .take((want_active - active_count).max(0) as usize)
            .collect()
    } else {
        vec![]
    };
    Decision {
        succeeded,
        failed,
        active: active_count,
        failure,
        complete,
        want_active,
        backoff_wait,
        succeeded_indexes,
        free_indexes,
        indexed,
    }
}

/// With restartPolicy OnFailure failed containers restart in place: the
/// Job fails once its running and pending pods' restarts reach the
/// backoff limit (any restart, when the limit is 0), as Kubernetes'
/// `pastBackoffLimitOnFailure` counts.
fn past_backoff_limit_on_failure(active: &[&Arc<Pod>], limit: i32) -> bool {
    let restarts: i32 = active
        .iter()
        .filter(|p| matches!(phase(p), "Running" | "Pending"))
        .filter_map(|p| p.status.as_ref())
        .flat_map(|s| {
            s.init_container_statuses
                .iter()
                .flatten()
                .chain(s.container_statuses.iter().flatten())
        })
        .map(|c| c.restart_count)
        .sum();
    if limit == 0 {
        restarts > 0
    } else {
        restarts >= limit
    }
}

async fn reconcile(ctx: &Ctx, st: &State, key: &str) -> Result<Next, Error> {
    let Some(job) = ctx.caches.jobs.get(key) else {
        st.expectations.forget(key);
        return Ok(None);
    };
    let job: &Job = &job;
    if common::is_terminating(&job.metadata) {
        return Ok(None);
    }
    let ns = job.namespace().unwrap_or_default();
    let name = job.name_any();
    let uid = job.metadata.uid.clone().unwrap_or_default();
    let spec = job.spec.clone().unwrap_or_default();
    let jobs: Api<Job> = Api::namespaced(ctx.client.clone(), &ns);
    let pods_api: Api<Pod> = Api::namespaced(ctx.client.clone(), &ns);
    let now = k8s_openapi::jiff::Timestamp::now();

    if let Some(done) = finished(job) {
        // ttlSecondsAfterFinished.
        if let Some(ttl) = spec.ttl_seconds_after_finished {
            let at = job
                .status
                .as_ref()
                .and_then(|s| {
                    s.completion_time.clone().or_else(|| {
                        s.conditions.as_ref().and_then(|c| {
                            c.iter()
                                .find(|c| c.type_ == done)
                                .and_then(|c| c.last_transition_time.clone())
                        })
                    })
                })
                .map(|t| t.0)
                .unwrap_or(now);
            let expire = at + k8s_openapi::jiff::SignedDuration::from_secs(ttl.max(0) as i64);
            if expire <= now {
                let dp = DeleteParams {
                    propagation_policy: Some(PropagationPolicy::Background),
                    ..Default::default()
                };
                let _ = jobs.delete(&name, &dp).await;
                return Ok(None);
            }
            return Ok(Some(common::until(expire).max(Duration::from_millis(100))));
        }
        return Ok(None);
    }

    let all: Vec<Arc<Pod>> = ctx
        .caches
        .pods
        .owned_by(&uid)
        .into_iter()
        .filter(|p| {
            common::controller_of(&p.metadata)
                .map(|r| r.uid == uid)
                .unwrap_or(false)
        })
        .collect();
    if !st.expectations.satisfied(key) {
        return Ok(Some(Duration::from_secs(1)));
    }
    let d = decide(job, &all, now, ctx.options.job_backoff_base);
    let active: Vec<&Arc<Pod>> = all.iter().filter(|p| common::pod_is_active(p)).collect();
    let (active_count, want_active) = (d.active, d.want_active);
    let (failure, complete, succeeded, failed) = (d.failure, d.complete, d.succeeded, d.failed);
    let (indexed, suspended) = (d.indexed, spec.suspend == Some(true));
    let start_time = job
        .status
        .as_ref()
        .and_then(|s| s.start_time.clone())
        .map(|t| t.0);
    let backoff_wait = d.backoff_wait;
    let succeeded_indexes = d.succeeded_indexes;
    if active_count > want_active {
        for p in active.iter().take((active_count - want_active) as usize) {
            let dp = DeleteParams::default();
            st.expectations.expect_delete(key, &p.name_any());
            if pods_api.delete(&p.name_any(), &dp).await.is_err() {
                st.expectations.deletion_observed(key, &p.name_any());
            } else {
                ctx.events.normal(
                    COMPONENT,
                    job,
                    "SuccessfulDelete",
                    format!("Deleted pod: {}", p.name_any()),
                );
            }
        }
    } else if active_count < want_active {
        let template = spec.template.clone();
        let mut free_indexes = d.free_indexes.into_iter();
        let n = (want_active - active_count) as usize;
        st.expectations.expect_creations(key, n);
        for k in 0..n {
            let mut meta = template.metadata.clone().unwrap_or_default();
            meta.name = None;
            meta.generate_name = Some(format!("{name}-"));
            meta.namespace = Some(ns.clone());
            let labels = meta.labels.get_or_insert_with(Default::default);
            labels.insert("batch.kubernetes.io/controller-uid".into(), uid.clone());
            labels.insert("controller-uid".into(), uid.clone());
            labels.insert("batch.kubernetes.io/job-name".into(), name.clone());
            labels.insert("job-name".into(), name.clone());
            meta.owner_references = Some(vec![common::controller_ref(
                "batch/v1",
                "Job",
                &job.metadata,
            )]);
            let mut pod_spec = template.spec.clone().unwrap_or_default();
            if indexed {
                let Some(i) = free_indexes.next() else {
                    for _ in k..n {
                        st.expectations.creation_observed(key);
                    }
                    break;
                };
                meta.annotations
                    .get_or_insert_with(Default::default)
                    .insert(INDEX.into(), i.to_string());
                meta.labels
                    .get_or_insert_with(Default::default)
                    .insert(INDEX.into(), i.to_string());
                meta.generate_name = Some(format!("{name}-{i}-"));
                if pod_spec.hostname.is_none() {
                    pod_spec.hostname = Some(format!("{name}-{i}"));
                }
                for c in pod_spec
                    .containers
                    .iter_mut()
                    .chain(pod_spec.init_containers.iter_mut().flatten())
                {
                    c.env
                        .get_or_insert_with(Vec::new)
                        .push(k8s_openapi::api::core::v1::EnvVar {
                            name: "JOB_COMPLETION_INDEX".into(),
                            value_from: Some(k8s_openapi::api::core::v1::EnvVarSource {
                                field_ref: Some(k8s_openapi::api::core::v1::ObjectFieldSelector {
                                    field_path: format!("metadata.annotations['{INDEX}']"),
                                    ..Default::default()
                                }),
                                ..Default::default()
                            }),
                            ..Default::default()
                        });
                }
            }
            let pod = Pod {
                metadata: meta,
                spec: Some(pod_spec),
                status: None,
            };
            match pods_api.create(&PostParams::default(), &pod).await {
                Ok(p) => {
                    ctx.events.normal(
                        COMPONENT,
                        job,
                        "SuccessfulCreate",
                        format!("Created pod: {}", p.name_any()),
                    );
                }
                Err(e) => {
                    for _ in k..n {
                        st.expectations.creation_observed(key);
                    }
                    ctx.events.warning(
                        COMPONENT,
                        job,
                        "FailedCreate",
                        format!("Error creating: {e}"),
                    );
                    return Err(e.into());
                }
            }
        }
    }

    // Status.
    let ready = active.iter().filter(|p| common::pod_ready(p)).count() as i32;
    let mut conditions: Vec<serde_json::Value> = job
        .status
        .as_ref()
        .and_then(|s| s.conditions.clone())
        .unwrap_or_default()
        .into_iter()
        .filter_map(|c| serde_json::to_value(c).ok())
        .collect();
    let cond = |t: &str, reason: &str, msg: &str| json!({"type": t, "status": "True", "reason": reason, "message": msg, "lastProbeTime": now.to_string(), "lastTransitionTime": now.to_string()});
    let has = |conds: &Vec<serde_json::Value>, t: &str| conds.iter().any(|c| c["type"] == t);
    if suspended && !has(&conditions, "Suspended") {
        conditions.push(json!({"type": "Suspended", "status": "True", "reason": "JobSuspended", "message": "Job suspended", "lastProbeTime": now.to_string(), "lastTransitionTime": now.to_string()}));
        ctx.events
            .normal(COMPONENT, job, "Suspended", "Job suspended".into());
    } else if !suspended && has(&conditions, "Suspended") {
        conditions.retain(|c| c["type"] != "Suspended");
        ctx.events
            .normal(COMPONENT, job, "Resumed", "Job resumed".into());
    }
    let mut completion_time = None;
    if let Some((reason, msg)) = failure {
        if !has(&conditions, "FailureTarget") {
            conditions.push(cond("FailureTarget", reason, msg));
        }
        if active_count == 0 && !has(&conditions, "Failed") {
            conditions.push(cond("Failed", reason, msg));
            ctx.events.warning(COMPONENT, job, reason, msg.into());
        }
    } else if complete {
        if !has(&conditions, "SuccessCriteriaMet") {
            conditions.push(cond(
                "SuccessCriteriaMet",
                "CompletionsReached",
                "Reached expected number of succeeded pods",
            ));
        }
        if active_count == 0 && !has(&conditions, "Complete") {
            conditions.push(cond(
                "Complete",
                "CompletionsReached",
                "Reached expected number of succeeded pods",
            ));
            completion_time = Some(now.to_string());
            ctx.events
                .normal(COMPONENT, job, "Completed", "Job completed".into());
        }
    }
    let mut status = json!({
        "active": active_count.min(want_active.max(active_count)),
        "succeeded": succeeded,
        "failed": failed,
        "ready": ready,
        "conditions": conditions,
    });
    if start_time.is_none() && !suspended {
        status["startTime"] = json!(now.to_string());
    }
    if let Some(t) = completion_time {
        status["completionTime"] = json!(t);
    }
    if indexed {
        let list: Vec<String> = succeeded_indexes.iter().map(|i| i.to_string()).collect();
        status["completedIndexes"] = json!(list.join(","));
    }
    let old = serde_json::to_value(job.status.clone().unwrap_or_default()).unwrap_or_default();
    let differs = ["active", "succeeded", "failed", "ready"].iter().any(|k| {
        old.get(*k).and_then(|v| v.as_i64()).unwrap_or(0) != status[*k].as_i64().unwrap_or(0)
    }) || old
        .get("conditions")
        .and_then(|c| c.as_array())
        .map(|a| a.len())
        .unwrap_or(0)
        != status["conditions"]
            .as_array()
            .map(|a| a.len())
            .unwrap_or(0)
        || status.get("startTime").is_some()
        || status.get("completionTime").is_some();
    if differs {
        match jobs
            .patch_status(
                &name,
                &PatchParams::default(),
                &Patch::Merge(&json!({"status": status})),
            )
            .await
        {
            Ok(_) => {}
            Err(e) if common::is_not_found(&e) => return Ok(None),
            Err(e) => return Err(e.into()),
        }
    }
    let deadline = match (spec.active_deadline_seconds, start_time) {
        (Some(d), Some(s)) => {
            let left = (s + k8s_openapi::jiff::SignedDuration::from_secs(d))
                .duration_since(now)
                .as_secs()
                .max(1) as u64;
            Some(Duration::from_secs(left.min(30)))
        }
        _ => None,
    };
    Ok(match (deadline, backoff_wait) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::jiff::{SignedDuration, Timestamp};
    use serde_json::Value;

    const BASE: Duration = Duration::from_secs(10);

    fn now() -> Timestamp {
        "2025-01-01T00:10:00Z".parse().unwrap()
    }

    /// `secs` seconds before now, as the API writes times.
    fn ago(secs: i64) -> String {
        (now() - SignedDuration::from_secs(secs)).to_string()
    }

    fn job(spec: Value, status: Value) -> Job {
        let mut spec = spec;
        spec["template"] = spec.get("template").cloned().unwrap_or(json!({}));
        serde_json::from_value(json!({
            "metadata": {"name": "j", "namespace": "ns", "uid": "ju"},
            "spec": spec, "status": status,
        }))
        .unwrap()
    }

    /// A pod in `phase`; `finished` seconds ago when it has ended;
    /// `index` its completion index; `restarts` its container's restarts.
    fn pod(phase: &str, finished: Option<i64>, index: Option<i32>, restarts: i32) -> Arc<Pod> {
        let state = match finished {
            Some(s) => json!({"terminated": {"exitCode": 0, "finishedAt": ago(s)}}),
            None => json!({"running": {}}),
        };
        let annotations = match index {
            Some(i) => json!({ INDEX: i.to_string() }),
            None => json!({}),
        };
        Arc::new(
            serde_json::from_value(json!({
                "metadata": {"name": format!("p-{phase}-{index:?}-{finished:?}"), "namespace": "ns",
                    "annotations": annotations},
                "status": {"phase": phase, "containerStatuses": [{"name": "c", "image": "i",
                    "imageID": "", "ready": phase == "Running", "restartCount": restarts,
                    "state": state}]},
            }))
            .unwrap(),
        )
    }

    fn running() -> Arc<Pod> {
        pod("Running", None, None, 0)
    }

    fn succeeded(secs: i64) -> Arc<Pod> {
        pod("Succeeded", Some(secs), None, 0)
    }

    fn failed(secs: i64) -> Arc<Pod> {
        pod("Failed", Some(secs), None, 0)
    }

    fn decide_now(job: &Job, pods: &[Arc<Pod>]) -> Decision {
        decide(job, pods, now(), BASE)
    }

    #[test]
    fn parallelism_caps_the_active_pods_and_completions_the_ones_still_needed() {
        let j = job(json!({"completions": 5, "parallelism": 2}), json!({}));
        let d = decide_now(&j, &[]);
        assert_eq!((d.want_active, d.complete), (2, false));
        let four: Vec<_> = (1..=4).map(succeeded).collect();
        let d = decide_now(&j, &four);
        assert_eq!((d.succeeded, d.want_active), (4, 1), "one more is needed");
        let five: Vec<_> = (1..=5).map(succeeded).collect();
        let d = decide_now(&j, &five);
        assert_eq!((d.complete, d.want_active, d.failure), (true, 0, None));
    }

    #[test]
    fn a_job_without_parallelism_or_completions_runs_one_pod_to_one_success() {
        let j = job(json!({}), json!({}));
        assert_eq!(decide_now(&j, &[]).want_active, 1);
        let d = decide_now(&j, &[succeeded(1)]);
        assert!(d.complete);
        assert_eq!(d.want_active, 0);
    }

    #[test]
    fn a_work_queue_job_is_complete_at_its_first_success_and_lets_the_others_finish() {
        let j = job(json!({"parallelism": 3}), json!({}));
        assert_eq!(decide_now(&j, &[]).want_active, 3);
        let d = decide_now(&j, &[succeeded(1), running(), running()]);
        assert!(d.complete);
        assert_eq!(d.want_active, 2, "the running pods are not deleted");
    }

    #[test]
    fn a_job_fails_once_its_failures_exceed_the_backoff_limit() {
        let j = job(json!({"backoffLimit": 2}), json!({}));
        assert_eq!(decide_now(&j, &[failed(100), failed(200)]).failure, None);
        let d = decide_now(&j, &[failed(100), failed(200), failed(300), running()]);
        assert_eq!(d.failure.map(|f| f.0), Some("BackoffLimitExceeded"));
        assert_eq!(d.want_active, 0, "its running pods are deleted");
        let default_limit = job(json!({}), json!({}));
        let six: Vec<_> = (1..=6).map(|i| failed(i * 1000)).collect();
        assert_eq!(decide_now(&default_limit, &six).failure, None);
        let seven: Vec<_> = (1..=7).map(|i| failed(i * 1000)).collect();
        assert!(decide_now(&default_limit, &seven).failure.is_some());
    }

    #[test]
    fn counts_do_not_go_down_when_finished_pods_are_deleted() {
        let j = job(
            json!({"completions": 3}),
            json!({"succeeded": 2, "failed": 4}),
        );
        let d = decide_now(&j, &[failed(100)]);
        assert_eq!((d.succeeded, d.failed), (2, 4));
        assert_eq!(d.want_active, 1);
    }

    #[test]
    fn an_evicted_pod_counts_as_a_failure_and_is_replaced() {
        let j = job(json!({"backoffLimit": 0}), json!({}));
        let mut evicted = (*pod("Failed", Some(100), None, 0)).clone();
        evicted.status.as_mut().unwrap().reason = Some("Evicted".into());
        let d = decide_now(&j, &[Arc::new(evicted.clone())]);
        assert_eq!(d.failed, 1);
        assert_eq!(d.failure.map(|f| f.0), Some("BackoffLimitExceeded"));
        let j = job(json!({}), json!({}));
        let d = decide_now(&j, &[Arc::new(evicted)]);
        assert_eq!((d.failed, d.want_active, d.backoff_wait), (1, 1, None));
    }

    #[test]
    fn new_pods_wait_a_back_off_that_doubles_with_each_failure() {
        let j = job(json!({}), json!({}));
        // One failure 4 s ago: 10 s back-off, 6 s left.
        let d = decide_now(&j, &[failed(4)]);
        assert_eq!(d.backoff_wait, Some(Duration::from_secs(6)));
        assert_eq!(d.want_active, 0, "nothing starts during the back-off");
        // Three failures, the last 30 s ago: 40 s back-off, 10 s left.
        let d = decide_now(&j, &[failed(300), failed(200), failed(30)]);
        assert_eq!(d.backoff_wait, Some(Duration::from_secs(10)));
        // Past the back-off a pod starts.
        let d = decide_now(&j, &[failed(300), failed(200), failed(50)]);
        assert_eq!((d.backoff_wait, d.want_active), (None, 1));
    }

    #[test]
    fn the_back_off_is_at_most_six_minutes() {
        let j = job(json!({"backoffLimit": 30, "completions": 2}), json!({}));
        let many: Vec<_> = (0..20).map(|i| failed(1000 + i)).collect();
        let mut pods = many.clone();
        pods.push(failed(60));
        let d = decide_now(&j, &pods);
        assert_eq!(d.backoff_wait, Some(Duration::from_secs(300)));
    }

    #[test]
    fn the_back_off_counts_only_failures_since_the_last_success() {
        let j = job(json!({"completions": 3}), json!({}));
        // Two failures before a success, one 4 s ago after it: 10 s.
        let pods = [failed(500), failed(400), succeeded(300), failed(4)];
        let d = decide_now(&j, &pods);
        assert_eq!(d.backoff_wait, Some(Duration::from_secs(6)));
        // A success after every failure: no wait.
        let pods = [failed(500), succeeded(4)];
        assert_eq!(decide_now(&j, &pods).backoff_wait, None);
    }

    #[test]
    fn a_job_past_its_active_deadline_fails_unless_suspended() {
        let spec = json!({"activeDeadlineSeconds": 60, "parallelism": 2, "completions": 4});
        let j = job(spec.clone(), json!({"startTime": ago(100)}));
        let d = decide_now(&j, &[running(), running()]);
        assert_eq!(d.failure.map(|f| f.0), Some("DeadlineExceeded"));
        assert_eq!(d.want_active, 0);
        let early = job(spec.clone(), json!({"startTime": ago(30)}));
        assert_eq!(decide_now(&early, &[running()]).failure, None);
        let mut suspended = spec;
        suspended["suspend"] = json!(true);
        let j = job(suspended, json!({"startTime": ago(100)}));
        assert_eq!(decide_now(&j, &[]).failure, None);
    }

    #[test]
    fn a_suspended_job_wants_no_active_pods() {
        let j = job(
            json!({"suspend": true, "parallelism": 3, "completions": 3}),
            json!({}),
        );
        let d = decide_now(&j, &[running(), running()]);
        assert_eq!((d.active, d.want_active, d.complete), (2, 0, false));
    }

    #[test]
    fn an_indexed_job_counts_each_index_once_and_fills_the_lowest_free_ones() {
        let j = job(
            json!({"completionMode": "Indexed", "completions": 4, "parallelism": 2}),
            json!({}),
        );
        let pods = [
            pod("Succeeded", Some(10), Some(0), 0),
            pod("Succeeded", Some(20), Some(0), 0),
            pod("Succeeded", Some(20), Some(7), 0),
            pod("Running", None, Some(1), 0),
        ];
        let d = decide_now(&j, &pods);
        assert_eq!(d.succeeded, 1, "index 0 twice is one; 7 is out of range");
        assert_eq!(d.succeeded_indexes, BTreeSet::from([0]));
        assert_eq!(d.free_indexes, vec![2]);
        assert_eq!(d.want_active, 2);
        let done: Vec<_> = (0..4)
            .map(|i| pod("Succeeded", Some(10 + i as i64), Some(i), 0))
            .collect();
        assert!(decide_now(&j, &done).complete);
    }

    #[test]
    fn with_restart_policy_on_failure_container_restarts_count_against_the_limit() {
        let on_failure = |limit: i32| {
            job(
                json!({"backoffLimit": limit, "template": {"spec": {"restartPolicy": "OnFailure",
                    "containers": [{"name": "c", "image": "i"}]}}}),
                json!({}),
            )
        };
        let restarted = |n| pod("Running", None, None, n);
        assert_eq!(decide_now(&on_failure(2), &[restarted(1)]).failure, None);
        assert_eq!(
            decide_now(&on_failure(2), &[restarted(2)])
                .failure
                .map(|f| f.0),
            Some("BackoffLimitExceeded")
        );
        assert!(decide_now(&on_failure(0), &[restarted(1)])
            .failure
            .is_some());
        let never = job(json!({"backoffLimit": 2}), json!({}));
        assert_eq!(
            decide_now(&never, &[restarted(5)]).failure,
            None,
            "restarts count only under OnFailure"
        );
    }
}
