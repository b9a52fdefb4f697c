//! In-place pod resize on a real node (`skiff up` over a private
//! containerd), driven with the real kubectl's `patch --subresource
//! resize`: a running container's cpu and memory change in its cgroup
//! without a restart and the status reports them; a resize beyond the
//! node is `Infeasible` and changes nothing; a `RestartContainer` memory
//! policy restarts the container once; bad resizes are refused with
//! Kubernetes' wording.

use skiff_e2e::{text, wait_until, Server, BUSYBOX};

/// The container's cpu quota (µs per 100 ms) and memory limit (bytes) as
/// its cgroup has them (v2, or v1's cpu and memory hierarchies).
fn cgroup(s: &Server, pod: &str) -> (String, String) {
    let out = s.ok(&[
        "exec",
        pod,
        "--",
        "sh",
        "-c",
        // v2: the container's own cgroup, named in /proc/self/cgroup ("0::/"
        // in a private cgroup namespace).
        "if [ -d /sys/fs/cgroup/cpu ]; then cat /sys/fs/cgroup/cpu/cpu.cfs_quota_us /sys/fs/cgroup/memory/memory.limit_in_bytes; \
         else d=/sys/fs/cgroup$(sed -n 's/^0:://p' /proc/self/cgroup); [ -f \"$d/cpu.max\" ] || d=/sys/fs/cgroup; \
         cut -d' ' -f1 \"$d/cpu.max\"; cat \"$d/memory.max\"; fi",
    ]);
    let mut lines = out.lines().map(str::trim).map(str::to_string);
    (
        lines.next().unwrap_or_default(),
        lines.next().unwrap_or_default(),
    )
}

fn field(s: &Server, pod: &str, path: &str) -> String {
    text(
        &s.kubectl(&["get", "pod", pod, "-o", &format!("jsonpath={{{path}}}")])
            .stdout,
    )
}

fn run_pod(s: &Server, name: &str, resize_policy: &str) {
    s.ok_stdin(
        &["apply", "-f", "-"],
        &format!(
            r#"{{"apiVersion": "v1", "kind": "Pod", "metadata": {{"name": "{name}"}},
  "spec": {{"terminationGracePeriodSeconds": 1, "containers": [{{"name": "app", "image": "{BUSYBOX}",
    "imagePullPolicy": "IfNotPresent", "command": ["sleep", "3600"], "resizePolicy": {resize_policy},
    "resources": {{"requests": {{"cpu": "100m", "memory": "32Mi"}},
                  "limits": {{"cpu": "200m", "memory": "64Mi"}}}}}}]}}}}"#
        ),
    );
    wait_until(&format!("{name} Running"), 120, || {
        (field(s, name, ".status.phase") == "Running").then_some(())
    });
}

fn resize(s: &Server, pod: &str, resources: &str) -> String {
    s.ok(&[
        "patch",
        "pod",
        pod,
        "--subresource",
        "resize",
        "--patch",
        &format!(r#"{{"spec": {{"containers": [{{"name": "app", "resources": {resources}}}]}}}}"#),
    ])
}

fn resize_refused(s: &Server, pod: &str, resources: &str) -> String {
    s.fails(&[
        "patch",
        "pod",
        pod,
        "--subresource",
        "resize",
        "--patch",
        &format!(r#"{{"spec": {{"containers": [{{"name": "app", "resources": {resources}}}]}}}}"#),
    ])
}

#[test]
fn kubectl_patch_resize_changes_a_running_container_in_place() {
    let s = Server::up();
    run_pod(&s, "web", "[]");
    assert_eq!(cgroup(&s, "web"), ("20000".into(), (64 << 20).to_string()));
    assert_eq!(
        field(
            &s,
            "web",
            ".status.containerStatuses[0].resources.limits.cpu"
        ),
        "200m",
        "the status reports what the container runs with"
    );

    // More cpu (request and limit) and a higher memory limit, in place.
    let out = resize(
        &s,
        "web",
        r#"{"requests": {"cpu": "150m"}, "limits": {"cpu": "400m", "memory": "128Mi"}}"#,
    );
    assert!(out.contains("pod/web patched"), "{out}");
    wait_until("the resize actuated", 60, || {
        let done = field(
            &s,
            "web",
            ".status.containerStatuses[0].resources.limits.cpu",
        ) == "400m"
            && field(
                &s,
                "web",
                ".status.conditions[?(@.type==\"PodResizeInProgress\")].status",
            )
            .is_empty();
        done.then_some(())
    });
    assert_eq!(cgroup(&s, "web"), ("40000".into(), (128 << 20).to_string()));
    assert_eq!(
        field(&s, "web", ".status.containerStatuses[0].restartCount"),
        "0"
    );
    assert_eq!(
        field(
            &s,
            "web",
            ".status.containerStatuses[0].allocatedResources.cpu"
        ),
        "150m"
    );
    assert_eq!(
        field(
            &s,
            "web",
            ".status.containerStatuses[0].resources.limits.memory"
        ),
        "128Mi"
    );
    assert_eq!(field(&s, "web", ".metadata.generation"), "2");
    assert_eq!(field(&s, "web", ".status.qosClass"), "Burstable");

    // More cpu than the node has: Infeasible, nothing applied.
    let cpus: f64 = text(
        &s.kubectl(&[
            "get",
            "nodes",
            "-o",
            "jsonpath={.items[0].status.allocatable.cpu}",
        ])
        .stdout,
    )
    .parse()
    .expect("the node's allocatable cpu");
    let too_much = (cpus * 1000.0) as i64 + 1000;
    resize(
        &s,
        "web",
        &format!(r#"{{"requests": {{"cpu": "{too_much}m"}}, "limits": {{"cpu": "{too_much}m"}}}}"#),
    );
    let reason = wait_until("PodResizePending", 60, || {
        let r = field(
            &s,
            "web",
            ".status.conditions[?(@.type==\"PodResizePending\")].reason",
        );
        (!r.is_empty()).then_some(r)
    });
    assert_eq!(reason, "Infeasible");
    let message = field(
        &s,
        "web",
        ".status.conditions[?(@.type==\"PodResizePending\")].message",
    );
    assert!(
        message.starts_with(&format!(
            "Node didn't have enough capacity: cpu, requested: {too_much}, capacity: "
        )),
        "{message}"
    );
    assert_eq!(cgroup(&s, "web"), ("40000".into(), (128 << 20).to_string()));
    assert_eq!(
        field(
            &s,
            "web",
            ".status.containerStatuses[0].allocatedResources.cpu"
        ),
        "150m"
    );
    // Asking for what fits again clears it.
    resize(
        &s,
        "web",
        r#"{"requests": {"cpu": "150m"}, "limits": {"cpu": "300m"}}"#,
    );
    wait_until("the pending resize cleared and actuated", 60, || {
        let done = field(
            &s,
            "web",
            ".status.conditions[?(@.type==\"PodResizePending\")].reason",
        )
        .is_empty()
            && field(
                &s,
                "web",
                ".status.containerStatuses[0].resources.limits.cpu",
            ) == "300m";
        done.then_some(())
    });
    assert_eq!(cgroup(&s, "web").0, "30000");

    // Bad resizes, each refused whole.
    let err = resize_refused(&s, "web", r#"{"requests": {"ephemeral-storage": "1Gi"}}"#);
    assert!(
        err.contains("spec: Forbidden: only cpu and memory resources are mutable"),
        "{err}"
    );
    let err = resize_refused(
        &s,
        "web",
        r#"{"requests": {"cpu": "300m", "memory": "128Mi"}}"#,
    );
    assert!(
        err.contains("Pod QOS Class may not change as a result of resizing"),
        "{err}"
    );
    let err = resize_refused(&s, "web", r#"{"limits": {"memory": "100Mi"}}"#);
    assert!(
        err.contains("memory limits cannot be decreased unless resizePolicy is RestartContainer"),
        "{err}"
    );
    // Resources change only through the subresource.
    let err = s.fails(&[
        "patch",
        "pod",
        "web",
        "--patch",
        r#"{"spec": {"containers": [{"name": "app", "resources": {"limits": {"cpu": "500m"}}}]}}"#,
    ]);
    assert!(
        err.contains("spec: Forbidden: pod updates may not change fields other than"),
        "{err}"
    );
    assert_eq!(cgroup(&s, "web"), ("30000".into(), (128 << 20).to_string()));
    assert_eq!(
        field(&s, "web", ".status.containerStatuses[0].restartCount"),
        "0"
    );
}

#[test]
fn a_restart_container_memory_policy_restarts_the_container_once() {
    let s = Server::up();
    run_pod(
        &s,
        "jvm",
        r#"[{"resourceName": "cpu", "restartPolicy": "NotRequired"},
            {"resourceName": "memory", "restartPolicy": "RestartContainer"}]"#,
    );
    // Lowering the memory limit is allowed with this policy: the container
    // restarts with it rather than being squeezed (no OOM kill).
    resize(&s, "jvm", r#"{"limits": {"memory": "48Mi"}}"#);
    wait_until("the container restarted with its new memory", 90, || {
        let done = field(&s, "jvm", ".status.containerStatuses[0].restartCount") == "1"
            && !field(
                &s,
                "jvm",
                ".status.containerStatuses[0].state.running.startedAt",
            )
            .is_empty()
            && field(
                &s,
                "jvm",
                ".status.containerStatuses[0].resources.limits.memory",
            ) == "48Mi";
        done.then_some(())
    });
    assert_eq!(cgroup(&s, "jvm").1, (48 << 20).to_string());
    let reason = field(
        &s,
        "jvm",
        ".status.containerStatuses[0].lastState.terminated.reason",
    );
    assert!(!reason.is_empty(), "the old instance ended");
    // cpu alone resizes in place: no second restart.
    resize(&s, "jvm", r#"{"limits": {"cpu": "300m"}}"#);
    wait_until("the cpu resize actuated", 60, || {
        (field(
            &s,
            "jvm",
            ".status.containerStatuses[0].resources.limits.cpu",
        ) == "300m")
            .then_some(())
    });
    assert_eq!(cgroup(&s, "jvm").0, "30000");
    assert_eq!(
        field(&s, "jvm", ".status.containerStatuses[0].restartCount"),
        "1"
    );
}
