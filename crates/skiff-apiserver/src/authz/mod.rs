//! Authorization: `system:masters` first (kube-apiserver's privileged-group
//! authorizer), then the Node authorizer (`node.rs`) for node identities,
//! then RBAC over the Roles, ClusterRoles and bindings of the watch cache.
//!
//! The bindings are indexed by the user or group they name, and the index
//! is rebuilt only when one of the four RBAC resources changed (the caches'
//! revisions say so), so a request looks up its own subjects instead of
//! scanning every binding.

pub mod escalation;
pub mod node;
pub mod reviews;

use std::collections::HashMap;
use std::sync::{Arc, Mutex, RwLock};

use serde_json::Value;
use skiff_core::rbac::{self, Attributes, PolicyRule, Principal, Subject};
use skiff_core::resources::{self, ResourceInfo};

use crate::auth::Identity;
use crate::watchcache::{Filter, WatchCache};

/// Where a grant came from, for rules reviews and debugging.
#[derive(Debug, Clone)]
struct Grant {
    rules: Arc<Vec<PolicyRule>>,
}

/// Bindings by the principal they name.
#[derive(Default)]
struct Index {
    revisions: [i64; 4],
    roles: HashMap<String, HashMap<String, Arc<Vec<PolicyRule>>>>,
    cluster_roles: HashMap<String, Arc<Vec<PolicyRule>>>,
    /// ClusterRoleBindings.
    cluster: Grants,
    /// RoleBindings, by namespace.
    namespaced: HashMap<String, Grants>,
}

/// Grants by user and by group name (looked up by `&str`, no allocation).
#[derive(Default)]
struct Grants {
    users: HashMap<String, Vec<Grant>>,
    groups: HashMap<String, Vec<Grant>>,
}

impl Grants {
    fn add(&mut self, p: Principal, g: Grant) {
        match p {
            Principal::User(u) => self.users.entry(u).or_default().push(g),
            Principal::Group(n) => self.groups.entry(n).or_default().push(g),
        }
    }

    /// The grants to `user` or any of `groups`.
    fn of<'a>(&'a self, user: &str, groups: &'a [String]) -> impl Iterator<Item = &'a Grant> {
        self.users
            .get(user)
            .into_iter()
            .chain(groups.iter().filter_map(|g| self.groups.get(g)))
            .flatten()
    }
}

/// The RBAC resources, in the index's revision order.
fn rbac_resources() -> [&'static ResourceInfo; 4] {
    let g = "rbac.authorization.k8s.io";
    [
        resources::lookup(g, "v1", "roles").expect("roles"),
        resources::lookup(g, "v1", "clusterroles").expect("clusterroles"),
        resources::lookup(g, "v1", "rolebindings").expect("rolebindings"),
        resources::lookup(g, "v1", "clusterrolebindings").expect("clusterrolebindings"),
    ]
}

/// The authorizer every request goes through.
pub struct Authorizer {
    cache: Arc<WatchCache>,
    index: RwLock<Arc<Index>>,
    rebuilding: Mutex<()>,
    node: node::NodeAuthorizer,
}

impl Authorizer {
    pub fn new(cache: Arc<WatchCache>) -> Authorizer {
        Authorizer {
            node: node::NodeAuthorizer::new(cache.clone()),
            cache,
            index: RwLock::new(Arc::new(Index {
                revisions: [-1; 4],
                ..Default::default()
            })),
            rebuilding: Mutex::new(()),
        }
    }

    fn revisions(&self) -> [i64; 4] {
        rbac_resources().map(|r| self.cache.resource(r).last_revision())
    }

    /// The index as of the caches' current RBAC objects.
    fn current(&self) -> Arc<Index> {
        let revs = self.revisions();
        {
            let idx = self.index.read().unwrap_or_else(|e| e.into_inner());
            if idx.revisions == revs {
                return idx.clone();
            }
        }
        let _one = self.rebuilding.lock().unwrap_or_else(|e| e.into_inner());
        let revs = self.revisions();
        {
            let idx = self.index.read().unwrap_or_else(|e| e.into_inner());
            if idx.revisions == revs {
                return idx.clone();
            }
        }
        let built = Arc::new(self.build(revs));
        *self.index.write().unwrap_or_else(|e| e.into_inner()) = built.clone();
        built
    }

    fn build(&self, revisions: [i64; 4]) -> Index {
        let [roles_res, cluster_roles_res, rb_res, crb_res] = rbac_resources();
        let objects = |res: &ResourceInfo| -> Vec<Arc<Value>> {
            self.cache
                .resource(res)
                .snapshot(&Filter::default())
                .iter()
                .filter_map(|o| o.value())
                .collect()
        };
        let mut idx = Index {
            revisions,
            ..Default::default()
        };
        for role in objects(roles_res) {
            idx.roles
                .entry(meta(&role, "namespace"))
                .or_default()
                .insert(meta(&role, "name"), Arc::new(PolicyRule::rules_of(&role)));
        }
        for role in objects(cluster_roles_res) {
            idx.cluster_roles
                .insert(meta(&role, "name"), Arc::new(PolicyRule::rules_of(&role)));
        }
        let empty = Arc::new(Vec::new());
        for b in objects(crb_res) {
            let rules = role_ref(&b)
                .filter(|(kind, _)| kind == "ClusterRole")
                .and_then(|(_, name)| idx.cluster_roles.get(&name).cloned())
                .unwrap_or_else(|| empty.clone());
            for s in Subject::subjects_of(&b) {
                if let Some(p) = s.principal("") {
                    idx.cluster.add(
                        p,
                        Grant {
                            rules: rules.clone(),
                        },
                    );
                }
            }
        }
        for b in objects(rb_res) {
            let ns = meta(&b, "namespace");
            let rules = match role_ref(&b) {
                Some((kind, name)) if kind == "ClusterRole" => {
                    idx.cluster_roles.get(&name).cloned()
                }
                Some((kind, name)) if kind == "Role" => {
                    idx.roles.get(&ns).and_then(|m| m.get(&name)).cloned()
                }
                _ => None,
            }
            .unwrap_or_else(|| empty.clone());
            for s in Subject::subjects_of(&b) {
                if let Some(p) = s.principal(&ns) {
                    idx.namespaced.entry(ns.clone()).or_default().add(
                        p,
                        Grant {
                            rules: rules.clone(),
                        },
                    );
                }
            }
        }
        idx
    }

    /// Whether `a` (with its user and groups) is allowed.
    pub fn authorize(&self, a: &Attributes) -> bool {
        if a.groups.iter().any(|g| g == rbac::MASTERS) {
            return true;
        }
        if self.node.authorize(a) == node::Decision::Allow {
            return true;
        }
        let idx = self.current();
        let allows = |grants: &Grants| {
            grants
                .of(&a.user, &a.groups)
                .any(|g| g.rules.iter().any(|r| rbac::rule_allows(r, a)))
        };
        if allows(&idx.cluster) {
            return true;
        }
        if a.namespace.is_empty() {
            return false;
        }
        idx.namespaced.get(&a.namespace).is_some_and(allows)
    }

    /// Why a denied request was denied, for its 403 (the Node
    /// authorizer's reason for a node; empty otherwise).
    pub fn reason(&self, a: &Attributes) -> String {
        match self.node.authorize(a) {
            node::Decision::NoOpinion(why) => why,
            node::Decision::Allow => String::new(),
        }
    }

    /// Every rule granted to `user` with `groups` cluster-wide and, if
    /// `namespace` is not empty, in that namespace (Kubernetes'
    /// `RulesFor`). `system:masters` gets cluster-admin's rules.
    pub fn rules_for(&self, user: &str, groups: &[String], namespace: &str) -> Vec<PolicyRule> {
        if groups.iter().any(|g| g == rbac::MASTERS) {
            return vec![
                PolicyRule::new(&["*"], &["*"], &["*"]),
                PolicyRule::urls(&["*"], &["*"]),
            ];
        }
        let idx = self.current();
        let mut out: Vec<PolicyRule> = Vec::new();
        let mut push = |grants: &Grants| {
            for g in grants.of(user, groups) {
                for r in g.rules.iter() {
                    if !out.contains(r) {
                        out.push(r.clone());
                    }
                }
            }
        };
        push(&idx.cluster);
        if !namespace.is_empty() {
            if let Some(m) = idx.namespaced.get(namespace) {
                push(m);
            }
        }
        out
    }

    /// The rules a binding's roleRef names (`None` if the role does not exist).
    pub fn role_ref_rules(
        &self,
        kind: &str,
        name: &str,
        namespace: &str,
    ) -> Option<Vec<PolicyRule>> {
        let idx = self.current();
        match kind {
            "ClusterRole" => idx.cluster_roles.get(name).map(|r| (**r).clone()),
            "Role" => idx
                .roles
                .get(namespace)
                .and_then(|m| m.get(name))
                .map(|r| (**r).clone()),
            _ => None,
        }
    }

    /// Whether `who` may make the request `a` names (user and groups filled in).
    pub fn allows(&self, who: &Identity, mut a: Attributes) -> bool {
        a.user = who.user.clone();
        a.groups = who.groups.clone();
        self.authorize(&a)
    }
}

fn meta(v: &Value, field: &str) -> String {
    v.pointer(&format!("/metadata/{field}"))
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_string()
}

fn role_ref(binding: &Value) -> Option<(String, String)> {
    let r = binding.get("roleRef")?;
    Some((
        r.get("kind")?.as_str()?.to_string(),
        r.get("name")?.as_str()?.to_string(),
    ))
}

/// Attributes of a resource request made on the caller's behalf (reviews,
/// escalation checks).
pub fn resource_attributes(
    verb: &str,
    group: &str,
    resource: &str,
    subresource: &str,
    namespace: &str,
    name: &str,
) -> Attributes {
    Attributes {
        verb: verb.into(),
        resource_request: true,
        api_group: group.into(),
        resource: resource.into(),
        subresource: subresource.into(),
        namespace: namespace.into(),
        name: name.into(),
        ..Default::default()
    }
}
