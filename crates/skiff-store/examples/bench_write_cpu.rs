//! CPU cost of durable writes in the embedded store, shaped like B1's pods:
//! 2 KB JSON values, 256 concurrent writers, every key created and then
//! updated once (a pod is created, then bound a little later).
//!
//! `cargo run --release -p skiff-store --example bench_write_cpu -- [--keys N] [--writers W] [--runs R] [--value-bytes B]`
//!
//! Each run opens a fresh store in a temp dir, writes `2 × keys` times and
//! prints wall time, writes/s, the CPU of the whole process and of the
//! committer thread per 10,000 writes, the size of the file and the time of
//! one list of every key written (fastest of 5). The final
//! line gives the medians over the runs.

use std::time::{Duration, Instant};

use bytes::Bytes;
use skiff_store::{RedbStore, Store};

/// CPU seconds of this process so far (user + system, every thread, live or gone).
fn process_cpu() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    // Fields after the command name (which may hold spaces) start after ") ".
    let rest = stat.rsplit_once(") ").map(|(_, r)| r).unwrap_or("");
    let f: Vec<&str> = rest.split_whitespace().collect();
    // utime and stime are fields 14 and 15 of the whole line: 11 and 12 here.
    let ticks: f64 = f.get(11).and_then(|u| u.parse::<f64>().ok()).unwrap_or(0.0)
        + f.get(12).and_then(|s| s.parse::<f64>().ok()).unwrap_or(0.0);
    ticks / 100.0
}

/// CPU seconds (nanosecond precision) of each live thread of this process
/// named `name` (any name if `None`), by thread id.
fn thread_cpu(name: Option<&str>) -> std::collections::HashMap<String, f64> {
    let mut out = std::collections::HashMap::new();
    let Ok(dir) = std::fs::read_dir("/proc/self/task") else {
        return out;
    };
    for t in dir.flatten() {
        let comm = std::fs::read_to_string(t.path().join("comm")).unwrap_or_default();
        if name.is_some_and(|n| n != comm.trim_end()) {
            continue;
        }
        let sched = std::fs::read_to_string(t.path().join("schedstat")).unwrap_or_default();
        if let Some(ns) = sched
            .split_whitespace()
            .next()
            .and_then(|n| n.parse::<f64>().ok())
        {
            out.insert(t.file_name().to_string_lossy().into_owned(), ns / 1e9);
        }
    }
    out
}

/// A pod-like JSON document of exactly `len` bytes.
fn value(name: &str, node: Option<&str>, len: usize) -> Bytes {
    let head = format!(
        "{{\"apiVersion\":\"v1\",\"kind\":\"Pod\",\"metadata\":{{\"name\":\"{name}\",\"namespace\":\"bench\",\"uid\":\"{name}-0000-4000-8000-000000000000\",\"labels\":{{\"app\":\"bench\"}}}},\"spec\":{{{}\"containers\":[{{\"name\":\"c\",\"image\":\"registry.k8s.io/pause:3.9\"}}]}},\"status\":{{\"phase\":\"Pending\"}},\"pad\":\"",
        node.map(|n| format!("\"nodeName\":\"{n}\","))
            .unwrap_or_default()
    );
    const PAD: &[u8] = b"abcdefghijklmnopqrstuvwxyz";
    let tail = b"\"}";
    let mut v = Vec::with_capacity(len.max(head.len() + tail.len()));
    v.extend_from_slice(head.as_bytes());
    while v.len() + tail.len() < len {
        let n = (len - tail.len() - v.len()).min(PAD.len());
        v.extend_from_slice(&PAD[..n]);
    }
    v.extend_from_slice(tail);
    Bytes::from(v)
}

struct Run {
    wall: f64,
    writes_per_sec: f64,
    cpu_per_10k: f64,
    committer_per_10k: f64,
    file_mb: f64,
    list_ms: f64,
}

async fn run_once(keys: usize, writers: usize, value_bytes: usize, lag: usize) -> Run {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bench.redb");
    let store = RedbStore::open(&path, Default::default()).unwrap();
    let cpu0 = process_cpu();
    // Every thread: the committer may not carry its name yet.
    let com0 = thread_cpu(None);
    let start = Instant::now();
    let mut tasks = Vec::new();
    for w in 0..writers {
        let store = store.clone();
        tasks.push(tokio::spawn(async move {
            // This writer's keys; each is updated `lag` creates after its own.
            let mine: Vec<usize> = (w..keys).step_by(writers).collect();
            let mut pending: std::collections::VecDeque<(String, i64)> = Default::default();
            let update = |store: std::sync::Arc<RedbStore>, key: String, rev: i64| async move {
                let name = key.rsplit('/').next().unwrap_or("").to_string();
                store
                    .update(&key, value(&name, Some("node-1"), value_bytes), rev)
                    .await
                    .unwrap();
            };
            for i in mine {
                let name = format!("pod-{i:06}");
                let key = format!("/registry/pods/bench/{name}");
                let kv = store
                    .create(&key, value(&name, None, value_bytes))
                    .await
                    .unwrap();
                pending.push_back((key, kv.mod_revision));
                if pending.len() > lag {
                    let (k, r) = pending.pop_front().unwrap();
                    update(store.clone(), k, r).await;
                }
            }
            while let Some((k, r)) = pending.pop_front() {
                update(store.clone(), k, r).await;
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let wall = start.elapsed().as_secs_f64();
    // The committer threads alive now (a previous run's may have been
    // exiting at the start).
    let com: f64 = thread_cpu(Some("skiff-store-com"))
        .iter()
        .map(|(tid, end)| end - com0.get(tid).copied().unwrap_or(0.0))
        .sum();
    let cpu = process_cpu() - cpu0;
    // A full read of what was written (as the API server's cache does at
    // start): the fastest of 5.
    let mut list_ms = f64::MAX;
    for _ in 0..5 {
        let t = Instant::now();
        let all = store
            .list("/registry/pods/", Default::default())
            .await
            .unwrap();
        list_ms = list_ms.min(t.elapsed().as_secs_f64() * 1000.0);
        assert_eq!(all.items.len(), keys);
    }
    store.close();
    drop(store);
    // Let the committer finish before the file goes.
    tokio::time::sleep(Duration::from_millis(50)).await;
    let writes = (2 * keys) as f64;
    Run {
        wall,
        writes_per_sec: writes / wall,
        cpu_per_10k: cpu * 10_000.0 / writes,
        committer_per_10k: com * 10_000.0 / writes,
        file_mb: std::fs::metadata(&path)
            .map(|m| m.len() as f64 / 1e6)
            .unwrap_or(0.0),
        list_ms,
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[v.len() / 2]
}

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    let arg = |name: &str| {
        args.iter()
            .position(|a| a == name)
            .and_then(|i| args.get(i + 1))
            .and_then(|s| s.parse::<usize>().ok())
    };
    let keys = arg("--keys").unwrap_or(10_000);
    let writers = arg("--writers").unwrap_or(256);
    let runs = arg("--runs").unwrap_or(3);
    let value_bytes = arg("--value-bytes").unwrap_or(2048);
    let lag = arg("--lag").unwrap_or(8);
    let mut all = Vec::new();
    for run in 0..runs {
        let r = run_once(keys, writers, value_bytes, lag).await;
        println!(
            "run {run}: {:.2} s wall, {:.0} writes/s, CPU {:.3} s / 10k writes (committer {:.3} s), file {:.1} MB, list of all {:.1} ms",
            r.wall, r.writes_per_sec, r.cpu_per_10k, r.committer_per_10k, r.file_mb, r.list_ms
        );
        all.push(r);
    }
    println!(
        "median: {:.0} writes/s, CPU {:.3} s / 10k writes (committer {:.3} s), file {:.1} MB, list of all {:.1} ms",
        median(all.iter().map(|r| r.writes_per_sec).collect()),
        median(all.iter().map(|r| r.cpu_per_10k).collect()),
        median(all.iter().map(|r| r.committer_per_10k).collect()),
        median(all.iter().map(|r| r.file_mb).collect()),
        median(all.iter().map(|r| r.list_ms).collect()),
    );
}
