//! Decoding the scheduler's pod watch events: B1's pod as the in-process API
//! server sends it (its ADDED and, after binding, MODIFIED line, in
//! `testdata/pod-watch-events.jsonl`), decoded N times each as kube's
//! `WatchEvent<Pod>` (`pod`) or as the scheduler's `WatchEvent<LeanPod>`
//! (`lean`), optionally followed by `PodInfo::new` as in `pod_apply`
//! (`pod+info`, `lean+info`).
//!
//! The machine's clock is shared, so count instructions:
//!
//! ```text
//! cargo build --release -p skiff-scheduler --example bench_decode
//! valgrind --tool=callgrind --callgrind-out-file=/tmp/cg.out \
//!     $CARGO_TARGET_DIR/release/examples/bench_decode lean+info 1000
//! callgrind_annotate --inclusive=yes /tmp/cg.out | grep bench_decode::
//! ```
//!
//! and divide a function's inclusive count by the events it saw (2 N), or
//! the difference of the totals of N and 0 events by 2 N (decoding and
//! dropping, as the scheduler does).

/// The allocator the `skiff` binary uses, so the benchmark measures it.
#[global_allocator]
static ALLOC: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

use std::hint::black_box;
use std::time::Instant;

use k8s_openapi::api::core::v1::Pod;
use kube::core::WatchEvent;
use skiff_scheduler::lean_pod::LeanPod;
use skiff_scheduler::types::PodInfo;

const EVENTS: &str = include_str!("../testdata/pod-watch-events.jsonl");

fn object<K>(ev: WatchEvent<K>) -> K {
    match ev {
        WatchEvent::Added(p) | WatchEvent::Modified(p) => p,
        _ => unreachable!("the fixture holds ADDED and MODIFIED events"),
    }
}

#[inline(never)]
fn decode_pod(line: &str) -> Pod {
    object(serde_json::from_str::<WatchEvent<Pod>>(line).unwrap())
}

#[inline(never)]
fn decode_lean(line: &str) -> Pod {
    object(serde_json::from_str::<WatchEvent<LeanPod>>(line).unwrap()).0
}

#[inline(never)]
fn pod_info(pod: Pod) -> PodInfo {
    PodInfo::new(pod, 0)
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let usage = "usage: bench_decode pod|lean|pod+info|lean+info [N]";
    let mode = args.first().expect(usage).as_str();
    let n: usize = args.get(1).map_or(1000, |a| a.parse().expect(usage));
    let lines: Vec<&str> = EVENTS.lines().collect();
    let t = Instant::now();
    for _ in 0..n {
        for line in &lines {
            match mode {
                "pod" => drop(black_box(decode_pod(line))),
                "lean" => drop(black_box(decode_lean(line))),
                "pod+info" => drop(black_box(pod_info(decode_pod(line)))),
                "lean+info" => drop(black_box(pod_info(decode_lean(line)))),
                _ => panic!("{usage}"),
            }
        }
    }
    let events = n * lines.len();
    println!(
        "{mode}: {events} events, {:.2} µs per event",
        t.elapsed().as_secs_f64() * 1e6 / events as f64
    );
}
