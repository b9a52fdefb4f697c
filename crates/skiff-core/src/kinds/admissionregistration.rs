//! MutatingWebhookConfigurations and ValidatingWebhookConfigurations
//! (`admissionregistration.k8s.io/v1`): Kubernetes' defaults (failurePolicy
//! Fail, matchPolicy Equivalent, empty selectors, timeout 10 s, rule scope
//! `*`, service port 443, reinvocationPolicy Never) and its validation
//! (unique names of at least three segments, admissionReviewVersions,
//! sideEffects None/NoneOnDryRun, timeouts 1..30, rules, clientConfig url
//! xor service, matchConditions), with the table `kubectl get` shows; and
//! ValidatingAdmissionPolicies with their bindings (CEL expressions
//! compiled at create, so a broken one is refused with the reason).

use super::prelude::*;

/// A webhook configuration; `mutating` tells the two kinds apart.
pub struct WebhookConfiguration {
    pub mutating: bool,
}

pub static MUTATING: WebhookConfiguration = WebhookConfiguration { mutating: true };
pub static VALIDATING: WebhookConfiguration = WebhookConfiguration { mutating: false };

impl KindRules for WebhookConfiguration {
    fn kind(&self) -> &'static str {
        if self.mutating {
            "MutatingWebhookConfiguration"
        } else {
            "ValidatingWebhookConfiguration"
        }
    }

    fn defaults(&self, obj: &mut Value) {
        let Some(hooks) = obj.get_mut("webhooks").and_then(Value::as_array_mut) else {
            return;
        };
        for h in hooks {
            let Some(m) = h.as_object_mut() else { continue };
            set_default(m, "failurePolicy", json!("Fail"));
            set_default(m, "matchPolicy", json!("Equivalent"));
            set_default(m, "namespaceSelector", json!({}));
            set_default(m, "objectSelector", json!({}));
            set_default(m, "timeoutSeconds", json!(10));
            if self.mutating {
                set_default(m, "reinvocationPolicy", json!("Never"));
            }
            if let Some(rules) = m.get_mut("rules").and_then(Value::as_array_mut) {
                for r in rules.iter_mut().filter_map(Value::as_object_mut) {
                    set_default(r, "scope", json!("*"));
                }
            }
            if let Some(svc) = m
                .get_mut("clientConfig")
                .and_then(|c| c.get_mut("service"))
                .and_then(Value::as_object_mut)
            {
                set_default(svc, "port", json!(443));
            }
        }
    }

    fn validate(&self, obj: &Value) -> Vec<Cause> {
        let mut c = Vec::new();
        let hooks = obj
            .get("webhooks")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default();
        let mut names = std::collections::HashSet::new();
        for (i, h) in hooks.iter().enumerate() {
            let f = format!("webhooks[{i}]");
            let name = h.get("name").and_then(Value::as_str).unwrap_or("");
            if name.is_empty() {
                c.push(Cause::required(format!("{f}.name")));
            } else {
                if !crate::meta::is_dns1123_subdomain(name) || name.split('.').count() < 3 {
                    c.push(Cause::invalid(
                        format!("{f}.name"),
                        &json!(name),
                        "should be a domain with at least three segments separated by dots",
                    ));
                }
                if !names.insert(name.to_string()) {
                    c.push(Cause::duplicate(format!("{f}.name"), &json!(name)));
                }
            }
            validate_webhook(h, &f, self.mutating, &mut c);
        }
        c
    }

    fn printer(&self) -> &'static Printer {
        &WEBHOOK_CONFIGURATION_PRINTER
    }
}

fn strs(v: Option<&Value>) -> Vec<&str> {
    v.and_then(Value::as_array)
        .map(|a| a.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default()
}

fn validate_webhook(h: &Value, f: &str, mutating: bool, c: &mut Vec<Cause>) {
    let versions = strs(h.get("admissionReviewVersions"));
    if versions.is_empty() {
        c.push(Cause::required(format!("{f}.admissionReviewVersions")));
    } else if !versions.iter().any(|v| *v == "v1" || *v == "v1beta1") {
        c.push(Cause::invalid(
            format!("{f}.admissionReviewVersions"),
            &json!(versions),
            "must include at least one of v1, v1beta1",
        ));
    }
    match h.get("sideEffects").and_then(Value::as_str) {
        None => c.push(Cause::required(format!("{f}.sideEffects"))),
        Some("None" | "NoneOnDryRun") => {}
        Some(v) => c.push(Cause::not_supported(
            format!("{f}.sideEffects"),
            &json!(v),
            &["None", "NoneOnDryRun"],
        )),
    }
    one_of(h, f, "failurePolicy", &["Fail", "Ignore"], c);
    one_of(h, f, "matchPolicy", &["Equivalent", "Exact"], c);
    if mutating {
        one_of(h, f, "reinvocationPolicy", &["IfNeeded", "Never"], c);
    }
    if let Some(t) = h.get("timeoutSeconds").filter(|t| !t.is_null()) {
        if !matches!(t.as_i64(), Some(1..=30)) {
            c.push(Cause::invalid(
                format!("{f}.timeoutSeconds"),
                t,
                "the timeout value must be between 1 and 30 seconds",
            ));
        }
    }
    for sel in ["namespaceSelector", "objectSelector"] {
        if let Some(s) = h.get(sel).filter(|s| !s.is_null()) {
            if let Err(e) = crate::selector::LabelSelector::from_label_selector_json(s) {
                c.push(Cause::invalid(format!("{f}.{sel}"), s, &e));
            }
        }
    }
    if let Some(rules) = h.get("rules").and_then(Value::as_array) {
        for (j, r) in rules.iter().enumerate() {
            validate_rule(r, &format!("{f}.rules[{j}]"), c);
        }
    }
    validate_client_config(h.get("clientConfig"), &format!("{f}.clientConfig"), c);
    validate_match_conditions(h.get("matchConditions"), &format!("{f}.matchConditions"), c);
}

fn one_of(h: &Value, f: &str, field: &str, allowed: &[&str], c: &mut Vec<Cause>) {
    if let Some(v) = h.get(field).filter(|v| !v.is_null()) {
        if !v.as_str().is_some_and(|s| allowed.contains(&s)) {
            c.push(Cause::not_supported(format!("{f}.{field}"), v, allowed));
        }
    }
}

/// A rule's lists (`RuleWithOperations`), as Kubernetes validates them.
pub fn validate_rule(r: &Value, f: &str, c: &mut Vec<Cause>) {
    let ops = strs(r.get("operations"));
    if ops.is_empty() {
        c.push(Cause::required(format!("{f}.operations")));
    }
    if ops.len() > 1 && ops.contains(&"*") {
        c.push(Cause::invalid(
            format!("{f}.operations"),
            &json!(ops),
            "if '*' is present, must not specify other operations",
        ));
    }
    for (k, op) in ops.iter().enumerate() {
        if !["*", "CREATE", "UPDATE", "DELETE", "CONNECT"].contains(op) {
            c.push(Cause::not_supported(
                format!("{f}.operations[{k}]"),
                &json!(op),
                &["*", "CONNECT", "CREATE", "DELETE", "UPDATE"],
            ));
        }
    }
    for list in ["apiGroups", "apiVersions"] {
        let v = strs(r.get(list));
        if v.is_empty() {
            c.push(Cause::required(format!("{f}.{list}")));
        }
        if v.len() > 1 && v.contains(&"*") {
            c.push(Cause::invalid(
                format!("{f}.{list}"),
                &json!(v),
                "if '*' is present, must not specify other API groups",
            ));
        }
    }
    let resources = strs(r.get("resources"));
    if resources.is_empty() {
        c.push(Cause::required(format!("{f}.resources")));
    }
    for (k, res) in resources.iter().enumerate() {
        if res.is_empty() {
            c.push(Cause::required(format!("{f}.resources[{k}]")));
        }
        if res.split('/').count() > 2 {
            c.push(Cause::invalid(
                format!("{f}.resources[{k}]"),
                &json!(res),
                "must have at most one '/'",
            ));
        }
    }
    if resources.contains(&"*/*") && resources.len() > 1 {
        c.push(Cause::invalid(
            format!("{f}.resources"),
            &json!(resources),
            "if '*/*' is present, must not specify other resources",
        ));
    }
    if let Some(s) = r.get("scope").filter(|s| !s.is_null()) {
        if !s
            .as_str()
            .is_some_and(|s| ["*", "Cluster", "Namespaced"].contains(&s))
        {
            c.push(Cause::not_supported(
                format!("{f}.scope"),
                s,
                &["*", "Cluster", "Namespaced"],
            ));
        }
    }
}

fn validate_client_config(cc: Option<&Value>, f: &str, c: &mut Vec<Cause>) {
    let Some(cc) = cc.filter(|v| v.is_object()) else {
        c.push(Cause::required(f.to_string()));
        return;
    };
    let url = cc.get("url").and_then(Value::as_str);
    let svc = cc.get("service").filter(|s| !s.is_null());
    match (url, svc) {
        (Some(_), Some(_)) | (None, None) => c.push(Cause::required(f.to_string())),
        (Some(u), None) => {
            if let Err(e) = check_url(u) {
                c.push(Cause::invalid(format!("{f}.url"), &json!(u), &e));
            }
        }
        (None, Some(s)) => {
            for k in ["namespace", "name"] {
                if s.get(k).and_then(Value::as_str).unwrap_or("").is_empty() {
                    c.push(Cause::required(format!("{f}.service.{k}")));
                }
            }
            if let Some(p) = s.get("path").and_then(Value::as_str) {
                if !p.starts_with('/') {
                    c.push(Cause::invalid(
                        format!("{f}.service.path"),
                        &json!(p),
                        "must start with a '/'",
                    ));
                }
            }
            if let Some(p) = s.get("port").filter(|p| !p.is_null()) {
                if !matches!(p.as_i64(), Some(1..=65535)) {
                    c.push(Cause::invalid(
                        format!("{f}.service.port"),
                        p,
                        "port is not valid: must be between 1 and 65535, inclusive",
                    ));
                }
            }
        }
    }
    if let Some(ca) = cc.get("caBundle").and_then(Value::as_str) {
        use base64::Engine;
        if base64::engine::general_purpose::STANDARD
            .decode(ca.trim())
            .is_err()
        {
            c.push(Cause::invalid(
                format!("{f}.caBundle"),
                &json!("<bytes>"),
                "must be base64",
            ));
        }
    }
}

/// A webhook URL as Kubernetes accepts it: https with a host, no user
/// information, fragment or query.
fn check_url(u: &str) -> Result<(), String> {
    let rest = u
        .strip_prefix("https://")
        .ok_or_else(|| "'https' is the only allowed URL scheme".to_string())?;
    let host = rest.split('/').next().unwrap_or("");
    if host.is_empty() {
        return Err("host must be specified".into());
    }
    if host.contains('@') {
        return Err("user information is not permitted in the URL".into());
    }
    if u.contains('#') {
        return Err("fragments are not permitted in the URL".into());
    }
    if u.contains('?') {
        return Err("query parameters are not permitted in the URL".into());
    }
    Ok(())
}

/// matchConditions: at most 64, unique names (qualified names), an
/// expression each.
pub fn validate_match_conditions(mc: Option<&Value>, f: &str, c: &mut Vec<Cause>) {
    let Some(list) = mc.and_then(Value::as_array) else {
        return;
    };
    if list.len() > 64 {
        c.push(Cause::new(
            "FieldValueTooMany",
            f.to_string(),
            format!("Too many: {}: must have at most 64 items", list.len()),
        ));
    }
    let mut names = std::collections::HashSet::new();
    for (i, m) in list.iter().enumerate() {
        let name = m.get("name").and_then(Value::as_str).unwrap_or("");
        if name.is_empty() {
            c.push(Cause::required(format!("{f}[{i}].name")));
        } else if !names.insert(name) {
            c.push(Cause::duplicate(format!("{f}[{i}].name"), &json!(name)));
        }
        let expr = m.get("expression").and_then(Value::as_str).unwrap_or("");
        if expr.trim().is_empty() {
            c.push(Cause::required(format!("{f}[{i}].expression")));
        } else if let Err(e) = crate::cel::compile(expr, &["object", "oldObject", "request"]) {
            c.push(Cause::invalid(
                format!("{f}[{i}].expression"),
                &json!(expr),
                &e,
            ));
        }
    }
}

/// The variables a ValidatingAdmissionPolicy's expressions may read.
pub const POLICY_VARS: &[&str] = &[
    "object",
    "oldObject",
    "request",
    "params",
    "namespaceObject",
    "variables",
];

/// A `MatchResources`' defaults (a policy's matchConstraints, a binding's
/// matchResources): matchPolicy Equivalent, empty selectors, scope `*`.
fn match_resources_defaults(m: &mut serde_json::Map<String, Value>) {
    set_default(m, "matchPolicy", json!("Equivalent"));
    set_default(m, "namespaceSelector", json!({}));
    set_default(m, "objectSelector", json!({}));
    for list in ["resourceRules", "excludeResourceRules"] {
        if let Some(rules) = m.get_mut(list).and_then(Value::as_array_mut) {
            for r in rules.iter_mut().filter_map(Value::as_object_mut) {
                set_default(r, "scope", json!("*"));
            }
        }
    }
}

/// ValidatingAdmissionPolicies: CEL validations over the requests their
/// matchConstraints select.
pub struct ValidatingAdmissionPolicy;

impl KindRules for ValidatingAdmissionPolicy {
    fn kind(&self) -> &'static str {
        "ValidatingAdmissionPolicy"
    }

    fn tracks_generation(&self) -> bool {
        true
    }

    fn defaults(&self, obj: &mut Value) {
        let Some(spec) = obj.get_mut("spec").and_then(Value::as_object_mut) else {
            return;
        };
        set_default(spec, "failurePolicy", json!("Fail"));
        if let Some(m) = spec
            .get_mut("matchConstraints")
            .and_then(Value::as_object_mut)
        {
            match_resources_defaults(m);
        }
    }

    fn validate(&self, obj: &Value) -> Vec<Cause> {
        let mut c = Vec::new();
        let spec = obj.get("spec").cloned().unwrap_or(json!({}));
        let validations = spec.get("validations").and_then(Value::as_array);
        let audits = spec.get("auditAnnotations").and_then(Value::as_array);
        if validations.is_none_or(Vec::is_empty) && audits.is_none_or(Vec::is_empty) {
            c.push(Cause::required("spec.validations"));
        }
        let compile = |expr: &str, f: String, c: &mut Vec<Cause>| {
            if expr.trim().is_empty() {
                c.push(Cause::required(f));
            } else if let Err(e) = crate::cel::compile(expr, POLICY_VARS) {
                c.push(Cause::invalid(f, &json!(expr), &e));
            }
        };
        for (i, v) in validations.into_iter().flatten().enumerate() {
            let f = format!("spec.validations[{i}]");
            compile(s(v, "/expression"), format!("{f}.expression"), &mut c);
            if let Some(m) = v.get("messageExpression").and_then(Value::as_str) {
                compile(m, format!("{f}.messageExpression"), &mut c);
            }
            if let Some(r) = v.get("reason").filter(|r| !r.is_null()) {
                let allowed = [
                    "Unauthorized",
                    "Forbidden",
                    "Invalid",
                    "RequestEntityTooLarge",
                ];
                if !r.as_str().is_some_and(|r| allowed.contains(&r)) {
                    c.push(Cause::not_supported(format!("{f}.reason"), r, &allowed));
                }
            }
        }
        let mut names = std::collections::HashSet::new();
        for (i, v) in spec
            .get("variables")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .enumerate()
        {
            let f = format!("spec.variables[{i}]");
            let name = s(v, "/name");
            if name.is_empty() {
                c.push(Cause::required(format!("{f}.name")));
            } else if !names.insert(name.to_string()) {
                c.push(Cause::duplicate(format!("{f}.name"), &json!(name)));
            }
            compile(s(v, "/expression"), format!("{f}.expression"), &mut c);
        }
        if let Some(fp) = spec.get("failurePolicy").filter(|v| !v.is_null()) {
            if !fp.as_str().is_some_and(|v| v == "Fail" || v == "Ignore") {
                c.push(Cause::not_supported(
                    "spec.failurePolicy",
                    fp,
                    &["Fail", "Ignore"],
                ));
            }
        }
        match spec.get("matchConstraints").filter(|m| m.is_object()) {
            None => c.push(Cause::required("spec.matchConstraints")),
            Some(m) => {
                let rules = m.get("resourceRules").and_then(Value::as_array);
                if rules.is_none_or(Vec::is_empty) {
                    c.push(Cause::required("spec.matchConstraints.resourceRules"));
                }
                for (j, r) in rules.into_iter().flatten().enumerate() {
                    validate_rule(
                        r,
                        &format!("spec.matchConstraints.resourceRules[{j}]"),
                        &mut c,
                    );
                }
            }
        }
        if let Some(pk) = spec.get("paramKind").filter(|p| !p.is_null()) {
            for k in ["apiVersion", "kind"] {
                if s(pk, &format!("/{k}")).is_empty() {
                    c.push(Cause::required(format!("spec.paramKind.{k}")));
                }
            }
        }
        for (i, m) in spec
            .get("matchConditions")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .enumerate()
        {
            compile(
                s(m, "/expression"),
                format!("spec.matchConditions[{i}].expression"),
                &mut c,
            );
        }
        c
    }

    fn printer(&self) -> &'static Printer {
        &POLICY_PRINTER
    }
}

/// ValidatingAdmissionPolicyBindings: which policy applies where, with
/// which parameters and actions.
pub struct ValidatingAdmissionPolicyBinding;

impl KindRules for ValidatingAdmissionPolicyBinding {
    fn kind(&self) -> &'static str {
        "ValidatingAdmissionPolicyBinding"
    }

    fn defaults(&self, obj: &mut Value) {
        if let Some(m) = obj
            .pointer_mut("/spec/matchResources")
            .and_then(Value::as_object_mut)
        {
            match_resources_defaults(m);
        }
    }

    fn validate(&self, obj: &Value) -> Vec<Cause> {
        let mut c = Vec::new();
        if s(obj, "/spec/policyName").is_empty() {
            c.push(Cause::required("spec.policyName"));
        }
        let actions = strs(obj.pointer("/spec/validationActions"));
        if actions.is_empty() {
            c.push(Cause::required("spec.validationActions"));
        }
        let mut seen = std::collections::HashSet::new();
        for (i, a) in actions.iter().enumerate() {
            if !["Deny", "Warn", "Audit"].contains(a) {
                c.push(Cause::not_supported(
                    format!("spec.validationActions[{i}]"),
                    &json!(a),
                    &["Audit", "Deny", "Warn"],
                ));
            }
            if !seen.insert(*a) {
                c.push(Cause::duplicate(
                    format!("spec.validationActions[{i}]"),
                    &json!(a),
                ));
            }
        }
        if actions.contains(&"Deny") && actions.contains(&"Warn") {
            c.push(Cause::invalid(
                "spec.validationActions",
                &json!(actions),
                "must not contain both Deny and Warn (repeating the same validation failure information in the API response and headers serves no purpose)",
            ));
        }
        if let Some(p) = obj.pointer("/spec/paramRef").filter(|p| !p.is_null()) {
            let name = !s(p, "/name").is_empty();
            let sel = p.get("selector").is_some_and(|v| !v.is_null());
            if name == sel {
                c.push(Cause::invalid(
                    "spec.paramRef",
                    p,
                    "one of name or selector must be set",
                ));
            }
            match p.get("parameterNotFoundAction").and_then(Value::as_str) {
                None => c.push(Cause::required("spec.paramRef.parameterNotFoundAction")),
                Some("Allow" | "Deny") => {}
                Some(v) => c.push(Cause::not_supported(
                    "spec.paramRef.parameterNotFoundAction",
                    &json!(v),
                    &["Allow", "Deny"],
                )),
            }
        }
        c
    }

    fn printer(&self) -> &'static Printer {
        &BINDING_PRINTER
    }
}

pub static POLICY_PRINTER: Printer = Printer {
    columns: &[
        NAME,
        col("Validations", "integer", 0),
        col("ParamKind", "string", 0),
        AGE,
    ],
    cells: policy_cells,
};

fn policy_cells(obj: &Value, now: DateTime<Utc>) -> Vec<Value> {
    let n = obj
        .pointer("/spec/validations")
        .and_then(Value::as_array)
        .map_or(0, Vec::len);
    let pk = match obj.pointer("/spec/paramKind").filter(|v| v.is_object()) {
        Some(p) => format!("{}/{}", s(p, "/apiVersion"), s(p, "/kind")),
        None => "<unset>".into(),
    };
    vec![
        json!(s(obj, "/metadata/name")),
        json!(n),
        json!(pk),
        json!(age(obj, "/metadata/creationTimestamp", now)),
    ]
}

pub static BINDING_PRINTER: Printer = Printer {
    columns: &[
        NAME,
        col("PolicyName", "string", 0),
        col("ParamRef", "string", 0),
        AGE,
    ],
    cells: binding_cells,
};

fn binding_cells(obj: &Value, now: DateTime<Utc>) -> Vec<Value> {
    let pr = match obj.pointer("/spec/paramRef").filter(|v| v.is_object()) {
        Some(p) if !s(p, "/name").is_empty() => {
            let ns = s(p, "/namespace");
            if ns.is_empty() {
                format!("*/{}", s(p, "/name"))
            } else {
                format!("{ns}/{}", s(p, "/name"))
            }
        }
        Some(_) => "*/*".into(),
        None => "<unset>".into(),
    };
    vec![
        json!(s(obj, "/metadata/name")),
        json!(s(obj, "/spec/policyName")),
        json!(pr),
        json!(age(obj, "/metadata/creationTimestamp", now)),
    ]
}

pub static WEBHOOK_CONFIGURATION_PRINTER: Printer = Printer {
    columns: &[NAME, col("Webhooks", "integer", 0), AGE],
    cells: webhook_configuration_cells,
};

fn webhook_configuration_cells(obj: &Value, now: DateTime<Utc>) -> Vec<Value> {
    let n = obj
        .get("webhooks")
        .and_then(Value::as_array)
        .map_or(0, Vec::len);
    vec![
        json!(s(obj, "/metadata/name")),
        json!(n),
        json!(age(obj, "/metadata/creationTimestamp", now)),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hook(name: &str) -> Value {
        json!({
            "name": name,
            "admissionReviewVersions": ["v1"],
            "sideEffects": "None",
            "clientConfig": {"url": "https://127.0.0.1:8443/validate", "caBundle": "AAAA"},
            "rules": [{"operations": ["CREATE"], "apiGroups": [""], "apiVersions": ["v1"], "resources": ["pods"]}],
        })
    }

    fn fields(obj: &Value, mutating: bool) -> Vec<String> {
        let rules = WebhookConfiguration { mutating };
        let mut obj = obj.clone();
        rules.defaults(&mut obj);
        rules.validate(&obj).into_iter().map(|c| c.field).collect()
    }

    #[test]
    fn a_complete_webhook_is_valid_and_defaulted() {
        let mut obj = json!({"webhooks": [hook("a.example.com")]});
        MUTATING.defaults(&mut obj);
        assert!(
            MUTATING.validate(&obj).is_empty(),
            "{:?}",
            MUTATING.validate(&obj)
        );
        let h = &obj["webhooks"][0];
        assert_eq!(h["failurePolicy"], "Fail");
        assert_eq!(h["matchPolicy"], "Equivalent");
        assert_eq!(h["timeoutSeconds"], 10);
        assert_eq!(h["reinvocationPolicy"], "Never");
        assert_eq!(h["rules"][0]["scope"], "*");
    }

    #[test]
    fn webhooks_are_refused_as_kubernetes_refuses_them() {
        let dup = json!({"webhooks": [hook("a.example.com"), hook("a.example.com")]});
        assert_eq!(fields(&dup, false), ["webhooks[1].name"]);
        let short = json!({"webhooks": [hook("short")]});
        assert_eq!(fields(&short, false), ["webhooks[0].name"]);
        let mut h = hook("a.example.com");
        h["sideEffects"] = json!("Some");
        h["timeoutSeconds"] = json!(31);
        h["admissionReviewVersions"] = json!(["v2"]);
        h["clientConfig"] = json!({"url": "http://x/"});
        h["rules"][0]["operations"] = json!(["*", "CREATE"]);
        let got = fields(&json!({"webhooks": [h]}), false);
        for f in [
            "webhooks[0].admissionReviewVersions",
            "webhooks[0].sideEffects",
            "webhooks[0].timeoutSeconds",
            "webhooks[0].rules[0].operations",
            "webhooks[0].clientConfig.url",
        ] {
            assert!(got.iter().any(|g| g == f), "{f} missing from {got:?}");
        }
        let mut both = hook("a.example.com");
        both["clientConfig"]["service"] = json!({"namespace": "a", "name": "b"});
        assert_eq!(
            fields(&json!({"webhooks": [both]}), false),
            ["webhooks[0].clientConfig"]
        );
        let mut no_side = hook("a.example.com");
        no_side.as_object_mut().unwrap().remove("sideEffects");
        assert_eq!(
            fields(&json!({"webhooks": [no_side]}), true),
            ["webhooks[0].sideEffects"]
        );
    }
}
