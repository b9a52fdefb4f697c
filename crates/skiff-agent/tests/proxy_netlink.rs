//! skiff's netlink writer against the `nft` binary (root, nftables): the
//! same services, policies and changes applied through both into two
//! tables of their own must list the same (`nft list table`, names
//! aside), and a refused netlink batch leaves the rules in force. The
//! endpoint maps only netlink writes (nft 1.0's JSON cannot declare them)
//! must list as what `nft -f` makes of the same text. Addresses are from
//! the benchmarking range 198.18.0.0/15.

use std::net::Ipv4Addr;
use std::process::Command;

use k8s_openapi::api::networking::v1::NetworkPolicy;
use skiff_agent::proxy::model::{Endpoint, PortKey, PortPlan, Protocol};
use skiff_agent::proxy::netlink;
use skiff_agent::proxy::nft::{self, Backend, Nft};
use skiff_agent::proxy::policy::model::{render, NamedPort, PodInfo};
use skiff_agent::proxy::rules::{self, Home, Op, PortRules, Shape};

fn nft_available() -> bool {
    Command::new(nft::tool("nft"))
        .args(["list", "tables"])
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false)
}

fn list_one(table: &str) -> String {
    let o = Command::new(nft::tool("nft"))
        .args(["list", "table", "ip", table])
        .output()
        .unwrap();
    assert!(
        o.status.success(),
        "nft list table {table}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8_lossy(&o.stdout).to_string()
}

/// Every table of `main`, with the name replaced so two can be compared.
fn listing(main: &str) -> String {
    nft::all_tables(main)
        .iter()
        .map(|t| list_one(t).replace(main, "T"))
        .collect()
}

/// The same `nft -j` listing (handles removed: they count objects ever
/// created, which differs between the writers).
fn json_listing(main: &str) -> serde_json::Value {
    fn strip(v: &mut serde_json::Value) {
        match v {
            serde_json::Value::Object(m) => {
                m.remove("handle");
                m.remove("metainfo");
                for x in m.values_mut() {
                    strip(x);
                }
            }
            serde_json::Value::Array(a) => a.iter_mut().for_each(strip),
            _ => {}
        }
    }
    let mut all = vec![];
    for t in nft::all_tables(main) {
        let o = Command::new(nft::tool("nft"))
            .args(["-j", "list", "table", "ip", &t])
            .output()
            .unwrap();
        assert!(o.status.success());
        let text = String::from_utf8_lossy(&o.stdout).replace(main, "T");
        let mut v: serde_json::Value = serde_json::from_str(&text).unwrap();
        strip(&mut v);
        all.push(v);
    }
    serde_json::Value::Array(all)
}

/// Fails with the lines that differ (the listings are long).
fn same(a: &str, b: &str, what: &str) {
    if a == b {
        return;
    }
    let (la, lb): (Vec<&str>, Vec<&str>) = (a.lines().collect(), b.lines().collect());
    let only_a: Vec<&&str> = la.iter().filter(|l| !lb.contains(l)).collect();
    let only_b: Vec<&&str> = lb.iter().filter(|l| !la.contains(l)).collect();
    panic!(
        "{what}: nft binary only {only_a:#?}\nnetlink only {only_b:#?}\n(netlink listing:\n{b})"
    );
}

struct Table(String);
impl Drop for Table {
    fn drop(&mut self) {
        let _ = nft::delete_table(&self.0);
    }
}

fn ep(ip: &str, port: u16) -> Endpoint {
    Endpoint {
        ip: ip.parse().unwrap(),
        port,
    }
}

const CIDR: Option<(Ipv4Addr, u8)> = Some((Ipv4Addr::new(198, 19, 0, 0), 16));

fn plan(name: &str, vip: &str, eps: &[Endpoint]) -> PortPlan {
    PortPlan {
        key: PortKey {
            namespace: "default".into(),
            name: name.into(),
            protocol: Protocol::Tcp,
            port_name: "http".into(),
        },
        cluster_ip: vip.parse().unwrap(),
        port: 80,
        node_port: None,
        external_ips: vec![],
        cluster_endpoints: eps.to_vec(),
        local_endpoints: vec![],
        has_endpoints: !eps.is_empty(),
        internal_local: false,
        external_local: false,
        affinity: None,
        health_check_node_port: None,
    }
}

/// Services of every shape the proxy writes, by name.
fn services(version: u8, shape: Shape) -> Vec<(String, PortRules)> {
    let mut out = vec![];
    let mut web = plan(
        "web",
        "198.18.10.1",
        &[ep("198.19.0.5", 8080), ep("198.19.0.6", 8080)],
    );
    if version == 2 {
        web.cluster_endpoints.push(ep("198.19.0.7", 8080));
    }
    out.push(("web".to_string(), web));
    let mut sticky = plan("sticky", "198.18.10.2", &[ep("198.19.1.5", 80)]);
    sticky.affinity = Some(10800);
    sticky.node_port = Some(30001);
    if version == 2 {
        sticky.cluster_endpoints = vec![ep("198.19.1.6", 80)];
    }
    out.push(("sticky".to_string(), sticky));
    let mut local = plan("local", "198.18.10.3", &[ep("198.19.2.5", 53)]);
    local.key.protocol = Protocol::Udp;
    local.port = 53;
    local.node_port = Some(30002);
    local.external_ips = vec!["198.18.200.1".parse().unwrap()];
    local.external_local = true;
    local.local_endpoints = vec![ep("198.19.2.5", 53)];
    out.push(("local".to_string(), local));
    let empty = plan("empty", "198.18.10.4", &[]);
    let mut empty_np = empty.clone();
    empty_np.key.name = "empty-np".into();
    empty_np.cluster_ip = "198.18.10.5".parse().unwrap();
    empty_np.node_port = Some(30003);
    out.push(("empty".to_string(), empty));
    out.push(("empty-np".to_string(), empty_np));
    let mut internal = plan("internal", "198.18.10.6", &[ep("198.19.3.5", 80)]);
    internal.internal_local = true;
    out.push(("internal".to_string(), internal));
    if version == 2 {
        let mut sctp = plan("sctp", "198.18.10.7", &[ep("198.19.4.5", 9)]);
        sctp.key.protocol = Protocol::Sctp;
        out.push(("sctp".to_string(), sctp));
    }
    out.into_iter()
        .map(|(n, p)| (n, rules::port_rules_shaped(&p, CIDR, shape)))
        .collect()
}

fn policy_pod(name: &str, ip: &str, app: &str, local: bool) -> PodInfo {
    PodInfo {
        namespace: "default".into(),
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

fn policy_rules(version: u8) -> PortRules {
    let mut pods = vec![
        policy_pod("web", "198.18.7.5", "web", true),
        policy_pod("client", "198.18.8.6", "client", false),
    ];
    if version == 2 {
        pods.push(policy_pod("client2", "198.18.8.7", "client", false));
    }
    let except: Vec<&str> = if version == 2 {
        vec!["198.19.5.0/24", "198.19.200.0/21", "198.19.6.0/24"]
    } else {
        vec!["198.19.5.0/24"]
    };
    let policy: NetworkPolicy = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "p", "namespace": "default"},
        "spec": {"podSelector": {"matchLabels": {"app": "web"}},
          "policyTypes": ["Ingress", "Egress"],
          "ingress": [{"from": [{"podSelector": {"matchLabels": {"app": "client"}}},
                                {"ipBlock": {"cidr": "198.19.0.0/16", "except": except}},
                                {"ipBlock": {"cidr": "198.18.96.0/19"}}],
                       "ports": [{"port": "http"}, {"port": 9000, "endPort": 9010, "protocol": "UDP"}]}],
          "egress": [{"ports": [{"port": 53, "protocol": "UDP"}]}]}
    }))
    .unwrap();
    let dns: Vec<Ipv4Addr> = if version == 2 {
        vec![
            "198.18.0.10".parse().unwrap(),
            "198.18.0.11".parse().unwrap(),
        ]
    } else {
        vec!["198.18.0.10".parse().unwrap()]
    };
    let r = render(&pods, &Default::default(), &[policy], &dns);
    assert!(r.unsupported.is_empty());
    r.rules
}

fn all(version: u8, shape: Shape) -> Vec<(Home, PortRules)> {
    let mut v: Vec<(Home, PortRules)> = services(version, shape)
        .into_iter()
        .map(|(n, r)| (rules::shard_of("default", &n), r))
        .collect();
    v.push((Home::Main, policy_rules(version)));
    v
}

/// The incremental ops from `version` 1 to 2, as the proxy orders them.
fn changes(shape: Shape) -> Vec<(Home, Op)> {
    let (old, new) = (all(1, shape), all(2, shape));
    let mut ops = vec![];
    let empty = PortRules::default();
    for (i, (home, n)) in new.iter().enumerate() {
        // Same services in the same order, plus one at the end of v2's
        // services (before the policy, which is last in both).
        let o = if i == new.len() - 1 {
            &old[old.len() - 1].1
        } else {
            old.get(i)
                .filter(|(h, _)| h == home && i < old.len() - 1)
                .map(|(_, r)| r)
                .unwrap_or(&empty)
        };
        ops.extend(rules::diff(o, n).into_iter().map(|op| (*home, op)));
    }
    let old_eps: std::collections::BTreeSet<Ipv4Addr> =
        old.iter().flat_map(|(_, r)| r.endpoints.clone()).collect();
    for (_, r) in &new {
        for ip in &r.endpoints {
            if !old_eps.contains(ip) {
                ops.push((Home::Main, Op::AddHairpin(*ip)));
            }
        }
    }
    ops.sort_by_key(|(_, op)| op.phase());
    ops
}

#[tokio::test]
async fn netlink_batches_program_what_the_nft_binary_programs() {
    if !nft_available() {
        eprintln!("skipping: nft is not usable here (needs root and nftables)");
        return;
    }
    let pid = std::process::id();
    let a = Table(format!("skiff-nlcmp-bin-{pid}"));
    let b = Table(format!("skiff-nlcmp-nl-{pid}"));
    let bin = Nft::with_backend(&a.0, Backend::Binary).with_cluster_cidr(CIDR);
    let nl = Nft::with_backend(&b.0, Backend::Netlink).with_cluster_cidr(CIDR);
    let node: Vec<Ipv4Addr> = vec!["198.18.0.1".parse().unwrap(), "198.18.0.2".parse().unwrap()];

    let v1 = all(1, Shape::Rules);
    let refs: Vec<(Home, &PortRules)> = v1.iter().map(|(h, r)| (*h, r)).collect();
    bin.replace_all(&node, &refs).await.unwrap();
    nl.replace_all(&node, &refs).await.unwrap();
    let (la, lb) = (listing(&a.0), listing(&b.0));
    same(&la, &lb, "full load");
    for want in [
        "numgen random mod 2 0 meta l4proto tcp dnat to 198.19.0.5:8080",
        "update @aff-default/sticky/tcp/http/198.19.1.5:80 { ip saddr }",
        "ct status dnat ip saddr . ip daddr @hairpin masquerade fully-random",
        "ip saddr 198.19.0.0/16 ip saddr != 198.19.5.0/24 udp dport 9000-9010 return",
        "198.18.10.6 . tcp . 80 : drop",
        "tcp . 30003 : goto reject-chain",
        "ip saddr != 198.19.0.0/16 ip daddr . meta l4proto . th dport vmap @cluster-ips",
        "198.18.10.1 . tcp . 80 : jump mark-for-masquerade",
    ] {
        assert!(lb.contains(want), "missing `{want}` in:\n{lb}");
    }
    assert_eq!(json_listing(&a.0), json_listing(&b.0));

    // The same incremental transaction through both.
    let ops = changes(Shape::Rules);
    assert!(ops.len() > 10, "{ops:?}");
    bin.apply(&ops).await.unwrap();
    nl.apply(&ops).await.unwrap();
    let (la, lb) = (listing(&a.0), listing(&b.0));
    same(&la, &lb, "after the changes");
    for want in [
        "198.19.0.7:8080",
        "ip saddr { 198.18.8.6, 198.18.8.7 } tcp dport 8080 return",
        "ip saddr != { 198.19.5.0-198.19.6.255, 198.19.200.0/21 }",
        "ip daddr { 198.18.0.10, 198.18.0.11 } ip saddr vmap @policy-egress",
        "meta l4proto sctp dnat to 198.19.4.5:9",
    ] {
        assert!(lb.contains(want), "missing `{want}` in:\n{lb}");
    }
    assert_eq!(json_listing(&a.0), json_listing(&b.0));

    // A second full load over existing tables replaces them whole.
    let v2 = all(2, Shape::Rules);
    let refs: Vec<(Home, &PortRules)> = v2.iter().map(|(h, r)| (*h, r)).collect();
    bin.replace_all(&node, &refs).await.unwrap();
    nl.replace_all(&node, &refs).await.unwrap();
    same(&listing(&a.0), &listing(&b.0), "second full load");

    // The nft binary refuses the map shape rather than half-writing it.
    let maps = all(1, Shape::Maps);
    let refs: Vec<(Home, &PortRules)> = maps.iter().map(|(h, r)| (*h, r)).collect();
    assert!(bin.replace_all(&node, &refs).await.is_err());
    same(&listing(&a.0), &listing(&b.0), "after a refused load");
}

/// Runs `nft -f -` on `script`.
fn nft_script(script: &str) {
    use std::io::Write;
    let mut child = Command::new(nft::tool("nft"))
        .args(["-f", "-"])
        .stdin(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(script.as_bytes())
        .unwrap();
    let o = child.wait_with_output().unwrap();
    assert!(
        o.status.success(),
        "nft -f: {}",
        String::from_utf8_lossy(&o.stderr)
    );
}

#[tokio::test]
async fn endpoint_maps_are_the_objects_nft_makes_of_the_same_text() {
    if !nft_available() {
        eprintln!("skipping: nft is not usable here (needs root and nftables)");
        return;
    }
    let pid = std::process::id();
    // nft's text cannot name skiff's chains (`/` and `:`), so one map and
    // rule per protocol under plain names, written both ways.
    let a = format!("skiff-nlmap-bin-{pid}");
    let b = format!("skiff-nlmap-nl-{pid}");
    struct Plain(String);
    impl Drop for Plain {
        fn drop(&mut self) {
            let _ = Command::new(nft::tool("nft"))
                .args(["delete", "table", "ip", &self.0])
                .output();
        }
    }
    let (_a, _b) = (Plain(a.clone()), Plain(b.clone()));
    let cases = [
        (
            Protocol::Tcp,
            vec![ep("198.19.0.5", 8080), ep("198.19.0.6", 8081)],
        ),
        (
            Protocol::Udp,
            vec![
                ep("198.19.1.5", 53),
                ep("198.19.1.6", 53),
                ep("198.19.1.7", 53),
            ],
        ),
        (
            Protocol::Sctp,
            vec![ep("198.19.2.5", 9), ep("198.19.2.6", 9)],
        ),
    ];
    let mut script = format!("table ip {a} {{\n");
    for (p, eps) in &cases {
        let elems: Vec<String> = eps
            .iter()
            .enumerate()
            .map(|(i, e)| format!("{i} : {} . {}", e.ip, e.port))
            .collect();
        script += &format!(
            "map m{p} {{ typeof numgen random mod {k} : ip daddr . {p} dport; elements = {{ {} }} }}\n\
             chain c{p} {{ meta l4proto {p} dnat ip to numgen random mod {k} map @m{p}; }}\n",
            elems.join(", "),
            p = p.nft(),
            k = eps.len()
        );
    }
    script += "}\n";
    nft_script(&script);

    let mut batch = netlink::Batch::new();
    batch.add_table(&b);
    for (p, eps) in &cases {
        let (m, c) = (format!("m{}", p.nft()), format!("c{}", p.nft()));
        batch.add_dnat_map(&b, &m, *p, eps.len() as u32);
        batch.fill_dnat_map(&b, &m, eps);
        batch.add_chain(&b, &c, None);
        batch.add_rule(&b, &c, &rules::Rule::DnatViaMap(eps.len() as u32, *p, m));
    }
    let (bytes, what) = batch.finish();
    netlink::send(&bytes, &what).unwrap();
    let (la, lb) = (list_one(&a).replace(&a, "T"), list_one(&b).replace(&b, "T"));
    same(&la, &lb, "endpoint maps");
    for want in [
        "typeof numgen random mod 3 : ip daddr . udp dport",
        "elements = { 0 : 198.19.0.5 . 8080, 1 : 198.19.0.6 . 8081 }",
        "meta l4proto sctp dnat ip to numgen random mod 2 map @msctp",
    ] {
        assert!(lb.contains(want), "missing `{want}` in:\n{lb}");
    }
    let json = |t: &str| {
        let o = Command::new(nft::tool("nft"))
            .args(["-j", "list", "table", "ip", t])
            .output()
            .unwrap();
        let v: serde_json::Value =
            serde_json::from_str(&String::from_utf8_lossy(&o.stdout).replace(t, "T")).unwrap();
        v["nftables"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|o| o.get("map").is_some() || o.get("rule").is_some())
            .map(|o| {
                let mut o = o.clone();
                for k in ["map", "rule"] {
                    if let Some(x) = o.get_mut(k).and_then(|x| x.as_object_mut()) {
                        x.remove("handle");
                    }
                }
                o
            })
            .collect::<Vec<_>>()
    };
    assert_eq!(json(&a), json(&b));

    // Flushed and refilled in one batch.
    let mut batch = netlink::Batch::new();
    batch.flush_set(&b, "mtcp");
    batch.fill_dnat_map(
        &b,
        "mtcp",
        &[ep("198.19.0.7", 8080), ep("198.19.0.6", 8081)],
    );
    let (bytes, what) = batch.finish();
    netlink::send(&bytes, &what).unwrap();
    let lb = list_one(&b);
    assert!(
        lb.contains("elements = { 0 : 198.19.0.7 . 8080, 1 : 198.19.0.6 . 8081 }"),
        "{lb}"
    );
}

#[tokio::test]
async fn services_spread_through_endpoint_maps_changed_in_place() {
    if !nft_available() {
        eprintln!("skipping: nft is not usable here (needs root and nftables)");
        return;
    }
    let t = Table(format!("skiff-nlmaps-{}", std::process::id()));
    let nl = Nft::with_backend(&t.0, Backend::Netlink).with_cluster_cidr(CIDR);
    let v1 = all(1, Shape::Maps);
    let refs: Vec<(Home, &PortRules)> = v1.iter().map(|(h, r)| (*h, r)).collect();
    nl.replace_all(&[], &refs).await.unwrap();
    let l = listing(&t.0);
    for want in [
        "map dnat-svc-default/web/tcp/http/2 {",
        "typeof numgen random mod 2 : ip daddr . tcp dport",
        "elements = { 0 : 198.19.0.5 . 8080, 1 : 198.19.0.6 . 8080 }",
        "meta l4proto tcp dnat ip to numgen random mod 2 map @dnat-svc-default/web/tcp/http/2",
        // Affinity keeps its endpoint chains; single endpoints a plain DNAT.
        "update @aff-default/sticky/tcp/http/198.19.1.5:80 { ip saddr }",
        "meta l4proto udp dnat to 198.19.2.5:53",
    ] {
        assert!(l.contains(want), "missing `{want}` in:\n{l}");
    }
    assert!(!l.contains("numgen random mod 2 0 meta"), "{l}");

    // v2: web gets a third endpoint (a new map and rule, the old map
    // gone), everything else as in the binary's comparison above.
    nl.apply(&changes(Shape::Maps)).await.unwrap();
    let l = listing(&t.0);
    assert!(
        l.contains("elements = { 0 : 198.19.0.5 . 8080, 1 : 198.19.0.6 . 8080,")
            && l.contains("2 : 198.19.0.7 . 8080 }"),
        "{l}"
    );
    assert!(
        l.contains("dnat ip to numgen random mod 3 map @dnat-svc-default/web/tcp/http/3"),
        "{l}"
    );
    assert!(!l.contains("dnat-svc-default/web/tcp/http/2"), "{l}");

    // Same count, another endpoint: only the map's elements change.
    let web3 = |eps: &[Endpoint]| rules::port_rules(&plan("web", "198.18.10.1", eps), CIDR);
    let (old, new) = (
        web3(&[
            ep("198.19.0.5", 8080),
            ep("198.19.0.6", 8080),
            ep("198.19.0.7", 8080),
        ]),
        web3(&[
            ep("198.19.0.5", 8080),
            ep("198.19.0.8", 8080),
            ep("198.19.0.7", 8080),
        ]),
    );
    let ops: Vec<(Home, Op)> = rules::diff(&old, &new)
        .into_iter()
        .map(|o| (rules::shard_of("default", "web"), o))
        .collect();
    assert!(
        ops.iter()
            .all(|(_, o)| matches!(o, Op::FlushDnatMap(_) | Op::FillDnatMap(..))),
        "{ops:?}"
    );
    nl.apply(&ops).await.unwrap();
    let l = listing(&t.0);
    assert!(l.contains("1 : 198.19.0.8 . 8080"), "{l}");
    assert!(!l.contains("198.19.0.6 . 8080"), "{l}");

    // A second full load over it replaces everything.
    let v2 = all(2, Shape::Maps);
    let refs: Vec<(Home, &PortRules)> = v2.iter().map(|(h, r)| (*h, r)).collect();
    nl.replace_all(&[], &refs).await.unwrap();
    assert!(listing(&t.0).contains("2 : 198.19.0.7 . 8080 }"));
}

#[tokio::test]
async fn a_refused_netlink_batch_changes_nothing() {
    if !nft_available() {
        eprintln!("skipping: nft is not usable here (needs root and nftables)");
        return;
    }
    let t = Table(format!("skiff-nlfail-{}", std::process::id()));
    let nl = Nft::with_backend(&t.0, Backend::Netlink).with_cluster_cidr(CIDR);
    let v1 = all(1, Shape::Maps);
    let refs: Vec<(Home, &PortRules)> = v1.iter().map(|(h, r)| (*h, r)).collect();
    nl.replace_all(&[], &refs).await.unwrap();
    let before = listing(&t.0);
    // Valid changes followed by a rule in a chain that does not exist.
    let mut bad = changes(Shape::Maps);
    bad.push((
        rules::shard_of("default", "web"),
        Op::AddRule("no-such-chain".into(), rules::Rule::Drop),
    ));
    let err = nl.apply(&bad).await.unwrap_err().to_string();
    assert!(err.contains("no-such-chain"), "{err}");
    assert_eq!(listing(&t.0), before);
    // The same changes without it apply.
    nl.apply(&changes(Shape::Maps)).await.unwrap();
    assert!(listing(&t.0).contains("198.19.0.7 . 8080"));
}
