//! Kubernetes' CEL libraries (`k8s.io/apiserver/pkg/cel/library`) on the
//! `cel` crate: lists (`isSorted`, `sum`, `min`, `max`, `indexOf`,
//! `lastIndexOf`), regex (`find`, `findAll`), url (`url`, `isURL`,
//! `getScheme`, `getHost`, `getHostname`, `getPort`, `getEscapedPath`,
//! `getQuery`) and quantity (`quantity`, `isQuantity`, `sign`, `isInteger`,
//! `asInteger`, `asApproximateFloat`, `add`, `sub`, `isLessThan`,
//! `isGreaterThan`, `compareTo`).

use std::cmp::Ordering;
use std::collections::HashMap;
use std::sync::Arc;

use ::cel::common::functions::Function;
use ::cel::common::types::{DYN_TYPE, LIST_TYPE, STRING_TYPE};
use ::cel::common::value::{CowVal, Val};
use ::cel::objects::{Key, Map, Opaque};
use ::cel::{Env, ExecutionError, Value};

/// Wraps a function over plain `Value`s as an overload.
macro_rules! overload {
    ($f:path) => {{
        fn wrapped<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Result<CowVal<'b, 'v>, ExecutionError> {
            let vals = args
                .iter()
                .map(|a| Value::try_from(a.as_ref()))
                .collect::<Result<Vec<_>, _>>()?;
            let out = $f(&vals)?;
            let boxed: Box<dyn Val> = out.try_into()?;
            Ok(CowVal::Owned(boxed))
        }
        wrapped as Function
    }};
}

/// Registers the libraries; a clash with an existing overload is skipped.
pub(super) fn register(env: &mut Env) {
    let _ = env.add_extension(::cel::extensions::lists);
    let list = || LIST_TYPE;
    let members: Vec<(
        &str,
        ::cel::common::types::Type,
        Vec<::cel::common::types::Type>,
        Function,
    )> = vec![
        ("isSorted", list(), vec![], overload!(is_sorted)),
        ("sum", list(), vec![], overload!(sum)),
        ("min", list(), vec![], overload!(list_min)),
        ("max", list(), vec![], overload!(list_max)),
        ("indexOf", list(), vec![DYN_TYPE], overload!(list_index_of)),
        (
            "lastIndexOf",
            list(),
            vec![DYN_TYPE],
            overload!(list_last_index_of),
        ),
        ("find", STRING_TYPE, vec![STRING_TYPE], overload!(find)),
        (
            "findAll",
            STRING_TYPE,
            vec![STRING_TYPE],
            overload!(find_all),
        ),
        (
            "findAll",
            STRING_TYPE,
            vec![STRING_TYPE, DYN_TYPE],
            overload!(find_all),
        ),
        ("getScheme", DYN_TYPE, vec![], overload!(url_scheme)),
        ("getHost", DYN_TYPE, vec![], overload!(url_host)),
        ("getHostname", DYN_TYPE, vec![], overload!(url_hostname)),
        ("getPort", DYN_TYPE, vec![], overload!(url_port)),
        ("getEscapedPath", DYN_TYPE, vec![], overload!(url_path)),
        ("getQuery", DYN_TYPE, vec![], overload!(url_query)),
        ("sign", DYN_TYPE, vec![], overload!(q_sign)),
        ("isInteger", DYN_TYPE, vec![], overload!(q_is_integer)),
        ("asInteger", DYN_TYPE, vec![], overload!(q_as_integer)),
        (
            "asApproximateFloat",
            DYN_TYPE,
            vec![],
            overload!(q_as_float),
        ),
        ("add", DYN_TYPE, vec![DYN_TYPE], overload!(q_add)),
        ("sub", DYN_TYPE, vec![DYN_TYPE], overload!(q_sub)),
        ("isLessThan", DYN_TYPE, vec![DYN_TYPE], overload!(q_less)),
        (
            "isGreaterThan",
            DYN_TYPE,
            vec![DYN_TYPE],
            overload!(q_greater),
        ),
        ("compareTo", DYN_TYPE, vec![DYN_TYPE], overload!(q_compare)),
    ];
    for (name, target, args, f) in members {
        let id = format!("k8s_{name}_{}", args.len());
        let _ = env.add_member_overload(name, &id, target, args, f);
    }
    let globals: Vec<(&str, Function)> = vec![
        ("url", overload!(url)),
        ("isURL", overload!(is_url)),
        ("quantity", overload!(quantity)),
        ("isQuantity", overload!(is_quantity)),
    ];
    for (name, f) in globals {
        let _ = env.add_overload(name, &format!("k8s_{name}"), vec![STRING_TYPE], f);
    }
    register_format(env);
    register_net(env);
    register_semver_sets(env);
}

fn err(function: &str, msg: impl ToString) -> ExecutionError {
    ExecutionError::function_error(function, msg)
}

fn list_of<'a>(args: &'a [Value], function: &str) -> Result<&'a [Value], ExecutionError> {
    match args.first() {
        Some(Value::List(l)) => Ok(l.as_slice()),
        _ => Err(err(function, "receiver must be a list")),
    }
}

fn str_arg<'a>(args: &'a [Value], i: usize, function: &str) -> Result<&'a str, ExecutionError> {
    match args.get(i) {
        Some(Value::String(s)) => Ok(s.as_str()),
        _ => Err(err(function, "argument must be a string")),
    }
}

/// CEL ordering of comparable scalars (numbers across types, strings, bools,
/// bytes, durations, timestamps).
fn compare(a: &Value, b: &Value) -> Option<Ordering> {
    use Value::*;
    match (a, b) {
        (Int(x), Int(y)) => Some(x.cmp(y)),
        (UInt(x), UInt(y)) => Some(x.cmp(y)),
        (Float(x), Float(y)) => x.partial_cmp(y),
        (Int(x), UInt(y)) => Some((*x as i128).cmp(&(*y as i128))),
        (UInt(x), Int(y)) => Some((*x as i128).cmp(&(*y as i128))),
        (Int(x), Float(y)) => (*x as f64).partial_cmp(y),
        (Float(x), Int(y)) => x.partial_cmp(&(*y as f64)),
        (UInt(x), Float(y)) => (*x as f64).partial_cmp(y),
        (Float(x), UInt(y)) => x.partial_cmp(&(*y as f64)),
        (String(x), String(y)) => Some(x.cmp(y)),
        (Bool(x), Bool(y)) => Some(x.cmp(y)),
        (Bytes(x), Bytes(y)) => Some(x.cmp(y)),
        (Duration(x), Duration(y)) => Some(x.cmp(y)),
        (Timestamp(x), Timestamp(y)) => Some(x.cmp(y)),
        (Opaque(x), Opaque(y)) => match (
            x.as_ref().downcast_ref::<Quantity>(),
            y.as_ref().downcast_ref::<Quantity>(),
        ) {
            (Some(p), Some(q)) => Some(p.nano.cmp(&q.nano)),
            _ => None,
        },
        _ => None,
    }
}

fn is_sorted(args: &[Value]) -> Result<Value, ExecutionError> {
    let l = list_of(args, "isSorted")?;
    for w in l.windows(2) {
        match compare(&w[0], &w[1]) {
            Some(Ordering::Greater) => return Ok(Value::Bool(false)),
            Some(_) => {}
            None => return Err(err("isSorted", "list elements must be comparable")),
        }
    }
    Ok(Value::Bool(true))
}

fn sum(args: &[Value]) -> Result<Value, ExecutionError> {
    let l = list_of(args, "sum")?;
    let mut acc: Option<Value> = None;
    for v in l {
        acc = Some(match (acc, v) {
            (None, v) => v.clone(),
            (Some(Value::Int(a)), Value::Int(b)) => Value::Int(
                a.checked_add(*b)
                    .ok_or_else(|| err("sum", "integer overflow"))?,
            ),
            (Some(Value::UInt(a)), Value::UInt(b)) => Value::UInt(
                a.checked_add(*b)
                    .ok_or_else(|| err("sum", "integer overflow"))?,
            ),
            (Some(Value::Float(a)), Value::Float(b)) => Value::Float(a + b),
            (Some(Value::Duration(a)), Value::Duration(b)) => Value::Duration(a + *b),
            _ => return Err(err("sum", "list elements must be numbers of one type")),
        });
    }
    Ok(acc.unwrap_or(Value::Int(0)))
}

fn extreme(args: &[Value], function: &str, want: Ordering) -> Result<Value, ExecutionError> {
    let l = list_of(args, function)?;
    let mut best: Option<&Value> = None;
    for v in l {
        best = Some(match best {
            None => v,
            Some(b) => match compare(v, b) {
                Some(o) if o == want => v,
                Some(_) => b,
                None => return Err(err(function, "list elements must be comparable")),
            },
        });
    }
    best.cloned()
        .ok_or_else(|| err(function, format!("{function} called on empty list")))
}

fn list_min(args: &[Value]) -> Result<Value, ExecutionError> {
    extreme(args, "min", Ordering::Less)
}

fn list_max(args: &[Value]) -> Result<Value, ExecutionError> {
    extreme(args, "max", Ordering::Greater)
}

fn list_index_of(args: &[Value]) -> Result<Value, ExecutionError> {
    let l = list_of(args, "indexOf")?;
    let x = args.get(1).unwrap_or(&Value::Null);
    Ok(Value::Int(
        l.iter().position(|v| v == x).map_or(-1, |i| i as i64),
    ))
}

fn list_last_index_of(args: &[Value]) -> Result<Value, ExecutionError> {
    let l = list_of(args, "lastIndexOf")?;
    let x = args.get(1).unwrap_or(&Value::Null);
    Ok(Value::Int(
        l.iter().rposition(|v| v == x).map_or(-1, |i| i as i64),
    ))
}

/// Compiled regular expressions by pattern: rules run the same few patterns
/// on every object, so each is compiled once (the cache is bounded).
fn regex_of(pattern: &str, function: &str) -> Result<regex::Regex, ExecutionError> {
    use std::sync::{Mutex, OnceLock};
    static CACHE: OnceLock<Mutex<HashMap<String, regex::Regex>>> = OnceLock::new();
    let cache = CACHE.get_or_init(|| Mutex::new(HashMap::new()));
    if let Some(re) = cache.lock().ok().and_then(|c| c.get(pattern).cloned()) {
        return Ok(re);
    }
    let re = regex::Regex::new(pattern).map_err(|e| err(function, format!("{e}")))?;
    if let Ok(mut c) = cache.lock() {
        if c.len() >= 512 {
            c.clear();
        }
        c.insert(pattern.to_string(), re.clone());
    }
    Ok(re)
}

fn find(args: &[Value]) -> Result<Value, ExecutionError> {
    let s = str_arg(args, 0, "find")?;
    let re = regex_of(str_arg(args, 1, "find")?, "find")?;
    Ok(Value::String(Arc::new(
        re.find(s)
            .map(|m| m.as_str().to_string())
            .unwrap_or_default(),
    )))
}

fn find_all(args: &[Value]) -> Result<Value, ExecutionError> {
    let s = str_arg(args, 0, "findAll")?;
    let re = regex_of(str_arg(args, 1, "findAll")?, "findAll")?;
    let limit = match args.get(2) {
        Some(Value::Int(n)) if *n >= 0 => *n as usize,
        Some(Value::Int(_)) | None => usize::MAX,
        Some(_) => return Err(err("findAll", "limit must be an int")),
    };
    Ok(Value::List(Arc::new(
        re.find_iter(s)
            .take(limit)
            .map(|m| Value::String(Arc::new(m.as_str().to_string())))
            .collect(),
    )))
}

// --- url ---------------------------------------------------------------

/// A URL as Go's `url.ParseRequestURI` accepts it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Url {
    scheme: String,
    host: String,
    path: String,
    query: String,
}

impl Opaque for Url {
    fn runtime_type_name(&self) -> &str {
        "kubernetes.URL"
    }
}

fn parse_url(s: &str) -> Option<Url> {
    if s.is_empty() || s.chars().any(|c| c.is_control() || c == ' ') {
        return None;
    }
    let s = s.split('#').next().unwrap_or("");
    let (before_query, query) = match s.split_once('?') {
        Some((a, q)) => (a, q.to_string()),
        None => (s, String::new()),
    };
    if let Some(path) = before_query.strip_prefix('/') {
        return Some(Url {
            scheme: String::new(),
            host: String::new(),
            path: format!("/{path}"),
            query,
        });
    }
    let (scheme, rest) = before_query.split_once(':')?;
    let mut chars = scheme.chars();
    if !chars.next()?.is_ascii_alphabetic()
        || !chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.'))
    {
        return None;
    }
    let (host, path) = match rest.strip_prefix("//") {
        Some(auth) => {
            let (authority, path) = match auth.find('/') {
                Some(i) => (&auth[..i], &auth[i..]),
                None => (auth, ""),
            };
            let host = authority.rsplit('@').next().unwrap_or("");
            (host.to_string(), path.to_string())
        }
        None => {
            if !rest.starts_with('/') {
                return None;
            }
            (String::new(), rest.to_string())
        }
    };
    Some(Url {
        scheme: scheme.to_string(),
        host,
        path,
        query,
    })
}

fn url(args: &[Value]) -> Result<Value, ExecutionError> {
    let s = str_arg(args, 0, "url")?;
    parse_url(s)
        .map(|u| Value::Opaque(Arc::new(u)))
        .ok_or_else(|| {
            err(
                "url",
                format!("URL parse error during conversion from string: parse {s:?}: invalid URI for request"),
            )
        })
}

fn is_url(args: &[Value]) -> Result<Value, ExecutionError> {
    Ok(Value::Bool(parse_url(str_arg(args, 0, "isURL")?).is_some()))
}

fn url_of<'a>(args: &'a [Value], function: &str) -> Result<&'a Url, ExecutionError> {
    match args.first() {
        Some(Value::Opaque(o)) => o
            .as_ref()
            .downcast_ref::<Url>()
            .ok_or_else(|| err(function, "receiver must be a URL")),
        _ => Err(err(function, "receiver must be a URL")),
    }
}

fn string(s: impl Into<String>) -> Value {
    Value::String(Arc::new(s.into()))
}

fn split_host_port(host: &str) -> (&str, &str) {
    if let Some(rest) = host.strip_prefix('[') {
        if let Some((h, p)) = rest.split_once(']') {
            return (h, p.strip_prefix(':').unwrap_or(""));
        }
    }
    match host.rsplit_once(':') {
        Some((h, p)) if !h.contains(':') => (h, p),
        _ => (host, ""),
    }
}

fn url_scheme(args: &[Value]) -> Result<Value, ExecutionError> {
    Ok(string(url_of(args, "getScheme")?.scheme.clone()))
}

fn url_host(args: &[Value]) -> Result<Value, ExecutionError> {
    Ok(string(url_of(args, "getHost")?.host.clone()))
}

fn url_hostname(args: &[Value]) -> Result<Value, ExecutionError> {
    Ok(string(
        split_host_port(&url_of(args, "getHostname")?.host).0,
    ))
}

fn url_port(args: &[Value]) -> Result<Value, ExecutionError> {
    Ok(string(split_host_port(&url_of(args, "getPort")?.host).1))
}

fn url_path(args: &[Value]) -> Result<Value, ExecutionError> {
    Ok(string(url_of(args, "getEscapedPath")?.path.clone()))
}

fn url_query(args: &[Value]) -> Result<Value, ExecutionError> {
    let u = url_of(args, "getQuery")?;
    let mut out: HashMap<Key, Vec<Value>> = HashMap::new();
    for pair in u.query.split('&').filter(|p| !p.is_empty()) {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        out.entry(Key::String(Arc::new(k.to_string())))
            .or_default()
            .push(string(v));
    }
    let map: HashMap<Key, Value> = out
        .into_iter()
        .map(|(k, v)| (k, Value::List(Arc::new(v))))
        .collect();
    Ok(Value::Map(Map { map: Arc::new(map) }))
}

// --- quantity ------------------------------------------------------------

/// A Kubernetes quantity, held exactly in billionths.
#[derive(Debug, Clone)]
pub(crate) struct Quantity {
    pub(crate) nano: i128,
    text: String,
}

impl PartialEq for Quantity {
    fn eq(&self, other: &Self) -> bool {
        self.nano == other.nano
    }
}
impl Eq for Quantity {}

impl Opaque for Quantity {
    fn runtime_type_name(&self) -> &str {
        "kubernetes.Quantity"
    }
}

const NANO: i128 = 1_000_000_000;

/// Parses a quantity as `resource.ParseQuantity` does (skiff_helpers'
/// one definition), keeping the text it was written as.
pub(crate) fn cel_quantity(s: &str) -> Result<Quantity, String> {
    let q = skiff_helpers::Quantity::parse(s).map_err(|e| e.to_string())?;
    Ok(Quantity {
        nano: q.nano(),
        text: s.to_string(),
    })
}

/// A computed quantity's text: its canonical form.
fn format_nano(nano: i128) -> String {
    skiff_helpers::Quantity::from_nano(nano, skiff_helpers::quantity::Format::DecimalSI).canonical()
}

fn quantity(args: &[Value]) -> Result<Value, ExecutionError> {
    let q = cel_quantity(str_arg(args, 0, "quantity")?).map_err(|e| err("quantity", e))?;
    Ok(Value::Opaque(Arc::new(q)))
}

fn is_quantity(args: &[Value]) -> Result<Value, ExecutionError> {
    Ok(Value::Bool(
        cel_quantity(str_arg(args, 0, "isQuantity")?).is_ok(),
    ))
}

fn q_at(args: &[Value], i: usize, function: &str) -> Result<i128, ExecutionError> {
    match args.get(i) {
        Some(Value::Opaque(o)) => o
            .as_ref()
            .downcast_ref::<Quantity>()
            .map(|q| q.nano)
            .ok_or_else(|| err(function, "argument must be a quantity")),
        Some(Value::Int(n)) if i > 0 => Ok(*n as i128 * NANO),
        _ => Err(err(function, "argument must be a quantity")),
    }
}

fn q_value(nano: i128) -> Value {
    Value::Opaque(Arc::new(Quantity {
        nano,
        text: format_nano(nano),
    }))
}

fn q_sign(args: &[Value]) -> Result<Value, ExecutionError> {
    Ok(Value::Int(q_at(args, 0, "sign")?.signum() as i64))
}

fn q_is_integer(args: &[Value]) -> Result<Value, ExecutionError> {
    let n = q_at(args, 0, "isInteger")?;
    Ok(Value::Bool(
        n % NANO == 0 && i64::try_from(n / NANO).is_ok(),
    ))
}

fn q_as_integer(args: &[Value]) -> Result<Value, ExecutionError> {
    let n = q_at(args, 0, "asInteger")?;
    if n % NANO != 0 {
        return Err(err("asInteger", "cannot convert value to integer"));
    }
    i64::try_from(n / NANO)
        .map(Value::Int)
        .map_err(|_| err("asInteger", "cannot convert value to integer"))
}

fn q_as_float(args: &[Value]) -> Result<Value, ExecutionError> {
    Ok(Value::Float(
        q_at(args, 0, "asApproximateFloat")? as f64 / NANO as f64,
    ))
}

fn q_add(args: &[Value]) -> Result<Value, ExecutionError> {
    let a = q_at(args, 0, "add")?;
    let b = q_at(args, 1, "add")?;
    Ok(q_value(
        a.checked_add(b).ok_or_else(|| err("add", "overflow"))?,
    ))
}

fn q_sub(args: &[Value]) -> Result<Value, ExecutionError> {
    let a = q_at(args, 0, "sub")?;
    let b = q_at(args, 1, "sub")?;
    Ok(q_value(
        a.checked_sub(b).ok_or_else(|| err("sub", "overflow"))?,
    ))
}

/// The ordering of two quantities, or of two semantic versions.
fn ordering(args: &[Value], function: &str) -> Result<Ordering, ExecutionError> {
    if let (Some(a), Some(b)) = (semver_at(args, 0), semver_at(args, 1)) {
        return Ok(a.cmp(&b));
    }
    Ok(q_at(args, 0, function)?.cmp(&q_at(args, 1, function)?))
}

fn q_less(args: &[Value]) -> Result<Value, ExecutionError> {
    Ok(Value::Bool(ordering(args, "isLessThan")? == Ordering::Less))
}

fn q_greater(args: &[Value]) -> Result<Value, ExecutionError> {
    Ok(Value::Bool(
        ordering(args, "isGreaterThan")? == Ordering::Greater,
    ))
}

fn q_compare(args: &[Value]) -> Result<Value, ExecutionError> {
    Ok(Value::Int(ordering(args, "compareTo")? as i64))
}

// --- semver ------------------------------------------------------------------

/// A semantic version of Kubernetes' semver library (pre-release ordered,
/// build metadata ignored).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Semver {
    major: u64,
    minor: u64,
    patch: u64,
    pre: Vec<String>,
    text: String,
}

impl Opaque for Semver {
    fn runtime_type_name(&self) -> &str {
        "kubernetes.Semver"
    }
}

impl Ord for Semver {
    fn cmp(&self, o: &Self) -> Ordering {
        (self.major, self.minor, self.patch)
            .cmp(&(o.major, o.minor, o.patch))
            .then_with(|| match (self.pre.is_empty(), o.pre.is_empty()) {
                (true, true) => Ordering::Equal,
                (true, false) => Ordering::Greater,
                (false, true) => Ordering::Less,
                (false, false) => {
                    for (a, b) in self.pre.iter().zip(&o.pre) {
                        let c = match (a.parse::<u64>(), b.parse::<u64>()) {
                            (Ok(x), Ok(y)) => x.cmp(&y),
                            (Ok(_), Err(_)) => Ordering::Less,
                            (Err(_), Ok(_)) => Ordering::Greater,
                            _ => a.cmp(b),
                        };
                        if c != Ordering::Equal {
                            return c;
                        }
                    }
                    self.pre.len().cmp(&o.pre.len())
                }
            })
    }
}

impl PartialOrd for Semver {
    fn partial_cmp(&self, o: &Self) -> Option<Ordering> {
        Some(self.cmp(o))
    }
}

/// Parses a version; with `normalize`, a leading `v` and missing minor or
/// patch parts are accepted, as `isSemver(s, true)` does.
fn parse_semver(s: &str, normalize: bool) -> Option<Semver> {
    let text = s.to_string();
    let mut s = s;
    if normalize {
        s = s.strip_prefix('v').unwrap_or(s);
    }
    let s = s.split('+').next()?;
    let (core, pre) = match s.split_once('-') {
        Some((c, p)) => (c, Some(p)),
        None => (s, None),
    };
    let mut parts: Vec<&str> = core.split('.').collect();
    if normalize {
        while parts.len() < 3 {
            parts.push("0");
        }
    }
    if parts.len() != 3 {
        return None;
    }
    let num = |p: &str| -> Option<u64> {
        if p.is_empty()
            || !p.bytes().all(|c| c.is_ascii_digit())
            || (p.len() > 1 && p.starts_with('0') && !normalize)
        {
            return None;
        }
        p.parse().ok()
    };
    let pre = match pre {
        Some(p) => {
            let ids: Vec<String> = p.split('.').map(str::to_string).collect();
            if ids
                .iter()
                .any(|i| i.is_empty() || !i.bytes().all(|c| c.is_ascii_alphanumeric() || c == b'-'))
            {
                return None;
            }
            ids
        }
        None => Vec::new(),
    };
    Some(Semver {
        major: num(parts[0])?,
        minor: num(parts[1])?,
        patch: num(parts[2])?,
        pre,
        text,
    })
}

fn semver_at(args: &[Value], i: usize) -> Option<Semver> {
    match args.get(i) {
        Some(Value::Opaque(o)) => o.as_ref().downcast_ref::<Semver>().cloned(),
        _ => None,
    }
}

fn semver_fn(args: &[Value]) -> Result<Value, ExecutionError> {
    let s = str_arg(args, 0, "semver")?;
    let normalize = matches!(args.get(1), Some(Value::Bool(true)));
    parse_semver(s, normalize)
        .map(|v| Value::Opaque(Arc::new(v)))
        .ok_or_else(|| err("semver", format!("Invalid semver {s:?}")))
}

fn is_semver(args: &[Value]) -> Result<Value, ExecutionError> {
    let normalize = matches!(args.get(1), Some(Value::Bool(true)));
    Ok(Value::Bool(
        parse_semver(str_arg(args, 0, "isSemver")?, normalize).is_some(),
    ))
}

fn semver_part(args: &[Value], function: &str) -> Result<Value, ExecutionError> {
    let v = semver_at(args, 0).ok_or_else(|| err(function, "receiver must be a semver"))?;
    Ok(Value::Int(match function {
        "major" => v.major,
        "minor" => v.minor,
        _ => v.patch,
    } as i64))
}

fn semver_major(a: &[Value]) -> Result<Value, ExecutionError> {
    semver_part(a, "major")
}
fn semver_minor(a: &[Value]) -> Result<Value, ExecutionError> {
    semver_part(a, "minor")
}
fn semver_patch(a: &[Value]) -> Result<Value, ExecutionError> {
    semver_part(a, "patch")
}

// --- sets ----------------------------------------------------------------------

fn two_lists<'a>(
    args: &'a [Value],
    function: &str,
) -> Result<(&'a [Value], &'a [Value]), ExecutionError> {
    match (args.first(), args.get(1)) {
        (Some(Value::List(a)), Some(Value::List(b))) => Ok((a.as_slice(), b.as_slice())),
        _ => Err(err(function, "arguments must be lists")),
    }
}

fn sets_contains(args: &[Value]) -> Result<Value, ExecutionError> {
    let (a, b) = two_lists(args, "sets.contains")?;
    Ok(Value::Bool(b.iter().all(|x| a.contains(x))))
}

fn sets_equivalent(args: &[Value]) -> Result<Value, ExecutionError> {
    let (a, b) = two_lists(args, "sets.equivalent")?;
    Ok(Value::Bool(
        b.iter().all(|x| a.contains(x)) && a.iter().all(|x| b.contains(x)),
    ))
}

fn sets_intersects(args: &[Value]) -> Result<Value, ExecutionError> {
    let (a, b) = two_lists(args, "sets.intersects")?;
    Ok(Value::Bool(b.iter().any(|x| a.contains(x))))
}

/// Registers the semver and sets libraries.
pub(super) fn register_semver_sets(env: &mut Env) {
    use ::cel::common::types::BOOL_TYPE;
    let _ = env.add_overload(
        "semver",
        "k8s_semver",
        vec![STRING_TYPE],
        overload!(semver_fn),
    );
    let _ = env.add_overload(
        "semver",
        "k8s_semver_norm",
        vec![STRING_TYPE, BOOL_TYPE],
        overload!(semver_fn),
    );
    let _ = env.add_overload(
        "isSemver",
        "k8s_is_semver",
        vec![STRING_TYPE],
        overload!(is_semver),
    );
    let _ = env.add_overload(
        "isSemver",
        "k8s_is_semver_norm",
        vec![STRING_TYPE, BOOL_TYPE],
        overload!(is_semver),
    );
    for (name, f) in [
        ("major", overload!(semver_major)),
        ("minor", overload!(semver_minor)),
        ("patch", overload!(semver_patch)),
    ] {
        let _ = env.add_member_overload(name, &format!("k8s_semver_{name}"), DYN_TYPE, vec![], f);
    }
    for (name, f) in [
        ("sets.contains", overload!(sets_contains)),
        ("sets.equivalent", overload!(sets_equivalent)),
        ("sets.intersects", overload!(sets_intersects)),
    ] {
        let _ = env.add_overload(name, &format!("k8s_{name}"), vec![LIST_TYPE, LIST_TYPE], f);
    }
}

/// JSON for opaque values: quantities and URLs by their string form.
pub(super) fn opaque_to_json(o: &dyn Opaque) -> serde_json::Value {
    if let Some(q) = o.downcast_ref::<Quantity>() {
        return serde_json::Value::String(q.text.clone());
    }
    if let Some(v) = o.downcast_ref::<Semver>() {
        return serde_json::Value::String(v.text.clone());
    }
    if let Some(ip) = o.downcast_ref::<Ip>() {
        return serde_json::Value::String(ip.0.to_string());
    }
    if let Some(c) = o.downcast_ref::<Cidr>() {
        return serde_json::Value::String(format!("{}/{}", c.addr, c.prefix));
    }
    if let Some(u) = o.downcast_ref::<Url>() {
        let mut s = String::new();
        if !u.scheme.is_empty() {
            s.push_str(&u.scheme);
            s.push_str("://");
        }
        s.push_str(&u.host);
        s.push_str(&u.path);
        if !u.query.is_empty() {
            s.push('?');
            s.push_str(&u.query);
        }
        return serde_json::Value::String(s);
    }
    serde_json::Value::Null
}

/// A duration as Go prints it (`1h2m3s`, `1.5s`).
pub(super) fn format_duration(d: chrono::Duration) -> String {
    let nanos = d.num_nanoseconds().unwrap_or(i64::MAX);
    if nanos == 0 {
        return "0s".to_string();
    }
    let neg = nanos < 0;
    let mut n = nanos.unsigned_abs();
    let h = n / 3_600_000_000_000;
    n %= 3_600_000_000_000;
    let m = n / 60_000_000_000;
    n %= 60_000_000_000;
    let secs = n as f64 / 1e9;
    let mut out = String::new();
    if neg {
        out.push('-');
    }
    if h > 0 {
        out.push_str(&format!("{h}h"));
    }
    if h > 0 || m > 0 {
        out.push_str(&format!("{m}m"));
    }
    out.push_str(&format!("{secs}s"));
    out
}

// --- format ----------------------------------------------------------------

/// A named string format of Kubernetes' format library.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Format(&'static str);

impl Opaque for Format {
    fn runtime_type_name(&self) -> &str {
        "kubernetes.NamedFormat"
    }
}

const FORMATS: &[&str] = &[
    "dns1123Label",
    "dns1123Subdomain",
    "dns1035Label",
    "qualifiedName",
    "dns1123LabelPrefix",
    "dns1123SubdomainPrefix",
    "dns1035LabelPrefix",
    "labelValue",
    "uri",
    "uuid",
    "byte",
    "date",
    "datetime",
];

fn format_named(args: &[Value]) -> Result<Value, ExecutionError> {
    let name = str_arg(args, 0, "format.named")?;
    Ok(match FORMATS.iter().find(|f| **f == name) {
        Some(f) => Value::Opaque(Arc::new(::cel::objects::OptionalValue::of(Value::Opaque(
            Arc::new(Format(f)),
        )))),
        None => Value::Opaque(Arc::new(::cel::objects::OptionalValue::none())),
    })
}

macro_rules! format_ctor {
    ($($fname:ident => $name:literal),* $(,)?) => {
        $(fn $fname(_: &[Value]) -> Result<Value, ExecutionError> {
            Ok(Value::Opaque(Arc::new(Format($name))))
        })*
        fn format_ctors() -> Vec<(&'static str, Function)> {
            vec![$((concat!("format.", $name), overload!($fname))),*]
        }
    };
}

format_ctor! {
    f_dns1123_label => "dns1123Label",
    f_dns1123_subdomain => "dns1123Subdomain",
    f_dns1035_label => "dns1035Label",
    f_qualified_name => "qualifiedName",
    f_dns1123_label_prefix => "dns1123LabelPrefix",
    f_dns1123_subdomain_prefix => "dns1123SubdomainPrefix",
    f_dns1035_label_prefix => "dns1035LabelPrefix",
    f_label_value => "labelValue",
    f_uri => "uri",
    f_uuid => "uuid",
    f_byte => "byte",
    f_date => "date",
    f_datetime => "datetime",
}

/// Registers the format library (`format.dns1123Label()`, `format.named()`,
/// `<Format>.validate(string)`).
pub(super) fn register_format(env: &mut Env) {
    for (name, f) in format_ctors() {
        let _ = env.add_overload(name, &format!("k8s_{name}"), vec![], f);
    }
    let _ = env.add_overload(
        "format.named",
        "k8s_format_named",
        vec![STRING_TYPE],
        overload!(format_named),
    );
    let _ = env.add_member_overload(
        "validate",
        "k8s_format_validate",
        DYN_TYPE,
        vec![STRING_TYPE],
        overload!(format_validate),
    );
}

const DNS1123_LABEL_MSG: &str = "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and end with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?')";
const DNS1123_SUBDOMAIN_MSG: &str = "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character (e.g. 'example.com', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')";
const DNS1035_LABEL_MSG: &str = "a DNS-1035 label must consist of lower case alphanumeric characters or '-', start with an alphabetic character, and end with an alphanumeric character (e.g. 'my-name',  or 'abc-123', regex used for validation is '[a-z]([-a-z0-9]*[a-z0-9])?')";

fn label_ok(s: &str, first_alpha: bool) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.iter()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
        && (if first_alpha {
            b[0].is_ascii_lowercase()
        } else {
            b[0] != b'-'
        })
        && b[b.len() - 1] != b'-'
}

fn max_len(s: &str, n: usize, out: &mut Vec<String>) {
    if s.len() > n {
        out.push(format!("must be no more than {n} characters"));
    }
}

fn validate_format(f: &str, s: &str) -> Vec<String> {
    let mut out = Vec::new();
    // The prefix formats accept a trailing '-' (generateName prefixes).
    let (f, s) = match f.strip_suffix("Prefix") {
        Some(base) => (base, s.strip_suffix('-').unwrap_or(s)),
        None => (f, s),
    };
    match f {
        "dns1123Label" => {
            max_len(s, 63, &mut out);
            if !label_ok(s, false) {
                out.push(DNS1123_LABEL_MSG.to_string());
            }
        }
        "dns1035Label" => {
            max_len(s, 63, &mut out);
            if !label_ok(s, true) {
                out.push(DNS1035_LABEL_MSG.to_string());
            }
        }
        "dns1123Subdomain" => {
            max_len(s, 253, &mut out);
            if s.is_empty() || !s.split('.').all(|l| label_ok(l, false)) {
                out.push(DNS1123_SUBDOMAIN_MSG.to_string());
            }
        }
        "qualifiedName" | "labelValue" => {
            let (prefix, name) = match (f, s.split_once('/')) {
                ("qualifiedName", Some((p, n))) => (Some(p), n),
                _ => (None, s),
            };
            if let Some(p) = prefix {
                if p.is_empty() {
                    out.push("prefix part must be non-empty".to_string());
                } else if !p.split('.').all(|l| label_ok(l, false)) || p.len() > 253 {
                    out.push(format!("prefix part {DNS1123_SUBDOMAIN_MSG}"));
                }
            }
            let ok_chars = name
                .bytes()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.'));
            let ends_ok = name
                .bytes()
                .next()
                .is_some_and(|c| c.is_ascii_alphanumeric())
                && name
                    .bytes()
                    .last()
                    .is_some_and(|c| c.is_ascii_alphanumeric());
            if f == "labelValue" && name.is_empty() {
                return out;
            }
            if name.len() > 63 {
                out.push("name part must be no more than 63 characters".to_string());
            }
            if !ok_chars || !ends_ok {
                out.push("name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex used for validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]')".to_string());
            }
        }
        "uri" if parse_url(s).is_none() => out.push("invalid URI".to_string()),
        "uuid" | "byte" | "date" | "datetime" => {
            let name = if f == "datetime" { "date-time" } else { f };
            if !crate::crd_schema::format_valid(name, s) {
                out.push(format!("does not match format {f}"));
            }
        }
        _ => {}
    }
    out
}

fn format_validate(args: &[Value]) -> Result<Value, ExecutionError> {
    let f = match args.first() {
        Some(Value::Opaque(o)) => o
            .as_ref()
            .downcast_ref::<Format>()
            .ok_or_else(|| err("validate", "receiver must be a format"))?,
        _ => return Err(err("validate", "receiver must be a format")),
    };
    let errs = validate_format(f.0, str_arg(args, 1, "validate")?);
    Ok(Value::Opaque(Arc::new(if errs.is_empty() {
        ::cel::objects::OptionalValue::none()
    } else {
        ::cel::objects::OptionalValue::of(Value::List(Arc::new(
            errs.into_iter().map(string).collect(),
        )))
    })))
}

// --- ip and cidr -------------------------------------------------------------

/// An IP address of Kubernetes' IP library.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Ip(std::net::IpAddr);

impl Opaque for Ip {
    fn runtime_type_name(&self) -> &str {
        "net.IP"
    }
}

/// A CIDR of Kubernetes' CIDR library: the address as written and its prefix.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Cidr {
    addr: std::net::IpAddr,
    prefix: u8,
}

impl Opaque for Cidr {
    fn runtime_type_name(&self) -> &str {
        "net.CIDR"
    }
}

/// Parses an IP as Kubernetes' `ip()` does: no zones, no IPv4-mapped IPv6.
fn parse_ip(s: &str) -> Option<std::net::IpAddr> {
    if s.contains('%') {
        return None;
    }
    let ip: std::net::IpAddr = s.parse().ok()?;
    if let std::net::IpAddr::V6(v6) = ip {
        if v6.to_ipv4_mapped().is_some() {
            return None;
        }
    }
    Some(ip)
}

fn parse_cidr(s: &str) -> Option<Cidr> {
    let (a, p) = s.split_once('/')?;
    let addr = parse_ip(a)?;
    if p.is_empty() || p.len() > 3 || !p.bytes().all(|c| c.is_ascii_digit()) {
        return None;
    }
    let prefix: u8 = p.parse().ok()?;
    let max = if addr.is_ipv4() { 32 } else { 128 };
    (prefix <= max).then_some(Cidr { addr, prefix })
}

fn ip_bits(ip: &std::net::IpAddr) -> (u128, u8) {
    match ip {
        std::net::IpAddr::V4(v4) => (u32::from(*v4) as u128, 32),
        std::net::IpAddr::V6(v6) => (u128::from(*v6), 128),
    }
}

fn masked(c: &Cidr) -> std::net::IpAddr {
    let (bits, width) = ip_bits(&c.addr);
    let host = width - c.prefix;
    let mask = if host >= 128 { 0 } else { !0u128 << host };
    let net = bits & mask;
    match c.addr {
        std::net::IpAddr::V4(_) => std::net::IpAddr::V4(std::net::Ipv4Addr::from(net as u32)),
        std::net::IpAddr::V6(_) => std::net::IpAddr::V6(std::net::Ipv6Addr::from(net)),
    }
}

fn contains(c: &Cidr, ip: &std::net::IpAddr) -> bool {
    if c.addr.is_ipv4() != ip.is_ipv4() {
        return false;
    }
    let inner = Cidr {
        addr: *ip,
        prefix: c.prefix,
    };
    masked(&inner) == masked(c)
}

fn ip_at(args: &[Value], i: usize, function: &str) -> Result<std::net::IpAddr, ExecutionError> {
    match args.get(i) {
        Some(Value::Opaque(o)) => o
            .as_ref()
            .downcast_ref::<Ip>()
            .map(|ip| ip.0)
            .ok_or_else(|| err(function, "argument must be an IP")),
        Some(Value::String(s)) => parse_ip(s).ok_or_else(|| {
            err(
                function,
                format!("IP Address {s:?} parse error during conversion from string"),
            )
        }),
        _ => Err(err(function, "argument must be an IP")),
    }
}

fn cidr_at(args: &[Value], i: usize, function: &str) -> Result<Cidr, ExecutionError> {
    match args.get(i) {
        Some(Value::Opaque(o)) => o
            .as_ref()
            .downcast_ref::<Cidr>()
            .cloned()
            .ok_or_else(|| err(function, "argument must be a CIDR")),
        Some(Value::String(s)) => parse_cidr(s).ok_or_else(|| {
            err(
                function,
                format!("network address {s:?} parse error during conversion from string"),
            )
        }),
        _ => Err(err(function, "argument must be a CIDR")),
    }
}

fn ip_fn(args: &[Value]) -> Result<Value, ExecutionError> {
    let s = str_arg(args, 0, "ip")?;
    parse_ip(s)
        .map(|ip| Value::Opaque(Arc::new(Ip(ip))))
        .ok_or_else(|| {
            err(
                "ip",
                format!("IP Address {s:?} parse error during conversion from string"),
            )
        })
}

fn is_ip(args: &[Value]) -> Result<Value, ExecutionError> {
    Ok(Value::Bool(parse_ip(str_arg(args, 0, "isIP")?).is_some()))
}

fn ip_is_canonical(args: &[Value]) -> Result<Value, ExecutionError> {
    let s = str_arg(args, 0, "ip.isCanonical")?;
    let ip = parse_ip(s).ok_or_else(|| {
        err(
            "ip.isCanonical",
            format!("IP Address {s:?} parse error during conversion from string"),
        )
    })?;
    Ok(Value::Bool(ip.to_string() == s))
}

fn cidr_fn(args: &[Value]) -> Result<Value, ExecutionError> {
    let c = cidr_at(args, 0, "cidr")?;
    Ok(Value::Opaque(Arc::new(c)))
}

fn is_cidr(args: &[Value]) -> Result<Value, ExecutionError> {
    Ok(Value::Bool(
        parse_cidr(str_arg(args, 0, "isCIDR")?).is_some(),
    ))
}

fn ip_family(args: &[Value]) -> Result<Value, ExecutionError> {
    Ok(Value::Int(if ip_at(args, 0, "family")?.is_ipv4() {
        4
    } else {
        6
    }))
}

fn ip_predicate(args: &[Value], function: &str) -> Result<Value, ExecutionError> {
    use std::net::IpAddr;
    let ip = ip_at(args, 0, function)?;
    let b = match (function, ip) {
        ("isUnspecified", ip) => ip.is_unspecified(),
        ("isLoopback", ip) => ip.is_loopback(),
        ("isLinkLocalMulticast", IpAddr::V4(v4)) => {
            v4.octets()[0] == 224 && v4.octets()[1] == 0 && v4.octets()[2] == 0
        }
        ("isLinkLocalMulticast", IpAddr::V6(v6)) => v6.segments()[0] & 0xff0f == 0xff02,
        ("isLinkLocalUnicast", IpAddr::V4(v4)) => v4.is_link_local(),
        ("isLinkLocalUnicast", IpAddr::V6(v6)) => v6.segments()[0] & 0xffc0 == 0xfe80,
        ("isGlobalUnicast", IpAddr::V4(v4)) => {
            !(v4.is_unspecified()
                || v4.is_loopback()
                || v4.is_link_local()
                || v4.is_multicast()
                || v4.is_broadcast())
        }
        ("isGlobalUnicast", IpAddr::V6(v6)) => {
            !(v6.is_unspecified()
                || v6.is_loopback()
                || v6.is_multicast()
                || v6.segments()[0] & 0xffc0 == 0xfe80)
        }
        _ => false,
    };
    Ok(Value::Bool(b))
}

fn is_unspecified(a: &[Value]) -> Result<Value, ExecutionError> {
    ip_predicate(a, "isUnspecified")
}
fn is_loopback(a: &[Value]) -> Result<Value, ExecutionError> {
    ip_predicate(a, "isLoopback")
}
fn is_link_local_multicast(a: &[Value]) -> Result<Value, ExecutionError> {
    ip_predicate(a, "isLinkLocalMulticast")
}
fn is_link_local_unicast(a: &[Value]) -> Result<Value, ExecutionError> {
    ip_predicate(a, "isLinkLocalUnicast")
}
fn is_global_unicast(a: &[Value]) -> Result<Value, ExecutionError> {
    ip_predicate(a, "isGlobalUnicast")
}

fn cidr_contains_ip(args: &[Value]) -> Result<Value, ExecutionError> {
    let c = cidr_at(args, 0, "containsIP")?;
    let ip = ip_at(args, 1, "containsIP")?;
    Ok(Value::Bool(contains(&c, &ip)))
}

fn cidr_contains_cidr(args: &[Value]) -> Result<Value, ExecutionError> {
    let c = cidr_at(args, 0, "containsCIDR")?;
    let other = cidr_at(args, 1, "containsCIDR")?;
    Ok(Value::Bool(
        other.prefix >= c.prefix && contains(&c, &other.addr),
    ))
}

fn cidr_ip(args: &[Value]) -> Result<Value, ExecutionError> {
    Ok(Value::Opaque(Arc::new(Ip(cidr_at(args, 0, "ip")?.addr))))
}

fn cidr_masked(args: &[Value]) -> Result<Value, ExecutionError> {
    let c = cidr_at(args, 0, "masked")?;
    Ok(Value::Opaque(Arc::new(Cidr {
        addr: masked(&c),
        prefix: c.prefix,
    })))
}

fn cidr_prefix_length(args: &[Value]) -> Result<Value, ExecutionError> {
    Ok(Value::Int(cidr_at(args, 0, "prefixLength")?.prefix as i64))
}

fn opaque_string(args: &[Value]) -> Result<Value, ExecutionError> {
    match args.first() {
        Some(Value::Opaque(o)) => match opaque_to_json(o.as_ref()) {
            serde_json::Value::String(s) => Ok(string(s)),
            _ => Err(err("string", "no string form")),
        },
        _ => Err(err("string", "unsupported type")),
    }
}

/// Registers the IP and CIDR libraries.
pub(super) fn register_net(env: &mut Env) {
    let globals: Vec<(&str, Function)> = vec![
        ("ip", overload!(ip_fn)),
        ("isIP", overload!(is_ip)),
        ("ip.isCanonical", overload!(ip_is_canonical)),
        ("cidr", overload!(cidr_fn)),
        ("isCIDR", overload!(is_cidr)),
    ];
    for (name, f) in globals {
        let _ = env.add_overload(name, &format!("k8s_{name}"), vec![STRING_TYPE], f);
    }
    let _ = env.add_overload(
        "string",
        "k8s_string_opaque",
        vec![DYN_TYPE],
        overload!(opaque_string),
    );
    let members: Vec<(&str, usize, Function)> = vec![
        ("family", 0, overload!(ip_family)),
        ("isUnspecified", 0, overload!(is_unspecified)),
        ("isLoopback", 0, overload!(is_loopback)),
        (
            "isLinkLocalMulticast",
            0,
            overload!(is_link_local_multicast),
        ),
        ("isLinkLocalUnicast", 0, overload!(is_link_local_unicast)),
        ("isGlobalUnicast", 0, overload!(is_global_unicast)),
        ("containsIP", 1, overload!(cidr_contains_ip)),
        ("containsCIDR", 1, overload!(cidr_contains_cidr)),
        ("ip", 0, overload!(cidr_ip)),
        ("masked", 0, overload!(cidr_masked)),
        ("prefixLength", 0, overload!(cidr_prefix_length)),
    ];
    for (name, n, f) in members {
        let _ = env.add_member_overload(
            name,
            &format!("k8s_m_{name}"),
            DYN_TYPE,
            (0..n).map(|_| DYN_TYPE).collect(),
            f,
        );
    }
}
