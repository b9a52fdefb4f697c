//! StorageObjectInUseProtection's two controllers (kube-controller-manager's
//! `pvc-protection` and `pv-protection`).
//!
//! Every claim carries the finalizer [`PVC_FINALIZER`] and every volume
//! [`PV_FINALIZER`] (the API server's admission adds them on create; these
//! controllers add them to objects made before). A deleted claim keeps its
//! finalizer, and stays Terminating, while a scheduled pod names it; a
//! deleted volume keeps its finalizer while it is Bound. So `kubectl delete
//! pvc` under a running pod deletes nothing the pod still uses.

use std::sync::Arc;

use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim, Pod};
use kube::api::{Api, ListParams, Patch, PatchParams};
use kube::{Resource, ResourceExt};
use serde_json::json;

use crate::controller::Controller;
use crate::framework::{self, Cache, Next};
use crate::{common, Ctx, Error};

pub const PVC_FINALIZER: &str = "kubernetes.io/pvc-protection";
pub const PV_FINALIZER: &str = "kubernetes.io/pv-protection";

fn has(meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta, f: &str) -> bool {
    meta.finalizers.iter().flatten().any(|x| x == f)
}

/// Whether the controller has something to do for an object: a finalizer
/// to add (alive, without it) or to consider removing (deleted, with it).
fn needs_work(meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta, f: &str) -> bool {
    meta.deletion_timestamp.is_some() == has(meta, f)
}

/// The claim names pod `p` mounts (`persistentVolumeClaim`, and a generic
/// ephemeral volume's `<pod>-<volume>`).
fn claims_of(p: &Pod) -> Vec<String> {
    let name = p.metadata.name.as_deref().unwrap_or("");
    p.spec
        .iter()
        .flat_map(|s| s.volumes.iter().flatten())
        .filter_map(|v| match (&v.persistent_volume_claim, &v.ephemeral) {
            (Some(c), _) => Some(c.claim_name.clone()),
            (None, Some(_)) => Some(format!("{name}-{}", v.name)),
            _ => None,
        })
        .collect()
}

/// Kubernetes' podUsesPVC: a scheduled pod that names the claim (an
/// ephemeral volume's claim only while the pod is not shut down and the
/// claim is the pod's own).
pub fn pod_uses(p: &Pod, claim: &PersistentVolumeClaim) -> bool {
    let Some(spec) = p.spec.as_ref() else {
        return false;
    };
    if spec.node_name.as_deref().unwrap_or("").is_empty() {
        return false;
    }
    let pod_name = p.metadata.name.as_deref().unwrap_or("");
    let claim_name = claim.metadata.name.as_deref().unwrap_or("");
    // Shut down: the kubelet is done with it, or it was force-deleted.
    let shut_down = p.metadata.deletion_timestamp.is_some()
        && p.metadata.deletion_grace_period_seconds == Some(0);
    spec.volumes.iter().flatten().any(|v| {
        if let Some(c) = &v.persistent_volume_claim {
            return c.claim_name == claim_name;
        }
        v.ephemeral.is_some()
            && !shut_down
            && format!("{pod_name}-{}", v.name) == claim_name
            && common::controller_of(&claim.metadata)
                .is_some_and(|o| Some(&o.uid) == p.metadata.uid.as_ref())
    })
}

/// Patches the object's finalizers to `list`, at the version read (a
/// conflict is retried by the queue).
async fn set_finalizers<K>(
    api: &Api<K>,
    meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta,
    list: Vec<String>,
) -> Result<(), Error>
where
    K: Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let patch = json!({"metadata": {"resourceVersion": meta.resource_version, "finalizers": list}});
    match api
        .patch(
            meta.name.as_deref().unwrap_or(""),
            &PatchParams::default(),
            &Patch::Merge(&patch),
        )
        .await
    {
        Ok(_) => Ok(()),
        Err(e) if common::is_not_found(&e) => Ok(()),
        Err(e) => Err(e.into()),
    }
}

fn with(meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta, f: &str) -> Vec<String> {
    let mut l = meta.finalizers.clone().unwrap_or_default();
    l.push(f.to_string());
    l
}

fn without(
    meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta,
    f: &str,
) -> Vec<String> {
    meta.finalizers
        .iter()
        .flatten()
        .filter(|x| *x != f)
        .cloned()
        .collect()
}

// ---- pvc-protection ------------------------------------------------------------------

pub fn register_pvc(ctx: &Arc<Ctx>, tasks: &mut tokio::task::JoinSet<()>) {
    Controller::named(ctx, "pvc-protection")
        .watches(&ctx.caches.pvcs, |_, _, new| {
            new.filter(|c| needs_work(&c.metadata, PVC_FINALIZER))
                .map(|c| framework::key_of(&c.metadata))
        })
        // A pod that stops counting (deleted, or one that never did)
        // may free a claim being deleted.
        .watches(&ctx.caches.pods, |_, old, new| {
            let gone = new.is_none();
            let mut keys = vec![];
            for p in old.into_iter().chain(new) {
                if gone || !common::is_scheduled(p) || p.metadata.deletion_timestamp.is_some() {
                    let ns = p.metadata.namespace.as_deref().unwrap_or("");
                    keys.extend(claims_of(p).into_iter().map(|c| format!("{ns}/{c}")));
                }
            }
            keys
        })
        .workers(1)
        .run(tasks, (), |c, _, key| async move {
            reconcile_pvc(&c, &key).await
        });
}

async fn reconcile_pvc(ctx: &Ctx, key: &str) -> Result<Next, Error> {
    let Some(claim) = ctx.caches.pvcs.get(key) else {
        return Ok(None);
    };
    let (ns, _) = framework::split_key(key);
    let api: Api<PersistentVolumeClaim> = Api::namespaced(ctx.client.clone(), ns);
    let meta = &claim.metadata;
    if meta.deletion_timestamp.is_none() {
        if !has(meta, PVC_FINALIZER) {
            set_finalizers(&api, meta, with(meta, PVC_FINALIZER)).await?;
        }
        return Ok(None);
    }
    if !has(meta, PVC_FINALIZER) {
        return Ok(None);
    }
    // The cache first; if it knows no user, a live list makes sure (a pod
    // created a moment ago may not be in the cache yet).
    if ctx
        .caches
        .pods
        .in_namespace(ns)
        .iter()
        .any(|p| pod_uses(p, &claim))
    {
        return Ok(None);
    }
    let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), ns);
    if pods
        .list(&ListParams::default())
        .await?
        .items
        .iter()
        .any(|p| pod_uses(p, &claim))
    {
        return Ok(None);
    }
    set_finalizers(&api, meta, without(meta, PVC_FINALIZER)).await?;
    Ok(None)
}

// ---- pv-protection -------------------------------------------------------------------

pub fn register_pv(ctx: &Arc<Ctx>, tasks: &mut tokio::task::JoinSet<()>) {
    // Volumes are watched here only (the shared caches have no volumes).
    let volumes: Arc<Cache<PersistentVolume>> = Cache::new();
    let controller = Controller::named(ctx, "pv-protection").watches(&volumes, |_, _, new| {
        new.filter(|v| needs_work(&v.metadata, PV_FINALIZER))
            .map(|v| v.name_any())
    });
    volumes.start(Api::all(ctx.client.clone()), tasks);
    let cache = volumes.clone();
    controller
        .workers(1)
        .ready(async move { cache.ready().await })
        .run(tasks, volumes, |c, volumes, key| async move {
            reconcile_pv(&c, &volumes, &key).await
        });
}

async fn reconcile_pv(
    ctx: &Ctx,
    volumes: &Cache<PersistentVolume>,
    name: &str,
) -> Result<Next, Error> {
    let Some(pv) = volumes.get(name) else {
        return Ok(None);
    };
    let api: Api<PersistentVolume> = Api::all(ctx.client.clone());
    let meta = &pv.metadata;
    if meta.deletion_timestamp.is_none() {
        if !has(meta, PV_FINALIZER) {
            set_finalizers(&api, meta, with(meta, PV_FINALIZER)).await?;
        }
        return Ok(None);
    }
    let bound = pv.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Bound");
    if has(meta, PV_FINALIZER) && !bound {
        set_finalizers(&api, meta, without(meta, PV_FINALIZER)).await?;
    }
    Ok(None)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(v: serde_json::Value) -> Pod {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn only_a_scheduled_pod_naming_the_claim_uses_it() {
        let claim: PersistentVolumeClaim =
            serde_json::from_value(json!({"metadata": {"name": "data", "namespace": "ns"}}))
                .unwrap();
        let vols = json!([{"name": "v", "persistentVolumeClaim": {"claimName": "data"}}]);
        let running = pod(json!({"metadata": {"name": "p"}, "spec": {"nodeName": "n",
            "containers": [], "volumes": vols}}));
        assert!(pod_uses(&running, &claim));
        // Kubernetes counts a finished pod that still exists, too.
        let mut done = running.clone();
        done.status = Some(serde_json::from_value(json!({"phase": "Succeeded"})).unwrap());
        assert!(pod_uses(&done, &claim));
        let pending = pod(json!({"metadata": {"name": "p"}, "spec": {
            "containers": [], "volumes": vols}}));
        assert!(!pod_uses(&pending, &claim));
        let other = pod(
            json!({"metadata": {"name": "p"}, "spec": {"nodeName": "n", "containers": [],
            "volumes": [{"name": "v", "persistentVolumeClaim": {"claimName": "other"}}]}}),
        );
        assert!(!pod_uses(&other, &claim));
    }

    #[test]
    fn an_ephemeral_claim_is_used_by_its_own_pod_until_it_is_shut_down() {
        let claim: PersistentVolumeClaim = serde_json::from_value(json!({"metadata": {
            "name": "p-scratch", "namespace": "ns", "ownerReferences": [{"apiVersion": "v1",
            "kind": "Pod", "name": "p", "uid": "u1", "controller": true}]}}))
        .unwrap();
        let p = pod(
            json!({"metadata": {"name": "p", "uid": "u1"}, "spec": {"nodeName": "n",
            "containers": [], "volumes": [{"name": "scratch", "ephemeral": {"volumeClaimTemplate":
            {"spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}}}}}]}}),
        );
        assert!(pod_uses(&p, &claim));
        let mut stranger = p.clone();
        stranger.metadata.uid = Some("u2".into());
        assert!(!pod_uses(&stranger, &claim));
        let mut shut = p.clone();
        shut.metadata.deletion_timestamp =
            Some(serde_json::from_value(json!("2026-01-01T00:00:00Z")).unwrap());
        shut.metadata.deletion_grace_period_seconds = Some(0);
        assert!(!pod_uses(&shut, &claim));
    }

    #[test]
    fn work_is_adding_to_live_objects_and_removing_from_deleted_ones() {
        let meta =
            |deleted: bool, fin: bool| k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
                deletion_timestamp: deleted
                    .then(|| serde_json::from_value(json!("2026-01-01T00:00:00Z")).unwrap()),
                finalizers: fin.then(|| vec![PVC_FINALIZER.to_string()]),
                ..Default::default()
            };
        assert!(needs_work(&meta(false, false), PVC_FINALIZER));
        assert!(!needs_work(&meta(false, true), PVC_FINALIZER));
        assert!(needs_work(&meta(true, true), PVC_FINALIZER));
        assert!(!needs_work(&meta(true, false), PVC_FINALIZER));
    }
}
