//! An HA control plane from `skiff server` alone (issue 15 §3):
//! `--cluster-init` starts and supervises a local etcd member (Debian's
//! `/usr/bin/etcd`, as the agent supervises containerd: its data under
//! `DATA/etcd`, restarted when it exits, stopped with the server, killed
//! with it through a parent-death signal), with client and peer TLS from
//! certificates the cluster CA issues (`DATA/pki/etcd/`); the API server
//! uses that member. `--server https://FIRST:PORT --token T` on another
//! machine joins: it fetches the cluster's shared credentials from the
//! first server (sealed with the token, see `bootstrap`), asks it to add
//! its etcd member (etcd's member add, then its own member starts with
//! `initial-cluster-state=existing`), and then serves like the others.
//!
//! The join endpoints (`/skiff/v1/bootstrap`, `/skiff/v1/etcd-members`)
//! are served beside the Kubernetes API by servers that run a member, for
//! requests carrying `Authorization: Bearer <join secret>`, a credential
//! derived from the token (the token itself never travels).

use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context, Result};

/// The local etcd member of a server.
#[derive(Clone)]
pub struct Member {
    pub name: String,
    pub peer_ip: IpAddr,
    pub client_port: u16,
    pub peer_port: u16,
    pub data_dir: PathBuf,
}

fn host(ip: IpAddr) -> String {
    match ip {
        IpAddr::V6(v6) => format!("[{v6}]"),
        IpAddr::V4(v4) => v4.to_string(),
    }
}

impl Member {
    /// The member of the server whose data is in `data_dir` (its name kept
    /// in `DATA/etcd-name`, made once from the host name).
    pub fn new(
        data_dir: &Path,
        peer_ip: IpAddr,
        client_port: u16,
        peer_port: u16,
    ) -> Result<Member> {
        let name_file = data_dir.join("etcd-name");
        let name = match std::fs::read_to_string(&name_file) {
            Ok(n) if !n.trim().is_empty() => n.trim().to_string(),
            _ => {
                let h = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
                let n = format!(
                    "{}-{:08x}",
                    h.trim().to_lowercase(),
                    std::time::SystemTime::now()
                        .duration_since(std::time::UNIX_EPOCH)
                        .map(|d| d.subsec_nanos())
                        .unwrap_or(0)
                        ^ std::process::id()
                );
                n
            }
        };
        Ok(Member {
            name,
            peer_ip,
            client_port,
            peer_port,
            data_dir: data_dir.to_path_buf(),
        })
    }

    fn pki(&self) -> PathBuf {
        self.data_dir.join("pki/etcd")
    }

    pub fn etcd_dir(&self) -> PathBuf {
        self.data_dir.join("etcd")
    }

    /// Whether this member has joined a cluster before (its data exists).
    pub fn initialized(&self) -> bool {
        self.etcd_dir().join("member").exists()
    }

    pub fn local_client_url(&self) -> String {
        format!("https://127.0.0.1:{}", self.client_port)
    }

    pub fn peer_url(&self) -> String {
        format!("https://{}:{}", host(self.peer_ip), self.peer_port)
    }

    /// `(ca, cert, key)` files of the API server's etcd client certificate.
    pub fn client_files(&self) -> (PathBuf, PathBuf, PathBuf) {
        let d = self.pki();
        (d.join("ca.crt"), d.join("client.crt"), d.join("client.key"))
    }

    /// The member's serving and peer certificates and the API server's
    /// client certificate, from the cluster CA (issued at every start).
    pub fn write_certificates(&self, ca: &skiff_apiserver::tls::CertPair) -> Result<()> {
        std::fs::write(self.data_dir.join("etcd-name"), &self.name)?;
        let d = self.pki();
        std::fs::create_dir_all(&d)?;
        let mut sans = vec![
            "127.0.0.1".to_string(),
            "localhost".to_string(),
            self.peer_ip.to_string(),
        ];
        let h = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
        if !h.trim().is_empty() {
            sans.push(h.trim().to_lowercase());
        }
        let write = |name: &str, pair: &skiff_apiserver::tls::CertPair| -> Result<()> {
            skiff_apiserver::tls::write_secret_file(
                &d.join(format!("{name}.crt")),
                &pair.cert_pem,
            )?;
            skiff_apiserver::tls::write_secret_file(&d.join(format!("{name}.key")), &pair.key_pem)
        };
        skiff_apiserver::tls::write_secret_file(&d.join("ca.crt"), &ca.cert_pem)?;
        write(
            "server",
            &skiff_apiserver::tls::issue_peer(ca, &self.name, &sans, 365)?,
        )?;
        write(
            "peer",
            &skiff_apiserver::tls::issue_peer(ca, &self.name, &sans, 365)?,
        )?;
        write(
            "client",
            &skiff_apiserver::tls::issue(ca, "kube-apiserver-etcd-client", &[], &[], true, 365)?,
        )?;
        Ok(())
    }

    fn args(&self, initial_cluster: &str, state: &str) -> Vec<String> {
        let d = self.pki();
        let f = |n: &str| d.join(n).display().to_string();
        let client_urls = if self.peer_ip.is_loopback() {
            self.local_client_url()
        } else {
            format!(
                "{},https://{}:{}",
                self.local_client_url(),
                host(self.peer_ip),
                self.client_port
            )
        };
        vec![
            format!("--name={}", self.name),
            format!("--data-dir={}", self.etcd_dir().display()),
            format!("--listen-client-urls={client_urls}"),
            format!(
                "--advertise-client-urls=https://{}:{}",
                host(self.peer_ip),
                self.client_port
            ),
            format!("--listen-peer-urls={}", self.peer_url()),
            format!("--initial-advertise-peer-urls={}", self.peer_url()),
            format!("--initial-cluster={initial_cluster}"),
            format!("--initial-cluster-state={state}"),
            "--initial-cluster-token=skiff".into(),
            "--client-cert-auth".into(),
            format!("--trusted-ca-file={}", f("ca.crt")),
            format!("--cert-file={}", f("server.crt")),
            format!("--key-file={}", f("server.key")),
            "--peer-client-cert-auth".into(),
            format!("--peer-trusted-ca-file={}", f("ca.crt")),
            format!("--peer-cert-file={}", f("peer.crt")),
            format!("--peer-key-file={}", f("peer.key")),
            // Past the default 100 ms, so loaded CI machines do not flap.
            "--heartbeat-interval=250".into(),
            "--election-timeout=2500".into(),
        ]
    }

    /// TLS options of a client of the cluster (the API server's).
    pub fn client_options(&self) -> Result<skiff_store::EtcdOptions> {
        let (ca, cert, key) = self.client_files();
        Ok(skiff_store::EtcdOptions {
            endpoints: vec![self.local_client_url()],
            tls: Some(skiff_store::EtcdTls {
                ca_pem: Some(std::fs::read(ca)?),
                cert_pem: Some(std::fs::read(cert)?),
                key_pem: Some(std::fs::read(key)?),
            }),
            ..Default::default()
        })
    }
}

/// The etcd binary: Debian's, else the one on PATH.
fn etcd_binary() -> PathBuf {
    let debian = PathBuf::from("/usr/bin/etcd");
    if debian.exists() {
        debian
    } else {
        PathBuf::from("etcd")
    }
}

/// A supervised etcd member: restarted when it exits, stopped by
/// [`Supervisor::stop`] (or killed with the server's process).
pub struct Supervisor {
    stop: tokio::sync::watch::Sender<bool>,
    task: tokio::task::JoinHandle<()>,
}

impl Supervisor {
    /// Starts `member` (`initial_cluster` and `state` matter only the first
    /// time: afterwards etcd reads its data dir), its log in `DATA/etcd.log`.
    pub fn start(member: &Member, initial_cluster: &str, state: &str) -> Result<Supervisor> {
        std::fs::create_dir_all(member.etcd_dir())?;
        let args = member.args(initial_cluster, state);
        let log_path = member.data_dir.join("etcd.log");
        let (stop, mut stopped) = tokio::sync::watch::channel(false);
        let setpriv = Path::new("/usr/bin/setpriv").exists();
        let task = tokio::spawn(async move {
            loop {
                let log = match std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(&log_path)
                {
                    Ok(l) => l,
                    Err(e) => {
                        eprintln!("skiff: etcd log {}: {e}", log_path.display());
                        return;
                    }
                };
                // The member dies with the server (kill -9 included).
                let mut cmd = if setpriv {
                    let mut c = tokio::process::Command::new("/usr/bin/setpriv");
                    c.args(["--pdeathsig", "KILL", "--"]).arg(etcd_binary());
                    c
                } else {
                    tokio::process::Command::new(etcd_binary())
                };
                let child = cmd
                    .args(&args)
                    .stdin(std::process::Stdio::null())
                    .stdout(
                        log.try_clone()
                            .map(std::process::Stdio::from)
                            .unwrap_or_else(|_| std::process::Stdio::null()),
                    )
                    .stderr(log)
                    .kill_on_drop(true)
                    .spawn();
                let mut child = match child {
                    Ok(c) => c,
                    Err(e) => {
                        eprintln!("skiff: starting etcd: {e}");
                        tokio::time::sleep(Duration::from_secs(2)).await;
                        continue;
                    }
                };
                tokio::select! {
                    status = child.wait() => {
                        eprintln!("skiff: etcd exited ({}); restarting it", status.map(|s| s.to_string()).unwrap_or_else(|e| e.to_string()));
                        tokio::time::sleep(Duration::from_secs(1)).await;
                    }
                    _ = stopped.changed() => {
                        if let Some(pid) = child.id() {
                            let _ = nix::sys::signal::kill(
                                nix::unistd::Pid::from_raw(pid as i32),
                                nix::sys::signal::Signal::SIGTERM,
                            );
                        }
                        if tokio::time::timeout(Duration::from_secs(10), child.wait()).await.is_err() {
                            let _ = child.kill().await;
                        }
                        return;
                    }
                }
            }
        });
        Ok(Supervisor { stop, task })
    }

    /// Stops the member (SIGTERM, then SIGKILL after 10 s).
    pub async fn stop(self) {
        let _ = self.stop.send(true);
        let _ = self.task.await;
    }
}

/// Connects to the local member, waiting up to `secs` for it to serve.
pub async fn wait_ready(member: &Member, secs: u64) -> Result<()> {
    let deadline = std::time::Instant::now() + Duration::from_secs(secs);
    loop {
        match skiff_store::EtcdStore::connect(member.client_options()?).await {
            Ok(_) => return Ok(()),
            Err(e) if std::time::Instant::now() > deadline => {
                bail!(
                    "the local etcd member did not serve within {secs} s ({e}); see {}",
                    member.data_dir.join("etcd.log").display()
                )
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(300)).await,
        }
    }
}

/// A client of the join endpoints of `server`: with the join secret as
/// its bearer token; the server verified with `ca_pem` when given.
fn join_client(server: &str, token: &str, ca_pem: Option<&[u8]>) -> Result<kube::Client> {
    let mut config = kube::Config::new(server.parse().context("--server is not a URL")?);
    config.auth_info.token = Some(crate::bootstrap::join_secret(token).into());
    match ca_pem {
        Some(pem) => {
            use rustls::pki_types::pem::PemObject;
            let certs = rustls::pki_types::CertificateDer::pem_slice_iter(pem)
                .map(|c| c.map(|c| c.to_vec()))
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| anyhow::anyhow!("the cluster CA: {e:?}"))?;
            config.root_cert = Some(certs);
        }
        None => config.accept_invalid_certs = true,
    }
    Ok(kube::Client::try_from(config)?)
}

/// Fetches the cluster's sealed bootstrap data from `server` and installs
/// it in `data_dir` (it opens only with the right token, which is also
/// what makes it trustworthy).
pub async fn fetch_credentials(
    server: &str,
    token: &str,
    data_dir: &Path,
    settings: &std::collections::BTreeMap<String, String>,
) -> Result<()> {
    let client = join_client(server, token, None)?;
    let req = http::Request::get("/skiff/v1/bootstrap").body(Vec::new())?;
    let body = client
        .request_text(req)
        .await
        .with_context(|| format!("fetching the cluster's credentials from {server}"))?;
    let v: serde_json::Value =
        serde_json::from_str(&body).context("the server's bootstrap answer is not JSON")?;
    let key = v.get("key").and_then(|k| k.as_str()).context("no key")?;
    let value = v
        .get("value")
        .and_then(|k| k.as_str())
        .context("no value")?;
    crate::bootstrap::adopt(data_dir, key, token, value.as_bytes(), settings)
}

/// Asks `server` to add `member` to the cluster's etcd; returns the
/// `--initial-cluster` it is to start with.
pub async fn add_member(
    server: &str,
    token: &str,
    ca_pem: &[u8],
    member: &Member,
) -> Result<String> {
    let client = join_client(server, token, Some(ca_pem))?;
    let body = serde_json::json!({"name": member.name, "peerURL": member.peer_url()});
    let req = Post(body.to_string().into_bytes());
    // etcd refuses a reconfiguration while a member added just before is
    // not yet active (strict reconfig check): retry for a minute.
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    let answer = loop {
        let req = req.try_clone_for_retry().context("the member request")?;
        match client.request_text(req).await {
            Ok(a) => break a,
            Err(e) if std::time::Instant::now() < deadline => {
                tracing::info!(error = %e, "adding the etcd member; retrying");
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
            Err(e) => {
                return Err(anyhow::Error::new(e)
                    .context(format!("adding this server's etcd member through {server}")))
            }
        }
    };
    let v: serde_json::Value = serde_json::from_str(&answer)?;
    v.get("initialCluster")
        .and_then(|c| c.as_str())
        .map(str::to_string)
        .context("the server named no initial cluster")
}

/// The member request, made anew for each try.
struct Post(Vec<u8>);

impl Post {
    fn try_clone_for_retry(&self) -> Result<http::Request<Vec<u8>>> {
        Ok(http::Request::post("/skiff/v1/etcd-members")
            .header("content-type", "application/json")
            .body(self.0.clone())?)
    }
}

/// What the join endpoints need.
pub struct JoinState {
    pub secret: String,
    pub store: Arc<dyn skiff_store::Store>,
    pub key: String,
    pub etcd: skiff_store::EtcdOptions,
}

fn authorized(state: &JoinState, headers: &http::HeaderMap) -> bool {
    let Some(got) = headers
        .get(http::header::AUTHORIZATION)
        .and_then(|h| h.to_str().ok())
        .and_then(|h| h.strip_prefix("Bearer "))
    else {
        return false;
    };
    let want = state.secret.as_bytes();
    got.len() == want.len()
        && got
            .bytes()
            .zip(want.iter())
            .fold(0u8, |acc, (a, b)| acc | (a ^ b))
            == 0
}

fn answer(code: http::StatusCode, body: serde_json::Value) -> axum::response::Response {
    use axum::response::IntoResponse;
    (code, axum::Json(body)).into_response()
}

async fn bootstrap_handler(
    axum::extract::State(state): axum::extract::State<Arc<JoinState>>,
    headers: http::HeaderMap,
) -> axum::response::Response {
    if !authorized(&state, &headers) {
        return answer(
            http::StatusCode::UNAUTHORIZED,
            serde_json::json!({"message": "Unauthorized"}),
        );
    }
    match state.store.get(&state.key).await {
        Ok(Some(kv)) => answer(
            http::StatusCode::OK,
            serde_json::json!({"key": state.key, "value": String::from_utf8_lossy(&kv.value)}),
        ),
        Ok(None) => answer(
            http::StatusCode::NOT_FOUND,
            serde_json::json!({"message": "no bootstrap data"}),
        ),
        Err(e) => answer(
            http::StatusCode::SERVICE_UNAVAILABLE,
            serde_json::json!({"message": e.to_string()}),
        ),
    }
}

async fn add_member_handler(
    axum::extract::State(state): axum::extract::State<Arc<JoinState>>,
    headers: http::HeaderMap,
    body: axum::body::Bytes,
) -> axum::response::Response {
    if !authorized(&state, &headers) {
        return answer(
            http::StatusCode::UNAUTHORIZED,
            serde_json::json!({"message": "Unauthorized"}),
        );
    }
    let req: serde_json::Value = serde_json::from_slice(&body).unwrap_or_default();
    let (Some(name), Some(url)) = (
        req.get("name").and_then(|n| n.as_str()),
        req.get("peerURL").and_then(|n| n.as_str()),
    ) else {
        return answer(
            http::StatusCode::BAD_REQUEST,
            serde_json::json!({"message": "want name and peerURL"}),
        );
    };
    match member_add(&state.etcd, name, url).await {
        Ok(initial) => answer(
            http::StatusCode::OK,
            serde_json::json!({"initialCluster": initial}),
        ),
        Err(e) => answer(
            http::StatusCode::INTERNAL_SERVER_ERROR,
            serde_json::json!({"message": format!("{e:#}")}),
        ),
    }
}

fn etcd_connect_options(opts: &skiff_store::EtcdOptions) -> etcd_client::ConnectOptions {
    let mut co = etcd_client::ConnectOptions::new().with_connect_timeout(Duration::from_secs(5));
    if let Some(tls) = &opts.tls {
        let mut t = etcd_client::TlsOptions::new();
        if let Some(ca) = &tls.ca_pem {
            t = t.ca_certificate(etcd_client::Certificate::from_pem(ca));
        }
        if let (Some(c), Some(k)) = (&tls.cert_pem, &tls.key_pem) {
            t = t.identity(etcd_client::Identity::from_pem(c, k));
        }
        co = co.with_tls(t);
    }
    co
}

/// Removes `member` from the cluster's etcd (a server leaving for good);
/// its data dir is then of no use and is deleted.
pub async fn remove(member: &Member) -> Result<()> {
    let opts = member.client_options()?;
    let mut client =
        etcd_client::Client::connect(&opts.endpoints, Some(etcd_connect_options(&opts))).await?;
    let list = client.member_list().await?;
    let me = list
        .members()
        .iter()
        .find(|m| m.name() == member.name || m.peer_urls().iter().any(|u| *u == member.peer_url()))
        .map(|m| m.id())
        .context("this server's etcd member is not in the cluster")?;
    // Ask the other members: a member that applies its own removal shuts
    // down (etcd exits 0), often before it answers, and a client that only
    // knows it then retries into a closed port.
    let others: Vec<String> = list
        .members()
        .iter()
        .filter(|m| m.id() != me)
        .flat_map(|m| m.client_urls().iter().cloned())
        .collect();
    if !others.is_empty() {
        client = etcd_client::Client::connect(&others, Some(etcd_connect_options(&opts))).await?;
    }
    // etcd refuses while too few of the others have been connected for a
    // while (strict reconfig check): retry for 30 s. A removal applied
    // whose answer was lost shows in the member list.
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let e = match client.member_remove(me).await {
            Ok(_) => return Ok(()),
            Err(e) => e,
        };
        if let Ok(now) = client.member_list().await {
            if !now.members().iter().any(|m| m.id() == me) {
                return Ok(());
            }
        }
        if std::time::Instant::now() >= deadline {
            return Err(e.into());
        }
        tracing::info!(error = %e, "removing the etcd member; retrying");
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// etcd's member add (or, for a peer URL already a member, its list):
/// the `--initial-cluster` the new member starts with.
async fn member_add(opts: &skiff_store::EtcdOptions, name: &str, peer_url: &str) -> Result<String> {
    let mut client =
        etcd_client::Client::connect(&opts.endpoints, Some(etcd_connect_options(opts))).await?;
    let list = client.member_list().await?;
    let exists = list
        .members()
        .iter()
        .any(|m| m.peer_urls().iter().any(|u| u == peer_url));
    let (members, new_id) = if exists {
        (list.members().to_vec(), None)
    } else {
        let added = client.member_add([peer_url], None).await?;
        (added.member_list().to_vec(), added.member().map(|m| m.id()))
    };
    let mut parts = Vec::new();
    for m in &members {
        let n = if Some(m.id()) == new_id
            || (m.name().is_empty() && m.peer_urls().iter().any(|u| u == peer_url))
        {
            name.to_string()
        } else {
            m.name().to_string()
        };
        if n.is_empty() {
            continue;
        }
        for u in m.peer_urls() {
            parts.push(format!("{n}={u}"));
        }
    }
    Ok(parts.join(","))
}

/// The join endpoints, to be served beside the Kubernetes API.
pub fn routes(state: Arc<JoinState>) -> axum::Router {
    axum::Router::new()
        .route("/skiff/v1/bootstrap", axum::routing::get(bootstrap_handler))
        .route(
            "/skiff/v1/etcd-members",
            axum::routing::post(add_member_handler),
        )
        .with_state(state)
}
