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

#[test]
fn upgrade_install_into_a_new_namespace_status_values_and_dry_run() {
    let s = Server::start();
    let chart = s.dir.path().join("app");
    ok(s.helm(&["create", chart.to_str().unwrap()]));
    let chart = chart.to_str().unwrap();
    let out = ok(s.helm(&[
        "upgrade",
        "--install",
        "rel",
        chart,
        "-n",
        "apps",
        "--create-namespace",
        "--set",
        "replicaCount=2",
    ]));
    assert!(
        out.contains("Release \"rel\" does not exist. Installing it now.")
            && out.contains("NAMESPACE: apps")
            && out.contains("STATUS: deployed")
            && out.contains("REVISION: 1"),
        "{out}"
    );
    assert_eq!(
        s.ok(&["get", "ns", "apps", "-o", "jsonpath={.status.phase}"]),
        "Active"
    );
    assert_eq!(
        s.ok(&[
            "-n",
            "apps",
            "get",
            "deploy",
            "rel-app",
            "-o",
            "jsonpath={.spec.replicas}"
        ]),
        "2"
    );
    let status = ok(s.helm(&["status", "rel", "-n", "apps"]));
    assert!(status.contains("STATUS: deployed"), "{status}");
    let values = ok(s.helm(&["get", "values", "rel", "-n", "apps"]));
    assert!(values.contains("replicaCount: 2"), "{values}");
    let list = ok(s.helm(&["list", "-A"]));
    let row: Vec<&str> = list
        .lines()
        .find(|l| l.starts_with("rel"))
        .unwrap_or_else(|| panic!("{list}"))
        .split_whitespace()
        .collect();
    assert_eq!(&row[..3], ["rel", "apps", "1"], "{list}");
    assert!(row.contains(&"deployed"), "{list}");

    // A second upgrade --install upgrades.
    let out = ok(s.helm(&["upgrade", "--install", "rel", chart, "-n", "apps"]));
    assert!(out.contains("REVISION: 2"), "{out}");

    // A server-side dry run renders and checks, and creates nothing.
    let out = ok(s.helm(&["install", "dry", chart, "-n", "apps", "--dry-run=server"]));
    assert!(out.contains("NAME: dry"), "{out}");
    assert_eq!(
        s.ok(&[
            "-n",
            "apps",
            "get",
            "deploy,svc,secrets",
            "-l",
            "app.kubernetes.io/instance=dry",
            "-o",
            "name"
        ])
        .trim(),
        ""
    );
    assert!(!ok(s.helm(&["list", "-A"])).contains("dry"));
}
