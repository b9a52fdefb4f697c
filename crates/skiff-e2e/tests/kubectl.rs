//! The real kubectl v1.33 against skiff: what a user types and what they see.

use std::time::Duration;

use skiff_e2e::{text, wait_until, Server};

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

    // The Deployment's own pods (made by the controllers) are left aside.
    let names = s.ok(&["-n", "team-a", "get", "pods,deploy,svc", "-o", "name"]);
    assert_eq!(
        names
            .lines()
            .filter(|l| !l.starts_with("pod/web-"))
            .collect::<Vec<_>>(),
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
    // Worded as kube-apiserver words it: an Update manager with the
    // version it wrote.
    assert!(
        text(&out.stderr).contains(
            "Apply failed with 1 conflict: conflict with \"kubectl-patch\" using v1: .data.mode"
        ),
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

    // A conflict inside a list item names the item by its key as a JSON
    // value, as kube-apiserver prints the path.
    let out = s.kubectl_stdin(
        &["apply", "--server-side", "--field-manager=other", "-f", "-"],
        &deployment(4, "busybox:1.37"),
    );
    assert!(!out.status.success());
    assert!(
        text(&out.stderr).contains(
            "Apply failed with 1 conflict: conflict with \"kubectl-client-side-apply\" using apps/v1: \
             .spec.template.spec.containers[name=\"httpd\"].image"
        ),
        "{}",
        text(&out.stderr)
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
    assert_eq!(
        s.ok(&["delete", "pods", "--all"]).trim(),
        "pod \"p3\" deleted"
    );
    assert_eq!(s.ok(&["get", "pods", "-o", "name"]).trim(), "");
    assert_eq!(
        s.ok(&["delete", "configmap", "settings"]).trim(),
        "configmap \"settings\" deleted"
    );
    let err = s.fails(&["delete", "configmap", "settings"]);
    assert!(
        err.contains("Error from server (NotFound): configmaps \"settings\" not found"),
        "{err}"
    );
    s.ok_stdin(&["create", "-f", "-"], POD);
    let waiter = s.kubectl_background(&["wait", "--for=delete", "pod/p1", "--timeout=20s"]);
    std::thread::sleep(Duration::from_millis(500));
    s.ok(&["delete", "pod", "p1", "--wait=false"]);
    let (code, out, err) = waiter.finish();
    assert_eq!(code, Some(0), "{out}{err}");
    assert_eq!(out.trim(), "pod/p1 condition met");
}

#[test]
fn wait_for_a_jsonpath_value() {
    let s = Server::start();
    s.ok_stdin(&["create", "-f", "-"], CONFIGMAP);
    let waiter = s.kubectl_background(&[
        "wait",
        "--for=jsonpath={.data.mode}=slow",
        "configmap/settings",
        "--timeout=20s",
    ]);
    std::thread::sleep(Duration::from_millis(500));
    s.ok(&[
        "patch",
        "cm",
        "settings",
        "-p",
        r#"{"data":{"mode":"slow"}}"#,
    ]);
    let (code, out, err) = waiter.finish();
    assert_eq!(code, Some(0), "{out}{err}");
    assert_eq!(out.trim(), "configmap/settings condition met");
}

#[test]
fn finalizers_hold_a_deletion_until_removed() {
    let s = Server::start();
    let held = "apiVersion: v1
kind: ConfigMap
metadata: {name: held, finalizers: [example.com/hold]}
data: {a: b}
";
    s.ok_stdin(&["create", "-f", "-"], held);
    assert_eq!(
        s.ok(&["delete", "cm", "held", "--wait=false"]).trim(),
        "configmap \"held\" deleted"
    );
    // Still there, marked for deletion.
    let out = s.ok(&[
        "get",
        "cm",
        "held",
        "-o",
        "jsonpath={.metadata.finalizers[0]} {.metadata.deletionTimestamp}",
    ]);
    let (finalizer, ts) = out.split_once(' ').unwrap();
    assert_eq!(finalizer, "example.com/hold");
    assert!(ts.ends_with('Z') && ts.len() == 20, "{out}");
    let waiter = s.kubectl_background(&["wait", "--for=delete", "cm/held", "--timeout=20s"]);
    std::thread::sleep(Duration::from_millis(500));
    s.ok(&[
        "patch",
        "cm",
        "held",
        "--type=json",
        "-p",
        r#"[{"op":"remove","path":"/metadata/finalizers"}]"#,
    ]);
    let (code, out, err) = waiter.finish();
    assert_eq!(code, Some(0), "{out}{err}");
    let err = s.fails(&["get", "cm", "held"]);
    assert!(
        err.contains("Error from server (NotFound): configmaps \"held\" not found"),
        "{err}"
    );
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
    let out = s.kubectl_stdin(&["-n", "gone", "create", "-f", "-"], CONFIGMAP);
    assert!(!out.status.success());
    assert_eq!(
        text(&out.stderr).trim(),
        "Error from server (NotFound): error when creating \"STDIN\": namespaces \"gone\" not found"
    );
}

#[test]
fn watching_with_get_w_shows_changes_as_they_happen() {
    // Without a scheduler, the only changes to the pods are the test's own
    // (a scheduler would add a PodScheduled condition to these unplaceable
    // pods, another row each).
    let s = Server::start_with(&["--disable-scheduler", "--disable-controllers"]);
    s.ok(&["create", "namespace", "watch"]);
    // Without controllers nothing makes the namespace's default account,
    // which pod admission requires.
    s.ok(&["-n", "watch", "create", "serviceaccount", "default"]);
    s.ok_stdin(&["-n", "watch", "create", "-f", "-"], POD);
    let w = s.kubectl_background(&["-n", "watch", "get", "pods", "-w"]);
    let rows = |o: &str, name: &str| {
        o.lines()
            .filter(|l| l.split_whitespace().next() == Some(name))
            .count()
    };
    // The watch has started once it printed the existing pod.
    w.wait_for("the existing pod p1", |o| rows(o, "p1") == 1);
    s.ok_stdin(
        &["-n", "watch", "create", "-f", "-"],
        &POD.replace("p1", "p2"),
    );
    w.wait_for("the new pod p2", |o| rows(o, "p2") == 1);
    s.ok(&["-n", "watch", "label", "pod", "p1", "seen=yes"]);
    let out = w.wait_for("a second line for the changed pod p1", |o| {
        rows(o, "p1") == 2
    });
    let header: Vec<&str> = out.lines().next().unwrap().split_whitespace().collect();
    assert_eq!(
        header,
        ["NAME", "READY", "STATUS", "RESTARTS", "AGE"],
        "{out}"
    );
}

#[test]
fn watch_events_show_added_modified_and_deleted() {
    let s = Server::start();
    s.ok(&["create", "namespace", "events"]);
    s.ok_stdin(&["-n", "events", "create", "-f", "-"], POD);
    let w = s.kubectl_background(&["-n", "events", "get", "pods", "-w", "--output-watch-events"]);
    let has = |o: &str, event: &str, name: &str| {
        o.lines().any(|l| {
            let mut f = l.split_whitespace();
            f.next() == Some(event) && f.next() == Some(name)
        })
    };
    w.wait_for("ADDED p1", |o| has(o, "ADDED", "p1"));
    s.ok(&["-n", "events", "annotate", "pod", "p1", "note=hi"]);
    w.wait_for("MODIFIED p1", |o| has(o, "MODIFIED", "p1"));
    // A pod not bound to a node goes at once.
    s.ok(&["-n", "events", "delete", "pod", "p1"]);
    let out = w.wait_for("DELETED p1", |o| has(o, "DELETED", "p1"));
    assert!(out.starts_with("EVENT "), "{out}");
    let events: Vec<&str> = out
        .lines()
        .skip(1)
        .filter_map(|l| l.split_whitespace().next())
        .collect();
    assert_eq!(events.first(), Some(&"ADDED"), "{out}");
    assert_eq!(events.last(), Some(&"DELETED"), "{out}");
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
    let out = s.kubectl_with(&path, &["get", "pods"]).output().unwrap();
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
    assert_eq!(
        s.ok(&[
            "-n",
            "team-b",
            "create",
            "ingress",
            "front",
            "--class=nginx",
            "--rule=web.example.com/shop*=web:80,tls=web-tls",
        ])
        .trim(),
        "ingress.networking.k8s.io/front created"
    );
    let row = s.ok(&["-n", "team-b", "get", "ingress", "front", "--no-headers"]);
    let cells: Vec<&str> = row.split_whitespace().collect();
    assert_eq!(
        &cells[..5],
        ["front", "nginx", "web.example.com", "80,", "443"],
        "{row}"
    );
    assert_eq!(
        s.ok(&[
            "-n",
            "team-b",
            "get",
            "ingress",
            "front",
            "-o",
            "jsonpath={.spec.rules[0].http.paths[0].pathType} {.spec.rules[0].http.paths[0].backend.service.port.number}",
        ]),
        "Prefix 80"
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

#[test]
fn a_request_without_credentials_is_anonymous_and_gets_403() {
    // kubectl itself asks for a user name when its kubeconfig has no
    // credentials, so this asks over plain HTTPS, trusting the cluster CA.
    let s = Server::start();
    let script = r#"
import base64, json, ssl, sys, urllib.error, urllib.request
cfg = open(sys.argv[1]).read()
ca = next(l.split(":", 1)[1].strip() for l in cfg.splitlines()
          if l.strip().startswith("certificate-authority-data:"))
ctx = ssl.create_default_context(cadata=base64.b64decode(ca).decode())
try:
    urllib.request.urlopen(f"https://127.0.0.1:{sys.argv[2]}/api/v1/namespaces/default/pods", context=ctx)
    print("200")
except urllib.error.HTTPError as e:
    print(e.code, e.headers.get("Content-Type"))
    print(e.read().decode())
"#;
    let out = std::process::Command::new(skiff_e2e::python_binary())
        .args(["-c", script])
        .arg(&s.kubeconfig)
        .arg(s.port.to_string())
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out.stderr));
    let stdout = text(&out.stdout);
    let (first, body) = stdout.split_once('\n').unwrap();
    // kube-apiserver treats a request without credentials as
    // system:anonymous, which RBAC allows only the public health paths.
    assert_eq!(first, "403 application/json", "{stdout}");
    let status: serde_json::Value = serde_json::from_str(body).unwrap();
    assert_eq!(status["kind"], "Status", "{body}");
    assert_eq!(status["status"], "Failure", "{body}");
    assert_eq!(status["reason"], "Forbidden", "{body}");
    assert_eq!(status["code"], 403, "{body}");
    assert_eq!(
        status["message"],
        r#"pods is forbidden: User "system:anonymous" cannot list resource "pods" in API group "" in the namespace "default""#,
        "{body}"
    );
}

#[test]
fn health_endpoints_and_cluster_info() {
    let s = Server::start();
    for path in ["/healthz", "/livez", "/readyz"] {
        assert_eq!(s.ok(&["get", "--raw", path]), "ok", "{path}");
    }
    let info = s.ok(&["cluster-info"]);
    assert!(
        info.contains(&format!(
            "Kubernetes control plane is running at https://127.0.0.1:{}",
            s.port
        )),
        "{info}"
    );
    let version: serde_json::Value =
        serde_json::from_str(&s.ok(&["get", "--raw", "/version"])).unwrap();
    assert_eq!(version["major"], "1");
    assert_eq!(version["minor"], "33");
}

#[test]
fn what_kubectl_says_about_unknown_types_and_empty_namespaces() {
    let s = Server::start();
    let err = s.fails(&["get", "foos"]);
    assert!(
        err.contains("error: the server doesn't have a resource type \"foos\""),
        "{err}"
    );
    let out = s.kubectl(&["get", "pods"]);
    assert!(out.status.success());
    assert_eq!(text(&out.stdout), "");
    assert_eq!(
        text(&out.stderr).trim(),
        "No resources found in default namespace."
    );
    // (Not ConfigMaps: every namespace gets kube-root-ca.crt, as on Kubernetes.)
    s.ok(&["create", "namespace", "quiet"]);
    let out = s.kubectl(&["get", "deploy,jobs,secrets", "-n", "quiet"]);
    assert!(out.status.success());
    assert_eq!(
        text(&out.stderr).trim(),
        "No resources found in quiet namespace."
    );
}

#[test]
fn a_stale_replace_is_a_conflict() {
    let s = Server::start();
    s.ok_stdin(&["create", "-f", "-"], CONFIGMAP);
    let old = s.ok(&["get", "cm", "settings", "-o", "yaml"]);
    s.ok(&["label", "cm", "settings", "changed=yes"]);
    let out = s.kubectl_stdin(&["replace", "-f", "-"], &old.replace("fast", "slow"));
    assert!(!out.status.success());
    assert_eq!(
        text(&out.stderr).trim(),
        "Error from server (Conflict): error when replacing \"STDIN\": Operation cannot be fulfilled on configmaps \"settings\": the object has been modified; please apply your changes to the latest version and try again"
    );
    assert_eq!(
        s.ok(&["get", "cm", "settings", "-o", "jsonpath={.data.mode}"]),
        "fast",
        "a failed write changes nothing"
    );
}

#[test]
fn paging_custom_columns_and_sorting() {
    let s = Server::start();
    s.ok(&["create", "namespace", "many"]);
    // As on Kubernetes, each namespace soon holds kube-root-ca.crt as well.
    wait_until("kube-root-ca.crt in the namespace", 30, || {
        s.kubectl(&["-n", "many", "get", "cm", "kube-root-ca.crt"])
            .status
            .success()
            .then_some(())
    });
    for name in ["e", "c", "a", "d", "b"] {
        s.ok(&[
            "-n",
            "many",
            "create",
            "configmap",
            &format!("cm-{name}"),
            &format!("--from-literal=letter={name}"),
        ]);
    }
    // kubectl pages through the list two at a time and shows all six.
    assert_eq!(
        s.ok(&["-n", "many", "get", "cm", "--chunk-size=2", "-o", "name"])
            .lines()
            .collect::<Vec<_>>(),
        [
            "configmap/cm-a",
            "configmap/cm-b",
            "configmap/cm-c",
            "configmap/cm-d",
            "configmap/cm-e",
            "configmap/kube-root-ca.crt"
        ]
    );
    let page: serde_json::Value = serde_json::from_str(&s.ok(&[
        "get",
        "--raw",
        "/api/v1/namespaces/many/configmaps?limit=2",
    ]))
    .unwrap();
    assert_eq!(page["items"].as_array().unwrap().len(), 2);
    let cont = page["metadata"]["continue"].as_str().unwrap();
    assert!(!cont.is_empty());
    assert_eq!(page["metadata"]["remainingItemCount"], 4);
    let table = s.ok(&[
        "-n",
        "many",
        "get",
        "cm",
        "-o",
        "custom-columns=NAME:.metadata.name,LETTER:.data.letter",
        "--sort-by=.metadata.creationTimestamp",
    ]);
    let rows: Vec<Vec<&str>> = table
        .lines()
        .map(|l| l.split_whitespace().collect())
        .collect();
    assert_eq!(rows[0], ["NAME", "LETTER"]);
    assert_eq!(rows.len(), 7, "{table}");
    assert!(
        rows.iter().any(|r| r == &["kube-root-ca.crt", "<none>"]),
        "{table}"
    );
    assert!(rows[1..].iter().any(|r| r == &["cm-e", "e"]), "{table}");
    let letters = s.ok(&[
        "-n",
        "many",
        "get",
        "cm",
        "--sort-by=.data.letter",
        "-o",
        "jsonpath={range .items[*]}{.data.letter}{end}",
    ]);
    assert_eq!(letters, "abcde");
}

#[test]
fn edit_set_image_rollout_restart_and_expose() {
    let s = Server::start();
    s.ok(&["create", "namespace", "ops"]);
    s.ok_stdin(&["-n", "ops", "create", "-f", "-"], CONFIGMAP);
    let out = s
        .kubectl_cmd(&["-n", "ops", "edit", "cm", "settings"])
        .env("KUBE_EDITOR", "sed -i s/fast/slow/")
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout).trim(), "configmap/settings edited");
    assert_eq!(
        s.ok(&[
            "-n",
            "ops",
            "get",
            "cm",
            "settings",
            "-o",
            "jsonpath={.data.mode}"
        ]),
        "slow"
    );

    s.ok_stdin(
        &["-n", "ops", "create", "-f", "-"],
        &deployment(2, "busybox:1.36"),
    );
    assert_eq!(
        s.ok(&[
            "-n",
            "ops",
            "set",
            "image",
            "deployment/web",
            "httpd=busybox:1.37"
        ])
        .trim(),
        "deployment.apps/web image updated"
    );
    assert_eq!(
        s.ok(&["-n", "ops", "rollout", "restart", "deployment", "web"])
            .trim(),
        "deployment.apps/web restarted"
    );
    let out = s.ok(&[
        "-n",
        "ops",
        "get",
        "deploy",
        "web",
        "-o",
        "jsonpath={.spec.template.spec.containers[0].image} {.metadata.generation}",
    ]);
    assert_eq!(out, "busybox:1.37 3");
    let restarted = s.ok(&[
        "-n",
        "ops",
        "get",
        "deploy",
        "web",
        "-o",
        r"jsonpath={.spec.template.metadata.annotations.kubectl\.kubernetes\.io/restartedAt}",
    ]);
    assert!(restarted.ends_with('Z'), "{restarted}");
    assert_eq!(
        s.ok(&["-n", "ops", "rollout", "pause", "deployment/web"])
            .trim(),
        "deployment.apps/web paused"
    );
    assert_eq!(
        s.ok(&[
            "-n",
            "ops",
            "get",
            "deploy",
            "web",
            "-o",
            "jsonpath={.spec.paused}"
        ]),
        "true"
    );
    assert_eq!(
        s.ok(&["-n", "ops", "rollout", "resume", "deployment/web"])
            .trim(),
        "deployment.apps/web resumed"
    );
    assert_eq!(
        s.ok(&[
            "-n",
            "ops",
            "expose",
            "deployment",
            "web",
            "--port=80",
            "--target-port=8080"
        ])
        .trim(),
        "service/web exposed"
    );
    assert_eq!(
        s.ok(&[
            "-n",
            "ops",
            "get",
            "svc",
            "web",
            "-o",
            "jsonpath={.spec.selector.app} {.spec.ports[0].port} {.spec.ports[0].targetPort}"
        ]),
        "web 80 8080"
    );
    let d = s.ok(&["-n", "ops", "describe", "deployment", "web"]);
    for want in [
        "Name:                   web",
        "Namespace:              ops",
        "Selector:               app=web",
        "Replicas:               2 desired",
        "StrategyType:           RollingUpdate",
        "Image:         busybox:1.37",
    ] {
        assert!(d.contains(want), "{want:?} missing from:\n{d}");
    }
}

#[test]
fn server_side_dry_run_changes_nothing() {
    let s = Server::start();
    assert_eq!(
        s.ok_stdin(&["create", "--dry-run=server", "-f", "-"], CONFIGMAP)
            .trim(),
        "configmap/settings created (server dry run)"
    );
    let err = s.fails(&["get", "cm", "settings"]);
    assert!(err.contains("(NotFound)"), "{err}");
    s.ok_stdin(&["create", "-f", "-"], CONFIGMAP);
    assert_eq!(
        s.ok(&["delete", "cm", "settings", "--dry-run=server"])
            .trim(),
        "configmap \"settings\" deleted (server dry run)"
    );
    assert_eq!(
        s.ok_stdin(
            &["apply", "--dry-run=server", "-f", "-"],
            &CONFIGMAP.replace("fast", "slow")
        )
        .trim(),
        "configmap/settings configured (server dry run)"
    );
    assert_eq!(
        s.ok(&["get", "cm", "settings", "-o", "jsonpath={.data.mode}"]),
        "fast"
    );
}

#[test]
fn generate_name_gives_each_object_its_own_name() {
    let s = Server::start();
    let pod = POD.replace("name: p1", "generateName: web-");
    let mut names = Vec::new();
    for _ in 0..2 {
        let out = s.ok_stdin(&["create", "-f", "-"], &pod);
        let name = out
            .trim()
            .strip_prefix("pod/")
            .and_then(|n| n.strip_suffix(" created"))
            .unwrap_or_else(|| panic!("{out}"))
            .to_string();
        assert!(
            name.starts_with("web-")
                && name.len() == 9
                && name[4..]
                    .chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit()),
            "{name}"
        );
        names.push(name);
    }
    assert_ne!(names[0], names[1]);
    let listed = s.ok(&["get", "pods", "-o", "name"]);
    assert_eq!(listed.lines().count(), 2, "{listed}");
}

#[test]
fn apply_removes_what_the_manifest_no_longer_has() {
    let s = Server::start();
    let v1 = "apiVersion: apps/v1
kind: Deployment
metadata: {name: api, labels: {app: api, tier: backend}}
spec:
  replicas: 1
  selector: {matchLabels: {app: api}}
  template:
    metadata: {labels: {app: api}}
    spec:
      containers:
      - name: main
        image: busybox:1.36
        env: [{name: A, value: '1'}, {name: B, value: '2'}]
        ports: [{containerPort: 80}, {containerPort: 443}]
---
apiVersion: v1
kind: ConfigMap
metadata: {name: api-conf}
data: {a: '1', b: '2'}
";
    let v2 = v1
        .replace(", tier: backend", "")
        .replace(", {name: B, value: '2'}", "")
        .replace(", {containerPort: 443}", "")
        .replace(", b: '2'", "");
    let dir = s.dir.path();
    std::fs::write(dir.join("v1.yaml"), v1).unwrap();
    std::fs::write(dir.join("v2.yaml"), &v2).unwrap();
    let f1 = dir.join("v1.yaml").to_str().unwrap().to_string();
    let f2 = dir.join("v2.yaml").to_str().unwrap().to_string();
    let show = || {
        s.ok(&[
            "get",
            "deploy",
            "api",
            "-o",
            "jsonpath={.metadata.labels} {.spec.template.spec.containers[0].env[*].name} {.spec.template.spec.containers[0].ports[*].containerPort}",
        ]) + " "
            + &s.ok(&["get", "cm", "api-conf", "-o", "jsonpath={.data}"])
    };

    assert_eq!(
        s.ok(&["apply", "-f", &f1]).lines().collect::<Vec<_>>(),
        ["deployment.apps/api created", "configmap/api-conf created"]
    );
    assert_eq!(
        show(),
        r#"{"app":"api","tier":"backend"} A B 80 443 {"a":"1","b":"2"}"#
    );
    assert_eq!(
        s.ok(&["apply", "-f", &f2]).lines().collect::<Vec<_>>(),
        [
            "deployment.apps/api configured",
            "configmap/api-conf configured"
        ]
    );
    assert_eq!(show(), r#"{"app":"api"} A 80 {"a":"1"}"#);

    // The same with server-side apply: fields the manager stops applying go.
    s.ok(&["apply", "--server-side", "--force-conflicts", "-f", &f1]);
    assert_eq!(
        show(),
        r#"{"app":"api","tier":"backend"} A B 80 443 {"a":"1","b":"2"}"#
    );
    assert_eq!(
        s.ok(&["apply", "--server-side", "-f", &f2])
            .lines()
            .collect::<Vec<_>>(),
        [
            "deployment.apps/api serverside-applied",
            "configmap/api-conf serverside-applied"
        ]
    );
    assert_eq!(show(), r#"{"app":"api"} A 80 {"a":"1"}"#);

    assert_eq!(
        s.ok(&["delete", "-f", &f2]).lines().collect::<Vec<_>>(),
        [
            "deployment.apps \"api\" deleted",
            "configmap \"api-conf\" deleted"
        ]
    );
    // What is left is the namespace's kube-root-ca.crt, as on Kubernetes.
    assert_eq!(
        s.ok(&["get", "deploy,cm", "-o", "name"])
            .lines()
            .filter(|l| *l != "configmap/kube-root-ca.crt")
            .collect::<Vec<_>>(),
        Vec::<&str>::new()
    );
}

/// Runs each `kubectl -n NS ARGS…` and collects every one whose output is
/// not exactly the expected line, so one run reports all of them.
fn expect_lines(s: &Server, ns: &str, cases: &[(&[&str], &str)]) {
    let mut failures = Vec::new();
    for (args, want) in cases {
        let mut v = vec!["-n", ns];
        v.extend_from_slice(args);
        let out = s.kubectl(&v);
        let got = format!("{}{}", text(&out.stdout), text(&out.stderr));
        if !out.status.success() || got.trim() != *want {
            failures.push(format!(
                "kubectl {}\n  expected: {want}\n  got: {}",
                args.join(" "),
                got.trim()
            ));
        }
    }
    assert!(failures.is_empty(), "\n{}", failures.join("\n"));
}

#[test]
fn typed_create_of_secrets_services_and_cronjobs() {
    let s = Server::start();
    s.ok(&["create", "namespace", "typed"]);
    expect_lines(
        &s,
        "typed",
        &[
            (
                &[
                    "create",
                    "secret",
                    "docker-registry",
                    "reg",
                    "--docker-server=registry.example",
                    "--docker-username=u",
                    "--docker-password=p",
                ],
                "secret/reg created",
            ),
            (
                &["create", "service", "nodeport", "np", "--tcp=80:8080"],
                "service/np created",
            ),
            (
                &[
                    "create",
                    "cronjob",
                    "tick",
                    "--image=busybox:1.36",
                    "--schedule=*/5 * * * *",
                    "--",
                    "true",
                ],
                "cronjob.batch/tick created",
            ),
        ],
    );
    assert_eq!(
        s.ok(&[
            "-n",
            "typed",
            "get",
            "secret",
            "reg",
            "-o",
            "jsonpath={.type}"
        ]),
        "kubernetes.io/dockerconfigjson"
    );
    let np = s.ok(&[
        "-n",
        "typed",
        "get",
        "svc",
        "np",
        "-o",
        "jsonpath={.spec.type} {.spec.ports[0].nodePort}",
    ]);
    let (kind, port) = np.split_once(' ').unwrap();
    assert_eq!(kind, "NodePort");
    let port: u16 = port.parse().unwrap();
    assert!((30000..=32767).contains(&port), "{np}");
}

#[test]
fn typed_create_of_rbac_hpa_pdb_quota_priorityclass_and_job_from_cronjob() {
    let s = Server::start();
    s.ok(&["create", "namespace", "typed"]);
    s.ok_stdin(
        &["-n", "typed", "create", "-f", "-"],
        &deployment(1, "busybox:1.36"),
    );
    s.ok(&[
        "-n",
        "typed",
        "create",
        "cronjob",
        "tick",
        "--image=busybox:1.36",
        "--schedule=*/5 * * * *",
        "--",
        "true",
    ]);
    // Each of these sends its object as protobuf, as kubectl does.
    expect_lines(
        &s,
        "typed",
        &[
            (
                &["autoscale", "deployment", "web", "--min=1", "--max=3"],
                "horizontalpodautoscaler.autoscaling/web autoscaled",
            ),
            (
                &[
                    "create",
                    "role",
                    "reader",
                    "--verb=get,list",
                    "--resource=pods",
                ],
                "role.rbac.authorization.k8s.io/reader created",
            ),
            (
                &[
                    "create",
                    "rolebinding",
                    "read",
                    "--role=reader",
                    "--user=bob",
                ],
                "rolebinding.rbac.authorization.k8s.io/read created",
            ),
            (
                &[
                    "create",
                    "clusterrole",
                    "viewer",
                    "--verb=get",
                    "--resource=nodes",
                ],
                "clusterrole.rbac.authorization.k8s.io/viewer created",
            ),
            (
                &[
                    "create",
                    "clusterrolebinding",
                    "view",
                    "--clusterrole=viewer",
                    "--group=ops",
                ],
                "clusterrolebinding.rbac.authorization.k8s.io/view created",
            ),
            (
                &[
                    "create",
                    "poddisruptionbudget",
                    "web",
                    "--selector=app=web",
                    "--min-available=1",
                ],
                "poddisruptionbudget.policy/web created",
            ),
            (
                &["create", "quota", "q", "--hard=pods=10"],
                "resourcequota/q created",
            ),
            (
                &["create", "priorityclass", "high", "--value=1000"],
                "priorityclass.scheduling.k8s.io/high created",
            ),
            (
                &["create", "job", "now", "--from=cronjob/tick"],
                "job.batch/now created",
            ),
        ],
    );
    assert_eq!(
        s.ok(&[
            "-n",
            "typed",
            "get",
            "hpa",
            "web",
            "-o",
            "jsonpath={.spec.minReplicas} {.spec.maxReplicas}"
        ]),
        "1 3"
    );
    assert_eq!(
        s.ok(&[
            "-n",
            "typed",
            "get",
            "job",
            "now",
            "-o",
            r"jsonpath={.metadata.annotations.cronjob\.kubernetes\.io/instantiate}"
        ]),
        "manual"
    );
}

#[test]
fn a_configmap_over_1_mib_is_invalid() {
    let s = Server::start();
    let big = format!(
        "{{\"apiVersion\":\"v1\",\"kind\":\"ConfigMap\",\"metadata\":{{\"name\":\"big\"}},\"data\":{{\"a\":\"{}\"}}}}",
        "x".repeat(1_100_000)
    );
    let out = s.kubectl_stdin(&["create", "-f", "-"], &big);
    let err = text(&out.stderr);
    assert!(!out.status.success(), "a 1.1 MB ConfigMap was accepted");
    assert!(
        err.contains("The ConfigMap \"big\" is invalid") && err.contains("Too long"),
        "{err}"
    );
}

#[test]
fn a_request_body_over_3_mib_is_refused() {
    let s = Server::start();
    let huge = format!(
        "{{\"apiVersion\":\"v1\",\"kind\":\"ConfigMap\",\"metadata\":{{\"name\":\"huge\"}},\"data\":{{\"a\":\"{}\"}}}}",
        "x".repeat(3_200_000)
    );
    let out = s.kubectl_stdin(&["create", "-f", "-"], &huge);
    assert!(!out.status.success());
    assert!(
        text(&out.stderr).contains(
            "Error from server (RequestEntityTooLarge): error when creating \"STDIN\": Request entity too large: limit is 3145728"
        ),
        "{}",
        text(&out.stderr)
    );
}

#[test]
fn every_namespace_carries_its_name_label() {
    // Kubernetes labels each namespace kubernetes.io/metadata.name=NAME, so
    // selectors (network policies, namespaceSelector) can pick namespaces.
    let s = Server::start();
    let out = s.ok(&["get", "ns", "default", "--show-labels", "--no-headers"]);
    assert!(out.contains("kubernetes.io/metadata.name=default"), "{out}");
    s.ok(&["create", "namespace", "team-x"]);
    assert_eq!(
        s.ok(&[
            "get",
            "ns",
            "-l",
            "kubernetes.io/metadata.name=team-x",
            "-o",
            "name"
        ])
        .trim(),
        "namespace/team-x"
    );
}

#[test]
fn scale_and_status_subresources_through_kubectl() {
    let s = Server::start();
    s.ok_stdin(&["create", "-f", "-"], &deployment(2, "busybox:1.36"));
    assert_eq!(
        s.ok(&[
            "patch",
            "deploy",
            "web",
            "--subresource=scale",
            "--type=merge",
            "-p",
            r#"{"spec":{"replicas":4}}"#
        ])
        .trim(),
        "scale.autoscaling/web patched"
    );
    assert_eq!(
        s.ok(&["get", "deploy", "web", "-o", "jsonpath={.spec.replicas}"]),
        "4"
    );
    s.ok_stdin(&["create", "-f", "-"], POD);
    assert_eq!(
        s.ok(&[
            "patch",
            "pod",
            "p1",
            "--subresource=status",
            "--type=merge",
            "-p",
            r#"{"status":{"phase":"Running"}}"#
        ])
        .trim(),
        "pod/p1 patched"
    );
    assert_eq!(
        s.ok(&["get", "pod", "p1", "-o", "jsonpath={.status.phase}"]),
        "Running"
    );
    // The main resource ignores status changes, as on Kubernetes.
    s.ok(&[
        "patch",
        "pod",
        "p1",
        "--type=merge",
        "-p",
        r#"{"status":{"phase":"Failed"}}"#,
    ]);
    assert_eq!(
        s.ok(&["get", "pod", "p1", "-o", "jsonpath={.status.phase}"]),
        "Running"
    );
}

#[test]
fn a_job_gets_a_selector_generated_from_its_uid() {
    // Kubernetes generates a Job's selector (unless manualSelector) from its
    // uid and labels the pod template to match, so `kubectl get pods -l
    // job-name=NAME` and `kubectl logs job/NAME` find its pods.
    let s = Server::start();
    assert_eq!(
        s.ok(&[
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
    let uid = s.ok(&["get", "job", "once", "-o", "jsonpath={.metadata.uid}"]);
    let out = s.ok(&[
        "get",
        "job",
        "once",
        "-o",
        r"jsonpath={.spec.selector.matchLabels.batch\.kubernetes\.io/controller-uid} {.spec.template.metadata.labels.batch\.kubernetes\.io/controller-uid} {.spec.template.metadata.labels.batch\.kubernetes\.io/job-name} {.spec.template.metadata.labels.job-name}",
    ]);
    assert_eq!(out, format!("{uid} {uid} once once"));
}

#[test]
fn get_subresource_scale_shows_desired_and_available() {
    let s = Server::start();
    s.ok_stdin(&["create", "-f", "-"], &deployment(4, "busybox:1.36"));
    let table = s.ok(&["get", "deploy", "web", "--subresource=scale"]);
    let rows: Vec<Vec<&str>> = table
        .lines()
        .map(|l| l.split_whitespace().collect())
        .collect();
    assert_eq!(rows[0], ["NAME", "DESIRED", "AVAILABLE", "AGE"], "{table}");
    assert_eq!(&rows[1][..2], ["web", "4"], "{table}");
    // AVAILABLE is the scale's status.replicas: the pods the ReplicaSet
    // controller has made (scheduled or not), so it climbs to 4.
    wait_until("the scale reports 4 replicas", 30, || {
        let table = s.ok(&["get", "deploy", "web", "--subresource=scale"]);
        let row: Vec<String> = table
            .lines()
            .nth(1)?
            .split_whitespace()
            .take(3)
            .map(str::to_owned)
            .collect();
        (row == ["web", "4", "4"]).then_some(())
    });
}

#[test]
fn the_controllers_metrics_are_served_at_slash_metrics() {
    let s = Server::start();
    s.ok_stdin(&["create", "-f", "-"], &deployment(2, "busybox:1.36"));
    // The ReplicaSet controller has reconciled the Deployment's set at least
    // once; Prometheus reads the counter per controller.
    wait_until("replicaset reconciles in /metrics", 30, || {
        let metrics = s.ok(&["get", "--raw", "/metrics"]);
        let count: f64 = metrics
            .lines()
            .find_map(|l| {
                l.strip_prefix("skiff_controller_reconciles_total{controller=\"replicaset\"} ")
            })?
            .trim()
            .parse()
            .ok()?;
        (count >= 1.0
            && metrics.contains("# TYPE skiff_controller_reconcile_duration_seconds histogram"))
        .then_some(())
    });
}

#[test]
fn admission_defaults_priorities_limit_ranges_and_quotas() {
    let s = Server::start();
    s.ok(&["create", "namespace", "adm"]);
    s.ok_stdin(&["-n", "adm", "create", "-f", "-"], POD);
    // ServiceAccount, DefaultTolerationSeconds and Priority admission.
    assert_eq!(
        s.ok(&[
            "-n",
            "adm",
            "get",
            "pod",
            "p1",
            "-o",
            "jsonpath={.spec.serviceAccountName} {.spec.priority} {.spec.tolerations[*].key} {.spec.tolerations[*].tolerationSeconds}"
        ]),
        "default 0 node.kubernetes.io/not-ready node.kubernetes.io/unreachable 300 300"
    );
    let out = s.ok(&["get", "priorityclasses", "--no-headers"]);
    assert!(
        out.contains("system-node-critical") && out.contains("2000001000"),
        "{out}"
    );
    let err = s.fails(&[
        "-n",
        "adm",
        "run",
        "vip",
        "--image=busybox:1.36",
        "--overrides={\"spec\":{\"priorityClassName\":\"gold\"}}",
    ]);
    assert!(
        err.contains("Error from server (Forbidden)")
            && err.contains("pods \"vip\" is forbidden: no PriorityClass with name gold was found"),
        "{err}"
    );
    // LimitRange: defaults, then bounds.
    s.ok_stdin(
        &["-n", "adm", "create", "-f", "-"],
        "apiVersion: v1
kind: LimitRange
metadata: {name: limits}
spec:
  limits:
  - type: Container
    default: {cpu: 200m, memory: 64Mi}
    defaultRequest: {cpu: 100m}
    max: {cpu: '1'}
",
    );
    s.ok(&["-n", "adm", "run", "sized", "--image=busybox:1.36"]);
    assert_eq!(
        s.ok(&[
            "-n",
            "adm",
            "get",
            "pod",
            "sized",
            "-o",
            "jsonpath={.spec.containers[0].resources.requests.cpu} {.spec.containers[0].resources.limits.cpu} {.spec.containers[0].resources.limits.memory}"
        ]),
        "100m 200m 64Mi"
    );
    let err = s.fails(&[
        "-n",
        "adm",
        "run",
        "huge",
        "--image=busybox:1.36",
        "--overrides={\"spec\":{\"containers\":[{\"name\":\"huge\",\"image\":\"busybox:1.36\",\"resources\":{\"limits\":{\"cpu\":\"2\"}}}]}}",
    ]);
    assert!(
        err.contains(
            "pods \"huge\" is forbidden: maximum cpu usage per Container is 1, but limit is 2"
        ),
        "{err}"
    );
    // ResourceQuota: counted (p1 and sized), then refused.
    s.ok(&[
        "-n",
        "adm",
        "create",
        "quota",
        "q",
        "--hard=pods=2,requests.cpu=1",
    ]);
    assert_eq!(
        s.ok(&[
            "-n",
            "adm",
            "get",
            "quota",
            "q",
            "-o",
            "jsonpath={.status.used.pods}"
        ]),
        "2"
    );
    let err = s.fails(&["-n", "adm", "run", "one-too-many", "--image=busybox:1.36"]);
    assert!(
        err.contains("pods \"one-too-many\" is forbidden: exceeded quota: q, requested: pods=1, used: pods=2, limited: pods=2"),
        "{err}"
    );
}

#[test]
fn drain_evicts_through_the_disruption_budget() {
    let s = Server::start();
    s.ok_stdin(
        &["create", "-f", "-"],
        "apiVersion: v1
kind: Node
metadata: {name: n1}
",
    );
    for name in ["a", "b"] {
        s.ok_stdin(
            &["create", "-f", "-"],
            &format!(
                "apiVersion: v1
kind: Pod
metadata: {{name: {name}, labels: {{app: web}}}}
spec:
  nodeName: n1
  containers: [{{name: c, image: busybox:1.36}}]
"
            ),
        );
    }
    // b runs, and a budget that allows no disruption covers it.
    s.ok(&[
        "patch",
        "pod",
        "b",
        "--subresource=status",
        "--type=merge",
        "-p",
        r#"{"status":{"phase":"Running","conditions":[{"type":"Ready","status":"True"}]}}"#,
    ]);
    s.ok(&[
        "create",
        "poddisruptionbudget",
        "web",
        "--selector=app=web",
        "--min-available=1",
    ]);
    let out = s.kubectl(&["drain", "n1", "--force", "--grace-period=0", "--timeout=6s"]);
    let all = format!("{}{}", text(&out.stdout), text(&out.stderr));
    assert!(!out.status.success(), "{all}");
    assert!(all.contains("node/n1 cordoned"), "{all}");
    assert!(all.contains("evicting pod default/a"), "{all}");
    assert!(
        all.contains("Cannot evict pod as it would violate the pod's disruption budget."),
        "{all}"
    );
    // a (pending) went; b stays.
    assert_eq!(s.ok(&["get", "pods", "-o", "name"]).trim(), "pod/b");
    // Without the budget, drain completes.
    s.ok(&["delete", "pdb", "web"]);
    let out = s.ok(&[
        "drain",
        "n1",
        "--force",
        "--grace-period=0",
        "--timeout=20s",
    ]);
    assert!(out.contains("node/n1 drained"), "{out}");
    assert_eq!(s.ok(&["get", "pods", "-o", "name"]).trim(), "");
}

/// curl (HTTP/2 over TLS, as the admin) against the server: the status code
/// and the body it printed.
fn curl(s: &Server, args: &[&str]) -> (String, String) {
    let pki = s.dir.path().join("data/pki");
    let out = std::process::Command::new("curl")
        .args(["-sk", "--http2", "-o", "-", "-w", "\n%{http_code}"])
        .arg("--cert")
        .arg(pki.join("admin.crt"))
        .arg("--key")
        .arg(pki.join("admin.key"))
        .args(args)
        .output()
        .expect("run curl");
    let all = text(&out.stdout);
    let (body, code) = all.rsplit_once('\n').unwrap_or(("", &all));
    (code.trim().to_string(), body.to_string())
}

#[test]
fn bodies_over_the_limit_get_a_413_status_over_http2_not_a_dropped_stream() {
    let s = Server::start();
    let dir = tempfile::tempdir().unwrap();
    let url = format!(
        "https://127.0.0.1:{}/api/v1/namespaces/default/configmaps",
        s.port
    );
    // A 4 MB body (declared up front) and a 3.5 MB ConfigMap.
    let raw = dir.path().join("raw");
    std::fs::write(&raw, vec![b'a'; 4_000_000]).unwrap();
    let cm = dir.path().join("cm.json");
    std::fs::write(
        &cm,
        format!(
            "{{\"apiVersion\":\"v1\",\"kind\":\"ConfigMap\",\"metadata\":{{\"name\":\"big\"}},\"data\":{{\"k\":\"{}\"}}}}",
            "x".repeat(3_500_000)
        ),
    )
    .unwrap();
    for file in [&raw, &cm] {
        let data = format!("@{}", file.display());
        let (code, body) = curl(
            &s,
            &[
                "-X",
                "POST",
                "-H",
                "Content-Type: application/json",
                "--data-binary",
                &data,
                &url,
            ],
        );
        assert_eq!(code, "413", "{body}");
        let status: serde_json::Value = serde_json::from_str(&body).unwrap();
        assert_eq!(status["kind"], "Status");
        assert_eq!(status["reason"], "RequestEntityTooLarge");
        assert_eq!(
            status["message"],
            "Request entity too large: limit is 3145728"
        );
    }
    // The connection and the server are fine afterwards.
    assert_eq!(s.ok(&["get", "cm", "big", "--ignore-not-found"]), "");
}

#[test]
fn an_object_over_the_store_limit_is_refused_with_a_status() {
    let s = Server::start();
    // Under the 3 MiB request limit and not a ConfigMap (whose data has its
    // own 1 MiB limit), but over the 1.5 MiB an object may take in the store.
    let pod = format!(
        "{{\"apiVersion\":\"v1\",\"kind\":\"Pod\",\"metadata\":{{\"name\":\"fat\"}},\"spec\":{{\"containers\":[{{\"name\":\"c\",\"image\":\"i\",\"args\":[\"{}\"]}}]}}}}",
        "y".repeat(1_700_000)
    );
    let out = s.kubectl_stdin(&["create", "-f", "-"], &pod);
    assert!(!out.status.success(), "a 1.7 MB pod was stored");
    let err = text(&out.stderr);
    assert!(
        err.contains("Request entity too large") && err.contains("1572864"),
        "{err}"
    );
    assert_eq!(s.ok(&["get", "pod", "fat", "--ignore-not-found"]), "");
}

#[test]
fn kubectl_reads_openapi_v2_as_protobuf() {
    let s = Server::start();
    // `plaintext-openapiv2` makes kubectl fetch /openapi/v2 as protobuf.
    let out = s.ok(&[
        "explain",
        "deployment.spec.replicas",
        "--output=plaintext-openapiv2",
    ]);
    assert!(
        out.contains("KIND:     Deployment") || out.contains("KIND:       Deployment"),
        "{out}"
    );
    assert!(out.contains("replicas") && out.contains("integer"), "{out}");
}

#[test]
fn secret_string_data_reads_back_as_data() {
    let s = Server::start();
    s.ok_stdin(&["apply", "-f", "-"], SECRET);
    assert_eq!(
        s.ok(&["get", "secret", "creds", "-o", "jsonpath={.data.password}"]),
        "aHVudGVyMg=="
    );
    assert_eq!(
        s.ok(&["get", "secret", "creds", "-o", "jsonpath={.stringData}"]),
        ""
    );
}

/// A PEM certificate request for `cn` in organization `org`.
fn certificate_request(cn: &str, org: &str) -> String {
    let key = rcgen::KeyPair::generate().unwrap();
    let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    let mut dn = rcgen::DistinguishedName::new();
    dn.push(rcgen::DnType::OrganizationName, org);
    dn.push(rcgen::DnType::CommonName, cn);
    params.distinguished_name = dn;
    params.serialize_request(&key).unwrap().pem().unwrap()
}

/// `kubectl certificate approve|deny` (which send the request back as
/// protobuf through the approval subresource): approved requests for the
/// API server's client signer are issued, denied ones are not.
#[test]
fn certificate_approve_and_deny() {
    use base64::Engine;
    let s = Server::start();
    for name in ["alice", "mallory"] {
        let pem = certificate_request(name, "devs");
        let csr = format!(
            r#"{{"apiVersion": "certificates.k8s.io/v1", "kind": "CertificateSigningRequest",
  "metadata": {{"name": "{name}"}},
  "spec": {{"request": "{}", "signerName": "kubernetes.io/kube-apiserver-client",
    "expirationSeconds": 86400, "usages": ["client auth"]}}}}"#,
            base64::engine::general_purpose::STANDARD.encode(pem)
        );
        s.ok_stdin(&["create", "-f", "-"], &csr);
    }
    assert_eq!(
        s.ok(&["certificate", "approve", "alice"]).trim_end(),
        "certificatesigningrequest.certificates.k8s.io/alice approved"
    );
    assert_eq!(
        s.ok(&["certificate", "deny", "mallory"]).trim_end(),
        "certificatesigningrequest.certificates.k8s.io/mallory denied"
    );
    wait_until("alice's certificate issued", 30, || {
        let c = s.ok(&[
            "get",
            "csr",
            "alice",
            "-o",
            "jsonpath={.status.certificate}",
        ]);
        (!c.is_empty()).then_some(())
    });
    let table = s.ok(&["get", "csr"]);
    let line = |n: &str| {
        table
            .lines()
            .find(|l| l.starts_with(n))
            .unwrap_or_else(|| panic!("{n} in {table}"))
            .to_string()
    };
    assert!(line("alice").ends_with("Approved,Issued"), "{table}");
    assert!(line("mallory").ends_with("Denied"), "{table}");
    assert_eq!(
        s.ok(&[
            "get",
            "csr",
            "alice",
            "-o",
            "jsonpath={.status.conditions[0].reason}"
        ]),
        "KubectlApprove"
    );
    assert_eq!(
        s.ok(&[
            "get",
            "csr",
            "mallory",
            "-o",
            "jsonpath={.status.certificate}"
        ]),
        ""
    );
    // The approval subresource reads as the request.
    let raw = s.ok(&[
        "get",
        "--raw",
        "/apis/certificates.k8s.io/v1/certificatesigningrequests/alice/approval",
    ]);
    let v: serde_json::Value = serde_json::from_str(&raw).unwrap();
    assert_eq!(v["metadata"]["name"], "alice");
    assert_eq!(v["status"]["conditions"][0]["type"], "Approved");
}

/// `kubectl get cs`: the scheduler, the controller manager and the store
/// checked now, with Kubernetes' deprecation warning.
#[test]
fn get_componentstatuses_shows_each_component_healthy() {
    let s = Server::start();
    let rows = wait_until("every component Healthy", 60, || {
        let out = s.kubectl(&["get", "cs"]);
        let table = text(&out.stdout);
        let healthy = |n: &str| {
            table.lines().any(|l| {
                let cells: Vec<&str> = l.split_whitespace().collect();
                cells.first() == Some(&n)
                    && cells.get(1) == Some(&"Healthy")
                    && cells.get(2) == Some(&"ok")
            })
        };
        (out.status.success()
            && ["scheduler", "controller-manager", "etcd-0"]
                .iter()
                .all(|n| healthy(n)))
        .then(|| (table, text(&out.stderr)))
    });
    let (table, warnings) = rows;
    assert!(table.starts_with("NAME"), "{table}");
    for col in ["STATUS", "MESSAGE", "ERROR"] {
        assert!(table.lines().next().unwrap().contains(col), "{table}");
    }
    assert!(
        warnings.contains("v1 ComponentStatus is deprecated in v1.19+"),
        "{warnings}"
    );
    assert_eq!(
        s.ok(&[
            "get",
            "componentstatus",
            "etcd-0",
            "-o",
            "jsonpath={.conditions[0].type}={.conditions[0].status}"
        ]),
        "Healthy=True"
    );
    let e = s.fails(&["get", "cs", "nothing"]);
    assert!(
        e.contains(r#"componentstatuses "nothing" not found"#),
        "{e}"
    );
}

/// `kubectl get apiservices` lists the core group's local APIService
/// `v1.` first, as Kubernetes does.
#[test]
fn get_apiservices_lists_the_core_group() {
    let s = Server::start();
    let line = wait_until("v1. Available", 30, || {
        let table = s.ok(&["get", "apiservices"]);
        table
            .lines()
            .nth(1)
            .filter(|l| l.starts_with("v1. "))
            .filter(|l| l.split_whitespace().take(3).eq(["v1.", "Local", "True"]))
            .map(str::to_string)
    });
    assert!(line.starts_with("v1."), "{line}");
    assert!(
        !s.log().contains("creating a local APIService"),
        "{}",
        s.log()
    );
}
