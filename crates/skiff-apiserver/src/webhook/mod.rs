//! Dynamic admission: MutatingWebhookConfigurations and
//! ValidatingWebhookConfigurations (`admissionregistration.k8s.io/v1`).
//!
//! The registry calls [`mutate`] after the built-in mutating admission and
//! [`validate`] after validation, at Kubernetes' points of its create,
//! update and delete pipelines. Configurations come from the watch cache,
//! parsed once per version ([`config`]); which webhooks apply is
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

use std::sync::{Arc, Mutex};

use serde_json::{json, Value};
use skiff_core::resources::{ResourceInfo, RESOURCES};
use skiff_core::{ApiError, ApiResult};

use crate::auth::Identity;
use crate::registry::{DeleteOptions, Registry, WriteOptions};
pub use rules::Operation;

/// What admission hands back to the request beyond its result: warnings
/// (sent as `Warning` headers) and audit annotations. Shared by the clones
/// of a request's options.
#[derive(Debug, Clone, Default)]
pub struct Admission {
    out: Arc<Mutex<Output>>,
    /// The request's own dryRun when the registry runs a step as a dry run
    /// for itself (server-side apply creating an object).
    pub dry_run: Option<bool>,
    /// Dynamic admission already ran on another form of the request (the
    /// Scale of a `scale` update): the update of the object skips it.
    pub done: bool,
    /// The resource at the version the client asked for (`requestKind`,
    /// `requestResource`, and what matchPolicy Exact matches); `None`:
    /// the stored version.
    pub request: Option<&'static ResourceInfo>,
}

#[derive(Debug, Default)]
struct Output {
    warnings: Vec<String>,
    audit_annotations: Vec<(String, String)>,
}

impl Admission {
    pub fn warn(&self, w: impl Into<String>) {
        let w = w.into();
        let mut o = self.out.lock().unwrap_or_else(|e| e.into_inner());
        if !o.warnings.contains(&w) {
            o.warnings.push(w);
        }
    }

    /// The warnings collected so far (each once).
    pub fn take_warnings(&self) -> Vec<String> {
        std::mem::take(&mut self.out.lock().unwrap_or_else(|e| e.into_inner()).warnings)
    }

    pub fn annotate(&self, key: String, value: String) {
        self.out
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .audit_annotations
            .push((key, value));
    }

    /// At the end of a request: its audit event gets the annotations, the
    /// caller the warnings.
    pub fn finish(&self, audit: Option<&crate::audit::Slot>) -> Vec<String> {
        let annotations = self.take_audit_annotations();
        if let Some(slot) = audit {
            for (k, v) in annotations {
                slot.annotate(k, v);
            }
        }
        self.take_warnings()
    }

    pub fn take_audit_annotations(&self) -> Vec<(String, String)> {
        std::mem::take(
            &mut self
                .out
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .audit_annotations,
        )
    }
}

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

/// Mutating webhooks for a create (after the built-in mutating admission).
pub async fn admit_create(
    reg: &Registry,
    res: &'static ResourceInfo,
    obj: &mut Value,
    opts: &WriteOptions,
) -> ApiResult<()> {
    // Owned: the object changes under the webhooks.
    let (ns, name) = ns_name(obj);
    let (ns, name) = (ns.to_string(), name.to_string());
    let Some(a) = write_attributes(res, Operation::Create, "", (&ns, &name), opts) else {
        return Ok(());
    };
    review::mutate(reg, &a, obj, None).await
}

/// Validating webhooks for a create (after validation).
pub async fn validate_create(
    reg: &Registry,
    res: &'static ResourceInfo,
    obj: &Value,
    opts: &WriteOptions,
) -> ApiResult<()> {
    let Some(a) = write_attributes(res, Operation::Create, "", ns_name(obj), opts) else {
        return Ok(());
    };
    policy::validate(reg, &a, Some(obj), None).await?;
    review::validate(reg, &a, Some(obj), None).await
}

/// Mutating webhooks for an update of the object or a subresource.
pub async fn admit_update(
    reg: &Registry,
    res: &'static ResourceInfo,
    sub: Option<&str>,
    old: &Value,
    new: &mut Value,
    opts: &WriteOptions,
) -> ApiResult<()> {
    let sub = sub.unwrap_or("");
    let Some(a) = write_attributes(res, Operation::Update, sub, ns_name(old), opts) else {
        return Ok(());
    };
    review::mutate(reg, &a, new, Some(old)).await
}

/// Validating webhooks for an update.
pub async fn validate_update(
    reg: &Registry,
    res: &'static ResourceInfo,
    sub: Option<&str>,
    old: &Value,
    new: &Value,
    opts: &WriteOptions,
) -> ApiResult<()> {
    let sub = sub.unwrap_or("");
    let Some(a) = write_attributes(res, Operation::Update, sub, ns_name(old), opts) else {
        return Ok(());
    };
    policy::validate(reg, &a, Some(new), Some(old)).await?;
    review::validate(reg, &a, Some(new), Some(old)).await
}

/// Mutating then validating admission of a `scale` update, on the Scale
/// objects as Kubernetes admits them (resource the object's, subresource
/// `scale`, kind autoscaling/v1 Scale). Returns the options for the
/// object's own update, which then skips dynamic admission.
pub async fn admit_scale(
    reg: &Registry,
    res: &'static ResourceInfo,
    old: &Value,
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
    let old_scale = crate::registry::to_scale(res, old)?;
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
    review::mutate(reg, &a, scale, Some(&old_scale)).await?;
    policy::validate(reg, &a, Some(scale), Some(&old_scale)).await?;
    review::validate(reg, &a, Some(scale), Some(&old_scale)).await?;
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
    reg: &Registry,
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
    review::mutate(reg, &a, &mut object, None).await?;
    let object = before;
    policy::validate(reg, &a, Some(&object), None).await?;
    review::validate(reg, &a, Some(&object), None).await
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
    reg: &Registry,
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
    review::mutate_delete(reg, &delete_attributes(res, ns, name, user, opts)).await
}

/// Validating webhooks for a delete (the object as it is, as oldObject).
pub async fn validate_delete(
    reg: &Registry,
    res: &'static ResourceInfo,
    old: &Value,
    opts: &DeleteOptions,
) -> ApiResult<()> {
    let Some(user) = opts.user.as_ref() else {
        return Ok(());
    };
    let (ns, name) = ns_name(old);
    if exempt(res, ns) {
        return Ok(());
    }
    let a = delete_attributes(res, ns, name, user, opts);
    policy::validate(reg, &a, None, Some(old)).await?;
    review::validate(reg, &a, None, Some(old)).await
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
