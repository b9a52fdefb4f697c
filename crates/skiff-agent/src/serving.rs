//! The agent endpoint's serving certificate from the cluster CA: a
//! `kubernetes.io/kubelet-serving` CertificateSigningRequest for
//! `system:node:<name>` naming the node's address and name (the API
//! server approves it when those are the Node's own), kept under
//! `DATA/pki/kubelet-serving.{crt,key}`, swapped into the running
//! endpoint without a restart and renewed after 80% of its life. The API
//! server verifies it against the cluster CA when it proxies logs, exec
//! and metrics. Until it is issued the endpoint serves a self-signed one.

use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use anyhow::{Context, Result};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;

pub const SIGNER: &str = "kubernetes.io/kubelet-serving";
const USAGES: [&str; 3] = ["digital signature", "key encipherment", "server auth"];

/// The endpoint's current certificate, replaceable while it serves.
#[derive(Debug)]
pub struct ServingCert(RwLock<Arc<CertifiedKey>>);

fn certified(cert_pem: &str, key_pem: &str) -> Result<Arc<CertifiedKey>> {
    use rustls_pki_types::pem::PemObject;
    let certs: Vec<rustls_pki_types::CertificateDer<'static>> =
        rustls_pki_types::CertificateDer::pem_slice_iter(cert_pem.as_bytes())
            .collect::<Result<_, _>>()
            .map_err(|e| anyhow::anyhow!("serving certificate: {e:?}"))?;
    let key = rustls_pki_types::PrivateKeyDer::from_pem_slice(key_pem.as_bytes())
        .map_err(|e| anyhow::anyhow!("serving key: {e:?}"))?;
    let signing = rustls::crypto::ring::default_provider()
        .key_provider
        .load_private_key(key)
        .map_err(|e| anyhow::anyhow!("serving key: {e}"))?;
    Ok(Arc::new(CertifiedKey::new(certs, signing)))
}

impl ServingCert {
    pub fn new(cert_pem: &str, key_pem: &str) -> Result<ServingCert> {
        Ok(ServingCert(RwLock::new(certified(cert_pem, key_pem)?)))
    }

    /// Serves `cert_pem` from the next handshake on.
    pub fn set(&self, cert_pem: &str, key_pem: &str) -> Result<()> {
        *self.0.write().expect("serving certificate") = certified(cert_pem, key_pem)?;
        Ok(())
    }
}

impl ResolvesServerCert for ServingCert {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.0.read().expect("serving certificate").clone())
    }
}

/// The names the certificate is for: the node's address and its name.
pub fn names(node: &str, node_ip: &str) -> Vec<String> {
    vec![node_ip.to_string(), node.to_string()]
}

fn paths(dir: &Path) -> (PathBuf, PathBuf) {
    (
        dir.join("pki/kubelet-serving.crt"),
        dir.join("pki/kubelet-serving.key"),
    )
}

/// The IPs and DNS names of a PEM certificate.
fn sans(pem: &[u8]) -> Vec<String> {
    let Ok((_, p)) = x509_parser::pem::parse_x509_pem(pem) else {
        return Vec::new();
    };
    let Ok(cert) = p.parse_x509() else {
        return Vec::new();
    };
    let Ok(Some(ext)) = cert.subject_alternative_name() else {
        return Vec::new();
    };
    ext.value
        .general_names
        .iter()
        .filter_map(|n| match n {
            x509_parser::extensions::GeneralName::DNSName(d) => Some(d.to_string()),
            x509_parser::extensions::GeneralName::IPAddress(b) if b.len() == 4 => {
                Some(std::net::Ipv4Addr::from(<[u8; 4]>::try_from(*b).ok()?).to_string())
            }
            x509_parser::extensions::GeneralName::IPAddress(b) if b.len() == 16 => {
                Some(std::net::Ipv6Addr::from(<[u8; 16]>::try_from(*b).ok()?).to_string())
            }
            _ => None,
        })
        .collect()
}

/// The kept certificate, if it is for `names` and not yet due.
fn kept(dir: &Path, names: &[String]) -> Option<(String, String)> {
    let (crt, key) = paths(dir);
    let cert = std::fs::read_to_string(crt).ok()?;
    let key = std::fs::read_to_string(key).ok()?;
    let has = sans(cert.as_bytes());
    (names.iter().all(|n| has.contains(n))
        && !crate::join::cert_due_in(cert.as_bytes(), crate::join::RENEW_AT).is_zero())
    .then_some((cert, key))
}

/// The node's serving certificate: the kept one while it is good, else a
/// new one through the CSR API (waiting up to 30 s for it).
pub async fn obtain(
    client: kube::Client,
    node: &str,
    names: &[String],
    dir: &Path,
) -> Result<(String, String)> {
    if let Some(pair) = kept(dir, names) {
        return Ok(pair);
    }
    let (key, cert) = crate::join::request(
        client,
        node,
        SIGNER,
        &USAGES,
        names,
        "node-serving",
        Duration::from_secs(30),
    )
    .await?;
    let cert = String::from_utf8(cert).context("the issued certificate is not PEM")?;
    let (crt_path, key_path) = paths(dir);
    crate::join::write_private(&key_path, key.as_bytes())?;
    crate::join::write_private(&crt_path, cert.as_bytes())?;
    Ok((cert, key))
}

/// Obtains the serving certificate (the kept one, or one through the CSR
/// API) and swaps it in, then keeps it renewed ([`keep_renewed`]). Until
/// then the endpoint keeps its self-signed certificate, which the API
/// server cannot verify; a failed request is asked again, backing off from
/// 5 s to 5 minutes.
pub async fn obtain_and_renew(
    client: kube::Client,
    serving: Arc<ServingCert>,
    node: String,
    address: tokio::sync::watch::Receiver<String>,
    dir: PathBuf,
) {
    let mut backoff = Duration::from_secs(5);
    loop {
        let names = names(&node, &address.borrow());
        match obtain(client.clone(), &node, &names, &dir).await {
            Ok((cert, key)) => match serving.set(&cert, &key) {
                Ok(()) => {
                    tracing::info!("serving certificate issued by the cluster CA");
                    break;
                }
                Err(e) => tracing::warn!(error = %e, "using the issued serving certificate"),
            },
            Err(e) => eprintln!(
                "skiff: the agent endpoint keeps a self-signed certificate the API server cannot verify for now (asking again in {}s): {e:#}",
                backoff.as_secs()
            ),
        }
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(Duration::from_secs(300));
    }
    keep_renewed(client, serving, node, address, dir).await
}

/// Renews the serving certificate after 80% of its life, and for the
/// node's new address when it changes (`address`, as pod routing
/// re-detects it), and swaps it in.
pub async fn keep_renewed(
    client: kube::Client,
    serving: Arc<ServingCert>,
    node: String,
    mut address: tokio::sync::watch::Receiver<String>,
    dir: PathBuf,
) {
    let mut names = names(&node, &address.borrow_and_update());
    let mut follow = true;
    // After a failed attempt, try again soon.
    let mut failed = false;
    loop {
        let due = if failed {
            Duration::ZERO
        } else {
            std::fs::read(paths(&dir).0)
                .map(|pem| crate::join::cert_due_in(&pem, crate::join::RENEW_AT))
                .unwrap_or_default()
        };
        let wait =
            tokio::time::sleep(due.clamp(Duration::from_secs(10), Duration::from_secs(3600)));
        tokio::select! {
            _ = wait => {}
            changed = address.changed(), if follow => match changed {
                Ok(()) => {
                    let now = self::names(&node, &address.borrow_and_update());
                    if now == names {
                        continue;
                    }
                    names = now;
                }
                Err(_) => {
                    follow = false;
                    continue;
                }
            },
        }
        match obtain(client.clone(), &node, &names, &dir).await {
            Ok((cert, key)) => {
                failed = false;
                if let Err(e) = serving.set(&cert, &key) {
                    tracing::warn!(error = %e, "using the renewed serving certificate");
                }
            }
            Err(e) => {
                failed = true;
                tracing::warn!(error = %e, "renewing the serving certificate");
            }
        }
    }
}
