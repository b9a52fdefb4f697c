//! Kubernetes quantities as exact integers (no floating point): `100m`,
//! `1.5`, `512Mi`, `1G`, `1e3`.

/// Parses a quantity into thousandths of a unit, rounded up (toward
/// positive infinity). `None` when the text is not a quantity.
pub fn parse_milli(s: &str) -> Option<i128> {
    let s = s.trim();
    if s.is_empty() {
        return None;
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
        return None;
    }
    let (int_part, frac_part) = num.split_once('.').unwrap_or((num, ""));
    let mut mantissa: i128 = 0;
    for c in int_part.bytes().chain(frac_part.bytes()) {
        mantissa = mantissa.checked_mul(10)?.checked_add((c - b'0') as i128)?;
    }
    // value = mantissa * 10^(exp10 - frac digits) * 1024^exp2
    let mut exp10: i32 = -(frac_part.len() as i32);
    let mut exp2: u32 = 0;
    match suffix {
        "" => {}
        "n" => exp10 -= 9,
        "u" => exp10 -= 6,
        "m" => exp10 -= 3,
        "k" => exp10 += 3,
        "M" => exp10 += 6,
        "G" => exp10 += 9,
        "T" => exp10 += 12,
        "P" => exp10 += 15,
        "E" => exp10 += 18,
        "Ki" => exp2 = 1,
        "Mi" => exp2 = 2,
        "Gi" => exp2 = 3,
        "Ti" => exp2 = 4,
        "Pi" => exp2 = 5,
        "Ei" => exp2 = 6,
        e if e.starts_with(['e', 'E']) => {
            let x: i32 = e[1..].parse().ok()?;
            if !(-40..=40).contains(&x) {
                return None;
            }
            exp10 += x;
        }
        _ => return None,
    }
    exp10 += 3; // thousandths
    let mut v = mantissa.checked_mul(1024i128.checked_pow(exp2)?)?;
    if exp10 >= 0 {
        v = v.checked_mul(10i128.checked_pow(exp10 as u32)?)?;
    } else {
        let d = 10i128.checked_pow((-exp10) as u32)?;
        // round away from zero for positives (up), toward zero for negatives
        // (also up); both are a ceiling.
        v = if neg { v / d } else { (v + d - 1) / d };
    }
    Some(if neg { -v } else { v })
}

/// Clamps to i64.
fn clamp(v: i128) -> i64 {
    v.clamp(i64::MIN as i128, i64::MAX as i128) as i64
}

/// Millicores (or thousandths of any unit); 0 for unparsable text.
pub fn milli(s: &str) -> i64 {
    parse_milli(s).map(clamp).unwrap_or(0)
}

/// Whole units rounded up (bytes, counts); 0 for unparsable text.
pub fn units(s: &str) -> i64 {
    parse_milli(s)
        .map(|m| clamp(if m >= 0 { (m + 999) / 1000 } else { m / 1000 }))
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantities_parse_exactly_as_integers() {
        let cases = [
            ("100m", 100),
            ("0.1", 100),
            ("1", 1000),
            ("1.5", 1500),
            ("2k", 2_000_000),
            ("1Ki", 1_024_000),
            ("500Mi", 500 * 1024 * 1024 * 1000),
            ("1e3", 1_000_000),
            ("1n", 1),
            ("-1", -1000),
        ];
        for (s, want) in cases {
            assert_eq!(parse_milli(s), Some(want), "{s}");
        }
    }

    #[test]
    fn garbage_is_not_a_quantity_and_does_not_panic() {
        for s in [
            "",
            "abc",
            "1.2.3",
            "1Xi",
            ".",
            "-",
            "1e999",
            "99999999999999999999999999999999999999999Ei",
        ] {
            assert_eq!(parse_milli(s), None, "{s}");
        }
        assert_eq!(units("junk"), 0);
    }

    #[test]
    fn units_round_up() {
        assert_eq!(units("1500m"), 2);
        assert_eq!(units("32Gi"), 32 * 1024 * 1024 * 1024);
    }
}
