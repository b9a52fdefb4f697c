//! skiff's DeclaredDependencies admission plugin (no Kubernetes
//! counterpart): a pod that declares the Services it uses
//! (`skiff.io/depends-on`) is labelled with its declaration's hash
//! (`skiff.io/deps`, which the generated NetworkPolicies select by; set or
//! removed on every create and update, so a pod cannot wear another's),
//! and a new one gets the projected volume `skiff-deps`: per declared
//! Service a ServiceAccount token bound to the pod with the audience
//! `<service>.<namespace>.svc`, at `<service>/token`, the volume mounted
//! read-only at `/var/run/secrets/skiff.io/deps` in every container and
//! init container (the agent requests and refreshes the tokens as it does
//! the API token). A declaration that does not parse is
//! left alone here: validation refuses it with a 422 naming the entry.

use async_trait::async_trait;
use serde_json::{json, Map, Value};
use skiff_core::ApiResult;
use skiff_helpers::dependencies::{self as deps, Dependency};

use super::context::AdmissionCtx;
use super::plugin::{AdmissionPlugin, Attributes, Operation};
use crate::request::Subresource;

const MIRROR_ANNOTATION: &str = "kubernetes.io/config.mirror";

pub struct DeclaredDependencies;

#[async_trait]
impl AdmissionPlugin for DeclaredDependencies {
    fn name(&self) -> &'static str {
        "DeclaredDependencies"
    }

    fn handles(&self, a: &Attributes<'_>) -> bool {
        a.res.group.is_empty()
            && a.res.plural == "pods"
            && a.sub == Subresource::Main
            && matches!(a.op, Operation::Create | Operation::Update)
    }

    async fn mutate(
        &self,
        _cx: &dyn AdmissionCtx,
        a: &Attributes<'_>,
        obj: &mut Value,
    ) -> ApiResult<()> {
        admit(
            obj,
            a.namespace.unwrap_or("default"),
            a.op == Operation::Create,
        );
        Ok(())
    }
}

/// The plugin's change to a pod in `ns` (`create`: also the tokens).
pub fn admit(obj: &mut Value, ns: &str, create: bool) {
    let declared = obj
        .pointer("/metadata/annotations")
        .and_then(|a| a.get(deps::ANNOTATION))
        .and_then(Value::as_str)
        .map(|v| deps::parse(v, ns));
    let list = match declared {
        Some(Err(_)) => return,
        Some(Ok(l)) => l,
        None => vec![],
    };
    set_label(obj, (!list.is_empty()).then(|| deps::label_value(&list)));
    let mirror = obj
        .pointer("/metadata/annotations")
        .and_then(|a| a.get(MIRROR_ANNOTATION))
        .is_some();
    if create && !mirror && !list.is_empty() {
        mount_tokens(obj, &list);
    }
}

fn set_label(obj: &mut Value, value: Option<String>) {
    let Some(meta) = obj.get_mut("metadata").and_then(Value::as_object_mut) else {
        return;
    };
    match value {
        Some(v) => {
            let labels = meta.entry("labels").or_insert_with(|| json!({}));
            if !labels.is_object() {
                *labels = json!({});
            }
            labels[deps::LABEL] = json!(v);
        }
        None => {
            if let Some(l) = meta.get_mut("labels").and_then(Value::as_object_mut) {
                l.remove(deps::LABEL);
            }
        }
    }
}

fn mount_tokens(obj: &mut Value, list: &[Dependency]) {
    let Some(spec) = obj.get_mut("spec").and_then(Value::as_object_mut) else {
        return;
    };
    let vols = spec.entry("volumes").or_insert_with(|| json!([]));
    if !vols.is_array() {
        *vols = json!([]);
    }
    let vols = vols.as_array_mut().expect("array");
    if vols
        .iter()
        .any(|v| v.get("name").and_then(Value::as_str) == Some(deps::TOKEN_VOLUME))
    {
        return;
    }
    // One projected volume, one token per declared Service in its own
    // directory.
    let sources: Vec<Value> = deps::services(list)
        .iter()
        .map(|d| {
            let mut token = Map::new();
            token.insert("audience".into(), json!(d.audience()));
            token.insert(
                "expirationSeconds".into(),
                json!(crate::podtoken::EXPIRATION_SECONDS),
            );
            token.insert("path".into(), json!(format!("{}/token", d.service)));
            json!({ "serviceAccountToken": token })
        })
        .collect();
    vols.push(json!({
        "name": deps::TOKEN_VOLUME,
        "projected": {"defaultMode": 0o644, "sources": sources},
    }));
    for list_name in ["initContainers", "containers"] {
        let Some(cs) = spec.get_mut(list_name).and_then(Value::as_array_mut) else {
            continue;
        };
        for c in cs.iter_mut().filter_map(Value::as_object_mut) {
            let mounts = c.entry("volumeMounts").or_insert_with(|| json!([]));
            if !mounts.is_array() {
                *mounts = json!([]);
            }
            let m = mounts.as_array_mut().expect("array");
            if m.iter()
                .any(|x| x.get("mountPath").and_then(Value::as_str) == Some(deps::TOKEN_DIR))
            {
                continue;
            }
            m.push(
                json!({"name": deps::TOKEN_VOLUME, "readOnly": true, "mountPath": deps::TOKEN_DIR}),
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(annotation: Option<&str>) -> Value {
        let mut p = json!({
            "metadata": {"name": "web", "labels": {"app": "web", deps::LABEL: "forged"}},
            "spec": {
                "initContainers": [{"name": "migrate", "image": "i"}],
                "containers": [{"name": "c", "image": "i", "volumeMounts": [{"name": "data", "mountPath": "/data"}]}],
                "volumes": [{"name": "data", "emptyDir": {}}],
            },
        });
        if let Some(a) = annotation {
            p["metadata"]["annotations"] = json!({ deps::ANNOTATION: a });
        }
        p
    }

    #[test]
    fn a_declaring_pod_gets_its_label_and_one_token_per_service() {
        let mut p = pod(Some("api:http, data/db:5432, data/db:9187"));
        admit(&mut p, "shop", true);
        let list = deps::parse("api:http,data/db:5432,data/db:9187", "shop").unwrap();
        assert_eq!(
            p["metadata"]["labels"][deps::LABEL],
            json!(deps::label_value(&list))
        );
        assert_eq!(p["metadata"]["labels"]["app"], "web");
        let vols = p["spec"]["volumes"].as_array().unwrap();
        assert_eq!(vols.len(), 2, "{vols:?}");
        assert_eq!(vols[1]["name"], "skiff-deps");
        let sources = vols[1]["projected"]["sources"].as_array().unwrap();
        assert_eq!(sources.len(), 2, "one token per Service: {sources:?}");
        assert_eq!(
            sources[0]["serviceAccountToken"]["audience"],
            "api.shop.svc"
        );
        assert_eq!(sources[0]["serviceAccountToken"]["path"], "api/token");
        assert_eq!(sources[1]["serviceAccountToken"]["audience"], "db.data.svc");
        assert_eq!(sources[1]["serviceAccountToken"]["path"], "db/token");
        for list in ["initContainers", "containers"] {
            let mounts: Vec<&str> = p["spec"][list][0]["volumeMounts"]
                .as_array()
                .unwrap()
                .iter()
                .map(|m| m["mountPath"].as_str().unwrap())
                .collect();
            assert!(
                mounts.contains(&"/var/run/secrets/skiff.io/deps"),
                "{mounts:?}"
            );
        }
    }

    #[test]
    fn the_label_follows_the_declaration_and_cannot_be_forged() {
        let mut p = pod(None);
        admit(&mut p, "shop", true);
        assert!(p["metadata"]["labels"].get(deps::LABEL).is_none());
        assert_eq!(p["spec"]["volumes"].as_array().unwrap().len(), 1);
        // An update that removes the declaration removes the label; the
        // volumes of a running pod stay as they are.
        let mut p = pod(Some("db"));
        admit(&mut p, "shop", true);
        p["metadata"]["annotations"] = json!({});
        admit(&mut p, "shop", false);
        assert!(p["metadata"]["labels"].get(deps::LABEL).is_none());
        assert_eq!(p["spec"]["volumes"].as_array().unwrap().len(), 2);
        // A malformed declaration is validation's to refuse.
        let mut p = pod(Some("db,,x"));
        admit(&mut p, "shop", true);
        assert_eq!(p["metadata"]["labels"][deps::LABEL], "forged");
    }
}
