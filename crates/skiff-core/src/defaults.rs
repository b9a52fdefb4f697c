//! Defaulting of the built-in types, as Kubernetes' API server applies it on
//! every write (so it is idempotent and never overwrites a value that is set).

use serde_json::{json, Map, Value};

use crate::resources::ResourceInfo;

pub(crate) fn obj<'a>(v: &'a mut Value, key: &str) -> Option<&'a mut Map<String, Value>> {
    let m = v.as_object_mut()?;
    let e = m.entry(key).or_insert_with(|| json!({}));
    if e.is_null() {
        *e = json!({});
    }
    e.as_object_mut()
}

pub(crate) fn set_default(m: &mut Map<String, Value>, key: &str, v: Value) {
    match m.get(key) {
        None | Some(Value::Null) => {
            m.insert(key.to_string(), v);
        }
        _ => {}
    }
}

/// Applies Kubernetes' defaults for the kind of `res` to `obj`: the kind's
/// rules, then the zero status Go would serialize for it.
pub fn apply_defaults(res: &ResourceInfo, obj_v: &mut Value) {
    res.rules.defaults(obj_v);
    if let Some(zero) = res.rules.initial_status() {
        initial_status(zero, obj_v);
    }
}

/// `stringData` is write-only: Kubernetes merges it into `data` (base64,
/// its keys winning over `data`'s) when it decodes a Secret, so it is never
/// stored and never returned.
pub(crate) fn string_data_into_data(secret: &mut Map<String, Value>) {
    use base64::Engine;
    let Some(string_data) = secret.remove("stringData") else {
        return;
    };
    let Value::Object(string_data) = string_data else {
        return;
    };
    if string_data.is_empty() {
        return;
    }
    let data = secret.entry("data").or_insert_with(|| json!({}));
    if !data.is_object() {
        *data = json!({});
    }
    if let Some(data) = data.as_object_mut() {
        for (k, v) in string_data {
            let text = match v {
                Value::String(s) => s,
                other => other.to_string(),
            };
            data.insert(
                k,
                json!(base64::engine::general_purpose::STANDARD.encode(text)),
            );
        }
    }
}

/// The status Kubernetes returns for a kind even before anything reports
/// one: Go serializes a status struct and its fields without `omitempty`
/// as zero values, so a new Service shows `status: {loadBalancer: {}}`, a
/// ReplicaSet `status: {replicas: 0}` and a Deployment `status: {}`.
/// Missing parts are filled in on every write, never overwriting a value.
fn initial_status(zero: Value, obj_v: &mut Value) {
    let Some(status) = obj(obj_v, "status") else {
        return;
    };
    if let Value::Object(zero) = zero {
        for (k, v) in zero {
            set_default(status, &k, v);
        }
    }
}

/// A pod's containers with a limit but no request for a resource request
/// their limit (pods only, not templates).
pub(crate) fn requests_from_limits(spec: &mut Value) {
    for list in ["containers", "initContainers"] {
        let Some(cs) = spec.get_mut(list).and_then(Value::as_array_mut) else {
            continue;
        };
        for c in cs.iter_mut() {
            let Some(res) = c.get_mut("resources").and_then(Value::as_object_mut) else {
                continue;
            };
            let Some(limits) = res
                .get("limits")
                .and_then(Value::as_object)
                .filter(|l| !l.is_empty())
                .cloned()
            else {
                continue;
            };
            let req = res.entry("requests").or_insert_with(|| json!({}));
            if !req.is_object() {
                *req = json!({});
            }
            let req = req.as_object_mut().expect("object");
            for (k, v) in limits {
                req.entry(k).or_insert(v);
            }
        }
    }
}

pub(crate) fn template(t: Option<&mut Value>) {
    if let Some(spec) = t.and_then(|t| t.get_mut("spec")) {
        pod_spec(spec);
    }
}

pub(crate) fn job_spec(spec: Option<&mut Value>) {
    let Some(spec_v) = spec else { return };
    if let Some(spec) = spec_v.as_object_mut() {
        // Neither set: one pod, run once. Only parallelism unset: one at a time.
        // Only completions unset: a work queue (completions stay unset).
        let unset = |m: &Map<String, Value>, k: &str| m.get(k).map(Value::is_null).unwrap_or(true);
        if unset(spec, "completions") && unset(spec, "parallelism") {
            spec.insert("completions".into(), json!(1));
        }
        set_default(spec, "parallelism", json!(1));
        set_default(spec, "backoffLimit", json!(6));
        set_default(spec, "completionMode", json!("NonIndexed"));
        set_default(spec, "suspend", json!(false));
        set_default(spec, "podReplacementPolicy", json!("TerminatingOrFailed"));
    }
    template(spec_v.get_mut("template"));
}

fn image_pull_policy(image: &str) -> &'static str {
    let after_slash = image.rsplit('/').next().unwrap_or(image);
    if image.contains('@') {
        return "IfNotPresent";
    }
    match after_slash.split_once(':') {
        None => "Always",
        Some((_, "latest")) => "Always",
        Some(_) => "IfNotPresent",
    }
}

fn probe(p: Option<&mut Value>) {
    if let Some(p) = p.and_then(Value::as_object_mut) {
        set_default(p, "timeoutSeconds", json!(1));
        set_default(p, "periodSeconds", json!(10));
        set_default(p, "successThreshold", json!(1));
        set_default(p, "failureThreshold", json!(3));
        if let Some(h) = p.get_mut("httpGet").and_then(Value::as_object_mut) {
            set_default(h, "path", json!("/"));
            set_default(h, "scheme", json!("HTTP"));
        }
    }
}

fn container(c: &mut Value) {
    let Some(m) = c.as_object_mut() else { return };
    set_default(m, "terminationMessagePath", json!("/dev/termination-log"));
    set_default(m, "terminationMessagePolicy", json!("File"));
    let image = m
        .get("image")
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_string();
    set_default(m, "imagePullPolicy", json!(image_pull_policy(&image)));
    set_default(m, "resources", json!({}));
    if let Some(ports) = m.get_mut("ports").and_then(Value::as_array_mut) {
        for p in ports.iter_mut().filter_map(Value::as_object_mut) {
            set_default(p, "protocol", json!("TCP"));
        }
    }
    for pr in ["livenessProbe", "readinessProbe", "startupProbe"] {
        probe(m.get_mut(pr));
    }
}

/// PodSpec defaults (also used inside workload templates).
pub fn pod_spec(spec: &mut Value) {
    let Some(m) = spec.as_object_mut() else {
        return;
    };
    set_default(m, "restartPolicy", json!("Always"));
    set_default(m, "dnsPolicy", json!("ClusterFirst"));
    set_default(m, "schedulerName", json!("default-scheduler"));
    set_default(m, "terminationGracePeriodSeconds", json!(30));
    set_default(m, "securityContext", json!({}));
    set_default(m, "enableServiceLinks", json!(true));
    for list in ["containers", "initContainers", "ephemeralContainers"] {
        if let Some(cs) = m.get_mut(list).and_then(Value::as_array_mut) {
            cs.iter_mut().for_each(container);
        }
    }
    if let Some(vols) = m.get_mut("volumes").and_then(Value::as_array_mut) {
        for v in vols.iter_mut().filter_map(Value::as_object_mut) {
            let has_source = v.keys().any(|k| k != "name");
            if !has_source {
                v.insert("emptyDir".into(), json!({}));
            }
            for src in ["configMap", "secret", "downwardAPI", "projected"] {
                if let Some(s) = v.get_mut(src).and_then(Value::as_object_mut) {
                    set_default(s, "defaultMode", json!(420));
                }
            }
        }
    }
}

/// The QoS class of a pod spec (Guaranteed, Burstable or BestEffort).
pub use skiff_helpers::qos::of_json as qos_class;

pub(crate) fn pod_status(pod: &mut Value) {
    let qos = pod.get("spec").map(qos_class).unwrap_or("BestEffort");
    if let Some(status) = obj(pod, "status") {
        set_default(status, "phase", json!("Pending"));
        set_default(status, "qosClass", json!(qos));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resources::lookup;

    #[test]
    fn a_minimal_pod_gets_kubernetes_defaults() {
        let pods = lookup("", "v1", "pods").unwrap();
        let mut p = json!({"spec": {"containers": [{"name": "c", "image": "busybox", "ports": [{"containerPort": 80}]}]}});
        apply_defaults(pods, &mut p);
        assert_eq!(p["spec"]["restartPolicy"], "Always");
        assert_eq!(p["spec"]["containers"][0]["imagePullPolicy"], "Always");
        assert_eq!(p["spec"]["containers"][0]["ports"][0]["protocol"], "TCP");
        assert_eq!(p["status"]["phase"], "Pending");
        assert_eq!(p["status"]["qosClass"], "BestEffort");
        let again = p.clone();
        apply_defaults(pods, &mut p);
        assert_eq!(p, again, "defaulting is idempotent");
    }

    #[test]
    fn a_tagged_image_is_pulled_if_not_present() {
        assert_eq!(image_pull_policy("nginx:1.25"), "IfNotPresent");
        assert_eq!(image_pull_policy("localhost:5000/nginx"), "Always");
        assert_eq!(image_pull_policy("nginx:latest"), "Always");
    }

    #[test]
    fn a_deployment_defaults_to_rolling_updates_of_a_quarter() {
        let d = lookup("apps", "v1", "deployments").unwrap();
        let mut v = json!({"spec": {"template": {"spec": {"containers": [{"name": "c", "image": "x:1"}]}}}});
        apply_defaults(d, &mut v);
        assert_eq!(v["spec"]["replicas"], 1);
        assert_eq!(v["spec"]["strategy"]["rollingUpdate"]["maxSurge"], "25%");
        assert_eq!(v["spec"]["template"]["spec"]["dnsPolicy"], "ClusterFirst");
    }

    #[test]
    fn equal_requests_and_limits_are_guaranteed() {
        let spec = json!({"containers": [{"resources": {"requests": {"cpu": "1", "memory": "1Gi"}, "limits": {"cpu": "1", "memory": "1Gi"}}}]});
        assert_eq!(qos_class(&spec), "Guaranteed");
        let spec = json!({"containers": [{"resources": {"requests": {"cpu": "1"}}}]});
        assert_eq!(qos_class(&spec), "Burstable");
    }
}
