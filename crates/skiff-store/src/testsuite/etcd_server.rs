//! A private etcd member for tests: Debian's `/usr/bin/etcd` (or `$SKIFF_ETCD`)
//! on free loopback client and peer ports with its own data dir, killed by
//! the PID it was started with when dropped.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::{EtcdOptions, EtcdStore};

/// A running etcd member started by a test.
pub struct EtcdServer {
    child: Option<Child>,
    dir: tempfile::TempDir,
    client_port: u16,
    peer_port: u16,
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free loopback port")
}

fn etcd_binary() -> PathBuf {
    if let Some(p) = std::env::var_os("SKIFF_ETCD") {
        return p.into();
    }
    let debian = PathBuf::from("/usr/bin/etcd");
    if debian.exists() {
        debian
    } else {
        "etcd".into()
    }
}

impl EtcdServer {
    /// Starts a single-member etcd and waits until it answers.
    pub async fn start() -> EtcdServer {
        let mut s = EtcdServer {
            child: None,
            dir: tempfile::tempdir().expect("a temp dir for etcd"),
            client_port: free_port(),
            peer_port: free_port(),
        };
        s.spawn();
        s.wait_ready().await;
        s
    }

    /// The client URL.
    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.client_port)
    }

    /// Options connecting to this member (default prefix).
    pub fn options(&self) -> EtcdOptions {
        EtcdOptions {
            endpoints: vec![self.endpoint()],
            ..Default::default()
        }
    }

    /// A store on this member.
    pub async fn store(&self) -> Arc<EtcdStore> {
        EtcdStore::connect(self.options())
            .await
            .expect("connecting to the test etcd")
    }

    /// The data directory.
    pub fn data_dir(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    fn spawn(&mut self) {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.path().join("etcd.log"))
            .expect("the etcd log file");
        let peer = format!("http://127.0.0.1:{}", self.peer_port);
        let client = self.endpoint();
        let child = Command::new(etcd_binary())
            .arg("--name=test")
            .arg(format!("--data-dir={}", self.data_dir().display()))
            .arg(format!("--listen-client-urls={client}"))
            .arg(format!("--advertise-client-urls={client}"))
            .arg(format!("--listen-peer-urls={peer}"))
            .arg(format!("--initial-advertise-peer-urls={peer}"))
            .arg(format!("--initial-cluster=test={peer}"))
            .arg("--initial-cluster-state=new")
            .arg("--logger=zap")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::from(log))
            .spawn()
            .expect("starting etcd (apt-get install etcd-server)");
        self.child = Some(child);
    }

    async fn wait_ready(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(c) = self.child.as_mut() {
                if let Ok(Some(status)) = c.try_wait() {
                    panic!("etcd exited ({status}): {}", self.log());
                }
            }
            let opts = EtcdOptions {
                request_timeout: Duration::from_secs(1),
                ..self.options()
            };
            if EtcdStore::connect(opts).await.is_ok() {
                return;
            }
            if Instant::now() > deadline {
                panic!("etcd did not answer within 30s: {}", self.log());
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// What etcd logged.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("etcd.log")).unwrap_or_default()
    }

    /// Kills the member (SIGKILL to the PID it was started with) and waits for it.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Starts the killed member again on the same ports and data.
    pub async fn restart(&mut self) {
        self.kill();
        self.spawn();
        self.wait_ready().await;
    }
}

impl Drop for EtcdServer {
    fn drop(&mut self) {
        self.kill();
    }
}
