//! Cluster DNS served by the agent itself, on every node: no pods, no
//! extra hop, nothing the cluster cannot lose.
//!
//! - [`records`]: the record index (Services and EndpointSlices) and the
//!   answers to queries, without I/O;
//! - [`server`]: the UDP/TCP responder on the cluster DNS address and its
//!   metrics on port 9153;
//! - [`forward`]: other names go to the host's upstream resolvers, cached;
//! - [`link`]: the `skiff-dns0` dummy interface holding the address;
//! - [`resolvconf`]: the pods' resolv.conf by `dnsPolicy`.
//!
//! The index is fed by the agent's own watches of Services and
//! EndpointSlices, one object at a time.

pub mod forward;
pub mod link;
pub mod records;
pub mod resolvconf;
pub mod server;

use std::collections::HashSet;
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::Api;
use kube::runtime::watcher;
use kube::ResourceExt;

pub use resolvconf::ClusterDns;

use records::{Index, ServiceRecord, SliceRecord, ZoneConfig};
use server::{Metrics, Responder};

/// TTL of cluster records (CoreDNS's default).
pub const TTL: u32 = 5;
/// Port of the metrics endpoint (CoreDNS's).
pub const METRICS_PORT: u16 = 9153;
/// The file in the agent's data dir naming the address it serves DNS on.
pub const ADDRESS_FILE: &str = "dns-address";

/// Finds the cluster DNS address when no flag gave it: the `kube-dns`
/// Service's ClusterIP (the API server creates it at start).
pub async fn discover(client: &kube::Client) -> Option<IpAddr> {
    let api: Api<Service> = Api::namespaced(client.clone(), "kube-system");
    for _ in 0..20 {
        if let Ok(Some(svc)) = api.get_opt("kube-dns").await {
            return svc
                .spec
                .and_then(|s| s.cluster_ip)
                .and_then(|ip| ip.parse().ok());
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    None
}

/// Keeps `index` equal to the cluster's Services.
pub async fn watch_services(client: kube::Client, index: Arc<RwLock<Index>>) {
    mirror::<Service>(
        client,
        index,
        "service",
        |ix, ns, name, s| ix.set_service(ns, name, ServiceRecord::from_service(s)),
        Index::delete_service,
    )
    .await
}

/// Keeps `index` equal to the cluster's EndpointSlices.
pub async fn watch_slices(client: kube::Client, index: Arc<RwLock<Index>>) {
    mirror::<EndpointSlice>(
        client,
        index,
        "endpointslice",
        |ix, ns, name, s| ix.set_slice(ns, name, SliceRecord::from_slice(s)),
        Index::delete_slice,
    )
    .await
}

/// Keeps the part of `index` that `set` and `delete` write equal to the
/// cluster's objects of kind `K`: each added or changed object is set, each
/// deleted one removed, and after a relist whatever it no longer has.
async fn mirror<K>(
    client: kube::Client,
    index: Arc<RwLock<Index>>,
    what: &str,
    set: fn(&mut Index, &str, &str, &K),
    delete: fn(&mut Index, &str, &str),
) where
    K: kube::Resource<DynamicType = ()>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug
        + Send
        + 'static,
{
    let api: Api<K> = Api::all(client);
    let mut stream = watcher(api, watcher::Config::default()).boxed();
    let mut known: HashSet<(String, String)> = HashSet::new();
    let mut listing: Option<HashSet<(String, String)>> = None;
    while let Some(ev) = stream.next().await {
        let ev = match ev {
            Ok(ev) => ev,
            Err(e) => {
                tracing::debug!(error = %e, "dns: {what} watch error");
                tokio::time::sleep(Duration::from_millis(500)).await;
                continue;
            }
        };
        let key = |o: &K| (o.namespace().unwrap_or_default(), o.name_any());
        match ev {
            watcher::Event::Init => listing = Some(HashSet::new()),
            watcher::Event::InitApply(o) | watcher::Event::Apply(o) => {
                let k = key(&o);
                if let Ok(mut ix) = index.write() {
                    set(&mut ix, &k.0, &k.1, &o);
                }
                if let Some(l) = listing.as_mut() {
                    l.insert(k.clone());
                }
                known.insert(k);
            }
            watcher::Event::Delete(o) => {
                let k = key(&o);
                if let Ok(mut ix) = index.write() {
                    delete(&mut ix, &k.0, &k.1);
                }
                known.remove(&k);
            }
            watcher::Event::InitDone => {
                let seen = listing.take().unwrap_or_default();
                if let Ok(mut ix) = index.write() {
                    for k in known.difference(&seen) {
                        delete(&mut ix, &k.0, &k.1);
                    }
                }
                known = seen;
            }
        }
    }
}

/// A responder for `dns`'s zone with the host's upstreams.
pub fn responder(dns: &ClusterDns) -> Arc<Responder> {
    let index = Index::new(ZoneConfig {
        domain: dns.domain.clone(),
        dns_ip: dns.ip,
        ttl: TTL,
    });
    let upstreams = forward::Forwarder::upstreams_of(&dns.host.nameservers);
    Arc::new(Responder {
        index: Arc::new(RwLock::new(index)),
        forwarder: Arc::new(forward::Forwarder::new(
            upstreams,
            Duration::from_secs(2),
            10_000,
        )),
        metrics: Arc::new(Metrics::default()),
    })
}

/// Serves cluster DNS with `responder` on `addr` (and metrics on
/// `metrics`), its index fed by watches through `client`, until cancelled.
pub async fn serve(
    client: kube::Client,
    responder: Arc<Responder>,
    addr: SocketAddr,
    metrics: Option<SocketAddr>,
) -> std::io::Result<()> {
    let (udp, tcp) = server::bind(addr).await?;
    let mut tasks = tokio::task::JoinSet::new();
    tasks.spawn(watch_services(client.clone(), responder.index.clone()));
    tasks.spawn(watch_slices(client, responder.index.clone()));
    let loops = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1)
        .min(4);
    tasks.spawn(server::serve_udp(responder.clone(), udp, loops));
    tasks.spawn(server::serve_tcp(responder.clone(), tcp));
    if let Some(m) = metrics {
        match tokio::net::TcpListener::bind(m).await {
            Ok(l) => {
                tasks.spawn(server::serve_metrics(responder.clone(), l));
            }
            Err(e) => tracing::warn!(addr = %m, error = %e, "dns metrics endpoint not served"),
        }
    }
    while tasks.join_next().await.is_some() {}
    Ok(())
}

/// The node's cluster DNS: puts the address on `skiff-dns0` and serves on
/// it, retrying while the address or port is unavailable (another
/// cluster's agent on the same machine holds it, say). Runs until
/// cancelled.
pub async fn run_node_local(client: kube::Client, dns: ClusterDns, data_dir: PathBuf) {
    let Some(ip) = dns.ip else { return };
    let mut warned = false;
    loop {
        let r = async {
            // Recorded first, so `skiff down` finds what to remove.
            let _ = std::fs::write(data_dir.join(ADDRESS_FILE), ip.to_string());
            link::ensure(ip).await.map_err(|e| e.to_string())?;
            let addr = SocketAddr::new(ip, 53);
            let metrics = SocketAddr::new(ip, METRICS_PORT);
            // The address can be taken away under a bound socket (an
            // administrator, another cluster's `skiff down` on the same
            // machine): put it back while serving.
            let keep = async {
                loop {
                    tokio::time::sleep(Duration::from_secs(10)).await;
                    if let Err(e) = link::ensure(ip).await {
                        tracing::debug!(error = %e, "re-adding the cluster DNS address");
                    }
                }
            };
            tokio::select! {
                r = serve(client.clone(), responder(&dns), addr, Some(metrics)) => {
                    r.map_err(|e| format!("serving DNS on {addr}: {e}"))
                }
                _ = keep => Ok(()),
            }
        }
        .await;
        if let Err(e) = r {
            if !warned {
                tracing::warn!(error = %e, "cluster DNS not served yet; retrying");
                warned = true;
            }
        }
        tokio::time::sleep(Duration::from_secs(5)).await;
    }
}

/// The agent's cluster DNS at start: the address (flag or kube-dns), the
/// domain, the host's resolver; with `serve`, the node-local responder in
/// `tasks`. Returns what pods' resolv.conf is built from.
pub async fn start(
    client: &kube::Client,
    options: &crate::AgentOptions,
    tasks: &mut tokio::task::JoinSet<()>,
) -> ClusterDns {
    let domain = options.cluster_domain.as_str();
    let serve = options.serve_dns;
    let ip = match options.cluster_dns {
        Some(ip) => Some(ip),
        None => discover(client).await,
    };
    let dns = ClusterDns {
        ip,
        domain: domain.trim_end_matches('.').to_string(),
        host: resolvconf::ResolvConf::of_host(),
    };
    if ip.is_none() {
        tracing::warn!("no cluster DNS address (no --cluster-dns, no kube-dns Service): pods use the host's resolv.conf");
    }
    if serve && ip.is_some() {
        tasks.spawn(run_node_local(
            client.clone(),
            dns.clone(),
            options.data_dir.clone(),
        ));
    }
    dns
}

/// Removes what [`run_node_local`] set up for the agent in `data_dir`: its
/// address on `skiff-dns0`, and the interface once it holds no other.
pub async fn teardown(data_dir: &std::path::Path) -> Result<(), link::Error> {
    let file = data_dir.join(ADDRESS_FILE);
    let Some(ip) = std::fs::read_to_string(&file)
        .ok()
        .and_then(|s| s.trim().parse::<IpAddr>().ok())
    else {
        return Ok(());
    };
    link::remove(ip).await?;
    let _ = std::fs::remove_file(file);
    Ok(())
}
