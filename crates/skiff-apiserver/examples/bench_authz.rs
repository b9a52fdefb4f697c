//! Benchmark B10 part 1: the cost of authorization on the write path.
//!
//! `cargo run --release -p skiff-apiserver --example bench_authz -- [--seconds S] [--clients C] [--rounds R]`
//!
//! B3's ConfigMap create and get workload over HTTPS/2, driven once with
//! the admin client certificate (`system:masters`, allowed before RBAC is
//! asked) and once with a ServiceAccount bearer token whose rights come
//! from a RoleBinding (token verified and RBAC evaluated on every request).
//! The two alternate for R rounds so drift hits both; reports the median
//! round of each and the token/admin ratios (targets: throughput ≥ 90%,
//! p99 ≤ 1.2×).

/// The allocator the `skiff` binary uses, so the benchmark measures it.
#[global_allocator]
static ALLOC: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::Body;
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::Request;
use skiff_apiserver::tls::Pki;
use skiff_store::{RedbStore, Store};
use tower::ServiceExt;

mod common;
use common::{connect, pct, Sender};

async fn call(
    s: &mut Sender,
    token: Option<&str>,
    method: &str,
    path: &str,
    body: Option<String>,
) -> u16 {
    let mut b = Request::builder()
        .method(method)
        .uri(format!("https://localhost{path}"))
        .header("content-type", "application/json")
        .header("accept", "application/json");
    if let Some(t) = token {
        b = b.header("authorization", format!("Bearer {t}"));
    }
    let req = b
        .body(Full::new(Bytes::from(body.unwrap_or_default())))
        .unwrap();
    s.ready().await.unwrap();
    let resp = s.send_request(req).await.unwrap();
    let status = resp.status().as_u16();
    let _ = resp.into_body().collect().await.unwrap();
    status
}

fn cm(name: &str) -> String {
    format!(
        r#"{{"apiVersion":"v1","kind":"ConfigMap","metadata":{{"name":"{name}","labels":{{"bench":"b10"}}}},"data":{{"k":"{}"}}}}"#,
        "v".repeat(200)
    )
}

/// CPU time (user + system) this process has used, from /proc.
fn cpu_time() -> Duration {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    // Fields after the command's closing parenthesis; utime and stime are
    // the 12th and 13th of them, in clock ticks (100 per second).
    let rest = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or("");
    let f: Vec<u64> = rest
        .split_whitespace()
        .map(|x| x.parse().unwrap_or(0))
        .collect();
    let ticks = f.get(11).copied().unwrap_or(0) + f.get(12).copied().unwrap_or(0);
    Duration::from_millis(ticks * 10)
}

/// One phase's figures.
struct Phase {
    rate: f64,
    p50: f64,
    p99: f64,
    /// Process CPU (server and clients together) per request, µs.
    cpu_us: f64,
    counts: Vec<usize>,
}

async fn phase(
    conns: &[Sender],
    token: Option<Arc<String>>,
    secs: f64,
    prefix: &str,
    get_of: Option<&[usize]>,
) -> Phase {
    let cpu0 = cpu_time();
    let deadline = Instant::now() + Duration::from_secs_f64(secs);
    let start = Instant::now();
    let mut tasks = Vec::new();
    for (c, mut s) in conns.iter().cloned().enumerate() {
        let token = token.clone();
        let prefix = prefix.to_string();
        let n = get_of.map(|g| g[c].max(1));
        tasks.push(tokio::spawn(async move {
            let mut lat = Vec::new();
            let mut i = 0;
            while Instant::now() < deadline {
                let t = Instant::now();
                let code = match n {
                    None => {
                        call(
                            &mut s,
                            token.as_deref().map(String::as_str),
                            "POST",
                            "/api/v1/namespaces/default/configmaps",
                            Some(cm(&format!("{prefix}-{c}-{i}"))),
                        )
                        .await
                    }
                    Some(n) => {
                        call(
                            &mut s,
                            token.as_deref().map(String::as_str),
                            "GET",
                            &format!(
                                "/api/v1/namespaces/default/configmaps/{prefix}-{c}-{}",
                                i % n
                            ),
                            None,
                        )
                        .await
                    }
                };
                assert!(code == 201 || code == 200, "status {code}");
                lat.push(t.elapsed());
                i += 1;
            }
            (lat, i)
        }));
    }
    let mut lat = Vec::new();
    let mut counts = Vec::new();
    for t in tasks {
        let (l, n) = t.await.unwrap();
        lat.extend(l);
        counts.push(n);
    }
    lat.sort();
    Phase {
        rate: lat.len() as f64 / start.elapsed().as_secs_f64(),
        p50: pct(&lat, 0.5),
        p99: pct(&lat, 0.99),
        cpu_us: (cpu_time() - cpu0).as_secs_f64() * 1e6 / lat.len().max(1) as f64,
        counts,
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[v.len() / 2]
}

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    let arg = |n: &str| {
        args.iter()
            .position(|a| a == n)
            .and_then(|i| args.get(i + 1))
            .cloned()
    };
    let secs: f64 = arg("--seconds").and_then(|s| s.parse().ok()).unwrap_or(3.0);
    let clients: usize = arg("--clients").and_then(|s| s.parse().ok()).unwrap_or(32);
    let rounds: usize = arg("--rounds").and_then(|s| s.parse().ok()).unwrap_or(5);
    let verbose = args.iter().any(|a| a == "--verbose");

    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::load_or_create(&dir.path().join("pki"), &[]).unwrap();
    let store: Arc<dyn Store> =
        RedbStore::open(&dir.path().join("store.redb"), Default::default()).unwrap();
    let config = skiff_apiserver::Config {
        service_account_key_dir: Some(dir.path().join("sa")),
        ..Default::default()
    };
    let api = skiff_apiserver::ApiServer::start(store, config)
        .await
        .unwrap();

    // A ServiceAccount whose rights come from a RoleBinding, and its token.
    let admin = api.in_process_router("bench");
    let post = |path: &str, body: serde_json::Value| {
        let admin = admin.clone();
        let req = axum::http::Request::builder()
            .method("POST")
            .uri(path)
            .header("content-type", "application/json")
            .body(Body::from(body.to_string()))
            .unwrap();
        async move {
            let resp = admin.oneshot(req).await.unwrap();
            let status = resp.status();
            let bytes = resp.into_body().collect().await.unwrap().to_bytes();
            assert!(
                status.is_success(),
                "{status}: {}",
                String::from_utf8_lossy(&bytes)
            );
            serde_json::from_slice::<serde_json::Value>(&bytes).unwrap()
        }
    };
    post("/api/v1/namespaces/default/serviceaccounts", serde_json::json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "bench"}})).await;
    post("/apis/rbac.authorization.k8s.io/v1/namespaces/default/roles", serde_json::json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": {"name": "cm-writer"},
        "rules": [{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["create", "get"]}]})).await;
    post("/apis/rbac.authorization.k8s.io/v1/namespaces/default/rolebindings", serde_json::json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding", "metadata": {"name": "bench"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "cm-writer"},
        "subjects": [{"kind": "ServiceAccount", "name": "bench", "namespace": "default"}]})).await;
    let tr = post(
        "/api/v1/namespaces/default/serviceaccounts/bench/token",
        serde_json::json!({"spec": {"expirationSeconds": 7200}}),
    )
    .await;
    let token = Arc::new(tr["status"]["token"].as_str().unwrap().to_string());

    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(skiff_apiserver::serve::serve_tls(
        listener,
        pki.server_config().unwrap(),
        api.router(),
        std::future::pending(),
    ));
    let (with_cert, no_cert) = (
        common::client_tls(&pki, true),
        common::client_tls(&pki, false),
    );
    let mut admin_conns = Vec::new();
    let mut token_conns = Vec::new();
    for _ in 0..clients {
        admin_conns.push(connect(port, with_cert.clone()).await);
        token_conns.push(connect(port, no_cert.clone()).await);
    }

    let mut results: [[Vec<f64>; 8]; 2] = Default::default();
    for round in 0..rounds {
        // Alternate which goes first.
        let order = if round % 2 == 0 { [0, 1] } else { [1, 0] };
        for who in order {
            let (conns, tok) = if who == 0 {
                (&admin_conns, None)
            } else {
                (&token_conns, Some(token.clone()))
            };
            let prefix = format!("r{round}w{who}");
            let c = phase(conns, tok.clone(), secs, &prefix, None).await;
            let g = phase(conns, tok, secs, &prefix, Some(&c.counts)).await;
            let row = [
                c.rate, c.p99, g.rate, g.p99, c.p50, g.p50, c.cpu_us, g.cpu_us,
            ];
            for (i, v) in row.into_iter().enumerate() {
                results[who][i].push(v);
            }
            if verbose {
                eprintln!(
                    "round {round} {}: create {:.0}/s p50 {:.2} p99 {:.2} cpu {:.0}µs; get {:.0}/s p50 {:.2} p99 {:.2} cpu {:.0}µs",
                    if who == 0 { "admin" } else { "token" },
                    c.rate, c.p50, c.p99, c.cpu_us, g.rate, g.p50, g.p99, g.cpu_us
                );
            }
        }
    }
    let m = |who: usize, i: usize| median(results[who][i].clone());
    println!("B10 part 1 — {clients} HTTPS/2 clients, {secs} s per phase, median of {rounds} alternating rounds\n");
    println!("| workload | admin cert req/s | admin p50 / p99 ms | admin CPU µs/req | SA token + RBAC req/s | token p50 / p99 ms | token CPU µs/req | throughput ratio | p99 ratio |");
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|");
    for (name, r, p, p50, cpu) in [
        ("create (ConfigMap)", 0, 1, 4, 6),
        ("get (ConfigMap)", 2, 3, 5, 7),
    ] {
        println!(
            "| {name} | {:.0} | {:.2} / {:.2} | {:.0} | {:.0} | {:.2} / {:.2} | {:.0} | {:.0}% | {:.2}× |",
            m(0, r),
            m(0, p50),
            m(0, p),
            m(0, cpu),
            m(1, r),
            m(1, p50),
            m(1, p),
            m(1, cpu),
            100.0 * m(1, r) / m(0, r),
            m(1, p) / m(0, p)
        );
    }
}
