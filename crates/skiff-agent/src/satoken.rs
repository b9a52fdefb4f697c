//! ServiceAccount tokens for projected volumes, as kubelet's token manager
//! keeps them: requested through TokenRequest, bound to the pod (a token
//! stops working when its pod is deleted), and requested again after 80%
//! of its life or 24 hours, whichever comes first. Also the atomic writer
//! kubelet uses for such volumes: files live in a timestamped directory
//! that the `..data` symlink points at, the visible names are symlinks
//! through `..data`, and an update swaps `..data` in one rename, so a
//! reader sees either the old set of files or the new one.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::time::{Duration, Instant};

use k8s_openapi::api::authentication::v1::{BoundObjectReference, TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::{Pod, ServiceAccount};
use kube::api::{Api, PostParams};

/// kubelet never keeps a token longer than this.
const MAX_AGE: Duration = Duration::from_secs(24 * 3600);

/// A token and when it should be replaced.
#[derive(Clone, Debug)]
struct Held {
    token: String,
    refresh_at: Instant,
}

/// The tokens of one pod's volumes, by (ServiceAccount, audience,
/// expirationSeconds).
#[derive(Default, Debug)]
pub struct TokenCache {
    held: HashMap<(String, String, i64), Held>,
}

/// When a token obtained now and valid for `ttl` is requested again:
/// after 80% of its life, at most 24 h.
pub fn refresh_after(ttl: Duration) -> Duration {
    (ttl * 4 / 5).min(MAX_AGE)
}

impl TokenCache {
    /// The token for the pod's ServiceAccount with this audience and
    /// lifetime: the held one while it is fresh, else a new TokenRequest
    /// bound to the pod.
    pub async fn get(
        &mut self,
        client: &kube::Client,
        pod: &Pod,
        audience: Option<&str>,
        expiration_seconds: i64,
    ) -> Result<String, String> {
        let ns = pod.metadata.namespace.clone().unwrap_or_default();
        let sa = pod
            .spec
            .as_ref()
            .and_then(|s| s.service_account_name.clone())
            .filter(|s| !s.is_empty())
            .unwrap_or_else(|| "default".into());
        let key = (
            sa.clone(),
            audience.unwrap_or("").to_string(),
            expiration_seconds,
        );
        if let Some(h) = self.held.get(&key) {
            if Instant::now() < h.refresh_at {
                return Ok(h.token.clone());
            }
        }
        let req = TokenRequest {
            spec: TokenRequestSpec {
                audiences: audience.map(|a| vec![a.to_string()]).unwrap_or_default(),
                expiration_seconds: Some(expiration_seconds),
                bound_object_ref: Some(BoundObjectReference {
                    api_version: Some("v1".into()),
                    kind: Some("Pod".into()),
                    name: pod.metadata.name.clone(),
                    uid: pod.metadata.uid.clone(),
                }),
            },
            ..Default::default()
        };
        let started = Instant::now();
        let api: Api<ServiceAccount> = Api::namespaced(client.clone(), &ns);
        let out = api
            .create_token_request(&sa, &PostParams::default(), &req)
            .await
            .map_err(|e| format!("failed to fetch token for serviceaccount {ns}/{sa}: {e}"))?;
        let status = out
            .status
            .ok_or_else(|| format!("the TokenRequest for {ns}/{sa} has no token"))?;
        // The server may shorten the lifetime; its spec says what it gave.
        let ttl = out
            .spec
            .expiration_seconds
            .unwrap_or(expiration_seconds)
            .max(0) as u64;
        self.held.insert(
            key,
            Held {
                token: status.token.clone(),
                refresh_at: started + refresh_after(Duration::from_secs(ttl)),
            },
        );
        Ok(status.token)
    }
}

/// The name of a new data directory: `..` and a UTC timestamp, as kubelet
/// names them.
fn data_dir_name() -> String {
    format!("..{}", chrono::Utc::now().format("%Y_%m_%d_%H_%M_%S%.9f"))
}

/// Writes `files` (relative path → bytes, mode) into `dir` atomically:
/// unchanged contents leave everything as is; otherwise a new timestamped
/// directory receives them, `..data` is switched to it with one rename,
/// the visible top-level names are symlinks through `..data`, and the
/// previous directory and names no longer projected are removed.
pub fn write_atomic(dir: &Path, files: &BTreeMap<String, (Vec<u8>, u32)>) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::create_dir_all(dir)?;
    let data = dir.join("..data");
    let old = std::fs::read_link(&data).ok();
    if let Some(old) = &old {
        if same_contents(&dir.join(old), files) {
            return Ok(());
        }
    }
    let name = data_dir_name();
    let new = dir.join(&name);
    std::fs::create_dir(&new)?;
    for (rel, (bytes, mode)) in files {
        let p = new.join(rel);
        if let Some(parent) = p.parent() {
            std::fs::create_dir_all(parent)?;
        }
        std::fs::write(&p, bytes)?;
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(*mode))?;
    }
    std::fs::set_permissions(&new, std::fs::Permissions::from_mode(0o755))?;
    // The visible names: the first component of each path.
    let top: std::collections::BTreeSet<&str> = files
        .keys()
        .filter_map(|k| k.split('/').find(|c| !c.is_empty()))
        .collect();
    // Switch `..data` in one rename.
    let tmp = dir.join("..data_tmp");
    let _ = std::fs::remove_file(&tmp);
    std::os::unix::fs::symlink(&name, &tmp)?;
    std::fs::rename(&tmp, &data)?;
    for t in &top {
        let link = dir.join(t);
        let want = Path::new("..data").join(t);
        match std::fs::symlink_metadata(&link) {
            Ok(m) if m.file_type().is_symlink() => {
                if std::fs::read_link(&link).ok().as_deref() == Some(want.as_path()) {
                    continue;
                }
                std::fs::remove_file(&link)?;
            }
            // Left by an older writer that wrote plain files.
            Ok(m) if m.is_dir() => std::fs::remove_dir_all(&link)?,
            Ok(_) => std::fs::remove_file(&link)?,
            Err(_) => {}
        }
        std::os::unix::fs::symlink(&want, &link)?;
    }
    // Names no longer projected, and the previous data directories.
    for entry in std::fs::read_dir(dir)?.flatten() {
        let fname = entry.file_name().to_string_lossy().to_string();
        if fname == "..data" || fname == name {
            continue;
        }
        let p = entry.path();
        let keep = !fname.starts_with("..") && top.contains(fname.as_str());
        if keep {
            continue;
        }
        match std::fs::symlink_metadata(&p) {
            Ok(m) if m.is_dir() => std::fs::remove_dir_all(&p)?,
            Ok(_) => std::fs::remove_file(&p)?,
            Err(_) => {}
        }
    }
    Ok(())
}

/// Whether `d` holds exactly `files` with their modes.
fn same_contents(d: &Path, files: &BTreeMap<String, (Vec<u8>, u32)>) -> bool {
    use std::os::unix::fs::PermissionsExt;
    let mut count = 0usize;
    let mut stack = vec![d.to_path_buf()];
    while let Some(x) = stack.pop() {
        let Ok(rd) = std::fs::read_dir(&x) else {
            return false;
        };
        for e in rd.flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
            } else {
                count += 1;
            }
        }
    }
    count == files.len()
        && files.iter().all(|(rel, (bytes, mode))| {
            let p = d.join(rel);
            std::fs::read(&p).ok().as_ref() == Some(bytes)
                && std::fs::metadata(&p)
                    .map(|m| m.permissions().mode() & 0o7777 == *mode)
                    .unwrap_or(false)
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn files(pairs: &[(&str, &str)]) -> BTreeMap<String, (Vec<u8>, u32)> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), (v.as_bytes().to_vec(), 0o644)))
            .collect()
    }

    #[test]
    fn refresh_comes_at_80_percent_of_life_and_within_a_day() {
        assert_eq!(
            refresh_after(Duration::from_secs(3607)),
            Duration::from_millis(2_885_600)
        );
        assert_eq!(refresh_after(Duration::from_secs(7 * 24 * 3600)), MAX_AGE);
    }

    #[test]
    fn files_are_symlinks_through_data_swapped_in_one_rename() {
        let d = tempfile::tempdir().unwrap();
        write_atomic(d.path(), &files(&[("token", "t1"), ("ca.crt", "ca")])).unwrap();
        let first = std::fs::read_link(d.path().join("..data")).unwrap();
        assert!(first.to_string_lossy().starts_with("..20"), "{first:?}");
        assert_eq!(
            std::fs::read_link(d.path().join("token")).unwrap(),
            Path::new("..data/token")
        );
        assert_eq!(
            std::fs::read_to_string(d.path().join("token")).unwrap(),
            "t1"
        );

        // Nothing changes: nothing is rewritten.
        write_atomic(d.path(), &files(&[("token", "t1"), ("ca.crt", "ca")])).unwrap();
        assert_eq!(std::fs::read_link(d.path().join("..data")).unwrap(), first);

        // A new token: a new data directory, the old one gone, a name no
        // longer projected gone.
        write_atomic(d.path(), &files(&[("token", "t2")])).unwrap();
        let second = std::fs::read_link(d.path().join("..data")).unwrap();
        assert_ne!(second, first);
        assert!(!d.path().join(&first).exists());
        assert!(std::fs::symlink_metadata(d.path().join("ca.crt")).is_err());
        assert_eq!(
            std::fs::read_to_string(d.path().join("token")).unwrap(),
            "t2"
        );
        let names: Vec<String> = std::fs::read_dir(d.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().to_string())
            .collect();
        assert_eq!(names.len(), 3, "{names:?}");
    }

    #[test]
    fn plain_files_of_an_older_writer_are_replaced_and_nested_paths_work() {
        let d = tempfile::tempdir().unwrap();
        std::fs::write(d.path().join("token"), "old").unwrap();
        std::fs::create_dir(d.path().join("sub")).unwrap();
        std::fs::write(d.path().join("sub/x"), "old").unwrap();
        write_atomic(d.path(), &files(&[("token", "new"), ("sub/x", "y")])).unwrap();
        assert_eq!(
            std::fs::read_to_string(d.path().join("token")).unwrap(),
            "new"
        );
        assert_eq!(
            std::fs::read_to_string(d.path().join("sub/x")).unwrap(),
            "y"
        );
        assert!(std::fs::symlink_metadata(d.path().join("sub"))
            .unwrap()
            .file_type()
            .is_symlink());
    }
}
