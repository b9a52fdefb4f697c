//! The embedded store on redb: MVCC history for reads and watches at past
//! revisions, group commit (one durable transaction per batch of concurrent
//! writes, each acknowledged only after its commit), and compaction.
//!
//! Tables (on-disk layout 2; each value is stored once):
//! - `revisions`: revision → (create revision, key, value): every write since
//!   the last compaction, in order, plus the latest version of every key that
//!   was live at the compacted revision. A deletion is a record with create
//!   revision 0 and no value. This is the only copy of each value, and
//!   appending by revision touches only the right edge of the tree.
//! - `versions`: (key, revision) → create revision (0: deleted): the versions
//!   of each key, small entries; the last one of a key is its current state.
//! - `meta`: the layout, the current and the compacted revision.
//!
//! Layout 1 (tables `kv`, `hist`, `log`: every value written twice) is
//! refused with an error when opened; it is not migrated.

use std::path::Path;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use bytes::Bytes;
use futures::StreamExt;
use redb::{Database, Durability, ReadableDatabase, ReadableTable, TableDefinition, TableHandle};
use tokio::sync::{broadcast, oneshot};

use crate::trace::BatchTimes;
use crate::{Error, Event, KeyValue, ListOptions, ListResult, Result, Store, WatchStream, Write};

const REVISIONS: TableDefinition<u64, &[u8]> = TableDefinition::new("revisions");
const VERSIONS: TableDefinition<(&str, u64), u64> = TableDefinition::new("versions");
const META: TableDefinition<&str, u64> = TableDefinition::new("meta");

/// The on-disk layout this code reads and writes (`meta["layout"]`; a file
/// without it is layout 1).
const LAYOUT: u64 = 2;

/// Tuning of the embedded store.
#[derive(Debug, Clone)]
pub struct RedbOptions {
    /// Most writes committed in one transaction.
    pub max_batch: usize,
    /// Events buffered for watchers before a slow one is dropped. The
    /// ring keeps its last `watch_buffer` events alive (their values), so
    /// this is memory held at all times once the store has been busy.
    pub watch_buffer: usize,
    /// redb's page cache in bytes (redb's default is 1 GiB). The watch
    /// cache serves reads; this serves the B-tree pages writes touch.
    /// redb moves every page a commit writes into this cache, so under
    /// churn it fills to the bound whatever the working set: it is memory
    /// held at all times (256 MiB was ~8.9 KB per pod at 30,000 pods).
    /// Pages it misses are read back from the kernel's page cache.
    pub cache_bytes: usize,
}

impl Default for RedbOptions {
    fn default() -> Self {
        RedbOptions {
            max_batch: 2048,
            watch_buffer: 16384,
            cache_bytes: 32 << 20,
        }
    }
}

enum OpKind {
    Create,
    Update(i64),
    Delete(Option<i64>),
    Compact(i64),
    /// Several creates and updates, all or none ([`Store::commit`]).
    Commit(Vec<Write>),
}

/// What a write did: one item and the revision of the write, or a
/// commit's items.
enum Done {
    One(KeyValue, i64),
    Many(Vec<KeyValue>),
}

struct Op {
    kind: OpKind,
    key: String,
    value: Bytes,
    reply: oneshot::Sender<(Result<Done>, BatchTimes)>,
}

/// The redb-backed [`Store`].
pub struct RedbStore {
    db: Arc<Database>,
    tx: std::sync::Mutex<Option<mpsc::Sender<Op>>>,
    events: broadcast::Sender<Arc<Event>>,
    revision: Arc<AtomicI64>,
    compacted: Arc<AtomicI64>,
    /// Held while a revision is published with its events, so that a
    /// progress event never overtakes the events it vouches for.
    publish: Arc<std::sync::Mutex<()>>,
}

fn backend<E: std::fmt::Display>(e: E) -> Error {
    Error::Backend(e.to_string())
}

/// Writes the record of one revision into `buf`: create revision (0 for a
/// deletion), key length, key, value.
fn enc_record(buf: &mut Vec<u8>, create: i64, key: &str, value: &[u8]) {
    buf.clear();
    buf.reserve(12 + key.len() + value.len());
    buf.extend_from_slice(&(create as u64).to_le_bytes());
    buf.extend_from_slice(&(key.len() as u32).to_le_bytes());
    buf.extend_from_slice(key.as_bytes());
    buf.extend_from_slice(value);
}

/// A decoded record of the `revisions` table.
struct Record<'a> {
    create: u64,
    key: &'a str,
    value: &'a [u8],
}

fn dec_record(rev: u64, b: &[u8]) -> Result<Record<'_>> {
    let corrupt = || Error::Backend(format!("the record of revision {rev} is corrupt"));
    let create = u64::from_le_bytes(
        b.get(0..8)
            .ok_or_else(corrupt)?
            .try_into()
            .map_err(|_| corrupt())?,
    );
    let len = u32::from_le_bytes(
        b.get(8..12)
            .ok_or_else(corrupt)?
            .try_into()
            .map_err(|_| corrupt())?,
    ) as usize;
    let key = b.get(12..12 + len).ok_or_else(corrupt)?;
    let key = std::str::from_utf8(key).map_err(|_| corrupt())?;
    Ok(Record {
        create,
        key,
        value: &b[12 + len..],
    })
}

/// The last version of `key` at or below revision `at`: (revision, create
/// revision), the create revision 0 when that version is a deletion.
fn last_version<T: ReadableTable<(&'static str, u64), u64>>(
    versions: &T,
    key: &str,
    at: u64,
) -> Result<Option<(u64, u64)>> {
    match versions
        .range((key, 0u64)..=(key, at))
        .map_err(backend)?
        .next_back()
    {
        Some(item) => {
            let (k, v) = item.map_err(backend)?;
            Ok(Some((k.value().1, v.value())))
        }
        None => Ok(None),
    }
}

/// Writes version `rev` of `key`: its index entry and its one record
/// (create revision 0 and no value for a deletion).
fn put_version(
    versions: &mut redb::Table<(&str, u64), u64>,
    revisions: &mut redb::Table<u64, &[u8]>,
    buf: &mut Vec<u8>,
    (key, rev): (&str, i64),
    create: i64,
    value: &[u8],
) -> Result<()> {
    versions
        .insert((key, rev as u64), create as u64)
        .map_err(backend)?;
    enc_record(buf, create, key, value);
    revisions
        .insert(rev as u64, buf.as_slice())
        .map_err(backend)?;
    Ok(())
}

/// The live version of `key` at or below `at`, if any: (revision, create revision).
fn live_version<T: ReadableTable<(&'static str, u64), u64>>(
    versions: &T,
    key: &str,
    at: u64,
) -> Result<Option<(u64, u64)>> {
    Ok(last_version(versions, key, at)?.filter(|(_, create)| *create != 0))
}

/// The item `key` was at revision `rev` (a put with create revision `create`).
fn item_at<T: ReadableTable<u64, &'static [u8]>>(
    revisions: &T,
    key: &str,
    rev: u64,
    create: u64,
) -> Result<KeyValue> {
    let rec = revisions
        .get(rev)
        .map_err(backend)?
        .ok_or_else(|| Error::Backend(format!("revision {rev} of {key:?} is missing")))?;
    let r = dec_record(rev, rec.value())?;
    Ok(KeyValue {
        key: key.to_string(),
        value: Bytes::copy_from_slice(r.value),
        create_revision: create as i64,
        mod_revision: rev as i64,
    })
}

impl RedbStore {
    /// Opens (or creates) the store at `path`. A file in another on-disk
    /// layout is refused with [`Error::Backend`].
    pub fn open(path: &Path, opts: RedbOptions) -> Result<Arc<RedbStore>> {
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent).map_err(backend)?;
        }
        let db = redb::Builder::new()
            .set_cache_size(opts.cache_bytes)
            .create(path)
            .map_err(backend)?;
        let (rev, compacted) = {
            let w = db.begin_write().map_err(backend)?;
            let tables: Vec<String> = w
                .list_tables()
                .map_err(backend)?
                .map(|t| t.name().to_string())
                .collect();
            if !tables.is_empty() {
                let layout = if tables.iter().any(|t| t == META.name()) {
                    let meta = w.open_table(META).map_err(backend)?;
                    let layout = meta.get("layout").map_err(backend)?.map(|g| g.value());
                    layout.unwrap_or(1)
                } else {
                    1
                };
                if layout != LAYOUT {
                    w.abort().map_err(backend)?;
                    return Err(Error::Backend(format!(
                        "{}: the store file has on-disk layout {layout}, this skiff reads only layout {LAYOUT}; \
                         it is not converted: move the file aside to start an empty store",
                        path.display()
                    )));
                }
            }
            let r = {
                let _ = w.open_table(REVISIONS).map_err(backend)?;
                let _ = w.open_table(VERSIONS).map_err(backend)?;
                let mut meta = w.open_table(META).map_err(backend)?;
                meta.insert("layout", LAYOUT).map_err(backend)?;
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
        let publish = Arc::new(std::sync::Mutex::new(()));
        {
            let db = db.clone();
            let events = events.clone();
            let revision = revision.clone();
            let compacted = compacted.clone();
            let publish = publish.clone();
            let max_batch = opts.max_batch.max(1);
            std::thread::Builder::new()
                .name("skiff-store-commit".into())
                .spawn(move || committer(db, rx, events, revision, compacted, publish, max_batch))
                .map_err(backend)?;
        }
        Ok(Arc::new(RedbStore {
            db,
            tx: std::sync::Mutex::new(Some(tx)),
            events,
            revision,
            compacted,
            publish,
        }))
    }

    /// Stops accepting writes; pending ones finish.
    pub fn close(&self) {
        self.tx.lock().unwrap_or_else(|e| e.into_inner()).take();
    }

    async fn submit(&self, kind: OpKind, key: &str, value: Bytes) -> Result<(KeyValue, i64)> {
        match self.submit_op(kind, key, value).await? {
            Done::One(kv, rev) => Ok((kv, rev)),
            Done::Many(_) => Err(Error::Backend("a single write answered as a commit".into())),
        }
    }

    async fn submit_op(&self, kind: OpKind, key: &str, value: Bytes) -> Result<Done> {
        let (reply, rx) = oneshot::channel();
        let enqueued = Instant::now();
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
        let (r, times) = rx.await.map_err(|_| Error::Closed)?;
        crate::trace::record(enqueued, &times);
        r
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
        replay(&self.db, prefix, after)
    }
}

/// Events under `prefix` with revision > `after`, read from the revision
/// history (a watch starting in the past, or one catching up after it fell
/// behind the event ring).
fn replay(db: &Database, prefix: &str, after: i64) -> Result<Vec<Event>> {
    let r = db.begin_read().map_err(backend)?;
    // The compaction point of this very snapshot: revisions at or below it
    // are gone from it.
    let compacted = r
        .open_table(META)
        .map_err(backend)?
        .get("compacted")
        .map_err(backend)?
        .map_or(0, |g| g.value() as i64);
    if after > 0 && after < compacted {
        return Err(Error::Compacted {
            requested: after,
            compacted,
        });
    }
    let revisions = r.open_table(REVISIONS).map_err(backend)?;
    let versions = r.open_table(VERSIONS).map_err(backend)?;
    let mut out = Vec::new();
    for item in revisions
        .range((after.max(0) as u64 + 1)..)
        .map_err(backend)?
    {
        let (rev, rec) = item.map_err(backend)?;
        let rev = rev.value();
        let rec = rec.value();
        let rec = dec_record(rev, rec)?;
        if !rec.key.starts_with(prefix) {
            continue;
        }
        let prev = match live_version(&versions, rec.key, rev - 1)? {
            Some((prev_rev, create)) => Some(item_at(&revisions, rec.key, prev_rev, create)?),
            None => None,
        };
        out.push(if rec.create != 0 {
            Event::Put {
                kv: KeyValue {
                    key: rec.key.to_string(),
                    value: Bytes::copy_from_slice(rec.value),
                    create_revision: rec.create as i64,
                    mod_revision: rev as i64,
                },
                prev,
            }
        } else {
            match prev {
                Some(p) => Event::Delete {
                    prev: p,
                    revision: rev as i64,
                },
                None => continue,
            }
        });
    }
    Ok(out)
}

/// Applies batches of writes, one durable transaction each.
fn committer(
    db: Arc<Database>,
    rx: mpsc::Receiver<Op>,
    events: broadcast::Sender<Arc<Event>>,
    revision: Arc<AtomicI64>,
    compacted: Arc<AtomicI64>,
    publish: Arc<std::sync::Mutex<()>>,
    max_batch: usize,
) {
    // The record being inserted, reused across writes.
    let mut buf: Vec<u8> = Vec::new();
    while let Ok(first) = rx.recv() {
        let mut batch = vec![first];
        while batch.len() < max_batch {
            match rx.try_recv() {
                Ok(op) => batch.push(op),
                Err(_) => break,
            }
        }
        let batch_start = Instant::now();
        let mut commit_start = batch_start;
        let mut rev = revision.load(Ordering::Acquire);
        let mut compact_to = compacted.load(Ordering::Acquire);
        let mut results: Vec<Result<Done>> = Vec::with_capacity(batch.len());
        let mut new_events: Vec<Event> = Vec::new();
        let outcome = (|| -> std::result::Result<(), Error> {
            let mut w = db.begin_write().map_err(backend)?;
            w.set_durability(Durability::Immediate).map_err(backend)?;
            {
                let mut revisions = w.open_table(REVISIONS).map_err(backend)?;
                let mut versions = w.open_table(VERSIONS).map_err(backend)?;
                let mut meta = w.open_table(META).map_err(backend)?;
                for op in &batch {
                    let key = op.key.as_str();
                    if let OpKind::Commit(writes) = &op.kind {
                        let r = commit_writes(
                            &mut revisions,
                            &mut versions,
                            &mut buf,
                            &mut rev,
                            &mut new_events,
                            writes,
                        )?;
                        results.push(r.map(Done::Many));
                        continue;
                    }
                    let r = match op.kind {
                        OpKind::Commit(_) => unreachable!("handled above"),
                        OpKind::Compact(to) => {
                            if to > compact_to && to <= rev {
                                compact(
                                    &mut revisions,
                                    &mut versions,
                                    compact_to as u64,
                                    to as u64,
                                )?;
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
                        OpKind::Create => match live_version(&versions, key, u64::MAX)? {
                            Some(_) => Err(Error::AlreadyExists(op.key.clone())),
                            None => {
                                rev += 1;
                                let item = KeyValue {
                                    key: op.key.clone(),
                                    value: op.value.clone(),
                                    create_revision: rev,
                                    mod_revision: rev,
                                };
                                put_version(
                                    &mut versions,
                                    &mut revisions,
                                    &mut buf,
                                    (key, rev),
                                    rev,
                                    &op.value,
                                )?;
                                new_events.push(Event::Put {
                                    kv: item.clone(),
                                    prev: None,
                                });
                                Ok((item, rev))
                            }
                        },
                        OpKind::Update(expected) => match live_version(&versions, key, u64::MAX)? {
                            None => Err(Error::NotFound(op.key.clone())),
                            Some((cur_rev, create)) if cur_rev as i64 != expected => {
                                Err(Error::Conflict {
                                    key: op.key.clone(),
                                    expected,
                                    current: Some(item_at(&revisions, key, cur_rev, create)?),
                                })
                            }
                            Some((cur_rev, create)) => {
                                let cur = item_at(&revisions, key, cur_rev, create)?;
                                rev += 1;
                                let item = KeyValue {
                                    key: op.key.clone(),
                                    value: op.value.clone(),
                                    create_revision: create as i64,
                                    mod_revision: rev,
                                };
                                put_version(
                                    &mut versions,
                                    &mut revisions,
                                    &mut buf,
                                    (key, rev),
                                    create as i64,
                                    &op.value,
                                )?;
                                new_events.push(Event::Put {
                                    kv: item.clone(),
                                    prev: Some(cur),
                                });
                                Ok((item, rev))
                            }
                        },
                        OpKind::Delete(expected) => match live_version(&versions, key, u64::MAX)? {
                            None => Err(Error::NotFound(op.key.clone())),
                            Some((cur_rev, create)) => {
                                let cur = item_at(&revisions, key, cur_rev, create)?;
                                if expected.map(|e| e != cur.mod_revision).unwrap_or(false) {
                                    Err(Error::Conflict {
                                        key: op.key.clone(),
                                        expected: expected.unwrap_or(0),
                                        current: Some(cur),
                                    })
                                } else {
                                    rev += 1;
                                    put_version(
                                        &mut versions,
                                        &mut revisions,
                                        &mut buf,
                                        (key, rev),
                                        0,
                                        &[],
                                    )?;
                                    new_events.push(Event::Delete {
                                        prev: cur.clone(),
                                        revision: rev,
                                    });
                                    Ok((cur, rev))
                                }
                            }
                        },
                    };
                    results.push(r.map(|(kv, rev)| Done::One(kv, rev)));
                }
                meta.insert("revision", rev as u64).map_err(backend)?;
                meta.insert("compacted", compact_to as u64)
                    .map_err(backend)?;
            }
            commit_start = Instant::now();
            w.commit().map_err(backend)?;
            Ok(())
        })();
        let times = BatchTimes {
            batch_start,
            commit_start,
            commit_end: Instant::now(),
            batch_len: batch.len(),
        };
        match outcome {
            Ok(()) => {
                let published = publish.lock().unwrap_or_else(|e| e.into_inner());
                compacted.store(compact_to, Ordering::Release);
                revision.store(rev, Ordering::Release);
                for ev in new_events {
                    let _ = events.send(Arc::new(ev));
                }
                drop(published);
                for (op, r) in batch.into_iter().zip(results) {
                    let _ = op.reply.send((r, times));
                }
            }
            Err(e) => {
                for op in batch {
                    let _ = op.reply.send((Err(e.clone()), times));
                }
            }
        }
    }
}

/// Applies a commit's writes inside the batch's transaction: every
/// condition is checked first, against the same state, so either all
/// writes happen (at consecutive revisions) or none does. The outer
/// `Result` is a backend fault (it fails the whole batch); the inner one
/// the commit's own answer.
fn commit_writes(
    revisions: &mut redb::Table<u64, &[u8]>,
    versions: &mut redb::Table<(&str, u64), u64>,
    buf: &mut Vec<u8>,
    rev: &mut i64,
    new_events: &mut Vec<Event>,
    writes: &[Write],
) -> Result<Result<Vec<KeyValue>>> {
    let mut seen = std::collections::HashSet::new();
    // The current item of each updated key (its create revision and the
    // previous value for the watch event).
    let mut currents: Vec<Option<KeyValue>> = Vec::with_capacity(writes.len());
    for w in writes {
        if !seen.insert(w.key()) {
            return Ok(Err(Error::Backend(format!(
                "a commit writes key {:?} twice",
                w.key()
            ))));
        }
        match w {
            Write::Create { key, .. } => {
                if live_version(versions, key, u64::MAX)?.is_some() {
                    return Ok(Err(Error::AlreadyExists(key.clone())));
                }
                currents.push(None);
            }
            Write::Update {
                key,
                expected_revision,
                ..
            } => match live_version(versions, key, u64::MAX)? {
                None => return Ok(Err(Error::NotFound(key.clone()))),
                Some((cur_rev, create)) => {
                    let cur = item_at(revisions, key, cur_rev, create)?;
                    if cur_rev as i64 != *expected_revision {
                        return Ok(Err(Error::Conflict {
                            key: key.clone(),
                            expected: *expected_revision,
                            current: Some(cur),
                        }));
                    }
                    currents.push(Some(cur));
                }
            },
        }
    }
    let mut items = Vec::with_capacity(writes.len());
    for (w, cur) in writes.iter().zip(currents) {
        *rev += 1;
        let (key, value) = match w {
            Write::Create { key, value } | Write::Update { key, value, .. } => (key, value),
        };
        let create = cur.as_ref().map(|c| c.create_revision).unwrap_or(*rev);
        put_version(versions, revisions, buf, (key, *rev), create, value)?;
        let item = KeyValue {
            key: key.clone(),
            value: value.clone(),
            create_revision: create,
            mod_revision: *rev,
        };
        new_events.push(Event::Put {
            kv: item.clone(),
            prev: cur,
        });
        items.push(item);
    }
    Ok(Ok(items))
}

/// Drops history at or below `to`, keeping the latest live version of each
/// key. `from` is the previous compacted revision: a key with more than one
/// version at or below `to` was written after it, so only the revisions in
/// (`from`, `to`] name the keys to look at.
fn compact(
    revisions: &mut redb::Table<u64, &[u8]>,
    versions: &mut redb::Table<(&str, u64), u64>,
    from: u64,
    to: u64,
) -> Result<()> {
    let mut keys: Vec<String> = Vec::new();
    for item in revisions.range((from + 1)..=to).map_err(backend)? {
        let (rev, rec) = item.map_err(backend)?;
        keys.push(dec_record(rev.value(), rec.value())?.key.to_string());
    }
    keys.sort_unstable();
    keys.dedup();
    let mut drop: Vec<u64> = Vec::new();
    for key in keys {
        drop.clear();
        let mut last: Option<(u64, u64)> = None;
        for item in versions
            .range((key.as_str(), 0u64)..=(key.as_str(), to))
            .map_err(backend)?
        {
            let (k, v) = item.map_err(backend)?;
            if let Some((r, _)) = last {
                drop.push(r);
            }
            last = Some((k.value().1, v.value()));
        }
        if let Some((r, create)) = last {
            if create == 0 {
                drop.push(r);
            }
        }
        for r in &drop {
            versions.remove((key.as_str(), *r)).map_err(backend)?;
            revisions.remove(*r).map_err(backend)?;
        }
    }
    Ok(())
}

#[async_trait]
impl Store for RedbStore {
    async fn get(&self, key: &str) -> Result<Option<KeyValue>> {
        let r = self.db.begin_read().map_err(backend)?;
        let versions = r.open_table(VERSIONS).map_err(backend)?;
        match live_version(&versions, key, u64::MAX)? {
            Some((rev, create)) => {
                let revisions = r.open_table(REVISIONS).map_err(backend)?;
                Ok(Some(item_at(&revisions, key, rev, create)?))
            }
            None => Ok(None),
        }
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
        // A read at an older revision takes each key's last version at or
        // below it; otherwise the last version in this snapshot, whose
        // revision is the one committed with it.
        let (at, revision) = match at {
            Some(rev) if rev < current => (rev as u64, rev),
            _ => {
                let meta = r.open_table(META).map_err(backend)?;
                let rev = meta
                    .get("revision")
                    .map_err(backend)?
                    .map(|g| g.value() as i64)
                    .unwrap_or(0);
                (u64::MAX, rev)
            }
        };
        let versions = r.open_table(VERSIONS).map_err(backend)?;
        let revisions = r.open_table(REVISIONS).map_err(backend)?;
        let start = opts.start_after.as_deref().unwrap_or(prefix);
        let mut items = Vec::new();
        let mut remaining = 0i64;
        // The key being read and its last version at or below `at`.
        let mut cur_key = String::new();
        let mut best: Option<(u64, u64)> = None;
        let emit = |key: &str,
                    best: Option<(u64, u64)>,
                    items: &mut Vec<KeyValue>,
                    remaining: &mut i64| {
            if let Some((rev, create)) = best.filter(|(_, c)| *c != 0) {
                if items.len() < limit {
                    items.push(item_at(&revisions, key, rev, create)?);
                } else {
                    *remaining += 1;
                }
            }
            Ok::<(), Error>(())
        };
        for item in versions.range((start, 0u64)..).map_err(backend)? {
            let (k, v) = item.map_err(backend)?;
            let (key, krev) = k.value();
            if !key.starts_with(prefix) {
                break;
            }
            if opts.start_after.as_deref() == Some(key) {
                continue;
            }
            if cur_key != key {
                emit(&cur_key, best.take(), &mut items, &mut remaining)?;
                if opts.skip_count && remaining > 0 {
                    break;
                }
                cur_key.clear();
                cur_key.push_str(key);
            }
            if krev <= at {
                best = Some((krev, v.value()));
            }
        }
        if !(opts.skip_count && remaining > 0) {
            emit(&cur_key, best.take(), &mut items, &mut remaining)?;
        }
        Ok(ListResult {
            items,
            revision,
            more: remaining > 0,
            remaining,
        })
    }

    async fn count(&self, prefix: &str) -> Result<i64> {
        let r = self.db.begin_read().map_err(backend)?;
        let versions = r.open_table(VERSIONS).map_err(backend)?;
        let mut n = 0;
        // The key being read and whether its last version so far is live.
        let mut cur_key = String::new();
        let mut live = false;
        for item in versions.range((prefix, 0u64)..).map_err(backend)? {
            let (k, v) = item.map_err(backend)?;
            let (key, _) = k.value();
            if !key.starts_with(prefix) {
                break;
            }
            if cur_key != key {
                n += live as i64;
                cur_key.clear();
                cur_key.push_str(key);
            }
            live = v.value() != 0;
        }
        n += live as i64;
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

    async fn commit(&self, writes: Vec<Write>) -> Result<Vec<KeyValue>> {
        match self
            .submit_op(OpKind::Commit(writes), "", Bytes::new())
            .await?
        {
            Done::Many(items) => Ok(items),
            Done::One(..) => Err(Error::Backend("a commit answered as a single write".into())),
        }
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
        let db = self.db.clone();
        let events = self.events.clone();
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
                        if let Event::Progress { .. } = &*ev {
                            // A requested progress: every event up to `rev`
                            // was published before it.
                            let p = Event::Progress {
                                revision: rev.max(last),
                            };
                            if tx.send(Ok(p)).await.is_err() {
                                return;
                            }
                            continue;
                        }
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
                        // The ring moved past this watcher (its consumer was
                        // slow, e.g. starved of CPU): catch up from the
                        // revision history, as etcd catches up an unsynced
                        // watcher, instead of ending the watch (which made
                        // the watch cache reload every object). Subscribe
                        // again first so nothing falls between the history
                        // read and the ring; events already sent are
                        // skipped by revision. Only history compacted away
                        // ends the watch.
                        rx = events.subscribe();
                        let (db, p) = (db.clone(), prefix.clone());
                        let missed =
                            tokio::task::spawn_blocking(move || replay(&db, &p, last)).await;
                        // (A compaction past `last` ends the watch with
                        // `Compacted`, checked in the read's own snapshot.)
                        match missed {
                            Ok(Ok(missed)) => {
                                for ev in missed {
                                    last = ev.revision();
                                    if tx.send(Ok(ev)).await.is_err() {
                                        return;
                                    }
                                }
                            }
                            Ok(Err(e)) => {
                                let _ = tx.send(Err(e)).await;
                                return;
                            }
                            Err(e) => {
                                let _ = tx.send(Err(backend(e))).await;
                                return;
                            }
                        }
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

    async fn request_progress(&self) -> Result<i64> {
        let _published = self.publish.lock().unwrap_or_else(|e| e.into_inner());
        let rev = self.revision.load(Ordering::Acquire);
        let _ = self
            .events
            .send(Arc::new(Event::Progress { revision: rev }));
        Ok(rev)
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
