//! The CronJob controller: creates a Job for the latest scheduled time
//! that has come (in the CronJob's time zone), unless it is suspended, the
//! start is later than startingDeadlineSeconds, or concurrencyPolicy says
//! otherwise (Forbid skips while a Job runs, Replace deletes the running
//! ones first). Job names are deterministic (`<cronjob>-<minutes since the
//! epoch>`), so a restarted controller never starts a run twice. Status
//! lists the active Jobs, lastScheduleTime and lastSuccessfulTime;
//! finished Jobs beyond the history limits are deleted, oldest first.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::batch::v1::{CronJob, Job};
use kube::api::{Api, DeleteParams, PostParams, PropagationPolicy};
use kube::ResourceExt;
use serde_json::json;

use crate::common;
use crate::controller::Controller;
use crate::cron::{self, Schedule};
use crate::framework::{self, Next};
use crate::{Ctx, Error};

const COMPONENT: &str = "cronjob-controller";
pub const SCHEDULED_AT: &str = "batch.kubernetes.io/cronjob-scheduled-timestamp";
/// More missed start times than this are reported as too many.
const MISSED_CAP: usize = 100;
/// The longest a CronJob sleeps between looks (the clock may be moved).
const MAX_SLEEP: Duration = Duration::from_secs(30);

pub fn register(ctx: &Arc<Ctx>, tasks: &mut tokio::task::JoinSet<()>) {
    Controller::new(ctx, "cronjob", &ctx.caches.cronjobs)
        .owns(&ctx.caches.jobs, "CronJob")
        .resync(Duration::from_secs(60))
        .run(
            tasks,
            (),
            |c, _, key| async move { reconcile(&c, &key).await },
        );
}

/// The name of the Job for a scheduled time.
pub fn job_name(cronjob: &str, scheduled: k8s_openapi::jiff::Timestamp) -> String {
    format!("{cronjob}-{}", scheduled.as_second().div_euclid(60))
}

/// What to do now, from the schedule and the last run.
#[derive(Debug, PartialEq, Eq)]
pub enum Decision {
    /// Nothing is due; look again at this time.
    Wait(Option<k8s_openapi::jiff::Timestamp>),
    /// The latest due time was missed by more than the starting deadline.
    Missed(k8s_openapi::jiff::Timestamp),
    /// Start a run for this time (with how many times were missed).
    Run(k8s_openapi::jiff::Timestamp, usize),
}

pub fn decide(
    schedule: &Schedule,
    tz: &k8s_openapi::jiff::tz::TimeZone,
    created: k8s_openapi::jiff::Timestamp,
    last_scheduled: Option<k8s_openapi::jiff::Timestamp>,
    starting_deadline: Option<i64>,
    now: k8s_openapi::jiff::Timestamp,
) -> Decision {
    let mut earliest = last_scheduled.unwrap_or(created);
    if let Some(d) = starting_deadline {
        let floor = common::plus(now, -d.max(0));
        if floor > earliest {
            earliest = floor;
        }
    }
    let (latest, n) = schedule.between(earliest, now, tz, MISSED_CAP);
    match latest {
        None => Decision::Wait(schedule.next_after(now, tz)),
        Some(t) => {
            if let Some(d) = starting_deadline {
                if common::plus(t, d.max(0)) < now {
                    return Decision::Missed(t);
                }
            }
            Decision::Run(t, n)
        }
    }
}

fn finished_at(j: &Job) -> Option<(bool, k8s_openapi::jiff::Timestamp)> {
    let s = j.status.as_ref()?;
    let c = s
        .conditions
        .iter()
        .flatten()
        .find(|c| (c.type_ == "Complete" || c.type_ == "Failed") && c.status == "True")?;
    let at = s
        .completion_time
        .as_ref()
        .or(c.last_transition_time.as_ref())
        .map(|t| t.0)
        .unwrap_or(k8s_openapi::jiff::Timestamp::UNIX_EPOCH);
    Some((c.type_ == "Complete", at))
}

async fn reconcile(ctx: &Ctx, key: &str) -> Result<Next, Error> {
    let Some(cj) = ctx.caches.cronjobs.get(key) else {
        return Ok(None);
    };
    let cj: &CronJob = &cj;
    if common::is_terminating(&cj.metadata) {
        return Ok(None);
    }
    let (ns, name) = framework::split_key(key);
    let spec = cj.spec.clone().unwrap_or_default();
    let uid = cj.metadata.uid.clone().unwrap_or_default();
    let jobs_api: Api<Job> = Api::namespaced(ctx.client.clone(), ns);
    let now = ctx.options.clock.now();

    let jobs: Vec<Arc<Job>> = ctx
        .caches
        .jobs
        .owned_by(&uid)
        .into_iter()
        .filter(|j| {
            common::controller_of(&j.metadata)
                .map(|r| r.uid == uid)
                .unwrap_or(false)
        })
        .collect();
    let mut active: Vec<Arc<Job>> = jobs
        .iter()
        .filter(|j| finished_at(j).is_none() && !common::is_terminating(&j.metadata))
        .cloned()
        .collect();

    // History limits.
    let mut finished: Vec<(bool, k8s_openapi::jiff::Timestamp, Arc<Job>)> = jobs
        .iter()
        .filter_map(|j| finished_at(j).map(|(ok, at)| (ok, at, j.clone())))
        .filter(|(_, _, j)| !common::is_terminating(&j.metadata))
        .collect();
    finished.sort_by_key(|(_, at, _)| *at);
    for (ok, limit) in [
        (true, spec.successful_jobs_history_limit.unwrap_or(3)),
        (false, spec.failed_jobs_history_limit.unwrap_or(1)),
    ] {
        let these: Vec<&Arc<Job>> = finished
            .iter()
            .filter(|(o, _, _)| *o == ok)
            .map(|(_, _, j)| j)
            .collect();
        let extra = these.len().saturating_sub(limit.max(0) as usize);
        for j in these.into_iter().take(extra) {
            let dp = DeleteParams {
                propagation_policy: Some(PropagationPolicy::Background),
                ..Default::default()
            };
            match jobs_api.delete(&j.name_any(), &dp).await {
                Ok(_) => ctx.events.normal(
                    COMPONENT,
                    cj,
                    "SuccessfulDelete",
                    format!("Deleted job {}", j.name_any()),
                ),
                Err(e) if common::is_not_found(&e) => {}
                Err(e) => return Err(e.into()),
            }
        }
    }
    let last_success = finished
        .iter()
        .filter(|(ok, _, _)| *ok)
        .map(|(_, at, _)| *at)
        .max();

    let mut last_scheduled = cj
        .status
        .as_ref()
        .and_then(|s| s.last_schedule_time.as_ref())
        .map(|t| t.0);
    let mut next_look: Option<k8s_openapi::jiff::Timestamp> = None;
    let schedule = Schedule::parse(&spec.schedule);
    let tz = cron::time_zone(spec.time_zone.as_deref());
    match (&schedule, &tz) {
        (Err(e), _) => ctx.events.warning(
            COMPONENT,
            cj,
            "InvalidSchedule",
            format!("invalid schedule: {}: {e}", spec.schedule),
        ),
        (_, Err(e)) => ctx
            .events
            .warning(COMPONENT, cj, "UnknownTimeZone", e.to_string()),
        (Ok(schedule), Ok(tz)) => {
            let created = cj
                .metadata
                .creation_timestamp
                .as_ref()
                .map(|t| t.0)
                .unwrap_or(now);
            let decision = decide(
                schedule,
                tz,
                created,
                last_scheduled,
                spec.starting_deadline_seconds,
                now,
            );
            next_look = schedule.next_after(now, tz);
            match decision {
                Decision::Wait(_) => {}
                Decision::Missed(t) => {
                    ctx.events.warning(
                        COMPONENT,
                        cj,
                        "MissSchedule",
                        format!("Missed scheduled time to start a job: {t}"),
                    );
                    last_scheduled = Some(t);
                }
                Decision::Run(_, _) if spec.suspend == Some(true) => {}
                Decision::Run(t, missed) => {
                    if missed >= MISSED_CAP {
                        ctx.events.warning(
                            COMPONENT,
                            cj,
                            "TooManyMissedTimes",
                            "too many missed start times. Set or decrease .spec.startingDeadlineSeconds or check clock skew".into(),
                        );
                    }
                    let jname = job_name(name, t);
                    let already = jobs.iter().any(|j| j.name_any() == jname);
                    let policy = spec.concurrency_policy.as_deref().unwrap_or("Allow");
                    let run = if already {
                        false
                    } else if !active.is_empty() && policy == "Forbid" {
                        ctx.events.normal(
                            COMPONENT,
                            cj,
                            "JobAlreadyActive",
                            "Not starting job because prior execution is running and concurrency policy is Forbid".into(),
                        );
                        // Looked at again when the running Job finishes.
                        false
                    } else {
                        if policy == "Replace" {
                            for j in &active {
                                let dp = DeleteParams {
                                    propagation_policy: Some(PropagationPolicy::Background),
                                    ..Default::default()
                                };
                                match jobs_api.delete(&j.name_any(), &dp).await {
                                    Ok(_) => ctx.events.normal(
                                        COMPONENT,
                                        cj,
                                        "SuccessfulDelete",
                                        format!("Deleted job {}", j.name_any()),
                                    ),
                                    Err(e) if common::is_not_found(&e) => {}
                                    Err(e) => return Err(e.into()),
                                }
                            }
                            active.clear();
                        }
                        true
                    };
                    if run {
                        let tmpl = spec.job_template.clone();
                        let mut meta = tmpl.metadata.clone().unwrap_or_default();
                        meta.name = Some(jname.clone());
                        meta.generate_name = None;
                        meta.namespace = Some(ns.to_string());
                        meta.annotations
                            .get_or_insert_with(Default::default)
                            .insert(SCHEDULED_AT.into(), t.to_string());
                        meta.owner_references = Some(vec![common::controller_ref(
                            "batch/v1",
                            "CronJob",
                            &cj.metadata,
                        )]);
                        let job = Job {
                            metadata: meta,
                            spec: tmpl.spec.clone(),
                            status: None,
                        };
                        match jobs_api.create(&PostParams::default(), &job).await {
                            Ok(j) => {
                                ctx.events.normal(
                                    COMPONENT,
                                    cj,
                                    "SuccessfulCreate",
                                    format!("Created job {jname}"),
                                );
                                active.push(Arc::new(j));
                            }
                            Err(e) if common::is_conflict(&e) => {}
                            Err(e) => {
                                ctx.events.warning(
                                    COMPONENT,
                                    cj,
                                    "FailedCreate",
                                    format!("Error creating job: {e}"),
                                );
                                return Err(e.into());
                            }
                        }
                    }
                    if run || already {
                        last_scheduled = Some(t);
                    }
                }
            }
        }
    }

    // Status.
    let refs: Vec<serde_json::Value> = active
        .iter()
        .map(|j| json!({"apiVersion": "batch/v1", "kind": "Job", "name": j.name_any(), "namespace": ns, "uid": j.metadata.uid, "resourceVersion": j.metadata.resource_version}))
        .collect();
    let old = cj.status.clone().unwrap_or_default();
    let old_names: Vec<String> = old
        .active
        .iter()
        .flatten()
        .filter_map(|r| r.name.clone())
        .collect();
    let mut new_names: Vec<String> = active.iter().map(|j| j.name_any()).collect();
    let mut sorted_old = old_names.clone();
    sorted_old.sort();
    new_names.sort();
    let changed = sorted_old != new_names
        || old.last_schedule_time.as_ref().map(|t| t.0.as_second())
            != last_scheduled.map(|t| t.as_second())
        || old.last_successful_time.as_ref().map(|t| t.0.as_second())
            != last_success.map(|t| t.as_second());
    if changed {
        let api: Api<CronJob> = Api::namespaced(ctx.client.clone(), ns);
        common::patch_status(
            &api,
            name,
            json!({
                "active": if refs.is_empty() { serde_json::Value::Null } else { json!(refs) },
                "lastScheduleTime": last_scheduled.map(|t| t.to_string()),
                "lastSuccessfulTime": last_success.map(|t| t.to_string()),
            }),
        )
        .await?;
    }
    let wait = next_look
        .map(|t| {
            let d = t.duration_since(now);
            Duration::try_from(d).unwrap_or(Duration::ZERO) + Duration::from_millis(100)
        })
        .unwrap_or(MAX_SLEEP)
        .min(MAX_SLEEP);
    Ok(Some(wait))
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::jiff::tz::TimeZone;

    fn ts(s: &str) -> k8s_openapi::jiff::Timestamp {
        s.parse().unwrap()
    }

    #[test]
    fn nothing_runs_before_the_first_scheduled_time() {
        let s = Schedule::parse("*/5 * * * *").unwrap();
        let d = decide(
            &s,
            &TimeZone::UTC,
            ts("2026-01-01T00:01:00Z"),
            None,
            None,
            ts("2026-01-01T00:03:00Z"),
        );
        assert_eq!(d, Decision::Wait(Some(ts("2026-01-01T00:05:00Z"))));
    }

    #[test]
    fn the_latest_due_time_runs_once() {
        let s = Schedule::parse("* * * * *").unwrap();
        let d = decide(
            &s,
            &TimeZone::UTC,
            ts("2026-01-01T00:00:10Z"),
            None,
            None,
            ts("2026-01-01T00:03:05Z"),
        );
        assert_eq!(d, Decision::Run(ts("2026-01-01T00:03:00Z"), 3));
        // After it ran (lastScheduleTime set) nothing is due until 00:04.
        let d = decide(
            &s,
            &TimeZone::UTC,
            ts("2026-01-01T00:00:10Z"),
            Some(ts("2026-01-01T00:03:00Z")),
            None,
            ts("2026-01-01T00:03:30Z"),
        );
        assert_eq!(d, Decision::Wait(Some(ts("2026-01-01T00:04:00Z"))));
    }

    #[test]
    fn a_start_later_than_the_starting_deadline_is_missed() {
        let s = Schedule::parse("0 * * * *").unwrap();
        let d = decide(
            &s,
            &TimeZone::UTC,
            ts("2026-01-01T00:00:10Z"),
            None,
            Some(60),
            ts("2026-01-01T01:05:00Z"),
        );
        assert!(matches!(d, Decision::Wait(_)), "{d:?}");
        let d = decide(
            &s,
            &TimeZone::UTC,
            ts("2026-01-01T00:00:10Z"),
            None,
            Some(600),
            ts("2026-01-01T01:05:00Z"),
        );
        assert_eq!(d, Decision::Run(ts("2026-01-01T01:00:00Z"), 1));
    }

    #[test]
    fn job_names_are_deterministic_per_scheduled_minute() {
        assert_eq!(
            job_name("backup", ts("2026-01-01T00:03:00Z")),
            format!("backup-{}", ts("2026-01-01T00:03:00Z").as_second() / 60)
        );
    }
}
