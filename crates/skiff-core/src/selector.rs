//! Label selectors and field selectors, parsed and matched as Kubernetes does.

use serde_json::{Map, Value};

#[derive(Debug, Clone, PartialEq, Eq)]
enum Op {
    Eq,
    NotEq,
    In,
    NotIn,
    Exists,
    DoesNotExist,
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct Requirement {
    key: String,
    op: Op,
    values: Vec<String>,
}

impl Requirement {
    fn matches(&self, labels: &Map<String, Value>) -> bool {
        let v = labels.get(&self.key).and_then(Value::as_str);
        match self.op {
            Op::Eq | Op::In => v
                .map(|v| self.values.iter().any(|x| x == v))
                .unwrap_or(false),
            Op::NotEq | Op::NotIn => v
                .map(|v| !self.values.iter().any(|x| x == v))
                .unwrap_or(true),
            Op::Exists => v.is_some(),
            Op::DoesNotExist => v.is_none(),
        }
    }
}

/// A label selector: requirements that must all hold.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LabelSelector {
    reqs: Vec<Requirement>,
}

fn is_name_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '-' || c == '_' || c == '.'
}

/// Validates a label key (`[prefix/]name`) as Kubernetes does.
pub fn validate_label_key(key: &str) -> Result<(), String> {
    let (prefix, name) = match key.rsplit_once('/') {
        Some((p, n)) => (Some(p), n),
        None => (None, key),
    };
    if let Some(p) = prefix {
        if p.is_empty() || p.len() > 253 || !crate::meta::is_dns1123_subdomain(p) {
            return Err(format!("invalid label key {key:?}: prefix part a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character"));
        }
    }
    if name.is_empty()
        || name.len() > 63
        || !name.chars().all(is_name_char)
        || !name.starts_with(|c: char| c.is_ascii_alphanumeric())
        || !name.ends_with(|c: char| c.is_ascii_alphanumeric())
    {
        return Err(format!("invalid label key {key:?}: name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex used for validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]')"));
    }
    Ok(())
}

/// Validates a label value as Kubernetes does (empty is allowed).
pub fn validate_label_value(v: &str) -> Result<(), String> {
    if v.is_empty() {
        return Ok(());
    }
    if v.len() > 63
        || !v.chars().all(is_name_char)
        || !v.starts_with(|c: char| c.is_ascii_alphanumeric())
        || !v.ends_with(|c: char| c.is_ascii_alphanumeric())
    {
        return Err(format!("invalid label value: {v:?}: at key: a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyValue',  or 'my_value',  or '12345', regex used for validation is '(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?')"));
    }
    Ok(())
}

struct Lexer<'a> {
    s: &'a [u8],
    i: usize,
}

impl<'a> Lexer<'a> {
    fn skip_ws(&mut self) {
        while self.i < self.s.len() && self.s[self.i].is_ascii_whitespace() {
            self.i += 1;
        }
    }
    fn peek(&mut self) -> Option<u8> {
        self.skip_ws();
        self.s.get(self.i).copied()
    }
    fn word(&mut self) -> String {
        self.skip_ws();
        let start = self.i;
        while self.i < self.s.len() {
            let c = self.s[self.i];
            if c.is_ascii_whitespace() || matches!(c, b',' | b'=' | b'!' | b'(' | b')') {
                break;
            }
            self.i += 1;
        }
        String::from_utf8_lossy(&self.s[start..self.i]).into_owned()
    }
    fn eat(&mut self, lit: &str) -> bool {
        self.skip_ws();
        if self.s[self.i..].starts_with(lit.as_bytes()) {
            self.i += lit.len();
            true
        } else {
            false
        }
    }
}

impl LabelSelector {
    /// Parses the string form (`a=b,c!=d,e in (x,y),!f`).
    pub fn parse(s: &str) -> Result<LabelSelector, String> {
        let mut lx = Lexer {
            s: s.as_bytes(),
            i: 0,
        };
        let mut reqs = Vec::new();
        if lx.peek().is_none() {
            return Ok(LabelSelector { reqs });
        }
        loop {
            let req = if lx.eat("!") {
                let key = lx.word();
                validate_label_key(&key)?;
                Requirement {
                    key,
                    op: Op::DoesNotExist,
                    values: vec![],
                }
            } else {
                let key = lx.word();
                if key.is_empty() {
                    return Err(format!(
                        "found '{}', expected: !, identifier, or 'end of string'",
                        lx.peek().map(|c| c as char).unwrap_or(' ')
                    ));
                }
                validate_label_key(&key)?;
                match lx.peek() {
                    None | Some(b',') => Requirement {
                        key,
                        op: Op::Exists,
                        values: vec![],
                    },
                    Some(b'=') => {
                        if !lx.eat("==") {
                            lx.eat("=");
                        }
                        let v = lx.word();
                        validate_label_value(&v)?;
                        Requirement {
                            key,
                            op: Op::Eq,
                            values: vec![v],
                        }
                    }
                    Some(b'!') => {
                        if !lx.eat("!=") {
                            return Err("found '!', expected: '=', '!=', '==', 'in', notin'".into());
                        }
                        let v = lx.word();
                        validate_label_value(&v)?;
                        Requirement {
                            key,
                            op: Op::NotEq,
                            values: vec![v],
                        }
                    }
                    _ => {
                        let op = match lx.word().as_str() {
                            "in" => Op::In,
                            "notin" => Op::NotIn,
                            other => {
                                return Err(format!(
                                    "found '{other}', expected: '=', '!=', '==', 'in', notin'"
                                ))
                            }
                        };
                        if !lx.eat("(") {
                            return Err("found '', expected: '('".into());
                        }
                        let mut values = Vec::new();
                        loop {
                            if lx.eat(")") {
                                break;
                            }
                            let v = lx.word();
                            validate_label_value(&v)?;
                            values.push(v);
                            if lx.eat(",") {
                                continue;
                            }
                            if lx.eat(")") {
                                break;
                            }
                            return Err("found '', expected: ',', ')'".into());
                        }
                        if values.is_empty() {
                            return Err(
                                "for 'in', 'notin' operators, values set can't be empty".into()
                            );
                        }
                        Requirement { key, op, values }
                    }
                }
            };
            reqs.push(req);
            match lx.peek() {
                None => break,
                Some(b',') => {
                    lx.eat(",");
                }
                Some(c) => {
                    return Err(format!(
                        "found '{}', expected: ',' or 'end of string'",
                        c as char
                    ))
                }
            }
        }
        Ok(LabelSelector { reqs })
    }

    /// Parses a `metav1.LabelSelector` object (`matchLabels`, `matchExpressions`).
    pub fn from_label_selector_json(v: &Value) -> Result<LabelSelector, String> {
        let mut reqs = Vec::new();
        if let Some(ml) = v.get("matchLabels").and_then(Value::as_object) {
            for (k, val) in ml {
                let val = val
                    .as_str()
                    .ok_or_else(|| format!("matchLabels[{k}] must be a string"))?;
                validate_label_key(k)?;
                validate_label_value(val)?;
                reqs.push(Requirement {
                    key: k.clone(),
                    op: Op::Eq,
                    values: vec![val.to_string()],
                });
            }
        }
        if let Some(exprs) = v.get("matchExpressions").and_then(Value::as_array) {
            for e in exprs {
                let key = e
                    .get("key")
                    .and_then(Value::as_str)
                    .unwrap_or("")
                    .to_string();
                validate_label_key(&key)?;
                let values: Vec<String> = e
                    .get("values")
                    .and_then(Value::as_array)
                    .map(|a| {
                        a.iter()
                            .filter_map(|x| x.as_str().map(str::to_string))
                            .collect()
                    })
                    .unwrap_or_default();
                let op = match e.get("operator").and_then(Value::as_str).unwrap_or("") {
                    "In" => Op::In,
                    "NotIn" => Op::NotIn,
                    "Exists" => Op::Exists,
                    "DoesNotExist" => Op::DoesNotExist,
                    other => {
                        return Err(format!("{other:?} is not a valid label selector operator"))
                    }
                };
                if matches!(op, Op::In | Op::NotIn) && values.is_empty() {
                    return Err("for 'in', 'notin' operators, values set can't be empty".into());
                }
                reqs.push(Requirement { key, op, values });
            }
        }
        Ok(LabelSelector { reqs })
    }

    /// Whether the labels satisfy every requirement (an empty selector matches all).
    pub fn matches(&self, labels: &Map<String, Value>) -> bool {
        self.reqs.iter().all(|r| r.matches(labels))
    }

    pub fn is_empty(&self) -> bool {
        self.reqs.is_empty()
    }

    /// `(key, value)` of each requirement that only one value satisfies
    /// (`k=v`, `k==v`, `k in (v)`): what a watch can be indexed by.
    pub fn exact_terms(&self) -> impl Iterator<Item = (&str, &str)> {
        self.reqs
            .iter()
            .filter_map(|r| match (&r.op, r.values.as_slice()) {
                (Op::Eq | Op::In, [v]) => Some((r.key.as_str(), v.as_str())),
                _ => None,
            })
    }
}

/// A field selector: `field=value` / `field!=value` requirements, all of which hold.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FieldSelector {
    reqs: Vec<(String, bool, String)>,
}

impl FieldSelector {
    /// Parses `a=b,c!=d` (`==` too; `\,`, `\=` and `\\` escape).
    pub fn parse(s: &str) -> Result<FieldSelector, String> {
        let mut reqs = Vec::new();
        let mut parts = Vec::new();
        let mut cur = String::new();
        let mut chars = s.chars().peekable();
        while let Some(c) = chars.next() {
            match c {
                '\\' => {
                    cur.push('\\');
                    if let Some(n) = chars.next() {
                        cur.push(n);
                    }
                }
                ',' => parts.push(std::mem::take(&mut cur)),
                c => cur.push(c),
            }
        }
        parts.push(cur);
        for part in parts {
            if part.trim().is_empty() {
                continue;
            }
            let (field, neg, value) = split_requirement(&part)
                .ok_or_else(|| format!("invalid selector: '{s}'; can't understand '{part}'"))?;
            reqs.push((field.trim().to_string(), neg, unescape(value)));
        }
        Ok(FieldSelector { reqs })
    }

    /// `(field, "=" | "!=", value)` for each requirement.
    pub fn requirements(&self) -> Vec<(&str, &str, &str)> {
        self.reqs
            .iter()
            .map(|(f, neg, v)| (f.as_str(), if *neg { "!=" } else { "=" }, v.as_str()))
            .collect()
    }

    /// `(field, value)` of each `field=value` requirement.
    pub fn exact_terms(&self) -> impl Iterator<Item = (&str, &str)> {
        self.reqs
            .iter()
            .filter(|(_, neg, _)| !neg)
            .map(|(f, _, v)| (f.as_str(), v.as_str()))
    }

    /// The same requirements on renamed fields.
    pub fn map_fields(&self, f: impl Fn(&str) -> String) -> FieldSelector {
        FieldSelector {
            reqs: self
                .reqs
                .iter()
                .map(|(k, neg, v)| (f(k), *neg, v.clone()))
                .collect(),
        }
    }

    /// Whether an object whose field values `get` returns satisfies every requirement.
    pub fn matches(&self, get: impl Fn(&str) -> Option<String>) -> bool {
        self.reqs.iter().all(|(f, neg, v)| {
            let actual = get(f).unwrap_or_default();
            (actual == *v) != *neg
        })
    }
}

/// The string form (`a=b,c in (x,y)`) of a selector object: a
/// `LabelSelector` (`matchLabels`, `matchExpressions`) or a plain label map
/// (ReplicationController, Service). Empty for none.
pub fn selector_string(sel: Option<&Value>) -> String {
    let labels = |m: &Map<String, Value>, parts: &mut Vec<String>| {
        let mut kv: Vec<_> = m.iter().collect();
        kv.sort_by(|a, b| a.0.cmp(b.0));
        for (k, v) in kv {
            parts.push(format!("{k}={}", v.as_str().unwrap_or("")));
        }
    };
    let mut parts = Vec::new();
    match sel {
        Some(s) if s.get("matchLabels").is_some() || s.get("matchExpressions").is_some() => {
            if let Some(m) = s.get("matchLabels").and_then(Value::as_object) {
                labels(m, &mut parts);
            }
            for e in s
                .get("matchExpressions")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
            {
                let key = e.get("key").and_then(Value::as_str).unwrap_or("");
                let values: Vec<&str> = e
                    .get("values")
                    .and_then(Value::as_array)
                    .map(|a| a.iter().filter_map(Value::as_str).collect())
                    .unwrap_or_default();
                match e.get("operator").and_then(Value::as_str).unwrap_or("") {
                    "In" => parts.push(format!("{key} in ({})", values.join(","))),
                    "NotIn" => parts.push(format!("{key} notin ({})", values.join(","))),
                    "Exists" => parts.push(key.to_string()),
                    "DoesNotExist" => parts.push(format!("!{key}")),
                    _ => {}
                }
            }
        }
        Some(Value::Object(m)) => labels(m, &mut parts),
        _ => {}
    }
    parts.join(",")
}

fn split_requirement(part: &str) -> Option<(&str, bool, &str)> {
    let bytes = part.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'\\' => i += 2,
            b'!' if bytes.get(i + 1) == Some(&b'=') => {
                return Some((&part[..i], true, &part[i + 2..]))
            }
            b'=' if bytes.get(i + 1) == Some(&b'=') => {
                return Some((&part[..i], false, &part[i + 2..]))
            }
            b'=' => return Some((&part[..i], false, &part[i + 1..])),
            _ => i += 1,
        }
    }
    None
}

fn unescape(s: &str) -> String {
    let mut out = String::new();
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        if c == '\\' {
            if let Some(n) = chars.next() {
                out.push(n);
            }
        } else {
            out.push(c);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn labels(v: Value) -> Map<String, Value> {
        v.as_object().unwrap().clone()
    }

    #[test]
    fn equality_and_set_based_requirements_all_must_hold() {
        let s = LabelSelector::parse("app=web, tier in (front,back),!canary,env!=prod").unwrap();
        assert!(s.matches(&labels(json!({"app": "web", "tier": "front"}))));
        assert!(!s.matches(&labels(
            json!({"app": "web", "tier": "front", "canary": "1"})
        )));
        assert!(!s.matches(&labels(json!({"app": "web", "tier": "mid"}))));
        assert!(!s.matches(&labels(
            json!({"app": "web", "tier": "back", "env": "prod"})
        )));
    }

    #[test]
    fn notin_matches_objects_without_the_label() {
        let s = LabelSelector::parse("env notin (prod)").unwrap();
        assert!(s.matches(&labels(json!({}))));
    }

    #[test]
    fn malformed_selectors_are_rejected() {
        assert!(LabelSelector::parse("a in (").is_err());
        assert!(LabelSelector::parse("=b").is_err());
        assert!(LabelSelector::parse("a=b c").is_err());
    }

    #[test]
    fn an_empty_selector_matches_everything() {
        assert!(LabelSelector::parse("")
            .unwrap()
            .matches(&labels(json!({"x": "y"}))));
        assert!(LabelSelector::from_label_selector_json(&json!({}))
            .unwrap()
            .is_empty());
    }

    #[test]
    fn field_selectors_compare_missing_values_as_empty() {
        let f = FieldSelector::parse("spec.nodeName=,status.phase!=Failed").unwrap();
        assert!(f.matches(|_| None));
        let f = FieldSelector::parse("metadata.name==a\\,b").unwrap();
        assert!(f.matches(|k| (k == "metadata.name").then(|| "a,b".to_string())));
    }
}
