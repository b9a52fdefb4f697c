//! Webhook configurations as the dispatcher uses them: read from the watch
//! cache and parsed once per object version (kept by uid and
//! resourceVersion), in order of configuration name then webhook order.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use serde_json::Value;
use skiff_core::selector::LabelSelector;

use super::rules::{self, Rule};
use crate::admission::context::AdmissionCtx;
use crate::outbound::ClientConfig;
use crate::watchcache::Filter;

/// One webhook of a configuration.
#[derive(Debug)]
pub struct Webhook {
    /// The configuration's name.
    pub configuration: String,
    pub name: String,
    /// The client config, or why it is unusable (a call failure).
    pub client: Result<ClientConfig, String>,
    pub rules: Vec<Rule>,
    /// failurePolicy Fail (the default) rather than Ignore.
    pub fail: bool,
    /// matchPolicy Equivalent (the default) rather than Exact.
    pub equivalent: bool,
    pub namespace_selector: Result<Option<LabelSelector>, String>,
    pub object_selector: Result<Option<LabelSelector>, String>,
    /// sideEffects None or NoneOnDryRun: the webhook may see dry runs.
    pub dry_run_safe: bool,
    pub timeout: Duration,
    /// The AdmissionReview version sent: v1 when the webhook accepts it.
    pub review_version: &'static str,
    /// reinvocationPolicy IfNeeded.
    pub reinvoke: bool,
    /// Each matchCondition: its name and compiled expression (or why it
    /// does not compile, a failure for failurePolicy).
    pub match_conditions: Vec<super::rules::MatchCondition>,
}

impl Webhook {
    pub fn from_json(configuration: &str, h: &Value) -> Webhook {
        let s = |k: &str| h.get(k).and_then(Value::as_str).unwrap_or("");
        let versions: Vec<&str> = h
            .get("admissionReviewVersions")
            .and_then(Value::as_array)
            .map(|a| a.iter().filter_map(Value::as_str).collect())
            .unwrap_or_default();
        let timeout = h
            .get("timeoutSeconds")
            .and_then(Value::as_u64)
            .unwrap_or(10)
            .clamp(1, 30);
        Webhook {
            configuration: configuration.to_string(),
            name: s("name").to_string(),
            client: h
                .get("clientConfig")
                .ok_or_else(|| "no clientConfig".to_string())
                .and_then(|c| ClientConfig::from_json(c).map_err(|e| e.to_string())),
            rules: h
                .get("rules")
                .and_then(Value::as_array)
                .map(|a| a.iter().map(Rule::from_json).collect())
                .unwrap_or_default(),
            fail: s("failurePolicy") != "Ignore",
            equivalent: s("matchPolicy") != "Exact",
            namespace_selector: rules::selector(h.get("namespaceSelector")),
            object_selector: rules::selector(h.get("objectSelector")),
            dry_run_safe: matches!(s("sideEffects"), "None" | "NoneOnDryRun"),
            timeout: Duration::from_secs(timeout),
            review_version: if versions.contains(&"v1") || versions.is_empty() {
                "v1"
            } else {
                "v1beta1"
            },
            reinvoke: s("reinvocationPolicy") == "IfNeeded",
            match_conditions: super::rules::match_conditions(h.get("matchConditions")),
        }
    }
}

type Parsed = Arc<Vec<Arc<Webhook>>>;

fn parsed_cache() -> &'static Mutex<HashMap<(String, i64), Parsed>> {
    static CACHE: OnceLock<Mutex<HashMap<(String, i64), Parsed>>> = OnceLock::new();
    CACHE.get_or_init(Default::default)
}

/// The webhooks of every configuration of one kind (`mutating` or not), in
/// order of configuration name then webhook order.
pub fn webhooks(cx: &dyn AdmissionCtx, mutating: bool) -> Vec<Arc<Webhook>> {
    let plural = if mutating {
        "mutatingwebhookconfigurations"
    } else {
        "validatingwebhookconfigurations"
    };
    let res = skiff_core::resources::lookup("admissionregistration.k8s.io", "v1", plural)
        .expect("webhook configurations are served");
    // Keys are the names here (cluster-scoped), so this is name order.
    let objects = cx.cache().resource(res).snapshot(&Filter::default());
    let mut out = Vec::new();
    for o in objects {
        let Some(v) = o.value() else { continue };
        let uid = v
            .pointer("/metadata/uid")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string();
        let key = (uid, o.revision);
        let cached = parsed_cache()
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&key)
            .cloned();
        let hooks = match cached {
            Some(h) => h,
            None => {
                let hooks: Parsed = Arc::new(
                    v.get("webhooks")
                        .and_then(Value::as_array)
                        .map(|a| {
                            a.iter()
                                .map(|h| Arc::new(Webhook::from_json(&o.name, h)))
                                .collect()
                        })
                        .unwrap_or_default(),
                );
                let mut cache = parsed_cache().lock().unwrap_or_else(|e| e.into_inner());
                if cache.len() > 1024 {
                    cache.clear();
                }
                cache.insert(key, hooks.clone());
                hooks
            }
        };
        out.extend(hooks.iter().cloned());
    }
    out
}
