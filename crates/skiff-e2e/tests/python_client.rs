//! The official python `kubernetes` client's watch against skiff
//! (`tests/python/watch_test.py`).

use skiff_e2e::{python_binary, repo_root, text, Server};

#[test]
fn the_python_client_lists_watches_resumes_and_sees_410_after_compaction() {
    let s = Server::start_with(&["--compact-keep", "1", "--compact-every", "1"]);
    let script = repo_root().join("tests/python/watch_test.py");
    let out = std::process::Command::new(python_binary())
        .arg(&script)
        .arg(&s.kubeconfig)
        .output()
        .expect("run python3");
    assert!(
        out.status.success(),
        "python watch test failed:\nstdout: {}\nstderr: {}\nserver log:\n{}",
        text(&out.stdout),
        text(&out.stderr),
        s.log()
    );
    assert!(text(&out.stdout).contains("watch: ok"));
}
