//! skiff on etcd: `skiff server --etcd-servers` against a real etcd (Debian's
//! etcd 3.4, started by the test on its own ports and data dir), driven by
//! the real kubectl; two servers on one etcd are one cluster.

use std::process::Command;
use std::time::{Duration, Instant};

use skiff_e2e::{skiff_binary, text, wait_until, Server};
use skiff_store::testsuite::EtcdServer;

/// The keys under `prefix` in etcd, as `etcdctl get --prefix --keys-only` shows them.
fn etcd_keys(etcd: &EtcdServer, prefix: &str) -> Vec<String> {
    let out = Command::new("etcdctl")
        .env("ETCDCTL_API", "3")
        .args([
            "--endpoints",
            &etcd.endpoint(),
            "get",
            "--prefix",
            "--keys-only",
            prefix,
        ])
        .output()
        .expect("run etcdctl (apt-get install etcd-client)");
    assert!(out.status.success(), "etcdctl: {}", text(&out.stderr));
    text(&out.stdout)
        .lines()
        .filter(|l| !l.is_empty())
        .map(str::to_string)
        .collect()
}

const NO_LOOPS: [&str; 2] = ["--disable-scheduler", "--disable-controllers"];

#[test]
fn two_servers_on_one_etcd_are_one_cluster() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let mut etcd = rt.block_on(EtcdServer::start());
    let url = etcd.endpoint();
    let flags = |extra: &[&'static str]| {
        let mut f = vec!["--etcd-servers", url.as_str()];
        f.extend_from_slice(extra);
        f
    };
    let a = Server::start_with(&flags(&NO_LOOPS));
    let b = Server::start_with_pki_of(&a, &flags(&NO_LOOPS));

    let ready = a.ok(&["get", "--raw", "/readyz?verbose"]);
    assert!(ready.contains("[+]etcd ok"), "{ready}");

    // Written through one, read through the other.
    a.ok(&["create", "configmap", "shared", "--from-literal=k=v1"]);
    assert_eq!(
        b.ok(&["get", "configmap", "shared", "-o", "jsonpath={.data.k}"]),
        "v1"
    );
    // Listed through the other right away (a consistent list from its cache).
    let names = b.ok(&["get", "configmaps", "-o", "name"]);
    assert!(names.contains("configmap/shared"), "{names}");
    // The object is where etcdctl users expect it.
    let keys = etcd_keys(&etcd, "/registry/configmaps/default/");
    assert!(
        keys.contains(&"/registry/configmaps/default/shared".to_string()),
        "{keys:?}"
    );

    // Watched through the other.
    let watch = b.kubectl_background(&[
        "get",
        "configmap",
        "shared",
        "-w",
        "-o",
        "jsonpath={.data.k}{\"\\n\"}",
    ]);
    watch.wait_for("the current value", |s| s.lines().any(|l| l == "v1"));
    a.ok(&[
        "patch",
        "configmap",
        "shared",
        "-p",
        r#"{"data":{"k":"v2"}}"#,
    ]);
    watch.wait_for("the update made through the other server", |s| {
        s.lines().any(|l| l == "v2")
    });

    // A stale update through the other server is a conflict.
    let stale = a.ok(&["get", "configmap", "shared", "-o", "json"]);
    a.ok(&[
        "patch",
        "configmap",
        "shared",
        "-p",
        r#"{"data":{"k":"v3"}}"#,
    ]);
    let out = b.kubectl_stdin(&["replace", "-f", "-"], &stale);
    assert!(!out.status.success(), "a stale replace succeeded");
    let err = text(&out.stderr);
    assert!(
        err.contains("Conflict") || err.contains("the object has been modified"),
        "{err}"
    );
    assert_eq!(
        b.ok(&["get", "configmap", "shared", "-o", "jsonpath={.data.k}"]),
        "v3"
    );

    // etcd down: requests fail fast with 503/504, /readyz says why.
    etcd.kill();
    let started = Instant::now();
    let out = a.kubectl(&["get", "configmap", "shared", "--request-timeout=30s"]);
    assert!(!out.status.success(), "a read succeeded without etcd");
    let err = text(&out.stderr);
    assert!(
        err.contains("ServiceUnavailable") || err.contains("Timeout") || err.contains("timed out"),
        "{err}"
    );
    let out = b.kubectl(&["create", "configmap", "during", "--request-timeout=30s"]);
    assert!(!out.status.success(), "a write succeeded without etcd");
    assert!(
        started.elapsed() < Duration::from_secs(20),
        "failing took {:?}",
        started.elapsed()
    );
    let out = a.kubectl(&["get", "--raw", "/readyz"]);
    assert!(!out.status.success());
    let err = text(&out.stderr);
    assert!(err.contains("etcd failed"), "{err}");

    // etcd back: both servers serve again, and the watch continues.
    rt.block_on(etcd.restart());
    wait_until("server a ready again", 30, || {
        a.kubectl(&["get", "--raw", "/readyz"])
            .status
            .success()
            .then_some(())
    });
    wait_until("a write through b", 30, || {
        b.kubectl(&[
            "patch",
            "configmap",
            "shared",
            "-p",
            r#"{"data":{"k":"v4"}}"#,
        ])
        .status
        .success()
        .then_some(())
    });
    watch.wait_for("the update after etcd came back", |s| {
        s.lines().any(|l| l == "v4")
    });
    assert_eq!(
        a.ok(&["get", "configmap", "shared", "-o", "jsonpath={.data.k}"]),
        "v4"
    );
    // Each value once, in order: no event lost or repeated by the outage.
    let seen: Vec<String> = watch.stdout().lines().map(str::to_string).collect();
    assert_eq!(seen, ["v1", "v2", "v3", "v4"], "{seen:?}");
}

/// `--etcd-prefix`: a server keeps its objects under that prefix, so two
/// clusters can share one etcd without seeing each other's objects.
#[test]
fn the_etcd_prefix_separates_clusters() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let etcd = rt.block_on(EtcdServer::start());
    let url = etcd.endpoint();
    let one = Server::start_with(&["--etcd-servers", &url, NO_LOOPS[0], NO_LOOPS[1]]);
    let two = Server::start_with(&[
        "--etcd-servers",
        &url,
        "--etcd-prefix",
        "/cluster-two",
        NO_LOOPS[0],
        NO_LOOPS[1],
    ]);
    one.ok(&["create", "configmap", "only-in-one"]);
    two.ok(&["create", "configmap", "only-in-two"]);
    assert!(two
        .fails(&["get", "configmap", "only-in-one"])
        .contains("NotFound"));
    assert!(one
        .fails(&["get", "configmap", "only-in-two"])
        .contains("NotFound"));
    // (kube-public holds each server's own cluster-info ConfigMap.)
    let keys = etcd_keys(&etcd, "/cluster-two/configmaps/default/");
    assert_eq!(keys, ["/cluster-two/configmaps/default/only-in-two"]);
}

/// A server given an etcd that does not answer refuses to start, saying so.
#[test]
fn an_unreachable_etcd_stops_the_server_with_a_clear_message() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let dir = tempfile::tempdir().unwrap();
    let started = Instant::now();
    let out = Command::new(skiff_e2e::skiff_binary())
        .args(["server", "--data-dir"])
        .arg(dir.path())
        .args(["--listen", "127.0.0.1:0", "--etcd-servers"])
        .arg(format!("http://127.0.0.1:{port}"))
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = text(&out.stderr);
    assert!(err.contains("connecting to etcd at"), "{err}");
    assert!(started.elapsed() < Duration::from_secs(20));
}

/// `--etcd-cafile`, `--etcd-certfile`, `--etcd-keyfile`: a server on an etcd
/// that serves TLS and requires client certificates.
#[test]
fn a_server_on_etcd_with_tls_client_certificates() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let etcd = rt.block_on(EtcdServer::start_tls());
    let url = etcd.endpoint();
    let (ca, cert, key) = (
        etcd.ca_file().display().to_string(),
        etcd.client_cert_file().display().to_string(),
        etcd.client_key_file().display().to_string(),
    );
    let s = Server::start_with(&[
        "--etcd-servers",
        &url,
        "--etcd-cafile",
        &ca,
        "--etcd-certfile",
        &cert,
        "--etcd-keyfile",
        &key,
        NO_LOOPS[0],
        NO_LOOPS[1],
    ]);
    s.ok(&["create", "configmap", "over-tls", "--from-literal=k=v"]);
    assert_eq!(
        s.ok(&["get", "configmap", "over-tls", "-o", "jsonpath={.data.k}"]),
        "v"
    );
    let ready = s.ok(&["get", "--raw", "/readyz?verbose"]);
    assert!(ready.contains("[+]etcd ok"), "{ready}");
}

/// Hollow nodes (`skiff agent --simulate`) registered through `s`, stopped
/// (by PID) when dropped.
struct Hollow(std::process::Child);

impl Drop for Hollow {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Two servers on one etcd, each running a scheduler and a controller
/// manager behind the Lease election: a Deployment created through one
/// rolls out on nodes that joined through the other, with exactly its
/// replicas (one controller manager acts, not two).
#[test]
fn two_servers_elect_one_scheduler_and_controller_manager() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let etcd = rt.block_on(EtcdServer::start());
    let url = etcd.endpoint();
    let a = Server::start_with(&["--etcd-servers", &url]);
    let b = Server::start_with_pki_of(&a, &["--etcd-servers", &url]);
    let nodes = Hollow(
        Command::new(skiff_binary())
            .args([
                "agent",
                "--simulate",
                "--nodes",
                "2",
                "--node-name",
                "hollow",
            ])
            .args(["--start-delay-ms", "100", "--kubeconfig"])
            .arg(&a.kubeconfig)
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("start hollow nodes"),
    );
    wait_until("hollow nodes Ready through the other server", 60, || {
        let out = b.ok(&["get", "nodes", "--no-headers"]);
        (out.matches(" Ready ").count() == 2).then_some(())
    });
    b.ok(&[
        "create",
        "deployment",
        "web",
        "--image=skiff.local/busybox:1",
        "--replicas=3",
    ]);
    a.ok(&["rollout", "status", "deployment/web", "--timeout=90s"]);
    let pods = a.ok(&["get", "pods", "-l", "app=web", "--no-headers"]);
    assert_eq!(pods.lines().count(), 3, "{pods}");
    let rs = b.ok(&["get", "replicasets", "-l", "app=web", "--no-headers"]);
    assert_eq!(rs.lines().count(), 1, "{rs}");
    for lease in ["kube-scheduler", "kube-controller-manager"] {
        let holder = a.ok(&[
            "get",
            "lease",
            lease,
            "-n",
            "kube-system",
            "-o",
            "jsonpath={.spec.holderIdentity}",
        ]);
        assert!(!holder.is_empty(), "{lease} has no holder");
    }
    drop(nodes);
}

/// `count` Services named `<prefix>-<i>` as one List for `kubectl create -f -`.
fn services_list(prefix: &str, count: usize) -> String {
    let items: Vec<serde_json::Value> = (0..count)
        .map(|i| {
            serde_json::json!({
                "apiVersion": "v1", "kind": "Service",
                "metadata": {"name": format!("{prefix}-{i}"), "namespace": "default"},
                "spec": {"ports": [{"port": 80}]},
            })
        })
        .collect();
    serde_json::json!({"apiVersion": "v1", "kind": "List", "items": items}).to_string()
}

/// Two servers on one etcd allocating ClusterIPs at the same time, from a
/// range small enough that independent choices would collide: every
/// Service gets an address of its own (the allocations are one bitmap in
/// etcd, written under optimistic concurrency).
#[test]
fn two_servers_allocating_at_once_never_hand_out_the_same_cluster_ip() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let etcd = rt.block_on(EtcdServer::start());
    let url = etcd.endpoint();
    // 32 addresses: the network address and .1 (the `kubernetes` Service)
    // are never picked, kube-dns holds .10, which leaves 29 for 26 Services.
    let flags = [
        "--etcd-servers",
        url.as_str(),
        "--service-cidr",
        "10.96.0.0/27",
        NO_LOOPS[0],
        NO_LOOPS[1],
    ];
    let a = Server::start_with(&flags);
    let b = Server::start_with_pki_of(&a, &flags);
    let (from_a, from_b) = (services_list("a", 13), services_list("b", 13));
    let (out_a, out_b) = std::thread::scope(|s| {
        let ta = s.spawn(|| a.kubectl_stdin(&["create", "-f", "-"], &from_a));
        let tb = s.spawn(|| b.kubectl_stdin(&["create", "-f", "-"], &from_b));
        (ta.join().unwrap(), tb.join().unwrap())
    });
    assert!(out_a.status.success(), "{}", text(&out_a.stderr));
    assert!(out_b.status.success(), "{}", text(&out_b.stderr));
    let listed = a.ok(&[
        "get",
        "services",
        "-A",
        "-o",
        r#"jsonpath={range .items[*]}{.metadata.name}={.spec.clusterIP}{"\n"}{end}"#,
    ]);
    let ips: Vec<&str> = listed
        .lines()
        .filter_map(|l| l.split_once('=').map(|(_, ip)| ip))
        .collect();
    // 26 created, plus `kubernetes` and `kube-dns`.
    assert_eq!(ips.len(), 28, "{listed}");
    let mut unique = ips.clone();
    unique.sort();
    unique.dedup();
    assert_eq!(
        unique.len(),
        ips.len(),
        "an address handed out twice:\n{listed}"
    );
    assert!(ips.iter().all(|ip| ip.starts_with("10.96.0.")), "{listed}");
    // The allocations are where kube-apiserver keeps them.
    let keys = etcd_keys(&etcd, "/registry/ranges/");
    assert!(
        keys.contains(&"/registry/ranges/serviceips".to_string()),
        "{keys:?}"
    );
}

/// Allocations survive a restart: an address and a NodePort a Service
/// holds cannot be taken by another Service after the server restarted, and
/// are free again once the Service is deleted.
#[test]
fn a_restart_keeps_cluster_ip_and_node_port_allocations() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let etcd = rt.block_on(EtcdServer::start());
    let url = etcd.endpoint();
    let mut s = Server::start_with(&["--etcd-servers", &url, NO_LOOPS[0], NO_LOOPS[1]]);
    let svc = |name: &str| {
        serde_json::json!({
            "apiVersion": "v1", "kind": "Service",
            "metadata": {"name": name, "namespace": "default"},
            "spec": {"type": "NodePort", "clusterIP": "10.43.0.50",
                     "ports": [{"port": 80, "nodePort": 30123}]},
        })
        .to_string()
    };
    s.ok_stdin(&["create", "-f", "-"], &svc("first"));
    s.restart();
    let out = s.kubectl_stdin(&["create", "-f", "-"], &svc("second"));
    assert!(
        !out.status.success(),
        "an allocated address was handed out again"
    );
    let err = text(&out.stderr);
    assert!(err.contains("provided IP is already allocated"), "{err}");
    // The port alone is taken too.
    let port_only = serde_json::json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": "third", "namespace": "default"},
        "spec": {"type": "NodePort", "ports": [{"port": 80, "nodePort": 30123}]},
    })
    .to_string();
    let err = text(&s.kubectl_stdin(&["create", "-f", "-"], &port_only).stderr);
    assert!(err.contains("provided port is already allocated"), "{err}");
    // Deleted: both are free again.
    s.ok(&["delete", "service", "first"]);
    s.ok_stdin(&["create", "-f", "-"], &svc("second"));
    assert_eq!(
        s.ok(&[
            "get",
            "service",
            "second",
            "-o",
            "jsonpath={.spec.clusterIP}"
        ]),
        "10.43.0.50"
    );
}

/// The ports in the `kubernetes` Service's Endpoints, as `s` serves them.
fn endpoint_ports(s: &Server) -> Vec<u16> {
    let out = s.ok(&[
        "get",
        "endpoints",
        "kubernetes",
        "-o",
        "jsonpath={.subsets[*].ports[*].port}",
    ]);
    let mut ports: Vec<u16> = out
        .split_whitespace()
        .filter_map(|p| p.parse().ok())
        .collect();
    ports.sort();
    ports
}

/// Every live server is an endpoint of the `kubernetes` Service (each
/// renews its own lease): one that stops cleanly leaves at once, one that
/// dies drops out when its lease lapses, and the slices say the same.
#[test]
fn the_kubernetes_endpoints_follow_the_live_servers() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let etcd = rt.block_on(EtcdServer::start());
    let url = etcd.endpoint();
    let a = Server::start_with(&["--etcd-servers", &url, NO_LOOPS[0], NO_LOOPS[1]]);
    let mut b = Server::start_with_pki_of(&a, &["--etcd-servers", &url, NO_LOOPS[0], NO_LOOPS[1]]);
    let mut c = Server::start_with_pki_of(&a, &["--etcd-servers", &url, NO_LOOPS[0], NO_LOOPS[1]]);
    let mut all = vec![a.port, b.port, c.port];
    all.sort();
    wait_until("all three servers in the endpoints", 30, || {
        (endpoint_ports(&a) == all).then_some(())
    });
    let leases = a.ok(&[
        "get",
        "leases",
        "-n",
        "kube-system",
        "-l",
        "skiff.io/apiserver-endpoint",
        "-o",
        "name",
    ]);
    assert_eq!(leases.lines().count(), 3, "{leases}");

    // A clean stop takes the server out at once.
    let started = Instant::now();
    b.terminate();
    let mut two = vec![a.port, c.port];
    two.sort();
    wait_until("the stopped server gone from the endpoints", 5, || {
        (endpoint_ports(&a) == two).then_some(())
    });
    assert!(started.elapsed() < Duration::from_secs(5));

    // A crash: the lease lapses (15 s) and a survivor's next round (10 s)
    // removes it.
    c.kill9();
    wait_until("the crashed server gone from the endpoints", 40, || {
        (endpoint_ports(&a) == vec![a.port]).then_some(())
    });
    let slices = a.ok(&[
        "get",
        "endpointslices",
        "-l",
        "kubernetes.io/service-name=kubernetes",
        "-o",
        "jsonpath={.items[*].ports[*].port}",
    ]);
    assert_eq!(slices.trim(), a.port.to_string(), "{slices}");
    let leases = a.ok(&[
        "get",
        "leases",
        "-n",
        "kube-system",
        "-l",
        "skiff.io/apiserver-endpoint",
        "-o",
        "name",
    ]);
    assert_eq!(leases.lines().count(), 1, "{leases}");
}
