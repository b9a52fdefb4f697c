//! URL query strings and percent-encoding, decoded as Go's `net/url` does
//! for the parts Kubernetes clients send.

/// `k=v&k2=v2` as decoded pairs, in order (repeated keys kept; a key
/// without `=` has an empty value).
pub fn pairs(q: &str) -> Vec<(String, String)> {
    q.split('&')
        .filter(|p| !p.is_empty())
        .map(|p| {
            let (k, v) = p.split_once('=').unwrap_or((p, ""));
            (form_decode(k), form_decode(v))
        })
        .collect()
}

/// A query component: `%XX` escapes and `+` for a space.
pub fn form_decode(s: &str) -> String {
    decode(s, true)
}

/// Percent-encoding alone (`+` stays), as in header values such as
/// impersonation's `Impersonate-Extra-` keys.
pub fn percent_decode(s: &str) -> String {
    decode(s, false)
}

fn decode(s: &str, plus_is_space: bool) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'+' if plus_is_space => out.push(b' '),
            b'%' if i + 2 < b.len() => {
                match std::str::from_utf8(&b[i + 1..i + 3])
                    .ok()
                    .and_then(|h| u8::from_str_radix(h, 16).ok())
                {
                    Some(v) => {
                        out.push(v);
                        i += 2;
                    }
                    None => out.push(b'%'),
                }
            }
            c => out.push(c),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pairs_decode_escapes_and_plus_and_keep_repeats() {
        assert_eq!(
            pairs("command=sh&command=echo+hi%21&stdin&&x=%zz"),
            [
                ("command".to_string(), "sh".to_string()),
                ("command".to_string(), "echo hi!".to_string()),
                ("stdin".to_string(), String::new()),
                ("x".to_string(), "%zz".to_string()),
            ]
        );
    }

    #[test]
    fn percent_decoding_alone_keeps_plus() {
        assert_eq!(percent_decode("a+b%2Fc"), "a+b/c");
        assert_eq!(form_decode("a+b%2Fc"), "a b/c");
        assert_eq!(percent_decode("trailing%2"), "trailing%2");
    }
}
