//! The generic steps of a write, before the kind's strategy and
//! admission: type checks, the namespace, what an update keeps of the old
//! object, patches applied, and the garbage collector's finalizers on a
//! delete.

use serde_json::{json, Map, Value};
use skiff_core::resources::ResourceInfo;
use skiff_core::{ApiError, ApiResult};

use crate::object::{meta_str, metadata_mut, now_rfc3339};
use crate::options::{DeleteOptions, PatchType, WriteOptions};
use crate::request::Subresource;

/// Fields outside `metadata` and `status`: a change in them is a spec change.
pub(super) fn spec_part(obj: &Value) -> Map<String, Value> {
    obj.as_object()
        .map(|m| {
            m.iter()
                .filter(|(k, _)| {
                    !matches!(k.as_str(), "metadata" | "status" | "apiVersion" | "kind")
                })
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect()
        })
        .unwrap_or_default()
}

/// Applies a patch to an object as version `res` shows it (`None`: the
/// object does not exist yet, which only an apply patch may create). `t` is
/// the schema that guides strategic merges and apply; without one (the
/// `scale` view) an apply patch merges like a merge patch.
pub fn apply_patch(
    res: &ResourceInfo,
    current: Option<&Value>,
    patch_type: PatchType,
    patch: &Value,
    t: Option<skiff_core::schema::TypeRef>,
    opts: &WriteOptions,
) -> ApiResult<Value> {
    let empty = json!({});
    let cur = current.unwrap_or(&empty);
    match patch_type {
        PatchType::Json => skiff_core::patch::apply_json_patch(cur, patch),
        PatchType::Merge => skiff_core::patch::apply_merge_patch(cur, patch),
        // Custom resources have no strategic merge keys: 415 as Kubernetes.
        PatchType::Strategic if res.rules.custom().is_some() => Err(ApiError::new(
            415,
            "UnsupportedMediaType",
            "the body of the request was in an unknown format - accepted media types include: application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml",
        )),
        PatchType::Strategic => skiff_core::patch::apply_strategic_merge_patch(cur, patch, t),
        PatchType::Apply if t.is_none() => skiff_core::patch::apply_merge_patch(cur, patch),
        PatchType::Apply => {
            let mut applied = patch.clone();
            check_type_meta(res, &mut applied)?;
            skiff_core::patch::apply::server_side_apply(
                current,
                &applied,
                &opts.field_manager,
                opts.force,
                t,
                &now_rfc3339(),
                &res.api_version(),
            )
        }
    }
}

/// The finalizers an object has after a delete with `opts`, as Kubernetes'
/// generic store sets them for the garbage collector: `orphan` and
/// `foregroundDeletion` follow the options first, then the finalizers the
/// object already has, then the kind's default; other finalizers stay.
pub fn gc_finalizers(res: &ResourceInfo, current: &[String], opts: &DeleteOptions) -> Vec<String> {
    const ORPHAN: &str = "orphan";
    const FOREGROUND: &str = "foregroundDeletion";
    let from_finalizers = || {
        current.iter().find_map(|f| match f.as_str() {
            ORPHAN => Some(true),
            FOREGROUND => Some(false),
            _ => None,
        })
    };
    let policy = opts.propagation_policy.as_deref();
    let orphan = match (opts.orphan_dependents, policy) {
        (Some(o), _) => o,
        (None, Some("Orphan")) => true,
        (None, Some("Background" | "Foreground")) => false,
        _ => from_finalizers().unwrap_or_else(|| res.rules.orphans_by_default()),
    };
    let foreground = match (opts.orphan_dependents, policy) {
        (Some(_), _) => false,
        (None, Some("Foreground")) => true,
        (None, Some("Background" | "Orphan")) => false,
        _ => from_finalizers() == Some(false),
    };
    let mut out: Vec<String> = current
        .iter()
        .filter(|f| *f != ORPHAN && *f != FOREGROUND)
        .cloned()
        .collect();
    if orphan {
        out.push(ORPHAN.into());
    }
    if foreground {
        out.push(FOREGROUND.into());
    }
    // The same set in another order is no change.
    let mut a = out.clone();
    let mut b = current.to_vec();
    a.sort();
    b.sort();
    if a == b {
        current.to_vec()
    } else {
        out
    }
}

/// 400 when a value has the wrong JSON type for its field, as Kubernetes'
/// decoder refuses it.
pub(crate) fn check_types(res: &ResourceInfo, obj: &Value) -> ApiResult<()> {
    let Some(t) = skiff_core::schema::root(res.group, res.version, res.kind) else {
        return Ok(());
    };
    match skiff_core::patch::type_errors(t, obj).into_iter().next() {
        None => Ok(()),
        Some(e) => Err(ApiError::bad_request(format!(
            "{kind} in version \"{v}\" cannot be handled as a {kind}: {e}",
            kind = res.kind,
            v = res.version
        ))),
    }
}

/// Checks and fills `apiVersion` and `kind` against the resource.
pub fn check_type_meta(res: &ResourceInfo, obj: &mut Value) -> ApiResult<()> {
    let Some(m) = obj.as_object_mut() else {
        return Err(ApiError::bad_request(
            "the body of the request must be a JSON object",
        ));
    };
    let expected = res.api_version();
    match m.get("apiVersion").and_then(Value::as_str) {
        None | Some("") => {
            m.insert("apiVersion".into(), json!(expected));
        }
        Some(v) if v == expected => {}
        Some(v) => {
            return Err(ApiError::bad_request(format!(
                "the API version in the data ({v}) does not match the expected API version ({expected})"
            )))
        }
    }
    match m.get("kind").and_then(Value::as_str) {
        None | Some("") => {
            m.insert("kind".into(), json!(res.kind));
        }
        Some(k) if k == res.kind => {}
        Some(k) => {
            return Err(ApiError::bad_request(format!(
                "the kind in the data ({k}) does not match the expected kind ({})",
                res.kind
            )))
        }
    }
    Ok(())
}

pub(crate) fn prepare_namespace(
    res: &ResourceInfo,
    ns: Option<&str>,
    obj: &mut Value,
) -> ApiResult<()> {
    let body_ns = meta_str(obj, "namespace").to_string();
    let m = metadata_mut(obj);
    if res.namespaced {
        let ns = ns.unwrap_or("");
        if ns.is_empty() {
            return Err(ApiError::bad_request(
                "namespace is required for a namespaced resource",
            ));
        }
        if !body_ns.is_empty() && body_ns != ns {
            return Err(ApiError::bad_request(
                "the namespace of the provided object does not match the namespace sent on the request",
            ));
        }
        m.insert("namespace".into(), json!(ns));
    } else {
        m.remove("namespace");
    }
    Ok(())
}

/// The update strategy: what of the new object is kept, what comes from the old.
pub(super) fn prepare_for_update(
    res: &ResourceInfo,
    old: &Value,
    new: Value,
    sub: Subresource,
) -> Value {
    let mut out = match sub {
        Subresource::Status | Subresource::Approval => {
            // Only status changes through the status subresource.
            let mut o = old.clone();
            match new.get("status") {
                Some(s) => o["status"] = s.clone(),
                None => {
                    if let Some(m) = o.as_object_mut() {
                        m.remove("status");
                    }
                }
            }
            // Metadata the status writer may carry along (managedFields are recomputed).
            o
        }
        Subresource::EphemeralContainers => {
            // `pods/<n>/ephemeralcontainers` changes `spec.ephemeralContainers`
            // and nothing else (Kubernetes' ephemeral containers strategy).
            let mut o = old.clone();
            if !o.get("spec").map(Value::is_object).unwrap_or(false) {
                o["spec"] = json!({});
            }
            match new.pointer("/spec/ephemeralContainers") {
                Some(e) if !e.is_null() => o["spec"]["ephemeralContainers"] = e.clone(),
                _ => {
                    if let Some(m) = o["spec"].as_object_mut() {
                        m.remove("ephemeralContainers");
                    }
                }
            }
            o
        }
        Subresource::Resize => resize_only(old, new),
        Subresource::Finalize => {
            // `namespaces/<n>/finalize` changes `spec.finalizers` and nothing else.
            let mut o = old.clone();
            let finalizers = new
                .pointer("/spec/finalizers")
                .cloned()
                .unwrap_or(json!([]));
            if !o.get("spec").map(Value::is_object).unwrap_or(false) {
                o["spec"] = json!({});
            }
            o["spec"]["finalizers"] = finalizers;
            o
        }
        _ => {
            let mut n = new;
            if res.has_subresource("status") {
                match old.get("status") {
                    Some(s) => n["status"] = s.clone(),
                    None => {
                        if let Some(m) = n.as_object_mut() {
                            m.remove("status");
                        }
                    }
                }
            }
            n
        }
    };
    // Metadata the system owns.
    let keep = [
        "uid",
        "creationTimestamp",
        "deletionTimestamp",
        "deletionGracePeriodSeconds",
        "generation",
        "namespace",
        "name",
    ];
    let old_meta = old
        .get("metadata")
        .and_then(Value::as_object)
        .cloned()
        .unwrap_or_default();
    let m = metadata_mut(&mut out);
    for k in keep {
        match old_meta.get(k) {
            Some(v) => {
                m.insert(k.to_string(), v.clone());
            }
            None => {
                m.remove(k);
            }
        }
    }
    out
}

/// `pods/<n>/resize` changes the containers' (and init containers')
/// `resources` and `resizePolicy` and nothing else (Kubernetes'
/// `dropNonResizeUpdates`). Containers added, removed, renamed or
/// reordered are left for validation to refuse.
fn resize_only(old: &Value, new: Value) -> Value {
    let list = |v: &Value, k: &str| {
        v.pointer(&format!("/spec/{k}"))
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default()
    };
    let mut out = old.clone();
    for k in ["containers", "initContainers"] {
        let (old_list, new_list) = (list(old, k), list(&new, k));
        let renamed = old_list.len() != new_list.len()
            || old_list
                .iter()
                .zip(&new_list)
                .any(|(a, b)| a.get("name") != b.get("name"));
        if renamed {
            let mut kept = old.clone();
            kept["spec"] = new.get("spec").cloned().unwrap_or(json!({}));
            return kept;
        }
        for (ix, n) in new_list.iter().enumerate() {
            let Some(ctr) = out
                .pointer_mut(&format!("/spec/{k}/{ix}"))
                .and_then(Value::as_object_mut)
            else {
                continue;
            };
            for f in ["resources", "resizePolicy"] {
                match n.get(f) {
                    Some(v) if !v.is_null() => {
                        ctr.insert(f.to_string(), v.clone());
                    }
                    _ => {
                        ctr.remove(f);
                    }
                }
            }
        }
    }
    out
}
