//! The real kubectl v1.33 against skiff: what a user types and what they see.

use std::time::Duration;

use skiff_e2e::{text, Server};

const POD: &str = "apiVersion: v1
kind: Pod
metadata: {name: p1, labels: {app: web}}
spec:
  containers: [{name: c, image: busybox:1.36, command: [sleep, '3600']}]
";

fn deployment(replicas: u32, image: &str) -> String {
    format!(
        "apiVersion: apps/v1
kind: Deployment
metadata: {{name: web, labels: {{app: web}}}}
spec:
  replicas: {replicas}
  selector: {{matchLabels: {{app: web}}}}
  template:
    metadata: {{labels: {{app: web}}}}
    spec:
      containers:
      - name: httpd
        image: {image}
        ports: [{{containerPort: 80}}]
"
    )
}

const SERVICE: &str = "apiVersion: v1
kind: Service
metadata: {name: web}
spec:
  selector: {app: web}
  ports: [{port: 80, targetPort: 8080}]
";

const CONFIGMAP: &str = "apiVersion: v1
kind: ConfigMap
metadata: {name: settings}
data: {mode: fast}
";

const SECRET: &str = "apiVersion: v1
kind: Secret
metadata: {name: creds}
stringData: {password: hunter2}
";

const NAMESPACE: &str = "apiVersion: v1
kind: Namespace
metadata: {name: team-a}
";

#[test]
fn version_reports_a_1_33_server() {
    let s = Server::start();
    let out = s.ok(&["version"]);
    assert!(out.contains("Client Version: v1.33"), "{out}");
    assert!(out.contains("Server Version: v1.33"), "{out}");
}

#[test]
fn api_resources_and_versions_list_the_built_in_kinds() {
    let s = Server::start();
    let out = s.ok(&["api-resources"]);
    for line in [
        "pods",
        "po",
        "deployments",
        "deploy",
        "apps/v1",
        "horizontalpodautoscalers",
        "leases",
    ] {
        assert!(out.contains(line), "{line} missing from:\n{out}");
    }
    let out = s.ok(&["api-resources", "--namespaced=false", "-o", "name"]);
    assert!(
        out.lines().any(|l| l == "nodes") && out.lines().any(|l| l == "namespaces"),
        "{out}"
    );
    let out = s.ok(&["api-versions"]);
    for v in [
        "v1",
        "apps/v1",
        "batch/v1",
        "autoscaling/v2",
        "coordination.k8s.io/v1",
        "rbac.authorization.k8s.io/v1",
    ] {
        assert!(out.lines().any(|l| l == v), "{v} missing from:\n{out}");
    }
}

#[test]
fn a_fresh_cluster_has_the_system_namespaces() {
    let s = Server::start();
    let out = s.ok(&["get", "namespaces", "-o", "name"]);
    for ns in ["default", "kube-system", "kube-public", "kube-node-lease"] {
        assert!(out.contains(&format!("namespace/{ns}")), "{out}");
    }
    let out = s.ok(&["get", "svc", "kubernetes", "-n", "default"]);
    assert!(
        out.contains("10.43.0.1") && out.contains("443/TCP"),
        "{out}"
    );
}

#[test]
fn create_from_files_and_get_in_every_output_format() {
    let s = Server::start();
    assert_eq!(
        s.ok_stdin(&["create", "-f", "-"], NAMESPACE).trim(),
        "namespace/team-a created"
    );
    assert_eq!(
        s.ok_stdin(&["-n", "team-a", "create", "-f", "-"], POD)
            .trim(),
        "pod/p1 created"
    );
    assert_eq!(
        s.ok_stdin(
            &["-n", "team-a", "create", "-f", "-"],
            &deployment(2, "busybox:1.36")
        )
        .trim(),
        "deployment.apps/web created"
    );
    assert_eq!(
        s.ok_stdin(&["-n", "team-a", "create", "-f", "-"], SERVICE)
            .trim(),
        "service/web created"
    );
    assert_eq!(
        s.ok_stdin(&["-n", "team-a", "create", "-f", "-"], CONFIGMAP)
            .trim(),
        "configmap/settings created"
    );
    assert_eq!(
        s.ok_stdin(&["-n", "team-a", "create", "-f", "-"], SECRET)
            .trim(),
        "secret/creds created"
    );

    let table = s.ok(&["-n", "team-a", "get", "pods"]);
    let header: Vec<&str> = table.lines().next().unwrap().split_whitespace().collect();
    assert_eq!(header, ["NAME", "READY", "STATUS", "RESTARTS", "AGE"]);
    assert!(table.lines().nth(1).unwrap().starts_with("p1 "), "{table}");
    assert!(
        table.contains("0/1") && table.contains("Pending"),
        "{table}"
    );

    let wide = s.ok(&["-n", "team-a", "get", "pods", "-o", "wide"]);
    assert!(
        wide.lines().next().unwrap().contains("NOMINATED NODE"),
        "{wide}"
    );

    let deploy = s.ok(&["-n", "team-a", "get", "deploy"]);
    let header: Vec<&str> = deploy.lines().next().unwrap().split_whitespace().collect();
    assert_eq!(header, ["NAME", "READY", "UP-TO-DATE", "AVAILABLE", "AGE"]);
    assert!(deploy.contains("0/2"), "{deploy}");

    let svc = s.ok(&["-n", "team-a", "get", "svc", "web"]);
    assert!(
        svc.contains("ClusterIP") && svc.contains("80/TCP") && svc.contains("10.43."),
        "{svc}"
    );

    let json: serde_json::Value =
        serde_json::from_str(&s.ok(&["-n", "team-a", "get", "pod", "p1", "-o", "json"])).unwrap();
    assert_eq!(json["kind"], "Pod");
    assert_eq!(
        json["spec"]["restartPolicy"], "Always",
        "defaults are applied"
    );
    assert!(json["metadata"]["uid"].as_str().unwrap().len() > 10);
    assert!(json["metadata"]["resourceVersion"]
        .as_str()
        .unwrap()
        .parse::<u64>()
        .is_ok());

    let yaml = s.ok(&["-n", "team-a", "get", "cm", "settings", "-o", "yaml"]);
    assert!(
        yaml.contains("mode: fast") && yaml.contains("kind: ConfigMap"),
        "{yaml}"
    );

    let secret = s.ok(&[
        "-n",
        "team-a",
        "get",
        "secret",
        "creds",
        "-o",
        "jsonpath={.type}",
    ]);
    assert_eq!(secret, "Opaque");

    let names = s.ok(&["-n", "team-a", "get", "pods,deploy,svc", "-o", "name"]);
    assert_eq!(
        names.lines().collect::<Vec<_>>(),
        ["pod/p1", "deployment.apps/web", "service/web"]
    );

    let jp = s.ok(&[
        "-n",
        "team-a",
        "get",
        "deploy",
        "web",
        "-o",
        "jsonpath={.spec.replicas} {.spec.strategy.type}",
    ]);
    assert_eq!(jp, "2 RollingUpdate");
}

#[test]
fn selectors_and_all_namespaces() {
    let s = Server::start();
    s.ok_stdin(&["create", "-f", "-"], NAMESPACE);
    s.ok_stdin(&["create", "-f", "-"], POD);
    s.ok_stdin(
        &["-n", "team-a", "create", "-f", "-"],
        &POD.replace("p1", "p2").replace("app: web", "app: db"),
    );
    assert_eq!(
        s.ok(&["get", "pods", "-A", "-l", "app=web", "-o", "name"])
            .trim(),
        "pod/p1"
    );
    assert_eq!(
        s.ok(&["get", "pods", "-A", "-l", "app in (db,cache)", "-o", "name"])
            .trim(),
        "pod/p2"
    );
    assert_eq!(
        s.ok(&["get", "pods", "-A", "-l", "app!=web", "-o", "name"])
            .trim(),
        "pod/p2"
    );
    let all = s.ok(&["get", "pods", "-A"]);
    assert!(
        all.lines().next().unwrap().starts_with("NAMESPACE"),
        "{all}"
    );
    assert!(all.contains("default") && all.contains("team-a"), "{all}");
    let fs = s.ok(&[
        "get",
        "pods",
        "-A",
        "--field-selector",
        "metadata.namespace=team-a",
        "-o",
        "name",
    ]);
    assert_eq!(fs.trim(), "pod/p2");
    let pending = s.ok(&[
        "get",
        "pods",
        "-A",
        "--field-selector",
        "status.phase=Pending,spec.nodeName=",
        "-o",
        "name",
    ]);
    assert_eq!(pending.lines().count(), 2, "{pending}");
    let err = s.fails(&["get", "pods", "--field-selector", "spec.bogus=x"]);
    assert!(
        err.contains("field label not supported: spec.bogus"),
        "{err}"
    );
    let err = s.fails(&["get", "pods", "-l", "app in (a"]);
    assert!(
        err.contains("Error from server (BadRequest)") || err.contains("unable to parse"),
        "{err}"
    );
}

#[test]
fn label_annotate_and_describe() {
    let s = Server::start();
    s.ok_stdin(&["create", "-f", "-"], POD);
    assert_eq!(
        s.ok(&["label", "pod", "p1", "tier=front"]).trim(),
        "pod/p1 labeled"
    );
    assert_eq!(
        s.ok(&["annotate", "pod", "p1", "owner=me"]).trim(),
        "pod/p1 annotated"
    );
    let labels = s.ok(&["get", "pod", "p1", "--show-labels"]);
    assert!(labels.contains("app=web,tier=front"), "{labels}");
    let d = s.ok(&["describe", "pod", "p1"]);
    assert!(
        d.contains("Name:")
            && d.contains("p1")
            && d.contains("owner: me")
            && d.contains("busybox:1.36"),
        "{d}"
    );
    assert_eq!(
        s.ok(&["label", "pod", "p1", "tier-"]).trim(),
        "pod/p1 unlabeled"
    );
}

#[test]
fn patch_in_each_format() {
    let s = Server::start();
    s.ok_stdin(&["create", "-f", "-"], &deployment(1, "busybox:1.36"));
    s.ok(&[
        "patch",
        "deploy",
        "web",
        "--type",
        "merge",
        "-p",
        r#"{"metadata":{"labels":{"env":"prod"}}}"#,
    ]);
    s.ok(&[
        "patch",
        "deploy",
        "web",
        "--type",
        "json",
        "-p",
        r#"[{"op":"replace","path":"/spec/replicas","value":3}]"#,
    ]);
    s.ok(&["patch", "deploy", "web", "--type", "strategic", "-p", r#"{"spec":{"template":{"spec":{"containers":[{"name":"httpd","image":"busybox:1.37"}]}}}}"#]);
    let out = s.ok(&["get", "deploy", "web", "-o", "jsonpath={.metadata.labels.env} {.spec.replicas} {.spec.template.spec.containers[0].image} {.spec.template.spec.containers[0].ports[0].containerPort}"]);
    assert_eq!(
        out, "prod 3 busybox:1.37 80",
        "the strategic patch merged the container by name"
    );
    let err = s.fails(&[
        "patch",
        "deploy",
        "web",
        "--type",
        "json",
        "-p",
        r#"[{"op":"test","path":"/spec/replicas","value":9}]"#,
    ]);
    assert!(
        err.contains("The request is invalid") && err.contains("value did not match"),
        "{err}"
    );
}

#[test]
fn apply_twice_then_server_side_and_diff() {
    let s = Server::start();
    assert_eq!(
        s.ok_stdin(&["apply", "-f", "-"], &deployment(2, "busybox:1.36"))
            .trim(),
        "deployment.apps/web created"
    );
    assert_eq!(
        s.ok_stdin(&["apply", "-f", "-"], &deployment(2, "busybox:1.36"))
            .trim(),
        "deployment.apps/web unchanged"
    );
    assert_eq!(
        s.ok_stdin(&["apply", "-f", "-"], &deployment(4, "busybox:1.36"))
            .trim(),
        "deployment.apps/web configured"
    );
    assert_eq!(
        s.ok(&[
            "get",
            "deploy",
            "web",
            "-o",
            "jsonpath={.spec.replicas} {.metadata.generation}"
        ]),
        "4 2"
    );

    // diff exits 1 and shows the change, 0 when there is none.
    let out = s.kubectl_stdin(&["diff", "-f", "-"], &deployment(5, "busybox:1.36"));
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
    assert!(
        text(&out.stdout).contains("+  replicas: 5"),
        "{}",
        text(&out.stdout)
    );
    let out = s.kubectl_stdin(&["diff", "-f", "-"], &deployment(4, "busybox:1.36"));
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}{}",
        text(&out.stdout),
        text(&out.stderr)
    );

    // Server-side apply of a new object, then a conflicting change by another manager.
    let cm = CONFIGMAP.replace("settings", "ssa");
    assert_eq!(
        s.ok_stdin(&["apply", "--server-side", "-f", "-"], &cm)
            .trim(),
        "configmap/ssa serverside-applied"
    );
    s.ok(&[
        "patch",
        "cm",
        "ssa",
        "--type",
        "merge",
        "-p",
        r#"{"data":{"mode":"slow"}}"#,
    ]);
    let out = s.kubectl_stdin(&["apply", "--server-side", "-f", "-"], &cm);
    assert!(!out.status.success());
    assert!(
        text(&out.stderr).contains("conflict with \"kubectl-patch\""),
        "{}",
        text(&out.stderr)
    );
    s.ok_stdin(
        &["apply", "--server-side", "--force-conflicts", "-f", "-"],
        &cm,
    );
    assert_eq!(
        s.ok(&["get", "cm", "ssa", "-o", "jsonpath={.data.mode}"]),
        "fast"
    );
    let mf = s.ok(&["get", "cm", "ssa", "-o", "json", "--show-managed-fields"]);
    assert!(
        mf.contains("\"manager\": \"kubectl\"") && mf.contains("\"operation\": \"Apply\""),
        "{mf}"
    );
}

#[test]
fn replace_and_scale() {
    let s = Server::start();
    s.ok_stdin(&["create", "-f", "-"], &deployment(1, "busybox:1.36"));
    assert_eq!(
        s.ok_stdin(&["replace", "-f", "-"], &deployment(2, "busybox:1.37"))
            .trim(),
        "deployment.apps/web replaced"
    );
    assert_eq!(
        s.ok(&["scale", "deploy", "web", "--replicas=7"]).trim(),
        "deployment.apps/web scaled"
    );
    assert_eq!(
        s.ok(&[
            "get",
            "deploy",
            "web",
            "-o",
            "jsonpath={.spec.replicas} {.spec.template.spec.containers[0].image}"
        ]),
        "7 busybox:1.37"
    );
    let err = s.fails(&[
        "scale",
        "deploy",
        "web",
        "--replicas=3",
        "--current-replicas=2",
    ]);
    assert!(
        err.contains("Expected replicas to be 2, was 7") || err.contains("precondition"),
        "{err}"
    );
}

#[test]
fn explain_prints_field_documentation() {
    let s = Server::start();
    let out = s.ok(&["explain", "pod.spec.containers"]);
    assert!(
        out.contains("KIND:       Pod") && out.contains("FIELD: containers <[]Container>"),
        "{out}"
    );
    assert!(
        out.contains("image\t<string>")
            || out.contains("image <string>")
            || out.contains("image\t"),
        "{out}"
    );
    let out = s.ok(&["explain", "deployment.spec.replicas"]);
    assert!(out.contains("GROUP:      apps"), "{out}");
}

#[test]
fn delete_by_name_label_all_and_wait() {
    let s = Server::start();
    s.ok_stdin(&["create", "-f", "-"], POD);
    s.ok_stdin(&["create", "-f", "-"], &POD.replace("p1", "p2"));
    s.ok_stdin(
        &["create", "-f", "-"],
        &POD.replace("p1", "p3").replace("app: web", "app: other"),
    );
    s.ok_stdin(&["create", "-f", "-"], CONFIGMAP);
    assert_eq!(s.ok(&["delete", "pod", "p1"]).trim(), "pod \"p1\" deleted");
    assert_eq!(
        s.ok(&["delete", "pods", "-l", "app=web"]).trim(),
        "pod \"p2\" deleted"
    );
    assert_eq!(s.ok(&["get", "pods", "-o", "name"]).trim(), "pod/p3");
    s.ok(&["delete", "pods", "--all"]);
    assert_eq!(s.ok(&["get", "pods", "-o", "name"]).trim(), "");
    assert_eq!(
        s.ok(&["delete", "configmap", "settings"]).trim(),
        "configmap \"settings\" deleted"
    );
    s.ok_stdin(&["create", "-f", "-"], POD);
    let waiter = s
        .kubectl_cmd(&["wait", "--for=delete", "pod/p1", "--timeout=20s"])
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(500));
    s.ok(&["delete", "pod", "p1", "--wait=false"]);
    let out = waiter.wait_with_output().unwrap();
    assert!(out.status.success());
}

#[test]
fn deleting_a_namespace_empties_and_removes_it() {
    let s = Server::start();
    s.ok_stdin(&["create", "-f", "-"], NAMESPACE);
    s.ok_stdin(&["-n", "team-a", "create", "-f", "-"], CONFIGMAP);
    s.ok_stdin(&["-n", "team-a", "create", "-f", "-"], POD);
    assert_eq!(
        s.ok(&["delete", "namespace", "team-a", "--timeout=30s"])
            .trim(),
        "namespace \"team-a\" deleted"
    );
    let err = s.fails(&["get", "namespace", "team-a"]);
    assert!(
        err.contains("Error from server (NotFound): namespaces \"team-a\" not found"),
        "{err}"
    );
    assert_eq!(
        s.ok(&["get", "cm", "-n", "team-a", "-o", "name"]).trim(),
        ""
    );
    let err = s.fails(&["-n", "gone", "create", "-f", "-"]);
    assert!(
        err.contains("namespaces \"gone\" not found") || err.contains("no objects passed"),
        "{err}"
    );
}

#[test]
fn watching_with_get_w_shows_changes_as_they_happen() {
    let s = Server::start();
    s.ok_stdin(&["create", "-f", "-"], POD);
    let out_path = s.dir.path().join("watch.out");
    let out_file = std::fs::File::create(&out_path).unwrap();
    let mut watcher = s
        .kubectl_cmd(&["get", "pods", "-w"])
        .stdout(out_file)
        .spawn()
        .unwrap();
    let read = || std::fs::read_to_string(&out_path).unwrap_or_default();
    let wait_for = |what: &dyn Fn(&str) -> bool| {
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        while !what(&read()) && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(50));
        }
    };
    // The watch has started once it printed the existing pod.
    wait_for(&|o| o.lines().any(|l| l.starts_with("p1 ")));
    s.ok_stdin(&["create", "-f", "-"], &POD.replace("p1", "p2"));
    wait_for(&|o| o.lines().any(|l| l.starts_with("p2 ")));
    let _ = watcher.kill();
    let _ = watcher.wait();
    let out = read();
    assert!(
        out.lines().next().unwrap_or("").starts_with("NAME"),
        "{out}"
    );
    assert!(out.lines().any(|l| l.starts_with("p1 ")), "{out}");
    assert!(
        out.lines().any(|l| l.starts_with("p2 ")),
        "the new pod appears in the watch: {out}"
    );
}

#[test]
fn errors_read_as_on_kubernetes() {
    let s = Server::start();
    let err = s.fails(&["get", "pod", "nope"]);
    assert!(
        err.contains("Error from server (NotFound): pods \"nope\" not found"),
        "{err}"
    );
    s.ok_stdin(&["create", "-f", "-"], POD);
    let err = s.kubectl_stdin(&["create", "-f", "-"], POD);
    assert!(
        text(&err.stderr).contains("Error from server (AlreadyExists)")
            && text(&err.stderr).contains("pods \"p1\" already exists"),
        "{}",
        text(&err.stderr)
    );
    let bad = "apiVersion: v1\nkind: Pod\nmetadata: {name: Bad_Name}\nspec: {containers: []}\n";
    let out = s.kubectl_stdin(&["create", "-f", "-"], bad);
    let e = text(&out.stderr);
    assert!(
        e.contains("is invalid")
            && e.contains("metadata.name")
            && e.contains("spec.containers: Required value"),
        "{e}"
    );
    let unknown = POD.replace("image:", "imagee: x, image:");
    let out = s.kubectl_stdin(&["create", "-f", "-"], &unknown);
    assert!(
        text(&out.stderr).contains("unknown field \"spec.containers[0].imagee\""),
        "{}",
        text(&out.stderr)
    );
}

#[test]
fn requests_without_credentials_are_unauthorized() {
    let s = Server::start();
    let cfg = std::fs::read_to_string(&s.kubeconfig).unwrap();
    let ca = cfg
        .lines()
        .find_map(|l| l.trim().strip_prefix("certificate-authority-data: "))
        .unwrap()
        .to_string();
    let anon = format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: https://127.0.0.1:{}\n    certificate-authority-data: {ca}\ncontexts:\n- name: c\n  context: {{cluster: c, user: nobody}}\ncurrent-context: c\nusers:\n- name: nobody\n  user: {{token: not-a-credential}}\n",
        s.port
    );
    let path = s.dir.path().join("anon.kubeconfig");
    std::fs::write(&path, anon).unwrap();
    let out = std::process::Command::new(skiff_e2e::kubectl_binary())
        .env("KUBECONFIG", &path)
        .args(["get", "pods"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(text(&out.stderr).contains("You must be logged in to the server (the server has asked for the client to provide credentials)"), "{}", text(&out.stderr));
}

#[test]
fn typed_create_commands_send_protobuf_and_work() {
    let s = Server::start();
    assert_eq!(
        s.ok(&["create", "namespace", "team-b"]).trim(),
        "namespace/team-b created"
    );
    let dir = s.dir.path().join("files");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("app.conf"), "level=debug\n").unwrap();
    let file_arg = format!("--from-file={}", dir.join("app.conf").display());
    assert_eq!(
        s.ok(&[
            "-n",
            "team-b",
            "create",
            "configmap",
            "app",
            "--from-literal=mode=fast",
            &file_arg
        ])
        .trim(),
        "configmap/app created"
    );
    assert_eq!(
        s.ok(&[
            "-n",
            "team-b",
            "get",
            "cm",
            "app",
            "-o",
            "jsonpath={.data.mode}|{.data.app\\.conf}"
        ]),
        "fast|level=debug\n"
    );
    assert_eq!(
        s.ok(&[
            "-n",
            "team-b",
            "create",
            "secret",
            "generic",
            "creds",
            "--from-literal=password=hunter2",
            &file_arg
        ])
        .trim(),
        "secret/creds created"
    );
    assert_eq!(
        s.ok(&[
            "-n",
            "team-b",
            "get",
            "secret",
            "creds",
            "-o",
            "jsonpath={.type} {.data.password}"
        ]),
        "Opaque aHVudGVyMg=="
    );
    assert_eq!(
        s.ok(&[
            "-n",
            "team-b",
            "create",
            "deployment",
            "web",
            "--image=busybox:1.36",
            "--replicas=0",
            "--port=80"
        ])
        .trim(),
        "deployment.apps/web created"
    );
    assert_eq!(
        s.ok(&[
            "-n",
            "team-b",
            "get",
            "deploy",
            "web",
            "-o",
            "jsonpath={.spec.replicas} {.spec.template.spec.containers[0].ports[0].containerPort}"
        ]),
        "0 80"
    );
    assert_eq!(
        s.ok(&[
            "-n",
            "team-b",
            "create",
            "service",
            "clusterip",
            "web",
            "--tcp=80:8080"
        ])
        .trim(),
        "service/web created"
    );
    assert_eq!(
        s.ok(&[
            "-n",
            "team-b",
            "run",
            "box",
            "--image=busybox:1.36",
            "--",
            "sleep",
            "60"
        ])
        .trim(),
        "pod/box created"
    );
    assert_eq!(
        s.ok(&[
            "-n",
            "team-b",
            "create",
            "job",
            "once",
            "--image=busybox:1.36",
            "--",
            "true"
        ])
        .trim(),
        "job.batch/once created"
    );
    assert_eq!(
        s.ok(&[
            "-n",
            "team-b",
            "create",
            "cronjob",
            "tick",
            "--image=busybox:1.36",
            "--schedule=*/5 * * * *",
            "--",
            "true"
        ])
        .trim(),
        "cronjob.batch/tick created"
    );
    assert_eq!(
        s.ok(&["-n", "team-b", "create", "serviceaccount", "robot"])
            .trim(),
        "serviceaccount/robot created"
    );
    let all = s.ok(&["-n", "team-b", "get", "all", "-o", "name"]);
    for n in [
        "pod/box",
        "service/web",
        "deployment.apps/web",
        "job.batch/once",
        "cronjob.batch/tick",
    ] {
        assert!(all.lines().any(|l| l == n), "{n} missing from:\n{all}");
    }
}

#[test]
fn objects_survive_a_restart_and_versions_keep_increasing() {
    let mut s = Server::start();
    s.ok_stdin(&["create", "-f", "-"], CONFIGMAP);
    s.ok_stdin(&["apply", "-f", "-"], &deployment(2, "busybox:1.36"));
    let before: u64 = s
        .ok(&[
            "get",
            "cm",
            "settings",
            "-o",
            "jsonpath={.metadata.resourceVersion}",
        ])
        .parse()
        .unwrap();
    let uid = s.ok(&["get", "cm", "settings", "-o", "jsonpath={.metadata.uid}"]);
    s.restart();
    assert_eq!(
        s.ok(&[
            "get",
            "cm",
            "settings",
            "-o",
            "jsonpath={.metadata.uid} {.data.mode}"
        ]),
        format!("{uid} fast")
    );
    assert_eq!(
        s.ok_stdin(&["apply", "-f", "-"], &deployment(2, "busybox:1.36"))
            .trim(),
        "deployment.apps/web unchanged"
    );
    s.ok(&["label", "cm", "settings", "after=restart"]);
    let after: u64 = s
        .ok(&[
            "get",
            "cm",
            "settings",
            "-o",
            "jsonpath={.metadata.resourceVersion}",
        ])
        .parse()
        .unwrap();
    assert!(after > before, "{after} > {before}");
    let ns = s.ok(&["get", "ns", "-o", "name"]);
    assert_eq!(
        ns.lines().filter(|l| *l == "namespace/default").count(),
        1,
        "bootstrap ran once: {ns}"
    );
}

#[test]
fn auth_whoami_and_can_i_answer() {
    let s = Server::start();
    let who = s.ok(&["auth", "whoami"]);
    assert!(
        who.contains("admin") && who.contains("system:masters"),
        "{who}"
    );
    assert_eq!(
        s.ok(&["auth", "can-i", "create", "deployments"]).trim(),
        "yes"
    );
    let list = s.ok(&["auth", "can-i", "--list"]);
    assert!(list.contains("*.*"), "{list}");
}
