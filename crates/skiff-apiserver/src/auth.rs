//! Authentication: who is calling. TLS client certificates (verified against
//! the cluster CA at the handshake) and in-process callers carry an
//! [`Identity`] in the request's extensions; a request without one is 401.

/// An authenticated user.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Identity {
    pub user: String,
    pub groups: Vec<String>,
}

impl Identity {
    /// The identity of in-process components (scheduler, controllers) in `skiff up`.
    pub fn system(component: &str) -> Identity {
        Identity {
            user: format!("system:{component}"),
            groups: vec!["system:masters".into()],
        }
    }
}

/// Paths anyone may read without credentials (as Kubernetes' default
/// `system:public-info-viewer` role allows).
pub fn is_public(path: &str) -> bool {
    matches!(
        path,
        "/healthz" | "/livez" | "/readyz" | "/version" | "/version/"
    ) || path.starts_with("/healthz/")
        || path.starts_with("/livez/")
        || path.starts_with("/readyz/")
}
