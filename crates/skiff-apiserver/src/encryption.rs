//! Encryption at rest: kube-apiserver's `EncryptionConfiguration`
//! (`apiserver.config.k8s.io/v1`, `--encryption-provider-config`) as a
//! [`Store`] that wraps the real one.
//!
//! Values of the listed resources are transformed on their way to and from
//! the store, so the watch cache, watches and the registry above see
//! plaintext and the store below (redb file, etcd) only ciphertext. As in
//! Kubernetes, the first provider of a resource's entry writes (with its
//! first key), every provider reads: an encrypted value starts with
//! `k8s:enc:<provider>:v1:<key name>:`, which picks the key; the `identity`
//! provider reads values without that prefix (written before encryption
//! was turned on). A value read with anything but the first provider's
//! first key is *stale*: an update writes it again even if the object did
//! not change ([`Store::stale`]), which is how
//! `kubectl get secrets -A -o json | kubectl replace -f -` re-encrypts
//! every Secret with a new key.
//!
//! Formats (Kubernetes' own, so data moves between the two):
//! `aesgcm` — 12-byte random nonce, AES-GCM sealed with the storage key as
//! additional data; `secretbox` — 24-byte random nonce, NaCl secretbox
//! (XSalsa20-Poly1305, tag first); `aescbc` — 16-byte random IV, AES-CBC
//! with PKCS#7 padding. KMS providers are refused with a clear message.
//!
//! A value that cannot be decrypted (its key is not configured, or the key
//! is wrong) makes a read of that object fail with an error naming the
//! object and the key (500 upstream); lists and watches leave such an
//! object out and log it, so one unreadable Secret does not stop the
//! watch cache of every other resource.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use aes_gcm::aead::{Aead, KeyInit, Payload};
use async_trait::async_trait;
use base64::Engine as _;
use bytes::Bytes;
use futures::StreamExt;
use serde::Deserialize;
use skiff_core::resources::RESOURCES;
use skiff_store::{Error, Event, KeyValue, ListOptions, ListResult, Result, Store, WatchStream};

/// The `apiVersion` and `kind` of the configuration file.
pub const API_VERSION: &str = "apiserver.config.k8s.io/v1";
pub const KIND: &str = "EncryptionConfiguration";
/// Every encrypted value starts with this.
const ENC_PREFIX: &[u8] = b"k8s:enc:";

// ---- the file ---------------------------------------------------------------

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct FileConfig {
    #[serde(default)]
    api_version: String,
    #[serde(default)]
    kind: String,
    #[serde(default)]
    resources: Vec<FileEntry>,
}

#[derive(Deserialize)]
struct FileEntry {
    #[serde(default)]
    resources: Vec<String>,
    #[serde(default)]
    providers: Vec<HashMap<String, serde_yaml_ng::Value>>,
}

#[derive(Deserialize)]
struct FileKeys {
    #[serde(default)]
    keys: Vec<FileKey>,
}

#[derive(Deserialize)]
struct FileKey {
    #[serde(default)]
    name: String,
    #[serde(default)]
    secret: String,
}

// ---- ciphers ----------------------------------------------------------------

type Aes192Gcm = aes_gcm::AesGcm<aes::Aes192, aes_gcm::aead::consts::U12>;

enum Cipher {
    Gcm128(Box<aes_gcm::Aes128Gcm>),
    Gcm192(Box<Aes192Gcm>),
    Gcm256(Box<aes_gcm::Aes256Gcm>),
    Cbc(Vec<u8>),
    SecretBox(Box<crypto_secretbox::XSalsa20Poly1305>),
}

fn random<const N: usize>() -> [u8; N] {
    use ring::rand::SecureRandom;
    let mut b = [0u8; N];
    ring::rand::SystemRandom::new()
        .fill(&mut b)
        .expect("the system's random number generator works");
    b
}

fn cbc_encrypt(key: &[u8], data: &[u8]) -> Vec<u8> {
    use aes::cipher::{BlockEncryptMut, KeyIvInit};
    use cbc::cipher::block_padding::Pkcs7;
    let iv: [u8; 16] = random();
    let sealed = match key.len() {
        16 => cbc::Encryptor::<aes::Aes128>::new(key.into(), &iv.into())
            .encrypt_padded_vec_mut::<Pkcs7>(data),
        24 => cbc::Encryptor::<aes::Aes192>::new(key.into(), &iv.into())
            .encrypt_padded_vec_mut::<Pkcs7>(data),
        _ => cbc::Encryptor::<aes::Aes256>::new(key.into(), &iv.into())
            .encrypt_padded_vec_mut::<Pkcs7>(data),
    };
    [&iv[..], &sealed].concat()
}

fn cbc_decrypt(key: &[u8], data: &[u8]) -> Option<Vec<u8>> {
    use aes::cipher::{BlockDecryptMut, KeyIvInit};
    use cbc::cipher::block_padding::Pkcs7;
    if data.len() < 32 || data.len() & 15 != 0 {
        return None;
    }
    let (iv, body) = data.split_at(16);
    match key.len() {
        16 => cbc::Decryptor::<aes::Aes128>::new(key.into(), iv.into())
            .decrypt_padded_vec_mut::<Pkcs7>(body)
            .ok(),
        24 => cbc::Decryptor::<aes::Aes192>::new(key.into(), iv.into())
            .decrypt_padded_vec_mut::<Pkcs7>(body)
            .ok(),
        _ => cbc::Decryptor::<aes::Aes256>::new(key.into(), iv.into())
            .decrypt_padded_vec_mut::<Pkcs7>(body)
            .ok(),
    }
}

impl Cipher {
    fn new(provider: &str, secret: &[u8]) -> std::result::Result<Cipher, String> {
        Ok(match (provider, secret.len()) {
            ("aesgcm", 16) => Cipher::Gcm128(Box::new(aes_gcm::Aes128Gcm::new(secret.into()))),
            ("aesgcm", 24) => Cipher::Gcm192(Box::new(Aes192Gcm::new(secret.into()))),
            ("aesgcm", 32) => Cipher::Gcm256(Box::new(aes_gcm::Aes256Gcm::new(secret.into()))),
            ("aescbc", 16 | 24 | 32) => Cipher::Cbc(secret.to_vec()),
            ("secretbox", 32) => Cipher::SecretBox(Box::new(
                crypto_secretbox::XSalsa20Poly1305::new(secret.into()),
            )),
            ("secretbox", n) => return Err(format!("secretbox keys are 32 bytes, not {n}")),
            (_, n) => return Err(format!("{provider} keys are 16, 24 or 32 bytes, not {n}")),
        })
    }

    fn encrypt(&self, data: &[u8], aad: &[u8]) -> Vec<u8> {
        fn gcm<C: Aead + aes_gcm::aead::AeadCore<NonceSize = aes_gcm::aead::consts::U12>>(
            c: &C,
            data: &[u8],
            aad: &[u8],
        ) -> Vec<u8> {
            let nonce: [u8; 12] = random();
            let sealed = c
                .encrypt((&nonce).into(), Payload { msg: data, aad })
                .expect("AES-GCM seals any message under 64 GiB");
            [&nonce[..], &sealed].concat()
        }
        match self {
            Cipher::Gcm128(c) => gcm(&**c, data, aad),
            Cipher::Gcm192(c) => gcm(&**c, data, aad),
            Cipher::Gcm256(c) => gcm(&**c, data, aad),
            Cipher::Cbc(k) => cbc_encrypt(k, data),
            Cipher::SecretBox(c) => {
                let nonce: [u8; 24] = random();
                let sealed = c
                    .encrypt((&nonce).into(), data)
                    .expect("secretbox seals any message");
                [&nonce[..], &sealed].concat()
            }
        }
    }

    fn decrypt(&self, data: &[u8], aad: &[u8]) -> Option<Vec<u8>> {
        fn gcm<C: Aead + aes_gcm::aead::AeadCore<NonceSize = aes_gcm::aead::consts::U12>>(
            c: &C,
            data: &[u8],
            aad: &[u8],
        ) -> Option<Vec<u8>> {
            if data.len() < 12 {
                return None;
            }
            let (nonce, sealed) = data.split_at(12);
            c.decrypt(nonce.into(), Payload { msg: sealed, aad }).ok()
        }
        match self {
            Cipher::Gcm128(c) => gcm(&**c, data, aad),
            Cipher::Gcm192(c) => gcm(&**c, data, aad),
            Cipher::Gcm256(c) => gcm(&**c, data, aad),
            Cipher::Cbc(k) => cbc_decrypt(k, data),
            Cipher::SecretBox(c) => {
                if data.len() < 24 {
                    return None;
                }
                let (nonce, sealed) = data.split_at(24);
                c.decrypt(nonce.into(), sealed).ok()
            }
        }
    }
}

struct Key {
    name: String,
    /// `k8s:enc:<provider>:v1:<name>:`
    prefix: Vec<u8>,
    cipher: Cipher,
}

enum Provider {
    Identity,
    Keyed { kind: &'static str, keys: Vec<Key> },
}

/// The providers of one resource entry: the first writes, all read.
pub struct Transformer {
    providers: Vec<Provider>,
}

/// Why a stored value could not be read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DecryptError(pub String);

impl Transformer {
    /// The value to store for `data` under `key`.
    pub fn encrypt(&self, key: &str, data: &[u8]) -> Vec<u8> {
        match &self.providers[0] {
            Provider::Identity => data.to_vec(),
            Provider::Keyed { keys, .. } => {
                let k = &keys[0];
                let sealed = k.cipher.encrypt(data, key.as_bytes());
                [&k.prefix[..], &sealed].concat()
            }
        }
    }

    /// The plaintext of a value stored under `key`, and whether it is stale
    /// (not written by the first provider's first key).
    pub fn decrypt(
        &self,
        key: &str,
        data: &[u8],
    ) -> std::result::Result<(Vec<u8>, bool), DecryptError> {
        let encrypted = data.starts_with(ENC_PREFIX);
        for (i, p) in self.providers.iter().enumerate() {
            match p {
                // Identity reads only what is not encrypted; encrypted data
                // goes on to the providers after it (Kubernetes: migrating
                // away from encryption puts identity first).
                Provider::Identity if !encrypted => return Ok((data.to_vec(), i != 0)),
                Provider::Identity => {}
                Provider::Keyed { kind, keys } => {
                    for (j, k) in keys.iter().enumerate() {
                        if let Some(sealed) = data.strip_prefix(&k.prefix[..]) {
                            return match k.cipher.decrypt(sealed, key.as_bytes()) {
                                Some(plain) => Ok((plain, i != 0 || j != 0)),
                                None => Err(DecryptError(format!(
                                    "{kind} key {:?} in the encryption configuration does not decrypt it (the key's secret is not the one it was written with)",
                                    k.name
                                ))),
                            };
                        }
                    }
                }
            }
        }
        if encrypted {
            // `k8s:enc:<provider>:v1:<name>:…`
            let head = &data[ENC_PREFIX.len()..data.len().min(ENC_PREFIX.len() + 300)];
            let mut parts = head.splitn(4, |b| *b == b':');
            let provider = String::from_utf8_lossy(parts.next().unwrap_or_default());
            let _version = parts.next();
            let name = String::from_utf8_lossy(parts.next().unwrap_or_default());
            Err(DecryptError(format!(
                "it was encrypted by the {provider} key {name:?}, which is not in the encryption configuration"
            )))
        } else {
            Err(DecryptError(
                "it is not encrypted and the encryption configuration has no identity provider to read it".into(),
            ))
        }
    }

    /// Whether values are written encrypted.
    pub fn encrypts(&self) -> bool {
        !matches!(self.providers[0], Provider::Identity)
    }
}

/// A parsed configuration: each served storage's transformer.
pub struct EncryptionConfig {
    by_storage: HashMap<&'static str, Arc<Transformer>>,
    /// Where it was read from (for messages).
    pub source: PathBuf,
}

impl std::fmt::Debug for EncryptionConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut storages: Vec<_> = self.by_storage.keys().collect();
        storages.sort();
        f.debug_struct("EncryptionConfig")
            .field("source", &self.source)
            .field("resources", &storages)
            .finish()
    }
}

/// Whether a configuration resource name (`secrets`, `deployments.apps`,
/// `*.apps`, `*.` for every core resource, `*.*`) covers a storage
/// (`<group>/<plural>`).
fn covers(pattern: &str, storage: &str) -> bool {
    let (group, plural) = storage.split_once('/').unwrap_or(("", storage));
    let (p_res, p_group) = pattern.split_once('.').unwrap_or((pattern, ""));
    match (p_res, pattern) {
        (_, "*.*") => true,
        ("*", _) => p_group == group,
        _ => p_res == plural && p_group == group,
    }
}

impl EncryptionConfig {
    /// Parses and checks a configuration; every problem is an error that
    /// names the entry, provider or key.
    pub fn parse(text: &str, source: &Path) -> anyhow::Result<EncryptionConfig> {
        let file: FileConfig = serde_yaml_ng::from_str(text).map_err(|e| anyhow::anyhow!("{e}"))?;
        anyhow::ensure!(file.kind == KIND, "kind is {:?}, not {KIND:?}", file.kind);
        anyhow::ensure!(
            file.api_version == API_VERSION,
            "apiVersion is {:?}, not {API_VERSION:?}",
            file.api_version
        );
        anyhow::ensure!(!file.resources.is_empty(), "resources: no entries");
        let mut rules: Vec<(Vec<String>, Arc<Transformer>)> = Vec::new();
        for (i, entry) in file.resources.iter().enumerate() {
            let at = format!("resources[{i}]");
            anyhow::ensure!(!entry.resources.is_empty(), "{at}.resources: none listed");
            for r in &entry.resources {
                anyhow::ensure!(
                    !r.is_empty() && *r == r.to_lowercase() && !r.contains('/'),
                    "{at}.resources: {r:?} is not a lower-case resource (`secrets`, `deployments.apps`, `*.apps`, `*.*`)"
                );
            }
            anyhow::ensure!(!entry.providers.is_empty(), "{at}.providers: none listed");
            let mut providers = Vec::new();
            for (j, p) in entry.providers.iter().enumerate() {
                let at = format!("{at}.providers[{j}]");
                anyhow::ensure!(
                    p.len() == 1,
                    "{at}: exactly one of aesgcm, aescbc, secretbox, identity, kms, not {}",
                    if p.is_empty() {
                        "none".to_string()
                    } else {
                        let mut k: Vec<_> = p.keys().cloned().collect();
                        k.sort();
                        k.join(", ")
                    }
                );
                let (kind, value) = p.iter().next().expect("one entry");
                let kind: &'static str = match kind.as_str() {
                    "identity" => {
                        providers.push(Provider::Identity);
                        continue;
                    }
                    "aesgcm" => "aesgcm",
                    "aescbc" => "aescbc",
                    "secretbox" => "secretbox",
                    "kms" => anyhow::bail!("{at}: the kms provider is not supported by skiff (use aesgcm or secretbox)"),
                    other => anyhow::bail!("{at}: unknown provider {other:?} (aesgcm, aescbc, secretbox, identity)"),
                };
                let keys: FileKeys = serde_yaml_ng::from_value(value.clone())
                    .map_err(|e| anyhow::anyhow!("{at}.{kind}: {e}"))?;
                anyhow::ensure!(!keys.keys.is_empty(), "{at}.{kind}.keys: none listed");
                let mut compiled: Vec<Key> = Vec::new();
                for (n, k) in keys.keys.iter().enumerate() {
                    let at = format!("{at}.{kind}.keys[{n}]");
                    anyhow::ensure!(!k.name.is_empty(), "{at}.name: empty");
                    anyhow::ensure!(
                        !k.name.contains(':'),
                        "{at}.name: {:?} may not contain ':'",
                        k.name
                    );
                    anyhow::ensure!(
                        compiled.iter().all(|c| c.name != k.name),
                        "{at}.name: {:?} is listed twice",
                        k.name
                    );
                    let secret = base64::engine::general_purpose::STANDARD
                        .decode(k.secret.trim())
                        .map_err(|e| {
                            anyhow::anyhow!("{at}.secret (key {:?}): not base64: {e}", k.name)
                        })?;
                    let cipher = Cipher::new(kind, &secret)
                        .map_err(|e| anyhow::anyhow!("{at}.secret (key {:?}): {e}", k.name))?;
                    compiled.push(Key {
                        prefix: format!("k8s:enc:{kind}:v1:{}:", k.name).into_bytes(),
                        name: k.name.clone(),
                        cipher,
                    });
                }
                providers.push(Provider::Keyed {
                    kind,
                    keys: compiled,
                });
            }
            rules.push((entry.resources.clone(), Arc::new(Transformer { providers })));
        }
        let mut by_storage = HashMap::new();
        for r in RESOURCES {
            if by_storage.contains_key(r.storage) {
                continue;
            }
            // The first entry naming a resource decides (as Kubernetes).
            if let Some((_, t)) = rules
                .iter()
                .find(|(names, _)| names.iter().any(|n| covers(n, r.storage)))
            {
                by_storage.insert(r.storage, t.clone());
            }
        }
        Ok(EncryptionConfig {
            by_storage,
            source: source.to_path_buf(),
        })
    }

    /// Reads and parses `--encryption-provider-config`.
    pub fn load(path: &Path) -> anyhow::Result<EncryptionConfig> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| anyhow::anyhow!("reading {}: {e}", path.display()))?;
        EncryptionConfig::parse(&text, path)
            .map_err(|e| anyhow::anyhow!("encryption provider config {}: {e}", path.display()))
    }

    /// The default configuration, `dir/encryption-config.yaml`, created at
    /// first start (mode 0600) with a random secretbox key `key1` for
    /// Secrets and the identity provider to read Secrets written before.
    pub fn load_or_create_default(dir: &Path) -> anyhow::Result<EncryptionConfig> {
        let path = dir.join(DEFAULT_FILE);
        if !path.exists() {
            crate::tls::write_secret_file(&path, &default_config_text())?;
        }
        EncryptionConfig::load(&path)
    }

    /// The transformer of the object stored under `key`, if its resource is
    /// listed.
    pub fn transformer_for(&self, key: &str) -> Option<&Arc<Transformer>> {
        if self.by_storage.is_empty() {
            return None;
        }
        let storage = crate::object::storage_of_key(key)?;
        self.by_storage.get(storage.as_str())
    }
}

/// The file name of the default configuration in the PKI directory.
pub const DEFAULT_FILE: &str = "encryption-config.yaml";

/// A configuration text with a new random secretbox key.
pub fn default_config_text() -> String {
    let secret = base64::engine::general_purpose::STANDARD.encode(random::<32>());
    format!(
        "# Written by skiff at first start. Secrets are encrypted with the first key;\n\
         # to rotate, put a new key first, restart, re-write every Secret\n\
         # (kubectl get secrets -A -o json | kubectl replace -f -), then remove the old key.\n\
         apiVersion: {API_VERSION}\n\
         kind: {KIND}\n\
         resources:\n\
         - resources:\n\
         \x20 - secrets\n\
         \x20 providers:\n\
         \x20 - secretbox:\n\
         \x20     keys:\n\
         \x20     - name: key1\n\
         \x20       secret: {secret}\n\
         \x20 - identity: {{}}\n"
    )
}

// ---- the store --------------------------------------------------------------

/// A store whose values of the configured resources are encrypted in the
/// store below it.
pub struct EncryptedStore {
    inner: Arc<dyn Store>,
    config: Arc<EncryptionConfig>,
    /// Keys last read stale, by the mod revision read: an update of one
    /// writes even when the object did not change.
    stale: Mutex<HashMap<String, i64>>,
    /// Objects left out of lists and watches because they could not be
    /// decrypted.
    pub unreadable: AtomicU64,
}

/// Wraps `store` in `config` (nothing to wrap when no resource is listed).
pub fn wrap(store: Arc<dyn Store>, config: EncryptionConfig) -> Arc<dyn Store> {
    if config.by_storage.is_empty() {
        return store;
    }
    Arc::new(EncryptedStore {
        inner: store,
        config: Arc::new(config),
        stale: Mutex::new(HashMap::new()),
        unreadable: AtomicU64::new(0),
    })
}

fn read_error(key: &str, e: &DecryptError) -> Error {
    Error::Backend(format!("cannot decrypt {key}: {}", e.0))
}

impl EncryptedStore {
    fn seal(&self, key: &str, value: Bytes) -> Bytes {
        match self.config.transformer_for(key) {
            Some(t) if t.encrypts() => Bytes::from(t.encrypt(key, &value)),
            _ => value,
        }
    }

    /// The plaintext of `kv` and whether it is stale.
    fn open(&self, mut kv: KeyValue) -> std::result::Result<(KeyValue, bool), Error> {
        let Some(t) = self.config.transformer_for(&kv.key) else {
            return Ok((kv, false));
        };
        match t.decrypt(&kv.key, &kv.value) {
            Ok((plain, stale)) => {
                kv.value = Bytes::from(plain);
                Ok((kv, stale))
            }
            Err(e) => Err(read_error(&kv.key, &e)),
        }
    }

    /// `open` for lists and watches: an unreadable object is left out.
    fn open_or_skip(&self, kv: KeyValue) -> Option<KeyValue> {
        match self.open(kv) {
            Ok((kv, _)) => Some(kv),
            Err(e) => {
                self.unreadable.fetch_add(1, Ordering::Relaxed);
                tracing::error!(error = %e, "left out of a list or watch");
                None
            }
        }
    }

    fn written(&self, key: &str) {
        self.stale
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(key);
    }

    fn map_err(&self, e: Error) -> Error {
        match e {
            Error::Conflict {
                key,
                expected,
                current,
            } => Error::Conflict {
                key,
                expected,
                current: current.and_then(|kv| self.open(kv).ok().map(|(kv, _)| kv)),
            },
            e => e,
        }
    }
}

#[async_trait]
impl Store for EncryptedStore {
    async fn get(&self, key: &str) -> Result<Option<KeyValue>> {
        let Some(kv) = self.inner.get(key).await? else {
            return Ok(None);
        };
        let (kv, stale) = self.open(kv)?;
        let mut set = self.stale.lock().unwrap_or_else(|e| e.into_inner());
        if stale {
            set.insert(kv.key.clone(), kv.mod_revision);
        } else if !set.is_empty() {
            set.remove(key);
        }
        Ok(Some(kv))
    }

    async fn list(&self, prefix: &str, opts: ListOptions) -> Result<ListResult> {
        let mut r = self.inner.list(prefix, opts).await?;
        let items = std::mem::take(&mut r.items);
        r.items = items
            .into_iter()
            .filter_map(|kv| self.open_or_skip(kv))
            .collect();
        Ok(r)
    }

    async fn count(&self, prefix: &str) -> Result<i64> {
        self.inner.count(prefix).await
    }

    async fn create(&self, key: &str, value: Bytes) -> Result<KeyValue> {
        let mut kv = self
            .inner
            .create(key, self.seal(key, value.clone()))
            .await
            .map_err(|e| self.map_err(e))?;
        kv.value = value;
        Ok(kv)
    }

    async fn update(&self, key: &str, value: Bytes, expected_revision: i64) -> Result<KeyValue> {
        let mut kv = self
            .inner
            .update(key, self.seal(key, value.clone()), expected_revision)
            .await
            .map_err(|e| self.map_err(e))?;
        self.written(key);
        kv.value = value;
        Ok(kv)
    }

    async fn commit(&self, writes: Vec<skiff_store::Write>) -> Result<Vec<KeyValue>> {
        use skiff_store::Write;
        let plain: Vec<Bytes> = writes
            .iter()
            .map(|w| match w {
                Write::Create { value, .. } | Write::Update { value, .. } => value.clone(),
            })
            .collect();
        let sealed = writes
            .into_iter()
            .map(|w| match w {
                Write::Create { key, value } => Write::Create {
                    value: self.seal(&key, value),
                    key,
                },
                Write::Update {
                    key,
                    value,
                    expected_revision,
                } => Write::Update {
                    value: self.seal(&key, value),
                    key,
                    expected_revision,
                },
            })
            .collect();
        let mut items = self
            .inner
            .commit(sealed)
            .await
            .map_err(|e| self.map_err(e))?;
        for (kv, value) in items.iter_mut().zip(plain) {
            self.written(&kv.key);
            kv.value = value;
        }
        Ok(items)
    }

    async fn delete(&self, key: &str, expected_revision: Option<i64>) -> Result<(KeyValue, i64)> {
        let (prev, rev) = self
            .inner
            .delete(key, expected_revision)
            .await
            .map_err(|e| self.map_err(e))?;
        self.written(key);
        let prev = match self.open(prev.clone()) {
            Ok((kv, _)) => kv,
            // Deleted all the same; what it held cannot be shown.
            Err(_) => KeyValue {
                value: Bytes::new(),
                ..prev
            },
        };
        Ok((prev, rev))
    }

    async fn watch(
        &self,
        prefix: &str,
        after_revision: i64,
        progress_interval: Option<std::time::Duration>,
    ) -> Result<WatchStream> {
        let stream = self
            .inner
            .watch(prefix, after_revision, progress_interval)
            .await?;
        let me = EncryptedView {
            config: self.config.clone(),
        };
        Ok(stream
            .filter_map(move |item| {
                let out = match item {
                    Ok(Event::Put { kv, prev }) => me.open(kv).map(|kv| {
                        Ok(Event::Put {
                            kv,
                            prev: prev.and_then(|p| me.open(p)),
                        })
                    }),
                    Ok(Event::Delete { prev, revision }) => me
                        .open(prev)
                        .map(|prev| Ok(Event::Delete { prev, revision })),
                    other => Some(other),
                };
                futures::future::ready(out)
            })
            .boxed())
    }

    async fn current_revision(&self) -> Result<i64> {
        self.inner.current_revision().await
    }

    async fn request_progress(&self) -> Result<i64> {
        self.inner.request_progress().await
    }

    async fn compact(&self, revision: i64) -> Result<()> {
        self.inner.compact(revision).await
    }

    async fn compacted_revision(&self) -> Result<i64> {
        self.inner.compacted_revision().await
    }

    fn stale(&self, kv: &KeyValue) -> bool {
        let set = self.stale.lock().unwrap_or_else(|e| e.into_inner());
        set.get(&kv.key) == Some(&kv.mod_revision)
    }
}

/// What a watch stream needs to decrypt (the stream outlives the borrow).
struct EncryptedView {
    config: Arc<EncryptionConfig>,
}

impl EncryptedView {
    fn open(&self, mut kv: KeyValue) -> Option<KeyValue> {
        let Some(t) = self.config.transformer_for(&kv.key) else {
            return Some(kv);
        };
        match t.decrypt(&kv.key, &kv.value) {
            Ok((plain, _)) => {
                kv.value = Bytes::from(plain);
                Some(kv)
            }
            Err(e) => {
                tracing::error!(error = %read_error(&kv.key, &e), "left out of a watch");
                None
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn b64(n: usize, fill: u8) -> String {
        base64::engine::general_purpose::STANDARD.encode(vec![fill; n])
    }

    fn config(providers: &str) -> EncryptionConfig {
        let text = format!(
            "apiVersion: apiserver.config.k8s.io/v1\nkind: EncryptionConfiguration\nresources:\n- resources: [secrets]\n  providers:\n{providers}"
        );
        EncryptionConfig::parse(&text, Path::new("test.yaml")).unwrap()
    }

    const KEY: &str = "/registry/secrets/default/s";

    #[test]
    fn every_provider_round_trips_with_kubernetes_prefix() {
        for (kind, len) in [
            ("aesgcm", 16),
            ("aesgcm", 24),
            ("aesgcm", 32),
            ("aescbc", 32),
            ("secretbox", 32),
        ] {
            let c = config(&format!(
                "  - {kind}:\n      keys:\n      - name: k1\n        secret: {}\n",
                b64(len, 7)
            ));
            let t = c.transformer_for(KEY).unwrap();
            let sealed = t.encrypt(KEY, b"{\"data\":\"hunter2\"}");
            let prefix = format!("k8s:enc:{kind}:v1:k1:");
            assert!(sealed.starts_with(prefix.as_bytes()), "{kind}");
            assert!(!sealed.windows(7).any(|w| w == b"hunter2"), "{kind}");
            assert_eq!(
                t.decrypt(KEY, &sealed).unwrap(),
                (b"{\"data\":\"hunter2\"}".to_vec(), false)
            );
            // Two writes of one value differ (random nonce / IV).
            assert_ne!(sealed, t.encrypt(KEY, b"{\"data\":\"hunter2\"}"));
        }
    }

    #[test]
    fn aesgcm_binds_the_value_to_its_key() {
        let c = config(&format!(
            "  - aesgcm:\n      keys:\n      - name: k1\n        secret: {}\n",
            b64(32, 1)
        ));
        let t = c.transformer_for(KEY).unwrap();
        let sealed = t.encrypt(KEY, b"x");
        let e = t
            .decrypt("/registry/secrets/default/other", &sealed)
            .unwrap_err();
        assert!(e.0.contains("\"k1\""), "{}", e.0);
    }

    #[test]
    fn rotation_reads_old_keys_as_stale_and_identity_reads_plain_data() {
        let old = config(&format!(
            "  - aesgcm:\n      keys:\n      - name: old\n        secret: {}\n",
            b64(32, 1)
        ));
        let written = old.transformer_for(KEY).unwrap().encrypt(KEY, b"v");
        let both = config(&format!(
            "  - aesgcm:\n      keys:\n      - name: new\n        secret: {}\n      - name: old\n        secret: {}\n  - identity: {{}}\n",
            b64(32, 2),
            b64(32, 1)
        ));
        let t = both.transformer_for(KEY).unwrap();
        assert_eq!(t.decrypt(KEY, &written).unwrap(), (b"v".to_vec(), true));
        assert_eq!(t.decrypt(KEY, b"{}").unwrap(), (b"{}".to_vec(), true));
        let rewritten = t.encrypt(KEY, b"v");
        assert!(rewritten.starts_with(b"k8s:enc:aesgcm:v1:new:"));
        assert_eq!(t.decrypt(KEY, &rewritten).unwrap(), (b"v".to_vec(), false));
        // The old key removed: the message names it.
        let new_only = config(&format!(
            "  - aesgcm:\n      keys:\n      - name: new\n        secret: {}\n",
            b64(32, 2)
        ));
        let e = new_only
            .transformer_for(KEY)
            .unwrap()
            .decrypt(KEY, &written)
            .unwrap_err();
        assert!(e.0.contains("aesgcm key \"old\""), "{}", e.0);
        // Plain data without identity.
        let e = new_only
            .transformer_for(KEY)
            .unwrap()
            .decrypt(KEY, b"{}")
            .unwrap_err();
        assert!(e.0.contains("identity"), "{}", e.0);
        // A key of the same name with another secret.
        let wrong = config(&format!(
            "  - aesgcm:\n      keys:\n      - name: old\n        secret: {}\n",
            b64(32, 9)
        ));
        let e = wrong
            .transformer_for(KEY)
            .unwrap()
            .decrypt(KEY, &written)
            .unwrap_err();
        assert!(
            e.0.contains("\"old\"") && e.0.contains("does not decrypt"),
            "{}",
            e.0
        );
    }

    #[test]
    fn identity_first_writes_plain_and_still_reads_encrypted() {
        let enc = config(&format!(
            "  - secretbox:\n      keys:\n      - name: k\n        secret: {}\n",
            b64(32, 3)
        ));
        let written = enc.transformer_for(KEY).unwrap().encrypt(KEY, b"v");
        let c = config(&format!(
            "  - identity: {{}}\n  - secretbox:\n      keys:\n      - name: k\n        secret: {}\n",
            b64(32, 3)
        ));
        let t = c.transformer_for(KEY).unwrap();
        assert!(!t.encrypts());
        assert_eq!(t.encrypt(KEY, b"v"), b"v".to_vec());
        assert_eq!(t.decrypt(KEY, &written).unwrap(), (b"v".to_vec(), true));
    }

    #[test]
    fn resources_match_as_kubernetes_names_them() {
        assert!(covers("secrets", "/secrets"));
        assert!(!covers("secrets", "/configmaps"));
        assert!(covers("deployments.apps", "apps/deployments"));
        assert!(!covers("deployments", "apps/deployments"));
        assert!(covers("*.apps", "apps/deployments"));
        assert!(!covers("*.apps", "/secrets"));
        assert!(covers("*.", "/configmaps"));
        assert!(covers("*.*", "rbac.authorization.k8s.io/roles"));
        let c = config("  - identity: {}\n");
        assert!(c
            .transformer_for("/registry/configmaps/default/x")
            .is_none());
        assert!(c.transformer_for(KEY).is_some());
    }

    #[test]
    fn bad_configurations_are_refused_with_the_reason() {
        let bad = |text: &str| {
            EncryptionConfig::parse(text, Path::new("x"))
                .unwrap_err()
                .to_string()
        };
        let head = "apiVersion: apiserver.config.k8s.io/v1\nkind: EncryptionConfiguration\n";
        assert!(bad("kind: Pod\n").contains("kind"));
        assert!(bad(&format!("{head}resources: []\n")).contains("no entries"));
        let e = bad(&format!(
            "{head}resources:\n- resources: [secrets]\n  providers:\n  - aesgcm:\n      keys:\n      - name: k\n        secret: {}\n",
            b64(20, 1)
        ));
        assert!(e.contains("16, 24 or 32") && e.contains("\"k\""), "{e}");
        let e = bad(&format!(
            "{head}resources:\n- resources: [secrets]\n  providers:\n  - secretbox:\n      keys:\n      - name: k\n        secret: '!!notbase64'\n"
        ));
        assert!(e.contains("base64"), "{e}");
        let e = bad(&format!(
            "{head}resources:\n- resources: [secrets]\n  providers:\n  - kms:\n      name: x\n"
        ));
        assert!(e.contains("kms"), "{e}");
        let e = bad(&format!(
            "{head}resources:\n- resources: [secrets]\n  providers:\n  - identity: {{}}\n    aesgcm: {{}}\n"
        ));
        assert!(e.contains("exactly one"), "{e}");
        let e = bad(&format!(
            "{head}resources:\n- resources: [secrets]\n  providers:\n  - aesgcm:\n      keys: []\n"
        ));
        assert!(e.contains("keys: none"), "{e}");
    }

    #[test]
    fn the_default_configuration_encrypts_secrets_with_secretbox() {
        let c = EncryptionConfig::parse(&default_config_text(), Path::new("d")).unwrap();
        let t = c.transformer_for(KEY).unwrap();
        assert!(t
            .encrypt(KEY, b"v")
            .starts_with(b"k8s:enc:secretbox:v1:key1:"));
        assert_eq!(t.decrypt(KEY, b"{}").unwrap(), (b"{}".to_vec(), true));
    }
}
