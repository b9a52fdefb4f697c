//! The options a request hands the registry (Kubernetes' CreateOptions,
//! UpdateOptions, PatchOptions, DeleteOptions and ListOptions as the
//! registry honours them), what admission hands back, and the registry's
//! settings. A leaf: it names the types only, so the handlers, the
//! registry, the strategies and admission share them without importing
//! one another.

use std::net::Ipv4Addr;
use std::sync::{Arc, Mutex};

use serde_json::Value;
use skiff_core::resources::ResourceInfo;

/// How strictly unknown and duplicate fields are treated (`fieldValidation`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FieldValidation {
    Ignore,
    Warn,
    Strict,
}

/// Options every write carries.
#[derive(Debug, Clone)]
pub struct WriteOptions {
    pub dry_run: bool,
    pub field_manager: String,
    pub field_validation: FieldValidation,
    /// `force` for server-side apply.
    pub force: bool,
    /// Who writes (for escalation checks on RBAC objects); `None` for the
    /// server's own writes.
    pub user: Option<crate::auth::Identity>,
    /// Warnings and audit annotations admission webhooks hand back.
    pub admission: Admission,
}

impl Default for WriteOptions {
    fn default() -> Self {
        WriteOptions {
            dry_run: false,
            field_manager: "unknown".into(),
            field_validation: FieldValidation::Warn,
            force: false,
            user: None,
            admission: Default::default(),
        }
    }
}

/// A patch's format, from its Content-Type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PatchType {
    Json,
    Merge,
    Strategic,
    Apply,
}

/// DeleteOptions the registry honours.
#[derive(Debug, Clone, Default)]
pub struct DeleteOptions {
    pub grace_period_seconds: Option<i64>,
    pub precondition_uid: Option<String>,
    pub precondition_resource_version: Option<String>,
    pub propagation_policy: Option<String>,
    /// The deprecated `orphanDependents`; it wins over `propagationPolicy`.
    pub orphan_dependents: Option<bool>,
    pub dry_run: bool,
    /// Who deletes (admission webhooks see it); `None` for the server's own.
    pub user: Option<crate::auth::Identity>,
    pub admission: Admission,
}

/// What a delete did.
pub enum Deleted {
    /// The object is gone; this was its last state.
    Gone(Value),
    /// Deletion started (finalizers or graceful termination); the object remains.
    Pending(Value),
}

/// The result of a list.
pub struct ListOutput {
    /// Items as JSON (resourceVersion included).
    pub items: Vec<bytes::Bytes>,
    pub resource_version: i64,
    pub continue_token: Option<String>,
    pub remaining: Option<i64>,
}

/// Settings that shape admission.
#[derive(Debug, Clone)]
pub struct RegistryConfig {
    /// ClusterIPs are allocated from this IPv4 range.
    pub service_cidr: (Ipv4Addr, u8),
    /// The `kube-dns` Service's ClusterIP (`--cluster-dns`); None: the 10th
    /// address of the service CIDR.
    pub cluster_dns: Option<Ipv4Addr>,
    /// Whether the server issues ServiceAccount tokens (set by
    /// `ApiServer::start`): only then do pods get the token volume.
    pub service_account_tokens: bool,
    /// Omega's commit check on writes that bind pods
    /// (`registry::allocation`). Off only to measure it against
    /// Kubernetes' behaviour (B1's `--no-commit-check`).
    pub commit_check: bool,
}

impl Default for RegistryConfig {
    fn default() -> Self {
        RegistryConfig {
            service_cidr: (Ipv4Addr::new(10, 43, 0, 0), 16),
            cluster_dns: None,
            service_account_tokens: false,
            commit_check: true,
        }
    }
}

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
