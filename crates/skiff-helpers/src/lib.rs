//! Kubernetes' shared semantics on the API types, each defined once, for
//! every part of skiff that needs them: the API server's validation and
//! CEL, the scheduler, the controllers and the agent. After apimachinery's
//! `api/resource` and `component-helpers/scheduling/corev1`.
//!
//! No I/O, and nothing heavier than the API types: the scheduler, the
//! controllers and the agent link this without the CRD schema engine or
//! CEL.

pub mod dependencies;
pub mod names;
pub mod qos;
pub mod quantity;
pub mod resources;
pub mod scheduling;
pub mod workloads;

pub use quantity::Quantity;
