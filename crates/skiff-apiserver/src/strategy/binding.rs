//! `pods/binding` (Kubernetes' `BindingREST`): the scheduler's binding of a
//! pod to a node, written through the registry's guaranteed update as
//! Kubernetes' binding storage updates the stored pod directly (no
//! update strategy, managed fields as they were). The checks and edits
//! are [`super::pod`]'s.

use serde_json::Value;
use skiff_core::resources;
use skiff_core::{ApiError, ApiResult};
use skiff_store::KeyValue;

use super::pod::{bind_stored, bind_to, bindable, check_binding};
use crate::object::{self, decode, encode};
use crate::options::WriteOptions;
use crate::registry::allocation::{Change, PodForm};
use crate::registry::{Registry, WriteError};

/// Binds a pod to a node (`pods/binding`), as the scheduler does.
pub async fn bind(
    reg: &Registry,
    ns: &str,
    name: &str,
    binding: &Value,
    opts: &WriteOptions,
) -> ApiResult<()> {
    let res = resources::lookup("", "v1", "pods").expect("pods");
    check_binding(name, binding)?;
    let wanted_uid = binding
        .pointer("/metadata/uid")
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_string();
    // The first try starts from the watch cache's copy (no store read);
    // the write is conditional on its revision, so a stale copy only
    // costs a conflict and a retry from the store.
    let cached = reg
        .cache()
        .resource(res)
        .get(&object::object_key(res, Some(ns), name))
        .map(|o| KeyValue {
            key: o.key.clone(),
            value: o.bytes(),
            create_revision: 0,
            mod_revision: o.revision,
        });
    let wanted_uid = &wanted_uid;
    let node = binding
        .pointer("/target/name")
        .and_then(Value::as_str)
        .unwrap_or("");
    let has_annotations = binding
        .pointer("/metadata/annotations")
        .and_then(Value::as_object)
        .is_some_and(|a| !a.is_empty());
    reg.guaranteed_update(res, Some(ns), name, cached, |cur| async move {
        let Some(cur) = cur else {
            return Err(ApiError::not_found("", "pods", name).into());
        };
        let from_cache = cur.create_revision == 0;
        // A binding without annotations edits the stored bytes (the
        // pod's managedFields and spec are not decoded and encoded).
        if !opts.dry_run && !has_annotations {
            match bind_stored(&cur.value, name, wanted_uid, node) {
                Ok(Some(bytes)) if bytes.len() <= object::MAX_OBJECT => {
                    let pod = PodForm::Stored(&cur.value);
                    return reg
                        .write_with_record(
                            &cur.key,
                            Some(&cur),
                            bytes.into(),
                            pod,
                            node,
                            Change::Bind,
                        )
                        .await
                        .map(|_| ())
                        .map_err(|e| e.into_write_error(res, name));
                }
                Ok(_) => {}
                Err(_) if from_cache => return Err(WriteError::Retry),
                Err(e) => return Err(e.into()),
            }
        }
        let mut pod = decode(&cur)?;
        if let Err(e) = bindable(&pod, name, wanted_uid) {
            // A cached copy may be of an older pod of that name.
            if from_cache {
                return Err(WriteError::Retry);
            }
            return Err(e.into());
        }
        bind_to(&mut pod, binding);
        // As Kubernetes' binding storage, which updates the stored pod
        // directly: managed fields stay as they were (the binder owns
        // nothing, and the creator keeps what it owned).
        if opts.dry_run {
            return Ok(());
        }
        let bytes = encode(&pod)?;
        reg.write_with_record(
            &cur.key,
            Some(&cur),
            bytes,
            PodForm::Decoded(&pod),
            node,
            Change::Bind,
        )
        .await
        .map(|_| ())
        .map_err(|e| e.into_write_error(res, name))
    })
    .await
}
