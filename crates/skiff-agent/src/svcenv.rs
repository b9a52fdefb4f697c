//! The service environment variables kubelet gives every container:
//! `KUBERNETES_SERVICE_HOST`/`_PORT` (what client-go's and kube-rs's
//! in-cluster configuration read) and, unless the pod sets
//! `enableServiceLinks: false`, `{SVC}_SERVICE_HOST`, `{SVC}_SERVICE_PORT`,
//! `{SVC}_SERVICE_PORT_{NAME}` and the Docker-link variables
//! (`{SVC}_PORT`, `{SVC}_PORT_{P}_{PROTO}` and its `_PROTO`, `_PORT`,
//! `_ADDR`) for every Service of the pod's namespace that has a ClusterIP.
//!
//! The rules are kubelet's `getServiceEnvVarMap` and the `envvars`
//! package: Services without a ClusterIP (headless, ExternalName) give
//! nothing; the `kubernetes` Service of `default` is always included, and a
//! Service of the pod's own namespace with the same name takes its place
//! when links are on; names are upper-cased with `-` turned into `_`.
//! What the container's own `env`/`envFrom` set wins over these, and
//! `$(VAR)` references in its values can name them (see
//! [`crate::inputs::container_env`]).
//!
//! The agent keeps a compact copy of the cluster's Services ([`Services`],
//! fed by its own watch) so a container start costs no request.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use k8s_openapi::api::core::v1::Service;
use skiff_helpers::dependencies::{self, Dependency, ServicePort};

/// The namespace and name of the Services every pod gets variables for,
/// links or not (kubelet's "master services").
const MASTER_NAMESPACE: &str = "default";
const MASTER_SERVICES: &[&str] = &["kubernetes"];

/// What the variables need of one Service.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServiceRecord {
    pub cluster_ip: String,
    /// (name, port, protocol) of each port, in the Service's order.
    pub ports: Vec<(String, i32, String)>,
}

impl ServiceRecord {
    /// The record of a Service with a ClusterIP; None for headless and
    /// ExternalName Services (kubelet's `IsServiceIPSet`).
    pub fn from_service(s: &Service) -> Option<ServiceRecord> {
        let spec = s.spec.as_ref()?;
        let ip = spec.cluster_ip.clone().unwrap_or_default();
        if ip.is_empty() || ip == "None" {
            return None;
        }
        Some(ServiceRecord {
            cluster_ip: ip,
            ports: spec
                .ports
                .iter()
                .flatten()
                .map(|p| {
                    (
                        p.name.clone().unwrap_or_default(),
                        p.port,
                        p.protocol.clone().unwrap_or_default(),
                    )
                })
                .collect(),
        })
    }
}

/// `{SVC}` of a Service's variables: upper case, `-` as `_`.
fn env_name(s: &str) -> String {
    s.replace('-', "_").to_uppercase()
}

/// The variables of one Service (kubelet's `envvars.FromServices` for it).
pub fn variables_of(name: &str, svc: &ServiceRecord, out: &mut BTreeMap<String, String>) {
    let prefix = env_name(name);
    let ip = &svc.cluster_ip;
    out.insert(format!("{prefix}_SERVICE_HOST"), ip.clone());
    let Some(first) = svc.ports.first() else {
        return;
    };
    out.insert(format!("{prefix}_SERVICE_PORT"), first.1.to_string());
    for (port_name, port, _) in &svc.ports {
        if !port_name.is_empty() {
            out.insert(
                format!("{prefix}_SERVICE_PORT_{}", env_name(port_name)),
                port.to_string(),
            );
        }
    }
    // Docker links. An IPv6 address is bracketed in the URL, as Go's
    // JoinHostPort writes it.
    let host = |port: i32| {
        if ip.contains(':') {
            format!("[{ip}]:{port}")
        } else {
            format!("{ip}:{port}")
        }
    };
    for (i, (_, port, protocol)) in svc.ports.iter().enumerate() {
        let protocol = if protocol.is_empty() {
            "TCP"
        } else {
            protocol.as_str()
        };
        let lower = protocol.to_lowercase();
        let url = format!("{lower}://{}", host(*port));
        if i == 0 {
            out.insert(format!("{prefix}_PORT"), url.clone());
        }
        let p = format!("{prefix}_PORT_{port}_{}", protocol.to_uppercase());
        out.insert(format!("{p}_PROTO"), lower);
        out.insert(format!("{p}_PORT"), port.to_string());
        out.insert(format!("{p}_ADDR"), ip.clone());
        out.insert(p, url);
    }
}

/// The cluster's Services with a ClusterIP, as the variables need them.
#[derive(Debug, Default)]
pub struct Index {
    services: HashMap<(String, String), ServiceRecord>,
    /// The ports of every Service (headless ones too), for the variables
    /// of declared dependencies.
    ports: HashMap<(String, String), Vec<ServicePort>>,
}

impl Index {
    pub fn set(&mut self, ns: &str, name: &str, svc: &Service) {
        let key = (ns.to_string(), name.to_string());
        let ports = svc
            .spec
            .iter()
            .flat_map(|s| s.ports.iter().flatten())
            .filter_map(|p| {
                Some(ServicePort {
                    name: p.name.clone().filter(|n| !n.is_empty()),
                    port: u16::try_from(p.port).ok()?,
                })
            })
            .collect();
        self.ports.insert(key.clone(), ports);
        match ServiceRecord::from_service(svc) {
            Some(r) => {
                self.services.insert(key, r);
            }
            None => {
                self.services.remove(&key);
            }
        }
    }

    pub fn delete(&mut self, ns: &str, name: &str) {
        self.services.remove(&(ns.to_string(), name.to_string()));
        self.ports.remove(&(ns.to_string(), name.to_string()));
    }

    /// The `SKIFF_DEP_*` variables of a pod's declared dependencies
    /// (`skiff_helpers::dependencies::env`).
    pub fn dependency_variables(&self, deps: &[Dependency], domain: &str) -> Vec<(String, String)> {
        dependencies::env(deps, domain, |ns, name| {
            self.ports.get(&(ns.to_string(), name.to_string())).cloned()
        })
    }

    /// The service variables of a pod in `ns` (kubelet's
    /// `getServiceEnvVarMap`).
    pub fn variables(&self, ns: &str, enable_service_links: bool) -> BTreeMap<String, String> {
        let mut chosen: BTreeMap<&str, &ServiceRecord> = BTreeMap::new();
        for name in MASTER_SERVICES {
            if let Some(r) = self
                .services
                .get(&(MASTER_NAMESPACE.to_string(), name.to_string()))
            {
                chosen.insert(name, r);
            }
        }
        if enable_service_links {
            // The namespace's own Services, which take the place of a
            // master service of the same name.
            for ((sns, name), r) in &self.services {
                if sns == ns {
                    chosen.insert(name.as_str(), r);
                }
            }
        }
        let mut out = BTreeMap::new();
        for (name, r) in chosen {
            variables_of(name, r, &mut out);
        }
        out
    }
}

/// The agent's copy of the Services and whether it has been complete at
/// least once.
#[derive(Debug, Clone)]
pub struct Services {
    index: Arc<RwLock<Index>>,
    synced: tokio::sync::watch::Receiver<bool>,
}

/// kubelet's words for a container started before the Services were read.
pub const NOT_SYNCED: &str =
    "services have not yet been read at least once, cannot construct envvars";

impl Services {
    /// A copy that is complete: `index` as given (for tests and for nodes
    /// that never read Services).
    pub fn fixed(index: Index) -> Services {
        let (_tx, rx) = tokio::sync::watch::channel(true);
        Services {
            index: Arc::new(RwLock::new(index)),
            synced: rx,
        }
    }

    /// A copy kept equal to the cluster's Services by a watch through
    /// `client`, which runs in `tasks`.
    pub fn watched(client: kube::Client, tasks: &mut tokio::task::JoinSet<()>) -> Services {
        let index = Arc::new(RwLock::new(Index::default()));
        let (tx, rx) = tokio::sync::watch::channel(false);
        tasks.spawn(mirror(client, index.clone(), tx));
        Services { index, synced: rx }
    }

    /// The variables of a pod in `ns`; waits up to `wait` for the first
    /// complete list, as kubelet refuses to make them before it.
    pub async fn variables(
        &self,
        ns: &str,
        enable_service_links: bool,
        wait: Duration,
    ) -> Result<BTreeMap<String, String>, String> {
        let mut synced = self.synced.clone();
        if !*synced.borrow() {
            let _ = tokio::time::timeout(wait, synced.wait_for(|s| *s)).await;
        }
        if !*synced.borrow() {
            return Err(NOT_SYNCED.into());
        }
        let ix = self.index.read().unwrap_or_else(|e| e.into_inner());
        Ok(ix.variables(ns, enable_service_links))
    }

    /// The variables of a pod's declared dependencies, from the Services
    /// read so far (a Service not seen yet gives `_HOST` only).
    pub fn dependency_variables(&self, deps: &[Dependency], domain: &str) -> Vec<(String, String)> {
        let ix = self.index.read().unwrap_or_else(|e| e.into_inner());
        ix.dependency_variables(deps, domain)
    }
}

/// The service index as a copy of the cluster's Services; `synced` turns
/// true after the first complete list.
struct ServiceCopy {
    index: Arc<RwLock<Index>>,
    synced: tokio::sync::watch::Sender<bool>,
}

impl crate::mirror::Copy<Service> for ServiceCopy {
    fn set(&mut self, namespace: &str, name: &str, object: &Service) {
        self.index
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .set(namespace, name, object);
    }

    fn delete(&mut self, namespace: &str, name: &str) {
        self.index
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .delete(namespace, name);
    }

    fn listed(&mut self) {
        self.synced.send_replace(true);
    }
}

/// Keeps `index` equal to the cluster's Services.
async fn mirror(
    client: kube::Client,
    index: Arc<RwLock<Index>>,
    synced: tokio::sync::watch::Sender<bool>,
) {
    crate::mirror::mirror(
        client,
        "service environment: service",
        ServiceCopy { index, synced },
    )
    .await
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn svc(ns: &str, name: &str, ip: &str, ports: serde_json::Value) -> Service {
        serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": ns},
            "spec": {"clusterIP": ip, "ports": ports},
        }))
        .unwrap()
    }

    fn index(services: &[Service]) -> Index {
        let mut ix = Index::default();
        for s in services {
            ix.set(
                s.metadata.namespace.as_deref().unwrap(),
                s.metadata.name.as_deref().unwrap(),
                s,
            );
        }
        ix
    }

    fn kubernetes() -> Service {
        svc(
            "default",
            "kubernetes",
            "10.43.0.1",
            json!([{"name": "https", "port": 443, "protocol": "TCP", "targetPort": 6443}]),
        )
    }

    fn pairs(m: &BTreeMap<String, String>) -> Vec<String> {
        m.iter().map(|(k, v)| format!("{k}={v}")).collect()
    }

    #[test]
    fn every_pod_gets_the_kubernetes_service_even_without_links() {
        let ix = index(&[
            kubernetes(),
            svc("web", "front", "10.43.0.20", json!([{"port": 80}])),
        ]);
        let want = [
            "KUBERNETES_PORT=tcp://10.43.0.1:443",
            "KUBERNETES_PORT_443_TCP=tcp://10.43.0.1:443",
            "KUBERNETES_PORT_443_TCP_ADDR=10.43.0.1",
            "KUBERNETES_PORT_443_TCP_PORT=443",
            "KUBERNETES_PORT_443_TCP_PROTO=tcp",
            "KUBERNETES_SERVICE_HOST=10.43.0.1",
            "KUBERNETES_SERVICE_PORT=443",
            "KUBERNETES_SERVICE_PORT_HTTPS=443",
        ];
        assert_eq!(pairs(&ix.variables("web", false)), want);
        assert_eq!(pairs(&ix.variables("other", true)), want);
        let with_links = ix.variables("web", true);
        assert_eq!(with_links["FRONT_SERVICE_HOST"], "10.43.0.20");
        assert_eq!(with_links["KUBERNETES_SERVICE_HOST"], "10.43.0.1");
    }

    #[test]
    fn services_of_the_namespace_give_host_port_named_ports_and_docker_links() {
        let ix = index(&[
            kubernetes(),
            svc(
                "web",
                "redis-master",
                "10.43.0.11",
                json!([
                    {"port": 6379, "protocol": "TCP"},
                    {"name": "metrics-port", "port": 9121, "protocol": "TCP"},
                    {"name": "dns", "port": 53, "protocol": "UDP"},
                ]),
            ),
            // Headless and ExternalName Services have no variables.
            svc("web", "headless", "None", json!([{"port": 80}])),
            serde_json::from_value(json!({
                "metadata": {"name": "ext", "namespace": "web"},
                "spec": {"type": "ExternalName", "externalName": "example.com"},
            }))
            .unwrap(),
            // Nor do Services of other namespaces.
            svc("other", "db", "10.43.0.30", json!([{"port": 5432}])),
        ]);
        let all = ix.variables("web", true);
        let redis: Vec<String> = pairs(&all)
            .into_iter()
            .filter(|p| p.starts_with("REDIS_MASTER_"))
            .collect();
        assert_eq!(
            redis,
            [
                "REDIS_MASTER_PORT=tcp://10.43.0.11:6379",
                "REDIS_MASTER_PORT_53_UDP=udp://10.43.0.11:53",
                "REDIS_MASTER_PORT_53_UDP_ADDR=10.43.0.11",
                "REDIS_MASTER_PORT_53_UDP_PORT=53",
                "REDIS_MASTER_PORT_53_UDP_PROTO=udp",
                "REDIS_MASTER_PORT_6379_TCP=tcp://10.43.0.11:6379",
                "REDIS_MASTER_PORT_6379_TCP_ADDR=10.43.0.11",
                "REDIS_MASTER_PORT_6379_TCP_PORT=6379",
                "REDIS_MASTER_PORT_6379_TCP_PROTO=tcp",
                "REDIS_MASTER_PORT_9121_TCP=tcp://10.43.0.11:9121",
                "REDIS_MASTER_PORT_9121_TCP_ADDR=10.43.0.11",
                "REDIS_MASTER_PORT_9121_TCP_PORT=9121",
                "REDIS_MASTER_PORT_9121_TCP_PROTO=tcp",
                "REDIS_MASTER_SERVICE_HOST=10.43.0.11",
                "REDIS_MASTER_SERVICE_PORT=6379",
                "REDIS_MASTER_SERVICE_PORT_DNS=53",
                "REDIS_MASTER_SERVICE_PORT_METRICS_PORT=9121",
            ]
        );
        assert!(all.keys().all(|k| !k.starts_with("HEADLESS_")
            && !k.starts_with("EXT_")
            && !k.starts_with("DB_")));
    }

    #[test]
    fn a_namespaces_own_kubernetes_service_takes_the_place_of_defaults_with_links() {
        let ix = index(&[
            kubernetes(),
            svc("team", "kubernetes", "10.43.0.99", json!([{"port": 8443}])),
        ]);
        assert_eq!(
            ix.variables("team", true)["KUBERNETES_SERVICE_HOST"],
            "10.43.0.99"
        );
        assert_eq!(
            ix.variables("team", false)["KUBERNETES_SERVICE_HOST"],
            "10.43.0.1"
        );
        // A Service that loses its ClusterIP loses its variables.
        let mut ix = ix;
        ix.set(
            "default",
            "kubernetes",
            &svc("default", "kubernetes", "", json!([])),
        );
        assert!(ix.variables("web", true).is_empty());
    }

    #[test]
    fn ipv6_addresses_are_bracketed_in_link_urls() {
        let ix = index(&[svc(
            "default",
            "kubernetes",
            "fd00::1",
            json!([{"name": "https", "port": 443}]),
        )]);
        let v = ix.variables("x", false);
        assert_eq!(v["KUBERNETES_PORT"], "tcp://[fd00::1]:443");
        assert_eq!(v["KUBERNETES_PORT_443_TCP_ADDR"], "fd00::1");
    }

    #[tokio::test]
    async fn variables_wait_for_the_first_list_and_then_refuse() {
        let (tx, rx) = tokio::sync::watch::channel(false);
        let s = Services {
            index: Arc::new(RwLock::new(index(&[kubernetes()]))),
            synced: rx,
        };
        assert_eq!(
            s.variables("x", true, Duration::from_millis(10)).await,
            Err(NOT_SYNCED.to_string())
        );
        let waiting = {
            let s = s.clone();
            tokio::spawn(async move { s.variables("x", true, Duration::from_secs(30)).await })
        };
        tx.send_replace(true);
        let v = waiting.await.unwrap().unwrap();
        assert_eq!(v["KUBERNETES_SERVICE_PORT"], "443");
    }
}
