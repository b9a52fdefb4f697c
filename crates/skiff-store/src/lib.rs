//! The store contract skiff's API server needs — the one Kubernetes needs from
//! etcd — and its backends.
//!
//! Keys are strings (`/registry/<resource>/<namespace>/<name>`, as Kubernetes
//! lays out etcd), values
//! are opaque bytes (serialized objects). One global revision orders every
//! write; it is the `resourceVersion` clients see. Only the API server uses
//! this crate.

pub mod etcd;
mod redb_store;
#[cfg(feature = "testsuite")]
pub mod testsuite;
pub mod trace;

pub use etcd::{EtcdOptions, EtcdStore, EtcdTls};
pub use redb_store::{RedbOptions, RedbStore};

use async_trait::async_trait;
use bytes::Bytes;
use futures::stream::BoxStream;

/// A stored key with its value and revisions (etcd's `mvccpb.KeyValue`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyValue {
    pub key: String,
    pub value: Bytes,
    /// Revision of the write that created this key (since its last deletion).
    pub create_revision: i64,
    /// Revision of the last write to this key.
    pub mod_revision: i64,
}

/// Options of a range read.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ListOptions {
    /// Read at this revision; `None` reads the latest. A revision older than the
    /// compacted one fails with [`Error::Compacted`]; one newer than the
    /// current fails with [`Error::FutureRevision`].
    pub revision: Option<i64>,
    /// Return at most this many items; 0 means no limit.
    pub limit: i64,
    /// Start strictly after this key (the paging cursor). Must be under the prefix.
    pub start_after: Option<String>,
    /// Do not count the items after the page: `more` is still exact, but
    /// `remaining` is then 1 when `more` (the count scans the whole rest of
    /// the range, which made every page of a 150,000-pod list cost a scan
    /// of the rest; the API server carries the count in its continue token).
    pub skip_count: bool,
}

/// The answer to a range read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListResult {
    /// Items in key order.
    pub items: Vec<KeyValue>,
    /// The revision the read was served at (the store's current one for a
    /// latest read): pass it back as `revision` to page through one snapshot.
    pub revision: i64,
    /// Whether more items follow the last returned one.
    pub more: bool,
    /// How many items follow the last returned one (0 when `more` is false).
    pub remaining: i64,
}

/// One write of an atomic [`Store::commit`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Write {
    /// Creates `key`; the commit fails with `AlreadyExists` if it exists.
    Create { key: String, value: Bytes },
    /// Replaces `key` if its mod revision is `expected_revision`; the
    /// commit fails with `NotFound` or `Conflict` (with the current item)
    /// otherwise.
    Update {
        key: String,
        value: Bytes,
        expected_revision: i64,
    },
}

impl Write {
    pub fn key(&self) -> &str {
        match self {
            Write::Create { key, .. } | Write::Update { key, .. } => key,
        }
    }
}

/// One change seen by a watch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// A create (`prev` is `None`) or update of a key.
    Put {
        kv: KeyValue,
        prev: Option<KeyValue>,
    },
    /// A deletion at `revision`; `prev` is the value the key had before it.
    Delete { prev: KeyValue, revision: i64 },
    /// Nothing under the watched prefix changed up to `revision` (progress notify /
    /// bookmark); sent on request or periodically.
    Progress { revision: i64 },
}

impl Event {
    /// The revision this event happened at.
    pub fn revision(&self) -> i64 {
        match self {
            Event::Put { kv, .. } => kv.mod_revision,
            Event::Delete { revision, .. } => *revision,
            Event::Progress { revision } => *revision,
        }
    }
}

/// A store failure. `Conflict`, `NotFound`, `AlreadyExists` and `Compacted`
/// are answers, not faults; `Backend` and `Closed` may be retried.
#[derive(Debug, thiserror::Error, Clone, PartialEq, Eq)]
pub enum Error {
    #[error("key {0:?} not found")]
    NotFound(String),
    #[error("key {0:?} already exists")]
    AlreadyExists(String),
    /// The key's current mod revision is not the expected one; carries the current value.
    #[error("key {key:?} was modified: expected revision {expected}, found {}", current.as_ref().map(|c| c.mod_revision).unwrap_or(0))]
    Conflict {
        key: String,
        expected: i64,
        current: Option<KeyValue>,
    },
    /// The requested revision has been compacted away (HTTP 410 upstream).
    #[error("required revision {requested} has been compacted (compacted revision {compacted})")]
    Compacted { requested: i64, compacted: i64 },
    /// The requested revision is newer than the store's current revision.
    #[error("required revision {requested} is a future revision (current {current})")]
    FutureRevision { requested: i64, current: i64 },
    #[error("store backend error: {0}")]
    Backend(String),
    /// The backend cannot be reached (etcd down or without a leader); HTTP 503
    /// upstream. May be retried.
    #[error("store unavailable: {0}")]
    Unavailable(String),
    /// The backend did not answer in time; HTTP 504 upstream. The write may or
    /// may not have happened.
    #[error("store request timed out: {0}")]
    Timeout(String),
    #[error("store is closed")]
    Closed,
}

pub type Result<T> = std::result::Result<T, Error>;

/// A stream of watch events, in revision order, each revision at most once.
/// It ends with an `Err` (e.g. `Compacted` when the watcher fell too far behind)
/// or when the store closes.
pub type WatchStream = BoxStream<'static, Result<Event>>;

/// What Kubernetes needs from its store. Every backend passes the conformance
/// suite in [`testsuite`] (feature `testsuite`).
#[async_trait]
pub trait Store: Send + Sync + 'static {
    /// The latest value of `key`.
    async fn get(&self, key: &str) -> Result<Option<KeyValue>>;

    /// Keys starting with `prefix`, in key order, at a revision, with paging.
    async fn list(&self, prefix: &str, opts: ListOptions) -> Result<ListResult>;

    /// How many keys start with `prefix` now.
    async fn count(&self, prefix: &str) -> Result<i64>;

    /// Creates `key` if absent; durable when it returns. Returns the new item.
    async fn create(&self, key: &str, value: Bytes) -> Result<KeyValue>;

    /// Replaces `key` if its mod revision is `expected_revision`; durable when it
    /// returns. `NotFound` if absent, `Conflict` (with the current item) if stale.
    async fn update(&self, key: &str, value: Bytes, expected_revision: i64) -> Result<KeyValue>;

    /// Applies every write or none, atomically: all conditions hold against
    /// one state of the store, and a reader or watcher never sees some of
    /// the writes without the others. Durable when it returns. Returns the
    /// written items in order; their revisions are newer than any before
    /// the commit (one revision for all in etcd, consecutive ones in the
    /// embedded store). The error is the first failed condition's; a key
    /// written twice is refused.
    async fn commit(&self, writes: Vec<Write>) -> Result<Vec<KeyValue>>;

    /// Deletes `key`, if `expected_revision` is given only when it matches.
    /// Returns the deleted item and the revision of the deletion.
    async fn delete(&self, key: &str, expected_revision: Option<i64>) -> Result<(KeyValue, i64)>;

    /// Changes under `prefix` with revision > `after_revision` (0: only changes from
    /// now on), in order. `Compacted` if `after_revision` is older than the
    /// compacted revision. `progress_interval` (if set) sends `Progress` events
    /// while idle.
    async fn watch(
        &self,
        prefix: &str,
        after_revision: i64,
        progress_interval: Option<std::time::Duration>,
    ) -> Result<WatchStream>;

    /// The revision of the last committed write (0 in an empty store).
    async fn current_revision(&self) -> Result<i64>;

    /// Asks every open watch of this store for progress (etcd's
    /// `RequestProgress`) and returns the store's current revision: each
    /// watch then sends, after every event at or below that revision, a
    /// `Progress` at that revision or later. A watch cache waits for it to
    /// serve a read that is consistent with the store.
    async fn request_progress(&self) -> Result<i64>;

    /// Forgets history older than `revision`; reads and watches before it answer
    /// `Compacted`. The latest value of every live key is kept.
    async fn compact(&self, revision: i64) -> Result<()>;

    /// The revision compacted up to (0 if never).
    async fn compacted_revision(&self) -> Result<i64>;

    /// Whether `kv`, as this store last returned it from `get`, is kept in
    /// an outdated form (encrypted with a key that no longer writes): an
    /// update must write it again even when the object did not change, as
    /// kube-apiserver does for stale data. Plain backends never are.
    fn stale(&self, _kv: &KeyValue) -> bool {
        false
    }
}
