//! The Deployment controller: one ReplicaSet per pod template (named by the
//! template's hash, carried as the `pod-template-hash` label), rolled
//! between by RollingUpdate (never more than replicas + maxSurge pods, never
//! fewer than replicas − maxUnavailable available) or Recreate, with
//! revisions, history cleanup, pause, and the Progressing/Available
//! conditions that `kubectl rollout status` reads.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::{Deployment, ReplicaSet};
use k8s_openapi::api::core::v1::{Pod, PodTemplateSpec};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube::runtime::controller::Action;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::ResourceExt;
use serde_json::json;

use crate::common;
use crate::Error;

pub struct Ctx {
    pub client: kube::Client,
    pub replicasets: Store<ReplicaSet>,
    pub pods: Store<Pod>,
    pub metrics: Arc<common::Metrics>,
}

const NAME: &str = "deployment";
const REVISION: &str = "deployment.kubernetes.io/revision";
const HASH_LABEL: &str = "pod-template-hash";

/// The hash of a pod template, as a short name-safe string (our own hash
/// of the template's JSON; Kubernetes uses FNV with a collision count).
pub fn template_hash(t: &PodTemplateSpec) -> String {
    let mut t = t.clone();
    if let Some(l) = t.metadata.as_mut().and_then(|m| m.labels.as_mut()) {
        l.remove(HASH_LABEL);
    }
    let bytes = serde_json::to_vec(&t).unwrap_or_default();
    // FNV-1a, 32 bits.
    let mut h: u32 = 0x811c9dc5;
    for b in bytes {
        h ^= b as u32;
        h = h.wrapping_mul(0x01000193);
    }
    const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
    let mut s = String::new();
    let mut v = h as u64;
    while v > 0 {
        s.push(ALPHABET[(v % ALPHABET.len() as u64) as usize] as char);
        v /= ALPHABET.len() as u64;
    }
    if s.is_empty() {
        s.push('b');
    }
    s
}

/// Resolves maxSurge / maxUnavailable against `replicas` (surge rounds
/// up, unavailable down; both zero means one unavailable).
pub fn surge_and_unavailable(
    replicas: i32,
    surge: Option<&IntOrString>,
    unavailable: Option<&IntOrString>,
) -> (i32, i32) {
    let resolve = |v: Option<&IntOrString>, default: &str, up: bool| -> i32 {
        let v = v
            .cloned()
            .unwrap_or_else(|| IntOrString::String(default.into()));
        match v {
            IntOrString::Int(i) => i.max(0),
            IntOrString::String(s) => {
                let pct: f64 = s.trim_end_matches('%').parse().unwrap_or(25.0);
                let x = pct * replicas as f64 / 100.0;
                (if up { x.ceil() } else { x.floor() }) as i32
            }
        }
    };
    let s = resolve(surge, "25%", true);
    let mut u = resolve(unavailable, "25%", false);
    if s == 0 && u == 0 {
        u = 1;
    }
    (s, u)
}

fn revision_of(rs: &ReplicaSet) -> i64 {
    rs.annotations()
        .get(REVISION)
        .and_then(|r| r.parse().ok())
        .unwrap_or(0)
}

fn replicas_of(rs: &ReplicaSet) -> i32 {
    rs.spec.as_ref().and_then(|s| s.replicas).unwrap_or(0)
}

fn available_of(rs: &ReplicaSet) -> i32 {
    rs.status
        .as_ref()
        .and_then(|s| s.available_replicas)
        .unwrap_or(0)
}

pub async fn reconcile(d: Arc<Deployment>, ctx: Arc<Ctx>) -> Result<Action, Error> {
    let t = Instant::now();
    let r = reconcile_inner(&d, &ctx).await;
    ctx.metrics.record(NAME, r.is_ok(), t.elapsed());
    r
}

async fn scale(
    api: &Api<ReplicaSet>,
    rs: &ReplicaSet,
    replicas: i32,
    d: &Deployment,
    max_surge: i32,
) -> Result<(), Error> {
    if replicas_of(rs) == replicas {
        return Ok(());
    }
    let want = d.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1);
    let patch = json!({
        "metadata": {"annotations": {
            "deployment.kubernetes.io/desired-replicas": want.to_string(),
            "deployment.kubernetes.io/max-replicas": (want + max_surge).to_string(),
        }},
        "spec": {"replicas": replicas},
    });
    api.patch(
        &rs.name_any(),
        &PatchParams::default(),
        &Patch::Merge(&patch),
    )
    .await?;
    Ok(())
}

async fn reconcile_inner(d: &Deployment, ctx: &Ctx) -> Result<Action, Error> {
    if common::is_terminating(&d.metadata) {
        return Ok(Action::await_change());
    }
    let ns = d.namespace().unwrap_or_default();
    let name = d.name_any();
    let uid = d.metadata.uid.clone().unwrap_or_default();
    let spec = d.spec.clone().unwrap_or_default();
    let replicas = spec.replicas.unwrap_or(1).max(0);
    let involved = json!({"apiVersion": "apps/v1", "kind": "Deployment", "name": name, "namespace": ns, "uid": uid});
    let rs_api: Api<ReplicaSet> = Api::namespaced(ctx.client.clone(), &ns);

    // The ReplicaSets of this deployment: owned, or matching orphans adopted.
    let mut sets: Vec<ReplicaSet> = vec![];
    for rs in ctx.replicasets.state() {
        if rs.metadata.namespace.as_deref() != Some(ns.as_str())
            || common::is_terminating(&rs.metadata)
        {
            continue;
        }
        let labels = rs.labels().clone();
        match common::controller_of(&rs.metadata) {
            Some(r) if r.uid == uid => sets.push((*rs).clone()),
            None if !common::selector_is_empty(&spec.selector)
                && common::selector_matches(&spec.selector, &labels) =>
            {
                let mut refs = rs.owner_references().to_vec();
                refs.push(common::controller_ref("apps/v1", "Deployment", &d.metadata));
                let patch = json!({"metadata": {"ownerReferences": refs, "uid": rs.metadata.uid}});
                if let Ok(adopted) = rs_api
                    .patch(
                        &rs.name_any(),
                        &PatchParams::default(),
                        &Patch::Merge(&patch),
                    )
                    .await
                {
                    sets.push(adopted);
                }
            }
            _ => {}
        }
    }
    let hash = template_hash(&spec.template);
    let max_revision = sets.iter().map(revision_of).max().unwrap_or(0);
    let (max_surge, max_unavailable) = match spec.strategy.as_ref().and_then(|s| s.type_.as_deref())
    {
        Some("Recreate") => (0, replicas),
        _ => {
            let ru = spec
                .strategy
                .as_ref()
                .and_then(|s| s.rolling_update.clone())
                .unwrap_or_default();
            surge_and_unavailable(replicas, ru.max_surge.as_ref(), ru.max_unavailable.as_ref())
        }
    };

    // The new ReplicaSet: the one whose template hash matches.
    let mut new_rs = sets
        .iter()
        .find(|rs| rs.labels().get(HASH_LABEL) == Some(&hash))
        .cloned();
    if spec.paused == Some(true) {
        write_status(d, ctx, &sets, new_rs.as_ref(), max_unavailable).await?;
        return Ok(Action::requeue(Duration::from_secs(30)));
    }
    match &new_rs {
        Some(rs) if revision_of(rs) < max_revision || rs.annotations().get(REVISION).is_none() => {
            // Rolling back to an older template: it becomes the newest revision.
            let patch = json!({"metadata": {"annotations": {REVISION: (max_revision + if revision_of(rs) < max_revision { 1 } else { 0 }).max(1).to_string()}}});
            new_rs = Some(
                rs_api
                    .patch(
                        &rs.name_any(),
                        &PatchParams::default(),
                        &Patch::Merge(&patch),
                    )
                    .await?,
            );
            common::event(
                &ctx.client,
                "deployment-controller",
                involved.clone(),
                &ns,
                "Normal",
                "DeploymentRollback",
                format!(
                    "Rolled back deployment {name} to revision {}",
                    max_revision + 1
                ),
            );
        }
        Some(_) => {}
        None => {
            let mut template = spec.template.clone();
            let meta = template.metadata.get_or_insert_with(Default::default);
            meta.labels
                .get_or_insert_with(BTreeMap::new)
                .insert(HASH_LABEL.into(), hash.clone());
            let mut selector = spec.selector.clone();
            selector
                .match_labels
                .get_or_insert_with(BTreeMap::new)
                .insert(HASH_LABEL.into(), hash.clone());
            let mut labels = template
                .metadata
                .as_ref()
                .and_then(|m| m.labels.clone())
                .unwrap_or_default();
            labels.insert(HASH_LABEL.into(), hash.clone());
            let first = if sets.is_empty() { replicas } else { 0 };
            let rs: ReplicaSet = serde_json::from_value(json!({
                "apiVersion": "apps/v1",
                "kind": "ReplicaSet",
                "metadata": {
                    "name": format!("{name}-{hash}"),
                    "namespace": ns,
                    "labels": labels,
                    "annotations": {
                        REVISION: (max_revision + 1).to_string(),
                        "deployment.kubernetes.io/desired-replicas": replicas.to_string(),
                        "deployment.kubernetes.io/max-replicas": (replicas + max_surge).to_string(),
                    },
                    "ownerReferences": [common::controller_ref("apps/v1", "Deployment", &d.metadata)],
                },
                "spec": {
                    "replicas": if max_unavailable >= replicas && !sets.is_empty() { 0 } else { first },
                    "minReadySeconds": spec.min_ready_seconds.unwrap_or(0),
                    "selector": selector,
                    "template": template,
                }
            }))?;
            match rs_api.create(&PostParams::default(), &rs).await {
                Ok(rs) => {
                    common::event(
                        &ctx.client,
                        "deployment-controller",
                        involved.clone(),
                        &ns,
                        "Normal",
                        "ScalingReplicaSet",
                        format!(
                            "Scaled up replica set {} from 0 to {}",
                            rs.name_any(),
                            replicas_of(&rs)
                        ),
                    );
                    sets.push(rs.clone());
                    new_rs = Some(rs);
                }
                Err(kube::Error::Api(e)) if e.code == 409 => {
                    return Ok(Action::requeue(Duration::from_millis(500)))
                }
                Err(e) => return Err(e.into()),
            }
        }
    }
    let Some(new_rs) = new_rs else {
        return Ok(Action::requeue(Duration::from_secs(1)));
    };
    let new_name = new_rs.name_any();
    // The deployment carries its current revision too (kubectl's rollout
    // undo replaces the annotations it finds there).
    let rev = revision_of(&new_rs).to_string();
    if d.annotations().get(REVISION) != Some(&rev) {
        let dep_api: Api<Deployment> = Api::namespaced(ctx.client.clone(), &ns);
        let patch = json!({"metadata": {"annotations": {REVISION: rev}}});
        dep_api
            .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
            .await?;
    }
    let mut old: Vec<ReplicaSet> = sets
        .iter()
        .filter(|rs| rs.name_any() != new_name)
        .cloned()
        .collect();
    old.sort_by_key(revision_of);
    let old_active: i32 = old.iter().map(replicas_of).sum();

    let recreate = spec.strategy.as_ref().and_then(|s| s.type_.as_deref()) == Some("Recreate");
    if recreate {
        for rs in old.iter().filter(|rs| replicas_of(rs) > 0) {
            scale(&rs_api, rs, 0, d, 0).await?;
            common::event(
                &ctx.client,
                "deployment-controller",
                involved.clone(),
                &ns,
                "Normal",
                "ScalingReplicaSet",
                format!(
                    "Scaled down replica set {} from {} to 0",
                    rs.name_any(),
                    replicas_of(rs)
                ),
            );
        }
        // New pods only once every old pod is gone.
        let old_uids: Vec<String> = old
            .iter()
            .filter_map(|rs| rs.metadata.uid.clone())
            .collect();
        let old_pods = ctx
            .pods
            .state()
            .iter()
            .filter(|p| {
                common::controller_of(&p.metadata)
                    .map(|r| old_uids.contains(&r.uid))
                    .unwrap_or(false)
            })
            .count();
        if old_pods == 0 && replicas_of(&new_rs) != replicas {
            scale(&rs_api, &new_rs, replicas, d, 0).await?;
            common::event(
                &ctx.client,
                "deployment-controller",
                involved.clone(),
                &ns,
                "Normal",
                "ScalingReplicaSet",
                format!(
                    "Scaled up replica set {new_name} from {} to {replicas}",
                    replicas_of(&new_rs)
                ),
            );
        }
    } else {
        // Scale up the new set within the surge budget.
        let total: i32 = replicas_of(&new_rs) + old_active;
        let max_total = replicas + max_surge;
        let new_count = replicas_of(&new_rs);
        if old_active == 0 {
            if new_count != replicas {
                scale(&rs_api, &new_rs, replicas, d, max_surge).await?;
                let verb = if new_count < replicas { "up" } else { "down" };
                common::event(
                    &ctx.client,
                    "deployment-controller",
                    involved.clone(),
                    &ns,
                    "Normal",
                    "ScalingReplicaSet",
                    format!("Scaled {verb} replica set {new_name} from {new_count} to {replicas}"),
                );
            }
        } else {
            if total < max_total && new_count < replicas {
                let to = (new_count + (max_total - total)).min(replicas);
                scale(&rs_api, &new_rs, to, d, max_surge).await?;
                common::event(
                    &ctx.client,
                    "deployment-controller",
                    involved.clone(),
                    &ns,
                    "Normal",
                    "ScalingReplicaSet",
                    format!("Scaled up replica set {new_name} from {new_count} to {to}"),
                );
            } else if new_count > replicas {
                scale(&rs_api, &new_rs, replicas, d, max_surge).await?;
            }
            // Scale old sets down without going below the availability
            // bound: first their unavailable pods, then available ones,
            // oldest revision first.
            let min_available = replicas - max_unavailable;
            let new_unavailable =
                (replicas_of(&new_rs).max(new_count) - available_of(&new_rs)).max(0);
            let all_pods = replicas_of(&new_rs).max(new_count) + old_active;
            let mut max_down = all_pods - min_available - new_unavailable;
            let mut current: Vec<i32> = old.iter().map(replicas_of).collect();
            if max_down > 0 {
                for (i, rs) in old.iter().enumerate() {
                    if max_down == 0 {
                        break;
                    }
                    let unhealthy = (current[i] - available_of(rs)).max(0);
                    let cut = unhealthy.min(max_down);
                    if cut > 0 {
                        let to = current[i] - cut;
                        scale(&rs_api, rs, to, d, max_surge).await?;
                        common::event(
                            &ctx.client,
                            "deployment-controller",
                            involved.clone(),
                            &ns,
                            "Normal",
                            "ScalingReplicaSet",
                            format!(
                                "Scaled down replica set {} from {} to {to}",
                                rs.name_any(),
                                current[i]
                            ),
                        );
                        current[i] = to;
                        max_down -= cut;
                    }
                }
            }
            let available: i32 = available_of(&new_rs)
                + old
                    .iter()
                    .zip(&current)
                    .map(|(rs, c)| available_of(rs).min(*c))
                    .sum::<i32>();
            if available > min_available {
                let mut left = available - min_available;
                for (i, rs) in old.iter().enumerate() {
                    if left == 0 {
                        break;
                    }
                    let cut = current[i].min(left);
                    if cut > 0 {
                        let to = current[i] - cut;
                        scale(&rs_api, rs, to, d, max_surge).await?;
                        common::event(
                            &ctx.client,
                            "deployment-controller",
                            involved.clone(),
                            &ns,
                            "Normal",
                            "ScalingReplicaSet",
                            format!(
                                "Scaled down replica set {} from {} to {to}",
                                rs.name_any(),
                                current[i]
                            ),
                        );
                        current[i] = to;
                        left -= cut;
                    }
                }
            }
        }
    }

    // History: old sets at zero beyond revisionHistoryLimit go.
    let limit = spec.revision_history_limit.unwrap_or(10).max(0) as usize;
    let idle: Vec<&ReplicaSet> = old
        .iter()
        .filter(|rs| {
            replicas_of(rs) == 0 && rs.status.as_ref().map(|s| s.replicas).unwrap_or(0) == 0
        })
        .collect();
    if idle.len() > limit {
        for rs in idle.iter().take(idle.len() - limit) {
            let _ = rs_api
                .delete(&rs.name_any(), &DeleteParams::default())
                .await;
        }
    }
    write_status(d, ctx, &sets, Some(&new_rs), max_unavailable).await?;
    Ok(Action::requeue(Duration::from_secs(2)))
}

async fn write_status(
    d: &Deployment,
    ctx: &Ctx,
    sets: &[ReplicaSet],
    new_rs: Option<&ReplicaSet>,
    max_unavailable: i32,
) -> Result<(), Error> {
    let spec = d.spec.clone().unwrap_or_default();
    let want = spec.replicas.unwrap_or(1);
    // Fresh numbers from the cache (the sets above may predate our scaling).
    let cached: Vec<Arc<ReplicaSet>> = ctx.replicasets.state();
    let fresh = |rs: &ReplicaSet| -> ReplicaSet {
        cached
            .iter()
            .find(|c| c.metadata.uid == rs.metadata.uid)
            .map(|c| (**c).clone())
            .unwrap_or_else(|| rs.clone())
    };
    let st = |rs: &ReplicaSet| rs.status.clone().unwrap_or_default();
    let replicas: i32 = sets.iter().map(|rs| st(&fresh(rs)).replicas).sum();
    let ready: i32 = sets
        .iter()
        .map(|rs| st(&fresh(rs)).ready_replicas.unwrap_or(0))
        .sum();
    let available: i32 = sets
        .iter()
        .map(|rs| st(&fresh(rs)).available_replicas.unwrap_or(0))
        .sum();
    let updated = new_rs.map(|rs| st(&fresh(rs)).replicas).unwrap_or(0);
    let new_available = new_rs
        .map(|rs| st(&fresh(rs)).available_replicas.unwrap_or(0))
        .unwrap_or(0);
    let complete = updated == want && replicas == want && new_available == want;
    let old = d.status.clone().unwrap_or_default();
    let now = k8s_openapi::jiff::Timestamp::now().to_string();
    let keep = |type_: &str, status: &str, reason: &str| -> (String, String) {
        let prev = old.conditions.iter().flatten().find(|c| c.type_ == type_);
        let transition = prev
            .filter(|c| c.status == status)
            .and_then(|c| c.last_transition_time.as_ref().map(|t| t.0.to_string()))
            .unwrap_or_else(|| now.clone());
        let update = prev
            .filter(|c| c.status == status && c.reason.as_deref() == Some(reason))
            .and_then(|c| c.last_update_time.as_ref().map(|t| t.0.to_string()))
            .unwrap_or_else(|| now.clone());
        (transition, update)
    };
    let avail_ok = available >= want - max_unavailable;
    let (a_t, a_u) = keep(
        "Available",
        if avail_ok { "True" } else { "False" },
        if avail_ok {
            "MinimumReplicasAvailable"
        } else {
            "MinimumReplicasUnavailable"
        },
    );
    let new_name = new_rs.map(|rs| rs.name_any()).unwrap_or_default();
    let paused = spec.paused == Some(true);
    let (p_status, p_reason, p_msg) = if paused {
        (
            "Unknown",
            "DeploymentPaused",
            "Deployment is paused".to_string(),
        )
    } else if complete {
        (
            "True",
            "NewReplicaSetAvailable",
            format!("ReplicaSet \"{new_name}\" has successfully progressed."),
        )
    } else {
        (
            "True",
            "ReplicaSetUpdated",
            format!("ReplicaSet \"{new_name}\" is progressing."),
        )
    };
    let (p_t, p_u) = keep("Progressing", p_status, p_reason);
    let status = json!({
        "observedGeneration": d.metadata.generation,
        "replicas": replicas,
        "updatedReplicas": updated,
        "readyReplicas": ready,
        "availableReplicas": available,
        "unavailableReplicas": (want - available).max(0),
        "conditions": [
            {"type": "Available", "status": if avail_ok { "True" } else { "False" },
             "reason": if avail_ok { "MinimumReplicasAvailable" } else { "MinimumReplicasUnavailable" },
             "message": if avail_ok { "Deployment has minimum availability." } else { "Deployment does not have minimum availability." },
             "lastTransitionTime": a_t, "lastUpdateTime": a_u},
            {"type": "Progressing", "status": p_status, "reason": p_reason, "message": p_msg,
             "lastTransitionTime": p_t, "lastUpdateTime": p_u},
        ],
    });
    let same =
        old.observed_generation == d.metadata.generation
            && old.replicas.unwrap_or(0) == replicas
            && old.updated_replicas.unwrap_or(0) == updated
            && old.ready_replicas.unwrap_or(0) == ready
            && old.available_replicas.unwrap_or(0) == available
            && old.unavailable_replicas.unwrap_or(0) == (want - available).max(0)
            && old
                .conditions
                .iter()
                .flatten()
                .any(|c| c.type_ == "Progressing" && c.reason.as_deref() == Some(p_reason))
            && old.conditions.iter().flatten().any(|c| {
                c.type_ == "Available" && c.status == if avail_ok { "True" } else { "False" }
            });
    if same {
        return Ok(());
    }
    let api: Api<Deployment> =
        Api::namespaced(ctx.client.clone(), &d.namespace().unwrap_or_default());
    match api
        .patch_status(
            &d.name_any(),
            &PatchParams::default(),
            &Patch::Merge(&json!({"status": status})),
        )
        .await
    {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(e)) if e.code == 404 => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// The Deployment that controls a ReplicaSet, for mapping its events.
pub fn owner_of(rs: &ReplicaSet) -> Option<ObjectRef<Deployment>> {
    let r = common::controller_of(&rs.metadata)?;
    if r.kind != "Deployment" {
        return None;
    }
    Some(ObjectRef::new(&r.name).within(rs.metadata.namespace.as_deref().unwrap_or("default")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn surge_rounds_up_and_unavailable_rounds_down_with_at_least_one_able_to_move() {
        assert_eq!(surge_and_unavailable(10, None, None), (3, 2));
        assert_eq!(
            surge_and_unavailable(4, Some(&IntOrString::Int(0)), Some(&IntOrString::Int(0))),
            (0, 1)
        );
        assert_eq!(
            surge_and_unavailable(
                3,
                Some(&IntOrString::String("50%".into())),
                Some(&IntOrString::Int(1))
            ),
            (2, 1)
        );
    }

    #[test]
    fn the_template_hash_ignores_the_hash_label_and_changes_with_the_template() {
        let t: PodTemplateSpec = serde_json::from_value(json!({"metadata": {"labels": {"app": "a"}}, "spec": {"containers": [{"name": "c", "image": "x:1"}]}})).unwrap();
        let mut labelled = t.clone();
        labelled
            .metadata
            .as_mut()
            .unwrap()
            .labels
            .as_mut()
            .unwrap()
            .insert(HASH_LABEL.into(), "zzz".into());
        assert_eq!(template_hash(&t), template_hash(&labelled));
        let mut changed = t.clone();
        changed.spec.as_mut().unwrap().containers[0].image = Some("x:2".into());
        assert_ne!(template_hash(&t), template_hash(&changed));
    }
}
