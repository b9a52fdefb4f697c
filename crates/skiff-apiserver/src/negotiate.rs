//! Content negotiation: decoding request bodies by Content-Type and choosing
//! the response form (JSON, YAML, Table, PartialObjectMetadata) from Accept.

use bytes::Bytes;
use serde_json::Value;
use skiff_core::resources::ResourceInfo;
use skiff_core::ApiError;

use crate::options::PatchType;

/// The largest request body accepted (Kubernetes' limit is 3 MiB).
pub const MAX_BODY: usize = 3 * 1024 * 1024;

/// What the client wants back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Output {
    Json,
    Yaml,
    /// `as=Table` (meta.k8s.io v1 or v1beta1).
    Table {
        v1beta1: bool,
    },
    /// `as=PartialObjectMetadata` / `as=PartialObjectMetadataList`.
    PartialMetadata {
        v1beta1: bool,
    },
    /// `as=APIGroupDiscoveryList` (aggregated discovery v2 or v2beta1).
    Discovery {
        v2beta1: bool,
    },
}

/// Chooses the response form; `Err` 406 when nothing acceptable is served.
pub fn choose_output(accept: Option<&str>) -> Result<Output, ApiError> {
    let Some(accept) = accept.filter(|a| !a.trim().is_empty()) else {
        return Ok(Output::Json);
    };
    for range in accept.split(',') {
        let mut parts = range.split(';').map(str::trim);
        let mime = parts.next().unwrap_or("").to_ascii_lowercase();
        let mut as_ = None;
        let mut g = None;
        let mut v = None;
        for p in parts {
            if let Some((k, val)) = p.split_once('=') {
                match k.trim() {
                    "as" => as_ = Some(val.trim().to_string()),
                    "g" => g = Some(val.trim().to_string()),
                    "v" => v = Some(val.trim().to_string()),
                    _ => {}
                }
            }
        }
        let json_like = matches!(mime.as_str(), "application/json" | "application/*" | "*/*");
        match (as_.as_deref(), json_like) {
            (Some("Table"), true) if g.as_deref() == Some("meta.k8s.io") => {
                return Ok(Output::Table {
                    v1beta1: v.as_deref() == Some("v1beta1"),
                })
            }
            (Some("PartialObjectMetadata") | Some("PartialObjectMetadataList"), true)
                if g.as_deref() == Some("meta.k8s.io") =>
            {
                return Ok(Output::PartialMetadata {
                    v1beta1: v.as_deref() == Some("v1beta1"),
                })
            }
            (Some("APIGroupDiscoveryList"), true)
                if g.as_deref() == Some("apidiscovery.k8s.io")
                    && matches!(v.as_deref(), Some("v2") | Some("v2beta1")) =>
            {
                return Ok(Output::Discovery {
                    v2beta1: v.as_deref() == Some("v2beta1"),
                });
            }
            (None, true) => return Ok(Output::Json),
            (None, false) if mime == "application/yaml" => return Ok(Output::Yaml),
            _ => {}
        }
    }
    Err(ApiError::not_acceptable(
        "only the following media types are accepted: application/json, application/yaml",
    ))
}

fn media_type(content_type: Option<&str>) -> String {
    content_type
        .unwrap_or("")
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase()
}

/// What a request body holds: the kind whose schema decodes it from
/// protobuf, and how a JSON error names it.
#[derive(Debug, Clone, Copy)]
pub struct BodyKind {
    pub group: &'static str,
    pub version: &'static str,
    pub kind: &'static str,
    /// How a decoding error names the body (`error decoding <what>: ...`).
    pub what: &'static str,
    /// Reviews: the top-level `status` is the server's answer, never read.
    pub skip_status: bool,
}

impl BodyKind {
    /// An object of the resource `res` (created, replaced, or reviewed).
    pub fn of(res: &ResourceInfo) -> BodyKind {
        BodyKind {
            group: res.group,
            version: res.version,
            kind: res.kind,
            what: "request body",
            skip_status: res.is_review(),
        }
    }

    /// A special body: a subresource's own kind (Binding, Eviction,
    /// TokenRequest) or DeleteOptions.
    pub const fn special(
        group: &'static str,
        version: &'static str,
        kind: &'static str,
    ) -> BodyKind {
        BodyKind {
            group,
            version,
            kind,
            what: kind,
            skip_status: false,
        }
    }

    pub const BINDING: BodyKind = BodyKind::special("", "v1", "Binding");
    pub const EVICTION: BodyKind = BodyKind::special("policy", "v1", "Eviction");
    pub const TOKEN_REQUEST: BodyKind =
        BodyKind::special("authentication.k8s.io", "v1", "TokenRequest");
    pub const DELETE_OPTIONS: BodyKind = BodyKind::special("meta.k8s.io", "v1", "DeleteOptions");

    fn api_version(&self) -> String {
        match self.group {
            "" => self.version.to_string(),
            g => format!("{g}/{}", self.version),
        }
    }
}

/// The one body decoder: JSON, YAML or Kubernetes protobuf by the
/// Content-Type (none: JSON), for every verb and every special body.
pub fn decode_body(
    content_type: Option<&str>,
    body: &[u8],
    kind: BodyKind,
) -> Result<Value, ApiError> {
    match media_type(content_type).as_str() {
        "application/json" | "" | "*/*" => serde_json::from_slice(body)
            .map_err(|e| ApiError::bad_request(format!("error decoding {}: {e}", kind.what))),
        "application/yaml" | "application/x-yaml" | "text/yaml" => parse_yaml(body),
        "application/vnd.kubernetes.protobuf" => {
            let t =
                skiff_core::schema::root(kind.group, kind.version, kind.kind).ok_or_else(|| {
                    ApiError::unsupported_media_type("application/vnd.kubernetes.protobuf")
                })?;
            skiff_core::protobuf::decode_with(
                body,
                t,
                &kind.api_version(),
                kind.kind,
                kind.skip_status,
            )
        }
        other => Err(ApiError::unsupported_media_type(other)),
    }
}

/// The patch type a PATCH's Content-Type names.
pub fn patch_type(content_type: Option<&str>) -> Result<PatchType, ApiError> {
    match media_type(content_type).as_str() {
        "application/json-patch+json" => Ok(PatchType::Json),
        "application/merge-patch+json" => Ok(PatchType::Merge),
        "application/strategic-merge-patch+json" => Ok(PatchType::Strategic),
        "application/apply-patch+yaml"
        | "application/apply-patch+json"
        | "application/apply-patch+cbor" => Ok(PatchType::Apply),
        other => Err(ApiError::unsupported_media_type(other)),
    }
}

/// Decodes a patch body (apply patches may be YAML).
pub fn decode_patch(pt: PatchType, body: &Bytes) -> Result<Value, ApiError> {
    match pt {
        PatchType::Apply => parse_yaml(body),
        _ => parse_json(body),
    }
}

fn parse_json(body: &Bytes) -> Result<Value, ApiError> {
    serde_json::from_slice(body)
        .map_err(|e| ApiError::bad_request(format!("error decoding request body: {e}")))
}

fn parse_yaml(body: &[u8]) -> Result<Value, ApiError> {
    // YAML is a superset of JSON; serde_yaml_ng accepts both.
    let v: serde_yaml_ng::Value = serde_yaml_ng::from_slice(body)
        .map_err(|e| ApiError::bad_request(format!("error decoding YAML: {e}")))?;
    serde_json::to_value(v).map_err(|e| ApiError::bad_request(format!("error decoding YAML: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kubectl_get_asks_for_tables_first() {
        let a = "application/json;as=Table;v=v1;g=meta.k8s.io,application/json;as=Table;v=v1beta1;g=meta.k8s.io,application/json";
        assert_eq!(
            choose_output(Some(a)).unwrap(),
            Output::Table { v1beta1: false }
        );
    }

    #[test]
    fn protobuf_only_is_not_acceptable() {
        assert_eq!(
            choose_output(Some("application/vnd.kubernetes.protobuf"))
                .unwrap_err()
                .code,
            406
        );
        assert_eq!(
            choose_output(Some(
                "application/vnd.kubernetes.protobuf, application/json"
            ))
            .unwrap(),
            Output::Json
        );
    }

    #[test]
    fn special_bodies_decode_through_the_one_decoder() {
        let e = decode_body(Some("application/json"), b"{", BodyKind::EVICTION).unwrap_err();
        assert_eq!(e.code, 400);
        assert!(
            e.message.starts_with("error decoding Eviction: "),
            "{}",
            e.message
        );
        let cm = skiff_core::resources::lookup("", "v1", "configmaps").unwrap();
        let e = decode_body(None, b"{", BodyKind::of(cm)).unwrap_err();
        assert!(
            e.message.starts_with("error decoding request body: "),
            "{}",
            e.message
        );
        let v = decode_body(
            Some("application/yaml"),
            b"apiVersion: policy/v1\nkind: Eviction\nmetadata: {name: p}\n",
            BodyKind::EVICTION,
        )
        .unwrap();
        assert_eq!(v["metadata"]["name"], "p");
        assert_eq!(
            decode_body(Some("text/plain"), b"{}", BodyKind::DELETE_OPTIONS)
                .unwrap_err()
                .code,
            415
        );
    }

    #[test]
    fn unknown_content_types_are_unsupported() {
        let cm = skiff_core::resources::lookup("", "v1", "configmaps").unwrap();
        assert_eq!(
            decode_body(Some("text/plain"), b"{}", BodyKind::of(cm))
                .unwrap_err()
                .code,
            415
        );
        assert_eq!(patch_type(Some("application/json")).unwrap_err().code, 415);
    }
}
