//! What a container takes from outside its spec: environment variables
//! (values, the downward API, resources, ConfigMap and Secret keys, envFrom)
//! and volumes (emptyDir, hostPath, configMap, secret, downwardAPI, projected,
//! persistentVolumeClaim of a hostPath or local volume)
//! materialized on the node.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

use k8s_openapi::api::core::v1::{
    ConfigMap, Container, KeyToPath, ObjectFieldSelector, Pod, ResourceFieldSelector, Secret,
};
use kube::api::Api;

use crate::runtime::cri;
use crate::spec::{expand_with, name, namespace, quantity, uid};

/// Reads ConfigMaps and Secrets once per sync.
pub struct Fetcher {
    client: kube::Client,
    configmaps: HashMap<(String, String), Option<ConfigMap>>,
    secrets: HashMap<(String, String), Option<Secret>>,
    /// The pod's ServiceAccount tokens, kept across syncs by its worker.
    pub tokens: crate::satoken::TokenCache,
    /// This node's name, which a local volume's node affinity must allow
    /// (empty: not checked).
    pub node: String,
}

/// A problem that keeps a container from being created, shown to the user
/// as the waiting reason's message (CreateContainerConfigError).
pub type ConfigError = String;

impl Fetcher {
    pub fn new(client: kube::Client) -> Fetcher {
        Fetcher {
            client,
            configmaps: HashMap::new(),
            secrets: HashMap::new(),
            tokens: Default::default(),
            node: String::new(),
        }
    }

    /// A fetcher that reuses (and refreshes) the tokens a worker holds.
    pub fn with_tokens(client: kube::Client, tokens: crate::satoken::TokenCache) -> Fetcher {
        Fetcher {
            tokens,
            ..Fetcher::new(client)
        }
    }

    async fn configmap(&mut self, ns: &str, name: &str) -> Result<Option<ConfigMap>, ConfigError> {
        let key = (ns.to_string(), name.to_string());
        if let Some(v) = self.configmaps.get(&key) {
            return Ok(v.clone());
        }
        let api: Api<ConfigMap> = Api::namespaced(self.client.clone(), ns);
        let v = api
            .get_opt(name)
            .await
            .map_err(|e| format!("reading configmap {ns}/{name}: {e}"))?;
        self.configmaps.insert(key, v.clone());
        Ok(v)
    }

    pub(crate) async fn secret(
        &mut self,
        ns: &str,
        name: &str,
    ) -> Result<Option<Secret>, ConfigError> {
        let key = (ns.to_string(), name.to_string());
        if let Some(v) = self.secrets.get(&key) {
            return Ok(v.clone());
        }
        let api: Api<Secret> = Api::namespaced(self.client.clone(), ns);
        let v = api
            .get_opt(name)
            .await
            .map_err(|e| format!("reading secret {ns}/{name}: {e}"))?;
        self.secrets.insert(key, v.clone());
        Ok(v)
    }

    /// The data of a ConfigMap (text and binary) as bytes.
    async fn configmap_data(
        &mut self,
        ns: &str,
        name: &str,
    ) -> Result<Option<BTreeMap<String, Vec<u8>>>, ConfigError> {
        Ok(self.configmap(ns, name).await?.map(|cm| {
            let mut m: BTreeMap<String, Vec<u8>> = cm
                .data
                .unwrap_or_default()
                .into_iter()
                .map(|(k, v)| (k, v.into_bytes()))
                .collect();
            for (k, v) in cm.binary_data.unwrap_or_default() {
                m.insert(k, v.0);
            }
            m
        }))
    }

    async fn secret_data(
        &mut self,
        ns: &str,
        name: &str,
    ) -> Result<Option<BTreeMap<String, Vec<u8>>>, ConfigError> {
        Ok(self.secret(ns, name).await?.map(|s| {
            let mut m: BTreeMap<String, Vec<u8>> = s
                .data
                .unwrap_or_default()
                .into_iter()
                .map(|(k, v)| (k, v.0))
                .collect();
            for (k, v) in s.string_data.unwrap_or_default() {
                m.insert(k, v.into_bytes());
            }
            m
        }))
    }
}

/// The value of a downward-API field of the pod.
pub fn field_value(
    pod: &Pod,
    f: &ObjectFieldSelector,
    host_ip: &str,
    pod_ip: &str,
) -> Result<String, ConfigError> {
    let path = f.field_path.as_str();
    let m = &pod.metadata;
    let from_map = |map: &Option<BTreeMap<String, String>>, prefix: &str| -> Option<String> {
        let key = path.strip_prefix(prefix)?.strip_suffix("']")?;
        Some(
            map.as_ref()
                .and_then(|l| l.get(key))
                .cloned()
                .unwrap_or_default(),
        )
    };
    if let Some(v) = from_map(&m.labels, "metadata.labels['") {
        return Ok(v);
    }
    if let Some(v) = from_map(&m.annotations, "metadata.annotations['") {
        return Ok(v);
    }
    let spec = pod.spec.as_ref();
    Ok(match path {
        "metadata.name" => name(pod).to_string(),
        "metadata.namespace" => namespace(pod).to_string(),
        "metadata.uid" => uid(pod).to_string(),
        "metadata.labels" => format_map(m.labels.as_ref()),
        "metadata.annotations" => format_map(m.annotations.as_ref()),
        "spec.nodeName" => spec.and_then(|s| s.node_name.clone()).unwrap_or_default(),
        "spec.serviceAccountName" => spec
            .and_then(|s| s.service_account_name.clone())
            .unwrap_or_default(),
        "status.hostIP" | "status.hostIPs" => host_ip.to_string(),
        "status.podIP" | "status.podIPs" => pod_ip.to_string(),
        other => return Err(format!("unsupported fieldRef path {other:?}")),
    })
}

fn format_map(m: Option<&BTreeMap<String, String>>) -> String {
    m.map(|m| {
        m.iter()
            .map(|(k, v)| format!("{k}={v:?}"))
            .collect::<Vec<_>>()
            .join("\n")
    })
    .unwrap_or_default()
}

/// The value of a resourceFieldRef: the container's request or limit (the
/// node's allocatable when there is no limit), divided by the divisor and
/// rounded up, as Kubernetes does.
pub fn resource_value(
    pod: &Pod,
    r: &ResourceFieldSelector,
    node_alloc: &BTreeMap<String, f64>,
) -> Result<String, ConfigError> {
    let containers = pod
        .spec
        .as_ref()
        .map(|s| s.containers.clone())
        .unwrap_or_default();
    let cname = r.container_name.clone().unwrap_or_default();
    let c = containers
        .iter()
        .find(|c| cname.is_empty() || c.name == cname)
        .ok_or_else(|| format!("no container {cname:?} for resourceFieldRef"))?;
    let (kind, res) = r
        .resource
        .split_once('.')
        .ok_or_else(|| format!("bad resource {:?}", r.resource))?;
    let rr = c.resources.clone().unwrap_or_default();
    let table = if kind == "limits" {
        rr.limits
    } else {
        rr.requests
    };
    let value = table
        .and_then(|t| t.get(res).and_then(quantity))
        .or_else(|| {
            if kind == "limits" {
                node_alloc.get(res).copied()
            } else {
                Some(0.0)
            }
        })
        .unwrap_or(0.0);
    let divisor = r
        .divisor
        .as_ref()
        .and_then(quantity)
        .filter(|d| *d > 0.0)
        .unwrap_or(1.0);
    Ok(format!("{}", (value / divisor).ceil() as i64))
}

/// The environment of a container, in Kubernetes' order: envFrom first,
/// then env (later entries win; `$(VAR)` in values refers to earlier ones
/// and to the service variables), then the service variables
/// (`services`, see [`crate::svcenv`]) the container did not set itself.
pub async fn container_env(
    f: &mut Fetcher,
    pod: &Pod,
    c: &Container,
    host_ip: &str,
    pod_ip: &str,
    node_alloc: &BTreeMap<String, f64>,
    services: &BTreeMap<String, String>,
) -> Result<Vec<(String, String)>, ConfigError> {
    let ns = namespace(pod).to_string();
    let mut order: Vec<String> = vec![];
    let mut vals: BTreeMap<String, String> = BTreeMap::new();
    fn set(vals: &mut BTreeMap<String, String>, k: String, v: String, order: &mut Vec<String>) {
        if !vals.contains_key(&k) {
            order.push(k.clone());
        }
        vals.insert(k, v);
    }
    for from in c.env_from.iter().flatten() {
        let prefix = from.prefix.clone().unwrap_or_default();
        if let Some(r) = &from.config_map_ref {
            match f.configmap_data(&ns, &r.name).await? {
                Some(d) => {
                    for (k, v) in d {
                        set(
                            &mut vals,
                            format!("{prefix}{k}"),
                            String::from_utf8_lossy(&v).into_owned(),
                            &mut order,
                        );
                    }
                }
                None if r.optional == Some(true) => {}
                None => return Err(format!("configmap {:?} not found", r.name)),
            }
        }
        if let Some(r) = &from.secret_ref {
            match f.secret_data(&ns, &r.name).await? {
                Some(d) => {
                    for (k, v) in d {
                        set(
                            &mut vals,
                            format!("{prefix}{k}"),
                            String::from_utf8_lossy(&v).into_owned(),
                            &mut order,
                        );
                    }
                }
                None if r.optional == Some(true) => {}
                None => return Err(format!("secret {:?} not found", r.name)),
            }
        }
    }
    for e in c.env.iter().flatten() {
        let value = if let Some(v) = e.value.as_deref().filter(|v| !v.is_empty()) {
            // kubelet's mapping: the container's variables so far, then
            // the service variables.
            expand_with(v, |name| {
                vals.get(name)
                    .or_else(|| services.get(name))
                    .map(String::as_str)
            })
        } else if let Some(from) = &e.value_from {
            if let Some(fr) = &from.field_ref {
                field_value(pod, fr, host_ip, pod_ip)?
            } else if let Some(rr) = &from.resource_field_ref {
                let mut rr = rr.clone();
                if rr.container_name.as_deref().unwrap_or("").is_empty() {
                    rr.container_name = Some(c.name.clone());
                }
                resource_value(pod, &rr, node_alloc)?
            } else if let Some(k) = &from.config_map_key_ref {
                match f
                    .configmap_data(&ns, &k.name)
                    .await?
                    .and_then(|d| d.get(&k.key).cloned())
                {
                    Some(v) => String::from_utf8_lossy(&v).into_owned(),
                    None if k.optional == Some(true) => continue,
                    None => {
                        return Err(format!(
                            "couldn't find key {} in ConfigMap {}/{}",
                            k.key, ns, k.name
                        ))
                    }
                }
            } else if let Some(k) = &from.secret_key_ref {
                match f
                    .secret_data(&ns, &k.name)
                    .await?
                    .and_then(|d| d.get(&k.key).cloned())
                {
                    Some(v) => String::from_utf8_lossy(&v).into_owned(),
                    None if k.optional == Some(true) => continue,
                    None => {
                        return Err(format!(
                            "couldn't find key {} in Secret {}/{}",
                            k.key, ns, k.name
                        ))
                    }
                }
            } else {
                String::new()
            }
        } else {
            String::new()
        };
        set(&mut vals, e.name.clone(), value, &mut order);
    }
    for (k, v) in services {
        if !vals.contains_key(k) {
            set(&mut vals, k.clone(), v.clone(), &mut order);
        }
    }
    Ok(order
        .into_iter()
        .map(|k| {
            let v = vals.get(&k).cloned().unwrap_or_default();
            (k, v)
        })
        .collect())
}

/// Writes `files` into `dir` so that the directory holds exactly them,
/// replacing each changed file atomically (write then rename).
fn write_files(dir: &Path, files: &BTreeMap<String, (Vec<u8>, u32)>) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::create_dir_all(dir)?;
    for (rel, (data, mode)) in files {
        let path = dir.join(rel);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent)?;
        }
        let same = std::fs::read(&path)
            .map(|old| old == *data)
            .unwrap_or(false);
        if !same {
            let tmp = path.with_extension("skiff-tmp");
            std::fs::write(&tmp, data)?;
            std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(*mode))?;
            std::fs::rename(&tmp, &path)?;
        } else {
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(*mode))?;
        }
    }
    // Remove files that are no longer part of the volume.
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d)?.flatten() {
            let p = entry.path();
            if p.is_dir() {
                stack.push(p);
                continue;
            }
            let rel = p
                .strip_prefix(dir)
                .unwrap_or(&p)
                .to_string_lossy()
                .to_string();
            if !files.contains_key(&rel) {
                let _ = std::fs::remove_file(&p);
            }
        }
    }
    Ok(())
}

/// Selects and names the keys a volume projects.
fn project(
    data: BTreeMap<String, Vec<u8>>,
    items: Option<&Vec<KeyToPath>>,
    default_mode: u32,
    what: &str,
) -> Result<BTreeMap<String, (Vec<u8>, u32)>, ConfigError> {
    let mut out = BTreeMap::new();
    match items {
        Some(items) if !items.is_empty() => {
            for it in items {
                let v = data.get(&it.key).ok_or_else(|| {
                    format!(
                        "configmap references non-existent config key: {} ({what})",
                        it.key
                    )
                })?;
                let mode = it.mode.map(|m| m as u32).unwrap_or(default_mode);
                out.insert(it.path.clone(), (v.clone(), mode));
            }
        }
        _ => {
            for (k, v) in data {
                out.insert(k, (v, default_mode));
            }
        }
    }
    Ok(out)
}

/// Materializes the pod's volumes under `dir` (one directory per volume)
/// and returns the host path of each. Called on every sync, so ConfigMap and
/// Secret volumes follow their objects.
pub async fn prepare_volumes(
    f: &mut Fetcher,
    host: &dyn crate::host::Host,
    pod: &Pod,
    dir: &Path,
    host_ip: &str,
    pod_ip: &str,
) -> Result<HashMap<String, PathBuf>, ConfigError> {
    let ns = namespace(pod).to_string();
    let mut out = HashMap::new();
    let Some(spec) = pod.spec.as_ref() else {
        return Ok(out);
    };
    for v in spec.volumes.iter().flatten() {
        let vdir = dir.join(&v.name);
        let io = |e: std::io::Error| format!("volume {:?}: {e}", v.name);
        if let Some(ed) = &v.empty_dir {
            host.create_dir_all(&vdir).map_err(io)?;
            if ed.medium.as_deref() == Some("Memory") && !host.is_mountpoint(&vdir) {
                let size = ed.size_limit.as_ref().and_then(quantity).map(|l| l as u64);
                host.mount_tmpfs(&vdir, size)
                    .map_err(|e| format!("mounting tmpfs for volume {:?} failed: {e}", v.name))?;
            } else {
                use std::os::unix::fs::PermissionsExt;
                let _ = std::fs::set_permissions(&vdir, std::fs::Permissions::from_mode(0o777));
            }
            out.insert(v.name.clone(), vdir);
        } else if let Some(hp) = &v.host_path {
            let p = PathBuf::from(&hp.path);
            match hp.type_.as_deref() {
                Some("DirectoryOrCreate") => std::fs::create_dir_all(&p).map_err(io)?,
                Some("FileOrCreate") if !p.exists() => {
                    if let Some(parent) = p.parent() {
                        std::fs::create_dir_all(parent).map_err(io)?;
                    }
                    std::fs::write(&p, b"").map_err(io)?;
                }
                Some("Directory") if !p.is_dir() => {
                    return Err(format!(
                        "hostPath type check failed: {} is not a directory",
                        hp.path
                    ))
                }
                Some("File") if !p.is_file() => {
                    return Err(format!(
                        "hostPath type check failed: {} is not a file",
                        hp.path
                    ))
                }
                _ => {}
            }
            out.insert(v.name.clone(), p);
        } else if let Some(cm) = &v.config_map {
            let mode = cm.default_mode.unwrap_or(0o644) as u32;
            let files = match f.configmap_data(&ns, &cm.name).await? {
                Some(d) => project(d, cm.items.as_ref(), mode, &cm.name)?,
                None if cm.optional == Some(true) => BTreeMap::new(),
                None => return Err(format!("configmap {:?} not found", cm.name)),
            };
            write_files(&vdir, &files).map_err(io)?;
            out.insert(v.name.clone(), vdir);
        } else if let Some(s) = &v.secret {
            let sname = s.secret_name.clone().unwrap_or_default();
            let mode = s.default_mode.unwrap_or(0o644) as u32;
            let files = match f.secret_data(&ns, &sname).await? {
                Some(d) => project(d, s.items.as_ref(), mode, &sname)?,
                None if s.optional == Some(true) => BTreeMap::new(),
                None => return Err(format!("secret {sname:?} not found")),
            };
            write_files(&vdir, &files).map_err(io)?;
            out.insert(v.name.clone(), vdir);
        } else if let Some(d) = &v.downward_api {
            let mode = d.default_mode.unwrap_or(0o644) as u32;
            let mut files = BTreeMap::new();
            for it in d.items.iter().flatten() {
                let value = if let Some(fr) = &it.field_ref {
                    field_value(pod, fr, host_ip, pod_ip)?
                } else if let Some(rr) = &it.resource_field_ref {
                    resource_value(pod, rr, &BTreeMap::new())?
                } else {
                    String::new()
                };
                files.insert(
                    it.path.clone(),
                    (
                        value.into_bytes(),
                        it.mode.map(|m| m as u32).unwrap_or(mode),
                    ),
                );
            }
            write_files(&vdir, &files).map_err(io)?;
            out.insert(v.name.clone(), vdir);
        } else if let Some(p) = &v.projected {
            let mode = p.default_mode.unwrap_or(0o644) as u32;
            let mut files = BTreeMap::new();
            for src in p.sources.iter().flatten() {
                if let Some(cm) = &src.config_map {
                    match f.configmap_data(&ns, &cm.name).await? {
                        Some(d) => files.extend(project(d, cm.items.as_ref(), mode, &cm.name)?),
                        None if cm.optional == Some(true) => {}
                        None => return Err(format!("configmap {:?} not found", cm.name)),
                    }
                }
                if let Some(s) = &src.secret {
                    match f.secret_data(&ns, &s.name).await? {
                        Some(d) => files.extend(project(d, s.items.as_ref(), mode, &s.name)?),
                        None if s.optional == Some(true) => {}
                        None => return Err(format!("secret {:?} not found", s.name)),
                    }
                }
                if let Some(d) = &src.downward_api {
                    for it in d.items.iter().flatten() {
                        if let Some(fr) = &it.field_ref {
                            files.insert(
                                it.path.clone(),
                                (field_value(pod, fr, host_ip, pod_ip)?.into_bytes(), mode),
                            );
                        }
                    }
                }
                if let Some(t) = &src.service_account_token {
                    let audience = t.audience.as_deref().filter(|a| !a.is_empty());
                    let secs = t.expiration_seconds.unwrap_or(3600);
                    let token = f.tokens.get(&f.client, pod, audience, secs).await?;
                    files.insert(t.path.clone(), (token.into_bytes(), mode));
                }
            }
            crate::satoken::write_atomic(&vdir, &files).map_err(io)?;
            out.insert(v.name.clone(), vdir);
        } else if let Some(c) = &v.persistent_volume_claim {
            let path = crate::storage::claim_path(&f.client, &ns, &c.claim_name, &f.node).await?;
            out.insert(v.name.clone(), path);
        } else {
            // Kinds the agent cannot provide (CSI, cloud disks, …) keep the
            // pod waiting with a clear message.
            return Err(format!(
                "volume {:?}: this kind of volume is not supported by skiff's agent",
                v.name
            ));
        }
    }
    Ok(out)
}

/// Unmounts the tmpfs volumes of a pod directory before it is removed.
pub fn unmount_all(dir: &Path) {
    use crate::host::Host;
    crate::host::RealHost.unmount_all(dir);
}

/// The CRI mounts of a container from its volumeMounts.
pub fn mounts(
    c: &Container,
    volumes: &HashMap<String, PathBuf>,
) -> Result<Vec<cri::Mount>, ConfigError> {
    let mut out = vec![];
    for m in c.volume_mounts.iter().flatten() {
        let host = volumes
            .get(&m.name)
            .ok_or_else(|| format!("volumeMount {:?}: no volume of that name", m.name))?;
        let mut host = host.clone();
        if let Some(sub) = m.sub_path.as_deref().filter(|s| !s.is_empty()) {
            if sub.split('/').any(|part| part == "..") || sub.starts_with('/') {
                return Err(format!(
                    "subPath {sub:?} must be a relative path without '..'"
                ));
            }
            host = host.join(sub);
            if !host.exists() {
                let _ = std::fs::create_dir_all(&host);
            }
        }
        out.push(cri::Mount {
            container_path: m.mount_path.clone(),
            host_path: host.to_string_lossy().into_owned(),
            readonly: m.read_only.unwrap_or(false),
            ..Default::default()
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn volume_files_are_replaced_and_stale_ones_removed() {
        let dir = tempfile::tempdir().unwrap();
        let mut files = BTreeMap::new();
        files.insert("a".to_string(), (b"1".to_vec(), 0o644));
        files.insert("sub/b".to_string(), (b"2".to_vec(), 0o600));
        write_files(dir.path(), &files).unwrap();
        assert_eq!(std::fs::read(dir.path().join("sub/b")).unwrap(), b"2");
        files.remove("sub/b");
        files.insert("a".to_string(), (b"new".to_vec(), 0o644));
        write_files(dir.path(), &files).unwrap();
        assert_eq!(std::fs::read(dir.path().join("a")).unwrap(), b"new");
        assert!(!dir.path().join("sub/b").exists());
    }

    #[test]
    fn items_select_and_rename_keys_and_a_missing_key_is_an_error() {
        let mut data = BTreeMap::new();
        data.insert("k".to_string(), b"v".to_vec());
        let items = vec![KeyToPath {
            key: "k".into(),
            path: "dir/renamed".into(),
            mode: Some(0o400),
        }];
        let out = project(data.clone(), Some(&items), 0o644, "cm").unwrap();
        assert_eq!(out.get("dir/renamed"), Some(&(b"v".to_vec(), 0o400)));
        let bad = vec![KeyToPath {
            key: "nope".into(),
            path: "x".into(),
            mode: None,
        }];
        assert!(project(data, Some(&bad), 0o644, "cm").is_err());
    }

    /// A client for tests that read nothing: every request fails.
    fn no_api() -> kube::Client {
        let svc = tower::service_fn(|_req: http::Request<kube::client::Body>| async {
            Err::<http::Response<kube::client::Body>, _>(std::io::Error::other("no API"))
        });
        kube::Client::new(svc, "default")
    }

    #[tokio::test]
    async fn service_variables_follow_the_containers_own_and_its_values_can_name_them() {
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p", "namespace": "web", "uid": "u"},
            "spec": {"containers": [{
                "name": "c",
                "env": [
                    {"name": "API", "value": "https://$(KUBERNETES_SERVICE_HOST):$(KUBERNETES_SERVICE_PORT)"},
                    // The container's own value wins over the service's,
                    // and later references see it.
                    {"name": "KUBERNETES_SERVICE_PORT", "value": "6443"},
                    {"name": "AGAIN", "value": "$(KUBERNETES_SERVICE_PORT)/$(NOPE)"},
                ],
            }]},
        }))
        .unwrap();
        let c = pod.spec.as_ref().unwrap().containers[0].clone();
        let services: BTreeMap<String, String> = [
            ("KUBERNETES_SERVICE_HOST", "10.43.0.1"),
            ("KUBERNETES_SERVICE_PORT", "443"),
            ("KUBERNETES_PORT", "tcp://10.43.0.1:443"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        let mut f = Fetcher::new(no_api());
        let env = container_env(
            &mut f,
            &pod,
            &c,
            "192.0.2.1",
            "10.42.0.5",
            &BTreeMap::new(),
            &services,
        )
        .await
        .unwrap();
        let env: Vec<String> = env.into_iter().map(|(k, v)| format!("{k}={v}")).collect();
        assert_eq!(
            env,
            [
                "API=https://10.43.0.1:443",
                "KUBERNETES_SERVICE_PORT=6443",
                "AGAIN=6443/$(NOPE)",
                "KUBERNETES_PORT=tcp://10.43.0.1:443",
                "KUBERNETES_SERVICE_HOST=10.43.0.1",
            ]
        );
    }
}
