//! Shared credentials of several servers on one etcd (k3s' "bootstrap
//! data"): `skiff server --etcd-servers … --token SECRET`.
//!
//! The first server of a cluster creates what every server must hold the
//! same copy of — the cluster CA, the admin and kubelet-client
//! certificates, the ServiceAccount signing key(s), the default
//! encryption-at-rest key and the agents' join token — and stores them in
//! etcd in one value sealed with AES-256-GCM under a key derived from the
//! token (PBKDF2-HMAC-SHA256, random salt; the etcd key is the additional
//! data). The store's guarded create decides a race between two first
//! servers: the loser adopts the winner's set. Every other server opens
//! the value with its token and writes the files into its data dir before
//! loading its PKI, so any server's admin kubeconfig works against every
//! server and ServiceAccount tokens signed by one verify on another.
//!
//! Refusals change nothing (neither etcd nor the data dir): a token that
//! cannot open the value (wrong token, or the etcd holds another
//! cluster's data), a data dir whose CA is not the cluster's, an etcd
//! holding a cluster without bootstrap data whose CA is not ours, and
//! cluster-wide flags (`--service-cidr`, `--cluster-cidr`) that differ from
//! the cluster's.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine;
use ring::aead;
use serde_json::{json, Value};
use skiff_store::Store;

/// PBKDF2 rounds deriving the sealing key from the token.
const ITERATIONS: u32 = 100_000;

/// The certificate pairs every server shares (paths under the data dir).
const SHARED_PKI: [&str; 6] = [
    "pki/ca.crt",
    "pki/ca.key",
    "pki/admin.crt",
    "pki/admin.key",
    "pki/kubelet-client.crt",
    "pki/kubelet-client.key",
];
const SA_DIR: &str = "pki/service-account";
const ENCRYPTION: &str = "pki/encryption-config.yaml";
const JOIN_TOKEN: &str = "token";

/// The etcd key of a cluster's bootstrap data: beside its `--etcd-prefix`
/// (never under it, so the watch cache never sees it).
pub fn key_for(prefix: &str) -> String {
    format!("/skiff-bootstrap{}", prefix.trim_end_matches('/'))
}

/// What the servers share: files by path under the data dir, and the
/// cluster-wide settings every server must agree on.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Bundle {
    pub files: BTreeMap<String, Vec<u8>>,
    pub settings: BTreeMap<String, String>,
}

impl Bundle {
    fn to_json(&self) -> Vec<u8> {
        let files: serde_json::Map<String, Value> = self
            .files
            .iter()
            .map(|(k, v)| (k.clone(), Value::String(B64.encode(v))))
            .collect();
        json!({"files": files, "settings": self.settings})
            .to_string()
            .into_bytes()
    }

    fn from_json(bytes: &[u8]) -> Result<Bundle> {
        let v: Value = serde_json::from_slice(bytes).context("bootstrap data is not JSON")?;
        let mut b = Bundle::default();
        for (k, f) in v
            .get("files")
            .and_then(Value::as_object)
            .context("bootstrap data without files")?
        {
            let data = B64
                .decode(f.as_str().context("a file is not a string")?)
                .context("a file is not base64")?;
            if k.contains("..") || k.starts_with('/') {
                bail!("bootstrap data names a file outside the data dir: {k:?}");
            }
            b.files.insert(k.clone(), data);
        }
        if let Some(s) = v.get("settings").and_then(Value::as_object) {
            for (k, x) in s {
                b.settings
                    .insert(k.clone(), x.as_str().unwrap_or_default().to_string());
            }
        }
        Ok(b)
    }
}

fn sealing_key(token: &str, salt: &[u8], iterations: u32) -> Result<aead::LessSafeKey> {
    let mut key = [0u8; 32];
    ring::pbkdf2::derive(
        ring::pbkdf2::PBKDF2_HMAC_SHA256,
        std::num::NonZeroU32::new(iterations).context("zero iterations")?,
        salt,
        token.as_bytes(),
        &mut key,
    );
    let unbound = aead::UnboundKey::new(&aead::AES_256_GCM, &key)
        .map_err(|_| anyhow::anyhow!("making the sealing key"))?;
    Ok(aead::LessSafeKey::new(unbound))
}

fn random<const N: usize>() -> Result<[u8; N]> {
    use ring::rand::SecureRandom;
    let mut b = [0u8; N];
    ring::rand::SystemRandom::new()
        .fill(&mut b)
        .map_err(|_| anyhow::anyhow!("no randomness"))?;
    Ok(b)
}

/// `bundle` sealed with `token` for the etcd key `key` (the stored value).
pub fn seal(token: &str, key: &str, bundle: &Bundle) -> Result<Vec<u8>> {
    let salt = random::<16>()?;
    let nonce = random::<12>()?;
    let mut data = bundle.to_json();
    sealing_key(token, &salt, ITERATIONS)?
        .seal_in_place_append_tag(
            aead::Nonce::assume_unique_for_key(nonce),
            aead::Aad::from(key.as_bytes()),
            &mut data,
        )
        .map_err(|_| anyhow::anyhow!("sealing the bootstrap data"))?;
    Ok(json!({
        "kind": "SkiffBootstrapData",
        "version": 1,
        "cipher": "AES-256-GCM",
        "kdf": "PBKDF2-HMAC-SHA256",
        "iterations": ITERATIONS,
        "salt": B64.encode(salt),
        "nonce": B64.encode(nonce),
        "ciphertext": B64.encode(&data),
    })
    .to_string()
    .into_bytes())
}

/// Why a stored value could not be opened.
#[derive(Debug, PartialEq)]
pub enum OpenError {
    /// Not skiff's bootstrap data at all.
    Malformed(String),
    /// The token does not open it.
    WrongToken,
}

/// Opens a value [`seal`] made.
pub fn open(token: &str, key: &str, value: &[u8]) -> Result<Bundle, OpenError> {
    let bad = |m: &str| OpenError::Malformed(m.to_string());
    let v: Value = serde_json::from_slice(value).map_err(|_| bad("not JSON"))?;
    if v.get("kind").and_then(Value::as_str) != Some("SkiffBootstrapData") {
        return Err(bad("not skiff's bootstrap data"));
    }
    let field = |name: &str| -> Result<Vec<u8>, OpenError> {
        v.get(name)
            .and_then(Value::as_str)
            .and_then(|s| B64.decode(s).ok())
            .ok_or_else(|| bad(name))
    };
    let (salt, nonce, mut data) = (field("salt")?, field("nonce")?, field("ciphertext")?);
    let iterations = v
        .get("iterations")
        .and_then(Value::as_u64)
        .filter(|n| (1..=10_000_000).contains(n))
        .ok_or_else(|| bad("iterations"))? as u32;
    let nonce: [u8; 12] = nonce.try_into().map_err(|_| bad("nonce"))?;
    let key_ = sealing_key(token, &salt, iterations).map_err(|e| bad(&e.to_string()))?;
    let plain = key_
        .open_in_place(
            aead::Nonce::assume_unique_for_key(nonce),
            aead::Aad::from(key.as_bytes()),
            &mut data,
        )
        .map_err(|_| OpenError::WrongToken)?;
    Bundle::from_json(plain).map_err(|e| bad(&e.to_string()))
}

/// The shared files present in `data_dir`.
fn local_files(data_dir: &Path) -> BTreeMap<String, Vec<u8>> {
    let mut files = BTreeMap::new();
    for rel in SHARED_PKI.iter().chain([&ENCRYPTION, &JOIN_TOKEN]) {
        if let Ok(b) = std::fs::read(data_dir.join(rel)) {
            files.insert(rel.to_string(), b);
        }
    }
    for path in sa_keys(&data_dir.join(SA_DIR)) {
        if let (Some(name), Ok(b)) = (path.file_name(), std::fs::read(&path)) {
            files.insert(format!("{SA_DIR}/{}", name.to_string_lossy()), b);
        }
    }
    files
}

fn sa_keys(dir: &Path) -> Vec<PathBuf> {
    let mut keys: Vec<PathBuf> = std::fs::read_dir(dir)
        .map(|d| {
            d.filter_map(Result::ok)
                .map(|e| e.path())
                .filter(|p| p.extension().is_some_and(|x| x == "pk8"))
                .collect()
        })
        .unwrap_or_default();
    keys.sort();
    keys
}

fn join_token_chars(n: usize) -> Result<String> {
    const A: &[u8] = b"abcdefghijklmnopqrstuvwxyz0123456789";
    let bytes = random::<32>()?;
    Ok(bytes[..n]
        .iter()
        .map(|b| A[*b as usize % A.len()] as char)
        .collect())
}

/// The first server's set: what `data_dir` already holds (a server that
/// ran before it had a token keeps its CA), the rest made anew in a
/// staging directory that is removed afterwards.
fn complete(data_dir: &Path, settings: BTreeMap<String, String>) -> Result<Bundle> {
    let mut files = local_files(data_dir);
    let staging = data_dir.join(".bootstrap-staging");
    let _ = std::fs::remove_dir_all(&staging);
    let made = (|| -> Result<()> {
        if SHARED_PKI.iter().any(|p| !files.contains_key(*p)) {
            // Keep a CA we have; the PKI makes what is missing with it.
            std::fs::create_dir_all(staging.join("pki"))?;
            for p in SHARED_PKI {
                if let Some(b) = files.get(p) {
                    skiff_apiserver::tls::write_secret_bytes(&staging.join(p), b)?;
                }
            }
            skiff_apiserver::tls::Pki::load_or_create(&staging.join("pki"), &[])?;
            for p in SHARED_PKI {
                let b = std::fs::read(staging.join(p))
                    .with_context(|| format!("reading the new {p}"))?;
                files.entry(p.to_string()).or_insert(b);
            }
        }
        if !files.keys().any(|k| k.starts_with(SA_DIR)) {
            let rng = ring::rand::SystemRandom::new();
            let doc = ring::signature::EcdsaKeyPair::generate_pkcs8(
                &ring::signature::ECDSA_P256_SHA256_FIXED_SIGNING,
                &rng,
            )
            .map_err(|_| anyhow::anyhow!("generating a service account key"))?;
            files.insert(format!("{SA_DIR}/sa-0001.pk8"), doc.as_ref().to_vec());
        }
        files
            .entry(ENCRYPTION.to_string())
            .or_insert_with(|| skiff_apiserver::encryption::default_config_text().into_bytes());
        let ca = String::from_utf8_lossy(&files["pki/ca.crt"]).to_string();
        let hash =
            skiff_apiserver::bootstrap_token::ca_hash(&ca).context("the cluster CA is not PEM")?;
        let keep = files
            .get(JOIN_TOKEN)
            .map(|t| String::from_utf8_lossy(t).trim().to_string())
            .filter(|t| {
                skiff_apiserver::bootstrap_token::split_join_token(t)
                    .is_some_and(|(h, _)| h == hash)
            });
        let token = match keep {
            Some(t) => t,
            None => format!(
                "K10{hash}::{}.{}",
                join_token_chars(6)?,
                join_token_chars(16)?
            ),
        };
        files.insert(JOIN_TOKEN.to_string(), format!("{token}\n").into_bytes());
        Ok(())
    })();
    let _ = std::fs::remove_dir_all(&staging);
    made?;
    Ok(Bundle { files, settings })
}

/// Writes the shared files into `data_dir` (service-account keys exactly
/// the bundle's: a key only one server had would sign tokens the others
/// reject).
fn install(data_dir: &Path, bundle: &Bundle) -> Result<()> {
    for (rel, data) in &bundle.files {
        let path = data_dir.join(rel);
        if std::fs::read(&path).ok().as_deref() == Some(data.as_slice()) {
            continue;
        }
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent)
                .with_context(|| format!("creating {}", parent.display()))?;
        }
        skiff_apiserver::tls::write_secret_bytes(&path, data)?;
    }
    for path in sa_keys(&data_dir.join(SA_DIR)) {
        let rel = format!(
            "{SA_DIR}/{}",
            path.file_name().unwrap_or_default().to_string_lossy()
        );
        if !bundle.files.contains_key(&rel) {
            std::fs::remove_file(&path).with_context(|| format!("removing {}", path.display()))?;
        }
    }
    Ok(())
}

/// Checks a bundle read from etcd against this server before anything is
/// written: its settings and this data dir's CA.
fn check(data_dir: &Path, bundle: &Bundle, settings: &BTreeMap<String, String>) -> Result<()> {
    for (flag, ours) in settings {
        if let Some(theirs) = bundle.settings.get(flag) {
            if theirs != ours {
                bail!(
                    "--{flag} is {ours} but the cluster's is {theirs}: every server of a cluster \
                     needs the same --{flag}; nothing was changed"
                );
            }
        }
    }
    let ca = data_dir.join("pki/ca.crt");
    if let (Ok(local), Some(shared)) = (std::fs::read(&ca), bundle.files.get("pki/ca.crt")) {
        if &local != shared {
            bail!(
                "{} is not the cluster's CA: this data dir belongs to another cluster \
                 (use a new --data-dir to join this one); nothing was changed",
                ca.display()
            );
        }
    }
    Ok(())
}

/// The CA of the cluster whose objects are in the store, from its
/// `kube-public/cluster-info` ConfigMap (every skiff server writes it).
async fn stored_cluster_ca(store: &dyn Store) -> Result<Option<Vec<u8>>> {
    let Some(kv) = store
        .get("/registry/configmaps/kube-public/cluster-info")
        .await
        .context("reading the cluster's cluster-info from etcd")?
    else {
        return Ok(None);
    };
    let v: Value = match serde_json::from_slice(&kv.value) {
        Ok(v) => v,
        Err(_) => return Ok(None),
    };
    let kubeconfig = v
        .pointer("/data/kubeconfig")
        .and_then(Value::as_str)
        .unwrap_or_default();
    Ok(kubeconfig
        .lines()
        .find_map(|l| l.trim().strip_prefix("certificate-authority-data:"))
        .and_then(|b| B64.decode(b.trim()).ok()))
}

/// Opens bootstrap data stored under `key` with `token`, checks it
/// against this server and writes its files into `data_dir`.
pub fn adopt(
    data_dir: &Path,
    key: &str,
    token: &str,
    value: &[u8],
    settings: &BTreeMap<String, String>,
) -> Result<()> {
    let bundle = match open(token.trim(), key, value) {
        Ok(b) => b,
        Err(OpenError::WrongToken) => bail!(
            "the cluster's bootstrap data (key {key}) cannot be decrypted with this \
             --token: the token is wrong, or this etcd holds another cluster's data; \
             nothing was changed"
        ),
        Err(OpenError::Malformed(m)) => {
            bail!("etcd key {key} does not hold skiff's bootstrap data ({m}); nothing was changed")
        }
    };
    check(data_dir, &bundle, settings)?;
    install(data_dir, &bundle)
}

/// A new random cluster token (32 hex digits).
pub fn random_token() -> Result<String> {
    Ok(random::<16>()?.iter().map(|b| format!("{b:02x}")).collect())
}

/// What a joining server proves it knows the token with (a bearer
/// credential derived from it; the token itself never travels).
pub fn join_secret(token: &str) -> String {
    let key = ring::hmac::Key::new(ring::hmac::HMAC_SHA256, token.trim().as_bytes());
    let tag = ring::hmac::sign(&key, b"skiff server join");
    tag.as_ref().iter().map(|b| format!("{b:02x}")).collect()
}

/// Makes the shared credentials in `data_dir` the cluster's: creates and
/// stores them when `store` has none (first server), else adopts the
/// stored ones. Returns whether this server created them.
pub async fn sync(
    store: &dyn Store,
    key: &str,
    token: &str,
    data_dir: &Path,
    settings: BTreeMap<String, String>,
) -> Result<bool> {
    if token.trim().is_empty() {
        bail!("--token must not be empty");
    }
    let token = token.trim();
    let adopt = |value: &[u8]| adopt(data_dir, key, token, value, &settings);
    if let Some(kv) = store
        .get(key)
        .await
        .context("reading the cluster's bootstrap data from etcd")?
    {
        adopt(&kv.value)?;
        return Ok(false);
    }
    // No bootstrap data: the store must not hold another cluster.
    if let Some(ca) = stored_cluster_ca(store).await? {
        let local = std::fs::read(data_dir.join("pki/ca.crt")).ok();
        if local.as_deref() != Some(ca.as_slice()) {
            bail!(
                "etcd already holds a cluster (kube-public/cluster-info) whose CA is not this \
                 server's and no bootstrap data for --token: start this server with that \
                 cluster's data dir, or use an empty etcd or another --etcd-prefix; nothing was \
                 changed"
            );
        }
    }
    let bundle = complete(data_dir, settings.clone())?;
    let sealed = seal(token, key, &bundle)?;
    match store.create(key, sealed.into()).await {
        Ok(_) => {
            install(data_dir, &bundle)?;
            Ok(true)
        }
        Err(skiff_store::Error::AlreadyExists(_)) => {
            // Another first server won the race: its set is the cluster's.
            let kv = store
                .get(key)
                .await?
                .context("the bootstrap data vanished after a conflicting create")?;
            adopt(&kv.value)?;
            Ok(false)
        }
        Err(e) => Err(e).context("storing the cluster's bootstrap data in etcd"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings() -> BTreeMap<String, String> {
        [("service-cidr".to_string(), "10.43.0.0/16".to_string())].into()
    }

    #[test]
    fn sealed_data_opens_only_with_its_token_and_key() {
        let mut b = Bundle::default();
        b.files.insert("pki/ca.crt".into(), b"CA".to_vec());
        b.settings = settings();
        let key = key_for("/registry");
        assert_eq!(key, "/skiff-bootstrap/registry");
        let sealed = seal("s3cret", &key, &b).unwrap();
        assert!(!String::from_utf8_lossy(&sealed).contains("CA\""));
        assert_eq!(open("s3cret", &key, &sealed).unwrap(), b);
        assert_eq!(open("other", &key, &sealed), Err(OpenError::WrongToken));
        // Moved to another cluster's key, it does not open either.
        assert_eq!(
            open("s3cret", &key_for("/other"), &sealed),
            Err(OpenError::WrongToken)
        );
        assert!(matches!(
            open("s3cret", &key, b"{}"),
            Err(OpenError::Malformed(_))
        ));
    }

    #[tokio::test]
    async fn two_servers_share_one_set_and_a_wrong_token_changes_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let store: std::sync::Arc<dyn Store> =
            skiff_store::RedbStore::open(&dir.path().join("store.redb"), Default::default())
                .unwrap();
        let key = key_for("/registry");
        let (a, b, c) = (
            dir.path().join("a"),
            dir.path().join("b"),
            dir.path().join("c"),
        );
        assert!(sync(&*store, &key, "tok", &a, settings()).await.unwrap());
        assert!(!sync(&*store, &key, "tok", &b, settings()).await.unwrap());
        for rel in SHARED_PKI.iter().chain([&ENCRYPTION, &JOIN_TOKEN]) {
            assert_eq!(
                std::fs::read(a.join(rel)).unwrap(),
                std::fs::read(b.join(rel)).unwrap(),
                "{rel}"
            );
        }
        assert_eq!(sa_keys(&a.join(SA_DIR)).len(), 1);
        assert_eq!(
            std::fs::read(&sa_keys(&a.join(SA_DIR))[0]).unwrap(),
            std::fs::read(&sa_keys(&b.join(SA_DIR))[0]).unwrap()
        );
        // A second start changes nothing.
        let before = local_files(&a);
        sync(&*store, &key, "tok", &a, settings()).await.unwrap();
        assert_eq!(local_files(&a), before);

        let stored = store.get(&key).await.unwrap().unwrap();
        let err = sync(&*store, &key, "wrong", &c, settings())
            .await
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("cannot be decrypted with this --token"),
            "{err}"
        );
        assert!(!c.exists(), "a refused start wrote into its data dir");
        assert_eq!(store.get(&key).await.unwrap().unwrap(), stored);

        let other: BTreeMap<String, String> =
            [("service-cidr".to_string(), "10.99.0.0/16".to_string())].into();
        let err = sync(&*store, &key, "tok", &c, other)
            .await
            .unwrap_err()
            .to_string();
        assert!(err.contains("--service-cidr is 10.99.0.0/16"), "{err}");
        assert!(!c.exists());

        // A data dir of another cluster is refused.
        let d = dir.path().join("d");
        let other_store: std::sync::Arc<dyn Store> =
            skiff_store::RedbStore::open(&dir.path().join("other.redb"), Default::default())
                .unwrap();
        sync(&*other_store, &key, "tok", &d, settings())
            .await
            .unwrap();
        let before = local_files(&d);
        let err = sync(&*store, &key, "tok", &d, settings())
            .await
            .unwrap_err()
            .to_string();
        assert!(err.contains("is not the cluster's CA"), "{err}");
        assert_eq!(local_files(&d), before);
    }
}
