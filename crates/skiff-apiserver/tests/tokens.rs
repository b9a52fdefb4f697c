//! ServiceAccount tokens through the router: TokenRequest, bearer
//! authentication with RBAC, binding to the ServiceAccount's and Pod's
//! UIDs, TokenReview, key rotation and the OIDC discovery documents.

use std::sync::Arc;
use std::time::Duration;

use axum::http::StatusCode;
use axum::Router;
use base64::Engine;
use serde_json::{json, Value};
use skiff_apiserver::{ApiServer, Config};
use skiff_store::{RedbStore, Store};

mod common;
use common::call_bearer as call;

fn open(dir: &std::path::Path) -> Arc<dyn Store> {
    RedbStore::open(&dir.join("s.redb"), Default::default()).unwrap()
}

async fn start_on(store: Arc<dyn Store>, keys: &std::path::Path) -> ApiServer {
    let config = Config {
        service_account_key_dir: Some(keys.to_path_buf()),
        ..Default::default()
    };
    ApiServer::start(store, config).await.unwrap()
}

async fn start(dir: &std::path::Path, keys: &std::path::Path) -> ApiServer {
    start_on(open(dir), keys).await
}

/// Waits (bounded) until `token` gets `want` for GET `path`. A token's
/// successful authentication is reused for up to 10 s (as kube-apiserver's
/// token cache does), so a deletion takes up to that long to end it.
async fn wait_status(r: &Router, path: &str, token: &str, want: StatusCode) {
    for _ in 0..750 {
        if call(r, "GET", path, None, Some(token)).await.0 == want {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("{path} never answered {want}");
}

async fn token_for(admin: &Router, sa: &str, body: Value) -> (StatusCode, Value) {
    call(
        admin,
        "POST",
        &format!("/api/v1/namespaces/default/serviceaccounts/{sa}/token"),
        Some(body),
        None,
    )
    .await
}

#[tokio::test]
async fn a_requested_token_authenticates_as_the_service_account_until_it_is_deleted() {
    let dir = tempfile::tempdir().unwrap();
    let server = start(dir.path(), &dir.path().join("keys")).await;
    let admin = server.in_process_router("admin");
    let anon = server.router();
    let (s, b) = call(
        &admin,
        "POST",
        "/api/v1/namespaces/default/serviceaccounts",
        Some(json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "bot"}})),
        None,
    )
    .await;
    assert_eq!(s, StatusCode::CREATED, "{b}");
    let (s, b) = token_for(&admin, "bot", json!({"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": {"expirationSeconds": 1200}})).await;
    assert_eq!(s, StatusCode::CREATED, "{b}");
    assert_eq!(b["kind"], "TokenRequest");
    let token = b["status"]["token"].as_str().unwrap().to_string();
    assert!(b["status"]["expirationTimestamp"]
        .as_str()
        .unwrap()
        .ends_with('Z'));
    // The claims Kubernetes puts in a token.
    let claims: Value = serde_json::from_slice(
        &base64::engine::general_purpose::URL_SAFE_NO_PAD
            .decode(token.split('.').nth(1).unwrap())
            .unwrap(),
    )
    .unwrap();
    assert_eq!(claims["sub"], "system:serviceaccount:default:bot");
    assert_eq!(
        claims["iss"],
        "https://kubernetes.default.svc.cluster.local"
    );
    assert_eq!(
        claims["exp"].as_i64().unwrap() - claims["iat"].as_i64().unwrap(),
        1200
    );
    // No rights yet: 403 naming the ServiceAccount user.
    let (s, b) = call(
        &anon,
        "GET",
        "/api/v1/namespaces/default/pods",
        None,
        Some(&token),
    )
    .await;
    assert_eq!(s, StatusCode::FORBIDDEN, "{b}");
    assert_eq!(
        b["message"],
        r#"pods is forbidden: User "system:serviceaccount:default:bot" cannot list resource "pods" in API group "" in the namespace "default""#
    );
    // A RoleBinding to the ServiceAccount grants its namespace.
    let (s, _) = call(&admin, "POST", "/apis/rbac.authorization.k8s.io/v1/namespaces/default/rolebindings", Some(json!({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding", "metadata": {"name": "bot-view"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "system:aggregate-to-view"},
        "subjects": [{"kind": "ServiceAccount", "name": "bot"}]})), None).await;
    assert_eq!(s, StatusCode::CREATED);
    wait_status(
        &anon,
        "/api/v1/namespaces/default/pods",
        &token,
        StatusCode::OK,
    )
    .await;
    // TokenReview says who the token is.
    let (s, b) = call(&admin, "POST", "/apis/authentication.k8s.io/v1/tokenreviews", Some(json!({"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview", "spec": {"token": token}})), None).await;
    assert_eq!(s, StatusCode::CREATED, "{b}");
    assert_eq!(b["status"]["authenticated"], true);
    assert_eq!(
        b["status"]["user"]["username"],
        "system:serviceaccount:default:bot"
    );
    assert_eq!(
        b["status"]["user"]["groups"],
        json!([
            "system:serviceaccounts",
            "system:serviceaccounts:default",
            "system:authenticated"
        ])
    );
    // Forged and foreign tokens: 401, never an identity.
    let mut forged = token.clone();
    forged.pop();
    forged.push(if token.ends_with('A') { 'B' } else { 'A' });
    assert_eq!(
        call(&anon, "GET", "/version", None, Some(&forged)).await.0,
        StatusCode::UNAUTHORIZED
    );
    assert_eq!(
        call(&anon, "GET", "/version", None, Some("a.b.c")).await.0,
        StatusCode::UNAUTHORIZED
    );
    let other = tempfile::tempdir().unwrap();
    let other_server = start(other.path(), &other.path().join("keys")).await;
    let other_admin = other_server.in_process_router("admin");
    call(
        &other_admin,
        "POST",
        "/api/v1/namespaces/default/serviceaccounts",
        Some(json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "bot"}})),
        None,
    )
    .await;
    let (_, b) = token_for(&other_admin, "bot", json!({"spec": {}})).await;
    let foreign = b["status"]["token"].as_str().unwrap();
    assert_eq!(
        call(&anon, "GET", "/version", None, Some(foreign)).await.0,
        StatusCode::UNAUTHORIZED
    );
    // A duration under ten minutes is invalid.
    let (s, b) = token_for(&admin, "bot", json!({"spec": {"expirationSeconds": 60}})).await;
    assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY, "{b}");
    // Deleting the ServiceAccount ends the token.
    let (s, _) = call(
        &admin,
        "DELETE",
        "/api/v1/namespaces/default/serviceaccounts/bot",
        None,
        None,
    )
    .await;
    assert_eq!(s, StatusCode::OK);
    wait_status(
        &anon,
        "/api/v1/namespaces/default/pods",
        &token,
        StatusCode::UNAUTHORIZED,
    )
    .await;
}

#[tokio::test]
async fn a_token_bound_to_a_pod_ends_with_the_pod_and_keys_rotate() {
    let dir = tempfile::tempdir().unwrap();
    let keys = dir.path().join("keys");
    let store = open(dir.path());
    let server = start_on(store.clone(), &keys).await;
    let admin = server.in_process_router("admin");
    call(
        &admin,
        "POST",
        "/api/v1/namespaces/default/serviceaccounts",
        Some(json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "bot"}})),
        None,
    )
    .await;
    let (s, b) = call(&admin, "POST", "/api/v1/namespaces/default/pods", Some(json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}, "spec": {"serviceAccountName": "bot", "containers": [{"name": "c", "image": "busybox"}]}})), None).await;
    assert_eq!(s, StatusCode::CREATED, "{b}");
    let (s, b) = token_for(
        &admin,
        "bot",
        json!({"spec": {"boundObjectRef": {"kind": "Pod", "apiVersion": "v1", "name": "p"}}}),
    )
    .await;
    assert_eq!(s, StatusCode::CREATED, "{b}");
    let bound = b["status"]["token"].as_str().unwrap().to_string();
    let (_, b) = token_for(&admin, "bot", json!({"spec": {}})).await;
    let unbound = b["status"]["token"].as_str().unwrap().to_string();
    let (s, b) = token_for(
        &admin,
        "bot",
        json!({"spec": {"boundObjectRef": {"kind": "Pod", "apiVersion": "v1", "name": "nope"}}}),
    )
    .await;
    assert_eq!(s, StatusCode::NOT_FOUND, "{b}");
    let anon = server.router();
    // Anyone authenticated may read /version (public-info-viewer).
    wait_status(&anon, "/version", &bound, StatusCode::OK).await;
    // The OIDC documents, readable by service accounts.
    let (s, cfg) = call(
        &anon,
        "GET",
        "/.well-known/openid-configuration",
        None,
        Some(&bound),
    )
    .await;
    assert_eq!(s, StatusCode::OK, "{cfg}");
    assert_eq!(
        cfg["jwks_uri"],
        "https://kubernetes.default.svc.cluster.local/openid/v1/jwks"
    );
    let (s, jwks) = call(&anon, "GET", "/openid/v1/jwks", None, Some(&bound)).await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(jwks["keys"].as_array().unwrap().len(), 1);
    assert_eq!(jwks["keys"][0]["kty"], "EC");
    // Force-deleting the pod ends the bound token, not the other one.
    let (s, _) = call(
        &admin,
        "DELETE",
        "/api/v1/namespaces/default/pods/p?gracePeriodSeconds=0",
        None,
        None,
    )
    .await;
    assert_eq!(s, StatusCode::OK);
    wait_status(&anon, "/version", &bound, StatusCode::UNAUTHORIZED).await;
    assert_eq!(
        call(&anon, "GET", "/version", None, Some(&unbound)).await.0,
        StatusCode::OK
    );
    // Rotation: a newer key signs, the old one still verifies (a server
    // started on the same store with the key directory grown by one).
    let doc = ring::signature::EcdsaKeyPair::generate_pkcs8(
        &ring::signature::ECDSA_P256_SHA256_FIXED_SIGNING,
        &ring::rand::SystemRandom::new(),
    )
    .unwrap();
    std::fs::write(keys.join("sa-0002.pk8"), doc.as_ref()).unwrap();
    let server = start_on(store, &keys).await;
    let anon = server.router();
    let admin = server.in_process_router("admin");
    wait_status(&anon, "/version", &unbound, StatusCode::OK).await;
    let (_, jwks) = call(&anon, "GET", "/openid/v1/jwks", None, Some(&unbound)).await;
    assert_eq!(jwks["keys"].as_array().unwrap().len(), 2);
    let (_, b) = token_for(&admin, "bot", json!({"spec": {}})).await;
    let fresh = b["status"]["token"].as_str().unwrap();
    let header: Value = serde_json::from_slice(
        &base64::engine::general_purpose::URL_SAFE_NO_PAD
            .decode(fresh.split('.').next().unwrap())
            .unwrap(),
    )
    .unwrap();
    assert_eq!(header["kid"], jwks["keys"][1]["kid"]);
    assert_eq!(
        call(&anon, "GET", "/version", None, Some(fresh)).await.0,
        StatusCode::OK
    );
}

/// The status of a TokenReview of `token` asking for `audiences` (none
/// when `None`, which means the API server's own).
async fn review(admin: &Router, token: &str, audiences: Option<Value>) -> Value {
    let mut spec = json!({"token": token});
    if let Some(a) = audiences {
        spec["audiences"] = a;
    }
    let (s, b) = call(
        admin,
        "POST",
        "/apis/authentication.k8s.io/v1/tokenreviews",
        Some(
            json!({"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview", "spec": spec}),
        ),
        None,
    )
    .await;
    assert_eq!(s, StatusCode::CREATED, "{b}");
    b["status"].clone()
}

/// A service that verifies its callers by TokenReview with its own audience
/// (the pattern bound tokens exist for): the review authenticates against
/// the audiences it asks for and answers the ones both it and the token
/// name; without any it asks for the API server's.
#[tokio::test]
async fn a_token_review_authenticates_against_the_audiences_it_asks_for() {
    let dir = tempfile::tempdir().unwrap();
    let server = start(dir.path(), &dir.path().join("keys")).await;
    let admin = server.in_process_router("admin");
    let (s, b) = call(
        &admin,
        "POST",
        "/api/v1/namespaces/default/serviceaccounts",
        Some(json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "bot"}})),
        None,
    )
    .await;
    assert_eq!(s, StatusCode::CREATED, "{b}");
    let (s, b) = token_for(&admin, "bot", json!({"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": {"audiences": ["api"]}})).await;
    assert_eq!(s, StatusCode::CREATED, "{b}");
    assert_eq!(b["spec"]["audiences"], json!(["api"]));
    let api = b["status"]["token"].as_str().unwrap().to_string();

    let st = review(&admin, &api, Some(json!(["api"]))).await;
    assert_eq!(st["authenticated"], true, "{st}");
    assert_eq!(st["audiences"], json!(["api"]));
    assert_eq!(st["user"]["username"], "system:serviceaccount:default:bot");
    // Only the audiences both name are answered.
    let st = review(&admin, &api, Some(json!(["other", "api"]))).await;
    assert_eq!(st["authenticated"], true, "{st}");
    assert_eq!(st["audiences"], json!(["api"]));
    // Another audience, or the API server's own, does not accept it.
    let st = review(&admin, &api, Some(json!(["other"]))).await;
    assert_eq!(st["authenticated"], false, "{st}");
    assert!(
        st["error"]
            .as_str()
            .unwrap()
            .contains("invalid for the target audiences"),
        "{st}"
    );
    assert!(st.get("audiences").is_none(), "{st}");
    let st = review(&admin, &api, None).await;
    assert_eq!(st["authenticated"], false, "{st}");
    // Nor does the API server accept it as a bearer token.
    assert_eq!(
        call(&server.router(), "GET", "/version", None, Some(&api))
            .await
            .0,
        StatusCode::UNAUTHORIZED
    );

    // A token for the API server: reviewed without audiences it answers
    // the API server's; asked for another audience it is refused.
    let (_, b) = token_for(&admin, "bot", json!({"spec": {}})).await;
    let own = b["status"]["token"].as_str().unwrap().to_string();
    let issuer = b["spec"]["audiences"][0].as_str().unwrap().to_string();
    let st = review(&admin, &own, None).await;
    assert_eq!(st["authenticated"], true, "{st}");
    assert_eq!(st["audiences"], json!([issuer]));
    let st = review(&admin, &own, Some(json!(["api"]))).await;
    assert_eq!(st["authenticated"], false, "{st}");
}

/// TokenReview answers for every token the API server accepts, bootstrap
/// tokens too: they hold for the API server's own audience only.
#[tokio::test]
async fn a_token_review_authenticates_a_bootstrap_token_for_the_api_server_only() {
    let dir = tempfile::tempdir().unwrap();
    let server = start(dir.path(), &dir.path().join("keys")).await;
    let admin = server.in_process_router("admin");
    let (s, b) = call(
        &admin,
        "POST",
        "/api/v1/namespaces/kube-system/secrets",
        Some(skiff_apiserver::bootstrap_token::token_secret(
            "abcdef",
            "0123456789abcdef",
            "test",
        )),
        None,
    )
    .await;
    assert_eq!(s, StatusCode::CREATED, "{b}");
    let token = "abcdef.0123456789abcdef";
    let mut st = Value::Null;
    for _ in 0..250 {
        st = review(&admin, token, None).await;
        if st["authenticated"] == true {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(st["authenticated"], true, "{st}");
    assert_eq!(st["user"]["username"], "system:bootstrap:abcdef");
    assert_eq!(
        st["audiences"],
        json!(["https://kubernetes.default.svc.cluster.local"])
    );
    let st = review(&admin, token, Some(json!(["api"]))).await;
    assert_eq!(st["authenticated"], false, "{st}");
    let st = review(&admin, "abcdef.0000000000000000", None).await;
    assert_eq!(st["authenticated"], false, "{st}");
}
