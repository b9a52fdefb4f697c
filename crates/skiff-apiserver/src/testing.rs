//! Servers written for tests of the API server's calls out: an HTTPS
//! server on a free loopback port with a certificate from a CA made for
//! the test, answering each request with a closure (an admission webhook,
//! an aggregated API server). Used by this crate's tests and the
//! end-to-end tests; nothing in the server uses it.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use base64::Engine;
use http_body_util::BodyExt;
use hyper_util::rt::TokioIo;
use serde_json::{json, Value};

use crate::tls::CertPair;

/// One request as the test server saw it.
#[derive(Debug, Clone)]
pub struct Seen {
    pub method: String,
    pub path: String,
    pub headers: http::HeaderMap,
    pub body: bytes::Bytes,
    /// The client certificate's subject (user, groups), if one was shown.
    pub client: Option<(String, Vec<String>)>,
}

/// What the server answers: (status, JSON body).
pub type Handler = Arc<dyn Fn(&Seen) -> (u16, Value) + Send + Sync>;

/// A running test server; stopped when dropped.
pub struct TestServer {
    pub addr: SocketAddr,
    /// The PEM of the CA that issued the server's certificate.
    pub ca_pem: String,
    pub seen: Arc<Mutex<Vec<Seen>>>,
    /// TLS connections accepted so far.
    pub connections: Arc<std::sync::atomic::AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for TestServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl TestServer {
    /// The CA bundle as a webhook's `caBundle` (base64 of the PEM).
    pub fn ca_bundle(&self) -> String {
        base64::engine::general_purpose::STANDARD.encode(&self.ca_pem)
    }

    /// Every request seen so far.
    pub fn requests(&self) -> Vec<Seen> {
        self.seen.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

/// A self-signed CA for a test.
pub fn test_ca() -> CertPair {
    use rcgen::{BasicConstraints, CertificateParams, IsCa, KeyPair, KeyUsagePurpose};
    let key = KeyPair::generate().expect("key");
    let mut params = CertificateParams::new(Vec::<String>::new()).expect("params");
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    let cert = params.self_signed(&key).expect("self-signed CA");
    CertPair {
        cert_pem: cert.pem(),
        key_pem: key.serialize_pem(),
    }
}

/// Starts an HTTPS server on `bind` (port 0: a free one) whose certificate
/// names `sans`, answering every request with `handler` after `delay`.
/// With `client_ca`, client certificates from that CA are asked for (and
/// verified when shown).
pub async fn serve(
    bind: &str,
    sans: &[&str],
    client_ca: Option<&str>,
    delay: Duration,
    handler: Handler,
) -> TestServer {
    use rustls_pki_types::pem::PemObject;
    let ca = test_ca();
    let sans: Vec<String> = sans.iter().map(|s| s.to_string()).collect();
    let serving = crate::tls::issue(&ca, "test-server", &[], &sans, false, 1).expect("issue");
    let certs = rustls_pki_types::CertificateDer::pem_slice_iter(serving.cert_pem.as_bytes())
        .collect::<Result<Vec<_>, _>>()
        .expect("certificate");
    let key =
        rustls_pki_types::PrivateKeyDer::from_pem_slice(serving.key_pem.as_bytes()).expect("key");
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .expect("protocols");
    let builder = match client_ca {
        None => builder.with_no_client_auth(),
        Some(pem) => {
            let mut roots = rustls::RootCertStore::empty();
            for c in rustls_pki_types::CertificateDer::pem_slice_iter(pem.as_bytes()) {
                roots.add(c.expect("client CA")).expect("client CA");
            }
            let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
                Arc::new(roots),
                provider,
            )
            .allow_unauthenticated()
            .build()
            .expect("client verifier");
            builder.with_client_cert_verifier(verifier)
        }
    };
    let cfg = builder.with_single_cert(certs, key).expect("server config");
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(cfg));
    let listener = tokio::net::TcpListener::bind(bind).await.expect("bind");
    let addr = listener.local_addr().expect("address");
    let seen: Arc<Mutex<Vec<Seen>>> = Default::default();
    let seen2 = seen.clone();
    let connections: Arc<std::sync::atomic::AtomicUsize> = Default::default();
    let accepted = connections.clone();
    let task = tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            accepted.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let (acceptor, seen, handler) = (acceptor.clone(), seen2.clone(), handler.clone());
            tokio::spawn(async move {
                let Ok(tls) = acceptor.accept(tcp).await else {
                    return;
                };
                let client = tls
                    .get_ref()
                    .1
                    .peer_certificates()
                    .and_then(|c| c.first())
                    .and_then(|c| crate::tls::identity_from_cert(c));
                let svc =
                    hyper::service::service_fn(move |req: http::Request<hyper::body::Incoming>| {
                        let (seen, handler, client) =
                            (seen.clone(), handler.clone(), client.clone());
                        async move {
                            let (parts, body) = req.into_parts();
                            let body = body
                                .collect()
                                .await
                                .map(|b| b.to_bytes())
                                .unwrap_or_default();
                            let s = Seen {
                                method: parts.method.to_string(),
                                path: parts
                                    .uri
                                    .path_and_query()
                                    .map(|p| p.to_string())
                                    .unwrap_or_default(),
                                headers: parts.headers,
                                body,
                                client,
                            };
                            seen.lock()
                                .unwrap_or_else(|e| e.into_inner())
                                .push(s.clone());
                            tokio::time::sleep(delay).await;
                            let (code, out) = handler(&s);
                            Ok::<_, Infallible>(
                                http::Response::builder()
                                    .status(code)
                                    .header("content-type", "application/json")
                                    .body(http_body_util::Full::new(bytes::Bytes::from(
                                        out.to_string(),
                                    )))
                                    .expect("response"),
                            )
                        }
                    });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(tls), svc)
                    .await;
            });
        }
    });
    TestServer {
        addr,
        ca_pem: ca.cert_pem,
        seen,
        connections,
        task,
    }
}

/// A webhook: `decide` gets each AdmissionReview's `request` and returns
/// its `response` without the uid, which is filled in.
pub fn admission_handler(decide: impl Fn(&Value) -> Value + Send + Sync + 'static) -> Handler {
    Arc::new(move |s: &Seen| {
        let review: Value = serde_json::from_slice(&s.body).unwrap_or(Value::Null);
        let request = &review["request"];
        let mut response = decide(request);
        response["uid"] = request["uid"].clone();
        (
            200,
            json!({
                "apiVersion": "admission.k8s.io/v1",
                "kind": "AdmissionReview",
                "response": response,
            }),
        )
    })
}

/// A mutating webhook's answer that adds `label=value` to the object.
pub fn add_label(request: &Value, label: &str, value: &str) -> Value {
    let patch = if request["object"]["metadata"].get("labels").is_some() {
        let key = label.replace('~', "~0").replace('/', "~1");
        json!([{"op": "add", "path": format!("/metadata/labels/{key}"), "value": value}])
    } else {
        json!([{"op": "add", "path": "/metadata/labels", "value": {label: value}}])
    };
    json!({"allowed": true, "patchType": "JSONPatch",
        "patch": base64::engine::general_purpose::STANDARD.encode(patch.to_string())})
}
