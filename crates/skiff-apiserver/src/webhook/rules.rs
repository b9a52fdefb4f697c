//! Which requests an admission webhook (or, later, a policy's
//! matchConstraints) applies to: rules with operations, API groups,
//! versions, resources with `*/status`-style subresources and scope, as
//! Kubernetes' `rules.Matcher`; and the label selectors on the request's
//! namespace and object.

use serde_json::{Map, Value};
use skiff_core::selector::LabelSelector;

/// A request's operation, as AdmissionReview names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Operation {
    Create,
    Update,
    Delete,
    Connect,
}

impl Operation {
    pub fn as_str(self) -> &'static str {
        match self {
            Operation::Create => "CREATE",
            Operation::Update => "UPDATE",
            Operation::Delete => "DELETE",
            Operation::Connect => "CONNECT",
        }
    }
}

/// One `RuleWithOperations`.
#[derive(Debug, Clone, Default)]
pub struct Rule {
    pub operations: Vec<String>,
    pub api_groups: Vec<String>,
    pub api_versions: Vec<String>,
    pub resources: Vec<String>,
    /// `*`, `Cluster` or `Namespaced`.
    pub scope: String,
}

fn strings(v: Option<&Value>) -> Vec<String> {
    v.and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(Value::as_str)
                .map(str::to_string)
                .collect()
        })
        .unwrap_or_default()
}

impl Rule {
    pub fn from_json(v: &Value) -> Rule {
        Rule {
            operations: strings(v.get("operations")),
            api_groups: strings(v.get("apiGroups")),
            api_versions: strings(v.get("apiVersions")),
            resources: strings(v.get("resources")),
            scope: v
                .get("scope")
                .and_then(Value::as_str)
                .unwrap_or("*")
                .to_string(),
        }
    }

    /// Whether the rule covers a request (`namespaced`: the request has a
    /// namespace, which a Namespace object itself does not).
    pub fn matches(
        &self,
        op: Operation,
        group: &str,
        version: &str,
        resource: &str,
        sub: &str,
        namespaced: bool,
    ) -> bool {
        let has = |list: &[String], v: &str| list.iter().any(|x| x == "*" || x == v);
        has(&self.operations, op.as_str())
            && has(&self.api_groups, group)
            && has(&self.api_versions, version)
            && self.resources.iter().any(|r| {
                let (res, s) = r.split_once('/').unwrap_or((r, ""));
                (res == "*" || res == resource) && (s == "*" || s == sub)
            })
            && match self.scope.as_str() {
                "Cluster" => !namespaced,
                "Namespaced" => namespaced,
                _ => true,
            }
    }
}

/// The variables matchConditions (and policies) may read.
pub const CEL_VARS: &[&str] = &["object", "oldObject", "request"];

/// One matchCondition, compiled once.
#[derive(Debug, Clone)]
pub struct MatchCondition {
    pub name: String,
    pub program: Result<skiff_core::cel::Program, String>,
}

/// Compiles a `matchConditions` list.
pub fn match_conditions(v: Option<&Value>) -> Vec<MatchCondition> {
    v.and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .map(|m| MatchCondition {
                    name: m
                        .get("name")
                        .and_then(Value::as_str)
                        .unwrap_or("")
                        .to_string(),
                    program: skiff_core::cel::compile(
                        m.get("expression").and_then(Value::as_str).unwrap_or(""),
                        CEL_VARS,
                    ),
                })
                .collect()
        })
        .unwrap_or_default()
}

/// Whether every condition holds (Kubernetes: a false one skips the
/// webhook or policy; an error is a failure for its failurePolicy).
pub fn conditions_hold(conds: &[MatchCondition], vars: &[(&str, &Value)]) -> Result<bool, String> {
    for c in conds {
        let p = c
            .program
            .as_ref()
            .map_err(|e| format!("matchCondition {:?}: {e}", c.name))?;
        match p.eval(vars) {
            Ok(Value::Bool(true)) => {}
            Ok(Value::Bool(false)) => return Ok(false),
            Ok(other) => {
                return Err(format!(
                    "matchCondition {:?} must evaluate to bool, got {other}",
                    c.name
                ))
            }
            Err(e) => return Err(format!("matchCondition {:?}: {e}", c.name)),
        }
    }
    Ok(true)
}

/// A selector as a webhook stores it; an absent or empty one matches all.
pub fn selector(v: Option<&Value>) -> Result<Option<LabelSelector>, String> {
    match v {
        None | Some(Value::Null) => Ok(None),
        Some(s) => {
            let sel = LabelSelector::from_label_selector_json(s)?;
            Ok((!sel.is_empty()).then_some(sel))
        }
    }
}

/// The labels of an object.
pub fn labels(obj: Option<&Value>) -> Map<String, Value> {
    obj.and_then(|o| o.pointer("/metadata/labels"))
        .and_then(Value::as_object)
        .cloned()
        .unwrap_or_default()
}

/// objectSelector: the new or the old object matches (Kubernetes tries both).
pub fn object_matches(
    sel: &Option<LabelSelector>,
    obj: Option<&Value>,
    old: Option<&Value>,
) -> bool {
    let Some(sel) = sel else { return true };
    [obj, old]
        .into_iter()
        .flatten()
        .any(|o| sel.matches(&labels(Some(o))))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn rule(ops: &[&str], resources: &[&str], scope: &str) -> Rule {
        Rule::from_json(&json!({
            "operations": ops, "apiGroups": ["", "apps"], "apiVersions": ["*"],
            "resources": resources, "scope": scope,
        }))
    }

    #[test]
    fn resources_and_subresources_match_as_kubernetes_matches_them() {
        use Operation::*;
        let pods = rule(&["CREATE"], &["pods"], "*");
        assert!(pods.matches(Create, "", "v1", "pods", "", true));
        assert!(!pods.matches(Create, "", "v1", "pods", "status", true));
        assert!(!pods.matches(Update, "", "v1", "pods", "", true));
        assert!(!pods.matches(Create, "batch", "v1", "pods", "", true));
        let status = rule(&["*"], &["*/status"], "*");
        assert!(status.matches(Update, "apps", "v1", "deployments", "status", true));
        assert!(!status.matches(Update, "apps", "v1", "deployments", "", true));
        let all = rule(&["*"], &["*"], "*");
        assert!(all.matches(Delete, "", "v1", "configmaps", "", true));
        assert!(!all.matches(Delete, "", "v1", "pods", "exec", true));
        let everything = rule(&["*"], &["*/*"], "*");
        assert!(everything.matches(Connect, "", "v1", "pods", "exec", true));
        let cluster = rule(&["*"], &["*"], "Cluster");
        assert!(cluster.matches(Create, "", "v1", "namespaces", "", false));
        assert!(!cluster.matches(Create, "", "v1", "configmaps", "", true));
        let namespaced = rule(&["*"], &["*"], "Namespaced");
        assert!(!namespaced.matches(Create, "", "v1", "namespaces", "", false));
    }

    #[test]
    fn an_object_selector_matches_the_new_or_the_old_object() {
        let sel = selector(Some(&json!({"matchLabels": {"hook": "on"}}))).unwrap();
        let on = json!({"metadata": {"labels": {"hook": "on"}}});
        let off = json!({"metadata": {}});
        assert!(object_matches(&sel, Some(&on), None));
        assert!(object_matches(&sel, Some(&off), Some(&on)));
        assert!(!object_matches(&sel, Some(&off), None));
        assert!(object_matches(
            &selector(Some(&json!({}))).unwrap(),
            Some(&off),
            None
        ));
    }
}
