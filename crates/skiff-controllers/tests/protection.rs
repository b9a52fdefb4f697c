//! StorageObjectInUseProtection through a real API server: the finalizers
//! the admission adds, and the controllers that remove them once a claim
//! is unused and a volume unbound.

mod sim;

use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim, Pod};
use kube::api::{Api, DeleteParams, PostParams};
use serde_json::json;
use sim::*;

const PVC_FINALIZER: &str = "kubernetes.io/pvc-protection";
const PV_FINALIZER: &str = "kubernetes.io/pv-protection";

fn finalizers<K: kube::Resource>(o: &K) -> Vec<String> {
    o.meta().finalizers.clone().unwrap_or_default()
}

#[tokio::test]
async fn a_claim_in_use_stays_terminating_until_its_pod_is_gone_and_its_volume_until_unbound() {
    let h = start().await;
    let c = &h.client;
    let pvs: Api<PersistentVolume> = Api::all(c.clone());
    let pvcs: Api<PersistentVolumeClaim> = Api::namespaced(c.clone(), "default");
    let pp = PostParams::default();
    let pv: PersistentVolume = serde_json::from_value(json!({"metadata": {"name": "disk"},
        "spec": {"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"],
            "storageClassName": "manual", "hostPath": {"path": "/tmp/disk"}}}))
    .unwrap();
    let pv = pvs.create(&pp, &pv).await.unwrap();
    assert_eq!(finalizers(&pv), [PV_FINALIZER]);
    let claim = |name: &str| -> PersistentVolumeClaim {
        serde_json::from_value(json!({"metadata": {"name": name}, "spec": {
            "storageClassName": "manual", "accessModes": ["ReadWriteOnce"],
            "resources": {"requests": {"storage": "1Gi"}}}}))
        .unwrap()
    };
    let data = pvcs.create(&pp, &claim("data")).await.unwrap();
    assert_eq!(finalizers(&data), [PVC_FINALIZER]);
    eventually("the claim bound", 20, || async {
        let c = pvcs.get("data").await.ok()?;
        (c.status?.phase.as_deref() == Some("Bound")).then_some(())
    })
    .await;
    let _: Pod = create(
        c,
        "default",
        json!({"metadata": {"name": "user"}, "spec": {
            "containers": [{"name": "c", "image": "app"}],
            "volumes": [{"name": "d", "persistentVolumeClaim": {"claimName": "data"}}]}}),
    )
    .await;
    eventually("the pod running", 20, || async {
        let p = pods(c, "default", "").await;
        p.iter().any(is_ready).then_some(())
    })
    .await;

    // Deleting the volume and the claim under the running pod deletes
    // neither: both are Terminating.
    pvs.delete("disk", &DeleteParams::default()).await.unwrap();
    pvcs.delete("data", &DeleteParams::default()).await.unwrap();
    // An unused claim deleted after it goes at once: the controller has
    // looked at both.
    pvcs.create(&pp, &claim("spare")).await.unwrap();
    pvcs.delete("spare", &DeleteParams::default())
        .await
        .unwrap();
    eventually("the unused claim gone", 20, || async {
        pvcs.get_opt("spare").await.ok()?.is_none().then_some(())
    })
    .await;
    let data = pvcs.get("data").await.unwrap();
    assert!(data.metadata.deletion_timestamp.is_some());
    assert_eq!(finalizers(&data), [PVC_FINALIZER]);
    let disk = pvs.get("disk").await.unwrap();
    assert!(disk.metadata.deletion_timestamp.is_some());
    assert_eq!(finalizers(&disk), [PV_FINALIZER]);

    // The pod goes: the claim goes, its volume is released and goes too.
    Api::<Pod>::namespaced(c.clone(), "default")
        .delete("user", &DeleteParams::default())
        .await
        .unwrap();
    eventually("the claim gone", 30, || async {
        pvcs.get_opt("data").await.ok()?.is_none().then_some(())
    })
    .await;
    eventually("the volume gone", 30, || async {
        pvs.get_opt("disk").await.ok()?.is_none().then_some(())
    })
    .await;
}

/// A claim of a WaitForFirstConsumer class with no pod yet stays Pending,
/// and the binder says why in a Normal Event on it, as
/// kube-controller-manager does (`kubectl describe pvc` shows it).
#[tokio::test]
async fn a_claim_waiting_for_its_first_consumer_says_so_in_an_event() {
    use k8s_openapi::api::core::v1::Event;
    use k8s_openapi::api::storage::v1::StorageClass;
    use kube::api::ListParams;
    let h = start().await;
    let c = &h.client;
    let pp = PostParams::default();
    let classes: Api<StorageClass> = Api::all(c.clone());
    let class: StorageClass = serde_json::from_value(json!({"metadata": {"name": "late"},
        "provisioner": "example.com/elsewhere", "volumeBindingMode": "WaitForFirstConsumer"}))
    .unwrap();
    classes.create(&pp, &class).await.unwrap();
    let pvcs: Api<PersistentVolumeClaim> = Api::namespaced(c.clone(), "default");
    let claim: PersistentVolumeClaim =
        serde_json::from_value(json!({"metadata": {"name": "later"},
        "spec": {"storageClassName": "late", "accessModes": ["ReadWriteOnce"],
            "resources": {"requests": {"storage": "1Gi"}}}}))
        .unwrap();
    let claim = pvcs.create(&pp, &claim).await.unwrap();
    let events: Api<Event> = Api::namespaced(c.clone(), "default");
    let ev = eventually("the WaitForFirstConsumer event", 20, || async {
        let list = events
            .list(&ListParams::default().fields("involvedObject.name=later"))
            .await
            .ok()?;
        list.items
            .into_iter()
            .find(|e| e.reason.as_deref() == Some("WaitForFirstConsumer"))
    })
    .await;
    assert_eq!(ev.type_.as_deref(), Some("Normal"));
    assert_eq!(
        ev.message.as_deref(),
        Some("waiting for first consumer to be created before binding")
    );
    assert_eq!(
        ev.involved_object.kind.as_deref(),
        Some("PersistentVolumeClaim")
    );
    assert_eq!(ev.involved_object.uid, claim.metadata.uid);
    assert_eq!(
        ev.source.and_then(|s| s.component).as_deref(),
        Some("persistentvolume-controller")
    );
    let now = pvcs.get("later").await.unwrap();
    assert_eq!(now.status.and_then(|s| s.phase).as_deref(), Some("Pending"));
}
