//! The ServiceAccount controller (a `default` ServiceAccount in every
//! active namespace) and the root CA publisher (the `kube-root-ca.crt`
//! ConfigMap with the cluster CA under `ca.crt`). Namespaces are queued on
//! every change and once a minute, so a deleted object comes back.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{ConfigMap, ServiceAccount};
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::json;

use crate::common;
use crate::controller::Controller;
use crate::framework::Next;
use crate::{Ctx, Error};

pub const ROOT_CA: &str = "kube-root-ca.crt";

pub fn register(ctx: &Arc<Ctx>, tasks: &mut tokio::task::JoinSet<()>, sa: bool, ca: bool) {
    Controller::new(ctx, "serviceaccount", &ctx.caches.namespaces)
        .resync(Duration::from_secs(60))
        .run(tasks, (), move |c, _, key| async move {
            reconcile(&c, &key, sa, ca).await
        });
}

async fn reconcile(ctx: &Ctx, key: &str, sa: bool, ca: bool) -> Result<Next, Error> {
    let Some(ns) = ctx.caches.namespaces.get(key) else {
        return Ok(None);
    };
    if common::is_terminating(&ns.metadata)
        || ns.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Terminating")
    {
        return Ok(None);
    }
    let name = key;
    if sa {
        let api: Api<ServiceAccount> = Api::namespaced(ctx.client.clone(), name);
        if api.get_opt("default").await?.is_none() {
            let obj: ServiceAccount = serde_json::from_value(
                json!({"metadata": {"name": "default", "namespace": name}}),
            )?;
            match api.create(&PostParams::default(), &obj).await {
                Ok(_) => {}
                Err(e) if common::is_conflict(&e) => {}
                Err(e) => return Err(e.into()),
            }
        }
    }
    if let (true, Some(pem)) = (ca, ctx.options.root_ca_pem.as_deref()) {
        let api: Api<ConfigMap> = Api::namespaced(ctx.client.clone(), name);
        match api.get_opt(ROOT_CA).await? {
            Some(cm)
                if cm
                    .data
                    .as_ref()
                    .and_then(|d| d.get("ca.crt"))
                    .map(String::as_str)
                    == Some(pem) => {}
            Some(_) => {
                let patch = json!({"data": {"ca.crt": pem}});
                api.patch(ROOT_CA, &PatchParams::default(), &Patch::Merge(&patch))
                    .await?;
            }
            None => {
                let obj: ConfigMap = serde_json::from_value(json!({
                    "metadata": {"name": ROOT_CA, "namespace": name,
                        "annotations": {"kubernetes.io/description": "Contains a CA bundle that can be used to verify the kube-apiserver when using internal endpoints such as the internal service IP or kubernetes.default.svc. No other usage is guaranteed across distributions of Kubernetes clusters."}},
                    "data": {"ca.crt": pem}
                }))?;
                match api.create(&PostParams::default(), &obj).await {
                    Ok(_) => {}
                    Err(e) if common::is_conflict(&e) => {}
                    Err(e) => return Err(e.into()),
                }
            }
        }
    }
    Ok(None)
}
