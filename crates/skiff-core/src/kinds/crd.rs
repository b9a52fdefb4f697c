//! CustomResourceDefinition (apiextensions.k8s.io/v1): defaults and
//! kube-apiserver's validation of the definition itself. A definition that
//! fails any check is refused whole, with every reason.

use super::prelude::*;
use crate::meta::{
    is_dns1035_label, is_dns1123_label, is_dns1123_subdomain, DNS1035_LABEL_MSG as DNS1035_MSG,
    DNS1123_LABEL_MSG as LABEL_MSG,
};

pub struct CustomResourceDefinition;

pub static CRD_PRINTER: Printer = Printer {
    columns: &[NAME, col("Created At", "date", 0)],
    cells: |obj, _now| {
        vec![
            json!(s(obj, "/metadata/name")),
            json!(s(obj, "/metadata/creationTimestamp")),
        ]
    },
};

impl KindRules for CustomResourceDefinition {
    fn kind(&self) -> &'static str {
        "CustomResourceDefinition"
    }

    fn defaults(&self, obj: &mut Value) {
        let Some(spec) = obj.get_mut("spec").and_then(Value::as_object_mut) else {
            return;
        };
        let conv = spec.entry("conversion").or_insert_with(|| json!({}));
        if let Some(c) = conv.as_object_mut() {
            c.entry("strategy").or_insert_with(|| json!("None"));
            if c.get("strategy").and_then(Value::as_str) == Some("Webhook") {
                if let Some(w) = c.get_mut("webhook").and_then(Value::as_object_mut) {
                    if let Some(svc) = w
                        .get_mut("clientConfig")
                        .and_then(|cc| cc.get_mut("service"))
                        .and_then(Value::as_object_mut)
                    {
                        svc.entry("port").or_insert_with(|| json!(443));
                    }
                }
            }
        }
        if let Some(names) = spec.get_mut("names").and_then(Value::as_object_mut) {
            let kind = names
                .get("kind")
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_string();
            if !kind.is_empty() {
                names
                    .entry("listKind")
                    .or_insert_with(|| json!(format!("{kind}List")));
                names
                    .entry("singular")
                    .or_insert_with(|| json!(kind.to_lowercase()));
            }
        }
    }

    fn initial_status(&self) -> Option<Value> {
        Some(json!({
            "acceptedNames": {"plural": "", "kind": ""},
            "storedVersions": [],
        }))
    }

    fn validate(&self, obj: &Value) -> Vec<Cause> {
        validate(obj)
    }

    fn validate_update(&self, new: &Value, old: &Value) -> Vec<Cause> {
        let mut out = Vec::new();
        let old_scope = old.pointer("/spec/scope").and_then(Value::as_str);
        let new_scope = new.pointer("/spec/scope").and_then(Value::as_str);
        if old_scope.is_some() && old_scope != new_scope {
            out.push(Cause::invalid(
                "spec.scope",
                new.pointer("/spec/scope").unwrap_or(&Value::Null),
                "field is immutable",
            ));
        }
        // Every version ever stored must stay a version of the definition.
        let versions: Vec<&str> = versions(new).iter().map(|v| str_at(v, "/name")).collect();
        if let Some(stored) = new
            .pointer("/status/storedVersions")
            .and_then(Value::as_array)
        {
            for (i, sv) in stored.iter().enumerate() {
                if let Some(s) = sv.as_str() {
                    if !versions.contains(&s) {
                        out.push(Cause::invalid(
                            format!("status.storedVersions[{i}]"),
                            sv,
                            "must appear in spec.versions",
                        ));
                    }
                }
            }
        }
        out
    }

    fn printer(&self) -> &'static Printer {
        &CRD_PRINTER
    }

    fn tracks_generation(&self) -> bool {
        true
    }
}

fn str_at<'a>(v: &'a Value, ptr: &str) -> &'a str {
    v.pointer(ptr).and_then(Value::as_str).unwrap_or("")
}

fn versions(obj: &Value) -> &[Value] {
    obj.pointer("/spec/versions")
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or(&[])
}

/// kube-apiserver's checks of a CustomResourceDefinition (names, versions,
/// schemas present, subresources, printer columns, conversion).
pub fn validate(obj: &Value) -> Vec<Cause> {
    let mut out = Vec::new();
    let name = str_at(obj, "/metadata/name");
    let group = str_at(obj, "/spec/group");
    let plural = str_at(obj, "/spec/names/plural");
    if name != format!("{plural}.{group}") {
        out.push(Cause::invalid(
            "metadata.name",
            &json!(name),
            "must be spec.names.plural+\".\"+spec.group",
        ));
    }
    if group.is_empty() {
        out.push(Cause::required("spec.group"));
    } else if !is_dns1123_subdomain(group) {
        out.push(Cause::invalid(
            "spec.group",
            &json!(group),
            "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character (e.g. 'example.com', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')",
        ));
    } else if !group.contains('.') {
        out.push(Cause::invalid(
            "spec.group",
            &json!(group),
            "should be a domain with at least one dot",
        ));
    }
    match obj.pointer("/spec/scope").and_then(Value::as_str) {
        Some("Cluster") | Some("Namespaced") => {}
        None | Some("") => out.push(Cause::required("spec.scope")),
        Some(s) => out.push(Cause::not_supported(
            "spec.scope",
            &json!(s),
            &["Cluster", "Namespaced"],
        )),
    }
    validate_names(obj.pointer("/spec/names"), "spec.names", &mut out);
    validate_versions(obj, &mut out);
    validate_conversion(obj, &mut out);
    if obj.pointer("/spec/preserveUnknownFields") == Some(&json!(true)) {
        out.push(Cause::invalid(
            "spec.preserveUnknownFields",
            &json!(true),
            "must be false in order to use defaults in the schema",
        ));
    }
    out
}

fn validate_names(names: Option<&Value>, path: &str, out: &mut Vec<Cause>) {
    let empty = json!({});
    let names = names.unwrap_or(&empty);
    let plural = str_at(names, "/plural");
    let singular = str_at(names, "/singular");
    let kind = str_at(names, "/kind");
    let list_kind = str_at(names, "/listKind");
    if plural.is_empty() {
        out.push(Cause::required(format!("{path}.plural")));
    } else if !is_dns1123_label(plural) {
        out.push(Cause::invalid(
            format!("{path}.plural"),
            &json!(plural),
            LABEL_MSG,
        ));
    }
    if singular.is_empty() {
        out.push(Cause::required(format!("{path}.singular")));
    } else if !is_dns1123_label(singular) {
        out.push(Cause::invalid(
            format!("{path}.singular"),
            &json!(singular),
            LABEL_MSG,
        ));
    }
    for (field, v) in [("kind", kind), ("listKind", list_kind)] {
        if v.is_empty() {
            out.push(Cause::required(format!("{path}.{field}")));
        } else if !is_dns1035_label(&v.to_lowercase()) {
            out.push(Cause::invalid(
                format!("{path}.{field}"),
                &json!(v),
                &format!(
                    "may have mixed case, but should otherwise match: {}",
                    "[a-z]([-a-z0-9]*[a-z0-9])?"
                ),
            ));
        }
    }
    if !kind.is_empty() && kind == list_kind {
        out.push(Cause::invalid(
            format!("{path}.listKind"),
            &json!(list_kind),
            "kind and listKind may not be the same",
        ));
    }
    for (field, list) in [("shortNames", "/shortNames"), ("categories", "/categories")] {
        if let Some(items) = names.pointer(list).and_then(Value::as_array) {
            for (i, s) in items.iter().enumerate() {
                let v = s.as_str().unwrap_or("");
                if !is_dns1123_label(v) {
                    out.push(Cause::invalid(format!("{path}.{field}[{i}]"), s, LABEL_MSG));
                }
            }
        }
    }
}

fn validate_versions(obj: &Value, out: &mut Vec<Cause>) {
    let vs = versions(obj);
    if vs.is_empty() {
        out.push(Cause::required("spec.versions"));
        return;
    }
    let top_schema = obj.pointer("/spec/validation").is_some();
    let mut seen = std::collections::BTreeSet::new();
    let mut storage = 0;
    let mut served = 0;
    for (i, v) in vs.iter().enumerate() {
        let p = format!("spec.versions[{i}]");
        let name = str_at(v, "/name");
        if name.is_empty() {
            out.push(Cause::required(format!("{p}.name")));
        } else if !is_dns1035_label(name) {
            out.push(Cause::invalid(
                format!("{p}.name"),
                &json!(name),
                DNS1035_MSG,
            ));
        } else if !seen.insert(name.to_string()) {
            out.push(Cause::duplicate(format!("{p}.name"), &json!(name)));
        }
        if v.get("storage").and_then(Value::as_bool) == Some(true) {
            storage += 1;
        }
        if v.get("served").and_then(Value::as_bool) == Some(true) {
            served += 1;
        }
        if v.pointer("/schema/openAPIV3Schema").is_none() && !top_schema {
            out.push(Cause::new(
                "FieldValueRequired",
                format!("{p}.schema.openAPIV3Schema"),
                "Required value: schemas are required",
            ));
        } else if let Some(s) = v.pointer("/schema/openAPIV3Schema") {
            // Structural, with every keyword, extension and CEL rule checked.
            if let Err(causes) =
                crate::crd_schema::Schema::compile(s, &format!("{p}.schema.openAPIV3Schema"))
            {
                out.extend(causes);
            }
        }
        validate_subresources(v, &p, out);
        validate_printer_columns(v, &p, out);
        validate_selectable_fields(v, &p, out);
        if let Some(w) = v.get("deprecationWarning").and_then(Value::as_str) {
            if v.get("deprecated").and_then(Value::as_bool) != Some(true) {
                out.push(Cause::invalid(
                    format!("{p}.deprecationWarning"),
                    &json!(w),
                    "can only be set for deprecated versions",
                ));
            } else if w.len() > 256 {
                out.push(Cause::new(
                    "FieldValueTooLong",
                    format!("{p}.deprecationWarning"),
                    "Too long: may not be more than 256 bytes",
                ));
            }
        }
    }
    if storage != 1 {
        out.push(Cause::invalid(
            "spec.versions",
            &Value::Array(vs.to_vec()),
            "must have exactly one version marked as storage version",
        ));
    }
    if served == 0 {
        out.push(Cause::invalid(
            "spec.versions",
            &Value::Array(vs.to_vec()),
            "must have at least one served version",
        ));
    }
}

fn validate_subresources(v: &Value, p: &str, out: &mut Vec<Cause>) {
    let Some(scale) = v.pointer("/subresources/scale") else {
        return;
    };
    let sp = format!("{p}.subresources.scale");
    let spec_path = str_at(scale, "/specReplicasPath");
    if spec_path.is_empty() {
        out.push(Cause::required(format!("{sp}.specReplicasPath")));
    } else if !spec_path.starts_with(".spec.") {
        out.push(Cause::invalid(
            format!("{sp}.specReplicasPath"),
            &json!(spec_path),
            "should be a json path under .spec",
        ));
    }
    let status_path = str_at(scale, "/statusReplicasPath");
    if status_path.is_empty() {
        out.push(Cause::required(format!("{sp}.statusReplicasPath")));
    } else if !status_path.starts_with(".status.") {
        out.push(Cause::invalid(
            format!("{sp}.statusReplicasPath"),
            &json!(status_path),
            "should be a json path under .status",
        ));
    }
    let sel = str_at(scale, "/labelSelectorPath");
    if !(sel.is_empty() || sel.starts_with(".spec.") || sel.starts_with(".status.")) {
        out.push(Cause::invalid(
            format!("{sp}.labelSelectorPath"),
            &json!(sel),
            "should be a json path under either .spec or .status",
        ));
    }
}

fn validate_printer_columns(v: &Value, p: &str, out: &mut Vec<Cause>) {
    let Some(cols) = v.get("additionalPrinterColumns").and_then(Value::as_array) else {
        return;
    };
    for (i, c) in cols.iter().enumerate() {
        let cp = format!("{p}.additionalPrinterColumns[{i}]");
        if str_at(c, "/name").is_empty() {
            out.push(Cause::required(format!("{cp}.name")));
        }
        let t = str_at(c, "/type");
        if t.is_empty() {
            out.push(Cause::required(format!("{cp}.type")));
        } else if !["integer", "number", "string", "boolean", "date"].contains(&t) {
            out.push(Cause::not_supported(
                format!("{cp}.type"),
                &json!(t),
                &["integer", "number", "string", "boolean", "date"],
            ));
        }
        let f = str_at(c, "/format");
        if !f.is_empty()
            && ![
                "int32",
                "int64",
                "float",
                "double",
                "byte",
                "date",
                "date-time",
                "password",
            ]
            .contains(&f)
        {
            out.push(Cause::not_supported(
                format!("{cp}.format"),
                &json!(f),
                &[
                    "int32",
                    "int64",
                    "float",
                    "double",
                    "byte",
                    "date",
                    "date-time",
                    "password",
                ],
            ));
        }
        let path = str_at(c, "/jsonPath");
        if path.is_empty() {
            out.push(Cause::required(format!("{cp}.jsonPath")));
        } else if let Err(e) = crate::kinds::custom::JsonPath::parse(path) {
            out.push(Cause::invalid(
                format!("{cp}.jsonPath"),
                &json!(path),
                &format!("must be a simple json path: {e}"),
            ));
        }
    }
}

fn validate_selectable_fields(v: &Value, p: &str, out: &mut Vec<Cause>) {
    let Some(fields) = v.get("selectableFields").and_then(Value::as_array) else {
        return;
    };
    if fields.len() > 8 {
        out.push(Cause::new(
            "FieldValueTooMany",
            format!("{p}.selectableFields"),
            format!("Too many: {}: must have at most 8 items", fields.len()),
        ));
    }
    let mut seen = std::collections::BTreeSet::new();
    for (i, f) in fields.iter().enumerate() {
        let fp = format!("{p}.selectableFields[{i}].jsonPath");
        let path = str_at(f, "/jsonPath");
        if path.is_empty() {
            out.push(Cause::required(fp));
            continue;
        }
        if crate::kinds::custom::JsonPath::parse(path).is_err() || path.contains('[') {
            out.push(Cause::invalid(
                fp.clone(),
                &json!(path),
                "must be a simple json path starting with .",
            ));
        } else if path.starts_with(".metadata") {
            out.push(Cause::invalid(
                fp.clone(),
                &json!(path),
                "must not select from .metadata",
            ));
        }
        if !seen.insert(path.to_string()) {
            out.push(Cause::duplicate(fp, &json!(path)));
        }
    }
}

fn validate_conversion(obj: &Value, out: &mut Vec<Cause>) {
    let strategy = obj
        .pointer("/spec/conversion/strategy")
        .and_then(Value::as_str)
        .unwrap_or("None");
    match strategy {
        "None" => {
            if obj.pointer("/spec/conversion/webhook").is_some() {
                out.push(Cause::forbidden(
                    "spec.conversion.webhook",
                    "should not be set when strategy is not set to Webhook",
                ));
            }
        }
        "Webhook" => {
            let Some(w) = obj.pointer("/spec/conversion/webhook") else {
                out.push(Cause::required("spec.conversion.webhook"));
                return;
            };
            let cc = w.get("clientConfig");
            let url = cc.and_then(|c| c.get("url")).is_some();
            let svc = cc.and_then(|c| c.get("service")).is_some();
            if url == svc {
                out.push(Cause::new(
                    "FieldValueRequired",
                    "spec.conversion.webhook.clientConfig",
                    "Required value: exactly one of url or service is required",
                ));
            }
            let reviews = w
                .get("conversionReviewVersions")
                .and_then(Value::as_array)
                .map(|a| a.iter().any(|v| v.as_str() == Some("v1")))
                .unwrap_or(false);
            if !reviews {
                out.push(Cause::invalid(
                    "spec.conversion.webhook.conversionReviewVersions",
                    w.get("conversionReviewVersions").unwrap_or(&json!([])),
                    "must include at least one of v1",
                ));
            }
        }
        other => out.push(Cause::not_supported(
            "spec.conversion.strategy",
            &json!(other),
            &["None", "Webhook"],
        )),
    }
}

/// Kubernetes' version priority (`v1` > `v1beta2` > `v1beta1` > `v1alpha1`
/// > anything else by name): the sort key of a CRD's versions in discovery.
pub fn version_priority(v: &str) -> (u8, u64, u64, String) {
    let parse = || -> Option<(u8, u64, u64)> {
        let rest = v.strip_prefix('v')?;
        let digits: String = rest.chars().take_while(|c| c.is_ascii_digit()).collect();
        if digits.is_empty() || digits.starts_with('0') {
            return None;
        }
        let major: u64 = digits.parse().ok()?;
        let tail = &rest[digits.len()..];
        if tail.is_empty() {
            return Some((3, major, 0));
        }
        for (kind, rank) in [("beta", 2u8), ("alpha", 1u8)] {
            if let Some(n) = tail.strip_prefix(kind) {
                if !n.is_empty() && !n.starts_with('0') && n.bytes().all(|b| b.is_ascii_digit()) {
                    return Some((rank, major, n.parse().ok()?));
                }
            }
        }
        None
    };
    match parse() {
        Some((rank, major, minor)) => (rank, u64::MAX - major, u64::MAX - minor, String::new()),
        None => (0, 0, 0, v.to_string()),
    }
}

/// Sorts versions, most preferred first.
pub fn sort_versions(vs: &mut [&str]) {
    vs.sort_by(|a, b| {
        let (ra, ma, na, sa) = version_priority(a);
        let (rb, mb, nb, sb) = version_priority(b);
        rb.cmp(&ra)
            .then(ma.cmp(&mb))
            .then(na.cmp(&nb))
            .then(sa.cmp(&sb))
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    fn crd() -> Value {
        json!({
            "apiVersion": "apiextensions.k8s.io/v1",
            "kind": "CustomResourceDefinition",
            "metadata": {"name": "widgets.example.com"},
            "spec": {
                "group": "example.com",
                "scope": "Namespaced",
                "names": {"plural": "widgets", "singular": "widget", "kind": "Widget", "listKind": "WidgetList"},
                "versions": [{"name": "v1", "served": true, "storage": true,
                    "schema": {"openAPIV3Schema": {"type": "object"}}}],
            }
        })
    }

    fn fields(c: &[Cause]) -> Vec<&str> {
        c.iter().map(|c| c.field.as_str()).collect()
    }

    #[test]
    fn a_good_definition_passes() {
        let mut c = crd();
        CustomResourceDefinition.defaults(&mut c);
        assert!(validate(&c).is_empty(), "{:?}", validate(&c));
        assert_eq!(c["spec"]["conversion"]["strategy"], "None");
    }

    #[test]
    fn name_must_be_plural_dot_group() {
        let mut c = crd();
        c["metadata"]["name"] = json!("widget.example.com");
        let causes = validate(&c);
        assert_eq!(fields(&causes), ["metadata.name"]);
        assert!(causes[0]
            .message
            .contains("must be spec.names.plural+\".\"+spec.group"));
    }

    #[test]
    fn every_reason_is_reported_at_once() {
        let mut c = crd();
        c["spec"]["group"] = json!("example");
        c["spec"]["names"]["plural"] = json!("Widgets");
        c["spec"]["versions"] = json!([
            {"name": "v1", "served": true, "storage": true, "schema": {"openAPIV3Schema": {"type": "object"}}},
            {"name": "v1", "served": true, "storage": true},
        ]);
        c["metadata"]["name"] = json!("Widgets.example");
        let f = validate(&c);
        let f = fields(&f);
        for want in [
            "spec.group",
            "spec.names.plural",
            "spec.versions[1].name",
            "spec.versions[1].schema.openAPIV3Schema",
            "spec.versions",
        ] {
            assert!(f.contains(&want), "{want} missing from {f:?}");
        }
    }

    #[test]
    fn scale_paths_and_printer_columns_are_checked() {
        let mut c = crd();
        c["spec"]["versions"][0]["subresources"] =
            json!({"scale": {"specReplicasPath": ".status.x", "statusReplicasPath": ".status.r"}});
        c["spec"]["versions"][0]["additionalPrinterColumns"] =
            json!([{"name": "X", "type": "strange", "jsonPath": ".spec[["}]);
        let f = validate(&c);
        let f = fields(&f);
        assert_eq!(
            f,
            [
                "spec.versions[0].subresources.scale.specReplicasPath",
                "spec.versions[0].additionalPrinterColumns[0].type",
                "spec.versions[0].additionalPrinterColumns[0].jsonPath",
            ]
        );
    }

    #[test]
    fn versions_sort_as_kubernetes_prefers_them() {
        let mut v = vec![
            "v1alpha1", "foo", "v2beta1", "v1", "v1beta2", "v1beta1", "v2",
        ];
        sort_versions(&mut v);
        assert_eq!(
            v,
            ["v2", "v1", "v2beta1", "v1beta2", "v1beta1", "v1alpha1", "foo"]
        );
    }
}
