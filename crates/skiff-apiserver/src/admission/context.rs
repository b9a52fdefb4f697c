//! What admission plugins and strategies may read and write: the narrow
//! view of the registry they are handed ([`AdmissionCtx`]). The registry
//! implements it; nothing behind it exposes the store.

use std::sync::Arc;

use async_trait::async_trait;
use bytes::Bytes;
use serde_json::Value;
use skiff_core::resources::ResourceInfo;
use skiff_core::ApiResult;

use crate::authz::Authorizer;
use crate::options::RegistryConfig;
use crate::outbound::ServiceResolver;
use crate::watchcache::WatchCache;

/// A change to one object for [`AdmissionCtx::update_object`]: the new
/// object, or `None` to leave it as it is.
pub type Change<'a> = dyn FnMut(Value) -> ApiResult<Option<Value>> + Send + 'a;

/// The registry as admission and the strategies see it.
#[async_trait]
pub trait AdmissionCtx: Send + Sync {
    /// The current objects of a resource (in a namespace), read
    /// consistently. `shared`: parsed once per version and kept (policy
    /// objects read on every create); otherwise parsed per call.
    async fn consistent_list(
        &self,
        res: &'static ResourceInfo,
        ns: Option<&str>,
        shared: bool,
    ) -> ApiResult<Vec<Arc<Value>>>;

    /// The current object, read live (404 when there is none).
    async fn get(&self, res: &ResourceInfo, ns: Option<&str>, name: &str) -> ApiResult<Value>;

    /// The current object's stored JSON, read live, for a check that reads
    /// one field without decoding the object; `None` when there is none.
    async fn get_stored(
        &self,
        res: &ResourceInfo,
        ns: Option<&str>,
        name: &str,
    ) -> ApiResult<Option<Bytes>>;

    /// Changes one object through the registry's guaranteed update
    /// (`Ok(None)`: there is no such object).
    async fn update_object(
        &self,
        res: &ResourceInfo,
        ns: Option<&str>,
        name: &str,
        change: &mut Change<'_>,
    ) -> ApiResult<Option<Value>>;

    /// The watch cache, for reads that may lag (webhook configurations,
    /// policies, namespace labels).
    fn cache(&self) -> &WatchCache;

    /// Waits (up to 3 s) until the watch cache has every acknowledged
    /// write; whether it has.
    async fn cache_is_current(&self, res: &ResourceInfo) -> ApiResult<bool>;

    /// RBAC over the watch cache (escalation checks).
    fn authorizer(&self) -> &Authorizer;

    /// Services resolved to addresses, for webhooks and conversion.
    fn resolver(&self) -> &dyn ServiceResolver;

    fn config(&self) -> &RegistryConfig;

    /// An allocation range's stored value and its revision (`None`: not
    /// stored yet). Only keys under `/registry/ranges/`.
    async fn read_range(&self, key: &str) -> ApiResult<Option<(Bytes, i64)>>;

    /// Writes an allocation range guarded by the revision read (`None`:
    /// create it); `Ok(false)` when another writer got there first.
    async fn write_range(&self, key: &str, value: Bytes, revision: Option<i64>) -> ApiResult<bool>;
}
