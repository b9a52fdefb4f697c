//! Escalation prevention on RBAC writes (kube-apiserver's `policybased`
//! role and binding storage): a user may write a Role or ClusterRole only
//! with rules it already holds, or with the `escalate` verb on it; a
//! binding only to a role whose rules it holds, or with the `bind` verb on
//! that role.

use serde_json::Value;
use skiff_core::rbac::{self, PolicyRule};
use skiff_core::resources::ResourceInfo;
use skiff_core::ApiError;

use super::{resource_attributes, Authorizer};
use crate::auth::Identity;

const GROUP: &str = "rbac.authorization.k8s.io";

/// Whether `who` may write `obj` (a Role, ClusterRole, RoleBinding or
/// ClusterRoleBinding in `namespace`); other kinds pass. Writes without a
/// user (the server's own) and by `system:masters` always pass.
pub fn check(
    authz: &Authorizer,
    who: Option<&Identity>,
    res: &ResourceInfo,
    namespace: &str,
    obj: &Value,
) -> Result<(), ApiError> {
    if res.group != GROUP {
        return Ok(());
    }
    let Some(who) = who else {
        return Ok(());
    };
    if who.groups.iter().any(|g| g == rbac::MASTERS) {
        return Ok(());
    }
    let name = obj
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or("");
    match res.kind {
        "Role" | "ClusterRole" => {
            let escalate = resource_attributes("escalate", GROUP, res.plural, "", namespace, name);
            if authz.allows(who, escalate) {
                return Ok(());
            }
            confirm_no_escalation(authz, who, namespace, &PolicyRule::rules_of(obj))
                .map_err(|m| rbac::forbidden_error(GROUP, res.plural, name, &m))?;
            if res.kind == "ClusterRole" && obj.get("aggregationRule").is_some_and(|a| !a.is_null())
            {
                let full = [
                    PolicyRule::new(&["*"], &["*"], &["*"]),
                    PolicyRule::urls(&["*"], &["*"]),
                ];
                confirm_no_escalation(authz, who, namespace, &full).map_err(|_| {
                    rbac::forbidden_error(
                        GROUP,
                        res.plural,
                        name,
                        "must have cluster-admin privileges to use the aggregationRule",
                    )
                })?;
            }
            Ok(())
        }
        "RoleBinding" | "ClusterRoleBinding" => {
            let kind = obj
                .pointer("/roleRef/kind")
                .and_then(Value::as_str)
                .unwrap_or("");
            let role = obj
                .pointer("/roleRef/name")
                .and_then(Value::as_str)
                .unwrap_or("");
            let role_plural = if kind == "Role" {
                "roles"
            } else {
                "clusterroles"
            };
            let bind = resource_attributes("bind", GROUP, role_plural, "", namespace, role);
            if authz.allows(who, bind) {
                return Ok(());
            }
            let rules = authz.role_ref_rules(kind, role, namespace).ok_or_else(|| {
                let nf = format!(
                    "{} {role:?} not found",
                    skiff_core::error::group_resource(GROUP, role_plural)
                );
                rbac::forbidden_error(GROUP, res.plural, name, &nf)
            })?;
            confirm_no_escalation(authz, who, namespace, &rules)
                .map_err(|m| rbac::forbidden_error(GROUP, res.plural, name, &m))
        }
        _ => Ok(()),
    }
}

/// Kubernetes' `ConfirmNoEscalation`: the user's own rules (cluster-wide and
/// in `namespace`) cover `rules`; otherwise the message naming what is missing.
fn confirm_no_escalation(
    authz: &Authorizer,
    who: &Identity,
    namespace: &str,
    rules: &[PolicyRule],
) -> Result<(), String> {
    let owned = authz.rules_for(&who.user, &who.groups, namespace);
    let (ok, missing) = rbac::covers(&owned, rules);
    if ok {
        return Ok(());
    }
    Err(rbac::escalation_message(&who.user, &who.groups, &missing))
}
