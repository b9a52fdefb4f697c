//! The name rules of apimachinery's `util/validation` that more than one
//! part of skiff checks: RFC 1123 labels and subdomains, RFC 1035 labels
//! and IANA service (port) names. Their error messages live with the
//! validation that words them (skiff-core).

/// RFC 1123 label: lower-case alphanumerics and '-', at most 63
/// characters, starting and ending with an alphanumeric.
pub fn is_dns1123_label(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}

/// RFC 1123 subdomain: dot-separated labels, at most 253 characters.
pub fn is_dns1123_subdomain(s: &str) -> bool {
    !s.is_empty() && s.len() <= 253 && s.split('.').all(is_dns1123_label)
}

/// RFC 1035 label: an RFC 1123 label that starts with a letter (Service
/// names).
pub fn is_dns1035_label(s: &str) -> bool {
    is_dns1123_label(s) && s.as_bytes()[0].is_ascii_lowercase()
}

/// What is wrong with a port name (`IsValidPortName`: an IANA service
/// name), in Kubernetes' words; empty when it is valid.
pub fn port_name_errors(name: &str) -> Vec<&'static str> {
    let mut out = Vec::new();
    if name.len() > 15 {
        out.push("must be no more than 15 characters");
    }
    if !name
        .bytes()
        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
    {
        out.push("must contain only alpha-numeric characters (a-z, 0-9), and hyphens (-)");
    }
    if !name.bytes().any(|b| b.is_ascii_lowercase()) {
        out.push("must contain at least one letter (a-z)");
    }
    if name.contains("--") {
        out.push("must not contain consecutive hyphens");
    }
    if name.starts_with('-') || name.ends_with('-') {
        out.push("must not begin or end with a hyphen");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_subdomains_and_port_names() {
        assert!(is_dns1123_label("a-1") && is_dns1123_label("1a"));
        assert!(!is_dns1123_label("-a") && !is_dns1123_label("A") && !is_dns1123_label(""));
        assert!(!is_dns1123_label(&"a".repeat(64)));
        assert!(is_dns1123_subdomain("a.b-c.d") && !is_dns1123_subdomain("a..b"));
        assert!(is_dns1035_label("a1") && !is_dns1035_label("1a"));
        assert!(port_name_errors("http").is_empty());
        assert_eq!(
            port_name_errors("a--b"),
            ["must not contain consecutive hyphens"]
        );
        assert_eq!(
            port_name_errors("80"),
            ["must contain at least one letter (a-z)"]
        );
        assert!(!port_name_errors(&"a".repeat(16)).is_empty());
    }
}
