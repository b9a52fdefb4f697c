//! Benchmark B7: watch fan-out.
//!
//! `cargo run --release -p skiff-apiserver --example bench_watch -- [--watchers W] [--rate R] [--seconds S]`
//!
//! Runs skiff's API server in a child process (this program with `--serve`,
//! on a fresh durable embedded store, HTTPS on a loopback port) so that its
//! memory is measured alone. Then, as a client over 10 HTTP/2 connections:
//! creates 5,000 pods bound to W/2 nodes (labels `app=a0..a49`), opens W
//! watches on pods from the current resourceVersion — half with a
//! `spec.nodeName=` field selector (one per node, the kubelet pattern), half
//! with an `app=` label selector — and measures the server's RSS growth per
//! watcher. Then it patches pods at R updates/s for S seconds (16 writers)
//! and reports, for every event delivered, the latency from the write's
//! acknowledgement to its arrival at the watcher (p50/p99/max), and how many
//! of the expected deliveries arrived.

/// The allocator the `skiff` binary uses, so the benchmark measures it.
#[global_allocator]
static ALLOC: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::Request;
use skiff_apiserver::tls::Pki;
use skiff_store::{RedbStore, Store};

mod common;
use common::{connect, pct, Sender};

const PODS: usize = 5000;
const LABELS: usize = 50;
const CONNECTIONS: usize = 10;

fn request(method: &str, path: &str, ct: &str, body: String) -> Request<Full<Bytes>> {
    Request::builder()
        .method(method)
        .uri(format!("https://localhost{path}"))
        .header("content-type", ct)
        .header("accept", "application/json")
        .body(Full::new(Bytes::from(body)))
        .unwrap()
}

async fn call(s: &mut Sender, method: &str, path: &str, ct: &str, body: String) -> (u16, Bytes) {
    s.ready().await.unwrap();
    let resp = s
        .send_request(request(method, path, ct, body))
        .await
        .unwrap();
    let status = resp.status().as_u16();
    (status, resp.into_body().collect().await.unwrap().to_bytes())
}

/// The `"resourceVersion":"N"` of an object's metadata (the first one).
fn resource_version(b: &[u8]) -> Option<i64> {
    let key = b"\"resourceVersion\":\"";
    let at = b.windows(key.len()).position(|w| w == key)? + key.len();
    let end = b[at..].iter().position(|&c| c == b'"')? + at;
    std::str::from_utf8(&b[at..end]).ok()?.parse().ok()
}

fn rss_kib(pid: u32) -> u64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    s.lines()
        .find(|l| l.starts_with("VmRSS:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

async fn serve(dir: std::path::PathBuf) {
    let pki = Pki::load_or_create(&dir.join("pki"), &[]).unwrap();
    let store: Arc<dyn Store> =
        RedbStore::open(&dir.join("store.redb"), Default::default()).unwrap();
    let api = skiff_apiserver::ApiServer::start(store, Default::default())
        .await
        .unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    std::fs::write(dir.join("port.tmp"), port.to_string()).unwrap();
    std::fs::rename(dir.join("port.tmp"), dir.join("port")).unwrap();
    skiff_apiserver::serve::serve_tls(
        listener,
        pki.server_config().unwrap(),
        api.router(),
        std::future::pending(),
    )
    .await;
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
    if let Some(dir) = arg("--serve") {
        serve(dir.into()).await;
        return;
    }
    let watchers: usize = arg("--watchers")
        .and_then(|s| s.parse().ok())
        .unwrap_or(1000);
    let rate: f64 = arg("--rate").and_then(|s| s.parse().ok()).unwrap_or(1000.0);
    let secs: f64 = arg("--seconds")
        .and_then(|s| s.parse().ok())
        .unwrap_or(10.0);
    let nodes = (watchers / 2).max(1);

    let dir = tempfile::tempdir().unwrap();
    let mut child = std::process::Command::new(std::env::current_exe().unwrap())
        .arg("--serve")
        .arg(dir.path())
        .spawn()
        .unwrap();
    let port_file = dir.path().join("port");
    let t0 = Instant::now();
    while !port_file.exists() {
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "server did not start"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let port: u16 = std::fs::read_to_string(&port_file)
        .unwrap()
        .parse()
        .unwrap();
    let pki = Pki::load_or_create(&dir.path().join("pki"), &[]).unwrap();
    let tls = common::client_tls(&pki, true);
    let mut conns = Vec::new();
    for _ in 0..CONNECTIONS {
        conns.push(connect(port, tls.clone()).await);
    }

    // The pods, bound to their nodes at creation.
    let mut tasks = Vec::new();
    for (c, mut s) in conns.clone().into_iter().enumerate() {
        tasks.push(tokio::spawn(async move {
            for i in (c..PODS).step_by(CONNECTIONS) {
                let pod = format!(
                    r#"{{"apiVersion":"v1","kind":"Pod","metadata":{{"name":"p{i}","labels":{{"app":"a{}"}}}},"spec":{{"nodeName":"n{}","containers":[{{"name":"c","image":"pause:1"}}]}}}}"#,
                    i % LABELS,
                    i % nodes
                );
                let (code, body) = call(
                    &mut s,
                    "POST",
                    "/api/v1/namespaces/default/pods",
                    "application/json",
                    pod,
                )
                .await;
                assert_eq!(code, 201, "{}", String::from_utf8_lossy(&body));
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let (_, list) = call(
        &mut conns[0],
        "GET",
        "/api/v1/namespaces/default/pods?limit=1",
        "application/json",
        String::new(),
    )
    .await;
    let rv = resource_version(&list).unwrap();
    tokio::time::sleep(Duration::from_secs(1)).await;
    let rss_before = rss_kib(child.id());

    // The watchers: (receipt revision, time) per event, per watcher.
    let received: Arc<Mutex<Vec<(i64, Instant)>>> = Arc::new(Mutex::new(Vec::new()));
    let mut opened = Vec::new();
    for w in 0..watchers {
        let selector = if w % 2 == 0 {
            format!("fieldSelector=spec.nodeName%3Dn{}", (w / 2) % nodes)
        } else {
            format!("labelSelector=app%3Da{}", (w / 2) % LABELS)
        };
        let path =
            format!("/api/v1/namespaces/default/pods?watch=1&resourceVersion={rv}&{selector}");
        let mut s = conns[w % CONNECTIONS].clone();
        let received = received.clone();
        let (ready_tx, ready_rx) = tokio::sync::oneshot::channel();
        tokio::spawn(async move {
            s.ready().await.unwrap();
            let resp = s
                .send_request(request("GET", &path, "application/json", String::new()))
                .await
                .unwrap();
            assert_eq!(resp.status(), 200);
            let _ = ready_tx.send(());
            let mut body = resp.into_body();
            let mut buf: Vec<u8> = Vec::new();
            let mut mine = Vec::new();
            while let Some(Ok(frame)) = body.frame().await {
                let Ok(data) = frame.into_data() else {
                    continue;
                };
                let now = Instant::now();
                buf.extend_from_slice(&data);
                while let Some(nl) = buf.iter().position(|&c| c == b'\n') {
                    let line: Vec<u8> = buf.drain(..=nl).collect();
                    if let Some(r) = resource_version(&line) {
                        mine.push((r, now));
                    }
                }
                if mine.len() >= 256 {
                    received.lock().unwrap().append(&mut mine);
                }
            }
            received.lock().unwrap().append(&mut mine);
        });
        opened.push(ready_rx);
    }
    for r in opened {
        r.await.unwrap();
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    let rss_watching = rss_kib(child.id());

    // The writers, paced to `rate` in all.
    let acks: Arc<Mutex<HashMap<i64, Instant>>> = Arc::new(Mutex::new(HashMap::new()));
    let writers = 16;
    let total = (rate * secs) as usize;
    let start = Instant::now();
    let mut tasks = Vec::new();
    for wi in 0..writers {
        let mut s = conns[wi % CONNECTIONS].clone();
        let acks = acks.clone();
        tasks.push(tokio::spawn(async move {
            let mut write_lat = Vec::new();
            for k in (wi..total).step_by(writers) {
                let due = start + Duration::from_secs_f64(k as f64 / rate);
                tokio::time::sleep_until(due.into()).await;
                let t = Instant::now();
                let (code, body) = call(
                    &mut s,
                    "PATCH",
                    &format!("/api/v1/namespaces/default/pods/p{}", k % PODS),
                    "application/merge-patch+json",
                    format!(r#"{{"metadata":{{"annotations":{{"tick":"{k}"}}}}}}"#),
                )
                .await;
                let now = Instant::now();
                assert_eq!(code, 200, "{}", String::from_utf8_lossy(&body));
                write_lat.push(now - t);
                if let Some(r) = resource_version(&body) {
                    acks.lock().unwrap().insert(r, now);
                }
            }
            write_lat
        }));
    }
    let mut write_lat = Vec::new();
    for t in tasks {
        write_lat.extend(t.await.unwrap());
    }
    let wrote = start.elapsed();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let rss_after = rss_kib(child.id());
    let _ = child.kill();
    let _ = child.wait();
    tokio::time::sleep(Duration::from_millis(200)).await;

    let acks = acks.lock().unwrap();
    let received = received.lock().unwrap();
    let mut lat: Vec<Duration> = received
        .iter()
        .filter_map(|(r, t)| acks.get(r).map(|a| t.saturating_duration_since(*a)))
        .collect();
    lat.sort();
    write_lat.sort();
    // Each update reaches its node's watcher and the label's watchers.
    let label_watchers = watchers / 2;
    let expected = acks.len() * (1 + label_watchers / LABELS);
    println!(
        "B7 — {watchers} watchers ({nodes} spec.nodeName=, {label_watchers} app=), {PODS} pods, {} updates in {:.1} s ({:.0}/s), {CONNECTIONS} HTTP/2 connections\n",
        acks.len(),
        wrote.as_secs_f64(),
        acks.len() as f64 / wrote.as_secs_f64()
    );
    println!("| measure | value |");
    println!("|---|---:|");
    println!(
        "| deliveries received / expected | {} / {expected} |",
        lat.len()
    );
    println!("| delivery latency p50 ms | {:.2} |", pct(&lat, 0.5));
    println!("| delivery latency p99 ms | {:.2} |", pct(&lat, 0.99));
    println!(
        "| delivery latency max ms | {:.2} |",
        lat.last().map(|d| d.as_secs_f64() * 1000.0).unwrap_or(0.0)
    );
    println!(
        "| patch latency p50 / p99 ms | {:.2} / {:.2} |",
        pct(&write_lat, 0.5),
        pct(&write_lat, 0.99)
    );
    println!(
        "| server RSS growth per watcher | {:.2} KiB |",
        (rss_watching.saturating_sub(rss_before)) as f64 / watchers as f64
    );
    println!(
        "| server RSS before watchers / watching / after updates | {} / {} / {} MiB |",
        rss_before / 1024,
        rss_watching / 1024,
        rss_after / 1024
    );
}
