//! Liveness, readiness and startup probes: exec (through the runtime),
//! httpGet and tcpSocket (from the node to the pod's IP), with Kubernetes'
//! timing (initialDelaySeconds, periodSeconds, timeoutSeconds) and
//! thresholds (successThreshold, failureThreshold).

use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Container, Probe};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::runtime::Runtime;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
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
    if probe.grpc.is_some() {
        return (
            false,
            "gRPC probes are not supported by skiff's agent yet".into(),
        );
    }
    (true, String::new())
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
}
