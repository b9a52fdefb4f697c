//! RBAC decided from data alone: what a request asks (Kubernetes'
//! `RequestInfo` from method, path and query), whether a PolicyRule allows
//! it, whom a binding's subject names, whether one set of rules covers
//! another (escalation prevention), and the 403 message kube-apiserver
//! writes. The semantics follow kube-apiserver's
//! `plugin/pkg/auth/authorizer/rbac` and `pkg/registry/rbac/validation`.

use serde_json::{json, Value};

use crate::ApiError;

/// The group every authenticated user is in.
pub const AUTHENTICATED: &str = "system:authenticated";
/// The group of requests without credentials.
pub const UNAUTHENTICATED: &str = "system:unauthenticated";
/// The user of requests without credentials.
pub const ANONYMOUS: &str = "system:anonymous";
/// The group that is allowed everything, before RBAC is asked.
pub const MASTERS: &str = "system:masters";
/// The prefix of ServiceAccount user names (`system:serviceaccount:NS:NAME`).
pub const SERVICE_ACCOUNT_PREFIX: &str = "system:serviceaccount:";

/// One rule of a Role or ClusterRole.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct PolicyRule {
    pub verbs: Vec<String>,
    pub api_groups: Vec<String>,
    pub resources: Vec<String>,
    pub resource_names: Vec<String>,
    pub non_resource_urls: Vec<String>,
}

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

impl PolicyRule {
    /// A rule as written in a Role's `rules` (`apiGroups`, `resources`, …).
    pub fn from_json(v: &Value) -> PolicyRule {
        PolicyRule {
            verbs: strings(v.get("verbs")),
            api_groups: strings(v.get("apiGroups")),
            resources: strings(v.get("resources")),
            resource_names: strings(v.get("resourceNames")),
            non_resource_urls: strings(v.get("nonResourceURLs")),
        }
    }

    /// The rules of a Role or ClusterRole object.
    pub fn rules_of(role: &Value) -> Vec<PolicyRule> {
        role.get("rules")
            .and_then(Value::as_array)
            .map(|a| a.iter().map(PolicyRule::from_json).collect())
            .unwrap_or_default()
    }

    /// The rule as JSON, leaving out empty lists as Kubernetes does.
    pub fn to_json(&self) -> Value {
        let mut m = serde_json::Map::new();
        m.insert("verbs".into(), json!(self.verbs));
        if !self.api_groups.is_empty() {
            m.insert("apiGroups".into(), json!(self.api_groups));
        }
        if !self.resources.is_empty() {
            m.insert("resources".into(), json!(self.resources));
        }
        if !self.resource_names.is_empty() {
            m.insert("resourceNames".into(), json!(self.resource_names));
        }
        if !self.non_resource_urls.is_empty() {
            m.insert("nonResourceURLs".into(), json!(self.non_resource_urls));
        }
        Value::Object(m)
    }

    /// A rule from literal lists (bootstrap policy, tests).
    pub fn new(verbs: &[&str], groups: &[&str], resources: &[&str]) -> PolicyRule {
        let own = |s: &[&str]| s.iter().map(|x| x.to_string()).collect();
        PolicyRule {
            verbs: own(verbs),
            api_groups: own(groups),
            resources: own(resources),
            ..Default::default()
        }
    }

    /// A non-resource rule from literal lists.
    pub fn urls(verbs: &[&str], urls: &[&str]) -> PolicyRule {
        let own = |s: &[&str]| s.iter().map(|x| x.to_string()).collect();
        PolicyRule {
            verbs: own(verbs),
            non_resource_urls: own(urls),
            ..Default::default()
        }
    }

    /// Kubernetes' `CompactString`: `{APIGroups:["apps"], Resources:["deployments"], Verbs:["get"]}`.
    pub fn compact_string(&self) -> String {
        let mut parts = Vec::new();
        if !self.api_groups.is_empty() {
            parts.push(format!("APIGroups:{}", go_quoted(&self.api_groups)));
        }
        if !self.resources.is_empty() {
            parts.push(format!("Resources:{}", go_quoted(&self.resources)));
        }
        if !self.non_resource_urls.is_empty() {
            parts.push(format!(
                "NonResourceURLs:{}",
                go_quoted(&self.non_resource_urls)
            ));
        }
        if !self.resource_names.is_empty() {
            parts.push(format!("ResourceNames:{}", go_quoted(&self.resource_names)));
        }
        if !self.verbs.is_empty() {
            parts.push(format!("Verbs:{}", go_quoted(&self.verbs)));
        }
        format!("{{{}}}", parts.join(", "))
    }
}

/// A string list as Go's `%q` prints a `[]string`: `["a" "b"]`.
pub fn go_quoted(v: &[String]) -> String {
    let items: Vec<String> = v.iter().map(|s| format!("{s:?}")).collect();
    format!("[{}]", items.join(" "))
}

/// What a request asks, as Kubernetes' authorizers see it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Attributes {
    pub user: String,
    pub groups: Vec<String>,
    pub verb: String,
    pub resource_request: bool,
    pub namespace: String,
    pub api_group: String,
    pub api_version: String,
    pub resource: String,
    pub subresource: String,
    pub name: String,
    /// The URL path (non-resource requests).
    pub path: String,
}

/// The verb, resource, namespace and name of a request, from its method,
/// path and query string, as kube-apiserver's `RequestInfoFactory` derives
/// them. `user` and `groups` are left empty.
pub fn request_info(method: &str, path: &str, query: Option<&str>) -> Attributes {
    let mut a = Attributes {
        path: path.to_string(),
        verb: method.to_ascii_lowercase(),
        ..Default::default()
    };
    let parts: Vec<&str> = path.trim_matches('/').split('/').collect();
    if parts.len() < 3 {
        return a;
    }
    let mut rest: &[&str] = match parts[0] {
        "api" => &parts[1..],
        "apis" => {
            if parts.len() < 4 {
                return a;
            }
            a.api_group = parts[1].to_string();
            &parts[2..]
        }
        _ => return a,
    };
    a.resource_request = true;
    a.api_version = rest[0].to_string();
    rest = &rest[1..];
    let mut special = false;
    if matches!(rest[0], "watch" | "proxy") {
        if rest.len() < 2 {
            // Kubernetes refuses such a path; nothing may match it.
            a.verb = String::new();
            return a;
        }
        a.verb = rest[0].to_string();
        special = rest[0] == "proxy";
        rest = &rest[1..];
    } else {
        a.verb = match method {
            "POST" => "create",
            "GET" | "HEAD" => "get",
            "PUT" => "update",
            "PATCH" => "patch",
            "DELETE" => "delete",
            _ => "",
        }
        .to_string();
    }
    if rest[0] == "namespaces" && rest.len() > 1 {
        a.namespace = rest[1].to_string();
        if rest.len() > 2 && !matches!(rest[2], "status" | "finalize") {
            rest = &rest[2..];
        }
    }
    if rest.len() >= 3 && !special {
        a.subresource = rest[2].to_string();
    }
    if rest.len() >= 2 {
        a.name = rest[1].to_string();
    }
    a.resource = rest[0].to_string();
    if a.name.is_empty() && a.verb == "get" {
        let q = crate::query::pairs(query.unwrap_or(""));
        let watch = q
            .iter()
            .any(|(k, v)| k == "watch" && matches!(v.as_str(), "true" | "1" | "True"));
        a.verb = if watch { "watch" } else { "list" }.to_string();
        if let Some((_, fs)) = q.iter().find(|(k, _)| k == "fieldSelector") {
            if let Some(name) = exact_name(fs) {
                a.name = name;
            }
        }
    }
    if a.name.is_empty() && a.verb == "delete" {
        a.verb = "deletecollection".into();
    }
    a
}

/// The name a field selector requires exactly (`metadata.name=x` or `==`),
/// when that is one of its requirements.
fn exact_name(fs: &str) -> Option<String> {
    fs.split(',').find_map(|req| {
        let req = req.trim();
        let (k, v) = req
            .split_once("==")
            .or_else(|| req.split_once('='))
            .filter(|(k, _)| !k.ends_with('!'))?;
        (k.trim() == "metadata.name" && valid_path_segment(v.trim())).then(|| v.trim().to_string())
    })
}

fn valid_path_segment(s: &str) -> bool {
    !s.is_empty() && s != "." && s != ".." && !s.contains('/') && !s.contains('%')
}

fn has(set: &[String], item: &str) -> bool {
    set.iter().any(|s| s == item)
}

fn verb_matches(rule: &PolicyRule, verb: &str) -> bool {
    rule.verbs.iter().any(|v| v == "*" || v == verb)
}

fn api_group_matches(rule: &PolicyRule, group: &str) -> bool {
    rule.api_groups.iter().any(|g| g == "*" || g == group)
}

/// Kubernetes' `ResourceMatches`: `*`, the exact `resource/subresource`, or
/// `*/subresource`.
fn resource_matches(rule: &PolicyRule, combined: &str, subresource: &str) -> bool {
    rule.resources.iter().any(|r| {
        if r == "*" || r == combined {
            return true;
        }
        !subresource.is_empty()
            && r.len() == subresource.len() + 2
            && r.starts_with("*/")
            && r.ends_with(subresource)
    })
}

fn resource_name_matches(rule: &PolicyRule, name: &str) -> bool {
    rule.resource_names.is_empty() || has(&rule.resource_names, name)
}

fn non_resource_url_matches(rule: &PolicyRule, path: &str) -> bool {
    rule.non_resource_urls.iter().any(|u| {
        u == "*" || u == path || (u.ends_with('*') && path.starts_with(u.trim_end_matches('*')))
    })
}

/// Whether `rule` allows the request (Kubernetes' `RuleAllows`).
pub fn rule_allows(rule: &PolicyRule, a: &Attributes) -> bool {
    if a.resource_request {
        let combined = if a.subresource.is_empty() {
            std::borrow::Cow::Borrowed(a.resource.as_str())
        } else {
            std::borrow::Cow::Owned(format!("{}/{}", a.resource, a.subresource))
        };
        verb_matches(rule, &a.verb)
            && api_group_matches(rule, &a.api_group)
            && resource_matches(rule, &combined, &a.subresource)
            && resource_name_matches(rule, &a.name)
    } else {
        verb_matches(rule, &a.verb) && non_resource_url_matches(rule, &a.path)
    }
}

/// A subject of a RoleBinding or ClusterRoleBinding.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Subject {
    pub kind: String,
    pub name: String,
    pub namespace: String,
}

impl Subject {
    pub fn from_json(v: &Value) -> Subject {
        let s = |k: &str| v.get(k).and_then(Value::as_str).unwrap_or("").to_string();
        Subject {
            kind: s("kind"),
            name: s("name"),
            namespace: s("namespace"),
        }
    }

    /// The subjects of a binding object.
    pub fn subjects_of(binding: &Value) -> Vec<Subject> {
        binding
            .get("subjects")
            .and_then(Value::as_array)
            .map(|a| a.iter().map(Subject::from_json).collect())
            .unwrap_or_default()
    }

    /// What the subject matches: a user name or a group name. A
    /// ServiceAccount is its user `system:serviceaccount:NS:NAME`, its
    /// namespace defaulting to the binding's (empty for a
    /// ClusterRoleBinding, where such a subject matches nobody).
    pub fn principal(&self, binding_namespace: &str) -> Option<Principal> {
        match self.kind.as_str() {
            "User" => Some(Principal::User(self.name.clone())),
            "Group" => Some(Principal::Group(self.name.clone())),
            "ServiceAccount" => {
                let ns = if self.namespace.is_empty() {
                    binding_namespace
                } else {
                    &self.namespace
                };
                if ns.is_empty() {
                    return None;
                }
                Some(Principal::User(service_account_user(ns, &self.name)))
            }
            _ => None,
        }
    }

    /// Whether the subject names this user or one of its groups
    /// (Kubernetes' `appliesToUser`).
    pub fn applies_to(&self, user: &str, groups: &[String], binding_namespace: &str) -> bool {
        match self.principal(binding_namespace) {
            Some(Principal::User(u)) => u == user,
            Some(Principal::Group(g)) => has(groups, &g),
            None => false,
        }
    }
}

/// A user or a group a binding grants to.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Principal {
    User(String),
    Group(String),
}

/// `system:serviceaccount:NS:NAME`.
pub fn service_account_user(namespace: &str, name: &str) -> String {
    format!("{SERVICE_ACCOUNT_PREFIX}{namespace}:{name}")
}

/// The namespace and name of a ServiceAccount user name.
pub fn split_service_account_user(user: &str) -> Option<(&str, &str)> {
    let rest = user.strip_prefix(SERVICE_ACCOUNT_PREFIX)?;
    let (ns, name) = rest.split_once(':')?;
    (!ns.is_empty() && !name.is_empty() && !name.contains(':')).then_some((ns, name))
}

/// The groups of a ServiceAccount user: `system:serviceaccounts` and
/// `system:serviceaccounts:NS` (and `system:authenticated`).
pub fn service_account_groups(namespace: &str) -> Vec<String> {
    vec![
        "system:serviceaccounts".into(),
        format!("system:serviceaccounts:{namespace}"),
        AUTHENTICATED.into(),
    ]
}

/// The message kube-apiserver's authorization filter writes when no
/// authorizer allows a request.
pub fn forbidden_message(a: &Attributes) -> String {
    if !a.resource_request {
        return format!("User {:?} cannot {} path {:?}", a.user, a.verb, a.path);
    }
    let resource = if a.subresource.is_empty() {
        a.resource.clone()
    } else {
        format!("{}/{}", a.resource, a.subresource)
    };
    if !a.namespace.is_empty() {
        format!(
            "User {:?} cannot {} resource {:?} in API group {:?} in the namespace {:?}",
            a.user, a.verb, resource, a.api_group, a.namespace
        )
    } else {
        format!(
            "User {:?} cannot {} resource {:?} in API group {:?} at the cluster scope",
            a.user, a.verb, resource, a.api_group
        )
    }
}

/// The 403 `Status` of a denied request (`NewForbidden` on the request's
/// group and resource, with the authorizer's reason if it gave one).
pub fn forbidden(a: &Attributes, reason: &str) -> ApiError {
    let mut msg = forbidden_message(a);
    if !reason.is_empty() {
        msg = format!("{msg}: {reason}");
    }
    forbidden_error(
        if a.resource_request { &a.api_group } else { "" },
        if a.resource_request { &a.resource } else { "" },
        &a.name,
        &msg,
    )
}

/// Kubernetes' `NewForbidden(groupResource, name, err)`.
pub fn forbidden_error(group: &str, resource: &str, name: &str, err: &str) -> ApiError {
    let gr = crate::error::group_resource(group, resource);
    let message = if resource.is_empty() {
        format!("forbidden: {err}")
    } else if name.is_empty() {
        format!("{gr} is forbidden: {err}")
    } else {
        format!("{gr} {name:?} is forbidden: {err}")
    };
    let mut e = ApiError::forbidden(message);
    if !resource.is_empty() {
        e.group = Some(group.to_string());
        e.kind = Some(resource.to_string());
        e.name = Some(name.to_string());
    }
    e
}

/// One rule per verb × group × resource × name, and per verb × URL
/// (Kubernetes' `BreakdownRule`).
pub fn breakdown(rule: &PolicyRule) -> Vec<PolicyRule> {
    let mut out = Vec::new();
    let one = |s: &String| vec![s.clone()];
    for g in &rule.api_groups {
        for r in &rule.resources {
            for v in &rule.verbs {
                if rule.resource_names.is_empty() {
                    out.push(PolicyRule {
                        verbs: one(v),
                        api_groups: one(g),
                        resources: one(r),
                        ..Default::default()
                    });
                } else {
                    for n in &rule.resource_names {
                        out.push(PolicyRule {
                            verbs: one(v),
                            api_groups: one(g),
                            resources: one(r),
                            resource_names: one(n),
                            ..Default::default()
                        });
                    }
                }
            }
        }
    }
    for u in &rule.non_resource_urls {
        for v in &rule.verbs {
            out.push(PolicyRule {
                verbs: one(v),
                non_resource_urls: one(u),
                ..Default::default()
            });
        }
    }
    out
}

fn has_all(set: &[String], items: &[String]) -> bool {
    items.iter().all(|i| has(set, i))
}

fn resource_covers_all(set: &[String], covers: &[String]) -> bool {
    if has(set, "*") || has_all(set, covers) {
        return true;
    }
    covers.iter().all(|path| {
        if has(set, path) {
            return true;
        }
        match path.split_once('/') {
            Some((_, sub)) => has(set, &format!("*/{sub}")),
            None => false,
        }
    })
}

fn non_resource_urls_cover_all(set: &[String], covers: &[String]) -> bool {
    covers.iter().all(|req| {
        set.iter().any(|own| {
            own == req || (own.ends_with('*') && req.starts_with(own.trim_end_matches('*')))
        })
    })
}

/// Kubernetes' `ruleCovers`.
fn rule_covers(owner: &PolicyRule, sub: &PolicyRule) -> bool {
    let verbs = has(&owner.verbs, "*") || has_all(&owner.verbs, &sub.verbs);
    let groups = has(&owner.api_groups, "*") || has_all(&owner.api_groups, &sub.api_groups);
    let resources = resource_covers_all(&owner.resources, &sub.resources);
    let urls = non_resource_urls_cover_all(&owner.non_resource_urls, &sub.non_resource_urls);
    let names = if sub.resource_names.is_empty() {
        owner.resource_names.is_empty()
    } else {
        owner.resource_names.is_empty() || has_all(&owner.resource_names, &sub.resource_names)
    };
    verbs && groups && resources && names && urls
}

/// Whether `owner` covers every rule of `requested`; the atomic rules it
/// does not cover otherwise (Kubernetes' `Covers`).
pub fn covers(owner: &[PolicyRule], requested: &[PolicyRule]) -> (bool, Vec<PolicyRule>) {
    let mut missing = Vec::new();
    for r in requested {
        for sub in breakdown(r) {
            if !owner.iter().any(|o| rule_covers(o, &sub)) {
                missing.push(sub);
            }
        }
    }
    (missing.is_empty(), missing)
}

/// Atomic rules merged back by group, resource and name: one rule per
/// resource with all its verbs (Kubernetes' `CompactRules`).
pub fn compact(rules: &[PolicyRule]) -> Vec<PolicyRule> {
    let mut out: Vec<PolicyRule> = Vec::new();
    for r in rules {
        let simple = r.api_groups.len() == 1
            && r.resources.len() == 1
            && r.resource_names.len() <= 1
            && r.non_resource_urls.is_empty();
        if simple {
            if let Some(o) = out.iter_mut().find(|o| {
                o.api_groups == r.api_groups
                    && o.resources == r.resources
                    && o.resource_names == r.resource_names
                    && o.non_resource_urls.is_empty()
            }) {
                for v in &r.verbs {
                    if !has(&o.verbs, v) {
                        o.verbs.push(v.clone());
                    }
                }
                continue;
            }
        }
        out.push(r.clone());
    }
    out
}

/// The message of an escalation refused: the user lacks `missing`.
pub fn escalation_message(user: &str, groups: &[String], missing: &[PolicyRule]) -> String {
    let mut lines: Vec<String> = compact(missing)
        .iter()
        .map(PolicyRule::compact_string)
        .collect();
    lines.sort();
    lines.dedup();
    format!(
        "user {user:?} (groups={}) is attempting to grant RBAC permissions not currently held:\n{}",
        go_quoted(groups),
        lines.join("\n")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(method: &str, path: &str, query: Option<&str>) -> Attributes {
        request_info(method, path, query)
    }

    #[test]
    fn request_info_derives_verbs_like_kube_apiserver() {
        let a = req("GET", "/api/v1/namespaces/default/pods", None);
        assert_eq!(
            (a.verb.as_str(), a.namespace.as_str(), a.resource.as_str()),
            ("list", "default", "pods")
        );
        assert!(a.resource_request);
        let a = req("GET", "/api/v1/namespaces/default/pods", Some("watch=true"));
        assert_eq!(a.verb, "watch");
        let a = req("GET", "/api/v1/watch/namespaces/default/pods", None);
        assert_eq!((a.verb.as_str(), a.resource.as_str()), ("watch", "pods"));
        let a = req("DELETE", "/apis/apps/v1/namespaces/x/deployments", None);
        assert_eq!(
            (a.verb.as_str(), a.api_group.as_str()),
            ("deletecollection", "apps")
        );
        let a = req("POST", "/api/v1/namespaces/x/pods/p/eviction", None);
        assert_eq!(
            (a.verb.as_str(), a.name.as_str(), a.subresource.as_str()),
            ("create", "p", "eviction")
        );
        let a = req("GET", "/api/v1/namespaces/team", None);
        assert_eq!(
            (
                a.verb.as_str(),
                a.namespace.as_str(),
                a.resource.as_str(),
                a.name.as_str()
            ),
            ("get", "team", "namespaces", "team")
        );
        let a = req("PUT", "/api/v1/namespaces/team/finalize", None);
        assert_eq!(
            (a.resource.as_str(), a.name.as_str(), a.subresource.as_str()),
            ("namespaces", "team", "finalize")
        );
        let a = req(
            "GET",
            "/api/v1/namespaces/d/configmaps",
            Some("fieldSelector=metadata.name%3Dc1"),
        );
        assert_eq!((a.verb.as_str(), a.name.as_str()), ("list", "c1"));
        let a = req("GET", "/api", None);
        assert!(!a.resource_request);
        assert_eq!((a.verb.as_str(), a.path.as_str()), ("get", "/api"));
        let a = req("GET", "/apis/apps/v1", None);
        assert!(!a.resource_request);
        let a = req("GET", "/api/v1/nodes/n1/proxy/stats/summary", None);
        assert_eq!(
            (a.verb.as_str(), a.name.as_str(), a.subresource.as_str()),
            ("get", "n1", "proxy")
        );
    }

    fn attrs(verb: &str, group: &str, resource: &str, sub: &str, name: &str) -> Attributes {
        Attributes {
            verb: verb.into(),
            resource_request: true,
            api_group: group.into(),
            resource: resource.into(),
            subresource: sub.into(),
            name: name.into(),
            namespace: "default".into(),
            ..Default::default()
        }
    }

    #[test]
    fn rules_match_verbs_groups_resources_subresources_and_names() {
        let pods = PolicyRule::new(&["get", "list"], &[""], &["pods"]);
        assert!(rule_allows(&pods, &attrs("get", "", "pods", "", "p")));
        assert!(!rule_allows(&pods, &attrs("delete", "", "pods", "", "p")));
        assert!(!rule_allows(&pods, &attrs("get", "apps", "pods", "", "p")));
        // A resource does not grant its subresources.
        assert!(!rule_allows(&pods, &attrs("get", "", "pods", "log", "p")));
        let logs = PolicyRule::new(&["get"], &[""], &["pods/log"]);
        assert!(rule_allows(&logs, &attrs("get", "", "pods", "log", "p")));
        assert!(!rule_allows(&logs, &attrs("get", "", "pods", "", "p")));
        let any_status = PolicyRule::new(&["update"], &["*"], &["*/status"]);
        assert!(rule_allows(
            &any_status,
            &attrs("update", "apps", "deployments", "status", "d")
        ));
        assert!(!rule_allows(
            &any_status,
            &attrs("update", "apps", "deployments", "", "d")
        ));
        let all = PolicyRule::new(&["*"], &["*"], &["*"]);
        assert!(rule_allows(&all, &attrs("escalate", "x", "y", "z", "n")));
        let mut named = PolicyRule::new(&["get"], &[""], &["configmaps"]);
        named.resource_names = vec!["mine".into()];
        assert!(rule_allows(
            &named,
            &attrs("get", "", "configmaps", "", "mine")
        ));
        assert!(!rule_allows(
            &named,
            &attrs("get", "", "configmaps", "", "other")
        ));
        // A list without a name is not allowed by a rule naming resources.
        assert!(!rule_allows(
            &named,
            &attrs("list", "", "configmaps", "", "")
        ));
    }

    #[test]
    fn non_resource_urls_match_exactly_or_by_prefix_star() {
        let r = PolicyRule::urls(&["get"], &["/healthz", "/apis/*"]);
        let mut a = request_info("GET", "/healthz", None);
        assert!(rule_allows(&r, &a));
        a = request_info("GET", "/apis/apps/v1", None);
        assert!(rule_allows(&r, &a));
        a = request_info("GET", "/api", None);
        assert!(!rule_allows(&r, &a));
        a = request_info("POST", "/healthz", None);
        assert!(!rule_allows(&r, &a));
    }

    #[test]
    fn service_account_subjects_default_to_the_binding_namespace() {
        let sa = Subject {
            kind: "ServiceAccount".into(),
            name: "builder".into(),
            namespace: String::new(),
        };
        assert!(sa.applies_to("system:serviceaccount:ci:builder", &[], "ci"));
        assert!(!sa.applies_to("system:serviceaccount:ci:builder", &[], "other"));
        assert!(!sa.applies_to("system:serviceaccount:ci:builder", &[], ""));
        let g = Subject {
            kind: "Group".into(),
            name: "devs".into(),
            namespace: String::new(),
        };
        assert!(g.applies_to("jane", &["devs".into()], ""));
        assert!(!g.applies_to("devs", &[], ""));
        assert_eq!(
            split_service_account_user("system:serviceaccount:ci:builder"),
            Some(("ci", "builder"))
        );
        assert_eq!(split_service_account_user("system:serviceaccount:ci"), None);
    }

    #[test]
    fn forbidden_messages_are_worded_as_kube_apiserver_words_them() {
        let mut a = request_info("GET", "/api/v1/namespaces/default/pods", None);
        a.user = "jane".into();
        let e = forbidden(&a, "");
        assert_eq!(e.code, 403);
        assert_eq!(
            e.message,
            r#"pods is forbidden: User "jane" cannot list resource "pods" in API group "" in the namespace "default""#
        );
        let mut a = request_info("DELETE", "/apis/apps/v1/namespaces/x/deployments/web", None);
        a.user = "jane".into();
        assert_eq!(
            forbidden(&a, "").message,
            r#"deployments.apps "web" is forbidden: User "jane" cannot delete resource "deployments" in API group "apps" in the namespace "x""#
        );
        let mut a = request_info("GET", "/api/v1/nodes", None);
        a.user = "jane".into();
        assert_eq!(
            forbidden(&a, "").message,
            r#"nodes is forbidden: User "jane" cannot list resource "nodes" in API group "" at the cluster scope"#
        );
        let mut a = request_info("GET", "/api", None);
        a.user = "system:anonymous".into();
        assert_eq!(
            forbidden(&a, "").message,
            r#"forbidden: User "system:anonymous" cannot get path "/api""#
        );
    }

    #[test]
    fn covers_finds_the_rights_an_owner_lacks() {
        let owner = vec![
            PolicyRule::new(&["get", "list"], &[""], &["pods", "configmaps"]),
            PolicyRule::new(&["update"], &["*"], &["*/status"]),
        ];
        assert!(covers(&owner, &[PolicyRule::new(&["get"], &[""], &["pods"])]).0);
        assert!(
            covers(
                &owner,
                &[PolicyRule::new(
                    &["update"],
                    &["apps"],
                    &["deployments/status"]
                )]
            )
            .0
        );
        let (ok, missing) = covers(
            &owner,
            &[PolicyRule::new(
                &["get", "delete"],
                &[""],
                &["pods", "secrets"],
            )],
        );
        assert!(!ok);
        assert_eq!(missing.len(), 3);
        let msg = escalation_message("jane", &["system:authenticated".into()], &missing);
        assert_eq!(
            msg,
            "user \"jane\" (groups=[\"system:authenticated\"]) is attempting to grant RBAC permissions not currently held:\n{APIGroups:[\"\"], Resources:[\"pods\"], Verbs:[\"delete\"]}\n{APIGroups:[\"\"], Resources:[\"secrets\"], Verbs:[\"get\" \"delete\"]}"
        );
        // A named rule is covered by an unnamed one, not the other way round.
        let mut named = PolicyRule::new(&["get"], &[""], &["pods"]);
        named.resource_names = vec!["a".into()];
        assert!(covers(&owner, std::slice::from_ref(&named)).0);
        assert!(!covers(&[named], &[PolicyRule::new(&["get"], &[""], &["pods"])]).0);
        let star = vec![PolicyRule::urls(&["get"], &["/apis/*"])];
        assert!(covers(&star, &[PolicyRule::urls(&["get"], &["/apis/apps"])]).0);
        assert!(!covers(&star, &[PolicyRule::urls(&["get"], &["/api"])]).0);
    }
}
