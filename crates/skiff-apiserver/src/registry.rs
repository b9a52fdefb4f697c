//! The generic registry (Kubernetes' `genericregistry.Store`): create, get,
//! list, update, patch and delete for every resource. It names no kind:
//! what is particular to one is its pure rules (`res.rules`, in
//! `skiff_core::kinds`) and its server-side hooks ([`strategy_for`]).
//!
//! Create is one fixed pipeline, in Kubernetes' order: type checks, the
//! strategy's `prepare_for_create`, the kind's defaults, the admission
//! chain's mutating phase ([`crate::admission::mutate`]), validation, its
//! validating phase ([`crate::admission::validate`]), allocation, the
//! field manager, the store. Update follows the same order; a delete runs
//! the validating phase on the object it removes.
//!
//! Every read-modify-write goes through [`Registry::guaranteed_update`]:
//! read the current object, compute the new one, and store it guarded by
//! the revision that was read, retrying when another writer got there
//! first. The store and the watch cache are private: nothing else writes.

pub(crate) mod allocation;
mod context;
mod list;
mod prepare;

use std::sync::Arc;
use std::time::Duration;

use serde_json::{json, Value};
use skiff_core::resources::ResourceInfo;
use skiff_core::{ApiError, ApiResult};
use skiff_store::{KeyValue, Store};

pub use crate::options::{
    DeleteOptions, Deleted, FieldValidation, ListOutput, PatchType, RegistryConfig, WriteOptions,
};
pub(crate) use prepare::prepare_namespace;
pub use prepare::{apply_patch, check_type_meta, gc_finalizers};

use crate::admission::{self, Attributes, Operation, Options};
use crate::crd::conversion;
use crate::object::{self, decode, encode, meta_str, metadata_mut, now_rfc3339};
use crate::request::Subresource;
use crate::strategy::{strategy_for, DeletePlan};
use crate::watchcache::{CachedObject, Filter, WatchCache};
use prepare::{check_types, prepare_for_update, spec_part};

/// The registry all handlers and in-server loops go through.
pub struct Registry {
    /// RBAC over this registry's watch cache.
    pub authz: Arc<crate::authz::Authorizer>,
    store: Arc<dyn Store>,
    cache: Arc<WatchCache>,
    pub config: RegistryConfig,
    /// The nodes' allocation records this server wrote last (Omega's
    /// commit check; [`allocation`]).
    allocations: allocation::Book,
}

fn store_err(res: &ResourceInfo, name: &str, e: skiff_store::Error) -> ApiError {
    use skiff_store::Error as E;
    match e {
        E::NotFound(_) => ApiError::not_found(res.group, res.plural, name),
        E::AlreadyExists(_) => ApiError::already_exists(res.group, res.plural, name),
        E::Conflict { .. } => ApiError::conflict(res.group, res.plural, name, ApiError::STALE),
        E::Compacted { requested, compacted } => ApiError::gone(format!(
            "The resourceVersion for the provided list is too old (requested {requested}, oldest available {compacted})."
        )),
        E::FutureRevision { requested, current } => ApiError::timeout(format!(
            "Too large resource version: {requested}, current: {current}"
        )),
        E::Unavailable(msg) => ApiError::new(
            503,
            "ServiceUnavailable",
            format!("the storage backend is unavailable: {msg}"),
        ),
        E::Timeout(msg) => ApiError::timeout(format!("storage request timed out: {msg}")),
        other => ApiError::internal(other.to_string()),
    }
}

/// The node an object is bound to, as its kind's strategy says.
fn bound_node<'a>(res: &ResourceInfo, obj: &'a Value) -> Option<&'a str> {
    strategy_for(res).bound_node(obj)
}

fn random_u64() -> u64 {
    rand::random()
}

impl Registry {
    pub fn new(store: Arc<dyn Store>, cache: Arc<WatchCache>, config: RegistryConfig) -> Self {
        Registry {
            authz: Arc::new(crate::authz::Authorizer::new(cache.clone())),
            store,
            cache,
            config,
            allocations: Default::default(),
        }
    }

    /// The watch cache, for reads (watches, snapshots, the authorizer's).
    pub fn cache(&self) -> &Arc<WatchCache> {
        &self.cache
    }

    /// The store's current revision.
    pub async fn current_revision(&self) -> Result<i64, skiff_store::Error> {
        self.store.current_revision().await
    }

    /// Compacts the store's history before `rev` (unless another server
    /// already did) and trims the watch cache's with it.
    pub async fn compact(&self, rev: i64) -> Result<(), skiff_store::Error> {
        let done = self.store.compacted_revision().await.unwrap_or(0);
        if rev > done {
            self.store.compact(rev).await?;
        }
        self.cache.trim(rev);
        Ok(())
    }

    /// Brings what strategies keep in the store (the allocation ranges) in
    /// line with the objects; run once when a server starts.
    pub async fn repair(&self) -> ApiResult<()> {
        for s in crate::strategy::all() {
            s.repair(self).await?;
        }
        Ok(())
    }

    // ---- reads ---------------------------------------------------------------

    /// The current object.
    pub async fn get(&self, res: &ResourceInfo, ns: Option<&str>, name: &str) -> ApiResult<Value> {
        let key = object::object_key(res, ns, name);
        match self
            .store
            .get(&key)
            .await
            .map_err(|e| store_err(res, name, e))?
        {
            Some(kv) => decode(&kv),
            None => Err(ApiError::not_found(res.group, res.plural, name)),
        }
    }

    pub(crate) async fn get_kv(
        &self,
        res: &ResourceInfo,
        ns: Option<&str>,
        name: &str,
    ) -> ApiResult<Option<KeyValue>> {
        let key = object::object_key(res, ns, name);
        self.store
            .get(&key)
            .await
            .map_err(|e| store_err(res, name, e))
    }

    /// Waits (up to 3 s) until the watch cache has seen every write the
    /// store has acknowledged, so a read from it is consistent: the store's
    /// progress request makes the cache's watch report its revision even
    /// when the latest writes are outside it (another server's, or etcd's).
    async fn cache_is_current(&self, res: &ResourceInfo) -> ApiResult<bool> {
        let current = self
            .store
            .request_progress()
            .await
            .map_err(|e| store_err(res, "", e))?;
        Ok(self.cache.wait_for(current, Duration::from_secs(3)).await)
    }

    /// The current objects matching `filter`, read consistently from the
    /// watch cache; `None` when the cache is behind (read the store then).
    pub async fn consistent_snapshot(
        &self,
        res: &'static ResourceInfo,
        filter: &Filter,
    ) -> ApiResult<Option<Vec<Arc<CachedObject>>>> {
        if !self.cache_is_current(res).await? {
            return Ok(None);
        }
        Ok(Some(self.cache.resource(res).snapshot(filter)))
    }

    // ---- writes --------------------------------------------------------------

    /// Creates an object. Returns it as stored and any warnings.
    pub async fn create(
        &self,
        res: &'static ResourceInfo,
        ns: Option<&str>,
        obj: Value,
        opts: &WriteOptions,
    ) -> ApiResult<Value> {
        self.create_answered(res, ns, obj, opts)
            .await
            .map(|(v, _)| v)
    }

    /// [`Registry::create`], with the JSON bytes of the created object when
    /// they are the stored bytes with the resourceVersion spliced in (what
    /// `serde_json` would write for the returned object), so that the answer
    /// is not serialized a second time.
    pub async fn create_answered(
        &self,
        res: &'static ResourceInfo,
        ns: Option<&str>,
        mut obj: Value,
        opts: &WriteOptions,
    ) -> ApiResult<(Value, Option<bytes::Bytes>)> {
        check_type_meta(res, &mut obj)?;
        check_types(res, &obj)?;
        prepare_namespace(res, ns, &mut obj)?;
        let strategy = strategy_for(res);
        let generate =
            meta_str(&obj, "name").is_empty() && !meta_str(&obj, "generateName").is_empty();
        {
            let m = metadata_mut(&mut obj);
            m.insert("uid".into(), json!(uuid::Uuid::new_v4().to_string()));
            m.insert("creationTimestamp".into(), json!(now_rfc3339()));
            for f in [
                "resourceVersion",
                "deletionTimestamp",
                "deletionGracePeriodSeconds",
                "selfLink",
            ] {
                m.remove(f);
            }
            if res.rules.tracks_generation() {
                m.insert("generation".into(), json!(1));
            } else {
                m.remove("generation");
            }
        }
        strategy.prepare_for_create(res, &mut obj);
        strategy.record_requestor(&mut obj, opts.user.as_ref());
        skiff_core::defaults::apply_defaults(res, &mut obj);
        let a = Attributes {
            res,
            op: Operation::Create,
            sub: Subresource::Main,
            namespace: ns,
            old: None,
            options: Options::Write(opts),
        };
        admission::mutate(self, &a, &mut obj).await?;
        strategy.admit_create(self, res, ns, &mut obj).await?;
        strategy
            .authorize_write(self, res, ns, &obj, opts.user.as_ref())
            .await?;
        for attempt in 0..8 {
            if generate {
                let prefix = meta_str(&obj, "generateName").to_string();
                let name = skiff_core::meta::with_generated_name(&prefix, random_u64());
                metadata_mut(&mut obj).insert("name".into(), json!(name));
            }
            let name = meta_str(&obj, "name").to_string();
            strategy.named_defaults(&mut obj);
            let causes = skiff_core::validation::validate_create(res, &obj);
            if !causes.is_empty() {
                return Err(ApiError::invalid(res.group, res.kind, &name, causes));
            }
            admission::validate(self, &a, Some(&obj)).await?;
            // Only a generated name may be retried, so only then is a copy kept.
            let mut obj = if generate {
                obj.clone()
            } else {
                std::mem::take(&mut obj)
            };
            strategy.allocate(self, &mut obj, opts.dry_run).await?;
            crate::fieldmanager::record(res, None, &mut obj, &opts.field_manager, None);
            if opts.dry_run {
                return Ok((obj, None));
            }
            let key = object::object_key(res, ns, &name);
            let (stored, meta_close) = object::encode_marked(&obj)?;
            match self.create_stored(res, &key, stored.clone(), &obj).await {
                Ok(kv) => {
                    // The stored object is exactly `obj`; no need to decode it again.
                    object::set_resource_version(&mut obj, kv.mod_revision);
                    let answer = meta_close.map(|close| {
                        object::answer_with_resource_version(&stored, close, kv.mod_revision)
                    });
                    return Ok((obj, answer));
                }
                Err(allocation::BindFailure::Store(skiff_store::Error::AlreadyExists(_)))
                    if generate && attempt < 7 =>
                {
                    strategy.release(self, &obj).await;
                    continue;
                }
                Err(e) => {
                    strategy.release(self, &obj).await;
                    return Err(e.into_api_error(res, &name));
                }
            }
        }
        Err(ApiError::already_exists(
            res.group,
            res.plural,
            meta_str(&obj, "name"),
        ))
    }

    /// Replaces an object (PUT), on the main resource or a subresource.
    /// Returns the stored object and whether it was created.
    pub async fn update(
        &self,
        res: &'static ResourceInfo,
        ns: Option<&str>,
        name: &str,
        mut body: Value,
        sub: Subresource,
        opts: &WriteOptions,
    ) -> ApiResult<(Value, bool)> {
        check_update_body(res, ns, name, &mut body)?;
        let wanted_rv = meta_str(&body, "resourceVersion").to_string();
        let stale = || ApiError::conflict(res.group, res.plural, name, ApiError::STALE);
        let (body, wanted_rv) = (&body, &wanted_rv);
        self.guaranteed_update(res, ns, name, None, |cur| async move {
            let Some(cur) = cur else {
                if sub == Subresource::Main && res.rules.allow_create_on_update() {
                    return Ok((self.create(res, ns, body.clone(), opts).await?, true));
                }
                return Err(ApiError::not_found(res.group, res.plural, name).into());
            };
            if !wanted_rv.is_empty() && *wanted_rv != cur.mod_revision.to_string() {
                return Err(stale().into());
            }
            let old = decode(&cur)?;
            match self
                .write_update(res, ns, name, &cur, old, body.clone(), sub, opts, true)
                .await
            {
                // A named resourceVersion is a precondition: no retry.
                Err(WriteError::Retry) if !wanted_rv.is_empty() => Err(stale().into()),
                other => other.map(|v| (v, false)),
            }
        })
        .await
    }

    /// Patches an object as the version `api_res` shows it; an apply patch
    /// may create it. A version other than the stored one (or any version
    /// of a resource converted by a webhook, whose stored objects may be of
    /// an old storage version) is converted to, patched, and converted back.
    #[allow(clippy::too_many_arguments)]
    pub async fn patch(
        &self,
        api_res: &'static ResourceInfo,
        ns: Option<&str>,
        name: &str,
        patch_type: PatchType,
        patch: &Value,
        sub: Subresource,
        opts: &WriteOptions,
    ) -> ApiResult<(Value, bool)> {
        let res = skiff_core::convert::storage_resource(api_res);
        let converted = skiff_core::convert::needed(api_res) || conversion::uses_webhook(api_res);
        let schema = skiff_core::schema::root(api_res.group, api_res.version, api_res.kind)
            .or_else(|| api_res.rules.custom().and_then(|c| c.type_ref()));
        self.guaranteed_update(res, ns, name, None, |cur| async move {
            let Some(cur) = cur else {
                if patch_type == PatchType::Apply && sub == Subresource::Main {
                    // Applied in the request's version, stored in the storage version.
                    let mut obj = apply_patch(api_res, None, patch_type, patch, schema, opts)?;
                    metadata_mut(&mut obj).insert("name".into(), json!(name));
                    let obj = conversion::to_storage(self, api_res, obj).await?;
                    return match self.create_applied(res, ns, obj, opts).await {
                        Err(e) if e.reason == "AlreadyExists" => Err(WriteError::Retry),
                        other => Ok((other?, true)),
                    };
                }
                return Err(ApiError::not_found(res.group, res.plural, name).into());
            };
            let old = decode(&cur)?;
            let (patched, track) = if converted {
                let view = conversion::from_storage(self, api_res, old.clone()).await?;
                let patched = apply_patch(api_res, Some(&view), patch_type, patch, schema, opts)?;
                let mut stored = conversion::to_storage(self, api_res, patched).await?;
                check_update_body(res, ns, name, &mut stored)?;
                (stored, true)
            } else {
                let patched = apply_patch(res, Some(&old), patch_type, patch, schema, opts)?;
                (patched, patch_type != PatchType::Apply)
            };
            // A patch that names a resourceVersion is a precondition on it.
            let patched_rv = meta_str(&patched, "resourceVersion");
            if !patched_rv.is_empty() && patched_rv != cur.mod_revision.to_string() {
                return Err(
                    ApiError::conflict(res.group, res.plural, name, ApiError::STALE).into(),
                );
            }
            let v = self
                .write_update(res, ns, name, &cur, old, patched, sub, opts, track)
                .await?;
            Ok((v, false))
        })
        .await
    }

    pub(crate) async fn create_applied(
        &self,
        res: &'static ResourceInfo,
        ns: Option<&str>,
        obj: Value,
        opts: &WriteOptions,
    ) -> ApiResult<Value> {
        // The apply already recorded the manager's fields; create records
        // nothing more for it.
        let managed = obj
            .get("metadata")
            .and_then(|m| m.get("managedFields"))
            .cloned();
        let mut created_opts = opts.clone();
        created_opts.dry_run = true;
        created_opts.admission.dry_run = Some(opts.dry_run);
        let mut prepared = self.create(res, ns, obj, &created_opts).await?;
        if let Some(m) = managed {
            metadata_mut(&mut prepared).insert("managedFields".into(), m);
        }
        if opts.dry_run {
            return Ok(prepared);
        }
        // The dry run only checked what it allocated: take it now.
        let strategy = strategy_for(res);
        strategy.allocate(self, &mut prepared, false).await?;
        let name = meta_str(&prepared, "name").to_string();
        let key = object::object_key(res, ns, &name);
        match self
            .create_stored(res, &key, encode(&prepared)?, &prepared)
            .await
        {
            Ok(kv) => decode(&kv),
            Err(e) => {
                strategy.release(self, &prepared).await;
                Err(e.into_api_error(res, &name))
            }
        }
    }

    /// Creates an object's key; a pod created bound to a node takes its
    /// place in the node's allocation record in the same commit.
    async fn create_stored(
        &self,
        res: &ResourceInfo,
        key: &str,
        stored: bytes::Bytes,
        obj: &Value,
    ) -> Result<KeyValue, allocation::BindFailure> {
        if let Some(node) = bound_node(res, obj) {
            let pod = allocation::PodForm::Decoded(obj);
            return self
                .write_with_record(key, None, stored, pod, node, allocation::Change::Bind)
                .await;
        }
        self.store
            .create(key, stored)
            .await
            .map_err(allocation::BindFailure::Store)
    }

    /// Writes `new` over `old` (read at `cur`), applying the update
    /// strategy and the admission chain (`pods/binding` and `scale` write
    /// through here from their strategies).
    #[allow(clippy::too_many_arguments)]
    pub(crate) async fn write_update(
        &self,
        res: &'static ResourceInfo,
        ns: Option<&str>,
        name: &str,
        cur: &KeyValue,
        old: Value,
        mut new: Value,
        sub: Subresource,
        opts: &WriteOptions,
        track_fields: bool,
    ) -> Result<Value, WriteError> {
        let strategy = strategy_for(res);
        check_type_meta(res, &mut new)?;
        check_types(res, &new)?;
        new = prepare_for_update(res, &old, new, sub);
        strategy.prepare_for_update(&old, &mut new, sub);
        let a = Attributes {
            res,
            op: Operation::Update,
            sub,
            namespace: ns,
            old: Some(&old),
            options: Options::Write(opts),
        };
        admission::mutate(self, &a, &mut new).await?;
        strategy
            .authorize_write(self, res, ns, &new, opts.user.as_ref())
            .await?;
        // Allocations an update leaves out are carried over before validation
        // (as Kubernetes' service registry does).
        let fresh = strategy
            .allocate_update(self, &old, &mut new, opts.dry_run)
            .await?;
        let result = self.write_admitted(&a, name, cur, new, track_fields).await;
        if !opts.dry_run {
            let written = result.as_ref().ok();
            strategy.finish_update(self, &old, written, fresh).await;
        }
        result
    }

    /// The rest of an update, once admission has run.
    #[allow(clippy::too_many_arguments)]
    async fn write_admitted(
        &self,
        a: &Attributes<'_>,
        name: &str,
        cur: &KeyValue,
        mut new: Value,
        track_fields: bool,
    ) -> Result<Value, WriteError> {
        let (res, sub) = (a.res, a.sub);
        let (Some(old), Options::Write(opts)) = (a.old, a.options) else {
            return Err(ApiError::internal("an update without the object it replaces").into());
        };
        let strategy = strategy_for(res);
        skiff_core::defaults::apply_defaults(res, &mut new);
        let mut causes = if sub == Subresource::EphemeralContainers {
            skiff_core::validation::validate_ephemeral_containers_update(res, &new, old)
        } else if sub == Subresource::Resize {
            skiff_core::validation::validate_pod_resize(res, &new, old)
        } else {
            skiff_core::validation::validate_update(res, &new, old)
        };
        if matches!(sub, Subresource::Status | Subresource::Approval) {
            // Status writes cannot fail on spec problems they did not cause.
            causes.retain(|c| c.field.starts_with("status") || c.field.starts_with("metadata"));
        }
        if !causes.is_empty() {
            return Err(ApiError::invalid(res.group, res.kind, name, causes).into());
        }
        admission::validate(self, a, Some(&new)).await?;
        if track_fields {
            crate::fieldmanager::record(
                res,
                Some(old),
                &mut new,
                &opts.field_manager,
                sub.as_str(),
            );
        }
        if res.rules.tracks_generation() && spec_part(old) != spec_part(&new) {
            let g = old
                .get("metadata")
                .and_then(|m| m.get("generation"))
                .and_then(Value::as_i64)
                .unwrap_or(0);
            metadata_mut(&mut new).insert("generation".into(), json!(g + 1));
        }
        // Removing the last finalizer of an object being deleted deletes it
        // (a pod still running on its node only once its grace period is 0,
        // i.e. the node confirmed the end or the delete was forced).
        let deleting = !meta_str(&new, "deletionTimestamp").is_empty();
        if deleting && object::finalizers(&new).is_empty() && strategy.may_remove(&new) {
            if opts.dry_run {
                return Ok(new);
            }
            let rev = self.delete_at(res, cur).await?;
            strategy.release(self, &new).await;
            let mut v = new;
            object::set_resource_version(&mut v, rev);
            return Ok(v);
        }
        // Nothing changed: Kubernetes does not write, and the resourceVersion stays.
        // (Compared with the current resourceVersion put in place and then
        // taken out again, rather than on a copy of the whole object.)
        let unchanged = match new.get_mut("metadata").and_then(Value::as_object_mut) {
            Some(m) => {
                let rv = Value::String(cur.mod_revision.to_string());
                let before = m.insert("resourceVersion".into(), rv);
                let same = new == *old;
                let m = metadata_mut(&mut new);
                match before {
                    Some(v) => {
                        m.insert("resourceVersion".into(), v);
                    }
                    None => {
                        m.shift_remove("resourceVersion");
                    }
                }
                same
            }
            None => {
                let mut check = new.clone();
                object::set_resource_version(&mut check, cur.mod_revision);
                check == *old
            }
        };
        // (Unless the stored form is stale, e.g. encrypted with an old key.)
        if unchanged && !self.store.stale(cur) {
            return Ok(old.clone());
        }
        if opts.dry_run {
            return Ok(new);
        }
        // An update that binds a pod (sets `spec.nodeName` where there
        // was none) commits with the node's allocation record; a resize of
        // a bound pod grows its entry, keeping the record an upper bound.
        let change = match (bound_node(res, &new), bound_node(res, old), sub) {
            (Some(node), None, _) => Some((node, allocation::Change::Bind)),
            (Some(node), Some(_), Subresource::Resize) => Some((node, allocation::Change::Resize)),
            _ => None,
        };
        if let Some((node, change)) = change {
            let pod = allocation::PodForm::Decoded(&new);
            let kv = self
                .write_with_record(&cur.key, Some(cur), encode(&new)?, pod, node, change)
                .await
                .map_err(|e| e.into_write_error(res, name))?;
            return Ok(object::into_stored(new, kv.mod_revision));
        }
        // What was stored is `new`: no need to decode it again.
        let kv = self.write_at(res, cur, &new).await?;
        Ok(object::into_stored(new, kv.mod_revision))
    }

    /// Deletes an object, gracefully where its strategy says.
    pub async fn delete(
        &self,
        res: &'static ResourceInfo,
        ns: Option<&str>,
        name: &str,
        opts: &DeleteOptions,
    ) -> ApiResult<Deleted> {
        let strategy = strategy_for(res);
        self.guaranteed_update(res, ns, name, None, |cur| async move {
            let Some(cur) = cur else {
                return Err(ApiError::not_found(res.group, res.plural, name).into());
            };
            let mut obj = decode(&cur)?;
            if let Some(uid) = &opts.precondition_uid {
                if uid != meta_str(&obj, "uid") {
                    return Err(ApiError::conflict(
                        res.group,
                        res.plural,
                        name,
                        &format!(
                            "Precondition failed: UID in precondition: {uid}, UID in object meta: {}",
                            meta_str(&obj, "uid")
                        ),
                    )
                    .into());
                }
            }
            if let Some(rv) = &opts.precondition_resource_version {
                if *rv != cur.mod_revision.to_string() {
                    return Err(ApiError::conflict(
                        res.group,
                        res.plural,
                        name,
                        &format!(
                            "Precondition failed: ResourceVersion in precondition: {rv}, ResourceVersion in object meta: {}",
                            cur.mod_revision
                        ),
                    )
                    .into());
                }
            }
            let a = Attributes {
                res,
                op: Operation::Delete,
                sub: Subresource::Main,
                namespace: ns,
                old: Some(&obj),
                options: Options::Delete(opts),
            };
            admission::validate(self, &a, None).await?;
            let plan = strategy.delete_plan(&obj, opts);
            let grace = match plan {
                DeletePlan::Graceful(g) => g,
                DeletePlan::Now | DeletePlan::Finalize => 0,
            };
            let finalize = plan == DeletePlan::Finalize;
            let already_deleting = !meta_str(&obj, "deletionTimestamp").is_empty();
            let prior_grace = obj
                .pointer("/metadata/deletionGracePeriodSeconds")
                .and_then(Value::as_i64)
                .unwrap_or(0);
            // Graceful deletion under way (`BeforeDelete`): only a shorter
            // grace period changes anything, and finalizers stay as they are.
            if already_deleting && prior_grace > 0 && grace >= prior_grace {
                return Ok(Deleted::Pending(obj));
            }
            // The garbage collector's finalizers, as the options, the
            // object's own finalizers and the kind's default say.
            let before = object::finalizers(&obj);
            let after = gc_finalizers(res, &before, opts);
            if after != before {
                metadata_mut(&mut obj).insert("finalizers".into(), json!(after));
            }
            let has_finalizers = !after.is_empty();
            let graceful = grace > 0 || (finalize && !already_deleting);
            if has_finalizers || graceful || finalize {
                {
                    let m = metadata_mut(&mut obj);
                    if graceful || !already_deleting {
                        m.insert("deletionTimestamp".into(), json!(object::rfc3339_in(grace)));
                        if res.rules.tracks_generation() {
                            let g = m.get("generation").and_then(Value::as_i64).unwrap_or(0);
                            m.insert("generation".into(), json!(g + 1));
                        }
                    }
                    m.insert("deletionGracePeriodSeconds".into(), json!(grace));
                }
                if finalize {
                    strategy.prepare_for_delete(&mut obj);
                }
                if opts.dry_run {
                    return Ok(Deleted::Pending(obj));
                }
                let mut unchanged = obj.clone();
                object::set_resource_version(&mut unchanged, cur.mod_revision);
                if unchanged == decode(&cur)? {
                    return Ok(Deleted::Pending(unchanged));
                }
                let kv = self.write_at(res, &cur, &obj).await?;
                return Ok(Deleted::Pending(decode(&kv)?));
            }
            if opts.dry_run {
                return Ok(Deleted::Gone(obj));
            }
            let rev = self.delete_at(res, &cur).await?;
            strategy.release(self, &obj).await;
            object::set_resource_version(&mut obj, rev);
            Ok(Deleted::Gone(obj))
        })
        .await
    }

    // ---- guaranteed update ---------------------------------------------------

    /// The one read-modify-write loop (Kubernetes' `GuaranteedUpdate`):
    /// reads the object (the first try may start from `cached`, a copy
    /// that may be stale), lets `try_update` decide and write it with
    /// [`Registry::write_at`] / [`Registry::delete_at`] (guarded by the
    /// revision read), and starts again from a fresh read when it answers
    /// [`WriteError::Retry`] (another writer got there first).
    pub(crate) async fn guaranteed_update<T, F, Fut>(
        &self,
        res: &ResourceInfo,
        ns: Option<&str>,
        name: &str,
        mut cached: Option<KeyValue>,
        mut try_update: F,
    ) -> ApiResult<T>
    where
        F: FnMut(Option<KeyValue>) -> Fut,
        Fut: std::future::Future<Output = Result<T, WriteError>>,
    {
        loop {
            let cur = match cached.take() {
                Some(kv) => Some(kv),
                None => self.get_kv(res, ns, name).await?,
            };
            match try_update(cur).await {
                Err(WriteError::Retry) => continue,
                Err(WriteError::Api(e)) => return Err(e),
                Ok(v) => return Ok(v),
            }
        }
    }

    /// [`Registry::guaranteed_update`] for a change computed from the
    /// object alone: `change` returns the new object, or `None` to leave
    /// it as it is. `Ok(None)`: there is no such object.
    pub(crate) async fn update_object(
        &self,
        res: &ResourceInfo,
        ns: Option<&str>,
        name: &str,
        change: impl FnMut(Value) -> ApiResult<Option<Value>> + Send,
    ) -> ApiResult<Option<Value>> {
        let change = std::sync::Mutex::new(change);
        let change = &change;
        self.guaranteed_update(res, ns, name, None, |cur| async move {
            let Some(cur) = cur else {
                return Ok(None);
            };
            let decided = (change.lock().unwrap_or_else(|e| e.into_inner()))(decode(&cur)?)?;
            match decided {
                None => Ok(Some(decode(&cur)?)),
                Some(new) => {
                    let kv = self.write_at(res, &cur, &new).await?;
                    Ok(Some(object::into_stored(new, kv.mod_revision)))
                }
            }
        })
        .await
    }

    /// Writes `new` over `cur` if it is still the current version.
    pub(crate) async fn write_at(
        &self,
        res: &ResourceInfo,
        cur: &KeyValue,
        new: &Value,
    ) -> Result<KeyValue, WriteError> {
        match self
            .store
            .update(&cur.key, encode(new)?, cur.mod_revision)
            .await
        {
            Ok(kv) => Ok(kv),
            Err(skiff_store::Error::Conflict { .. }) | Err(skiff_store::Error::NotFound(_)) => {
                Err(WriteError::Retry)
            }
            Err(e) => Err(store_err(res, meta_str(new, "name"), e).into()),
        }
    }

    /// Deletes `cur` if it is still the current version; the revision of the delete.
    pub(crate) async fn delete_at(
        &self,
        res: &ResourceInfo,
        cur: &KeyValue,
    ) -> Result<i64, WriteError> {
        match self.store.delete(&cur.key, Some(cur.mod_revision)).await {
            Ok((_, rev)) => Ok(rev),
            Err(skiff_store::Error::Conflict { .. }) | Err(skiff_store::Error::NotFound(_)) => {
                Err(WriteError::Retry)
            }
            Err(e) => Err(store_err(res, cur.key.rsplit('/').next().unwrap_or(""), e).into()),
        }
    }
}

/// A replacement's type, namespace and name, checked against the request
/// (the name filled in when the body has none).
fn check_update_body(
    res: &ResourceInfo,
    ns: Option<&str>,
    name: &str,
    body: &mut Value,
) -> ApiResult<()> {
    check_type_meta(res, body)?;
    prepare_namespace(res, ns, body)?;
    let body_name = meta_str(body, "name");
    if body_name.is_empty() {
        metadata_mut(body).insert("name".into(), json!(name));
    } else if body_name != name {
        return Err(ApiError::bad_request(format!(
            "the name of the object ({body_name}) does not match the name on the URL ({name})"
        )));
    }
    Ok(())
}

/// Why a guarded write did not happen.
pub enum WriteError {
    /// The object changed since it was read: read again and retry.
    Retry,
    Api(ApiError),
}

impl From<ApiError> for WriteError {
    fn from(e: ApiError) -> Self {
        WriteError::Api(e)
    }
}
