//! The horizontal pod autoscaler, as kube-controller-manager runs it: every
//! 15 s each HorizontalPodAutoscaler (`autoscaling/v2`) reads its target's
//! scale subresource, the target's pods (by the scale's selector) and their
//! usage from `metrics.k8s.io` (which skiff's API server serves from the
//! agents), proposes a replica count per metric (the largest wins), keeps
//! it steady with the stabilization windows and rate policies of
//! `spec.behavior` (Kubernetes' defaults when absent: scale down to the
//! highest recommendation of the last 5 minutes; scale up by at most
//! max(100%, 4 pods) per 15 s), clamps it to [minReplicas, maxReplicas],
//! writes the scale and reports status and conditions.
//!
//! Resource metrics (`cpu`, `memory`; Utilization or AverageValue) are
//! computed as Kubernetes' replica calculator does: deleted and failed pods
//! are ignored, pending ones (and, for CPU, unready ones) and pods without
//! metrics are set aside, the ratio to the target decides within a 10%
//! tolerance, and the pods set aside are then counted at the value that
//! damps the change. Pods, Object and External metrics need a custom or
//! external metrics API, which skiff does not serve: such a metric is
//! reported as failing and the others decide.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::autoscaling::v2::HorizontalPodAutoscaler;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, ApiResource, DynamicObject, ListParams, Patch, PatchParams};
use kube::core::GroupVersionKind;
use serde_json::{json, Value};

use crate::common;
use crate::controller::Controller;
use crate::framework::{self, Next};
use crate::{Ctx, Error};

const COMPONENT: &str = "horizontal-pod-autoscaler";
/// How often every autoscaler is evaluated (`--horizontal-pod-autoscaler-sync-period`).
const SYNC: Duration = Duration::from_secs(15);
/// A ratio this close to 1 changes nothing.
const TOLERANCE: f64 = 0.1;

/// What the controller remembers per autoscaler between evaluations.
#[derive(Default)]
struct Memory {
    /// Recent recommendations (time, replicas), for the stabilization windows.
    recommendations: HashMap<String, Vec<(Timestamp, i32)>>,
    /// Recent scale changes (time, +added or -removed), for the rate policies.
    events: HashMap<String, Vec<(Timestamp, i32)>>,
}

pub fn register(ctx: &Arc<Ctx>, tasks: &mut tokio::task::JoinSet<()>) {
    let memory = Arc::new(Mutex::new(Memory::default()));
    let controller = Controller::named(ctx, "horizontalpodautoscaling");
    let queue = controller.queue();
    controller.run(tasks, memory, |c, memory, key| async move {
        reconcile(&c, &memory, &key).await
    });
    // Every autoscaler every period: the decision depends on metrics, which
    // change without any object changing.
    let client = ctx.client.clone();
    tasks.spawn(async move {
        let api: Api<HorizontalPodAutoscaler> = Api::all(client);
        loop {
            if let Ok(list) = api.list(&ListParams::default()).await {
                for h in list.items {
                    queue.add(framework::key_of(&h.metadata));
                }
            }
            tokio::time::sleep(SYNC).await;
        }
    });
}

/// How a metric's target is stated.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Target {
    /// Percent of the pods' requests.
    Utilization(i32),
    /// Units (cores, bytes) per pod.
    AverageValue(f64),
}

/// One pod as the replica calculator sees it.
#[derive(Debug, Clone)]
pub struct PodSample {
    /// Deleted or failed: left out entirely.
    pub ignored: bool,
    /// Pending (or, for CPU, not Ready): its usage is not trusted.
    pub unready: bool,
    /// Its usage of the resource, if the metrics API reported it.
    pub usage: Option<f64>,
    /// The sum of its containers' requests (`None`: some container has none).
    pub request: Option<f64>,
}

/// A proposal for one resource metric: (replicas, utilization percent if
/// the target is one, average usage per pod).
pub fn resource_replicas(
    current: i32,
    pods: &[PodSample],
    target: Target,
) -> Result<(i32, Option<i32>, f64), String> {
    let counted: Vec<&PodSample> = pods.iter().filter(|p| !p.ignored).collect();
    if pods.is_empty() {
        return Err("no pods returned by selector while calculating replica count".into());
    }
    if let Target::Utilization(_) = target {
        if counted.iter().any(|p| p.request.is_none()) {
            return Err("missing request for the resource in a container of a pod".into());
        }
    }
    let ready: Vec<&&PodSample> = counted
        .iter()
        .filter(|p| !p.unready && p.usage.is_some())
        .collect();
    let missing = counted.iter().filter(|p| p.usage.is_none()).count();
    let unready: Vec<&&PodSample> = counted
        .iter()
        .filter(|p| p.unready && p.usage.is_some())
        .collect();
    if ready.is_empty() {
        return Err("did not receive metrics for targeted pods (pods might be unready)".into());
    }
    // (usage, request) of the pods that count.
    let mut samples: Vec<(f64, f64)> = ready
        .iter()
        .map(|p| (p.usage.unwrap_or(0.0), p.request.unwrap_or(0.0)))
        .collect();
    let ratio_of = |s: &[(f64, f64)]| -> Result<(f64, Option<i32>, f64), String> {
        let usage: f64 = s.iter().map(|x| x.0).sum();
        let average = usage / s.len() as f64;
        match target {
            Target::Utilization(t) => {
                let requested: f64 = s.iter().map(|x| x.1).sum();
                if requested <= 0.0 {
                    return Err("no metrics returned matched known pods".into());
                }
                let utilization = (usage * 100.0 / requested) as i32;
                Ok((
                    f64::from(utilization) / f64::from(t),
                    Some(utilization),
                    average,
                ))
            }
            Target::AverageValue(v) => Ok((average / v, None, average)),
        }
    };
    let (ratio, utilization, average) = ratio_of(&samples)?;
    let scale_up_with_unready = !unready.is_empty() && ratio > 1.0;
    if !scale_up_with_unready && missing == 0 {
        if (1.0 - ratio).abs() <= TOLERANCE {
            return Ok((current, utilization, average));
        }
        return Ok((
            (ratio * ready.len() as f64).ceil() as i32,
            utilization,
            average,
        ));
    }
    // Damp the change: on a scale down, missing pods count as using all of
    // their request (the target); on a scale up, as using nothing, and so
    // do unready pods.
    let full = |p: &PodSample| match target {
        Target::Utilization(_) => p.request.unwrap_or(0.0),
        Target::AverageValue(v) => v,
    };
    for p in counted.iter().filter(|p| p.usage.is_none()) {
        let request = p.request.unwrap_or(0.0);
        if ratio < 1.0 {
            samples.push((full(p), request));
        } else if ratio > 1.0 {
            samples.push((0.0, request));
        }
    }
    if scale_up_with_unready {
        samples.extend(unready.iter().map(|p| (0.0, p.request.unwrap_or(0.0))));
    }
    let (new_ratio, _, _) = ratio_of(&samples)?;
    if (1.0 - new_ratio).abs() <= TOLERANCE
        || (ratio < 1.0 && new_ratio > 1.0)
        || (ratio > 1.0 && new_ratio < 1.0)
    {
        return Ok((current, utilization, average));
    }
    let proposed = (new_ratio * samples.len() as f64).ceil() as i32;
    if (new_ratio < 1.0 && proposed > current) || (new_ratio > 1.0 && proposed < current) {
        return Ok((current, utilization, average));
    }
    Ok((proposed, utilization, average))
}

/// One direction's rules from `spec.behavior` (or Kubernetes' defaults).
#[derive(Debug, Clone)]
pub struct Rules {
    pub window: i64,
    /// (type, value, periodSeconds).
    pub policies: Vec<(String, i32, i64)>,
    /// Max, Min or Disabled.
    pub select: String,
}

impl Rules {
    pub fn from_spec(spec: Option<&Value>, up: bool) -> Rules {
        let default_policies = if up {
            vec![("Pods".into(), 4, 15), ("Percent".into(), 100, 15)]
        } else {
            vec![("Percent".into(), 100, 15)]
        };
        let window = spec
            .and_then(|s| s.get("stabilizationWindowSeconds"))
            .and_then(Value::as_i64)
            .unwrap_or(if up { 0 } else { 300 });
        let policies = spec
            .and_then(|s| s.get("policies"))
            .and_then(Value::as_array)
            .map(|ps| {
                ps.iter()
                    .map(|p| {
                        (
                            p.get("type").and_then(Value::as_str).unwrap_or("").into(),
                            p.get("value").and_then(Value::as_i64).unwrap_or(0) as i32,
                            p.get("periodSeconds").and_then(Value::as_i64).unwrap_or(15),
                        )
                    })
                    .collect()
            })
            .unwrap_or(default_policies);
        let select = spec
            .and_then(|s| s.get("selectPolicy"))
            .and_then(Value::as_str)
            .unwrap_or("Max")
            .to_string();
        Rules {
            window,
            policies,
            select,
        }
    }
}

/// The stabilized recommendation (and the AbleToScale reason) given the
/// recent ones.
pub fn stabilize(
    current: i32,
    proposed: i32,
    recent: &[(Timestamp, i32)],
    now: Timestamp,
    up: &Rules,
    down: &Rules,
) -> (i32, &'static str, &'static str) {
    let (mut up_rec, mut down_rec) = (proposed, proposed);
    for (at, r) in recent {
        let age = now.duration_since(*at).as_secs();
        if age < up.window {
            up_rec = up_rec.min(*r);
        }
        if age < down.window {
            down_rec = down_rec.max(*r);
        }
    }
    let stabilized = current.max(up_rec).min(down_rec);
    if stabilized == proposed {
        (
            stabilized,
            "ReadyForNewScale",
            "recommended size matches current size",
        )
    } else if stabilized < proposed {
        (
            stabilized,
            "ScaleUpStabilized",
            "recent recommendations were lower than current one, applying the lowest recent recommendation",
        )
    } else {
        (
            stabilized,
            "ScaleDownStabilized",
            "recent recommendations were higher than current one, applying the highest recent recommendation",
        )
    }
}

/// Applies the rate policies and the (min, max) bounds: (replicas, ScalingLimited reason, message).
pub fn limit_rate(
    current: i32,
    desired: i32,
    (min, max): (i32, i32),
    recent_changes: &[(Timestamp, i32)],
    now: Timestamp,
    up: &Rules,
    down: &Rules,
) -> (i32, &'static str, &'static str) {
    // Replicas added / removed within a policy's period.
    let changed = |period: i64, sign: i32| -> i32 {
        recent_changes
            .iter()
            .filter(|(at, d)| now.duration_since(*at).as_secs() < period && d.signum() == sign)
            .map(|(_, d)| d.abs())
            .sum()
    };
    if desired > current {
        let limits: Vec<i32> = up
            .policies
            .iter()
            .map(|(kind, value, period)| {
                let start = current - changed(*period, 1) + changed(*period, -1);
                if kind == "Percent" {
                    (f64::from(start) * (1.0 + f64::from(*value) / 100.0)).ceil() as i32
                } else {
                    start + value
                }
            })
            .collect();
        let mut limit = match up.select.as_str() {
            "Disabled" => current,
            "Min" => limits.iter().copied().min().unwrap_or(current),
            _ => limits.iter().copied().max().unwrap_or(current),
        };
        limit = limit.max(current);
        let (allowed, reason, message) = if max > limit {
            (
                limit,
                "ScaleUpLimit",
                "the desired replica count is increasing faster than the maximum scale rate",
            )
        } else {
            (
                max,
                "TooManyReplicas",
                "the desired replica count is more than the maximum replica count",
            )
        };
        if desired > allowed {
            return (allowed, reason, message);
        }
    } else if desired < current {
        let limits: Vec<i32> = down
            .policies
            .iter()
            .map(|(kind, value, period)| {
                let start = current + changed(*period, -1) - changed(*period, 1);
                if kind == "Percent" {
                    (f64::from(start) * (1.0 - f64::from(*value) / 100.0)) as i32
                } else {
                    start - value
                }
            })
            .collect();
        let mut limit = match down.select.as_str() {
            "Disabled" => current,
            "Min" => limits.iter().copied().max().unwrap_or(current),
            _ => limits.iter().copied().min().unwrap_or(current),
        };
        limit = limit.min(current);
        let (allowed, reason, message) = if min < limit {
            (
                limit,
                "ScaleDownLimit",
                "the desired replica count is decreasing faster than the maximum scale rate",
            )
        } else {
            (
                min,
                "TooFewReplicas",
                "the desired replica count is less than the minimum replica count",
            )
        };
        if desired < allowed {
            return (allowed, reason, message);
        }
    }
    (
        desired,
        "DesiredWithinRange",
        "the desired count is within the acceptable range",
    )
}

/// A quantity (as JSON) in units (cores, bytes).
fn units(q: &Value) -> Option<f64> {
    common::quantity_units(q.as_str()?)
}

/// How a usage prints as a quantity (millicores for CPU, bytes otherwise).
fn format_usage(resource: &str, v: f64) -> String {
    if resource == "cpu" {
        format!("{}m", (v * 1000.0).round() as i64)
    } else {
        format!("{}", v.round() as i64)
    }
}

/// A condition entry, keeping its transition time when the status holds.
fn condition(old: &[Value], kind: &str, status: &str, reason: &str, message: &str) -> Value {
    let since = old
        .iter()
        .find(|c| c.get("type").and_then(Value::as_str) == Some(kind))
        .filter(|c| c.get("status").and_then(Value::as_str) == Some(status))
        .and_then(|c| c.get("lastTransitionTime").cloned())
        .unwrap_or_else(|| json!(common::now().to_string()));
    json!({"type": kind, "status": status, "reason": reason, "message": message,
        "lastTransitionTime": since})
}

async fn reconcile(ctx: &Ctx, memory: &Mutex<Memory>, key: &str) -> Result<Next, Error> {
    let (ns, name) = framework::split_key(key);
    let api: Api<HorizontalPodAutoscaler> = Api::namespaced(ctx.client.clone(), ns);
    let hpa = match api.get(name).await {
        Ok(h) => h,
        Err(e) if common::is_not_found(&e) => {
            let mut m = memory.lock().unwrap_or_else(|e| e.into_inner());
            m.recommendations.remove(key);
            m.events.remove(key);
            return Ok(None);
        }
        Err(e) => return Err(e.into()),
    };
    let raw = serde_json::to_value(&hpa)?;
    let spec = raw.get("spec").cloned().unwrap_or_default();
    let old_conditions: Vec<Value> = raw
        .pointer("/status/conditions")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let min = spec.get("minReplicas").and_then(Value::as_i64).unwrap_or(1) as i32;
    let max = spec.get("maxReplicas").and_then(Value::as_i64).unwrap_or(1) as i32;
    let target_ref = spec.get("scaleTargetRef").cloned().unwrap_or_default();
    let target_kind = target_ref.get("kind").and_then(Value::as_str).unwrap_or("");
    let target_name = target_ref.get("name").and_then(Value::as_str).unwrap_or("");
    let api_version = target_ref
        .get("apiVersion")
        .and_then(Value::as_str)
        .unwrap_or("");
    let reference = format!("{target_kind}/{target_name}");

    let mut conditions: Vec<Value> = Vec::new();
    let report = |conditions: Vec<Value>, extra: Value| {
        let api = api.clone();
        let mut status = json!({"conditions": conditions,
            "observedGeneration": hpa.metadata.generation});
        if let (Some(s), Some(e)) = (status.as_object_mut(), extra.as_object()) {
            s.extend(e.clone());
        }
        async move { common::patch_status(&api, name, status).await }
    };

    // The target's scale subresource.
    let (group, version) = match api_version.rsplit_once('/') {
        Some((g, v)) => (g, v),
        None => ("", api_version),
    };
    let gvk = GroupVersionKind::gvk(group, version, target_kind);
    let scale = match kube::discovery::pinned_kind(&ctx.client, &gvk).await {
        Ok((ar, _)) => {
            let targets: Api<DynamicObject> = Api::namespaced_with(ctx.client.clone(), ns, &ar);
            targets.get_scale(target_name).await.map(|s| (targets, s))
        }
        Err(e) => Err(e),
    };
    let (targets, scale) = match scale {
        Ok(x) => x,
        Err(e) => {
            let message =
                format!("the HPA controller was unable to get the target's current scale: {e}");
            ctx.events
                .warning(COMPONENT, &hpa, "FailedGetScale", message.clone());
            conditions.push(condition(
                &old_conditions,
                "AbleToScale",
                "False",
                "FailedGetScale",
                &message,
            ));
            report(conditions, json!({})).await?;
            return Ok(None);
        }
    };
    let current = scale.spec.as_ref().and_then(|s| s.replicas).unwrap_or(0);
    let selector = scale
        .status
        .as_ref()
        .and_then(|s| s.selector.clone())
        .unwrap_or_default();

    let mut metric_statuses: Vec<Value> = Vec::new();
    let mut reason_text = String::new();
    let (desired, rescale) = if current == 0 && min != 0 {
        conditions.push(condition(
            &old_conditions,
            "ScalingActive",
            "False",
            "ScalingDisabled",
            "scaling is disabled since the replica count of the target is zero",
        ));
        (0, false)
    } else if current > max {
        reason_text = "Current number of replicas above Spec.MaxReplicas".into();
        (max, true)
    } else if current < min {
        reason_text = "Current number of replicas below Spec.MinReplicas".into();
        (min, true)
    } else {
        let proposal = propose(ctx, &hpa, ns, &spec, &selector, current).await;
        metric_statuses = proposal.statuses;
        let Some((proposed, metric)) = proposal.best else {
            let (reason, message) = proposal
                .failure
                .unwrap_or(("FailedGetResourceMetric", "no metrics".into()));
            conditions.push(condition(
                &old_conditions,
                "AbleToScale",
                "True",
                "SucceededGetScale",
                "the HPA controller was able to get the target's current scale",
            ));
            conditions.push(condition(
                &old_conditions,
                "ScalingActive",
                "False",
                reason,
                &message,
            ));
            report(
                conditions,
                json!({"currentReplicas": current, "desiredReplicas": current,
                "currentMetrics": metric_statuses}),
            )
            .await?;
            return Ok(None);
        };
        conditions.push(condition(
            &old_conditions,
            "ScalingActive",
            "True",
            "ValidMetricFound",
            &format!("the HPA was able to successfully calculate a replica count from {metric}"),
        ));
        let now = common::now();
        let behavior = spec.get("behavior");
        let up = Rules::from_spec(behavior.and_then(|b| b.get("scaleUp")), true);
        let down = Rules::from_spec(behavior.and_then(|b| b.get("scaleDown")), false);
        let (stabilized, changes) = {
            let mut m = memory.lock().unwrap_or_else(|e| e.into_inner());
            let recs = m.recommendations.entry(key.to_string()).or_insert_with(|| {
                // A new autoscaler (or controller) does not scale down at once.
                if down.window > 0 {
                    vec![(now, current)]
                } else {
                    vec![]
                }
            });
            let keep = up.window.max(down.window);
            recs.retain(|(at, _)| now.duration_since(*at).as_secs() < keep);
            let (stabilized, reason, message) = stabilize(current, proposed, recs, now, &up, &down);
            recs.push((now, proposed));
            conditions.insert(
                0,
                condition(&old_conditions, "AbleToScale", "True", reason, message),
            );
            let events = m.events.entry(key.to_string()).or_default();
            events.retain(|(at, _)| now.duration_since(*at).as_secs() < 1800);
            (stabilized, events.clone())
        };
        let (limited, reason, message) =
            limit_rate(current, stabilized, (min, max), &changes, now, &up, &down);
        conditions.push(condition(
            &old_conditions,
            "ScalingLimited",
            if limited == stabilized {
                "False"
            } else {
                "True"
            },
            reason,
            message,
        ));
        reason_text = if limited > current {
            format!("{metric} above target")
        } else {
            "All metrics below target".into()
        };
        (limited, limited != current)
    };
    if !conditions.iter().any(|c| c["type"] == "AbleToScale") {
        conditions.insert(
            0,
            condition(
                &old_conditions,
                "AbleToScale",
                "True",
                "SucceededGetScale",
                "the HPA controller was able to get the target's current scale",
            ),
        );
    }
    let mut extra = json!({"currentReplicas": current, "desiredReplicas": desired,
        "currentMetrics": metric_statuses});
    if rescale {
        let patch = json!({"spec": {"replicas": desired}});
        if let Err(e) = targets
            .patch_scale(target_name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            let message = format!("the HPA controller was unable to update the target scale: {e}");
            ctx.events
                .warning(COMPONENT, &hpa, "FailedRescale", message.clone());
            conditions.retain(|c| c["type"] != "AbleToScale");
            conditions.insert(
                0,
                condition(
                    &old_conditions,
                    "AbleToScale",
                    "False",
                    "FailedUpdateScale",
                    &message,
                ),
            );
            report(conditions, extra).await?;
            return Ok(None);
        }
        ctx.events.normal(
            COMPONENT,
            &hpa,
            "SuccessfulRescale",
            format!("New size: {desired}; reason: {reason_text}"),
        );
        let now = common::now();
        memory
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .events
            .entry(key.to_string())
            .or_default()
            .push((now, desired - current));
        extra["lastScaleTime"] = json!(now.to_string());
        tracing::info!(hpa = key, target = %reference, from = current, to = desired, "rescaled");
    }
    report(conditions, extra).await?;
    Ok(None)
}

/// What the metrics propose.
struct Proposal {
    /// The largest proposal and the metric's description.
    best: Option<(i32, String)>,
    statuses: Vec<Value>,
    /// Why no metric could be used: (reason, message).
    failure: Option<(&'static str, String)>,
}

async fn propose(
    ctx: &Ctx,
    hpa: &HorizontalPodAutoscaler,
    ns: &str,
    spec: &Value,
    selector: &str,
    current: i32,
) -> Proposal {
    let mut out = Proposal {
        best: None,
        statuses: vec![],
        failure: None,
    };
    let parsed = match skiff_core::selector::LabelSelector::parse(selector) {
        Ok(s) if !selector.trim().is_empty() => s,
        _ => {
            out.failure = Some((
                "InvalidSelector",
                "the HPA target's scale is missing a selector".into(),
            ));
            return out;
        }
    };
    // Kubernetes' default: 80% CPU when no metric is given.
    let metrics = match spec.get("metrics").and_then(Value::as_array) {
        Some(m) if !m.is_empty() => m.clone(),
        _ => vec![json!({"type": "Resource", "resource": {"name": "cpu",
            "target": {"type": "Utilization", "averageUtilization": 80}}})],
    };
    let pods: Vec<Arc<Pod>> = ctx
        .caches
        .pods
        .in_namespace(ns)
        .into_iter()
        .filter(|p| {
            let labels: serde_json::Map<String, Value> = p
                .metadata
                .labels
                .iter()
                .flatten()
                .map(|(k, v)| (k.clone(), json!(v)))
                .collect();
            parsed.matches(&labels)
        })
        .collect();
    let usage = pod_usage(ctx, ns, selector).await;
    for m in &metrics {
        let kind = m.get("type").and_then(Value::as_str).unwrap_or("");
        if kind != "Resource" {
            let message = format!(
                "the HPA was unable to compute the replica count: unable to get {} metric: no custom or external metrics API is served",
                kind.to_lowercase()
            );
            ctx.events.warning(
                COMPONENT,
                hpa,
                &format!("FailedGet{kind}Metric"),
                message.clone(),
            );
            out.failure = Some(("FailedGetExternalMetric", message));
            continue;
        }
        let res = m
            .pointer("/resource/name")
            .and_then(Value::as_str)
            .unwrap_or("cpu");
        let target = match (
            m.pointer("/resource/target/averageUtilization")
                .and_then(Value::as_i64),
            m.pointer("/resource/target/averageValue").and_then(units),
        ) {
            (Some(u), _) => Target::Utilization(u as i32),
            (None, Some(v)) if v > 0.0 => Target::AverageValue(v),
            _ => continue,
        };
        let usage = match &usage {
            Ok(u) => u,
            Err(e) => {
                let message = format!("the HPA was unable to compute the replica count: unable to get metrics for resource {res}: {e}");
                ctx.events
                    .warning(COMPONENT, hpa, "FailedGetResourceMetric", message.clone());
                out.failure = Some(("FailedGetResourceMetric", message));
                continue;
            }
        };
        let samples: Vec<PodSample> = pods
            .iter()
            .map(|p| sample(p, res, usage.get(p.metadata.name.as_deref().unwrap_or(""))))
            .collect();
        match resource_replicas(current, &samples, target) {
            Ok((replicas, utilization, average)) => {
                let mut cur = json!({"averageValue": format_usage(res, average)});
                if let Some(u) = utilization {
                    cur["averageUtilization"] = json!(u);
                }
                out.statuses
                    .push(json!({"type": "Resource", "resource": {"name": res, "current": cur}}));
                let description = match target {
                    Target::Utilization(_) => {
                        format!("{res} resource utilization (percentage of request)")
                    }
                    Target::AverageValue(_) => format!("{res} resource"),
                };
                if out.best.as_ref().is_none_or(|(b, _)| replicas > *b) {
                    out.best = Some((replicas, description));
                }
            }
            Err(e) => {
                let message = format!("the HPA was unable to compute the replica count: failed to get {res} utilization: {e}");
                ctx.events
                    .warning(COMPONENT, hpa, "FailedGetResourceMetric", message.clone());
                out.failure = Some(("FailedGetResourceMetric", message));
            }
        }
    }
    out
}

/// A pod's sample for `res`.
fn sample(p: &Pod, res: &str, usage: Option<&HashMap<String, f64>>) -> PodSample {
    let phase = common::phase(p);
    let ignored = p.metadata.deletion_timestamp.is_some() || phase == "Failed";
    let unready = phase == "Pending" || (res == "cpu" && !common::pod_ready(p));
    let request = p.spec.as_ref().and_then(|s| {
        s.containers.iter().try_fold(0.0, |sum, c| {
            let q = c.resources.as_ref()?.requests.as_ref()?.get(res)?;
            Some(sum + common::quantity_units(&q.0)?)
        })
    });
    PodSample {
        ignored,
        unready,
        usage: usage.and_then(|u| u.get(res).copied()),
        request,
    }
}

/// Each pod's usage per resource (summed over its containers), from
/// `metrics.k8s.io`.
async fn pod_usage(
    ctx: &Ctx,
    ns: &str,
    selector: &str,
) -> Result<HashMap<String, HashMap<String, f64>>, String> {
    let ar = ApiResource {
        group: "metrics.k8s.io".into(),
        version: "v1beta1".into(),
        api_version: "metrics.k8s.io/v1beta1".into(),
        kind: "PodMetrics".into(),
        plural: "pods".into(),
    };
    let api: Api<DynamicObject> = Api::namespaced_with(ctx.client.clone(), ns, &ar);
    let list = api
        .list(&ListParams::default().labels(selector))
        .await
        .map_err(|e| e.to_string())?;
    let mut out = HashMap::new();
    for m in list.items {
        let mut sums: HashMap<String, f64> = HashMap::new();
        for c in m.data["containers"].as_array().into_iter().flatten() {
            for (res, q) in c["usage"].as_object().into_iter().flatten() {
                if let Some(v) = units(q) {
                    *sums.entry(res.clone()).or_default() += v;
                }
            }
        }
        out.insert(m.metadata.name.unwrap_or_default(), sums);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(usage: Option<f64>, request: f64) -> PodSample {
        PodSample {
            ignored: false,
            unready: false,
            usage,
            request: Some(request),
        }
    }

    #[test]
    fn utilization_above_target_scales_up_by_the_ratio() {
        // 3 pods at 90% of 0.5 cores against a 50% target: 3 * 1.8 = 5.4 -> 6.
        let pods = vec![pod(Some(0.45), 0.5); 3];
        let (replicas, utilization, average) =
            resource_replicas(3, &pods, Target::Utilization(50)).unwrap();
        assert_eq!((replicas, utilization), (6, Some(90)));
        assert!((average - 0.45).abs() < 1e-9);
    }

    #[test]
    fn within_the_tolerance_nothing_changes() {
        let pods = vec![pod(Some(0.27), 0.5); 4]; // 54% against 50%
        assert_eq!(
            resource_replicas(4, &pods, Target::Utilization(50))
                .unwrap()
                .0,
            4
        );
    }

    #[test]
    fn missing_and_unready_pods_damp_the_change() {
        // Scale down: the missing pod counts at 100% of its request, so
        // 2 pods at 10% plus one at 100% = 40% against 50% -> ceil(0.8 * 3) = 3.
        let down = vec![pod(Some(0.05), 0.5), pod(Some(0.05), 0.5), pod(None, 0.5)];
        assert_eq!(
            resource_replicas(3, &down, Target::Utilization(50))
                .unwrap()
                .0,
            3
        );
        // Scale up: an unready pod counts as idle: 2 at 100% + 1 at 0% =
        // 66% against 50% -> ceil(1.33 * 3) = 4 (instead of 4 from 2 pods at 200%).
        let mut up = vec![
            pod(Some(0.5), 0.5),
            pod(Some(0.5), 0.5),
            pod(Some(0.5), 0.5),
        ];
        up[2].unready = true;
        assert_eq!(
            resource_replicas(3, &up, Target::Utilization(50))
                .unwrap()
                .0,
            4
        );
    }

    #[test]
    fn a_pod_without_a_request_cannot_be_measured_by_utilization() {
        let mut pods = vec![pod(Some(0.1), 0.5)];
        pods[0].request = None;
        assert!(resource_replicas(1, &pods, Target::Utilization(50)).is_err());
        // An average value needs no request: 0.1 per pod against 0.05 -> 2.
        assert_eq!(
            resource_replicas(1, &pods, Target::AverageValue(0.05))
                .unwrap()
                .0,
            2
        );
    }

    #[test]
    fn scale_down_waits_for_the_highest_recent_recommendation() {
        let now = common::now();
        let up = Rules::from_spec(None, true);
        let down = Rules::from_spec(None, false);
        let recent = [(common::plus(now, -200), 8), (common::plus(now, -400), 10)];
        // 10 is older than the 300 s window; 8 is not.
        let (r, reason, _) = stabilize(8, 3, &recent, now, &up, &down);
        assert_eq!((r, reason), (8, "ScaleDownStabilized"));
        let (r, reason, _) = stabilize(8, 12, &recent, now, &up, &down);
        assert_eq!((r, reason), (12, "ReadyForNewScale"));
    }

    #[test]
    fn scale_up_is_limited_to_the_larger_of_double_and_four_more() {
        let now = common::now();
        let up = Rules::from_spec(None, true);
        let down = Rules::from_spec(None, false);
        assert_eq!(
            limit_rate(1, 50, (1, 100), &[], now, &up, &down),
            (
                5,
                "ScaleUpLimit",
                "the desired replica count is increasing faster than the maximum scale rate"
            )
        );
        assert_eq!(limit_rate(10, 50, (1, 100), &[], now, &up, &down).0, 20);
        assert_eq!(
            limit_rate(10, 50, (1, 15), &[], now, &up, &down).1,
            "TooManyReplicas"
        );
        // Replicas added within the period count against it.
        let recent = [(common::plus(now, -5), 4)];
        assert_eq!(limit_rate(5, 50, (1, 100), &recent, now, &up, &down).0, 5);
        assert_eq!(
            limit_rate(5, 2, (1, 100), &[], now, &up, &down),
            (
                2,
                "DesiredWithinRange",
                "the desired count is within the acceptable range"
            )
        );
        assert_eq!(
            limit_rate(5, 0, (2, 100), &[], now, &up, &down).1,
            "TooFewReplicas"
        );
    }
}
