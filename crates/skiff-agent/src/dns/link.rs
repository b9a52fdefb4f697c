//! The node's `skiff-dns0` dummy interface that holds the cluster DNS
//! address, so the responder can listen on it and pods reach it through
//! their default route to the host, without NAT. On a kernel without the
//! dummy driver it is a bridge without ports instead (same effect: a
//! local address). Netlink through `rtnetlink`.

use std::net::IpAddr;

use futures::TryStreamExt;
use rtnetlink::packet_route::address::AddressAttribute;
use rtnetlink::{Handle, LinkBridge, LinkDummy, LinkUnspec};

/// The interface's name (the contract with the service proxy).
pub const INTERFACE: &str = "skiff-dns0";

/// Netlink steps that failed (none is retried here; the caller decides).
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("opening a netlink socket: {0}")]
    ConnectFailed(std::io::Error),
    #[error("creating {INTERFACE}: {0}")]
    CreateFailed(rtnetlink::Error),
    #[error("netlink: {0}")]
    RequestFailed(#[from] rtnetlink::Error),
}

fn connect() -> Result<Handle, Error> {
    let (conn, handle, _) = rtnetlink::new_connection().map_err(Error::ConnectFailed)?;
    tokio::spawn(conn);
    Ok(handle)
}

async fn index(handle: &Handle) -> Result<Option<u32>, Error> {
    let mut links = handle
        .link()
        .get()
        .match_name(INTERFACE.to_string())
        .execute();
    match links.try_next().await {
        Ok(l) => Ok(l.map(|l| l.header.index)),
        // ENODEV: no such link.
        Err(rtnetlink::Error::NetlinkError(e)) if e.raw_code() == -19 => Ok(None),
        Err(e) => Err(e.into()),
    }
}

async fn addresses(
    handle: &Handle,
    index: u32,
) -> Result<Vec<(IpAddr, rtnetlink::packet_route::address::AddressMessage)>, Error> {
    let mut out = vec![];
    let mut msgs = handle
        .address()
        .get()
        .set_link_index_filter(index)
        .execute();
    while let Some(m) = msgs.try_next().await? {
        let ip = m.attributes.iter().find_map(|a| match a {
            AddressAttribute::Address(ip) => Some(*ip),
            _ => None,
        });
        if let Some(ip) = ip {
            out.push((ip, m));
        }
    }
    Ok(out)
}

/// Creates `skiff-dns0` if missing, sets it up and puts `ip` on it (a /32
/// or /128). Idempotent; other addresses on it (another cluster on the same
/// machine) are left alone.
pub async fn ensure(ip: IpAddr) -> Result<(), Error> {
    let handle = connect()?;
    let idx = match index(&handle).await? {
        Some(i) => i,
        None => {
            let mut r = handle
                .link()
                .add(LinkDummy::new(INTERFACE).build())
                .execute()
                .await;
            if matches!(&r, Err(rtnetlink::Error::NetlinkError(e)) if e.raw_code() == -95) {
                // EOPNOTSUPP: a kernel without the dummy driver. A bridge
                // without ports holds a local address just as well.
                tracing::info!(
                    "no dummy interfaces in this kernel; {INTERFACE} is a port-less bridge"
                );
                r = handle
                    .link()
                    .add(LinkBridge::new(INTERFACE).build())
                    .execute()
                    .await;
            }
            match r {
                Ok(()) => {}
                // EEXIST: another agent created it meanwhile.
                Err(rtnetlink::Error::NetlinkError(e)) if e.raw_code() == -17 => {}
                Err(e) => return Err(Error::CreateFailed(e)),
            }
            index(&handle)
                .await?
                .ok_or(Error::CreateFailed(rtnetlink::Error::RequestFailed))?
        }
    };
    handle
        .link()
        .set(LinkUnspec::new_with_index(idx).up().build())
        .execute()
        .await?;
    if !addresses(&handle, idx).await?.iter().any(|(a, _)| *a == ip) {
        let prefix = if ip.is_ipv4() { 32 } else { 128 };
        match handle.address().add(idx, ip, prefix).execute().await {
            Ok(()) => {}
            Err(rtnetlink::Error::NetlinkError(e)) if e.raw_code() == -17 => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

/// Takes `ip` off `skiff-dns0`, and removes the interface when no address
/// is left on it (`skiff down`). Nothing to do is not an error.
pub async fn remove(ip: IpAddr) -> Result<(), Error> {
    let handle = connect()?;
    let Some(idx) = index(&handle).await? else {
        return Ok(());
    };
    let addrs = addresses(&handle, idx).await?;
    for (a, msg) in &addrs {
        if *a == ip {
            handle.address().del(msg.clone()).execute().await?;
        }
    }
    if addrs.iter().all(|(a, _)| {
        *a == ip || a.is_ipv6() && matches!(a, IpAddr::V6(v6) if v6.segments()[0] == 0xfe80)
    }) {
        handle.link().del(idx).execute().await?;
    }
    Ok(())
}

/// The addresses on `skiff-dns0` (empty when it does not exist).
pub async fn list() -> Result<Vec<IpAddr>, Error> {
    let handle = connect()?;
    let Some(idx) = index(&handle).await? else {
        return Ok(vec![]);
    };
    Ok(addresses(&handle, idx)
        .await?
        .into_iter()
        .map(|(a, _)| a)
        .collect())
}
