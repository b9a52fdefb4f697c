//! The controller builder, shaped after kube-runtime's `Controller`: one
//! value that owns a controller's work queue, the change handlers it puts
//! on the informer caches, its workers, its resync and its readiness.
//!
//! ```ignore
//! Controller::new(ctx, "job", &ctx.caches.jobs)   // a job's own changes
//!     .owns(&ctx.caches.pods, "Job")             // its pods' changes
//!     .resync(Duration::from_secs(60))
//!     .run(tasks, (), |ctx, _, key| async move { reconcile(&ctx, &key).await });
//! ```
//!
//! `new` queues a primary object's key when it is added or updated
//! (kube-runtime's `trigger_self`), `owns` the key of the controller owner
//! of a changed object (`trigger_owners`, by the controller
//! ownerReference), `watches` whatever keys a mapper gives for any other
//! related change (`trigger_others`). `periodic` is the shape of the
//! controllers that do one pass over everything (node lifecycle, pod GC,
//! the garbage collector): one key, requeued a period after each pass.
//! The workers start once the shared caches are listed (or another
//! `ready`), and every reconcile is counted in the metrics by the queue's
//! name. The parts (queue, workers) are in `framework` for the rare
//! wiring this does not cover.

use std::fmt::Debug;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use kube::Resource;

use crate::framework::{self, key_of, Cache, Key, Next, Queue};
use crate::{common, Ctx, Error};

type Keys = Arc<dyn Fn() -> Vec<Key> + Send + Sync>;

/// A controller being assembled; nothing runs until [`Controller::run`].
#[must_use = "a controller does nothing until it runs"]
pub struct Controller {
    ctx: Arc<Ctx>,
    queue: Arc<Queue>,
    workers: usize,
    primary_keys: Option<Keys>,
    resync: Option<Duration>,
    period: Option<Duration>,
    ready: Option<BoxFuture<'static, ()>>,
}

impl Controller {
    /// A controller named `name` (its queue and metrics label) whose keys
    /// come only from [`Controller::watches`] and [`Controller::owns`].
    pub fn named(ctx: &Arc<Ctx>, name: &'static str) -> Controller {
        Controller {
            ctx: ctx.clone(),
            queue: Queue::new(name),
            workers: 2,
            primary_keys: None,
            resync: None,
            period: None,
            ready: None,
        }
    }

    /// A controller of the objects of `primary`: each one's key is queued
    /// when it is added or updated (a deletion is left to the garbage
    /// collector, as in kube-runtime; [`Controller::watches`] can add it).
    pub fn new<K>(ctx: &Arc<Ctx>, name: &'static str, primary: &Arc<Cache<K>>) -> Controller
    where
        K: Resource + Clone + serde::de::DeserializeOwned + Debug + Send + Sync + 'static,
        K::DynamicType: Default,
    {
        let cache = primary.clone();
        Controller {
            primary_keys: Some(Arc::new(move || cache.keys())),
            ..Controller::named(ctx, name)
        }
        .watches(primary, |_, _, new| new.map(|o| key_of(o.meta())))
    }

    /// A controller of one pass over everything: its one key (`""`) is
    /// queued once the caches are listed and again `every` after each pass
    /// ends (a pass asking for an earlier requeue gets it; a failed pass is
    /// retried after its back-off). The pass sees no key worth reading.
    pub fn periodic(ctx: &Arc<Ctx>, name: &'static str, every: Duration) -> Controller {
        Controller {
            period: Some(every),
            workers: 1,
            ..Controller::named(ctx, name)
        }
    }

    /// Queues the keys `mapper(ctx, old, new)` gives for every change in
    /// `cache` (`new` is None for a deletion, `old` None for an addition).
    pub fn watches<R, I>(
        self,
        cache: &Arc<Cache<R>>,
        mapper: impl Fn(&Ctx, Option<&R>, Option<&R>) -> I + Send + Sync + 'static,
    ) -> Controller
    where
        R: Resource + Clone + serde::de::DeserializeOwned + Debug + Send + Sync + 'static,
        R::DynamicType: Default,
        I: IntoIterator<Item = Key>,
    {
        let queue = self.queue.clone();
        // The handlers live in the caches, which live in the context: a
        // weak reference keeps that from being a cycle.
        let ctx = Arc::downgrade(&self.ctx);
        cache.on_change(move |old, new| {
            let Some(ctx) = ctx.upgrade() else { return };
            for k in mapper(&ctx, old, new) {
                queue.add(k);
            }
        });
        self
    }

    /// Queues the controller owner (of `kind`) of every object of `cache`
    /// that changes, before and after the change.
    pub fn owns<R>(self, cache: &Arc<Cache<R>>, kind: &'static str) -> Controller
    where
        R: Resource + Clone + serde::de::DeserializeOwned + Debug + Send + Sync + 'static,
        R::DynamicType: Default,
    {
        self.watches(cache, move |_, old, new| common::owner_keys(kind, old, new))
    }

    /// How many keys are reconciled at once (2 unless set; 1 for
    /// `periodic`). One key is never reconciled by two workers at once.
    pub fn workers(mut self, n: usize) -> Controller {
        self.workers = n.max(1);
        self
    }

    /// Queues every primary object again every `every`: a safety net for
    /// anything a watch could not tell (kube-controller-manager's informer
    /// resync). Only for controllers made by [`Controller::new`].
    pub fn resync(mut self, every: Duration) -> Controller {
        self.resync = Some(every);
        self
    }

    /// What the workers wait for before the first reconcile (the shared
    /// caches' first list unless set).
    pub fn ready(mut self, ready: impl Future<Output = ()> + Send + 'static) -> Controller {
        self.ready = Some(Box::pin(ready));
        self
    }

    /// The work queue, for keys from a source that is not a cache.
    pub fn queue(&self) -> Arc<Queue> {
        self.queue.clone()
    }

    /// Starts the workers (and the resync) on `tasks`: each reconciles a key
    /// with `reconcile(ctx, state, key)`; `Ok(Some(d))` requeues it after
    /// `d`, an error after the key's back-off.
    pub fn run<S, F, Fut>(self, tasks: &mut tokio::task::JoinSet<()>, state: S, reconcile: F)
    where
        S: Clone + Send + Sync + 'static,
        F: Fn(Arc<Ctx>, S, Key) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<Next, Error>> + Send + 'static,
    {
        let ready = match self.ready {
            Some(r) => r,
            None => Box::pin(self.ctx.ready()),
        };
        let period = self.period;
        if period.is_some() {
            self.queue.add(Key::new());
        }
        let ctx = self.ctx.clone();
        let reconcile = Arc::new(reconcile);
        framework::spawn_workers(tasks, self.queue.clone(), self.workers, ready, move |key| {
            let pass = reconcile(ctx.clone(), state.clone(), key);
            async move { Ok(pass.await?.or(period)) }
        });
        if let (Some(every), Some(keys)) = (self.resync, self.primary_keys) {
            framework::spawn_resync(tasks, self.queue, every, move || keys());
        }
    }
}
