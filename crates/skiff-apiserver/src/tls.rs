//! The cluster's PKI: a CA made at first start, a serving certificate for the
//! server's names, client certificates for users (the admin kubeconfig), and the
//! rustls configuration that accepts them.

use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{Context, Result};
use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose, SanType,
};
use rustls::server::danger::ClientCertVerifier;
use rustls::server::WebPkiClientVerifier;
use rustls_pki_types::{pem::PemObject, CertificateDer, PrivateKeyDer};

/// A PEM certificate and its PEM private key.
#[derive(Clone)]
pub struct CertPair {
    pub cert_pem: String,
    pub key_pem: String,
}

/// The files of a data dir's PKI (`DATA/pki/`).
pub struct Pki {
    pub dir: PathBuf,
    pub ca: CertPair,
    pub serving: CertPair,
    pub admin: CertPair,
    /// The API server's client certificate towards node agents.
    pub kubelet_client: CertPair,
}

fn validity(params: &mut CertificateParams, days: i64) {
    let now = time_now();
    params.not_before = now - std::time::Duration::from_secs(3600);
    params.not_after = now + std::time::Duration::from_secs((days * 86400) as u64);
}

fn time_now() -> time::OffsetDateTime {
    time::OffsetDateTime::now_utc()
}

fn write_private(path: &Path, contents: impl AsRef<[u8]>) -> Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let tmp = path.with_extension("tmp");
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .write(true)
        .truncate(true)
        .mode(0o600)
        .open(&tmp)
        .with_context(|| format!("writing {}", tmp.display()))?;
    f.write_all(contents.as_ref())?;
    f.sync_all()?;
    std::fs::rename(&tmp, path).with_context(|| format!("writing {}", path.display()))?;
    Ok(())
}

fn read_pair(dir: &Path, name: &str) -> Option<CertPair> {
    let cert_pem = std::fs::read_to_string(dir.join(format!("{name}.crt"))).ok()?;
    let key_pem = std::fs::read_to_string(dir.join(format!("{name}.key"))).ok()?;
    Some(CertPair { cert_pem, key_pem })
}

fn write_pair(dir: &Path, name: &str, pair: &CertPair) -> Result<()> {
    write_private(&dir.join(format!("{name}.key")), &pair.key_pem)?;
    write_private(&dir.join(format!("{name}.crt")), &pair.cert_pem)?;
    Ok(())
}

fn new_ca() -> Result<CertPair> {
    let key = KeyPair::generate()?;
    let mut params = CertificateParams::new(Vec::<String>::new())?;
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, "skiff-ca");
    params.distinguished_name = dn;
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    validity(&mut params, 3650);
    let cert = params.self_signed(&key)?;
    Ok(CertPair {
        cert_pem: cert.pem(),
        key_pem: key.serialize_pem(),
    })
}

/// Issues a certificate signed by `ca`: a client certificate (CN = user,
/// O = groups) or a serving certificate for `sans`.
pub fn issue(
    ca: &CertPair,
    common_name: &str,
    groups: &[&str],
    sans: &[String],
    client: bool,
    days: i64,
) -> Result<CertPair> {
    let eku = if client {
        ExtendedKeyUsagePurpose::ClientAuth
    } else {
        ExtendedKeyUsagePurpose::ServerAuth
    };
    issue_with(ca, common_name, groups, sans, vec![eku], days)
}

fn issue_with(
    ca: &CertPair,
    common_name: &str,
    groups: &[&str],
    sans: &[String],
    extended_key_usages: Vec<ExtendedKeyUsagePurpose>,
    days: i64,
) -> Result<CertPair> {
    let ca_key = KeyPair::from_pem(&ca.key_pem).context("parsing CA key")?;
    let issuer =
        Issuer::from_ca_cert_pem(&ca.cert_pem, ca_key).context("parsing CA certificate")?;
    let key = KeyPair::generate()?;
    let mut params = CertificateParams::new(Vec::<String>::new())?;
    for san in sans {
        params.subject_alt_names.push(match san.parse::<IpAddr>() {
            Ok(ip) => SanType::IpAddress(ip),
            Err(_) => SanType::DnsName(
                san.clone()
                    .try_into()
                    .with_context(|| format!("bad SAN {san:?}"))?,
            ),
        });
    }
    let mut dn = DistinguishedName::new();
    for g in groups {
        dn.push(DnType::OrganizationName, *g);
    }
    dn.push(DnType::CommonName, common_name);
    params.distinguished_name = dn;
    params.key_usages = vec![
        KeyUsagePurpose::DigitalSignature,
        KeyUsagePurpose::KeyEncipherment,
    ];
    params.extended_key_usages = extended_key_usages;
    params.use_authority_key_identifier_extension = true;
    validity(&mut params, days);
    let cert = params.signed_by(&key, &issuer)?;
    Ok(CertPair {
        cert_pem: cert.pem(),
        key_pem: key.serialize_pem(),
    })
}

/// Issues a certificate signed by `ca` for both server and client auth
/// (etcd members' peer and serving certificates), for `sans`.
pub fn issue_peer(
    ca: &CertPair,
    common_name: &str,
    sans: &[String],
    days: i64,
) -> Result<CertPair> {
    issue_with(
        ca,
        common_name,
        &[],
        sans,
        vec![
            ExtendedKeyUsagePurpose::ServerAuth,
            ExtendedKeyUsagePurpose::ClientAuth,
        ],
        days,
    )
}

impl Pki {
    /// Loads the PKI under `dir`, creating the CA and admin certificate at first
    /// start. The serving certificate is issued anew at every start, for
    /// localhost, 127.0.0.1, the host name and `extra_sans`.
    pub fn load_or_create(dir: &Path, extra_sans: &[String]) -> Result<Pki> {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        let ca = match read_pair(dir, "ca") {
            Some(ca) => ca,
            None => {
                let ca = new_ca()?;
                write_pair(dir, "ca", &ca)?;
                ca
            }
        };
        let admin = match read_pair(dir, "admin") {
            Some(a) => a,
            None => {
                let a = issue(&ca, "admin", &["system:masters"], &[], true, 3650)?;
                write_pair(dir, "admin", &a)?;
                a
            }
        };
        let kubelet_client = match read_pair(dir, "kubelet-client") {
            Some(k) => k,
            None => {
                let k = issue(
                    &ca,
                    "kube-apiserver-kubelet-client",
                    &["system:masters"],
                    &[],
                    true,
                    3650,
                )?;
                write_pair(dir, "kubelet-client", &k)?;
                k
            }
        };
        let mut sans: Vec<String> = vec!["localhost".into(), "127.0.0.1".into(), "::1".into()];
        sans.push("kubernetes".into());
        sans.push("kubernetes.default".into());
        sans.push("kubernetes.default.svc".into());
        sans.push("kubernetes.default.svc.cluster.local".into());
        if let Ok(h) = std::fs::read_to_string("/proc/sys/kernel/hostname") {
            let h = h.trim().to_string();
            if !h.is_empty() {
                sans.push(h);
            }
        }
        for s in extra_sans {
            if !sans.contains(s) {
                sans.push(s.clone());
            }
        }
        let serving = issue(&ca, "skiff-apiserver", &[], &sans, false, 365)?;
        write_pair(dir, "serving", &serving)?;
        Ok(Pki {
            dir: dir.to_path_buf(),
            ca,
            serving,
            admin,
            kubelet_client,
        })
    }

    /// A rustls server configuration: our serving certificate, client
    /// certificates from our CA verified when offered (a request without one is
    /// answered 401 by the authentication layer, not refused at the handshake).
    pub fn server_config(&self) -> Result<Arc<rustls::ServerConfig>> {
        Ok(self.server_tls_with(false)?.config)
    }

    /// The configuration `serve::serve_tls_checked` serves with: any client
    /// certificate passes the handshake (the client still proves it holds
    /// its key) and its chain is checked against our CA per connection, so
    /// a certificate from another CA is answered with a 401 Status, as
    /// kube-apiserver answers it, rather than a failed handshake.
    pub fn server_tls(&self) -> Result<ServerTls> {
        self.server_tls_with(true)
    }

    fn server_tls_with(&self, lenient: bool) -> Result<ServerTls> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut roots = rustls::RootCertStore::empty();
        for c in CertificateDer::pem_slice_iter(self.ca.cert_pem.as_bytes()) {
            roots.add(c.context("parsing CA")?)?;
        }
        let verifier =
            WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider.clone())
                .allow_unauthenticated()
                .build()
                .context("building client verifier")?;
        let certs: Vec<CertificateDer<'static>> =
            CertificateDer::pem_slice_iter(self.serving.cert_pem.as_bytes())
                .collect::<Result<_, _>>()?;
        let key = PrivateKeyDer::from_pem_slice(self.serving.key_pem.as_bytes())
            .context("parsing serving key")?;
        let handshake: Arc<dyn ClientCertVerifier> = if lenient {
            Arc::new(RequestClientCert(verifier.clone()))
        } else {
            verifier.clone()
        };
        let mut cfg = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()?
            .with_client_cert_verifier(handshake)
            .with_single_cert(certs, key)?;
        cfg.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        Ok(ServerTls {
            config: Arc::new(cfg),
            client_verifier: verifier,
        })
    }
}

/// A server's TLS configuration and the verifier of its clients'
/// certificates (see [`Pki::server_tls`]).
#[derive(Clone)]
pub struct ServerTls {
    pub config: Arc<rustls::ServerConfig>,
    pub client_verifier: Arc<dyn ClientCertVerifier>,
}

/// Asks for a client certificate and checks the client's proof of its key,
/// leaving the chain to the per-connection check (kube-apiserver's
/// `RequestClientCert` with verification in the x509 authenticator).
#[derive(Debug)]
struct RequestClientCert(Arc<dyn ClientCertVerifier>);

impl ClientCertVerifier for RequestClientCert {
    fn offer_client_auth(&self) -> bool {
        true
    }
    fn client_auth_mandatory(&self) -> bool {
        false
    }
    fn root_hint_subjects(&self) -> &[rustls::DistinguishedName] {
        self.0.root_hint_subjects()
    }
    fn verify_client_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _now: rustls_pki_types::UnixTime,
    ) -> std::result::Result<rustls::server::danger::ClientCertVerified, rustls::Error> {
        Ok(rustls::server::danger::ClientCertVerified::assertion())
    }
    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> std::result::Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls12_signature(message, cert, dss)
    }
    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> std::result::Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls13_signature(message, cert, dss)
    }
    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.0.supported_verify_schemes()
    }
}

/// The user a verified client certificate names: CN is the user, each O a group.
pub fn identity_from_cert(der: &[u8]) -> Option<(String, Vec<String>)> {
    let (_, cert) = x509_parser::parse_x509_certificate(der).ok()?;
    let subject = cert.subject();
    let cn = subject
        .iter_common_name()
        .next()?
        .as_str()
        .ok()?
        .to_string();
    let groups = subject
        .iter_organization()
        .filter_map(|o| o.as_str().ok().map(str::to_string))
        .collect();
    Some((cn, groups))
}

/// A kubeconfig for `user` (with embedded certificates) pointing at `server`.
pub fn kubeconfig(server: &str, ca_pem: &str, user: &str, client: &CertPair) -> String {
    use base64::Engine;
    let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s.as_bytes());
    format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: skiff\n  cluster:\n    server: {server}\n    certificate-authority-data: {ca}\ncontexts:\n- name: skiff\n  context:\n    cluster: skiff\n    user: {user}\ncurrent-context: skiff\nusers:\n- name: {user}\n  user:\n    client-certificate-data: {cert}\n    client-key-data: {key}\n",
        ca = b64(ca_pem),
        cert = b64(&client.cert_pem),
        key = b64(&client.key_pem),
    )
}

/// Writes a file readable only by its owner, atomically.
pub fn write_secret_file(path: &Path, contents: &str) -> Result<()> {
    if let Some(parent) = path.parent() {
        if !parent.as_os_str().is_empty() {
            std::fs::create_dir_all(parent)?;
        }
    }
    write_private(path, contents)
}

/// A kubeconfig for a new user of the cluster whose PKI is in `dir`: a
/// client certificate from the cluster CA with CN = `user` and one O per
/// group (what kube-apiserver's x509 authenticator reads), valid `days`.
pub fn user_kubeconfig(
    dir: &Path,
    server: &str,
    user: &str,
    groups: &[&str],
    days: i64,
) -> Result<String> {
    let ca = read_pair(dir, "ca").with_context(|| format!("no cluster CA in {}", dir.display()))?;
    let cert = issue(&ca, user, groups, &[], true, days)?;
    Ok(kubeconfig(server, &ca.cert_pem, user, &cert))
}

/// Writes binary secret material readable only by its owner, atomically.
pub fn write_secret_bytes(path: &Path, contents: &[u8]) -> Result<()> {
    write_private(path, contents)
}

/// Accepts any server certificate (its signatures still checked): for
/// peers the configuration says not to verify.
#[derive(Debug)]
pub(crate) struct AnyServer(pub(crate) Arc<rustls::crypto::CryptoProvider>);

impl rustls::client::danger::ServerCertVerifier for AnyServer {
    fn verify_server_cert(
        &self,
        _end_entity: &rustls_pki_types::CertificateDer<'_>,
        _intermediates: &[rustls_pki_types::CertificateDer<'_>],
        _server_name: &rustls_pki_types::ServerName<'_>,
        _ocsp_response: &[u8],
        _now: rustls_pki_types::UnixTime,
    ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        Ok(rustls::client::danger::ServerCertVerified::assertion())
    }
    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &rustls_pki_types::CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }
    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &rustls_pki_types::CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }
    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn admin_certificate_names_the_admin_in_system_masters() {
        let dir = tempfile::tempdir().unwrap();
        let pki = Pki::load_or_create(dir.path(), &["skiff.example".into()]).unwrap();
        let der = CertificateDer::from_pem_slice(pki.admin.cert_pem.as_bytes()).unwrap();
        let (user, groups) = identity_from_cert(&der).unwrap();
        assert_eq!(user, "admin");
        assert_eq!(groups, vec!["system:masters".to_string()]);
        pki.server_config().unwrap();
        // A second start keeps the CA.
        let again = Pki::load_or_create(dir.path(), &[]).unwrap();
        assert_eq!(again.ca.cert_pem, pki.ca.cert_pem);
    }
}
