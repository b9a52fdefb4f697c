//! Deployments through a real API server with simulated nodes.

mod sim;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use futures::StreamExt;
use k8s_openapi::api::apps::v1::{Deployment, ReplicaSet};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::watcher;
use kube::ResourceExt;
use serde_json::json;
use sim::*;

fn deployment(name: &str, replicas: i32, strategy: serde_json::Value) -> serde_json::Value {
    json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": name},
        "spec": {"replicas": replicas, "strategy": strategy,
            "selector": {"matchLabels": {"app": name}},
            "template": {"metadata": {"labels": {"app": name}},
                "spec": {"containers": [{"name": "c", "image": "busybox:1"}]}}}
    })
}

/// (fewest ready, most live, listed yet)
type Seen = Arc<Mutex<(usize, usize, bool)>>;

/// Watches pods of `app`: the fewest ready and the most live pods seen.
fn observe(client: &kube::Client, app: &str) -> (Seen, tokio::task::JoinHandle<()>) {
    let seen = Arc::new(Mutex::new((usize::MAX, 0usize, false)));
    let s = seen.clone();
    let api: Api<Pod> = Api::namespaced(client.clone(), "default");
    let cfg = watcher::Config::default().labels(&format!("app={app}"));
    let task = tokio::spawn(async move {
        let mut state: HashMap<String, (bool, bool)> = HashMap::new();
        let mut stream = watcher(api, cfg).boxed();
        while let Some(Ok(ev)) = stream.next().await {
            match ev {
                watcher::Event::Apply(p) | watcher::Event::InitApply(p) => {
                    state.insert(
                        p.name_any(),
                        (is_ready(&p), p.metadata.deletion_timestamp.is_none()),
                    );
                }
                watcher::Event::Delete(p) => {
                    state.remove(&p.name_any());
                }
                watcher::Event::InitDone => {
                    s.lock().unwrap().2 = true;
                }
                watcher::Event::Init => {}
            }
            let ready = state.values().filter(|(r, _)| *r).count();
            let live = state.values().filter(|(_, l)| *l).count();
            let mut g = s.lock().unwrap();
            if g.2 {
                g.0 = g.0.min(ready);
                g.1 = g.1.max(live);
            }
        }
    });
    (seen, task)
}

async fn rollout_done(c: &kube::Client, name: &str, replicas: i32) -> Deployment {
    eventually("the rollout to finish", 60, || async {
        let d = Api::<Deployment>::namespaced(c.clone(), "default")
            .get(name)
            .await
            .ok()?;
        let s = d.status.clone()?;
        let progressing = s
            .conditions
            .iter()
            .flatten()
            .find(|c| c.type_ == "Progressing")?;
        (s.observed_generation >= d.metadata.generation
            && s.updated_replicas == Some(replicas)
            && s.replicas == Some(replicas)
            && s.available_replicas == Some(replicas)
            && progressing.reason.as_deref() == Some("NewReplicaSetAvailable"))
        .then_some(d)
    })
    .await
}

async fn sets(c: &kube::Client, app: &str) -> Vec<ReplicaSet> {
    let mut l = Api::<ReplicaSet>::namespaced(c.clone(), "default")
        .list(&kube::api::ListParams::default().labels(&format!("app={app}")))
        .await
        .unwrap()
        .items;
    l.sort_by_key(|rs| {
        rs.annotations()
            .get("deployment.kubernetes.io/revision")
            .cloned()
    });
    l
}

#[tokio::test]
async fn a_rolling_update_never_drops_below_the_availability_bound_and_ends_on_the_new_set() {
    let h = start().await;
    let c = &h.client;
    let strategy =
        json!({"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 1}});
    let _: Deployment = create(c, "default", deployment("web", 4, strategy)).await;
    rollout_done(c, "web", 4).await;
    let first = sets(c, "web").await;
    assert_eq!(first.len(), 1);
    assert!(first[0].labels().contains_key("pod-template-hash"));
    assert_eq!(
        first[0]
            .annotations()
            .get("deployment.kubernetes.io/revision")
            .map(String::as_str),
        Some("1")
    );
    assert_eq!(
        first[0]
            .annotations()
            .get("deployment.kubernetes.io/desired-replicas")
            .map(String::as_str),
        Some("4")
    );
    assert_eq!(
        first[0]
            .annotations()
            .get("deployment.kubernetes.io/max-replicas")
            .map(String::as_str),
        Some("5")
    );

    let (seen, watch) = observe(c, "web");
    eventually("the watch to list", 10, || async {
        seen.lock().unwrap().2.then_some(())
    })
    .await;
    Api::<Deployment>::namespaced(c.clone(), "default")
        .patch("web", &PatchParams::default(), &Patch::Merge(&json!({"spec": {"template": {"spec": {"containers": [{"name": "c", "image": "busybox:2"}]}}}})))
        .await
        .unwrap();
    let d = rollout_done(c, "web", 4).await;
    watch.abort();
    let (min_ready, max_live, _) = *seen.lock().unwrap();
    assert!(min_ready >= 3, "ready pods fell to {min_ready} (bound 3)");
    assert!(max_live <= 5, "{max_live} pods at once (bound 5)");
    let s = sets(c, "web").await;
    assert_eq!(s.len(), 2);
    let spec = |rs: &ReplicaSet| rs.spec.as_ref().unwrap().replicas.unwrap();
    assert_eq!((spec(&s[0]), spec(&s[1])), (0, 4));
    assert_eq!(
        d.annotations()
            .get("deployment.kubernetes.io/revision")
            .map(String::as_str),
        Some("2")
    );
    let p = pods(c, "default", "app=web").await;
    assert_eq!(p.len(), 4);
    assert!(p
        .iter()
        .all(|p| p.spec.as_ref().unwrap().containers[0].image.as_deref() == Some("busybox:2")));

    // A rollout whose new pods never become ready stalls exactly at the
    // bound: 3 ready (4 − maxUnavailable), 5 pods (4 + maxSurge).
    let (seen, watch) = observe(c, "web");
    eventually("the watch to list", 10, || async {
        seen.lock().unwrap().2.then_some(())
    })
    .await;
    Api::<Deployment>::namespaced(c.clone(), "default")
        .patch(
            "web",
            &PatchParams::default(),
            &Patch::Merge(&json!({"spec": {"template": {
            "metadata": {"annotations": {"sim/ready": "false"}},
            "spec": {"containers": [{"name": "c", "image": "busybox:3"}]}}}})),
        )
        .await
        .unwrap();
    // Stalled means: five pods, three of them ready, and the Deployment's
    // status (written after the controller acted on the new template)
    // says so too.
    let stalled = eventually("the rollout to stall at the bound", 30, || async {
        let p = pods(c, "default", "app=web").await;
        let d = Api::<Deployment>::namespaced(c.clone(), "default")
            .get("web")
            .await
            .ok()?;
        let st = d.status.as_ref()?;
        let observed = st.observed_generation == d.metadata.generation;
        (observed
            && p.len() == 5
            && p.iter().filter(|p| is_ready(p)).count() == 3
            && st.replicas == Some(5))
        .then_some(p)
    })
    .await;
    watch.abort();
    let (min_ready, max_live, _) = *seen.lock().unwrap();
    assert_eq!(
        min_ready, 3,
        "the stalled rollout went below or never reached the bound"
    );
    assert_eq!(max_live, 5);
    assert_eq!(stalled.iter().filter(|p| is_ready(p)).count(), 3);
    // Undo to busybox:2 (the template of revision 2).
    let s = sets(c, "web").await;
    let rev2 = s
        .iter()
        .find(|rs| {
            rs.annotations()
                .get("deployment.kubernetes.io/revision")
                .map(String::as_str)
                == Some("2")
        })
        .unwrap();
    let mut t =
        serde_json::to_value(rev2.spec.as_ref().unwrap().template.clone().unwrap()).unwrap();
    t["metadata"]["labels"]
        .as_object_mut()
        .unwrap()
        .remove("pod-template-hash");
    Api::<Deployment>::namespaced(c.clone(), "default")
        .replace("web", &Default::default(), &{
            let mut d = Api::<Deployment>::namespaced(c.clone(), "default")
                .get("web")
                .await
                .unwrap();
            d.spec.as_mut().unwrap().template = serde_json::from_value(t).unwrap();
            d
        })
        .await
        .unwrap();
    rollout_done(c, "web", 4).await;
    let s = sets(c, "web").await;
    assert_eq!(s.len(), 3);
    assert!(pods(c, "default", "app=web").await.iter().all(|p| p
        .spec
        .as_ref()
        .unwrap()
        .containers[0]
        .image
        .as_deref()
        == Some("busybox:2")));

    // Rolling back (what kubectl rollout undo does: the old template back)
    // reuses the first set, which becomes revision 5 (after 3 for
    // busybox:3 and 4 for busybox:2 again).
    let old_template = s[0].spec.as_ref().unwrap().template.clone().unwrap();
    let mut t = serde_json::to_value(old_template).unwrap();
    t["metadata"]["labels"]
        .as_object_mut()
        .unwrap()
        .remove("pod-template-hash");
    Api::<Deployment>::namespaced(c.clone(), "default")
        .patch(
            "web",
            &PatchParams::default(),
            &Patch::Merge(&json!({"spec": {"template": t}})),
        )
        .await
        .unwrap();
    rollout_done(c, "web", 4).await;
    eventually(
        "the first set is revision 5 with all replicas",
        30,
        || async {
            let s = sets(c, "web").await;
            let first = s
                .iter()
                .find(|rs| rs.metadata.uid == first[0].metadata.uid)?;
            (first
                .annotations()
                .get("deployment.kubernetes.io/revision")
                .map(String::as_str)
                == Some("5")
                && spec(first) == 4
                && s.len() == 3)
                .then_some(())
        },
    )
    .await;
}

#[tokio::test]
async fn recreate_removes_every_old_pod_before_starting_new_ones() {
    let h = start().await;
    let c = &h.client;
    let _: Deployment = create(
        c,
        "default",
        deployment("db", 3, json!({"type": "Recreate"})),
    )
    .await;
    rollout_done(c, "db", 3).await;
    let (seen, watch) = observe(c, "db");
    eventually("the watch to list", 10, || async {
        seen.lock().unwrap().2.then_some(())
    })
    .await;
    Api::<Deployment>::namespaced(c.clone(), "default")
        .patch("db", &PatchParams::default(), &Patch::Merge(&json!({"spec": {"template": {"spec": {"containers": [{"name": "c", "image": "busybox:2"}]}}}})))
        .await
        .unwrap();
    rollout_done(c, "db", 3).await;
    watch.abort();
    let (min_ready, max_live, _) = *seen.lock().unwrap();
    assert_eq!(min_ready, 0, "Recreate goes through zero");
    assert!(max_live <= 3, "old and new pods overlapped: {max_live}");
}

#[tokio::test]
async fn scaling_a_deployment_scales_its_set_and_paused_deployments_do_not_roll_out() {
    let h = start().await;
    let c = &h.client;
    let _: Deployment = create(c, "default", deployment("api", 2, json!({}))).await;
    rollout_done(c, "api", 2).await;
    let api = Api::<Deployment>::namespaced(c.clone(), "default");
    api.patch(
        "api",
        &PatchParams::default(),
        &Patch::Merge(&json!({"spec": {"replicas": 5}})),
    )
    .await
    .unwrap();
    rollout_done(c, "api", 5).await;
    api.patch(
        "api",
        &PatchParams::default(),
        &Patch::Merge(&json!({"spec": {"paused": true}})),
    )
    .await
    .unwrap();
    api.patch("api", &PatchParams::default(), &Patch::Merge(&json!({"spec": {"template": {"spec": {"containers": [{"name": "c", "image": "busybox:3"}]}}}})))
        .await
        .unwrap();
    // The controller has seen the template change (observedGeneration) and
    // still made no set for it: a sentinel, not a sleep.
    eventually("the paused condition for the new template", 20, || async {
        let d = api.get("api").await.ok()?;
        let generation = d.metadata.generation;
        let s = d.status?;
        (s.observed_generation == generation
            && s.conditions?
                .iter()
                .any(|c| c.reason.as_deref() == Some("DeploymentPaused")))
        .then_some(())
    })
    .await;
    assert_eq!(
        sets(c, "api").await.len(),
        1,
        "a paused deployment made a new set"
    );
    api.patch(
        "api",
        &PatchParams::default(),
        &Patch::Merge(&json!({"spec": {"paused": false}})),
    )
    .await
    .unwrap();
    rollout_done(c, "api", 5).await;
    assert_eq!(sets(c, "api").await.len(), 2);
}

#[tokio::test]
async fn a_controller_manager_killed_mid_rollout_finishes_it_with_exactly_the_right_pods() {
    let mut h = start().await;
    let c = h.client.clone();
    let strategy =
        json!({"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 2, "maxUnavailable": 0}});
    let _: Deployment = create(&c, "default", deployment("kill", 6, strategy)).await;
    rollout_done(&c, "kill", 6).await;
    Api::<Deployment>::namespaced(c.clone(), "default")
        .patch("kill", &PatchParams::default(), &Patch::Merge(&json!({"spec": {"template": {"spec": {"containers": [{"name": "c", "image": "busybox:2"}]}}}})))
        .await
        .unwrap();
    // Kill it as soon as the new set exists.
    eventually("the new set", 20, || {
        let c = c.clone();
        async move { (sets(&c, "kill").await.len() == 2).then_some(()) }
    })
    .await;
    h.kill_manager().await;
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    h.start_manager(Default::default());
    rollout_done(&c, "kill", 6).await;
    tokio::time::sleep(std::time::Duration::from_millis(1000)).await;
    let p = pods(&c, "default", "app=kill").await;
    assert_eq!(
        p.len(),
        6,
        "pods: {:?}",
        p.iter().map(|p| p.name_any()).collect::<Vec<_>>()
    );
    assert!(p
        .iter()
        .all(|p| p.spec.as_ref().unwrap().containers[0].image.as_deref() == Some("busybox:2")));
}

#[tokio::test]
async fn a_rollout_that_cannot_progress_reports_progress_deadline_exceeded() {
    let h = start().await;
    let c = &h.client;
    let mut d = deployment("stuck", 1, json!({}));
    d["spec"]["progressDeadlineSeconds"] = json!(2);
    d["spec"]["template"]["metadata"]["annotations"] = json!({"sim/ready": "false"});
    let _: Deployment = create(c, "default", d).await;
    eventually("ProgressDeadlineExceeded", 30, || async {
        let d = Api::<Deployment>::namespaced(c.clone(), "default")
            .get("stuck")
            .await
            .ok()?;
        let p = d
            .status?
            .conditions?
            .into_iter()
            .find(|c| c.type_ == "Progressing")?;
        (p.status == "False" && p.reason.as_deref() == Some("ProgressDeadlineExceeded"))
            .then_some(())
    })
    .await;
}
