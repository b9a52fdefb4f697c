//! NetworkPolicy (networking.k8s.io/v1) as nftables objects, from data
//! alone. For every pod on this node that some policy selects, a chain per
//! direction (`pol-in/IP`, `pol-out/IP`) holds one `return` rule per
//! allowed (peer, port) combination and ends in `drop`; the
//! `policy-ingress` / `policy-egress` verdict maps send a packet to the
//! chain of its destination / source pod. The base chains (in
//! [`super::super::rules::skeleton`]) let established flows through first,
//! so replies of allowed connections pass, and run after DNAT, so traffic
//! through a Service is checked against the endpoint it reached.
//!
//! A policy with something the dataplane cannot express (an IPv6
//! ipBlock, say) still isolates the pods it selects but contributes no
//! allow rule, and is reported: never half of a policy.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::net::Ipv4Addr;

use k8s_openapi::api::networking::v1::{NetworkPolicy, NetworkPolicyPeer, NetworkPolicyPort};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use serde_json::{Map, Value};
use skiff_core::selector::LabelSelector as Selector;

use crate::proxy::model::Protocol;
use crate::proxy::rules::{MapKey, PortRules, Rule, Verdict};

pub const POLICY_INGRESS: &str = "policy-ingress";
pub const POLICY_EGRESS: &str = "policy-egress";
/// The chain of input-hook checks (egress to the node-local cluster DNS).
pub const POLICY_INPUT_RULES: &str = "policy-input-rules";

/// A named container port of a pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NamedPort {
    pub name: String,
    pub protocol: Protocol,
    pub port: u16,
}

/// A pod as policies see it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodInfo {
    pub namespace: String,
    pub name: String,
    pub ip: Ipv4Addr,
    pub labels: BTreeMap<String, String>,
    pub ports: Vec<NamedPort>,
    /// Runs on this node (its traffic is filtered here).
    pub local: bool,
}

/// Which address a rule matches.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Field {
    Saddr,
    Daddr,
}

impl Field {
    pub fn nft(self) -> &'static str {
        match self {
            Field::Saddr => "saddr",
            Field::Daddr => "daddr",
        }
    }
}

/// The peer part of an allow rule.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Addr {
    Any,
    /// Pod addresses.
    Set(Vec<Ipv4Addr>),
    /// An ipBlock: the CIDR minus the excepted ones.
    Block((Ipv4Addr, u8), Vec<(Ipv4Addr, u8)>),
}

/// One allow rule: `[ip FIELD ADDR] [meta l4proto P [th dport PORTS]]
/// return`.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Allow {
    pub field: Field,
    pub addr: Addr,
    pub protocol: Option<Protocol>,
    /// First and last port (equal for one port); None: every port.
    pub ports: Option<(u16, u16)>,
}

impl fmt::Display for Allow {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let field = self.field.nft();
        match &self.addr {
            Addr::Any => {}
            Addr::Set(ips) => {
                let list: Vec<String> = ips.iter().map(|i| i.to_string()).collect();
                write!(f, "ip {field} {{ {} }} ", list.join(", "))?;
            }
            Addr::Block((ip, len), except) => {
                write!(f, "ip {field} {ip}/{len} ")?;
                if !except.is_empty() {
                    let list: Vec<String> =
                        except.iter().map(|(i, l)| format!("{i}/{l}")).collect();
                    write!(f, "ip {field} != {{ {} }} ", list.join(", "))?;
                }
            }
        }
        if let Some(p) = self.protocol {
            write!(f, "meta l4proto {} ", p.nft())?;
            match self.ports {
                Some((a, b)) if a == b => write!(f, "th dport {a} ")?,
                Some((a, b)) => write!(f, "th dport {a}-{b} ")?,
                None => {}
            }
        }
        write!(f, "return")
    }
}

/// What rendering gives: the objects, and the policies left out (with why).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Rendered {
    pub rules: PortRules,
    pub unsupported: Vec<((String, String), String)>,
}

fn labels_json(l: &BTreeMap<String, String>) -> Map<String, Value> {
    l.iter()
        .map(|(k, v)| (k.clone(), Value::String(v.clone())))
        .collect()
}

fn selector(s: &LabelSelector) -> Result<Selector, String> {
    let v = serde_json::to_value(s).map_err(|e| e.to_string())?;
    Selector::from_label_selector_json(&v)
}

/// Whether a pod's policy kinds include `kind` (policyTypes, defaulted as
/// the API does: Ingress always, Egress when there are egress rules).
fn has_type(p: &NetworkPolicy, kind: &str) -> bool {
    let Some(spec) = &p.spec else { return false };
    match &spec.policy_types {
        Some(t) if !t.is_empty() => t.iter().any(|x| x == kind),
        _ => kind == "Ingress" || spec.egress.as_ref().is_some_and(|e| !e.is_empty()),
    }
}

fn parse_cidr(s: &str) -> Option<(Ipv4Addr, u8)> {
    let (ip, len) = s.split_once('/')?;
    let ip: Ipv4Addr = ip.parse().ok()?;
    let len: u8 = len.parse().ok().filter(|l| *l <= 32)?;
    let mask = if len == 0 {
        0
    } else {
        u32::MAX << (32 - u32::from(len))
    };
    Some((Ipv4Addr::from(u32::from(ip) & mask), len))
}

fn in_cidr(ip: Ipv4Addr, (net, len): (Ipv4Addr, u8)) -> bool {
    let mask = if len == 0 {
        0
    } else {
        u32::MAX << (32 - u32::from(len))
    };
    u32::from(ip) & mask == u32::from(net)
}

/// An ipBlock: its CIDR and the excepted ones.
type Block = ((Ipv4Addr, u8), Vec<(Ipv4Addr, u8)>);

/// The peers of one rule, resolved.
struct Peers {
    /// None: any address (no `from`/`to`).
    pods: Option<BTreeSet<Ipv4Addr>>,
    blocks: Vec<Block>,
}

struct Cluster<'a> {
    pods: &'a [PodInfo],
    namespaces: &'a BTreeMap<String, BTreeMap<String, String>>,
}

impl Cluster<'_> {
    fn peers(&self, ns: &str, peers: Option<&Vec<NetworkPolicyPeer>>) -> Result<Peers, String> {
        let Some(peers) = peers.filter(|p| !p.is_empty()) else {
            return Ok(Peers {
                pods: None,
                blocks: vec![],
            });
        };
        let mut pods = BTreeSet::new();
        let mut blocks = vec![];
        for peer in peers {
            if let Some(b) = &peer.ip_block {
                let cidr = parse_cidr(&b.cidr).ok_or_else(|| {
                    format!(
                        "ipBlock {} is not an IPv4 CIDR (IPv6 is not supported)",
                        b.cidr
                    )
                })?;
                let except = b
                    .except
                    .iter()
                    .flatten()
                    .map(|e| {
                        parse_cidr(e)
                            .ok_or_else(|| format!("ipBlock except {e} is not an IPv4 CIDR"))
                    })
                    .collect::<Result<Vec<_>, _>>()?;
                blocks.push((cidr, except));
                continue;
            }
            let pod_sel = peer.pod_selector.as_ref().map(selector).transpose()?;
            let ns_sel = peer.namespace_selector.as_ref().map(selector).transpose()?;
            for p in self.pods {
                let ns_ok = match &ns_sel {
                    Some(s) => {
                        let labels =
                            self.namespaces
                                .get(&p.namespace)
                                .cloned()
                                .unwrap_or_else(|| {
                                    BTreeMap::from([(
                                        "kubernetes.io/metadata.name".to_string(),
                                        p.namespace.clone(),
                                    )])
                                });
                        s.matches(&labels_json(&labels))
                    }
                    None => p.namespace == ns,
                };
                let pod_ok = pod_sel
                    .as_ref()
                    .is_none_or(|s| s.matches(&labels_json(&p.labels)));
                if ns_ok && pod_ok {
                    pods.insert(p.ip);
                }
            }
        }
        Ok(Peers {
            pods: Some(pods),
            blocks,
        })
    }
}

/// One `ports` entry: protocol, and a port spec.
enum PortSpec {
    All(Protocol),
    Range(Protocol, u16, u16),
    Named(Protocol, String),
}

fn port_specs(ports: Option<&Vec<NetworkPolicyPort>>) -> Result<Option<Vec<PortSpec>>, String> {
    let Some(ports) = ports.filter(|p| !p.is_empty()) else {
        return Ok(None);
    };
    let mut out = vec![];
    for p in ports {
        let proto = Protocol::parse(p.protocol.as_deref())
            .ok_or_else(|| format!("protocol {:?} is not supported", p.protocol))?;
        out.push(match &p.port {
            None => PortSpec::All(proto),
            Some(IntOrString::Int(n)) => {
                let a = u16::try_from(*n).map_err(|_| format!("port {n} is out of range"))?;
                let b = match p.end_port {
                    Some(e) => {
                        u16::try_from(e).map_err(|_| format!("endPort {e} is out of range"))?
                    }
                    None => a,
                };
                if b < a {
                    return Err(format!("endPort {b} is below port {a}"));
                }
                PortSpec::Range(proto, a, b)
            }
            Some(IntOrString::String(name)) => {
                if p.end_port.is_some() {
                    return Err("endPort with a named port".into());
                }
                PortSpec::Named(proto, name.clone())
            }
        });
    }
    Ok(Some(out))
}

fn resolve(pod: &PodInfo, proto: Protocol, name: &str) -> Option<u16> {
    pod.ports
        .iter()
        .find(|p| p.name == name && p.protocol == proto)
        .map(|p| p.port)
}

/// The allow rules of one policy rule for `target` (the local pod).
fn allows(
    cluster: &Cluster,
    target: &PodInfo,
    field: Field,
    peers: Peers,
    ports: Option<Vec<PortSpec>>,
) -> Vec<Allow> {
    let mut addrs: Vec<Addr> = vec![];
    match &peers.pods {
        None => addrs.push(Addr::Any),
        Some(set) if !set.is_empty() => addrs.push(Addr::Set(set.iter().copied().collect())),
        Some(_) => {}
    }
    for (c, e) in &peers.blocks {
        addrs.push(Addr::Block(*c, e.clone()));
    }
    let mut out = vec![];
    let Some(ports) = ports else {
        for a in addrs {
            out.push(Allow {
                field,
                addr: a,
                protocol: None,
                ports: None,
            });
        }
        return out;
    };
    for spec in &ports {
        match spec {
            PortSpec::All(p) => out.extend(addrs.iter().map(|a| Allow {
                field,
                addr: a.clone(),
                protocol: Some(*p),
                ports: None,
            })),
            PortSpec::Range(p, lo, hi) => out.extend(addrs.iter().map(|a| Allow {
                field,
                addr: a.clone(),
                protocol: Some(*p),
                ports: Some((*lo, *hi)),
            })),
            PortSpec::Named(p, name) if field == Field::Saddr => {
                // Ingress: the name is one of the protected pod's ports.
                if let Some(n) = resolve(target, *p, name) {
                    out.extend(addrs.iter().map(|a| Allow {
                        field,
                        addr: a.clone(),
                        protocol: Some(*p),
                        ports: Some((n, n)),
                    }));
                }
            }
            PortSpec::Named(p, name) => {
                // Egress: the name resolves on each destination pod, so
                // the destinations are grouped by the number it gives.
                let mut by_port: BTreeMap<u16, Vec<Ipv4Addr>> = BTreeMap::new();
                for pod in cluster.pods {
                    let Some(n) = resolve(pod, *p, name) else {
                        continue;
                    };
                    let wanted = match &peers.pods {
                        None => true,
                        Some(set) => set.contains(&pod.ip),
                    } || peers.blocks.iter().any(|(c, e)| {
                        in_cidr(pod.ip, *c) && !e.iter().any(|x| in_cidr(pod.ip, *x))
                    });
                    if wanted {
                        by_port.entry(n).or_default().push(pod.ip);
                    }
                }
                for (n, mut ips) in by_port {
                    ips.sort();
                    ips.dedup();
                    out.push(Allow {
                        field,
                        addr: Addr::Set(ips),
                        protocol: Some(*p),
                        ports: Some((n, n)),
                    });
                }
            }
        }
    }
    out
}

fn policy_key(p: &NetworkPolicy) -> (String, String) {
    (
        p.metadata.namespace.clone().unwrap_or_default(),
        p.metadata.name.clone().unwrap_or_default(),
    )
}

/// The allow rules one policy gives `pod` in one direction.
fn policy_allows(
    cluster: &Cluster,
    p: &NetworkPolicy,
    pod: &PodInfo,
    ingress: bool,
) -> Result<Vec<Allow>, String> {
    let ns = p.metadata.namespace.as_deref().unwrap_or_default();
    let spec = p.spec.as_ref().ok_or("no spec")?;
    let mut out = vec![];
    if ingress {
        for r in spec.ingress.iter().flatten() {
            let peers = cluster.peers(ns, r.from.as_ref())?;
            let ports = port_specs(r.ports.as_ref())?;
            out.extend(allows(cluster, pod, Field::Saddr, peers, ports));
        }
    } else {
        for r in spec.egress.iter().flatten() {
            let peers = cluster.peers(ns, r.to.as_ref())?;
            let ports = port_specs(r.ports.as_ref())?;
            out.extend(allows(cluster, pod, Field::Daddr, peers, ports));
        }
    }
    Ok(out)
}

/// Renders every policy for this node's pods. `dns` are the node-local
/// cluster DNS addresses: egress to them is checked in the input hook.
pub fn render(
    pods: &[PodInfo],
    namespaces: &BTreeMap<String, BTreeMap<String, String>>,
    policies: &[NetworkPolicy],
    dns: &[Ipv4Addr],
) -> Rendered {
    let cluster = Cluster { pods, namespaces };
    let mut out = Rendered::default();
    let mut sorted: Vec<&NetworkPolicy> = policies.iter().collect();
    sorted.sort_by_key(|p| policy_key(p));
    // Which policies fail (whole), decided once per policy and pod-free
    // part: selectors and blocks that cannot be parsed.
    let mut failed: BTreeMap<(String, String), String> = BTreeMap::new();
    let mut selects: Vec<(&NetworkPolicy, Selector)> = vec![];
    for p in &sorted {
        let sel = p
            .spec
            .as_ref()
            .map(|s| selector(&s.pod_selector.clone().unwrap_or_default()))
            .transpose();
        match sel {
            Ok(Some(s)) => selects.push((p, s)),
            Ok(None) => {}
            Err(e) => {
                failed.insert(policy_key(p), format!("podSelector: {e}"));
            }
        }
    }
    let mut egress_pods = false;
    for pod in pods.iter().filter(|p| p.local) {
        for ingress in [true, false] {
            let kind = if ingress { "Ingress" } else { "Egress" };
            let selecting: Vec<&NetworkPolicy> = selects
                .iter()
                .filter(|(p, s)| {
                    p.metadata.namespace.as_deref() == Some(pod.namespace.as_str())
                        && has_type(p, kind)
                        && s.matches(&labels_json(&pod.labels))
                })
                .map(|(p, _)| *p)
                .collect();
            if selecting.is_empty() {
                continue;
            }
            let mut rules: Vec<Rule> = vec![];
            for p in selecting {
                match policy_allows(&cluster, p, pod, ingress) {
                    Ok(a) => rules.extend(a.into_iter().map(Rule::Allow)),
                    Err(e) => {
                        failed.entry(policy_key(p)).or_insert(e);
                    }
                }
            }
            rules.dedup();
            rules.push(Rule::Drop);
            let (prefix, map) = if ingress {
                ("pol-in", POLICY_INGRESS)
            } else {
                egress_pods = true;
                ("pol-out", POLICY_EGRESS)
            };
            let chain = format!("{prefix}/{}", pod.ip);
            out.rules.chains.insert(chain.clone(), rules);
            out.rules
                .elements
                .insert((map, MapKey::Addr(pod.ip)), Verdict::Jump(chain));
        }
    }
    let mut input = vec![];
    if egress_pods && !dns.is_empty() {
        input.push(Rule::EgressCheckTo(dns.to_vec()));
    }
    out.rules
        .chains
        .insert(POLICY_INPUT_RULES.to_string(), input);
    out.unsupported = failed.into_iter().collect();
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod(ns: &str, name: &str, ip: &str, labels: &[(&str, &str)], local: bool) -> PodInfo {
        PodInfo {
            namespace: ns.into(),
            name: name.into(),
            ip: ip.parse().unwrap(),
            labels: labels
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            ports: vec![NamedPort {
                name: "http".into(),
                protocol: Protocol::Tcp,
                port: 8080,
            }],
            local,
        }
    }

    fn policy(v: Value) -> NetworkPolicy {
        serde_json::from_value(v).unwrap()
    }

    fn namespaces() -> BTreeMap<String, BTreeMap<String, String>> {
        let mut m = BTreeMap::new();
        for (ns, team) in [("default", "a"), ("other", "b")] {
            m.insert(
                ns.to_string(),
                BTreeMap::from([
                    ("kubernetes.io/metadata.name".to_string(), ns.to_string()),
                    ("team".to_string(), team.to_string()),
                ]),
            );
        }
        m
    }

    fn pods() -> Vec<PodInfo> {
        vec![
            pod("default", "web", "10.42.0.5", &[("app", "web")], true),
            pod(
                "default",
                "client",
                "10.42.1.6",
                &[("app", "client")],
                false,
            ),
            pod("other", "spy", "10.42.1.7", &[("app", "client")], false),
        ]
    }

    fn chain(r: &Rendered, name: &str) -> Vec<String> {
        r.rules.chains[name].iter().map(|r| r.to_string()).collect()
    }

    #[test]
    fn a_policy_without_rules_isolates_the_pods_it_selects() {
        let p = policy(json!({"metadata": {"name": "deny", "namespace": "default"},
            "spec": {"podSelector": {}, "policyTypes": ["Ingress"]}}));
        let r = render(&pods(), &namespaces(), &[p], &[]);
        assert_eq!(chain(&r, "pol-in/10.42.0.5"), vec!["drop"]);
        assert_eq!(
            r.rules.elements[&(POLICY_INGRESS, MapKey::Addr("10.42.0.5".parse().unwrap()))],
            Verdict::Jump("pol-in/10.42.0.5".into())
        );
        // Only local pods get chains; egress is not restricted.
        assert_eq!(r.rules.elements.len(), 1);
    }

    #[test]
    fn pods_no_policy_selects_are_left_alone() {
        let p = policy(json!({"metadata": {"name": "p", "namespace": "default"},
            "spec": {"podSelector": {"matchLabels": {"app": "db"}}}}));
        let r = render(&pods(), &namespaces(), &[p], &[]);
        assert!(r.rules.elements.is_empty());
    }

    #[test]
    fn a_pod_selector_allows_pods_of_the_policys_namespace_on_named_and_ranged_ports() {
        let p = policy(
            json!({"metadata": {"name": "allow", "namespace": "default"},
            "spec": {"podSelector": {"matchLabels": {"app": "web"}},
              "ingress": [{"from": [{"podSelector": {"matchLabels": {"app": "client"}}}],
                "ports": [{"port": "http"}, {"port": 9000, "endPort": 9010, "protocol": "UDP"}]}]}}),
        );
        let r = render(&pods(), &namespaces(), &[p], &[]);
        assert_eq!(
            chain(&r, "pol-in/10.42.0.5"),
            vec![
                "ip saddr { 10.42.1.6 } meta l4proto tcp th dport 8080 return",
                "ip saddr { 10.42.1.6 } meta l4proto udp th dport 9000-9010 return",
                "drop",
            ]
        );
    }

    #[test]
    fn a_namespace_selector_allows_every_pod_of_the_matching_namespaces() {
        let p = policy(json!({"metadata": {"name": "ns", "namespace": "default"},
            "spec": {"podSelector": {},
              "ingress": [{"from": [{"namespaceSelector": {"matchLabels": {"team": "b"}}}]}]}}));
        let r = render(&pods(), &namespaces(), &[p], &[]);
        assert_eq!(
            chain(&r, "pol-in/10.42.0.5"),
            vec!["ip saddr { 10.42.1.7 } return", "drop"]
        );
        // Both selectors in one peer: pods matching both.
        let p = policy(json!({"metadata": {"name": "ns", "namespace": "default"},
            "spec": {"podSelector": {},
              "ingress": [{"from": [{"namespaceSelector": {},
                 "podSelector": {"matchLabels": {"app": "client"}}}]}]}}));
        let r = render(&pods(), &namespaces(), &[p], &[]);
        assert_eq!(
            chain(&r, "pol-in/10.42.0.5"),
            vec!["ip saddr { 10.42.1.6, 10.42.1.7 } return", "drop"]
        );
    }

    #[test]
    fn an_ip_block_with_except_and_egress_rules_match_the_destination() {
        let p = policy(json!({"metadata": {"name": "out", "namespace": "default"},
            "spec": {"podSelector": {}, "policyTypes": ["Egress"],
              "egress": [{"to": [{"ipBlock": {"cidr": "192.168.0.0/16", "except": ["192.168.5.0/24"]}}],
                          "ports": [{"port": 443}]}]}}));
        let r = render(
            &pods(),
            &namespaces(),
            &[p],
            &["10.43.0.10".parse().unwrap()],
        );
        assert_eq!(
            chain(&r, "pol-out/10.42.0.5"),
            vec![
                "ip daddr 192.168.0.0/16 ip daddr != { 192.168.5.0/24 } meta l4proto tcp th dport 443 return",
                "drop"
            ]
        );
        // Egress to the node-local cluster DNS is checked in the input hook.
        assert_eq!(
            chain(&r, POLICY_INPUT_RULES),
            vec!["ip daddr { 10.43.0.10 } ip saddr vmap @policy-egress"]
        );
        assert!(!r.rules.chains.contains_key("pol-in/10.42.0.5"));
    }

    #[test]
    fn egress_allowing_dns_by_port_only_lets_dns_through() {
        let p = policy(json!({"metadata": {"name": "dns", "namespace": "default"},
            "spec": {"podSelector": {}, "policyTypes": ["Egress"],
              "egress": [{"ports": [{"port": 53, "protocol": "UDP"}, {"port": 53, "protocol": "TCP"}]}]}}));
        let r = render(&pods(), &namespaces(), &[p], &[]);
        assert_eq!(
            chain(&r, "pol-out/10.42.0.5"),
            vec![
                "meta l4proto udp th dport 53 return",
                "meta l4proto tcp th dport 53 return",
                "drop"
            ]
        );
    }

    #[test]
    fn egress_named_ports_resolve_on_each_destination() {
        let p = policy(
            json!({"metadata": {"name": "named", "namespace": "default"},
            "spec": {"podSelector": {}, "policyTypes": ["Egress"],
              "egress": [{"to": [{"namespaceSelector": {}}], "ports": [{"port": "http"}]}]}}),
        );
        let r = render(&pods(), &namespaces(), &[p], &[]);
        assert_eq!(
            chain(&r, "pol-out/10.42.0.5")[0],
            "ip daddr { 10.42.0.5, 10.42.1.6, 10.42.1.7 } meta l4proto tcp th dport 8080 return"
        );
    }

    #[test]
    fn a_policy_the_dataplane_cannot_express_isolates_but_allows_nothing_and_is_reported() {
        let p = policy(json!({"metadata": {"name": "v6", "namespace": "default"},
            "spec": {"podSelector": {},
              "ingress": [{"from": [{"ipBlock": {"cidr": "fd00::/8"}}]},
                          {"from": [{"podSelector": {}}]}]}}));
        let r = render(&pods(), &namespaces(), &[p], &[]);
        assert_eq!(chain(&r, "pol-in/10.42.0.5"), vec!["drop"]);
        assert_eq!(r.unsupported.len(), 1);
        assert_eq!(
            r.unsupported[0].0,
            ("default".to_string(), "v6".to_string())
        );
        assert!(r.unsupported[0].1.contains("IPv6"), "{:?}", r.unsupported);
    }

    #[test]
    fn policy_types_default_to_ingress_plus_egress_when_there_are_egress_rules() {
        let p = policy(json!({"metadata": {"name": "both", "namespace": "default"},
            "spec": {"podSelector": {}, "egress": [{}]}}));
        let r = render(&pods(), &namespaces(), &[p], &[]);
        assert_eq!(chain(&r, "pol-in/10.42.0.5"), vec!["drop"]);
        assert_eq!(chain(&r, "pol-out/10.42.0.5"), vec!["return", "drop"]);
    }
}
