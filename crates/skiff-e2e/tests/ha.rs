//! Several servers that are one cluster: `skiff server --etcd-servers …
//! --token SECRET` started on separate data dirs share the cluster's
//! credentials through etcd (the first stores them encrypted with the
//! token, the others load them), driven by the real kubectl against a
//! real etcd started by the test.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use skiff_e2e::{kubectl_binary, skiff_binary, text, Server};
use skiff_store::testsuite::EtcdServer;

const NO_LOOPS: [&str; 2] = ["--disable-scheduler", "--disable-controllers"];

/// The value of one etcd key, as `etcdctl get --print-value-only` prints it.
fn etcd_value(etcd: &EtcdServer, key: &str) -> String {
    let out = Command::new("etcdctl")
        .env("ETCDCTL_API", "3")
        .args([
            "--endpoints",
            &etcd.endpoint(),
            "get",
            "--print-value-only",
            key,
        ])
        .output()
        .expect("run etcdctl");
    assert!(out.status.success(), "etcdctl: {}", text(&out.stderr));
    text(&out.stdout)
}

/// Runs a `skiff server` that is expected to refuse to start; returns its
/// stderr and how long it took. The process is killed (by its PID) if it
/// is still running after 30 s, and the test fails.
fn refused(data_dir: &Path, args: &[&str]) -> (String, Duration) {
    let started = Instant::now();
    let mut child = Command::new(skiff_binary())
        .args(["server", "--data-dir"])
        .arg(data_dir)
        .args(["--listen", "127.0.0.1:0"])
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start skiff server");
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Some(status) = child.try_wait().expect("server status") {
            let mut err = String::new();
            std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut err).unwrap();
            assert!(!status.success(), "the server exited successfully: {err}");
            return (err, started.elapsed());
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("the server did not refuse to start within 30 s");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// kubectl against `port` with only a bearer token (no kubeconfig).
fn kubectl_with_token(dir: &Path, ca: &Path, port: u16, token: &str, args: &[&str]) -> String {
    let out = Command::new(kubectl_binary())
        .env("HOME", dir.join("home"))
        .env("KUBECONFIG", "/dev/null")
        .arg(format!("--server=https://127.0.0.1:{port}"))
        .arg(format!("--certificate-authority={}", ca.display()))
        .arg(format!("--token={token}"))
        .args(args)
        .output()
        .expect("run kubectl");
    assert!(
        out.status.success(),
        "kubectl {args:?} on port {port}: {}",
        text(&out.stderr)
    );
    text(&out.stdout)
}

fn file(s: &Server, rel: &str) -> Vec<u8> {
    std::fs::read(s.dir.path().join("data").join(rel)).unwrap_or_else(|e| panic!("{rel}: {e}"))
}

#[test]
fn servers_with_one_token_share_the_cluster_credentials() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let etcd = rt.block_on(EtcdServer::start());
    let url = etcd.endpoint();
    let flags = [
        "--etcd-servers",
        &url,
        "--token",
        "s3cret",
        NO_LOOPS[0],
        NO_LOOPS[1],
    ];
    let a = Server::start_with(&flags);
    let b = Server::start_with(&flags);
    assert!(
        a.log().contains("stored the cluster's credentials"),
        "{}",
        a.log()
    );
    assert!(
        b.log().contains("loaded the cluster's credentials"),
        "{}",
        b.log()
    );

    // In etcd, nothing of them is readable without the token.
    let stored = etcd_value(&etcd, "/skiff-bootstrap/registry");
    assert!(stored.contains("SkiffBootstrapData"), "{stored}");
    assert!(!stored.contains("BEGIN"), "{stored}");

    // One CA, one join token, one encryption key.
    for rel in ["pki/ca.crt", "token", "pki/encryption-config.yaml"] {
        assert_eq!(file(&a, rel), file(&b, rel), "{rel}");
    }
    // A's admin kubeconfig works against B.
    let b_url = format!("--server=https://127.0.0.1:{}", b.port);
    a.ok(&[&b_url, "create", "configmap", "via-b", "--from-literal=k=v"]);
    assert_eq!(
        a.ok(&["get", "configmap", "via-b", "-o", "jsonpath={.data.k}"]),
        "v"
    );

    // A ServiceAccount token issued by A authenticates at B.
    a.ok(&["create", "serviceaccount", "robot"]);
    let token = a.ok(&["create", "token", "robot"]);
    let ca = a.dir.path().join("data/pki/ca.crt");
    let who = kubectl_with_token(a.dir.path(), &ca, b.port, token.trim(), &["auth", "whoami"]);
    assert!(who.contains("system:serviceaccount:default:robot"), "{who}");

    // A Secret written through B (encrypted with the shared key) reads
    // back through A.
    b.ok(&[
        "create",
        "secret",
        "generic",
        "shared",
        "--from-literal=p=hush",
    ]);
    assert_eq!(
        a.ok(&["get", "secret", "shared", "-o", "jsonpath={.data.p}"]),
        "aHVzaA=="
    );
}

#[test]
fn a_wrong_token_another_clusters_etcd_or_other_flags_are_refused_and_change_nothing() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let etcd = rt.block_on(EtcdServer::start());
    let url = etcd.endpoint();
    let a = Server::start_with(&[
        "--etcd-servers",
        &url,
        "--token",
        "right",
        NO_LOOPS[0],
        NO_LOOPS[1],
    ]);
    let before = etcd_value(&etcd, "/skiff-bootstrap/registry");

    let dir = tempfile::tempdir().unwrap();
    let (err, took) = refused(dir.path(), &["--etcd-servers", &url, "--token", "wrong"]);
    assert!(
        err.contains("cannot be decrypted with this --token"),
        "{err}"
    );
    assert!(took < Duration::from_secs(20), "{took:?}");
    assert!(
        !dir.path().join("pki").exists(),
        "a refused server wrote its PKI"
    );
    assert!(!dir.path().join("token").exists());
    assert_eq!(etcd_value(&etcd, "/skiff-bootstrap/registry"), before);

    let (err, _) = refused(
        dir.path(),
        &[
            "--etcd-servers",
            &url,
            "--token",
            "right",
            "--service-cidr",
            "10.99.0.0/16",
        ],
    );
    assert!(
        err.contains("--service-cidr is 10.99.0.0/16 but the cluster's is 10.43.0.0/16"),
        "{err}"
    );
    assert!(!dir.path().join("pki").exists());

    // A data dir of another cluster (its own CA) is refused too.
    let other = Server::start_with(&NO_LOOPS);
    let (err, _) = refused(
        &other.dir.path().join("data"),
        &["--etcd-servers", &url, "--token", "right"],
    );
    assert!(err.contains("is not the cluster's CA"), "{err}");
    drop(other);

    // An etcd holding a cluster started without a token: a server with a
    // token and its own new CA refuses to take it over.
    let old = Server::start_with(&[
        "--etcd-servers",
        &url,
        "--etcd-prefix",
        "/old",
        NO_LOOPS[0],
        NO_LOOPS[1],
    ]);
    let fresh = tempfile::tempdir().unwrap();
    let (err, _) = refused(
        fresh.path(),
        &[
            "--etcd-servers",
            &url,
            "--etcd-prefix",
            "/old",
            "--token",
            "right",
        ],
    );
    assert!(err.contains("etcd already holds a cluster"), "{err}");
    assert!(!fresh.path().join("pki").exists());
    assert_eq!(etcd_value(&etcd, "/skiff-bootstrap/old"), "");
    // Its own server, given a token, adopts it: its credentials go to etcd.
    drop(old);

    // The first cluster is unharmed.
    a.ok(&["get", "--raw", "/readyz"]);
}

#[test]
fn two_first_servers_racing_agree_on_one_set() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let etcd = rt.block_on(EtcdServer::start());
    let url = etcd.endpoint();
    let start = || {
        let url = url.clone();
        std::thread::spawn(move || {
            Server::start_with(&[
                "--etcd-servers",
                &url,
                "--token",
                "race",
                NO_LOOPS[0],
                NO_LOOPS[1],
            ])
        })
    };
    let (a, b) = (start(), start());
    let (a, b) = (a.join().unwrap(), b.join().unwrap());
    assert_eq!(file(&a, "pki/ca.crt"), file(&b, "pki/ca.crt"));
    assert_eq!(file(&a, "pki/admin.crt"), file(&b, "pki/admin.crt"));
    let stored = [a.log(), b.log()]
        .iter()
        .filter(|l| l.contains("stored the cluster's credentials"))
        .count();
    assert_eq!(stored, 1, "a: {}\nb: {}", a.log(), b.log());
    let b_url = format!("--server=https://127.0.0.1:{}", b.port);
    a.ok(&[&b_url, "get", "--raw", "/readyz"]);
}

/// A process started by the test, killed by its PID when dropped.
struct Proc(std::process::Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn node_ready(s: &Server, node: &str) -> bool {
    let out = s.kubectl(&[
        "get",
        "node",
        node,
        "-o",
        "jsonpath={.status.conditions[?(@.type==\"Ready\")].status}",
    ]);
    out.status.success() && text(&out.stdout) == "True"
}

fn lease_renewed(s: &Server, node: &str) -> Option<String> {
    let out = s.kubectl(&[
        "get",
        "lease",
        node,
        "-n",
        "kube-node-lease",
        "-o",
        "jsonpath={.spec.renewTime}",
    ]);
    out.status
        .success()
        .then(|| text(&out.stdout))
        .filter(|t| !t.is_empty())
}

/// An agent given one server learns the others from the `kubernetes`
/// Endpoints; when the server it was given dies, its Node stays Ready and
/// its Lease keeps being renewed through another.
#[test]
fn an_agent_follows_the_servers_when_the_one_it_knew_dies() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let etcd = rt.block_on(EtcdServer::start());
    let url = etcd.endpoint();
    let flags = [
        "--etcd-servers",
        &url,
        "--token",
        "follow",
        "--node-monitor-grace-period",
        "15",
    ];
    let mut a = Server::start_with(&flags);
    let b = Server::start_with(&flags);
    let log = a.dir.path().join("agent.log");
    let _agent = Proc(
        Command::new(skiff_binary())
            .args([
                "agent",
                "--simulate",
                "--nodes",
                "1",
                "--node-name",
                "hollow",
            ])
            .arg("--kubeconfig")
            .arg(&a.kubeconfig)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .expect("start a hollow agent"),
    );
    let agent_log = || std::fs::read_to_string(&log).unwrap_or_default();
    skiff_e2e::wait_until("the hollow node Ready", 60, || {
        node_ready(&b, "hollow-0").then_some(())
    });
    // It learned both servers (their advertised addresses, same ports).
    skiff_e2e::wait_until("the agent to learn the other server", 30, || {
        agent_log()
            .lines()
            .any(|l| {
                l.contains("API servers:")
                    && l.contains(&format!(":{}", a.port))
                    && l.contains(&format!(":{}", b.port))
            })
            .then_some(())
    });

    a.kill9();
    let killed = Instant::now();
    let before = lease_renewed(&b, "hollow-0").expect("the node's Lease");
    // Renewed through B, twice.
    let mut seen = vec![before];
    skiff_e2e::wait_until("the Lease renewed through the other server", 40, || {
        if let Some(t) = lease_renewed(&b, "hollow-0") {
            if seen.last() != Some(&t) {
                seen.push(t);
            }
        }
        (seen.len() >= 3).then_some(())
    });
    // And Ready throughout, past the grace period the lifecycle
    // controller (now on B) allows a silent node.
    while killed.elapsed() < Duration::from_secs(25) {
        assert!(
            node_ready(&b, "hollow-0"),
            "the node is not Ready {:?} after its server died; agent log:\n{}",
            killed.elapsed(),
            agent_log()
        );
        std::thread::sleep(Duration::from_secs(1));
    }
}

fn free_port() -> String {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
        .to_string()
}

/// `skiff server --cluster-init` runs its own etcd member; two servers
/// join it with `--server URL --token` (each adding its member), and the
/// three are one cluster that survives kill -9 of one: writes and a new
/// Deployment's rollout continue through the others.
#[test]
fn three_servers_with_their_own_etcd_members_survive_losing_one() {
    let ports: Vec<String> = (0..6).map(|_| free_port()).collect();
    let grace = ["--node-monitor-grace-period", "15"];
    let mut a = Server::start_with(&[
        "--cluster-init",
        "--token",
        "ha3",
        "--etcd-client-port",
        &ports[0],
        "--etcd-peer-port",
        &ports[1],
        grace[0],
        grace[1],
    ]);
    let first = format!("https://127.0.0.1:{}", a.port);
    let join = |c: &str, p: &str, extra: &[&str]| {
        let mut flags = vec![
            "--server",
            &first,
            "--token",
            "ha3",
            "--etcd-client-port",
            c,
            "--etcd-peer-port",
            p,
            grace[0],
            grace[1],
        ];
        flags.extend_from_slice(extra);
        Server::start_with(&flags)
    };
    let b = join(&ports[2], &ports[3], &[]);
    let mut c = join(&ports[4], &ports[5], &["--remove-member-on-stop"]);
    assert!(b.log().contains("etcd member"), "{}", b.log());

    // Three members, with TLS from the cluster CA.
    let pki = b.dir.path().join("data/pki/etcd");
    let member_list = || {
        let out = Command::new("etcdctl")
            .env("ETCDCTL_API", "3")
            .arg(format!("--endpoints=https://127.0.0.1:{}", ports[2]))
            .arg(format!("--cacert={}", pki.join("ca.crt").display()))
            .arg(format!("--cert={}", pki.join("client.crt").display()))
            .arg(format!("--key={}", pki.join("client.key").display()))
            .args(["member", "list"])
            .output()
            .expect("run etcdctl");
        assert!(out.status.success(), "{}", text(&out.stderr));
        text(&out.stdout)
    };
    let list = member_list();
    assert_eq!(list.matches(", started, ").count(), 3, "{list}");
    // The CA is the cluster's: one CA across the three.
    assert_eq!(file(&a, "pki/ca.crt"), file(&c, "pki/ca.crt"));

    a.ok(&["create", "configmap", "before", "--from-literal=k=v"]);
    assert_eq!(
        c.ok(&["get", "configmap", "before", "-o", "jsonpath={.data.k}"]),
        "v"
    );

    let _nodes = Proc(
        Command::new(skiff_binary())
            .args(["agent", "--simulate", "--nodes", "2", "--node-name", "hha"])
            .arg("--kubeconfig")
            .arg(&b.kubeconfig)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start hollow nodes"),
    );
    skiff_e2e::wait_until("hollow nodes Ready", 60, || {
        (node_ready(&c, "hha-0") && node_ready(&c, "hha-1")).then_some(())
    });

    // kill -9 of the first server (its etcd member dies with it).
    a.kill9();
    skiff_e2e::wait_until("a write through the second server", 60, || {
        b.kubectl(&["create", "configmap", "after", "--request-timeout=10s"])
            .status
            .success()
            .then_some(())
    });
    assert!(c
        .ok(&["get", "configmap", "after", "-o", "name"])
        .contains("after"));
    assert!(b
        .ok(&["get", "configmap", "before", "-o", "name"])
        .contains("before"));
    c.ok(&[
        "create",
        "deployment",
        "after-loss",
        "--image=skiff.local/busybox:1",
        "--replicas=3",
    ]);
    b.ok(&[
        "rollout",
        "status",
        "deployment/after-loss",
        "--timeout=120s",
    ]);
    let pods = c.ok(&["get", "pods", "-l", "app=after-loss", "--no-headers"]);
    assert_eq!(pods.lines().count(), 3, "{pods}");

    // A server stopped with --remove-member-on-stop leaves etcd's members.
    let c_name = std::fs::read_to_string(c.dir.path().join("data/etcd-name")).unwrap();
    assert!(member_list().contains(&c_name), "{}", member_list());
    // (Two of the three members must be up to remove one: a comes back.)
    a.start_again();
    c.terminate();
    assert!(c.log().contains("removed etcd member"), "{}", c.log());
    let list = member_list();
    assert!(!list.contains(&c_name), "{list}");
    assert_eq!(list.lines().count(), 2, "{list}");
    assert!(!c.dir.path().join("data/etcd").exists());
}

/// A `skiff server` in a network-namespace host, killed by its PID when
/// dropped.
struct HostServer {
    proc: Proc,
    kubeconfig: std::path::PathBuf,
    log: std::path::PathBuf,
    home: std::path::PathBuf,
}

impl HostServer {
    fn start(h: &skiff_e2e::hosts::Hosts, i: usize, extra: &[&str]) -> HostServer {
        let dir = h.dir.path();
        let kubeconfig = dir.join(format!("admin-{i}.kubeconfig"));
        let log = dir.join(format!("server-{i}.log"));
        let file = std::fs::File::create(&log).unwrap();
        let child = h
            .in_host(i, skiff_binary(), &["server"])
            .arg("--data-dir")
            .arg(h.data(i))
            .arg("--listen")
            .arg(format!("{}:6443", h.hosts[i].ip))
            .arg("--write-kubeconfig")
            .arg(&kubeconfig)
            .args(extra)
            .stdin(Stdio::null())
            .stdout(file.try_clone().unwrap())
            .stderr(file)
            .spawn()
            .expect("start skiff server in a host");
        let s = HostServer {
            proc: Proc(child),
            kubeconfig,
            log,
            home: dir.join(format!("home-{i}")),
        };
        let deadline = Instant::now() + Duration::from_secs(90);
        loop {
            if s.kubeconfig.exists() && s.kubectl(&["get", "--raw", "/readyz"]).status.success() {
                return s;
            }
            assert!(
                Instant::now() < deadline,
                "server {i} not ready:\n{}",
                std::fs::read_to_string(&s.log).unwrap_or_default()
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    fn kubectl(&self, args: &[&str]) -> std::process::Output {
        Command::new(kubectl_binary())
            .env("KUBECONFIG", &self.kubeconfig)
            .env("HOME", &self.home)
            .args(args)
            .output()
            .expect("run kubectl")
    }

    fn ok(&self, args: &[&str]) -> String {
        let out = self.kubectl(args);
        assert!(
            out.status.success(),
            "kubectl {args:?}: {}\nserver log:\n{}",
            text(&out.stderr),
            std::fs::read_to_string(&self.log).unwrap_or_default()
        );
        text(&out.stdout)
    }
}

/// The HA control plane on three hosts (network namespaces): each server
/// runs its etcd member on the default ports of its own host; kill -9 of
/// the first host's server leaves writes and a Deployment's rollout
/// working through the others.
#[test]
fn three_servers_on_three_hosts_survive_losing_the_first() {
    let hosts = skiff_e2e::hosts::Hosts::start(skiff_e2e::hosts::Options {
        hosts: 3,
        network_only: true,
        ..Default::default()
    });
    let grace = ["--node-monitor-grace-period", "15"];
    let mut first = HostServer::start(
        &hosts,
        0,
        &["--cluster-init", "--token", "hosts3", grace[0], grace[1]],
    );
    let url = format!("https://{}:6443", hosts.hosts[0].ip);
    let join = [
        "--server",
        url.as_str(),
        "--token",
        "hosts3",
        grace[0],
        grace[1],
    ];
    let second = HostServer::start(&hosts, 1, &join);
    let third = HostServer::start(&hosts, 2, &join);
    first.ok(&["create", "configmap", "before"]);
    assert!(third
        .ok(&["get", "configmap", "before", "-o", "name"])
        .contains("before"));
    // The kubernetes Endpoints list the three hosts.
    skiff_e2e::wait_until("three API server endpoints", 30, || {
        let eps = second.ok(&[
            "get",
            "endpoints",
            "kubernetes",
            "-o",
            "jsonpath={.subsets[*].addresses[*].ip}",
        ]);
        (eps.split_whitespace().count() == 3).then_some(())
    });
    let _nodes = Proc(
        Command::new(skiff_binary())
            .args(["agent", "--simulate", "--nodes", "2", "--node-name", "hh"])
            .arg("--kubeconfig")
            .arg(&second.kubeconfig)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start hollow nodes"),
    );
    skiff_e2e::wait_until("hollow nodes Ready", 60, || {
        let out = third.ok(&["get", "nodes", "--no-headers"]);
        (out.matches(" Ready ").count() == 2).then_some(())
    });

    let _ = first.proc.0.kill();
    let _ = first.proc.0.wait();
    skiff_e2e::wait_until("a write through the second host", 60, || {
        second
            .kubectl(&["create", "configmap", "after", "--request-timeout=10s"])
            .status
            .success()
            .then_some(())
    });
    assert!(third
        .ok(&["get", "configmap", "after", "-o", "name"])
        .contains("after"));
    third.ok(&[
        "create",
        "deployment",
        "on-hosts",
        "--image=skiff.local/busybox:1",
        "--replicas=3",
    ]);
    second.ok(&["rollout", "status", "deployment/on-hosts", "--timeout=120s"]);
}
