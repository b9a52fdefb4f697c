//! The Job controller: runs pods until `completions` succeed (at most
//! `parallelism` at once), gives up after `backoffLimit` failures or
//! `activeDeadlineSeconds`, honours `suspend` and Indexed completion mode,
//! reports status and the Complete/Failed conditions, and deletes finished
//! Jobs after `ttlSecondsAfterFinished`.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams, PropagationPolicy};
use kube::runtime::controller::Action;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::ResourceExt;
use serde_json::json;

use crate::common::{self, Expectations};
use crate::Error;

pub struct Ctx {
    pub client: kube::Client,
    pub pods: Store<Pod>,
    pub expectations: Expectations,
    pub metrics: Arc<common::Metrics>,
}

const INDEX: &str = "batch.kubernetes.io/job-completion-index";

fn phase(p: &Pod) -> &str {
    p.status
        .as_ref()
        .and_then(|s| s.phase.as_deref())
        .unwrap_or("")
}

fn index_of(p: &Pod) -> Option<i32> {
    p.annotations().get(INDEX).and_then(|v| v.parse().ok())
}

pub async fn reconcile(job: Arc<Job>, ctx: Arc<Ctx>) -> Result<Action, Error> {
    let t = Instant::now();
    let r = reconcile_inner(&job, &ctx).await;
    ctx.metrics.record("job", r.is_ok(), t.elapsed());
    r
}

fn finished(job: &Job) -> Option<&str> {
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

async fn reconcile_inner(job: &Job, ctx: &Ctx) -> Result<Action, Error> {
    if common::is_terminating(&job.metadata) {
        return Ok(Action::await_change());
    }
    let ns = job.namespace().unwrap_or_default();
    let name = job.name_any();
    let key = format!("{ns}/{name}");
    let uid = job.metadata.uid.clone().unwrap_or_default();
    let spec = job.spec.clone().unwrap_or_default();
    let jobs: Api<Job> = Api::namespaced(ctx.client.clone(), &ns);
    let pods_api: Api<Pod> = Api::namespaced(ctx.client.clone(), &ns);
    let involved =
        json!({"apiVersion": "batch/v1", "kind": "Job", "name": name, "namespace": ns, "uid": uid});
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
                return Ok(Action::await_change());
            }
            let wait = expire.duration_since(now).as_secs().max(1) as u64;
            return Ok(Action::requeue(Duration::from_secs(wait)));
        }
        return Ok(Action::await_change());
    }

    let all: Vec<Arc<Pod>> = ctx
        .pods
        .state()
        .into_iter()
        .filter(|p| p.metadata.namespace.as_deref() == Some(ns.as_str()))
        .filter(|p| {
            common::controller_of(&p.metadata)
                .map(|r| r.uid == uid)
                .unwrap_or(false)
        })
        .collect();
    let present = |n: &str| all.iter().any(|p| p.metadata.name.as_deref() == Some(n));
    if !ctx.expectations.satisfied(&key, present) {
        return Ok(Action::requeue(Duration::from_millis(500)));
    }
    let succeeded_pods: Vec<&Arc<Pod>> = all.iter().filter(|p| phase(p) == "Succeeded").collect();
    let failed = all.iter().filter(|p| phase(p) == "Failed").count() as i32;
    let active: Vec<&Arc<Pod>> = all.iter().filter(|p| common::pod_is_active(p)).collect();
    let indexed = spec.completion_mode.as_deref() == Some("Indexed");
    let completions = spec.completions.unwrap_or(1).max(0);
    let succeeded_indexes: BTreeSet<i32> =
        succeeded_pods.iter().filter_map(|p| index_of(p)).collect();
    let succeeded = if indexed {
        succeeded_indexes.len() as i32
    } else {
        succeeded_pods.len() as i32
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
    let complete = failure.is_none() && succeeded >= completions;

    let mut want_active = if suspended || failure.is_some() || complete {
        0
    } else {
        parallelism.min(completions - succeeded).max(0)
    };
    if failure.is_some() || complete || suspended {
        want_active = 0;
    }
    let active_count = active.len() as i32;
    if active_count > want_active {
        for p in active.iter().take((active_count - want_active) as usize) {
            let dp = DeleteParams::default();
            if pods_api.delete(&p.name_any(), &dp).await.is_ok() {
                ctx.expectations.expect_delete(&key, &p.name_any());
                common::event(
                    &ctx.client,
                    "job-controller",
                    involved.clone(),
                    &ns,
                    "Normal",
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
        for _ in 0..(want_active - active_count) {
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
                let Some(i) = free_indexes.next() else { break };
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
                    ctx.expectations.expect_add(&key, &p.name_any());
                    common::event(
                        &ctx.client,
                        "job-controller",
                        involved.clone(),
                        &ns,
                        "Normal",
                        "SuccessfulCreate",
                        format!("Created pod: {}", p.name_any()),
                    );
                }
                Err(e) => {
                    common::event(
                        &ctx.client,
                        "job-controller",
                        involved.clone(),
                        &ns,
                        "Warning",
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
        common::event(
            &ctx.client,
            "job-controller",
            involved.clone(),
            &ns,
            "Normal",
            "Suspended",
            "Job suspended".into(),
        );
    } else if !suspended && has(&conditions, "Suspended") {
        conditions.retain(|c| c["type"] != "Suspended");
        common::event(
            &ctx.client,
            "job-controller",
            involved.clone(),
            &ns,
            "Normal",
            "Resumed",
            "Job resumed".into(),
        );
    }
    let mut completion_time = None;
    if let Some((reason, msg)) = &failure {
        if !has(&conditions, "FailureTarget") {
            conditions.push(cond("FailureTarget", reason, msg));
        }
        if active_count == 0 && !has(&conditions, "Failed") {
            conditions.push(cond("Failed", reason, msg));
            common::event(
                &ctx.client,
                "job-controller",
                involved.clone(),
                &ns,
                "Warning",
                reason,
                msg.clone(),
            );
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
            common::event(
                &ctx.client,
                "job-controller",
                involved.clone(),
                &ns,
                "Normal",
                "Completed",
                "Job completed".into(),
            );
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
            Err(kube::Error::Api(e)) if e.code == 404 => return Ok(Action::await_change()),
            Err(e) => return Err(e.into()),
        }
    }
    Ok(match (spec.active_deadline_seconds, start_time) {
        (Some(d), Some(s)) => {
            let left = (s + k8s_openapi::jiff::SignedDuration::from_secs(d))
                .duration_since(now)
                .as_secs()
                .max(1) as u64;
            Action::requeue(Duration::from_secs(left.min(30)))
        }
        _ => Action::requeue(Duration::from_secs(30)),
    })
}

pub fn owner_of(p: &Pod) -> Option<ObjectRef<Job>> {
    let r = common::controller_of(&p.metadata)?;
    if r.kind != "Job" {
        return None;
    }
    Some(ObjectRef::new(&r.name).within(p.metadata.namespace.as_deref().unwrap_or("default")))
}
