//! The registry as admission plugins, strategies and webhooks see it
//! ([`AdmissionCtx`]), and as outbound calls resolve Services.

use std::net::SocketAddr;
use std::sync::Arc;

use bytes::Bytes;
use serde_json::Value;
use skiff_core::resources::ResourceInfo;
use skiff_core::{ApiError, ApiResult};

use super::Registry;
use crate::admission::context::{AdmissionCtx, Change};
use crate::authz::Authorizer;
use crate::options::RegistryConfig;
use crate::outbound::ServiceResolver;
use crate::watchcache::{Filter, WatchCache};

/// The only keys outside a resource that strategies keep in the store.
const RANGES: &str = "/registry/ranges/";

fn range_err(e: skiff_store::Error) -> ApiError {
    ApiError::internal(format!("allocation range: {e}"))
}

#[async_trait::async_trait]
impl AdmissionCtx for Registry {
    async fn consistent_list(
        &self,
        res: &'static ResourceInfo,
        ns: Option<&str>,
        shared: bool,
    ) -> ApiResult<Vec<Arc<Value>>> {
        let filter = Filter {
            namespace: ns.map(str::to_string),
            ..Default::default()
        };
        if let Some(objs) = self.consistent_snapshot(res, &filter).await? {
            return Ok(objs
                .iter()
                .filter_map(|o| match shared {
                    true => o.value(),
                    false => serde_json::from_slice(&o.bytes()).ok().map(Arc::new),
                })
                .collect());
        }
        // The cache is behind (it already waited): read the store.
        let out = self.list_from_store(res, &filter, 0, None, None).await?;
        Ok(out
            .items
            .iter()
            .filter_map(|b| serde_json::from_slice(b).ok().map(Arc::new))
            .collect())
    }

    async fn get(&self, res: &ResourceInfo, ns: Option<&str>, name: &str) -> ApiResult<Value> {
        Registry::get(self, res, ns, name).await
    }

    async fn get_stored(
        &self,
        res: &ResourceInfo,
        ns: Option<&str>,
        name: &str,
    ) -> ApiResult<Option<Bytes>> {
        Ok(self.get_kv(res, ns, name).await?.map(|kv| kv.value))
    }

    async fn update_object(
        &self,
        res: &ResourceInfo,
        ns: Option<&str>,
        name: &str,
        change: &mut Change<'_>,
    ) -> ApiResult<Option<Value>> {
        Registry::update_object(self, res, ns, name, change).await
    }

    fn cache(&self) -> &WatchCache {
        Registry::cache(self)
    }

    async fn cache_is_current(&self, res: &ResourceInfo) -> ApiResult<bool> {
        Registry::cache_is_current(self, res).await
    }

    fn authorizer(&self) -> &Authorizer {
        &self.authz
    }

    fn resolver(&self) -> &dyn ServiceResolver {
        &*self.cache
    }

    fn config(&self) -> &RegistryConfig {
        &self.config
    }

    async fn read_range(&self, key: &str) -> ApiResult<Option<(Bytes, i64)>> {
        if !key.starts_with(RANGES) {
            return Err(ApiError::internal(format!(
                "{key} is not an allocation range"
            )));
        }
        let kv = self.store.get(key).await.map_err(range_err)?;
        Ok(kv.map(|kv| (kv.value, kv.mod_revision)))
    }

    async fn write_range(&self, key: &str, value: Bytes, revision: Option<i64>) -> ApiResult<bool> {
        if !key.starts_with(RANGES) {
            return Err(ApiError::internal(format!(
                "{key} is not an allocation range"
            )));
        }
        let written = match revision {
            Some(rev) => self.store.update(key, value, rev).await,
            None => self.store.create(key, value).await,
        };
        match written {
            Ok(_) => Ok(true),
            Err(skiff_store::Error::Conflict { .. })
            | Err(skiff_store::Error::AlreadyExists(_))
            | Err(skiff_store::Error::NotFound(_)) => Ok(false),
            Err(e) => Err(range_err(e)),
        }
    }
}

/// Services resolve from the watch cache.
impl ServiceResolver for Registry {
    fn resolve(&self, namespace: &str, name: &str, port: u16) -> Result<SocketAddr, String> {
        self.cache.resolve(namespace, name, port)
    }
}
