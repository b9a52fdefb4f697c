//! The ServiceAccount admission plugin's API credentials for pods: unless
//! the pod or its ServiceAccount sets `automountServiceAccountToken: false`,
//! a new pod gets the projected volume `kube-api-access-<5 random>` (a
//! bound ServiceAccount token the agent requests and refreshes, the
//! cluster CA from the `kube-root-ca.crt` ConfigMap, the namespace) and
//! every container without a mount at the token path mounts it there,
//! read-only, as Kubernetes' `serviceaccount` admission does. Mirror pods
//! get nothing, nor do pods of a server that issues no tokens (an API
//! server embedded without a key directory). A pod that names no
//! `imagePullSecrets` gets its ServiceAccount's.

use serde_json::{json, Value};
use skiff_core::resources;
use skiff_core::ApiResult;

use crate::admission::context::AdmissionCtx;
use crate::admission::plugin::{forbidden, AdmissionPlugin, Attributes};
use crate::object::{meta_str, object_key};

/// Where containers find the token, CA and namespace.
pub const MOUNT_PATH: &str = "/var/run/secrets/kubernetes.io/serviceaccount";
/// The name prefix of the volume.
pub const VOLUME_PREFIX: &str = "kube-api-access-";
/// The token lifetime kube-apiserver's admission asks for (an hour and
/// seven seconds, so the agent's requests are recognisable).
pub const EXPIRATION_SECONDS: i64 = 3607;
const MIRROR_ANNOTATION: &str = "kubernetes.io/config.mirror";

/// Kubernetes' `utilrand.String` alphabet (no vowels, no confusable digits).
const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";

fn random_suffix() -> String {
    use rand::Rng;
    let mut rng = rand::rng();
    (0..5)
        .map(|_| ALPHABET[rng.random_range(0..ALPHABET.len())] as char)
        .collect()
}

/// The projected volume admission adds.
pub fn token_volume(name: &str) -> Value {
    json!({
        "name": name,
        "projected": {
            "defaultMode": 0o644,
            "sources": [
                {"serviceAccountToken": {"expirationSeconds": EXPIRATION_SECONDS, "path": "token"}},
                {"configMap": {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
                {"downwardAPI": {"items": [{"path": "namespace", "fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.namespace"}}]}},
            ],
        },
    })
}

/// Whether the token is mounted: the pod's setting wins, then the
/// ServiceAccount's, then yes.
pub fn should_automount(pod_spec: &Value, sa: Option<&Value>) -> bool {
    if let Some(b) = pod_spec
        .get("automountServiceAccountToken")
        .and_then(Value::as_bool)
    {
        return b;
    }
    sa.and_then(|sa| sa.get("automountServiceAccountToken"))
        .and_then(Value::as_bool)
        .unwrap_or(true)
}

/// Adds the volume and mounts to a pod (`obj`), given its ServiceAccount
/// (None when it could not be read). `suffix` names a new volume.
pub fn mount_token(obj: &mut Value, sa: Option<&Value>, suffix: &str) {
    if obj
        .pointer(&format!(
            "/metadata/annotations/{}",
            MIRROR_ANNOTATION.replace('/', "~1")
        ))
        .is_some()
    {
        return;
    }
    let Some(spec) = obj.get_mut("spec").filter(|s| s.is_object()) else {
        return;
    };
    if !should_automount(spec, sa) {
        return;
    }
    let existing = spec
        .get("volumes")
        .and_then(Value::as_array)
        .and_then(|vs| {
            vs.iter()
                .map(|v| v.get("name").and_then(Value::as_str).unwrap_or(""))
                .find(|n| n.starts_with(VOLUME_PREFIX))
                .map(str::to_string)
        });
    let vname = existing
        .clone()
        .unwrap_or_else(|| format!("{VOLUME_PREFIX}{suffix}"));
    let mount = json!({"name": vname, "readOnly": true, "mountPath": MOUNT_PATH});
    let mut needs_volume = false;
    for list in ["initContainers", "containers"] {
        let Some(cs) = spec.get_mut(list).and_then(Value::as_array_mut) else {
            continue;
        };
        for c in cs {
            let Some(c) = c.as_object_mut() else { continue };
            let mounts = c.entry("volumeMounts").or_insert_with(|| json!([]));
            if !mounts.is_array() {
                *mounts = json!([]);
            }
            let m = mounts.as_array_mut().expect("array");
            if m.iter()
                .any(|m| m.get("mountPath").and_then(Value::as_str) == Some(MOUNT_PATH))
            {
                continue;
            }
            m.push(mount.clone());
            needs_volume = true;
        }
    }
    if existing.is_none() && needs_volume {
        let m = spec.as_object_mut().expect("object");
        let vols = m.entry("volumes").or_insert_with(|| json!([]));
        if !vols.is_array() {
            *vols = json!([]);
        }
        vols.as_array_mut()
            .expect("array")
            .push(token_volume(&vname));
    }
}

/// Admission of a new pod in `ns` (Kubernetes' ServiceAccount plugin):
/// its ServiceAccount must exist (mirror pods aside), and its token is
/// mounted. A namespace's `default` account that the controller has not
/// made yet is waited for briefly, as the namespace was just created.
pub async fn admit(cx: &dyn AdmissionCtx, ns: &str, obj: &mut Value) -> ApiResult<()> {
    if !cx.config().service_account_tokens {
        // Nothing could issue the token, nor makes the accounts.
        return Ok(());
    }
    let sa_name = obj
        .pointer("/spec/serviceAccountName")
        .and_then(Value::as_str)
        .unwrap_or("default")
        .to_string();
    let res = resources::lookup("", "v1", "serviceaccounts").expect("serviceaccounts");
    let lookup = || async {
        let cached = cx
            .cache()
            .resource(res)
            .get(&object_key(res, Some(ns), &sa_name))
            .and_then(|o| o.value())
            .map(|v| (*v).clone());
        match cached {
            Some(v) => Some(v),
            None => cx.get(res, Some(ns), &sa_name).await.ok(),
        }
    };
    let mut sa = lookup().await;
    let mirror = obj
        .pointer("/metadata/annotations")
        .and_then(|a| a.get(MIRROR_ANNOTATION))
        .is_some();
    if sa.is_none() && sa_name == "default" && !mirror {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(3);
        while sa.is_none() && std::time::Instant::now() < deadline {
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            sa = lookup().await;
        }
    }
    if sa.is_none() && !mirror {
        let pods = resources::lookup("", "v1", "pods").expect("pods");
        let name = match meta_str(obj, "name") {
            "" => meta_str(obj, "generateName"),
            n => n,
        };
        return Err(forbidden(
            pods,
            name,
            &format!(
                "error looking up service account {ns}/{sa_name}: serviceaccount {sa_name:?} not found"
            ),
        ));
    }
    debug_assert!(sa.as_ref().is_none_or(|s| meta_str(s, "name") == sa_name));
    mount_token(obj, sa.as_ref(), &random_suffix());
    if !mirror {
        if let Some(sa) = &sa {
            copy_pull_secrets(obj, sa);
        }
    }
    Ok(())
}

/// A pod that names no `imagePullSecrets` gets its ServiceAccount's (the
/// names only), as the ServiceAccount admission plugin does; a pod with
/// its own keeps them.
pub fn copy_pull_secrets(obj: &mut Value, sa: &Value) {
    let Some(spec) = obj.get_mut("spec").and_then(Value::as_object_mut) else {
        return;
    };
    if spec
        .get("imagePullSecrets")
        .and_then(Value::as_array)
        .is_some_and(|a| !a.is_empty())
    {
        return;
    }
    let names: Vec<Value> = sa
        .get("imagePullSecrets")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .map(|r| json!({"name": r.get("name").and_then(Value::as_str).unwrap_or("")}))
        .collect();
    if !names.is_empty() {
        spec.insert("imagePullSecrets".into(), Value::Array(names));
    }
}

/// Kubernetes' ServiceAccount admission plugin for new pods: the default
/// account named, the account required to exist, its token mounted and
/// its pull secrets copied. Mirror pods are left as they are (the node
/// that made them compares their spec with its own).
pub struct ServiceAccount;

#[async_trait::async_trait]
impl AdmissionPlugin for ServiceAccount {
    fn name(&self) -> &'static str {
        "ServiceAccount"
    }

    fn handles(&self, a: &Attributes<'_>) -> bool {
        a.creates("", "pods")
    }

    async fn mutate(
        &self,
        cx: &dyn AdmissionCtx,
        a: &Attributes<'_>,
        obj: &mut Value,
    ) -> ApiResult<()> {
        let mirror = obj
            .pointer("/metadata/annotations")
            .and_then(|a| a.get(MIRROR_ANNOTATION))
            .is_some();
        if mirror {
            return Ok(());
        }
        let Some(spec) = obj.get_mut("spec").filter(|s| s.is_object()) else {
            return Ok(());
        };
        skiff_core::admission::default_service_account(spec);
        admit(cx, a.namespace.unwrap_or(""), obj).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod() -> Value {
        json!({
            "metadata": {"name": "p"},
            "spec": {
                "initContainers": [{"name": "i"}],
                "containers": [
                    {"name": "a"},
                    {"name": "b", "volumeMounts": [{"name": "mine", "mountPath": MOUNT_PATH}]},
                ],
                "volumes": [{"name": "mine", "emptyDir": {}}],
            }
        })
    }

    #[test]
    fn every_container_without_its_own_mount_gets_the_volume() {
        let mut p = pod();
        mount_token(&mut p, None, "x2b4z");
        let vols = p["spec"]["volumes"].as_array().unwrap();
        assert_eq!(vols.len(), 2);
        assert_eq!(vols[1], token_volume("kube-api-access-x2b4z"));
        assert_eq!(
            vols[1]["projected"]["sources"][0]["serviceAccountToken"]["expirationSeconds"],
            3607
        );
        let want =
            json!({"name": "kube-api-access-x2b4z", "readOnly": true, "mountPath": MOUNT_PATH});
        assert_eq!(
            p["spec"]["initContainers"][0]["volumeMounts"],
            json!([want])
        );
        assert_eq!(p["spec"]["containers"][0]["volumeMounts"], json!([want]));
        // The container that mounts something of its own there keeps it.
        assert_eq!(
            p["spec"]["containers"][1]["volumeMounts"],
            json!([{"name": "mine", "mountPath": MOUNT_PATH}])
        );
    }

    #[test]
    fn the_pod_setting_wins_over_the_service_accounts() {
        let sa_off = json!({"automountServiceAccountToken": false});
        let sa_on = json!({"automountServiceAccountToken": true});
        let mut p = pod();
        mount_token(&mut p, Some(&sa_off), "abcde");
        assert_eq!(p, pod(), "the ServiceAccount opts out");
        let mut p = pod();
        p["spec"]["automountServiceAccountToken"] = json!(true);
        mount_token(&mut p, Some(&sa_off), "abcde");
        assert_eq!(p["spec"]["volumes"].as_array().unwrap().len(), 2);
        let mut p = pod();
        p["spec"]["automountServiceAccountToken"] = json!(false);
        let before = p.clone();
        mount_token(&mut p, Some(&sa_on), "abcde");
        assert_eq!(p, before, "the pod opts out");
    }

    #[test]
    fn an_existing_token_volume_is_reused_and_mirror_pods_get_none() {
        let mut p = pod();
        p["spec"]["volumes"] = json!([token_volume("kube-api-access-aaaaa")]);
        mount_token(&mut p, None, "zzzzz");
        assert_eq!(p["spec"]["volumes"].as_array().unwrap().len(), 1);
        assert_eq!(
            p["spec"]["containers"][0]["volumeMounts"][0]["name"],
            "kube-api-access-aaaaa"
        );
        let mut p = pod();
        p["metadata"]["annotations"] = json!({"kubernetes.io/config.mirror": "x"});
        let before = p.clone();
        mount_token(&mut p, None, "zzzzz");
        assert_eq!(p, before);
    }

    #[test]
    fn a_pod_without_pull_secrets_gets_its_service_accounts() {
        let sa = json!({"imagePullSecrets": [{"name": "reg-a"}, {"name": "reg-b"}]});
        let mut p = pod();
        copy_pull_secrets(&mut p, &sa);
        assert_eq!(
            p["spec"]["imagePullSecrets"],
            json!([{"name": "reg-a"}, {"name": "reg-b"}])
        );
        // An empty list is "none".
        let mut p = pod();
        p["spec"]["imagePullSecrets"] = json!([]);
        copy_pull_secrets(&mut p, &sa);
        assert_eq!(p["spec"]["imagePullSecrets"].as_array().unwrap().len(), 2);
        // The pod's own win, whole.
        let mut p = pod();
        p["spec"]["imagePullSecrets"] = json!([{"name": "mine"}]);
        copy_pull_secrets(&mut p, &sa);
        assert_eq!(p["spec"]["imagePullSecrets"], json!([{"name": "mine"}]));
        // An account without any adds nothing.
        let mut p = pod();
        copy_pull_secrets(&mut p, &json!({"metadata": {"name": "default"}}));
        assert_eq!(p, pod());
    }

    #[test]
    fn suffixes_use_kubernetes_alphabet() {
        let s = random_suffix();
        assert_eq!(s.len(), 5);
        assert!(s.bytes().all(|b| ALPHABET.contains(&b)), "{s}");
    }
}
