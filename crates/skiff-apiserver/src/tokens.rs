//! ServiceAccount tokens as Kubernetes issues them: JWTs (ES256) signed
//! with the cluster's newest key, verified against every key kept (so a
//! rotated-out key's tokens stay valid until they expire), bound to the
//! ServiceAccount's UID and optionally a Pod's (a token outlives neither).
//! TokenRequest (`serviceaccounts/NAME/token`), TokenReview, and the OIDC
//! discovery documents (`/.well-known/openid-configuration`,
//! `/openid/v1/jwks`).
//!
//! Keys are PKCS#8 files `DIR/*.pk8`; the last in name order signs. A key
//! is created at first start; rotating is adding a file that sorts later.

use std::collections::HashMap;
use std::path::Path;
use std::time::{Duration, Instant};

use base64::engine::general_purpose::URL_SAFE_NO_PAD as B64;
use base64::Engine;
use ring::rand::SystemRandom;
use ring::signature::{self, EcdsaKeyPair, KeyPair, UnparsedPublicKey};
use serde_json::{json, Value};
use skiff_core::rbac;
use skiff_core::resources;
use skiff_core::ApiError;

use crate::auth::Identity;
use crate::object::{meta_str, object_key};
use crate::registry::Registry;

/// The issuer Kubernetes clusters use by default.
pub const DEFAULT_ISSUER: &str = "https://kubernetes.default.svc.cluster.local";
/// Kubernetes' default TokenRequest lifetime (one hour).
const DEFAULT_EXPIRATION: i64 = 3600;
/// The shortest lifetime a TokenRequest may ask for (ten minutes).
const MIN_EXPIRATION: i64 = 600;

struct VerifyKey {
    kid: String,
    public: Vec<u8>,
}

/// The object a token names: from the watch cache, or from the store when
/// the cache does not (yet) have it with that UID (as Kubernetes' token
/// getter falls back from its informers to a live read).
async fn live_object(
    reg: &Registry,
    res: &'static skiff_core::resources::ResourceInfo,
    ns: &str,
    name: &str,
    uid: &str,
) -> Option<Value> {
    let cached = reg
        .cache()
        .resource(res)
        .get(&object_key(res, Some(ns), name))
        .and_then(|o| o.value());
    match cached {
        Some(v) if meta_str(&v, "uid") == uid => Some((*v).clone()),
        _ => reg.get(res, Some(ns), name).await.ok(),
    }
}

/// The token issuer and verifier.
pub struct Tokens {
    issuer: String,
    signer: EcdsaKeyPair,
    signer_kid: String,
    keys: Vec<VerifyKey>,
    rng: SystemRandom,
    /// Tokens that authenticated recently, with when that answer expires:
    /// kube-apiserver caches successful token authentication for 10 s,
    /// so verifying the signature and reading the ServiceAccount (and Pod)
    /// is not paid on every request. A deleted ServiceAccount or Pod ends
    /// its tokens within that time.
    cache: std::sync::RwLock<HashMap<String, (Identity, Instant)>>,
}

/// How long a successful authentication is reused (kube-apiserver's
/// default token success cache TTL).
const CACHE_TTL: Duration = Duration::from_secs(10);
/// Entries kept before the cache is emptied of expired ones.
const CACHE_MAX: usize = 4096;

fn kid_of(public: &[u8]) -> String {
    B64.encode(ring::digest::digest(&ring::digest::SHA256, public).as_ref())
}

impl Tokens {
    /// Loads the keys in `dir`, creating the first at first start.
    pub fn load_or_create(dir: &Path, issuer: &str) -> anyhow::Result<Tokens> {
        use anyhow::Context;
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        let rng = SystemRandom::new();
        let alg = &signature::ECDSA_P256_SHA256_FIXED_SIGNING;
        let mut files: Vec<_> = std::fs::read_dir(dir)?
            .filter_map(Result::ok)
            .map(|e| e.path())
            .filter(|p| p.extension().is_some_and(|x| x == "pk8"))
            .collect();
        files.sort();
        if files.is_empty() {
            let doc = EcdsaKeyPair::generate_pkcs8(alg, &rng)
                .map_err(|_| anyhow::anyhow!("generating a service account key"))?;
            let path = dir.join("sa-0001.pk8");
            crate::tls::write_secret_bytes(&path, doc.as_ref())?;
            files.push(path);
        }
        let mut keys = Vec::new();
        let mut last = None;
        for f in &files {
            let bytes = std::fs::read(f).with_context(|| format!("reading {}", f.display()))?;
            let pair = EcdsaKeyPair::from_pkcs8(alg, &bytes, &rng)
                .map_err(|_| anyhow::anyhow!("{} is not a P-256 PKCS#8 key", f.display()))?;
            let public = pair.public_key().as_ref().to_vec();
            keys.push(VerifyKey {
                kid: kid_of(&public),
                public,
            });
            last = Some(pair);
        }
        let signer = last.expect("at least one key");
        Ok(Tokens {
            issuer: issuer.to_string(),
            signer_kid: kid_of(signer.public_key().as_ref()),
            signer,
            keys,
            rng,
            cache: Default::default(),
        })
    }

    fn sign(&self, claims: &Value) -> Result<String, ApiError> {
        let header = json!({"alg": "ES256", "kid": self.signer_kid});
        let input = format!(
            "{}.{}",
            B64.encode(header.to_string()),
            B64.encode(claims.to_string())
        );
        let sig = self
            .signer
            .sign(&self.rng, input.as_bytes())
            .map_err(|_| ApiError::internal("signing a token"))?;
        Ok(format!("{input}.{}", B64.encode(sig.as_ref())))
    }

    /// The claims of a token whose signature one of our keys verifies.
    fn verified_claims(&self, token: &str) -> Option<Value> {
        let mut parts = token.split('.');
        let (h, c, s) = (parts.next()?, parts.next()?, parts.next()?);
        if parts.next().is_some() {
            return None;
        }
        let header: Value = serde_json::from_slice(&B64.decode(h).ok()?).ok()?;
        if header.get("alg")?.as_str()? != "ES256" {
            return None;
        }
        let kid = header.get("kid").and_then(Value::as_str);
        let sig = B64.decode(s).ok()?;
        let input = &token.as_bytes()[..h.len() + 1 + c.len()];
        let ok = self
            .keys
            .iter()
            .filter(|k| kid.is_none_or(|kid| kid == k.kid))
            .any(|k| {
                UnparsedPublicKey::new(&signature::ECDSA_P256_SHA256_FIXED, &k.public)
                    .verify(input, &sig)
                    .is_ok()
            });
        if !ok {
            return None;
        }
        serde_json::from_slice(&B64.decode(c).ok()?).ok()
    }

    /// The identity a token proves for one of the `targets` audiences (the
    /// API server's own when empty), with the audiences both the token and
    /// the targets name, or why it proves none.
    async fn identity(
        &self,
        reg: &Registry,
        token: &str,
        targets: &[String],
    ) -> Result<(Identity, Vec<String>, i64), String> {
        let claims = self.verified_claims(token).ok_or("invalid bearer token")?;
        if claims.get("iss").and_then(Value::as_str) != Some(self.issuer.as_str()) {
            return Err("token issued by another issuer".into());
        }
        let auds: Vec<String> = match claims.get("aud") {
            Some(Value::String(s)) => vec![s.clone()],
            Some(Value::Array(a)) => a
                .iter()
                .filter_map(Value::as_str)
                .map(str::to_string)
                .collect(),
            _ => Vec::new(),
        };
        // As kube-apiserver's JWT authenticator: the token must name one of
        // the audiences asked for; the answer is the ones both name, in the
        // order they were asked for.
        let own = [self.issuer.clone()];
        let targets = if targets.is_empty() {
            &own[..]
        } else {
            targets
        };
        let mut common: Vec<String> = Vec::new();
        for t in targets {
            if auds.contains(t) && !common.contains(t) {
                common.push(t.clone());
            }
        }
        if common.is_empty() {
            return Err(format!(
                "token audiences {auds:?} is invalid for the target audiences {targets:?}"
            ));
        }
        let now = chrono::Utc::now().timestamp();
        let exp = claims.get("exp").and_then(Value::as_i64).unwrap_or(0);
        let nbf = claims.get("nbf").and_then(Value::as_i64).unwrap_or(0);
        if now >= exp {
            return Err("token has expired".into());
        }
        if nbf > now + 60 {
            return Err("token is not valid yet".into());
        }
        let k = claims
            .get("kubernetes.io")
            .ok_or("not a service account token")?;
        let ns = k
            .get("namespace")
            .and_then(Value::as_str)
            .ok_or("no namespace")?;
        let sa_name = k
            .pointer("/serviceaccount/name")
            .and_then(Value::as_str)
            .ok_or("no service account")?;
        let sa_uid = k
            .pointer("/serviceaccount/uid")
            .and_then(Value::as_str)
            .unwrap_or("");
        let sa_res = resources::lookup("", "v1", "serviceaccounts").expect("serviceaccounts");
        let sa = live_object(reg, sa_res, ns, sa_name, sa_uid)
            .await
            .ok_or_else(|| format!("service account {ns}/{sa_name} has been deleted"))?;
        if meta_str(&sa, "uid") != sa_uid {
            return Err(format!(
                "service account UID ({sa_uid}) does not match claim ({})",
                meta_str(&sa, "uid")
            ));
        }
        let mut extra = std::collections::BTreeMap::new();
        if let Some(pod) = k.get("pod") {
            let name = pod.get("name").and_then(Value::as_str).unwrap_or("");
            let uid = pod.get("uid").and_then(Value::as_str).unwrap_or("");
            let pod_res = resources::lookup("", "v1", "pods").expect("pods");
            let live = live_object(reg, pod_res, ns, name, uid)
                .await
                .ok_or_else(|| format!("pod {ns}/{name} has been deleted"))?;
            if meta_str(&live, "uid") != uid {
                return Err(format!(
                    "pod UID ({}) does not match claim ({uid})",
                    meta_str(&live, "uid")
                ));
            }
            extra.insert(
                "authentication.kubernetes.io/pod-name".to_string(),
                vec![name.to_string()],
            );
            extra.insert(
                "authentication.kubernetes.io/pod-uid".to_string(),
                vec![uid.to_string()],
            );
        }
        if let Some(jti) = claims.get("jti").and_then(Value::as_str) {
            extra.insert(
                "authentication.kubernetes.io/credential-id".to_string(),
                vec![format!("JTI={jti}")],
            );
        }
        let mut id = Identity::new(
            rbac::service_account_user(ns, sa_name),
            vec![
                "system:serviceaccounts".into(),
                format!("system:serviceaccounts:{ns}"),
            ],
        );
        id.uid = Some(sa_uid.to_string());
        id.extra = extra;
        Ok((id, common, exp))
    }

    /// The identity a bearer token proves; 401 if it proves none.
    pub async fn authenticate(&self, reg: &Registry, token: &str) -> Result<Identity, ApiError> {
        let now = Instant::now();
        if let Some((id, until)) = self
            .cache
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(token)
        {
            if *until > now {
                return Ok(id.clone());
            }
        }
        let (id, _, exp) = self
            .identity(reg, token, &[])
            .await
            .map_err(|_| ApiError::unauthorized())?;
        // Never past the token's own expiry.
        let left = exp - chrono::Utc::now().timestamp();
        let ttl = CACHE_TTL.min(Duration::from_secs(left.max(0) as u64));
        let mut cache = self.cache.write().unwrap_or_else(|e| e.into_inner());
        if cache.len() >= CACHE_MAX {
            cache.retain(|_, (_, until)| *until > now);
            if cache.len() >= CACHE_MAX {
                cache.clear();
            }
        }
        cache.insert(token.to_string(), (id.clone(), now + ttl));
        Ok(id)
    }

    /// Answers a TokenReview.
    pub async fn review(&self, reg: &Registry, mut obj: Value) -> Result<Value, ApiError> {
        let token = obj
            .pointer("/spec/token")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string();
        // No audiences asked for means the API server's own.
        let targets: Vec<String> = obj
            .pointer("/spec/audiences")
            .and_then(Value::as_array)
            .map(|a| {
                a.iter()
                    .filter_map(Value::as_str)
                    .map(str::to_string)
                    .collect()
            })
            .unwrap_or_default();
        // A bootstrap token is not audience-bound: it is valid for the API
        // server's own audience only (kube-apiserver's audience-agnostic
        // authenticators answer the API audiences the review asks for).
        let bootstrap = match crate::bootstrap_token::authenticate(reg, &token).await {
            None => None,
            Some(r) => {
                let own = vec![self.issuer.clone()];
                Some(match r {
                    Ok(id) if targets.is_empty() || targets.contains(&self.issuer) => {
                        Ok((id, own, 0))
                    }
                    Ok(_) => Err(format!(
                        "token audiences {own:?} is invalid for the target audiences {targets:?}"
                    )),
                    Err(_) => Err("invalid bootstrap token".to_string()),
                })
            }
        };
        let answer = match bootstrap {
            Some(b) => b,
            None => self.identity(reg, &token, &targets).await,
        };
        obj["status"] = match answer {
            Ok((id, auds, _)) => {
                let mut user = json!({"username": id.user, "uid": id.uid, "groups": id.groups});
                if !id.extra.is_empty() {
                    user["extra"] = json!(id.extra);
                }
                json!({"authenticated": true, "user": user, "audiences": auds})
            }
            Err(e) => json!({"authenticated": false, "user": {}, "error": e}),
        };
        if obj.get("metadata").is_none_or(Value::is_null) {
            obj["metadata"] = json!({});
        }
        Ok(obj)
    }

    /// Answers a TokenRequest for ServiceAccount `ns/name`: a token for it
    /// (and the bound Pod, if the request names one).
    pub async fn request(
        &self,
        reg: &Registry,
        ns: &str,
        name: &str,
        req: &Value,
    ) -> Result<Value, ApiError> {
        let sa_res = resources::lookup("", "v1", "serviceaccounts").expect("serviceaccounts");
        let sa = reg.get(sa_res, Some(ns), name).await?;
        let spec = req.get("spec").cloned().unwrap_or(json!({}));
        let exp_secs = spec
            .get("expirationSeconds")
            .and_then(Value::as_i64)
            .unwrap_or(DEFAULT_EXPIRATION);
        if exp_secs < MIN_EXPIRATION {
            return Err(ApiError::invalid(
                "authentication.k8s.io",
                "TokenRequest",
                name,
                vec![skiff_core::Cause::invalid(
                    "spec.expirationSeconds",
                    &json!(exp_secs),
                    "may not specify a duration less than 10 minutes",
                )],
            ));
        }
        if exp_secs > 1 << 32 {
            return Err(ApiError::invalid(
                "authentication.k8s.io",
                "TokenRequest",
                name,
                vec![skiff_core::Cause::invalid(
                    "spec.expirationSeconds",
                    &json!(exp_secs),
                    "may not specify a duration larger than 2^32 seconds",
                )],
            ));
        }
        let mut audiences: Vec<String> = spec
            .get("audiences")
            .and_then(Value::as_array)
            .map(|a| {
                a.iter()
                    .filter_map(Value::as_str)
                    .map(str::to_string)
                    .collect()
            })
            .unwrap_or_default();
        if audiences.is_empty() {
            audiences.push(self.issuer.clone());
        }
        let now = chrono::Utc::now().timestamp();
        let exp = now + exp_secs;
        let mut k = json!({
            "namespace": ns,
            "serviceaccount": {"name": name, "uid": meta_str(&sa, "uid")},
        });
        let mut bound = None;
        if let Some(r) = spec.get("boundObjectRef").filter(|v| v.is_object()) {
            let kind = r.get("kind").and_then(Value::as_str).unwrap_or("");
            let bname = r.get("name").and_then(Value::as_str).unwrap_or("");
            let buid = r.get("uid").and_then(Value::as_str).unwrap_or("");
            if kind != "Pod" {
                return Err(ApiError::bad_request(format!(
                    "cannot bind token for serviceaccount {name:?} to object of type {kind}: only Pod is supported"
                )));
            }
            let pod_res = resources::lookup("", "v1", "pods").expect("pods");
            let pod = reg.get(pod_res, Some(ns), bname).await?;
            let uid = meta_str(&pod, "uid");
            if !buid.is_empty() && buid != uid {
                return Err(ApiError::conflict(
                    "",
                    "pods",
                    bname,
                    &format!("the UID in the bound object reference ({buid}) does not match the UID in record. The object might have been deleted and then recreated"),
                ));
            }
            k["pod"] = json!({"name": bname, "uid": uid});
            let node = pod
                .pointer("/spec/nodeName")
                .and_then(Value::as_str)
                .unwrap_or("");
            bound = Some((bname.to_string(), uid.to_string(), node.to_string()));
        }
        let claims = json!({
            "aud": audiences,
            "exp": exp,
            "iat": now,
            "iss": self.issuer,
            "jti": uuid::Uuid::new_v4().to_string(),
            "kubernetes.io": k,
            "nbf": now,
            "sub": rbac::service_account_user(ns, name),
        });
        let token = self.sign(&claims)?;
        let expiration = chrono::DateTime::from_timestamp(exp, 0)
            .unwrap_or_default()
            .format("%Y-%m-%dT%H:%M:%SZ")
            .to_string();
        let mut out_spec = json!({"audiences": audiences, "expirationSeconds": exp_secs});
        if let Some((n, u, _)) = bound {
            out_spec["boundObjectRef"] =
                json!({"kind": "Pod", "apiVersion": "v1", "name": n, "uid": u});
        }
        let created = chrono::DateTime::from_timestamp(now, 0)
            .unwrap_or_default()
            .format("%Y-%m-%dT%H:%M:%SZ")
            .to_string();
        Ok(json!({
            "kind": "TokenRequest",
            "apiVersion": "authentication.k8s.io/v1",
            "metadata": {"name": name, "namespace": ns, "creationTimestamp": created},
            "spec": out_spec,
            "status": {"token": token, "expirationTimestamp": expiration},
        }))
    }

    /// `/.well-known/openid-configuration`.
    pub fn openid_configuration(&self) -> Value {
        json!({
            "issuer": self.issuer,
            "jwks_uri": format!("{}/openid/v1/jwks", self.issuer),
            "response_types_supported": ["id_token"],
            "subject_types_supported": ["public"],
            "id_token_signing_alg_values_supported": ["ES256"],
        })
    }

    /// `/openid/v1/jwks`: every key that verifies tokens.
    pub fn jwks(&self) -> Value {
        let keys: Vec<Value> = self
            .keys
            .iter()
            .map(|k| {
                // An uncompressed P-256 point: 0x04 || x (32) || y (32).
                json!({
                    "use": "sig", "kty": "EC", "kid": k.kid, "crv": "P-256", "alg": "ES256",
                    "x": B64.encode(&k.public[1..33]), "y": B64.encode(&k.public[33..65]),
                })
            })
            .collect();
        json!({"keys": keys})
    }
}
