//! CertificateSigningRequests (certificates.k8s.io/v1): the requestor's
//! identity recorded at create (`spec.username`, `groups`, `uid`,
//! `extra`), the `approval` subresource (`kubectl certificate
//! approve|deny`, allowed with the `approve` verb on the request's signer),
//! and the in-server controller that does what kube-controller-manager's
//! csrapproving and csrsigning controllers do: approve kubelet client
//! certificates for requestors allowed `certificatesigningrequests/nodeclient`
//! (or `selfnodeclient` for a node renewing its own), and sign approved
//! requests for `kubernetes.io/kube-apiserver-client-kubelet` and
//! `kubernetes.io/kube-apiserver-client` with the cluster CA. Agents'
//! serving certificates (`kubernetes.io/kubelet-serving`) are approved
//! when the node itself (or a cluster admin) asks and every name in the
//! request is one of the Node's addresses or its name, and signed for
//! server auth with those names, so the API server can verify agents
//! against the cluster CA.

use std::sync::Arc;
use std::time::Duration;

use base64::Engine;
use serde_json::{json, Value};
use skiff_core::rbac::Attributes;
use skiff_core::resources::{self, ResourceInfo};
use skiff_core::{ApiError, ApiResult};

use crate::authz::resource_attributes;
use crate::object::meta_str;
use crate::options::WriteOptions;
use crate::registry::Registry;
use crate::watchcache::Filter;

pub const KUBELET_CLIENT_SIGNER: &str = "kubernetes.io/kube-apiserver-client-kubelet";
pub const CLIENT_SIGNER: &str = "kubernetes.io/kube-apiserver-client";
pub const KUBELET_SERVING_SIGNER: &str = "kubernetes.io/kubelet-serving";
/// Certificates live a year unless the request asks for less.
const MAX_LIFETIME: i64 = 365 * 24 * 3600;

fn csr_res() -> &'static ResourceInfo {
    resources::lookup("certificates.k8s.io", "v1", "certificatesigningrequests")
        .expect("certificatesigningrequests")
}

fn conditions(csr: &Value) -> Vec<Value> {
    csr.pointer("/status/conditions")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default()
}

fn has_condition(csr: &Value, t: &str) -> bool {
    conditions(csr).iter().any(|c| {
        c.get("type").and_then(Value::as_str) == Some(t)
            && c.get("status").and_then(Value::as_str).unwrap_or("True") == "True"
    })
}

fn condition(t: &str, reason: &str, message: &str) -> Value {
    let now = chrono::Utc::now().format("%Y-%m-%dT%H:%M:%SZ").to_string();
    json!({"type": t, "status": "True", "reason": reason, "message": message,
        "lastUpdateTime": now, "lastTransitionTime": now})
}

/// `PUT .../certificatesigningrequests/NAME/approval`: the conditions of
/// the body replace the request's, nothing else changes.
pub async fn approve(
    reg: &Registry,
    name: &str,
    body: Value,
    opts: &WriteOptions,
) -> ApiResult<Value> {
    let res = csr_res();
    let cur = reg.get(res, None, name).await?;
    let signer = cur
        .pointer("/spec/signerName")
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_string();
    if let Some(who) = opts.user.as_ref().filter(|w| !w.is_master()) {
        let domain = signer.split('/').next().unwrap_or("");
        let may = |n: &str| {
            reg.authz.allows(
                who,
                resource_attributes("approve", "certificates.k8s.io", "signers", "", "", n),
            )
        };
        if !may(&signer) && !may(&format!("{domain}/*")) {
            return Err(crate::admission::plugin::forbidden(
                res,
                name,
                &format!("user not permitted to approve requests with signerName {signer:?}"),
            ));
        }
    }
    let conds = body
        .pointer("/status/conditions")
        .cloned()
        .unwrap_or(json!([]));
    let probe = json!({"status": {"conditions": conds}});
    if has_condition(&probe, "Approved") && has_condition(&probe, "Denied") {
        return Err(ApiError::invalid(
            "certificates.k8s.io",
            "CertificateSigningRequest",
            name,
            vec![skiff_core::Cause::invalid(
                "status.conditions",
                &conds,
                "Approved and Denied conditions are mutually exclusive",
            )],
        ));
    }
    // Approval changes the Approved and Denied conditions only: a Failed
    // one the signer set stays, and new conditions get their timestamps
    // (Kubernetes' approval strategy).
    let old_conds = conditions(&cur);
    let now = chrono::Utc::now().format("%Y-%m-%dT%H:%M:%SZ").to_string();
    let mut conds: Vec<Value> = conds
        .as_array()
        .cloned()
        .unwrap_or_default()
        .into_iter()
        .filter(|c| c.get("type").and_then(Value::as_str) != Some("Failed"))
        .map(|mut c| {
            let t = c.get("type").cloned();
            let st = c.get("status").cloned();
            let before = old_conds.iter().find(|o| o.get("type") == t.as_ref());
            if let Some(m) = c.as_object_mut() {
                if m.get("lastUpdateTime").is_none_or(Value::is_null) {
                    m.insert("lastUpdateTime".into(), json!(now));
                }
                if m.get("lastTransitionTime").is_none_or(Value::is_null) {
                    let kept = before
                        .filter(|o| o.get("status") == st.as_ref())
                        .and_then(|o| o.get("lastTransitionTime").cloned());
                    m.insert("lastTransitionTime".into(), kept.unwrap_or(json!(now)));
                }
            }
            c
        })
        .collect();
    conds.extend(
        old_conds
            .into_iter()
            .filter(|c| c.get("type").and_then(Value::as_str) == Some("Failed")),
    );
    let mut new = cur.clone();
    if !new.get("status").is_some_and(Value::is_object) {
        new["status"] = json!({});
    }
    new["status"]["conditions"] = json!(conds);
    let rv = meta_str(&body, "resourceVersion");
    if !rv.is_empty() {
        new["metadata"]["resourceVersion"] = json!(rv);
    }
    let (out, _) = reg
        .update(
            res,
            None,
            name,
            new,
            crate::request::Subresource::Approval,
            opts,
        )
        .await?;
    Ok(out)
}

/// `PATCH .../certificatesigningrequests/NAME/approval`: the patch applies
/// to the request as it is, then as an approval update. A patch that names
/// no resourceVersion is retried when the request changed meanwhile.
pub async fn patch_approval(
    reg: &Registry,
    name: &str,
    pt: crate::options::PatchType,
    patch: &Value,
    opts: &WriteOptions,
) -> ApiResult<Value> {
    let res = csr_res();
    let schema = skiff_core::schema::root(res.group, res.version, res.kind);
    let mut tries = 0;
    loop {
        let cur = reg.get(res, None, name).await?;
        let patched = crate::registry::apply_patch(res, Some(&cur), pt, patch, schema, opts)?;
        let named = meta_str(&patched, "resourceVersion") != meta_str(&cur, "resourceVersion");
        match approve(reg, name, patched, opts).await {
            Err(e) if e.code == 409 && !named && tries < 5 => tries += 1,
            other => return other,
        }
    }
}

/// The subject and key usages a CSR asks for.
struct Asked {
    common_name: String,
    organizations: Vec<String>,
    /// Subject alternative names: DNS names and IP addresses (as text).
    dns_names: Vec<String>,
    ips: Vec<String>,
    /// Names of another kind (email, URI, …).
    other_names: bool,
}

fn parse_request(csr: &Value) -> Option<(String, Asked)> {
    let b64 = csr.pointer("/spec/request")?.as_str()?;
    let pem =
        String::from_utf8(base64::engine::general_purpose::STANDARD.decode(b64).ok()?).ok()?;
    let (_, p) = x509_parser::pem::parse_x509_pem(pem.as_bytes()).ok()?;
    use x509_parser::prelude::FromDer;
    let (_, req) =
        x509_parser::certification_request::X509CertificationRequest::from_der(&p.contents).ok()?;
    let subject = &req.certification_request_info.subject;
    let common_name = subject
        .iter_common_name()
        .next()
        .and_then(|a| a.as_str().ok())
        .unwrap_or("")
        .to_string();
    let organizations = subject
        .iter_organization()
        .filter_map(|a| a.as_str().ok())
        .map(str::to_string)
        .collect();
    let (mut dns_names, mut ips, mut other_names) = (Vec::new(), Vec::new(), false);
    for ext in req.requested_extensions().into_iter().flatten() {
        if let x509_parser::extensions::ParsedExtension::SubjectAlternativeName(san) = ext {
            for name in &san.general_names {
                match name {
                    x509_parser::extensions::GeneralName::DNSName(d) => {
                        dns_names.push(d.to_string())
                    }
                    x509_parser::extensions::GeneralName::IPAddress(b) => match b.len() {
                        4 => ips.push(
                            std::net::Ipv4Addr::from(<[u8; 4]>::try_from(*b).ok()?).to_string(),
                        ),
                        16 => ips.push(
                            std::net::Ipv6Addr::from(<[u8; 16]>::try_from(*b).ok()?).to_string(),
                        ),
                        _ => other_names = true,
                    },
                    _ => other_names = true,
                }
            }
        }
    }
    Some((
        pem,
        Asked {
            common_name,
            organizations,
            dns_names,
            ips,
            other_names,
        },
    ))
}

fn usages(csr: &Value) -> Vec<String> {
    csr.pointer("/spec/usages")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .map(str::to_string)
        .collect()
}

/// Whether a request is a kubelet client certificate as Kubernetes
/// validates one: CN `system:node:<name>`, O exactly `system:nodes`,
/// usages client auth and digital signature (key encipherment allowed).
fn is_node_client(csr: &Value, asked: &Asked) -> bool {
    let u = usages(csr);
    asked.common_name.starts_with("system:node:")
        && asked.common_name.len() > "system:node:".len()
        && asked.organizations == ["system:nodes"]
        && u.iter().any(|x| x == "client auth")
        && u.iter().all(|x| {
            matches!(
                x.as_str(),
                "client auth" | "digital signature" | "key encipherment"
            )
        })
}

/// Whether a request is a kubelet serving certificate as Kubernetes
/// validates one: CN `system:node:<name>`, O exactly `system:nodes`,
/// usages server auth and digital signature (key encipherment allowed),
/// at least one DNS or IP name and nothing else.
fn is_node_serving(csr: &Value, asked: &Asked) -> bool {
    let u = usages(csr);
    asked.common_name.starts_with("system:node:")
        && asked.common_name.len() > "system:node:".len()
        && asked.organizations == ["system:nodes"]
        && u.iter().any(|x| x == "server auth")
        && u.iter().all(|x| {
            matches!(
                x.as_str(),
                "server auth" | "digital signature" | "key encipherment"
            )
        })
        && !(asked.dns_names.is_empty() && asked.ips.is_empty())
        && !asked.other_names
}

/// Whether a serving certificate request may be approved: asked by the
/// node itself (or a cluster admin), for names that are all the Node's
/// own: its name, and the addresses in its status.
async fn serving_names_are_the_nodes(reg: &Registry, csr: &Value, asked: &Asked) -> bool {
    let user = csr
        .pointer("/spec/username")
        .and_then(Value::as_str)
        .unwrap_or("");
    let admin = csr
        .pointer("/spec/groups")
        .and_then(Value::as_array)
        .is_some_and(|g| g.iter().any(|g| g.as_str() == Some("system:masters")));
    if user != asked.common_name && !admin {
        return false;
    }
    let node_name = &asked.common_name["system:node:".len()..];
    let nodes = resources::lookup("", "v1", "nodes").expect("nodes");
    let Ok(node) = reg.get(nodes, None, node_name).await else {
        return false;
    };
    let addresses: Vec<&str> = node
        .pointer("/status/addresses")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|a| a.get("address").and_then(Value::as_str))
        .collect();
    asked.ips.iter().all(|ip| {
        addresses.iter().any(|a| {
            a.parse::<std::net::IpAddr>()
                .is_ok_and(|x| x.to_string() == *ip)
        })
    }) && asked
        .dns_names
        .iter()
        .all(|d| d == node_name || addresses.contains(&d.as_str()))
}

/// Whether the requestor may have a node client certificate approved.
fn requestor_allowed(reg: &Registry, csr: &Value, asked: &Asked) -> bool {
    let user = csr
        .pointer("/spec/username")
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_string();
    let groups: Vec<String> = csr
        .pointer("/spec/groups")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .map(str::to_string)
        .collect();
    let sub = if user == asked.common_name {
        "selfnodeclient"
    } else {
        "nodeclient"
    };
    let a = Attributes {
        user,
        groups,
        ..resource_attributes(
            "create",
            "certificates.k8s.io",
            "certificatesigningrequests",
            sub,
            "",
            "",
        )
    };
    reg.authz.authorize(&a)
}

/// Signs the request with the CA: a client certificate for the asked
/// subject, valid for `expirationSeconds` (at most a year).
fn sign(ca_cert_pem: &str, ca_key_pem: &str, pem: &str, csr: &Value) -> Result<String, String> {
    let key = rcgen::KeyPair::from_pem(ca_key_pem).map_err(|e| e.to_string())?;
    let issuer = rcgen::Issuer::from_ca_cert_pem(ca_cert_pem, key).map_err(|e| e.to_string())?;
    let mut req =
        rcgen::CertificateSigningRequestParams::from_pem(pem).map_err(|e| e.to_string())?;
    let secs = csr
        .pointer("/spec/expirationSeconds")
        .and_then(Value::as_i64)
        .unwrap_or(MAX_LIFETIME)
        .clamp(600, MAX_LIFETIME);
    let now = time::OffsetDateTime::now_utc();
    req.params.not_before = now - Duration::from_secs(300);
    req.params.not_after = now + Duration::from_secs(secs as u64);
    req.params.is_ca = rcgen::IsCa::ExplicitNoCa;
    req.params.key_usages = vec![rcgen::KeyUsagePurpose::DigitalSignature];
    if usages(csr).iter().any(|u| u == "key encipherment") {
        req.params
            .key_usages
            .push(rcgen::KeyUsagePurpose::KeyEncipherment);
    }
    if csr.pointer("/spec/signerName").and_then(Value::as_str) == Some(KUBELET_SERVING_SIGNER) {
        req.params.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ServerAuth];
    } else {
        req.params.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ClientAuth];
        req.params.subject_alt_names.clear();
    }
    req.params.use_authority_key_identifier_extension = true;
    let mut serial = [0u8; 16];
    rand::Rng::fill(&mut rand::rng(), &mut serial[..]);
    serial[0] &= 0x7f;
    req.params.serial_number = Some(rcgen::SerialNumber::from_slice(&serial));
    Ok(req.signed_by(&issuer).map_err(|e| e.to_string())?.pem())
}

/// Writes `status` through `sub`: the approval subresource for the
/// Approved condition (as kube-controller-manager's csrapproving
/// controller), the status subresource for the certificate.
async fn write_status(
    reg: &Registry,
    csr: &Value,
    status: Value,
    sub: crate::request::Subresource,
) {
    let mut new = csr.clone();
    new["status"] = status;
    let name = meta_str(csr, "name").to_string();
    if let Err(e) = reg
        .update(csr_res(), None, &name, new, sub, &WriteOptions::default())
        .await
    {
        tracing::warn!(csr = %name, error = %e.message, "writing a CertificateSigningRequest's status");
    }
}

/// One pass over the requests: approve and sign what is due. Returns
/// whether a serving request is left waiting for its names to become the
/// node's (its addresses arrive with the node's first status).
pub async fn reconcile(reg: &Registry, ca_cert_pem: &str, ca_key_pem: &str) -> bool {
    let mut waiting = false;
    let objs = reg.cache().resource(csr_res()).snapshot(&Filter::default());
    for o in objs {
        let Some(csr) = o.value() else { continue };
        let csr = (*csr).clone();
        if has_condition(&csr, "Denied") || has_condition(&csr, "Failed") {
            continue;
        }
        let signer = csr
            .pointer("/spec/signerName")
            .and_then(Value::as_str)
            .unwrap_or("");
        let parsed = parse_request(&csr);
        if !has_condition(&csr, "Approved") {
            let Some((_, asked)) = &parsed else { continue };
            let message = if signer == KUBELET_CLIENT_SIGNER
                && is_node_client(&csr, asked)
                && requestor_allowed(reg, &csr, asked)
            {
                "Auto approving kubelet client certificate after SubjectAccessReview."
            } else if signer == KUBELET_SERVING_SIGNER
                && is_node_serving(&csr, asked)
                && serving_names_are_the_nodes(reg, &csr, asked).await
            {
                "Auto approving kubelet serving certificate: its names are the node's."
            } else {
                waiting |= signer == KUBELET_SERVING_SIGNER && is_node_serving(&csr, asked);
                continue;
            };
            let mut status = csr.get("status").cloned().unwrap_or(json!({}));
            let mut conds = conditions(&csr);
            conds.push(condition("Approved", "AutoApproved", message));
            status["conditions"] = json!(conds);
            write_status(reg, &csr, status, crate::request::Subresource::Approval).await;
            continue;
        }
        let signed = csr
            .pointer("/status/certificate")
            .and_then(Value::as_str)
            .is_some_and(|c| !c.is_empty());
        if signed
            || !(signer == KUBELET_CLIENT_SIGNER
                || signer == CLIENT_SIGNER
                || signer == KUBELET_SERVING_SIGNER)
        {
            continue;
        }
        let mut status = csr.get("status").cloned().unwrap_or(json!({}));
        let outcome = match &parsed {
            None => Err("the request is not a valid PEM certificate request".to_string()),
            Some((_, asked)) if signer == KUBELET_CLIENT_SIGNER && !is_node_client(&csr, asked) => {
                Err("invalid kubelet client certificate request: want CN system:node:<name>, O system:nodes, usages client auth and digital signature".to_string())
            }
            Some((_, asked)) if signer == KUBELET_SERVING_SIGNER && !is_node_serving(&csr, asked) => {
                Err("invalid kubelet serving certificate request: want CN system:node:<name>, O system:nodes, usages server auth and digital signature, DNS or IP names".to_string())
            }
            Some((pem, _)) => sign(ca_cert_pem, ca_key_pem, pem, &csr),
        };
        match outcome {
            Ok(cert) => {
                status["certificate"] =
                    json!(base64::engine::general_purpose::STANDARD.encode(cert));
            }
            Err(m) => {
                let mut conds = conditions(&csr);
                conds.push(condition("Failed", "SignerValidationFailure", &m));
                status["conditions"] = json!(conds);
            }
        }
        write_status(reg, &csr, status, crate::request::Subresource::Status).await;
    }
    waiting
}

/// Runs the approver and signer until the server stops: a pass whenever a
/// request changes, whenever a Node changes while a serving request waits
/// for the node's addresses, and every 30 s.
pub async fn run(reg: Arc<Registry>, ca_cert_pem: String, ca_key_pem: String) {
    let mut changed = reg.cache().resource(csr_res()).subscribe();
    let nodes = resources::lookup("", "v1", "nodes").expect("nodes");
    let mut nodes_changed = reg.cache().resource(nodes).subscribe();
    loop {
        let waiting = reconcile(&reg, &ca_cert_pem, &ca_key_pem).await;
        nodes_changed.borrow_and_update();
        let _ = tokio::time::timeout(Duration::from_secs(30), async {
            tokio::select! {
                _ = changed.changed() => {}
                _ = nodes_changed.changed(), if waiting => {}
            }
        })
        .await;
    }
}
