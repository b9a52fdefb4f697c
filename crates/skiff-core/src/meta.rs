//! Object metadata rules: name formats, generated names, label and
//! annotation validation, and what may not change on update.

use serde_json::{json, Value};

use crate::kinds::NameRule;
use crate::resources::ResourceInfo;
use crate::Cause;

pub(crate) const DNS1123_SUBDOMAIN_MSG: &str = "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character (e.g. 'example.com', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')";
pub(crate) const DNS1123_LABEL_MSG: &str = "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and end with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?')";

pub use skiff_helpers::names::{is_dns1035_label, is_dns1123_label, is_dns1123_subdomain};

pub(crate) const DNS1035_LABEL_MSG: &str = "a DNS-1035 label must consist of lower case alphanumeric characters or '-', start with an alphabetic character, and end with an alphanumeric character (e.g. 'my-name',  or 'abc-123', regex used for validation is '[a-z]([-a-z0-9]*[a-z0-9])?')";

/// `prefix` plus five random characters from Kubernetes' alphabet, the prefix
/// cut so the name stays within 63 characters.
pub fn with_generated_name(prefix: &str, random: u64) -> String {
    const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
    let mut prefix: String = prefix.to_string();
    if prefix.len() > 58 {
        prefix.truncate(58);
    }
    let mut r = random;
    let mut out = prefix;
    for _ in 0..5 {
        out.push(ALPHABET[(r % ALPHABET.len() as u64) as usize] as char);
        r /= ALPHABET.len() as u64;
    }
    out
}

/// How a kind's names are checked.
fn name_rule(res: &ResourceInfo) -> fn(&str) -> Option<String> {
    match res.rules.name_rule() {
        NameRule::Label => |n| (!is_dns1123_label(n)).then(|| DNS1123_LABEL_MSG.to_string()),
        NameRule::PathSegment => |n| {
            if n == "." || n == ".." {
                Some(format!("may not be '{n}'"))
            } else if n.contains('/') || n.contains('%') {
                Some("may not contain '/' or '%'".to_string())
            } else {
                None
            }
        },
        NameRule::Subdomain => {
            |n| (!is_dns1123_subdomain(n)).then(|| DNS1123_SUBDOMAIN_MSG.to_string())
        }
    }
}

/// Checks `metadata` of an object being created or updated.
pub fn validate_object_meta(res: &ResourceInfo, obj: &Value, _is_create: bool) -> Vec<Cause> {
    let mut causes = Vec::new();
    let meta = obj.get("metadata").cloned().unwrap_or(json!({}));
    let name = meta.get("name").and_then(Value::as_str).unwrap_or("");
    if name.is_empty() {
        causes.push(Cause::new(
            "FieldValueRequired",
            "metadata.name",
            "Required value: name or generateName is required",
        ));
    } else if let Some(msg) = name_rule(res)(name) {
        causes.push(Cause::invalid("metadata.name", &json!(name), &msg));
    }
    if let Some(labels) = meta.get("labels") {
        match labels.as_object() {
            Some(m) => {
                for (k, v) in m {
                    if let Err(e) = crate::selector::validate_label_key(k) {
                        causes.push(Cause::invalid("metadata.labels", &json!(k), &e));
                    }
                    match v.as_str() {
                        Some(s) => {
                            if crate::selector::validate_label_value(s).is_err() {
                                causes.push(Cause::invalid(
                                    "metadata.labels",
                                    v,
                                    "a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyValue',  or 'my_value',  or '12345', regex used for validation is '(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?')",
                                ));
                            }
                        }
                        None => {
                            causes.push(Cause::invalid("metadata.labels", v, "must be a string"))
                        }
                    }
                }
            }
            None if labels.is_null() => {}
            None => causes.push(Cause::invalid(
                "metadata.labels",
                labels,
                "must be a map of strings",
            )),
        }
    }
    if let Some(ann) = meta.get("annotations").and_then(Value::as_object) {
        let mut total = 0usize;
        for (k, v) in ann {
            if let Err(e) = crate::selector::validate_label_key(k) {
                causes.push(Cause::invalid("metadata.annotations", &json!(k), &e));
            }
            total += k.len() + v.as_str().map(str::len).unwrap_or(0);
        }
        if total > 256 * 1024 {
            causes.push(Cause::new(
                "FieldValueTooLong",
                "metadata.annotations",
                "Too long: may not be more than 262144 bytes",
            ));
        }
    }
    causes
}

/// Metadata that may not change once an object exists.
pub fn validate_object_meta_update(new: &Value, old: &Value) -> Vec<Cause> {
    let mut causes = Vec::new();
    // An object being deleted may lose finalizers but gain none.
    if old
        .pointer("/metadata/deletionTimestamp")
        .map(|v| !v.is_null())
        .unwrap_or(false)
    {
        let list = |v: &Value| -> Vec<String> {
            v.pointer("/metadata/finalizers")
                .and_then(Value::as_array)
                .map(|a| {
                    a.iter()
                        .filter_map(|f| f.as_str().map(str::to_string))
                        .collect()
                })
                .unwrap_or_default()
        };
        let before = list(old);
        if list(new).iter().any(|f| !before.contains(f)) {
            causes.push(Cause::forbidden(
                "metadata.finalizers",
                "no new finalizers can be added if the object is being deleted",
            ));
        }
    }
    for f in ["name", "namespace", "uid", "creationTimestamp"] {
        let a = new.pointer(&format!("/metadata/{f}"));
        let b = old.pointer(&format!("/metadata/{f}"));
        if a != b {
            causes.push(Cause::invalid(
                format!("metadata.{f}"),
                a.unwrap_or(&Value::Null),
                "field is immutable",
            ));
        }
    }
    causes
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resources::lookup;

    #[test]
    fn generated_names_keep_the_prefix_and_add_five_characters() {
        let n = with_generated_name("web-", 12345);
        assert!(n.starts_with("web-") && n.len() == 9);
        assert_ne!(
            with_generated_name("web-", 1),
            with_generated_name("web-", 2)
        );
    }

    #[test]
    fn an_upper_case_pod_name_is_invalid() {
        let pods = lookup("", "v1", "pods").unwrap();
        let c = validate_object_meta(pods, &json!({"metadata": {"name": "Foo"}}), true);
        assert_eq!(c[0].field, "metadata.name");
        assert!(c[0]
            .message
            .starts_with("Invalid value: \"Foo\": a lowercase RFC 1123 subdomain"));
    }

    #[test]
    fn an_object_being_deleted_gains_no_finalizers() {
        let old = json!({"metadata": {"name": "a", "deletionTimestamp": "2026-01-01T00:00:00Z", "finalizers": ["x"]}});
        let more = json!({"metadata": {"name": "a", "deletionTimestamp": "2026-01-01T00:00:00Z", "finalizers": ["x", "y"]}});
        let fewer = json!({"metadata": {"name": "a", "deletionTimestamp": "2026-01-01T00:00:00Z", "finalizers": []}});
        assert_eq!(
            validate_object_meta_update(&more, &old)[0].field,
            "metadata.finalizers"
        );
        assert!(validate_object_meta_update(&fewer, &old).is_empty());
    }

    #[test]
    fn namespaces_may_not_contain_dots() {
        let ns = lookup("", "v1", "namespaces").unwrap();
        assert_eq!(
            validate_object_meta(ns, &json!({"metadata": {"name": "a.b"}}), true).len(),
            1
        );
        assert!(validate_object_meta(ns, &json!({"metadata": {"name": "a-b"}}), true).is_empty());
    }
}
