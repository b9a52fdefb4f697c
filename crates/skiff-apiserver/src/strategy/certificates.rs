//! CertificateSigningRequests (certificates.k8s.io/v1): the requestor is
//! whoever creates the request, never what its body claims. Approval and
//! signing are `crate::certificates`.

use serde_json::{json, Value};

use super::Strategy;
use crate::auth::Identity;

pub struct CsrStrategy;

impl Strategy for CsrStrategy {
    fn record_requestor(&self, obj: &mut Value, who: Option<&Identity>) {
        record(obj, who);
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
