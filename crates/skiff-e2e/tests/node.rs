//! A real single-node cluster (`skiff up`: server, scheduler, controllers,
//! an agent over a private containerd) driven with the real kubectl: pods
//! run as containers with their own IPs, logs, exec and port-forward work,
//! restarts back off, probes act, OOM kills are reported, graceful deletion
//! runs preStop, killing skiff leaves containers running for the next
//! start to adopt, and the node's stats (kubelet's Summary and resource
//! metrics) are reachable through the node proxy.

use std::time::{Duration, Instant};

use skiff_e2e::{wait_until, Server, BUSYBOX};

fn jsonpath(s: &Server, pod: &str, path: &str) -> String {
    let out = s.kubectl(&["get", "pod", pod, "-o", &format!("jsonpath={path}")]);
    String::from_utf8_lossy(&out.stdout).to_string()
}

fn wait_running(s: &Server, pod: &str) -> String {
    wait_until(&format!("pod {pod} Running"), 120, || {
        let phase = jsonpath(s, pod, "{.status.phase}");
        let ip = jsonpath(s, pod, "{.status.podIP}");
        (phase == "Running" && !ip.is_empty()).then_some(ip)
    })
}

fn http(ip: &str, port: u16, path: &str) -> String {
    use std::io::{Read, Write};
    let Ok(mut c) = std::net::TcpStream::connect_timeout(
        &format!("{ip}:{port}").parse().unwrap(),
        Duration::from_secs(2),
    ) else {
        return String::new();
    };
    let _ = c.set_read_timeout(Some(Duration::from_secs(3)));
    let _ = c.write_all(format!("GET {path} HTTP/1.0\r\nHost: {ip}\r\n\r\n").as_bytes());
    let mut out = String::new();
    let _ = c.read_to_string(&mut out);
    out
}

#[test]
fn a_pod_runs_with_an_ip_that_answers_and_kubectl_logs_and_exec_work() {
    let s = Server::up();
    s.ok(&["run", "web", "--image", BUSYBOX, "--image-pull-policy=IfNotPresent", "--", "sh", "-c",
        "echo started; mkdir -p /www; echo hello-skiff > /www/index.html; exec httpd -f -p 8080 -h /www"]);
    let ip = wait_running(&s, "web");
    let resp = wait_until("HTTP from the pod", 30, || {
        let r = http(&ip, 8080, "/index.html");
        r.contains("hello-skiff").then_some(r)
    });
    assert!(
        resp.starts_with("HTTP/1.0 200") || resp.starts_with("HTTP/1.1 200"),
        "{resp}"
    );
    let node = jsonpath(&s, "web", "{.spec.nodeName}");
    assert_eq!(node, "e2e-node");
    let wide = s.ok(&["get", "pods", "-o", "wide"]);
    assert!(wide.contains(&ip) && wide.contains("Running"), "{wide}");

    let logs = wait_until("logs", 20, || {
        let out = s.kubectl(&["logs", "web"]);
        let t = String::from_utf8_lossy(&out.stdout).to_string();
        t.contains("started").then_some(t)
    });
    assert_eq!(logs.trim(), "started");
    let out = s.ok(&["exec", "web", "--", "cat", "/www/index.html"]);
    assert_eq!(out.trim(), "hello-skiff");
    let out = s.ok(&["exec", "web", "--", "sh", "-c", "echo $HOSTNAME"]);
    assert_eq!(out.trim(), "web");
    // The container has its own PID namespace: its command is PID 1.
    let out = s.ok(&[
        "exec",
        "web",
        "--",
        "sh",
        "-c",
        "tr '\\0' ' ' < /proc/1/cmdline",
    ]);
    assert!(out.starts_with("httpd -f -p 8080"), "{out}");
}

#[test]
fn logs_follow_streams_new_lines_and_port_forward_reaches_the_pod() {
    let s = Server::up();
    s.ok(&[
        "run",
        "ticker",
        "--image",
        BUSYBOX,
        "--image-pull-policy=IfNotPresent",
        "--",
        "sh",
        "-c",
        "i=0; while true; do echo tick $i; i=$((i+1)); sleep 0.3; done",
    ]);
    s.ok(&[
        "run",
        "web",
        "--image",
        BUSYBOX,
        "--image-pull-policy=IfNotPresent",
        "--",
        "sh",
        "-c",
        "mkdir -p /www; echo forwarded > /www/index.html; exec httpd -f -p 8080 -h /www",
    ]);
    wait_running(&s, "ticker");
    wait_running(&s, "web");
    let bg = s.kubectl_background(&["logs", "-f", "ticker"]);
    bg.wait_for("followed lines", |out| out.contains("tick 5"));
    let tail = s.ok(&["logs", "ticker", "--tail", "1"]);
    assert_eq!(tail.lines().count(), 1, "{tail}");
    assert!(tail.starts_with("tick "), "{tail}");

    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let pf = s.kubectl_background(&["port-forward", "pod/web", &format!("{port}:8080")]);
    pf.wait_for("port-forward ready", |out| out.contains("Forwarding from"));
    let resp = wait_until("HTTP through port-forward", 20, || {
        let r = http("127.0.0.1", port, "/index.html");
        r.contains("forwarded").then_some(r)
    });
    assert!(resp.contains("200"), "{resp}");
}

#[test]
fn restarts_back_off_probes_act_and_oom_kills_are_reported() {
    let s = Server::up();
    s.ok_stdin(&["apply", "-f", "-"], &format!(r#"
apiVersion: v1
kind: Pod
metadata: {{name: crash}}
spec:
  containers:
  - {{name: c, image: {BUSYBOX}, imagePullPolicy: IfNotPresent, command: [sh, -c, "echo dying; exit 2"]}}
---
apiVersion: v1
kind: Pod
metadata: {{name: sick}}
spec:
  containers:
  - name: c
    image: {BUSYBOX}
    imagePullPolicy: IfNotPresent
    command: [sh, -c, "touch /tmp/healthy; sleep 3600"]
    livenessProbe: {{exec: {{command: [cat, /tmp/healthy]}}, periodSeconds: 1, failureThreshold: 1}}
---
apiVersion: v1
kind: Pod
metadata: {{name: flip}}
spec:
  containers:
  - name: c
    image: {BUSYBOX}
    imagePullPolicy: IfNotPresent
    command: [sleep, "3600"]
    readinessProbe: {{exec: {{command: [cat, /tmp/ready]}}, periodSeconds: 1}}
---
apiVersion: v1
kind: Pod
metadata: {{name: hog}}
spec:
  restartPolicy: Never
  containers:
  - name: c
    image: {BUSYBOX}
    imagePullPolicy: IfNotPresent
    command: [sh, -c, "x=aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa; while true; do x=$x$x; done"]
    resources: {{limits: {{memory: 32Mi}}}}
---
apiVersion: v1
kind: Pod
metadata: {{name: nopull}}
spec:
  containers:
  - {{name: c, image: "registry.invalid/skiff/none:1", imagePullPolicy: Always}}
---
apiVersion: v1
kind: Pod
metadata: {{name: neverpull}}
spec:
  containers:
  - {{name: c, image: "skiff.invalid/absent:1", imagePullPolicy: Never}}
"#));
    // Crash loop, with the delay growing.
    let status = wait_until("CrashLoopBackOff", 120, || {
        let out = s.ok(&["get", "pod", "crash"]);
        (out.contains("CrashLoopBackOff")
            && jsonpath(&s, "crash", "{.status.containerStatuses[0].restartCount}") != "0")
            .then_some(out)
    });
    assert!(status.contains("crash"), "{status}");
    let msg = jsonpath(
        &s,
        "crash",
        "{.status.containerStatuses[0].state.waiting.message}",
    );
    assert!(
        msg.contains("back-off") && msg.contains("restarting failed container=c"),
        "{msg}"
    );
    let last = jsonpath(
        &s,
        "crash",
        "{.status.containerStatuses[0].lastState.terminated.exitCode}",
    );
    assert_eq!(last, "2");
    let prev = s.ok(&["logs", "crash", "--previous"]);
    assert_eq!(prev.trim(), "dying");

    // Liveness: breaking the probe restarts the container.
    wait_running(&s, "sick");
    s.ok(&["exec", "sick", "--", "rm", "/tmp/healthy"]);
    wait_until("a liveness restart", 60, || {
        (jsonpath(&s, "sick", "{.status.containerStatuses[0].restartCount}") != "0")
            .then_some(String::new())
    });
    let events = s.ok(&[
        "get",
        "events",
        "--field-selector",
        "involvedObject.name=sick",
    ]);
    assert!(
        events.contains("Unhealthy") && events.contains("Liveness probe failed"),
        "{events}"
    );

    // Readiness flips the Ready condition both ways.
    wait_running(&s, "flip");
    assert_eq!(
        jsonpath(
            &s,
            "flip",
            "{.status.conditions[?(@.type==\"Ready\")].status}"
        ),
        "False"
    );
    s.ok(&["exec", "flip", "--", "touch", "/tmp/ready"]);
    wait_until("Ready=True", 30, || {
        (jsonpath(
            &s,
            "flip",
            "{.status.conditions[?(@.type==\"Ready\")].status}",
        ) == "True")
            .then_some(String::new())
    });
    s.ok(&["exec", "flip", "--", "rm", "/tmp/ready"]);
    wait_until("Ready=False", 30, || {
        (jsonpath(
            &s,
            "flip",
            "{.status.conditions[?(@.type==\"Ready\")].status}",
        ) == "False")
            .then_some(String::new())
    });

    // The memory hog is OOMKilled.
    let reason = wait_until("OOMKilled", 60, || {
        let r = jsonpath(
            &s,
            "hog",
            "{.status.containerStatuses[0].state.terminated.reason}",
        );
        (!r.is_empty()).then_some(r)
    });
    assert_eq!(reason, "OOMKilled");
    assert_eq!(jsonpath(&s, "hog", "{.status.phase}"), "Failed");

    // An image no registry serves: ErrImagePull, then ImagePullBackOff, as
    // `kubectl get pods` shows them; Never with no local image says so.
    let waiting = "{.status.containerStatuses[0].state.waiting.reason}";
    wait_until("ErrImagePull or ImagePullBackOff", 90, || {
        let r = jsonpath(&s, "nopull", waiting);
        (r == "ErrImagePull" || r == "ImagePullBackOff").then_some(r)
    });
    let msg = jsonpath(
        &s,
        "nopull",
        "{.status.containerStatuses[0].state.waiting.message}",
    );
    assert!(msg.contains("registry.invalid/skiff/none:1"), "{msg}");
    let row = wait_until("ImagePullBackOff", 90, || {
        let out = s.ok(&["get", "pod", "nopull", "--no-headers"]);
        out.contains("ImagePullBackOff").then_some(out)
    });
    assert!(row.contains("0/1"), "{row}");
    assert_eq!(jsonpath(&s, "nopull", "{.status.phase}"), "Pending");
    wait_until("ErrImageNeverPull", 60, || {
        (jsonpath(&s, "neverpull", waiting) == "ErrImageNeverPull").then_some(())
    });
}

#[test]
fn graceful_delete_runs_prestop_and_kill_9_of_skiff_leaves_containers_running_for_adoption() {
    let mut s = Server::up();
    s.ok_stdin(&["apply", "-f", "-"], &format!(r#"
apiVersion: v1
kind: Pod
metadata: {{name: web}}
spec:
  containers:
  - {{name: c, image: {BUSYBOX}, imagePullPolicy: IfNotPresent, command: [sh, -c, "mkdir -p /www; echo alive > /www/index.html; exec httpd -f -p 8080 -h /www"]}}
---
apiVersion: v1
kind: Pod
metadata: {{name: polite}}
spec:
  terminationGracePeriodSeconds: 3
  containers:
  - name: c
    image: {BUSYBOX}
    imagePullPolicy: IfNotPresent
    command: [sh, -c, "trap '' TERM; echo started; sleep 3600"]
    lifecycle:
      preStop:
        exec: {{command: [sh, -c, "echo prestop-ran > /proc/1/fd/1"]}}
"#));
    let ip = wait_running(&s, "web");
    wait_running(&s, "polite");
    let id = jsonpath(&s, "web", "{.status.containerStatuses[0].containerID}");

    // Graceful deletion: preStop runs, the container ignores SIGTERM and is
    // killed when the 3 s grace period ends; then the pod is gone.
    let t = Instant::now();
    s.ok(&["delete", "pod", "polite", "--wait=true"]);
    let took = t.elapsed();
    assert!(
        took >= Duration::from_millis(2900),
        "deleted after {took:?}, before the 3 s grace period ended"
    );
    assert!(took < Duration::from_secs(30), "deletion took {took:?}");
    let events = s.ok(&[
        "get",
        "events",
        "--field-selector",
        "involvedObject.name=polite",
    ]);
    assert!(events.contains("Killing"), "{events}");

    // kill -9: the container keeps serving while skiff is down.
    s.kill9();
    assert!(
        http(&ip, 8080, "/index.html").contains("alive"),
        "the pod died with skiff"
    );
    s.start_again();
    std::thread::sleep(Duration::from_secs(3));
    wait_running(&s, "web");
    assert_eq!(
        jsonpath(&s, "web", "{.status.containerStatuses[0].containerID}"),
        id,
        "the container was replaced"
    );
    assert_eq!(
        jsonpath(&s, "web", "{.status.containerStatuses[0].restartCount}"),
        "0"
    );
    assert!(http(&ip, 8080, "/index.html").contains("alive"));
}

#[test]
fn init_containers_run_first_and_volumes_env_and_security_context_hold_inside() {
    let s = Server::up();
    s.ok(&[
        "create",
        "configmap",
        "settings",
        "--from-literal=mode=fast",
        "--from-literal=level=3",
    ]);
    s.ok(&[
        "create",
        "secret",
        "generic",
        "token",
        "--from-literal=value=abc123",
    ]);
    s.ok_stdin(&["apply", "-f", "-"], &format!(r#"
apiVersion: v1
kind: Pod
metadata:
  name: full
  labels: {{tier: demo}}
spec:
  initContainers:
  - {{name: prepare, image: {BUSYBOX}, imagePullPolicy: IfNotPresent, command: [sh, -c, "echo from-init > /work/init.txt"],
     volumeMounts: [{{name: work, mountPath: /work}}]}}
  containers:
  - name: main
    image: {BUSYBOX}
    imagePullPolicy: IfNotPresent
    command: [sleep, "3600"]
    securityContext: {{runAsUser: 1234, runAsGroup: 4321}}
    resources: {{requests: {{cpu: 100m, memory: 16Mi}}, limits: {{cpu: 200m, memory: 64Mi}}}}
    env:
    - {{name: MY_NODE, valueFrom: {{fieldRef: {{fieldPath: spec.nodeName}}}}}}
    - {{name: MY_IP, valueFrom: {{fieldRef: {{fieldPath: status.podIP}}}}}}
    - {{name: MEM_LIMIT_MI, valueFrom: {{resourceFieldRef: {{resource: limits.memory, divisor: 1Mi}}}}}}
    envFrom:
    - {{configMapRef: {{name: settings}}, prefix: CFG_}}
    volumeMounts:
    - {{name: work, mountPath: /work}}
    - {{name: scratch, mountPath: /scratch}}
    - {{name: info, mountPath: /info}}
    - {{name: token, mountPath: /token, readOnly: true}}
  volumes:
  - {{name: work, emptyDir: {{}}}}
  - {{name: scratch, emptyDir: {{medium: Memory}}}}
  - name: info
    downwardAPI:
      items:
      - {{path: labels, fieldRef: {{fieldPath: metadata.labels}}}}
      - {{path: name, fieldRef: {{fieldPath: metadata.name}}}}
  - {{name: token, secret: {{secretName: token, items: [{{key: value, path: t}}]}}}}
"#));
    let ip = wait_running(&s, "full");
    let init = jsonpath(
        &s,
        "full",
        "{.status.initContainerStatuses[0].state.terminated.reason}",
    );
    assert_eq!(init, "Completed");
    assert_eq!(
        s.ok(&["exec", "full", "--", "cat", "/work/init.txt"])
            .trim(),
        "from-init"
    );
    assert_eq!(s.ok(&["exec", "full", "--", "id", "-u"]).trim(), "1234");
    assert_eq!(s.ok(&["exec", "full", "--", "id", "-g"]).trim(), "4321");
    let env = s.ok(&["exec", "full", "--", "env"]);
    assert!(env.contains("MY_NODE=e2e-node"), "{env}");
    assert!(env.contains(&format!("MY_IP={ip}")), "{env}");
    assert!(env.contains("MEM_LIMIT_MI=64"), "{env}");
    assert!(
        env.contains("CFG_mode=fast") && env.contains("CFG_level=3"),
        "{env}"
    );
    assert_eq!(
        s.ok(&["exec", "full", "--", "cat", "/info/name"]).trim(),
        "full"
    );
    assert_eq!(
        s.ok(&["exec", "full", "--", "cat", "/info/labels"]).trim(),
        "tier=\"demo\""
    );
    assert_eq!(
        s.ok(&["exec", "full", "--", "cat", "/token/t"]).trim(),
        "abc123"
    );
    let mounts = s.ok(&["exec", "full", "--", "cat", "/proc/mounts"]);
    assert!(
        mounts
            .lines()
            .any(|l| l.contains(" /scratch ") && l.starts_with("tmpfs")),
        "{mounts}"
    );
    let ro = s.kubectl(&["exec", "full", "--", "touch", "/token/x"]);
    assert!(!ro.status.success(), "a readOnly mount was writable");
    assert_eq!(jsonpath(&s, "full", "{.status.qosClass}"), "Burstable");
    // stdin reaches the command.
    let echoed = s.ok_stdin(&["exec", "-i", "full", "--", "cat"], "through stdin\n");
    assert_eq!(echoed.trim(), "through stdin");
}

#[test]
fn hollow_nodes_from_the_cli_join_a_cluster_and_run_pods() {
    let s = Server::start();
    let mut agent = std::process::Command::new(skiff_e2e::skiff_binary())
        .args([
            "agent",
            "--simulate",
            "--nodes",
            "3",
            "--node-name",
            "hollow",
            "--kubeconfig",
        ])
        .arg(&s.kubeconfig)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("start skiff agent --simulate");
    let nodes = wait_until("3 Ready hollow nodes", 30, || {
        let out = s.ok(&["get", "nodes"]);
        (out.matches(" Ready ").count() == 3).then_some(out)
    });
    assert!(
        nodes.contains("hollow-0") && nodes.contains("hollow-2"),
        "{nodes}"
    );
    s.ok(&[
        "run",
        "sim",
        "--image",
        "pause",
        "--restart=Never",
        "--annotations=skiff.io/simulate-run-seconds=1",
    ]);
    let phase = wait_until("the pod to succeed", 30, || {
        let p = jsonpath(&s, "sim", "{.status.phase}");
        (p == "Succeeded").then_some(p)
    });
    assert_eq!(phase, "Succeeded");
    assert!(jsonpath(&s, "sim", "{.spec.nodeName}").starts_with("hollow-"));
    let _ = agent.kill();
    let _ = agent.wait();
}

/// `kubectl top`'s CPU column (`250m`, `1`) in millicores.
fn millicores(cell: &str) -> u64 {
    match cell.strip_suffix('m') {
        Some(m) => m.parse().unwrap(),
        None => cell.parse::<u64>().unwrap() * 1000,
    }
}

#[test]
fn a_busy_pods_usage_shows_in_the_nodes_stats_and_in_kubectl_top() {
    let s = Server::up();
    s.ok(&[
        "run",
        "busy",
        "--image",
        BUSYBOX,
        "--image-pull-policy=IfNotPresent",
        "--labels=app=busy",
        "--",
        "sh",
        "-c",
        "while :; do :; done",
    ]);
    wait_running(&s, "busy");
    let node = jsonpath(&s, "busy", "{.spec.nodeName}");
    let raw = |path: &str| {
        let out = s.kubectl(&["get", "--raw", &format!("/api/v1/nodes/{node}/proxy{path}")]);
        assert!(
            out.status.success(),
            "kubectl get --raw {path}: {}",
            skiff_e2e::text(&out.stderr)
        );
        skiff_e2e::text(&out.stdout)
    };
    // A tool that reads the Summary once, with no request before it, gets
    // the rates kubelet gives (usageNanoCores of the node, the pod and its
    // container): the agent samples by itself every 10 s, as kubelet's
    // housekeeping does. Once the container has run through two of those
    // samplings, one request.
    let started = jsonpath(
        &s,
        "busy",
        "{.status.containerStatuses[0].state.running.startedAt}",
    );
    let started: k8s_openapi::jiff::Timestamp = started.parse().expect("startedAt");
    wait_until(
        "the container to run through two stats samplings",
        60,
        || {
            let ran = k8s_openapi::jiff::Timestamp::now().duration_since(started);
            (ran.as_secs() > 25).then_some(())
        },
    );
    let once: serde_json::Value = serde_json::from_str(&raw("/stats/summary")).unwrap();
    let busy = once["pods"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["podRef"]["name"] == "busy")
        .unwrap_or_else(|| panic!("no busy pod in {once}"));
    assert!(
        once["node"]["cpu"]["usageNanoCores"].as_u64().unwrap_or(0) > 0,
        "{}",
        once["node"]
    );
    // A busy loop takes well over a tenth of a core.
    assert!(
        busy["cpu"]["usageNanoCores"].as_u64().unwrap_or(0) > 100_000_000,
        "{busy}"
    );
    assert!(
        busy["containers"][0]["cpu"]["usageNanoCores"]
            .as_u64()
            .unwrap_or(0)
            > 100_000_000,
        "{busy}"
    );

    let (summary, pod) = wait_until("the busy pod in the node's Summary", 60, || {
        let v: serde_json::Value = serde_json::from_str(&raw("/stats/summary")).ok()?;
        let pod = v["pods"]
            .as_array()?
            .iter()
            .find(|p| p["podRef"]["name"] == "busy")?
            .clone();
        (pod["cpu"]["usageCoreNanoSeconds"].as_u64()? > 0
            && pod["memory"]["workingSetBytes"].as_u64()? > 0)
            .then_some((v, pod))
    });
    assert_eq!(summary["node"]["nodeName"], node.as_str());
    assert!(
        summary["node"]["cpu"]["usageCoreNanoSeconds"]
            .as_u64()
            .unwrap()
            > 0
    );
    assert!(
        summary["node"]["memory"]["workingSetBytes"]
            .as_u64()
            .unwrap()
            > 0
    );
    assert_eq!(pod["podRef"]["namespace"], "default");
    assert_eq!(
        pod["podRef"]["uid"].as_str().unwrap(),
        jsonpath(&s, "busy", "{.metadata.uid}")
    );
    let c = &pod["containers"][0];
    assert_eq!(c["name"], "busy");
    assert!(
        c["cpu"]["usageCoreNanoSeconds"].as_u64().unwrap() > 0,
        "{c}"
    );
    assert!(c["memory"]["workingSetBytes"].as_u64().unwrap() > 0, "{c}");

    let prefix =
        r#"container_cpu_usage_seconds_total{container="busy",namespace="default",pod="busy"} "#;
    let metrics = raw("/metrics/resource");
    let line = metrics
        .lines()
        .find(|l| l.starts_with(prefix))
        .unwrap_or_else(|| panic!("no {prefix} line in:\n{metrics}"));
    let seconds: f64 = line[prefix.len()..]
        .split(' ')
        .next()
        .unwrap()
        .parse()
        .unwrap();
    assert!(seconds > 0.0, "{line}");
    assert!(
        metrics.contains(r#"pod_memory_working_set_bytes{namespace="default",pod="busy"} "#),
        "{metrics}"
    );
    assert!(metrics.contains("\nscrape_error 0\n"), "{metrics}");

    let err = s.fails(&[
        "get",
        "--raw",
        "/api/v1/nodes/no-such-node/proxy/stats/summary",
    ]);
    assert!(err.contains("not found"), "{err}");

    // The Metrics API is discovered and measures the node.
    let out = wait_until("kubectl top nodes lists the node", 30, || {
        let o = s.kubectl(&["top", "nodes"]);
        let t = skiff_e2e::text(&o.stdout);
        (o.status.success() && t.contains(&node)).then_some(t)
    });
    let mut lines = out.lines();
    let header: Vec<&str> = lines.next().unwrap().split_whitespace().collect();
    assert_eq!(
        header,
        ["NAME", "CPU(cores)", "CPU(%)", "MEMORY(bytes)", "MEMORY(%)"],
        "{out}"
    );
    let row: Vec<&str> = lines
        .find(|l| l.starts_with(&format!("{node} ")))
        .unwrap()
        .split_whitespace()
        .collect();
    assert!(millicores(row[1]) > 0, "{out}");
    assert!(row[3].ends_with("Mi") && row[3] != "0Mi", "{out}");
    assert!(row[2].ends_with('%') && row[4].ends_with('%'), "{out}");
    let one = s.ok(&["top", "node", &node, "--no-headers"]);
    assert!(one.starts_with(&format!("{node} ")), "{one}");

    // The spinning pod shows (the rate exists once its container has two
    // samples) with most of a core and some memory.
    let (out, cpu) = wait_until("kubectl top pods shows the busy pod's CPU", 30, || {
        let o = s.kubectl(&["top", "pods"]);
        let t = skiff_e2e::text(&o.stdout);
        let row: Vec<String> = t
            .lines()
            .find(|l| l.starts_with("busy "))?
            .split_whitespace()
            .map(str::to_string)
            .collect();
        let cpu = millicores(&row[1]);
        (cpu >= 100).then_some((t, row))
    });
    assert!(out.starts_with("NAME"), "{out}");
    assert!(
        out.contains("CPU(cores)") && out.contains("MEMORY(bytes)"),
        "{out}"
    );
    assert!(cpu[2].ends_with("Mi") || cpu[2].ends_with("Ki"), "{out}");

    // Selectors and per-container rows.
    let out = s.ok(&[
        "top",
        "pods",
        "-l",
        "app=busy",
        "--containers",
        "--no-headers",
    ]);
    let row: Vec<&str> = out.split_whitespace().collect();
    assert_eq!(&row[..2], ["busy", "busy"], "{out}");
    let out = s.kubectl(&["top", "pods", "-l", "app=nothing"]);
    assert!(
        skiff_e2e::text(&out.stderr).contains("No resources found in default namespace"),
        "{}",
        skiff_e2e::text(&out.stderr)
    );
    let err = s.fails(&["top", "pod", "ghost"]);
    assert!(
        err.contains(r#"podmetrics.metrics.k8s.io "default/ghost" not found"#),
        "{err}"
    );
}

/// `kubectl autoscale` on a Deployment whose pod spins far past its CPU
/// request: the autoscaler reads the usage skiff measures, scales up to
/// its maximum, and `kubectl get hpa` shows the utilization.
#[test]
fn kubectl_autoscale_scales_a_busy_deployment_up_on_its_cpu_usage() {
    let s = Server::up();
    let manifest = format!(
        r#"{{"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {{"name": "spin"}},
  "spec": {{"replicas": 1, "selector": {{"matchLabels": {{"app": "spin"}}}},
    "template": {{"metadata": {{"labels": {{"app": "spin"}}}}, "spec": {{
      "terminationGracePeriodSeconds": 0,
      "containers": [{{"name": "spin", "image": "{BUSYBOX}", "imagePullPolicy": "IfNotPresent",
        "command": ["sh", "-c", "while :; do :; done"],
        "resources": {{"requests": {{"cpu": "20m"}}, "limits": {{"cpu": "100m"}}}}}}]}}}}}}}}"#
    );
    s.ok_stdin(&["apply", "-f", "-"], &manifest);
    s.ok(&[
        "autoscale",
        "deployment",
        "spin",
        "--cpu-percent=50",
        "--min=1",
        "--max=2",
    ]);
    // The pod uses its whole 100m limit, five times its request: 500%
    // against 50%. The autoscaler wants ten replicas and stops at two.
    wait_until("the deployment scaled to its maximum", 150, || {
        let out = s.kubectl(&[
            "get",
            "deployment",
            "spin",
            "-o",
            "jsonpath={.spec.replicas}",
        ]);
        (skiff_e2e::text(&out.stdout) == "2").then_some(())
    });
    let row = wait_until("kubectl get hpa shows the usage", 60, || {
        let out = s.ok(&["get", "hpa", "spin", "--no-headers"]);
        let cells: Vec<String> = out.split_whitespace().map(str::to_string).collect();
        (cells.len() >= 7 && cells[3].ends_with('%') && !cells[3].contains("unknown"))
            .then_some(cells)
    });
    assert_eq!(row[1], "Deployment/spin", "{row:?}");
    assert_eq!(row[2], "cpu:", "{row:?}");
    let used: u32 = row[3]
        .split('/')
        .next()
        .unwrap()
        .trim_end_matches('%')
        .parse()
        .unwrap();
    assert!(used > 55, "{row:?}");
    assert_eq!(&row[4..6], ["1", "2"], "{row:?}");
    let events = s.ok(&[
        "get",
        "events",
        "--field-selector",
        "reason=SuccessfulRescale",
        "-o",
        "jsonpath={.items[*].message}",
    ]);
    assert!(
        events.contains(
            "New size: 2; reason: cpu resource utilization (percentage of request) above target"
        ),
        "{events}"
    );
    s.ok(&["delete", "deployment", "spin", "--wait=false"]);
}
