//! Jobs and CronJobs: defaults, the spec checks and the schedule, the
//! `status.successful` field selector, tables; a Job orphans its pods when
//! a delete names no policy.

use super::prelude::*;

pub struct Job;

impl KindRules for Job {
    fn kind(&self) -> &'static str {
        "Job"
    }

    fn defaults(&self, obj: &mut Value) {
        crate::defaults::job_spec(obj.get_mut("spec"));
    }

    fn initial_status(&self) -> Option<Value> {
        Some(json!({}))
    }

    fn validate(&self, obj: &Value) -> Vec<Cause> {
        let mut c = Vec::new();
        crate::validation::job_spec(obj.get("spec"), "spec", &mut c);
        c
    }

    fn selectable_fields(&self) -> &'static [&'static str] {
        &["status.successful"]
    }

    fn printer(&self) -> &'static Printer {
        &JOB_PRINTER
    }

    fn tracks_generation(&self) -> bool {
        true
    }

    fn orphans_by_default(&self) -> bool {
        true
    }
}

pub struct CronJob;

impl KindRules for CronJob {
    fn kind(&self) -> &'static str {
        "CronJob"
    }

    fn defaults(&self, obj_v: &mut Value) {
        if let Some(spec) = child(obj_v, "spec") {
            set_default(spec, "concurrencyPolicy", json!("Allow"));
            set_default(spec, "suspend", json!(false));
            set_default(spec, "successfulJobsHistoryLimit", json!(3));
            set_default(spec, "failedJobsHistoryLimit", json!(1));
        }
        crate::defaults::job_spec(obj_v.pointer_mut("/spec/jobTemplate/spec"));
    }

    fn initial_status(&self) -> Option<Value> {
        Some(json!({}))
    }

    fn validate(&self, obj: &Value) -> Vec<Cause> {
        let mut c = Vec::new();
        match obj.pointer("/spec/schedule").and_then(Value::as_str) {
            None | Some("") => c.push(Cause::required("spec.schedule")),
            Some(s) => {
                if !crate::validation::cron_ok(s) {
                    c.push(Cause::invalid(
                        "spec.schedule",
                        &json!(s),
                        "invalid schedule format",
                    ));
                }
            }
        }
        crate::validation::job_spec(
            obj.pointer("/spec/jobTemplate/spec"),
            "spec.jobTemplate.spec",
            &mut c,
        );
        c
    }

    fn printer(&self) -> &'static Printer {
        &CRON_JOB_PRINTER
    }

    fn tracks_generation(&self) -> bool {
        true
    }
}

pub static JOB_PRINTER: Printer = Printer {
    columns: &[
        NAME,
        col("Status", "string", 0),
        col("Completions", "string", 0),
        col("Duration", "string", 0),
        AGE,
        col("Containers", "string", 1),
        col("Images", "string", 1),
        col("Selector", "string", 1),
    ],
    cells: job_cells,
};

fn job_cells(obj: &Value, now: DateTime<Utc>) -> Vec<Value> {
    let name = json!(s(obj, "/metadata/name"));
    let created = json!(age(obj, "/metadata/creationTimestamp", now));
    let (c, im) = containers_images(obj, "/spec/template/spec");
    let conds = obj
        .pointer("/status/conditions")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let has = |t: &str| {
        conds
            .iter()
            .any(|c| c["type"] == t && c["status"] == "True")
    };
    let status = if has("Complete") {
        "Complete"
    } else if has("Failed") {
        "Failed"
    } else if has("Suspended") {
        "Suspended"
    } else {
        "Running"
    };
    let completions = match obj.pointer("/spec/completions").and_then(Value::as_i64) {
        Some(n) => format!("{}/{n}", i(obj, "/status/succeeded")),
        None => format!(
            "{}/1 of {}",
            i(obj, "/status/succeeded"),
            i(obj, "/spec/parallelism").max(1)
        ),
    };
    let start = obj
        .pointer("/status/startTime")
        .and_then(Value::as_str)
        .and_then(|t| DateTime::parse_from_rfc3339(t).ok());
    let end = obj
        .pointer("/status/completionTime")
        .and_then(Value::as_str)
        .and_then(|t| DateTime::parse_from_rfc3339(t).ok());
    let duration = match (start, end) {
        (Some(a), Some(b)) => human_duration(b - a),
        (Some(a), None) => human_duration(now - a.with_timezone(&Utc)),
        _ => String::new(),
    };
    vec![
        name,
        json!(status),
        json!(completions),
        json!(duration),
        created,
        json!(c),
        json!(im),
        json!(selector(obj)),
    ]
}

pub static CRON_JOB_PRINTER: Printer = Printer {
    columns: &[
        NAME,
        col("Schedule", "string", 0),
        col("Timezone", "string", 0),
        col("Suspend", "boolean", 0),
        col("Active", "integer", 0),
        col("Last Schedule", "string", 0),
        AGE,
        col("Containers", "string", 1),
        col("Images", "string", 1),
        col("Selector", "string", 1),
    ],
    cells: cron_job_cells,
};

fn cron_job_cells(obj: &Value, now: DateTime<Utc>) -> Vec<Value> {
    let name = json!(s(obj, "/metadata/name"));
    let created = json!(age(obj, "/metadata/creationTimestamp", now));
    let (c, im) = containers_images(obj, "/spec/jobTemplate/spec/template/spec");
    let last = match obj.pointer("/status/lastScheduleTime") {
        Some(_) => age(obj, "/status/lastScheduleTime", now),
        None => "<none>".into(),
    };
    vec![
        name,
        json!(s(obj, "/spec/schedule")),
        json!(or_none(s(obj, "/spec/timeZone"))),
        json!(obj
            .pointer("/spec/suspend")
            .and_then(Value::as_bool)
            .unwrap_or(false)),
        json!(obj
            .pointer("/status/active")
            .and_then(Value::as_array)
            .map(|a| a.len())
            .unwrap_or(0)),
        json!(last),
        created,
        json!(c),
        json!(im),
        json!(selector(obj)),
    ]
}
