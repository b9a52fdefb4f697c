//! Several "hosts" on one machine: each a network namespace with its own
//! address on a Linux bridge (veth pairs; hosts may sit on two subnets
//! that the machine routes between, so some peers are not on-link), one
//! `skiff server` in the first host and one `skiff agent` with its own
//! containerd in every host. The test reaches the server over the bridge
//! (the machine holds the subnets' gateway addresses).
//!
//! Dropping a [`Hosts`] stops exactly what it started: the agents and the
//! server by the PIDs it spawned, each agent's containers and containerd
//! with `skiff down --purge` run in that host, then the namespaces and the
//! bridge it created. Needs root, iproute2 and util-linux (nsenter).

use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use crate::{private_home, rand_u64, skiff_binary, text};

/// How to lay out the hosts.
#[derive(Debug, Clone)]
pub struct Options {
    pub hosts: usize,
    /// Indexes of the hosts put on the second subnet (reached through the
    /// machine's routing, so not on-link with the first subnet's hosts).
    pub second_subnet: Vec<usize>,
    /// `--flannel-backend` of every agent.
    pub backend: &'static str,
    /// Extra flags of every agent.
    pub agent_args: Vec<String>,
    /// Only the hosts and their network: no server, no agents (the test
    /// starts its own processes in them with [`Hosts::in_host`]).
    pub network_only: bool,
}

impl Default for Options {
    fn default() -> Options {
        Options {
            hosts: 3,
            second_subnet: vec![],
            backend: "auto",
            agent_args: vec![],
            network_only: false,
        }
    }
}

/// One host.
#[derive(Debug, Clone)]
pub struct Host {
    /// The node's name (also the agent's `--node-name`).
    pub name: String,
    /// Its network namespace (`/run/netns/NAME`).
    pub netns: String,
    pub ip: Ipv4Addr,
    /// Its data dir (`skiff down --data-dir` takes it; the agent's is
    /// `DATA/agent`).
    pub data: PathBuf,
}

/// A cluster of hosts.
pub struct Hosts {
    pub dir: tempfile::TempDir,
    pub hosts: Vec<Host>,
    pub kubeconfig: PathBuf,
    bridge: String,
    /// Root-side veth names, deleted with the bridge.
    veths: Vec<String>,
    server: Option<Child>,
    agents: Vec<Option<Child>>,
    options: Options,
}

fn ip(args: &[&str]) -> Result<(), String> {
    let out = Command::new("ip")
        .args(args)
        .output()
        .map_err(|e| format!("running ip (apt-get install iproute2): {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!("ip {}: {}", args.join(" "), text(&out.stderr)))
    }
}

/// Two /24s of 172.16.0.0/12 no route of this machine uses.
fn free_subnets() -> (u8, u8) {
    let routes = Command::new("ip")
        .args(["-4", "route", "show", "table", "all"])
        .output()
        .map(|o| text(&o.stdout))
        .unwrap_or_default();
    loop {
        let n = rand_u64();
        let (a, b) = (16 + (n % 16) as u8, (n >> 8) as u8);
        let c = if b == 255 { 0 } else { b + 1 };
        if !routes.contains(&format!("172.{a}.{b}.")) && !routes.contains(&format!("172.{a}.{c}."))
        {
            return (a, b);
        }
    }
}

impl Hosts {
    /// Creates the hosts, starts the server in the first and an agent in
    /// each, waits until every node is Ready, and imports the busybox test
    /// image ([`crate::BUSYBOX`]) on each.
    pub fn start(options: Options) -> Hosts {
        assert!(
            nix_is_root(),
            "the multi-host tests create network namespaces: run them as root"
        );
        let dir = tempfile::Builder::new()
            .prefix("skfh")
            .tempdir_in("/tmp")
            .expect("temp dir");
        let id = format!("{:04x}", rand_u64() & 0xffff);
        let (a, b) = free_subnets();
        let mut hosts = Hosts {
            kubeconfig: dir.path().join("admin.kubeconfig"),
            dir,
            hosts: vec![],
            bridge: format!("skfbr{id}"),
            veths: vec![],
            server: None,
            agents: vec![],
            options: options.clone(),
        };
        // From here on Drop cleans up whatever was made.
        let gw = |second: bool| -> Ipv4Addr {
            Ipv4Addr::new(172, a, if second { b.wrapping_add(1) } else { b }, 1)
        };
        ip(&["link", "add", &hosts.bridge, "type", "bridge"]).expect("bridge");
        ip(&[
            "addr",
            "add",
            &format!("{}/24", gw(false)),
            "dev",
            &hosts.bridge,
        ])
        .expect("address");
        ip(&[
            "addr",
            "add",
            &format!("{}/24", gw(true)),
            "dev",
            &hosts.bridge,
        ])
        .expect("address");
        ip(&["link", "set", &hosts.bridge, "up"]).expect("bridge up");
        for i in 0..options.hosts {
            let second = options.second_subnet.contains(&i);
            let g = gw(second);
            let host_ip = Ipv4Addr::new(172, a, g.octets()[2], 10 + i as u8);
            let netns = format!("skfh{id}-{i}");
            let veth = format!("skfv{id}-{i}");
            ip(&["netns", "add", &netns]).expect("netns");
            hosts.hosts.push(Host {
                name: format!("host-{i}"),
                netns: netns.clone(),
                ip: host_ip,
                data: hosts.dir.path().join(format!("host-{i}")),
            });
            ip(&[
                "link", "add", &veth, "type", "veth", "peer", "name", "eth0", "netns", &netns,
            ])
            .expect("veth");
            hosts.veths.push(veth.clone());
            ip(&["link", "set", &veth, "master", &hosts.bridge, "up"]).expect("veth up");
            let n = ["-n", netns.as_str()];
            let with = |rest: &[&str]| -> Vec<String> {
                n.iter().chain(rest).map(|s| s.to_string()).collect()
            };
            for args in [
                with(&["link", "set", "lo", "up"]),
                with(&["addr", "add", &format!("{host_ip}/24"), "dev", "eth0"]),
                with(&["link", "set", "eth0", "up"]),
                with(&["route", "add", "default", "via", &g.to_string()]),
            ] {
                let args: Vec<&str> = args.iter().map(String::as_str).collect();
                ip(&args).expect("host network");
            }
            // /proc/sys/net is the namespace's own (no procps needed).
            let out = hosts
                .in_host(i, "sh", &["-c", "echo 1 > /proc/sys/net/ipv4/ip_forward"])
                .output()
                .expect("nsenter (util-linux)");
            assert!(out.status.success(), "ip_forward: {}", text(&out.stderr));
        }
        if options.network_only {
            return hosts;
        }
        hosts.start_server();
        for i in 0..options.hosts {
            hosts.agents.push(None);
            hosts.start_agent(i);
        }
        for h in hosts.hosts.clone() {
            hosts.wait_ready(&h.name);
        }
        let archive = crate::busybox_archive();
        for h in hosts.hosts.clone() {
            let out = Command::new(skiff_binary())
                .args(["image", "import"])
                .arg(&archive)
                .arg("--data-dir")
                .arg(&h.data)
                .output()
                .expect("run skiff image import");
            assert!(
                out.status.success(),
                "importing busybox on {}: {}",
                h.name,
                text(&out.stderr)
            );
        }
        hosts
    }

    /// A command run inside host `i`'s network namespace.
    pub fn in_host(
        &self,
        i: usize,
        program: impl AsRef<std::ffi::OsStr>,
        args: &[&str],
    ) -> Command {
        let mut c = Command::new("nsenter");
        c.arg(format!("--net=/run/netns/{}", self.hosts[i].netns))
            .arg("--")
            .arg(program)
            .args(args);
        c
    }

    fn start_server(&mut self) {
        let h = &self.hosts[0];
        let log = std::fs::File::create(self.dir.path().join("server.log")).expect("server log");
        let child = self
            .in_host(0, skiff_binary(), &["server"])
            .arg("--data-dir")
            .arg(self.dir.path().join("server"))
            .arg("--listen")
            .arg(format!("{}:6443", h.ip))
            .arg("--write-kubeconfig")
            .arg(&self.kubeconfig)
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log"))
            .stderr(log)
            .spawn()
            .expect("start skiff server");
        self.server = Some(child);
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if let Some(Ok(Some(status))) = self.server.as_mut().map(Child::try_wait) {
                panic!("skiff server exited ({status}):\n{}", self.server_log());
            }
            if self.kubeconfig.exists()
                && self.kubectl(&["get", "--raw", "/readyz"]).status.success()
            {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "skiff server not ready after 60 s:\n{}",
                self.server_log()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Starts (again) the agent of host `i`.
    pub fn start_agent(&mut self, i: usize) {
        let h = self.hosts[i].clone();
        std::fs::create_dir_all(&h.data).expect("host dir");
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.agent_log_path(i))
            .expect("agent log");
        let mut c = self.in_host(i, skiff_binary(), &["agent"]);
        c.arg("--kubeconfig")
            .arg(&self.kubeconfig)
            .arg("--data-dir")
            .arg(h.data.join("agent"))
            .args([
                "--node-name",
                &h.name,
                "--flannel-backend",
                self.options.backend,
            ])
            .args(&self.options.agent_args)
            .args(
                if self
                    .options
                    .agent_args
                    .iter()
                    .any(|a| a == "--eviction-hard")
                {
                    &[][..]
                } else {
                    &crate::NO_DISK_EVICTION[..]
                },
            )
            .env(
                "SKIFF_LOG",
                "warn,skiff=info,skiff_agent=info,skiff_agent::proxy=debug",
            )
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log"))
            .stderr(log);
        self.agents[i] = Some(c.spawn().expect("start skiff agent"));
    }

    /// Kills the agent of host `i` (its containers keep running).
    pub fn kill_agent(&mut self, i: usize) {
        if let Some(mut c) = self.agents[i].take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    fn agent_log_path(&self, i: usize) -> PathBuf {
        self.dir.path().join(format!("agent-{i}.log"))
    }

    /// What the agent of host `i` logged.
    pub fn agent_log(&self, i: usize) -> String {
        std::fs::read_to_string(self.agent_log_path(i)).unwrap_or_default()
    }

    pub fn server_log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("server.log")).unwrap_or_default()
    }

    /// Every log, for a failing assertion's message.
    pub fn logs(&self) -> String {
        let mut s = format!("--- server\n{}", tail(&self.server_log()));
        for i in 0..self.hosts.len() {
            s.push_str(&format!("\n--- agent {i}\n{}", tail(&self.agent_log(i))));
        }
        s
    }

    fn wait_ready(&self, node: &str) {
        let deadline = Instant::now() + Duration::from_secs(90);
        loop {
            let out = self.kubectl(&[
                "get",
                "node",
                node,
                "-o",
                "jsonpath={.status.conditions[?(@.type==\"Ready\")].status} {.spec.podCIDR}",
            ]);
            let s = text(&out.stdout);
            if s.starts_with("True ") && s.len() > 5 {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "node {node} not Ready with a podCIDR after 90 s ({s}):\n{}",
                self.logs()
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// A kubectl command against the cluster (from the machine, over the
    /// bridge).
    pub fn kubectl_cmd(&self, args: &[&str]) -> Command {
        let mut c = Command::new(crate::kubectl_binary());
        private_home(&mut c, self.dir.path());
        c.env("KUBECONFIG", &self.kubeconfig)
            .env_remove("KUBECTL_EXTERNAL_DIFF")
            .args(args);
        c
    }

    pub fn kubectl(&self, args: &[&str]) -> Output {
        self.kubectl_cmd(args).output().expect("run kubectl")
    }

    /// Runs kubectl, asserts it succeeded, returns stdout.
    pub fn ok(&self, args: &[&str]) -> String {
        let out = self.kubectl(args);
        assert!(
            out.status.success(),
            "kubectl {args:?} failed:\nstdout: {}\nstderr: {}",
            text(&out.stdout),
            text(&out.stderr)
        );
        text(&out.stdout)
    }

    /// Runs kubectl with `stdin`, asserts it succeeded, returns stdout.
    pub fn ok_stdin(&self, args: &[&str], stdin: &str) -> String {
        let out = crate::output_with_stdin(self.kubectl_cmd(args), stdin);
        assert!(
            out.status.success(),
            "kubectl {args:?} failed:\nstdout: {}\nstderr: {}",
            text(&out.stdout),
            text(&out.stderr)
        );
        text(&out.stdout)
    }

    /// Waits until `count` pods matching `selector` are Ready; on a
    /// timeout, fails with the pods, their events and the logs.
    pub fn wait_pods_ready(&self, selector: &str, count: usize) {
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            let out = self.kubectl(&[
                "get",
                "pods",
                "-l",
                selector,
                "-o",
                "jsonpath={range .items[*]}{.status.conditions[?(@.type==\"Ready\")].status}{\"\\n\"}{end}",
            ]);
            let s = text(&out.stdout);
            if s.lines().filter(|l| *l == "True").count() == count {
                return;
            }
            if Instant::now() > deadline {
                let pods = text(&self.kubectl(&["get", "pods", "-A", "-o", "wide"]).stdout);
                let events = text(&self.kubectl(&["get", "events", "-A"]).stdout);
                panic!(
                    "{count} pods {selector} not Ready after 120 s:\n{pods}\n{events}\n{}",
                    self.logs()
                );
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// `kubectl exec POD -- sh -c SCRIPT`: (success, stdout + stderr).
    pub fn exec(&self, pod: &str, script: &str) -> (bool, String) {
        let out = self.kubectl(&["exec", pod, "--", "sh", "-c", script]);
        (
            out.status.success(),
            format!("{}{}", text(&out.stdout), text(&out.stderr)),
        )
    }

    /// The data dir of host `i`.
    pub fn data(&self, i: usize) -> &Path {
        &self.hosts[i].data
    }
}

fn tail(s: &str) -> String {
    let lines: Vec<&str> = s.lines().collect();
    lines[lines.len().saturating_sub(40)..].join("\n")
}

fn nix_is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("Uid:"))
                .and_then(|l| l.split_whitespace().nth(2).map(|u| u == "0"))
        })
        .unwrap_or(false)
}

impl Drop for Hosts {
    fn drop(&mut self) {
        // The processes this harness started, by their PIDs.
        for i in 0..self.agents.len() {
            self.kill_agent(i);
        }
        // What each agent left running on purpose (fail-static): its
        // containers and containerd, its routes and nftables tables.
        for i in 0..self.hosts.len() {
            let _ = self
                .in_host(i, skiff_binary(), &["down", "--purge", "--data-dir"])
                .arg(&self.hosts[i].data)
                .output();
        }
        if let Some(mut s) = self.server.take() {
            let _ = s.kill();
            let _ = s.wait();
        }
        // Deleting a namespace deletes its end of the veth, and so both.
        for h in &self.hosts {
            let _ = ip(&["netns", "del", &h.netns]);
        }
        for v in &self.veths {
            let _ = ip(&["link", "del", v]);
        }
        let _ = ip(&["link", "del", &self.bridge]);
        // A failing test's full logs outlive its temp dir when asked for.
        if std::thread::panicking() {
            if let Some(keep) = std::env::var_os("SKIFF_E2E_KEEP_LOGS") {
                let to = PathBuf::from(keep).join(&self.bridge);
                let _ = std::fs::create_dir_all(&to);
                for e in std::fs::read_dir(self.dir.path())
                    .into_iter()
                    .flatten()
                    .flatten()
                {
                    if e.path().extension().is_some_and(|x| x == "log") {
                        let _ = std::fs::copy(e.path(), to.join(e.file_name()));
                    }
                }
            }
        }
    }
}
