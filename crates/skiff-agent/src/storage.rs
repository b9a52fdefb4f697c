//! Local persistent volumes on this node. The agent keeps them under
//! `<data-dir>/storage`, publishes that directory on its Node (the
//! controller manager's local-path provisioner makes `hostPath` volumes
//! there, pinned to this node), mounts a pod's `persistentVolumeClaim`
//! volumes from the volume its claim is bound to, and removes the
//! directories of deleted volumes the controller hands it through the
//! Node annotation `skiff.io/local-volumes-released`.

use std::path::{Path, PathBuf};
use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, PersistentVolume, PersistentVolumeClaim};
use kube::api::{Api, Patch, PatchParams};
use kube::ResourceExt;
use serde_json::json;

pub use skiff_core::kinds::storage::{
    LOCAL_RELEASED_ANNOTATION as RELEASED_ANNOTATION,
    LOCAL_STORAGE_ANNOTATION as STORAGE_ANNOTATION,
};

/// The storage directory under an agent's data directory.
pub fn root(data_dir: &Path) -> PathBuf {
    data_dir.join("storage")
}

/// Creates the storage directory and names it on the Node.
pub async fn advertise(client: &kube::Client, node: &str, root: &Path) -> anyhow::Result<()> {
    std::fs::create_dir_all(root)?;
    let nodes: Api<Node> = Api::all(client.clone());
    let patch = json!({"metadata": {"annotations": {
        STORAGE_ANNOTATION: root.to_string_lossy()}}});
    nodes
        .patch(node, &PatchParams::default(), &Patch::Merge(&patch))
        .await?;
    Ok(())
}

/// The host directory of claim `ns/claim`'s volume, once bound and if the
/// volume's node affinity allows `node` (its hostname label). Errors read
/// as the reason the pod waits.
pub async fn claim_path(
    client: &kube::Client,
    ns: &str,
    claim: &str,
    node: &str,
) -> Result<PathBuf, String> {
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), ns);
    let pvc = match claims.get_opt(claim).await {
        Ok(Some(c)) => c,
        Ok(None) => return Err(format!("persistentvolumeclaim {claim:?} not found")),
        Err(e) => return Err(format!("persistentvolumeclaim {claim:?}: {e}")),
    };
    let bound = pvc.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Bound");
    let Some(volume) = pvc
        .spec
        .as_ref()
        .and_then(|s| s.volume_name.clone())
        .filter(|_| bound)
    else {
        return Err(format!("persistentvolumeclaim {claim:?} is not bound yet"));
    };
    let pvs: Api<PersistentVolume> = Api::all(client.clone());
    let pv = pvs
        .get(&volume)
        .await
        .map_err(|e| format!("persistentvolume {volume:?}: {e}"))?;
    let spec = pv.spec.unwrap_or_default();
    if !node.is_empty() && !allows(&spec, node) {
        return Err(format!(
            "persistentvolume {volume:?} is pinned to another node (volume node affinity conflict)"
        ));
    }
    if let Some(hp) = spec.host_path {
        let path = PathBuf::from(&hp.path);
        if matches!(hp.type_.as_deref(), Some("DirectoryOrCreate")) && !path.exists() {
            use std::os::unix::fs::PermissionsExt;
            std::fs::create_dir_all(&path)
                .map_err(|e| format!("creating {}: {e}", path.display()))?;
            // Like local-path-provisioner: any container user may write.
            let _ = std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o777));
        }
        if !path.is_dir() {
            return Err(format!(
                "persistentvolume {volume:?}: {} is not a directory on this node",
                hp.path
            ));
        }
        return Ok(path);
    }
    if let Some(local) = spec.local {
        let path = PathBuf::from(&local.path);
        if !path.exists() {
            return Err(format!(
                "persistentvolume {volume:?}: local path {} does not exist on this node",
                local.path
            ));
        }
        return Ok(path);
    }
    Err(format!(
        "persistentvolume {volume:?}: only hostPath and local volumes are supported by skiff's agent"
    ))
}

/// Whether the volume's required node affinity admits the node named
/// `node` (only `kubernetes.io/hostname` terms are judged: the others
/// name labels this check does not know).
fn allows(spec: &k8s_openapi::api::core::v1::PersistentVolumeSpec, node: &str) -> bool {
    let Some(terms) = spec
        .node_affinity
        .as_ref()
        .and_then(|a| a.required.as_ref())
        .map(|r| &r.node_selector_terms)
    else {
        return true;
    };
    terms.is_empty()
        || terms.iter().any(|t| {
            t.match_expressions.iter().flatten().all(|e| {
                e.key != "kubernetes.io/hostname"
                    || match e.operator.as_str() {
                        "In" => e.values.iter().flatten().any(|v| v == node),
                        "NotIn" => !e.values.iter().flatten().any(|v| v == node),
                        _ => true,
                    }
            })
        })
}

/// Removes the directories the controller lists on the Node, then takes
/// them off the list; every 10 s.
pub async fn remove_released_forever(client: kube::Client, node: String, root: PathBuf) {
    let nodes: Api<Node> = Api::all(client);
    loop {
        tokio::time::sleep(Duration::from_secs(10)).await;
        let Ok(Some(n)) = nodes.get_opt(&node).await else {
            continue;
        };
        let Some(list) = n.annotations().get(RELEASED_ANNOTATION).cloned() else {
            continue;
        };
        for dir in list.split(',').filter(|d| !d.is_empty()) {
            // Only plain names directly under the storage directory.
            if dir.contains('/') || dir == "." || dir == ".." {
                continue;
            }
            let path = root.join(dir);
            if path.exists() {
                if let Err(e) = std::fs::remove_dir_all(&path) {
                    tracing::warn!("removing released volume {}: {e}", path.display());
                    continue;
                }
                tracing::info!("removed released volume {}", path.display());
            }
        }
        // Take the handled names off, unless the list changed meanwhile
        // (the resourceVersion precondition; the next round sees it).
        let patch = json!({"metadata": {"resourceVersion": n.resource_version(),
            "annotations": {RELEASED_ANNOTATION: null}}});
        let _ = nodes
            .patch(&node, &PatchParams::default(), &Patch::Merge(&patch))
            .await;
    }
}
