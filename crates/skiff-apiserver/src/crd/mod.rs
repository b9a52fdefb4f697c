//! CustomResourceDefinitions in the server: the establishing loop (names
//! accepted or in conflict, `Established`, `status.acceptedNames`,
//! `status.storedVersions`), the definition's deletion (every custom
//! resource of it deleted, then the `customresourcecleanup` finalizer
//! removed) and the delete strategy that starts it.
//!
//! Publishing is the watch cache's: it serves the Established definitions
//! it holds (`WatchCache::catalog`), so discovery, OpenAPI and routing
//! change as soon as the cache applies the status this loop writes.

pub mod conversion;

use std::sync::{Arc, Weak};
use std::time::Duration;

use serde_json::{json, Value};
use skiff_core::kinds::custom;
use skiff_core::resources::{self, ResourceInfo};
use skiff_core::ApiError;

use crate::object::{meta_str, metadata_mut};
use crate::registry::{set_condition, DeleteOptions, Registry, WriteOptions};
use crate::request::Subresource;
use crate::strategy::{DeletePlan, Strategy};
use crate::watchcache::Filter;

/// The finalizer a definition being deleted carries until its objects are gone.
pub const CLEANUP_FINALIZER: &str = "customresourcecleanup.apiextensions.k8s.io";

/// The CustomResourceDefinitions resource.
pub fn crd_resource() -> &'static ResourceInfo {
    resources::lookup("apiextensions.k8s.io", "v1", "customresourcedefinitions")
        .expect("CustomResourceDefinitions are served")
}

/// A definition's delete: marked `Terminating` with the cleanup finalizer;
/// the loop below empties it and removes the finalizer.
pub struct CrdStrategy;

impl Strategy for CrdStrategy {
    fn delete_plan(&self, _obj: &Value, _opts: &DeleteOptions) -> DeletePlan {
        DeletePlan::Finalize
    }

    fn prepare_for_delete(&self, obj: &mut Value) {
        let mut f = crate::object::finalizers(obj);
        if !f.iter().any(|x| x == CLEANUP_FINALIZER) {
            f.push(CLEANUP_FINALIZER.to_string());
            metadata_mut(obj).insert("finalizers".into(), json!(f));
        }
        set_condition(
            obj,
            "Terminating",
            "True",
            Some("InstanceDeletionPending"),
            Some("CustomResourceDefinition marked for deletion; CustomResource deletion will begin soon"),
        );
        strip_probe_time(obj);
    }
}

/// CRD conditions carry no `lastProbeTime`.
fn strip_probe_time(obj: &mut Value) {
    if let Some(cs) = obj
        .pointer_mut("/status/conditions")
        .and_then(Value::as_array_mut)
    {
        for c in cs {
            if let Some(m) = c.as_object_mut() {
                m.remove("lastProbeTime");
            }
        }
    }
}

/// Runs until the registry is dropped: establishes new and changed
/// definitions and cleans up deleted ones.
pub async fn run(reg: Weak<Registry>) {
    let (cache, mut changed) = match reg.upgrade() {
        Some(r) => {
            let c = r.cache().resource(crd_resource());
            let rx = c.subscribe();
            (c, rx)
        }
        None => return,
    };
    loop {
        let Some(r) = reg.upgrade() else { return };
        let crds: Vec<Arc<Value>> = cache
            .snapshot(&Filter::default())
            .into_iter()
            .filter_map(|o| o.value())
            .collect();
        let mut pending = false;
        for crd in &crds {
            let res = if meta_str(crd, "deletionTimestamp").is_empty() {
                establish(&r, crd, &crds).await.map(|_| true)
            } else {
                clean_up(&r, crd).await
            };
            match res {
                Ok(done) => pending |= !done,
                Err(e) if e.code == 409 || e.code == 404 => pending = true,
                Err(e) => {
                    pending = true;
                    tracing::warn!(crd = %meta_str(crd, "name"), error = %e, "CustomResourceDefinition");
                }
            }
        }
        drop(r);
        let wait = if pending {
            Duration::from_millis(200)
        } else {
            Duration::from_secs(30)
        };
        tokio::select! {
            r = changed.changed() => if r.is_err() { return },
            _ = tokio::time::sleep(wait) => {}
        }
    }
}

/// The names a definition asks for that another one (accepted, in the same
/// group) or a built-in resource of the group already has; Kubernetes'
/// NamingConditionController's message.
pub fn name_conflict(crd: &Value, others: &[Arc<Value>]) -> Option<String> {
    let s = |v: &Value, p: &str| {
        v.pointer(p)
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string()
    };
    let group = s(crd, "/spec/group");
    let name = meta_str(crd, "name");
    let plural = s(crd, "/spec/names/plural");
    let singular = s(crd, "/spec/names/singular");
    let kind = s(crd, "/spec/names/kind");
    let list_kind = s(crd, "/spec/names/listKind");
    let shorts: Vec<String> = crd
        .pointer("/spec/names/shortNames")
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(Value::as_str)
                .map(str::to_string)
                .collect()
        })
        .unwrap_or_default();
    // Built-in resources of the group.
    for r in resources::RESOURCES.iter().filter(|r| r.group == group) {
        if r.plural == plural || r.singular == plural {
            return Some(format!("{plural:?} is already in use"));
        }
        if r.kind == kind {
            return Some(format!("{kind:?} is already in use"));
        }
    }
    for o in others {
        if meta_str(o, "name") == name || s(o, "/spec/group") != group {
            continue;
        }
        let a = |f: &str| s(o, &format!("/status/acceptedNames/{f}"));
        let (op, os, ok, olk) = (a("plural"), a("singular"), a("kind"), a("listKind"));
        if !op.is_empty() && (op == plural || os == plural) {
            return Some(format!("{plural:?} is already in use"));
        }
        if !os.is_empty() && (op == singular || os == singular) {
            return Some(format!("{singular:?} is already in use"));
        }
        let oshorts: Vec<String> = o
            .pointer("/status/acceptedNames/shortNames")
            .and_then(Value::as_array)
            .map(|a| {
                a.iter()
                    .filter_map(Value::as_str)
                    .map(str::to_string)
                    .collect()
            })
            .unwrap_or_default();
        if let Some(sn) = shorts.iter().find(|x| oshorts.contains(x)) {
            return Some(format!("{sn:?} is already in use"));
        }
        if !ok.is_empty() && (ok == kind || olk == kind) {
            return Some(format!("{kind:?} is already in use"));
        }
        if !olk.is_empty() && (ok == list_kind || olk == list_kind) {
            return Some(format!("{list_kind:?} is already in use"));
        }
    }
    None
}

/// The status a definition should have now.
fn desired_status(crd: &Value, others: &[Arc<Value>]) -> Value {
    let mut obj = crd.clone();
    if !obj.get("status").map(Value::is_object).unwrap_or(false) {
        obj["status"] = json!({});
    }
    match name_conflict(crd, others) {
        None => {
            let mut names = crd.pointer("/spec/names").cloned().unwrap_or(json!({}));
            if let Some(m) = names.as_object_mut() {
                m.retain(|_, v| !v.is_null());
            }
            obj["status"]["acceptedNames"] = names;
            set_condition(
                &mut obj,
                "NamesAccepted",
                "True",
                Some("NoConflicts"),
                Some("no conflicts found"),
            );
            set_condition(
                &mut obj,
                "Established",
                "True",
                Some("InitialNamesAccepted"),
                Some("the initial names have been accepted"),
            );
        }
        Some(msg) => {
            set_condition(
                &mut obj,
                "NamesAccepted",
                "False",
                Some("NameConflict"),
                Some(&msg),
            );
            if !custom::is_established(crd) {
                set_condition(
                    &mut obj,
                    "Established",
                    "False",
                    Some("NotAccepted"),
                    Some("not all names are accepted"),
                );
            }
        }
    }
    // The storage version is recorded; none is ever dropped here.
    let storage = crd
        .pointer("/spec/versions")
        .and_then(Value::as_array)
        .and_then(|vs| {
            vs.iter()
                .find(|v| v.get("storage").and_then(Value::as_bool) == Some(true))
        })
        .and_then(|v| v.get("name"))
        .cloned();
    let stored = obj["status"]
        .as_object_mut()
        .expect("status object")
        .entry("storedVersions")
        .or_insert_with(|| json!([]));
    if !stored.is_array() {
        *stored = json!([]);
    }
    if let (Some(sv), Some(list)) = (storage, stored.as_array_mut()) {
        if !list.contains(&sv) {
            list.push(sv);
        }
    }
    strip_probe_time(&mut obj);
    obj
}

async fn establish(reg: &Registry, crd: &Value, all: &[Arc<Value>]) -> Result<(), ApiError> {
    let want = desired_status(crd, all);
    if want.get("status") == crd.get("status") {
        return Ok(());
    }
    let name = meta_str(crd, "name").to_string();
    reg.update(
        crd_resource(),
        None,
        &name,
        want,
        Subresource::Status,
        &WriteOptions {
            field_manager: "kube-apiserver".into(),
            ..Default::default()
        },
    )
    .await
    .map(|_| ())
}

/// One pass over a definition being deleted: deletes its objects; once
/// none is left, removes the cleanup finalizer. True when done.
async fn clean_up(reg: &Registry, crd: &Value) -> Result<bool, ApiError> {
    let name = meta_str(crd, "name").to_string();
    if !crate::object::finalizers(crd)
        .iter()
        .any(|f| f == CLEANUP_FINALIZER)
    {
        return Ok(true);
    }
    let storage = custom::resources_of(crd)
        .first()
        .and_then(|r| r.rules.custom())
        .and_then(|c| c.storage_resource());
    let mut remaining = 0;
    if let Some(res) = storage {
        for o in reg.cache().resource(res).snapshot(&Filter::default()) {
            remaining += 1;
            let v: Value = serde_json::from_slice(&o.bytes())
                .map_err(|e| ApiError::internal(e.to_string()))?;
            if !meta_str(&v, "deletionTimestamp").is_empty() {
                continue;
            }
            let ns = (!o.namespace.is_empty()).then_some(o.namespace.as_str());
            match reg
                .delete(res, ns, &o.name, &DeleteOptions::default())
                .await
            {
                Ok(_) => {}
                Err(e) if e.code == 404 => {}
                Err(e) => return Err(e),
            }
        }
    }
    if remaining > 0 {
        let mut obj = crd.clone();
        set_condition(
            &mut obj,
            "Terminating",
            "True",
            Some("InstanceDeletionInProgress"),
            Some("CustomResource deletion is in progress"),
        );
        strip_probe_time(&mut obj);
        if obj.get("status") != crd.get("status") {
            let _ = reg
                .update(
                    crd_resource(),
                    None,
                    &name,
                    obj,
                    Subresource::Status,
                    &WriteOptions::default(),
                )
                .await;
        }
        return Ok(false);
    }
    let mut obj = crd.clone();
    let left: Vec<String> = crate::object::finalizers(crd)
        .into_iter()
        .filter(|f| f != CLEANUP_FINALIZER)
        .collect();
    metadata_mut(&mut obj).insert("finalizers".into(), json!(left));
    reg.update(
        crd_resource(),
        None,
        &name,
        obj,
        Subresource::Main,
        &WriteOptions::default(),
    )
    .await?;
    Ok(true)
}
