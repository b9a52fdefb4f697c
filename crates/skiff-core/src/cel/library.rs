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

fn regex_of(pattern: &str, function: &str) -> Result<regex::Regex, ExecutionError> {
    regex::Regex::new(pattern).map_err(|e| err(function, format!("{e}")))
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

/// Parses a quantity exactly as `resource.ParseQuantity` accepts it
/// (values below a billionth round up, as Kubernetes rounds).
pub(crate) fn parse_quantity(s: &str) -> Result<Quantity, String> {
    let bad = || {
        "quantities must match the regular expression '^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'"
            .to_string()
    };
    if s.is_empty() || s.len() > 100 {
        return Err(bad());
    }
    let (neg, body) = match s.as_bytes()[0] {
        b'-' => (true, &s[1..]),
        b'+' => (false, &s[1..]),
        _ => (false, s),
    };
    let split = body
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(body.len());
    let (num, suffix) = body.split_at(split);
    if num.is_empty() || num == "." || num.matches('.').count() > 1 {
        return Err(bad());
    }
    let (int_part, frac_part) = num.split_once('.').unwrap_or((num, ""));
    // mantissa as an integer with `scale` decimal digits
    let digits = format!("{int_part}{frac_part}");
    let digits = digits.trim_start_matches('0');
    if digits.len() > 30 {
        return Err(bad());
    }
    let mantissa: i128 = if digits.is_empty() {
        0
    } else {
        digits.parse().map_err(|_| bad())?
    };
    let scale = frac_part.len() as i32;
    // multiplier: (base, exponent) for 10^exp or 2^exp
    let (base2, exp): (bool, i32) = match suffix {
        "" => (false, 0),
        "n" => (false, -9),
        "u" => (false, -6),
        "m" => (false, -3),
        "k" => (false, 3),
        "M" => (false, 6),
        "G" => (false, 9),
        "T" => (false, 12),
        "P" => (false, 15),
        "E" => (false, 18),
        "Ki" => (true, 10),
        "Mi" => (true, 20),
        "Gi" => (true, 30),
        "Ti" => (true, 40),
        "Pi" => (true, 50),
        "Ei" => (true, 60),
        e if e.starts_with(['e', 'E']) => {
            let x: i32 = e[1..].parse().map_err(|_| bad())?;
            if !(-40..=40).contains(&x) {
                return Err(bad());
            }
            (false, x)
        }
        _ => return Err(bad()),
    };
    let overflow = || "quantity is too large".to_string();
    // nano = mantissa * 10^(9 - scale) * multiplier
    let mut nano = mantissa;
    let mut ten_exp = 9 - scale;
    if base2 {
        nano = nano.checked_mul(1i128 << exp).ok_or_else(overflow)?;
    } else {
        ten_exp += exp;
    }
    if ten_exp >= 0 {
        nano = nano
            .checked_mul(10i128.checked_pow(ten_exp as u32).ok_or_else(overflow)?)
            .ok_or_else(overflow)?;
    } else {
        let d = 10i128.checked_pow((-ten_exp) as u32).unwrap_or(i128::MAX);
        nano = if nano % d == 0 {
            nano / d
        } else {
            nano / d + 1
        };
    }
    if neg {
        nano = -nano;
    }
    Ok(Quantity {
        nano,
        text: s.to_string(),
    })
}

fn format_nano(nano: i128) -> String {
    if nano % NANO == 0 {
        return (nano / NANO).to_string();
    }
    if nano % 1_000_000 == 0 {
        return format!("{}m", nano / 1_000_000);
    }
    if nano % 1_000 == 0 {
        return format!("{}u", nano / 1_000);
    }
    format!("{nano}n")
}

fn quantity(args: &[Value]) -> Result<Value, ExecutionError> {
    let q = parse_quantity(str_arg(args, 0, "quantity")?).map_err(|e| err("quantity", e))?;
    Ok(Value::Opaque(Arc::new(q)))
}

fn is_quantity(args: &[Value]) -> Result<Value, ExecutionError> {
    Ok(Value::Bool(
        parse_quantity(str_arg(args, 0, "isQuantity")?).is_ok(),
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

fn q_less(args: &[Value]) -> Result<Value, ExecutionError> {
    Ok(Value::Bool(
        q_at(args, 0, "isLessThan")? < q_at(args, 1, "isLessThan")?,
    ))
}

fn q_greater(args: &[Value]) -> Result<Value, ExecutionError> {
    Ok(Value::Bool(
        q_at(args, 0, "isGreaterThan")? > q_at(args, 1, "isGreaterThan")?,
    ))
}

fn q_compare(args: &[Value]) -> Result<Value, ExecutionError> {
    let o = q_at(args, 0, "compareTo")?.cmp(&q_at(args, 1, "compareTo")?);
    Ok(Value::Int(o as i64))
}

/// JSON for opaque values: quantities and URLs by their string form.
pub(super) fn opaque_to_json(o: &dyn Opaque) -> serde_json::Value {
    if let Some(q) = o.downcast_ref::<Quantity>() {
        return serde_json::Value::String(q.text.clone());
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
