//! What the node's routing to other nodes' pods should look like, from data
//! alone (no I/O): for each peer Node with a podCIDR, a direct route via
//! its InternalIP when it shares a subnet with this node (flannel's
//! host-gw), else a route through the VXLAN device to the peer's VTEP
//! (flannel's vxlan: the VTEP's address is the first address of the peer's
//! podCIDR, its MAC comes from the peer's Node annotation, and an FDB entry
//! sends that MAC to the peer's InternalIP).

use std::collections::BTreeMap;
use std::fmt;
use std::net::Ipv4Addr;

/// A v4 prefix.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Cidr {
    pub addr: Ipv4Addr,
    pub len: u8,
}

impl Cidr {
    /// Parses `a.b.c.d/n` (the address is masked to the prefix).
    pub fn parse(s: &str) -> Option<Cidr> {
        let (ip, len) = s.trim().split_once('/')?;
        let ip: Ipv4Addr = ip.parse().ok()?;
        let len: u8 = len.parse().ok()?;
        (len <= 32).then(|| Cidr::new(ip, len))
    }

    pub fn new(ip: Ipv4Addr, len: u8) -> Cidr {
        Cidr {
            addr: Ipv4Addr::from(u32::from(ip) & mask(len)),
            len,
        }
    }

    pub fn contains(&self, ip: Ipv4Addr) -> bool {
        u32::from(ip) & mask(self.len) == u32::from(self.addr)
    }

    /// Whether `other` lies wholly inside this prefix.
    pub fn covers(&self, other: &Cidr) -> bool {
        other.len >= self.len && self.contains(other.addr)
    }
}

fn mask(len: u8) -> u32 {
    if len == 0 {
        0
    } else {
        u32::MAX << (32 - u32::from(len.min(32)))
    }
}

impl fmt::Display for Cidr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.addr, self.len)
    }
}

/// How pods reach other nodes (`--flannel-backend`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Backend {
    /// Direct routes only; a peer on another subnet cannot be reached.
    HostGw,
    /// Every peer through VXLAN.
    Vxlan,
    /// Direct routes to peers on a shared subnet, VXLAN to the others (so
    /// host-gw when every peer is on-link).
    #[default]
    Auto,
}

impl std::str::FromStr for Backend {
    type Err = String;
    fn from_str(s: &str) -> Result<Backend, String> {
        match s {
            "host-gw" => Ok(Backend::HostGw),
            "vxlan" => Ok(Backend::Vxlan),
            "auto" => Ok(Backend::Auto),
            other => Err(format!(
                "unknown flannel backend {other:?} (host-gw, vxlan or auto)"
            )),
        }
    }
}

/// A MAC address.
pub type Mac = [u8; 6];

/// `aa:bb:cc:dd:ee:ff`.
pub fn format_mac(m: &Mac) -> String {
    m.iter()
        .map(|b| format!("{b:02x}"))
        .collect::<Vec<_>>()
        .join(":")
}

pub fn parse_mac(s: &str) -> Option<Mac> {
    let parts: Vec<u8> = s
        .trim()
        .split(':')
        .map(|p| u8::from_str_radix(p, 16).ok().filter(|_| p.len() == 2))
        .collect::<Option<_>>()?;
    parts.try_into().ok()
}

/// The VTEP MAC of a node: derived from its name, so it survives the
/// device being re-created and the agent restarting (peers keep their FDB
/// and neighbour entries). Locally administered, unicast.
pub fn vtep_mac(node_name: &str) -> Mac {
    let d = ring::digest::digest(&ring::digest::SHA256, node_name.as_bytes());
    let b = d.as_ref();
    [(b[0] & 0xfc) | 0x02, b[1], b[2], b[3], b[4], b[5]]
}

/// This node, as routing needs it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Local {
    pub ip: Ipv4Addr,
    /// The subnet of the interface holding `ip` (peers in it are on-link).
    pub subnet: Cidr,
    pub pod_cidr: Option<Cidr>,
}

/// Another node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Peer {
    pub name: String,
    pub ip: Ipv4Addr,
    pub pod_cidr: Cidr,
    /// Its VTEP MAC (annotation), when it published one.
    pub vtep_mac: Option<Mac>,
}

/// How one peer's pods are reached.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Via {
    /// `POD_CIDR via PEER_IP` on the node's link.
    Direct(Ipv4Addr),
    /// `POD_CIDR via VTEP dev VXLAN onlink`, with the neighbour entry
    /// `VTEP lladdr MAC` and the FDB entry `MAC dst REMOTE`.
    Vxlan {
        vtep: Ipv4Addr,
        mac: Mac,
        remote: Ipv4Addr,
    },
}

/// The routes, and what could not be routed (with why).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Desired {
    /// Destination podCIDR → how.
    pub routes: BTreeMap<Cidr, Via>,
    /// The VXLAN device is needed (some route goes through it).
    pub vxlan: bool,
    /// Peers left out: (node, reason).
    pub unreachable: Vec<(String, String)>,
}

impl Desired {
    /// The VXLAN neighbours (VTEP address → MAC) and FDB entries (MAC →
    /// remote) the routes need.
    pub fn vxlan_entries(&self) -> Vec<(Ipv4Addr, Mac, Ipv4Addr)> {
        self.routes
            .values()
            .filter_map(|v| match v {
                Via::Vxlan { vtep, mac, remote } => Some((*vtep, *mac, *remote)),
                Via::Direct(_) => None,
            })
            .collect()
    }
}

/// The VTEP address of a node: the first address of its podCIDR (as
/// flannel's `flannel.1` holds `10.42.N.0/32`).
pub fn vtep_address(pod_cidr: &Cidr) -> Ipv4Addr {
    pod_cidr.addr
}

/// The routes this node needs to every peer's pods.
pub fn plan(local: &Local, peers: &[Peer], backend: Backend) -> Desired {
    let mut out = Desired::default();
    for p in peers {
        if p.ip == local.ip {
            out.unreachable.push((
                p.name.clone(),
                format!("it reports this node's address {}", p.ip),
            ));
            continue;
        }
        if local
            .pod_cidr
            .is_some_and(|own| own.covers(&p.pod_cidr) || p.pod_cidr.covers(&own))
        {
            out.unreachable.push((
                p.name.clone(),
                format!("its podCIDR {} overlaps this node's", p.pod_cidr),
            ));
            continue;
        }
        let on_link = local.subnet.contains(p.ip);
        let direct = match backend {
            Backend::HostGw => true,
            Backend::Vxlan => false,
            Backend::Auto => on_link,
        };
        if direct {
            if !on_link {
                out.unreachable.push((
                    p.name.clone(),
                    format!(
                        "its address {} is not on this node's subnet {} (host-gw needs one link; use --flannel-backend vxlan or auto)",
                        p.ip, local.subnet
                    ),
                ));
                continue;
            }
            out.routes.insert(p.pod_cidr, Via::Direct(p.ip));
        } else {
            let Some(mac) = p.vtep_mac else {
                out.unreachable.push((
                    p.name.clone(),
                    "it has not published its VTEP MAC yet".into(),
                ));
                continue;
            };
            out.routes.insert(
                p.pod_cidr,
                Via::Vxlan {
                    vtep: vtep_address(&p.pod_cidr),
                    mac,
                    remote: p.ip,
                },
            );
        }
    }
    // This node's own VTEP is needed as soon as a peer might send to it.
    out.vxlan = match backend {
        Backend::HostGw => false,
        Backend::Vxlan => true,
        Backend::Auto => peers.iter().any(|p| !local.subnet.contains(p.ip)),
    };
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn local() -> Local {
        Local {
            ip: "192.168.10.2".parse().unwrap(),
            subnet: Cidr::parse("192.168.10.0/24").unwrap(),
            pod_cidr: Cidr::parse("10.42.0.0/24"),
        }
    }

    fn peer(name: &str, ip: &str, cidr: &str, mac: Option<Mac>) -> Peer {
        Peer {
            name: name.into(),
            ip: ip.parse().unwrap(),
            pod_cidr: Cidr::parse(cidr).unwrap(),
            vtep_mac: mac,
        }
    }

    #[test]
    fn cidrs_parse_mask_and_contain() {
        let c = Cidr::parse("10.42.1.7/24").unwrap();
        assert_eq!(c.to_string(), "10.42.1.0/24");
        assert!(c.contains("10.42.1.255".parse().unwrap()));
        assert!(!c.contains("10.42.2.0".parse().unwrap()));
        assert!(Cidr::parse("10.42.0.0/16").unwrap().covers(&c));
        assert!(!c.covers(&Cidr::parse("10.42.0.0/16").unwrap()));
        assert_eq!(Cidr::parse("10.0.0.0/33"), None);
        assert_eq!(Cidr::parse("nonsense"), None);
    }

    #[test]
    fn macs_round_trip_and_a_nodes_vtep_mac_is_stable_and_local() {
        let m = vtep_mac("node-a");
        assert_eq!(m, vtep_mac("node-a"));
        assert_ne!(m, vtep_mac("node-b"));
        assert_eq!(m[0] & 0x03, 0x02, "locally administered unicast");
        assert_eq!(parse_mac(&format_mac(&m)), Some(m));
        assert_eq!(parse_mac("zz:00:00:00:00:00"), None);
        assert_eq!(parse_mac("00:00:00:00:00"), None);
    }

    #[test]
    fn auto_routes_on_link_peers_directly_and_the_others_through_vxlan() {
        let mac = [2, 0, 0, 0, 0, 9];
        let d = plan(
            &local(),
            &[
                peer("b", "192.168.10.3", "10.42.1.0/24", None),
                peer("c", "192.168.20.4", "10.42.2.0/24", Some(mac)),
            ],
            Backend::Auto,
        );
        assert_eq!(
            d.routes[&Cidr::parse("10.42.1.0/24").unwrap()],
            Via::Direct("192.168.10.3".parse().unwrap())
        );
        assert_eq!(
            d.routes[&Cidr::parse("10.42.2.0/24").unwrap()],
            Via::Vxlan {
                vtep: "10.42.2.0".parse().unwrap(),
                mac,
                remote: "192.168.20.4".parse().unwrap()
            }
        );
        assert!(d.vxlan);
        assert!(d.unreachable.is_empty());
    }

    #[test]
    fn auto_with_every_peer_on_link_is_host_gw_without_a_vxlan_device() {
        let d = plan(
            &local(),
            &[peer("b", "192.168.10.3", "10.42.1.0/24", None)],
            Backend::Auto,
        );
        assert!(!d.vxlan);
        assert_eq!(d.vxlan_entries(), vec![]);
        assert_eq!(d.routes.len(), 1);
    }

    #[test]
    fn host_gw_cannot_reach_a_peer_on_another_subnet_and_says_why() {
        let d = plan(
            &local(),
            &[peer("c", "192.168.20.4", "10.42.2.0/24", None)],
            Backend::HostGw,
        );
        assert!(d.routes.is_empty());
        assert_eq!(d.unreachable.len(), 1);
        assert!(d.unreachable[0].1.contains("not on this node's subnet"));
    }

    #[test]
    fn vxlan_waits_for_a_peers_vtep_mac_and_uses_it_once_published() {
        let l = local();
        let mut p = peer("b", "192.168.10.3", "10.42.1.0/24", None);
        let d = plan(&l, std::slice::from_ref(&p), Backend::Vxlan);
        assert!(d.routes.is_empty());
        assert!(d.vxlan, "this node's own VTEP exists regardless");
        p.vtep_mac = Some([2, 1, 2, 3, 4, 5]);
        let d = plan(&l, &[p], Backend::Vxlan);
        assert_eq!(
            d.vxlan_entries(),
            vec![(
                "10.42.1.0".parse().unwrap(),
                [2, 1, 2, 3, 4, 5],
                "192.168.10.3".parse().unwrap()
            )]
        );
    }

    #[test]
    fn a_peer_claiming_this_nodes_address_or_pod_range_is_left_out() {
        let d = plan(
            &local(),
            &[
                peer("x", "192.168.10.2", "10.42.5.0/24", None),
                peer("y", "192.168.10.9", "10.42.0.0/24", None),
            ],
            Backend::Auto,
        );
        assert!(d.routes.is_empty());
        assert_eq!(d.unreachable.len(), 2);
    }
}
