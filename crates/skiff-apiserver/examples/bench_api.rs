//! Benchmark B3: the API server's throughput and latency over HTTPS.
//!
//! `cargo run --release -p skiff-apiserver --example bench_api -- [--seconds S] [--clients C] [--etcd]`
//!
//! Starts skiff's API server in this process on a fresh embedded store
//! (durable writes) — or, with `--etcd`, on a single-member etcd (Debian's
//! `/usr/bin/etcd`) that the benchmark starts on loopback and stops — serving TLS on a loopback port, and drives it from C
//! concurrent clients, each on its own HTTP/2 connection with the admin
//! client certificate. Reports, per verb, requests/s and p50/p99 latency:
//! ConfigMap create, get, list (100 items) and watch delivery; then a paced
//! phase of 1,000 creates/s with concurrent gets, and the ratio of API
//! create throughput to raw store create throughput at the same concurrency.

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

fn report(name: &str, mut lat: Vec<Duration>, elapsed: Duration) -> f64 {
    lat.sort();
    let rate = lat.len() as f64 / elapsed.as_secs_f64();
    println!(
        "| {name} | {rate:.0} | {:.2} | {:.2} |",
        pct(&lat, 0.5),
        pct(&lat, 0.99)
    );
    rate
}

async fn call(s: &mut Sender, method: &str, path: &str, body: Option<String>) -> (u16, Bytes) {
    let req = Request::builder()
        .method(method)
        .uri(format!("https://localhost{path}"))
        .header("content-type", "application/json")
        .header("accept", "application/json")
        .body(Full::new(Bytes::from(body.unwrap_or_default())))
        .unwrap();
    s.ready().await.unwrap();
    let resp = s.send_request(req).await.unwrap();
    let status = resp.status().as_u16();
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    (status, body)
}

fn cm(name: &str) -> String {
    format!(
        r#"{{"apiVersion":"v1","kind":"ConfigMap","metadata":{{"name":"{name}","labels":{{"bench":"b3"}}}},"data":{{"k":"{}"}}}}"#,
        "v".repeat(200)
    )
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
    let secs: f64 = arg("--seconds").and_then(|s| s.parse().ok()).unwrap_or(5.0);
    let clients: usize = arg("--clients").and_then(|s| s.parse().ok()).unwrap_or(32);

    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::load_or_create(&dir.path().join("pki"), &[]).unwrap();
    let etcd = if args.iter().any(|a| a == "--etcd") {
        Some(skiff_store::testsuite::EtcdServer::start().await)
    } else {
        None
    };
    let store: Arc<dyn Store> = match &etcd {
        Some(e) => e.store().await,
        None => RedbStore::open(&dir.path().join("store.redb"), Default::default()).unwrap(),
    };
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
    println!(
        "B3 — {clients} HTTPS/2 clients, {secs} s per phase, ConfigMaps of ~300 bytes, durable store ({})\n",
        if etcd.is_some() { "etcd" } else { "embedded" }
    );
    println!("| verb | requests/s | p50 ms | p99 ms |");
    println!("|---|---:|---:|---:|");

    // Creates, as fast as the clients go.
    let deadline = Instant::now() + Duration::from_secs_f64(secs);
    let start = Instant::now();
    let mut tasks = Vec::new();
    for (c, mut s) in conns.clone().into_iter().enumerate() {
        tasks.push(tokio::spawn(async move {
            let mut lat = Vec::new();
            let mut i = 0;
            while Instant::now() < deadline {
                let t = Instant::now();
                let (code, _) = call(
                    &mut s,
                    "POST",
                    "/api/v1/namespaces/default/configmaps",
                    Some(cm(&format!("c{c}-{i}"))),
                )
                .await;
                assert_eq!(code, 201);
                lat.push(t.elapsed());
                i += 1;
            }
            (lat, i)
        }));
    }
    let mut lat = Vec::new();
    let mut created = Vec::new();
    for (c, t) in tasks.into_iter().enumerate() {
        let (l, n) = t.await.unwrap();
        lat.extend(l);
        created.push((c, n));
    }
    let api_create_rate = report("create (ConfigMap)", lat, start.elapsed());

    // Gets of existing objects.
    let deadline = Instant::now() + Duration::from_secs_f64(secs);
    let start = Instant::now();
    let mut tasks = Vec::new();
    for (c, mut s) in conns.clone().into_iter().enumerate() {
        let n = created[c].1.max(1);
        tasks.push(tokio::spawn(async move {
            let mut lat = Vec::new();
            let mut i = 0;
            while Instant::now() < deadline {
                let t = Instant::now();
                let (code, _) = call(
                    &mut s,
                    "GET",
                    &format!("/api/v1/namespaces/default/configmaps/c{c}-{}", i % n),
                    None,
                )
                .await;
                assert_eq!(code, 200);
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
    report("get (ConfigMap)", lat, start.elapsed());

    // Lists of a namespace with 100 objects.
    {
        let mut s = conns[0].clone();
        for i in 0..100 {
            call(
                &mut s,
                "POST",
                "/api/v1/namespaces/kube-public/configmaps",
                Some(cm(&format!("l{i}"))),
            )
            .await;
        }
    }
    let deadline = Instant::now() + Duration::from_secs_f64(secs);
    let start = Instant::now();
    let mut tasks = Vec::new();
    for mut s in conns.clone().into_iter().take(8) {
        tasks.push(tokio::spawn(async move {
            let mut lat = Vec::new();
            while Instant::now() < deadline {
                let t = Instant::now();
                let (code, body) = call(
                    &mut s,
                    "GET",
                    "/api/v1/namespaces/kube-public/configmaps",
                    None,
                )
                .await;
                assert_eq!(code, 200);
                assert!(body.len() > 100 * 200);
                lat.push(t.elapsed());
            }
            lat
        }));
    }
    let mut lat = Vec::new();
    for t in tasks {
        lat.extend(t.await.unwrap());
    }
    report("list (100 ConfigMaps, 8 clients)", lat, start.elapsed());

    // Paced: 1,000 creates/s spread over the clients, with gets alongside.
    let rate = 1000.0;
    let per_client = Duration::from_secs_f64(clients as f64 / rate);
    let deadline = Instant::now() + Duration::from_secs_f64(secs);
    let start = Instant::now();
    let mut writers = Vec::new();
    for (c, mut s) in conns.clone().into_iter().enumerate() {
        writers.push(tokio::spawn(async move {
            let mut lat = Vec::new();
            let mut next = Instant::now() + per_client.mul_f64(c as f64 / 32.0);
            let mut i = 0;
            while Instant::now() < deadline {
                tokio::time::sleep_until(next.into()).await;
                next += per_client;
                let t = Instant::now();
                let (code, _) = call(
                    &mut s,
                    "POST",
                    "/api/v1/namespaces/default/configmaps",
                    Some(cm(&format!("p{c}-{i}"))),
                )
                .await;
                assert_eq!(code, 201);
                lat.push(t.elapsed());
                i += 1;
            }
            lat
        }));
    }
    let mut readers = Vec::new();
    for (c, mut s) in conns.clone().into_iter().enumerate().take(4) {
        let n = created[c].1.max(1);
        readers.push(tokio::spawn(async move {
            let mut lat = Vec::new();
            let mut i = 0;
            while Instant::now() < deadline {
                let t = Instant::now();
                call(
                    &mut s,
                    "GET",
                    &format!("/api/v1/namespaces/default/configmaps/c{c}-{}", i % n),
                    None,
                )
                .await;
                lat.push(t.elapsed());
                i += 1;
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
            lat
        }));
    }
    let mut wl = Vec::new();
    for t in writers {
        wl.extend(t.await.unwrap());
    }
    let mut rl = Vec::new();
    for t in readers {
        rl.extend(t.await.unwrap());
    }
    let el = start.elapsed();
    report("create, paced at 1,000/s", wl, el);
    report("get, during the paced creates", rl, el);

    // Raw store creates at the same concurrency, for the API-layer cost.
    let raw: Arc<dyn Store> = match &etcd {
        // The same etcd, under another prefix than the API server's.
        Some(e) => skiff_store::EtcdStore::connect(skiff_store::EtcdOptions {
            prefix: "/raw".into(),
            ..e.options()
        })
        .await
        .unwrap(),
        None => RedbStore::open(&dir.path().join("raw.redb"), Default::default()).unwrap(),
    };
    let deadline = Instant::now() + Duration::from_secs_f64(secs);
    let start = Instant::now();
    let mut tasks = Vec::new();
    for c in 0..clients {
        let raw = raw.clone();
        tasks.push(tokio::spawn(async move {
            let mut lat = Vec::new();
            let mut i = 0;
            let v = Bytes::from(cm("x").into_bytes());
            while Instant::now() < deadline {
                let t = Instant::now();
                raw.create(&format!("/registry/configmaps/default/r{c}-{i}"), v.clone())
                    .await
                    .unwrap();
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
    let raw_rate = report("raw store create (same concurrency)", lat, start.elapsed());
    println!(
        "\nAPI create throughput ÷ raw store create throughput: {:.0}%",
        100.0 * api_create_rate / raw_rate
    );
}
