//! The API's semantics through the router, without a socket: what any
//! Kubernetes client relies on (status codes, Status reasons, conflicts,
//! paging, watches, finalizers, graceful deletion).

use std::sync::Arc;
use std::time::Duration;

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

struct Resp {
    status: StatusCode,
    headers: axum::http::HeaderMap,
    body: Value,
}

impl Api {
    async fn req(&self, method: &str, path: &str, ct: &str, body: impl Into<Body>) -> Resp {
        let r = Request::builder()
            .method(method)
            .uri(path)
            .header("content-type", ct)
            .body(body.into())
            .unwrap();
        let resp = self.router.clone().oneshot(r).await.unwrap();
        let status = resp.status();
        let headers = resp.headers().clone();
        let bytes = resp.into_body().collect().await.unwrap().to_bytes();
        let body = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
        Resp {
            status,
            headers,
            body,
        }
    }
    async fn get(&self, path: &str) -> Resp {
        self.req("GET", path, "application/json", Body::empty())
            .await
    }
    async fn post(&self, path: &str, v: Value) -> Resp {
        self.req("POST", path, "application/json", v.to_string())
            .await
    }
    async fn put(&self, path: &str, v: Value) -> Resp {
        self.req("PUT", path, "application/json", v.to_string())
            .await
    }
    async fn delete(&self, path: &str) -> Resp {
        self.req("DELETE", path, "application/json", Body::empty())
            .await
    }
}

fn cm(name: &str, labels: Value) -> Value {
    json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name, "labels": labels}, "data": {"k": "v"}})
}

const CMS: &str = "/api/v1/namespaces/default/configmaps";

#[tokio::test]
async fn a_stale_resource_version_is_a_conflict() {
    let a = api().await;
    let created = a.post(CMS, cm("c", json!({}))).await;
    assert_eq!(created.status, StatusCode::CREATED);
    let mut v = created.body.clone();
    v["data"]["k"] = json!("v2");
    assert_eq!(
        a.put(&format!("{CMS}/c"), v.clone()).await.status,
        StatusCode::OK
    );
    let stale = a.put(&format!("{CMS}/c"), v).await;
    assert_eq!(stale.status, StatusCode::CONFLICT);
    assert_eq!(stale.body["reason"], "Conflict");
    assert_eq!(stale.body["kind"], "Status");
    assert!(stale.body["message"]
        .as_str()
        .unwrap()
        .contains("the object has been modified"));
}

#[tokio::test]
async fn errors_are_status_objects_with_the_right_codes() {
    let a = api().await;
    a.post(CMS, cm("c", json!({}))).await;
    let dup = a.post(CMS, cm("c", json!({}))).await;
    assert_eq!(
        (dup.status, dup.body["reason"].as_str()),
        (StatusCode::CONFLICT, Some("AlreadyExists"))
    );
    let missing = a.get(&format!("{CMS}/nope")).await;
    assert_eq!(
        (missing.status, missing.body["reason"].as_str()),
        (StatusCode::NOT_FOUND, Some("NotFound"))
    );
    assert_eq!(missing.body["details"]["name"], "nope");
    let invalid = a
        .post(
            "/api/v1/namespaces/default/pods",
            json!({"metadata": {"name": "p"}, "spec": {"containers": [{"name": "c"}]}}),
        )
        .await;
    assert_eq!(invalid.status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(
        invalid.body["details"]["causes"][0]["field"],
        "spec.containers[0].image"
    );
    let malformed = a.req("POST", CMS, "application/json", "{not json").await;
    assert_eq!(malformed.status, StatusCode::BAD_REQUEST);
    let text = a.req("POST", CMS, "text/plain", "x").await;
    assert_eq!(text.status, StatusCode::UNSUPPORTED_MEDIA_TYPE);
    let big = format!(
        "{{\"metadata\":{{\"name\":\"big\"}},\"data\":{{\"k\":\"{}\"}}}}",
        "x".repeat(3 * 1024 * 1024 + 10)
    );
    assert_eq!(
        a.req("POST", CMS, "application/json", big).await.status,
        StatusCode::PAYLOAD_TOO_LARGE
    );
    let r = Request::builder()
        .uri(CMS)
        .header("accept", "application/vnd.kubernetes.protobuf")
        .body(Body::empty())
        .unwrap();
    assert_eq!(
        a.router.clone().oneshot(r).await.unwrap().status(),
        StatusCode::NOT_ACCEPTABLE
    );
    let no_ns = a
        .post("/api/v1/namespaces/ghost/configmaps", cm("c", json!({})))
        .await;
    assert_eq!(no_ns.status, StatusCode::NOT_FOUND);
    // A failed write changed nothing.
    assert_eq!(a.get(&format!("{CMS}/c")).await.body["data"]["k"], "v");
}

#[tokio::test]
async fn requests_without_credentials_are_anonymous_and_forbidden() {
    let dir = tempfile::tempdir().unwrap();
    let store: Arc<dyn Store> =
        RedbStore::open(&dir.path().join("s.redb"), Default::default()).unwrap();
    let server = skiff_apiserver::ApiServer::start(store, Default::default())
        .await
        .unwrap();
    let r = Request::builder().uri(CMS).body(Body::empty()).unwrap();
    let resp = server.router().oneshot(r).await.unwrap();
    // As kube-apiserver with anonymous auth: system:anonymous, which RBAC
    // allows only the public health and version paths.
    assert_eq!(resp.status(), StatusCode::FORBIDDEN);
    let r = Request::builder()
        .uri("/readyz")
        .body(Body::empty())
        .unwrap();
    assert_eq!(
        server.router().oneshot(r).await.unwrap().status(),
        StatusCode::OK
    );
}

#[tokio::test]
async fn dry_run_and_field_validation() {
    let a = api().await;
    let dry = a
        .post(&format!("{CMS}?dryRun=All"), cm("d", json!({})))
        .await;
    assert_eq!(dry.status, StatusCode::CREATED);
    assert_eq!(dry.body["metadata"]["name"], "d");
    assert_eq!(
        a.get(&format!("{CMS}/d")).await.status,
        StatusCode::NOT_FOUND,
        "dry run stores nothing"
    );
    let mut bad = cm("s", json!({}));
    bad["dataa"] = json!({});
    let strict = a
        .post(&format!("{CMS}?fieldValidation=Strict"), bad.clone())
        .await;
    assert_eq!(strict.status, StatusCode::BAD_REQUEST);
    assert_eq!(
        strict.body["message"],
        "ConfigMap in version \"v1\" cannot be handled as a ConfigMap: strict decoding error: unknown field \"dataa\""
    );
    let warn = a.post(&format!("{CMS}?fieldValidation=Warn"), bad).await;
    assert_eq!(warn.status, StatusCode::CREATED);
    assert!(warn
        .headers
        .get("warning")
        .unwrap()
        .to_str()
        .unwrap()
        .contains("unknown field \\\"dataa\\\""));
    let dup = a
        .req(
            "POST",
            &format!("{CMS}?fieldValidation=Strict"),
            "application/json",
            r#"{"metadata":{"name":"x","name":"y"}}"#,
        )
        .await;
    assert_eq!(dup.status, StatusCode::BAD_REQUEST);
    assert!(dup.body["message"]
        .as_str()
        .unwrap()
        .contains("duplicate field \"metadata.name\""));
}

#[tokio::test]
async fn generation_follows_spec_changes_only() {
    let a = api().await;
    let d = json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "d"},
        "spec": {"selector": {"matchLabels": {"a": "b"}}, "template": {"metadata": {"labels": {"a": "b"}}, "spec": {"containers": [{"name": "c", "image": "i:1"}]}}}});
    let path = "/apis/apps/v1/namespaces/default/deployments";
    let created = a.post(path, d).await.body;
    assert_eq!(created["metadata"]["generation"], 1);
    let mut v = created.clone();
    v["metadata"]["labels"] = json!({"x": "y"});
    let v = a.put(&format!("{path}/d"), v).await.body;
    assert_eq!(
        v["metadata"]["generation"], 1,
        "a label change is not a spec change"
    );
    let mut v2 = v.clone();
    v2["spec"]["replicas"] = json!(5);
    let v2 = a.put(&format!("{path}/d"), v2).await.body;
    assert_eq!(v2["metadata"]["generation"], 2);
    // Status writes through the main resource are ignored; through /status they land.
    let mut s = v2.clone();
    s["status"] = json!({"replicas": 3});
    assert!(a
        .put(&format!("{path}/d"), s.clone())
        .await
        .body
        .get("status")
        .map(|st| st.get("replicas").is_none())
        .unwrap_or(true));
    let st = a.put(&format!("{path}/d/status"), s).await;
    assert_eq!(st.body["status"]["replicas"], 3);
    assert_eq!(st.body["metadata"]["generation"], 2);
}

#[tokio::test]
async fn lists_page_through_one_snapshot() {
    let a = api().await;
    for i in 0..5 {
        a.post(CMS, cm(&format!("c{i}"), json!({}))).await;
    }
    let p1 = a.get(&format!("{CMS}?limit=2")).await.body;
    assert_eq!(p1["items"].as_array().unwrap().len(), 2);
    assert_eq!(p1["metadata"]["remainingItemCount"], 3);
    let cont = p1["metadata"]["continue"].as_str().unwrap().to_string();
    a.post(CMS, cm("c9", json!({}))).await;
    a.delete(&format!("{CMS}/c4")).await;
    let p2 = a.get(&format!("{CMS}?limit=10&continue={cont}")).await.body;
    let names: Vec<&str> = p2["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["metadata"]["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        ["c2", "c3", "c4"],
        "the snapshot of the first page, not later writes"
    );
    assert_eq!(
        p2["metadata"]["resourceVersion"],
        p1["metadata"]["resourceVersion"]
    );
    assert!(p2["metadata"].get("continue").is_none());
    // Page by page, each page's count is what its snapshot has left (the
    // later pages take it from the continue token instead of counting).
    let mut next = format!("{CMS}?limit=2");
    let mut seen = Vec::new();
    loop {
        let p = a.get(&next).await.body;
        seen.extend(
            p["items"]
                .as_array()
                .unwrap()
                .iter()
                .map(|i| i["metadata"]["name"].as_str().unwrap().to_string()),
        );
        let Some(c) = p["metadata"]["continue"].as_str() else {
            assert!(p["metadata"].get("remainingItemCount").is_none());
            break;
        };
        // c0 c1 c2 c3 c9 (c4 deleted): 5 items.
        assert_eq!(
            p["metadata"]["remainingItemCount"],
            5 - seen.len() as i64,
            "after {seen:?}"
        );
        next = format!("{CMS}?limit=2&continue={c}");
    }
    assert_eq!(seen, ["c0", "c1", "c2", "c3", "c9"]);
    // With a selector there is no count, as in Kubernetes.
    let sel = a
        .get(&format!("{CMS}?limit=1&labelSelector=!nope"))
        .await
        .body;
    assert!(sel["metadata"]["continue"].is_string());
    assert!(sel["metadata"].get("remainingItemCount").is_none());
    let bad = a.get(&format!("{CMS}?limit=1&continue=garbage")).await;
    assert_eq!(bad.status, StatusCode::BAD_REQUEST);
}

async fn watch_events(a: &Api, path: &str, n: usize) -> Vec<Value> {
    let r = Request::builder().uri(path).body(Body::empty()).unwrap();
    let resp = a.router.clone().oneshot(r).await.unwrap();
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
async fn a_selector_watch_sees_an_object_leave_as_deleted() {
    let a = api().await;
    let list = a.get(&format!("{CMS}?labelSelector=app%3Dweb")).await.body;
    let rv = list["metadata"]["resourceVersion"]
        .as_str()
        .unwrap()
        .to_string();
    let c = a.post(CMS, cm("c", json!({"app": "web"}))).await.body;
    let mut moved = c.clone();
    moved["metadata"]["labels"] = json!({"app": "db"});
    a.put(&format!("{CMS}/c"), moved.clone()).await;
    let mut back = a.get(&format!("{CMS}/c")).await.body;
    back["metadata"]["labels"] = json!({"app": "web"});
    a.put(&format!("{CMS}/c"), back).await;
    a.post(CMS, cm("other", json!({"app": "db"}))).await;
    a.delete(&format!("{CMS}/c")).await;
    let evs = watch_events(
        &a,
        &format!("{CMS}?watch=1&labelSelector=app%3Dweb&resourceVersion={rv}"),
        4,
    )
    .await;
    let types: Vec<&str> = evs.iter().map(|e| e["type"].as_str().unwrap()).collect();
    assert_eq!(types, ["ADDED", "DELETED", "ADDED", "DELETED"]);
    let revs: Vec<u64> = evs
        .iter()
        .map(|e| {
            e["object"]["metadata"]["resourceVersion"]
                .as_str()
                .unwrap()
                .parse()
                .unwrap()
        })
        .collect();
    assert!(revs.windows(2).all(|w| w[0] < w[1]), "{revs:?}");
}

#[tokio::test]
async fn a_watch_without_a_version_starts_with_the_current_state() {
    let a = api().await;
    a.post(CMS, cm("a", json!({}))).await;
    let evs = watch_events(&a, &format!("{CMS}?watch=true"), 1).await;
    assert_eq!(evs[0]["type"], "ADDED");
    assert_eq!(evs[0]["object"]["metadata"]["name"], "a");
    let evs = watch_events(&a, &format!("{CMS}?watch=true&sendInitialEvents=true&resourceVersionMatch=NotOlderThan&allowWatchBookmarks=true"), 2).await;
    assert_eq!(evs[1]["type"], "BOOKMARK");
    assert_eq!(
        evs[1]["object"]["metadata"]["annotations"]["k8s.io/initial-events-end"],
        "true"
    );
}

#[tokio::test]
async fn finalizers_hold_deletion_until_removed() {
    let a = api().await;
    let mut c = cm("f", json!({}));
    c["metadata"]["finalizers"] = json!(["example.com/hold"]);
    a.post(CMS, c).await;
    let d = a.delete(&format!("{CMS}/f")).await;
    assert_eq!(d.status, StatusCode::OK);
    let held = a.get(&format!("{CMS}/f")).await.body;
    assert!(held["metadata"]["deletionTimestamp"].is_string());
    let mut released = held.clone();
    released["metadata"]["finalizers"] = json!([]);
    a.put(&format!("{CMS}/f"), released).await;
    assert_eq!(
        a.get(&format!("{CMS}/f")).await.status,
        StatusCode::NOT_FOUND
    );
}

#[tokio::test]
async fn bound_pods_wait_for_their_node_and_binding_happens_once() {
    let a = api().await;
    let pods = "/api/v1/namespaces/default/pods";
    let pod = |n: &str| json!({"metadata": {"name": n}, "spec": {"containers": [{"name": "c", "image": "i:1"}]}});
    assert_eq!(
        a.post(pods, pod("unbound")).await.status,
        StatusCode::CREATED
    );
    let gone = a.delete(&format!("{pods}/unbound")).await;
    assert_eq!(gone.status, StatusCode::OK);
    assert_eq!(gone.body["kind"], "Pod", "a pod's delete answers the pod");
    assert_eq!(
        a.get(&format!("{pods}/unbound")).await.status,
        StatusCode::NOT_FOUND,
        "an unbound pod goes at once"
    );
    a.post(&format!("{pods}?fieldManager=creator"), pod("bound"))
        .await;
    let binding = json!({"apiVersion": "v1", "kind": "Binding", "metadata": {"name": "bound"}, "target": {"kind": "Node", "name": "n1"}});
    assert_eq!(
        a.post(
            &format!("{pods}/bound/binding?fieldManager=binder"),
            binding.clone()
        )
        .await
        .status,
        StatusCode::CREATED
    );
    // Binding leaves managed fields alone: the creator still owns its
    // fields and the binder owns none.
    let managers: Vec<Value> = a.get(&format!("{pods}/bound")).await.body["metadata"]
        ["managedFields"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["manager"].clone())
        .collect();
    assert_eq!(managers, [json!("creator")]);
    let again = a.post(&format!("{pods}/bound/binding"), binding).await;
    assert_eq!(again.status, StatusCode::CONFLICT);
    let p = a.get(&format!("{pods}/bound")).await.body;
    assert_eq!(p["spec"]["nodeName"], "n1");
    let scheduled = &p["status"]["conditions"][0];
    assert_eq!(scheduled["type"], "PodScheduled");
    assert_eq!(scheduled["status"], "True");
    assert!(scheduled["lastTransitionTime"].is_string(), "{p}");
    let wrong_kind =
        json!({"metadata": {"name": "bound"}, "target": {"kind": "Pod", "name": "n1"}});
    assert_eq!(
        a.post(&format!("{pods}/bound/binding"), wrong_kind)
            .await
            .status,
        StatusCode::UNPROCESSABLE_ENTITY
    );
    let d = a.delete(&format!("{pods}/bound")).await;
    assert_eq!(d.status, StatusCode::OK);
    let pending = a.get(&format!("{pods}/bound")).await.body;
    assert_eq!(pending["metadata"]["deletionGracePeriodSeconds"], 30);
    // The node confirms with a zero grace period.
    let r = a
        .req(
            "DELETE",
            &format!("{pods}/bound"),
            "application/json",
            r#"{"gracePeriodSeconds":0}"#,
        )
        .await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(
        a.get(&format!("{pods}/bound")).await.status,
        StatusCode::NOT_FOUND
    );
}

#[tokio::test]
async fn a_node_s_committed_state_refuses_a_pod_that_does_not_fit() {
    let a = api().await;
    let pods = "/api/v1/namespaces/default/pods";
    let node = json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n1"},
        "status": {"allocatable": {"cpu": "1", "memory": "1Gi", "pods": "3"}}});
    assert_eq!(
        a.post("/api/v1/nodes", node.clone()).await.status,
        StatusCode::CREATED
    );
    let mut n = a.get("/api/v1/nodes/n1").await.body;
    n["status"] = node["status"].clone();
    assert_eq!(
        a.put("/api/v1/nodes/n1/status", n).await.status,
        StatusCode::OK
    );
    assert_eq!(
        a.get("/api/v1/nodes/n1").await.body["status"]["allocatable"]["cpu"],
        "1"
    );
    let pod = |name: &str, cpu: &str, node: &str| {
        let mut p = json!({"metadata": {"name": name}, "spec": {"containers": [
            {"name": "c", "image": "i:1", "resources": {"requests": {"cpu": cpu}}}]}});
        if !node.is_empty() {
            p["spec"]["nodeName"] = json!(node);
        }
        p
    };
    let bind = |name: &str, node: &str| {
        json!({"apiVersion": "v1", "kind": "Binding", "metadata": {"name": name},
            "target": {"kind": "Node", "name": node}})
    };
    for p in ["p1", "p2", "p3"] {
        assert_eq!(
            a.post(pods, pod(p, "400m", "")).await.status,
            StatusCode::CREATED
        );
    }
    for p in ["p1", "p2"] {
        let r = a.post(&format!("{pods}/{p}/binding"), bind(p, "n1")).await;
        assert_eq!(r.status, StatusCode::CREATED, "{}", r.body);
    }
    // 800m of 1 cpu are taken: a third 400m pod is a conflict naming cpu,
    // and stays unbound.
    let refused = a
        .post(&format!("{pods}/p3/binding"), bind("p3", "n1"))
        .await;
    assert_eq!(refused.status, StatusCode::CONFLICT);
    assert_eq!(refused.body["reason"], "Conflict");
    assert_eq!(
        refused.body["message"],
        "Operation cannot be fulfilled on pods \"p3\": pod default/p3 does not fit on node \"n1\": \
         Insufficient cpu (the pod requests 400m, 800m of the node's 1000m allocatable are taken)"
    );
    assert_eq!(
        a.get(&format!("{pods}/p3")).await.body["spec"]["nodeName"],
        Value::Null
    );
    // Created already bound: the same check, and nothing is created.
    let created = a.post(pods, pod("p4", "400m", "n1")).await;
    assert_eq!(created.status, StatusCode::CONFLICT, "{}", created.body);
    assert!(created.body["message"]
        .as_str()
        .unwrap()
        .contains("Insufficient cpu"));
    assert_eq!(
        a.get(&format!("{pods}/p4")).await.status,
        StatusCode::NOT_FOUND
    );

    // A pod being deleted still holds its place (its node may run it);
    // once it is gone, its place is free again.
    let del = a
        .req(
            "DELETE",
            &format!("{pods}/p1"),
            "application/json",
            json!({"gracePeriodSeconds": 30}).to_string(),
        )
        .await;
    assert_eq!(del.status, StatusCode::OK);
    let still = a
        .post(&format!("{pods}/p3/binding"), bind("p3", "n1"))
        .await;
    assert_eq!(still.status, StatusCode::CONFLICT);
    let del = a
        .req(
            "DELETE",
            &format!("{pods}/p1"),
            "application/json",
            json!({"gracePeriodSeconds": 0}).to_string(),
        )
        .await;
    assert_eq!(del.status, StatusCode::OK);
    assert_eq!(
        a.get(&format!("{pods}/p1")).await.status,
        StatusCode::NOT_FOUND
    );
    let ok = a
        .post(&format!("{pods}/p3/binding"), bind("p3", "n1"))
        .await;
    assert_eq!(ok.status, StatusCode::CREATED, "{}", ok.body);

    // A finished pod holds nothing.
    let mut p2 = a.get(&format!("{pods}/p2")).await.body;
    p2["status"]["phase"] = json!("Succeeded");
    assert_eq!(
        a.put(&format!("{pods}/p2/status"), p2).await.status,
        StatusCode::OK
    );
    assert_eq!(
        a.post(pods, pod("p5", "400m", "n1")).await.status,
        StatusCode::CREATED
    );
    // Three pods at most: p3 and p5 run, one more fits, then none.
    assert_eq!(
        a.post(pods, pod("p6", "1m", "n1")).await.status,
        StatusCode::CREATED
    );
    let full = a.post(pods, pod("p7", "1m", "n1")).await;
    assert_eq!(full.status, StatusCode::CONFLICT);
    assert!(
        full.body["message"]
            .as_str()
            .unwrap()
            .ends_with("Too many pods (3 of 3 allowed are bound)"),
        "{}",
        full.body
    );
    // A mirror pod (its node runs it already) is never refused.
    let mut mirror = pod("static-n1", "900m", "n1");
    mirror["metadata"]["annotations"] = json!({"kubernetes.io/config.mirror": "abc"});
    assert_eq!(a.post(pods, mirror).await.status, StatusCode::CREATED);
    // A node the server does not know is not checked.
    assert_eq!(
        a.post(pods, pod("far", "64", "elsewhere")).await.status,
        StatusCode::CREATED
    );
}

#[tokio::test]
async fn a_binding_names_the_pod_it_means_by_uid() {
    let a = api().await;
    let pods = "/api/v1/namespaces/default/pods";
    let pod =
        json!({"metadata": {"name": "p"}, "spec": {"containers": [{"name": "c", "image": "i:1"}]}});
    let old_uid = a.post(pods, pod.clone()).await.body["metadata"]["uid"].clone();
    a.delete(&format!("{pods}/p")).await;
    let uid = a.post(pods, pod).await.body["metadata"]["uid"].clone();
    let bind = |uid: &Value| json!({"metadata": {"name": "p", "uid": uid}, "target": {"kind": "Node", "name": "n1"}});
    // The pod of that name before it was recreated: a conflict that says so.
    let stale = a.post(&format!("{pods}/p/binding"), bind(&old_uid)).await;
    assert_eq!(stale.status, StatusCode::CONFLICT, "{}", stale.body);
    let msg = stale.body["message"].as_str().unwrap();
    assert!(
        msg.contains("Precondition failed: UID in precondition"),
        "{msg}"
    );
    assert_eq!(
        a.get(&format!("{pods}/p")).await.body["spec"]["nodeName"],
        Value::Null
    );
    // The pod that is there now binds.
    let ok = a.post(&format!("{pods}/p/binding"), bind(&uid)).await;
    assert_eq!(ok.status, StatusCode::CREATED, "{}", ok.body);
    assert_eq!(
        a.get(&format!("{pods}/p")).await.body["spec"]["nodeName"],
        "n1"
    );
}

#[tokio::test]
async fn a_confirmed_pod_goes_when_its_last_finalizer_is_removed() {
    let a = api().await;
    let pods = "/api/v1/namespaces/default/pods";
    for name in ["running", "confirmed"] {
        let pod = json!({"metadata": {"name": name, "finalizers": ["example.com/hold"]},
            "spec": {"nodeName": "n1", "containers": [{"name": "c", "image": "i:1"}]}});
        assert_eq!(a.post(pods, pod).await.status, StatusCode::CREATED);
        assert_eq!(
            a.delete(&format!("{pods}/{name}")).await.status,
            StatusCode::OK
        );
    }
    // Still running on its node: removing the finalizer is not enough.
    let path = format!("{pods}/running");
    let mut p = a.get(&path).await.body;
    p["metadata"]["finalizers"] = json!([]);
    let p = a.put(&path, p).await.body;
    assert_eq!(p["metadata"]["deletionGracePeriodSeconds"], 30, "{p}");
    assert_eq!(a.get(&path).await.status, StatusCode::OK);
    // The node confirms the end (grace 0); the finalizer keeps the object…
    let path = format!("{pods}/confirmed");
    let r = a
        .req(
            "DELETE",
            &path,
            "application/json",
            r#"{"gracePeriodSeconds":0}"#,
        )
        .await;
    assert_eq!(r.status, StatusCode::OK);
    let mut p = a.get(&path).await.body;
    assert_eq!(p["metadata"]["deletionGracePeriodSeconds"], 0, "{p}");
    // …until its last finalizer is removed, which deletes it.
    p["metadata"]["finalizers"] = json!([]);
    assert_eq!(a.put(&path, p).await.status, StatusCode::OK);
    assert_eq!(a.get(&path).await.status, StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn terminating_namespaces_refuse_new_content() {
    let a = api().await;
    a.post("/api/v1/namespaces", json!({"metadata": {"name": "t"}}))
        .await;
    let mut c = cm("held", json!({}));
    c["metadata"]["finalizers"] = json!(["example.com/hold"]);
    a.post("/api/v1/namespaces/t/configmaps", c).await;
    a.delete("/api/v1/namespaces/t").await;
    let ns = a.get("/api/v1/namespaces/t").await.body;
    assert_eq!(ns["status"]["phase"], "Terminating");
    let refused = a
        .post("/api/v1/namespaces/t/configmaps", cm("new", json!({})))
        .await;
    assert_eq!(refused.status, StatusCode::FORBIDDEN);
    assert!(refused.body["message"]
        .as_str()
        .unwrap()
        .contains("because it is being terminated"));
}

#[tokio::test]
async fn autoscaling_v1_and_v2_are_one_object() {
    let a = api().await;
    let v1 = "/apis/autoscaling/v1/namespaces/default/horizontalpodautoscalers";
    let v2 = "/apis/autoscaling/v2/namespaces/default/horizontalpodautoscalers";
    let h = json!({"apiVersion": "autoscaling/v1", "kind": "HorizontalPodAutoscaler", "metadata": {"name": "h"},
        "spec": {"scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "d"}, "minReplicas": 1, "maxReplicas": 4, "targetCPUUtilizationPercentage": 70}});
    let created = a.post(v1, h).await;
    assert_eq!(created.status, StatusCode::CREATED);
    assert_eq!(created.body["apiVersion"], "autoscaling/v1");
    assert_eq!(created.body["spec"]["targetCPUUtilizationPercentage"], 70);
    let as_v2 = a.get(&format!("{v2}/h")).await.body;
    assert_eq!(as_v2["apiVersion"], "autoscaling/v2");
    assert_eq!(
        as_v2["spec"]["metrics"][0]["resource"]["target"]["averageUtilization"],
        70
    );
    let patched = a
        .req(
            "PATCH",
            &format!("{v1}/h"),
            "application/merge-patch+json",
            r#"{"spec":{"targetCPUUtilizationPercentage":50}}"#,
        )
        .await;
    assert_eq!(patched.status, StatusCode::OK, "{}", patched.body);
    assert_eq!(
        a.get(&format!("{v2}/h")).await.body["spec"]["metrics"][0]["resource"]["target"]
            ["averageUtilization"],
        50
    );
    let list = a.get(v1).await.body;
    assert_eq!(list["items"][0]["apiVersion"], "autoscaling/v1");
    assert_eq!(
        list["items"][0]["spec"]["targetCPUUtilizationPercentage"],
        50
    );
}

/// Many Services created at once on one server all get an address and a
/// NodePort, each different: the allocations queue on the server instead of
/// failing with "too many concurrent changes" (32 creates in flight at a
/// time once made some fail).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_service_creates_all_get_distinct_allocations() {
    let a = Arc::new(api().await);
    let svcs = "/api/v1/namespaces/default/services";
    let results: Vec<Resp> = futures::stream::iter(0..600)
        .map(|i| {
            let a = a.clone();
            async move {
                let svc = json!({"metadata": {"name": format!("c{i}")},
                    "spec": {"type": "NodePort", "ports": [{"port": 80}]}});
                a.post(svcs, svc).await
            }
        })
        .buffer_unordered(32)
        .collect()
        .await;
    let mut ips = std::collections::BTreeSet::new();
    let mut ports = std::collections::BTreeSet::new();
    for r in results {
        assert_eq!(r.status, StatusCode::CREATED, "{}", r.body);
        ips.insert(r.body["spec"]["clusterIP"].as_str().unwrap().to_string());
        ports.insert(r.body["spec"]["ports"][0]["nodePort"].as_u64().unwrap());
    }
    assert_eq!(ips.len(), 600);
    assert_eq!(ports.len(), 600);
}

/// A ClusterIP and a NodePort whose Service never made it to the store
/// (its server died in between) are freed by the repair loop after three
/// passes, as kube-apiserver's are, not before.
#[tokio::test]
async fn leaked_allocations_are_freed_after_three_repair_passes() {
    let dir = tempfile::tempdir().unwrap();
    let store: Arc<dyn Store> =
        RedbStore::open(&dir.path().join("s.redb"), Default::default()).unwrap();
    let server = skiff_apiserver::ApiServer::start(store.clone(), Default::default())
        .await
        .unwrap();
    let a = Api {
        router: server.in_process_router("test"),
        _dir: dir,
    };
    let svcs = "/api/v1/namespaces/default/services";
    let svc = |name: &str| {
        json!({"metadata": {"name": name}, "spec": {"type": "NodePort",
            "clusterIP": "10.43.0.77", "ports": [{"port": 80, "nodePort": 30777}]}})
    };
    let r = a.post(svcs, svc("first")).await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.body);
    // The Service goes from the store behind the server's back: its
    // ClusterIP and NodePort stay allocated with nothing holding them.
    let key = "/registry/services/specs/default/first";
    let kv = store.get(key).await.unwrap().expect("the service's key");
    store.delete(key, Some(kv.mod_revision)).await.unwrap();
    let mut gone = false;
    for _ in 0..200 {
        if a.get(&format!("{svcs}/first")).await.status == StatusCode::NOT_FOUND {
            gone = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(gone);

    let reg = server.state.registry.clone();
    let mut repair = skiff_apiserver::strategy::service::LeakRepair::default();
    for pass in 1..=3 {
        let r = a.post(svcs, svc("second")).await;
        assert_eq!(r.status, StatusCode::UNPROCESSABLE_ENTITY, "{}", r.body);
        assert!(
            r.body["message"]
                .as_str()
                .unwrap()
                .contains("already allocated"),
            "{}",
            r.body
        );
        let freed = repair.pass(&*reg).await.unwrap();
        assert_eq!(freed, if pass == 3 { 2 } else { 0 }, "pass {pass}");
    }
    let r = a.post(svcs, svc("second")).await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.body);
    // What a Service holds is never a leak.
    for _ in 0..3 {
        assert_eq!(repair.pass(&*reg).await.unwrap(), 0);
    }
}

/// A LoadBalancer with externalTrafficPolicy Local gets a
/// healthCheckNodePort from the NodePort range (what its nodes' proxies
/// answer health checks on); updates keep it, leaving Local releases it,
/// and no other Service may set one.
#[tokio::test]
async fn local_load_balancers_get_a_health_check_node_port() {
    let a = api().await;
    let svcs = "/api/v1/namespaces/default/services";
    let lb = json!({"metadata": {"name": "lb"}, "spec": {"type": "LoadBalancer",
        "externalTrafficPolicy": "Local", "selector": {"a": "b"}, "ports": [{"port": 80}]}});
    let created = a.post(svcs, lb.clone()).await;
    assert_eq!(created.status, StatusCode::CREATED, "{}", created.body);
    let hc = created.body["spec"]["healthCheckNodePort"]
        .as_u64()
        .unwrap();
    assert!((30000..=32767).contains(&hc));
    assert_ne!(
        Some(hc),
        created.body["spec"]["ports"][0]["nodePort"].as_u64()
    );

    // An update that leaves it out keeps it.
    let mut replaced = lb.clone();
    replaced["metadata"]["resourceVersion"] = created.body["metadata"]["resourceVersion"].clone();
    let updated = a.put(&format!("{svcs}/lb"), replaced).await;
    assert_eq!(updated.status, StatusCode::OK, "{}", updated.body);
    assert_eq!(
        updated.body["spec"]["healthCheckNodePort"].as_u64(),
        Some(hc)
    );

    // Another Service may not take it while it is held.
    let taker = |name: &str| {
        json!({"metadata": {"name": name}, "spec": {"type": "NodePort",
        "ports": [{"port": 80, "nodePort": hc}]}})
    };
    assert_eq!(
        a.post(svcs, taker("t1")).await.status,
        StatusCode::UNPROCESSABLE_ENTITY
    );

    // Back to Cluster (the object as read, port and all): the port goes.
    let mut cluster = updated.body.clone();
    cluster["spec"]["externalTrafficPolicy"] = json!("Cluster");
    let changed = a.put(&format!("{svcs}/lb"), cluster).await;
    assert_eq!(changed.status, StatusCode::OK, "{}", changed.body);
    assert!(
        changed.body["spec"].get("healthCheckNodePort").is_none(),
        "{}",
        changed.body
    );
    assert_eq!(a.post(svcs, taker("t2")).await.status, StatusCode::CREATED);

    // Only a LoadBalancer with Local may carry one.
    let bad = json!({"metadata": {"name": "bad"}, "spec": {"type": "NodePort",
        "healthCheckNodePort": 31000, "ports": [{"port": 80}]}});
    let refused = a.post(svcs, bad).await;
    assert_eq!(refused.status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(
        refused.body["details"]["causes"][0]["field"],
        "spec.healthCheckNodePort"
    );
}

#[tokio::test]
async fn node_port_services_get_a_port_that_updates_keep() {
    let a = api().await;
    let svcs = "/api/v1/namespaces/default/services";
    let svc = json!({"metadata": {"name": "np"}, "spec": {"type": "NodePort", "selector": {"a": "b"}, "ports": [{"port": 80}]}});
    let created = a.post(svcs, svc.clone()).await.body;
    let port = created["spec"]["ports"][0]["nodePort"].as_u64().unwrap();
    assert!((30000..=32767).contains(&port));
    assert!(created["spec"]["clusterIP"]
        .as_str()
        .unwrap()
        .starts_with("10.43."));
    let mut replaced = svc.clone();
    replaced["metadata"]["resourceVersion"] = created["metadata"]["resourceVersion"].clone();
    let updated = a.put(&format!("{svcs}/np"), replaced).await.body;
    assert_eq!(
        updated["spec"]["ports"][0]["nodePort"].as_u64(),
        Some(port),
        "{updated}"
    );
    assert_eq!(updated["spec"]["clusterIP"], created["spec"]["clusterIP"]);
    let mut clash =
        json!({"metadata": {"name": "np2"}, "spec": {"type": "NodePort", "ports": [{"port": 81}]}});
    clash["spec"]["ports"][0]["nodePort"] = json!(port);
    let refused = a.post(svcs, clash).await;
    assert_eq!(refused.status, StatusCode::UNPROCESSABLE_ENTITY);
    assert!(refused.body["message"]
        .as_str()
        .unwrap()
        .contains("provided port is already allocated"));
    // Turning it into a ClusterIP service frees its port.
    let mut plain = a.get(&format!("{svcs}/np")).await.body;
    plain["spec"]["type"] = json!("ClusterIP");
    plain["spec"]["ports"][0]
        .as_object_mut()
        .unwrap()
        .remove("nodePort");
    assert_eq!(
        a.put(&format!("{svcs}/np"), plain).await.status,
        StatusCode::OK
    );
    let mut taker = json!({"metadata": {"name": "taker"}, "spec": {"type": "NodePort", "ports": [{"port": 82}]}});
    taker["spec"]["ports"][0]["nodePort"] = json!(port);
    assert_eq!(
        a.post(svcs, taker).await.status,
        StatusCode::CREATED,
        "the freed port can be taken"
    );
    a.delete(&format!("{svcs}/taker")).await;
    a.delete(&format!("{svcs}/np")).await;
    let mut reuse =
        json!({"metadata": {"name": "np3"}, "spec": {"type": "NodePort", "ports": [{"port": 81}]}});
    reuse["spec"]["ports"][0]["nodePort"] = json!(port);
    assert_eq!(
        a.post(svcs, reuse).await.status,
        StatusCode::CREATED,
        "a deleted service's port is free again"
    );
}

#[tokio::test]
async fn core_and_events_k8s_io_events_are_one_object() {
    let a = api().await;
    let core = "/api/v1/namespaces/default/events";
    let new = "/apis/events.k8s.io/v1/namespaces/default/events";
    let ev = json!({"apiVersion": "events.k8s.io/v1", "kind": "Event", "metadata": {"name": "e1"},
        "regarding": {"kind": "Pod", "name": "p1", "namespace": "default"}, "note": "pulled", "reason": "Pulled",
        "type": "Normal", "action": "Pull", "reportingController": "skiff-agent", "reportingInstance": "n1",
        "eventTime": "2026-01-01T00:00:00.000000Z"});
    assert_eq!(a.post(new, ev).await.status, StatusCode::CREATED);
    let c = a.get(&format!("{core}/e1")).await.body;
    assert_eq!(
        (c["apiVersion"].as_str(), c["message"].as_str()),
        (Some("v1"), Some("pulled"))
    );
    assert_eq!(c["involvedObject"]["name"], "p1");
    let by_field = a
        .get(&format!("{new}?fieldSelector=regarding.name%3Dp1"))
        .await
        .body;
    assert_eq!(by_field["items"].as_array().unwrap().len(), 1);
    assert_eq!(by_field["items"][0]["note"], "pulled");
    let core_field = a
        .get(&format!("{core}?fieldSelector=involvedObject.name%3Dp2"))
        .await
        .body;
    assert_eq!(core_field["items"].as_array().unwrap().len(), 0);
}

#[tokio::test]
async fn values_of_the_wrong_type_are_a_bad_request_and_change_nothing() {
    let a = api().await;
    let deploys = "/apis/apps/v1/namespaces/default/deployments";
    let mut d = json!({"metadata": {"name": "d"}, "spec": {"replicas": "three", "selector": {"matchLabels": {"a": "b"}},
        "template": {"metadata": {"labels": {"a": "b"}}, "spec": {"containers": [{"name": "c", "image": "i:1"}]}}}});
    let r = a.post(deploys, d.clone()).await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST);
    assert_eq!(r.body["message"], "Deployment in version \"v1\" cannot be handled as a Deployment: json: cannot unmarshal string into Go struct field spec.replicas of type int32");
    d["spec"]["replicas"] = json!(2);
    assert_eq!(a.post(deploys, d).await.status, StatusCode::CREATED);
    let p = a
        .req(
            "PATCH",
            &format!("{deploys}/d"),
            "application/merge-patch+json",
            r#"{"spec":{"paused":"yes"}}"#,
        )
        .await;
    assert_eq!(p.status, StatusCode::BAD_REQUEST);
    assert_eq!(
        a.get(&format!("{deploys}/d")).await.body["spec"].get("paused"),
        None
    );
    // A status of the wrong shape cannot be written through the status subresource.
    let s = a
        .req(
            "PATCH",
            "/api/v1/namespaces/default/status",
            "application/merge-patch+json",
            r#"{"status":"x"}"#,
        )
        .await;
    assert_eq!(s.status, StatusCode::BAD_REQUEST);
    assert_eq!(
        a.get("/api/v1/namespaces/default").await.body["status"]["phase"],
        "Active"
    );
}

#[tokio::test]
async fn malformed_requests_get_a_4xx_status_never_a_crash() {
    let a = api().await;
    a.post(CMS, cm("c", json!({}))).await;
    let deep = format!("{}{}", "[".repeat(5000), "]".repeat(5000));
    let bodies: Vec<String> = vec![
        "".into(),
        "null".into(),
        "[]".into(),
        "\"x\"".into(),
        "42".into(),
        r#"{"metadata": "x"}"#.into(),
        r#"{"metadata": {"name": 5}}"#.into(),
        r#"{"metadata": {"name": "c", "labels": "x"}}"#.into(),
        r#"{"metadata": {"name": "c", "labels": {"a": ["b"]}}}"#.into(),
        r#"{"metadata": {"name": "c", "finalizers": [1, 2]}}"#.into(),
        r#"{"metadata": {"name": "c", "ownerReferences": {}}}"#.into(),
        r#"{"data": [1, 2], "metadata": {"name": "c"}}"#.into(),
        r#"{"apiVersion": 7, "metadata": {"name": "c"}}"#.into(),
        r#"{"metadata": {"name": "c", "resourceVersion": "abc"}}"#.into(),
        deep,
        "{\"metadata\": {\"name\": \"\u{0000}\"}}".into(),
    ];
    let paths = [
        ("POST", CMS.to_string(), "application/json"),
        ("PUT", format!("{CMS}/c"), "application/json"),
        ("PATCH", format!("{CMS}/c"), "application/merge-patch+json"),
        (
            "PATCH",
            format!("{CMS}/c"),
            "application/strategic-merge-patch+json",
        ),
        ("PATCH", format!("{CMS}/c"), "application/json-patch+json"),
        (
            "PATCH",
            format!("{CMS}/c?fieldManager=t"),
            "application/apply-patch+yaml",
        ),
        (
            "POST",
            "/api/v1/namespaces/default/pods".to_string(),
            "application/json",
        ),
        (
            "POST",
            "/apis/apps/v1/namespaces/default/deployments".to_string(),
            "application/json",
        ),
        (
            "POST",
            "/api/v1/namespaces/default/pods/p/binding".to_string(),
            "application/json",
        ),
        (
            "POST",
            "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews".to_string(),
            "application/json",
        ),
        (
            "POST",
            CMS.to_string(),
            "application/vnd.kubernetes.protobuf",
        ),
        ("DELETE", format!("{CMS}/c?dryRun=All"), "application/json"),
    ];
    for (method, path, ct) in &paths {
        for body in &bodies {
            let r = a.req(method, path, ct, body.clone()).await;
            assert!(
                r.status.is_client_error() || r.status.is_success(),
                "{method} {path} ({ct}) with {:.60} answered {}: {}",
                body,
                r.status,
                r.body
            );
            if r.status.is_client_error() {
                assert_eq!(r.body["kind"], "Status", "{method} {path} {body:.60}");
            }
        }
    }
    // The configmap is still readable and well formed.
    let c = a.get(&format!("{CMS}/c")).await;
    assert_eq!(c.status, StatusCode::OK);
    assert!(c.body["metadata"]["name"].is_string());
}

#[tokio::test]
async fn the_finalize_subresource_changes_only_spec_finalizers() {
    let a = api().await;
    a.post("/api/v1/namespaces", json!({"metadata": {"name": "f"}}))
        .await;
    let mut ns = a.get("/api/v1/namespaces/f").await.body;
    assert_eq!(ns["spec"]["finalizers"], json!(["kubernetes"]));
    ns["spec"]["finalizers"] = json!([]);
    ns["metadata"]["labels"] = json!({"sneaky": "yes"});
    let r = a.put("/api/v1/namespaces/f/finalize", ns).await;
    assert_eq!(r.status, StatusCode::OK);
    let after = a.get("/api/v1/namespaces/f").await.body;
    assert_eq!(after["spec"]["finalizers"], json!([]));
    assert_eq!(
        after["metadata"]["labels"],
        json!({"kubernetes.io/metadata.name": "f"}),
        "{after}"
    );
}

fn deployment(name: &str) -> Value {
    json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name},
        "spec": {"selector": {"matchLabels": {"app": name}},
            "template": {"metadata": {"labels": {"app": name}},
                "spec": {"containers": [{"name": "c", "image": "i:1"}]}}}})
}

fn finalizers_of(v: &Value) -> Value {
    v["metadata"]["finalizers"].clone()
}

#[tokio::test]
async fn delete_propagation_sets_the_garbage_collectors_finalizers() {
    let a = api().await;
    let deps = "/apis/apps/v1/namespaces/default/deployments";
    assert_eq!(
        a.post(deps, deployment("fg")).await.status,
        StatusCode::CREATED
    );
    // Foreground: the object stays, marked for deletion, until the garbage
    // collector removes `foregroundDeletion`.
    let d = a
        .delete(&format!("{deps}/fg?propagationPolicy=Foreground"))
        .await;
    assert_eq!(d.status, StatusCode::OK, "{}", d.body);
    assert_eq!(
        d.body["kind"], "Deployment",
        "the pending object is returned"
    );
    assert_eq!(finalizers_of(&d.body), json!(["foregroundDeletion"]));
    let held = a.get(&format!("{deps}/fg")).await.body;
    assert!(held["metadata"]["deletionTimestamp"].is_string(), "{held}");
    assert_eq!(held["metadata"]["deletionGracePeriodSeconds"], 0);
    assert_eq!(finalizers_of(&held), json!(["foregroundDeletion"]));
    // The same delete again changes nothing.
    let again = a
        .delete(&format!("{deps}/fg?propagationPolicy=Foreground"))
        .await;
    assert_eq!(again.status, StatusCode::OK);
    assert_eq!(
        again.body["metadata"]["resourceVersion"],
        held["metadata"]["resourceVersion"]
    );
    // A second delete with another policy swaps the finalizer.
    let o = a
        .delete(&format!("{deps}/fg?propagationPolicy=Orphan"))
        .await;
    assert_eq!(o.status, StatusCode::OK);
    assert_eq!(finalizers_of(&o.body), json!(["orphan"]));
    assert_eq!(
        o.body["metadata"]["deletionTimestamp"], held["metadata"]["deletionTimestamp"],
        "the deletion timestamp stays"
    );
    // Background leaves no finalizer, so the object goes at once.
    let b = a
        .delete(&format!("{deps}/fg?propagationPolicy=Background"))
        .await;
    assert_eq!(b.status, StatusCode::OK);
    assert_eq!(b.body["kind"], "Status", "{}", b.body);
    assert_eq!(
        a.get(&format!("{deps}/fg")).await.status,
        StatusCode::NOT_FOUND
    );

    // Background (the default for most kinds) deletes at once.
    a.post(deps, deployment("bg")).await;
    assert_eq!(a.delete(&format!("{deps}/bg")).await.status, StatusCode::OK);
    assert_eq!(
        a.get(&format!("{deps}/bg")).await.status,
        StatusCode::NOT_FOUND
    );
}

#[tokio::test]
async fn gc_finalizers_join_other_finalizers_and_orphan_dependents_is_honoured() {
    let a = api().await;
    let mut c = cm("held", json!({}));
    c["metadata"]["finalizers"] = json!(["example.com/hold"]);
    a.post(CMS, c).await;
    let d = a
        .req(
            "DELETE",
            &format!("{CMS}/held"),
            "application/json",
            r#"{"kind":"DeleteOptions","apiVersion":"v1","propagationPolicy":"Foreground"}"#,
        )
        .await;
    assert_eq!(d.status, StatusCode::OK);
    assert_eq!(
        finalizers_of(&d.body),
        json!(["example.com/hold", "foregroundDeletion"])
    );
    // Its own finalizer released, the object still waits for the collector.
    let mut released = a.get(&format!("{CMS}/held")).await.body;
    released["metadata"]["finalizers"] = json!(["foregroundDeletion"]);
    assert_eq!(
        a.put(&format!("{CMS}/held"), released).await.status,
        StatusCode::OK
    );
    assert_eq!(a.get(&format!("{CMS}/held")).await.status, StatusCode::OK);

    // The deprecated orphanDependents, as a query parameter and in the body.
    a.post(CMS, cm("o1", json!({}))).await;
    let o = a.delete(&format!("{CMS}/o1?orphanDependents=true")).await;
    assert_eq!(finalizers_of(&o.body), json!(["orphan"]));
    a.post(CMS, cm("o2", json!({}))).await;
    let o = a
        .req(
            "DELETE",
            &format!("{CMS}/o2"),
            "application/json",
            r#"{"orphanDependents":true}"#,
        )
        .await;
    assert_eq!(finalizers_of(&o.body), json!(["orphan"]));
    // orphanDependents=false overrides the orphan finalizer: gone.
    let gone = a.delete(&format!("{CMS}/o2?orphanDependents=false")).await;
    assert_eq!(gone.status, StatusCode::OK);
    assert_eq!(
        a.get(&format!("{CMS}/o2")).await.status,
        StatusCode::NOT_FOUND
    );
    // Both at once is invalid.
    let both = a
        .delete(&format!(
            "{CMS}/o1?orphanDependents=true&propagationPolicy=Orphan"
        ))
        .await;
    assert_eq!(
        both.status,
        StatusCode::UNPROCESSABLE_ENTITY,
        "{}",
        both.body
    );
    assert!(both.body["message"]
        .as_str()
        .unwrap()
        .contains("orphanDependents and deletionPropagation cannot be both set"));
    let bad = a
        .delete(&format!("{CMS}/o1?propagationPolicy=Sideways"))
        .await;
    assert_eq!(bad.status, StatusCode::UNPROCESSABLE_ENTITY);
}

#[tokio::test]
async fn batch_v1_jobs_orphan_their_pods_by_default_and_warn() {
    let a = api().await;
    let jobs = "/apis/batch/v1/namespaces/default/jobs";
    let job = |n: &str| {
        json!({"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": n},
        "spec": {"template": {"spec": {"restartPolicy": "Never", "containers": [{"name": "c", "image": "i:1"}]}}}})
    };
    assert_eq!(a.post(jobs, job("j1")).await.status, StatusCode::CREATED);
    let d = a.delete(&format!("{jobs}/j1")).await;
    assert_eq!(d.status, StatusCode::OK);
    let warning = d
        .headers
        .get("warning")
        .map(|v| v.to_str().unwrap().to_string())
        .unwrap_or_default();
    assert!(
        warning.contains("child pods are preserved by default when jobs are deleted"),
        "{warning}"
    );
    assert_eq!(finalizers_of(&d.body), json!(["orphan"]));
    a.post(jobs, job("j2")).await;
    let d = a
        .delete(&format!("{jobs}/j2?propagationPolicy=Background"))
        .await;
    assert!(d.headers.get("warning").is_none());
    assert_eq!(
        a.get(&format!("{jobs}/j2")).await.status,
        StatusCode::NOT_FOUND
    );
}

const PODS: &str = "/api/v1/namespaces/default/pods";

fn pod_with(name: &str, resources: Value) -> Value {
    json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
        "spec": {"containers": [{"name": "c", "image": "i:1", "resources": resources}]}})
}

fn message(r: &Resp) -> String {
    r.body["message"].as_str().unwrap_or("").to_string()
}

#[tokio::test]
async fn pods_get_a_service_account_default_tolerations_and_a_priority() {
    let a = api().await;
    let p = a.post(PODS, pod_with("p", json!({}))).await;
    assert_eq!(p.status, StatusCode::CREATED, "{}", p.body);
    let spec = &p.body["spec"];
    assert_eq!(spec["serviceAccountName"], "default");
    assert_eq!(spec["priority"], 0);
    assert_eq!(spec["preemptionPolicy"], "PreemptLowerPriority");
    assert_eq!(
        spec["tolerations"],
        json!([
            {"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300},
            {"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300}
        ])
    );
    // A pod that tolerates one keeps its own.
    let mut own = pod_with("own", json!({}));
    own["spec"]["tolerations"] = json!([{"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 10}]);
    let t = a.post(PODS, own).await.body["spec"]["tolerations"].clone();
    assert_eq!(t.as_array().unwrap().len(), 2);
    assert_eq!(t[0]["tolerationSeconds"], 10);

    // Priority classes: built-in, user-defined, the global default, unknown.
    let pcs = "/apis/scheduling.k8s.io/v1/priorityclasses";
    let listed = a.get(pcs).await.body;
    let names: Vec<&str> = listed["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["metadata"]["name"].as_str().unwrap())
        .collect();
    assert!(names.contains(&"system-node-critical"), "{names:?}");
    let mut crit = pod_with("crit", json!({}));
    crit["spec"]["priorityClassName"] = json!("system-cluster-critical");
    assert_eq!(
        a.post(PODS, crit).await.body["spec"]["priority"],
        2_000_000_000
    );
    let mut unknown = pod_with("unknown", json!({}));
    unknown["spec"]["priorityClassName"] = json!("nope");
    let r = a.post(PODS, unknown).await;
    assert_eq!(r.status, StatusCode::FORBIDDEN);
    assert_eq!(r.body["reason"], "Forbidden");
    assert_eq!(
        message(&r),
        "pods \"unknown\" is forbidden: no PriorityClass with name nope was found"
    );
    let pc = |n: &str, v: i64, d: bool| json!({"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass", "metadata": {"name": n}, "value": v, "globalDefault": d});
    assert_eq!(
        a.post(pcs, pc("everyone", 42, true)).await.status,
        StatusCode::CREATED
    );
    let second = a.post(pcs, pc("another", 7, true)).await;
    assert_eq!(second.status, StatusCode::FORBIDDEN);
    assert!(message(&second).contains(
        "PriorityClass everyone is already marked as default. Only one default can exist"
    ));
    let d = a.post(PODS, pod_with("dflt", json!({}))).await.body;
    assert_eq!(d["spec"]["priority"], 42);
    assert_eq!(d["spec"]["priorityClassName"], "everyone");
}

#[tokio::test]
async fn limit_ranges_default_and_bound_container_resources() {
    let a = api().await;
    let lr = json!({"apiVersion": "v1", "kind": "LimitRange", "metadata": {"name": "lr"},
        "spec": {"limits": [{"type": "Container",
            "default": {"cpu": "500m", "memory": "256Mi"},
            "defaultRequest": {"cpu": "100m"},
            "min": {"cpu": "50m"}, "max": {"cpu": "1"}, "maxLimitRequestRatio": {"cpu": "10"}}]}});
    let created = a.post("/api/v1/namespaces/default/limitranges", lr).await;
    assert_eq!(created.status, StatusCode::CREATED, "{}", created.body);
    // The stored LimitRange shows Kubernetes' item defaults.
    assert_eq!(
        created.body["spec"]["limits"][0]["defaultRequest"]["memory"],
        "256Mi"
    );
    let p = a.post(PODS, pod_with("d", json!({}))).await;
    assert_eq!(p.status, StatusCode::CREATED, "{}", p.body);
    let r = &p.body["spec"]["containers"][0]["resources"];
    assert_eq!(r["limits"], json!({"cpu": "500m", "memory": "256Mi"}));
    assert_eq!(r["requests"], json!({"cpu": "100m", "memory": "256Mi"}));
    assert!(
        p.body["metadata"]["annotations"]["kubernetes.io/limit-ranger"]
            .as_str()
            .unwrap()
            .starts_with("LimitRanger plugin set: ")
    );
    assert_eq!(p.body["status"]["qosClass"], "Burstable");
    let big = a
        .post(PODS, pod_with("big", json!({"limits": {"cpu": "2"}})))
        .await;
    assert_eq!(big.status, StatusCode::FORBIDDEN, "{}", big.body);
    assert_eq!(
        message(&big),
        "pods \"big\" is forbidden: maximum cpu usage per Container is 1, but limit is 2"
    );
    let small = a
        .post(
            PODS,
            pod_with(
                "small",
                json!({"requests": {"cpu": "10m"}, "limits": {"cpu": "500m"}}),
            ),
        )
        .await;
    assert_eq!(small.status, StatusCode::FORBIDDEN);
    assert!(
        message(&small).contains("minimum cpu usage per Container is 50m, but request is 10m"),
        "{}",
        message(&small)
    );
    assert_eq!(
        a.get(&format!("{PODS}/big")).await.status,
        StatusCode::NOT_FOUND
    );
}

#[tokio::test]
async fn resource_quotas_refuse_what_exceeds_them() {
    let a = api().await;
    let quotas = "/api/v1/namespaces/default/resourcequotas";
    let q = json!({"apiVersion": "v1", "kind": "ResourceQuota", "metadata": {"name": "q"},
        "spec": {"hard": {"pods": "2", "requests.cpu": "1", "configmaps": "1"}}});
    let created = a.post(quotas, q).await;
    assert_eq!(created.status, StatusCode::CREATED, "{}", created.body);
    assert_eq!(created.body["status"]["used"]["pods"], "0");
    // A pod without a cpu request cannot be counted.
    let none = a.post(PODS, pod_with("none", json!({}))).await;
    assert_eq!(none.status, StatusCode::FORBIDDEN);
    assert_eq!(
        message(&none),
        "pods \"none\" is forbidden: failed quota: q: must specify requests.cpu for: c"
    );
    let cpu = |n: &str, c: &str| pod_with(n, json!({"requests": {"cpu": c}}));
    assert_eq!(
        a.post(PODS, cpu("a", "600m")).await.status,
        StatusCode::CREATED
    );
    let over = a.post(PODS, cpu("b", "500m")).await;
    assert_eq!(over.status, StatusCode::FORBIDDEN);
    assert_eq!(
        message(&over),
        "pods \"b\" is forbidden: exceeded quota: q, requested: requests.cpu=500m, used: requests.cpu=600m, limited: requests.cpu=1"
    );
    assert_eq!(
        a.post(PODS, cpu("b", "400m")).await.status,
        StatusCode::CREATED
    );
    let third = a.post(PODS, cpu("c", "1m")).await;
    assert_eq!(third.status, StatusCode::FORBIDDEN);
    assert!(message(&third).contains("exceeded quota: q, requested: pods=1,requests.cpu=1m, used: pods=2,requests.cpu=1, limited: pods=2,requests.cpu=1"), "{}", message(&third));
    // The quota's status shows the usage.
    let q = a.get(&format!("{quotas}/q")).await.body;
    assert_eq!(q["status"]["used"]["pods"], "2", "{q}");
    assert_eq!(q["status"]["used"]["requests.cpu"], "1");
    // Deleting frees room (usage is counted from the objects).
    a.delete(&format!("{PODS}/a")).await;
    assert_eq!(
        a.post(PODS, cpu("c", "1m")).await.status,
        StatusCode::CREATED
    );
    // Object counts.
    assert_eq!(
        a.post(CMS, cm("one", json!({}))).await.status,
        StatusCode::CREATED
    );
    let two = a.post(CMS, cm("two", json!({}))).await;
    assert_eq!(two.status, StatusCode::FORBIDDEN);
    assert!(message(&two).contains(
        "exceeded quota: q, requested: configmaps=1, used: configmaps=1, limited: configmaps=1"
    ));
}

async fn running(a: &Api, name: &str) {
    let mut p = pod_with(name, json!({}));
    p["metadata"]["labels"] = json!({"app": "web"});
    assert_eq!(a.post(PODS, p).await.status, StatusCode::CREATED);
    let mut st = a.get(&format!("{PODS}/{name}")).await.body;
    st["status"]["phase"] = json!("Running");
    st["status"]["conditions"] = json!([{"type": "Ready", "status": "True"}]);
    let r = a.put(&format!("{PODS}/{name}/status"), st).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
}

async fn evict(a: &Api, name: &str) -> Resp {
    let body = json!({"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": name, "namespace": "default"}, "deleteOptions": {"gracePeriodSeconds": 0}});
    a.post(&format!("{PODS}/{name}/eviction"), body).await
}

async fn set_allowed(a: &Api, n: i64) {
    let pdbs = "/apis/policy/v1/namespaces/default/poddisruptionbudgets";
    let mut cur = a.get(&format!("{pdbs}/web")).await.body;
    cur["status"] = json!({"observedGeneration": 1, "disruptionsAllowed": n, "currentHealthy": 2, "desiredHealthy": 1, "expectedPods": 2});
    let r = a.put(&format!("{pdbs}/web/status"), cur).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
}

#[tokio::test]
async fn eviction_respects_the_pods_disruption_budget() {
    let a = api().await;
    let pdbs = "/apis/policy/v1/namespaces/default/poddisruptionbudgets";
    // No budget: the pod goes.
    running(&a, "free").await;
    assert_eq!(evict(&a, "free").await.status, StatusCode::CREATED);
    assert_eq!(
        a.get(&format!("{PODS}/free")).await.status,
        StatusCode::NOT_FOUND
    );
    assert_eq!(evict(&a, "free").await.status, StatusCode::NOT_FOUND);

    let pdb = json!({"apiVersion": "policy/v1", "kind": "PodDisruptionBudget", "metadata": {"name": "web"},
        "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "web"}}}});
    let created = a.post(pdbs, pdb).await;
    assert_eq!(created.status, StatusCode::CREATED, "{}", created.body);
    running(&a, "w1").await;
    running(&a, "w2").await;
    // Not yet processed by the disruption controller: refused.
    let r = evict(&a, "w1").await;
    assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS, "{}", r.body);
    set_allowed(&a, 0).await;
    let r = evict(&a, "w1").await;
    assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(r.body["reason"], "TooManyRequests");
    assert_eq!(
        message(&r),
        "Cannot evict pod as it would violate the pod's disruption budget."
    );
    assert_eq!(r.body["details"]["causes"][0]["reason"], "DisruptionBudget");
    assert_eq!(
        r.body["details"]["causes"][0]["message"],
        "The disruption budget web needs 1 healthy pods and has 2 currently"
    );
    assert_eq!(a.get(&format!("{PODS}/w1")).await.status, StatusCode::OK);
    // One disruption allowed: the first eviction takes it, the second waits.
    set_allowed(&a, 1).await;
    assert_eq!(evict(&a, "w1").await.status, StatusCode::CREATED);
    assert_eq!(
        a.get(&format!("{PODS}/w1")).await.status,
        StatusCode::NOT_FOUND
    );
    let status = a.get(&format!("{pdbs}/web")).await.body["status"].clone();
    assert_eq!(status["disruptionsAllowed"], 0, "{status}");
    assert!(status["disruptedPods"]["w1"].is_string(), "{status}");
    assert_eq!(evict(&a, "w2").await.status, StatusCode::TOO_MANY_REQUESTS);
    // A pod that is not running goes without a budget check.
    let mut pending = pod_with("pending", json!({}));
    pending["metadata"]["labels"] = json!({"app": "web"});
    a.post(PODS, pending).await;
    assert_eq!(evict(&a, "pending").await.status, StatusCode::CREATED);
    // Two budgets over one pod: Kubernetes refuses with 500.
    let second = json!({"apiVersion": "policy/v1", "kind": "PodDisruptionBudget", "metadata": {"name": "again"},
        "spec": {"maxUnavailable": 1, "selector": {"matchLabels": {"app": "web"}}}});
    a.post(pdbs, second).await;
    let r = evict(&a, "w2").await;
    assert_eq!(r.status, StatusCode::INTERNAL_SERVER_ERROR);
    assert!(message(&r).contains("more than one PodDisruptionBudget"));
}

#[tokio::test]
async fn namespaces_carry_their_name_label_which_cannot_change() {
    let a = api().await;
    let d = a.get("/api/v1/namespaces/default").await.body;
    assert_eq!(
        d["metadata"]["labels"]["kubernetes.io/metadata.name"],
        "default"
    );
    let created = a
        .post("/api/v1/namespaces", json!({"metadata": {"name": "team", "labels": {"kubernetes.io/metadata.name": "other"}}}))
        .await;
    assert_eq!(
        created.body["metadata"]["labels"]["kubernetes.io/metadata.name"],
        "team"
    );
    let mut ns = created.body.clone();
    ns["metadata"]["labels"] = json!({"a": "b"});
    let updated = a.put("/api/v1/namespaces/team", ns).await;
    assert_eq!(updated.status, StatusCode::OK);
    assert_eq!(
        updated.body["metadata"]["labels"],
        json!({"a": "b", "kubernetes.io/metadata.name": "team"})
    );
}

#[tokio::test]
async fn jobs_get_a_selector_generated_from_their_uid() {
    let a = api().await;
    let jobs = "/apis/batch/v1/namespaces/default/jobs";
    let job = json!({"metadata": {"name": "once"}, "spec": {"template": {"spec": {"restartPolicy": "Never", "containers": [{"name": "c", "image": "i:1"}]}}}});
    let j = a.post(jobs, job).await;
    assert_eq!(j.status, StatusCode::CREATED, "{}", j.body);
    let uid = j.body["metadata"]["uid"].as_str().unwrap();
    assert_eq!(
        j.body["spec"]["selector"],
        json!({"matchLabels": {"batch.kubernetes.io/controller-uid": uid}})
    );
    assert_eq!(
        j.body["spec"]["template"]["metadata"]["labels"],
        json!({"job-name": "once", "batch.kubernetes.io/job-name": "once", "controller-uid": uid, "batch.kubernetes.io/controller-uid": uid})
    );
    let manual = json!({"metadata": {"name": "manual"}, "spec": {"manualSelector": true, "selector": {"matchLabels": {"x": "y"}},
        "template": {"metadata": {"labels": {"x": "y"}}, "spec": {"restartPolicy": "Never", "containers": [{"name": "c", "image": "i:1"}]}}}});
    let m = a.post(jobs, manual).await.body;
    assert_eq!(m["spec"]["selector"], json!({"matchLabels": {"x": "y"}}));
    assert_eq!(
        m["spec"]["template"]["metadata"]["labels"],
        json!({"x": "y"})
    );
}

#[tokio::test]
async fn configmaps_and_secrets_hold_at_most_1_mib() {
    let a = api().await;
    let mut big = cm("big", json!({}));
    big["data"] = json!({"a": "x".repeat(1024 * 1024 + 1)});
    let r = a.post(CMS, big).await;
    assert_eq!(r.status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(
        message(&r),
        "ConfigMap \"big\" is invalid: []: Too long: must have at most 1048576 bytes"
    );
    let mut fits = cm("fits", json!({}));
    fits["data"] = json!({"a": "x".repeat(1024 * 1024)});
    assert_eq!(a.post(CMS, fits).await.status, StatusCode::CREATED);
    use base64::Engine;
    let b64 = base64::engine::general_purpose::STANDARD.encode(vec![0u8; 1024 * 1024 + 1]);
    let s = json!({"metadata": {"name": "s"}, "data": {"k": b64}});
    let r = a.post("/api/v1/namespaces/default/secrets", s).await;
    assert_eq!(r.status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(
        message(&r),
        "Secret \"s\" is invalid: data: Too long: must have at most 1048576 bytes"
    );
}

#[tokio::test]
async fn a_scale_is_replaced_with_an_autoscaling_v1_scale_and_a_stale_one_conflicts() {
    let a = api().await;
    let deps = "/apis/apps/v1/namespaces/default/deployments";
    let mut d = deployment("web");
    d["spec"]["replicas"] = json!(1);
    assert_eq!(a.post(deps, d).await.status, StatusCode::CREATED);
    let scale = a.get(&format!("{deps}/web/scale")).await.body;
    let mut want = scale.clone();
    want["spec"]["replicas"] = json!(3);
    let r = a.put(&format!("{deps}/web/scale"), want).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    assert_eq!(r.body["kind"], "Scale");
    assert_eq!(r.body["spec"]["replicas"], 3);
    let d = a.get(&format!("{deps}/web")).await.body;
    assert_eq!(d["spec"]["replicas"], 3);
    // The Scale read before the write names an old resourceVersion.
    let mut stale = scale;
    stale["spec"]["replicas"] = json!(5);
    let r = a.put(&format!("{deps}/web/scale"), stale).await;
    assert_eq!(r.status, StatusCode::CONFLICT, "{}", r.body);
    let mut wrong = json!({"apiVersion": "apps/v1", "kind": "Deployment", "spec": {"replicas": 2}});
    wrong["metadata"] = json!({"name": "web"});
    let r = a.put(&format!("{deps}/web/scale"), wrong).await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST, "{}", r.body);
}

#[tokio::test]
async fn the_scale_subresource_answers_a_table_request() {
    let a = api().await;
    let deps = "/apis/apps/v1/namespaces/default/deployments";
    let mut d = deployment("web");
    d["spec"]["replicas"] = json!(4);
    a.post(deps, d).await;
    let r = a
        .req(
            "GET",
            &format!("{deps}/web/scale"),
            "application/json",
            Body::empty(),
        )
        .await;
    assert_eq!(r.body["kind"], "Scale");
    let req = Request::builder()
        .uri(format!("{deps}/web/scale"))
        .header(
            "accept",
            "application/json;as=Table;v=v1;g=meta.k8s.io,application/json",
        )
        .body(Body::empty())
        .unwrap();
    let resp = a.router.clone().oneshot(req).await.unwrap();
    let t: Value =
        serde_json::from_slice(&resp.into_body().collect().await.unwrap().to_bytes()).unwrap();
    assert_eq!(t["kind"], "Table");
    let names: Vec<&str> = t["columnDefinitions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["Name", "Desired", "Available", "Age"]);
    assert_eq!(t["rows"][0]["cells"][0], "web");
    assert_eq!(t["rows"][0]["cells"][1], 4);
    assert_eq!(t["rows"][0]["cells"][2], 0);
}

#[tokio::test]
async fn secret_string_data_is_merged_into_data_and_never_stored() {
    let a = api().await;
    let secrets = "/api/v1/namespaces/default/secrets";
    let s = json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "s"},
        "data": {"keep": "a2VlcA==", "pw": "b2xk"}, "stringData": {"pw": "hunter2", "user": "me"}});
    let created = a.post(secrets, s).await;
    assert_eq!(created.status, StatusCode::CREATED, "{}", created.body);
    // stringData wins over data for the same key and is gone from the answer.
    let want = json!({"keep": "a2VlcA==", "pw": "aHVudGVyMg==", "user": "bWU="});
    assert_eq!(created.body["data"], want);
    assert!(created.body.get("stringData").is_none(), "{}", created.body);
    let read = a.get(&format!("{secrets}/s")).await.body;
    assert_eq!(read["data"], want);
    assert!(read.get("stringData").is_none());
    // On update and on patch too.
    let mut upd = read.clone();
    upd["stringData"] = json!({"user": "you"});
    let put = a.put(&format!("{secrets}/s"), upd).await;
    assert_eq!(put.status, StatusCode::OK, "{}", put.body);
    assert_eq!(put.body["data"]["user"], "eW91");
    assert!(put.body.get("stringData").is_none());
    let patched = a
        .req(
            "PATCH",
            &format!("{secrets}/s"),
            "application/merge-patch+json",
            json!({"stringData": {"new": "x"}}).to_string(),
        )
        .await;
    assert_eq!(patched.status, StatusCode::OK, "{}", patched.body);
    assert_eq!(patched.body["data"]["new"], "eA==");
    assert_eq!(patched.body["data"]["keep"], "a2VlcA==");
    assert!(patched.body.get("stringData").is_none());
    // A bad key in stringData is refused like one in data.
    let bad = json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "bad"},
        "stringData": {"no/slash": "x"}});
    assert_eq!(
        a.post(secrets, bad).await.status,
        StatusCode::UNPROCESSABLE_ENTITY
    );
}

#[tokio::test]
async fn a_statefulset_may_mount_its_volume_claim_templates() {
    let a = api().await;
    let sts = |mount: &str| {
        json!({"apiVersion": "apps/v1", "kind": "StatefulSet", "metadata": {"name": format!("db-{mount}")},
        "spec": {"serviceName": "db", "selector": {"matchLabels": {"app": "db"}},
            "template": {"metadata": {"labels": {"app": "db"}}, "spec": {"containers": [{
                "name": "c", "image": "db:1",
                "volumeMounts": [{"name": mount, "mountPath": "/data"}]}]}},
            "volumeClaimTemplates": [{"metadata": {"name": "data"},
                "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}}}]}})
    };
    let path = "/apis/apps/v1/namespaces/default/statefulsets";
    let ok = a.post(path, sts("data")).await;
    assert_eq!(ok.status, StatusCode::CREATED, "{}", ok.body);
    // A mount of a volume that is neither in the pod nor a claim template
    // is still refused, with the field named.
    let bad = a.post(path, sts("other")).await;
    assert_eq!(bad.status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(
        bad.body["details"]["causes"][0]["field"],
        "spec.template.spec.containers[0].volumeMounts[0].name"
    );
}

#[tokio::test]
async fn new_objects_come_back_with_the_status_kubernetes_initialises() {
    let a = api().await;
    let svc = json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "web"},
        "spec": {"selector": {"app": "web"}, "ports": [{"port": 80}]}});
    let services = "/api/v1/namespaces/default/services";
    let created = a.post(services, svc).await;
    assert_eq!(created.status, StatusCode::CREATED, "{}", created.body);
    assert_eq!(created.body["status"], json!({"loadBalancer": {}}));
    assert_eq!(
        a.get(&format!("{services}/web")).await.body["status"],
        json!({"loadBalancer": {}})
    );
    let patched = a
        .req(
            "PATCH",
            &format!("{services}/web"),
            "application/merge-patch+json",
            json!({"metadata": {"labels": {"x": "y"}}}).to_string(),
        )
        .await;
    assert_eq!(patched.body["status"], json!({"loadBalancer": {}}));
    // Emptying the status through the subresource keeps the zero value.
    let mut s = patched.body.clone();
    s["status"] = json!({});
    let put = a.put(&format!("{services}/web/status"), s).await;
    assert_eq!(put.status, StatusCode::OK, "{}", put.body);
    assert_eq!(put.body["status"], json!({"loadBalancer": {}}));
    let rs = json!({"apiVersion": "apps/v1", "kind": "ReplicaSet", "metadata": {"name": "rs"},
        "spec": {"selector": {"matchLabels": {"a": "b"}},
            "template": {"metadata": {"labels": {"a": "b"}}, "spec": {"containers": [{"name": "c", "image": "i"}]}}}});
    let created = a
        .post("/apis/apps/v1/namespaces/default/replicasets", rs)
        .await;
    assert_eq!(created.body["status"], json!({"replicas": 0}));
    let d = a
        .post(
            "/apis/apps/v1/namespaces/default/deployments",
            deployment("d"),
        )
        .await;
    assert_eq!(d.body["status"], json!({}));
}

#[tokio::test]
async fn deletes_answer_the_object_for_the_kinds_kubernetes_does_and_a_status_otherwise() {
    let a = api().await;
    let services = "/api/v1/namespaces/default/services";
    let svc = json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "web"},
        "spec": {"ports": [{"port": 80}]}});
    assert_eq!(a.post(services, svc).await.status, StatusCode::CREATED);
    let d = a.delete(&format!("{services}/web")).await;
    assert_eq!(d.status, StatusCode::OK);
    assert_eq!(d.body["kind"], "Service", "{}", d.body);
    assert_eq!(d.body["metadata"]["name"], "web");
    let sas = "/api/v1/namespaces/default/serviceaccounts";
    let sa = json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "robot"}});
    assert_eq!(a.post(sas, sa).await.status, StatusCode::CREATED);
    let d = a.delete(&format!("{sas}/robot")).await;
    assert_eq!(d.body["kind"], "ServiceAccount", "{}", d.body);
    // A ConfigMap's delete answers a Success Status naming it.
    assert_eq!(
        a.post(CMS, cm("c", json!({}))).await.status,
        StatusCode::CREATED
    );
    let d = a.delete(&format!("{CMS}/c")).await;
    assert_eq!(d.status, StatusCode::OK);
    assert_eq!(d.body["kind"], "Status");
    assert_eq!(d.body["status"], "Success");
    assert_eq!(d.body["details"]["name"], "c");
}

/// A live watch's response body, read line by line.
async fn open_watch(a: &Api, path: &str) -> axum::body::BodyDataStream {
    let r = Request::builder().uri(path).body(Body::empty()).unwrap();
    let resp = a.router.clone().oneshot(r).await.unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    resp.into_body().into_data_stream()
}

async fn next_events(
    stream: &mut axum::body::BodyDataStream,
    buf: &mut Vec<u8>,
    n: usize,
) -> Vec<Value> {
    let mut out = Vec::new();
    loop {
        while let Some(i) = buf.iter().position(|b| *b == b'\n') {
            let line: Vec<u8> = buf.drain(..=i).collect();
            out.push(serde_json::from_slice(&line).unwrap());
            if out.len() == n {
                return out;
            }
        }
        match tokio::time::timeout(Duration::from_secs(10), stream.next())
            .await
            .expect("an event within 10 s")
        {
            Some(chunk) => buf.extend_from_slice(&chunk.unwrap()),
            None => return out,
        }
    }
}

fn summary(evs: &[Value]) -> Vec<String> {
    evs.iter()
        .map(|e| {
            format!(
                "{} {}",
                e["type"].as_str().unwrap(),
                e["object"]["metadata"]["name"].as_str().unwrap_or("")
            )
        })
        .collect()
}

#[tokio::test]
async fn live_watches_get_exactly_the_events_their_selectors_concern() {
    let a = api().await;
    let mut by_label = open_watch(&a, &format!("{CMS}?watch=1&labelSelector=app%3Dweb")).await;
    let mut by_name = open_watch(
        &a,
        &format!("{CMS}?watch=1&fieldSelector=metadata.name%3Dc"),
    )
    .await;
    let mut other_ns = open_watch(
        &a,
        "/api/v1/namespaces/kube-public/configmaps?watch=1&labelSelector=app%3Dweb",
    )
    .await;
    let (mut b1, mut b2, mut b3) = (Vec::new(), Vec::new(), Vec::new());
    let c = a.post(CMS, cm("c", json!({"app": "web"}))).await.body;
    let mut moved = c.clone();
    moved["metadata"]["labels"] = json!({"app": "db"});
    assert_eq!(
        a.put(&format!("{CMS}/c"), moved).await.status,
        StatusCode::OK
    );
    assert_eq!(
        a.post(CMS, cm("other", json!({"app": "db"}))).await.status,
        StatusCode::CREATED
    );
    assert_eq!(a.delete(&format!("{CMS}/c")).await.status, StatusCode::OK);
    // A last object each watch selects: what came before it is all it saw.
    a.post(CMS, cm("z", json!({"app": "web"}))).await;
    let mut zc = cm("c", json!({"app": "none"}));
    zc["metadata"]["name"] = json!("c");
    a.post(CMS, zc).await;
    let mut public = cm("p", json!({"app": "web"}));
    public["metadata"]["namespace"] = json!("kube-public");
    a.post("/api/v1/namespaces/kube-public/configmaps", public)
        .await;
    assert_eq!(
        summary(&next_events(&mut by_label, &mut b1, 3).await),
        ["ADDED c", "DELETED c", "ADDED z"]
    );
    assert_eq!(
        summary(&next_events(&mut by_name, &mut b2, 4).await),
        ["ADDED c", "MODIFIED c", "DELETED c", "ADDED c"]
    );
    assert_eq!(
        summary(&next_events(&mut other_ns, &mut b3, 1).await),
        ["ADDED p"]
    );
}

#[tokio::test]
async fn a_watch_whose_client_stops_reading_ends_with_410_and_others_go_on() {
    let a = api().await;
    let mut slow = open_watch(&a, &format!("{CMS}?watch=1")).await;
    let mut fast = open_watch(&a, &format!("{CMS}?watch=1&labelSelector=app%3Dfast")).await;
    let mut fast_buf = Vec::new();
    let n = 1400;
    for i in 0..n {
        let labels = if i % 100 == 0 {
            json!({"app": "fast"})
        } else {
            json!({})
        };
        assert_eq!(
            a.post(CMS, cm(&format!("c{i}"), labels)).await.status,
            StatusCode::CREATED
        );
        if i % 100 == 0 {
            // The reading watch keeps up while the other falls behind.
            let ev = next_events(&mut fast, &mut fast_buf, 1).await;
            assert_eq!(summary(&ev), [format!("ADDED c{i}")]);
        }
    }
    let mut buf = Vec::new();
    let evs = next_events(&mut slow, &mut buf, n + 1).await;
    let last = evs.last().unwrap();
    assert_eq!(last["type"], "ERROR", "{last}");
    assert_eq!(last["object"]["code"], 410);
    assert_eq!(last["object"]["reason"], "Expired");
    // It got a prefix of the events, in order, before it was dropped.
    assert!(evs.len() < n, "{}", evs.len());
    for (i, e) in evs[..evs.len() - 1].iter().enumerate() {
        assert_eq!(summary(std::slice::from_ref(e)), [format!("ADDED c{i}")]);
    }
}

#[tokio::test]
async fn the_kube_dns_service_has_the_cluster_dns_address_and_coredns_labels() {
    let a = api().await;
    let svc = a
        .get("/api/v1/namespaces/kube-system/services/kube-dns")
        .await;
    assert_eq!(svc.status, StatusCode::OK, "{}", svc.body);
    let s = &svc.body;
    assert_eq!(
        s["spec"]["clusterIP"], "10.43.0.10",
        "the 10th address of 10.43.0.0/16"
    );
    assert_eq!(s["spec"]["type"], "ClusterIP");
    assert!(s["spec"].get("selector").is_none(), "{s}");
    let ports: Vec<(String, i64, String)> = s["spec"]["ports"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| {
            (
                p["name"].as_str().unwrap().to_string(),
                p["port"].as_i64().unwrap(),
                p["protocol"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    assert_eq!(
        ports,
        [
            ("dns".to_string(), 53, "UDP".to_string()),
            ("dns-tcp".to_string(), 53, "TCP".to_string()),
            ("metrics".to_string(), 9153, "TCP".to_string())
        ]
    );
    let labels = &s["metadata"]["labels"];
    assert_eq!(labels["k8s-app"], "kube-dns");
    assert_eq!(
        labels["kubernetes.io/cluster-service"], "true",
        "kubectl cluster-info lists it"
    );
    assert_eq!(labels["kubernetes.io/name"], "CoreDNS");
    assert_eq!(
        labels["skiff.io/node-local"], "true",
        "the service proxy skips it"
    );
    // What `kubectl cluster-info` asks for.
    let listed = a
        .get("/api/v1/namespaces/kube-system/services?labelSelector=kubernetes.io%2Fcluster-service%3Dtrue")
        .await;
    let names: Vec<&str> = listed.body["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["metadata"]["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["kube-dns"]);
    // A new service never gets the DNS address.
    let other = a
        .post(
            "/api/v1/namespaces/default/services",
            json!({"metadata": {"name": "x"}, "spec": {"clusterIP": "10.43.0.10", "ports": [{"port": 53}]}}),
        )
        .await;
    assert_eq!(
        other.status,
        StatusCode::UNPROCESSABLE_ENTITY,
        "{}",
        other.body
    );
}

#[tokio::test]
async fn cluster_dns_and_the_service_cidr_choose_the_kube_dns_address() {
    let dir = tempfile::tempdir().unwrap();
    let store: Arc<dyn Store> =
        RedbStore::open(&dir.path().join("s.redb"), Default::default()).unwrap();
    let mut config = skiff_apiserver::Config::default();
    config.registry.service_cidr = ("10.96.0.0".parse().unwrap(), 12);
    let server = skiff_apiserver::ApiServer::start(store.clone(), config.clone())
        .await
        .unwrap();
    let a = Api {
        router: server.in_process_router("test"),
        _dir: tempfile::tempdir().unwrap(),
    };
    let s = a
        .get("/api/v1/namespaces/kube-system/services/kube-dns")
        .await;
    assert_eq!(s.body["spec"]["clusterIP"], "10.96.0.10");

    let dir2 = tempfile::tempdir().unwrap();
    let store2: Arc<dyn Store> =
        RedbStore::open(&dir2.path().join("s.redb"), Default::default()).unwrap();
    config.registry.cluster_dns = Some("10.96.0.53".parse().unwrap());
    let server2 = skiff_apiserver::ApiServer::start(store2, config)
        .await
        .unwrap();
    let b = Api {
        router: server2.in_process_router("test"),
        _dir: dir2,
    };
    let s = b
        .get("/api/v1/namespaces/kube-system/services/kube-dns")
        .await;
    assert_eq!(s.body["spec"]["clusterIP"], "10.96.0.53");
    drop(dir);
}

/// `kubectl get`'s request for `path`: the Table and its column names.
async fn table(a: &Api, path: &str) -> (Value, Vec<String>) {
    let req = Request::builder()
        .uri(path)
        .header("accept", "application/json;as=Table;v=v1;g=meta.k8s.io")
        .body(Body::empty())
        .unwrap();
    let resp = a.router.clone().oneshot(req).await.unwrap();
    let t: Value =
        serde_json::from_slice(&resp.into_body().collect().await.unwrap().to_bytes()).unwrap();
    let names = t["columnDefinitions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["name"].as_str().unwrap().to_string())
        .collect();
    (t, names)
}

/// A kind added as one `kinds/` module and one table row is served whole:
/// discovery, create, validation on create and update, and its table.
#[tokio::test]
async fn ingress_classes_are_served_with_their_rules_and_table() {
    let a = api().await;
    let path = "/apis/networking.k8s.io/v1/ingressclasses";
    let r = a.get("/apis/networking.k8s.io/v1").await;
    assert_eq!(r.status, StatusCode::OK);
    assert!(r.body["resources"]
        .as_array()
        .unwrap()
        .iter()
        .any(|x| x["name"] == "ingressclasses" && x["namespaced"] == false));
    let ic = |controller: Value| {
        json!({"apiVersion": "networking.k8s.io/v1", "kind": "IngressClass",
        "metadata": {"name": "nginx"}, "spec": {"controller": controller}})
    };
    let r = a.post(path, ic(Value::Null)).await;
    assert_eq!(r.status, StatusCode::UNPROCESSABLE_ENTITY, "{}", r.body);
    assert_eq!(r.body["details"]["causes"][0]["field"], "spec.controller");
    let r = a.post(path, ic(json!("k8s.io/ingress-nginx"))).await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.body);
    let mut changed = r.body.clone();
    changed["spec"]["controller"] = json!("example.com/other");
    let r = a.put(&format!("{path}/nginx"), changed).await;
    assert_eq!(r.status, StatusCode::UNPROCESSABLE_ENTITY, "{}", r.body);
    assert!(message(&r).contains("field is immutable"), "{}", r.body);
    let (t, names) = table(&a, path).await;
    assert_eq!(names, ["Name", "Controller", "Parameters", "Age"]);
    assert_eq!(t["rows"][0]["cells"][1], "k8s.io/ingress-nginx");
    assert_eq!(t["rows"][0]["cells"][2], "<none>");
}

/// Ingresses are served (charts ship them even where no controller runs):
/// kube-apiserver's checks, generation, the status subresource, the table.
#[tokio::test]
async fn ingresses_are_served_with_their_checks_status_and_table() {
    let a = api().await;
    let path = "/apis/networking.k8s.io/v1/namespaces/default/ingresses";
    let r = a.get("/apis/networking.k8s.io/v1").await;
    assert!(r.body["resources"]
        .as_array()
        .unwrap()
        .iter()
        .any(|x| x["name"] == "ingresses"
            && x["namespaced"] == true
            && x["shortNames"] == json!(["ing"])));
    assert!(r.body["resources"]
        .as_array()
        .unwrap()
        .iter()
        .any(|x| x["name"] == "ingresses/status"));
    let ing = |path_type: Value| {
        json!({"apiVersion": "networking.k8s.io/v1", "kind": "Ingress", "metadata": {"name": "web"},
            "spec": {"ingressClassName": "nginx", "rules": [{"host": "web.example.com", "http": {"paths": [
                {"path": "/", "pathType": path_type, "backend": {"service": {"name": "web", "port": {"number": 80}}}}]}}]}})
    };
    let r = a.post(path, ing(Value::Null)).await;
    assert_eq!(r.status, StatusCode::UNPROCESSABLE_ENTITY, "{}", r.body);
    assert_eq!(
        message(&r),
        "Ingress.networking.k8s.io \"web\" is invalid: spec.rules[0].http.paths[0].pathType: Required value: pathType must be specified"
    );
    let r = a.post(path, ing(json!("Prefix"))).await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.body);
    assert_eq!(r.body["metadata"]["generation"], 1);
    let mut changed = r.body.clone();
    changed["spec"]["rules"][0]["host"] = json!("www.example.com");
    let r = a.put(&format!("{path}/web"), changed).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    assert_eq!(r.body["metadata"]["generation"], 2);
    let mut status = r.body.clone();
    status["status"] = json!({"loadBalancer": {"ingress": [{"ip": "192.0.2.10"}]}});
    let r = a.put(&format!("{path}/web/status"), status).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    let (t, names) = table(&a, path).await;
    assert_eq!(names, ["Name", "Class", "Hosts", "Address", "Ports", "Age"]);
    let cells = &t["rows"][0]["cells"];
    assert_eq!(
        (&cells[1], &cells[2], &cells[3], &cells[4]),
        (
            &json!("nginx"),
            &json!("www.example.com"),
            &json!("192.0.2.10"),
            &json!("80")
        )
    );
}

/// The DefaultIngressClass and DefaultStorageClass admission plugins fill
/// in the class a new object does not name, and leave a named (or, for
/// claims, an explicitly empty) one alone.
#[tokio::test]
async fn new_ingresses_and_claims_get_the_default_class() {
    let a = api().await;
    for (path, body) in [
        (
            "/apis/networking.k8s.io/v1/ingressclasses",
            json!({"apiVersion": "networking.k8s.io/v1", "kind": "IngressClass",
            "metadata": {"name": "nginx", "annotations": {"ingressclass.kubernetes.io/is-default-class": "true"}},
            "spec": {"controller": "k8s.io/ingress-nginx"}}),
        ),
        (
            "/apis/storage.k8s.io/v1/storageclasses",
            json!({"apiVersion": "storage.k8s.io/v1", "kind": "StorageClass",
            "metadata": {"name": "fast", "annotations": {"storageclass.kubernetes.io/is-default-class": "true"}},
            "provisioner": "example.com/fast"}),
        ),
    ] {
        let r = a.post(path, body).await;
        assert_eq!(r.status, StatusCode::CREATED, "{}", r.body);
    }
    let ing = |name: &str, class: Option<&str>| {
        let mut spec =
            json!({"defaultBackend": {"service": {"name": "web", "port": {"number": 80}}}});
        if let Some(c) = class {
            spec["ingressClassName"] = json!(c);
        }
        json!({"apiVersion": "networking.k8s.io/v1", "kind": "Ingress", "metadata": {"name": name}, "spec": spec})
    };
    let ings = "/apis/networking.k8s.io/v1/namespaces/default/ingresses";
    let r = a.post(ings, ing("plain", None)).await;
    assert_eq!(r.body["spec"]["ingressClassName"], "nginx", "{}", r.body);
    let r = a.post(ings, ing("named", Some("traefik"))).await;
    assert_eq!(r.body["spec"]["ingressClassName"], "traefik");
    let pvc = |name: &str, class: Option<&str>| {
        let mut spec = json!({"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}});
        if let Some(c) = class {
            spec["storageClassName"] = json!(c);
        }
        json!({"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": name}, "spec": spec})
    };
    let pvcs = "/api/v1/namespaces/default/persistentvolumeclaims";
    let r = a.post(pvcs, pvc("data", None)).await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.body);
    assert_eq!(r.body["spec"]["storageClassName"], "fast");
    let r = a.post(pvcs, pvc("static", Some(""))).await;
    assert_eq!(
        r.body["spec"]["storageClassName"], "",
        "an explicit empty class stays"
    );
}

/// `componentstatuses` (deprecated, still served by Kubernetes 1.33): the
/// store checked now, the scheduler and the controller manager by their
/// leader Leases; get and list only, with the deprecation warning.
#[tokio::test]
async fn componentstatuses_report_each_components_health_now() {
    let a = api().await;
    let r = a.get("/api/v1/componentstatuses").await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    assert_eq!(r.body["kind"], "ComponentStatusList");
    let names: Vec<&str> = r.body["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["metadata"]["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["scheduler", "controller-manager", "etcd-0"]);
    assert!(r.headers.get_all("warning").iter().any(|w| w
        .to_str()
        .unwrap()
        .contains("v1 ComponentStatus is deprecated in v1.19+")));
    let etcd = a.get("/api/v1/componentstatuses/etcd-0").await;
    assert_eq!(
        etcd.body["conditions"],
        json!([{"type": "Healthy", "status": "True", "message": "ok"}])
    );
    // No scheduler runs in this server: nobody holds its Lease.
    let s = a.get("/api/v1/componentstatuses/scheduler").await;
    assert_eq!(s.body["conditions"][0]["status"], "False", "{}", s.body);
    assert!(s.body["conditions"][0]["error"]
        .as_str()
        .unwrap()
        .contains("kube-system/kube-scheduler"));
    // A scheduler that holds and renews it is Healthy.
    let now = chrono::Utc::now()
        .format("%Y-%m-%dT%H:%M:%S%.6fZ")
        .to_string();
    let lease = json!({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
        "metadata": {"name": "kube-scheduler"},
        "spec": {"holderIdentity": "s1", "leaseDurationSeconds": 15, "renewTime": now}});
    let r = a
        .post(
            "/apis/coordination.k8s.io/v1/namespaces/kube-system/leases",
            lease,
        )
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.body);
    let s = a.get("/api/v1/componentstatuses/scheduler").await;
    assert_eq!(s.body["conditions"][0]["status"], "True", "{}", s.body);
    // Unknown components and writes.
    assert_eq!(
        a.get("/api/v1/componentstatuses/nothing").await.status,
        StatusCode::NOT_FOUND
    );
    let r = a
        .post(
            "/api/v1/componentstatuses",
            json!({"metadata": {"name": "x"}}),
        )
        .await;
    assert_eq!(r.status, StatusCode::METHOD_NOT_ALLOWED, "{}", r.body);
}

/// The pods `kubectl debug node/n1 --profile=restricted|sysadmin` (v1.33)
/// sends as protobuf, captured: created as sent — security context
/// (with `allowPrivilegeEscalation: false` kept), host namespaces, the
/// node's root as a hostPath volume and its mount.
#[tokio::test]
async fn kubectl_debug_node_pods_sent_as_protobuf_are_created_as_sent() {
    let a = api().await;
    let pb = "application/vnd.kubernetes.protobuf";
    let pods = "/api/v1/namespaces/default/pods";
    let r = a
        .req(
            "POST",
            pods,
            pb,
            &include_bytes!("../../skiff-core/src/testdata/debug-node-restricted.pb")[..],
        )
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.body);
    assert_eq!(r.body["spec"]["nodeName"], "n1");
    assert_eq!(
        r.body["spec"]["tolerations"],
        json!([{"operator": "Exists"}])
    );
    let c = &r.body["spec"]["containers"][0];
    assert_eq!(c["image"], "busybox");
    assert_eq!(c["command"], json!(["true"]));
    assert_eq!(
        c["securityContext"],
        json!({"capabilities": {"drop": ["ALL"]}, "runAsNonRoot": true,
            "allowPrivilegeEscalation": false, "seccompProfile": {"type": "RuntimeDefault"}})
    );
    let r = a
        .req(
            "POST",
            pods,
            pb,
            &include_bytes!("../../skiff-core/src/testdata/debug-node-sysadmin.pb")[..],
        )
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.body);
    let s = &r.body["spec"];
    assert_eq!(s["hostPID"], true);
    assert_eq!(s["hostNetwork"], true);
    assert_eq!(s["hostIPC"], true);
    assert_eq!(s["volumes"][0]["name"], "host-root");
    assert_eq!(s["volumes"][0]["hostPath"]["path"], "/");
    assert_eq!(s["containers"][0]["securityContext"]["privileged"], true);
    assert_eq!(
        s["containers"][0]["volumeMounts"],
        json!([{"name": "host-root", "mountPath": "/host"}])
    );
}
