//! CertificateSigningRequests (certificates.k8s.io/v1): the requestor is
//! whoever creates the request, never what its body claims. Approval and
//! signing are `crate::certificates`.

use serde_json::{json, Value};

use super::Strategy;
use crate::auth::Identity;
use crate::request::Subresource;

pub struct CsrStrategy;

impl Strategy for CsrStrategy {
    fn record_requestor(&self, obj: &mut Value, who: Option<&Identity>) {
        record(obj, who);
    }

    /// Kubernetes' status and approval strategies keep the two concerns
    /// apart: a status write (the signer's) cannot add or remove Approved
    /// or Denied conditions, and an approval cannot change the issued
    /// certificate.
    fn prepare_for_update(&self, old: &Value, new: &mut Value, sub: Subresource) {
        match sub {
            Subresource::Status => {
                for t in ["Approved", "Denied"] {
                    keep_conditions_of(old, new, t);
                }
            }
            Subresource::Approval => match old.pointer("/status/certificate") {
                Some(c) => new["status"]["certificate"] = c.clone(),
                None => {
                    if let Some(s) = new.get_mut("status").and_then(Value::as_object_mut) {
                        s.remove("certificate");
                    }
                }
            },
            _ => {}
        }
    }
}

/// The conditions of type `t` in `new` become those of `old`.
fn keep_conditions_of(old: &Value, new: &mut Value, t: &str) {
    let of_type = |c: &&Value| c.get("type").and_then(Value::as_str) == Some(t);
    let mut conds: Vec<Value> = new
        .pointer("/status/conditions")
        .and_then(Value::as_array)
        .map(|a| a.iter().filter(|c| !of_type(c)).cloned().collect())
        .unwrap_or_default();
    conds.extend(
        old.pointer("/status/conditions")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter(of_type)
            .cloned(),
    );
    if !new.get("status").is_some_and(Value::is_object) {
        new["status"] = json!({});
    }
    if conds.is_empty() {
        if let Some(s) = new["status"].as_object_mut() {
            s.remove("conditions");
        }
    } else {
        new["status"]["conditions"] = Value::Array(conds);
    }
}

/// Records who asks (the CSR strategy's PrepareForCreate): the requestor's
/// user, uid, groups and extra replace whatever the body said; no status.
fn record(obj: &mut Value, who: Option<&Identity>) {
    let Some(who) = who else { return };
    if !obj.get("spec").is_some_and(Value::is_object) {
        obj["spec"] = json!({});
    }
    let spec = obj["spec"].as_object_mut().expect("object");
    spec.insert("username".into(), json!(who.user));
    spec.insert("groups".into(), json!(who.groups));
    match &who.uid {
        Some(u) => spec.insert("uid".into(), json!(u)),
        None => spec.remove("uid"),
    };
    if who.extra.is_empty() {
        spec.remove("extra");
    } else {
        spec.insert("extra".into(), json!(who.extra));
    }
    if let Some(m) = obj.as_object_mut() {
        m.remove("status");
    }
}
