//! Admission webhooks through the router: a webhook server written for the
//! test (HTTPS on a free loopback port, its certificate from a CA made in
//! the test) registered by `url` and by `service`; mutation by JSONPatch,
//! denials with their message, warnings, failurePolicy, timeouts, dry runs
//! and the resources webhooks never apply to.

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::http::StatusCode;
use axum::Router;
use base64::Engine;
use serde_json::{json, Value};
use skiff_apiserver::ApiServer;
use skiff_store::{RedbStore, Store};

use skiff_apiserver::testing::{self, add_label, admission_handler, TestServer};

mod common;
use common::call_warnings as call;

async fn hook_server(
    sans: &[&str],
    delay: Duration,
    decide: impl Fn(&Value) -> Value + Send + Sync + 'static,
) -> TestServer {
    testing::serve("127.0.0.1:0", sans, None, delay, admission_handler(decide)).await
}

/// The AdmissionReviews a hook server received.
fn reviews(h: &TestServer) -> Vec<Value> {
    h.requests()
        .iter()
        .map(|s| serde_json::from_slice(&s.body).unwrap())
        .collect()
}

/// Adds the label `hooked=yes`, allows and warns.
fn labeler(req: &Value) -> Value {
    let mut out = add_label(req, "hooked", "yes");
    out["warnings"] = json!(["seen by the test webhook"]);
    out
}

/// Denies ConfigMaps with a `bad` key (in the new object).
fn denier(req: &Value) -> Value {
    if req["object"]["data"].get("bad").is_some() {
        return json!({"allowed": false,
            "status": {"code": 403, "message": "bad data is not welcome here"}});
    }
    json!({"allowed": true})
}

fn client_config_url(h: &TestServer, path: &str) -> Value {
    json!({"url": format!("https://{}{path}", h.addr), "caBundle": h.ca_bundle()})
}

fn configmap_rule() -> Value {
    json!([{"operations": ["CREATE", "UPDATE", "DELETE"], "apiGroups": [""], "apiVersions": ["v1"],
        "resources": ["configmaps"]}])
}

fn webhook_configuration(kind: &str, name: &str, hooks: Vec<Value>) -> Value {
    json!({"apiVersion": "admissionregistration.k8s.io/v1", "kind": kind,
        "metadata": {"name": name}, "webhooks": hooks})
}

fn webhook(name: &str, client: Value, extra: Value) -> Value {
    let mut h = json!({"name": name, "clientConfig": client, "rules": configmap_rule(),
        "admissionReviewVersions": ["v1"], "sideEffects": "None", "timeoutSeconds": 5});
    for (k, v) in extra.as_object().unwrap() {
        h[k] = v.clone();
    }
    h
}

struct Cluster {
    server: ApiServer,
    admin: Router,
    _dir: tempfile::TempDir,
}

async fn cluster() -> Cluster {
    let dir = tempfile::tempdir().unwrap();
    let store: Arc<dyn Store> =
        RedbStore::open(&dir.path().join("s.redb"), Default::default()).unwrap();
    let server = ApiServer::start(store, Default::default()).await.unwrap();
    let admin = server.in_process_router("admin");
    Cluster {
        server,
        admin,
        _dir: dir,
    }
}

const CM: &str = "/api/v1/namespaces/default/configmaps";
const MWC: &str = "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations";
const VWC: &str = "/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations";

fn cm(name: &str, data: Value) -> Value {
    json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}, "data": data})
}

impl Cluster {
    async fn create(&self, path: &str, v: Value) {
        let (s, b, _) = call(&self.admin, "POST", path, Some(v)).await;
        assert_eq!(s, StatusCode::CREATED, "{b}");
    }

    /// Waits (bounded) until the watch cache holds `n` configurations of
    /// each kind: the dispatcher reads them from there.
    async fn wait_configurations(&self, mutating: usize, validating: usize) {
        for _ in 0..200 {
            let m = skiff_apiserver::webhook::config::webhooks(&*self.server.state.registry, true);
            let v = skiff_apiserver::webhook::config::webhooks(&*self.server.state.registry, false);
            if m.len() == mutating && v.len() == validating {
                return;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        panic!("the webhook configurations never reached the watch cache");
    }
}

#[tokio::test]
async fn a_url_webhook_mutates_denies_and_warns() {
    let c = cluster().await;
    let labels = hook_server(&["127.0.0.1"], Duration::ZERO, labeler).await;
    let hook = hook_server(&["127.0.0.1"], Duration::ZERO, denier).await;
    c.create(
        MWC,
        webhook_configuration(
            "MutatingWebhookConfiguration",
            "labeler",
            vec![webhook(
                "label.example.com",
                client_config_url(&labels, "/mutate"),
                json!({}),
            )],
        ),
    )
    .await;
    c.create(
        VWC,
        webhook_configuration(
            "ValidatingWebhookConfiguration",
            "denier",
            vec![webhook(
                "deny.example.com",
                client_config_url(&hook, "/validate"),
                json!({}),
            )],
        ),
    )
    .await;
    c.wait_configurations(1, 1).await;

    let (s, b, warnings) = call(&c.admin, "POST", CM, Some(cm("good", json!({"a": "1"})))).await;
    assert_eq!(s, StatusCode::CREATED, "{b}");
    assert_eq!(b["metadata"]["labels"]["hooked"], "yes", "{b}");
    assert!(
        warnings
            .iter()
            .any(|w| w.contains("seen by the test webhook")),
        "{warnings:?}"
    );
    let (_, stored, _) = call(&c.admin, "GET", &format!("{CM}/good"), None).await;
    assert_eq!(stored["metadata"]["labels"]["hooked"], "yes");

    let (s, b, _) = call(&c.admin, "POST", CM, Some(cm("evil", json!({"bad": "1"})))).await;
    assert_eq!(s, StatusCode::FORBIDDEN, "{b}");
    assert_eq!(
        b["message"],
        "admission webhook \"deny.example.com\" denied the request: bad data is not welcome here"
    );
    let (s, _, _) = call(&c.admin, "GET", &format!("{CM}/evil"), None).await;
    assert_eq!(s, StatusCode::NOT_FOUND);

    // An update that brings the bad key is denied too, and the review
    // carries the old object, the operation and the user.
    let mut upd = stored.clone();
    upd["data"]["bad"] = json!("x");
    let (s, _, _) = call(&c.admin, "PUT", &format!("{CM}/good"), Some(upd)).await;
    assert_eq!(s, StatusCode::FORBIDDEN);
    let seen = reviews(&hook);
    let update = seen
        .iter()
        .find(|r| r["request"]["operation"] == "UPDATE")
        .expect("an UPDATE review");
    let r = &update["request"];
    assert_eq!(update["apiVersion"], "admission.k8s.io/v1");
    assert_eq!(
        r["kind"],
        json!({"group": "", "version": "v1", "kind": "ConfigMap"})
    );
    assert_eq!(
        r["resource"],
        json!({"group": "", "version": "v1", "resource": "configmaps"})
    );
    assert_eq!(r["namespace"], "default");
    assert_eq!(r["name"], "good");
    assert_eq!(r["userInfo"]["username"], "system:admin");
    assert_eq!(r["oldObject"]["data"], json!({"a": "1"}));
    assert_eq!(r["options"]["kind"], "UpdateOptions");
    assert_eq!(r["dryRun"], false);

    // Deletes are validated with the object as oldObject.
    let (s, _, _) = call(&c.admin, "DELETE", &format!("{CM}/good"), None).await;
    assert_eq!(s, StatusCode::OK);
    let seen = reviews(&hook);
    let delete = seen
        .iter()
        .find(|r| r["request"]["operation"] == "DELETE")
        .expect("a DELETE review");
    assert_eq!(delete["request"]["oldObject"]["metadata"]["name"], "good");
    assert_eq!(delete["request"]["object"], Value::Null);
}

#[tokio::test]
async fn a_service_webhook_is_reached_through_the_services_endpoints() {
    let c = cluster().await;
    let hook = hook_server(&["hook.default.svc"], Duration::ZERO, labeler).await;
    c.create(
        "/api/v1/namespaces/default/services",
        json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "hook"},
            "spec": {"ports": [{"name": "https", "port": 443, "targetPort": hook.addr.port()}]}}),
    )
    .await;
    c.create(
        "/api/v1/namespaces/default/endpoints",
        json!({"apiVersion": "v1", "kind": "Endpoints", "metadata": {"name": "hook"},
            "subsets": [{"addresses": [{"ip": "127.0.0.1"}],
                "ports": [{"name": "https", "port": hook.addr.port()}]}]}),
    )
    .await;
    let client = json!({"service": {"namespace": "default", "name": "hook", "path": "/mutate"},
        "caBundle": hook.ca_bundle()});
    c.create(
        MWC,
        webhook_configuration(
            "MutatingWebhookConfiguration",
            "labeler",
            vec![webhook("label.example.com", client, json!({}))],
        ),
    )
    .await;
    c.wait_configurations(1, 0).await;
    // The Endpoints may reach the cache just after the configuration.
    let mut last = Value::Null;
    for i in 0..100 {
        let (s, b, _) = call(
            &c.admin,
            "POST",
            CM,
            Some(cm(&format!("svc{i}"), json!({}))),
        )
        .await;
        assert_eq!(s, StatusCode::CREATED, "{b}");
        if b["metadata"]["labels"]["hooked"] == "yes" {
            return;
        }
        last = b;
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("never mutated through the service: {last}");
}

#[tokio::test]
async fn failure_policy_decides_when_the_webhook_is_down_and_timeouts_bound_the_wait() {
    let c = cluster().await;
    let down = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap()
    };
    let ca = testing::test_ca();
    let client = json!({"url": format!("https://{down}/validate"),
        "caBundle": base64::engine::general_purpose::STANDARD.encode(&ca.cert_pem)});
    c.create(
        VWC,
        webhook_configuration(
            "ValidatingWebhookConfiguration",
            "ignored",
            vec![webhook(
                "ignore.example.com",
                client.clone(),
                json!({"failurePolicy": "Ignore"}),
            )],
        ),
    )
    .await;
    c.wait_configurations(0, 1).await;
    let (s, b, _) = call(&c.admin, "POST", CM, Some(cm("a", json!({})))).await;
    assert_eq!(
        s,
        StatusCode::CREATED,
        "failurePolicy Ignore lets it through: {b}"
    );

    c.create(
        VWC,
        webhook_configuration(
            "ValidatingWebhookConfiguration",
            "strict",
            vec![webhook(
                "fail.example.com",
                client,
                json!({"failurePolicy": "Fail"}),
            )],
        ),
    )
    .await;
    c.wait_configurations(0, 2).await;
    let (s, b, _) = call(&c.admin, "POST", CM, Some(cm("b", json!({})))).await;
    assert_eq!(s, StatusCode::INTERNAL_SERVER_ERROR, "{b}");
    let m = b["message"].as_str().unwrap();
    assert!(
        m.starts_with("Internal error occurred: failed calling webhook \"fail.example.com\": failed to call webhook: Post"),
        "{m}"
    );

    // A broken webhook never locks its own configuration in.
    let (s, b, _) = call(&c.admin, "DELETE", &format!("{VWC}/strict"), None).await;
    assert_eq!(s, StatusCode::OK, "{b}");
    c.wait_configurations(0, 1).await;

    // A webhook that does not answer costs its timeout, not more.
    let slow = hook_server(&["127.0.0.1"], Duration::from_secs(20), labeler).await;
    c.create(
        VWC,
        webhook_configuration(
            "ValidatingWebhookConfiguration",
            "slow",
            vec![webhook(
                "slow.example.com",
                client_config_url(&slow, "/validate"),
                json!({"timeoutSeconds": 1}),
            )],
        ),
    )
    .await;
    c.wait_configurations(0, 2).await;
    let started = Instant::now();
    let (s, b, _) = call(&c.admin, "POST", CM, Some(cm("c", json!({})))).await;
    assert_eq!(s, StatusCode::INTERNAL_SERVER_ERROR, "{b}");
    assert!(
        b["message"].as_str().unwrap().contains("deadline exceeded"),
        "{b}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
}

#[tokio::test]
async fn dry_runs_reach_only_webhooks_without_side_effects() {
    let c = cluster().await;
    let hook = hook_server(&["127.0.0.1"], Duration::ZERO, labeler).await;
    c.create(
        MWC,
        webhook_configuration(
            "MutatingWebhookConfiguration",
            "labeler",
            vec![webhook(
                "label.example.com",
                client_config_url(&hook, "/mutate"),
                json!({}),
            )],
        ),
    )
    .await;
    c.wait_configurations(1, 0).await;
    let (s, b, _) = call(
        &c.admin,
        "POST",
        &format!("{CM}?dryRun=All"),
        Some(cm("d", json!({}))),
    )
    .await;
    assert_eq!(s, StatusCode::CREATED, "{b}");
    assert_eq!(b["metadata"]["labels"]["hooked"], "yes");
    let seen = reviews(&hook);
    assert_eq!(seen.last().unwrap()["request"]["dryRun"], true);
    let (s, _, _) = call(&c.admin, "GET", &format!("{CM}/d"), None).await;
    assert_eq!(s, StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn invalid_configurations_are_refused_with_kubernetes_reasons() {
    let c = cluster().await;
    let mut bad = webhook(
        "short",
        json!({"url": "http://127.0.0.1/"}),
        json!({"timeoutSeconds": 60}),
    );
    bad.as_object_mut().unwrap().remove("sideEffects");
    let (s, b, _) = call(
        &c.admin,
        "POST",
        VWC,
        Some(webhook_configuration(
            "ValidatingWebhookConfiguration",
            "bad",
            vec![bad],
        )),
    )
    .await;
    assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY, "{b}");
    let fields: Vec<&str> = b["details"]["causes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["field"].as_str().unwrap())
        .collect();
    for f in [
        "webhooks[0].name",
        "webhooks[0].sideEffects",
        "webhooks[0].timeoutSeconds",
        "webhooks[0].clientConfig.url",
    ] {
        assert!(fields.contains(&f), "{f} not in {fields:?}");
    }
}

#[tokio::test]
async fn match_conditions_decide_which_requests_reach_the_webhook() {
    let c = cluster().await;
    let hook = hook_server(&["127.0.0.1"], Duration::ZERO, labeler).await;
    c.create(
        MWC,
        webhook_configuration(
            "MutatingWebhookConfiguration",
            "labeler",
            vec![webhook(
                "label.example.com",
                client_config_url(&hook, "/mutate"),
                json!({"matchConditions": [
                    {"name": "prefixed", "expression": "object.metadata.name.startsWith('hook-')"},
                    {"name": "by-admin", "expression": "request.userInfo.username == 'system:admin'"},
                ]}),
            )],
        ),
    )
    .await;
    c.wait_configurations(1, 0).await;
    let (s, b, _) = call(&c.admin, "POST", CM, Some(cm("hook-a", json!({})))).await;
    assert_eq!(s, StatusCode::CREATED, "{b}");
    assert_eq!(b["metadata"]["labels"]["hooked"], "yes", "{b}");
    let (s, b, _) = call(&c.admin, "POST", CM, Some(cm("other", json!({})))).await;
    assert_eq!(s, StatusCode::CREATED, "{b}");
    assert!(b["metadata"].get("labels").is_none(), "{b}");
    assert_eq!(reviews(&hook).len(), 1);

    let (s, b, _) = call(
        &c.admin,
        "POST",
        VWC,
        Some(webhook_configuration(
            "ValidatingWebhookConfiguration",
            "broken-cel",
            vec![webhook(
                "cel.example.com",
                client_config_url(&hook, "/validate"),
                json!({"matchConditions": [{"name": "bad", "expression": "object.metadata.name ==="}]}),
            )],
        )),
    )
    .await;
    assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY, "{b}");
    assert!(
        b["message"]
            .as_str()
            .unwrap()
            .contains("webhooks[0].matchConditions[0].expression"),
        "{b}"
    );
}

#[tokio::test]
async fn exec_is_admitted_as_a_connect_with_its_options() {
    let c = cluster().await;
    let hook = hook_server(&["127.0.0.1"], Duration::ZERO, |req: &Value| {
        if req["operation"] == "CONNECT" {
            return json!({"allowed": false, "status": {"code": 403, "message": "no exec here"}});
        }
        json!({"allowed": true})
    })
    .await;
    let mut h = webhook(
        "exec.example.com",
        client_config_url(&hook, "/validate"),
        json!({}),
    );
    h["rules"] = json!([{"operations": ["CONNECT"], "apiGroups": [""], "apiVersions": ["v1"],
        "resources": ["pods/exec"]}]);
    c.create(
        VWC,
        webhook_configuration("ValidatingWebhookConfiguration", "no-exec", vec![h]),
    )
    .await;
    c.wait_configurations(0, 1).await;
    let (s, b, _) = call(
        &c.admin,
        "POST",
        "/api/v1/namespaces/default/pods/web/exec?command=sh&command=-c&stdout=true",
        None,
    )
    .await;
    assert_eq!(s, StatusCode::FORBIDDEN, "{b}");
    assert_eq!(
        b["message"],
        "admission webhook \"exec.example.com\" denied the request: no exec here"
    );
    let r = &reviews(&hook)[0]["request"];
    assert_eq!(r["operation"], "CONNECT");
    assert_eq!(r["subResource"], "exec");
    assert_eq!(r["kind"]["kind"], "PodExecOptions");
    assert_eq!(r["object"]["command"], json!(["sh", "-c"]));
    assert_eq!(r["name"], "web");
}

#[tokio::test]
async fn match_policy_equivalent_sends_the_matched_version_and_the_requested_one() {
    let c = cluster().await;
    let hook = hook_server(
        &["127.0.0.1"],
        Duration::ZERO,
        |_: &Value| json!({"allowed": true}),
    )
    .await;
    let mut h = webhook(
        "hpa.example.com",
        client_config_url(&hook, "/validate"),
        json!({}),
    );
    h["rules"] = json!([{"operations": ["CREATE"], "apiGroups": ["autoscaling"],
        "apiVersions": ["v2"], "resources": ["horizontalpodautoscalers"]}]);
    let mut exact = webhook(
        "exact.example.com",
        client_config_url(&hook, "/exact"),
        json!({"matchPolicy": "Exact"}),
    );
    exact["rules"] = h["rules"].clone();
    c.create(
        VWC,
        webhook_configuration("ValidatingWebhookConfiguration", "hpa", vec![h, exact]),
    )
    .await;
    c.wait_configurations(0, 2).await;
    let (s, b, _) = call(
        &c.admin,
        "POST",
        "/apis/autoscaling/v1/namespaces/default/horizontalpodautoscalers",
        Some(json!({"apiVersion": "autoscaling/v1", "kind": "HorizontalPodAutoscaler",
            "metadata": {"name": "web"},
            "spec": {"scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "web"},
                "maxReplicas": 3, "targetCPUUtilizationPercentage": 50}})),
    )
    .await;
    assert_eq!(s, StatusCode::CREATED, "{b}");
    let seen = hook.requests();
    // Only the Equivalent webhook: the request was for v1.
    assert_eq!(
        seen.len(),
        1,
        "{:?}",
        seen.iter().map(|s| &s.path).collect::<Vec<_>>()
    );
    let r = &reviews(&hook)[0]["request"];
    assert_eq!(r["kind"]["version"], "v2");
    assert_eq!(r["requestKind"]["version"], "v1");
    assert_eq!(r["requestResource"]["version"], "v1");
    assert_eq!(r["object"]["apiVersion"], "autoscaling/v2");
    assert!(r["object"]["spec"]["metrics"].is_array(), "{r}");
}
