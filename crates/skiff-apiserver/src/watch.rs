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
use tokio::sync::mpsc;

use crate::handlers::{self, AppState};
use crate::negotiate::Output;
use crate::request::Query;
use crate::watchcache::{CacheEvent, CachedObject, EventType, Filter, Since};

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
    let cache = reg.cache.resource(res);

    // With an explicit resourceVersion newer than the cache, wait for it.
    if let Some(n) = start.filter(|n| *n > 0) {
        if !reg.cache.wait_for(n, Duration::from_secs(3)).await {
            return Err(ApiError::timeout(format!(
                "Too large resource version: {n}, current: {}",
                reg.cache.revision()
            )));
        }
    }
    // Registered before anything is sent: every later event reaches the
    // watch through its queue (only the events its selection can concern,
    // by the cache's index); earlier ones come from the history.
    let mut sub = cache.subscribe_filtered(&filter, send_initial);
    let cursor = if send_initial {
        sub.from
    } else {
        start.filter(|n| *n > 0).unwrap_or(sub.from)
    };
    let (tx, rx) = mpsc::channel::<Result<Bytes, std::io::Error>>(64);
    let enc = Encoder {
        res,
        output,
        first: std::sync::atomic::AtomicBool::new(true),
    };
    let initial_end_bookmark = q.get("sendInitialEvents") == Some("true") && bookmarks;
    tokio::spawn(async move {
        let deadline = tokio::time::Instant::now() + timeout;
        let too_old = |cursor: i64, why: String| {
            let status =
                ApiError::gone(format!("too old resource version: {cursor} ({why})")).to_status();
            Bytes::from(format!("{{\"type\":\"ERROR\",\"object\":{status}}}\n"))
        };
        for o in std::mem::take(&mut sub.initial) {
            if tx.send(Ok(enc.event("ADDED", &o.bytes))).await.is_err() {
                return;
            }
        }
        let mut cursor = cursor;
        if initial_end_bookmark {
            let rev = cursor.max(reg.cache.revision());
            if tx.send(Ok(enc.bookmark(rev, true))).await.is_err() {
                return;
            }
        }
        // Resuming from an older revision: the history up to the
        // registration, then the queue.
        'replay: while cursor < sub.from {
            match cache.since(cursor, 1000) {
                Since::TooOld { oldest } => {
                    let _ = tx.send(Ok(too_old(cursor, oldest.to_string()))).await;
                    return;
                }
                Since::Events(events) if !events.is_empty() => {
                    for ev in &events {
                        if ev.revision > sub.from {
                            break 'replay;
                        }
                        cursor = ev.revision;
                        if let Some((ty, obj)) = transition(ev, &filter) {
                            if tx.send(Ok(enc.event(ty, &obj.bytes))).await.is_err() {
                                return;
                            }
                        }
                    }
                }
                Since::Events(_) => break,
            }
        }
        let mut last_sent = tokio::time::Instant::now();
        loop {
            let bookmark_at = last_sent + BOOKMARK_EVERY;
            tokio::select! {
                ev = sub.events.recv() => match ev {
                    Some(ev) => {
                        if ev.revision <= cursor {
                            continue;
                        }
                        cursor = ev.revision;
                        if let Some((ty, obj)) = transition(&ev, &filter) {
                            if tx.send(Ok(enc.event(ty, &obj.bytes))).await.is_err() {
                                return;
                            }
                            last_sent = tokio::time::Instant::now();
                        }
                    }
                    None => {
                        // Dropped for falling behind (or the cache restarted):
                        // the client relists.
                        let why = if sub.evicted() {
                            format!("the watch fell {} events behind", crate::watchcache::WATCH_QUEUE)
                        } else {
                            "the watch cache was reset".to_string()
                        };
                        let _ = tx.send(Ok(too_old(cursor, why))).await;
                        return;
                    }
                },
                _ = tokio::time::sleep_until(deadline) => return,
                _ = tokio::time::sleep_until(bookmark_at), if bookmarks => {
                    let rev = cursor.max(reg.cache.revision());
                    if tx.send(Ok(enc.bookmark(rev, false))).await.is_err() {
                        return;
                    }
                    last_sent = tokio::time::Instant::now();
                }
                _ = tx.closed() => return,
            }
        }
    });
    let stream = tokio_stream::wrappers::ReceiverStream::new(rx);
    Ok(Response::builder()
        .status(200)
        .header(header::CONTENT_TYPE, "application/json")
        .header(header::CACHE_CONTROL, "no-cache, private")
        .body(Body::from_stream(stream))
        .unwrap_or_else(|_| handlers::json_response(500, &json!({}))))
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
        } else {
            obj
        };
        match self.output {
            Output::Table { v1beta1 } => {
                let first = self.first.swap(false, std::sync::atomic::Ordering::Relaxed);
                let v: Value = serde_json::from_slice(obj).unwrap_or(Value::Null);
                let t =
                    handlers::table(self.res, &[v], v1beta1, None, None, None, first, "Metadata");
                Bytes::from(format!("{{\"type\":\"{ty}\",\"object\":{t}}}\n"))
            }
            Output::PartialMetadata { v1beta1 } => {
                let v: Value = serde_json::from_slice(obj).unwrap_or(Value::Null);
                let p = handlers::partial_metadata(&v, v1beta1);
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
