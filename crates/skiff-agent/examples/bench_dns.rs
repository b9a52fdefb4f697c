//! B9 (DNS): the agent's DNS responder under `dnsperf`, with 10,000
//! Services × 10 endpoints in its index, serving on one core.
//!
//! ```text
//! cargo run --release -p skiff-agent --example bench_dns -- \
//!     [--services 10000] [--seconds 20] [--clients 20]
//! ```
//!
//! Builds the index as the watches would (80% ClusterIP services, 20%
//! headless with StatefulSet-style hostnames), serves it on a loopback
//! port from a single-threaded runtime (one core), runs dnsperf (Debian's
//! package) with a mix of service A, headless A, pod-name A, SRV and
//! NXDOMAIN queries, and prints queries/s, latency percentiles (from
//! dnsperf's per-query report) and the process's memory.

use std::io::Write;
use std::net::SocketAddr;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use serde_json::json;
use skiff_agent::dns::forward::Forwarder;
use skiff_agent::dns::records::{Index, ServiceRecord, SliceRecord, ZoneConfig};
use skiff_agent::dns::server::{self, Metrics, Responder};

fn arg(name: &str, default: u64) -> u64 {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .unwrap_or_default()
        .lines()
        .find(|l| l.starts_with("VmRSS:"))
        .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
        .unwrap_or(0)
}

fn ip(i: u64, j: u64) -> String {
    format!(
        "10.{}.{}.{}",
        42 + (i * 10 + j) / 65536,
        ((i * 10 + j) / 256) % 256,
        (i * 10 + j) % 256
    )
}

fn main() {
    let services = arg("--services", 10_000);
    let seconds = arg("--seconds", 20);
    let clients = arg("--clients", 20);
    let namespaces = 100;
    let before = rss_kib();
    let mut index = Index::new(ZoneConfig {
        domain: "cluster.local".into(),
        dns_ip: Some("10.43.0.10".parse().unwrap()),
        ttl: 5,
    });
    for i in 0..services {
        let ns = format!("ns-{}", i % namespaces);
        let name = format!("svc-{i}");
        let headless = i % 5 == 0;
        let cluster_ip = if headless {
            "None".to_string()
        } else {
            format!("10.43.{}.{}", 1 + i / 250, i % 250)
        };
        let svc: Service = serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": ns},
            "spec": {"clusterIP": cluster_ip, "ports": [{"name": "http", "port": 80, "protocol": "TCP"}]}
        }))
        .unwrap();
        index.set_service(&ns, &name, ServiceRecord::from_service(&svc));
        let endpoints: Vec<serde_json::Value> = (0..10)
            .map(|j| {
                let mut e = json!({"addresses": [ip(i, j)], "conditions": {"ready": true}});
                if headless {
                    e["hostname"] = json!(format!("{name}-{j}"));
                }
                e
            })
            .collect();
        let slice: EndpointSlice = serde_json::from_value(json!({
            "metadata": {"name": format!("{name}-abcde"), "namespace": ns,
                "labels": {"kubernetes.io/service-name": name}},
            "addressType": "IPv4", "endpoints": endpoints,
            "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}]
        }))
        .unwrap();
        index.set_slice(
            &ns,
            &format!("{name}-abcde"),
            SliceRecord::from_slice(&slice),
        );
    }
    let after = rss_kib();
    eprintln!(
        "index: {services} services × 10 endpoints; RSS {:.1} MiB (index {:.1} MiB)",
        after as f64 / 1024.0,
        after.saturating_sub(before) as f64 / 1024.0
    );

    // The query mix: service A 40%, headless A 15%, headless pod A 10%,
    // SRV 10%, pod dashed name 5%, NXDOMAIN 20%.
    let dir = tempfile::tempdir().unwrap();
    let queries = dir.path().join("queries.txt");
    let mut f = std::io::BufWriter::new(std::fs::File::create(&queries).unwrap());
    let mut k: u64 = 0;
    let mut next = || {
        k = k
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        k >> 33
    };
    for q in 0..100_000u64 {
        let i = next() % services;
        let ns = format!("ns-{}", i % namespaces);
        let line = match q % 20 {
            0..=7 => {
                let i = if i.is_multiple_of(5) { i + 1 } else { i } % services;
                format!("svc-{i}.ns-{}.svc.cluster.local A", i % namespaces)
            }
            8..=10 => {
                let i = i - i % 5;
                format!("svc-{i}.ns-{}.svc.cluster.local A", i % namespaces)
            }
            11 | 12 => {
                let i = i - i % 5;
                format!(
                    "svc-{i}-{}.svc-{i}.ns-{}.svc.cluster.local A",
                    next() % 10,
                    i % namespaces
                )
            }
            13 | 14 => format!("_http._tcp.svc-{i}.{ns}.svc.cluster.local SRV"),
            15 => format!("{}.{ns}.pod.cluster.local A", ip(i, 3).replace('.', "-")),
            _ => format!("missing-{i}.{ns}.svc.cluster.local A"),
        };
        writeln!(f, "{line}").unwrap();
    }
    drop(f);

    let responder = Arc::new(Responder {
        index: Arc::new(RwLock::new(index)),
        forwarder: Arc::new(Forwarder::new(vec![], Duration::from_secs(2), 10_000)),
        metrics: Arc::new(Metrics::default()),
    });
    let addr: SocketAddr = "127.0.0.1:0".parse().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    let r = responder.clone();
    // One core: a single-threaded runtime on its own thread.
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async move {
            let sock = tokio::net::UdpSocket::bind(addr).await.unwrap();
            tx.send(sock.local_addr().unwrap()).unwrap();
            server::serve_udp(r, Arc::new(sock), 1).await;
        });
    });
    let bound = rx.recv().unwrap();
    let dnsperf = |verbose: bool| {
        let mut c = std::process::Command::new("dnsperf");
        c.args(["-s", "127.0.0.1", "-p", &bound.port().to_string(), "-d"])
            .arg(&queries)
            .args([
                "-l",
                &seconds.to_string(),
                "-c",
                &clients.to_string(),
                "-q",
                "200",
            ]);
        if verbose {
            c.arg("-v");
        }
        let out = c.output().expect("dnsperf (apt-get install dnsperf)");
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    // Throughput without dnsperf's per-query printing in the way.
    let plain = dnsperf(false);
    for l in plain.lines().filter(|l| {
        l.contains("Queries per second")
            || l.contains("Queries completed")
            || l.contains("Queries lost")
            || l.contains("Average Latency")
            || l.contains("Response codes")
    }) {
        println!("{}", l.trim());
    }
    // Latency percentiles from a second run's per-query report.
    let verbose = dnsperf(true);
    let mut lat: Vec<f64> = verbose
        .lines()
        .filter(|l| l.starts_with("> "))
        .filter_map(|l| l.split_whitespace().last()?.parse().ok())
        .collect();
    lat.sort_by(|a, b| a.partial_cmp(b).unwrap());
    let pct = |p: f64| -> f64 {
        if lat.is_empty() {
            return f64::NAN;
        }
        lat[((lat.len() as f64 - 1.0) * p) as usize] * 1000.0
    };
    if let Some(l) = verbose.lines().find(|l| l.contains("Queries per second")) {
        println!("(verbose run) {}", l.trim());
    }
    println!(
        "latency ms: p50 {:.3}  p90 {:.3}  p99 {:.3}  max {:.3}  ({} queries)",
        pct(0.50),
        pct(0.90),
        pct(0.99),
        pct(1.0),
        lat.len()
    );
    println!(
        "memory: process RSS {:.1} MiB after the run (index alone {:.1} MiB)",
        rss_kib() as f64 / 1024.0,
        after.saturating_sub(before) as f64 / 1024.0
    );
}
