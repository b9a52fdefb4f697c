//! The I/O-free core of skiff: the resource table, errors as `Status`,
//! selectors, defaulting, validation, patches and table columns.
//!
//! Everything here works on data alone (mostly `serde_json::Value`) so it can
//! be tested without a server, a store or a socket.

// `ApiError` carries a whole Kubernetes Status (reason, message, details,
// causes); errors are the slow path, so returning it unboxed is deliberate.
#![allow(clippy::result_large_err)]

pub mod admission;
pub mod bootstrap_nodes;
pub mod bootstrap_policy;
pub mod cel;
pub mod convert;
pub mod crd_schema;
pub mod defaults;
pub mod discovery;
pub mod error;
pub mod fields;
pub mod kinds;
pub mod meta;
pub mod openapi;
pub mod openapi_pb;
pub mod patch;
pub mod protobuf;
pub mod query;
pub mod rbac;
pub mod resources;
pub mod schema;
pub mod selector;
pub mod table;
pub mod validation;

pub use error::{ApiError, ApiResult, Cause};
