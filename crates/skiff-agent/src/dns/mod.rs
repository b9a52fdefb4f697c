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

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::Api;

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

/// The DNS index as a copy of one kind: `set` and `delete` are that kind's.
struct Records<K> {
    index: Arc<RwLock<Index>>,
    set: fn(&mut Index, &str, &str, &K),
    delete: fn(&mut Index, &str, &str),
}

impl<K: Send> crate::mirror::Copy<K> for Records<K> {
    fn set(&mut self, namespace: &str, name: &str, object: &K) {
        let mut ix = self.index.write().unwrap_or_else(|e| e.into_inner());
        (self.set)(&mut ix, namespace, name, object);
    }

    fn delete(&mut self, namespace: &str, name: &str) {
        let mut ix = self.index.write().unwrap_or_else(|e| e.into_inner());
        (self.delete)(&mut ix, namespace, name);
    }
}

/// Keeps `index` equal to the cluster's Services.
pub async fn watch_services(client: kube::Client, index: Arc<RwLock<Index>>) {
    let records = Records::<Service> {
        index,
        set: |ix, ns, name, s| ix.set_service(ns, name, ServiceRecord::from_service(s)),
        delete: Index::delete_service,
    };
    crate::mirror::mirror(client, "dns: service", records).await
}

/// Keeps `index` equal to the cluster's EndpointSlices.
pub async fn watch_slices(client: kube::Client, index: Arc<RwLock<Index>>) {
    let records = Records::<EndpointSlice> {
        index,
        set: |ix, ns, name, s| ix.set_slice(ns, name, SliceRecord::from_slice(s)),
        delete: Index::delete_slice,
    };
    crate::mirror::mirror(client, "dns: endpointslice", records).await
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
