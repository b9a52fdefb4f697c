//! Declared dependencies: a pod (or a workload's pod template) names the
//! Services it uses in the annotation `skiff.io/depends-on`, a
//! comma-separated list of `[namespace/]service[:port]`. Everything skiff
//! derives from a declaration is defined here once, without I/O: the
//! grammar and its errors (the API server's admission), the label that
//! groups pods by what they declare (the generated NetworkPolicies select
//! by it), the environment variables and token paths (admission and the
//! agent), and the graph's cycles (the dependencies controller and
//! `skiff deps`).

pub mod graph;

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use crate::names::{is_dns1035_label, is_dns1123_label, port_name_errors};

/// The annotation a pod or pod template declares its dependencies in.
pub const ANNOTATION: &str = "skiff.io/depends-on";
/// The label admission puts on a pod with a declaration: a hash of the
/// declaration, so that pods declaring the same thing are selected together.
pub const LABEL: &str = "skiff.io/deps";
/// The pod (and workload) condition saying whether every dependency has a
/// ready endpoint.
pub const CONDITION: &str = "skiff.io/DependenciesReady";
/// The namespace label that turns enforcement on (value [`ENFORCE`]).
pub const NAMESPACE_LABEL: &str = "skiff.io/dependencies";
pub const ENFORCE: &str = "enforce";
/// The label on every NetworkPolicy the dependencies controller generates.
pub const GENERATED_LABEL: &str = "skiff.io/generated-by";
pub const GENERATED_BY: &str = "dependencies";
/// The annotation the controller keeps on a declared Service: the
/// workloads that declared it.
pub const DEPENDENTS_ANNOTATION: &str = "skiff.io/dependents";
/// The pod condition a node writes when a pod outside an enforcing
/// namespace connects where its declaration does not say.
pub const UNDECLARED_CONDITION: &str = "skiff.io/UndeclaredConnections";
/// The container waiting reason (and Event reason) of a pod whose
/// containers wait for their dependencies.
pub const WAITING_REASON: &str = "WaitingForDependency";
/// Where each dependency's token is mounted: `<TOKEN_DIR>/<service>/token`.
pub const TOKEN_DIR: &str = "/var/run/secrets/skiff.io/deps";
/// The one projected volume holding every dependency's token, mounted at
/// [`TOKEN_DIR`].
pub const TOKEN_VOLUME: &str = "skiff-deps";

/// A port of a dependency: by number or by the Service port's name.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Port {
    Number(u16),
    Name(String),
}

impl fmt::Display for Port {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Port::Number(n) => write!(f, "{n}"),
            Port::Name(s) => f.write_str(s),
        }
    }
}

/// One declared dependency, its namespace resolved.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Dependency {
    pub namespace: String,
    pub service: String,
    /// `None`: every port of the Service.
    pub port: Option<Port>,
}

impl fmt::Display for Dependency {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.namespace, self.service)?;
        if let Some(p) = &self.port {
            write!(f, ":{p}")?;
        }
        Ok(())
    }
}

impl Dependency {
    /// The Service's name in cluster DNS.
    pub fn host(&self, cluster_domain: &str) -> String {
        format!("{}.{}.svc.{}", self.service, self.namespace, cluster_domain)
    }

    /// The audience of this dependency's token: `<service>.<namespace>.svc`.
    pub fn audience(&self) -> String {
        format!("{}.{}.svc", self.service, self.namespace)
    }

    /// `SKIFF_DEP_<SERVICE>`: the service name upper-cased, `-` → `_`.
    pub fn env_prefix(&self) -> String {
        format!(
            "SKIFF_DEP_{}",
            self.service.to_ascii_uppercase().replace('-', "_")
        )
    }

    /// The directory its token is mounted in.
    pub fn token_dir(&self) -> String {
        format!("{TOKEN_DIR}/{}", self.service)
    }
}

/// A malformed declaration: the entry and what is wrong with it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ParseError {
    pub entry: String,
    pub reason: String,
}

impl fmt::Display for ParseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "entry {:?}: {}", self.entry, self.reason)
    }
}

impl std::error::Error for ParseError {}

/// Parses a declaration made in namespace `namespace`. An empty (or
/// all-blank) value declares nothing. Errors name the first bad entry.
pub fn parse(value: &str, namespace: &str) -> Result<Vec<Dependency>, ParseError> {
    let mut out: Vec<Dependency> = vec![];
    if value.trim().is_empty() {
        return Ok(out);
    }
    for raw in value.split(',') {
        let entry = raw.trim();
        let err = |reason: String| ParseError {
            entry: entry.to_string(),
            reason,
        };
        if entry.is_empty() {
            return Err(err("empty entry (a comma too many?)".into()));
        }
        let (ns, rest) = match entry.split_once('/') {
            Some((ns, rest)) => (ns, rest),
            None => (namespace, entry),
        };
        if !is_dns1123_label(ns) {
            return Err(err(format!(
                "namespace {ns:?} is not a valid namespace name (a lowercase RFC 1123 label)"
            )));
        }
        let (svc, port) = match rest.split_once(':') {
            Some((s, p)) => (s, Some(p)),
            None => (rest, None),
        };
        if !is_dns1035_label(svc) {
            return Err(err(format!(
                "service {svc:?} is not a valid Service name (a lowercase RFC 1035 label)"
            )));
        }
        let port = match port {
            None => None,
            Some(p) if !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()) => {
                match p.parse::<u16>() {
                    Ok(n) if n > 0 => Some(Port::Number(n)),
                    _ => return Err(err(format!("port {p} is not between 1 and 65535"))),
                }
            }
            Some(p) if !p.is_empty() && port_name_errors(p).is_empty() => {
                Some(Port::Name(p.to_string()))
            }
            Some(p) => {
                return Err(err(format!(
                    "port {p:?} is neither a number nor a valid port name"
                )))
            }
        };
        let dep = Dependency {
            namespace: ns.to_string(),
            service: svc.to_string(),
            port,
        };
        if let Some(other) = out
            .iter()
            .find(|d| d.service == dep.service && d.namespace != dep.namespace)
        {
            return Err(err(format!(
                "service {:?} is also declared in namespace {:?}: the names of its \
                 environment variables and token directory would collide",
                dep.service, other.namespace
            )));
        }
        if !out.contains(&dep) {
            out.push(dep);
        }
    }
    Ok(out)
}

/// A declaration from an object's annotations (`None`: no annotation, or
/// one that does not parse — admission refuses those).
pub fn declared(
    annotations: Option<&BTreeMap<String, String>>,
    namespace: &str,
) -> Option<Vec<Dependency>> {
    let v = annotations?.get(ANNOTATION)?;
    parse(v, namespace).ok().filter(|d| !d.is_empty())
}

fn fnv(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf29ce484222325;
    for b in bytes {
        h ^= *b as u64;
        h = h.wrapping_mul(0x100000001b3);
    }
    h
}

/// The value of [`LABEL`] for a declaration: the same for the same set of
/// dependencies in any order.
pub fn label_value(deps: &[Dependency]) -> String {
    let set: BTreeSet<String> = deps.iter().map(|d| d.to_string()).collect();
    let joined: Vec<String> = set.into_iter().collect();
    format!("{:016x}", fnv(joined.join(",").as_bytes()))
}

/// The distinct services of a declaration, first entry of each kept.
pub fn services(deps: &[Dependency]) -> Vec<&Dependency> {
    let mut seen = BTreeSet::new();
    deps.iter()
        .filter(|d| seen.insert((&d.namespace, &d.service)))
        .collect()
}

/// A port of a Service, as the environment variables need it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServicePort {
    pub name: Option<String>,
    pub port: u16,
}

/// The environment variables of a dependent container, per dependency:
/// `_HOST` (the Service's DNS name), `_PORT` and `_ADDR` (`host:port`).
/// The port is the declared one (a name resolved against the Service), or
/// the Service's first port; unknown (no such Service yet, no such port
/// name), only `_HOST` is set. `ports` answers a Service's ports.
pub fn env(
    deps: &[Dependency],
    cluster_domain: &str,
    ports: impl Fn(&str, &str) -> Option<Vec<ServicePort>>,
) -> Vec<(String, String)> {
    let mut out = vec![];
    for d in services(deps) {
        let prefix = d.env_prefix();
        let host = d.host(cluster_domain);
        let port = match &d.port {
            Some(Port::Number(n)) => Some(*n),
            Some(Port::Name(name)) => ports(&d.namespace, &d.service).and_then(|ps| {
                ps.iter()
                    .find(|p| p.name.as_deref() == Some(name))
                    .map(|p| p.port)
            }),
            None => ports(&d.namespace, &d.service).and_then(|ps| ps.first().map(|p| p.port)),
        };
        out.push((format!("{prefix}_HOST"), host.clone()));
        if let Some(p) = port {
            out.push((format!("{prefix}_PORT"), p.to_string()));
            out.push((format!("{prefix}_ADDR"), format!("{host}:{p}")));
        }
    }
    out
}

/// The strongly connected components of a directed graph of `n` nodes
/// that are cycles: more than one node, or one node with an edge to
/// itself. Each component's nodes are sorted; components in order of
/// their smallest node.
pub fn cycles(n: usize, edges: &[(usize, usize)]) -> Vec<Vec<usize>> {
    let mut adj = vec![vec![]; n];
    let mut self_loop = vec![false; n];
    for &(a, b) in edges {
        if a < n && b < n {
            adj[a].push(b);
            if a == b {
                self_loop[a] = true;
            }
        }
    }
    // Tarjan's algorithm, iterative (a long chain must not overflow).
    let mut index = vec![usize::MAX; n];
    let mut low = vec![0; n];
    let mut on_stack = vec![false; n];
    let mut stack = vec![];
    let mut next = 0;
    let mut out = vec![];
    for root in 0..n {
        if index[root] != usize::MAX {
            continue;
        }
        let mut work: Vec<(usize, usize)> = vec![(root, 0)];
        index[root] = next;
        low[root] = next;
        next += 1;
        stack.push(root);
        on_stack[root] = true;
        while let Some(&mut (v, ref mut i)) = work.last_mut() {
            if *i < adj[v].len() {
                let w = adj[v][*i];
                *i += 1;
                if index[w] == usize::MAX {
                    index[w] = next;
                    low[w] = next;
                    next += 1;
                    stack.push(w);
                    on_stack[w] = true;
                    work.push((w, 0));
                } else if on_stack[w] {
                    low[v] = low[v].min(index[w]);
                }
                continue;
            }
            work.pop();
            if let Some(&(parent, _)) = work.last() {
                low[parent] = low[parent].min(low[v]);
            }
            if low[v] == index[v] {
                let mut comp = vec![];
                while let Some(w) = stack.pop() {
                    on_stack[w] = false;
                    comp.push(w);
                    if w == v {
                        break;
                    }
                }
                if comp.len() > 1 || self_loop[v] {
                    comp.sort_unstable();
                    out.push(comp);
                }
            }
        }
    }
    out.sort();
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dep(ns: &str, svc: &str, port: Option<Port>) -> Dependency {
        Dependency {
            namespace: ns.into(),
            service: svc.into(),
            port,
        }
    }

    #[test]
    fn entries_take_the_pods_namespace_and_an_optional_port() {
        let d = parse(" api, data/db:5432 ,cache:redis", "shop").unwrap();
        assert_eq!(
            d,
            vec![
                dep("shop", "api", None),
                dep("data", "db", Some(Port::Number(5432))),
                dep("shop", "cache", Some(Port::Name("redis".into()))),
            ]
        );
        assert_eq!(parse("  ", "x").unwrap(), vec![]);
        // The same entry twice is one dependency; two ports of one Service
        // are two.
        assert_eq!(parse("db,db", "x").unwrap().len(), 1);
        assert_eq!(parse("db:1,db:2", "x").unwrap().len(), 2);
    }

    #[test]
    fn a_malformed_entry_is_named_with_its_fault() {
        let bad = |v: &str| parse(v, "ns").unwrap_err();
        assert_eq!(bad("api,,db").entry, "");
        let e = bad("api, Web");
        assert_eq!(e.entry, "Web");
        assert!(e.reason.contains("not a valid Service name"), "{e}");
        assert!(bad("1api").reason.contains("Service name"));
        assert!(bad("Bad_NS/api").reason.contains("namespace"));
        assert!(bad("db:0").reason.contains("between 1 and 65535"));
        assert!(bad("db:70000").reason.contains("between 1 and 65535"));
        assert!(bad("db:a--b").reason.contains("neither a number"));
        assert!(bad("db:").reason.contains("neither a number"));
        assert!(bad("a/db,b/db").reason.contains("collide"));
        assert!(bad("a/b/c").reason.contains("Service name"));
    }

    #[test]
    fn the_label_is_the_same_for_the_same_set_in_any_order() {
        let a = parse("db,api:80", "x").unwrap();
        let b = parse("api:80, db, x/db", "x").unwrap();
        assert_eq!(label_value(&a), label_value(&b));
        assert_ne!(label_value(&a), label_value(&parse("db", "x").unwrap()));
        assert_eq!(label_value(&a).len(), 16);
    }

    #[test]
    fn environment_names_hosts_and_ports() {
        let d = parse("my-db, other/cache:redis, api:8080", "shop").unwrap();
        let ports = |ns: &str, svc: &str| match (ns, svc) {
            ("shop", "my-db") => Some(vec![
                ServicePort {
                    name: Some("pg".into()),
                    port: 5432,
                },
                ServicePort {
                    name: Some("metrics".into()),
                    port: 9187,
                },
            ]),
            ("other", "cache") => Some(vec![ServicePort {
                name: Some("redis".into()),
                port: 6379,
            }]),
            _ => None,
        };
        let env = env(&d, "cluster.local", ports);
        let get = |k: &str| env.iter().find(|(n, _)| n == k).map(|(_, v)| v.as_str());
        assert_eq!(
            get("SKIFF_DEP_MY_DB_HOST"),
            Some("my-db.shop.svc.cluster.local")
        );
        assert_eq!(get("SKIFF_DEP_MY_DB_PORT"), Some("5432"));
        assert_eq!(
            get("SKIFF_DEP_MY_DB_ADDR"),
            Some("my-db.shop.svc.cluster.local:5432")
        );
        assert_eq!(get("SKIFF_DEP_CACHE_PORT"), Some("6379"));
        // A declared number needs no Service to be known.
        assert_eq!(get("SKIFF_DEP_API_PORT"), Some("8080"));
        // An unknown Service: the host only.
        let env2 = super::env(&parse("ghost:http", "x").unwrap(), "c.l", |_, _| None);
        assert_eq!(
            env2,
            vec![(
                "SKIFF_DEP_GHOST_HOST".to_string(),
                "ghost.x.svc.c.l".to_string()
            )]
        );
    }

    #[test]
    fn token_audience_and_path() {
        let d = dep("ns", "db", None);
        assert_eq!(d.audience(), "db.ns.svc");
        assert_eq!(d.token_dir(), "/var/run/secrets/skiff.io/deps/db");
    }

    #[test]
    fn cycles_are_components_of_two_or_more_or_a_self_loop() {
        // 0 → 1 → 2 → 0 is a cycle; 3 → 3 too; 4 → 0 is not in one.
        let c = cycles(6, &[(0, 1), (1, 2), (2, 0), (3, 3), (4, 0), (5, 4)]);
        assert_eq!(c, vec![vec![0, 1, 2], vec![3]]);
        assert!(cycles(3, &[(0, 1), (1, 2)]).is_empty());
        // A long chain does not overflow the stack.
        let n = 200_000;
        let chain: Vec<(usize, usize)> = (0..n - 1).map(|i| (i, i + 1)).collect();
        assert!(cycles(n, &chain).is_empty());
        let mut ring = chain.clone();
        ring.push((n - 1, 0));
        assert_eq!(cycles(n, &ring)[0].len(), n);
    }
}
