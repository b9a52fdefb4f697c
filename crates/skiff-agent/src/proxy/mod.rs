//! The service proxy (skiff's kube-proxy, nftables mode), run by every real
//! agent: it watches Services and EndpointSlices and programs skiff's own
//! nftables tables (`ip skiff-proxy` and its service shards
//! `skiff-proxy-svc0..63`) so ClusterIPs, NodePorts, externalIPs
//! and LoadBalancer IPs reach ready endpoints.
//!
//! - [`model`] decides, from data alone, what each service port needs.
//! - [`rules`] renders that as nftables objects and diffs two versions.
//! - [`nft`] applies a diff as one nftables transaction (by default as
//!   netlink batches of [`netlink`]; `SKIFF_NFT_BACKEND=nft`: `nft -j -f -`
//!   with the `nftables` crate's JSON), and flushes stale UDP conntrack
//!   entries.
//!
//! The table is replaced whole once the first lists of Services and
//! EndpointSlices are complete; after that a change touches only the
//! service it belongs to. A failed transaction changes nothing in the
//! kernel; the proxy then retries with a full resync. Rules stay when the
//! agent stops (fail-static); `skiff down` deletes the tables.
//! [`lb`] is the small LoadBalancer controller (ServiceLB-like) that gives
//! LoadBalancer services the nodes' addresses.

pub mod health;
pub mod lb;
pub mod model;
pub mod netlink;
pub mod nft;
pub mod policy;
pub mod rules;

use std::collections::{BTreeSet, HashMap};
use std::net::Ipv4Addr;
use std::time::{Duration, Instant};

use futures::{FutureExt, StreamExt};
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::Api;
use kube::runtime::watcher;

use model::{NodeFacts, PortPlan, Protocol, Skip};
use rules::PortRules;

/// The proxy's table name (ip family) for an agent in the default data dir.
pub const TABLE: &str = "skiff-proxy";

/// The table of the agent keeping its data in `data_dir`: `skiff-proxy`
/// for the default (`/var/lib/skiff/agent`), else `skiff-proxy-<hash>`, so
/// several clusters on one machine (tests) never replace each other's.
pub fn table_name(data_dir: &std::path::Path) -> String {
    if data_dir == std::path::Path::new("/var/lib/skiff/agent") {
        return TABLE.to_string();
    }
    let d = ring::digest::digest(&ring::digest::SHA256, data_dir.to_string_lossy().as_bytes());
    let hex: String = d.as_ref()[..4].iter().map(|b| format!("{b:02x}")).collect();
    format!("{TABLE}-{hex}")
}

/// What an agent's options say about its proxy (None: no proxy).
#[derive(Debug, Clone, Default)]
pub struct Settings {
    /// The cluster's pod range (`--cluster-cidr`), for masquerading
    /// off-cluster traffic to ClusterIPs.
    pub cluster_cidr: Option<String>,
    /// The node's address as pod routing re-detects it (NodePorts follow
    /// it); None: the address given at start stays.
    pub address: Option<tokio::sync::watch::Receiver<String>>,
}

/// Starts the proxy of a real agent (its one entry point in `run`); logs
/// and returns if it cannot run.
pub async fn run_for_agent(
    client: kube::Client,
    node_name: String,
    node_ip: String,
    data_dir: std::path::PathBuf,
    settings: Settings,
) {
    let cluster_cidr = settings.cluster_cidr.as_deref().and_then(|c| {
        let (ip, bits) = c.split_once('/')?;
        Some((ip.parse().ok()?, bits.parse().ok()?))
    });
    let lb_client = client.clone();
    let identity = node_name.clone();
    // A lost lease (a server failing over, the API unreachable past the
    // renew deadline) stops the controller; it campaigns again.
    let service_lb = async move {
        loop {
            let r = skiff_kube::leader::run_elected(
                lb_client.clone(),
                "skiff-service-lb",
                &identity,
                Default::default(),
                lb::run(lb_client.clone()),
            )
            .await;
            match r {
                Ok(()) => return,
                Err(e) => {
                    tracing::warn!(error = %e, "the LoadBalancer controller stopped; campaigning again")
                }
            }
            tokio::time::sleep(std::time::Duration::from_secs(2)).await;
        }
    };
    let options = ProxyOptions {
        node: NodeFacts {
            name: node_name,
            ips: node_ip.parse().into_iter().collect(),
            cluster_cidr,
        },
        table: table_name(&data_dir),
    };
    let (policy_tx, policy_rx) = tokio::sync::watch::channel(None);
    let policies = policy::run(client.clone(), options.node.name.clone(), policy_tx);
    let proxy = async move {
        let progress = tokio::sync::watch::channel(Sync::default()).0;
        let r = run_with_policy(client, options, progress, Some(policy_rx), settings.address).await;
        if let Err(e) = r {
            tracing::error!(error = %e, "the service proxy stopped");
        }
    };
    tokio::join!(proxy, service_lb, policies);
}

/// Settings of the proxy in one agent.
#[derive(Debug, Clone)]
pub struct ProxyOptions {
    pub node: NodeFacts,
    /// The nftables table to own (tests use their own).
    pub table: String,
}

type Key = (String, String);

/// The key NetworkPolicy's objects are kept under beside the services'
/// (no Service has an empty namespace).
fn policy_key() -> Key {
    (String::new(), "networkpolicy".into())
}

/// The cluster state the proxy works from.
#[derive(Default)]
struct State {
    services: HashMap<Key, Service>,
    /// NetworkPolicy's objects as [`policy`] last rendered them.
    policy: PortRules,
    /// (namespace, slice name) → slice.
    slices: HashMap<Key, EndpointSlice>,
    /// (namespace, service name) → its slices' names.
    by_service: HashMap<Key, BTreeSet<String>>,
}

/// The table a key's objects live in: NetworkPolicy's in the main table,
/// each service's in its shard.
fn home_of(key: &Key) -> rules::Home {
    if key.0.is_empty() {
        rules::Home::Main
    } else {
        rules::shard_of(&key.0, &key.1)
    }
}

fn key_of(ns: Option<&String>, name: Option<&String>) -> Key {
    (
        ns.cloned().unwrap_or_default(),
        name.cloned().unwrap_or_default(),
    )
}

fn slice_service(s: &EndpointSlice) -> Option<Key> {
    let svc = s
        .metadata
        .labels
        .as_ref()?
        .get(model::SERVICE_NAME_LABEL)?
        .clone();
    Some((s.metadata.namespace.clone().unwrap_or_default(), svc))
}

impl State {
    /// Records a slice; returns the services it belonged to and belongs to.
    fn put_slice(&mut self, s: EndpointSlice) -> Vec<Key> {
        let k = key_of(s.metadata.namespace.as_ref(), s.metadata.name.as_ref());
        let mut touched = self.remove_slice(&k);
        if let Some(svc) = slice_service(&s) {
            self.by_service
                .entry(svc.clone())
                .or_default()
                .insert(k.1.clone());
            touched.push(svc);
        }
        self.slices.insert(k, s);
        touched
    }

    fn remove_slice(&mut self, k: &Key) -> Vec<Key> {
        let Some(old) = self.slices.remove(k) else {
            return vec![];
        };
        let Some(svc) = slice_service(&old) else {
            return vec![];
        };
        if let Some(set) = self.by_service.get_mut(&svc) {
            set.remove(&k.1);
            if set.is_empty() {
                self.by_service.remove(&svc);
            }
        }
        vec![svc]
    }

    /// The plans of a service's ports, or why it has none.
    fn plan(&self, key: &Key, node: &NodeFacts) -> Result<Vec<PortPlan>, Skip> {
        let Some(svc) = self.services.get(key) else {
            return Err(Skip::NotProxied);
        };
        let slices: Vec<&EndpointSlice> = self
            .by_service
            .get(key)
            .into_iter()
            .flatten()
            .filter_map(|n| self.slices.get(&(key.0.clone(), n.clone())))
            .collect();
        model::plan_service(svc, &slices, node)
    }
}

/// What is in the kernel, per service.
#[derive(Default)]
struct Applied {
    rules: HashMap<Key, PortRules>,
    plans: HashMap<Key, Vec<PortPlan>>,
    /// Endpoints whose `hairpin` pair is in the kernel. Pairs are added as
    /// endpoints appear and dropped only by a full resync: a stale pair is
    /// harmless (only DNAT to that address makes a packet match it), and
    /// element deletions cost a dump of the set in nft.
    hairpin: BTreeSet<Ipv4Addr>,
    /// The `hairpin` set's size, fixed at the last full resync.
    hairpin_capacity: usize,
}

/// The objects and plans of one service (empty when it is not proxied).
fn service_objects(
    state: &State,
    key: &Key,
    node: &NodeFacts,
    shape: rules::Shape,
    warned: &mut HashMap<Key, String>,
) -> (PortRules, Vec<PortPlan>) {
    if *key == policy_key() {
        return (state.policy.clone(), vec![]);
    }
    match state.plan(key, node) {
        Ok(plans) => {
            warned.remove(key);
            let mut r = PortRules::default();
            for p in &plans {
                r.extend(rules::port_rules_shaped(p, node.cluster_cidr, shape));
            }
            (r, plans)
        }
        Err(Skip::NotProxied) => (PortRules::default(), vec![]),
        Err(Skip::Unsupported(why)) => {
            if warned.get(key) != Some(&why) {
                tracing::warn!(service = %format!("{}/{}", key.0, key.1), reason = %why, "service not programmed: the dataplane cannot express it");
                warned.insert(key.clone(), why.clone());
                if let Some(svc) = state.services.get(key) {
                    report_unsupported(svc, why);
                }
            }
            (PortRules::default(), vec![])
        }
    }
}

/// The Event a Service the dataplane cannot express gets (one per agent
/// and reason; the recorder aggregates repeats into a series).
fn report_unsupported(svc: &Service, why: String) {
    let Some(recorder) = RECORDER.get().cloned() else {
        return;
    };
    let reference = k8s_openapi::api::core::v1::ObjectReference {
        api_version: Some("v1".into()),
        kind: Some("Service".into()),
        name: svc.metadata.name.clone(),
        namespace: svc.metadata.namespace.clone(),
        uid: svc.metadata.uid.clone(),
        resource_version: svc.metadata.resource_version.clone(),
        field_path: None,
    };
    tokio::spawn(async move {
        let ev = kube::runtime::events::Event {
            type_: kube::runtime::events::EventType::Warning,
            reason: "UnsupportedService".into(),
            note: Some(format!("the service proxy cannot program it: {why}")),
            action: "Program".into(),
            secondary: None,
        };
        if let Err(e) = recorder.publish(&ev, &reference).await {
            tracing::debug!(error = %e, "recording an event");
        }
    });
}

static RECORDER: std::sync::OnceLock<kube::runtime::events::Recorder> = std::sync::OnceLock::new();

/// Which service holds each map key (an address, protocol and port, or a
/// NodePort). Two services claiming one (the same externalIP and port, say)
/// would make nftables refuse the whole transaction, so the first keeps it
/// and the other is reported.
#[derive(Default)]
struct Owners(HashMap<rules::MapKey, Key>);

impl Owners {
    fn release(&mut self, key: &Key) {
        self.0.retain(|_, k| k != key);
    }

    fn claim(&mut self, key: &Key, r: &mut PortRules) {
        r.elements.retain(|(_, mk), _| match self.0.get(mk) {
            Some(owner) if owner != key => {
                tracing::warn!(service = %format!("{}/{}", key.0, key.1), address = %mk, owner = %format!("{}/{}", owner.0, owner.1), "address and port already used by another service; not programmed");
                false
            }
            _ => true,
        });
        for (_, mk) in r.elements.keys() {
            self.0.insert(mk.clone(), key.clone());
        }
    }
}

/// Enables what routing to service endpoints needs on the node: forwarding,
/// and bridged pod-to-pod replies through netfilter so their DNAT is undone.
fn prepare_kernel() {
    for (path, v) in [
        ("/proc/sys/net/ipv4/ip_forward", "1"),
        ("/proc/sys/net/bridge/bridge-nf-call-iptables", "1"),
    ] {
        if !std::fs::read_to_string(path).is_ok_and(|s| s.trim() == v) {
            if let Err(e) = std::fs::write(path, v) {
                tracing::warn!(path, error = %e, "cannot enable a setting the service proxy needs");
            }
        }
    }
}

/// One observation the benchmark and tests can wait for: how long the last
/// transaction took and how many services it touched.
#[derive(Debug, Clone, Copy, Default)]
pub struct Sync {
    pub generation: u64,
    pub services: usize,
    pub elapsed: Duration,
    /// The part of `elapsed` spent in nft (the transaction itself).
    pub nft: Duration,
    pub full: bool,
}

/// Runs the proxy until the client's watches end (they retry forever).
pub async fn run(client: kube::Client, options: ProxyOptions) -> anyhow::Result<()> {
    run_with_progress(
        client,
        options,
        tokio::sync::watch::channel(Sync::default()).0,
    )
    .await
}

/// [`run`], reporting each applied transaction on `progress`.
pub async fn run_with_progress(
    client: kube::Client,
    options: ProxyOptions,
    progress: tokio::sync::watch::Sender<Sync>,
) -> anyhow::Result<()> {
    run_with_policy(client, options, progress, None, None).await
}

/// [`run_with_progress`], also programming the NetworkPolicy objects
/// [`policy::run`] sends on `policy` (nothing is programmed before its
/// first rendering, so a restart never opens what policies closed).
pub async fn run_with_policy(
    client: kube::Client,
    options: ProxyOptions,
    progress: tokio::sync::watch::Sender<Sync>,
    mut policy: Option<tokio::sync::watch::Receiver<Option<std::sync::Arc<PortRules>>>>,
    mut address: Option<tokio::sync::watch::Receiver<String>>,
) -> anyhow::Result<()> {
    prepare_kernel();
    let policy_enabled = policy.is_some();
    let mut policy_ready = false;
    // Services are not held hostage by policies: if none could be rendered
    // in this time (the API server serves no NetworkPolicies, or RBAC
    // refuses them), services are programmed without them.
    let policy_deadline = tokio::time::Instant::now() + Duration::from_secs(15);
    let mut policy_waived = false;
    let mut node = options.node.clone();
    let _ = RECORDER.set(kube::runtime::events::Recorder::new(
        client.clone(),
        kube::runtime::events::Reporter {
            controller: "skiff-proxy".into(),
            instance: Some(node.name.clone()),
        },
    ));
    let nft = nft::Nft::new(&options.table).with_cluster_cidr(node.cluster_cidr);
    let shape = nft.backend().shape();
    let services: Api<Service> = Api::all(client.clone());
    let slices: Api<EndpointSlice> = Api::all(client.clone());
    let mut svc_stream = watcher(services, watcher::Config::default()).boxed();
    let mut slice_stream = watcher(slices, watcher::Config::default()).boxed();

    let mut state = State::default();
    // Relists fill these and replace the state at InitDone.
    let mut svc_listing: Option<HashMap<Key, Service>> = None;
    let mut slice_listing: Option<Vec<EndpointSlice>> = None;
    let mut svc_synced = false;
    let mut slice_synced = false;
    let mut applied = Applied::default();
    let mut dirty: BTreeSet<Key> = BTreeSet::new();
    let mut need_full = true;
    let mut warned: HashMap<Key, String> = HashMap::new();
    let mut owners = Owners::default();
    // Health check node ports, per service (few), and their listeners.
    let mut health_by_service: HashMap<Key, std::collections::BTreeMap<u16, health::Report>> =
        HashMap::new();
    let mut health_servers = health::Servers::default();
    let mut generation = 0u64;
    let mut retry_at: Option<tokio::time::Instant> = policy_enabled.then_some(policy_deadline);
    let mut failures = 0u32;

    loop {
        // Wait for at least one event (or a retry), then take every event
        // already queued so a burst becomes one transaction.
        let mut first = true;
        loop {
            let ev = if first {
                let retry = async {
                    match retry_at {
                        Some(t) => tokio::time::sleep_until(t).await,
                        None => std::future::pending().await,
                    }
                };
                let policy_changed = async {
                    match policy.as_mut() {
                        Some(rx) => rx.changed().await.is_ok(),
                        None => std::future::pending().await,
                    }
                };
                let address_changed = async {
                    match address.as_mut() {
                        Some(rx) => rx.changed().await.is_ok(),
                        None => std::future::pending().await,
                    }
                };
                tokio::select! {
                    alive = address_changed => {
                        match address.as_mut().filter(|_| alive) {
                            Some(rx) => {
                                let ips: Vec<Ipv4Addr> =
                                    rx.borrow_and_update().parse().into_iter().collect();
                                if ips != node.ips {
                                    // NodePorts answer on the new address:
                                    // every plan depends on it.
                                    node.ips = ips;
                                    need_full = true;
                                }
                            }
                            None => address = None,
                        }
                        break;
                    }
                    e = svc_stream.next() => Some(Either::Svc(e)),
                    e = slice_stream.next() => Some(Either::Slice(e)),
                    alive = policy_changed => {
                        match policy.as_mut().filter(|_| alive) {
                            Some(rx) => {
                                if let Some(r) = rx.borrow_and_update().clone() {
                                    state.policy = (*r).clone();
                                    policy_ready = true;
                                    dirty.insert(policy_key());
                                }
                            }
                            // The policy task ended: keep its last rules.
                            None => policy = None,
                        }
                        break;
                    }
                    _ = retry => None,
                }
            } else {
                match svc_stream.next().now_or_never() {
                    Some(e) => Some(Either::Svc(e)),
                    None => slice_stream.next().now_or_never().map(Either::Slice),
                }
            };
            first = false;
            let Some(ev) = ev else { break };
            match ev {
                Either::Svc(None) | Either::Slice(None) => return Ok(()),
                Either::Svc(Some(Err(e))) | Either::Slice(Some(Err(e))) => {
                    // The API server is away: the rules stay as they are.
                    tracing::debug!(error = %e, "service proxy watch error");
                    tokio::time::sleep(Duration::from_millis(500)).await;
                    break;
                }
                Either::Svc(Some(Ok(ev))) => match ev {
                    watcher::Event::Init => svc_listing = Some(HashMap::new()),
                    watcher::Event::InitApply(s) => {
                        let k = key_of(s.metadata.namespace.as_ref(), s.metadata.name.as_ref());
                        svc_listing.get_or_insert_with(HashMap::new).insert(k, s);
                    }
                    watcher::Event::InitDone => {
                        let list = svc_listing.take().unwrap_or_default();
                        dirty.extend(state.services.keys().cloned());
                        dirty.extend(list.keys().cloned());
                        state.services = list;
                        svc_synced = true;
                    }
                    watcher::Event::Apply(s) => {
                        let k = key_of(s.metadata.namespace.as_ref(), s.metadata.name.as_ref());
                        state.services.insert(k.clone(), s);
                        dirty.insert(k);
                    }
                    watcher::Event::Delete(s) => {
                        let k = key_of(s.metadata.namespace.as_ref(), s.metadata.name.as_ref());
                        state.services.remove(&k);
                        dirty.insert(k);
                    }
                },
                Either::Slice(Some(Ok(ev))) => match ev {
                    watcher::Event::Init => slice_listing = Some(vec![]),
                    watcher::Event::InitApply(s) => {
                        slice_listing.get_or_insert_with(Vec::new).push(s);
                    }
                    watcher::Event::InitDone => {
                        let list = slice_listing.take().unwrap_or_default();
                        dirty.extend(state.by_service.keys().cloned());
                        state.slices.clear();
                        state.by_service.clear();
                        for s in list {
                            dirty.extend(state.put_slice(s));
                        }
                        slice_synced = true;
                    }
                    watcher::Event::Apply(s) => dirty.extend(state.put_slice(s)),
                    watcher::Event::Delete(s) => {
                        let k = key_of(s.metadata.namespace.as_ref(), s.metadata.name.as_ref());
                        dirty.extend(state.remove_slice(&k));
                    }
                },
            }
        }
        if retry_at == Some(policy_deadline) && tokio::time::Instant::now() >= policy_deadline {
            // That wake-up was only the policy deadline (no failure to retry).
            retry_at = None;
        }
        if policy_enabled
            && !policy_ready
            && !policy_waived
            && tokio::time::Instant::now() >= policy_deadline
        {
            tracing::warn!("no NetworkPolicy rendering yet (cannot list networkpolicies, pods or namespaces?); programming services without policies");
            policy_waived = true;
        }
        if !(svc_synced && slice_synced && (policy_ready || !policy_enabled || policy_waived)) {
            // Never program a partial view: services without their slices
            // would reject traffic that has endpoints.
            continue;
        }
        if retry_at.is_some_and(|t| t <= tokio::time::Instant::now()) {
            retry_at = None;
            need_full = true;
        }
        if !need_full && dirty.is_empty() {
            continue;
        }
        let started = Instant::now();
        let nft_time;
        let result = if need_full {
            let mut next = Applied::default();
            owners = Owners::default();
            let pk = policy_key();
            let mut keys: BTreeSet<&Key> = state.services.keys().collect();
            if policy_ready {
                keys.insert(&pk);
            }
            for k in keys {
                let (mut r, p) = service_objects(&state, k, &node, shape, &mut warned);
                owners.claim(k, &mut r);
                next.rules.insert(k.clone(), r);
                next.plans.insert(k.clone(), p);
            }
            let n = next.rules.len();
            for r in next.rules.values() {
                next.hairpin.extend(r.endpoints.iter().copied());
            }
            next.hairpin_capacity = rules::hairpin_capacity(next.hairpin.len()) as usize;
            let all: Vec<(rules::Home, &PortRules)> =
                next.rules.iter().map(|(k, r)| (home_of(k), r)).collect();
            let t = Instant::now();
            let r = nft.replace_all(&node.ips, &all).await;
            nft_time = t.elapsed();
            match r {
                Ok(()) => {
                    flush_udp_changes(&applied.plans, &next.plans).await;
                    applied = next;
                    Ok((n, true))
                }
                Err(e) => Err(e),
            }
        } else {
            let mut ops = vec![];
            let mut next_rules = vec![];
            for k in &dirty {
                owners.release(k);
                let (mut r, p) = service_objects(&state, k, &node, shape, &mut warned);
                owners.claim(k, &mut r);
                let empty = PortRules::default();
                let old = applied.rules.get(k).unwrap_or(&empty);
                let home = home_of(k);
                ops.extend(rules::diff(old, &r).into_iter().map(|op| (home, op)));
                next_rules.push((k.clone(), r, p));
            }
            let new_pairs: BTreeSet<Ipv4Addr> = next_rules
                .iter()
                .flat_map(|(_, r, _)| r.endpoints.iter().copied())
                .filter(|ip| !applied.hairpin.contains(ip))
                .collect();
            if applied.hairpin.len() + new_pairs.len() > applied.hairpin_capacity {
                // The set is full (pairs of gone endpoints stay until a
                // full resync): make one now, which sizes it anew.
                need_full = true;
                retry_at = Some(tokio::time::Instant::now());
                continue;
            }
            ops.extend(
                new_pairs
                    .iter()
                    .map(|ip| (rules::Home::Main, rules::Op::AddHairpin(*ip))),
            );
            ops.sort_by_key(|(_, op)| op.phase());
            let t = Instant::now();
            let r = nft.apply(&ops).await;
            nft_time = t.elapsed();
            match r {
                Ok(()) => {
                    applied.hairpin.extend(new_pairs);
                    let mut old_plans = HashMap::new();
                    let mut new_plans = HashMap::new();
                    for (k, r, p) in next_rules.iter().cloned() {
                        if let Some(o) = applied.plans.remove(&k) {
                            old_plans.insert(k.clone(), o);
                        }
                        new_plans.insert(k.clone(), p.clone());
                        if state.services.contains_key(&k) || k == policy_key() {
                            applied.rules.insert(k.clone(), r);
                            applied.plans.insert(k, p);
                        } else {
                            applied.rules.remove(&k);
                        }
                    }
                    flush_udp_changes(&old_plans, &new_plans).await;
                    Ok((next_rules.len(), false))
                }
                Err(e) => Err(e),
            }
        };
        match result {
            Ok((n, full)) => {
                let keys: Vec<Key> = if full {
                    health_by_service.clear();
                    applied.plans.keys().cloned().collect()
                } else {
                    dirty.iter().cloned().collect()
                };
                let mut health_changed = false;
                for k in keys {
                    let want = applied
                        .plans
                        .get(&k)
                        .map(|p| health::desired(p.iter()))
                        .unwrap_or_default();
                    let old = if want.is_empty() {
                        health_by_service.remove(&k)
                    } else {
                        health_by_service.insert(k, want.clone())
                    };
                    if old.unwrap_or_default() != want {
                        health_changed = true;
                    }
                }
                if health_changed || full {
                    health_servers.update(
                        health_by_service
                            .values()
                            .flat_map(|m| m.iter().map(|(p, r)| (*p, r.clone())))
                            .collect(),
                    );
                }
                dirty.clear();
                failures = 0;
                need_full = false;
                generation += 1;
                let s = Sync {
                    generation,
                    services: n,
                    elapsed: started.elapsed(),
                    nft: nft_time,
                    full,
                };
                tracing::debug!(?s, "service rules applied");
                let _ = progress.send(s);
            }
            Err(e) => {
                // Nothing changed in the kernel (one transaction); try again
                // from scratch, backing off (2 s doubling to a minute).
                failures += 1;
                let wait = Duration::from_secs((1u64 << failures.min(6)).min(60));
                tracing::warn!(error = %e, retry_in = ?wait, "programming service rules failed; retrying with a full resync");
                retry_at = Some(tokio::time::Instant::now() + wait);
            }
        }
    }
}

enum Either<A, B> {
    Svc(A),
    Slice(B),
}

/// Deletes conntrack entries that would keep UDP clients on endpoints that
/// are gone (or on the reject path of a service that now has endpoints), as
/// kube-proxy does; TCP needs none of this.
async fn flush_udp_changes(old: &HashMap<Key, Vec<PortPlan>>, new: &HashMap<Key, Vec<PortPlan>>) {
    let flushes = udp_flushes(old, new);
    if !flushes.is_empty() {
        nft::flush_conntrack(flushes).await;
    }
}

/// The conntrack deletions a change of plans calls for.
pub fn udp_flushes(
    old: &HashMap<Key, Vec<PortPlan>>,
    new: &HashMap<Key, Vec<PortPlan>>,
) -> Vec<nft::ConntrackFlush> {
    let mut flushes: Vec<nft::ConntrackFlush> = vec![];
    let keys: BTreeSet<&Key> = old.keys().chain(new.keys()).collect();
    for k in keys {
        let olds = old.get(k).map(Vec::as_slice).unwrap_or(&[]);
        let news = new.get(k).map(Vec::as_slice).unwrap_or(&[]);
        for o in olds.iter().filter(|p| p.key.protocol == Protocol::Udp) {
            let n = news.iter().find(|n| n.key == o.key);
            let kept: BTreeSet<Ipv4Addr> = n
                .map(|n| n.cluster_endpoints.iter().map(|e| e.ip).collect())
                .unwrap_or_default();
            for ep in &o.cluster_endpoints {
                if !kept.contains(&ep.ip) {
                    flushes.push(nft::ConntrackFlush::Endpoint {
                        vip: o.cluster_ip,
                        port: o.port,
                        node_port: o.node_port,
                        endpoint: ep.ip,
                    });
                }
            }
        }
        for n in news.iter().filter(|p| p.key.protocol == Protocol::Udp) {
            let before = olds
                .iter()
                .find(|o| o.key == n.key)
                .map(|o| o.has_endpoints)
                .unwrap_or(false);
            if n.has_endpoints && !before {
                flushes.push(nft::ConntrackFlush::Service {
                    vip: n.cluster_ip,
                    port: n.port,
                    node_port: n.node_port,
                });
            }
        }
    }
    flushes
}

#[cfg(test)]
mod tests {
    use super::model::{Endpoint, PortKey};
    use super::*;

    fn plan(protocol: Protocol, eps: &[&str]) -> PortPlan {
        PortPlan {
            key: PortKey {
                namespace: "default".into(),
                name: "dns".into(),
                protocol,
                port_name: "dns".into(),
            },
            cluster_ip: "10.43.0.53".parse().unwrap(),
            port: 53,
            node_port: None,
            external_ips: vec![],
            cluster_endpoints: eps
                .iter()
                .map(|ip| Endpoint {
                    ip: ip.parse().unwrap(),
                    port: 5353,
                })
                .collect(),
            local_endpoints: vec![],
            has_endpoints: !eps.is_empty(),
            internal_local: false,
            external_local: false,
            affinity: None,
            health_check_node_port: None,
        }
    }

    fn one(p: PortPlan) -> HashMap<Key, Vec<PortPlan>> {
        HashMap::from([(("default".to_string(), "dns".to_string()), vec![p])])
    }

    #[test]
    fn a_udp_endpoint_that_goes_has_its_entries_deleted_and_tcp_needs_nothing() {
        let f = udp_flushes(
            &one(plan(Protocol::Udp, &["10.42.0.5", "10.42.0.6"])),
            &one(plan(Protocol::Udp, &["10.42.0.5"])),
        );
        assert_eq!(
            f.iter()
                .flat_map(|f| f.args())
                .map(|a| a.join(" "))
                .collect::<Vec<_>>(),
            vec!["-D -p udp --orig-dst 10.43.0.53 --orig-port-dst 53 --reply-src 10.42.0.6"]
        );
        let f = udp_flushes(
            &one(plan(Protocol::Tcp, &["10.42.0.5", "10.42.0.6"])),
            &one(plan(Protocol::Tcp, &["10.42.0.5"])),
        );
        assert!(f.is_empty());
    }

    #[test]
    fn a_udp_service_getting_its_first_endpoint_drops_every_entry_of_its_port() {
        let f = udp_flushes(
            &one(plan(Protocol::Udp, &[])),
            &one(plan(Protocol::Udp, &["10.42.0.5"])),
        );
        assert_eq!(
            f.iter()
                .flat_map(|f| f.args())
                .map(|a| a.join(" "))
                .collect::<Vec<_>>(),
            vec!["-D -p udp --orig-dst 10.43.0.53 --orig-port-dst 53"]
        );
    }
}
