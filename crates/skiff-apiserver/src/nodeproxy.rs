//! `pods/log`, `pods/exec`, `pods/attach` and `pods/portforward`: proxied to
//! the agent of the pod's node, as kube-apiserver proxies to the kubelet.
//! The server resolves the pod, its node and the container, then forwards
//! the request to the agent's HTTPS endpoint with the server's
//! kubelet-client certificate. A connection upgrade (WebSocket or SPDY, as
//! kubectl speaks them) is passed through: once the agent answers 101, bytes
//! are copied both ways untouched.
//!
//! `nodes/{name}/proxy/{path}` forwards any request to that path on the
//! node's agent (so `kubectl get --raw /api/v1/nodes/N/proxy/stats/summary`
//! reaches kubelet's Summary API) and streams the agent's answer back as it
//! is, status included.

use std::sync::Arc;

use axum::body::Body;
use http::{header, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use serde_json::Value;
use skiff_core::error::ApiError;
use skiff_core::resources;

use crate::state::AppState;

/// Which pod subresource a path names, if it is one this module serves:
/// (namespace, pod, subresource).
pub fn parse(path: &str) -> Option<(String, String, &'static str)> {
    let rest = path.strip_prefix("/api/v1/namespaces/")?;
    let mut parts = rest.trim_end_matches('/').split('/');
    let ns = parts.next()?;
    if parts.next()? != "pods" {
        return None;
    }
    let pod = parts.next()?;
    let sub = match parts.next()? {
        "log" => "log",
        "exec" => "exec",
        "attach" => "attach",
        "portforward" => "portforward",
        _ => return None,
    };
    if parts.next().is_some() {
        return None;
    }
    Some((ns.to_string(), pod.to_string(), sub))
}

/// `/api/v1/nodes/{name}/proxy[/{path}]`: (node name, port if the name
/// carries one as `name:port` or `https:name:port`, path on the agent).
pub fn parse_node(path: &str) -> Option<(String, Option<u16>, String)> {
    let rest = path.strip_prefix("/api/v1/nodes/")?;
    let (name, rest) = rest.split_once('/')?;
    let tail = if rest == "proxy" {
        ""
    } else {
        rest.strip_prefix("proxy/")?
    };
    let name = name.strip_prefix("https:").unwrap_or(name);
    let (name, port) = match name.rsplit_once(':') {
        Some((n, p)) => (n, Some(p.parse::<u16>().ok()?)),
        None => (name, None),
    };
    if name.is_empty() || name.contains(':') {
        return None;
    }
    Some((name.to_string(), port, format!("/{tail}")))
}

/// A TLS client for agents: presents the kubelet-client certificate and
/// verifies the agent's serving certificate against `ca_pem` (the cluster
/// CA, which signs agents' `kubelet-serving` requests) for the address
/// dialed, as kube-apiserver does with `--kubelet-certificate-authority`;
/// without a CA, as kube-apiserver without that flag, it does not check it.
pub fn client_config(
    cert_pem: &str,
    key_pem: &str,
    ca_pem: Option<&str>,
) -> anyhow::Result<rustls::ClientConfig> {
    use rustls_pki_types::pem::PemObject;
    let certs: Vec<rustls_pki_types::CertificateDer<'static>> =
        rustls_pki_types::CertificateDer::pem_slice_iter(cert_pem.as_bytes())
            .collect::<Result<_, _>>()
            .map_err(|e| anyhow::anyhow!("kubelet client certificate: {e:?}"))?;
    let key = rustls_pki_types::PrivateKeyDer::from_pem_slice(key_pem.as_bytes())
        .map_err(|e| anyhow::anyhow!("kubelet client key: {e:?}"))?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()?;
    let config = match ca_pem {
        Some(ca) => {
            let mut roots = rustls::RootCertStore::empty();
            for c in rustls_pki_types::CertificateDer::pem_slice_iter(ca.as_bytes()) {
                roots.add(c.map_err(|e| anyhow::anyhow!("cluster CA: {e:?}"))?)?;
            }
            let verifier = rustls::client::WebPkiServerVerifier::builder_with_provider(
                Arc::new(roots),
                provider,
            )
            .build()?;
            builder
                .with_webpki_verifier(verifier)
                .with_client_auth_cert(certs, key)?
        }
        None => builder
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(crate::tls::AnyServer(provider)))
            .with_client_auth_cert(certs, key)?,
    };
    Ok(config)
}

fn s<'a>(v: &'a Value, ptr: &str) -> &'a str {
    v.pointer(ptr).and_then(Value::as_str).unwrap_or("")
}

/// The container a request is for: the one named, else the pod's only
/// container or its default-container annotation.
fn container_of(pod: &Value, name: &str, asked: Option<&str>) -> Result<String, ApiError> {
    let names: Vec<String> = [
        "/spec/containers",
        "/spec/initContainers",
        "/spec/ephemeralContainers",
    ]
    .iter()
    .filter_map(|p| pod.pointer(p).and_then(Value::as_array))
    .flatten()
    .filter_map(|c| c.get("name").and_then(Value::as_str).map(str::to_string))
    .collect();
    if let Some(c) = asked.filter(|c| !c.is_empty()) {
        if names.iter().any(|n| n == c) {
            return Ok(c.to_string());
        }
        return Err(ApiError::bad_request(format!(
            "container {c} is not valid for pod {name}"
        )));
    }
    let annotated = s(
        pod,
        "/metadata/annotations/kubectl.kubernetes.io~1default-container",
    );
    if !annotated.is_empty() {
        return Ok(annotated.to_string());
    }
    let main: Vec<&str> = pod
        .pointer("/spec/containers")
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(|c| c.get("name").and_then(Value::as_str))
                .collect()
        })
        .unwrap_or_default();
    match main.as_slice() {
        [one] => Ok(one.to_string()),
        _ => Err(ApiError::bad_request(format!(
            "a container name must be specified for pod {name}, choose one of: [{}]",
            main.join(" ")
        ))),
    }
}

/// Where a node's agent listens: its first address of InternalIP,
/// ExternalIP, Hostname, and the daemon endpoint's port. 404 for an unknown
/// node, 503 when it has neither.
async fn agent_endpoint(state: &AppState, node_name: &str) -> Result<(String, u16), ApiError> {
    let nodes = resources::lookup("", "v1", "nodes").expect("nodes");
    let node = state.registry.get(nodes, None, node_name).await?;
    let addresses = node
        .pointer("/status/addresses")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let address = ["InternalIP", "ExternalIP", "Hostname"]
        .iter()
        .find_map(|t| {
            addresses
                .iter()
                .find(|a| s(a, "/type") == *t)
                .map(|a| s(a, "/address").to_string())
        })
        .unwrap_or_default();
    let port = node
        .pointer("/status/daemonEndpoints/kubeletEndpoint/Port")
        .and_then(Value::as_u64)
        .and_then(|p| u16::try_from(p).ok())
        .unwrap_or(0);
    if address.is_empty() || port == 0 {
        return Err(ApiError::new(
            503,
            "ServiceUnavailable",
            format!("node {node_name} has no reachable agent endpoint"),
        ));
    }
    Ok((address, port))
}

/// A TLS connection to an agent with the kubelet-client certificate, ready
/// for HTTP/1.1 requests (upgrades included).
async fn dial<B>(
    state: &AppState,
    address: &str,
    port: u16,
) -> Result<hyper::client::conn::http1::SendRequest<B>, DialError>
where
    B: hyper::body::Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let Some(tls) = state.kubelet_tls.clone() else {
        return Err(DialError::NoCertificate);
    };
    let failed = |e: String| DialError::Failed(e);
    let tcp = tokio::net::TcpStream::connect((address, port))
        .await
        .map_err(|e| failed(e.to_string()))?;
    let server_name = rustls_pki_types::ServerName::try_from(address.to_string())
        .map_err(|e| failed(e.to_string()))?;
    let stream = tokio_rustls::TlsConnector::from(tls)
        .connect(server_name, tcp)
        .await
        .map_err(|e| failed(e.to_string()))?;
    let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(|e| failed(e.to_string()))?;
    tokio::spawn(async move {
        let _ = conn.with_upgrades().await;
    });
    Ok(sender)
}

enum DialError {
    NoCertificate,
    Failed(String),
}

fn no_certificate() -> ApiError {
    ApiError::new(
        503,
        "ServiceUnavailable",
        "this API server has no client certificate for node agents".to_string(),
    )
}

/// `nodes/{name}/proxy/{path}`: the request goes to `path` on the node's
/// agent with its query and body; the agent's answer comes back as it is.
pub async fn proxy_node(
    state: &Arc<AppState>,
    req: Request<Body>,
    node_name: &str,
    port: Option<u16>,
    path: &str,
) -> Result<Response<Body>, ApiError> {
    let (address, node_port) = agent_endpoint(state, node_name).await?;
    let port = port.unwrap_or(node_port);
    let unreachable = |e: String| {
        ApiError::new(
            503,
            "ServiceUnavailable",
            format!("error trying to reach service: {e}"),
        )
    };
    let mut sender = dial::<Body>(state, &address, port)
        .await
        .map_err(|e| match e {
            DialError::NoCertificate => no_certificate(),
            DialError::Failed(e) => unreachable(e),
        })?;
    let uri = match req.uri().query() {
        Some(q) if !q.is_empty() => format!("{path}?{q}"),
        _ => path.to_string(),
    };
    let (parts, body) = req.into_parts();
    let mut out = Request::builder().method(parts.method).uri(&uri);
    for (k, v) in &parts.headers {
        if k == header::HOST || k == header::AUTHORIZATION || k == header::CONNECTION {
            continue;
        }
        out = out.header(k, v);
    }
    out = out.header(header::HOST, format!("{address}:{port}"));
    let out = out.body(body).map_err(|e| unreachable(e.to_string()))?;
    let resp = sender
        .send_request(out)
        .await
        .map_err(|e| unreachable(e.to_string()))?;
    crate::response::relayed(resp).map_err(|e| unreachable(e.to_string()))
}

/// GETs `path` from the agent of `node_name` and returns the body of a 200
/// answer: 404 for an unknown node, 503 when the agent has no endpoint or
/// cannot be reached, the agent's code for any other answer. For callers
/// that read kubelet endpoints themselves (the metrics API).
pub async fn agent_get(
    state: &AppState,
    node_name: &str,
    path: &str,
) -> Result<bytes::Bytes, ApiError> {
    let (address, port) = agent_endpoint(state, node_name).await?;
    let unreachable = |e: String| {
        ApiError::new(
            503,
            "ServiceUnavailable",
            format!("error trying to reach node {node_name}: {e}"),
        )
    };
    let mut sender = dial::<http_body_util::Empty<bytes::Bytes>>(state, &address, port)
        .await
        .map_err(|e| match e {
            DialError::NoCertificate => no_certificate(),
            DialError::Failed(e) => unreachable(e),
        })?;
    let req = Request::get(path)
        .header(header::HOST, format!("{address}:{port}"))
        .body(http_body_util::Empty::<bytes::Bytes>::new())
        .map_err(|e| unreachable(e.to_string()))?;
    let resp = sender
        .send_request(req)
        .await
        .map_err(|e| unreachable(e.to_string()))?;
    let status = resp.status();
    let body = http_body_util::BodyExt::collect(resp.into_body())
        .await
        .map_err(|e| unreachable(e.to_string()))?
        .to_bytes();
    if status != StatusCode::OK {
        return Err(ApiError::new(
            status.as_u16(),
            "InternalError",
            format!(
                "node {node_name} answered {path} with {status}: {}",
                String::from_utf8_lossy(&body).trim()
            ),
        ));
    }
    Ok(body)
}

/// The query string without `container` (the agent takes it in the path).
fn forward_query(query: Option<&str>) -> String {
    query
        .unwrap_or("")
        .split('&')
        .filter(|p| !p.is_empty() && !p.starts_with("container="))
        .collect::<Vec<_>>()
        .join("&")
}

fn query_value(query: Option<&str>, key: &str) -> Option<String> {
    query?.split('&').find_map(|p| {
        let (k, v) = p.split_once('=')?;
        (k == key).then(|| v.replace("%2F", "/"))
    })
}

pub async fn proxy(
    state: &Arc<AppState>,
    mut req: Request<Body>,
    ns: &str,
    pod_name: &str,
    sub: &str,
) -> Result<Response<Body>, ApiError> {
    let pods = resources::lookup("", "v1", "pods").expect("pods");
    let pod = state.registry.get(pods, Some(ns), pod_name).await?;
    let node_name = s(&pod, "/spec/nodeName");
    if node_name.is_empty() {
        return Err(ApiError::bad_request(format!(
            "pod {pod_name} does not have a host assigned"
        )));
    }
    let query = req.uri().query().map(str::to_string);
    let target_path = if sub == "portforward" {
        format!("/portForward/{ns}/{pod_name}")
    } else {
        let container = container_of(
            &pod,
            pod_name,
            query_value(query.as_deref(), "container").as_deref(),
        )?;
        let prefix = match sub {
            "log" => "containerLogs",
            "exec" => "exec",
            _ => "attach",
        };
        format!("/{prefix}/{ns}/{pod_name}/{container}")
    };
    let (address, port) = agent_endpoint(state, node_name).await?;
    let q = forward_query(query.as_deref());
    let uri = if q.is_empty() {
        target_path
    } else {
        format!("{target_path}?{q}")
    };

    let connect_err =
        |e: String| ApiError::new(502, "InternalError", format!("error dialing backend: {e}"));
    let mut sender = dial::<http_body_util::Empty<bytes::Bytes>>(state, &address, port)
        .await
        .map_err(|e| match e {
            DialError::NoCertificate => no_certificate(),
            DialError::Failed(e) => connect_err(e),
        })?;
    let upgrading = req.headers().contains_key(header::UPGRADE);
    let client_upgrade = upgrading.then(|| hyper::upgrade::on(&mut req));
    let mut out = Request::builder().method(req.method().clone()).uri(&uri);
    for (k, v) in req.headers() {
        if k == header::HOST || k == header::AUTHORIZATION || k == header::CONTENT_LENGTH {
            continue;
        }
        out = out.header(k, v);
    }
    out = out.header(header::HOST, format!("{address}:{port}"));
    let out = out
        .body(http_body_util::Empty::<bytes::Bytes>::new())
        .map_err(|e| connect_err(e.to_string()))?;
    let mut resp = sender
        .send_request(out)
        .await
        .map_err(|e| connect_err(e.to_string()))?;
    if resp.status() == StatusCode::SWITCHING_PROTOCOLS {
        let Some(client_upgrade) = client_upgrade else {
            return Err(connect_err("the agent upgraded a plain request".into()));
        };
        let agent_upgrade = hyper::upgrade::on(&mut resp);
        tokio::spawn(async move {
            let (Ok(a), Ok(b)) = (client_upgrade.await, agent_upgrade.await) else {
                return;
            };
            let _ = tokio::io::copy_bidirectional(&mut TokioIo::new(a), &mut TokioIo::new(b)).await;
        });
        let mut builder = Response::builder().status(StatusCode::SWITCHING_PROTOCOLS);
        for (k, v) in resp.headers() {
            builder = builder.header(k, v);
        }
        return builder
            .body(Body::empty())
            .map_err(|e| connect_err(e.to_string()));
    }
    let status = resp.status();
    if !status.is_success() {
        // The agent's plain-text error becomes a Status with its code.
        let body = http_body_util::BodyExt::collect(resp.into_body())
            .await
            .map(|b| String::from_utf8_lossy(&b.to_bytes()).trim().to_string())
            .unwrap_or_default();
        let reason = match status.as_u16() {
            400 => "BadRequest",
            404 => "NotFound",
            _ => "InternalError",
        };
        return Err(ApiError::new(status.as_u16(), reason, body));
    }
    let (parts, body) = resp.into_parts();
    let mut builder = Response::builder().status(parts.status);
    if let Some(ct) = parts.headers.get(header::CONTENT_TYPE) {
        builder = builder.header(header::CONTENT_TYPE, ct);
    }
    builder
        .body(Body::new(body))
        .map_err(|e| connect_err(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn only_the_streaming_pod_subresources_are_proxied() {
        assert_eq!(
            parse("/api/v1/namespaces/default/pods/web/log"),
            Some(("default".into(), "web".into(), "log"))
        );
        assert_eq!(
            parse("/api/v1/namespaces/a/pods/b/exec").map(|p| p.2),
            Some("exec")
        );
        assert_eq!(parse("/api/v1/namespaces/a/pods/b/status"), None);
        assert_eq!(parse("/api/v1/namespaces/a/pods/b"), None);
        assert_eq!(parse("/api/v1/namespaces/a/services/b/log"), None);
    }

    #[test]
    fn node_proxy_paths_name_the_node_an_optional_port_and_the_agent_path() {
        assert_eq!(
            parse_node("/api/v1/nodes/n1/proxy/stats/summary"),
            Some(("n1".into(), None, "/stats/summary".into()))
        );
        assert_eq!(
            parse_node("/api/v1/nodes/n1/proxy"),
            Some(("n1".into(), None, "/".into()))
        );
        assert_eq!(
            parse_node("/api/v1/nodes/https:n1:10250/proxy/metrics/resource"),
            Some(("n1".into(), Some(10250), "/metrics/resource".into()))
        );
        assert_eq!(parse_node("/api/v1/nodes/n1/status"), None);
        assert_eq!(parse_node("/api/v1/nodes/n1"), None);
        assert_eq!(parse_node("/api/v1/nodes/n1/proxyx/a"), None);
        assert_eq!(parse_node("/api/v1/nodes/n1:x/proxy/a"), None);
    }

    #[test]
    fn the_default_container_is_the_only_one_or_the_annotated_one() {
        let one = json!({"spec": {"containers": [{"name": "a"}]}});
        assert_eq!(container_of(&one, "p", None).unwrap(), "a");
        let two = json!({"spec": {"containers": [{"name": "a"}, {"name": "b"}]}});
        let err = container_of(&two, "p", None).unwrap_err();
        assert!(format!("{err:?}")
            .contains("a container name must be specified for pod p, choose one of: [a b]"));
        let annotated = json!({"metadata": {"annotations": {"kubectl.kubernetes.io/default-container": "b"}}, "spec": {"containers": [{"name": "a"}, {"name": "b"}]}});
        assert_eq!(container_of(&annotated, "p", None).unwrap(), "b");
        assert!(container_of(&one, "p", Some("zzz")).is_err());
    }

    #[test]
    fn the_container_parameter_moves_into_the_path() {
        assert_eq!(
            forward_query(Some("container=a&follow=true&tailLines=5")),
            "follow=true&tailLines=5"
        );
        assert_eq!(forward_query(None), "");
    }

    /// Whether a TLS client with `config` completes a handshake with a
    /// server presenting `serving` on 127.0.0.1.
    async fn handshake(config: rustls::ClientConfig, serving: &crate::tls::CertPair) -> bool {
        use rustls_pki_types::pem::PemObject;
        let certs = rustls_pki_types::CertificateDer::pem_slice_iter(serving.cert_pem.as_bytes())
            .collect::<Result<Vec<_>, _>>()
            .unwrap();
        let key =
            rustls_pki_types::PrivateKeyDer::from_pem_slice(serving.key_pem.as_bytes()).unwrap();
        let server = rustls::ServerConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .unwrap();
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = l.local_addr().unwrap().port();
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(server));
        tokio::spawn(async move {
            let (tcp, _) = l.accept().await.unwrap();
            let _ = acceptor.accept(tcp).await;
        });
        let tcp = tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .unwrap();
        let name = rustls_pki_types::ServerName::try_from("127.0.0.1").unwrap();
        tokio_rustls::TlsConnector::from(Arc::new(config))
            .connect(name, tcp)
            .await
            .is_ok()
    }

    #[tokio::test]
    async fn agents_are_verified_against_the_cluster_ca_for_their_address() {
        let dir = tempfile::tempdir().unwrap();
        let pki = crate::tls::Pki::load_or_create(dir.path(), &[]).unwrap();
        let other = crate::tls::Pki::load_or_create(&dir.path().join("other"), &[]).unwrap();
        let client = &pki.kubelet_client;
        let verifying =
            || client_config(&client.cert_pem, &client.key_pem, Some(&pki.ca.cert_pem)).unwrap();
        let ours = crate::tls::issue(
            &pki.ca,
            "system:node:n1",
            &[],
            &["127.0.0.1".into()],
            false,
            1,
        )
        .unwrap();
        let elsewhere = crate::tls::issue(
            &pki.ca,
            "system:node:n2",
            &[],
            &["10.9.9.9".into()],
            false,
            1,
        )
        .unwrap();
        let foreign = crate::tls::issue(
            &other.ca,
            "system:node:n1",
            &[],
            &["127.0.0.1".into()],
            false,
            1,
        )
        .unwrap();
        assert!(handshake(verifying(), &ours).await);
        assert!(
            !handshake(verifying(), &elsewhere).await,
            "another address passed"
        );
        assert!(!handshake(verifying(), &foreign).await, "another CA passed");
        // Without a CA (no cluster signing configured) nothing is checked.
        let lax = client_config(&client.cert_pem, &client.key_pem, None).unwrap();
        assert!(handshake(lax, &foreign).await);
    }
}
