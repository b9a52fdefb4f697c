//! The built-in plugins, one module each, and the registry that builds them
//! by name.

use std::sync::Arc;

use serde_json::Value;

use crate::framework::Plugin;
use crate::metrics::Metrics;

pub mod balanced_allocation;
pub mod default_binder;
pub mod default_preemption;
pub mod image_locality;
pub mod inter_pod_affinity;
pub mod node_affinity;
pub mod node_name;
pub mod node_ports;
pub mod node_resources_fit;
pub mod node_unschedulable;
pub mod pod_topology_spread;
pub mod priority_sort;
pub mod taint_toleration;
pub mod volume_binding;
pub mod volume_restrictions;

#[cfg(test)]
pub mod testutil {
    pub use crate::testing::*;
}

/// What factories may need besides their args.
#[derive(Clone)]
pub struct FactoryContext {
    pub client: Option<kube::Client>,
    pub metrics: Arc<Metrics>,
}

pub type Factory = fn(&Value, &FactoryContext) -> anyhow::Result<Arc<dyn Plugin>>;

/// Every plugin by name.
pub fn registry() -> Vec<(&'static str, Factory)> {
    vec![
        (priority_sort::NAME, |_, _| {
            Ok(Arc::new(priority_sort::PrioritySort))
        }),
        (node_name::NAME, |_, _| Ok(Arc::new(node_name::NodeName))),
        (node_unschedulable::NAME, |_, _| {
            Ok(Arc::new(node_unschedulable::NodeUnschedulable))
        }),
        (taint_toleration::NAME, |_, _| {
            Ok(Arc::new(taint_toleration::TaintToleration))
        }),
        (node_affinity::NAME, |a, _| {
            Ok(Arc::new(node_affinity::NodeAffinity::from_args(a)?))
        }),
        (node_ports::NAME, |_, _| Ok(Arc::new(node_ports::NodePorts))),
        (node_resources_fit::NAME, |a, _| {
            Ok(Arc::new(node_resources_fit::NodeResourcesFit::from_args(
                a,
            )?))
        }),
        (balanced_allocation::NAME, |a, _| {
            Ok(Arc::new(
                balanced_allocation::BalancedAllocation::from_args(a)?,
            ))
        }),
        (image_locality::NAME, |_, _| {
            Ok(Arc::new(image_locality::ImageLocality))
        }),
        (inter_pod_affinity::NAME, |a, _| {
            Ok(Arc::new(inter_pod_affinity::InterPodAffinity::from_args(
                a,
            )?))
        }),
        (pod_topology_spread::NAME, |a, _| {
            Ok(Arc::new(pod_topology_spread::PodTopologySpread::from_args(
                a,
            )?))
        }),
        (volume_restrictions::NAME, |_, _| {
            Ok(Arc::new(volume_restrictions::VolumeRestrictions))
        }),
        (volume_binding::NAME, |_, ctx| {
            Ok(Arc::new(volume_binding::VolumeBinding::new(
                ctx.client.clone(),
            )))
        }),
        (default_preemption::NAME, |a, _| {
            Ok(Arc::new(default_preemption::DefaultPreemption::from_args(
                a,
            )?))
        }),
        (default_binder::NAME, |_, ctx| {
            Ok(Arc::new(default_binder::DefaultBinder {
                client: ctx.client.clone(),
                metrics: ctx.metrics.clone(),
            }))
        }),
    ]
}

/// The default plugins, in Kubernetes' order, with their score weights
/// (used at every extension point each implements).
pub const DEFAULT_PLUGINS: &[(&str, i64)] = &[
    (priority_sort::NAME, 0),
    (node_unschedulable::NAME, 0),
    (node_name::NAME, 0),
    (taint_toleration::NAME, 3),
    (node_affinity::NAME, 2),
    (node_ports::NAME, 0),
    (node_resources_fit::NAME, 1),
    (volume_restrictions::NAME, 0),
    (volume_binding::NAME, 0),
    (pod_topology_spread::NAME, 2),
    (inter_pod_affinity::NAME, 2),
    (default_preemption::NAME, 0),
    (balanced_allocation::NAME, 1),
    (image_locality::NAME, 1),
    (default_binder::NAME, 0),
];
