//! The StatefulSet controller: pods named `<set>-<ordinal>` (so a
//! restarted controller can never create one twice), with hostname and
//! subdomain for the governing headless service, PersistentVolumeClaims
//! `<claim>-<pod>` from volumeClaimTemplates, created in order and each
//! only after its predecessors are Running and Ready (OrderedReady) or all
//! at once (Parallel), removed from the highest ordinal down, and updated
//! from the highest ordinal down to the partition (RollingUpdate) or on
//! deletion (OnDelete). Templates are recorded as ControllerRevisions.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod, PodTemplateSpec, Volume};
use kube::api::{Api, DeleteParams, PostParams, Preconditions};
use kube::ResourceExt;
use serde_json::json;

use crate::common;
use crate::common::ensure_revision;
use crate::controller::Controller;
use crate::framework::{self, Next};
use crate::{Ctx, Error};
use skiff_helpers::workloads::CONTROLLER_REVISION_HASH as REVISION_HASH;

const COMPONENT: &str = "statefulset-controller";
pub const POD_NAME: &str = "statefulset.kubernetes.io/pod-name";
pub const POD_INDEX: &str = "apps.kubernetes.io/pod-index";

pub fn register(ctx: &Arc<Ctx>, tasks: &mut tokio::task::JoinSet<()>) {
    Controller::new(ctx, "statefulset", &ctx.caches.statefulsets)
        .owns(&ctx.caches.pods, "StatefulSet")
        .workers(ctx.options.workers.min(4))
        .resync(Duration::from_secs(60))
        .run(
            tasks,
            (),
            |c, _, key| async move { reconcile(&c, &key).await },
        );
}

/// The ordinal of a pod of set `set` (`web-3` → 3).
pub fn ordinal_of(set: &str, pod: &str) -> Option<i32> {
    let rest = pod.strip_prefix(set)?.strip_prefix('-')?;
    if rest.is_empty()
        || !rest.chars().all(|c| c.is_ascii_digit())
        || (rest.len() > 1 && rest.starts_with('0'))
    {
        return None;
    }
    rest.parse().ok()
}

/// The pod for one ordinal at one revision.
pub fn stateful_pod(
    sts: &StatefulSet,
    template: &PodTemplateSpec,
    hash: &str,
    ordinal: i32,
) -> Pod {
    let name = sts.metadata.name.clone().unwrap_or_default();
    let spec = sts.spec.clone().unwrap_or_default();
    let pod_name = format!("{name}-{ordinal}");
    let mut pod = skiff_helpers::workloads::pod_from_template(
        template,
        &sts.metadata,
        "apps/v1",
        "StatefulSet",
    );
    pod.metadata.generate_name = None;
    pod.metadata.name = Some(pod_name.clone());
    let labels = pod.metadata.labels.get_or_insert_with(BTreeMap::new);
    labels.insert(POD_NAME.into(), pod_name.clone());
    labels.insert(POD_INDEX.into(), ordinal.to_string());
    labels.insert(REVISION_HASH.into(), hash.to_string());
    let mut ps = pod.spec.clone().unwrap_or_default();
    ps.hostname = Some(pod_name.clone());
    if !spec.service_name.as_deref().unwrap_or("").is_empty() {
        ps.subdomain = spec.service_name.clone();
    }
    let mut volumes: Vec<Volume> = ps.volumes.clone().unwrap_or_default();
    for claim in spec.volume_claim_templates.iter().flatten() {
        let cname = claim.metadata.name.clone().unwrap_or_default();
        volumes.retain(|v| v.name != cname);
        if let Ok(v) = serde_json::from_value(json!({
            "name": cname,
            "persistentVolumeClaim": {"claimName": format!("{cname}-{pod_name}")}
        })) {
            volumes.push(v);
        }
    }
    if !volumes.is_empty() {
        ps.volumes = Some(volumes);
    }
    pod.spec = Some(ps);
    pod
}

fn running_and_ready(p: &Pod) -> bool {
    common::phase(p) == "Running" && common::pod_ready(p) && !common::is_terminating(&p.metadata)
}

async fn ensure_claims(ctx: &Ctx, sts: &StatefulSet, pod_name: &str) -> Result<(), Error> {
    let spec = sts.spec.clone().unwrap_or_default();
    let ns = sts.metadata.namespace.clone().unwrap_or_default();
    let api: Api<PersistentVolumeClaim> = Api::namespaced(ctx.client.clone(), &ns);
    let delete_with_set = spec
        .persistent_volume_claim_retention_policy
        .as_ref()
        .and_then(|p| p.when_deleted.as_deref())
        == Some("Delete");
    for claim in spec.volume_claim_templates.iter().flatten() {
        let cname = format!(
            "{}-{pod_name}",
            claim.metadata.name.as_deref().unwrap_or("")
        );
        if ctx.caches.pvcs.get(&format!("{ns}/{cname}")).is_some() {
            continue;
        }
        let mut pvc = claim.clone();
        pvc.metadata.name = Some(cname.clone());
        pvc.metadata.namespace = Some(ns.clone());
        pvc.metadata.resource_version = None;
        pvc.metadata.uid = None;
        let labels = pvc.metadata.labels.get_or_insert_with(BTreeMap::new);
        for (k, v) in spec.selector.match_labels.iter().flatten() {
            labels.insert(k.clone(), v.clone());
        }
        if delete_with_set {
            pvc.metadata.owner_references = Some(vec![common::controller_ref(
                "apps/v1",
                "StatefulSet",
                &sts.metadata,
            )]);
        }
        pvc.status = None;
        match api.create(&PostParams::default(), &pvc).await {
            Ok(_) => ctx.events.normal(
                COMPONENT,
                sts,
                "SuccessfulCreate",
                format!(
                    "create Claim {cname} Pod {pod_name} in StatefulSet {} success",
                    sts.name_any()
                ),
            ),
            Err(e) if common::is_conflict(&e) => {}
            Err(e) => {
                ctx.events.warning(
                    COMPONENT,
                    sts,
                    "FailedCreate",
                    format!("create Claim {cname} for Pod {pod_name} in StatefulSet {} failed error: {e}", sts.name_any()),
                );
                return Err(e.into());
            }
        }
    }
    Ok(())
}

async fn delete_pod(ctx: &Ctx, sts: &StatefulSet, p: &Pod) -> Result<(), Error> {
    let api: Api<Pod> = Api::namespaced(
        ctx.client.clone(),
        p.metadata.namespace.as_deref().unwrap_or(""),
    );
    let dp = DeleteParams {
        preconditions: Some(Preconditions {
            uid: p.metadata.uid.clone(),
            resource_version: None,
        }),
        ..Default::default()
    };
    match api.delete(&p.name_any(), &dp).await {
        Ok(_) => {
            ctx.events.normal(
                COMPONENT,
                sts,
                "SuccessfulDelete",
                format!(
                    "delete Pod {} in StatefulSet {} successful",
                    p.name_any(),
                    sts.name_any()
                ),
            );
            Ok(())
        }
        Err(e) if common::is_not_found(&e) || common::is_conflict(&e) => Ok(()),
        Err(e) => Err(e.into()),
    }
}

async fn reconcile(ctx: &Ctx, key: &str) -> Result<Next, Error> {
    let Some(sts) = ctx.caches.statefulsets.get(key) else {
        return Ok(None);
    };
    let sts: &StatefulSet = &sts;
    if common::is_terminating(&sts.metadata) {
        return Ok(None);
    }
    let (ns, name) = framework::split_key(key);
    let spec = sts.spec.clone().unwrap_or_default();
    let replicas = spec.replicas.unwrap_or(1).max(0);
    let start = spec
        .ordinals
        .as_ref()
        .and_then(|o| o.start)
        .unwrap_or(0)
        .max(0);
    let parallel = spec.pod_management_policy.as_deref() == Some("Parallel");
    let template = spec.template.clone();
    let status = sts.status.clone().unwrap_or_default();
    // As Kubernetes' StatefulSet controller, an absent collisionCount counts
    // as 0 (the status it writes always carries one), so the hash does not
    // change when the first status is written.
    let update_hash = skiff_helpers::workloads::template_hash(
        &template,
        Some(status.collision_count.unwrap_or(0)),
    );
    ensure_revision(ctx, &sts.metadata, "StatefulSet", &update_hash, &template).await?;
    let update_revision = format!("{name}-{update_hash}");
    let current_revision = status
        .current_revision
        .clone()
        .filter(|r| !r.is_empty())
        .unwrap_or_else(|| update_revision.clone());
    // The template of the current revision, from its ControllerRevision.
    let current_template: PodTemplateSpec = ctx
        .caches
        .controller_revisions
        .get(&format!("{ns}/{current_revision}"))
        .and_then(|r| {
            let mut t = r.data.as_ref()?.0.get("spec")?.get("template")?.clone();
            if let Some(o) = t.as_object_mut() {
                o.remove("$patch");
            }
            serde_json::from_value(t).ok()
        })
        .unwrap_or_else(|| template.clone());
    let current_hash = current_revision
        .strip_prefix(&format!("{name}-"))
        .unwrap_or(&update_hash)
        .to_string();

    let uid = sts.metadata.uid.clone().unwrap_or_default();
    let selector = spec.selector.clone();
    let client = ctx.client.clone();
    let claimed = common::claim(
        |ns| Api::<Pod>::namespaced(client.clone(), ns),
        &sts.metadata,
        "apps/v1",
        "StatefulSet",
        |l| !common::selector_is_empty(&selector) && common::selector_matches(&selector, l),
        ctx.caches.pods.owned_by(&uid),
        ctx.caches.pods.orphans_in(ns),
    )
    .await;
    let mut slots: BTreeMap<i32, Arc<Pod>> = BTreeMap::new();
    let mut condemned: Vec<(i32, Arc<Pod>)> = vec![];
    for p in &claimed {
        let Some(o) = ordinal_of(name, &p.name_any()) else {
            continue;
        };
        if o >= start && o < start + replicas {
            slots.insert(o, p.clone());
        } else {
            condemned.push((o, p.clone()));
        }
    }
    condemned.sort_by_key(|(o, _)| std::cmp::Reverse(*o));
    let strategy = spec.update_strategy.clone().unwrap_or_default();
    let on_delete = strategy.type_.as_deref() == Some("OnDelete");
    let partition = strategy
        .rolling_update
        .as_ref()
        .and_then(|r| r.partition)
        .unwrap_or(0);
    let pods_api: Api<Pod> = Api::namespaced(ctx.client.clone(), ns);
    let mut wait = false;

    // Failed pods are replaced.
    for p in slots.values() {
        if common::phase(p) == "Failed" && !common::is_terminating(&p.metadata) {
            delete_pod(ctx, sts, p).await?;
            wait = true;
        }
    }
    // Create, in order.
    if !wait {
        for o in start..start + replicas {
            match slots.get(&o) {
                Some(p) => {
                    if !parallel && !running_and_ready(p) {
                        wait = true;
                        break;
                    }
                }
                None => {
                    let (t, h) = if !on_delete && o - start < partition {
                        (&current_template, current_hash.as_str())
                    } else {
                        (&template, update_hash.as_str())
                    };
                    let pod = stateful_pod(sts, t, h, o);
                    let pname = pod.name_any();
                    ensure_claims(ctx, sts, &pname).await?;
                    match pods_api.create(&PostParams::default(), &pod).await {
                        Ok(_) => ctx.events.normal(
                            COMPONENT,
                            sts,
                            "SuccessfulCreate",
                            format!("create Pod {pname} in StatefulSet {name} successful"),
                        ),
                        Err(e) if common::is_conflict(&e) => {}
                        Err(e) => {
                            ctx.events.warning(
                                COMPONENT,
                                sts,
                                "FailedCreate",
                                format!(
                                    "create Pod {pname} in StatefulSet {name} failed error: {e}"
                                ),
                            );
                            return Err(e.into());
                        }
                    }
                    if !parallel {
                        wait = true;
                        break;
                    }
                }
            }
        }
    }
    // Remove, from the highest ordinal.
    if !wait || parallel {
        for (_, p) in &condemned {
            if common::is_terminating(&p.metadata) {
                if !parallel {
                    wait = true;
                    break;
                }
                continue;
            }
            delete_pod(ctx, sts, p).await?;
            if !parallel {
                wait = true;
                break;
            }
        }
    }
    // Roll, from the highest ordinal down to the partition, one at a time.
    let all_ready = slots.len() as i32 == replicas && slots.values().all(|p| running_and_ready(p));
    if !wait && !on_delete && all_ready && condemned.is_empty() {
        if let Some((_, p)) = slots
            .iter()
            .rev()
            .filter(|(o, _)| **o - start >= partition)
            .find(|(_, p)| p.labels().get(REVISION_HASH) != Some(&update_hash))
        {
            delete_pod(ctx, sts, p).await?;
        }
    }

    // Status.
    let live: Vec<&Arc<Pod>> = claimed
        .iter()
        .filter(|p| {
            !common::is_terminating(&p.metadata) && ordinal_of(name, &p.name_any()).is_some()
        })
        .collect();
    let min_ready = spec.min_ready_seconds.unwrap_or(0);
    let now = common::now();
    let ready = live.iter().filter(|p| common::pod_ready(p)).count() as i32;
    let available = live
        .iter()
        .filter(|p| common::pod_available(p, min_ready, now))
        .count() as i32;
    let updated = live
        .iter()
        .filter(|p| p.labels().get(REVISION_HASH) == Some(&update_hash))
        .count() as i32;
    let current = live
        .iter()
        .filter(|p| p.labels().get(REVISION_HASH) == Some(&current_hash))
        .count() as i32;
    let done = updated == replicas && live.len() as i32 == replicas && ready == replicas;
    let (current_revision, current) = if done {
        (update_revision.clone(), updated)
    } else {
        (current_revision, current)
    };
    let unchanged = status.replicas == live.len() as i32
        && status.ready_replicas.unwrap_or(0) == ready
        && status.available_replicas.unwrap_or(0) == available
        && status.updated_replicas.unwrap_or(0) == updated
        && status.current_replicas.unwrap_or(0) == current
        && status.current_revision.as_deref() == Some(current_revision.as_str())
        && status.update_revision.as_deref() == Some(update_revision.as_str())
        && status.observed_generation == sts.metadata.generation;
    if !unchanged {
        let api: Api<StatefulSet> = Api::namespaced(ctx.client.clone(), ns);
        common::patch_status(
            &api,
            name,
            json!({
                "replicas": live.len(),
                "readyReplicas": ready,
                "availableReplicas": available,
                "updatedReplicas": updated,
                "currentReplicas": current,
                "currentRevision": current_revision,
                "updateRevision": update_revision,
                "observedGeneration": sts.metadata.generation,
                "collisionCount": status.collision_count.unwrap_or(0),
            }),
        )
        .await?;
    }
    Ok((min_ready > 0 && available < ready).then_some(Duration::from_secs(1)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ordinals_come_from_the_name_suffix_only() {
        assert_eq!(ordinal_of("web", "web-0"), Some(0));
        assert_eq!(ordinal_of("web", "web-12"), Some(12));
        assert_eq!(ordinal_of("web", "web-01"), None);
        assert_eq!(ordinal_of("web", "web-x"), None);
        assert_eq!(ordinal_of("web", "webby-1"), None);
        assert_eq!(ordinal_of("web", "web-"), None);
        assert_eq!(ordinal_of("web", "web-99999999999999"), None);
    }

    #[test]
    fn a_stateful_pod_has_its_identity_and_its_claims() {
        let sts: StatefulSet = serde_json::from_value(json!({
            "metadata": {"name": "db", "namespace": "ns", "uid": "u"},
            "spec": {"serviceName": "db-headless", "selector": {"matchLabels": {"app": "db"}},
                "template": {"metadata": {"labels": {"app": "db"}}, "spec": {"containers": [{"name": "c"}]}},
                "volumeClaimTemplates": [{"metadata": {"name": "data"}, "spec": {"accessModes": ["ReadWriteOnce"]}}]}
        }))
        .unwrap();
        let t = sts.spec.clone().unwrap().template;
        let p = stateful_pod(&sts, &t, "h", 2);
        assert_eq!(p.name_any(), "db-2");
        assert_eq!(p.labels().get(POD_NAME).map(String::as_str), Some("db-2"));
        assert_eq!(p.labels().get(POD_INDEX).map(String::as_str), Some("2"));
        let spec = p.spec.unwrap();
        assert_eq!(spec.hostname.as_deref(), Some("db-2"));
        assert_eq!(spec.subdomain.as_deref(), Some("db-headless"));
        let v = &spec.volumes.unwrap()[0];
        assert_eq!(
            v.persistent_volume_claim.as_ref().unwrap().claim_name,
            "data-db-2"
        );
    }
}
