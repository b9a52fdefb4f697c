//! Scheduling semantics shared by the scheduler, the controllers that place
//! or evict pods (DaemonSets, node lifecycle, volume binding) and the agent,
//! after Kubernetes' `component-helpers/scheduling/corev1`: compiled label
//! selectors, node selector terms and required node affinity, and whether a
//! toleration tolerates a taint. Compiled once per object so that callers do
//! comparisons, not parsing.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    NodeSelectorRequirement, NodeSelectorTerm, PodSpec, Taint, Toleration,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;

pub type Labels = BTreeMap<String, String>;

// ---- selectors ---------------------------------------------------------------

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SelOp {
    In,
    NotIn,
    Exists,
    DoesNotExist,
    Gt,
    Lt,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Requirement {
    pub key: String,
    pub op: SelOp,
    pub values: Vec<String>,
}

impl Requirement {
    fn matches_value(&self, v: Option<&str>) -> bool {
        match self.op {
            SelOp::In => v.is_some_and(|v| self.values.iter().any(|x| x == v)),
            SelOp::NotIn => v.is_none_or(|v| !self.values.iter().any(|x| x == v)),
            SelOp::Exists => v.is_some(),
            SelOp::DoesNotExist => v.is_none(),
            SelOp::Gt | SelOp::Lt => {
                let (Some(v), Some(bound)) = (v, self.values.first()) else {
                    return false;
                };
                match (v.parse::<i64>(), bound.parse::<i64>()) {
                    (Ok(v), Ok(b)) => {
                        if self.op == SelOp::Gt {
                            v > b
                        } else {
                            v < b
                        }
                    }
                    _ => false,
                }
            }
        }
    }
}

/// A compiled label selector. `never` marks a selector that can match
/// nothing (an invalid one, or an absent one where absent means nothing).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Selector {
    pub reqs: Vec<Requirement>,
    pub never: bool,
}

fn parse_op(op: &str, node_ops: bool) -> Option<SelOp> {
    Some(match op {
        "In" => SelOp::In,
        "NotIn" => SelOp::NotIn,
        "Exists" => SelOp::Exists,
        "DoesNotExist" => SelOp::DoesNotExist,
        "Gt" if node_ops => SelOp::Gt,
        "Lt" if node_ops => SelOp::Lt,
        _ => return None,
    })
}

impl Selector {
    pub fn nothing() -> Selector {
        Selector {
            reqs: vec![],
            never: true,
        }
    }

    /// A metav1.LabelSelector; `None` matches nothing, `{}` everything.
    pub fn from_label_selector(s: Option<&LabelSelector>) -> Selector {
        let Some(s) = s else {
            return Selector::nothing();
        };
        let mut sel = Selector::default();
        for (k, v) in s.match_labels.iter().flatten() {
            sel.reqs.push(Requirement {
                key: k.clone(),
                op: SelOp::In,
                values: vec![v.clone()],
            });
        }
        for e in s.match_expressions.iter().flatten() {
            let Some(op) = parse_op(&e.operator, false) else {
                return Selector::nothing();
            };
            let values = e.values.clone().unwrap_or_default();
            if matches!(op, SelOp::In | SelOp::NotIn) && values.is_empty() {
                return Selector::nothing();
            }
            sel.reqs.push(Requirement {
                key: e.key.clone(),
                op,
                values,
            });
        }
        sel
    }

    /// A selector that matches exactly these labels (a map selector).
    pub fn from_map(m: &Labels) -> Selector {
        Selector {
            reqs: m
                .iter()
                .map(|(k, v)| Requirement {
                    key: k.clone(),
                    op: SelOp::In,
                    values: vec![v.clone()],
                })
                .collect(),
            never: false,
        }
    }

    pub fn matches(&self, labels: Option<&Labels>) -> bool {
        if self.never {
            return false;
        }
        self.reqs
            .iter()
            .all(|r| r.matches_value(labels.and_then(|l| l.get(&r.key)).map(String::as_str)))
    }

    pub fn is_everything(&self) -> bool {
        !self.never && self.reqs.is_empty()
    }
}

/// A compiled node selector term: label requirements and field requirements
/// (only `metadata.name` exists).
#[derive(Debug, Clone, Default)]
pub struct NodeTerm {
    pub labels: Vec<Requirement>,
    pub fields: Vec<Requirement>,
    pub invalid: bool,
}

impl NodeTerm {
    pub fn compile(t: &NodeSelectorTerm) -> NodeTerm {
        let mut out = NodeTerm::default();
        let conv = |e: &NodeSelectorRequirement, out: &mut NodeTerm| -> Option<Requirement> {
            let op = parse_op(&e.operator, true);
            let Some(op) = op else {
                out.invalid = true;
                return None;
            };
            Some(Requirement {
                key: e.key.clone(),
                op,
                values: e.values.clone().unwrap_or_default(),
            })
        };
        for e in t.match_expressions.iter().flatten() {
            if let Some(r) = conv(e, &mut out) {
                out.labels.push(r);
            }
        }
        for e in t.match_fields.iter().flatten() {
            if e.key != "metadata.name" || !matches!(e.operator.as_str(), "In" | "NotIn") {
                out.invalid = true;
                continue;
            }
            if let Some(r) = conv(e, &mut out) {
                out.fields.push(r);
            }
        }
        out
    }

    /// An empty term matches no node.
    pub fn matches(&self, node_name: &str, labels: Option<&Labels>) -> bool {
        if self.invalid || (self.labels.is_empty() && self.fields.is_empty()) {
            return false;
        }
        self.labels
            .iter()
            .all(|r| r.matches_value(labels.and_then(|l| l.get(&r.key)).map(String::as_str)))
            && self.fields.iter().all(|r| r.matches_value(Some(node_name)))
    }
}

/// The pod's hard node constraints: nodeSelector and required node affinity.
#[derive(Debug, Clone, Default)]
pub struct RequiredNodeAffinity {
    pub node_selector: Option<Selector>,
    /// `None`: no required affinity; `Some(terms)`: at least one must match.
    pub terms: Option<Vec<NodeTerm>>,
}

impl RequiredNodeAffinity {
    /// The constraints of a pod's spec.
    pub fn of(spec: Option<&PodSpec>) -> RequiredNodeAffinity {
        let node_selector = spec
            .and_then(|s| s.node_selector.as_ref())
            .filter(|m| !m.is_empty())
            .map(Selector::from_map);
        let terms = spec
            .and_then(|s| s.affinity.as_ref())
            .and_then(|a| a.node_affinity.as_ref())
            .and_then(|n| {
                n.required_during_scheduling_ignored_during_execution
                    .as_ref()
            })
            .map(|r| {
                r.node_selector_terms
                    .iter()
                    .map(NodeTerm::compile)
                    .collect()
            });
        RequiredNodeAffinity {
            node_selector,
            terms,
        }
    }

    pub fn is_empty(&self) -> bool {
        self.node_selector.is_none() && self.terms.is_none()
    }

    /// Whether the node named `node_name` with `labels` satisfies them.
    pub fn matches(&self, node_name: &str, labels: Option<&Labels>) -> bool {
        if let Some(s) = &self.node_selector {
            if !s.matches(labels) {
                return false;
            }
        }
        if let Some(terms) = &self.terms {
            if !terms.iter().any(|t| t.matches(node_name, labels)) {
                return false;
            }
        }
        true
    }
}

// ---- taints and tolerations --------------------------------------------------------

pub fn tolerates(t: &Toleration, taint: &Taint) -> bool {
    if let Some(e) = t.effect.as_deref() {
        if !e.is_empty() && e != taint.effect {
            return false;
        }
    }
    let key = t.key.as_deref().unwrap_or("");
    let op = t.operator.as_deref().unwrap_or("Equal");
    if key.is_empty() {
        // An empty key with Exists tolerates everything.
        return op == "Exists";
    }
    if key != taint.key {
        return false;
    }
    match op {
        "Exists" => true,
        "Equal" | "" => t.value.as_deref().unwrap_or("") == taint.value.as_deref().unwrap_or(""),
        _ => false,
    }
}

pub fn tolerated(tolerations: &[Toleration], taint: &Taint) -> bool {
    tolerations.iter().any(|t| tolerates(t, taint))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn tolerations_match_taints_by_key_value_effect_and_operator() {
        let taint = Taint {
            key: "k".into(),
            value: Some("v".into()),
            effect: "NoExecute".into(),
            time_added: None,
        };
        let tol = |key: Option<&str>,
                   op: Option<&str>,
                   value: Option<&str>,
                   effect: Option<&str>| Toleration {
            key: key.map(Into::into),
            operator: op.map(Into::into),
            value: value.map(Into::into),
            effect: effect.map(Into::into),
            toleration_seconds: None,
        };
        assert!(tolerates(
            &tol(Some("k"), Some("Equal"), Some("v"), None),
            &taint
        ));
        assert!(!tolerates(
            &tol(Some("k"), Some("Equal"), Some("w"), None),
            &taint
        ));
        assert!(tolerates(
            &tol(Some("k"), Some("Exists"), None, Some("NoExecute")),
            &taint
        ));
        assert!(!tolerates(
            &tol(Some("k"), Some("Exists"), None, Some("NoSchedule")),
            &taint
        ));
        assert!(tolerates(&tol(None, Some("Exists"), None, None), &taint));
        assert!(
            !tolerates(&tol(None, None, None, None), &taint),
            "an empty key needs Exists"
        );
        // An operator Kubernetes does not know tolerates nothing (the
        // controllers' copy used to treat it as Equal).
        assert!(!tolerates(
            &tol(Some("k"), Some("Bogus"), Some("v"), None),
            &taint
        ));
        // An absent operator is Equal.
        assert!(tolerates(&tol(Some("k"), None, Some("v"), None), &taint));
        assert!(tolerated(
            &[
                tol(Some("x"), None, None, None),
                tol(Some("k"), Some("Exists"), None, None)
            ],
            &taint
        ));
    }

    #[test]
    fn nodes_fit_by_selector_affinity_expressions_and_name_fields() {
        let labels: Labels = [("zone", "a"), ("cores", "8")]
            .into_iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let spec = |v: serde_json::Value| -> PodSpec { serde_json::from_value(v).unwrap() };
        let node_fits = |name: &str, spec: &PodSpec| {
            RequiredNodeAffinity::of(Some(spec)).matches(name, Some(&labels))
        };
        let node = "n1";
        assert!(node_fits(node, &spec(json!({"containers": []}))));
        assert!(node_fits(
            node,
            &spec(json!({"containers": [], "nodeSelector": {"zone": "a"}}))
        ));
        assert!(!node_fits(
            node,
            &spec(json!({"containers": [], "nodeSelector": {"zone": "b"}}))
        ));
        let aff = |terms: serde_json::Value| {
            spec(
                json!({"containers": [], "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": terms}}}}),
            )
        };
        assert!(node_fits(
            node,
            &aff(
                json!([{"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n1"]}]}])
            )
        ));
        assert!(!node_fits(
            node,
            &aff(
                json!([{"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n2"]}]}])
            )
        ));
        assert!(node_fits(
            node,
            &aff(
                json!([{"matchExpressions": [{"key": "cores", "operator": "Gt", "values": ["4"]}]}])
            )
        ));
        assert!(
            node_fits(
                node,
                &aff(json!([
            {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["b"]}]},
            {"matchExpressions": [{"key": "zone", "operator": "Exists"}]}]))
            ),
            "terms are ORed"
        );
        assert!(
            !node_fits(node, &aff(json!([{}]))),
            "an empty term matches no node"
        );
        assert!(
            !node_fits(
                node,
                &aff(
                    json!([{"matchExpressions": [{"key": "cores", "operator": "Gt", "values": ["many"]}]}])
                )
            ),
            "Gt with a bound that is no integer matches nothing"
        );
        assert!(
            node_fits(
                node,
                &aff(
                    json!([{"matchExpressions": [{"key": "gpu", "operator": "NotIn", "values": ["x"]}]}])
                )
            ),
            "NotIn matches a node without the label"
        );
        assert!(
            !node_fits(
                node,
                &aff(
                    json!([{"matchExpressions": [{"key": "zone", "operator": "Bogus", "values": ["a"]}]}])
                )
            ),
            "an unknown operator makes the term match nothing"
        );
    }
}
