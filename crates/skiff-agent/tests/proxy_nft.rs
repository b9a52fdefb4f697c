//! The service proxy's transactions against the real kernel (root, nft):
//! a full replace, incremental changes, a refused transaction leaving the
//! previous rules in force, and the table's removal. Each test uses its own
//! table and addresses from the benchmarking range 198.18.0.0/15, so
//! nothing else on the machine is affected.

use std::net::Ipv4Addr;
use std::process::Command;

use k8s_openapi::api::networking::v1::NetworkPolicy;
use skiff_agent::proxy::model::{Endpoint, PortKey, PortPlan, Protocol};
use skiff_agent::proxy::nft::{self, Nft};
use skiff_agent::proxy::policy::model::{render, NamedPort, PodInfo};
use skiff_agent::proxy::rules::{self, Home, Op, PortRules};

fn nft_available() -> bool {
    Command::new(skiff_agent::proxy::nft::tool("nft"))
        .args(["list", "tables"])
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false)
}

/// One table as nft lists it.
fn list_one(table: &str) -> String {
    // Retried: a listing racing a transaction can fail.
    for _ in 0..50 {
        let o = Command::new(skiff_agent::proxy::nft::tool("nft"))
            .args(["list", "table", "ip", table])
            .output()
            .unwrap();
        if o.status.success() {
            return String::from_utf8_lossy(&o.stdout).to_string();
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    panic!("nft could not list table {table}");
}

/// skiff's main table and all its service shards.
fn list(table: &str) -> String {
    nft::all_tables(table).iter().map(|t| list_one(t)).collect()
}

fn ep(ip: &str, port: u16) -> Endpoint {
    Endpoint {
        ip: ip.parse().unwrap(),
        port,
    }
}

fn plan(name: &str, vip: &str, eps: &[Endpoint]) -> PortPlan {
    let node_port = if name == "web" { 30999 } else { 30998 };
    PortPlan {
        key: PortKey {
            namespace: "default".into(),
            name: name.into(),
            protocol: Protocol::Tcp,
            port_name: "http".into(),
        },
        cluster_ip: vip.parse().unwrap(),
        port: 80,
        node_port: Some(node_port),
        external_ips: vec![],
        cluster_endpoints: eps.to_vec(),
        local_endpoints: vec![],
        has_endpoints: !eps.is_empty(),
        internal_local: false,
        external_local: false,
        affinity: Some(30),
        health_check_node_port: None,
    }
}

struct Table(String);
impl Drop for Table {
    fn drop(&mut self) {
        let _ = nft::delete_table(&self.0);
    }
}

const CIDR: Option<(Ipv4Addr, u8)> = Some((Ipv4Addr::new(198, 19, 0, 0), 16));

#[tokio::test]
async fn transactions_replace_update_and_fail_atomically() {
    if !nft_available() {
        eprintln!("skipping: nft is not usable here (needs root and nftables)");
        return;
    }
    let table = Table(format!("skiff-test-{}", std::process::id()));
    let nft = Nft::new(&table.0);
    let node: Vec<Ipv4Addr> = vec!["198.18.0.1".parse().unwrap()];

    let web = rules::port_rules(&plan("web", "198.18.10.1", &[ep("198.19.0.5", 8080)]), CIDR);
    let empty = rules::port_rules(&plan("empty", "198.18.10.2", &[]), CIDR);
    let web_home = rules::shard_of("default", "web");
    let empty_home = rules::shard_of("default", "empty");
    nft.replace_all(&node, &[(web_home, &web), (empty_home, &empty)])
        .await
        .unwrap();
    // The service's DNAT lives in its shard; its no-endpoint entries and
    // the hooks they need in the main table.
    let shard = list_one(&nft.table_of(web_home));
    assert!(
        shard.contains("198.18.10.1 . tcp . 80 : goto svc-default/web/tcp/http"),
        "{shard}"
    );
    assert!(
        shard.contains("type nat hook prerouting priority dstnat"),
        "{shard}"
    );
    let main = list_one(&table.0);
    assert!(!main.contains("svc-default/web"), "{main}");
    assert!(
        main.contains("198.18.10.2 . tcp . 80 : goto reject-chain"),
        "{main}"
    );
    let t = list(&table.0);
    assert!(
        t.contains("198.18.10.1 . tcp . 80 : goto svc-default/web/tcp/http"),
        "{t}"
    );
    assert!(
        t.contains("198.18.10.2 . tcp . 80 : goto reject-chain"),
        "{t}"
    );
    assert!(t.contains("tcp . 30998 : goto reject-chain"), "{t}");
    assert!(t.contains("dnat to 198.19.0.5:8080"), "{t}");
    assert!(
        t.contains("198.18.0.1"),
        "node address in nodeport-ips: {t}"
    );
    assert!(
        t.contains("update @aff-default/web/tcp/http/198.19.0.5:8080 { ip saddr }"),
        "{t}"
    );

    // Incremental: a second endpoint for web, the empty service gains one.
    let web2 = rules::port_rules(
        &plan(
            "web",
            "198.18.10.1",
            &[ep("198.19.0.5", 8080), ep("198.19.0.6", 8080)],
        ),
        CIDR,
    );
    let empty2 = rules::port_rules(&plan("empty", "198.18.10.2", &[ep("198.19.0.9", 80)]), CIDR);
    let mut ops: Vec<(Home, Op)> = rules::diff(&web, &web2)
        .into_iter()
        .map(|o| (web_home, o))
        .collect();
    ops.extend(
        rules::diff(&empty, &empty2)
            .into_iter()
            .map(|o| (empty_home, o)),
    );
    ops.push((Home::Main, Op::AddHairpin("198.19.0.6".parse().unwrap())));
    ops.sort_by_key(|(_, o)| o.phase());
    nft.apply(&ops).await.unwrap();
    let t = list(&table.0);
    assert!(t.contains("198.19.0.6 . 198.19.0.6"), "{t}");
    assert!(
        t.contains("numgen random mod 2 0 goto ep-default/web/tcp/http/198.19.0.5:8080"),
        "{t}"
    );
    assert!(t.contains("dnat to 198.19.0.6:8080"), "{t}");
    assert!(
        !t.contains("198.18.10.2 . tcp . 80 : goto reject-chain"),
        "{t}"
    );
    assert!(
        t.contains("198.18.10.2 . tcp . 80 : goto svc-default/empty/tcp/http"),
        "{t}"
    );

    // A transaction the kernel refuses (a rule in a chain that does not
    // exist after a valid first step) changes nothing at all.
    let before = list(&table.0);
    let bad = vec![
        (
            web_home,
            Op::DeleteElement(
                rules::SERVICE_IPS,
                rules::MapKey::Ip("198.18.10.1".parse().unwrap(), Protocol::Tcp, 80),
            ),
        ),
        (
            Home::Main,
            Op::AddRule("no-such-chain".into(), rules::Rule::Drop),
        ),
    ];
    assert!(nft.apply(&bad).await.is_err());
    assert_eq!(list(&table.0), before);

    // Removing every endpoint of web: back to a reject, chains gone.
    let web3 = rules::port_rules(&plan("web", "198.18.10.1", &[]), CIDR);
    let ops: Vec<(Home, Op)> = rules::diff(&web2, &web3)
        .into_iter()
        .map(|o| (web_home, o))
        .collect();
    nft.apply(&ops).await.unwrap();
    let t = list(&table.0);
    assert!(
        t.contains("198.18.10.1 . tcp . 80 : goto reject-chain"),
        "{t}"
    );
    assert!(!t.contains("ep-default/web"), "{t}");
    assert!(!t.contains("aff-default/web"), "{t}");

    // And a full replace of a table that exists works the same way.
    nft.replace_all(&node, &[(web_home, &PortRules::default())])
        .await
        .unwrap();
    assert!(!list(&table.0).contains("svc-default"));

    nft::delete_table(&table.0).unwrap();
    // Every shard goes with the main table.
    assert!(!Command::new(skiff_agent::proxy::nft::tool("nft"))
        .args(["list", "tables"])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).contains(&table.0))
        .unwrap());
    // Deleting it again is fine.
    nft::delete_table(&table.0).unwrap();
}

fn policy_pod(ns: &str, name: &str, ip: &str, app: &str, local: bool) -> PodInfo {
    PodInfo {
        namespace: ns.into(),
        name: name.into(),
        ip: ip.parse().unwrap(),
        labels: [("app".to_string(), app.to_string())].into(),
        ports: vec![NamedPort {
            name: "http".into(),
            protocol: Protocol::Tcp,
            port: 8080,
        }],
        local,
    }
}

#[tokio::test]
async fn network_policy_chains_are_programmed_whole_and_changed_incrementally() {
    if !nft_available() {
        eprintln!("skipping: nft is not usable here (needs root and nftables)");
        return;
    }
    let table = Table(format!("skiff-test-pol-{}", std::process::id()));
    let nft = Nft::new(&table.0);
    let pods = vec![
        policy_pod("default", "web", "198.18.7.5", "web", true),
        policy_pod("default", "client", "198.18.8.6", "client", false),
    ];
    let namespaces = Default::default();
    let policy: NetworkPolicy = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "p", "namespace": "default"},
        "spec": {"podSelector": {"matchLabels": {"app": "web"}},
          "policyTypes": ["Ingress", "Egress"],
          "ingress": [{"from": [{"podSelector": {"matchLabels": {"app": "client"}}},
                                {"ipBlock": {"cidr": "198.19.0.0/16", "except": ["198.19.5.0/24"]}}],
                       "ports": [{"port": "http"}, {"port": 9000, "endPort": 9010, "protocol": "UDP"}]}],
          "egress": [{"ports": [{"port": 53, "protocol": "UDP"}]}]}
    }))
    .unwrap();
    let dns = ["198.18.0.10".parse().unwrap()];
    let first = render(&pods, &namespaces, std::slice::from_ref(&policy), &dns);
    assert!(first.unsupported.is_empty());
    nft.replace_all(&[], &[(Home::Main, &first.rules)])
        .await
        .unwrap();
    // (nft lists `meta l4proto tcp th dport` as `tcp dport`.)
    let t = list(&table.0);
    for want in [
        "ct state established,related accept",
        "ip saddr vmap @policy-egress",
        "ip daddr vmap @policy-ingress",
        "198.18.7.5 : jump pol-in/198.18.7.5",
        "ip saddr 198.18.8.6 tcp dport 8080 return",
        "ip saddr 198.19.0.0/16 ip saddr != 198.19.5.0/24 udp dport 9000-9010 return",
        "chain pol-out/198.18.7.5 {\n\t\tudp dport 53 return\n\t\tdrop",
        "ip daddr 198.18.0.10 ip saddr vmap @policy-egress",
    ] {
        assert!(t.contains(want), "missing `{want}` in:\n{t}");
    }
    // A new client pod changes only the ingress chain's rules.
    let mut more = pods.clone();
    more.push(policy_pod(
        "default",
        "client2",
        "198.18.8.7",
        "client",
        false,
    ));
    let second = render(&more, &namespaces, &[policy], &dns);
    let ops = rules::diff(&first.rules, &second.rules);
    assert!(
        ops.iter().all(
            |o| matches!(o, Op::FlushChain(c) | Op::AddRule(c, _) if c == "pol-in/198.18.7.5")
        ),
        "{ops:?}"
    );
    let ops: Vec<(Home, Op)> = ops.into_iter().map(|o| (Home::Main, o)).collect();
    nft.apply(&ops).await.unwrap();
    let t = list(&table.0);
    assert!(
        t.contains("ip saddr { 198.18.8.6, 198.18.8.7 } tcp dport 8080 return"),
        "{t}"
    );
    // A transaction nft refuses (a rule in a chain that does not exist)
    // changes nothing: the policy rules in force stay as they were.
    let before = list(&table.0);
    let mut bad: Vec<(Home, Op)> = rules::diff(&second.rules, &first.rules)
        .into_iter()
        .map(|o| (Home::Main, o))
        .collect();
    bad.push((
        Home::Main,
        Op::AddRule("pol-in/198.18.99.99".into(), rules::Rule::Drop),
    ));
    assert!(nft.apply(&bad).await.is_err());
    assert_eq!(list(&table.0), before);

    // No policy left: the chains and map elements go, the base chains stay.
    let none = render(&more, &namespaces, &[], &dns);
    let ops: Vec<(Home, Op)> = rules::diff(&second.rules, &none.rules)
        .into_iter()
        .map(|o| (Home::Main, o))
        .collect();
    nft.apply(&ops).await.unwrap();
    let t = list(&table.0);
    assert!(!t.contains("pol-in/"), "{t}");
    assert!(t.contains("chain policy-forward"), "{t}");
}

/// Runs `ip` with `args`, which must succeed.
fn ip(args: &[&str]) {
    let o = Command::new("ip").args(args).output().expect("ip");
    assert!(
        o.status.success(),
        "ip {args:?}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
}

/// A network namespace of the test's own, deleted when dropped.
struct Ns(String);

impl Drop for Ns {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["netns", "del", &self.0]).output();
    }
}

/// Runs this test binary's ignored test `name` inside namespace `ns`,
/// which must pass.
fn run_in(ns: &str, name: &str) {
    let out = Command::new("ip")
        .args(["netns", "exec", ns])
        .arg(std::env::current_exe().unwrap())
        .args(["--exact", "--ignored", "--nocapture", name])
        .env("SKIFF_TEST_IN_NETNS", ns)
        .output()
        .expect("run the check in the namespace");
    let log = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{log}");
    assert!(log.contains("1 passed"), "the check did not run: {log}");
}

/// A new namespace `<prefix>-<pid>` with `lo` up and a port-less bridge
/// `node0` (no extra kernel module needed) holding `addrs` as /32s.
fn netns(prefix: &str, addrs: &[&str]) -> Ns {
    let ns = Ns(format!("{prefix}-{}", std::process::id()));
    ip(&["netns", "add", &ns.0]);
    ip(&["-n", &ns.0, "link", "set", "lo", "up"]);
    ip(&["-n", &ns.0, "link", "add", "node0", "type", "bridge"]);
    for a in addrs {
        ip(&[
            "-n",
            &ns.0,
            "addr",
            "add",
            &format!("{a}/32"),
            "dev",
            "node0",
        ]);
    }
    ip(&["-n", &ns.0, "link", "set", "node0", "up"]);
    ns
}

/// The node's own connections to a host-network endpoint (the agent's to the
/// API server behind `kubernetes`) survive the proxy's first transaction.
/// In a fresh network namespace that transaction is the first to need
/// conntrack, so a connection established before it is picked up mid-stream;
/// were the hairpin masquerade not limited to DNATed connections, the
/// endpoint's `node . node` pair would NAT it then, and the first bytes the
/// server sends after would be lost without either side being told (a watch
/// on it stalls). Runs the check below in its own network namespace.
#[test]
fn connections_to_the_nodes_own_address_survive_the_first_transaction() {
    if !nft_available() {
        eprintln!("skipping: nft is not usable here (needs root and nftables)");
        return;
    }
    let guard = netns("skiff-test-hp", &["198.18.0.1"]);
    let ns = guard.0.clone();
    run_in(
        &ns,
        "in_netns_a_connection_to_the_node_outlives_the_first_transaction",
    );
}

#[tokio::test]
#[ignore = "run by connections_to_the_nodes_own_address_survive_the_first_transaction"]
async fn in_netns_a_connection_to_the_node_outlives_the_first_transaction() {
    use std::io::{Read, Write};
    if std::env::var_os("SKIFF_TEST_IN_NETNS").is_none() {
        return;
    }
    let node: Ipv4Addr = "198.18.0.1".parse().unwrap();
    let listener = std::net::TcpListener::bind((node, 0)).unwrap();
    let port = listener.local_addr().unwrap().port();
    let mut client = std::net::TcpStream::connect((node, port)).unwrap();
    let (mut server, _) = listener.accept().unwrap();
    for s in [&client, &server] {
        s.set_read_timeout(Some(std::time::Duration::from_secs(3)))
            .unwrap();
    }
    let mut buf = [0u8; 5];
    client.write_all(b"watch").unwrap();
    server.read_exact(&mut buf).unwrap();

    let table = Table(format!("skiff-test-{}", std::process::id()));
    let nft = Nft::new(&table.0);
    let api = rules::port_rules(&plan("api", "198.18.10.1", &[ep("198.18.0.1", port)]), CIDR);
    nft.replace_all(&[node], &[(rules::shard_of("default", "api"), &api)])
        .await
        .unwrap();
    let t = list(&table.0);
    assert!(t.contains("198.18.0.1 . 198.18.0.1"), "hairpin pair: {t}");

    // The server speaks first (a watch event), then the client.
    server.write_all(b"event").unwrap();
    client
        .read_exact(&mut buf)
        .expect("the server's bytes reach the client");
    assert_eq!(&buf, b"event");
    client.write_all(b"again").unwrap();
    server
        .read_exact(&mut buf)
        .expect("the client's bytes reach the server");
    assert_eq!(&buf, b"again");
}

/// Real connections to a ClusterIP spread over its endpoints, with both
/// writers' shapes: netlink's endpoint map (`numgen random mod K map`) and
/// the `nft` binary's numgen rules, before and after a third endpoint is
/// added incrementally. Runs the check below in its own network namespace
/// (the endpoints are local addresses there; the client's connections
/// pass the NAT output hook).
#[test]
fn connections_to_a_cluster_ip_reach_every_endpoint() {
    if !nft_available() {
        eprintln!("skipping: nft is not usable here (needs root and nftables)");
        return;
    }
    let guard = netns(
        "skiff-test-sp",
        &["198.19.0.5", "198.19.0.6", "198.19.0.7", "198.19.0.9"],
    );
    let ns = guard.0.clone();
    // The service range is routed (as on a node); clients speak from a
    // pod-range address, so nothing is masqueraded.
    ip(&[
        "-n",
        &ns,
        "route",
        "add",
        "198.18.10.0/24",
        "dev",
        "node0",
        "src",
        "198.19.0.9",
    ]);
    run_in(&ns, "in_netns_connections_spread_over_endpoints");
}

/// Counts, per endpoint address, the connections `n` clients of
/// 198.18.10.1:80 were served by (each endpoint answers its address).
fn spread(n: usize) -> std::collections::BTreeMap<String, usize> {
    use std::io::Read;
    let mut seen = std::collections::BTreeMap::new();
    for _ in 0..n {
        let mut c = std::net::TcpStream::connect_timeout(
            &"198.18.10.1:80".parse().unwrap(),
            std::time::Duration::from_secs(3),
        )
        .expect("connect to the ClusterIP");
        c.set_read_timeout(Some(std::time::Duration::from_secs(3)))
            .unwrap();
        let mut who = String::new();
        c.read_to_string(&mut who).expect("the endpoint answers");
        *seen.entry(who).or_insert(0) += 1;
    }
    seen
}

#[tokio::test]
#[ignore = "run by connections_to_a_cluster_ip_reach_every_endpoint"]
async fn in_netns_connections_spread_over_endpoints() {
    use std::io::Write;
    if std::env::var_os("SKIFF_TEST_IN_NETNS").is_none() {
        return;
    }
    // One listener per endpoint address, on one port, answering its name.
    let first = std::net::TcpListener::bind(("198.19.0.5", 0)).unwrap();
    let port = first.local_addr().unwrap().port();
    let mut listeners = vec![first];
    for a in ["198.19.0.6", "198.19.0.7"] {
        listeners.push(std::net::TcpListener::bind((a, port)).unwrap());
    }
    for l in listeners {
        std::thread::spawn(move || {
            let me = l.local_addr().unwrap().ip().to_string();
            for mut s in l.incoming().flatten() {
                let _ = s.write_all(me.as_bytes());
            }
        });
    }
    let web = |eps: &[&str], shape: rules::Shape| {
        let mut p = plan(
            "web",
            "198.18.10.1",
            &eps.iter().map(|a| ep(a, port)).collect::<Vec<_>>(),
        );
        p.affinity = None;
        p.node_port = None;
        rules::port_rules_shaped(&p, CIDR, shape)
    };
    let home = rules::shard_of("default", "web");
    for backend in [nft::Backend::Netlink, nft::Backend::Binary] {
        let shape = backend.shape();
        let table = Table(format!("skiff-test-sp-{}", std::process::id()));
        let nft = Nft::with_backend(&table.0, backend).with_cluster_cidr(CIDR);
        let two = web(&["198.19.0.5", "198.19.0.6"], shape);
        nft.replace_all(&[], &[(home, &two)]).await.unwrap();
        let t = list(&table.0);
        let seen = spread(40);
        assert_eq!(
            seen.keys().cloned().collect::<Vec<_>>(),
            vec!["198.19.0.5", "198.19.0.6"],
            "{backend:?}: {seen:?}\n{t}"
        );
        // Uniform: each of two endpoints gets far more than a few of 40.
        assert!(seen.values().all(|n| *n >= 8), "{backend:?}: {seen:?}");

        // A third endpoint, incrementally (new map, or one more rule).
        let three = web(&["198.19.0.5", "198.19.0.6", "198.19.0.7"], shape);
        let mut ops: Vec<(Home, Op)> = rules::diff(&two, &three)
            .into_iter()
            .map(|o| (home, o))
            .collect();
        ops.push((Home::Main, Op::AddHairpin("198.19.0.7".parse().unwrap())));
        ops.sort_by_key(|(_, o)| o.phase());
        nft.apply(&ops).await.unwrap();
        let seen = spread(60);
        assert_eq!(seen.len(), 3, "{backend:?}: {seen:?}\n{}", list(&table.0));
        assert!(seen.values().all(|n| *n >= 6), "{backend:?}: {seen:?}");
    }
}
