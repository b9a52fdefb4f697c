//! The watch cache: every resource's current objects and recent history in
//! memory, fed by one store watch over all of `/registry/`.
//!
//! Objects are kept as their serialized bytes (with resourceVersion) plus only
//! what selectors look at (labels and the kind's indexed fields), so lists and
//! watches are served without decoding. One global watch means every cache
//! knows the store's latest revision, which makes "consistent" reads cheap:
//! wait until the cache has seen the store's current revision.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::{Arc, OnceLock, RwLock};
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures::StreamExt;
use serde_json::{Map, Value};
use skiff_core::fields::SelectorView;
use skiff_core::resources::{Catalog, ResourceInfo, RESOURCES};
use skiff_core::selector::{FieldSelector, LabelSelector};
use skiff_store::{Event, KeyValue, ListOptions, Store};
use tokio::sync::watch;

use crate::object;

/// One object as the cache holds it.
#[derive(Debug)]
pub struct CachedObject {
    pub key: String,
    pub namespace: String,
    pub name: String,
    /// The object's JSON, resourceVersion included: see [`Self::bytes`].
    body: Body,
    pub labels: Map<String, Value>,
    /// `(field, value)` for each field selector the kind supports.
    pub fields: Vec<(&'static str, String)>,
    pub revision: i64,
    /// The whole object, once someone asked for it through [`Self::value`].
    parsed: OnceLock<Option<Arc<Value>>>,
    /// Set once the cold sweep found compressing this object not worth it.
    settled: std::sync::atomic::AtomicBool,
}

/// An object's JSON in the cache. Recent objects (those the history and
/// watch events still share) are kept as served; once an object's last
/// change has left the history it is cold, read only by lists and gets,
/// and is kept LZ4-compressed against a dictionary of its resource's
/// objects (most of a pod's JSON is the same as its siblings').
#[derive(Debug)]
enum Body {
    Plain(Bytes),
    Lz4 {
        /// Sample objects of the same resource, shared by all its cold objects.
        dict: Arc<[u8]>,
        /// The compressed block, the uncompressed size prepended.
        data: Box<[u8]>,
    },
}

/// Whether cold objects are compressed (on by default; benchmarks turn it
/// off to measure the difference side by side).
static COMPRESS_COLD: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(true);

/// Turns the compression of cold objects on or off (for benchmarks).
pub fn set_compress_cold(on: bool) {
    COMPRESS_COLD.store(on, std::sync::atomic::Ordering::Relaxed);
}

/// At most this many bytes of sample objects make a resource's dictionary.
const DICT_BYTES: usize = 16 * 1024;

impl CachedObject {
    /// Builds the cache's entry for a stored object. Only what selectors
    /// read is parsed (`view`); the bytes are served as they are.
    fn build(res: &ResourceInfo, view: &SelectorView, kv: &KeyValue) -> Option<CachedObject> {
        let mut obj = view.parse(&kv.value).ok()?;
        let bytes = match object::with_resource_version(&kv.value, kv.mod_revision) {
            Some(b) => Bytes::from(b),
            None => Bytes::from(serde_json::to_vec(&object::decode(kv).ok()?).ok()?),
        };
        let fields = skiff_core::fields::index_fields(res)
            .iter()
            .map(|f| {
                (
                    *f,
                    skiff_core::fields::field_value(res, &obj, f).unwrap_or_default(),
                )
            })
            .collect();
        let labels = match obj.get_mut("metadata").and_then(|m| m.get_mut("labels")) {
            Some(Value::Object(l)) => std::mem::take(l),
            _ => Map::new(),
        };
        Some(CachedObject {
            key: kv.key.clone(),
            namespace: object::meta_str(&obj, "namespace").to_string(),
            name: object::meta_str(&obj, "name").to_string(),
            body: Body::Plain(bytes),
            labels,
            fields,
            revision: kv.mod_revision,
            parsed: OnceLock::new(),
            settled: Default::default(),
        })
    }

    /// The object's JSON, resourceVersion included: shared for a recent
    /// object, decompressed (a few microseconds) for a cold one.
    pub fn bytes(&self) -> Bytes {
        match &self.body {
            Body::Plain(b) => b.clone(),
            // The cache's own block against its own dictionary: it decodes.
            Body::Lz4 { dict, data } => {
                lz4_flex::block::decompress_size_prepended_with_dict(data, dict)
                    .map(Bytes::from)
                    .unwrap_or_default()
            }
        }
    }

    /// Whether the JSON is kept as served (not compressed).
    fn is_plain(&self) -> bool {
        matches!(self.body, Body::Plain(_))
    }

    /// This object with its JSON compressed against `dict`, if that saves
    /// at least a quarter.
    fn compressed(&self, dict: &Arc<[u8]>) -> Option<CachedObject> {
        let Body::Plain(b) = &self.body else {
            return None;
        };
        let data = lz4_flex::block::compress_prepend_size_with_dict(b, dict);
        if data.len() > b.len() * 3 / 4 {
            return None;
        }
        let parsed = OnceLock::new();
        if let Some(v) = self.parsed.get() {
            let _ = parsed.set(v.clone());
        }
        Some(CachedObject {
            key: self.key.clone(),
            namespace: self.namespace.clone(),
            name: self.name.clone(),
            body: Body::Lz4 {
                dict: dict.clone(),
                data: data.into_boxed_slice(),
            },
            labels: self.labels.clone(),
            fields: self.fields.clone(),
            revision: self.revision,
            parsed,
            settled: Default::default(),
        })
    }

    /// The whole object, parsed on first use and kept: for the few policy
    /// objects (PriorityClasses, LimitRanges, ResourceQuotas) that admission
    /// reads on every create. `None` if the bytes are not JSON.
    pub fn value(&self) -> Option<Arc<Value>> {
        self.parsed
            .get_or_init(|| serde_json::from_slice(&self.bytes()).ok().map(Arc::new))
            .clone()
    }

    /// The value of a field selector's field for this object.
    pub fn field(&self, field: &str) -> Option<String> {
        match field {
            "metadata.name" => Some(self.name.clone()),
            "metadata.namespace" => Some(self.namespace.clone()),
            _ => self
                .fields
                .iter()
                .find(|(f, _)| *f == field)
                .map(|(_, v)| v.clone()),
        }
    }

    /// Whether this object is in a watch's or list's selection.
    pub fn matches(&self, filter: &Filter) -> bool {
        if let Some(ns) = &filter.namespace {
            if &self.namespace != ns {
                return false;
            }
        }
        if let Some(l) = &filter.labels {
            if !l.matches(&self.labels) {
                return false;
            }
        }
        if let Some(f) = &filter.fields {
            if !f.matches(|name| self.field(name)) {
                return false;
            }
        }
        true
    }
}

/// What a list or watch selects.
#[derive(Debug, Default, Clone)]
pub struct Filter {
    pub namespace: Option<String>,
    pub labels: Option<LabelSelector>,
    pub fields: Option<FieldSelector>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventType {
    Added,
    Modified,
    Deleted,
}

impl EventType {
    pub fn as_str(self) -> &'static str {
        match self {
            EventType::Added => "ADDED",
            EventType::Modified => "MODIFIED",
            EventType::Deleted => "DELETED",
        }
    }
}

/// History is kept for resuming watches, like kube-apiserver's watch cache:
/// at least this long (its event-fresh duration) ...
pub const HISTORY_WINDOW: Duration = Duration::from_secs(75);
/// ... and at least this many events per resource, but never more than
/// [`HISTORY_MAX`]. A watch from an older resourceVersion gets 410 Gone and
/// its client relists. Without the bound the history held every event
/// since the store's last compaction (up to six minutes): under churn
/// several old copies of every object, most of the server's memory.
pub const HISTORY_MIN: usize = 100;
pub const HISTORY_MAX: usize = 100 * 1024;

/// One change in a resource's history.
#[derive(Debug)]
pub struct CacheEvent {
    pub kind: EventType,
    /// The object after the change; for a deletion, the last state with the
    /// deletion's revision as resourceVersion.
    pub object: Arc<CachedObject>,
    pub prev: Option<Arc<CachedObject>>,
    pub revision: i64,
    pub at: Instant,
}

impl Inner {
    /// Drops the oldest events beyond the window and the cap (keeping
    /// [`HISTORY_MIN`]); `history_start` follows, so a cursor before the
    /// oldest kept event is too old.
    fn forget_stale_history(&mut self, now: Instant) {
        while self.history.len() > HISTORY_MIN {
            let Some(front) = self.history.front() else {
                break;
            };
            let stale = now.saturating_duration_since(front.at) > HISTORY_WINDOW;
            if !(stale || self.history.len() > HISTORY_MAX) {
                break;
            }
            let dropped = front.revision;
            self.history.pop_front();
            if self.history_start < dropped {
                self.history_start = dropped;
            }
        }
    }
}

struct Inner {
    objects: BTreeMap<String, Arc<CachedObject>>,
    history: VecDeque<Arc<CacheEvent>>,
    /// Every event with a revision above this is in `history`.
    history_start: i64,
    /// The revision of the last event applied (or of the load).
    last_rev: i64,
}

/// One resource's cache.
pub struct ResourceCache {
    pub res: &'static ResourceInfo,
    /// What of an object the cache parses.
    view: SelectorView,
    inner: RwLock<Inner>,
    changed: watch::Sender<i64>,
    /// The watches on this resource, indexed by what they select.
    watchers: std::sync::Mutex<Watchers>,
    /// The dictionary cold objects are compressed against: sample objects
    /// of this resource, taken at the first sweep that found cold ones.
    dict: OnceLock<Arc<[u8]>>,
}

/// How many events a watch may fall behind its client before it is closed
/// with a 410 (the client relists), so a client that stops reading neither
/// holds the others up nor makes the server's memory grow.
pub const WATCH_QUEUE: usize = 1024;

/// An exact-match term of a watch's selection: an event can only concern a
/// watch if the object (before or after the change) has this term.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum IndexKey {
    Namespace(String),
    Label(String, String),
    Field(String, String),
}

impl IndexKey {
    /// The most selective exact term of a filter: a field (`spec.nodeName=`,
    /// `metadata.name=`), else a label (`app=web`), else the namespace.
    /// `None`: every event may concern the watch.
    fn of(filter: &Filter) -> Option<IndexKey> {
        if let Some((f, v)) = filter.fields.as_ref().and_then(|f| f.exact_terms().next()) {
            return Some(IndexKey::Field(f.to_string(), v.to_string()));
        }
        if let Some((k, v)) = filter.labels.as_ref().and_then(|l| l.exact_terms().next()) {
            return Some(IndexKey::Label(k.to_string(), v.to_string()));
        }
        filter.namespace.clone().map(IndexKey::Namespace)
    }
}

/// One registered watch: where its events go.
struct Slot {
    key: Option<IndexKey>,
    tx: tokio::sync::mpsc::Sender<Arc<CacheEvent>>,
    /// Set when the watch is dropped for falling behind (or the cache was
    /// reset): the watch then ends with a 410.
    evicted: Arc<std::sync::atomic::AtomicBool>,
}

/// The registered watches and the inverted index from exact terms to them.
#[derive(Default)]
struct Watchers {
    next_id: u64,
    slots: HashMap<u64, Slot>,
    by_key: HashMap<IndexKey, Vec<u64>>,
    /// Watches without an exact term: they see every event.
    unindexed: Vec<u64>,
    /// Fields some watch is indexed by, with how many watches use each.
    fields: HashMap<String, usize>,
}

impl Watchers {
    fn add(
        &mut self,
        filter: &Filter,
        tx: tokio::sync::mpsc::Sender<Arc<CacheEvent>>,
    ) -> (u64, Arc<std::sync::atomic::AtomicBool>) {
        let id = self.next_id;
        self.next_id += 1;
        let key = IndexKey::of(filter);
        match &key {
            Some(k) => {
                if let IndexKey::Field(f, _) = k {
                    *self.fields.entry(f.clone()).or_default() += 1;
                }
                self.by_key.entry(k.clone()).or_default().push(id);
            }
            None => self.unindexed.push(id),
        }
        let evicted = Arc::new(std::sync::atomic::AtomicBool::new(false));
        self.slots.insert(
            id,
            Slot {
                key,
                tx,
                evicted: evicted.clone(),
            },
        );
        (id, evicted)
    }

    fn remove(&mut self, id: u64) -> Option<Slot> {
        let slot = self.slots.remove(&id)?;
        match &slot.key {
            Some(k) => {
                if let Some(ids) = self.by_key.get_mut(k) {
                    ids.retain(|i| *i != id);
                    if ids.is_empty() {
                        self.by_key.remove(k);
                    }
                }
                if let IndexKey::Field(f, _) = k {
                    if let Some(n) = self.fields.get_mut(f) {
                        *n -= 1;
                        if *n == 0 {
                            self.fields.remove(f);
                        }
                    }
                }
            }
            None => self.unindexed.retain(|i| *i != id),
        }
        Some(slot)
    }

    /// The watches an object's terms can concern.
    fn candidates(&self, obj: &CachedObject, out: &mut Vec<u64>) {
        let mut look = |k: &IndexKey| {
            if let Some(ids) = self.by_key.get(k) {
                out.extend_from_slice(ids);
            }
        };
        look(&IndexKey::Namespace(obj.namespace.clone()));
        for (k, v) in &obj.labels {
            if let Some(v) = v.as_str() {
                look(&IndexKey::Label(k.clone(), v.to_string()));
            }
        }
        for f in self.fields.keys() {
            look(&IndexKey::Field(
                f.clone(),
                obj.field(f).unwrap_or_default(),
            ));
        }
    }

    /// Hands an event to the watches it can concern; a watch whose queue is
    /// full is dropped (and told so).
    fn dispatch(&mut self, ev: &Arc<CacheEvent>) {
        if self.slots.is_empty() {
            return;
        }
        let mut ids = self.unindexed.clone();
        self.candidates(&ev.object, &mut ids);
        if let Some(prev) = &ev.prev {
            self.candidates(prev, &mut ids);
        }
        ids.sort_unstable();
        ids.dedup();
        for id in ids {
            let full = match self.slots.get(&id) {
                Some(slot) => slot.tx.try_send(ev.clone()).is_err(),
                None => false,
            };
            if full {
                if let Some(slot) = self.remove(id) {
                    slot.evicted
                        .store(true, std::sync::atomic::Ordering::Release);
                }
            }
        }
    }

    /// Ends every watch (with a 410): the history they resume from is gone.
    fn evict_all(&mut self) {
        for (_, slot) in self.slots.drain() {
            slot.evicted
                .store(true, std::sync::atomic::Ordering::Release);
        }
        self.by_key.clear();
        self.unindexed.clear();
        self.fields.clear();
    }
}

/// A registered watch: its events arrive on `events`; dropping it
/// unregisters the watch.
pub struct Subscription {
    cache: Arc<ResourceCache>,
    id: u64,
    pub events: tokio::sync::mpsc::Receiver<Arc<CacheEvent>>,
    /// Events after this revision arrive on `events`; earlier ones are in
    /// the history.
    pub from: i64,
    evicted: Arc<std::sync::atomic::AtomicBool>,
    /// With initial events: the objects matching at `from`.
    pub initial: Vec<Arc<CachedObject>>,
}

impl Subscription {
    /// Whether the watch was dropped for falling behind.
    pub fn evicted(&self) -> bool {
        self.evicted.load(std::sync::atomic::Ordering::Acquire)
    }
}

impl Drop for Subscription {
    fn drop(&mut self) {
        self.cache
            .watchers
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(self.id);
    }
}

/// The outcome of asking for the events after a revision.
pub enum Since {
    Events(Vec<Arc<CacheEvent>>),
    /// The revision is older than the history the cache keeps (HTTP 410).
    TooOld {
        oldest: i64,
    },
}

impl ResourceCache {
    fn new(res: &'static ResourceInfo) -> Self {
        ResourceCache {
            res,
            view: SelectorView::of(res),
            inner: RwLock::new(Inner {
                objects: BTreeMap::new(),
                history: VecDeque::new(),
                history_start: 0,
                last_rev: 0,
            }),
            changed: watch::channel(0).0,
            watchers: Default::default(),
            dict: OnceLock::new(),
        }
    }

    /// Compresses the cold objects: those whose last change has left the
    /// history, so nothing but the object map holds them. The work is done
    /// outside the lock, a chunk at a time; an object that changed in the
    /// meantime is left alone. Returns how many were compressed.
    fn compress_cold(&self) -> usize {
        let cold: Vec<Arc<CachedObject>> = {
            let inner = self.inner.read().unwrap_or_else(|e| e.into_inner());
            let start = inner.history_start;
            inner
                .objects
                .values()
                .filter(|o| {
                    o.revision <= start
                        && o.is_plain()
                        && !o.settled.load(std::sync::atomic::Ordering::Relaxed)
                })
                .cloned()
                .collect()
        };
        if cold.is_empty() {
            return 0;
        }
        let dict = self
            .dict
            .get_or_init(|| {
                // Evenly spread samples, up to DICT_BYTES.
                let mut d = Vec::with_capacity(DICT_BYTES);
                let step = (cold.len() / 8).max(1);
                for o in cold.iter().step_by(step) {
                    if let Body::Plain(b) = &o.body {
                        if d.len() + b.len() > DICT_BYTES {
                            break;
                        }
                        d.extend_from_slice(b);
                    }
                }
                d.into()
            })
            .clone();
        let mut done = 0;
        for chunk in cold.chunks(512) {
            let made: Vec<(Arc<CachedObject>, CachedObject)> = chunk
                .iter()
                .filter_map(|o| match o.compressed(&dict) {
                    Some(c) => Some((o.clone(), c)),
                    None => {
                        o.settled.store(true, std::sync::atomic::Ordering::Relaxed);
                        None
                    }
                })
                .collect();
            let mut inner = self.inner.write().unwrap_or_else(|e| e.into_inner());
            for (old, new) in made {
                if let Some(slot) = inner.objects.get_mut(&old.key) {
                    if Arc::ptr_eq(slot, &old) {
                        *slot = Arc::new(new);
                        done += 1;
                    }
                }
            }
        }
        done
    }

    /// Registers a watch with `filter`: every event after the returned
    /// subscription's `from` reaches it (those it can concern, by the
    /// index), and with `initial` it carries the matching objects at `from`.
    pub fn subscribe_filtered(self: &Arc<Self>, filter: &Filter, initial: bool) -> Subscription {
        let (tx, rx) = tokio::sync::mpsc::channel(WATCH_QUEUE);
        // Under the read lock no event is applied, so nothing falls between
        // `from` and the registration.
        let inner = self.inner.read().unwrap_or_else(|e| e.into_inner());
        let from = inner.last_rev;
        let objects = if initial {
            inner
                .objects
                .values()
                .filter(|o| o.matches(filter))
                .cloned()
                .collect()
        } else {
            Vec::new()
        };
        let (id, evicted) = self
            .watchers
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .add(filter, tx);
        drop(inner);
        Subscription {
            cache: self.clone(),
            id,
            events: rx,
            from,
            evicted,
            initial: objects,
        }
    }

    /// How many watches are registered.
    pub fn watch_count(&self) -> usize {
        self.watchers
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .slots
            .len()
    }

    /// Current objects that match `filter`, in key order.
    pub fn snapshot(&self, filter: &Filter) -> Vec<Arc<CachedObject>> {
        self.snapshot_with_revision(filter).0
    }

    /// Current objects that match `filter`, in key order, and the revision
    /// of the last change this cache had applied when they were taken (the
    /// events after it are exactly the later changes).
    pub fn snapshot_with_revision(&self, filter: &Filter) -> (Vec<Arc<CachedObject>>, i64) {
        let inner = self.inner.read().unwrap_or_else(|e| e.into_inner());
        let rev = inner.last_rev;
        let prefix = filter
            .namespace
            .as_ref()
            .filter(|_| self.res.namespaced)
            .map(|ns| format!("{}{ns}/", object::resource_prefix(self.res)));
        let objs = match prefix {
            Some(p) => inner
                .objects
                .range(p.clone()..)
                .take_while(|(k, _)| k.starts_with(&p))
                .filter(|(_, o)| o.matches(filter))
                .map(|(_, o)| o.clone())
                .collect(),
            None => inner
                .objects
                .values()
                .filter(|o| o.matches(filter))
                .cloned()
                .collect(),
        };
        (objs, rev)
    }

    /// Current objects matching `filter` and the revision they are current at:
    /// the events after that revision are exactly the later changes.
    pub fn snapshot_at(&self, filter: &Filter) -> (Vec<Arc<CachedObject>>, i64) {
        let inner = self.inner.read().unwrap_or_else(|e| e.into_inner());
        let rev = inner.last_rev;
        let objs = inner
            .objects
            .values()
            .filter(|o| o.matches(filter))
            .cloned()
            .collect();
        (objs, rev)
    }

    /// The cached object under `key`, if any.
    pub fn get(&self, key: &str) -> Option<Arc<CachedObject>> {
        self.inner
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .objects
            .get(key)
            .cloned()
    }

    /// The revision of the last change this cache applied.
    pub fn last_revision(&self) -> i64 {
        self.inner
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .last_rev
    }

    /// The events after `revision`, at most `max`.
    pub fn since(&self, revision: i64, max: usize) -> Since {
        let inner = self.inner.read().unwrap_or_else(|e| e.into_inner());
        if revision < inner.history_start {
            return Since::TooOld {
                oldest: inner.history_start,
            };
        }
        let start = inner.history.partition_point(|e| e.revision <= revision);
        Since::Events(
            inner
                .history
                .iter()
                .skip(start)
                .take(max)
                .cloned()
                .collect(),
        )
    }

    /// A receiver that changes whenever this resource gets an event.
    pub fn subscribe(&self) -> watch::Receiver<i64> {
        self.changed.subscribe()
    }

    fn apply(&self, ev: &Event) {
        // Parse before taking the lock: readers wait only for the insert.
        let built = match ev {
            Event::Put { kv, .. } => CachedObject::build(self.res, &self.view, kv),
            Event::Delete { prev, revision } => {
                let mut kv = prev.clone();
                kv.mod_revision = *revision;
                CachedObject::build(self.res, &self.view, &kv)
            }
            Event::Progress { .. } => return,
        };
        let Some(obj) = built else {
            return;
        };
        let obj = Arc::new(obj);
        let mut inner = self.inner.write().unwrap_or_else(|e| e.into_inner());
        let now = Instant::now();
        let event = match ev {
            Event::Put { kv, .. } => {
                let prev = inner.objects.insert(kv.key.clone(), obj.clone());
                CacheEvent {
                    kind: if prev.is_some() {
                        EventType::Modified
                    } else {
                        EventType::Added
                    },
                    object: obj,
                    prev,
                    revision: kv.mod_revision,
                    at: now,
                }
            }
            Event::Delete { prev, revision } => {
                let old = inner.objects.remove(&prev.key);
                CacheEvent {
                    kind: EventType::Deleted,
                    object: obj,
                    prev: old,
                    revision: *revision,
                    at: now,
                }
            }
            Event::Progress { .. } => return,
        };
        let rev = event.revision;
        inner.last_rev = rev;
        let event = Arc::new(event);
        inner.history.push_back(event.clone());
        inner.forget_stale_history(event.at);
        // Dispatched before the write lock goes, so a watch registering
        // (under the read lock) sees this event either in the history or
        // in its queue, never in neither.
        self.watchers
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .dispatch(&event);
        drop(inner);
        self.changed.send_replace(rev);
    }

    fn reset(&self, items: Vec<KeyValue>, revision: i64) {
        let mut objects = BTreeMap::new();
        for kv in &items {
            if let Some(o) = CachedObject::build(self.res, &self.view, kv) {
                objects.insert(kv.key.clone(), Arc::new(o));
            }
        }
        let mut inner = self.inner.write().unwrap_or_else(|e| e.into_inner());
        inner.objects = objects;
        inner.history.clear();
        inner.history_start = revision;
        inner.last_rev = revision;
        self.watchers
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .evict_all();
        drop(inner);
        self.changed.send_replace(revision);
    }

    /// Forgets history at or below `revision`. Only a cursor older than an
    /// event actually forgotten is too old: a watcher of a quiet resource keeps
    /// its place across compactions.
    fn trim(&self, revision: i64) {
        let mut inner = self.inner.write().unwrap_or_else(|e| e.into_inner());
        while let Some(front) = inner.history.front() {
            if front.revision <= revision {
                let dropped = front.revision;
                inner.history.pop_front();
                if inner.history_start < dropped {
                    inner.history_start = dropped;
                }
            } else {
                break;
            }
        }
    }

    /// How many objects the cache holds.
    pub fn len(&self) -> usize {
        self.inner
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .objects
            .len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// All resources' caches and the revision they have all seen.
pub struct WatchCache {
    /// One cache per storage: the built-in ones from the start, custom
    /// resources' added when their definition is published.
    caches: RwLock<HashMap<&'static str, Arc<ResourceCache>>>,
    /// What this server serves: built-ins plus the served versions of every
    /// Established CustomResourceDefinition in the cache.
    catalog: Arc<Catalog>,
    store: Arc<dyn Store>,
    /// The last store revision the caches have applied.
    revision: watch::Sender<i64>,
}

impl WatchCache {
    /// Loads every resource from the store and follows its changes.
    pub async fn start(store: Arc<dyn Store>) -> Result<Arc<WatchCache>, skiff_store::Error> {
        let mut caches = HashMap::new();
        for r in RESOURCES {
            caches
                .entry(r.storage)
                .or_insert_with(|| Arc::new(ResourceCache::new(r)));
        }
        let wc = Arc::new(WatchCache {
            caches: RwLock::new(caches),
            catalog: Arc::new(Catalog::new()),
            store: store.clone(),
            revision: watch::channel(0).0,
        });
        let rev = wc.load(&*store).await?;
        let stream = store
            .watch(object::ROOT, rev, Some(Duration::from_secs(5)))
            .await?;
        tokio::spawn(follow(wc.clone(), store, stream));
        // A quiet resource gets no event to trim its history on: sweep.
        let weak = Arc::downgrade(&wc);
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(HISTORY_WINDOW / 5);
            loop {
                tick.tick().await;
                let Some(wc) = weak.upgrade() else { return };
                let now = Instant::now();
                let caches = wc.all_caches();
                for c in &caches {
                    c.inner
                        .write()
                        .unwrap_or_else(|e| e.into_inner())
                        .forget_stale_history(now);
                }
                if COMPRESS_COLD.load(std::sync::atomic::Ordering::Relaxed) {
                    drop(wc);
                    let _ = tokio::task::spawn_blocking(move || {
                        for c in caches {
                            c.compress_cold();
                        }
                    })
                    .await;
                }
            }
        });
        Ok(wc)
    }

    async fn load(&self, store: &dyn Store) -> Result<i64, skiff_store::Error> {
        let first = store
            .list(
                object::ROOT,
                ListOptions {
                    limit: 10_000,
                    ..Default::default()
                },
            )
            .await?;
        let revision = first.revision;
        let mut all = first.items;
        let mut more = first.more;
        while more {
            let start_after = all.last().map(|kv| kv.key.clone());
            let page = store
                .list(
                    object::ROOT,
                    ListOptions {
                        revision: Some(revision),
                        limit: 10_000,
                        start_after,
                        skip_count: true,
                    },
                )
                .await?;
            more = page.more;
            all.extend(page.items);
        }
        let mut by_storage: HashMap<String, Vec<KeyValue>> = HashMap::new();
        for kv in all {
            if let Some(s) = object::storage_of_key(&kv.key) {
                by_storage.entry(s).or_default().push(kv);
            }
        }
        let builtin: Vec<(&'static str, Arc<ResourceCache>)> = self
            .caches
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .filter(|(_, c)| c.res.rules.custom().is_none())
            .map(|(s, c)| (*s, c.clone()))
            .collect();
        for (storage, cache) in builtin {
            cache.reset(by_storage.remove(storage).unwrap_or_default(), revision);
        }
        self.publish(revision, Some(&mut by_storage)).await?;
        self.revision.send_replace(revision);
        Ok(revision)
    }

    /// The served resources of this server.
    pub fn catalog(&self) -> &Arc<Catalog> {
        &self.catalog
    }

    fn all_caches(&self) -> Vec<Arc<ResourceCache>> {
        self.caches
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .values()
            .cloned()
            .collect()
    }

    /// Publishes the Established CustomResourceDefinitions in the cache as
    /// the catalog, first giving each custom storage a cache loaded at
    /// `revision` (the revision of the definition's change being applied, so
    /// the events after it are exactly the later changes). `loaded`: the
    /// objects of a full load by storage (no store read needed).
    async fn publish(
        &self,
        revision: i64,
        mut loaded: Option<&mut HashMap<String, Vec<KeyValue>>>,
    ) -> Result<(), skiff_store::Error> {
        let crd_res = skiff_core::resources::lookup(
            "apiextensions.k8s.io",
            "v1",
            "customresourcedefinitions",
        )
        .expect("CustomResourceDefinitions are served");
        let crds = self.resource(crd_res).snapshot(&Filter::default());
        let mut served: Vec<&'static ResourceInfo> = Vec::new();
        let mut storages: Vec<&'static ResourceInfo> = Vec::new();
        let mut taken: Vec<(&str, &str)> = Vec::new();
        for o in crds {
            let Some(crd) = o.value() else { continue };
            if !skiff_core::kinds::custom::is_established(&crd) {
                continue;
            }
            let rs = skiff_core::kinds::custom::resources_of(&crd);
            // Never two definitions (or a definition and a built-in) at one place.
            if rs.iter().any(|r| {
                skiff_core::resources::lookup(r.group, r.version, r.plural).is_some()
                    || taken.contains(&(r.group, r.plural))
            }) {
                continue;
            }
            if let Some(first) = rs.first() {
                taken.push((first.group, first.plural));
                if let Some(s) = first.rules.custom().and_then(|c| c.storage_resource()) {
                    storages.push(s);
                }
            }
            served.extend(rs);
        }
        for res in storages {
            let existing = self
                .caches
                .read()
                .unwrap_or_else(|e| e.into_inner())
                .get(res.storage)
                .cloned();
            let same_fields = existing
                .as_ref()
                .map(|c| c.res.rules.selectable_fields() == res.rules.selectable_fields())
                .unwrap_or(false);
            if same_fields && loaded.is_none() {
                continue;
            }
            let items = match loaded.as_mut().and_then(|l| l.remove(res.storage)) {
                Some(items) => items,
                None if loaded.is_some() => Vec::new(),
                None => {
                    let prefix = object::resource_prefix(res);
                    let mut all = Vec::new();
                    let mut start_after = None;
                    loop {
                        let page = self
                            .store
                            .list(
                                &prefix,
                                ListOptions {
                                    revision: Some(revision),
                                    limit: 10_000,
                                    start_after,
                                    skip_count: true,
                                },
                            )
                            .await?;
                        all.extend(page.items);
                        if !page.more {
                            break;
                        }
                        start_after = all.last().map(|kv| kv.key.clone());
                    }
                    all
                }
            };
            let cache = Arc::new(ResourceCache::new(res));
            cache.reset(items, revision);
            let old = self
                .caches
                .write()
                .unwrap_or_else(|e| e.into_inner())
                .insert(res.storage, cache);
            if let Some(old) = old {
                old.watchers
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .evict_all();
            }
        }
        self.catalog.set_custom(served);
        Ok(())
    }

    /// The cache of a resource.
    pub fn resource(&self, res: &ResourceInfo) -> Arc<ResourceCache> {
        let caches = self.caches.read().unwrap_or_else(|e| e.into_inner());
        match caches.get(res.storage) {
            Some(c) => c.clone(),
            None => {
                // A custom resource whose definition went away since the
                // request was routed: an empty cache answers.
                drop(caches);
                let custom = res.rules.custom().and_then(|c| c.storage_resource());
                let c = Arc::new(ResourceCache::new(
                    custom.expect("every built-in resource has a cache"),
                ));
                c.reset(Vec::new(), self.revision());
                c
            }
        }
    }

    /// The last revision every cache has applied.
    pub fn revision(&self) -> i64 {
        *self.revision.borrow()
    }

    /// Waits until the caches have applied `revision`; false on timeout.
    pub async fn wait_for(&self, revision: i64, timeout: Duration) -> bool {
        let mut rx = self.revision.subscribe();
        let fut = async {
            loop {
                if *rx.borrow_and_update() >= revision {
                    return;
                }
                if rx.changed().await.is_err() {
                    return;
                }
            }
        };
        tokio::time::timeout(timeout, fut).await.is_ok() && self.revision() >= revision
    }

    /// A receiver of the global revision (for bookmarks).
    pub fn subscribe_revision(&self) -> watch::Receiver<i64> {
        self.revision.subscribe()
    }

    /// Drops history at or below `revision` (after the store compacted it).
    pub fn trim(&self, revision: i64) {
        for c in self.all_caches() {
            c.trim(revision);
        }
    }
}

/// The storage of CustomResourceDefinitions.
const CRD_STORAGE: &str = "apiextensions.k8s.io/customresourcedefinitions";

async fn follow(wc: Arc<WatchCache>, store: Arc<dyn Store>, mut stream: skiff_store::WatchStream) {
    loop {
        while let Some(item) = stream.next().await {
            match item {
                Ok(ev) => {
                    let rev = ev.revision();
                    let key = match &ev {
                        Event::Put { kv, .. } => Some(kv.key.as_str()),
                        Event::Delete { prev, .. } => Some(prev.key.as_str()),
                        Event::Progress { .. } => None,
                    };
                    if let Some(storage) = key.and_then(object::storage_of_key) {
                        let c = wc
                            .caches
                            .read()
                            .unwrap_or_else(|e| e.into_inner())
                            .get(storage.as_str())
                            .cloned();
                        if let Some(c) = c {
                            c.apply(&ev);
                        }
                        if storage == CRD_STORAGE {
                            if let Err(e) = wc.publish(rev, None).await {
                                tracing::warn!(error = %e, "publishing custom resources; reloading the watch cache");
                                break;
                            }
                        }
                    }
                    if rev > wc.revision() {
                        wc.revision.send_replace(rev);
                    }
                }
                Err(e) => {
                    tracing::warn!(error = %e, "store watch ended; reloading the watch cache");
                    break;
                }
            }
        }
        // The watch ended: reload everything and follow again.
        loop {
            match wc.load(&*store).await {
                Ok(rev) => match store
                    .watch(object::ROOT, rev, Some(Duration::from_secs(5)))
                    .await
                {
                    Ok(s) => {
                        stream = s;
                        break;
                    }
                    Err(e) => tracing::warn!(error = %e, "restarting store watch"),
                },
                Err(skiff_store::Error::Closed) => return,
                Err(e) => tracing::warn!(error = %e, "reloading watch cache"),
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
}

#[cfg(test)]
mod history_tests {
    use super::*;

    fn event(revision: i64, at: Instant) -> Arc<CacheEvent> {
        Arc::new(CacheEvent {
            kind: EventType::Modified,
            object: Arc::new(CachedObject {
                key: "/registry/configmaps/default/a".into(),
                namespace: "default".into(),
                name: "a".into(),
                body: Body::Plain(Bytes::from_static(b"{}")),
                labels: Map::new(),
                fields: vec![],
                revision,
                parsed: OnceLock::new(),
                settled: Default::default(),
            }),
            prev: None,
            revision,
            at,
        })
    }

    fn inner() -> Inner {
        Inner {
            objects: BTreeMap::new(),
            history: VecDeque::new(),
            history_start: 0,
            last_rev: 0,
        }
    }

    #[test]
    fn events_older_than_the_window_are_forgotten_beyond_the_minimum() {
        let now = Instant::now() + HISTORY_WINDOW * 4;
        let old = now - HISTORY_WINDOW * 2;
        let mut h = inner();
        for r in 1..=300 {
            h.history
                .push_back(event(r, if r <= 250 { old } else { now }));
        }
        h.forget_stale_history(now);
        // 50 fresh events, topped up to the minimum with the newest old ones.
        assert_eq!(h.history.len(), HISTORY_MIN);
        assert_eq!(h.history.front().unwrap().revision, 201);
        // A cursor at the last forgotten event still resumes; before it, 410.
        assert_eq!(h.history_start, 200);
    }

    #[test]
    fn fresh_events_are_kept_up_to_the_cap() {
        let now = Instant::now();
        let mut h = inner();
        for r in 1..=(HISTORY_MAX as i64 + 10) {
            h.history.push_back(event(r, now));
        }
        h.forget_stale_history(now);
        assert_eq!(h.history.len(), HISTORY_MAX);
        assert_eq!(h.history_start, 10);

        let mut h = inner();
        for r in 1..=1000 {
            h.history.push_back(event(r, now));
        }
        h.forget_stale_history(now);
        assert_eq!(h.history.len(), 1000, "all fresh and under the cap");
        assert_eq!(h.history_start, 0);
    }
}

#[cfg(test)]
mod cold_tests {
    use super::*;

    fn pods() -> &'static ResourceInfo {
        skiff_core::resources::lookup("", "v1", "pods").expect("pods are served")
    }

    fn pod_kv(i: i64) -> KeyValue {
        let obj = serde_json::json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": format!("p{i}"), "namespace": "default",
                "labels": {"app": "web"}, "uid": format!("uid-{i}")},
            "spec": {"nodeName": format!("n{}", i % 3), "containers": [{"name": "c", "image": "busybox",
                "terminationMessagePath": "/dev/termination-log", "terminationMessagePolicy": "File"}]},
            "status": {"phase": "Running", "conditions": [
                {"type": "Ready", "status": "True", "lastProbeTime": null},
                {"type": "ContainersReady", "status": "True", "lastProbeTime": null},
                {"type": "PodScheduled", "status": "True", "lastProbeTime": null}]}
        });
        KeyValue {
            key: format!("/registry/pods/default/p{i}"),
            value: Bytes::from(serde_json::to_vec(&obj).unwrap()),
            create_revision: i,
            mod_revision: i,
        }
    }

    #[test]
    fn cold_objects_are_compressed_and_read_back_unchanged() {
        let cache = ResourceCache::new(pods());
        cache.reset((1..=50).map(pod_kv).collect(), 50);
        let before: Vec<(String, Bytes)> = cache
            .snapshot(&Filter::default())
            .iter()
            .map(|o| (o.key.clone(), o.bytes()))
            .collect();
        assert_eq!(before.len(), 50);
        // Everything loaded is cold (no history refers to it).
        assert_eq!(cache.compress_cold(), 50);
        let after = cache.snapshot(&Filter::default());
        for ((key, bytes), o) in before.iter().zip(&after) {
            assert_eq!(&o.key, key);
            assert!(!o.is_plain(), "{key} is compressed");
            assert_eq!(&o.bytes(), bytes, "{key} reads back byte for byte");
            assert_eq!(o.field("spec.nodeName"), before_field(bytes));
        }
        // Selectors still work on compressed objects.
        let on_n1 = Filter {
            fields: Some(FieldSelector::parse("spec.nodeName=n1").unwrap()),
            ..Default::default()
        };
        assert_eq!(cache.snapshot(&on_n1).len(), 17);
        // A second sweep has nothing left to do.
        assert_eq!(cache.compress_cold(), 0);
    }

    fn before_field(bytes: &Bytes) -> Option<String> {
        let v: Value = serde_json::from_slice(bytes).unwrap();
        v.pointer("/spec/nodeName")
            .and_then(Value::as_str)
            .map(str::to_string)
    }

    #[test]
    fn recent_objects_stay_as_served() {
        let cache = ResourceCache::new(pods());
        cache.reset((1..=10).map(pod_kv).collect(), 10);
        // A change after the load is in the history: not cold.
        let mut kv = pod_kv(3);
        kv.mod_revision = 11;
        cache.apply(&Event::Put { kv, prev: None });
        assert_eq!(cache.compress_cold(), 9);
        let o = cache.get("/registry/pods/default/p3").unwrap();
        assert!(o.is_plain());
        assert_eq!(o.revision, 11);
        // Its event in the history shares the very object.
        match cache.since(10, 10) {
            Since::Events(evs) => assert!(Arc::ptr_eq(&evs[0].object, &o)),
            Since::TooOld { .. } => panic!("revision 10 is in the history"),
        }
    }
}
