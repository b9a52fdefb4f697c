//! The etcd backend on a three-member etcd cluster (Debian's etcd 3.4,
//! started by each test on its own loopback ports): losing any one member —
//! the first listed, the leader, a follower — leaves reads, writes and
//! watches working through the others, a store connects while a member is
//! down, and it learns members it was not given from etcd's member list.

use std::time::{Duration, Instant};

use bytes::Bytes;
use futures::StreamExt;
use skiff_store::testsuite::EtcdCluster;
use skiff_store::{Error, EtcdOptions, EtcdStore, Event, Store};

fn b(s: &str) -> Bytes {
    Bytes::copy_from_slice(s.as_bytes())
}

/// Options listing every member, without member discovery (so only the
/// listed endpoints are tried).
fn listed(c: &EtcdCluster) -> EtcdOptions {
    EtcdOptions {
        member_sync_interval: None,
        ..c.options()
    }
}

/// `count` creates under `prefix`, one after another: how many failed, each
/// with an error a client retries (503 or 504 upstream); anything else fails
/// the test.
async fn writes(store: &EtcdStore, prefix: &str, count: usize) -> usize {
    let mut failed = 0;
    for i in 0..count {
        match store.create(&format!("{prefix}{i}"), b("v")).await {
            Ok(_) => {}
            Err(Error::Unavailable(_) | Error::Timeout(_)) => failed += 1,
            Err(e) => panic!("create {prefix}{i}: {e}"),
        }
    }
    failed
}

/// Kills each member in turn — the first listed, then the leader, then a
/// follower — with writes, reads and a watch going on: writes fail only
/// around a lost leader (the one its member had forwarded to it, and those
/// while a loaded machine elects another), every read answers, and the
/// watch delivers every write once, in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn losing_any_one_member_keeps_the_store_working() {
    let mut cluster = EtcdCluster::start(3).await;
    let store = EtcdStore::connect(listed(&cluster)).await.unwrap();
    let mut watch = store.watch("/registry/w/", 0, None).await.unwrap();
    assert_eq!(writes(&store, "/registry/w/before-", 5).await, 0);

    for round in 0..3 {
        let victim = match round {
            0 => 0,
            1 => cluster.leader().await.expect("a leader"),
            _ => {
                let leader = cluster.leader().await.expect("a leader");
                (0..3).rev().find(|i| *i != leader).unwrap()
            }
        };
        cluster.kill(victim);
        let prefix = format!("/registry/w/r{round}-");
        let failed = writes(&store, &prefix, 40).await;
        assert!(
            failed <= 3,
            "round {round} (member {victim} killed): {failed} of 40 writes failed"
        );
        let l = store
            .list(&prefix, Default::default())
            .await
            .expect("a list with one member down");
        assert!(l.items.len() >= 40 - failed, "round {round}");
        assert!(store.get(&format!("{prefix}39")).await.unwrap().is_some());
        cluster.restart(victim).await;
    }

    // The watch saw every key written, once, in revision order.
    let all = store
        .list("/registry/w/", Default::default())
        .await
        .unwrap();
    let mut seen = Vec::new();
    let mut last = 0;
    let deadline = Instant::now() + Duration::from_secs(30);
    while seen.len() < all.items.len() {
        let left = deadline.saturating_duration_since(Instant::now());
        let ev = tokio::time::timeout(left, watch.next())
            .await
            .expect("every event within 30s")
            .expect("the watch is open")
            .expect("no watch error");
        if let Event::Put { kv, .. } = ev {
            assert!(kv.mod_revision > last, "events in order");
            last = kv.mod_revision;
            seen.push(kv.key);
        }
    }
    let mut want: Vec<String> = all.items.iter().map(|kv| kv.key.clone()).collect();
    want.sort();
    seen.sort();
    assert_eq!(seen, want);
}

/// A store given every member connects while the first listed is down,
/// and every request of it answers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_starts_while_the_first_listed_member_is_down() {
    let mut cluster = EtcdCluster::start(3).await;
    cluster.kill(0);
    for i in 0..5 {
        let store = EtcdStore::connect(listed(&cluster))
            .await
            .expect("connecting with two of three members up");
        let key = format!("/registry/s/{i}");
        store.create(&key, b("v")).await.expect("a create");
        assert!(store.get(&key).await.unwrap().is_some());
        assert_eq!(writes(&store, &format!("/registry/s/{i}-"), 5).await, 0);
    }
}

/// A store given one member learns the others from etcd's member list,
/// and keeps working when the one it was given dies.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_learns_the_other_members() {
    let mut cluster = EtcdCluster::start(3).await;
    let store = EtcdStore::connect(EtcdOptions {
        endpoints: vec![cluster.endpoint(1)],
        ..Default::default()
    })
    .await
    .unwrap();
    let mut known = store.endpoints();
    known.sort();
    let mut all = cluster.endpoints();
    all.sort();
    assert_eq!(known, all);
    cluster.kill(1);
    assert!(writes(&store, "/registry/d/", 10).await <= 3);
    assert!(store.get("/registry/d/9").await.unwrap().is_some());
}
