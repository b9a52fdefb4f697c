//! Benchmark B10 part 2: creates of a custom resource whose definition has
//! a large structural schema with CEL rules, beside ConfigMap creates of the
//! same JSON size.
//!
//! `cargo run --release -p skiff-apiserver --example bench_crd -- [--seconds S] [--clients C] [--rounds R]`
//!
//! Starts skiff's API server in this process on a fresh embedded store
//! (durable writes), serving TLS on loopback, creates the definition (a
//! Prometheus-sized schema: ~300 properties, list-maps, maps, patterns,
//! enums, bounds and 12 CEL rules at several levels), then alternates
//! phases of ConfigMap creates and custom resource creates from C
//! concurrent HTTP/2 clients with the admin certificate, R rounds of each.
//! Reports requests/s and p50/p99 per phase and the ratio. `--plain` uses a
//! schema that only preserves unknown fields (no checks, no CEL) instead.

/// The allocator the `skiff` binary uses, so the benchmark measures it.
#[global_allocator]
static ALLOC: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::Request;
use serde_json::{json, Map, Value};
use skiff_apiserver::tls::Pki;
use skiff_store::{RedbStore, Store};

mod common;
use common::{connect, pct, Sender};

async fn call(s: &mut Sender, method: &str, path: &str, body: String) -> (u16, Bytes) {
    let req = Request::builder()
        .method(method)
        .uri(format!("https://localhost{path}"))
        .header("content-type", "application/json")
        .header("accept", "application/json")
        .body(Full::new(Bytes::from(body)))
        .unwrap();
    s.ready().await.unwrap();
    let resp = s.send_request(req).await.unwrap();
    let status = resp.status().as_u16();
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    (status, body)
}

/// A container-like item: what operators' pod templates carry.
fn container_schema() -> Value {
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
fn big_schema() -> Value {
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

fn crd(plain: bool) -> Value {
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

fn container(n: usize) -> Value {
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

fn prometheus(name: &str) -> String {
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
fn configmap(name: &str, size: usize) -> String {
    let empty = format!(
        r#"{{"apiVersion":"v1","kind":"ConfigMap","metadata":{{"name":"{name}","labels":{{"bench":"b10"}}}},"data":{{"k":""}}}}"#
    );
    let pad = size.saturating_sub(empty.len());
    format!(
        r#"{{"apiVersion":"v1","kind":"ConfigMap","metadata":{{"name":"{name}","labels":{{"bench":"b10"}}}},"data":{{"k":"{}"}}}}"#,
        "v".repeat(pad)
    )
}

async fn phase(
    conns: &[Sender],
    secs: f64,
    path: &'static str,
    body: fn(&str, usize) -> String,
    size: usize,
    tag: String,
) -> (f64, Vec<Duration>) {
    let deadline = Instant::now() + Duration::from_secs_f64(secs);
    let start = Instant::now();
    let mut tasks = Vec::new();
    for (c, mut s) in conns.iter().cloned().enumerate() {
        let tag = tag.clone();
        tasks.push(tokio::spawn(async move {
            let mut lat = Vec::new();
            let mut i = 0;
            while Instant::now() < deadline {
                let b = body(&format!("{tag}-{c}-{i}"), size);
                let t = Instant::now();
                let (code, resp) = call(&mut s, "POST", path, b).await;
                assert_eq!(code, 201, "{}", String::from_utf8_lossy(&resp));
                lat.push(t.elapsed());
                i += 1;
            }
            lat
        }));
    }
    let mut lat = Vec::new();
    for t in tasks {
        lat.extend(t.await.unwrap());
    }
    lat.sort();
    (lat.len() as f64 / start.elapsed().as_secs_f64(), lat)
}

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    let arg = |n: &str| {
        args.iter()
            .position(|a| a == n)
            .and_then(|i| args.get(i + 1))
            .cloned()
    };
    let secs: f64 = arg("--seconds").and_then(|s| s.parse().ok()).unwrap_or(4.0);
    let clients: usize = arg("--clients").and_then(|s| s.parse().ok()).unwrap_or(32);
    let rounds: usize = arg("--rounds").and_then(|s| s.parse().ok()).unwrap_or(2);

    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::load_or_create(&dir.path().join("pki"), &[]).unwrap();
    let store: Arc<dyn Store> =
        RedbStore::open(&dir.path().join("store.redb"), Default::default()).unwrap();
    let api = skiff_apiserver::ApiServer::start(store, Default::default())
        .await
        .unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(skiff_apiserver::serve::serve_tls(
        listener,
        pki.server_config().unwrap(),
        api.router(),
        std::future::pending(),
    ));
    let tls = common::client_tls(&pki, true);
    let mut conns = Vec::new();
    for _ in 0..clients {
        conns.push(connect(port, tls.clone()).await);
    }

    // `--plain`: the same objects under a schema that only preserves
    // unknown fields, to tell the schema's cost from the serving path's.
    let plain = args.iter().any(|a| a == "--plain");
    let definition = crd(plain);
    let schema_bytes = definition.to_string().len();
    let (code, body) = call(
        &mut conns[0],
        "POST",
        "/apis/apiextensions.k8s.io/v1/customresourcedefinitions",
        definition.to_string(),
    )
    .await;
    assert_eq!(code, 201, "{}", String::from_utf8_lossy(&body));
    const CRS: &str = "/apis/bench.example.com/v1/namespaces/default/prometheuses";
    let end = Instant::now() + Duration::from_secs(10);
    loop {
        let (code, _) = call(&mut conns[0], "GET", CRS, String::new()).await;
        if code == 200 {
            break;
        }
        assert!(Instant::now() < end, "the definition was never served");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let size = prometheus("size-probe-0-0").len();
    let cm_size = configmap("size-probe-0-0", size).len();
    println!(
        "B10 part 2 — {clients} HTTPS/2 clients, {secs} s per phase, {rounds} rounds; CRD of {schema_bytes} bytes; objects of {size} bytes (ConfigMaps {cm_size}), durable embedded store\n"
    );
    println!("| phase | creates/s | p50 ms | p99 ms |");
    println!("|---|---:|---:|---:|");
    let mut ratios = Vec::new();
    for r in 0..rounds {
        let (cm_rate, cm_lat) = phase(
            &conns,
            secs,
            "/api/v1/namespaces/default/configmaps",
            configmap,
            size,
            format!("cm{r}"),
        )
        .await;
        println!(
            "| ConfigMap, round {} | {cm_rate:.0} | {:.2} | {:.2} |",
            r + 1,
            pct(&cm_lat, 0.5),
            pct(&cm_lat, 0.99)
        );
        let (cr_rate, cr_lat) = phase(
            &conns,
            secs,
            CRS,
            |n, _| prometheus(n),
            size,
            format!("cr{r}"),
        )
        .await;
        println!(
            "| Prometheus (custom resource), round {} | {cr_rate:.0} | {:.2} | {:.2} |",
            r + 1,
            pct(&cr_lat, 0.5),
            pct(&cr_lat, 0.99)
        );
        ratios.push(100.0 * cr_rate / cm_rate);
    }
    let shown: Vec<String> = ratios.iter().map(|r| format!("{r:.0}%")).collect();
    println!(
        "\ncustom resource creates ÷ ConfigMap creates: {}",
        shown.join(", ")
    );
}
