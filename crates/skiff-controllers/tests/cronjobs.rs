//! CronJobs through a real API server, with the controller's clock moved
//! forward instead of waiting for minutes to pass.

mod sim;

use k8s_openapi::api::batch::v1::{CronJob, Job};
use kube::api::{Api, ListParams, Patch, PatchParams};
use serde_json::json;
use sim::*;

fn cronjob(name: &str, policy: &str, exit: Option<&str>) -> serde_json::Value {
    let mut ann = json!({});
    if let Some(e) = exit {
        ann["sim/exit"] = json!(e);
    }
    json!({
        "apiVersion": "batch/v1", "kind": "CronJob",
        "metadata": {"name": name},
        "spec": {"schedule": "* * * * *", "concurrencyPolicy": policy,
            "successfulJobsHistoryLimit": 1,
            "jobTemplate": {"spec": {"template": {"metadata": {"annotations": ann},
                "spec": {"restartPolicy": "Never", "containers": [{"name": "c", "image": "busybox"}]}}}}}
    })
}

async fn jobs_of(c: &kube::Client, cj: &str) -> Vec<Job> {
    Api::<Job>::namespaced(c.clone(), "default")
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|j| {
            j.metadata
                .owner_references
                .iter()
                .flatten()
                .any(|r| r.name == cj)
        })
        .collect()
}

async fn tick(c: &kube::Client, clock: &skiff_controllers::Clock, name: &str, n: i64) {
    clock.advance(60);
    // Any change wakes the controller (it also wakes by itself at the next
    // scheduled time of its clock, which is at most 30 s away).
    Api::<CronJob>::namespaced(c.clone(), "default")
        .patch(
            name,
            &PatchParams::default(),
            &Patch::Merge(&json!({"metadata": {"labels": {"tick": n.to_string()}}})),
        )
        .await
        .unwrap();
}

#[tokio::test]
async fn a_cronjob_fires_each_minute_and_keeps_its_history_limit() {
    let opts = skiff_controllers::Options::default();
    let clock = opts.clock.clone();
    let h = start_with(opts, 1).await;
    let c = &h.client;
    let _: CronJob = create(c, "default", cronjob("tick", "Allow", Some("0"))).await;
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    assert!(jobs_of(c, "tick").await.is_empty(), "fired before its time");
    tick(c, &clock, "tick", 1).await;
    let first = eventually("a job", 20, || async {
        let j = jobs_of(c, "tick").await;
        (j.len() == 1).then(|| j[0].clone())
    })
    .await;
    assert!(first
        .metadata
        .annotations
        .as_ref()
        .unwrap()
        .contains_key("batch.kubernetes.io/cronjob-scheduled-timestamp"));
    eventually(
        "the job to complete and the status to say so",
        30,
        || async {
            let cj = Api::<CronJob>::namespaced(c.clone(), "default")
                .get("tick")
                .await
                .ok()?;
            let s = cj.status?;
            (s.last_schedule_time.is_some()
                && s.last_successful_time.is_some()
                && s.active.unwrap_or_default().is_empty())
            .then_some(())
        },
    )
    .await;
    tick(c, &clock, "tick", 2).await;
    // A second run; with successfulJobsHistoryLimit 1 the first goes.
    eventually("the second job, and the first deleted", 30, || async {
        let j = jobs_of(c, "tick").await;
        let live: Vec<_> = j
            .iter()
            .filter(|j| j.metadata.deletion_timestamp.is_none())
            .collect();
        (live.len() == 1
            && live[0].metadata.name != first.metadata.name
            && live[0].status.as_ref().and_then(|s| s.succeeded) == Some(1))
        .then_some(())
    })
    .await;
}

#[tokio::test]
async fn forbid_skips_a_run_while_one_is_active_and_replace_replaces_it() {
    let opts = skiff_controllers::Options::default();
    let clock = opts.clock.clone();
    let h = start_with(opts, 1).await;
    let c = &h.client;
    let _: CronJob = create(c, "default", cronjob("forbid", "Forbid", None)).await;
    let _: CronJob = create(c, "default", cronjob("replace", "Replace", None)).await;
    tick(c, &clock, "forbid", 1).await;
    tick(c, &clock, "replace", 1).await;
    let firsts = eventually("one job each", 20, || async {
        let f = jobs_of(c, "forbid").await;
        let r = jobs_of(c, "replace").await;
        (f.len() == 1 && r.len() == 1).then(|| (f[0].clone(), r[0].clone()))
    })
    .await;
    let cj = Api::<CronJob>::namespaced(c.clone(), "default")
        .get("forbid")
        .await
        .unwrap();
    eventually("active listed", 20, || async {
        let cj = Api::<CronJob>::namespaced(c.clone(), "default")
            .get("forbid")
            .await
            .ok()?;
        (cj.status?.active?.len() == 1).then_some(())
    })
    .await;
    drop(cj);
    tick(c, &clock, "forbid", 2).await;
    tick(c, &clock, "replace", 2).await;
    eventually("the replacement", 20, || async {
        let r = jobs_of(c, "replace").await;
        let live: Vec<_> = r
            .iter()
            .filter(|j| j.metadata.deletion_timestamp.is_none())
            .collect();
        (live.len() == 1 && live[0].metadata.uid != firsts.1.metadata.uid).then_some(())
    })
    .await;
    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    let f = jobs_of(c, "forbid").await;
    assert_eq!(f.len(), 1, "Forbid started a second job");
    assert_eq!(f[0].metadata.uid, firsts.0.metadata.uid);
}
