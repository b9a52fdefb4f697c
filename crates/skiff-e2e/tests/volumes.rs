//! Persistent volumes on `skiff up`: a StatefulSet's claim gets a local
//! volume on the node of its pod from the default `local-path`
//! StorageClass, data survives the pod, a volume made by hand binds to a
//! claim that fits it, and deleting a claim deletes its provisioned volume
//! and the directory behind it.

use skiff_e2e::{wait_until, Server, BUSYBOX};

fn get(s: &Server, what: &[&str], path: &str) -> String {
    let mut args = vec!["get"];
    args.extend_from_slice(what);
    let out_arg = format!("jsonpath={path}");
    args.extend_from_slice(&["-o", &out_arg]);
    skiff_e2e::text(&s.kubectl(&args).stdout)
}

#[test]
fn a_statefulsets_claim_gets_a_local_volume_that_outlives_its_pod() {
    let s = Server::up();
    assert_eq!(
        get(
            &s,
            &["storageclass", "local-path"],
            "{.provisioner} {.volumeBindingMode}"
        ),
        "skiff.io/local-path WaitForFirstConsumer"
    );
    let sts = format!(
        r#"{{"apiVersion": "apps/v1", "kind": "StatefulSet", "metadata": {{"name": "db"}},
  "spec": {{"serviceName": "db", "replicas": 1, "selector": {{"matchLabels": {{"app": "db"}}}},
    "template": {{"metadata": {{"labels": {{"app": "db"}}}}, "spec": {{
      "terminationGracePeriodSeconds": 0,
      "containers": [{{"name": "db", "image": "{BUSYBOX}", "imagePullPolicy": "IfNotPresent",
        "command": ["sh", "-c", "[ -f /data/first ] || date > /data/first; echo up >> /data/log; exec sleep 3600"],
        "volumeMounts": [{{"name": "data", "mountPath": "/data"}}]}}]}}}},
    "volumeClaimTemplates": [{{"metadata": {{"name": "data"}},
      "spec": {{"accessModes": ["ReadWriteOnce"], "resources": {{"requests": {{"storage": "1Gi"}}}}}}}}]}}}}"#
    );
    s.ok_stdin(&["apply", "-f", "-"], &sts);
    wait_until("db-0 running", 120, || {
        (get(&s, &["pod", "db-0"], "{.status.phase}") == "Running").then_some(())
    });
    let claim = get(
        &s,
        &["pvc", "data-db-0"],
        "{.status.phase} {.spec.storageClassName} {.spec.volumeName}",
    );
    let parts: Vec<&str> = claim.split(' ').collect();
    assert_eq!(&parts[..2], ["Bound", "local-path"], "{claim}");
    let pv = parts[2].to_string();
    assert!(pv.starts_with("pvc-"), "{claim}");
    let node = get(&s, &["pod", "db-0"], "{.spec.nodeName}");
    let (path, affinity) = {
        let out = get(
            &s,
            &["pv", &pv],
            "{.spec.hostPath.path}|{.spec.nodeAffinity.required.nodeSelectorTerms[0].matchExpressions[0].values[0]}|{.status.phase}|{.spec.claimRef.name}",
        );
        let f: Vec<String> = out.split('|').map(str::to_string).collect();
        assert_eq!(&f[2..], ["Bound", "data-db-0"], "{out}");
        (f[0].clone(), f[1].clone())
    };
    assert_eq!(affinity, node);
    assert!(
        path.starts_with(&s.dir.path().to_string_lossy().to_string()),
        "the volume lives in the node's data directory: {path}"
    );
    let first = s.ok(&["exec", "db-0", "--", "cat", "/data/first"]);
    assert!(std::path::Path::new(&path).join("first").exists());

    // The pod goes; its replacement finds the same data.
    s.ok(&["delete", "pod", "db-0", "--wait=false"]);
    wait_until("db-0 back with its data", 120, || {
        let log = s.kubectl(&["exec", "db-0", "--", "cat", "/data/log"]);
        (skiff_e2e::text(&log.stdout).lines().count() >= 2).then_some(())
    });
    assert_eq!(s.ok(&["exec", "db-0", "--", "cat", "/data/first"]), first);

    // Deleting the claim (after its StatefulSet) deletes the volume and
    // its directory (the class reclaims with Delete).
    s.ok(&["delete", "statefulset", "db", "--wait=false"]);
    wait_until("db-0 gone", 120, || {
        (!s.kubectl(&["get", "pod", "db-0"]).status.success()).then_some(())
    });
    s.ok(&["delete", "pvc", "data-db-0"]);
    wait_until("the volume deleted", 60, || {
        (!s.kubectl(&["get", "pv", &pv]).status.success()).then_some(())
    });
    wait_until("its directory removed", 60, || {
        (!std::path::Path::new(&path).exists()).then_some(())
    });
}

#[test]
fn a_volume_made_by_hand_binds_to_the_claim_that_fits_it() {
    let s = Server::up();
    let host = s.dir.path().join("by-hand");
    std::fs::create_dir_all(&host).unwrap();
    std::fs::write(host.join("greeting"), "hello from the host\n").unwrap();
    let manifests = format!(
        r#"{{"apiVersion": "v1", "kind": "List", "items": [
  {{"apiVersion": "v1", "kind": "PersistentVolume", "metadata": {{"name": "small", "labels": {{"tier": "db"}}}},
    "spec": {{"capacity": {{"storage": "1Gi"}}, "accessModes": ["ReadWriteOnce"], "storageClassName": "manual",
      "persistentVolumeReclaimPolicy": "Retain", "hostPath": {{"path": "{host}"}}}}}},
  {{"apiVersion": "v1", "kind": "PersistentVolume", "metadata": {{"name": "too-small", "labels": {{"tier": "db"}}}},
    "spec": {{"capacity": {{"storage": "100Mi"}}, "accessModes": ["ReadWriteOnce"], "storageClassName": "manual",
      "hostPath": {{"path": "{host}"}}}}}},
  {{"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {{"name": "want"}},
    "spec": {{"storageClassName": "manual", "accessModes": ["ReadWriteOnce"],
      "resources": {{"requests": {{"storage": "500Mi"}}}}, "selector": {{"matchLabels": {{"tier": "db"}}}}}}}},
  {{"apiVersion": "v1", "kind": "Pod", "metadata": {{"name": "reader"}},
    "spec": {{"terminationGracePeriodSeconds": 0, "containers": [{{"name": "r", "image": "{BUSYBOX}",
      "imagePullPolicy": "IfNotPresent", "command": ["sleep", "3600"],
      "volumeMounts": [{{"name": "v", "mountPath": "/v"}}]}}],
      "volumes": [{{"name": "v", "persistentVolumeClaim": {{"claimName": "want"}}}}]}}}}
]}}"#,
        host = host.display()
    );
    s.ok_stdin(&["apply", "-f", "-"], &manifests);
    wait_until("the claim bound", 60, || {
        (get(&s, &["pvc", "want"], "{.status.phase}") == "Bound").then_some(())
    });
    assert_eq!(get(&s, &["pvc", "want"], "{.spec.volumeName}"), "small");
    wait_until("the volume that does not fit stays Available", 30, || {
        (get(&s, &["pv", "too-small"], "{.status.phase}") == "Available").then_some(())
    });
    wait_until("reader running", 120, || {
        (get(&s, &["pod", "reader"], "{.status.phase}") == "Running").then_some(())
    });
    assert_eq!(
        s.ok(&["exec", "reader", "--", "cat", "/v/greeting"]),
        "hello from the host\n"
    );
    // Retain: the claim's deletion leaves the volume Released, data kept.
    s.ok(&["delete", "pod", "reader", "--wait=false"]);
    s.ok(&["delete", "pvc", "want", "--wait=false"]);
    wait_until("the volume released", 60, || {
        (get(&s, &["pv", "small"], "{.status.phase}") == "Released").then_some(())
    });
    assert!(host.join("greeting").exists());
}
