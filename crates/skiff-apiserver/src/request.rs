//! What a resource request asks for: the resource, namespace, name and
//! subresource from the URL, and the query parameters Kubernetes defines.

use std::collections::HashMap;

use skiff_core::resources::{self, ResourceInfo};
use skiff_core::selector::{FieldSelector, LabelSelector};
use skiff_core::ApiError;

use crate::watchcache::Filter;

/// The subresource a request addresses, parsed once from the path. The
/// registry's writes know five (`Main`, `Status`, `Scale`, `Finalize`,
/// `EphemeralContainers`); the others are served by their own handlers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Subresource {
    Main,
    /// Only `status` changes (Kubernetes' status strategy).
    Status,
    /// The `autoscaling/v1` Scale view of `spec.replicas`.
    Scale,
    /// A namespace's `spec.finalizers`.
    Finalize,
    /// A pod's `spec.ephemeralContainers` (entries may only be added).
    EphemeralContainers,
    /// A pod's containers' cpu and memory (`pods/<n>/resize`, in-place
    /// vertical scaling).
    Resize,
    Binding,
    Eviction,
    Token,
    /// A CertificateSigningRequest's Approved and Denied conditions.
    Approval,
    /// `log`, `exec`, `attach`, `portforward`, `proxy`, ...
    Other,
}

impl Subresource {
    pub fn parse(sub: Option<&str>) -> Subresource {
        match sub {
            None => Subresource::Main,
            Some("status") => Subresource::Status,
            Some("scale") => Subresource::Scale,
            Some("finalize") => Subresource::Finalize,
            Some("ephemeralcontainers") => Subresource::EphemeralContainers,
            Some("resize") => Subresource::Resize,
            Some("binding") => Subresource::Binding,
            Some("eviction") => Subresource::Eviction,
            Some("token") => Subresource::Token,
            Some("approval") => Subresource::Approval,
            Some(_) => Subresource::Other,
        }
    }

    /// The name as in a path (`None` for the main resource and others).
    pub fn as_str(self) -> Option<&'static str> {
        match self {
            Subresource::Main | Subresource::Other => None,
            Subresource::Status => Some("status"),
            Subresource::Scale => Some("scale"),
            Subresource::Finalize => Some("finalize"),
            Subresource::EphemeralContainers => Some("ephemeralcontainers"),
            Subresource::Resize => Some("resize"),
            Subresource::Binding => Some("binding"),
            Subresource::Eviction => Some("eviction"),
            Subresource::Token => Some("token"),
            Subresource::Approval => Some("approval"),
        }
    }
}

/// A request for a resource (or a collection of it).
#[derive(Debug, Clone)]
pub struct ResourceRequest {
    pub res: &'static ResourceInfo,
    pub namespace: Option<String>,
    pub name: Option<String>,
    /// The subresource as named in the path (authorization and audit read it).
    pub subresource: Option<String>,
    /// The same, parsed.
    pub sub: Subresource,
    /// A `/watch/` path prefix (deprecated form of `?watch=true`).
    pub watch_path: bool,
}

/// [`parse_path_in`] for the built-in resources only.
pub fn parse_path(path: &str) -> Result<Option<ResourceRequest>, ApiError> {
    parse_path_in(&resources::Catalog::new(), path)
}

/// Parses `/api/v1/...` and `/apis/<group>/<version>/...` into a resource
/// request for a resource `catalog` serves; `Ok(None)` when the path is not
/// a resource path at all.
pub fn parse_path_in(
    catalog: &resources::Catalog,
    path: &str,
) -> Result<Option<ResourceRequest>, ApiError> {
    let segs: Vec<&str> = path.trim_matches('/').split('/').collect();
    let (group, version, rest) = match segs.as_slice() {
        ["api", version, rest @ ..] if !rest.is_empty() => ("", *version, rest),
        ["apis", group, version, rest @ ..] if !rest.is_empty() => (*group, *version, rest),
        _ => return Ok(None),
    };
    let mut rest: Vec<&str> = rest.to_vec();
    let mut watch_path = false;
    if rest.first() == Some(&"watch") {
        watch_path = true;
        rest.remove(0);
    }
    let mut namespace = None;
    // `namespaces/<ns>/<resource>...` names a namespaced resource; `namespaces`,
    // `namespaces/<name>` and `namespaces/<name>/<sub>` the namespaces themselves.
    if rest.len() >= 3 && rest[0] == "namespaces" {
        let candidate = catalog.lookup(group, version, rest[2]);
        if candidate.map(|r| r.namespaced).unwrap_or(false)
            || !(rest.len() == 3 && is_namespace_sub(rest[2]))
        {
            namespace = Some(rest[1].to_string());
            rest.drain(..2);
        }
    }
    let plural = rest[0];
    let res = catalog
        .lookup(group, version, plural)
        .ok_or_else(|| not_found_path(path))?;
    if namespace.is_some() && !res.namespaced {
        return Err(not_found_path(path));
    }
    let name = rest.get(1).map(|s| s.to_string());
    let subresource = rest.get(2).map(|s| s.to_string());
    if rest.len() > 3 && subresource.as_deref() != Some("proxy") {
        return Err(not_found_path(path));
    }
    if let Some(sub) = &subresource {
        if !res.has_subresource(sub) {
            return Err(not_found_path(path));
        }
    }
    if let Some(n) = &name {
        if n.is_empty() {
            return Err(not_found_path(path));
        }
    }
    Ok(Some(ResourceRequest {
        res,
        namespace,
        name,
        sub: Subresource::parse(subresource.as_deref()),
        subresource,
        watch_path,
    }))
}

fn is_namespace_sub(s: &str) -> bool {
    s == "status" || s == "finalize"
}

/// Kubernetes' answer for a path it does not serve.
pub fn not_found_path(_path: &str) -> ApiError {
    ApiError::new(
        404,
        "NotFound",
        "the server could not find the requested resource",
    )
}

/// Query parameters, decoded.
#[derive(Debug, Clone, Default)]
pub struct Query(pub HashMap<String, String>);

impl Query {
    pub fn parse(q: Option<&str>) -> Query {
        let mut m = HashMap::new();
        if let Some(q) = q {
            m.extend(skiff_core::query::pairs(q));
        }
        Query(m)
    }

    pub fn get(&self, k: &str) -> Option<&str> {
        self.0.get(k).map(String::as_str)
    }

    /// A boolean parameter (`true`/`1`).
    pub fn flag(&self, k: &str) -> bool {
        matches!(self.get(k), Some("true") | Some("1") | Some("True"))
    }

    pub fn int(&self, k: &str) -> Result<Option<i64>, ApiError> {
        match self.get(k) {
            None | Some("") => Ok(None),
            Some(v) => v
                .parse::<i64>()
                .map(Some)
                .map_err(|_| ApiError::bad_request(format!("invalid value for {k}: {v:?}"))),
        }
    }

    /// `dryRun=All` (the only value Kubernetes accepts).
    pub fn dry_run(&self) -> Result<bool, ApiError> {
        match self.0.get("dryRun").map(String::as_str) {
            None | Some("") => Ok(false),
            Some("All") => Ok(true),
            Some(other) => Err(ApiError::bad_request(format!(
                "Invalid dry run value: {other:?}: supported values: \"All\""
            ))),
        }
    }
}

/// The watch cache filter of a list or watch: its namespace, label and
/// field selectors (fields named as the stored version names them).
pub fn filter_from_query(
    res: &'static ResourceInfo,
    namespace: Option<String>,
    q: &Query,
) -> Result<Filter, ApiError> {
    let labels = match q.get("labelSelector") {
        Some(s) if !s.trim().is_empty() => Some(
            LabelSelector::parse(s)
                .map_err(|e| ApiError::bad_request(format!("unable to parse requirement: {e}")))?,
        ),
        _ => None,
    };
    let fields = match q.get("fieldSelector") {
        Some(s) if !s.trim().is_empty() => {
            let f = FieldSelector::parse(s).map_err(ApiError::bad_request)?;
            for (field, _, _) in f.requirements() {
                skiff_core::fields::check_supported(res, field)?;
            }
            // The cache indexes fields as the stored version names them.
            Some(f.map_fields(|field| skiff_core::convert::storage_field(res, field)))
        }
        _ => None,
    };
    Ok(Filter {
        namespace,
        labels,
        fields,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn namespaced_paths_name_their_namespace() {
        let r = parse_path("/api/v1/namespaces/ns1/pods/p1/status")
            .unwrap()
            .unwrap();
        assert_eq!(r.res.plural, "pods");
        assert_eq!(r.namespace.as_deref(), Some("ns1"));
        assert_eq!(r.name.as_deref(), Some("p1"));
        assert_eq!(r.subresource.as_deref(), Some("status"));
        assert_eq!(r.sub, Subresource::Status);
    }

    #[test]
    fn namespace_paths_name_the_namespace_itself() {
        let r = parse_path("/api/v1/namespaces/ns1").unwrap().unwrap();
        assert_eq!(r.res.plural, "namespaces");
        assert_eq!(r.name.as_deref(), Some("ns1"));
        let r = parse_path("/api/v1/namespaces/ns1/finalize")
            .unwrap()
            .unwrap();
        assert_eq!(r.subresource.as_deref(), Some("finalize"));
        assert!(r.namespace.is_none());
    }

    #[test]
    fn group_paths_and_cluster_lists() {
        let r = parse_path("/apis/apps/v1/deployments").unwrap().unwrap();
        assert_eq!(r.res.kind, "Deployment");
        assert!(r.namespace.is_none() && r.name.is_none());
        assert!(parse_path("/apis/apps/v1/nothings").is_err());
        assert!(parse_path("/api/v1/namespaces/x/nodes").is_err());
        assert!(parse_path("/version").unwrap().is_none());
    }

    #[test]
    fn query_values_are_percent_decoded() {
        let q = Query::parse(Some("labelSelector=app%3Dweb%2Ctier+in+(a)&watch=1"));
        assert_eq!(q.get("labelSelector"), Some("app=web,tier in (a)"));
        assert!(q.flag("watch"));
    }
}
