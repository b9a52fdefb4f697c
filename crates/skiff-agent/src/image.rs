//! Images without a registry: skiff's own pause image, test images from a
//! static busybox, docker-archive tarballs, and importing archives into a
//! containerd.
//!
//! The pause program is ours: a 69-byte x86-64 routine wrapped in a minimal
//! static ELF. It installs handlers for SIGTERM and SIGINT (as PID 1 of its
//! namespace it would otherwise ignore them), then sleeps in `pause(2)`
//! forever; a handled signal ends it with status 0.

use std::path::Path;
use std::process::Command;

use anyhow::{bail, Context, Result};
use serde_json::json;

/// The image reference of skiff's pause (sandbox) image.
pub const PAUSE_IMAGE: &str = "skiff.local/pause:1";
/// The image reference of the busybox test image.
pub const BUSYBOX_IMAGE: &str = "skiff.local/busybox:1";

/// Machine code of the pause routine (x86-64, position independent):
/// builds a `struct sigaction` on the stack (handler, SA_RESTORER, restorer,
/// empty mask), calls rt_sigaction for SIGTERM and SIGINT, loops on pause(),
/// and the handler calls exit_group(0).
const PAUSE_CODE: [u8; 69] = [
    0x48, 0x8d, 0x05, 0x35, 0x00, 0x00, 0x00, // lea rax, [rip+handler]
    0x6a, 0x00, // push 0 (mask)
    0x50, // push rax (restorer)
    0x68, 0x00, 0x00, 0x00, 0x04, // push SA_RESTORER
    0x50, // push rax (handler)
    0x48, 0x89, 0xe6, // mov rsi, rsp
    0xbf, 0x0f, 0x00, 0x00, 0x00, // mov edi, SIGTERM
    0x31, 0xd2, // xor edx, edx
    0x41, 0xba, 0x08, 0x00, 0x00, 0x00, // mov r10d, 8
    0xb8, 0x0d, 0x00, 0x00, 0x00, // mov eax, rt_sigaction
    0x0f, 0x05, // syscall
    0xbf, 0x02, 0x00, 0x00, 0x00, // mov edi, SIGINT
    0xb8, 0x0d, 0x00, 0x00, 0x00, // mov eax, rt_sigaction
    0x0f, 0x05, // syscall
    0xb8, 0x22, 0x00, 0x00, 0x00, // loop: mov eax, pause
    0x0f, 0x05, // syscall
    0xeb, 0xf7, // jmp loop
    0x31, 0xff, // handler: xor edi, edi
    0xb8, 0xe7, 0x00, 0x00, 0x00, // mov eax, exit_group
    0x0f, 0x05, // syscall
];

/// The pause program as a static ELF64 executable: one read+execute
/// PT_LOAD segment holding the headers and the code.
pub fn pause_elf() -> Vec<u8> {
    const BASE: u64 = 0x400000;
    const EHDR: u64 = 64;
    const PHDR: u64 = 56;
    let entry = BASE + EHDR + PHDR;
    let total = EHDR + PHDR + PAUSE_CODE.len() as u64;
    let mut b = Vec::with_capacity(total as usize);
    // ELF header.
    b.extend_from_slice(&[0x7f, b'E', b'L', b'F', 2, 1, 1, 0]);
    b.extend_from_slice(&[0; 8]);
    b.extend_from_slice(&2u16.to_le_bytes()); // ET_EXEC
    b.extend_from_slice(&0x3eu16.to_le_bytes()); // EM_X86_64
    b.extend_from_slice(&1u32.to_le_bytes()); // EV_CURRENT
    b.extend_from_slice(&entry.to_le_bytes());
    b.extend_from_slice(&EHDR.to_le_bytes()); // e_phoff
    b.extend_from_slice(&0u64.to_le_bytes()); // e_shoff
    b.extend_from_slice(&0u32.to_le_bytes()); // e_flags
    b.extend_from_slice(&(EHDR as u16).to_le_bytes());
    b.extend_from_slice(&(PHDR as u16).to_le_bytes());
    b.extend_from_slice(&1u16.to_le_bytes()); // e_phnum
    b.extend_from_slice(&64u16.to_le_bytes()); // e_shentsize
    b.extend_from_slice(&0u16.to_le_bytes()); // e_shnum
    b.extend_from_slice(&0u16.to_le_bytes()); // e_shstrndx
                                              // Program header: PT_LOAD, R+X, the whole file at BASE.
    b.extend_from_slice(&1u32.to_le_bytes());
    b.extend_from_slice(&5u32.to_le_bytes());
    b.extend_from_slice(&0u64.to_le_bytes()); // p_offset
    b.extend_from_slice(&BASE.to_le_bytes()); // p_vaddr
    b.extend_from_slice(&BASE.to_le_bytes()); // p_paddr
    b.extend_from_slice(&total.to_le_bytes()); // p_filesz
    b.extend_from_slice(&total.to_le_bytes()); // p_memsz
    b.extend_from_slice(&0x1000u64.to_le_bytes()); // p_align
    b.extend_from_slice(&PAUSE_CODE);
    b
}

/// One file of an image layer.
pub enum Entry {
    File {
        path: String,
        data: Vec<u8>,
        mode: u32,
    },
    Dir {
        path: String,
    },
    Symlink {
        path: String,
        target: String,
    },
}

fn layer_tar(entries: &[Entry]) -> Result<Vec<u8>> {
    let mut t = tar::Builder::new(Vec::new());
    for e in entries {
        let mut h = tar::Header::new_gnu();
        h.set_mtime(0);
        h.set_uid(0);
        h.set_gid(0);
        match e {
            Entry::File { path, data, mode } => {
                h.set_entry_type(tar::EntryType::Regular);
                h.set_mode(*mode);
                h.set_size(data.len() as u64);
                t.append_data(&mut h, path, data.as_slice())?;
            }
            Entry::Dir { path } => {
                h.set_entry_type(tar::EntryType::Directory);
                h.set_mode(0o755);
                h.set_size(0);
                t.append_data(&mut h, path, std::io::empty())?;
            }
            Entry::Symlink { path, target } => {
                h.set_entry_type(tar::EntryType::Symlink);
                h.set_mode(0o777);
                h.set_size(0);
                t.append_link(&mut h, path, target)?;
            }
        }
    }
    Ok(t.into_inner()?)
}

fn sha256_hex(data: &[u8]) -> String {
    let digest = ring::digest::digest(&ring::digest::SHA256, data);
    digest.as_ref().iter().map(|b| format!("{b:02x}")).collect()
}

/// A docker-archive (`docker save` format: manifest.json, a config and one
/// layer) holding `entries`, tagged `tag`.
pub fn docker_archive(tag: &str, entries: &[Entry], config: serde_json::Value) -> Result<Vec<u8>> {
    let layer = layer_tar(entries)?;
    let layer_digest = sha256_hex(&layer);
    let image_config = json!({
        "architecture": "amd64",
        "os": "linux",
        "config": config,
        "rootfs": {"type": "layers", "diff_ids": [format!("sha256:{layer_digest}")]},
        "history": [{"created_by": "skiff"}],
    });
    let config_bytes = serde_json::to_vec(&image_config)?;
    let config_digest = sha256_hex(&config_bytes);
    let manifest = json!([{
        "Config": format!("{config_digest}.json"),
        "RepoTags": [tag],
        "Layers": [format!("{layer_digest}/layer.tar")],
    }]);
    let files: Vec<(String, Vec<u8>)> = vec![
        (format!("{config_digest}.json"), config_bytes),
        (format!("{layer_digest}/layer.tar"), layer),
        ("manifest.json".into(), serde_json::to_vec(&manifest)?),
    ];
    let mut t = tar::Builder::new(Vec::new());
    let mut dir = tar::Header::new_gnu();
    dir.set_entry_type(tar::EntryType::Directory);
    dir.set_mode(0o755);
    dir.set_size(0);
    dir.set_mtime(0);
    t.append_data(&mut dir, format!("{layer_digest}/"), std::io::empty())?;
    for (name, data) in files {
        let mut h = tar::Header::new_gnu();
        h.set_mode(0o644);
        h.set_size(data.len() as u64);
        h.set_mtime(0);
        t.append_data(&mut h, name, data.as_slice())?;
    }
    Ok(t.into_inner()?)
}

/// skiff's pause image as a docker-archive.
pub fn pause_archive() -> Result<Vec<u8>> {
    docker_archive(
        PAUSE_IMAGE,
        &[Entry::File {
            path: "pause".into(),
            data: pause_elf(),
            mode: 0o755,
        }],
        json!({"Entrypoint": ["/pause"]}),
    )
}

/// A busybox image from a static busybox binary (Debian's busybox-static):
/// `/bin/busybox` plus a link per applet, and /tmp, /etc, /var/www.
pub fn busybox_archive(busybox: &Path, tag: &str) -> Result<Vec<u8>> {
    let data = std::fs::read(busybox).with_context(|| format!("reading {}", busybox.display()))?;
    let out = Command::new(busybox)
        .arg("--list")
        .output()
        .with_context(|| format!("running {} --list", busybox.display()))?;
    if !out.status.success() {
        bail!("{} --list failed", busybox.display());
    }
    let mut entries = vec![
        Entry::Dir { path: "bin".into() },
        Entry::Dir { path: "tmp".into() },
        Entry::Dir { path: "etc".into() },
        Entry::Dir { path: "var".into() },
        Entry::Dir {
            path: "var/www".into(),
        },
        Entry::File {
            path: "etc/passwd".into(),
            data: b"root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/:/bin/false\n"
                .to_vec(),
            mode: 0o644,
        },
        Entry::File {
            path: "etc/group".into(),
            data: b"root:x:0:\nnogroup:x:65534:\n".to_vec(),
            mode: 0o644,
        },
        Entry::File {
            path: "bin/busybox".into(),
            data,
            mode: 0o755,
        },
    ];
    for applet in String::from_utf8_lossy(&out.stdout).split_whitespace() {
        if applet == "busybox" || applet.contains('/') {
            continue;
        }
        entries.push(Entry::Symlink {
            path: format!("bin/{applet}"),
            target: "busybox".into(),
        });
    }
    docker_archive(
        tag,
        &entries,
        json!({"Cmd": ["sh"], "Env": ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"]}),
    )
}

/// Imports a docker-archive or OCI archive into the `k8s.io` namespace of
/// the containerd at `socket`, with containerd's own `ctr` client.
pub fn import(socket: &Path, archive: &Path) -> Result<()> {
    let out = Command::new("ctr")
        .arg("--address")
        .arg(socket)
        .args(["-n", "k8s.io", "images", "import", "--no-unpack"])
        .arg(archive)
        .output()
        .context("running ctr (from the containerd package)")?;
    if !out.status.success() {
        bail!(
            "importing {}: {}",
            archive.display(),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}

/// Writes `data` to a temporary file and imports it.
pub fn import_bytes(socket: &Path, scratch: &Path, name: &str, data: &[u8]) -> Result<()> {
    std::fs::create_dir_all(scratch)?;
    let path = scratch.join(name);
    std::fs::write(&path, data)?;
    let r = import(socket, &path);
    let _ = std::fs::remove_file(&path);
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sha256_matches_the_standard_test_vectors() {
        assert_eq!(
            sha256_hex(b""),
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
        );
        assert_eq!(
            sha256_hex(b"abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
        let long = vec![b'a'; 1000];
        assert_eq!(
            sha256_hex(&long),
            "41edece42d63e8d9bf515a9ba6932e1c20cbc9f5a5d134645adb5db1b9737ea3"
        );
    }

    #[test]
    fn the_pause_program_sleeps_until_sigterm_and_then_exits_cleanly() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("pause");
        std::fs::write(&path, pause_elf()).unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
        let mut child = Command::new(&path).spawn().unwrap();
        std::thread::sleep(std::time::Duration::from_millis(200));
        assert!(
            child.try_wait().unwrap().is_none(),
            "pause exited on its own"
        );
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(child.id() as i32),
            nix::sys::signal::Signal::SIGTERM,
        )
        .unwrap();
        let status = child.wait().unwrap();
        assert_eq!(status.code(), Some(0));
    }

    #[test]
    fn a_docker_archive_names_its_layer_by_digest_in_the_manifest() {
        let a = pause_archive().unwrap();
        let mut ar = tar::Archive::new(a.as_slice());
        let mut manifest = None;
        let mut names = vec![];
        for e in ar.entries().unwrap() {
            let mut e = e.unwrap();
            let name = e.path().unwrap().to_string_lossy().to_string();
            if name == "manifest.json" {
                let mut s = String::new();
                std::io::Read::read_to_string(&mut e, &mut s).unwrap();
                manifest = Some(serde_json::from_str::<serde_json::Value>(&s).unwrap());
            }
            names.push(name);
        }
        let m = manifest.unwrap();
        assert_eq!(m[0]["RepoTags"][0], PAUSE_IMAGE);
        let layer = m[0]["Layers"][0].as_str().unwrap();
        assert!(names.iter().any(|n| n == layer), "{names:?}");
    }
}
