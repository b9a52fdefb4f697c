//! The scheduler's reading of quantities: millicores and whole units,
//! rounded up, 0 for text that is no quantity (validation refused it
//! already). One definition, in `skiff_helpers::quantity`.

/// Millicores (or thousandths of any unit); 0 for unparsable text.
pub fn milli(s: &str) -> i64 {
    skiff_helpers::quantity::milli(s).unwrap_or(0)
}

/// Whole units rounded up (bytes, counts); 0 for unparsable text.
pub fn units(s: &str) -> i64 {
    skiff_helpers::quantity::units(s).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_that_is_no_quantity_reads_as_zero() {
        assert_eq!(milli("junk"), 0);
        assert_eq!(units("1.2.3"), 0);
        assert_eq!(milli("250m"), 250);
        assert_eq!(units("1500m"), 2);
    }
}
