//! The built-in resource kinds skiff serves: names, scope, short names,
//! categories and subresources, as discovery and the registry need them,
//! each bound to its kind's rules.

use std::fmt;

use crate::kinds::{self, KindRules};

/// What the API knows about one resource (a Kubernetes `APIResource` plus
/// storage), and the kind's rules.
#[derive(Clone)]
pub struct ResourceInfo {
    /// API group; `""` is the core (legacy) group served under `/api`.
    pub group: &'static str,
    pub version: &'static str,
    pub kind: &'static str,
    /// Plural resource name used in URLs (`pods`).
    pub plural: &'static str,
    pub singular: &'static str,
    pub namespaced: bool,
    pub short_names: &'static [&'static str],
    pub categories: &'static [&'static str],
    /// Subresources served, e.g. `status`, `scale`, `binding`, `eviction`, `log`.
    pub subresources: &'static [&'static str],
    /// Resources served at several versions share one storage; this names it
    /// (group/plural of the stored form).
    pub storage: &'static str,
    /// Everything pure about the kind: defaults, validation, fields, printer,
    /// quota, flags (`crate::kinds`).
    pub rules: &'static dyn KindRules,
}

impl fmt::Debug for ResourceInfo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ResourceInfo")
            .field("group", &self.group)
            .field("version", &self.version)
            .field("plural", &self.plural)
            .field("rules", &self.rules.kind())
            .finish_non_exhaustive()
    }
}

/// Two resources are the same when they are served at the same place.
impl PartialEq for ResourceInfo {
    fn eq(&self, other: &Self) -> bool {
        (self.group, self.version, self.plural) == (other.group, other.version, other.plural)
    }
}

impl Eq for ResourceInfo {}

impl ResourceInfo {
    /// `apps/v1`, or `v1` for the core group.
    pub fn api_version(&self) -> String {
        if self.group.is_empty() {
            self.version.to_string()
        } else {
            format!("{}/{}", self.group, self.version)
        }
    }

    /// `PodList`.
    pub fn list_kind(&self) -> String {
        format!("{}List", self.kind)
    }

    /// Verbs of the main resource, as discovery lists them.
    pub fn verbs(&self) -> &'static [&'static str] {
        if self.is_review() {
            return &["create"];
        }
        &[
            "create",
            "delete",
            "deletecollection",
            "get",
            "list",
            "patch",
            "update",
            "watch",
        ]
    }

    /// Reviews (authorization and authentication questions) are answered on
    /// create and never stored.
    pub fn is_review(&self) -> bool {
        matches!(self.group, "authorization.k8s.io" | "authentication.k8s.io")
    }

    /// Whether a delete that removes the object at once answers with the
    /// deleted object rather than a `Success` Status: kube-apiserver's
    /// registries for these kinds set `ReturnDeletedObject`, and typed
    /// clients decode the answer as the kind.
    pub fn returns_deleted_object(&self) -> bool {
        self.rules.returns_deleted_object()
    }

    pub fn has_subresource(&self, sub: &str) -> bool {
        self.subresources.contains(&sub)
    }
}

macro_rules! res {
    ($group:expr, $version:expr, $kind:expr, $plural:expr, $singular:expr, $ns:expr, [$($short:expr),*], [$($cat:expr),*], [$($sub:expr),*], $rules:expr) => {
        ResourceInfo {
            group: $group,
            version: $version,
            kind: $kind,
            plural: $plural,
            singular: $singular,
            namespaced: $ns,
            short_names: &[$($short),*],
            categories: &[$($cat),*],
            subresources: &[$($sub),*],
            storage: concat!($group, "/", $plural),
            rules: $rules,
        }
    };
    // A version served from another resource's storage.
    ($group:expr, $version:expr, $kind:expr, $plural:expr, $singular:expr, $ns:expr, [$($short:expr),*], [$($cat:expr),*], [$($sub:expr),*], $rules:expr, stored_as $storage:expr) => {
        ResourceInfo {
            storage: $storage,
            ..res!($group, $version, $kind, $plural, $singular, $ns, [$($short),*], [$($cat),*], [$($sub),*], $rules)
        }
    };
}

/// Every resource served, in discovery order.
pub static RESOURCES: &[ResourceInfo] = &[
    // core/v1
    res!(
        "",
        "v1",
        "Namespace",
        "namespaces",
        "namespace",
        false,
        ["ns"],
        [],
        ["status", "finalize"],
        &kinds::namespace::Namespace
    ),
    res!(
        "",
        "v1",
        "Pod",
        "pods",
        "pod",
        true,
        ["po"],
        ["all"],
        [
            "status",
            "binding",
            "eviction",
            "log",
            "exec",
            "attach",
            "portforward",
            "proxy",
            "ephemeralcontainers",
            "resize"
        ],
        &kinds::pod::Pod
    ),
    res!(
        "",
        "v1",
        "Node",
        "nodes",
        "node",
        false,
        ["no"],
        [],
        ["status", "proxy"],
        &kinds::node::Node
    ),
    res!(
        "",
        "v1",
        "Service",
        "services",
        "service",
        true,
        ["svc"],
        ["all"],
        ["status", "proxy"],
        &kinds::service::Service
    ),
    res!(
        "",
        "v1",
        "Endpoints",
        "endpoints",
        "endpoints",
        true,
        ["ep"],
        [],
        [],
        &kinds::network::Endpoints
    ),
    res!(
        "",
        "v1",
        "ConfigMap",
        "configmaps",
        "configmap",
        true,
        ["cm"],
        [],
        [],
        &kinds::config::ConfigMap
    ),
    res!(
        "",
        "v1",
        "Secret",
        "secrets",
        "secret",
        true,
        [],
        [],
        [],
        &kinds::config::Secret
    ),
    res!(
        "",
        "v1",
        "ServiceAccount",
        "serviceaccounts",
        "serviceaccount",
        true,
        ["sa"],
        [],
        ["token"],
        &kinds::config::ServiceAccount
    ),
    res!(
        "",
        "v1",
        "Event",
        "events",
        "event",
        true,
        ["ev"],
        [],
        [],
        &kinds::event::CoreEvent
    ),
    res!(
        "",
        "v1",
        "PodTemplate",
        "podtemplates",
        "podtemplate",
        true,
        [],
        [],
        [],
        &kinds::workloads::PodTemplate
    ),
    res!(
        "",
        "v1",
        "ReplicationController",
        "replicationcontrollers",
        "replicationcontroller",
        true,
        ["rc"],
        ["all"],
        ["status", "scale"],
        &kinds::workloads::ReplicationController
    ),
    res!(
        "",
        "v1",
        "ResourceQuota",
        "resourcequotas",
        "resourcequota",
        true,
        ["quota"],
        [],
        ["status"],
        &kinds::policy::ResourceQuota
    ),
    res!(
        "",
        "v1",
        "LimitRange",
        "limitranges",
        "limitrange",
        true,
        ["limits"],
        [],
        [],
        &kinds::policy::LimitRange
    ),
    res!(
        "",
        "v1",
        "PersistentVolume",
        "persistentvolumes",
        "persistentvolume",
        false,
        ["pv"],
        [],
        ["status"],
        &kinds::storage::PersistentVolume
    ),
    res!(
        "",
        "v1",
        "PersistentVolumeClaim",
        "persistentvolumeclaims",
        "persistentvolumeclaim",
        true,
        ["pvc"],
        [],
        ["status"],
        &kinds::storage::PersistentVolumeClaim
    ),
    // apps/v1
    res!(
        "apps",
        "v1",
        "Deployment",
        "deployments",
        "deployment",
        true,
        ["deploy"],
        ["all"],
        ["status", "scale"],
        &kinds::workloads::Deployment
    ),
    res!(
        "apps",
        "v1",
        "ReplicaSet",
        "replicasets",
        "replicaset",
        true,
        ["rs"],
        ["all"],
        ["status", "scale"],
        &kinds::workloads::ReplicaSet
    ),
    res!(
        "apps",
        "v1",
        "StatefulSet",
        "statefulsets",
        "statefulset",
        true,
        ["sts"],
        ["all"],
        ["status", "scale"],
        &kinds::workloads::StatefulSet
    ),
    res!(
        "apps",
        "v1",
        "DaemonSet",
        "daemonsets",
        "daemonset",
        true,
        ["ds"],
        ["all"],
        ["status"],
        &kinds::workloads::DaemonSet
    ),
    res!(
        "apps",
        "v1",
        "ControllerRevision",
        "controllerrevisions",
        "controllerrevision",
        true,
        [],
        [],
        [],
        &kinds::workloads::ControllerRevision
    ),
    // batch/v1
    res!(
        "batch",
        "v1",
        "Job",
        "jobs",
        "job",
        true,
        [],
        ["all"],
        ["status"],
        &kinds::batch::Job
    ),
    res!(
        "batch",
        "v1",
        "CronJob",
        "cronjobs",
        "cronjob",
        true,
        ["cj"],
        ["all"],
        ["status"],
        &kinds::batch::CronJob
    ),
    // autoscaling (v2 is the stored form; v1 is served from the same storage)
    res!(
        "autoscaling",
        "v2",
        "HorizontalPodAutoscaler",
        "horizontalpodautoscalers",
        "horizontalpodautoscaler",
        true,
        ["hpa"],
        ["all"],
        ["status"],
        &kinds::autoscaling::HorizontalPodAutoscaler
    ),
    res!(
        "autoscaling",
        "v1",
        "HorizontalPodAutoscaler",
        "horizontalpodautoscalers",
        "horizontalpodautoscaler",
        true,
        ["hpa"],
        ["all"],
        ["status"],
        &kinds::autoscaling::HorizontalPodAutoscaler
    ),
    // certificates.k8s.io/v1
    res!(
        "certificates.k8s.io",
        "v1",
        "CertificateSigningRequest",
        "certificatesigningrequests",
        "certificatesigningrequest",
        false,
        ["csr"],
        [],
        ["approval", "status"],
        &kinds::certificates::CertificateSigningRequest
    ),
    // coordination.k8s.io/v1
    res!(
        "coordination.k8s.io",
        "v1",
        "Lease",
        "leases",
        "lease",
        true,
        [],
        [],
        [],
        &kinds::lease::Lease
    ),
    // discovery.k8s.io/v1
    res!(
        "discovery.k8s.io",
        "v1",
        "EndpointSlice",
        "endpointslices",
        "endpointslice",
        true,
        [],
        [],
        [],
        &kinds::network::EndpointSlice
    ),
    // events.k8s.io/v1 (stored as core/v1 Events, as Kubernetes does)
    res!(
        "events.k8s.io",
        "v1",
        "Event",
        "events",
        "event",
        true,
        ["ev"],
        [],
        [], &kinds::event::EventsEvent, stored_as "/events"
    ),
    // policy/v1
    res!(
        "policy",
        "v1",
        "PodDisruptionBudget",
        "poddisruptionbudgets",
        "poddisruptionbudget",
        true,
        ["pdb"],
        [],
        ["status"],
        &kinds::policy::PodDisruptionBudget
    ),
    // networking.k8s.io/v1 (enforced by the agents' service proxy)
    res!(
        "networking.k8s.io",
        "v1",
        "NetworkPolicy",
        "networkpolicies",
        "networkpolicy",
        true,
        ["netpol"],
        [],
        [],
        &kinds::network::NetworkPolicy
    ),
    // scheduling.k8s.io/v1
    res!(
        "scheduling.k8s.io",
        "v1",
        "PriorityClass",
        "priorityclasses",
        "priorityclass",
        false,
        ["pc"],
        [],
        [],
        &kinds::policy::PriorityClass
    ),
    // rbac.authorization.k8s.io/v1
    res!(
        "rbac.authorization.k8s.io",
        "v1",
        "Role",
        "roles",
        "role",
        true,
        [],
        [],
        [],
        &kinds::rbac::Role("Role")
    ),
    res!(
        "rbac.authorization.k8s.io",
        "v1",
        "RoleBinding",
        "rolebindings",
        "rolebinding",
        true,
        [],
        [],
        [],
        &kinds::rbac::RoleBinding("RoleBinding")
    ),
    res!(
        "rbac.authorization.k8s.io",
        "v1",
        "ClusterRole",
        "clusterroles",
        "clusterrole",
        false,
        [],
        [],
        [],
        &kinds::rbac::Role("ClusterRole")
    ),
    res!(
        "rbac.authorization.k8s.io",
        "v1",
        "ClusterRoleBinding",
        "clusterrolebindings",
        "clusterrolebinding",
        false,
        [],
        [],
        [],
        &kinds::rbac::RoleBinding("ClusterRoleBinding")
    ),
    res!(
        "networking.k8s.io",
        "v1",
        "IngressClass",
        "ingressclasses",
        "ingressclass",
        false,
        [],
        [],
        [],
        &kinds::ingress_class::IngressClass
    ),
    res!(
        "networking.k8s.io",
        "v1",
        "Ingress",
        "ingresses",
        "ingress",
        true,
        ["ing"],
        [],
        ["status"],
        &kinds::ingress::Ingress
    ),
    // admissionregistration.k8s.io/v1
    res!(
        "admissionregistration.k8s.io",
        "v1",
        "MutatingWebhookConfiguration",
        "mutatingwebhookconfigurations",
        "mutatingwebhookconfiguration",
        false,
        [],
        ["api-extensions"],
        [],
        &kinds::admissionregistration::MUTATING
    ),
    res!(
        "admissionregistration.k8s.io",
        "v1",
        "ValidatingWebhookConfiguration",
        "validatingwebhookconfigurations",
        "validatingwebhookconfiguration",
        false,
        [],
        ["api-extensions"],
        [],
        &kinds::admissionregistration::VALIDATING
    ),
    res!(
        "admissionregistration.k8s.io",
        "v1",
        "ValidatingAdmissionPolicy",
        "validatingadmissionpolicies",
        "validatingadmissionpolicy",
        false,
        [],
        ["api-extensions"],
        ["status"],
        &kinds::admissionregistration::ValidatingAdmissionPolicy
    ),
    res!(
        "admissionregistration.k8s.io",
        "v1",
        "ValidatingAdmissionPolicyBinding",
        "validatingadmissionpolicybindings",
        "validatingadmissionpolicybinding",
        false,
        [],
        ["api-extensions"],
        [],
        &kinds::admissionregistration::ValidatingAdmissionPolicyBinding
    ),
    // apiregistration.k8s.io/v1
    res!(
        "apiregistration.k8s.io",
        "v1",
        "APIService",
        "apiservices",
        "apiservice",
        false,
        [],
        ["api-extensions"],
        ["status"],
        &kinds::apiservice::ApiService
    ),
    // authentication.k8s.io/v1 and authorization.k8s.io/v1 (reviews, not stored)
    res!(
        "authentication.k8s.io",
        "v1",
        "SelfSubjectReview",
        "selfsubjectreviews",
        "selfsubjectreview",
        false,
        [],
        [],
        [],
        &kinds::PLAIN
    ),
    res!(
        "authentication.k8s.io",
        "v1",
        "TokenReview",
        "tokenreviews",
        "tokenreview",
        false,
        [],
        [],
        [],
        &kinds::PLAIN
    ),
    res!(
        "authorization.k8s.io",
        "v1",
        "LocalSubjectAccessReview",
        "localsubjectaccessreviews",
        "localsubjectaccessreview",
        true,
        [],
        [],
        [],
        &kinds::PLAIN
    ),
    res!(
        "authorization.k8s.io",
        "v1",
        "SelfSubjectAccessReview",
        "selfsubjectaccessreviews",
        "selfsubjectaccessreview",
        false,
        [],
        [],
        [],
        &kinds::PLAIN
    ),
    res!(
        "authorization.k8s.io",
        "v1",
        "SelfSubjectRulesReview",
        "selfsubjectrulesreviews",
        "selfsubjectrulesreview",
        false,
        [],
        [],
        [],
        &kinds::PLAIN
    ),
    res!(
        "authorization.k8s.io",
        "v1",
        "SubjectAccessReview",
        "subjectaccessreviews",
        "subjectaccessreview",
        false,
        [],
        [],
        [],
        &kinds::PLAIN
    ),
    // apiextensions.k8s.io/v1
    res!(
        "apiextensions.k8s.io",
        "v1",
        "CustomResourceDefinition",
        "customresourcedefinitions",
        "customresourcedefinition",
        false,
        ["crd", "crds"],
        ["api-extensions"],
        ["status"],
        &kinds::crd::CustomResourceDefinition
    ),
    // storage.k8s.io/v1
    res!(
        "storage.k8s.io",
        "v1",
        "StorageClass",
        "storageclasses",
        "storageclass",
        false,
        ["sc"],
        [],
        [],
        &kinds::storage::StorageClass
    ),
];

/// The resource served at `group/version/plural`.
pub fn lookup(group: &str, version: &str, plural: &str) -> Option<&'static ResourceInfo> {
    RESOURCES
        .iter()
        .find(|r| r.group == group && r.version == version && r.plural == plural)
}

/// The resource of a kind at `apiVersion` (`apps/v1`, `v1`).
pub fn lookup_kind(api_version: &str, kind: &str) -> Option<&'static ResourceInfo> {
    let (group, version) = split_api_version(api_version);
    RESOURCES
        .iter()
        .find(|r| r.group == group && r.version == version && r.kind == kind)
}

/// `apps/v1` → (`apps`, `v1`); `v1` → (``, `v1`).
pub fn split_api_version(api_version: &str) -> (&str, &str) {
    match api_version.split_once('/') {
        Some((g, v)) => (g, v),
        None => ("", api_version),
    }
}

/// Groups with their versions, preferred version first, in discovery order.
pub fn groups() -> Vec<(&'static str, Vec<&'static str>)> {
    let mut out: Vec<(&'static str, Vec<&'static str>)> = Vec::new();
    for r in RESOURCES {
        if r.group.is_empty() {
            continue;
        }
        match out.iter_mut().find(|(g, _)| *g == r.group) {
            Some((_, versions)) => {
                if !versions.contains(&r.version) {
                    versions.push(r.version);
                }
            }
            None => out.push((r.group, vec![r.version])),
        }
    }
    out
}

/// The resources one API server serves: the built-in [`RESOURCES`] and
/// the served versions of every Established CustomResourceDefinition
/// (published by the server as definitions change). Readers take a
/// snapshot; a change replaces it whole.
#[derive(Default)]
pub struct Catalog {
    custom: std::sync::RwLock<std::sync::Arc<Vec<&'static ResourceInfo>>>,
}

impl fmt::Debug for Catalog {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Catalog")
            .field("custom", &self.custom().len())
            .finish()
    }
}

impl Catalog {
    pub fn new() -> Catalog {
        Catalog::default()
    }

    /// The custom resources served now.
    pub fn custom(&self) -> std::sync::Arc<Vec<&'static ResourceInfo>> {
        self.custom
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Replaces the custom resources served.
    pub fn set_custom(&self, resources: Vec<&'static ResourceInfo>) {
        *self.custom.write().unwrap_or_else(|e| e.into_inner()) = std::sync::Arc::new(resources);
    }

    /// Every resource served: built-ins first, in discovery order.
    pub fn all(&self) -> Vec<&'static ResourceInfo> {
        let custom = self.custom();
        RESOURCES.iter().chain(custom.iter().copied()).collect()
    }

    /// The resource served at `group/version/plural`.
    pub fn lookup(
        &self,
        group: &str,
        version: &str,
        plural: &str,
    ) -> Option<&'static ResourceInfo> {
        lookup(group, version, plural).or_else(|| {
            self.custom()
                .iter()
                .copied()
                .find(|r| r.group == group && r.version == version && r.plural == plural)
        })
    }

    /// The resource of a kind at `apiVersion`.
    pub fn lookup_kind(&self, api_version: &str, kind: &str) -> Option<&'static ResourceInfo> {
        lookup_kind(api_version, kind).or_else(|| {
            let (group, version) = split_api_version(api_version);
            self.custom()
                .iter()
                .copied()
                .find(|r| r.group == group && r.version == version && r.kind == kind)
        })
    }

    /// Groups with their versions, preferred version first: the built-in
    /// groups, then the custom ones (versions by Kubernetes' priority).
    pub fn groups(&self) -> Vec<(&'static str, Vec<&'static str>)> {
        let mut out = groups();
        for r in self.custom().iter() {
            match out.iter_mut().find(|(g, _)| *g == r.group) {
                Some((_, versions)) => {
                    if !versions.contains(&r.version) {
                        versions.push(r.version);
                        crate::kinds::crd::sort_versions(versions);
                    }
                }
                None => out.push((r.group, vec![r.version])),
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_resource_is_unique_per_group_version() {
        for (i, a) in RESOURCES.iter().enumerate() {
            for b in &RESOURCES[i + 1..] {
                assert!(
                    !(a.group == b.group && a.version == b.version && a.plural == b.plural),
                    "{} {}/{} twice",
                    a.plural,
                    a.group,
                    a.version
                );
            }
        }
    }

    #[test]
    fn autoscaling_prefers_v2_and_shares_storage() {
        let g = groups();
        let (_, versions) = g.iter().find(|(g, _)| *g == "autoscaling").unwrap();
        assert_eq!(versions, &vec!["v2", "v1"]);
        assert_eq!(
            lookup("autoscaling", "v1", "horizontalpodautoscalers")
                .unwrap()
                .storage,
            "autoscaling/horizontalpodautoscalers"
        );
    }
}
