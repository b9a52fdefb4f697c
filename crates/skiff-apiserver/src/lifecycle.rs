//! Loops the API server runs for itself: the built-in namespaces, the
//! system PriorityClasses, the `kubernetes` and `kube-dns` services and the default `local-path` StorageClass at first start, namespace finalization (emptying a
//! terminating namespace, then removing it), and store compaction.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use skiff_core::resources::{self, RESOURCES};
use skiff_core::ApiError;

use crate::object::{decode, meta_str};
use crate::options::{DeleteOptions, WriteOptions};
use crate::registry::Registry;
use crate::watchcache::Filter;

/// Namespaces that exist from the first start.
pub const SYSTEM_NAMESPACES: [&str; 4] =
    ["default", "kube-system", "kube-public", "kube-node-lease"];

/// Creates what a fresh cluster has: the system namespaces and the `kubernetes` and `kube-dns` services.
pub async fn bootstrap(reg: &Registry) -> Result<(), ApiError> {
    let ns = resources::lookup("", "v1", "namespaces").expect("namespaces");
    let opts = WriteOptions {
        field_manager: "skiff-apiserver".into(),
        ..Default::default()
    };
    for name in SYSTEM_NAMESPACES {
        let obj = json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}});
        match reg.create(ns, None, obj, &opts).await {
            Ok(_) => {}
            Err(e) if e.code == 409 => {}
            Err(e) => return Err(e),
        }
    }
    let pc =
        resources::lookup("scheduling.k8s.io", "v1", "priorityclasses").expect("priorityclasses");
    for (name, value, description) in skiff_core::admission::SYSTEM_PRIORITY_CLASSES {
        let obj = json!({"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass",
            "metadata": {"name": name}, "value": value, "description": description});
        match reg.create(pc, None, obj, &opts).await {
            Ok(_) => {}
            Err(e) if e.code == 409 => {}
            Err(e) => return Err(e),
        }
    }
    reconcile_rbac(reg, &opts).await?;
    let svc = resources::lookup("", "v1", "services").expect("services");
    let (base, _) = reg.config.service_cidr;
    let first = std::net::Ipv4Addr::from(u32::from(base) + 1);
    let obj = json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": "kubernetes", "namespace": "default", "labels": {"component": "apiserver", "provider": "kubernetes"}},
        "spec": {"type": "ClusterIP", "clusterIP": first.to_string(), "ports": [{"name": "https", "port": 443, "protocol": "TCP", "targetPort": 6443}]}
    });
    // Only at first start: after that the service exists (and owns its IP).
    if reg.get(svc, Some("default"), "kubernetes").await.is_err() {
        match reg.create(svc, Some("default"), obj, &opts).await {
            Ok(_) => {}
            Err(e) if e.code == 409 => {}
            // Another server starting on the same store is creating it
            // (its address is then already allocated): wait for it, 5 s.
            Err(e) => {
                let mut created = false;
                for _ in 0..50 {
                    if reg.get(svc, Some("default"), "kubernetes").await.is_ok() {
                        created = true;
                        break;
                    }
                    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                }
                if !created {
                    return Err(e);
                }
            }
        }
    }
    ensure_kube_dns(reg, &opts).await;
    ensure_local_storage_class(reg, &opts).await;
    Ok(())
}

/// The default StorageClass `local-path`, as k3s ships one: claims that
/// name no class get a directory on the node of their first pod (the
/// controller manager's local-path provisioner). Created when missing.
async fn ensure_local_storage_class(reg: &Registry, opts: &WriteOptions) {
    let sc = resources::lookup("storage.k8s.io", "v1", "storageclasses").expect("storageclasses");
    if reg.get(sc, None, "local-path").await.is_ok() {
        return;
    }
    let obj = json!({
        "apiVersion": "storage.k8s.io/v1", "kind": "StorageClass",
        "metadata": {"name": "local-path", "annotations": {
            "storageclass.kubernetes.io/is-default-class": "true"}},
        "provisioner": skiff_core::kinds::storage::LOCAL_PROVISIONER,
        "reclaimPolicy": "Delete",
        "volumeBindingMode": "WaitForFirstConsumer",
    });
    if let Err(e) = reg.create(sc, None, obj, opts).await {
        if e.code != 409 {
            tracing::warn!("creating the local-path StorageClass: {}", e.message);
        }
    }
}

/// The cluster DNS address: `--cluster-dns`, else the 10th address of the
/// service CIDR (10.43.0.10 by default), as kubeadm and k3s choose it.
pub fn cluster_dns_ip(config: &crate::options::RegistryConfig) -> std::net::Ipv4Addr {
    config.cluster_dns.unwrap_or_else(|| {
        let (base, _) = config.service_cidr;
        std::net::Ipv4Addr::from(u32::from(base) + 10)
    })
}

/// The `kube-dns` Service in kube-system: what pods' resolv.conf names and
/// `kubectl cluster-info` lists. It has no selector and no endpoints: every
/// agent answers on its address itself (`skiff.io/node-local`), so the
/// service proxy leaves it alone. Created when missing; an existing one is
/// left as the cluster's administrator has it.
async fn ensure_kube_dns(reg: &Registry, opts: &WriteOptions) {
    let svc = resources::lookup("", "v1", "services").expect("services");
    if reg.get(svc, Some("kube-system"), "kube-dns").await.is_ok() {
        return;
    }
    let ip = cluster_dns_ip(&reg.config).to_string();
    let obj = json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": "kube-dns", "namespace": "kube-system", "labels": {
            "k8s-app": "kube-dns",
            "kubernetes.io/cluster-service": "true",
            "kubernetes.io/name": "CoreDNS",
            "skiff.io/node-local": "true",
        }},
        "spec": {"type": "ClusterIP", "clusterIP": ip, "clusterIPs": [ip], "ports": [
            {"name": "dns", "port": 53, "protocol": "UDP", "targetPort": 53},
            {"name": "dns-tcp", "port": 53, "protocol": "TCP", "targetPort": 53},
            {"name": "metrics", "port": 9153, "protocol": "TCP", "targetPort": 9153},
        ]}
    });
    match reg.create(svc, Some("kube-system"), obj, opts).await {
        Ok(_) => {}
        Err(e) if e.code == 409 => {}
        // Its address taken by another service (a cluster from before the
        // DNS): serve on without it rather than refuse to start.
        Err(e) => {
            tracing::warn!(error = %e, cluster_dns = %ip, "cannot create the kube-dns service")
        }
    }
}

/// Empties namespaces that are being deleted, then removes them.
pub async fn namespace_finalizer(reg: Arc<Registry>) {
    let ns_res = resources::lookup("", "v1", "namespaces").expect("namespaces");
    let cache = reg.cache().resource(ns_res);
    let mut changed = cache.subscribe();
    loop {
        let terminating: Vec<String> = cache
            .snapshot(&Filter::default())
            .into_iter()
            .filter_map(|o| serde_json::from_slice::<Value>(&o.bytes()).ok())
            .filter(|v| !meta_str(v, "deletionTimestamp").is_empty())
            .map(|v| meta_str(&v, "name").to_string())
            .collect();
        let mut pending = false;
        for ns in &terminating {
            match finalize_namespace(&reg, ns).await {
                Ok(true) => {}
                Ok(false) => pending = true,
                Err(e) => {
                    tracing::warn!(namespace = %ns, error = %e, "finalizing namespace");
                    pending = true;
                }
            }
        }
        let wait = if pending {
            Duration::from_millis(500)
        } else {
            Duration::from_secs(30)
        };
        tokio::select! {
            r = changed.changed() => if r.is_err() { return },
            _ = tokio::time::sleep(wait) => {}
        }
    }
}

/// One pass over a terminating namespace; true when it is gone.
async fn finalize_namespace(reg: &Registry, ns: &str) -> Result<bool, ApiError> {
    let mut remaining = 0usize;
    let filter = Filter {
        namespace: Some(ns.to_string()),
        ..Default::default()
    };
    let mut seen = std::collections::HashSet::new();
    // Built-in and custom resources alike.
    for res in reg
        .cache()
        .catalog()
        .all()
        .into_iter()
        .filter(|r| r.namespaced)
    {
        if !seen.insert(res.storage) {
            continue;
        }
        for o in reg.cache().resource(res).snapshot(&filter) {
            remaining += 1;
            let v: Value = serde_json::from_slice(&o.bytes())
                .map_err(|e| ApiError::internal(e.to_string()))?;
            if !meta_str(&v, "deletionTimestamp").is_empty() {
                continue;
            }
            match reg
                .delete(res, Some(ns), &o.name, &DeleteOptions::default())
                .await
            {
                Ok(_) => {}
                Err(e) if e.code == 404 => {}
                Err(e) => return Err(e),
            }
        }
    }
    if remaining > 0 {
        return Ok(false);
    }
    // Empty: drop the `kubernetes` finalizer and the namespace with it.
    let ns_res = resources::lookup("", "v1", "namespaces").expect("namespaces");
    reg.guaranteed_update(ns_res, None, ns, None, |kv| async move {
        let Some(kv) = kv else {
            return Ok(true);
        };
        let mut obj = decode(&kv)?;
        let spec_finalizers: Vec<Value> = obj
            .pointer("/spec/finalizers")
            .and_then(Value::as_array)
            .map(|a| {
                a.iter()
                    .filter(|f| f.as_str() != Some("kubernetes"))
                    .cloned()
                    .collect()
            })
            .unwrap_or_default();
        let meta_finalizers = crate::object::finalizers(&obj);
        if spec_finalizers.is_empty() && meta_finalizers.is_empty() {
            reg.delete_at(ns_res, &kv).await?;
            return Ok(true);
        }
        if obj
            .pointer("/spec/finalizers")
            .and_then(Value::as_array)
            .map(|a| a.len())
            != Some(spec_finalizers.len())
        {
            obj["spec"]["finalizers"] = Value::Array(spec_finalizers);
            reg.write_at(ns_res, &kv, &obj).await?;
        }
        Ok(false)
    })
    .await
}

/// Compacts the store's history older than `keep`, every `every` (on etcd
/// the store claims each compaction, so of several API servers one does
/// it), and trims the watch cache's history with it (watches from before
/// then get 410).
pub async fn compactor(reg: Arc<Registry>, keep: Duration, every: Duration) {
    let mut samples: VecDeque<(Instant, i64)> = VecDeque::new();
    let mut ticker = tokio::time::interval(every);
    loop {
        ticker.tick().await;
        let Ok(rev) = reg.current_revision().await else {
            continue;
        };
        let now = Instant::now();
        samples.push_back((now, rev));
        let mut target = None;
        while let Some((t, r)) = samples.front().copied() {
            if now.duration_since(t) >= keep {
                target = Some(r);
                samples.pop_front();
            } else {
                break;
            }
        }
        if let Some(r) = target {
            // Another API server on the same etcd may have compacted already.
            if let Err(e) = reg.compact(r).await {
                tracing::warn!(error = %e, "compaction failed");
            }
        }
    }
}

/// Moves objects kept under skiff's first key layout
/// (`/registry/<group|core>/<plural>/…`) to Kubernetes' (`/registry/pods/…`,
/// `/registry/services/specs/…`), before anything reads them. Each object is
/// created at its new key, then deleted at its old one, so a crash midway
/// loses nothing and the next start finishes the move. Returns how many
/// objects moved.
pub async fn migrate_key_layout(
    store: &dyn skiff_store::Store,
) -> Result<usize, skiff_store::Error> {
    use skiff_store::{Error, ListOptions};
    let mut moved = 0;
    let mut done = std::collections::HashSet::new();
    for r in RESOURCES {
        if !done.insert(r.storage) {
            continue;
        }
        let Some(old) = crate::object::legacy_prefix(r.storage) else {
            continue;
        };
        let new = crate::object::resource_prefix(r);
        loop {
            let page = store
                .list(
                    &old,
                    ListOptions {
                        limit: 1000,
                        ..Default::default()
                    },
                )
                .await?;
            for kv in &page.items {
                let key = format!("{new}{}", &kv.key[old.len()..]);
                match store.create(&key, kv.value.clone()).await {
                    Ok(_) | Err(Error::AlreadyExists(_)) => {}
                    Err(e) => return Err(e),
                }
                match store.delete(&kv.key, None).await {
                    Ok(_) | Err(Error::NotFound(_)) => {}
                    Err(e) => return Err(e),
                }
                moved += 1;
            }
            if !page.more || page.items.is_empty() {
                break;
            }
        }
    }
    if moved > 0 {
        tracing::info!(moved, "moved objects to Kubernetes' key layout");
    }
    Ok(moved)
}

/// Reconciles the bootstrap RBAC policy as kube-apiserver does at every
/// start: missing roles and bindings are created; existing ones that keep
/// `rbac.authorization.kubernetes.io/autoupdate: "true"` get back missing
/// rules, labels, aggregation selectors and subjects (nothing is taken
/// away); with `autoupdate: "false"` they are left alone. The rules of an
/// aggregated role belong to the aggregation controller.
pub async fn reconcile_rbac(reg: &Registry, opts: &WriteOptions) -> Result<(), ApiError> {
    use skiff_core::bootstrap_policy::{self, AUTOUPDATE};
    use skiff_core::rbac::PolicyRule;
    let g = "rbac.authorization.k8s.io";
    let roles = resources::lookup(g, "v1", "clusterroles").expect("clusterroles");
    let bindings = resources::lookup(g, "v1", "clusterrolebindings").expect("clusterrolebindings");
    let wanted = bootstrap_policy::cluster_roles()
        .into_iter()
        .map(|r| (roles, r))
        .chain(
            bootstrap_policy::cluster_role_bindings()
                .into_iter()
                .map(|b| (bindings, b)),
        );
    for (res, want) in wanted {
        let name = meta_str(&want, "name").to_string();
        let mut cur = match reg.get(res, None, &name).await {
            Ok(cur) => cur,
            Err(e) if e.code == 404 => {
                match reg.create(res, None, want, opts).await {
                    Ok(_) => {}
                    Err(e) if e.code == 409 => {}
                    Err(e) => return Err(e),
                }
                continue;
            }
            Err(e) => return Err(e),
        };
        if cur.pointer(&format!(
            "/metadata/annotations/{}",
            AUTOUPDATE.replace('/', "~1")
        )) == Some(&json!("false"))
        {
            continue;
        }
        let before = cur.clone();
        for field in ["labels", "annotations"] {
            if let Some(Value::Object(w)) = want.pointer(&format!("/metadata/{field}")) {
                let m = crate::object::metadata_mut(&mut cur)
                    .entry(field)
                    .or_insert_with(|| json!({}));
                if let Some(m) = m.as_object_mut() {
                    for (k, v) in w {
                        m.entry(k.clone()).or_insert_with(|| v.clone());
                    }
                }
            }
        }
        // A ClusterRole (a binding has a roleRef).
        if want.get("roleRef").is_none() {
            if let Some(agg) = want.get("aggregationRule") {
                let sel = cur
                    .pointer_mut("/aggregationRule/clusterRoleSelectors")
                    .and_then(Value::as_array_mut);
                match sel {
                    Some(sel) => {
                        for s in agg["clusterRoleSelectors"].as_array().into_iter().flatten() {
                            if !sel.contains(s) {
                                sel.push(s.clone());
                            }
                        }
                    }
                    None => cur["aggregationRule"] = agg.clone(),
                }
            } else {
                let have = PolicyRule::rules_of(&cur);
                let missing: Vec<Value> = PolicyRule::rules_of(&want)
                    .into_iter()
                    .filter(|r| !skiff_core::rbac::covers(&have, std::slice::from_ref(r)).0)
                    .map(|r| r.to_json())
                    .collect();
                if !missing.is_empty() {
                    let rules = cur["rules"].as_array().cloned().unwrap_or_default();
                    cur["rules"] = Value::Array(rules.into_iter().chain(missing).collect());
                }
            }
        } else {
            let subjects = cur["subjects"].as_array().cloned().unwrap_or_default();
            let mut merged = subjects.clone();
            for s in want["subjects"].as_array().into_iter().flatten() {
                let same = |x: &Value| x["kind"] == s["kind"] && x["name"] == s["name"];
                if !merged.iter().any(same) {
                    merged.push(s.clone());
                }
            }
            if merged != subjects {
                cur["subjects"] = Value::Array(merged);
            }
        }
        if cur != before {
            reg.update(
                res,
                None,
                &name,
                cur,
                crate::request::Subresource::Main,
                opts,
            )
            .await?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use skiff_store::Store;

    #[tokio::test]
    async fn objects_in_the_first_key_layout_move_to_kubernetes_layout() {
        let dir = tempfile::tempdir().unwrap();
        let store =
            skiff_store::RedbStore::open(&dir.path().join("s.redb"), Default::default()).unwrap();
        let b = |s: &str| bytes::Bytes::copy_from_slice(s.as_bytes());
        store
            .create("/registry/core/configmaps/default/a", b("cm"))
            .await
            .unwrap();
        store
            .create("/registry/core/nodes/n1", b("node"))
            .await
            .unwrap();
        store
            .create("/registry/apps/deployments/ns/d", b("deploy"))
            .await
            .unwrap();
        store
            .create("/registry/pods/ns/p", b("already moved"))
            .await
            .unwrap();
        assert_eq!(migrate_key_layout(&*store).await.unwrap(), 3);
        let all = store.list("/registry/", Default::default()).await.unwrap();
        let got: Vec<_> = all
            .items
            .iter()
            .map(|kv| (kv.key.as_str(), kv.value.clone()))
            .collect();
        assert_eq!(
            got,
            [
                ("/registry/configmaps/default/a", b("cm")),
                ("/registry/deployments/ns/d", b("deploy")),
                ("/registry/minions/n1", b("node")),
                ("/registry/pods/ns/p", b("already moved")),
            ]
        );
        // Nothing left to move the next time.
        assert_eq!(migrate_key_layout(&*store).await.unwrap(), 0);
    }
}
