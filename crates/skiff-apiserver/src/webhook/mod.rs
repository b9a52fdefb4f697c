//! Dynamic admission: MutatingWebhookConfigurations and
//! ValidatingWebhookConfigurations (`admissionregistration.k8s.io/v1`).
//!
//! Three plugins of the admission chain ([`crate::admission::CHAIN`]):
//! [`MutatingAdmissionWebhook`] after the built-in mutating plugins,
//! [`ValidatingAdmissionPolicy`] and [`ValidatingAdmissionWebhook`] after
//! validation, at Kubernetes' points of its create, update and delete
//! pipelines; they read through [`AdmissionCtx`], never the registry.
//! Configurations come from the watch cache, parsed once per version ([`config`]); which webhooks apply is
//! [`rules`]; each call is an AdmissionReview v1 over HTTPS
//! ([`crate::outbound`], [`review`]). Mutating webhooks run one after the
//! other in order of configuration name then webhook order, with one
//! reinvocation round for `reinvocationPolicy: IfNeeded`; validating ones
//! run in parallel.
//!
//! ValidatingAdmissionPolicies ([`policy`]) run at the validating point
//! too, before the validating webhooks.
//!
//! Never applied, as in Kubernetes: to the admissionregistration resources
//! themselves (a broken webhook could otherwise never be removed), nor to
//! the server's own writes (no user), nor, so node heartbeats never wait
//! on a webhook, to Leases in `kube-node-lease`. A slow webhook costs at
//! most its timeout.

pub mod config;
pub mod policy;
pub mod review;
pub mod rules;

use serde_json::{json, Value};
use skiff_core::resources::{ResourceInfo, RESOURCES};
use skiff_core::{ApiError, ApiResult};

use crate::auth::Identity;
use crate::options::{DeleteOptions, WriteOptions};
use async_trait::async_trait;

use crate::admission::context::AdmissionCtx;
use crate::admission::plugin::{self as admission, AdmissionPlugin, Options};
pub use rules::Operation;

pub use crate::options::Admission;

/// One admission request, as the webhooks see it.
#[derive(Debug, Clone)]
pub struct Attributes<'a> {
    /// The resource as stored (its served versions are its equivalents).
    pub res: &'static ResourceInfo,
    /// The resource at the version the client asked for.
    pub request_res: &'static ResourceInfo,
    pub sub: &'a str,
    pub op: Operation,
    pub namespace: &'a str,
    pub name: &'a str,
    pub user: &'a Identity,
    pub dry_run: bool,
    /// CreateOptions, UpdateOptions or DeleteOptions.
    pub options: Value,
    /// The kind of the objects when it is not the resource's own (a
    /// subresource's: autoscaling/v1 Scale).
    pub kind: Option<(&'static str, &'static str, &'static str)>,
    pub admission: &'a Admission,
}

/// Whether no webhook may ever apply to writes of `res` in `ns`.
pub fn exempt(res: &ResourceInfo, ns: &str) -> bool {
    res.group == "admissionregistration.k8s.io"
        || res.is_review()
        || (res.storage == "coordination.k8s.io/leases" && ns == "kube-node-lease")
}

/// The versions a webhook with `matchPolicy: Equivalent` may match for
/// `res`: `res` first, then the other versions served from its storage.
pub fn equivalents(res: &'static ResourceInfo) -> impl Iterator<Item = &'static ResourceInfo> {
    std::iter::once(res).chain(
        RESOURCES
            .iter()
            .filter(move |r| r.storage == res.storage && *r != res),
    )
}

fn options(kind: &str, opts: &WriteOptions, dry_run: bool) -> Value {
    let mut o = json!({"kind": kind, "apiVersion": "meta.k8s.io/v1"});
    if dry_run {
        o["dryRun"] = json!(["All"]);
    }
    if !opts.field_manager.is_empty() {
        o["fieldManager"] = json!(opts.field_manager);
    }
    o
}

fn ns_name(obj: &Value) -> (&str, &str) {
    // (Every write passes here: no path string is built.)
    let m = |k: &str| {
        obj.get("metadata")
            .and_then(|m| m.get(k))
            .and_then(Value::as_str)
            .unwrap_or("")
    };
    (m("namespace"), m("name"))
}

/// What webhooks and policies see of a create or update of the object
/// named `ns`/`name`; None when there is nothing to admit (a write by the
/// server itself, a scale update admitted already, an exempt resource).
fn write_attributes<'a>(
    res: &'static ResourceInfo,
    op: Operation,
    sub: &'a str,
    (ns, name): (&'a str, &'a str),
    opts: &'a WriteOptions,
) -> Option<Attributes<'a>> {
    let (user, dry_run, options_kind) = match op {
        Operation::Create => (
            opts.user.as_ref()?,
            opts.admission.dry_run.unwrap_or(opts.dry_run),
            "CreateOptions",
        ),
        _ => (
            opts.user.as_ref().filter(|_| !opts.admission.done)?,
            opts.dry_run,
            "UpdateOptions",
        ),
    };
    if exempt(res, ns) {
        return None;
    }
    Some(Attributes {
        res,
        request_res: opts.admission.request.unwrap_or(res),
        sub,
        op,
        namespace: ns,
        name,
        user,
        dry_run,
        options: options(options_kind, opts, dry_run),
        kind: None,
        admission: &opts.admission,
    })
}

/// MutatingAdmissionWebhook: the mutating webhooks (after the built-in
/// mutating plugins), on creates and updates.
pub struct MutatingAdmissionWebhook;

#[async_trait]
impl AdmissionPlugin for MutatingAdmissionWebhook {
    fn name(&self) -> &'static str {
        "MutatingAdmissionWebhook"
    }

    fn handles(&self, a: &admission::Attributes<'_>) -> bool {
        matches!(a.options, Options::Write(_))
            && matches!(a.op, Operation::Create | Operation::Update)
    }

    async fn mutate(
        &self,
        cx: &dyn AdmissionCtx,
        a: &admission::Attributes<'_>,
        obj: &mut Value,
    ) -> ApiResult<()> {
        let Options::Write(opts) = a.options else {
            return Ok(());
        };
        let sub = a.sub.as_str().unwrap_or("");
        let old = a.old;
        // Owned: the object changes under the webhooks.
        let (ns, name) = ns_name(old.unwrap_or(obj));
        let (ns, name) = (ns.to_string(), name.to_string());
        let Some(w) = write_attributes(a.res, a.op, sub, (&ns, &name), opts) else {
            return Ok(());
        };
        review::mutate(cx, &w, obj, old).await
    }
}

/// The attributes policies and validating webhooks see, if any.
fn validating_attributes<'a>(
    a: &admission::Attributes<'a>,
    obj: Option<&'a Value>,
) -> Option<Attributes<'a>> {
    let sub = a.sub.as_str().unwrap_or("");
    match a.options {
        Options::Write(opts) => {
            let named = a.old.or(obj)?;
            write_attributes(a.res, a.op, sub, ns_name(named), opts)
        }
        Options::Delete(opts) => {
            let user = opts.user.as_ref()?;
            let (ns, name) = ns_name(a.old?);
            if exempt(a.res, ns) {
                return None;
            }
            Some(delete_attributes(a.res, ns, name, user, opts))
        }
    }
}

/// ValidatingAdmissionPolicy: the policies bound to the request, on
/// creates, updates and deletes.
pub struct ValidatingAdmissionPolicy;

#[async_trait]
impl AdmissionPlugin for ValidatingAdmissionPolicy {
    fn name(&self) -> &'static str {
        "ValidatingAdmissionPolicy"
    }

    fn handles(&self, a: &admission::Attributes<'_>) -> bool {
        a.user().is_some()
    }

    async fn validate(
        &self,
        cx: &dyn AdmissionCtx,
        a: &admission::Attributes<'_>,
        obj: Option<&Value>,
    ) -> ApiResult<()> {
        match validating_attributes(a, obj) {
            Some(w) => policy::validate(cx, &w, obj, a.old).await,
            None => Ok(()),
        }
    }
}

/// ValidatingAdmissionWebhook: the validating webhooks (in parallel), on
/// creates, updates and deletes.
pub struct ValidatingAdmissionWebhook;

#[async_trait]
impl AdmissionPlugin for ValidatingAdmissionWebhook {
    fn name(&self) -> &'static str {
        "ValidatingAdmissionWebhook"
    }

    fn handles(&self, a: &admission::Attributes<'_>) -> bool {
        a.user().is_some()
    }

    async fn validate(
        &self,
        cx: &dyn AdmissionCtx,
        a: &admission::Attributes<'_>,
        obj: Option<&Value>,
    ) -> ApiResult<()> {
        match validating_attributes(a, obj) {
            Some(w) => review::validate(cx, &w, obj, a.old).await,
            None => Ok(()),
        }
    }
}

/// Mutating then validating admission of a `scale` update, on the Scale
/// objects as Kubernetes admits them (resource the object's, subresource
/// `scale`, kind autoscaling/v1 Scale). Returns the options for the
/// object's own update, which then skips dynamic admission.
pub async fn admit_scale(
    cx: &dyn AdmissionCtx,
    res: &'static ResourceInfo,
    old: &Value,
    old_scale: &Value,
    scale: &mut Value,
    opts: &WriteOptions,
) -> ApiResult<WriteOptions> {
    let mut inner = opts.clone();
    inner.admission.done = true;
    let Some(user) = opts.user.as_ref() else {
        return Ok(inner);
    };
    let (ns, name) = ns_name(old);
    if exempt(res, ns) {
        return Ok(inner);
    }
    let a = Attributes {
        res,
        request_res: opts.admission.request.unwrap_or(res),
        sub: "scale",
        op: Operation::Update,
        namespace: ns,
        name,
        user,
        dry_run: opts.dry_run,
        options: options("UpdateOptions", opts, opts.dry_run),
        kind: Some(("autoscaling", "v1", "Scale")),
        admission: &opts.admission,
    };
    review::mutate(cx, &a, scale, Some(old_scale)).await?;
    policy::validate(cx, &a, Some(scale), Some(old_scale)).await?;
    review::validate(cx, &a, Some(scale), Some(old_scale)).await?;
    Ok(inner)
}

/// The options object of a CONNECT to a pod subresource, from the query
/// (PodExecOptions, PodAttachOptions, PodPortForwardOptions).
pub fn connect_options(sub: &str, query: Option<&str>) -> Option<(&'static str, Value)> {
    let kind = match sub {
        "exec" => "PodExecOptions",
        "attach" => "PodAttachOptions",
        "portforward" => "PodPortForwardOptions",
        _ => return None,
    };
    let mut o = json!({"kind": kind, "apiVersion": "v1"});
    let mut command = Vec::new();
    let mut ports = Vec::new();
    for pair in query.unwrap_or("").split('&').filter(|p| !p.is_empty()) {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        let v = percent_decode(v);
        match k {
            "command" => command.push(json!(v)),
            "ports" => {
                if let Ok(p) = v.parse::<u16>() {
                    ports.push(json!(p));
                }
            }
            "container" => o["container"] = json!(v),
            "stdin" | "stdout" | "stderr" | "tty" => o[k] = json!(v == "true" || v == "1"),
            _ => {}
        }
    }
    if !command.is_empty() {
        o["command"] = Value::Array(command);
    }
    if !ports.is_empty() {
        o["ports"] = Value::Array(ports);
    }
    Some((kind, o))
}

fn percent_decode(s: &str) -> String {
    let b = s.as_bytes();
    let hex = |c: u8| (c as char).to_digit(16).map(|d| d as u8);
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' && i + 2 < b.len() {
            if let (Some(h), Some(l)) = (hex(b[i + 1]), hex(b[i + 2])) {
                out.push(h * 16 + l);
                i += 3;
                continue;
            }
        }
        out.push(if b[i] == b'+' { b' ' } else { b[i] });
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Admission of a CONNECT to `pods/exec|attach|portforward`: mutating
/// webhooks are called (their patches do not apply to a connection),
/// then policies and validating webhooks, with the options object.
pub async fn admit_connect(
    cx: &dyn AdmissionCtx,
    namespace: &str,
    pod: &str,
    sub: &str,
    query: Option<&str>,
    user: Option<&Identity>,
) -> ApiResult<()> {
    let (Some(user), Some((kind, mut object))) = (user, connect_options(sub, query)) else {
        return Ok(());
    };
    let res = skiff_core::resources::lookup("", "v1", "pods").expect("pods");
    let admission = Admission::default();
    let a = Attributes {
        res,
        request_res: res,
        sub,
        op: Operation::Connect,
        namespace,
        name: pod,
        user,
        dry_run: false,
        options: Value::Null,
        kind: Some(("", "v1", kind)),
        admission: &admission,
    };
    let before = object.clone();
    review::mutate(cx, &a, &mut object, None).await?;
    let object = before;
    policy::validate(cx, &a, Some(&object), None).await?;
    review::validate(cx, &a, Some(&object), None).await
}

/// The DeleteOptions object a delete's admission request carries.
fn delete_options_object(opts: &DeleteOptions) -> Value {
    let mut o = json!({"kind": "DeleteOptions", "apiVersion": "meta.k8s.io/v1"});
    if opts.dry_run {
        o["dryRun"] = json!(["All"]);
    }
    if let Some(g) = opts.grace_period_seconds {
        o["gracePeriodSeconds"] = json!(g);
    }
    if let Some(p) = &opts.propagation_policy {
        o["propagationPolicy"] = json!(p);
    }
    o
}

fn delete_attributes<'a>(
    res: &'static ResourceInfo,
    ns: &'a str,
    name: &'a str,
    user: &'a Identity,
    opts: &'a DeleteOptions,
) -> Attributes<'a> {
    Attributes {
        res,
        request_res: opts.admission.request.unwrap_or(res),
        sub: "",
        op: Operation::Delete,
        namespace: ns,
        name,
        user,
        dry_run: opts.dry_run,
        options: delete_options_object(opts),
        kind: None,
        admission: &opts.admission,
    }
}

/// Mutating webhooks for a DELETE of `name` (`""` for a collection), as
/// kube-apiserver's handler calls them before it reads anything: with
/// neither object nor oldObject. They may deny; there is nothing to patch.
pub async fn admit_delete(
    cx: &dyn AdmissionCtx,
    res: &'static ResourceInfo,
    ns: Option<&str>,
    name: &str,
    opts: &DeleteOptions,
) -> ApiResult<()> {
    let Some(user) = opts.user.as_ref() else {
        return Ok(());
    };
    let ns = ns.unwrap_or("");
    if exempt(res, ns) {
        return Ok(());
    }
    review::mutate_delete(cx, &delete_attributes(res, ns, name, user, opts)).await
}

/// The 400 a dry-run request gets from a webhook with side effects.
fn no_dry_run(name: &str) -> ApiError {
    ApiError::bad_request(format!(
        "admission webhook {name:?} does not support dry run"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exec_options_come_from_the_query() {
        let (kind, o) = connect_options(
            "exec",
            Some("command=ls&command=-l%20a&container=c&stdout=true&tty=false"),
        )
        .unwrap();
        assert_eq!(kind, "PodExecOptions");
        assert_eq!(o["command"], json!(["ls", "-l a"]));
        assert_eq!(o["container"], "c");
        assert_eq!(o["stdout"], json!(true));
        assert_eq!(o["tty"], json!(false));
        assert!(connect_options("log", None).is_none());
        // Bytes that are not a valid escape stay as they are.
        assert_eq!(percent_decode("%zz%e2%82%ac%"), "%zz\u{20ac}%");
        assert_eq!(percent_decode("é%4"), "é%4");
    }
}
