//! Authentication: who is calling. TLS client certificates (verified against
//! the cluster CA at the handshake) and in-process callers carry an
//! [`Identity`] in the request's extensions; a request without one is 401.

/// An authenticated user.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Identity {
    pub user: String,
    pub groups: Vec<String>,
}

impl Identity {
    /// The identity of in-process components (scheduler, controllers) in `skiff up`.
    pub fn system(component: &str) -> Identity {
        Identity {
            user: format!("system:{component}"),
            groups: vec!["system:masters".into()],
        }
    }
}

/// Answers a review (`kubectl auth whoami`, `kubectl auth can-i`). Until
/// RBAC is enforced every authenticated user may do everything, and the
/// answers say so.
pub fn review(kind: &str, mut obj: serde_json::Value, who: Option<&Identity>) -> serde_json::Value {
    use serde_json::json;
    let (user, groups) = match who {
        Some(i) => (i.user.clone(), i.groups.clone()),
        None => (String::new(), Vec::new()),
    };
    let mut all_groups = groups;
    all_groups.push("system:authenticated".into());
    obj["status"] = match kind {
        "SelfSubjectReview" => json!({"userInfo": {"username": user, "groups": all_groups}}),
        "SelfSubjectAccessReview" => {
            json!({"allowed": true, "reason": "skiff does not enforce RBAC yet: every authenticated user may do everything"})
        }
        "SelfSubjectRulesReview" => json!({
            "resourceRules": [{"verbs": ["*"], "apiGroups": ["*"], "resources": ["*"]}],
            "nonResourceRules": [{"verbs": ["*"], "nonResourceURLs": ["*"]}],
            "incomplete": false,
        }),
        _ => json!({}),
    };
    if obj.get("metadata").is_none() {
        obj["metadata"] = json!({});
    }
    obj
}

/// Paths anyone may read without credentials (as Kubernetes' default
/// `system:public-info-viewer` role allows).
pub fn is_public(path: &str) -> bool {
    matches!(
        path,
        "/healthz" | "/livez" | "/readyz" | "/version" | "/version/"
    ) || path.starts_with("/healthz/")
        || path.starts_with("/livez/")
        || path.starts_with("/readyz/")
}
