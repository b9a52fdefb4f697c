//! The store conformance suite against the embedded redb backend.

use std::sync::Arc;

use skiff_store::{testsuite, RedbStore, Store};

/// A store in a temp dir that lives as long as the test process.
fn store() -> Arc<dyn Store> {
    let dir = tempfile::tempdir().unwrap().keep();
    RedbStore::open(&dir.join("store.redb"), Default::default()).unwrap()
}

macro_rules! conformance {
    ($($name:ident),* $(,)?) => {
        $(
            #[tokio::test]
            async fn $name() {
                testsuite::$name(store()).await;
            }
        )*
    };
}

conformance!(
    create_then_get,
    update_requires_the_current_revision,
    delete_with_and_without_a_guard,
    list_is_ordered_and_prefix_isolated,
    pages_come_from_one_snapshot,
    future_revisions_are_refused,
    watch_from_now_sees_only_later_changes,
    watch_from_the_past_replays_then_follows,
    idle_watches_get_progress,
    compaction_forgets_history_but_keeps_values,
    concurrent_writes_are_all_kept,
);

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
