//! Events users see (`kubectl describe pod`): Scheduled, FailedScheduling,
//! Preempted. Written by a background task; like client-go's recorder, it
//! drops events rather than slow scheduling down when the API is backed up.

use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

use futures::StreamExt;
use k8s_openapi::api::core::v1::{Event, EventSource, ObjectReference};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, PostParams};
use rand::Rng;
use tokio::sync::mpsc;

use crate::metrics::Metrics;
use crate::types::PodInfo;

/// How many events may wait to be written (beyond: dropped, as client-go's
/// broadcaster does when it is backed up).
pub const QUEUE: usize = 65_536;
/// How many event writes run at once: few, so that events never compete
/// hard with bindings; a burst is written out behind the binds.
pub const CONCURRENCY: usize = 4;

#[derive(Clone)]
pub struct Recorder {
    tx: Option<mpsc::Sender<Event>>,
    metrics: Arc<Metrics>,
    instance: String,
}

impl Recorder {
    /// A recorder writing through `client` (none: events are only counted).
    pub fn start(client: Option<kube::Client>, metrics: Arc<Metrics>) -> Recorder {
        let instance = format!("skiff-scheduler-{:08x}", rand::rng().random::<u32>());
        let Some(client) = client else {
            return Recorder {
                tx: None,
                metrics,
                instance,
            };
        };
        let (tx, rx) = mpsc::channel::<Event>(QUEUE);
        let m = metrics.clone();
        tokio::spawn(async move {
            let stream =
                futures::stream::unfold(
                    rx,
                    |mut rx| async move { rx.recv().await.map(|e| (e, rx)) },
                );
            stream
                .for_each_concurrent(CONCURRENCY, |ev| {
                    let client = client.clone();
                    let m = m.clone();
                    async move {
                        let ns = ev.metadata.namespace.clone().unwrap_or_default();
                        let api: Api<Event> = Api::namespaced(client, &ns);
                        match api.create(&PostParams::default(), &ev).await {
                            Ok(_) => {
                                m.events_written.fetch_add(1, Relaxed);
                            }
                            Err(e) => tracing::debug!(error = %e, "writing an event failed"),
                        }
                    }
                })
                .await;
        });
        Recorder {
            tx: Some(tx),
            metrics,
            instance,
        }
    }

    /// Records an event about `pod`.
    pub fn pod_event(
        &self,
        pod: &PodInfo,
        component: &str,
        type_: &str,
        reason: &str,
        action: &str,
        message: String,
    ) {
        let Some(tx) = &self.tx else { return };
        let now = Time(Timestamp::now());
        let suffix: u64 = rand::rng().random();
        let ev = Event {
            metadata: ObjectMeta {
                name: Some(format!("{}.{:016x}", pod.name, suffix)),
                namespace: Some(pod.namespace.clone()),
                ..Default::default()
            },
            involved_object: ObjectReference {
                api_version: Some("v1".into()),
                kind: Some("Pod".into()),
                name: Some(pod.name.clone()),
                namespace: Some(pod.namespace.clone()),
                uid: Some(pod.uid.clone()),
                resource_version: pod.pod.metadata.resource_version.clone(),
                field_path: None,
            },
            reason: Some(reason.into()),
            message: Some(message),
            type_: Some(type_.into()),
            source: Some(EventSource {
                component: Some(component.into()),
                host: None,
            }),
            reporting_component: Some(component.into()),
            reporting_instance: Some(self.instance.clone()),
            action: Some(action.into()),
            first_timestamp: Some(now.clone()),
            last_timestamp: Some(now),
            count: Some(1),
            ..Default::default()
        };
        if tx.try_send(ev).is_err() {
            self.metrics.events_dropped.fetch_add(1, Relaxed);
        }
    }
}
