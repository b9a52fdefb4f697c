//! Admission: one ordered chain of plugins, each behind
//! [`AdmissionPlugin`] (Kubernetes' `admission.Interface` with its
//! `MutationInterface` and `ValidationInterface`), in Kubernetes' plugin
//! order ([`CHAIN`]). The registry calls [`mutate`] once, after the kind's
//! defaults and before validation, and [`validate`] once, after
//! validation; it never names a plugin.
//!
//! Plugins see the registry only through [`AdmissionCtx`], which reads
//! objects and the watch cache but does not expose the store.

pub mod context;
pub mod dependencies;
pub mod namespace;
pub mod plugin;
pub mod pod;
pub mod quota;

use serde_json::Value;
use skiff_core::ApiResult;

pub use context::AdmissionCtx;
pub use plugin::{forbidden, AdmissionPlugin, Attributes, Operation, Options};

/// Every plugin skiff has, in Kubernetes' order (kube-apiserver's
/// `AllOrderedPlugins`), and skiff's own (DeclaredDependencies, after the
/// ServiceAccount plugin whose tokens it sits beside).
pub static CHAIN: &[&dyn AdmissionPlugin] = &[
    &namespace::NamespaceLifecycle,
    &pod::LimitRanger,
    &crate::podtoken::ServiceAccount,
    &dependencies::DeclaredDependencies,
    &crate::noderestriction::NodeRestriction,
    &pod::Priority,
    &pod::DefaultTolerationSeconds,
    &crate::defaultclass::DEFAULT_STORAGE_CLASS,
    &crate::storageprotection::StorageObjectInUseProtection,
    &crate::defaultclass::DEFAULT_INGRESS_CLASS,
    &crate::webhook::MutatingAdmissionWebhook,
    &crate::webhook::ValidatingAdmissionPolicy,
    &crate::webhook::ValidatingAdmissionWebhook,
    &quota::ResourceQuota,
];

/// The mutating phase: every plugin that handles the request, in order.
pub async fn mutate(cx: &dyn AdmissionCtx, a: &Attributes<'_>, obj: &mut Value) -> ApiResult<()> {
    for p in CHAIN {
        if p.handles(a) {
            p.mutate(cx, a, obj).await?;
        }
    }
    Ok(())
}

/// The validating phase: every plugin that handles the request, in order.
pub async fn validate(
    cx: &dyn AdmissionCtx,
    a: &Attributes<'_>,
    obj: Option<&Value>,
) -> ApiResult<()> {
    for p in CHAIN {
        if p.handles(a) {
            p.validate(cx, a, obj).await?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_chain_is_in_kubernetes_plugin_order() {
        // kube-apiserver's AllOrderedPlugins, restricted to those skiff has.
        let kubernetes = [
            "NamespaceLifecycle",
            "LimitRanger",
            "ServiceAccount",
            "NodeRestriction",
            "Priority",
            "DefaultTolerationSeconds",
            "DefaultStorageClass",
            "StorageObjectInUseProtection",
            "DefaultIngressClass",
            "MutatingAdmissionWebhook",
            "ValidatingAdmissionPolicy",
            "ValidatingAdmissionWebhook",
            "ResourceQuota",
        ];
        let names: Vec<&str> = CHAIN.iter().map(|p| p.name()).collect();
        let ours: Vec<&str> = names
            .iter()
            .copied()
            .filter(|n| kubernetes.contains(n))
            .collect();
        assert_eq!(ours, kubernetes);
        let skiffs: Vec<&str> = names
            .iter()
            .copied()
            .filter(|n| !kubernetes.contains(n))
            .collect();
        assert_eq!(skiffs, ["DeclaredDependencies"]);
        let at = |n: &str| names.iter().position(|x| *x == n).unwrap();
        assert_eq!(at("DeclaredDependencies"), at("ServiceAccount") + 1);
    }
}
