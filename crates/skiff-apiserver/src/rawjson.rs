//! The fields of a JSON object as spans of its bytes, for edits that touch
//! a few fields of a large stored object (a pod's binding) without decoding
//! all of it into a `Value` and encoding it again. Only well-formed JSON is
//! expected (what the store holds); anything else is `None`, and the caller
//! takes the decoding path.

use std::ops::Range;

/// One field of an object: its key's bytes (between the quotes, as
/// written) and its value's span.
#[derive(Clone, Debug)]
pub struct Field {
    /// From the key's opening quote to the end of its value.
    pub entry: Range<usize>,
    pub key: Range<usize>,
    pub value: Range<usize>,
}

/// An object's fields and the position of its closing brace.
#[derive(Clone, Debug)]
pub struct Object {
    pub fields: Vec<Field>,
    pub close: usize,
}

impl Object {
    /// The field named `name` (compared with the key as written: keys with
    /// escapes do not match, which only sends the caller down its slow path).
    pub fn get(&self, b: &[u8], name: &str) -> Option<&Field> {
        self.fields
            .iter()
            .find(|f| &b[f.key.clone()] == name.as_bytes())
    }
}

fn ws(b: &[u8], mut i: usize) -> usize {
    while i < b.len() && matches!(b[i], b' ' | b'\t' | b'\n' | b'\r') {
        i += 1;
    }
    i
}

/// The end (exclusive) of the string whose opening quote is at `i`.
fn string_end(b: &[u8], mut i: usize) -> Option<usize> {
    i += 1;
    while i < b.len() {
        match b[i] {
            b'\\' => i += 2,
            b'"' => return Some(i + 1),
            _ => i += 1,
        }
    }
    None
}

/// The end (exclusive) of the value starting at `i`.
pub fn value_end(b: &[u8], i: usize) -> Option<usize> {
    match *b.get(i)? {
        b'"' => string_end(b, i),
        b'{' | b'[' => {
            let mut depth = 0usize;
            let mut j = i;
            while j < b.len() {
                match b[j] {
                    b'"' => {
                        j = string_end(b, j)?;
                        continue;
                    }
                    b'{' | b'[' => depth += 1,
                    b'}' | b']' => {
                        depth -= 1;
                        if depth == 0 {
                            return Some(j + 1);
                        }
                    }
                    _ => {}
                }
                j += 1;
            }
            None
        }
        _ => {
            let mut j = i;
            while j < b.len() && !matches!(b[j], b',' | b'}' | b']' | b' ' | b'\t' | b'\n' | b'\r')
            {
                j += 1;
            }
            (j > i).then_some(j)
        }
    }
}

/// The fields of the object whose `{` is at `start`.
pub fn object(b: &[u8], start: usize) -> Option<Object> {
    if b.get(start) != Some(&b'{') {
        return None;
    }
    let mut fields = Vec::new();
    let mut i = ws(b, start + 1);
    if b.get(i) == Some(&b'}') {
        return Some(Object { fields, close: i });
    }
    loop {
        if b.get(i) != Some(&b'"') {
            return None;
        }
        let key_end = string_end(b, i)?;
        let key = i + 1..key_end - 1;
        let colon = ws(b, key_end);
        if b.get(colon) != Some(&b':') {
            return None;
        }
        let v = ws(b, colon + 1);
        let v_end = value_end(b, v)?;
        fields.push(Field {
            entry: i..v_end,
            key,
            value: v..v_end,
        });
        i = ws(b, v_end);
        match b.get(i) {
            Some(b',') => i = ws(b, i + 1),
            Some(b'}') => return Some(Object { fields, close: i }),
            _ => return None,
        }
    }
}

/// The top-level object of `b` (nothing but whitespace around it).
pub fn document(b: &[u8]) -> Option<Object> {
    let start = ws(b, 0);
    let o = object(b, start)?;
    (ws(b, o.close + 1) == b.len()).then_some(o)
}

/// Edits to apply to a byte string: replace each span (they must not
/// overlap) with new bytes; an empty span inserts.
#[derive(Default)]
pub struct Edits(Vec<(Range<usize>, Vec<u8>)>);

impl Edits {
    pub fn replace(&mut self, span: Range<usize>, with: Vec<u8>) {
        self.0.push((span, with));
    }

    /// Removes field `idx` of `o` with the comma that separates it.
    pub fn remove_field(&mut self, o: &Object, idx: usize) {
        let f = &o.fields[idx];
        let span = if idx > 0 {
            o.fields[idx - 1].value.end..f.value.end
        } else if let Some(next) = o.fields.get(1) {
            f.entry.start..next.entry.start
        } else {
            f.entry.clone()
        };
        self.0.push((span, Vec::new()));
    }

    /// Appends `"key":value` (value already encoded) as the last field of `o`.
    pub fn append_field(&mut self, o: &Object, key: &str, value: &[u8]) {
        let mut s = Vec::with_capacity(key.len() + value.len() + 4);
        if !o.fields.is_empty() {
            s.push(b',');
        }
        s.push(b'"');
        s.extend_from_slice(key.as_bytes());
        s.extend_from_slice(b"\":");
        s.extend_from_slice(value);
        self.0.push((o.close..o.close, s));
    }

    pub fn apply(mut self, b: &[u8]) -> Option<Vec<u8>> {
        self.0.sort_by_key(|(r, _)| (r.start, r.end));
        let mut out = Vec::with_capacity(b.len() + 128);
        let mut at = 0;
        for (r, with) in &self.0 {
            if r.start < at {
                return None;
            }
            out.extend_from_slice(&b[at..r.start]);
            out.extend_from_slice(with);
            at = r.end;
        }
        out.extend_from_slice(&b[at..]);
        Some(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_and_edits_keep_everything_else_as_written() {
        let b = br#"{"a":1,"b":{"x":"}\"{","y":[1,{"z":null}]},"c":"s"}"#;
        let top = document(b).unwrap();
        let keys: Vec<&[u8]> = top.fields.iter().map(|f| &b[f.key.clone()]).collect();
        assert_eq!(keys, vec![&b"a"[..], b"b", b"c"]);
        let inner = object(b, top.get(b, "b").unwrap().value.start).unwrap();
        assert_eq!(&b[inner.get(b, "x").unwrap().value.clone()], br#""}\"{""#);
        let mut e = Edits::default();
        e.remove_field(&top, 0);
        e.append_field(&inner, "w", b"true");
        e.replace(top.get(b, "c").unwrap().value.clone(), b"2".to_vec());
        let out = e.apply(b).unwrap();
        assert_eq!(
            std::str::from_utf8(&out).unwrap(),
            r#"{"b":{"x":"}\"{","y":[1,{"z":null}],"w":true},"c":2}"#
        );
        let mut e = Edits::default();
        e.remove_field(&top, 2);
        assert_eq!(
            e.apply(b).unwrap(),
            br#"{"a":1,"b":{"x":"}\"{","y":[1,{"z":null}]}}"#.to_vec()
        );
        assert!(document(br#"{"a":1,}"#).is_none());
        assert!(document(br#"{"a":1} x"#).is_none());
        assert!(document(br#"{"a""#).is_none());
        let empty = document(b"{}").unwrap();
        let mut e = Edits::default();
        e.append_field(&empty, "k", b"\"v\"");
        assert_eq!(e.apply(b"{}").unwrap(), br#"{"k":"v"}"#.to_vec());
    }
}
