//! The OpenAPI schemas of the served kinds (from k8s-openapi's schemars
//! implementations, named as Kubernetes names its definitions), navigable by
//! field, plus the list and patch metadata Kubernetes attaches to fields
//! (strategic-merge keys, server-side-apply list types), which the generated
//! schemas do not carry.

use std::collections::HashMap;
use std::sync::LazyLock;

use serde_json::{Map, Value};

/// A list's server-side-apply type.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ListType {
    Atomic,
    Set,
    Map(Vec<&'static str>),
}

/// What Kubernetes declares about one field beyond its type.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FieldMeta {
    /// `patchStrategy` (`merge`, `retainKeys`, `merge,retainKeys`).
    pub patch_strategy: Option<&'static str>,
    /// `patchMergeKey` of a list.
    pub merge_key: Option<&'static str>,
    /// `x-kubernetes-list-type` (with map keys).
    pub list_type: Option<ListType>,
    /// `x-kubernetes-map-type: atomic`.
    pub map_type_atomic: bool,
}

struct Schemas {
    defs: Map<String, Value>,
    roots: HashMap<(&'static str, &'static str, &'static str), &'static str>,
}

macro_rules! roots {
    ($gen:ident, $roots:ident; $( ($g:expr, $v:expr, $k:expr, $t:ty) ),* $(,)?) => {
        $(
            {
                let _ = $gen.subschema_for::<$t>();
                $roots.insert(($g, $v, $k), <$t as schemars::JsonSchema>::schema_name());
            }
        )*
    };
}

static SCHEMAS: LazyLock<Schemas> = LazyLock::new(|| {
    use k8s_openapi::api::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1 as meta;
    let mut gen = schemars::generate::SchemaSettings::draft07()
        .with(|s| s.definitions_path = "/definitions".into())
        .into_generator();
    let mut names: HashMap<
        (&'static str, &'static str, &'static str),
        std::borrow::Cow<'static, str>,
    > = HashMap::new();
    roots!(gen, names;
        ("", "v1", "Namespace", core::v1::Namespace),
        ("", "v1", "Pod", core::v1::Pod),
        ("", "v1", "Node", core::v1::Node),
        ("", "v1", "Service", core::v1::Service),
        ("", "v1", "Endpoints", core::v1::Endpoints),
        ("", "v1", "ConfigMap", core::v1::ConfigMap),
        ("", "v1", "Secret", core::v1::Secret),
        ("", "v1", "ServiceAccount", core::v1::ServiceAccount),
        ("", "v1", "Event", core::v1::Event),
        ("", "v1", "PodTemplate", core::v1::PodTemplate),
        ("", "v1", "ReplicationController", core::v1::ReplicationController),
        ("", "v1", "ResourceQuota", core::v1::ResourceQuota),
        ("", "v1", "LimitRange", core::v1::LimitRange),
        ("", "v1", "PersistentVolume", core::v1::PersistentVolume),
        ("", "v1", "PersistentVolumeClaim", core::v1::PersistentVolumeClaim),
        ("", "v1", "Binding", core::v1::Binding),
        ("apps", "v1", "Deployment", apps::v1::Deployment),
        ("apps", "v1", "ReplicaSet", apps::v1::ReplicaSet),
        ("apps", "v1", "StatefulSet", apps::v1::StatefulSet),
        ("apps", "v1", "DaemonSet", apps::v1::DaemonSet),
        ("apps", "v1", "ControllerRevision", apps::v1::ControllerRevision),
        ("batch", "v1", "Job", batch::v1::Job),
        ("batch", "v1", "CronJob", batch::v1::CronJob),
        ("autoscaling", "v2", "HorizontalPodAutoscaler", autoscaling::v2::HorizontalPodAutoscaler),
        ("autoscaling", "v1", "HorizontalPodAutoscaler", autoscaling::v1::HorizontalPodAutoscaler),
        ("autoscaling", "v1", "Scale", autoscaling::v1::Scale),
        ("certificates.k8s.io", "v1", "CertificateSigningRequest", certificates::v1::CertificateSigningRequest),
        ("coordination.k8s.io", "v1", "Lease", coordination::v1::Lease),
        ("discovery.k8s.io", "v1", "EndpointSlice", discovery::v1::EndpointSlice),
        ("events.k8s.io", "v1", "Event", events::v1::Event),
        ("policy", "v1", "PodDisruptionBudget", policy::v1::PodDisruptionBudget),
        ("policy", "v1", "Eviction", policy::v1::Eviction),
        ("scheduling.k8s.io", "v1", "PriorityClass", scheduling::v1::PriorityClass),
        ("admissionregistration.k8s.io", "v1", "MutatingWebhookConfiguration", admissionregistration::v1::MutatingWebhookConfiguration),
        ("admissionregistration.k8s.io", "v1", "ValidatingWebhookConfiguration", admissionregistration::v1::ValidatingWebhookConfiguration),
        ("admissionregistration.k8s.io", "v1", "ValidatingAdmissionPolicy", admissionregistration::v1::ValidatingAdmissionPolicy),
        ("admissionregistration.k8s.io", "v1", "ValidatingAdmissionPolicyBinding", admissionregistration::v1::ValidatingAdmissionPolicyBinding),
        ("apiregistration.k8s.io", "v1", "APIService", crate::kinds::apiservice::types::APIService),
        ("networking.k8s.io", "v1", "IngressClass", networking::v1::IngressClass),
        ("networking.k8s.io", "v1", "Ingress", networking::v1::Ingress),
        ("networking.k8s.io", "v1", "NetworkPolicy", networking::v1::NetworkPolicy),
        ("rbac.authorization.k8s.io", "v1", "Role", rbac::v1::Role),
        ("rbac.authorization.k8s.io", "v1", "RoleBinding", rbac::v1::RoleBinding),
        ("rbac.authorization.k8s.io", "v1", "ClusterRole", rbac::v1::ClusterRole),
        ("rbac.authorization.k8s.io", "v1", "ClusterRoleBinding", rbac::v1::ClusterRoleBinding),
        ("storage.k8s.io", "v1", "StorageClass", storage::v1::StorageClass),
        ("apiextensions.k8s.io", "v1", "CustomResourceDefinition", k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition),
        ("authentication.k8s.io", "v1", "SelfSubjectReview", authentication::v1::SelfSubjectReview),
        ("authorization.k8s.io", "v1", "SelfSubjectAccessReview", authorization::v1::SelfSubjectAccessReview),
        ("authorization.k8s.io", "v1", "SelfSubjectRulesReview", authorization::v1::SelfSubjectRulesReview),
        ("authorization.k8s.io", "v1", "SubjectAccessReview", authorization::v1::SubjectAccessReview),
        ("authorization.k8s.io", "v1", "LocalSubjectAccessReview", authorization::v1::LocalSubjectAccessReview),
        ("authentication.k8s.io", "v1", "TokenReview", authentication::v1::TokenReview),
        ("authentication.k8s.io", "v1", "TokenRequest", authentication::v1::TokenRequest),
        ("meta.k8s.io", "v1", "Status", meta::Status),
        ("meta.k8s.io", "v1", "DeleteOptions", meta::DeleteOptions),
        ("meta.k8s.io", "v1", "WatchEvent", meta::WatchEvent<k8s_openapi::apimachinery::pkg::runtime::RawExtension>),
    );
    let defs = gen.take_definitions(true);
    let roots = names
        .into_iter()
        .map(|(k, v)| {
            let leaked: &'static str = Box::leak(v.into_owned().into_boxed_str());
            (k, leaked)
        })
        .collect();
    Schemas { defs, roots }
});

/// Every definition, name → schema, with `$ref`s as `#/definitions/<name>`.
pub fn definitions() -> &'static Map<String, Value> {
    &SCHEMAS.defs
}

/// The definition name of a served kind's root type (`io.k8s.api.core.v1.Pod`).
pub fn definition_name(group: &str, version: &str, kind: &str) -> Option<&'static str> {
    SCHEMAS
        .roots
        .iter()
        .find(|((g, v, k), _)| *g == group && *v == version && *k == kind)
        .map(|(_, n)| *n)
}

/// A position in the schemas: a definition or an inline schema.
#[derive(Clone, Copy, Debug)]
pub struct TypeRef {
    schema: &'static Value,
    definition: Option<&'static str>,
}

/// The root type of a served kind.
pub fn root(group: &str, version: &str, kind: &str) -> Option<TypeRef> {
    let name = definition_name(group, version, kind)?;
    let (key, schema) = SCHEMAS.defs.get_key_value(name)?;
    Some(TypeRef {
        schema,
        definition: Some(key.as_str()),
    })
}

fn resolve(schema: &'static Value, definition: Option<&'static str>) -> TypeRef {
    let mut s = schema;
    let mut def = definition;
    for _ in 0..8 {
        let r = s.get("$ref").and_then(Value::as_str).or_else(|| {
            s.get("allOf")
                .and_then(|a| a.get(0))
                .and_then(|x| x.get("$ref"))
                .and_then(Value::as_str)
        });
        match r.and_then(|r| r.strip_prefix("#/definitions/")) {
            Some(name) => match SCHEMAS.defs.get_key_value(name) {
                Some((k, v)) => {
                    s = v;
                    def = Some(k.as_str());
                }
                None => break,
            },
            None => break,
        }
    }
    TypeRef {
        schema: s,
        definition: def,
    }
}

fn has_type(s: &Value, t: &str) -> bool {
    match s.get("type") {
        Some(Value::String(x)) => x == t,
        Some(Value::Array(a)) => a.iter().any(|x| x == t),
        _ => false,
    }
}

impl TypeRef {
    /// A custom resource's schema (a CRD's `openAPIV3Schema`): list and map
    /// types come from its `x-kubernetes-*` extensions, and `metadata` is
    /// Kubernetes' ObjectMeta.
    pub fn custom(schema: &'static Value) -> TypeRef {
        TypeRef {
            schema,
            definition: None,
        }
    }

    /// An object property and its metadata.
    pub fn field(&self, name: &str) -> Option<(TypeRef, FieldMeta)> {
        let prop = self.schema.get("properties")?.get(name)?;
        let t = resolve(prop, None);
        Some((
            t,
            match self.definition {
                Some(d) => field_meta(d, name),
                None => extension_meta(prop),
            },
        ))
    }

    /// An object property's type alone (no list or map metadata): for
    /// walks that only follow the schema.
    pub fn field_type(&self, name: &str) -> Option<TypeRef> {
        self.schema
            .get("properties")?
            .get(name)
            .map(|prop| resolve(prop, None))
    }

    /// The items of an array.
    pub fn items(&self) -> Option<TypeRef> {
        self.schema.get("items").map(|i| resolve(i, None))
    }

    /// The values of a map (`additionalProperties`).
    pub fn additional(&self) -> Option<TypeRef> {
        match self.schema.get("additionalProperties") {
            Some(Value::Bool(true)) => Some(TypeRef {
                schema: &Value::Null,
                definition: None,
            }),
            Some(v @ Value::Object(_)) => Some(resolve(v, None)),
            _ => None,
        }
    }

    /// A structured object with known properties.
    pub fn is_object(&self) -> bool {
        self.schema.get("properties").is_some()
    }
    pub fn is_array(&self) -> bool {
        has_type(self.schema, "array")
    }
    /// A map with free keys.
    pub fn is_map(&self) -> bool {
        self.schema.get("properties").is_none() && self.schema.get("additionalProperties").is_some()
    }
    /// A type the schema does not describe (IntOrString, Quantity, raw JSON…): anything goes.
    pub fn is_opaque(&self) -> bool {
        !self.is_object()
            && !self.is_map()
            && !self.is_array()
            && !["string", "integer", "number", "boolean"]
                .iter()
                .any(|t| has_type(self.schema, t))
    }
    pub fn definition(&self) -> Option<&'static str> {
        self.definition
    }
    /// The schema object itself (type, format, …).
    pub fn schema_value(&self) -> &'static Value {
        self.schema
    }
}

/// The list and map types a CRD schema declares with `x-kubernetes-list-type`,
/// `x-kubernetes-list-map-keys` and `x-kubernetes-map-type`.
fn extension_meta(prop: &'static Value) -> FieldMeta {
    let list_type = match prop.get("x-kubernetes-list-type").and_then(Value::as_str) {
        Some("set") => Some(ListType::Set),
        Some("map") => Some(ListType::Map(
            prop.get("x-kubernetes-list-map-keys")
                .and_then(Value::as_array)
                .map(|a| a.iter().filter_map(Value::as_str).collect())
                .unwrap_or_default(),
        )),
        Some(_) => Some(ListType::Atomic),
        None if has_type(prop, "array") => Some(ListType::Atomic),
        None => None,
    };
    FieldMeta {
        patch_strategy: None,
        merge_key: None,
        list_type,
        map_type_atomic: prop.get("x-kubernetes-map-type").and_then(Value::as_str)
            == Some("atomic"),
    }
}

/// Kubernetes' field tags for (definition, field).
pub fn field_meta(definition: &str, field: &str) -> FieldMeta {
    let short = definition.rsplit('.').next().unwrap_or(definition);
    let keyed = |key: &'static str, ssa: Vec<&'static str>| FieldMeta {
        patch_strategy: Some("merge"),
        merge_key: Some(key),
        list_type: Some(ListType::Map(ssa)),
        map_type_atomic: false,
    };
    match (short, field) {
        ("PodSpec", "containers" | "initContainers" | "ephemeralContainers") => {
            keyed("name", vec!["name"])
        }
        ("PodSpec", "volumes") => FieldMeta {
            patch_strategy: Some("merge,retainKeys"),
            ..keyed("name", vec!["name"])
        },
        ("PodSpec", "imagePullSecrets") => keyed("name", vec!["name"]),
        ("PodSpec", "hostAliases") => keyed("ip", vec!["ip"]),
        ("PodSpec", "topologySpreadConstraints") => {
            keyed("topologyKey", vec!["topologyKey", "whenUnsatisfiable"])
        }
        ("PodSpec", "resourceClaims" | "schedulingGates") => keyed("name", vec!["name"]),
        ("Container" | "EphemeralContainer", "ports") => {
            keyed("containerPort", vec!["containerPort", "protocol"])
        }
        ("Container" | "EphemeralContainer", "env") => keyed("name", vec!["name"]),
        ("Container" | "EphemeralContainer", "volumeMounts") => {
            keyed("mountPath", vec!["mountPath"])
        }
        ("Container" | "EphemeralContainer", "volumeDevices") => {
            keyed("devicePath", vec!["devicePath"])
        }
        ("ServiceSpec", "ports") => keyed("port", vec!["port", "protocol"]),
        ("ObjectMeta", "finalizers") => FieldMeta {
            patch_strategy: Some("merge"),
            merge_key: None,
            list_type: Some(ListType::Set),
            map_type_atomic: false,
        },
        ("ObjectMeta", "ownerReferences") => keyed("uid", vec!["uid"]),
        ("DeploymentSpec", "strategy") | ("DaemonSetSpec", "updateStrategy") => FieldMeta {
            patch_strategy: Some("retainKeys"),
            ..Default::default()
        },
        ("NodeStatus", "addresses") => keyed("type", vec!["type"]),
        ("MutatingWebhookConfiguration" | "ValidatingWebhookConfiguration", "webhooks") => {
            keyed("name", vec!["name"])
        }
        (_, "conditions") if short.ends_with("Status") => keyed("type", vec!["type"]),
        ("LabelSelector", "matchLabels") => FieldMeta::default(),
        ("LocalObjectReference" | "ObjectReference", _) => FieldMeta::default(),
        _ => FieldMeta {
            list_type: Some(ListType::Atomic),
            ..Default::default()
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pods_containers_are_keyed_by_name() {
        let pod = root("", "v1", "Pod").expect("pod schema");
        assert_eq!(pod.definition(), Some("io.k8s.api.core.v1.Pod"));
        let (spec, _) = pod.field("spec").unwrap();
        assert_eq!(spec.definition(), Some("io.k8s.api.core.v1.PodSpec"));
        let (containers, meta) = spec.field("containers").unwrap();
        assert_eq!(meta.merge_key, Some("name"));
        let c = containers.items().unwrap();
        assert_eq!(c.definition(), Some("io.k8s.api.core.v1.Container"));
        assert!(c.field("image").is_some());
        assert!(c.field("imagee").is_none());
    }

    #[test]
    fn every_served_kind_has_a_schema() {
        for r in crate::resources::RESOURCES {
            assert!(
                root(r.group, r.version, r.kind).is_some(),
                "{} {}",
                r.group,
                r.kind
            );
        }
        assert!(definitions().contains_key("io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta"));
    }

    #[test]
    fn labels_are_a_free_map() {
        let (meta, _) = root("", "v1", "ConfigMap")
            .unwrap()
            .field("metadata")
            .unwrap();
        let (labels, _) = meta.field("labels").unwrap();
        assert!(labels.is_map());
    }
}
