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
use crate::framework::{self, Next, Queue};
use crate::{Ctx, Error};

const COMPONENT: &str = "job-controller";

pub struct State {
    expectations: Expectations,
}

pub fn register(ctx: &Arc<Ctx>, tasks: &mut tokio::task::JoinSet<()>) {
    let queue = Queue::new("job");
    let st = Arc::new(State {
        expectations: Expectations::default(),
    });
    let q = queue.clone();
    ctx.caches.jobs.on_change(move |_, new| {
        if let Some(j) = new {
            q.add(framework::key_of(&j.metadata));
        }
    });
    let q = queue.clone();
    let st2 = st.clone();
    ctx.caches.pods.on_change(move |old, new| {
        st2.expectations.observe_pod_change("Job", old, new);
        for p in [old, new].into_iter().flatten() {
            common::enqueue_controller(&q, "Job", &p.metadata);
        }
    });
    let c = ctx.clone();
    framework::spawn_workers(
        tasks,
        queue.clone(),
        ctx.options.workers,
        ctx.ready(),
        move |key| {
            let c = c.clone();
            let st = st.clone();
            async move { reconcile(&c, &st, &key).await }
        },
    );
    framework::spawn_resync(
        tasks,
        queue,
        ctx.caches.jobs.clone(),
        Duration::from_secs(60),
    );
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
    let succeeded_pods: Vec<&Arc<Pod>> = all.iter().filter(|p| phase(p) == "Succeeded").collect();
    // Counts never go down, even if finished pods are deleted.
    let old_status = job.status.clone().unwrap_or_default();
    let failed = (all.iter().filter(|p| phase(p) == "Failed").count() as i32)
        .max(old_status.failed.unwrap_or(0));
    let active: Vec<&Arc<Pod>> = all.iter().filter(|p| common::pod_is_active(p)).collect();
    let indexed = spec.completion_mode.as_deref() == Some("Indexed");
    // Without completions (a work queue) the Job is done once a pod
    // succeeded and the others finished.
    let work_queue = spec.completions.is_none() && !indexed;
    let completions = spec.completions.unwrap_or(1).max(0);
    let succeeded_indexes: BTreeSet<i32> =
        succeeded_pods.iter().filter_map(|p| index_of(p)).collect();
    let succeeded = if indexed {
        succeeded_indexes.len() as i32
    } else {
        (succeeded_pods.len() as i32).max(old_status.succeeded.unwrap_or(0))
    };
    let parallelism = spec.parallelism.unwrap_or(1).max(0);
    let backoff_limit = spec.backoff_limit.unwrap_or(6);
    let start_time = job
        .status
        .as_ref()
        .and_then(|s| s.start_time.clone())
        .map(|t| t.0);
    let suspended = spec.suspend == Some(true);

    let mut failure: Option<(&str, String)> = None;
    if failed > backoff_limit {
        failure = Some((
            "BackoffLimitExceeded",
            "Job has reached the specified backoff limit".into(),
        ));
    } else if let (Some(deadline), Some(start)) = (spec.active_deadline_seconds, start_time) {
        if start + k8s_openapi::jiff::SignedDuration::from_secs(deadline) <= now && !suspended {
            failure = Some((
                "DeadlineExceeded",
                "Job was active longer than specified deadline".into(),
            ));
        }
    }
    let active_count = active.len() as i32;
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
    if work_queue && complete && failure.is_none() && !suspended {
        // The pods still running finish on their own.
        want_active = active_count;
    }
    // After failures, new pods wait: base × 2^(failures − 1), at most 6 min.
    let mut backoff_wait: Option<Duration> = None;
    if failed > 0 && want_active > active_count {
        let last_failure = all
            .iter()
            .filter(|p| phase(p) == "Failed")
            .filter_map(|p| finished_time(p))
            .max();
        if let Some(at) = last_failure {
            let delay = ctx
                .options
                .job_backoff_base
                .saturating_mul(1u32 << (failed - 1).clamp(0, 16) as u32)
                .min(Duration::from_secs(360));
            let ready_at = at
                .checked_add(k8s_openapi::jiff::SignedDuration::try_from(delay).unwrap_or_default())
                .unwrap_or(at);
            if ready_at > now {
                backoff_wait = Some(common::until(ready_at).max(Duration::from_millis(10)));
                want_active = active_count;
            }
        }
    }
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
        let active_indexes: BTreeSet<i32> = active.iter().filter_map(|p| index_of(p)).collect();
        let mut free_indexes = (0..completions)
            .filter(|i| !succeeded_indexes.contains(i) && !active_indexes.contains(i));
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
    if let Some((reason, msg)) = &failure {
        if !has(&conditions, "FailureTarget") {
            conditions.push(cond("FailureTarget", reason, msg));
        }
        if active_count == 0 && !has(&conditions, "Failed") {
            conditions.push(cond("Failed", reason, msg));
            ctx.events.warning(COMPONENT, job, reason, msg.clone());
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
