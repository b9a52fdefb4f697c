//! Bad credentials over real HTTPS (issue 13 §5): malformed, expired,
//! forged and foreign ServiceAccount tokens, tokens for another issuer or
//! audience, and client certificates from another CA get a 401 Status,
//! never an identity; denied requests change nothing. Tokens are forged
//! with the server's own signing key, and re-signing unchanged claims is
//! checked to work, so each refusal is about the one thing changed.

use std::sync::Arc;

use base64::engine::general_purpose::URL_SAFE_NO_PAD as B64;
use base64::Engine;
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use ring::signature::{EcdsaKeyPair, KeyPair, ECDSA_P256_SHA256_FIXED_SIGNING};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use serde_json::{json, Value};
use skiff_apiserver::tls::{CertPair, Pki};
use skiff_apiserver::{ApiServer, Config};
use skiff_store::RedbStore;

struct Harness {
    port: u16,
    pki: Pki,
    keys: std::path::PathBuf,
    _dir: tempfile::TempDir,
    _server: ApiServer,
}

async fn start() -> Harness {
    let dir = tempfile::tempdir().unwrap();
    let store = RedbStore::open(&dir.path().join("s.redb"), Default::default()).unwrap();
    let keys = dir.path().join("keys");
    let server = ApiServer::start(
        store,
        Config {
            service_account_key_dir: Some(keys.clone()),
            ..Default::default()
        },
    )
    .await
    .unwrap();
    let pki = Pki::load_or_create(&dir.path().join("pki"), &[]).unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(skiff_apiserver::serve::serve_tls_checked(
        listener,
        pki.server_tls().unwrap(),
        server.router(),
        std::future::pending(),
    ));
    Harness {
        port,
        pki,
        keys,
        _dir: dir,
        _server: server,
    }
}

/// TLS trusting `ca_pem`, presenting `cert` if given.
fn client(ca_pem: &str, cert: Option<&CertPair>) -> Arc<rustls::ClientConfig> {
    let mut roots = rustls::RootCertStore::empty();
    roots
        .add(CertificateDer::from_pem_slice(ca_pem.as_bytes()).unwrap())
        .unwrap();
    let b = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(roots);
    let mut cfg = match cert {
        Some(p) => {
            let certs: Vec<CertificateDer<'static>> =
                CertificateDer::pem_slice_iter(p.cert_pem.as_bytes())
                    .map(|c| c.unwrap())
                    .collect();
            let key = PrivateKeyDer::from_pem_slice(p.key_pem.as_bytes()).unwrap();
            b.with_client_auth_cert(certs, key).unwrap()
        }
        None => b.with_no_client_auth(),
    };
    cfg.alpn_protocols = vec![b"http/1.1".to_vec()];
    Arc::new(cfg)
}

/// One request on its own connection: (status, JSON body).
async fn call(
    port: u16,
    tls: Arc<rustls::ClientConfig>,
    method: &str,
    path: &str,
    token: Option<&str>,
    body: Option<Value>,
) -> (u16, Value) {
    let tcp = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .unwrap();
    let stream = tokio_rustls::TlsConnector::from(tls)
        .connect(ServerName::try_from("localhost").unwrap(), tcp)
        .await
        .expect("TLS handshake");
    let (mut send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .unwrap();
    tokio::spawn(conn);
    let mut req = hyper::Request::builder()
        .method(method)
        .uri(path)
        .header("host", "localhost")
        .header("content-type", "application/json");
    if let Some(t) = token {
        req = req.header("authorization", format!("Bearer {t}"));
    }
    let req = req
        .body(Full::new(Bytes::from(
            body.map(|b| b.to_string()).unwrap_or_default(),
        )))
        .unwrap();
    let resp = send.send_request(req).await.unwrap();
    let status = resp.status().as_u16();
    let bytes = resp.into_body().collect().await.unwrap().to_bytes();
    (
        status,
        serde_json::from_slice(&bytes).unwrap_or(Value::Null),
    )
}

const WHOAMI: &str = "/apis/authentication.k8s.io/v1/selfsubjectreviews";

fn review() -> Option<Value> {
    Some(json!({"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"}))
}

fn assert_401(what: &str, (status, body): &(u16, Value)) {
    assert_eq!(*status, 401, "{what}: {body}");
    assert_eq!(body["kind"], "Status", "{what}: {body}");
    assert_eq!(body["code"], 401, "{what}: {body}");
    assert_eq!(body["reason"], "Unauthorized", "{what}: {body}");
}

/// Signs `claims` with `header` and `key`.
fn sign(key: &EcdsaKeyPair, header: &Value, claims: &Value) -> String {
    let input = format!(
        "{}.{}",
        B64.encode(header.to_string()),
        B64.encode(claims.to_string())
    );
    let rng = ring::rand::SystemRandom::new();
    let sig = key.sign(&rng, input.as_bytes()).unwrap();
    format!("{input}.{}", B64.encode(sig.as_ref()))
}

fn claims_of(token: &str) -> Value {
    let c = token.split('.').nth(1).unwrap();
    serde_json::from_slice(&B64.decode(c).unwrap()).unwrap()
}

#[tokio::test]
async fn bad_tokens_and_foreign_certificates_are_401_and_change_nothing() {
    let h = start().await;
    let admin = client(&h.pki.ca.cert_pem, Some(&h.pki.admin));
    let anon = || client(&h.pki.ca.cert_pem, None);

    // A ServiceAccount and a token for it, as `kubectl create token`.
    let (s, _) = call(
        h.port,
        admin.clone(),
        "POST",
        "/api/v1/namespaces/default/serviceaccounts",
        None,
        Some(json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "bot"}})),
    )
    .await;
    assert_eq!(s, 201);
    let (s, b) = call(
        h.port,
        admin.clone(),
        "POST",
        "/api/v1/namespaces/default/serviceaccounts/bot/token",
        None,
        Some(json!({"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": {}})),
    )
    .await;
    assert_eq!(s, 201, "{b}");
    let token = b["status"]["token"].as_str().unwrap().to_string();
    let (s, b) = call(h.port, anon(), "POST", WHOAMI, Some(&token), review()).await;
    assert_eq!(s, 201, "{b}");
    assert_eq!(
        b["status"]["userInfo"]["username"],
        "system:serviceaccount:default:bot"
    );

    // The server's own signing key: re-signing the claims unchanged works.
    let pk8 = std::fs::read(h.keys.join("sa-0001.pk8")).unwrap();
    let rng = ring::rand::SystemRandom::new();
    let key = EcdsaKeyPair::from_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, &pk8, &rng).unwrap();
    let header: Value =
        serde_json::from_slice(&B64.decode(token.split('.').next().unwrap()).unwrap()).unwrap();
    let claims = claims_of(&token);
    let resigned = sign(&key, &header, &claims);
    let (s, b) = call(h.port, anon(), "POST", WHOAMI, Some(&resigned), review()).await;
    assert_eq!(s, 201, "the forging harness works: {b}");

    let now = chrono::Utc::now().timestamp();
    let with = |f: &dyn Fn(&mut Value)| {
        let mut c = claims.clone();
        f(&mut c);
        sign(&key, &header, &c)
    };
    let forged: Vec<(&str, String)> = vec![
        (
            "expired",
            with(&|c| {
                c["exp"] = json!(now - 5);
                c["nbf"] = json!(now - 4000);
                c["iat"] = json!(now - 4000);
            }),
        ),
        (
            "another issuer",
            with(&|c| c["iss"] = json!("https://evil.example")),
        ),
        (
            "another audience",
            with(&|c| c["aud"] = json!(["https://evil.example"])),
        ),
        ("not valid yet", with(&|c| c["nbf"] = json!(now + 3600))),
        (
            "another ServiceAccount UID",
            with(&|c| {
                c["kubernetes.io"]["serviceaccount"]["uid"] =
                    json!("00000000-0000-0000-0000-000000000000")
            }),
        ),
        (
            "a ServiceAccount that does not exist",
            with(&|c| c["kubernetes.io"]["serviceaccount"]["name"] = json!("ghost")),
        ),
        (
            "no kubernetes.io claims",
            with(&|c| c["kubernetes.io"] = Value::Null),
        ),
        ("no exp", with(&|c| c["exp"] = Value::Null)),
    ];
    // Signatures that are not the server's.
    let foreign_key = {
        let doc = EcdsaKeyPair::generate_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, &rng).unwrap();
        EcdsaKeyPair::from_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, doc.as_ref(), &rng).unwrap()
    };
    let (h64, c64, s64) = {
        let mut p = token.split('.');
        (
            p.next().unwrap().to_string(),
            p.next().unwrap().to_string(),
            p.next().unwrap().to_string(),
        )
    };
    let mut admin_claims = claims.clone();
    admin_claims["sub"] = json!("system:serviceaccount:kube-system:admin");
    admin_claims["kubernetes.io"]["namespace"] = json!("kube-system");
    let mut sig = B64.decode(&s64).unwrap();
    sig[10] ^= 0x01;
    let mut bad: Vec<(&str, String)> = vec![
        (
            "signed by another key",
            sign(&foreign_key, &header, &claims),
        ),
        (
            "claims changed under the original signature",
            format!("{h64}.{}.{s64}", B64.encode(admin_claims.to_string())),
        ),
        (
            "a flipped signature bit",
            format!("{h64}.{c64}.{}", B64.encode(&sig)),
        ),
        (
            "alg none",
            format!(
                "{}.{c64}.",
                B64.encode(json!({"alg": "none", "kid": header["kid"]}).to_string())
            ),
        ),
        (
            "alg HS256",
            format!(
                "{}.{c64}.{s64}",
                B64.encode(json!({"alg": "HS256", "kid": header["kid"]}).to_string())
            ),
        ),
        ("no signature", format!("{h64}.{c64}")),
        ("four parts", format!("{token}.{s64}")),
        ("not base64", "!!!.###.$$$".to_string()),
        (
            "not JSON",
            format!("{}.{}.{s64}", B64.encode("{"), B64.encode("]")),
        ),
        ("a word", "hunter2".to_string()),
        ("huge", "a".repeat(64 * 1024)),
    ];
    bad.extend(forged);
    for (what, t) in &bad {
        let r = call(h.port, anon(), "POST", WHOAMI, Some(t), review()).await;
        assert_401(what, &r);
        // A denied write changes nothing.
        let r = call(
            h.port,
            anon(),
            "POST",
            "/api/v1/namespaces/default/configmaps",
            Some(t),
            Some(json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "nope"}})),
        )
        .await;
        assert_401(what, &r);
    }
    let (s, _) = call(
        h.port,
        admin.clone(),
        "GET",
        "/api/v1/namespaces/default/configmaps/nope",
        None,
        None,
    )
    .await;
    assert_eq!(s, 404);

    // A client certificate from another CA, even one naming system:masters,
    // is a 401 (not a failed handshake, not an identity).
    let other_dir = tempfile::tempdir().unwrap();
    let other = Pki::load_or_create(other_dir.path(), &[]).unwrap();
    let foreign = || client(&h.pki.ca.cert_pem, Some(&other.admin));
    assert_401(
        "another CA's admin",
        &call(h.port, foreign(), "GET", "/api/v1/namespaces", None, None).await,
    );
    assert_401(
        "another CA's admin writing",
        &call(
            h.port,
            foreign(),
            "POST",
            "/api/v1/namespaces",
            None,
            Some(json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "pwned"}})),
        )
        .await,
    );
    let (s, _) = call(
        h.port,
        admin.clone(),
        "GET",
        "/api/v1/namespaces/pwned",
        None,
        None,
    )
    .await;
    assert_eq!(s, 404);
    // With a valid token besides it, the token authenticates (kube-apiserver
    // tries every authenticator); the certificate adds nothing.
    let (s, b) = call(h.port, foreign(), "POST", WHOAMI, Some(&token), review()).await;
    assert_eq!(s, 201, "{b}");
    assert_eq!(
        b["status"]["userInfo"]["username"],
        "system:serviceaccount:default:bot"
    );
    // Our own CA's admin still works.
    let (s, _) = call(h.port, admin, "GET", "/api/v1/namespaces", None, None).await;
    assert_eq!(s, 200);
    // The key pair check stays: the public half of the foreign key is not ours.
    assert_ne!(foreign_key.public_key().as_ref(), key.public_key().as_ref());
}
