//! The store conformance suite and etcd-specific behaviour against a real
//! etcd (Debian's etcd 3.4) that each test starts on its own ports and data
//! dir and kills when it ends.

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures::StreamExt;
use skiff_store::testsuite::EtcdServer;
use skiff_store::{Error, EtcdOptions, EtcdStore, Event, ListOptions, Store};

skiff_store::conformance_tests!(async {
    let etcd = EtcdServer::start().await;
    let store: Arc<dyn Store> = etcd.store().await;
    (store, etcd)
});

fn b(s: &str) -> Bytes {
    Bytes::copy_from_slice(s.as_bytes())
}

async fn next(w: &mut skiff_store::WatchStream) -> Event {
    loop {
        let ev = tokio::time::timeout(Duration::from_secs(20), w.next())
            .await
            .expect("a watch event within 20s")
            .expect("the watch is open")
            .expect("no watch error");
        if !matches!(ev, Event::Progress { .. }) {
            return ev;
        }
    }
}

/// `--etcd-prefix`: the API server's `/registry/…` keys live under the
/// prefix in etcd, and stores with different prefixes do not see each other.
#[tokio::test]
async fn the_prefix_places_and_separates_keys() {
    let etcd = EtcdServer::start().await;
    let default = etcd.store().await;
    let other = EtcdStore::connect(EtcdOptions {
        prefix: "/skiff-b/".into(),
        ..etcd.options()
    })
    .await
    .unwrap();
    default
        .create("/registry/core/configmaps/ns/a", b("in default"))
        .await
        .unwrap();
    let kv = other
        .create("/registry/core/configmaps/ns/a", b("in b"))
        .await
        .unwrap();
    assert_eq!(kv.key, "/registry/core/configmaps/ns/a");
    let l = other
        .list("/registry/", ListOptions::default())
        .await
        .unwrap();
    assert_eq!(l.items.len(), 1);
    assert_eq!(l.items[0].key, "/registry/core/configmaps/ns/a");
    assert_eq!(l.items[0].value, b("in b"));
    assert_eq!(default.count("/registry/").await.unwrap(), 1);
    // What etcdctl shows: the raw keys.
    let mut raw = etcd_client::Client::connect([etcd.endpoint()], None)
        .await
        .unwrap();
    let r = raw
        .get(
            "/",
            Some(
                etcd_client::GetOptions::new()
                    .with_prefix()
                    .with_keys_only(),
            ),
        )
        .await
        .unwrap();
    let keys: Vec<_> = r.kvs().iter().map(|k| k.key_str().unwrap()).collect();
    assert_eq!(
        keys,
        [
            "/registry/core/configmaps/ns/a",
            "/skiff-b/core/configmaps/ns/a"
        ]
    );
}

/// etcd down: requests fail fast with Unavailable or Timeout; a watch
/// survives the outage and continues after the last revision it delivered,
/// with no gap and no duplicate.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_etcd_outage_fails_fast_and_watches_resume() {
    let mut etcd = EtcdServer::start().await;
    let s = etcd.store().await;
    let mut w = s.watch("/registry/", 0, None).await.unwrap();
    let a = s.create("/registry/x/a", b("a")).await.unwrap();
    match next(&mut w).await {
        Event::Put { kv, .. } => assert_eq!(kv, a),
        e => panic!("{e:?}"),
    }

    etcd.kill();
    let started = Instant::now();
    let r = s.get("/registry/x/a").await;
    assert!(
        matches!(r, Err(Error::Unavailable(_)) | Err(Error::Timeout(_))),
        "{r:?}"
    );
    let w2 = s.create("/registry/x/b", b("b")).await;
    assert!(
        matches!(w2, Err(Error::Unavailable(_)) | Err(Error::Timeout(_))),
        "{w2:?}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(12),
        "failing took {:?}",
        started.elapsed()
    );

    etcd.restart().await;
    // The client reconnects by itself.
    let deadline = Instant::now() + Duration::from_secs(30);
    let b1 = loop {
        match s.create("/registry/x/b", b("b")).await {
            Ok(kv) => break kv,
            Err(e) if Instant::now() < deadline => {
                let _ = e;
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(e) => panic!("etcd did not come back: {e}"),
        }
    };
    let c = s.create("/registry/x/c", b("c")).await.unwrap();
    let mut seen = Vec::new();
    for _ in 0..2 {
        match next(&mut w).await {
            Event::Put { kv, .. } => seen.push(kv),
            e => panic!("{e:?}"),
        }
    }
    assert_eq!(seen, [b1, c]);
    // Nothing more (no duplicate of a, b or c).
    let d = s.create("/registry/x/d", b("d")).await.unwrap();
    match next(&mut w).await {
        Event::Put { kv, .. } => assert_eq!(kv, d),
        e => panic!("{e:?}"),
    }
}

/// Two API servers compacting at once: one claims the compaction, both
/// succeed, and nobody compacts backwards.
#[tokio::test]
async fn compaction_is_claimed_once_and_never_goes_back() {
    let etcd = EtcdServer::start().await;
    let one = etcd.store().await;
    let two = etcd.store().await;
    let a = one.create("/k/a", b("1")).await.unwrap();
    let a2 = one.update("/k/a", b("2"), a.mod_revision).await.unwrap();
    let rev = one.current_revision().await.unwrap();
    let (x, y) = tokio::join!(one.compact(rev), two.compact(rev));
    x.unwrap();
    y.unwrap();
    assert_eq!(one.compacted_revision().await.unwrap(), rev);
    assert_eq!(two.compacted_revision().await.unwrap(), rev);
    two.compact(a.mod_revision).await.unwrap();
    assert_eq!(two.compacted_revision().await.unwrap(), rev);
    let r = two
        .list(
            "/k/",
            ListOptions {
                revision: Some(a.mod_revision),
                ..Default::default()
            },
        )
        .await;
    assert!(matches!(r, Err(Error::Compacted { .. })), "{r:?}");
    assert_eq!(two.get("/k/a").await.unwrap().unwrap(), a2);
    assert!(matches!(
        one.compact(rev + 100).await,
        Err(Error::FutureRevision { .. })
    ));
}

/// A store on an unreachable etcd fails to connect quickly.
#[tokio::test]
async fn connecting_to_nothing_fails_fast() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let started = Instant::now();
    let r = EtcdStore::connect(EtcdOptions {
        endpoints: vec![format!("http://127.0.0.1:{port}")],
        ..Default::default()
    })
    .await;
    assert!(
        matches!(r, Err(Error::Unavailable(_)) | Err(Error::Timeout(_))),
        "{:?}",
        r.err()
    );
    assert!(started.elapsed() < Duration::from_secs(8));
}

/// etcd serving TLS and requiring client certificates (kube-apiserver's
/// `--etcd-cafile`, `--etcd-certfile`, `--etcd-keyfile`): reads, writes and
/// watches work with the certificate; without one etcd refuses the client.
#[tokio::test]
async fn tls_with_client_certificates() {
    let etcd = EtcdServer::start_tls().await;
    assert!(etcd.endpoint().starts_with("https://"));
    let s = etcd.store().await;
    let mut w = s.watch("/registry/", 0, None).await.unwrap();
    let kv = s.create("/registry/x/a", b("over tls")).await.unwrap();
    assert_eq!(s.get("/registry/x/a").await.unwrap().unwrap(), kv);
    match next(&mut w).await {
        Event::Put { kv: got, .. } => assert_eq!(got, kv),
        e => panic!("{e:?}"),
    }
    let opts = etcd.options();
    let without_cert = EtcdStore::connect(EtcdOptions {
        tls: Some(skiff_store::EtcdTls {
            cert_pem: None,
            key_pem: None,
            ..opts.tls.clone().unwrap()
        }),
        request_timeout: Duration::from_secs(3),
        ..opts.clone()
    })
    .await;
    assert!(
        without_cert.is_err(),
        "connected without a client certificate"
    );
    let plain = EtcdStore::connect(EtcdOptions {
        endpoints: vec![etcd.endpoint().replace("https://", "http://")],
        tls: None,
        request_timeout: Duration::from_secs(3),
        ..opts
    })
    .await;
    assert!(plain.is_err(), "connected without TLS");
}
