//! The node's filesystem and mounts as the pod worker needs them, behind a
//! trait (as youki's `Syscall`): [`RealHost`] calls the kernel through
//! `nix`, and tests use a recording fake, so the worker's logic runs
//! without root.

use std::io;
use std::path::{Path, PathBuf};

/// The host operations of pods' directories and volumes.
pub trait Host: Send + Sync + 'static {
    /// Creates a directory and its parents (as `mkdir -p`).
    fn create_dir_all(&self, path: &Path) -> io::Result<()>;
    /// Removes a directory and everything in it.
    fn remove_dir_all(&self, path: &Path) -> io::Result<()>;
    /// Mounts a tmpfs on `target` (mode 0777), at most `size_bytes` large
    /// when given (an emptyDir with `medium: Memory`).
    fn mount_tmpfs(&self, target: &Path, size_bytes: Option<u64>) -> io::Result<()>;
    /// The mount points at or under `dir`, in the order they were mounted.
    fn mounts_under(&self, dir: &Path) -> Vec<PathBuf>;
    /// Unmounts one mount point.
    fn unmount(&self, target: &Path) -> io::Result<()>;

    /// Whether `path` itself is a mount point.
    fn is_mountpoint(&self, path: &Path) -> bool {
        self.mounts_under(path).iter().any(|m| m == path)
    }

    /// Unmounts everything mounted at or under `dir`, the most recent
    /// first (so a mount inside another goes before it); failures are
    /// left for the next attempt.
    fn unmount_all(&self, dir: &Path) {
        for target in self.mounts_under(dir).iter().rev() {
            if let Err(e) = self.unmount(target) {
                tracing::debug!(target = %target.display(), error = %e, "unmounting failed");
            }
        }
    }
}

/// The real node: the kernel's mount table (`/proc/self/mounts`),
/// `mount(2)` and `umount2(2)`.
#[derive(Debug, Default, Clone, Copy)]
pub struct RealHost;

impl Host for RealHost {
    fn create_dir_all(&self, path: &Path) -> io::Result<()> {
        std::fs::create_dir_all(path)
    }

    fn remove_dir_all(&self, path: &Path) -> io::Result<()> {
        match std::fs::remove_dir_all(path) {
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
            r => r,
        }
    }

    fn mount_tmpfs(&self, target: &Path, size_bytes: Option<u64>) -> io::Result<()> {
        let mut opts = String::from("mode=0777");
        if let Some(size) = size_bytes {
            opts.push_str(&format!(",size={size}"));
        }
        nix::mount::mount(
            Some("tmpfs"),
            target,
            Some("tmpfs"),
            nix::mount::MsFlags::empty(),
            Some(opts.as_str()),
        )
        .map_err(io::Error::from)
    }

    fn mounts_under(&self, dir: &Path) -> Vec<PathBuf> {
        let table = std::fs::read_to_string("/proc/self/mounts").unwrap_or_default();
        mount_points_under(&table, dir)
    }

    fn unmount(&self, target: &Path) -> io::Result<()> {
        nix::mount::umount2(target, nix::mount::MntFlags::empty()).map_err(io::Error::from)
    }
}

/// The mount points of a mount table (`/proc/self/mounts`' format) at or
/// under `dir`, in the table's order.
pub fn mount_points_under(table: &str, dir: &Path) -> Vec<PathBuf> {
    table
        .lines()
        .filter_map(|l| l.split_whitespace().nth(1))
        .map(|field| PathBuf::from(unescape_mount_field(field)))
        .filter(|p| p.starts_with(dir))
        .collect()
}

/// The kernel writes a space, tab, newline and backslash in a mount table
/// field as an octal escape (`\040`).
fn unescape_mount_field(field: &str) -> String {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'\\' && i + 4 <= bytes.len() {
            let digits = &bytes[i + 1..i + 4];
            if digits.iter().all(|d| (b'0'..=b'7').contains(d)) {
                let v = digits
                    .iter()
                    .fold(0u32, |acc, d| acc * 8 + u32::from(d - b'0'));
                if let Ok(v) = u8::try_from(v) {
                    out.push(v);
                    i += 4;
                    continue;
                }
            }
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
pub mod fake {
    //! A recording host for tests: it remembers directories and mounts in
    //! memory and lists every call made.

    use super::*;
    use std::collections::BTreeSet;
    use std::sync::Mutex;

    #[derive(Debug, Clone, PartialEq, Eq)]
    pub enum Call {
        CreateDir(PathBuf),
        RemoveDir(PathBuf),
        MountTmpfs(PathBuf, Option<u64>),
        Unmount(PathBuf),
    }

    #[derive(Default)]
    pub struct RecordingHost {
        calls: Mutex<Vec<Call>>,
        mounts: Mutex<Vec<PathBuf>>,
        dirs: Mutex<BTreeSet<PathBuf>>,
    }

    impl RecordingHost {
        pub fn calls(&self) -> Vec<Call> {
            self.calls.lock().unwrap_or_else(|e| e.into_inner()).clone()
        }
        fn record(&self, c: Call) {
            self.calls.lock().unwrap_or_else(|e| e.into_inner()).push(c);
        }
    }

    impl Host for RecordingHost {
        fn create_dir_all(&self, path: &Path) -> io::Result<()> {
            self.record(Call::CreateDir(path.to_path_buf()));
            self.dirs
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .insert(path.to_path_buf());
            Ok(())
        }
        fn remove_dir_all(&self, path: &Path) -> io::Result<()> {
            self.record(Call::RemoveDir(path.to_path_buf()));
            self.dirs
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .retain(|d| !d.starts_with(path));
            Ok(())
        }
        fn mount_tmpfs(&self, target: &Path, size_bytes: Option<u64>) -> io::Result<()> {
            self.record(Call::MountTmpfs(target.to_path_buf(), size_bytes));
            self.mounts
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push(target.to_path_buf());
            Ok(())
        }
        fn mounts_under(&self, dir: &Path) -> Vec<PathBuf> {
            self.mounts
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .iter()
                .filter(|m| m.starts_with(dir))
                .cloned()
                .collect()
        }
        fn unmount(&self, target: &Path) -> io::Result<()> {
            self.record(Call::Unmount(target.to_path_buf()));
            let mut mounts = self.mounts.lock().unwrap_or_else(|e| e.into_inner());
            match mounts.iter().rposition(|m| m == target) {
                Some(i) => {
                    mounts.remove(i);
                    Ok(())
                }
                None => Err(io::Error::from_raw_os_error(22)),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::fake::{Call, RecordingHost};
    use super::*;

    #[test]
    fn mount_points_under_a_directory_are_read_from_the_mount_table_with_escapes_undone() {
        let table = "\
proc /proc proc rw 0 0
tmpfs /data/pods/u1/volumes/cache tmpfs rw 0 0
tmpfs /data/pods/u10/volumes/x tmpfs rw 0 0
tmpfs /data/pods/u1/volumes/with\\040space tmpfs rw 0 0
";
        assert_eq!(
            mount_points_under(table, Path::new("/data/pods/u1")),
            [
                PathBuf::from("/data/pods/u1/volumes/cache"),
                PathBuf::from("/data/pods/u1/volumes/with space"),
            ]
        );
    }

    #[test]
    fn unmounting_a_directory_takes_the_newest_mounts_first_and_leaves_others() {
        let host = RecordingHost::default();
        host.mount_tmpfs(Path::new("/p/u1/v"), None).unwrap();
        host.mount_tmpfs(Path::new("/p/u1/v/inner"), Some(1024))
            .unwrap();
        host.mount_tmpfs(Path::new("/p/u2/v"), None).unwrap();
        host.unmount_all(Path::new("/p/u1"));
        let unmounts: Vec<Call> = host
            .calls()
            .into_iter()
            .filter(|c| matches!(c, Call::Unmount(_)))
            .collect();
        assert_eq!(
            unmounts,
            [
                Call::Unmount("/p/u1/v/inner".into()),
                Call::Unmount("/p/u1/v".into()),
            ]
        );
        assert_eq!(
            host.mounts_under(Path::new("/p")),
            [PathBuf::from("/p/u2/v")]
        );
    }
}
