//! The end-to-end harness: starts `skiff server` on a free loopback port in
//! its own temp dir, runs the real kubectl (v1.33, fetched by
//! `scripts/tools.sh` into `.tools/bin`) against it, and stops exactly the
//! process it started when dropped.

use std::io::Write;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

/// The repository root.
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()
        .expect("repo root")
}

/// The `skiff` binary built by `cargo build -p skiff`.
pub fn skiff_binary() -> PathBuf {
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo_root().join("target"));
    let bin = target.join("debug/skiff");
    assert!(
        bin.exists(),
        "{} is missing: run `cargo build -p skiff` first (scripts/test.sh does)",
        bin.display()
    );
    bin
}

/// The kubectl the tests use: `$SKIFF_KUBECTL` or `.tools/bin/kubectl`.
pub fn kubectl_binary() -> PathBuf {
    let p = std::env::var_os("SKIFF_KUBECTL")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo_root().join(".tools/bin/kubectl"));
    assert!(
        p.exists(),
        "{} is missing: run scripts/tools.sh",
        p.display()
    );
    p
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .expect("bind")
        .local_addr()
        .expect("addr")
        .port()
}

/// The helm the tests use: `$SKIFF_HELM` or `.tools/bin/helm`.
pub fn helm_binary() -> PathBuf {
    let p = std::env::var_os("SKIFF_HELM")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo_root().join(".tools/bin/helm"));
    assert!(
        p.exists(),
        "{} is missing: run scripts/tools.sh",
        p.display()
    );
    p
}

/// A running `skiff server`.
pub struct Server {
    child: Child,
    pub dir: tempfile::TempDir,
    pub port: u16,
    pub kubeconfig: PathBuf,
}

impl Server {
    /// Starts a server with extra flags and waits until it is ready.
    pub fn start_with(extra: &[&str]) -> Server {
        let dir = tempfile::tempdir().expect("temp dir");
        let port = free_port();
        let kubeconfig = dir.path().join("admin.kubeconfig");
        let log = std::fs::File::create(dir.path().join("server.log")).expect("log file");
        let child = Command::new(skiff_binary())
            .arg("server")
            .arg("--data-dir")
            .arg(dir.path().join("data"))
            .arg("--listen")
            .arg(format!("127.0.0.1:{port}"))
            .arg("--write-kubeconfig")
            .arg(&kubeconfig)
            .args(extra)
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log"))
            .stderr(log)
            .spawn()
            .expect("start skiff server");
        let server = Server {
            child,
            dir,
            port,
            kubeconfig,
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if server.kubeconfig.exists() {
                let out = server.kubectl(&["get", "--raw", "/readyz"]);
                if out.status.success() {
                    break;
                }
            }
            assert!(
                Instant::now() < deadline,
                "skiff did not become ready:\n{}",
                server.log()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        server
    }

    pub fn start() -> Server {
        Server::start_with(&[])
    }

    /// Stops the server and starts it again on the same data dir and port.
    pub fn restart(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let log = std::fs::OpenOptions::new()
            .append(true)
            .open(self.dir.path().join("server.log"))
            .expect("log");
        self.child = Command::new(skiff_binary())
            .arg("server")
            .arg("--data-dir")
            .arg(self.dir.path().join("data"))
            .arg("--listen")
            .arg(format!("127.0.0.1:{}", self.port))
            .arg("--write-kubeconfig")
            .arg(&self.kubeconfig)
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log"))
            .stderr(log)
            .spawn()
            .expect("restart skiff server");
        let deadline = Instant::now() + Duration::from_secs(30);
        while !self.kubectl(&["get", "--raw", "/readyz"]).status.success() {
            assert!(
                Instant::now() < deadline,
                "skiff did not come back:\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// The server's log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("server.log")).unwrap_or_default()
    }

    /// A kubectl command bound to this server's admin kubeconfig.
    pub fn kubectl_cmd(&self, args: &[&str]) -> Command {
        let mut c = Command::new(kubectl_binary());
        c.env("KUBECONFIG", &self.kubeconfig)
            .env_remove("KUBECTL_EXTERNAL_DIFF")
            .args(args);
        c
    }

    /// Runs helm against this server (its caches and config in the temp dir).
    pub fn helm(&self, args: &[&str]) -> Output {
        let home = self.dir.path().join("helm");
        Command::new(helm_binary())
            .env("KUBECONFIG", &self.kubeconfig)
            .env("HELM_CACHE_HOME", home.join("cache"))
            .env("HELM_CONFIG_HOME", home.join("config"))
            .env("HELM_DATA_HOME", home.join("data"))
            .args(args)
            .output()
            .expect("run helm")
    }

    /// Runs kubectl and returns its output.
    pub fn kubectl(&self, args: &[&str]) -> Output {
        self.kubectl_cmd(args).output().expect("run kubectl")
    }

    /// Runs kubectl with `stdin` as its input.
    pub fn kubectl_stdin(&self, args: &[&str], stdin: &str) -> Output {
        let mut child = self
            .kubectl_cmd(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("kubectl");
        child
            .stdin
            .take()
            .expect("stdin")
            .write_all(stdin.as_bytes())
            .expect("write stdin");
        child.wait_with_output().expect("kubectl output")
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

    /// Like [`Server::ok`] with stdin.
    pub fn ok_stdin(&self, args: &[&str], stdin: &str) -> String {
        let out = self.kubectl_stdin(args, stdin);
        assert!(
            out.status.success(),
            "kubectl {args:?} failed:\nstdout: {}\nstderr: {}",
            text(&out.stdout),
            text(&out.stderr)
        );
        text(&out.stdout)
    }

    /// Runs kubectl, asserts it failed, returns stderr.
    pub fn fails(&self, args: &[&str]) -> String {
        let out = self.kubectl(args);
        assert!(
            !out.status.success(),
            "kubectl {args:?} unexpectedly succeeded: {}",
            text(&out.stdout)
        );
        text(&out.stderr)
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        // Stop exactly the process this harness started.
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Bytes as text.
pub fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}
