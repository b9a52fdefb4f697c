//! Encryption at rest with the real kubectl: Secrets are not in the raw
//! store (the redb file, or etcd through `etcdctl`), read back intact,
//! survive a restart, rotate with `kubectl replace`, and a missing or wrong
//! key is a 500 naming it; a bad `--encryption-provider-config` refuses
//! start.

use std::io::Read;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use skiff_e2e::{skiff_binary, text, Server};
use skiff_store::testsuite::EtcdServer;

const NO_LOOPS: [&str; 2] = ["--disable-scheduler", "--disable-controllers"];

fn contains(hay: &[u8], needle: &str) -> bool {
    hay.windows(needle.len()).any(|w| w == needle.as_bytes())
}

fn store_bytes(s: &Server) -> Vec<u8> {
    std::fs::read(s.dir.path().join("data/store.redb")).expect("read the redb file")
}

/// A key's secret in base64 (deterministic per byte, distinct per `fill`).
fn secret(fill: u8) -> String {
    // 32 bytes of `fill`: base64 of a repeated byte, computed by hand so the
    // test needs no encoder: every 3 bytes give the same 4 characters.
    const ALPHA: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let b = [fill, fill, fill];
    let n = ((b[0] as u32) << 16) | ((b[1] as u32) << 8) | b[2] as u32;
    let quad: String = (0..4)
        .map(|i| ALPHA[((n >> (18 - 6 * i)) & 63) as usize] as char)
        .collect();
    // 30 bytes = 10 quads; the last 2 bytes are 3 characters and '='.
    let n2 = ((fill as u32) << 16) | ((fill as u32) << 8);
    let tail: String = (0..3)
        .map(|i| ALPHA[((n2 >> (18 - 6 * i)) & 63) as usize] as char)
        .collect();
    format!("{}{tail}=", quad.repeat(10))
}

fn write_config(path: &Path, providers: &str) {
    std::fs::write(
        path,
        format!(
            "apiVersion: apiserver.config.k8s.io/v1\nkind: EncryptionConfiguration\nresources:\n- resources: [secrets]\n  providers:\n{providers}"
        ),
    )
    .unwrap();
}

fn aesgcm(keys: &[(&str, u8)]) -> String {
    let mut s = "  - aesgcm:\n      keys:\n".to_string();
    for (name, fill) in keys {
        s += &format!("      - name: {name}\n        secret: {}\n", secret(*fill));
    }
    s
}

#[test]
fn secrets_are_encrypted_at_rest_by_default() {
    let mut s = Server::start_with(&NO_LOOPS);
    let config = s.dir.path().join("data/pki/encryption-config.yaml");
    let meta = std::fs::metadata(&config).expect("the default config was written");
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(meta.permissions().mode() & 0o777, 0o600);

    s.ok(&[
        "create",
        "secret",
        "generic",
        "vault",
        "--from-literal=password=correct-horse-battery-4711",
    ]);
    s.ok(&[
        "create",
        "configmap",
        "plain",
        "--from-literal=note=visible-in-the-store-4711",
    ]);
    let b64 = s.ok(&["get", "secret", "vault", "-o", "jsonpath={.data.password}"]);
    assert!(!b64.is_empty());
    let raw = store_bytes(&s);
    // The check can see plain values: the ConfigMap is not encrypted.
    assert!(contains(&raw, "visible-in-the-store-4711"));
    assert!(!contains(&raw, "correct-horse-battery-4711"));
    assert!(!contains(&raw, &b64), "the secret's base64 is in the store");
    assert!(contains(&raw, "k8s:enc:secretbox:v1:key1:"));

    // Read back intact, listed, and again after a restart (the same key).
    s.restart();
    let b64_after = s.ok(&["get", "secret", "vault", "-o", "jsonpath={.data.password}"]);
    assert_eq!(b64_after, b64);
    let list = s.ok(&["get", "secrets", "-o", "jsonpath={.items[*].data.password}"]);
    assert!(list.contains(&b64), "{list}");
    // A watch sees plaintext too.
    let watch = s.kubectl_background(&[
        "get",
        "secret",
        "-w",
        "--output-watch-events",
        "-o",
        "jsonpath={.type} {.object.data.password}{\"\\n\"}",
    ]);
    s.ok(&[
        "create",
        "secret",
        "generic",
        "second",
        "--from-literal=password=seen-by-a-watch",
    ]);
    // "seen-by-a-watch" in base64.
    watch.wait_for("the new secret's value", |o| {
        o.contains("ADDED c2Vlbi1ieS1hLXdhdGNo")
    });
}

#[test]
fn rotation_by_replace_and_unknown_or_wrong_keys() {
    let tmp = tempfile::tempdir().unwrap();
    let cfg = tmp.path().join("enc.yaml");
    write_config(&cfg, &aesgcm(&[("key1", 1)]));
    let cfg_s = cfg.to_str().unwrap();
    let mut s = Server::start_with(&[
        NO_LOOPS[0],
        NO_LOOPS[1],
        "--encryption-provider-config",
        cfg_s,
    ]);
    s.ok(&["create", "namespace", "other"]);
    s.ok(&["create", "secret", "generic", "a", "--from-literal=k=alpha"]);
    s.ok(&[
        "create",
        "secret",
        "generic",
        "b",
        "-n",
        "other",
        "--from-literal=k=beta",
    ]);
    assert!(contains(&store_bytes(&s), "k8s:enc:aesgcm:v1:key1:"));
    let rv_before = s.ok(&[
        "get",
        "secret",
        "a",
        "-o",
        "jsonpath={.metadata.resourceVersion}",
    ]);

    // Wrong secret under the same name: a 500 naming the key, not garbage.
    write_config(&cfg, &aesgcm(&[("key1", 9)]));
    s.restart();
    let err = s.fails(&["get", "secret", "a"]);
    assert!(err.contains("InternalError"), "{err}");
    assert!(
        err.contains("\"key1\"") && err.contains("does not decrypt"),
        "{err}"
    );
    assert!(err.contains("/registry/secrets/default/a"), "{err}");
    // The rest of the server works.
    s.ok(&["get", "namespace", "other"]);

    // Rotation: the new key first, the old one still there.
    write_config(&cfg, &aesgcm(&[("key2", 2), ("key1", 1)]));
    s.restart();
    assert_eq!(
        s.ok(&["get", "secret", "a", "-o", "jsonpath={.data.k}"]),
        "YWxwaGE="
    );
    let all = s.ok(&["get", "secrets", "-A", "-o", "json"]);
    s.ok_stdin(&["replace", "-f", "-"], &all);
    let rv_after = s.ok(&[
        "get",
        "secret",
        "a",
        "-o",
        "jsonpath={.metadata.resourceVersion}",
    ]);
    assert_ne!(rv_before, rv_after, "replace wrote the secret again");
    // Unchanged and not stale: a second replace writes nothing.
    let all = s.ok(&["get", "secrets", "-A", "-o", "json"]);
    s.ok_stdin(&["replace", "-f", "-"], &all);
    assert_eq!(
        s.ok(&[
            "get",
            "secret",
            "a",
            "-o",
            "jsonpath={.metadata.resourceVersion}"
        ]),
        rv_after
    );

    // The old key removed: everything still reads.
    write_config(&cfg, &aesgcm(&[("key2", 2)]));
    s.restart();
    assert_eq!(
        s.ok(&["get", "secret", "a", "-o", "jsonpath={.data.k}"]),
        "YWxwaGE="
    );
    assert_eq!(
        s.ok(&[
            "get",
            "secret",
            "b",
            "-n",
            "other",
            "-o",
            "jsonpath={.data.k}"
        ]),
        "YmV0YQ=="
    );

    // A secret written with key2, then key2 dropped: 500 naming key2.
    write_config(&cfg, &aesgcm(&[("key3", 3)]));
    s.restart();
    let err = s.fails(&["get", "secret", "b", "-n", "other"]);
    assert!(err.contains("InternalError"), "{err}");
    assert!(err.contains("aesgcm key \"key2\""), "{err}");
    assert!(err.contains("not in the encryption configuration"), "{err}");
}

/// Runs `skiff server` with `args` and expects it to exit with an error
/// within 20 s; returns its output.
fn refused(dir: &Path, args: &[&str]) -> String {
    let mut child = Command::new(skiff_binary())
        .arg("server")
        .arg("--data-dir")
        .arg(dir.join("data"))
        .args([
            "--listen",
            "127.0.0.1:0",
            "--disable-scheduler",
            "--disable-controllers",
        ])
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start skiff");
    let deadline = Instant::now() + Duration::from_secs(20);
    let status = loop {
        if let Some(st) = child.try_wait().unwrap() {
            break Some(st);
        }
        if Instant::now() > deadline {
            break None;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let Some(status) = status else {
        let _ = child.kill();
        let _ = child.wait();
        panic!("skiff server started with {args:?}");
    };
    let mut out = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut out)
        .unwrap();
    assert!(!status.success(), "{out}");
    out
}

#[test]
fn a_bad_encryption_config_refuses_start() {
    let tmp = tempfile::tempdir().unwrap();
    let cfg = tmp.path().join("enc.yaml");
    let cfg_s = cfg.to_str().unwrap();

    let out = refused(tmp.path(), &["--encryption-provider-config", cfg_s]);
    assert!(out.contains("enc.yaml"), "{out}");

    std::fs::write(
        &cfg,
        "apiVersion: apiserver.config.k8s.io/v1\nkind: EncryptionConfiguration\nresources:\n- resources: [secrets]\n  providers:\n  - aesgcm:\n      keys:\n      - name: k\n        secret: c2hvcnQ=\n",
    )
    .unwrap();
    let out = refused(tmp.path(), &["--encryption-provider-config", cfg_s]);
    assert!(
        out.contains("16, 24 or 32 bytes") && out.contains("\"k\""),
        "{out}"
    );

    write_config(&cfg, "  - kms:\n      name: vault\n");
    let out = refused(tmp.path(), &["--encryption-provider-config", cfg_s]);
    assert!(out.contains("kms provider is not supported"), "{out}");
}

#[test]
fn secrets_in_etcd_are_encrypted() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let etcd = rt.block_on(EtcdServer::start());
    let url = etcd.endpoint();
    let s = Server::start_with(&[NO_LOOPS[0], NO_LOOPS[1], "--etcd-servers", &url]);
    s.ok(&[
        "create",
        "secret",
        "generic",
        "db",
        "--from-literal=pw=etcd-secret-4711",
    ]);
    s.ok(&[
        "create",
        "configmap",
        "cm",
        "--from-literal=pw=etcd-plain-4711",
    ]);
    let get = |key: &str| {
        let out = Command::new("etcdctl")
            .env("ETCDCTL_API", "3")
            .args(["--endpoints", &url, "get", key, "--print-value-only"])
            .output()
            .expect("run etcdctl");
        assert!(out.status.success(), "etcdctl: {}", text(&out.stderr));
        out.stdout
    };
    let raw = get("/registry/secrets/default/db");
    assert!(
        raw.starts_with(b"k8s:enc:secretbox:v1:key1:"),
        "{}",
        text(&raw)
    );
    let b64 = s.ok(&["get", "secret", "db", "-o", "jsonpath={.data.pw}"]);
    assert_eq!(b64, "ZXRjZC1zZWNyZXQtNDcxMQ==");
    assert!(!contains(&raw, "etcd-secret-4711") && !contains(&raw, &b64));
    assert!(contains(
        &get("/registry/configmaps/default/cm"),
        "etcd-plain-4711"
    ));
    drop(s);
    drop(etcd);
}
