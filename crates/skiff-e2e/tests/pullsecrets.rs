//! Image pulls with registry credentials, against a real registry and the
//! real containerd of `skiff up`: a registry on a loopback port (written
//! here: the OCI distribution API's `/v2/`, manifests and blobs, serving
//! the busybox test image, answering 401 with `WWW-Authenticate: Basic`
//! without the right credentials). containerd talks plain HTTP to a
//! 127.0.0.1 registry by default. A pod without credentials gets
//! ErrImagePull/ImagePullBackOff with the registry's refusal; a pod with a
//! `kubernetes.io/dockerconfigjson` (or legacy `dockercfg`) secret in its
//! `imagePullSecrets`, or in its ServiceAccount's, runs; a missing secret
//! is a FailedToRetrieveImagePullSecret warning and an anonymous pull.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::Path;
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use base64::Engine;
use skiff_e2e::{busybox_archive, text, wait_until, Server};

const USER: &str = "skiff";
const PASSWORD: &str = "s3cret-pw";

fn sha256_file(path: &Path) -> String {
    let out = Command::new("sha256sum")
        .arg(path)
        .output()
        .expect("run sha256sum");
    assert!(out.status.success());
    text(&out.stdout)
        .split_whitespace()
        .next()
        .expect("digest")
        .to_string()
}

/// The busybox test image as registry content: the manifest (and its
/// digest) and the blobs by digest.
struct Content {
    manifest: Vec<u8>,
    manifest_digest: String,
    blobs: HashMap<String, Vec<u8>>,
}

fn busybox_content(scratch: &Path) -> Content {
    let dir = scratch.join("image");
    std::fs::create_dir_all(&dir).unwrap();
    let out = Command::new("tar")
        .arg("-xf")
        .arg(busybox_archive())
        .arg("-C")
        .arg(&dir)
        .output()
        .expect("run tar");
    assert!(out.status.success(), "{}", text(&out.stderr));
    let m: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.join("manifest.json")).unwrap()).unwrap();
    let config_path = dir.join(m[0]["Config"].as_str().unwrap());
    let layer_path = dir.join(m[0]["Layers"][0].as_str().unwrap());
    let config = std::fs::read(&config_path).unwrap();
    let layer = std::fs::read(&layer_path).unwrap();
    let config_digest = format!("sha256:{}", sha256_file(&config_path));
    let layer_digest = format!("sha256:{}", sha256_file(&layer_path));
    let manifest = serde_json::to_vec(&serde_json::json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {
            "mediaType": "application/vnd.oci.image.config.v1+json",
            "digest": config_digest,
            "size": config.len(),
        },
        "layers": [{
            "mediaType": "application/vnd.oci.image.layer.v1.tar",
            "digest": layer_digest,
            "size": layer.len(),
        }],
    }))
    .unwrap();
    let mpath = scratch.join("manifest.json");
    std::fs::write(&mpath, &manifest).unwrap();
    let manifest_digest = format!("sha256:{}", sha256_file(&mpath));
    Content {
        manifest,
        manifest_digest,
        blobs: HashMap::from([(config_digest, config), (layer_digest, layer)]),
    }
}

/// A registry requiring basic auth on 127.0.0.1; every repository name
/// serves the same image.
struct Registry {
    port: u16,
    stop: Arc<AtomicBool>,
    /// Requests refused for lack of (right) credentials.
    refused: Arc<AtomicUsize>,
    /// Manifest requests served to an authenticated client, by repository.
    served: Arc<std::sync::Mutex<Vec<String>>>,
}

impl Registry {
    fn start(content: Content) -> Registry {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        let port = listener.local_addr().unwrap().port();
        let stop = Arc::new(AtomicBool::new(false));
        let refused = Arc::new(AtomicUsize::new(0));
        let served = Arc::new(std::sync::Mutex::new(Vec::new()));
        let content = Arc::new(content);
        let want = format!(
            "Basic {}",
            base64::engine::general_purpose::STANDARD.encode(format!("{USER}:{PASSWORD}"))
        );
        {
            let (stop, refused, served) = (stop.clone(), refused.clone(), served.clone());
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    match listener.accept() {
                        Ok((conn, _)) => {
                            let (content, want, refused, served) = (
                                content.clone(),
                                want.clone(),
                                refused.clone(),
                                served.clone(),
                            );
                            std::thread::spawn(move || {
                                let _ = serve(conn, &content, &want, &refused, &served);
                            });
                        }
                        Err(_) => std::thread::sleep(Duration::from_millis(20)),
                    }
                }
            });
        }
        Registry {
            port,
            stop,
            refused,
            served,
        }
    }

    fn host(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    fn served(&self, repo: &str) -> bool {
        self.served.lock().unwrap().iter().any(|r| r == repo)
    }
}

impl Drop for Registry {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

fn respond(
    w: &mut TcpStream,
    status: &str,
    headers: &[(&str, String)],
    body: &[u8],
    head: bool,
) -> std::io::Result<()> {
    let mut out = format!("HTTP/1.1 {status}\r\nContent-Length: {}\r\n", body.len());
    out.push_str("Docker-Distribution-API-Version: registry/2.0\r\n");
    for (k, v) in headers {
        out.push_str(&format!("{k}: {v}\r\n"));
    }
    out.push_str("\r\n");
    w.write_all(out.as_bytes())?;
    if !head {
        w.write_all(body)?;
    }
    w.flush()
}

/// Serves one connection's requests (HTTP/1.1 keep-alive).
fn serve(
    conn: TcpStream,
    content: &Content,
    want: &str,
    refused: &AtomicUsize,
    served: &std::sync::Mutex<Vec<String>>,
) -> std::io::Result<()> {
    conn.set_nonblocking(false)?;
    conn.set_read_timeout(Some(Duration::from_secs(30)))?;
    let mut w = conn.try_clone()?;
    let mut r = BufReader::new(conn);
    loop {
        let mut line = String::new();
        if r.read_line(&mut line)? == 0 {
            return Ok(());
        }
        let mut parts = line.split_whitespace();
        let method = parts.next().unwrap_or("").to_string();
        let path = parts.next().unwrap_or("").to_string();
        let mut auth = String::new();
        let mut length = 0usize;
        loop {
            let mut h = String::new();
            if r.read_line(&mut h)? == 0 {
                return Ok(());
            }
            let h = h.trim_end();
            if h.is_empty() {
                break;
            }
            if let Some((k, v)) = h.split_once(':') {
                match k.trim().to_ascii_lowercase().as_str() {
                    "authorization" => auth = v.trim().to_string(),
                    "content-length" => length = v.trim().parse().unwrap_or(0),
                    _ => {}
                }
            }
        }
        let mut body = vec![0; length];
        r.read_exact(&mut body)?;
        let head = method == "HEAD";
        if auth != want {
            refused.fetch_add(1, Ordering::Relaxed);
            let msg = br#"{"errors":[{"code":"UNAUTHORIZED","message":"authentication required","detail":null}]}"#;
            respond(
                &mut w,
                "401 Unauthorized",
                &[
                    ("WWW-Authenticate", r#"Basic realm="skiff-e2e""#.into()),
                    ("Content-Type", "application/json".into()),
                ],
                msg,
                head,
            )?;
            continue;
        }
        let p = path.split('?').next().unwrap_or("");
        if p == "/v2/" || p == "/v2" {
            respond(
                &mut w,
                "200 OK",
                &[("Content-Type", "application/json".into())],
                b"{}",
                head,
            )?;
            continue;
        }
        let rest = p.strip_prefix("/v2/").unwrap_or("");
        if let Some((repo, _reference)) = rest.rsplit_once("/manifests/") {
            served.lock().unwrap().push(repo.to_string());
            respond(
                &mut w,
                "200 OK",
                &[
                    (
                        "Content-Type",
                        "application/vnd.oci.image.manifest.v1+json".into(),
                    ),
                    ("Docker-Content-Digest", content.manifest_digest.clone()),
                ],
                &content.manifest,
                head,
            )?;
            continue;
        }
        if let Some((_repo, digest)) = rest.rsplit_once("/blobs/") {
            if let Some(b) = content.blobs.get(digest) {
                respond(
                    &mut w,
                    "200 OK",
                    &[
                        ("Content-Type", "application/octet-stream".into()),
                        ("Docker-Content-Digest", digest.to_string()),
                    ],
                    b,
                    head,
                )?;
                continue;
            }
        }
        let msg = br#"{"errors":[{"code":"NOT_FOUND","message":"not found","detail":null}]}"#;
        respond(
            &mut w,
            "404 Not Found",
            &[("Content-Type", "application/json".into())],
            msg,
            head,
        )?;
    }
}

fn jsonpath(s: &Server, pod: &str, path: &str) -> String {
    let out = s.kubectl(&["get", "pod", pod, "-o", &format!("jsonpath={path}")]);
    String::from_utf8_lossy(&out.stdout).to_string()
}

fn wait_running(s: &Server, pod: &str) {
    wait_until(&format!("pod {pod} Running"), 120, || {
        (jsonpath(s, pod, "{.status.phase}") == "Running").then_some(())
    });
}

/// Waits for the pull to fail; returns the waiting message.
fn wait_pull_failed(s: &Server, pod: &str) -> String {
    wait_until(
        &format!("pod {pod} ErrImagePull or ImagePullBackOff"),
        90,
        || {
            let r = jsonpath(
                s,
                pod,
                "{.status.containerStatuses[0].state.waiting.reason}",
            );
            (r == "ErrImagePull" || r == "ImagePullBackOff").then(|| {
                jsonpath(
                    s,
                    pod,
                    "{.status.containerStatuses[0].state.waiting.message}",
                )
            })
        },
    )
}

fn pod_yaml(name: &str, image: &str, extra_spec: &str) -> String {
    format!(
        r#"
apiVersion: v1
kind: Pod
metadata:
  name: {name}
spec:
  terminationGracePeriodSeconds: 1
{extra_spec}
  containers:
  - name: main
    image: {image}
    command: ["sleep", "3600"]
"#
    )
}

#[test]
fn pods_pull_from_a_private_registry_with_their_or_their_service_accounts_pull_secrets() {
    let scratch = tempfile::tempdir().unwrap();
    let reg = Registry::start(busybox_content(scratch.path()));
    let host = reg.host();
    let s = Server::up();

    // Without credentials the registry refuses: ErrImagePull, then
    // ImagePullBackOff, with the refusal in the message.
    let private = format!("{host}/private/busybox:1");
    s.ok_stdin(&["apply", "-f", "-"], &pod_yaml("anon", &private, ""));
    let msg = wait_pull_failed(&s, "anon");
    eprintln!("anonymous: {msg}");
    assert!(msg.contains(&private), "{msg}");
    assert!(
        msg.contains("401") || msg.to_lowercase().contains("unauthorized"),
        "the registry's refusal is shown: {msg}"
    );
    assert!(reg.refused.load(Ordering::Relaxed) > 0);
    assert!(!reg.served("private/busybox"));
    wait_until("anon ImagePullBackOff", 90, || {
        let out = s.ok(&["get", "pod", "anon", "--no-headers"]);
        out.contains("ImagePullBackOff").then_some(())
    });

    // A docker-registry secret (kubectl's own) in the pod: it runs.
    s.ok(&[
        "create",
        "secret",
        "docker-registry",
        "regcred",
        &format!("--docker-server={host}"),
        &format!("--docker-username={USER}"),
        &format!("--docker-password={PASSWORD}"),
    ]);
    s.ok_stdin(
        &["apply", "-f", "-"],
        &pod_yaml(
            "with-secret",
            &private,
            "  imagePullSecrets:\n  - name: regcred",
        ),
    );
    wait_running(&s, "with-secret");
    assert!(reg.served("private/busybox"));

    // Wrong credentials fail like none.
    s.ok(&[
        "create",
        "secret",
        "docker-registry",
        "badcred",
        &format!("--docker-server={host}"),
        &format!("--docker-username={USER}"),
        "--docker-password=wrong",
    ]);
    let bad = format!("{host}/bad/busybox:1");
    s.ok_stdin(
        &["apply", "-f", "-"],
        &pod_yaml("bad-secret", &bad, "  imagePullSecrets:\n  - name: badcred"),
    );
    let msg = wait_pull_failed(&s, "bad-secret");
    eprintln!("wrong password: {msg}");
    assert!(msg.contains(&bad), "{msg}");
    assert!(!reg.served("bad/busybox"));

    // Through the ServiceAccount: admission copies its imagePullSecrets
    // into a pod that has none.
    s.ok_stdin(
        &["apply", "-f", "-"],
        "apiVersion: v1\nkind: ServiceAccount\nmetadata:\n  name: puller\nimagePullSecrets:\n- name: regcred\n",
    );
    let via_sa = format!("{host}/sa/busybox:1");
    s.ok_stdin(
        &["apply", "-f", "-"],
        &pod_yaml("via-sa", &via_sa, "  serviceAccountName: puller"),
    );
    assert_eq!(
        jsonpath(&s, "via-sa", "{.spec.imagePullSecrets[*].name}"),
        "regcred"
    );
    wait_running(&s, "via-sa");
    assert!(reg.served("sa/busybox"));

    // The legacy kubernetes.io/dockercfg form.
    let cfg = serde_json::json!({
        format!("http://{host}"): {
            "auth": base64::engine::general_purpose::STANDARD.encode(format!("{USER}:{PASSWORD}")),
        }
    });
    let cfg_path = scratch.path().join(".dockercfg");
    std::fs::write(&cfg_path, cfg.to_string()).unwrap();
    s.ok(&[
        "create",
        "secret",
        "generic",
        "legacycred",
        "--type=kubernetes.io/dockercfg",
        &format!("--from-file=.dockercfg={}", cfg_path.display()),
    ]);
    let legacy = format!("{host}/legacy/busybox:1");
    s.ok_stdin(
        &["apply", "-f", "-"],
        &pod_yaml(
            "legacy",
            &legacy,
            "  imagePullSecrets:\n  - name: legacycred",
        ),
    );
    wait_running(&s, "legacy");
    assert!(reg.served("legacy/busybox"));

    // A secret that does not exist: a warning, and the pull goes on
    // without it (and is refused).
    let missing = format!("{host}/missing/busybox:1");
    s.ok_stdin(
        &["apply", "-f", "-"],
        &pod_yaml("missing", &missing, "  imagePullSecrets:\n  - name: nosuch"),
    );
    wait_pull_failed(&s, "missing");
    let events = wait_until("FailedToRetrieveImagePullSecret", 60, || {
        let out = s.ok(&[
            "get",
            "events",
            "--field-selector",
            "involvedObject.name=missing",
            "-o",
            "jsonpath={range .items[*]}{.type} {.reason}: {.message}{\"\\n\"}{end}",
        ]);
        out.lines()
            .find(|l| l.starts_with("Warning FailedToRetrieveImagePullSecret:"))
            .map(str::to_string)
    });
    eprintln!("missing secret: {events}");
    assert!(events.contains("(nosuch)"), "{events}");
    assert!(!reg.served("missing/busybox"));
}
