//! The ClusterRole aggregation controller (kube-controller-manager's
//! `clusterrole-aggregation`): a ClusterRole with an `aggregationRule`
//! gets as its rules the rules of every other ClusterRole its selectors
//! match, in role-name order, each once. `admin`, `edit` and `view` are
//! built this way from the `system:aggregate-to-*` roles and from any role
//! a user labels to join them.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::rbac::v1::ClusterRole;
use kube::api::{Api, Patch, PatchParams};
use serde_json::{json, Value};
use skiff_core::selector::LabelSelector;

use crate::controller::Controller;
use crate::framework::Cache;
use crate::{Ctx, Error};

pub fn register(ctx: &Arc<Ctx>, tasks: &mut tokio::task::JoinSet<()>) {
    // One pass over every role, after any role changes (a burst of changes
    // waits in the queue as one key) and every minute.
    let roles: Arc<Cache<ClusterRole>> = Cache::new();
    let controller = Controller::periodic(ctx, "clusterrole-aggregation", Duration::from_secs(60))
        .watches(&roles, |_, _, _| Some(String::new()));
    roles.start(Api::all(ctx.client.clone()), tasks);
    let cache = roles.clone();
    controller
        .ready(async move { cache.ready().await })
        .run(tasks, (), |c, _, _| async move {
            let api: Api<ClusterRole> = Api::all(c.client.clone());
            match sync(&api).await {
                true => Ok(None),
                false => Err(Error::Other("aggregating cluster roles failed".into())),
            }
        });
}

/// The rules each aggregated role should have, where they differ from what
/// it has: `(name, rules)`. `roles` are ClusterRole objects.
pub fn plan(roles: &[Value]) -> Vec<(String, Vec<Value>)> {
    let views: Vec<(String, serde_json::Map<String, Value>, Vec<Value>)> = roles
        .iter()
        .map(|r| {
            (
                r.pointer("/metadata/name")
                    .and_then(Value::as_str)
                    .unwrap_or("")
                    .to_string(),
                r.pointer("/metadata/labels")
                    .and_then(Value::as_object)
                    .cloned()
                    .unwrap_or_default(),
                r.get("rules")
                    .and_then(Value::as_array)
                    .cloned()
                    .unwrap_or_default(),
            )
        })
        .collect();
    let mut out = Vec::new();
    for (r, (name, _, rules)) in roles.iter().zip(&views) {
        let Some(sels) = r
            .pointer("/aggregationRule/clusterRoleSelectors")
            .and_then(Value::as_array)
        else {
            continue;
        };
        let selectors: Vec<LabelSelector> = sels
            .iter()
            .filter_map(|s| LabelSelector::from_label_selector_json(s).ok())
            // An empty selector would select every role; Kubernetes
            // matches nothing with it here.
            .filter(|s| !s.is_empty())
            .collect();
        let want = skiff_core::bootstrap_policy::aggregate_rules(name, &selectors, &views);
        if &want != rules {
            out.push((name.clone(), want));
        }
    }
    out
}

async fn sync(api: &Api<ClusterRole>) -> bool {
    let list = match api.list(&Default::default()).await {
        Ok(l) => l,
        Err(e) => {
            tracing::debug!(error = %e, "listing clusterroles");
            return false;
        }
    };
    let roles: Vec<Value> = list
        .items
        .iter()
        .filter_map(|r| serde_json::to_value(r).ok())
        .collect();
    let mut ok = true;
    for (name, rules) in plan(&roles) {
        let patch = json!({"rules": rules});
        if let Err(e) = api
            .patch(&name, &PatchParams::default(), &Patch::Merge(patch))
            .await
        {
            tracing::debug!(role = %name, error = %e, "aggregating clusterrole");
            ok = false;
        }
    }
    ok
}

#[cfg(test)]
mod tests {
    use super::*;

    fn role(name: &str, labels: Value, rules: Value, agg: Option<&str>) -> Value {
        let mut v = json!({"metadata": {"name": name, "labels": labels}, "rules": rules});
        if let Some(l) = agg {
            v["aggregationRule"] = json!({"clusterRoleSelectors": [{"matchLabels": {l: "true"}}]});
        }
        v
    }

    #[test]
    fn an_aggregated_role_gets_the_rules_of_the_roles_it_selects_once_in_name_order() {
        let get_pods = json!({"apiGroups": [""], "resources": ["pods"], "verbs": ["get"]});
        let get_cms = json!({"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get"]});
        let roles = vec![
            role("view", json!({}), json!([]), Some("agg")),
            role("b", json!({"agg": "true"}), json!([get_pods.clone()]), None),
            role(
                "a",
                json!({"agg": "true"}),
                json!([get_cms.clone(), get_pods.clone()]),
                None,
            ),
            role(
                "c",
                json!({"agg": "false"}),
                json!([{"verbs": ["*"]}]),
                None,
            ),
        ];
        assert_eq!(
            plan(&roles),
            vec![("view".to_string(), vec![get_cms.clone(), get_pods.clone()])]
        );
        // Already up to date: nothing to write.
        let mut done = roles.clone();
        done[0]["rules"] = json!([get_cms, get_pods]);
        assert!(plan(&done).is_empty());
    }
}
