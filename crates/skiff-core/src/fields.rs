//! Which field selectors each kind supports, and an object's value for each.

use serde_json::Value;

use crate::resources::ResourceInfo;
use crate::ApiError;

/// The per-kind fields (beyond `metadata.name` and `metadata.namespace`) that
/// field selectors may use.
pub fn index_fields(res: &ResourceInfo) -> &'static [&'static str] {
    match (res.group, res.kind) {
        ("", "Pod") => &[
            "spec.nodeName",
            "spec.restartPolicy",
            "spec.schedulerName",
            "spec.serviceAccountName",
            "spec.hostNetwork",
            "status.phase",
            "status.podIP",
            "status.nominatedNodeName",
        ],
        ("", "Node") => &["spec.unschedulable"],
        ("", "Namespace") => &["status.phase"],
        ("", "Secret") => &["type"],
        ("", "Event") => &[
            "involvedObject.kind",
            "involvedObject.namespace",
            "involvedObject.name",
            "involvedObject.uid",
            "involvedObject.apiVersion",
            "involvedObject.resourceVersion",
            "involvedObject.fieldPath",
            "reason",
            "reportingComponent",
            "source",
            "type",
        ],
        ("events.k8s.io", "Event") => &[
            "regarding.kind",
            "regarding.namespace",
            "regarding.name",
            "reason",
            "type",
        ],
        ("", "ReplicationController") | ("apps", "ReplicaSet") => &["status.replicas"],
        ("batch", "Job") => &["status.successful"],
        ("", "Service") => &["spec.clusterIP", "spec.type"],
        ("", "PersistentVolumeClaim") => &["spec.volumeName"],
        _ => &[],
    }
}

fn scalar(v: Option<&Value>) -> Option<String> {
    match v? {
        Value::String(s) => Some(s.clone()),
        Value::Bool(b) => Some(b.to_string()),
        Value::Number(n) => Some(n.to_string()),
        _ => None,
    }
}

/// The value of `field` for `obj` as field selectors compare it.
pub fn field_value(res: &ResourceInfo, obj: &Value, field: &str) -> Option<String> {
    let ptr = format!("/{}", field.replace('.', "/"));
    match field {
        "metadata.name" | "metadata.namespace" => scalar(obj.pointer(&ptr)).or(Some(String::new())),
        "spec.hostNetwork" | "spec.unschedulable" => {
            Some(scalar(obj.pointer(&ptr)).unwrap_or_else(|| "false".into()))
        }
        "status.replicas" | "status.successful" => {
            Some(scalar(obj.pointer(&ptr)).unwrap_or_else(|| "0".into()))
        }
        "source" if res.kind == "Event" && res.group.is_empty() => {
            Some(scalar(obj.pointer("/source/component")).unwrap_or_default())
        }
        _ if index_fields(res).contains(&field) => {
            Some(scalar(obj.pointer(&ptr)).unwrap_or_default())
        }
        _ => None,
    }
}

/// 400 BadRequest for a field selector on a field the kind does not support.
pub fn check_supported(res: &ResourceInfo, field: &str) -> Result<(), ApiError> {
    let common = field == "metadata.name" || (field == "metadata.namespace" && res.namespaced);
    if common || index_fields(res).contains(&field) {
        Ok(())
    } else {
        Err(ApiError::bad_request(format!(
            "field label not supported: {field}"
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resources::lookup;
    use serde_json::json;

    #[test]
    fn an_unscheduled_pod_has_an_empty_node_name() {
        let pods = lookup("", "v1", "pods").unwrap();
        let pod = json!({"metadata": {"name": "p"}, "spec": {}, "status": {"phase": "Pending"}});
        assert_eq!(
            field_value(pods, &pod, "spec.nodeName").as_deref(),
            Some("")
        );
        assert_eq!(
            field_value(pods, &pod, "status.phase").as_deref(),
            Some("Pending")
        );
        assert_eq!(
            field_value(pods, &pod, "spec.hostNetwork").as_deref(),
            Some("false")
        );
    }

    #[test]
    fn unsupported_fields_are_a_bad_request() {
        let cms = lookup("", "v1", "configmaps").unwrap();
        let e = check_supported(cms, "data.x").unwrap_err();
        assert_eq!(
            (e.code, e.message.as_str()),
            (400, "field label not supported: data.x")
        );
        assert!(check_supported(cms, "metadata.name").is_ok());
    }
}
