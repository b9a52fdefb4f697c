//! ValidatingAdmissionPolicies and their bindings: CEL validations run in
//! the server at the validating admission point, before the validating
//! webhooks (Kubernetes' plugin order). A binding selects a policy, its
//! parameters (paramRef by name or selector, in the request's namespace
//! unless it names one) and what a failure does (Deny, Warn, Audit). The
//! policy's matchConstraints use the webhooks' rule matcher; its variables
//! are evaluated in order; expressions are compiled once per object
//! version.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use serde_json::{json, Map, Value};
use skiff_core::cel::Program;
use skiff_core::kinds::admissionregistration::POLICY_VARS;
use skiff_core::resources::{self, ResourceInfo};
use skiff_core::selector::LabelSelector;
use skiff_core::{ApiError, ApiResult};

use super::rules::{self, MatchCondition, Rule};
use super::{equivalents, Attributes};
use crate::admission::context::AdmissionCtx;
use crate::watchcache::{CachedObject, Filter};

type Compiled = Result<Program, String>;

fn compile(expr: &str) -> Compiled {
    skiff_core::cel::compile(expr, POLICY_VARS)
}

/// Which requests a policy or binding selects (`MatchResources`).
#[derive(Debug)]
struct Matcher {
    rules: Vec<(Rule, Vec<String>)>,
    exclude: Vec<(Rule, Vec<String>)>,
    equivalent: bool,
    namespace_selector: Result<Option<LabelSelector>, String>,
    object_selector: Result<Option<LabelSelector>, String>,
}

fn named_rules(v: Option<&Value>) -> Vec<(Rule, Vec<String>)> {
    v.and_then(Value::as_array)
        .into_iter()
        .flatten()
        .map(|r| {
            let names = r
                .get("resourceNames")
                .and_then(Value::as_array)
                .map(|a| {
                    a.iter()
                        .filter_map(Value::as_str)
                        .map(str::to_string)
                        .collect()
                })
                .unwrap_or_default();
            (Rule::from_json(r), names)
        })
        .collect()
}

impl Matcher {
    fn from_json(m: &Value) -> Matcher {
        Matcher {
            rules: named_rules(m.get("resourceRules")),
            exclude: named_rules(m.get("excludeResourceRules")),
            equivalent: m.get("matchPolicy").and_then(Value::as_str) != Some("Exact"),
            namespace_selector: rules::selector(m.get("namespaceSelector")),
            object_selector: rules::selector(m.get("objectSelector")),
        }
    }

    /// The version of the request's resource `list` selects, if any: the
    /// requested version first, then (matchPolicy Equivalent) the other
    /// versions of the same resource.
    fn rules_match(
        &self,
        list: &[(Rule, Vec<String>)],
        a: &Attributes<'_>,
    ) -> Option<&'static ResourceInfo> {
        let namespaced = !a.namespace.is_empty();
        let hit = |r: &ResourceInfo| {
            list.iter().any(|(rule, names)| {
                rule.matches(a.op, r.group, r.version, r.plural, a.sub, namespaced)
                    && (names.is_empty() || names.iter().any(|n| n == a.name))
            })
        };
        if hit(a.request_res) {
            return Some(a.request_res);
        }
        if !self.equivalent {
            return None;
        }
        equivalents(a.res)
            .filter(|r| *r != a.request_res)
            .find(|r| hit(r))
    }

    /// The version of the request's resource this matcher selects, if any,
    /// as Kubernetes' `matching.Matcher`: the selectors, then
    /// excludeResourceRules, then resourceRules, of which an empty list
    /// constrains nothing (a binding that only selects namespaces applies
    /// to whatever its policy matches). A selector that cannot be
    /// evaluated is an error only for a request the rules select.
    fn matches(
        &self,
        a: &Attributes<'_>,
        ns_labels: &Option<Map<String, Value>>,
        obj: Option<&Value>,
        old: Option<&Value>,
    ) -> Result<Option<&'static ResourceInfo>, String> {
        let ns_match = self
            .namespace_selector
            .as_ref()
            .map(|sel| match (sel, ns_labels) {
                (Some(sel), Some(labels)) => sel.matches(labels),
                _ => true,
            });
        if ns_match == Ok(false) {
            return Ok(None);
        }
        let obj_match = self
            .object_selector
            .as_ref()
            .map(|sel| rules::object_matches(sel, obj, old));
        if obj_match == Ok(false) {
            return Ok(None);
        }
        if self.rules_match(&self.exclude, a).is_some() {
            return Ok(None);
        }
        let version = if self.rules.is_empty() {
            Some(a.request_res)
        } else {
            self.rules_match(&self.rules, a)
        };
        let Some(version) = version else {
            return Ok(None);
        };
        ns_match.map_err(Clone::clone)?;
        obj_match.map_err(Clone::clone)?;
        Ok(Some(version))
    }
}

#[derive(Debug)]
struct Validation {
    source: String,
    program: Compiled,
    message: String,
    message_expression: Option<Compiled>,
    reason: String,
}

#[derive(Debug)]
struct Policy {
    name: String,
    fail: bool,
    /// None without matchConstraints: the policy matches nothing.
    matcher: Option<Matcher>,
    match_conditions: Vec<MatchCondition>,
    variables: Vec<(String, Compiled)>,
    validations: Vec<Validation>,
    /// (apiVersion, kind) of the parameters.
    param_kind: Option<(String, String)>,
}

#[derive(Debug)]
struct Binding {
    name: String,
    policy: String,
    deny: bool,
    warn: bool,
    audit: bool,
    param_ref: Option<Value>,
    matcher: Option<Matcher>,
}

fn str_at<'a>(v: &'a Value, ptr: &str) -> &'a str {
    v.pointer(ptr).and_then(Value::as_str).unwrap_or("")
}

impl Policy {
    fn from_json(v: &Value) -> Policy {
        let spec = v.get("spec").cloned().unwrap_or(json!({}));
        Policy {
            name: str_at(v, "/metadata/name").to_string(),
            fail: str_at(&spec, "/failurePolicy") != "Ignore",
            matcher: spec
                .get("matchConstraints")
                .filter(|m| m.is_object())
                .map(Matcher::from_json),
            match_conditions: rules::match_conditions(spec.get("matchConditions")),
            variables: spec
                .get("variables")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .map(|x| {
                    (
                        str_at(x, "/name").to_string(),
                        compile(str_at(x, "/expression")),
                    )
                })
                .collect(),
            validations: spec
                .get("validations")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .map(|x| Validation {
                    source: str_at(x, "/expression").to_string(),
                    program: compile(str_at(x, "/expression")),
                    message: str_at(x, "/message").to_string(),
                    message_expression: x
                        .get("messageExpression")
                        .and_then(Value::as_str)
                        .map(compile),
                    reason: match str_at(x, "/reason") {
                        "" => "Invalid".into(),
                        r => r.to_string(),
                    },
                })
                .collect(),
            param_kind: spec.get("paramKind").filter(|p| p.is_object()).map(|p| {
                (
                    str_at(p, "/apiVersion").to_string(),
                    str_at(p, "/kind").to_string(),
                )
            }),
        }
    }
}

impl Binding {
    fn from_json(v: &Value) -> Binding {
        let actions: Vec<&str> = v
            .pointer("/spec/validationActions")
            .and_then(Value::as_array)
            .map(|a| a.iter().filter_map(Value::as_str).collect())
            .unwrap_or_default();
        Binding {
            name: str_at(v, "/metadata/name").to_string(),
            policy: str_at(v, "/spec/policyName").to_string(),
            deny: actions.contains(&"Deny"),
            warn: actions.contains(&"Warn"),
            audit: actions.contains(&"Audit"),
            param_ref: v
                .pointer("/spec/paramRef")
                .filter(|p| p.is_object())
                .cloned(),
            matcher: v
                .pointer("/spec/matchResources")
                .filter(|m| m.is_object())
                .map(Matcher::from_json),
        }
    }
}

enum Parsed {
    Policy(Arc<Policy>),
    Binding(Arc<Binding>),
}

/// Parsed objects by (uid, resourceVersion).
type ParsedCache = Mutex<HashMap<(String, i64), Arc<Parsed>>>;

fn cache() -> &'static ParsedCache {
    static C: OnceLock<ParsedCache> = OnceLock::new();
    C.get_or_init(Default::default)
}

fn parsed(o: &CachedObject, make: impl FnOnce(&Value) -> Parsed) -> Option<Arc<Parsed>> {
    let v = o.value()?;
    let key = (str_at(&v, "/metadata/uid").to_string(), o.revision);
    if let Some(p) = cache().lock().unwrap_or_else(|e| e.into_inner()).get(&key) {
        return Some(p.clone());
    }
    let p = Arc::new(make(&v));
    let mut c = cache().lock().unwrap_or_else(|e| e.into_inner());
    if c.len() > 2048 {
        c.clear();
    }
    c.insert(key, p.clone());
    Some(p)
}

fn all(cx: &dyn AdmissionCtx, plural: &str) -> Vec<Arc<CachedObject>> {
    let res = resources::lookup("admissionregistration.k8s.io", "v1", plural).expect("served");
    cx.cache().resource(res).snapshot(&Filter::default())
}

/// The bindings in name order with their policies.
fn bindings(cx: &dyn AdmissionCtx) -> Vec<(Arc<Binding>, Option<Arc<Policy>>)> {
    let raw = all(cx, "validatingadmissionpolicybindings");
    if raw.is_empty() {
        return Vec::new();
    }
    let mut policies: HashMap<String, Arc<Policy>> = HashMap::new();
    for o in all(cx, "validatingadmissionpolicies") {
        if let Some(p) = parsed(&o, |v| Parsed::Policy(Arc::new(Policy::from_json(v)))) {
            if let Parsed::Policy(p) = &*p {
                policies.insert(p.name.clone(), p.clone());
            }
        }
    }
    raw.iter()
        .filter_map(|o| parsed(o, |v| Parsed::Binding(Arc::new(Binding::from_json(v)))))
        .filter_map(|p| match &*p {
            Parsed::Binding(b) => Some((b.clone(), policies.get(&b.policy).cloned())),
            Parsed::Policy(_) => None,
        })
        .collect()
}

/// Why a policy could not be evaluated (subject to its failurePolicy).
struct EvalError(String);

fn denial(p: &Policy, b: &Binding, message: &str, reason: &str) -> ApiError {
    let code = match reason {
        "Unauthorized" => 401,
        "Forbidden" => 403,
        "RequestEntityTooLarge" => 413,
        _ => 422,
    };
    ApiError::new(
        code,
        reason,
        format!(
            "ValidatingAdmissionPolicy '{}' with binding '{}' denied request: {message}",
            p.name, b.name
        ),
    )
}

/// The parameter objects a binding names (`None`: no params used).
fn params(
    cx: &dyn AdmissionCtx,
    a: &Attributes<'_>,
    p: &Policy,
    b: &Binding,
) -> Result<Option<Vec<Value>>, EvalError> {
    let Some((api_version, kind)) = &p.param_kind else {
        return Ok(None);
    };
    let Some(r) = &b.param_ref else {
        return Err(EvalError(format!(
            "policy {:?} has paramKind but binding {:?} has no paramRef",
            p.name, b.name
        )));
    };
    let res = resources::lookup_kind(api_version, kind).ok_or_else(|| {
        EvalError(format!(
            "failed to find resource referenced by paramKind: '{api_version}, Kind={kind}'"
        ))
    })?;
    let ns = match str_at(r, "/namespace") {
        "" if res.namespaced => {
            if a.namespace.is_empty() {
                return Err(EvalError(
                    "cannot use namespaced paramRef in policy binding that matches cluster-scoped resources"
                        .into(),
                ));
            }
            Some(a.namespace.to_string())
        }
        "" => None,
        ns => Some(ns.to_string()),
    };
    let cache = cx.cache().resource(res);
    let name = str_at(r, "/name");
    let found: Vec<Value> = if !name.is_empty() {
        cache
            .get(&crate::object::object_key(res, ns.as_deref(), name))
            .and_then(|o| o.value())
            .map(|v| vec![(*v).clone()])
            .unwrap_or_default()
    } else {
        let sel = LabelSelector::from_label_selector_json(r.get("selector").unwrap_or(&json!({})))
            .map_err(EvalError)?;
        cache
            .snapshot(&Filter {
                namespace: ns,
                labels: Some(sel),
                fields: None,
            })
            .iter()
            .filter_map(|o| o.value().map(|v| (*v).clone()))
            .collect()
    };
    if found.is_empty() {
        if str_at(r, "/parameterNotFoundAction") == "Allow" {
            return Ok(Some(Vec::new()));
        }
        return Err(EvalError(
            "failed to configure binding: no params found for policy binding with `Deny` parameterNotFoundAction"
                .into(),
        ));
    }
    Ok(Some(found))
}

/// A failed validation's message.
fn message_of(v: &Validation, vars: &[(&str, &Value)]) -> String {
    if !v.message.is_empty() {
        return v.message.clone();
    }
    if let Some(Ok(p)) = &v.message_expression {
        if let Ok(Value::String(m)) = p.eval(vars) {
            let m = m.trim().to_string();
            if !m.is_empty() && !m.contains('\n') {
                return m;
            }
        }
    }
    format!("failed expression: {}", v.source)
}

/// Evaluates one policy for one parameter: the failures (message, reason).
fn evaluate(
    p: &Policy,
    object: &Value,
    old: &Value,
    request: &Value,
    param: &Value,
    namespace: &Value,
) -> Result<Vec<(String, String, usize)>, EvalError> {
    let mut variables = Map::new();
    for (name, prog) in &p.variables {
        let prog = prog.as_ref().map_err(|e| EvalError(e.clone()))?;
        let vars_value = Value::Object(variables.clone());
        let v = prog
            .eval(&[
                ("object", object),
                ("oldObject", old),
                ("request", request),
                ("params", param),
                ("namespaceObject", namespace),
                ("variables", &vars_value),
            ])
            .map_err(|e| EvalError(format!("variable {name:?} resulted in error: {e}")))?;
        variables.insert(name.clone(), v);
    }
    let vars_value = Value::Object(variables);
    let vars = [
        ("object", object),
        ("oldObject", old),
        ("request", request),
        ("params", param),
        ("namespaceObject", namespace),
        ("variables", &vars_value),
    ];
    if !rules::conditions_hold(&p.match_conditions, &vars).map_err(EvalError)? {
        return Ok(Vec::new());
    }
    let mut failures = Vec::new();
    for (i, v) in p.validations.iter().enumerate() {
        let prog = v.program.as_ref().map_err(|e| EvalError(e.clone()))?;
        match prog.eval(&vars) {
            Ok(Value::Bool(true)) => {}
            Ok(Value::Bool(false)) => failures.push((message_of(v, &vars), v.reason.clone(), i)),
            Ok(other) => {
                return Err(EvalError(format!(
                    "expression '{}' resulted in error: expected a bool, got {other}",
                    v.source
                )))
            }
            Err(e) => {
                return Err(EvalError(format!(
                    "expression '{}' resulted in error: {e}",
                    v.source
                )))
            }
        }
    }
    Ok(failures)
}

/// Runs every binding's policy that selects the request.
pub async fn validate(
    cx: &dyn AdmissionCtx,
    a: &Attributes<'_>,
    obj: Option<&Value>,
    old: Option<&Value>,
) -> ApiResult<()> {
    let bs = bindings(cx);
    if bs.is_empty() {
        return Ok(());
    }
    let ns_res = resources::lookup("", "v1", "namespaces").expect("namespaces");
    let namespace_obj: Value = if a.namespace.is_empty() {
        Value::Null
    } else {
        cx.cache()
            .resource(ns_res)
            .get(&crate::object::object_key(ns_res, None, a.namespace))
            .and_then(|o| o.value())
            .map(|v| (*v).clone())
            .unwrap_or(Value::Null)
    };
    let ns_labels = if a.res.storage == "/namespaces" {
        Some(rules::labels(obj.or(old)))
    } else if a.res.namespaced {
        Some(rules::labels(Some(&namespace_obj)))
    } else {
        None
    };
    for (b, p) in bs {
        let Some(p) = p else { continue };
        let fail_or_skip = |e: String| -> ApiResult<()> {
            if p.fail {
                Err(denial(&p, &b, &e, "Invalid"))
            } else {
                tracing::warn!(policy = %p.name, binding = %b.name, error = %e, "policy failed open");
                Ok(())
            }
        };
        let Some(matcher) = &p.matcher else { continue };
        let version = match matcher.matches(a, &ns_labels, obj, old) {
            Ok(Some(v)) => v,
            Ok(None) => continue,
            Err(e) => {
                fail_or_skip(e)?;
                continue;
            }
        };
        if let Some(m) = &b.matcher {
            match m.matches(a, &ns_labels, obj, old) {
                Ok(Some(_)) => {}
                Ok(None) => continue,
                Err(e) => {
                    fail_or_skip(e)?;
                    continue;
                }
            }
        }
        let params = match params(cx, a, &p, &b) {
            Ok(ps) => ps,
            Err(EvalError(e)) => {
                fail_or_skip(e)?;
                continue;
            }
        };
        let object = super::review::in_version(cx, a, version, obj).await?;
        let old_object = super::review::in_version(cx, a, version, old).await?;
        let request = super::review::request(a, version, "v1", "", Value::Null, Value::Null)
            ["request"]
            .clone();
        let param_list = match params {
            None => vec![Value::Null],
            Some(list) => list,
        };
        for param in &param_list {
            let failures = match evaluate(&p, &object, &old_object, &request, param, &namespace_obj)
            {
                Ok(f) => f,
                Err(EvalError(e)) => {
                    fail_or_skip(e)?;
                    continue;
                }
            };
            for (message, reason, index) in failures {
                if b.warn {
                    a.admission.warn(format!(
                        "Validation failed for ValidatingAdmissionPolicy '{}' with binding '{}': {message}",
                        p.name, b.name
                    ));
                }
                if b.audit {
                    a.admission.annotate(
                        "validation.policy.admission.k8s.io/validation_failure".into(),
                        json!([{"message": message, "policy": p.name, "binding": b.name,
                            "expressionIndex": index, "validationActions": actions(&b)}])
                        .to_string(),
                    );
                }
                if b.deny {
                    return Err(denial(&p, &b, &message, &reason));
                }
            }
        }
    }
    Ok(())
}

fn actions(b: &Binding) -> Vec<&'static str> {
    let mut out = Vec::new();
    if b.deny {
        out.push("Deny");
    }
    if b.warn {
        out.push("Warn");
    }
    if b.audit {
        out.push("Audit");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::auth::Identity;
    use crate::webhook::{Admission, Operation};

    fn res(group: &str, version: &str, plural: &str) -> &'static ResourceInfo {
        resources::lookup(group, version, plural).expect("served")
    }

    /// Whether `m` (MatchResources JSON) selects a request, and at which
    /// version: (group, version, plural, namespace, name, object labels,
    /// namespace labels).
    fn selects(
        m: Value,
        (group, version, plural): (&str, &str, &str),
        op: Operation,
        ns: &str,
        obj_labels: Value,
        ns_labels: Option<Value>,
    ) -> Result<Option<String>, String> {
        let user = Identity::new("u", vec![]);
        let admission = Admission::default();
        let r = res(group, version, plural);
        let a = Attributes {
            res: r,
            request_res: r,
            sub: "",
            op,
            namespace: ns,
            name: "x",
            user: &user,
            dry_run: false,
            options: Value::Null,
            kind: None,
            admission: &admission,
        };
        let obj = json!({"metadata": {"name": "x", "labels": obj_labels}});
        let ns_labels = ns_labels.map(|l| l.as_object().cloned().unwrap_or_default());
        Matcher::from_json(&m)
            .matches(&a, &ns_labels, Some(&obj), None)
            .map(|v| v.map(|r| format!("{}/{}/{}", r.group, r.version, r.plural)))
    }

    const CM: (&str, &str, &str) = ("", "v1", "configmaps");
    const DEPLOY: (&str, &str, &str) = ("apps", "v1", "deployments");
    const NODES: (&str, &str, &str) = ("", "v1", "nodes");

    #[test]
    fn match_resources_select_as_kubernetes_matching_does() {
        use Operation::*;
        let team = || Some(json!({"team": "a"}));
        let none = || Some(json!({}));
        let cm_rule = json!([{"apiGroups": [""], "apiVersions": ["v1"],
            "operations": ["CREATE"], "resources": ["configmaps"]}]);
        /// (name, matchConstraints, resource, operation, namespace, the
        /// object's labels, the namespace's labels, the expected match).
        type Case<'a> = (
            &'a str,
            Value,
            (&'a str, &'a str, &'a str),
            Operation,
            &'a str,
            Value,
            Option<Value>,
            Option<&'a str>,
        );
        let cases: Vec<Case> = vec![
            // No resourceRules: every resource, every operation.
            (
                "empty",
                json!({}),
                CM,
                Create,
                "ns",
                json!({}),
                none(),
                Some("/v1/configmaps"),
            ),
            (
                "empty, cluster-scoped",
                json!({}),
                NODES,
                Delete,
                "",
                json!({}),
                None,
                Some("/v1/nodes"),
            ),
            (
                "only a namespaceSelector, labelled namespace",
                json!({"namespaceSelector": {"matchLabels": {"team": "a"}}}),
                DEPLOY,
                Update,
                "ns",
                json!({}),
                team(),
                Some("apps/v1/deployments"),
            ),
            (
                "only a namespaceSelector, other namespace",
                json!({"namespaceSelector": {"matchLabels": {"team": "a"}}}),
                CM,
                Create,
                "ns",
                json!({}),
                none(),
                None,
            ),
            (
                "a namespaceSelector does not constrain cluster-scoped resources",
                json!({"namespaceSelector": {"matchLabels": {"team": "a"}}}),
                NODES,
                Create,
                "",
                json!({}),
                None,
                Some("/v1/nodes"),
            ),
            (
                "only an objectSelector, labelled object",
                json!({"objectSelector": {"matchExpressions": [{"key": "app", "operator": "Exists"}]}}),
                CM,
                Create,
                "ns",
                json!({"app": "x"}),
                none(),
                Some("/v1/configmaps"),
            ),
            (
                "only an objectSelector, unlabelled object",
                json!({"objectSelector": {"matchExpressions": [{"key": "app", "operator": "Exists"}]}}),
                CM,
                Create,
                "ns",
                json!({}),
                none(),
                None,
            ),
            (
                "only excludeResourceRules, excluded",
                json!({"excludeResourceRules": cm_rule}),
                CM,
                Create,
                "ns",
                json!({}),
                none(),
                None,
            ),
            (
                "only excludeResourceRules, another resource",
                json!({"excludeResourceRules": cm_rule}),
                DEPLOY,
                Create,
                "ns",
                json!({}),
                none(),
                Some("apps/v1/deployments"),
            ),
            (
                "only excludeResourceRules, another operation",
                json!({"excludeResourceRules": cm_rule}),
                CM,
                Update,
                "ns",
                json!({}),
                none(),
                Some("/v1/configmaps"),
            ),
            (
                "resourceRules, matched",
                json!({"resourceRules": cm_rule}),
                CM,
                Create,
                "ns",
                json!({}),
                none(),
                Some("/v1/configmaps"),
            ),
            (
                "resourceRules, not matched",
                json!({"resourceRules": cm_rule}),
                DEPLOY,
                Create,
                "ns",
                json!({}),
                none(),
                None,
            ),
            (
                "an empty resourceRules list constrains nothing",
                json!({"resourceRules": []}),
                DEPLOY,
                Create,
                "ns",
                json!({}),
                none(),
                Some("apps/v1/deployments"),
            ),
            (
                "excluded wins over included",
                json!({"resourceRules": cm_rule, "excludeResourceRules": cm_rule}),
                CM,
                Create,
                "ns",
                json!({}),
                none(),
                None,
            ),
            (
                "resourceNames",
                json!({"resourceRules": [{"apiGroups": [""], "apiVersions": ["v1"],
                    "operations": ["*"], "resources": ["configmaps"], "resourceNames": ["y"]}]}),
                CM,
                Create,
                "ns",
                json!({}),
                none(),
                None,
            ),
        ];
        for (name, m, r, op, ns, obj_labels, ns_labels, want) in cases {
            assert_eq!(
                selects(m, r, op, ns, obj_labels, ns_labels),
                Ok(want.map(str::to_string)),
                "{name}"
            );
        }
    }

    #[test]
    fn a_bad_selector_is_an_error_only_where_the_rules_match() {
        let bad = json!({"resourceRules": [{"apiGroups": [""], "apiVersions": ["v1"],
            "operations": ["CREATE"], "resources": ["configmaps"]}],
            "namespaceSelector": {"matchExpressions": [{"key": "a", "operator": "Bogus"}]}});
        assert!(selects(
            bad.clone(),
            CM,
            Operation::Create,
            "ns",
            json!({}),
            Some(json!({}))
        )
        .is_err());
        assert_eq!(
            selects(
                bad,
                DEPLOY,
                Operation::Create,
                "ns",
                json!({}),
                Some(json!({}))
            ),
            Ok(None)
        );
    }

    #[test]
    fn a_policy_without_match_constraints_matches_nothing() {
        let p = Policy::from_json(&json!({"metadata": {"name": "p"}, "spec": {}}));
        assert!(p.matcher.is_none());
    }
}
