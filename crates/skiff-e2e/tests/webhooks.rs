//! Admission webhooks with the real kubectl: webhook servers written for
//! the test (HTTPS in the test process on loopback, certificates from a CA
//! made in the test) registered by `url` and by `service` (a Service
//! without selector whose Endpoints point at the test's address). One
//! mutates (adds a label by JSONPatch), one denies with a message kubectl
//! shows; failurePolicy Ignore and Fail when the webhook is down; a
//! webhook that never answers costs its timeout.

use std::time::{Duration, Instant};

use serde_json::{json, Value};
use skiff_apiserver::testing::{self, add_label, admission_handler, TestServer};
use skiff_e2e::{text, wait_until, Server};

async fn hook(
    delay: Duration,
    decide: impl Fn(&Value) -> Value + Send + Sync + 'static,
) -> TestServer {
    testing::serve(
        "127.0.0.1:0",
        &["127.0.0.1", "hook.default.svc"],
        None,
        delay,
        admission_handler(decide),
    )
    .await
}

fn labeler(req: &Value) -> Value {
    let mut out = add_label(req, "hooked", "yes");
    out["warnings"] = json!(["the test webhook labelled this object"]);
    out
}

fn denier(req: &Value) -> Value {
    if req["object"]["data"].get("bad").is_some() {
        return json!({"allowed": false,
            "status": {"code": 403, "message": "bad data is not welcome here"}});
    }
    json!({"allowed": true})
}

fn configuration(kind: &str, name: &str, hook: &str, client: Value, extra: Value) -> String {
    let mut h = json!({
        "name": hook,
        "clientConfig": client,
        "rules": [{"operations": ["CREATE", "UPDATE"], "apiGroups": [""],
            "apiVersions": ["v1"], "resources": ["configmaps"]}],
        "admissionReviewVersions": ["v1"],
        "sideEffects": "None",
        "timeoutSeconds": 5,
    });
    for (k, v) in extra.as_object().unwrap() {
        h[k] = v.clone();
    }
    json!({"apiVersion": "admissionregistration.k8s.io/v1", "kind": kind,
        "metadata": {"name": name}, "webhooks": [h]})
    .to_string()
}

fn url(h: &TestServer) -> Value {
    json!({"url": format!("https://{}/admit", h.addr), "caBundle": h.ca_bundle()})
}

/// `kubectl apply` of a ConfigMap: (success, stdout, stderr).
fn apply_configmap(s: &Server, name: &str, data: Value) -> (bool, String, String) {
    let cm = json!({"apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": name}, "data": data});
    let out = s.kubectl_stdin(&["apply", "-f", "-"], &cm.to_string());
    (out.status.success(), text(&out.stdout), text(&out.stderr))
}

/// Waits until a server-side dry-run create shows the label the mutating
/// webhook adds (the configuration reached the server's watch cache).
fn wait_mutating(s: &Server) {
    wait_until("the mutating webhook to apply", 30, || {
        let out = s.kubectl(&[
            "create",
            "configmap",
            "probe",
            "--dry-run=server",
            "-o",
            "jsonpath={.metadata.labels.hooked}",
        ]);
        (text(&out.stdout) == "yes").then_some(())
    });
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn webhooks_registered_by_url_mutate_and_deny_with_kubectl() {
    let s = Server::start();
    let labels = hook(Duration::ZERO, labeler).await;
    let deny = hook(Duration::ZERO, denier).await;
    s.ok_stdin(
        &["apply", "-f", "-"],
        &configuration(
            "MutatingWebhookConfiguration",
            "labeler",
            "label.example.com",
            url(&labels),
            json!({}),
        ),
    );
    s.ok_stdin(
        &["apply", "-f", "-"],
        &configuration(
            "ValidatingWebhookConfiguration",
            "denier",
            "deny.example.com",
            url(&deny),
            json!({}),
        ),
    );
    assert!(s
        .ok(&["get", "mutatingwebhookconfigurations"])
        .contains("labeler"));
    wait_mutating(&s);

    let (ok, _, stderr) = apply_configmap(&s, "good", json!({"a": "1"}));
    assert!(ok, "{stderr}");
    assert!(
        stderr.contains("Warning: the test webhook labelled this object"),
        "{stderr}"
    );
    assert_eq!(
        s.ok(&[
            "get",
            "configmap",
            "good",
            "-o",
            "jsonpath={.metadata.labels.hooked}"
        ]),
        "yes"
    );

    let (ok, _, stderr) = apply_configmap(&s, "evil", json!({"bad": "1"}));
    assert!(!ok);
    assert!(
        stderr.contains(
            "admission webhook \"deny.example.com\" denied the request: bad data is not welcome here"
        ),
        "{stderr}"
    );
    // What the mutating webhook warned still reaches the user with the denial.
    assert!(
        stderr.contains("Warning: the test webhook labelled this object"),
        "{stderr}"
    );
    assert!(s.fails(&["get", "configmap", "evil"]).contains("NotFound"));

    // The review the webhook got names the user kubectl authenticated as.
    let review: Value = serde_json::from_slice(&deny.requests().last().unwrap().body).unwrap();
    let me = s.ok(&[
        "auth",
        "whoami",
        "-o",
        "jsonpath={.status.userInfo.username}",
    ]);
    assert_eq!(review["request"]["userInfo"]["username"], me.as_str());
    assert_eq!(review["request"]["namespace"], "default");
}

/// A mutating webhook for DELETE: it sees neither object nor oldObject
/// (kube-apiserver calls it before reading the object), only the name and
/// the DeleteOptions, and it may refuse.
fn keeper(req: &Value) -> Value {
    if req["operation"] == "DELETE" && req["name"] == "keep" {
        return json!({"allowed": false, "warnings": ["keep is protected"],
            "status": {"code": 403, "message": "keep stays"}});
    }
    json!({"allowed": true})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mutating_webhook_for_delete_sees_the_name_and_may_refuse() {
    let s = Server::start();
    let keep = hook(Duration::ZERO, keeper).await;
    s.ok_stdin(
        &["apply", "-f", "-"],
        &configuration(
            "MutatingWebhookConfiguration",
            "keeper",
            "keep.example.com",
            url(&keep),
            json!({"rules": [{"operations": ["DELETE"], "apiGroups": [""],
                "apiVersions": ["v1"], "resources": ["configmaps"]}]}),
        ),
    );
    s.ok(&["create", "configmap", "keep"]);
    s.ok(&["create", "configmap", "other"]);
    let err = wait_until("the DELETE webhook to refuse", 30, || {
        let out = s.kubectl(&["delete", "configmap", "keep"]);
        (!out.status.success()).then(|| text(&out.stderr))
    });
    assert!(
        err.contains("admission webhook \"keep.example.com\" denied the request: keep stays"),
        "{err}"
    );
    assert!(err.contains("Warning: keep is protected"), "{err}");
    s.ok(&["get", "configmap", "keep"]);
    s.ok(&["delete", "configmap", "other", "--grace-period=7"]);
    assert!(s.fails(&["get", "configmap", "other"]).contains("NotFound"));

    let reviews: Vec<Value> = keep
        .requests()
        .iter()
        .map(|r| serde_json::from_slice(&r.body).unwrap())
        .collect();
    let other = reviews
        .iter()
        .find(|r| r["request"]["name"] == "other")
        .expect("the webhook saw the delete of other");
    assert_eq!(other["request"]["operation"], "DELETE");
    assert_eq!(other["request"]["object"], Value::Null);
    assert_eq!(other["request"]["oldObject"], Value::Null);
    assert_eq!(other["request"]["options"]["kind"], "DeleteOptions");
    assert_eq!(other["request"]["options"]["gracePeriodSeconds"], 7);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_webhook_registered_by_service_is_reached_at_its_endpoints() {
    let s = Server::start();
    let labels = hook(Duration::ZERO, labeler).await;
    let port = labels.addr.port();
    let svc = json!({"apiVersion": "v1", "kind": "List", "items": [
        {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "hook"},
            "spec": {"ports": [{"name": "https", "port": 443, "targetPort": port}]}},
        {"apiVersion": "v1", "kind": "Endpoints", "metadata": {"name": "hook"},
            "subsets": [{"addresses": [{"ip": "127.0.0.1"}],
                "ports": [{"name": "https", "port": port}]}]},
    ]});
    s.ok_stdin(&["apply", "-f", "-"], &svc.to_string());
    let client = json!({"service": {"namespace": "default", "name": "hook", "path": "/mutate"},
        "caBundle": labels.ca_bundle()});
    s.ok_stdin(
        &["apply", "-f", "-"],
        &configuration(
            "MutatingWebhookConfiguration",
            "labeler",
            "label.example.com",
            client,
            json!({}),
        ),
    );
    wait_mutating(&s);
    let seen = labels.requests();
    assert!(seen.iter().any(|r| r.path.starts_with("/mutate")));
    assert_eq!(
        seen.last().unwrap().headers.get("host").unwrap(),
        "hook.default.svc:443"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failure_policy_and_timeouts_with_kubectl() {
    let s = Server::start();
    // A port nothing listens on.
    let down = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let ca = testing::test_ca();
    let client = json!({"url": format!("https://{down}/admit"),
        "caBundle": b64(&ca.cert_pem)});
    s.ok_stdin(
        &["apply", "-f", "-"],
        &configuration(
            "ValidatingWebhookConfiguration",
            "down",
            "down.example.com",
            client.clone(),
            json!({"failurePolicy": "Ignore"}),
        ),
    );
    // Ignore: writes go through while the webhook is down.
    let (ok, _, stderr) = apply_configmap(&s, "ignored", json!({}));
    assert!(ok, "{stderr}");

    // Fail: the same webhook now refuses every write it matches.
    s.ok_stdin(
        &["apply", "-f", "-"],
        &configuration(
            "ValidatingWebhookConfiguration",
            "down",
            "down.example.com",
            client,
            json!({"failurePolicy": "Fail"}),
        ),
    );
    let stderr = wait_until("failurePolicy Fail to apply", 30, || {
        let (ok, _, stderr) = apply_configmap(&s, "refused", json!({}));
        (!ok).then_some(stderr)
    });
    assert!(
        stderr.contains("failed calling webhook \"down.example.com\""),
        "{stderr}"
    );
    // The configuration itself can always be removed.
    s.ok(&["delete", "validatingwebhookconfiguration", "down"]);

    // A webhook that never answers costs its timeout, then Fail refuses.
    let slow = hook(Duration::from_secs(60), denier).await;
    s.ok_stdin(
        &["apply", "-f", "-"],
        &configuration(
            "ValidatingWebhookConfiguration",
            "slow",
            "slow.example.com",
            url(&slow),
            json!({"timeoutSeconds": 2}),
        ),
    );
    let (started, stderr) = wait_until("the slow webhook to be called", 30, || {
        let started = Instant::now();
        let (ok, _, stderr) = apply_configmap(&s, "slow", json!({}));
        (!ok).then_some((started, stderr))
    });
    let took = started.elapsed();
    assert!(stderr.contains("slow.example.com"), "{stderr}");
    assert!(took < Duration::from_secs(10), "took {took:?}");
}

fn b64(pem: &str) -> String {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD.encode(pem)
}

const POLICY: &str = r#"apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicy
metadata:
  name: max-replicas
spec:
  failurePolicy: Fail
  matchConstraints:
    resourceRules:
    - apiGroups: ["apps"]
      apiVersions: ["v1"]
      operations: ["CREATE", "UPDATE"]
      resources: ["deployments"]
  validations:
  - expression: "object.spec.replicas <= 3"
    message: "a deployment may have at most 3 replicas"
---
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicyBinding
metadata:
  name: max-replicas-binding
spec:
  policyName: max-replicas
  validationActions: [Deny]
"#;

#[test]
fn a_validating_admission_policy_denies_too_many_replicas_with_kubectl() {
    let s = Server::start();
    s.ok_stdin(&["apply", "-f", "-"], POLICY);
    assert!(s
        .ok(&["get", "validatingadmissionpolicybindings"])
        .contains("max-replicas-binding"));
    let stderr = wait_until("the policy to deny", 30, || {
        let out = s.kubectl(&[
            "create",
            "deployment",
            "big",
            "--image=busybox",
            "--replicas=5",
        ]);
        (!out.status.success()).then(|| text(&out.stderr))
    });
    assert!(
        stderr.contains(
            "ValidatingAdmissionPolicy 'max-replicas' with binding 'max-replicas-binding' denied request: a deployment may have at most 3 replicas"
        ),
        "{stderr}"
    );
    s.ok(&[
        "create",
        "deployment",
        "small",
        "--image=busybox",
        "--replicas=2",
    ]);
    // An update of the deployment past the limit is refused too.
    let err = s.fails(&[
        "patch",
        "deployment",
        "small",
        "-p",
        r#"{"spec":{"replicas":4}}"#,
    ]);
    assert!(err.contains("at most 3 replicas"), "{err}");
    // `kubectl scale` writes deployments/scale, which a rule for
    // `deployments` does not match (as in Kubernetes).
    s.ok(&["scale", "deployment", "small", "--replicas=4"]);
}

/// A binding that scopes the policy to labelled namespaces with only a
/// `namespaceSelector` (no resourceRules) applies to every resource the
/// policy matches there, and nowhere else.
#[test]
fn a_binding_scoped_to_labelled_namespaces_denies_only_there_with_kubectl() {
    let s = Server::start();
    s.ok(&["create", "namespace", "prod"]);
    s.ok(&["label", "namespace", "prod", "environment=prod"]);
    s.ok(&["create", "namespace", "dev"]);
    let scoped = POLICY.replace(
        "  validationActions: [Deny]\n",
        "  validationActions: [Deny]\n  matchResources:\n    namespaceSelector:\n      matchLabels:\n        environment: prod\n",
    );
    assert_ne!(scoped, POLICY);
    s.ok_stdin(&["apply", "-f", "-"], &scoped);
    let stderr = wait_until("the binding to deny in prod", 30, || {
        let out = s.kubectl(&[
            "create",
            "deployment",
            "big",
            "-n",
            "prod",
            "--image=busybox",
            "--replicas=5",
        ]);
        (!out.status.success()).then(|| text(&out.stderr))
    });
    assert!(
        stderr.contains(
            "ValidatingAdmissionPolicy 'max-replicas' with binding 'max-replicas-binding' denied request: a deployment may have at most 3 replicas"
        ),
        "{stderr}"
    );
    // The binding reads back with Kubernetes' defaults.
    assert_eq!(
        s.ok(&[
            "get",
            "validatingadmissionpolicybinding",
            "max-replicas-binding",
            "-o",
            "jsonpath={.spec.matchResources.matchPolicy}",
        ]),
        "Equivalent"
    );
    s.ok(&[
        "create",
        "deployment",
        "big",
        "-n",
        "dev",
        "--image=busybox",
        "--replicas=5",
    ]);
}
