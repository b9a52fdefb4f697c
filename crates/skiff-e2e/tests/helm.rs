//! The real helm v4 against skiff: a chart's whole release lifecycle.

use skiff_e2e::{text, Server};

fn ok(out: std::process::Output) -> String {
    assert!(
        out.status.success(),
        "helm failed:\nstdout: {}\nstderr: {}",
        text(&out.stdout),
        text(&out.stderr)
    );
    text(&out.stdout)
}

#[test]
fn install_upgrade_rollback_and_uninstall_a_chart() {
    let s = Server::start();
    let chart = s.dir.path().join("web");
    ok(s.helm(&["create", chart.to_str().unwrap()]));
    let chart = chart.to_str().unwrap();
    let out = ok(s.helm(&["install", "demo", chart]));
    assert!(out.contains("STATUS: deployed"), "{out}");
    assert_eq!(
        s.ok(&[
            "get",
            "deploy",
            "demo-web",
            "-o",
            "jsonpath={.spec.replicas}"
        ]),
        "1"
    );
    assert!(s.ok(&["get", "svc", "demo-web"]).contains("80/TCP"));
    ok(s.helm(&["upgrade", "demo", chart, "--set", "replicaCount=3"]));
    assert_eq!(
        s.ok(&[
            "get",
            "deploy",
            "demo-web",
            "-o",
            "jsonpath={.spec.replicas}"
        ]),
        "3"
    );
    let history = ok(s.helm(&["history", "demo"]));
    assert!(
        history.contains("superseded") && history.contains("Upgrade complete"),
        "{history}"
    );
    ok(s.helm(&["rollback", "demo", "1"]));
    assert_eq!(
        s.ok(&[
            "get",
            "deploy",
            "demo-web",
            "-o",
            "jsonpath={.spec.replicas}"
        ]),
        "1"
    );
    let list = ok(s.helm(&["list"]));
    assert!(list.contains("demo") && list.contains("deployed"), "{list}");
    ok(s.helm(&["uninstall", "demo"]));
    assert!(!ok(s.helm(&["list"])).contains("demo"));
    assert_eq!(
        s.ok(&[
            "get",
            "deploy,svc,secrets",
            "-l",
            "app.kubernetes.io/instance=demo",
            "-o",
            "name"
        ])
        .trim(),
        ""
    );
    assert_eq!(
        s.ok(&["get", "secrets", "-l", "owner=helm", "-o", "name"])
            .trim(),
        ""
    );
}
