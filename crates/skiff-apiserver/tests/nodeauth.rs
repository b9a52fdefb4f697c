//! The Node authorizer and NodeRestriction admission through the router:
//! what `system:node:<name>` may read and write, with kube-apiserver's
//! status codes and messages.

use std::sync::Arc;
use std::time::Duration;

use axum::http::StatusCode;
use axum::Router;
use serde_json::{json, Value};
use skiff_apiserver::auth::Identity;
use skiff_apiserver::{ApiServer, Config};
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
    let config = Config {
        service_account_key_dir: Some(dir.path().join("keys")),
        ..Default::default()
    };
    let server = ApiServer::start(store, config).await.unwrap();
    let admin = server.in_process_router("admin");
    // No controller manager here: the namespace's default account, which
    // pod admission requires, is made by hand.
    let (s, b) = call(
        &admin,
        "POST",
        "/api/v1/namespaces/default/serviceaccounts",
        Some(
            json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "default"}}),
        ),
    )
    .await;
    assert!(s.is_success(), "{b}");
    Cluster {
        server,
        admin,
        _dir: dir,
    }
}

fn node_id(name: &str) -> Identity {
    Identity::new(
        format!("system:node:{name}"),
        vec!["system:nodes".to_string()],
    )
}

async fn call(r: &Router, method: &str, path: &str, body: Option<Value>) -> (StatusCode, Value) {
    let ct = if method == "PATCH" {
        "application/merge-patch+json"
    } else {
        "application/json"
    };
    call_with(r, method, path, body, &[("content-type", ct)]).await
}

impl Cluster {
    fn node(&self, name: &str) -> Router {
        self.server.router_as(node_id(name))
    }

    async fn admin_ok(&self, method: &str, path: &str, v: Value) -> Value {
        let (s, b) = call(&self.admin, method, path, Some(v)).await;
        assert!(s.is_success(), "{method} {path}: {s} {b}");
        b
    }

    /// Waits (bounded) until `r` gets `want` for `method path`: the
    /// authorizer's graph follows the watch cache, which follows the store.
    async fn wait_status(&self, r: &Router, method: &str, path: &str, want: StatusCode) -> Value {
        let mut last = Value::Null;
        for _ in 0..250 {
            let (s, b) = call(r, method, path, None).await;
            if s == want {
                return b;
            }
            last = b;
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        panic!("{method} {path} never answered {want}: {last}");
    }
}

fn message(b: &Value) -> &str {
    b["message"].as_str().unwrap_or("")
}

fn pod(name: &str, node: Option<&str>, secret: &str, cm: &str, claim: Option<&str>) -> Value {
    let mut vols = vec![
        json!({"name": "s", "secret": {"secretName": secret}}),
        json!({"name": "c", "configMap": {"name": cm}}),
    ];
    if let Some(c) = claim {
        vols.push(json!({"name": "d", "persistentVolumeClaim": {"claimName": c}}));
    }
    let mut p = json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"containers": [{"name": "c", "image": "busybox"}], "volumes": vols},
    });
    if let Some(n) = node {
        p["spec"]["nodeName"] = json!(n);
    }
    p
}

async fn setup() -> Cluster {
    let c = cluster().await;
    for n in ["n1", "n2"] {
        c.admin_ok(
            "POST",
            "/api/v1/nodes",
            json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": n, "labels": {"node-role.kubernetes.io/worker": ""}}}),
        )
        .await;
    }
    for s in ["s1", "s2", "unused"] {
        c.admin_ok(
            "POST",
            "/api/v1/namespaces/default/secrets",
            json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": s}, "stringData": {"k": s}}),
        )
        .await;
    }
    for m in ["c1", "c2"] {
        c.admin_ok(
            "POST",
            "/api/v1/namespaces/default/configmaps",
            json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": m}, "data": {"k": m}}),
        )
        .await;
    }
    c.admin_ok(
        "POST",
        "/api/v1/namespaces/default/pods",
        pod("p1", Some("n1"), "s1", "c1", Some("claim1")),
    )
    .await;
    c.admin_ok(
        "POST",
        "/api/v1/namespaces/default/pods",
        pod("p2", Some("n2"), "s2", "c2", None),
    )
    .await;
    c
}

const SECRETS: &str = "/api/v1/namespaces/default/secrets";

#[tokio::test]
async fn a_node_reads_only_the_secrets_and_configmaps_of_its_own_pods() {
    let c = setup().await;
    let n1 = c.node("n1");
    let b = c
        .wait_status(&n1, "GET", &format!("{SECRETS}/s1"), StatusCode::OK)
        .await;
    assert_eq!(b["metadata"]["name"], "s1");
    c.wait_status(
        &n1,
        "GET",
        "/api/v1/namespaces/default/configmaps/c1",
        StatusCode::OK,
    )
    .await;

    for path in [
        format!("{SECRETS}/s2"),
        format!("{SECRETS}/unused"),
        "/api/v1/namespaces/default/configmaps/c2".to_string(),
    ] {
        let (s, b) = call(&n1, "GET", &path, None).await;
        assert_eq!(s, StatusCode::FORBIDDEN, "{path}: {b}");
        assert_eq!(b["reason"], "Forbidden");
        assert!(
            message(&b).contains("User \"system:node:n1\" cannot get resource")
                && message(&b).ends_with("no relationship found between node 'n1' and this object"),
            "{b}"
        );
    }
    // No listing, and no writing, of secrets.
    let (s, _) = call(&n1, "GET", SECRETS, None).await;
    assert_eq!(s, StatusCode::FORBIDDEN);
    let (s, b) = call(
        &n1,
        "PATCH",
        &format!("{SECRETS}/s1"),
        Some(json!({"stringData": {"k": "x"}})),
    )
    .await;
    assert_eq!(s, StatusCode::FORBIDDEN, "{b}");
    assert!(
        message(&b).ends_with("can only read resources of this type"),
        "{b}"
    );

    // The other node reads its own.
    c.wait_status(
        &c.node("n2"),
        "GET",
        &format!("{SECRETS}/s2"),
        StatusCode::OK,
    )
    .await;
    // Not a node: RBAC decides (nothing granted).
    let bob = c.server.router_as(Identity::new("bob", vec![]));
    let (s, _) = call(&bob, "GET", &format!("{SECRETS}/s1"), None).await;
    assert_eq!(s, StatusCode::FORBIDDEN);
}

#[tokio::test]
async fn the_graph_follows_bindings_and_deletions() {
    let c = setup().await;
    let n1 = c.node("n1");
    // Unbound: nothing yet.
    c.admin_ok(
        "POST",
        "/api/v1/namespaces/default/pods",
        pod("p3", None, "unused", "c2", None),
    )
    .await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    let (s, _) = call(&n1, "GET", &format!("{SECRETS}/unused"), None).await;
    assert_eq!(s, StatusCode::FORBIDDEN);
    // Bound to n1: readable.
    c.admin_ok(
        "POST",
        "/api/v1/namespaces/default/pods/p3/binding",
        json!({"apiVersion": "v1", "kind": "Binding", "metadata": {"name": "p3"}, "target": {"kind": "Node", "name": "n1"}}),
    )
    .await;
    c.wait_status(&n1, "GET", &format!("{SECRETS}/unused"), StatusCode::OK)
        .await;
    // s1 is held by p1 only: deleting p1 ends it.
    c.wait_status(&n1, "GET", &format!("{SECRETS}/s1"), StatusCode::OK)
        .await;
    let (s, b) = call(
        &c.admin,
        "DELETE",
        "/api/v1/namespaces/default/pods/p1?gracePeriodSeconds=0",
        None,
    )
    .await;
    assert!(s.is_success(), "{b}");
    c.wait_status(&n1, "GET", &format!("{SECRETS}/s1"), StatusCode::FORBIDDEN)
        .await;
}

#[tokio::test]
async fn a_node_changes_only_its_own_node_without_restricted_labels() {
    let c = setup().await;
    let n1 = c.node("n1");
    let (s, b) = call(
        &n1,
        "PATCH",
        "/api/v1/nodes/n1",
        Some(json!({"metadata": {"labels": {"example.com/disk": "ssd", "kubernetes.io/hostname": "n1", "node.kubernetes.io/exclude-from-external-load-balancers": ""}}})),
    )
    .await;
    assert_eq!(s, StatusCode::OK, "{b}");
    let (s, b) = call(
        &n1,
        "PATCH",
        "/api/v1/nodes/n1/status",
        Some(json!({"status": {"conditions": [{"type": "Ready", "status": "True"}]}})),
    )
    .await;
    assert_eq!(s, StatusCode::OK, "{b}");

    let (s, b) = call(
        &n1,
        "PATCH",
        "/api/v1/nodes/n2",
        Some(json!({"metadata": {"labels": {"a": "b"}}})),
    )
    .await;
    assert_eq!(s, StatusCode::FORBIDDEN, "{b}");
    assert_eq!(
        message(&b),
        "nodes \"n2\" is forbidden: node \"n1\" is not allowed to modify node \"n2\""
    );
    let (s, _) = call(
        &n1,
        "PATCH",
        "/api/v1/nodes/n2/status",
        Some(json!({"status": {"conditions": [{"type": "Ready", "status": "False"}]}})),
    )
    .await;
    assert_eq!(s, StatusCode::FORBIDDEN);
    let (s, _) = call(&n1, "DELETE", "/api/v1/nodes/n2", None).await;
    assert_eq!(s, StatusCode::FORBIDDEN);

    for label in [
        "node-role.kubernetes.io/control-plane",
        "node-restriction.kubernetes.io/pool",
        "k8s.io/x",
    ] {
        let (s, b) = call(
            &n1,
            "PATCH",
            "/api/v1/nodes/n1",
            Some(json!({"metadata": {"labels": {label: "x"}}})),
        )
        .await;
        assert_eq!(s, StatusCode::FORBIDDEN, "{label}: {b}");
        assert_eq!(
            message(&b),
            format!(
                "nodes \"n1\" is forbidden: node \"n1\" is not allowed to modify labels: {label}"
            )
        );
    }
    // Removing a restricted label is a modification too.
    let (s, _) = call(
        &n1,
        "PATCH",
        "/api/v1/nodes/n1",
        Some(json!({"metadata": {"labels": {"node-role.kubernetes.io/worker": null}}})),
    )
    .await;
    assert_eq!(s, StatusCode::FORBIDDEN);
    // Taints are not the node's to change.
    let (s, b) = call(
        &n1,
        "PATCH",
        "/api/v1/nodes/n1",
        Some(json!({"spec": {"taints": [{"key": "k", "effect": "NoSchedule"}]}})),
    )
    .await;
    assert_eq!(s, StatusCode::FORBIDDEN, "{b}");
    assert!(
        message(&b).ends_with("is not allowed to modify taints"),
        "{b}"
    );

    // Registering: its own name, no restricted labels.
    let n3 = c.node("n3");
    let node = |name: &str, labels: Value| json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": labels}});
    let (s, b) = call(
        &n3,
        "POST",
        "/api/v1/nodes",
        Some(node("n3", json!({"node-restriction.kubernetes.io/x": "y"}))),
    )
    .await;
    assert_eq!(s, StatusCode::FORBIDDEN, "{b}");
    assert!(
        message(&b).ends_with(
            "node \"n3\" is not allowed to set the following labels: node-restriction.kubernetes.io/x"
        ),
        "{b}"
    );
    let (s, _) = call(&n3, "POST", "/api/v1/nodes", Some(node("n4", json!({})))).await;
    assert_eq!(s, StatusCode::FORBIDDEN);
    let (s, b) = call(
        &n3,
        "POST",
        "/api/v1/nodes",
        Some(node("n3", json!({"kubernetes.io/os": "linux"}))),
    )
    .await;
    assert_eq!(s, StatusCode::CREATED, "{b}");
}

#[tokio::test]
async fn a_node_writes_the_status_of_its_pods_and_deletes_only_them() {
    let c = setup().await;
    let n1 = c.node("n1");
    let status = json!({"status": {"phase": "Running"}});
    let (s, b) = call(
        &n1,
        "PATCH",
        "/api/v1/namespaces/default/pods/p1/status",
        Some(status.clone()),
    )
    .await;
    assert_eq!(s, StatusCode::OK, "{b}");
    let (s, b) = call(
        &n1,
        "PATCH",
        "/api/v1/namespaces/default/pods/p2/status",
        Some(status),
    )
    .await;
    assert_eq!(s, StatusCode::FORBIDDEN, "{b}");
    assert_eq!(
        message(&b),
        "pods \"p2\" is forbidden: node \"n1\" can only update pod status for pods with spec.nodeName set to itself"
    );
    // Not the pod itself.
    let (s, _) = call(
        &n1,
        "PATCH",
        "/api/v1/namespaces/default/pods/p1",
        Some(json!({"metadata": {"labels": {"a": "b"}}})),
    )
    .await;
    assert_eq!(s, StatusCode::FORBIDDEN);

    let eviction = |name: &str| json!({"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": name, "namespace": "default"}});
    let (s, b) = call(
        &n1,
        "POST",
        "/api/v1/namespaces/default/pods/p2/eviction",
        Some(eviction("p2")),
    )
    .await;
    assert_eq!(s, StatusCode::FORBIDDEN, "{b}");
    assert!(
        message(&b).ends_with("node \"n1\" can only evict pods with spec.nodeName set to itself")
    );
    let (s, b) = call(&n1, "DELETE", "/api/v1/namespaces/default/pods/p2", None).await;
    assert_eq!(s, StatusCode::FORBIDDEN, "{b}");
    assert_eq!(
        message(&b),
        "pods \"p2\" is forbidden: node \"n1\" can only delete pods with spec.nodeName set to itself"
    );
    let (s, b) = call(&n1, "DELETE", "/api/v1/namespaces/default/pods/p1", None).await;
    assert!(s.is_success(), "{b}");
}

#[tokio::test]
async fn a_node_creates_only_mirror_pods_owned_by_itself() {
    let c = setup().await;
    let n1 = c.node("n1");
    let (_, node) = call(&c.admin, "GET", "/api/v1/nodes/n1", None).await;
    let uid = node["metadata"]["uid"].as_str().unwrap().to_string();
    let mirror = |name: &str, node: &str, owner_uid: &str| {
        json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {
                "name": name, "namespace": "default",
                "annotations": {"kubernetes.io/config.mirror": "hash"},
                "ownerReferences": [{"apiVersion": "v1", "kind": "Node", "name": node, "uid": owner_uid, "controller": true}],
            },
            "spec": {"nodeName": node, "containers": [{"name": "c", "image": "busybox"}]},
        })
    };
    const PODS: &str = "/api/v1/namespaces/default/pods";
    let (s, b) = call(&n1, "POST", PODS, Some(mirror("static-n1", "n1", &uid))).await;
    assert_eq!(s, StatusCode::CREATED, "{b}");

    let mut plain = mirror("plain", "n1", &uid);
    plain["metadata"]["annotations"] = json!({});
    let (s, b) = call(&n1, "POST", PODS, Some(plain)).await;
    assert_eq!(s, StatusCode::FORBIDDEN, "{b}");
    assert_eq!(
        message(&b),
        "pods \"plain\" is forbidden: pod does not have \"kubernetes.io/config.mirror\" annotation, node \"n1\" can only create mirror pods"
    );
    let (s, b) = call(&n1, "POST", PODS, Some(mirror("other", "n2", &uid))).await;
    assert_eq!(s, StatusCode::FORBIDDEN, "{b}");
    assert!(message(&b).ends_with("can only create pods with spec.nodeName set to itself"));
    let (s, b) = call(&n1, "POST", PODS, Some(mirror("stale", "n1", "0000"))).await;
    assert_eq!(s, StatusCode::FORBIDDEN, "{b}");
    assert!(
        message(&b).contains("does not match the current node"),
        "{b}"
    );
    let mut with_secret = mirror("sec", "n1", &uid);
    with_secret["spec"]["volumes"] = json!([{"name": "s", "secret": {"secretName": "s1"}}]);
    let (s, b) = call(&n1, "POST", PODS, Some(with_secret)).await;
    assert_eq!(s, StatusCode::FORBIDDEN, "{b}");
    assert!(
        message(&b).ends_with("can not create pods that reference secrets"),
        "{b}"
    );
}

#[tokio::test]
async fn a_node_has_its_own_lease_and_tokens_for_its_pods_only() {
    let c = setup().await;
    let n1 = c.node("n1");
    const LEASES: &str = "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases";
    let lease = |name: &str| json!({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": {"name": name}, "spec": {"holderIdentity": name}});
    let (s, b) = call(&n1, "POST", LEASES, Some(lease("n1"))).await;
    assert_eq!(s, StatusCode::CREATED, "{b}");
    let (s, b) = call(&n1, "POST", LEASES, Some(lease("n2"))).await;
    assert_eq!(s, StatusCode::FORBIDDEN, "{b}");
    assert!(message(&b)
        .ends_with("can only access node lease with the same name as the requesting node"));
    let (s, _) = call(&n1, "GET", &format!("{LEASES}/n1"), None).await;
    assert_eq!(s, StatusCode::OK);
    let (s, _) = call(&n1, "GET", LEASES, None).await;
    assert_eq!(s, StatusCode::FORBIDDEN, "no listing leases");
    let (s, _) = call(
        &n1,
        "POST",
        "/apis/coordination.k8s.io/v1/namespaces/default/leases",
        Some(lease("n1")),
    )
    .await;
    assert_eq!(s, StatusCode::FORBIDDEN, "only in kube-node-lease");
    // RBAC may grant nodes more leases; NodeRestriction still keeps a node
    // to its own, except skiff's ServiceLB election Lease.
    c.admin_ok(
        "POST",
        "/apis/rbac.authorization.k8s.io/v1/clusterroles",
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": {"name": "lease-writer"},
            "rules": [{"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["create", "get", "update"]}]}),
    )
    .await;
    c.admin_ok(
        "POST",
        "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings",
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding", "metadata": {"name": "lease-writer"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "lease-writer"},
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": "system:nodes"}]}),
    )
    .await;
    let mut last = Value::Null;
    for _ in 0..250 {
        let (_, b) = call(
            &n1,
            "POST",
            "/apis/coordination.k8s.io/v1/namespaces/default/leases",
            Some(lease("n1")),
        )
        .await;
        if message(&b)
            .ends_with("can only access leases in the \"kube-node-lease\" system namespace")
        {
            last = Value::Null;
            break;
        }
        last = b;
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(
        last,
        Value::Null,
        "NodeRestriction refuses other namespaces"
    );
    let (s, b) = call(
        &n1,
        "POST",
        "/apis/coordination.k8s.io/v1/namespaces/kube-system/leases",
        Some(lease("skiff-service-lb")),
    )
    .await;
    assert_eq!(s, StatusCode::CREATED, "{b}");

    // Tokens: for the ServiceAccount of a pod on the node, bound to it.
    let (_, p1) = call(&c.admin, "GET", "/api/v1/namespaces/default/pods/p1", None).await;
    let (_, p2) = call(&c.admin, "GET", "/api/v1/namespaces/default/pods/p2", None).await;
    let tr = |p: &Value| {
        json!({"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": {
            "boundObjectRef": {"apiVersion": "v1", "kind": "Pod", "name": p["metadata"]["name"], "uid": p["metadata"]["uid"]}}})
    };
    const TOKEN: &str = "/api/v1/namespaces/default/serviceaccounts/default/token";
    // The graph may lag the store for a moment.
    let mut ok = (StatusCode::IM_A_TEAPOT, Value::Null);
    for _ in 0..250 {
        ok = call(&n1, "POST", TOKEN, Some(tr(&p1))).await;
        if ok.0 == StatusCode::CREATED {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(ok.0, StatusCode::CREATED, "{}", ok.1);
    assert!(ok.1["status"]["token"].as_str().is_some());
    let (s, b) = call(&n1, "POST", TOKEN, Some(tr(&p2))).await;
    assert_eq!(s, StatusCode::FORBIDDEN, "{b}");
    assert!(
        message(&b).ends_with("node requested token bound to a pod scheduled on a different node"),
        "{b}"
    );
    let (s, b) = call(
        &n1,
        "POST",
        TOKEN,
        Some(json!({"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": {}})),
    )
    .await;
    assert_eq!(s, StatusCode::FORBIDDEN, "{b}");
    assert!(
        message(&b).ends_with("node requested token not bound to a pod"),
        "{b}"
    );
    // A ServiceAccount no pod on the node uses.
    let (s, b) = call(
        &n1,
        "POST",
        "/api/v1/namespaces/default/serviceaccounts/other/token",
        Some(tr(&p1)),
    )
    .await;
    assert_eq!(s, StatusCode::FORBIDDEN, "{b}");
    assert!(message(&b).contains("no relationship found"), "{b}");
}

#[tokio::test]
async fn a_node_reads_the_claims_and_volumes_of_its_pods() {
    let c = setup().await;
    let n1 = c.node("n1");
    for (name, claim) in [("v1", "claim1"), ("v2", "claim2")] {
        c.admin_ok(
            "POST",
            "/api/v1/persistentvolumes",
            json!({"apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": name},
                "spec": {"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"], "hostPath": {"path": "/tmp/x"},
                    "claimRef": {"namespace": "default", "name": claim}}}),
        )
        .await;
        c.admin_ok(
            "POST",
            "/api/v1/namespaces/default/persistentvolumeclaims",
            json!({"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": claim},
                "spec": {"accessModes": ["ReadWriteOnce"], "volumeName": name, "resources": {"requests": {"storage": "1Gi"}}}}),
        )
        .await;
    }
    c.wait_status(
        &n1,
        "GET",
        "/api/v1/namespaces/default/persistentvolumeclaims/claim1",
        StatusCode::OK,
    )
    .await;
    c.wait_status(&n1, "GET", "/api/v1/persistentvolumes/v1", StatusCode::OK)
        .await;
    let (s, _) = call(
        &n1,
        "GET",
        "/api/v1/namespaces/default/persistentvolumeclaims/claim2",
        None,
    )
    .await;
    assert_eq!(s, StatusCode::FORBIDDEN);
    let (s, _) = call(&n1, "GET", "/api/v1/persistentvolumes/v2", None).await;
    assert_eq!(s, StatusCode::FORBIDDEN);
    let (s, _) = call(&n1, "GET", "/api/v1/persistentvolumes", None).await;
    assert_eq!(s, StatusCode::FORBIDDEN);
}
