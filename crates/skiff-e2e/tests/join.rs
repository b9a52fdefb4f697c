//! A node joins with the join token: `skiff server` writes `DATA/token`,
//! `skiff agent --server URL --token TOKEN` (a separate process with its
//! own containerd) checks the server's CA against the token, gets its
//! client certificate through a CertificateSigningRequest (`kubectl get
//! csr` shows it, approved and issued), registers its Node and runs a pod;
//! with its own credentials it may change its Node but not another (403),
//! and read the Secret of its own pod but not one of a pod elsewhere (403).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use skiff_e2e::{busybox_archive, skiff_binary, text, wait_until, Server, BUSYBOX};

fn rand_u64() -> u64 {
    let mut b = [0u8; 8];
    if let Ok(mut f) = std::fs::File::open("/dev/urandom") {
        let _ = std::io::Read::read_exact(&mut f, &mut b);
    }
    u64::from_le_bytes(b)
}

/// The joined agent: stopped (by its PID) and its containerd and pods
/// removed (`skiff down --purge` on its own data dir) when dropped.
struct Agent {
    child: Child,
    dir: tempfile::TempDir,
}

impl Agent {
    fn data(&self) -> PathBuf {
        self.dir.path().join("agent")
    }
    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("agent.log")).unwrap_or_default()
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = Command::new(skiff_binary())
            .args(["down", "--purge", "--data-dir"])
            .arg(self.dir.path())
            .output();
    }
}

fn start_agent(server: &str, token: &str, node: &str, cidr: &str) -> Agent {
    let dir = tempfile::Builder::new()
        .prefix("skfj")
        .tempdir_in("/tmp")
        .expect("temp dir");
    let log = std::fs::File::create(dir.path().join("agent.log")).expect("agent log");
    let child = Command::new(skiff_binary())
        .args(["agent", "--server", server, "--token", token])
        .args(skiff_e2e::NO_DISK_EVICTION)
        .arg("--data-dir")
        .arg(dir.path().join("agent"))
        .args([
            "--node-name",
            node,
            "--agent-port",
            "0",
            "--cluster-cidr",
            cidr,
        ])
        .stdin(Stdio::null())
        .stdout(log.try_clone().expect("agent log"))
        .stderr(log)
        .spawn()
        .expect("start skiff agent");
    Agent { child, dir }
}

fn jsonpath(s: &Server, kind: &str, name: &str, path: &str) -> String {
    let out = s.kubectl(&["get", kind, name, "-o", &format!("jsonpath={path}")]);
    String::from_utf8_lossy(&out.stdout).to_string()
}

fn kubectl_as(s: &Server, kubeconfig: &Path, args: &[&str]) -> std::process::Output {
    s.kubectl_with(kubeconfig, args)
        .output()
        .expect("run kubectl")
}

#[test]
fn an_agent_joined_with_the_token_runs_pods_and_is_only_its_node() {
    let n = rand_u64();
    let cidr = format!("10.{}.0.0/16", 100 + n % 100);
    let svc = format!("10.{}.0.0/16", 200 + (n >> 8) % 50);
    let s = Server::start_with(&["--cluster-cidr", &cidr, "--service-cidr", &svc]);
    let token = std::fs::read_to_string(s.dir.path().join("data/token")).expect("DATA/token");
    let token = token.trim();
    assert!(token.starts_with("K10") && token.contains("::"), "{token}");

    // A token naming another CA is refused before anything is sent.
    let wrong = format!("K10{}{}", "0".repeat(64), &token[67..]);
    let server = format!("https://127.0.0.1:{}", s.port);
    let mut bad = start_agent(&server, &wrong, "impostor", &cidr);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    let status = loop {
        if let Ok(Some(st)) = bad.child.try_wait() {
            break st;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the agent with a wrong CA hash still runs: {}",
            bad.log()
        );
        std::thread::sleep(std::time::Duration::from_millis(200));
    };
    assert!(!status.success());
    let log = bad.log();
    drop(bad);
    assert!(log.contains("not the one the join token names"), "{log}");

    let agent = start_agent(&server, token, "joined", &cidr);
    let kubeconfig = agent.data().join("kubelet.kubeconfig");
    wait_until("the joined node is Ready", 120, || {
        let ready = jsonpath(
            &s,
            "node",
            "joined",
            "{.status.conditions[?(@.type==\"Ready\")].status}",
        );
        (ready == "True").then_some(())
    });
    let out = s.ok(&["get", "csr"]);
    assert!(out.contains("node-csr-"), "{out}");
    // kube-apiserver's columns.
    let header: Vec<&str> = out
        .lines()
        .next()
        .unwrap_or("")
        .split_whitespace()
        .collect();
    assert_eq!(
        header,
        [
            "NAME",
            "AGE",
            "SIGNERNAME",
            "REQUESTOR",
            "REQUESTEDDURATION",
            "CONDITION"
        ],
        "{out}"
    );
    assert!(
        out.lines().any(
            |l| l.contains("kubernetes.io/kube-apiserver-client-kubelet")
                && l.contains("system:bootstrap:")
                && l.contains("<none>")
                && l.trim_end().ends_with("Approved,Issued")
        ),
        "{out}"
    );
    let csr = s.ok(&[
        "get",
        "csr",
        "-o",
        "jsonpath={.items[0].spec.username} {.items[0].status.conditions[0].type}",
    ]);
    assert!(
        csr.starts_with("system:bootstrap:") && csr.ends_with("Approved"),
        "{csr}"
    );
    assert!(kubeconfig.exists(), "{}", agent.log());

    // Image for its pods.
    let out = Command::new(skiff_binary())
        .args(["image", "import"])
        .arg(busybox_archive())
        .arg("--data-dir")
        .arg(agent.dir.path())
        .output()
        .expect("import busybox");
    assert!(out.status.success(), "{}", text(&out.stderr));

    // Who the node is.
    let out = kubectl_as(
        &s,
        &kubeconfig,
        &[
            "auth",
            "whoami",
            "-o",
            "jsonpath={.status.userInfo.username}",
        ],
    );
    assert_eq!(
        text(&out.stdout),
        "system:node:joined",
        "{}",
        text(&out.stderr)
    );

    // Its own Node yes, another no.
    s.ok_stdin(
        &["apply", "-f", "-"],
        "apiVersion: v1\nkind: Node\nmetadata: {name: elsewhere}\n",
    );
    let out = kubectl_as(
        &s,
        &kubeconfig,
        &["label", "node", "joined", "example.com/joined=yes"],
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    let out = kubectl_as(
        &s,
        &kubeconfig,
        &["label", "node", "elsewhere", "example.com/x=y"],
    );
    assert!(!out.status.success());
    let err = text(&out.stderr);
    assert!(
        err.contains("Forbidden")
            && err.contains("node \"joined\" is not allowed to modify node \"elsewhere\""),
        "{err}"
    );

    // Secrets: its pod's, not another node's pod's.
    for name in ["mine", "theirs"] {
        s.ok(&[
            "create",
            "secret",
            "generic",
            name,
            &format!("--from-literal=k={name}"),
        ]);
    }
    let pod = |name: &str, node: &str, secret: &str| {
        format!(
            "apiVersion: v1\nkind: Pod\nmetadata: {{name: {name}}}\nspec:\n  nodeName: {node}\n  terminationGracePeriodSeconds: 1\n  containers:\n  - {{name: c, image: {BUSYBOX}, imagePullPolicy: IfNotPresent, command: [sleep, '3600'], volumeMounts: [{{name: s, mountPath: /s}}]}}\n  volumes:\n  - {{name: s, secret: {{secretName: {secret}}}}}\n"
        )
    };
    s.ok_stdin(&["apply", "-f", "-"], &pod("reader", "joined", "mine"));
    s.ok_stdin(&["apply", "-f", "-"], &pod("away", "elsewhere", "theirs"));
    wait_until("the joined node runs its pod", 120, || {
        (jsonpath(&s, "pod", "reader", "{.status.phase}") == "Running").then_some(())
    });
    assert_eq!(s.ok(&["exec", "reader", "--", "cat", "/s/k"]), "mine");
    let out = kubectl_as(&s, &kubeconfig, &["get", "secret", "mine", "-o", "name"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let out = kubectl_as(&s, &kubeconfig, &["get", "secret", "theirs"]);
    assert!(!out.status.success());
    let err = text(&out.stderr);
    assert!(
        err.contains("Forbidden")
            && err.contains("no relationship found between node 'joined' and this object"),
        "{err}"
    );
    // And it holds a token for its pod's ServiceAccount (the volume is there).
    let out = s.ok(&[
        "exec",
        "reader",
        "--",
        "ls",
        "/var/run/secrets/kubernetes.io/serviceaccount",
    ]);
    assert!(out.contains("token"), "{out}");
}

/// `skiff agent --simulate` (hollow nodes) with `args`, its log in its
/// own temp dir; stopped by its PID when dropped.
fn start_hollow(args: &[&str]) -> Agent {
    let dir = tempfile::Builder::new()
        .prefix("skfh")
        .tempdir_in("/tmp")
        .expect("temp dir");
    let log = std::fs::File::create(dir.path().join("agent.log")).expect("agent log");
    let child = Command::new(skiff_binary())
        .args(["agent", "--simulate"])
        .arg("--data-dir")
        .arg(dir.path().join("agent"))
        .args(args)
        .stdin(Stdio::null())
        .stdout(log.try_clone().expect("agent log"))
        .stderr(log)
        .spawn()
        .expect("start skiff agent --simulate");
    Agent { child, dir }
}

#[test]
fn hollow_nodes_joined_with_the_token_each_register_as_themselves() {
    let s = Server::start();
    let token = std::fs::read_to_string(s.dir.path().join("data/token")).expect("DATA/token");
    let server = format!("https://127.0.0.1:{}", s.port);
    let agent = start_hollow(&[
        "--nodes",
        "2",
        "--server",
        &server,
        "--token",
        token.trim(),
        "--node-name",
        "na",
    ]);
    for node in ["na-0", "na-1"] {
        wait_until(&format!("hollow node {node} Ready"), 120, || {
            let ready = jsonpath(
                &s,
                "node",
                node,
                "{.status.conditions[?(@.type==\"Ready\")].status}",
            );
            (ready == "True").then_some(())
        });
        // Each is its own node to the API server.
        let kubeconfig = agent
            .data()
            .join(format!("hollow/{node}/kubelet.kubeconfig"));
        let out = kubectl_as(
            &s,
            &kubeconfig,
            &[
                "auth",
                "whoami",
                "-o",
                "jsonpath={.status.userInfo.username}",
            ],
        );
        assert_eq!(
            text(&out.stdout),
            format!("system:node:{node}"),
            "{}{}",
            text(&out.stderr),
            agent.log()
        );
    }
    // Through a request of its own, approved and issued.
    let csrs = s.ok(&["get", "csr", "--no-headers"]);
    let issued = csrs
        .lines()
        .filter(|l| {
            l.starts_with("node-csr-")
                && l.contains("system:bootstrap:")
                && l.trim_end().ends_with("Approved,Issued")
        })
        .count();
    assert_eq!(issued, 2, "{csrs}");
    // No node of the agent's own name, and nothing refused on the way.
    assert!(!s.kubectl(&["get", "node", "na"]).status.success());
    let log = agent.log();
    assert!(
        !log.contains("refuses") && !log.contains("failed; retrying"),
        "{log}"
    );

    // Each runs its pods, writing their status as itself (NodeRestriction
    // lets a node write only its own pods').
    for node in ["na-0", "na-1"] {
        s.ok_stdin(
            &["apply", "-f", "-"],
            &format!(
                "apiVersion: v1\nkind: Pod\nmetadata: {{name: on-{node}}}\nspec:\n  nodeName: {node}\n  containers:\n  - {{name: c, image: {BUSYBOX}}}\n"
            ),
        );
    }
    for node in ["na-0", "na-1"] {
        wait_until(&format!("the pod on {node} Running"), 60, || {
            (jsonpath(&s, "pod", &format!("on-{node}"), "{.status.phase}") == "Running")
                .then_some(())
        });
    }
}

#[test]
fn a_hollow_agent_refused_registration_says_why_once_and_stops() {
    let s = Server::start();
    // A node's credentials: the Node authorizer lets them register only
    // the node `na`, never `na-0` or `na-1`.
    let out = Command::new(skiff_binary())
        .args([
            "kubeconfig",
            "--user",
            "system:node:na",
            "--group",
            "system:nodes",
        ])
        .arg("--data-dir")
        .arg(s.dir.path().join("data"))
        .args(["--server", &format!("https://127.0.0.1:{}", s.port)])
        .output()
        .expect("run skiff kubeconfig");
    assert!(out.status.success(), "{}", text(&out.stderr));
    let kubeconfig = s.dir.path().join("na.kubeconfig");
    std::fs::write(&kubeconfig, &out.stdout).expect("write the node's kubeconfig");
    let kc = kubeconfig.to_string_lossy().into_owned();
    let mut agent = start_hollow(&["--nodes", "2", "--kubeconfig", &kc, "--node-name", "na"]);
    let status = wait_until("the refused hollow agent to stop", 60, || {
        agent.child.try_wait().ok().flatten()
    });
    assert!(!status.success());
    let log = agent.log();
    let said = log
        .matches("refuses to let this agent register node \"na-0\"")
        .count();
    assert_eq!(said, 1, "{log}");
    assert!(
        log.contains("authenticated as system:node:na (groups system:nodes")
            && log.contains("may register only its own Node")
            && log.contains("--token"),
        "{log}"
    );
    assert!(!log.contains("failed; retrying"), "{log}");
    assert!(!s.kubectl(&["get", "node", "na-0"]).status.success());
}
