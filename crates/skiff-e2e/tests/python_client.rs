//! The official python `kubernetes` client against skiff
//! (`tests/python/*.py`).

use skiff_e2e::{python_binary, repo_root, text, Server};

/// Runs `tests/python/<script>` against `s` and asserts it succeeded and
/// printed `marker`.
fn run_script(s: &Server, script: &str, marker: &str) {
    let path = repo_root().join("tests/python").join(script);
    let out = std::process::Command::new(python_binary())
        .arg(&path)
        .arg(&s.kubeconfig)
        .output()
        .expect("run python3");
    assert!(
        out.status.success(),
        "{script} failed:\nstdout: {}\nstderr: {}\nserver log:\n{}",
        text(&out.stdout),
        text(&out.stderr),
        s.log()
    );
    assert!(text(&out.stdout).contains(marker));
}

#[test]
fn the_python_client_lists_watches_resumes_and_sees_410_after_compaction() {
    let s = Server::start_with(&["--compact-keep", "1", "--compact-every", "1"]);
    run_script(&s, "watch_test.py", "watch: ok");
}

#[test]
fn the_python_client_creates_reads_pages_patches_and_deletes() {
    let s = Server::start();
    run_script(&s, "client_test.py", "client: ok");
}

#[test]
fn the_python_client_with_a_service_account_token_gets_what_rbac_grants() {
    let s = Server::start();
    run_script(&s, "rbac_test.py", "rbac: ok");
}
