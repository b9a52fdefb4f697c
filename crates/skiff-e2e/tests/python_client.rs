//! The official python `kubernetes` client against skiff
//! (`tests/python/*.py`).

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

#[test]
fn the_python_client_creates_reads_pages_patches_and_deletes() {
    let s = Server::start();
    let script = repo_root().join("tests/python/client_test.py");
    let out = std::process::Command::new(python_binary())
        .arg(&script)
        .arg(&s.kubeconfig)
        .output()
        .expect("run python3");
    assert!(
        out.status.success(),
        "python client test failed:\nstdout: {}\nstderr: {}\nserver log:\n{}",
        text(&out.stdout),
        text(&out.stderr),
        s.log()
    );
    assert!(text(&out.stdout).contains("client: ok"));
}
