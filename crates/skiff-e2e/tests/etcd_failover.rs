//! Losing an etcd member: two `skiff server`s on a three-member etcd
//! cluster (Debian's etcd 3.4, started by the test on loopback), each
//! member in turn — the first listed, the leader, a follower — killed with
//! SIGKILL and restarted while a client library keeps creating ConfigMaps
//! through one server. Every write succeeds or fails with an error a client
//! retries (503/504/429), only a few fail, and writes resume within seconds;
//! a server started while a member is down becomes ready and serves.
//!
//! The numbers (failed writes and the longest time without a successful
//! write, per kill) are printed for BENCHMARKS.md.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, ObjectMeta, PostParams};
use skiff_e2e::{wait_until, Server};
use skiff_store::testsuite::EtcdCluster;

const NO_LOOPS: [&str; 2] = ["--disable-scheduler", "--disable-controllers"];

/// One create: when it started and ended, and its error (HTTP code and
/// reason) if it failed.
struct Write {
    start: Instant,
    end: Instant,
    error: Option<(u16, String)>,
}

/// A client for `s` that sends each request once (kube-rs retries 429, 503
/// and 504 by default; the test counts them instead).
async fn client(s: &Server) -> kube::Client {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let kc = kube::config::Kubeconfig::read_from(&s.kubeconfig).expect("the admin kubeconfig");
    let mut cfg = kube::Config::from_custom_kubeconfig(kc, &Default::default())
        .await
        .expect("a client config");
    cfg.default_retry = false;
    cfg.read_timeout = Some(Duration::from_secs(30));
    kube::Client::try_from(cfg).expect("a client")
}

/// Creates ConfigMaps one after another until `stop`, recording each.
async fn writer(api: Api<ConfigMap>, log: Arc<Mutex<Vec<Write>>>, stop: Arc<AtomicBool>) {
    let mut i = 0u64;
    while !stop.load(Ordering::Relaxed) {
        i += 1;
        let cm = ConfigMap {
            metadata: ObjectMeta {
                name: Some(format!("w-{i}")),
                ..Default::default()
            },
            data: Some([("i".to_string(), i.to_string())].into()),
            ..Default::default()
        };
        let start = Instant::now();
        let r = tokio::time::timeout(
            Duration::from_secs(40),
            api.create(&PostParams::default(), &cm),
        )
        .await;
        let error = match r {
            Ok(Ok(_)) => None,
            Ok(Err(kube::Error::Api(s))) => Some((s.code, format!("{} {}", s.reason, s.message))),
            Ok(Err(e)) => Some((0, e.to_string())),
            Err(_) => Some((0, "no answer within 40s".into())),
        };
        let failed = error.is_some();
        log.lock().unwrap().push(Write {
            start,
            end: Instant::now(),
            error,
        });
        if failed {
            // A client backs off a little before its next try.
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

/// What one member's loss cost the writer.
struct Phase {
    what: String,
    writes: usize,
    failed: usize,
    longest_gap: Duration,
    errors: Vec<(u16, String)>,
}

/// The writes that started at or after `from` and before `to`: how many
/// failed, and the longest time from `from` (or a success) to the next
/// success.
fn measure(log: &[Write], what: String, from: Instant, to: Instant) -> Phase {
    let window: Vec<&Write> = log
        .iter()
        .filter(|w| w.start >= from && w.start < to)
        .collect();
    let mut last_ok = from;
    let mut gap = Duration::ZERO;
    for w in &window {
        if w.error.is_none() {
            gap = gap.max(w.end.duration_since(last_ok));
            last_ok = w.end;
        }
    }
    Phase {
        what,
        writes: window.len(),
        failed: window.iter().filter(|w| w.error.is_some()).count(),
        longest_gap: gap,
        errors: window.iter().filter_map(|w| w.error.clone()).collect(),
    }
}

fn successes_since(log: &Arc<Mutex<Vec<Write>>>, from: Instant) -> usize {
    log.lock()
        .unwrap()
        .iter()
        .filter(|w| w.start >= from && w.error.is_none())
        .count()
}

#[test]
fn writes_continue_while_each_etcd_member_is_killed_in_turn() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let mut cluster = rt.block_on(EtcdCluster::start(3));
    let servers = cluster.endpoints().join(",");
    let mut flags = vec!["--etcd-servers", servers.as_str()];
    flags.extend_from_slice(&NO_LOOPS);
    let a = Server::start_with(&flags);
    let mut b = Server::start_with_pki_of(&a, &flags);

    let api: Api<ConfigMap> = Api::namespaced(rt.block_on(client(&a)), "default");
    let log = Arc::new(Mutex::new(Vec::new()));
    let stop = Arc::new(AtomicBool::new(false));
    let started = Instant::now();
    let w = rt.spawn(writer(api, log.clone(), stop.clone()));
    wait_until("the first writes", 60, || {
        (successes_since(&log, started) >= 10).then_some(())
    });

    let mut phases = Vec::new();
    for round in 0..3 {
        let leader = rt
            .block_on(cluster.leader())
            .expect("the members agree on a leader");
        let (victim, what) = match round {
            0 => (0, "the first listed"),
            1 => (leader, "the leader"),
            _ => ((0..3).rev().find(|i| *i != leader).unwrap(), "a follower"),
        };
        let what = format!(
            "{what} (member {victim}{})",
            if victim == leader { ", the leader" } else { "" }
        );
        let killed = Instant::now();
        cluster.kill(victim);
        if round == 0 {
            // A server started while a member is down becomes ready and
            // serves (through another member).
            b.kill9();
            b.start_again();
            b.ok(&["create", "configmap", "made-while-a-member-was-down"]);
            let got = a.ok(&[
                "get",
                "configmap",
                "made-while-a-member-was-down",
                "-o",
                "name",
            ]);
            assert_eq!(got.trim(), "configmap/made-while-a-member-was-down");
        }
        wait_until(&format!("30 writes after killing {what}"), 120, || {
            (successes_since(&log, killed) >= 30).then_some(())
        });
        rt.block_on(cluster.restart(victim));
        let back = Instant::now();
        wait_until(&format!("10 writes after restarting {what}"), 120, || {
            (successes_since(&log, back) >= 10).then_some(())
        });
        phases.push(measure(&log.lock().unwrap(), what, killed, Instant::now()));
    }
    stop.store(true, Ordering::Relaxed);
    rt.block_on(w).unwrap();

    let log = log.lock().unwrap();
    eprintln!(
        "{} writes through one server in {:.1}s",
        log.len(),
        started.elapsed().as_secs_f64()
    );
    for p in &phases {
        eprintln!(
            "killed {}: {} writes, {} failed, longest gap {} ms; errors {:?}",
            p.what,
            p.writes,
            p.failed,
            p.longest_gap.as_millis(),
            p.errors
        );
    }
    // Every failure is one a client retries.
    for w in log.iter() {
        if let Some((code, why)) = &w.error {
            assert!(
                matches!(code, 429 | 503 | 504),
                "a write failed with {code} {why}: not an error a client retries"
            );
        }
    }
    for p in &phases {
        // At most the writes caught by the loss itself and an election.
        assert!(
            p.failed <= 3,
            "killing {}: {} of {} writes failed: {:?}",
            p.what,
            p.failed,
            p.writes,
            p.errors
        );
        assert!(
            p.longest_gap < Duration::from_secs(15),
            "killing {}: no write succeeded for {:?}",
            p.what,
            p.longest_gap
        );
    }
    // Both servers see every write that succeeded.
    let ok = log.iter().filter(|w| w.error.is_none()).count();
    let names = b.ok(&["get", "configmaps", "-o", "name"]);
    let made = names
        .lines()
        .filter(|l| l.starts_with("configmap/w-"))
        .count();
    assert!(
        made >= ok,
        "{made} ConfigMaps listed, {ok} writes succeeded"
    );
}
