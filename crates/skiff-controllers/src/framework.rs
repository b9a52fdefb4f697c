//! The controllers' machinery: informer caches fed by one watch per kind
//! (with secondary indexes by namespace, owner and uid, and change handlers
//! that receive the old and new object), a work queue per controller (keys
//! deduplicated; a key is never reconciled by two workers at once; failures
//! retried with exponential back-off; delayed requeues), and workers that
//! run level-triggered reconciles and record metrics.

use std::collections::{BTreeSet, HashMap, HashSet, VecDeque};
use std::fmt::Debug;
use std::future::Future;
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::Api;
use kube::runtime::{watcher, WatchStreamExt};
use kube::Resource;
use tokio::sync::Notify;

use crate::metrics;

/// An object's queue and cache key: `namespace/name`, or `name` for
/// cluster-scoped objects.
pub type Key = String;

pub fn key_of(meta: &ObjectMeta) -> Key {
    let name = meta.name.as_deref().unwrap_or("");
    match meta.namespace.as_deref() {
        Some(ns) if !ns.is_empty() => format!("{ns}/{name}"),
        _ => name.to_string(),
    }
}

/// `(namespace, name)` of a key (`""` as the namespace of cluster-scoped
/// objects).
pub fn split_key(key: &str) -> (&str, &str) {
    key.split_once('/').unwrap_or(("", key))
}

fn has_controller(m: &ObjectMeta) -> bool {
    m.owner_references
        .iter()
        .flatten()
        .any(|r| r.controller == Some(true))
}

type Handler<K> = Arc<dyn Fn(Option<&K>, Option<&K>) + Send + Sync>;

/// An object as the caches keep it: without `metadata.managedFields`, which
/// no controller reads and which took about half of a cached pod's memory
/// (kube-controller-manager's informers drop them the same way, with a
/// transform). Writes go through patches or whole-object updates built
/// from these objects; the server keeps the stored managedFields of an
/// update that omits them.
fn lean<K: Resource>(mut obj: K) -> K {
    obj.meta_mut().managed_fields = None;
    obj
}

struct Inner<K> {
    objects: HashMap<Key, Arc<K>>,
    by_namespace: HashMap<String, BTreeSet<Key>>,
    by_owner: HashMap<String, HashSet<Key>>,
    by_uid: HashMap<String, Key>,
    orphans: HashMap<String, BTreeSet<Key>>,
}

impl<K> Default for Inner<K> {
    fn default() -> Self {
        Inner {
            objects: HashMap::new(),
            by_namespace: HashMap::new(),
            by_owner: HashMap::new(),
            by_uid: HashMap::new(),
            orphans: HashMap::new(),
        }
    }
}

impl<K: Resource> Inner<K> {
    fn insert(&mut self, obj: Arc<K>) -> Option<Arc<K>> {
        let key = key_of(obj.meta());
        let old = self.remove(&key);
        let m = obj.meta();
        self.by_namespace
            .entry(m.namespace.clone().unwrap_or_default())
            .or_default()
            .insert(key.clone());
        for r in m.owner_references.iter().flatten() {
            self.by_owner
                .entry(r.uid.clone())
                .or_default()
                .insert(key.clone());
        }
        if let Some(uid) = &m.uid {
            self.by_uid.insert(uid.clone(), key.clone());
        }
        if !has_controller(m) {
            self.orphans
                .entry(m.namespace.clone().unwrap_or_default())
                .or_default()
                .insert(key.clone());
        }
        self.objects.insert(key, obj);
        old
    }

    fn remove(&mut self, key: &str) -> Option<Arc<K>> {
        let old = self.objects.remove(key)?;
        let m = old.meta();
        let ns = m.namespace.clone().unwrap_or_default();
        if let Some(s) = self.by_namespace.get_mut(&ns) {
            s.remove(key);
            if s.is_empty() {
                self.by_namespace.remove(&ns);
            }
        }
        if let Some(s) = self.orphans.get_mut(&ns) {
            s.remove(key);
            if s.is_empty() {
                self.orphans.remove(&ns);
            }
        }
        for r in m.owner_references.iter().flatten() {
            if let Some(s) = self.by_owner.get_mut(&r.uid) {
                s.remove(key);
                if s.is_empty() {
                    self.by_owner.remove(&r.uid);
                }
            }
        }
        if let Some(uid) = &m.uid {
            if self.by_uid.get(uid).map(|k| k == key).unwrap_or(false) {
                self.by_uid.remove(uid);
            }
        }
        Some(old)
    }
}

/// A cache of one kind of object, kept by a watch, with indexes.
pub struct Cache<K> {
    inner: RwLock<Inner<K>>,
    handlers: RwLock<Vec<Handler<K>>>,
    ready: tokio::sync::watch::Sender<bool>,
}

impl<K> Cache<K>
where
    K: Resource + Clone + serde::de::DeserializeOwned + Debug + Send + Sync + 'static,
    K::DynamicType: Default,
{
    pub fn new() -> Arc<Self> {
        Arc::new(Cache {
            inner: RwLock::new(Inner::default()),
            handlers: RwLock::new(vec![]),
            ready: tokio::sync::watch::channel(false).0,
        })
    }

    /// Calls `f(old, new)` on every change (`new` is None for a deletion,
    /// `old` None for an addition). Register before [`Cache::start`].
    pub fn on_change(&self, f: impl Fn(Option<&K>, Option<&K>) + Send + Sync + 'static) {
        self.handlers
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .push(Arc::new(f));
    }

    fn notify(&self, old: Option<&K>, new: Option<&K>) {
        let hs = self
            .handlers
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        for h in hs {
            h(old, new);
        }
    }

    /// Applies a change as a watch would (also used by tests).
    pub fn apply(&self, obj: K) {
        let obj = Arc::new(lean(obj));
        let old = self
            .inner
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .insert(obj.clone());
        self.notify(old.as_deref(), Some(&obj));
    }

    pub fn delete(&self, obj: &K) {
        let key = key_of(obj.meta());
        let old = self
            .inner
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&key);
        self.notify(old.as_deref().or(Some(obj)), None);
    }

    /// Replaces the whole content (after a list), reporting what changed.
    fn replace(&self, objs: Vec<K>) {
        let mut fresh = Inner::default();
        for o in objs {
            fresh.insert(Arc::new(lean(o)));
        }
        let old = {
            let mut g = self.inner.write().unwrap_or_else(|e| e.into_inner());
            std::mem::replace(&mut *g, fresh)
        };
        let now: Vec<Arc<K>> = self.list();
        for o in &now {
            let k = key_of(o.meta());
            self.notify(old.objects.get(&k).map(|a| &**a), Some(o));
        }
        let inner = self.inner.read().unwrap_or_else(|e| e.into_inner());
        let gone: Vec<Arc<K>> = old
            .objects
            .iter()
            .filter(|(k, _)| !inner.objects.contains_key(*k))
            .map(|(_, v)| v.clone())
            .collect();
        drop(inner);
        for o in gone {
            self.notify(Some(&o), None);
        }
    }

    /// Watches `api` into this cache until the task is dropped.
    pub fn start(self: &Arc<Self>, api: Api<K>, tasks: &mut tokio::task::JoinSet<()>) {
        let me = self.clone();
        tasks.spawn(async move {
            let mut stream = watcher(api, watcher::Config::default())
                .default_backoff()
                .boxed();
            let mut buffer: Vec<K> = vec![];
            while let Some(ev) = stream.next().await {
                match ev {
                    Ok(watcher::Event::Apply(o)) => me.apply(o),
                    Ok(watcher::Event::Delete(o)) => me.delete(&o),
                    Ok(watcher::Event::Init) => buffer.clear(),
                    Ok(watcher::Event::InitApply(o)) => buffer.push(o),
                    Ok(watcher::Event::InitDone) => {
                        me.replace(std::mem::take(&mut buffer));
                        me.ready.send_replace(true);
                    }
                    Err(e) => tracing::debug!(error = %e, "watch failed; retrying"),
                }
            }
        });
    }

    /// Marks the cache as listed without a watch (tests).
    pub fn mark_ready(&self) {
        self.ready.send_replace(true);
    }

    /// Waits until the first list is in.
    pub async fn ready(&self) {
        let mut rx = self.ready.subscribe();
        let _ = rx.wait_for(|r| *r).await;
    }

    pub fn is_ready(&self) -> bool {
        *self.ready.borrow()
    }

    pub fn get(&self, key: &str) -> Option<Arc<K>> {
        self.inner
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .objects
            .get(key)
            .cloned()
    }

    pub fn list(&self) -> Vec<Arc<K>> {
        self.inner
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .objects
            .values()
            .cloned()
            .collect()
    }

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

    /// The objects of a namespace (`""`: cluster-scoped ones).
    pub fn in_namespace(&self, ns: &str) -> Vec<Arc<K>> {
        let g = self.inner.read().unwrap_or_else(|e| e.into_inner());
        g.by_namespace
            .get(ns)
            .map(|ks| {
                ks.iter()
                    .filter_map(|k| g.objects.get(k).cloned())
                    .collect()
            })
            .unwrap_or_default()
    }

    /// The objects with an owner reference to `uid`.
    pub fn owned_by(&self, uid: &str) -> Vec<Arc<K>> {
        let g = self.inner.read().unwrap_or_else(|e| e.into_inner());
        g.by_owner
            .get(uid)
            .map(|ks| {
                ks.iter()
                    .filter_map(|k| g.objects.get(k).cloned())
                    .collect()
            })
            .unwrap_or_default()
    }

    /// The objects of a namespace without a controller owner reference.
    pub fn orphans_in(&self, ns: &str) -> Vec<Arc<K>> {
        let g = self.inner.read().unwrap_or_else(|e| e.into_inner());
        g.orphans
            .get(ns)
            .map(|ks| {
                ks.iter()
                    .filter_map(|k| g.objects.get(k).cloned())
                    .collect()
            })
            .unwrap_or_default()
    }

    pub fn by_uid(&self, uid: &str) -> Option<Arc<K>> {
        let g = self.inner.read().unwrap_or_else(|e| e.into_inner());
        g.by_uid.get(uid).and_then(|k| g.objects.get(k).cloned())
    }

    /// The objects `keep` accepts, shared (no copies).
    pub fn filter(&self, mut keep: impl FnMut(&K) -> bool) -> Vec<Arc<K>> {
        let g = self.inner.read().unwrap_or_else(|e| e.into_inner());
        g.objects.values().filter(|o| keep(o)).cloned().collect()
    }

    /// Calls `f` on every object, under the cache's read lock (no copies).
    pub fn scan(&self, mut f: impl FnMut(&K)) {
        let g = self.inner.read().unwrap_or_else(|e| e.into_inner());
        for o in g.objects.values() {
            f(o);
        }
    }

    /// Every key in the cache.
    pub fn keys(&self) -> Vec<Key> {
        self.inner
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .objects
            .keys()
            .cloned()
            .collect()
    }
}

#[derive(Default)]
struct QState {
    fifo: VecDeque<Key>,
    queued: HashSet<Key>,
    processing: HashSet<Key>,
    dirty: HashSet<Key>,
    failures: HashMap<Key, u32>,
    delayed: HashMap<Key, Instant>,
}

/// A controller's work queue.
pub struct Queue {
    pub name: &'static str,
    st: Mutex<QState>,
    notify: Notify,
}

/// The first retry after a failure; doubled on each further failure.
pub const BACKOFF_BASE: Duration = Duration::from_millis(50);
/// The longest wait between retries.
pub const BACKOFF_MAX: Duration = Duration::from_secs(60);

/// The wait before retry number `failures` (1 = the first retry).
pub fn backoff(failures: u32) -> Duration {
    let shift = failures.saturating_sub(1).min(20);
    BACKOFF_BASE
        .checked_mul(1u32 << shift)
        .unwrap_or(BACKOFF_MAX)
        .min(BACKOFF_MAX)
}

impl Queue {
    pub fn new(name: &'static str) -> Arc<Queue> {
        Arc::new(Queue {
            name,
            st: Mutex::new(QState::default()),
            notify: Notify::new(),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, QState> {
        self.st.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Queues `key` unless it is already waiting; a key being processed is
    /// queued again when its reconcile ends.
    pub fn add(&self, key: impl Into<Key>) {
        let key = key.into();
        let mut st = self.lock();
        if st.queued.contains(&key) {
            return;
        }
        if st.processing.contains(&key) {
            st.dirty.insert(key);
            return;
        }
        st.queued.insert(key.clone());
        st.fifo.push_back(key);
        let depth = st.fifo.len();
        drop(st);
        metrics::queue_depth(self.name, depth);
        self.notify.notify_one();
    }

    /// Queues `key` after `after` (an earlier pending requeue wins).
    pub fn add_after(self: &Arc<Self>, key: impl Into<Key>, after: Duration) {
        let key = key.into();
        if after.is_zero() {
            self.add(key);
            return;
        }
        let at = Instant::now() + after;
        {
            let mut st = self.lock();
            if let Some(t) = st.delayed.get(&key) {
                if *t <= at && *t > Instant::now() {
                    return;
                }
            }
            st.delayed.insert(key.clone(), at);
        }
        let me = Arc::downgrade(self);
        tokio::spawn(async move {
            tokio::time::sleep_until(at.into()).await;
            let Some(me) = me.upgrade() else { return };
            {
                let mut st = me.lock();
                if st.delayed.get(&key) == Some(&at) {
                    st.delayed.remove(&key);
                }
            }
            me.add(key);
        });
    }

    /// Queues `key` after its back-off; returns the wait.
    pub fn add_rate_limited(self: &Arc<Self>, key: &str) -> Duration {
        let n = {
            let mut st = self.lock();
            let n = st.failures.entry(key.to_string()).or_insert(0);
            *n += 1;
            *n
        };
        let d = backoff(n);
        self.add_after(key.to_string(), d);
        d
    }

    /// Resets the back-off of `key` (after a success).
    pub fn forget(&self, key: &str) {
        self.lock().failures.remove(key);
    }

    /// The next key to reconcile; it stays "processing" until [`Queue::done`].
    pub async fn next(&self) -> Key {
        loop {
            let notified = self.notify.notified();
            {
                let mut st = self.lock();
                if let Some(k) = st.fifo.pop_front() {
                    st.queued.remove(&k);
                    st.processing.insert(k.clone());
                    let depth = st.fifo.len();
                    let more = depth > 0;
                    drop(st);
                    metrics::queue_depth(self.name, depth);
                    if more {
                        self.notify.notify_one();
                    }
                    return k;
                }
            }
            notified.await;
        }
    }

    pub fn done(&self, key: &str) {
        let mut st = self.lock();
        st.processing.remove(key);
        if st.dirty.remove(key) {
            st.queued.insert(key.to_string());
            st.fifo.push_back(key.to_string());
            drop(st);
            self.notify.notify_one();
        }
    }

    /// Keys waiting now.
    pub fn depth(&self) -> usize {
        self.lock().fifo.len()
    }
}

/// What a reconcile asks for next.
pub type Next = Option<Duration>;

/// Runs `workers` workers over `queue`, each calling `reconcile(key)`
/// after `ready` resolves. `Ok(Some(d))` requeues after `d`, an error after
/// the key's back-off.
pub fn spawn_workers<F, Fut, R>(
    tasks: &mut tokio::task::JoinSet<()>,
    queue: Arc<Queue>,
    workers: usize,
    ready: R,
    reconcile: F,
) where
    F: Fn(Key) -> Fut + Send + Sync + Clone + 'static,
    Fut: Future<Output = Result<Next, crate::Error>> + Send + 'static,
    R: Future<Output = ()> + Send + 'static,
{
    let ready = futures::FutureExt::shared(Box::pin(ready));
    for _ in 0..workers.max(1) {
        let queue = queue.clone();
        let reconcile = reconcile.clone();
        let ready = ready.clone();
        tasks.spawn(async move {
            ready.await;
            loop {
                let key = queue.next().await;
                let t = Instant::now();
                let r = reconcile(key.clone()).await;
                metrics::reconciled(queue.name, r.is_ok(), t.elapsed());
                match r {
                    Ok(next) => {
                        queue.forget(&key);
                        if let Some(d) = next {
                            queue.add_after(key.clone(), d);
                        }
                    }
                    Err(e) => {
                        let wait = queue.add_rate_limited(&key);
                        tracing::debug!(controller = queue.name, key, error = %e, ?wait, "reconcile failed; retrying");
                    }
                }
                queue.done(&key);
            }
        });
    }
}

/// Queues every key `keys` gives into `queue` every `every` (a safety net
/// for anything a watch could not tell).
pub fn spawn_resync(
    tasks: &mut tokio::task::JoinSet<()>,
    queue: Arc<Queue>,
    every: Duration,
    keys: impl Fn() -> Vec<Key> + Send + 'static,
) {
    tasks.spawn(async move {
        loop {
            tokio::time::sleep(every).await;
            for k in keys() {
                queue.add(k);
            }
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_from_fifty_milliseconds_up_to_a_minute() {
        assert_eq!(backoff(1), Duration::from_millis(50));
        assert_eq!(backoff(2), Duration::from_millis(100));
        assert_eq!(backoff(5), Duration::from_millis(800));
        assert_eq!(backoff(40), BACKOFF_MAX);
    }

    #[tokio::test]
    async fn a_key_is_queued_once_and_requeued_if_it_changes_while_processed() {
        let q = Queue::new("test");
        q.add("a");
        q.add("a");
        q.add("b");
        assert_eq!(q.depth(), 2);
        let k = q.next().await;
        assert_eq!(k, "a");
        q.add("a");
        assert_eq!(q.depth(), 1, "a is processing; it waits for done");
        q.done("a");
        assert_eq!(q.depth(), 2);
        assert_eq!(q.next().await, "b");
        assert_eq!(q.next().await, "a");
    }

    #[tokio::test]
    async fn a_failed_key_comes_back_after_its_backoff() {
        let q = Queue::new("test2");
        let d = q.add_rate_limited("x");
        assert_eq!(d, BACKOFF_BASE);
        assert_eq!(q.depth(), 0);
        let got = tokio::time::timeout(Duration::from_secs(2), q.next()).await;
        assert_eq!(got.ok().as_deref(), Some("x"));
        q.done("x");
        q.forget("x");
    }

    #[test]
    fn the_cache_indexes_objects_by_namespace_owner_and_uid() {
        use k8s_openapi::api::core::v1::Pod;
        let c: Arc<Cache<Pod>> = Cache::new();
        let seen = Arc::new(Mutex::new(vec![]));
        let s = seen.clone();
        c.on_change(move |old, new| {
            s.lock().unwrap().push((old.is_some(), new.is_some()));
        });
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p", "namespace": "ns", "uid": "u1",
                "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "rs", "uid": "o1"}]}
        }))
        .unwrap();
        c.apply(pod.clone());
        c.apply(pod.clone());
        assert_eq!(c.in_namespace("ns").len(), 1);
        assert_eq!(c.owned_by("o1").len(), 1);
        assert!(c.by_uid("u1").is_some());
        assert!(c.get("ns/p").is_some());
        c.delete(&pod);
        assert!(c.owned_by("o1").is_empty());
        assert!(c.in_namespace("ns").is_empty());
        assert_eq!(
            *seen.lock().unwrap(),
            vec![(false, true), (true, true), (true, false)]
        );
    }

    #[test]
    fn the_cache_keeps_objects_without_their_managed_fields() {
        use k8s_openapi::api::core::v1::Pod;
        let c: Arc<Cache<Pod>> = Cache::new();
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p", "namespace": "ns", "uid": "u1", "labels": {"a": "b"},
                "managedFields": [{"manager": "kubectl", "operation": "Update",
                    "apiVersion": "v1", "fieldsType": "FieldsV1",
                    "fieldsV1": {"f:metadata": {"f:labels": {"f:a": {}}}}}]},
            "spec": {"containers": [{"name": "c", "image": "i"}]}
        }))
        .unwrap();
        c.apply(pod.clone());
        let got = c.get("ns/p").unwrap();
        assert_eq!(got.metadata.managed_fields, None);
        let mut want = pod.clone();
        want.metadata.managed_fields = None;
        assert_eq!(*got, want, "everything else is kept");
        c.replace(vec![pod]);
        assert_eq!(c.get("ns/p").unwrap().metadata.managed_fields, None);
    }
}
