//! NetworkPolicy enforcement in the service proxy's nftables table: this
//! task watches NetworkPolicies, Pods, Namespaces and the node-local
//! cluster DNS Service, renders the policy chains of this node's pods
//! ([`model`]) and hands them to the proxy loop, which applies them in its
//! own transactions (incrementally, like a service). A policy the
//! dataplane cannot express gets a Warning Event and a log line.

pub mod model;
pub mod undeclared;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::Ipv4Addr;
use std::sync::Arc;
use std::time::Duration;

use futures::{FutureExt, StreamExt};
use k8s_openapi::api::core::v1::{Namespace, Pod, Service};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use kube::api::Api;
use kube::runtime::watcher;
use tokio::sync::watch;

use super::model::Protocol;
use super::rules::PortRules;
use model::{NamedPort, PodInfo};

/// The label of the node-local cluster DNS Service (see the DNS module).
const NODE_LOCAL_LABEL: &str = "skiff.io/node-local=true";

type Key = (String, String);

#[derive(Default)]
struct Inputs {
    pods: HashMap<Key, Pod>,
    namespaces: HashMap<String, Namespace>,
    policies: HashMap<Key, NetworkPolicy>,
    /// Every Service (the node-local DNS one is labelled
    /// `skiff.io/node-local=true`).
    services: HashMap<Key, Service>,
}

enum Ev {
    Pod(Box<watcher::Event<Pod>>),
    Ns(watcher::Event<Namespace>),
    Policy(watcher::Event<NetworkPolicy>),
    Dns(Box<watcher::Event<Service>>),
    /// Time to read the connection table (undeclared connections).
    Tick,
    Error(watcher::Error),
}

fn key<K: kube::Resource>(o: &K) -> Key {
    (
        o.meta().namespace.clone().unwrap_or_default(),
        o.meta().name.clone().unwrap_or_default(),
    )
}

/// Applies a watch event to a map; returns true at InitDone.
fn fold<K: kube::Resource + Clone>(
    map: &mut HashMap<Key, K>,
    listing: &mut Option<HashMap<Key, K>>,
    ev: watcher::Event<K>,
) -> bool {
    match ev {
        watcher::Event::Init => *listing = Some(HashMap::new()),
        watcher::Event::InitApply(o) => {
            listing.get_or_insert_with(HashMap::new).insert(key(&o), o);
        }
        watcher::Event::InitDone => {
            *map = listing.take().unwrap_or_default();
            return true;
        }
        watcher::Event::Apply(o) => {
            map.insert(key(&o), o);
        }
        watcher::Event::Delete(o) => {
            map.remove(&key(&o));
        }
    }
    false
}

/// Runs until the watches end, sending each new rendering on `out`.
pub async fn run(
    client: kube::Client,
    node_name: String,
    out: watch::Sender<Option<Arc<PortRules>>>,
) {
    let recorder = kube::runtime::events::Recorder::new(
        client.clone(),
        kube::runtime::events::Reporter {
            controller: "skiff-network-policy".into(),
            instance: Some(node_name.clone()),
        },
    );
    let cfg = watcher::Config::default;
    let pods =
        watcher(Api::<Pod>::all(client.clone()), cfg()).map(|e| e.map(|e| Ev::Pod(Box::new(e))));
    let nss = watcher(Api::<Namespace>::all(client.clone()), cfg()).map(|e| e.map(Ev::Ns));
    let pols = watcher(Api::<NetworkPolicy>::all(client.clone()), cfg()).map(|e| e.map(Ev::Policy));
    let dns = watcher(Api::<Service>::all(client.clone()), cfg())
        .map(|e| e.map(|e| Ev::Dns(Box::new(e))));
    let ticks = futures::stream::unfold((), |_| async {
        tokio::time::sleep(UNDECLARED_EVERY).await;
        Some((Ok(Ev::Tick), ()))
    });
    let mut events = futures::stream::select_all(vec![
        pods.boxed(),
        nss.boxed(),
        pols.boxed(),
        dns.boxed(),
        ticks.boxed(),
    ])
    .map(|r| r.unwrap_or_else(Ev::Error));
    let mut counter = undeclared::Counter::default();
    let mut conntrack_ok = true;

    let mut inputs = Inputs::default();
    let mut pod_l = None;
    let mut pol_l = None;
    let mut dns_l = None;
    let mut ns_l: Option<HashMap<Key, Namespace>> = None;
    let mut ns_map: HashMap<Key, Namespace> = HashMap::new();
    let mut synced = BTreeSet::new();
    let mut reported: BTreeMap<Key, String> = BTreeMap::new();
    let mut last: Option<PortRules> = None;
    loop {
        let Some(mut ev) = events.next().await else {
            return;
        };
        // Only a change of what the rules are made from calls for
        // rendering: not a tick, nor a Service other than the node-local
        // DNS one (all of them are watched for undeclared connections).
        let mut changed = false;
        loop {
            changed |= match &ev {
                Ev::Tick => false,
                Ev::Dns(e) => match e.as_ref() {
                    watcher::Event::Apply(s) | watcher::Event::Delete(s) => node_local(s),
                    _ => true,
                },
                _ => true,
            };
            match ev {
                Ev::Pod(e) => {
                    if fold(&mut inputs.pods, &mut pod_l, *e) {
                        synced.insert("pods");
                    }
                }
                Ev::Ns(e) => {
                    if fold(&mut ns_map, &mut ns_l, e) {
                        synced.insert("namespaces");
                    }
                    inputs.namespaces = ns_map
                        .iter()
                        .map(|((_, n), v)| (n.clone(), v.clone()))
                        .collect();
                }
                Ev::Policy(e) => {
                    if fold(&mut inputs.policies, &mut pol_l, e) {
                        synced.insert("policies");
                    }
                }
                Ev::Dns(e) => {
                    if fold(&mut inputs.services, &mut dns_l, *e) {
                        synced.insert("dns");
                    }
                }
                Ev::Tick => {
                    if synced.len() == 4 && conntrack_ok {
                        conntrack_ok =
                            count_undeclared(&client, &inputs, &node_name, &mut counter).await;
                    }
                }
                Ev::Error(e) => {
                    // The API server is away: the rules in force stay.
                    tracing::debug!(error = %e, "network policy watch error");
                    tokio::time::sleep(Duration::from_millis(500)).await;
                }
            }
            match events.next().now_or_never() {
                Some(Some(next)) => ev = next,
                Some(None) => return,
                None => break,
            }
        }
        if !changed || synced.len() < 4 {
            // Never render from a partial view: pods missing from a peer
            // set would be denied.
            continue;
        }
        let rendered = render(&inputs, &node_name);
        for (k, why) in &rendered.unsupported {
            if reported.get(k) == Some(why) {
                continue;
            }
            reported.insert(k.clone(), why.clone());
            tracing::warn!(policy = %format!("{}/{}", k.0, k.1), reason = %why, "network policy not programmed: the dataplane cannot express it; the pods it selects stay isolated");
            if let Some(p) = inputs.policies.get(k) {
                report(&recorder, p, why.clone()).await;
            }
        }
        reported.retain(|k, _| rendered.unsupported.iter().any(|(u, _)| u == k));
        if last.as_ref() != Some(&rendered.rules) {
            last = Some(rendered.rules.clone());
            let _ = out.send(Some(Arc::new(rendered.rules)));
        }
    }
}

/// How often the connection table is read while a local pod declares
/// dependencies outside an enforcing namespace.
const UNDECLARED_EVERY: Duration = Duration::from_secs(5);

/// Reads the connection table, counts undeclared connections and writes
/// the condition of each pod whose count moved. False when the table
/// cannot be read at all (no `conntrack`): said once, then not tried
/// again.
async fn count_undeclared(
    client: &kube::Client,
    inputs: &Inputs,
    node_name: &str,
    counter: &mut undeclared::Counter,
) -> bool {
    let enforcing: std::collections::HashSet<String> = inputs
        .namespaces
        .iter()
        .filter(|(_, ns)| {
            ns.metadata
                .labels
                .as_ref()
                .and_then(|l| l.get(skiff_helpers::dependencies::NAMESPACE_LABEL))
                .map(String::as_str)
                == Some(skiff_helpers::dependencies::ENFORCE)
        })
        .map(|(n, _)| n.clone())
        .collect();
    let world = undeclared::World::new(
        node_name,
        inputs.pods.values(),
        inputs.services.values(),
        &enforcing,
        &[],
    );
    if world.declarers.is_empty() && counter.counts.is_empty() {
        return true;
    }
    let out = tokio::time::timeout(
        Duration::from_secs(10),
        tokio::process::Command::new("conntrack")
            .args(["-L", "-f", "ipv4", "-o", "id"])
            .stdin(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .output(),
    )
    .await;
    let text = match out {
        Ok(Ok(o)) => String::from_utf8_lossy(&o.stdout).into_owned(),
        Ok(Err(e)) => {
            tracing::warn!(error = %e, "cannot read the connection table (conntrack): undeclared connections are not counted");
            return false;
        }
        Err(_) => return true,
    };
    let flows = undeclared::parse_conntrack(&text);
    let moved = counter.observe(&flows, &world);
    undeclared::publish(counter);
    for key in moved {
        let Some((_, message)) = counter.message(&key) else {
            continue;
        };
        let api: Api<Pod> = Api::namespaced(client.clone(), &key.0);
        let patch = serde_json::json!({"status": {"conditions": [{
            "type": undeclared::CONDITION, "status": "True", "reason": "UndeclaredConnections",
            "message": message,
            "lastTransitionTime": k8s_openapi::jiff::Timestamp::now().to_string(),
        }]}});
        if let Err(e) = api
            .patch_status(
                &key.1,
                &kube::api::PatchParams::default(),
                &kube::api::Patch::Strategic(&patch),
            )
            .await
        {
            tracing::debug!(error = %e, pod = %key.1, "writing the undeclared-connections condition");
        }
    }
    true
}

async fn report(recorder: &kube::runtime::events::Recorder, p: &NetworkPolicy, why: String) {
    let reference = k8s_openapi::api::core::v1::ObjectReference {
        api_version: Some("networking.k8s.io/v1".into()),
        kind: Some("NetworkPolicy".into()),
        name: p.metadata.name.clone(),
        namespace: p.metadata.namespace.clone(),
        uid: p.metadata.uid.clone(),
        resource_version: p.metadata.resource_version.clone(),
        field_path: None,
    };
    let ev = kube::runtime::events::Event {
        type_: kube::runtime::events::EventType::Warning,
        reason: "UnsupportedNetworkPolicy".into(),
        note: Some(format!(
            "not programmed (the pods it selects stay isolated): {why}"
        )),
        action: "Program".into(),
        secondary: None,
    };
    if let Err(e) = recorder.publish(&ev, &reference).await {
        tracing::debug!(error = %e, "recording an event");
    }
}

fn labels(m: &Option<BTreeMap<String, String>>) -> BTreeMap<String, String> {
    m.clone().unwrap_or_default()
}

/// A pod as policies see it (None: no IPv4 address, host network, or
/// finished).
pub fn pod_info(p: &Pod, node_name: &str) -> Option<PodInfo> {
    let spec = p.spec.as_ref()?;
    if spec.host_network == Some(true) {
        return None;
    }
    let status = p.status.as_ref()?;
    if matches!(status.phase.as_deref(), Some("Succeeded" | "Failed")) {
        return None;
    }
    let ip: Ipv4Addr = status.pod_ip.as_deref()?.parse().ok()?;
    let ports = spec
        .containers
        .iter()
        .flat_map(|c| c.ports.iter().flatten())
        .filter_map(|cp| {
            Some(NamedPort {
                name: cp.name.clone()?,
                protocol: Protocol::parse(cp.protocol.as_deref())?,
                port: u16::try_from(cp.container_port).ok()?,
            })
        })
        .collect();
    Some(PodInfo {
        namespace: p.metadata.namespace.clone().unwrap_or_default(),
        name: p.metadata.name.clone().unwrap_or_default(),
        ip,
        labels: labels(&p.metadata.labels),
        ports,
        local: spec.node_name.as_deref() == Some(node_name),
    })
}

/// Whether a Service is the node-local cluster DNS one.
fn node_local(s: &Service) -> bool {
    let (k, v) = NODE_LOCAL_LABEL.split_once('=').unwrap_or_default();
    s.metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(k))
        .map(String::as_str)
        == Some(v)
}

fn render(inputs: &Inputs, node_name: &str) -> model::Rendered {
    let mut pods: Vec<PodInfo> = inputs
        .pods
        .values()
        .filter_map(|p| pod_info(p, node_name))
        .collect();
    // The node-local cluster DNS has no pods: its Service's address stands
    // for "the kube-dns pods" (its labels, its named ports), so a rule
    // allowing them by selector allows DNS.
    let mut dns_ips = vec![];
    for svc in inputs.services.values().filter(|s| node_local(s)) {
        let Some(spec) = &svc.spec else { continue };
        for ip in spec.cluster_ips.iter().flatten() {
            let Ok(ip) = ip.parse::<Ipv4Addr>() else {
                continue;
            };
            dns_ips.push(ip);
            pods.push(PodInfo {
                namespace: svc.metadata.namespace.clone().unwrap_or_default(),
                name: svc.metadata.name.clone().unwrap_or_default(),
                ip,
                labels: labels(&svc.metadata.labels),
                ports: spec
                    .ports
                    .iter()
                    .flatten()
                    .filter_map(|p| {
                        Some(NamedPort {
                            name: p.name.clone()?,
                            protocol: Protocol::parse(p.protocol.as_deref())?,
                            port: u16::try_from(p.port).ok()?,
                        })
                    })
                    .collect(),
                local: false,
            });
        }
    }
    pods.sort_by(|a, b| (&a.namespace, &a.name).cmp(&(&b.namespace, &b.name)));
    let namespaces = inputs
        .namespaces
        .iter()
        .map(|(n, ns)| {
            let mut l = labels(&ns.metadata.labels);
            l.entry("kubernetes.io/metadata.name".into())
                .or_insert_with(|| n.clone());
            (n.clone(), l)
        })
        .collect();
    let policies: Vec<NetworkPolicy> = inputs.policies.values().cloned().collect();
    dns_ips.sort();
    dns_ips.dedup();
    model::render(&pods, &namespaces, &policies, &dns_ips)
}
