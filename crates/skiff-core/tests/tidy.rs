//! Tidy checks in the style of rust-analyzer's: what one kind means lives
//! in its module under `skiff-core/src/kinds/` (pure rules) or
//! `skiff-apiserver/src/strategy/` (server-side hooks). Anywhere else in
//! the API machinery, dispatching on a resource's kind name is a bug: ask
//! `res.rules` or `strategy_for(res)` instead. In the API server, the same
//! holds for storage paths, with the admission plugins as their other home.

use std::path::{Path, PathBuf};

/// Ways of dispatching on a resource's kind.
const FORBIDDEN: &[&str] = &[
    "res.kind ==",
    "res.kind !=",
    "match res.kind",
    "matches!(res.kind",
    "(res.group, res.kind)",
    "match (group, kind)",
];

/// Directories that are a kind's home (or, for `authz/`, the RBAC
/// authorizer: Roles and their bindings are what it is about).
const HOMES: &[&str] = &["/kinds/", "/strategy/", "/authz/"];

/// Files allowed a kind match, and why.
const ALLOWED: &[(&str, &str)] = &[
    (
        "skiff-core/src/convert.rs",
        "conversion between served versions of one kind (events, autoscaling/v1)",
    ),
    (
        "skiff-core/src/discovery.rs",
        "the options kind of the proxy subresource (PodProxyOptions, ...)",
    ),
];

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("read source dir") {
        let path = entry.expect("dir entry").path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The lines of `files` (outside comments) containing one of `patterns`,
/// as `path:line: `pattern`: text`, skipping the files `home` accepts by
/// their path under `crates`.
fn offences(
    files: &[PathBuf],
    crates: &Path,
    patterns: &[&str],
    home: impl Fn(&str) -> bool,
) -> Vec<String> {
    let mut out = Vec::new();
    for path in files {
        let shown = path
            .strip_prefix(crates)
            .unwrap_or(path)
            .to_string_lossy()
            .replace('\\', "/");
        if home(&shown) {
            continue;
        }
        let text = std::fs::read_to_string(path).expect("read source");
        for (i, line) in text.lines().enumerate() {
            if line.trim_start().starts_with("//") {
                continue;
            }
            if let Some(p) = patterns.iter().find(|p| line.contains(*p)) {
                out.push(format!("{shown}:{}: `{p}`: {}", i + 1, line.trim()));
            }
        }
    }
    out
}

#[test]
fn no_kind_name_dispatch_outside_the_kinds_and_strategy_modules() {
    let crates = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("crates dir");
    let mut files = Vec::new();
    for krate in ["skiff-core", "skiff-apiserver"] {
        rust_files(&crates.join(krate).join("src"), &mut files);
    }
    assert!(files.len() > 20, "found only {} files", files.len());
    let offences = offences(&files, crates, FORBIDDEN, |shown| {
        HOMES.iter().any(|h| format!("/{shown}").contains(h))
            || ALLOWED.iter().any(|(f, _)| shown == *f)
    });
    assert!(
        offences.is_empty(),
        "kind-name dispatch outside kinds/ and strategy/ (use res.rules or strategy_for):\n{}",
        offences.join("\n")
    );
}

#[test]
fn the_tidy_check_catches_what_it_is_for() {
    let line = "        if res.kind == \"Service\" {";
    assert!(FORBIDDEN.iter().any(|p| line.contains(p)));
    let line = "    match (res.group, res.kind) {";
    assert!(FORBIDDEN.iter().any(|p| line.contains(p)));
}

/// Ways of dispatching on a resource's storage path.
const STORAGE_DISPATCH: &[&str] = &[".storage == \"", ".storage != \"", "match res.storage"];

/// Where the API server may dispatch on a storage path: the strategies
/// (`strategy_for` is the one map from resources to strategies) and the
/// admission plugins, whose `handles` names what each plugin is about.
const STORAGE_HOMES: &[&str] = &[
    "skiff-apiserver/src/strategy/",
    "skiff-apiserver/src/admission/",
    "skiff-apiserver/src/webhook/",
    "skiff-apiserver/src/noderestriction.rs",
    "skiff-apiserver/src/podtoken.rs",
    "skiff-apiserver/src/defaultclass.rs",
    "skiff-apiserver/src/storageprotection.rs",
];

#[test]
fn no_storage_path_dispatch_outside_the_strategies_and_admission_plugins() {
    let crates = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("crates dir");
    let mut files = Vec::new();
    rust_files(&crates.join("skiff-apiserver").join("src"), &mut files);
    assert!(files.len() > 20, "found only {} files", files.len());
    let offences = offences(&files, crates, STORAGE_DISPATCH, |shown| {
        STORAGE_HOMES.iter().any(|h| shown.starts_with(h))
    });
    assert!(
        offences.is_empty(),
        "storage-path dispatch outside strategy/ and the admission plugins (use strategy_for, or an admission plugin's handles):\n{}",
        offences.join("\n")
    );
}

#[test]
fn the_storage_rule_catches_what_it_is_for() {
    for line in [
        "    if api_res.storage == \"authentication.k8s.io/tokenreviews\" {",
        "    if res.storage != \"/pods\" {",
        "    match res.storage {",
    ] {
        assert!(STORAGE_DISPATCH.iter().any(|p| line.contains(p)), "{line}");
    }
    // Comparing two resources' storage is no dispatch.
    let line = "        .filter(move |r| r.storage == res.storage && *r != res),";
    assert!(!STORAGE_DISPATCH.iter().any(|p| line.contains(p)));
}

/// Kubernetes' shared semantics and where their one definition lives.
const DEFINED_ONCE: &[(&str, &str)] = &[
    ("fn tolerates(", "skiff_helpers::scheduling"),
    ("struct NodeTerm", "skiff_helpers::scheduling"),
    ("struct RequiredNodeAffinity", "skiff_helpers::scheduling"),
    ("fn parse_quantity(", "skiff_helpers::quantity"),
    ("fn parse_milli(", "skiff_helpers::quantity"),
    ("fn qos_class(", "skiff_helpers::qos"),
    ("fn template_hash(", "skiff_helpers::workloads"),
    ("fn pod_from_template(", "skiff_helpers::workloads"),
    ("fn controller_ref(", "skiff_helpers::workloads"),
    ("fn is_dns1123_label(", "skiff_helpers::names"),
    ("fn is_dns1035_label(", "skiff_helpers::names"),
    ("fn port_name_errors(", "skiff_helpers::names"),
];

#[test]
fn shared_semantics_are_defined_once_in_skiff_helpers() {
    let crates = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("crates dir");
    let mut files = Vec::new();
    for entry in std::fs::read_dir(crates).expect("crates dir") {
        let dir = entry.expect("entry").path();
        if dir.file_name().is_some_and(|n| n != "skiff-helpers") && dir.join("src").is_dir() {
            rust_files(&dir.join("src"), &mut files);
        }
    }
    assert!(files.len() > 100, "found only {} files", files.len());
    let mut offences = Vec::new();
    for path in &files {
        let text = std::fs::read_to_string(path).expect("read source");
        for (pattern, home) in DEFINED_ONCE {
            if text.contains(pattern) {
                offences.push(format!(
                    "{}: `{pattern}` is defined in {home}",
                    path.strip_prefix(crates).unwrap_or(path).display()
                ));
            }
        }
    }
    assert!(offences.is_empty(), "duplicates:\n{}", offences.join("\n"));
}

#[test]
fn no_controller_imports_another() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("crates dir")
        .join("skiff-controllers/src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    // A controller is a module that registers one.
    let controllers: Vec<(PathBuf, String)> = files
        .iter()
        .filter(|p| {
            std::fs::read_to_string(p)
                .expect("read source")
                .contains("pub fn register(")
        })
        .map(|p| {
            let name = p.file_stem().unwrap().to_string_lossy().to_string();
            (p.clone(), name)
        })
        .collect();
    assert!(
        controllers.len() > 10,
        "found only {} controllers",
        controllers.len()
    );
    let mut offences = Vec::new();
    for (path, name) in &controllers {
        let text = std::fs::read_to_string(path).expect("read source");
        for (_, other) in controllers.iter().filter(|(_, o)| o != name) {
            for needle in [format!("crate::{other}::"), format!("crate::{other}::{{")] {
                if text.contains(&needle) {
                    offences.push(format!("{name}.rs uses {needle}"));
                }
            }
        }
    }
    offences.dedup();
    assert!(
        offences.is_empty(),
        "what controllers share belongs in common.rs or skiff_helpers:\n{}",
        offences.join("\n")
    );
}

/// Dependencies declared for a reason other than a path in the code (a
/// feature of a transitive dependency switched on, a linked C library),
/// as `(crate, dependency, why)`.
const USED_WITHOUT_A_PATH: &[(&str, &str, &str)] = &[];

/// Every `[dependencies]`-like entry of a crate's manifest, by the name
/// the code uses (`-` read as `_`), with its section.
fn declared_dependencies(manifest: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut section = String::new();
    for line in manifest.lines() {
        let line = line.trim();
        if line.starts_with('[') {
            section = line.trim_matches(|c| c == '[' || c == ']').to_string();
            continue;
        }
        if !section.ends_with("dependencies") || line.starts_with('#') {
            continue;
        }
        let Some(key) = line.split(['=', '.']).next().map(str::trim) else {
            continue;
        };
        if !key.is_empty() {
            out.push((key.replace('-', "_"), section.clone()));
        }
    }
    out
}

/// Whether `name` appears in `text` as a path (`name::`), an import
/// (`use name`), a macro (`name!`) or an `extern crate`.
fn uses(text: &str, name: &str) -> bool {
    let bytes = text.as_bytes();
    let mut from = 0;
    while let Some(i) = text[from..].find(name) {
        let at = from + i;
        from = at + name.len();
        let before = at.checked_sub(1).map(|j| bytes[j]);
        if before.is_some_and(|b| b.is_ascii_alphanumeric() || b == b'_') {
            continue;
        }
        let rest = &text[from..];
        if rest.starts_with("::") || rest.starts_with('!') {
            return true;
        }
        let head = &text[..at];
        if (head.ends_with("use ") || head.ends_with("extern crate "))
            && rest.starts_with([';', ' ', '\n', ','])
        {
            return true;
        }
    }
    false
}

#[test]
fn every_declared_dependency_is_used() {
    let crates = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("crates dir");
    let mut unused = Vec::new();
    let mut checked = 0;
    for entry in std::fs::read_dir(crates).expect("read crates dir") {
        let dir = entry.expect("dir entry").path();
        let Ok(manifest) = std::fs::read_to_string(dir.join("Cargo.toml")) else {
            continue;
        };
        let krate = dir.file_name().unwrap().to_string_lossy().to_string();
        let code = |subdirs: &[&str]| {
            let mut files = Vec::new();
            for sub in subdirs {
                let p = dir.join(sub);
                if p.is_dir() {
                    rust_files(&p, &mut files);
                } else if p.is_file() {
                    files.push(p);
                }
            }
            files
                .iter()
                .map(|f| std::fs::read_to_string(f).expect("read source"))
                .collect::<Vec<_>>()
                .join("\n")
        };
        let main_code = code(&["src"]);
        let test_code = code(&["src", "tests", "benches", "examples"]);
        let build_code = code(&["build.rs"]);
        for (name, section) in declared_dependencies(&manifest) {
            checked += 1;
            let text = if section.ends_with("build-dependencies") {
                &build_code
            } else if section.ends_with("dev-dependencies") {
                &test_code
            } else {
                &main_code
            };
            let excused = USED_WITHOUT_A_PATH
                .iter()
                .any(|(c, d, _)| *c == krate && *d == name);
            if !excused && !uses(text, &name) {
                unused.push(format!("{krate}: [{section}] {name}"));
            }
        }
    }
    assert!(checked > 50, "found only {checked} dependencies");
    assert!(
        unused.is_empty(),
        "dependencies no code of their crate uses (remove them, or list them \
         in USED_WITHOUT_A_PATH with the reason):\n{}",
        unused.join("\n")
    );
}

#[test]
fn the_dependency_rule_catches_what_it_is_for() {
    let manifest = "[package]\nname = \"x\"\n[dependencies]\nserde.workspace = true\n\
                    tokio-util = \"1\"\n# a comment\n[dev-dependencies]\ntempfile = \"3\"\n";
    assert_eq!(
        declared_dependencies(manifest),
        vec![
            ("serde".to_string(), "dependencies".to_string()),
            ("tokio_util".to_string(), "dependencies".to_string()),
            ("tempfile".to_string(), "dev-dependencies".to_string()),
        ]
    );
    assert!(uses("use serde::Deserialize;", "serde"));
    assert!(uses("let x = tokio_util::io::X;", "tokio_util"));
    assert!(uses("json!({})\n serde_json::json!(1)", "serde_json"));
    assert!(uses("use anyhow;\n", "anyhow"));
    assert!(!uses("let serde_jsonish = 1; my_serde::x()", "serde"));
    assert!(!uses("// tokio is great", "tokio"));
}
