//! Declared dependencies on a real node (`skiff up` over its own
//! containerd), driven with the real kubectl and `skiff deps`: a
//! three-tier app whose tiers wait for each other and get their wiring
//! (variables, tokens a TokenReview accepts), an enforcing namespace where
//! only declared connections pass (and a removed declaration closes its
//! path), a cycle that neither deadlocks nor goes unreported, and
//! declarations that do not parse refused with a 422 naming the entry.

use std::process::Command;
use std::time::{Duration, Instant};

use skiff_e2e::{skiff_binary, text, wait_until, Server, BUSYBOX};

/// A Deployment of one busybox httpd answering its name on port 8080,
/// declaring `deps` (if any), and its Service (port `http` 80 → 8080).
fn tier(ns: &str, name: &str, deps: Option<&str>) -> String {
    let annotations = deps
        .map(|d| format!(r#""annotations": {{"skiff.io/depends-on": "{d}"}},"#))
        .unwrap_or_default();
    format!(
        r#"{{"apiVersion": "v1", "kind": "List", "items": [
{{"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {{"name": "{name}", "namespace": "{ns}"}},
  "spec": {{"replicas": 1, "selector": {{"matchLabels": {{"app": "{name}"}}}},
    "template": {{"metadata": {{{annotations} "labels": {{"app": "{name}"}}}},
      "spec": {{"terminationGracePeriodSeconds": 1, "containers": [{{"name": "{name}", "image": "{BUSYBOX}",
        "imagePullPolicy": "IfNotPresent",
        "command": ["sh", "-c", "mkdir -p /www && echo {name} > /www/index.html && exec httpd -f -p 8080 -h /www"],
        "ports": [{{"name": "http", "containerPort": 8080}}]}}]}}}}}}}},
{{"apiVersion": "v1", "kind": "Service", "metadata": {{"name": "{name}", "namespace": "{ns}"}},
  "spec": {{"selector": {{"app": "{name}"}}, "ports": [{{"name": "http", "port": 80, "targetPort": "http"}}]}}}}
]}}"#
    )
}

/// A bare pod that sleeps, declaring `deps` (if any).
fn client(ns: &str, name: &str, deps: Option<&str>) -> String {
    let annotations = deps
        .map(|d| format!(r#""annotations": {{"skiff.io/depends-on": "{d}"}},"#))
        .unwrap_or_default();
    format!(
        r#"{{"apiVersion": "v1", "kind": "Pod", "metadata": {{{annotations} "name": "{name}", "namespace": "{ns}", "labels": {{"role": "client"}}}},
  "spec": {{"terminationGracePeriodSeconds": 1, "containers": [{{"name": "c", "image": "{BUSYBOX}",
    "imagePullPolicy": "IfNotPresent", "command": ["sleep", "3600"]}}]}}}}"#
    )
}

fn pod_of(s: &Server, ns: &str, app: &str) -> String {
    wait_until(&format!("a pod of {ns}/{app}"), 60, || {
        let out = s.kubectl(&[
            "get",
            "pods",
            "-n",
            ns,
            "-l",
            &format!("app={app}"),
            "-o",
            "jsonpath={.items[0].metadata.name}",
        ]);
        let n = text(&out.stdout);
        (!n.is_empty()).then_some(n)
    })
}

fn field(s: &Server, ns: &str, what: &str, path: &str) -> String {
    text(
        &s.kubectl(&["get", "-n", ns, what, "-o", &format!("jsonpath={path}")])
            .stdout,
    )
}

fn dep_condition(s: &Server, ns: &str, pod: &str) -> String {
    field(
        s,
        ns,
        &format!("pod/{pod}"),
        "{.status.conditions[?(@.type==\"skiff.io/DependenciesReady\")].status}",
    )
}

fn wait_running(s: &Server, ns: &str, pod: &str) {
    wait_until(&format!("{ns}/{pod} Running and Ready"), 120, || {
        let ready = field(
            s,
            ns,
            &format!("pod/{pod}"),
            "{.status.conditions[?(@.type==\"Ready\")].status}",
        );
        (ready == "True").then_some(())
    });
}

fn deps(s: &Server, args: &[&str]) -> String {
    let out = Command::new(skiff_binary())
        .arg("deps")
        .args(args)
        .arg("--kubeconfig")
        .arg(&s.kubeconfig)
        .output()
        .expect("run skiff deps");
    assert!(
        out.status.success(),
        "skiff deps {args:?}: {}",
        text(&out.stderr)
    );
    text(&out.stdout)
}

/// `wget` of `url` in `pod`'s shell (so `$VAR`s expand), given up after
/// `secs` seconds.
fn wget(s: &Server, ns: &str, pod: &str, url: &str, secs: u32) -> std::process::Output {
    let cmd = format!("timeout {secs} wget -q -O- {url}");
    s.kubectl(&["exec", "-n", ns, pod, "--", "sh", "-c", &cmd])
}

/// What `pod` gets from `url`, retried for a while: a loaded machine's
/// first lookups and connections may time out.
fn fetch(s: &Server, ns: &str, pod: &str, url: &str) -> String {
    let start = Instant::now();
    loop {
        let out = wget(s, ns, pod, url, 10);
        if out.status.success() {
            return text(&out.stdout);
        }
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "{ns}/{pod} could not fetch {url} within 60 s: {}",
            text(&out.stderr)
        );
        std::thread::sleep(Duration::from_millis(500));
    }
}

/// Whether `pod` gets an answer from `url` within a few seconds.
fn reaches(s: &Server, ns: &str, pod: &str, url: &str) -> bool {
    wget(s, ns, pod, url, 2).status.success()
}

/// Probes until `pod` reaching `url` is `want`; returns when the probe
/// that first saw it started (a refused connection hangs until the
/// probe's timeout, which is not the path's doing).
fn until_reaches(s: &Server, ns: &str, pod: &str, url: &str, want: bool) -> Duration {
    let start = Instant::now();
    loop {
        let probe_started = start.elapsed();
        if reaches(s, ns, pod, url) == want {
            return probe_started;
        }
        let what = if want { "reach" } else { "be refused" };
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "{ns}/{pod} did not {what} {url} within 60 s\npolicies: {}",
            text(
                &s.kubectl(&["get", "networkpolicy", "-A", "-o", "yaml"])
                    .stdout
            )
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn a_three_tier_app_starts_tier_by_tier_with_its_wiring() {
    let s = Server::up();
    s.ok(&["create", "namespace", "shop"]);
    // web → api → db, with db's workload not there yet: only its Service.
    s.ok_stdin(
        &["apply", "-f", "-"],
        &tier("shop", "web", Some("api:http")),
    );
    s.ok_stdin(&["apply", "-f", "-"], &tier("shop", "api", Some("db")));
    s.ok_stdin(
        &["apply", "-f", "-"],
        r#"{"apiVersion": "v1", "kind": "Service", "metadata": {"name": "db", "namespace": "shop"},
            "spec": {"selector": {"app": "db"}, "ports": [{"name": "http", "port": 80, "targetPort": "http"}]}}"#,
    );
    let api = pod_of(&s, "shop", "api");
    let web = pod_of(&s, "shop", "web");
    for (pod, missing) in [(&api, "shop/db"), (&web, "shop/api:http")] {
        wait_until(&format!("{pod} waiting for {missing}"), 60, || {
            (dep_condition(&s, "shop", pod) == "False").then_some(())
        });
        let msg = field(
            &s,
            "shop",
            &format!("pod/{pod}"),
            "{.status.conditions[?(@.type==\"skiff.io/DependenciesReady\")].message}",
        );
        assert!(
            msg.contains(missing) && msg.contains("no ready endpoint"),
            "{msg}"
        );
        let reason = wait_until("the container's waiting reason", 30, || {
            let r = field(
                &s,
                "shop",
                &format!("pod/{pod}"),
                "{.status.containerStatuses[0].state.waiting.reason}",
            );
            (r == "WaitingForDependency").then_some(r)
        });
        assert_eq!(reason, "WaitingForDependency");
    }
    // Held: a few seconds on, neither has started a container.
    std::thread::sleep(Duration::from_secs(3));
    for pod in [&api, &web] {
        assert_eq!(
            field(&s, "shop", &format!("pod/{pod}"), "{.status.phase}"),
            "Pending",
            "{pod}"
        );
    }
    let events = s.ok(&[
        "get",
        "events",
        "-n",
        "shop",
        "--field-selector",
        "reason=WaitingForDependency",
    ]);
    assert!(events.contains(&api) && events.contains(&web), "{events}");
    let graph = deps(&s, &["-n", "shop"]);
    assert!(
        graph.contains("shop/deployment/api") && graph.contains("shop/db"),
        "{graph}"
    );
    assert!(
        graph
            .lines()
            .any(|l| l.contains("shop/deployment/web") && l.contains("waiting")),
        "{graph}"
    );
    let rollout = s.kubectl(&[
        "rollout",
        "status",
        "deployment/web",
        "-n",
        "shop",
        "--timeout=2s",
    ]);
    assert!(!rollout.status.success(), "the rollout shows the wait");
    let waiting = field(
        &s,
        "shop",
        "deployment/web",
        "{.status.conditions[?(@.type==\"skiff.io/DependenciesReady\")].status}",
    );
    assert_eq!(waiting, "False");

    // The database arrives: api starts, then web.
    s.ok_stdin(&["apply", "-f", "-"], &tier("shop", "db", None));
    let db = pod_of(&s, "shop", "db");
    wait_running(&s, "shop", &db);
    wait_running(&s, "shop", &api);
    wait_running(&s, "shop", &web);
    // Compared to the second (RFC 3339 text, fractions cut off, so that
    // the two writers' formats compare alike).
    let second = |t: String| t.chars().take(19).collect::<String>();
    let started = |pod: &str| {
        second(field(
            &s,
            "shop",
            &format!("pod/{pod}"),
            "{.status.containerStatuses[0].state.running.startedAt}",
        ))
    };
    let ready_at = |pod: &str| {
        second(field(
            &s,
            "shop",
            &format!("pod/{pod}"),
            "{.status.conditions[?(@.type==\"Ready\")].lastTransitionTime}",
        ))
    };
    assert!(
        started(&api) >= ready_at(&db),
        "api started {} before db was ready {}",
        started(&api),
        ready_at(&db)
    );
    assert!(
        started(&web) >= ready_at(&api),
        "web started {} before api was ready {}",
        started(&web),
        ready_at(&api)
    );
    assert_eq!(dep_condition(&s, "shop", &web), "True");
    s.ok(&[
        "rollout",
        "status",
        "deployment/web",
        "-n",
        "shop",
        "--timeout=60s",
    ]);
    wait_until("web's Deployment condition True", 30, || {
        let st = field(
            &s,
            "shop",
            "deployment/web",
            "{.status.conditions[?(@.type==\"skiff.io/DependenciesReady\")].status}",
        );
        (st == "True").then_some(())
    });

    // Wiring: the variables and a token for the api's audience.
    let env = s.ok(&["exec", "-n", "shop", &web, "--", "env"]);
    for want in [
        "SKIFF_DEP_API_HOST=api.shop.svc.cluster.local",
        "SKIFF_DEP_API_PORT=80",
        "SKIFF_DEP_API_ADDR=api.shop.svc.cluster.local:80",
    ] {
        assert!(env.lines().any(|l| l == want), "{want} not in\n{env}");
    }
    let body = fetch(&s, "shop", &web, "http://$SKIFF_DEP_API_ADDR/");
    assert_eq!(body.trim(), "api");
    let token = s.ok(&[
        "exec",
        "-n",
        "shop",
        &web,
        "--",
        "cat",
        "/var/run/secrets/skiff.io/deps/api/token",
    ]);
    let review = s.ok_stdin(
        &["create", "-o", "json", "-f", "-"],
        &format!(
            r#"{{"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview",
                "spec": {{"token": "{}", "audiences": ["api.shop.svc"]}}}}"#,
            token.trim()
        ),
    );
    let review: serde_json::Value = serde_json::from_str(&review).expect("a TokenReview");
    assert_eq!(review["status"]["authenticated"], true, "{review}");
    assert_eq!(
        review["status"]["user"]["username"],
        "system:serviceaccount:shop:default"
    );
    assert_eq!(review["status"]["audiences"][0], "api.shop.svc");
    assert_eq!(
        review["status"]["user"]["extra"]["authentication.kubernetes.io/pod-name"][0],
        web.as_str()
    );

    // The other direction, and the graph once everything is up.
    wait_until("api's dependents annotation", 30, || {
        let d = field(
            &s,
            "shop",
            "service/api",
            "{.metadata.annotations.skiff\\.io/dependents}",
        );
        (d == "shop/deployment/web").then_some(())
    });
    let graph = deps(&s, &["-n", "shop"]);
    assert!(
        graph.lines().any(|l| l.contains("shop/deployment/web")
            && l.contains("shop/api:http")
            && l.ends_with("ready")),
        "{graph}"
    );
    let json: serde_json::Value = serde_json::from_str(&deps(&s, &["-o", "json"])).expect("json");
    assert_eq!(json["edges"].as_array().map(Vec::len), Some(2), "{json}");
    let dot = deps(&s, &["-o", "dot", "-n", "shop"]);
    assert!(
        dot.starts_with("digraph") && dot.contains("\"shop/deployment/api\" -> \"svc/shop/db\""),
        "{dot}"
    );

    // shop does not enforce: web reaching db, which it never declared,
    // works, and is counted (the pod's condition, the node's metrics,
    // `skiff deps`).
    let body = fetch(&s, "shop", &web, "http://db/");
    assert_eq!(body.trim(), "db");
    let undeclared = |pod: &str| {
        field(
            &s,
            "shop",
            &format!("pod/{pod}"),
            "{.status.conditions[?(@.type==\"skiff.io/UndeclaredConnections\")].message}",
        )
    };
    let msg = wait_until("web's undeclared connection counted", 30, || {
        let m = undeclared(&web);
        (!m.is_empty()).then_some(m)
    });
    assert!(msg.contains("undeclared destinations: shop/db:80"), "{msg}");
    let metrics = s.ok(&["get", "--raw", "/api/v1/nodes/e2e-node/proxy/metrics"]);
    assert!(
        metrics.contains(&format!(
            "skiff_undeclared_connections_total{{namespace=\"shop\",pod=\"{web}\"}}"
        )),
        "{metrics}"
    );
    // Its declared dependency is not counted; the api pod, which only
    // used what it declared, has nothing.
    assert!(!msg.contains("shop/api"), "{msg}");
    assert_eq!(undeclared(&api), "");
    let graph = deps(&s, &["-n", "shop"]);
    assert!(
        graph.lines().any(|l| l.starts_with("shop/deployment/web")
            && l.contains("shop/db:80")
            && l.ends_with("violated")),
        "{graph}"
    );
}

#[test]
fn an_enforcing_namespace_lets_only_declared_connections_through() {
    let s = Server::up();
    s.ok(&["create", "namespace", "locked"]);
    s.ok(&[
        "label",
        "namespace",
        "locked",
        "skiff.io/dependencies=enforce",
    ]);
    s.ok_stdin(&["apply", "-f", "-"], &tier("locked", "db", None));
    s.ok_stdin(&["apply", "-f", "-"], &tier("locked", "other", None));
    s.ok_stdin(&["apply", "-f", "-"], &client("locked", "app", Some("db")));
    s.ok_stdin(&["apply", "-f", "-"], &client("locked", "stranger", None));
    for p in ["app", "stranger"] {
        wait_running(&s, "locked", p);
    }
    // Both servers up before anything is judged refused.
    for app in ["db", "other"] {
        let p = pod_of(&s, "locked", app);
        wait_running(&s, "locked", &p);
    }
    let policies = s.ok(&["get", "networkpolicy", "-n", "locked", "-o", "name"]);
    assert!(
        policies.contains("skiff-dependencies-baseline") && policies.contains("skiff-deps-to-db"),
        "{policies}"
    );
    // Generated policies go with what they are for.
    let owner = field(
        &s,
        "locked",
        "networkpolicy/skiff-deps-to-db",
        "{.metadata.ownerReferences[0].kind}",
    );
    assert_eq!(owner, "Service");
    // Declared: allowed, by name through cluster DNS.
    until_reaches(&s, "locked", "app", "http://db/", true);
    // Undeclared: refused, from the declaring pod and from a pod that
    // declared nothing.
    until_reaches(&s, "locked", "app", "http://other/", false);
    until_reaches(&s, "locked", "stranger", "http://db/", false);
    assert!(!reaches(&s, "locked", "stranger", "http://other/"));
    let graph = deps(&s, &["-n", "locked"]);
    assert!(
        graph
            .lines()
            .any(|l| l.contains("locked/pod/app") && l.ends_with("enforced")),
        "{graph}"
    );

    // Removing the declaration closes the path.
    s.ok(&[
        "annotate",
        "pod",
        "-n",
        "locked",
        "app",
        "skiff.io/depends-on-",
    ]);
    let took = until_reaches(&s, "locked", "app", "http://db/", false);
    eprintln!("the path closed {took:?} after the declaration was removed");
    let label = field(
        &s,
        "locked",
        "pod/app",
        "{.metadata.labels.skiff\\.io/deps}",
    );
    assert_eq!(label, "", "the declaration's label went with it");

    // Outside an enforcing namespace nothing is closed.
    s.ok(&["label", "namespace", "locked", "skiff.io/dependencies-"]);
    until_reaches(&s, "locked", "stranger", "http://other/", true);
    wait_until("the generated policies gone", 30, || {
        let p = s.ok(&["get", "networkpolicy", "-n", "locked", "-o", "name"]);
        p.trim().is_empty().then_some(())
    });
}

#[test]
fn a_dependency_cycle_neither_deadlocks_nor_goes_unreported() {
    let s = Server::up();
    s.ok(&["create", "namespace", "loop"]);
    s.ok_stdin(&["apply", "-f", "-"], &tier("loop", "ping", Some("pong")));
    s.ok_stdin(&["apply", "-f", "-"], &tier("loop", "pong", Some("ping")));
    let ping = pod_of(&s, "loop", "ping");
    let pong = pod_of(&s, "loop", "pong");
    wait_running(&s, "loop", &ping);
    wait_running(&s, "loop", &pong);
    let msg = field(
        &s,
        "loop",
        &format!("pod/{ping}"),
        "{.status.conditions[?(@.type==\"skiff.io/DependenciesReady\")].message}",
    );
    assert!(msg.contains("cycle"), "{msg}");
    let events = wait_until("the cycle's Warning Event", 30, || {
        let e = s.ok(&[
            "get",
            "events",
            "-n",
            "loop",
            "--field-selector",
            "reason=DependencyCycle",
            "-o",
            "json",
        ]);
        let v: serde_json::Value = serde_json::from_str(&e).ok()?;
        let items = v["items"].as_array()?.clone();
        (!items.is_empty()).then_some(items)
    });
    assert_eq!(events.len(), 1, "reported once: {events:?}");
    assert_eq!(events[0]["type"], "Warning");
    let m = events[0]["message"].as_str().unwrap_or("");
    assert!(
        m.contains("loop/deployment/ping") && m.contains("loop/deployment/pong"),
        "{m}"
    );
    let graph = deps(&s, &["-n", "loop"]);
    assert!(
        graph.contains("cycle: loop/deployment/ping → loop/deployment/pong → loop/deployment/ping"),
        "{graph}"
    );
}

#[test]
fn a_malformed_declaration_is_refused_naming_the_entry() {
    let s = Server::start_with(&[]);
    let err = s.fails(&[
        "run",
        "bad",
        "--image",
        BUSYBOX,
        "--annotations",
        "skiff.io/depends-on=db, Bad_Svc",
    ]);
    assert!(
        err.contains("metadata.annotations[skiff.io/depends-on]")
            && err.contains(r#"entry "Bad_Svc""#),
        "{err}"
    );
    assert!(err.contains("is invalid"), "a 422: {err}");
    let err = s
        .kubectl_stdin(
            &["create", "-f", "-"],
            &format!(
                r#"{{"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {{"name": "bad"}},
  "spec": {{"selector": {{"matchLabels": {{"app": "bad"}}}},
    "template": {{"metadata": {{"labels": {{"app": "bad"}}, "annotations": {{"skiff.io/depends-on": "db:99999"}}}},
      "spec": {{"containers": [{{"name": "c", "image": "{BUSYBOX}"}}]}}}}}}}}"#
            ),
        );
    let e = text(&err.stderr);
    assert!(!err.status.success());
    assert!(
        e.contains("spec.template.metadata.annotations[skiff.io/depends-on]")
            && e.contains("between 1 and 65535"),
        "{e}"
    );
    // A well-formed one is accepted as is, and labelled.
    s.ok(&[
        "run",
        "good",
        "--image",
        BUSYBOX,
        "--annotations",
        "skiff.io/depends-on=db:5432, other/cache",
    ]);
    let label = field(
        &s,
        "default",
        "pod/good",
        "{.metadata.labels.skiff\\.io/deps}",
    );
    assert_eq!(label.len(), 16, "{label}");
}
