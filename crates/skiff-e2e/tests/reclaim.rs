//! Reclaimed capacity on a real node (`skiff up` over a private
//! containerd), driven with the real kubectl: a prod Deployment that
//! requests most of the node's cpu and uses almost none leaves its unused
//! part to batch pods, published on the Node as `skiff.io/batch-cpu`; a
//! batch Job asking for it runs while a plain pod asking for cpu stays
//! Pending; bad batch requests are refused with Kubernetes' wording; the
//! stats summary shows the prod pod's reservation; when the prod pod
//! starts to spin, its reservation grows past what is left and the batch
//! pod is evicted as kubelet evicts.

use skiff_e2e::{text, wait_until, Server, BUSYBOX};

fn node_field(s: &Server, path: &str) -> String {
    text(
        &s.kubectl(&[
            "get",
            "nodes",
            "-o",
            &format!("jsonpath={{.items[0]{path}}}"),
        ])
        .stdout,
    )
}

/// The batch group the agent makes idle, in the machine's cpu hierarchy
/// (cgroup v1's `cpu`, or the unified one).
fn batch_group() -> std::path::PathBuf {
    let v1 = std::path::Path::new("/sys/fs/cgroup/cpu/skiff-batch");
    if v1.exists() {
        v1.to_path_buf()
    } else {
        std::path::PathBuf::from("/sys/fs/cgroup/skiff-batch")
    }
}

/// The cpu time a container has used, in nanoseconds, from its cgroup
/// (v1's cpuacct, v2's cpu.stat).
fn cpu_used_ns(container: &str) -> u64 {
    let v1 = format!("/sys/fs/cgroup/cpuacct/skiff-batch/{container}/cpuacct.usage");
    if let Ok(t) = std::fs::read_to_string(&v1) {
        return t.trim().parse().expect("cpuacct.usage");
    }
    let stat = std::fs::read_to_string(format!("/sys/fs/cgroup/skiff-batch/{container}/cpu.stat"))
        .expect("the batch container's cgroup");
    stat.lines()
        .find_map(|l| l.strip_prefix("usage_usec "))
        .and_then(|u| u.trim().parse::<u64>().ok())
        .expect("usage_usec")
        * 1000
}

/// The cpu a container uses over two seconds, in cores.
fn cpu_rate(container: &str) -> f64 {
    let before = cpu_used_ns(container);
    std::thread::sleep(std::time::Duration::from_secs(2));
    (cpu_used_ns(container) - before) as f64 / 2e9
}

fn batch_cpu(s: &Server) -> Option<i64> {
    node_field(s, ".status.allocatable.skiff\\.io/batch-cpu")
        .trim()
        .parse()
        .ok()
}

#[test]
fn unused_requests_become_batch_capacity_that_batch_pods_run_in() {
    // A short decay so the test does not wait out the two-minute default;
    // the whole allocatable shared, so the machine's own load (other
    // tests) leaves something over.
    let s = Server::up_with(&[
        "--reservation-decay-seconds",
        "20",
        "--batch-cpu-threshold",
        "1",
    ]);
    let cpus: f64 = node_field(&s, ".status.allocatable.cpu")
        .parse()
        .expect("the node's allocatable cpu");
    let prod_milli = (cpus * 1000.0 * 0.9) as i64;
    s.ok_stdin(
        &["apply", "-f", "-"],
        &format!(
            r#"{{"apiVersion": "apps/v1", "kind": "Deployment",
  "metadata": {{"name": "prod"}},
  "spec": {{"replicas": 1, "selector": {{"matchLabels": {{"app": "prod"}}}},
    "template": {{"metadata": {{"labels": {{"app": "prod"}}}},
      "spec": {{"terminationGracePeriodSeconds": 1, "containers": [{{"name": "idle", "image": "{BUSYBOX}",
        "imagePullPolicy": "IfNotPresent", "command": ["sleep", "3600"],
        "resources": {{"requests": {{"cpu": "{prod_milli}m", "memory": "32Mi"}}}}}}]}}}}}}}}"#
        ),
    );
    wait_until("the prod pod Running", 120, || {
        let out = s.kubectl(&[
            "get",
            "pods",
            "-l",
            "app=prod",
            "-o",
            "jsonpath={.items[*].status.phase}",
        ]);
        (text(&out.stdout) == "Running").then_some(())
    });

    // Its reservation falls from 90% of the node to its usage plus the
    // margin, and the rest is published.
    let published = wait_until("skiff.io/batch-cpu above 200 on the Node", 120, || {
        batch_cpu(&s).filter(|v| *v > 200)
    });
    assert!(
        node_field(&s, ".status.capacity.skiff\\.io/batch-cpu")
            .parse::<i64>()
            .is_ok(),
        "capacity carries it too"
    );
    assert!(published <= (cpus * 1000.0) as i64, "{published}");

    // A plain pod asking for a third of the node's cpu does not fit: the
    // prod pod's request still holds for the scheduler.
    let plain = (cpus * 1000.0 / 3.0) as i64;
    s.ok(&[
        "run",
        "plain",
        "--image",
        BUSYBOX,
        "--image-pull-policy=IfNotPresent",
        &format!(
            r#"--overrides={{"spec": {{"containers": [{{"name": "plain", "image": "{BUSYBOX}", "command": ["sleep", "60"], "resources": {{"requests": {{"cpu": "{plain}m"}}}}}}]}}}}"#
        ),
    ]);
    let why = s.wait_unschedulable("plain");
    assert!(why.contains("Insufficient cpu"), "{why}");

    // A batch Job asking for reclaimed cpu runs to completion.
    s.ok_stdin(
        &["apply", "-f", "-"],
        &format!(
            r#"{{"apiVersion": "batch/v1", "kind": "Job", "metadata": {{"name": "crunch"}},
  "spec": {{"backoffLimit": 2, "template": {{"spec": {{"restartPolicy": "Never",
    "containers": [{{"name": "crunch", "image": "{BUSYBOX}", "imagePullPolicy": "IfNotPresent",
      "command": ["sh", "-c", "i=0; while [ $i -lt 20000 ]; do i=$((i+1)); done; echo crunched $i"],
      "resources": {{"requests": {{"skiff.io/batch-cpu": "200"}}, "limits": {{"skiff.io/batch-cpu": "200"}}}}}}]}}}}}}}}"#
        ),
    );
    wait_until("the batch Job complete", 180, || {
        let out = s.kubectl(&["get", "job", "crunch", "-o", "jsonpath={.status.succeeded}"]);
        (text(&out.stdout) == "1").then_some(())
    });
    let logs = s.ok(&["logs", "job/crunch"]);
    assert!(logs.contains("crunched 20000"), "{logs}");
    // The plain pod is still waiting.
    let phase = text(
        &s.kubectl(&["get", "pod", "plain", "-o", "jsonpath={.status.phase}"])
            .stdout,
    );
    assert_eq!(phase, "Pending");

    // A running batch container has the least cpu weight and its batch
    // limit as its CFS quota (cgroup v2 or v1, as the machine has). It
    // spins, so its cpu share can be watched.
    s.ok(&[
        "run",
        "spin",
        "--image",
        BUSYBOX,
        &format!(
            r#"--overrides={{"spec": {{"containers": [{{"name": "spin", "image": "{BUSYBOX}", "imagePullPolicy": "IfNotPresent", "command": ["sh", "-c", "while :; do :; done"], "resources": {{"requests": {{"skiff.io/batch-cpu": "200"}}, "limits": {{"skiff.io/batch-cpu": "200"}}}}}}]}}}}"#
        ),
    ]);
    wait_until("the batch pod Running", 120, || {
        let out = s.kubectl(&["get", "pod", "spin", "-o", "jsonpath={.status.phase}"]);
        (text(&out.stdout) == "Running").then_some(())
    });
    let cg = s.ok(&[
        "exec",
        "spin",
        "--",
        "sh",
        "-c",
        // v1: the cpu hierarchy's files; v2: the container's own cgroup,
        // named in /proc/self/cgroup ("0::/" in a private cgroup namespace).
        "if [ -d /sys/fs/cgroup/cpu ]; then cat /sys/fs/cgroup/cpu/cpu.shares /sys/fs/cgroup/cpu/cpu.cfs_quota_us; \
         else d=/sys/fs/cgroup$(sed -n 's/^0:://p' /proc/self/cgroup); [ -f \"$d/cpu.weight\" ] || d=/sys/fs/cgroup; \
         cat \"$d/cpu.weight\" \"$d/cpu.max\"; fi",
    ]);
    let lines: Vec<&str> = cg.lines().collect();
    assert!(
        lines == ["1", "20000 100000"] || lines == ["2", "20000"],
        "the batch container's cgroup: {cg:?}"
    );
    // On the node it lives in the batch group, which is idle: any other
    // task preempts it at its next wakeup.
    let id = s.ok(&[
        "get",
        "pod",
        "spin",
        "-o",
        "jsonpath={.status.containerStatuses[0].containerID}",
    ]);
    let id = id.trim().trim_start_matches("containerd://").to_string();
    let group = batch_group();
    assert!(
        group.join(&id).is_dir(),
        "the batch container's cgroup {id:?} under {} (it has {:?})",
        group.display(),
        std::fs::read_dir(&group)
            .map(|d| d
                .filter_map(|e| e.ok())
                .map(|e| e.file_name())
                .collect::<Vec<_>>())
            .unwrap_or_default()
    );
    assert_eq!(
        std::fs::read_to_string(group.join("cpu.idle"))
            .expect("a kernel with cpu.idle (5.15 or later)")
            .trim(),
        "1"
    );
    // QoS: it reserves nothing, so it is BestEffort (first to go under
    // memory pressure).
    let qos = text(
        &s.kubectl(&["get", "pod", "spin", "-o", "jsonpath={.status.qosClass}"])
            .stdout,
    );
    assert_eq!(qos, "BestEffort");

    // Bad batch requests: a fraction, and batch mixed with cpu.
    let bad = |resources: &str| {
        s.fails(&[
            "run",
            "bad",
            "--image",
            BUSYBOX,
            &format!(
                r#"--overrides={{"spec": {{"containers": [{{"name": "bad", "image": "{BUSYBOX}", "resources": {resources}}}]}}}}"#
            ),
        ])
    };
    let err = bad(
        r#"{"requests": {"skiff.io/batch-cpu": "1500m"}, "limits": {"skiff.io/batch-cpu": "1500m"}}"#,
    );
    assert!(err.contains("must be an integer"), "{err}");
    let err = bad(
        r#"{"requests": {"skiff.io/batch-cpu": "-1"}, "limits": {"skiff.io/batch-cpu": "-1"}}"#,
    );
    assert!(err.contains("must be greater than or equal to 0"), "{err}");
    let err = bad(
        r#"{"requests": {"skiff.io/batch-cpu": "100", "cpu": "100m"}, "limits": {"skiff.io/batch-cpu": "100"}}"#,
    );
    assert!(
        err.contains("spec.containers[0].resources.requests[cpu]") && err.contains("reclaimed"),
        "{err}"
    );
    let err = bad(
        r#"{"requests": {"skiff.io/batch-cpu": "100"}, "limits": {"skiff.io/batch-cpu": "200"}}"#,
    );
    assert!(
        err.contains("must be equal to skiff.io/batch-cpu limit of 200"),
        "{err}"
    );

    // The prod pod's reservation, in the node's stats summary.
    let prod = text(
        &s.kubectl(&[
            "get",
            "pods",
            "-l",
            "app=prod",
            "-o",
            "jsonpath={.items[0].metadata.name}",
        ])
        .stdout,
    );
    // Its reservation starts at its request and falls to its usage plus
    // the margin within the decay.
    wait_until(
        "the prod pod's reservation below its request in /stats/summary",
        120,
        || {
            let out = s.kubectl(&["get", "--raw", "/api/v1/nodes/e2e-node/proxy/stats/summary"]);
            let v: serde_json::Value = serde_json::from_slice(&out.stdout).ok()?;
            v["pods"]
                .as_array()?
                .iter()
                .find(|p| p["podRef"]["name"] == prod.as_str())?["reservation"]["cpuMilliCores"]
                .as_u64()
                .filter(|r| *r < prod_milli as u64)
        },
    );

    // The prod pod spins on every cpu: the batch pod's share collapses at
    // once, its reservation jumps, nothing is left for batch pods, and the
    // batch pod is evicted.
    let alone = cpu_rate(&id);
    s.ok(&[
        "exec",
        &prod,
        "--",
        "sh",
        "-c",
        &format!(
            "for i in $(seq {}); do (while :; do :; done) >/dev/null 2>&1 & done",
            cpus as i64
        ),
    ]);
    std::thread::sleep(std::time::Duration::from_millis(500));
    let beside_prod = cpu_rate(&id);
    eprintln!("batch cpu: {alone:.3} cores alone, {beside_prod:.3} beside spinning prod");
    assert!(
        alone > 0.05 && beside_prod < alone / 4.0,
        "the batch container's cpu: {alone:.3} cores alone, {beside_prod:.3} beside spinning prod"
    );
    let evicted = wait_until("the batch pod evicted", 120, || {
        let out = s.kubectl(&[
            "get",
            "pod",
            "spin",
            "-o",
            "jsonpath={.status.phase}/{.status.reason}",
        ]);
        let t = text(&out.stdout);
        t.starts_with("Failed").then_some(t)
    });
    assert_eq!(evicted, "Failed/Evicted");
    let message = s.ok(&["get", "pod", "spin", "-o", "jsonpath={.status.message}"]);
    assert!(
        message.starts_with("The node reclaimed skiff.io/batch-cpu for its prod pods: "),
        "{message}"
    );
    let dt = s.ok(&[
        "get",
        "pod",
        "spin",
        "-o",
        "jsonpath={.status.conditions[?(@.type==\"DisruptionTarget\")].reason}",
    ]);
    assert_eq!(dt.trim(), "TerminationByKubelet");
    // The prod pod was not touched.
    let phase = s.ok(&["get", "pod", &prod, "-o", "jsonpath={.status.phase}"]);
    assert_eq!(phase.trim(), "Running");
}
