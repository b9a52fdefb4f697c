//! The resource verbs (kube-apiserver's `endpoints/handlers`): one file a
//! verb, each taking the [`RequestScope`] built once per request (the
//! resource in the request's version and as stored, namespace, name,
//! subresource, output form, query, user, audit), and one body reader
//! and decoder for every verb and every special body.

pub mod connect;
pub mod create;
pub mod delete;
pub mod get;
pub mod list;
pub mod patch;
pub mod update;
pub mod watch;

use std::sync::Arc;

use axum::body::Body;
use axum::http::{header, HeaderMap, Method, Request};
use bytes::Bytes;
use http_body_util::BodyExt;
use serde_json::{json, Value};
use skiff_core::convert;
use skiff_core::resources::ResourceInfo;
use skiff_core::ApiError;

use crate::audit::Slot;
use crate::auth::Identity;
use crate::negotiate::{self, BodyKind, Output};
use crate::options::{Admission, FieldValidation, WriteOptions};
use crate::request::{Query, ResourceRequest, Subresource};
use crate::response::Resp;
use crate::state::AppState;

/// What every verb knows of its request, built once.
pub struct RequestScope {
    /// The resource in the version the request speaks (bodies and answers).
    pub api_res: &'static ResourceInfo,
    /// The same resource as stored (what the registry works in).
    pub res: &'static ResourceInfo,
    pub namespace: Option<String>,
    pub name: Option<String>,
    pub sub: Subresource,
    /// The subresource as the path names it.
    pub subresource: Option<String>,
    /// A `/watch/` path or `?watch=true`.
    pub watch: bool,
    pub output: Output,
    pub query: Query,
    /// Who asks (`None` only for requests that skipped authentication).
    pub user: Option<Identity>,
    pub audit: Option<Slot>,
}

impl RequestScope {
    fn new(
        rr: ResourceRequest,
        query: Query,
        accept: Option<&str>,
        req: &Request<Body>,
    ) -> Result<RequestScope, ApiError> {
        Ok(RequestScope {
            api_res: rr.res,
            res: convert::storage_resource(rr.res),
            watch: rr.watch_path || query.flag("watch"),
            namespace: rr.namespace,
            name: rr.name,
            sub: rr.sub,
            subresource: rr.subresource,
            output: negotiate::choose_output(accept)?,
            query,
            user: req.extensions().get::<Identity>().cloned(),
            audit: req.extensions().get::<Slot>().cloned(),
        })
    }

    pub fn ns(&self) -> Option<&str> {
        self.namespace.as_deref()
    }

    /// The object's name (`""` for a collection).
    pub fn name(&self) -> &str {
        self.name.as_deref().unwrap_or("")
    }

    /// The write options of the query (and User-Agent), for this user and
    /// the request's version.
    fn write_options(&self, headers: &HeaderMap, apply: bool) -> Result<WriteOptions, ApiError> {
        let mut opts = write_options(&self.query, headers, apply)?;
        opts.user = self.user.clone();
        opts.admission.request = Some(self.api_res);
        Ok(opts)
    }

    /// At the end of a write: the audit event gets admission's
    /// annotations, the client its warnings.
    fn finish(&self, admission: &Admission) -> Vec<String> {
        let annotations = admission.take_audit_annotations();
        if let Some(slot) = &self.audit {
            for (k, v) in annotations {
                slot.annotate(k, v);
            }
        }
        admission.take_warnings()
    }

    /// A write's outcome; a failed one still carries what admission said
    /// (its warnings as headers, its audit annotations), as
    /// kube-apiserver's do when a webhook warns and then denies.
    fn admitted<T>(&self, r: Result<T, ApiError>, admission: &Admission) -> Result<T, ApiError> {
        r.map_err(|e| e.with_warnings(self.finish(admission)))
    }

    /// The answer to an update or patch that may have created the object:
    /// admission's warnings and audit annotations, the object converted
    /// back to the request's version, 201 if it was created, else 200.
    async fn written(
        &self,
        reg: &crate::registry::Registry,
        result: Result<(Value, bool), ApiError>,
        admission: &Admission,
        mut warnings: Vec<String>,
    ) -> Result<crate::response::Resp, ApiError> {
        let (out, created) = self.admitted(result, admission)?;
        warnings.extend(self.finish(admission));
        let out = crate::crd::conversion::from_storage(reg, self.api_res, out).await?;
        let code = if created { 201 } else { 200 };
        Ok(crate::response::add_warnings(
            crate::response::render_object(self.api_res, code, &out, self.output)?,
            &warnings,
        ))
    }
}

/// Serves a request for a resource: the verb by method and subresource.
pub async fn serve(
    state: &Arc<AppState>,
    rr: ResourceRequest,
    query: Query,
    accept: Option<String>,
    req: Request<Body>,
) -> Result<Resp, ApiError> {
    let s = RequestScope::new(rr, query, accept.as_deref(), &req)?;
    let method = req.method().clone();
    if s.api_res.is_review() {
        if method != Method::POST || s.name.is_some() {
            return Err(ApiError::method_not_allowed(format!(
                "{} only answer create",
                s.api_res.plural
            )));
        }
        return create::review(state, &s, req).await;
    }
    use Subresource as S;
    let one = s.name.is_some();
    match (method, one, s.sub) {
        (Method::GET, false, S::Main) if s.watch => watch::serve(state, &s).await,
        (Method::GET, false, S::Main) => list::list(state, &s).await,
        (Method::POST, false, S::Main) => create::create(state, &s, req).await,
        (Method::DELETE, false, S::Main) => delete::collection(state, &s, req).await,
        (Method::GET, true, S::Main) if s.watch => watch::serve(state, &s).await,
        (Method::GET, true, S::Main | S::Status | S::EphemeralContainers | S::Resize) => {
            get::get(state, &s).await
        }
        (Method::GET, true, S::Approval) => get::approval(state, &s).await,
        (Method::GET, true, S::Scale) => get::scale(state, &s).await,
        (Method::PUT, true, S::Approval) => update::approval(state, &s, req).await,
        (Method::PUT, true, S::Scale) => update::scale(state, &s, req).await,
        (
            Method::PUT,
            true,
            S::Main | S::Status | S::Finalize | S::EphemeralContainers | S::Resize,
        ) => update::update(state, &s, req).await,
        (Method::PATCH, true, S::Approval) => patch::approval(state, &s, req).await,
        (Method::PATCH, true, S::Scale) => patch::scale(state, &s, req).await,
        (Method::PATCH, true, S::Main | S::Status | S::EphemeralContainers | S::Resize) => {
            patch::patch(state, &s, req).await
        }
        (Method::POST, true, S::Binding) => create::binding(state, &s, req).await,
        (Method::POST, true, S::Token) => create::token(state, &s, req).await,
        (Method::POST, true, S::Eviction) => create::eviction(state, &s, req).await,
        (Method::DELETE, true, S::Main) => delete::delete(state, &s, req).await,
        // `log`, `exec`, `attach`, `portforward`, `proxy` are served by
        // `connect` before routing when they can be; the rest is not.
        (_, _, S::Other | S::Eviction | S::Token) => Err(ApiError::new(
            501,
            "NotImplemented",
            format!(
                "the {} subresource is not served yet",
                s.subresource.as_deref().unwrap_or_default()
            ),
        )),
        _ => Err(ApiError::method_not_allowed(
            "the server does not allow this method on the requested resource",
        )),
    }
}

/// A request's body, read whole, with its headers.
pub struct RequestBody {
    pub headers: HeaderMap,
    pub bytes: Bytes,
}

impl RequestBody {
    pub fn content_type(&self) -> Option<&str> {
        self.headers
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
    }

    /// The body decoded as `kind` by its Content-Type.
    pub fn decode(&self, kind: BodyKind) -> Result<Value, ApiError> {
        negotiate::decode_body(self.content_type(), &self.bytes, kind)
    }

    /// Whether the body is JSON (which the duplicate-field check reads).
    fn is_json(&self) -> bool {
        self.content_type()
            .map(|c| c.starts_with("application/json"))
            .unwrap_or(true)
    }
}

/// Reads a body up to [`negotiate::MAX_BODY`]; a larger one is a 413.
pub async fn read_body(req: Request<Body>) -> Result<RequestBody, ApiError> {
    let (parts, mut body) = req.into_parts();
    let declared = parts
        .headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<usize>().ok());
    let mut too_large = declared.is_some_and(|len| len > negotiate::MAX_BODY);
    let mut buf = bytes::BytesMut::new();
    let mut discarded = 0usize;
    // A body over the limit is still read (and dropped, up to a bound) so
    // the client gets its 413 Status: refusing mid-upload resets the
    // HTTP/2 stream or the connection before the answer can arrive.
    while let Some(frame) = body.frame().await {
        let frame = match frame {
            Ok(f) => f,
            Err(e) if too_large => {
                tracing::debug!("request body over the limit ended early: {e}");
                break;
            }
            Err(e) => {
                return Err(ApiError::bad_request(format!(
                    "error reading request body: {e}"
                )))
            }
        };
        let Ok(data) = frame.into_data() else {
            continue;
        };
        if !too_large && buf.len() + data.len() <= negotiate::MAX_BODY {
            buf.extend_from_slice(&data);
            continue;
        }
        too_large = true;
        discarded += data.len();
        if discarded > DRAIN_LIMIT {
            break;
        }
    }
    if too_large {
        return Err(ApiError::too_large(format!(
            "Request entity too large: limit is {}",
            negotiate::MAX_BODY
        )));
    }
    Ok(RequestBody {
        headers: parts.headers,
        bytes: buf.freeze(),
    })
}

/// How much of a body over the limit is read and thrown away before the
/// 413 is sent anyway.
const DRAIN_LIMIT: usize = 64 * 1024 * 1024;

/// A create or replace request's object and write options, with the
/// unknown and duplicate fields `fieldValidation` asks about (warnings;
/// Strict fails).
struct WriteBody {
    obj: Value,
    opts: WriteOptions,
    warnings: Vec<String>,
}

async fn read_write_body(
    s: &RequestScope,
    req: Request<Body>,
    check: bool,
) -> Result<WriteBody, ApiError> {
    let body = read_body(req).await?;
    let obj = body.decode(BodyKind::of(s.api_res))?;
    let opts = s.write_options(&body.headers, false)?;
    let warnings = if check {
        check_fields(
            s.api_res,
            &body.bytes,
            &obj,
            opts.field_validation,
            body.is_json(),
        )
        .map_err(|e| decode_failure(s.api_res, &obj, e))?
    } else {
        Vec::new()
    };
    Ok(WriteBody {
        obj,
        opts,
        warnings,
    })
}

fn field_validation(q: &Query) -> Result<FieldValidation, ApiError> {
    match q.get("fieldValidation") {
        None | Some("") | Some("Warn") => Ok(FieldValidation::Warn),
        Some("Strict") => Ok(FieldValidation::Strict),
        Some("Ignore") => Ok(FieldValidation::Ignore),
        Some(other) => Err(ApiError::bad_request(format!(
            "fieldValidation parameter unsupported: {other:?}; supported values: \"Ignore\", \"Strict\", \"Warn\""
        ))),
    }
}

/// The manager name Kubernetes derives from a User-Agent (`kubectl/v1.33 (...)` → `kubectl`).
fn manager_from_user_agent(headers: &HeaderMap) -> String {
    let ua = headers
        .get(header::USER_AGENT)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("unknown");
    let first = ua.split('/').next().unwrap_or("unknown");
    let m: String = first
        .chars()
        .filter(|c| !c.is_control())
        .take(128)
        .collect();
    if m.is_empty() {
        "unknown".into()
    } else {
        m
    }
}

fn write_options(q: &Query, headers: &HeaderMap, apply: bool) -> Result<WriteOptions, ApiError> {
    let field_manager = match q.get("fieldManager") {
        Some(m) if !m.is_empty() => {
            if m.chars().count() > 128 || m.chars().any(|c| c.is_control()) {
                return Err(ApiError::invalid("", "PatchOptions", "", vec![skiff_core::Cause::invalid("fieldManager", &json!(m), "must be no more than 128 characters")]));
            }
            m.to_string()
        }
        _ if apply => {
            return Err(with_message(ApiError::invalid("", "PatchOptions", "", vec![skiff_core::Cause::required("fieldManager")]), "PatchOptions.meta.k8s.io \"\" is invalid: fieldManager: Required value: is required for apply patch"))
        }
        _ => manager_from_user_agent(headers),
    };
    Ok(WriteOptions {
        dry_run: q.dry_run()?,
        field_manager,
        field_validation: field_validation(q)?,
        force: q.flag("force"),
        user: None,
        admission: Default::default(),
    })
}

fn with_message(mut e: ApiError, m: &str) -> ApiError {
    e.message = m.to_string();
    e
}

/// Unknown and duplicate fields, per `fieldValidation`: Strict fails, Warn warns.
fn check_fields(
    res: &ResourceInfo,
    body: &Bytes,
    obj: &Value,
    fv: FieldValidation,
    json_body: bool,
) -> Result<Vec<String>, ApiError> {
    if fv == FieldValidation::Ignore {
        return Ok(Vec::new());
    }
    let mut problems = Vec::new();
    if json_body {
        for d in skiff_core::patch::duplicate_fields_of(body, obj) {
            problems.push(format!("json: duplicate field \"{d}\""));
        }
    }
    if let Some(t) = skiff_core::schema::root(res.group, res.version, res.kind) {
        for u in skiff_core::patch::unknown_fields(t, obj) {
            problems.push(format!("unknown field \"{}\"", u.trim_start_matches('.')));
        }
    } else if let Some(c) = res.rules.custom() {
        // A custom resource: the fields its schema would prune.
        for u in c.unknown_fields(obj) {
            problems.push(format!("unknown field \"{}\"", u.trim_start_matches('.')));
        }
    }
    if problems.is_empty() {
        return Ok(problems);
    }
    if fv == FieldValidation::Strict {
        return Err(ApiError::bad_request(format!(
            "strict decoding error: {}",
            problems.join(", ")
        )));
    }
    Ok(problems)
}

/// A create's or update's decoding error, worded as kube-apiserver's
/// decoder reports it: the body's kind and version, then the resource's
/// kind (patches report the bare error).
fn decode_failure(res: &ResourceInfo, obj: &Value, e: ApiError) -> ApiError {
    let kind = obj.get("kind").and_then(Value::as_str).unwrap_or(res.kind);
    let version = obj
        .get("apiVersion")
        .and_then(Value::as_str)
        .map(|v| v.rsplit('/').next().unwrap_or(v))
        .unwrap_or(res.version);
    let message = format!(
        "{kind} in version \"{version}\" cannot be handled as a {}: {}",
        res.kind, e.message
    );
    with_message(e, &message)
}

/// The `Status` of a subresource create that answers nothing else
/// (`pods/binding`, `pods/eviction`).
fn created_status() -> Value {
    json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201})
}
