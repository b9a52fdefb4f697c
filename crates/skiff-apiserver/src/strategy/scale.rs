//! The `scale` subresource (Kubernetes' `ScaleREST`): the autoscaling/v1
//! Scale view of a scalable object (`spec.replicas`, `status.replicas`, the
//! selector; a custom resource's `subresources.scale` paths). A read is
//! the view of the object; a replace or patch is admitted on the Scale
//! objects, applied to the object and written through the registry's
//! guaranteed update as an update of the object itself.

use serde_json::{json, Value};
use skiff_core::resources::ResourceInfo;
use skiff_core::{ApiError, ApiResult, Cause};
use skiff_store::KeyValue;

use crate::object::{decode, meta_str};
use crate::options::{PatchType, WriteOptions};
use crate::registry::{apply_patch, prepare_namespace, Registry, WriteError};
use crate::request::Subresource;

/// The Scale of an object.
pub async fn get(
    reg: &Registry,
    res: &'static ResourceInfo,
    ns: Option<&str>,
    name: &str,
) -> ApiResult<Value> {
    to_scale(res, &reg.get(res, ns, name).await?)
}

/// Replaces the Scale of an object (PUT): only `spec.replicas` changes;
/// a resourceVersion in the body is a precondition.
pub async fn update(
    reg: &Registry,
    res: &'static ResourceInfo,
    ns: Option<&str>,
    name: &str,
    mut scale: Value,
    opts: &WriteOptions,
) -> ApiResult<Value> {
    check_scale_meta(&mut scale)?;
    prepare_namespace(res, ns, &mut scale)?;
    let scale_name = meta_str(&scale, "name");
    if scale_name.is_empty() {
        crate::object::metadata_mut(&mut scale).insert("name".into(), json!(name));
    } else if scale_name != name {
        return Err(ApiError::bad_request(format!(
            "the name of the object ({scale_name}) does not match the name on the URL ({name})"
        )));
    }
    let wanted_rv = meta_str(&scale, "resourceVersion").to_string();
    let stale = || ApiError::conflict(res.group, res.plural, name, ApiError::STALE);
    let (scale, wanted_rv) = (&scale, &wanted_rv);
    reg.guaranteed_update(res, ns, name, None, |cur| async move {
        let Some(cur) = cur else {
            return Err(ApiError::not_found(res.group, res.plural, name).into());
        };
        if !wanted_rv.is_empty() && *wanted_rv != cur.mod_revision.to_string() {
            return Err(stale().into());
        }
        match write(reg, res, ns, name, &cur, scale.clone(), opts, true).await {
            // A named resourceVersion is a precondition: no retry.
            Err(WriteError::Retry) if !wanted_rv.is_empty() => Err(stale().into()),
            other => other,
        }
    })
    .await
}

/// Patches the Scale of an object (an apply patch merges as a merge patch:
/// the Scale has no schema for it).
pub async fn patch(
    reg: &Registry,
    res: &'static ResourceInfo,
    ns: Option<&str>,
    name: &str,
    patch_type: PatchType,
    patch: &Value,
    opts: &WriteOptions,
) -> ApiResult<Value> {
    reg.guaranteed_update(res, ns, name, None, |cur| async move {
        let Some(cur) = cur else {
            return Err(ApiError::not_found(res.group, res.plural, name).into());
        };
        let current = to_scale(res, &decode(&cur)?)?;
        let patched = apply_patch(res, Some(&current), patch_type, patch, None, opts)?;
        // A patch that names a resourceVersion is a precondition on it.
        let patched_rv = meta_str(&patched, "resourceVersion");
        if !patched_rv.is_empty() && patched_rv != cur.mod_revision.to_string() {
            return Err(ApiError::conflict(res.group, res.plural, name, ApiError::STALE).into());
        }
        let track = patch_type != PatchType::Apply;
        write(reg, res, ns, name, &cur, patched, opts, track).await
    })
    .await
}

/// Admits the new Scale (dynamic admission sees the Scale objects, as
/// Kubernetes'), applies it to the object read at `cur` and writes that.
#[allow(clippy::too_many_arguments)]
async fn write(
    reg: &Registry,
    res: &'static ResourceInfo,
    ns: Option<&str>,
    name: &str,
    cur: &KeyValue,
    mut scale: Value,
    opts: &WriteOptions,
    track_fields: bool,
) -> Result<Value, WriteError> {
    let old = decode(cur)?;
    let old_scale = to_scale(res, &old)?;
    let opts = &crate::webhook::admit_scale(reg, res, &old, &old_scale, &mut scale, opts).await?;
    let new = from_scale(res, &old, &scale)?;
    let written = reg
        .write_update(
            res,
            ns,
            name,
            cur,
            old,
            new,
            Subresource::Main,
            opts,
            track_fields,
        )
        .await?;
    Ok(to_scale(res, &written)?)
}

/// A Scale body's `apiVersion` and `kind`: autoscaling/v1 Scale, filled in
/// when absent.
fn check_scale_meta(scale: &mut Value) -> ApiResult<()> {
    let Some(m) = scale.as_object_mut() else {
        return Err(ApiError::bad_request(
            "the body of the request must be a JSON object",
        ));
    };
    for (field, want) in [("apiVersion", "autoscaling/v1"), ("kind", "Scale")] {
        match m.get(field).and_then(Value::as_str) {
            None | Some("") => {
                m.insert(field.into(), json!(want));
            }
            Some(v) if v == want => {}
            Some(v) => {
                return Err(ApiError::bad_request(format!(
                    "the {field} in the data ({v}) does not match the expected {field} ({want})"
                )))
            }
        }
    }
    Ok(())
}

/// The `Scale` view (autoscaling/v1) of a scalable object.
pub fn to_scale(res: &ResourceInfo, obj: &Value) -> ApiResult<Value> {
    let md = obj.get("metadata").cloned().unwrap_or(json!({}));
    // A custom resource's scale paths (`subresources.scale`).
    let paths = res.rules.custom().and_then(|c| c.scale.as_ref());
    let replicas = obj
        .pointer(paths.map_or("/spec/replicas", |p| p.spec_replicas.as_str()))
        .and_then(Value::as_i64)
        .unwrap_or(0);
    let status_replicas = obj
        .pointer(paths.map_or("/status/replicas", |p| p.status_replicas.as_str()))
        .and_then(Value::as_i64)
        .unwrap_or(0);
    let selector = match paths {
        Some(p) => p
            .label_selector
            .as_deref()
            .and_then(|l| obj.pointer(l))
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string(),
        None => skiff_core::selector::selector_string(obj.pointer("/spec/selector")),
    };
    let mut meta = json!({});
    for k in [
        "name",
        "namespace",
        "uid",
        "resourceVersion",
        "creationTimestamp",
    ] {
        if let Some(v) = md.get(k) {
            meta[k] = v.clone();
        }
    }
    Ok(json!({
        "kind": "Scale",
        "apiVersion": "autoscaling/v1",
        "metadata": meta,
        "spec": {"replicas": replicas},
        "status": {"replicas": status_replicas, "selector": selector},
    }))
}

/// Applies a written `Scale` to the object it scales.
pub(crate) fn from_scale(res: &ResourceInfo, old: &Value, scale: &Value) -> ApiResult<Value> {
    let name = meta_str(old, "name");
    let replicas = match scale.pointer("/spec/replicas") {
        None | Some(Value::Null) => 0,
        Some(v) => v.as_i64().ok_or_else(|| {
            ApiError::invalid(
                "autoscaling",
                "Scale",
                name,
                vec![Cause::invalid("spec.replicas", v, "must be an integer")],
            )
        })?,
    };
    if replicas < 0 {
        return Err(ApiError::invalid(
            "autoscaling",
            "Scale",
            name,
            vec![Cause::invalid(
                "spec.replicas",
                &json!(replicas),
                "must be greater than or equal to 0",
            )],
        ));
    }
    let mut new = old.clone();
    match res.rules.custom().and_then(|c| c.scale.as_ref()) {
        Some(p) => set_pointer(&mut new, &p.spec_replicas, json!(replicas)),
        None => new["spec"]["replicas"] = json!(replicas),
    }
    Ok(new)
}

/// Sets the value at a JSON pointer, creating the objects on the way.
fn set_pointer(obj: &mut Value, pointer: &str, v: Value) {
    let mut cur = obj;
    let parts: Vec<&str> = pointer.split('/').skip(1).collect();
    for (i, p) in parts.iter().enumerate() {
        let key = p.replace("~1", "/").replace("~0", "~");
        if !cur.is_object() {
            *cur = json!({});
        }
        let m = cur.as_object_mut().expect("object");
        if i + 1 == parts.len() {
            m.insert(key, v);
            return;
        }
        cur = m.entry(key).or_insert_with(|| json!({}));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_scale_body_must_be_an_autoscaling_v1_scale() {
        let mut s = json!({"spec": {"replicas": 2}});
        check_scale_meta(&mut s).unwrap();
        assert_eq!(s["apiVersion"], "autoscaling/v1");
        assert_eq!(s["kind"], "Scale");
        let mut d = json!({"apiVersion": "apps/v1", "kind": "Deployment"});
        assert_eq!(check_scale_meta(&mut d).unwrap_err().code, 400);
    }

    #[test]
    fn a_scale_sets_only_the_replicas_and_refuses_negative_ones() {
        let deployments = skiff_core::resources::lookup("apps", "v1", "deployments").unwrap();
        let old = json!({"metadata": {"name": "web"}, "spec": {"replicas": 1, "paused": true}});
        let new = from_scale(deployments, &old, &json!({"spec": {"replicas": 3}})).unwrap();
        assert_eq!(new["spec"], json!({"replicas": 3, "paused": true}));
        assert_eq!(to_scale(deployments, &new).unwrap()["spec"]["replicas"], 3);
        let e = from_scale(deployments, &old, &json!({"spec": {"replicas": -1}})).unwrap_err();
        assert_eq!(e.code, 422);
    }
}
