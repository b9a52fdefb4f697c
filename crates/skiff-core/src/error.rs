//! API errors as Kubernetes reports them: an HTTP code beside a `Status` object
//! with reason, message and causes.

use serde_json::{json, Value};

/// One field-level cause of an error (`details.causes[]` in a `Status`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cause {
    /// Kubernetes' cause type, e.g. `FieldValueRequired`, `FieldValueInvalid`.
    pub reason: String,
    pub message: String,
    /// The JSON field path, e.g. `spec.containers[0].image`.
    pub field: String,
}

impl Cause {
    pub fn new(reason: &str, field: impl Into<String>, message: impl Into<String>) -> Self {
        Cause {
            reason: reason.to_string(),
            message: message.into(),
            field: field.into(),
        }
    }
    /// `Required value` (FieldValueRequired).
    pub fn required(field: impl Into<String>) -> Self {
        Cause::new("FieldValueRequired", field, "Required value")
    }
    /// `Invalid value: <v>: <detail>` (FieldValueInvalid).
    pub fn invalid(field: impl Into<String>, value: &Value, detail: &str) -> Self {
        let shown = match value {
            Value::String(s) => format!("{s:?}"),
            other => other.to_string(),
        };
        Cause::new(
            "FieldValueInvalid",
            field,
            format!("Invalid value: {shown}: {detail}"),
        )
    }
    /// `Unsupported value: <v>: supported values: ...` (FieldValueNotSupported).
    pub fn not_supported(field: impl Into<String>, value: &Value, supported: &[&str]) -> Self {
        let shown = match value {
            Value::String(s) => format!("{s:?}"),
            other => other.to_string(),
        };
        let list: Vec<String> = supported.iter().map(|s| format!("{s:?}")).collect();
        Cause::new(
            "FieldValueNotSupported",
            field,
            format!(
                "Unsupported value: {shown}: supported values: {}",
                list.join(", ")
            ),
        )
    }
    /// `Forbidden: <detail>` (FieldValueForbidden).
    pub fn forbidden(field: impl Into<String>, detail: &str) -> Self {
        Cause::new("FieldValueForbidden", field, format!("Forbidden: {detail}"))
    }
    /// `Duplicate value: <v>` (FieldValueDuplicate).
    pub fn duplicate(field: impl Into<String>, value: &Value) -> Self {
        Cause::new(
            "FieldValueDuplicate",
            field,
            format!("Duplicate value: {value}"),
        )
    }
}

/// An error the API returns to a client.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiError {
    pub code: u16,
    /// `StatusReason`, e.g. `NotFound`, `AlreadyExists`, `Conflict`, `Invalid`.
    pub reason: String,
    pub message: String,
    /// `details.name`, `details.group`, `details.kind`.
    pub name: Option<String>,
    pub group: Option<String>,
    pub kind: Option<String>,
    pub causes: Vec<Cause>,
    pub retry_after_seconds: Option<u32>,
    /// `Warning` headers the response carries (admission's, when a
    /// webhook or policy that warned then denied).
    pub warnings: Vec<String>,
}

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} ({}): {}", self.reason, self.code, self.message)
    }
}

impl std::error::Error for ApiError {}

/// `resource.group` the way Kubernetes prints a GroupResource (`pods`, `deployments.apps`).
pub fn group_resource(group: &str, resource: &str) -> String {
    if group.is_empty() {
        resource.to_string()
    } else {
        format!("{resource}.{group}")
    }
}

impl ApiError {
    pub fn new(code: u16, reason: &str, message: impl Into<String>) -> Self {
        ApiError {
            code,
            reason: reason.to_string(),
            message: message.into(),
            name: None,
            group: None,
            kind: None,
            causes: Vec::new(),
            retry_after_seconds: None,
            warnings: Vec::new(),
        }
    }

    /// The error with `warnings` added to its `Warning` headers.
    pub fn with_warnings(mut self, warnings: Vec<String>) -> Self {
        self.warnings.extend(warnings);
        self
    }

    fn with_details(mut self, group: &str, kind: &str, name: &str) -> Self {
        self.group = Some(group.to_string());
        self.kind = Some(kind.to_string());
        self.name = Some(name.to_string());
        self
    }

    /// 404: `pods "x" not found`. `resource` is the plural name.
    pub fn not_found(group: &str, resource: &str, name: &str) -> Self {
        ApiError::new(
            404,
            "NotFound",
            format!("{} {name:?} not found", group_resource(group, resource)),
        )
        .with_details(group, resource, name)
    }

    /// 409: `pods "x" already exists`.
    pub fn already_exists(group: &str, resource: &str, name: &str) -> Self {
        ApiError::new(
            409,
            "AlreadyExists",
            format!(
                "{} {name:?} already exists",
                group_resource(group, resource)
            ),
        )
        .with_details(group, resource, name)
    }

    /// 409 Conflict with Kubernetes' wording for a stale resourceVersion.
    pub fn conflict(group: &str, resource: &str, name: &str, detail: &str) -> Self {
        ApiError::new(
            409,
            "Conflict",
            format!(
                "Operation cannot be fulfilled on {} {name:?}: {detail}",
                group_resource(group, resource)
            ),
        )
        .with_details(group, resource, name)
    }

    /// The usual detail of a stale-resourceVersion conflict.
    pub const STALE: &'static str = "the object has been modified; please apply your changes to the latest version and try again";

    /// 422: `Pod "x" is invalid: [spec.containers: Required value, ...]`
    /// (`Deployment.apps "x" is invalid: ...` for a kind with a group).
    pub fn invalid(group: &str, kind: &str, name: &str, causes: Vec<Cause>) -> Self {
        let parts: Vec<String> = causes
            .iter()
            .map(|c| {
                if c.field.is_empty() {
                    c.message.clone()
                } else {
                    format!("{}: {}", c.field, c.message)
                }
            })
            .collect();
        let summary = if parts.len() == 1 {
            parts[0].clone()
        } else {
            format!("[{}]", parts.join(", "))
        };
        // The group-qualified kind, as `schema.GroupKind` prints it.
        let qualified = if group.is_empty() {
            kind.to_string()
        } else {
            format!("{kind}.{group}")
        };
        let mut e = ApiError::new(
            422,
            "Invalid",
            format!("{qualified} {name:?} is invalid: {summary}"),
        )
        .with_details(group, kind, name);
        e.causes = causes;
        e
    }

    pub fn bad_request(message: impl Into<String>) -> Self {
        ApiError::new(400, "BadRequest", message)
    }
    pub fn unauthorized() -> Self {
        ApiError::new(401, "Unauthorized", "Unauthorized")
    }
    pub fn forbidden(message: impl Into<String>) -> Self {
        ApiError::new(403, "Forbidden", message)
    }
    pub fn method_not_allowed(message: impl Into<String>) -> Self {
        ApiError::new(405, "MethodNotAllowed", message)
    }
    pub fn not_acceptable(message: impl Into<String>) -> Self {
        ApiError::new(406, "NotAcceptable", message)
    }
    /// 410 Gone: the requested resourceVersion was compacted.
    pub fn gone(message: impl Into<String>) -> Self {
        ApiError::new(410, "Expired", message)
    }
    pub fn too_large(message: impl Into<String>) -> Self {
        ApiError::new(413, "RequestEntityTooLarge", message)
    }
    pub fn unsupported_media_type(content_type: &str) -> Self {
        ApiError::new(415, "UnsupportedMediaType", format!("the body of the request was in an unknown format - accepted media types include: application/json, application/yaml, application/vnd.kubernetes.protobuf; got {content_type:?}"))
    }
    pub fn too_many_requests(message: impl Into<String>, retry_after: u32) -> Self {
        let mut e = ApiError::new(429, "TooManyRequests", message);
        e.retry_after_seconds = Some(retry_after);
        e
    }
    pub fn internal(message: impl Into<String>) -> Self {
        ApiError::new(
            500,
            "InternalError",
            format!("Internal error occurred: {}", message.into()),
        )
    }
    pub fn timeout(message: impl Into<String>) -> Self {
        ApiError::new(504, "Timeout", message)
    }

    /// The `Status` object (`kind: Status, apiVersion: v1`) a client receives.
    pub fn to_status(&self) -> Value {
        let mut status = json!({
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        });
        let mut details = serde_json::Map::new();
        if let Some(n) = &self.name {
            details.insert("name".into(), json!(n));
        }
        if let Some(g) = &self.group {
            if !g.is_empty() {
                details.insert("group".into(), json!(g));
            }
        }
        if let Some(k) = &self.kind {
            details.insert("kind".into(), json!(k));
        }
        if !self.causes.is_empty() {
            let causes: Vec<Value> = self
                .causes
                .iter()
                .map(|c| json!({"reason": c.reason, "message": c.message, "field": c.field}))
                .collect();
            details.insert("causes".into(), Value::Array(causes));
        }
        if let Some(r) = self.retry_after_seconds {
            details.insert("retryAfterSeconds".into(), json!(r));
        }
        if !details.is_empty() {
            status["details"] = Value::Object(details);
        }
        status
    }
}

/// Result alias for the API's fallible steps.
pub type ApiResult<T> = Result<T, ApiError>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn not_found_reads_as_kubernetes_prints_it() {
        let e = ApiError::not_found("apps", "deployments", "web");
        assert_eq!(e.message, "deployments.apps \"web\" not found");
        let s = e.to_status();
        assert_eq!(s["code"], 404);
        assert_eq!(s["details"]["group"], "apps");
    }

    #[test]
    fn invalid_lists_each_cause_with_its_field() {
        let e = ApiError::invalid("", "Pod", "p", vec![Cause::required("spec.containers")]);
        assert_eq!(
            e.message,
            "Pod \"p\" is invalid: spec.containers: Required value"
        );
        assert_eq!(
            e.to_status()["details"]["causes"][0]["field"],
            "spec.containers"
        );
    }
}
