//! Priority and fairness through the router: a user past its watch limit
//! or its queue gets kube-apiserver's 429 (a `TooManyRequests` Status and
//! `Retry-After`), other users and `system:masters` do not, and a closed
//! watch gives its place back.

use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use axum::Router;
use http_body_util::BodyExt;
use serde_json::{json, Value};
use skiff_apiserver::auth::Identity;
use skiff_apiserver::flowcontrol::Limits;
use skiff_apiserver::{ApiServer, Config};
use skiff_store::{RedbStore, Store};
use tower::ServiceExt;

mod common;
use common::call_with;

async fn server(limits: Limits) -> (ApiServer, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let store: Arc<dyn Store> =
        RedbStore::open(&dir.path().join("s.redb"), Default::default()).unwrap();
    let config = Config {
        flow: limits,
        ..Default::default()
    };
    (ApiServer::start(store, config).await.unwrap(), dir)
}

/// Makes `user` a cluster admin through RBAC (not system:masters, so flow
/// control applies to it).
async fn grant_admin(s: &ApiServer, user: &str) {
    let admin = s.in_process_router("admin");
    let binding = json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
        "metadata": {"name": format!("{user}-admin")},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "cluster-admin"},
        "subjects": [{"kind": "User", "name": user, "apiGroup": "rbac.authorization.k8s.io"}]});
    let (st, b) = call_with(
        &admin,
        "POST",
        "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings",
        Some(binding),
        &[],
    )
    .await;
    assert_eq!(st, StatusCode::CREATED, "{b}");
    let r = s.router_as(Identity::new(user, vec![]));
    for _ in 0..200 {
        if call_with(
            &r,
            "GET",
            "/api/v1/namespaces/default/configmaps",
            None,
            &[],
        )
        .await
        .0 == StatusCode::OK
        {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("{user} never got its rights");
}

/// Opens a watch and returns the response with its body still streaming.
async fn watch(r: &Router) -> axum::response::Response {
    let req = Request::builder()
        .uri("/api/v1/namespaces/default/configmaps?watch=true")
        .body(Body::empty())
        .unwrap();
    r.clone().oneshot(req).await.unwrap()
}

async fn status_of(resp: axum::response::Response) -> (StatusCode, Option<String>, Value) {
    let status = resp.status();
    let retry = resp
        .headers()
        .get("retry-after")
        .map(|v| v.to_str().unwrap().to_string());
    let bytes = resp.into_body().collect().await.unwrap().to_bytes();
    (
        status,
        retry,
        serde_json::from_slice(&bytes).unwrap_or(Value::Null),
    )
}

#[tokio::test]
async fn watches_past_a_users_limit_are_429_until_one_closes() {
    let (s, _dir) = server(Limits {
        watches_per_user: 2,
        ..Default::default()
    })
    .await;
    grant_admin(&s, "jane").await;
    grant_admin(&s, "joe").await;
    let jane = s.router_as(Identity::new("jane", vec![]));
    let first = watch(&jane).await;
    let second = watch(&jane).await;
    assert_eq!(first.status(), StatusCode::OK);
    assert_eq!(second.status(), StatusCode::OK);

    let (st, retry, body) = status_of(watch(&jane).await).await;
    assert_eq!(st, StatusCode::TOO_MANY_REQUESTS, "{body}");
    assert_eq!(retry.as_deref(), Some("1"));
    assert_eq!(body["kind"], "Status");
    assert_eq!(body["reason"], "TooManyRequests");
    assert_eq!(body["details"]["retryAfterSeconds"], 1, "{body}");
    assert!(body["message"].as_str().unwrap().contains("jane"), "{body}");

    // Another user, and an admin of system:masters, are not limited by it.
    let joe = s.router_as(Identity::new("joe", vec![]));
    assert_eq!(watch(&joe).await.status(), StatusCode::OK);
    let root = s.in_process_router("admin");
    for _ in 0..3 {
        assert_eq!(watch(&root).await.status(), StatusCode::OK);
    }

    // Closing a watch gives its place back.
    drop(first);
    assert_eq!(watch(&jane).await.status(), StatusCode::OK);
    drop(second);
}

/// Waits (bounded) for a condition on the server's flow control.
async fn until(what: &str, f: impl Fn() -> bool) {
    for _ in 0..500 {
        if f() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("timed out waiting for {what}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_full_queue_is_429_for_its_user_while_others_wait_their_turn() {
    // Ten seats at jane's level (global-default), a queue of one per user.
    let (s, _dir) = server(Limits {
        seats: 1,
        queue_length: 1,
        queue_wait: Duration::from_secs(20),
        ..Default::default()
    })
    .await;
    grant_admin(&s, "jane").await;
    grant_admin(&s, "joe").await;
    let flow = s.state.flow.clone();
    let level = skiff_apiserver::flowcontrol::Level::GlobalDefault;
    let jane = s.router_as(Identity::new("jane", vec![]));
    let joe = s.router_as(Identity::new("joe", vec![]));
    let list = "/api/v1/namespaces/default/configmaps";
    // Lists at a resourceVersion the server has not reached wait (3 s)
    // holding their seats: jane takes every seat.
    let slow = format!("{list}?resourceVersion=999999999");
    let seats = flow.free(level);
    let mut holding = vec![];
    for _ in 0..seats {
        let (r, p) = (jane.clone(), slow.clone());
        holding.push(tokio::spawn(async move {
            call_with(&r, "GET", &p, None, &[]).await.0
        }));
    }
    until("jane holding every seat", || flow.free(level) == 0).await;
    // One more of jane's waits in her queue; joe's waits in his.
    let queued_jane = {
        let r = jane.clone();
        tokio::spawn(async move { call_with(&r, "GET", list, None, &[]).await.0 })
    };
    until("jane's request queued", || flow.waiting(level) == 1).await;
    let queued_joe = {
        let r = joe.clone();
        tokio::spawn(async move { call_with(&r, "GET", list, None, &[]).await.0 })
    };
    until("joe's request queued", || flow.waiting(level) == 2).await;
    // Jane's queue is full: refused at once.
    let (st, b) = call_with(&jane, "GET", list, None, &[]).await;
    assert_eq!(st, StatusCode::TOO_MANY_REQUESTS, "{b}");
    assert_eq!(b["reason"], "TooManyRequests");
    // Once seats free, both queued requests are served.
    assert_eq!(queued_joe.await.unwrap(), StatusCode::OK);
    assert_eq!(queued_jane.await.unwrap(), StatusCode::OK);
    for h in holding {
        assert_eq!(h.await.unwrap(), StatusCode::GATEWAY_TIMEOUT);
    }
    assert_eq!(flow.free(level), seats);
}
