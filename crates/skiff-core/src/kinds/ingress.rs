//! Ingresses (`networking.k8s.io/v1`): kube-apiserver's checks of rules,
//! paths, backends, TLS hosts and the class, and `kubectl get`'s table.
//! skiff ships no ingress controller (as k3s without Traefik): an Ingress is
//! stored and served for whichever controller a user installs.

use super::prelude::*;
use crate::meta::{
    is_dns1035_label, is_dns1123_label, is_dns1123_subdomain, DNS1035_LABEL_MSG,
    DNS1123_SUBDOMAIN_MSG as SUBDOMAIN_MSG,
};
use skiff_helpers::names::port_name_errors;

pub struct Ingress;

/// The annotation older controllers read the class from.
const CLASS_ANNOTATION: &str = "kubernetes.io/ingress.class";

const WILDCARD_MSG: &str = "a wildcard DNS-1123 subdomain must start with '*.', followed by a valid DNS subdomain, which must consist of lower case alphanumeric characters, '-' or '.' and end with an alphanumeric character (e.g. '*.example.com', regex used for validation is '\\*\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')";

impl KindRules for Ingress {
    fn kind(&self) -> &'static str {
        "Ingress"
    }

    fn initial_status(&self) -> Option<Value> {
        Some(json!({"loadBalancer": {}}))
    }

    fn validate(&self, obj: &Value) -> Vec<Cause> {
        let mut c = validate_spec(obj.get("spec").unwrap_or(&Value::Null));
        if let (Some(a), Some(_)) = (
            obj.pointer("/metadata/annotations")
                .and_then(|a| a.get(CLASS_ANNOTATION)),
            obj.pointer("/spec/ingressClassName"),
        ) {
            // Only on create in Kubernetes; an update cannot add the
            // field beside the annotation either without this check
            // having refused the create, so checking always is the same.
            c.push(Cause::invalid(
                format!("annotations.{CLASS_ANNOTATION}"),
                a,
                "can not be set when the class field is also set",
            ));
        }
        c.extend(load_balancer_status(obj));
        c
    }

    fn tracks_generation(&self) -> bool {
        true
    }

    fn printer(&self) -> &'static Printer {
        &INGRESS_PRINTER
    }

    fn default_class(&self) -> Option<&'static super::DefaultClass> {
        Some(&DEFAULT_CLASS)
    }
}

static DEFAULT_CLASS: super::DefaultClass = super::DefaultClass {
    classes: ("networking.k8s.io", "v1", "ingressclasses"),
    marks: &["ingressclass.kubernetes.io/is-default-class"],
    field: "ingressClassName",
    chosen_by: CLASS_ANNOTATION,
};

fn validate_spec(spec: &Value) -> Vec<Cause> {
    let mut c = Vec::new();
    let rules = spec
        .get("rules")
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or(&[]);
    let default_backend = spec.get("defaultBackend").filter(|b| !b.is_null());
    if rules.is_empty() && default_backend.is_none() {
        // Go prints the rules slice it was given.
        let shown = if spec.get("rules").is_some_and(Value::is_array) {
            "[]networking.IngressRule{}"
        } else {
            "[]networking.IngressRule(nil)"
        };
        c.push(Cause::new(
            "FieldValueInvalid",
            "spec",
            format!("Invalid value: {shown}: either `defaultBackend` or `rules` must be specified"),
        ));
    }
    if let Some(b) = default_backend {
        backend(b, "spec.defaultBackend", &mut c);
    }
    for (i, rule) in rules.iter().enumerate() {
        let p = format!("spec.rules[{i}]");
        let host = rule.get("host").and_then(Value::as_str).unwrap_or("");
        if !host.is_empty() {
            if host.parse::<std::net::IpAddr>().is_ok() {
                c.push(Cause::invalid(
                    format!("{p}.host"),
                    &json!(host),
                    "must be a DNS name, not an IP address",
                ));
            }
            dns_host(host, &format!("{p}.host"), &mut c);
        }
        if let Some(http) = rule.get("http").filter(|h| !h.is_null()) {
            let paths = http
                .get("paths")
                .and_then(Value::as_array)
                .map(Vec::as_slice)
                .unwrap_or(&[]);
            if paths.is_empty() {
                c.push(Cause::required(format!("{p}.http.paths")));
            }
            for (j, path) in paths.iter().enumerate() {
                http_path(path, &format!("{p}.http.paths[{j}]"), &mut c);
            }
        }
    }
    for (i, tls) in spec
        .get("tls")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .enumerate()
    {
        for (j, host) in tls
            .get("hosts")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .enumerate()
        {
            dns_host(
                host.as_str().unwrap_or(""),
                &format!("spec.tls[{i}].hosts[{j}]"),
                &mut c,
            );
        }
        let secret = tls.get("secretName").and_then(Value::as_str).unwrap_or("");
        if !secret.is_empty() {
            subdomain(secret, &format!("spec.tls[{i}].secretName"), &mut c);
        }
    }
    if let Some(class) = spec.get("ingressClassName").and_then(Value::as_str) {
        subdomain(class, "spec.ingressClassName", &mut c);
    }
    c
}

/// A rule's or TLS entry's host: a DNS subdomain, or `*.` and one.
fn dns_host(host: &str, field: &str, c: &mut Vec<Cause>) {
    if host.contains('*') {
        if host.len() > 253 {
            c.push(Cause::invalid(
                field,
                &json!(host),
                "must be no more than 253 characters",
            ));
        }
        let ok = host
            .strip_prefix("*.")
            .is_some_and(|rest| is_dns1123_subdomain(rest) && rest.len() <= 251);
        if !ok {
            c.push(Cause::invalid(field, &json!(host), WILDCARD_MSG));
        }
    } else {
        subdomain(host, field, c);
    }
}

fn subdomain(v: &str, field: &str, c: &mut Vec<Cause>) {
    if v.len() > 253 {
        c.push(Cause::invalid(
            field,
            &json!(v),
            "must be no more than 253 characters",
        ));
    }
    let labels_ok = v.split('.').all(is_dns1123_label);
    if v.is_empty() || !labels_ok {
        c.push(Cause::invalid(field, &json!(v), SUBDOMAIN_MSG));
    }
}

fn http_path(path: &Value, p: &str, c: &mut Vec<Cause>) {
    let Some(kind) = path.get("pathType").and_then(Value::as_str) else {
        c.push(Cause::new(
            "FieldValueRequired",
            format!("{p}.pathType"),
            "Required value: pathType must be specified",
        ));
        return;
    };
    let value = path.get("path").and_then(Value::as_str).unwrap_or("");
    let field = format!("{p}.path");
    match kind {
        "Exact" | "Prefix" => {
            if !value.starts_with('/') {
                c.push(Cause::invalid(
                    &field,
                    &json!(value),
                    "must be an absolute path",
                ));
            }
            for seq in ["//", "/./", "/../", "%2f", "%2F"] {
                if value.contains(seq) {
                    c.push(Cause::invalid(
                        &field,
                        &json!(value),
                        &format!("must not contain '{seq}'"),
                    ));
                }
            }
            for suffix in ["/..", "/."] {
                if value.ends_with(suffix) {
                    c.push(Cause::invalid(
                        &field,
                        &json!(value),
                        &format!("cannot end with '{suffix}'"),
                    ));
                }
            }
        }
        "ImplementationSpecific" => {
            if !value.is_empty() && !value.starts_with('/') {
                c.push(Cause::invalid(
                    &field,
                    &json!(value),
                    "must be an absolute path",
                ));
            }
        }
        other => c.push(Cause::not_supported(
            format!("{p}.pathType"),
            &json!(other),
            &["Exact", "ImplementationSpecific", "Prefix"],
        )),
    }
    backend(
        path.get("backend").unwrap_or(&Value::Null),
        &format!("{p}.backend"),
        c,
    );
}

fn backend(b: &Value, p: &str, c: &mut Vec<Cause>) {
    let resource = b.get("resource").filter(|r| !r.is_null());
    let service = b.get("service").filter(|s| !s.is_null());
    match (resource, service) {
        (Some(_), Some(_)) => c.push(Cause::invalid(
            p,
            &json!(""),
            "cannot set both resource and service backends",
        )),
        (Some(r), None) => typed_reference(r, &format!("{p}.resource"), c),
        (None, Some(svc)) => {
            let name = svc.get("name").and_then(Value::as_str).unwrap_or("");
            if name.is_empty() {
                c.push(Cause::required(format!("{p}.service.name")));
            } else {
                if name.len() > 63 {
                    c.push(Cause::invalid(
                        format!("{p}.service.name"),
                        &json!(name),
                        "must be no more than 63 characters",
                    ));
                }
                if !is_dns1035_label(name) {
                    c.push(Cause::invalid(
                        format!("{p}.service.name"),
                        &json!(name),
                        DNS1035_LABEL_MSG,
                    ));
                }
            }
            let port = svc.get("port").unwrap_or(&Value::Null);
            let port_name = port.get("name").and_then(Value::as_str).unwrap_or("");
            let number = port.get("number").and_then(Value::as_i64).unwrap_or(0);
            if !port_name.is_empty() && number != 0 {
                c.push(Cause::invalid(
                    p,
                    &json!(""),
                    "cannot set both port name & port number",
                ));
            } else if !port_name.is_empty() {
                for msg in port_name_errors(port_name) {
                    c.push(Cause::invalid(
                        format!("{p}.service.port.name"),
                        &json!(port_name),
                        msg,
                    ));
                }
            } else if number != 0 {
                if !(1..=65535).contains(&number) {
                    c.push(Cause::invalid(
                        format!("{p}.service.port.number"),
                        &json!(number),
                        "must be between 1 and 65535, inclusive",
                    ));
                }
            } else {
                c.push(Cause::new(
                    "FieldValueRequired",
                    p,
                    "Required value: port name or number is required",
                ));
            }
        }
        (None, None) => c.push(Cause::invalid(
            p,
            &json!(""),
            "resource or service backend is required",
        )),
    }
}

/// A `TypedLocalObjectReference` backend: kind and name required, both
/// usable as a path segment; the group a DNS subdomain.
fn typed_reference(r: &Value, p: &str, c: &mut Vec<Cause>) {
    if let Some(group) = r.get("apiGroup").and_then(Value::as_str) {
        subdomain(group, &format!("{p}.apiGroup"), c);
    }
    for (key, what) in [("kind", "kind is required"), ("name", "name is required")] {
        let v = r.get(key).and_then(Value::as_str).unwrap_or("");
        if v.is_empty() {
            c.push(Cause::new(
                "FieldValueRequired",
                format!("{p}.{key}"),
                format!("Required value: {what}"),
            ));
        } else if v == "." || v == ".." {
            c.push(Cause::invalid(
                format!("{p}.{key}"),
                &json!(v),
                &format!("may not be '{v}'"),
            ));
        } else if let Some(bad) = ["/", "%"].into_iter().find(|s| v.contains(s)) {
            c.push(Cause::invalid(
                format!("{p}.{key}"),
                &json!(v),
                &format!("may not contain '{bad}'"),
            ));
        }
    }
}

/// `status.loadBalancer.ingress[*]`: addresses and host names as written.
fn load_balancer_status(obj: &Value) -> Vec<Cause> {
    let mut c = Vec::new();
    for (i, ing) in obj
        .pointer("/status/loadBalancer/ingress")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .enumerate()
    {
        let p = format!("status.loadBalancer.ingress[{i}]");
        if let Some(ip) = ing.get("ip").and_then(Value::as_str) {
            if !ip.is_empty() && ip.parse::<std::net::IpAddr>().is_err() {
                c.push(Cause::invalid(
                    format!("{p}.ip"),
                    &json!(ip),
                    "must be a valid IP address",
                ));
            }
        }
        if let Some(h) = ing.get("hostname").and_then(Value::as_str) {
            if !h.is_empty() {
                subdomain(h, &format!("{p}.hostname"), &mut c);
                if h.parse::<std::net::IpAddr>().is_ok() {
                    c.push(Cause::invalid(
                        format!("{p}.hostname"),
                        &json!(h),
                        "must be a DNS name, not an IP address",
                    ));
                }
            }
        }
    }
    c
}

pub static INGRESS_PRINTER: Printer = Printer {
    columns: &[
        NAME,
        col("Class", "string", 0),
        col("Hosts", "string", 0),
        col("Address", "string", 0),
        col("Ports", "string", 0),
        AGE,
    ],
    cells: ingress_cells,
};

fn ingress_cells(obj: &Value, now: DateTime<Utc>) -> Vec<Value> {
    let class = obj
        .pointer("/spec/ingressClassName")
        .and_then(Value::as_str)
        .unwrap_or("<none>");
    // At most three hosts, then how many rules are left.
    let rules = obj
        .pointer("/spec/rules")
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or(&[]);
    let mut hosts: Vec<&str> = Vec::new();
    let mut more = false;
    for r in rules {
        if hosts.len() == 3 {
            more = true;
        }
        let h = r.get("host").and_then(Value::as_str).unwrap_or("");
        if !more && !h.is_empty() {
            hosts.push(h);
        }
    }
    let hosts = if hosts.is_empty() {
        "*".to_string()
    } else if more {
        format!("{} + {} more...", hosts.join(","), rules.len() - 3)
    } else {
        hosts.join(",")
    };
    // Every address once, sorted (the server prints the wide form).
    let mut addresses: Vec<&str> = obj
        .pointer("/status/loadBalancer/ingress")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|i| {
            let ip = i.get("ip").and_then(Value::as_str).unwrap_or("");
            let host = i.get("hostname").and_then(Value::as_str).unwrap_or("");
            [ip, host].into_iter().find(|s| !s.is_empty())
        })
        .collect();
    addresses.sort_unstable();
    addresses.dedup();
    let tls = obj
        .pointer("/spec/tls")
        .and_then(Value::as_array)
        .is_some_and(|t| !t.is_empty());
    vec![
        json!(s(obj, "/metadata/name")),
        json!(class),
        json!(hosts),
        json!(addresses.join(",")),
        json!(if tls { "80, 443" } else { "80" }),
        json!(age(obj, "/metadata/creationTimestamp", now)),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ing(spec: Value) -> Value {
        json!({"metadata": {"name": "web", "namespace": "default"}, "spec": spec})
    }

    fn messages(obj: &Value) -> Vec<String> {
        Ingress
            .validate(obj)
            .into_iter()
            .map(|c| format!("{}: {}", c.field, c.message))
            .collect()
    }

    #[test]
    fn a_well_formed_ingress_passes() {
        let good = ing(json!({
            "ingressClassName": "nginx",
            "defaultBackend": {"service": {"name": "fallback", "port": {"number": 80}}},
            "tls": [{"hosts": ["web.example.com", "*.example.com"], "secretName": "web-tls"}],
            "rules": [
                {"host": "web.example.com", "http": {"paths": [
                    {"path": "/", "pathType": "Prefix", "backend": {"service": {"name": "web", "port": {"name": "http"}}}},
                    {"path": "/static", "pathType": "Exact", "backend": {"resource": {"apiGroup": "k8s.example.com", "kind": "StorageBucket", "name": "assets"}}}
                ]}},
                {"host": "*.example.com", "http": {"paths": [
                    {"pathType": "ImplementationSpecific", "backend": {"service": {"name": "web", "port": {"number": 8080}}}}
                ]}}
            ]
        }));
        assert_eq!(messages(&good), Vec::<String>::new());
    }

    #[test]
    fn an_ingress_needs_rules_or_a_default_backend() {
        assert_eq!(
            messages(&ing(json!({}))),
            ["spec: Invalid value: []networking.IngressRule(nil): either `defaultBackend` or `rules` must be specified"]
        );
    }

    #[test]
    fn paths_backends_and_hosts_are_checked_as_kube_apiserver_checks_them() {
        let bad = ing(json!({"rules": [
            {"host": "10.0.0.1", "http": {"paths": [
                {"path": "/a", "backend": {"service": {"name": "web", "port": {"number": 80}}}},
                {"path": "rel", "pathType": "Prefix", "backend": {"service": {"name": "Web", "port": {"number": 70000}}}},
                {"path": "/a//b/..", "pathType": "Exact", "backend": {"service": {"name": "web", "port": {"name": "http", "number": 80}}}},
                {"path": "/", "pathType": "Regex", "backend": {}}
            ]}},
            {"host": "*.*.example.com", "http": {"paths": []}}
        ]}));
        let got = messages(&bad);
        let want = [
            "spec.rules[0].host: Invalid value: \"10.0.0.1\": must be a DNS name, not an IP address",
            "spec.rules[0].http.paths[0].pathType: Required value: pathType must be specified",
            "spec.rules[0].http.paths[1].path: Invalid value: \"rel\": must be an absolute path",
            "spec.rules[0].http.paths[1].backend.service.port.number: Invalid value: 70000: must be between 1 and 65535, inclusive",
            "spec.rules[0].http.paths[2].path: Invalid value: \"/a//b/..\": must not contain '//'",
            "spec.rules[0].http.paths[2].path: Invalid value: \"/a//b/..\": cannot end with '/..'",
            "spec.rules[0].http.paths[2].backend: Invalid value: \"\": cannot set both port name & port number",
            "spec.rules[0].http.paths[3].pathType: Unsupported value: \"Regex\": supported values: \"Exact\", \"ImplementationSpecific\", \"Prefix\"",
            "spec.rules[0].http.paths[3].backend: Invalid value: \"\": resource or service backend is required",
            "spec.rules[1].http.paths: Required value",
        ];
        for w in want {
            assert!(got.iter().any(|g| g == w), "missing {w:?} in {got:#?}");
        }
        assert!(got.iter().any(|g| g.starts_with(
            "spec.rules[0].http.paths[1].backend.service.name: Invalid value: \"Web\": a DNS-1035 label"
        )));
        assert!(got.iter().any(|g| g.starts_with(
            "spec.rules[1].host: Invalid value: \"*.*.example.com\": a wildcard DNS-1123 subdomain"
        )));
    }

    #[test]
    fn the_class_annotation_and_field_may_not_both_be_set() {
        let mut both = ing(json!({"ingressClassName": "nginx",
            "defaultBackend": {"service": {"name": "web", "port": {"number": 80}}}}));
        both["metadata"]["annotations"] = json!({"kubernetes.io/ingress.class": "nginx"});
        assert_eq!(
            messages(&both),
            ["annotations.kubernetes.io/ingress.class: Invalid value: \"nginx\": can not be set when the class field is also set"]
        );
    }

    #[test]
    fn the_table_shows_class_hosts_address_and_ports() {
        let mut obj = ing(json!({"ingressClassName": "nginx",
            "tls": [{"hosts": ["a.example.com"]}],
            "rules": [{"host": "a.example.com"}, {"host": "b.example.com"}, {}, {"host": "c.example.com"}, {"host": "d.example.com"}]}));
        obj["status"] = json!({"loadBalancer": {"ingress": [{"ip": "192.0.2.2"}, {"hostname": "lb.example.com"}, {"ip": "192.0.2.1"}]}});
        let cells = (INGRESS_PRINTER.cells)(&obj, Utc::now());
        assert_eq!(cells[1], "nginx");
        assert_eq!(
            cells[2],
            "a.example.com,b.example.com,c.example.com + 2 more..."
        );
        assert_eq!(cells[3], "192.0.2.1,192.0.2.2,lb.example.com");
        assert_eq!(cells[4], "80, 443");
        let bare = ing(json!({"defaultBackend": {}}));
        let cells = (INGRESS_PRINTER.cells)(&bare, Utc::now());
        assert_eq!(
            (
                cells[1].clone(),
                cells[2].clone(),
                cells[3].clone(),
                cells[4].clone()
            ),
            (json!("<none>"), json!("*"), json!(""), json!("80"))
        );
    }
}
