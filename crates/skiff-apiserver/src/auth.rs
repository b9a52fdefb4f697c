//! Authentication: who is calling. TLS client certificates (verified against
//! the cluster CA at the handshake) and in-process callers carry an
//! [`Identity`] in the request's extensions; a ServiceAccount bearer token
//! is verified here; a request with no credentials at all is
//! `system:anonymous` (which RBAC then allows only what it grants), and a
//! request with bad credentials is 401. Impersonation headers replace the
//! identity when the caller may `impersonate` what they name.

use std::collections::BTreeMap;

use axum::http::HeaderMap;
use skiff_core::rbac;
use skiff_core::ApiError;

use crate::authz::{resource_attributes, Authorizer};

/// An authenticated user.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Identity {
    pub user: String,
    pub groups: Vec<String>,
    pub uid: Option<String>,
    pub extra: BTreeMap<String, Vec<String>>,
}

impl Identity {
    /// An authenticated user: its groups plus `system:authenticated`.
    pub fn new(user: impl Into<String>, mut groups: Vec<String>) -> Identity {
        if !groups.iter().any(|g| g == rbac::AUTHENTICATED) {
            groups.push(rbac::AUTHENTICATED.into());
        }
        Identity {
            user: user.into(),
            groups,
            ..Default::default()
        }
    }

    /// The identity of in-process components (scheduler, controllers) in `skiff up`.
    pub fn system(component: &str) -> Identity {
        Identity::new(format!("system:{component}"), vec![rbac::MASTERS.into()])
    }

    /// A request without credentials.
    pub fn anonymous() -> Identity {
        Identity {
            user: rbac::ANONYMOUS.into(),
            groups: vec![rbac::UNAUTHENTICATED.into()],
            ..Default::default()
        }
    }

    /// Whether the privileged group allows this identity everything.
    pub fn is_master(&self) -> bool {
        self.groups.iter().any(|g| g == rbac::MASTERS)
    }
}

/// The bearer token of an `Authorization` header, if any.
pub fn bearer_token(headers: &HeaderMap) -> Option<&str> {
    let v = headers
        .get(axum::http::header::AUTHORIZATION)?
        .to_str()
        .ok()?;
    let (scheme, token) = v.trim().split_once(' ')?;
    scheme
        .eq_ignore_ascii_case("bearer")
        .then(|| token.trim())
        .filter(|t| !t.is_empty())
}

const IMPERSONATE_USER: &str = "impersonate-user";
const IMPERSONATE_GROUP: &str = "impersonate-group";
const IMPERSONATE_UID: &str = "impersonate-uid";
const IMPERSONATE_EXTRA: &str = "impersonate-extra-";

/// Applies impersonation headers: the identity they name if `who` may
/// impersonate every part of it (user or ServiceAccount, groups, uid,
/// extra), 403 otherwise; `who` unchanged without such headers.
pub fn impersonate(
    authz: &Authorizer,
    who: Identity,
    headers: &HeaderMap,
) -> Result<Identity, ApiError> {
    let user = headers
        .get(IMPERSONATE_USER)
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    let groups: Vec<String> = headers
        .get_all(IMPERSONATE_GROUP)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .map(str::to_string)
        .collect();
    let uid = headers
        .get(IMPERSONATE_UID)
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    let mut extra: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for (k, v) in headers {
        if let Some(key) = k.as_str().strip_prefix(IMPERSONATE_EXTRA) {
            if let Ok(v) = v.to_str() {
                extra
                    .entry(skiff_core::query::percent_decode(key))
                    .or_default()
                    .push(v.to_string());
            }
        }
    }
    let Some(user) = user else {
        if !groups.is_empty() || uid.is_some() || !extra.is_empty() {
            return Err(ApiError::internal(
                "requested impersonation of groups, uid or extra without impersonating a user",
            ));
        }
        return Ok(who);
    };
    let check = |a: skiff_core::rbac::Attributes| -> Result<(), ApiError> {
        if authz.allows(&who, a.clone()) {
            return Ok(());
        }
        let mut a = a;
        a.user = who.user.clone();
        Err(rbac::forbidden(&a, ""))
    };
    let mut new_groups = groups.clone();
    match rbac::split_service_account_user(&user) {
        Some((ns, name)) => {
            check(resource_attributes(
                "impersonate",
                "",
                "serviceaccounts",
                "",
                ns,
                name,
            ))?;
            if groups.is_empty() {
                new_groups = vec![
                    "system:serviceaccounts".into(),
                    format!("system:serviceaccounts:{ns}"),
                ];
            }
        }
        None => check(resource_attributes(
            "impersonate",
            "",
            "users",
            "",
            "",
            &user,
        ))?,
    }
    for g in &groups {
        check(resource_attributes("impersonate", "", "groups", "", "", g))?;
    }
    if let Some(u) = &uid {
        check(resource_attributes(
            "impersonate",
            "authentication.k8s.io",
            "uids",
            "",
            "",
            u,
        ))?;
    }
    for (k, vs) in &extra {
        for v in vs {
            check(resource_attributes(
                "impersonate",
                "authentication.k8s.io",
                "userextras",
                k,
                "",
                v,
            ))?;
        }
    }
    if user != rbac::ANONYMOUS {
        if !new_groups
            .iter()
            .any(|g| g == rbac::AUTHENTICATED || g == rbac::UNAUTHENTICATED)
        {
            new_groups.push(rbac::AUTHENTICATED.into());
        }
    } else if !new_groups.iter().any(|g| g == rbac::UNAUTHENTICATED) {
        new_groups.push(rbac::UNAUTHENTICATED.into());
    }
    Ok(Identity {
        user,
        groups: new_groups,
        uid,
        extra,
    })
}
