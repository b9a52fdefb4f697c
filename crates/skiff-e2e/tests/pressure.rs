//! Node-pressure eviction on a real node (`skiff up` over a private
//! containerd), driven with the real kubectl: a node under a threshold it
//! certainly crosses reports MemoryPressure, gets the NoSchedule taint,
//! and evicts a BestEffort pod as kubelet does (Failed, Evicted, kubelet's
//! message, DisruptionTarget, an Event); a normal node reports no
//! pressure; a malformed `--eviction-hard` stops the start.

use skiff_e2e::{skiff_binary, text, wait_until, Server, BUSYBOX};

fn node_condition(s: &Server, type_: &str) -> (String, String) {
    let out = s.kubectl(&[
        "get",
        "node",
        "e2e-node",
        "-o",
        &format!(
            "jsonpath={{.status.conditions[?(@.type==\"{type_}\")].status}}/{{.status.conditions[?(@.type==\"{type_}\")].reason}}"
        ),
    ]);
    let t = text(&out.stdout);
    let (a, b) = t.split_once('/').unwrap_or_default();
    (a.to_string(), b.to_string())
}

fn taints(s: &Server) -> String {
    text(
        &s.kubectl(&[
            "get",
            "node",
            "e2e-node",
            "-o",
            "jsonpath={range .spec.taints[*]}{.key}={.effect};{end}",
        ])
        .stdout,
    )
}

#[test]
fn a_node_low_on_memory_reports_pressure_is_tainted_and_evicts_a_best_effort_pod() {
    // Less than 1Pi available: every machine is under this threshold.
    let s = Server::up_with(&["--eviction-hard", "memory.available<1Pi"]);
    wait_until("MemoryPressure=True on the Node", 60, || {
        let (status, reason) = node_condition(&s, "MemoryPressure");
        (status == "True" && reason == "KubeletHasInsufficientMemory").then_some(())
    });
    assert_eq!(
        node_condition(&s, "DiskPressure"),
        ("False".into(), "KubeletHasNoDiskPressure".into())
    );
    wait_until("the memory-pressure taint", 30, || {
        taints(&s)
            .contains("node.kubernetes.io/memory-pressure=NoSchedule")
            .then_some(())
    });

    // A BestEffort pod that tolerates the taint lands on the node and is
    // evicted.
    s.ok_stdin(
        &["apply", "-f", "-"],
        &format!(
            r#"{{"apiVersion": "v1", "kind": "Pod", "metadata": {{"name": "hog"}},
  "spec": {{"terminationGracePeriodSeconds": 30,
    "tolerations": [{{"key": "node.kubernetes.io/memory-pressure", "operator": "Exists", "effect": "NoSchedule"}}],
    "containers": [{{"name": "hog", "image": "{BUSYBOX}", "imagePullPolicy": "IfNotPresent",
      "command": ["sleep", "3600"]}}]}}}}"#
        ),
    );
    let reason = wait_until("the pod evicted", 120, || {
        let out = s.kubectl(&[
            "get",
            "pod",
            "hog",
            "-o",
            "jsonpath={.status.phase}/{.status.reason}",
        ]);
        let t = text(&out.stdout);
        (t.starts_with("Failed")).then_some(t)
    });
    assert_eq!(reason, "Failed/Evicted");
    let message = s.ok(&["get", "pod", "hog", "-o", "jsonpath={.status.message}"]);
    assert!(
        message.starts_with(
            "The node was low on resource: memory. Threshold quantity: 1Pi, available: "
        ),
        "{message}"
    );
    let dt = s.ok(&[
        "get",
        "pod",
        "hog",
        "-o",
        "jsonpath={.status.conditions[?(@.type==\"DisruptionTarget\")].reason}",
    ]);
    assert_eq!(dt.trim(), "TerminationByKubelet");
    // The container was killed, not left running.
    let state = s.ok(&[
        "get",
        "pod",
        "hog",
        "-o",
        "jsonpath={.status.containerStatuses[0].state.terminated.exitCode}",
    ]);
    assert!(!state.trim().is_empty(), "the container is terminated");
    let events = wait_until("the Evicted event", 30, || {
        let out = s.kubectl(&[
            "get",
            "events",
            "--field-selector",
            "involvedObject.name=hog,reason=Evicted",
            "-o",
            "jsonpath={.items[*].type}",
        ]);
        let t = text(&out.stdout);
        (!t.is_empty()).then_some(t)
    });
    assert!(events.contains("Warning"), "{events}");
    // A pod that does not tolerate the taint is not scheduled there.
    s.ok(&[
        "run",
        "plain",
        "--image",
        BUSYBOX,
        "--image-pull-policy=IfNotPresent",
        "--command",
        "--",
        "sleep",
        "60",
    ]);
    let why = s.wait_unschedulable("plain");
    assert!(why.contains("memory-pressure"), "{why}");
}

#[test]
fn a_normal_node_reports_no_pressure_and_no_taint() {
    // Only a memory threshold, so a nearly full disk of the test machine
    // does not count.
    let s = Server::up_with(&["--eviction-hard", "memory.available<1Ki"]);
    wait_until("the pressure conditions on the Node", 60, || {
        let (status, _) = node_condition(&s, "MemoryPressure");
        (!status.is_empty()).then_some(())
    });
    // Past a monitoring interval, still no pressure.
    std::thread::sleep(std::time::Duration::from_secs(12));
    assert_eq!(
        node_condition(&s, "MemoryPressure"),
        ("False".into(), "KubeletHasSufficientMemory".into())
    );
    assert_eq!(
        node_condition(&s, "PIDPressure"),
        ("False".into(), "KubeletHasSufficientPID".into())
    );
    assert!(!taints(&s).contains("pressure"), "{}", taints(&s));
}

#[test]
fn a_malformed_eviction_threshold_stops_the_start_with_a_clear_message() {
    let tmp = tempfile::tempdir().unwrap();
    for (flag, want) in [
        ("memory.available=100Mi", "--eviction-hard: malformed pair"),
        ("memory.free<1Gi", "unsupported eviction signal memory.free"),
        ("nodefs.available<150%", "must be <= 100%"),
    ] {
        let out = std::process::Command::new(skiff_binary())
            .arg("up")
            .arg("--data-dir")
            .arg(tmp.path().join("data"))
            .args(["--eviction-hard", flag])
            .output()
            .unwrap();
        let err = text(&out.stderr);
        assert!(!out.status.success(), "{flag}: {err}");
        assert!(err.contains(want), "{flag}: {err}");
    }
}
