//! core/v1 Events for what the controllers do, written in the background
//! by a few workers behind a bounded queue (a saturated recorder drops
//! events rather than slow a controller down, as client-go's broadcaster
//! does). A repeated event (same object, type, reason and message) bumps
//! the count of the first one instead of creating another.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Event;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::Resource;
use serde_json::json;
use tokio::sync::mpsc;

use crate::metrics;

/// Events written recently: key → (event name, count, when).
type Seen = Mutex<HashMap<String, (String, i32, Instant)>>;

struct Pending {
    component: &'static str,
    involved: serde_json::Value,
    namespace: String,
    type_: &'static str,
    reason: String,
    message: String,
}

/// Hands Events to background writers.
#[derive(Clone)]
pub struct Recorder {
    tx: mpsc::Sender<Pending>,
}

const QUEUE: usize = 1000;
const WRITERS: usize = 4;
/// How long a repeated event is folded into the first one.
const AGGREGATE_FOR: Duration = Duration::from_secs(600);

impl Recorder {
    /// A recorder whose writers live in `tasks`.
    pub fn new(client: kube::Client, tasks: &mut tokio::task::JoinSet<()>) -> Recorder {
        let (tx, rx) = mpsc::channel::<Pending>(QUEUE);
        let rx = Arc::new(tokio::sync::Mutex::new(rx));
        let seen: Arc<Seen> = Default::default();
        for _ in 0..WRITERS {
            let rx = rx.clone();
            let client = client.clone();
            let seen = seen.clone();
            tasks.spawn(async move {
                loop {
                    let ev = { rx.lock().await.recv().await };
                    let Some(ev) = ev else { return };
                    write(&client, &seen, ev).await;
                }
            });
        }
        Recorder { tx }
    }

    /// A recorder that drops everything (unit tests).
    pub fn disabled() -> Recorder {
        let (tx, _rx) = mpsc::channel(1);
        Recorder { tx }
    }

    fn send<K: Resource<DynamicType = ()>>(
        &self,
        component: &'static str,
        obj: &K,
        type_: &'static str,
        reason: &str,
        message: String,
    ) {
        let m = obj.meta();
        let namespace = m.namespace.clone().unwrap_or_else(|| "default".into());
        let mut involved = json!({
            "apiVersion": K::api_version(&()),
            "kind": K::kind(&()),
            "name": m.name,
            "uid": m.uid,
            "resourceVersion": m.resource_version,
        });
        if let Some(ns) = &m.namespace {
            involved["namespace"] = json!(ns);
        }
        let ev = Pending {
            component,
            involved,
            namespace,
            type_,
            reason: reason.to_string(),
            message,
        };
        let dropped = self.tx.try_send(ev).is_err();
        metrics::event(component, dropped);
    }

    pub fn normal<K: Resource<DynamicType = ()>>(
        &self,
        component: &'static str,
        obj: &K,
        reason: &str,
        message: String,
    ) {
        self.send(component, obj, "Normal", reason, message)
    }

    pub fn warning<K: Resource<DynamicType = ()>>(
        &self,
        component: &'static str,
        obj: &K,
        reason: &str,
        message: String,
    ) {
        self.send(component, obj, "Warning", reason, message)
    }
}

async fn write(client: &kube::Client, seen: &Seen, ev: Pending) {
    let api: Api<Event> = Api::namespaced(client.clone(), &ev.namespace);
    let now = k8s_openapi::jiff::Timestamp::now();
    let key = format!(
        "{}|{}|{}|{}|{}",
        ev.involved["uid"], ev.component, ev.type_, ev.reason, ev.message
    );
    let prior = {
        let mut s = seen.lock().unwrap_or_else(|e| e.into_inner());
        s.retain(|_, (_, _, t)| t.elapsed() < AGGREGATE_FOR);
        s.get_mut(&key).map(|e| {
            e.1 += 1;
            (e.0.clone(), e.1)
        })
    };
    if let Some((name, count)) = prior {
        let patch = json!({"count": count, "lastTimestamp": now.to_string()});
        if api
            .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .is_ok()
        {
            return;
        }
    }
    let obj_name = ev.involved["name"].as_str().unwrap_or("object").to_string();
    let name = format!("{obj_name}.{:x}", now.as_nanosecond() as u128);
    let body = json!({
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"name": name, "namespace": ev.namespace},
        "involvedObject": ev.involved,
        "reason": ev.reason,
        "message": ev.message,
        "type": ev.type_,
        "source": {"component": ev.component},
        "reportingComponent": ev.component,
        "reportingInstance": ev.component,
        "firstTimestamp": now.to_string(),
        "lastTimestamp": now.to_string(),
        "count": 1,
    });
    let Ok(obj) = serde_json::from_value::<Event>(body) else {
        return;
    };
    match api.create(&PostParams::default(), &obj).await {
        Ok(_) => {
            let mut s = seen.lock().unwrap_or_else(|e| e.into_inner());
            if s.len() > 4096 {
                s.clear();
            }
            s.insert(key, (name, 1, Instant::now()));
        }
        Err(e) => tracing::debug!(error = %e, "writing an event failed"),
    }
}
