//! Where the API server's memory per stored pod goes (issue 16, B6).
//!
//! ```sh
//! cargo run --release -p skiff-apiserver --example mem_scale -- [--pods 30000] [--cache-mib 256] [--window 95]
//! ```
//!
//! Runs the embedded store (durable, in a temporary directory) and the watch
//! cache in this process and attributes the growth of its RSS per pod to
//! each part (run it with `_RJEM_MALLOC_CONF=dirty_decay_ms:0,muzzy_decay_ms:0`
//! to return freed pages at once: the difference is the allocator's retention):
//!
//! 1. the store alone: `--pods` pods written as a Deployment's pods are
//!    (create, bind, two status updates) — the redb page cache, its index
//!    and the store's event ring full of pod events;
//! 2. the event ring: measured by pushing it full of small Lease updates;
//! 3. the watch cache's objects: started over the loaded store (one list);
//! 4. the watch cache's history: one more update of every pod, measured
//!    while the history window holds it and after it has passed.
//!
//! Each stage prints RSS, its growth per pod since the previous stage and
//! since the start, against the pod's JSON size.

use std::sync::atomic::{AtomicI64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use serde_json::{json, Value};
use skiff_apiserver::watchcache::{Filter, WatchCache};
use skiff_store::{RedbOptions, RedbStore, Store};

#[global_allocator]
static ALLOC: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

fn arg(name: &str, default: usize) -> usize {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn rss_bytes() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find(|l| l.starts_with("VmRSS:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse::<u64>().ok())
        .unwrap_or(0)
        * 1024
}

/// A pod as a Deployment's ReplicaSet creates it and the scheduler and a
/// node fill it in; `stage` 0 = created, 1 = bound, 2 = pending on the
/// node, 3 = running (what B6's pods go through).
fn pod(i: usize, stage: u8) -> Value {
    let name = format!("web-{:04}-7c9d8f6b5-{:05}", i / 100, i);
    let rs = format!("web-{:04}-7c9d8f6b5", i / 100);
    let node = format!("hollow-{:05}", i % 2000);
    let mut managed = vec![json!({
        "manager": "kube-controller-manager", "operation": "Update", "apiVersion": "v1",
        "time": "2026-11-25T17:55:01Z", "fieldsType": "FieldsV1",
        "fieldsV1": {"f:metadata": {"f:generateName": {}, "f:labels": {".": {}, "f:app": {}, "f:pod-template-hash": {}},
            "f:ownerReferences": {".": {}, "k:{\"uid\":\"5d0c4c36-0c55-4c1e-9d52-2b1f0e0b8a11\"}": {}}},
            "f:spec": {"f:containers": {"k:{\"name\":\"c\"}": {".": {}, "f:image": {}, "f:imagePullPolicy": {}, "f:name": {},
                "f:resources": {".": {}, "f:requests": {".": {}, "f:cpu": {}, "f:memory": {}}},
                "f:terminationMessagePath": {}, "f:terminationMessagePolicy": {}}},
                "f:dnsPolicy": {}, "f:enableServiceLinks": {}, "f:restartPolicy": {}, "f:schedulerName": {},
                "f:securityContext": {}, "f:terminationGracePeriodSeconds": {}}}
    })];
    if stage >= 2 {
        managed.push(json!({
            "manager": "skiff-agent", "operation": "Update", "apiVersion": "v1", "subresource": "status",
            "time": "2026-11-25T17:55:03Z", "fieldsType": "FieldsV1",
            "fieldsV1": {"f:status": {"f:conditions": {"k:{\"type\":\"ContainersReady\"}": {".": {}, "f:lastProbeTime": {}, "f:lastTransitionTime": {}, "f:status": {}, "f:type": {}},
                "k:{\"type\":\"Initialized\"}": {".": {}, "f:lastProbeTime": {}, "f:lastTransitionTime": {}, "f:status": {}, "f:type": {}},
                "k:{\"type\":\"Ready\"}": {".": {}, "f:lastProbeTime": {}, "f:lastTransitionTime": {}, "f:status": {}, "f:type": {}}},
                "f:containerStatuses": {}, "f:hostIP": {}, "f:phase": {}, "f:podIP": {}, "f:podIPs": {}, "f:startTime": {}}}
        }));
    }
    let mut p = json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {
            "name": name, "generateName": format!("{rs}-"), "namespace": "default",
            "uid": format!("3f6c1d2e-8b7a-4c5d-9e0f-{:012}", i),
            "creationTimestamp": "2026-11-25T17:55:01Z",
            "labels": {"app": format!("web-{:04}", i / 100), "pod-template-hash": "7c9d8f6b5"},
            "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": rs,
                "uid": "5d0c4c36-0c55-4c1e-9d52-2b1f0e0b8a11", "controller": true, "blockOwnerDeletion": true}],
            "managedFields": managed
        },
        "spec": {
            "containers": [{"name": "c", "image": "skiff.local/busybox:1", "command": ["sleep", "3600"],
                "resources": {"requests": {"cpu": "1m", "memory": "1Mi"}},
                "volumeMounts": [{"name": "kube-api-access-x7k2p", "readOnly": true,
                    "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount"}],
                "terminationMessagePath": "/dev/termination-log", "terminationMessagePolicy": "File",
                "imagePullPolicy": "IfNotPresent"}],
            "volumes": [{"name": "kube-api-access-x7k2p", "projected": {"defaultMode": 420, "sources": [
                {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}},
                {"configMap": {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
                {"downwardAPI": {"items": [{"path": "namespace", "fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.namespace"}}]}}]}}],
            "restartPolicy": "Always", "terminationGracePeriodSeconds": 30, "dnsPolicy": "ClusterFirst",
            "serviceAccountName": "default", "serviceAccount": "default", "securityContext": {},
            "schedulerName": "default-scheduler", "enableServiceLinks": true, "priority": 0,
            "preemptionPolicy": "PreemptLowerPriority",
            "tolerations": [
                {"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300},
                {"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300}]
        },
        "status": {"phase": "Pending", "qosClass": "Burstable"}
    });
    if stage >= 1 {
        p["spec"]["nodeName"] = json!(node);
        p["status"]["conditions"] = json!([{"type": "PodScheduled", "status": "True", "lastProbeTime": null,
            "lastTransitionTime": "2026-11-25T17:55:02Z"}]);
    }
    if stage >= 2 {
        let ready = if stage >= 3 { "True" } else { "False" };
        p["status"] = json!({
            "phase": if stage >= 3 { "Running" } else { "Pending" }, "qosClass": "Burstable",
            "hostIP": "10.0.0.1", "hostIPs": [{"ip": "10.0.0.1"}],
            "podIP": format!("10.244.{}.{}", (i / 250) % 250, i % 250 + 2),
            "podIPs": [{"ip": format!("10.244.{}.{}", (i / 250) % 250, i % 250 + 2)}],
            "startTime": "2026-11-25T17:55:03Z",
            "conditions": [
                {"type": "PodReadyToStartContainers", "status": "True", "lastProbeTime": null, "lastTransitionTime": "2026-11-25T17:55:03Z"},
                {"type": "Initialized", "status": "True", "lastProbeTime": null, "lastTransitionTime": "2026-11-25T17:55:03Z"},
                {"type": "Ready", "status": ready, "lastProbeTime": null, "lastTransitionTime": "2026-11-25T17:55:04Z"},
                {"type": "ContainersReady", "status": ready, "lastProbeTime": null, "lastTransitionTime": "2026-11-25T17:55:04Z"},
                {"type": "PodScheduled", "status": "True", "lastProbeTime": null, "lastTransitionTime": "2026-11-25T17:55:02Z"}],
            "containerStatuses": [{"name": "c", "ready": stage >= 3, "restartCount": 0, "started": stage >= 3,
                "image": "skiff.local/busybox:1", "imageID": "sha256:3f57d9401f8d42f986df300f0c69192fc41da28ccc8d797829467780db3dd741",
                "containerID": format!("containerd://{:064x}", i),
                "state": if stage >= 3 { json!({"running": {"startedAt": "2026-11-25T17:55:04Z"}}) }
                         else { json!({"waiting": {"reason": "ContainerCreating"}}) }}]
        });
    }
    p
}

struct Stage {
    rss: u64,
}

fn measure(label: &str, pods: usize, json: usize, base: &Stage, prev: &Stage) -> Stage {
    let s = Stage { rss: rss_bytes() };
    let per = |a: f64| a / pods as f64;
    println!(
        "{label:<46} RSS {:>7.1} MiB  {:>+7.0} B/pod vs previous  {:>7.0} B/pod in all = {:.2}x JSON",
        s.rss as f64 / 1048576.0,
        per(s.rss as f64 - prev.rss as f64),
        per(s.rss as f64 - base.rss as f64),
        per(s.rss as f64 - base.rss as f64) / json as f64,
    );
    s
}

async fn write_all(store: &Arc<dyn Store>, pods: usize, stage: u8, revs: &Arc<Vec<AtomicI64>>) {
    let next = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for _ in 0..256 {
        let store = store.clone();
        let next = next.clone();
        let revs = revs.clone();
        tasks.push(tokio::spawn(async move {
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= pods {
                    break;
                }
                let key = format!(
                    "/registry/pods/default/web-{:04}-7c9d8f6b5-{:05}",
                    i / 100,
                    i
                );
                let value = Bytes::from(serde_json::to_vec(&pod(i, stage)).unwrap());
                let kv = if stage == 0 {
                    store.create(&key, value).await.expect("create")
                } else {
                    store
                        .update(&key, value, revs[i].load(Ordering::Relaxed))
                        .await
                        .expect("update")
                };
                revs[i].store(kv.mod_revision, Ordering::Relaxed);
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
}

/// Pushes the store's event ring full of small events (Lease renewals).
async fn flush_ring(store: &Arc<dyn Store>, n: usize) {
    let key = "/registry/leases/kube-node-lease/flush";
    let lease = |i: usize| {
        Bytes::from(
            serde_json::to_vec(&json!({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                "metadata": {"name": "flush", "namespace": "kube-node-lease"},
                "spec": {"holderIdentity": "flush", "leaseDurationSeconds": 40, "renewTime": format!("{i}")}}))
            .unwrap(),
        )
    };
    let mut rev = match store.get(key).await.unwrap() {
        Some(kv) => kv.mod_revision,
        None => store.create(key, lease(0)).await.unwrap().mod_revision,
    };
    // Concurrent writers to distinct keys, so group commit batches them.
    let next = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for t in 0..64 {
        let store = store.clone();
        let next = next.clone();
        tasks.push(tokio::spawn(async move {
            let key = format!("/registry/leases/kube-node-lease/flush-{t}");
            let mut rev = match store.get(&key).await.unwrap() {
                Some(kv) => kv.mod_revision,
                None => store.create(&key, lease(0)).await.unwrap().mod_revision,
            };
            while next.fetch_add(1, Ordering::Relaxed) < n {
                rev = store
                    .update(&key, lease(1), rev)
                    .await
                    .unwrap()
                    .mod_revision;
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    rev = store.update(key, lease(2), rev).await.unwrap().mod_revision;
    let _ = rev;
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let pods = arg("--pods", 30_000);
    let cache_mib = arg("--cache-mib", RedbOptions::default().cache_bytes >> 20);
    let ring = arg("--ring", RedbOptions::default().watch_buffer);
    let window = arg("--window", 95);
    let compress = arg("--compress", 1) != 0;
    skiff_apiserver::watchcache::set_compress_cold(compress);
    let json = serde_json::to_vec(&pod(1, 3)).unwrap().len();
    println!(
        "mem_scale: {pods} pods of {json} B of JSON when running; redb cache {cache_mib} MiB, event ring {ring}, cold objects compressed: {compress}"
    );
    let dir = tempfile::tempdir().unwrap();
    let base = Stage { rss: rss_bytes() };
    let opts = RedbOptions {
        cache_bytes: cache_mib << 20,
        watch_buffer: ring,
        ..Default::default()
    };
    let store: Arc<dyn Store> = RedbStore::open(&dir.path().join("db"), opts).unwrap();
    let s = measure("store opened", pods, json, &base, &base);
    let revs: Arc<Vec<AtomicI64>> = Arc::new((0..pods).map(|_| AtomicI64::new(0)).collect());
    let t = Instant::now();
    for stage in 0..4 {
        write_all(&store, pods, stage, &revs).await;
    }
    println!(
        "  {} writes in {:.1} s",
        pods * 4,
        t.elapsed().as_secs_f64()
    );
    let s = measure("1. store after 4 writes per pod", pods, json, &base, &s);
    flush_ring(&store, ring + 1024).await;
    let s = measure(
        "2. event ring flushed (small events)",
        pods,
        json,
        &base,
        &s,
    );
    let before_list = s;
    let t = Instant::now();
    {
        let mut start_after = None;
        loop {
            let page = store
                .list(
                    "/registry/",
                    skiff_store::ListOptions {
                        limit: 10_000,
                        start_after,
                        ..Default::default()
                    },
                )
                .await
                .unwrap();
            start_after = page.items.last().map(|kv| kv.key.clone());
            if !page.more {
                break;
            }
        }
    }
    println!(
        "  the store's list of everything, pages of 10,000: {:.2} s",
        t.elapsed().as_secs_f64()
    );
    let s = measure(
        "3. store read once (redb read cache warm)",
        pods,
        json,
        &base,
        &before_list,
    );
    let wc = WatchCache::start(store.clone()).await.unwrap();
    let pods_res = skiff_core::resources::lookup("", "v1", "pods").unwrap();
    assert_eq!(
        wc.resource(pods_res).snapshot(&Filter::default()).len(),
        pods
    );
    let s = measure("4. watch cache loaded", pods, json, &base, &s);
    let cached = wc
        .resource(pods_res)
        .get(&format!(
            "/registry/pods/default/web-{:04}-7c9d8f6b5-{:05}",
            0, 1
        ))
        .unwrap();
    println!(
        "  one cached pod: {} B of bytes, {} labels, {} fields",
        cached.bytes().len(),
        cached.labels.len(),
        cached.fields.len()
    );
    drop(cached);
    // The sweep (every 15 s) compresses the loaded objects, all cold.
    tokio::time::sleep(Duration::from_secs(16)).await;
    let s = measure("4b. after one history sweep", pods, json, &base, &s);
    // What an unpaged LIST of all pods reads from the cache.
    for _ in 0..3 {
        let t = Instant::now();
        let n: usize = wc
            .resource(pods_res)
            .snapshot(&Filter::default())
            .iter()
            .map(|o| o.bytes().len())
            .sum();
        println!(
            "  all pods' JSON from the cache ({} MiB): {:.3} s",
            n >> 20,
            t.elapsed().as_secs_f64()
        );
    }
    write_all(&store, pods, 3, &revs).await;
    let rev = store.current_revision().await.unwrap();
    assert!(wc.wait_for(rev, Duration::from_secs(60)).await);
    let s = measure(
        "5. one more update per pod (history held)",
        pods,
        json,
        &base,
        &s,
    );
    flush_ring(&store, ring + 1024).await;
    let s = measure("6. event ring flushed again", pods, json, &base, &s);
    tokio::time::sleep(Duration::from_secs(window as u64)).await;
    // One event after the window, so the pods' history is trimmed.
    flush_ring(&store, 64).await;
    let _ = measure(
        &format!("7. after {window} s (history window passed)"),
        pods,
        json,
        &base,
        &s,
    );
}
