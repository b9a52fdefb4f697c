//! Server-side apply and managed fields: who owns which field
//! (`metadata.managedFields` in the FieldsV1 format), apply merges that follow
//! the schema's list types, ownership conflicts, and the bookkeeping of
//! ordinary (non-apply) writes.

use std::collections::BTreeSet;

use serde_json::{json, Map, Value};

use crate::schema::{ListType, TypeRef};
use crate::{ApiError, Cause};

/// A field path as FieldsV1 trie keys (`f:spec`, `k:{"name":"a"}`, `v:"x"`, `.`).
type Path = Vec<String>;

/// Metadata fields nobody owns.
fn untracked_meta(k: &str) -> bool {
    matches!(
        k,
        "managedFields"
            | "resourceVersion"
            | "generation"
            | "uid"
            | "creationTimestamp"
            | "selfLink"
            | "deletionTimestamp"
            | "deletionGracePeriodSeconds"
    )
}

fn list_type(field_meta: Option<&crate::schema::FieldMeta>) -> ListType {
    match field_meta.and_then(|m| m.list_type.clone()) {
        Some(l) => l,
        None => ListType::Atomic,
    }
}

fn item_key(item: &Value, keys: &[&str]) -> Option<String> {
    let mut m = Map::new();
    let mut sorted: Vec<&&str> = keys.iter().collect();
    sorted.sort();
    for k in sorted {
        match item.get(*k) {
            Some(v) => {
                m.insert((*k).to_string(), v.clone());
            }
            None if *k == "protocol" => {
                m.insert("protocol".into(), json!("TCP"));
            }
            None => {}
        }
    }
    if m.is_empty() {
        return None;
    }
    Some(format!("k:{}", Value::Object(m)))
}

/// Where [`leaves`] puts the paths it finds.
trait Paths {
    fn add(&mut self, path: &Path);
}

impl Paths for BTreeSet<Path> {
    fn add(&mut self, path: &Path) {
        if !self.contains(path) {
            self.insert(path.clone());
        }
    }
}

/// Paths straight into a FieldsV1 trie, for a first owner of every field
/// (a create): no set of paths is built only to become the trie. Nodes live
/// in an arena; [`leaves`] gives paths depth first, so each one shares a
/// prefix with the one before and only its new segments are looked up.
struct Trie {
    /// (segment, children) per node; node 0 is the root.
    nodes: Vec<(String, Vec<usize>)>,
    /// The nodes of the last path added, root excluded.
    last: Vec<usize>,
}

impl Default for Trie {
    fn default() -> Self {
        Trie {
            nodes: vec![(String::new(), Vec::new())],
            last: Vec::new(),
        }
    }
}

impl Paths for Trie {
    fn add(&mut self, path: &Path) {
        let same = self
            .last
            .iter()
            .zip(path)
            .take_while(|(n, seg)| self.nodes[**n].0 == **seg)
            .count();
        self.last.truncate(same);
        for seg in &path[same..] {
            let parent = self.last.last().copied().unwrap_or(0);
            let found = self.nodes[parent]
                .1
                .iter()
                .copied()
                .find(|c| self.nodes[*c].0 == *seg);
            let node = found.unwrap_or_else(|| {
                self.nodes.push((seg.clone(), Vec::new()));
                let n = self.nodes.len() - 1;
                self.nodes[parent].1.push(n);
                n
            });
            self.last.push(node);
        }
    }
}

impl Trie {
    /// The trie as FieldsV1, every level in path order as [`to_trie`]
    /// writes it.
    fn finish(mut self) -> Value {
        self.value(0)
    }

    fn value(&mut self, node: usize) -> Value {
        let mut children = std::mem::take(&mut self.nodes[node].1);
        children.sort_by(|a, b| self.nodes[*a].0.cmp(&self.nodes[*b].0));
        let mut m = Map::new();
        for c in children {
            let v = self.value(c);
            m.insert(std::mem::take(&mut self.nodes[c].0), v);
        }
        Value::Object(m)
    }
}

/// The leaf paths a value sets.
fn leaves(v: &Value, t: Option<TypeRef>, prefix: &mut Path, out: &mut impl Paths, top: bool) {
    match v {
        Value::Object(m) if t.map(|t| t.is_object() || t.is_map()).unwrap_or(true) => {
            if m.is_empty() && !top {
                out.add(prefix);
                return;
            }
            for (k, child) in m {
                let field = t.and_then(|t| {
                    if t.is_object() {
                        t.field(k)
                    } else {
                        t.additional().map(|a| (a, Default::default()))
                    }
                });
                if prefix.len() == 1 && prefix[0] == "f:metadata" && untracked_meta(k) {
                    continue;
                }
                prefix.push(format!("f:{k}"));
                match (child, &field) {
                    (Value::Array(items), Some((ft, meta))) => match list_type(Some(meta)) {
                        ListType::Map(keys) => {
                            let it = ft.items();
                            if items.is_empty() {
                                out.add(prefix);
                            }
                            for item in items {
                                match item_key(item, &keys) {
                                    Some(ik) => {
                                        prefix.push(ik);
                                        prefix.push(".".into());
                                        out.add(prefix);
                                        prefix.pop();
                                        leaves(item, it, prefix, out, false);
                                        prefix.pop();
                                    }
                                    None => {
                                        out.add(prefix);
                                    }
                                }
                            }
                        }
                        ListType::Set => {
                            if items.is_empty() {
                                out.add(prefix);
                            }
                            for item in items {
                                prefix.push(format!("v:{item}"));
                                out.add(prefix);
                                prefix.pop();
                            }
                        }
                        ListType::Atomic => {
                            out.add(prefix);
                        }
                    },
                    (Value::Object(_), Some((ft, meta)))
                        if !meta.map_type_atomic && !ft.is_opaque() =>
                    {
                        leaves(child, Some(*ft), prefix, out, false)
                    }
                    (Value::Object(_), None) if t.is_none() => {
                        leaves(child, None, prefix, out, false)
                    }
                    _ => {
                        out.add(prefix);
                    }
                }
                prefix.pop();
            }
        }
        _ => {
            out.add(prefix);
        }
    }
}

fn paths_of(v: &Value, t: Option<TypeRef>) -> BTreeSet<Path> {
    let mut out = BTreeSet::new();
    leaves(v, t, &mut Vec::new(), &mut out, true);
    out
}

/// The value at a path (`None` if absent).
fn get_at<'a>(v: &'a Value, path: &[String]) -> Option<&'a Value> {
    let Some((head, rest)) = path.split_first() else {
        return Some(v);
    };
    if head == "." {
        return Some(v);
    }
    if let Some(f) = head.strip_prefix("f:") {
        return get_at(v.get(f)?, rest);
    }
    if let Some(k) = head.strip_prefix("k:") {
        let keys: Map<String, Value> = serde_json::from_str(k).ok()?;
        let item = v.as_array()?.iter().find(|item| {
            keys.iter().all(|(kk, kv)| {
                item.get(kk) == Some(kv)
                    || (kk == "protocol" && item.get(kk).is_none() && kv == "TCP")
            })
        })?;
        return get_at(item, rest);
    }
    if let Some(j) = head.strip_prefix("v:") {
        let want: Value = serde_json::from_str(j).ok()?;
        return v.as_array()?.iter().find(|x| **x == want);
    }
    None
}

/// Removes the value at a path, if present.
fn remove_at(v: &mut Value, path: &[String]) {
    let Some((head, rest)) = path.split_first() else {
        return;
    };
    if let Some(f) = head.strip_prefix("f:") {
        if rest.is_empty() || (rest.len() == 1 && rest[0] == ".") {
            if let Some(m) = v.as_object_mut() {
                m.remove(f);
            }
        } else if let Some(child) = v.get_mut(f) {
            remove_at(child, rest);
        }
        return;
    }
    if let Some(k) = head.strip_prefix("k:") {
        let Ok(keys) = serde_json::from_str::<Map<String, Value>>(k) else {
            return;
        };
        let Some(arr) = v.as_array_mut() else { return };
        let matches = |item: &Value| {
            keys.iter().all(|(kk, kv)| {
                item.get(kk) == Some(kv)
                    || (kk == "protocol" && item.get(kk).is_none() && kv == "TCP")
            })
        };
        if rest.is_empty() || (rest.len() == 1 && rest[0] == ".") {
            arr.retain(|item| !matches(item));
        } else if let Some(item) = arr.iter_mut().find(|i| matches(i)) {
            remove_at(item, rest);
        }
        return;
    }
    if let Some(j) = head.strip_prefix("v:") {
        if let (Ok(want), Some(arr)) = (serde_json::from_str::<Value>(j), v.as_array_mut()) {
            arr.retain(|x| *x != want);
        }
    }
}

fn to_trie(paths: &BTreeSet<Path>) -> Value {
    let mut root = Map::new();
    for p in paths {
        let mut node = &mut root;
        for seg in p {
            // Paths share their prefixes: copy a segment only when it is new.
            if !node.contains_key(seg) {
                node.insert(seg.clone(), json!({}));
            }
            node = node
                .get_mut(seg)
                .and_then(Value::as_object_mut)
                .expect("trie node");
        }
    }
    Value::Object(root)
}

fn from_trie(v: &Value, prefix: &mut Path, out: &mut BTreeSet<Path>) {
    match v.as_object() {
        Some(m) if !m.is_empty() => {
            for (k, child) in m {
                prefix.push(k.clone());
                from_trie(child, prefix, out);
                prefix.pop();
            }
        }
        _ => {
            if !prefix.is_empty() {
                out.insert(prefix.clone());
            }
        }
    }
}

struct Entry {
    raw: Map<String, Value>,
    paths: BTreeSet<Path>,
}

fn entries(obj: &Value) -> Vec<Entry> {
    obj.pointer("/metadata/managedFields")
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(Value::as_object)
                .map(|m| {
                    let mut paths = BTreeSet::new();
                    if let Some(f) = m.get("fieldsV1") {
                        from_trie(f, &mut Vec::new(), &mut paths);
                    }
                    // `fieldsV1` is rewritten from `paths` (or the entry
                    // dropped), so it is not copied: a null holds its
                    // position among the keys until then.
                    let raw = m
                        .iter()
                        .map(|(k, v)| {
                            let v = if k == "fieldsV1" {
                                Value::Null
                            } else {
                                v.clone()
                            };
                            (k.clone(), v)
                        })
                        .collect();
                    Entry { raw, paths }
                })
                .collect()
        })
        .unwrap_or_default()
}

fn is_entry(e: &Entry, manager: &str, operation: &str, sub: Option<&str>) -> bool {
    e.raw.get("manager").and_then(Value::as_str) == Some(manager)
        && e.raw.get("operation").and_then(Value::as_str) == Some(operation)
        && e.raw.get("subresource").and_then(Value::as_str) == sub
}

fn write_entries(obj: &mut Value, list: Vec<Entry>) {
    let arr: Vec<Value> = list
        .into_iter()
        .filter(|e| !e.paths.is_empty())
        .map(|e| with_fields(e.raw, to_trie(&e.paths)))
        .collect();
    set_managed_fields(obj, arr);
}

fn with_fields(mut raw: Map<String, Value>, fields: Value) -> Value {
    raw.insert("fieldsType".into(), json!("FieldsV1"));
    raw.insert("fieldsV1".into(), fields);
    Value::Object(raw)
}

fn set_managed_fields(obj: &mut Value, arr: Vec<Value>) {
    if let Some(m) = obj.get_mut("metadata").and_then(Value::as_object_mut) {
        if arr.is_empty() {
            m.remove("managedFields");
        } else {
            m.insert("managedFields".into(), Value::Array(arr));
        }
    }
}

fn new_entry(
    manager: &str,
    operation: &str,
    sub: Option<&str>,
    now: &str,
    api_version: &str,
) -> Entry {
    let mut raw = Map::new();
    raw.insert("manager".into(), json!(manager));
    raw.insert("operation".into(), json!(operation));
    raw.insert("apiVersion".into(), json!(api_version));
    raw.insert("time".into(), json!(now));
    if let Some(s) = sub {
        raw.insert("subresource".into(), json!(s));
    }
    Entry {
        raw,
        paths: BTreeSet::new(),
    }
}

fn subtree_for(sub: Option<&str>, p: &Path) -> bool {
    // Status writes own status fields; other writes own the rest.
    let is_status = p.first().map(|s| s == "f:status").unwrap_or(false);
    match sub {
        Some("status") => is_status,
        _ => true,
    }
}

/// Records an ordinary write (create, update, patch) by `manager`: the fields
/// it changed become its own and leave other managers' sets.
#[allow(clippy::too_many_arguments)]
pub fn record_update(
    old: Option<&Value>,
    new: &mut Value,
    manager: &str,
    operation: &str,
    subresource: Option<&str>,
    t: Option<TypeRef>,
    now: &str,
    api_version: &str,
) {
    let first_owner = old.is_none()
        && subresource.is_none()
        && new
            .pointer("/metadata/managedFields")
            .and_then(Value::as_array)
            .map(Vec::is_empty)
            .unwrap_or(true);
    if first_owner {
        // A create: every field the object sets is the manager's.
        let mut trie = Trie::default();
        leaves(new, t, &mut Vec::new(), &mut trie, true);
        let fields = trie.finish();
        let arr = if fields.as_object().is_some_and(|m| m.is_empty()) {
            Vec::new()
        } else {
            let e = new_entry(manager, operation, None, now, api_version);
            vec![with_fields(e.raw, fields)]
        };
        set_managed_fields(new, arr);
        return;
    }
    let mut list = match old {
        Some(o) => entries(o),
        None => entries(new),
    };
    let new_paths = paths_of(new, t);
    let changed: BTreeSet<Path> = new_paths
        .iter()
        .filter(|p| subtree_for(subresource, p))
        .filter(|p| old.map(|o| get_at(o, p) != get_at(new, p)).unwrap_or(true))
        .cloned()
        .collect();
    // Fields that no longer exist belong to nobody.
    for e in list.iter_mut() {
        e.paths.retain(|p| new_paths.contains(p));
    }
    if changed.is_empty() {
        write_entries(new, list);
        return;
    }
    for e in list.iter_mut() {
        if !is_entry(e, manager, operation, subresource) {
            e.paths.retain(|p| !changed.contains(p));
        }
    }
    match list
        .iter_mut()
        .find(|e| is_entry(e, manager, operation, subresource))
    {
        Some(e) => {
            e.paths.extend(changed);
            e.raw.insert("time".into(), json!(now));
            e.raw.insert("apiVersion".into(), json!(api_version));
        }
        None => {
            let mut e = new_entry(manager, operation, subresource, now, api_version);
            e.paths = changed;
            list.push(e);
        }
    }
    write_entries(new, list);
}

fn merge_applied(live: &Value, applied: &Value, t: Option<TypeRef>) -> Value {
    match (live, applied) {
        (Value::Object(l), Value::Object(a)) => {
            let mut out = l.clone();
            for (k, av) in a {
                let field = t.and_then(|t| {
                    if t.is_object() {
                        t.field(k)
                    } else {
                        t.additional().map(|x| (x, Default::default()))
                    }
                });
                let merged = match (l.get(k), av, &field) {
                    (Some(Value::Object(_)), Value::Object(_), Some((ft, meta)))
                        if !meta.map_type_atomic && !ft.is_opaque() =>
                    {
                        merge_applied(&l[k], av, Some(*ft))
                    }
                    (Some(Value::Object(_)), Value::Object(_), None) if t.is_none() => {
                        merge_applied(&l[k], av, None)
                    }
                    (Some(Value::Array(la)), Value::Array(aa), Some((ft, meta))) => {
                        match list_type(Some(meta)) {
                            ListType::Map(keys) => {
                                let mut outl = la.clone();
                                for item in aa {
                                    let ik = item_key(item, &keys);
                                    match outl
                                        .iter()
                                        .position(|x| ik.is_some() && item_key(x, &keys) == ik)
                                    {
                                        Some(i) => {
                                            outl[i] = merge_applied(&outl[i], item, ft.items())
                                        }
                                        None => outl.push(item.clone()),
                                    }
                                }
                                Value::Array(outl)
                            }
                            ListType::Set => {
                                let mut outl = la.clone();
                                for item in aa {
                                    if !outl.contains(item) {
                                        outl.push(item.clone());
                                    }
                                }
                                Value::Array(outl)
                            }
                            ListType::Atomic => av.clone(),
                        }
                    }
                    _ => av.clone(),
                };
                out.insert(k.clone(), merged);
            }
            Value::Object(out)
        }
        _ => applied.clone(),
    }
}

/// A string as Go's `%q` quotes it (structured-merge-diff prints key and
/// set values so).
fn go_quote(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\u{7}' => out.push_str("\\a"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{b}' => out.push_str("\\v"),
            c if (c as u32) < 0x20 || c == '\u{7f}' => {
                out.push_str(&format!("\\x{:02x}", c as u32))
            }
            c if c.is_control() => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// A float as Go's `%v` prints it: the shortest digits, in exponent form
/// when the exponent is below -4 or at least 6.
fn go_float(f: f64) -> String {
    if !f.is_finite() {
        return if f.is_nan() {
            "NaN".into()
        } else if f > 0.0 {
            "+Inf".into()
        } else {
            "-Inf".into()
        };
    }
    let sci = format!("{f:e}");
    let (mantissa, exp) = sci.split_once('e').unwrap_or((&sci, "0"));
    let exp: i32 = exp.parse().unwrap_or(0);
    if (-4..6).contains(&exp) {
        return format!("{f}");
    }
    let sign = if exp < 0 { '-' } else { '+' };
    format!("{mantissa}e{sign}{:02}", exp.abs())
}

/// A value as structured-merge-diff's `value.ToString` prints it.
fn smd_value(v: &Value) -> String {
    match v {
        Value::Null => "null".into(),
        Value::Bool(b) => b.to_string(),
        Value::Number(n) => match (n.as_i64(), n.as_u64(), n.as_f64()) {
            (Some(i), _, _) => i.to_string(),
            (_, Some(u), _) => u.to_string(),
            (_, _, Some(f)) => go_float(f),
            _ => n.to_string(),
        },
        Value::String(s) => go_quote(s),
        Value::Array(a) => format!(
            "[{}]",
            a.iter().map(smd_value).collect::<Vec<_>>().join(",")
        ),
        Value::Object(m) => m
            .iter()
            .map(|(k, v)| format!("{k}={}", smd_value(v)))
            .collect::<Vec<_>>()
            .join(""),
    }
}

/// A field path as structured-merge-diff's `Path.String()` prints it:
/// `.spec.containers[name="c"].image`, keys sorted by name and printed as
/// values (`[containerPort=80,protocol="TCP"]`), set items `[="x"]`.
fn path_string(p: &Path) -> String {
    let mut s = String::new();
    for seg in p {
        if let Some(f) = seg.strip_prefix("f:") {
            s.push('.');
            s.push_str(f);
        } else if let Some(k) = seg.strip_prefix("k:") {
            match serde_json::from_str::<Map<String, Value>>(k) {
                Ok(keys) => {
                    let mut keys: Vec<(&String, &Value)> = keys.iter().collect();
                    keys.sort_by(|a, b| a.0.cmp(b.0));
                    let parts: Vec<String> = keys
                        .into_iter()
                        .map(|(name, v)| format!("{name}={}", smd_value(v)))
                        .collect();
                    s.push_str(&format!("[{}]", parts.join(",")));
                }
                Err(_) => s.push_str("{{invalid path element}}"),
            }
        } else if let Some(v) = seg.strip_prefix("v:") {
            match serde_json::from_str::<Value>(v) {
                Ok(v) => s.push_str(&format!("[={}]", smd_value(&v))),
                Err(_) => s.push_str("{{invalid path element}}"),
            }
        } else if let Some(i) = seg.strip_prefix("i:") {
            s.push_str(&format!("[{i}]"));
        }
    }
    s
}

/// A conflicting manager as kube-apiserver names it: `"name"`, then
/// `with subresource "status"` for a subresource's entry, then `using
/// <apiVersion>` for an Update entry (an Apply entry has no version in its
/// identity).
fn manager_string(e: &Entry) -> String {
    let field = |k: &str| e.raw.get(k).and_then(Value::as_str).unwrap_or("");
    let mut out = go_quote(field("manager"));
    if !field("subresource").is_empty() {
        out.push_str(&format!(
            " with subresource {}",
            go_quote(field("subresource"))
        ));
    }
    if field("operation") == "Update" {
        out.push_str(&format!(" using {}", field("apiVersion")));
    }
    out
}

/// The manager's identity as kube-apiserver keys (and so sorts) managers:
/// the entry's JSON without time and fields, and without apiVersion for
/// an Apply.
fn manager_identity(e: &Entry) -> String {
    let field = |k: &str| e.raw.get(k).and_then(Value::as_str).unwrap_or("");
    let mut m = Map::new();
    m.insert("manager".into(), json!(field("manager")));
    m.insert("operation".into(), json!(field("operation")));
    if field("operation") != "Apply" && !field("apiVersion").is_empty() {
        m.insert("apiVersion".into(), json!(field("apiVersion")));
    }
    if !field("subresource").is_empty() {
        m.insert("subresource".into(), json!(field("subresource")));
    }
    Value::Object(m).to_string()
}

/// The 409 for an apply's conflicts (each: the manager's identity, how it
/// is printed, the path), worded as kube-apiserver words it: one conflict
/// on one line; several grouped by manager in the order of their identities.
fn conflict_error(conflicts: &[(String, String, Path)]) -> ApiError {
    let causes: Vec<Cause> = conflicts
        .iter()
        .map(|(_, m, p)| {
            Cause::new(
                "FieldManagerConflict",
                path_string(p),
                format!("conflict with {m}"),
            )
        })
        .collect();
    let msg = if let [(_, m, p)] = conflicts {
        format!(
            "Apply failed with 1 conflict: conflict with {m}: {}",
            path_string(p)
        )
    } else {
        let mut by_manager: std::collections::BTreeMap<&str, (&str, Vec<&Path>)> =
            Default::default();
        for (id, m, p) in conflicts {
            by_manager.entry(id).or_insert((m, Vec::new())).1.push(p);
        }
        let mut lines = Vec::new();
        for (m, paths) in by_manager.values() {
            lines.push(format!("conflicts with {m}:"));
            for p in paths {
                lines.push(format!("- {}", path_string(p)));
            }
        }
        format!(
            "Apply failed with {} conflicts: {}",
            conflicts.len(),
            lines.join("\n")
        )
    };
    let mut e = ApiError::new(409, "Conflict", msg);
    e.causes = causes;
    e
}

/// Applies `applied` (the manager's whole intent) to `live`, or creates from
/// it. Conflicts with other managers' differing values are a 409 unless `force`.
#[allow(clippy::too_many_arguments)]
pub fn server_side_apply(
    live: Option<&Value>,
    applied: &Value,
    manager: &str,
    force: bool,
    t: Option<TypeRef>,
    now: &str,
    api_version: &str,
) -> Result<Value, ApiError> {
    if !applied.is_object() {
        return Err(ApiError::bad_request(
            "the applied configuration must be an object",
        ));
    }
    let mut applied = applied.clone();
    if let Some(m) = applied.get_mut("metadata").and_then(Value::as_object_mut) {
        for k in [
            "managedFields",
            "uid",
            "creationTimestamp",
            "generation",
            "selfLink",
        ] {
            m.remove(k);
        }
    }
    let applied_paths: BTreeSet<Path> = paths_of(&applied, t)
        .into_iter()
        .filter(|p| !p.first().map(|s| s == "f:status").unwrap_or(false))
        .collect();
    let Some(live) = live else {
        let mut obj = applied.clone();
        let mut e = new_entry(manager, "Apply", None, now, api_version);
        e.paths = applied_paths;
        write_entries(&mut obj, vec![e]);
        return Ok(obj);
    };
    let mut list = entries(live);
    // Conflicts: another manager owns a field this apply sets to a different value.
    let mut conflicts: Vec<(String, String, Path)> = Vec::new();
    for e in &list {
        if is_entry(e, manager, "Apply", None) {
            continue;
        }
        let (id, printed) = (manager_identity(e), manager_string(e));
        for p in e.paths.intersection(&applied_paths) {
            if p.last().map(|s| s == ".").unwrap_or(false) {
                continue;
            }
            if get_at(live, p) != get_at(&applied, p) {
                conflicts.push((id.clone(), printed.clone(), p.clone()));
            }
        }
    }
    if !conflicts.is_empty() && !force {
        return Err(conflict_error(&conflicts));
    }
    let forced: BTreeSet<Path> = conflicts.into_iter().map(|(_, _, p)| p).collect();
    let mut obj = merge_applied(live, &applied, t);
    // Fields this manager applied before and no longer applies go, unless someone else owns them.
    let previous: BTreeSet<Path> = list
        .iter()
        .filter(|e| is_entry(e, manager, "Apply", None))
        .flat_map(|e| e.paths.iter().cloned())
        .collect();
    let others: BTreeSet<Path> = list
        .iter()
        .filter(|e| !is_entry(e, manager, "Apply", None))
        .flat_map(|e| e.paths.iter().cloned())
        .collect();
    let mut dropped: Vec<&Path> = previous
        .difference(&applied_paths)
        .filter(|p| !others.contains(*p))
        .collect();
    dropped.sort_by_key(|p| std::cmp::Reverse(p.len()));
    for p in dropped {
        remove_at(&mut obj, p);
    }
    for e in list.iter_mut() {
        if !is_entry(e, manager, "Apply", None) {
            e.paths.retain(|p| !forced.contains(p));
        }
    }
    match list
        .iter_mut()
        .find(|e| is_entry(e, manager, "Apply", None))
    {
        Some(e) => {
            e.paths = applied_paths;
            e.raw.insert("time".into(), json!(now));
            e.raw.insert("apiVersion".into(), json!(api_version));
        }
        None => {
            let mut e = new_entry(manager, "Apply", None, now, api_version);
            e.paths = applied_paths;
            list.push(e);
        }
    }
    write_entries(&mut obj, list);
    Ok(obj)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::schema::root;

    const NOW: &str = "2026-01-01T00:00:00Z";

    fn deploy(replicas: i64, image: &str) -> Value {
        json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "d"},
            "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": "a"}},
                "template": {"metadata": {"labels": {"app": "a"}}, "spec": {"containers": [{"name": "c", "image": image}]}}}})
    }

    fn t() -> Option<TypeRef> {
        root("apps", "v1", "Deployment")
    }

    #[test]
    fn a_create_records_the_same_fields_as_the_general_path_would() {
        let pod = json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "p", "labels": {"b": "2", "a": "1"}, "uid": "u"},
            "spec": {"containers": [{"name": "c", "image": "pause",
                    "ports": [{"containerPort": 80}, {"containerPort": 53, "protocol": "UDP"}],
                    "resources": {"limits": {"cpu": "100m"}, "requests": {"cpu": "100m"}}}],
                "tolerations": [{"key": "k", "operator": "Exists"}],
                "dnsPolicy": "ClusterFirst", "securityContext": {}}});
        let t = root("", "v1", "Pod");
        let mut created = pod.clone();
        record_update(None, &mut created, "me", "Update", None, t, NOW, "v1");
        let entries = created["metadata"]["managedFields"].as_array().unwrap();
        assert_eq!(entries.len(), 1);
        assert_eq!(entries[0]["manager"], "me");
        assert_eq!(entries[0]["fieldsType"], "FieldsV1");
        // The same trie, in the same key order, as the set of paths gives.
        let expected = to_trie(&paths_of(&pod, t));
        assert_eq!(
            serde_json::to_string(&entries[0]["fieldsV1"]).unwrap(),
            serde_json::to_string(&expected).unwrap()
        );
        assert!(entries[0]["fieldsV1"]["f:spec"]["f:containers"]
            .get(r#"k:{"name":"c"}"#)
            .is_some());
        assert!(entries[0]["fieldsV1"]["f:metadata"].get("f:uid").is_none());
        // Keys met again after other paths (two items with one key) and a
        // deployment's nested template give the same trie too.
        let twice = json!({"spec": {"containers": [{"name": "c", "image": "a"},
            {"name": "d"}, {"name": "c", "args": ["x"]}]}});
        for (obj, t) in [
            (twice, t),
            (deploy(2, "x:1"), root("apps", "v1", "Deployment")),
        ] {
            let mut trie = Trie::default();
            leaves(&obj, t, &mut Vec::new(), &mut trie, true);
            assert_eq!(
                serde_json::to_string(&trie.finish()).unwrap(),
                serde_json::to_string(&to_trie(&paths_of(&obj, t))).unwrap()
            );
        }
    }

    #[test]
    fn applying_twice_with_a_changed_replicas_updates_it() {
        let live =
            server_side_apply(None, &deploy(1, "x:1"), "me", false, t(), NOW, "apps/v1").unwrap();
        let out = server_side_apply(
            Some(&live),
            &deploy(3, "x:1"),
            "me",
            false,
            t(),
            NOW,
            "apps/v1",
        )
        .unwrap();
        assert_eq!(out["spec"]["replicas"], 3);
        let mf = &out["metadata"]["managedFields"][0];
        assert_eq!(mf["manager"], "me");
        assert_eq!(mf["operation"], "Apply");
        assert!(
            mf["fieldsV1"]["f:spec"]["f:template"]["f:spec"]["f:containers"]["k:{\"name\":\"c\"}"]
                ["f:image"]
                .is_object()
        );
    }

    #[test]
    fn a_field_removed_from_the_applied_config_is_removed_from_the_object() {
        let mut first = deploy(1, "x:1");
        first["metadata"]["labels"] = json!({"team": "a"});
        let live = server_side_apply(None, &first, "me", false, t(), NOW, "apps/v1").unwrap();
        let out = server_side_apply(
            Some(&live),
            &deploy(1, "x:1"),
            "me",
            false,
            t(),
            NOW,
            "apps/v1",
        )
        .unwrap();
        assert!(out["metadata"]
            .get("labels")
            .map(|l| l.get("team").is_none())
            .unwrap_or(true));
    }

    #[test]
    fn a_field_owned_by_another_manager_with_a_different_value_conflicts() {
        let mut live = deploy(1, "x:1");
        record_update(
            None,
            &mut live,
            "kubectl-edit",
            "Update",
            None,
            t(),
            NOW,
            "apps/v1",
        );
        let e = server_side_apply(
            Some(&live),
            &deploy(5, "x:1"),
            "me",
            false,
            t(),
            NOW,
            "apps/v1",
        )
        .unwrap_err();
        assert_eq!(e.code, 409);
        assert_eq!(
            e.message,
            "Apply failed with 1 conflict: conflict with \"kubectl-edit\" using apps/v1: .spec.replicas"
        );
        assert_eq!(e.causes.len(), 1);
        assert_eq!(e.causes[0].reason, "FieldManagerConflict");
        assert_eq!(e.causes[0].field, ".spec.replicas");
        assert_eq!(
            e.causes[0].message,
            "conflict with \"kubectl-edit\" using apps/v1"
        );
        let forced = server_side_apply(
            Some(&live),
            &deploy(5, "x:1"),
            "me",
            true,
            t(),
            NOW,
            "apps/v1",
        )
        .unwrap();
        assert_eq!(forced["spec"]["replicas"], 5);
    }

    #[test]
    fn the_same_value_from_two_managers_does_not_conflict() {
        let mut live = deploy(1, "x:1");
        record_update(
            None,
            &mut live,
            "kubectl-client-side-apply",
            "Update",
            None,
            t(),
            NOW,
            "apps/v1",
        );
        assert!(server_side_apply(
            Some(&live),
            &deploy(1, "x:1"),
            "kubectl",
            false,
            t(),
            NOW,
            "apps/v1"
        )
        .is_ok());
    }

    #[test]
    fn an_update_gives_changed_fields_to_its_manager() {
        let mut live = deploy(1, "x:1");
        record_update(None, &mut live, "a", "Update", None, t(), NOW, "apps/v1");
        let mut next = live.clone();
        next["spec"]["replicas"] = json!(2);
        record_update(
            Some(&live),
            &mut next,
            "b",
            "Update",
            None,
            t(),
            NOW,
            "apps/v1",
        );
        let mf = next["metadata"]["managedFields"].as_array().unwrap();
        assert_eq!(mf.len(), 2);
        assert!(mf[0]["fieldsV1"]["f:spec"].get("f:replicas").is_none());
        assert!(mf[1]["fieldsV1"]["f:spec"]["f:replicas"].is_object());
    }

    #[test]
    fn conflict_paths_print_keys_and_set_items_as_values() {
        let p = |segs: &[&str]| -> Path { segs.iter().map(|s| s.to_string()).collect() };
        for (path, want) in [
            (
                p(&["f:spec", "f:rules", r#"k:{"name":"a"}"#, "f:value"]),
                r#".spec.rules[name="a"].value"#,
            ),
            (
                p(&[
                    "f:spec",
                    "f:containers",
                    r#"k:{"name":"c"}"#,
                    "f:ports",
                    r#"k:{"containerPort":80,"protocol":"TCP"}"#,
                    "f:hostPort",
                ]),
                r#".spec.containers[name="c"].ports[containerPort=80,protocol="TCP"].hostPort"#,
            ),
            // Keys in name order whatever order the entry holds them in.
            (
                p(&["f:x", r#"k:{"protocol":"UDP","port":53}"#]),
                r#".x[port=53,protocol="UDP"]"#,
            ),
            (
                p(&["f:metadata", "f:finalizers", r#"v:"a/b""#]),
                r#".metadata.finalizers[="a/b"]"#,
            ),
            (p(&["f:x", "v:3"]), ".x[=3]"),
            (p(&["f:x", "v:true"]), ".x[=true]"),
            (p(&["f:x", "v:1.5"]), ".x[=1.5]"),
            (p(&["f:x", "v:2000000.0"]), ".x[=2e+06]"),
            (
                p(&["f:x", r#"k:{"name":"q\"t\u0001"}"#]),
                r#".x[name="q\"t\x01"]"#,
            ),
            (p(&["f:x", "i:2"]), ".x[2]"),
        ] {
            assert_eq!(path_string(&path), want);
        }
    }

    fn owned_by(manager: &str, operation: &str, api_version: &str, obj: &mut Value) {
        record_update(None, obj, manager, operation, None, t(), NOW, api_version);
    }

    #[test]
    fn a_conflict_in_a_list_map_item_names_the_item_by_its_key_values() {
        let mut live = deploy(1, "x:1");
        owned_by("kubectl-edit", "Update", "apps/v1", &mut live);
        let e = server_side_apply(
            Some(&live),
            &deploy(1, "x:2"),
            "me",
            false,
            t(),
            NOW,
            "apps/v1",
        )
        .unwrap_err();
        assert_eq!(
            e.message,
            "Apply failed with 1 conflict: conflict with \"kubectl-edit\" using apps/v1: \
             .spec.template.spec.containers[name=\"c\"].image"
        );
        assert_eq!(
            e.causes[0].field,
            ".spec.template.spec.containers[name=\"c\"].image"
        );
    }

    #[test]
    fn an_appliers_conflict_names_no_version_and_a_subresource_is_named() {
        let mut live = deploy(1, "x:1");
        // Another applier owns everything it set, at another version.
        live = server_side_apply(None, &live, "helm", false, t(), NOW, "apps/v1beta2").unwrap();
        let e = server_side_apply(
            Some(&live),
            &deploy(2, "x:1"),
            "me",
            false,
            t(),
            NOW,
            "apps/v1",
        )
        .unwrap_err();
        assert_eq!(
            e.message,
            "Apply failed with 1 conflict: conflict with \"helm\": .spec.replicas"
        );
        let mut live = deploy(1, "x:1");
        owned_by("autoscaler", "Update", "autoscaling/v1", &mut live);
        let mf = live["metadata"]["managedFields"].as_array_mut().unwrap();
        mf[0]["subresource"] = json!("scale");
        let e = server_side_apply(
            Some(&live),
            &deploy(2, "x:1"),
            "me",
            false,
            t(),
            NOW,
            "apps/v1",
        )
        .unwrap_err();
        assert_eq!(
            e.message,
            "Apply failed with 1 conflict: conflict with \"autoscaler\" with subresource \"scale\" \
             using autoscaling/v1: .spec.replicas"
        );
    }

    #[test]
    fn several_conflicts_are_grouped_by_manager() {
        let mut live = deploy(1, "x:1");
        owned_by("b-editor", "Update", "apps/v1", &mut live);
        let mut next = live.clone();
        next["spec"]["replicas"] = json!(2);
        record_update(
            Some(&live),
            &mut next,
            "a-scaler",
            "Update",
            None,
            t(),
            NOW,
            "apps/v1",
        );
        let mut applied = deploy(7, "x:9");
        applied["spec"]["minReadySeconds"] = json!(3);
        let e =
            server_side_apply(Some(&next), &applied, "me", false, t(), NOW, "apps/v1").unwrap_err();
        assert_eq!(
            e.message,
            "Apply failed with 2 conflicts: conflicts with \"a-scaler\" using apps/v1:\n\
             - .spec.replicas\n\
             conflicts with \"b-editor\" using apps/v1:\n\
             - .spec.template.spec.containers[name=\"c\"].image"
        );
        assert_eq!(e.causes.len(), 2);
    }
}
