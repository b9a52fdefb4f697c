//! The kernel side of pod routing, through netlink (`rtnetlink`): finding
//! the node's address, the VXLAN device with its VTEP address, the routes
//! to other nodes' podCIDRs, and the VXLAN neighbour and FDB entries.
//! Routes skiff adds carry their own protocol number ([`RTPROT_SKIFF`]),
//! so the ones it no longer wants are found and removed without touching
//! anyone else's.

use std::collections::BTreeSet;
use std::net::{IpAddr, Ipv4Addr};

use futures::TryStreamExt;
use rtnetlink::packet_route::address::AddressAttribute;
use rtnetlink::packet_route::link::{InfoData, InfoVxlan, LinkAttribute, LinkInfo};
use rtnetlink::packet_route::neighbour::{
    NeighbourAddress, NeighbourAttribute, NeighbourFlags, NeighbourState,
};
use rtnetlink::packet_route::route::{
    RouteAddress, RouteAttribute, RouteHeader, RouteMessage, RouteProtocol,
};
use rtnetlink::packet_route::AddressFamily;
use rtnetlink::{Handle, LinkUnspec, LinkVxlan, RouteMessageBuilder};

use super::plan::{Cidr, Desired, Mac, Via};

/// The route protocol number marking skiff's routes (`ip route` shows
/// `proto 95`).
pub const RTPROT_SKIFF: u8 = 95;
/// The VXLAN device (as flannel's `flannel.1`).
pub const VXLAN_DEVICE: &str = "skiff.vxlan";
/// VNI and UDP port, as flannel's defaults (VNI 1, the Linux port 8472).
pub const VNI: u32 = 1;
pub const VXLAN_PORT: u16 = 8472;
/// VXLAN's overhead: outer IPv4 (20) + UDP (8) + VXLAN (8) + inner
/// Ethernet (14).
pub const VXLAN_OVERHEAD: u32 = 50;

/// Netlink steps that failed; all are retried on the next sync.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("opening a netlink socket: {0}")]
    ConnectFailed(std::io::Error),
    #[error("no IPv4 default route to take the node's address from")]
    NoDefaultRoute,
    #[error("no interface holds the node address {0}")]
    AddressNotFound(Ipv4Addr),
    #[error("creating {VXLAN_DEVICE}: {0}")]
    VxlanFailed(rtnetlink::Error),
    #[error("route to {0}: {1}")]
    RouteFailed(Cidr, rtnetlink::Error),
    #[error("netlink: {0}")]
    RequestFailed(#[from] rtnetlink::Error),
}

pub fn connect() -> Result<Handle, Error> {
    let (conn, handle, _) = rtnetlink::new_connection().map_err(Error::ConnectFailed)?;
    tokio::spawn(conn);
    Ok(handle)
}

/// The node's address as routing sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeAddress {
    pub ip: Ipv4Addr,
    pub subnet: Cidr,
    pub link: u32,
    pub mtu: u32,
}

/// The node's address: `want` (`--node-ip`) wherever it is configured, else
/// the default route's preferred source (`ip route ... src A`) or, without
/// one, the first IPv4 address of the interface holding the default route.
pub async fn node_address(handle: &Handle, want: Option<Ipv4Addr>) -> Result<NodeAddress, Error> {
    let (link, src) = match want {
        Some(_) => (None, None),
        None => {
            let (l, s) = default_route(handle).await?.ok_or(Error::NoDefaultRoute)?;
            (Some(l), s)
        }
    };
    let want = want.or(src);
    let mut addrs = handle.address().get();
    if let Some(l) = link {
        addrs = addrs.set_link_index_filter(l);
    }
    let mut msgs = addrs.execute();
    while let Some(m) = msgs.try_next().await? {
        let ip = m.attributes.iter().find_map(|a| match a {
            AddressAttribute::Address(IpAddr::V4(ip)) => Some(*ip),
            _ => None,
        });
        let Some(ip) = ip else { continue };
        if want.is_some_and(|w| w != ip) || ip.is_loopback() && want.is_none() {
            continue;
        }
        let index = m.header.index;
        return Ok(NodeAddress {
            ip,
            subnet: Cidr::new(ip, m.header.prefix_len),
            link: index,
            mtu: link_mtu(handle, index).await?.unwrap_or(1500),
        });
    }
    Err(match want {
        Some(w) => Error::AddressNotFound(w),
        None => Error::NoDefaultRoute,
    })
}

/// The main table's IPv4 default route: its interface and preferred source.
async fn default_route(handle: &Handle) -> Result<Option<(u32, Option<Ipv4Addr>)>, Error> {
    let mut routes = handle
        .route()
        .get(RouteMessageBuilder::<Ipv4Addr>::new().build())
        .execute();
    while let Some(r) = routes.try_next().await? {
        if r.header.destination_prefix_length != 0
            || table(&r) != u32::from(RouteHeader::RT_TABLE_MAIN)
        {
            continue;
        }
        let src = r.attributes.iter().find_map(|a| match a {
            RouteAttribute::PrefSource(RouteAddress::Inet(ip)) => Some(*ip),
            _ => None,
        });
        if let Some(oif) = r.attributes.iter().find_map(|a| match a {
            RouteAttribute::Oif(i) => Some(*i),
            _ => None,
        }) {
            return Ok(Some((oif, src)));
        }
    }
    Ok(None)
}

fn table(r: &RouteMessage) -> u32 {
    r.attributes
        .iter()
        .find_map(|a| match a {
            RouteAttribute::Table(t) => Some(*t),
            _ => None,
        })
        .unwrap_or(u32::from(r.header.table))
}

async fn link_mtu(handle: &Handle, index: u32) -> Result<Option<u32>, Error> {
    let mut links = handle.link().get().match_index(index).execute();
    Ok(links.try_next().await?.and_then(|l| {
        l.attributes.iter().find_map(|a| match a {
            LinkAttribute::Mtu(m) => Some(*m),
            _ => None,
        })
    }))
}

/// A link's index and attributes by name (None: no such link).
async fn link_by_name(
    handle: &Handle,
    name: &str,
) -> Result<Option<(u32, Vec<LinkAttribute>)>, Error> {
    let mut links = handle.link().get().match_name(name.to_string()).execute();
    match links.try_next().await {
        Ok(l) => Ok(l.map(|l| (l.header.index, l.attributes))),
        // ENODEV: no such link.
        Err(rtnetlink::Error::NetlinkError(e)) if e.raw_code() == -19 => Ok(None),
        Err(e) => Err(e.into()),
    }
}

/// Makes [`VXLAN_DEVICE`] exist with this node's VTEP: bound to the node's
/// link and address, MAC `mac`, MTU of the link minus the encapsulation,
/// learning off (entries come from the Nodes), `vtep/32` as its only
/// address, up. A device left with other settings (the node's address
/// changed) is re-created. Returns its index.
pub async fn ensure_vxlan(
    handle: &Handle,
    node: &NodeAddress,
    mac: Mac,
    vtep: Ipv4Addr,
) -> Result<u32, Error> {
    let mtu = node.mtu.saturating_sub(VXLAN_OVERHEAD).max(576);
    if let Some((index, attrs)) = link_by_name(handle, VXLAN_DEVICE).await? {
        let infos: Vec<&InfoVxlan> = attrs
            .iter()
            .filter_map(|a| match a {
                LinkAttribute::LinkInfo(i) => Some(i),
                _ => None,
            })
            .flatten()
            .filter_map(|i| match i {
                LinkInfo::Data(InfoData::Vxlan(v)) => Some(v),
                _ => None,
            })
            .flatten()
            .collect();
        let same = infos.contains(&&InfoVxlan::Local(node.ip))
            && infos.contains(&&InfoVxlan::Link(node.link))
            && infos.contains(&&InfoVxlan::Id(VNI))
            && attrs.contains(&LinkAttribute::Address(mac.to_vec()));
        if same {
            if !attrs.contains(&LinkAttribute::Mtu(mtu)) {
                handle
                    .link()
                    .set(LinkUnspec::new_with_index(index).mtu(mtu).build())
                    .execute()
                    .await?;
            }
            set_vtep_address(handle, index, vtep).await?;
            handle
                .link()
                .set(LinkUnspec::new_with_index(index).up().build())
                .execute()
                .await?;
            return Ok(index);
        }
        tracing::info!("re-creating {VXLAN_DEVICE}: the node's address or VTEP changed");
        handle.link().del(index).execute().await?;
    }
    handle
        .link()
        .add(
            LinkVxlan::new(VXLAN_DEVICE, VNI)
                .dev(node.link)
                .local(node.ip)
                .port(VXLAN_PORT)
                .learning(false)
                .mtu(mtu)
                .address(mac.to_vec())
                .up()
                .build(),
        )
        .execute()
        .await
        .map_err(Error::VxlanFailed)?;
    let (index, _) = link_by_name(handle, VXLAN_DEVICE)
        .await?
        .ok_or(Error::VxlanFailed(rtnetlink::Error::RequestFailed))?;
    set_vtep_address(handle, index, vtep).await?;
    Ok(index)
}

async fn set_vtep_address(handle: &Handle, index: u32, vtep: Ipv4Addr) -> Result<(), Error> {
    let mut have = false;
    let mut msgs = handle
        .address()
        .get()
        .set_link_index_filter(index)
        .execute();
    let mut stale = vec![];
    while let Some(m) = msgs.try_next().await? {
        let ip = m.attributes.iter().find_map(|a| match a {
            AddressAttribute::Address(IpAddr::V4(ip)) => Some(*ip),
            _ => None,
        });
        match ip {
            Some(ip) if ip == vtep && m.header.prefix_len == 32 => have = true,
            Some(_) => stale.push(m),
            None => {}
        }
    }
    for m in stale {
        handle.address().del(m).execute().await?;
    }
    if !have {
        match handle
            .address()
            .add(index, IpAddr::V4(vtep), 32)
            .execute()
            .await
        {
            Ok(()) => {}
            Err(rtnetlink::Error::NetlinkError(e)) if e.raw_code() == -17 => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

/// Deletes [`VXLAN_DEVICE`] if it exists (its routes, neighbours and FDB
/// entries go with it).
pub async fn delete_vxlan(handle: &Handle) -> Result<(), Error> {
    if let Some((index, _)) = link_by_name(handle, VXLAN_DEVICE).await? {
        handle.link().del(index).execute().await?;
    }
    Ok(())
}

/// skiff's routes in the main table whose destination lies in `cluster`.
async fn own_routes(handle: &Handle, cluster: &Cidr) -> Result<Vec<(Cidr, RouteMessage)>, Error> {
    let mut out = vec![];
    let mut routes = handle
        .route()
        .get(RouteMessageBuilder::<Ipv4Addr>::new().build())
        .execute();
    while let Some(r) = routes.try_next().await? {
        if r.header.protocol != RouteProtocol::Other(RTPROT_SKIFF)
            || table(&r) != u32::from(RouteHeader::RT_TABLE_MAIN)
        {
            continue;
        }
        let dst = r.attributes.iter().find_map(|a| match a {
            RouteAttribute::Destination(RouteAddress::Inet(ip)) => Some(*ip),
            _ => None,
        });
        let Some(dst) = dst else { continue };
        let c = Cidr::new(dst, r.header.destination_prefix_length);
        if cluster.covers(&c) {
            out.push((c, r));
        }
    }
    Ok(out)
}

/// Makes skiff's routes into `cluster` exactly `desired`'s: each wanted
/// route added or replaced, every other one removed. `vxlan` is the VXLAN
/// device's index when routes go through it. Keeps going past a failed
/// route and returns the first error.
pub async fn sync_routes(
    handle: &Handle,
    cluster: &Cidr,
    desired: &Desired,
    vxlan: Option<u32>,
) -> Result<(), Error> {
    let mut first: Option<Error> = None;
    for (dst, msg) in own_routes(handle, cluster).await? {
        if !desired.routes.contains_key(&dst) {
            if let Err(e) = handle.route().del(msg).execute().await {
                first.get_or_insert(Error::RouteFailed(dst, e));
            }
        }
    }
    for (dst, via) in &desired.routes {
        let b = RouteMessageBuilder::<Ipv4Addr>::new()
            .destination_prefix(dst.addr, dst.len)
            .protocol(RouteProtocol::Other(RTPROT_SKIFF));
        let msg = match via {
            Via::Direct(gw) => b.gateway(*gw).build(),
            Via::Vxlan { vtep, .. } => {
                let Some(index) = vxlan else { continue };
                b.gateway(*vtep).output_interface(index).onlink().build()
            }
        };
        if let Err(e) = handle.route().add(msg).replace().execute().await {
            first.get_or_insert(Error::RouteFailed(*dst, e));
        }
    }
    first.map_or(Ok(()), Err)
}

/// Makes the VXLAN device's permanent neighbour entries (VTEP → MAC) and
/// FDB entries (MAC → remote node) exactly `entries`.
pub async fn sync_vxlan_entries(
    handle: &Handle,
    index: u32,
    entries: &[(Ipv4Addr, Mac, Ipv4Addr)],
) -> Result<(), Error> {
    let want_neigh: BTreeSet<(Ipv4Addr, Mac)> = entries.iter().map(|(v, m, _)| (*v, *m)).collect();
    let want_fdb: BTreeSet<(Mac, Ipv4Addr)> = entries.iter().map(|(_, m, r)| (*m, *r)).collect();
    for family in [AddressFamily::Inet, AddressFamily::Bridge] {
        let mut stale = vec![];
        let mut msgs = handle
            .neighbours()
            .get()
            .set_address_family(family)
            .execute();
        while let Some(m) = msgs.try_next().await? {
            if m.header.ifindex != index || m.header.state != NeighbourState::Permanent {
                continue;
            }
            let dst = m.attributes.iter().find_map(|a| match a {
                NeighbourAttribute::Destination(NeighbourAddress::Inet(ip)) => Some(*ip),
                _ => None,
            });
            let mac: Option<Mac> = m.attributes.iter().find_map(|a| match a {
                NeighbourAttribute::LinkLayerAddress(l) => l.as_slice().try_into().ok(),
                _ => None,
            });
            let keep = match (family, dst, mac) {
                (AddressFamily::Inet, Some(d), Some(m)) => want_neigh.contains(&(d, m)),
                (AddressFamily::Bridge, Some(d), Some(m)) => want_fdb.contains(&(m, d)),
                _ => true,
            };
            if !keep {
                stale.push(m);
            }
        }
        for m in stale {
            handle.neighbours().del(m).execute().await?;
        }
    }
    for (vtep, mac) in &want_neigh {
        handle
            .neighbours()
            .add(index, IpAddr::V4(*vtep))
            .link_layer_address(mac)
            .state(NeighbourState::Permanent)
            .replace()
            .execute()
            .await?;
    }
    for (mac, remote) in &want_fdb {
        handle
            .neighbours()
            .add_bridge(index, mac)
            .destination(IpAddr::V4(*remote))
            .flags(NeighbourFlags::Own)
            .state(NeighbourState::Permanent)
            .replace()
            .execute()
            .await?;
    }
    Ok(())
}

/// Removes every route of skiff's into `cluster` (`skiff down`).
pub async fn remove_routes(handle: &Handle, cluster: &Cidr) -> Result<(), Error> {
    for (_, msg) in own_routes(handle, cluster).await? {
        handle.route().del(msg).execute().await?;
    }
    Ok(())
}
