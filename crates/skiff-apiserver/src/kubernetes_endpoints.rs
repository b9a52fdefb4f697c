//! The `kubernetes` Service's endpoints: like kube-apiserver's endpoint
//! reconciler, the server writes the Endpoints and the EndpointSlice
//! `default/kubernetes` with the address pods reach it at (its advertise
//! address) and its port, so `https://kubernetes.default.svc` (10.43.0.1:443)
//! leads to it through each node's service proxy.

use serde_json::json;
use skiff_core::resources;
use skiff_core::ApiError;

use crate::registry::{Registry, WriteOptions};

/// Writes (or rewrites) both objects for `ip:port`.
pub async fn reconcile(reg: &Registry, ip: &str, port: u16) -> Result<(), ApiError> {
    let opts = WriteOptions {
        field_manager: "skiff-apiserver".into(),
        ..Default::default()
    };
    let labels = json!({"endpointslice.kubernetes.io/skip-mirror": "true"});
    let endpoints = json!({
        "apiVersion": "v1", "kind": "Endpoints",
        "metadata": {"name": "kubernetes", "namespace": "default", "labels": labels},
        "subsets": [{"addresses": [{"ip": ip}], "ports": [{"name": "https", "port": port, "protocol": "TCP"}]}],
    });
    let slice = json!({
        "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
        "metadata": {"name": "kubernetes", "namespace": "default",
            "labels": {"kubernetes.io/service-name": "kubernetes"}},
        "addressType": if ip.contains(':') { "IPv6" } else { "IPv4" },
        "endpoints": [{"addresses": [ip], "conditions": {"ready": true}}],
        "ports": [{"name": "https", "port": port, "protocol": "TCP"}],
    });
    for (group, version, plural, body) in [
        ("", "v1", "endpoints", endpoints),
        ("discovery.k8s.io", "v1", "endpointslices", slice),
    ] {
        let res = resources::lookup(group, version, plural).expect("built-in resource");
        match reg.create(res, Some("default"), body.clone(), &opts).await {
            Ok(_) => {}
            Err(e) if e.code == 409 => {
                reg.update(
                    res,
                    Some("default"),
                    "kubernetes",
                    body,
                    crate::request::Subresource::Main,
                    &opts,
                )
                .await?;
            }
            Err(e) => return Err(e),
        }
    }
    Ok(())
}
