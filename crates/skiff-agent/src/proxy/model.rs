//! What the proxy should do for one Service, decided from data alone:
//! Services and EndpointSlices (as the API serves them) and this node's
//! facts in, one [`PortPlan`] per service port out. No I/O; the nftables
//! rendering of a plan is in [`super::rules`].
//!
//! Semantics follow kube-proxy (nftables mode): only ready endpoints serve;
//! when none is ready, serving-and-terminating endpoints are the fallback;
//! `internalTrafficPolicy: Local` and `externalTrafficPolicy: Local` use the
//! endpoints on this node only; ClientIP session affinity pins a client to
//! its endpoint for `timeoutSeconds` (default 10800).

use std::collections::BTreeSet;
use std::net::Ipv4Addr;

use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;

/// Services carrying this label are served by something else on the node
/// (the cluster DNS): the proxy neither DNATs nor rejects them.
pub const NODE_LOCAL_LABEL: &str = "skiff.io/node-local";

/// The label linking an EndpointSlice to its Service.
pub const SERVICE_NAME_LABEL: &str = "kubernetes.io/service-name";

/// Kubernetes' default ClientIP affinity timeout (3 hours).
pub const DEFAULT_AFFINITY_SECONDS: u32 = 10800;

/// What the proxy knows about the node it runs on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeFacts {
    pub name: String,
    /// Addresses NodePorts answer on (the node's IPs).
    pub ips: Vec<Ipv4Addr>,
    /// The cluster's pod range: traffic to a ClusterIP from outside it is
    /// masqueraded (so replies come back through this node).
    pub cluster_cidr: Option<(Ipv4Addr, u8)>,
}

/// A transport protocol kube-proxy handles.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Protocol {
    Tcp,
    Udp,
    Sctp,
}

impl Protocol {
    pub fn parse(s: Option<&str>) -> Option<Protocol> {
        match s.unwrap_or("TCP") {
            "TCP" => Some(Protocol::Tcp),
            "UDP" => Some(Protocol::Udp),
            "SCTP" => Some(Protocol::Sctp),
            _ => None,
        }
    }
    /// nftables' name (`meta l4proto tcp`).
    pub fn nft(self) -> &'static str {
        match self {
            Protocol::Tcp => "tcp",
            Protocol::Udp => "udp",
            Protocol::Sctp => "sctp",
        }
    }
}

/// One endpoint a service port sends to.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Endpoint {
    pub ip: Ipv4Addr,
    pub port: u16,
}

/// Identifies a service port: `namespace/name/protocol/portname`.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PortKey {
    pub namespace: String,
    pub name: String,
    pub protocol: Protocol,
    pub port_name: String,
}

impl std::fmt::Display for PortKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}/{}/{}/{}",
            self.namespace,
            self.name,
            self.protocol.nft(),
            self.port_name
        )
    }
}

/// Everything the dataplane needs for one service port.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PortPlan {
    pub key: PortKey,
    pub cluster_ip: Ipv4Addr,
    pub port: u16,
    pub node_port: Option<u16>,
    /// externalIPs and LoadBalancer ingress IPs: answered on `port` like
    /// external traffic.
    pub external_ips: Vec<Ipv4Addr>,
    /// Endpoints for cluster-wide traffic: the ready ones, else the
    /// serving-and-terminating ones.
    pub cluster_endpoints: Vec<Endpoint>,
    /// The same choice among endpoints on this node.
    pub local_endpoints: Vec<Endpoint>,
    /// The service has at least one endpoint somewhere that could serve
    /// (a service without any rejects; one whose policy excludes them all
    /// drops, as kube-proxy does).
    pub has_endpoints: bool,
    pub internal_local: bool,
    pub external_local: bool,
    /// ClientIP session affinity timeout in seconds.
    pub affinity: Option<u32>,
    /// The port answering load balancers' health checks for this node
    /// (externalTrafficPolicy Local LoadBalancer services).
    pub health_check_node_port: Option<u16>,
}

impl PortPlan {
    /// Endpoints ClusterIP traffic goes to.
    pub fn internal_endpoints(&self) -> &[Endpoint] {
        if self.internal_local {
            &self.local_endpoints
        } else {
            &self.cluster_endpoints
        }
    }
    /// Endpoints NodePort, externalIP and LoadBalancer traffic goes to.
    pub fn external_endpoints(&self) -> &[Endpoint] {
        if self.external_local {
            &self.local_endpoints
        } else {
            &self.cluster_endpoints
        }
    }
    /// Whether NodePort, externalIPs or LoadBalancer IPs reach this port.
    pub fn has_external(&self) -> bool {
        self.node_port.is_some() || !self.external_ips.is_empty()
    }
}

/// Why a Service is left out of the dataplane (logged, and an Event).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Skip {
    /// Headless, ExternalName, or served by the node itself: nothing to do.
    NotProxied,
    /// Something the dataplane cannot express.
    Unsupported(String),
}

/// The plan of every port of `svc`, from the slices that belong to it.
pub fn plan_service(
    svc: &Service,
    slices: &[&EndpointSlice],
    node: &NodeFacts,
) -> Result<Vec<PortPlan>, Skip> {
    let labels = svc.metadata.labels.as_ref();
    if labels
        .and_then(|l| l.get(NODE_LOCAL_LABEL))
        .map(|v| v == "true")
        .unwrap_or(false)
    {
        return Err(Skip::NotProxied);
    }
    let Some(spec) = svc.spec.as_ref() else {
        return Err(Skip::NotProxied);
    };
    if spec.type_.as_deref() == Some("ExternalName") {
        return Err(Skip::NotProxied);
    }
    let cluster_ip = match spec.cluster_ip.as_deref() {
        None | Some("") | Some("None") => return Err(Skip::NotProxied),
        Some(ip) => match ip.parse::<Ipv4Addr>() {
            Ok(ip) => ip,
            // IPv6 services are not programmed yet.
            Err(_) => return Err(Skip::Unsupported(format!("clusterIP {ip} is not IPv4"))),
        },
    };
    let namespace = svc.metadata.namespace.clone().unwrap_or_default();
    let name = svc.metadata.name.clone().unwrap_or_default();
    let mut external_ips: Vec<Ipv4Addr> = spec
        .external_ips
        .iter()
        .flatten()
        .filter_map(|s| s.parse().ok())
        .collect();
    if spec.type_.as_deref() == Some("LoadBalancer") {
        for ing in svc
            .status
            .as_ref()
            .and_then(|s| s.load_balancer.as_ref())
            .and_then(|lb| lb.ingress.as_ref())
            .into_iter()
            .flatten()
        {
            if let Some(ip) = ing.ip.as_deref().and_then(|s| s.parse().ok()) {
                external_ips.push(ip);
            }
        }
    }
    external_ips.sort();
    external_ips.dedup();
    let node_ports_allowed = matches!(spec.type_.as_deref(), Some("NodePort" | "LoadBalancer"));
    let affinity = (spec.session_affinity.as_deref() == Some("ClientIP")).then(|| {
        spec.session_affinity_config
            .as_ref()
            .and_then(|c| c.client_ip.as_ref())
            .and_then(|c| c.timeout_seconds)
            .map(|t| t.clamp(1, 86400) as u32)
            .unwrap_or(DEFAULT_AFFINITY_SECONDS)
    });
    let internal_local = spec.internal_traffic_policy.as_deref() == Some("Local");
    let external_local = spec.external_traffic_policy.as_deref() == Some("Local");
    let health_check_node_port = spec
        .health_check_node_port
        .filter(|_| external_local && spec.type_.as_deref() == Some("LoadBalancer"))
        .and_then(|p| u16::try_from(p).ok())
        .filter(|p| *p != 0);
    let mut plans = vec![];
    for sp in spec.ports.iter().flatten() {
        let Some(protocol) = Protocol::parse(sp.protocol.as_deref()) else {
            return Err(Skip::Unsupported(format!(
                "protocol {:?} of port {}",
                sp.protocol, sp.port
            )));
        };
        let port_name = sp.name.clone().unwrap_or_default();
        let port =
            u16::try_from(sp.port).map_err(|_| Skip::Unsupported(format!("port {}", sp.port)))?;
        let node_port = if node_ports_allowed {
            sp.node_port
                .and_then(|p| u16::try_from(p).ok())
                .filter(|p| *p != 0)
        } else {
            None
        };
        let choice = endpoints_for(slices, &port_name, protocol, &node.name);
        plans.push(PortPlan {
            key: PortKey {
                namespace: namespace.clone(),
                name: name.clone(),
                protocol,
                port_name,
            },
            cluster_ip,
            port,
            node_port,
            external_ips: external_ips.clone(),
            cluster_endpoints: choice.cluster,
            local_endpoints: choice.local,
            has_endpoints: choice.any,
            internal_local,
            external_local,
            affinity,
            health_check_node_port,
        });
    }
    Ok(plans)
}

struct Choice {
    cluster: Vec<Endpoint>,
    local: Vec<Endpoint>,
    any: bool,
}

/// kube-proxy's endpoint categorisation for one service port. The port is
/// matched by name and protocol in each slice (the EndpointSlice controller
/// already resolved a named `targetPort` per pod, so the number comes from
/// the slice).
fn endpoints_for(
    slices: &[&EndpointSlice],
    port_name: &str,
    protocol: Protocol,
    node_name: &str,
) -> Choice {
    // (endpoint, ready, serving-and-terminating, local)
    let mut all: BTreeSet<(Endpoint, bool, bool, bool)> = BTreeSet::new();
    for slice in slices {
        if slice.address_type != "IPv4" {
            continue;
        }
        let Some(port) = slice.ports.iter().flatten().find(|p| {
            p.name.as_deref().unwrap_or("") == port_name
                && Protocol::parse(p.protocol.as_deref()) == Some(protocol)
        }) else {
            continue;
        };
        let Some(port) = port.port.and_then(|p| u16::try_from(p).ok()) else {
            continue;
        };
        for ep in &slice.endpoints {
            let Some(ip) = ep
                .addresses
                .first()
                .and_then(|a| a.parse::<Ipv4Addr>().ok())
            else {
                continue;
            };
            let c = ep.conditions.as_ref();
            // Unset conditions: ready and serving mean "ready", terminating
            // means "not terminating" (EndpointSlice API).
            let ready = c.and_then(|c| c.ready).unwrap_or(true);
            let serving = c.and_then(|c| c.serving).unwrap_or(ready);
            let terminating = c.and_then(|c| c.terminating).unwrap_or(false);
            let local = ep.node_name.as_deref() == Some(node_name);
            all.insert((Endpoint { ip, port }, ready, serving && terminating, local));
        }
    }
    let pick = |only_local: bool| -> Vec<Endpoint> {
        let eligible = |e: &&(Endpoint, bool, bool, bool)| !only_local || e.3;
        let ready: Vec<Endpoint> = all
            .iter()
            .filter(eligible)
            .filter(|e| e.1)
            .map(|e| e.0.clone())
            .collect();
        if !ready.is_empty() {
            return dedup(ready);
        }
        dedup(
            all.iter()
                .filter(eligible)
                .filter(|e| e.2)
                .map(|e| e.0.clone())
                .collect(),
        )
    };
    let cluster = pick(false);
    let local = pick(true);
    Choice {
        any: !cluster.is_empty(),
        cluster,
        local,
    }
}

fn dedup(mut v: Vec<Endpoint>) -> Vec<Endpoint> {
    v.sort();
    v.dedup();
    v
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn node() -> NodeFacts {
        NodeFacts {
            name: "n1".into(),
            ips: vec!["192.168.5.10".parse().unwrap()],
            cluster_cidr: Some(("10.42.0.0".parse().unwrap(), 16)),
        }
    }

    fn svc(v: serde_json::Value) -> Service {
        let mut base = json!({
            "metadata": {"name": "web", "namespace": "default"},
            "spec": {"clusterIP": "10.43.0.20", "ports": [{"name": "http", "port": 80, "protocol": "TCP", "targetPort": "http"}]}
        });
        merge(&mut base, v);
        serde_json::from_value(base).unwrap()
    }

    fn merge(a: &mut serde_json::Value, b: serde_json::Value) {
        match (a, b) {
            (serde_json::Value::Object(a), serde_json::Value::Object(b)) => {
                for (k, v) in b {
                    merge(a.entry(k).or_insert(serde_json::Value::Null), v);
                }
            }
            (a, b) => *a = b,
        }
    }

    /// A slice with `(ip, ready, serving, terminating, node)` endpoints and
    /// the port `http` → `port`.
    fn slice(port: i32, eps: &[(&str, bool, bool, bool, &str)]) -> EndpointSlice {
        serde_json::from_value(json!({
            "metadata": {"name": "web-1", "namespace": "default", "labels": {SERVICE_NAME_LABEL: "web"}},
            "addressType": "IPv4",
            "ports": [{"name": "http", "port": port, "protocol": "TCP"}],
            "endpoints": eps.iter().map(|(ip, r, s, t, n)| json!({
                "addresses": [ip],
                "conditions": {"ready": r, "serving": s, "terminating": t},
                "nodeName": n,
            })).collect::<Vec<_>>(),
        }))
        .unwrap()
    }

    fn ep(ip: &str, port: u16) -> Endpoint {
        Endpoint {
            ip: ip.parse().unwrap(),
            port,
        }
    }

    #[test]
    fn a_cluster_ip_service_sends_to_its_ready_endpoints_on_the_resolved_target_port() {
        let s = slice(
            8080,
            &[
                ("10.42.0.5", true, true, false, "n1"),
                ("10.42.1.6", true, true, false, "n2"),
                ("10.42.0.7", false, false, false, "n1"),
            ],
        );
        let plans = plan_service(&svc(json!({})), &[&s], &node()).unwrap();
        assert_eq!(plans.len(), 1);
        let p = &plans[0];
        assert_eq!(p.key.to_string(), "default/web/tcp/http");
        assert_eq!(p.cluster_ip.to_string(), "10.43.0.20");
        assert_eq!(p.port, 80);
        assert_eq!(
            p.cluster_endpoints,
            vec![ep("10.42.0.5", 8080), ep("10.42.1.6", 8080)]
        );
        assert_eq!(p.local_endpoints, vec![ep("10.42.0.5", 8080)]);
        assert!(p.has_endpoints);
        assert_eq!(p.node_port, None);
        assert_eq!(p.affinity, None);
    }

    #[test]
    fn terminating_but_serving_endpoints_are_used_only_when_none_is_ready() {
        let both = slice(
            8080,
            &[
                ("10.42.0.5", true, true, false, "n1"),
                ("10.42.0.6", false, true, true, "n1"),
            ],
        );
        let p = &plan_service(&svc(json!({})), &[&both], &node()).unwrap()[0];
        assert_eq!(p.cluster_endpoints, vec![ep("10.42.0.5", 8080)]);

        let only_terminating = slice(
            8080,
            &[
                ("10.42.0.6", false, true, true, "n1"),
                ("10.42.0.7", false, false, true, "n1"),
            ],
        );
        let p = &plan_service(&svc(json!({})), &[&only_terminating], &node()).unwrap()[0];
        assert_eq!(p.cluster_endpoints, vec![ep("10.42.0.6", 8080)]);
        assert!(p.has_endpoints);
    }

    #[test]
    fn a_service_without_serving_endpoints_has_none() {
        let s = slice(8080, &[("10.42.0.7", false, false, false, "n1")]);
        let p = &plan_service(&svc(json!({})), &[&s], &node()).unwrap()[0];
        assert!(p.cluster_endpoints.is_empty());
        assert!(!p.has_endpoints);
        let p = &plan_service(&svc(json!({})), &[], &node()).unwrap()[0];
        assert!(!p.has_endpoints);
    }

    #[test]
    fn unset_conditions_mean_ready() {
        let s: EndpointSlice = serde_json::from_value(json!({
            "metadata": {"name": "web-1"},
            "addressType": "IPv4",
            "ports": [{"name": "http", "port": 8080}],
            "endpoints": [{"addresses": ["10.42.0.5"]}],
        }))
        .unwrap();
        let p = &plan_service(&svc(json!({})), &[&s], &node()).unwrap()[0];
        assert_eq!(p.cluster_endpoints, vec![ep("10.42.0.5", 8080)]);
    }

    #[test]
    fn ports_are_matched_by_name_and_protocol_across_slices() {
        let s = svc(json!({"spec": {"ports": [
            {"name": "dns", "port": 53, "protocol": "UDP"},
            {"name": "dns-tcp", "port": 53, "protocol": "TCP"},
        ]}}));
        let a: EndpointSlice = serde_json::from_value(json!({
            "metadata": {"name": "a"}, "addressType": "IPv4",
            "ports": [{"name": "dns", "port": 5353, "protocol": "UDP"}, {"name": "dns-tcp", "port": 5354, "protocol": "TCP"}],
            "endpoints": [{"addresses": ["10.42.0.5"]}],
        }))
        .unwrap();
        let b: EndpointSlice = serde_json::from_value(json!({
            "metadata": {"name": "b"}, "addressType": "IPv4",
            "ports": [{"name": "dns", "port": 6000, "protocol": "UDP"}],
            "endpoints": [{"addresses": ["10.42.0.9"]}],
        }))
        .unwrap();
        let plans = plan_service(&s, &[&a, &b], &node()).unwrap();
        assert_eq!(plans[0].key.protocol, Protocol::Udp);
        assert_eq!(
            plans[0].cluster_endpoints,
            vec![ep("10.42.0.5", 5353), ep("10.42.0.9", 6000)]
        );
        assert_eq!(plans[1].key.protocol, Protocol::Tcp);
        assert_eq!(plans[1].cluster_endpoints, vec![ep("10.42.0.5", 5354)]);
    }

    #[test]
    fn node_ports_external_ips_and_load_balancer_ingress_are_external_addresses() {
        let s = svc(json!({
            "spec": {"type": "LoadBalancer", "externalIPs": ["203.0.113.7"],
                     "ports": [{"name": "http", "port": 80, "nodePort": 30080}]},
            "status": {"loadBalancer": {"ingress": [{"ip": "192.168.5.10"}]}}
        }));
        let p = &plan_service(&s, &[], &node()).unwrap()[0];
        assert_eq!(p.node_port, Some(30080));
        assert_eq!(
            p.external_ips,
            vec![
                "192.168.5.10".parse::<Ipv4Addr>().unwrap(),
                "203.0.113.7".parse().unwrap()
            ]
        );
        assert!(p.has_external());
    }

    #[test]
    fn a_cluster_ip_service_ignores_a_stray_node_port() {
        let s = svc(json!({"spec": {"ports": [{"name": "http", "port": 80, "nodePort": 30080}]}}));
        assert_eq!(plan_service(&s, &[], &node()).unwrap()[0].node_port, None);
    }

    #[test]
    fn client_ip_affinity_has_kubernetes_default_timeout_unless_set() {
        let s = svc(json!({"spec": {"sessionAffinity": "ClientIP"}}));
        assert_eq!(
            plan_service(&s, &[], &node()).unwrap()[0].affinity,
            Some(10800)
        );
        let s = svc(json!({"spec": {"sessionAffinity": "ClientIP",
            "sessionAffinityConfig": {"clientIP": {"timeoutSeconds": 60}}}}));
        assert_eq!(
            plan_service(&s, &[], &node()).unwrap()[0].affinity,
            Some(60)
        );
    }

    #[test]
    fn traffic_policy_local_uses_only_this_nodes_endpoints() {
        let s = svc(
            json!({"spec": {"type": "NodePort", "internalTrafficPolicy": "Local",
            "externalTrafficPolicy": "Local", "ports": [{"name": "http", "port": 80, "nodePort": 30080}]}}),
        );
        let sl = slice(
            8080,
            &[
                ("10.42.0.5", true, true, false, "n1"),
                ("10.42.1.6", true, true, false, "n2"),
            ],
        );
        let p = &plan_service(&s, &[&sl], &node()).unwrap()[0];
        assert_eq!(p.internal_endpoints(), &[ep("10.42.0.5", 8080)]);
        assert_eq!(p.external_endpoints(), &[ep("10.42.0.5", 8080)]);
        let remote_only = slice(8080, &[("10.42.1.6", true, true, false, "n2")]);
        let p = &plan_service(&s, &[&remote_only], &node()).unwrap()[0];
        assert!(p.internal_endpoints().is_empty());
        assert!(
            p.has_endpoints,
            "endpoints exist elsewhere: drop, not reject"
        );
    }

    #[test]
    fn headless_external_name_and_node_local_services_are_not_proxied() {
        let headless = svc(json!({"spec": {"clusterIP": "None"}}));
        assert_eq!(plan_service(&headless, &[], &node()), Err(Skip::NotProxied));
        let ext = svc(
            json!({"spec": {"type": "ExternalName", "clusterIP": null, "externalName": "example.com"}}),
        );
        assert_eq!(plan_service(&ext, &[], &node()), Err(Skip::NotProxied));
        let dns = svc(json!({"metadata": {"labels": {NODE_LOCAL_LABEL: "true"}}}));
        assert_eq!(plan_service(&dns, &[], &node()), Err(Skip::NotProxied));
    }

    #[test]
    fn an_ipv6_cluster_ip_is_reported_as_unsupported() {
        let s = svc(json!({"spec": {"clusterIP": "fd00::1"}}));
        assert!(matches!(
            plan_service(&s, &[], &node()),
            Err(Skip::Unsupported(_))
        ));
    }

    #[test]
    fn ipv6_slices_are_ignored_for_an_ipv4_service() {
        let mut s = slice(8080, &[("10.42.0.5", true, true, false, "n1")]);
        s.address_type = "IPv6".into();
        assert!(!plan_service(&svc(json!({})), &[&s], &node()).unwrap()[0].has_endpoints);
    }
}
