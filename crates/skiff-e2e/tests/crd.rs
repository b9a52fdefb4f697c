//! CustomResourceDefinitions with the real kubectl and helm: a definition
//! applied server-side is served at once (get, explain, scale, patch,
//! apply, columns, short names, categories, deprecated versions); small
//! copies of real operators' definitions (written for these tests, in
//! `tests/data/crd/`: cert-manager's Certificate, prometheus-operator's
//! ServiceMonitor, Argo CD's Application) accept their documented examples;
//! a chart's `crds/` directory installs and upgrades; deleting a definition
//! deletes its objects.

use skiff_e2e::{repo_root, text, wait_until, Server};

fn data(name: &str) -> String {
    repo_root()
        .join("crates/skiff-e2e/tests/data/crd")
        .join(name)
        .to_string_lossy()
        .into_owned()
}

fn established(s: &Server, crd: &str) {
    s.ok(&[
        "wait",
        "--for",
        "condition=established",
        "--timeout=30s",
        &format!("crd/{crd}"),
    ]);
}

#[test]
fn a_multi_version_definition_is_served_to_kubectl() {
    let s = Server::start();
    let out = s.ok(&["apply", "--server-side", "-f", &data("widgets.yaml")]);
    assert!(out.contains("serverside-applied"), "{out}");
    established(&s, "widgets.example.com");
    let crds = s.ok(&["get", "crds"]);
    assert!(crds.contains("widgets.example.com"), "{crds}");

    s.ok_stdin(
        &["apply", "-f", "-"],
        r#"
apiVersion: example.com/v1
kind: Widget
metadata:
  name: w1
  labels: {tier: front}
spec:
  color: red
  size: 2
---
apiVersion: example.com/v1
kind: Widget
metadata:
  name: w2
spec:
  color: blue
  size: 1
"#,
    );
    // Printer columns, short name, priority columns in -o wide.
    let table = s.ok(&["get", "wd"]);
    let header = table.lines().next().unwrap();
    assert!(
        header.contains("NAME") && header.contains("COLOR") && header.contains("AGE"),
        "{table}"
    );
    assert!(!header.contains("SIZE"), "{table}");
    assert!(table.contains("w1") && table.contains("red"), "{table}");
    let wide = s.ok(&["get", "widgets", "-o", "wide"]);
    assert!(wide.lines().next().unwrap().contains("SIZE"), "{wide}");
    // The `all` category.
    let all = s.ok(&["get", "all", "-o", "name"]);
    assert!(all.contains("widget.example.com/w1"), "{all}");
    // Field and label selectors.
    assert_eq!(
        s.ok(&[
            "get",
            "widgets",
            "--field-selector",
            "spec.color=blue",
            "-o",
            "name"
        ])
        .trim(),
        "widget.example.com/w2"
    );
    assert_eq!(
        s.ok(&["get", "widgets", "-l", "tier=front", "-o", "name"])
            .trim(),
        "widget.example.com/w1"
    );

    // explain reads the published schema.
    let explain = s.ok(&["explain", "widget.spec"]);
    assert!(
        explain.contains("color") && explain.contains("The colour of the widget"),
        "{explain}"
    );

    // scale through the scale subresource.
    s.ok(&["scale", "widget/w1", "--replicas=5"]);
    assert_eq!(
        s.ok(&["get", "widget", "w1", "-o", "jsonpath={.spec.size}"]),
        "5"
    );
    // The status subresource.
    s.ok(&[
        "patch",
        "widget",
        "w1",
        "--subresource=status",
        "--type=merge",
        "-p",
        r#"{"status":{"size":5,"selector":"tier=front"}}"#,
    ]);
    assert_eq!(
        s.ok(&["get", "widget", "w1", "-o", "jsonpath={.status.size}"]),
        "5"
    );

    // Merge patches work; strategic merge (kubectl's default) is refused.
    s.ok(&[
        "patch",
        "widget",
        "w1",
        "--type=merge",
        "-p",
        r#"{"spec":{"color":"green"}}"#,
    ]);
    let err = s.fails(&["patch", "widget", "w1", "-p", r#"{"spec":{"color":"x"}}"#]);
    assert!(
        err.contains("strategic merge patch format is not supported")
            || err.contains("UnsupportedMediaType")
            || err.contains("unknown format"),
        "{err}"
    );

    // kubectl's strict field validation: a field the schema does not have.
    let out = s.kubectl_stdin(
        &["apply", "-f", "-"],
        "apiVersion: example.com/v1\nkind: Widget\nmetadata: {name: typo}\nspec: {colour: red}\n",
    );
    assert!(!out.status.success());
    assert!(
        text(&out.stderr).contains(r#"unknown field "spec.colour""#),
        "{}",
        text(&out.stderr)
    );

    // edit (kubectl sends a merge patch for custom resources) and describe.
    let out = s
        .kubectl_cmd(&["edit", "widget", "w1"])
        .env("KUBE_EDITOR", "sed -i s/green/purple/")
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(
        s.ok(&["get", "widget", "w1", "-o", "jsonpath={.spec.color}"]),
        "purple"
    );
    let described = s.ok(&["describe", "widget", "w1"]);
    assert!(
        described.contains("Kind:         Widget") && described.contains("purple"),
        "{described}"
    );

    // Server-side apply merges a list-map by its key across managers.
    s.ok_stdin(
        &["apply", "--server-side", "--field-manager=one", "-f", "-"],
        "apiVersion: example.com/v1\nkind: Widget\nmetadata: {name: w3}\nspec:\n  ports: [{name: http, port: 80}]\n",
    );
    s.ok_stdin(
        &["apply", "--server-side", "--field-manager=two", "-f", "-"],
        "apiVersion: example.com/v1\nkind: Widget\nmetadata: {name: w3}\nspec:\n  ports: [{name: https, port: 443}]\n",
    );
    assert_eq!(
        s.ok(&[
            "get",
            "widget",
            "w3",
            "-o",
            "jsonpath={.spec.ports[*].name}"
        ]),
        "http https"
    );

    // A deprecated version answers, converted, with its warning.
    let out = s.kubectl(&[
        "get",
        "widgets.v1beta1.example.com",
        "w1",
        "-o",
        "jsonpath={.apiVersion}",
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout), "example.com/v1beta1");
    assert!(
        text(&out.stderr).contains("example.com/v1beta1 Widget is deprecated"),
        "{}",
        text(&out.stderr)
    );

    // Deleting the definition deletes its objects and the API.
    s.ok(&["delete", "crd", "widgets.example.com", "--timeout=60s"]);
    // (kubectl may still map `widgets` from its discovery cache; the
    // server answers 404 either way, as kube-apiserver does.)
    let err = s.fails(&["get", "widgets"]);
    assert!(
        err.contains("the server doesn't have a resource type")
            || err.contains("the server could not find the requested resource"),
        "{err}"
    );
    let resources = s.ok(&["api-resources", "--api-group=example.com"]);
    assert!(!resources.contains("widgets"), "{resources}");
    let raw = s.kubectl(&[
        "get",
        "--raw",
        "/apis/example.com/v1/namespaces/default/widgets",
    ]);
    assert!(!raw.status.success());
}

#[test]
fn real_operators_definitions_accept_their_documented_examples() {
    let s = Server::start();
    for (file, name) in [
        (
            "certificates.cert-manager.io.yaml",
            "certificates.cert-manager.io",
        ),
        (
            "servicemonitors.monitoring.coreos.com.yaml",
            "servicemonitors.monitoring.coreos.com",
        ),
        ("applications.argoproj.io.yaml", "applications.argoproj.io"),
    ] {
        s.ok(&["apply", "--server-side", "-f", &data(file)]);
        established(&s, name);
    }
    // cert-manager's documented Certificate example.
    s.ok_stdin(
        &["apply", "--server-side", "-f", "-"],
        r#"
apiVersion: cert-manager.io/v1
kind: Certificate
metadata:
  name: example-com
  namespace: default
spec:
  secretName: example-com-tls
  duration: 2160h
  renewBefore: 360h
  isCA: false
  privateKey:
    algorithm: RSA
    size: 2048
    rotationPolicy: Always
  usages:
    - server auth
    - client auth
  dnsNames:
    - example.com
    - www.example.com
  issuerRef:
    name: ca-issuer
    kind: Issuer
    group: cert-manager.io
"#,
    );
    // A Certificate the schema refuses: every failing field in the answer.
    let out = s.kubectl_stdin(
        &["apply", "--server-side", "-f", "-"],
        "apiVersion: cert-manager.io/v1\nkind: Certificate\nmetadata:\n  name: broken\nspec:\n  issuerRef: {name: ca-issuer}\n  privateKey: {algorithm: DSA}\n",
    );
    assert!(!out.status.success());
    let err = text(&out.stderr);
    assert!(
        err.contains("spec.secretName: Required value")
            && err.contains("spec.privateKey.algorithm: Unsupported value: \"DSA\""),
        "{err}"
    );
    let certs = s.ok(&["get", "certs"]);
    assert!(
        certs.lines().next().unwrap().contains("SECRET") && certs.contains("example-com-tls"),
        "{certs}"
    );
    s.ok(&[
        "patch",
        "certificate",
        "example-com",
        "--subresource=status",
        "--type=merge",
        "-p",
        r#"{"status":{"conditions":[{"type":"Ready","status":"True","reason":"Ready","message":"ok"}]}}"#,
    ]);
    let certs = s.ok(&["get", "certificate", "example-com"]);
    assert!(
        certs.contains("True"),
        "Ready column from a filter path: {certs}"
    );

    // prometheus-operator's documented ServiceMonitor example.
    s.ok_stdin(
        &["apply", "--server-side", "-f", "-"],
        r#"
apiVersion: monitoring.coreos.com/v1
kind: ServiceMonitor
metadata:
  name: example-app
  labels:
    team: frontend
spec:
  selector:
    matchLabels:
      app: example-app
  endpoints:
  - port: web
"#,
    );
    assert_eq!(
        s.ok(&[
            "get",
            "smon",
            "example-app",
            "-o",
            "jsonpath={.spec.endpoints[0].port}"
        ]),
        "web"
    );

    // Argo CD's documented Application example.
    s.ok_stdin(
        &["apply", "--server-side", "-f", "-"],
        r#"
apiVersion: argoproj.io/v1alpha1
kind: Application
metadata:
  name: guestbook
spec:
  project: default
  source:
    repoURL: https://github.com/argoproj/argocd-example-apps.git
    targetRevision: HEAD
    path: guestbook
  destination:
    server: https://kubernetes.default.svc
    namespace: guestbook
"#,
    );
    let apps = s.ok(&["get", "applications.argoproj.io"]);
    let header = apps.lines().next().unwrap();
    assert!(
        header.contains("SYNC STATUS") && header.contains("HEALTH STATUS"),
        "{apps}"
    );
    assert!(apps.contains("guestbook"), "{apps}");
}

#[test]
fn a_charts_crds_directory_installs_and_upgrades() {
    let s = Server::start();
    let chart = s.dir.path().join("gizmos");
    std::fs::create_dir_all(chart.join("crds")).unwrap();
    std::fs::create_dir_all(chart.join("templates")).unwrap();
    std::fs::write(
        chart.join("Chart.yaml"),
        "apiVersion: v2\nname: gizmos\nversion: 0.1.0\n",
    )
    .unwrap();
    std::fs::write(
        chart.join("crds/gizmo.yaml"),
        r#"apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: gizmos.example.org
spec:
  group: example.org
  scope: Namespaced
  names: {plural: gizmos, singular: gizmo, kind: Gizmo}
  versions:
  - name: v1
    served: true
    storage: true
    schema:
      openAPIV3Schema:
        type: object
        properties:
          spec:
            type: object
            properties:
              level: {type: integer}
"#,
    )
    .unwrap();
    std::fs::write(
        chart.join("templates/gizmo.yaml"),
        "apiVersion: example.org/v1\nkind: Gizmo\nmetadata:\n  name: {{ .Release.Name }}-gizmo\nspec:\n  level: {{ .Values.level }}\n",
    )
    .unwrap();
    std::fs::write(chart.join("values.yaml"), "level: 1\n").unwrap();
    let chart = chart.to_str().unwrap();
    let out = s.helm(&["install", "demo", chart]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(
        s.ok(&["get", "gizmo", "demo-gizmo", "-o", "jsonpath={.spec.level}"]),
        "1"
    );
    let out = s.helm(&["upgrade", "demo", chart, "--set", "level=3"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(
        s.ok(&["get", "gizmo", "demo-gizmo", "-o", "jsonpath={.spec.level}"]),
        "3"
    );
    let out = s.helm(&["uninstall", "demo"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    wait_until("the gizmo is gone", 30, || {
        s.ok(&["get", "gizmos", "-o", "name"])
            .trim()
            .is_empty()
            .then_some(())
    });
    // helm keeps the definitions of crds/ on uninstall.
    assert!(s
        .ok(&["get", "crd", "-o", "name"])
        .contains("gizmos.example.org"));
}

#[test]
fn the_garbage_collector_collects_owned_custom_resources_and_their_dependents() {
    let s = Server::start();
    s.ok(&["apply", "--server-side", "-f", &data("widgets.yaml")]);
    established(&s, "widgets.example.com");
    s.ok(&["create", "configmap", "owner"]);
    let cm_uid = s.ok(&["get", "cm", "owner", "-o", "jsonpath={.metadata.uid}"]);
    // A custom resource owned by a ConfigMap.
    s.ok_stdin(
        &["apply", "-f", "-"],
        &format!(
            "apiVersion: example.com/v1\nkind: Widget\nmetadata:\n  name: owned\n  ownerReferences:\n  - apiVersion: v1\n    kind: ConfigMap\n    name: owner\n    uid: {cm_uid}\nspec: {{color: red}}\n"
        ),
    );
    // A Service owned by a custom resource (the collector's dependents are
    // the kinds the controller manager caches, and custom resources).
    s.ok_stdin(
        &["apply", "-f", "-"],
        "apiVersion: example.com/v1\nkind: Widget\nmetadata:\n  name: parent\nspec: {color: blue}\n",
    );
    let w_uid = s.ok(&["get", "widget", "parent", "-o", "jsonpath={.metadata.uid}"]);
    s.ok_stdin(
        &["apply", "-f", "-"],
        &format!(
            "apiVersion: v1\nkind: Service\nmetadata:\n  name: child\n  ownerReferences:\n  - apiVersion: example.com/v1\n    kind: Widget\n    name: parent\n    uid: {w_uid}\nspec:\n  ports: [{{port: 80}}]\n"
        ),
    );
    // Nothing is collected while the owners live. A Widget created last,
    // owned by a uid that never existed, is what the collector does
    // collect: once it is gone, the collector has seen the objects before
    // it and decided to keep them.
    s.ok_stdin(
        &["apply", "-f", "-"],
        "apiVersion: example.com/v1\nkind: Widget\nmetadata:\n  name: sentinel\n  ownerReferences:\n  - apiVersion: v1\n    kind: ConfigMap\n    name: gone\n    uid: 00000000-0000-0000-0000-000000000000\nspec: {color: grey}\n",
    );
    wait_until("the widget with a missing owner is collected", 60, || {
        s.ok(&["get", "widgets", "-o", "name"])
            .lines()
            .all(|l| l != "widget.example.com/sentinel")
            .then_some(())
    });
    s.ok(&["get", "widget", "owned"]);
    s.ok(&["get", "svc", "child"]);

    s.ok(&["delete", "cm", "owner"]);
    wait_until("the owned widget is collected", 60, || {
        s.ok(&["get", "widgets", "-o", "name"])
            .lines()
            .all(|l| l != "widget.example.com/owned")
            .then_some(())
    });
    s.ok(&["delete", "widget", "parent"]);
    wait_until("the widget's service is collected", 60, || {
        (!s.kubectl(&["get", "svc", "child"]).status.success()).then_some(())
    });
}

#[test]
fn a_definition_is_in_openapi_v2_for_kubectl_explain_and_leaves_with_it() {
    let s = Server::start();
    s.ok(&["apply", "--server-side", "-f", &data("widgets.yaml")]);
    established(&s, "widgets.example.com");
    // kubectl's OpenAPI v2 path (protobuf) describes the kind's fields.
    let out = wait_until("explain from OpenAPI v2", 10, || {
        let out = s.kubectl(&["explain", "widgets.spec", "--output=plaintext-openapiv2"]);
        out.status.success().then(|| text(&out.stdout))
    });
    assert!(
        out.contains("The colour of the widget.") && out.contains("ports"),
        "{out}"
    );
    let doc: serde_json::Value =
        serde_json::from_str(&s.ok(&["get", "--raw", "/openapi/v2"])).unwrap();
    let w = &doc["definitions"]["com.example.v1.Widget"];
    assert_eq!(
        w["x-kubernetes-group-version-kind"],
        serde_json::json!([{"group": "example.com", "version": "v1", "kind": "Widget"}])
    );
    // v1beta1 keeps unknown fields: published without a type, as in Kubernetes.
    let old = &doc["definitions"]["com.example.v1beta1.Widget"];
    assert_eq!(old["x-kubernetes-preserve-unknown-fields"], true);
    assert!(old.get("type").is_none(), "{old}");
    assert!(doc["definitions"]["com.example.v1.WidgetList"].is_object());
    assert!(doc["definitions"]["io.k8s.api.core.v1.Pod"].is_object());

    s.ok(&["delete", "crd", "widgets.example.com"]);
    wait_until("the definition to leave OpenAPI v2", 10, || {
        let doc: serde_json::Value =
            serde_json::from_str(&s.ok(&["get", "--raw", "/openapi/v2"])).unwrap();
        doc["definitions"]
            .get("com.example.v1.Widget")
            .is_none()
            .then_some(())
    });
}
