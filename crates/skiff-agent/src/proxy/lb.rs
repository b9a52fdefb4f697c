//! A small LoadBalancer controller in the spirit of k3s' ServiceLB: every
//! `type: LoadBalancer` Service without a `loadBalancerClass` gets the
//! InternalIPs of the cluster's Ready real nodes in
//! `status.loadBalancer.ingress`, and the proxy on each node answers on
//! those addresses at the service's ports (as external traffic). As with
//! ServiceLB, a port can serve only one such Service: a later Service
//! asking for a (protocol, port) already taken stays pending (no ingress).
//!
//! One agent at a time runs it (a Lease, `skiff-service-lb`).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::{Node, Service};
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::watcher;
use serde_json::json;

use super::model::Protocol;

type Key = (String, String);

/// Addresses LoadBalancer services are reachable at: the InternalIPs of
/// Ready nodes that run real containers (hollow nodes run no proxy).
pub fn node_addresses(nodes: &[&Node]) -> Vec<String> {
    let mut ips = BTreeSet::new();
    for n in nodes {
        let Some(st) = n.status.as_ref() else {
            continue;
        };
        let hollow = st
            .node_info
            .as_ref()
            .is_some_and(|i| i.container_runtime_version.starts_with("simulated://"));
        let ready = st
            .conditions
            .iter()
            .flatten()
            .any(|c| c.type_ == "Ready" && c.status == "True");
        if hollow || !ready {
            continue;
        }
        for a in st.addresses.iter().flatten() {
            if a.type_ == "InternalIP" && a.address.parse::<std::net::Ipv4Addr>().is_ok() {
                ips.insert(a.address.clone());
            }
        }
    }
    ips.into_iter().collect()
}

/// The ingress IPs each LoadBalancer service should have, oldest service
/// first for port conflicts.
pub fn desired(services: &[&Service], addresses: &[String]) -> BTreeMap<Key, Vec<String>> {
    let mut lbs: Vec<&Service> = services
        .iter()
        .copied()
        .filter(|s| {
            s.spec.as_ref().is_some_and(|sp| {
                sp.type_.as_deref() == Some("LoadBalancer") && sp.load_balancer_class.is_none()
            })
        })
        .collect();
    lbs.sort_by(|a, b| {
        let ka = (
            a.metadata.creation_timestamp.as_ref().map(|t| t.0),
            a.metadata.namespace.clone(),
            a.metadata.name.clone(),
        );
        let kb = (
            b.metadata.creation_timestamp.as_ref().map(|t| t.0),
            b.metadata.namespace.clone(),
            b.metadata.name.clone(),
        );
        ka.cmp(&kb)
    });
    let mut taken: BTreeSet<(Protocol, i32)> = BTreeSet::new();
    let mut out = BTreeMap::new();
    for s in lbs {
        let key = (
            s.metadata.namespace.clone().unwrap_or_default(),
            s.metadata.name.clone().unwrap_or_default(),
        );
        let ports: Vec<(Protocol, i32)> = s
            .spec
            .as_ref()
            .and_then(|sp| sp.ports.as_ref())
            .into_iter()
            .flatten()
            .filter_map(|p| Some((Protocol::parse(p.protocol.as_deref())?, p.port)))
            .collect();
        if ports.iter().any(|p| taken.contains(p)) {
            out.insert(key, vec![]);
            continue;
        }
        taken.extend(ports);
        out.insert(key, addresses.to_vec());
    }
    out
}

fn current(s: &Service) -> Vec<String> {
    s.status
        .as_ref()
        .and_then(|st| st.load_balancer.as_ref())
        .and_then(|lb| lb.ingress.as_ref())
        .into_iter()
        .flatten()
        .filter_map(|i| i.ip.clone())
        .collect()
}

/// Keeps LoadBalancer services' ingress current (under the Lease).
pub async fn run(client: kube::Client) -> anyhow::Result<()> {
    let services: Api<Service> = Api::all(client.clone());
    let nodes: Api<Node> = Api::all(client.clone());
    let mut svc_stream = watcher(services, watcher::Config::default()).boxed();
    let mut node_stream = watcher(nodes, watcher::Config::default()).boxed();
    let mut svcs: HashMap<Key, Service> = HashMap::new();
    let mut nodes_by_name: HashMap<String, Node> = HashMap::new();
    let (mut svc_listing, mut node_listing) =
        (None::<HashMap<Key, Service>>, None::<HashMap<String, Node>>);
    let (mut svc_synced, mut node_synced) = (false, false);
    loop {
        tokio::select! {
            ev = svc_stream.next() => match ev {
                None => return Ok(()),
                Some(Err(_)) => { tokio::time::sleep(Duration::from_millis(500)).await; continue; }
                Some(Ok(ev)) => match ev {
                    watcher::Event::Init => svc_listing = Some(HashMap::new()),
                    watcher::Event::InitApply(s) => { svc_listing.get_or_insert_with(HashMap::new).insert(key(&s), s); }
                    watcher::Event::InitDone => { svcs = svc_listing.take().unwrap_or_default(); svc_synced = true; }
                    watcher::Event::Apply(s) => { svcs.insert(key(&s), s); }
                    watcher::Event::Delete(s) => { svcs.remove(&key(&s)); }
                },
            },
            ev = node_stream.next() => match ev {
                None => return Ok(()),
                Some(Err(_)) => { tokio::time::sleep(Duration::from_millis(500)).await; continue; }
                Some(Ok(ev)) => match ev {
                    watcher::Event::Init => node_listing = Some(HashMap::new()),
                    watcher::Event::InitApply(n) => { node_listing.get_or_insert_with(HashMap::new).insert(n.metadata.name.clone().unwrap_or_default(), n); }
                    watcher::Event::InitDone => { nodes_by_name = node_listing.take().unwrap_or_default(); node_synced = true; }
                    watcher::Event::Apply(n) => { nodes_by_name.insert(n.metadata.name.clone().unwrap_or_default(), n); }
                    watcher::Event::Delete(n) => { nodes_by_name.remove(n.metadata.name.as_deref().unwrap_or_default()); }
                },
            },
        }
        if !(svc_synced && node_synced) {
            continue;
        }
        let node_list: Vec<&Node> = nodes_by_name.values().collect();
        let addresses = node_addresses(&node_list);
        let svc_list: Vec<&Service> = svcs.values().collect();
        for (k, want) in desired(&svc_list, &addresses) {
            let Some(s) = svcs.get(&k) else { continue };
            if current(s) == want {
                continue;
            }
            let api: Api<Service> = Api::namespaced(client.clone(), &k.0);
            let ingress: Vec<serde_json::Value> = want
                .iter()
                .map(|ip| json!({"ip": ip, "ipMode": "VIP"}))
                .collect();
            let patch = json!({"status": {"loadBalancer": {"ingress": ingress}}});
            match api
                .patch_status(&k.1, &PatchParams::default(), &Patch::Merge(&patch))
                .await
            {
                Ok(updated) => {
                    svcs.insert(k, updated);
                }
                Err(e) => {
                    tracing::debug!(service = %format!("{}/{}", k.0, k.1), error = %e, "writing LoadBalancer ingress")
                }
            }
        }
    }
}

fn key(s: &Service) -> Key {
    (
        s.metadata.namespace.clone().unwrap_or_default(),
        s.metadata.name.clone().unwrap_or_default(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(name: &str, ip: &str, ready: bool, runtime: &str) -> Node {
        serde_json::from_value(json!({
            "metadata": {"name": name},
            "status": {
                "addresses": [{"type": "InternalIP", "address": ip}, {"type": "Hostname", "address": name}],
                "conditions": [{"type": "Ready", "status": if ready {"True"} else {"False"}}],
                "nodeInfo": {"containerRuntimeVersion": runtime, "architecture": "", "bootID": "", "kernelVersion": "",
                    "kubeProxyVersion": "", "kubeletVersion": "", "machineID": "", "operatingSystem": "", "osImage": "", "systemUUID": ""},
            }
        }))
        .unwrap()
    }

    fn svc(name: &str, created: &str, ty: &str, port: i32) -> Service {
        serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": "default", "creationTimestamp": created},
            "spec": {"type": ty, "ports": [{"port": port, "protocol": "TCP"}]},
        }))
        .unwrap()
    }

    #[test]
    fn ready_real_nodes_are_the_addresses() {
        let a = node("a", "192.168.5.11", true, "containerd://1.6.20");
        let b = node("b", "192.168.5.10", true, "containerd://1.6.20");
        let down = node("c", "192.168.5.12", false, "containerd://1.6.20");
        let hollow = node("h", "127.0.0.1", true, "simulated://1.0");
        assert_eq!(
            node_addresses(&[&a, &b, &down, &hollow]),
            vec!["192.168.5.10", "192.168.5.11"]
        );
    }

    #[test]
    fn load_balancers_get_the_addresses_and_a_taken_port_stays_pending() {
        let first = svc("first", "2026-01-01T00:00:00Z", "LoadBalancer", 80);
        let second = svc("second", "2026-01-02T00:00:00Z", "LoadBalancer", 80);
        let other = svc("other", "2026-01-03T00:00:00Z", "LoadBalancer", 8080);
        let plain = svc("plain", "2026-01-01T00:00:00Z", "ClusterIP", 80);
        let mut classed = svc("classed", "2026-01-01T00:00:00Z", "LoadBalancer", 9090);
        classed.spec.as_mut().unwrap().load_balancer_class = Some("example.com/lb".into());
        let addrs = vec!["192.168.5.10".to_string()];
        let d = desired(&[&second, &first, &other, &plain, &classed], &addrs);
        let k = |n: &str| ("default".to_string(), n.to_string());
        assert_eq!(d[&k("first")], addrs);
        assert_eq!(d[&k("second")], Vec::<String>::new());
        assert_eq!(d[&k("other")], addrs);
        assert!(!d.contains_key(&k("plain")));
        assert!(!d.contains_key(&k("classed")));
    }
}
