//! The admission plugins of pods that read other objects or set policy
//! defaults: LimitRanger (a namespace's LimitRanges default and bound
//! containers' resources), Priority (a pod's priority from its
//! PriorityClass; one default PriorityClass at most) and
//! DefaultTolerationSeconds. The decisions are in `skiff_core::admission`.

use async_trait::async_trait;
use serde_json::{json, Value};
use skiff_core::admission as core;
use skiff_core::resources::{self, ResourceInfo};
use skiff_core::ApiResult;

use super::context::AdmissionCtx;
use super::plugin::{forbidden, AdmissionPlugin, Attributes};
use crate::object::{meta_str, metadata_mut};

fn lookup(group: &str, version: &str, plural: &str) -> &'static ResourceInfo {
    resources::lookup(group, version, plural).expect("built-in resource")
}

/// The spec of a pod, when it has one to admit.
fn spec_mut(obj: &mut Value) -> Option<&mut Value> {
    obj.get_mut("spec").filter(|s| s.is_object())
}

/// LimitRanger: defaults from the namespace's LimitRanges (noted in the
/// `kubernetes.io/limit-ranger` annotation) in the mutating phase, their
/// bounds checked in the validating phase.
pub struct LimitRanger;

#[async_trait]
impl AdmissionPlugin for LimitRanger {
    fn name(&self) -> &'static str {
        "LimitRanger"
    }

    fn handles(&self, a: &Attributes<'_>) -> bool {
        a.creates("", "pods")
    }

    async fn mutate(
        &self,
        cx: &dyn AdmissionCtx,
        a: &Attributes<'_>,
        obj: &mut Value,
    ) -> ApiResult<()> {
        if spec_mut(obj).is_none() {
            return Ok(());
        }
        let ranges = cx
            .consistent_list(lookup("", "v1", "limitranges"), a.namespace, true)
            .await?;
        if let Some(note) = core::apply_limit_range_defaults(obj, &ranges) {
            let m = metadata_mut(obj);
            let ann = m.entry("annotations").or_insert_with(|| json!({}));
            if let Some(a) = ann.as_object_mut() {
                a.insert("kubernetes.io/limit-ranger".into(), json!(note));
            }
        }
        Ok(())
    }

    async fn validate(
        &self,
        cx: &dyn AdmissionCtx,
        a: &Attributes<'_>,
        obj: Option<&Value>,
    ) -> ApiResult<()> {
        let Some(obj) = obj.filter(|o| o.get("spec").is_some_and(Value::is_object)) else {
            return Ok(());
        };
        let ranges = cx
            .consistent_list(lookup("", "v1", "limitranges"), a.namespace, true)
            .await?;
        if ranges.is_empty() {
            return Ok(());
        }
        core::validate_limit_ranges(obj, &ranges)
            .map_err(|m| forbidden(a.res, meta_str(obj, "name"), &m))
    }
}

/// Priority: a new pod's `priority` (and preemption policy) from its
/// PriorityClass, or the default class; a new PriorityClass may be the
/// global default only if no other is.
pub struct Priority;

#[async_trait]
impl AdmissionPlugin for Priority {
    fn name(&self) -> &'static str {
        "Priority"
    }

    fn handles(&self, a: &Attributes<'_>) -> bool {
        a.creates("", "pods") || a.creates("scheduling.k8s.io", "priorityclasses")
    }

    async fn mutate(
        &self,
        cx: &dyn AdmissionCtx,
        a: &Attributes<'_>,
        obj: &mut Value,
    ) -> ApiResult<()> {
        if a.res.plural != "pods" {
            return Ok(());
        }
        let name = meta_str(obj, "name").to_string();
        let Some(spec) = spec_mut(obj) else {
            return Ok(());
        };
        let classes = cx
            .consistent_list(
                lookup("scheduling.k8s.io", "v1", "priorityclasses"),
                None,
                true,
            )
            .await?;
        core::resolve_priority(spec, &classes).map_err(|m| forbidden(a.res, &name, &m))
    }

    async fn validate(
        &self,
        cx: &dyn AdmissionCtx,
        a: &Attributes<'_>,
        obj: Option<&Value>,
    ) -> ApiResult<()> {
        let Some(obj) = obj.filter(|_| a.res.plural == "priorityclasses") else {
            return Ok(());
        };
        if obj.get("globalDefault").and_then(Value::as_bool) != Some(true) {
            return Ok(());
        }
        let name = meta_str(obj, "name");
        let classes = cx.consistent_list(a.res, None, true).await?;
        if let Some(other) = classes.iter().find(|c| {
            c.get("globalDefault").and_then(Value::as_bool) == Some(true)
                && meta_str(c, "name") != name
        }) {
            return Err(forbidden(
                a.res,
                name,
                &format!(
                    "PriorityClass {} is already marked as default. Only one default can exist",
                    meta_str(other, "name")
                ),
            ));
        }
        Ok(())
    }
}

/// DefaultTolerationSeconds: a new pod tolerates `not-ready` and
/// `unreachable` for 300 s unless it says otherwise.
pub struct DefaultTolerationSeconds;

#[async_trait]
impl AdmissionPlugin for DefaultTolerationSeconds {
    fn name(&self) -> &'static str {
        "DefaultTolerationSeconds"
    }

    fn handles(&self, a: &Attributes<'_>) -> bool {
        a.creates("", "pods")
    }

    async fn mutate(
        &self,
        _cx: &dyn AdmissionCtx,
        _a: &Attributes<'_>,
        obj: &mut Value,
    ) -> ApiResult<()> {
        if let Some(spec) = spec_mut(obj) {
            core::default_tolerations(spec);
        }
        Ok(())
    }
}
