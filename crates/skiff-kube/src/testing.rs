//! A real API server on a real (temporary) store, in this process, for
//! integration tests of API clients. Nothing is faked: requests go through
//! the same router, validation and store as in `skiff server`.

use std::sync::Arc;

use anyhow::Result;

/// An API server on a store in a temporary directory, removed on drop.
pub struct TestCluster {
    pub api: skiff_apiserver::ApiServer,
    _dir: tempfile::TempDir,
}

impl TestCluster {
    pub async fn start() -> Result<TestCluster> {
        let dir = tempfile::tempdir()?;
        let store =
            skiff_store::RedbStore::open(&dir.path().join("store.redb"), Default::default())?;
        let store: Arc<dyn skiff_store::Store> = store;
        let api = skiff_apiserver::ApiServer::start(store, Default::default()).await?;
        Ok(TestCluster { api, _dir: dir })
    }

    /// An API server on `store` (an etcd one, say); the temporary directory
    /// is unused but kept for the same shape.
    pub async fn on_store(store: Arc<dyn skiff_store::Store>) -> Result<TestCluster> {
        let dir = tempfile::tempdir()?;
        let api = skiff_apiserver::ApiServer::start(store, Default::default()).await?;
        Ok(TestCluster { api, _dir: dir })
    }

    /// A client authenticated as `system:<component>`.
    pub fn client(&self, component: &str) -> kube::Client {
        crate::in_process(&self.api, component)
    }
}
