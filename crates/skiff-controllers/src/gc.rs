//! The garbage collector. Once a second it sweeps the caches:
//! - a dependent whose owners are all gone (absent, or present with another
//!   uid) is deleted in the background, after a live look-up confirms that
//!   no owner exists (the caches of different kinds may lag each other);
//! - an owner being deleted with the `foregroundDeletion` finalizer has its
//!   dependents deleted (in the foreground too, so chains cascade), and the
//!   finalizer removed once no dependent with blockOwnerDeletion remains;
//! - an owner being deleted with the `orphan` finalizer has its owner
//!   reference removed from every dependent, then the finalizer removed.
//!
//! Dependents are objects of the kinds the controller manager caches, and
//! custom resources: the Established CustomResourceDefinitions are read
//! every few seconds, and each one's objects are kept by a metadata-only
//! watch (`Watched`, as kube-controller-manager's metadata informers) that
//! starts and stops with its definition; owners of other kinds are looked
//! up through discovery and a live GET.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::api::{
    Api, ApiResource, DeleteParams, DynamicObject, GroupVersionKind, Patch, PatchParams,
    Preconditions, PropagationPolicy,
};
use kube::Resource;
use serde_json::{json, Value};

use crate::common;
use crate::controller::Controller;
use crate::framework::Cache;
use crate::Ctx;

/// One cached kind, seen through its metadata.
pub trait Source: Send + Sync {
    fn resource(&self) -> ApiResource;
    fn namespaced(&self) -> bool;
    fn scan_meta(&self, f: &mut dyn FnMut(&ObjectMeta));
    /// Whether the cache holds an object with this uid and name (without
    /// copying its metadata: the sweep asks for every owner reference).
    fn has_uid_named(&self, uid: &str, name: &str) -> bool;
    fn dependents_of(&self, uid: &str) -> Vec<ObjectMeta>;
}

struct Typed<K> {
    cache: Arc<Cache<K>>,
    namespaced: bool,
}

impl<K> Source for Typed<K>
where
    K: Resource<DynamicType = ()>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug
        + Send
        + Sync
        + 'static,
{
    fn resource(&self) -> ApiResource {
        ApiResource::erase::<K>(&())
    }
    fn namespaced(&self) -> bool {
        self.namespaced
    }
    fn scan_meta(&self, f: &mut dyn FnMut(&ObjectMeta)) {
        self.cache.scan(|o| f(o.meta()));
    }
    fn has_uid_named(&self, uid: &str, name: &str) -> bool {
        self.cache
            .by_uid(uid)
            .map(|o| o.meta().name.as_deref() == Some(name))
            .unwrap_or(false)
    }
    fn dependents_of(&self, uid: &str) -> Vec<ObjectMeta> {
        self.cache
            .owned_by(uid)
            .iter()
            .map(|o| o.meta().clone())
            .collect()
    }
}

fn typed<K>(cache: &Arc<Cache<K>>, namespaced: bool) -> Box<dyn Source>
where
    K: Resource<DynamicType = ()>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug
        + Send
        + Sync
        + 'static,
{
    Box::new(Typed {
        cache: cache.clone(),
        namespaced,
    })
}

/// A custom resource's objects' metadata by uid, kept by a metadata watch
/// for as long as the value lives (dropping it stops the watch).
struct Watched {
    ar: ApiResource,
    namespaced: bool,
    items: Arc<RwLock<HashMap<String, ObjectMeta>>>,
    /// The first list is in.
    ready: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Watched {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Watched {
    fn start(client: &kube::Client, ar: &ApiResource, namespaced: bool) -> Watched {
        use futures::StreamExt;
        use kube::core::PartialObjectMeta;
        use kube::runtime::{watcher, WatchStreamExt};
        // Metadata-only lists and watches.
        let api: Api<PartialObjectMeta<DynamicObject>> = Api::all_with(client.clone(), ar);
        let items: Arc<RwLock<HashMap<String, ObjectMeta>>> = Arc::default();
        let ready = Arc::new(AtomicBool::new(false));
        let (into, done) = (items.clone(), ready.clone());
        let kind = ar.kind.clone();
        let task = tokio::spawn(async move {
            let mut stream = watcher(api, watcher::Config::default())
                .default_backoff()
                .boxed();
            let mut buffer: HashMap<String, ObjectMeta> = HashMap::new();
            let uid = |m: &ObjectMeta| m.uid.clone().unwrap_or_default();
            while let Some(ev) = stream.next().await {
                match ev {
                    Ok(watcher::Event::Apply(o)) => {
                        write(&into).insert(uid(&o.metadata), o.metadata);
                    }
                    Ok(watcher::Event::Delete(o)) => {
                        write(&into).remove(&uid(&o.metadata));
                    }
                    Ok(watcher::Event::Init) => buffer.clear(),
                    Ok(watcher::Event::InitApply(o)) => {
                        buffer.insert(uid(&o.metadata), o.metadata);
                    }
                    Ok(watcher::Event::InitDone) => {
                        *write(&into) = std::mem::take(&mut buffer);
                        done.store(true, Ordering::Release);
                    }
                    Err(e) => tracing::debug!(kind, error = %e, "watching custom resources"),
                }
            }
        });
        Watched {
            ar: ar.clone(),
            namespaced,
            items,
            ready,
            task,
        }
    }

    /// What a sweep reads: the objects as they are now.
    fn source(&self) -> Option<Box<dyn Source>> {
        self.ready.load(Ordering::Acquire).then(|| {
            Box::new(WatchedView {
                ar: self.ar.clone(),
                namespaced: self.namespaced,
                items: self.items.clone(),
            }) as Box<dyn Source>
        })
    }
}

fn write<T>(l: &RwLock<T>) -> std::sync::RwLockWriteGuard<'_, T> {
    l.write().unwrap_or_else(|e| e.into_inner())
}

fn read<T>(l: &RwLock<T>) -> std::sync::RwLockReadGuard<'_, T> {
    l.read().unwrap_or_else(|e| e.into_inner())
}

struct WatchedView {
    ar: ApiResource,
    namespaced: bool,
    items: Arc<RwLock<HashMap<String, ObjectMeta>>>,
}

impl Source for WatchedView {
    fn resource(&self) -> ApiResource {
        self.ar.clone()
    }
    fn namespaced(&self) -> bool {
        self.namespaced
    }
    fn scan_meta(&self, f: &mut dyn FnMut(&ObjectMeta)) {
        read(&self.items).values().for_each(f);
    }
    fn has_uid_named(&self, uid: &str, name: &str) -> bool {
        read(&self.items)
            .get(uid)
            .is_some_and(|m| m.name.as_deref() == Some(name))
    }
    fn dependents_of(&self, uid: &str) -> Vec<ObjectMeta> {
        read(&self.items)
            .values()
            .filter(|m| m.owner_references.iter().flatten().any(|r| r.uid == uid))
            .cloned()
            .collect()
    }
}

/// The custom resources to collect: one per Established definition, at its
/// storage version.
async fn custom_kinds(client: &kube::Client) -> Vec<(ApiResource, bool)> {
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
    let Ok(list) = Api::<CustomResourceDefinition>::all(client.clone())
        .list(&Default::default())
        .await
    else {
        return Vec::new();
    };
    list.items
        .into_iter()
        .filter(|c| {
            c.status
                .as_ref()
                .and_then(|s| s.conditions.as_ref())
                .map(|cs| {
                    cs.iter()
                        .any(|c| c.type_ == "Established" && c.status == "True")
                })
                .unwrap_or(false)
        })
        .filter_map(|c| {
            let v = c.spec.versions.iter().find(|v| v.storage && v.served)?;
            let group = c.spec.group.clone();
            Some((
                ApiResource {
                    api_version: format!("{group}/{}", v.name),
                    group,
                    version: v.name.clone(),
                    kind: c.spec.names.kind.clone(),
                    plural: c.spec.names.plural.clone(),
                },
                c.spec.scope == "Namespaced",
            ))
        })
        .collect()
}

fn sources(ctx: &Ctx) -> Vec<Box<dyn Source>> {
    let c = &ctx.caches;
    vec![
        typed(&c.pods, true),
        typed(&c.replicasets, true),
        typed(&c.replication_controllers, true),
        typed(&c.deployments, true),
        typed(&c.jobs, true),
        typed(&c.cronjobs, true),
        typed(&c.daemonsets, true),
        typed(&c.statefulsets, true),
        typed(&c.controller_revisions, true),
        typed(&c.pvcs, true),
        typed(&c.pdbs, true),
        typed(&c.services, true),
        typed(&c.endpoint_slices, true),
        typed(&c.resource_quotas, true),
        typed(&c.nodes, false),
        typed(&c.namespaces, false),
    ]
}

/// What the collector keeps between passes.
#[derive(Default)]
struct Memory {
    /// Discovery's answers about owner kinds.
    kinds: HashMap<(String, String), Option<(ApiResource, bool)>>,
    /// Owners confirmed alive by a live read, and when.
    alive: HashMap<String, std::time::Instant>,
    /// Custom kinds by "apiVersion/kind", each with its watch.
    custom: HashMap<String, Watched>,
    /// When the custom kinds were last read.
    custom_read: Option<std::time::Instant>,
}

pub fn register(ctx: &Arc<Ctx>, tasks: &mut tokio::task::JoinSet<()>) {
    let memory = Arc::new(tokio::sync::Mutex::new(Memory::default()));
    Controller::periodic(ctx, "garbagecollector", Duration::from_secs(1)).run(
        tasks,
        memory,
        |c, memory, _| async move {
            pass(&c, &mut *memory.lock().await).await;
            Ok(None)
        },
    );
}

async fn pass(ctx: &Ctx, m: &mut Memory) {
    m.alive
        .retain(|_, at| at.elapsed() < Duration::from_secs(30));
    if m.custom_read
        .is_none_or(|t| t.elapsed() >= Duration::from_secs(5))
    {
        let fresh: HashMap<String, (ApiResource, bool)> = custom_kinds(&ctx.client)
            .await
            .into_iter()
            .map(|(a, n)| (format!("{}/{}", a.api_version, a.kind), (a, n)))
            .collect();
        let before = m.custom.len();
        m.custom
            .retain(|k, w| fresh.get(k).is_some_and(|(_, n)| *n == w.namespaced));
        let mut changed = m.custom.len() != before;
        for (k, (ar, namespaced)) in fresh {
            if let std::collections::hash_map::Entry::Vacant(e) = m.custom.entry(k) {
                e.insert(Watched::start(&ctx.client, &ar, namespaced));
                changed = true;
            }
        }
        if changed {
            // Owners confirmed alive while their kind was not
            // cached are now in the caches.
            m.alive.clear();
        }
        m.custom_read = Some(std::time::Instant::now());
        // Discovery answers about kinds may have changed with them.
        m.kinds.retain(|_, v| v.is_some());
    }
    let mut srcs = sources(ctx);
    srcs.extend(m.custom.values().filter_map(Watched::source));
    sweep(ctx, &srcs, &mut m.kinds, &mut m.alive).await;
}

/// Whether an owner reference points at an object that exists with that uid,
/// according to the caches (`None`: the owner's kind is not cached).
/// `kinds` holds each source's (apiVersion, kind).
fn cached_owner_exists(
    srcs: &[Box<dyn Source>],
    kinds: &[(String, String)],
    r: &OwnerReference,
) -> Option<bool> {
    let i = kinds
        .iter()
        .position(|(av, k)| *k == r.kind && *av == r.api_version)?;
    let src = &srcs[i];
    Some(src.has_uid_named(&r.uid, &r.name))
}

fn split_api_version(av: &str) -> (String, String) {
    match av.split_once('/') {
        Some((g, v)) => (g.to_string(), v.to_string()),
        None => (String::new(), av.to_string()),
    }
}

async fn resolve(
    client: &kube::Client,
    kinds: &mut HashMap<(String, String), Option<(ApiResource, bool)>>,
    api_version: &str,
    kind: &str,
) -> Option<(ApiResource, bool)> {
    let k = (api_version.to_string(), kind.to_string());
    if let Some(v) = kinds.get(&k) {
        return v.clone();
    }
    let (group, version) = split_api_version(api_version);
    let gvk = GroupVersionKind::gvk(&group, &version, kind);
    let v = match kube::discovery::pinned_kind(client, &gvk).await {
        Ok((ar, caps)) => Some((ar, caps.scope == kube::discovery::Scope::Namespaced)),
        Err(_) => None,
    };
    kinds.insert(k, v.clone());
    v
}

fn dyn_api(
    client: &kube::Client,
    ar: &ApiResource,
    namespaced: bool,
    ns: &str,
) -> Api<DynamicObject> {
    if namespaced {
        Api::namespaced_with(client.clone(), ns, ar)
    } else {
        Api::all_with(client.clone(), ar)
    }
}

/// A live check that an owner exists with the referenced uid (an owner of
/// an unknown kind counts as existing: nothing is deleted on a guess).
async fn owner_exists_live(
    client: &kube::Client,
    kinds: &mut HashMap<(String, String), Option<(ApiResource, bool)>>,
    ns: &str,
    r: &OwnerReference,
) -> bool {
    let Some((ar, namespaced)) = resolve(client, kinds, &r.api_version, &r.kind).await else {
        return true;
    };
    match dyn_api(client, &ar, namespaced, ns).get_opt(&r.name).await {
        Ok(Some(o)) => o.metadata.uid.as_deref() == Some(r.uid.as_str()),
        Ok(None) => false,
        Err(_) => true,
    }
}

/// Whether removing finalizer `f` leaves a deleting object with no
/// finalizer and a zero grace period (nothing else will delete it).
pub fn last_finalizer_of_finished(m: &ObjectMeta, f: &str) -> bool {
    m.deletion_grace_period_seconds == Some(0) && m.finalizers.iter().flatten().all(|x| x == f)
}

/// Which dependents the caches say have lost every owner.
pub fn orphaned(meta: &ObjectMeta, exists: impl Fn(&OwnerReference) -> Option<bool>) -> bool {
    let refs = meta.owner_references.as_deref().unwrap_or(&[]);
    !refs.is_empty() && refs.iter().all(|r| exists(r) != Some(true))
}

async fn sweep(
    ctx: &Ctx,
    srcs: &[Box<dyn Source>],
    kinds: &mut HashMap<(String, String), Option<(ApiResource, bool)>>,
    alive: &mut HashMap<String, std::time::Instant>,
) {
    let client = &ctx.client;
    let cached: Vec<(String, String)> = srcs
        .iter()
        .map(|s| {
            let ar = s.resource();
            (ar.api_version, ar.kind)
        })
        .collect();
    // 1. Dependents of vanished owners.
    let mut suspects: Vec<(usize, ObjectMeta)> = vec![];
    for (i, s) in srcs.iter().enumerate() {
        s.scan_meta(&mut |m| {
            if m.deletion_timestamp.is_none()
                && orphaned(m, |r| cached_owner_exists(srcs, &cached, r).or(Some(false)))
            {
                suspects.push((i, m.clone()));
            }
        });
    }
    for (i, m) in suspects {
        let ns = m.namespace.clone().unwrap_or_default();
        let mut gone = true;
        for r in m.owner_references.iter().flatten() {
            // Owners of kinds not cached, confirmed recently, are not
            // looked up again on every sweep.
            let in_cache = cached_owner_exists(srcs, &cached, r);
            if alive.contains_key(&r.uid) || in_cache == Some(true) {
                gone = false;
                break;
            }
            if owner_exists_live(client, kinds, &ns, r).await {
                if in_cache.is_none() {
                    alive.insert(r.uid.clone(), std::time::Instant::now());
                }
                gone = false;
                break;
            }
        }
        if !gone {
            continue;
        }
        let src = &srcs[i];
        let dp = DeleteParams {
            preconditions: Some(Preconditions {
                uid: m.uid.clone(),
                resource_version: None,
            }),
            propagation_policy: Some(PropagationPolicy::Background),
            ..Default::default()
        };
        let name = m.name.clone().unwrap_or_default();
        match dyn_api(client, &src.resource(), src.namespaced(), &ns)
            .delete(&name, &dp)
            .await
        {
            Ok(_) => tracing::debug!(kind = src.resource().kind, ns, name, "collected"),
            Err(e) if common::is_not_found(&e) || common::is_conflict(&e) => {}
            Err(e) => tracing::debug!(ns, name, error = %e, "garbage collection failed"),
        }
    }

    // 2. Objects whose deletion was confirmed (grace 0) and that lost
    // their last finalizer but still exist: nothing else will delete them.
    let mut leftovers: Vec<(usize, ObjectMeta)> = vec![];
    for (i, s) in srcs.iter().enumerate() {
        s.scan_meta(&mut |m| {
            if m.deletion_timestamp.is_some()
                && m.deletion_grace_period_seconds == Some(0)
                && m.finalizers.as_ref().map(|f| f.is_empty()).unwrap_or(true)
            {
                leftovers.push((i, m.clone()));
            }
        });
    }
    for (i, m) in leftovers {
        let src = &srcs[i];
        let dp = DeleteParams {
            grace_period_seconds: Some(0),
            preconditions: Some(Preconditions {
                uid: m.uid.clone(),
                resource_version: None,
            }),
            ..Default::default()
        };
        let ns = m.namespace.clone().unwrap_or_default();
        let _ = dyn_api(client, &src.resource(), src.namespaced(), &ns)
            .delete(m.name.as_deref().unwrap_or(""), &dp)
            .await;
    }

    // 3. Owners deleted in the foreground or orphaning their dependents.
    let mut owners: Vec<(usize, ObjectMeta)> = vec![];
    for (i, s) in srcs.iter().enumerate() {
        s.scan_meta(&mut |m| {
            if m.deletion_timestamp.is_some()
                && m.finalizers
                    .iter()
                    .flatten()
                    .any(|f| f == "orphan" || f == "foregroundDeletion")
            {
                owners.push((i, m.clone()));
            }
        });
    }
    for (i, m) in owners {
        let uid = m.uid.clone().unwrap_or_default();
        let ns = m.namespace.clone().unwrap_or_default();
        let finalizers = m.finalizers.clone().unwrap_or_default();
        let deps: Vec<(usize, ObjectMeta)> = srcs
            .iter()
            .enumerate()
            .flat_map(|(j, s)| s.dependents_of(&uid).into_iter().map(move |d| (j, d)))
            .collect();
        let done = if finalizers.iter().any(|f| f == "orphan") {
            let mut ok = true;
            for (j, d) in &deps {
                let refs: Vec<&OwnerReference> = d
                    .owner_references
                    .iter()
                    .flatten()
                    .filter(|r| r.uid != uid)
                    .collect();
                let refs = if refs.is_empty() {
                    Value::Null
                } else {
                    json!(refs)
                };
                let patch = json!({"metadata": {"ownerReferences": refs, "resourceVersion": d.resource_version}});
                let src = &srcs[*j];
                let dns = d.namespace.clone().unwrap_or_default();
                if let Err(e) = dyn_api(client, &src.resource(), src.namespaced(), &dns)
                    .patch(
                        d.name.as_deref().unwrap_or(""),
                        &PatchParams::default(),
                        &Patch::Merge(&patch),
                    )
                    .await
                {
                    if !common::is_not_found(&e) {
                        ok = false;
                    }
                }
            }
            ok.then_some("orphan")
        } else {
            let mut blocking = 0;
            for (j, d) in &deps {
                let blocks = d
                    .owner_references
                    .iter()
                    .flatten()
                    .any(|r| r.uid == uid && r.block_owner_deletion == Some(true));
                if blocks {
                    blocking += 1;
                }
                if d.deletion_timestamp.is_some() {
                    continue;
                }
                let src = &srcs[*j];
                let dns = d.namespace.clone().unwrap_or_default();
                let dp = DeleteParams {
                    propagation_policy: Some(PropagationPolicy::Foreground),
                    preconditions: Some(Preconditions {
                        uid: d.uid.clone(),
                        resource_version: None,
                    }),
                    ..Default::default()
                };
                if let Err(e) = dyn_api(client, &src.resource(), src.namespaced(), &dns)
                    .delete(d.name.as_deref().unwrap_or(""), &dp)
                    .await
                {
                    tracing::debug!(error = %e, "foreground deletion of a dependent failed");
                }
            }
            (blocking == 0).then_some("foregroundDeletion")
        };
        if let Some(f) = done {
            let rest: Vec<&String> = finalizers.iter().filter(|x| *x != f).collect();
            let rest = if rest.is_empty() {
                Value::Null
            } else {
                json!(rest)
            };
            let patch =
                json!({"metadata": {"finalizers": rest, "resourceVersion": m.resource_version}});
            let src = &srcs[i];
            let api = dyn_api(client, &src.resource(), src.namespaced(), &ns);
            let name = m.name.as_deref().unwrap_or("");
            match api
                .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
                .await
            {
                Err(e) => tracing::debug!(error = %e, "removing the {f} finalizer failed"),
                Ok(_) if last_finalizer_of_finished(&m, f) => {
                    // Its graceful deletion was already confirmed (grace 0,
                    // e.g. by the node agent): with no finalizer left it
                    // can go now.
                    let dp = DeleteParams {
                        grace_period_seconds: Some(0),
                        preconditions: Some(Preconditions {
                            uid: m.uid.clone(),
                            resource_version: None,
                        }),
                        ..Default::default()
                    };
                    if let Err(e) = api.delete(name, &dp).await {
                        if !common::is_not_found(&e) {
                            tracing::debug!(error = %e, "deleting a finalized object failed");
                        }
                    }
                }
                Ok(_) => {}
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meta(owners: &[(&str, &str)]) -> ObjectMeta {
        ObjectMeta {
            name: Some("d".into()),
            owner_references: Some(
                owners
                    .iter()
                    .map(|(name, uid)| OwnerReference {
                        api_version: "apps/v1".into(),
                        kind: "ReplicaSet".into(),
                        name: name.to_string(),
                        uid: uid.to_string(),
                        ..Default::default()
                    })
                    .collect(),
            ),
            ..Default::default()
        }
    }

    #[test]
    fn a_dependent_is_orphaned_only_when_every_owner_is_gone() {
        let live = |r: &OwnerReference| Some(r.uid == "alive");
        assert!(orphaned(&meta(&[("a", "dead")]), live));
        assert!(!orphaned(&meta(&[("a", "dead"), ("b", "alive")]), live));
        assert!(!orphaned(&meta(&[]), live), "no owners: not a dependent");
    }

    #[test]
    fn an_object_whose_deletion_was_confirmed_goes_with_its_last_finalizer() {
        let mut m = meta(&[]);
        m.finalizers = Some(vec!["foregroundDeletion".into()]);
        m.deletion_grace_period_seconds = Some(0);
        assert!(last_finalizer_of_finished(&m, "foregroundDeletion"));
        m.deletion_grace_period_seconds = Some(30);
        assert!(
            !last_finalizer_of_finished(&m, "foregroundDeletion"),
            "still terminating"
        );
        m.deletion_grace_period_seconds = Some(0);
        m.finalizers = Some(vec!["foregroundDeletion".into(), "example.com/keep".into()]);
        assert!(!last_finalizer_of_finished(&m, "foregroundDeletion"));
    }

    #[test]
    fn an_owner_with_the_same_name_but_another_uid_counts_as_gone() {
        let by_uid = |r: &OwnerReference| Some(r.uid == "new-uid");
        assert!(orphaned(&meta(&[("a", "old-uid")]), by_uid));
    }
}
