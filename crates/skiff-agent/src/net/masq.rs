//! Masquerading of pod traffic that leaves the cluster CIDR, in skiff's own
//! nftables table (`ip skiff-net`): pod-to-pod traffic between nodes keeps
//! its source address (NetworkPolicy and the receiving pod see the real
//! peer), everything else from a pod leaves with the node's address. The
//! table is replaced whole in one transaction.

use super::plan::Cidr;

/// The table's name for an agent in the default data dir.
pub const TABLE: &str = "skiff-net";

/// The table of the agent keeping its data in `data_dir`: `skiff-net` for
/// the default, else `skiff-net-<hash>` (several clusters on one machine).
pub fn table_name(data_dir: &std::path::Path) -> String {
    if data_dir == std::path::Path::new("/var/lib/skiff/agent") {
        return TABLE.to_string();
    }
    let d = ring::digest::digest(&ring::digest::SHA256, data_dir.to_string_lossy().as_bytes());
    let hex: String = d.as_ref()[..4].iter().map(|b| format!("{b:02x}")).collect();
    format!("{TABLE}-{hex}")
}

/// The table as an nft script: created if absent, emptied and refilled in
/// the same transaction. Multicast is never masqueraded (as flannel).
pub fn script(table: &str, cluster: &Cidr) -> String {
    format!(
        "table ip {table}\n\
         delete table ip {table}\n\
         table ip {table} {{\n\
         \tchain postrouting {{\n\
         \t\ttype nat hook postrouting priority srcnat + 10; policy accept;\n\
         \t\tip saddr {cluster} ip daddr {cluster} return\n\
         \t\tip saddr {cluster} ip daddr != 224.0.0.0/4 masquerade fully-random\n\
         \t}}\n\
         }}\n"
    )
}

/// Applies [`script`] with `nft -f -` (one transaction: on failure the
/// previous table stays as it was).
pub async fn apply(table: &str, cluster: &Cidr) -> Result<(), String> {
    run(script(table, cluster)).await
}

/// Deletes the table (absent is fine).
pub async fn delete(table: &str) -> Result<(), String> {
    run(format!("table ip {table}\ndelete table ip {table}\n")).await
}

async fn run(script: String) -> Result<(), String> {
    tokio::task::spawn_blocking(move || {
        use std::io::Write;
        let mut child = std::process::Command::new(crate::proxy::nft::tool("nft"))
            .args(["-f", "-"])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .map_err(|e| format!("running nft: {e} (apt-get install nftables)"))?;
        if let Some(mut stdin) = child.stdin.take() {
            stdin
                .write_all(script.as_bytes())
                .map_err(|e| e.to_string())?;
        }
        let out = child.wait_with_output().map_err(|e| e.to_string())?;
        if out.status.success() {
            Ok(())
        } else {
            Err(String::from_utf8_lossy(&out.stderr).trim().to_string())
        }
    })
    .await
    .map_err(|e| e.to_string())?
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_traffic_leaving_the_cluster_cidr_is_masqueraded() {
        let s = script("skiff-net", &Cidr::parse("10.42.0.0/16").unwrap());
        assert!(s.contains("ip saddr 10.42.0.0/16 ip daddr 10.42.0.0/16 return"));
        assert!(s.contains("ip saddr 10.42.0.0/16 ip daddr != 224.0.0.0/4 masquerade"));
        // Replaced whole: created, deleted and refilled in one script.
        assert!(s.starts_with("table ip skiff-net\ndelete table ip skiff-net\n"));
    }

    #[test]
    fn tables_of_other_data_dirs_differ() {
        assert_eq!(
            table_name(std::path::Path::new("/var/lib/skiff/agent")),
            "skiff-net"
        );
        let a = table_name(std::path::Path::new("/tmp/a"));
        assert!(a.starts_with("skiff-net-") && a.len() <= 30);
        assert_ne!(a, table_name(std::path::Path::new("/tmp/b")));
    }
}
