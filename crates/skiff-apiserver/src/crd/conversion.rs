//! Custom resources crossing versions: conversion `None` rewrites
//! `apiVersion`; conversion `Webhook` sends a ConversionReview to the
//! definition's `spec.conversion.webhook.clientConfig` and checks its
//! answer as kube-apiserver's webhook converter does (the answer's uid,
//! one object per object sent, the desired apiVersion, the same kind,
//! name, namespace and uid; of the metadata only labels and annotations
//! may change, the rest is restored from the original).
//!
//! The handlers call [`from_storage`], [`to_storage`] and [`list_from_storage`]
//! around the registry, which works in the storage version; watches
//! convert per chunk of events ([`convert_to`] on a batch). Objects already
//! in the wanted version are not sent; a list or a chunk of a watch is one
//! review. A failure is a 500 InternalError worded as kube-apiserver's
//! ("conversion webhook for <group>/<version>, Kind=<kind> failed: ...").

use std::time::Duration;

use bytes::Bytes;
use serde_json::{json, Map, Value};
use skiff_core::convert;
use skiff_core::resources::ResourceInfo;
use skiff_core::ApiError;

use crate::outbound::{self, ClientConfig, ServiceResolver};

/// How long one conversion call may take (kube-apiserver's webhook
/// client timeout for conversion).
pub const TIMEOUT: Duration = Duration::from_secs(30);

/// The webhook settings of `res`'s definition, when its strategy is
/// `Webhook`.
fn webhook_of(res: &'static ResourceInfo) -> Option<&'static Value> {
    let c = res.rules.custom()?;
    (c.conversion.get("strategy").and_then(Value::as_str) == Some("Webhook"))
        .then(|| c.conversion.get("webhook"))
        .flatten()
}

/// Whether `res` converts through a webhook.
pub fn uses_webhook(res: &'static ResourceInfo) -> bool {
    webhook_of(res).is_some()
}

/// Whether requests for `res` go through conversion at all (a custom
/// resource's stored objects may be of another version than the storage
/// one after the storage version changed).
pub fn needed(res: &'static ResourceInfo) -> bool {
    convert::needed(res) || res.rules.custom().is_some()
}

fn api_version_of(v: &Value) -> &str {
    v.get("apiVersion").and_then(Value::as_str).unwrap_or("")
}

fn kind_of(v: &Value) -> &str {
    v.get("kind").and_then(Value::as_str).unwrap_or("")
}

/// Go's `GroupVersionKind.String()`: `group/version, Kind=kind`.
fn gvk(api_version: &str, kind: &str) -> String {
    let (g, v) = api_version.split_once('/').unwrap_or(("", api_version));
    format!("{g}/{v}, Kind={kind}")
}

/// Converts `objs` to `target`'s version. For conversion `None` only
/// `apiVersion` changes; for `Webhook` the objects of another version go
/// to the webhook in one review. No defaults are applied here.
pub async fn convert_to(
    resolver: &dyn ServiceResolver,
    target: &'static ResourceInfo,
    mut objs: Vec<Value>,
) -> Result<Vec<Value>, ApiError> {
    let want = target.api_version();
    let Some(hook) = webhook_of(target) else {
        for o in &mut objs {
            if let Some(m) = o.as_object_mut() {
                m.insert("apiVersion".into(), json!(want));
            }
        }
        return Ok(objs);
    };
    let idx: Vec<usize> = (0..objs.len())
        .filter(|i| api_version_of(&objs[*i]) != want)
        .collect();
    if idx.is_empty() {
        return Ok(objs);
    }
    let first = &objs[idx[0]];
    let what = if objs.len() == 1 {
        gvk(api_version_of(first), kind_of(first))
    } else {
        gvk(api_version_of(first), &format!("{}List", kind_of(first)))
    };
    let sent: Vec<Value> = idx.iter().map(|i| objs[*i].clone()).collect();
    let converted = call(resolver, hook, &want, sent)
        .await
        .map_err(|e| failure(format!("conversion webhook for {what} failed: {e}")))?;
    if converted.len() != idx.len() {
        return Err(failure(format!(
            "conversion webhook for {what} returned {} objects, expected {}",
            converted.len(),
            idx.len()
        )));
    }
    let single = objs.len() == 1;
    for (n, (i, out)) in idx.iter().zip(converted).enumerate() {
        let at = if single {
            "invalid object at index 0".to_string()
        } else {
            format!("invalid converted object at index {n}")
        };
        let original = &objs[*i];
        let out = check_converted(original, out, &want).map_err(|e| match e {
            Bad::Object(e) => failure(format!("conversion webhook for {what} returned {at}: {e}")),
            Bad::Meta(e) => failure(format!(
                "conversion webhook for {what} returned invalid metadata{}: {e}",
                if single {
                    String::new()
                } else {
                    format!(" in object at index {n}")
                }
            )),
        })?;
        objs[*i] = out;
    }
    Ok(objs)
}

fn failure(message: String) -> ApiError {
    ApiError::new(500, "InternalError", message)
}

enum Bad {
    Object(String),
    Meta(String),
}

/// The checks on one converted object, then the original's metadata with
/// the answer's labels and annotations.
fn check_converted(original: &Value, mut out: Value, want: &str) -> Result<Value, Bad> {
    if !out.is_object() {
        return Err(Bad::Object("the converted object is not an object".into()));
    }
    let got = api_version_of(&out);
    if got != want {
        return Err(Bad::Object(format!(
            "invalid groupVersion (expected {want}, received {got})"
        )));
    }
    let (ek, gk) = (kind_of(original), kind_of(&out));
    if ek != gk {
        return Err(Bad::Object(format!(
            "invalid kind (expected {ek}, received {gk})"
        )));
    }
    let meta = |v: &Value, f: &str| {
        v.pointer(&format!("/metadata/{f}"))
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string()
    };
    for (f, what) in [("name", "name"), ("namespace", "namespace"), ("uid", "UID")] {
        let (e, a) = (meta(original, f), meta(&out, f));
        if e != a {
            return Err(Bad::Object(format!(
                "must have the same {what}: {e} != {a}"
            )));
        }
    }
    let answered = match out.get("metadata") {
        None => return Err(Bad::Meta("missing metadata in converted object".into())),
        Some(Value::Object(m)) => m.clone(),
        Some(other) => {
            return Err(Bad::Meta(format!(
                "invalid metadata of type {} in converted object",
                json_type(other)
            )))
        }
    };
    let mut restored: Map<String, Value> = original
        .get("metadata")
        .and_then(Value::as_object)
        .cloned()
        .unwrap_or_default();
    for f in ["labels", "annotations"] {
        match answered.get(f) {
            None | Some(Value::Null) => {
                restored.remove(f);
            }
            Some(Value::Object(m)) => {
                for (k, v) in m {
                    if !v.is_string() {
                        return Err(Bad::Meta(format!(
                            "metadata.{f}[{k}] must be a string, but is {} in converted object",
                            json_type(v)
                        )));
                    }
                }
                if restored.get(f) != answered.get(f) {
                    check_map(f, m).map_err(Bad::Meta)?;
                }
                restored.insert(f.into(), Value::Object(m.clone()));
            }
            Some(other) => {
                return Err(Bad::Meta(format!(
                    "invalid metadata.{f} of type {} in converted object",
                    json_type(other)
                )))
            }
        }
    }
    out["metadata"] = Value::Object(restored);
    Ok(out)
}

/// Changed labels or annotations are checked as on any write: label keys
/// and values as Kubernetes' label rules; annotation keys as label keys,
/// with all annotations at most 256 KiB.
fn check_map(field: &str, m: &Map<String, Value>) -> Result<(), String> {
    use skiff_core::selector::{validate_label_key, validate_label_value};
    if field == "labels" {
        for (k, v) in m {
            validate_label_key(k)
                .map_err(|e| format!("metadata.labels: Invalid value: {k:?}: {e}"))?;
            validate_label_value(v.as_str().unwrap_or(""))
                .map_err(|e| format!("metadata.labels: Invalid value: {v}: {e}"))?;
        }
        return Ok(());
    }
    let mut total = 0;
    for (k, v) in m {
        validate_label_key(&k.to_ascii_lowercase())
            .map_err(|e| format!("metadata.annotation: Invalid value: {k:?}: {e}"))?;
        total += k.len() + v.as_str().map(str::len).unwrap_or(0);
    }
    if total > 256 * 1024 {
        return Err("metadata.annotation: Too long: must have at most 262144 bytes".into());
    }
    Ok(())
}

fn json_type(v: &Value) -> &'static str {
    match v {
        Value::Null => "<nil>",
        Value::Bool(_) => "bool",
        Value::Number(_) => "float64",
        Value::String(_) => "string",
        Value::Array(_) => "[]interface {}",
        Value::Object(_) => "map[string]interface {}",
    }
}

/// The review sent: v1 when the definition accepts it, else v1beta1 (the
/// first of `conversionReviewVersions` skiff speaks).
fn review_version(hook: &Value) -> Result<&'static str, String> {
    let versions = hook
        .get("conversionReviewVersions")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    for v in &versions {
        match v.as_str() {
            Some("v1") => return Ok("v1"),
            Some("v1beta1") => return Ok("v1beta1"),
            _ => {}
        }
    }
    Err("no supported conversion review versions".into())
}

async fn call(
    resolver: &dyn ServiceResolver,
    hook: &Value,
    want: &str,
    objects: Vec<Value>,
) -> Result<Vec<Value>, String> {
    let version = review_version(hook)?;
    let client = ClientConfig::from_json(hook.get("clientConfig").unwrap_or(&Value::Null))
        .map_err(|e| e.to_string())?;
    let uid = uuid::Uuid::new_v4().to_string();
    let envelope = format!("apiextensions.k8s.io/{version}");
    let body = json!({
        "apiVersion": envelope,
        "kind": "ConversionReview",
        "request": {"uid": uid, "desiredAPIVersion": want, "objects": objects},
    });
    let answer = outbound::post_json(&client, resolver, &body, TIMEOUT)
        .await
        .map_err(|e| e.to_string())?;
    converted_objects(&answer, &uid, version)
}

/// The converted objects of an answer, after kube-apiserver's checks.
fn converted_objects(answer: &Value, uid: &str, version: &str) -> Result<Vec<Value>, String> {
    if version == "v1" {
        let (av, k) = (api_version_of(answer), kind_of(answer));
        if av != "apiextensions.k8s.io/v1" || k != "ConversionReview" {
            return Err(format!(
                "expected webhook response of apiextensions.k8s.io/v1, Kind=ConversionReview, got {}",
                gvk(av, k)
            ));
        }
    }
    let Some(resp) = answer.get("response").filter(|r| r.is_object()) else {
        return Err("no response provided".into());
    };
    if version == "v1" {
        let got = resp.get("uid").and_then(Value::as_str).unwrap_or("");
        if got != uid {
            return Err(format!("expected response.uid={uid:?}, got {got:?}"));
        }
    }
    let status = resp
        .pointer("/result/status")
        .and_then(Value::as_str)
        .unwrap_or("");
    if status != "Success" {
        let msg = resp
            .pointer("/result/message")
            .and_then(Value::as_str)
            .unwrap_or("");
        if !msg.is_empty() {
            return Err(msg.to_string());
        }
        return Err(format!(
            "response.result.status was '{status}', not 'Success'"
        ));
    }
    Ok(resp
        .get("convertedObjects")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default())
}

/// Whether a serialized object says `"apiVersion":"<want>"` (objects are
/// stored compact, so the bytes tell without decoding).
pub fn has_api_version(b: &[u8], want: &str) -> bool {
    let needle = format!("\"apiVersion\":\"{want}\"");
    b.windows(needle.len()).any(|w| w == needle.as_bytes())
}

/// A serialized object with its apiVersion set to `want`.
pub fn with_api_version(b: &Bytes, want: &str) -> Bytes {
    match serde_json::from_slice::<Value>(b) {
        Ok(mut v) => {
            if let Some(m) = v.as_object_mut() {
                m.insert("apiVersion".into(), json!(want));
            }
            serde_json::to_vec(&v)
                .map(Bytes::from)
                .unwrap_or_else(|_| b.clone())
        }
        Err(_) => b.clone(),
    }
}

/// The served version's view of a custom resource after conversion:
/// unknown fields pruned and its defaults applied (defaulting on read).
fn served_view(res: &'static ResourceInfo, obj: &mut Value) {
    if let Some(s) = res.rules.custom().and_then(|c| c.compiled.as_ref()) {
        s.prune(obj);
        s.apply_defaults(obj);
    }
}

/// A stored object as `res` serves it.
pub async fn from_storage(
    resolver: &dyn ServiceResolver,
    res: &'static ResourceInfo,
    obj: Value,
) -> Result<Value, ApiError> {
    if !uses_webhook(res) {
        let mut out = convert::from_storage(res, obj);
        if res.rules.custom().is_some() {
            if let Some(m) = out.as_object_mut() {
                m.insert("apiVersion".into(), json!(res.api_version()));
            }
        }
        return Ok(out);
    }
    let was = api_version_of(&obj).to_string();
    let mut out = convert_to(resolver, res, vec![obj])
        .await?
        .pop()
        .unwrap_or(Value::Null);
    if was != res.api_version() {
        served_view(res, &mut out);
    } else if let Some(s) = res.rules.custom().and_then(|c| c.compiled.as_ref()) {
        s.apply_defaults(&mut out);
    }
    Ok(out)
}

/// An object sent in `res`'s version, in the storage version: the request
/// version's pruning and defaults first (decode), then conversion.
pub async fn to_storage(
    resolver: &dyn ServiceResolver,
    res: &'static ResourceInfo,
    mut obj: Value,
) -> Result<Value, ApiError> {
    if !uses_webhook(res) {
        return Ok(convert::to_storage(res, obj));
    }
    let storage = convert::storage_resource(res);
    if storage.version == res.version {
        return Ok(obj);
    }
    if let Some(s) = res.rules.custom().and_then(|c| c.compiled.as_ref()) {
        s.prune(&mut obj);
        s.apply_defaults(&mut obj);
    }
    Ok(convert_to(resolver, storage, vec![obj])
        .await?
        .pop()
        .unwrap_or(Value::Null))
}

/// Stored objects (serialized) as `res` serves them; one review for the
/// whole list.
pub async fn list_from_storage(
    resolver: &dyn ServiceResolver,
    res: &'static ResourceInfo,
    items: Vec<Bytes>,
) -> Result<Vec<Bytes>, ApiError> {
    if !uses_webhook(res) {
        if !needed(res) {
            return Ok(items);
        }
        let want = res.api_version();
        if !convert::needed(res) {
            // The storage version asked for: only objects kept at an older
            // storage version change (their apiVersion).
            return Ok(items
                .into_iter()
                .map(|b| {
                    if has_api_version(&b, &want) {
                        b
                    } else {
                        with_api_version(&b, &want)
                    }
                })
                .collect());
        }
        return Ok(items
            .iter()
            .map(|b| {
                let mut v = match serde_json::from_slice::<Value>(b) {
                    Ok(v) => convert::from_storage(res, v),
                    Err(_) => return b.clone(),
                };
                if let Some(m) = v.as_object_mut() {
                    m.insert("apiVersion".into(), json!(want));
                }
                serde_json::to_vec(&v)
                    .map(Bytes::from)
                    .unwrap_or_else(|_| b.clone())
            })
            .collect());
    }
    let want = res.api_version();
    let objs: Vec<Value> = items
        .iter()
        .map(|b| serde_json::from_slice(b).map_err(|e| ApiError::internal(e.to_string())))
        .collect::<Result<_, _>>()?;
    let moved: Vec<bool> = objs.iter().map(|o| api_version_of(o) != want).collect();
    let out = convert_to(resolver, res, objs).await?;
    Ok(out
        .into_iter()
        .zip(moved)
        .map(|(mut o, moved)| {
            if moved {
                served_view(res, &mut o);
            } else if let Some(s) = res.rules.custom().and_then(|c| c.compiled.as_ref()) {
                s.apply_defaults(&mut o);
            }
            Bytes::from(serde_json::to_vec(&o).unwrap_or_default())
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_are_checked_as_kube_apiserver_checks_them() {
        let ok = json!({"apiVersion": "apiextensions.k8s.io/v1", "kind": "ConversionReview",
            "response": {"uid": "u1", "result": {"status": "Success"}, "convertedObjects": [{"a": 1}]}});
        assert_eq!(converted_objects(&ok, "u1", "v1").unwrap().len(), 1);
        assert_eq!(
            converted_objects(&ok, "u2", "v1").unwrap_err(),
            "expected response.uid=\"u2\", got \"u1\""
        );
        let wrong = json!({"apiVersion": "v1", "kind": "Status"});
        assert_eq!(
            converted_objects(&wrong, "u1", "v1").unwrap_err(),
            "expected webhook response of apiextensions.k8s.io/v1, Kind=ConversionReview, got /v1, Kind=Status"
        );
        let failed = json!({"apiVersion": "apiextensions.k8s.io/v1", "kind": "ConversionReview",
            "response": {"uid": "u1", "result": {"status": "Failure", "message": "no way"}}});
        assert_eq!(
            converted_objects(&failed, "u1", "v1").unwrap_err(),
            "no way"
        );
        let bare = json!({"apiVersion": "apiextensions.k8s.io/v1", "kind": "ConversionReview",
            "response": {"uid": "u1", "result": {}}});
        assert_eq!(
            converted_objects(&bare, "u1", "v1").unwrap_err(),
            "response.result.status was '', not 'Success'"
        );
    }

    #[test]
    fn converted_objects_keep_their_identity_and_only_labels_and_annotations_change() {
        let orig = json!({"apiVersion": "example.com/v1", "kind": "Widget",
            "metadata": {"name": "w", "namespace": "ns", "uid": "x", "resourceVersion": "5",
                         "labels": {"a": "1"}, "finalizers": ["f"]},
            "spec": {"size": 3}});
        let out = json!({"apiVersion": "example.com/v2", "kind": "Widget",
            "metadata": {"name": "w", "namespace": "ns", "uid": "x", "resourceVersion": "99",
                         "labels": {"a": "2"}, "annotations": {"n": "m"}},
            "spec": {"dimensions": {"size": 3}}});
        let got = match check_converted(&orig, out.clone(), "example.com/v2") {
            Ok(v) => v,
            Err(_) => panic!("a good answer is taken"),
        };
        assert_eq!(got["metadata"]["resourceVersion"], "5");
        assert_eq!(got["metadata"]["finalizers"], json!(["f"]));
        assert_eq!(got["metadata"]["labels"], json!({"a": "2"}));
        assert_eq!(got["metadata"]["annotations"], json!({"n": "m"}));
        assert_eq!(got["spec"]["dimensions"]["size"], 3);

        let mut renamed = out.clone();
        renamed["metadata"]["name"] = json!("other");
        match check_converted(&orig, renamed, "example.com/v2") {
            Err(Bad::Object(e)) => assert_eq!(e, "must have the same name: w != other"),
            _ => panic!("a renamed object is refused"),
        }
        match check_converted(&orig, out.clone(), "example.com/v3") {
            Err(Bad::Object(e)) => assert_eq!(
                e,
                "invalid groupVersion (expected example.com/v3, received example.com/v2)"
            ),
            _ => panic!("the wrong version is refused"),
        }
        let mut bad_key = out.clone();
        bad_key["metadata"]["labels"] = json!({"-no-": "x"});
        match check_converted(&orig, bad_key, "example.com/v2") {
            Err(Bad::Meta(e)) => assert!(
                e.starts_with("metadata.labels: Invalid value: \"-no-\""),
                "{e}"
            ),
            _ => panic!("an invalid label key is refused"),
        }
        let mut bad_label = out;
        bad_label["metadata"]["labels"] = json!({"a": 1});
        match check_converted(&orig, bad_label, "example.com/v2") {
            Err(Bad::Meta(e)) => assert_eq!(
                e,
                "metadata.labels[a] must be a string, but is float64 in converted object"
            ),
            _ => panic!("a non-string label is refused"),
        }
    }
}
