//! Who may do what, with the real kubectl: a user certificate and a
//! ServiceAccount token without rights get 403, a RoleBinding grants one
//! namespace, the aggregated `view` role works, escalation is refused,
//! `kubectl auth can-i [--as] [--list]` answers per RBAC, and `kubectl
//! create token` gives a token that works with curl until its pod is gone.

use std::path::{Path, PathBuf};
use std::process::Command;

use skiff_e2e::{skiff_binary, text, wait_until, Server};

/// A kubeconfig for `user` in `groups` with a certificate from the cluster CA.
fn user_kubeconfig(s: &Server, user: &str, groups: &[&str]) -> PathBuf {
    let mut c = Command::new(skiff_binary());
    c.args(["kubeconfig", "--user", user, "--data-dir"])
        .arg(s.dir.path().join("data"))
        .args(["--server", &format!("https://127.0.0.1:{}", s.port)]);
    for g in groups {
        c.args(["--group", g]);
    }
    let out = c.output().unwrap();
    assert!(out.status.success(), "{}", text(&out.stderr));
    let path = s.dir.path().join(format!("{user}.kubeconfig"));
    std::fs::write(&path, &out.stdout).unwrap();
    path
}

fn as_user(s: &Server, kubeconfig: &Path, args: &[&str]) -> (bool, String, String) {
    let out = s.kubectl_with(kubeconfig, args).output().unwrap();
    (out.status.success(), text(&out.stdout), text(&out.stderr))
}

#[test]
fn a_user_certificate_gets_only_what_its_role_bindings_grant() {
    let s = Server::start();
    s.ok(&["create", "namespace", "team"]);
    let jane = user_kubeconfig(&s, "jane", &["devs"]);
    let (ok, _, err) = as_user(&s, &jane, &["get", "pods", "-n", "team"]);
    assert!(!ok);
    assert!(
        err.contains(r#"Error from server (Forbidden): pods is forbidden: User "jane" cannot list resource "pods" in API group "" in the namespace "team""#),
        "{err}"
    );
    let (ok, out, _) = as_user(&s, &jane, &["auth", "whoami"]);
    assert!(ok && out.contains("jane") && out.contains("devs"), "{out}");
    // The built-in view role (aggregated by the controller) in one namespace.
    s.ok(&[
        "create",
        "rolebinding",
        "jane-view",
        "--clusterrole=view",
        "--user=jane",
        "-n",
        "team",
    ]);
    wait_until("jane may list pods in team", 30, || {
        as_user(&s, &jane, &["get", "pods", "-n", "team"])
            .0
            .then_some(())
    });
    let (ok, _, err) = as_user(&s, &jane, &["get", "pods", "-n", "default"]);
    assert!(!ok, "{err}");
    assert!(err.contains("(Forbidden)"), "{err}");
    let (ok, _, err) = as_user(&s, &jane, &["create", "configmap", "x", "-n", "team"]);
    assert!(
        !ok && err.contains(r#"cannot create resource "configmaps""#),
        "{err}"
    );
    // The admin's can-i answers for jane through impersonation.
    let can = |args: &[&str]| {
        let out = s.kubectl(&[&["auth", "can-i"], args].concat());
        text(&out.stdout).trim().to_string()
    };
    assert_eq!(can(&["list", "pods", "-n", "team", "--as", "jane"]), "yes");
    assert_eq!(
        can(&["list", "pods", "-n", "default", "--as", "jane"]),
        "no"
    );
    assert_eq!(can(&["delete", "pods", "-n", "team", "--as", "jane"]), "no");
    assert_eq!(can(&["get", "secrets", "-n", "team", "--as", "jane"]), "no");
    assert_eq!(can(&["delete", "pods", "-n", "team"]), "yes");
    let list = s.ok(&["auth", "can-i", "--list", "-n", "team", "--as", "jane"]);
    let pods = list
        .lines()
        .find(|l| l.split_whitespace().next() == Some("pods"))
        .unwrap_or_else(|| panic!("{list}"));
    assert!(
        pods.contains("get") && pods.contains("list") && pods.contains("watch"),
        "{list}"
    );
    assert!(!pods.contains("delete"), "{list}");
    // jane herself, without impersonation.
    let (_, out, _) = as_user(&s, &jane, &["auth", "can-i", "list", "pods", "-n", "team"]);
    assert_eq!(out.trim(), "yes");
    // jane may not impersonate.
    let (ok, _, err) = as_user(&s, &jane, &["get", "pods", "-n", "team", "--as", "bob"]);
    assert!(
        !ok && err.contains(r#"User "jane" cannot impersonate resource "users""#),
        "{err}"
    );
    // A group binding reaches her through her certificate's O.
    s.ok(&[
        "create",
        "clusterrolebinding",
        "devs-nodes",
        "--clusterrole=system:node-proxier",
        "--group=devs",
    ]);
    wait_until("devs may get nodes", 30, || {
        as_user(&s, &jane, &["get", "nodes"]).0.then_some(())
    });
}

#[test]
fn escalation_through_roles_and_bindings_is_refused() {
    let s = Server::start();
    s.ok(&["create", "namespace", "team"]);
    // jane administers team (the aggregated admin role): she may write
    // roles and bindings there, but only with rights she holds.
    s.ok(&[
        "create",
        "rolebinding",
        "jane-admin",
        "--clusterrole=admin",
        "--user=jane",
        "-n",
        "team",
    ]);
    let jane = user_kubeconfig(&s, "jane", &[]);
    wait_until("jane administers team", 30, || {
        as_user(&s, &jane, &["get", "roles", "-n", "team"])
            .0
            .then_some(())
    });
    let (ok, out, err) = as_user(
        &s,
        &jane,
        &[
            "create",
            "role",
            "pod-reader",
            "--verb=get,list",
            "--resource=pods",
            "-n",
            "team",
        ],
    );
    assert!(ok, "{out}{err}");
    let (ok, _, err) = as_user(
        &s,
        &jane,
        &[
            "create",
            "role",
            "node-reader",
            "--verb=get",
            "--resource=nodes",
            "-n",
            "team",
        ],
    );
    assert!(!ok);
    assert!(
        err.contains(r#"roles.rbac.authorization.k8s.io "node-reader" is forbidden: user "jane" (groups=["system:authenticated"]) is attempting to grant RBAC permissions not currently held:"#)
            && err.contains(r#"{APIGroups:[""], Resources:["nodes"], Verbs:["get"]}"#),
        "{err}"
    );
    assert!(!s
        .kubectl(&["get", "role", "node-reader", "-n", "team"])
        .status
        .success());
    let (ok, _, err) = as_user(
        &s,
        &jane,
        &[
            "create",
            "rolebinding",
            "bob-root",
            "--clusterrole=cluster-admin",
            "--user=bob",
            "-n",
            "team",
        ],
    );
    assert!(!ok);
    assert!(
        err.contains(r#"rolebindings.rbac.authorization.k8s.io "bob-root" is forbidden"#),
        "{err}"
    );
    let (ok, out, err) = as_user(
        &s,
        &jane,
        &[
            "create",
            "rolebinding",
            "bob-pods",
            "--role=pod-reader",
            "--user=bob",
            "-n",
            "team",
        ],
    );
    assert!(ok, "{out}{err}");
    assert_eq!(
        s.ok(&["auth", "can-i", "list", "pods", "-n", "team", "--as", "bob"])
            .trim(),
        "yes"
    );
}

fn curl(s: &Server, token: &str, path: &str) -> (String, String) {
    let data = s.dir.path().join("data/pki/ca.crt");
    let out = Command::new("curl")
        .args(["-sS", "--cacert"])
        .arg(&data)
        .args(["-H", &format!("Authorization: Bearer {token}")])
        .args(["-w", "\n%{http_code}"])
        .arg(format!("https://127.0.0.1:{}{path}", s.port))
        .output()
        .unwrap();
    let body = text(&out.stdout);
    let (body, code) = body.rsplit_once('\n').unwrap_or(("", ""));
    (code.to_string(), body.to_string())
}

#[test]
fn kubectl_create_token_gives_a_token_curl_can_use_until_its_pod_is_deleted() {
    let s = Server::start();
    s.ok(&["create", "serviceaccount", "bot"]);
    let token = s
        .ok(&["create", "token", "bot", "--duration", "20m"])
        .trim()
        .to_string();
    let (code, body) = curl(&s, &token, "/api/v1/namespaces/default/configmaps");
    assert_eq!(code, "403", "{body}");
    assert!(
        body.contains(
            r#"User \"system:serviceaccount:default:bot\" cannot list resource \"configmaps\""#
        ),
        "{body}"
    );
    s.ok(&[
        "create",
        "rolebinding",
        "bot-view",
        "--clusterrole=view",
        "--serviceaccount=default:bot",
    ]);
    wait_until("the token lists configmaps", 30, || {
        (curl(&s, &token, "/api/v1/namespaces/default/configmaps").0 == "200").then_some(())
    });
    let (code, _) = curl(&s, &token, "/api/v1/namespaces/kube-system/configmaps");
    assert_eq!(code, "403");
    // The OIDC discovery documents, readable with a service account token.
    let (code, body) = curl(&s, &token, "/.well-known/openid-configuration");
    assert_eq!(code, "200", "{body}");
    assert!(body.contains("/openid/v1/jwks"), "{body}");
    // A token bound to a pod ends with the pod.
    s.ok(&["run", "p", "--image=busybox", "--restart=Never"]);
    let bound = s
        .ok(&[
            "create",
            "token",
            "bot",
            "--bound-object-kind",
            "Pod",
            "--bound-object-name",
            "p",
        ])
        .trim()
        .to_string();
    let (code, body) = curl(&s, &bound, "/api/v1/namespaces/default/configmaps");
    assert_eq!(code, "200", "{body}");
    s.ok(&["delete", "pod", "p", "--grace-period=0", "--force"]);
    wait_until("the bound token is refused", 30, || {
        (curl(&s, &bound, "/api/v1/namespaces/default/configmaps").0 == "401").then_some(())
    });
    let (code, _) = curl(&s, &token, "/api/v1/namespaces/default/configmaps");
    assert_eq!(code, "200");
    // A token for a pod that does not exist is refused at once.
    let err = s.fails(&[
        "create",
        "token",
        "bot",
        "--bound-object-kind",
        "Pod",
        "--bound-object-name",
        "nope",
    ]);
    assert!(err.contains(r#"pods "nope" not found"#), "{err}");
    // Deleting the service account ends its tokens.
    s.ok(&["delete", "serviceaccount", "bot"]);
    wait_until("the token is refused", 30, || {
        (curl(&s, &token, "/api/v1/namespaces/default/configmaps").0 == "401").then_some(())
    });
}
