//! PersistentVolumeClaims: kube-controller-manager's binder and skiff's
//! built-in local-path provisioner (the k3s local-path-provisioner's job).
//!
//! A claim that names a volume is completed (both sides Bound). An unbound
//! claim is bound to the smallest Available volume of its class that
//! satisfies its size, access modes, volume mode and selector. Failing
//! that, a claim of a class whose provisioner is [`PROVISIONER`] gets a
//! new volume once a pod using it is on a node (WaitForFirstConsumer): a
//! `hostPath` directory in that node's storage directory (the agent
//! publishes it as the Node annotation [`STORAGE_ANNOTATION`]) pinned to
//! the node by node affinity. A deleted claim releases its volume: with
//! `Delete` the volume object is deleted and, for a provisioned one, the
//! node is asked to remove the directory (the Node annotation
//! [`RELEASED_ANNOTATION`], which the agent empties as it removes them);
//! with `Retain` the volume stays `Released`.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, PersistentVolume, PersistentVolumeClaim, Pod};
use k8s_openapi::api::storage::v1::StorageClass;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::ResourceExt;
use serde_json::{json, Value};

use crate::common;
use crate::controller::Controller;
use crate::framework::{self, Next};
use crate::{Ctx, Error};

pub use skiff_core::kinds::storage::{
    LOCAL_PROVISIONER as PROVISIONER, LOCAL_RELEASED_ANNOTATION as RELEASED_ANNOTATION,
    LOCAL_STORAGE_ANNOTATION as STORAGE_ANNOTATION,
};
const SELECTED_NODE: &str = "volume.kubernetes.io/selected-node";
const COMPONENT: &str = "persistentvolume-controller";

pub fn register(ctx: &Arc<Ctx>, tasks: &mut tokio::task::JoinSet<()>) {
    // A deleted claim releases its volume.
    let c = ctx.clone();
    ctx.caches.pvcs.on_change(move |old, new| {
        if let (Some(gone), None) = (old, new) {
            let c = c.clone();
            let gone = gone.clone();
            tokio::spawn(async move {
                if let Err(e) = release(&c, &gone).await {
                    tracing::warn!(claim = %gone.name_any(), "releasing its volume: {e}");
                }
            });
        }
    });
    Controller::new(ctx, "persistentvolume-binder", &ctx.caches.pvcs)
        // A pod placed on a node is the first consumer its claims wait for.
        .watches(&ctx.caches.pods, |_, _, new| {
            let Some(p) = new.filter(|p| common::is_scheduled(p)) else {
                return vec![];
            };
            let ns = p.metadata.namespace.as_deref().unwrap_or_default();
            p.spec
                .iter()
                .flat_map(|s| s.volumes.iter().flatten())
                .filter_map(|v| v.persistent_volume_claim.as_ref())
                .map(|c| format!("{ns}/{}", c.claim_name))
                .collect()
        })
        // Volumes created by hand appear without any claim changing.
        .resync(Duration::from_secs(15))
        .run(
            tasks,
            (),
            |c, _, key| async move { reconcile(&c, &key).await },
        );
    // The volumes' own phases, from a list every 10 s.
    Controller::periodic(ctx, "persistentvolume-sweep", Duration::from_secs(10)).run(
        tasks,
        (),
        |c, _, _| async move {
            if let Err(e) = sweep(&c).await {
                tracing::warn!("persistent volumes: {e}");
            }
            Ok(None)
        },
    );
}

/// The volumes' own phases: a new unclaimed volume becomes Available, and
/// a volume whose claim is gone (deleted while nobody watched) is released.
async fn sweep(ctx: &Ctx) -> Result<(), Error> {
    use k8s_openapi::api::core::v1::PersistentVolumeClaimSpec;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
    let pvs: Api<PersistentVolume> = Api::all(ctx.client.clone());
    let all = pvs.list(&ListParams::default()).await?.items;
    // Bound claims whose volume is gone are Lost.
    let names: std::collections::HashSet<String> = all.iter().map(|v| v.name_any()).collect();
    for claim in ctx.caches.pvcs.list() {
        let bound = claim.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Bound");
        let volume = claim.spec.as_ref().and_then(|s| s.volume_name.as_ref());
        if bound && volume.is_some_and(|v| !names.contains(v)) {
            let claims: Api<PersistentVolumeClaim> =
                Api::namespaced(ctx.client.clone(), &claim.namespace().unwrap_or_default());
            common::patch_status(&claims, &claim.name_any(), json!({"phase": "Lost"})).await?;
            ctx.events.warning(
                COMPONENT,
                &*claim,
                "ClaimLost",
                "Bound claim has lost its PersistentVolume. Data on the volume is lost!".into(),
            );
        }
    }
    for pv in all {
        if pv.metadata.deletion_timestamp.is_some() {
            continue;
        }
        let phase = pv
            .status
            .as_ref()
            .and_then(|s| s.phase.clone())
            .unwrap_or_default();
        match pv.spec.as_ref().and_then(|s| s.claim_ref.clone()) {
            None if phase.is_empty() || phase == "Pending" => {
                common::patch_status(&pvs, &pv.name_any(), json!({"phase": "Available"})).await?;
            }
            Some(r) if phase == "Bound" && r.uid.is_some() => {
                let key = format!(
                    "{}/{}",
                    r.namespace.clone().unwrap_or_default(),
                    r.name.clone().unwrap_or_default()
                );
                let alive = ctx
                    .caches
                    .pvcs
                    .get(&key)
                    .is_some_and(|c| c.metadata.uid == r.uid);
                if !alive {
                    let gone = PersistentVolumeClaim {
                        metadata: ObjectMeta {
                            name: r.name.clone(),
                            namespace: r.namespace.clone(),
                            uid: r.uid.clone(),
                            ..Default::default()
                        },
                        spec: Some(PersistentVolumeClaimSpec {
                            volume_name: Some(pv.name_any()),
                            ..Default::default()
                        }),
                        status: None,
                    };
                    release(ctx, &gone).await?;
                }
            }
            _ => {}
        }
    }
    Ok(())
}

fn quantity(v: Option<&Value>) -> f64 {
    v.and_then(Value::as_str)
        .and_then(common::quantity_units)
        .unwrap_or(0.0)
}

fn strings(v: Option<&Value>) -> Vec<String> {
    v.and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(|s| s.as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default()
}

/// Whether volume `pv` can hold claim `pvc` (as JSON), as the binder
/// matches them.
pub fn fits(pvc: &Value, pv: &Value) -> bool {
    let class = pvc
        .pointer("/spec/storageClassName")
        .and_then(Value::as_str)
        .unwrap_or("");
    let pv_class = pv
        .pointer("/spec/storageClassName")
        .and_then(Value::as_str)
        .unwrap_or("");
    let available = pv.pointer("/spec/claimRef").is_none()
        && matches!(
            pv.pointer("/status/phase").and_then(Value::as_str),
            None | Some("Available") | Some("Pending")
        )
        && pv.pointer("/metadata/deletionTimestamp").is_none();
    let mode = |v: &Value| {
        v.pointer("/spec/volumeMode")
            .and_then(Value::as_str)
            .unwrap_or("Filesystem")
            .to_string()
    };
    let wanted = strings(pvc.pointer("/spec/accessModes"));
    let offered = strings(pv.pointer("/spec/accessModes"));
    let selector_ok = match pvc.pointer("/spec/selector") {
        Some(sel) if !sel.is_null() => {
            let sel: k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector =
                serde_json::from_value(sel.clone()).unwrap_or_default();
            let labels = pv
                .pointer("/metadata/labels")
                .and_then(|l| serde_json::from_value(l.clone()).ok())
                .unwrap_or_default();
            common::selector_matches(&sel, &labels)
        }
        _ => true,
    };
    available
        && class == pv_class
        && mode(pvc) == mode(pv)
        && wanted.iter().all(|m| offered.contains(m))
        && quantity(pv.pointer("/spec/capacity/storage"))
            >= quantity(pvc.pointer("/spec/resources/requests/storage"))
        && selector_ok
}

async fn reconcile(ctx: &Ctx, key: &str) -> Result<Next, Error> {
    let Some(claim) = ctx.caches.pvcs.get(key) else {
        return Ok(None);
    };
    if claim.metadata.deletion_timestamp.is_some() {
        return Ok(None);
    }
    let (ns, name) = framework::split_key(key);
    let pvc = serde_json::to_value(&*claim)?;
    let pvs: Api<PersistentVolume> = Api::all(ctx.client.clone());
    if let Some(volume) = claim.spec.as_ref().and_then(|s| s.volume_name.clone()) {
        // A binding this controller completed needs nothing on a resync
        // (a claim whose volume disappears is found by the sweep).
        let phase = claim.status.as_ref().and_then(|s| s.phase.as_deref());
        if matches!(phase, Some("Bound") | Some("Lost"))
            && claim
                .annotations()
                .contains_key("pv.kubernetes.io/bind-completed")
        {
            return Ok(None);
        }
        // Pre-bound by the user, or a binding cut short: finish both sides.
        if let Some(pv) = pvs.get_opt(&volume).await? {
            bind(ctx, &claim, &serde_json::to_value(&pv)?).await?;
        }
        return Ok(None);
    }
    let class_name = pvc
        .pointer("/spec/storageClassName")
        .and_then(Value::as_str)
        .unwrap_or("");
    let class = if class_name.is_empty() {
        None
    } else {
        let classes: Api<StorageClass> = Api::all(ctx.client.clone());
        classes.get_opt(class_name).await?
    };
    let wait_for_consumer = class
        .as_ref()
        .is_some_and(|c| c.volume_binding_mode.as_deref() == Some("WaitForFirstConsumer"));
    // The node of the claim's first consumer: the one the scheduler chose
    // for it, or that of a scheduled pod using it.
    let node_name = claim
        .annotations()
        .get(SELECTED_NODE)
        .cloned()
        .or_else(|| consumer_node(ctx, ns, name));
    // WaitForFirstConsumer: nothing is bound before that node is known,
    // and only to a volume the node can reach.
    let node = match &node_name {
        Some(n) => ctx.caches.nodes.get(n),
        None => None,
    };
    if wait_for_consumer && node.is_none() {
        if node_name.is_none() {
            // As kube-controller-manager's binder says it on every sync of
            // such a claim (`kubectl describe pvc` shows it).
            let waiting = unscheduled_consumers(ctx, ns, name);
            let (reason, message) = match waiting.as_slice() {
                [] => (
                    "WaitForFirstConsumer",
                    "waiting for first consumer to be created before binding".to_string(),
                ),
                [one] => (
                    "WaitForPodScheduled",
                    format!("waiting for pod {one} to be scheduled"),
                ),
                many => (
                    "WaitForPodScheduled",
                    format!("waiting for pods {} to be scheduled", many.join(",")),
                ),
            };
            ctx.events.normal(COMPONENT, &*claim, reason, message);
        }
        return Ok(None);
    }
    // The smallest Available volume that fits.
    let list = pvs.list(&ListParams::default()).await?;
    let best = list
        .items
        .iter()
        .filter_map(|v| serde_json::to_value(v).ok())
        .filter(|v| fits(&pvc, v))
        .filter(|v| !wait_for_consumer || node.as_ref().is_some_and(|n| reachable(v, n)))
        .min_by(|a, b| {
            quantity(a.pointer("/spec/capacity/storage"))
                .total_cmp(&quantity(b.pointer("/spec/capacity/storage")))
        });
    if let Some(pv) = best {
        bind(ctx, &claim, &pv).await?;
        return Ok(None);
    }
    // Dynamic provisioning by the claim's class, on the consumer's node.
    let Some(class) = class else {
        return Ok(None);
    };
    if class.provisioner != PROVISIONER {
        return Ok(None);
    }
    let (Some(node_name), Some(node)) = (node_name, node) else {
        return Ok(None);
    };
    let Some(root) = node.annotations().get(STORAGE_ANNOTATION).cloned() else {
        ctx.events.warning(COMPONENT, &*claim, "ProvisioningFailed", format!(
            "failed to provision volume with StorageClass {class_name:?}: node {node_name:?} has no local storage"));
        return Ok(None);
    };
    let uid = claim.metadata.uid.clone().unwrap_or_default();
    let pv_name = format!("pvc-{uid}");
    let path = format!("{}/{pv_name}_{ns}_{name}", root.trim_end_matches('/'));
    let hostname = node
        .labels()
        .get("kubernetes.io/hostname")
        .cloned()
        .unwrap_or_else(|| node_name.clone());
    let pv = json!({
        "apiVersion": "v1", "kind": "PersistentVolume",
        "metadata": {"name": pv_name, "annotations": {
            "pv.kubernetes.io/provisioned-by": PROVISIONER, "local.path.provisioner/selected-node": node_name}},
        "spec": {
            "capacity": {"storage": pvc.pointer("/spec/resources/requests/storage").cloned().unwrap_or(json!("1Gi"))},
            "accessModes": pvc.pointer("/spec/accessModes").cloned().unwrap_or(json!(["ReadWriteOnce"])),
            "persistentVolumeReclaimPolicy": class.reclaim_policy.clone().unwrap_or_else(|| "Delete".into()),
            "storageClassName": class_name,
            "volumeMode": pvc.pointer("/spec/volumeMode").cloned().unwrap_or(json!("Filesystem")),
            "hostPath": {"path": path, "type": "DirectoryOrCreate"},
            "nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [
                {"key": "kubernetes.io/hostname", "operator": "In", "values": [hostname]}]}]}},
            "claimRef": {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "namespace": ns, "name": name, "uid": uid},
        }
    });
    let pv: PersistentVolume = serde_json::from_value(pv)?;
    let created = match pvs.create(&PostParams::default(), &pv).await {
        Ok(v) => v,
        Err(e) if common::is_conflict(&e) || matches!(&e, kube::Error::Api(a) if a.code == 409) => {
            pvs.get(&pv_name).await?
        }
        Err(e) => return Err(e.into()),
    };
    ctx.events.normal(
        COMPONENT,
        &*claim,
        "ProvisioningSucceeded",
        format!("Successfully provisioned volume {pv_name} on node {node_name}"),
    );
    bind(ctx, &claim, &serde_json::to_value(&created)?).await?;
    Ok(None)
}

/// Whether volume `pv` (as JSON) can be used on `node`: its required node
/// affinity, if any, matches the node (Kubernetes' CheckNodeAffinity).
pub fn reachable(pv: &Value, node: &Node) -> bool {
    let Some(required) = pv.pointer("/spec/nodeAffinity/required") else {
        return true;
    };
    let Ok(required) = serde_json::from_value(required.clone()) else {
        return false;
    };
    let spec = k8s_openapi::api::core::v1::PodSpec {
        affinity: Some(k8s_openapi::api::core::v1::Affinity {
            node_affinity: Some(k8s_openapi::api::core::v1::NodeAffinity {
                required_during_scheduling_ignored_during_execution: Some(required),
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    };
    common::node_fits(node, &spec)
}

/// The names of the pods in `ns` that mount claim `name` and are not
/// scheduled yet, sorted.
fn unscheduled_consumers(ctx: &Ctx, ns: &str, name: &str) -> Vec<String> {
    let mut out: Vec<String> = ctx
        .caches
        .pods
        .in_namespace(ns)
        .into_iter()
        .filter_map(|p: Arc<Pod>| {
            let spec = p.spec.as_ref()?;
            let uses = spec.volumes.iter().flatten().any(|v| {
                v.persistent_volume_claim
                    .as_ref()
                    .is_some_and(|c| c.claim_name == name)
            });
            (uses && spec.node_name.is_none() && p.metadata.deletion_timestamp.is_none())
                .then(|| p.name_any())
        })
        .collect();
    out.sort();
    out
}

/// The node of a scheduled pod in `ns` that mounts claim `name`.
fn consumer_node(ctx: &Ctx, ns: &str, name: &str) -> Option<String> {
    ctx.caches
        .pods
        .in_namespace(ns)
        .into_iter()
        .find_map(|p: Arc<Pod>| {
            let spec = p.spec.as_ref()?;
            let uses = spec.volumes.iter().flatten().any(|v| {
                v.persistent_volume_claim
                    .as_ref()
                    .is_some_and(|c| c.claim_name == name)
            });
            uses.then(|| spec.node_name.clone()).flatten()
        })
}

/// Binds claim and volume both ways (idempotent): the volume's claimRef
/// and phase, the claim's volumeName, annotations and status.
async fn bind(ctx: &Ctx, claim: &PersistentVolumeClaim, pv: &Value) -> Result<(), Error> {
    let ns = claim.namespace().unwrap_or_default();
    let name = claim.name_any();
    let uid = claim.metadata.uid.clone().unwrap_or_default();
    let pv_name = pv
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_string();
    let pvs: Api<PersistentVolume> = Api::all(ctx.client.clone());
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(ctx.client.clone(), &ns);
    let claimed_uid = pv.pointer("/spec/claimRef/uid").and_then(Value::as_str);
    if claimed_uid.is_some_and(|u| u != uid) {
        return Ok(()); // someone else's volume
    }
    if claimed_uid.is_none() {
        let patch = json!({"metadata": {"annotations": {"pv.kubernetes.io/bound-by-controller": "yes"}},
            "spec": {"claimRef": {"apiVersion": "v1", "kind": "PersistentVolumeClaim",
                "namespace": ns, "name": name, "uid": uid}}});
        pvs.patch(&pv_name, &PatchParams::default(), &Patch::Merge(&patch))
            .await?;
    }
    if pv.pointer("/status/phase").and_then(Value::as_str) != Some("Bound") {
        common::patch_status(&pvs, &pv_name, json!({"phase": "Bound"})).await?;
    }
    let spec_bound = claim.spec.as_ref().and_then(|s| s.volume_name.as_deref()) == Some(&pv_name);
    if !spec_bound
        || !claim
            .annotations()
            .contains_key("pv.kubernetes.io/bind-completed")
    {
        let mut annotations = json!({"pv.kubernetes.io/bind-completed": "yes"});
        if !spec_bound {
            annotations["pv.kubernetes.io/bound-by-controller"] = json!("yes");
        }
        let patch =
            json!({"metadata": {"annotations": annotations}, "spec": {"volumeName": pv_name}});
        claims
            .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
            .await?;
    }
    if claim.status.as_ref().and_then(|s| s.phase.as_deref()) != Some("Bound") {
        common::patch_status(
            &claims,
            &name,
            json!({
                "phase": "Bound",
                "accessModes": pv.pointer("/spec/accessModes"),
                "capacity": pv.pointer("/spec/capacity"),
            }),
        )
        .await?;
    }
    Ok(())
}

/// A deleted claim's volume: deleted (and its directory handed to its
/// node) under `Delete`, `Released` under `Retain`.
async fn release(ctx: &Ctx, claim: &PersistentVolumeClaim) -> Result<(), Error> {
    let Some(pv_name) = claim.spec.as_ref().and_then(|s| s.volume_name.clone()) else {
        return Ok(());
    };
    let pvs: Api<PersistentVolume> = Api::all(ctx.client.clone());
    let Some(pv) = pvs.get_opt(&pv_name).await? else {
        return Ok(());
    };
    let ours = pv
        .spec
        .as_ref()
        .and_then(|s| s.claim_ref.as_ref())
        .and_then(|r| r.uid.clone())
        == claim.metadata.uid;
    if !ours {
        return Ok(());
    }
    let policy = pv
        .spec
        .as_ref()
        .and_then(|s| s.persistent_volume_reclaim_policy.clone())
        .unwrap_or_else(|| "Retain".into());
    // Released first: a volume is deleted only once it is no longer
    // Bound (pv-protection keeps a Bound volume's finalizer).
    common::patch_status(&pvs, &pv_name, json!({"phase": "Released"})).await?;
    if policy != "Delete" {
        return Ok(());
    }
    let provisioned = pv
        .annotations()
        .get("pv.kubernetes.io/provisioned-by")
        .map(String::as_str)
        == Some(PROVISIONER);
    if provisioned {
        let node = pv
            .annotations()
            .get("local.path.provisioner/selected-node")
            .cloned();
        let dir = pv
            .spec
            .as_ref()
            .and_then(|s| s.host_path.as_ref())
            .and_then(|h| h.path.rsplit('/').next().map(str::to_string));
        if let (Some(node), Some(dir)) = (node, dir) {
            hand_to_node(ctx, &node, &dir).await?;
        }
    }
    match pvs.delete(&pv_name, &DeleteParams::default()).await {
        Ok(_) => Ok(()),
        Err(e) if common::is_not_found(&e) => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// Adds `dir` to the node's released directories (retrying conflicts).
async fn hand_to_node(ctx: &Ctx, node: &str, dir: &str) -> Result<(), Error> {
    let nodes: Api<Node> = Api::all(ctx.client.clone());
    for _ in 0..5 {
        let Some(n) = nodes.get_opt(node).await? else {
            return Ok(());
        };
        let mut list: Vec<String> = n
            .annotations()
            .get(RELEASED_ANNOTATION)
            .map(|s| {
                s.split(',')
                    .filter(|x| !x.is_empty())
                    .map(str::to_string)
                    .collect()
            })
            .unwrap_or_default();
        if list.iter().any(|d| d == dir) {
            return Ok(());
        }
        list.push(dir.to_string());
        let patch = json!({"metadata": {"resourceVersion": n.resource_version(),
            "annotations": {RELEASED_ANNOTATION: list.join(",")}}});
        match nodes
            .patch(node, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            Ok(_) => return Ok(()),
            Err(e) if common::is_conflict(&e) => continue,
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_binder_matches_class_size_modes_and_selector() {
        let pvc = json!({"spec": {"storageClassName": "manual", "accessModes": ["ReadWriteOnce"],
            "resources": {"requests": {"storage": "1Gi"}}, "selector": {"matchLabels": {"tier": "db"}}}});
        let pv = |class: &str, size: &str, modes: Value, labels: Value| {
            json!({"metadata": {"labels": labels}, "spec": {"storageClassName": class,
                "capacity": {"storage": size}, "accessModes": modes}, "status": {"phase": "Available"}})
        };
        let db = json!({"tier": "db"});
        assert!(fits(
            &pvc,
            &pv(
                "manual",
                "2Gi",
                json!(["ReadWriteOnce", "ReadOnlyMany"]),
                db.clone()
            )
        ));
        assert!(!fits(
            &pvc,
            &pv("other", "2Gi", json!(["ReadWriteOnce"]), db.clone())
        ));
        assert!(!fits(
            &pvc,
            &pv("manual", "512Mi", json!(["ReadWriteOnce"]), db.clone())
        ));
        assert!(!fits(
            &pvc,
            &pv("manual", "2Gi", json!(["ReadOnlyMany"]), db.clone())
        ));
        assert!(!fits(
            &pvc,
            &pv(
                "manual",
                "2Gi",
                json!(["ReadWriteOnce"]),
                json!({"tier": "web"})
            )
        ));
        let mut taken = pv("manual", "2Gi", json!(["ReadWriteOnce"]), db);
        taken["spec"]["claimRef"] = json!({"name": "other"});
        assert!(!fits(&pvc, &taken));
    }
}
