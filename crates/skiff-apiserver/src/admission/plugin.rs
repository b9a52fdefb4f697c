//! What an admission plugin is ([`AdmissionPlugin`]) and what it is
//! shown of a request ([`Attributes`]): the leaf every plugin imports, so
//! that the chain (`super::CHAIN`) imports the plugins and none of them
//! imports the chain.

use async_trait::async_trait;
use serde_json::Value;
use skiff_core::error::group_resource;
use skiff_core::resources::ResourceInfo;
use skiff_core::{ApiError, ApiResult};

pub use crate::webhook::rules::Operation;

use super::context::AdmissionCtx;
use crate::auth::Identity;
use crate::options::{DeleteOptions, WriteOptions};
use crate::request::Subresource;

/// The options of the request being admitted.
#[derive(Debug, Clone, Copy)]
pub enum Options<'a> {
    Write(&'a WriteOptions),
    Delete(&'a DeleteOptions),
}

/// One request as the plugins see it (Kubernetes' `admission.Attributes`).
#[derive(Debug, Clone, Copy)]
pub struct Attributes<'a> {
    /// The resource as stored.
    pub res: &'static ResourceInfo,
    pub op: Operation,
    /// The subresource written (`Main` for the object itself).
    pub sub: Subresource,
    /// The request's namespace (`None` for cluster-scoped resources).
    pub namespace: Option<&'a str>,
    /// The object before the change (updates and deletes).
    pub old: Option<&'a Value>,
    pub options: Options<'a>,
}

impl<'a> Attributes<'a> {
    /// Who asks; `None` for the server's own writes.
    pub fn user(&self) -> Option<&'a Identity> {
        match self.options {
            Options::Write(o) => o.user.as_ref(),
            Options::Delete(o) => o.user.as_ref(),
        }
    }

    pub fn dry_run(&self) -> bool {
        match self.options {
            Options::Write(o) => o.dry_run,
            Options::Delete(o) => o.dry_run,
        }
    }

    /// Whether this is a create of an object of the built-in resource
    /// `group`/`plural` (the test most plugins start with).
    pub fn creates(&self, group: &str, plural: &str) -> bool {
        self.op == Operation::Create && self.res.group == group && self.res.plural == plural
    }
}

/// An admission plugin: a name, which requests it handles, and what it
/// does in the mutating and the validating phase (both no-ops unless
/// the plugin says otherwise).
#[async_trait]
pub trait AdmissionPlugin: Send + Sync {
    /// The plugin's name, as kube-apiserver's `--enable-admission-plugins`.
    fn name(&self) -> &'static str;

    /// Whether the plugin has anything to do with this request.
    fn handles(&self, a: &Attributes<'_>) -> bool;

    /// The mutating phase: may change the object (created or updated).
    async fn mutate(
        &self,
        _cx: &dyn AdmissionCtx,
        _a: &Attributes<'_>,
        _obj: &mut Value,
    ) -> ApiResult<()> {
        Ok(())
    }

    /// The validating phase: may only refuse. `obj` is `None` for deletes.
    async fn validate(
        &self,
        _cx: &dyn AdmissionCtx,
        _a: &Attributes<'_>,
        _obj: Option<&Value>,
    ) -> ApiResult<()> {
        Ok(())
    }
}

/// 403 as an admission plugin answers it: `pods "x" is forbidden: ...`.
pub fn forbidden(res: &ResourceInfo, name: &str, msg: &str) -> ApiError {
    let mut e = ApiError::forbidden(format!(
        "{} {name:?} is forbidden: {msg}",
        group_resource(res.group, res.plural)
    ));
    e.name = Some(name.to_string());
    e.kind = Some(res.plural.to_string());
    if !res.group.is_empty() {
        e.group = Some(res.group.to_string());
    }
    e
}
