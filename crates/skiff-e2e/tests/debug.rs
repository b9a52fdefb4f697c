//! A real single-node cluster (`skiff up` over a private containerd)
//! driven with the real kubectl: `kubectl debug` adds ephemeral containers
//! that run in the pod's namespaces (the target container's processes in
//! view), report their status, reach `kubectl logs -c` and `kubectl debug
//! -i`'s attach; and exec with stdin (kube-rs offering v5 then v4,
//! kubectl offering v5) ends when the client closes its stdin.

use std::io::Write;
use std::process::Stdio;
use std::time::{Duration, Instant};

use skiff_e2e::{text, wait_until, Server, BUSYBOX};

fn jsonpath(s: &Server, pod: &str, path: &str) -> String {
    let out = s.kubectl(&["get", "pod", pod, "-o", &format!("jsonpath={path}")]);
    text(&out.stdout)
}

fn run_sleeper(s: &Server, pod: &str) {
    s.ok(&[
        "run",
        pod,
        "--image",
        BUSYBOX,
        "--image-pull-policy=IfNotPresent",
        "--",
        "sh",
        "-c",
        "echo app-up; exec sleep 3600",
    ]);
    wait_until(&format!("pod {pod} Running"), 120, || {
        (jsonpath(s, pod, "{.status.phase}") == "Running").then_some(())
    });
}

/// Runs kubectl with `input` on its stdin, then closed; gives (exit code,
/// stdout, stderr), or `None` if it is still running after `secs` (it is
/// killed then).
fn kubectl_with_input(
    s: &Server,
    args: &[&str],
    input: &str,
    secs: u64,
) -> Option<(Option<i32>, String, String)> {
    let mut input = Some(input.to_string());
    drive(s, args, secs, |stdin, _| {
        if let (Some(w), Some(text)) = (stdin.as_mut(), input.take()) {
            w.write_all(text.as_bytes()).unwrap();
        }
        // Dropped: kubectl sees the end of its input.
        *stdin = None;
    })
}

/// Runs kubectl, writing `line` to its stdin every half second until its
/// stdout shows `answer`, then ends its input; gives (exit code, stdout,
/// stderr) once kubectl exits, or `None` if it has not after `secs`.
fn kubectl_typing(
    s: &Server,
    args: &[&str],
    line: &str,
    answer: &str,
    secs: u64,
) -> Option<(Option<i32>, String, String)> {
    let mut last_typed: Option<Instant> = None;
    drive(s, args, secs, |stdin, out| {
        if out.contains(answer) {
            *stdin = None;
        } else if let Some(w) = stdin.as_mut() {
            if last_typed.is_none_or(|t| t.elapsed() > Duration::from_millis(500)) {
                let _ = w.write_all(line.as_bytes());
                last_typed = Some(Instant::now());
            }
        }
    })
}

/// Runs kubectl with a piped stdin, calling `feed` with its stdin (set it
/// to `None` to close it) and its stdout so far every 50 ms until it exits
/// (then its exit code, stdout and stderr) or `secs` pass (then it is
/// killed and the answer is `None`).
fn drive(
    s: &Server,
    args: &[&str],
    secs: u64,
    mut feed: impl FnMut(&mut Option<std::process::ChildStdin>, &str),
) -> Option<(Option<i32>, String, String)> {
    let dir = tempfile::tempdir().unwrap();
    let (out, err) = (dir.path().join("out"), dir.path().join("err"));
    let mut child = s
        .kubectl_cmd(args)
        .stdin(Stdio::piped())
        .stdout(std::fs::File::create(&out).unwrap())
        .stderr(std::fs::File::create(&err).unwrap())
        .spawn()
        .expect("start kubectl");
    let read = |p: &std::path::Path| std::fs::read_to_string(p).unwrap_or_default();
    let deadline = Instant::now() + Duration::from_secs(secs);
    let mut stdin = child.stdin.take();
    loop {
        feed(&mut stdin, &read(&out));
        if let Some(status) = child.try_wait().unwrap() {
            return Some((status.code(), read(&out), read(&err)));
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            eprintln!(
                "kubectl {args:?} still running; stdout: {}\nstderr: {}",
                read(&out),
                read(&err)
            );
            return None;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn kubectl_debug_runs_ephemeral_containers_in_the_pods_namespaces() {
    let s = Server::up();
    run_sleeper(&s, "app");
    let ip = jsonpath(&s, "app", "{.status.podIP}");

    // Without -i: the container is added, runs once, and its output is in
    // `kubectl logs -c`. With --target it sees the target's processes
    // (PID 1 is the app's command); it shares the pod's network.
    let out = s.ok(&[
        "debug",
        "app",
        "--image",
        BUSYBOX,
        "--image-pull-policy=IfNotPresent",
        "--target=app",
        "--container=dbg",
        "--",
        "sh",
        "-c",
        "echo pid1=$(tr '\\0' ' ' < /proc/1/cmdline); ip -o -4 addr show eth0",
    ]);
    assert!(!out.contains("error"), "{out}");
    let logs = wait_until("the debug container's logs", 60, || {
        let out = s.kubectl(&["logs", "app", "-c", "dbg"]);
        let t = text(&out.stdout);
        t.contains("pid1=").then_some(t)
    });
    assert!(logs.contains("pid1=sleep 3600"), "{logs}");
    assert!(logs.contains(&format!("inet {ip}/")), "{logs}");
    let code = wait_until("the debug container's exit", 60, || {
        let c = jsonpath(
            &s,
            "app",
            "{.status.ephemeralContainerStatuses[0].state.terminated.exitCode}",
        );
        (!c.is_empty()).then_some(c)
    });
    assert_eq!(code, "0");
    assert_eq!(
        jsonpath(&s, "app", "{.status.ephemeralContainerStatuses[0].name}"),
        "dbg"
    );
    // It ran once, is never restarted, and the pod goes on running.
    assert_eq!(
        jsonpath(
            &s,
            "app",
            "{.status.ephemeralContainerStatuses[0].restartCount}"
        ),
        "0"
    );
    assert_eq!(jsonpath(&s, "app", "{.status.phase}"), "Running");

    // With -i: kubectl waits for the container to run and attaches to it.
    // As a user would, the test types a line, and types it again until the
    // answer shows ("If you don't see a command prompt, try pressing
    // enter": containerd 1.6 starts copying an attach's stdin before it
    // hooks up its stdout, so an answer to input that was waiting can be
    // lost), then ends its input; the shell ends and so does kubectl.
    let (code, out, err) = kubectl_typing(
        &s,
        &[
            "debug",
            "-i",
            "app",
            "--image",
            BUSYBOX,
            "--image-pull-policy=IfNotPresent",
            "--container=dbg2",
            "--",
            "sh",
            "-c",
            "while read line; do echo got:$line; done",
        ],
        "hello\n",
        "got:hello",
        90,
    )
    .expect("kubectl debug -i ends when the container does");
    assert!(out.contains("got:hello"), "stdout: {out}\nstderr: {err}");
    assert_eq!(code, Some(0), "stdout: {out}\nstderr: {err}");
    let names = jsonpath(&s, "app", "{.status.ephemeralContainerStatuses[*].name}");
    assert_eq!(names, "dbg dbg2");
}

/// An exec through kube-rs, which offers `v5.channel.k8s.io, v4.channel.k8s.io`
/// and closes stdin with v5's signal when v5 is agreed: what it got back
/// (protocol, stdout, the final status), or `None` if the command did not
/// end within 30 s of the input's end.
fn kube_rs_exec(s: &Server, command: &[&str], input: &str) -> Option<(String, String, String)> {
    use kube::api::{Api, AttachParams};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let kc = kube::config::Kubeconfig::read_from(&s.kubeconfig).unwrap();
        let config = kube::Config::from_custom_kubeconfig(kc, &Default::default())
            .await
            .unwrap();
        let client = kube::Client::try_from(config).unwrap();
        let pods: Api<k8s_openapi::api::core::v1::Pod> = Api::namespaced(client.clone(), "default");
        let ap = AttachParams::default().stdin(true).stderr(false);
        // Which protocol the server agrees to for this client.
        let mut req = kube::core::Request::new("/api/v1/namespaces/default/pods")
            .exec("app", command.iter().copied(), &ap)
            .unwrap();
        req.extensions_mut().insert("exec");
        let probe = client.connect(req).await.unwrap();
        let protocol = if probe.supports_stream_close() {
            "v5"
        } else {
            "v4"
        }
        .to_string();
        drop(probe);
        let mut p = pods
            .exec("app", command.iter().copied(), &ap)
            .await
            .unwrap();
        let mut stdin = p.stdin().unwrap();
        let mut stdout = p.stdout().unwrap();
        let status = p.take_status().unwrap();
        stdin.write_all(input.as_bytes()).await.unwrap();
        stdin.shutdown().await.unwrap();
        drop(stdin);
        let done = async {
            let mut out = String::new();
            let _ = stdout.read_to_string(&mut out).await;
            let st = status
                .await
                .map(|s| s.status.unwrap_or_default())
                .unwrap_or_default();
            (out, st)
        };
        let (out, st) = tokio::time::timeout(Duration::from_secs(30), done)
            .await
            .ok()?;
        Some((protocol, out, st))
    })
}

#[test]
fn a_client_offering_v5_then_v4_closes_stdin_and_the_command_ends() {
    let s = Server::up();
    run_sleeper(&s, "app");
    let (protocol, out, status) = kube_rs_exec(&s, &["cat"], "line one\nline two\n")
        .expect("cat ends once the client closes its stdin");
    assert_eq!(protocol, "v5");
    assert_eq!(out, "line one\nline two\n");
    assert_eq!(status, "Success");
}

#[test]
fn kubectl_exec_with_stdin_ends_when_its_input_does() {
    let s = Server::up();
    run_sleeper(&s, "app");
    // kubectl 1.33 offers only v5.channel.k8s.io over WebSocket (and falls
    // back to SPDY when refused); when its input ends it sends v5's
    // close-stdin signal and `cat` then ends.
    let (code, out, err) = kubectl_with_input(
        &s,
        &["exec", "-i", "app", "--", "cat"],
        "line one\nline two\n",
        30,
    )
    .expect("kubectl exec -i ... cat ends when its input does");
    assert_eq!(code, Some(0), "stderr: {err}");
    assert_eq!(out, "line one\nline two\n");

    // What comes after the input ends still arrives, and the exit code.
    let (code, out, err) = kubectl_with_input(
        &s,
        &[
            "exec",
            "-i",
            "app",
            "--",
            "sh",
            "-c",
            "wc -l; echo to-stderr >&2; exit 3",
        ],
        "a\nb\nc\n",
        30,
    )
    .expect("kubectl exec -i ... sh ends when its input does");
    assert_eq!(out.trim(), "3", "stderr: {err}");
    assert!(err.contains("to-stderr"), "{err}");
    assert_eq!(code, Some(3), "stderr: {err}");

    // Without stdin nothing changes.
    let out = s.ok(&["exec", "app", "--", "echo", "plain"]);
    assert_eq!(out, "plain\n");
}
