//! The scheduling algorithm alone (no API): 5,000 nodes, pods placed one
//! after another through the default profile, as in B1.
//!
//! `cargo run --release -p skiff-scheduler --example bench_algorithm`

use std::sync::Arc;
use std::time::Instant;

use rand::SeedableRng;
use skiff_scheduler::cache::Cache;
use skiff_scheduler::config::Config;
use skiff_scheduler::framework::CycleState;
use skiff_scheduler::plugins::FactoryContext;
use skiff_scheduler::scheduler::{find_node, ScheduleOutcome};
use skiff_scheduler::testing::{NodeBuilder, PodBuilder};
use skiff_scheduler::types::PodInfo;

fn main() {
    let ctx = FactoryContext {
        client: None,
        metrics: Arc::new(Default::default()),
    };
    let fw = Config::default().build(&ctx).unwrap().remove(0);
    let mut cache = Cache::new();
    for i in 0..5000 {
        cache.upsert_node(NodeBuilder::new(&format!("node-{i}")).build());
    }
    let mut rng = rand::rngs::SmallRng::seed_from_u64(1);
    let mut next = 0;
    let n = 11_000;
    let t = Instant::now();
    for i in 0..n {
        let pod = PodBuilder::new(&format!("p{i}"))
            .container_port(80)
            .request_and_limit("cpu", "100m")
            .request_and_limit("memory", "500Mi")
            .build();
        let info = Arc::new(PodInfo::new(pod, 0));
        let mut state = CycleState::default();
        match find_node(&fw, &mut state, &info, &cache, &mut next, &mut rng) {
            ScheduleOutcome::Fit(node) => cache.assume(info, &node),
            _ => panic!("pod {i} did not fit"),
        }
    }
    let e = t.elapsed();
    println!(
        "{n} pods on 5000 nodes: {:.1} µs per pod ({:.0} pods/s on one core)",
        e.as_secs_f64() * 1e6 / n as f64,
        n as f64 / e.as_secs_f64()
    );
}
