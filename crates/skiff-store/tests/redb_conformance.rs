//! The store conformance suite against the embedded redb backend.

use std::sync::Arc;

use futures::StreamExt;
use skiff_store::{RedbStore, Store};

/// A store in a temp dir that lives as long as the test process.
fn store() -> Arc<dyn Store> {
    let dir = tempfile::tempdir().unwrap().keep();
    RedbStore::open(&dir.join("store.redb"), Default::default()).unwrap()
}

skiff_store::conformance_tests!(async { store() });

#[tokio::test]
async fn writes_survive_reopening_the_store() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store.redb");
    let rev = {
        let s = RedbStore::open(&path, Default::default()).unwrap();
        s.create("/k", bytes::Bytes::from_static(b"v"))
            .await
            .unwrap();
        let r = s.current_revision().await.unwrap();
        s.close();
        r
    };
    // The committer thread exits once its channel closes; wait for the file lock.
    let mut reopened = None;
    for _ in 0..50 {
        match RedbStore::open(&path, Default::default()) {
            Ok(s) => {
                reopened = Some(s);
                break;
            }
            Err(_) => tokio::time::sleep(std::time::Duration::from_millis(20)).await,
        }
    }
    let s = reopened.expect("the store reopens");
    assert_eq!(s.current_revision().await.unwrap(), rev);
    assert_eq!(
        s.get("/k").await.unwrap().unwrap().value,
        bytes::Bytes::from_static(b"v")
    );
}

/// Opens the store at `path`, waiting for a closed one's committer to let go
/// of the file.
async fn reopen(path: &std::path::Path) -> Arc<RedbStore> {
    for _ in 0..50 {
        match RedbStore::open(path, Default::default()) {
            Ok(s) => return s,
            Err(_) => tokio::time::sleep(std::time::Duration::from_millis(20)).await,
        }
    }
    RedbStore::open(path, Default::default()).expect("the store reopens")
}

#[tokio::test]
async fn reopening_returns_every_acknowledged_write() {
    use skiff_store::{KeyValue, ListOptions};
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store.redb");
    let s = RedbStore::open(&path, Default::default()).unwrap();
    // Concurrent writers: each key is created, updated, and every third one deleted.
    let mut tasks = Vec::new();
    for t in 0..16 {
        let s = s.clone();
        tasks.push(tokio::spawn(async move {
            let mut acked: Vec<(String, Option<KeyValue>)> = Vec::new();
            for i in 0..20 {
                let key = format!("/re/{t:02}/{i:02}");
                let v1 = s
                    .create(&key, bytes::Bytes::from(format!("{key} v1")))
                    .await
                    .unwrap();
                let v2 = s
                    .update(
                        &key,
                        bytes::Bytes::from(format!("{key} v2")),
                        v1.mod_revision,
                    )
                    .await
                    .unwrap();
                if i % 3 == 0 {
                    s.delete(&key, Some(v2.mod_revision)).await.unwrap();
                    acked.push((key, None));
                } else {
                    acked.push((key, Some(v2)));
                }
            }
            acked
        }));
    }
    let mut acked = Vec::new();
    for t in tasks {
        acked.extend(t.await.unwrap());
    }
    let rev = s.current_revision().await.unwrap();
    let before = s.list("/re/", ListOptions::default()).await.unwrap();
    s.close();
    drop(s);

    let s = reopen(&path).await;
    assert_eq!(s.current_revision().await.unwrap(), rev);
    for (key, want) in &acked {
        assert_eq!(&s.get(key).await.unwrap(), want, "{key}");
    }
    let after = s.list("/re/", ListOptions::default()).await.unwrap();
    assert_eq!(after, before);
    assert_eq!(
        after.items.len(),
        acked.iter().filter(|(_, v)| v.is_some()).count()
    );
    assert_eq!(s.count("/re/").await.unwrap(), after.items.len() as i64);
    // History survives too: a watch from the start replays every write.
    let mut w = s.watch("/re/", 1, None).await.unwrap();
    let mut n = 0;
    while let Ok(Some(ev)) =
        tokio::time::timeout(std::time::Duration::from_millis(500), w.next()).await
    {
        ev.unwrap();
        n += 1;
    }
    // Every create, update and delete after revision 1.
    assert_eq!(n, 16 * 20 * 2 + 16 * 7 - 1);
    // And the store keeps working: revisions go on from where they were.
    let kv = s
        .create("/re/new", bytes::Bytes::from_static(b"x"))
        .await
        .unwrap();
    assert_eq!(kv.mod_revision, rev + 1);
}

#[tokio::test]
async fn a_file_in_the_older_layout_is_refused() {
    use redb::{ReadableDatabase, TableDefinition};
    // Layout 1: the latest state in `kv`, every version again in `hist`.
    const KV: TableDefinition<&str, &[u8]> = TableDefinition::new("kv");
    const HIST: TableDefinition<(&str, u64), &[u8]> = TableDefinition::new("hist");
    const LOG: TableDefinition<u64, &str> = TableDefinition::new("log");
    const META: TableDefinition<&str, u64> = TableDefinition::new("meta");
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store.redb");
    {
        let db = redb::Database::create(&path).unwrap();
        let w = db.begin_write().unwrap();
        {
            let mut value = 1i64.to_le_bytes().to_vec();
            value.extend_from_slice(&1i64.to_le_bytes());
            value.extend_from_slice(b"v");
            w.open_table(KV)
                .unwrap()
                .insert("/k", value.as_slice())
                .unwrap();
            w.open_table(HIST)
                .unwrap()
                .insert(("/k", 1u64), [0u8, 1, 0, 0, 0, 0, 0, 0, 0, b'v'].as_slice())
                .unwrap();
            w.open_table(LOG).unwrap().insert(1u64, "/k").unwrap();
            let mut meta = w.open_table(META).unwrap();
            meta.insert("revision", 1u64).unwrap();
            meta.insert("compacted", 0u64).unwrap();
        }
        w.commit().unwrap();
    }
    match RedbStore::open(&path, Default::default()) {
        Err(skiff_store::Error::Backend(msg)) => {
            assert!(msg.contains("layout 1"), "{msg}");
            assert!(msg.contains("move the file aside"), "{msg}");
        }
        Err(e) => panic!("expected a backend error naming the layout, got {e}"),
        Ok(_) => panic!("a layout 1 file was opened"),
    }
    // The file is left as it was.
    let db = redb::Database::open(&path).unwrap();
    let r = db.begin_read().unwrap();
    assert_eq!(
        r.open_table(KV)
            .unwrap()
            .get("/k")
            .unwrap()
            .unwrap()
            .value()
            .len(),
        17
    );
    assert!(r.open_table(META).unwrap().get("layout").unwrap().is_none());
}

#[tokio::test]
async fn an_empty_store_reopens_in_its_layout() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store.redb");
    let s = RedbStore::open(&path, Default::default()).unwrap();
    s.close();
    drop(s);
    let s = reopen(&path).await;
    assert_eq!(s.current_revision().await.unwrap(), 0);
    assert!(s.get("/k").await.unwrap().is_none());
}

/// A store whose event ring holds only 16 events.
fn small_ring_store() -> Arc<RedbStore> {
    let dir = tempfile::tempdir().unwrap().keep();
    let opts = skiff_store::RedbOptions {
        watch_buffer: 16,
        ..Default::default()
    };
    RedbStore::open(&dir.join("store.redb"), opts).unwrap()
}

/// Creates `/w/0` … `/w/(n-1)` concurrently (the committer batches them).
async fn create_many(s: &RedbStore, n: usize) {
    let keys: Vec<String> = (0..n).map(|i| format!("/w/{i}")).collect();
    let writes = keys
        .iter()
        .map(|k| s.create(k, bytes::Bytes::from_static(b"v")));
    for r in futures::future::join_all(writes).await {
        r.unwrap();
    }
}

#[tokio::test]
async fn a_watcher_left_behind_by_the_event_ring_catches_up_from_history() {
    let s = small_ring_store();
    let mut w = s.watch("/w/", 0, None).await.unwrap();
    // Nobody reads the watch while 3,000 events pass a ring of 16.
    create_many(&s, 3000).await;
    let mut seen = std::collections::HashSet::new();
    let mut last = 0;
    while seen.len() < 3000 {
        let ev = tokio::time::timeout(std::time::Duration::from_secs(10), w.next())
            .await
            .expect("the watch delivers every event")
            .expect("the watch stays open")
            .expect("no error: the watcher caught up");
        let skiff_store::Event::Put { kv, .. } = ev else {
            panic!("only creations happened: {ev:?}")
        };
        assert!(kv.mod_revision > last, "events arrive in revision order");
        last = kv.mod_revision;
        assert!(seen.insert(kv.key), "each event once");
    }
    // And it goes on with live events.
    s.create("/w/after", bytes::Bytes::from_static(b"v"))
        .await
        .unwrap();
    let ev = tokio::time::timeout(std::time::Duration::from_secs(10), w.next())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert!(matches!(ev, skiff_store::Event::Put { kv, .. } if kv.key == "/w/after"));
}

#[tokio::test]
async fn a_watcher_left_behind_past_a_compaction_gets_compacted() {
    let s = small_ring_store();
    let mut w = s.watch("/w/", 0, None).await.unwrap();
    create_many(&s, 3000).await;
    s.compact(s.current_revision().await.unwrap())
        .await
        .unwrap();
    let mut events = 0;
    loop {
        let next = tokio::time::timeout(std::time::Duration::from_secs(10), w.next())
            .await
            .expect("the watch answers");
        match next {
            Some(Ok(_)) => events += 1,
            Some(Err(skiff_store::Error::Compacted { .. })) => break,
            other => panic!("expected Compacted after the buffered events, got {other:?}"),
        }
    }
    assert!(
        events < 3000,
        "the events compacted away were not delivered"
    );
}
