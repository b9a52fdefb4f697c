//! The end-to-end harness: starts `skiff server` on a free loopback port in
//! its own temp dir, runs the real kubectl (v1.33, fetched by
//! `scripts/tools.sh` into `.tools/bin`) against it, and stops exactly the
//! process it started when dropped.

pub mod hosts;

use std::io::Write;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// The repository root.
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()
        .expect("repo root")
}

/// The `skiff` binary under test: `$SKIFF_BIN` if set, otherwise the one in
/// this build's target directory, brought up to date once per test binary
/// with `cargo build -p skiff` (a no-op when nothing changed), so the tests
/// never run a stale server.
pub fn skiff_binary() -> PathBuf {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        if let Some(bin) = std::env::var_os("SKIFF_BIN") {
            let bin = PathBuf::from(bin);
            assert!(bin.exists(), "SKIFF_BIN={} does not exist", bin.display());
            return bin;
        }
        let profile_dir = cargo_build(&["-p", "skiff", "--bin", "skiff"]);
        let bin = profile_dir.join("skiff");
        assert!(
            bin.exists(),
            "{} is missing after cargo build",
            bin.display()
        );
        bin
    })
    .clone()
}

/// An example of this crate (`examples/NAME.rs`), built like
/// [`skiff_binary`] into this build's target directory.
pub fn example_binary(name: &str) -> PathBuf {
    let profile_dir = cargo_build(&["-p", "skiff-e2e", "--example", name]);
    let bin = profile_dir.join("examples").join(name);
    assert!(
        bin.exists(),
        "{} is missing after cargo build",
        bin.display()
    );
    bin
}

/// Runs `cargo build ARGS` for the target directory and profile of this
/// test executable and returns that profile's directory (TARGET/PROFILE).
fn cargo_build(args: &[&str]) -> PathBuf {
    // This test executable is TARGET/PROFILE/deps/NAME-HASH.
    let exe = std::env::current_exe().expect("test executable");
    let profile_dir = exe
        .parent()
        .and_then(Path::parent)
        .expect("test executable under TARGET/PROFILE/deps")
        .to_path_buf();
    let profile = profile_dir
        .file_name()
        .and_then(|n| n.to_str())
        .unwrap_or("debug")
        .to_string();
    let target_dir = profile_dir.parent().expect("target dir").to_path_buf();
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut build = Command::new(cargo);
    // `cargo test` gives this process the variables of the crate under
    // test (CARGO_MANIFEST_DIR, CARGO_PKG_*, …). Build scripts that watch
    // them (ring's does) would see a change and rebuild half the tree,
    // and the next plain `cargo build` would rebuild it back: the inner
    // build must see the same environment as a build from the shell.
    for (name, _) in std::env::vars_os() {
        let n = name.to_string_lossy();
        if n.starts_with("CARGO_PKG_")
            || n.starts_with("CARGO_BIN_EXE_")
            || n.starts_with("CARGO_CFG_")
            || matches!(
                n.as_ref(),
                "CARGO_MANIFEST_DIR"
                    | "CARGO_MANIFEST_PATH"
                    | "CARGO_MANIFEST_LINKS"
                    | "CARGO_CRATE_NAME"
                    | "CARGO_BIN_NAME"
                    | "CARGO_PRIMARY_PACKAGE"
                    | "CARGO_TARGET_TMPDIR"
                    | "CARGO_RUSTC_CURRENT_DIR"
                    | "OUT_DIR"
            )
        {
            build.env_remove(&name);
        }
    }
    build
        .current_dir(repo_root())
        .args(["build", "--quiet"])
        .args(args)
        .arg("--target-dir")
        .arg(&target_dir);
    match profile.as_str() {
        "debug" => {}
        "release" => {
            build.arg("--release");
        }
        other => {
            build.args(["--profile", other]);
        }
    }
    let out = build
        .stdin(Stdio::null())
        .output()
        .expect("run cargo build");
    assert!(
        out.status.success(),
        "cargo build {args:?} failed:\n{}",
        text(&out.stderr)
    );
    profile_dir
}

/// The python with the `kubernetes` client: `$SKIFF_PYTHON`, the virtualenv
/// `scripts/tools.sh` makes in `.tools/venv` when the system python lacks
/// the client, or `python3`.
pub fn python_binary() -> PathBuf {
    if let Some(p) = std::env::var_os("SKIFF_PYTHON") {
        return PathBuf::from(p);
    }
    let venv = repo_root().join(".tools/venv/bin/python3");
    if venv.exists() {
        return venv;
    }
    PathBuf::from("python3")
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

/// Eviction flags for real nodes in tests: kubelet's memory threshold
/// only, so a full disk of the test machine puts no node under pressure.
pub const NO_DISK_EVICTION: [&str; 2] = ["--eviction-hard", "memory.available<100Mi"];

/// A running `skiff server`.
pub struct Server {
    child: Child,
    pub dir: tempfile::TempDir,
    pub port: u16,
    pub kubeconfig: PathBuf,
    extra: Vec<String>,
    /// `server`, or `up` for a whole single-node cluster with real
    /// containers.
    mode: &'static str,
}

impl Server {
    /// Starts a server with extra flags and waits until it is ready.
    pub fn start_with(extra: &[&str]) -> Server {
        Server::launch("server", extra)
    }

    /// Runs `skiff up` (server, scheduler, controllers and an agent with its
    /// own containerd, all in the test's temp dir), waits for the node to be
    /// Ready and imports the busybox test image ([`BUSYBOX`]).
    pub fn up() -> Server {
        Server::up_with(&[])
    }

    /// [`Server::up`] with extra flags for `skiff up`.
    /// [`Server::up`] with extra flags.
    pub fn up_with(extra: &[&str]) -> Server {
        // A /16 of its own per cluster, so bridges of concurrent tests differ.
        let n = std::process::id() as u64 ^ Instant::now().elapsed().as_nanos() as u64 ^ rand_u64();
        let cidr = format!("10.{}.0.0/16", 100 + n % 100);
        let mut args = vec![
            "--agent-port",
            "0",
            "--node-name",
            "e2e-node",
            "--cluster-cidr",
            &cidr,
        ];
        // Only kubelet's memory threshold, unless the test sets its own:
        // the test machine's disk is shared and often fuller than
        // kubelet's nodefs/imagefs defaults allow (kind's kubelet config
        // turns those off for the same reason).
        if !extra.contains(&"--eviction-hard") {
            args.extend_from_slice(&NO_DISK_EVICTION);
        }
        args.extend_from_slice(extra);
        let s = Server::launch("up", &args);
        let archive = busybox_archive();
        let out = Command::new(skiff_binary())
            .args(["image", "import"])
            .arg(&archive)
            .arg("--data-dir")
            .arg(s.dir.path().join("data"))
            .output()
            .expect("run skiff image import");
        assert!(
            out.status.success(),
            "importing busybox: {}",
            text(&out.stderr)
        );
        s
    }

    /// Kills skiff with SIGKILL, as a crash would (containers stay).
    pub fn kill9(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Stops skiff cleanly with SIGTERM (as `systemctl stop` would) and
    /// waits for it to exit.
    pub fn terminate(&mut self) {
        let _ = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
        let deadline = Instant::now() + Duration::from_secs(30);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        self.kill9();
    }

    /// Starts skiff again after [`Server::kill9`].
    pub fn start_again(&mut self) {
        let expect = ups(self.dir.path()) + 1;
        self.child = spawn_server(
            self.mode,
            self.dir.path(),
            self.port,
            &self.kubeconfig,
            &self.extra,
        );
        if let Err(log) = wait_ready(
            self.mode,
            expect,
            &mut self.child,
            self.dir.path(),
            &self.kubeconfig,
        ) {
            panic!("skiff did not come back:\n{log}");
        }
    }

    /// Starts another server with the certificates of `other` (its CA,
    /// serving and admin certificates), so both are one cluster to clients:
    /// for several servers on one etcd.
    pub fn start_with_pki_of(other: &Server, extra: &[&str]) -> Server {
        let from = other.dir.path().join("data/pki");
        Server::launch_prepared("server", extra, |dir| {
            copy_tree(&from, &dir.join("data/pki"))
        })
    }

    fn launch(mode: &'static str, extra: &[&str]) -> Server {
        Server::launch_prepared(mode, extra, |_| {})
    }

    fn launch_prepared(mode: &'static str, extra: &[&str], prepare: impl FnOnce(&Path)) -> Server {
        let dir = tempfile::Builder::new()
            .prefix("skf")
            .tempdir_in("/tmp")
            .expect("temp dir");
        prepare(dir.path());
        let kubeconfig = dir.path().join("admin.kubeconfig");
        let extra: Vec<String> = extra.iter().map(|s| s.to_string()).collect();
        // A port found free can be taken by another process before the
        // server binds it; the server then exits at once and we try another.
        let mut attempt = 0;
        loop {
            attempt += 1;
            let port = free_port();
            let expect = ups(dir.path()) + 1;
            let mut child = spawn_server(mode, dir.path(), port, &kubeconfig, &extra);
            match wait_ready(mode, expect, &mut child, dir.path(), &kubeconfig) {
                Ok(()) => {
                    return Server {
                        child,
                        dir,
                        port,
                        kubeconfig,
                        extra,
                        mode,
                    }
                }
                Err(log) => {
                    let _ = child.kill();
                    let _ = child.wait();
                    if attempt < 3 && log.contains("in use") {
                        continue;
                    }
                    panic!("skiff server did not become ready:\n{log}");
                }
            }
        }
    }

    pub fn start() -> Server {
        Server::start_with(&[])
    }

    /// Stops the server and starts it again on the same data dir, port and flags.
    pub fn restart(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let expect = ups(self.dir.path()) + 1;
        self.child = spawn_server(
            self.mode,
            self.dir.path(),
            self.port,
            &self.kubeconfig,
            &self.extra,
        );
        if let Err(log) = wait_ready(
            self.mode,
            expect,
            &mut self.child,
            self.dir.path(),
            &self.kubeconfig,
        ) {
            panic!("skiff server did not come back:\n{log}");
        }
    }

    /// The server's log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("server.log")).unwrap_or_default()
    }

    /// A kubectl command bound to this server's admin kubeconfig.
    pub fn kubectl_cmd(&self, args: &[&str]) -> Command {
        self.kubectl_with(&self.kubeconfig, args)
    }

    /// A kubectl command bound to another kubeconfig, with this server's
    /// private home and caches.
    pub fn kubectl_with(&self, kubeconfig: &Path, args: &[&str]) -> Command {
        let mut c = Command::new(kubectl_binary());
        private_home(&mut c, self.dir.path());
        c.env("KUBECONFIG", kubeconfig)
            .env_remove("KUBECTL_EXTERNAL_DIFF")
            .args(args);
        c
    }

    /// Runs helm against this server (its caches and config in the temp dir).
    pub fn helm(&self, args: &[&str]) -> Output {
        let home = self.dir.path().join("helm");
        let mut c = Command::new(helm_binary());
        private_home(&mut c, self.dir.path());
        c.env("KUBECONFIG", &self.kubeconfig)
            .env("HELM_CACHE_HOME", home.join("cache"))
            .env("HELM_CONFIG_HOME", home.join("config"))
            .env("HELM_DATA_HOME", home.join("data"))
            .args(args)
            .output()
            .expect("run helm")
    }

    /// Starts kubectl in the background (e.g. `get -w`, `wait`), its stdout
    /// and stderr going to files; it is killed when the handle is dropped.
    pub fn kubectl_background(&self, args: &[&str]) -> Background {
        static N: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let out = self.dir.path().join(format!("bg-{n}.out"));
        let err = self.dir.path().join(format!("bg-{n}.err"));
        let child = self
            .kubectl_cmd(args)
            .stdin(Stdio::null())
            .stdout(std::fs::File::create(&out).expect("stdout file"))
            .stderr(std::fs::File::create(&err).expect("stderr file"))
            .spawn()
            .expect("start kubectl");
        Background { child, out, err }
    }

    /// Runs kubectl and returns its output.
    pub fn kubectl(&self, args: &[&str]) -> Output {
        self.kubectl_cmd(args).output().expect("run kubectl")
    }

    /// Runs kubectl with `stdin` as its input.
    pub fn kubectl_stdin(&self, args: &[&str], stdin: &str) -> Output {
        output_with_stdin(self.kubectl_cmd(args), stdin)
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

    /// Waits (up to 60 s) for the scheduler to refuse pod `name` in the
    /// default namespace, and returns its PodScheduled condition's message.
    pub fn wait_unschedulable(&self, name: &str) -> String {
        wait_until(&format!("pod {name} refused by the scheduler"), 60, || {
            let out = self.kubectl(&[
                "get",
                "pod",
                name,
                "-o",
                "jsonpath={.status.conditions[?(@.type==\"PodScheduled\")].message}",
            ]);
            let m = text(&out.stdout);
            (!m.is_empty()).then_some(m)
        })
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

/// Gives a client its own HOME and discovery cache under `dir`: kubectl and
/// helm cache discovery per host:port in ~/.kube/cache, and a port reused by
/// a later test's server would otherwise be answered from an earlier one's.
pub(crate) fn private_home<'a>(c: &'a mut Command, dir: &Path) -> &'a mut Command {
    c.env("HOME", dir.join("home"))
        .env("KUBECACHEDIR", dir.join("home/.kube/cache"))
}

/// Starts `skiff server` on `port` with its data in `dir/data`, its log in
/// `dir/server.log` (appended to, so a restart keeps the earlier log).
fn spawn_server(mode: &str, dir: &Path, port: u16, kubeconfig: &Path, extra: &[String]) -> Child {
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(dir.join("server.log"))
        .expect("server log file");
    Command::new(skiff_binary())
        .arg(mode)
        .arg("--data-dir")
        .arg(dir.join("data"))
        .arg("--listen")
        .arg(format!("127.0.0.1:{port}"))
        .arg("--write-kubeconfig")
        .arg(kubeconfig)
        .args(extra)
        .stdin(Stdio::null())
        .stdout(log.try_clone().expect("server log file"))
        .stderr(log)
        .spawn()
        .expect("start skiff server")
}

/// Waits until `kubectl get --raw /readyz` succeeds; when the process exits
/// first, or 30 s pass, returns what went wrong with the server's log.
fn wait_ready(
    mode: &str,
    expect: usize,
    child: &mut Child,
    dir: &Path,
    kubeconfig: &Path,
) -> Result<(), String> {
    let log = || std::fs::read_to_string(dir.join("server.log")).unwrap_or_default();
    let deadline = Instant::now() + Duration::from_secs(if mode == "up" { 60 } else { 30 });
    loop {
        if let Ok(Some(status)) = child.try_wait() {
            return Err(format!("skiff exited ({status}); its log:\n{}", log()));
        }
        if mode == "up" {
            // `skiff up` says so once the node is Ready.
            if log().matches("skiff is up").count() >= expect {
                return Ok(());
            }
        } else if kubeconfig.exists()
            && private_home(&mut Command::new(kubectl_binary()), dir)
                .env("KUBECONFIG", kubeconfig)
                .args(["get", "--raw", "/readyz"])
                .output()
                .expect("run kubectl")
                .status
                .success()
        {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(format!("not ready after 30 s; its log:\n{}", log()));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        // Stop exactly the process this harness started.
        let _ = self.child.kill();
        let _ = self.child.wait();
        if self.mode == "up" {
            // And what it left running on purpose (fail-static): the pods'
            // containers and the containerd of this test's data dir.
            let _ = Command::new(skiff_binary())
                .args(["down", "--purge", "--data-dir"])
                .arg(self.dir.path().join("data"))
                .output();
        }
    }
}

/// How many times `skiff up` has said it is up in this dir's log.
fn ups(dir: &Path) -> usize {
    std::fs::read_to_string(dir.join("server.log"))
        .unwrap_or_default()
        .matches("skiff is up")
        .count()
}

/// The busybox test image the e2e tests run.
pub const BUSYBOX: &str = "skiff.local/busybox:1";

pub(crate) fn rand_u64() -> u64 {
    let mut b = [0u8; 8];
    if let Ok(mut f) = std::fs::File::open("/dev/urandom") {
        let _ = std::io::Read::read_exact(&mut f, &mut b);
    }
    u64::from_le_bytes(b)
}

/// Runs `cmd` with `stdin` as its input and collects its output.
pub(crate) fn output_with_stdin(mut cmd: Command, stdin: &str) -> Output {
    let mut child = cmd
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(stdin.as_bytes())
        .expect("write stdin");
    child.wait_with_output().expect("output")
}

/// The busybox image archive, built from Debian's busybox-static into
/// this build's target directory (TARGET/PROFILE/e2e-busybox.tar) and
/// shared by every test process; built again when the `skiff` binary that
/// builds it is newer. Written under a temporary name and renamed, so
/// processes building it at once never read half an archive.
pub fn busybox_archive() -> PathBuf {
    static PATH: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    PATH.get_or_init(|| {
        let bin = skiff_binary();
        let exe = std::env::current_exe().expect("test executable");
        let dir = exe
            .parent()
            .and_then(Path::parent)
            .map(Path::to_path_buf)
            .unwrap_or_else(std::env::temp_dir);
        let path = dir.join("e2e-busybox.tar");
        let modified = |p: &Path| std::fs::metadata(p).and_then(|m| m.modified()).ok();
        if matches!((modified(&path), modified(&bin)), (Some(a), Some(b)) if a >= b) {
            return path;
        }
        let partial = dir.join(format!("e2e-busybox.tar.{}", std::process::id()));
        let out = Command::new(&bin)
            .args(["image", "build-busybox", "--output"])
            .arg(&partial)
            .output()
            .expect("run skiff image build-busybox");
        assert!(
            out.status.success(),
            "building the busybox image (apt-get install busybox-static): {}",
            text(&out.stderr)
        );
        std::fs::rename(&partial, &path).expect("move the busybox archive into place");
        path
    })
    .clone()
}

/// A kubectl running in the background.
pub struct Background {
    child: Child,
    out: PathBuf,
    err: PathBuf,
}

impl Background {
    /// What it printed on stdout so far.
    pub fn stdout(&self) -> String {
        std::fs::read_to_string(&self.out).unwrap_or_default()
    }

    /// What it printed on stderr so far.
    pub fn stderr(&self) -> String {
        std::fs::read_to_string(&self.err).unwrap_or_default()
    }

    /// Waits up to 30 s until its stdout satisfies `what`; panics with what
    /// it printed otherwise.
    pub fn wait_for(&self, description: &str, what: impl Fn(&str) -> bool) -> String {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let out = self.stdout();
            if what(&out) {
                return out;
            }
            assert!(
                Instant::now() < deadline,
                "kubectl never printed {description}:\nstdout: {out}\nstderr: {}",
                self.stderr()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Waits up to 30 s for it to exit; returns (exit code, stdout, stderr).
    pub fn finish(mut self) -> (Option<i32>, String, String) {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(status) = self.child.try_wait().expect("kubectl status") {
                return (status.code(), self.stdout(), self.stderr());
            }
            assert!(
                Instant::now() < deadline,
                "kubectl did not exit:\nstdout: {}\nstderr: {}",
                self.stdout(),
                self.stderr()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Background {
    fn drop(&mut self) {
        // Stop exactly the kubectl this handle started.
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Bytes as text.
/// Polls `f` every 200 ms until it gives a value, failing the test with
/// `what` after `secs` seconds.
pub fn wait_until<T>(what: &str, secs: u64, mut f: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + Duration::from_secs(secs);
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(200));
    }
}

pub fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// Copies a directory and everything below it (the PKI holds the
/// service-account keys in a subdirectory).
fn copy_tree(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).expect("create a directory");
    for entry in std::fs::read_dir(from).expect("read a directory") {
        let entry = entry.expect("a directory entry");
        let target = to.join(entry.file_name());
        if entry.file_type().expect("file type").is_dir() {
            copy_tree(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), &target).expect("copy a file");
        }
    }
}
