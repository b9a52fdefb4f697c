//! What the controllers share: label selector matching, owner references,
//! pod readiness, a cache of the cluster's objects fed by watches,
//! expectations (what a controller has asked for and not yet seen), events,
//! and per-controller metrics.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta, OwnerReference};
use serde_json::json;

/// Whether `labels` satisfy a LabelSelector (an empty selector matches
/// everything, as Kubernetes' LabelSelectorAsSelector does).
pub fn selector_matches(sel: &LabelSelector, labels: &BTreeMap<String, String>) -> bool {
    for (k, v) in sel.match_labels.iter().flatten() {
        if labels.get(k) != Some(v) {
            return false;
        }
    }
    for e in sel.match_expressions.iter().flatten() {
        let have = labels.get(&e.key);
        let values = e.values.clone().unwrap_or_default();
        let ok = match e.operator.as_str() {
            "In" => have.map(|v| values.contains(v)).unwrap_or(false),
            "NotIn" => have.map(|v| !values.contains(v)).unwrap_or(true),
            "Exists" => have.is_some(),
            "DoesNotExist" => have.is_none(),
            _ => false,
        };
        if !ok {
            return false;
        }
    }
    true
}

/// Whether a selector is empty (selects everything).
pub fn selector_is_empty(sel: &LabelSelector) -> bool {
    sel.match_labels
        .as_ref()
        .map(|m| m.is_empty())
        .unwrap_or(true)
        && sel
            .match_expressions
            .as_ref()
            .map(|m| m.is_empty())
            .unwrap_or(true)
}

/// The controller owner reference of an object, if any.
pub fn controller_of(meta: &ObjectMeta) -> Option<&OwnerReference> {
    meta.owner_references
        .iter()
        .flatten()
        .find(|r| r.controller == Some(true))
}

/// An owner reference naming `owner` as the controller.
pub fn controller_ref(api_version: &str, kind: &str, owner: &ObjectMeta) -> OwnerReference {
    OwnerReference {
        api_version: api_version.to_string(),
        kind: kind.to_string(),
        name: owner.name.clone().unwrap_or_default(),
        uid: owner.uid.clone().unwrap_or_default(),
        controller: Some(true),
        block_owner_deletion: Some(true),
    }
}

pub fn is_terminating(meta: &ObjectMeta) -> bool {
    meta.deletion_timestamp.is_some()
}

pub fn pod_is_active(p: &Pod) -> bool {
    let phase = p
        .status
        .as_ref()
        .and_then(|s| s.phase.as_deref())
        .unwrap_or("");
    phase != "Succeeded" && phase != "Failed" && !is_terminating(&p.metadata)
}

/// The time since which a pod has been Ready, if it is.
pub fn ready_since(p: &Pod) -> Option<k8s_openapi::jiff::Timestamp> {
    let c = p
        .status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == "Ready")?;
    if c.status != "True" {
        return None;
    }
    Some(
        c.last_transition_time
            .as_ref()
            .map(|t| t.0)
            .unwrap_or(k8s_openapi::jiff::Timestamp::UNIX_EPOCH),
    )
}

pub fn pod_ready(p: &Pod) -> bool {
    ready_since(p).is_some()
}

/// Ready for at least `min_ready_seconds`.
pub fn pod_available(p: &Pod, min_ready_seconds: i32, now: k8s_openapi::jiff::Timestamp) -> bool {
    match ready_since(p) {
        None => false,
        Some(_) if min_ready_seconds <= 0 => true,
        Some(t) => {
            t + k8s_openapi::jiff::SignedDuration::from_secs(min_ready_seconds as i64) <= now
        }
    }
}

/// What a controller asked the API for and has not yet seen in its cache,
/// so a second reconcile does not create or delete the same pods again.
/// Entries expire (a lost watch event must not block a controller forever).
#[derive(Default)]
pub struct Expectations {
    inner: Mutex<HashMap<String, Pending>>,
}

struct Pending {
    adds: HashSet<String>,
    deletes: HashSet<String>,
    since: Instant,
}

const EXPECTATION_TTL: Duration = Duration::from_secs(30);

impl Expectations {
    pub fn expect_add(&self, key: &str, name: &str) {
        let mut m = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        let p = m.entry(key.to_string()).or_insert_with(|| Pending {
            adds: HashSet::new(),
            deletes: HashSet::new(),
            since: Instant::now(),
        });
        p.adds.insert(name.to_string());
        p.since = Instant::now();
    }
    pub fn expect_delete(&self, key: &str, name: &str) {
        let mut m = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        let p = m.entry(key.to_string()).or_insert_with(|| Pending {
            adds: HashSet::new(),
            deletes: HashSet::new(),
            since: Instant::now(),
        });
        p.deletes.insert(name.to_string());
        p.since = Instant::now();
    }
    /// Whether everything expected for `key` is visible (`present` tells
    /// whether a name is in the cache now).
    pub fn satisfied(&self, key: &str, present: impl Fn(&str) -> bool) -> bool {
        let mut m = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        let Some(p) = m.get_mut(key) else {
            return true;
        };
        p.adds.retain(|n| !present(n));
        p.deletes.retain(|n| present(n));
        if (p.adds.is_empty() && p.deletes.is_empty()) || p.since.elapsed() > EXPECTATION_TTL {
            m.remove(key);
            return true;
        }
        false
    }
    pub fn forget(&self, key: &str) {
        self.inner
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(key);
    }
}

/// Per-controller counters, shown by [`crate::metrics_text`].
#[derive(Default)]
pub struct Metrics {
    inner: Mutex<BTreeMap<String, Counters>>,
}

#[derive(Default, Clone)]
struct Counters {
    reconciles: u64,
    errors: u64,
    seconds: f64,
    queue: i64,
}

impl Metrics {
    pub fn record(&self, controller: &str, ok: bool, took: Duration) {
        let mut m = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        let c = m.entry(controller.to_string()).or_default();
        c.reconciles += 1;
        if !ok {
            c.errors += 1;
        }
        c.seconds += took.as_secs_f64();
    }
    pub fn queue_depth(&self, controller: &str, depth: i64) {
        let mut m = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        m.entry(controller.to_string()).or_default().queue = depth;
    }
    pub fn text(&self) -> String {
        let m = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        let mut out = String::new();
        out.push_str("# HELP skiff_controller_reconciles_total Reconciles run, per controller.\n# TYPE skiff_controller_reconciles_total counter\n");
        for (k, c) in m.iter() {
            out.push_str(&format!(
                "skiff_controller_reconciles_total{{controller=\"{k}\"}} {}\n",
                c.reconciles
            ));
        }
        out.push_str("# HELP skiff_controller_reconcile_errors_total Reconciles that failed.\n# TYPE skiff_controller_reconcile_errors_total counter\n");
        for (k, c) in m.iter() {
            out.push_str(&format!(
                "skiff_controller_reconcile_errors_total{{controller=\"{k}\"}} {}\n",
                c.errors
            ));
        }
        out.push_str("# HELP skiff_controller_reconcile_seconds_total Time spent reconciling.\n# TYPE skiff_controller_reconcile_seconds_total counter\n");
        for (k, c) in m.iter() {
            out.push_str(&format!(
                "skiff_controller_reconcile_seconds_total{{controller=\"{k}\"}} {:.6}\n",
                c.seconds
            ));
        }
        out.push_str("# HELP skiff_controller_queue_depth Objects waiting to be reconciled.\n# TYPE skiff_controller_queue_depth gauge\n");
        for (k, c) in m.iter() {
            out.push_str(&format!(
                "skiff_controller_queue_depth{{controller=\"{k}\"}} {}\n",
                c.queue
            ));
        }
        out
    }
}

/// Records a core/v1 Event about an object, in the background.
pub fn event(
    client: &kube::Client,
    component: &str,
    involved: serde_json::Value,
    namespace: &str,
    type_: &str,
    reason: &str,
    message: String,
) {
    let client = client.clone();
    let ns = namespace.to_string();
    let now = k8s_openapi::jiff::Timestamp::now().to_string();
    let name = involved["name"].as_str().unwrap_or("object").to_string();
    let ev = json!({
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"generateName": format!("{name}."), "namespace": ns},
        "involvedObject": involved,
        "reason": reason,
        "message": message,
        "type": type_,
        "source": {"component": component},
        "reportingComponent": component,
        "firstTimestamp": now,
        "lastTimestamp": now,
        "count": 1,
    });
    tokio::spawn(async move {
        let api: kube::Api<k8s_openapi::api::core::v1::Event> = kube::Api::namespaced(client, &ns);
        if let Ok(ev) = serde_json::from_value(ev) {
            let _ = api.create(&Default::default(), &ev).await;
        }
    });
}

/// A shared handle to a controller's context.
pub type Shared<T> = Arc<T>;

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelectorRequirement;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn selectors_match_labels_and_expressions_like_kubernetes() {
        let sel = LabelSelector {
            match_labels: Some(labels(&[("app", "web")])),
            match_expressions: Some(vec![LabelSelectorRequirement {
                key: "tier".into(),
                operator: "NotIn".into(),
                values: Some(vec!["db".into()]),
            }]),
        };
        assert!(selector_matches(&sel, &labels(&[("app", "web")])));
        assert!(selector_matches(
            &sel,
            &labels(&[("app", "web"), ("tier", "front")])
        ));
        assert!(!selector_matches(
            &sel,
            &labels(&[("app", "web"), ("tier", "db")])
        ));
        assert!(!selector_matches(&sel, &labels(&[("app", "api")])));
        assert!(selector_matches(&LabelSelector::default(), &labels(&[])));
    }

    #[test]
    fn expectations_hold_until_the_cache_shows_the_change_or_they_expire() {
        let e = Expectations::default();
        e.expect_add("ns/rs", "rs-abc");
        assert!(!e.satisfied("ns/rs", |_| false));
        assert!(e.satisfied("ns/rs", |n| n == "rs-abc"));
        e.expect_delete("ns/rs", "rs-old");
        assert!(!e.satisfied("ns/rs", |n| n == "rs-old"));
        assert!(e.satisfied("ns/rs", |_| false));
    }
}
