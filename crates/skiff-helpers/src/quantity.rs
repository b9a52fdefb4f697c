//! Kubernetes quantities (`100m`, `1.5`, `512Mi`, `1G`, `1e3`) as exact
//! integers, after apimachinery's `resource.Quantity`: parsed once, read as
//! thousandths or whole units rounded up, written back in canonical form.
//!
//! A quantity is held as a count of nano-units (10⁻⁹), the finest precision
//! Kubernetes keeps: anything finer rounds up to the next nano-unit, as
//! `ParseQuantity` rounds. No floating point is involved until a caller
//! asks for [`Quantity::as_f64`].

use std::fmt;

/// How a quantity is written, chosen by the suffix it was parsed with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Format {
    /// `k`, `M`, `G`, … and `m`, `u`, `n`, or no suffix.
    DecimalSI,
    /// `Ki`, `Mi`, `Gi`, …
    BinarySI,
    /// `e3`, `E-6`, …
    DecimalExponent,
}

/// An exact quantity.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Quantity {
    nano: i128,
    format: Format,
}

/// Text that is not a quantity.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QuantityError;

impl fmt::Display for QuantityError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(
            "quantities must match the regular expression '^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'",
        )
    }
}

impl std::error::Error for QuantityError {}

const NANO: i128 = 1_000_000_000;

/// The largest magnitude a quantity holds: 2⁶³−1 units. Kubernetes caps
/// larger values there rather than refusing them.
const CAP: i128 = i64::MAX as i128 * NANO;

/// Integer division rounding toward positive infinity.
fn div_ceil(n: i128, d: i128) -> i128 {
    let q = n / d;
    if n % d != 0 && (n > 0) == (d > 0) {
        q + 1
    } else {
        q
    }
}

fn saturate(v: i128) -> i64 {
    v.clamp(i64::MIN as i128, i64::MAX as i128) as i64
}

impl Quantity {
    /// Parses `s` as `resource.ParseQuantity` accepts it: values finer
    /// than a nano-unit round up to one, values beyond 2⁶³−1 units are
    /// capped there.
    pub fn parse(s: &str) -> Result<Quantity, QuantityError> {
        if s.is_empty() {
            return Err(QuantityError);
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
            return Err(QuantityError);
        }
        let (int_part, frac_part) = num.split_once('.').unwrap_or((num, ""));
        // The significant digits, and how many of them follow the point.
        let digits = format!("{int_part}{frac_part}");
        let digits = digits.trim_start_matches('0');
        let mut frac_len = frac_part.len() as i64;
        // Digits beyond 36 cannot change a capped or nano-rounded value
        // except to round it up: keep 36 and remember whether any were cut.
        let (kept, cut) = if digits.len() > 36 {
            (&digits[..36], digits[36..].bytes().any(|b| b != b'0'))
        } else {
            (digits, false)
        };
        frac_len -= (digits.len() - kept.len()) as i64;
        let mantissa: i128 = if kept.is_empty() {
            0
        } else {
            kept.parse().map_err(|_| QuantityError)?
        };
        let (format, binary_exp, decimal_exp): (Format, u32, i32) = match suffix {
            "" => (Format::DecimalSI, 0, 0),
            "n" => (Format::DecimalSI, 0, -9),
            "u" => (Format::DecimalSI, 0, -6),
            "m" => (Format::DecimalSI, 0, -3),
            "k" => (Format::DecimalSI, 0, 3),
            "M" => (Format::DecimalSI, 0, 6),
            "G" => (Format::DecimalSI, 0, 9),
            "T" => (Format::DecimalSI, 0, 12),
            "P" => (Format::DecimalSI, 0, 15),
            "E" => (Format::DecimalSI, 0, 18),
            "Ki" => (Format::BinarySI, 10, 0),
            "Mi" => (Format::BinarySI, 20, 0),
            "Gi" => (Format::BinarySI, 30, 0),
            "Ti" => (Format::BinarySI, 40, 0),
            "Pi" => (Format::BinarySI, 50, 0),
            "Ei" => (Format::BinarySI, 60, 0),
            e if e.starts_with(['e', 'E']) => {
                let x = &e[1..];
                let digits = x.strip_prefix(['+', '-']).unwrap_or(x);
                if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
                    return Err(QuantityError);
                }
                // Beyond ±100 the value is capped or rounded to a nano-unit anyway.
                let x: i32 = x
                    .parse::<i64>()
                    .map_or(if x.starts_with('-') { -100 } else { 100 }, |v| {
                        v.clamp(-100, 100) as i32
                    });
                (Format::DecimalExponent, 0, x)
            }
            _ => return Err(QuantityError),
        };
        // nano = mantissa × 10^(9 − fraction digits + decimal_exp) × 2^binary_exp
        let ten = 9 - frac_len + decimal_exp as i64;
        let nano = mantissa.checked_mul(1i128 << binary_exp).and_then(|n| {
            if ten >= 0 {
                10i128
                    .checked_pow(ten as u32)
                    .and_then(|m| n.checked_mul(m))
            } else {
                // Finer than a nano-unit: round the magnitude up, as
                // Kubernetes rounds before negating.
                Some(match 10i128.checked_pow((-ten) as u32) {
                    Some(d) => div_ceil(n, d) + i128::from(cut && n % d == 0),
                    None => i128::from(n != 0),
                })
            }
        });
        let nano = nano.map_or(CAP, |n| n.min(CAP));
        Ok(Quantity {
            nano: if neg { -nano } else { nano },
            format,
        })
    }

    /// A quantity of `nano` nano-units (capped at 2⁶³−1 units), written in
    /// `format`.
    pub fn from_nano(nano: i128, format: Format) -> Quantity {
        Quantity {
            nano: nano.clamp(-CAP, CAP),
            format,
        }
    }

    /// A quantity of `milli` thousandths of a unit, written in `format`.
    pub fn from_milli(milli: i128, format: Format) -> Quantity {
        Quantity {
            nano: milli.saturating_mul(1_000_000),
            format,
        }
    }

    /// A quantity of `units` whole units, written in `format`.
    pub fn from_units(units: i128, format: Format) -> Quantity {
        Quantity {
            nano: units.saturating_mul(NANO),
            format,
        }
    }

    /// The exact value in nano-units.
    pub fn nano(&self) -> i128 {
        self.nano
    }

    pub fn format(&self) -> Format {
        self.format
    }

    /// Thousandths of a unit, rounded up (`MilliValue`): cpu millicores.
    pub fn milli_ceil(&self) -> i64 {
        saturate(div_ceil(self.nano, 1_000_000))
    }

    /// Whole units, rounded up (`Value`): bytes, counts.
    pub fn value_ceil(&self) -> i64 {
        saturate(div_ceil(self.nano, NANO))
    }

    /// The value in units as a float, for ratios and displays only.
    pub fn as_f64(&self) -> f64 {
        self.nano as f64 / NANO as f64
    }

    pub fn is_zero(&self) -> bool {
        self.nano == 0
    }

    /// The sum, in this quantity's format (saturating).
    pub fn add(&self, o: &Quantity) -> Quantity {
        Quantity {
            nano: self.nano.saturating_add(o.nano),
            format: self.format,
        }
    }

    /// The difference, in this quantity's format (saturating).
    pub fn sub(&self, o: &Quantity) -> Quantity {
        Quantity {
            nano: self.nano.saturating_sub(o.nano),
            format: self.format,
        }
    }

    /// The canonical form Kubernetes serializes (`String()`): the largest
    /// suffix of the quantity's format that leaves an integer; a binary
    /// quantity that is fractional or below 1024 is written as decimal.
    pub fn canonical(&self) -> String {
        let neg = self.nano < 0;
        let mag = self.nano.unsigned_abs();
        let sign = if neg { "-" } else { "" };
        if mag == 0 {
            return "0".into();
        }
        let whole = mag.is_multiple_of(NANO as u128);
        if self.format == Format::BinarySI && whole && mag / NANO as u128 >= 1024 {
            let mut v = mag / NANO as u128;
            let mut k = 0;
            while k < 6 && v.is_multiple_of(1024) {
                v /= 1024;
                k += 1;
            }
            let suffix = ["", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei"][k];
            return format!("{sign}{v}{suffix}");
        }
        // Decimal: the exponent (a multiple of 3, from -9) leaving an integer.
        let mut v = mag;
        let mut exp = -9;
        while exp < 18 && v.is_multiple_of(1000) {
            v /= 1000;
            exp += 3;
        }
        if self.format == Format::DecimalExponent {
            return if exp == 0 {
                format!("{sign}{v}")
            } else {
                format!("{sign}{v}e{exp}")
            };
        }
        let suffix = match exp {
            -9 => "n",
            -6 => "u",
            -3 => "m",
            0 => "",
            3 => "k",
            6 => "M",
            9 => "G",
            12 => "T",
            15 => "P",
            _ => "E",
        };
        format!("{sign}{v}{suffix}")
    }
}

impl PartialOrd for Quantity {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.nano.cmp(&other.nano))
    }
}

impl fmt::Display for Quantity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.canonical())
    }
}

impl std::str::FromStr for Quantity {
    type Err = QuantityError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Quantity::parse(s)
    }
}

/// Thousandths of a unit of `s`, rounded up; `None` when it is no quantity.
pub fn milli(s: &str) -> Option<i64> {
    Quantity::parse(s).ok().map(|q| q.milli_ceil())
}

/// Whole units of `s`, rounded up; `None` when it is no quantity.
pub fn units(s: &str) -> Option<i64> {
    Quantity::parse(s).ok().map(|q| q.value_ceil())
}

/// A quantity as JSON gives it: a string, or a bare number (which
/// Kubernetes accepts on input).
pub fn from_json(v: &serde_json::Value) -> Option<Quantity> {
    match v {
        serde_json::Value::String(s) => Quantity::parse(s).ok(),
        serde_json::Value::Number(n) => Quantity::parse(&n.to_string()).ok(),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn q(s: &str) -> Quantity {
        Quantity::parse(s).unwrap_or_else(|e| panic!("{s}: {e}"))
    }

    #[test]
    fn parses_exactly_with_kubernetes_roundings() {
        // text, milli (rounded up), units (rounded up)
        let cases: &[(&str, i64, i64)] = &[
            ("0", 0, 0),
            ("100m", 100, 1),
            ("0.1", 100, 1),
            (".5", 500, 1),
            ("5.", 5000, 5),
            ("1", 1000, 1),
            ("1.5", 1500, 2),
            ("+2", 2000, 2),
            ("2k", 2_000_000, 2000),
            ("1Ki", 1_024_000, 1024),
            ("1.5Gi", 1_610_612_736_000, 1_610_612_736),
            ("500Mi", 524_288_000_000, 524_288_000),
            ("1e3", 1_000_000, 1000),
            ("1E-3", 1, 1),
            ("1n", 1, 1),
            ("1u", 1, 1),
            ("1500u", 2, 1),
            ("0.0001", 1, 1),
            ("-100m", -100, 0),
            ("-1.5", -1500, -1),
            ("12E", i64::MAX, i64::MAX),
            ("1e99", i64::MAX, i64::MAX),
        ];
        for (s, m, u) in cases {
            let v = q(s);
            assert_eq!(v.milli_ceil(), *m, "milli of {s}");
            assert_eq!(v.value_ceil(), *u, "units of {s}");
        }
    }

    #[test]
    fn finer_than_a_nano_unit_rounds_up() {
        assert_eq!(q("0.1n").nano(), 1);
        assert_eq!(q("1.0000000001").nano(), 1_000_000_001);
        assert_eq!(q("-0.1n").nano(), -1);
        assert_eq!(q("1e-40").nano(), 1);
        assert_eq!(q("1e-999").nano(), 1);
        assert_eq!(q("0e-40").nano(), 0);
        // Digits past the 36th still round up.
        assert_eq!(q("0.0000000000000000000000000000000000000001").nano(), 1);
        assert_eq!(
            q("1.0000000000000000000000000000000000000000001").nano(),
            1_000_000_001
        );
    }

    #[test]
    fn refuses_what_kubernetes_refuses() {
        for s in [
            "", "m", "1.2.3", "1mi", "1KiB", "1 Gi", "Gi", "1e", "1e+", "e3", ".", "--1", "1k1",
            "0x10", "1e1.5", "1e--1",
        ] {
            assert!(Quantity::parse(s).is_err(), "{s:?} parsed");
        }
        assert_eq!(Quantity::parse("abc"), Err(QuantityError));
    }

    #[test]
    fn canonical_forms_are_kubernetes_own() {
        let cases = [
            ("0", "0"),
            ("0.0", "0"),
            ("1000m", "1"),
            ("1.5", "1500m"),
            ("1500", "1500"),
            ("2000", "2k"),
            ("1000000", "1M"),
            ("0.1", "100m"),
            ("1500u", "1500u"),
            ("1024", "1024"),
            ("1Ki", "1Ki"),
            ("1024Ki", "1Mi"),
            ("1536Ki", "1536Ki"),
            ("0.5Gi", "512Mi"),
            ("1.5Ki", "1536"),
            ("512", "512"),
            ("1e3", "1e3"),
            ("1500e0", "1500"),
            ("1e-3", "1e-3"),
            ("-2k", "-2k"),
            ("5.0", "5"),
        ];
        for (input, want) in cases {
            assert_eq!(q(input).canonical(), want, "canonical form of {input}");
        }
    }

    #[test]
    fn values_beyond_the_cap_are_capped_not_refused() {
        assert_eq!(q("1e30").value_ceil(), i64::MAX);
        assert_eq!(q("-1e30").value_ceil(), -i64::MAX);
        assert_eq!(
            q("99999999999999999999999999999999999999999999Ei").value_ceil(),
            i64::MAX
        );
        assert_eq!(q("9223372036854775807").value_ceil(), i64::MAX);
    }

    #[test]
    fn equal_values_compare_equal_whatever_their_text() {
        assert_eq!(q("1").nano(), q("1000m").nano());
        assert!(q("1Gi") > q("1G"));
        assert!(q("100m") < q("0.2"));
    }

    #[test]
    fn built_from_numbers_and_json() {
        assert_eq!(
            Quantity::from_milli(1500, Format::DecimalSI).canonical(),
            "1500m"
        );
        assert_eq!(
            Quantity::from_units(2048, Format::BinarySI).canonical(),
            "2Ki"
        );
        assert_eq!(
            from_json(&serde_json::json!(2)).map(|q| q.milli_ceil()),
            Some(2000)
        );
        assert_eq!(
            from_json(&serde_json::json!("250m")).map(|q| q.milli_ceil()),
            Some(250)
        );
        assert_eq!(from_json(&serde_json::json!(true)), None);
        assert_eq!(milli("bad"), None);
        assert_eq!(units("1Mi"), Some(1 << 20));
    }
}
