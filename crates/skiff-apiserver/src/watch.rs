//! Watch streams: `{type, object}` events served from the watch cache, with
//! initial state, resume from a resourceVersion, selector transitions
//! (an object leaving the selection is DELETED for that watcher), bookmarks,
//! 410 Gone for compacted history, and timeouts.

use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::http::{header, Response};
use bytes::Bytes;
use serde_json::{json, Value};
use skiff_core::resources::ResourceInfo;
use skiff_core::ApiError;

use crate::negotiate::Output;
use crate::request::Query;
use crate::response;
use crate::state::AppState;
use crate::watchcache::{
    CacheEvent, CachedObject, EventType, Filter, ResourceCache, Since, Subscription,
};

/// How often an idle watch that allows bookmarks gets one.
const BOOKMARK_EVERY: Duration = Duration::from_secs(15);

/// Starts a watch response.
pub async fn serve(
    state: Arc<AppState>,
    res: &'static ResourceInfo,
    filter: Filter,
    q: &Query,
    output: Output,
) -> Result<Response<Body>, ApiError> {
    let rv = q
        .get("resourceVersion")
        .filter(|s| !s.is_empty())
        .map(str::to_string);
    let start: Option<i64> = match rv.as_deref() {
        None => None,
        Some(s) => Some(
            s.parse()
                .map_err(|_| ApiError::bad_request(format!("invalid resource version: {s:?}")))?,
        ),
    };
    let send_initial = match q.get("sendInitialEvents") {
        Some("true") => true,
        Some("false") => false,
        // Kubernetes: without a resourceVersion (or "0"), a watch starts with
        // the current state as ADDED events.
        _ => start.unwrap_or(0) == 0,
    };
    if q.get("sendInitialEvents") == Some("true")
        && q.get("resourceVersionMatch") != Some("NotOlderThan")
    {
        return Err(ApiError::invalid(
            "",
            "ListOptions",
            "",
            vec![skiff_core::Cause::forbidden(
                "resourceVersionMatch",
                "sendInitialEvents requires setting resourceVersionMatch to NotOlderThan",
            )],
        ));
    }
    let bookmarks = q.flag("allowWatchBookmarks");
    let timeout = q
        .int("timeoutSeconds")?
        .filter(|t| *t > 0)
        .map(|t| Duration::from_secs(t as u64))
        .unwrap_or(Duration::from_secs(1800));
    let reg = state.registry.clone();
    let cache = reg.cache().resource(res);

    // With an explicit resourceVersion newer than the cache, wait for it.
    if let Some(n) = start.filter(|n| *n > 0) {
        if !reg.cache().wait_for(n, Duration::from_secs(3)).await {
            return Err(ApiError::timeout(format!(
                "Too large resource version: {n}, current: {}",
                reg.cache().revision()
            )));
        }
    }
    // Registered before anything is sent: every later event reaches the
    // watch through its queue (only the events its selection can concern,
    // by the cache's index); earlier ones come from the history.
    // Every change at or below the revision the caches had applied before
    // the registration is in the initial state (each revision is one
    // change, applied before it is published), so the initial state is
    // current at the later of the two.
    let applied = reg.cache().revision();
    let mut sub = cache.subscribe_filtered(&filter, send_initial);
    let initial_rev = sub.from.max(applied);
    let cursor = if send_initial {
        sub.from
    } else {
        start.filter(|n| *n > 0).unwrap_or(sub.from)
    };
    let initial = std::mem::take(&mut sub.initial).into_iter();
    let st = WatchState {
        enc: Encoder {
            res,
            output,
            first: std::sync::atomic::AtomicBool::new(true),
        },
        filter,
        cache,
        reg,
        sub,
        cursor,
        replaying: true,
        initial,
        initial_end_bookmark: q.get("sendInitialEvents") == Some("true") && bookmarks,
        initial_rev,
        bookmarks,
        deadline: tokio::time::Instant::now() + timeout,
        last_sent: tokio::time::Instant::now(),
        done: false,
    };
    // The body is the watch itself: no task or channel per watch, and the
    // watch (and its registration) ends when the client goes.
    let stream = futures::stream::unfold(st, |mut st| async move {
        let chunk = st.next_chunk().await?;
        Some((Ok::<_, std::io::Error>(chunk), st))
    });
    Ok(Response::builder()
        .status(200)
        .header(header::CONTENT_TYPE, "application/json")
        .header(header::CACHE_CONTROL, "no-cache, private")
        .body(Body::from_stream(stream))
        .unwrap_or_else(|_| response::json_response(500, &json!({}))))
}

/// Events written into one chunk of the response at most (more wait for
/// the next).
const CHUNK_BYTES: usize = 64 * 1024;

/// One watch in progress.
struct WatchState {
    enc: Encoder,
    filter: Filter,
    cache: Arc<ResourceCache>,
    reg: Arc<crate::registry::Registry>,
    sub: Subscription,
    /// The revision of the last event looked at.
    cursor: i64,
    /// Still sending the history between the requested revision and the
    /// registration.
    replaying: bool,
    initial: std::vec::IntoIter<Arc<CachedObject>>,
    initial_end_bookmark: bool,
    /// The revision the initial state is current at: the initial-events-end
    /// bookmark carries it, and every later change is in the queue.
    initial_rev: i64,
    bookmarks: bool,
    deadline: tokio::time::Instant,
    last_sent: tokio::time::Instant,
    done: bool,
}

impl WatchState {
    fn too_old(&mut self, why: String) -> Bytes {
        self.done = true;
        let status = ApiError::gone(format!("too old resource version: {} ({why})", self.cursor))
            .to_status();
        Bytes::from(format!("{{\"type\":\"ERROR\",\"object\":{status}}}\n"))
    }

    /// Appends what this watch sees of `ev`.
    fn push(&mut self, ev: &CacheEvent, out: &mut Pending) {
        if ev.revision <= self.cursor {
            return;
        }
        self.cursor = ev.revision;
        if let Some((ty, obj)) = transition(ev, &self.filter) {
            out.push(ty, obj.bytes());
        }
    }

    /// The events gathered, encoded: objects converted to the watched
    /// version first (a conversion webhook gets the chunk's objects in one
    /// review; its failure ends the watch with an ERROR event).
    async fn finish(&mut self, out: Pending) -> Bytes {
        let events = out.events;
        if !crate::crd::conversion::uses_webhook(self.enc.res) {
            let mut b = Vec::with_capacity(out.bytes + 64);
            for (ty, obj) in &events {
                b.extend_from_slice(&self.enc.event(ty, obj));
            }
            return Bytes::from(b);
        }
        let (types, objs): (Vec<&'static str>, Vec<Bytes>) = events.into_iter().unzip();
        match crate::crd::conversion::list_from_storage(&*self.reg, self.enc.res, objs).await {
            Ok(objs) => {
                let mut b = Vec::with_capacity(out.bytes + 64);
                for (ty, obj) in types.iter().zip(&objs) {
                    b.extend_from_slice(&self.enc.encode(ty, obj));
                }
                Bytes::from(b)
            }
            Err(e) => {
                self.done = true;
                Bytes::from(format!(
                    "{{\"type\":\"ERROR\",\"object\":{}}}\n",
                    e.to_status()
                ))
            }
        }
    }

    /// The next piece of the response; `None` ends it.
    async fn next_chunk(&mut self) -> Option<Bytes> {
        if self.done {
            return None;
        }
        let mut out = Pending::default();
        // The initial state, as ADDED events.
        for o in self.initial.by_ref() {
            out.push("ADDED", o.bytes());
            if out.bytes >= CHUNK_BYTES {
                return Some(self.finish(out).await);
            }
        }
        if !out.is_empty() {
            return Some(self.finish(out).await);
        }
        if self.initial_end_bookmark {
            // It closes the snapshot, not the present: changes made since
            // the registration are still queued and come after it.
            self.initial_end_bookmark = false;
            return Some(self.enc.bookmark(self.initial_rev, true));
        }
        // Resuming from an older revision: the history up to the
        // registration, then the queue.
        while self.replaying && self.cursor < self.sub.from {
            match self.cache.since(self.cursor, 1000) {
                Since::TooOld { oldest } => return Some(self.too_old(oldest.to_string())),
                Since::Events(events) if !events.is_empty() => {
                    for ev in &events {
                        if ev.revision > self.sub.from {
                            self.replaying = false;
                            break;
                        }
                        self.push(ev, &mut out);
                    }
                    if out.bytes >= CHUNK_BYTES || (!out.is_empty() && !self.replaying) {
                        return Some(self.finish(out).await);
                    }
                }
                Since::Events(_) => self.replaying = false,
            }
        }
        self.replaying = false;
        if !out.is_empty() {
            return Some(self.finish(out).await);
        }
        loop {
            let bookmark_at = self.last_sent + BOOKMARK_EVERY;
            tokio::select! {
                // Queued events before a bookmark or the deadline.
                biased;
                ev = self.sub.events.recv() => match ev {
                    Some(ev) => {
                        self.push(&ev, &mut out);
                        // Whatever else is queued goes in the same chunk.
                        while out.bytes < CHUNK_BYTES {
                            match self.sub.events.try_recv() {
                                Ok(ev) => self.push(&ev, &mut out),
                                Err(_) => break,
                            }
                        }
                        if !out.is_empty() {
                            self.last_sent = tokio::time::Instant::now();
                            return Some(self.finish(out).await);
                        }
                    }
                    None => return Some(self.dropped()),
                },
                _ = tokio::time::sleep_until(self.deadline) => return None,
                _ = tokio::time::sleep_until(bookmark_at), if self.bookmarks => {
                    self.last_sent = tokio::time::Instant::now();
                    return Some(self.bookmark(out).await);
                }
            }
        }
    }

    /// The end of a watch whose queue was closed: dropped for falling
    /// behind (or the cache restarted), so the client relists.
    fn dropped(&mut self) -> Bytes {
        let why = if self.sub.evicted() {
            format!(
                "the watch fell {} events behind",
                crate::watchcache::WATCH_QUEUE
            )
        } else {
            "the watch cache was reset".to_string()
        };
        self.too_old(why)
    }

    /// A periodic bookmark, never ahead of what this watch has delivered.
    /// Every change at or below the revision read first has been applied
    /// and handed to this watch's queue (or has closed the queue, if the
    /// watch fell behind), so the queue is sent first and the bookmark
    /// closes exactly what came before it. A closed queue gets no bookmark:
    /// the changes it lost lie below the present.
    async fn bookmark(&mut self, mut out: Pending) -> Bytes {
        let applied = self.reg.cache().revision();
        let mut closed = false;
        loop {
            match self.sub.events.try_recv() {
                Ok(ev) => self.push(&ev, &mut out),
                Err(tokio::sync::mpsc::error::TryRecvError::Empty) => break,
                Err(tokio::sync::mpsc::error::TryRecvError::Disconnected) => {
                    closed = true;
                    break;
                }
            }
        }
        if closed {
            if out.is_empty() {
                return self.dropped();
            }
            // The next chunk finds the queue closed and ends the watch.
            return self.finish(out).await;
        }
        let mark = self.enc.bookmark(self.cursor.max(applied), false);
        if out.is_empty() {
            return mark;
        }
        let events = self.finish(out).await;
        if self.done {
            return events;
        }
        let mut b = Vec::with_capacity(events.len() + mark.len());
        b.extend_from_slice(&events);
        b.extend_from_slice(&mark);
        Bytes::from(b)
    }
}

/// What a watcher with `filter` sees of an event: the type and object, or nothing.
fn transition<'a>(
    ev: &'a CacheEvent,
    filter: &Filter,
) -> Option<(&'static str, &'a Arc<CachedObject>)> {
    let now = ev.object.matches(filter);
    let before = ev.prev.as_ref().map(|p| p.matches(filter)).unwrap_or(false);
    match ev.kind {
        EventType::Added => now.then_some(("ADDED", &ev.object)),
        EventType::Modified => match (before, now) {
            (true, true) => Some(("MODIFIED", &ev.object)),
            (false, true) => Some(("ADDED", &ev.object)),
            (true, false) => Some(("DELETED", &ev.object)),
            (false, false) => None,
        },
        EventType::Deleted => (now || before).then_some(("DELETED", &ev.object)),
    }
}

/// Events gathered for one chunk, before encoding.
#[derive(Default)]
struct Pending {
    events: Vec<(&'static str, Bytes)>,
    bytes: usize,
}

impl Pending {
    fn push(&mut self, ty: &'static str, obj: Bytes) {
        self.bytes += obj.len() + 32;
        self.events.push((ty, obj));
    }

    fn is_empty(&self) -> bool {
        self.events.is_empty()
    }
}

struct Encoder {
    res: &'static ResourceInfo,
    output: Output,
    first: std::sync::atomic::AtomicBool,
}

impl Encoder {
    fn event(&self, ty: &str, obj: &Bytes) -> Bytes {
        let converted;
        let obj = if skiff_core::convert::needed(self.res) {
            converted = Bytes::from(skiff_core::convert::bytes_from_storage(self.res, obj));
            &converted
        } else if self.res.rules.custom().is_some()
            && !crate::crd::conversion::has_api_version(obj, &self.res.api_version())
        {
            // Kept at an older storage version (conversion `None`).
            converted = crate::crd::conversion::with_api_version(obj, &self.res.api_version());
            &converted
        } else {
            obj
        };
        self.encode(ty, obj)
    }

    /// One event of an object already in the watched version.
    fn encode(&self, ty: &str, obj: &Bytes) -> Bytes {
        match self.output {
            Output::Table { v1beta1 } => {
                let first = self.first.swap(false, std::sync::atomic::Ordering::Relaxed);
                let v: Value = serde_json::from_slice(obj).unwrap_or(Value::Null);
                let t =
                    response::table(self.res, &[v], v1beta1, None, None, None, first, "Metadata");
                Bytes::from(format!("{{\"type\":\"{ty}\",\"object\":{t}}}\n"))
            }
            Output::PartialMetadata { v1beta1 } => {
                let v: Value = serde_json::from_slice(obj).unwrap_or(Value::Null);
                let p = response::partial_metadata(&v, v1beta1);
                Bytes::from(format!("{{\"type\":\"{ty}\",\"object\":{p}}}\n"))
            }
            _ => {
                let mut b = Vec::with_capacity(obj.len() + 32);
                b.extend_from_slice(b"{\"type\":\"");
                b.extend_from_slice(ty.as_bytes());
                b.extend_from_slice(b"\",\"object\":");
                b.extend_from_slice(obj);
                b.extend_from_slice(b"}\n");
                Bytes::from(b)
            }
        }
    }

    fn bookmark(&self, rev: i64, initial_end: bool) -> Bytes {
        let mut meta = json!({"resourceVersion": rev.to_string()});
        if initial_end {
            meta["annotations"] = json!({"k8s.io/initial-events-end": "true"});
        }
        let obj =
            json!({"kind": self.res.kind, "apiVersion": self.res.api_version(), "metadata": meta});
        Bytes::from(format!("{{\"type\":\"BOOKMARK\",\"object\":{obj}}}\n"))
    }
}
