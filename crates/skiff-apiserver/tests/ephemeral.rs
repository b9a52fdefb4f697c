//! `pods/<name>/ephemeralcontainers` as `kubectl debug` and client
//! libraries use it: GET answers the pod, PATCH (strategic merge, as
//! kubectl sends it) and PUT add ephemeral containers, and Kubernetes'
//! validation refuses everything else with a 422 `Status` naming the field.

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

async fn call(r: &Router, method: &str, path: &str, body: Option<Value>) -> (StatusCode, Value) {
    common::call_with(r, method, path, body, &[]).await
}

async fn patch(r: &Router, path: &str, ct: &str, body: Value) -> (StatusCode, Value) {
    common::call_with(r, "PATCH", path, Some(body), &[("content-type", ct)]).await
}

async fn with_pod(r: &Router) {
    let pod = json!({"metadata": {"name": "web"}, "spec": {
        "initContainers": [{"name": "init", "image": "busybox"}],
        "containers": [{"name": "app", "image": "busybox"}]}});
    let (code, body) = call(r, "POST", PODS, Some(pod)).await;
    assert_eq!(code, StatusCode::CREATED, "{body}");
}

fn causes(body: &Value) -> Vec<(String, String, String)> {
    body["details"]["causes"]
        .as_array()
        .cloned()
        .unwrap_or_default()
        .iter()
        .map(|c| {
            (
                c["reason"].as_str().unwrap_or("").to_string(),
                c["field"].as_str().unwrap_or("").to_string(),
                c["message"].as_str().unwrap_or("").to_string(),
            )
        })
        .collect()
}

#[tokio::test]
async fn kubectl_debug_adds_an_ephemeral_container_through_the_subresource() {
    let (r, _dir) = router().await;
    with_pod(&r).await;
    let sub = format!("{PODS}/web/ephemeralcontainers");
    let (code, got) = call(&r, "GET", &sub, None).await;
    assert_eq!(code, StatusCode::OK, "{got}");
    assert_eq!(got["kind"], "Pod");
    assert_eq!(got["metadata"]["name"], "web");

    // What `kubectl debug -it web --image=busybox --target=app` sends.
    let debugger = json!({"name": "debugger-x", "image": "busybox", "stdin": true, "tty": true,
        "targetContainerName": "app", "terminationMessagePolicy": "File",
        "imagePullPolicy": "IfNotPresent", "resources": {}});
    let (code, out) = patch(
        &r,
        &sub,
        "application/strategic-merge-patch+json",
        json!({"spec": {"ephemeralContainers": [debugger]},
               // Only spec.ephemeralContainers changes through the subresource.
               "metadata": {"labels": {"sneaky": "yes"}},
               "status": {"phase": "Succeeded"}}),
    )
    .await;
    assert_eq!(code, StatusCode::OK, "{out}");
    assert_eq!(out["spec"]["ephemeralContainers"][0]["name"], "debugger-x");
    assert_eq!(
        out["spec"]["ephemeralContainers"][0]["targetContainerName"],
        "app"
    );
    assert_eq!(
        out["spec"]["ephemeralContainers"][0]["terminationMessagePath"], "/dev/termination-log",
        "ephemeral containers get a container's defaults"
    );
    assert!(out["metadata"]["labels"].get("sneaky").is_none(), "{out}");
    assert_eq!(out["status"]["phase"], "Pending");
    let (_, stored) = call(&r, "GET", &format!("{PODS}/web"), None).await;
    assert_eq!(
        stored["spec"]["ephemeralContainers"],
        out["spec"]["ephemeralContainers"]
    );

    // A PUT of the pod with one more entry adds it too.
    let mut pod = stored.clone();
    pod["spec"]["ephemeralContainers"]
        .as_array_mut()
        .unwrap()
        .push(json!({"name": "second", "image": "busybox"}));
    let (code, out) = call(&r, "PUT", &sub, Some(pod)).await;
    assert_eq!(code, StatusCode::OK, "{out}");
    assert_eq!(out["spec"]["ephemeralContainers"][1]["name"], "second");
}

#[tokio::test]
async fn ephemeral_containers_are_only_added_never_changed_or_removed() {
    let (r, _dir) = router().await;
    with_pod(&r).await;
    let sub = format!("{PODS}/web/ephemeralcontainers");
    let (code, _) = patch(
        &r,
        &sub,
        "application/strategic-merge-patch+json",
        json!({"spec": {"ephemeralContainers": [{"name": "dbg", "image": "busybox"}]}}),
    )
    .await;
    assert_eq!(code, StatusCode::OK);

    // Changed (a JSON patch on its image).
    let (code, body) = patch(
        &r,
        &sub,
        "application/json-patch+json",
        json!([{"op": "replace", "path": "/spec/ephemeralContainers/0/image", "value": "other"}]),
    )
    .await;
    assert_eq!(code, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    assert_eq!(body["reason"], "Invalid");
    let c = causes(&body);
    assert_eq!(c[0].0, "FieldValueForbidden", "{c:?}");
    assert_eq!(c[0].1, "spec.ephemeralContainers[dbg]");
    assert!(
        c[0].2
            .contains("existing ephemeral containers \"dbg\" may not be changed"),
        "{c:?}"
    );

    // Removed.
    let (code, body) = patch(
        &r,
        &sub,
        "application/merge-patch+json",
        json!({"spec": {"ephemeralContainers": null}}),
    )
    .await;
    assert_eq!(code, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    let c = causes(&body);
    assert_eq!(c[0].1, "spec.ephemeralContainers", "{c:?}");
    assert!(c[0].2.contains("may not be removed"), "{c:?}");

    // The pod's own update may not touch them at all.
    let (_, mut pod) = call(&r, "GET", &format!("{PODS}/web"), None).await;
    pod["spec"]["ephemeralContainers"]
        .as_array_mut()
        .unwrap()
        .push(json!({"name": "more", "image": "busybox"}));
    let (code, body) = call(&r, "PUT", &format!("{PODS}/web"), Some(pod)).await;
    assert_eq!(code, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    assert_eq!(causes(&body)[0].1, "spec");

    // Nor may a pod be created with them.
    let pod = json!({"metadata": {"name": "born-with"}, "spec": {
        "containers": [{"name": "app", "image": "busybox"}],
        "ephemeralContainers": [{"name": "dbg", "image": "busybox"}]}});
    let (code, body) = call(&r, "POST", PODS, Some(pod)).await;
    assert_eq!(code, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    assert_eq!(
        causes(&body),
        [(
            "FieldValueForbidden".to_string(),
            "spec.ephemeralContainers".to_string(),
            "Forbidden: cannot be set on create".to_string()
        )]
    );
}

#[tokio::test]
async fn an_ephemeral_container_is_validated_as_kubernetes_does() {
    let (r, _dir) = router().await;
    with_pod(&r).await;
    let sub = format!("{PODS}/web/ephemeralcontainers");
    let add = |c: Value| json!({"spec": {"ephemeralContainers": [c]}});
    let bad = add(json!({
        "name": "app", "image": "busybox",
        "ports": [{"containerPort": 80}],
        "resources": {"limits": {"cpu": "1"}},
        "readinessProbe": {"exec": {"command": ["true"]}},
        "lifecycle": {"postStart": {"exec": {"command": ["true"]}}},
        "targetContainerName": "nope"}));
    let (code, body) = patch(&r, &sub, "application/strategic-merge-patch+json", bad).await;
    assert_eq!(code, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    let mut fields: Vec<(String, String)> = causes(&body)
        .into_iter()
        .map(|(reason, field, _)| (reason, field))
        .collect();
    fields.sort();
    let p = "spec.ephemeralContainers[0]";
    let mut want = vec![
        ("FieldValueDuplicate".to_string(), format!("{p}.name")),
        ("FieldValueForbidden".to_string(), format!("{p}.ports")),
        ("FieldValueForbidden".to_string(), format!("{p}.resources")),
        (
            "FieldValueForbidden".to_string(),
            format!("{p}.readinessProbe"),
        ),
        ("FieldValueForbidden".to_string(), format!("{p}.lifecycle")),
        (
            "FieldValueNotFound".to_string(),
            format!("{p}.targetContainerName"),
        ),
    ];
    want.sort();
    assert_eq!(fields, want, "{body}");
    let msg = body["message"].as_str().unwrap_or("");
    assert!(
        msg.contains("cannot be set for an Ephemeral Container"),
        "{msg}"
    );

    // A name shared with an init container is a duplicate too; a target
    // that is an init container is a container of the pod.
    let (code, body) = patch(
        &r,
        &sub,
        "application/strategic-merge-patch+json",
        add(json!({"name": "init", "image": "busybox", "targetContainerName": "init"})),
    )
    .await;
    assert_eq!(code, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    assert_eq!(
        causes(&body).into_iter().map(|c| c.1).collect::<Vec<_>>(),
        [format!("{p}.name")]
    );

    // Other resources have no such subresource; other methods are refused.
    let (code, _) = call(&r, "POST", &sub, Some(json!({"metadata": {"name": "web"}}))).await;
    assert_eq!(code, StatusCode::METHOD_NOT_ALLOWED);
    let (code, _) = call(
        &r,
        "GET",
        "/api/v1/namespaces/default/configmaps/x/ephemeralcontainers",
        None,
    )
    .await;
    assert_eq!(code, StatusCode::NOT_FOUND);
}
