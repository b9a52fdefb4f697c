//! ValidatingAdmissionPolicies through the router: a policy and binding
//! deny with their message, parameters come from a ConfigMap the binding
//! names, Warn turns a failure into a warning, broken CEL is refused.

use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use axum::Router;
use http_body_util::BodyExt;
use serde_json::{json, Value};
use skiff_apiserver::ApiServer;
use skiff_store::{RedbStore, Store};
use tower::ServiceExt;

mod common;
use common::call_warnings as call;

const VAP: &str = "/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicies";
const VAPB: &str = "/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicybindings";
const DEPLOY: &str = "/apis/apps/v1/namespaces/default/deployments";

fn deployment(name: &str, replicas: i64) -> Value {
    json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name},
        "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": name}},
            "template": {"metadata": {"labels": {"app": name}},
                "spec": {"containers": [{"name": "c", "image": "busybox"}]}}}})
}

fn policy(name: &str, extra: Value) -> Value {
    let mut spec = json!({
        "failurePolicy": "Fail",
        "matchConstraints": {"resourceRules": [{"apiGroups": ["apps"], "apiVersions": ["v1"],
            "operations": ["CREATE", "UPDATE"], "resources": ["deployments"]}]},
    });
    for (k, v) in extra.as_object().unwrap() {
        spec[k] = v.clone();
    }
    json!({"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicy",
        "metadata": {"name": name}, "spec": spec})
}

fn binding(name: &str, policy: &str, extra: Value) -> Value {
    let mut spec = json!({"policyName": policy, "validationActions": ["Deny"]});
    for (k, v) in extra.as_object().unwrap() {
        spec[k] = v.clone();
    }
    json!({"apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicyBinding", "metadata": {"name": name}, "spec": spec})
}

/// Creates deployments until one is refused (the policy reached the watch
/// cache), bounded.
async fn first_refusal(
    admin: &Router,
    prefix: &str,
    replicas: i64,
) -> (StatusCode, Value, Vec<String>) {
    for i in 0..200 {
        let r = call(
            admin,
            "POST",
            DEPLOY,
            Some(deployment(&format!("{prefix}-{i}"), replicas)),
        )
        .await;
        if r.0 != StatusCode::CREATED {
            return r;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("the policy never applied");
}

#[tokio::test]
async fn a_policy_denies_too_many_replicas_with_its_message() {
    let dir = tempfile::tempdir().unwrap();
    let store: Arc<dyn Store> =
        RedbStore::open(&dir.path().join("s.redb"), Default::default()).unwrap();
    let server = ApiServer::start(store, Default::default()).await.unwrap();
    let admin = server.in_process_router("admin");

    let (s, b, _) = call(
        &admin,
        "POST",
        VAP,
        Some(policy(
            "max-replicas",
            json!({
                "paramKind": {"apiVersion": "v1", "kind": "ConfigMap"},
                "variables": [{"name": "limit", "expression": "int(params.data.max)"}],
                "validations": [{"expression": "object.spec.replicas <= variables.limit",
                    "messageExpression": "'replicas must be at most ' + string(variables.limit)"}],
            }),
        )),
    )
    .await;
    assert_eq!(s, StatusCode::CREATED, "{b}");
    let (s, b, _) = call(
        &admin,
        "POST",
        "/api/v1/namespaces/default/configmaps",
        Some(
            json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "limits"},
            "data": {"max": "3"}}),
        ),
    )
    .await;
    assert_eq!(s, StatusCode::CREATED, "{b}");
    let (s, b, _) = call(
        &admin,
        "POST",
        VAPB,
        Some(binding(
            "max-replicas-binding",
            "max-replicas",
            json!({"paramRef": {"name": "limits", "parameterNotFoundAction": "Deny"}}),
        )),
    )
    .await;
    assert_eq!(s, StatusCode::CREATED, "{b}");

    let (s, b, _) = first_refusal(&admin, "big", 5).await;
    assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY, "{b}");
    assert_eq!(
        b["message"],
        "ValidatingAdmissionPolicy 'max-replicas' with binding 'max-replicas-binding' denied request: replicas must be at most 3"
    );
    let (s, b, _) = call(&admin, "POST", DEPLOY, Some(deployment("small", 2))).await;
    assert_eq!(s, StatusCode::CREATED, "{b}");

    // Without the parameter, Deny refuses everything the policy matches.
    let (s, _, _) = call(
        &admin,
        "DELETE",
        "/api/v1/namespaces/default/configmaps/limits",
        None,
    )
    .await;
    assert_eq!(s, StatusCode::OK);
    let (s, b, _) = first_refusal(&admin, "one", 1).await;
    assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY, "{b}");
    assert!(
        b["message"].as_str().unwrap().contains("no params found"),
        "{b}"
    );
}

#[tokio::test]
async fn warn_turns_a_failure_into_a_warning_and_broken_cel_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let store: Arc<dyn Store> =
        RedbStore::open(&dir.path().join("s.redb"), Default::default()).unwrap();
    let server = ApiServer::start(store, Default::default()).await.unwrap();
    let admin = server.in_process_router("admin");
    let (s, b, _) = call(
        &admin,
        "POST",
        VAP,
        Some(policy(
            "labelled",
            json!({"validations": [{"expression": "has(object.metadata.labels) && 'team' in object.metadata.labels",
                "message": "every deployment needs a team label"}]}),
        )),
    )
    .await;
    assert_eq!(s, StatusCode::CREATED, "{b}");
    let (s, b, _) = call(
        &admin,
        "POST",
        VAPB,
        Some(binding(
            "labelled",
            "labelled",
            json!({"validationActions": ["Warn"]}),
        )),
    )
    .await;
    assert_eq!(s, StatusCode::CREATED, "{b}");
    let mut warned = Vec::new();
    for i in 0..200 {
        let (s, b, w) = call(
            &admin,
            "POST",
            DEPLOY,
            Some(deployment(&format!("w-{i}"), 1)),
        )
        .await;
        assert_eq!(s, StatusCode::CREATED, "{b}");
        if !w.is_empty() {
            warned = w;
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(
        warned.iter().any(|w| w.contains(
            "Validation failed for ValidatingAdmissionPolicy 'labelled' with binding 'labelled': every deployment needs a team label"
        )),
        "{warned:?}"
    );

    let (s, b, _) = call(
        &admin,
        "POST",
        VAP,
        Some(policy(
            "broken",
            json!({"validations": [{"expression": "object.spec.replicas <="}]}),
        )),
    )
    .await;
    assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY, "{b}");
    assert!(
        b["message"]
            .as_str()
            .unwrap()
            .contains("spec.validations[0].expression"),
        "{b}"
    );
    let (s, b, _) = call(
        &admin,
        "POST",
        VAPB,
        Some(binding(
            "both",
            "labelled",
            json!({"validationActions": ["Deny", "Warn"]}),
        )),
    )
    .await;
    assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY, "{b}");
}

#[tokio::test]
async fn the_audit_action_annotates_the_requests_audit_event() {
    let dir = tempfile::tempdir().unwrap();
    let policy_file = dir.path().join("audit-policy.yaml");
    std::fs::write(
        &policy_file,
        "apiVersion: audit.k8s.io/v1\nkind: Policy\nrules:\n- level: Metadata\n",
    )
    .unwrap();
    let log = dir.path().join("audit.log");
    let auditor = skiff_apiserver::audit::Auditor::start(&skiff_apiserver::audit::Options {
        policy_file,
        log_path: log.clone(),
        max_size_mb: 0,
        max_backup: 0,
        max_age_days: 0,
    })
    .unwrap();
    let store: Arc<dyn Store> =
        RedbStore::open(&dir.path().join("s.redb"), Default::default()).unwrap();
    let config = skiff_apiserver::Config {
        audit: Some(auditor),
        ..Default::default()
    };
    let server = ApiServer::start(store, config).await.unwrap();
    let admin = server.in_process_router("admin");
    let (s, b, _) = call(
        &admin,
        "POST",
        VAP,
        Some(policy(
            "audited",
            json!({"validations": [{"expression": "object.spec.replicas < 2", "message": "big"}]}),
        )),
    )
    .await;
    assert_eq!(s, StatusCode::CREATED, "{b}");
    let (s, b, _) = call(
        &admin,
        "POST",
        VAPB,
        Some(binding(
            "audited",
            "audited",
            json!({"validationActions": ["Audit"]}),
        )),
    )
    .await;
    assert_eq!(s, StatusCode::CREATED, "{b}");
    for i in 0..200 {
        let (s, b, _) = call(
            &admin,
            "POST",
            DEPLOY,
            Some(deployment(&format!("a-{i}"), 3)),
        )
        .await;
        assert_eq!(s, StatusCode::CREATED, "{b}");
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        let annotated = text.lines().any(|l| {
            l.contains("validation.policy.admission.k8s.io/validation_failure")
                && l.contains("ResponseComplete")
        });
        if annotated {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("no audit event carried the policy's annotation");
}

#[tokio::test]
async fn scale_updates_are_admitted_as_the_scale_subresource() {
    let dir = tempfile::tempdir().unwrap();
    let store: Arc<dyn Store> =
        RedbStore::open(&dir.path().join("s.redb"), Default::default()).unwrap();
    let server = ApiServer::start(store, Default::default()).await.unwrap();
    let admin = server.in_process_router("admin");
    // A policy on the scale subresource: its object is the Scale.
    let mut p = policy(
        "scale-limit",
        json!({"validations": [{"expression": "object.kind == 'Scale' && object.spec.replicas <= 3",
            "message": "scale to at most 3"}]}),
    );
    p["spec"]["matchConstraints"]["resourceRules"][0]["resources"] = json!(["deployments/scale"]);
    p["spec"]["matchConstraints"]["resourceRules"][0]["operations"] = json!(["UPDATE"]);
    let (s, b, _) = call(&admin, "POST", VAP, Some(p)).await;
    assert_eq!(s, StatusCode::CREATED, "{b}");
    let (s, b, _) = call(
        &admin,
        "POST",
        VAPB,
        Some(binding("scale-limit", "scale-limit", json!({}))),
    )
    .await;
    assert_eq!(s, StatusCode::CREATED, "{b}");
    let (s, b, _) = call(&admin, "POST", DEPLOY, Some(deployment("web", 5))).await;
    assert_eq!(s, StatusCode::CREATED, "creating is not scaling: {b}");
    let path = format!("{DEPLOY}/web/scale");
    let scale = |n: i64| {
        let admin = admin.clone();
        let path = path.clone();
        async move {
            let req = Request::builder()
                .method("PATCH")
                .uri(path)
                .header("content-type", "application/merge-patch+json")
                .body(Body::from(json!({"spec": {"replicas": n}}).to_string()))
                .unwrap();
            let resp = admin.oneshot(req).await.unwrap();
            let status = resp.status();
            let bytes = resp.into_body().collect().await.unwrap().to_bytes();
            (
                status,
                serde_json::from_slice::<Value>(&bytes).unwrap_or(Value::Null),
            )
        }
    };
    let mut refused = None;
    for _ in 0..200 {
        let (s, b) = scale(6).await;
        if s != StatusCode::OK {
            refused = Some((s, b));
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let (s, b) = refused.expect("the scale policy never applied");
    assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY, "{b}");
    assert!(
        b["message"]
            .as_str()
            .unwrap()
            .ends_with("scale to at most 3"),
        "{b}"
    );
    let (s, b) = scale(2).await;
    assert_eq!(s, StatusCode::OK, "{b}");
    assert_eq!(b["spec"]["replicas"], 2);
}

/// A binding whose matchResources has only a namespaceSelector applies to
/// everything its policy matches in the selected namespaces (an unset
/// resourceRules does not constrain), and reads back with Kubernetes'
/// defaults.
#[tokio::test]
async fn a_binding_with_only_a_namespace_selector_applies_in_the_selected_namespaces() {
    let dir = tempfile::tempdir().unwrap();
    let store: Arc<dyn Store> =
        RedbStore::open(&dir.path().join("s.redb"), Default::default()).unwrap();
    let server = ApiServer::start(store, Default::default()).await.unwrap();
    let admin = server.in_process_router("admin");
    for (ns, labels) in [("prod", json!({"env": "prod"})), ("dev", json!({}))] {
        let (s, b, _) = call(
            &admin,
            "POST",
            "/api/v1/namespaces",
            Some(json!({"apiVersion": "v1", "kind": "Namespace",
                "metadata": {"name": ns, "labels": labels}})),
        )
        .await;
        assert_eq!(s, StatusCode::CREATED, "{b}");
    }
    let (s, b, _) = call(
        &admin,
        "POST",
        VAP,
        Some(policy(
            "max-replicas",
            json!({"validations": [{"expression": "object.spec.replicas <= 3",
                "message": "at most 3"}]}),
        )),
    )
    .await;
    assert_eq!(s, StatusCode::CREATED, "{b}");
    let (s, b, _) = call(
        &admin,
        "POST",
        VAPB,
        Some(binding(
            "prod-only",
            "max-replicas",
            json!({"matchResources": {"namespaceSelector": {"matchLabels": {"env": "prod"}}}}),
        )),
    )
    .await;
    assert_eq!(s, StatusCode::CREATED, "{b}");
    assert_eq!(
        b["spec"]["matchResources"],
        json!({"namespaceSelector": {"matchLabels": {"env": "prod"}},
            "matchPolicy": "Equivalent", "objectSelector": {}})
    );

    let mut refused = None;
    for i in 0..200 {
        let r = call(
            &admin,
            "POST",
            "/apis/apps/v1/namespaces/prod/deployments",
            Some(deployment(&format!("big-{i}"), 5)),
        )
        .await;
        if r.0 != StatusCode::CREATED {
            refused = Some(r);
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let (s, b, _) = refused.expect("the binding never applied in the selected namespace");
    assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY, "{b}");
    assert_eq!(
        b["message"],
        "ValidatingAdmissionPolicy 'max-replicas' with binding 'prod-only' denied request: at most 3"
    );
    // Another namespace is not selected.
    let (s, b, _) = call(
        &admin,
        "POST",
        "/apis/apps/v1/namespaces/dev/deployments",
        Some(deployment("big", 5)),
    )
    .await;
    assert_eq!(s, StatusCode::CREATED, "{b}");
}
