//! A private etcd member for tests: Debian's `/usr/bin/etcd` (or `$SKIFF_ETCD`)
//! on free loopback client and peer ports with its own data dir, killed by
//! the PID it was started with when dropped. [`EtcdServer::start_tls`] serves
//! clients over TLS and requires a client certificate, all from a CA it
//! makes. [`EtcdCluster`] is several members forming one cluster.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::{EtcdOptions, EtcdStore, EtcdTls};

/// A running etcd member started by a test.
pub struct EtcdServer {
    child: Option<Child>,
    dir: tempfile::TempDir,
    client_port: u16,
    peer_port: u16,
    tls: bool,
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
        EtcdServer::launch(false).await
    }

    /// Starts a member serving clients over TLS only, with a serving
    /// certificate for 127.0.0.1 and client certificates required, both
    /// from a CA of its own: [`EtcdServer::ca_file`],
    /// [`EtcdServer::client_cert_file`] and [`EtcdServer::client_key_file`]
    /// are what a client needs.
    pub async fn start_tls() -> EtcdServer {
        EtcdServer::launch(true).await
    }

    async fn launch(tls: bool) -> EtcdServer {
        let mut s = EtcdServer {
            child: None,
            dir: tempfile::tempdir().expect("a temp dir for etcd"),
            client_port: free_port(),
            peer_port: free_port(),
            tls,
        };
        if tls {
            s.write_certificates();
        }
        s.spawn();
        s.wait_ready().await;
        s
    }

    /// The client URL.
    pub fn endpoint(&self) -> String {
        let scheme = if self.tls { "https" } else { "http" };
        format!("{scheme}://127.0.0.1:{}", self.client_port)
    }

    /// The CA (PEM) that signed the member's and the client's certificates.
    pub fn ca_file(&self) -> PathBuf {
        self.dir.path().join("ca.pem")
    }

    /// A client certificate (PEM) the member accepts.
    pub fn client_cert_file(&self) -> PathBuf {
        self.dir.path().join("client.pem")
    }

    /// The key of [`EtcdServer::client_cert_file`].
    pub fn client_key_file(&self) -> PathBuf {
        self.dir.path().join("client-key.pem")
    }

    /// Options connecting to this member (default prefix; the client
    /// certificate when it serves TLS).
    pub fn options(&self) -> EtcdOptions {
        let tls = self.tls.then(|| EtcdTls {
            ca_pem: std::fs::read(self.ca_file()).ok(),
            cert_pem: std::fs::read(self.client_cert_file()).ok(),
            key_pem: std::fs::read(self.client_key_file()).ok(),
        });
        EtcdOptions {
            endpoints: vec![self.endpoint()],
            tls,
            ..Default::default()
        }
    }

    fn write_certificates(&self) {
        use rcgen::{
            BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer,
            KeyPair, SanType,
        };
        let ca_key = KeyPair::generate().expect("a CA key");
        let mut ca = CertificateParams::new(Vec::<String>::new()).expect("CA params");
        ca.distinguished_name
            .push(DnType::CommonName, "etcd-test-ca");
        ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        let ca_cert = ca.self_signed(&ca_key).expect("the CA certificate");
        let issuer = Issuer::new(ca, ca_key);
        let issue = |cn: &str, server: bool| {
            let key = KeyPair::generate().expect("a key");
            let mut p = CertificateParams::new(Vec::<String>::new()).expect("params");
            p.distinguished_name.push(DnType::CommonName, cn);
            if server {
                p.subject_alt_names = vec![
                    SanType::IpAddress([127, 0, 0, 1].into()),
                    SanType::DnsName("localhost".try_into().expect("a DNS name")),
                ];
                p.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
            } else {
                p.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
            }
            let cert = p.signed_by(&key, &issuer).expect("a certificate");
            (cert.pem(), key.serialize_pem())
        };
        let (server, server_key) = issue("etcd-test", true);
        let (client, client_key) = issue("skiff", false);
        let d = self.dir.path();
        for (name, pem) in [
            ("ca.pem", ca_cert.pem()),
            ("server.pem", server),
            ("server-key.pem", server_key),
            ("client.pem", client),
            ("client-key.pem", client_key),
        ] {
            std::fs::write(d.join(name), pem).expect("writing a test certificate");
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
            .args(if self.tls {
                let d = self.dir.path();
                vec![
                    format!("--cert-file={}", d.join("server.pem").display()),
                    format!("--key-file={}", d.join("server-key.pem").display()),
                    format!("--trusted-ca-file={}", self.ca_file().display()),
                    "--client-cert-auth".to_string(),
                ]
            } else {
                Vec::new()
            })
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
                member_sync_interval: None,
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

/// One member of an [`EtcdCluster`].
struct ClusterMember {
    name: String,
    client_port: u16,
    peer_port: u16,
    child: Option<Child>,
}

/// Several etcd members on loopback forming one cluster (a quorum of them
/// serves), each killed by the PID it was started with when the test says
/// so or when dropped, and restartable on its ports and data.
pub struct EtcdCluster {
    dir: tempfile::TempDir,
    members: Vec<ClusterMember>,
    initial: String,
}

impl EtcdCluster {
    /// Starts `n` members and waits until each answers.
    pub async fn start(n: usize) -> EtcdCluster {
        let members: Vec<ClusterMember> = (0..n)
            .map(|i| ClusterMember {
                name: format!("m{i}"),
                client_port: free_port(),
                peer_port: free_port(),
                child: None,
            })
            .collect();
        let initial = members
            .iter()
            .map(|m| format!("{}=http://127.0.0.1:{}", m.name, m.peer_port))
            .collect::<Vec<_>>()
            .join(",");
        let mut c = EtcdCluster {
            dir: tempfile::tempdir().expect("a temp dir for etcd"),
            members,
            initial,
        };
        for i in 0..n {
            c.spawn(i);
        }
        for i in 0..n {
            c.wait_ready(i).await;
        }
        c
    }

    /// The client URL of member `i`.
    pub fn endpoint(&self, i: usize) -> String {
        format!("http://127.0.0.1:{}", self.members[i].client_port)
    }

    /// Every member's client URL, in order.
    pub fn endpoints(&self) -> Vec<String> {
        (0..self.members.len()).map(|i| self.endpoint(i)).collect()
    }

    /// Options listing every member (default prefix).
    pub fn options(&self) -> EtcdOptions {
        EtcdOptions {
            endpoints: self.endpoints(),
            ..Default::default()
        }
    }

    fn spawn(&mut self, i: usize) {
        let m = &self.members[i];
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.path().join(format!("{}.log", m.name)))
            .expect("the etcd log file");
        let client = format!("http://127.0.0.1:{}", m.client_port);
        let peer = format!("http://127.0.0.1:{}", m.peer_port);
        let token = format!(
            "skiff-test-{}",
            self.dir
                .path()
                .file_name()
                .unwrap_or_default()
                .to_string_lossy()
        );
        let child = Command::new(etcd_binary())
            .arg(format!("--name={}", m.name))
            .arg(format!(
                "--data-dir={}",
                self.dir.path().join(&m.name).display()
            ))
            .arg(format!("--listen-client-urls={client}"))
            .arg(format!("--advertise-client-urls={client}"))
            .arg(format!("--listen-peer-urls={peer}"))
            .arg(format!("--initial-advertise-peer-urls={peer}"))
            .arg(format!("--initial-cluster={}", self.initial))
            .arg(format!("--initial-cluster-token={token}"))
            .arg("--initial-cluster-state=new")
            .arg("--logger=zap")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::from(log))
            .spawn()
            .expect("starting etcd (apt-get install etcd-server)");
        self.members[i].child = Some(child);
    }

    /// Waits until member `i` answers a linearizable read (it has a leader).
    async fn wait_ready(&mut self, i: usize) {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if let Some(c) = self.members[i].child.as_mut() {
                if let Ok(Some(status)) = c.try_wait() {
                    panic!("etcd member {i} exited ({status}): {}", self.log(i));
                }
            }
            let opts = EtcdOptions {
                endpoints: vec![self.endpoint(i)],
                request_timeout: Duration::from_secs(1),
                member_sync_interval: None,
                ..Default::default()
            };
            if EtcdStore::connect(opts).await.is_ok() {
                return;
            }
            if Instant::now() > deadline {
                panic!("etcd member {i} did not answer within 60s: {}", self.log(i));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// What member `i` logged.
    pub fn log(&self, i: usize) -> String {
        std::fs::read_to_string(
            self.dir
                .path()
                .join(format!("{}.log", self.members[i].name)),
        )
        .unwrap_or_default()
    }

    /// Kills member `i` (SIGKILL to the PID it was started with) and waits
    /// for it.
    pub fn kill(&mut self, i: usize) {
        if let Some(mut c) = self.members[i].child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Starts killed member `i` again on its ports and data, and waits
    /// until it answers.
    pub async fn restart(&mut self, i: usize) {
        self.kill(i);
        self.spawn(i);
        self.wait_ready(i).await;
    }

    /// The index of the member the running members agree is the leader.
    pub async fn leader(&self) -> Option<usize> {
        let mut ids = Vec::new();
        let mut leader = None;
        for i in 0..self.members.len() {
            if self.members[i].child.is_none() {
                ids.push(None);
                continue;
            }
            let status = async {
                let mut c = etcd_client::Client::connect([self.endpoint(i)], None).await?;
                c.status().await
            };
            match tokio::time::timeout(Duration::from_secs(2), status).await {
                Ok(Ok(s)) => {
                    let id = s.header().map(|h| h.member_id());
                    ids.push(id);
                    if s.leader() != 0 {
                        leader = Some(s.leader());
                    }
                }
                _ => ids.push(None),
            }
        }
        let leader = leader?;
        ids.iter().position(|id| *id == Some(leader))
    }
}

impl Drop for EtcdCluster {
    fn drop(&mut self) {
        for i in 0..self.members.len() {
            self.kill(i);
        }
    }
}
