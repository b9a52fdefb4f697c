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

use crate::object::set_condition;
use crate::object::{meta_str, metadata_mut};
use crate::options::{DeleteOptions, WriteOptions};
use crate::registry::Registry;
use crate::request::Subresource;
use crate::watchcache::Filter;

pub use crate::strategy::crd::{strip_probe_time, CLEANUP_FINALIZER};

/// The CustomResourceDefinitions resource.
pub fn crd_resource() -> &'static ResourceInfo {
    resources::lookup("apiextensions.k8s.io", "v1", "customresourcedefinitions")
        .expect("CustomResourceDefinitions are served")
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
        let mut crds: Vec<Arc<Value>> = cache
            .snapshot(&Filter::default())
            .into_iter()
            .filter_map(|o| o.value())
            .collect();
        let mut pending = false;
        for i in 0..crds.len() {
            let crd = crds[i].clone();
            let res = if meta_str(&crd, "deletionTimestamp").is_empty() {
                // Later definitions of this pass see the names this one
                // was given (two new definitions asking for one name do
                // not both get it).
                establish(&r, &crd, &crds).await.map(|written| {
                    if let Some(w) = written {
                        crds[i] = Arc::new(w);
                    }
                    true
                })
            } else {
                clean_up(&r, &crd).await
            };
            match res {
                Ok(done) => pending |= !done,
                Err(e) if e.code == 409 || e.code == 404 => pending = true,
                Err(e) => {
                    pending = true;
                    tracing::warn!(crd = %meta_str(&crd, "name"), error = %e, "CustomResourceDefinition");
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

/// What kube-apiextensions-server's naming controller decides for a
/// definition: the names it may have (`status.acceptedNames`: each asked
/// name that is its own already or free, else the one it had) and, when a
/// name is taken, the NamesAccepted=False reason and message.
pub struct Naming {
    pub accepted: Value,
    /// (`PluralConflict` | `SingularConflict` | `ShortNamesConflict` |
    /// `KindConflict` | `ListKindConflict`, `"x" is already in use`); the
    /// last check that fails gives it, as in Kubernetes.
    pub conflict: Option<(&'static str, String)>,
}

fn strings_at(v: &Value, ptr: &str) -> Vec<String> {
    v.pointer(ptr)
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(Value::as_str)
                .map(str::to_string)
                .collect()
        })
        .unwrap_or_default()
}

/// A name the definition asks for is fine when it already has it or nobody
/// in the group has it.
fn equal_to_accepted_or_fresh(
    requested: &str,
    accepted: &str,
    used: &std::collections::HashSet<String>,
) -> Result<(), String> {
    if requested == accepted || !used.contains(requested) {
        return Ok(());
    }
    Err(format!("{requested:?} is already in use"))
}

/// Checks a definition's names against the accepted names of every
/// definition of its group (itself included, as `crd` has it; `all` may
/// hold an older copy of it) and the group's built-in resources.
pub fn naming(crd: &Value, all: &[Arc<Value>]) -> Naming {
    let s = |v: &Value, p: &str| {
        v.pointer(p)
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string()
    };
    let group = s(crd, "/spec/group");
    let name = meta_str(crd, "name");
    let mut resources_used = std::collections::HashSet::new();
    let mut kinds_used = std::collections::HashSet::new();
    for r in resources::RESOURCES.iter().filter(|r| r.group == group) {
        resources_used.insert(r.plural.to_string());
        resources_used.insert(r.singular.to_string());
        resources_used.extend(r.short_names.iter().map(|n| n.to_string()));
        kinds_used.insert(r.kind.to_string());
        kinds_used.insert(format!("{}List", r.kind));
    }
    let others = all
        .iter()
        .map(|o| &**o)
        .filter(|o| meta_str(o, "name") != name && s(o, "/spec/group") == group);
    for o in others.chain(std::iter::once(crd)) {
        let a = |f: &str| s(o, &format!("/status/acceptedNames/{f}"));
        resources_used.insert(a("plural"));
        resources_used.insert(a("singular"));
        resources_used.extend(strings_at(o, "/status/acceptedNames/shortNames"));
        kinds_used.insert(a("kind"));
        kinds_used.insert(a("listKind"));
    }
    let requested = |f: &str| s(crd, &format!("/spec/names/{f}"));
    let accepted = |f: &str| s(crd, &format!("/status/acceptedNames/{f}"));
    let mut names = crd
        .pointer("/status/acceptedNames")
        .filter(|n| n.is_object())
        .cloned()
        .unwrap_or(json!({}));
    let mut conflict = None;
    let checks: [(&str, &str, &std::collections::HashSet<String>); 2] = [
        ("plural", "PluralConflict", &resources_used),
        ("singular", "SingularConflict", &resources_used),
    ];
    for (field, reason, used) in checks {
        match equal_to_accepted_or_fresh(&requested(field), &accepted(field), used) {
            Ok(()) => names[field] = json!(requested(field)),
            Err(m) => conflict = Some((reason, m)),
        }
    }
    let want_short = strings_at(crd, "/spec/names/shortNames");
    let have_short = strings_at(crd, "/status/acceptedNames/shortNames");
    if want_short != have_short {
        let mut errs: Vec<String> = Vec::new();
        for sn in want_short.iter().filter(|sn| !have_short.contains(sn)) {
            if let Err(m) = equal_to_accepted_or_fresh(sn, "", &resources_used) {
                if !errs.contains(&m) {
                    errs.push(m);
                }
            }
        }
        match errs.len() {
            0 => names["shortNames"] = json!(want_short),
            1 => conflict = Some(("ShortNamesConflict", errs.remove(0))),
            _ => conflict = Some(("ShortNamesConflict", format!("[{}]", errs.join(", ")))),
        }
    }
    let checks: [(&str, &str, &std::collections::HashSet<String>); 2] = [
        ("kind", "KindConflict", &kinds_used),
        ("listKind", "ListKindConflict", &kinds_used),
    ];
    for (field, reason, used) in checks {
        match equal_to_accepted_or_fresh(&requested(field), &accepted(field), used) {
            Ok(()) => names[field] = json!(requested(field)),
            Err(m) => conflict = Some((reason, m)),
        }
    }
    match crd.pointer("/spec/names/categories") {
        Some(c) if !c.is_null() => names["categories"] = c.clone(),
        _ => {
            if let Some(m) = names.as_object_mut() {
                m.remove("categories");
            }
        }
    }
    if conflict.is_none() {
        // Every asked name is accepted: the accepted names are the asked ones.
        names = crd.pointer("/spec/names").cloned().unwrap_or(json!({}));
    }
    // As Kubernetes serializes the names: plural and kind always, the
    // others only when set.
    if let Some(m) = names.as_object_mut() {
        m.retain(|k, v| match v {
            Value::Null => false,
            Value::String(s) => !s.is_empty() || k == "plural" || k == "kind",
            Value::Array(a) => !a.is_empty(),
            _ => true,
        });
    }
    Naming {
        accepted: names,
        conflict,
    }
}

/// The status a definition should have now.
fn desired_status(crd: &Value, others: &[Arc<Value>]) -> Value {
    let mut obj = crd.clone();
    if !obj.get("status").map(Value::is_object).unwrap_or(false) {
        obj["status"] = json!({});
    }
    let naming = naming(crd, others);
    obj["status"]["acceptedNames"] = naming.accepted;
    match naming.conflict {
        None => {
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
        Some((reason, msg)) => {
            set_condition(&mut obj, "NamesAccepted", "False", Some(reason), Some(&msg));
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

/// Writes the status a definition should have; the object written, if any.
async fn establish(
    reg: &Registry,
    crd: &Value,
    all: &[Arc<Value>],
) -> Result<Option<Value>, ApiError> {
    let want = desired_status(crd, all);
    if want.get("status") == crd.get("status") {
        return Ok(None);
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
    .map(|(written, _)| Some(written))
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

#[cfg(test)]
mod tests {
    use super::*;

    fn crd(name: &str, names: Value, accepted: Value) -> Value {
        json!({"metadata": {"name": name},
            "spec": {"group": "example.com", "names": names},
            "status": {"acceptedNames": accepted}})
    }

    fn widgets() -> Arc<Value> {
        let names = json!({"plural": "widgets", "singular": "widget", "shortNames": ["wd"],
            "kind": "Widget", "listKind": "WidgetList"});
        Arc::new(crd("widgets.example.com", names.clone(), names))
    }

    #[test]
    fn a_definition_keeps_its_own_names_and_takes_free_ones() {
        // Renaming its kind to a free one while keeping the others.
        let names = json!({"plural": "widgets", "singular": "widget", "shortNames": ["wd"],
            "kind": "Gadget", "listKind": "GadgetList"});
        let mine = crd(
            "widgets.example.com",
            names.clone(),
            widgets()["status"]["acceptedNames"].clone(),
        );
        let n = naming(&mine, &[widgets()]);
        assert!(n.conflict.is_none());
        assert_eq!(n.accepted, names);
    }

    #[test]
    fn a_taken_name_keeps_the_accepted_one_and_the_last_check_gives_the_reason() {
        // Kind and list kind both taken: ListKindConflict (the last check),
        // and the accepted kind stays what it was.
        let other = crd(
            "gizmos.example.com",
            json!({"plural": "gizmos", "singular": "gizmo", "kind": "Widget",
                "listKind": "WidgetList", "categories": ["all"]}),
            json!({"plural": "", "kind": ""}),
        );
        let n = naming(&other, &[widgets()]);
        assert_eq!(
            n.conflict,
            Some((
                "ListKindConflict",
                "\"WidgetList\" is already in use".into()
            ))
        );
        assert_eq!(
            n.accepted,
            json!({"plural": "gizmos", "kind": "", "singular": "gizmo", "categories": ["all"]})
        );
        // A built-in resource's names are taken too.
        let mut pods = crd(
            "pods.example.com",
            json!({"plural": "pods", "kind": "Pod", "listKind": "PodList"}),
            json!({"plural": "", "kind": ""}),
        );
        pods["spec"]["group"] = json!("");
        assert_eq!(
            naming(&pods, &[]).conflict.map(|c| c.0),
            Some("ListKindConflict")
        );
    }

    #[test]
    fn short_names_already_accepted_are_kept_and_new_taken_ones_are_all_named() {
        let mine = crd(
            "bolts.example.com",
            json!({"plural": "bolts", "kind": "Bolt", "shortNames": ["b", "wd", "widget"]}),
            json!({"plural": "bolts", "kind": "Bolt", "shortNames": ["b"]}),
        );
        let n = naming(&mine, &[widgets()]);
        assert_eq!(
            n.conflict,
            Some((
                "ShortNamesConflict",
                "[\"wd\" is already in use, \"widget\" is already in use]".into()
            ))
        );
        assert_eq!(n.accepted["shortNames"], json!(["b"]));
    }
}
