//! Validation of the built-in types: the checks users meet most, with
//! Kubernetes' field paths and messages. Conservative by design: a valid
//! manifest must never be refused.

use serde_json::{json, Value};

use crate::meta::{is_dns1123_label, validate_object_meta, validate_object_meta_update};
use crate::resources::ResourceInfo;
use crate::selector::LabelSelector;
use crate::Cause;

pub use skiff_helpers::quantity::Quantity;

/// Validates an object about to be created.
pub fn validate_create(res: &ResourceInfo, obj: &Value) -> Vec<Cause> {
    let mut c = validate_object_meta(res, obj, true);
    template_dependencies(res, obj, &mut c);
    c.extend(res.rules.validate(obj));
    c.extend(res.rules.validate_create(obj));
    c
}

/// Validates an update of `old` to `new`.
pub fn validate_update(res: &ResourceInfo, new: &Value, old: &Value) -> Vec<Cause> {
    let mut c = validate_object_meta(res, new, false);
    c.extend(validate_object_meta_update(new, old));
    // A custom resource's schema validates an update whole (with the old
    // object for transition rules and ratcheting).
    if res.rules.custom().is_none() {
        template_dependencies(res, new, &mut c);
        c.extend(res.rules.validate(new));
    }
    c.extend(res.rules.validate_update(new, old));
    c
}

/// A declaration of dependencies (`skiff.io/depends-on`) in the
/// annotations at `meta` (an object's or a template's metadata, at field
/// path `path`) must parse; the error names the bad entry.
pub(crate) fn declared_dependencies(
    meta: Option<&Value>,
    path: &str,
    ns: &str,
    c: &mut Vec<Cause>,
) {
    use skiff_helpers::dependencies::{parse, ANNOTATION};
    let Some(v) = meta
        .and_then(|m| m.get("annotations"))
        .and_then(|a| a.get(ANNOTATION))
    else {
        return;
    };
    let field = format!("{path}.annotations[{ANNOTATION}]");
    match v.as_str() {
        Some(s) => {
            if let Err(e) = parse(s, ns) {
                c.push(Cause::invalid(
                    field,
                    v,
                    &format!("{e}; expected a comma-separated list of [namespace/]service[:port]"),
                ));
            }
        }
        None => c.push(Cause::invalid(field, v, "must be a string")),
    }
}

/// The declarations in the pod templates of a built-in workload
/// (`spec.template`, a PodTemplate's `template`, a CronJob's
/// `spec.jobTemplate.spec.template`).
fn template_dependencies(res: &ResourceInfo, obj: &Value, c: &mut Vec<Cause>) {
    if res.rules.custom().is_some() {
        return;
    }
    let ns = obj
        .pointer("/metadata/namespace")
        .and_then(Value::as_str)
        .unwrap_or("default");
    for (ptr, path) in [
        ("/spec/template/metadata", "spec.template.metadata"),
        ("/template/metadata", "template.metadata"),
        (
            "/spec/jobTemplate/spec/template/metadata",
            "spec.jobTemplate.spec.template.metadata",
        ),
    ] {
        declared_dependencies(obj.pointer(ptr), path, ns, c);
    }
}

pub(crate) fn replicas(obj: &Value, c: &mut Vec<Cause>) {
    if let Some(r) = obj.pointer("/spec/replicas") {
        if r.as_i64().map(|n| n < 0).unwrap_or(false) {
            c.push(Cause::invalid(
                "spec.replicas",
                r,
                "must be greater than or equal to 0",
            ));
        }
    }
}

pub(crate) fn template(
    t: Option<&Value>,
    path: &str,
    selector: Option<&LabelSelector>,
    claim_volumes: &[String],
    c: &mut Vec<Cause>,
) {
    let Some(t) = t else {
        c.push(Cause::required(path));
        return;
    };
    if let Some(sel) = selector {
        let labels = t
            .pointer("/metadata/labels")
            .and_then(Value::as_object)
            .cloned()
            .unwrap_or_default();
        if !sel.matches(&labels) {
            c.push(Cause::invalid(
                format!("{path}.metadata.labels"),
                &Value::Object(labels),
                "`selector` does not match template `labels`",
            ));
        }
    }
    match t.get("spec") {
        Some(spec) => pod_spec(spec, &format!("{path}.spec"), claim_volumes, c),
        None => c.push(Cause::required(format!("{path}.spec.containers"))),
    }
}

pub(crate) fn job_spec(spec: Option<&Value>, path: &str, c: &mut Vec<Cause>) {
    let Some(spec) = spec else { return };
    if let Some(t) = spec.get("template") {
        let rp = t
            .pointer("/spec/restartPolicy")
            .and_then(Value::as_str)
            .unwrap_or("");
        if rp != "OnFailure" && rp != "Never" {
            c.push(Cause::not_supported(
                format!("{path}.template.spec.restartPolicy"),
                &json!(rp),
                &["OnFailure", "Never"],
            ));
        }
        match t.get("spec") {
            Some(s) => pod_spec(s, &format!("{path}.template.spec"), &[], c),
            None => c.push(Cause::required(format!("{path}.template.spec.containers"))),
        }
    }
    for f in [
        "parallelism",
        "completions",
        "backoffLimit",
        "activeDeadlineSeconds",
    ] {
        if let Some(v) = spec.get(f) {
            if v.as_i64().map(|n| n < 0).unwrap_or(false) {
                c.push(Cause::invalid(
                    format!("{path}.{f}"),
                    v,
                    "must be greater than or equal to 0",
                ));
            }
        }
    }
}

/// A pod spec. `claim_volumes` are the names a StatefulSet's
/// volumeClaimTemplates add to its pods' volumes, which containers may
/// mount like any other volume.
pub(crate) fn pod_spec(spec: &Value, path: &str, claim_volumes: &[String], c: &mut Vec<Cause>) {
    let volumes: Vec<String> = spec
        .get("volumes")
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(|v| v.get("name").and_then(Value::as_str).map(str::to_string))
                .collect()
        })
        .unwrap_or_default();
    for (i, v) in volumes.iter().enumerate() {
        if volumes[..i].contains(v) {
            c.push(Cause::duplicate(
                format!("{path}.volumes[{i}].name"),
                &json!(v),
            ));
        }
    }
    let containers = spec.get("containers").and_then(Value::as_array);
    match containers {
        None => c.push(Cause::required(format!("{path}.containers"))),
        Some(a) if a.is_empty() => c.push(Cause::required(format!("{path}.containers"))),
        _ => {}
    }
    let mut names: Vec<String> = Vec::new();
    // The names of the pod's own containers, which an ephemeral
    // container's `targetContainerName` may name.
    let mut others: Vec<String> = Vec::new();
    for list in ["initContainers", "containers", "ephemeralContainers"] {
        if list == "ephemeralContainers" {
            others = names.clone();
        }
        let Some(cs) = spec.get(list).and_then(Value::as_array) else {
            continue;
        };
        for (i, ctr) in cs.iter().enumerate() {
            let p = format!("{path}.{list}[{i}]");
            if list == "ephemeralContainers" {
                ephemeral_container(ctr, &p, &others, c);
            }
            let name = ctr.get("name").and_then(Value::as_str).unwrap_or("");
            if name.is_empty() {
                c.push(Cause::required(format!("{p}.name")));
            } else if !is_dns1123_label(name) {
                c.push(Cause::invalid(format!("{p}.name"), &json!(name), "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and end with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?')"));
            } else if names.iter().any(|n| n == name) {
                c.push(Cause::duplicate(format!("{p}.name"), &json!(name)));
            } else {
                names.push(name.to_string());
            }
            if ctr
                .get("image")
                .and_then(Value::as_str)
                .map(str::trim)
                .unwrap_or("")
                .is_empty()
            {
                c.push(Cause::required(format!("{p}.image")));
            }
            if let Some(ports) = ctr.get("ports").and_then(Value::as_array) {
                for (j, port) in ports.iter().enumerate() {
                    if let Some(n) = port.get("containerPort") {
                        if !n
                            .as_i64()
                            .map(|n| (1..=65535).contains(&n))
                            .unwrap_or(false)
                        {
                            c.push(Cause::invalid(
                                format!("{p}.ports[{j}].containerPort"),
                                n,
                                "must be between 1 and 65535, inclusive",
                            ));
                        }
                    } else {
                        c.push(Cause::required(format!("{p}.ports[{j}].containerPort")));
                    }
                    if let Some(proto) = port.get("protocol").and_then(Value::as_str) {
                        if !matches!(proto, "TCP" | "UDP" | "SCTP") {
                            c.push(Cause::not_supported(
                                format!("{p}.ports[{j}].protocol"),
                                &json!(proto),
                                &["SCTP", "TCP", "UDP"],
                            ));
                        }
                    }
                }
            }
            if let Some(mounts) = ctr.get("volumeMounts").and_then(Value::as_array) {
                for (j, m) in mounts.iter().enumerate() {
                    let vn = m.get("name").and_then(Value::as_str).unwrap_or("");
                    if !volumes.iter().chain(claim_volumes).any(|v| v == vn) {
                        c.push(Cause::new(
                            "FieldValueNotFound",
                            format!("{p}.volumeMounts[{j}].name"),
                            format!("Not found: {vn:?}"),
                        ));
                    }
                    if m.get("mountPath")
                        .and_then(Value::as_str)
                        .unwrap_or("")
                        .is_empty()
                    {
                        c.push(Cause::required(format!("{p}.volumeMounts[{j}].mountPath")));
                    }
                }
            }
            resources(ctr.get("resources"), &format!("{p}.resources"), c);
            if list != "ephemeralContainers" {
                let never = spec.get("restartPolicy").and_then(Value::as_str) == Some("Never");
                resize_policy(
                    ctr.get("resizePolicy"),
                    &format!("{p}.resizePolicy"),
                    never,
                    c,
                );
            }
        }
    }
    if let Some(rp) = spec.get("restartPolicy").and_then(Value::as_str) {
        if !matches!(rp, "Always" | "OnFailure" | "Never") {
            c.push(Cause::not_supported(
                format!("{path}.restartPolicy"),
                &json!(rp),
                &["Always", "OnFailure", "Never"],
            ));
        }
    }
    if let Some(dp) = spec.get("dnsPolicy").and_then(Value::as_str) {
        if !matches!(
            dp,
            "ClusterFirstWithHostNet" | "ClusterFirst" | "Default" | "None"
        ) {
            c.push(Cause::not_supported(
                format!("{path}.dnsPolicy"),
                &json!(dp),
                &["ClusterFirst", "ClusterFirstWithHostNet", "Default", "None"],
            ));
        }
    }
}

/// What Kubernetes checks of an ephemeral container beyond what every
/// container gets: the fields it may not set (it must not be relied on for
/// the pod's service: no ports, probes, resources, lifecycle), no volume
/// subpaths, and a `targetContainerName` naming one of the pod's own
/// containers.
fn ephemeral_container(ctr: &Value, p: &str, others: &[String], c: &mut Vec<Cause>) {
    for f in [
        "ports",
        "resources",
        "livenessProbe",
        "readinessProbe",
        "startupProbe",
        "lifecycle",
        "resizePolicy",
        "restartPolicy",
    ] {
        let set = match ctr.get(f) {
            None | Some(Value::Null) => false,
            Some(Value::Object(m)) => m.values().any(|v| !is_empty_value(v)),
            Some(Value::Array(a)) => !a.is_empty(),
            Some(Value::String(s)) => !s.is_empty(),
            Some(_) => true,
        };
        if set {
            c.push(Cause::forbidden(
                format!("{p}.{f}"),
                "cannot be set for an Ephemeral Container",
            ));
        }
    }
    if let Some(mounts) = ctr.get("volumeMounts").and_then(Value::as_array) {
        for (j, m) in mounts.iter().enumerate() {
            for f in ["subPath", "subPathExpr"] {
                if !m.get(f).and_then(Value::as_str).unwrap_or("").is_empty() {
                    c.push(Cause::forbidden(
                        format!("{p}.volumeMounts[{j}].{f}"),
                        "cannot be set for an Ephemeral Container",
                    ));
                }
            }
        }
    }
    if let Some(t) = ctr.get("targetContainerName").and_then(Value::as_str) {
        if !t.is_empty() && !others.iter().any(|n| n == t) {
            c.push(Cause::new(
                "FieldValueNotFound",
                format!("{p}.targetContainerName"),
                format!("Not found: {t:?}"),
            ));
        }
    }
}

/// A value Go would leave at its zero (an empty object, list or string).
fn is_empty_value(v: &Value) -> bool {
    match v {
        Value::Null => true,
        Value::Object(m) => m.values().all(is_empty_value),
        Value::Array(a) => a.is_empty(),
        Value::String(s) => s.is_empty(),
        _ => false,
    }
}

/// An update through `pods/<name>/ephemeralcontainers`: the pod as a whole
/// must be valid, and of `spec.ephemeralContainers` entries may only be
/// added, never changed or removed (Kubernetes'
/// `ValidatePodEphemeralContainersUpdate`).
pub fn validate_ephemeral_containers_update(
    res: &ResourceInfo,
    new: &Value,
    old: &Value,
) -> Vec<Cause> {
    let mut c = validate_object_meta(res, new, false);
    c.extend(validate_object_meta_update(new, old));
    c.extend(res.rules.validate(new));
    let is_mirror = old
        .pointer("/metadata/annotations/kubernetes.io~1config.mirror")
        .is_some();
    if is_mirror {
        return vec![Cause::forbidden(
            "",
            "static pods do not support ephemeral containers",
        )];
    }
    let list = |v: &Value| {
        v.pointer("/spec/ephemeralContainers")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default()
    };
    let new_list = list(new);
    for o in list(old) {
        let name = o.get("name").and_then(Value::as_str).unwrap_or("");
        match new_list
            .iter()
            .find(|n| n.get("name").and_then(Value::as_str) == Some(name))
        {
            None => c.push(Cause::forbidden(
                "spec.ephemeralContainers",
                &format!("existing ephemeral containers {name:?} may not be removed\n"),
            )),
            Some(n) if *n != o => c.push(Cause::forbidden(
                format!("spec.ephemeralContainers[{name}]"),
                &format!("existing ephemeral containers {name:?} may not be changed\n"),
            )),
            Some(_) => {}
        }
    }
    c
}

/// A container's `resizePolicy` (Kubernetes' `validateResizePolicy`): cpu
/// and memory at most once each, `NotRequired` or `RestartContainer`, and
/// only `NotRequired` in a pod that never restarts its containers.
fn resize_policy(list: Option<&Value>, path: &str, never: bool, c: &mut Vec<Cause>) {
    let Some(list) = list.and_then(Value::as_array) else {
        return;
    };
    let mut seen: Vec<&str> = Vec::new();
    for (i, p) in list.iter().enumerate() {
        let name = p.get("resourceName").and_then(Value::as_str).unwrap_or("");
        if seen.contains(&name) {
            c.push(Cause::duplicate(format!("{path}[{i}]"), &json!(name)));
        }
        seen.push(name);
        match name {
            "cpu" | "memory" => {}
            "" => c.push(Cause::required(path)),
            other => c.push(Cause::not_supported(
                path,
                &json!(other),
                &["cpu", "memory"],
            )),
        }
        let policy = p.get("restartPolicy").and_then(Value::as_str).unwrap_or("");
        match policy {
            "NotRequired" | "RestartContainer" => {}
            "" => c.push(Cause::required(path)),
            other => c.push(Cause::not_supported(
                path,
                &json!(other),
                &["NotRequired", "RestartContainer"],
            )),
        }
        if never && policy != "NotRequired" {
            c.push(Cause::invalid(
                path,
                &json!(policy),
                "must be 'NotRequired' when `restartPolicy` is 'Never'",
            ));
        }
    }
}

/// An update through `pods/<name>/resize` (Kubernetes 1.33's
/// `ValidatePodResize`): the pod as a whole must be valid; its QoS class
/// may not change; of each container (and sidecar) only the cpu and memory
/// requests and limits may change, none may be removed, and a memory limit
/// may be lowered or added only where memory's resize policy restarts the
/// container.
pub fn validate_pod_resize(res: &ResourceInfo, new: &Value, old: &Value) -> Vec<Cause> {
    let mut c = validate_object_meta(res, new, false);
    c.extend(validate_object_meta_update(new, old));
    c.extend(res.rules.validate(new));
    let pod_level = |v: &Value| {
        ["requests", "limits"].iter().any(|k| {
            v.pointer(&format!("/spec/resources/{k}"))
                .and_then(Value::as_object)
                .is_some_and(|m| !m.is_empty())
        })
    };
    if pod_level(old) || pod_level(new) {
        return vec![Cause::forbidden(
            "",
            "pods with pod-level resources cannot be resized",
        )];
    }
    if old
        .pointer("/metadata/annotations/kubernetes.io~1config.mirror")
        .is_some()
    {
        return vec![Cause::forbidden("", "static pods cannot be resized")];
    }
    if old.pointer("/spec/os/name").and_then(Value::as_str) == Some("windows") {
        return vec![Cause::forbidden("", "windows pods cannot be resized")];
    }
    let empty = json!({});
    let (new_spec, old_spec) = (
        new.get("spec").unwrap_or(&empty),
        old.get("spec").unwrap_or(&empty),
    );
    // The class recorded at creation (else computed) against the new shape.
    let old_qos = old
        .pointer("/status/qosClass")
        .and_then(Value::as_str)
        .filter(|q| !q.is_empty())
        .unwrap_or_else(|| skiff_helpers::qos::of_json(old_spec));
    if old_qos != skiff_helpers::qos::of_json(new_spec) {
        let shown = new
            .pointer("/status/qosClass")
            .cloned()
            .unwrap_or(json!(""));
        c.push(Cause::invalid(
            "spec",
            &shown,
            "Pod QOS Class may not change as a result of resizing",
        ));
    }
    if !resize_supported(old) {
        c.push(Cause::forbidden(
            "spec",
            "Pod running on node without support for resize",
        ));
    }
    let list = |spec: &Value, k: &str| {
        spec.get(k)
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default()
    };
    let (new_ctrs, old_ctrs) = (list(new_spec, "containers"), list(old_spec, "containers"));
    let (new_init, old_init) = (
        list(new_spec, "initContainers"),
        list(old_spec, "initContainers"),
    );
    let same_shape = |a: &[Value], b: &[Value]| {
        a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.get("name") == y.get("name"))
    };
    if !same_shape(&new_ctrs, &old_ctrs) || !same_shape(&new_init, &old_init) {
        // Containers may not be added, removed, renamed or reordered.
        c.push(Cause::forbidden(
            "spec",
            "only cpu and memory resources are mutable",
        ));
        return c;
    }
    let sidecar = |ctr: &Value| ctr.get("restartPolicy").and_then(Value::as_str) == Some("Always");
    for (ix, o) in old_init.iter().enumerate() {
        if sidecar(o) {
            container_resize(
                &new_init[ix],
                o,
                &format!("spec.initContainers[{ix}].resources"),
                &mut c,
            );
        }
    }
    for (ix, o) in old_ctrs.iter().enumerate() {
        container_resize(
            &new_ctrs[ix],
            o,
            &format!("spec.containers[{ix}].resources"),
            &mut c,
        );
    }
    // What is left once cpu and memory are put back as they were must be
    // the old spec.
    let mut kept = new_spec.clone();
    for (ix, o) in old_ctrs.iter().enumerate() {
        let n = &mut kept["containers"][ix];
        keep_cpu_memory(n, o);
        if *n != *o {
            c.push(Cause::forbidden(
                "spec",
                "only cpu and memory resources are mutable",
            ));
        }
    }
    for (ix, o) in old_init.iter().enumerate() {
        let n = &mut kept["initContainers"][ix];
        if sidecar(o) {
            keep_cpu_memory(n, o);
            if *n != *o {
                c.push(Cause::forbidden(
                    "spec",
                    "only cpu and memory resources for sidecar containers are mutable",
                ));
            }
        } else if *n != *o {
            c.push(Cause::forbidden(
                "spec",
                "resources for non-sidecar init containers are immutable",
            ));
        }
    }
    if !c.is_empty() {
        return c;
    }
    if kept != *old_spec {
        c.push(Cause::forbidden(
            "spec",
            "only cpu and memory resources are mutable",
        ));
    }
    c
}

/// Whether the pod's node reports the resources of running containers
/// (Kubernetes' version-skew check: a node that does not cannot resize).
fn resize_supported(pod: &Value) -> bool {
    let statuses = pod
        .pointer("/status/containerStatuses")
        .and_then(Value::as_array);
    for s in statuses.into_iter().flatten() {
        if s.pointer("/state/running").is_some() {
            return s.get("resources").is_some_and(|r| !r.is_null());
        }
    }
    true
}

/// One container's resize (Kubernetes' `validateContainerResize`).
fn container_resize(new: &Value, old: &Value, path: &str, c: &mut Vec<Cause>) {
    let names = |ctr: &Value, part: &str| -> Vec<String> {
        ctr.pointer(&format!("/resources/{part}"))
            .and_then(Value::as_object)
            .map(|m| m.keys().cloned().collect())
            .unwrap_or_default()
    };
    for part in ["requests", "limits"] {
        let kept = names(new, part);
        if names(old, part).iter().any(|k| !kept.contains(k)) {
            c.push(Cause::forbidden(
                format!("{path}.{part}"),
                &format!("resource {part} cannot be removed"),
            ));
        }
    }
    let memory_policy = new
        .get("resizePolicy")
        .and_then(Value::as_array)
        .and_then(|l| {
            l.iter()
                .find(|p| p.get("resourceName").and_then(Value::as_str) == Some("memory"))
        })
        .and_then(|p| p.get("restartPolicy").and_then(Value::as_str))
        .unwrap_or("");
    if memory_policy.is_empty() || memory_policy == "NotRequired" {
        let limit = |ctr: &Value| {
            ctr.pointer("/resources/limits/memory")
                .and_then(skiff_helpers::quantity::from_json)
        };
        match (limit(new), limit(old)) {
            (Some(n), Some(o)) if n < o => c.push(Cause::forbidden(
                format!("{path}.limits[memory]"),
                "memory limits cannot be decreased unless resizePolicy is RestartContainer",
            )),
            (Some(_), None) => c.push(Cause::forbidden(
                format!("{path}.limits[memory]"),
                "memory limits cannot be added unless resizePolicy is RestartContainer",
            )),
            _ => {}
        }
    }
}

/// `new` with the cpu and memory of `old`'s requests and limits (and
/// without them where `old` has none), as Kubernetes'
/// `dropCPUMemoryResourcesFromContainer` compares a resize.
fn keep_cpu_memory(new: &mut Value, old: &Value) {
    let mut resources = new
        .get("resources")
        .and_then(Value::as_object)
        .cloned()
        .unwrap_or_default();
    for part in ["limits", "requests"] {
        let Some(old_list) = old
            .pointer(&format!("/resources/{part}"))
            .and_then(Value::as_object)
        else {
            resources.remove(part);
            continue;
        };
        let mut list = resources
            .get(part)
            .and_then(Value::as_object)
            .cloned()
            .unwrap_or_default();
        for k in ["cpu", "memory"] {
            list.remove(k);
            if let Some(v) = old_list.get(k) {
                list.insert(k.to_string(), v.clone());
            }
        }
        resources.insert(part.to_string(), Value::Object(list));
    }
    if let Some(m) = new.as_object_mut() {
        if resources.is_empty() && old.get("resources").is_none() {
            m.remove("resources");
        } else {
            m.insert("resources".into(), Value::Object(resources));
        }
    }
}

/// The extended resources of reclaimed capacity (see the agent's `reclaim`).
pub const BATCH_CPU: &str = "skiff.io/batch-cpu";
pub const BATCH_MEMORY: &str = "skiff.io/batch-memory";

/// Kubernetes' native resources: unprefixed, or in the kubernetes.io domain.
fn is_native_resource(name: &str) -> bool {
    match name.split_once('/') {
        None => true,
        Some((domain, _)) => domain == "kubernetes.io" || domain.ends_with(".kubernetes.io"),
    }
}

/// Resources counted in whole units: extended resources and object counts.
fn is_integer_resource(name: &str) -> bool {
    (!is_native_resource(name) && !name.starts_with("requests."))
        || matches!(
            name,
            "pods"
                | "services"
                | "replicationcontrollers"
                | "resourcequotas"
                | "configmaps"
                | "secrets"
                | "persistentvolumeclaims"
                | "services.nodeports"
                | "services.loadbalancers"
        )
}

/// Whether requests of `name` may be below its limit.
fn overcommit_allowed(name: &str) -> bool {
    is_native_resource(name) && !name.starts_with("hugepages-")
}

pub(crate) fn resources(r: Option<&Value>, path: &str, c: &mut Vec<Cause>) {
    let Some(r) = r else { return };
    let mut parsed = std::collections::HashMap::new();
    for part in ["limits", "requests"] {
        if let Some(m) = r.get(part).and_then(Value::as_object) {
            for (k, v) in m {
                let s = match v {
                    Value::String(s) => s.clone(),
                    Value::Number(n) => n.to_string(),
                    other => other.to_string(),
                };
                match Quantity::parse(&s) {
                    Ok(q) => {
                        if q.nano() < 0 {
                            c.push(Cause::invalid(
                                format!("{path}.{part}[{k}]"),
                                v,
                                "must be greater than or equal to 0",
                            ));
                        }
                        parsed.insert((part, k.clone()), q);
                    }
                    Err(e) => c.push(Cause::invalid(
                        format!("{path}.{part}[{k}]"),
                        v,
                        &e.to_string(),
                    )),
                }
            }
        }
    }
    let shown = |part: &str, k: &str| {
        r.pointer(&format!(
            "/{part}/{}",
            k.replace('~', "~0").replace('/', "~1")
        ))
        .map(|v| v.as_str().map(str::to_string).unwrap_or(v.to_string()))
        .unwrap_or_default()
    };
    let mut keys: Vec<_> = parsed.keys().cloned().collect();
    keys.sort();
    for (part, k) in &keys {
        let q = &parsed[&(*part, k.clone())];
        // Extended resources (and counts) come in whole units.
        if is_integer_resource(k) && q.nano() % 1_000_000_000 != 0 {
            c.push(Cause::invalid(
                format!("{path}.{part}[{k}]"),
                &json!(shown(part, k)),
                "must be an integer",
            ));
        }
        // Only native resources may be overcommitted: an extended
        // resource's request must be its limit.
        if *part == "requests" && !overcommit_allowed(k) {
            match parsed.get(&("limits", k.clone())) {
                None => c.push(Cause::invalid(
                    format!("{path}.requests[{k}]"),
                    &json!(shown("requests", k)),
                    "Limit must be set for non overcommitable resources",
                )),
                Some(l) if l != q => c.push(Cause::invalid(
                    format!("{path}.requests[{k}]"),
                    &json!(shown("requests", k)),
                    &format!("must be equal to {k} limit of {}", shown("limits", k)),
                )),
                Some(_) => {}
            }
        }
    }
    // A container in reclaimed capacity (skiff.io/batch-*) reserves none.
    let has = |part: &str, k: &str| parsed.contains_key(&(part, k.to_string()));
    let batch = ["requests", "limits"]
        .iter()
        .any(|p| has(p, BATCH_CPU) || has(p, BATCH_MEMORY));
    if batch {
        for k in ["cpu", "memory"] {
            if has("requests", k) {
                c.push(Cause::invalid(
                    format!("{path}.requests[{k}]"),
                    &json!(shown("requests", k)),
                    &format!(
                        "may not be requested by a container that asks for {BATCH_CPU} or \
                         {BATCH_MEMORY}: it runs in capacity reclaimed from other pods and \
                         reserves none (a {k} limit is also its request)"
                    ),
                ));
            }
        }
    }
    for ((part, k), q) in &parsed {
        if *part == "requests" {
            if let Some(l) = parsed.get(&("limits", k.clone())) {
                if q > l {
                    c.push(Cause::invalid(
                        format!("{path}.requests"),
                        &json!(r
                            .pointer(&format!("/requests/{k}"))
                            .and_then(Value::as_str)
                            .unwrap_or("")),
                        &format!(
                            "must be less than or equal to {k} limit of {}",
                            r.pointer(&format!("/limits/{k}"))
                                .map(|v| v.as_str().map(str::to_string).unwrap_or(v.to_string()))
                                .unwrap_or_default()
                        ),
                    ));
                }
            }
        }
    }
}

pub(crate) fn pod_update(new: &Value, old: &Value) -> Vec<Cause> {
    // Only images, activeDeadlineSeconds, tolerations (additions) and
    // terminationGracePeriodSeconds may change in a pod's spec.
    let mut a = new.get("spec").cloned().unwrap_or(json!({}));
    let mut b = old.get("spec").cloned().unwrap_or(json!({}));
    for spec in [&mut a, &mut b] {
        if let Some(m) = spec.as_object_mut() {
            for k in [
                "activeDeadlineSeconds",
                "tolerations",
                "terminationGracePeriodSeconds",
                "nodeName",
                "schedulingGates",
            ] {
                m.remove(k);
            }
            for list in ["containers", "initContainers"] {
                if let Some(cs) = m.get_mut(list).and_then(Value::as_array_mut) {
                    for ctr in cs.iter_mut().filter_map(Value::as_object_mut) {
                        ctr.remove("image");
                    }
                }
            }
        }
    }
    let old_node = old
        .pointer("/spec/nodeName")
        .and_then(Value::as_str)
        .unwrap_or("");
    let new_node = new
        .pointer("/spec/nodeName")
        .and_then(Value::as_str)
        .unwrap_or("");
    let mut c = Vec::new();
    if a != b || (!old_node.is_empty() && old_node != new_node) {
        c.push(Cause::forbidden("spec", "pod updates may not change fields other than `spec.containers[*].image`,`spec.initContainers[*].image`,`spec.activeDeadlineSeconds`,`spec.tolerations` (only additions to existing tolerations),`spec.terminationGracePeriodSeconds` (allow it to be set to 1 if it was previously negative)"));
    }
    c
}

pub(crate) fn service(obj: &Value, c: &mut Vec<Cause>) {
    let spec = obj.get("spec").cloned().unwrap_or(json!({}));
    let ty = spec
        .get("type")
        .and_then(Value::as_str)
        .unwrap_or("ClusterIP");
    if !matches!(
        ty,
        "ClusterIP" | "NodePort" | "LoadBalancer" | "ExternalName"
    ) {
        c.push(Cause::not_supported(
            "spec.type",
            &json!(ty),
            &["ClusterIP", "ExternalName", "LoadBalancer", "NodePort"],
        ));
    }
    let headless = spec.get("clusterIP").and_then(Value::as_str) == Some("None");
    let ports = spec
        .get("ports")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    if ports.is_empty() && ty != "ExternalName" && !headless {
        c.push(Cause::required("spec.ports"));
    }
    if ty == "ExternalName"
        && spec
            .get("externalName")
            .and_then(Value::as_str)
            .unwrap_or("")
            .is_empty()
    {
        c.push(Cause::required("spec.externalName"));
    }
    let mut names = Vec::new();
    for (i, p) in ports.iter().enumerate() {
        match p.get("port").and_then(Value::as_i64) {
            Some(n) if (1..=65535).contains(&n) => {}
            Some(n) => c.push(Cause::invalid(
                format!("spec.ports[{i}].port"),
                &json!(n),
                "must be between 1 and 65535, inclusive",
            )),
            None => c.push(Cause::required(format!("spec.ports[{i}].port"))),
        }
        let name = p.get("name").and_then(Value::as_str).unwrap_or("");
        if ports.len() > 1 && name.is_empty() {
            c.push(Cause::required(format!("spec.ports[{i}].name")));
        }
        if !name.is_empty() {
            if names.contains(&name) {
                c.push(Cause::duplicate(
                    format!("spec.ports[{i}].name"),
                    &json!(name),
                ));
            }
            names.push(name);
        }
    }
}

/// The most a ConfigMap's or Secret's data may hold (`MaxSecretSize`).
pub const MAX_DATA_SIZE: usize = 1024 * 1024;

pub(crate) fn data_keys(obj: &Value, secret: bool, c: &mut Vec<Cause>) {
    use base64::Engine;
    let mut total = 0usize;
    for field in ["data", "binaryData", "stringData"] {
        if let Some(m) = obj.get(field).and_then(Value::as_object) {
            for (k, v) in m {
                let ok = !k.is_empty()
                    && k.len() <= 253
                    && k.chars()
                        .all(|ch| ch.is_ascii_alphanumeric() || "-._".contains(ch))
                    && k != "."
                    && k != "..";
                if !ok {
                    c.push(Cause::invalid(format!("{field}[{k}]"), &json!(k), "a valid config key must consist of alphanumeric characters, '-', '_' or '.' (e.g. 'key.name',  or 'KEY_NAME',  or 'key-name', regex used for validation is '[-._a-zA-Z0-9]+')"));
                }
                let text = v.as_str().unwrap_or("");
                // Bytes travel base64-encoded; their size is the decoded one.
                let base64_bytes = field == "binaryData" || (secret && field == "data");
                total += if base64_bytes {
                    base64::engine::general_purpose::STANDARD
                        .decode(text)
                        .map(|b| b.len())
                        .unwrap_or(text.len() * 3 / 4)
                } else {
                    text.len()
                };
            }
        }
    }
    if total > MAX_DATA_SIZE {
        // A Secret names its data; a ConfigMap the whole object (`[]`).
        c.push(Cause::new(
            "FieldValueTooLong",
            if secret { "data" } else { "[]" },
            format!("Too long: must have at most {MAX_DATA_SIZE} bytes"),
        ));
    }
}

pub(crate) fn cron_ok(s: &str) -> bool {
    let s = s.trim();
    if s.starts_with('@') {
        return matches!(
            s,
            "@yearly" | "@annually" | "@monthly" | "@weekly" | "@daily" | "@midnight" | "@hourly"
        ) || s.starts_with("@every ");
    }
    let s = s
        .strip_prefix("CRON_TZ=")
        .or_else(|| s.strip_prefix("TZ="))
        .map(|r| r.split_once(' ').map(|x| x.1).unwrap_or(""))
        .unwrap_or(s);
    let fields: Vec<&str> = s.split_whitespace().collect();
    fields.len() == 5
        && fields.iter().all(|f| {
            f.chars()
                .all(|c| c.is_ascii_alphanumeric() || ",-*/?".contains(c))
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resources::lookup;

    #[test]
    fn a_pod_without_containers_is_invalid() {
        let pods = lookup("", "v1", "pods").unwrap();
        let c = validate_create(pods, &json!({"metadata": {"name": "p"}, "spec": {}}));
        assert_eq!(c.len(), 1);
        assert_eq!(
            (c[0].field.as_str(), c[0].message.as_str()),
            ("spec.containers", "Required value")
        );
    }

    #[test]
    fn a_deployment_whose_selector_misses_its_template_is_invalid() {
        let d = lookup("apps", "v1", "deployments").unwrap();
        let obj = json!({"metadata": {"name": "d"}, "spec": {"selector": {"matchLabels": {"app": "a"}}, "template": {"metadata": {"labels": {"app": "b"}}, "spec": {"containers": [{"name": "c", "image": "i"}]}}}});
        let c = validate_create(d, &obj);
        assert_eq!(c[0].field, "spec.template.metadata.labels");
        assert!(c[0]
            .message
            .ends_with("`selector` does not match template `labels`"));
    }

    #[test]
    fn changing_a_pods_command_is_forbidden_but_its_image_is_not() {
        let pods = lookup("", "v1", "pods").unwrap();
        let old = json!({"metadata": {"name": "p"}, "spec": {"containers": [{"name": "c", "image": "a"}]}});
        let img = json!({"metadata": {"name": "p"}, "spec": {"containers": [{"name": "c", "image": "b"}]}});
        assert!(validate_update(pods, &img, &old).is_empty());
        let cmd = json!({"metadata": {"name": "p"}, "spec": {"containers": [{"name": "c", "image": "a", "command": ["x"]}]}});
        assert_eq!(validate_update(pods, &cmd, &old)[0].field, "spec");
    }

    #[test]
    fn quantities_parse_with_binary_and_decimal_suffixes() {
        assert_eq!(Quantity::parse("100m").unwrap().milli_ceil(), 100);
        assert_eq!(Quantity::parse("1Gi").unwrap().value_ceil(), 1 << 30);
        assert_eq!(Quantity::parse("2").unwrap().milli_ceil(), 2000);
        assert!(Quantity::parse("12x").is_err());
    }

    fn container_causes(resources: Value) -> Vec<(String, String)> {
        let pods = lookup("", "v1", "pods").unwrap();
        let p = json!({"metadata": {"name": "p"}, "spec": {"containers": [{"name": "c", "image": "i", "resources": resources}]}});
        validate_create(pods, &p)
            .into_iter()
            .map(|c| (c.field, c.message))
            .collect()
    }

    #[test]
    fn extended_resources_are_whole_and_requested_as_limited() {
        let f = "spec.containers[0].resources";
        assert!(container_causes(
            json!({"requests": {BATCH_CPU: "500"}, "limits": {BATCH_CPU: "500"}})
        )
        .is_empty());
        let c = container_causes(
            json!({"requests": {BATCH_CPU: "1500m"}, "limits": {BATCH_CPU: "1500m"}}),
        );
        assert!(
            c.iter()
                .any(|(k, m)| k == &format!("{f}.requests[{BATCH_CPU}]")
                    && m.ends_with("must be an integer")),
            "{c:?}"
        );
        let c = container_causes(json!({"requests": {"example.com/gpu": "1"}}));
        assert!(
            c.iter()
                .any(|(k, m)| k == &format!("{f}.requests[example.com/gpu]")
                    && m.ends_with("Limit must be set for non overcommitable resources")),
            "{c:?}"
        );
        let c = container_causes(
            json!({"requests": {"example.com/gpu": "1"}, "limits": {"example.com/gpu": "2"}}),
        );
        assert!(
            c.iter()
                .any(|(_, m)| m.ends_with("must be equal to example.com/gpu limit of 2")),
            "{c:?}"
        );
        let c = container_causes(
            json!({"requests": {BATCH_MEMORY: "-1"}, "limits": {BATCH_MEMORY: "-1"}}),
        );
        assert!(
            c.iter()
                .any(|(_, m)| m.ends_with("must be greater than or equal to 0")),
            "{c:?}"
        );
        // Native resources may be overcommitted and be fractions.
        assert!(
            container_causes(json!({"requests": {"cpu": "250m"}, "limits": {"cpu": "1"}}))
                .is_empty()
        );
    }

    #[test]
    fn a_batch_container_may_not_also_request_cpu_or_memory() {
        let c = container_causes(
            json!({"requests": {BATCH_CPU: "500", "cpu": "100m"}, "limits": {BATCH_CPU: "500"}}),
        );
        assert_eq!(c.len(), 1, "{c:?}");
        assert_eq!(c[0].0, "spec.containers[0].resources.requests[cpu]");
        assert!(c[0].1.contains("reclaimed"), "{c:?}");
        assert!(container_causes(json!({"requests": {BATCH_CPU: "500", BATCH_MEMORY: "1048576"}, "limits": {BATCH_CPU: "500", BATCH_MEMORY: "1048576"}})).is_empty());
    }

    #[test]
    fn requests_above_limits_are_invalid() {
        let pods = lookup("", "v1", "pods").unwrap();
        let p = json!({"metadata": {"name": "p"}, "spec": {"containers": [{"name": "c", "image": "i", "resources": {"requests": {"cpu": "2"}, "limits": {"cpu": "1"}}}]}});
        assert_eq!(
            validate_create(pods, &p)[0].field,
            "spec.containers[0].resources.requests"
        );
    }
}
