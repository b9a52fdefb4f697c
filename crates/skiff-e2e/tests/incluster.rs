//! What a pod needs to find the cluster from inside, on a real single-node
//! cluster (`skiff up`) driven with the real kubectl: containers get the
//! service environment variables kubelet sets (`KUBERNETES_SERVICE_HOST`
//! and `_PORT` always; the variables and Docker links of their namespace's
//! Services unless `enableServiceLinks: false`; their own `env` first), and
//! a Job whose pod runs an in-cluster client library (kube-rs's
//! `Config::incluster()`, `examples/incluster_client.rs`, packed into an
//! image with the shared libraries it links) completes with only what the
//! cluster gives it.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use skiff_agent::image::{docker_archive, Entry};
use skiff_e2e::{example_binary, skiff_binary, text, wait_until, Server, BUSYBOX};

fn jsonpath(s: &Server, kind: &str, name: &str, path: &str) -> String {
    let out = s.kubectl(&["get", kind, name, "-o", &format!("jsonpath={path}")]);
    text(&out.stdout)
}

/// The environment of `pod`'s container as `env` prints it inside.
fn env_of(s: &Server, pod: &str) -> BTreeMap<String, String> {
    wait_until(&format!("pod {pod} Running"), 120, || {
        (jsonpath(s, "pod", pod, "{.status.phase}") == "Running").then_some(())
    });
    let out = s.ok(&["exec", pod, "--", "env"]);
    out.lines()
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn pod(name: &str, links: Option<bool>) -> String {
    let links = links
        .map(|b| format!("  enableServiceLinks: {b}\n"))
        .unwrap_or_default();
    format!(
        r#"apiVersion: v1
kind: Pod
metadata: {{name: {name}}}
spec:
{links}  terminationGracePeriodSeconds: 1
  containers:
  - name: c
    image: {BUSYBOX}
    imagePullPolicy: IfNotPresent
    command: ["sleep", "3600"]
    env:
    - {{name: REDIS_URL, value: "redis://$(REDIS_MASTER_SERVICE_HOST):$(REDIS_MASTER_SERVICE_PORT)"}}
    - {{name: REDIS_MASTER_PORT_6379_TCP_PORT, value: "mine"}}
"#
    )
}

#[test]
fn containers_get_the_service_variables_kubelet_sets() {
    let s = Server::up();
    s.ok_stdin(
        &["apply", "-f", "-"],
        r#"apiVersion: v1
kind: Service
metadata: {name: redis-master}
spec:
  ports:
  - {name: redis, port: 6379, targetPort: 6379}
  - {name: metrics-http, port: 9121, protocol: TCP}
---
apiVersion: v1
kind: Service
metadata: {name: nobody-home}
spec:
  clusterIP: None
  ports: [{port: 80}]
"#,
    );
    s.ok_stdin(&["apply", "-f", "-"], &pod("linked", None));
    s.ok_stdin(&["apply", "-f", "-"], &pod("unlinked", Some(false)));
    let api_ip = jsonpath(&s, "svc", "kubernetes", "{.spec.clusterIP}");
    let api_port = jsonpath(&s, "svc", "kubernetes", "{.spec.ports[0].port}");
    let redis_ip = jsonpath(&s, "svc", "redis-master", "{.spec.clusterIP}");
    assert!(!api_ip.is_empty() && !redis_ip.is_empty());

    let kubernetes = |env: &BTreeMap<String, String>| {
        let get = |k: &str| env.get(k).cloned().unwrap_or_default();
        assert_eq!(get("KUBERNETES_SERVICE_HOST"), api_ip, "{env:#?}");
        assert_eq!(get("KUBERNETES_SERVICE_PORT"), api_port, "{env:#?}");
        assert_eq!(get("KUBERNETES_SERVICE_PORT_HTTPS"), api_port, "{env:#?}");
        let url = format!("tcp://{api_ip}:{api_port}");
        assert_eq!(get("KUBERNETES_PORT"), url, "{env:#?}");
        assert_eq!(get(&format!("KUBERNETES_PORT_{api_port}_TCP")), url);
        assert_eq!(get(&format!("KUBERNETES_PORT_{api_port}_TCP_PROTO")), "tcp");
        assert_eq!(
            get(&format!("KUBERNETES_PORT_{api_port}_TCP_PORT")),
            api_port
        );
        assert_eq!(get(&format!("KUBERNETES_PORT_{api_port}_TCP_ADDR")), api_ip);
    };

    let linked = env_of(&s, "linked");
    kubernetes(&linked);
    let redis: BTreeMap<&str, &str> = linked
        .iter()
        .filter(|(k, _)| k.starts_with("REDIS_"))
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    let url = format!("tcp://{redis_ip}:6379");
    let metrics = format!("tcp://{redis_ip}:9121");
    let redis_url = format!("redis://{redis_ip}:6379");
    let want: BTreeMap<&str, &str> = [
        ("REDIS_MASTER_SERVICE_HOST", redis_ip.as_str()),
        ("REDIS_MASTER_SERVICE_PORT", "6379"),
        ("REDIS_MASTER_SERVICE_PORT_REDIS", "6379"),
        ("REDIS_MASTER_SERVICE_PORT_METRICS_HTTP", "9121"),
        ("REDIS_MASTER_PORT", url.as_str()),
        ("REDIS_MASTER_PORT_6379_TCP", url.as_str()),
        ("REDIS_MASTER_PORT_6379_TCP_PROTO", "tcp"),
        // The container's own value wins.
        ("REDIS_MASTER_PORT_6379_TCP_PORT", "mine"),
        ("REDIS_MASTER_PORT_6379_TCP_ADDR", redis_ip.as_str()),
        ("REDIS_MASTER_PORT_9121_TCP", metrics.as_str()),
        ("REDIS_MASTER_PORT_9121_TCP_PROTO", "tcp"),
        ("REDIS_MASTER_PORT_9121_TCP_PORT", "9121"),
        ("REDIS_MASTER_PORT_9121_TCP_ADDR", redis_ip.as_str()),
        // References to service variables expand.
        ("REDIS_URL", redis_url.as_str()),
    ]
    .into_iter()
    .collect();
    assert_eq!(redis, want);
    // A headless Service has no address to give.
    assert!(
        !linked.keys().any(|k| k.starts_with("NOBODY_HOME")),
        "{linked:#?}"
    );

    // Without links only the `kubernetes` Service's variables, and a
    // reference to a variable nobody sets stays as written.
    let unlinked = env_of(&s, "unlinked");
    kubernetes(&unlinked);
    let redis: Vec<&str> = unlinked
        .keys()
        .filter(|k| k.starts_with("REDIS_"))
        .map(String::as_str)
        .collect();
    assert_eq!(redis, ["REDIS_MASTER_PORT_6379_TCP_PORT", "REDIS_URL"]);
    assert_eq!(
        unlinked["REDIS_URL"],
        "redis://$(REDIS_MASTER_SERVICE_HOST):$(REDIS_MASTER_SERVICE_PORT)"
    );
}

/// The files of `binary` and of every shared library it loads (as `ldd`
/// lists them, the dynamic loader included), at their paths on this host,
/// with the directories above them.
fn with_libraries(binary: &Path, at: &str) -> Vec<Entry> {
    let out = Command::new("ldd").arg(binary).output().expect("run ldd");
    assert!(out.status.success(), "ldd: {}", text(&out.stderr));
    let mut files: Vec<(String, PathBuf)> = vec![(at.to_string(), binary.to_path_buf())];
    for line in text(&out.stdout).lines() {
        // "libc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x…)" or
        // "/lib64/ld-linux-x86-64.so.2 (0x…)"; the vDSO has no file.
        let path = match line.split_once("=>") {
            Some((_, rest)) => rest.split_whitespace().next(),
            None => line.split_whitespace().next(),
        };
        if let Some(p) = path.filter(|p| p.starts_with('/')) {
            files.push((p.trim_start_matches('/').to_string(), PathBuf::from(p)));
        }
    }
    let dirs: std::collections::BTreeSet<String> = files
        .iter()
        .flat_map(|(path, _)| Path::new(path).ancestors().skip(1))
        .filter(|d| !d.as_os_str().is_empty())
        .map(|d| d.to_string_lossy().into_owned())
        .collect();
    let mut entries: Vec<Entry> = dirs.into_iter().map(|path| Entry::Dir { path }).collect();
    for (path, from) in files {
        let data = std::fs::read(&from).unwrap_or_else(|e| panic!("{}: {e}", from.display()));
        entries.push(Entry::File {
            path,
            data,
            mode: 0o755,
        });
    }
    entries
}

const CLIENT_IMAGE: &str = "skiff.local/incluster-client:1";

#[test]
fn a_job_running_an_in_cluster_client_library_completes() {
    let s = Server::up();
    let binary = example_binary("incluster_client");
    let archive = docker_archive(
        CLIENT_IMAGE,
        &with_libraries(&binary, "incluster-client"),
        serde_json::json!({"Entrypoint": ["/incluster-client"]}),
    )
    .expect("image archive");
    let path = s.dir.path().join("incluster-client.tar");
    std::fs::write(&path, archive).expect("write the image archive");
    let out = Command::new(skiff_binary())
        .args(["image", "import"])
        .arg(&path)
        .arg("--data-dir")
        .arg(s.dir.path().join("data"))
        .output()
        .expect("run skiff image import");
    assert!(out.status.success(), "import: {}", text(&out.stderr));

    // The client lists its namespace's pods as its ServiceAccount.
    s.ok(&["create", "namespace", "ops"]);
    s.ok(&[
        "-n",
        "ops",
        "create",
        "role",
        "pod-reader",
        "--verb=get,list",
        "--resource=pods",
    ]);
    s.ok(&[
        "-n",
        "ops",
        "create",
        "rolebinding",
        "pod-reader",
        "--role=pod-reader",
        "--serviceaccount=ops:default",
    ]);
    s.ok_stdin(
        &["apply", "-f", "-"],
        &format!(
            r#"apiVersion: batch/v1
kind: Job
metadata: {{name: operator, namespace: ops}}
spec:
  backoffLimit: 0
  template:
    spec:
      restartPolicy: Never
      containers:
      - name: client
        image: {CLIENT_IMAGE}
        imagePullPolicy: Never
"#
        ),
    );
    let outcome = wait_until("the Job to complete or fail", 120, || {
        let conds = text(
            &s.kubectl(&[
                "-n",
                "ops",
                "get",
                "job",
                "operator",
                "-o",
                "jsonpath={range .status.conditions[*]}{.type}={.status};{end}",
            ])
            .stdout,
        );
        if conds.contains("Complete=True") {
            Some(true)
        } else if conds.contains("Failed=True") {
            Some(false)
        } else {
            None
        }
    });
    let logs = text(&s.kubectl(&["-n", "ops", "logs", "job/operator"]).stdout);
    // kube-rs's URL of the `kubernetes` Service (443 is https' default
    // port, which the URL leaves out).
    let api = format!(
        "https://{}",
        jsonpath(&s, "svc", "kubernetes", "{.spec.clusterIP}")
    );
    assert!(outcome, "the in-cluster client failed: {logs}");
    assert!(
        logs.contains(&format!("in-cluster client ok: {api}/ is Kubernetes 1."))
            && logs.contains("pod(s) in namespace ops"),
        "{logs}"
    );
}
