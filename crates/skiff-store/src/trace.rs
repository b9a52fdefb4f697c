//! Where a write's time went inside the embedded store, for a request that
//! asks (the API server's slow-request log, `SKIFF_SLOW_MS`): a task that
//! runs inside [`scope`] gets one [`WriteTiming`] per write it submits.
//! Outside a scope nothing is recorded (the committer's per-batch
//! instants are taken either way: three clock reads per batch).

use std::sync::{Arc, Mutex};
use std::time::Instant;

/// The instants of one write's way through the group commit.
#[derive(Clone, Copy, Debug)]
pub struct WriteTiming {
    /// Handed to the committer thread.
    pub enqueued: Instant,
    /// Its batch started (the committer took it off the queue).
    pub batch_start: Instant,
    /// The batch's changes were in; redb's commit (the fsync) began.
    pub commit_start: Instant,
    /// The commit returned (durable).
    pub commit_end: Instant,
    /// The writing task had the answer (after the runtime resumed it).
    pub resumed: Instant,
    /// Writes in the batch.
    pub batch_len: usize,
}

/// The per-batch part of [`WriteTiming`], sent with every reply.
#[derive(Clone, Copy, Debug)]
pub(crate) struct BatchTimes {
    pub batch_start: Instant,
    pub commit_start: Instant,
    pub commit_end: Instant,
    pub batch_len: usize,
}

/// What a traced task collected.
pub type Collected = Arc<Mutex<Vec<WriteTiming>>>;

tokio::task_local! {
    static TRACE: Collected;
}

/// Runs `f` recording the store writes it makes into `into`.
pub async fn scope<F: std::future::Future>(into: Collected, f: F) -> F::Output {
    TRACE.scope(into, f).await
}

pub(crate) fn record(enqueued: Instant, b: &BatchTimes) {
    let _ = TRACE.try_with(|c| {
        c.lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(WriteTiming {
                enqueued,
                batch_start: b.batch_start,
                commit_start: b.commit_start,
                commit_end: b.commit_end,
                resumed: Instant::now(),
                batch_len: b.batch_len,
            })
    });
}
