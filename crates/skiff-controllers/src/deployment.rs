//! The Deployment controller: one ReplicaSet per pod template (named by the
//! template's hash, carried as the `pod-template-hash` label and selector),
//! rolled between by RollingUpdate (never more than replicas + maxSurge
//! pods, never fewer than replicas − maxUnavailable available) or Recreate,
//! with revisions, history cleanup, pause, proportional scaling during a
//! rollout, and the Progressing/Available conditions (with
//! progressDeadlineSeconds) that `kubectl rollout status` reads.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::apps::v1::{Deployment, ReplicaSet};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams, Preconditions};
use kube::ResourceExt;
use serde_json::json;

use crate::common;
use crate::controller::Controller;
use crate::framework::{self, Next};
use crate::{Ctx, Error};

const NAME: &str = "deployment";
const COMPONENT: &str = "deployment-controller";
pub const REVISION: &str = "deployment.kubernetes.io/revision";
pub const DESIRED: &str = "deployment.kubernetes.io/desired-replicas";
pub const MAX: &str = "deployment.kubernetes.io/max-replicas";
pub use skiff_helpers::workloads::POD_TEMPLATE_HASH as HASH_LABEL;
use skiff_helpers::workloads::{template_hash, without_template_hash as without_hash};

/// Annotations of a Deployment that are not copied to its ReplicaSets.
const NOT_COPIED: &[&str] = &[
    "kubectl.kubernetes.io/last-applied-configuration",
    REVISION,
    "deployment.kubernetes.io/revision-history",
    DESIRED,
    MAX,
    "deprecated.deployment.rollback.to",
];

/// Resolves maxSurge / maxUnavailable against `replicas` (surge rounds
/// up, unavailable down; both zero means one unavailable).
pub fn surge_and_unavailable(
    replicas: i32,
    surge: Option<&IntOrString>,
    unavailable: Option<&IntOrString>,
) -> (i32, i32) {
    let quarter = IntOrString::String("25%".into());
    let s = common::scaled_value(surge.unwrap_or(&quarter), replicas, true)
        .unwrap_or(0)
        .max(0);
    let mut u = common::scaled_value(unavailable.unwrap_or(&quarter), replicas, false)
        .unwrap_or(0)
        .max(0);
    if s == 0 && u == 0 {
        u = 1;
    }
    (s, u.min(replicas.max(1)))
}

/// What the rollout needs to know of one ReplicaSet: its desired replicas
/// and how many of its pods are available (never more than desired).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Set {
    pub spec: i32,
    pub available: i32,
}

/// One step of a rolling update: the new set's size and the old sets'
/// sizes (old sets oldest first). The new set grows within
/// replicas + maxSurge; old sets shrink, their unavailable pods first, so
/// that at least replicas − maxUnavailable pods stay available.
pub fn plan_rolling(
    replicas: i32,
    max_surge: i32,
    max_unavailable: i32,
    new: Set,
    olds: &[Set],
) -> (i32, Vec<i32>) {
    let mut old_specs: Vec<i32> = olds.iter().map(|s| s.spec).collect();
    let old_total: i32 = old_specs.iter().sum();
    // The new set first.
    if new.spec > replicas {
        return (replicas, old_specs);
    }
    if new.spec < replicas {
        let total = new.spec + old_total;
        let max_total = replicas + max_surge;
        if total < max_total {
            let up = (max_total - total).min(replicas - new.spec);
            return (new.spec + up, old_specs);
        }
    }
    if old_total == 0 {
        return (new.spec, old_specs);
    }
    let min_available = replicas - max_unavailable;
    let all = new.spec + old_total;
    let new_unavailable = (new.spec - new.available).max(0);
    let mut max_down = all - min_available - new_unavailable;
    if max_down <= 0 {
        return (new.spec, old_specs);
    }
    // Unavailable old pods can go at once (within max_down).
    for (i, s) in olds.iter().enumerate() {
        if max_down == 0 {
            break;
        }
        let unhealthy = (old_specs[i] - s.available.min(old_specs[i])).max(0);
        let cut = unhealthy.min(max_down);
        old_specs[i] -= cut;
        max_down -= cut;
    }
    // Then available ones, as long as enough stay available.
    let available: i32 = new.available.min(new.spec)
        + olds
            .iter()
            .zip(&old_specs)
            .map(|(s, spec)| s.available.min(*spec))
            .sum::<i32>();
    let mut left = available - min_available;
    for spec in old_specs.iter_mut() {
        if left <= 0 {
            break;
        }
        let cut = (*spec).min(left);
        *spec -= cut;
        left -= cut;
    }
    (new.spec, old_specs)
}

/// Proportional scaling: `to_add` replicas (negative to remove) spread
/// over sets of `sizes` (largest first gets leftovers), in proportion to
/// each set's share of the replicas it was sized for (`desired`).
pub fn proportional(sizes: &[i32], desired_before: &[i32], replicas: i32, to_add: i32) -> Vec<i32> {
    let mut out: Vec<i32> = sizes.to_vec();
    if to_add == 0 || sizes.is_empty() {
        return out;
    }
    let mut added = 0;
    let mut order: Vec<usize> = (0..sizes.len()).collect();
    // Largest first when adding, smallest first when removing.
    if to_add > 0 {
        order.sort_by_key(|i| std::cmp::Reverse(sizes[*i]));
    } else {
        order.sort_by_key(|i| sizes[*i]);
    }
    for &i in &order {
        if sizes[i] == 0 {
            continue;
        }
        let before = desired_before[i].max(1) as f64;
        let target = (sizes[i] as f64 * replicas as f64 / before).round() as i32;
        let mut delta = target - sizes[i];
        if to_add > 0 {
            delta = delta.clamp(0, to_add - added);
        } else {
            delta = delta.clamp(to_add - added, 0);
        }
        out[i] += delta;
        added += delta;
    }
    if let Some(&first) = order.iter().find(|i| sizes[**i] > 0).or(order.first()) {
        out[first] = (out[first] + (to_add - added)).max(0);
    }
    out
}

fn revision_of(rs: &ReplicaSet) -> i64 {
    rs.annotations()
        .get(REVISION)
        .and_then(|r| r.parse().ok())
        .unwrap_or(0)
}

fn spec_of(rs: &ReplicaSet) -> i32 {
    rs.spec.as_ref().and_then(|s| s.replicas).unwrap_or(0)
}

/// Available pods of a set, never more than its desired size, and none
/// counted from a status older than the set's spec.
fn available_of(rs: &ReplicaSet) -> i32 {
    let st = rs.status.clone().unwrap_or_default();
    st.available_replicas.unwrap_or(0).min(spec_of(rs)).max(0)
}

pub struct State {}

pub fn register(ctx: &Arc<Ctx>, tasks: &mut tokio::task::JoinSet<()>) {
    Controller::new(ctx, NAME, &ctx.caches.deployments)
        // A set's controller; an orphan, every deployment of its namespace
        // that might adopt it.
        .watches(&ctx.caches.replicasets, |c, old, new| {
            let mut keys = common::owner_keys("Deployment", old, new);
            for rs in [old, new].into_iter().flatten() {
                if common::controller_of(&rs.metadata).is_some() || new.is_none() {
                    continue;
                }
                let ns = rs.metadata.namespace.clone().unwrap_or_default();
                for d in c.caches.deployments.in_namespace(&ns) {
                    if let Some(sel) = d.spec.as_ref().map(|s| &s.selector) {
                        if !common::selector_is_empty(sel)
                            && common::selector_matches(sel, rs.labels())
                        {
                            keys.push(framework::key_of(&d.metadata));
                        }
                    }
                }
            }
            keys
        })
        // Recreate waits for old pods to go: pod deletions wake the deployment.
        .watches(&ctx.caches.pods, |c, old, new| {
            let p = old.filter(|_| new.is_none())?;
            let r = common::controller_of(&p.metadata).filter(|r| r.kind == "ReplicaSet")?;
            let ns = p.metadata.namespace.as_deref().unwrap_or_default();
            let rs = c.caches.replicasets.get(&format!("{ns}/{}", r.name))?;
            common::owner_key("Deployment", &rs.metadata)
        })
        .workers(ctx.options.workers)
        .resync(Duration::from_secs(60))
        .run(tasks, Arc::new(State {}), |c, st, key| async move {
            reconcile(&c, &st, &key).await
        });
}

async fn scale(
    ctx: &Ctx,
    d: &Deployment,
    rs: &ReplicaSet,
    to: i32,
    max_surge: i32,
) -> Result<(), Error> {
    let want = d.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1);
    let from = spec_of(rs);
    let ann = rs.annotations();
    if from == to
        && ann.get(DESIRED) == Some(&want.to_string())
        && ann.get(MAX) == Some(&(want + max_surge).to_string())
    {
        return Ok(());
    }
    let api: Api<ReplicaSet> =
        Api::namespaced(ctx.client.clone(), rs.namespace().as_deref().unwrap_or(""));
    let patch = json!({
        "metadata": {"annotations": {
            DESIRED: want.to_string(),
            MAX: (want + max_surge).to_string(),
        }},
        "spec": {"replicas": to},
    });
    api.patch(
        &rs.name_any(),
        &PatchParams::default(),
        &Patch::Merge(&patch),
    )
    .await?;
    if from != to {
        let verb = if to > from { "up" } else { "down" };
        ctx.events.normal(
            COMPONENT,
            d,
            "ScalingReplicaSet",
            format!(
                "Scaled {verb} replica set {} from {from} to {to}",
                rs.name_any()
            ),
        );
    }
    Ok(())
}

async fn reconcile(ctx: &Ctx, _st: &State, key: &str) -> Result<Next, Error> {
    let Some(d) = ctx.caches.deployments.get(key) else {
        return Ok(None);
    };
    let d: &Deployment = &d;
    if common::is_terminating(&d.metadata) {
        return Ok(None);
    }
    let (ns, name) = framework::split_key(key);
    let spec = d.spec.clone().unwrap_or_default();
    let replicas = spec.replicas.unwrap_or(1).max(0);
    let rs_api: Api<ReplicaSet> = Api::namespaced(ctx.client.clone(), ns);
    if common::selector_is_empty(&spec.selector) {
        ctx.events.warning(
            COMPONENT,
            d,
            "SelectingAll",
            "This deployment is selecting all pods. A non-empty selector is required.".into(),
        );
        return Ok(None);
    }

    // The ReplicaSets of this deployment: owned, or matching orphans adopted.
    let uid = d.metadata.uid.clone().unwrap_or_default();
    let owned = ctx.caches.replicasets.owned_by(&uid);
    let orphans = ctx.caches.replicasets.orphans_in(ns);
    let client = ctx.client.clone();
    let selector = spec.selector.clone();
    let mut sets: Vec<ReplicaSet> = common::claim(
        |ns| Api::<ReplicaSet>::namespaced(client.clone(), ns),
        &d.metadata,
        "apps/v1",
        "Deployment",
        |l| common::selector_matches(&selector, l),
        owned,
        orphans,
    )
    .await
    .into_iter()
    .filter(|rs| !common::is_terminating(&rs.metadata))
    .map(|rs| (*rs).clone())
    .collect();
    sets.sort_by_key(|rs| {
        (
            revision_of(rs),
            rs.metadata.creation_timestamp.as_ref().map(|t| t.0),
        )
    });

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
    let paused = spec.paused == Some(true);
    let wanted = without_hash(&spec.template);
    let mut new_rs: Option<ReplicaSet> = sets
        .iter()
        .rev()
        .find(|rs| {
            rs.spec
                .as_ref()
                .and_then(|s| s.template.as_ref())
                .map(|t| without_hash(t) == wanted)
                .unwrap_or(false)
        })
        .cloned();
    let max_revision = sets.iter().map(revision_of).max().unwrap_or(0);
    let mut progress_note: Option<(&str, String)> = None;

    // A scaling event during a rollout (or while paused): proportional.
    let active: Vec<&ReplicaSet> = sets.iter().filter(|rs| spec_of(rs) > 0).collect();
    let scaling_event = active
        .iter()
        .any(|rs| rs.annotations().get(DESIRED) != Some(&replicas.to_string()));
    if scaling_event && (active.len() > 1 || paused) {
        let allowed = if paused && active.len() == 1 {
            replicas
        } else {
            replicas + max_surge
        };
        let sizes: Vec<i32> = active.iter().map(|rs| spec_of(rs)).collect();
        let total: i32 = sizes.iter().sum();
        let before: Vec<i32> = active
            .iter()
            .map(|rs| {
                rs.annotations()
                    .get(DESIRED)
                    .and_then(|v| v.parse().ok())
                    .unwrap_or(total)
            })
            .collect();
        let to = proportional(&sizes, &before, replicas, allowed - total);
        for (rs, to) in active.iter().zip(to) {
            scale(ctx, d, rs, to, max_surge).await?;
        }
        write_status(ctx, d, &sets, new_rs.as_ref(), max_unavailable, None).await?;
        return Ok(Some(Duration::from_secs(1)));
    }

    if paused {
        write_status(ctx, d, &sets, new_rs.as_ref(), max_unavailable, None).await?;
        return Ok(None);
    }

    // The new ReplicaSet: found (its revision becomes the newest), or made.
    match &new_rs {
        Some(rs) => {
            let rev = revision_of(rs);
            let mut ann: BTreeMap<String, String> = copied_annotations(d);
            if rev < max_revision || rs.annotations().get(REVISION).is_none() {
                let next = (max_revision + 1).max(1);
                ann.insert(REVISION.into(), next.to_string());
                if rev > 0 {
                    ctx.events.normal(
                        COMPONENT,
                        d,
                        "DeploymentRollback",
                        format!("Rolled back deployment {name} to revision {rev}"),
                    );
                }
            }
            let stale = ann.iter().any(|(k, v)| rs.annotations().get(k) != Some(v))
                || rs.spec.as_ref().and_then(|s| s.min_ready_seconds)
                    != Some(spec.min_ready_seconds.unwrap_or(0));
            if stale {
                let patch = json!({
                    "metadata": {"annotations": ann},
                    "spec": {"minReadySeconds": spec.min_ready_seconds.unwrap_or(0)},
                });
                let updated = rs_api
                    .patch(
                        &rs.name_any(),
                        &PatchParams::default(),
                        &Patch::Merge(&patch),
                    )
                    .await?;
                sets.retain(|s| s.metadata.uid != updated.metadata.uid);
                sets.push(updated.clone());
                new_rs = Some(updated);
            }
        }
        None => {
            let collision = d.status.as_ref().and_then(|s| s.collision_count);
            let hash = template_hash(&spec.template, collision);
            let mut template = spec.template.clone();
            template
                .metadata
                .get_or_insert_with(Default::default)
                .labels
                .get_or_insert_with(BTreeMap::new)
                .insert(HASH_LABEL.into(), hash.clone());
            let mut selector = spec.selector.clone();
            selector
                .match_labels
                .get_or_insert_with(BTreeMap::new)
                .insert(HASH_LABEL.into(), hash.clone());
            let labels = template
                .metadata
                .as_ref()
                .and_then(|m| m.labels.clone())
                .unwrap_or_default();
            let old_total: i32 = sets.iter().map(spec_of).sum();
            let first = if old_total == 0 {
                replicas
            } else if max_unavailable >= replicas {
                0
            } else {
                // Within the surge budget from the start.
                (replicas + max_surge - old_total).clamp(0, replicas)
            };
            let first = if spec.strategy.as_ref().and_then(|s| s.type_.as_deref())
                == Some("Recreate")
                && old_total > 0
            {
                0
            } else {
                first
            };
            let mut ann = copied_annotations(d);
            ann.insert(REVISION.into(), (max_revision + 1).to_string());
            ann.insert(DESIRED.into(), replicas.to_string());
            ann.insert(MAX.into(), (replicas + max_surge).to_string());
            let rs_name = format!("{name}-{hash}");
            let rs: ReplicaSet = serde_json::from_value(json!({
                "apiVersion": "apps/v1",
                "kind": "ReplicaSet",
                "metadata": {
                    "name": rs_name,
                    "namespace": ns,
                    "labels": labels,
                    "annotations": ann,
                    "ownerReferences": [common::controller_ref("apps/v1", "Deployment", &d.metadata)],
                },
                "spec": {
                    "replicas": first,
                    "minReadySeconds": spec.min_ready_seconds.unwrap_or(0),
                    "selector": selector,
                    "template": template,
                }
            }))?;
            match rs_api.create(&PostParams::default(), &rs).await {
                Ok(rs) => {
                    ctx.events.normal(
                        COMPONENT,
                        d,
                        "ScalingReplicaSet",
                        format!("Scaled up replica set {} from 0 to {first}", rs.name_any()),
                    );
                    progress_note = Some((
                        "NewReplicaSetCreated",
                        format!("Created new replica set \"{}\"", rs.name_any()),
                    ));
                    sets.push(rs.clone());
                    new_rs = Some(rs);
                }
                Err(e) if common::is_conflict(&e) => {
                    // Ours but not yet in the cache: wait for it. Someone
                    // else's, or another template: a hash collision.
                    let existing = rs_api.get_opt(&rs_name).await?;
                    let ours = existing
                        .as_ref()
                        .and_then(|x| common::controller_of(&x.metadata))
                        .map(|r| r.uid == uid)
                        .unwrap_or(false)
                        && existing
                            .as_ref()
                            .and_then(|x| x.spec.as_ref()?.template.as_ref().map(without_hash))
                            == Some(wanted.clone());
                    if !ours && existing.is_some() {
                        let api: Api<Deployment> = Api::namespaced(ctx.client.clone(), ns);
                        common::patch_status(
                            &api,
                            name,
                            json!({"collisionCount": collision.unwrap_or(0) + 1}),
                        )
                        .await?;
                    }
                    return Ok(Some(Duration::from_millis(200)));
                }
                Err(e) => {
                    ctx.events.warning(
                        COMPONENT,
                        d,
                        "FailedCreate",
                        format!("Failed to create new replica set \"{rs_name}\": {e}"),
                    );
                    return Err(e.into());
                }
            }
        }
    }
    let Some(new_rs) = new_rs else {
        return Ok(Some(Duration::from_secs(1)));
    };
    let rev = revision_of(&new_rs).to_string();
    if d.annotations().get(REVISION) != Some(&rev) {
        let api: Api<Deployment> = Api::namespaced(ctx.client.clone(), ns);
        let patch = json!({"metadata": {"annotations": {REVISION: rev}}});
        api.patch(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await?;
    }
    let olds: Vec<ReplicaSet> = sets
        .iter()
        .filter(|rs| rs.metadata.uid != new_rs.metadata.uid)
        .cloned()
        .collect();

    let recreate = spec.strategy.as_ref().and_then(|s| s.type_.as_deref()) == Some("Recreate");
    if recreate {
        for rs in olds.iter().filter(|rs| spec_of(rs) > 0) {
            scale(ctx, d, rs, 0, 0).await?;
        }
        // New pods only once every old pod is gone.
        let old_pods = olds
            .iter()
            .filter_map(|rs| rs.metadata.uid.as_deref())
            .flat_map(|u| ctx.caches.pods.owned_by(u))
            .filter(|p| {
                let ph = common::phase(p);
                ph != "Succeeded" && ph != "Failed"
            })
            .count();
        if old_pods == 0 {
            scale(ctx, d, &new_rs, replicas, 0).await?;
        }
    } else {
        let new = Set {
            spec: spec_of(&new_rs),
            available: available_of(&new_rs),
        };
        let old_sets: Vec<Set> = olds
            .iter()
            .map(|rs| Set {
                spec: spec_of(rs),
                available: available_of(rs),
            })
            .collect();
        let (new_to, olds_to) = plan_rolling(replicas, max_surge, max_unavailable, new, &old_sets);
        scale(ctx, d, &new_rs, new_to, max_surge).await?;
        for (rs, to) in olds.iter().zip(olds_to) {
            if to != spec_of(rs) {
                scale(ctx, d, rs, to, max_surge).await?;
            }
        }
    }

    // History: old sets at zero beyond revisionHistoryLimit go, oldest first.
    let limit = spec.revision_history_limit.unwrap_or(10).max(0) as usize;
    let idle: Vec<&ReplicaSet> = olds
        .iter()
        .filter(|rs| {
            spec_of(rs) == 0
                && rs.status.as_ref().map(|s| s.replicas).unwrap_or(0) == 0
                && rs.status.as_ref().and_then(|s| s.observed_generation) >= rs.metadata.generation
        })
        .collect();
    if idle.len() > limit {
        for rs in idle.iter().take(idle.len() - limit) {
            let dp = DeleteParams {
                preconditions: Some(Preconditions {
                    uid: rs.metadata.uid.clone(),
                    resource_version: rs.metadata.resource_version.clone(),
                }),
                ..Default::default()
            };
            if let Err(e) = rs_api.delete(&rs.name_any(), &dp).await {
                tracing::debug!(rs = rs.name_any(), error = %e, "history cleanup failed");
            }
        }
    }
    write_status(ctx, d, &sets, Some(&new_rs), max_unavailable, progress_note).await
}

fn copied_annotations(d: &Deployment) -> BTreeMap<String, String> {
    d.annotations()
        .iter()
        .filter(|(k, _)| !NOT_COPIED.contains(&k.as_str()))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect()
}

/// The numbers a Deployment's status reports, from its sets' statuses.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Counts {
    pub replicas: i32,
    pub updated: i32,
    pub ready: i32,
    pub available: i32,
    pub unavailable: i32,
}

pub fn counts(want: i32, sets: &[ReplicaSet], new_rs: Option<&ReplicaSet>) -> Counts {
    let st = |rs: &ReplicaSet| rs.status.clone().unwrap_or_default();
    let replicas: i32 = sets.iter().map(|rs| st(rs).replicas).sum();
    let ready: i32 = sets
        .iter()
        .map(|rs| st(rs).ready_replicas.unwrap_or(0))
        .sum();
    let available: i32 = sets
        .iter()
        .map(|rs| st(rs).available_replicas.unwrap_or(0))
        .sum();
    let updated = new_rs.map(|rs| st(rs).replicas).unwrap_or(0);
    Counts {
        replicas,
        updated,
        ready,
        available,
        unavailable: (want.max(replicas) - available)
            .max(0)
            .min(want.max(replicas)),
    }
}

async fn write_status(
    ctx: &Ctx,
    d: &Deployment,
    sets: &[ReplicaSet],
    new_rs: Option<&ReplicaSet>,
    max_unavailable: i32,
    note: Option<(&str, String)>,
) -> Result<Next, Error> {
    let spec = d.spec.clone().unwrap_or_default();
    let want = spec.replicas.unwrap_or(1).max(0);
    // The freshest statuses the cache has.
    let fresh: Vec<ReplicaSet> = sets
        .iter()
        .map(|rs| {
            ctx.caches
                .replicasets
                .get(&framework::key_of(&rs.metadata))
                .filter(|c| c.metadata.uid == rs.metadata.uid)
                .map(|c| (*c).clone())
                .unwrap_or_else(|| rs.clone())
        })
        .collect();
    let new_fresh = new_rs.and_then(|n| fresh.iter().find(|f| f.metadata.uid == n.metadata.uid));
    let c = counts(want, &fresh, new_fresh);
    let old = d.status.clone().unwrap_or_default();
    let now = common::now();
    let paused = spec.paused == Some(true);
    let new_name = new_rs.map(|rs| rs.name_any()).unwrap_or_default();
    let new_available = new_fresh
        .and_then(|rs| rs.status.as_ref()?.available_replicas)
        .unwrap_or(0);
    let complete = new_rs.is_some()
        && c.updated == want
        && c.replicas == want
        && new_available >= want
        && new_fresh.and_then(|rs| rs.status.as_ref()?.observed_generation)
            >= new_fresh.and_then(|rs| rs.metadata.generation);
    let prev = |t: &str| {
        old.conditions
            .iter()
            .flatten()
            .find(|c| c.type_ == t)
            .cloned()
    };
    let prev_p = prev("Progressing");
    let deadline = spec.progress_deadline_seconds.unwrap_or(600);

    // Did anything move since the last status?
    let moved = c.updated > old.updated_replicas.unwrap_or(0)
        || c.available > old.available_replicas.unwrap_or(0)
        || c.ready > old.ready_replicas.unwrap_or(0)
        || (c.replicas < old.replicas.unwrap_or(0)
            && c.updated >= old.updated_replicas.unwrap_or(0));
    let prev_reason = prev_p
        .as_ref()
        .and_then(|c| c.reason.clone())
        .unwrap_or_default();
    let (p_status, p_reason, p_msg): (&str, String, String) = if paused {
        (
            "Unknown",
            "DeploymentPaused".into(),
            "Deployment is paused".into(),
        )
    } else if prev_reason == "DeploymentPaused" {
        (
            "Unknown",
            "DeploymentResumed".into(),
            "Deployment is resumed".into(),
        )
    } else if complete {
        (
            "True",
            "NewReplicaSetAvailable".into(),
            format!("ReplicaSet \"{new_name}\" has successfully progressed."),
        )
    } else if let Some((r, m)) = note.clone() {
        ("True", r.into(), m)
    } else if moved || prev_p.is_none() || prev_reason == "NewReplicaSetAvailable" {
        (
            "True",
            "ReplicaSetUpdated".into(),
            format!("ReplicaSet \"{new_name}\" is progressing."),
        )
    } else {
        let last = prev_p
            .as_ref()
            .and_then(|c| c.last_update_time.as_ref().map(|t| t.0))
            .unwrap_or(now);
        if prev_reason == "ProgressDeadlineExceeded" || common::plus(last, deadline as i64) <= now {
            (
                "False",
                "ProgressDeadlineExceeded".into(),
                format!("ReplicaSet \"{new_name}\" has timed out progressing."),
            )
        } else {
            (
                "True",
                prev_reason.clone(),
                prev_p
                    .as_ref()
                    .and_then(|c| c.message.clone())
                    .unwrap_or_default(),
            )
        }
    };
    let same_p = prev_p
        .as_ref()
        .map(|c| c.status == p_status && c.reason.as_deref() == Some(p_reason.as_str()))
        .unwrap_or(false);
    let p_transition = prev_p
        .as_ref()
        .filter(|c| c.status == p_status)
        .and_then(|c| c.last_transition_time.as_ref().map(|t| t.0))
        .unwrap_or(now);
    let p_update = if same_p && !moved {
        prev_p
            .as_ref()
            .and_then(|c| c.last_update_time.as_ref().map(|t| t.0))
            .unwrap_or(now)
    } else {
        now
    };
    let avail_ok = c.available >= want - max_unavailable;
    let a_status = if avail_ok { "True" } else { "False" };
    let prev_a = prev("Available");
    let a_transition = prev_a
        .as_ref()
        .filter(|c| c.status == a_status)
        .and_then(|c| c.last_transition_time.as_ref().map(|t| t.0))
        .unwrap_or(now);
    let a_update = prev_a
        .as_ref()
        .filter(|c| c.status == a_status)
        .and_then(|c| c.last_update_time.as_ref().map(|t| t.0))
        .unwrap_or(now);
    let status = json!({
        "observedGeneration": d.metadata.generation,
        "replicas": c.replicas,
        "updatedReplicas": c.updated,
        "readyReplicas": c.ready,
        "availableReplicas": c.available,
        "unavailableReplicas": c.unavailable,
        "collisionCount": old.collision_count,
        "conditions": [
            {"type": "Available", "status": a_status,
             "reason": if avail_ok { "MinimumReplicasAvailable" } else { "MinimumReplicasUnavailable" },
             "message": if avail_ok { "Deployment has minimum availability." } else { "Deployment does not have minimum availability." },
             "lastTransitionTime": a_transition.to_string(), "lastUpdateTime": a_update.to_string()},
            {"type": "Progressing", "status": p_status, "reason": p_reason, "message": p_msg,
             "lastTransitionTime": p_transition.to_string(), "lastUpdateTime": p_update.to_string()},
        ],
    });
    // Conditions other controllers set (skiff's DependenciesReady, say)
    // are kept, as Kubernetes' deployment controller keeps them.
    let mut status = status;
    if let Some(cs) = status["conditions"].as_array_mut() {
        for c in old.conditions.iter().flatten() {
            if !matches!(c.type_.as_str(), "Available" | "Progressing") {
                cs.push(serde_json::to_value(c).unwrap_or(serde_json::Value::Null));
            }
        }
    }
    let unchanged = old.observed_generation == d.metadata.generation
        && old.replicas.unwrap_or(0) == c.replicas
        && old.updated_replicas.unwrap_or(0) == c.updated
        && old.ready_replicas.unwrap_or(0) == c.ready
        && old.available_replicas.unwrap_or(0) == c.available
        && old.unavailable_replicas.unwrap_or(0) == c.unavailable
        && same_p
        && prev_a.map(|c| c.status == a_status).unwrap_or(false);
    if !unchanged {
        let api: Api<Deployment> =
            Api::namespaced(ctx.client.clone(), d.namespace().as_deref().unwrap_or(""));
        common::patch_status(&api, &d.name_any(), status).await?;
    }
    // Wake up for the progress deadline.
    if !complete && !paused && p_reason != "ProgressDeadlineExceeded" {
        let wait = common::until(common::plus(p_update, deadline as i64));
        return Ok(Some(wait.max(Duration::from_secs(1))));
    }
    Ok(None)
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

    /// Simulates a rollout: each step applies the plan, then pods of grown
    /// sets become available and pods of shrunk sets vanish. Availability
    /// must never drop below the bound and the rollout must finish.
    fn simulate(replicas: i32, surge: i32, unavailable: i32) -> usize {
        let mut new = Set {
            spec: 0,
            available: 0,
        };
        let mut olds = vec![Set {
            spec: replicas,
            available: replicas,
        }];
        for step in 0..1000 {
            let (n, o) = plan_rolling(replicas, surge, unavailable, new, &olds);
            new.spec = n;
            for (s, to) in olds.iter_mut().zip(o) {
                s.spec = to;
                s.available = s.available.min(to);
            }
            let total_available = new.available + olds.iter().map(|s| s.available).sum::<i32>();
            assert!(
                total_available >= replicas - unavailable,
                "step {step}: {total_available} available"
            );
            let total = new.spec + olds.iter().map(|s| s.spec).sum::<i32>();
            assert!(total <= replicas + surge, "step {step}: {total} pods");
            // New pods become available one step later.
            new.available = new.spec;
            if new.spec == replicas && olds.iter().all(|s| s.spec == 0) {
                return step;
            }
        }
        panic!("the rollout did not finish");
    }

    #[test]
    fn a_rolling_update_finishes_without_breaking_its_bounds() {
        simulate(10, 3, 2);
        simulate(3, 1, 0);
        simulate(3, 0, 1);
        simulate(1, 1, 0);
        simulate(5, 5, 5);
    }

    #[test]
    fn unavailable_old_pods_are_removed_before_available_ones() {
        // Old set of 4 with 2 available; surge 0, unavailable 1, new set
        // at 0: one pod may go, and it is a broken one (the set shrinks to
        // 3 while 2 stay available: the bound is about available pods).
        let (n, o) = plan_rolling(
            4,
            0,
            1,
            Set {
                spec: 0,
                available: 0,
            },
            &[Set {
                spec: 4,
                available: 2,
            }],
        );
        assert_eq!(n, 0);
        assert_eq!(o, vec![3]);
        // With all 4 healthy, one available pod goes (4 - 1 = 3 remain).
        let (_, o) = plan_rolling(
            4,
            0,
            1,
            Set {
                spec: 0,
                available: 0,
            },
            &[Set {
                spec: 4,
                available: 4,
            }],
        );
        assert_eq!(o, vec![3]);
    }

    #[test]
    fn proportional_scaling_spreads_new_replicas_by_set_size() {
        // 10 → 20 during a rollout with sets of 6 (new) and 5 (old), surge 3.
        let to = proportional(&[6, 5], &[10, 10], 20, 23 - 11);
        assert_eq!(to.iter().sum::<i32>(), 23);
        assert!(to[0] >= 12 && to[1] >= 10);
        // Scaling down removes in proportion too.
        let to = proportional(&[6, 6], &[10, 10], 5, 6 - 12);
        assert_eq!(to.iter().sum::<i32>(), 6);
        assert!(to.iter().all(|x| *x >= 0));
    }
}
