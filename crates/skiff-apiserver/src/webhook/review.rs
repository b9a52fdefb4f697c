//! Calling webhooks: which ones apply to a request, the AdmissionReview v1
//! request exactly as kube-apiserver sends it, and what their answers mean
//! (allowed, status, JSONPatch, warnings, audit annotations), with
//! failurePolicy deciding what a failed call means.

use std::sync::Arc;

use base64::Engine;
use serde_json::{json, Map, Value};
use skiff_core::resources::ResourceInfo;
use skiff_core::{ApiError, ApiResult};

use super::config::{webhooks, Webhook};
use super::{equivalents, no_dry_run, rules, Attributes};
use crate::admission::context::AdmissionCtx;

/// Why a call did not produce an answer (subject to failurePolicy).
#[derive(Debug)]
struct CallError(String);

/// What one webhook answered.
#[derive(Debug)]
pub struct Answer {
    pub allowed: bool,
    pub status: Option<Value>,
    pub patch: Option<Value>,
    pub warnings: Vec<String>,
    pub audit_annotations: Map<String, Value>,
}

/// The namespace labels a namespaceSelector is matched against: the
/// object's own for a Namespace, the namespace's for namespaced objects,
/// `None` (always matches) for other cluster-scoped objects.
fn namespace_labels(
    cx: &dyn AdmissionCtx,
    a: &Attributes<'_>,
    obj: Option<&Value>,
    old: Option<&Value>,
) -> Option<Map<String, Value>> {
    if a.res.storage == "/namespaces" {
        return Some(rules::labels(obj.or(old)));
    }
    if !a.res.namespaced {
        return None;
    }
    let ns_res = skiff_core::resources::lookup("", "v1", "namespaces").expect("namespaces");
    let labels = cx
        .cache()
        .resource(ns_res)
        .get(&crate::object::object_key(ns_res, None, a.namespace))
        .map(|o| o.labels.clone())
        .unwrap_or_default();
    Some(labels)
}

/// The version of the request's resource `h` applies to, if any.
fn matched_version(h: &Webhook, a: &Attributes<'_>) -> Option<&'static ResourceInfo> {
    let namespaced = !a.namespace.is_empty();
    let hit = |r: &ResourceInfo| {
        h.rules
            .iter()
            .any(|rule| rule.matches(a.op, r.group, r.version, r.plural, a.sub, namespaced))
    };
    if hit(a.request_res) {
        Some(a.request_res)
    } else if h.equivalent {
        equivalents(a.res).find(|r| hit(r))
    } else {
        None
    }
}

/// Whether `h` applies, and at which version; an error when its selectors
/// cannot be evaluated (a call failure for failurePolicy).
fn applies(
    h: &Webhook,
    a: &Attributes<'_>,
    ns_labels: &Option<Map<String, Value>>,
    obj: Option<&Value>,
    old: Option<&Value>,
) -> Result<Option<&'static ResourceInfo>, CallError> {
    let Some(version) = matched_version(h, a) else {
        return Ok(None);
    };
    let ns_sel = h
        .namespace_selector
        .as_ref()
        .map_err(|e| CallError(e.clone()))?;
    if let (Some(sel), Some(labels)) = (ns_sel, ns_labels) {
        if !sel.matches(labels) {
            return Ok(None);
        }
    }
    let obj_sel = h
        .object_selector
        .as_ref()
        .map_err(|e| CallError(e.clone()))?;
    if !rules::object_matches(obj_sel, obj, old) {
        return Ok(None);
    }
    if !h.match_conditions.is_empty() {
        let req = request(a, version, "v1", "", Value::Null, Value::Null)["request"].clone();
        let none = Value::Null;
        let vars = [
            ("object", obj.unwrap_or(&none)),
            ("oldObject", old.unwrap_or(&none)),
            ("request", &req),
        ];
        if !rules::conditions_hold(&h.match_conditions, &vars).map_err(CallError)? {
            return Ok(None);
        }
    }
    Ok(Some(version))
}

fn group_version_kind(r: &ResourceInfo) -> Value {
    json!({"group": r.group, "version": r.version, "kind": r.kind})
}

fn group_version_resource(r: &ResourceInfo) -> Value {
    json!({"group": r.group, "version": r.version, "resource": r.plural})
}

/// An object of the request as the webhook or policy matched at
/// `version` sees it: in that version (a custom resource whose definition
/// converts by webhook through its conversion webhook), `null` for none.
pub async fn in_version(
    cx: &dyn AdmissionCtx,
    a: &Attributes<'_>,
    version: &'static ResourceInfo,
    v: Option<&Value>,
) -> ApiResult<Value> {
    Ok(match (v, a.kind) {
        (Some(v), None) if crate::crd::conversion::uses_webhook(version) => {
            crate::crd::conversion::from_storage(cx.resolver(), version, v.clone()).await?
        }
        (Some(v), None) => skiff_core::convert::from_storage(version, v.clone()),
        (Some(v), Some(_)) => v.clone(),
        (None, _) => Value::Null,
    })
}

/// The AdmissionReview sent to a webhook matched at `version`; `object`
/// and `old_object` already [`in_version`].
pub fn request(
    a: &Attributes<'_>,
    version: &'static ResourceInfo,
    review_version: &str,
    uid: &str,
    object: Value,
    old_object: Value,
) -> Value {
    let mut user = json!({"username": a.user.user, "groups": a.user.groups});
    if let Some(uid) = &a.user.uid {
        user["uid"] = json!(uid);
    }
    if !a.user.extra.is_empty() {
        user["extra"] = json!(a.user.extra);
    }
    let kind = match a.kind {
        Some((group, version, kind)) => json!({"group": group, "version": version, "kind": kind}),
        None => group_version_kind(version),
    };
    let request_kind = match a.kind {
        Some(_) => kind.clone(),
        None => group_version_kind(a.request_res),
    };
    let mut req = json!({
        "uid": uid,
        "kind": kind,
        "resource": group_version_resource(version),
        "requestKind": request_kind,
        "requestResource": group_version_resource(a.request_res),
        "name": a.name,
        "operation": a.op.as_str(),
        "userInfo": user,
        "object": object,
        "oldObject": old_object,
        "dryRun": a.dry_run,
        "options": a.options,
    });
    if !a.sub.is_empty() {
        req["subResource"] = json!(a.sub);
        req["requestSubResource"] = json!(a.sub);
    }
    if !a.namespace.is_empty() {
        req["namespace"] = json!(a.namespace);
    }
    json!({
        "apiVersion": format!("admission.k8s.io/{review_version}"),
        "kind": "AdmissionReview",
        "request": req,
    })
}

/// Reads a webhook's AdmissionReview answer to the request `uid`.
pub fn answer(v: &Value, uid: &str, review_version: &str) -> Result<Answer, String> {
    let want = format!("admission.k8s.io/{review_version}");
    let api_version = v.get("apiVersion").and_then(Value::as_str).unwrap_or("");
    let kind = v.get("kind").and_then(Value::as_str).unwrap_or("");
    if api_version != want || kind != "AdmissionReview" {
        return Err(format!(
            "expected webhook response of {want}, Kind=AdmissionReview, got {api_version}, Kind={kind}"
        ));
    }
    let Some(r) = v.get("response").filter(|r| r.is_object()) else {
        return Err("webhook response was absent".into());
    };
    let got = r.get("uid").and_then(Value::as_str).unwrap_or("");
    if got != uid {
        return Err(format!("expected response.uid={uid:?}, got {got:?}"));
    }
    let patch = match r.get("patch").and_then(Value::as_str) {
        None | Some("") => None,
        Some(p) => {
            match r.get("patchType").and_then(Value::as_str) {
                Some("JSONPatch") => {}
                other => return Err(format!("unsupported patch type {:?}", other.unwrap_or(""))),
            }
            let bytes = base64::engine::general_purpose::STANDARD
                .decode(p)
                .map_err(|e| format!("patch is not base64: {e}"))?;
            Some(serde_json::from_slice(&bytes).map_err(|e| format!("patch is not JSON: {e}"))?)
        }
    };
    Ok(Answer {
        allowed: r.get("allowed").and_then(Value::as_bool).unwrap_or(false),
        status: r.get("status").filter(|s| s.is_object()).cloned(),
        patch,
        warnings: r
            .get("warnings")
            .and_then(Value::as_array)
            .map(|a| {
                a.iter()
                    .filter_map(Value::as_str)
                    .map(str::to_string)
                    .collect()
            })
            .unwrap_or_default(),
        audit_annotations: r
            .get("auditAnnotations")
            .and_then(Value::as_object)
            .cloned()
            .unwrap_or_default(),
    })
}

/// The error a denial becomes (Kubernetes' `webhookerrors.ToStatusErr`).
pub fn denied(name: &str, status: Option<&Value>) -> ApiError {
    let s = |k: &str| {
        status
            .and_then(|st| st.get(k))
            .and_then(Value::as_str)
            .unwrap_or("")
    };
    let code = status
        .and_then(|st| st.get("code"))
        .and_then(Value::as_u64)
        .map(|c| c as u16)
        .filter(|c| *c >= 400 && *c < 600)
        .unwrap_or(400);
    let denied_by = format!("admission webhook {name:?} denied the request");
    let message = match (s("message"), s("reason")) {
        (m, _) if !m.is_empty() => format!("{denied_by}: {m}"),
        (_, r) if !r.is_empty() => format!("{denied_by}: {r}"),
        _ => format!("{denied_by} without explanation"),
    };
    let mut e = ApiError::new(code, s("reason"), message);
    if let Some(causes) = status
        .and_then(|st| st.pointer("/details/causes"))
        .and_then(Value::as_array)
    {
        e.causes = causes
            .iter()
            .map(|c| skiff_core::Cause {
                reason: c.get("reason").and_then(Value::as_str).unwrap_or("").into(),
                message: c
                    .get("message")
                    .and_then(Value::as_str)
                    .unwrap_or("")
                    .into(),
                field: c.get("field").and_then(Value::as_str).unwrap_or("").into(),
            })
            .collect();
    }
    e
}

/// Calls one webhook with the objects [`in_version`]. `Err(CallError)` is
/// subject to failurePolicy.
async fn call(
    cx: &dyn AdmissionCtx,
    h: &Webhook,
    a: &Attributes<'_>,
    version: &'static ResourceInfo,
    object: Value,
    old_object: Value,
) -> Result<Answer, CallError> {
    let client = h.client.as_ref().map_err(|e| CallError(e.clone()))?;
    let uid = uuid::Uuid::new_v4().to_string();
    let body = request(a, version, h.review_version, &uid, object, old_object);
    let out = crate::outbound::post_json(client, cx.resolver(), &body, h.timeout)
        .await
        .map_err(|e| CallError(format!("failed to call webhook: {e}")))?;
    answer(&out, &uid, h.review_version)
        .map_err(|e| CallError(format!("received invalid webhook response: {e}")))
}

/// What a failed call means: an error under failurePolicy Fail, nothing
/// under Ignore.
fn failed(h: &Webhook, e: CallError) -> ApiResult<()> {
    let message = format!("failed calling webhook {:?}: {}", h.name, e.0);
    if h.fail {
        return Err(ApiError::internal(message));
    }
    tracing::warn!(webhook = %h.name, error = %e.0, "webhook failed open (failurePolicy Ignore)");
    Ok(())
}

fn record(a: &Attributes<'_>, h: &Webhook, ans: &Answer) {
    for w in &ans.warnings {
        a.admission.warn(w.clone());
    }
    for (k, v) in &ans.audit_annotations {
        a.admission.annotate(
            format!("{}/{k}", h.name),
            v.as_str()
                .map(str::to_string)
                .unwrap_or_else(|| v.to_string()),
        );
    }
}

/// Runs the mutating webhooks on `obj` in order, then once more those with
/// reinvocationPolicy IfNeeded that ran before a later webhook changed it.
pub async fn mutate(
    cx: &dyn AdmissionCtx,
    a: &Attributes<'_>,
    obj: &mut Value,
    old: Option<&Value>,
) -> ApiResult<()> {
    let hooks = webhooks(cx, true);
    if hooks.is_empty() {
        return Ok(());
    }
    let ns_labels = namespace_labels(cx, a, Some(obj), old);
    let mut last_change: Option<usize> = None;
    let mut called: Vec<usize> = Vec::new();
    for (i, h) in hooks.iter().enumerate() {
        if let Some(changed) = mutate_one(cx, a, h, obj, old, &ns_labels).await? {
            called.push(i);
            if changed {
                last_change = Some(i);
            }
        }
    }
    let Some(last) = last_change else {
        return Ok(());
    };
    for i in called {
        if i < last && hooks[i].reinvoke {
            mutate_one(cx, a, &hooks[i], obj, old, &ns_labels).await?;
        }
    }
    Ok(())
}

/// The version `h` is called at for this request: `None` when it does not
/// apply (or could not be matched under failurePolicy Ignore); a dry run
/// it cannot take is refused.
fn called_at(
    h: &Webhook,
    a: &Attributes<'_>,
    ns_labels: &Option<Map<String, Value>>,
    obj: Option<&Value>,
    old: Option<&Value>,
) -> ApiResult<Option<&'static ResourceInfo>> {
    let version = match applies(h, a, ns_labels, obj, old) {
        Ok(Some(v)) => v,
        Ok(None) => return Ok(None),
        Err(e) => return failed(h, e).map(|_| None),
    };
    if a.dry_run && !h.dry_run_safe {
        return Err(no_dry_run(&h.name));
    }
    Ok(Some(version))
}

/// The mutating webhooks of a DELETE (no object, no oldObject): called in
/// order, each may deny; a patch has nothing to apply to.
pub async fn mutate_delete(cx: &dyn AdmissionCtx, a: &Attributes<'_>) -> ApiResult<()> {
    let hooks = webhooks(cx, true);
    if hooks.is_empty() {
        return Ok(());
    }
    let ns_labels = namespace_labels(cx, a, None, None);
    for h in hooks.iter() {
        let Some(version) = called_at(h, a, &ns_labels, None, None)? else {
            continue;
        };
        let ans = match call(cx, h, a, version, Value::Null, Value::Null).await {
            Ok(ans) => ans,
            Err(e) => {
                failed(h, e)?;
                continue;
            }
        };
        record(a, h, &ans);
        if !ans.allowed {
            return Err(denied(&h.name, ans.status.as_ref()));
        }
    }
    Ok(())
}

/// Calls one mutating webhook if it applies: `None` when it does not,
/// else whether it changed the object.
async fn mutate_one(
    cx: &dyn AdmissionCtx,
    a: &Attributes<'_>,
    h: &Arc<Webhook>,
    obj: &mut Value,
    old: Option<&Value>,
    ns_labels: &Option<Map<String, Value>>,
) -> ApiResult<Option<bool>> {
    let Some(version) = called_at(h, a, ns_labels, Some(obj), old)? else {
        return Ok(None);
    };
    // Conversion failing is the request's error, whatever the policy.
    let view = in_version(cx, a, version, Some(obj)).await?;
    let old_view = in_version(cx, a, version, old).await?;
    let ans = match call(cx, h, a, version, view.clone(), old_view).await {
        Ok(ans) => ans,
        Err(e) => return failed(h, e).map(|_| Some(false)),
    };
    record(a, h, &ans);
    if !ans.allowed {
        return Err(denied(&h.name, ans.status.as_ref()));
    }
    let Some(patch) = ans.patch else {
        return Ok(Some(false));
    };
    let own_kind = a.kind.is_none();
    let patched = skiff_core::patch::apply_json_patch(&view, &patch).map_err(|e| {
        ApiError::internal(format!(
            "failed calling webhook {:?}: the patch could not be applied: {}",
            h.name, e.message
        ))
    })?;
    let mut patched = if own_kind && crate::crd::conversion::uses_webhook(version) {
        crate::crd::conversion::to_storage(cx.resolver(), version, patched).await?
    } else if own_kind {
        skiff_core::convert::to_storage(version, patched)
    } else {
        patched
    };
    // What the server owns stays as it was.
    for k in ["uid", "namespace", "creationTimestamp", "resourceVersion"] {
        let before = obj.pointer(&format!("/metadata/{k}")).cloned();
        if let Some(m) = patched.get_mut("metadata").and_then(Value::as_object_mut) {
            match before {
                Some(v) => {
                    m.insert(k.into(), v);
                }
                None => {
                    m.remove(k);
                }
            }
        }
    }
    if own_kind {
        skiff_core::defaults::apply_defaults(a.res, &mut patched);
    }
    if patched == *obj {
        return Ok(Some(false));
    }
    *obj = patched;
    Ok(Some(true))
}

/// Runs the validating webhooks that apply, in parallel; the first denial
/// or failure (in webhook order) is the request's error.
pub async fn validate(
    cx: &dyn AdmissionCtx,
    a: &Attributes<'_>,
    obj: Option<&Value>,
    old: Option<&Value>,
) -> ApiResult<()> {
    let hooks = webhooks(cx, false);
    if hooks.is_empty() {
        return Ok(());
    }
    let ns_labels = namespace_labels(cx, a, obj, old);
    let mut calls = Vec::new();
    for h in &hooks {
        let Some(version) = called_at(h, a, &ns_labels, obj, old)? else {
            continue;
        };
        calls.push(async move {
            let view = in_version(cx, a, version, obj).await?;
            let old_view = in_version(cx, a, version, old).await?;
            match call(cx, h, a, version, view, old_view).await {
                Ok(ans) => {
                    record(a, h, &ans);
                    if ans.allowed {
                        Ok(())
                    } else {
                        Err(denied(&h.name, ans.status.as_ref()))
                    }
                }
                Err(e) => failed(h, e),
            }
        });
    }
    for r in futures::future::join_all(calls).await {
        r?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn denials_read_as_kubernetes_words_them() {
        let e = denied(
            "deny.example.com",
            Some(&json!({"code": 403, "message": "no pods named bad"})),
        );
        assert_eq!(e.code, 403);
        assert_eq!(
            e.message,
            "admission webhook \"deny.example.com\" denied the request: no pods named bad"
        );
        let e = denied("deny.example.com", None);
        assert_eq!(e.code, 400);
        assert!(e
            .message
            .ends_with("denied the request without explanation"));
        let e = denied(
            "deny.example.com",
            Some(&json!({"code": 200, "reason": "Nope"})),
        );
        assert_eq!((e.code, e.message.ends_with(": Nope")), (400, true));
    }

    #[test]
    fn answers_must_be_admission_reviews_for_the_request() {
        let ok = json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
            "response": {"uid": "u1", "allowed": true, "patchType": "JSONPatch",
                "patch": base64::engine::general_purpose::STANDARD.encode(r#"[{"op":"add","path":"/x","value":1}]"#),
                "warnings": ["careful"]}});
        let a = answer(&ok, "u1", "v1").unwrap();
        assert!(a.allowed);
        assert_eq!(a.patch.unwrap()[0]["op"], "add");
        assert_eq!(a.warnings, ["careful"]);
        assert!(answer(&ok, "u2", "v1")
            .unwrap_err()
            .contains("expected response.uid"));
        let wrong = json!({"apiVersion": "v1", "kind": "Status"});
        assert!(answer(&wrong, "u1", "v1").is_err());
        let absent = json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview"});
        assert_eq!(
            answer(&absent, "u1", "v1").unwrap_err(),
            "webhook response was absent"
        );
    }
}
