//! The batch tier's cgroup. Every batch pod (one asking for
//! `skiff.io/batch-cpu` or `skiff.io/batch-memory`) runs under one parent
//! group, [`BATCH_PARENT`], which the agent marks `SCHED_IDLE` (`cpu.idle`
//! 1, Linux 5.15 and later, in cgroup v1's cpu hierarchy and in v2): the
//! kernel then lets any other runnable task preempt a batch task at its
//! next wakeup, instead of waiting for the batch task's slice to end as it
//! would for a task of merely low weight. That is what keeps a prod
//! service's tail latency where it is alone while batch work soaks up the
//! idle cpu. On an older kernel the group gets the least weight instead
//! (cpu.shares 2, cpu.weight 1), which is what each batch container has
//! anyway.
//!
//! The group is placed as the sandbox's `cgroup_parent`, so containerd
//! puts the pod's sandbox and containers in `<BATCH_PARENT>/<id>` (with
//! the cgroupfs driver that skiff's containerd uses); runc creates the path
//! in each hierarchy, so a missing group costs only the idle marking.

use std::io;
use std::path::{Path, PathBuf};

/// The cgroup every batch pod's sandbox and containers live under.
pub const BATCH_PARENT: &str = "/skiff-batch";

/// How the batch group ended up.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BatchTier {
    /// `cpu.idle` is 1: batch tasks run only on otherwise idle cpu.
    Idle,
    /// The kernel has no `cpu.idle` (or refused it): the group has the
    /// least cpu weight; the reason says why.
    LeastWeight(String),
}

/// Where a cgroup's cpu files are, under the cgroup filesystem at `root`
/// (normally `/sys/fs/cgroup`): the unified hierarchy when it has
/// `cgroup.controllers`, else v1's cpu hierarchy (`cpu` or `cpu,cpuacct`).
fn cpu_dir(root: &Path) -> io::Result<(PathBuf, bool)> {
    if root.join("cgroup.controllers").exists() {
        return Ok((root.to_path_buf(), true));
    }
    for name in ["cpu", "cpu,cpuacct", "cpuacct,cpu"] {
        let dir = root.join(name);
        if dir.join("cpu.shares").exists() {
            return Ok((dir, false));
        }
    }
    Err(io::Error::new(
        io::ErrorKind::NotFound,
        format!("no cpu controller under {}", root.display()),
    ))
}

/// Creates the batch group under the cgroup filesystem at `root` and makes
/// it idle (or, failing that, of least weight). Idempotent: every agent on
/// a machine may call it at start.
pub fn prepare_batch_parent(root: &Path) -> io::Result<BatchTier> {
    let (hierarchy, unified) = cpu_dir(root)?;
    if unified {
        // The cpu controller must be enabled for the root's children for
        // the group to have cpu files; systemd usually has done it.
        let control = hierarchy.join("cgroup.subtree_control");
        let enabled = std::fs::read_to_string(&control).unwrap_or_default();
        if !enabled.split_whitespace().any(|c| c == "cpu") {
            std::fs::write(&control, "+cpu")?;
        }
    }
    let group = hierarchy.join(BATCH_PARENT.trim_start_matches('/'));
    std::fs::create_dir_all(&group)?;
    // An idle group refuses a weight (EINVAL): one made idle by an
    // earlier agent is left as it is.
    let idle = group.join("cpu.idle");
    if std::fs::read_to_string(&idle).is_ok_and(|v| v.trim() == "1") {
        return Ok(BatchTier::Idle);
    }
    let (weight_file, least) = if unified {
        ("cpu.weight", "1")
    } else {
        ("cpu.shares", "2")
    };
    std::fs::write(group.join(weight_file), least)?;
    match std::fs::write(&idle, "1") {
        Ok(()) => Ok(BatchTier::Idle),
        Err(e) => Ok(BatchTier::LeastWeight(format!(
            "{}: {e}",
            group.join("cpu.idle").display()
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A cgroup filesystem as files: the kernel's files are plain files
    /// here, and a missing `cpu.idle` is a directory in its place (which a
    /// write refuses, as an old kernel refuses the missing file).
    fn tree(v2: bool, idle: bool) -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        let group = if v2 {
            std::fs::write(dir.path().join("cgroup.controllers"), "cpu memory").unwrap();
            std::fs::write(dir.path().join("cgroup.subtree_control"), "memory").unwrap();
            dir.path().join("skiff-batch")
        } else {
            let cpu = dir.path().join("cpu,cpuacct");
            std::fs::create_dir_all(&cpu).unwrap();
            std::fs::write(cpu.join("cpu.shares"), "1024").unwrap();
            cpu.join("skiff-batch")
        };
        if !idle {
            std::fs::create_dir_all(group.join("cpu.idle")).unwrap();
        }
        dir
    }

    #[test]
    fn v1_group_is_idle_under_the_cpu_hierarchy() {
        let root = tree(false, true);
        assert_eq!(prepare_batch_parent(root.path()).unwrap(), BatchTier::Idle);
        let group = root.path().join("cpu,cpuacct/skiff-batch");
        assert_eq!(
            std::fs::read_to_string(group.join("cpu.idle")).unwrap(),
            "1"
        );
        assert_eq!(
            std::fs::read_to_string(group.join("cpu.shares")).unwrap(),
            "2"
        );
        // A second agent on the machine finds it ready.
        assert_eq!(prepare_batch_parent(root.path()).unwrap(), BatchTier::Idle);
    }

    #[test]
    fn a_group_an_earlier_agent_made_idle_is_left_as_it_is() {
        let root = tree(false, true);
        let group = root.path().join("cpu,cpuacct/skiff-batch");
        std::fs::create_dir_all(&group).unwrap();
        std::fs::write(group.join("cpu.idle"), "1\n").unwrap();
        // The kernel refuses a weight on an idle group: a directory in the
        // file's place refuses it here.
        std::fs::create_dir_all(group.join("cpu.shares")).unwrap();
        assert_eq!(prepare_batch_parent(root.path()).unwrap(), BatchTier::Idle);
    }

    #[test]
    fn v2_group_enables_cpu_for_the_root_children() {
        let root = tree(true, true);
        assert_eq!(prepare_batch_parent(root.path()).unwrap(), BatchTier::Idle);
        assert_eq!(
            std::fs::read_to_string(root.path().join("cgroup.subtree_control")).unwrap(),
            "+cpu"
        );
        let group = root.path().join("skiff-batch");
        assert_eq!(
            std::fs::read_to_string(group.join("cpu.weight")).unwrap(),
            "1"
        );
        assert_eq!(
            std::fs::read_to_string(group.join("cpu.idle")).unwrap(),
            "1"
        );
    }

    #[test]
    fn without_cpu_idle_the_group_keeps_the_least_weight() {
        let root = tree(false, false);
        match prepare_batch_parent(root.path()).unwrap() {
            BatchTier::LeastWeight(why) => assert!(why.contains("cpu.idle"), "{why}"),
            other => panic!("expected least weight, got {other:?}"),
        }
        let shares = root.path().join("cpu,cpuacct/skiff-batch/cpu.shares");
        assert_eq!(std::fs::read_to_string(shares).unwrap(), "2");
    }

    #[test]
    fn no_cpu_controller_is_an_error() {
        let root = tempfile::tempdir().unwrap();
        let e = prepare_batch_parent(root.path()).unwrap_err();
        assert!(e.to_string().contains("no cpu controller"), "{e}");
    }
}
