//! Validation of a custom resource against its compiled schema, with
//! kube-openapi's messages as kube-apiserver converts them to field errors
//! (`apiserver/validation.kubeOpenAPIResultToFieldErrors`), list-type and
//! embedded-resource checks, and ratcheting of unchanged values on update.

use serde_json::Value;

use super::formats;
use super::node::{ListType, Node, Type};
use crate::Cause;

/// Where errors go and how their paths are written: `base` is the field path
/// the schema applies at (empty for a custom resource, `...default` when
/// checking a default), names are relative to it as kube-openapi's are.
pub(crate) struct Validator<'a> {
    pub(crate) base: &'a str,
    pub(crate) out: Vec<Cause>,
}

/// A field path built lazily: rendered only when an error needs it, so a
/// valid object costs no string building.
#[derive(Clone, Copy)]
pub(crate) enum P<'a> {
    Root(&'a str),
    Field(&'a P<'a>, &'a str),
    Index(&'a P<'a>, usize),
}

impl P<'_> {
    fn is_empty(&self) -> bool {
        matches!(self, P::Root(s) if s.is_empty())
    }
}

impl std::fmt::Display for P<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            P::Root(s) => f.write_str(s),
            P::Field(parent, k) => {
                if parent.is_empty() {
                    f.write_str(k)
                } else {
                    write!(f, "{parent}.{k}")
                }
            }
            P::Index(parent, i) => write!(f, "{parent}[{i}]"),
        }
    }
}

/// The JSON type kube-openapi reports for a value.
pub(crate) fn json_type(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(n) => {
            if n.is_i64()
                || n.is_u64()
                || n.as_f64()
                    .is_some_and(|f| f.fract() == 0.0 && f.abs() < 9.2e18)
            {
                "integer"
            } else {
                "number"
            }
        }
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

/// A number as Go's `%v` prints a float64.
pub(crate) fn go_number(f: f64) -> String {
    if f.fract() == 0.0 && f.abs() < 1e21 {
        format!("{}", f as i128)
    } else {
        format!("{f}")
    }
}

fn type_matches(ty: Type, v: &Value) -> bool {
    let got = json_type(v);
    match ty {
        Type::Object => got == "object",
        Type::Array => got == "array",
        Type::String => got == "string",
        Type::Boolean => got == "boolean",
        Type::Integer => got == "integer",
        Type::Number => got == "integer" || got == "number",
    }
}

impl Validator<'_> {
    fn field(&self, name: &P<'_>) -> String {
        let name = name.to_string();
        if name.is_empty() {
            self.base.to_string()
        } else if self.base.is_empty() {
            name.to_string()
        } else {
            format!("{}.{name}", self.base)
        }
    }

    fn invalid(&mut self, name: &P<'_>, value: &Value, detail: String) {
        let f = self.field(name);
        self.out.push(Cause::invalid(f, value, &detail));
    }

    fn type_invalid(&mut self, name: &P<'_>, value: &Value, detail: String) {
        let f = self.field(name);
        let mut c = Cause::invalid(f, value, &detail);
        c.reason = "FieldValueTypeInvalid".to_string();
        self.out.push(c);
    }

    /// Validates `v` at relative path `name`; `old` is the correlated old
    /// value on update (an unchanged value is not re-validated: ratcheting).
    pub(crate) fn validate(&mut self, n: &Node, v: &Value, old: Option<&Value>, name: &P<'_>) {
        if old == Some(v) {
            return;
        }
        if v.is_null() {
            if n.nullable {
                return;
            }
            if n.int_or_string {
                self.type_invalid(
                    name,
                    &Value::String("null".into()),
                    format!("{name} in body must be of type integer,string: \"null\""),
                );
            } else if let Some(ty) = n.ty {
                self.type_invalid(
                    name,
                    &Value::String("null".into()),
                    format!("{name} in body must be of type {}: \"null\"", ty.name()),
                );
            }
            return;
        }
        if n.int_or_string {
            if !matches!(json_type(v), "integer" | "string") {
                let got = json_type(v);
                self.type_invalid(
                    name,
                    &Value::String(got.into()),
                    format!("{name} in body must be of type integer,string: \"{got}\""),
                );
                return;
            }
        } else if let Some(ty) = n.ty {
            if !type_matches(ty, v) {
                let got = json_type(v);
                self.type_invalid(
                    name,
                    &Value::String(got.into()),
                    format!("{name} in body must be of type {}: \"{got}\"", ty.name()),
                );
                return;
            }
        }
        match v {
            Value::Object(m) => self.object(n, m, old.and_then(Value::as_object), name),
            Value::Array(a) => self.array(n, a, old.and_then(Value::as_array), name),
            Value::String(s) => self.string(n, v, s, name),
            Value::Number(_) => self.number(n, v, name),
            _ => {}
        }
        if let Some(values) = &n.enum_values {
            if !values.iter().any(|e| json_eq(e, v)) {
                let supported: Vec<String> = values
                    .iter()
                    .map(|e| match e {
                        Value::String(s) => s.clone(),
                        other => other.to_string(),
                    })
                    .collect();
                let refs: Vec<&str> = supported.iter().map(String::as_str).collect();
                let f = self.field(name);
                self.out.push(Cause::not_supported(f, v, &refs));
            }
        }
        self.composition(n, v, name);
    }

    fn object(
        &mut self,
        n: &Node,
        m: &serde_json::Map<String, Value>,
        old: Option<&serde_json::Map<String, Value>>,
        name: &P<'_>,
    ) {
        for r in &n.required {
            if !m.contains_key(r) {
                let f = self.field(&P::Field(name, r));
                self.out.push(Cause::required(f));
            }
        }
        if let Some(max) = n.max_properties {
            if m.len() as u64 > max {
                self.too_many(name, m.len(), max);
            }
        }
        if let Some(min) = n.min_properties {
            if (m.len() as u64) < min {
                self.invalid(
                    name,
                    &Value::from(m.len()),
                    format!("{name} in body should have at least {min} properties"),
                );
            }
        }
        for (k, v) in m {
            let child = P::Field(name, k);
            let o = old.and_then(|o| o.get(k));
            if let Some(p) = n.properties.get(k) {
                self.validate(p, v, o, &child);
            } else if let Some(a) = &n.additional {
                self.validate(a, v, o, &child);
            }
        }
        if n.embedded {
            self.embedded(m, name);
        }
    }

    /// `validateEmbeddedResource`: apiVersion and kind required and well
    /// formed, metadata a valid ObjectMeta.
    fn embedded(&mut self, m: &serde_json::Map<String, Value>, name: &P<'_>) {
        for k in ["apiVersion", "kind"] {
            if !m.contains_key(k) {
                let f = self.field(&P::Field(name, k));
                self.out.push(Cause::required(f));
            }
        }
        if let Some(v) = m.get("apiVersion") {
            let p = P::Field(name, "apiVersion");
            match v.as_str() {
                None => self.invalid(&p, v, "must be a string".into()),
                Some("") => self.invalid(&p, v, "must not be empty".into()),
                Some(av) if av.matches('/').count() > 1 => {
                    self.invalid(&p, v, format!("unexpected GroupVersion string: {av}"))
                }
                _ => {}
            }
        }
        if let Some(v) = m.get("kind") {
            let p = P::Field(name, "kind");
            match v.as_str() {
                None => self.invalid(&p, v, "must be a string".into()),
                Some("") => self.invalid(&p, v, "must not be empty".into()),
                Some(kind) => {
                    let lower = kind.to_lowercase();
                    let b = lower.as_bytes();
                    let ok = b.len() <= 63
                        && b[0].is_ascii_lowercase()
                        && b[b.len() - 1] != b'-'
                        && b.iter()
                            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-');
                    if !ok {
                        self.invalid(&p, v, "may have mixed case, but should otherwise match: a DNS-1035 label must consist of lower case alphanumeric characters or '-', start with an alphabetic character, and end with an alphanumeric character (e.g. 'my-name',  or 'abc-123', regex used for validation is '[a-z]([-a-z0-9]*[a-z0-9])?')".into());
                    }
                }
            }
        }
        if let Some(meta) = m.get("metadata") {
            let mp = P::Field(name, "metadata");
            match meta {
                Value::Object(mm) => {
                    for k in ["name", "generateName"] {
                        if let Some(v) = mm.get(k) {
                            let p = P::Field(&mp, k);
                            match v.as_str() {
                                None => self.invalid(&p, v, "must be a string".into()),
                                Some(n) => {
                                    let bad = match n {
                                        "." if k == "name" => Some("may not be '.'"),
                                        ".." if k == "name" => Some("may not be '..'"),
                                        _ if n.contains('/') => Some("may not contain '/'"),
                                        _ if n.contains('%') => Some("may not contain '%'"),
                                        _ => None,
                                    };
                                    if let Some(why) = bad {
                                        self.invalid(&p, v, why.into());
                                    }
                                }
                            }
                        }
                    }
                    for k in ["labels", "annotations"] {
                        if let Some(v) = mm.get(k) {
                            let ok = v.is_null()
                                || v.as_object()
                                    .is_some_and(|o| o.values().all(Value::is_string));
                            if !ok {
                                self.invalid(
                                    &P::Field(&mp, k),
                                    v,
                                    "must be a map of strings".into(),
                                );
                            }
                        }
                    }
                }
                Value::Null => {}
                other => self.invalid(&mp, other, "must be an object".into()),
            }
        }
    }

    fn too_many(&mut self, name: &P<'_>, actual: usize, max: u64) {
        let f = self.field(name);
        let unit = if max == 1 { "item" } else { "items" };
        self.out.push(Cause::new(
            "FieldValueTooMany",
            f,
            format!("Too many: {actual}: must have at most {max} {unit}"),
        ));
    }

    fn array(&mut self, n: &Node, a: &[Value], old: Option<&Vec<Value>>, name: &P<'_>) {
        if let Some(max) = n.max_items {
            if a.len() as u64 > max {
                self.too_many(name, a.len(), max);
            }
        }
        if let Some(min) = n.min_items {
            if (a.len() as u64) < min {
                self.invalid(
                    name,
                    &Value::from(a.len()),
                    format!("{name} in body should have at least {min} items"),
                );
            }
        }
        if let Some(items) = &n.items {
            for (i, v) in a.iter().enumerate() {
                let o = old.and_then(|o| correlate(n, v, o));
                self.validate(items, v, o, &P::Index(name, i));
            }
        }
        match n.list_type {
            Some(ListType::Set) => {
                for i in 0..a.len() {
                    if a[..i].iter().any(|x| json_eq(x, &a[i])) {
                        let f = self.field(&P::Index(name, i));
                        self.out.push(Cause::duplicate(f, &a[i]));
                    }
                }
            }
            Some(ListType::Map) => {
                let key_of = |v: &Value| -> Value {
                    let mut k = serde_json::Map::new();
                    for key in &n.list_map_keys {
                        if let Some(x) = v.get(key) {
                            k.insert(key.clone(), x.clone());
                        }
                    }
                    Value::Object(k)
                };
                let keys: Vec<Value> = a.iter().map(key_of).collect();
                for i in 0..keys.len() {
                    if keys[..i].iter().any(|x| json_eq(x, &keys[i])) {
                        let f = self.field(&P::Index(name, i));
                        self.out.push(Cause::duplicate(f, &keys[i]));
                    }
                }
            }
            _ => {}
        }
    }

    fn string(&mut self, n: &Node, v: &Value, s: &str, name: &P<'_>) {
        let chars = if n.max_length.is_some() || n.min_length.is_some() {
            s.chars().count() as u64
        } else {
            0
        };
        if let Some(max) = n.max_length {
            if chars > max {
                let f = self.field(name);
                let unit = if max == 1 { "byte" } else { "bytes" };
                self.out.push(Cause::new(
                    "FieldValueTooLong",
                    f,
                    format!("Too long: may not be more than {max} {unit}"),
                ));
            }
        }
        if let Some(min) = n.min_length {
            if chars < min {
                self.invalid(
                    name,
                    v,
                    format!("{name} in body should be at least {min} chars long"),
                );
            }
        }
        if let Some((src, re)) = &n.pattern {
            if !re.is_match(s) {
                self.invalid(name, v, format!("{name} in body should match '{src}'"));
            }
        }
        if let Some(fmt) = &n.format {
            if !formats::valid(fmt, s) {
                self.type_invalid(
                    name,
                    v,
                    format!("{name} in body must be of type {fmt}: {s:?}"),
                );
            }
        }
    }

    fn number(&mut self, n: &Node, v: &Value, name: &P<'_>) {
        let Some(x) = v.as_f64() else { return };
        if let Some(max) = n.maximum {
            if (n.exclusive_maximum && x >= max) || x > max {
                let op = if n.exclusive_maximum {
                    "less than"
                } else {
                    "less than or equal to"
                };
                self.invalid(
                    name,
                    v,
                    format!("{name} in body should be {op} {}", go_number(max)),
                );
            }
        }
        if let Some(min) = n.minimum {
            if (n.exclusive_minimum && x <= min) || x < min {
                let op = if n.exclusive_minimum {
                    "greater than"
                } else {
                    "greater than or equal to"
                };
                self.invalid(
                    name,
                    v,
                    format!("{name} in body should be {op} {}", go_number(min)),
                );
            }
        }
        if let Some(m) = n.multiple_of {
            if m > 0.0 {
                let q = x / m;
                if (q - q.round()).abs() > 1e-9 * q.abs().max(1.0) {
                    self.invalid(
                        name,
                        v,
                        format!("{name} in body should be a multiple of {}", go_number(m)),
                    );
                }
            }
        }
    }

    /// `allOf`, `anyOf`, `oneOf`, `not`, as kube-openapi reports them.
    fn composition(&mut self, n: &Node, v: &Value, name: &P<'_>) {
        if n.all_of.is_empty() && n.any_of.is_empty() && n.one_of.is_empty() && n.not.is_none() {
            return;
        }
        // Written out only for an error.
        let quoted = || format!("{:?}", name.to_string());
        let composite = |this: &mut Self, msg: String| {
            let f = this.base.to_string();
            this.out
                .push(Cause::invalid(f, &Value::String(String::new()), &msg));
        };
        let run = |this: &Self, sub: &Node| -> Vec<Cause> {
            let mut v2 = Validator {
                base: this.base,
                out: Vec::new(),
            };
            v2.validate(sub, v, None, name);
            v2.out
        };
        if !n.all_of.is_empty() {
            let mut valid = 0;
            for sub in &n.all_of {
                let errs = run(self, sub);
                if errs.is_empty() {
                    valid += 1;
                }
                self.out.extend(errs);
            }
            if valid != n.all_of.len() {
                let extra = if valid == 0 { ". None validated" } else { "" };
                composite(
                    self,
                    format!("{} must validate all the schemas (allOf){extra}", quoted()),
                );
            }
        }
        // A branch whose type the value does not have fails without being
        // run (int-or-string's `anyOf: [{type: integer}, {type: string}]`
        // costs one type test, not an error message); the errors are only
        // collected when no branch validates.
        let any_of_ok = !n.any_of.is_empty()
            && n.any_of.iter().any(|sub| {
                (sub.int_or_string
                    || sub
                        .ty
                        .is_none_or(|t| type_matches(t, v) || (v.is_null() && sub.nullable)))
                    && run(self, sub).is_empty()
            });
        if !n.any_of.is_empty() && !any_of_ok {
            let mut best: Option<Vec<Cause>> = None;
            let mut ok = false;
            for sub in &n.any_of {
                let errs = run(self, sub);
                if errs.is_empty() {
                    ok = true;
                    break;
                }
                if best.as_ref().is_none_or(|b| errs.len() < b.len()) {
                    best = Some(errs);
                }
            }
            if !ok {
                composite(
                    self,
                    format!("{} must validate at least one schema (anyOf)", quoted()),
                );
                self.out.extend(best.unwrap_or_default());
            }
        }
        if !n.one_of.is_empty() {
            let mut valid = 0;
            let mut best: Option<Vec<Cause>> = None;
            for sub in &n.one_of {
                let errs = run(self, sub);
                if errs.is_empty() {
                    valid += 1;
                } else if valid == 0 && best.as_ref().is_none_or(|b| errs.len() < b.len()) {
                    best = Some(errs);
                }
            }
            if valid != 1 {
                let extra = if valid == 0 {
                    "Found none valid".to_string()
                } else {
                    format!("Found {valid} valid alternatives")
                };
                composite(
                    self,
                    format!(
                        "{} must validate one and only one schema (oneOf). {extra}",
                        quoted()
                    ),
                );
                if valid == 0 {
                    self.out.extend(best.unwrap_or_default());
                }
            }
        }
        if let Some(not) = &n.not {
            if run(self, not).is_empty() {
                composite(
                    self,
                    format!("{} must not validate the schema (not)", quoted()),
                );
            }
        }
    }
}

/// JSON equality with numbers compared by value (`1` equals `1.0`).
pub(crate) fn json_eq(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => match (x.as_i64(), y.as_i64()) {
            (Some(i), Some(j)) => i == j,
            _ => x.as_f64() == y.as_f64(),
        },
        (Value::Array(x), Value::Array(y)) => {
            x.len() == y.len() && x.iter().zip(y).all(|(a, b)| json_eq(a, b))
        }
        (Value::Object(x), Value::Object(y)) => {
            x.len() == y.len()
                && x.iter()
                    .all(|(k, v)| y.get(k).is_some_and(|w| json_eq(v, w)))
        }
        _ => a == b,
    }
}

/// The old element a new list element corresponds to: by key for
/// `list-type=map`, by value for `set`; atomic lists do not correlate.
pub(crate) fn correlate<'a>(n: &Node, v: &Value, old: &'a [Value]) -> Option<&'a Value> {
    match n.list_type {
        Some(ListType::Map) => old.iter().find(|o| {
            n.list_map_keys.iter().all(|k| match (o.get(k), v.get(k)) {
                (Some(a), Some(b)) => json_eq(a, b),
                (None, None) => true,
                _ => false,
            })
        }),
        Some(ListType::Set) => old.iter().find(|o| json_eq(o, v)),
        _ => None,
    }
}
