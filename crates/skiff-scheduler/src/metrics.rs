//! Counters the benchmark (and logs) read: where scheduling time goes.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Duration;

#[derive(Debug, Default)]
pub struct Metrics {
    /// Pods bound successfully.
    pub scheduled: AtomicU64,
    /// Scheduling attempts that found no node.
    pub unschedulable: AtomicU64,
    /// Time in the scheduling algorithm (pre-filter … reserve), ns.
    pub algorithm_ns: AtomicU64,
    /// Attempts through the algorithm.
    pub attempts: AtomicU64,
    /// Summed latency of binding requests, ns (they overlap).
    pub bind_ns: AtomicU64,
    pub binds: AtomicU64,
    pub bind_errors: AtomicU64,
    /// Bindings the API server refused because the node's committed state
    /// had no room (Omega's conflicts; each is retried). Also counted in
    /// `bind_errors`.
    pub bind_conflicts: AtomicU64,
    /// Time handling watch events in the scheduling loop, ns.
    pub events_ns: AtomicU64,
    pub watch_events: AtomicU64,
    /// Event objects written / dropped because the recorder was backed up.
    pub events_written: AtomicU64,
    pub events_dropped: AtomicU64,
    /// Most binds in flight at once.
    pub max_binds_in_flight: AtomicU64,
}

impl Metrics {
    pub fn add_bind(&self, d: Duration) {
        self.bind_ns.fetch_add(d.as_nanos() as u64, Relaxed);
        self.binds.fetch_add(1, Relaxed);
    }
    pub fn add_algorithm(&self, d: Duration) {
        self.algorithm_ns.fetch_add(d.as_nanos() as u64, Relaxed);
        self.attempts.fetch_add(1, Relaxed);
    }
    pub fn get(v: &AtomicU64) -> u64 {
        v.load(Relaxed)
    }
}
