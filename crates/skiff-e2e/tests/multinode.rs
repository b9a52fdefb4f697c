//! Pods on several nodes: three "hosts" (network namespaces on a bridge),
//! one `skiff server` and one `skiff agent` with its own containerd in each
//! (see `skiff_e2e::hosts`), driven with the real kubectl. Pods on two
//! nodes reach each other by pod IP, a ClusterIP Service spreads requests
//! over backends on two nodes, a NodePort answers on every node's IP, a
//! frontend calls a backend by Service name across nodes; with the hosts on
//! two subnets the off-link peer is reached through VXLAN; a Node going
//! away takes its route with it and `skiff down` removes them all.

use std::collections::BTreeSet;
use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::time::Duration;

use skiff_e2e::hosts::{Hosts, Options};
use skiff_e2e::{text, wait_until, BUSYBOX};

/// A busybox httpd answering its pod's name, pinned to `node`.
fn backend(name: &str, node: &str, app: &str) -> String {
    format!(
        r#"apiVersion: v1
kind: Pod
metadata:
  name: {name}
  labels: {{app: {app}}}
spec:
  nodeName: {node}
  containers:
  - name: httpd
    image: {BUSYBOX}
    imagePullPolicy: IfNotPresent
    command: ["sh", "-c", "mkdir -p /www/cgi-bin; echo {name} > /www/index.html; echo '#!/bin/sh' > /www/cgi-bin/ip; echo 'echo Content-Type: text/plain; echo; echo $REMOTE_ADDR' >> /www/cgi-bin/ip; chmod +x /www/cgi-bin/ip; exec httpd -f -p 8080 -h /www"]
    ports: [{{name: http, containerPort: 8080}}]
    readinessProbe:
      tcpSocket: {{port: http}}
      periodSeconds: 1
---
"#
    )
}

fn client(name: &str, node: &str) -> String {
    format!(
        r#"apiVersion: v1
kind: Pod
metadata:
  name: {name}
  labels: {{app: client}}
spec:
  nodeName: {node}
  containers:
  - name: sh
    image: {BUSYBOX}
    imagePullPolicy: IfNotPresent
    command: ["sleep", "3600"]
    readinessProbe:
      exec: {{command: ["true"]}}
      periodSeconds: 1
---
"#
    )
}

fn pod_ip(h: &Hosts, pod: &str) -> String {
    h.ok(&["get", "pod", pod, "-o", "jsonpath={.status.podIP}"])
}

/// `wget` from a pod, retried for a while (routes appear within seconds of
/// a Node's podCIDR being known). busybox's static wget crashes with -T,
/// so `timeout` bounds it.
fn fetch(h: &Hosts, pod: &str, url: &str) -> String {
    wait_until(&format!("{pod} fetching {url}"), 60, || {
        let (ok, out) = h.exec(pod, &format!("timeout 5 wget -q -O- {url}"));
        ok.then(|| out.trim().to_string())
    })
}

/// An HTTP GET from the machine itself (outside every host).
fn http_get(ip: Ipv4Addr, port: u16) -> Option<String> {
    let addr = SocketAddr::from((ip, port));
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(3)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(3))).ok()?;
    s.write_all(b"GET / HTTP/1.0\r\nHost: test\r\n\r\n").ok()?;
    let mut buf = String::new();
    s.read_to_string(&mut buf).ok()?;
    let (_, body) = buf.split_once("\r\n\r\n")?;
    Some(body.trim().to_string())
}

/// `ip route` of a host, skiff's routes only.
fn skiff_routes(h: &Hosts, i: usize) -> String {
    let out = h
        .in_host(i, "ip", &["-4", "route", "show", "proto", "95"])
        .output()
        .expect("ip route");
    text(&out.stdout)
}

fn node_cidr(h: &Hosts, node: &str) -> String {
    h.ok(&["get", "node", node, "-o", "jsonpath={.spec.podCIDR}"])
}

#[test]
fn pods_on_different_nodes_reach_each_other_directly_through_services_and_by_name() {
    let h = Hosts::start(Options::default());
    let mut manifests = String::new();
    manifests.push_str(&backend("web-1", "host-1", "web"));
    manifests.push_str(&backend("web-2", "host-2", "web"));
    manifests.push_str(&client("frontend", "host-0"));
    manifests.push_str(
        r#"apiVersion: v1
kind: Service
metadata: {name: web}
spec:
  type: NodePort
  selector: {app: web}
  ports: [{name: http, port: 80, targetPort: http}]
"#,
    );
    h.ok_stdin(&["apply", "-f", "-"], &manifests);
    h.wait_pods_ready("app=web", 2);
    h.wait_pods_ready("app=client", 1);

    // All hosts share one subnet: auto is host-gw, a direct route per peer.
    let routes = skiff_routes(&h, 0);
    for peer in [1, 2] {
        let want = format!(
            "{} via {}",
            node_cidr(&h, &format!("host-{peer}")),
            h.hosts[peer].ip
        );
        assert!(
            routes.contains(&want),
            "host-0 has no route `{want}`:\n{routes}\n{}",
            h.logs()
        );
    }
    assert!(!routes.contains("skiff.vxlan"), "{routes}");

    // Pod to pod across nodes, by pod IP.
    for (pod, name) in [("web-1", "web-1"), ("web-2", "web-2")] {
        let ip = pod_ip(&h, pod);
        assert_eq!(fetch(&h, "frontend", &format!("http://{ip}:8080/")), name);
    }
    // The backend sees the frontend's pod IP, not a node's address: only
    // traffic leaving the cluster CIDR is masqueraded.
    let frontend_ip = pod_ip(&h, "frontend");
    let web1 = pod_ip(&h, "web-1");
    // (busybox httpd listens on v6 and reports `[::ffff:a.b.c.d]`.)
    let seen = fetch(&h, "frontend", &format!("http://{web1}:8080/cgi-bin/ip"));
    assert_eq!(
        seen.trim_start_matches("[::ffff:").trim_end_matches(']'),
        frontend_ip
    );

    // A ClusterIP spreads over backends on two nodes.
    let cluster_ip = h.ok(&["get", "svc", "web", "-o", "jsonpath={.spec.clusterIP}"]);
    let mut answers = BTreeSet::new();
    wait_until(
        "answers from both backends through the ClusterIP",
        60,
        || {
            let (ok, out) = h.exec(
                "frontend",
                &format!("timeout 5 wget -q -O- http://{cluster_ip}/"),
            );
            if ok {
                answers.insert(out.trim().to_string());
            }
            (answers.len() == 2).then_some(())
        },
    );
    assert_eq!(
        answers,
        BTreeSet::from(["web-1".to_string(), "web-2".to_string()])
    );

    // By Service name through the cluster DNS (the multi-tier case).
    let by_name = fetch(&h, "frontend", "http://web/");
    assert!(by_name == "web-1" || by_name == "web-2", "{by_name}");
    let fqdn = fetch(&h, "frontend", "http://web.default.svc.cluster.local/");
    assert!(fqdn == "web-1" || fqdn == "web-2", "{fqdn}");

    // A NodePort answers on every node's IP, also on host-0 which runs no
    // backend.
    let node_port: u16 = h
        .ok(&[
            "get",
            "svc",
            "web",
            "-o",
            "jsonpath={.spec.ports[0].nodePort}",
        ])
        .parse()
        .expect("a node port");
    for host in &h.hosts {
        let got = wait_until(&format!("NodePort on {}", host.name), 60, || {
            http_get(host.ip, node_port)
        });
        assert!(got == "web-1" || got == "web-2", "{}: {got}", host.name);
    }
}

#[test]
fn hosts_on_another_subnet_are_reached_through_vxlan_and_routes_follow_the_nodes() {
    let mut h = Hosts::start(Options {
        second_subnet: vec![2],
        ..Options::default()
    });
    let mut manifests = String::new();
    manifests.push_str(&backend("near", "host-1", "web"));
    manifests.push_str(&backend("far", "host-2", "web"));
    manifests.push_str(&client("client", "host-0"));
    manifests.push_str(
        r#"apiVersion: v1
kind: Service
metadata: {name: web}
spec:
  type: NodePort
  selector: {app: web}
  ports: [{name: http, port: 80, targetPort: http}]
"#,
    );
    h.ok_stdin(&["apply", "-f", "-"], &manifests);
    h.wait_pods_ready("app=web", 2);
    h.wait_pods_ready("app=client", 1);

    // host-1 shares host-0's subnet: a direct route; host-2 does not: a
    // route through the VXLAN device to its VTEP (the first address of its
    // podCIDR), whose MAC it published on its Node.
    let cidr1 = node_cidr(&h, "host-1");
    let cidr2 = node_cidr(&h, "host-2");
    let vtep2 = cidr2.split('/').next().unwrap().to_string();
    let routes = wait_until("host-0's routes to both peers", 60, || {
        let r = skiff_routes(&h, 0);
        (r.contains(&cidr1) && r.contains(&cidr2)).then_some(r)
    });
    assert!(
        routes.contains(&format!("{cidr1} via {}", h.hosts[1].ip)),
        "{routes}"
    );
    assert!(
        routes.contains(&format!("{cidr2} via {vtep2} dev skiff.vxlan")),
        "{routes}\n{}",
        h.logs()
    );
    let mac = h.ok(&[
        "get",
        "node",
        "host-2",
        "-o",
        "jsonpath={.metadata.annotations.skiff\\.io/vtep-mac}",
    ]);
    assert_eq!(mac.len(), 17, "host-2's VTEP MAC annotation: {mac:?}");
    let link = h
        .in_host(0, "ip", &["-d", "link", "show", "skiff.vxlan"])
        .output()
        .expect("ip link");
    let link = text(&link.stdout);
    assert!(
        link.contains("mtu 1450"),
        "VXLAN MTU is the link's minus 50: {link}"
    );
    let fdb = h
        .in_host(0, "bridge", &["fdb", "show", "dev", "skiff.vxlan"])
        .output()
        .map(|o| text(&o.stdout))
        .unwrap_or_default();
    assert!(
        fdb.contains(&format!("{mac} dst {}", h.hosts[2].ip)),
        "FDB of host-0: {fdb}"
    );

    for pod in ["near", "far"] {
        let ip = pod_ip(&h, pod);
        assert_eq!(fetch(&h, "client", &format!("http://{ip}:8080/")), pod);
    }

    // host-1 is renumbered (the new address becomes the default route's
    // source; the old one stays a while, as during a DHCP change, so open
    // connections survive): its agent notices, writes it to its Node, and
    // host-0 re-routes to the new address.
    let old = h.hosts[1].ip;
    let [a, b, c, _] = old.octets();
    let new = std::net::Ipv4Addr::new(a, b, c, 200);
    let gw = std::net::Ipv4Addr::new(a, b, c, 1);
    for args in [
        vec!["addr", "add", &format!("{new}/24"), "dev", "eth0"],
        vec![
            "route",
            "replace",
            "default",
            "via",
            &gw.to_string(),
            "src",
            &new.to_string(),
        ],
    ] {
        let out = h.in_host(1, "ip", &args).output().expect("ip");
        assert!(out.status.success(), "ip {args:?}: {}", text(&out.stderr));
    }
    wait_until("host-1's Node reporting its new address", 60, || {
        let ip = h.ok(&[
            "get",
            "node",
            "host-1",
            "-o",
            "jsonpath={.status.addresses[?(@.type==\"InternalIP\")].address}",
        ]);
        (ip == new.to_string()).then_some(())
    });
    wait_until("host-0 routing to host-1's new address", 60, || {
        skiff_routes(&h, 0)
            .contains(&format!("{cidr1} via {new}"))
            .then_some(())
    });
    let near = pod_ip(&h, "near");
    assert_eq!(fetch(&h, "client", &format!("http://{near}:8080/")), "near");
    // Its NodePorts answer on the new address too.
    let node_port: u16 = h
        .ok(&[
            "get",
            "svc",
            "web",
            "-o",
            "jsonpath={.spec.ports[0].nodePort}",
        ])
        .parse()
        .expect("a node port");
    let got = wait_until("the NodePort on host-1's new address", 60, || {
        http_get(new, node_port)
    });
    assert!(got == "near" || got == "far", "{got}");

    // A Node that goes away takes its route with it.
    h.ok(&["delete", "node", "host-1", "--wait=false"]);
    wait_until("host-0 dropping the route to host-1's pods", 60, || {
        (!skiff_routes(&h, 0).contains(&cidr1)).then_some(())
    });

    // `skiff down` removes the routes, the VXLAN device and the tables
    // (the agent is stopped first, or it would put them back).
    h.kill_agent(0);
    let out = h
        .in_host(0, skiff_e2e::skiff_binary(), &["down", "--data-dir"])
        .arg(h.data(0))
        .output()
        .expect("skiff down");
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(skiff_routes(&h, 0), "");
    let links = h.in_host(0, "ip", &["link"]).output().expect("ip link");
    assert!(!text(&links.stdout).contains("skiff.vxlan"));
    let tables = h
        .in_host(0, "nft", &["list", "tables"])
        .output()
        .expect("nft");
    assert!(
        !text(&tables.stdout).contains("skiff-net"),
        "{}",
        text(&tables.stdout)
    );
}

fn in_namespace(manifest: String, ns: &str) -> String {
    manifest.replacen("metadata:\n", &format!("metadata:\n  namespace: {ns}\n"), 1)
}

/// Whether `pod` (in `ns`) gets an answer from `url` within a few seconds.
fn reaches(h: &Hosts, ns: &str, pod: &str, url: &str) -> bool {
    h.kubectl(&[
        "exec",
        "-n",
        ns,
        pod,
        "--",
        "sh",
        "-c",
        &format!("timeout 4 wget -q -O- {url}"),
    ])
    .status
    .success()
}

/// Waits until `pod` reaching `url` is `want` (policies take effect within
/// a second or two of being applied); on a timeout, fails with every
/// host's policy rules and the agents' logs.
fn until_reaches(h: &Hosts, ns: &str, pod: &str, url: &str, want: bool) {
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while reaches(h, ns, pod, url) != want {
        if std::time::Instant::now() > deadline {
            let what = if want { "reach" } else { "be blocked from" };
            let mut rules = String::new();
            for i in 0..h.hosts.len() {
                let out = h
                    .in_host(i, "nft", &["list", "ruleset"])
                    .output()
                    .expect("nft");
                rules.push_str(&format!("--- host-{i}\n{}", text(&out.stdout)));
            }
            panic!(
                "{ns}/{pod} did not {what} {url} within 60 s\n{rules}\n{}",
                h.logs()
            );
        }
        std::thread::sleep(Duration::from_millis(300));
    }
}

fn resolves(h: &Hosts, ns: &str, pod: &str, name: &str) -> bool {
    h.kubectl(&[
        "exec",
        "-n",
        ns,
        pod,
        "--",
        "sh",
        "-c",
        &format!("timeout 4 nslookup {name}"),
    ])
    .status
    .success()
}

#[test]
fn network_policies_deny_and_allow_across_nodes_by_pod_namespace_and_port() {
    // Forced VXLAN between hosts on one subnet: policies, Services and DNS
    // work over the overlay too.
    let h = Hosts::start(Options {
        backend: "vxlan",
        ..Options::default()
    });
    h.ok(&["create", "namespace", "trusted"]);
    h.ok(&["label", "namespace", "trusted", "team=trusted"]);
    h.ok(&["create", "namespace", "other"]);
    let mut m = String::new();
    m.push_str(&backend("web-1", "host-1", "web"));
    m.push_str(&client("frontend", "host-0"));
    m.push_str(&in_namespace(client("tclient", "host-2"), "trusted"));
    m.push_str(&in_namespace(client("oclient", "host-2"), "other"));
    m.push_str(
        r#"apiVersion: v1
kind: Service
metadata: {name: web}
spec:
  selector: {app: web}
  ports: [{name: http, port: 80, targetPort: http}]
"#,
    );
    h.ok_stdin(&["apply", "-f", "-"], &m);
    h.wait_pods_ready("app=web", 1);
    h.wait_pods_ready("app=client", 1);
    for ns in ["trusted", "other"] {
        wait_until(&format!("the client in {ns} ready"), 120, || {
            let out = h.kubectl(&[
                "get",
                "pods",
                "-n",
                ns,
                "-o",
                "jsonpath={.items[0].status.conditions[?(@.type==\"Ready\")].status}",
            ]);
            (text(&out.stdout) == "True").then_some(())
        });
    }
    let routes = wait_until("host-0's routes through VXLAN", 60, || {
        let r = skiff_routes(&h, 0);
        (r.matches("dev skiff.vxlan").count() == 2).then_some(r)
    });
    assert!(!routes.contains("dev eth0"), "{routes}");
    let web = format!("http://{}:8080/", pod_ip(&h, "web-1"));
    let svc = "http://web.default.svc.cluster.local/";
    until_reaches(&h, "default", "frontend", &web, true);
    until_reaches(&h, "other", "oclient", svc, true);

    // Default deny: a policy selecting web with no ingress rule.
    h.ok_stdin(
        &["apply", "-f", "-"],
        r#"apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: deny-web}
spec:
  podSelector: {matchLabels: {app: web}}
  policyTypes: [Ingress]
"#,
    );
    until_reaches(&h, "default", "frontend", &web, false);
    // Through the Service too: the policy is checked after DNAT.
    assert!(!reaches(&h, "default", "frontend", svc));

    // An allow rule re-opens it for pods of the policy's namespace (on the
    // named port), not for look-alikes in other namespaces.
    h.ok_stdin(
        &["apply", "-f", "-"],
        r#"apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: allow-clients}
spec:
  podSelector: {matchLabels: {app: web}}
  ingress:
  - from: [{podSelector: {matchLabels: {app: client}}}]
    ports: [{port: http}]
"#,
    );
    until_reaches(&h, "default", "frontend", &web, true);
    until_reaches(&h, "default", "frontend", svc, true);
    assert!(!reaches(&h, "other", "oclient", svc));
    assert!(!reaches(&h, "trusted", "tclient", svc));

    // A namespaceSelector lets a whole namespace in.
    h.ok_stdin(
        &["apply", "-f", "-"],
        r#"apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: allow-trusted}
spec:
  podSelector: {matchLabels: {app: web}}
  ingress:
  - from: [{namespaceSelector: {matchLabels: {team: trusted}}}]
"#,
    );
    until_reaches(&h, "trusted", "tclient", svc, true);
    assert!(!reaches(&h, "other", "oclient", svc));

    // Egress deny in `other`: even DNS stops, until a rule allows it; then
    // names resolve but the web port stays closed.
    assert!(resolves(
        &h,
        "other",
        "oclient",
        "web.default.svc.cluster.local"
    ));
    h.ok_stdin(
        &["apply", "-n", "other", "-f", "-"],
        r#"apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: deny-egress}
spec:
  podSelector: {}
  policyTypes: [Egress]
"#,
    );
    wait_until("DNS blocked by the egress deny", 60, || {
        (!resolves(&h, "other", "oclient", "web.default.svc.cluster.local")).then_some(())
    });
    h.ok_stdin(
        &["apply", "-n", "other", "-f", "-"],
        r#"apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: allow-dns}
spec:
  podSelector: {}
  policyTypes: [Egress]
  egress:
  - to:
    - namespaceSelector: {matchLabels: {kubernetes.io/metadata.name: kube-system}}
      podSelector: {matchLabels: {k8s-app: kube-dns}}
    ports: [{port: 53, protocol: UDP}, {port: 53, protocol: TCP}]
"#,
    );
    wait_until("DNS allowed again by a rule", 60, || {
        resolves(&h, "other", "oclient", "web.default.svc.cluster.local").then_some(())
    });
    assert!(!reaches(&h, "other", "oclient", &web));

    // A policy the dataplane cannot express is reported on the object.
    h.ok_stdin(
        &["apply", "-f", "-"],
        r#"apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: v6-only}
spec:
  podSelector: {matchLabels: {app: web}}
  ingress:
  - from: [{ipBlock: {cidr: "fd00::/8"}}]
"#,
    );
    wait_until("an UnsupportedNetworkPolicy event", 60, || {
        let out = h.kubectl(&[
            "get",
            "events",
            "--field-selector",
            "reason=UnsupportedNetworkPolicy,involvedObject.name=v6-only",
            "-o",
            "jsonpath={.items[*].message}",
        ]);
        text(&out.stdout).contains("IPv6").then_some(())
    });
    // The rest of the policies still apply.
    assert!(reaches(&h, "default", "frontend", svc));
}

/// Benchmark, not a check (run with `--ignored --nocapture`): what the
/// cross-node path costs. A client pod on host-0 fetches a 64 MiB file and
/// pings servers on its own node (bridge), on host-1 (host-gw route) and on
/// host-2 (another subnet: VXLAN), and prints throughput and RTT.
#[test]
#[ignore]
fn bench_cross_node_path() {
    let h = Hosts::start(Options {
        second_subnet: vec![2],
        ..Options::default()
    });
    let server = |name: &str, node: &str| {
        format!(
            r#"apiVersion: v1
kind: Pod
metadata:
  name: {name}
  labels: {{app: bench}}
spec:
  nodeName: {node}
  containers:
  - name: httpd
    image: {BUSYBOX}
    imagePullPolicy: IfNotPresent
    command: ["sh", "-c", "mkdir -p /www; dd if=/dev/zero of=/www/big bs=1M count=64 2>/dev/null; exec httpd -f -p 8080 -h /www"]
    readinessProbe:
      tcpSocket: {{port: 8080}}
      periodSeconds: 1
---
"#
        )
    };
    let mut m = String::new();
    m.push_str(&server("same-node", "host-0"));
    m.push_str(&server("host-gw", "host-1"));
    m.push_str(&server("vxlan", "host-2"));
    m.push_str(&client("client", "host-0"));
    h.ok_stdin(&["apply", "-f", "-"], &m);
    h.wait_pods_ready("app=bench", 3);
    h.wait_pods_ready("app=client", 1);
    for target in ["same-node", "host-gw", "vxlan"] {
        let ip = pod_ip(&h, target);
        // Warm up (routes, ARP), then measure.
        fetch(
            &h,
            "client",
            &format!("http://{ip}:8080/big >/dev/null; echo ok"),
        );
        // (busybox `date` has no %N: /proc/uptime times it, in 10 ms.)
        let script = format!(
            "best=0; for i in 1 2 3; do s=$(cut -d' ' -f1 /proc/uptime | tr -d .); wget -q -O /dev/null http://{ip}:8080/big; \
             e=$(cut -d' ' -f1 /proc/uptime | tr -d .); t=$(( (e - s) * 10 )); if [ $best = 0 ] || [ $t -lt $best ]; then best=$t; fi; done; \
             echo $best; ping -q -c 20 -i 0.2 {ip} | tail -1"
        );
        let (ok, out) = h.exec("client", &script);
        assert!(ok, "{out}");
        let mut lines = out.lines();
        let ms: f64 = lines.next().unwrap_or("0").trim().parse().unwrap_or(0.0);
        let rtt = lines.next().unwrap_or("").trim().to_string();
        println!(
            "BENCH {target}: 64 MiB in {ms} ms ({:.0} MiB/s), ping {rtt}",
            64.0 * 1000.0 / ms.max(1.0)
        );
    }
}
