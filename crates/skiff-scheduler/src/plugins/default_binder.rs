//! DefaultBinder: binds through the API (`POST pods/{name}/binding`).

use std::sync::Arc;
use std::time::Instant;

use futures::future::BoxFuture;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, PostParams};
use serde_json::json;

use crate::framework::{BindPlugin, Code, Plugin, Status};
use crate::metrics::Metrics;
use crate::types::PodInfo;

pub const NAME: &str = "DefaultBinder";

pub struct DefaultBinder {
    pub client: Option<kube::Client>,
    pub metrics: Arc<Metrics>,
}

impl Plugin for DefaultBinder {
    fn name(&self) -> &'static str {
        NAME
    }
    fn as_bind(&self) -> Option<&dyn BindPlugin> {
        Some(self)
    }
}

impl BindPlugin for DefaultBinder {
    fn bind(&self, pod: Arc<PodInfo>, node: String) -> BoxFuture<'static, Status> {
        let client = self.client.clone();
        let metrics = self.metrics.clone();
        Box::pin(async move {
            let Some(client) = client else {
                return Status::error("no API client to bind with");
            };
            let api: Api<Pod> = Api::namespaced(client, &pod.namespace);
            let body = json!({
                "apiVersion": "v1",
                "kind": "Binding",
                "metadata": {"name": pod.name, "namespace": pod.namespace, "uid": pod.uid},
                "target": {"apiVersion": "v1", "kind": "Node", "name": node},
            });
            let t = Instant::now();
            let r = api
                .create_subresource::<_, serde_json::Value>(
                    "binding",
                    &pod.name,
                    &PostParams::default(),
                    &body,
                )
                .await;
            metrics.add_bind(t.elapsed());
            match r {
                Ok(_) => Status::success(),
                // The node's committed state had no room, or another
                // instance bound the pod first: a lost race, not an error.
                Err(kube::Error::Api(e))
                    if e.code == 409
                        && (e.message.contains(skiff_core::kinds::pod::DOES_NOT_FIT)
                            || e.message.contains(skiff_core::kinds::pod::ALREADY_ASSIGNED)) =>
                {
                    Status::new(Code::Conflict, e.message)
                }
                Err(e) => Status::error(format!("binding rejected: {e}")),
            }
        })
    }
}
