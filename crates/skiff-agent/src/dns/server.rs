//! The DNS responder: UDP and TCP listeners on the cluster DNS address,
//! answering from the record index, forwarding the rest, and a Prometheus
//! endpoint for its counters.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use hickory_proto::op::{Message, ResponseCode};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, UdpSocket};

use super::forward::Forwarder;
use super::records::{self, Index, Outcome};

/// Counters the metrics endpoint shows.
#[derive(Debug, Default)]
pub struct Metrics {
    pub udp: AtomicU64,
    pub tcp: AtomicU64,
    pub local: AtomicU64,
    pub forwarded: AtomicU64,
    pub cache_hits: AtomicU64,
    pub nxdomain: AtomicU64,
    pub servfail: AtomicU64,
    pub truncated: AtomicU64,
    pub malformed: AtomicU64,
}

/// What answers queries: the index, the forwarder, the counters.
pub struct Responder {
    pub index: Arc<RwLock<Index>>,
    pub forwarder: Arc<Forwarder>,
    pub metrics: Arc<Metrics>,
}

/// Over which transport a query came, and so how large the answer may be.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Transport {
    Udp,
    Tcp,
}

/// A FORMERR for bytes that do not decode (when they at least carry an id).
fn formerr(bytes: &[u8]) -> Option<Vec<u8>> {
    if bytes.len() < 12 {
        return None;
    }
    let id = u16::from_be_bytes([bytes[0], bytes[1]]);
    let m = Message::error_msg(id, hickory_proto::op::OpCode::Query, ResponseCode::FormErr);
    m.to_vec().ok()
}

impl Responder {
    fn count(&self, m: &Message) {
        match m.metadata.response_code {
            ResponseCode::NXDomain => self.metrics.nxdomain.fetch_add(1, Ordering::Relaxed),
            ResponseCode::ServFail => self.metrics.servfail.fetch_add(1, Ordering::Relaxed),
            _ => 0,
        };
    }

    fn encode(&self, req: &Message, resp: &Message, transport: Transport) -> Option<Vec<u8>> {
        self.count(resp);
        match transport {
            Transport::Tcp => resp.to_vec().ok(),
            Transport::Udp => {
                let limit = records::udp_limit(req);
                let wire = records::encode_udp(resp, limit)?;
                if wire.len() >= 3 && wire[2] & 0x02 != 0 {
                    self.metrics.truncated.fetch_add(1, Ordering::Relaxed);
                }
                Some(wire)
            }
        }
    }

    /// Answers what the index or the cache knows at once; None when the
    /// query has to go upstream (then [`Responder::slow`]).
    fn fast(
        &self,
        bytes: &[u8],
        transport: Transport,
    ) -> Result<Option<Vec<u8>>, Box<(Message, Outcome)>> {
        let req = match Message::from_vec(bytes) {
            Ok(m) => m,
            Err(_) => {
                self.metrics.malformed.fetch_add(1, Ordering::Relaxed);
                return Ok(formerr(bytes));
            }
        };
        let outcome = match self.index.read() {
            Ok(ix) => ix.answer(&req),
            Err(_) => return Ok(None),
        };
        match outcome {
            Outcome::Answer(resp) => {
                self.metrics.local.fetch_add(1, Ordering::Relaxed);
                Ok(self.encode(&req, &resp, transport))
            }
            Outcome::Forward => match self.forwarder.from_cache(&req) {
                Some(resp) => {
                    self.metrics.cache_hits.fetch_add(1, Ordering::Relaxed);
                    Ok(self.encode(&req, &resp, transport))
                }
                None => Err(Box::new((req, Outcome::Forward))),
            },
            other => Err(Box::new((req, other))),
        }
    }

    /// Answers a query that needs the upstream resolvers.
    async fn slow(&self, req: Message, outcome: Outcome, transport: Transport) -> Option<Vec<u8>> {
        self.metrics.forwarded.fetch_add(1, Ordering::Relaxed);
        let resp = match outcome {
            Outcome::Answer(m) => m,
            Outcome::Forward => self.forwarder.resolve(&req).await,
            Outcome::Chase {
                mut partial,
                target,
            } => {
                let qtype = req.queries[0].query_type();
                let up = self.forwarder.lookup(&req, target, qtype).await;
                if up.metadata.response_code != ResponseCode::ServFail {
                    partial.metadata.response_code = up.metadata.response_code;
                    partial.answers.extend(up.answers);
                    if partial.answers.len() == 1 {
                        partial.authorities.extend(up.authorities);
                    }
                }
                partial
            }
        };
        self.encode(&req, &resp, transport)
    }

    /// Answers one query (any path).
    pub async fn handle(&self, bytes: &[u8], tcp: bool) -> Option<Vec<u8>> {
        let transport = if tcp { Transport::Tcp } else { Transport::Udp };
        match self.fast(bytes, transport) {
            Ok(r) => r,
            Err(slow) => {
                let (req, outcome) = *slow;
                self.slow(req, outcome, transport).await
            }
        }
    }
}

/// Serves UDP on `sock` with `loops` receive loops. Queries the index or
/// cache answers are answered in the loop; the rest in their own task.
pub async fn serve_udp(responder: Arc<Responder>, sock: Arc<UdpSocket>, loops: usize) {
    let mut set = tokio::task::JoinSet::new();
    for _ in 0..loops.max(1) {
        let (responder, sock) = (responder.clone(), sock.clone());
        set.spawn(async move {
            let mut buf = vec![0u8; 4096];
            loop {
                let (n, peer) = match sock.recv_from(&mut buf).await {
                    Ok(x) => x,
                    Err(e) => {
                        tracing::debug!(error = %e, "dns udp receive");
                        continue;
                    }
                };
                responder.metrics.udp.fetch_add(1, Ordering::Relaxed);
                match responder.fast(&buf[..n], Transport::Udp) {
                    Ok(Some(out)) => {
                        let _ = sock.send_to(&out, peer).await;
                    }
                    Ok(None) => {}
                    Err(slow) => {
                        let (req, outcome) = *slow;
                        let (responder, sock) = (responder.clone(), sock.clone());
                        tokio::spawn(async move {
                            if let Some(out) = responder.slow(req, outcome, Transport::Udp).await {
                                let _ = sock.send_to(&out, peer).await;
                            }
                        });
                    }
                }
            }
        });
    }
    while set.join_next().await.is_some() {}
}

/// Serves DNS over TCP: length-prefixed messages, several per connection,
/// closed after 10 s idle.
pub async fn serve_tcp(responder: Arc<Responder>, listener: TcpListener) {
    loop {
        let Ok((mut conn, _)) = listener.accept().await else {
            tokio::time::sleep(Duration::from_millis(50)).await;
            continue;
        };
        let responder = responder.clone();
        tokio::spawn(async move {
            loop {
                let len = match tokio::time::timeout(Duration::from_secs(10), conn.read_u16()).await
                {
                    Ok(Ok(l)) => l as usize,
                    _ => return,
                };
                let mut buf = vec![0u8; len];
                if conn.read_exact(&mut buf).await.is_err() {
                    return;
                }
                responder.metrics.tcp.fetch_add(1, Ordering::Relaxed);
                let Some(out) = responder.handle(&buf, true).await else {
                    return;
                };
                let mut framed = Vec::with_capacity(out.len() + 2);
                framed.extend_from_slice(&(out.len() as u16).to_be_bytes());
                framed.extend_from_slice(&out);
                if conn.write_all(&framed).await.is_err() {
                    return;
                }
            }
        });
    }
}

/// The Prometheus text of the counters (CoreDNS-like names under `skiff_dns_`).
pub fn metrics_text(responder: &Responder) -> String {
    let m = &responder.metrics;
    let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
    let services = responder.index.read().map(|i| i.services()).unwrap_or(0);
    let mut s = String::new();
    let mut family = |name: &str, help: &str, kind: &str, rows: &[(&str, u64)]| {
        s.push_str(&format!(
            "# HELP skiff_dns_{name} {help}\n# TYPE skiff_dns_{name} {kind}\n"
        ));
        for (labels, v) in rows {
            s.push_str(&format!("skiff_dns_{name}{labels} {v}\n"));
        }
    };
    family(
        "requests_total",
        "DNS queries received, by transport.",
        "counter",
        &[
            ("{proto=\"udp\"}", get(&m.udp)),
            ("{proto=\"tcp\"}", get(&m.tcp)),
        ],
    );
    family(
        "answers_total",
        "Queries by who answered: the cluster index, the cache, or upstream.",
        "counter",
        &[
            ("{source=\"cluster\"}", get(&m.local)),
            ("{source=\"cache\"}", get(&m.cache_hits)),
            ("{source=\"upstream\"}", get(&m.forwarded)),
        ],
    );
    family(
        "responses_total",
        "Responses by notable outcome.",
        "counter",
        &[
            ("{rcode=\"NXDOMAIN\"}", get(&m.nxdomain)),
            ("{rcode=\"SERVFAIL\"}", get(&m.servfail)),
            ("{rcode=\"FORMERR\"}", get(&m.malformed)),
            ("{truncated=\"true\"}", get(&m.truncated)),
        ],
    );
    family(
        "services",
        "Services in the record index.",
        "gauge",
        &[("", services as u64)],
    );
    family(
        "cache_entries",
        "Upstream answers cached.",
        "gauge",
        &[("", responder.forwarder.cached() as u64)],
    );
    s
}

/// Serves `/metrics` (and `/health`) over plain HTTP on `addr`.
pub async fn serve_metrics(responder: Arc<Responder>, listener: TcpListener) {
    use axum::routing::get;
    let app = axum::Router::new()
        .route(
            "/metrics",
            get(move || {
                let r = responder.clone();
                async move { metrics_text(&r) }
            }),
        )
        .route("/health", get(|| async { "OK" }));
    let _ = axum::serve(listener, app).await;
}

/// Binds the UDP and TCP sockets of `addr` (both, or an error).
pub async fn bind(addr: SocketAddr) -> std::io::Result<(Arc<UdpSocket>, TcpListener)> {
    let udp = UdpSocket::bind(addr).await?;
    let tcp = TcpListener::bind(addr).await?;
    Ok((Arc::new(udp), tcp))
}
