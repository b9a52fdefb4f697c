//! A log of slow requests and where their time went, for finding what a
//! write waits on under load (issue 16, B6's churn). Off unless
//! `SKIFF_SLOW_MS` is set: then every request that takes at least that
//! many milliseconds inside the server is written, one line each, to
//! `SKIFF_SLOW_LOG` (a file, appended to; standard error without it):
//!
//! ```text
//! slow PATCH /api/v1/namespaces/default/configmaps/x 212.4ms admitted+0.0 store[queued 180.1 apply 3.2 fsync 9.9 resumed+0.3 n=512 @+12.0] end+6.1
//! ```
//!
//! - `admitted+`: from the handler's start to a seat of its priority
//!   level (flow control's queueing);
//! - per store write (embedded store): when it was handed to the commit
//!   thread (`@+`, from the handler's start), how long it waited for its
//!   batch to start (`queued`: the batches before it), its batch's work
//!   (`apply`) and redb's commit (`fsync`), the batch's size, and how long
//!   the runtime took to resume the writer once the reply was sent;
//! - `end+`: from the last write's resumption to the handler's end.
//!
//! It also starts a task that sleeps 10 ms at a time and writes `lag`
//! lines when it wakes late by ≥ 10 ms (the tokio workers were all busy:
//! CPU starvation of the server), at most one per second (the worst).

use std::future::Future;
use std::io::Write;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

struct Conf {
    threshold: Duration,
    out: Mutex<Box<dyn Write + Send>>,
    start: Instant,
}

fn conf() -> Option<&'static Conf> {
    static CONF: OnceLock<Option<Conf>> = OnceLock::new();
    CONF.get_or_init(|| {
        let ms: f64 = std::env::var("SKIFF_SLOW_MS").ok()?.parse().ok()?;
        let out: Box<dyn Write + Send> = match std::env::var("SKIFF_SLOW_LOG") {
            Ok(p) => Box::new(
                std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(p)
                    .ok()?,
            ),
            Err(_) => Box::new(std::io::stderr()),
        };
        Some(Conf {
            threshold: Duration::from_secs_f64(ms / 1000.0),
            out: Mutex::new(out),
            start: Instant::now(),
        })
    })
    .as_ref()
}

fn write_line(c: &Conf, line: &str) {
    let mut out = c.out.lock().unwrap_or_else(|e| e.into_inner());
    let _ = writeln!(out, "{:.3} {line}", c.start.elapsed().as_secs_f64());
}

tokio::task_local! {
    static MARKS: Arc<Mutex<Vec<(&'static str, Instant)>>>;
}

/// Whether slow requests are logged (`SKIFF_SLOW_MS` is set).
pub fn enabled() -> bool {
    conf().is_some()
}

/// Notes when the current request reached a point (a no-op unless the
/// request is traced).
pub fn mark(name: &'static str) {
    let _ = MARKS.try_with(|m| {
        m.lock()
            .unwrap_or_else(|e| e.into_inner())
            .push((name, Instant::now()))
    });
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// Runs a request's handler, logging it if it is slow (see the module).
pub async fn traced<F: Future>(method: &str, path: &str, f: F) -> F::Output {
    let Some(c) = conf() else {
        return f.await;
    };
    start_lag_probe(c);
    let t0 = Instant::now();
    let marks = Arc::new(Mutex::new(Vec::new()));
    let writes = skiff_store::trace::Collected::default();
    let out = MARKS
        .scope(marks.clone(), skiff_store::trace::scope(writes.clone(), f))
        .await;
    let end = Instant::now();
    let total = end - t0;
    if total < c.threshold {
        return out;
    }
    let mut line = format!("slow {method} {path} {:.1}ms", ms(total));
    for (name, at) in marks.lock().unwrap_or_else(|e| e.into_inner()).iter() {
        line.push_str(&format!(" {name}+{:.1}", ms(*at - t0)));
    }
    let writes = writes.lock().unwrap_or_else(|e| e.into_inner());
    for w in writes.iter() {
        line.push_str(&format!(
            " store[queued {:.1} apply {:.1} fsync {:.1} resumed+{:.1} n={} @+{:.1}]",
            ms(w.batch_start.saturating_duration_since(w.enqueued)),
            ms(w.commit_start - w.batch_start),
            ms(w.commit_end - w.commit_start),
            ms(w.resumed.saturating_duration_since(w.commit_end)),
            w.batch_len,
            ms(w.enqueued - t0),
        ));
    }
    if let Some(w) = writes.last() {
        line.push_str(&format!(" end+{:.1}", ms(end - w.resumed)));
    }
    write_line(c, &line);
    out
}

fn start_lag_probe(c: &'static Conf) {
    static STARTED: OnceLock<()> = OnceLock::new();
    STARTED.get_or_init(|| {
        tokio::spawn(async move {
            let tick = Duration::from_millis(10);
            let mut worst = Duration::ZERO;
            let mut since = Instant::now();
            loop {
                let t = Instant::now();
                tokio::time::sleep(tick).await;
                let late = t.elapsed().saturating_sub(tick);
                worst = worst.max(late);
                if since.elapsed() >= Duration::from_secs(1) {
                    if worst >= Duration::from_millis(10) {
                        write_line(
                            c,
                            &format!("lag worst {:.1}ms in the last second", ms(worst)),
                        );
                    }
                    worst = Duration::ZERO;
                    since = Instant::now();
                }
            }
        });
    });
}
