//! The string formats Kubernetes validates in CRD schemas
//! (`apiextensions-apiserver`'s supported subset of go-openapi's strfmt):
//! unknown formats validate nothing, as in Kubernetes.

use base64::Engine;

/// Whether `s` is valid for `format`.
pub(crate) fn valid(format: &str, s: &str) -> bool {
    match format {
        "byte" => base64::engine::general_purpose::STANDARD.decode(s).is_ok(),
        "date" => is_date(s),
        "date-time" | "datetime" => is_date_time(s),
        "duration" => is_duration(s),
        "uuid" => is_uuid(s, None),
        "uuid3" => is_uuid(s, Some('3')),
        "uuid4" => is_uuid(s, Some('4')),
        "uuid5" => is_uuid(s, Some('5')),
        "email" => is_email(s),
        "hostname" => is_hostname(s),
        "ipv4" => s.parse::<std::net::Ipv4Addr>().is_ok(),
        "ipv6" => s.parse::<std::net::Ipv6Addr>().is_ok(),
        "cidr" => is_cidr(s),
        "mac" => is_mac(s),
        "uri" => is_uri(s),
        "hexcolor" => {
            s.len() == 7 && s.starts_with('#') && s[1..].chars().all(|c| c.is_ascii_hexdigit())
        }
        "rgbcolor" => is_rgb(s),
        "isbn" | "isbn10" | "isbn13" => {
            let d: String = s.chars().filter(|c| !matches!(c, '-' | ' ')).collect();
            (d.len() == 10 || d.len() == 13)
                && d.chars()
                    .enumerate()
                    .all(|(i, c)| c.is_ascii_digit() || (i == 9 && c == 'X'))
        }
        "creditcard" => {
            let d: String = s.chars().filter(|c| !matches!(c, '-' | ' ')).collect();
            (12..=19).contains(&d.len()) && d.chars().all(|c| c.is_ascii_digit())
        }
        "ssn" => {
            let b = s.as_bytes();
            b.len() == 11
                && b.iter().enumerate().all(|(i, c)| {
                    if i == 3 || i == 6 {
                        *c == b'-'
                    } else {
                        c.is_ascii_digit()
                    }
                })
        }
        "bsonobjectid" => s.len() == 24 && s.chars().all(|c| c.is_ascii_hexdigit()),
        _ => true,
    }
}

fn digits(s: &str) -> bool {
    !s.is_empty() && s.chars().all(|c| c.is_ascii_digit())
}

fn is_date(s: &str) -> bool {
    chrono::NaiveDate::parse_from_str(s, "%Y-%m-%d").is_ok() && s.len() == 10
}

fn is_date_time(s: &str) -> bool {
    chrono::DateTime::parse_from_rfc3339(s).is_ok()
        || chrono::NaiveDateTime::parse_from_str(s, "%Y-%m-%dT%H:%M:%S%.f").is_ok()
}

/// Go's `time.ParseDuration` syntax, plus strfmt's `1 day`-style units.
pub(crate) fn parse_go_duration(s: &str) -> Option<f64> {
    let (neg, mut rest) = match s.as_bytes().first()? {
        b'-' => (true, &s[1..]),
        b'+' => (false, &s[1..]),
        _ => (false, s),
    };
    if rest == "0" {
        return Some(0.0);
    }
    if rest.is_empty() {
        return None;
    }
    let mut total = 0.0;
    while !rest.is_empty() {
        let end = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        let num: f64 = rest[..end].parse().ok()?;
        rest = &rest[end..];
        let uend = rest
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(rest.len());
        let unit = match &rest[..uend] {
            "ns" => 1e-9,
            "us" | "µs" | "μs" => 1e-6,
            "ms" => 1e-3,
            "s" => 1.0,
            "m" => 60.0,
            "h" => 3600.0,
            _ => return None,
        };
        rest = &rest[uend..];
        total += num * unit;
    }
    Some(if neg { -total } else { total })
}

fn is_duration(s: &str) -> bool {
    if parse_go_duration(s).is_some() {
        return true;
    }
    // strfmt also accepts "3 days", "1 week", ...
    let mut parts = s.split_whitespace();
    match (parts.next(), parts.next(), parts.next()) {
        (Some(n), Some(unit), None) => {
            digits(n)
                && matches!(
                    unit.trim_end_matches('s'),
                    "n" | "ns"
                        | "u"
                        | "us"
                        | "m"
                        | "ms"
                        | "s"
                        | "sec"
                        | "second"
                        | "min"
                        | "minute"
                        | "h"
                        | "hr"
                        | "hour"
                        | "d"
                        | "day"
                        | "w"
                        | "wk"
                        | "week"
                )
        }
        _ => false,
    }
}

fn is_uuid(s: &str, version: Option<char>) -> bool {
    let parts: Vec<&str> = s.split('-').collect();
    let lens = [8, 4, 4, 4, 12];
    if parts.len() != 5
        || !parts
            .iter()
            .zip(lens)
            .all(|(p, l)| p.len() == l && p.chars().all(|c| c.is_ascii_hexdigit()))
    {
        return false;
    }
    match version {
        Some(v) => parts[2].starts_with(v),
        None => true,
    }
}

fn is_email(s: &str) -> bool {
    let Some((local, domain)) = s.rsplit_once('@') else {
        return false;
    };
    !local.is_empty()
        && !local.contains(char::is_whitespace)
        && (is_hostname(domain) || (domain.starts_with('[') && domain.ends_with(']')))
}

fn is_hostname(s: &str) -> bool {
    if s.is_empty() || s.len() > 255 {
        return false;
    }
    let s = s.strip_suffix('.').unwrap_or(s);
    s.split('.').all(|label| {
        !label.is_empty()
            && label.len() <= 63
            && !label.starts_with('-')
            && !label.ends_with('-')
            && label.chars().all(|c| c.is_ascii_alphanumeric() || c == '-')
    })
}

fn is_cidr(s: &str) -> bool {
    let Some((ip, bits)) = s.split_once('/') else {
        return false;
    };
    let Ok(bits) = bits.parse::<u8>() else {
        return false;
    };
    if let Ok(_v4) = ip.parse::<std::net::Ipv4Addr>() {
        bits <= 32
    } else if ip.parse::<std::net::Ipv6Addr>().is_ok() {
        bits <= 128
    } else {
        false
    }
}

fn is_mac(s: &str) -> bool {
    let sep = if s.contains(':') {
        ':'
    } else if s.contains('-') {
        '-'
    } else if s.contains('.') {
        return s.split('.').count() >= 3
            && s.split('.')
                .all(|p| p.len() == 4 && p.chars().all(|c| c.is_ascii_hexdigit()));
    } else {
        return false;
    };
    let parts: Vec<&str> = s.split(sep).collect();
    matches!(parts.len(), 6 | 8 | 20)
        && parts
            .iter()
            .all(|p| p.len() == 2 && p.chars().all(|c| c.is_ascii_hexdigit()))
}

fn is_uri(s: &str) -> bool {
    let Some((scheme, rest)) = s.split_once(':') else {
        return false;
    };
    let mut c = scheme.chars();
    c.next().is_some_and(|f| f.is_ascii_alphabetic())
        && c.all(|x| x.is_ascii_alphanumeric() || matches!(x, '+' | '-' | '.'))
        && !rest.contains(char::is_whitespace)
}

fn is_rgb(s: &str) -> bool {
    let Some(inner) = s.strip_prefix("rgb(").and_then(|r| r.strip_suffix(')')) else {
        return false;
    };
    let parts: Vec<&str> = inner.split(',').map(str::trim).collect();
    parts.len() == 3 && parts.iter().all(|p| p.parse::<u8>().is_ok())
}
