//! The agent's HTTPS API (kubelet's port) on a real `skiff up` node: a
//! client certificate of the cluster CA other than the API server's may
//! read `/stats` and `/metrics` only when a SubjectAccessReview allows it
//! `get` on `nodes/stats` or `nodes/metrics`, and nothing else (403 with
//! kubelet's message); the API server's own calls (`kubectl top`, logs)
//! keep working. A ServiceAccount's bearer token is accepted as kubelet
//! accepts it (TokenReview), as Prometheus scrapes nodes; no credentials or
//! a token the API server refuses is 401.

use std::path::Path;
use std::process::Command;

use skiff_e2e::{skiff_binary, text, wait_until, Server};

/// Writes `user`'s certificate and key (from `skiff kubeconfig`) as PEM
/// files in `dir`.
fn user_cert(s: &Server, user: &str, dir: &Path) -> (String, String) {
    let out = Command::new(skiff_binary())
        .args(["kubeconfig", "--user", user, "--data-dir"])
        .arg(s.dir.path().join("data"))
        .args(["--server", &format!("https://127.0.0.1:{}", s.port)])
        .output()
        .expect("skiff kubeconfig");
    assert!(out.status.success(), "{}", text(&out.stderr));
    let kc = text(&out.stdout);
    let field = |name: &str| {
        let line = kc
            .lines()
            .find(|l| l.trim_start().starts_with(name))
            .unwrap_or_else(|| panic!("{name} in {kc}"));
        let b64 = line.split_once(':').unwrap().1.trim();
        let mut child = Command::new("base64")
            .arg("-d")
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .expect("base64");
        std::io::Write::write_all(child.stdin.as_mut().unwrap(), b64.as_bytes()).unwrap();
        let out = child.wait_with_output().unwrap();
        assert!(out.status.success());
        out.stdout
    };
    let crt = dir.join(format!("{user}.crt"));
    let key = dir.join(format!("{user}.key"));
    std::fs::write(&crt, field("client-certificate-data")).unwrap();
    std::fs::write(&key, field("client-key-data")).unwrap();
    (
        crt.to_string_lossy().into_owned(),
        key.to_string_lossy().into_owned(),
    )
}

/// curl's GET of `path` on the agent with `args` (credentials): (status,
/// body).
fn curl_agent(port: &str, args: &[&str], path: &str) -> (String, String) {
    let out = Command::new("curl")
        .args(["-sk", "--max-time", "10", "-w", "\n%{http_code}"])
        .args(args)
        .arg(format!("https://127.0.0.1:{port}{path}"))
        .output()
        .expect("curl");
    let all = text(&out.stdout);
    let (body, code) = all.rsplit_once('\n').unwrap_or((&all, ""));
    (code.to_string(), body.to_string())
}

/// GET `path` on the agent with a client certificate: (status, body).
fn agent_get(port: &str, cert: &(String, String), path: &str) -> (String, String) {
    curl_agent(port, &["--cert", &cert.0, "--key", &cert.1], path)
}

/// GET `path` on the agent with a bearer token, or without credentials:
/// (status, body).
fn agent_get_bearer(port: &str, token: Option<&str>, path: &str) -> (String, String) {
    match token {
        Some(t) => curl_agent(port, &["-H", &format!("Authorization: Bearer {t}")], path),
        None => curl_agent(port, &[], path),
    }
}

/// The port of the node's agent endpoint, as its Node reports it.
fn agent_port(s: &Server) -> String {
    let port = s.ok(&[
        "get",
        "node",
        "e2e-node",
        "-o",
        "jsonpath={.status.daemonEndpoints.kubeletEndpoint.Port}",
    ]);
    assert!(port.parse::<u16>().is_ok(), "{port:?}");
    port
}

#[test]
fn a_service_account_token_reads_metrics_as_prometheus_does() {
    let s = Server::up();
    let port = agent_port(&s);
    s.ok(&["create", "serviceaccount", "prometheus"]);
    let token = s.ok(&["create", "token", "prometheus"]);
    let token = token.trim();

    let (code, body) = agent_get_bearer(&port, None, "/metrics/resource");
    assert_eq!((code.as_str(), body.trim()), ("401", "Unauthorized"));
    let (code, _) = agent_get_bearer(&port, Some("not-a-token"), "/metrics/resource");
    assert_eq!(code, "401");

    // Known, but not allowed yet.
    let (code, body) = agent_get_bearer(&port, Some(token), "/stats/summary");
    assert_eq!(code, "403", "{body}");
    assert_eq!(
        body.trim(),
        "Forbidden (user=system:serviceaccount:default:prometheus, verb=get, resource=nodes, subresource=stats)"
    );

    s.ok(&[
        "create",
        "clusterrole",
        "scrape-nodes",
        "--verb=get",
        "--resource=nodes/metrics",
    ]);
    s.ok(&[
        "create",
        "clusterrolebinding",
        "prometheus-scrapes",
        "--clusterrole=scrape-nodes",
        "--serviceaccount=default:prometheus",
    ]);
    let body = wait_until("the account may read the node's metrics", 30, || {
        let (code, body) = agent_get_bearer(&port, Some(token), "/metrics/resource");
        (code == "200").then_some(body)
    });
    assert!(body.contains("node_cpu_usage_seconds_total"), "{body}");
    // Metrics only: the node's stats and its pods' logs stay closed.
    let (code, _) = agent_get_bearer(&port, Some(token), "/stats/summary");
    assert_eq!(code, "403");
    let (code, body) = agent_get_bearer(&port, Some(token), "/containerLogs/default/x/c");
    assert_eq!(code, "403", "{body}");
    assert!(body.contains("subresource=proxy"), "{body}");
}

#[test]
fn other_clients_read_stats_and_metrics_only_as_rbac_allows() {
    let s = Server::up();
    let port = agent_port(&s);
    let jane = user_cert(&s, "jane", s.dir.path());

    let (code, body) = agent_get(&port, &jane, "/stats/summary");
    assert_eq!(code, "403", "{body}");
    assert_eq!(
        body.trim(),
        "Forbidden (user=jane, verb=get, resource=nodes, subresource=stats)"
    );
    let (code, _) = agent_get(&port, &jane, "/metrics/resource");
    assert_eq!(code, "403");

    s.ok(&[
        "create",
        "clusterrole",
        "node-stats",
        "--verb=get",
        "--resource=nodes/stats,nodes/metrics",
    ]);
    s.ok(&[
        "create",
        "clusterrolebinding",
        "jane-node-stats",
        "--clusterrole=node-stats",
        "--user=jane",
    ]);
    // The agent keeps a denial for 30 s, as kubelet does.
    let body = wait_until("jane may read the node's stats", 60, || {
        let (code, body) = agent_get(&port, &jane, "/stats/summary");
        (code == "200").then_some(body)
    });
    let v: serde_json::Value = serde_json::from_str(&body).expect("JSON summary");
    assert_eq!(v["node"]["nodeName"], "e2e-node");
    // The metrics denial was cached a moment after the stats one: it
    // lapses on its own clock.
    let body = wait_until("jane may read the node's metrics", 60, || {
        let (code, body) = agent_get(&port, &jane, "/metrics/resource");
        (code == "200").then_some(body)
    });
    assert!(body.contains("node_cpu_usage_seconds_total"), "{body}");
    // Still nothing else: logs are the API server's to fetch.
    let (code, body) = agent_get(&port, &jane, "/containerLogs/default/x/c");
    assert_eq!(code, "403", "{body}");
    assert!(body.contains("subresource=proxy"), "{body}");

    // The API server's own calls still work.
    let out = s.ok(&["get", "--raw", "/api/v1/nodes/e2e-node/proxy/stats/summary"]);
    assert!(out.contains("\"nodeName\""), "{out}");
}
