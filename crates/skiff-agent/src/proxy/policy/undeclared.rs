//! Undeclared connections: outside namespaces that enforce declared
//! dependencies (`skiff.io/dependencies=enforce`), a pod's declaration
//! (`skiff.io/depends-on`) still says what it should connect to, and the
//! node counts the connections it makes elsewhere, so a team sees what
//! enforcing would break before turning it on.
//!
//! The node's connection-tracking table is read (`conntrack -L`, every
//! few seconds while a local pod declares dependencies outside an
//! enforcing namespace); each connection a declaring pod opened is judged
//! once (by conntrack id) against its declaration: allowed are its
//! declared Services (their ClusterIP, or a pod they select, on any
//! port), cluster DNS (port 53) and the API server; anything else is
//! undeclared. A connection short enough to leave the table between two
//! readings is missed (TCP's stay two minutes in TIME_WAIT, so few are).
//! The counts are the agent's `/metrics`
//! (`skiff_undeclared_connections_total{namespace,pod}`) and the pod's
//! `skiff.io/UndeclaredConnections` condition, which `skiff deps` shows
//! as `violated`.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::net::Ipv4Addr;
use std::sync::Mutex;

use k8s_openapi::api::core::v1::{Pod, Service};
use skiff_helpers::dependencies::{self, Dependency};
use skiff_helpers::scheduling::Selector;

/// The pod condition the counts are published in.
pub use skiff_helpers::dependencies::UNDECLARED_CONDITION as CONDITION;

/// One tracked connection: its original direction and where it really
/// went (the reply's source, after any DNAT).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Flow {
    pub id: u64,
    pub protocol: String,
    pub src: Ipv4Addr,
    pub dst: Ipv4Addr,
    pub dport: u16,
    pub reply_src: Ipv4Addr,
    pub reply_sport: u16,
}

/// Parses `conntrack -L -o id` output (lines such as `tcp 6 117
/// TIME_WAIT src=A dst=B sport=.. dport=.. src=C dst=A sport=.. dport=..
/// [ASSURED] mark=0 use=1 id=N`); lines it cannot read are skipped.
pub fn parse_conntrack(text: &str) -> Vec<Flow> {
    let mut out = vec![];
    for line in text.lines() {
        let mut words = line.split_whitespace();
        let Some(protocol) = words.next() else {
            continue;
        };
        let mut src = vec![];
        let mut dst = vec![];
        let mut sport = vec![];
        let mut dport = vec![];
        let mut id = None;
        for w in words {
            let Some((k, v)) = w.split_once('=') else {
                continue;
            };
            match k {
                "src" => src.push(v),
                "dst" => dst.push(v),
                "sport" => sport.push(v),
                "dport" => dport.push(v),
                "id" => id = v.parse().ok(),
                _ => {}
            }
        }
        let flow = (|| {
            Some(Flow {
                id: id?,
                protocol: protocol.to_string(),
                src: src.first()?.parse().ok()?,
                dst: dst.first()?.parse().ok()?,
                dport: dport.first()?.parse().ok()?,
                reply_src: src.get(1)?.parse().ok()?,
                reply_sport: sport.get(1)?.parse().ok()?,
            })
        })();
        out.extend(flow);
    }
    out
}

/// A local pod whose connections are judged.
#[derive(Debug, Clone)]
pub struct Declarer {
    pub namespace: String,
    pub name: String,
    pub deps: Vec<Dependency>,
}

/// What judging needs of the cluster.
#[derive(Debug, Default)]
pub struct World {
    /// Local declaring pods outside enforcing namespaces, by address.
    pub declarers: HashMap<Ipv4Addr, Declarer>,
    /// Every pod with an address: (namespace, name, labels).
    pub pods: HashMap<Ipv4Addr, (String, String, BTreeMap<String, String>)>,
    /// The selector of every Service that has one.
    pub selectors: HashMap<(String, String), BTreeMap<String, String>>,
    /// ClusterIPs to their Service.
    pub cluster_ips: HashMap<Ipv4Addr, (String, String)>,
    /// The API server's addresses (the `kubernetes` Service's ClusterIP
    /// and endpoints).
    pub api: HashSet<Ipv4Addr>,
}

impl World {
    /// The world of `pods` and `services` seen from node `node`, given
    /// which namespaces enforce and the API server's endpoint addresses.
    pub fn new<'a>(
        node: &str,
        pods: impl Iterator<Item = &'a Pod>,
        services: impl Iterator<Item = &'a Service>,
        enforcing: &HashSet<String>,
        api_endpoints: &[Ipv4Addr],
    ) -> World {
        let mut w = World::default();
        for s in services {
            let ns = s.metadata.namespace.clone().unwrap_or_default();
            let name = s.metadata.name.clone().unwrap_or_default();
            let spec = s.spec.clone().unwrap_or_default();
            let ip = spec
                .cluster_ip
                .as_deref()
                .and_then(|i| i.parse::<Ipv4Addr>().ok());
            if let Some(ip) = ip {
                w.cluster_ips.insert(ip, (ns.clone(), name.clone()));
                if ns == "default" && name == "kubernetes" {
                    w.api.insert(ip);
                }
            }
            if let Some(sel) = spec.selector.filter(|m| !m.is_empty()) {
                w.selectors.insert((ns, name), sel);
            }
        }
        w.api.extend(api_endpoints.iter().copied());
        for p in pods {
            let Some(ip) = p
                .status
                .as_ref()
                .and_then(|s| s.pod_ip.as_deref())
                .and_then(|i| i.parse::<Ipv4Addr>().ok())
            else {
                continue;
            };
            if p.spec.as_ref().and_then(|s| s.host_network) == Some(true) {
                continue;
            }
            let ns = p.metadata.namespace.clone().unwrap_or_default();
            let name = p.metadata.name.clone().unwrap_or_default();
            let local = p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(node);
            if local && !enforcing.contains(&ns) {
                if let Some(deps) = dependencies::declared(p.metadata.annotations.as_ref(), &ns) {
                    w.declarers.insert(
                        ip,
                        Declarer {
                            namespace: ns.clone(),
                            name: name.clone(),
                            deps,
                        },
                    );
                }
            }
            w.pods.insert(
                ip,
                (ns, name, p.metadata.labels.clone().unwrap_or_default()),
            );
        }
        w
    }

    /// The destination of `flow` if it is an undeclared connection of a
    /// declaring pod, described for people (`ns/service:port` or
    /// `ns/pod:port` or `address:port`).
    pub fn undeclared(&self, flow: &Flow) -> Option<(&Declarer, String)> {
        let d = self.declarers.get(&flow.src)?;
        if flow.dport == 53 || self.api.contains(&flow.dst) || self.api.contains(&flow.reply_src) {
            return None;
        }
        let declared =
            |ns: &str, svc: &str| d.deps.iter().any(|x| x.namespace == ns && x.service == svc);
        if let Some((ns, svc)) = self.cluster_ips.get(&flow.dst) {
            if declared(ns, svc) {
                return None;
            }
            return Some((d, format!("{ns}/{svc}:{}", flow.dport)));
        }
        // A pod, directly (a headless Service's, say).
        let target = flow.reply_src;
        if let Some((ns, name, labels)) = self.pods.get(&target) {
            let selected = d.deps.iter().any(|x| {
                x.namespace == *ns
                    && self
                        .selectors
                        .get(&(x.namespace.clone(), x.service.clone()))
                        .is_some_and(|sel| Selector::from_map(sel).matches(Some(labels)))
            });
            if selected {
                return None;
            }
            return Some((d, format!("{ns}/{name}:{}", flow.reply_sport)));
        }
        Some((d, format!("{}:{}", flow.dst, flow.dport)))
    }
}

/// Counts per pod: connections judged undeclared, by destination.
#[derive(Debug, Default)]
pub struct Counter {
    seen: HashSet<u64>,
    pub counts: BTreeMap<(String, String), BTreeMap<String, u64>>,
}

impl Counter {
    /// Judges the flows not judged before; returns the pods whose counts
    /// moved. Flows that left the table are forgotten.
    pub fn observe(&mut self, flows: &[Flow], world: &World) -> Vec<(String, String)> {
        let mut moved = vec![];
        let mut now_seen = HashSet::with_capacity(flows.len());
        for f in flows {
            now_seen.insert(f.id);
            if self.seen.contains(&f.id) {
                continue;
            }
            if let Some((d, dest)) = world.undeclared(f) {
                let key = (d.namespace.clone(), d.name.clone());
                *self
                    .counts
                    .entry(key.clone())
                    .or_default()
                    .entry(dest)
                    .or_default() += 1;
                if !moved.contains(&key) {
                    moved.push(key);
                }
            }
        }
        self.seen = now_seen;
        // Pods that are gone take their counts with them.
        self.counts.retain(|(ns, name), _| {
            world
                .declarers
                .values()
                .any(|d| &d.namespace == ns && &d.name == name)
        });
        moved
    }

    /// A pod's total and the condition message naming its destinations.
    pub fn message(&self, key: &(String, String)) -> Option<(u64, String)> {
        let by = self.counts.get(key)?;
        let total: u64 = by.values().sum();
        let list: Vec<String> = by.iter().map(|(d, n)| format!("{d} ×{n}")).collect();
        Some((
            total,
            format!(
                "{total} connection(s) to undeclared destinations: {}",
                list.join(", ")
            ),
        ))
    }
}

/// The node's counts, as its `/metrics` serves them.
static METRICS: Mutex<BTreeMap<(String, String), u64>> = Mutex::new(BTreeMap::new());

/// Publishes the counter's totals for `/metrics`.
pub fn publish(counter: &Counter) {
    let mut m = METRICS.lock().unwrap_or_else(|e| e.into_inner());
    *m = counter
        .counts
        .iter()
        .map(|(k, by)| (k.clone(), by.values().sum()))
        .collect();
}

/// `skiff_undeclared_connections_total` in Prometheus' text format.
pub fn metrics_text() -> String {
    let m = METRICS.lock().unwrap_or_else(|e| e.into_inner());
    let mut s = String::from(
        "# HELP skiff_undeclared_connections_total Connections a pod opened to destinations its skiff.io/depends-on declaration does not name (outside enforcing namespaces).\n# TYPE skiff_undeclared_connections_total counter\n",
    );
    for ((ns, pod), n) in m.iter() {
        s.push_str(&format!(
            "skiff_undeclared_connections_total{{namespace=\"{ns}\",pod=\"{pod}\"}} {n}\n"
        ));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const TABLE: &str = "\
tcp      6 117 TIME_WAIT src=10.42.0.5 dst=10.43.0.20 sport=40000 dport=80 src=10.42.0.9 dst=10.42.0.5 sport=8080 dport=40000 [ASSURED] mark=0 use=1 id=11
tcp      6 117 TIME_WAIT src=10.42.0.5 dst=10.43.0.30 sport=40002 dport=80 src=10.42.0.8 dst=10.42.0.5 sport=8080 dport=40002 [ASSURED] mark=0 use=1 id=12
udp      17 20 src=10.42.0.5 dst=10.43.0.10 sport=5353 dport=53 src=10.43.0.10 dst=10.42.0.5 sport=53 dport=5353 mark=0 use=1 id=13
tcp      6 60 SYN_SENT src=10.42.0.5 dst=10.42.0.9 sport=40004 dport=8080 [UNREPLIED] src=10.42.0.9 dst=10.42.0.5 sport=8080 dport=40004 mark=0 use=1 id=14
tcp      6 60 SYN_SENT src=10.42.0.5 dst=10.42.0.8 sport=40006 dport=8080 [UNREPLIED] src=10.42.0.8 dst=10.42.0.5 sport=8080 dport=40006 mark=0 use=1 id=15
tcp      6 60 ESTABLISHED src=10.42.0.5 dst=10.43.0.1 sport=40008 dport=443 src=192.0.2.1 dst=10.42.0.5 sport=6443 dport=40008 [ASSURED] mark=0 use=1 id=16
tcp      6 60 ESTABLISHED src=10.42.0.7 dst=10.43.0.30 sport=40010 dport=80 src=10.42.0.8 dst=10.42.0.7 sport=8080 dport=40010 [ASSURED] mark=0 use=1 id=17
unknown  2 183 src=0.0.0.0 dst=224.0.0.22 [UNREPLIED] src=224.0.0.22 dst=0.0.0.0 mark=0 use=1 id=18
garbage line
";

    fn world() -> World {
        world_with(&HashSet::new())
    }

    fn world_with(enforcing: &HashSet<String>) -> World {
        let pod = |name: &str, ip: &str, app: &str, node: &str, deps: Option<&str>| -> Pod {
            let mut p = json!({"metadata": {"name": name, "namespace": "shop", "labels": {"app": app}},
                "spec": {"nodeName": node, "containers": []}, "status": {"podIP": ip}});
            if let Some(d) = deps {
                p["metadata"]["annotations"] = json!({"skiff.io/depends-on": d});
            }
            serde_json::from_value(p).unwrap()
        };
        let svc = |name: &str, ip: &str, app: &str| -> Service {
            serde_json::from_value(json!({"metadata": {"name": name, "namespace": "shop"},
                "spec": {"clusterIP": ip, "selector": {"app": app}}}))
            .unwrap()
        };
        let pods = [
            pod("web", "10.42.0.5", "web", "n1", Some("api")),
            pod("api-1", "10.42.0.9", "api", "n1", None),
            pod("other-1", "10.42.0.8", "other", "n2", None),
            pod("plain", "10.42.0.7", "plain", "n1", None),
        ];
        let services = [
            svc("api", "10.43.0.20", "api"),
            svc("other", "10.43.0.30", "other"),
            serde_json::from_value(
                json!({"metadata": {"name": "kubernetes", "namespace": "default"},
                "spec": {"clusterIP": "10.43.0.1"}}),
            )
            .unwrap(),
        ];
        World::new(
            "n1",
            pods.iter(),
            services.iter(),
            enforcing,
            &["192.0.2.1".parse().unwrap()],
        )
    }

    #[test]
    fn conntrack_lines_are_read_with_their_reply_source() {
        let flows = parse_conntrack(TABLE);
        // The multicast line has no ports, the last no fields: skipped.
        assert_eq!(flows.len(), 7);
        assert_eq!(flows[0].id, 11);
        assert_eq!(flows[0].reply_src, "10.42.0.9".parse::<Ipv4Addr>().unwrap());
        assert_eq!(flows[0].dport, 80);
        assert_eq!(flows[3].protocol, "tcp");
    }

    #[test]
    fn only_a_declaring_pods_undeclared_connections_count_once_each() {
        let w = world();
        let flows = parse_conntrack(TABLE);
        let mut c = Counter::default();
        let moved = c.observe(&flows, &w);
        assert_eq!(moved, vec![("shop".to_string(), "web".to_string())]);
        // The declared Service, its pod directly, DNS and the API server
        // pass; the other Service and its pod do not; the pod without a
        // declaration is not judged.
        let (total, msg) = c.message(&moved[0]).unwrap();
        assert_eq!(total, 2, "{msg}");
        assert_eq!(
            msg,
            "2 connection(s) to undeclared destinations: shop/other-1:8080 ×1, shop/other:80 ×1"
        );
        // The same table again counts nothing new.
        assert!(c.observe(&flows, &w).is_empty());
        publish(&c);
        assert!(metrics_text()
            .contains("skiff_undeclared_connections_total{namespace=\"shop\",pod=\"web\"} 2"));
        // In an enforcing namespace nothing is judged here (the policies
        // refuse instead).
        let w2 = world_with(&HashSet::from(["shop".to_string()]));
        assert!(w2.declarers.is_empty());
        assert!(Counter::default().observe(&flows, &w2).is_empty());
    }
}
