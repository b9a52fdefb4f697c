//! What the API server benchmarks share: percentiles, and HTTPS/2 clients
//! of a server made with a [`Pki`].
#![allow(dead_code)]

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper_util::rt::{TokioExecutor, TokioIo};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use skiff_apiserver::tls::Pki;

pub type Sender = hyper::client::conn::http2::SendRequest<Full<Bytes>>;

/// The `p` quantile of sorted durations, in milliseconds.
pub fn pct(sorted: &[Duration], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    sorted[((sorted.len() as f64 - 1.0) * p).round() as usize].as_secs_f64() * 1000.0
}

/// TLS for the server's CA, offering h2, as the admin (`admin`) or with no
/// client certificate.
pub fn client_tls(pki: &Pki, admin: bool) -> Arc<rustls::ClientConfig> {
    let mut roots = rustls::RootCertStore::empty();
    roots
        .add(CertificateDer::from_pem_slice(pki.ca.cert_pem.as_bytes()).unwrap())
        .unwrap();
    let builder = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(roots);
    let mut cfg = if admin {
        let certs: Vec<CertificateDer<'static>> =
            CertificateDer::pem_slice_iter(pki.admin.cert_pem.as_bytes())
                .map(|c| c.unwrap())
                .collect();
        let key = PrivateKeyDer::from_pem_slice(pki.admin.key_pem.as_bytes()).unwrap();
        builder.with_client_auth_cert(certs, key).unwrap()
    } else {
        builder.with_no_client_auth()
    };
    cfg.alpn_protocols = vec![b"h2".to_vec()];
    Arc::new(cfg)
}

/// One HTTP/2 connection to the server on loopback `port`.
pub async fn connect(port: u16, tls: Arc<rustls::ClientConfig>) -> Sender {
    let tcp = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .unwrap();
    tcp.set_nodelay(true).unwrap();
    let stream = tokio_rustls::TlsConnector::from(tls)
        .connect(ServerName::try_from("localhost").unwrap(), tcp)
        .await
        .unwrap();
    let (send, conn) = hyper::client::conn::http2::Builder::new(TokioExecutor::new())
        .max_concurrent_reset_streams(1000)
        .handshake(TokioIo::new(stream))
        .await
        .unwrap();
    tokio::spawn(conn);
    send
}
