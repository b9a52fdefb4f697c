//! A watch delivers every change, in order, or ends with 410 so the client
//! relists: checked the way clients lose changes — writers going on while
//! a watch-list sends a large initial set and a client resumes from its
//! closing bookmark, and a client that stops reading while far more changes
//! than its queue holds are made, then resumes from the last resourceVersion
//! it saw (with the history kept, and with the history compacted past it).

use std::collections::{BTreeMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::{Body, BodyDataStream};
use axum::http::{Request, StatusCode};
use axum::Router;
use futures::StreamExt;
use http_body_util::BodyExt;
use serde_json::{json, Value};
use skiff_store::{RedbStore, Store};
use tower::ServiceExt;

const CMS: &str = "/api/v1/namespaces/default/configmaps";

async fn server(config: skiff_apiserver::Config) -> (Router, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let store: Arc<dyn Store> =
        RedbStore::open(&dir.path().join("s.redb"), Default::default()).unwrap();
    let server = skiff_apiserver::ApiServer::start(store, config)
        .await
        .unwrap();
    (server.in_process_router("test"), dir)
}

async fn call(r: &Router, method: &str, path: &str, body: Option<Value>) -> (StatusCode, Value) {
    let req = Request::builder()
        .method(method)
        .uri(path)
        .header("content-type", "application/json")
        .body(body.map(|v| Body::from(v.to_string())).unwrap_or_default())
        .unwrap();
    let resp = r.clone().oneshot(req).await.unwrap();
    let status = resp.status();
    let bytes = resp.into_body().collect().await.unwrap().to_bytes();
    (
        status,
        serde_json::from_slice(&bytes).unwrap_or(Value::Null),
    )
}

fn rv_of(v: &Value) -> i64 {
    v["metadata"]["resourceVersion"]
        .as_str()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no resourceVersion in {v}"))
}

/// The creates acknowledged so far: name → resourceVersion.
type Acked = Arc<Mutex<BTreeMap<String, i64>>>;

/// Writers creating ConfigMaps until `stop`, recording each acknowledged one.
fn writers(
    r: &Router,
    n: usize,
    prefix: &str,
    stop: Arc<AtomicBool>,
    acked: Acked,
) -> Vec<tokio::task::JoinHandle<()>> {
    (0..n)
        .map(|w| {
            let (r, stop, acked) = (r.clone(), stop.clone(), acked.clone());
            let prefix = format!("{prefix}-w{w}");
            tokio::spawn(async move {
                let mut i = 0;
                while !stop.load(Ordering::Relaxed) {
                    let name = format!("{prefix}-{i}");
                    i += 1;
                    let (st, body) =
                        call(&r, "POST", CMS, Some(json!({"metadata": {"name": name}}))).await;
                    assert_eq!(st, StatusCode::CREATED, "{body}");
                    acked.lock().unwrap().insert(name, rv_of(&body));
                }
            })
        })
        .collect()
}

/// A watch response being read one event at a time.
struct Watch {
    stream: BodyDataStream,
    buf: Vec<u8>,
}

impl Watch {
    async fn open(r: &Router, query: &str) -> Watch {
        let req = Request::builder()
            .uri(format!("{CMS}?watch=true&{query}"))
            .body(Body::empty())
            .unwrap();
        let resp = r.clone().oneshot(req).await.unwrap();
        assert_eq!(resp.status(), StatusCode::OK);
        Watch {
            stream: resp.into_body().into_data_stream(),
            buf: Vec::new(),
        }
    }

    /// The next event; `None` when nothing comes for `quiet` or the stream ends.
    async fn next(&mut self, quiet: Duration) -> Option<Value> {
        loop {
            if let Some(i) = self.buf.iter().position(|b| *b == b'\n') {
                let line: Vec<u8> = self.buf.drain(..=i).collect();
                return Some(serde_json::from_slice(&line).unwrap());
            }
            match tokio::time::timeout(quiet, self.stream.next()).await {
                Ok(Some(chunk)) => self.buf.extend_from_slice(&chunk.unwrap()),
                _ => return None,
            }
        }
    }
}

fn missing(acked: &Acked, seen: &HashSet<String>) -> Vec<(String, i64)> {
    acked
        .lock()
        .unwrap()
        .iter()
        .filter(|(n, _)| !seen.contains(*n))
        .map(|(n, rv)| (n.clone(), *rv))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_watch_list_bookmark_closes_its_snapshot_and_a_resume_from_it_misses_nothing() {
    let (r, _dir) = server(Default::default()).await;
    for i in 0..2000 {
        let (st, _) = call(
            &r,
            "POST",
            CMS,
            Some(json!({"metadata": {"name": format!("initial-{i}")}})),
        )
        .await;
        assert_eq!(st, StatusCode::CREATED);
    }
    let stop = Arc::new(AtomicBool::new(false));
    let acked: Acked = Default::default();
    let tasks = writers(&r, 2, "during", stop.clone(), acked.clone());
    // Let the writers get going before the watch registers.
    while acked.lock().unwrap().len() < 20 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }

    let mut seen = HashSet::new();
    let mut w = Watch::open(
        &r,
        "sendInitialEvents=true&resourceVersionMatch=NotOlderThan&allowWatchBookmarks=true",
    )
    .await;
    let bookmark_rv = loop {
        let ev = w
            .next(Duration::from_secs(10))
            .await
            .expect("events up to the bookmark");
        if ev["type"] == "BOOKMARK" {
            assert_eq!(
                ev["object"]["metadata"]["annotations"]["k8s.io/initial-events-end"], "true",
                "{ev}"
            );
            break rv_of(&ev["object"]);
        }
        seen.insert(
            ev["object"]["metadata"]["name"]
                .as_str()
                .unwrap()
                .to_string(),
        );
    };
    // The client goes away at the bookmark (as a reflector that restarts
    // its watch does) and resumes from it.
    drop(w);
    let mut w = Watch::open(
        &r,
        &format!("resourceVersion={bookmark_rv}&allowWatchBookmarks=true"),
    )
    .await;
    // Let the writers make more changes after the resume, then stop them.
    let at_resume = acked.lock().unwrap().len();
    while acked.lock().unwrap().len() < at_resume + 50 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    stop.store(true, Ordering::Relaxed);
    for t in tasks {
        t.await.unwrap();
    }
    let last = *acked.lock().unwrap().values().max().unwrap();
    let mut highest = 0;
    while highest < last {
        let ev = w.next(Duration::from_secs(10)).await.unwrap_or_else(|| {
            panic!("the resumed watch stopped at {highest}, before the last write ({last})")
        });
        let rv = rv_of(&ev["object"]);
        if ev["type"] != "BOOKMARK" {
            assert!(
                rv > bookmark_rv,
                "an event at or below the bookmark after it: {ev}"
            );
            seen.insert(
                ev["object"]["metadata"]["name"]
                    .as_str()
                    .unwrap()
                    .to_string(),
            );
        }
        highest = highest.max(rv);
    }
    let lost = missing(&acked, &seen);
    assert!(
        lost.is_empty(),
        "{} of {} acknowledged creates were in neither the watch-list (bookmark at {bookmark_rv}) nor the watch resumed from it, e.g. {:?}",
        lost.len(),
        acked.lock().unwrap().len(),
        &lost[..lost.len().min(5)]
    );
}

/// One client that stops reading for `stall` while writers go on, then
/// reads on and resumes from the last resourceVersion it saw (relisting
/// after a 410), as a reflector does. Every acknowledged write must be seen,
/// as an event or in a relist, and the resourceVersions it is told must
/// never go backwards.
async fn stalled_client_sees_every_change(
    config: skiff_apiserver::Config,
    stall: Duration,
) -> usize {
    let (r, _dir) = server(config).await;
    let (_, list) = call(&r, "GET", CMS, None).await;
    let mut last_rv = rv_of(&list);
    let stop = Arc::new(AtomicBool::new(false));
    let acked: Acked = Default::default();
    let tasks = writers(&r, 4, "w", stop.clone(), acked.clone());

    let mut seen = HashSet::new();
    let mut relists = 0;
    let mut w = Watch::open(
        &r,
        &format!("resourceVersion={last_rv}&allowWatchBookmarks=true"),
    )
    .await;
    // A few events, then the client stops reading, far past the watch's
    // queue (1,024 events) and past the bookmark interval (15 s).
    for _ in 0..5 {
        let ev = w.next(Duration::from_secs(10)).await.expect("an event");
        last_rv = rv_of(&ev["object"]);
        seen.insert(
            ev["object"]["metadata"]["name"]
                .as_str()
                .unwrap()
                .to_string(),
        );
    }
    // Past `stall`, and until the writes made since are well past the
    // queue (however fast this machine writes).
    let stalled_at = acked.lock().unwrap().len();
    let until = tokio::time::Instant::now() + stall;
    while tokio::time::Instant::now() < until || acked.lock().unwrap().len() - stalled_at < 3 * 1024
    {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    stop.store(true, Ordering::Relaxed);
    for t in tasks {
        t.await.unwrap();
    }
    let last = *acked.lock().unwrap().values().max().unwrap();

    while last_rv < last {
        let ev = match w.next(Duration::from_secs(5)).await {
            Some(ev) => ev,
            None => {
                // The stream ended without an error: resume from where it was.
                w = Watch::open(
                    &r,
                    &format!("resourceVersion={last_rv}&allowWatchBookmarks=true"),
                )
                .await;
                continue;
            }
        };
        if ev["type"] == "ERROR" {
            assert_eq!(ev["object"]["code"], 410, "{ev}");
            // Try to resume from the last resourceVersion seen; a 410 then
            // too (the history is gone) means relist.
            w = Watch::open(
                &r,
                &format!("resourceVersion={last_rv}&allowWatchBookmarks=true"),
            )
            .await;
            let first = w.next(Duration::from_secs(5)).await;
            match first {
                Some(e) if e["type"] == "ERROR" => {
                    assert_eq!(e["object"]["code"], 410, "{e}");
                    relists += 1;
                    let (st, list) = call(&r, "GET", CMS, None).await;
                    assert_eq!(st, StatusCode::OK);
                    for item in list["items"].as_array().unwrap() {
                        seen.insert(item["metadata"]["name"].as_str().unwrap().to_string());
                    }
                    let rv = rv_of(&list);
                    assert!(
                        rv >= last_rv,
                        "a relist at {rv} behind what was seen ({last_rv})"
                    );
                    last_rv = rv;
                    w = Watch::open(
                        &r,
                        &format!("resourceVersion={last_rv}&allowWatchBookmarks=true"),
                    )
                    .await;
                }
                Some(e) => {
                    let rv = rv_of(&e["object"]);
                    assert!(
                        rv > last_rv,
                        "after resuming from {last_rv}, an older change: {e}"
                    );
                    last_rv = rv;
                    if e["type"] != "BOOKMARK" {
                        seen.insert(
                            e["object"]["metadata"]["name"]
                                .as_str()
                                .unwrap()
                                .to_string(),
                        );
                    }
                }
                None => {}
            }
            continue;
        }
        let rv = rv_of(&ev["object"]);
        assert!(
            rv > last_rv || (ev["type"] == "BOOKMARK" && rv == last_rv),
            "the watch went back from {last_rv}: {} at {rv}",
            ev["type"]
        );
        last_rv = rv;
        if ev["type"] != "BOOKMARK" {
            seen.insert(
                ev["object"]["metadata"]["name"]
                    .as_str()
                    .unwrap()
                    .to_string(),
            );
        }
    }
    let lost = missing(&acked, &seen);
    assert!(
        lost.is_empty(),
        "{} of {} acknowledged creates were never seen (relists: {relists}), e.g. {:?}",
        lost.len(),
        acked.lock().unwrap().len(),
        &lost[..lost.len().min(5)]
    );
    relists
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_client_that_stops_reading_gets_every_change_in_order_or_a_410() {
    // The history outlives the stall: the client resumes where it was.
    stalled_client_sees_every_change(Default::default(), Duration::from_secs(17)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_client_that_stops_reading_longer_than_the_history_relists_and_misses_nothing() {
    // History compacted every second down to the last two seconds: the
    // stall outlives it, so resuming answers 410 and the client relists.
    let config = skiff_apiserver::Config {
        compact_keep: Duration::from_secs(2),
        compact_every: Duration::from_secs(1),
        ..Default::default()
    };
    let relists = stalled_client_sees_every_change(config, Duration::from_secs(17)).await;
    assert!(
        relists > 0,
        "the history outlived the stall: the test did not test a relist"
    );
}
