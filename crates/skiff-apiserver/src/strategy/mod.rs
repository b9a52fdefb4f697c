//! The server-side hooks of each kind (Kubernetes' `RESTCreateStrategy`,
//! `RESTUpdateStrategy` and `RESTDeleteStrategy`, plus the admission that
//! reads other objects): what happens before defaults, allocation, what a
//! delete does. Pure rules (defaults, validation, printing, quota) are the
//! kind's `skiff_core::kinds` rules; the registry itself is generic and
//! asks [`strategy_for`], the one place that maps resources to strategies.

use async_trait::async_trait;
use serde_json::Value;
use skiff_core::resources::ResourceInfo;
use skiff_core::ApiResult;

pub use crate::admission::context::AdmissionCtx;
use crate::auth::Identity;
use crate::options::DeleteOptions;
use crate::request::Subresource;

pub mod binding;
pub mod certificates;
pub mod crd;
pub mod eviction;
pub mod job;
pub mod namespace;
pub mod node;
pub mod pod;
pub mod policy;
pub mod rbac;
pub mod scale;
pub mod service;

/// What a delete does to an object that has no finalizers left.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeletePlan {
    /// Removed at once.
    Now,
    /// Marked for deletion; removed when the grace period is confirmed over
    /// (a pod on its node). A grace of 0 is [`DeletePlan::Now`].
    Graceful(i64),
    /// Marked for deletion; a controller finalizes it (a namespace).
    Finalize,
}

/// A kind's server-side hooks. Every method has the generic behaviour as
/// its default, so most kinds use [`Generic`].
#[async_trait]
pub trait Strategy: Send + Sync {
    /// Before defaults on create: status is written through the status
    /// subresource, so a new object's status is dropped.
    fn prepare_for_create(&self, res: &ResourceInfo, obj: &mut Value) {
        if res.has_subresource("status") {
            if let Some(m) = obj.as_object_mut() {
                m.remove("status");
            }
        }
    }

    /// On create, after [`Strategy::prepare_for_create`]: fields the server
    /// sets from who is asking, whatever the body said (a
    /// CertificateSigningRequest's requestor).
    fn record_requestor(&self, _obj: &mut Value, _who: Option<&Identity>) {}

    /// After the generic update preparation (status and system metadata
    /// kept from the old object).
    /// `sub` is the subresource written (`Main` for the object itself).
    fn prepare_for_update(&self, _old: &Value, _new: &mut Value, _sub: Subresource) {}

    /// Defaults that need the final name and uid (on create).
    fn named_defaults(&self, _obj: &mut Value) {}

    /// After mutating admission on create: what the kind sets from the
    /// admitted object and other objects (a pod's QoS class, a new
    /// quota's status).
    async fn admit_create(
        &self,
        _cx: &dyn AdmissionCtx,
        _res: &'static ResourceInfo,
        _ns: Option<&str>,
        _obj: &mut Value,
    ) -> ApiResult<()> {
        Ok(())
    }

    /// Whether `who` may write this object (after mutating admission, on
    /// create and update): RBAC's escalation prevention.
    async fn authorize_write(
        &self,
        _cx: &dyn AdmissionCtx,
        _res: &ResourceInfo,
        _ns: Option<&str>,
        _obj: &Value,
        _who: Option<&Identity>,
    ) -> ApiResult<()> {
        Ok(())
    }

    /// Takes what a new object needs from shared ranges (after validation,
    /// just before the write); a dry run only checks.
    async fn allocate(
        &self,
        _cx: &dyn AdmissionCtx,
        _obj: &mut Value,
        _dry_run: bool,
    ) -> ApiResult<()> {
        Ok(())
    }

    /// Carries over what an update leaves out and takes what it newly
    /// needs; returns what was newly taken, for [`Strategy::finish_update`].
    async fn allocate_update(
        &self,
        _cx: &dyn AdmissionCtx,
        _old: &Value,
        _new: &mut Value,
        _dry_run: bool,
    ) -> ApiResult<Value> {
        Ok(Value::Null)
    }

    /// After an update: `written` is the stored object (give back what the
    /// old one had and it has not), or `None` when the write did not
    /// happen (give back `fresh`).
    async fn finish_update(
        &self,
        _cx: &dyn AdmissionCtx,
        _old: &Value,
        _written: Option<&Value>,
        _fresh: Value,
    ) {
    }

    /// The node an object is bound to, if its kind is bound to nodes
    /// (pods): a write that binds one commits with the node's allocation
    /// record (`registry::allocation`).
    fn bound_node<'a>(&self, _obj: &'a Value) -> Option<&'a str> {
        None
    }

    /// Gives back what an object held: it was deleted, or its create failed.
    async fn release(&self, _cx: &dyn AdmissionCtx, _obj: &Value) {}

    /// What a delete does (the kind's `BeforeDelete`).
    fn delete_plan(&self, _obj: &Value, _opts: &DeleteOptions) -> DeletePlan {
        DeletePlan::Now
    }

    /// Warnings a delete with `opts` answers with.
    fn delete_warnings(&self, _opts: &DeleteOptions) -> Vec<String> {
        Vec::new()
    }

    /// Marks an object whose deletion is now pending.
    fn prepare_for_delete(&self, _obj: &mut Value) {}

    /// Whether an object being deleted with no finalizers left may go now.
    fn may_remove(&self, _obj: &Value) -> bool {
        true
    }

    /// Brings the strategy's own state in the store in line with the
    /// objects (once, when a server starts).
    async fn repair(&self, _cx: &dyn AdmissionCtx) -> ApiResult<()> {
        Ok(())
    }
}

/// The hooks of every kind without hooks of its own.
pub struct Generic;

impl Strategy for Generic {}

/// The one place that maps a resource (by storage) to its strategy.
pub fn strategy_for(res: &ResourceInfo) -> &'static dyn Strategy {
    match res.storage {
        "/pods" => &pod::PodStrategy,
        "/services" => &service::ServiceStrategy,
        "/namespaces" => &namespace::NamespaceStrategy,
        "/nodes" => &node::NodeStrategy,
        "batch/jobs" => &job::JobStrategy,
        "/resourcequotas" => &policy::ResourceQuotaStrategy,
        "certificates.k8s.io/certificatesigningrequests" => &certificates::CsrStrategy,
        "apiextensions.k8s.io/customresourcedefinitions" => &crd::CrdStrategy,
        "rbac.authorization.k8s.io/roles"
        | "rbac.authorization.k8s.io/rolebindings"
        | "rbac.authorization.k8s.io/clusterroles"
        | "rbac.authorization.k8s.io/clusterrolebindings" => &rbac::RbacStrategy,
        _ => &Generic,
    }
}

/// Every strategy with a `repair`, once each.
pub fn all() -> [&'static dyn Strategy; 1] {
    [&service::ServiceStrategy]
}

#[cfg(test)]
mod tests {
    #[test]
    fn every_storage_named_in_strategy_for_is_served() {
        for storage in [
            "/pods",
            "/services",
            "/namespaces",
            "/nodes",
            "batch/jobs",
            "/resourcequotas",
            "certificates.k8s.io/certificatesigningrequests",
            "apiextensions.k8s.io/customresourcedefinitions",
            "rbac.authorization.k8s.io/roles",
            "rbac.authorization.k8s.io/rolebindings",
            "rbac.authorization.k8s.io/clusterroles",
            "rbac.authorization.k8s.io/clusterrolebindings",
        ] {
            assert!(
                skiff_core::resources::RESOURCES
                    .iter()
                    .any(|r| r.storage == storage),
                "{storage} is not a served storage"
            );
        }
    }
}
