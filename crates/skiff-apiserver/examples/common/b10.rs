//! Benchmark B10 part 2's data: the Prometheus-sized definition with CEL
//! rules, the custom resources created under it and ConfigMaps of the same
//! JSON size. Shared by `bench_crd` (the served benchmark) and skiff-core's
//! `crd_schema_loop` (the schema's own cost, for profiling).

#![allow(dead_code)]

use serde_json::{json, Map, Value};
/// A container-like item: what operators' pod templates carry.
pub fn container_schema() -> Value {
    let env = json!({"type": "array", "x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"],
        "items": {"type": "object", "required": ["name"], "properties": {
            "name": {"type": "string", "minLength": 1, "description": "Name of the variable."},
            "value": {"type": "string", "description": "Value of the variable."}}}});
    let quantity = json!({"anyOf": [{"type": "integer"}, {"type": "string"}], "x-kubernetes-int-or-string": true,
        "pattern": "^(\\+|-)?(([0-9]+(\\.[0-9]*)?)|(\\.[0-9]+))(([KMGTPE]i)|[numkMGTPE]|([eE](\\+|-)?(([0-9]+(\\.[0-9]*)?)|(\\.[0-9]+))))?$"});
    let mut props = Map::new();
    props.insert(
        "name".into(),
        json!({"type": "string", "pattern": "^[a-z0-9]([-a-z0-9]*[a-z0-9])?$", "maxLength": 63}),
    );
    props.insert(
        "image".into(),
        json!({"type": "string", "maxLength": 512, "description": "Container image name."}),
    );
    props.insert(
        "imagePullPolicy".into(),
        json!({"type": "string", "enum": ["Always", "IfNotPresent", "Never"]}),
    );
    props.insert(
        "args".into(),
        json!({"type": "array", "maxItems": 64, "items": {"type": "string", "maxLength": 4096}}),
    );
    props.insert(
        "command".into(),
        json!({"type": "array", "items": {"type": "string"}}),
    );
    props.insert("env".into(), env);
    props.insert("ports".into(), json!({"type": "array", "x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["containerPort", "protocol"],
        "items": {"type": "object", "required": ["containerPort"], "properties": {
            "name": {"type": "string"}, "containerPort": {"type": "integer", "format": "int32", "minimum": 1, "maximum": 65535},
            "protocol": {"type": "string", "default": "TCP", "enum": ["TCP", "UDP", "SCTP"]}}}}));
    props.insert(
        "resources".into(),
        json!({"type": "object", "properties": {
        "limits": {"type": "object", "additionalProperties": quantity.clone()},
        "requests": {"type": "object", "additionalProperties": quantity}}}),
    );
    for probe in ["livenessProbe", "readinessProbe", "startupProbe"] {
        props.insert(probe.into(), json!({"type": "object", "properties": {
            "httpGet": {"type": "object", "required": ["port"], "properties": {
                "path": {"type": "string"}, "port": {"anyOf": [{"type": "integer"}, {"type": "string"}], "x-kubernetes-int-or-string": true},
                "scheme": {"type": "string"}}},
            "initialDelaySeconds": {"type": "integer", "format": "int32"},
            "periodSeconds": {"type": "integer", "format": "int32", "minimum": 1},
            "timeoutSeconds": {"type": "integer", "format": "int32"},
            "failureThreshold": {"type": "integer", "format": "int32"}}}));
    }
    props.insert("securityContext".into(), json!({"type": "object", "properties": {
        "runAsUser": {"type": "integer", "format": "int64"}, "runAsNonRoot": {"type": "boolean"},
        "readOnlyRootFilesystem": {"type": "boolean"}, "allowPrivilegeEscalation": {"type": "boolean"},
        "capabilities": {"type": "object", "properties": {"add": {"type": "array", "items": {"type": "string"}}, "drop": {"type": "array", "items": {"type": "string"}}}}}}));
    props.insert("volumeMounts".into(), json!({"type": "array", "items": {"type": "object", "required": ["mountPath", "name"], "properties": {
        "name": {"type": "string"}, "mountPath": {"type": "string"}, "readOnly": {"type": "boolean"}, "subPath": {"type": "string"}}}}));
    json!({"type": "object", "required": ["name"], "properties": props,
        "x-kubernetes-validations": [
            {"rule": "!has(self.image) || self.image.size() > 0", "message": "image must not be empty"},
            {"rule": "!has(self.args) || self.args.size() <= 64", "message": "too many args"}]})
}

/// A Prometheus-sized structural schema with CEL rules.
pub fn big_schema() -> Value {
    let mut spec = Map::new();
    spec.insert(
        "replicas".into(),
        json!({"type": "integer", "format": "int32", "minimum": 0, "default": 1}),
    );
    spec.insert(
        "shards".into(),
        json!({"type": "integer", "format": "int32", "minimum": 1}),
    );
    spec.insert(
        "maxReplicas".into(),
        json!({"type": "integer", "format": "int32", "default": 10}),
    );
    spec.insert("retention".into(), json!({"type": "string", "pattern": "^(0|(([0-9]+)y)?(([0-9]+)w)?(([0-9]+)d)?(([0-9]+)h)?(([0-9]+)m)?(([0-9]+)s)?(([0-9]+)ms)?)$"}));
    spec.insert(
        "logLevel".into(),
        json!({"type": "string", "enum": ["", "debug", "info", "warn", "error"]}),
    );
    spec.insert(
        "logFormat".into(),
        json!({"type": "string", "enum": ["", "logfmt", "json"]}),
    );
    spec.insert("externalUrl".into(), json!({"type": "string"}));
    spec.insert("externalLabels".into(), json!({"type": "object", "maxProperties": 64, "additionalProperties": {"type": "string", "maxLength": 256},
        "x-kubernetes-validations": [{"rule": "self.all(k, k.size() < 64)", "message": "label names are at most 63 characters"}]}));
    spec.insert("containers".into(), json!({"type": "array", "maxItems": 16, "x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"], "items": container_schema()}));
    spec.insert(
        "initContainers".into(),
        json!({"type": "array", "maxItems": 16, "items": container_schema()}),
    );
    let selector = json!({"type": "object", "x-kubernetes-map-type": "atomic", "properties": {
        "matchLabels": {"type": "object", "additionalProperties": {"type": "string"}},
        "matchExpressions": {"type": "array", "maxItems": 16, "items": {"type": "object", "required": ["key", "operator"], "properties": {
            "key": {"type": "string", "maxLength": 317}, "operator": {"type": "string", "maxLength": 16, "enum": ["In", "NotIn", "Exists", "DoesNotExist"]},
            "values": {"type": "array", "maxItems": 64, "items": {"type": "string", "maxLength": 63}}}}}},
        "x-kubernetes-validations": [{"rule": "!has(self.matchExpressions) || self.matchExpressions.all(e, e.operator in ['Exists', 'DoesNotExist'] || (has(e.values) && e.values.size() > 0))", "message": "In and NotIn need values"}]});
    for s in [
        "ruleSelector",
        "serviceMonitorSelector",
        "podMonitorSelector",
        "probeSelector",
        "ruleNamespaceSelector",
        "serviceMonitorNamespaceSelector",
    ] {
        spec.insert(s.into(), selector.clone());
    }
    spec.insert("storage".into(), json!({"type": "object", "properties": {
        "disableMountSubPath": {"type": "boolean"},
        "emptyDir": {"type": "object", "properties": {"medium": {"type": "string"}, "sizeLimit": {"anyOf": [{"type": "integer"}, {"type": "string"}], "x-kubernetes-int-or-string": true}}},
        "volumeClaimTemplate": {"type": "object", "properties": {
            "metadata": {"type": "object", "properties": {"name": {"type": "string"}, "labels": {"type": "object", "additionalProperties": {"type": "string"}}}},
            "spec": {"type": "object", "properties": {
                "accessModes": {"type": "array", "items": {"type": "string"}},
                "storageClassName": {"type": "string"},
                "resources": {"type": "object", "properties": {"requests": {"type": "object", "additionalProperties": {"anyOf": [{"type": "integer"}, {"type": "string"}], "x-kubernetes-int-or-string": true}}}}}}}}}}));
    spec.insert("tolerations".into(), json!({"type": "array", "items": {"type": "object", "properties": {
        "effect": {"type": "string", "enum": ["", "NoSchedule", "PreferNoSchedule", "NoExecute"]}, "key": {"type": "string"},
        "operator": {"type": "string", "enum": ["", "Exists", "Equal"]}, "tolerationSeconds": {"type": "integer", "format": "int64"}, "value": {"type": "string"}}}}));
    spec.insert("remoteWrite".into(), json!({"type": "array", "maxItems": 16, "items": {"type": "object", "required": ["url"], "properties": {
        "url": {"type": "string", "maxLength": 2048, "x-kubernetes-validations": [{"rule": "self.startsWith('http://') || self.startsWith('https://')", "message": "url must be http or https"}]},
        "name": {"type": "string"}, "remoteTimeout": {"type": "string"},
        "queueConfig": {"type": "object", "properties": {"capacity": {"type": "integer"}, "maxShards": {"type": "integer"}, "minShards": {"type": "integer"}, "maxSamplesPerSend": {"type": "integer"}, "batchSendDeadline": {"type": "string"}}},
        "writeRelabelConfigs": {"type": "array", "items": {"type": "object", "properties": {
            "action": {"type": "string", "default": "replace", "enum": ["replace", "keep", "drop", "hashmod", "labelmap", "labeldrop", "labelkeep"]},
            "regex": {"type": "string"}, "replacement": {"type": "string"}, "separator": {"type": "string"},
            "sourceLabels": {"type": "array", "items": {"type": "string", "pattern": "^[a-zA-Z_][a-zA-Z0-9_]*$"}}, "targetLabel": {"type": "string"}}}}}}}));
    // Many plain settings, as the real Prometheus spec has.
    for i in 0..120 {
        let v = match i % 4 {
            0 => {
                json!({"type": "string", "maxLength": 256, "description": format!("Setting {i}.")})
            }
            1 => {
                json!({"type": "integer", "minimum": 0, "maximum": 1_000_000, "description": format!("Setting {i}.")})
            }
            2 => json!({"type": "boolean", "description": format!("Setting {i}.")}),
            _ => {
                json!({"type": "array", "items": {"type": "string"}, "maxItems": 32, "description": format!("Setting {i}.")})
            }
        };
        spec.insert(format!("setting{i}"), v);
    }
    json!({
        "type": "object",
        "required": ["spec"],
        "properties": {
            "apiVersion": {"type": "string"},
            "kind": {"type": "string"},
            "metadata": {"type": "object"},
            "spec": {"type": "object", "properties": spec,
                "x-kubernetes-validations": [
                    {"rule": "self.replicas <= self.maxReplicas", "message": "replicas must not exceed maxReplicas"},
                    {"rule": "!has(self.shards) || self.shards <= 100", "message": "at most 100 shards"},
                    {"rule": "!has(self.logLevel) || self.logLevel != 'debug' || self.replicas <= 3", "message": "debug logging with few replicas only"}]},
            "status": {"type": "object", "properties": {
                "availableReplicas": {"type": "integer"}, "replicas": {"type": "integer"},
                "conditions": {"type": "array", "x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"],
                    "items": {"type": "object", "required": ["type", "status"], "properties": {
                        "type": {"type": "string"}, "status": {"type": "string"}, "reason": {"type": "string"}, "message": {"type": "string"}}}}}},
        }
    })
}

pub fn crd(plain: bool) -> Value {
    let schema = if plain {
        json!({"type": "object", "x-kubernetes-preserve-unknown-fields": true})
    } else {
        big_schema()
    };
    json!({
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": "prometheuses.bench.example.com"},
        "spec": {
            "group": "bench.example.com",
            "scope": "Namespaced",
            "names": {"plural": "prometheuses", "singular": "prometheus", "kind": "Prometheus", "shortNames": ["prom"]},
            "versions": [{"name": "v1", "served": true, "storage": true,
                "subresources": {"status": {}},
                "schema": {"openAPIV3Schema": schema}}],
        }
    })
}

pub fn container(n: usize) -> Value {
    json!({
        "name": format!("c{n}"), "image": "quay.io/prometheus/prometheus:v2.53.0", "imagePullPolicy": "IfNotPresent",
        "args": ["--config.file=/etc/prometheus/config_out/prometheus.env.yaml", "--storage.tsdb.path=/prometheus", "--web.enable-lifecycle"],
        "env": (0..5).map(|i| json!({"name": format!("VAR_{i}"), "value": format!("value-{i}")})).collect::<Vec<_>>(),
        "ports": [{"name": "web", "containerPort": 9090 + n}],
        "resources": {"limits": {"cpu": "500m", "memory": "1Gi"}, "requests": {"cpu": "100m", "memory": "400Mi"}},
        "readinessProbe": {"httpGet": {"path": "/-/ready", "port": "web", "scheme": "HTTP"}, "periodSeconds": 5, "failureThreshold": 3},
        "securityContext": {"runAsNonRoot": true, "readOnlyRootFilesystem": true, "capabilities": {"drop": ["ALL"]}},
        "volumeMounts": [{"name": "config-out", "mountPath": "/etc/prometheus/config_out", "readOnly": true}],
    })
}

/// The custom resource named `name`: the object is built once and only the
/// name is substituted per call, so the client spends no more per request
/// than on a ConfigMap (client and server share the machine's cores).
pub fn prometheus(name: &str) -> String {
    static TEMPLATE: std::sync::OnceLock<(String, String)> = std::sync::OnceLock::new();
    let (head, tail) = TEMPLATE.get_or_init(|| {
        const PLACEHOLDER: &str = "@name@";
        let whole = prometheus_object(PLACEHOLDER);
        let at = whole.find(PLACEHOLDER).expect("the name placeholder");
        (
            whole[..at].to_string(),
            whole[at + PLACEHOLDER.len()..].to_string(),
        )
    });
    let mut out = String::with_capacity(head.len() + name.len() + tail.len());
    out.push_str(head);
    out.push_str(name);
    out.push_str(tail);
    out
}

fn prometheus_object(name: &str) -> String {
    let mut spec = Map::new();
    spec.insert("replicas".into(), json!(2));
    spec.insert("shards".into(), json!(1));
    spec.insert("retention".into(), json!("15d"));
    spec.insert("logLevel".into(), json!("info"));
    spec.insert(
        "externalLabels".into(),
        json!((0..10)
            .map(|i| (format!("label{i}"), json!(format!("v{i}"))))
            .collect::<Map<_, _>>()),
    );
    spec.insert(
        "containers".into(),
        json!((0..3).map(container).collect::<Vec<_>>()),
    );
    spec.insert("serviceMonitorSelector".into(), json!({"matchLabels": {"team": "frontend"}, "matchExpressions": [{"key": "tier", "operator": "In", "values": ["web"]}]}));
    spec.insert("remoteWrite".into(), json!([{"url": "https://remote.example.com/api/v1/write", "writeRelabelConfigs": [{"sourceLabels": ["__name__"], "regex": "go_.*", "action": "drop"}]}]));
    spec.insert("tolerations".into(), json!([{"key": "dedicated", "operator": "Equal", "value": "monitoring", "effect": "NoSchedule"}]));
    for i in 0..40 {
        let v = match i % 4 {
            0 => json!(format!("value-{i}")),
            1 => json!(i * 10),
            2 => json!(i % 3 == 0),
            _ => json!(["a", "b"]),
        };
        spec.insert(format!("setting{i}"), v);
    }
    json!({"apiVersion": "bench.example.com/v1", "kind": "Prometheus",
        "metadata": {"name": name, "labels": {"bench": "b10"}}, "spec": spec})
    .to_string()
}

/// A ConfigMap of the same JSON size as `prometheus(name)`.
pub fn configmap(name: &str, size: usize) -> String {
    let empty = format!(
        r#"{{"apiVersion":"v1","kind":"ConfigMap","metadata":{{"name":"{name}","labels":{{"bench":"b10"}}}},"data":{{"k":""}}}}"#
    );
    let pad = size.saturating_sub(empty.len());
    format!(
        r#"{{"apiVersion":"v1","kind":"ConfigMap","metadata":{{"name":"{name}","labels":{{"bench":"b10"}}}},"data":{{"k":"{}"}}}}"#,
        "v".repeat(pad)
    )
}
