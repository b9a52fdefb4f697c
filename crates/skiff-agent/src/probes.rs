//! Liveness, readiness and startup probes: exec (through the runtime),
//! httpGet, tcpSocket and grpc (from the node to the pod's IP), with
//! Kubernetes' timing (initialDelaySeconds, periodSeconds, timeoutSeconds) and
//! thresholds (successThreshold, failureThreshold).
//!
//! A grpc probe is what kubelet's is: one `grpc.health.v1.Health/Check` call
//! over plaintext HTTP/2 to the pod's IP and the probe's port, asking for the
//! probe's `service` ("" when unset); connecting and the call share the
//! probe's timeout, and only a SERVING answer is a success. Its failure
//! messages are worded as kubelet's.

use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Container, Probe};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::runtime::Runtime;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Kind {
    Liveness,
    Readiness,
    Startup,
}

/// The running state of one probe of one container instance.
#[derive(Debug, Clone)]
pub struct ProbeState {
    pub successes: i32,
    pub failures: i32,
    /// The current verdict once thresholds have been crossed.
    pub ok: Option<bool>,
    pub last_run: Option<Instant>,
    pub last_message: String,
}

impl ProbeState {
    pub fn new() -> ProbeState {
        ProbeState {
            successes: 0,
            failures: 0,
            ok: None,
            last_run: None,
            last_message: String::new(),
        }
    }

    /// Records one result and updates the verdict by the thresholds.
    pub fn record(&mut self, probe: &Probe, success: bool, message: String) {
        if success {
            self.successes += 1;
            self.failures = 0;
            if self.successes >= probe.success_threshold.unwrap_or(1).max(1) {
                self.ok = Some(true);
            }
        } else {
            self.failures += 1;
            self.successes = 0;
            if self.failures >= probe.failure_threshold.unwrap_or(3).max(1) {
                self.ok = Some(false);
            }
        }
        self.last_message = message;
    }

    /// Whether the probe should run now, given when the container started.
    pub fn due(&self, probe: &Probe, started: Instant, now: Instant) -> bool {
        let initial = Duration::from_secs(probe.initial_delay_seconds.unwrap_or(0).max(0) as u64);
        if now < started + initial {
            return false;
        }
        let period = Duration::from_secs(probe.period_seconds.unwrap_or(10).max(1) as u64);
        match self.last_run {
            None => true,
            Some(t) => now >= t + period,
        }
    }
}

impl Default for ProbeState {
    fn default() -> Self {
        ProbeState::new()
    }
}

pub fn probe_of(c: &Container, kind: Kind) -> Option<&Probe> {
    match kind {
        Kind::Liveness => c.liveness_probe.as_ref(),
        Kind::Readiness => c.readiness_probe.as_ref(),
        Kind::Startup => c.startup_probe.as_ref(),
    }
}

fn port_number(c: &Container, port: &IntOrString) -> Option<u16> {
    match port {
        IntOrString::Int(p) => u16::try_from(*p).ok(),
        IntOrString::String(name) => c
            .ports
            .iter()
            .flatten()
            .find(|p| p.name.as_deref() == Some(name.as_str()))
            .and_then(|p| u16::try_from(p.container_port).ok()),
    }
}

/// Runs a probe once: (success, message).
pub async fn run(
    runtime: &dyn Runtime,
    container_id: &str,
    c: &Container,
    probe: &Probe,
    pod_ip: &str,
) -> (bool, String) {
    let timeout = Duration::from_secs(probe.timeout_seconds.unwrap_or(1).max(1) as u64);
    if let Some(e) = &probe.exec {
        let cmd = e.command.clone().unwrap_or_default();
        return match tokio::time::timeout(
            timeout + Duration::from_secs(1),
            runtime.exec_sync(container_id, cmd, timeout.as_secs() as i64),
        )
        .await
        {
            Ok(Ok((0, _, _))) => (true, String::new()),
            Ok(Ok((code, out, err))) => (
                false,
                format!(
                    "command failed with exit code {code}: {}{}",
                    String::from_utf8_lossy(&out),
                    String::from_utf8_lossy(&err)
                )
                .trim()
                .to_string(),
            ),
            Ok(Err(e)) => (false, format!("exec failed: {e}")),
            Err(_) => (
                false,
                format!("command timed out after {}s", timeout.as_secs()),
            ),
        };
    }
    if let Some(h) = &probe.http_get {
        let Some(port) = port_number(c, &h.port) else {
            return (false, format!("unknown port {:?}", h.port));
        };
        let host = h.host.clone().unwrap_or_else(|| pod_ip.to_string());
        let path = h.path.clone().unwrap_or_else(|| "/".into());
        let headers: String = h
            .http_headers
            .iter()
            .flatten()
            .map(|hd| format!("{}: {}\r\n", hd.name, hd.value))
            .collect();
        let fut = async {
            let mut s = tokio::net::TcpStream::connect((host.as_str(), port)).await?;
            let req = format!(
                "GET {path} HTTP/1.1\r\nHost: {host}:{port}\r\nUser-Agent: kube-probe/1.33\r\nAccept: */*\r\n{headers}Connection: close\r\n\r\n"
            );
            s.write_all(req.as_bytes()).await?;
            let mut buf = vec![0u8; 1024];
            let mut got = 0;
            while got < 12 {
                let n = s.read(&mut buf[got..]).await?;
                if n == 0 {
                    break;
                }
                got += n;
            }
            Ok::<_, std::io::Error>(String::from_utf8_lossy(&buf[..got]).to_string())
        };
        return match tokio::time::timeout(timeout, fut).await {
            Ok(Ok(resp)) => {
                let code: u16 = resp
                    .split_whitespace()
                    .nth(1)
                    .and_then(|c| c.parse().ok())
                    .unwrap_or(0);
                if (200..400).contains(&code) {
                    (true, String::new())
                } else {
                    (false, format!("HTTP probe failed with statuscode: {code}"))
                }
            }
            Ok(Err(e)) => (false, format!("Get \"http://{host}:{port}{path}\": {e}")),
            Err(_) => (
                false,
                format!("Get \"http://{host}:{port}{path}\": context deadline exceeded"),
            ),
        };
    }
    if let Some(t) = &probe.tcp_socket {
        let Some(port) = port_number(c, &t.port) else {
            return (false, format!("unknown port {:?}", t.port));
        };
        let host = t.host.clone().unwrap_or_else(|| pod_ip.to_string());
        return match tokio::time::timeout(
            timeout,
            tokio::net::TcpStream::connect((host.as_str(), port)),
        )
        .await
        {
            Ok(Ok(_)) => (true, String::new()),
            Ok(Err(e)) => (false, format!("dial tcp {host}:{port}: {e}")),
            Err(_) => (false, format!("dial tcp {host}:{port}: i/o timeout")),
        };
    }
    if let Some(g) = &probe.grpc {
        let Ok(port) = u16::try_from(g.port) else {
            return (false, format!("unknown port {}", g.port));
        };
        let service = g.service.as_deref().unwrap_or("");
        return grpc_health_check(pod_ip, port, service, timeout).await;
    }
    (true, String::new())
}

/// The gRPC health checking protocol (grpc.health.v1): its messages as
/// tonic-health generates them, and the one method a probe calls.
mod health_v1 {
    pub use tonic_health::pb::health_check_response::ServingStatus;
    pub use tonic_health::pb::{HealthCheckRequest, HealthCheckResponse};

    /// The name protobuf gives a `ServingStatus` value; a value this agent
    /// does not know (the field is kept as its number) as the number.
    pub fn status_name(status: i32) -> String {
        ServingStatus::try_from(status)
            .map(|s| s.as_str_name().to_string())
            .unwrap_or_else(|_| status.to_string())
    }

    pub const CHECK: &str = "/grpc.health.v1.Health/Check";
}

/// A gRPC status code as grpc-go names it (kubelet's messages use those names).
fn grpc_code_name(code: tonic::Code) -> String {
    match code {
        tonic::Code::Ok => "OK".into(),
        tonic::Code::Cancelled => "Canceled".into(),
        other => format!("{other:?}"),
    }
}

/// An error and its sources, as one line.
fn error_chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        let next = s.to_string();
        if !text.ends_with(&next) {
            text.push_str(": ");
            text.push_str(&next);
        }
        source = s.source();
    }
    text
}

/// One gRPC health check of `service` at host:port: (success, message).
/// Connecting and the call together get `timeout`.
async fn grpc_health_check(
    host: &str,
    port: u16,
    service: &str,
    timeout: Duration,
) -> (bool, String) {
    let deadline = tokio::time::Instant::now() + timeout;
    let within = format!("{}s", timeout.as_secs());
    // An IPv6 address gets brackets, as in a URL.
    let addr = match host.parse::<std::net::IpAddr>() {
        Ok(std::net::IpAddr::V6(ip)) => format!("[{ip}]:{port}"),
        _ => format!("{host}:{port}"),
    };
    let endpoint = match tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
        .and_then(|e| e.user_agent("kube-probe/1.33"))
    {
        Ok(e) => e,
        Err(e) => {
            return (
                false,
                format!(
                    "error: failed to connect service at {addr:?}: {}",
                    error_chain(&e)
                ),
            );
        }
    };
    let channel = match tokio::time::timeout_at(deadline, endpoint.connect()).await {
        Ok(Ok(channel)) => channel,
        Ok(Err(e)) => {
            return (
                false,
                format!(
                    "error: failed to connect service at {addr:?}: {}",
                    error_chain(&e)
                ),
            );
        }
        Err(_) => {
            return (
                false,
                format!(
                    "timeout: failed to connect service {addr:?} within {within}: context deadline exceeded"
                ),
            );
        }
    };
    let call = async {
        let mut client = tonic::client::Grpc::new(channel);
        client
            .ready()
            .await
            .map_err(|e| tonic::Status::unavailable(error_chain(&e)))?;
        let mut request = tonic::Request::new(health_v1::HealthCheckRequest {
            service: service.to_string(),
        });
        // The deadline travels to the server as grpc-timeout, as grpc-go's does.
        request.set_timeout(deadline.saturating_duration_since(tokio::time::Instant::now()));
        client
            .unary::<_, health_v1::HealthCheckResponse, _>(
                request,
                http::uri::PathAndQuery::from_static(health_v1::CHECK),
                tonic_prost::ProstCodec::default(),
            )
            .await
    };
    let timed_out = format!("timeout: health rpc did not complete within {within}");
    match tokio::time::timeout_at(deadline, call).await {
        Err(_) => (false, timed_out),
        Ok(Ok(response)) => {
            let status = response.into_inner().status;
            if status == health_v1::ServingStatus::Serving as i32 {
                (true, String::new())
            } else {
                (
                    false,
                    format!(
                        "service unhealthy (responded with {:?})",
                        health_v1::status_name(status)
                    ),
                )
            }
        }
        // The client's own grpc-timeout ends the call as Cancelled; the
        // server's as DeadlineExceeded.
        Ok(Err(status))
            if status.code() == tonic::Code::DeadlineExceeded
                || tokio::time::Instant::now() >= deadline =>
        {
            (false, timed_out)
        }
        Ok(Err(status)) if status.code() == tonic::Code::Unimplemented => (
            false,
            format!(
                "error: this server does not implement the grpc health protocol (grpc.health.v1.Health): {}",
                status.message()
            ),
        ),
        Ok(Err(status)) => (
            false,
            format!(
                "error: health rpc probe failed: rpc error: code = {} desc = {}",
                grpc_code_name(status.code()),
                status.message()
            ),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn probe(success: i32, failure: i32) -> Probe {
        Probe {
            success_threshold: Some(success),
            failure_threshold: Some(failure),
            period_seconds: Some(5),
            initial_delay_seconds: Some(2),
            ..Default::default()
        }
    }

    #[test]
    fn a_probe_fails_only_after_failure_threshold_consecutive_failures() {
        let p = probe(1, 3);
        let mut s = ProbeState::new();
        s.record(&p, false, "x".into());
        s.record(&p, false, "x".into());
        assert_eq!(s.ok, None);
        s.record(&p, true, String::new());
        assert_eq!(s.ok, Some(true));
        s.record(&p, false, "x".into());
        s.record(&p, false, "x".into());
        assert_eq!(s.ok, Some(true));
        s.record(&p, false, "x".into());
        assert_eq!(s.ok, Some(false));
    }

    #[test]
    fn a_probe_waits_for_its_initial_delay_and_then_runs_every_period() {
        let p = probe(1, 3);
        let mut s = ProbeState::new();
        let t0 = Instant::now();
        assert!(!s.due(&p, t0, t0 + Duration::from_secs(1)));
        assert!(s.due(&p, t0, t0 + Duration::from_secs(2)));
        s.last_run = Some(t0 + Duration::from_secs(2));
        assert!(!s.due(&p, t0, t0 + Duration::from_secs(6)));
        assert!(s.due(&p, t0, t0 + Duration::from_secs(7)));
    }

    mod grpc {
        use std::time::Duration;

        use k8s_openapi::api::core::v1::{Container, GRPCAction, Probe};
        use tonic_health::server::HealthReporter;
        use tonic_health::ServingStatus;

        use crate::sim::Sim;

        /// A port on 127.0.0.1 that nothing listens on (bound, then freed).
        fn free_port() -> u16 {
            let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            listener.local_addr().unwrap().port()
        }

        /// A real grpc.health.v1 server (tonic-health) on a free port; each
        /// answer is held back by `delay`.
        async fn health_server(delay: Duration) -> (HealthReporter, u16) {
            let (reporter, service) = tonic_health::server::health_reporter();
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            let port = listener.local_addr().unwrap().port();
            let slow = tower::layer::layer_fn(move |inner| {
                tower::ServiceExt::<http::Request<tonic::body::Body>>::and_then(
                    inner,
                    move |response| async move {
                        tokio::time::sleep(delay).await;
                        Ok::<_, std::convert::Infallible>(response)
                    },
                )
            });
            tokio::spawn(
                tonic::transport::Server::builder()
                    .layer(slow)
                    .add_service(service)
                    .serve_with_incoming(tonic::transport::server::TcpIncoming::from(listener)),
            );
            (reporter, port)
        }

        /// Runs a grpc probe of `service` at 127.0.0.1:port with a 1 s timeout.
        async fn probe(port: u16, service: Option<&str>) -> (bool, String) {
            let probe = Probe {
                grpc: Some(GRPCAction {
                    port: i32::from(port),
                    service: service.map(str::to_string),
                }),
                timeout_seconds: Some(1),
                ..Default::default()
            };
            let runtime = Sim::new(0, Duration::ZERO);
            super::run(&runtime, "c1", &Container::default(), &probe, "127.0.0.1").await
        }

        #[tokio::test]
        async fn a_grpc_probe_succeeds_when_the_server_is_serving() {
            let (_reporter, port) = health_server(Duration::ZERO).await;
            assert_eq!(probe(port, None).await, (true, String::new()));
        }

        #[tokio::test]
        async fn a_grpc_probe_asks_for_its_service_and_succeeds_when_it_is_serving() {
            let (reporter, port) = health_server(Duration::ZERO).await;
            reporter
                .set_service_status("shop.Cart", ServingStatus::Serving)
                .await;
            reporter
                .set_service_status("", ServingStatus::NotServing)
                .await;
            assert_eq!(probe(port, Some("shop.Cart")).await, (true, String::new()));
        }

        #[tokio::test]
        async fn a_grpc_probe_fails_when_the_service_is_not_serving() {
            let (reporter, port) = health_server(Duration::ZERO).await;
            reporter
                .set_service_status("shop.Cart", ServingStatus::NotServing)
                .await;
            assert_eq!(
                probe(port, Some("shop.Cart")).await,
                (
                    false,
                    r#"service unhealthy (responded with "NOT_SERVING")"#.to_string()
                )
            );
        }

        #[tokio::test]
        async fn a_grpc_probe_fails_when_the_server_answers_unknown() {
            let (reporter, port) = health_server(Duration::ZERO).await;
            reporter
                .set_service_status("shop.Cart", ServingStatus::Unknown)
                .await;
            assert_eq!(
                probe(port, Some("shop.Cart")).await,
                (
                    false,
                    r#"service unhealthy (responded with "UNKNOWN")"#.to_string()
                )
            );
        }

        #[tokio::test]
        async fn a_grpc_probe_fails_when_the_server_does_not_know_the_service() {
            let (_reporter, port) = health_server(Duration::ZERO).await;
            let (ok, message) = probe(port, Some("shop.Nothing")).await;
            assert!(!ok);
            assert!(
                message.starts_with("error: health rpc probe failed: rpc error: code = NotFound"),
                "{message}"
            );
        }

        #[tokio::test]
        async fn a_grpc_probe_fails_to_connect_when_nothing_listens_on_the_port() {
            let port = free_port();
            let (ok, message) = probe(port, None).await;
            assert!(!ok);
            let prefix = format!("error: failed to connect service at \"127.0.0.1:{port}\": ");
            assert!(message.starts_with(&prefix), "{message}");
        }

        #[tokio::test]
        async fn a_grpc_probe_times_out_when_the_server_answers_after_the_timeout() {
            let (_reporter, port) = health_server(Duration::from_secs(3)).await;
            let started = std::time::Instant::now();
            assert_eq!(
                probe(port, None).await,
                (
                    false,
                    "timeout: health rpc did not complete within 1s".to_string()
                )
            );
            assert!(started.elapsed() < Duration::from_secs(2));
        }

        #[tokio::test]
        async fn a_grpc_probe_times_out_when_the_server_never_speaks() {
            // Accepts connections and keeps them open, answering nothing.
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            let port = listener.local_addr().unwrap().port();
            tokio::spawn(async move {
                let mut open = Vec::new();
                while let Ok((stream, _)) = listener.accept().await {
                    open.push(stream);
                }
            });
            let started = std::time::Instant::now();
            let (ok, message) = probe(port, None).await;
            assert!(!ok);
            assert!(message.starts_with("timeout: "), "{message}");
            assert!(message.contains("within 1s"), "{message}");
            assert!(started.elapsed() < Duration::from_secs(2));
        }
    }
}
