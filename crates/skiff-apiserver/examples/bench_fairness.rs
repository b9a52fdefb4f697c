//! Issue 16 §4: one client flooding the server with unpaged lists of
//! everything, beside a polite client reading one object at a time.
//!
//! `cargo run --release -p skiff-apiserver --example bench_fairness -- [--flow on|off] [--seconds S] [--greedy G] [--objects N] [--read-after-ms MS]`
//!
//! An API server on a durable temporary store in this process, N
//! ConfigMaps of ~1 KiB; the greedy user (`greedy`, cluster-admin through
//! RBAC, so not exempt) keeps G unpaged lists of all of them in flight,
//! starting to read each answer MS after it arrives (a slow reader);
//! the polite user (`polite`, same priority level) GETs one ConfigMap after
//! another. Reports the polite GET's p50/p99, the greedy lists completed
//! and refused (429), and the process's peak RSS. `--flow off` gives the
//! server seats enough for everything (no flow control) for comparison;
//! run each mode as its own process so the peak RSS is its own.

/// The allocator the `skiff` binary uses, so the benchmark measures it.
#[global_allocator]
static ALLOC: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::http::Request;
use axum::Router;
use http_body_util::BodyExt;
use skiff_apiserver::auth::Identity;
use skiff_apiserver::flowcontrol::Limits;
use skiff_apiserver::{ApiServer, Config};
use skiff_store::{RedbStore, Store};
use tower::ServiceExt;

mod common;
use common::pct;

async fn call(r: &Router, method: &str, path: &str, body: Option<String>) -> u16 {
    call_slow(r, method, path, body, Duration::ZERO).await
}

/// A call whose client takes `read_after` to start reading the answer.
async fn call_slow(
    r: &Router,
    method: &str,
    path: &str,
    body: Option<String>,
    read_after: Duration,
) -> u16 {
    let req = Request::builder()
        .method(method)
        .uri(path)
        .header("content-type", "application/json")
        .body(body.map(Body::from).unwrap_or_default())
        .unwrap();
    let resp = r.clone().oneshot(req).await.unwrap();
    let status = resp.status().as_u16();
    if !read_after.is_zero() {
        tokio::time::sleep(read_after).await;
    }
    let _ = resp.into_body().collect().await.unwrap();
    status
}

fn arg<T: std::str::FromStr>(name: &str, default: T) -> T {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn peak_rss_mib() -> f64 {
    std::fs::read_to_string("/proc/self/status")
        .unwrap_or_default()
        .lines()
        .find(|l| l.starts_with("VmHWM:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|k| k.parse::<f64>().ok())
        .unwrap_or(0.0)
        / 1024.0
}

#[tokio::main]
async fn main() {
    let flow_on = arg("--flow", "on".to_string()) == "on";
    let seconds: u64 = arg("--seconds", 10);
    let greedy_n: usize = arg("--greedy", 64);
    let objects: usize = arg("--objects", 10_000);
    let read_after = Duration::from_millis(arg("--read-after-ms", 300));

    let dir = tempfile::tempdir().unwrap();
    let store: Arc<dyn Store> =
        RedbStore::open(&dir.path().join("s.redb"), Default::default()).unwrap();
    let limits = if flow_on {
        Limits::default()
    } else {
        Limits {
            seats: 1_000_000_000,
            ..Default::default()
        }
    };
    let server = ApiServer::start(
        store,
        Config {
            flow: limits,
            ..Default::default()
        },
    )
    .await
    .unwrap();
    let admin = server.in_process_router("admin");
    for user in ["greedy", "polite"] {
        let binding = format!(
            r#"{{"apiVersion":"rbac.authorization.k8s.io/v1","kind":"ClusterRoleBinding","metadata":{{"name":"{user}"}},"roleRef":{{"apiGroup":"rbac.authorization.k8s.io","kind":"ClusterRole","name":"cluster-admin"}},"subjects":[{{"kind":"User","name":"{user}","apiGroup":"rbac.authorization.k8s.io"}}]}}"#
        );
        let s = call(
            &admin,
            "POST",
            "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings",
            Some(binding),
        )
        .await;
        assert_eq!(s, 201);
    }
    let value = "v".repeat(900);
    futures::future::join_all((0..objects).map(|i| {
        let (admin, value) = (admin.clone(), value.clone());
        async move {
            let body = format!(
                r#"{{"apiVersion":"v1","kind":"ConfigMap","metadata":{{"name":"cm-{i}"}},"data":{{"k":"{value}"}}}}"#
            );
            call(&admin, "POST", "/api/v1/namespaces/default/configmaps", Some(body)).await
        }
    }))
    .await;
    let greedy = server.router_as(Identity::new("greedy", vec![]));
    let polite = server.router_as(Identity::new("polite", vec![]));
    // RBAC follows the watch cache: wait until both users are allowed.
    for r in [&greedy, &polite] {
        while call(r, "GET", "/api/v1/namespaces/default/configmaps/cm-0", None).await != 200 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    let rss_loaded = peak_rss_mib();

    let stop = Arc::new(AtomicBool::new(false));
    let lists = Arc::new(AtomicU64::new(0));
    let refused = Arc::new(AtomicU64::new(0));
    let mut workers = vec![];
    for _ in 0..greedy_n {
        let (r, stop, lists, refused) =
            (greedy.clone(), stop.clone(), lists.clone(), refused.clone());
        workers.push(tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                // In process nothing else makes a request yield; without
                // this the workers would never let the timers run.
                tokio::task::yield_now().await;
                match call_slow(&r, "GET", "/api/v1/configmaps", None, read_after).await {
                    200 => lists.fetch_add(1, Ordering::Relaxed),
                    429 => {
                        refused.fetch_add(1, Ordering::Relaxed);
                        // What a client told Retry-After: 1 would do, shortened.
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        0
                    }
                    s => panic!("greedy list answered {s}"),
                };
            }
        }));
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    // The polite client runs on the same worker threads as everything else.
    let mut lat = tokio::spawn(async move {
        let mut lat = vec![];
        let start = Instant::now();
        let mut i = 0;
        while start.elapsed() < Duration::from_secs(seconds) {
            let t = Instant::now();
            let s = call(
                &polite,
                "GET",
                &format!("/api/v1/namespaces/default/configmaps/cm-{}", i % objects),
                None,
            )
            .await;
            assert_eq!(s, 200, "polite GET answered {s}");
            // Its turn on a worker thread again counts too: a client on
            // the network would wait for that before its next request.
            tokio::task::yield_now().await;
            lat.push(t.elapsed());
            i += 1;
        }
        lat
    })
    .await
    .unwrap();
    stop.store(true, Ordering::Relaxed);
    for w in workers {
        let _ = w.await;
    }
    lat.sort();
    println!(
        "flow control {}: {objects} objects, {greedy_n} greedy unpaged lists in flight (each read {} ms after its answer), {seconds} s",
        if flow_on { "on" } else { "off" },
        read_after.as_millis()
    );
    println!(
        "polite GET: {} done, p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms",
        lat.len(),
        pct(&lat, 0.5),
        pct(&lat, 0.99),
        pct(&lat, 1.0)
    );
    println!(
        "greedy: {} lists served, {} refused with 429",
        lists.load(Ordering::Relaxed),
        refused.load(Ordering::Relaxed)
    );
    println!(
        "peak RSS: {:.0} MiB (after loading: {:.0} MiB)",
        peak_rss_mib(),
        rss_loaded
    );
}
