//! Benchmark B10 part 2: creates of a custom resource whose definition has
//! a large structural schema with CEL rules, beside ConfigMap creates of the
//! same JSON size.
//!
//! `cargo run --release -p skiff-apiserver --example bench_crd -- [--seconds S] [--clients C] [--rounds R]`
//!
//! Starts skiff's API server in this process on a fresh embedded store
//! (durable writes), serving TLS on loopback, creates the definition (a
//! Prometheus-sized schema: ~300 properties, list-maps, maps, patterns,
//! enums, bounds and 12 CEL rules at several levels), then alternates
//! phases of ConfigMap creates and custom resource creates from C
//! concurrent HTTP/2 clients with the admin certificate, R rounds of each.
//! Reports requests/s and p50/p99 per phase and the ratio. `--plain` uses a
//! schema that only preserves unknown fields (no checks, no CEL) instead.
//! `--profile cm|cr N` runs N creates of one kind through the router, for
//! counting instructions with callgrind.

/// The allocator the `skiff` binary uses, so the benchmark measures it.
#[global_allocator]
static ALLOC: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::Request;
use skiff_apiserver::tls::Pki;
use skiff_store::{RedbStore, Store};

mod common;
use common::{connect, pct, Sender};
#[path = "common/b10.rs"]
mod b10;
use b10::{configmap, crd, prometheus};

async fn call(s: &mut Sender, method: &str, path: &str, body: String) -> (u16, Bytes) {
    let req = Request::builder()
        .method(method)
        .uri(format!("https://localhost{path}"))
        .header("content-type", "application/json")
        .header("accept", "application/json")
        .body(Full::new(Bytes::from(body)))
        .unwrap();
    s.ready().await.unwrap();
    let resp = s.send_request(req).await.unwrap();
    let status = resp.status().as_u16();
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    (status, body)
}

async fn phase(
    conns: &[Sender],
    secs: f64,
    path: &'static str,
    body: fn(&str, usize) -> String,
    size: usize,
    tag: String,
) -> (f64, Vec<Duration>) {
    let deadline = Instant::now() + Duration::from_secs_f64(secs);
    let start = Instant::now();
    let mut tasks = Vec::new();
    for (c, mut s) in conns.iter().cloned().enumerate() {
        let tag = tag.clone();
        tasks.push(tokio::spawn(async move {
            let mut lat = Vec::new();
            let mut i = 0;
            while Instant::now() < deadline {
                let b = body(&format!("{tag}-{c}-{i}"), size);
                let t = Instant::now();
                let (code, resp) = call(&mut s, "POST", path, b).await;
                assert_eq!(code, 201, "{}", String::from_utf8_lossy(&resp));
                lat.push(t.elapsed());
                i += 1;
            }
            lat
        }));
    }
    let mut lat = Vec::new();
    for t in tasks {
        lat.extend(t.await.unwrap());
    }
    lat.sort();
    (lat.len() as f64 / start.elapsed().as_secs_f64(), lat)
}

/// `--profile cm|cr N`: N creates of one kind, one after another, through
/// the router in this process (no TLS, no sockets), for counting
/// instructions under `valgrind --tool=callgrind`: the difference between
/// two runs of different N is the per-create cost, setup excluded.
async fn profile(kind: &str, n: usize, plain: bool) {
    use tower::ServiceExt;
    let dir = tempfile::tempdir().unwrap();
    let store: Arc<dyn Store> =
        RedbStore::open(&dir.path().join("store.redb"), Default::default()).unwrap();
    let api = skiff_apiserver::ApiServer::start(store, Default::default())
        .await
        .unwrap();
    // As the admin certificate authenticates.
    let router = api.router_as(skiff_apiserver::auth::Identity::new(
        "admin",
        vec!["system:masters".to_string()],
    ));
    let send = |path: &str, body: String| {
        let req = Request::builder()
            .method("POST")
            .uri(path)
            .header("content-type", "application/json")
            .header("accept", "application/json")
            .body(axum::body::Body::from(body))
            .unwrap();
        let r = router.clone();
        async move {
            let resp = r.oneshot(req).await.unwrap();
            let status = resp.status().as_u16();
            let body = resp.into_body().collect().await.unwrap().to_bytes();
            assert!(status == 201, "{status} {}", String::from_utf8_lossy(&body));
        }
    };
    send(
        "/apis/apiextensions.k8s.io/v1/customresourcedefinitions",
        crd(plain).to_string(),
    )
    .await;
    const CRS: &str = "/apis/bench.example.com/v1/namespaces/default/prometheuses";
    // The definition is served once its watch reaches the server.
    let end = Instant::now() + Duration::from_secs(10);
    loop {
        let req = Request::builder()
            .uri(CRS)
            .body(axum::body::Body::empty())
            .unwrap();
        if router.clone().oneshot(req).await.unwrap().status() == 200 {
            break;
        }
        assert!(Instant::now() < end, "the definition was never served");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let size = prometheus("size-probe-0-0").len();
    let t = Instant::now();
    for i in 0..n {
        let name = format!("p-0-{i}");
        match kind {
            "cm" => {
                send(
                    "/api/v1/namespaces/default/configmaps",
                    configmap(&name, size),
                )
                .await
            }
            _ => send(CRS, prometheus(&name)).await,
        }
    }
    println!("{n} {kind} creates in {:?}", t.elapsed());
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
    if let Some(kind) = arg("--profile") {
        let n = args
            .iter()
            .position(|a| a == "--profile")
            .and_then(|i| args.get(i + 2))
            .and_then(|s| s.parse().ok())
            .unwrap_or(100);
        profile(&kind, n, args.iter().any(|a| a == "--plain")).await;
        return;
    }
    let secs: f64 = arg("--seconds").and_then(|s| s.parse().ok()).unwrap_or(4.0);
    let clients: usize = arg("--clients").and_then(|s| s.parse().ok()).unwrap_or(32);
    let rounds: usize = arg("--rounds").and_then(|s| s.parse().ok()).unwrap_or(2);

    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::load_or_create(&dir.path().join("pki"), &[]).unwrap();
    let store: Arc<dyn Store> =
        RedbStore::open(&dir.path().join("store.redb"), Default::default()).unwrap();
    let api = skiff_apiserver::ApiServer::start(store, Default::default())
        .await
        .unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(skiff_apiserver::serve::serve_tls(
        listener,
        pki.server_config().unwrap(),
        api.router(),
        std::future::pending(),
    ));
    let tls = common::client_tls(&pki, true);
    let mut conns = Vec::new();
    for _ in 0..clients {
        conns.push(connect(port, tls.clone()).await);
    }

    // `--plain`: the same objects under a schema that only preserves
    // unknown fields, to tell the schema's cost from the serving path's.
    let plain = args.iter().any(|a| a == "--plain");
    let definition = crd(plain);
    let schema_bytes = definition.to_string().len();
    let (code, body) = call(
        &mut conns[0],
        "POST",
        "/apis/apiextensions.k8s.io/v1/customresourcedefinitions",
        definition.to_string(),
    )
    .await;
    assert_eq!(code, 201, "{}", String::from_utf8_lossy(&body));
    const CRS: &str = "/apis/bench.example.com/v1/namespaces/default/prometheuses";
    let end = Instant::now() + Duration::from_secs(10);
    loop {
        let (code, _) = call(&mut conns[0], "GET", CRS, String::new()).await;
        if code == 200 {
            break;
        }
        assert!(Instant::now() < end, "the definition was never served");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let size = prometheus("size-probe-0-0").len();
    let cm_size = configmap("size-probe-0-0", size).len();
    println!(
        "B10 part 2 — {clients} HTTPS/2 clients, {secs} s per phase, {rounds} rounds; CRD of {schema_bytes} bytes; objects of {size} bytes (ConfigMaps {cm_size}), durable embedded store\n"
    );
    println!("| phase | creates/s | p50 ms | p99 ms |");
    println!("|---|---:|---:|---:|");
    let mut ratios = Vec::new();
    for r in 0..rounds {
        let (cm_rate, cm_lat) = phase(
            &conns,
            secs,
            "/api/v1/namespaces/default/configmaps",
            configmap,
            size,
            format!("cm{r}"),
        )
        .await;
        println!(
            "| ConfigMap, round {} | {cm_rate:.0} | {:.2} | {:.2} |",
            r + 1,
            pct(&cm_lat, 0.5),
            pct(&cm_lat, 0.99)
        );
        let (cr_rate, cr_lat) = phase(
            &conns,
            secs,
            CRS,
            |n, _| prometheus(n),
            size,
            format!("cr{r}"),
        )
        .await;
        println!(
            "| Prometheus (custom resource), round {} | {cr_rate:.0} | {:.2} | {:.2} |",
            r + 1,
            pct(&cr_lat, 0.5),
            pct(&cr_lat, 0.99)
        );
        ratios.push(100.0 * cr_rate / cm_rate);
    }
    let shown: Vec<String> = ratios.iter().map(|r| format!("{r:.0}%")).collect();
    println!(
        "\ncustom resource creates ÷ ConfigMap creates: {}",
        shown.join(", ")
    );
}
