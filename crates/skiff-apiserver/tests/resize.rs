//! `pods/<name>/resize` (in-place pod resize, Kubernetes 1.33): GET
//! answers the pod; PATCH (strategic merge, as `kubectl patch
//! --subresource resize` sends it) and PUT change containers' cpu and
//! memory and nothing else, bumping the generation; Kubernetes'
//! `ValidatePodResize` refuses the rest with a 422 naming the field; and a
//! plain update of the pod still may not touch resources.

mod common;

use std::sync::Arc;

use axum::http::StatusCode;
use axum::Router;
use serde_json::{json, Value};
use skiff_store::{RedbStore, Store};

async fn router() -> (Router, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let store: Arc<dyn Store> =
        RedbStore::open(&dir.path().join("s.redb"), Default::default()).unwrap();
    let server = skiff_apiserver::ApiServer::start(store, Default::default())
        .await
        .unwrap();
    (server.in_process_router("test"), dir)
}

const PODS: &str = "/api/v1/namespaces/default/pods";
const SMP: &str = "application/strategic-merge-patch+json";

async fn call(r: &Router, method: &str, path: &str, body: Option<Value>) -> (StatusCode, Value) {
    common::call_with(r, method, path, body, &[]).await
}

async fn patch(r: &Router, path: &str, ct: &str, body: Value) -> (StatusCode, Value) {
    common::call_with(r, "PATCH", path, Some(body), &[("content-type", ct)]).await
}

/// A Burstable pod: cpu 100m..500m, memory 64Mi..128Mi.
async fn with_pod(r: &Router, extra: Value) {
    let mut ctr = json!({"name": "app", "image": "busybox",
        "resources": {"requests": {"cpu": "100m", "memory": "64Mi"},
                      "limits": {"cpu": "500m", "memory": "128Mi"}}});
    if let (Some(c), Some(e)) = (ctr.as_object_mut(), extra.as_object()) {
        c.extend(e.clone());
    }
    let pod = json!({"metadata": {"name": "web"}, "spec": {"containers": [ctr]}});
    let (code, body) = call(r, "POST", PODS, Some(pod)).await;
    assert_eq!(code, StatusCode::CREATED, "{body}");
    assert_eq!(body["metadata"]["generation"], 1, "{body}");
}

fn resize_of(resources: Value) -> Value {
    json!({"spec": {"containers": [{"name": "app", "resources": resources}]}})
}

fn causes(body: &Value) -> Vec<(String, String)> {
    body["details"]["causes"]
        .as_array()
        .cloned()
        .unwrap_or_default()
        .iter()
        .map(|c| {
            (
                c["field"].as_str().unwrap_or("").to_string(),
                c["message"].as_str().unwrap_or("").to_string(),
            )
        })
        .collect()
}

#[tokio::test]
async fn kubectl_patch_resizes_cpu_and_memory_through_the_subresource() {
    let (r, _dir) = router().await;
    with_pod(&r, json!({})).await;
    let sub = format!("{PODS}/web/resize");
    let (code, got) = call(&r, "GET", &sub, None).await;
    assert_eq!(code, StatusCode::OK, "{got}");
    assert_eq!(got["kind"], "Pod");

    let (code, out) = patch(
        &r,
        &sub,
        SMP,
        json!({"spec": {"containers": [{"name": "app", "image": "nginx", "resources": {
                   "requests": {"cpu": "200m"}, "limits": {"cpu": "800m", "memory": "256Mi"}}}]},
               // Only resources change through the subresource.
               "metadata": {"labels": {"sneaky": "yes"}},
               "status": {"phase": "Succeeded"}}),
    )
    .await;
    assert_eq!(code, StatusCode::OK, "{out}");
    let res = &out["spec"]["containers"][0]["resources"];
    assert_eq!(res["requests"]["cpu"], "200m");
    assert_eq!(res["requests"]["memory"], "64Mi");
    assert_eq!(res["limits"]["cpu"], "800m");
    assert_eq!(res["limits"]["memory"], "256Mi");
    assert_eq!(out["spec"]["containers"][0]["image"], "busybox", "{out}");
    assert!(out["metadata"]["labels"].get("sneaky").is_none(), "{out}");
    assert_eq!(out["status"]["phase"], "Pending");
    assert_eq!(
        out["metadata"]["generation"], 2,
        "a resize is a spec change"
    );

    // A PUT of the whole pod resizes too.
    let mut pod = out.clone();
    pod["spec"]["containers"][0]["resources"]["requests"]["cpu"] = json!("300m");
    let (code, out) = call(&r, "PUT", &sub, Some(pod)).await;
    assert_eq!(code, StatusCode::OK, "{out}");
    assert_eq!(
        out["spec"]["containers"][0]["resources"]["requests"]["cpu"],
        "300m"
    );
    assert_eq!(out["metadata"]["generation"], 3);

    // An unchanged resize writes nothing and keeps the generation.
    let (code, same) = patch(&r, &sub, SMP, resize_of(json!({}))).await;
    assert_eq!(code, StatusCode::OK, "{same}");
    assert_eq!(same["metadata"]["generation"], 3);
    assert_eq!(
        same["metadata"]["resourceVersion"],
        out["metadata"]["resourceVersion"]
    );
}

#[tokio::test]
async fn a_plain_update_of_the_pod_may_not_change_its_resources() {
    let (r, _dir) = router().await;
    with_pod(&r, json!({})).await;
    let (code, body) = patch(
        &r,
        &format!("{PODS}/web"),
        SMP,
        resize_of(json!({"limits": {"cpu": "800m"}})),
    )
    .await;
    assert_eq!(code, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    let msg = body["message"].as_str().unwrap();
    assert!(
        msg.contains("spec: Forbidden: pod updates may not change fields other than"),
        "{msg}"
    );
}

#[tokio::test]
async fn a_resize_is_refused_with_kubernetes_messages() {
    let (r, _dir) = router().await;
    with_pod(&r, json!({})).await;
    let sub = format!("{PODS}/web/resize");
    let refused = |body: Value| {
        let r = r.clone();
        let sub = sub.clone();
        async move {
            let (code, out) = patch(&r, &sub, SMP, body).await;
            assert_eq!(code, StatusCode::UNPROCESSABLE_ENTITY, "{out}");
            assert_eq!(out["reason"], "Invalid");
            causes(&out)
        }
    };

    // Resources other than cpu and memory.
    let c = refused(resize_of(json!({
        "requests": {"ephemeral-storage": "1Gi"}})))
    .await;
    assert_eq!(
        c,
        [(
            "spec".to_string(),
            "Forbidden: only cpu and memory resources are mutable".to_string()
        )]
    );
    // The QoS class: Burstable may not become Guaranteed.
    let c = refused(resize_of(json!({
        "requests": {"cpu": "500m", "memory": "128Mi"}})))
    .await;
    assert_eq!(
        c,
        [(
            "spec".to_string(),
            "Invalid value: \"Burstable\": Pod QOS Class may not change as a result of resizing"
                .to_string()
        )]
    );
    // Removing a limit. (A request removed where a limit is set comes
    // back defaulted from the limit, as in Kubernetes.)
    let c = refused(json!({"spec": {"containers": [{"name": "app",
        "resources": {"limits": {"cpu": null}}}]}}))
    .await;
    assert!(
        c.contains(&(
            "spec.containers[0].resources.limits".to_string(),
            "Forbidden: resource limits cannot be removed".to_string()
        )),
        "{c:?}"
    );
    // Lowering a memory limit without a RestartContainer policy.
    let c = refused(resize_of(json!({"limits": {"memory": "100Mi"}}))).await;
    assert_eq!(
        c,
        [(
            "spec.containers[0].resources.limits[memory]".to_string(),
            "Forbidden: memory limits cannot be decreased unless resizePolicy is RestartContainer"
                .to_string()
        )]
    );
    // A request above its limit is refused as on create.
    let c = refused(resize_of(json!({"requests": {"cpu": "2"}}))).await;
    assert!(
        c.iter()
            .any(|(f, m)| f == "spec.containers[0].resources.requests"
                && m.contains("must be less than or equal to cpu limit")),
        "{c:?}"
    );
    // Nothing was half-applied.
    let (_, stored) = call(&r, "GET", &format!("{PODS}/web"), None).await;
    assert_eq!(
        stored["spec"]["containers"][0]["resources"]["limits"]["memory"],
        "128Mi"
    );
    assert_eq!(stored["metadata"]["generation"], 1);
}

#[tokio::test]
async fn a_restart_container_policy_allows_lowering_memory() {
    let (r, _dir) = router().await;
    with_pod(
        &r,
        json!({"resizePolicy": [{"resourceName": "memory", "restartPolicy": "RestartContainer"}]}),
    )
    .await;
    let (code, out) = patch(
        &r,
        &format!("{PODS}/web/resize"),
        SMP,
        resize_of(json!({"limits": {"memory": "96Mi"}})),
    )
    .await;
    assert_eq!(code, StatusCode::OK, "{out}");
    assert_eq!(
        out["spec"]["containers"][0]["resources"]["limits"]["memory"],
        "96Mi"
    );
}

#[tokio::test]
async fn resize_policies_are_validated_on_create() {
    let (r, _dir) = router().await;
    let pod = json!({"metadata": {"name": "p"}, "spec": {"restartPolicy": "Never",
        "containers": [{"name": "app", "image": "busybox", "resizePolicy": [
            {"resourceName": "memory", "restartPolicy": "RestartContainer"},
            {"resourceName": "nvidia.com/gpu", "restartPolicy": "NotRequired"}]}]}});
    let (code, body) = call(&r, "POST", PODS, Some(pod)).await;
    assert_eq!(code, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    let c = causes(&body);
    assert!(
        c.contains(&(
            "spec.containers[0].resizePolicy".to_string(),
            "Invalid value: \"RestartContainer\": must be 'NotRequired' when `restartPolicy` is 'Never'"
                .to_string()
        )),
        "{c:?}"
    );
    assert!(
        c.contains(&(
            "spec.containers[0].resizePolicy".to_string(),
            "Unsupported value: \"nvidia.com/gpu\": supported values: \"cpu\", \"memory\""
                .to_string()
        )),
        "{c:?}"
    );
}

#[tokio::test]
async fn a_running_pod_whose_node_reports_no_resources_cannot_be_resized() {
    let (r, _dir) = router().await;
    with_pod(&r, json!({})).await;
    // A node without in-place resize reports running containers without
    // their resources.
    let status = json!({"status": {"phase": "Running", "containerStatuses": [{
        "name": "app", "image": "busybox", "imageID": "", "ready": true, "restartCount": 0,
        "state": {"running": {"startedAt": "2025-01-01T00:00:00Z"}}}]}});
    let (code, body) = patch(
        &r,
        &format!("{PODS}/web/status"),
        "application/merge-patch+json",
        status,
    )
    .await;
    assert_eq!(code, StatusCode::OK, "{body}");
    let (code, body) = patch(
        &r,
        &format!("{PODS}/web/resize"),
        SMP,
        resize_of(json!({"limits": {"cpu": "600m"}})),
    )
    .await;
    assert_eq!(code, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    assert_eq!(
        causes(&body),
        [(
            "spec".to_string(),
            "Forbidden: Pod running on node without support for resize".to_string()
        )]
    );
}

#[tokio::test]
async fn the_resize_subresource_is_served_for_pods_only() {
    let (r, _dir) = router().await;
    let (code, _) = call(
        &r,
        "GET",
        "/api/v1/namespaces/default/configmaps/x/resize",
        None,
    )
    .await;
    assert_eq!(code, StatusCode::NOT_FOUND);
    let (code, body) = call(&r, "GET", "/api/v1", None).await;
    assert_eq!(code, StatusCode::OK);
    let resize = body["resources"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["name"] == "pods/resize")
        .cloned()
        .expect("pods/resize is discovered");
    assert_eq!(resize["verbs"], json!(["get", "patch", "update"]));
}
