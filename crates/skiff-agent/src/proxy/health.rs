//! The health check node ports of `externalTrafficPolicy: Local`
//! LoadBalancer services: as kube-proxy does, every node answers HTTP on
//! `spec.healthCheckNodePort` with the number of the service's endpoints
//! on this node, 200 when there is one and 503 when there is none, so a
//! load balancer only sends to nodes that keep the client's source IP and
//! still have somewhere to send it.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};

use super::model::PortPlan;

/// What one health port reports: (namespace, name, local endpoints).
pub type Report = (String, String, usize);

/// The health ports the plans ask for, with what each reports.
pub fn desired<'a>(plans: impl IntoIterator<Item = &'a PortPlan>) -> BTreeMap<u16, Report> {
    let mut out: BTreeMap<u16, Report> = BTreeMap::new();
    for p in plans {
        let Some(port) = p.health_check_node_port else {
            continue;
        };
        let e = out
            .entry(port)
            .or_insert_with(|| (p.key.namespace.clone(), p.key.name.clone(), 0));
        e.2 = e.2.max(p.local_endpoints.len());
    }
    out
}

/// kube-proxy's answer: status and JSON body.
pub fn response(r: &Report) -> (u16, String) {
    let body = serde_json::json!({
        "service": {"namespace": r.0, "name": r.1},
        "localEndpoints": r.2,
        "serviceProxyHealthy": true,
    })
    .to_string();
    (if r.2 > 0 { 200 } else { 503 }, body)
}

/// Keeps one HTTP listener per wanted port (on every address, like
/// kube-proxy), each answering from the shared reports.
#[derive(Default)]
pub struct Servers {
    reports: Arc<Mutex<BTreeMap<u16, Report>>>,
    running: HashMap<u16, tokio::task::JoinHandle<()>>,
}

impl Servers {
    pub fn update(&mut self, wanted: BTreeMap<u16, Report>) {
        self.running.retain(|port, task| {
            if wanted.contains_key(port) && !task.is_finished() {
                true
            } else {
                task.abort();
                false
            }
        });
        for port in wanted.keys() {
            if self.running.contains_key(port) {
                continue;
            }
            let reports = self.reports.clone();
            let port = *port;
            self.running
                .insert(port, tokio::spawn(serve(port, reports)));
        }
        *self.reports.lock().unwrap_or_else(|e| e.into_inner()) = wanted;
    }
}

impl Drop for Servers {
    fn drop(&mut self) {
        for t in self.running.values() {
            t.abort();
        }
    }
}

async fn serve(port: u16, reports: Arc<Mutex<BTreeMap<u16, Report>>>) {
    let listener = match tokio::net::TcpListener::bind(("0.0.0.0", port)).await {
        Ok(l) => l,
        Err(e) => {
            tracing::warn!(port, error = %e, "cannot serve a health check node port");
            return;
        }
    };
    let app = axum::Router::new().fallback(move || {
        let reports = reports.clone();
        async move {
            let r = reports
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .get(&port)
                .cloned();
            let (status, body) = match r {
                Some(r) => response(&r),
                None => (503, String::new()),
            };
            (
                http::StatusCode::from_u16(status).unwrap_or(http::StatusCode::SERVICE_UNAVAILABLE),
                [
                    (http::header::CONTENT_TYPE, "application/json"),
                    (http::header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
                ],
                body,
            )
        }
    });
    let _ = axum::serve(listener, app).await;
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proxy::model::{Endpoint, PortKey, Protocol};

    fn plan(port: Option<u16>, local: usize) -> PortPlan {
        PortPlan {
            key: PortKey {
                namespace: "default".into(),
                name: "web".into(),
                protocol: Protocol::Tcp,
                port_name: "http".into(),
            },
            cluster_ip: "10.43.0.20".parse().unwrap(),
            port: 80,
            node_port: Some(30080),
            external_ips: vec![],
            cluster_endpoints: vec![],
            local_endpoints: (0..local)
                .map(|i| Endpoint {
                    ip: std::net::Ipv4Addr::new(10, 42, 0, 5 + i as u8),
                    port: 8080,
                })
                .collect(),
            has_endpoints: local > 0,
            internal_local: false,
            external_local: true,
            affinity: None,
            health_check_node_port: port,
        }
    }

    #[test]
    fn a_node_with_local_endpoints_answers_200_with_their_count_and_503_without() {
        let d = desired([&plan(Some(32000), 2), &plan(None, 1)]);
        assert_eq!(d.len(), 1);
        let (status, body) = response(&d[&32000]);
        assert_eq!(status, 200);
        let v: serde_json::Value = serde_json::from_str(&body).unwrap();
        assert_eq!(v["localEndpoints"], 2);
        assert_eq!(v["service"]["name"], "web");
        let d = desired([&plan(Some(32000), 0)]);
        assert_eq!(response(&d[&32000]).0, 503);
    }
}
