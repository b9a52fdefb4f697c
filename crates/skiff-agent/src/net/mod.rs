//! Pod routing between nodes (skiff's flannel), run by every real agent: it
//! watches the Nodes and keeps, for every other node's podCIDR, a route via
//! that node's InternalIP when it is on this node's subnet (host-gw), else
//! through the `skiff.vxlan` VXLAN device (VTEP MACs published in the
//! [`VTEP_MAC_ANNOTATION`] of each Node), as `--flannel-backend` chooses.
//! Pod traffic leaving the cluster CIDR is masqueraded ([`masq`]). The
//! node's address (`--node-ip`, else the default route's interface) is
//! re-read on every sync, and a change is written to the Node.
//!
//! - [`plan`] decides the routes from data alone.
//! - [`link`] applies them with netlink.
//! - [`masq`] is the nftables masquerading table.
//!
//! Like the proxy, everything stays in the kernel when the agent stops
//! (fail-static); `skiff down` removes it ([`teardown`]).

pub mod link;
pub mod masq;
pub mod plan;

use std::collections::BTreeMap;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use futures::{FutureExt, StreamExt};
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::watcher;
use serde_json::json;
use tokio::sync::watch;

use plan::{Backend, Cidr, Local, Peer};

/// The Node annotation holding its VTEP MAC.
pub const VTEP_MAC_ANNOTATION: &str = "skiff.io/vtep-mac";
/// What [`teardown`] reads to know what to remove.
const STATE_FILE: &str = "network.json";

/// How the agent routes pods (None in AgentOptions: no routing, the CNI
/// bridge masquerades as on a lone node).
#[derive(Debug, Clone)]
pub struct Settings {
    pub backend: Backend,
    /// The cluster's pod range (`--cluster-cidr`).
    pub cluster_cidr: Cidr,
}

/// The MTU pods get on this node: the link's minus the VXLAN overhead
/// unless only direct routes are used (flannel does the same).
pub async fn pod_mtu(settings: &Settings, node_ip: Option<Ipv4Addr>) -> Option<u32> {
    if settings.backend == Backend::HostGw {
        return None;
    }
    let handle = link::connect().ok()?;
    let a = link::node_address(&handle, node_ip).await.ok()?;
    Some(a.mtu.saturating_sub(link::VXLAN_OVERHEAD))
}

/// The node's IPv4 address by netlink: `want` if configured on an
/// interface, else the default route's interface's.
pub async fn detect_node_ip(want: Option<Ipv4Addr>) -> Option<Ipv4Addr> {
    let handle = link::connect().ok()?;
    link::node_address(&handle, want).await.ok().map(|a| a.ip)
}

/// Runs pod routing for the agent (its one entry point in `run`): never
/// returns; failures are logged and retried.
pub async fn run_for_agent(
    client: kube::Client,
    node_name: String,
    node_ip: Option<Ipv4Addr>,
    data_dir: PathBuf,
    settings: Settings,
    address: watch::Sender<String>,
) {
    let table = masq::table_name(&data_dir);
    let _ = std::fs::write(
        data_dir.join(STATE_FILE),
        json!({"clusterCIDR": settings.cluster_cidr.to_string(), "table": table}).to_string(),
    );
    let nodes: Api<Node> = Api::all(client.clone());
    let mut stream = watcher(nodes.clone(), watcher::Config::default()).boxed();
    let mut known: BTreeMap<String, Node> = BTreeMap::new();
    let mut listing: Option<BTreeMap<String, Node>> = None;
    let mut synced = false;
    let mut r = Reconciler {
        node_name,
        node_ip,
        settings,
        table,
        masq_done: false,
        published: None,
        last_error: None,
        last_unreachable: vec![],
        nodes,
        address,
    };
    let mut tick = tokio::time::interval(Duration::from_secs(5));
    loop {
        let first = tokio::select! {
            ev = stream.next() => Some(ev),
            _ = tick.tick() => None,
        };
        if let Some(mut ev) = first {
            // Take every event already queued, then sync once.
            loop {
                match ev {
                    None => return,
                    Some(Err(e)) => {
                        // The API server is away: routes stay as they are.
                        tracing::debug!(error = %e, "node watch error");
                        tokio::time::sleep(Duration::from_millis(500)).await;
                        break;
                    }
                    Some(Ok(e)) => apply_event(e, &mut known, &mut listing, &mut synced),
                }
                match stream.next().now_or_never() {
                    Some(next) => ev = next,
                    None => break,
                }
            }
        }
        if synced {
            r.sync(&known).await;
        }
    }
}

fn apply_event(
    ev: watcher::Event<Node>,
    known: &mut BTreeMap<String, Node>,
    listing: &mut Option<BTreeMap<String, Node>>,
    synced: &mut bool,
) {
    match ev {
        watcher::Event::Init => *listing = Some(BTreeMap::new()),
        watcher::Event::InitApply(n) => {
            if let Some(name) = n.metadata.name.clone() {
                listing.get_or_insert_with(BTreeMap::new).insert(name, n);
            }
        }
        watcher::Event::InitDone => {
            *known = listing.take().unwrap_or_default();
            *synced = true;
        }
        watcher::Event::Apply(n) => {
            if let Some(name) = n.metadata.name.clone() {
                known.insert(name, n);
            }
        }
        watcher::Event::Delete(n) => {
            if let Some(name) = &n.metadata.name {
                known.remove(name);
            }
        }
    }
}

struct Reconciler {
    node_name: String,
    node_ip: Option<Ipv4Addr>,
    settings: Settings,
    table: String,
    masq_done: bool,
    /// The (address, VTEP MAC) last written to the Node.
    published: Option<(Ipv4Addr, Option<String>)>,
    last_error: Option<String>,
    last_unreachable: Vec<(String, String)>,
    nodes: Api<Node>,
    address: watch::Sender<String>,
}

/// A Node's InternalIP (v4).
pub fn internal_ip(n: &Node) -> Option<Ipv4Addr> {
    n.status
        .as_ref()?
        .addresses
        .as_ref()?
        .iter()
        .find(|a| a.type_ == "InternalIP" && a.address.parse::<Ipv4Addr>().is_ok())?
        .address
        .parse()
        .ok()
}

/// The peers a set of Nodes gives (those with an address and a podCIDR).
pub fn peers(nodes: &BTreeMap<String, Node>, this: &str) -> Vec<Peer> {
    nodes
        .iter()
        .filter(|(name, _)| name.as_str() != this)
        .filter_map(|(name, n)| {
            let cidr = n.spec.as_ref()?.pod_cidr.as_deref().and_then(Cidr::parse)?;
            Some(Peer {
                name: name.clone(),
                ip: internal_ip(n)?,
                pod_cidr: cidr,
                vtep_mac: n
                    .metadata
                    .annotations
                    .as_ref()
                    .and_then(|a| a.get(VTEP_MAC_ANNOTATION))
                    .and_then(|m| plan::parse_mac(m)),
            })
        })
        .collect()
}

impl Reconciler {
    async fn sync(&mut self, nodes: &BTreeMap<String, Node>) {
        if let Err(e) = self.try_sync(nodes).await {
            if self.last_error.as_deref() != Some(e.as_str()) {
                tracing::warn!(error = %e, "pod routes not in place yet; retrying");
                self.last_error = Some(e);
            }
        } else if self.last_error.take().is_some() {
            tracing::info!("pod routes in place");
        }
    }

    async fn try_sync(&mut self, nodes: &BTreeMap<String, Node>) -> Result<(), String> {
        let cluster = self.settings.cluster_cidr;
        if !self.masq_done {
            masq::apply(&self.table, &cluster)
                .await
                .map_err(|e| format!("masquerading rules: {e}"))?;
            self.masq_done = true;
        }
        let handle = link::connect().map_err(|e| e.to_string())?;
        let addr = link::node_address(&handle, self.node_ip)
            .await
            .map_err(|e| e.to_string())?;
        self.publish(&addr.ip).await?;
        let own_cidr = nodes
            .get(&self.node_name)
            .and_then(|n| n.spec.as_ref()?.pod_cidr.as_deref().and_then(Cidr::parse));
        let local = Local {
            ip: addr.ip,
            subnet: addr.subnet,
            pod_cidr: own_cidr,
        };
        let peers = peers(nodes, &self.node_name);
        let desired = plan::plan(&local, &peers, self.settings.backend);
        if desired.unreachable != self.last_unreachable {
            for (node, why) in &desired.unreachable {
                tracing::warn!(node, reason = %why, "no route to the pods of a node");
            }
            self.last_unreachable = desired.unreachable.clone();
        }
        let vxlan = match (desired.vxlan, own_cidr) {
            (true, Some(own)) => {
                let mac = plan::vtep_mac(&self.node_name);
                let index = link::ensure_vxlan(&handle, &addr, mac, plan::vtep_address(&own))
                    .await
                    .map_err(|e| e.to_string())?;
                link::sync_vxlan_entries(&handle, index, &desired.vxlan_entries())
                    .await
                    .map_err(|e| e.to_string())?;
                Some(index)
            }
            _ => {
                link::delete_vxlan(&handle)
                    .await
                    .map_err(|e| e.to_string())?;
                None
            }
        };
        link::sync_routes(&handle, &cluster, &desired, vxlan)
            .await
            .map_err(|e| e.to_string())
    }

    /// Writes the node's address (when it changed) and VTEP MAC to the Node.
    async fn publish(&mut self, ip: &Ipv4Addr) -> Result<(), String> {
        let mac = (self.settings.backend != Backend::HostGw)
            .then(|| plan::format_mac(&plan::vtep_mac(&self.node_name)));
        let want = (*ip, mac.clone());
        if self.published.as_ref() == Some(&want) {
            return Ok(());
        }
        let ip_changed = self.published.as_ref().is_some_and(|(old, _)| old != ip)
            || *self.address.borrow() != ip.to_string();
        if let Some(mac) = &mac {
            self.nodes
                .patch(
                    &self.node_name,
                    &PatchParams::default(),
                    &Patch::Merge(json!({"metadata": {"annotations": {VTEP_MAC_ANNOTATION: mac}}})),
                )
                .await
                .map_err(|e| format!("publishing the VTEP MAC: {e}"))?;
        }
        if ip_changed {
            tracing::info!(address = %ip, "the node's address changed");
            // The status writer reports it from now on; write it at once so
            // peers re-route without waiting for the next heartbeat.
            let _ = self.address.send(ip.to_string());
            let hostname = self
                .nodes
                .get_opt(&self.node_name)
                .await
                .ok()
                .flatten()
                .and_then(|n| {
                    n.status?
                        .addresses?
                        .into_iter()
                        .find(|a| a.type_ == "Hostname")
                        .map(|a| a.address)
                })
                .unwrap_or_else(|| self.node_name.clone());
            self.nodes
                .patch_status(
                    &self.node_name,
                    &PatchParams::default(),
                    &Patch::Merge(json!({"status": {"addresses": [
                        {"type": "InternalIP", "address": ip.to_string()},
                        {"type": "Hostname", "address": hostname},
                    ]}})),
                )
                .await
                .map_err(|e| format!("writing the node's address: {e}"))?;
        }
        self.published = Some(want);
        Ok(())
    }
}

/// Removes what [`run_for_agent`] set up for the agent in `data_dir`: its
/// routes, the VXLAN device, the masquerading table (`skiff down`).
pub async fn teardown(data_dir: &Path) -> Result<(), String> {
    let file = data_dir.join(STATE_FILE);
    let Ok(text) = std::fs::read_to_string(&file) else {
        return Ok(());
    };
    let v: serde_json::Value = serde_json::from_str(&text).map_err(|e| e.to_string())?;
    let cluster = v["clusterCIDR"]
        .as_str()
        .and_then(Cidr::parse)
        .ok_or("no cluster CIDR in the network state")?;
    let table = v["table"].as_str().unwrap_or(masq::TABLE).to_string();
    let handle = link::connect().map_err(|e| e.to_string())?;
    link::remove_routes(&handle, &cluster)
        .await
        .map_err(|e| e.to_string())?;
    link::delete_vxlan(&handle)
        .await
        .map_err(|e| e.to_string())?;
    masq::delete(&table).await?;
    let _ = std::fs::remove_file(file);
    Ok(())
}
