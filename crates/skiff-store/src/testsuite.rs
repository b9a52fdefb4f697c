//! The store conformance suite: what every backend of [`Store`] must do,
//! written once and run against each backend (as Kubernetes'
//! `storage/testing/store_tests.go` is run against etcd3).

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures::StreamExt;

use crate::{Error, Event, ListOptions, Store, Write};

fn b(s: &str) -> Bytes {
    Bytes::copy_from_slice(s.as_bytes())
}

/// A list's items as (key, value), to compare with what was written.
fn pairs(l: &crate::ListResult) -> Vec<(&str, Bytes)> {
    l.items
        .iter()
        .map(|kv| (kv.key.as_str(), kv.value.clone()))
        .collect()
}

async fn next_event(w: &mut crate::WatchStream) -> Event {
    tokio::time::timeout(Duration::from_secs(5), w.next())
        .await
        .expect("a watch event within 5s")
        .expect("the watch is open")
        .expect("no watch error")
}

/// Create, then get; a second create of the same key is AlreadyExists.
pub async fn create_then_get(s: Arc<dyn Store>) {
    let kv = s.create("/t/a", b("1")).await.unwrap();
    assert_eq!(kv.create_revision, kv.mod_revision);
    let got = s.get("/t/a").await.unwrap().unwrap();
    assert_eq!(got, kv);
    assert!(matches!(
        s.create("/t/a", b("2")).await,
        Err(Error::AlreadyExists(_))
    ));
    assert_eq!(
        s.get("/t/a").await.unwrap().unwrap().value,
        b("1"),
        "a failed create changes nothing"
    );
    assert!(s.get("/t/missing").await.unwrap().is_none());
}

/// Updates are guarded by the revision read; a stale one conflicts and reports the current item.
pub async fn update_requires_the_current_revision(s: Arc<dyn Store>) {
    let a = s.create("/t/a", b("1")).await.unwrap();
    let a2 = s.update("/t/a", b("2"), a.mod_revision).await.unwrap();
    assert!(a2.mod_revision > a.mod_revision);
    assert_eq!(a2.create_revision, a.create_revision);
    match s.update("/t/a", b("3"), a.mod_revision).await {
        Err(Error::Conflict {
            current: Some(cur), ..
        }) => assert_eq!(cur.value, b("2")),
        other => panic!("expected a conflict, got {other:?}"),
    }
    assert!(matches!(
        s.update("/t/none", b("x"), 1).await,
        Err(Error::NotFound(_))
    ));
}

/// A commit writes all of its keys or none: a failed condition anywhere
/// leaves every key as it was and names the key; a key written twice is
/// refused; watchers see each write with the value it replaced.
pub async fn commits_are_all_or_nothing(s: Arc<dyn Store>) {
    let a = s.create("/t/a", b("a1")).await.unwrap();
    let mut w = s.watch("/t/", 0, None).await.unwrap();
    let items = s
        .commit(vec![
            Write::Update {
                key: "/t/a".into(),
                value: b("a2"),
                expected_revision: a.mod_revision,
            },
            Write::Create {
                key: "/t/b".into(),
                value: b("b1"),
            },
        ])
        .await
        .unwrap();
    assert_eq!(items.len(), 2);
    assert_eq!(
        (
            items[0].key.as_str(),
            &items[0].value,
            items[0].create_revision
        ),
        ("/t/a", &b("a2"), a.create_revision)
    );
    assert!(items[0].mod_revision > a.mod_revision);
    assert_eq!(items[1].create_revision, items[1].mod_revision);
    assert!(items[1].mod_revision >= items[0].mod_revision);
    assert_eq!(s.get("/t/a").await.unwrap().unwrap(), items[0]);
    assert_eq!(s.get("/t/b").await.unwrap().unwrap(), items[1]);
    match next_event(&mut w).await {
        Event::Put { kv, prev } => {
            assert_eq!(kv, items[0]);
            assert_eq!(prev.map(|p| p.value), Some(b("a1")));
        }
        other => panic!("expected the update of /t/a, got {other:?}"),
    }
    match next_event(&mut w).await {
        Event::Put { kv, prev: None } => assert_eq!(kv, items[1]),
        other => panic!("expected the create of /t/b, got {other:?}"),
    }

    // A stale revision in the second write: the first does not happen.
    let before = s.current_revision().await.unwrap();
    match s
        .commit(vec![
            Write::Create {
                key: "/t/c".into(),
                value: b("c1"),
            },
            Write::Update {
                key: "/t/a".into(),
                value: b("a3"),
                expected_revision: a.mod_revision,
            },
        ])
        .await
    {
        Err(Error::Conflict {
            key,
            current: Some(cur),
            ..
        }) => {
            assert_eq!(key, "/t/a");
            assert_eq!(cur.value, b("a2"));
        }
        other => panic!("expected a conflict on /t/a, got {other:?}"),
    }
    assert!(s.get("/t/c").await.unwrap().is_none(), "nothing half-done");
    assert_eq!(s.current_revision().await.unwrap(), before);
    // An existing key to create, a missing one to update.
    assert!(matches!(
        s.commit(vec![Write::Create {
            key: "/t/b".into(),
            value: b("b2"),
        }])
        .await,
        Err(Error::AlreadyExists(k)) if k == "/t/b"
    ));
    assert!(matches!(
        s.commit(vec![
            Write::Create {
                key: "/t/d".into(),
                value: b("d"),
            },
            Write::Update {
                key: "/t/none".into(),
                value: b("x"),
                expected_revision: 1,
            },
        ])
        .await,
        Err(Error::NotFound(k)) if k == "/t/none"
    ));
    assert!(s.get("/t/d").await.unwrap().is_none());
    // The same key twice.
    assert!(s
        .commit(vec![
            Write::Create {
                key: "/t/e".into(),
                value: b("1"),
            },
            Write::Create {
                key: "/t/e".into(),
                value: b("2"),
            },
        ])
        .await
        .is_err());
    assert!(s.get("/t/e").await.unwrap().is_none());
}

/// Deletes, guarded or not; deleting what is gone is NotFound.
pub async fn delete_with_and_without_a_guard(s: Arc<dyn Store>) {
    let a = s.create("/t/a", b("1")).await.unwrap();
    s.update("/t/a", b("2"), a.mod_revision).await.unwrap();
    assert!(matches!(
        s.delete("/t/a", Some(a.mod_revision)).await,
        Err(Error::Conflict { .. })
    ));
    let (prev, rev) = s.delete("/t/a", None).await.unwrap();
    assert_eq!(prev.value, b("2"));
    assert!(rev > prev.mod_revision);
    assert!(matches!(
        s.delete("/t/a", None).await,
        Err(Error::NotFound(_))
    ));
    assert!(s.get("/t/a").await.unwrap().is_none());
}

/// Lists return keys in order under exactly their prefix.
pub async fn list_is_ordered_and_prefix_isolated(s: Arc<dyn Store>) {
    for k in ["/a/b/2", "/a/b/1", "/a/bc/1", "/a/b/3"] {
        s.create(k, b(k)).await.unwrap();
    }
    let l = s.list("/a/b/", ListOptions::default()).await.unwrap();
    let keys: Vec<_> = l.items.iter().map(|kv| kv.key.as_str()).collect();
    assert_eq!(keys, ["/a/b/1", "/a/b/2", "/a/b/3"]);
    assert!(!l.more);
    assert_eq!(s.count("/a/b/").await.unwrap(), 3);
    assert_eq!(l.revision, s.current_revision().await.unwrap());
}

/// Paging at the first page's revision sees that snapshot, whatever is written meanwhile.
pub async fn pages_come_from_one_snapshot(s: Arc<dyn Store>) {
    for i in 0..5 {
        s.create(&format!("/p/{i}"), b("v1")).await.unwrap();
    }
    let first = s
        .list(
            "/p/",
            ListOptions {
                limit: 2,
                ..Default::default()
            },
        )
        .await
        .unwrap();
    assert_eq!(first.items.len(), 2);
    assert!(first.more);
    assert_eq!(first.remaining, 3);
    // Writes after the first page: an update, a delete and a create.
    let k3 = s.get("/p/3").await.unwrap().unwrap();
    s.update("/p/3", b("v2"), k3.mod_revision).await.unwrap();
    s.delete("/p/4", None).await.unwrap();
    s.create("/p/5", b("new")).await.unwrap();
    let rest = s
        .list(
            "/p/",
            ListOptions {
                revision: Some(first.revision),
                limit: 0,
                start_after: Some(first.items[1].key.clone()),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    assert_eq!(
        pairs(&rest),
        [("/p/2", b("v1")), ("/p/3", b("v1")), ("/p/4", b("v1"))]
    );
    assert_eq!(rest.revision, first.revision);
}

/// A page read without counting what follows has the same items and an
/// exact `more` (deleted keys after the page are not taken for more items).
pub async fn pages_without_a_count_still_say_whether_more_follow(s: Arc<dyn Store>) {
    for i in 0..5 {
        s.create(&format!("/n/{i}"), b("v1")).await.unwrap();
    }
    s.delete("/n/4", None).await.unwrap();
    for limit in 1..=5 {
        let counted = s
            .list(
                "/n/",
                ListOptions {
                    limit,
                    ..Default::default()
                },
            )
            .await
            .unwrap();
        let uncounted = s
            .list(
                "/n/",
                ListOptions {
                    limit,
                    skip_count: true,
                    ..Default::default()
                },
            )
            .await
            .unwrap();
        assert_eq!(pairs(&uncounted), pairs(&counted), "limit {limit}");
        assert_eq!(uncounted.more, limit < 4, "limit {limit}");
        assert_eq!(counted.more, limit < 4, "limit {limit}");
        assert_eq!(counted.remaining, (4 - limit).max(0), "limit {limit}");
        if uncounted.more {
            assert!(uncounted.remaining >= 1);
        } else {
            assert_eq!(uncounted.remaining, 0);
        }
    }
}

/// A read at a revision newer than the store's is refused.
pub async fn future_revisions_are_refused(s: Arc<dyn Store>) {
    s.create("/f/a", b("1")).await.unwrap();
    let cur = s.current_revision().await.unwrap();
    let r = s
        .list(
            "/f/",
            ListOptions {
                revision: Some(cur + 10),
                ..Default::default()
            },
        )
        .await;
    assert!(matches!(r, Err(Error::FutureRevision { .. })), "{r:?}");
}

/// A watch from now sees only later changes, in order, under its prefix.
pub async fn watch_from_now_sees_only_later_changes(s: Arc<dyn Store>) {
    s.create("/w/old", b("x")).await.unwrap();
    let mut w = s.watch("/w/", 0, None).await.unwrap();
    s.create("/other/x", b("x")).await.unwrap();
    let a = s.create("/w/a", b("1")).await.unwrap();
    s.update("/w/a", b("2"), a.mod_revision).await.unwrap();
    s.delete("/w/a", None).await.unwrap();
    match next_event(&mut w).await {
        Event::Put { kv, prev: None } => assert_eq!(kv.key, "/w/a"),
        e => panic!("expected a create, got {e:?}"),
    }
    match next_event(&mut w).await {
        Event::Put { kv, prev: Some(p) } => assert_eq!((kv.value, p.value), (b("2"), b("1"))),
        e => panic!("expected an update, got {e:?}"),
    }
    match next_event(&mut w).await {
        Event::Delete { prev, .. } => assert_eq!(prev.value, b("2")),
        e => panic!("expected a delete, got {e:?}"),
    }
}

/// A watch from a past revision replays history, then continues live, without gaps or repeats.
pub async fn watch_from_the_past_replays_then_follows(s: Arc<dyn Store>) {
    // (Revision 0 means "from now", so make the history start later.)
    s.create("/elsewhere", b("x")).await.unwrap();
    let a = s.create("/h/a", b("1")).await.unwrap();
    s.update("/h/a", b("2"), a.mod_revision).await.unwrap();
    s.delete("/h/a", None).await.unwrap();
    let mut w = s.watch("/h/", a.mod_revision - 1, None).await.unwrap();
    let mut revs = Vec::new();
    for _ in 0..3 {
        revs.push(next_event(&mut w).await.revision());
    }
    s.create("/h/b", b("1")).await.unwrap();
    revs.push(next_event(&mut w).await.revision());
    assert!(revs.windows(2).all(|p| p[0] < p[1]), "in order: {revs:?}");
    assert_eq!(revs[0], a.mod_revision);
}

/// An idle watch with a progress interval reports progress.
pub async fn idle_watches_get_progress(s: Arc<dyn Store>) {
    s.create("/g/a", b("1")).await.unwrap();
    let mut w = s
        .watch("/g/", 0, Some(Duration::from_millis(50)))
        .await
        .unwrap();
    s.create("/elsewhere", b("1")).await.unwrap();
    let rev = s.current_revision().await.unwrap();
    loop {
        if let Event::Progress { revision } = next_event(&mut w).await {
            if revision >= rev {
                break;
            }
        }
    }
}

/// After compaction, older reads and watches answer Compacted; latest values stay.
pub async fn compaction_forgets_history_but_keeps_values(s: Arc<dyn Store>) {
    let a = s.create("/c/a", b("1")).await.unwrap();
    let a2 = s.update("/c/a", b("2"), a.mod_revision).await.unwrap();
    s.create("/c/b", b("1")).await.unwrap();
    s.delete("/c/b", None).await.unwrap();
    let cur = s.current_revision().await.unwrap();
    s.compact(cur).await.unwrap();
    assert_eq!(s.compacted_revision().await.unwrap(), cur);
    let r = s
        .list(
            "/c/",
            ListOptions {
                revision: Some(a.mod_revision),
                ..Default::default()
            },
        )
        .await;
    assert!(matches!(r, Err(Error::Compacted { .. })), "{r:?}");
    assert!(matches!(
        s.watch("/c/", a.mod_revision, None).await,
        Err(Error::Compacted { .. })
    ));
    let l = s.list("/c/", ListOptions::default()).await.unwrap();
    assert_eq!(l.items.len(), 1);
    assert_eq!(l.items[0].mod_revision, a2.mod_revision);
    let at = s
        .list(
            "/c/",
            ListOptions {
                revision: Some(cur),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    assert_eq!(at.items.len(), 1);
}

/// Concurrent writers: every acknowledged write is there, revisions unique.
pub async fn concurrent_writes_are_all_kept(s: Arc<dyn Store>) {
    let mut tasks = Vec::new();
    for t in 0..16 {
        let s = s.clone();
        tasks.push(tokio::spawn(async move {
            let mut revs = Vec::new();
            for i in 0..25 {
                revs.push(
                    s.create(&format!("/cc/{t:02}/{i:02}"), b("v"))
                        .await
                        .unwrap()
                        .mod_revision,
                );
            }
            revs
        }));
    }
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await.unwrap());
    }
    let n = all.len();
    all.sort();
    all.dedup();
    assert_eq!(all.len(), n, "revisions are unique");
    assert_eq!(s.count("/cc/").await.unwrap(), 400);
}

/// Reads after updates, deletes and two compactions: each key's latest value
/// and revisions, lists at the latest and at a past revision, counts.
pub async fn reads_after_updates_and_compactions(s: Arc<dyn Store>) {
    let a1 = s.create("/r/a", b("a1")).await.unwrap();
    let b1 = s.create("/r/b", b("b1")).await.unwrap();
    let c1 = s.create("/r/c", b("c1")).await.unwrap();
    let a2 = s.update("/r/a", b("a2"), a1.mod_revision).await.unwrap();
    s.delete("/r/b", None).await.unwrap();
    let mid = s.current_revision().await.unwrap();
    let a3 = s.update("/r/a", b("a3"), a2.mod_revision).await.unwrap();
    let c2 = s.update("/r/c", b("c2"), c1.mod_revision).await.unwrap();
    let b2 = s.create("/r/b", b("b2")).await.unwrap();
    assert_eq!(
        b2.create_revision, b2.mod_revision,
        "a re-created key starts over"
    );
    assert!(b2.create_revision > b1.create_revision);

    let check_latest = |l: crate::ListResult| {
        let got: Vec<_> = l
            .items
            .iter()
            .map(|kv| {
                (
                    kv.key.as_str(),
                    kv.value.clone(),
                    kv.create_revision,
                    kv.mod_revision,
                )
            })
            .collect();
        assert_eq!(
            got,
            [
                ("/r/a", b("a3"), a1.create_revision, a3.mod_revision),
                ("/r/b", b("b2"), b2.create_revision, b2.mod_revision),
                ("/r/c", b("c2"), c1.create_revision, c2.mod_revision),
            ]
        );
    };
    check_latest(s.list("/r/", ListOptions::default()).await.unwrap());
    let at_mid = ListOptions {
        revision: Some(mid),
        ..Default::default()
    };
    let old = s.list("/r/", at_mid.clone()).await.unwrap();
    let got: Vec<_> = old
        .items
        .iter()
        .map(|kv| (kv.key.as_str(), kv.value.clone(), kv.mod_revision))
        .collect();
    assert_eq!(
        got,
        [
            ("/r/a", b("a2"), a2.mod_revision),
            ("/r/c", b("c1"), c1.mod_revision)
        ]
    );
    assert_eq!(old.revision, mid);

    // Compact at `mid`: the versions live there stay readable at `mid`.
    s.compact(mid).await.unwrap();
    assert_eq!(s.list("/r/", at_mid.clone()).await.unwrap(), old);
    check_latest(s.list("/r/", ListOptions::default()).await.unwrap());
    assert_eq!(s.get("/r/a").await.unwrap().unwrap(), a3);
    assert_eq!(s.get("/r/c").await.unwrap().unwrap(), c2);
    assert_eq!(s.count("/r/").await.unwrap(), 3);

    // Delete one key, then compact past everything: the latest value of every
    // live key stays, including ones not written since the first compaction.
    s.create("/r/d", b("d1")).await.unwrap();
    s.delete("/r/c", None).await.unwrap();
    let cur = s.current_revision().await.unwrap();
    s.compact(cur).await.unwrap();
    let l = s.list("/r/", ListOptions::default()).await.unwrap();
    assert_eq!(
        pairs(&l),
        [("/r/a", b("a3")), ("/r/b", b("b2")), ("/r/d", b("d1"))]
    );
    assert_eq!(s.get("/r/a").await.unwrap().unwrap(), a3);
    assert!(s.get("/r/c").await.unwrap().is_none());
    assert_eq!(s.count("/r/").await.unwrap(), 3);
    assert!(matches!(
        s.list("/r/", at_mid).await,
        Err(Error::Compacted { .. })
    ));
    // Writes after compaction see the kept versions.
    assert!(matches!(
        s.create("/r/a", b("x")).await,
        Err(Error::AlreadyExists(_))
    ));
    match s.update("/r/a", b("x"), a2.mod_revision).await {
        Err(Error::Conflict {
            current: Some(cur), ..
        }) => assert_eq!(cur, a3),
        other => panic!("expected a conflict, got {other:?}"),
    }
    let a4 = s.update("/r/a", b("a4"), a3.mod_revision).await.unwrap();
    assert_eq!(a4.create_revision, a1.create_revision);
    assert!(matches!(
        s.update("/r/c", b("x"), c2.mod_revision).await,
        Err(Error::NotFound(_))
    ));
    s.create("/r/c", b("c3")).await.unwrap();
    assert_eq!(s.count("/r/").await.unwrap(), 4);
}

/// A watch replaying history reports each write with the value before it,
/// also across a compaction.
pub async fn replayed_events_carry_previous_values(s: Arc<dyn Store>) {
    s.create("/elsewhere", b("x")).await.unwrap();
    let a1 = s.create("/e/a", b("1")).await.unwrap();
    let a2 = s.update("/e/a", b("2"), a1.mod_revision).await.unwrap();
    s.create("/e/b", b("b")).await.unwrap();
    let compact_at = s.current_revision().await.unwrap();
    let a3 = s.update("/e/a", b("3"), a2.mod_revision).await.unwrap();
    let (_, del) = s.delete("/e/a", None).await.unwrap();
    let a5 = s.create("/e/a", b("5")).await.unwrap();

    let mut w = s.watch("/e/", a1.mod_revision - 1, None).await.unwrap();
    let mut seen = Vec::new();
    for _ in 0..6 {
        seen.push(next_event(&mut w).await);
    }
    let expect = |seen: &[Event]| {
        let brief: Vec<_> = seen
            .iter()
            .map(|e| match e {
                Event::Put { kv, prev } => (
                    kv.key.clone(),
                    Some(kv.value.clone()),
                    prev.as_ref().map(|p| (p.value.clone(), p.mod_revision)),
                    e.revision(),
                ),
                Event::Delete { prev, .. } => (
                    prev.key.clone(),
                    None,
                    Some((prev.value.clone(), prev.mod_revision)),
                    e.revision(),
                ),
                Event::Progress { .. } => panic!("no progress expected"),
            })
            .collect();
        brief
    };
    let all = expect(&seen);
    assert_eq!(
        all[1..],
        [
            (
                "/e/a".to_string(),
                Some(b("2")),
                Some((b("1"), a1.mod_revision)),
                a2.mod_revision
            ),
            ("/e/b".to_string(), Some(b("b")), None, compact_at),
            (
                "/e/a".to_string(),
                Some(b("3")),
                Some((b("2"), a2.mod_revision)),
                a3.mod_revision
            ),
            (
                "/e/a".to_string(),
                None,
                Some((b("3"), a3.mod_revision)),
                del
            ),
            ("/e/a".to_string(), Some(b("5")), None, a5.mod_revision),
        ]
    );
    match &seen[5] {
        Event::Put { kv, .. } => assert_eq!(kv, &a5),
        e => panic!("expected a create, got {e:?}"),
    }

    s.compact(compact_at).await.unwrap();
    let mut w = s.watch("/e/", compact_at, None).await.unwrap();
    let mut after = Vec::new();
    for _ in 0..3 {
        after.push(next_event(&mut w).await);
    }
    assert_eq!(expect(&after), all[3..]);
}

/// A progress request reaches a watch without a progress interval: after
/// every event up to the returned revision, it reports progress at that
/// revision or later (so a watch cache can serve consistent reads).
pub async fn requested_progress_follows_every_event(s: Arc<dyn Store>) {
    let mut w = s.watch("/q/", 0, None).await.unwrap();
    let a = s.create("/q/a", b("1")).await.unwrap();
    s.create("/elsewhere", b("x")).await.unwrap();
    let rev = s.request_progress().await.unwrap();
    assert_eq!(rev, s.current_revision().await.unwrap());
    assert!(rev > a.mod_revision);
    match next_event(&mut w).await {
        Event::Put { kv, prev: None } => assert_eq!(kv, a),
        e => panic!("expected the create first, got {e:?}"),
    }
    loop {
        match next_event(&mut w).await {
            Event::Progress { revision } if revision >= rev => break,
            Event::Progress { .. } => continue,
            e => panic!("expected progress, got {e:?}"),
        }
    }
    // Without a request, an idle watch without an interval stays quiet.
    let quiet = tokio::time::timeout(Duration::from_millis(300), w.next()).await;
    assert!(quiet.is_err(), "unrequested: {quiet:?}");
}

/// What a backend's constructor gives the conformance tests: the store and
/// anything that must live as long as it (a temp dir, an etcd process).
pub struct Fixture {
    pub store: Arc<dyn Store>,
    _keep: Option<Box<dyn std::any::Any + Send>>,
}

impl From<Arc<dyn Store>> for Fixture {
    fn from(store: Arc<dyn Store>) -> Self {
        Fixture { store, _keep: None }
    }
}

impl<G: Send + 'static> From<(Arc<dyn Store>, G)> for Fixture {
    fn from((store, keep): (Arc<dyn Store>, G)) -> Self {
        Fixture {
            store,
            _keep: Some(Box::new(keep)),
        }
    }
}

/// Expands to one `#[tokio::test]` per conformance test, each against a
/// fresh backend from `$make` — an expression whose value is a future of an
/// `Arc<dyn Store>`, or of `(Arc<dyn Store>, guard)` where the guard lives
/// until the test ends. Every backend's tests are this one line, so no
/// backend can miss a test:
///
/// ```text
/// skiff_store::conformance_tests!(async { store() });
/// ```
#[macro_export]
macro_rules! conformance_tests {
    ($make:expr) => {
        $crate::conformance_tests!(@each $make;
            create_then_get,
            update_requires_the_current_revision,
            commits_are_all_or_nothing,
            delete_with_and_without_a_guard,
            list_is_ordered_and_prefix_isolated,
            pages_come_from_one_snapshot,
            pages_without_a_count_still_say_whether_more_follow,
            future_revisions_are_refused,
            watch_from_now_sees_only_later_changes,
            watch_from_the_past_replays_then_follows,
            idle_watches_get_progress,
            compaction_forgets_history_but_keeps_values,
            concurrent_writes_are_all_kept,
            reads_after_updates_and_compactions,
            replayed_events_carry_previous_values,
            requested_progress_follows_every_event,
        );
    };
    (@each $make:expr; $($name:ident),* $(,)?) => {
        $(
            #[tokio::test]
            async fn $name() {
                let fixture: $crate::testsuite::Fixture = ($make).await.into();
                $crate::testsuite::$name(fixture.store.clone()).await;
                drop(fixture);
            }
        )*
    };
}

mod etcd_server;
pub use etcd_server::{EtcdCluster, EtcdServer};
