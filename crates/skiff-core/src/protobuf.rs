//! Kubernetes' protobuf request bodies (`application/vnd.kubernetes.protobuf`),
//! decoded to JSON. kubectl's typed commands (`create namespace|configmap|
//! secret|deployment|service|job|cronjob`, `run`) send them.
//!
//! The envelope is the magic `k8s\0` followed by a `runtime.Unknown`
//! (typeMeta, raw, contentEncoding, contentType); `raw` is the object's
//! message. Field numbers come from the table below (the generated.proto
//! numbering of the Kubernetes API); the types of the fields come from the
//! OpenAPI schemas, so one generic decoder serves every message listed.
//! Fields outside the table are refused rather than dropped.

use serde_json::{json, Map, Value};

use crate::schema::TypeRef;
use crate::ApiError;

/// Standard base64 with padding (how JSON carries `[]byte`).
fn b64(b: &[u8]) -> String {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD.encode(b)
}

/// Field numbers per message: `definition short name` → `number name`
/// pairs. A `*` marks Go pointer fields: for them a zero value was set on
/// purpose (`--replicas=0`) and is kept; other zero values are what Go
/// marshals for unset fields, which JSON would omit, and are skipped. A
/// `^` marks a Go struct embedded inline in JSON (an IngressRule's
/// `IngressRuleValue`): its message's fields, numbered by the named table,
/// belong to the enclosing object.
const FIELDS: &[(&str, &str)] = &[
    ("ObjectMeta", "1 name,2 generateName,3 namespace,4 selfLink,5 uid,6 resourceVersion,7 generation,8 creationTimestamp,9 deletionTimestamp,10 *deletionGracePeriodSeconds,11 labels,12 annotations,13 ownerReferences,14 finalizers"),
    ("OwnerReference", "1 kind,3 name,4 uid,5 apiVersion,6 *controller,7 *blockOwnerDeletion"),
    ("LabelSelector", "1 matchLabels,2 matchExpressions"),
    ("LabelSelectorRequirement", "1 key,2 operator,3 values"),
    ("Namespace", "1 metadata,2 spec,3 status"),
    ("NamespaceSpec", "1 finalizers"),
    ("NamespaceStatus", "1 phase"),
    ("PodStatus", "1 phase"),
    ("ServiceStatus", "1 loadBalancer"),
    ("LoadBalancerStatus", ""),
    ("ConfigMap", "1 metadata,2 data,3 binaryData,4 *immutable"),
    ("Secret", "1 metadata,2 data,3 type,4 stringData,5 *immutable"),
    ("ServiceAccount", "1 metadata,2 secrets,3 imagePullSecrets,4 *automountServiceAccountToken"),
    ("LocalObjectReference", "1 name"),
    ("Service", "1 metadata,2 spec,3 status"),
    ("ServiceSpec", "1 ports,2 selector,3 clusterIP,4 type,5 externalIPs,7 sessionAffinity,8 loadBalancerIP,9 loadBalancerSourceRanges,10 externalName,11 externalTrafficPolicy,12 healthCheckNodePort,13 publishNotReadyAddresses,17 ipFamilyPolicy,18 clusterIPs,19 ipFamilies,20 *allocateLoadBalancerNodePorts,21 loadBalancerClass,22 internalTrafficPolicy"),
    ("ServicePort", "1 name,2 protocol,3 port,4 targetPort,5 nodePort,6 appProtocol"),
    ("Pod", "1 metadata,2 spec,3 status"),
    ("PodTemplateSpec", "1 metadata,2 spec"),
    ("PodSpec", "1 volumes,2 containers,3 restartPolicy,4 *terminationGracePeriodSeconds,5 *activeDeadlineSeconds,6 dnsPolicy,7 nodeSelector,8 serviceAccountName,9 serviceAccount,10 nodeName,11 hostNetwork,12 hostPID,13 hostIPC,16 hostname,17 subdomain,19 schedulerName,20 initContainers,21 *automountServiceAccountToken,22 tolerations,24 priorityClassName,25 *priority,29 runtimeClassName,30 *enableServiceLinks,31 preemptionPolicy"),
    ("Toleration", "1 key,2 operator,3 value,4 effect,5 *tolerationSeconds"),
    ("Container", "1 name,2 image,3 command,4 args,5 workingDir,6 ports,7 env,8 resources,13 terminationMessagePath,14 imagePullPolicy,16 stdin,17 stdinOnce,18 tty,20 terminationMessagePolicy"),
    ("ContainerPort", "1 name,2 hostPort,3 containerPort,4 protocol,5 hostIP"),
    ("EnvVar", "1 name,2 value"),
    ("ResourceRequirements", "1 limits,2 requests"),
    ("Deployment", "1 metadata,2 spec,3 status"),
    ("DeploymentStrategy", "1 type,2 rollingUpdate"),
    ("RollingUpdateDeployment", "1 maxUnavailable,2 maxSurge"),
    ("DeploymentSpec", "1 *replicas,2 selector,3 template,4 strategy,5 minReadySeconds,6 *revisionHistoryLimit,7 paused,9 *progressDeadlineSeconds"),
    ("Job", "1 metadata,2 spec,3 status"),
    ("JobSpec", "1 *parallelism,2 *completions,3 *activeDeadlineSeconds,4 selector,5 *manualSelector,6 template,7 *backoffLimit,8 *ttlSecondsAfterFinished,9 completionMode,10 *suspend,12 *backoffLimitPerIndex,13 *maxFailedIndexes,14 podReplacementPolicy,15 managedBy"),
    ("CronJob", "1 metadata,2 spec,3 status"),
    ("CronJobSpec", "1 schedule,2 *startingDeadlineSeconds,3 concurrencyPolicy,4 *suspend,5 jobTemplate,6 *successfulJobsHistoryLimit,7 *failedJobsHistoryLimit,8 timeZone"),
    ("JobTemplateSpec", "1 metadata,2 spec"),
    ("Binding", "1 metadata,2 target"),
    ("Role", "1 metadata,2 rules"),
    ("ClusterRole", "1 metadata,2 rules,3 aggregationRule"),
    ("AggregationRule", "1 clusterRoleSelectors"),
    ("PolicyRule", "1 verbs,2 apiGroups,3 resources,4 resourceNames,5 nonResourceURLs"),
    ("RoleBinding", "1 metadata,2 subjects,3 roleRef"),
    ("ClusterRoleBinding", "1 metadata,2 subjects,3 roleRef"),
    ("Subject", "1 kind,2 apiGroup,3 name,4 namespace"),
    ("RoleRef", "1 apiGroup,2 kind,3 name"),
    ("HorizontalPodAutoscaler", "1 metadata,2 spec,3 status"),
    ("HorizontalPodAutoscalerSpec", "1 scaleTargetRef,2 *minReplicas,3 maxReplicas,4 *targetCPUUtilizationPercentage"),
    ("autoscaling.v2.HorizontalPodAutoscalerSpec", "1 scaleTargetRef,2 *minReplicas,3 maxReplicas,4 metrics,5 behavior"),
    ("autoscaling.v2.MetricSpec", "1 type,4 resource"),
    ("autoscaling.v2.ResourceMetricSource", "1 name,2 target"),
    ("MetricTarget", "1 type,2 value,3 averageValue,4 *averageUtilization"),
    ("CrossVersionObjectReference", "1 kind,2 name,3 apiVersion"),
    ("PodDisruptionBudget", "1 metadata,2 spec,3 status"),
    ("PodDisruptionBudgetSpec", "1 minAvailable,2 selector,3 maxUnavailable,4 unhealthyPodEvictionPolicy"),
    ("ResourceQuota", "1 metadata,2 spec,3 status"),
    ("ResourceQuotaSpec", "1 hard,2 scopes,3 scopeSelector"),
    ("ScopeSelector", "1 matchExpressions"),
    ("ScopedResourceSelectorRequirement", "1 scopeName,2 operator,3 values"),
    ("LimitRange", "1 metadata,2 spec"),
    ("LimitRangeSpec", "1 limits"),
    ("LimitRangeItem", "1 type,2 max,3 min,4 default,5 defaultRequest,6 maxLimitRequestRatio"),
    ("PriorityClass", "1 metadata,2 value,3 globalDefault,4 description,5 preemptionPolicy"),
    ("DeleteOptions", "1 *gracePeriodSeconds,2 preconditions,3 *orphanDependents,4 propagationPolicy,5 dryRun"),
    ("Preconditions", "1 uid,2 resourceVersion"),
    ("Eviction", "1 metadata,2 deleteOptions"),
    ("SelfSubjectReview", "1 metadata,2 status"),
    ("SelfSubjectAccessReview", "1 metadata,2 spec,3 status"),
    ("SelfSubjectAccessReviewSpec", "1 resourceAttributes,2 nonResourceAttributes"),
    ("ResourceAttributes", "1 namespace,2 verb,3 group,4 version,5 resource,6 subresource,7 name"),
    ("NonResourceAttributes", "1 path,2 verb"),
    ("SelfSubjectRulesReview", "1 metadata,2 spec,3 status"),
    ("SelfSubjectRulesReviewSpec", "1 namespace"),
    ("SubjectAccessReview", "1 metadata,2 spec,3 status"),
    ("LocalSubjectAccessReview", "1 metadata,2 spec,3 status"),
    ("SubjectAccessReviewSpec", "1 resourceAttributes,2 nonResourceAttributes,3 user,4 groups,5 extra,6 uid"),
    ("TokenReview", "1 metadata,2 spec,3 status"),
    ("TokenReviewSpec", "1 token,2 audiences"),
    ("TokenRequest", "1 metadata,2 spec,3 status"),
    ("TokenRequestSpec", "1 audiences,3 boundObjectRef,4 *expirationSeconds"),
    ("BoundObjectReference", "1 kind,2 apiVersion,3 name,4 uid"),
    ("ObjectReference", "1 kind,2 namespace,3 name,4 uid,5 apiVersion,6 resourceVersion,7 fieldPath"),
    ("Ingress", "1 metadata,2 spec,3 status"),
    ("IngressSpec", "1 defaultBackend,2 tls,3 rules,4 ingressClassName"),
    ("IngressBackend", "3 resource,4 service"),
    ("IngressServiceBackend", "1 name,2 port"),
    ("ServiceBackendPort", "1 name,2 number"),
    ("IngressTLS", "1 hosts,2 secretName"),
    ("IngressRule", "1 host,2 ^IngressRuleValue"),
    ("IngressRuleValue", "1 http"),
    ("HTTPIngressRuleValue", "1 paths"),
    ("HTTPIngressPath", "1 path,2 backend,3 pathType"),
    ("TypedLocalObjectReference", "1 apiGroup,2 kind,3 name"),
    ("IngressStatus", "1 loadBalancer"),
    ("IngressLoadBalancerStatus", "1 ingress"),
    ("IngressLoadBalancerIngress", "1 ip,2 hostname,4 ports"),
];

/// The number of a field by its JSON name.
fn field_number(short: &str, name: &str) -> Option<u64> {
    let (_, list) = FIELDS.iter().find(|(d, _)| *d == short)?;
    list.split(',').find_map(|e| {
        let (n, nm) = e.split_once(' ')?;
        (nm.trim_start_matches('*') == name)
            .then(|| n.parse().ok())
            .flatten()
    })
}

/// The JSON name of a field and whether it is a pointer field. A
/// message numbered differently in two versions has its later version's
/// table under `group.version.Kind`.
fn field_name(definition: &str, number: u64) -> Option<(&'static str, bool)> {
    let short = definition.rsplit('.').next().unwrap_or(definition);
    let versioned = definition.strip_prefix("io.k8s.api.").unwrap_or("");
    let (_, list) = FIELDS
        .iter()
        .find(|(d, _)| *d == versioned)
        .or_else(|| FIELDS.iter().find(|(d, _)| *d == short))?;
    list.split(',').find_map(|e| {
        let (n, name) = e.split_once(' ')?;
        (n.parse::<u64>().ok()? == number).then(|| match name.strip_prefix('*') {
            Some(n) => (n, true),
            None => (name, false),
        })
    })
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
    message_numbered(b, t, t.definition().unwrap_or(""))
}

/// A message of type `t` whose fields are numbered by the table of `def`.
fn message_numbered(b: &[u8], t: TypeRef, def: &str) -> Result<Value, ApiError> {
    let mut out = Map::new();
    for (num, w) in fields(b)? {
        // Go's protobuf marshalling writes zero values that JSON would omit
        // (empty strings and messages, zeros): they carry nothing, skip them.
        let empty = matches!(w, Wire::Bytes(b) if b.is_empty()) || matches!(w, Wire::Varint(0));
        let Some((name, pointer)) = field_name(def, num) else {
            if empty {
                continue;
            }
            return Err(unsupported(format!(
                "field {num} of protobuf message {def} is not supported by this server; send JSON"
            )));
        };
        if let Some(table) = name.strip_prefix('^') {
            let Wire::Bytes(inner) = w else {
                return Err(ApiError::bad_request("malformed protobuf message"));
            };
            if let Value::Object(m) = message_numbered(inner, t, table)? {
                out.extend(m);
            }
            continue;
        }
        if matches!(w, Wire::Varint(0)) && !pointer {
            continue;
        }
        if matches!(w, Wire::Bytes(b) if b.is_empty())
            && t.field(name)
                .map(|(ft, _)| !ft.is_object() && !ft.is_map() && !ft.is_array())
                .unwrap_or(false)
        {
            continue;
        }
        let Some((ft, _)) = t.field(name) else {
            continue;
        };
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
                .ok_or_else(|| unsupported(format!("{def}.{name}")))?;
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
        let status_field = match t.definition().and_then(|d| d.rsplit('.').next()) {
            Some(short) => field_number(short, "status"),
            None => None,
        };
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

    #[test]
    fn fields_outside_the_table_are_refused_not_dropped() {
        let e = message(&ld(9, b"x"), root("", "v1", "ConfigMap").unwrap()).unwrap_err();
        assert_eq!(e.code, 415);
    }
}
