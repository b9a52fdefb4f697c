//! Joining a cluster with a join token (`skiff agent --server URL --token
//! K10<ca-hash>::<id>.<secret>`), as kubelet's TLS bootstrap does:
//!
//! 1. read the `cluster-info` ConfigMap in kube-public without trusting the
//!    server yet, and accept the CA in it only if its SHA-256 (of the DER)
//!    is the token's hash; every later connection verifies the server
//!    with that CA;
//! 2. with the bootstrap token (`<id>.<secret>`, `system:bootstrap:<id>`)
//!    create a CertificateSigningRequest for `system:node:<name>` in
//!    `system:nodes` (signer `kubernetes.io/kube-apiserver-client-kubelet`),
//!    which the cluster approves for bootstrappers and signs;
//! 3. keep the key and issued certificate under the agent's data dir
//!    (`pki/kubelet-client.{key,crt}`) and a kubeconfig using them
//!    (`kubelet.kubeconfig`), used from then on.
//!
//! At every start the certificate is reused while more than a fifth of its
//! life remains; otherwise a new one is requested (with the current
//! certificate while it is valid, as a node renewing itself, else with the
//! token).

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{bail, Context, Result};
use base64::Engine;
use k8s_openapi::api::certificates::v1::{
    CertificateSigningRequest, CertificateSigningRequestSpec,
};
use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::ByteString;
use kube::api::{Api, PostParams};

pub const SIGNER: &str = "kubernetes.io/kube-apiserver-client-kubelet";

/// A join token's (CA hash, `<id>.<secret>`).
pub fn split_token(token: &str) -> Option<(&str, &str)> {
    let rest = token.trim().strip_prefix("K10")?;
    let (hash, cred) = rest.split_once("::")?;
    let (id, secret) = cred.split_once('.')?;
    let ok = |s: &str, n: usize| {
        s.len() == n
            && s.bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
    };
    (hash.len() == 64 && ok(id, 6) && ok(secret, 16)).then_some((hash, cred))
}

/// Hex SHA-256 of the DER of the first certificate in `pem`.
pub fn ca_hash(pem: &[u8]) -> Option<String> {
    let (_, p) = x509_parser::pem::parse_x509_pem(pem).ok()?;
    let d = ring::digest::digest(&ring::digest::SHA256, &p.contents);
    Some(d.as_ref().iter().map(|b| format!("{b:02x}")).collect())
}

fn b64(data: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(data)
}

fn kubeconfig(server: &str, ca_pem: &[u8], user: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: skiff\n  cluster:\n    server: {server}\n    certificate-authority-data: {}\ncontexts:\n- name: skiff\n  context:\n    cluster: skiff\n    user: node\ncurrent-context: skiff\nusers:\n- name: node\n  user:\n{user}",
        b64(ca_pem)
    )
}

pub(crate) fn write_private(path: &Path, data: &[u8]) -> Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    if let Some(p) = path.parent() {
        std::fs::create_dir_all(p)?;
    }
    let tmp = path.with_extension("tmp");
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .write(true)
        .truncate(true)
        .mode(0o600)
        .open(&tmp)
        .with_context(|| format!("writing {}", tmp.display()))?;
    f.write_all(data)?;
    f.sync_all()?;
    std::fs::rename(&tmp, path).with_context(|| format!("writing {}", path.display()))?;
    Ok(())
}

/// Reads the cluster CA from `cluster-info` without trusting the server,
/// and checks it against the token's hash.
async fn discover_ca(server: &str, hash: &str) -> Result<Vec<u8>> {
    let mut config = kube::Config::new(server.parse().context("--server is not a URL")?);
    config.accept_invalid_certs = true;
    let client = kube::Client::try_from(config)?;
    let cms: Api<ConfigMap> = Api::namespaced(client, "kube-public");
    let cm = cms
        .get("cluster-info")
        .await
        .context("reading kube-public/cluster-info from the server")?;
    let kc = cm
        .data
        .and_then(|d| d.get("kubeconfig").cloned())
        .context("cluster-info has no kubeconfig")?;
    let kc = kube::config::Kubeconfig::from_yaml(&kc).context("cluster-info's kubeconfig")?;
    let data = kc
        .clusters
        .first()
        .and_then(|c| c.cluster.as_ref())
        .and_then(|c| c.certificate_authority_data.clone())
        .context("cluster-info names no CA")?;
    let pem = base64::engine::general_purpose::STANDARD
        .decode(data.trim())
        .context("cluster-info's CA is not base64")?;
    match ca_hash(&pem) {
        Some(h) if h == hash => Ok(pem),
        Some(h) => bail!(
            "the server's CA (sha256 {h}) is not the one the join token names (sha256 {hash}); refusing to join"
        ),
        None => bail!("cluster-info's CA is not a PEM certificate"),
    }
}

/// The remaining fraction of a PEM certificate's life (negative: expired).
fn life_left(cert_pem: &[u8]) -> Option<f64> {
    let (_, p) = x509_parser::pem::parse_x509_pem(cert_pem).ok()?;
    let c = p.parse_x509().ok()?;
    let from = c.validity().not_before.timestamp() as f64;
    let to = c.validity().not_after.timestamp() as f64;
    let now = chrono::Utc::now().timestamp() as f64;
    (to > from).then(|| (to - now) / (to - from))
}

/// Requests a client certificate for `system:node:<node>` with `client`,
/// waits for it, and returns (key PEM, certificate PEM).
async fn request_certificate(client: kube::Client, node: &str) -> Result<(String, Vec<u8>)> {
    request(
        client,
        node,
        SIGNER,
        &["digital signature", "client auth"],
        &[],
        "node-csr",
        Duration::from_secs(600),
    )
    .await
}

/// Requests a certificate for `system:node:<node>` from `signer` with
/// `usages` and the subject alternative names `sans` (IPs or DNS names),
/// waits up to `wait` for it, and returns (key PEM, certificate PEM).
pub(crate) async fn request(
    client: kube::Client,
    node: &str,
    signer: &str,
    usages: &[&str],
    sans: &[String],
    prefix: &str,
    wait: Duration,
) -> Result<(String, Vec<u8>)> {
    let key = rcgen::KeyPair::generate()?;
    let mut params = rcgen::CertificateParams::new(Vec::<String>::new())?;
    for san in sans {
        params
            .subject_alt_names
            .push(match san.parse::<std::net::IpAddr>() {
                Ok(ip) => rcgen::SanType::IpAddress(ip),
                Err(_) => rcgen::SanType::DnsName(san.clone().try_into()?),
            });
    }
    let mut dn = rcgen::DistinguishedName::new();
    dn.push(rcgen::DnType::OrganizationName, "system:nodes");
    dn.push(rcgen::DnType::CommonName, format!("system:node:{node}"));
    params.distinguished_name = dn;
    let pem = params.serialize_request(&key)?.pem()?;
    let name = format!("{prefix}-{}", {
        use rand::Rng;
        const A: &[u8] = b"abcdefghijklmnopqrstuvwxyz0123456789";
        let mut rng = rand::rng();
        (0..10)
            .map(|_| A[rng.random_range(0..A.len())] as char)
            .collect::<String>()
    });
    let csr = CertificateSigningRequest {
        metadata: kube::api::ObjectMeta {
            name: Some(name.clone()),
            ..Default::default()
        },
        spec: CertificateSigningRequestSpec {
            request: ByteString(pem.into_bytes()),
            signer_name: signer.into(),
            usages: Some(usages.iter().map(|u| u.to_string()).collect()),
            ..Default::default()
        },
        status: None,
    };
    let api: Api<CertificateSigningRequest> = Api::all(client);
    api.create(&PostParams::default(), &csr)
        .await
        .context("creating the node's CertificateSigningRequest")?;
    eprintln!(
        "skiff: requested a certificate for system:node:{node} from {signer} ({name}); waiting for it to be issued"
    );
    let deadline = std::time::Instant::now() + wait;
    loop {
        let c = api.get(&name).await?;
        let st = c.status.unwrap_or_default();
        for cond in st.conditions.iter().flatten() {
            if matches!(cond.type_.as_str(), "Denied" | "Failed") && cond.status == "True" {
                bail!(
                    "certificate request {name} {}: {}",
                    cond.type_.to_lowercase(),
                    cond.message.clone().unwrap_or_default()
                );
            }
        }
        if let Some(cert) = st.certificate.filter(|c| !c.0.is_empty()) {
            return Ok((key.serialize_pem(), cert.0));
        }
        if std::time::Instant::now() > deadline {
            bail!("certificate request {name} was not issued within {wait:?} (approve it with `kubectl certificate approve {name}`)");
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

fn parse_token(token: &str) -> Result<(&str, &str)> {
    match split_token(token) {
        Some(t) => Ok(t),
        None => bail!(
            "the join token is not of the form K10<sha256>::<id>.<secret> (see DATA/token on the server)"
        ),
    }
}

/// The cluster CA the token names: the one kept under `dir` if its hash is
/// the token's, else read from the server's `cluster-info` and checked
/// against the token (and then kept under `dir`).
pub async fn trusted_ca(server: &str, token: &str, dir: &Path) -> Result<Vec<u8>> {
    let (hash, _) = parse_token(token)?;
    let ca_path = dir.join("pki/ca.crt");
    let ca = match std::fs::read(&ca_path) {
        Ok(ca) if ca_hash(&ca).as_deref() == Some(hash) => ca,
        _ => discover_ca(server, hash).await?,
    };
    write_private(&ca_path, &ca)?;
    Ok(ca)
}

/// Joins (or rejoins) the cluster at `server` as node `node`, keeping its
/// credentials under `dir`; returns the node's kubeconfig.
pub async fn join(server: &str, token: &str, node: &str, dir: &Path) -> Result<PathBuf> {
    let ca = trusted_ca(server, token, dir).await?;
    join_with_ca(server, token, node, dir, &ca).await
}

/// [`join`] with the cluster CA already known and checked (`trusted_ca`):
/// hollow nodes join one by one, each with its own key and certificate.
pub async fn join_with_ca(
    server: &str,
    token: &str,
    node: &str,
    dir: &Path,
    ca: &[u8],
) -> Result<PathBuf> {
    let (hash, cred) = parse_token(token)?;
    if ca_hash(ca).as_deref() != Some(hash) {
        bail!("the cluster CA given is not the one the join token names");
    }
    let kc_path = dir.join("kubelet.kubeconfig");
    let crt_path = dir.join("pki/kubelet-client.crt");
    write_private(&dir.join("pki/ca.crt"), ca)?;
    let current = std::fs::read(&crt_path).ok();
    let left = current.as_deref().and_then(life_left);
    if left.is_some_and(|l| l > 0.2) && kc_path.exists() {
        return Ok(kc_path);
    }
    // Renew as the node while its certificate is valid; else bootstrap.
    let bootstrap_kc = dir.join("bootstrap.kubeconfig");
    let client_kc = if left.is_some_and(|l| l > 0.0) && kc_path.exists() {
        kc_path.clone()
    } else {
        write_private(
            &bootstrap_kc,
            kubeconfig(server, ca, &format!("    token: {cred}\n")).as_bytes(),
        )?;
        bootstrap_kc.clone()
    };
    let client = skiff_kube::client_from_kubeconfig(&client_kc).await?;
    let (key_pem, cert_pem) = request_certificate(client, node).await?;
    let _ = std::fs::remove_file(&bootstrap_kc);
    write_credentials(dir, server, ca, &key_pem, &cert_pem)
}

/// Keeps a new key and certificate and the kubeconfig using them.
fn write_credentials(
    dir: &Path,
    server: &str,
    ca: &[u8],
    key_pem: &str,
    cert_pem: &[u8],
) -> Result<PathBuf> {
    let kc_path = dir.join("kubelet.kubeconfig");
    write_private(&dir.join("pki/kubelet-client.key"), key_pem.as_bytes())?;
    write_private(&dir.join("pki/kubelet-client.crt"), cert_pem)?;
    let user = format!(
        "    client-certificate-data: {}\n    client-key-data: {}\n",
        b64(cert_pem),
        b64(key_pem.as_bytes())
    );
    write_private(&kc_path, kubeconfig(server, ca, &user).as_bytes())?;
    Ok(kc_path)
}

/// The fraction of its life after which a certificate is renewed (kubelet
/// rotates between 70% and 90%; skiff at 80%).
pub const RENEW_AT: f64 = 0.8;

/// How long until the node's client certificate in `dir` is due for
/// renewal (zero when it is due now or unreadable).
pub fn due_in(dir: &Path, at: f64) -> Duration {
    match std::fs::read(dir.join("pki/kubelet-client.crt")) {
        Ok(pem) => cert_due_in(&pem, at),
        Err(_) => Duration::ZERO,
    }
}

/// How long until `at` of a PEM certificate's life has passed.
pub fn cert_due_in(pem: &[u8], at: f64) -> Duration {
    let Some((from, to)) = validity(pem) else {
        return Duration::ZERO;
    };
    let due = from + ((to - from) as f64 * at) as i64;
    let now = chrono::Utc::now().timestamp();
    Duration::from_secs(due.saturating_sub(now).max(0) as u64)
}

fn validity(cert_pem: &[u8]) -> Option<(i64, i64)> {
    let (_, p) = x509_parser::pem::parse_x509_pem(cert_pem).ok()?;
    let c = p.parse_x509().ok()?;
    Some((
        c.validity().not_before.timestamp(),
        c.validity().not_after.timestamp(),
    ))
}

/// Renews the node's client certificate in `dir` through the CSR API
/// (with `client`, as the node itself) once `at` of its life has passed.
/// Returns the rewritten kubeconfig when it renewed.
pub async fn renew_if_due(
    client: kube::Client,
    server: &str,
    node: &str,
    dir: &Path,
    at: f64,
) -> Result<Option<PathBuf>> {
    if !due_in(dir, at).is_zero() {
        return Ok(None);
    }
    let ca = std::fs::read(dir.join("pki/ca.crt")).context("the cluster CA of the node")?;
    let (key_pem, cert_pem) = request_certificate(client, node).await?;
    Ok(Some(write_credentials(
        dir, server, &ca, &key_pem, &cert_pem,
    )?))
}

/// Renews the node's client certificate while the agent runs (before
/// [`RENEW_AT`] of its life) and swaps the agent's client to it, without
/// a restart: `connect` builds a client from the new kubeconfig.
pub async fn keep_renewed<F, Fut>(
    rotating: Rotating,
    server: String,
    node: String,
    dir: PathBuf,
    connect: F,
) where
    F: Fn(PathBuf) -> Fut,
    Fut: std::future::Future<Output = Result<kube::Client>>,
{
    loop {
        let wait = due_in(&dir, RENEW_AT).clamp(Duration::from_secs(10), Duration::from_secs(3600));
        tokio::time::sleep(wait).await;
        match renew_if_due(rotating.client(), &server, &node, &dir, RENEW_AT).await {
            Ok(Some(kc)) => match connect(kc).await {
                Ok(c) => {
                    rotating.swap(c);
                    eprintln!("skiff: renewed the node's client certificate");
                }
                Err(e) => tracing::warn!(error = %e, "using the renewed client certificate"),
            },
            Ok(None) => {}
            Err(e) => tracing::warn!(error = %e, "renewing the node's client certificate"),
        }
    }
}

/// A client whose transport (with its client certificate) can be
/// replaced while requests run: each request goes through the client
/// current when it starts; the agent's clones all follow a swap.
#[derive(Clone)]
pub struct Rotating(std::sync::Arc<std::sync::RwLock<kube::Client>>);

impl Rotating {
    pub fn new(client: kube::Client) -> Rotating {
        Rotating(std::sync::Arc::new(std::sync::RwLock::new(client)))
    }

    /// A client going through whichever transport is current.
    pub fn client(&self) -> kube::Client {
        kube::Client::new(self.clone(), "default")
    }

    pub fn swap(&self, client: kube::Client) {
        *self.0.write().expect("rotating client") = client;
    }
}

impl tower::Service<http::Request<kube::client::Body>> for Rotating {
    type Response = http::Response<kube::client::Body>;
    type Error = kube::Error;
    type Future = futures::future::BoxFuture<'static, Result<Self::Response, kube::Error>>;

    fn poll_ready(
        &mut self,
        _cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Self::Error>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<kube::client::Body>) -> Self::Future {
        let client = self.0.read().expect("rotating client").clone();
        Box::pin(async move { client.send(req).await })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn join_tokens_are_k10_hash_and_bootstrap_token() {
        let h = "0".repeat(64);
        let t = format!("K10{h}::abcdef.0123456789abcdef\n");
        assert_eq!(
            split_token(&t),
            Some((h.as_str(), "abcdef.0123456789abcdef"))
        );
        assert_eq!(split_token("abcdef.0123456789abcdef"), None);
        assert_eq!(split_token(&format!("K10{h}::abcdef.short")), None);
    }

    #[test]
    fn the_hash_is_the_servers() {
        let dir = tempfile::tempdir().unwrap();
        let pki = skiff_apiserver::tls::Pki::load_or_create(dir.path(), &[]).unwrap();
        assert_eq!(
            ca_hash(pki.ca.cert_pem.as_bytes()),
            skiff_apiserver::bootstrap_token::ca_hash(&pki.ca.cert_pem)
        );
    }
}
