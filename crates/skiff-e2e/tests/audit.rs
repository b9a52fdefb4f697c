//! Audit logging with the real kubectl: `--audit-policy-file` and
//! `--audit-log-path` write kube-apiserver's audit events (JSON lines);
//! levels, None rules, stages, the Audit-Id header, impersonation, the
//! authorization decision, watches' ResponseStarted, and size rotation.

use std::path::Path;

use serde_json::Value;
use skiff_e2e::{wait_until, Server};

const POLICY: &str = r#"apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: ["RequestReceived"]
omitManagedFields: true
rules:
- level: None
  resources:
  - group: ""
    resources: ["configmaps"]
    resourceNames: ["quiet"]
- level: RequestResponse
  namespaces: ["loud"]
  resources:
  - group: ""
    resources: ["configmaps"]
- level: Request
  resources:
  - group: ""
    resources: ["configmaps"]
- level: Metadata
  resources:
  - group: ""
    resources: ["secrets"]
- level: Metadata
  verbs: ["watch"]
- level: None
"#;

fn events(path: &Path) -> Vec<Value> {
    let mut out = Vec::new();
    let dir = path.parent().unwrap();
    // The current file and any rotated ones.
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        let name = e.file_name().to_string_lossy().to_string();
        if name.starts_with("audit") && name.ends_with(".log") {
            let text = std::fs::read_to_string(e.path()).unwrap_or_default();
            // Complete lines only: the writer may be in the middle of one.
            let complete = &text[..text.rfind('\n').map_or(0, |i| i + 1)];
            for line in complete.lines() {
                out.push(
                    serde_json::from_str(line)
                        .unwrap_or_else(|e| panic!("an audit line is not JSON ({e}): {line}")),
                );
            }
        }
    }
    out
}

/// Waits for an event matching `f` in the log.
fn find(path: &Path, what: &str, f: impl Fn(&Value) -> bool) -> Value {
    wait_until(what, 20, || events(path).into_iter().find(|e| f(e)))
}

fn s<'a>(v: &'a Value, ptr: &str) -> &'a str {
    v.pointer(ptr).and_then(Value::as_str).unwrap_or("")
}

#[test]
fn the_audit_log_records_requests_per_policy() {
    let tmp = tempfile::tempdir().unwrap();
    let policy = tmp.path().join("policy.yaml");
    std::fs::write(&policy, POLICY).unwrap();
    let logdir = tmp.path().join("logs");
    let log = logdir.join("audit.log");
    let sv = Server::start_with(&[
        "--disable-scheduler",
        "--disable-controllers",
        "--audit-policy-file",
        policy.to_str().unwrap(),
        "--audit-log-path",
        log.to_str().unwrap(),
        "--audit-log-maxsize",
        "1",
        "--audit-log-maxbackup",
        "2",
    ]);

    // A create at Request level: user, objectRef, the body, 201.
    sv.ok(&["create", "configmap", "recorded", "--from-literal=k=v1"]);
    let ev = find(&log, "the create", |e| {
        s(e, "/verb") == "create" && s(e, "/objectRef/name") == "recorded"
    });
    assert_eq!(s(&ev, "/kind"), "Event");
    assert_eq!(s(&ev, "/apiVersion"), "audit.k8s.io/v1");
    assert_eq!(s(&ev, "/level"), "Request");
    assert_eq!(s(&ev, "/stage"), "ResponseComplete");
    assert_eq!(s(&ev, "/user/username"), "admin");
    let groups = ev.pointer("/user/groups").unwrap().to_string();
    assert!(groups.contains("system:masters"), "{groups}");
    assert_eq!(s(&ev, "/objectRef/resource"), "configmaps");
    assert_eq!(s(&ev, "/objectRef/namespace"), "default");
    assert_eq!(s(&ev, "/objectRef/apiVersion"), "v1");
    assert!(s(&ev, "/requestURI").starts_with("/api/v1/namespaces/default/configmaps"));
    assert_eq!(ev.pointer("/responseStatus/code"), Some(&Value::from(201)));
    assert_eq!(s(&ev, "/requestObject/data/k"), "v1");
    assert!(ev.get("responseObject").is_none(), "{ev}");
    assert!(s(&ev, "/userAgent").starts_with("kubectl"), "{ev}");
    assert_eq!(ev.pointer("/sourceIPs/0"), Some(&Value::from("127.0.0.1")));
    assert_eq!(
        s(&ev, "/annotations/authorization.k8s.io~1decision"),
        "allow"
    );
    assert!(s(&ev, "/requestReceivedTimestamp").ends_with('Z'));
    assert!(s(&ev, "/stageTimestamp") >= s(&ev, "/requestReceivedTimestamp"));
    // RequestReceived is omitted by the policy.
    assert!(events(&log)
        .iter()
        .all(|e| s(e, "/stage") != "RequestReceived"));

    // The Audit-Id header names the request's event.
    let out = sv.kubectl(&["get", "configmap", "recorded", "-v=8"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    // The response to the configmap's GET (discovery requests come first).
    let at = stderr
        .find("configmaps/recorded\"")
        .unwrap_or_else(|| panic!("no response for the configmap in:\n{stderr}"));
    let id = stderr[at..]
        .lines()
        .find_map(|l| {
            l.trim()
                .split_once("Audit-Id: ")
                .map(|(_, id)| id.trim().to_string())
        })
        .unwrap_or_else(|| panic!("no Audit-Id header in:\n{stderr}"));
    let ev = find(&log, "the get by its audit ID", |e| s(e, "/auditID") == id);
    assert_eq!(s(&ev, "/verb"), "get");
    assert_eq!(s(&ev, "/objectRef/name"), "recorded");

    // A None rule (resourceNames) records nothing; a later create shows the
    // writer is past it.
    sv.ok(&["create", "configmap", "quiet", "--from-literal=k=hush"]);
    sv.ok(&["get", "configmap", "quiet"]);
    sv.ok(&[
        "create",
        "secret",
        "generic",
        "meta",
        "--from-literal=k=topsecret",
    ]);
    let ev = find(&log, "the secret's create", |e| {
        s(e, "/objectRef/resource") == "secrets" && s(e, "/verb") == "create"
    });
    assert_eq!(s(&ev, "/level"), "Metadata");
    assert_eq!(s(&ev, "/objectRef/name"), "meta");
    assert!(ev.get("requestObject").is_none() && ev.get("responseObject").is_none());
    assert!(!serde_json::to_string(&ev).unwrap().contains("dG9wc2VjcmV0"));
    // (A create has no name in its URL, so resourceNames rules do not
    // match it, as in Kubernetes; the get of it is not recorded.)
    assert!(events(&log)
        .iter()
        .any(|e| s(e, "/objectRef/name") == "quiet" && s(e, "/verb") == "create"));
    assert!(events(&log)
        .iter()
        .all(|e| !(s(e, "/objectRef/name") == "quiet" && s(e, "/verb") == "get")));

    // RequestResponse carries both bodies, without managedFields.
    sv.ok(&["create", "namespace", "loud"]);
    sv.ok(&[
        "create",
        "configmap",
        "both",
        "-n",
        "loud",
        "--from-literal=k=v2",
    ]);
    let ev = find(&log, "the RequestResponse create", |e| {
        s(e, "/objectRef/name") == "both" && s(e, "/verb") == "create"
    });
    assert_eq!(s(&ev, "/level"), "RequestResponse");
    assert_eq!(s(&ev, "/responseObject/data/k"), "v2");
    assert!(!s(&ev, "/responseObject/metadata/uid").is_empty());
    assert!(ev
        .pointer("/responseObject/metadata/managedFields")
        .is_none());

    // An error keeps its Status.
    sv.fails(&["get", "configmap", "missing"]);
    let ev = find(&log, "the 404", |e| s(e, "/objectRef/name") == "missing");
    assert_eq!(ev.pointer("/responseStatus/code"), Some(&Value::from(404)));
    assert_eq!(s(&ev, "/responseStatus/reason"), "NotFound");
    assert_eq!(s(&ev, "/responseStatus/status"), "Failure");

    // Impersonation: the user and who it acted as; a denial is "forbid".
    sv.fails(&["get", "configmap", "recorded", "--as", "jane"]);
    let ev = find(&log, "the impersonated get", |e| {
        s(e, "/impersonatedUser/username") == "jane"
    });
    assert_eq!(s(&ev, "/user/username"), "admin");
    assert_eq!(ev.pointer("/responseStatus/code"), Some(&Value::from(403)));
    assert_eq!(
        s(&ev, "/annotations/authorization.k8s.io~1decision"),
        "forbid"
    );

    // A watch: ResponseStarted, then ResponseComplete when it ends.
    let watch = sv.kubectl_background(&["get", "secrets", "-w", "-o", "name"]);
    watch.wait_for("the secret", |o| o.contains("secret/meta"));
    let started = find(&log, "the watch's ResponseStarted", |e| {
        s(e, "/verb") == "watch" && s(e, "/stage") == "ResponseStarted"
    });
    let id = s(&started, "/auditID").to_string();
    drop(watch);
    find(&log, "the watch's ResponseComplete", |e| {
        s(e, "/auditID") == id && s(e, "/stage") == "ResponseComplete"
    });

    // Rotation: 1 MB files, two backups kept.
    let big = tmp.path().join("k");
    std::fs::write(&big, "x".repeat(300 * 1024)).unwrap();
    let big = big.to_str().unwrap();
    for i in 0..12 {
        let name = format!("big-{i}");
        sv.ok(&[
            "create",
            "configmap",
            &name,
            "-n",
            "loud",
            &format!("--from-file={big}"),
        ]);
    }
    find(&log, "the last big create", |e| {
        s(e, "/objectRef/name") == "big-11" && s(e, "/verb") == "create"
    });
    let names: Vec<String> = std::fs::read_dir(&logdir)
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().to_string())
        .collect();
    assert_eq!(names.len(), 3, "{names:?}");
    for n in &names {
        let len = std::fs::metadata(logdir.join(n)).unwrap().len();
        assert!(len <= 1024 * 1024, "{n}: {len} bytes");
    }
}

#[test]
fn a_bad_audit_policy_refuses_start() {
    let tmp = tempfile::tempdir().unwrap();
    let policy = tmp.path().join("policy.yaml");
    std::fs::write(
        &policy,
        "apiVersion: audit.k8s.io/v1\nkind: Policy\nrules:\n- level: Everything\n",
    )
    .unwrap();
    let out = std::process::Command::new(skiff_e2e::skiff_binary())
        .arg("server")
        .arg("--data-dir")
        .arg(tmp.path().join("data"))
        .args([
            "--listen",
            "127.0.0.1:0",
            "--disable-scheduler",
            "--disable-controllers",
        ])
        .arg("--audit-policy-file")
        .arg(&policy)
        .arg("--audit-log-path")
        .arg(tmp.path().join("audit.log"))
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        err.contains("Everything") && err.contains("policy.yaml"),
        "{err}"
    );
}
