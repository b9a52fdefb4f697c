//! Priority and fairness, after kube-apiserver's (API Priority and
//! Fairness, with its default configuration's levels): every request
//! except the exempt ones takes seats of its priority level while it runs;
//! when none are free it waits in its flow's queue, and the level hands
//! freed seats to its flows in turn (round robin), so one client flooding
//! the server waits behind itself, not in front of everyone else. A flow is
//! one user at one level. A request whose flow's queue is full, or that
//! waited [`QUEUE_WAIT`] without a seat, is refused with 429 and
//! `Retry-After`, as kube-apiserver refuses it.
//!
//! Levels and their shares of [`TOTAL_SEATS`] (Kubernetes' defaults):
//! `exempt` (system:masters, the health paths), `system` (nodes, 30),
//! `leader-election` (components' leases, 10), `workload-high` (the
//! scheduler and controller manager, 40), `workload-low` (ServiceAccounts,
//! 100), `global-default` (everyone else authenticated, 20), `catch-all`
//! (anonymous, 5).
//!
//! Long-running requests (watches, exec/attach/port-forward, logs, proxy)
//! hold no seat: they are bounded by [`WATCHES_PER_USER`] instead (every
//! watch keeps a bounded queue, so this bounds their memory). A list takes
//! more seats the more objects it may return (one per 100, up to 10, as
//! Kubernetes' work estimator), so unpaged lists of everything cannot all
//! run at once.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use skiff_core::rbac::Attributes;
use skiff_core::ApiError;
use tokio::sync::oneshot;

use crate::auth::Identity;

/// Seats of all levels together (kube-apiserver: max-requests-inflight 400
/// plus max-mutating-requests-inflight 200).
pub const TOTAL_SEATS: usize = 600;
/// Requests one flow may have waiting at one level. Generous: skiff's
/// in-process components have no client-side rate limit (kube-scheduler's
/// and kube-controller-manager's QPS limits keep theirs from queueing
/// deep), and a waiting request holds little (its body is read only once
/// it runs).
pub const QUEUE_LENGTH: usize = 1024;
/// How long a request waits for a seat before a 429.
pub const QUEUE_WAIT: Duration = Duration::from_secs(15);
/// Open watches per user (system:masters are not limited).
pub const WATCHES_PER_USER: usize = 1000;
/// Seats of the widest request.
const MAX_WIDTH: usize = 10;

/// A priority level.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Level {
    System,
    LeaderElection,
    WorkloadHigh,
    WorkloadLow,
    GlobalDefault,
    CatchAll,
}

impl Level {
    const ALL: [(Level, &'static str, usize); 6] = [
        (Level::System, "system", 30),
        (Level::LeaderElection, "leader-election", 10),
        (Level::WorkloadHigh, "workload-high", 40),
        (Level::WorkloadLow, "workload-low", 100),
        (Level::GlobalDefault, "global-default", 20),
        (Level::CatchAll, "catch-all", 5),
    ];

    pub fn name(self) -> &'static str {
        Level::ALL
            .iter()
            .find(|(l, _, _)| *l == self)
            .map(|(_, n, _)| *n)
            .unwrap_or("catch-all")
    }
}

/// Which level a request belongs to (None: exempt), as the default
/// FlowSchemas decide it.
pub fn classify(who: &Identity, a: &Attributes) -> Option<Level> {
    let in_group = |g: &str| who.groups.iter().any(|x| x == g);
    if who.is_master() {
        return None;
    }
    if a.resource == "leases"
        && (who.user == "system:kube-scheduler"
            || who.user == "system:kube-controller-manager"
            || who.user.starts_with("system:serviceaccount:kube-system:"))
    {
        return Some(Level::LeaderElection);
    }
    if in_group("system:nodes") {
        return Some(Level::System);
    }
    if who.user == "system:kube-scheduler"
        || who.user == "system:kube-controller-manager"
        || who.user.starts_with("system:serviceaccount:kube-system:")
    {
        return Some(Level::WorkloadHigh);
    }
    if in_group("system:serviceaccounts") {
        return Some(Level::WorkloadLow);
    }
    if in_group("system:authenticated") || !who.user.starts_with("system:anonymous") {
        return Some(Level::GlobalDefault);
    }
    Some(Level::CatchAll)
}

/// Whether a request runs as long as its client wants (no seat held).
pub fn long_running(a: &Attributes, subresource: Option<&str>) -> bool {
    a.verb == "watch"
        || matches!(
            subresource,
            Some("exec" | "attach" | "portforward" | "log" | "proxy")
        )
}

/// Seats a request takes: one, or for a list one per 100 objects it may
/// return (`limit` bounds it), up to [`MAX_WIDTH`].
pub fn width(verb: &str, objects: usize, limit: Option<usize>) -> usize {
    if verb != "list" {
        return 1;
    }
    let n = limit.map_or(objects, |l| l.min(objects));
    n.div_ceil(100).clamp(1, MAX_WIDTH)
}

struct Waiter {
    width: usize,
    wake: oneshot::Sender<()>,
}

#[derive(Default)]
struct LevelState {
    seats: usize,
    free: usize,
    queues: HashMap<String, VecDeque<Waiter>>,
    /// Flows with waiting requests, in the order they are served.
    turn: VecDeque<String>,
}

impl LevelState {
    /// Hands free seats to waiting flows in turn. A flow whose next request
    /// is wider than what is free keeps its turn (so wide requests are not
    /// starved by narrow ones behind them).
    fn dispatch(&mut self) {
        while let Some(flow) = self.turn.front().cloned() {
            let Some(q) = self.queues.get_mut(&flow) else {
                self.turn.pop_front();
                continue;
            };
            let Some(head) = q.front() else {
                self.queues.remove(&flow);
                self.turn.pop_front();
                continue;
            };
            if head.width > self.free {
                return;
            }
            let w = q.pop_front().expect("head");
            self.turn.pop_front();
            if q.is_empty() {
                self.queues.remove(&flow);
            } else {
                self.turn.push_back(flow);
            }
            if w.wake.send(()).is_ok() {
                self.free -= w.width;
            }
        }
    }
}

/// The server's flow control.
pub struct FlowControl {
    levels: HashMap<Level, Arc<Mutex<LevelState>>>,
    watches: Mutex<HashMap<String, usize>>,
    watch_limit: usize,
    queue_length: usize,
    queue_wait: Duration,
}

/// Seats held by a running request; dropping it frees them.
pub struct Seat {
    level: Arc<Mutex<LevelState>>,
    width: usize,
}

impl Drop for Seat {
    fn drop(&mut self) {
        let mut s = self.level.lock().unwrap_or_else(|e| e.into_inner());
        s.free += self.width;
        s.dispatch();
    }
}

/// An open watch counted against its user; dropping it uncounts it.
pub struct WatchSlot {
    fc: Arc<FlowControl>,
    user: String,
}

impl Drop for WatchSlot {
    fn drop(&mut self) {
        let mut w = self.fc.watches.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(n) = w.get_mut(&self.user) {
            *n -= 1;
            if *n == 0 {
                w.remove(&self.user);
            }
        }
    }
}

fn too_many(message: String) -> ApiError {
    ApiError::too_many_requests(message, 1)
}

/// The knobs of flow control (`Config::flow`).
#[derive(Clone, Debug)]
pub struct Limits {
    /// Seats of all levels together.
    pub seats: usize,
    /// Requests one flow may have waiting at one level.
    pub queue_length: usize,
    /// How long a request waits for a seat before a 429.
    pub queue_wait: Duration,
    /// Open watches per user.
    pub watches_per_user: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            seats: TOTAL_SEATS,
            queue_length: QUEUE_LENGTH,
            queue_wait: QUEUE_WAIT,
            watches_per_user: WATCHES_PER_USER,
        }
    }
}

impl FlowControl {
    /// Kubernetes' default levels over `limits.seats` seats.
    pub fn new(limits: &Limits) -> Arc<FlowControl> {
        let shares: usize = Level::ALL.iter().map(|(_, _, s)| s).sum();
        let levels = Level::ALL
            .iter()
            .map(|(l, _, s)| {
                // At least as many as the widest request, so every request can run.
                let seats = (limits.seats * s).div_ceil(shares).max(MAX_WIDTH);
                let state = LevelState {
                    seats,
                    free: seats,
                    ..Default::default()
                };
                (*l, Arc::new(Mutex::new(state)))
            })
            .collect();
        Arc::new(FlowControl {
            levels,
            watches: Mutex::new(HashMap::new()),
            watch_limit: limits.watches_per_user,
            queue_length: limits.queue_length,
            queue_wait: limits.queue_wait,
        })
    }

    /// Waits for `width` seats of `level` for the flow `flow` (at once when
    /// they are free and no one waits); 429 when the flow's queue is full
    /// or no seat came in time.
    pub async fn acquire(&self, level: Level, flow: &str, width: usize) -> Result<Seat, ApiError> {
        let state = self.levels[&level].clone();
        let rx = {
            let mut s = state.lock().unwrap_or_else(|e| e.into_inner());
            let width = width.min(s.seats);
            if s.turn.is_empty() && s.free >= width {
                s.free -= width;
                return Ok(Seat {
                    level: state.clone(),
                    width,
                });
            }
            let q = s.queues.entry(flow.to_string()).or_default();
            if q.len() >= self.queue_length {
                return Err(too_many(format!(
                    "too many requests from {flow} waiting at priority level {}, please try again later",
                    level.name()
                )));
            }
            let (tx, rx) = oneshot::channel();
            q.push_back(Waiter { width, wake: tx });
            if q.len() == 1 {
                s.turn.push_back(flow.to_string());
            }
            s.dispatch();
            (rx, width)
        };
        let (mut rx, width) = rx;
        let seat = |state| Seat {
            level: state,
            width,
        };
        match tokio::time::timeout(self.queue_wait, &mut rx).await {
            Ok(Ok(())) => Ok(seat(state)),
            res => {
                // Gave up (or, never, the sender went). Under the lock no
                // seat can be sent meanwhile: one sent just before is ours.
                let mut s = state.lock().unwrap_or_else(|e| e.into_inner());
                if res.is_err() && rx.try_recv().is_ok() {
                    drop(s);
                    return Ok(seat(state.clone()));
                }
                rx.close();
                if let Some(q) = s.queues.get_mut(flow) {
                    q.retain(|w| !w.wake.is_closed());
                }
                s.dispatch();
                Err(too_many(format!(
                    "the server is busy at priority level {}: no seat within {}s, please try again later",
                    level.name(),
                    self.queue_wait.as_secs()
                )))
            }
        }
    }

    /// Counts an open watch of `user`; 429 past [`WATCHES_PER_USER`].
    pub fn open_watch(self: &Arc<Self>, user: &str) -> Result<WatchSlot, ApiError> {
        let mut w = self.watches.lock().unwrap_or_else(|e| e.into_inner());
        let n = w.entry(user.to_string()).or_insert(0);
        if *n >= self.watch_limit {
            return Err(too_many(format!(
                "too many open watches for {user} ({}), please close some and try again",
                self.watch_limit
            )));
        }
        *n += 1;
        Ok(WatchSlot {
            fc: self.clone(),
            user: user.to_string(),
        })
    }

    /// Requests waiting at a level (tests, metrics).
    pub fn waiting(&self, level: Level) -> usize {
        self.levels[&level]
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .queues
            .values()
            .map(VecDeque::len)
            .sum()
    }

    /// Free seats of a level (tests, metrics).
    pub fn free(&self, level: Level) -> usize {
        self.levels[&level]
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .free
    }
}

/// What a request holds while it runs: seats, or for a long-running one
/// its watch count.
pub enum Admitted {
    Exempt,
    Seat(Seat),
    Watch(WatchSlot),
    LongRunning,
}

/// Paths every client may probe without taking a seat (Kubernetes'
/// `probes` FlowSchema is exempt).
fn is_probe(a: &Attributes) -> bool {
    !a.resource_request
        && ["/healthz", "/livez", "/readyz", "/version"]
            .iter()
            .any(|p| a.path == *p || a.path.starts_with(&format!("{p}/")))
}

impl FlowControl {
    /// Admits a request: exempt, a seat of its level (`objects` is what a
    /// list may return, for its width), or for a watch a place among its
    /// user's watches.
    pub async fn admit(
        self: &Arc<Self>,
        who: &Identity,
        a: &Attributes,
        objects: impl FnOnce() -> usize,
        limit: Option<usize>,
    ) -> Result<Admitted, ApiError> {
        if is_probe(a) {
            return Ok(Admitted::Exempt);
        }
        let Some(level) = classify(who, a) else {
            return Ok(Admitted::Exempt);
        };
        let sub = (!a.subresource.is_empty()).then_some(a.subresource.as_str());
        if a.verb == "watch" {
            return self.open_watch(&who.user).map(Admitted::Watch);
        }
        if long_running(a, sub) {
            return Ok(Admitted::LongRunning);
        }
        let w = if a.verb == "list" {
            width("list", objects(), limit)
        } else {
            1
        };
        self.acquire(level, &who.user, w).await.map(Admitted::Seat)
    }
}

/// A response body that keeps something alive until the body is done (or
/// dropped): an open watch's place among its user's watches.
pub struct Guarded<B, G> {
    inner: B,
    _guard: G,
}

impl<B, G> Guarded<B, G> {
    pub fn new(inner: B, guard: G) -> Self {
        Guarded {
            inner,
            _guard: guard,
        }
    }
}

impl<B, G> http_body::Body for Guarded<B, G>
where
    B: http_body::Body + Unpin,
    G: Unpin,
{
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        std::pin::Pin::new(&mut self.inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

/// The `limit` query parameter of a list, if any.
pub fn query_limit(query: Option<&str>) -> Option<usize> {
    query?
        .split('&')
        .filter_map(|kv| kv.split_once('='))
        .find(|(k, _)| *k == "limit")
        .and_then(|(_, v)| v.parse().ok())
        .filter(|n| *n > 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn small(seats_at_default: usize, queue_length: usize, wait_ms: u64) -> Arc<FlowControl> {
        // One global-default level of exactly `seats_at_default` seats is
        // easiest to reason about: size the total so its share comes out so.
        let fc = FlowControl::new(&Limits {
            seats: 1000,
            queue_length,
            queue_wait: Duration::from_millis(wait_ms),
            watches_per_user: 2,
        });
        {
            let mut s = fc.levels[&Level::GlobalDefault].lock().unwrap();
            s.seats = seats_at_default;
            s.free = seats_at_default;
        }
        fc
    }

    fn user(name: &str) -> Identity {
        Identity::new(name, vec![])
    }

    #[tokio::test]
    async fn freed_seats_go_to_flows_in_turn_not_in_arrival_order() {
        let fc = small(10, 100, 5_000);
        // The greedy flow holds every seat and queues 20 more requests,
        // then the polite one asks once.
        let held: Vec<Seat> = futures::future::join_all(
            (0..10).map(|_| fc.acquire(Level::GlobalDefault, "greedy", 1)),
        )
        .await
        .into_iter()
        .map(Result::unwrap)
        .collect();
        let mut waiting = vec![];
        for _ in 0..20 {
            let fc = fc.clone();
            waiting.push(tokio::spawn(async move {
                fc.acquire(Level::GlobalDefault, "greedy", 1).await.unwrap()
            }));
        }
        while fc.levels[&Level::GlobalDefault]
            .lock()
            .unwrap()
            .queues
            .get("greedy")
            .map_or(0, VecDeque::len)
            < 20
        {
            tokio::task::yield_now().await;
        }
        let fc2 = fc.clone();
        let polite = tokio::spawn(async move {
            fc2.acquire(Level::GlobalDefault, "polite", 1)
                .await
                .unwrap()
        });
        while fc.levels[&Level::GlobalDefault].lock().unwrap().turn.len() < 2 {
            tokio::task::yield_now().await;
        }
        // Free two seats: one greedy waiter, then the polite one, run.
        let mut held = held;
        held.pop();
        held.pop();
        let _p = polite.await.unwrap();
        // (With first-come-first-served the polite request would still be
        // behind 18 greedy ones and time out.)
        let left = fc.levels[&Level::GlobalDefault].lock().unwrap().queues["greedy"].len();
        assert_eq!(left, 19, "one greedy request and the polite one ran");
        drop(held);
        for w in waiting {
            drop(w.await.unwrap());
        }
        assert_eq!(
            fc.free(Level::GlobalDefault),
            9,
            "all but the polite seat back"
        );
    }

    #[tokio::test]
    async fn a_full_queue_and_a_long_wait_are_429s_and_lose_no_seat() {
        let fc = small(1, 1, 100);
        let seat = fc.acquire(Level::GlobalDefault, "u", 1).await.unwrap();
        let fc2 = fc.clone();
        let queued = tokio::spawn(async move { fc2.acquire(Level::GlobalDefault, "u", 1).await });
        while fc.levels[&Level::GlobalDefault]
            .lock()
            .unwrap()
            .turn
            .is_empty()
        {
            tokio::task::yield_now().await;
        }
        // The flow's queue (length 1) is full.
        let e = fc
            .acquire(Level::GlobalDefault, "u", 1)
            .await
            .err()
            .unwrap();
        assert_eq!(e.code, 429);
        assert_eq!(e.retry_after_seconds, Some(1));
        // The queued one gives up after its wait.
        let e = queued.await.unwrap().err().unwrap();
        assert_eq!(e.code, 429);
        assert!(e.message.contains("global-default"), "{}", e.message);
        drop(seat);
        assert_eq!(fc.free(Level::GlobalDefault), 1);
        let again = fc.acquire(Level::GlobalDefault, "u", 1).await;
        assert!(again.is_ok());
    }

    #[tokio::test]
    async fn watches_are_counted_per_user_until_closed() {
        let fc = small(10, 10, 100);
        let a = fc.open_watch("alice").unwrap();
        let _b = fc.open_watch("alice").unwrap();
        assert_eq!(fc.open_watch("alice").err().unwrap().code, 429);
        // Another user is not affected.
        let _c = fc.open_watch("bob").unwrap();
        drop(a);
        assert!(fc.open_watch("alice").is_ok());
    }

    #[test]
    fn lists_take_seats_by_what_they_may_return() {
        assert_eq!(width("get", 100_000, None), 1);
        assert_eq!(width("list", 0, None), 1);
        assert_eq!(width("list", 250, None), 3);
        assert_eq!(width("list", 150_000, None), MAX_WIDTH);
        assert_eq!(width("list", 150_000, Some(500)), 5);
    }

    #[test]
    fn requests_are_classified_as_the_default_flow_schemas_do() {
        let a = |resource: &str| Attributes {
            verb: "get".into(),
            resource: resource.into(),
            resource_request: true,
            ..Default::default()
        };
        let masters = Identity::new("admin", vec!["system:masters".into()]);
        assert_eq!(classify(&masters, &a("pods")), None);
        let node = Identity::new("system:node:n1", vec!["system:nodes".into()]);
        assert_eq!(classify(&node, &a("pods")), Some(Level::System));
        let sched = user("system:kube-scheduler");
        assert_eq!(classify(&sched, &a("leases")), Some(Level::LeaderElection));
        assert_eq!(classify(&sched, &a("pods")), Some(Level::WorkloadHigh));
        let sa = Identity::new(
            "system:serviceaccount:default:app",
            vec!["system:serviceaccounts".into()],
        );
        assert_eq!(classify(&sa, &a("pods")), Some(Level::WorkloadLow));
        assert_eq!(
            classify(&user("jane"), &a("pods")),
            Some(Level::GlobalDefault)
        );
        let anon = Identity::anonymous();
        assert_eq!(classify(&anon, &a("pods")), Some(Level::CatchAll));
    }
}
