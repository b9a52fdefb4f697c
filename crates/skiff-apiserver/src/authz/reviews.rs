//! The review APIs: SelfSubjectReview (`kubectl auth whoami`),
//! SubjectAccessReview, LocalSubjectAccessReview, SelfSubjectAccessReview
//! (`kubectl auth can-i`) and SelfSubjectRulesReview (`kubectl auth can-i
//! --list`), answered by the same authorizer requests go through.

use serde_json::{json, Value};
use skiff_core::rbac::{self, Attributes};
use skiff_core::ApiError;

use super::Authorizer;
use crate::auth::Identity;

fn strings(v: Option<&Value>) -> Vec<String> {
    v.and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(Value::as_str)
                .map(str::to_string)
                .collect()
        })
        .unwrap_or_default()
}

fn s(v: &Value, k: &str) -> String {
    v.get(k).and_then(Value::as_str).unwrap_or("").to_string()
}

/// The attributes a SubjectAccessReview's spec asks about.
fn spec_attributes(spec: &Value) -> Result<Attributes, ApiError> {
    if let Some(r) = spec.get("resourceAttributes").filter(|v| v.is_object()) {
        return Ok(Attributes {
            verb: s(r, "verb"),
            resource_request: true,
            namespace: s(r, "namespace"),
            api_group: s(r, "group"),
            api_version: s(r, "version"),
            resource: s(r, "resource"),
            subresource: s(r, "subresource"),
            name: s(r, "name"),
            ..Default::default()
        });
    }
    if let Some(n) = spec.get("nonResourceAttributes").filter(|v| v.is_object()) {
        return Ok(Attributes {
            verb: s(n, "verb"),
            path: s(n, "path"),
            ..Default::default()
        });
    }
    Err(ApiError::invalid(
        "authorization.k8s.io",
        "SubjectAccessReview",
        "",
        vec![
            skiff_core::Cause::required("spec.resourceAttributes").with_message(
                "exactly one of nonResourceAttributes or resourceAttributes must be specified",
            ),
        ],
    ))
}

trait WithMessage {
    fn with_message(self, m: &str) -> Self;
}
impl WithMessage for skiff_core::Cause {
    fn with_message(mut self, m: &str) -> Self {
        self.reason = "FieldValueRequired".into();
        self.message = format!("Required value: {m}");
        self
    }
}

fn decide(authz: &Authorizer, a: &Attributes) -> Value {
    if authz.authorize(a) {
        let reason = if a.groups.iter().any(|g| g == rbac::MASTERS) {
            "allowed by the system:masters group"
        } else {
            "RBAC: allowed by a binding"
        };
        json!({"allowed": true, "reason": reason})
    } else {
        json!({"allowed": false})
    }
}

/// Answers a review of `kind` posted by `who` (in `namespace` for the
/// namespaced LocalSubjectAccessReview): the object with its `status`.
pub fn answer(
    authz: &Authorizer,
    kind: &str,
    namespace: Option<&str>,
    mut obj: Value,
    who: &Identity,
) -> Result<Value, ApiError> {
    let spec = obj.get("spec").cloned().unwrap_or(json!({}));
    obj["status"] = match kind {
        "SelfSubjectReview" => {
            let mut info = json!({"username": who.user, "groups": who.groups});
            if let Some(uid) = &who.uid {
                info["uid"] = json!(uid);
            }
            if !who.extra.is_empty() {
                info["extra"] = json!(who.extra);
            }
            json!({"userInfo": info})
        }
        "SelfSubjectAccessReview" => {
            let mut a = spec_attributes(&spec)?;
            a.user = who.user.clone();
            a.groups = who.groups.clone();
            decide(authz, &a)
        }
        "SubjectAccessReview" | "LocalSubjectAccessReview" => {
            let mut a = spec_attributes(&spec)?;
            if kind == "LocalSubjectAccessReview" {
                let ns = namespace.unwrap_or("");
                if !a.resource_request || a.namespace != ns {
                    return Err(ApiError::bad_request(format!(
                        "spec.resourceAttributes.namespace must match namespace: {ns}"
                    )));
                }
                obj["metadata"]["namespace"] = json!(ns);
            }
            a.user = s(&spec, "user");
            a.groups = strings(spec.get("groups"));
            if a.user.is_empty() && a.groups.is_empty() {
                return Err(ApiError::invalid(
                    "authorization.k8s.io",
                    kind,
                    "",
                    vec![skiff_core::Cause::invalid(
                        "spec.user",
                        &json!(""),
                        "at least one of user or group must be specified",
                    )],
                ));
            }
            decide(authz, &a)
        }
        "SelfSubjectRulesReview" => {
            let ns = s(&spec, "namespace");
            let rules = authz.rules_for(&who.user, &who.groups, &ns);
            let resource_rules: Vec<Value> = rules
                .iter()
                .filter(|r| r.non_resource_urls.is_empty())
                .map(|r| {
                    let mut v = json!({"verbs": r.verbs, "apiGroups": r.api_groups, "resources": r.resources});
                    if !r.resource_names.is_empty() {
                        v["resourceNames"] = json!(r.resource_names);
                    }
                    v
                })
                .collect();
            let non_resource_rules: Vec<Value> = rules
                .iter()
                .filter(|r| !r.non_resource_urls.is_empty())
                .map(|r| json!({"verbs": r.verbs, "nonResourceURLs": r.non_resource_urls}))
                .collect();
            json!({
                "resourceRules": resource_rules,
                "nonResourceRules": non_resource_rules,
                "incomplete": false,
            })
        }
        _ => json!({}),
    };
    if obj.get("metadata").is_none_or(Value::is_null) {
        obj["metadata"] = json!({});
    }
    Ok(obj)
}
