//! RBAC through the router: what users other than `system:masters` may do,
//! the bootstrap policy, escalation prevention, the access reviews and
//! impersonation, with Kubernetes' status codes and messages.

use std::sync::Arc;
use std::time::Duration;

use axum::http::StatusCode;
use axum::Router;
use serde_json::{json, Value};
use skiff_apiserver::auth::Identity;
use skiff_apiserver::ApiServer;
use skiff_store::{RedbStore, Store};

mod common;
use common::call_with;

struct Cluster {
    server: ApiServer,
    admin: Router,
    _dir: tempfile::TempDir,
}

async fn cluster() -> Cluster {
    let dir = tempfile::tempdir().unwrap();
    let store: Arc<dyn Store> =
        RedbStore::open(&dir.path().join("s.redb"), Default::default()).unwrap();
    let server = ApiServer::start(store, Default::default()).await.unwrap();
    let admin = server.in_process_router("admin");
    Cluster {
        server,
        admin,
        _dir: dir,
    }
}

fn user(name: &str, groups: &[&str]) -> Identity {
    Identity::new(name, groups.iter().map(|g| g.to_string()).collect())
}

async fn call(r: &Router, method: &str, path: &str, body: Option<Value>) -> (StatusCode, Value) {
    call_with(r, method, path, body, &[]).await
}

impl Cluster {
    fn as_user(&self, id: Identity) -> Router {
        self.server.router_as(id)
    }

    async fn create(&self, path: &str, v: Value) {
        let (s, b) = call(&self.admin, "POST", path, Some(v)).await;
        assert_eq!(s, StatusCode::CREATED, "{b}");
    }

    /// Waits (bounded) until `id` gets `want` for GET `path`: the
    /// authorizer reads the watch cache, which follows the store.
    async fn wait_status(&self, id: &Identity, path: &str, want: StatusCode) {
        let r = self.as_user(id.clone());
        for _ in 0..100 {
            if call(&r, "GET", path, None).await.0 == want {
                return;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        panic!("{path} never answered {want} for {}", id.user);
    }
}

fn role(ns: &str, name: &str, rules: Value) -> Value {
    json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
        "metadata": {"name": name, "namespace": ns}, "rules": rules})
}

fn role_binding(ns: &str, name: &str, kind: &str, role: &str, subjects: Value) -> Value {
    json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
        "metadata": {"name": name, "namespace": ns},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": kind, "name": role},
        "subjects": subjects})
}

const RB: &str = "/apis/rbac.authorization.k8s.io/v1";

#[tokio::test]
async fn a_user_without_bindings_is_forbidden_with_kube_apiservers_message() {
    let c = cluster().await;
    let jane = c.as_user(user("jane", &[]));
    let (s, b) = call(&jane, "GET", "/api/v1/namespaces/default/pods", None).await;
    assert_eq!(s, StatusCode::FORBIDDEN);
    assert_eq!(b["kind"], "Status");
    assert_eq!(b["reason"], "Forbidden");
    assert_eq!(b["code"], 403);
    assert_eq!(
        b["message"],
        r#"pods is forbidden: User "jane" cannot list resource "pods" in API group "" in the namespace "default""#
    );
    assert_eq!(b["details"]["kind"], "pods");
    let (s, b) = call(
        &jane,
        "DELETE",
        "/apis/apps/v1/namespaces/default/deployments/web",
        None,
    )
    .await;
    assert_eq!(s, StatusCode::FORBIDDEN);
    assert_eq!(
        b["message"],
        r#"deployments.apps "web" is forbidden: User "jane" cannot delete resource "deployments" in API group "apps" in the namespace "default""#
    );
    // Discovery and the basic reviews come from the bootstrap policy.
    assert_eq!(call(&jane, "GET", "/api", None).await.0, StatusCode::OK);
    assert_eq!(
        call(&jane, "GET", "/apis/apps/v1", None).await.0,
        StatusCode::OK
    );
    assert_eq!(call(&jane, "GET", "/version", None).await.0, StatusCode::OK);
    // A denied write changes nothing.
    let cm = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "x"}});
    let (s, _) = call(
        &jane,
        "POST",
        "/api/v1/namespaces/default/configmaps",
        Some(cm),
    )
    .await;
    assert_eq!(s, StatusCode::FORBIDDEN);
    let (s, _) = call(
        &c.admin,
        "GET",
        "/api/v1/namespaces/default/configmaps/x",
        None,
    )
    .await;
    assert_eq!(s, StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn anonymous_requests_get_only_public_info() {
    let c = cluster().await;
    let anon = c.server.router();
    for path in ["/healthz", "/livez", "/readyz", "/version"] {
        assert_eq!(
            call(&anon, "GET", path, None).await.0,
            StatusCode::OK,
            "{path}"
        );
    }
    let (s, b) = call(&anon, "GET", "/api", None).await;
    assert_eq!(s, StatusCode::FORBIDDEN);
    assert_eq!(
        b["message"],
        r#"forbidden: User "system:anonymous" cannot get path "/api""#
    );
    let (s, b) = call(&anon, "GET", "/api/v1/namespaces/default/pods", None).await;
    assert_eq!(s, StatusCode::FORBIDDEN);
    assert_eq!(
        b["message"],
        r#"pods is forbidden: User "system:anonymous" cannot list resource "pods" in API group "" in the namespace "default""#
    );
    // A bearer token that proves nothing is 401, not anonymous.
    let (s, b) = call_with(
        &anon,
        "GET",
        "/version",
        None,
        &[("authorization", "Bearer nonsense")],
    )
    .await;
    assert_eq!(s, StatusCode::UNAUTHORIZED);
    assert_eq!(b["reason"], "Unauthorized");
}

#[tokio::test]
async fn a_role_binding_grants_one_namespace_resource_names_and_subresources() {
    let c = cluster().await;
    c.create(
        "/api/v1/namespaces",
        json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "team"}}),
    )
    .await;
    c.create(
        &format!("{RB}/namespaces/team/roles"),
        role("team", "reader", json!([
            {"apiGroups": [""], "resources": ["pods", "pods/log"], "verbs": ["get", "list", "watch"]},
            {"apiGroups": [""], "resources": ["configmaps"], "resourceNames": ["settings"], "verbs": ["get"]},
        ])),
    )
    .await;
    c.create(
        &format!("{RB}/namespaces/team/rolebindings"),
        role_binding(
            "team",
            "jane-reads",
            "Role",
            "reader",
            json!([{"kind": "User", "name": "jane", "apiGroup": "rbac.authorization.k8s.io"}]),
        ),
    )
    .await;
    let jane_id = user("jane", &[]);
    c.wait_status(&jane_id, "/api/v1/namespaces/team/pods", StatusCode::OK)
        .await;
    let jane = c.as_user(jane_id);
    assert_eq!(
        call(&jane, "GET", "/api/v1/namespaces/default/pods", None)
            .await
            .0,
        StatusCode::FORBIDDEN
    );
    assert_eq!(
        call(&jane, "GET", "/api/v1/pods", None).await.0,
        StatusCode::FORBIDDEN
    );
    assert_eq!(
        call(&jane, "GET", "/api/v1/namespaces/team/pods/p/log", None)
            .await
            .0,
        StatusCode::NOT_FOUND
    );
    assert_eq!(
        call(&jane, "DELETE", "/api/v1/namespaces/team/pods/p", None)
            .await
            .0,
        StatusCode::FORBIDDEN
    );
    // resourceNames: one ConfigMap, not the others, and no list.
    assert_eq!(
        call(
            &jane,
            "GET",
            "/api/v1/namespaces/team/configmaps/settings",
            None
        )
        .await
        .0,
        StatusCode::NOT_FOUND
    );
    assert_eq!(
        call(
            &jane,
            "GET",
            "/api/v1/namespaces/team/configmaps/other",
            None
        )
        .await
        .0,
        StatusCode::FORBIDDEN
    );
    assert_eq!(
        call(&jane, "GET", "/api/v1/namespaces/team/configmaps", None)
            .await
            .0,
        StatusCode::FORBIDDEN
    );
    // Another user and a group binding.
    let bob = user("bob", &["devs"]);
    assert_eq!(
        call(
            &c.as_user(bob.clone()),
            "GET",
            "/api/v1/namespaces/team/pods",
            None
        )
        .await
        .0,
        StatusCode::FORBIDDEN
    );
    c.create(
        &format!("{RB}/namespaces/team/rolebindings"),
        role_binding(
            "team",
            "devs-view",
            "ClusterRole",
            "system:aggregate-to-view",
            json!([{"kind": "Group", "name": "devs", "apiGroup": "rbac.authorization.k8s.io"}]),
        ),
    )
    .await;
    c.wait_status(&bob, "/api/v1/namespaces/team/pods", StatusCode::OK)
        .await;
    // Deleting the binding takes the right away again.
    let (s, _) = call(
        &c.admin,
        "DELETE",
        &format!("{RB}/namespaces/team/rolebindings/devs-view"),
        None,
    )
    .await;
    assert_eq!(s, StatusCode::OK);
    c.wait_status(&bob, "/api/v1/namespaces/team/pods", StatusCode::FORBIDDEN)
        .await;
}

#[tokio::test]
async fn service_account_subjects_and_cluster_role_bindings() {
    let c = cluster().await;
    let sa = Identity::new(
        "system:serviceaccount:default:builder",
        vec![
            "system:serviceaccounts".into(),
            "system:serviceaccounts:default".into(),
        ],
    );
    assert_eq!(
        call(&c.as_user(sa.clone()), "GET", "/api/v1/nodes", None)
            .await
            .0,
        StatusCode::FORBIDDEN
    );
    c.create(
        &format!("{RB}/clusterroles"),
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": {"name": "node-reader"},
            "rules": [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["list"]}]}),
    )
    .await;
    c.create(
        &format!("{RB}/clusterrolebindings"),
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding", "metadata": {"name": "builder-nodes"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "node-reader"},
            "subjects": [{"kind": "ServiceAccount", "name": "builder", "namespace": "default"}]}),
    )
    .await;
    c.wait_status(&sa, "/api/v1/nodes", StatusCode::OK).await;
}

#[tokio::test]
async fn the_bootstrap_policy_is_there_and_reconciled_at_start() {
    let c = cluster().await;
    let admin = &c.admin;
    for name in [
        "cluster-admin",
        "admin",
        "edit",
        "view",
        "system:discovery",
        "system:basic-user",
        "system:public-info-viewer",
    ] {
        let (s, b) = call(admin, "GET", &format!("{RB}/clusterroles/{name}"), None).await;
        assert_eq!(s, StatusCode::OK, "{name}: {b}");
        assert_eq!(
            b["metadata"]["labels"]["kubernetes.io/bootstrapping"],
            "rbac-defaults"
        );
    }
    let (_, view) = call(admin, "GET", &format!("{RB}/clusterroles/view"), None).await;
    assert_eq!(
        view["metadata"]["labels"]["rbac.authorization.k8s.io/aggregate-to-edit"],
        "true"
    );
    // A user removes a rule from system:basic-user ...
    let (_, mut basic) = call(
        admin,
        "GET",
        &format!("{RB}/clusterroles/system:basic-user"),
        None,
    )
    .await;
    basic["rules"] = json!([]);
    let (s, _) = call(
        admin,
        "PUT",
        &format!("{RB}/clusterroles/system:basic-user"),
        Some(basic),
    )
    .await;
    assert_eq!(s, StatusCode::OK);
    // ... and opts system:discovery out of reconciliation.
    let (_, mut disc) = call(
        admin,
        "GET",
        &format!("{RB}/clusterroles/system:discovery"),
        None,
    )
    .await;
    disc["rules"] = json!([]);
    disc["metadata"]["annotations"]["rbac.authorization.kubernetes.io/autoupdate"] = json!("false");
    let (s, _) = call(
        admin,
        "PUT",
        &format!("{RB}/clusterroles/system:discovery"),
        Some(disc),
    )
    .await;
    assert_eq!(s, StatusCode::OK);
    // What the next start does: the rule comes back, the opted-out role stays.
    skiff_apiserver::lifecycle::bootstrap(&c.server.state.registry)
        .await
        .unwrap();
    let (_, basic) = call(
        admin,
        "GET",
        &format!("{RB}/clusterroles/system:basic-user"),
        None,
    )
    .await;
    assert_eq!(basic["rules"].as_array().unwrap().len(), 2, "{basic}");
    let (_, disc) = call(
        admin,
        "GET",
        &format!("{RB}/clusterroles/system:discovery"),
        None,
    )
    .await;
    assert_eq!(disc["rules"], json!([]));
}

#[tokio::test]
async fn escalation_is_refused_unless_the_user_holds_the_rights_or_may_escalate_or_bind() {
    let c = cluster().await;
    // jane may manage Roles and RoleBindings in default and read pods there.
    c.create(
        &format!("{RB}/namespaces/default/roles"),
        role("default", "rbac-manager", json!([
            {"apiGroups": ["rbac.authorization.k8s.io"], "resources": ["roles", "rolebindings"], "verbs": ["create", "update", "get"]},
            {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list"]},
        ])),
    )
    .await;
    c.create(
        &format!("{RB}/namespaces/default/rolebindings"),
        role_binding(
            "default",
            "jane",
            "Role",
            "rbac-manager",
            json!([{"kind": "User", "name": "jane"}]),
        ),
    )
    .await;
    let jane_id = user("jane", &[]);
    c.wait_status(&jane_id, "/api/v1/namespaces/default/pods", StatusCode::OK)
        .await;
    let jane = c.as_user(jane_id);
    // A Role with rights she holds: fine.
    let (s, b) = call(
        &jane,
        "POST",
        &format!("{RB}/namespaces/default/roles"),
        Some(role(
            "default",
            "pod-reader",
            json!([{"apiGroups": [""], "resources": ["pods"], "verbs": ["get"]}]),
        )),
    )
    .await;
    assert_eq!(s, StatusCode::CREATED, "{b}");
    // A Role with rights she lacks: 403, nothing created.
    let (s, b) = call(
        &jane,
        "POST",
        &format!("{RB}/namespaces/default/roles"),
        Some(role(
            "default",
            "secret-reader",
            json!([{"apiGroups": [""], "resources": ["secrets"], "verbs": ["get", "list"]}]),
        )),
    )
    .await;
    assert_eq!(s, StatusCode::FORBIDDEN, "{b}");
    assert_eq!(
        b["message"],
        "roles.rbac.authorization.k8s.io \"secret-reader\" is forbidden: user \"jane\" (groups=[\"system:authenticated\"]) is attempting to grant RBAC permissions not currently held:\n{APIGroups:[\"\"], Resources:[\"secrets\"], Verbs:[\"get\" \"list\"]}"
    );
    assert_eq!(
        call(
            &c.admin,
            "GET",
            &format!("{RB}/namespaces/default/roles/secret-reader"),
            None
        )
        .await
        .0,
        StatusCode::NOT_FOUND
    );
    // Binding cluster-admin: refused; binding a role she covers: fine.
    let (s, b) = call(
        &jane,
        "POST",
        &format!("{RB}/namespaces/default/rolebindings"),
        Some(role_binding(
            "default",
            "bob-admin",
            "ClusterRole",
            "cluster-admin",
            json!([{"kind": "User", "name": "bob"}]),
        )),
    )
    .await;
    assert_eq!(s, StatusCode::FORBIDDEN, "{b}");
    assert!(
        b["message"].as_str().unwrap().starts_with(
            "rolebindings.rbac.authorization.k8s.io \"bob-admin\" is forbidden: user \"jane\""
        ),
        "{b}"
    );
    let (s, b) = call(
        &jane,
        "POST",
        &format!("{RB}/namespaces/default/rolebindings"),
        Some(role_binding(
            "default",
            "bob-pods",
            "Role",
            "pod-reader",
            json!([{"kind": "User", "name": "bob"}]),
        )),
    )
    .await;
    assert_eq!(s, StatusCode::CREATED, "{b}");
    // With `bind` on cluster-admin (in this namespace) she may bind it.
    c.create(
        &format!("{RB}/namespaces/default/roles"),
        role("default", "binder", json!([{"apiGroups": ["rbac.authorization.k8s.io"], "resources": ["clusterroles"], "verbs": ["bind"], "resourceNames": ["cluster-admin"]}])),
    )
    .await;
    c.create(
        &format!("{RB}/namespaces/default/rolebindings"),
        role_binding(
            "default",
            "jane-binder",
            "Role",
            "binder",
            json!([{"kind": "User", "name": "jane"}]),
        ),
    )
    .await;
    let mut ok = false;
    for _ in 0..100 {
        let (s, _) = call(
            &jane,
            "POST",
            &format!("{RB}/namespaces/default/rolebindings"),
            Some(role_binding(
                "default",
                "bob-admin",
                "ClusterRole",
                "cluster-admin",
                json!([{"kind": "User", "name": "bob"}]),
            )),
        )
        .await;
        if s == StatusCode::CREATED {
            ok = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(ok, "bind did not allow the binding");
}

async fn review(r: &Router, path: &str, body: Value) -> Value {
    let (s, b) = call(r, "POST", path, Some(body)).await;
    assert_eq!(s, StatusCode::CREATED, "{b}");
    b["status"].clone()
}

#[tokio::test]
async fn access_reviews_answer_per_rbac() {
    let c = cluster().await;
    c.create(
        &format!("{RB}/namespaces/default/rolebindings"),
        role_binding(
            "default",
            "jane-view",
            "ClusterRole",
            "system:aggregate-to-view",
            json!([{"kind": "User", "name": "jane"}]),
        ),
    )
    .await;
    let jane_id = user("jane", &[]);
    c.wait_status(&jane_id, "/api/v1/namespaces/default/pods", StatusCode::OK)
        .await;
    let jane = c.as_user(jane_id);
    let ssar = |verb: &str, res: &str, ns: &str| {
        json!({"apiVersion": "authorization.k8s.io/v1", "kind": "SelfSubjectAccessReview",
            "spec": {"resourceAttributes": {"verb": verb, "resource": res, "namespace": ns}}})
    };
    let ssar_path = "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews";
    assert_eq!(
        review(&jane, ssar_path, ssar("list", "pods", "default")).await["allowed"],
        true
    );
    assert_eq!(
        review(&jane, ssar_path, ssar("list", "pods", "kube-system")).await["allowed"],
        false
    );
    assert_eq!(
        review(&jane, ssar_path, ssar("delete", "pods", "default")).await["allowed"],
        false
    );
    assert_eq!(
        review(&c.admin, ssar_path, ssar("delete", "pods", "default")).await["allowed"],
        true
    );
    // SubjectAccessReview needs its own right; the admin asks about jane.
    let sar = json!({"apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview",
        "spec": {"user": "jane", "resourceAttributes": {"verb": "get", "resource": "pods", "namespace": "default"}}});
    let path = "/apis/authorization.k8s.io/v1/subjectaccessreviews";
    assert_eq!(review(&c.admin, path, sar.clone()).await["allowed"], true);
    assert_eq!(
        call(&jane, "POST", path, Some(sar)).await.0,
        StatusCode::FORBIDDEN
    );
    let lsar = json!({"apiVersion": "authorization.k8s.io/v1", "kind": "LocalSubjectAccessReview",
        "metadata": {"namespace": "default"},
        "spec": {"user": "jane", "resourceAttributes": {"verb": "list", "resource": "pods", "namespace": "default"}}});
    let lpath = "/apis/authorization.k8s.io/v1/namespaces/default/localsubjectaccessreviews";
    assert_eq!(review(&c.admin, lpath, lsar).await["allowed"], true);
    // Rules review: the namespace's rules plus the cluster-wide ones.
    let rules = review(&jane, "/apis/authorization.k8s.io/v1/selfsubjectrulesreviews",
        json!({"apiVersion": "authorization.k8s.io/v1", "kind": "SelfSubjectRulesReview", "spec": {"namespace": "default"}})).await;
    let rr = rules["resourceRules"].as_array().unwrap();
    assert!(
        rr.iter().any(
            |r| r["resources"].as_array().unwrap().contains(&json!("pods"))
                && r["verbs"].as_array().unwrap().contains(&json!("list"))
        ),
        "{rules}"
    );
    assert!(
        rr.iter().any(|r| r["resources"]
            .as_array()
            .unwrap()
            .contains(&json!("selfsubjectaccessreviews"))),
        "{rules}"
    );
    assert!(
        rules["nonResourceRules"]
            .as_array()
            .unwrap()
            .iter()
            .any(|r| r["nonResourceURLs"]
                .as_array()
                .unwrap()
                .contains(&json!("/api"))),
        "{rules}"
    );
    let other = review(&jane, "/apis/authorization.k8s.io/v1/selfsubjectrulesreviews",
        json!({"apiVersion": "authorization.k8s.io/v1", "kind": "SelfSubjectRulesReview", "spec": {"namespace": "kube-system"}})).await;
    assert!(
        !other["resourceRules"]
            .as_array()
            .unwrap()
            .iter()
            .any(|r| r["resources"].as_array().unwrap().contains(&json!("pods"))),
        "{other}"
    );
    let who = review(
        &jane,
        "/apis/authentication.k8s.io/v1/selfsubjectreviews",
        json!({"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"}),
    )
    .await;
    assert_eq!(who["userInfo"]["username"], "jane");
    assert_eq!(who["userInfo"]["groups"], json!(["system:authenticated"]));
}

#[tokio::test]
async fn impersonation_needs_the_impersonate_verb() {
    let c = cluster().await;
    c.create(
        &format!("{RB}/namespaces/default/rolebindings"),
        role_binding(
            "default",
            "bob-view",
            "ClusterRole",
            "system:aggregate-to-view",
            json!([{"kind": "User", "name": "bob"}]),
        ),
    )
    .await;
    let jane = c.as_user(user("jane", &[]));
    let (s, b) = call_with(
        &jane,
        "GET",
        "/api/v1/namespaces/default/pods",
        None,
        &[("impersonate-user", "bob")],
    )
    .await;
    assert_eq!(s, StatusCode::FORBIDDEN);
    assert_eq!(
        b["message"],
        r#"users "bob" is forbidden: User "jane" cannot impersonate resource "users" in API group "" at the cluster scope"#
    );
    // The admin may impersonate anyone; as bob the request gets bob's rights.
    let mut ok = false;
    for _ in 0..100 {
        let (s, _) = call_with(
            &c.admin,
            "GET",
            "/api/v1/namespaces/default/pods",
            None,
            &[("impersonate-user", "bob")],
        )
        .await;
        if s == StatusCode::OK {
            ok = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(ok);
    let (s, b) = call_with(
        &c.admin,
        "GET",
        "/api/v1/namespaces/kube-system/pods",
        None,
        &[("impersonate-user", "bob")],
    )
    .await;
    assert_eq!(s, StatusCode::FORBIDDEN);
    assert!(
        b["message"]
            .as_str()
            .unwrap()
            .contains(r#"User "bob" cannot list"#),
        "{b}"
    );
    // Impersonated groups count, and whoami says who the request acts as.
    let (s, b) = call_with(
        &c.admin,
        "POST",
        "/apis/authentication.k8s.io/v1/selfsubjectreviews",
        Some(json!({"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"})),
        &[("impersonate-user", "carol"), ("impersonate-group", "devs")],
    )
    .await;
    assert_eq!(s, StatusCode::CREATED);
    assert_eq!(b["status"]["userInfo"]["username"], "carol");
    assert_eq!(
        b["status"]["userInfo"]["groups"],
        json!(["devs", "system:authenticated"])
    );
}
