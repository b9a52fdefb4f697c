//! The nftables objects that implement [`PortPlan`]s, as data: the fixed
//! skeleton of skiff's table (hooks, verdict maps, masquerading), the
//! chains, sets and map elements of each service port, and the diff between
//! two versions of a service as an ordered list of [`Op`]s (applied in one
//! transaction by [`super::nft`]). No I/O.
//!
//! The layout is kube-proxy's nftables mode: a packet's (daddr, protocol,
//! port) is looked up in the `service-ips` verdict map (NodePorts: the
//! `nodeport-ips` set and `service-nodeports`), which jumps to the service
//! port's chain; that chain picks an endpoint at random and DNATs to it.
//! The pick ([`Shape::Maps`], what the netlink writer programs) is ONE rule,
//! `meta l4proto P dnat ip to numgen random mod K map @dnat-…/K`, over a
//! named data map per service port whose element `i` is the i-th endpoint's
//! `address . port`: ~5 expressions per service port where a rule per
//! endpoint took 7 each (the kernel looks every expression's type up by
//! name, which was most of a 10,000-service load). A new endpoint set of
//! the same size only flushes and refills the map (data elements: the
//! kernel does not re-validate the chain graph for them); a new size is a
//! new map and a new rule. The `nft` binary cannot declare such a map
//! (nft 1.0's JSON has no `typeof` nor concatenated data), so its writer
//! gets [`Shape::Rules`]: a run of `numgen random mod k == 0` rules (k = n,
//! n-1, …, 1, uniform like kube-proxy's iptables mode). Neither is an
//! anonymous verdict map: the kernel creates each anonymous set with a
//! scan of the table's sets, which made a 10,000-service table take
//! minutes. With ClientIP affinity the pick goes to per-endpoint chains
//! that record the client in the endpoint's affinity set. ClusterIP
//! traffic from outside the cluster CIDR is marked for masquerading by one
//! rule per shard on the `cluster-ips` map (one element per ClusterIP with
//! endpoints) rather than a rule per service port. Hairpin traffic (an
//! endpoint reaching itself through its service) is masqueraded by one rule
//! on the `hairpin` set of `endpoint . endpoint` pairs.
//! Services without endpoints are in `no-endpoint-services` /
//! `no-endpoint-nodeports`, consulted by filter hooks before NAT, which
//! reject new connections at once. So a change to one service touches only
//! that service's chains, maps and map elements.
//!
//! The services are spread over [`SHARDS`] (64) tables of their own
//! ([`Home`]), each with its NAT hooks, its `service-ips`/
//! `service-nodeports`/`cluster-ips` maps and its services' chains and
//! endpoint maps; the main table keeps everything shared (the filter hooks
//! and their no-endpoint maps, masquerading, hairpin, NetworkPolicy). The
//! kernel's commit work grows with the size of the tables a transaction
//! touches (it re-validates a changed table's whole graph of jumps from its
//! hooks), so a change to one service costs a 64th of the services, not
//! all of them; and it finds a set by name with a walk of its table's
//! sets, which made a full load with one endpoint map per service grow
//! with the square of the services per table (64 tables: ~0.1 s less than
//! 16 at 10,000 services). A NAT hook whose chains find no service
//! returns, and the next table's hook looks; only the first packet of a
//! connection passes the NAT hooks.

use std::collections::BTreeMap;
use std::fmt;
use std::net::Ipv4Addr;

use super::model::{Endpoint, PortPlan, Protocol};
use super::policy::model::{POLICY_EGRESS, POLICY_INGRESS, POLICY_INPUT_RULES};

/// The mark bit that asks the postrouting chain to masquerade.
pub const MASQ_MARK: u32 = 0x4000;

pub const SERVICE_IPS: &str = "service-ips";
pub const SERVICE_NODEPORTS: &str = "service-nodeports";
pub const NO_ENDPOINT_SERVICES: &str = "no-endpoint-services";
pub const NO_ENDPOINT_NODEPORTS: &str = "no-endpoint-nodeports";
pub const NODEPORT_IPS: &str = "nodeport-ips";
/// Each shard's verdict map of the ClusterIP keys it serves (`ip . proto .
/// port : jump mark-for-masquerade`), consulted only for clients outside
/// the cluster CIDR: one rule per shard instead of one per service port.
pub const CLUSTER_IPS: &str = "cluster-ips";
pub const MARK_FOR_MASQ: &str = "mark-for-masquerade";
pub const REJECT_CHAIN: &str = "reject-chain";
/// Set of `ip . ip` pairs, one per endpoint: `ip saddr . ip daddr` in it
/// after DNAT is a pod that reached itself.
pub const HAIRPIN: &str = "hairpin";

/// One rule, in the few shapes the proxy writes. `Display` gives nft's own
/// syntax (logs, tests); [`super::nft`] turns it into nft's JSON.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Rule {
    /// `jump CHAIN`
    Jump(String),
    /// `goto CHAIN`
    Goto(String),
    /// `drop`
    Drop,
    /// `ct state new jump CHAIN`
    JumpIfNew(String),
    /// `ip daddr . meta l4proto . th dport vmap @MAP`
    DaddrProtoPortVmap(String),
    /// `ip daddr @nodeport-ips meta l4proto . th dport vmap @MAP`
    NodePortVmap(String),
    /// `meta mark & 0x4000 == 0 return`
    ReturnIfUnmarked,
    /// `meta mark set meta mark ^ 0x4000`
    ClearMark,
    /// `meta mark set meta mark | 0x4000`
    SetMark,
    /// `masquerade fully-random`
    Masquerade,
    /// `meta l4proto tcp reject with tcp reset`
    RejectTcpReset,
    /// `reject` (ICMP port unreachable)
    Reject,
    /// `ip saddr != CIDR ip daddr . meta l4proto . th dport vmap @MAP`:
    /// off-cluster clients of a ClusterIP (the map's elements jump to
    /// `mark-for-masquerade`).
    MarkOffCluster((Ipv4Addr, u8), String),
    /// `ct status dnat ip saddr . ip daddr @hairpin masquerade fully-random`:
    /// an endpoint that reached itself through its service. Only connections
    /// a service rule DNATed: a host-network endpoint's pair (the node's own
    /// address twice, e.g. the API server behind `kubernetes`) also matches
    /// the node's direct connections to itself, and a connection established
    /// before conntrack ran in this network namespace (the agent's own to the
    /// API server, when this table is the first to need conntrack) has its
    /// first tracked packet NATed mid-stream: its source port changes, the
    /// peer resets it or, when the peer's packet came first, drops it
    /// silently and a watch on it stalls until its read timeout.
    HairpinMasquerade,
    /// `fib saddr type local jump mark-for-masquerade`
    MasqueradeIfFromNode,
    /// `fib saddr type local goto CHAIN`
    GotoIfFromNode(String),
    /// `ip saddr CIDR goto CHAIN`
    GotoIfFrom((Ipv4Addr, u8), String),
    /// `ip saddr @SET goto CHAIN`: session affinity.
    GotoIfInSet(String, String),
    /// `update @SET { ip saddr }`
    AddSourceToSet(String),
    /// `numgen random mod K == 0 goto CHAIN` (K > 1), else `goto CHAIN`.
    PickGoto(u32, String),
    /// `numgen random mod K == 0 meta l4proto P dnat to IP:PORT` (K > 1),
    /// else without the `numgen` match.
    PickDnat(u32, Protocol, Ipv4Addr, u16),
    /// `meta l4proto P dnat ip to numgen random mod K map @MAP`: one rule
    /// picking among the K endpoints of the data map MAP
    /// ([`PortRules::dnat_maps`]).
    DnatViaMap(u32, Protocol, String),
    /// `ct state established,related accept`: replies and the rest of
    /// connections NetworkPolicy already let through.
    AcceptEstablished,
    /// `ip saddr vmap @MAP` (the source pod's egress chain).
    SaddrVmap(String),
    /// `ip daddr vmap @MAP` (the destination pod's ingress chain).
    DaddrVmap(String),
    /// `ip daddr { IPs } ip saddr vmap @policy-egress`: egress checks for
    /// node-local destinations (the cluster DNS) in the input hook.
    EgressCheckTo(Vec<Ipv4Addr>),
    /// A NetworkPolicy allow rule (see [`super::policy::model`]).
    Allow(super::policy::model::Allow),
}

fn q(name: &str) -> String {
    format!("\"{name}\"")
}

fn cidr((ip, bits): (Ipv4Addr, u8)) -> String {
    format!("{ip}/{bits}")
}

impl fmt::Display for Rule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Rule::Jump(c) => write!(f, "jump {}", q(c)),
            Rule::Goto(c) => write!(f, "goto {}", q(c)),
            Rule::Drop => write!(f, "drop"),
            Rule::JumpIfNew(c) => write!(f, "ct state new jump {}", q(c)),
            Rule::DaddrProtoPortVmap(m) => {
                write!(f, "ip daddr . meta l4proto . th dport vmap @{m}")
            }
            Rule::NodePortVmap(m) => write!(
                f,
                "ip daddr @{NODEPORT_IPS} meta l4proto . th dport vmap @{m}"
            ),
            Rule::ReturnIfUnmarked => write!(f, "meta mark & {MASQ_MARK:#x} == 0 return"),
            Rule::ClearMark => write!(f, "meta mark set meta mark ^ {MASQ_MARK:#x}"),
            Rule::SetMark => write!(f, "meta mark set meta mark | {MASQ_MARK:#x}"),
            Rule::Masquerade => write!(f, "masquerade fully-random"),
            Rule::RejectTcpReset => write!(f, "meta l4proto tcp reject with tcp reset"),
            Rule::Reject => write!(f, "reject"),
            Rule::MarkOffCluster(c, m) => write!(
                f,
                "ip saddr != {} ip daddr . meta l4proto . th dport vmap @{m}",
                cidr(*c)
            ),
            Rule::HairpinMasquerade => {
                write!(
                    f,
                    "ct status dnat ip saddr . ip daddr @{HAIRPIN} masquerade fully-random"
                )
            }
            Rule::MasqueradeIfFromNode => {
                write!(f, "fib saddr type local jump {}", q(MARK_FOR_MASQ))
            }
            Rule::GotoIfFromNode(c) => write!(f, "fib saddr type local goto {}", q(c)),
            Rule::GotoIfFrom(c, chain) => write!(f, "ip saddr {} goto {}", cidr(*c), q(chain)),
            Rule::GotoIfInSet(s, c) => write!(f, "ip saddr @{} goto {}", q(s), q(c)),
            Rule::AddSourceToSet(s) => write!(f, "update @{} {{ ip saddr }}", q(s)),
            Rule::PickGoto(k, c) if *k > 1 => {
                write!(f, "numgen random mod {k} == 0 goto {}", q(c))
            }
            Rule::PickGoto(_, c) => write!(f, "goto {}", q(c)),
            Rule::PickDnat(k, p, ip, port) => {
                if *k > 1 {
                    write!(f, "numgen random mod {k} == 0 ")?;
                }
                write!(f, "meta l4proto {} dnat to {ip}:{port}", p.nft())
            }
            Rule::DnatViaMap(k, p, m) => write!(
                f,
                "meta l4proto {} dnat ip to numgen random mod {k} map @{}",
                p.nft(),
                q(m)
            ),
            Rule::AcceptEstablished => write!(f, "ct state established,related accept"),
            Rule::SaddrVmap(m) => write!(f, "ip saddr vmap @{m}"),
            Rule::DaddrVmap(m) => write!(f, "ip daddr vmap @{m}"),
            Rule::EgressCheckTo(ips) => {
                let list: Vec<String> = ips.iter().map(|i| i.to_string()).collect();
                write!(
                    f,
                    "ip daddr {{ {} }} ip saddr vmap @{}",
                    list.join(", "),
                    super::policy::model::POLICY_EGRESS
                )
            }
            Rule::Allow(a) => write!(f, "{a}"),
        }
    }
}

/// Keys of the four verdict maps.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum MapKey {
    /// `ip . protocol . port` (service-ips, no-endpoint-services)
    Ip(Ipv4Addr, Protocol, u16),
    /// `protocol . port` (service-nodeports, no-endpoint-nodeports)
    NodePort(Protocol, u16),
    /// `ip` (policy-ingress, policy-egress)
    Addr(Ipv4Addr),
}

/// A map element's verdict.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Verdict {
    Goto(String),
    Jump(String),
    Drop,
}

impl fmt::Display for Verdict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Verdict::Goto(c) => write!(f, "goto {}", q(c)),
            Verdict::Jump(c) => write!(f, "jump {}", q(c)),
            Verdict::Drop => write!(f, "drop"),
        }
    }
}

/// (map name, key) → verdict.
pub type Elements = BTreeMap<(&'static str, MapKey), Verdict>;

/// How many tables the services are spread over.
pub const SHARDS: u8 = 64;

/// The table an object lives in: the main one, or a service shard.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Home {
    Main,
    Shard(u8),
}

/// The shard of a service (by namespace and name; stable across restarts
/// and agents, so a service's objects never move between tables).
pub fn shard_of(namespace: &str, name: &str) -> Home {
    // FNV-1a: tiny, stable, and spreads short similar names well.
    let mut h: u32 = 0x811c_9dc5;
    for b in namespace.bytes().chain([b'/']).chain(name.bytes()) {
        h ^= u32::from(b);
        h = h.wrapping_mul(0x0100_0193);
    }
    Home::Shard((h % u32::from(SHARDS)) as u8)
}

/// A base chain's hook.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Hook {
    pub nat: bool,
    pub hook: &'static str,
    pub priority: i32,
}

/// How a chain spreading over several endpoints picks one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shape {
    /// One rule looking a random index up in a data map of the endpoints
    /// ([`Rule::DnatViaMap`]): about 5 expressions per service port and
    /// one map element per endpoint. What the netlink writer programs.
    Maps,
    /// One `numgen … dnat` rule per endpoint ([`Rule::PickDnat`], 7
    /// expressions each). For the `nft` binary: nft 1.0's JSON cannot
    /// declare a map keyed by numgen's integer type (nor one with
    /// concatenated data), and its text syntax cannot name skiff's chains.
    Rules,
}

/// A data map picking an endpoint: `typeof numgen random mod K : ip daddr
/// . P dport`, element `i` the i-th endpoint (K = the number of endpoints,
/// part of the map's name, so a change of K is a new map and a new rule).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DnatMap {
    pub protocol: Protocol,
    pub endpoints: Vec<Endpoint>,
}

/// Everything one service port owns in the table.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PortRules {
    pub chains: BTreeMap<String, Vec<Rule>>,
    /// Affinity sets: name → timeout in seconds.
    pub sets: BTreeMap<String, u32>,
    /// Endpoint maps of [`Shape::Maps`], by name.
    pub dnat_maps: BTreeMap<String, DnatMap>,
    pub elements: Elements,
    /// Endpoints traffic may be sent to (their `hairpin` pairs are shared
    /// between services, so the caller counts them).
    pub endpoints: std::collections::BTreeSet<Ipv4Addr>,
}

impl PortRules {
    /// Merges another port's objects (a service's ports into one unit).
    pub fn extend(&mut self, other: PortRules) {
        self.chains.extend(other.chains);
        self.sets.extend(other.sets);
        self.dnat_maps.extend(other.dnat_maps);
        self.elements.extend(other.elements);
        self.endpoints.extend(other.endpoints);
    }
}

fn hook(nat: bool, hook: &'static str, priority: i32) -> Option<Hook> {
    Some(Hook {
        nat,
        hook,
        priority,
    })
}

/// The fixed part of each service shard: the DNAT hooks (dstnat, -100, in
/// prerouting and output) looking the packet up in the shard's maps, and
/// the chain service chains jump to for masquerading. With a cluster CIDR,
/// ClusterIP traffic from outside it is marked for masquerading first.
pub fn shard_skeleton(
    cluster_cidr: Option<(Ipv4Addr, u8)>,
) -> Vec<(&'static str, Option<Hook>, Vec<Rule>)> {
    let mut services = vec![];
    if let Some(c) = cluster_cidr {
        services.push(Rule::MarkOffCluster(c, CLUSTER_IPS.into()));
    }
    services.push(Rule::DaddrProtoPortVmap(SERVICE_IPS.into()));
    services.push(Rule::NodePortVmap(SERVICE_NODEPORTS.into()));
    vec![
        (
            "nat-prerouting",
            hook(true, "prerouting", -100),
            vec![Rule::Jump("services".into())],
        ),
        (
            "nat-output",
            hook(true, "output", -100),
            vec![Rule::Jump("services".into())],
        ),
        ("services", None, services),
        (MARK_FOR_MASQ, None, vec![Rule::SetMark]),
    ]
}

/// The fixed part of skiff's main table: base chains with their hooks and
/// helper chains.
pub fn skeleton() -> Vec<(&'static str, Option<Hook>, Vec<Rule>)> {
    vec![
        // srcnat (100).
        (
            "nat-postrouting",
            hook(true, "postrouting", 100),
            vec![Rule::HairpinMasquerade, Rule::Jump("masquerading".into())],
        ),
        // Filter before NAT (-110): reject new connections to services
        // without endpoints (their daddr is still the service's).
        (
            "filter-input",
            hook(false, "input", -110),
            vec![Rule::JumpIfNew("endpoints-check".into())],
        ),
        (
            "filter-forward",
            hook(false, "forward", -110),
            vec![Rule::JumpIfNew("endpoints-check".into())],
        ),
        (
            "filter-output",
            hook(false, "output", -110),
            vec![Rule::JumpIfNew("endpoints-check".into())],
        ),
        (
            "endpoints-check",
            None,
            vec![
                Rule::DaddrProtoPortVmap(NO_ENDPOINT_SERVICES.into()),
                Rule::NodePortVmap(NO_ENDPOINT_NODEPORTS.into()),
            ],
        ),
        (
            "masquerading",
            None,
            vec![Rule::ReturnIfUnmarked, Rule::ClearMark, Rule::Masquerade],
        ),
        (MARK_FOR_MASQ, None, vec![Rule::SetMark]),
        (REJECT_CHAIN, None, vec![Rule::RejectTcpReset, Rule::Reject]),
        // NetworkPolicy, after DNAT (a Service's traffic is checked against
        // the endpoint it reached): established flows pass, then the source
        // pod's egress chain, then the destination pod's ingress chain.
        // Bridged pod-to-pod traffic on one node comes here too
        // (bridge-nf-call-iptables).
        (
            "policy-forward",
            hook(false, "forward", 0),
            vec![
                Rule::AcceptEstablished,
                Rule::SaddrVmap(POLICY_EGRESS.into()),
                Rule::DaddrVmap(POLICY_INGRESS.into()),
            ],
        ),
        (
            "policy-input",
            hook(false, "input", 0),
            vec![
                Rule::AcceptEstablished,
                Rule::Jump(POLICY_INPUT_RULES.into()),
            ],
        ),
        (POLICY_INPUT_RULES, None, vec![]),
    ]
}

/// The `hairpin` set's size at a full load with `endpoints` endpoints:
/// room for as many new ones again (at least 1,024). A set with a size gets
/// a fixed hash table from the kernel instead of a growing one (100,000
/// pairs load in ~0.1 s instead of ~0.2 s); the proxy makes a full resync
/// instead of an incremental change that would not fit.
pub fn hairpin_capacity(endpoints: usize) -> u32 {
    endpoints
        .saturating_mul(2)
        .max(1024)
        .next_power_of_two()
        .min(1 << 24) as u32
}

/// The main table's verdict maps of services: (name, keyed by IP too).
pub const MAPS: [(&str, bool); 2] = [(NO_ENDPOINT_SERVICES, true), (NO_ENDPOINT_NODEPORTS, false)];

/// Each shard's verdict maps.
pub const SHARD_MAPS: [(&str, bool); 3] = [
    (SERVICE_IPS, true),
    (SERVICE_NODEPORTS, false),
    (CLUSTER_IPS, true),
];

fn endpoint_chain(base: &str, ep: &Endpoint) -> String {
    format!("ep-{base}/{}:{}", ep.ip, ep.port)
}

fn affinity_set(base: &str, ep: &Endpoint) -> String {
    format!("aff-{base}/{}:{}", ep.ip, ep.port)
}

fn dnat_map(chain: &str, k: usize) -> String {
    format!("dnat-{chain}/{k}")
}

/// The objects implementing one service port, in [`Shape::Maps`].
pub fn port_rules(p: &PortPlan, cluster_cidr: Option<(Ipv4Addr, u8)>) -> PortRules {
    port_rules_shaped(p, cluster_cidr, Shape::Maps)
}

/// The objects implementing one service port, spreading as `shape` says.
pub fn port_rules_shaped(
    p: &PortPlan,
    cluster_cidr: Option<(Ipv4Addr, u8)>,
    shape: Shape,
) -> PortRules {
    let base = p.key.to_string();
    let mut out = PortRules::default();
    let svc_chain = format!("svc-{base}");
    let local_chain = format!("local-{base}");
    let ext_chain = format!("ext-{base}");
    let proto = p.key.protocol;

    // A chain spreading over `eps` (with affinity first), and the endpoint
    // chains it needs.
    let spread_chain = |name: &str, eps: &[Endpoint], out: &mut PortRules| {
        let mut rules = vec![];
        if eps.is_empty() {
            rules.push(Rule::Drop);
        } else if p.affinity.is_some() {
            for ep in eps {
                rules.push(Rule::GotoIfInSet(
                    affinity_set(&base, ep),
                    endpoint_chain(&base, ep),
                ));
            }
            let n = eps.len() as u32;
            for (i, ep) in eps.iter().enumerate() {
                rules.push(Rule::PickGoto(n - i as u32, endpoint_chain(&base, ep)));
            }
        } else if shape == Shape::Maps && eps.len() > 1 {
            let map = dnat_map(name, eps.len());
            rules.push(Rule::DnatViaMap(eps.len() as u32, proto, map.clone()));
            out.dnat_maps.insert(
                map,
                DnatMap {
                    protocol: proto,
                    endpoints: eps.to_vec(),
                },
            );
        } else {
            let n = eps.len() as u32;
            for (i, ep) in eps.iter().enumerate() {
                rules.push(Rule::PickDnat(n - i as u32, proto, ep.ip, ep.port));
            }
        }
        out.chains.insert(name.to_string(), rules);
        out.endpoints.extend(eps.iter().map(|e| e.ip));
        if let Some(timeout) = p.affinity {
            for ep in eps {
                let set = affinity_set(&base, ep);
                out.sets.insert(set.clone(), timeout);
                out.chains.insert(
                    endpoint_chain(&base, ep),
                    vec![
                        Rule::AddSourceToSet(set),
                        Rule::PickDnat(1, proto, ep.ip, ep.port),
                    ],
                );
            }
        }
    };

    let internal_chain = if p.internal_local {
        &local_chain
    } else {
        &svc_chain
    };
    let external_chain = if p.external_local {
        &local_chain
    } else {
        &svc_chain
    };
    let internal = p.internal_endpoints();
    // The external chain sends pods and the node itself cluster-wide even
    // under externalTrafficPolicy Local, so any external address needs it.
    let needs_svc = (!p.internal_local && !internal.is_empty()) || p.has_external();
    let needs_local =
        (p.internal_local && !internal.is_empty()) || (p.has_external() && p.external_local);
    if p.has_endpoints {
        if needs_svc {
            spread_chain(&svc_chain, &p.cluster_endpoints, &mut out);
        }
        if needs_local {
            spread_chain(&local_chain, &p.local_endpoints, &mut out);
        }
    }

    // ClusterIP.
    let vip = MapKey::Ip(p.cluster_ip, proto, p.port);
    if !p.has_endpoints {
        out.elements.insert(
            (NO_ENDPOINT_SERVICES, vip),
            Verdict::Goto(REJECT_CHAIN.into()),
        );
    } else if internal.is_empty() {
        // internalTrafficPolicy Local without a local endpoint: dropped.
        out.elements
            .insert((NO_ENDPOINT_SERVICES, vip), Verdict::Drop);
    } else {
        if cluster_cidr.is_some() {
            // Clients outside the cluster are masqueraded (replies must come
            // back through this node); the shard's rule looks them up here.
            out.elements.insert(
                (CLUSTER_IPS, vip.clone()),
                Verdict::Jump(MARK_FOR_MASQ.into()),
            );
        }
        out.elements
            .insert((SERVICE_IPS, vip), Verdict::Goto(internal_chain.clone()));
    }

    // NodePort, externalIPs, LoadBalancer IPs.
    if p.has_external() {
        let mut keys: Vec<(&'static str, &'static str, MapKey)> = vec![];
        if let Some(np) = p.node_port {
            keys.push((
                SERVICE_NODEPORTS,
                NO_ENDPOINT_NODEPORTS,
                MapKey::NodePort(proto, np),
            ));
        }
        for ip in &p.external_ips {
            keys.push((
                SERVICE_IPS,
                NO_ENDPOINT_SERVICES,
                MapKey::Ip(*ip, proto, p.port),
            ));
        }
        if !p.has_endpoints {
            for (_, none, k) in keys {
                out.elements
                    .insert((none, k), Verdict::Goto(REJECT_CHAIN.into()));
            }
        } else {
            let mut rules = vec![];
            if p.external_local {
                // Source IP preserved: no masquerade, local endpoints only,
                // except for pods and the node itself, which get the
                // cluster-wide behaviour (as kube-proxy does).
                if let Some(c) = cluster_cidr {
                    rules.push(Rule::GotoIfFrom(c, svc_chain.clone()));
                }
                rules.push(Rule::MasqueradeIfFromNode);
                rules.push(Rule::GotoIfFromNode(svc_chain.clone()));
            } else {
                rules.push(Rule::Jump(MARK_FOR_MASQ.into()));
            }
            rules.push(Rule::Goto(external_chain.clone()));
            out.chains.insert(ext_chain.clone(), rules);
            for (map, _, k) in keys {
                out.elements
                    .insert((map, k), Verdict::Goto(ext_chain.clone()));
            }
        }
    }
    out
}

/// One step of a transaction.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Op {
    DeleteElement(&'static str, MapKey),
    AddSet(String, u32),
    AddChain(String),
    FlushChain(String),
    AddRule(String, Rule),
    AddElement(&'static str, MapKey, Verdict),
    DeleteChain(String),
    DeleteSet(String),
    /// `add element hairpin { IP . IP }`
    AddHairpin(Ipv4Addr),
    /// `delete element hairpin { IP . IP }`
    DeleteHairpin(Ipv4Addr),
    /// `add map NAME { typeof numgen random mod K : ip daddr . P dport; }`
    AddDnatMap(String, Protocol, u32),
    /// `flush set NAME` (a data map about to be refilled).
    FlushDnatMap(String),
    /// `add element NAME { 0 : IP . PORT, 1 : … }`
    FillDnatMap(String, Vec<Endpoint>),
}

/// The ops turning `old` into `new` (one service's objects), ordered so
/// that nothing is deleted while referenced and nothing referenced before
/// it exists: stale map elements go first, new chains and sets are
/// created, changed and doomed chains are flushed and refilled, map
/// elements added, and doomed chains and sets deleted last.
pub fn diff(old: &PortRules, new: &PortRules) -> Vec<Op> {
    let mut ops = vec![];
    for (k, v) in &old.elements {
        if new.elements.get(k) != Some(v) {
            ops.push(Op::DeleteElement(k.0, k.1.clone()));
        }
    }
    for (s, t) in &new.sets {
        match old.sets.get(s) {
            Some(old_t) if old_t == t => {}
            Some(_) => {
                // A new timeout: the set is re-created under the same name
                // after its users are flushed; handled as delete + add below
                // would leave a window, so keep the name and accept the old
                // timeout until the next full resync.
            }
            None => ops.push(Op::AddSet(s.clone(), *t)),
        }
    }
    for (m, d) in &new.dnat_maps {
        match old.dnat_maps.get(m) {
            Some(o) if o == d => {}
            Some(_) => {
                ops.push(Op::FlushDnatMap(m.clone()));
                ops.push(Op::FillDnatMap(m.clone(), d.endpoints.clone()));
            }
            None => {
                ops.push(Op::AddDnatMap(
                    m.clone(),
                    d.protocol,
                    d.endpoints.len() as u32,
                ));
                ops.push(Op::FillDnatMap(m.clone(), d.endpoints.clone()));
            }
        }
    }
    for c in new.chains.keys() {
        if !old.chains.contains_key(c) {
            ops.push(Op::AddChain(c.clone()));
        }
    }
    for (c, rules) in &old.chains {
        match new.chains.get(c) {
            Some(r) if r == rules => {}
            _ => ops.push(Op::FlushChain(c.clone())),
        }
    }
    for (c, rules) in &new.chains {
        if old.chains.get(c) != Some(rules) {
            for r in rules {
                ops.push(Op::AddRule(c.clone(), r.clone()));
            }
        }
    }
    for (k, v) in &new.elements {
        if old.elements.get(k) != Some(v) {
            ops.push(Op::AddElement(k.0, k.1.clone(), v.clone()));
        }
    }
    for c in old.chains.keys() {
        if !new.chains.contains_key(c) {
            ops.push(Op::DeleteChain(c.clone()));
        }
    }
    for s in old.sets.keys() {
        if !new.sets.contains_key(s) {
            ops.push(Op::DeleteSet(s.clone()));
        }
    }
    for m in old.dnat_maps.keys() {
        if !new.dnat_maps.contains_key(m) {
            ops.push(Op::DeleteSet(m.clone()));
        }
    }
    ops
}

impl Op {
    /// The table this op of a service (whose objects live in `owner`)
    /// changes: the service's chains, sets and DNAT map elements are in its
    /// shard; its no-endpoint elements, the hairpin pairs and
    /// NetworkPolicy's maps are in the main table.
    pub fn home(&self, owner: Home) -> Home {
        match self {
            Op::AddHairpin(_) | Op::DeleteHairpin(_) => Home::Main,
            Op::AddElement(map, ..) | Op::DeleteElement(map, ..)
                if !SHARD_MAPS.iter().any(|(m, _)| m == map) =>
            {
                Home::Main
            }
            _ => owner,
        }
    }

    /// The step of a transaction this op belongs to: ops of several
    /// services are ordered by it (stably), so a map key or name one
    /// service frees can be taken by another in the same transaction.
    pub fn phase(&self) -> u8 {
        match self {
            Op::DeleteElement(..) => 0,
            Op::AddSet(..) | Op::AddDnatMap(..) => 1,
            Op::AddChain(_) => 2,
            Op::FlushChain(_) | Op::FlushDnatMap(_) => 3,
            Op::AddRule(..) => 4,
            Op::AddElement(..) | Op::AddHairpin(_) | Op::FillDnatMap(..) => 5,
            Op::DeleteChain(_) | Op::DeleteHairpin(_) => 6,
            Op::DeleteSet(_) => 7,
        }
    }
}

impl fmt::Display for MapKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            MapKey::Ip(ip, p, port) => write!(f, "{ip} . {} . {port}", p.nft()),
            MapKey::NodePort(p, port) => write!(f, "{} . {port}", p.nft()),
            MapKey::Addr(ip) => write!(f, "{ip}"),
        }
    }
}

impl fmt::Display for Op {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Op::DeleteElement(m, k) => write!(f, "delete element {m} {{ {k} }}"),
            Op::AddSet(s, t) => write!(
                f,
                "add set {} {{ type ipv4_addr; flags dynamic,timeout; timeout {t}s; }}",
                q(s)
            ),
            Op::AddChain(c) => write!(f, "add chain {}", q(c)),
            Op::FlushChain(c) => write!(f, "flush chain {}", q(c)),
            Op::AddRule(c, r) => write!(f, "add rule {} {r}", q(c)),
            Op::AddElement(m, k, v) => write!(f, "add element {m} {{ {k} : {v} }}"),
            Op::DeleteChain(c) => write!(f, "delete chain {}", q(c)),
            Op::DeleteSet(s) => write!(f, "delete set {}", q(s)),
            Op::AddHairpin(ip) => write!(f, "add element {HAIRPIN} {{ {ip} . {ip} }}"),
            Op::DeleteHairpin(ip) => write!(f, "delete element {HAIRPIN} {{ {ip} . {ip} }}"),
            Op::AddDnatMap(m, p, k) => write!(
                f,
                "add map {} {{ typeof numgen random mod {k} : ip daddr . {} dport; }}",
                q(m),
                p.nft()
            ),
            Op::FlushDnatMap(m) => write!(f, "flush set {}", q(m)),
            Op::FillDnatMap(m, eps) => {
                let list: Vec<String> = eps
                    .iter()
                    .enumerate()
                    .map(|(i, e)| format!("{i} : {} . {}", e.ip, e.port))
                    .collect();
                write!(f, "add element {} {{ {} }}", q(m), list.join(", "))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proxy::model::PortKey;

    fn ep(ip: &str, port: u16) -> Endpoint {
        Endpoint {
            ip: ip.parse().unwrap(),
            port,
        }
    }

    fn plan(eps: &[Endpoint]) -> PortPlan {
        PortPlan {
            key: PortKey {
                namespace: "default".into(),
                name: "web".into(),
                protocol: Protocol::Tcp,
                port_name: "http".into(),
            },
            cluster_ip: "10.43.0.20".parse().unwrap(),
            port: 80,
            node_port: None,
            external_ips: vec![],
            cluster_endpoints: eps.to_vec(),
            local_endpoints: vec![],
            has_endpoints: !eps.is_empty(),
            internal_local: false,
            external_local: false,
            affinity: None,
            health_check_node_port: None,
        }
    }

    fn cidr() -> Option<(Ipv4Addr, u8)> {
        Some(("10.42.0.0".parse().unwrap(), 16))
    }

    fn text(r: &PortRules) -> Vec<String> {
        let mut out = vec![];
        for (c, rules) in &r.chains {
            for rule in rules {
                out.push(format!("{c}: {rule}"));
            }
        }
        for ((m, k), v) in &r.elements {
            out.push(format!("{m}: {k} : {v}"));
        }
        for (s, t) in &r.sets {
            out.push(format!("set {s} timeout {t}"));
        }
        for (m, d) in &r.dnat_maps {
            let eps: Vec<String> = d
                .endpoints
                .iter()
                .enumerate()
                .map(|(i, e)| format!("{i} : {} . {}", e.ip, e.port))
                .collect();
            out.push(format!("map {m}: {}", eps.join(", ")));
        }
        out
    }

    #[test]
    fn a_cluster_ip_picks_an_endpoint_uniformly_from_one_map_and_dnats_to_it() {
        let r = port_rules(
            &plan(&[ep("10.42.0.5", 8080), ep("10.42.0.6", 8081)]),
            cidr(),
        );
        assert_eq!(
            text(&r),
            vec![
                r#"svc-default/web/tcp/http: meta l4proto tcp dnat ip to numgen random mod 2 map @"dnat-svc-default/web/tcp/http/2""#,
                r#"cluster-ips: 10.43.0.20 . tcp . 80 : jump "mark-for-masquerade""#,
                r#"service-ips: 10.43.0.20 . tcp . 80 : goto "svc-default/web/tcp/http""#,
                "map dnat-svc-default/web/tcp/http/2: 0 : 10.42.0.5 . 8080, 1 : 10.42.0.6 . 8081",
            ]
        );
        // Both endpoints get a hairpin pair (counted by the caller).
        assert_eq!(r.endpoints.len(), 2);
        // A single endpoint needs no pick.
        let r = port_rules(&plan(&[ep("10.42.0.5", 8080)]), cidr());
        assert!(r.dnat_maps.is_empty());
        assert_eq!(
            r.chains["svc-default/web/tcp/http"],
            vec![Rule::PickDnat(
                1,
                Protocol::Tcp,
                "10.42.0.5".parse().unwrap(),
                8080
            )]
        );
    }

    #[test]
    fn the_rules_shape_picks_with_one_numgen_rule_per_endpoint() {
        let r = port_rules_shaped(
            &plan(&[ep("10.42.0.5", 8080), ep("10.42.0.6", 8080)]),
            cidr(),
            Shape::Rules,
        );
        assert_eq!(
            text(&r),
            vec![
                r#"svc-default/web/tcp/http: numgen random mod 2 == 0 meta l4proto tcp dnat to 10.42.0.5:8080"#,
                r#"svc-default/web/tcp/http: meta l4proto tcp dnat to 10.42.0.6:8080"#,
                r#"cluster-ips: 10.43.0.20 . tcp . 80 : jump "mark-for-masquerade""#,
                r#"service-ips: 10.43.0.20 . tcp . 80 : goto "svc-default/web/tcp/http""#,
            ]
        );
    }

    #[test]
    fn off_cluster_clients_are_marked_by_one_rule_per_shard() {
        let services = &shard_skeleton(cidr())
            .into_iter()
            .find(|(c, _, _)| *c == "services")
            .unwrap()
            .2;
        assert_eq!(
            services[0].to_string(),
            "ip saddr != 10.42.0.0/16 ip daddr . meta l4proto . th dport vmap @cluster-ips"
        );
        assert_eq!(services.len(), 3);
        // Without a cluster CIDR nothing is marked.
        let services = &shard_skeleton(None)
            .into_iter()
            .find(|(c, _, _)| *c == "services")
            .unwrap()
            .2;
        assert_eq!(services.len(), 2);
        // Only ClusterIPs that reach endpoints are in the map: not a
        // service without endpoints, nor externalIPs and NodePorts (their
        // own chains mark what needs it).
        let mut p = plan(&[]);
        p.node_port = Some(30080);
        assert!(!text(&port_rules(&p, cidr()))
            .iter()
            .any(|l| l.starts_with("cluster-ips")));
        let mut p = plan(&[ep("10.42.0.5", 8080)]);
        p.node_port = Some(30080);
        p.external_ips = vec!["192.168.5.10".parse().unwrap()];
        let cluster: Vec<String> = text(&port_rules(&p, cidr()))
            .into_iter()
            .filter(|l| l.starts_with("cluster-ips"))
            .collect();
        assert_eq!(
            cluster,
            vec![r#"cluster-ips: 10.43.0.20 . tcp . 80 : jump "mark-for-masquerade""#]
        );
    }

    #[test]
    fn a_service_without_endpoints_only_rejects() {
        let mut p = plan(&[]);
        p.node_port = Some(30080);
        let r = port_rules(&p, cidr());
        assert_eq!(
            text(&r),
            vec![
                r#"no-endpoint-nodeports: tcp . 30080 : goto "reject-chain""#,
                r#"no-endpoint-services: 10.43.0.20 . tcp . 80 : goto "reject-chain""#,
            ]
        );
    }

    #[test]
    fn node_ports_and_external_ips_masquerade_then_use_the_service_chain() {
        let mut p = plan(&[ep("10.42.0.5", 8080)]);
        p.node_port = Some(30080);
        p.external_ips = vec!["192.168.5.10".parse().unwrap()];
        let r = port_rules(&p, cidr());
        let t = text(&r);
        assert!(t.contains(&r#"ext-default/web/tcp/http: jump "mark-for-masquerade""#.to_string()));
        assert!(
            t.contains(&r#"ext-default/web/tcp/http: goto "svc-default/web/tcp/http""#.to_string())
        );
        assert!(t.contains(
            &r#"service-nodeports: tcp . 30080 : goto "ext-default/web/tcp/http""#.to_string()
        ));
        assert!(t.contains(
            &r#"service-ips: 192.168.5.10 . tcp . 80 : goto "ext-default/web/tcp/http""#
                .to_string()
        ));
        assert!(t.contains(
            &r#"service-ips: 10.43.0.20 . tcp . 80 : goto "svc-default/web/tcp/http""#.to_string()
        ));
    }

    #[test]
    fn external_traffic_policy_local_keeps_the_source_and_uses_local_endpoints() {
        let mut p = plan(&[ep("10.42.0.5", 8080), ep("10.42.1.6", 8080)]);
        p.node_port = Some(30080);
        p.external_local = true;
        p.local_endpoints = vec![ep("10.42.0.5", 8080)];
        let r = port_rules(&p, cidr());
        assert_eq!(
            r.chains["ext-default/web/tcp/http"]
                .iter()
                .map(|r| r.to_string())
                .collect::<Vec<_>>(),
            vec![
                r#"ip saddr 10.42.0.0/16 goto "svc-default/web/tcp/http""#,
                r#"fib saddr type local jump "mark-for-masquerade""#,
                r#"fib saddr type local goto "svc-default/web/tcp/http""#,
                r#"goto "local-default/web/tcp/http""#,
            ]
        );
        assert_eq!(
            r.chains["local-default/web/tcp/http"]
                .last()
                .unwrap()
                .to_string(),
            "meta l4proto tcp dnat to 10.42.0.5:8080"
        );
        // No local endpoint: external traffic is dropped, not sent away.
        p.local_endpoints = vec![];
        let r = port_rules(&p, cidr());
        assert_eq!(
            r.chains["local-default/web/tcp/http"].last(),
            Some(&Rule::Drop)
        );
    }

    #[test]
    fn internal_traffic_policy_local_without_local_endpoints_drops() {
        let mut p = plan(&[ep("10.42.1.6", 8080)]);
        p.internal_local = true;
        let r = port_rules(&p, cidr());
        assert_eq!(
            text(&r),
            vec![r#"no-endpoint-services: 10.43.0.20 . tcp . 80 : drop"#]
        );
    }

    #[test]
    fn client_ip_affinity_checks_per_endpoint_sets_before_spreading() {
        let mut p = plan(&[ep("10.42.0.5", 8080), ep("10.42.0.6", 8080)]);
        p.affinity = Some(60);
        let r = port_rules(&p, None);
        let svc = &r.chains["svc-default/web/tcp/http"];
        assert_eq!(
            svc[0].to_string(),
            r#"ip saddr @"aff-default/web/tcp/http/10.42.0.5:8080" goto "ep-default/web/tcp/http/10.42.0.5:8080""#
        );
        assert!(matches!(svc[2], Rule::PickGoto(2, _)));
        assert_eq!(
            svc[2].to_string(),
            r#"numgen random mod 2 == 0 goto "ep-default/web/tcp/http/10.42.0.5:8080""#
        );
        assert_eq!(
            svc[3].to_string(),
            r#"goto "ep-default/web/tcp/http/10.42.0.6:8080""#
        );
        assert_eq!(
            r.chains["ep-default/web/tcp/http/10.42.0.6:8080"]
                .iter()
                .map(|r| r.to_string())
                .collect::<Vec<_>>(),
            vec![
                r#"update @"aff-default/web/tcp/http/10.42.0.6:8080" { ip saddr }"#,
                "meta l4proto tcp dnat to 10.42.0.6:8080",
            ]
        );
        assert_eq!(r.sets.len(), 2);
        assert!(r.sets.values().all(|t| *t == 60));
    }

    #[test]
    fn without_a_cluster_cidr_cluster_ip_traffic_is_not_masqueraded() {
        let r = port_rules(&plan(&[ep("10.42.0.5", 8080)]), None);
        assert!(!text(&r).iter().any(|l| l.contains("mark-for-masquerade")));
    }

    #[test]
    fn an_endpoint_change_rewrites_only_the_service_chain() {
        let old = port_rules_shaped(&plan(&[ep("10.42.0.5", 8080)]), None, Shape::Rules);
        let new = port_rules_shaped(
            &plan(&[ep("10.42.0.5", 8080), ep("10.42.0.6", 8080)]),
            None,
            Shape::Rules,
        );
        let ops: Vec<String> = diff(&old, &new).iter().map(|o| o.to_string()).collect();
        assert_eq!(
            ops,
            vec![
                r#"flush chain "svc-default/web/tcp/http""#,
                r#"add rule "svc-default/web/tcp/http" numgen random mod 2 == 0 meta l4proto tcp dnat to 10.42.0.5:8080"#,
                r#"add rule "svc-default/web/tcp/http" meta l4proto tcp dnat to 10.42.0.6:8080"#,
            ]
        );
        assert!(diff(&new, &new).is_empty());
    }

    #[test]
    fn a_new_endpoint_set_of_the_same_size_only_refills_the_map() {
        let a = port_rules(
            &plan(&[ep("10.42.0.5", 8080), ep("10.42.0.6", 8080)]),
            cidr(),
        );
        let b = port_rules(
            &plan(&[ep("10.42.0.5", 8080), ep("10.42.0.7", 8080)]),
            cidr(),
        );
        let ops: Vec<String> = diff(&a, &b).iter().map(|o| o.to_string()).collect();
        assert_eq!(
            ops,
            vec![
                r#"flush set "dnat-svc-default/web/tcp/http/2""#,
                r#"add element "dnat-svc-default/web/tcp/http/2" { 0 : 10.42.0.5 . 8080, 1 : 10.42.0.7 . 8080 }"#,
            ]
        );
        assert!(diff(&b, &b).is_empty());
    }

    #[test]
    fn a_change_of_the_endpoint_count_replaces_the_map_and_the_one_rule() {
        let two = port_rules(
            &plan(&[ep("10.42.0.5", 8080), ep("10.42.0.6", 8080)]),
            cidr(),
        );
        let three = port_rules(
            &plan(&[
                ep("10.42.0.5", 8080),
                ep("10.42.0.6", 8080),
                ep("10.42.0.7", 8080),
            ]),
            cidr(),
        );
        let mut ops = diff(&two, &three);
        ops.sort_by_key(|o| o.phase());
        let ops: Vec<String> = ops.iter().map(|o| o.to_string()).collect();
        assert_eq!(
            ops,
            vec![
                r#"add map "dnat-svc-default/web/tcp/http/3" { typeof numgen random mod 3 : ip daddr . tcp dport; }"#,
                r#"flush chain "svc-default/web/tcp/http""#,
                r#"add rule "svc-default/web/tcp/http" meta l4proto tcp dnat ip to numgen random mod 3 map @"dnat-svc-default/web/tcp/http/3""#,
                r#"add element "dnat-svc-default/web/tcp/http/3" { 0 : 10.42.0.5 . 8080, 1 : 10.42.0.6 . 8080, 2 : 10.42.0.7 . 8080 }"#,
                r#"delete set "dnat-svc-default/web/tcp/http/2""#,
            ]
        );
        // Down to one endpoint: a plain DNAT rule, the map goes.
        let one = port_rules(&plan(&[ep("10.42.0.5", 8080)]), cidr());
        let ops: Vec<String> = diff(&two, &one).iter().map(|o| o.to_string()).collect();
        assert_eq!(
            ops.last().unwrap(),
            r#"delete set "dnat-svc-default/web/tcp/http/2""#
        );
        assert!(ops.contains(
            &r#"add rule "svc-default/web/tcp/http" meta l4proto tcp dnat to 10.42.0.5:8080"#
                .to_string()
        ));
    }

    #[test]
    fn affinity_endpoint_chains_come_and_go_with_their_endpoints() {
        let mut a = plan(&[ep("10.42.0.5", 8080)]);
        a.affinity = Some(60);
        let mut b = plan(&[ep("10.42.0.5", 8080), ep("10.42.0.6", 8080)]);
        b.affinity = Some(60);
        let ops: Vec<String> = diff(&port_rules(&a, None), &port_rules(&b, None))
            .iter()
            .map(|o| o.to_string())
            .collect();
        assert_eq!(
            ops[0],
            r#"add set "aff-default/web/tcp/http/10.42.0.6:8080" { type ipv4_addr; flags dynamic,timeout; timeout 60s; }"#
        );
        assert_eq!(
            ops[1],
            r#"add chain "ep-default/web/tcp/http/10.42.0.6:8080""#
        );
        let back: Vec<String> = diff(&port_rules(&b, None), &port_rules(&a, None))
            .iter()
            .map(|o| o.to_string())
            .collect();
        assert_eq!(
            back.last().unwrap(),
            r#"delete set "aff-default/web/tcp/http/10.42.0.6:8080""#
        );
        assert!(
            back.contains(&r#"delete chain "ep-default/web/tcp/http/10.42.0.6:8080""#.to_string())
        );
    }

    #[test]
    fn losing_the_last_endpoint_swaps_the_map_element_before_deleting_chains() {
        let old = port_rules(&plan(&[ep("10.42.0.5", 8080)]), None);
        let new = port_rules(&plan(&[]), None);
        let ops: Vec<String> = diff(&old, &new).iter().map(|o| o.to_string()).collect();
        assert_eq!(
            ops,
            vec![
                r#"delete element service-ips { 10.43.0.20 . tcp . 80 }"#,
                r#"flush chain "svc-default/web/tcp/http""#,
                r#"add element no-endpoint-services { 10.43.0.20 . tcp . 80 : goto "reject-chain" }"#,
                r#"delete chain "svc-default/web/tcp/http""#,
            ]
        );
    }

    #[test]
    fn the_hairpin_set_has_room_for_as_many_endpoints_again() {
        assert_eq!(hairpin_capacity(0), 1024);
        assert_eq!(hairpin_capacity(600), 2048);
        assert_eq!(hairpin_capacity(100_000), 262_144);
        for n in [1, 1000, 5000, 77_777] {
            assert!(hairpin_capacity(n) as usize >= 2 * n);
        }
    }

    #[test]
    fn services_spread_over_every_shard_and_keep_theirs() {
        let mut seen = std::collections::BTreeMap::new();
        for i in 0..1000 {
            *seen
                .entry(shard_of("default", &format!("svc-{i}")))
                .or_insert(0) += 1;
        }
        assert_eq!(seen.len(), usize::from(SHARDS), "{seen:?}");
        // Roughly even: no shard holds more than twice its share.
        assert!(
            seen.values().all(|n| *n < 2 * 1000 / usize::from(SHARDS)),
            "{seen:?}"
        );
        // The same service lands in the same shard every time; the
        // namespace is part of the key.
        assert_eq!(shard_of("default", "web"), shard_of("default", "web"));
        let homes: std::collections::BTreeSet<_> = (0..50)
            .map(|i| shard_of(&format!("ns-{i}"), "web"))
            .collect();
        assert!(homes.len() > 1);
    }

    #[test]
    fn a_services_dnat_goes_to_its_shard_and_shared_objects_to_the_main_table() {
        let owner = Home::Shard(3);
        let vip = MapKey::Ip("10.43.0.5".parse().unwrap(), Protocol::Tcp, 80);
        let chain = "svc-default/web/tcp/http".to_string();
        assert_eq!(Op::AddChain(chain.clone()).home(owner), owner);
        assert_eq!(Op::AddRule(chain.clone(), Rule::Drop).home(owner), owner);
        assert_eq!(
            Op::AddElement(SERVICE_IPS, vip.clone(), Verdict::Goto(chain)).home(owner),
            owner
        );
        assert_eq!(
            Op::AddElement(
                CLUSTER_IPS,
                vip.clone(),
                Verdict::Jump(MARK_FOR_MASQ.into())
            )
            .home(owner),
            owner
        );
        assert_eq!(Op::FlushDnatMap("dnat-x/2".into()).home(owner), owner);
        assert_eq!(
            Op::AddElement(NO_ENDPOINT_SERVICES, vip.clone(), Verdict::Drop).home(owner),
            Home::Main
        );
        assert_eq!(
            Op::DeleteElement(NO_ENDPOINT_NODEPORTS, vip).home(owner),
            Home::Main
        );
        assert_eq!(
            Op::AddHairpin("10.42.0.5".parse().unwrap()).home(owner),
            Home::Main
        );
    }
}
