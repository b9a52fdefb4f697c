//! The embedded store on redb: MVCC history for reads and watches at past
//! revisions, group commit (one durable transaction per batch of concurrent
//! writes, each acknowledged only after its commit), and compaction.
//!
//! Tables:
//! - `kv`: key → (create revision, mod revision, value): the latest state;
//! - `hist`: (key, revision) → value or tombstone: every version since the
//!   last compaction;
//! - `log`: revision → key: the order of writes, for watches;
//! - `meta`: the current and the compacted revision.

use std::path::Path;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{mpsc, Arc};
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use futures::StreamExt;
use redb::{Database, Durability, ReadableDatabase, ReadableTable, TableDefinition};
use tokio::sync::{broadcast, oneshot};

use crate::{Error, Event, KeyValue, ListOptions, ListResult, Result, Store, WatchStream};

const KV: TableDefinition<&str, &[u8]> = TableDefinition::new("kv");
const HIST: TableDefinition<(&str, u64), &[u8]> = TableDefinition::new("hist");
const LOG: TableDefinition<u64, &str> = TableDefinition::new("log");
const META: TableDefinition<&str, u64> = TableDefinition::new("meta");

/// Tuning of the embedded store.
#[derive(Debug, Clone)]
pub struct RedbOptions {
    /// Most writes committed in one transaction.
    pub max_batch: usize,
    /// Events buffered for watchers before a slow one is dropped.
    pub watch_buffer: usize,
}

impl Default for RedbOptions {
    fn default() -> Self {
        RedbOptions {
            max_batch: 2048,
            watch_buffer: 65536,
        }
    }
}

enum OpKind {
    Create,
    Update(i64),
    Delete(Option<i64>),
    Compact(i64),
}

struct Op {
    kind: OpKind,
    key: String,
    value: Bytes,
    reply: oneshot::Sender<Result<(KeyValue, i64)>>,
}

/// The redb-backed [`Store`].
pub struct RedbStore {
    db: Arc<Database>,
    tx: std::sync::Mutex<Option<mpsc::Sender<Op>>>,
    events: broadcast::Sender<Arc<Event>>,
    revision: Arc<AtomicI64>,
    compacted: Arc<AtomicI64>,
}

fn backend<E: std::fmt::Display>(e: E) -> Error {
    Error::Backend(e.to_string())
}

fn enc_kv(create: i64, modr: i64, value: &[u8]) -> Vec<u8> {
    let mut v = Vec::with_capacity(16 + value.len());
    v.extend_from_slice(&create.to_le_bytes());
    v.extend_from_slice(&modr.to_le_bytes());
    v.extend_from_slice(value);
    v
}

fn dec_kv(key: &str, b: &[u8]) -> KeyValue {
    let create = i64::from_le_bytes(b[0..8].try_into().unwrap_or([0; 8]));
    let modr = i64::from_le_bytes(b[8..16].try_into().unwrap_or([0; 8]));
    KeyValue {
        key: key.to_string(),
        value: Bytes::copy_from_slice(&b[16..]),
        create_revision: create,
        mod_revision: modr,
    }
}

/// A history entry: 0 = put (create revision, value), 1 = tombstone.
fn enc_hist(tomb: bool, create: i64, value: &[u8]) -> Vec<u8> {
    let mut v = Vec::with_capacity(9 + value.len());
    v.push(tomb as u8);
    v.extend_from_slice(&create.to_le_bytes());
    v.extend_from_slice(value);
    v
}

fn dec_hist(key: &str, rev: u64, b: &[u8]) -> Option<KeyValue> {
    if b.first() == Some(&1) {
        return None;
    }
    let create = i64::from_le_bytes(b[1..9].try_into().unwrap_or([0; 8]));
    Some(KeyValue {
        key: key.to_string(),
        value: Bytes::copy_from_slice(&b[9..]),
        create_revision: create,
        mod_revision: rev as i64,
    })
}

impl RedbStore {
    /// Opens (or creates) the store at `path`.
    pub fn open(path: &Path, opts: RedbOptions) -> Result<Arc<RedbStore>> {
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent).map_err(backend)?;
        }
        let db = Database::create(path).map_err(backend)?;
        let (rev, compacted) = {
            let w = db.begin_write().map_err(backend)?;
            let r = {
                let _ = w.open_table(KV).map_err(backend)?;
                let _ = w.open_table(HIST).map_err(backend)?;
                let _ = w.open_table(LOG).map_err(backend)?;
                let meta = w.open_table(META).map_err(backend)?;
                let rev = meta
                    .get("revision")
                    .map_err(backend)?
                    .map(|g| g.value())
                    .unwrap_or(0);
                let comp = meta
                    .get("compacted")
                    .map_err(backend)?
                    .map(|g| g.value())
                    .unwrap_or(0);
                (rev as i64, comp as i64)
            };
            w.commit().map_err(backend)?;
            r
        };
        let db = Arc::new(db);
        let (tx, rx) = mpsc::channel::<Op>();
        let (events, _) = broadcast::channel(opts.watch_buffer.max(16));
        let revision = Arc::new(AtomicI64::new(rev));
        let compacted = Arc::new(AtomicI64::new(compacted));
        {
            let db = db.clone();
            let events = events.clone();
            let revision = revision.clone();
            let compacted = compacted.clone();
            let max_batch = opts.max_batch.max(1);
            std::thread::Builder::new()
                .name("skiff-store-commit".into())
                .spawn(move || committer(db, rx, events, revision, compacted, max_batch))
                .map_err(backend)?;
        }
        Ok(Arc::new(RedbStore {
            db,
            tx: std::sync::Mutex::new(Some(tx)),
            events,
            revision,
            compacted,
        }))
    }

    /// Stops accepting writes; pending ones finish.
    pub fn close(&self) {
        self.tx.lock().unwrap_or_else(|e| e.into_inner()).take();
    }

    async fn submit(&self, kind: OpKind, key: &str, value: Bytes) -> Result<(KeyValue, i64)> {
        let (reply, rx) = oneshot::channel();
        {
            let guard = self.tx.lock().unwrap_or_else(|e| e.into_inner());
            let tx = guard.as_ref().ok_or(Error::Closed)?;
            tx.send(Op {
                kind,
                key: key.to_string(),
                value,
                reply,
            })
            .map_err(|_| Error::Closed)?;
        }
        rx.await.map_err(|_| Error::Closed)?
    }

    fn check_revision(&self, rev: i64) -> Result<()> {
        let compacted = self.compacted.load(Ordering::Acquire);
        if rev < compacted {
            return Err(Error::Compacted {
                requested: rev,
                compacted,
            });
        }
        let current = self.revision.load(Ordering::Acquire);
        if rev > current {
            return Err(Error::FutureRevision {
                requested: rev,
                current,
            });
        }
        Ok(())
    }

    /// Events with revision > `after`, read from history (for watch catch-up).
    fn replay(&self, prefix: &str, after: i64) -> Result<Vec<Event>> {
        let r = self.db.begin_read().map_err(backend)?;
        let log = r.open_table(LOG).map_err(backend)?;
        let hist = r.open_table(HIST).map_err(backend)?;
        let mut out = Vec::new();
        for item in log.range((after as u64 + 1)..).map_err(backend)? {
            let (rev, key) = item.map_err(backend)?;
            let rev = rev.value();
            let key = key.value().to_string();
            if !key.starts_with(prefix) {
                continue;
            }
            let Some(cur) = hist.get((key.as_str(), rev)).map_err(backend)? else {
                continue;
            };
            let cur = dec_hist(&key, rev, cur.value());
            let prev = hist
                .range((key.as_str(), 0u64)..(key.as_str(), rev))
                .map_err(backend)?
                .next_back()
                .transpose()
                .map_err(backend)?
                .and_then(|(k, v)| dec_hist(&key, k.value().1, v.value()));
            out.push(match cur {
                Some(kv) => Event::Put { kv, prev },
                None => match prev {
                    Some(p) => Event::Delete {
                        prev: p,
                        revision: rev as i64,
                    },
                    None => continue,
                },
            });
        }
        Ok(out)
    }
}

/// Applies batches of writes, one durable transaction each.
fn committer(
    db: Arc<Database>,
    rx: mpsc::Receiver<Op>,
    events: broadcast::Sender<Arc<Event>>,
    revision: Arc<AtomicI64>,
    compacted: Arc<AtomicI64>,
    max_batch: usize,
) {
    while let Ok(first) = rx.recv() {
        let mut batch = vec![first];
        while batch.len() < max_batch {
            match rx.try_recv() {
                Ok(op) => batch.push(op),
                Err(_) => break,
            }
        }
        let mut rev = revision.load(Ordering::Acquire);
        let mut compact_to = compacted.load(Ordering::Acquire);
        let mut results: Vec<Result<(KeyValue, i64)>> = Vec::with_capacity(batch.len());
        let mut new_events: Vec<Event> = Vec::new();
        let outcome = (|| -> std::result::Result<(), Error> {
            let mut w = db.begin_write().map_err(backend)?;
            w.set_durability(Durability::Immediate).map_err(backend)?;
            {
                let mut kv = w.open_table(KV).map_err(backend)?;
                let mut hist = w.open_table(HIST).map_err(backend)?;
                let mut log = w.open_table(LOG).map_err(backend)?;
                let mut meta = w.open_table(META).map_err(backend)?;
                for op in &batch {
                    let current = kv
                        .get(op.key.as_str())
                        .map_err(backend)?
                        .map(|g| dec_kv(&op.key, g.value()));
                    let r = match op.kind {
                        OpKind::Compact(to) => {
                            if to > compact_to && to <= rev {
                                compact(&mut hist, &mut log, to as u64)?;
                                compact_to = to;
                            }
                            Ok((
                                KeyValue {
                                    key: String::new(),
                                    value: Bytes::new(),
                                    create_revision: 0,
                                    mod_revision: 0,
                                },
                                compact_to,
                            ))
                        }
                        OpKind::Create => match current {
                            Some(_) => Err(Error::AlreadyExists(op.key.clone())),
                            None => {
                                rev += 1;
                                let item = KeyValue {
                                    key: op.key.clone(),
                                    value: op.value.clone(),
                                    create_revision: rev,
                                    mod_revision: rev,
                                };
                                kv.insert(op.key.as_str(), enc_kv(rev, rev, &op.value).as_slice())
                                    .map_err(backend)?;
                                hist.insert(
                                    (op.key.as_str(), rev as u64),
                                    enc_hist(false, rev, &op.value).as_slice(),
                                )
                                .map_err(backend)?;
                                log.insert(rev as u64, op.key.as_str()).map_err(backend)?;
                                new_events.push(Event::Put {
                                    kv: item.clone(),
                                    prev: None,
                                });
                                Ok((item, rev))
                            }
                        },
                        OpKind::Update(expected) => match current {
                            None => Err(Error::NotFound(op.key.clone())),
                            Some(cur) if cur.mod_revision != expected => Err(Error::Conflict {
                                key: op.key.clone(),
                                expected,
                                current: Some(cur),
                            }),
                            Some(cur) => {
                                rev += 1;
                                let item = KeyValue {
                                    key: op.key.clone(),
                                    value: op.value.clone(),
                                    create_revision: cur.create_revision,
                                    mod_revision: rev,
                                };
                                kv.insert(
                                    op.key.as_str(),
                                    enc_kv(cur.create_revision, rev, &op.value).as_slice(),
                                )
                                .map_err(backend)?;
                                hist.insert(
                                    (op.key.as_str(), rev as u64),
                                    enc_hist(false, cur.create_revision, &op.value).as_slice(),
                                )
                                .map_err(backend)?;
                                log.insert(rev as u64, op.key.as_str()).map_err(backend)?;
                                new_events.push(Event::Put {
                                    kv: item.clone(),
                                    prev: Some(cur),
                                });
                                Ok((item, rev))
                            }
                        },
                        OpKind::Delete(expected) => match current {
                            None => Err(Error::NotFound(op.key.clone())),
                            Some(cur)
                                if expected.map(|e| e != cur.mod_revision).unwrap_or(false) =>
                            {
                                Err(Error::Conflict {
                                    key: op.key.clone(),
                                    expected: expected.unwrap_or(0),
                                    current: Some(cur),
                                })
                            }
                            Some(cur) => {
                                rev += 1;
                                kv.remove(op.key.as_str()).map_err(backend)?;
                                hist.insert(
                                    (op.key.as_str(), rev as u64),
                                    enc_hist(true, 0, &[]).as_slice(),
                                )
                                .map_err(backend)?;
                                log.insert(rev as u64, op.key.as_str()).map_err(backend)?;
                                new_events.push(Event::Delete {
                                    prev: cur.clone(),
                                    revision: rev,
                                });
                                Ok((cur, rev))
                            }
                        },
                    };
                    results.push(r);
                }
                meta.insert("revision", rev as u64).map_err(backend)?;
                meta.insert("compacted", compact_to as u64)
                    .map_err(backend)?;
            }
            w.commit().map_err(backend)?;
            Ok(())
        })();
        match outcome {
            Ok(()) => {
                compacted.store(compact_to, Ordering::Release);
                revision.store(rev, Ordering::Release);
                for ev in new_events {
                    let _ = events.send(Arc::new(ev));
                }
                for (op, r) in batch.into_iter().zip(results) {
                    let _ = op.reply.send(r);
                }
            }
            Err(e) => {
                for op in batch {
                    let _ = op.reply.send(Err(e.clone()));
                }
            }
        }
    }
}

/// Drops history at or below `to`, keeping the latest live version of each key.
fn compact(
    hist: &mut redb::Table<(&str, u64), &[u8]>,
    log: &mut redb::Table<u64, &str>,
    to: u64,
) -> Result<()> {
    let mut keys: Vec<String> = Vec::new();
    for item in log.range(..=to).map_err(backend)? {
        let (_, k) = item.map_err(backend)?;
        keys.push(k.value().to_string());
    }
    keys.sort();
    keys.dedup();
    for key in keys {
        let versions: Vec<(u64, bool)> = hist
            .range((key.as_str(), 0u64)..=(key.as_str(), to))
            .map_err(backend)?
            .filter_map(|i| i.ok())
            .map(|(k, v)| (k.value().1, v.value().first() == Some(&1)))
            .collect();
        let Some(&(last_rev, last_tomb)) = versions.last() else {
            continue;
        };
        for (r, _) in &versions {
            if *r != last_rev || last_tomb {
                hist.remove((key.as_str(), *r)).map_err(backend)?;
            }
        }
    }
    let revs: Vec<u64> = log
        .range(..=to)
        .map_err(backend)?
        .filter_map(|i| i.ok())
        .map(|(r, _)| r.value())
        .collect();
    for r in revs {
        log.remove(r).map_err(backend)?;
    }
    Ok(())
}

#[async_trait]
impl Store for RedbStore {
    async fn get(&self, key: &str) -> Result<Option<KeyValue>> {
        let r = self.db.begin_read().map_err(backend)?;
        let kv = r.open_table(KV).map_err(backend)?;
        Ok(kv
            .get(key)
            .map_err(backend)?
            .map(|g| dec_kv(key, g.value())))
    }

    async fn list(&self, prefix: &str, opts: ListOptions) -> Result<ListResult> {
        let current = self.revision.load(Ordering::Acquire);
        let at = opts.revision.filter(|r| *r > 0);
        if let Some(r) = at {
            self.check_revision(r)?;
        }
        let r = self.db.begin_read().map_err(backend)?;
        let limit = if opts.limit > 0 {
            opts.limit as usize
        } else {
            usize::MAX
        };
        let mut items = Vec::new();
        let mut remaining = 0i64;
        let start = opts
            .start_after
            .clone()
            .unwrap_or_else(|| prefix.to_string());
        match at {
            Some(rev) if rev < current => {
                let hist = r.open_table(HIST).map_err(backend)?;
                let mut cur_key: Option<String> = None;
                let mut best: Option<KeyValue> = None;
                let flush = |key: Option<String>,
                             best: Option<KeyValue>,
                             items: &mut Vec<KeyValue>,
                             remaining: &mut i64| {
                    if let (Some(_), Some(kv)) = (key, best) {
                        if items.len() < limit {
                            items.push(kv);
                        } else {
                            *remaining += 1;
                        }
                    }
                };
                for item in hist.range((start.as_str(), 0u64)..).map_err(backend)? {
                    let (k, v) = item.map_err(backend)?;
                    let (key, krev) = k.value();
                    if !key.starts_with(prefix) {
                        break;
                    }
                    if opts.start_after.as_deref() == Some(key) {
                        continue;
                    }
                    if cur_key.as_deref() != Some(key) {
                        flush(cur_key.take(), best.take(), &mut items, &mut remaining);
                        cur_key = Some(key.to_string());
                    }
                    if krev as i64 <= rev {
                        best = dec_hist(key, krev, v.value());
                    }
                }
                flush(cur_key.take(), best.take(), &mut items, &mut remaining);
                Ok(ListResult {
                    items,
                    revision: rev,
                    more: remaining > 0,
                    remaining,
                })
            }
            _ => {
                let kv = r.open_table(KV).map_err(backend)?;
                for item in kv.range(start.as_str()..).map_err(backend)? {
                    let (k, v) = item.map_err(backend)?;
                    let key = k.value();
                    if !key.starts_with(prefix) {
                        break;
                    }
                    if opts.start_after.as_deref() == Some(key) {
                        continue;
                    }
                    if items.len() < limit {
                        items.push(dec_kv(key, v.value()));
                    } else {
                        remaining += 1;
                    }
                }
                // The revision of this snapshot is the one committed with it.
                let meta = r.open_table(META).map_err(backend)?;
                let rev = meta
                    .get("revision")
                    .map_err(backend)?
                    .map(|g| g.value() as i64)
                    .unwrap_or(0);
                Ok(ListResult {
                    items,
                    revision: rev,
                    more: remaining > 0,
                    remaining,
                })
            }
        }
    }

    async fn count(&self, prefix: &str) -> Result<i64> {
        let r = self.db.begin_read().map_err(backend)?;
        let kv = r.open_table(KV).map_err(backend)?;
        let mut n = 0;
        for item in kv.range(prefix..).map_err(backend)? {
            let (k, _) = item.map_err(backend)?;
            if !k.value().starts_with(prefix) {
                break;
            }
            n += 1;
        }
        Ok(n)
    }

    async fn create(&self, key: &str, value: Bytes) -> Result<KeyValue> {
        self.submit(OpKind::Create, key, value)
            .await
            .map(|(kv, _)| kv)
    }

    async fn update(&self, key: &str, value: Bytes, expected_revision: i64) -> Result<KeyValue> {
        self.submit(OpKind::Update(expected_revision), key, value)
            .await
            .map(|(kv, _)| kv)
    }

    async fn delete(&self, key: &str, expected_revision: Option<i64>) -> Result<(KeyValue, i64)> {
        self.submit(OpKind::Delete(expected_revision), key, Bytes::new())
            .await
    }

    async fn watch(
        &self,
        prefix: &str,
        after_revision: i64,
        progress_interval: Option<Duration>,
    ) -> Result<WatchStream> {
        // Subscribe before reading history so nothing falls between the two.
        let mut rx = self.events.subscribe();
        let current = self.revision.load(Ordering::Acquire);
        let start = if after_revision <= 0 {
            current
        } else {
            after_revision
        };
        let compacted = self.compacted.load(Ordering::Acquire);
        if after_revision > 0 && after_revision < compacted {
            return Err(Error::Compacted {
                requested: after_revision,
                compacted,
            });
        }
        let backlog = if start < current {
            self.replay(prefix, start)?
        } else {
            Vec::new()
        };
        let prefix = prefix.to_string();
        let revision = self.revision.clone();
        let (tx, out) = tokio::sync::mpsc::channel::<Result<Event>>(1024);
        tokio::spawn(async move {
            let mut last = start;
            for ev in backlog {
                last = ev.revision();
                if tx.send(Ok(ev)).await.is_err() {
                    return;
                }
            }
            let period = progress_interval.unwrap_or(Duration::from_secs(3600));
            loop {
                let next = tokio::select! {
                    r = rx.recv() => r,
                    _ = tokio::time::sleep(period), if progress_interval.is_some() => {
                        let rev = revision.load(Ordering::Acquire).max(last);
                        if tx.send(Ok(Event::Progress { revision: rev })).await.is_err() {
                            return;
                        }
                        continue;
                    }
                    _ = tx.closed() => return,
                };
                match next {
                    Ok(ev) => {
                        let rev = ev.revision();
                        if rev <= last {
                            continue;
                        }
                        let key = match &*ev {
                            Event::Put { kv, .. } => &kv.key,
                            Event::Delete { prev, .. } => &prev.key,
                            Event::Progress { .. } => continue,
                        };
                        last = rev;
                        if key.starts_with(&prefix) && tx.send(Ok((*ev).clone())).await.is_err() {
                            return;
                        }
                    }
                    Err(broadcast::error::RecvError::Lagged(_)) => {
                        let _ = tx
                            .send(Err(Error::Backend("watcher fell too far behind".into())))
                            .await;
                        return;
                    }
                    Err(broadcast::error::RecvError::Closed) => return,
                }
            }
        });
        Ok(tokio_stream::wrappers::ReceiverStream::new(out).boxed())
    }

    async fn current_revision(&self) -> Result<i64> {
        Ok(self.revision.load(Ordering::Acquire))
    }

    async fn compact(&self, revision: i64) -> Result<()> {
        let current = self.revision.load(Ordering::Acquire);
        if revision > current {
            return Err(Error::FutureRevision {
                requested: revision,
                current,
            });
        }
        self.submit(OpKind::Compact(revision), "", Bytes::new())
            .await
            .map(|_| ())
    }

    async fn compacted_revision(&self) -> Result<i64> {
        Ok(self.compacted.load(Ordering::Acquire))
    }
}
