//! APIServices (`apiregistration.k8s.io/v1`): which server answers one
//! group/version. Local ones (no `service`) are the built-in groups; the
//! others are aggregated API servers the API server proxies to. Named
//! `<version>.<group>`; validated as kube-aggregator validates them; the
//! table shows the service and the Available condition. The schema is
//! written here because k8s-openapi carries no kube-aggregator types.

use super::prelude::*;

pub struct ApiService;

impl KindRules for ApiService {
    fn kind(&self) -> &'static str {
        "APIService"
    }

    /// kube-aggregator checks only that the name is a path segment (and
    /// `version.group`): the core group's is `v1.`, which is no DNS
    /// subdomain.
    fn name_rule(&self) -> NameRule {
        NameRule::PathSegment
    }

    fn defaults(&self, obj: &mut Value) {
        if let Some(svc) = obj
            .pointer_mut("/spec/service")
            .and_then(Value::as_object_mut)
        {
            set_default(svc, "port", json!(443));
        }
    }

    fn validate(&self, obj: &Value) -> Vec<Cause> {
        let mut c = Vec::new();
        let name = s(obj, "/metadata/name");
        let group = s(obj, "/spec/group");
        let version = s(obj, "/spec/version");
        if version.is_empty() {
            c.push(Cause::required("spec.version"));
        }
        let want = format!("{version}.{group}");
        if !name.is_empty() && name != want {
            c.push(Cause::invalid(
                "metadata.name",
                &json!(name),
                &format!("must be `spec.version+\".\"+spec.group`: {want:?}"),
            ));
        }
        let service = obj.pointer("/spec/service").filter(|v| !v.is_null());
        if let Some(svc) = service {
            let min = obj
                .pointer("/spec/groupPriorityMinimum")
                .and_then(Value::as_i64);
            if !matches!(min, Some(1..=20000)) {
                c.push(Cause::invalid(
                    "spec.groupPriorityMinimum",
                    &json!(min),
                    "must be positive and less than 20000",
                ));
            }
            let vp = obj.pointer("/spec/versionPriority").and_then(Value::as_i64);
            if !matches!(vp, Some(1..=1000)) {
                c.push(Cause::invalid(
                    "spec.versionPriority",
                    &json!(vp),
                    "must be positive and less than 1000",
                ));
            }
            if group.is_empty() {
                c.push(Cause::required("spec.group"));
            }
            for k in ["namespace", "name"] {
                if s(svc, &format!("/{k}")).is_empty() {
                    c.push(Cause::required(format!("spec.service.{k}")));
                }
            }
            if let Some(p) = svc.get("port").filter(|p| !p.is_null()) {
                if !matches!(p.as_i64(), Some(1..=65535)) {
                    c.push(Cause::invalid(
                        "spec.service.port",
                        p,
                        "port is not valid: must be between 1 and 65535, inclusive",
                    ));
                }
            }
        }
        let insecure = obj
            .pointer("/spec/insecureSkipTLSVerify")
            .and_then(Value::as_bool)
            .unwrap_or(false);
        let ca = s(obj, "/spec/caBundle");
        if insecure && !ca.is_empty() {
            c.push(Cause::invalid(
                "spec.insecureSkipTLSVerify",
                &json!(true),
                "may not be true if caBundle is present",
            ));
        }
        c
    }

    fn printer(&self) -> &'static Printer {
        &API_SERVICE_PRINTER
    }
}

pub static API_SERVICE_PRINTER: Printer = Printer {
    columns: &[
        NAME,
        col("Service", "string", 0),
        col("Available", "string", 0),
        AGE,
    ],
    cells: api_service_cells,
};

fn api_service_cells(obj: &Value, now: DateTime<Utc>) -> Vec<Value> {
    let service = match obj.pointer("/spec/service").filter(|v| v.is_object()) {
        Some(svc) => format!("{}/{}", s(svc, "/namespace"), s(svc, "/name")),
        None => "Local".into(),
    };
    let available = obj
        .pointer("/status/conditions")
        .and_then(Value::as_array)
        .and_then(|a| a.iter().find(|c| s(c, "/type") == "Available"))
        .map(|c| {
            let status = s(c, "/status");
            if status == "True" {
                status.to_string()
            } else {
                format!("{status} ({})", s(c, "/reason"))
            }
        })
        .unwrap_or_else(|| "Unknown".into());
    vec![
        json!(s(obj, "/metadata/name")),
        json!(service),
        json!(available),
        json!(age(obj, "/metadata/creationTimestamp", now)),
    ]
}

/// The OpenAPI types of APIService, named as kube-aggregator names them.
pub mod types {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
    use schemars::JsonSchema;

    /// Optional fields as Kubernetes' OpenAPI writes them: absent from
    /// `required`, never `["string", "null"]` (kubectl's validation refuses
    /// definitions with several types).
    fn no_null(schema: &mut schemars::Schema) {
        let Some(props) = schema.get_mut("properties").and_then(|p| p.as_object_mut()) else {
            return;
        };
        for p in props.values_mut() {
            let Some(p) = p.as_object_mut() else { continue };
            if let Some(serde_json::Value::Array(types)) = p.get("type").cloned() {
                let rest: Vec<_> = types.into_iter().filter(|t| t != "null").collect();
                if rest.len() == 1 {
                    p.insert("type".into(), rest[0].clone());
                }
            }
            // `Option<Struct>` is `anyOf: [{$ref}, {type: null}]`.
            if let Some(serde_json::Value::Array(any)) = p.get("anyOf").cloned() {
                let rest: Vec<_> = any
                    .into_iter()
                    .filter(|t| t.get("type") != Some(&"null".into()))
                    .collect();
                if rest.len() == 1 {
                    p.remove("anyOf");
                    if let Some(o) = rest[0].as_object() {
                        for (k, v) in o {
                            p.insert(k.clone(), v.clone());
                        }
                    }
                }
            }
        }
    }

    #[allow(dead_code)]
    #[derive(JsonSchema)]
    #[schemars(transform = no_null)]
    #[schemars(rename = "io.k8s.kube-aggregator.pkg.apis.apiregistration.v1.APIService")]
    #[serde(rename_all = "camelCase")]
    /// APIService represents a server for a particular GroupVersion.
    pub struct APIService {
        pub api_version: Option<String>,
        pub kind: Option<String>,
        pub metadata: Option<ObjectMeta>,
        pub spec: Option<APIServiceSpec>,
        pub status: Option<APIServiceStatus>,
    }

    #[allow(dead_code)]
    #[derive(JsonSchema)]
    #[schemars(transform = no_null)]
    #[schemars(rename = "io.k8s.kube-aggregator.pkg.apis.apiregistration.v1.APIServiceSpec")]
    #[serde(rename_all = "camelCase")]
    /// APIServiceSpec contains information for locating and communicating with a server.
    pub struct APIServiceSpec {
        pub service: Option<ServiceReference>,
        pub group: Option<String>,
        pub version: Option<String>,
        #[serde(rename = "insecureSkipTLSVerify")]
        pub insecure_skip_tls_verify: Option<bool>,
        pub ca_bundle: Option<String>,
        pub group_priority_minimum: i32,
        pub version_priority: i32,
    }

    #[allow(dead_code)]
    #[derive(JsonSchema)]
    #[schemars(transform = no_null)]
    #[schemars(rename = "io.k8s.kube-aggregator.pkg.apis.apiregistration.v1.ServiceReference")]
    /// ServiceReference holds a reference to Service.legacy.k8s.io
    pub struct ServiceReference {
        pub namespace: Option<String>,
        pub name: Option<String>,
        pub port: Option<i32>,
    }

    #[allow(dead_code)]
    #[derive(JsonSchema)]
    #[schemars(transform = no_null)]
    #[schemars(rename = "io.k8s.kube-aggregator.pkg.apis.apiregistration.v1.APIServiceStatus")]
    /// APIServiceStatus contains derived information about an API server
    pub struct APIServiceStatus {
        pub conditions: Option<Vec<APIServiceCondition>>,
    }

    #[allow(dead_code)]
    #[derive(JsonSchema)]
    #[schemars(transform = no_null)]
    #[schemars(rename = "io.k8s.kube-aggregator.pkg.apis.apiregistration.v1.APIServiceCondition")]
    #[serde(rename_all = "camelCase")]
    /// APIServiceCondition describes the state of an APIService at a particular point
    pub struct APIServiceCondition {
        #[serde(rename = "type")]
        pub type_: String,
        pub status: String,
        pub last_transition_time: Option<Time>,
        pub reason: Option<String>,
        pub message: Option<String>,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_api_service_schema_has_one_type_per_field_as_kubectl_needs() {
        let defs = crate::schema::definitions();
        let mut n = 0;
        for (name, d) in defs.iter().filter(|(k, _)| k.contains("kube-aggregator")) {
            n += 1;
            let text = d.to_string();
            assert!(!text.contains("\"null\""), "{name}: {text}");
        }
        assert_eq!(n, 5);
    }

    #[test]
    fn an_api_service_is_named_after_its_group_version_and_needs_priorities() {
        let ok = json!({"metadata": {"name": "v1alpha1.example.com"}, "spec": {
            "group": "example.com", "version": "v1alpha1", "groupPriorityMinimum": 1000,
            "versionPriority": 15, "service": {"namespace": "x", "name": "y"}}});
        assert!(ApiService.validate(&ok).is_empty());
        let mut bad = ok.clone();
        bad["metadata"]["name"] = json!("v1.other.com");
        bad["spec"]["versionPriority"] = json!(0);
        bad["spec"]["insecureSkipTLSVerify"] = json!(true);
        bad["spec"]["caBundle"] = json!("AAAA");
        let fields: Vec<String> = ApiService
            .validate(&bad)
            .into_iter()
            .map(|c| c.field)
            .collect();
        assert_eq!(
            fields,
            [
                "metadata.name",
                "spec.versionPriority",
                "spec.insecureSkipTLSVerify"
            ]
        );
        let local =
            json!({"metadata": {"name": "v1.apps"}, "spec": {"group": "apps", "version": "v1"}});
        assert!(ApiService.validate(&local).is_empty());
    }

    /// The core group's local APIService, which `kubectl get apiservices`
    /// lists first, is named `v1.`: its metadata is valid.
    #[test]
    fn the_core_groups_api_service_is_named_v1_dot() {
        let res = crate::resources::lookup("apiregistration.k8s.io", "v1", "apiservices").unwrap();
        let core = json!({"metadata": {"name": "v1."}, "spec": {"group": "", "version": "v1"}});
        let causes = crate::meta::validate_object_meta(res, &core, true);
        assert!(causes.is_empty(), "{causes:?}");
        assert!(ApiService.validate(&core).is_empty());
        let bad = json!({"metadata": {"name": "v1/x"}, "spec": {"group": "x", "version": "v1"}});
        assert_eq!(crate::meta::validate_object_meta(res, &bad, true).len(), 1);
    }
}
