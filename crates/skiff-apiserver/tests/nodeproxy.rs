//! `pods/log|exec|attach|portforward` proxied to the agent of the pod's
//! node, against a fake agent (a small HTTPS endpoint standing in for the
//! remote kubelet): the path and query it receives, the client certificate
//! the API server presents, log streaming, and a WebSocket upgrade
//! relayed byte for byte; `nodes/{name}/proxy/{path}` forwarded to the
//! agent's path (kubelet's stats) with the answer passed back as it is.

use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Body;
use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::BodyExt;
use hyper_util::rt::TokioIo;
use serde_json::{json, Value};
use skiff_apiserver::tls::Pki;
use skiff_store::{RedbStore, Store};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::Notify;
use tower::ServiceExt;

/// What the fake agent's `/stats/summary` says: the node, `web` (one
/// container) and `two` (two) in default, and a pod the API does not know.
const FAKE_SUMMARY: &str = r#"{"node":{"nodeName":"n1","startTime":"2026-01-01T00:00:00Z",
"cpu":{"time":"2026-01-01T00:00:12Z","usageNanoCores":1500000000,"usageCoreNanoSeconds":9000000000},
"memory":{"time":"2026-01-01T00:00:12Z","workingSetBytes":2147483648,"usageBytes":3000000000}},
"pods":[
{"podRef":{"name":"web","namespace":"default","uid":""},"containers":[
 {"name":"app","cpu":{"time":"2026-01-01T00:00:12Z","usageNanoCores":123456789},"memory":{"time":"2026-01-01T00:00:12Z","workingSetBytes":5242880}}]},
{"podRef":{"name":"two","namespace":"default","uid":""},"containers":[
 {"name":"a","cpu":{"time":"2026-01-01T00:00:12Z","usageNanoCores":1000000},"memory":{"workingSetBytes":1048576}},
 {"name":"b","cpu":{"time":"2026-01-01T00:00:11Z","usageNanoCores":7},"memory":{"workingSetBytes":4096}}]},
{"podRef":{"name":"stray","namespace":"default","uid":"x"},"containers":[
 {"name":"a","cpu":{"usageNanoCores":1},"memory":{"workingSetBytes":4096}}]}]}"#;

#[derive(Default)]
struct Seen {
    /// (path?query, client certificate user, upgrade header)
    requests: Vec<(String, String, String)>,
}

/// A fake agent: containerLogs streams two lines (the second only after
/// `release` is notified), exec/attach/portForward upgrade and echo.
async fn fake_agent(pki: &Pki, seen: Arc<Mutex<Seen>>, release: Arc<Notify>) -> u16 {
    let tls = tokio_rustls::TlsAcceptor::from(pki.server_config().unwrap());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        loop {
            let Ok((tcp, _)) = listener.accept().await else {
                return;
            };
            let tls = tls.clone();
            let seen = seen.clone();
            let release = release.clone();
            tokio::spawn(async move {
                let Ok(stream) = tls.accept(tcp).await else {
                    return;
                };
                let user = stream
                    .get_ref()
                    .1
                    .peer_certificates()
                    .and_then(|c| c.first())
                    .and_then(|c| skiff_apiserver::tls::identity_from_cert(c))
                    .map(|(u, _)| u)
                    .unwrap_or_default();
                let svc =
                    hyper::service::service_fn(move |mut req: Request<hyper::body::Incoming>| {
                        let seen = seen.clone();
                        let release = release.clone();
                        let user = user.clone();
                        async move {
                            let upgrade = req
                                .headers()
                                .get("upgrade")
                                .and_then(|v| v.to_str().ok())
                                .unwrap_or("")
                                .to_string();
                            let pq = req
                                .uri()
                                .path_and_query()
                                .map(|p| p.to_string())
                                .unwrap_or_default();
                            seen.lock()
                                .unwrap()
                                .requests
                                .push((pq.clone(), user, upgrade.clone()));
                            let resp: Response<Body> = if pq.starts_with("/stats/summary") {
                                Response::builder()
                                    .header("content-type", "application/json")
                                    .body(Body::from(FAKE_SUMMARY))
                                    .unwrap()
                            } else if pq.starts_with("/containerLogs/") {
                                let (tx, rx) = tokio::sync::mpsc::channel::<
                                    Result<hyper::body::Frame<Bytes>, Infallible>,
                                >(2);
                                tokio::spawn(async move {
                                    let _ = tx
                                        .send(Ok(hyper::body::Frame::data(Bytes::from(
                                            "first line\n",
                                        ))))
                                        .await;
                                    release.notified().await;
                                    let _ = tx
                                        .send(Ok(hyper::body::Frame::data(Bytes::from(
                                            "second line\n",
                                        ))))
                                        .await;
                                });
                                let stream = tokio_stream::wrappers::ReceiverStream::new(rx);
                                Response::builder()
                                    .header("content-type", "text/plain")
                                    .body(Body::new(http_body_util::StreamBody::new(stream)))
                                    .unwrap()
                            } else if !upgrade.is_empty() {
                                let protocol = req
                                    .headers()
                                    .get("sec-websocket-protocol")
                                    .and_then(|v| v.to_str().ok())
                                    .and_then(|v| v.split(',').next())
                                    .unwrap_or("")
                                    .trim()
                                    .to_string();
                                let on = hyper::upgrade::on(&mut req);
                                tokio::spawn(async move {
                                    let Ok(up) = on.await else { return };
                                    let mut io = TokioIo::new(up);
                                    let mut buf = [0u8; 1024];
                                    // Echo every byte back, prefixed once.
                                    let _ = io.write_all(b"agent:").await;
                                    loop {
                                        match io.read(&mut buf).await {
                                            Ok(0) | Err(_) => return,
                                            Ok(n) => {
                                                if io.write_all(&buf[..n]).await.is_err() {
                                                    return;
                                                }
                                            }
                                        }
                                    }
                                });
                                Response::builder()
                                    .status(StatusCode::SWITCHING_PROTOCOLS)
                                    .header("connection", "Upgrade")
                                    .header("upgrade", upgrade)
                                    .header("sec-websocket-protocol", protocol)
                                    .body(Body::empty())
                                    .unwrap()
                            } else {
                                Response::builder()
                                    .status(StatusCode::NOT_FOUND)
                                    .body(Body::from("no such container"))
                                    .unwrap()
                            };
                            Ok::<_, Infallible>(resp)
                        }
                    });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), svc)
                    .with_upgrades()
                    .await;
            });
        }
    });
    port
}

struct Cluster {
    router: axum::Router,
    seen: Arc<Mutex<Seen>>,
    release: Arc<Notify>,
    _dir: tempfile::TempDir,
}

async fn cluster() -> Cluster {
    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::load_or_create(&dir.path().join("pki"), &[]).unwrap();
    let seen = Arc::new(Mutex::new(Seen::default()));
    let release = Arc::new(Notify::new());
    let port = fake_agent(&pki, seen.clone(), release.clone()).await;
    let store: Arc<dyn Store> =
        RedbStore::open(&dir.path().join("s.redb"), Default::default()).unwrap();
    let config = skiff_apiserver::Config {
        kubelet_client: Some((
            pki.kubelet_client.cert_pem.clone(),
            pki.kubelet_client.key_pem.clone(),
        )),
        ..Default::default()
    };
    let server = skiff_apiserver::ApiServer::start(store, config)
        .await
        .unwrap();
    let router = server.in_process_router("test");
    let c = Cluster {
        router,
        seen,
        release,
        _dir: dir,
    };
    c.post(
        "/api/v1/nodes",
        json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n1"},
            "status": {"addresses": [{"type": "Hostname", "address": "n1.invalid"}, {"type": "InternalIP", "address": "127.0.0.1"}],
                "daemonEndpoints": {"kubeletEndpoint": {"Port": port}}}}),
    )
    .await;
    c.post(
        "/api/v1/namespaces/default/pods",
        json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "web", "labels": {"app": "web"}},
            "spec": {"nodeName": "n1", "containers": [{"name": "app", "image": "i:1"}]}}),
    )
    .await;
    c.post(
        "/api/v1/namespaces/default/pods",
        json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "two"},
            "spec": {"nodeName": "n1", "containers": [{"name": "a", "image": "i:1"}, {"name": "b", "image": "i:1"}]}}),
    )
    .await;
    c.post(
        "/api/v1/namespaces/default/pods",
        json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "unbound"},
            "spec": {"containers": [{"name": "a", "image": "i:1"}]}}),
    )
    .await;
    c
}

impl Cluster {
    async fn post(&self, path: &str, v: Value) {
        let r = Request::builder()
            .method("POST")
            .uri(path)
            .header("content-type", "application/json")
            .body(Body::from(v.to_string()))
            .unwrap();
        let resp = self.router.clone().oneshot(r).await.unwrap();
        assert_eq!(resp.status(), StatusCode::CREATED, "{path}");
    }
    async fn get(&self, path: &str) -> Response<Body> {
        let r = Request::builder().uri(path).body(Body::empty()).unwrap();
        self.router.clone().oneshot(r).await.unwrap()
    }
    fn last_request(&self) -> (String, String, String) {
        self.seen.lock().unwrap().requests.last().cloned().unwrap()
    }
}

async fn status_of(r: Response<Body>) -> (StatusCode, Value) {
    let code = r.status();
    let b = r.into_body().collect().await.unwrap().to_bytes();
    (code, serde_json::from_slice(&b).unwrap_or(Value::Null))
}

#[tokio::test]
async fn logs_stream_from_the_agent_of_the_pods_node() {
    let c = cluster().await;
    let r = c
        .get("/api/v1/namespaces/default/pods/web/log?follow=true&tailLines=5&timestamps=true")
        .await;
    assert_eq!(r.status(), StatusCode::OK);
    let mut body = r.into_body();
    // The first line arrives while the agent still holds the second.
    let first = tokio::time::timeout(Duration::from_secs(5), body.frame())
        .await
        .expect("the first line is streamed before the log ends")
        .unwrap()
        .unwrap()
        .into_data()
        .unwrap();
    assert_eq!(first, Bytes::from("first line\n"));
    let (path, user, _) = c.last_request();
    assert_eq!(
        path,
        "/containerLogs/default/web/app?follow=true&tailLines=5&timestamps=true"
    );
    assert_eq!(user, "kube-apiserver-kubelet-client");
    c.release.notify_one();
    let rest = body.collect().await.unwrap().to_bytes();
    assert_eq!(rest, Bytes::from("second line\n"));
}

#[tokio::test]
async fn containers_are_resolved_as_kubernetes_does() {
    let c = cluster().await;
    let (code, s) = status_of(c.get("/api/v1/namespaces/default/pods/two/log").await).await;
    assert_eq!(code, StatusCode::BAD_REQUEST);
    assert_eq!(
        s["message"],
        "a container name must be specified for pod two, choose one of: [a b]"
    );
    let r = c
        .get("/api/v1/namespaces/default/pods/two/log?container=b&previous=true")
        .await;
    assert_eq!(r.status(), StatusCode::OK);
    assert_eq!(
        c.last_request().0,
        "/containerLogs/default/two/b?previous=true"
    );
    let (code, _) = status_of(c.get("/api/v1/namespaces/default/pods/ghost/log").await).await;
    assert_eq!(code, StatusCode::NOT_FOUND);
    let (code, s) = status_of(c.get("/api/v1/namespaces/default/pods/unbound/log").await).await;
    assert_eq!(code, StatusCode::BAD_REQUEST);
    assert!(
        s["message"]
            .as_str()
            .unwrap()
            .contains("does not have a host assigned"),
        "{s}"
    );
}

/// Serves the router on a socket (upgrades need a real connection).
async fn serve(router: axum::Router) -> u16 {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        let _ = axum::serve(listener, router).await;
    });
    port
}

async fn read_head(s: &mut tokio::net::TcpStream) -> String {
    let mut head = Vec::new();
    let mut b = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        let n = s.read(&mut b).await.unwrap();
        assert_eq!(
            n,
            1,
            "connection closed in the response head: {:?}",
            String::from_utf8_lossy(&head)
        );
        head.push(b[0]);
    }
    String::from_utf8(head).unwrap()
}

#[tokio::test]
async fn exec_and_portforward_upgrades_are_relayed_byte_for_byte() {
    let c = cluster().await;
    let port = serve(c.router.clone()).await;
    let mut s = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .unwrap();
    s.write_all(
        b"GET /api/v1/namespaces/default/pods/web/exec?command=sh&command=-c&command=echo%20hi&stdin=true&stdout=true&tty=false HTTP/1.1\r\n\
Host: localhost\r\nConnection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Version: 13\r\n\
Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Protocol: v5.channel.k8s.io, v4.channel.k8s.io\r\n\r\n",
    )
    .await
    .unwrap();
    let head = read_head(&mut s).await;
    assert!(head.starts_with("HTTP/1.1 101"), "{head}");
    assert!(
        head.to_ascii_lowercase()
            .contains("sec-websocket-protocol: v5.channel.k8s.io"),
        "{head}"
    );
    let (path, user, upgrade) = c.last_request();
    assert_eq!(
        path,
        "/exec/default/web/app?command=sh&command=-c&command=echo%20hi&stdin=true&stdout=true&tty=false"
    );
    assert_eq!(user, "kube-apiserver-kubelet-client");
    assert_eq!(upgrade, "websocket");
    // Bytes both ways, untouched (including ones that are not UTF-8).
    let sent = [0x82u8, 0x03, 0x00, b'h', 0xff];
    s.write_all(&sent).await.unwrap();
    let mut got = vec![0u8; 6 + sent.len()];
    tokio::time::timeout(Duration::from_secs(5), s.read_exact(&mut got))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(&got[..6], b"agent:");
    assert_eq!(&got[6..], &sent);

    // Port forwarding over SPDY: same relay, to the pod-level path.
    let mut s = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .unwrap();
    s.write_all(
        b"POST /api/v1/namespaces/default/pods/web/portforward?ports=8080 HTTP/1.1\r\n\
Host: localhost\r\nConnection: Upgrade\r\nUpgrade: SPDY/3.1\r\nX-Stream-Protocol-Version: portforward.k8s.io\r\nContent-Length: 0\r\n\r\n",
    )
    .await
    .unwrap();
    let head = read_head(&mut s).await;
    assert!(head.starts_with("HTTP/1.1 101"), "{head}");
    assert_eq!(c.last_request().0, "/portForward/default/web?ports=8080");
    assert_eq!(c.last_request().2, "SPDY/3.1");
    s.write_all(b"ping").await.unwrap();
    let mut got = [0u8; 10];
    s.read_exact(&mut got).await.unwrap();
    assert_eq!(&got, b"agent:ping");
}

#[tokio::test]
async fn node_proxy_reaches_the_agents_stats_and_passes_its_answer_back() {
    let c = cluster().await;
    let r = c.get("/api/v1/nodes/n1/proxy/stats/summary").await;
    assert_eq!(r.status(), StatusCode::OK);
    assert_eq!(r.headers().get("content-type").unwrap(), "application/json");
    let body = r.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(body, Bytes::from(FAKE_SUMMARY));
    let (path, user, _) = c.last_request();
    assert_eq!(path, "/stats/summary");
    assert_eq!(user, "kube-apiserver-kubelet-client");

    // The query goes along; the agent's own error comes back untouched.
    let r = c.get("/api/v1/nodes/n1/proxy/metrics/resource?a=1").await;
    assert_eq!(r.status(), StatusCode::NOT_FOUND);
    assert_eq!(c.last_request().0, "/metrics/resource?a=1");
    let body = r.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(body, Bytes::from("no such container"));

    // An unknown node is a NotFound Status; a node without an endpoint 503.
    let (code, s) = status_of(c.get("/api/v1/nodes/ghost/proxy/stats/summary").await).await;
    assert_eq!(code, StatusCode::NOT_FOUND);
    assert_eq!(s["kind"], "Status");
    assert_eq!(s["reason"], "NotFound");
    assert_eq!(s["message"], "nodes \"ghost\" not found");
    c.post(
        "/api/v1/nodes",
        json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "bare"}}),
    )
    .await;
    let (code, s) = status_of(c.get("/api/v1/nodes/bare/proxy/stats/summary").await).await;
    assert_eq!(code, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(s["kind"], "Status");
    assert_eq!(s["code"], 503);

    // Discovery lists the subresource, so kubectl does not refuse it.
    let (_, d) = status_of(c.get("/api/v1").await).await;
    let names: Vec<&str> = d["resources"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|r| r["name"].as_str())
        .collect();
    assert!(names.contains(&"nodes/proxy"), "{names:?}");
}

#[tokio::test]
async fn the_metrics_api_serves_node_and_pod_usage_from_the_agents_summary() {
    let c = cluster().await;
    // A node whose agent does not answer, with a pod on it: both left out.
    c.post(
        "/api/v1/nodes",
        json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "down"},
            "status": {"addresses": [{"type": "InternalIP", "address": "127.0.0.1"}],
                "daemonEndpoints": {"kubeletEndpoint": {"Port": 1}}}}),
    )
    .await;
    c.post(
        "/api/v1/namespaces/default/pods",
        json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "far", "labels": {"app": "web"}},
            "spec": {"nodeName": "down", "containers": [{"name": "a", "image": "i:1"}]}}),
    )
    .await;

    let (code, l) = status_of(c.get("/apis/metrics.k8s.io/v1beta1/nodes").await).await;
    assert_eq!(code, StatusCode::OK, "{l}");
    assert_eq!(l["kind"], "NodeMetricsList");
    assert_eq!(l["apiVersion"], "metrics.k8s.io/v1beta1");
    let items = l["items"].as_array().unwrap();
    assert_eq!(items.len(), 1, "{l}");
    let n = &items[0];
    assert_eq!(n["kind"], "NodeMetrics");
    assert_eq!(n["metadata"]["name"], "n1");
    assert_eq!(n["timestamp"], "2026-01-01T00:00:12Z");
    assert_eq!(n["usage"], json!({"cpu": "1500m", "memory": "2Gi"}));
    // First read of the node: a second sample a second later is the window.
    let window = n["window"].as_str().unwrap();
    assert!(window.ends_with('s') && window.starts_with('1'), "{window}");
    let (path, user, _) = c.last_request();
    assert_eq!(path, "/stats/summary");
    assert_eq!(user, "kube-apiserver-kubelet-client");

    let (code, m) = status_of(c.get("/apis/metrics.k8s.io/v1beta1/nodes/n1").await).await;
    assert_eq!(code, StatusCode::OK, "{m}");
    assert_eq!(m["usage"]["cpu"], "1500m");
    for missing in ["down", "ghost"] {
        let (code, s) = status_of(
            c.get(&format!("/apis/metrics.k8s.io/v1beta1/nodes/{missing}"))
                .await,
        )
        .await;
        assert_eq!(code, StatusCode::NOT_FOUND);
        assert_eq!(s["kind"], "Status");
        assert_eq!(s["reason"], "NotFound");
        assert_eq!(
            s["message"],
            format!("nodemetrics.metrics.k8s.io \"{missing}\" not found")
        );
    }

    let (code, l) = status_of(
        c.get("/apis/metrics.k8s.io/v1beta1/namespaces/default/pods")
            .await,
    )
    .await;
    assert_eq!(code, StatusCode::OK, "{l}");
    assert_eq!(l["kind"], "PodMetricsList");
    let mut pods: Vec<Value> = l["items"].as_array().unwrap().clone();
    pods.sort_by_key(|p| p["metadata"]["name"].as_str().unwrap().to_string());
    let names: Vec<&str> = pods
        .iter()
        .map(|p| p["metadata"]["name"].as_str().unwrap())
        .collect();
    // Not `unbound` (no node), `far` (agent down) nor `stray` (no such pod).
    assert_eq!(names, ["two", "web"]);
    assert_eq!(pods[1]["kind"], "PodMetrics");
    assert_eq!(pods[1]["metadata"]["namespace"], "default");
    assert_eq!(pods[1]["metadata"]["labels"], json!({"app": "web"}));
    assert_eq!(
        pods[1]["containers"],
        json!([{"name": "app", "usage": {"cpu": "123456789n", "memory": "5Mi"}}])
    );
    assert_eq!(
        pods[0]["containers"],
        json!([{"name": "a", "usage": {"cpu": "1m", "memory": "1Mi"}},
            {"name": "b", "usage": {"cpu": "7n", "memory": "4Ki"}}])
    );

    // Label and field selectors pick the pods measured.
    let (_, l) = status_of(
        c.get("/apis/metrics.k8s.io/v1beta1/namespaces/default/pods?labelSelector=app%3Dweb")
            .await,
    )
    .await;
    let names: Vec<&str> = l["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["metadata"]["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["web"]);
    let (_, l) = status_of(
        c.get("/apis/metrics.k8s.io/v1beta1/pods?fieldSelector=metadata.name%3Dtwo")
            .await,
    )
    .await;
    assert_eq!(l["items"].as_array().unwrap().len(), 1, "{l}");
    assert_eq!(l["items"][0]["metadata"]["name"], "two");
    let (_, l) = status_of(
        c.get("/apis/metrics.k8s.io/v1beta1/namespaces/kube-system/pods")
            .await,
    )
    .await;
    assert_eq!(l["items"], json!([]));
    let (_, l) = status_of(
        c.get("/apis/metrics.k8s.io/v1beta1/nodes?labelSelector=zone%3Dnowhere")
            .await,
    )
    .await;
    assert_eq!(l["items"], json!([]));

    let (code, p) = status_of(
        c.get("/apis/metrics.k8s.io/v1beta1/namespaces/default/pods/web")
            .await,
    )
    .await;
    assert_eq!(code, StatusCode::OK, "{p}");
    assert_eq!(p["containers"][0]["usage"]["memory"], "5Mi");
    let (code, s) = status_of(
        c.get("/apis/metrics.k8s.io/v1beta1/namespaces/default/pods/unbound")
            .await,
    )
    .await;
    assert_eq!(code, StatusCode::NOT_FOUND);
    assert_eq!(
        s["message"],
        "podmetrics.metrics.k8s.io \"default/unbound\" not found"
    );

    // Read-only, and discoverable.
    let r = Request::builder()
        .method("DELETE")
        .uri("/apis/metrics.k8s.io/v1beta1/nodes/n1")
        .body(Body::empty())
        .unwrap();
    let (code, _) = status_of(c.router.clone().oneshot(r).await.unwrap()).await;
    assert_eq!(code, StatusCode::METHOD_NOT_ALLOWED);
    let (code, d) = status_of(c.get("/apis/metrics.k8s.io/v1beta1").await).await;
    assert_eq!(code, StatusCode::OK);
    let names: Vec<&str> = d["resources"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|r| r["name"].as_str())
        .collect();
    assert_eq!(names, ["nodes", "pods"]);
}
