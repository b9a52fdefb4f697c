//! CustomResourceDefinitions through the router: a definition is checked,
//! established and published; its custom resources are served with
//! subresources, printer columns, selectors, versions and patches; deleting
//! the definition (or a namespace) deletes its objects.

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::http::{Request, StatusCode};
use axum::Router;
use futures::StreamExt;
use http_body_util::BodyExt;
use serde_json::{json, Value};
use skiff_store::{RedbStore, Store};
use tower::ServiceExt;

struct Api {
    router: Router,
    _dir: tempfile::TempDir,
}

struct Resp {
    status: StatusCode,
    headers: axum::http::HeaderMap,
    body: Value,
}

async fn api() -> Api {
    let dir = tempfile::tempdir().unwrap();
    let store: Arc<dyn Store> =
        RedbStore::open(&dir.path().join("s.redb"), Default::default()).unwrap();
    let server = skiff_apiserver::ApiServer::start(store, Default::default())
        .await
        .unwrap();
    Api {
        router: server.in_process_router("test"),
        _dir: dir,
    }
}

impl Api {
    async fn req(
        &self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: Option<Value>,
    ) -> Resp {
        let mut b = Request::builder().method(method).uri(path);
        if !headers.iter().any(|(k, _)| *k == "content-type") {
            b = b.header("content-type", "application/json");
        }
        for (k, v) in headers {
            b = b.header(*k, *v);
        }
        let r = b
            .body(body.map(|v| Body::from(v.to_string())).unwrap_or_default())
            .unwrap();
        let resp = self.router.clone().oneshot(r).await.unwrap();
        let status = resp.status();
        let headers = resp.headers().clone();
        let bytes = resp.into_body().collect().await.unwrap().to_bytes();
        Resp {
            status,
            headers,
            body: serde_json::from_slice(&bytes).unwrap_or(Value::Null),
        }
    }
    async fn get(&self, path: &str) -> Resp {
        self.req("GET", path, &[], None).await
    }
    async fn post(&self, path: &str, v: Value) -> Resp {
        self.req("POST", path, &[], Some(v)).await
    }
    async fn put(&self, path: &str, v: Value) -> Resp {
        self.req("PUT", path, &[], Some(v)).await
    }
    async fn patch(&self, path: &str, ct: &str, v: Value) -> Resp {
        self.req("PATCH", path, &[("content-type", ct)], Some(v))
            .await
    }
    async fn delete(&self, path: &str) -> Resp {
        self.req("DELETE", path, &[], None).await
    }

    /// Waits (bounded) until `path` answers `code`.
    async fn until(&self, path: &str, code: StatusCode) -> Resp {
        let end = Instant::now() + Duration::from_secs(10);
        loop {
            let r = self.get(path).await;
            if r.status == code || Instant::now() > end {
                assert_eq!(r.status, code, "{path}: {}", r.body);
                return r;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

fn widget_crd() -> Value {
    json!({
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": "widgets.example.com"},
        "spec": {
            "group": "example.com",
            "scope": "Namespaced",
            "names": {"plural": "widgets", "singular": "widget", "kind": "Widget", "shortNames": ["wd"], "categories": ["all"]},
            "versions": [
                {"name": "v1beta1", "served": true, "storage": false, "deprecated": true,
                 "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}}},
                {"name": "v1", "served": true, "storage": true,
                 "schema": {"openAPIV3Schema": {"type": "object", "properties": {
                    "spec": {"type": "object", "properties": {
                        "color": {"type": "string"}, "size": {"type": "integer"},
                        "ports": {"type": "array", "x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"],
                                  "items": {"type": "object", "required": ["name"], "properties": {"name": {"type": "string"}, "port": {"type": "integer"}}}}}},
                    "status": {"type": "object", "properties": {"size": {"type": "integer"}, "selector": {"type": "string"}}}}}},
                 "subresources": {"status": {}, "scale": {"specReplicasPath": ".spec.size", "statusReplicasPath": ".status.size", "labelSelectorPath": ".status.selector"}},
                 "selectableFields": [{"jsonPath": ".spec.color"}],
                 "additionalPrinterColumns": [
                    {"name": "Color", "type": "string", "jsonPath": ".spec.color"},
                    {"name": "Size", "type": "integer", "jsonPath": ".spec.size", "priority": 1}]},
            ],
        }
    })
}

const WIDGETS: &str = "/apis/example.com/v1/namespaces/default/widgets";

async fn established(api: &Api, name: &str) -> Value {
    let end = Instant::now() + Duration::from_secs(10);
    loop {
        let r = api
            .get(&format!(
                "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}"
            ))
            .await;
        let ok = r.body["status"]["conditions"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|c| c["type"] == "Established" && c["status"] == "True");
        if ok {
            return r.body;
        }
        assert!(Instant::now() < end, "{name} never established: {}", r.body);
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Installs the Widget definition, waits until it is served, and creates
/// a red Widget `name` in v1.
async fn red_widget(a: &Api, name: &str) {
    a.post(
        "/apis/apiextensions.k8s.io/v1/customresourcedefinitions",
        widget_crd(),
    )
    .await;
    established(a, "widgets.example.com").await;
    a.until(WIDGETS, StatusCode::OK).await;
    let r = a
        .post(
            WIDGETS,
            json!({"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": name}, "spec": {"color": "red"}}),
        )
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.body);
}

#[tokio::test]
async fn a_broken_definition_is_refused_whole_with_every_reason() {
    let api = api().await;
    let mut crd = widget_crd();
    crd["metadata"]["name"] = json!("gadgets.example.com");
    crd["spec"]["versions"][0]["storage"] = json!(true);
    crd["spec"]["names"]["singular"] = json!("Widget");
    let r = api
        .post(
            "/apis/apiextensions.k8s.io/v1/customresourcedefinitions",
            crd,
        )
        .await;
    assert_eq!(r.status, StatusCode::UNPROCESSABLE_ENTITY, "{}", r.body);
    assert_eq!(r.body["reason"], "Invalid");
    let fields: Vec<&str> = r.body["details"]["causes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["field"].as_str().unwrap())
        .collect();
    assert!(fields.contains(&"metadata.name"), "{fields:?}");
    assert!(fields.contains(&"spec.names.singular"), "{fields:?}");
    assert!(fields.contains(&"spec.versions"), "{fields:?}");
    let r = api
        .get("/apis/apiextensions.k8s.io/v1/customresourcedefinitions/gadgets.example.com")
        .await;
    assert_eq!(r.status, StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn custom_resources_are_served_once_the_definition_is_established() {
    let api = api().await;
    let r = api
        .post(
            "/apis/apiextensions.k8s.io/v1/customresourcedefinitions",
            widget_crd(),
        )
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.body);
    let crd = established(&api, "widgets.example.com").await;
    assert_eq!(crd["status"]["acceptedNames"]["kind"], "Widget");
    assert_eq!(crd["status"]["storedVersions"], json!(["v1"]));
    assert!(crd["status"]["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .any(|c| c["type"] == "NamesAccepted" && c["reason"] == "NoConflicts"));

    // Discovery, legacy and aggregated, and OpenAPI v3.
    let d = api.until("/apis/example.com/v1", StatusCode::OK).await;
    let widgets = d.body["resources"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["name"] == "widgets")
        .cloned()
        .unwrap();
    assert_eq!(widgets["shortNames"], json!(["wd"]));
    assert_eq!(widgets["categories"], json!(["all"]));
    assert!(d.body["resources"]
        .as_array()
        .unwrap()
        .iter()
        .any(|r| r["name"] == "widgets/scale" && r["kind"] == "Scale"));
    let g = api.get("/apis/example.com").await;
    assert_eq!(g.body["preferredVersion"]["version"], "v1");
    assert_eq!(g.body["versions"][1]["version"], "v1beta1");
    let agg = api
        .req(
            "GET",
            "/apis",
            &[(
                "accept",
                "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList",
            )],
            None,
        )
        .await;
    assert!(agg.body["items"]
        .as_array()
        .unwrap()
        .iter()
        .any(|g| g["metadata"]["name"] == "example.com"
            && g["versions"][0]["resources"][0]["resource"] == "widgets"));
    let o = api.get("/openapi/v3/apis/example.com/v1").await;
    assert_eq!(o.status, StatusCode::OK);
    let schema = &o.body["components"]["schemas"]["com.example.v1.Widget"];
    assert_eq!(
        schema["x-kubernetes-group-version-kind"][0]["kind"],
        "Widget"
    );
    assert_eq!(
        schema["properties"]["metadata"]["$ref"],
        "#/components/schemas/io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta"
    );
    let idx = api.get("/openapi/v3").await;
    assert!(idx.body["paths"].get("apis/example.com/v1").is_some());

    // Create, get, list; status is the status subresource's.
    let w = json!({"apiVersion": "example.com/v1", "kind": "Widget",
        "metadata": {"name": "w1", "labels": {"tier": "a"}},
        "spec": {"color": "red", "size": 2}, "status": {"size": 9}});
    let r = api.post(WIDGETS, w).await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.body);
    assert!(r.body.get("status").is_none(), "{}", r.body);
    assert_eq!(r.body["metadata"]["generation"], 1);
    assert!(!r.body["metadata"]["uid"].as_str().unwrap().is_empty());
    let r = api
        .post(
            WIDGETS,
            json!({"apiVersion": "example.com/v1", "kind": "Widget",
                "metadata": {"generateName": "w-", "labels": {"tier": "b"}}, "spec": {"color": "blue", "size": 1}}),
        )
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.body);
    assert!(r.body["metadata"]["name"]
        .as_str()
        .unwrap()
        .starts_with("w-"));
    let r = api.get(&format!("{WIDGETS}/w1")).await;
    assert_eq!(r.body["spec"]["color"], "red");
    let list = api.get(&format!("{WIDGETS}?labelSelector=tier%3Da")).await;
    assert_eq!(list.body["kind"], "WidgetList");
    assert_eq!(list.body["items"].as_array().unwrap().len(), 1);
    let list = api
        .get("/apis/example.com/v1/widgets?fieldSelector=spec.color%3Dblue")
        .await;
    assert_eq!(list.status, StatusCode::OK, "{}", list.body);
    assert_eq!(list.body["items"].as_array().unwrap().len(), 1);
    assert_eq!(list.body["items"][0]["spec"]["color"], "blue");
    let bad = api
        .get("/apis/example.com/v1/widgets?fieldSelector=spec.size%3D1")
        .await;
    assert_eq!(bad.status, StatusCode::BAD_REQUEST, "{}", bad.body);

    // Printer columns.
    let t = api
        .req(
            "GET",
            WIDGETS,
            &[("accept", "application/json;as=Table;v=v1;g=meta.k8s.io")],
            None,
        )
        .await;
    let cols: Vec<&str> = t.body["columnDefinitions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["name"].as_str().unwrap())
        .collect();
    assert_eq!(cols, ["Name", "Color", "Size"]);
    assert_eq!(t.body["columnDefinitions"][2]["priority"], 1);
    let row = t.body["rows"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["cells"][0] == "w1")
        .unwrap();
    assert_eq!(row["cells"], json!(["w1", "red", 2]));

    // Status: the main resource keeps it, the subresource writes it.
    let mut cur = api.get(&format!("{WIDGETS}/w1")).await.body;
    cur["status"] = json!({"size": 5, "selector": "tier=a"});
    let r = api.put(&format!("{WIDGETS}/w1/status"), cur.clone()).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    assert_eq!(r.body["status"]["size"], 5);
    assert_eq!(
        r.body["metadata"]["generation"], 1,
        "status leaves generation"
    );
    let r = api
        .patch(
            &format!("{WIDGETS}/w1"),
            "application/merge-patch+json",
            json!({"spec": {"color": "green"}, "status": {"size": 0}}),
        )
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    assert_eq!(r.body["status"]["size"], 5);
    assert_eq!(r.body["metadata"]["generation"], 2);

    // Scale.
    let s = api.get(&format!("{WIDGETS}/w1/scale")).await;
    assert_eq!(s.body["kind"], "Scale");
    assert_eq!(s.body["spec"]["replicas"], 2);
    assert_eq!(s.body["status"]["replicas"], 5);
    assert_eq!(s.body["status"]["selector"], "tier=a");
    let s = api
        .patch(
            &format!("{WIDGETS}/w1/scale"),
            "application/merge-patch+json",
            json!({"spec": {"replicas": 7}}),
        )
        .await;
    assert_eq!(s.status, StatusCode::OK, "{}", s.body);
    assert_eq!(
        api.get(&format!("{WIDGETS}/w1")).await.body["spec"]["size"],
        7
    );

    // Patches: strategic merge is refused, JSON patch works, apply merges
    // the list-map by its key.
    let r = api
        .patch(
            &format!("{WIDGETS}/w1"),
            "application/strategic-merge-patch+json",
            json!({"spec": {"color": "x"}}),
        )
        .await;
    assert_eq!(r.status, StatusCode::UNSUPPORTED_MEDIA_TYPE, "{}", r.body);
    let r = api
        .patch(
            &format!("{WIDGETS}/w1"),
            "application/json-patch+json",
            json!([{"op": "replace", "path": "/spec/color", "value": "teal"}]),
        )
        .await;
    assert_eq!(r.body["spec"]["color"], "teal");
    let apply = |ports: Value, manager: &str| {
        let path = format!("{WIDGETS}/w2?fieldManager={manager}");
        let body = json!({"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": "w2"}, "spec": {"ports": ports}});
        (path, body)
    };
    let (p, b) = apply(json!([{"name": "http", "port": 80}]), "a");
    let r = api.patch(&p, "application/apply-patch+yaml", b).await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.body);
    let (p, b) = apply(json!([{"name": "https", "port": 443}]), "b");
    let r = api.patch(&p, "application/apply-patch+yaml", b).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    assert_eq!(
        r.body["spec"]["ports"],
        json!([{"name": "http", "port": 80}, {"name": "https", "port": 443}]),
        "two managers' entries of a list-map are merged by key"
    );

    // A deprecated version: converted on read, with a warning.
    let r = api
        .get("/apis/example.com/v1beta1/namespaces/default/widgets/w1")
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    assert_eq!(r.body["apiVersion"], "example.com/v1beta1");
    let warning = r.headers.get("warning").unwrap().to_str().unwrap();
    assert!(
        warning.contains("example.com/v1beta1 Widget is deprecated"),
        "{warning}"
    );

    // Deleting the definition deletes its objects, then itself.
    let r = api
        .delete("/apis/apiextensions.k8s.io/v1/customresourcedefinitions/widgets.example.com")
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    api.until(
        "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/widgets.example.com",
        StatusCode::NOT_FOUND,
    )
    .await;
    api.until("/apis/example.com/v1", StatusCode::NOT_FOUND)
        .await;
    api.until(&format!("{WIDGETS}/w1"), StatusCode::NOT_FOUND)
        .await;

    // Defined again: nothing of before is left.
    let r = api
        .post(
            "/apis/apiextensions.k8s.io/v1/customresourcedefinitions",
            widget_crd(),
        )
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.body);
    established(&api, "widgets.example.com").await;
    let list = api.until(WIDGETS, StatusCode::OK).await;
    assert_eq!(list.body["items"], json!([]));
}

/// The NamesAccepted condition and accepted names of a definition once the
/// server has given it a NamesAccepted condition.
async fn names_accepted(api: &Api, name: &str) -> (Value, Value) {
    let end = Instant::now() + Duration::from_secs(10);
    loop {
        let r = api
            .get(&format!(
                "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}"
            ))
            .await;
        let cond = r.body["status"]["conditions"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|c| c["type"] == "NamesAccepted")
            .cloned();
        if let Some(c) = cond {
            return (c, r.body["status"]["acceptedNames"].clone());
        }
        assert!(Instant::now() < end, "{}", r.body);
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn a_name_taken_by_another_definition_is_not_accepted() {
    let api = api().await;
    api.post(
        "/apis/apiextensions.k8s.io/v1/customresourcedefinitions",
        widget_crd(),
    )
    .await;
    established(&api, "widgets.example.com").await;
    // Each definition asks for one name that widgets.example.com has (its
    // plural, singular, short name, kind, list kind): the reason names
    // which, as kube-apiextensions-server's naming controller does, and
    // the free names are accepted.
    let cases = [
        (
            json!({"plural": "wd", "singular": "wdee", "kind": "Wdee"}),
            "PluralConflict",
            "\"wd\" is already in use",
            json!({"plural": "", "singular": "wdee", "kind": "Wdee", "listKind": "WdeeList"}),
        ),
        (
            json!({"plural": "things", "singular": "widget", "kind": "Thing"}),
            "SingularConflict",
            "\"widget\" is already in use",
            json!({"plural": "things", "kind": "Thing", "listKind": "ThingList"}),
        ),
        (
            json!({"plural": "bolts", "kind": "Bolt", "shortNames": ["b", "wd", "widgets"]}),
            "ShortNamesConflict",
            "[\"wd\" is already in use, \"widgets\" is already in use]",
            json!({"plural": "bolts", "singular": "bolt", "kind": "Bolt", "listKind": "BoltList"}),
        ),
        (
            json!({"plural": "gizmos", "singular": "gizmo", "kind": "Widget", "listKind": "GizmoList"}),
            "KindConflict",
            "\"Widget\" is already in use",
            json!({"plural": "gizmos", "singular": "gizmo", "kind": "", "listKind": "GizmoList"}),
        ),
        (
            json!({"plural": "nuts", "kind": "Nut", "listKind": "WidgetList"}),
            "ListKindConflict",
            "\"WidgetList\" is already in use",
            json!({"plural": "nuts", "singular": "nut", "kind": "Nut"}),
        ),
    ];
    for (names, reason, message, accepted) in cases {
        let plural = names["plural"].as_str().unwrap().to_string();
        let mut other = widget_crd();
        other["metadata"]["name"] = json!(format!("{plural}.example.com"));
        other["spec"]["names"] = names;
        let r = api
            .post(
                "/apis/apiextensions.k8s.io/v1/customresourcedefinitions",
                other,
            )
            .await;
        assert_eq!(r.status, StatusCode::CREATED, "{}", r.body);
        let (c, got) = names_accepted(&api, &format!("{plural}.example.com")).await;
        assert_eq!(c["status"], "False", "{plural}: {c}");
        assert_eq!(c["reason"], reason, "{plural}: {c}");
        assert_eq!(c["message"], message, "{plural}: {c}");
        assert_eq!(got, accepted, "{plural}");
        let r = api.get(&format!("/apis/example.com/v1/{plural}")).await;
        assert_eq!(r.status, StatusCode::NOT_FOUND, "{plural}");
    }
}

#[tokio::test]
async fn deleting_a_namespace_deletes_its_custom_resources() {
    let api = api().await;
    api.post(
        "/apis/apiextensions.k8s.io/v1/customresourcedefinitions",
        widget_crd(),
    )
    .await;
    established(&api, "widgets.example.com").await;
    let r = api
        .post(
            "/api/v1/namespaces",
            json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "team"}}),
        )
        .await;
    assert_eq!(r.status, StatusCode::CREATED);
    let path = "/apis/example.com/v1/namespaces/team/widgets";
    let r = api.until(path, StatusCode::OK).await;
    assert_eq!(r.body["items"], json!([]));
    let r = api
        .post(
            path,
            json!({"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": "w"}, "spec": {}}),
        )
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.body);
    api.delete("/api/v1/namespaces/team").await;
    api.until("/api/v1/namespaces/team", StatusCode::NOT_FOUND)
        .await;
    api.until(&format!("{path}/w"), StatusCode::NOT_FOUND).await;
}

#[tokio::test]
async fn custom_resources_are_pruned_defaulted_and_validated_by_the_schema() {
    let api = api().await;
    let crd = json!({
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": "pools.example.com"},
        "spec": {
            "group": "example.com",
            "scope": "Cluster",
            "names": {"plural": "pools", "singular": "pool", "kind": "Pool"},
            "versions": [{"name": "v1", "served": true, "storage": true,
                "schema": {"openAPIV3Schema": {"type": "object", "properties": {
                    "spec": {"type": "object",
                        "x-kubernetes-validations": [
                            {"rule": "self.size <= self.max", "message": "size must not exceed max"},
                            {"rule": "!has(oldSelf.mode) || self.mode == oldSelf.mode", "message": "mode is immutable"}],
                        "properties": {
                            "size": {"type": "integer", "minimum": 0, "default": 1},
                            "max": {"type": "integer", "default": 10},
                            "mode": {"type": "string", "enum": ["fast", "safe"], "default": "safe"}}}}}}}],
        }
    });
    let r = api
        .post(
            "/apis/apiextensions.k8s.io/v1/customresourcedefinitions",
            crd,
        )
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.body);
    established(&api, "pools.example.com").await;
    let pools = "/apis/example.com/v1/pools";
    api.until(pools, StatusCode::OK).await;

    // Unknown fields pruned, defaults filled.
    let r = api
        .post(
            pools,
            json!({"apiVersion": "example.com/v1", "kind": "Pool", "metadata": {"name": "p"},
                "spec": {"size": 3, "colour": "red"}, "extra": true}),
        )
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.body);
    assert_eq!(
        r.body["spec"],
        json!({"size": 3, "max": 10, "mode": "safe"})
    );
    assert!(r.body.get("extra").is_none());
    let warning = r.headers.get("warning").unwrap().to_str().unwrap();
    assert!(
        warning.contains(r#"unknown field \"spec.colour\""#),
        "{warning}"
    );
    // Strict field validation (kubectl's default) refuses them instead.
    let r = api
        .post(
            &format!("{pools}?fieldValidation=Strict"),
            json!({"apiVersion": "example.com/v1", "kind": "Pool", "metadata": {"name": "s"},
                "spec": {"size": 3, "colour": "red"}}),
        )
        .await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST, "{}", r.body);
    assert_eq!(
        r.body["message"],
        "Pool in version \"v1\" cannot be handled as a Pool: strict decoding error: unknown field \"spec.colour\""
    );

    // Every failing field at once, as 422 causes.
    let r = api
        .post(
            pools,
            json!({"apiVersion": "example.com/v1", "kind": "Pool", "metadata": {"name": "q"},
                "spec": {"size": -1, "mode": "slow"}}),
        )
        .await;
    assert_eq!(r.status, StatusCode::UNPROCESSABLE_ENTITY, "{}", r.body);
    let fields: Vec<&str> = r.body["details"]["causes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["field"].as_str().unwrap())
        .collect();
    assert!(fields.contains(&"spec.size"), "{}", r.body);
    assert!(fields.contains(&"spec.mode"), "{}", r.body);
    let r = api
        .post(
            pools,
            json!({"apiVersion": "example.com/v1", "kind": "Pool", "metadata": {"name": "q"},
                "spec": {"size": 20}}),
        )
        .await;
    assert_eq!(r.status, StatusCode::UNPROCESSABLE_ENTITY, "{}", r.body);
    assert!(
        r.body["message"]
            .as_str()
            .unwrap()
            .contains("size must not exceed max"),
        "{}",
        r.body
    );

    // A transition rule sees the old object.
    let r = api
        .patch(
            &format!("{pools}/p"),
            "application/merge-patch+json",
            json!({"spec": {"mode": "fast"}}),
        )
        .await;
    assert_eq!(r.status, StatusCode::UNPROCESSABLE_ENTITY, "{}", r.body);
    assert!(
        r.body["message"]
            .as_str()
            .unwrap()
            .contains("mode is immutable"),
        "{}",
        r.body
    );

    // A definition whose schema is not structural is refused with the reason.
    let bad = json!({
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": "bads.example.com"},
        "spec": {"group": "example.com", "scope": "Cluster",
            "names": {"plural": "bads", "singular": "bad", "kind": "Bad"},
            "versions": [{"name": "v1", "served": true, "storage": true,
                "schema": {"openAPIV3Schema": {"type": "object", "properties": {
                    "spec": {"properties": {"a": {"type": "string"}}},
                    "check": {"type": "object", "x-kubernetes-validations": [{"rule": "self.nope +"}]}}}}}]}
    });
    let r = api
        .post(
            "/apis/apiextensions.k8s.io/v1/customresourcedefinitions",
            bad,
        )
        .await;
    assert_eq!(r.status, StatusCode::UNPROCESSABLE_ENTITY, "{}", r.body);
    let fields: Vec<&str> = r.body["details"]["causes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["field"].as_str().unwrap())
        .collect();
    assert!(
        fields
            .iter()
            .any(|f| f.starts_with("spec.versions[0].schema.openAPIV3Schema.properties[spec]")),
        "{}",
        r.body
    );
}

/// The first `n` events of a watch.
async fn watch_events(api: &Api, path: &str, n: usize) -> Vec<Value> {
    let r = Request::builder().uri(path).body(Body::empty()).unwrap();
    let resp = api.router.clone().oneshot(r).await.unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    let mut stream = resp.into_body().into_data_stream();
    let mut buf = Vec::new();
    let mut out = Vec::new();
    while out.len() < n {
        let chunk = tokio::time::timeout(Duration::from_secs(5), stream.next())
            .await
            .expect("event within 5s")
            .expect("open")
            .unwrap();
        buf.extend_from_slice(&chunk);
        while let Some(i) = buf.iter().position(|b| *b == b'\n') {
            let line: Vec<u8> = buf.drain(..=i).collect();
            out.push(serde_json::from_slice(&line).unwrap());
        }
    }
    out
}

#[tokio::test]
async fn custom_resources_are_watched_and_paged_in_every_served_version() {
    let api = api().await;
    api.post(
        "/apis/apiextensions.k8s.io/v1/customresourcedefinitions",
        widget_crd(),
    )
    .await;
    established(&api, "widgets.example.com").await;
    let list = api.until(WIDGETS, StatusCode::OK).await;
    let rv = list.body["metadata"]["resourceVersion"]
        .as_str()
        .unwrap()
        .to_string();
    for i in 0..3 {
        let r = api
            .post(
                WIDGETS,
                json!({"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": format!("w{i}")}, "spec": {"color": "red"}}),
            )
            .await;
        assert_eq!(r.status, StatusCode::CREATED, "{}", r.body);
    }
    // From the list's resourceVersion, in the deprecated version too.
    let evs = watch_events(
        &api,
        &format!(
            "/apis/example.com/v1beta1/namespaces/default/widgets?watch=true&resourceVersion={rv}"
        ),
        3,
    )
    .await;
    assert_eq!(evs[0]["type"], "ADDED");
    assert_eq!(evs[0]["object"]["apiVersion"], "example.com/v1beta1");
    assert_eq!(evs[2]["object"]["metadata"]["name"], "w2");
    // Paging.
    let p1 = api.get(&format!("{WIDGETS}?limit=2")).await.body;
    assert_eq!(p1["items"].as_array().unwrap().len(), 2);
    let cont = p1["metadata"]["continue"].as_str().unwrap();
    let p2 = api
        .get(&format!("{WIDGETS}?limit=2&continue={cont}"))
        .await
        .body;
    assert_eq!(p2["items"].as_array().unwrap().len(), 1);
    assert_eq!(p2["items"][0]["metadata"]["name"], "w2");
}

#[tokio::test]
async fn a_server_starting_on_a_store_with_definitions_serves_them_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let store: Arc<dyn Store> =
        RedbStore::open(&dir.path().join("s.redb"), Default::default()).unwrap();
    let first = skiff_apiserver::ApiServer::start(store.clone(), Default::default())
        .await
        .unwrap();
    let a = Api {
        router: first.in_process_router("test"),
        _dir: tempfile::tempdir().unwrap(),
    };
    red_widget(&a, "kept").await;
    // A second server on the same store (as after a restart, or another
    // API server on the same etcd) serves the definition from its first
    // request, with the objects and their selectable fields.
    let second = skiff_apiserver::ApiServer::start(store, Default::default())
        .await
        .unwrap();
    let b = Api {
        router: second.in_process_router("test"),
        _dir: dir,
    };
    let r = b
        .get("/apis/example.com/v1/widgets?fieldSelector=spec.color%3Dred")
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    assert_eq!(r.body["items"][0]["metadata"]["name"], "kept");
    let d = b.get("/apis/example.com/v1").await;
    assert_eq!(d.status, StatusCode::OK);
}

#[tokio::test]
async fn objects_kept_at_an_old_storage_version_answer_in_the_version_asked_for() {
    let api = api().await;
    red_widget(&api, "old").await;
    // The storage version moves to v1beta1; "old" stays stored as v1.
    let path = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/widgets.example.com";
    let mut crd = api.get(path).await.body;
    crd["spec"]["versions"][0]["storage"] = json!(true);
    crd["spec"]["versions"][1]["storage"] = json!(false);
    let r = api.put(path, crd).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    let end = Instant::now() + Duration::from_secs(10);
    while api.get(path).await.body["status"]["storedVersions"] != json!(["v1", "v1beta1"]) {
        assert!(Instant::now() < end, "v1beta1 never recorded as stored");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let beta = "/apis/example.com/v1beta1/namespaces/default/widgets";
    let list = api.get(beta).await.body;
    assert_eq!(list["items"][0]["metadata"]["name"], "old");
    assert_eq!(list["items"][0]["apiVersion"], "example.com/v1beta1");
    let one = api.get(&format!("{beta}/old")).await.body;
    assert_eq!(one["apiVersion"], "example.com/v1beta1");
    let evs = watch_events(&api, &format!("{beta}?watch=true"), 1).await;
    assert_eq!(evs[0]["object"]["metadata"]["name"], "old");
    assert_eq!(evs[0]["object"]["apiVersion"], "example.com/v1beta1");
}
