//! Workload controllers through the real kubectl, on hollow nodes (`skiff
//! agent --simulate`): Deployments roll and roll back without dropping
//! below their availability bound, cascading deletion in each mode, Jobs
//! that complete and fail, and a controller manager killed mid-rollout that
//! finishes it after a restart with exactly the right pods.

use std::process::{Child, Command, Stdio};

use skiff_e2e::{skiff_binary, wait_until, Server};

struct Proc(Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn hollow(s: &Server, nodes: u32) -> Proc {
    let child = Command::new(skiff_binary())
        .args([
            "agent",
            "--simulate",
            "--nodes",
            &nodes.to_string(),
            "--node-name",
            "hollow",
            "--start-delay-ms",
            "100",
            "--kubeconfig",
        ])
        .arg(&s.kubeconfig)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start hollow nodes");
    wait_until("hollow nodes Ready", 30, || {
        let out = s.ok(&["get", "nodes", "--no-headers"]);
        (out.matches(" Ready ").count() == nodes as usize).then_some(())
    });
    Proc(child)
}

fn controller_manager(s: &Server) -> Proc {
    Proc(
        Command::new(skiff_binary())
            .args(["controller-manager", "--kubeconfig"])
            .arg(&s.kubeconfig)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start the controller manager"),
    )
}

fn get(s: &Server, args: &[&str]) -> String {
    String::from_utf8_lossy(&s.kubectl(args).stdout)
        .trim()
        .to_string()
}

fn running_pods(s: &Server, selector: &str) -> Vec<String> {
    get(s, &["get", "pods", "-l", selector, "--field-selector=status.phase=Running", "-o", "jsonpath={range .items[?(@.metadata.deletionTimestamp)]}{end}{range .items[*]}{.metadata.name} {.metadata.deletionTimestamp}{\"\\n\"}{end}"])
        .lines()
        .filter(|l| l.split_whitespace().count() == 1)
        .map(|l| l.trim().to_string())
        .collect()
}

#[test]
fn a_deployment_scales_rolls_out_without_dropping_below_its_bound_and_rolls_back() {
    let s = Server::start();
    let _nodes = hollow(&s, 3);
    s.ok(&[
        "create",
        "deployment",
        "web",
        "--image=pause:1",
        "--replicas=4",
    ]);
    s.ok(&[
        "patch",
        "deployment",
        "web",
        "-p",
        r#"{"spec":{"strategy":{"rollingUpdate":{"maxSurge":1,"maxUnavailable":1}}}}"#,
    ]);
    s.ok(&["rollout", "status", "deployment/web", "--timeout=60s"]);
    assert_eq!(running_pods(&s, "app=web").len(), 4);
    s.ok(&["scale", "deployment", "web", "--replicas=6"]);
    s.ok(&["rollout", "status", "deployment/web", "--timeout=60s"]);
    assert_eq!(
        get(
            &s,
            &[
                "get",
                "deployment",
                "web",
                "-o",
                "jsonpath={.status.availableReplicas}"
            ]
        ),
        "6"
    );

    // Watch availability through the rollout: never below 6 - maxUnavailable.
    let w = s.kubectl_background(&[
        "get",
        "deployment",
        "web",
        "-w",
        "-o",
        "jsonpath={.status.availableReplicas}/{.status.updatedReplicas}{\"\\n\"}",
    ]);
    w.wait_for("the watch to start", |o| o.contains("6/"));
    s.ok(&["set", "image", "deployment/web", "pause=pause:2"]);
    s.ok(&["rollout", "status", "deployment/web", "--timeout=90s"]);
    let seen = w.wait_for("the last update", |o| {
        o.lines().any(|l| l.trim() == "6/6") && o.lines().count() > 2
    });
    for l in seen.lines() {
        let avail: i32 = l
            .split('/')
            .next()
            .unwrap_or("0")
            .trim()
            .parse()
            .unwrap_or(0);
        assert!(
            avail >= 5,
            "availability dropped to {avail} during the rollout:\n{seen}"
        );
    }
    let images = get(
        &s,
        &[
            "get",
            "pods",
            "-l",
            "app=web",
            "-o",
            "jsonpath={.items[*].spec.containers[0].image}",
        ],
    );
    wait_until("only new pods", 30, || {
        let images = get(
            &s,
            &[
                "get",
                "pods",
                "-l",
                "app=web",
                "-o",
                "jsonpath={.items[*].spec.containers[0].image}",
            ],
        );
        (!images.contains("pause:1")).then_some(())
    });
    assert!(images.contains("pause:2"), "{images}");
    let rs = get(&s, &["get", "rs", "-l", "app=web", "--no-headers"]);
    assert_eq!(rs.lines().count(), 2, "{rs}");
    let history = s.ok(&["rollout", "history", "deployment/web"]);
    assert!(
        history.contains("1 ") && history.contains("2 "),
        "{history}"
    );

    s.ok(&["rollout", "undo", "deployment/web"]);
    s.ok(&["rollout", "status", "deployment/web", "--timeout=90s"]);
    wait_until("the old image back", 30, || {
        let images = get(
            &s,
            &[
                "get",
                "pods",
                "-l",
                "app=web",
                "-o",
                "jsonpath={.items[*].spec.containers[0].image}",
            ],
        );
        (!images.contains("pause:2") && images.split_whitespace().count() == 6).then_some(())
    });
    let events = s.ok(&[
        "get",
        "events",
        "--field-selector",
        "involvedObject.kind=Deployment",
    ]);
    assert!(events.contains("ScalingReplicaSet"), "{events}");
}

#[test]
fn cascading_deletion_in_background_foreground_and_orphan_modes() {
    let s = Server::start();
    let _nodes = hollow(&s, 2);
    for d in ["bg", "fg", "orph"] {
        s.ok(&["create", "deployment", d, "--image=pause", "--replicas=2"]);
    }
    for d in ["bg", "fg", "orph"] {
        s.ok(&[
            "rollout",
            "status",
            &format!("deployment/{d}"),
            "--timeout=60s",
        ]);
    }
    s.ok(&["delete", "deployment", "bg"]);
    s.ok(&["delete", "deployment", "fg", "--cascade=foreground"]);
    s.ok(&["delete", "deployment", "orph", "--cascade=orphan"]);
    wait_until("background and foreground dependents gone", 60, || {
        let pods = get(&s, &["get", "pods", "-o", "name"]);
        let rs = get(&s, &["get", "rs", "-o", "name"]);
        (!pods.contains("/bg-")
            && !pods.contains("/fg-")
            && !rs.contains("/bg-")
            && !rs.contains("/fg-"))
        .then_some(())
    });
    assert!(
        s.kubectl(&["get", "deployment", "fg"]).status.code() != Some(0),
        "the foreground owner stayed"
    );
    let rs = get(
        &s,
        &[
            "get",
            "rs",
            "-l",
            "app=orph",
            "-o",
            "jsonpath={.items[*].metadata.ownerReferences}",
        ],
    );
    assert_eq!(rs, "", "the orphaned ReplicaSet still has its owner");
    assert_eq!(running_pods(&s, "app=orph").len(), 2);

    // A pod deleted in the foreground has no dependents: it goes.
    s.ok(&["run", "lonely", "--image=pause"]);
    wait_until("lonely running", 30, || {
        (running_pods(&s, "run=lonely").len() == 1).then_some(())
    });
    s.ok(&[
        "delete",
        "pod",
        "lonely",
        "--cascade=foreground",
        "--timeout=60s",
    ]);
    assert!(s.kubectl(&["get", "pod", "lonely"]).status.code() != Some(0));
}

#[test]
fn a_job_completes_and_another_fails_after_its_backoff_limit() {
    let s = Server::start();
    let _nodes = hollow(&s, 2);
    s.ok_stdin(
        &["apply", "-f", "-"],
        r#"
apiVersion: batch/v1
kind: Job
metadata: {name: ok}
spec:
  completions: 3
  parallelism: 2
  template:
    metadata: {annotations: {skiff.io/simulate-run-seconds: "1"}}
    spec:
      restartPolicy: Never
      containers: [{name: c, image: pause}]
---
apiVersion: batch/v1
kind: Job
metadata: {name: bad}
spec:
  backoffLimit: 1
  template:
    metadata: {annotations: {skiff.io/simulate-run-seconds: "1", skiff.io/simulate-exit-code: "1"}}
    spec:
      restartPolicy: Never
      containers: [{name: c, image: pause}]
"#,
    );
    s.ok(&[
        "wait",
        "--for=condition=complete",
        "job/ok",
        "--timeout=60s",
    ]);
    assert_eq!(
        get(
            &s,
            &["get", "job", "ok", "-o", "jsonpath={.status.succeeded}"]
        ),
        "3"
    );
    s.ok(&["wait", "--for=condition=failed", "job/bad", "--timeout=60s"]);
    assert_eq!(
        get(
            &s,
            &["get", "job", "bad", "-o", "jsonpath={.status.failed}"]
        ),
        "2"
    );
    let reason = get(
        &s,
        &[
            "get",
            "job",
            "bad",
            "-o",
            "jsonpath={.status.conditions[?(@.type==\"Failed\")].reason}",
        ],
    );
    assert_eq!(reason, "BackoffLimitExceeded");
    let table = s.ok(&["get", "jobs"]);
    assert!(table.contains("ok") && table.contains("3/3"), "{table}");
}

#[test]
fn a_cronjob_fires_at_the_next_minute_and_its_job_completes() {
    let s = Server::start();
    let _nodes = hollow(&s, 1);
    s.ok_stdin(
        &["apply", "-f", "-"],
        r#"
apiVersion: batch/v1
kind: CronJob
metadata: {name: tick}
spec:
  schedule: "* * * * *"
  jobTemplate:
    spec:
      template:
        metadata: {annotations: {skiff.io/simulate-run-seconds: "1"}}
        spec:
          restartPolicy: Never
          containers: [{name: c, image: pause}]
"#,
    );
    // Within a minute and a bit, a Job named for its scheduled minute (as
    // Kubernetes names them: the minute since the epoch) runs and completes.
    let job = wait_until("a Job from the CronJob", 90, || {
        let jobs = get(
            &s,
            &[
                "get",
                "jobs",
                "-o",
                "jsonpath={range .items[*]}{.metadata.name} {.metadata.ownerReferences[0].name}{\"\\n\"}{end}",
            ],
        );
        jobs.lines()
            .find(|l| l.ends_with(" tick"))
            .map(|l| l.split_whitespace().next().unwrap_or("").to_string())
    });
    let minute: i64 = job
        .strip_prefix("tick-")
        .and_then(|m| m.parse().ok())
        .unwrap_or_else(|| panic!("job name {job}"));
    s.ok(&[
        "wait",
        "--for=condition=complete",
        &format!("job/{job}"),
        "--timeout=60s",
    ]);
    let last = wait_until("lastSuccessfulTime", 30, || {
        let t = get(
            &s,
            &[
                "get",
                "cronjob",
                "tick",
                "-o",
                "jsonpath={.status.lastScheduleTime} {.status.lastSuccessfulTime}",
            ],
        );
        (t.split_whitespace().count() == 2).then_some(t)
    });
    let scheduled = last.split_whitespace().next().unwrap_or("");
    let expected = Command::new("date")
        .args([
            "-u",
            "-d",
            &format!("@{}", minute * 60),
            "+%Y-%m-%dT%H:%M:%SZ",
        ])
        .output()
        .expect("date");
    assert_eq!(
        scheduled,
        String::from_utf8_lossy(&expected.stdout).trim(),
        "{last}"
    );
    // NAME SCHEDULE(5 fields) TIMEZONE SUSPEND ACTIVE LAST-SCHEDULE AGE
    let table = s.ok(&["get", "cronjob", "tick", "--no-headers"]);
    let row: Vec<&str> = table.split_whitespace().collect();
    assert_eq!(row.len(), 11, "{table}");
    assert_eq!(
        &row[..8],
        ["tick", "*", "*", "*", "*", "*", "<none>", "false"],
        "{table}"
    );
    assert!(row[9].ends_with('s') || row[9].ends_with('m'), "{table}");
}

#[test]
fn a_controller_manager_killed_mid_rollout_finishes_it_with_exactly_the_right_pods() {
    let s = Server::start_with(&["--disable-controllers"]);
    let _nodes = hollow(&s, 3);
    let cm = controller_manager(&s);
    s.ok(&[
        "create",
        "deployment",
        "web",
        "--image=pause:1",
        "--replicas=8",
    ]);
    s.ok(&["rollout", "status", "deployment/web", "--timeout=60s"]);
    s.ok(&["set", "image", "deployment/web", "pause=pause:2"]);
    wait_until("the rollout to be under way", 30, || {
        let u = get(
            &s,
            &[
                "get",
                "deployment",
                "web",
                "-o",
                "jsonpath={.status.updatedReplicas}",
            ],
        );
        (u.parse::<i32>().unwrap_or(0) > 0).then_some(())
    });
    // Dropping the process handle kills it and reaps it; a new one must
    // take over the Lease the dead one never released.
    drop(cm);
    let _cm = controller_manager(&s);
    s.ok(&["rollout", "status", "deployment/web", "--timeout=90s"]);
    let pods = wait_until("8 pods of the new template and nothing else", 30, || {
        let all = get(
            &s,
            &[
                "get",
                "pods",
                "-l",
                "app=web",
                "-o",
                "jsonpath={range .items[*]}{.spec.containers[0].image}{\"\\n\"}{end}",
            ],
        );
        let lines: Vec<&str> = all.lines().collect();
        (lines.len() == 8 && lines.iter().all(|l| *l == "pause:2")).then_some(all)
    });
    assert_eq!(pods.lines().count(), 8);
    // What kubectl shows once it is over: the Deployment counts 8 updated
    // and available replicas, and the old ReplicaSet is scaled to 0.
    let status = get(
        &s,
        &[
            "get",
            "deployment",
            "web",
            "-o",
            "jsonpath={.status.replicas} {.status.updatedReplicas} {.status.availableReplicas}",
        ],
    );
    assert_eq!(status, "8 8 8");
    let sets = get(
        &s,
        &[
            "get",
            "replicasets",
            "-l",
            "app=web",
            "-o",
            "jsonpath={range .items[*]}{.spec.template.spec.containers[0].image}={.spec.replicas}{\"\\n\"}{end}",
        ],
    );
    let mut sets: Vec<&str> = sets.lines().collect();
    sets.sort();
    assert_eq!(sets, ["pause:1=0", "pause:2=8"]);
}

const SHORT_TOLERANCE_DEPLOYMENT: &str = r#"
apiVersion: apps/v1
kind: Deployment
metadata:
  name: web
spec:
  replicas: 3
  selector:
    matchLabels: {app: web}
  template:
    metadata:
      labels: {app: web}
    spec:
      containers:
      - name: pause
        image: pause
      tolerations:
      - {key: node.kubernetes.io/unreachable, operator: Exists, effect: NoExecute, tolerationSeconds: 2}
      - {key: node.kubernetes.io/not-ready, operator: Exists, effect: NoExecute, tolerationSeconds: 2}
"#;

#[test]
fn a_node_that_stops_renewing_its_lease_is_tainted_and_its_pods_move_elsewhere() {
    // A grace period longer than the nodes' 10 s Lease renewals: with a
    // shorter one every node goes stale between renewals, and when all of
    // them are down at once nothing is tainted (as in Kubernetes).
    let s = Server::start_with(&["--node-monitor-grace-period", "15"]);
    // Two sets of hollow nodes in two processes: "a" will go away.
    let a = Proc(
        Command::new(skiff_binary())
            .args([
                "agent",
                "--simulate",
                "--nodes",
                "1",
                "--node-name",
                "a",
                "--kubeconfig",
            ])
            .arg(&s.kubeconfig)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start hollow node a"),
    );
    wait_until("node a-0 Ready", 30, || {
        s.ok(&["get", "nodes", "--no-headers"])
            .contains(" Ready ")
            .then_some(())
    });
    // Admission gives pods 300 s of tolerance for an unreachable node, as
    // Kubernetes' DefaultTolerationSeconds does; these pods ask for 2 s.
    s.ok_stdin(&["apply", "-f", "-"], SHORT_TOLERANCE_DEPLOYMENT);
    s.ok(&["rollout", "status", "deployment/web", "--timeout=60s"]);
    let on_a = get(
        &s,
        &[
            "get",
            "pods",
            "-l",
            "app=web",
            "-o",
            "jsonpath={.items[*].spec.nodeName}",
        ],
    );
    assert_eq!(
        on_a.split_whitespace().filter(|n| *n == "a-0").count(),
        3,
        "{on_a}"
    );
    let _b = hollow_named(&s, "b");
    drop(a);
    // The node goes Unknown and gets the unreachable taint.
    wait_until("node a-0 NotReady with the unreachable taint", 60, || {
        let ready = get(
            &s,
            &[
                "get",
                "node",
                "a-0",
                "-o",
                "jsonpath={.status.conditions[?(@.type==\"Ready\")].status}",
            ],
        );
        let taints = get(
            &s,
            &["get", "node", "a-0", "-o", "jsonpath={.spec.taints[*].key}"],
        );
        (ready == "Unknown" && taints.contains("node.kubernetes.io/unreachable")).then_some(())
    });
    let nodes = s.ok(&["get", "nodes"]);
    assert!(
        nodes
            .lines()
            .any(|l| l.starts_with("a-0") && l.contains("NotReady")),
        "{nodes}"
    );
    // Its pods are evicted and replaced on node b-0.
    wait_until("3 running pods on b-0", 60, || {
        let out = get(
            &s,
            &[
                "get",
                "pods",
                "-l",
                "app=web",
                "--field-selector=spec.nodeName=b-0,status.phase=Running",
                "-o",
                "name",
            ],
        );
        (out.lines().count() == 3).then_some(())
    });
}

fn hollow_named(s: &Server, prefix: &str) -> Proc {
    let child = Command::new(skiff_binary())
        .args([
            "agent",
            "--simulate",
            "--nodes",
            "1",
            "--node-name",
            prefix,
            "--kubeconfig",
        ])
        .arg(&s.kubeconfig)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start hollow node");
    let name = format!("{prefix}-0");
    wait_until("the new node Ready", 30, || {
        let ready = get(
            s,
            &[
                "get",
                "node",
                &name,
                "-o",
                "jsonpath={.status.conditions[?(@.type==\"Ready\")].status}",
            ],
        );
        (ready == "True").then_some(())
    });
    Proc(child)
}
