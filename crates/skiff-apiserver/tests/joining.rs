//! Joining nodes through the router: bootstrap tokens authenticate as
//! `system:bootstrap:<id>`, the join token and `cluster-info`, and
//! CertificateSigningRequests (requestor recorded, kubelet client
//! certificates approved and signed for bootstrappers, other signers
//! approved through the `approval` subresource by who may `approve`).

use std::sync::Arc;
use std::time::Duration;

use axum::http::StatusCode;
use axum::Router;
use base64::Engine;
use serde_json::{json, Value};
use skiff_apiserver::auth::Identity;
use skiff_apiserver::{bootstrap_token, tls, ApiServer, Config};
use skiff_store::{RedbStore, Store};

mod common;
use common::call_bearer as call;

struct Cluster {
    server: ApiServer,
    admin: Router,
    pki: tls::Pki,
    dir: tempfile::TempDir,
}

async fn cluster() -> Cluster {
    let dir = tempfile::tempdir().unwrap();
    let store: Arc<dyn Store> =
        RedbStore::open(&dir.path().join("s.redb"), Default::default()).unwrap();
    let pki = tls::Pki::load_or_create(&dir.path().join("pki"), &[]).unwrap();
    let config = Config {
        cluster_signing: Some((pki.ca.cert_pem.clone(), pki.ca.key_pem.clone())),
        ..Default::default()
    };
    let server = ApiServer::start(store, config).await.unwrap();
    let admin = server.in_process_router("admin");
    Cluster {
        server,
        admin,
        pki,
        dir,
    }
}

const WHOAMI: &str = "/apis/authentication.k8s.io/v1/selfsubjectreviews";

fn whoami_body() -> Value {
    json!({"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"})
}

/// Waits (bounded) until `f` holds for the answer to `method path`.
async fn wait_for(
    r: &Router,
    method: &str,
    path: &str,
    body: Option<Value>,
    bearer: Option<&str>,
    f: impl Fn(StatusCode, &Value) -> bool,
) -> Value {
    let mut last = Value::Null;
    for _ in 0..250 {
        let (s, b) = call(r, method, path, body.clone(), bearer).await;
        if f(s, &b) {
            return b;
        }
        last = b;
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("{method} {path}: condition never held; last: {last}");
}

#[tokio::test]
async fn a_bootstrap_token_authenticates_as_a_bootstrapper_while_valid() {
    let c = cluster().await;
    let open = c.server.router();
    let (s, b) = call(
        &c.admin,
        "POST",
        "/api/v1/namespaces/kube-system/secrets",
        Some(bootstrap_token::token_secret(
            "abcdef",
            "0123456789abcdef",
            "test",
        )),
        None,
    )
    .await;
    assert_eq!(s, StatusCode::CREATED, "{b}");
    let token = "abcdef.0123456789abcdef";
    let b = wait_for(
        &open,
        "POST",
        WHOAMI,
        Some(whoami_body()),
        Some(token),
        |s, _| s == StatusCode::CREATED,
    )
    .await;
    let user = &b["status"]["userInfo"];
    assert_eq!(user["username"], "system:bootstrap:abcdef");
    let groups: Vec<&str> = user["groups"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(Value::as_str)
        .collect();
    assert_eq!(
        groups,
        vec![
            "system:bootstrappers",
            "system:bootstrappers:skiff:default-node-token",
            "system:authenticated"
        ]
    );

    // Wrong secret, unknown id: 401 with a Status.
    for bad in ["abcdef.0123456789abcdee", "zzzzzz.0123456789abcdef"] {
        let (s, b) = call(&open, "POST", WHOAMI, Some(whoami_body()), Some(bad)).await;
        assert_eq!(s, StatusCode::UNAUTHORIZED, "{bad}");
        assert_eq!(b["reason"], "Unauthorized");
    }
    // Expired: 401.
    let mut expired = bootstrap_token::token_secret("exprd1", "0123456789abcdef", "old");
    expired["stringData"]["expiration"] = json!("2020-01-01T00:00:00Z");
    call(
        &c.admin,
        "POST",
        "/api/v1/namespaces/kube-system/secrets",
        Some(expired),
        None,
    )
    .await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    let (s, _) = call(
        &open,
        "POST",
        WHOAMI,
        Some(whoami_body()),
        Some("exprd1.0123456789abcdef"),
    )
    .await;
    assert_eq!(s, StatusCode::UNAUTHORIZED);
    // Deleting the Secret ends the token.
    call(
        &c.admin,
        "DELETE",
        "/api/v1/namespaces/kube-system/secrets/bootstrap-token-abcdef",
        None,
        None,
    )
    .await;
    wait_for(
        &open,
        "POST",
        WHOAMI,
        Some(whoami_body()),
        Some(token),
        |s, _| s == StatusCode::UNAUTHORIZED,
    )
    .await;
}

#[tokio::test]
async fn the_join_token_carries_the_ca_hash_and_cluster_info_is_public() {
    let c = cluster().await;
    let reg = &c.server.state.registry;
    let token = bootstrap_token::ensure(
        reg,
        c.dir.path(),
        &c.pki.ca.cert_pem,
        "https://10.0.0.1:6443",
    )
    .await
    .unwrap();
    let (hash, cred) = bootstrap_token::split_join_token(&token).expect("K10<hash>::<id>.<secret>");
    assert_eq!(
        Some(hash.to_string()),
        bootstrap_token::ca_hash(&c.pki.ca.cert_pem)
    );
    assert_eq!(
        std::fs::read_to_string(c.dir.path().join("token"))
            .unwrap()
            .trim(),
        token
    );
    // Stable across starts.
    let again = bootstrap_token::ensure(
        reg,
        c.dir.path(),
        &c.pki.ca.cert_pem,
        "https://10.0.0.1:6443",
    )
    .await
    .unwrap();
    assert_eq!(again, token);
    let open = c.server.router();
    wait_for(
        &open,
        "POST",
        WHOAMI,
        Some(whoami_body()),
        Some(cred),
        |s, _| s == StatusCode::CREATED,
    )
    .await;
    // Anyone may read cluster-info, and only that.
    let anon = c.server.router_as(Identity::anonymous());
    let b = wait_for(
        &anon,
        "GET",
        "/api/v1/namespaces/kube-public/configmaps/cluster-info",
        None,
        None,
        |s, _| s == StatusCode::OK,
    )
    .await;
    let kc = b["data"]["kubeconfig"].as_str().unwrap();
    assert!(kc.contains("server: https://10.0.0.1:6443"), "{kc}");
    let ca_b64 = base64::engine::general_purpose::STANDARD.encode(&c.pki.ca.cert_pem);
    assert!(kc.contains(&ca_b64));
    let (s, _) = call(
        &anon,
        "GET",
        "/api/v1/namespaces/kube-public/configmaps",
        None,
        None,
    )
    .await;
    assert_eq!(s, StatusCode::FORBIDDEN);
}

fn csr(name: &str, cn: &str, orgs: &[&str], signer: &str) -> Value {
    let key = rcgen::KeyPair::generate().unwrap();
    let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    let mut dn = rcgen::DistinguishedName::new();
    for o in orgs {
        dn.push(rcgen::DnType::OrganizationName, *o);
    }
    dn.push(rcgen::DnType::CommonName, cn);
    params.distinguished_name = dn;
    let pem = params.serialize_request(&key).unwrap().pem().unwrap();
    json!({"apiVersion": "certificates.k8s.io/v1", "kind": "CertificateSigningRequest",
        "metadata": {"name": name},
        "spec": {"request": base64::engine::general_purpose::STANDARD.encode(pem),
            "signerName": signer, "usages": ["digital signature", "client auth"],
            "username": "someone-else"}})
}

const CSRS: &str = "/apis/certificates.k8s.io/v1/certificatesigningrequests";

fn issued(b: &Value) -> Option<String> {
    let c = b.pointer("/status/certificate")?.as_str()?;
    String::from_utf8(base64::engine::general_purpose::STANDARD.decode(c).ok()?).ok()
}

#[tokio::test]
async fn a_bootstrappers_node_client_request_is_approved_and_signed() {
    let c = cluster().await;
    call(
        &c.admin,
        "POST",
        "/api/v1/namespaces/kube-system/secrets",
        Some(bootstrap_token::token_secret(
            "abcdef",
            "0123456789abcdef",
            "t",
        )),
        None,
    )
    .await;
    let open = c.server.router();
    let token = Some("abcdef.0123456789abcdef");
    let req = csr(
        "node-csr-1",
        "system:node:n1",
        &["system:nodes"],
        "kubernetes.io/kube-apiserver-client-kubelet",
    );
    let b = wait_for(&open, "POST", CSRS, Some(req), token, |s, _| {
        s == StatusCode::CREATED
    })
    .await;
    // The requestor is who asked, whatever the body said.
    assert_eq!(b["spec"]["username"], "system:bootstrap:abcdef");
    let b = wait_for(
        &open,
        "GET",
        &format!("{CSRS}/node-csr-1"),
        None,
        token,
        |_, b| issued(b).is_some(),
    )
    .await;
    let cond = &b["status"]["conditions"][0];
    assert_eq!(cond["type"], "Approved");
    assert_eq!(cond["reason"], "AutoApproved");
    let pem = issued(&b).unwrap();
    let (_, p) = x509_parser::pem::parse_x509_pem(pem.as_bytes()).unwrap();
    let cert = p.parse_x509().unwrap();
    assert_eq!(
        cert.subject().to_string(),
        "O=system:nodes, CN=system:node:n1"
    );
    assert_eq!(cert.issuer().to_string(), "CN=skiff-ca");

    // Not a node's subject: not approved automatically (checked after the
    // node's request above went through the same controller).
    let bad = csr(
        "node-csr-bad",
        "bob",
        &["system:masters"],
        "kubernetes.io/kube-apiserver-client-kubelet",
    );
    let (s, _) = call(&open, "POST", CSRS, Some(bad), token).await;
    assert_eq!(s, StatusCode::CREATED);
    let again = csr(
        "node-csr-2",
        "system:node:n2",
        &["system:nodes"],
        "kubernetes.io/kube-apiserver-client-kubelet",
    );
    call(&open, "POST", CSRS, Some(again), token).await;
    wait_for(
        &open,
        "GET",
        &format!("{CSRS}/node-csr-2"),
        None,
        token,
        |_, b| issued(b).is_some(),
    )
    .await;
    let (_, b) = call(&c.admin, "GET", &format!("{CSRS}/node-csr-bad"), None, None).await;
    assert!(b.pointer("/status/conditions").is_none(), "{b}");
}

#[tokio::test]
async fn other_signers_need_an_approver_with_the_approve_verb() {
    let c = cluster().await;
    let req = csr(
        "bob",
        "bob",
        &["devs"],
        "kubernetes.io/kube-apiserver-client",
    );
    let (s, b) = call(&c.admin, "POST", CSRS, Some(req), None).await;
    assert_eq!(s, StatusCode::CREATED, "{b}");
    let approve = |b: &Value| {
        let mut b = b.clone();
        b["status"]["conditions"] = json!([{"type": "Approved", "status": "True", "reason": "KubectlApprove", "message": "ok"}]);
        b
    };
    // A user allowed the approval subresource but not `approve` on the signer.
    let g = "rbac.authorization.k8s.io";
    call(&c.admin, "POST", "/apis/rbac.authorization.k8s.io/v1/clusterroles", Some(json!({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": {"name": "csr-approval"},
        "rules": [{"apiGroups": ["certificates.k8s.io"], "resources": ["certificatesigningrequests", "certificatesigningrequests/approval"], "verbs": ["get", "update"]}]})), None).await;
    call(&c.admin, "POST", "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings", Some(json!({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding", "metadata": {"name": "carol"},
        "roleRef": {"apiGroup": g, "kind": "ClusterRole", "name": "csr-approval"},
        "subjects": [{"apiGroup": g, "kind": "User", "name": "carol"}]})), None).await;
    let carol = c.server.router_as(Identity::new("carol", vec![]));
    let path = format!("{CSRS}/bob/approval");
    let b = wait_for(&carol, "GET", &format!("{CSRS}/bob"), None, None, |s, _| {
        s == StatusCode::OK
    })
    .await;
    let (s, e) = call(&carol, "PUT", &path, Some(approve(&b)), None).await;
    assert_eq!(s, StatusCode::FORBIDDEN, "{e}");
    assert!(
        e["message"]
            .as_str()
            .unwrap()
            .ends_with("user not permitted to approve requests with signerName \"kubernetes.io/kube-apiserver-client\""),
        "{e}"
    );

    // An admin approves; the signer signs.
    let (s, out) = call(&c.admin, "PUT", &path, Some(approve(&b)), None).await;
    assert_eq!(s, StatusCode::OK, "{out}");
    assert_eq!(out["spec"], b["spec"], "approval changes only conditions");
    let b = wait_for(
        &c.admin,
        "GET",
        &format!("{CSRS}/bob"),
        None,
        None,
        |_, b| issued(b).is_some(),
    )
    .await;
    let pem = issued(&b).unwrap();
    let (_, p) = x509_parser::pem::parse_x509_pem(pem.as_bytes()).unwrap();
    assert_eq!(
        p.parse_x509().unwrap().subject().to_string(),
        "O=devs, CN=bob"
    );
}

/// `certificatesigningrequests/NAME/approval` serves get, update and patch
/// as Kubernetes does (and as discovery says): a patch applies to the
/// request and goes through as an approval, which changes the Approved
/// and Denied conditions only; a Failed condition the signer set stays.
#[tokio::test]
async fn the_approval_subresource_serves_get_update_and_patch() {
    let c = cluster().await;
    let req = csr("dana", "dana", &["devs"], "example.com/signer");
    let (s, b) = call(&c.admin, "POST", CSRS, Some(req), None).await;
    assert_eq!(s, StatusCode::CREATED, "{b}");
    let path = format!("{CSRS}/dana/approval");
    let (s, got) = call(&c.admin, "GET", &path, None, None).await;
    assert_eq!(s, StatusCode::OK, "{got}");
    assert_eq!(got["kind"], "CertificateSigningRequest");
    assert_eq!(got["metadata"]["name"], "dana");
    assert_eq!(got["spec"], b["spec"]);

    let merge = [("content-type", "application/merge-patch+json")];
    let patch = json!({"spec": {"signerName": "example.com/other"}, "status": {"conditions": [
        {"type": "Approved", "status": "True", "reason": "ByPatch", "message": "patched"}]}});
    let (s, out) = common::call_with(&c.admin, "PATCH", &path, Some(patch), &merge).await;
    assert_eq!(s, StatusCode::OK, "{out}");
    assert_eq!(out["spec"], b["spec"], "approval changes only conditions");
    let cond = &out["status"]["conditions"][0];
    assert_eq!(cond["type"], "Approved");
    assert_eq!(cond["reason"], "ByPatch");
    assert!(cond["lastUpdateTime"].as_str().is_some(), "{out}");
    assert!(cond["lastTransitionTime"].as_str().is_some(), "{out}");
    let (_, now) = call(&c.admin, "GET", &format!("{CSRS}/dana"), None, None).await;
    assert_eq!(now["status"]["conditions"], out["status"]["conditions"]);

    // Approved and Denied together are refused, by a JSON patch too.
    let json_patch = [("content-type", "application/json-patch+json")];
    let both = json!([{"op": "add", "path": "/status/conditions/-",
        "value": {"type": "Denied", "status": "True", "reason": "No"}}]);
    let (s, e) = common::call_with(&c.admin, "PATCH", &path, Some(both), &json_patch).await;
    assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY, "{e}");

    // A Failed condition (the signer's, through /status) survives an
    // approval that leaves it out.
    let mut failed = now.clone();
    failed["status"]["conditions"] = json!([cond, {"type": "Failed", "status": "True",
        "reason": "SignerError", "message": "cannot sign"}]);
    let (s, f) = call(
        &c.admin,
        "PUT",
        &format!("{CSRS}/dana/status"),
        Some(failed),
        None,
    )
    .await;
    assert_eq!(s, StatusCode::OK, "{f}");
    let mut update = f.clone();
    update["status"]["conditions"] = json!([cond]);
    let (s, out) = call(&c.admin, "PUT", &path, Some(update), None).await;
    assert_eq!(s, StatusCode::OK, "{out}");
    let types: Vec<&str> = out["status"]["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["type"].as_str().unwrap())
        .collect();
    assert_eq!(types, ["Approved", "Failed"]);

    // A status write cannot approve or deny: its Denied is dropped and the
    // Approved it leaves out stays.
    let mut deny = out.clone();
    deny["status"]["conditions"] =
        json!([{"type": "Denied", "status": "True", "reason": "Sneaky"}]);
    let (s, st) = call(
        &c.admin,
        "PUT",
        &format!("{CSRS}/dana/status"),
        Some(deny),
        None,
    )
    .await;
    assert_eq!(s, StatusCode::OK, "{st}");
    let types: Vec<&str> = st["status"]["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["type"].as_str().unwrap())
        .collect();
    assert_eq!(types, ["Approved"], "{st}");
}
