//! API aggregation with the real kubectl: an aggregated API server written
//! for the test (HTTPS in the test process, trusting only the front-proxy CA
//! that skiff publishes in `extension-apiserver-authentication`, and reading
//! the user from `X-Remote-User`) behind a Service whose Endpoints point at
//! it and an APIService. `kubectl get --raw` reaches it, `kubectl
//! api-resources` lists its resource and the APIService is Available;
//! its OpenAPI (v2 and v3) is merged into the server's, so `kubectl
//! explain` describes its kind.

use std::sync::Arc;
use std::time::Duration;

use serde_json::{json, Value};
use skiff_apiserver::testing::{self, Seen};
use skiff_e2e::{wait_until, Server};

fn widgets(s: &Seen) -> (u16, Value) {
    // Only the front proxy may call, as an aggregated server checks.
    if s.client.as_ref().map(|c| c.0.as_str()) != Some("front-proxy-client") {
        return (
            401,
            json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": 401}),
        );
    }
    let user = s
        .headers
        .get("x-remote-user")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_string();
    match s.path.split('?').next().unwrap_or("") {
        "/apis/example.com/v1" => (
            200,
            json!({"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": "example.com/v1",
                "resources": [{"name": "widgets", "singularName": "widget", "namespaced": true,
                    "kind": "Widget", "verbs": ["get", "list"], "shortNames": ["wdg"]}]}),
        ),
        "/apis/example.com/v1/namespaces/default/widgets" => (
            200,
            json!({"kind": "WidgetList", "apiVersion": "example.com/v1", "metadata": {},
                "items": [{"apiVersion": "example.com/v1", "kind": "Widget",
                    "metadata": {"name": "sprocket", "namespace": "default"},
                    "spec": {"requestedBy": user}}]}),
        ),
        "/openapi/v2" => (
            200,
            json!({"swagger": "2.0", "info": {"title": "test", "version": "v1"},
                "paths": {"/apis/example.com/v1/namespaces/{namespace}/widgets": {"get": {
                    "operationId": "listWidget", "x-kubernetes-action": "list",
                    "x-kubernetes-group-version-kind": {"group": "example.com", "version": "v1", "kind": "Widget"},
                    "responses": {"200": {"description": "OK"}}}}},
                "definitions": {"com.example.v1.Widget": widget_schema("#/definitions/")}}),
        ),
        "/openapi/v3/apis/example.com/v1" => (
            200,
            json!({"openapi": "3.0.0", "info": {"title": "test", "version": "v1"},
                "paths": {"/apis/example.com/v1/namespaces/{namespace}/widgets/{name}": {"get": {
                    "operationId": "readWidget", "x-kubernetes-action": "get",
                    "x-kubernetes-group-version-kind": {"group": "example.com", "version": "v1", "kind": "Widget"},
                    "responses": {"200": {"description": "OK", "content": {"application/json": {
                        "schema": {"$ref": "#/components/schemas/com.example.v1.Widget"}}}}}}}},
                "components": {"schemas": {
                    "com.example.v1.Widget": widget_schema("#/components/schemas/"),
                    "io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta": {"type": "object",
                        "description": "ObjectMeta is metadata that all persisted resources must have.",
                        "properties": {"name": {"type": "string", "description": "Name must be unique within a namespace."}}}}}}),
        ),
        _ => (
            404,
            json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": 404}),
        ),
    }
}

/// The aggregated server's Widget, with `$ref`s under `refs`.
fn widget_schema(refs: &str) -> Value {
    json!({"description": "A Widget served by the test's aggregated server.", "type": "object",
        "properties": {
            "apiVersion": {"type": "string"}, "kind": {"type": "string"},
            "metadata": {"$ref": format!("{refs}io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta")},
            "spec": {"type": "object", "description": "What the widget should be.",
                "properties": {"requestedBy": {"type": "string", "description": "Who asked for the widget."}}}},
        "x-kubernetes-group-version-kind": [{"group": "example.com", "version": "v1", "kind": "Widget"}]})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_aggregated_api_server_is_reachable_through_kubectl() {
    let s = Server::start();
    let ca = wait_until("the front-proxy CA to be published", 30, || {
        let out = s.kubectl(&[
            "get",
            "configmap",
            "-n",
            "kube-system",
            "extension-apiserver-authentication",
            "-o",
            "jsonpath={.data.requestheader-client-ca-file}",
        ]);
        let ca = String::from_utf8_lossy(&out.stdout).to_string();
        ca.contains("BEGIN CERTIFICATE").then_some(ca)
    });
    let backend = testing::serve(
        "127.0.0.1:0",
        &["api.default.svc"],
        Some(&ca),
        Duration::ZERO,
        Arc::new(widgets),
    )
    .await;
    let port = backend.addr.port();
    let manifests = json!({"apiVersion": "v1", "kind": "List", "items": [
        {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "api"},
            "spec": {"ports": [{"port": 443, "targetPort": port}]}},
        {"apiVersion": "v1", "kind": "Endpoints", "metadata": {"name": "api"},
            "subsets": [{"addresses": [{"ip": "127.0.0.1"}], "ports": [{"port": port}]}]},
        {"apiVersion": "apiregistration.k8s.io/v1", "kind": "APIService",
            "metadata": {"name": "v1.example.com"},
            "spec": {"group": "example.com", "version": "v1", "groupPriorityMinimum": 1000,
                "versionPriority": 15, "caBundle": backend.ca_bundle(),
                "service": {"namespace": "default", "name": "api"}}},
    ]});
    s.ok_stdin(&["apply", "-f", "-"], &manifests.to_string());

    wait_until("the APIService to be Available", 30, || {
        let out = s.ok(&["get", "apiservice", "v1.example.com"]);
        out.lines()
            .any(|l| {
                l.starts_with("v1.example.com") && l.contains("default/api") && l.contains("True")
            })
            .then_some(())
    });
    // Local APIServices for the built-in groups.
    assert!(s.ok(&["get", "apiservice", "v1.apps"]).contains("Local"));

    let raw = s.ok(&[
        "get",
        "--raw",
        "/apis/example.com/v1/namespaces/default/widgets",
    ]);
    let list: Value = serde_json::from_str(&raw).unwrap();
    let me = s.ok(&[
        "auth",
        "whoami",
        "-o",
        "jsonpath={.status.userInfo.username}",
    ]);
    assert_eq!(list["items"][0]["metadata"]["name"], "sprocket");
    assert_eq!(list["items"][0]["spec"]["requestedBy"], me.as_str());

    let resources = wait_until("widgets in kubectl api-resources", 30, || {
        let out = s.ok(&["api-resources", "--api-group", "example.com"]);
        out.contains("widgets").then_some(out)
    });
    assert!(resources.contains("example.com/v1"), "{resources}");
    assert!(resources.contains("wdg"), "{resources}");

    // Its OpenAPI is the server's: `kubectl explain` from v3 and from v2.
    let explained = wait_until("kubectl explain of the aggregated kind", 30, || {
        let out = s.kubectl(&["explain", "widgets.spec"]);
        out.status
            .success()
            .then(|| String::from_utf8_lossy(&out.stdout).to_string())
    });
    assert!(
        explained.contains("requestedBy") && explained.contains("Who asked for the widget."),
        "{explained}"
    );
    let v2 = s.ok(&["explain", "widgets.spec", "--output=plaintext-openapiv2"]);
    assert!(v2.contains("Who asked for the widget."), "{v2}");
    let doc: Value = serde_json::from_str(&s.ok(&["get", "--raw", "/openapi/v2"])).unwrap();
    assert!(doc["definitions"]["com.example.v1.Widget"].is_object());
    assert!(doc["definitions"]["io.k8s.api.apps.v1.Deployment"].is_object());
    assert!(doc["paths"]["/apis/example.com/v1/namespaces/{namespace}/widgets"].is_object());

    // The backend gone: the APIService says so and requests get a 503.
    drop(backend);
    wait_until("the APIService to be unavailable", 30, || {
        let out = s.ok(&["get", "apiservice", "v1.example.com"]);
        out.contains("False (FailedDiscoveryCheck)").then_some(())
    });
    let err = s.fails(&[
        "get",
        "--raw",
        "/apis/example.com/v1/namespaces/default/widgets",
    ]);
    assert!(
        err.contains("ServiceUnavailable") || err.contains("unable to handle"),
        "{err}"
    );
    // Its OpenAPI goes with it.
    let doc: Value = serde_json::from_str(&s.ok(&["get", "--raw", "/openapi/v2"])).unwrap();
    assert!(doc["definitions"].get("com.example.v1.Widget").is_none());
    assert!(s
        .fails(&["get", "--raw", "/openapi/v3/apis/example.com/v1"])
        .contains("NotFound"));
}
