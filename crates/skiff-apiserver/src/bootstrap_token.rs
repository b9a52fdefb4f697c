//! Joining nodes: bootstrap tokens as Kubernetes has them (Secrets of type
//! `bootstrap.kubernetes.io/token` named `bootstrap-token-<id>` in
//! kube-system; a bearer token `<id>.<secret>` authenticates as
//! `system:bootstrap:<id>` in `system:bootstrappers` and the Secret's
//! `auth-extra-groups`), the join token `skiff server` writes to
//! `DATA/token`, and the `cluster-info` ConfigMap in kube-public that
//! anonymous clients may read to learn the cluster's CA.
//!
//! The join token is k3s-shaped: `K10<hash>::<id>.<secret>`, where
//! `<hash>` is the lowercase hex SHA-256 of the cluster CA certificate's
//! DER encoding. A joining agent reads `cluster-info` without trusting the
//! server, accepts the CA in it only if its hash matches, and from then on
//! verifies the server with that CA.

use std::path::Path;

use base64::Engine;
use serde_json::{json, Value};
use skiff_core::resources;
use skiff_core::ApiError;

use crate::auth::Identity;
use crate::object::object_key;
use crate::options::WriteOptions;
use crate::registry::Registry;

/// The Secret type of bootstrap tokens.
pub const SECRET_TYPE: &str = "bootstrap.kubernetes.io/token";
/// The group every bootstrap token authenticates in.
pub const BOOTSTRAPPERS: &str = "system:bootstrappers";
/// The extra group skiff's join token carries (as kubeadm's default token).
pub const DEFAULT_NODE_TOKEN_GROUP: &str = "system:bootstrappers:skiff:default-node-token";

/// `<id>.<secret>` of a bearer token in bootstrap-token form
/// (`[a-z0-9]{6}\.[a-z0-9]{16}`).
pub fn parse(token: &str) -> Option<(&str, &str)> {
    let (id, secret) = token.split_once('.')?;
    let ok = |s: &str, n: usize| {
        s.len() == n
            && s.bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
    };
    (ok(id, 6) && ok(secret, 16)).then_some((id, secret))
}

/// The CA hash a join token carries: hex SHA-256 of the CA's DER.
pub fn ca_hash(ca_pem: &str) -> Option<String> {
    let der = rustls_pki_types::pem::PemObject::from_pem_slice(ca_pem.as_bytes())
        .ok()
        .map(|c: rustls_pki_types::CertificateDer<'static>| c.to_vec())?;
    let d = ring::digest::digest(&ring::digest::SHA256, &der);
    Some(d.as_ref().iter().map(|b| format!("{b:02x}")).collect())
}

/// A join token's parts: (CA hash, `<id>.<secret>`).
pub fn split_join_token(token: &str) -> Option<(&str, &str)> {
    let rest = token.trim().strip_prefix("K10")?;
    let (hash, cred) = rest.split_once("::")?;
    parse(cred)?;
    (hash.len() == 64).then_some((hash, cred))
}

fn secret_res() -> &'static skiff_core::resources::ResourceInfo {
    resources::lookup("", "v1", "secrets").expect("secrets")
}

fn data_str(secret: &Value, key: &str) -> Option<String> {
    let b64 = secret.pointer(&format!("/data/{key}"))?.as_str()?;
    let bytes = base64::engine::general_purpose::STANDARD.decode(b64).ok()?;
    String::from_utf8(bytes).ok()
}

/// The identity a bootstrap token proves: `None` if the bearer token is
/// not in bootstrap form (another authenticator's), `Some(Err)` (401) if it
/// is one that proves nothing.
pub async fn authenticate(reg: &Registry, token: &str) -> Option<Result<Identity, ApiError>> {
    let (id, secret) = parse(token)?;
    Some(
        identity(reg, id, secret)
            .await
            .ok_or_else(ApiError::unauthorized),
    )
}

async fn identity(reg: &Registry, id: &str, secret: &str) -> Option<Identity> {
    let res = secret_res();
    let name = format!("bootstrap-token-{id}");
    let key = object_key(res, Some("kube-system"), &name);
    let obj = match reg.cache().resource(res).get(&key).and_then(|o| o.value()) {
        Some(v) => (*v).clone(),
        None => reg.get(res, Some("kube-system"), &name).await.ok()?,
    };
    if obj.get("type").and_then(Value::as_str) != Some(SECRET_TYPE)
        || obj.pointer("/metadata/deletionTimestamp").is_some()
    {
        return None;
    }
    if data_str(&obj, "token-id").as_deref() != Some(id) {
        return None;
    }
    let want = data_str(&obj, "token-secret")?;
    // Compared without an early exit (the lengths are public: 16).
    let differ = want.len() != secret.len()
        || want
            .bytes()
            .zip(secret.bytes())
            .fold(0u8, |acc, (a, b)| acc | (a ^ b))
            != 0;
    if differ {
        return None;
    }
    if data_str(&obj, "usage-bootstrap-authentication").as_deref() != Some("true") {
        return None;
    }
    if let Some(exp) = data_str(&obj, "expiration") {
        let t = chrono::DateTime::parse_from_rfc3339(&exp).ok()?;
        if t <= chrono::Utc::now() {
            return None;
        }
    }
    let mut groups = vec![BOOTSTRAPPERS.to_string()];
    for g in data_str(&obj, "auth-extra-groups")
        .unwrap_or_default()
        .split(',')
        .map(str::trim)
        .filter(|g| g.starts_with("system:bootstrappers:"))
    {
        groups.push(g.to_string());
    }
    Some(Identity::new(format!("system:bootstrap:{id}"), groups))
}

fn random_chars(n: usize) -> String {
    use rand::Rng;
    const A: &[u8] = b"abcdefghijklmnopqrstuvwxyz0123456789";
    let mut rng = rand::rng();
    (0..n)
        .map(|_| A[rng.random_range(0..A.len())] as char)
        .collect()
}

/// The Secret of a bootstrap token.
pub fn token_secret(id: &str, secret: &str, description: &str) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Secret", "type": SECRET_TYPE,
        "metadata": {"name": format!("bootstrap-token-{id}"), "namespace": "kube-system"},
        "stringData": {
            "description": description,
            "token-id": id,
            "token-secret": secret,
            "usage-bootstrap-authentication": "true",
            "usage-bootstrap-signing": "true",
            "auth-extra-groups": DEFAULT_NODE_TOKEN_GROUP,
        },
    })
}

/// Makes sure the cluster has its join token: `DATA/token` (created with a
/// new token at first start) and its bootstrap Secret (created again if
/// someone deleted it; deleting the file makes a new token), and the
/// `cluster-info` ConfigMap with the server's URL and CA. Returns the token.
pub async fn ensure(
    reg: &Registry,
    data_dir: &Path,
    ca_pem: &str,
    server_url: &str,
) -> anyhow::Result<String> {
    let hash = ca_hash(ca_pem).ok_or_else(|| anyhow::anyhow!("the cluster CA is not PEM"))?;
    let path = data_dir.join("token");
    let token = match std::fs::read_to_string(&path)
        .ok()
        .filter(|t| split_join_token(t).is_some_and(|(h, _)| h == hash))
    {
        Some(t) => t.trim().to_string(),
        None => {
            let t = format!("K10{hash}::{}.{}", random_chars(6), random_chars(16));
            crate::tls::write_secret_file(&path, &format!("{t}\n"))?;
            t
        }
    };
    let (_, cred) = split_join_token(&token).expect("well-formed");
    let (id, secret) = parse(cred).expect("well-formed");
    let opts = &WriteOptions::default();
    let create = |res, ns: &'static str, obj: Value| async move {
        match reg.create(res, Some(ns), obj, opts).await {
            Ok(_) => Ok(()),
            Err(e) if e.code == 409 => Ok(()),
            Err(e) => Err(anyhow::anyhow!("{}", e.message)),
        }
    };
    create(
        secret_res(),
        "kube-system",
        token_secret(id, secret, "skiff's join token (DATA/token)"),
    )
    .await?;
    // cluster-info, readable without credentials (kubeadm's discovery).
    let kubeconfig = format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: \"\"\n  cluster:\n    server: {server_url}\n    certificate-authority-data: {}\ncontexts: []\nusers: []\ncurrent-context: \"\"\n",
        base64::engine::general_purpose::STANDARD.encode(ca_pem)
    );
    let cms = resources::lookup("", "v1", "configmaps").expect("configmaps");
    let cm = json!({"apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "cluster-info", "namespace": "kube-public"},
        "data": {"kubeconfig": kubeconfig}});
    match reg.get(cms, Some("kube-public"), "cluster-info").await {
        Ok(cur) if cur.pointer("/data/kubeconfig") == cm.pointer("/data/kubeconfig") => {}
        Ok(_) => {
            reg.update(
                cms,
                Some("kube-public"),
                "cluster-info",
                cm,
                crate::request::Subresource::Main,
                &WriteOptions::default(),
            )
            .await
            .map_err(|e| anyhow::anyhow!("{}", e.message))?;
        }
        Err(_) => create(cms, "kube-public", cm).await?,
    }
    let g = "rbac.authorization.k8s.io";
    let role = json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
        "metadata": {"name": "skiff:bootstrap-signer-clusterinfo", "namespace": "kube-public"},
        "rules": [{"apiGroups": [""], "resources": ["configmaps"], "resourceNames": ["cluster-info"], "verbs": ["get"]}]});
    let binding = json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
        "metadata": {"name": "skiff:bootstrap-signer-clusterinfo", "namespace": "kube-public"},
        "roleRef": {"apiGroup": g, "kind": "Role", "name": "skiff:bootstrap-signer-clusterinfo"},
        "subjects": [{"apiGroup": g, "kind": "User", "name": "system:anonymous"}]});
    create(
        resources::lookup(g, "v1", "roles").expect("roles"),
        "kube-public",
        role,
    )
    .await?;
    // The agents' ServiceLB elects one of them with a Lease in kube-system.
    let lease_role = json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
    "metadata": {"name": "skiff:service-lb", "namespace": "kube-system"},
    "rules": [
        {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["create"]},
        {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "resourceNames": ["skiff-service-lb"], "verbs": ["get", "update", "patch"]},
    ]});
    let lease_binding = json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
        "metadata": {"name": "skiff:service-lb", "namespace": "kube-system"},
        "roleRef": {"apiGroup": g, "kind": "Role", "name": "skiff:service-lb"},
        "subjects": [{"apiGroup": g, "kind": "Group", "name": "system:nodes"}]});
    create(
        resources::lookup(g, "v1", "roles").expect("roles"),
        "kube-system",
        lease_role,
    )
    .await?;
    create(
        resources::lookup(g, "v1", "rolebindings").expect("rolebindings"),
        "kube-system",
        lease_binding,
    )
    .await?;
    // Return once authorization sees them (it reads the watch cache), so
    // an agent started next is not refused its first requests.
    let node = Identity::new("system:node:probe", vec!["system:nodes".into()]);
    let lease = crate::authz::resource_attributes(
        "get",
        "coordination.k8s.io",
        "leases",
        "",
        "kube-system",
        "skiff-service-lb",
    );
    for _ in 0..250 {
        if reg.authz.allows(&node, lease.clone()) {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    create(
        resources::lookup(g, "v1", "rolebindings").expect("rolebindings"),
        "kube-public",
        binding,
    )
    .await?;
    Ok(token)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bootstrap_tokens_have_kubernetes_shape() {
        assert_eq!(
            parse("abcdef.0123456789abcdef"),
            Some(("abcdef", "0123456789abcdef"))
        );
        for bad in [
            "abcdef.0123456789abcde",
            "ABCDEF.0123456789abcdef",
            "abcdef0123456789abcdef",
            "eyJhbGciOi.x.y",
            "abcde.0123456789abcdefg",
        ] {
            assert_eq!(parse(bad), None, "{bad}");
        }
        let t = format!("K10{}::abcdef.0123456789abcdef", "a".repeat(64));
        assert_eq!(
            split_join_token(&t),
            Some(("a".repeat(64).as_str(), "abcdef.0123456789abcdef"))
        );
        assert_eq!(split_join_token("abcdef.0123456789abcdef"), None);
        assert_eq!(split_join_token("K10abc::abcdef.0123456789abcdef"), None);
    }
}
