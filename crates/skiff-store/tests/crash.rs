//! Crash safety: a writer process is killed with SIGKILL in the middle of
//! concurrent writes; after reopening, every write it saw acknowledged is
//! there with its value, and the store is consistent.
//!
//! The test runs its own binary again as the writer child (selected by an
//! environment variable) and kills only that child.

use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::time::Duration;

use skiff_store::{ListOptions, RedbStore, Store};

const CHILD_ENV: &str = "SKIFF_STORE_CRASH_CHILD";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killing_the_writer_loses_no_acknowledged_write() {
    if let Ok(path) = std::env::var(CHILD_ENV) {
        return writer(&path).await;
    }
    for round in 0..3 {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("store.redb");
        let mut child = Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "killing_the_writer_loses_no_acknowledged_write",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(CHILD_ENV, &path)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let stdout = child.stdout.take().unwrap();
        let (tx, rx) = std::sync::mpsc::channel::<String>();
        let reader = std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        // Let it write for a while (at least 200 acknowledged writes), then kill it.
        let mut acked: Vec<(String, i64)> = Vec::new();
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        while acked.len() < 200 + round * 100 && std::time::Instant::now() < deadline {
            if let Ok(line) = rx.recv_timeout(Duration::from_millis(100)) {
                if let Some((k, r)) = line.strip_prefix("ACK ").and_then(|l| l.split_once(' ')) {
                    acked.push((k.to_string(), r.parse().unwrap()));
                }
            }
        }
        child.kill().unwrap();
        child.wait().unwrap();
        reader.join().unwrap();
        while let Ok(line) = rx.try_recv() {
            if let Some((k, r)) = line.strip_prefix("ACK ").and_then(|l| l.split_once(' ')) {
                acked.push((k.to_string(), r.parse().unwrap()));
            }
        }
        assert!(
            acked.len() >= 200,
            "the writer acknowledged only {} writes",
            acked.len()
        );

        let store = RedbStore::open(&path, Default::default()).unwrap();
        let current = store.current_revision().await.unwrap();
        for (key, rev) in &acked {
            let kv = store
                .get(key)
                .await
                .unwrap()
                .unwrap_or_else(|| panic!("acknowledged {key} is missing"));
            assert_eq!(kv.mod_revision, *rev);
            assert_eq!(&kv.value[..], key.as_bytes());
            assert!(current >= *rev);
        }
        let all = store.list("/crash/", ListOptions::default()).await.unwrap();
        let mut revs: Vec<i64> = all.items.iter().map(|kv| kv.mod_revision).collect();
        revs.sort();
        revs.dedup();
        assert_eq!(revs.len(), all.items.len(), "revisions are unique");
        assert!(all.items.len() >= acked.len());
        // The reopened store keeps working.
        store
            .create("/crash/after", bytes::Bytes::from_static(b"x"))
            .await
            .unwrap();
    }
}

async fn writer(path: &str) {
    let store = RedbStore::open(std::path::Path::new(path), Default::default()).unwrap();
    let out = std::sync::Arc::new(std::sync::Mutex::new(std::io::stdout()));
    let mut tasks = Vec::new();
    for t in 0..8 {
        let store = store.clone();
        let out = out.clone();
        tasks.push(tokio::spawn(async move {
            for i in 0.. {
                let key = format!("/crash/{t}/{i:06}");
                let kv = store
                    .create(&key, bytes::Bytes::from(key.clone().into_bytes()))
                    .await
                    .unwrap();
                let mut o = out.lock().unwrap();
                writeln!(o, "ACK {key} {}", kv.mod_revision).unwrap();
                o.flush().unwrap();
            }
        }));
    }
    for t in tasks {
        let _ = t.await;
    }
}
