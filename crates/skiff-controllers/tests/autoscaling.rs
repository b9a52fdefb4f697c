//! The horizontal pod autoscaler through a real API server, on hollow
//! nodes (which report no usage, as nodes whose metrics cannot be read).

mod sim;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::autoscaling::v2::HorizontalPodAutoscaler;
use k8s_openapi::api::core::v1::Event;
use kube::api::{Api, ListParams, Patch, PatchParams};
use serde_json::json;
use sim::*;

fn condition(h: &HorizontalPodAutoscaler, kind: &str) -> Option<(String, String)> {
    h.status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == kind)
        .map(|c| (c.status.clone(), c.reason.clone().unwrap_or_default()))
}

#[tokio::test]
async fn an_autoscaler_keeps_its_target_within_bounds_and_reports_missing_metrics() {
    let h = start().await;
    let c = &h.client;
    let _: Deployment = create(
        c,
        "default",
        json!({
            "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "web"},
            "spec": {"replicas": 1, "selector": {"matchLabels": {"app": "web"}},
                "template": {"metadata": {"labels": {"app": "web"}}, "spec": {"containers": [
                    {"name": "c", "image": "x", "resources": {"requests": {"cpu": "100m"}}}]}}}
        }),
    )
    .await;
    let _: HorizontalPodAutoscaler = create(c, "default", json!({
        "apiVersion": "autoscaling/v2", "kind": "HorizontalPodAutoscaler", "metadata": {"name": "web"},
        "spec": {"scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "web"},
            "minReplicas": 2, "maxReplicas": 4,
            "metrics": [{"type": "Resource", "resource": {"name": "cpu",
                "target": {"type": "Utilization", "averageUtilization": 50}}}]}
    }))
    .await;
    // Below its minimum: scaled up to it without waiting for metrics.
    let deployments = Api::<Deployment>::namespaced(c.clone(), "default");
    eventually("the deployment scaled to the minimum", 30, || async {
        let d = deployments.get("web").await.ok()?;
        (d.spec?.replicas == Some(2)).then_some(())
    })
    .await;
    let hpas = Api::<HorizontalPodAutoscaler>::namespaced(c.clone(), "default");
    let scaled = eventually("the rescale reported", 30, || async {
        let a = hpas.get("web").await.ok()?;
        let s = a.status.as_ref()?;
        (s.desired_replicas == 2 && s.last_scale_time.is_some()).then_some(a)
    })
    .await;
    assert_eq!(
        condition(&scaled, "AbleToScale").map(|c| c.0),
        Some("True".into())
    );
    let events = Api::<Event>::namespaced(c.clone(), "default")
        .list(&ListParams::default().fields("involvedObject.name=web,reason=SuccessfulRescale"))
        .await
        .unwrap();
    assert!(
        events.items.iter().any(|e| e.message.as_deref()
            == Some("New size: 2; reason: Current number of replicas below Spec.MinReplicas")),
        "{:?}",
        events.items.iter().map(|e| &e.message).collect::<Vec<_>>()
    );
    // Within bounds, the decision needs metrics; hollow nodes have none,
    // so the autoscaler says so and leaves the scale alone.
    let stuck = eventually("missing metrics reported", 40, || async {
        let a = hpas.get("web").await.ok()?;
        (condition(&a, "ScalingActive") == Some(("False".into(), "FailedGetResourceMetric".into())))
            .then_some(a)
    })
    .await;
    assert_eq!(stuck.status.unwrap().current_replicas, Some(2));
    // Above its maximum (someone scaled the target by hand): brought back.
    deployments
        .patch(
            "web",
            &PatchParams::default(),
            &Patch::Merge(&json!({"spec": {"replicas": 7}})),
        )
        .await
        .unwrap();
    eventually("scaled back to the maximum", 40, || async {
        let d = deployments.get("web").await.ok()?;
        (d.spec?.replicas == Some(4)).then_some(())
    })
    .await;
}
