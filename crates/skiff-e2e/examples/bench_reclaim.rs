//! B11: reclaimed capacity on one real node (`skiff up` over its own
//! containerd). A latency-sensitive prod service — busybox httpd whose
//! CGI handler spins a few milliseconds per request, under a steady
//! open-loop load from this process — requests about four times the cpu
//! it uses; a stream of CPU-bound Jobs of fixed work is fed beside it.
//! Three modes, each on a fresh cluster, alternated over `--rounds`:
//!
//! - `alone`: the prod service and its load, no batch work;
//! - `baseline`: batch Jobs requesting plain `cpu` (what Kubernetes
//!   offers: they fit only in what prod has not reserved);
//! - `reclaim`: the same Jobs requesting `skiff.io/batch-cpu` instead, so
//!   they run in what prod reserved but does not use.
//!
//! Per run: the node's cpu utilization (all of /proc/stat's busy time over
//! the window, skiff and the load generator included, as both modes pay
//! them alike), batch Jobs completed per minute, the prod service's p50 and
//! p99 latency (from each request's scheduled start, so a stall is not
//! hidden by the generator waiting), prod restarts, OOM kills and
//! evictions.
//!
//! ```sh
//! cargo run -p skiff-e2e --example bench_reclaim -- --seconds 120 --rounds 2
//! ```
//! Flags: `--seconds N` (measured window, default 120), `--rounds N`
//! (default 1), `--rate R` (prod requests per second, default 40),
//! `--modes alone,baseline,reclaim`, `--threshold F` (the agent's
//! `--batch-cpu-threshold`, default 0.9), `--work N` (loop iterations of
//! one batch Job, default 400000).

use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use skiff_e2e::{text, wait_until, Server, BUSYBOX};

struct Args {
    seconds: u64,
    rounds: usize,
    rate: f64,
    modes: Vec<String>,
    threshold: f64,
    work: u64,
}

fn args() -> Args {
    let mut a = Args {
        seconds: 120,
        rounds: 1,
        rate: 40.0,
        modes: vec!["alone".into(), "baseline".into(), "reclaim".into()],
        threshold: 0.9,
        work: 400_000,
    };
    let argv: Vec<String> = std::env::args().skip(1).collect();
    let mut i = 0;
    while i < argv.len() {
        let v = argv.get(i + 1).cloned().unwrap_or_default();
        match argv[i].as_str() {
            "--seconds" => a.seconds = v.parse().expect("--seconds N"),
            "--rounds" => a.rounds = v.parse().expect("--rounds N"),
            "--rate" => a.rate = v.parse().expect("--rate R"),
            "--modes" => a.modes = v.split(',').map(str::to_string).collect(),
            "--threshold" => a.threshold = v.parse().expect("--threshold F"),
            "--work" => a.work = v.parse().expect("--work N"),
            other => panic!("unknown flag {other}"),
        }
        i += 2;
    }
    a
}

/// Busy and total jiffies of the whole machine.
fn cpu_times() -> (u64, u64) {
    let stat = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    let line = stat.lines().next().unwrap_or("");
    let v: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .filter_map(|x| x.parse().ok())
        .collect();
    let total: u64 = v.iter().take(8).sum();
    let idle = v.get(3).copied().unwrap_or(0) + v.get(4).copied().unwrap_or(0);
    (total - idle, total)
}

fn cpus() -> f64 {
    std::thread::available_parallelism()
        .map(|n| n.get() as f64)
        .unwrap_or(1.0)
}

/// One HTTP/1.0 GET; Ok(()) when the answer is a 200.
fn get(ip: &str, path: &str) -> std::io::Result<()> {
    let mut s = TcpStream::connect((ip, 8080))?;
    s.set_read_timeout(Some(Duration::from_secs(10)))?;
    write!(s, "GET {path} HTTP/1.0\r\nHost: prod\r\n\r\n")?;
    let mut out = Vec::new();
    s.read_to_end(&mut out)?;
    if out.starts_with(b"HTTP/1.0 200") || out.starts_with(b"HTTP/1.1 200") {
        Ok(())
    } else {
        Err(std::io::Error::other(
            String::from_utf8_lossy(&out[..out.len().min(80)]).to_string(),
        ))
    }
}

/// An open-loop load of `rate` requests a second for `window`, over
/// `threads` threads; latencies in ms from each request's scheduled start,
/// and the number of failed requests.
fn load(ip: &str, rate: f64, window: Duration, threads: usize) -> (Vec<f64>, usize) {
    let start = Instant::now() + Duration::from_millis(100);
    let total = (rate * window.as_secs_f64()) as usize;
    let lat = Arc::new(Mutex::new(Vec::with_capacity(total)));
    let failed = Arc::new(Mutex::new(0usize));
    let handles: Vec<_> = (0..threads)
        .map(|t| {
            let (ip, lat, failed) = (ip.to_string(), lat.clone(), failed.clone());
            std::thread::spawn(move || {
                let mut k = t;
                while k < total {
                    let due = start + Duration::from_secs_f64(k as f64 / rate);
                    if let Some(d) = due.checked_duration_since(Instant::now()) {
                        std::thread::sleep(d);
                    }
                    match get(&ip, "/cgi-bin/work") {
                        Ok(()) => lat.lock().unwrap().push(due.elapsed().as_secs_f64() * 1e3),
                        Err(_) => *failed.lock().unwrap() += 1,
                    }
                    k += threads;
                }
            })
        })
        .collect();
    for h in handles {
        let _ = h.join();
    }
    let mut l = std::mem::take(&mut *lat.lock().unwrap());
    l.sort_by(|a, b| a.total_cmp(b));
    let failed = *failed.lock().unwrap();
    (l, failed)
}

fn quantile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    sorted[((sorted.len() - 1) as f64 * q).round() as usize]
}

/// The prod Deployment: httpd with a CGI handler that spins `spin`
/// iterations of the shell per request; it requests `request_milli`.
fn prod_manifest(request_milli: u64, spin: u64) -> String {
    let script = format!(
        "mkdir -p /www/cgi-bin && printf '#!/bin/sh\\ni=0; while [ $i -lt {spin} ]; do i=$((i+1)); done\\nprintf \"Content-Type: text/plain\\\\r\\\\n\\\\r\\\\nok\\\\n\"\\n' > /www/cgi-bin/work && chmod +x /www/cgi-bin/work && exec httpd -f -p 8080 -h /www"
    );
    serde_json::json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "prod"},
        "spec": {"replicas": 1, "selector": {"matchLabels": {"app": "prod"}},
            "template": {"metadata": {"labels": {"app": "prod"}},
                "spec": {"terminationGracePeriodSeconds": 1, "containers": [{
                    "name": "web", "image": BUSYBOX, "imagePullPolicy": "IfNotPresent",
                    "command": ["sh", "-c", script],
                    "resources": {"requests": {"cpu": format!("{request_milli}m"), "memory": "64Mi"}}
                }]}}}
    })
    .to_string()
}

/// `n` batch Jobs of `work` iterations each, requesting 250 millicores of
/// `resource` (`cpu`, or `skiff.io/batch-cpu` with its equal limit).
fn jobs_manifest(first: usize, n: usize, resource: &str, work: u64) -> String {
    let resources = if resource == "cpu" {
        serde_json::json!({"requests": {"cpu": "250m", "memory": "16Mi"},
            "limits": {"cpu": "250m", "memory": "16Mi"}})
    } else {
        serde_json::json!({"requests": {"skiff.io/batch-cpu": "250", "skiff.io/batch-memory": "16777216"},
            "limits": {"skiff.io/batch-cpu": "250", "skiff.io/batch-memory": "16777216"}})
    };
    let items: Vec<_> = (first..first + n)
        .map(|i| {
            serde_json::json!({
                "apiVersion": "batch/v1", "kind": "Job",
                "metadata": {"name": format!("batch-{i}"), "labels": {"b11": "batch"}},
                "spec": {"backoffLimit": 6, "template": {"metadata": {"labels": {"b11": "batch"}},
                    "spec": {"restartPolicy": "Never", "terminationGracePeriodSeconds": 0,
                        "containers": [{"name": "work", "image": BUSYBOX,
                            "imagePullPolicy": "IfNotPresent",
                            "command": ["sh", "-c", format!("i=0; while [ $i -lt {work} ]; do i=$((i+1)); done")],
                            "resources": resources}]}}}
            })
        })
        .collect();
    serde_json::json!({"apiVersion": "v1", "kind": "List", "items": items}).to_string()
}

struct Run {
    mode: String,
    utilization: f64,
    batch_per_min: f64,
    p50: f64,
    p99: f64,
    failed: usize,
    prod_usage_milli: String,
    batch_cpu: String,
    prod_incidents: String,
}

fn jsonpath(s: &Server, args: &[&str]) -> String {
    text(&s.kubectl(args).stdout).trim().to_string()
}

fn run(mode: &str, a: &Args) -> Run {
    let threshold = a.threshold.to_string();
    let s = Server::up_with(&[
        "--reservation-decay-seconds",
        "30",
        "--batch-cpu-threshold",
        &threshold,
    ]);
    let alloc_milli = (jsonpath(
        &s,
        &[
            "get",
            "nodes",
            "-o",
            "jsonpath={.items[0].status.allocatable.cpu}",
        ],
    )
    .parse::<f64>()
    .unwrap_or(cpus())
        * 1000.0) as u64;
    // Prod reserves 80% of the node and, at the default rate, uses about
    // a quarter of it.
    let request = alloc_milli * 8 / 10;
    s.ok_stdin(&["apply", "-f", "-"], &prod_manifest(request, 1500));
    let ip = wait_until("the prod pod Running with an IP", 120, || {
        let out = jsonpath(
            &s,
            &[
                "get",
                "pods",
                "-l",
                "app=prod",
                "-o",
                "jsonpath={.items[0].status.phase} {.items[0].status.podIP}",
            ],
        );
        let (phase, ip) = out.split_once(' ')?;
        (phase == "Running" && !ip.is_empty()).then(|| ip.to_string())
    });
    wait_until("prod answers", 60, || get(&ip, "/cgi-bin/work").ok());
    // Warm-up under load, long enough for the reservation to decay.
    let warm = if mode == "reclaim" { 45 } else { 10 };
    let _ = load(&ip, a.rate, Duration::from_secs(warm), 8);
    let resource = match mode {
        "baseline" => Some("cpu"),
        "reclaim" => Some("skiff.io/batch-cpu"),
        _ => None,
    };
    let batch_cpu_at_start = jsonpath(
        &s,
        &[
            "get",
            "nodes",
            "-o",
            "jsonpath={.items[0].status.allocatable.skiff\\.io/batch-cpu}",
        ],
    );
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let feeder = resource.map(|resource| {
        let (stop, kubeconfig, work) = (stop.clone(), s.kubeconfig.clone(), a.work);
        let resource = resource.to_string();
        std::thread::spawn(move || {
            let kubectl = |args: &[&str], stdin: Option<String>| {
                let mut c = std::process::Command::new(skiff_e2e::kubectl_binary());
                c.arg("--kubeconfig").arg(&kubeconfig).args(args);
                if let Some(input) = stdin {
                    c.stdin(std::process::Stdio::piped())
                        .stdout(std::process::Stdio::piped());
                    let mut child = c.spawn().expect("kubectl");
                    let _ = child.stdin.take().unwrap().write_all(input.as_bytes());
                    let _ = child.wait_with_output();
                    String::new()
                } else {
                    text(&c.output().expect("kubectl").stdout)
                }
            };
            let mut next = 0;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                // Keep eight Jobs unfinished: more than can run at once in
                // either mode, so the node is never starved of batch work.
                let states = kubectl(
                    &["get", "jobs", "-l", "b11=batch", "-o", "jsonpath={range .items[*]}{.status.succeeded}{.status.failed}{\"\\n\"}{end}"],
                    None,
                );
                let unfinished = states.lines().filter(|l| l.trim().is_empty()).count();
                if unfinished < 8 {
                    let n = 8 - unfinished;
                    kubectl(&["create", "-f", "-"], Some(jobs_manifest(next, n, &resource, work)));
                    next += n;
                }
                std::thread::sleep(Duration::from_secs(3));
            }
        })
    });
    let window = Duration::from_secs(a.seconds);
    let before = cpu_times();
    let t0 = utc_now();
    // The prod pod's cpu as `kubectl top` has it halfway through the
    // window (after it, the load has stopped and it reads 0).
    let top = {
        let s = &s;
        std::thread::scope(|scope| {
            let sampler = scope.spawn(move || {
                std::thread::sleep(window / 2);
                prod_cpu_usage(s)
            });
            let r = load(&ip, a.rate, window, 8);
            (r, sampler.join().unwrap_or_else(|_| "?".into()))
        })
    };
    let ((lat, failed), prod_usage_milli) = top;
    let after = cpu_times();
    let t1 = utc_now();
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    if let Some(f) = feeder {
        let _ = f.join();
    }
    let utilization = (after.0 - before.0) as f64 / (after.1 - before.1).max(1) as f64;
    // Jobs that completed inside the window.
    let done = jsonpath(
        &s,
        &[
            "get",
            "jobs",
            "-l",
            "b11=batch",
            "-o",
            "jsonpath={range .items[*]}{.status.completionTime}{\"\\n\"}{end}",
        ],
    );
    let completed = done
        .lines()
        .filter(|t| !t.is_empty() && *t >= t0.as_str() && *t <= t1.as_str())
        .count();
    let prod_incidents = jsonpath(
        &s,
        &["get", "pods", "-l", "app=prod", "-o", "jsonpath={range .items[*]}restarts={.status.containerStatuses[0].restartCount} last={.status.containerStatuses[0].lastState.terminated.reason} phase={.status.phase} reason={.status.reason};{end}"],
    );
    Run {
        mode: mode.to_string(),
        utilization,
        batch_per_min: completed as f64 * 60.0 / window.as_secs_f64(),
        p50: quantile(&lat, 0.5),
        p99: quantile(&lat, 0.99),
        failed,
        prod_usage_milli,
        batch_cpu: batch_cpu_at_start,
        prod_incidents,
    }
}

/// Now as RFC 3339 seconds in UTC, as completionTime is written (the
/// server runs on this machine, on this clock).
fn utc_now() -> String {
    let out = std::process::Command::new("date")
        .args(["-u", "+%Y-%m-%dT%H:%M:%SZ"])
        .output()
        .expect("date");
    text(&out.stdout).trim().to_string()
}

/// The prod pod's cpu use as the metrics API reports it (`kubectl top`).
fn prod_cpu_usage(s: &Server) -> String {
    let out = s.kubectl(&["top", "pod", "-l", "app=prod", "--no-headers"]);
    text(&out.stdout)
        .split_whitespace()
        .nth(1)
        .unwrap_or("?")
        .to_string()
}

fn main() {
    let a = args();
    println!(
        "B11: {} s windows, {} prod requests/s, batch threshold {}, {} cpus",
        a.seconds,
        a.rate,
        a.threshold,
        cpus()
    );
    println!("| round | mode | node cpu % | batch jobs/min | prod p50 ms | prod p99 ms | failed | prod cpu | batch-cpu at start | prod pod |");
    println!("|---|---|---:|---:|---:|---:|---:|---:|---:|---|");
    for round in 1..=a.rounds {
        for mode in &a.modes {
            let r = run(mode, &a);
            println!(
                "| {round} | {} | {:.1} | {:.1} | {:.1} | {:.1} | {} | {} | {} | {} |",
                r.mode,
                r.utilization * 100.0,
                r.batch_per_min,
                r.p50,
                r.p99,
                r.failed,
                r.prod_usage_milli,
                if r.batch_cpu.is_empty() {
                    "-"
                } else {
                    &r.batch_cpu
                },
                r.prod_incidents
            );
        }
    }
}
