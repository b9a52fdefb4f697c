//! The built-in admission plugins' decisions, on data alone: the API server
//! looks up the objects they need (PriorityClasses, LimitRanges,
//! ResourceQuotas and what the quotas count) and applies the results.
//!
//! - ServiceAccount: `spec.serviceAccountName` defaults to `default`.
//! - DefaultTolerationSeconds: pods tolerate `not-ready` and `unreachable`
//!   NoExecute taints for 300 s unless they say otherwise.
//! - Priority: `spec.priorityClassName` resolves to `spec.priority`.
//! - LimitRanger: container defaults, then min/max/ratio bounds.
//! - ResourceQuota: usage of an object and the check against hard limits.

use std::borrow::Borrow;
use std::collections::BTreeMap;

use serde_json::{json, Map, Value};

use crate::resources::ResourceInfo;

pub const TAINT_NOT_READY: &str = "node.kubernetes.io/not-ready";
pub const TAINT_UNREACHABLE: &str = "node.kubernetes.io/unreachable";
/// DefaultTolerationSeconds' default for both taints.
pub const DEFAULT_TOLERATION_SECONDS: i64 = 300;

/// The PriorityClasses every cluster has.
pub const SYSTEM_PRIORITY_CLASSES: [(&str, i64, &str); 2] = [
    (
        "system-node-critical",
        2_000_001_000,
        "Used for system critical pods that must not be moved from their current node.",
    ),
    (
        "system-cluster-critical",
        2_000_000_000,
        "Used for system critical pods that must run in the cluster, but can be moved to another node if necessary.",
    ),
];

/// ServiceAccount admission: the `default` account unless one is named
/// (the deprecated `serviceAccount` field mirrors it).
pub fn default_service_account(spec: &mut Value) {
    let Some(m) = spec.as_object_mut() else {
        return;
    };
    let name = match m.get("serviceAccountName").and_then(Value::as_str) {
        Some(n) if !n.is_empty() => n.to_string(),
        _ => match m.get("serviceAccount").and_then(Value::as_str) {
            Some(n) if !n.is_empty() => n.to_string(),
            _ => "default".to_string(),
        },
    };
    m.insert("serviceAccountName".into(), json!(name));
    m.insert("serviceAccount".into(), json!(name));
}

/// DefaultTolerationSeconds: adds the `not-ready` and `unreachable`
/// NoExecute tolerations (300 s) a pod does not already have.
pub fn default_tolerations(spec: &mut Value) {
    let Some(m) = spec.as_object_mut() else {
        return;
    };
    let existing: Vec<Value> = m
        .get("tolerations")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let tolerates = |key: &str| {
        existing.iter().any(|t| {
            let k = t.get("key").and_then(Value::as_str).unwrap_or("");
            let e = t.get("effect").and_then(Value::as_str).unwrap_or("");
            (k == key || k.is_empty()) && (e == "NoExecute" || e.is_empty())
        })
    };
    let mut out = existing.clone();
    for key in [TAINT_NOT_READY, TAINT_UNREACHABLE] {
        if !tolerates(key) {
            out.push(json!({"key": key, "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": DEFAULT_TOLERATION_SECONDS}));
        }
    }
    if out.len() != existing.len() {
        m.insert("tolerations".into(), Value::Array(out));
    }
}

/// Priority admission: sets `spec.priority` (and `preemptionPolicy`) from
/// the named PriorityClass, or the global default when none is named.
/// `classes` are the cluster's PriorityClass objects. The error is the
/// message of Kubernetes' Forbidden answer.
pub fn resolve_priority(spec: &mut Value, classes: &[impl Borrow<Value>]) -> Result<(), String> {
    let Some(m) = spec.as_object_mut() else {
        return Ok(());
    };
    let named = m
        .get("priorityClassName")
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_string();
    let value_of = |c: &Value| c.get("value").and_then(Value::as_i64).unwrap_or(0);
    let policy_of = |c: &Value| {
        c.get("preemptionPolicy")
            .and_then(Value::as_str)
            .unwrap_or("PreemptLowerPriority")
            .to_string()
    };
    let (priority, policy) = if named.is_empty() {
        // The global default; with several (a race), the lowest value.
        let default = classes
            .iter()
            .map(Borrow::borrow)
            .filter(|c| c.get("globalDefault").and_then(Value::as_bool) == Some(true))
            .min_by_key(|c| value_of(c));
        match default {
            Some(c) => {
                let name = c
                    .pointer("/metadata/name")
                    .and_then(Value::as_str)
                    .unwrap_or("");
                m.insert("priorityClassName".into(), json!(name));
                (value_of(c), policy_of(c))
            }
            None => (0, "PreemptLowerPriority".to_string()),
        }
    } else {
        let found = classes
            .iter()
            .map(Borrow::borrow)
            .find(|c| c.pointer("/metadata/name").and_then(Value::as_str) == Some(named.as_str()));
        match found {
            Some(c) => (value_of(c), policy_of(c)),
            None => match SYSTEM_PRIORITY_CLASSES.iter().find(|(n, _, _)| *n == named) {
                Some((_, v, _)) => (*v, "PreemptLowerPriority".to_string()),
                None => return Err(format!("no PriorityClass with name {named} was found")),
            },
        }
    };
    if let Some(given) = m.get("priority").and_then(Value::as_i64) {
        if given != priority {
            return Err(format!("the integer value of priority ({given}) must not be provided in pod spec; priority admission controller computed {priority} from the given PriorityClass name"));
        }
    }
    m.insert("priority".into(), json!(priority));
    match m.get("preemptionPolicy").and_then(Value::as_str) {
        Some(given) if given != policy => {
            return Err(format!("the string value of PreemptionPolicy ({given}) must not be provided in pod spec; priority admission controller computed {policy} from the given PriorityClass name"));
        }
        _ => {
            m.insert("preemptionPolicy".into(), json!(policy));
        }
    }
    Ok(())
}

// ---- quantities ---------------------------------------------------------

/// A quantity in thousandths of its unit, rounded up; `None` when it does
/// not parse.
pub fn milli(v: &Value) -> Option<i128> {
    skiff_helpers::quantity::from_json(v).map(|q| i128::from(q.milli_ceil()))
}

/// `m` thousandths in Kubernetes' canonical form, binary (`Ki`, `Mi`, …)
/// when `binary` and whole enough.
pub fn format_milli(m: i128, binary: bool) -> String {
    use skiff_helpers::quantity::Format;
    let format = if binary {
        Format::BinarySI
    } else {
        Format::DecimalSI
    };
    skiff_helpers::Quantity::from_milli(m, format).canonical()
}

fn binary_form(v: Option<&Value>) -> bool {
    v.and_then(Value::as_str)
        .map(|s| s.ends_with('i'))
        .unwrap_or(false)
}

fn shown(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

// ---- LimitRanger --------------------------------------------------------

/// A LimitRange item's defaults as Kubernetes fills them: `default` from
/// `max`, `defaultRequest` from `default`, then from `min` (Container items).
pub fn limit_range_item_defaults(item: &mut Value) {
    if item.get("type").and_then(Value::as_str) != Some("Container") {
        return;
    }
    let Some(m) = item.as_object_mut() else {
        return;
    };
    let get = |m: &Map<String, Value>, k: &str| {
        m.get(k)
            .and_then(Value::as_object)
            .cloned()
            .unwrap_or_default()
    };
    let max = get(m, "max");
    let min = get(m, "min");
    let mut default = get(m, "default");
    for (k, v) in &max {
        default.entry(k.clone()).or_insert_with(|| v.clone());
    }
    let mut default_request = get(m, "defaultRequest");
    for (k, v) in default.iter().chain(min.iter()) {
        default_request
            .entry(k.clone())
            .or_insert_with(|| v.clone());
    }
    if !default.is_empty() {
        m.insert("default".into(), Value::Object(default));
    }
    if !default_request.is_empty() {
        m.insert("defaultRequest".into(), Value::Object(default_request));
    }
}

fn resource_list<'a>(c: &'a Value, which: &str) -> Option<&'a Map<String, Value>> {
    c.pointer(&format!("/resources/{which}"))
        .and_then(Value::as_object)
}

/// LimitRanger's defaulting: containers without a request or limit for a
/// resource get the Container item's `defaultRequest`/`default`. Returns
/// the `kubernetes.io/limit-ranger` annotation text when anything was set.
pub fn apply_limit_range_defaults(
    pod: &mut Value,
    ranges: &[impl Borrow<Value>],
) -> Option<String> {
    let mut defaults_limits = Map::new();
    let mut defaults_requests = Map::new();
    for lr in ranges.iter().map(Borrow::borrow) {
        for item in lr
            .pointer("/spec/limits")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            let mut item = item.clone();
            limit_range_item_defaults(&mut item);
            if item.get("type").and_then(Value::as_str) != Some("Container") {
                continue;
            }
            for (which, into) in [
                ("default", &mut defaults_limits),
                ("defaultRequest", &mut defaults_requests),
            ] {
                if let Some(d) = item.get(which).and_then(Value::as_object) {
                    for (k, v) in d {
                        into.entry(k.clone()).or_insert_with(|| v.clone());
                    }
                }
            }
        }
    }
    if defaults_limits.is_empty() && defaults_requests.is_empty() {
        return None;
    }
    let mut notes = Vec::new();
    for list in ["containers", "initContainers"] {
        let Some(cs) = pod
            .pointer_mut(&format!("/spec/{list}"))
            .and_then(Value::as_array_mut)
        else {
            continue;
        };
        for c in cs.iter_mut() {
            let name = c
                .get("name")
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_string();
            let Some(cm) = c.as_object_mut() else {
                continue;
            };
            let res = cm.entry("resources").or_insert_with(|| json!({}));
            if !res.is_object() {
                *res = json!({});
            }
            let res = res.as_object_mut().expect("object");
            let mut set = |which: &str, defaults: &Map<String, Value>| {
                let mut added = Vec::new();
                let entry = res.entry(which).or_insert_with(|| json!({}));
                if !entry.is_object() {
                    *entry = json!({});
                }
                let list = entry.as_object_mut().expect("object");
                for (k, v) in defaults {
                    if !list.contains_key(k) {
                        list.insert(k.clone(), v.clone());
                        added.push(k.clone());
                    }
                }
                if list.is_empty() {
                    res.remove(which);
                }
                added
            };
            let requests = set("requests", &defaults_requests);
            let limits = set("limits", &defaults_limits);
            if !requests.is_empty() {
                notes.push(format!(
                    "{} request for {} {name}",
                    requests.join(", "),
                    if list == "containers" {
                        "container"
                    } else {
                        "init container"
                    }
                ));
            }
            if !limits.is_empty() {
                notes.push(format!(
                    "{} limit for {} {name}",
                    limits.join(", "),
                    if list == "containers" {
                        "container"
                    } else {
                        "init container"
                    }
                ));
            }
        }
    }
    if notes.is_empty() {
        None
    } else {
        Some(format!("LimitRanger plugin set: {}", notes.join("; ")))
    }
}

fn min_constraint(
    kind: &str,
    r: &str,
    enforced: &Value,
    req: Option<&Map<String, Value>>,
    lim: Option<&Map<String, Value>>,
) -> Option<String> {
    let e = milli(enforced)?;
    let Some(rq) = req.and_then(|m| m.get(r)) else {
        return Some(format!(
            "minimum {r} usage per {kind} is {}.  No request is specified",
            shown(enforced)
        ));
    };
    if milli(rq).unwrap_or(0) < e {
        return Some(format!(
            "minimum {r} usage per {kind} is {}, but request is {}",
            shown(enforced),
            shown(rq)
        ));
    }
    if let Some(l) = lim.and_then(|m| m.get(r)) {
        if milli(l).unwrap_or(0) < e {
            return Some(format!(
                "minimum {r} usage per {kind} is {}, but limit is {}",
                shown(enforced),
                shown(l)
            ));
        }
    }
    None
}

fn max_constraint(
    kind: &str,
    r: &str,
    enforced: &Value,
    req: Option<&Map<String, Value>>,
    lim: Option<&Map<String, Value>>,
) -> Option<String> {
    let e = milli(enforced)?;
    let Some(l) = lim.and_then(|m| m.get(r)) else {
        return Some(format!(
            "maximum {r} usage per {kind} is {}.  No limit is specified",
            shown(enforced)
        ));
    };
    if milli(l).unwrap_or(0) > e {
        return Some(format!(
            "maximum {r} usage per {kind} is {}, but limit is {}",
            shown(enforced),
            shown(l)
        ));
    }
    if let Some(rq) = req.and_then(|m| m.get(r)) {
        if milli(rq).unwrap_or(0) > e {
            return Some(format!(
                "maximum {r} usage per {kind} is {}, but request is {}",
                shown(enforced),
                shown(rq)
            ));
        }
    }
    None
}

fn ratio_constraint(
    kind: &str,
    r: &str,
    enforced: &Value,
    req: Option<&Map<String, Value>>,
    lim: Option<&Map<String, Value>>,
) -> Option<String> {
    let e = milli(enforced)?;
    let rq = req.and_then(|m| m.get(r)).and_then(milli).unwrap_or(0);
    if rq == 0 {
        return Some(format!("{r} max limit to request ratio per {kind} is {}, but no request is specified or request is 0", shown(enforced)));
    }
    let l = lim.and_then(|m| m.get(r)).and_then(milli).unwrap_or(0);
    if l == 0 {
        return Some(format!("{r} max limit to request ratio per {kind} is {}, but no limit is specified or limit is 0", shown(enforced)));
    }
    let ratio = l as f64 / rq as f64;
    if ratio * 1000.0 > e as f64 {
        return Some(format!(
            "{r} max limit to request ratio per {kind} is {}, but provided ratio is {ratio:.6}",
            shown(enforced)
        ));
    }
    None
}

/// The sum of a pod's containers' requests or limits per resource, the
/// largest init container's when that is more (as LimitRanger computes a
/// Pod item's usage).
pub(crate) fn pod_totals(pod: &Value, which: &str) -> Map<String, Value> {
    let mut sum: BTreeMap<String, i128> = BTreeMap::new();
    let mut binary: BTreeMap<String, bool> = BTreeMap::new();
    for c in pod
        .pointer("/spec/containers")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        for (k, v) in resource_list(c, which).into_iter().flatten() {
            *sum.entry(k.clone()).or_default() += milli(v).unwrap_or(0);
            binary.entry(k.clone()).or_insert(binary_form(Some(v)));
        }
    }
    for c in pod
        .pointer("/spec/initContainers")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        for (k, v) in resource_list(c, which).into_iter().flatten() {
            let m = milli(v).unwrap_or(0);
            let e = sum.entry(k.clone()).or_default();
            if m > *e {
                *e = m;
            }
            binary.entry(k.clone()).or_insert(binary_form(Some(v)));
        }
    }
    sum.into_iter()
        .map(|(k, m)| {
            let b = binary.get(&k).copied().unwrap_or(false);
            (k, json!(format_milli(m, b)))
        })
        .collect()
}

/// LimitRanger's validation of a pod against the namespace's LimitRanges;
/// the error is Kubernetes' aggregated message.
pub fn validate_limit_ranges(pod: &Value, ranges: &[impl Borrow<Value>]) -> Result<(), String> {
    let mut errs = Vec::new();
    for lr in ranges.iter().map(Borrow::borrow) {
        for item in lr
            .pointer("/spec/limits")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            let kind = item.get("type").and_then(Value::as_str).unwrap_or("");
            let check = |req: Option<&Map<String, Value>>,
                         lim: Option<&Map<String, Value>>,
                         errs: &mut Vec<String>| {
                for (field, f) in [
                    ("min", min_constraint as fn(_, _, _, _, _) -> _),
                    ("max", max_constraint),
                    ("maxLimitRequestRatio", ratio_constraint),
                ] {
                    for (r, enforced) in item
                        .get(field)
                        .and_then(Value::as_object)
                        .into_iter()
                        .flatten()
                    {
                        if let Some(e) = f(kind, r, enforced, req, lim) {
                            errs.push(e);
                        }
                    }
                }
            };
            match kind {
                "Container" => {
                    for list in ["containers", "initContainers"] {
                        for c in pod
                            .pointer(&format!("/spec/{list}"))
                            .and_then(Value::as_array)
                            .into_iter()
                            .flatten()
                        {
                            check(
                                resource_list(c, "requests"),
                                resource_list(c, "limits"),
                                &mut errs,
                            );
                        }
                    }
                }
                "Pod" => {
                    let req = pod_totals(pod, "requests");
                    let lim = pod_totals(pod, "limits");
                    check(Some(&req), Some(&lim), &mut errs);
                }
                _ => {}
            }
        }
    }
    match errs.len() {
        0 => Ok(()),
        1 => Err(errs.remove(0)),
        _ => Err(format!("[{}]", errs.join(", "))),
    }
}

// ---- ResourceQuota ------------------------------------------------------

/// Usage an object adds to a quota, per quota resource name, in milli-units:
/// one `count/<resource>` and what the kind's rules add.
pub fn usage(res: &ResourceInfo, obj: &Value) -> BTreeMap<String, i128> {
    let Some(mut u) = res.rules.quota_usage(obj) else {
        return BTreeMap::new();
    };
    u.insert(count_name(res), 1000);
    u
}

/// `count/pods`, `count/deployments.apps`.
fn count_name(res: &ResourceInfo) -> String {
    if res.group.is_empty() {
        format!("count/{}", res.plural)
    } else {
        format!("count/{}.{}", res.plural, res.group)
    }
}

/// The resources of a quota's `hard` that an object's creation is checked
/// against (Kubernetes' evaluators: the legacy names and `count/...`).
pub fn quota_tracks(res: &ResourceInfo, resource: &str) -> bool {
    resource == count_name(res) || res.rules.quota_tracks(resource)
}

/// The pod evaluator's constraint: when a quota limits cpu or memory,
/// every container must state it. Returns `must specify ...`.
pub fn pod_quota_constraints(pod: &Value, tracked: &[String]) -> Result<(), String> {
    const VALIDATED: [&str; 6] = [
        "cpu",
        "memory",
        "requests.cpu",
        "requests.memory",
        "limits.cpu",
        "limits.memory",
    ];
    let required: Vec<&str> = tracked
        .iter()
        .map(String::as_str)
        .filter(|r| VALIDATED.contains(r))
        .collect();
    if required.is_empty() {
        return Ok(());
    }
    let mut missing: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for list in ["containers", "initContainers"] {
        for c in pod
            .pointer(&format!("/spec/{list}"))
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            let name = c.get("name").and_then(Value::as_str).unwrap_or("");
            let req = resource_list(c, "requests");
            let lim = resource_list(c, "limits");
            let has = |m: Option<&Map<String, Value>>, r: &str| {
                m.map(|m| m.contains_key(r)).unwrap_or(false)
            };
            for r in &required {
                let ok = match *r {
                    "cpu" | "requests.cpu" => has(req, "cpu"),
                    "memory" | "requests.memory" => has(req, "memory"),
                    "limits.cpu" => has(lim, "cpu"),
                    _ => has(lim, "memory"),
                };
                if !ok {
                    let names = missing.entry(r.to_string()).or_default();
                    if !names.iter().any(|n| n == name) {
                        names.push(name.to_string());
                    }
                }
            }
        }
    }
    if missing.is_empty() {
        return Ok(());
    }
    let parts: Vec<String> = missing
        .into_iter()
        .map(|(r, mut names)| {
            names.sort();
            format!("{r} for: {}", names.join(","))
        })
        .collect();
    Err(format!("must specify {}", parts.join("; ")))
}

/// Checks one quota: `used` (current usage) plus `requested` against the
/// quota's hard limits, for the resources the request consumes. Returns
/// the new usage of all hard resources, or the `exceeded quota` message.
pub fn check_quota(
    name: &str,
    hard: &Map<String, Value>,
    used: &BTreeMap<String, i128>,
    requested: &BTreeMap<String, i128>,
) -> Result<BTreeMap<String, i128>, String> {
    let mut exceeded = Vec::new();
    for (r, want) in requested {
        if *want == 0 {
            continue;
        }
        let Some(limit) = hard.get(r).and_then(milli) else {
            continue;
        };
        let now = used.get(r).copied().unwrap_or(0);
        if now + want > limit {
            exceeded.push(r.clone());
        }
    }
    if !exceeded.is_empty() {
        exceeded.sort();
        let fmt = |f: &dyn Fn(&str) -> i128| {
            exceeded
                .iter()
                .map(|r| {
                    format!(
                        "{r}={}",
                        format_milli(f(r), binary_form(hard.get(r.as_str())))
                    )
                })
                .collect::<Vec<_>>()
                .join(",")
        };
        return Err(format!(
            "exceeded quota: {name}, requested: {}, used: {}, limited: {}",
            fmt(&|r| requested.get(r).copied().unwrap_or(0)),
            fmt(&|r| used.get(r).copied().unwrap_or(0)),
            fmt(&|r| hard.get(r).and_then(milli).unwrap_or(0)),
        ));
    }
    Ok(hard
        .keys()
        .map(|r| {
            (
                r.clone(),
                used.get(r).copied().unwrap_or(0) + requested.get(r).copied().unwrap_or(0),
            )
        })
        .collect())
}

/// A usage map as a quota's `status.used`, formatted like its `hard`.
pub fn used_json(hard: &Map<String, Value>, used: &BTreeMap<String, i128>) -> Value {
    Value::Object(
        hard.iter()
            .map(|(r, h)| {
                (
                    r.clone(),
                    json!(format_milli(
                        used.get(r).copied().unwrap_or(0),
                        binary_form(Some(h))
                    )),
                )
            })
            .collect(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resources::lookup;

    #[test]
    fn tolerations_are_added_unless_already_tolerated() {
        let mut spec = json!({"containers": []});
        default_tolerations(&mut spec);
        assert_eq!(spec["tolerations"].as_array().unwrap().len(), 2);
        assert_eq!(spec["tolerations"][0]["key"], TAINT_NOT_READY);
        assert_eq!(spec["tolerations"][1]["tolerationSeconds"], 300);
        let mut spec = json!({"tolerations": [{"key": TAINT_UNREACHABLE, "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 5}]});
        default_tolerations(&mut spec);
        let t = spec["tolerations"].as_array().unwrap();
        assert_eq!(t.len(), 2);
        assert_eq!(t[0]["tolerationSeconds"], 5);
        let mut spec = json!({"tolerations": [{"operator": "Exists"}]});
        default_tolerations(&mut spec);
        assert_eq!(spec["tolerations"].as_array().unwrap().len(), 1);
    }

    #[test]
    fn priority_comes_from_the_class_or_the_global_default() {
        let classes = vec![
            json!({"metadata": {"name": "high"}, "value": 1000}),
            json!({"metadata": {"name": "dflt"}, "value": 7, "globalDefault": true, "preemptionPolicy": "Never"}),
        ];
        let mut spec = json!({"priorityClassName": "high"});
        resolve_priority(&mut spec, &classes).unwrap();
        assert_eq!(spec["priority"], 1000);
        let mut spec = json!({});
        resolve_priority(&mut spec, &classes).unwrap();
        assert_eq!(spec["priority"], 7);
        assert_eq!(spec["priorityClassName"], "dflt");
        assert_eq!(spec["preemptionPolicy"], "Never");
        let mut spec = json!({"priorityClassName": "system-node-critical"});
        resolve_priority(&mut spec, &[] as &[Value]).unwrap();
        assert_eq!(spec["priority"], 2_000_001_000);
        let mut spec = json!({"priorityClassName": "nope"});
        assert_eq!(
            resolve_priority(&mut spec, &classes).unwrap_err(),
            "no PriorityClass with name nope was found"
        );
        let mut spec = json!({"priorityClassName": "high", "priority": 3});
        assert!(resolve_priority(&mut spec, &classes)
            .unwrap_err()
            .contains("must not be provided in pod spec"));
    }

    #[test]
    fn limit_ranges_default_and_bound_containers() {
        let lr = json!({"spec": {"limits": [{"type": "Container", "max": {"cpu": "1"}, "min": {"cpu": "100m"}, "default": {"memory": "256Mi"}}]}});
        let mut pod = json!({"spec": {"containers": [{"name": "c"}]}});
        let note = apply_limit_range_defaults(&mut pod, std::slice::from_ref(&lr)).unwrap();
        assert_eq!(
            pod["spec"]["containers"][0]["resources"]["limits"]["cpu"],
            "1"
        );
        assert_eq!(
            pod["spec"]["containers"][0]["resources"]["requests"]["memory"],
            "256Mi"
        );
        assert!(note.starts_with("LimitRanger plugin set: "), "{note}");
        validate_limit_ranges(&pod, std::slice::from_ref(&lr)).unwrap();
        let low = json!({"spec": {"containers": [{"name": "c", "resources": {"requests": {"cpu": "50m"}, "limits": {"cpu": "2"}}}]}});
        assert_eq!(
            validate_limit_ranges(&low, std::slice::from_ref(&lr)).unwrap_err(),
            "[minimum cpu usage per Container is 100m, but request is 50m, maximum cpu usage per Container is 1, but limit is 2]"
        );
        let ratio = json!({"spec": {"limits": [{"type": "Container", "maxLimitRequestRatio": {"cpu": "2"}}]}});
        let pod = json!({"spec": {"containers": [{"name": "c", "resources": {"requests": {"cpu": "100m"}, "limits": {"cpu": "500m"}}}]}});
        assert_eq!(
            validate_limit_ranges(&pod, &[ratio]).unwrap_err(),
            "cpu max limit to request ratio per Container is 2, but provided ratio is 5.000000"
        );
    }

    #[test]
    fn quota_usage_and_messages() {
        let pods = lookup("", "v1", "pods").unwrap();
        let pod = json!({"spec": {"containers": [{"name": "a", "resources": {"requests": {"cpu": "500m", "memory": "128Mi"}}}, {"name": "b", "resources": {"requests": {"cpu": "250m"}}}]}});
        let u = usage(pods, &pod);
        assert_eq!(u["pods"], 1000);
        assert_eq!(u["requests.cpu"], 750);
        assert_eq!(u["requests.memory"], 128 * 1024 * 1024 * 1000);
        let hard: Map<String, Value> =
            serde_json::from_value(json!({"pods": "2", "requests.cpu": "1"})).unwrap();
        let used = BTreeMap::from([
            ("pods".to_string(), 1000),
            ("requests.cpu".to_string(), 500),
        ]);
        let err = check_quota("q", &hard, &used, &u).unwrap_err();
        assert_eq!(
            err,
            "exceeded quota: q, requested: requests.cpu=750m, used: requests.cpu=500m, limited: requests.cpu=1"
        );
        assert_eq!(
            pod_quota_constraints(&pod, &["requests.memory".into(), "pods".into()]).unwrap_err(),
            "must specify requests.memory for: b"
        );
        assert_eq!(format_milli(2 * 1024 * 1024 * 1024 * 1000, true), "2Gi");
        assert_eq!(format_milli(1500, false), "1500m");
    }
}
