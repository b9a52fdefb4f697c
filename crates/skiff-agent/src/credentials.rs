//! Registry credentials for image pulls, as kubelet's credential keyring
//! has them: a pod's `imagePullSecrets` (`kubernetes.io/dockerconfigjson`
//! with `.dockerconfigjson`, or the legacy `kubernetes.io/dockercfg` with
//! `.dockercfg`) become a keyring of registry locations; an image is looked
//! up by its normalized repository (`docker.io/library/busybox`), and every
//! credential whose location matches is tried in turn.
//!
//! Matching (kubelet's `BasicDockerKeyring`): a location is a host (glob
//! patterns allowed per dot-separated part: `*.example.com`), an optional
//! port that must be equal, and an optional path that must be a prefix of
//! the image's path; a scheme and a `/v1/` or `/v2/` path are ignored.
//! Locations are tried in reverse lexical order, so the most specific
//! (`quay.io/team`) comes before the host (`quay.io`). When nothing
//! matches, an image of Docker Hub (`busybox`, `user/app`, `docker.io/…`,
//! `index.docker.io/…`) uses the credentials of `index.docker.io` (what
//! `docker login` writes as `https://index.docker.io/v1/`).

use std::collections::BTreeMap;

use base64::Engine;
use serde_json::Value;

use crate::runtime::cri;

/// One credential of a registry location.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Credential {
    pub username: String,
    pub password: String,
    pub email: String,
    pub identity_token: String,
    pub registry_token: String,
}

impl Credential {
    /// The CRI form the runtime takes in `PullImageRequest.auth`.
    pub fn to_cri(&self) -> cri::AuthConfig {
        cri::AuthConfig {
            username: self.username.clone(),
            password: self.password.clone(),
            identity_token: self.identity_token.clone(),
            registry_token: self.registry_token.clone(),
            ..Default::default()
        }
    }
}

/// Secret types and keys (core/v1).
pub const TYPE_DOCKER_CONFIG_JSON: &str = "kubernetes.io/dockerconfigjson";
pub const KEY_DOCKER_CONFIG_JSON: &str = ".dockerconfigjson";
pub const TYPE_DOCKERCFG: &str = "kubernetes.io/dockercfg";
pub const KEY_DOCKERCFG: &str = ".dockercfg";

/// A field of a docker config entry, matched without regard to case (as
/// Go's encoding/json does).
fn field<'a>(entry: &'a serde_json::Map<String, Value>, name: &str) -> Option<&'a Value> {
    entry.get(name).or_else(|| {
        entry
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v)
    })
}

fn string_field(
    entry: &serde_json::Map<String, Value>,
    name: &str,
    loc: &str,
) -> Result<String, String> {
    match field(entry, name) {
        None | Some(Value::Null) => Ok(String::new()),
        Some(Value::String(s)) => Ok(s.clone()),
        Some(_) => Err(format!("entry {loc:?}: field {name:?} must be a string")),
    }
}

/// One entry of a docker config: `auth` (base64 of `user:password`) wins
/// over `username`/`password`.
fn parse_entry(loc: &str, v: &Value) -> Result<Credential, String> {
    let empty = serde_json::Map::new();
    let entry = match v {
        Value::Object(m) => m,
        Value::Null => &empty,
        _ => return Err(format!("entry {loc:?} must be an object")),
    };
    let mut c = Credential {
        username: string_field(entry, "username", loc)?,
        password: string_field(entry, "password", loc)?,
        email: string_field(entry, "email", loc)?,
        identity_token: string_field(entry, "identitytoken", loc)?,
        registry_token: string_field(entry, "registrytoken", loc)?,
    };
    let auth = string_field(entry, "auth", loc)?;
    if !auth.is_empty() {
        let decoded = base64::engine::general_purpose::STANDARD
            .decode(auth.as_bytes())
            .map_err(|e| format!("entry {loc:?}: auth is not base64: {e}"))?;
        let decoded = String::from_utf8_lossy(&decoded);
        let Some((user, pass)) = decoded.split_once(':') else {
            return Err(format!(
                "entry {loc:?}: unable to parse auth field, must be formatted as base64(username:password)"
            ));
        };
        c.username = user.to_string();
        c.password = pass.trim_end_matches('\n').to_string();
    }
    Ok(c)
}

/// A docker config: location → entry (the `auths` of `.dockerconfigjson`,
/// or the whole of `.dockercfg`), in the document's order.
pub type DockerConfig = Vec<(String, Credential)>;

fn parse_entries(v: &Value) -> Result<DockerConfig, String> {
    let m = match v {
        Value::Object(m) => m,
        Value::Null => return Ok(vec![]),
        _ => return Err("the docker config must be a JSON object".into()),
    };
    m.iter()
        .map(|(loc, e)| Ok((loc.clone(), parse_entry(loc, e)?)))
        .collect()
}

/// Parses `.dockerconfigjson` (`{"auths": {...}}`).
pub fn parse_dockerconfigjson(data: &[u8]) -> Result<DockerConfig, String> {
    let v: Value = serde_json::from_slice(data).map_err(|e| format!("{e}"))?;
    let auths = match &v {
        Value::Object(m) => m
            .get("auths")
            .or_else(|| {
                m.iter()
                    .find(|(k, _)| k.eq_ignore_ascii_case("auths"))
                    .map(|(_, v)| v)
            })
            .cloned()
            .unwrap_or(Value::Null),
        _ => return Err("the docker config must be a JSON object".into()),
    };
    parse_entries(&auths)
}

/// Parses the legacy `.dockercfg` (the entries themselves).
pub fn parse_dockercfg(data: &[u8]) -> Result<DockerConfig, String> {
    let v: Value = serde_json::from_slice(data).map_err(|e| format!("{e}"))?;
    parse_entries(&v)
}

/// The docker config of a pull secret, if it is one: the secret's type
/// must match its key, and the key must be non-empty (kubelet ignores
/// other secrets).
pub fn config_of_secret(
    type_: &str,
    data: &BTreeMap<String, Vec<u8>>,
) -> Result<Option<DockerConfig>, String> {
    match (
        type_,
        data.get(KEY_DOCKER_CONFIG_JSON),
        data.get(KEY_DOCKERCFG),
    ) {
        (TYPE_DOCKER_CONFIG_JSON, Some(b), _) if !b.is_empty() => {
            parse_dockerconfigjson(b).map(Some)
        }
        (TYPE_DOCKERCFG, _, Some(b)) if !b.is_empty() => parse_dockercfg(b).map(Some),
        _ => Ok(None),
    }
}

/// Splits `[scheme://]host[:port][/path]` into host+port and path (with
/// its leading slash, or empty), dropping user info, query and fragment.
fn split_location(loc: &str) -> (String, String) {
    let rest = loc
        .strip_prefix("https://")
        .or_else(|| loc.strip_prefix("http://"))
        .unwrap_or(loc);
    let rest = rest.split(['?', '#']).next().unwrap_or("");
    let (host, path) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, ""),
    };
    let host = host.rsplit_once('@').map(|(_, h)| h).unwrap_or(host);
    (host.to_string(), path.to_string())
}

/// The key a location is indexed by: host[:port] plus a path other than
/// `/`, with a leading `/v1` or `/v2` (docker's API versions) ignored.
fn location_key(loc: &str) -> String {
    let (host, path) = split_location(loc);
    let path = if path.starts_with("/v2/") || path.starts_with("/v1/") {
        &path[3..]
    } else {
        path.as_str()
    };
    if path.is_empty() || path == "/" {
        host
    } else {
        format!("{host}{path}")
    }
}

/// Go's net.SplitHostPort, loosely: (host, port) or (whole, "").
fn split_host_port(hostport: &str) -> (&str, &str) {
    if let Some(rest) = hostport.strip_prefix('[') {
        if let Some((h, p)) = rest.split_once("]:") {
            return (h, p);
        }
        return (hostport, "");
    }
    match hostport.split_once(':') {
        Some((h, p)) if !p.contains(':') => (h, p),
        _ => (hostport, ""),
    }
}

/// Shell-style matching of one host part (Go's path/filepath.Match: `*`,
/// `?`, `[a-z]`, `[^…]`, `\` escapes). A malformed pattern matches nothing.
pub fn glob_match(pattern: &str, name: &str) -> bool {
    fn class(p: &[char], c: char) -> Option<(bool, usize)> {
        // p starts after '['; returns (matched, chars consumed incl. ']').
        let mut i = 0;
        let negate = matches!(p.first(), Some('^'));
        if negate {
            i += 1;
        }
        let mut matched = false;
        let mut first = true;
        // One character of a class: `\` escapes; an unescaped `-` or `]`
        // where a character is due is malformed (Go's getEsc).
        let esc = |i: &mut usize| -> Option<char> {
            let ch = *p.get(*i)?;
            if ch == '-' || ch == ']' {
                return None;
            }
            *i += 1;
            if ch == '\\' {
                let e = *p.get(*i)?;
                *i += 1;
                return Some(e);
            }
            Some(ch)
        };
        loop {
            if p.get(i) == Some(&']') && !first {
                i += 1;
                break;
            }
            first = false;
            let lo = esc(&mut i)?;
            let mut hi = lo;
            if p.get(i) == Some(&'-') {
                i += 1;
                hi = esc(&mut i)?;
                if hi < lo {
                    return None;
                }
            }
            if lo <= c && c <= hi {
                matched = true;
            }
        }
        Some((matched != negate, i))
    }
    fn go(p: &[char], n: &[char]) -> Option<bool> {
        match p.first() {
            None => Some(n.is_empty()),
            Some('*') => {
                let rest = &p[1..];
                for k in 0..=n.len() {
                    if go(rest, &n[k..])? {
                        return Some(true);
                    }
                }
                Some(false)
            }
            Some('?') => match n.first() {
                Some(_) => go(&p[1..], &n[1..]),
                None => Some(false),
            },
            Some('[') => {
                let Some(c) = n.first() else {
                    // Still validate the class.
                    class(&p[1..], '\0')?;
                    return Some(false);
                };
                let (ok, used) = class(&p[1..], *c)?;
                if !ok {
                    return Some(false);
                }
                go(&p[1 + used..], &n[1..])
            }
            Some('\\') => {
                let lit = *p.get(1)?;
                if n.first() == Some(&lit) {
                    go(&p[2..], &n[1..])
                } else {
                    Some(false)
                }
            }
            Some(ch) => {
                if n.first() == Some(ch) {
                    go(&p[1..], &n[1..])
                } else {
                    Some(false)
                }
            }
        }
    }
    let p: Vec<char> = pattern.chars().collect();
    let n: Vec<char> = name.chars().collect();
    go(&p, &n).unwrap_or(false)
}

/// Whether the keyring key `glob` (host glob, port, path prefix) covers
/// the image repository `target`.
pub fn urls_match(glob: &str, target: &str) -> bool {
    let (ghost, gpath) = split_location(glob);
    let (thost, tpath) = split_location(target);
    let (gh, gport) = split_host_port(&ghost);
    let (th, tport) = split_host_port(&thost);
    if gport != tport {
        return false;
    }
    let gparts: Vec<&str> = gh.split('.').collect();
    let tparts: Vec<&str> = th.split('.').collect();
    if gparts.len() != tparts.len() {
        return false;
    }
    if !tpath.starts_with(&gpath) {
        return false;
    }
    gparts.iter().zip(&tparts).all(|(g, t)| glob_match(g, t))
}

const DEFAULT_REGISTRY_HOST: &str = "index.docker.io";

/// Whether a repository is Docker Hub's by its name.
fn is_default_registry_match(image: &str) -> bool {
    let mut parts = image.splitn(2, '/');
    let first = parts.next().unwrap_or("");
    if first.is_empty() {
        return false;
    }
    if parts.next().is_none() {
        return true;
    }
    if first == "docker.io" || first == "index.docker.io" {
        return true;
    }
    !first.contains(['.', ':'])
}

/// The repository an image reference pulls from, normalized as docker's
/// reference library does: `busybox:1` → `docker.io/library/busybox`,
/// `me/app@sha256:…` → `docker.io/me/app`, `reg:5000/a/b:t` → `reg:5000/a/b`.
pub fn repository(image: &str) -> String {
    let name = image.split('@').next().unwrap_or(image);
    let name = match name.rfind(':') {
        Some(i) if !name[i..].contains('/') => &name[..i],
        _ => name,
    };
    let (domain, rest) = match name.split_once('/') {
        Some((d, r)) if d.contains(['.', ':']) || d == "localhost" || d.to_lowercase() != d => {
            (d, r.to_string())
        }
        _ => ("docker.io", name.to_string()),
    };
    let domain = if domain == "index.docker.io" {
        "docker.io"
    } else {
        domain
    };
    if domain == "docker.io" && !rest.contains('/') {
        format!("docker.io/library/{rest}")
    } else {
        format!("{domain}/{rest}")
    }
}

/// Credentials by registry location.
#[derive(Debug, Default, Clone)]
pub struct Keyring {
    /// Keys, most specific first (reverse lexical order, no duplicates).
    index: Vec<String>,
    creds: BTreeMap<String, Vec<Credential>>,
}

impl Keyring {
    pub fn add(&mut self, cfg: &DockerConfig) {
        for (loc, cred) in cfg {
            let key = location_key(loc);
            self.creds
                .entry(key.clone())
                .or_default()
                .push(cred.clone());
            if !self.index.contains(&key) {
                self.index.push(key);
            }
        }
        self.index.sort_by(|a, b| b.cmp(a));
    }

    pub fn is_empty(&self) -> bool {
        self.index.is_empty()
    }

    /// The credentials to try for an image, in order; empty: pull without.
    pub fn lookup(&self, image: &str) -> Vec<Credential> {
        let repo = repository(image);
        let mut out = Vec::new();
        for k in &self.index {
            if urls_match(k, &repo) {
                out.extend(self.creds[k].iter().cloned());
            }
        }
        if out.is_empty() && is_default_registry_match(&repo) {
            if let Some(c) = self.creds.get(DEFAULT_REGISTRY_HOST) {
                out.extend(c.iter().cloned());
            }
        }
        out
    }
}

impl Keyring {
    /// Pulls `image` as kubelet does: without credentials when none
    /// match its registry, else with each matching credential in turn until
    /// one works (the errors of all of them otherwise; no anonymous try
    /// after credentials failed).
    pub async fn pull<F, Fut>(&self, image: &str, mut pull: F) -> anyhow::Result<String>
    where
        F: FnMut(Option<cri::AuthConfig>) -> Fut,
        Fut: std::future::Future<Output = anyhow::Result<String>>,
    {
        let creds = self.lookup(image);
        if creds.is_empty() {
            return pull(None).await;
        }
        let mut errors = Vec::new();
        for c in &creds {
            match pull(Some(c.to_cri())).await {
                Ok(id) => return Ok(id),
                Err(e) => errors.push(e.to_string()),
            }
        }
        if errors.len() == 1 {
            anyhow::bail!("{}", errors[0]);
        }
        anyhow::bail!("[{}]", errors.join(", "))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn b64(s: &str) -> String {
        base64::engine::general_purpose::STANDARD.encode(s)
    }

    fn cred(user: &str) -> Credential {
        Credential {
            username: user.into(),
            password: format!("{user}-pw"),
            ..Default::default()
        }
    }

    fn ring(locs: &[&str]) -> Keyring {
        let mut k = Keyring::default();
        k.add(&locs.iter().map(|l| (l.to_string(), cred(l))).collect());
        k
    }

    fn users(k: &Keyring, image: &str) -> Vec<String> {
        k.lookup(image).into_iter().map(|c| c.username).collect()
    }

    /// Runs `Keyring::pull` against a registry that accepts only
    /// `accept` (None: anonymous); returns the result and the users tried.
    fn pull(
        k: &Keyring,
        image: &str,
        accept: Option<&str>,
    ) -> (Result<String, String>, Vec<String>) {
        let tried = std::cell::RefCell::new(Vec::new());
        let r = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap()
            .block_on(k.pull(image, |auth| {
                let user = auth.map(|a| a.username);
                tried
                    .borrow_mut()
                    .push(user.clone().unwrap_or_else(|| "<anonymous>".into()));
                let ok = user.as_deref() == accept;
                async move {
                    if ok {
                        Ok("sha256:img".to_string())
                    } else {
                        Err(anyhow::anyhow!("401 Unauthorized for {user:?}"))
                    }
                }
            }));
        (r.map_err(|e| e.to_string()), tried.into_inner())
    }

    #[test]
    fn each_matching_credential_is_tried_until_one_works_and_none_means_anonymous() {
        let k = ring(&["quay.io", "quay.io/team"]);
        let (r, tried) = pull(&k, "quay.io/team/app:1", Some("quay.io"));
        assert_eq!(r.unwrap(), "sha256:img");
        assert_eq!(tried, ["quay.io/team", "quay.io"]);
        let (r, tried) = pull(&k, "quay.io/team/app:1", Some("quay.io/team"));
        assert!(r.is_ok());
        assert_eq!(tried, ["quay.io/team"], "stops at the first that works");
        // All refused: every error, and no anonymous attempt (kubelet's way).
        let (r, tried) = pull(&k, "quay.io/team/app:1", None);
        let e = r.unwrap_err();
        assert_eq!(tried, ["quay.io/team", "quay.io"]);
        assert!(
            e.starts_with('[') && e.contains("quay.io/team") && e.contains("\"quay.io\""),
            "{e}"
        );
        // No credential for the registry: one anonymous pull.
        let (r, tried) = pull(&k, "other.io/app", None);
        assert!(r.is_ok());
        assert_eq!(tried, ["<anonymous>"]);
        let (r, _) = pull(&Keyring::default(), "busybox", Some("x"));
        assert!(r.unwrap_err().contains("None"));
    }

    #[test]
    fn images_normalize_to_their_repository() {
        assert_eq!(repository("busybox"), "docker.io/library/busybox");
        assert_eq!(repository("busybox:1.36"), "docker.io/library/busybox");
        assert_eq!(repository("me/app@sha256:abcd"), "docker.io/me/app");
        assert_eq!(repository("index.docker.io/me/app:1"), "docker.io/me/app");
        assert_eq!(repository("docker.io/nginx"), "docker.io/library/nginx");
        assert_eq!(repository("reg:5000/a/b:t"), "reg:5000/a/b");
        assert_eq!(repository("localhost/a"), "localhost/a");
        assert_eq!(repository("quay.io/team/app:v1"), "quay.io/team/app");
        assert_eq!(repository("127.0.0.1:5000/app"), "127.0.0.1:5000/app");
    }

    #[test]
    fn a_host_location_matches_every_repository_of_the_host_only() {
        let k = ring(&["registry.example.com"]);
        assert_eq!(
            users(&k, "registry.example.com/a/b:1"),
            ["registry.example.com"]
        );
        assert!(users(&k, "other.example.com/a").is_empty());
        assert!(
            users(&k, "registry.example.com:5000/a").is_empty(),
            "ports must be equal"
        );
        assert!(users(&k, "sub.registry.example.com/a").is_empty());
    }

    #[test]
    fn scheme_and_api_version_paths_are_ignored() {
        let k = ring(&["https://reg.io/v2/", "http://other.io/v1/"]);
        assert_eq!(users(&k, "reg.io/x"), ["https://reg.io/v2/"]);
        assert_eq!(users(&k, "other.io/y"), ["http://other.io/v1/"]);
        let k = ring(&["https://reg.io:5000"]);
        assert_eq!(users(&k, "reg.io:5000/x:1"), ["https://reg.io:5000"]);
    }

    #[test]
    fn the_most_specific_path_comes_first_and_all_matches_are_tried() {
        let k = ring(&[
            "quay.io",
            "quay.io/team",
            "quay.io/team/app",
            "quay.io/other",
        ]);
        assert_eq!(
            users(&k, "quay.io/team/app:1"),
            ["quay.io/team/app", "quay.io/team", "quay.io"]
        );
        assert_eq!(users(&k, "quay.io/other/x"), ["quay.io/other", "quay.io"]);
        assert_eq!(users(&k, "quay.io/solo"), ["quay.io"]);
    }

    #[test]
    fn the_path_is_a_string_prefix_as_kubelet_compares_it() {
        // kubelet compares paths as strings: /team matches /teammate too.
        let k = ring(&["quay.io/team"]);
        assert_eq!(users(&k, "quay.io/teammate/x"), ["quay.io/team"]);
        assert!(users(&k, "quay.io/tea/x").is_empty());
    }

    #[test]
    fn globs_match_one_host_part_each() {
        let k = ring(&["*.example.com"]);
        assert_eq!(users(&k, "a.example.com/x"), ["*.example.com"]);
        assert!(users(&k, "a.b.example.com/x").is_empty(), "one part per *");
        assert!(users(&k, "example.com/x").is_empty());
        let k = ring(&["reg-[0-9].example.com", "*.[a-c]z.io"]);
        assert_eq!(users(&k, "reg-1.example.com/x"), ["reg-[0-9].example.com"]);
        assert!(users(&k, "reg-12.example.com/x").is_empty());
        assert_eq!(users(&k, "x.bz.io/y"), ["*.[a-c]z.io"]);
        assert!(users(&k, "x.dz.io/y").is_empty());
    }

    #[test]
    fn glob_matching_follows_go_filepath_match() {
        assert!(glob_match("*", ""));
        assert!(glob_match("reg-?", "reg-1"));
        assert!(!glob_match("reg-?", "reg-12"));
        assert!(glob_match("a*c", "abbbc"));
        assert!(!glob_match("a*c", "abbbd"));
        assert!(glob_match("[^a]", "b"));
        assert!(!glob_match("[^a]", "a"));
        assert!(glob_match("\\*", "*"));
        assert!(!glob_match("\\*", "x"));
        assert!(!glob_match("[", "["), "a malformed pattern matches nothing");
        assert!(!glob_match("[z-a]", "b"));
    }

    #[test]
    fn docker_hub_images_use_the_index_credentials() {
        let k = ring(&["https://index.docker.io/v1/"]);
        for image in [
            "busybox",
            "busybox:1",
            "me/app",
            "docker.io/me/app",
            "index.docker.io/me/app",
        ] {
            assert_eq!(users(&k, image), ["https://index.docker.io/v1/"], "{image}");
        }
        assert!(users(&k, "quay.io/me/app").is_empty());
        assert!(users(&k, "localhost:5000/app").is_empty());
        // A docker.io location matches Docker Hub images directly.
        let k = ring(&["docker.io"]);
        assert_eq!(users(&k, "busybox"), ["docker.io"]);
    }

    #[test]
    fn the_index_fallback_is_only_used_when_nothing_matched() {
        let k = ring(&["https://index.docker.io/v1/", "docker.io/me"]);
        assert_eq!(users(&k, "me/app"), ["docker.io/me"]);
        assert_eq!(users(&k, "you/app"), ["https://index.docker.io/v1/"]);
    }

    #[test]
    fn several_secrets_for_one_location_are_all_tried_in_order() {
        let mut k = Keyring::default();
        k.add(&vec![("reg.io".into(), cred("first"))]);
        k.add(&vec![("https://reg.io".into(), cred("second"))]);
        assert_eq!(users(&k, "reg.io/a"), ["first", "second"]);
    }

    #[test]
    fn dockerconfigjson_auth_wins_over_username_and_password() {
        let doc = format!(
            r#"{{"auths": {{
                "reg.io": {{"auth": "{}", "username": "ignored", "password": "ignored"}},
                "plain.io": {{"Username": "u", "Password": "p", "email": "e@x"}},
                "tok.io": {{"identitytoken": "id-tok", "registrytoken": "reg-tok"}}
            }}}}"#,
            b64("alice:s3cr:et")
        );
        let cfg = parse_dockerconfigjson(doc.as_bytes()).unwrap();
        let by: BTreeMap<_, _> = cfg.into_iter().collect();
        assert_eq!(by["reg.io"].username, "alice");
        assert_eq!(
            by["reg.io"].password, "s3cr:et",
            "only the first colon splits"
        );
        assert_eq!(by["plain.io"].username, "u");
        assert_eq!(by["plain.io"].password, "p");
        assert_eq!(by["plain.io"].email, "e@x");
        assert_eq!(by["tok.io"].identity_token, "id-tok");
        assert_eq!(by["tok.io"].registry_token, "reg-tok");
        let a = by["tok.io"].to_cri();
        assert_eq!(a.identity_token, "id-tok");
        assert_eq!(a.registry_token, "reg-tok");
        assert!(a.server_address.is_empty());
    }

    #[test]
    fn dockercfg_is_the_entries_themselves() {
        let doc = format!(
            r#"{{"https://reg.io/v1/": {{"auth": "{}"}}}}"#,
            b64("bob:pw")
        );
        let cfg = parse_dockercfg(doc.as_bytes()).unwrap();
        assert_eq!(cfg[0].0, "https://reg.io/v1/");
        assert_eq!(cfg[0].1.username, "bob");
        assert_eq!(cfg[0].1.password, "pw");
    }

    #[test]
    fn bad_configs_are_errors() {
        assert!(parse_dockerconfigjson(b"not json").is_err());
        assert!(parse_dockerconfigjson(b"[]").is_err());
        let no_colon = format!(
            r#"{{"auths": {{"r.io": {{"auth": "{}"}}}}}}"#,
            b64("nocolon")
        );
        let e = parse_dockerconfigjson(no_colon.as_bytes()).unwrap_err();
        assert!(e.contains("base64(username:password)"), "{e}");
        assert!(parse_dockerconfigjson(br#"{"auths": {"r.io": {"auth": "%%%"}}}"#).is_err());
        assert!(parse_dockerconfigjson(br#"{"auths": {"r.io": {"username": 5}}}"#).is_err());
        // No auths at all is an empty config, not an error.
        assert!(parse_dockerconfigjson(b"{}").unwrap().is_empty());
    }

    #[test]
    fn only_a_secret_whose_type_matches_its_key_is_a_pull_secret() {
        let json = br#"{"auths": {"r.io": {"username": "u", "password": "p"}}}"#.to_vec();
        let cfg = br#"{"r.io": {"username": "u", "password": "p"}}"#.to_vec();
        let data = |k: &str, v: &[u8]| BTreeMap::from([(k.to_string(), v.to_vec())]);
        assert!(config_of_secret(
            TYPE_DOCKER_CONFIG_JSON,
            &data(KEY_DOCKER_CONFIG_JSON, &json)
        )
        .unwrap()
        .is_some());
        assert!(config_of_secret(TYPE_DOCKERCFG, &data(KEY_DOCKERCFG, &cfg))
            .unwrap()
            .is_some());
        assert!(
            config_of_secret("Opaque", &data(KEY_DOCKER_CONFIG_JSON, &json))
                .unwrap()
                .is_none()
        );
        assert!(
            config_of_secret(TYPE_DOCKERCFG, &data(KEY_DOCKER_CONFIG_JSON, &json))
                .unwrap()
                .is_none()
        );
        assert!(
            config_of_secret(TYPE_DOCKER_CONFIG_JSON, &data(KEY_DOCKER_CONFIG_JSON, b""))
                .unwrap()
                .is_none()
        );
    }
}
