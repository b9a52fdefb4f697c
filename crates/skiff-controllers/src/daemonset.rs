//! The DaemonSet controller: one pod per eligible node (the node fits the
//! template's nodeSelector and required affinity and its NoSchedule /
//! NoExecute taints are tolerated). Each pod carries required node
//! affinity to its node (`matchFields metadata.name`), so the default
//! scheduler binds it there, and the tolerations Kubernetes adds to daemon
//! pods for node conditions. Updates roll node by node (RollingUpdate with
//! maxUnavailable / maxSurge) or wait for deletions (OnDelete); each
//! template is recorded as a ControllerRevision (`kubectl rollout history`).

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{Node, Pod, PodSpec, PodTemplateSpec, Taint, Toleration};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::api::{Api, DeleteParams, PostParams, Preconditions};
use kube::ResourceExt;
use serde_json::json;

use crate::common::{self, Expectations};
use crate::controller::Controller;
use crate::framework::{self, Next};
use crate::{Ctx, Error};

const COMPONENT: &str = "daemonset-controller";
pub use skiff_helpers::workloads::CONTROLLER_REVISION_HASH as REVISION_HASH;
pub const TEMPLATE_GENERATION: &str = "pod-template-generation";

/// A node, its pod of the current template (if any) and its older pods.
type NodePods = (String, Option<Arc<Pod>>, Vec<Arc<Pod>>);

pub struct State {
    expectations: Expectations,
}

pub fn register(ctx: &Arc<Ctx>, tasks: &mut tokio::task::JoinSet<()>) {
    let st = Arc::new(State {
        expectations: Expectations::default(),
    });
    let seen = st.clone();
    Controller::new(ctx, "daemonset", &ctx.caches.daemonsets)
        .watches(&ctx.caches.pods, move |_, old, new| {
            seen.expectations.observe_pod_change("DaemonSet", old, new);
            common::owner_keys("DaemonSet", old, new)
        })
        // Any node change may change where daemons run.
        .watches(&ctx.caches.nodes, |c, old, new| {
            let changed = match (old, new) {
                (Some(o), Some(n)) => {
                    o.metadata.labels != n.metadata.labels
                        || o.spec.as_ref().and_then(|s| s.taints.as_ref())
                            != n.spec.as_ref().and_then(|s| s.taints.as_ref())
                }
                _ => true,
            };
            if changed {
                c.caches.daemonsets.keys()
            } else {
                vec![]
            }
        })
        .workers(ctx.options.workers.min(4))
        .resync(Duration::from_secs(60))
        .run(tasks, st, |c, st, key| async move {
            reconcile(&c, &st, &key).await
        });
}

/// The tolerations Kubernetes adds to every daemon pod.
pub fn daemon_tolerations(spec: &PodSpec) -> Vec<Toleration> {
    let mut out = spec.tolerations.clone().unwrap_or_default();
    let mut add = |key: &str, effect: &str| {
        if !out
            .iter()
            .any(|t| t.key.as_deref() == Some(key) && t.effect.as_deref() == Some(effect))
        {
            out.push(Toleration {
                key: Some(key.into()),
                operator: Some("Exists".into()),
                effect: Some(effect.into()),
                ..Default::default()
            });
        }
    };
    add("node.kubernetes.io/not-ready", "NoExecute");
    add("node.kubernetes.io/unreachable", "NoExecute");
    add("node.kubernetes.io/disk-pressure", "NoSchedule");
    add("node.kubernetes.io/memory-pressure", "NoSchedule");
    add("node.kubernetes.io/pid-pressure", "NoSchedule");
    add("node.kubernetes.io/unschedulable", "NoSchedule");
    if spec.host_network == Some(true) {
        add("node.kubernetes.io/network-unavailable", "NoSchedule");
    }
    out
}

/// Whether a daemon pod of `template` should run on `node`.
pub fn should_run(node: &Node, template: &PodTemplateSpec) -> bool {
    let spec = template.spec.clone().unwrap_or_default();
    if !common::node_fits(node, &spec) {
        return false;
    }
    let tolerations = daemon_tolerations(&spec);
    let taints: Vec<Taint> = node
        .spec
        .as_ref()
        .and_then(|s| s.taints.clone())
        .unwrap_or_default();
    taints
        .iter()
        .filter(|t| t.effect == "NoSchedule" || t.effect == "NoExecute")
        .all(|t| {
            tolerations
                .iter()
                .any(|tol| skiff_helpers::scheduling::tolerates(tol, t))
        })
}

/// The node a daemon pod is for: its nodeName, or its affinity target.
pub fn node_of(p: &Pod) -> Option<String> {
    let spec = p.spec.as_ref()?;
    if let Some(n) = spec.node_name.clone().filter(|n| !n.is_empty()) {
        return Some(n);
    }
    spec.affinity
        .as_ref()?
        .node_affinity
        .as_ref()?
        .required_during_scheduling_ignored_during_execution
        .as_ref()?
        .node_selector_terms
        .iter()
        .flat_map(|t| t.match_fields.iter().flatten())
        .find(|f| f.key == "metadata.name" && f.operator == "In")
        .and_then(|f| f.values.as_ref()?.first().cloned())
}

/// A daemon pod for `node`.
pub fn daemon_pod(ds: &DaemonSet, template: &PodTemplateSpec, hash: &str, node: &str) -> Pod {
    let mut pod =
        skiff_helpers::workloads::pod_from_template(template, &ds.metadata, "apps/v1", "DaemonSet");
    let labels = pod.metadata.labels.get_or_insert_with(BTreeMap::new);
    labels.insert(REVISION_HASH.into(), hash.to_string());
    labels.insert(
        TEMPLATE_GENERATION.into(),
        ds.metadata.generation.unwrap_or(1).to_string(),
    );
    let mut spec = pod.spec.clone().unwrap_or_default();
    spec.tolerations = Some(daemon_tolerations(&spec));
    let mut affinity = serde_json::to_value(spec.affinity.clone().unwrap_or_default())
        .unwrap_or_else(|_| json!({}));
    let field = json!({"key": "metadata.name", "operator": "In", "values": [node]});
    let terms = affinity
        .pointer("/nodeAffinity/requiredDuringSchedulingIgnoredDuringExecution/nodeSelectorTerms")
        .and_then(|t| t.as_array().cloned())
        .filter(|t| !t.is_empty());
    let terms: Vec<serde_json::Value> = match terms {
        Some(ts) => ts
            .into_iter()
            .map(|mut t| {
                t["matchFields"] = json!([field]);
                t
            })
            .collect(),
        None => vec![json!({"matchFields": [field]})],
    };
    affinity["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"] =
        json!({"nodeSelectorTerms": terms});
    spec.affinity = serde_json::from_value(affinity).ok();
    pod.spec = Some(spec);
    pod
}

async fn reconcile(ctx: &Ctx, st: &State, key: &str) -> Result<Next, Error> {
    let Some(ds) = ctx.caches.daemonsets.get(key) else {
        st.expectations.forget(key);
        return Ok(None);
    };
    let ds: &DaemonSet = &ds;
    if common::is_terminating(&ds.metadata) {
        return Ok(None);
    }
    let (ns, name) = framework::split_key(key);
    let spec = ds.spec.clone().unwrap_or_default();
    let template = spec.template.clone();
    let hash = skiff_helpers::workloads::template_hash(
        &template,
        ds.status.as_ref().and_then(|s| s.collision_count),
    );
    common::ensure_revision(ctx, &ds.metadata, "DaemonSet", &hash, &template).await?;
    let uid = ds.metadata.uid.clone().unwrap_or_default();
    let selector = spec.selector.clone();
    let client = ctx.client.clone();
    let claimed = common::claim(
        |ns| Api::<Pod>::namespaced(client.clone(), ns),
        &ds.metadata,
        "apps/v1",
        "DaemonSet",
        |l| !common::selector_is_empty(&selector) && common::selector_matches(&selector, l),
        ctx.caches.pods.owned_by(&uid),
        ctx.caches.pods.orphans_in(ns),
    )
    .await;
    let settled = st.expectations.satisfied(key);
    let pods_api: Api<Pod> = Api::namespaced(ctx.client.clone(), ns);
    let min_ready = spec.min_ready_seconds.unwrap_or(0);
    let now = common::now();

    let mut by_node: HashMap<String, Vec<Arc<Pod>>> = HashMap::new();
    let mut unplaced: Vec<Arc<Pod>> = vec![];
    for p in claimed
        .iter()
        .filter(|p| !common::is_terminating(&p.metadata))
    {
        match node_of(p) {
            Some(n) => by_node.entry(n).or_default().push(p.clone()),
            None => unplaced.push(p.clone()),
        }
    }
    let nodes = ctx.caches.nodes.list();
    let mut to_create: Vec<String> = vec![];
    let mut to_delete: Vec<Arc<Pod>> = unplaced;
    let (mut desired, mut current, mut misscheduled, mut ready, mut updated, mut available) =
        (0, 0, 0, 0, 0, 0);
    // Per eligible node: (new pod available?, old pods) for rolling updates.
    let mut rolling: Vec<NodePods> = vec![];
    for node in &nodes {
        let nname = node.name_any();
        let here = by_node.remove(&nname).unwrap_or_default();
        let (failed, mut live): (Vec<_>, Vec<_>) =
            here.into_iter().partition(|p| common::phase(p) == "Failed");
        to_delete.extend(failed);
        if !should_run(node, &template) {
            if !live.is_empty() {
                misscheduled += 1;
            }
            to_delete.extend(live);
            continue;
        }
        desired += 1;
        if live.is_empty() {
            to_create.push(nname);
            continue;
        }
        current += 1;
        live.sort_by_key(|p| p.metadata.creation_timestamp.as_ref().map(|t| t.0));
        let (new, old): (Vec<_>, Vec<_>) = live
            .into_iter()
            .partition(|p| p.labels().get(REVISION_HASH) == Some(&hash));
        let mut new = new.into_iter();
        let keep_new = new.next();
        to_delete.extend(new); // duplicates
        if let Some(p) = &keep_new {
            updated += 1;
            if common::pod_ready(p) {
                ready += 1;
            }
            if common::pod_available(p, min_ready, now) {
                available += 1;
            }
        } else if let Some(p) = old.first() {
            if common::pod_ready(p) {
                ready += 1;
            }
            if common::pod_available(p, min_ready, now) {
                available += 1;
            }
        }
        if keep_new.is_some() || old.len() <= 1 {
            rolling.push((nname, keep_new, old));
        } else {
            // Several old pods and no new one: keep the oldest.
            let mut old = old.into_iter();
            let first = old.next();
            to_delete.extend(old);
            rolling.push((nname, None, first.into_iter().collect()));
        }
    }
    // Pods for nodes that no longer exist.
    for (_, ps) in by_node {
        misscheduled += 1;
        to_delete.extend(ps);
    }

    // Rolling update.
    let strategy = spec.update_strategy.clone().unwrap_or_default();
    if strategy.type_.as_deref().unwrap_or("RollingUpdate") == "RollingUpdate" {
        let ru = strategy.rolling_update.clone().unwrap_or_default();
        let max_unavailable = common::scaled_value(
            ru.max_unavailable.as_ref().unwrap_or(&IntOrString::Int(1)),
            desired,
            true,
        )
        .unwrap_or(1)
        .max(0);
        let max_surge = common::scaled_value(
            ru.max_surge.as_ref().unwrap_or(&IntOrString::Int(0)),
            desired,
            true,
        )
        .unwrap_or(0)
        .max(0);
        let max_unavailable = if max_surge == 0 {
            max_unavailable.max(1)
        } else {
            max_unavailable
        };
        let unavailable_now = desired - available;
        let mut budget = max_unavailable - unavailable_now;
        let mut surge = max_surge
            - rolling
                .iter()
                .filter(|(_, new, old)| new.is_some() && !old.is_empty())
                .count() as i32;
        for (node, new, old) in &rolling {
            if old.is_empty() {
                continue;
            }
            match new {
                Some(n) if common::pod_available(n, min_ready, now) => {
                    // Surged: the new pod is ready, the old one goes.
                    to_delete.extend(old.iter().cloned());
                }
                Some(_) => {}
                None => {
                    let old_available =
                        old.iter().any(|p| common::pod_available(p, min_ready, now));
                    if !old_available {
                        to_delete.extend(old.iter().cloned());
                    } else if surge > 0 {
                        surge -= 1;
                        to_create.push(node.clone());
                    } else if budget > 0 && max_surge == 0 {
                        budget -= 1;
                        to_delete.extend(old.iter().cloned());
                    }
                }
            }
        }
    }

    let mut result: Result<(), Error> = Ok(());
    if settled {
        if !to_create.is_empty() {
            st.expectations.expect_creations(key, to_create.len());
            for node in &to_create {
                let pod = daemon_pod(ds, &template, &hash, node);
                match pods_api.create(&PostParams::default(), &pod).await {
                    Ok(p) => ctx.events.normal(
                        COMPONENT,
                        ds,
                        "SuccessfulCreate",
                        format!("Created pod: {}", p.name_any()),
                    ),
                    Err(e) => {
                        st.expectations.creation_observed(key);
                        ctx.events.warning(
                            COMPONENT,
                            ds,
                            "FailedCreate",
                            format!("Error creating: {e}"),
                        );
                        result = Err(e.into());
                    }
                }
            }
        }
        for p in &to_delete {
            let pname = p.name_any();
            st.expectations.expect_delete(key, &pname);
            let dp = DeleteParams {
                preconditions: Some(Preconditions {
                    uid: p.metadata.uid.clone(),
                    resource_version: None,
                }),
                ..Default::default()
            };
            match pods_api.delete(&pname, &dp).await {
                Ok(_) => ctx.events.normal(
                    COMPONENT,
                    ds,
                    "SuccessfulDelete",
                    format!("Deleted pod: {pname}"),
                ),
                Err(e) => {
                    st.expectations.deletion_observed(key, &pname);
                    if !common::is_not_found(&e) && !common::is_conflict(&e) {
                        result = Err(e.into());
                    }
                }
            }
        }
    }

    let old = ds.status.clone().unwrap_or_default();
    let unavailable = (desired - available).max(0);
    let unchanged = old.desired_number_scheduled == desired
        && old.current_number_scheduled == current
        && old.number_misscheduled == misscheduled
        && old.number_ready == ready
        && old.updated_number_scheduled.unwrap_or(0) == updated
        && old.number_available.unwrap_or(0) == available
        && old.number_unavailable.unwrap_or(0) == unavailable
        && old.observed_generation == ds.metadata.generation;
    if !unchanged {
        let api: Api<DaemonSet> = Api::namespaced(ctx.client.clone(), ns);
        common::patch_status(
            &api,
            name,
            json!({
                "desiredNumberScheduled": desired,
                "currentNumberScheduled": current,
                "numberMisscheduled": misscheduled,
                "numberReady": ready,
                "updatedNumberScheduled": updated,
                "numberAvailable": available,
                "numberUnavailable": unavailable,
                "observedGeneration": ds.metadata.generation,
            }),
        )
        .await?;
    }
    result?;
    Ok((!settled || (min_ready > 0 && available < ready)).then_some(Duration::from_secs(1)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(v: serde_json::Value) -> Node {
        serde_json::from_value(v).unwrap()
    }

    fn template(v: serde_json::Value) -> PodTemplateSpec {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn daemons_run_on_fitting_nodes_whose_taints_they_tolerate() {
        let t = template(json!({"spec": {"containers": [], "nodeSelector": {"role": "edge"}}}));
        assert!(should_run(
            &node(json!({"metadata": {"name": "a", "labels": {"role": "edge"}}})),
            &t
        ));
        assert!(!should_run(&node(json!({"metadata": {"name": "b"}})), &t));
        let tainted = node(
            json!({"metadata": {"name": "c", "labels": {"role": "edge"}},
            "spec": {"taints": [{"key": "dedicated", "value": "db", "effect": "NoSchedule"}]}}),
        );
        assert!(!should_run(&tainted, &t));
        // Condition taints are tolerated by every daemon.
        let unreachable = node(
            json!({"metadata": {"name": "d", "labels": {"role": "edge"}},
            "spec": {"taints": [{"key": "node.kubernetes.io/unreachable", "effect": "NoExecute"},
                                {"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule"}]}}),
        );
        assert!(should_run(&unreachable, &t));
        // PreferNoSchedule does not keep a daemon away.
        let soft = node(
            json!({"metadata": {"name": "e", "labels": {"role": "edge"}},
            "spec": {"taints": [{"key": "x", "effect": "PreferNoSchedule"}]}}),
        );
        assert!(should_run(&soft, &t));
    }

    #[test]
    fn a_daemon_pod_is_pinned_to_its_node_by_required_affinity() {
        let ds: DaemonSet = serde_json::from_value(json!({
            "metadata": {"name": "agent", "namespace": "kube-system", "uid": "u", "generation": 2},
            "spec": {"selector": {"matchLabels": {"app": "agent"}},
                "template": {"metadata": {"labels": {"app": "agent"}}, "spec": {"containers": [{"name": "c"}]}}}
        }))
        .unwrap();
        let t = ds.spec.clone().unwrap().template;
        let p = daemon_pod(&ds, &t, "h1", "node-7");
        assert_eq!(node_of(&p).as_deref(), Some("node-7"));
        assert_eq!(
            p.labels().get(REVISION_HASH).map(String::as_str),
            Some("h1")
        );
        assert_eq!(
            p.labels().get(TEMPLATE_GENERATION).map(String::as_str),
            Some("2")
        );
        let tols = p.spec.unwrap().tolerations.unwrap();
        assert!(tols
            .iter()
            .any(|t| t.key.as_deref() == Some("node.kubernetes.io/unreachable")));
    }
}
