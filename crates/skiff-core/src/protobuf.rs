//! Kubernetes' protobuf request bodies (`application/vnd.kubernetes.protobuf`),
//! decoded to JSON. kubectl's typed commands (`create namespace|configmap|
//! secret|deployment|service|job|cronjob|token|...`, `run`, `debug`,
//! `certificate approve|deny`, `drain`'s evictions, `auth can-i|whoami`)
//! send them.
//!
//! The envelope is the magic `k8s\0` followed by a `runtime.Unknown`
//! (typeMeta, raw, contentEncoding, contentType); `raw` is the object's
//! message. Field numbers come from `protobuf_fields.txt`, every message of
//! the Kubernetes API as kubectl v1.33's own file descriptors number it
//! (written by `scripts/protobuf-fields.py`); the types of the fields come
//! from the OpenAPI schemas, so one generic decoder serves every message.
//! A message field whose name is no JSON property (a Go struct embedded
//! inline, such as a Volume's `volumeSource` or a Probe's `handler`) puts
//! its fields in the enclosing object. Fields outside the table are refused
//! rather than dropped.

use std::collections::HashMap;
use std::sync::OnceLock;

use serde_json::{json, Map, Value};

use crate::schema::TypeRef;
use crate::ApiError;

/// Standard base64 with padding (how JSON carries `[]byte`).
fn b64(b: &[u8]) -> String {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD.encode(b)
}

/// `message number name[:Type],...` per line (see the module docs).
const NUMBERS: &str = include_str!("protobuf_fields.txt");

/// One field of a message: its number, JSON name and, for a message
/// type, that message's full name.
struct Field {
    number: u64,
    name: &'static str,
    message: Option<&'static str>,
}

fn messages() -> &'static HashMap<&'static str, Vec<Field>> {
    static TABLE: OnceLock<HashMap<&'static str, Vec<Field>>> = OnceLock::new();
    TABLE.get_or_init(|| {
        NUMBERS
            .lines()
            .filter_map(|line| {
                let (name, rest) = line.split_once(' ').unwrap_or((line, ""));
                let fields = rest
                    .split(',')
                    .filter_map(|f| {
                        let (n, rest) = f.split_once(' ')?;
                        let (name, message) = match rest.split_once(':') {
                            Some((a, b)) => (a, Some(b)),
                            None => (rest, None),
                        };
                        Some(Field {
                            number: n.parse().ok()?,
                            name,
                            message,
                        })
                    })
                    .collect();
                (!name.is_empty()).then_some((name, fields))
            })
            .collect()
    })
}

/// Go pointer fields per message (by short name): for them a zero value
/// was set on purpose (`--replicas=0`, `allowPrivilegeEscalation: false`,
/// `storageClassName: ""`) and is kept; other zero values are what Go
/// marshals for unset fields, which JSON would omit, and are skipped.
const POINTERS: &[(&str, &str)] = &[
    ("ObjectMeta", "deletionGracePeriodSeconds"),
    ("OwnerReference", "controller,blockOwnerDeletion"),
    ("ConfigMap", "immutable"),
    ("Secret", "immutable"),
    ("ServiceAccount", "automountServiceAccountToken"),
    ("ServiceSpec", "allocateLoadBalancerNodePorts,ipFamilyPolicy,loadBalancerClass,internalTrafficPolicy,trafficDistribution"),
    ("PodSpec", "terminationGracePeriodSeconds,activeDeadlineSeconds,automountServiceAccountToken,shareProcessNamespace,priority,runtimeClassName,enableServiceLinks,preemptionPolicy,setHostnameAsFQDN,hostUsers"),
    ("Toleration", "tolerationSeconds"),
    ("SecurityContext", "privileged,runAsUser,runAsGroup,runAsNonRoot,readOnlyRootFilesystem,allowPrivilegeEscalation,procMount"),
    ("PodSecurityContext", "runAsUser,runAsGroup,runAsNonRoot,fsGroup,fsGroupChangePolicy,supplementalGroupsPolicy,seLinuxChangePolicy"),
    ("Probe", "terminationGracePeriodSeconds"),
    ("ConfigMapVolumeSource", "defaultMode,optional"),
    ("SecretVolumeSource", "defaultMode,optional"),
    ("DownwardAPIVolumeSource", "defaultMode"),
    ("ProjectedVolumeSource", "defaultMode"),
    ("KeyToPath", "mode"),
    ("DownwardAPIVolumeFile", "mode"),
    ("ServiceAccountTokenProjection", "expirationSeconds"),
    ("HostPathVolumeSource", "type"),
    ("ConfigMapKeySelector", "optional"),
    ("SecretKeySelector", "optional"),
    ("ConfigMapEnvSource", "optional"),
    ("SecretEnvSource", "optional"),
    ("ConfigMapProjection", "optional"),
    ("SecretProjection", "optional"),
    ("CSIVolumeSource", "readOnly,fsType"),
    ("PersistentVolumeClaimSpec", "storageClassName,volumeMode,volumeAttributesClassName"),
    ("Container", "restartPolicy"),
    ("DeploymentSpec", "replicas,revisionHistoryLimit,progressDeadlineSeconds"),
    ("ReplicaSetSpec", "replicas"),
    ("StatefulSetSpec", "replicas,revisionHistoryLimit"),
    ("RollingUpdateStatefulSetStrategy", "partition"),
    ("DaemonSetSpec", "revisionHistoryLimit"),
    ("JobSpec", "parallelism,completions,activeDeadlineSeconds,manualSelector,backoffLimit,ttlSecondsAfterFinished,suspend,backoffLimitPerIndex,maxFailedIndexes,podReplacementPolicy,managedBy"),
    ("CronJobSpec", "startingDeadlineSeconds,suspend,successfulJobsHistoryLimit,failedJobsHistoryLimit,timeZone"),
    ("HorizontalPodAutoscalerSpec", "minReplicas,targetCPUUtilizationPercentage"),
    ("HPAScalingRules", "stabilizationWindowSeconds,selectPolicy"),
    ("MetricTarget", "averageUtilization"),
    ("PodDisruptionBudgetSpec", "unhealthyPodEvictionPolicy"),
    ("DeleteOptions", "gracePeriodSeconds,orphanDependents,propagationPolicy,ignoreStoreReadErrorWithClusterBreakingPotential"),
    ("Preconditions", "uid,resourceVersion"),
    ("TokenRequestSpec", "expirationSeconds"),
    ("CertificateSigningRequestSpec", "expirationSeconds"),
    ("IngressSpec", "ingressClassName"),
    ("HTTPIngressPath", "pathType"),
    ("NetworkPolicyPort", "protocol,endPort"),
    ("PriorityClass", "preemptionPolicy"),
    ("StorageClass", "reclaimPolicy,allowVolumeExpansion,volumeBindingMode"),
];

fn is_pointer(message: &str, field: &str) -> bool {
    let short = message.rsplit('.').next().unwrap_or(message);
    POINTERS
        .iter()
        .any(|(m, fs)| *m == short && fs.split(',').any(|f| f == field))
}

/// The protobuf message an OpenAPI definition is: `io.k8s.api.core.v1.Pod`
/// is `k8s.io.api.core.v1.Pod`.
fn proto_name(definition: &str) -> String {
    match definition.strip_prefix("io.k8s.") {
        Some(rest) => format!("k8s.io.{rest}"),
        None => definition.to_string(),
    }
}

/// The number of a field by its JSON name.
fn field_number(message: &str, name: &str) -> Option<u64> {
    messages()
        .get(message)?
        .iter()
        .find(|f| f.name == name)
        .map(|f| f.number)
}

/// A field of `message` by number: its name, whether it is a Go pointer,
/// and its message type.
fn field_of(message: &str, number: u64) -> Option<(&'static str, bool, Option<&'static str>)> {
    let f = messages()
        .get(message)?
        .iter()
        .find(|f| f.number == number)?;
    Some((f.name, is_pointer(message, f.name), f.message))
}

fn unsupported(msg: impl Into<String>) -> ApiError {
    ApiError::new(415, "UnsupportedMediaType", msg.into())
}

enum Wire<'a> {
    Varint(u64),
    Bytes(&'a [u8]),
}

struct Reader<'a> {
    b: &'a [u8],
}

impl<'a> Reader<'a> {
    fn varint(&mut self) -> Result<u64, ApiError> {
        let mut v = 0u64;
        for i in 0..10 {
            let Some((&byte, rest)) = self.b.split_first() else {
                break;
            };
            self.b = rest;
            v |= ((byte & 0x7f) as u64) << (7 * i);
            if byte & 0x80 == 0 {
                return Ok(v);
            }
        }
        Err(ApiError::bad_request("malformed protobuf body"))
    }

    fn next(&mut self) -> Result<Option<(u64, Wire<'a>)>, ApiError> {
        if self.b.is_empty() {
            return Ok(None);
        }
        let key = self.varint()?;
        let (num, wt) = (key >> 3, key & 7);
        let w = match wt {
            0 => Wire::Varint(self.varint()?),
            2 => {
                let len = self.varint()? as usize;
                if len > self.b.len() {
                    return Err(ApiError::bad_request("malformed protobuf body"));
                }
                let (d, rest) = self.b.split_at(len);
                self.b = rest;
                Wire::Bytes(d)
            }
            1 | 5 => {
                return Err(unsupported(
                    "fixed-width protobuf fields are not used by the Kubernetes API",
                ))
            }
            _ => return Err(ApiError::bad_request("malformed protobuf body")),
        };
        Ok(Some((num, w)))
    }
}

fn fields(b: &[u8]) -> Result<Vec<(u64, Wire<'_>)>, ApiError> {
    let mut r = Reader { b };
    let mut out = Vec::new();
    while let Some(f) = r.next()? {
        out.push(f);
    }
    Ok(out)
}

fn string(w: &Wire) -> Result<String, ApiError> {
    match w {
        Wire::Bytes(b) => String::from_utf8(b.to_vec())
            .map_err(|_| ApiError::bad_request("protobuf string is not UTF-8")),
        Wire::Varint(_) => Err(ApiError::bad_request("malformed protobuf string")),
    }
}

fn is_format(t: &TypeRef, fmt: &str) -> bool {
    t.schema_value().get("format").and_then(Value::as_str) == Some(fmt)
}

/// Decodes one value of type `t`.
fn value(w: &Wire, t: TypeRef) -> Result<Value, ApiError> {
    let def = t.definition().unwrap_or("");
    match def.rsplit('.').next().unwrap_or("") {
        "Time" | "MicroTime" if def.starts_with("io.k8s.apimachinery") => {
            let Wire::Bytes(b) = w else {
                return Err(ApiError::bad_request("malformed protobuf time"));
            };
            let mut secs = 0i64;
            for (n, f) in fields(b)? {
                if let (1, Wire::Varint(v)) = (n, f) {
                    secs = v as i64;
                }
            }
            let t = chrono::DateTime::from_timestamp(secs, 0).unwrap_or_default();
            return Ok(json!(t.format("%Y-%m-%dT%H:%M:%SZ").to_string()));
        }
        // managedFields' `fieldsV1` and a RawExtension: field 1 holds the
        // JSON itself.
        "FieldsV1" | "RawExtension" if def.starts_with("io.k8s.apimachinery") => {
            let Wire::Bytes(b) = w else {
                return Err(ApiError::bad_request("malformed protobuf raw JSON"));
            };
            for (n, f) in fields(b)? {
                if let (1, Wire::Bytes(raw)) = (n, f) {
                    return serde_json::from_slice(raw).map_err(|e| {
                        ApiError::bad_request(format!("{def} does not hold JSON: {e}"))
                    });
                }
            }
            return Ok(json!({}));
        }
        "Quantity" => {
            let Wire::Bytes(b) = w else {
                return Err(ApiError::bad_request("malformed protobuf quantity"));
            };
            for (n, f) in fields(b)? {
                if n == 1 {
                    return Ok(json!(string(&f)?));
                }
            }
            return Ok(json!("0"));
        }
        "IntOrString" => {
            let Wire::Bytes(b) = w else {
                return Err(ApiError::bad_request("malformed protobuf int-or-string"));
            };
            let (mut ty, mut i, mut s) = (0, 0i64, String::new());
            for (n, f) in fields(b)? {
                match (n, f) {
                    (1, Wire::Varint(v)) => ty = v,
                    (2, Wire::Varint(v)) => i = v as i32 as i64,
                    (3, f) => s = string(&f)?,
                    _ => {}
                }
            }
            return Ok(if ty == 1 { json!(s) } else { json!(i) });
        }
        _ => {}
    }
    if t.is_object() {
        let Wire::Bytes(b) = w else {
            return Err(ApiError::bad_request("malformed protobuf message"));
        };
        return message(b, t);
    }
    let sv = t.schema_value();
    let ty = sv.get("type").and_then(Value::as_str).unwrap_or("");
    match (ty, w) {
        ("string", Wire::Bytes(b)) if is_format(&t, "byte") => Ok(json!(b64(b))),
        ("string", _) => Ok(json!(string(w)?)),
        ("boolean", Wire::Varint(v)) => Ok(json!(*v != 0)),
        ("integer", Wire::Varint(v)) => Ok(if is_format(&t, "int32") {
            json!(*v as i32 as i64)
        } else {
            json!(*v as i64)
        }),
        _ => Err(unsupported(format!(
            "protobuf value of {} is not supported; send JSON",
            def
        ))),
    }
}

fn message(b: &[u8], t: TypeRef) -> Result<Value, ApiError> {
    message_numbered(b, t, &proto_name(t.definition().unwrap_or("")))
}

/// A message of type `t` whose fields are numbered as protobuf message
/// `message` (the type's own, or an inline struct's that `t` flattens).
fn message_numbered(b: &[u8], t: TypeRef, message: &str) -> Result<Value, ApiError> {
    let mut out = Map::new();
    for (num, w) in fields(b)? {
        // Go's protobuf marshalling writes zero values that JSON would omit
        // (empty strings and messages, zeros): they carry nothing, skip them.
        let empty = matches!(w, Wire::Bytes(b) if b.is_empty()) || matches!(w, Wire::Varint(0));
        let Some((name, pointer, inner_type)) = field_of(message, num) else {
            if empty {
                continue;
            }
            return Err(unsupported(format!(
                "field {num} of protobuf message {message} is not supported by this server; send JSON"
            )));
        };
        let Some((ft, _)) = t.field(name) else {
            // A Go struct embedded inline: its fields are the enclosing
            // object's.
            if let (Some(inner_type), Wire::Bytes(inner)) = (inner_type, &w) {
                if let Value::Object(m) = message_numbered(inner, t, inner_type)? {
                    out.extend(m);
                }
            }
            continue;
        };
        if matches!(w, Wire::Varint(0)) && !pointer {
            continue;
        }
        if matches!(w, Wire::Bytes(b) if b.is_empty())
            && !pointer
            && !ft.is_object()
            && !ft.is_map()
            && !ft.is_array()
        {
            continue;
        }
        if ft.is_map() {
            let Wire::Bytes(entry) = w else {
                return Err(ApiError::bad_request("malformed protobuf map entry"));
            };
            let (mut k, mut v) = (String::new(), Value::Null);
            let vt = ft.additional();
            for (n, f) in fields(entry)? {
                match n {
                    1 => k = string(&f)?,
                    2 => {
                        v = match vt {
                            // `map<string, ExtraValue>`: the list is the
                            // message's repeated field 1.
                            Some(vt) if vt.is_array() => {
                                let Wire::Bytes(items) = f else {
                                    return Err(ApiError::bad_request(
                                        "malformed protobuf map value",
                                    ));
                                };
                                let it = vt
                                    .items()
                                    .ok_or_else(|| unsupported(format!("{message}.{name}")))?;
                                let mut list = Vec::new();
                                for (n, item) in fields(items)? {
                                    if n == 1 {
                                        list.push(value(&item, it)?);
                                    }
                                }
                                Value::Array(list)
                            }
                            Some(vt) => value(&f, vt)?,
                            None => json!(string(&f)?),
                        }
                    }
                    _ => {}
                }
            }
            let m = out.entry(name).or_insert_with(|| json!({}));
            if let Some(m) = m.as_object_mut() {
                m.insert(k, v);
            }
        } else if ft.is_array() {
            let it = ft
                .items()
                .ok_or_else(|| unsupported(format!("{message}.{name}")))?;
            let list = out.entry(name).or_insert_with(|| json!([]));
            let Some(list) = list.as_array_mut() else {
                continue;
            };
            // Packed repeated integers arrive as one length-delimited run.
            let int_items =
                it.schema_value().get("type").and_then(Value::as_str) == Some("integer");
            match (&w, int_items) {
                (Wire::Bytes(b), true) => {
                    let mut r = Reader { b };
                    while !r.b.is_empty() {
                        list.push(json!(r.varint()? as i64));
                    }
                }
                _ => list.push(value(&w, it)?),
            }
        } else {
            out.insert(name.to_string(), value(&w, ft)?);
        }
    }
    Ok(Value::Object(out))
}

/// Decodes a protobuf request body for the kind at `t` into its JSON form.
pub fn decode(body: &[u8], t: TypeRef, api_version: &str, kind: &str) -> Result<Value, ApiError> {
    decode_with(body, t, api_version, kind, false)
}

/// Like [`decode`]; with `skip_status` the top-level `status` (field 3 or,
/// for two-field reviews, 2) is not decoded: reviews answer it, never read it.
pub fn decode_with(
    body: &[u8],
    t: TypeRef,
    api_version: &str,
    kind: &str,
    skip_status: bool,
) -> Result<Value, ApiError> {
    let rest = body
        .strip_prefix(b"k8s\x00")
        .ok_or_else(|| ApiError::bad_request("protobuf body lacks the k8s envelope"))?;
    let mut raw: &[u8] = &[];
    for (n, w) in fields(rest)? {
        match (n, w) {
            (2, Wire::Bytes(b)) => raw = b,
            (3, Wire::Bytes(enc)) if !enc.is_empty() => {
                return Err(unsupported("encoded protobuf bodies are not supported"))
            }
            _ => {}
        }
    }
    let raw_owned;
    let raw = if skip_status {
        let status_field = field_number(&proto_name(t.definition().unwrap_or("")), "status");
        let mut kept = Vec::with_capacity(raw.len());
        let mut r = Reader { b: raw };
        loop {
            let before = r.b;
            match r.next()? {
                None => break,
                Some((n, _)) if Some(n) == status_field => {}
                Some(_) => kept.extend_from_slice(&before[..before.len() - r.b.len()]),
            }
        }
        raw_owned = kept;
        &raw_owned[..]
    } else {
        raw
    };
    let mut obj = message(raw, t)?;
    if let Some(m) = obj.as_object_mut() {
        m.insert("apiVersion".into(), json!(api_version));
        m.insert("kind".into(), json!(kind));
    }
    Ok(obj)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::schema::root;

    fn key(n: u64, wt: u64) -> u8 {
        ((n << 3) | wt) as u8
    }

    fn ld(n: u64, b: &[u8]) -> Vec<u8> {
        let mut v = vec![key(n, 2), b.len() as u8];
        v.extend_from_slice(b);
        v
    }

    #[test]
    fn a_configmap_from_kubectl_create_configmap_decodes() {
        let meta = ld(1, b"settings");
        let entry = [ld(1, b"mode"), ld(2, b"fast")].concat();
        let cm = [ld(1, &meta), ld(2, &entry)].concat();
        let body = [
            b"k8s\x00".to_vec(),
            ld(1, &[ld(1, b"v1"), ld(2, b"ConfigMap")].concat()),
            ld(2, &cm),
        ]
        .concat();
        let v = decode(
            &body,
            root("", "v1", "ConfigMap").unwrap(),
            "v1",
            "ConfigMap",
        )
        .unwrap();
        assert_eq!(
            v,
            json!({"metadata": {"name": "settings"}, "data": {"mode": "fast"}, "apiVersion": "v1", "kind": "ConfigMap"})
        );
    }

    #[test]
    fn an_ingress_rule_carries_its_inline_http_value() {
        // kubectl create ingress simple --rule="foo.com/bar=svc1:8080,tls=my-cert"
        let port = vec![key(2, 0), 0x90, 0x3f]; // number 8080
        let service = [ld(1, b"svc1"), ld(2, &port)].concat();
        let backend = ld(4, &service);
        let path = [ld(1, b"/bar"), ld(2, &backend), ld(3, b"Exact")].concat();
        let http = ld(1, &path);
        let rule = [ld(1, b"foo.com"), ld(2, &ld(1, &http))].concat();
        let tls = [ld(1, b"foo.com"), ld(2, b"my-cert")].concat();
        let spec = [ld(2, &tls), ld(3, &rule), ld(4, b"default")].concat();
        let v = message(
            &[ld(1, &ld(1, b"simple")), ld(2, &spec)].concat(),
            root("networking.k8s.io", "v1", "Ingress").unwrap(),
        )
        .unwrap();
        assert_eq!(
            v["spec"],
            json!({"ingressClassName": "default",
                "tls": [{"hosts": ["foo.com"], "secretName": "my-cert"}],
                "rules": [{"host": "foo.com", "http": {"paths": [{"path": "/bar", "pathType": "Exact",
                    "backend": {"service": {"name": "svc1", "port": {"number": 8080}}}}]}}]})
        );
    }

    #[test]
    fn secret_bytes_become_base64_and_replicas_an_integer() {
        let meta = ld(1, b"s");
        let entry = [ld(1, b"k"), ld(2, b"hi")].concat();
        let v = message(
            &[ld(1, &meta), ld(2, &entry)].concat(),
            root("", "v1", "Secret").unwrap(),
        )
        .unwrap();
        assert_eq!(v["data"]["k"], "aGk=");
        let spec = vec![key(1, 0), 3];
        let d = message(&ld(2, &spec), root("apps", "v1", "Deployment").unwrap()).unwrap();
        assert_eq!(d["spec"]["replicas"], 3);
    }

    #[test]
    fn versions_numbered_differently_each_use_their_table() {
        // autoscaling/v1: field 4 of the spec is targetCPUUtilizationPercentage.
        let spec_v1 = [
            ld(1, &[ld(1, b"Deployment"), ld(2, b"web")].concat()),
            vec![key(3, 0), 3, key(4, 0), 80],
        ]
        .concat();
        let v1 = message(
            &ld(2, &spec_v1),
            root("autoscaling", "v1", "HorizontalPodAutoscaler").unwrap(),
        )
        .unwrap();
        assert_eq!(v1["spec"]["targetCPUUtilizationPercentage"], 80);
        assert_eq!(v1["spec"]["scaleTargetRef"]["name"], "web");
        // autoscaling/v2: field 4 is the metrics list.
        let target = [ld(1, b"Utilization"), vec![key(4, 0), 70]].concat();
        let metric = [
            ld(1, b"Resource"),
            ld(4, &[ld(1, b"cpu"), ld(2, &target)].concat()),
        ]
        .concat();
        let spec_v2 = [vec![key(3, 0), 5], ld(4, &metric)].concat();
        let v2 = message(
            &ld(2, &spec_v2),
            root("autoscaling", "v2", "HorizontalPodAutoscaler").unwrap(),
        )
        .unwrap();
        assert_eq!(
            v2["spec"]["metrics"][0]["resource"]["target"]["averageUtilization"],
            70
        );
        // rbac/v1 RoleBinding.
        let rb = [
            ld(
                2,
                &[
                    ld(1, b"User"),
                    ld(2, b"rbac.authorization.k8s.io"),
                    ld(3, b"bob"),
                ]
                .concat(),
            ),
            ld(
                3,
                &[
                    ld(1, b"rbac.authorization.k8s.io"),
                    ld(2, b"Role"),
                    ld(3, b"reader"),
                ]
                .concat(),
            ),
        ]
        .concat();
        let v = message(
            &rb,
            root("rbac.authorization.k8s.io", "v1", "RoleBinding").unwrap(),
        )
        .unwrap();
        assert_eq!(v["subjects"][0]["name"], "bob");
        assert_eq!(v["roleRef"]["kind"], "Role");
    }

    /// `kubectl certificate approve alice` (v1.33), captured: the request
    /// as kubectl read it (managedFields, extra, the PEM request) with the
    /// Approved condition added.
    #[test]
    fn kubectl_certificate_approve_sends_a_request_that_decodes() {
        let body = include_bytes!("testdata/certificate-approve.pb");
        let v = decode(
            body,
            root("certificates.k8s.io", "v1", "CertificateSigningRequest").unwrap(),
            "certificates.k8s.io/v1",
            "CertificateSigningRequest",
        )
        .unwrap();
        assert_eq!(v["metadata"]["name"], "alice");
        assert_eq!(v["metadata"]["resourceVersion"], "42");
        assert_eq!(v["metadata"]["creationTimestamp"], "2026-11-29T06:00:00Z");
        let mf = &v["metadata"]["managedFields"][0];
        assert_eq!(mf["manager"], "kubectl-create");
        assert_eq!(mf["fieldsType"], "FieldsV1");
        assert_eq!(
            mf["fieldsV1"],
            json!({"f:spec": {"f:request": {}, "f:signerName": {}, "f:usages": {}}})
        );
        assert_eq!(
            v["spec"]["signerName"],
            "kubernetes.io/kube-apiserver-client"
        );
        assert_eq!(v["spec"]["expirationSeconds"], 86400);
        assert_eq!(v["spec"]["usages"], json!(["client auth"]));
        assert_eq!(v["spec"]["extra"], json!({"scopes": ["a", "b"]}));
        assert_eq!(
            v["spec"]["groups"],
            json!(["system:masters", "system:authenticated"])
        );
        assert_eq!(
            v["spec"]["request"],
            b64(b"-----BEGIN CERTIFICATE REQUEST-----\nMIIB\n-----END CERTIFICATE REQUEST-----\n")
        );
        let c = &v["status"]["conditions"][0];
        assert_eq!(c["type"], "Approved");
        assert_eq!(c["status"], "True");
        assert_eq!(c["reason"], "KubectlApprove");
        assert!(c["lastUpdateTime"].as_str().unwrap().ends_with('Z'));
    }

    /// `kubectl debug node/n1 --profile=restricted|sysadmin` (v1.33),
    /// captured: the debugging pod with its security context, host
    /// namespaces and the node's root as a hostPath volume. Pointer fields
    /// set to false stay false.
    #[test]
    fn kubectl_debug_node_pods_decode_with_their_security_context() {
        let pod = |b: &[u8]| decode(b, root("", "v1", "Pod").unwrap(), "v1", "Pod").unwrap();
        let r = pod(include_bytes!("testdata/debug-node-restricted.pb"));
        assert_eq!(r["spec"]["nodeName"], "n1");
        assert_eq!(r["spec"]["restartPolicy"], "Never");
        assert_eq!(r["spec"]["tolerations"], json!([{"operator": "Exists"}]));
        let c = &r["spec"]["containers"][0];
        assert_eq!(c["image"], "busybox");
        assert_eq!(c["command"], json!(["true"]));
        assert_eq!(
            c["securityContext"],
            json!({"capabilities": {"drop": ["ALL"]}, "runAsNonRoot": true,
                "allowPrivilegeEscalation": false, "seccompProfile": {"type": "RuntimeDefault"}})
        );
        let s = pod(include_bytes!("testdata/debug-node-sysadmin.pb"));
        assert_eq!(s["spec"]["hostPID"], true);
        assert_eq!(s["spec"]["hostNetwork"], true);
        assert_eq!(s["spec"]["hostIPC"], true);
        assert_eq!(
            s["spec"]["volumes"],
            json!([{"name": "host-root", "hostPath": {"path": "/"}}])
        );
        let c = &s["spec"]["containers"][0];
        assert_eq!(c["securityContext"]["privileged"], true);
        assert_eq!(
            c["volumeMounts"],
            json!([{"name": "host-root", "mountPath": "/host"}])
        );
    }

    #[test]
    fn fields_outside_the_table_are_refused_not_dropped() {
        let e = message(&ld(9, b"x"), root("", "v1", "ConfigMap").unwrap()).unwrap_err();
        assert_eq!(e.code, 415);
    }
}
