//! Audit logging as kube-apiserver does it: an `audit.k8s.io/v1` Policy
//! (`--audit-policy-file`) decides per request the level (None, Metadata,
//! Request, RequestResponse) and the stages left out; events are written as
//! JSON lines (`--audit-log-path`, `-` for stdout) in kube-apiserver's
//! `Event` format, rotated by size (`--audit-log-maxsize` MB,
//! `--audit-log-maxbackup`, `--audit-log-maxage` days, lumberjack's
//! backup names as kube-apiserver's).
//!
//! [`layer`] wraps the request handler: it gives every request an audit ID
//! (the client's `Audit-ID` header or a new UUID, answered in `Audit-Id`),
//! and a [`Slot`] in its extensions that `handlers::handle` fills in once it
//! knows the authenticated user (the policy is evaluated then and
//! `RequestReceived` sent), the impersonated one and the authorization
//! decision. `ResponseComplete` (or `ResponseStarted` then
//! `ResponseComplete` when a watch or stream ends, or `Panic`) follows.
//! Events go through a bounded queue to a writer thread, so a slow disk
//! never stalls a request; events that do not fit are dropped and counted.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::Response;
use futures::{FutureExt, StreamExt};
use http::HeaderValue;
use http_body_util::BodyExt;
use serde::Deserialize;
use serde_json::{json, Map, Value};
use skiff_core::rbac::Attributes;

use crate::auth::Identity;

// ---- policy -----------------------------------------------------------------

/// How much of a request is recorded.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Level {
    None,
    Metadata,
    Request,
    RequestResponse,
}

impl Level {
    fn parse(s: &str) -> Option<Level> {
        Some(match s {
            "None" => Level::None,
            "Metadata" => Level::Metadata,
            "Request" => Level::Request,
            "RequestResponse" => Level::RequestResponse,
            _ => return None,
        })
    }
    fn as_str(self) -> &'static str {
        match self {
            Level::None => "None",
            Level::Metadata => "Metadata",
            Level::Request => "Request",
            Level::RequestResponse => "RequestResponse",
        }
    }
}

const STAGES: [&str; 4] = [
    "RequestReceived",
    "ResponseStarted",
    "ResponseComplete",
    "Panic",
];

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct FilePolicy {
    #[serde(default)]
    api_version: String,
    #[serde(default)]
    kind: String,
    #[serde(default)]
    rules: Vec<FileRule>,
    #[serde(default)]
    omit_stages: Vec<String>,
    #[serde(default)]
    omit_managed_fields: bool,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct FileRule {
    #[serde(default)]
    level: String,
    #[serde(default)]
    users: Vec<String>,
    #[serde(default)]
    user_groups: Vec<String>,
    #[serde(default)]
    verbs: Vec<String>,
    #[serde(default)]
    resources: Vec<GroupResources>,
    #[serde(default)]
    namespaces: Vec<String>,
    #[serde(default, rename = "nonResourceURLs")]
    non_resource_urls: Vec<String>,
    #[serde(default)]
    omit_stages: Vec<String>,
    #[serde(default)]
    omit_managed_fields: Option<bool>,
}

#[derive(Deserialize, Clone, Debug)]
#[serde(rename_all = "camelCase")]
struct GroupResources {
    #[serde(default)]
    group: String,
    #[serde(default)]
    resources: Vec<String>,
    #[serde(default)]
    resource_names: Vec<String>,
}

#[derive(Debug)]
struct Rule {
    level: Level,
    users: Vec<String>,
    user_groups: Vec<String>,
    verbs: Vec<String>,
    resources: Vec<GroupResources>,
    namespaces: Vec<String>,
    non_resource_urls: Vec<String>,
    omit_stages: Vec<String>,
    omit_managed_fields: Option<bool>,
}

/// An `audit.k8s.io/v1` Policy.
#[derive(Debug)]
pub struct Policy {
    rules: Vec<Rule>,
    omit_stages: Vec<String>,
    omit_managed_fields: bool,
}

/// What the policy says about one request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decision {
    pub level: Level,
    pub omit_stages: Vec<String>,
    pub omit_managed_fields: bool,
}

fn path_matches(path: &str, spec: &str) -> bool {
    spec == "*"
        || spec == path
        || spec
            .strip_suffix('*')
            .is_some_and(|prefix| path.starts_with(prefix))
}

impl Rule {
    /// Kubernetes' `ruleMatches`; `user` None ignores users and groups
    /// (what may match whoever asks).
    fn matches(&self, user: Option<(&str, &[String])>, a: &Attributes) -> bool {
        if let Some((name, groups)) = user {
            if !self.users.is_empty() && !self.users.iter().any(|u| u == name) {
                return false;
            }
            if !self.user_groups.is_empty() && !groups.iter().any(|g| self.user_groups.contains(g))
            {
                return false;
            }
        }
        if !self.verbs.is_empty() && !self.verbs.contains(&a.verb) {
            return false;
        }
        if !self.namespaces.is_empty() || !self.resources.is_empty() {
            return self.matches_resource(a);
        }
        if !self.non_resource_urls.is_empty() {
            return !a.resource_request
                && self
                    .non_resource_urls
                    .iter()
                    .any(|spec| path_matches(&a.path, spec));
        }
        true
    }

    fn matches_resource(&self, a: &Attributes) -> bool {
        if !a.resource_request {
            return false;
        }
        if !self.namespaces.is_empty() && !self.namespaces.contains(&a.namespace) {
            return false;
        }
        if self.resources.is_empty() {
            return true;
        }
        let combined = if a.subresource.is_empty() {
            a.resource.clone()
        } else {
            format!("{}/{}", a.resource, a.subresource)
        };
        self.resources.iter().any(|gr| {
            gr.group == a.api_group
                && (gr.resources.is_empty()
                    || gr.resources.iter().any(|res| {
                        (gr.resource_names.is_empty() || gr.resource_names.contains(&a.name))
                            && (*res == combined
                                || res == "*"
                                || (!a.subresource.is_empty()
                                    && res.strip_prefix("*/") == Some(a.subresource.as_str()))
                                || res.strip_suffix("/*") == Some(a.resource.as_str()))
                    }))
        })
    }
}

impl Policy {
    /// Parses and checks a policy.
    pub fn parse(text: &str) -> anyhow::Result<Policy> {
        let file: FilePolicy = serde_yaml_ng::from_str(text).map_err(|e| anyhow::anyhow!("{e}"))?;
        anyhow::ensure!(
            file.kind == "Policy",
            "kind is {:?}, not \"Policy\"",
            file.kind
        );
        anyhow::ensure!(
            file.api_version == "audit.k8s.io/v1",
            "apiVersion is {:?}, not \"audit.k8s.io/v1\"",
            file.api_version
        );
        let check_stages = |at: &str, stages: &[String]| -> anyhow::Result<()> {
            for s in stages {
                anyhow::ensure!(
                    STAGES.contains(&s.as_str()),
                    "{at}: unknown stage {s:?} (RequestReceived, ResponseStarted, ResponseComplete, Panic)"
                );
            }
            Ok(())
        };
        check_stages("omitStages", &file.omit_stages)?;
        let mut rules = Vec::new();
        for (i, r) in file.rules.into_iter().enumerate() {
            let at = format!("rules[{i}]");
            let level = Level::parse(&r.level).ok_or_else(|| {
                anyhow::anyhow!(
                    "{at}.level: {:?} is not None, Metadata, Request or RequestResponse",
                    r.level
                )
            })?;
            check_stages(&format!("{at}.omitStages"), &r.omit_stages)?;
            anyhow::ensure!(
                r.non_resource_urls.is_empty()
                    || (r.resources.is_empty() && r.namespaces.is_empty()),
                "{at}: nonResourceURLs cannot be combined with resources or namespaces"
            );
            for u in &r.non_resource_urls {
                anyhow::ensure!(
                    u == "*" || u.starts_with('/'),
                    "{at}.nonResourceURLs: {u:?} must start with '/'"
                );
            }
            for (j, gr) in r.resources.iter().enumerate() {
                anyhow::ensure!(
                    gr.resource_names.is_empty() || gr.resources.iter().all(|x| !x.contains('*')),
                    "{at}.resources[{j}]: resourceNames need resources without wildcards"
                );
            }
            rules.push(Rule {
                level,
                users: r.users,
                user_groups: r.user_groups,
                verbs: r.verbs,
                resources: r.resources,
                namespaces: r.namespaces,
                non_resource_urls: r.non_resource_urls,
                omit_stages: r.omit_stages,
                omit_managed_fields: r.omit_managed_fields,
            });
        }
        Ok(Policy {
            rules,
            omit_stages: file.omit_stages,
            omit_managed_fields: file.omit_managed_fields,
        })
    }

    /// The first matching rule's level and stages (None without one).
    pub fn evaluate(&self, user: &str, groups: &[String], a: &Attributes) -> Decision {
        match self
            .rules
            .iter()
            .find(|r| r.matches(Some((user, groups)), a))
        {
            Some(r) => Decision {
                level: r.level,
                omit_stages: r
                    .omit_stages
                    .iter()
                    .chain(&self.omit_stages)
                    .cloned()
                    .collect(),
                omit_managed_fields: r.omit_managed_fields.unwrap_or(self.omit_managed_fields),
            },
            None => Decision {
                level: Level::None,
                omit_stages: vec![],
                omit_managed_fields: false,
            },
        }
    }

    /// The highest level any user's request like `a` could get (whether
    /// its body may be needed before the user is known).
    fn max_level(&self, a: &Attributes) -> Level {
        let mut best = Level::None;
        for r in &self.rules {
            if r.matches(None, a) {
                best = best.max(r.level);
                // The first rule matching everyone decides for everyone.
                if r.users.is_empty() && r.user_groups.is_empty() {
                    break;
                }
            }
        }
        best
    }
}

// ---- the log ----------------------------------------------------------------

/// Flags of the log backend.
#[derive(Debug, Clone)]
pub struct Options {
    pub policy_file: PathBuf,
    /// A file, or `-` for stdout.
    pub log_path: PathBuf,
    /// Rotate when the file would exceed this many MB (0: 100, as
    /// kube-apiserver's lumberjack).
    pub max_size_mb: u64,
    /// Rotated files kept (0: all).
    pub max_backup: usize,
    /// Days rotated files are kept (0: forever).
    pub max_age_days: u64,
}

/// Events waiting for the writer.
const QUEUE: usize = 10_000;

/// The audit backend: the policy and the queue to the writer thread.
pub struct Auditor {
    policy: Policy,
    tx: tokio::sync::mpsc::Sender<Value>,
    dropped: AtomicU64,
}

impl std::fmt::Debug for Auditor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Auditor").finish_non_exhaustive()
    }
}

impl Auditor {
    /// Reads the policy and starts the writer (the log file is opened, or
    /// created, now: an unwritable path refuses start).
    pub fn start(opts: &Options) -> anyhow::Result<Arc<Auditor>> {
        let text = std::fs::read_to_string(&opts.policy_file).map_err(|e| {
            anyhow::anyhow!(
                "reading --audit-policy-file {}: {e}",
                opts.policy_file.display()
            )
        })?;
        let policy = Policy::parse(&text)
            .map_err(|e| anyhow::anyhow!("audit policy {}: {e}", opts.policy_file.display()))?;
        let mut sink = Sink::open(opts)?;
        let (tx, mut rx) = tokio::sync::mpsc::channel::<Value>(QUEUE);
        std::thread::Builder::new()
            .name("audit-log".into())
            .spawn(move || {
                while let Some(ev) = rx.blocking_recv() {
                    sink.write(&ev);
                    while let Ok(ev) = rx.try_recv() {
                        sink.write(&ev);
                    }
                    sink.flush();
                }
                sink.flush();
            })?;
        Ok(Arc::new(Auditor {
            policy,
            tx,
            dropped: AtomicU64::new(0),
        }))
    }

    /// Events dropped because the writer was behind.
    pub fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }

    fn send(&self, ev: Value) {
        if self.tx.try_send(ev).is_err() {
            let n = self.dropped.fetch_add(1, Ordering::Relaxed) + 1;
            if n.is_power_of_two() {
                tracing::warn!(
                    dropped = n,
                    "audit events dropped: the audit log writer is behind"
                );
            }
        }
    }
}

/// The log file (or stdout) with size rotation.
struct Sink {
    path: Option<PathBuf>,
    file: Option<std::io::BufWriter<std::fs::File>>,
    size: u64,
    max_size: u64,
    max_backup: usize,
    max_age: std::time::Duration,
}

impl Sink {
    fn open(opts: &Options) -> anyhow::Result<Sink> {
        let mut s = Sink {
            path: (opts.log_path != Path::new("-")).then(|| opts.log_path.clone()),
            file: None,
            size: 0,
            max_size: if opts.max_size_mb == 0 {
                100
            } else {
                opts.max_size_mb
            } * 1024
                * 1024,
            max_backup: opts.max_backup,
            max_age: std::time::Duration::from_secs(opts.max_age_days * 86_400),
        };
        if let Some(p) = &s.path {
            if let Some(dir) = p.parent().filter(|d| !d.as_os_str().is_empty()) {
                std::fs::create_dir_all(dir)
                    .map_err(|e| anyhow::anyhow!("--audit-log-path {}: {e}", p.display()))?;
            }
            let f = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(p)
                .map_err(|e| anyhow::anyhow!("--audit-log-path {}: {e}", p.display()))?;
            s.size = f.metadata().map(|m| m.len()).unwrap_or(0);
            s.file = Some(std::io::BufWriter::new(f));
        }
        Ok(s)
    }

    fn write(&mut self, ev: &Value) {
        let mut line = serde_json::to_vec(ev).unwrap_or_default();
        line.push(b'\n');
        let Some(path) = self.path.clone() else {
            let _ = std::io::stdout().lock().write_all(&line);
            return;
        };
        if self.size > 0 && self.size + line.len() as u64 > self.max_size {
            if let Err(e) = self.rotate(&path) {
                tracing::warn!(error = %e, "rotating the audit log");
            }
        }
        if let Some(f) = &mut self.file {
            if f.write_all(&line).is_ok() {
                self.size += line.len() as u64;
            }
        }
    }

    fn flush(&mut self) {
        if let Some(f) = &mut self.file {
            let _ = f.flush();
        } else {
            let _ = std::io::stdout().flush();
        }
    }

    /// Renames the file to `<name>-<UTC time>.<ext>` (lumberjack's backup
    /// names), starts a new one, and removes backups beyond the limits.
    fn rotate(&mut self, path: &Path) -> std::io::Result<()> {
        if let Some(mut f) = self.file.take() {
            f.flush()?;
        }
        let (stem, ext) = split_name(path);
        let stamp = chrono::Utc::now().format("%Y-%m-%dT%H-%M-%S%.3f");
        let dir = path.parent().unwrap_or(Path::new("."));
        let backup = dir.join(format!("{stem}-{stamp}{ext}"));
        std::fs::rename(path, &backup)?;
        let f = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)?;
        self.file = Some(std::io::BufWriter::new(f));
        self.size = 0;
        // Backups, newest first (the time stamp sorts).
        let mut backups: Vec<(String, PathBuf)> = std::fs::read_dir(dir)?
            .flatten()
            .filter_map(|e| {
                let name = e.file_name().to_string_lossy().to_string();
                let middle = name.strip_prefix(&format!("{stem}-"))?.strip_suffix(&ext)?;
                (middle.len() == 23).then(|| (middle.to_string(), e.path()))
            })
            .collect();
        backups.sort_by(|a, b| b.0.cmp(&a.0));
        let now = std::time::SystemTime::now();
        for (i, (_, p)) in backups.iter().enumerate() {
            let too_many = self.max_backup > 0 && i >= self.max_backup;
            let too_old = !self.max_age.is_zero()
                && std::fs::metadata(p)
                    .and_then(|m| m.modified())
                    .ok()
                    .and_then(|t| now.duration_since(t).ok())
                    .is_some_and(|age| age > self.max_age);
            if too_many || too_old {
                let _ = std::fs::remove_file(p);
            }
        }
        Ok(())
    }
}

fn split_name(path: &Path) -> (String, String) {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().to_string())
        .unwrap_or_default();
    match name.rfind('.') {
        Some(i) if i > 0 => (name[..i].to_string(), name[i..].to_string()),
        _ => (name, String::new()),
    }
}

// ---- events -----------------------------------------------------------------

fn micro_time(t: chrono::DateTime<chrono::Utc>) -> String {
    t.format("%Y-%m-%dT%H:%M:%S%.6fZ").to_string()
}

fn user_info(id: &Identity) -> Value {
    let mut u = Map::new();
    u.insert("username".into(), json!(id.user));
    if let Some(uid) = &id.uid {
        u.insert("uid".into(), json!(uid));
    }
    u.insert("groups".into(), json!(id.groups));
    if !id.extra.is_empty() {
        u.insert("extra".into(), json!(id.extra));
    }
    Value::Object(u)
}

/// What `handlers::handle` learns about a request, for its audit event.
#[derive(Clone)]
pub struct Slot(Arc<Mutex<SlotState>>);

struct SlotState {
    auditor: Arc<Auditor>,
    event: Map<String, Value>,
    attrs: Attributes,
    decision: Option<Decision>,
    user: Option<Identity>,
    impersonated: Option<Identity>,
    authorized: Option<bool>,
    /// Annotations admission added (webhooks' auditAnnotations, policies'
    /// Audit action).
    annotations: Vec<(String, String)>,
}

impl Slot {
    /// The authenticated user: the policy decides the level now, and the
    /// `RequestReceived` event is sent.
    pub fn authenticated(&self, who: &Identity) {
        let mut s = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let d = s.auditor.policy.evaluate(&who.user, &who.groups, &s.attrs);
        s.user = Some(who.clone());
        if d.level > Level::None && !d.omit_stages.iter().any(|x| x == "RequestReceived") {
            let ev = s.stage_event(&d, "RequestReceived", chrono::Utc::now());
            s.auditor.send(ev);
        }
        s.decision = Some(d);
    }

    /// The user the request acts as after impersonation.
    pub fn impersonated(&self, original: &Identity, now: &Identity) {
        if original.user != now.user || original.groups != now.groups {
            let mut s = self.0.lock().unwrap_or_else(|e| e.into_inner());
            s.impersonated = Some(now.clone());
        }
    }

    /// The authorization decision.
    pub fn authorized(&self, allowed: bool) {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).authorized = Some(allowed);
    }

    /// An annotation for the request's later events (from admission).
    pub fn annotate(&self, key: String, value: String) {
        self.0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .annotations
            .push((key, value));
    }
}

impl SlotState {
    fn decision(&mut self) -> Decision {
        if self.decision.is_none() {
            // Not authenticated (401): evaluated without a user.
            self.decision = Some(self.auditor.policy.evaluate("", &[], &self.attrs));
        }
        self.decision.clone().expect("set above")
    }

    fn stage_event(&self, d: &Decision, stage: &str, at: chrono::DateTime<chrono::Utc>) -> Value {
        let mut ev = Map::new();
        ev.insert("kind".into(), json!("Event"));
        ev.insert("apiVersion".into(), json!("audit.k8s.io/v1"));
        ev.insert("level".into(), json!(d.level.as_str()));
        let copy = |k: &str, ev: &mut Map<String, Value>| {
            if let Some(v) = self.event.get(k) {
                ev.insert(k.into(), v.clone());
            }
        };
        copy("auditID", &mut ev);
        ev.insert("stage".into(), json!(stage));
        copy("requestURI", &mut ev);
        copy("verb", &mut ev);
        ev.insert(
            "user".into(),
            self.user
                .as_ref()
                .map(user_info)
                .unwrap_or_else(|| json!({})),
        );
        if stage != "RequestReceived" {
            if let Some(imp) = &self.impersonated {
                ev.insert("impersonatedUser".into(), user_info(imp));
            }
        }
        copy("sourceIPs", &mut ev);
        copy("userAgent", &mut ev);
        copy("objectRef", &mut ev);
        copy("requestReceivedTimestamp", &mut ev);
        ev.insert("stageTimestamp".into(), json!(micro_time(at)));
        if stage != "RequestReceived" {
            let mut annotations = Map::new();
            if let Some(allowed) = self.authorized {
                annotations.insert(
                    "authorization.k8s.io/decision".into(),
                    json!(if allowed { "allow" } else { "forbid" }),
                );
                annotations.insert("authorization.k8s.io/reason".into(), json!(""));
            }
            for (k, v) in &self.annotations {
                annotations.insert(k.clone(), json!(v));
            }
            if !annotations.is_empty() {
                ev.insert("annotations".into(), Value::Object(annotations));
            }
        }
        Value::Object(ev)
    }
}

/// Whether the response is a stream that outlives the handler's return.
fn long_running(a: &Attributes) -> bool {
    a.verb == "watch"
        || matches!(
            a.subresource.as_str(),
            "log" | "exec" | "attach" | "portforward" | "proxy"
        )
}

fn strip_managed_fields(v: &mut Value) {
    if let Some(m) = v.get_mut("metadata").and_then(Value::as_object_mut) {
        m.shift_remove("managedFields");
    }
    if let Some(items) = v.get_mut("items").and_then(Value::as_array_mut) {
        for i in items {
            strip_managed_fields(i);
        }
    }
}

fn json_body(bytes: &[u8], omit_managed_fields: bool) -> Option<Value> {
    let mut v: Value = serde_json::from_slice(bytes).ok()?;
    if omit_managed_fields {
        strip_managed_fields(&mut v);
    }
    Some(v)
}

/// A request body as JSON: an object of the resource in any encoding the
/// server reads (JSON, YAML, protobuf), or a patch.
fn request_json(content_type: Option<&str>, body: &Bytes, a: &Attributes) -> Option<Value> {
    if let Ok(v) = serde_json::from_slice::<Value>(body) {
        return Some(v);
    }
    if a.verb == "patch" {
        return serde_yaml_ng::from_slice::<Value>(body).ok();
    }
    let res = skiff_core::resources::lookup(
        &a.api_group,
        a.api_version.rsplit('/').next().unwrap_or(""),
        &a.resource,
    )?;
    if !a.subresource.is_empty() {
        return None;
    }
    crate::negotiate::decode_body(content_type, body, crate::negotiate::BodyKind::of(res)).ok()
}

/// Sends `ResponseComplete` when a streamed response ends (or is dropped).
struct Finish {
    slot: Slot,
    code: u16,
}

impl Drop for Finish {
    fn drop(&mut self) {
        let mut s = self.slot.0.lock().unwrap_or_else(|e| e.into_inner());
        let d = s.decision();
        if d.level > Level::None && !d.omit_stages.iter().any(|x| x == "ResponseComplete") {
            let mut ev = s.stage_event(&d, "ResponseComplete", chrono::Utc::now());
            insert_status(&mut ev, self.code, None);
            s.auditor.send(ev);
        }
    }
}

/// `responseStatus` (before the time stamps), from the code and, for a
/// `Status` body, its status, message, reason and details.
fn insert_status(ev: &mut Value, code: u16, status: Option<&Value>) {
    let mut rs = Map::new();
    rs.insert("metadata".into(), json!({}));
    if let Some(st) = status.filter(|s| s.get("kind").and_then(Value::as_str) == Some("Status")) {
        for k in ["status", "message", "reason", "details"] {
            if let Some(v) = st.get(k) {
                rs.insert(k.into(), v.clone());
            }
        }
    }
    rs.insert("code".into(), json!(code));
    insert_before_timestamps(ev, "responseStatus", Value::Object(rs));
}

fn insert_before_timestamps(ev: &mut Value, key: &str, value: Value) {
    let Some(m) = ev.as_object_mut() else {
        return;
    };
    let ts: Vec<(String, Value)> = ["requestReceivedTimestamp", "stageTimestamp", "annotations"]
        .iter()
        .filter_map(|k| m.shift_remove(*k).map(|v| (k.to_string(), v)))
        .collect();
    m.insert(key.into(), value);
    for (k, v) in ts {
        m.insert(k, v);
    }
}

/// The fields of a request's audit event known before it is served:
/// its ID, URI, verb, source IPs, user agent, object reference (a create
/// names its object in the body) and when it was received.
fn request_event(
    parts: &http::request::Parts,
    attrs: &skiff_core::rbac::Attributes,
    audit_id: &str,
    request_object: Option<&Value>,
    received: chrono::DateTime<chrono::Utc>,
) -> Map<String, Value> {
    let mut event = Map::new();
    event.insert("auditID".into(), json!(audit_id));
    let uri = parts
        .uri
        .path_and_query()
        .map(|p| p.as_str().to_string())
        .unwrap_or_else(|| parts.uri.path().to_string());
    event.insert("requestURI".into(), json!(uri));
    event.insert("verb".into(), json!(attrs.verb));
    let mut ips: Vec<String> = Vec::new();
    if let Some(xff) = parts
        .headers
        .get("x-forwarded-for")
        .and_then(|v| v.to_str().ok())
    {
        ips.extend(
            xff.split(',')
                .map(|s| s.trim().to_string())
                .filter(|s| !s.is_empty()),
        );
    }
    if let Some(real) = parts.headers.get("x-real-ip").and_then(|v| v.to_str().ok()) {
        ips.push(real.trim().to_string());
    }
    if let Some(peer) = parts.extensions.get::<PeerAddr>() {
        ips.push(peer.0.ip().to_string());
    }
    let mut seen = std::collections::HashSet::new();
    ips.retain(|ip| seen.insert(ip.clone()));
    event.insert("sourceIPs".into(), json!(ips));
    if let Some(ua) = parts
        .headers
        .get(http::header::USER_AGENT)
        .and_then(|v| v.to_str().ok())
    {
        event.insert("userAgent".into(), json!(ua));
    }
    if attrs.resource_request {
        let mut r = Map::new();
        r.insert("resource".into(), json!(attrs.resource));
        if !attrs.namespace.is_empty() {
            r.insert("namespace".into(), json!(attrs.namespace));
        }
        let name = if attrs.name.is_empty() {
            // A create names its object in the body.
            request_object
                .filter(|_| attrs.verb == "create" && attrs.subresource.is_empty())
                .and_then(|o| o.pointer("/metadata/name"))
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_string()
        } else {
            attrs.name.clone()
        };
        if !name.is_empty() {
            r.insert("name".into(), json!(name));
        }
        if !attrs.api_group.is_empty() {
            r.insert("apiGroup".into(), json!(attrs.api_group));
        }
        r.insert("apiVersion".into(), json!(attrs.api_version));
        if !attrs.subresource.is_empty() {
            r.insert("subresource".into(), json!(attrs.subresource));
        }
        event.insert("objectRef".into(), Value::Object(r));
    }
    event.insert(
        "requestReceivedTimestamp".into(),
        json!(micro_time(received)),
    );
    event
}

/// The middleware (`axum::middleware::from_fn_with_state`).
pub async fn layer(State(auditor): State<Arc<Auditor>>, req: Request, next: Next) -> Response {
    let received = chrono::Utc::now();
    let audit_id = req
        .headers()
        .get("audit-id")
        .and_then(|v| v.to_str().ok())
        .filter(|v| !v.is_empty())
        .map(str::to_string)
        .unwrap_or_else(|| uuid::Uuid::new_v4().to_string());
    let attrs =
        skiff_core::rbac::request_info(req.method().as_str(), req.uri().path(), req.uri().query());
    let max = auditor.policy.max_level(&attrs);
    let header_id = HeaderValue::from_str(&audit_id).ok();
    if max == Level::None {
        let mut resp = next.run(req).await;
        if let Some(h) = header_id {
            resp.headers_mut().insert("audit-id", h);
        }
        return resp;
    }

    // The request's body, when one may be logged (or name a created object).
    let (parts, body) = req.into_parts();
    let declared = parts
        .headers
        .get(http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<usize>().ok());
    let wants_body = matches!(parts.method.as_str(), "POST" | "PUT" | "PATCH")
        && !parts.headers.contains_key(http::header::UPGRADE)
        // (HTTP/2 clients often send no Content-Length.)
        && declared.is_none_or(|n| n > 0 && n <= crate::negotiate::MAX_BODY);
    let (body, request_bytes) = if wants_body {
        match http_body_util::Limited::new(body, crate::negotiate::MAX_BODY)
            .collect()
            .await
        {
            Ok(c) => {
                let b = c.to_bytes();
                (Body::from(b.clone()), Some(b))
            }
            Err(e) => {
                let err = if e.is::<http_body_util::LengthLimitError>() {
                    skiff_core::ApiError::too_large(format!(
                        "the request body is larger than {} bytes",
                        crate::negotiate::MAX_BODY
                    ))
                } else {
                    skiff_core::ApiError::bad_request(format!("reading the request body: {e}"))
                };
                return crate::response::error_response(&err);
            }
        }
    } else {
        (body, None)
    };

    let content_type = parts
        .headers
        .get(http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    let request_object = request_bytes
        .as_ref()
        .and_then(|b| request_json(content_type.as_deref(), b, &attrs));
    let event = request_event(&parts, &attrs, &audit_id, request_object.as_ref(), received);
    let streaming = long_running(&attrs);
    let slot = Slot(Arc::new(Mutex::new(SlotState {
        auditor: auditor.clone(),
        event,
        attrs,
        decision: None,
        user: None,
        impersonated: None,
        authorized: None,
        annotations: Vec::new(),
    })));
    let mut req = Request::from_parts(parts, body);
    req.extensions_mut().insert(slot.clone());

    let result = std::panic::AssertUnwindSafe(next.run(req))
        .catch_unwind()
        .await;
    let mut resp = match result {
        Ok(r) => r,
        Err(_) => {
            let mut s = slot.0.lock().unwrap_or_else(|e| e.into_inner());
            let d = s.decision();
            if d.level > Level::None && !d.omit_stages.iter().any(|x| x == "Panic") {
                let mut ev = s.stage_event(&d, "Panic", chrono::Utc::now());
                insert_status(&mut ev, 500, None);
                s.auditor.send(ev);
            }
            drop(s);
            let mut r = crate::response::error_response(&skiff_core::ApiError::internal(
                "the server panicked while handling the request".to_string(),
            ));
            if let Some(h) = header_id {
                r.headers_mut().insert("audit-id", h);
            }
            return r;
        }
    };
    if let Some(h) = header_id {
        resp.headers_mut().insert("audit-id", h);
    }
    let code = resp.status().as_u16();
    let d = slot.0.lock().unwrap_or_else(|e| e.into_inner()).decision();
    if d.level == Level::None {
        return resp;
    }
    if streaming && code < 300 || code == 101 {
        {
            let s = slot.0.lock().unwrap_or_else(|e| e.into_inner());
            if !d.omit_stages.iter().any(|x| x == "ResponseStarted") {
                let mut ev = s.stage_event(&d, "ResponseStarted", chrono::Utc::now());
                insert_status(&mut ev, code, None);
                s.auditor.send(ev);
            }
        }
        let (parts, body) = resp.into_parts();
        let finish = Finish { slot, code };
        let body = Body::from_stream(body.into_data_stream().map(move |chunk| {
            let _ = &finish;
            chunk
        }));
        return Response::from_parts(parts, body);
    }
    if d.omit_stages.iter().any(|x| x == "ResponseComplete") {
        return resp;
    }
    // Error bodies are small Status objects; whole bodies only at
    // RequestResponse.
    let (parts, body) = resp.into_parts();
    let need_body = code >= 400 || d.level == Level::RequestResponse;
    let (body, response_bytes) = if need_body {
        match body.collect().await {
            Ok(c) => {
                let b = c.to_bytes();
                (Body::from(b.clone()), Some(b))
            }
            Err(_) => (Body::empty(), None),
        }
    } else {
        (body, None)
    };
    let response_json = response_bytes.as_deref().and_then(|b| json_body(b, false));
    let s = slot.0.lock().unwrap_or_else(|e| e.into_inner());
    let mut ev = s.stage_event(&d, "ResponseComplete", chrono::Utc::now());
    insert_status(&mut ev, code, response_json.as_ref());
    if d.level >= Level::Request {
        if let Some(mut obj) = request_object {
            if d.omit_managed_fields {
                strip_managed_fields(&mut obj);
            }
            insert_before_timestamps(&mut ev, "requestObject", obj);
        }
    }
    if d.level == Level::RequestResponse {
        if let Some(mut obj) = response_json {
            if d.omit_managed_fields {
                strip_managed_fields(&mut obj);
            }
            insert_before_timestamps(&mut ev, "responseObject", obj);
        }
    }
    s.auditor.send(ev);
    drop(s);
    Response::from_parts(parts, body)
}

/// The client's address, put in the request's extensions by the server.
#[derive(Clone, Copy, Debug)]
pub struct PeerAddr(pub std::net::SocketAddr);

#[cfg(test)]
mod tests {
    use super::*;

    fn attrs(method: &str, path: &str) -> Attributes {
        skiff_core::rbac::request_info(method, path, None)
    }

    const POLICY: &str = r#"
apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: ["RequestReceived"]
rules:
- level: None
  users: ["system:kube-proxy"]
- level: None
  nonResourceURLs: ["/healthz*", "/version"]
- level: RequestResponse
  resources:
  - group: ""
    resources: ["configmaps"]
    resourceNames: ["audited"]
- level: Request
  verbs: ["create", "update"]
  namespaces: ["team"]
  omitStages: ["ResponseStarted"]
- level: Metadata
  resources:
  - group: ""
    resources: ["pods/log", "*/status"]
  - group: "apps"
- level: None
  userGroups: ["system:nodes"]
- level: Metadata
  omitManagedFields: true
"#;

    #[test]
    fn rules_match_in_order_as_kubernetes() {
        let p = Policy::parse(POLICY).unwrap();
        let g = vec!["system:authenticated".to_string()];
        let lvl = |user: &str, groups: &[String], a: &Attributes| p.evaluate(user, groups, a).level;
        assert_eq!(
            lvl("system:kube-proxy", &g, &attrs("GET", "/api/v1/pods")),
            Level::None
        );
        assert_eq!(lvl("u", &g, &attrs("GET", "/healthz/ping")), Level::None);
        assert_eq!(lvl("u", &g, &attrs("GET", "/versions")), Level::Metadata);
        assert_eq!(
            lvl(
                "u",
                &g,
                &attrs("GET", "/api/v1/namespaces/a/configmaps/audited")
            ),
            Level::RequestResponse
        );
        assert_eq!(
            lvl(
                "u",
                &g,
                &attrs("GET", "/api/v1/namespaces/a/configmaps/other")
            ),
            Level::Metadata
        );
        let d = p.evaluate(
            "u",
            &g,
            &attrs("POST", "/api/v1/namespaces/team/configmaps"),
        );
        assert_eq!(d.level, Level::Request);
        assert_eq!(d.omit_stages, vec!["ResponseStarted", "RequestReceived"]);
        assert_eq!(
            lvl(
                "u",
                &g,
                &attrs("POST", "/api/v1/namespaces/other/configmaps")
            ),
            Level::Metadata
        );
        let nodes = vec!["system:nodes".to_string()];
        assert_eq!(
            lvl(
                "n",
                &nodes,
                &attrs("GET", "/api/v1/namespaces/a/pods/p/log")
            ),
            Level::Metadata
        );
        assert_eq!(
            lvl("n", &nodes, &attrs("PUT", "/api/v1/nodes/n/status")),
            Level::Metadata
        );
        assert_eq!(
            lvl("n", &nodes, &attrs("GET", "/apis/apps/v1/deployments")),
            Level::Metadata
        );
        assert_eq!(lvl("n", &nodes, &attrs("GET", "/api/v1/pods")), Level::None);
        let last = p.evaluate("u", &g, &attrs("GET", "/api/v1/pods"));
        assert_eq!(last.level, Level::Metadata);
        assert!(last.omit_managed_fields);
    }

    #[test]
    fn bad_policies_are_refused() {
        let bad = |t: &str| Policy::parse(t).unwrap_err().to_string();
        assert!(bad("kind: Policy\napiVersion: audit.k8s.io/v1beta1\n").contains("apiVersion"));
        assert!(
            bad("kind: Policy\napiVersion: audit.k8s.io/v1\nrules:\n- level: Everything\n")
                .contains("Everything")
        );
        assert!(bad(
            "kind: Policy\napiVersion: audit.k8s.io/v1\nrules:\n- level: None\n  omitStages: [Later]\n"
        )
        .contains("Later"));
        assert!(bad(
            "kind: Policy\napiVersion: audit.k8s.io/v1\nrules:\n- level: None\n  nonResourceURLs: [/x]\n  namespaces: [a]\n"
        )
        .contains("nonResourceURLs"));
    }

    #[test]
    fn rotation_keeps_max_backup_files() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("audit.log");
        let mut sink = Sink::open(&Options {
            policy_file: PathBuf::new(),
            log_path: path.clone(),
            max_size_mb: 1,
            max_backup: 2,
            max_age_days: 0,
        })
        .unwrap();
        let big = json!({"kind": "Event", "pad": "x".repeat(300 * 1024)});
        for _ in 0..20 {
            sink.write(&big);
            sink.flush();
            // Backup names carry milliseconds.
            std::thread::sleep(std::time::Duration::from_millis(2));
        }
        let mut names: Vec<String> = std::fs::read_dir(dir.path())
            .unwrap()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().to_string())
            .collect();
        names.sort();
        assert_eq!(names.len(), 3, "{names:?}");
        assert!(names.contains(&"audit.log".to_string()));
        for n in &names {
            let len = std::fs::metadata(dir.path().join(n)).unwrap().len();
            assert!(len <= 1024 * 1024, "{n} is {len} bytes");
            if n != "audit.log" {
                assert!(n.starts_with("audit-") && n.ends_with(".log"), "{n}");
            }
        }
    }
}
