//! The protobuf field-number table (`src/protobuf_fields.txt`, written by
//! `scripts/protobuf-fields.py` from kubectl's file descriptors) checked
//! against a second, independently generated source: the `k8s-pb` crate,
//! prost bindings generated from the same Kubernetes release's `.proto`
//! files (k8s-pb 0.8 is Kubernetes 1.33, the version skiff serves). Every
//! message both know must number the same fields the same way, and a
//! message the bindings encode must decode to the JSON it stands for.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use prost::Message;
use serde_json::{json, Value};

/// A field's name as both sides can be compared: proto's own spelling
/// (`podIPs`, `Webhooks`) and prost's snake case (`pod_i_ps`, `webhooks`,
/// `r#type`) lower-cased without separators.
fn plain(name: &str) -> String {
    name.trim_start_matches("r#")
        .chars()
        .filter(|c| *c != '_')
        .flat_map(char::to_lowercase)
        .collect()
}

/// message full name → {number → plain field name}.
type Table = BTreeMap<String, BTreeMap<u64, String>>;

/// A message's full name as both sides can be compared: the bindings
/// align some names' case with Rust's (`HttpGetAction` for proto's
/// `HTTPGetAction`), so the last part is compared lower-cased.
fn message_key(full_name: &str) -> String {
    let full_name = full_name.replace('-', "_");
    match full_name.rsplit_once('.') {
        Some((package, name)) => format!("{package}.{}", name.to_lowercase()),
        None => full_name.to_lowercase(),
    }
}

fn ours() -> Table {
    let text = include_str!("../src/protobuf_fields.txt");
    let mut out = Table::new();
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        let (message, rest) = line.split_once(' ').unwrap_or((line, ""));
        let fields = rest
            .split(',')
            .filter(|f| !f.is_empty())
            .map(|f| {
                let (n, rest) = f.split_once(' ').expect("`number name` in the table");
                let name = rest.split(':').next().unwrap();
                (n.parse().expect("a field number"), plain(name))
            })
            .collect();
        out.insert(message_key(message), fields);
    }
    out
}

/// Where cargo unpacked `k8s-pb`'s sources (this test's dev-dependency):
/// the registry's source cache, else where `cargo metadata` says.
fn bindings_source() -> PathBuf {
    let cargo_home = std::env::var_os("CARGO_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| Path::new(&h).join(".cargo")));
    if let Some(Ok(registries)) = cargo_home.map(|h| std::fs::read_dir(h.join("registry/src"))) {
        for registry in registries.flatten() {
            let src = registry.path().join("k8s-pb-0.8.0/src");
            if src.is_dir() {
                return src;
            }
        }
    }
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../Cargo.toml");
    let out = std::process::Command::new(env!("CARGO"))
        .args([
            "metadata",
            "--offline",
            "--format-version",
            "1",
            "--manifest-path",
        ])
        .arg(&workspace)
        .output()
        .expect("run cargo metadata");
    assert!(
        out.status.success(),
        "cargo metadata: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let meta: Value = serde_json::from_slice(&out.stdout).expect("cargo metadata's JSON");
    let manifest = meta["packages"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|p| p["name"] == "k8s-pb")
        .and_then(|p| p["manifest_path"].as_str())
        .expect("k8s-pb among the packages");
    Path::new(manifest).parent().unwrap().join("src")
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("read dir") {
        let path = entry.expect("dir entry").path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The messages of the generated bindings: each `pub struct` of a
/// `src/<a>/<b>/.../mod.rs` is the message `k8s.io.<a>.<b>...` with its
/// `#[prost(..., tag = "N")]` fields.
fn theirs(src: &Path) -> Table {
    let mut files = Vec::new();
    rust_files(src, &mut files);
    let mut out = Table::new();
    for file in files {
        let rel = file.parent().unwrap().strip_prefix(src).unwrap();
        let package: Vec<String> = rel
            .components()
            .map(|c| c.as_os_str().to_string_lossy().to_string())
            .collect();
        if package.is_empty() {
            continue;
        }
        let package = format!("k8s.io.{}", package.join("."));
        let text = std::fs::read_to_string(&file).expect("read bindings");
        let mut message: Option<String> = None;
        let mut attr = String::new();
        let mut in_attr = false;
        let mut tag: Option<u64> = None;
        for line in text.lines() {
            if let Some(name) = line.strip_prefix("pub struct ") {
                let name = name.trim_end_matches(" {}").trim_end_matches(" {").trim();
                message = Some(message_key(&format!("{package}.{name}")));
                out.entry(message.clone().unwrap()).or_default();
                continue;
            }
            if line == "}" {
                message = None;
                continue;
            }
            let Some(msg) = &message else { continue };
            let t = line.trim();
            if t.starts_with("#[prost(") {
                in_attr = true;
                attr.clear();
            }
            if in_attr {
                attr.push_str(t);
                if t.ends_with(")]") {
                    in_attr = false;
                    tag = attr
                        .split("tag = \"")
                        .nth(1)
                        .and_then(|r| r.split('"').next())
                        .and_then(|n| n.parse().ok());
                }
                continue;
            }
            if let (Some(n), Some(field)) = (tag, t.strip_prefix("pub ")) {
                let name = field.split(':').next().unwrap();
                out.get_mut(msg).unwrap().insert(n, plain(name));
                tag = None;
            }
        }
    }
    out
}

#[test]
fn the_field_table_numbers_every_message_as_the_generated_bindings_do() {
    let ours = ours();
    let theirs = theirs(&bindings_source());
    assert!(theirs.len() > 1000, "read only {} messages", theirs.len());
    let mut compared = 0;
    let mut differences = Vec::new();
    for (message, fields) in &ours {
        let Some(their_fields) = theirs.get(message) else {
            differences.push(format!("{message}: not in the bindings"));
            continue;
        };
        compared += 1;
        if fields != their_fields {
            let a: BTreeSet<_> = fields.iter().collect();
            let b: BTreeSet<_> = their_fields.iter().collect();
            differences.push(format!(
                "{message}: only in the table {:?}, only in the bindings {:?}",
                a.difference(&b).collect::<Vec<_>>(),
                b.difference(&a).collect::<Vec<_>>()
            ));
        }
    }
    assert!(compared > 1000, "compared only {compared} messages");
    assert!(
        differences.is_empty(),
        "the field table disagrees with Kubernetes 1.33's generated bindings \
         (regenerate it with scripts/protobuf-fields.py):\n{}",
        differences.join("\n")
    );
}

#[test]
fn the_rule_catches_a_renumbered_field() {
    let mut ours = ours();
    let pod_status = ours.get_mut("k8s.io.api.core.v1.podstatus").unwrap();
    assert_eq!(pod_status.get(&1).map(String::as_str), Some("phase"));
    let theirs = theirs(&bindings_source());
    assert_eq!(theirs["k8s.io.api.core.v1.podstatus"], *pod_status);
    pod_status.insert(1, "message".into());
    assert_ne!(theirs["k8s.io.api.core.v1.podstatus"], *pod_status);
}

/// `k8s\0` + runtime.Unknown{typeMeta{apiVersion, kind}, raw}.
fn envelope(api_version: &str, kind: &str, raw: Vec<u8>) -> Vec<u8> {
    use k8s_pb::apimachinery::pkg::runtime::{TypeMeta, Unknown};
    let unknown = Unknown {
        type_meta: Some(TypeMeta {
            api_version: Some(api_version.into()),
            kind: Some(kind.into()),
        }),
        raw: Some(raw),
        content_encoding: Some(String::new()),
        content_type: Some(String::new()),
    };
    let mut body = b"k8s\x00".to_vec();
    body.extend(unknown.encode_to_vec());
    body
}

#[test]
fn a_message_the_bindings_encode_decodes_to_its_json() {
    use k8s_pb::api::apps::v1::{Deployment, DeploymentSpec};
    use k8s_pb::api::core::v1::{Container, ContainerPort, PodSpec, PodTemplateSpec};
    use k8s_pb::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
    let labels = BTreeMap::from([("app".to_string(), "web".to_string())]);
    let deployment = Deployment {
        metadata: Some(ObjectMeta {
            name: Some("web".into()),
            namespace: Some("default".into()),
            labels: labels.clone(),
            ..Default::default()
        }),
        spec: Some(DeploymentSpec {
            replicas: Some(3),
            selector: Some(LabelSelector {
                match_labels: labels.clone(),
                ..Default::default()
            }),
            template: Some(PodTemplateSpec {
                metadata: Some(ObjectMeta {
                    labels,
                    ..Default::default()
                }),
                spec: Some(PodSpec {
                    containers: vec![Container {
                        name: Some("nginx".into()),
                        image: Some("nginx:1.27".into()),
                        ports: vec![ContainerPort {
                            container_port: Some(80),
                            ..Default::default()
                        }],
                        ..Default::default()
                    }],
                    ..Default::default()
                }),
            }),
            ..Default::default()
        }),
        status: None,
    };
    let body = envelope("apps/v1", "Deployment", deployment.encode_to_vec());
    let t = skiff_core::schema::root("apps", "v1", "Deployment").expect("Deployment's schema");
    let got = skiff_core::protobuf::decode(&body, t, "apps/v1", "Deployment").expect("decodes");
    assert_eq!(
        got,
        json!({
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": "web", "namespace": "default", "labels": {"app": "web"}},
            "spec": {
                "replicas": 3,
                "selector": {"matchLabels": {"app": "web"}},
                "template": {
                    "metadata": {"labels": {"app": "web"}},
                    "spec": {"containers": [{
                        "name": "nginx", "image": "nginx:1.27",
                        "ports": [{"containerPort": 80}]
                    }]}
                }
            }
        })
    );
}
