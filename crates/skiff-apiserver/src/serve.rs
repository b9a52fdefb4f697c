//! Serving over TLS: accept connections, learn the client's identity from its
//! verified certificate, and hand requests (HTTP/1.1 or HTTP/2) to the router.

use std::future::Future;
use std::sync::Arc;

use axum::body::Body;
use axum::Router;
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;
use tower::ServiceExt;

use crate::auth::Identity;
use crate::tls::identity_from_cert;

/// Serves `app` on `listener` until `shutdown` completes (client
/// certificates verified at the handshake: one from another CA fails it).
pub async fn serve_tls(
    listener: TcpListener,
    tls: Arc<rustls::ServerConfig>,
    app: Router,
    shutdown: impl Future<Output = ()>,
) {
    serve(listener, tls, None, app, shutdown).await
}

/// Serves `app` with [`crate::tls::Pki::server_tls`]: a client
/// certificate that our CA did not issue (or that expired) makes every
/// request on its connection a 401 Status, unless it carries a bearer
/// token, which then authenticates it (kube-apiserver's union of
/// authenticators). Never an identity from an unverified certificate.
pub async fn serve_tls_checked(
    listener: TcpListener,
    tls: crate::tls::ServerTls,
    app: Router,
    shutdown: impl Future<Output = ()>,
) {
    serve(
        listener,
        tls.config,
        Some(tls.client_verifier),
        app,
        shutdown,
    )
    .await
}

async fn serve(
    listener: TcpListener,
    tls: Arc<rustls::ServerConfig>,
    check: Option<Arc<dyn rustls::server::danger::ClientCertVerifier>>,
    app: Router,
    shutdown: impl Future<Output = ()>,
) {
    let acceptor = TlsAcceptor::from(tls);
    tokio::pin!(shutdown);
    loop {
        let (tcp, peer) = tokio::select! {
            r = listener.accept() => match r {
                Ok(x) => x,
                Err(e) => {
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                    continue;
                }
            },
            _ = &mut shutdown => return,
        };
        let _ = tcp.set_nodelay(true);
        let acceptor = acceptor.clone();
        let app = app.clone();
        let check = check.clone();
        tokio::spawn(async move {
            let Ok(stream) = acceptor.accept(tcp).await else {
                return;
            };
            let certs = stream.get_ref().1.peer_certificates().unwrap_or(&[]);
            let rejected = match (&check, certs.split_first()) {
                (Some(v), Some((leaf, chain))) => v
                    .verify_client_cert(leaf, chain, rustls_pki_types::UnixTime::now())
                    .is_err(),
                _ => false,
            };
            let identity = certs
                .first()
                .filter(|_| !rejected)
                .and_then(|c| identity_from_cert(c.as_ref()))
                .map(|(user, groups)| Identity::new(user, groups));
            let svc = hyper::service::service_fn(move |mut req: hyper::Request<Incoming>| {
                if let Some(id) = &identity {
                    req.extensions_mut().insert(id.clone());
                }
                req.extensions_mut().insert(crate::audit::PeerAddr(peer));
                let app = app.clone();
                let unauthorized =
                    rejected && !req.headers().contains_key(http::header::AUTHORIZATION);
                async move {
                    if unauthorized {
                        return Ok(crate::response::error_response(
                            &skiff_core::ApiError::unauthorized(),
                        ));
                    }
                    app.oneshot(req.map(Body::new)).await
                }
            });
            let builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
            let _ = builder
                .serve_connection_with_upgrades(TokioIo::new(stream), svc)
                .await;
        });
    }
}
