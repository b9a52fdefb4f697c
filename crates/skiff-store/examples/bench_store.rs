//! Benchmark B2: durable store writes, embedded (redb) side by side with a
//! single-member etcd started by this benchmark, at 1, 16 and 256
//! concurrent writers, 256-byte values, unique keys.
//!
//! `cargo run --release -p skiff-store --example bench_store -- [--etcd PATH] [--seconds S] [--runs R]`
//!
//! etcd is driven through its v3 JSON gateway over HTTP/1.1 keep-alive
//! connections (one per writer), which costs etcd some JSON work that a
//! gRPC client would not; both sides fsync before acknowledging. The same
//! etcd is also driven through skiff's own store trait (`EtcdStore`: gRPC,
//! each create a transaction guarded on the key being absent), to show what
//! the trait costs.

use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use bytes::Bytes;
use std::sync::Arc;

use skiff_store::{EtcdOptions, EtcdStore, RedbStore, Store};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;

struct Result {
    writes_per_sec: f64,
    p50_ms: f64,
    p99_ms: f64,
}

fn percentile(sorted: &[Duration], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i].as_secs_f64() * 1000.0
}

fn summarize(mut lat: Vec<Duration>, elapsed: Duration) -> Result {
    lat.sort();
    Result {
        writes_per_sec: lat.len() as f64 / elapsed.as_secs_f64(),
        p50_ms: percentile(&lat, 0.5),
        p99_ms: percentile(&lat, 0.99),
    }
}

async fn bench_embedded(writers: usize, secs: f64, run: usize) -> Result {
    let dir = tempfile::tempdir().unwrap();
    let store = RedbStore::open(&dir.path().join("bench.redb"), Default::default()).unwrap();
    let r = bench_trait(store.clone(), writers, secs, &format!("/bench/{run}")).await;
    store.close();
    r
}

/// Creates through the store trait: `writers` tasks, unique keys under `prefix`.
async fn bench_trait(store: Arc<dyn Store>, writers: usize, secs: f64, prefix: &str) -> Result {
    let value = Bytes::from(vec![b'x'; 256]);
    let deadline = Instant::now() + Duration::from_secs_f64(secs);
    let start = Instant::now();
    let mut tasks = Vec::new();
    for w in 0..writers {
        let store = store.clone();
        let value = value.clone();
        let prefix = prefix.to_string();
        tasks.push(tokio::spawn(async move {
            let mut lat = Vec::new();
            let mut i = 0u64;
            while Instant::now() < deadline {
                let t = Instant::now();
                store
                    .create(&format!("{prefix}/{w}/{i}"), value.clone())
                    .await
                    .unwrap();
                lat.push(t.elapsed());
                i += 1;
            }
            lat
        }));
    }
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await.unwrap());
    }
    summarize(all, start.elapsed())
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

struct Etcd {
    child: Child,
    port: u16,
    _dir: tempfile::TempDir,
}

impl Drop for Etcd {
    fn drop(&mut self) {
        // Stop exactly the etcd this benchmark started.
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

async fn start_etcd(bin: &str) -> Etcd {
    let dir = tempfile::tempdir().unwrap();
    let (port, peer) = (free_port(), free_port());
    let child = Command::new(bin)
        .args([
            "--name",
            "bench",
            "--data-dir",
            dir.path().join("etcd").to_str().unwrap(),
            "--listen-client-urls",
            &format!("http://127.0.0.1:{port}"),
            "--advertise-client-urls",
            &format!("http://127.0.0.1:{port}"),
            "--listen-peer-urls",
            &format!("http://127.0.0.1:{peer}"),
            "--initial-advertise-peer-urls",
            &format!("http://127.0.0.1:{peer}"),
            "--initial-cluster",
            &format!("bench=http://127.0.0.1:{peer}"),
            "--log-level",
            "error",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start etcd");
    let etcd = Etcd {
        child,
        port,
        _dir: dir,
    };
    for _ in 0..100 {
        if let Ok(mut c) = EtcdConn::connect(port).await {
            if c.put("/ready", "x").await.is_ok() {
                return etcd;
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("etcd did not start");
}

struct EtcdConn {
    r: BufReader<tokio::net::tcp::OwnedReadHalf>,
    w: tokio::net::tcp::OwnedWriteHalf,
}

fn b64(s: &[u8]) -> String {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD.encode(s)
}

impl EtcdConn {
    async fn connect(port: u16) -> std::io::Result<EtcdConn> {
        let s = TcpStream::connect(("127.0.0.1", port)).await?;
        s.set_nodelay(true)?;
        let (r, w) = s.into_split();
        Ok(EtcdConn {
            r: BufReader::new(r),
            w,
        })
    }

    async fn put(&mut self, key: &str, value: &str) -> std::io::Result<()> {
        let body = format!(
            "{{\"key\":\"{}\",\"value\":\"{}\"}}",
            b64(key.as_bytes()),
            b64(value.as_bytes())
        );
        let req = format!(
            "POST /v3/kv/put HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        );
        self.w.write_all(req.as_bytes()).await?;
        let mut status = String::new();
        self.r.read_line(&mut status).await?;
        let mut len = 0usize;
        loop {
            let mut line = String::new();
            self.r.read_line(&mut line).await?;
            if line == "\r\n" || line.is_empty() {
                break;
            }
            if let Some(v) = line.to_ascii_lowercase().strip_prefix("content-length:") {
                len = v.trim().parse().unwrap_or(0);
            }
        }
        let mut buf = vec![0; len];
        self.r.read_exact(&mut buf).await?;
        if !status.contains(" 200 ") {
            return Err(std::io::Error::other(format!("etcd answered {status}")));
        }
        Ok(())
    }
}

async fn bench_etcd(port: u16, writers: usize, secs: f64, run: usize) -> Result {
    let value = "x".repeat(256);
    let deadline = Instant::now() + Duration::from_secs_f64(secs);
    let start = Instant::now();
    let mut tasks = Vec::new();
    for w in 0..writers {
        let value = value.clone();
        tasks.push(tokio::spawn(async move {
            let mut c = EtcdConn::connect(port).await.unwrap();
            let mut lat = Vec::new();
            let mut i = 0u64;
            while Instant::now() < deadline {
                let t = Instant::now();
                c.put(&format!("/bench/{run}/{w}/{i}"), &value)
                    .await
                    .unwrap();
                lat.push(t.elapsed());
                i += 1;
            }
            lat
        }));
    }
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await.unwrap());
    }
    summarize(all, start.elapsed())
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
            .cloned()
    };
    let etcd_bin = arg("--etcd").unwrap_or_else(|| "/usr/bin/etcd".into());
    let secs: f64 = arg("--seconds").and_then(|s| s.parse().ok()).unwrap_or(3.0);
    let runs: usize = arg("--runs").and_then(|s| s.parse().ok()).unwrap_or(3);
    let etcd = if std::path::Path::new(&etcd_bin).exists() {
        Some(start_etcd(&etcd_bin).await)
    } else {
        None
    };
    if etcd.is_none() {
        eprintln!("etcd not found at {etcd_bin}: measuring the embedded store only (apt-get install etcd-server)");
    }
    let through_trait: Option<Arc<dyn Store>> = match &etcd {
        Some(e) => Some(
            EtcdStore::connect(EtcdOptions {
                endpoints: vec![format!("http://127.0.0.1:{}", e.port)],
                ..Default::default()
            })
            .await
            .expect("connecting to the benchmark's etcd"),
        ),
        None => None,
    };
    println!("| writers | embedded writes/s | embedded p50 / p99 ms | etcd writes/s | etcd p50 / p99 ms | embedded ÷ etcd | etcd via trait writes/s | via trait p50 / p99 ms | via trait ÷ etcd |");
    println!("|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for writers in [1usize, 16, 256] {
        let (mut ew, mut e50, mut e99, mut tw, mut t50, mut t99) =
            (vec![], vec![], vec![], vec![], vec![], vec![]);
        let (mut vw, mut v50, mut v99) = (vec![], vec![], vec![]);
        for run in 0..runs {
            // Alternate which side goes first so neither always gets the warmer disk.
            let order = if run % 2 == 0 {
                [true, false]
            } else {
                [false, true]
            };
            for embedded in order {
                if embedded {
                    let r = bench_embedded(writers, secs, run).await;
                    ew.push(r.writes_per_sec);
                    e50.push(r.p50_ms);
                    e99.push(r.p99_ms);
                } else if let Some(e) = &etcd {
                    let r = bench_etcd(e.port, writers, secs, run * 1000 + writers).await;
                    tw.push(r.writes_per_sec);
                    t50.push(r.p50_ms);
                    t99.push(r.p99_ms);
                    if let Some(st) = &through_trait {
                        let prefix = format!("/trait/{}", run * 1000 + writers);
                        let r = bench_trait(st.clone(), writers, secs, &prefix).await;
                        vw.push(r.writes_per_sec);
                        v50.push(r.p50_ms);
                        v99.push(r.p99_ms);
                    }
                }
            }
        }
        let (emb, et) = (
            median(ew),
            if tw.is_empty() {
                f64::NAN
            } else {
                median(tw.clone())
            },
        );
        let dash = || "–".to_string();
        let via = if vw.is_empty() {
            f64::NAN
        } else {
            median(vw.clone())
        };
        println!(
            "| {writers} | {emb:.0} | {:.2} / {:.2} | {} | {} | {} | {} | {} | {} |",
            median(e50),
            median(e99),
            if tw.is_empty() {
                dash()
            } else {
                format!("{et:.0}")
            },
            if t50.is_empty() {
                dash()
            } else {
                format!("{:.2} / {:.2}", median(t50), median(t99))
            },
            if tw.is_empty() {
                dash()
            } else {
                format!("{:.2}×", emb / et)
            },
            if vw.is_empty() {
                dash()
            } else {
                format!("{via:.0}")
            },
            if v50.is_empty() {
                dash()
            } else {
                format!("{:.2} / {:.2}", median(v50), median(v99))
            },
            if vw.is_empty() || tw.is_empty() {
                dash()
            } else {
                format!("{:.2}×", via / et)
            },
        );
    }
}
