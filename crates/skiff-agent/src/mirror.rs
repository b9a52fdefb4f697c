//! Keeping an in-memory copy of one kind of cluster object: a watch whose
//! added or changed objects are set, deleted ones removed, and after each
//! (re)list whatever the list no longer has removed too. The DNS responder's
//! records and the service environment variables are both such copies.

use std::collections::HashSet;
use std::time::Duration;

use futures::StreamExt;
use kube::api::Api;
use kube::runtime::watcher;
use kube::ResourceExt;

/// What a copy does with each change: set `(namespace, name)` to an object,
/// delete it, and learn that a complete list has been applied.
pub trait Copy<K>: Send {
    fn set(&mut self, namespace: &str, name: &str, object: &K);
    fn delete(&mut self, namespace: &str, name: &str);
    fn listed(&mut self) {}
}

/// Follows every object of kind `K` into `copy` until the watch ends; `what`
/// names the kind in logs.
pub async fn mirror<K>(client: kube::Client, what: &str, mut copy: impl Copy<K>)
where
    K: kube::Resource<DynamicType = ()>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug
        + Send
        + 'static,
{
    let api: Api<K> = Api::all(client);
    let mut stream = watcher(api, watcher::Config::default()).boxed();
    let mut known: HashSet<(String, String)> = HashSet::new();
    let mut listing: Option<HashSet<(String, String)>> = None;
    while let Some(ev) = stream.next().await {
        let ev = match ev {
            Ok(ev) => ev,
            Err(e) => {
                tracing::debug!(error = %e, "{what} watch error");
                tokio::time::sleep(Duration::from_millis(500)).await;
                continue;
            }
        };
        let key = |o: &K| (o.namespace().unwrap_or_default(), o.name_any());
        match ev {
            watcher::Event::Init => listing = Some(HashSet::new()),
            watcher::Event::InitApply(o) | watcher::Event::Apply(o) => {
                let k = key(&o);
                copy.set(&k.0, &k.1, &o);
                if let Some(l) = listing.as_mut() {
                    l.insert(k.clone());
                }
                known.insert(k);
            }
            watcher::Event::Delete(o) => {
                let k = key(&o);
                copy.delete(&k.0, &k.1);
                known.remove(&k);
            }
            watcher::Event::InitDone => {
                let seen = listing.take().unwrap_or_default();
                for k in known.difference(&seen) {
                    copy.delete(&k.0, &k.1);
                }
                known = seen;
                copy.listed();
            }
        }
    }
}
