//! API aggregation through the router: an aggregated API server written
//! for the test (HTTPS, requiring the front-proxy client certificate)
//! behind a Service whose Endpoints point at it, registered by an
//! APIService; requests are proxied with the user's identity in the
//! front-proxy headers, discovery lists the group, and the APIService
//! becomes Available.

use std::sync::Arc;
use std::time::Duration;

use axum::http::StatusCode;
use serde_json::{json, Value};
use skiff_apiserver::auth::Identity;
use skiff_apiserver::testing::{self, Seen};
use skiff_apiserver::ApiServer;
use skiff_store::{RedbStore, Store};

mod common;
use common::call_with;

/// The aggregated server: one group/version with one resource.
fn widgets(s: &Seen) -> (u16, Value) {
    if s.client.as_ref().map(|c| c.0.as_str()) != Some("front-proxy-client") {
        return (401, json!({"kind": "Status", "code": 401}));
    }
    match s.path.split('?').next().unwrap() {
        "/apis/example.com/v1" => (
            200,
            json!({"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": "example.com/v1",
                "resources": [{"name": "widgets", "singularName": "widget", "namespaced": true,
                    "kind": "Widget", "verbs": ["get", "list"]}]}),
        ),
        "/apis/example.com/v1/namespaces/default/widgets" => {
            let user = s
                .headers
                .get("x-remote-user")
                .and_then(|v| v.to_str().ok())
                .unwrap_or("");
            (
                200,
                json!({"kind": "WidgetList", "apiVersion": "example.com/v1", "metadata": {},
                    "items": [{"metadata": {"name": format!("for-{user}")}}]}),
            )
        }
        _ => (404, json!({"kind": "Status", "code": 404})),
    }
}

#[tokio::test]
async fn an_aggregated_api_is_proxied_discovered_and_available() {
    let dir = tempfile::tempdir().unwrap();
    let store: Arc<dyn Store> =
        RedbStore::open(&dir.path().join("s.redb"), Default::default()).unwrap();
    let server = ApiServer::start(store, Default::default()).await.unwrap();
    let admin = server.in_process_router("admin");
    let front_proxy_ca = server.state.aggregator.front_proxy_ca_pem.clone();
    let backend = testing::serve(
        "127.0.0.1:0",
        &["api.default.svc"],
        Some(&front_proxy_ca),
        Duration::ZERO,
        Arc::new(widgets),
    )
    .await;
    let port = backend.addr.port();
    for (path, obj) in [
        (
            "/api/v1/namespaces/default/services",
            json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "api"},
                "spec": {"ports": [{"port": 443, "targetPort": port}]}}),
        ),
        (
            "/api/v1/namespaces/default/endpoints",
            json!({"apiVersion": "v1", "kind": "Endpoints", "metadata": {"name": "api"},
                "subsets": [{"addresses": [{"ip": "127.0.0.1"}], "ports": [{"port": port}]}]}),
        ),
        (
            "/apis/apiregistration.k8s.io/v1/apiservices",
            json!({"apiVersion": "apiregistration.k8s.io/v1", "kind": "APIService",
                "metadata": {"name": "v1.example.com"},
                "spec": {"group": "example.com", "version": "v1", "groupPriorityMinimum": 1000,
                    "versionPriority": 15, "caBundle": backend.ca_bundle(),
                    "service": {"namespace": "default", "name": "api"}}}),
        ),
    ] {
        let (s, b) = call_with(&admin, "POST", path, Some(obj), &[]).await;
        assert_eq!(s, StatusCode::CREATED, "{b}");
    }

    // Available once the backend answered its discovery.
    let mut last = Value::Null;
    for _ in 0..100 {
        let (_, b) = call_with(
            &admin,
            "GET",
            "/apis/apiregistration.k8s.io/v1/apiservices/v1.example.com",
            None,
            &[],
        )
        .await;
        let available = b["status"]["conditions"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|c| c["type"] == "Available" && c["status"] == "True");
        if available {
            last = Value::Null;
            break;
        }
        last = b;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(last, Value::Null, "never Available");

    // Proxied with the user's identity.
    let jane = server.router_as(Identity::new("jane", vec!["system:masters".into()]));
    let (s, b) = call_with(
        &jane,
        "GET",
        "/apis/example.com/v1/namespaces/default/widgets",
        None,
        &[],
    )
    .await;
    assert_eq!(s, StatusCode::OK, "{b}");
    assert_eq!(b["items"][0]["metadata"]["name"], "for-jane");
    let seen = backend.requests();
    let proxied = seen
        .iter()
        .rev()
        .find(|r| r.path.contains("widgets"))
        .unwrap();
    let groups: Vec<&str> = proxied
        .headers
        .get_all("x-remote-group")
        .iter()
        .map(|v| v.to_str().unwrap())
        .collect();
    assert!(groups.contains(&"system:masters"), "{groups:?}");

    // Discovery lists the group and, aggregated, its resources.
    let (_, apis) = call_with(&admin, "GET", "/apis", None, &[]).await;
    assert!(apis["groups"]
        .as_array()
        .unwrap()
        .iter()
        .any(|g| g["name"] == "example.com"));
    let (_, v2) = call_with(
        &admin,
        "GET",
        "/apis",
        None,
        &[(
            "accept",
            "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList",
        )],
    )
    .await;
    let item = v2["items"]
        .as_array()
        .unwrap()
        .iter()
        .find(|i| i["metadata"]["name"] == "example.com")
        .expect("example.com in aggregated discovery");
    assert_eq!(item["versions"][0]["resources"][0]["resource"], "widgets");
    let (s, group) = call_with(&admin, "GET", "/apis/example.com", None, &[]).await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(group["preferredVersion"]["version"], "v1");

    // Local APIServices exist for the built-in groups, and the front-proxy
    // settings are published.
    let (s, apps) = call_with(
        &admin,
        "GET",
        "/apis/apiregistration.k8s.io/v1/apiservices/v1.apps",
        None,
        &[],
    )
    .await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(apps["spec"]["service"], Value::Null);
    let (s, cm) = call_with(
        &admin,
        "GET",
        "/api/v1/namespaces/kube-system/configmaps/extension-apiserver-authentication",
        None,
        &[],
    )
    .await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(cm["data"]["requestheader-client-ca-file"], front_proxy_ca);
}

/// The core group's local APIService `v1.` is made at start like every
/// built-in group's (Kubernetes lists it first) and is Available.
#[tokio::test]
async fn the_core_group_has_its_local_api_service() {
    let dir = tempfile::tempdir().unwrap();
    let store: Arc<dyn Store> =
        RedbStore::open(&dir.path().join("s.redb"), Default::default()).unwrap();
    let server = ApiServer::start(store, Default::default()).await.unwrap();
    let admin = server.in_process_router("admin");
    let path = "/apis/apiregistration.k8s.io/v1/apiservices/v1.";
    let mut last = Value::Null;
    for _ in 0..250 {
        let (s, b) = call_with(&admin, "GET", path, None, &[]).await;
        if s == StatusCode::OK && b["status"]["conditions"][0]["status"] == "True" {
            last = b;
            break;
        }
        last = b;
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(last["spec"]["group"], "", "{last}");
    assert_eq!(last["spec"]["version"], "v1");
    assert!(
        last["spec"].get("service").is_none_or(Value::is_null),
        "{last}"
    );
    let c = &last["status"]["conditions"][0];
    assert_eq!(c["type"], "Available", "{last}");
    assert_eq!(c["status"], "True");
    assert_eq!(c["reason"], "Local");
}
