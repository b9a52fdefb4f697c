//! Pods' API credentials on a real single-node cluster (`skiff up` with its
//! own containerd), driven with the real kubectl: a pod gets the projected
//! `kube-api-access-*` volume (token, ca.crt, namespace, written through
//! `..data` symlinks), and a TLS client running inside the pod reaches the
//! API server at `https://kubernetes.default.svc` with that token, verified
//! by that ca.crt, and is the pod's ServiceAccount; a pod with
//! `automountServiceAccountToken: false` gets no volume; the token stops
//! working once the pod is deleted.
//!
//! The in-pod client is the host's curl, run from a read-only hostPath
//! mount of `/usr` through the host's dynamic loader (busybox's wget cannot
//! complete a TLS handshake with rustls): its name resolution, routing to
//! the `kubernetes` Service and certificate check all happen in the pod.

use skiff_e2e::{text, wait_until, Server, BUSYBOX};

const SA_DIR: &str = "/var/run/secrets/kubernetes.io/serviceaccount";

fn rand_byte() -> u64 {
    let mut b = [0u8; 8];
    if let Ok(mut f) = std::fs::File::open("/dev/urandom") {
        let _ = std::io::Read::read_exact(&mut f, &mut b);
    }
    u64::from_le_bytes(b)
}

fn jsonpath(s: &Server, kind: &str, name: &str, path: &str) -> String {
    let out = s.kubectl(&["get", kind, name, "-o", &format!("jsonpath={path}")]);
    String::from_utf8_lossy(&out.stdout).to_string()
}

fn reader(name: &str, automount: Option<bool>) -> String {
    let auto = automount
        .map(|b| format!("  automountServiceAccountToken: {b}\n"))
        .unwrap_or_default();
    format!(
        r#"apiVersion: v1
kind: Pod
metadata: {{name: {name}}}
spec:
{auto}  terminationGracePeriodSeconds: 1
  containers:
  - name: c
    image: {BUSYBOX}
    imagePullPolicy: IfNotPresent
    command: ["sleep", "3600"]
    volumeMounts: [{{name: host-usr, mountPath: /host/usr, readOnly: true}}]
  volumes:
  - {{name: host-usr, hostPath: {{path: /usr}}}}
"#
    )
}

/// A SelfSubjectReview posted by curl inside `pod` with the pod's own
/// token and CA, through the `kubernetes` Service's DNS name.
fn in_pod_whoami(s: &Server, pod: &str) -> std::process::Output {
    let script = format!(
        "/host/usr/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2 \
         --library-path /host/usr/lib/x86_64-linux-gnu /host/usr/bin/curl -sS --max-time 10 \
         --cacert {SA_DIR}/ca.crt -H \"Authorization: Bearer $(cat {SA_DIR}/token)\" \
         -H 'Content-Type: application/json' -X POST \
         -d '{{\"apiVersion\":\"authentication.k8s.io/v1\",\"kind\":\"SelfSubjectReview\"}}' \
         https://kubernetes.default.svc/apis/authentication.k8s.io/v1/selfsubjectreviews"
    );
    s.kubectl(&["exec", pod, "--", "sh", "-c", &script])
}

/// The same review from the host, at the server's own port.
fn host_whoami(s: &Server, ca: &std::path::Path, token: &str) -> (String, String) {
    let out = std::process::Command::new("curl")
        .args(["-sS", "--max-time", "10", "--cacert"])
        .arg(ca)
        .args([
            "-H",
            &format!("Authorization: Bearer {token}"),
            "-H",
            "Content-Type: application/json",
            "-X",
            "POST",
            "-d",
            r#"{"apiVersion":"authentication.k8s.io/v1","kind":"SelfSubjectReview"}"#,
            "-w",
            "\n%{http_code}",
            &format!(
                "https://127.0.0.1:{}/apis/authentication.k8s.io/v1/selfsubjectreviews",
                s.port
            ),
        ])
        .output()
        .expect("run curl");
    let all = text(&out.stdout);
    let (body, code) = all.rsplit_once('\n').unwrap_or((&all, ""));
    (code.to_string(), body.to_string())
}

#[test]
fn a_pods_token_reaches_the_api_in_cluster_and_dies_with_the_pod() {
    let cidr = format!("10.{}.0.0/16", 200 + rand_byte() % 50);
    let s = Server::up_with(&["--service-cidr", &cidr]);
    let ca_path = s.dir.path().join("data/pki/ca.crt");
    let ca = std::fs::read_to_string(&ca_path).expect("cluster CA");
    s.ok_stdin(&["apply", "-f", "-"], &reader("reader", None));
    s.ok_stdin(&["apply", "-f", "-"], &reader("no-token", Some(false)));

    // A pod naming an account that does not exist is refused, as by
    // Kubernetes' ServiceAccount admission; once it exists, it is admitted.
    let stranger =
        reader("stranger", None).replace("spec:\n", "spec:\n  serviceAccountName: nobody\n");
    let out = s.kubectl_stdin(&["create", "-f", "-"], &stranger);
    assert!(!out.status.success());
    assert!(
        text(&out.stderr).contains(
            r#"pods "stranger" is forbidden: error looking up service account default/nobody: serviceaccount "nobody" not found"#
        ),
        "{}",
        text(&out.stderr)
    );
    s.ok(&["create", "serviceaccount", "nobody"]);
    s.ok_stdin(&["create", "--dry-run=server", "-f", "-"], &stranger);

    // Admission added the volume and the mount.
    let vol = jsonpath(&s, "pod", "reader", "{.spec.volumes[1].name}");
    assert!(
        vol.starts_with("kube-api-access-") && vol.len() == 21,
        "{vol:?}"
    );
    assert_eq!(
        jsonpath(
            &s,
            "pod",
            "reader",
            "{.spec.volumes[1].projected.sources[0].serviceAccountToken.expirationSeconds}"
        ),
        "3607"
    );
    assert_eq!(
        jsonpath(
            &s,
            "pod",
            "reader",
            "{.spec.containers[0].volumeMounts[1].mountPath}"
        ),
        SA_DIR
    );
    // ... and nothing to the pod that opted out.
    assert_eq!(
        jsonpath(&s, "pod", "no-token", "{.spec.volumes[*].name}"),
        "host-usr"
    );

    for p in ["reader", "no-token"] {
        wait_until(&format!("{p} Running"), 120, || {
            (jsonpath(&s, "pod", p, "{.status.phase}") == "Running").then_some(())
        });
    }

    // The files, as kubelet lays them out.
    let token = s.ok(&["exec", "reader", "--", "cat", &format!("{SA_DIR}/token")]);
    assert_eq!(token.split('.').count(), 3, "a JWT: {token:?}");
    assert_eq!(
        s.ok(&[
            "exec",
            "reader",
            "--",
            "cat",
            &format!("{SA_DIR}/namespace")
        ]),
        "default"
    );
    assert_eq!(
        s.ok(&["exec", "reader", "--", "cat", &format!("{SA_DIR}/ca.crt")])
            .trim(),
        ca.trim()
    );
    let link = s.ok(&[
        "exec",
        "reader",
        "--",
        "readlink",
        &format!("{SA_DIR}/token"),
    ]);
    assert_eq!(link.trim(), "..data/token");
    let out = s.kubectl(&["exec", "no-token", "--", "ls", SA_DIR]);
    assert!(!out.status.success(), "no volume: {}", text(&out.stdout));

    // In the pod: the API answers the token, over TLS verified with ca.crt,
    // by the Service's name.
    let body = wait_until("the API answers the pod's token in-cluster", 60, || {
        let out = in_pod_whoami(&s, "reader");
        let body = text(&out.stdout);
        body.contains("SelfSubjectReview").then_some(body)
    });
    let v: serde_json::Value = serde_json::from_str(&body).expect("JSON");
    let user = &v["status"]["userInfo"];
    assert_eq!(user["username"], "system:serviceaccount:default:default");
    assert_eq!(
        user["extra"]["authentication.kubernetes.io/pod-name"][0], "reader",
        "{user}"
    );

    // From the host, the same token works until its pod is deleted.
    let (code, body) = host_whoami(&s, &ca_path, &token);
    assert_eq!(code, "201", "{body}");
    s.ok(&["delete", "pod", "reader", "--wait=true"]);
    let (code, body) = wait_until("the deleted pod's token is refused", 30, || {
        let (code, body) = host_whoami(&s, &ca_path, &token);
        // "000": curl got no HTTP answer at all (a connection that failed
        // while the node's rules changed); wait for the server's verdict.
        (code != "201" && code != "000").then_some((code, body))
    });
    assert_eq!(code, "401", "{body}");
    assert!(body.contains("Unauthorized"), "{body}");
}
