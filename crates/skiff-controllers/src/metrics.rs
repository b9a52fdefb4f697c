//! Per-controller metrics in Prometheus' text exposition format:
//! reconciles, errors, a duration histogram, queue depth, and events
//! written or dropped.

use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

/// Upper bounds (seconds) of the reconcile duration histogram.
const BUCKETS: [f64; 12] = [
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0,
];

#[derive(Default, Clone)]
struct Counters {
    reconciles: u64,
    errors: u64,
    seconds: f64,
    buckets: [u64; BUCKETS.len()],
    queue: usize,
    events: u64,
    events_dropped: u64,
}

fn table() -> &'static Mutex<BTreeMap<String, Counters>> {
    static T: OnceLock<Mutex<BTreeMap<String, Counters>>> = OnceLock::new();
    T.get_or_init(Default::default)
}

fn with(controller: &str, f: impl FnOnce(&mut Counters)) {
    let mut t = table().lock().unwrap_or_else(|e| e.into_inner());
    if let Some(c) = t.get_mut(controller) {
        f(c);
    } else {
        let mut c = Counters::default();
        f(&mut c);
        t.insert(controller.to_string(), c);
    }
}

pub fn reconciled(controller: &str, ok: bool, took: Duration) {
    let s = took.as_secs_f64();
    with(controller, |c| {
        c.reconciles += 1;
        if !ok {
            c.errors += 1;
        }
        c.seconds += s;
        for (i, b) in BUCKETS.iter().enumerate() {
            if s <= *b {
                c.buckets[i] += 1;
            }
        }
    });
}

pub fn queue_depth(controller: &str, depth: usize) {
    with(controller, |c| c.queue = depth);
}

pub fn event(controller: &str, dropped: bool) {
    with(controller, |c| {
        if dropped {
            c.events_dropped += 1
        } else {
            c.events += 1
        }
    });
}

/// Reconciles counted so far for `controller` (tests, benchmarks).
pub fn reconciles(controller: &str) -> u64 {
    table()
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .get(controller)
        .map(|c| c.reconciles)
        .unwrap_or(0)
}

/// Everything, in Prometheus' text format.
pub fn text() -> String {
    let t = table().lock().unwrap_or_else(|e| e.into_inner()).clone();
    let mut out = String::new();
    // Controllers (queues, sweeps) and event sources (components) share
    // the table; each family shows the rows it is about.
    let is_controller = |c: &Counters| c.reconciles > 0 || c.queue > 0;
    let is_source = |c: &Counters| c.events > 0 || c.events_dropped > 0;
    let mut family = |name: &str,
                      help: &str,
                      kind: &str,
                      label: &str,
                      rows: &dyn Fn(&Counters) -> bool,
                      v: &dyn Fn(&Counters) -> String| {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
        for (k, c) in t.iter().filter(|(_, c)| rows(c)) {
            let _ = writeln!(out, "{name}{{{label}=\"{k}\"}} {}", v(c));
        }
    };
    family(
        "skiff_controller_reconciles_total",
        "Reconciles run, per controller.",
        "counter",
        "controller",
        &is_controller,
        &|c| c.reconciles.to_string(),
    );
    family(
        "skiff_controller_reconcile_errors_total",
        "Reconciles that failed (retried with back-off).",
        "counter",
        "controller",
        &is_controller,
        &|c| c.errors.to_string(),
    );
    family(
        "skiff_controller_queue_depth",
        "Keys waiting in the controller's work queue.",
        "gauge",
        "controller",
        &is_controller,
        &|c| c.queue.to_string(),
    );
    family(
        "skiff_controller_events_total",
        "Events recorded, per reporting component.",
        "counter",
        "component",
        &is_source,
        &|c| c.events.to_string(),
    );
    family(
        "skiff_controller_events_dropped_total",
        "Events dropped because the recorder was saturated.",
        "counter",
        "component",
        &is_source,
        &|c| c.events_dropped.to_string(),
    );
    let name = "skiff_controller_reconcile_duration_seconds";
    let _ = writeln!(
        out,
        "# HELP {name} Time spent in one reconcile.\n# TYPE {name} histogram"
    );
    for (k, c) in t.iter().filter(|(_, c)| c.reconciles > 0) {
        for (i, b) in BUCKETS.iter().enumerate() {
            let _ = writeln!(
                out,
                "{name}_bucket{{controller=\"{k}\",le=\"{b}\"}} {}",
                c.buckets[i]
            );
        }
        let _ = writeln!(
            out,
            "{name}_bucket{{controller=\"{k}\",le=\"+Inf\"}} {}",
            c.reconciles
        );
        let _ = writeln!(out, "{name}_sum{{controller=\"{k}\"}} {:.6}", c.seconds);
        let _ = writeln!(out, "{name}_count{{controller=\"{k}\"}} {}", c.reconciles);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_text_format_has_counters_gauges_and_a_cumulative_histogram() {
        reconciled("metrics-test", true, Duration::from_millis(3));
        reconciled("metrics-test", false, Duration::from_millis(30));
        queue_depth("metrics-test", 7);
        let t = text();
        assert!(t.contains("skiff_controller_reconciles_total{controller=\"metrics-test\"} 2"));
        assert!(
            t.contains("skiff_controller_reconcile_errors_total{controller=\"metrics-test\"} 1")
        );
        assert!(t.contains("skiff_controller_queue_depth{controller=\"metrics-test\"} 7"));
        assert!(t.contains(
            "skiff_controller_reconcile_duration_seconds_bucket{controller=\"metrics-test\",le=\"0.005\"} 1"
        ));
        assert!(t.contains(
            "skiff_controller_reconcile_duration_seconds_bucket{controller=\"metrics-test\",le=\"0.05\"} 2"
        ));
        assert!(t.contains("# TYPE skiff_controller_reconcile_duration_seconds histogram"));
    }
}
