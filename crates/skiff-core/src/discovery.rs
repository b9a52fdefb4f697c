//! Discovery documents as Kubernetes serves them: `/api`, `/apis`, each
//! group and group-version, and aggregated discovery (apidiscovery.k8s.io/v2,
//! served with Content-Type
//! `application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList`).

use serde_json::{json, Value};

use crate::resources::{Catalog, ResourceInfo};

/// `(verbs, group, version, kind)` of a subresource as discovery lists it.
fn subresource(
    res: &ResourceInfo,
    sub: &str,
) -> (Vec<&'static str>, &'static str, &'static str, &'static str) {
    match sub {
        "status" => (
            vec!["get", "patch", "update"],
            res.group,
            res.version,
            res.kind,
        ),
        "scale" => (vec!["get", "patch", "update"], "autoscaling", "v1", "Scale"),
        "binding" => (vec!["create"], "", "v1", "Binding"),
        "eviction" => (vec!["create"], "policy", "v1", "Eviction"),
        "log" => (vec!["get"], "", "v1", "Pod"),
        "exec" | "attach" | "portforward" => (vec!["create", "get"], "", "v1", "PodExecOptions"),
        "proxy" => (
            vec!["create", "delete", "get", "patch", "update"],
            "",
            "v1",
            proxy_kind(res),
        ),
        "finalize" => (vec!["update"], "", "v1", "Namespace"),
        "token" => (
            vec!["create"],
            "authentication.k8s.io",
            "v1",
            "TokenRequest",
        ),
        "ephemeralcontainers" | "resize" => (vec!["get", "patch", "update"], "", "v1", "Pod"),
        _ => (vec!["get"], res.group, res.version, res.kind),
    }
}

fn proxy_kind(res: &ResourceInfo) -> &'static str {
    match res.kind {
        "Pod" => "PodProxyOptions",
        "Node" => "NodeProxyOptions",
        _ => "ServiceProxyOptions",
    }
}

fn sub_kind(res: &ResourceInfo, sub: &str) -> &'static str {
    match sub {
        "exec" => "PodExecOptions",
        "attach" => "PodAttachOptions",
        "portforward" => "PodPortForwardOptions",
        _ => subresource(res, sub).3,
    }
}

/// A stable hash of a resource's storage identity (`storageVersionHash`).
fn storage_hash(res: &ResourceInfo) -> String {
    let mut h: u64 = 0xcbf29ce484222325;
    for b in format!("{}/{}/{}", res.group, res.version, res.kind).bytes() {
        h ^= b as u64;
        h = h.wrapping_mul(0x100000001b3);
    }
    let bytes = h.to_le_bytes();
    const ALPH: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    bytes
        .iter()
        .take(8)
        .map(|b| ALPH[(*b as usize) % 64] as char)
        .collect::<String>()
        + "="
}

/// Groups the API server computes on request instead of storing (so not in
/// [`RESOURCES`]), read-only: `metrics.k8s.io`, served natively where
/// Kubernetes has metrics-server behind an APIService. Each is (group,
/// version, resources).
pub const COMPUTED: &[(&str, &str, &[ComputedResource])] = &[(
    "metrics.k8s.io",
    "v1beta1",
    &[
        ("nodes", "nodemetrics", "NodeMetrics", false),
        ("pods", "podmetrics", "PodMetrics", true),
    ],
)];

/// `componentstatuses` (core v1, deprecated since 1.19 and still served by
/// Kubernetes 1.33): the API server computes each component's health on
/// request (`kubectl get cs`); get and list only.
pub const COMPONENT_STATUSES: ComputedResource = (
    "componentstatuses",
    "componentstatus",
    "ComponentStatus",
    false,
);

/// (plural, singular, kind, namespaced) of a computed resource.
pub type ComputedResource = (&'static str, &'static str, &'static str, bool);

const COMPUTED_VERBS: &[&str] = &["get", "list"];

/// `/api`.
pub fn api_versions(server_address: &str) -> Value {
    json!({
        "kind": "APIVersions",
        "versions": ["v1"],
        "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": server_address}],
    })
}

fn group_doc(group: &str, versions: &[&str]) -> Value {
    let vs: Vec<Value> = versions
        .iter()
        .map(|v| json!({"groupVersion": format!("{group}/{v}"), "version": v}))
        .collect();
    json!({
        "name": group,
        "versions": vs,
        "preferredVersion": {"groupVersion": format!("{group}/{}", versions[0]), "version": versions[0]},
    })
}

/// `/apis` of the built-in resources.
pub fn api_group_list() -> Value {
    api_group_list_in(&Catalog::new())
}

/// `/apis`.
pub fn api_group_list_in(cat: &Catalog) -> Value {
    let mut gs: Vec<Value> = cat
        .groups()
        .iter()
        .map(|(g, vs)| group_doc(g, vs))
        .collect();
    gs.extend(COMPUTED.iter().map(|(g, v, _)| group_doc(g, &[v])));
    json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": gs})
}

/// `/apis/<group>` of the built-in resources.
pub fn api_group(group: &str) -> Option<Value> {
    api_group_in(&Catalog::new(), group)
}

/// `/apis/<group>`.
pub fn api_group_in(cat: &Catalog, group: &str) -> Option<Value> {
    let (g, vs) = cat
        .groups()
        .into_iter()
        .chain(COMPUTED.iter().map(|(g, v, _)| (*g, vec![*v])))
        .find(|(g, _)| *g == group)?;
    let mut doc = group_doc(g, &vs);
    doc["kind"] = json!("APIGroup");
    doc["apiVersion"] = json!("v1");
    Some(doc)
}

/// `/api/v1` or `/apis/<group>/<version>` of the built-in resources.
pub fn api_resource_list(group: &str, version: &str) -> Option<Value> {
    api_resource_list_in(&Catalog::new(), group, version)
}

/// `/api/v1` or `/apis/<group>/<version>`.
pub fn api_resource_list_in(cat: &Catalog, group: &str, version: &str) -> Option<Value> {
    let rs: Vec<&ResourceInfo> = cat
        .all()
        .into_iter()
        .filter(|r| r.group == group && r.version == version)
        .collect();
    if rs.is_empty() {
        let (_, _, computed) = COMPUTED
            .iter()
            .find(|(g, v, _)| *g == group && *v == version)?;
        let out: Vec<Value> = computed
            .iter()
            .map(|(plural, singular, kind, namespaced)| {
                json!({"name": plural, "singularName": singular, "namespaced": namespaced, "kind": kind, "verbs": COMPUTED_VERBS})
            })
            .collect();
        return Some(
            json!({"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": format!("{group}/{version}"), "resources": out}),
        );
    }
    let mut out = Vec::new();
    if group.is_empty() && version == "v1" {
        let (plural, singular, kind, namespaced) = COMPONENT_STATUSES;
        out.push(
            json!({"name": plural, "singularName": singular, "namespaced": namespaced,
            "kind": kind, "verbs": COMPUTED_VERBS, "shortNames": ["cs"]}),
        );
    }
    for r in rs {
        let mut e = json!({
            "name": r.plural,
            "singularName": r.singular,
            "namespaced": r.namespaced,
            "kind": r.kind,
            "verbs": r.verbs(),
            "storageVersionHash": storage_hash(r),
        });
        if !r.short_names.is_empty() {
            e["shortNames"] = json!(r.short_names);
        }
        if !r.categories.is_empty() {
            e["categories"] = json!(r.categories);
        }
        out.push(e);
        for sub in r.subresources {
            let (verbs, g, v, _) = subresource(r, sub);
            let mut s = json!({"name": format!("{}/{sub}", r.plural), "singularName": "", "namespaced": r.namespaced, "kind": sub_kind(r, sub), "verbs": verbs});
            if g != r.group || v != r.version {
                s["group"] = json!(g);
                s["version"] = json!(v);
            }
            out.push(s);
        }
    }
    let gv = if group.is_empty() {
        version.to_string()
    } else {
        format!("{group}/{version}")
    };
    Some(
        json!({"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": gv, "resources": out}),
    )
}

fn discovery_version(cat: &Catalog, group: &str, version: &str) -> Value {
    let mut resources: Vec<Value> = cat
        .all()
        .into_iter()
        .filter(|r| r.group == group && r.version == version)
        .map(|r| {
            let subs: Vec<Value> = r
                .subresources
                .iter()
                .map(|sub| {
                    let (verbs, g, v, _) = subresource(r, sub);
                    json!({"subresource": sub, "responseKind": {"group": g, "version": v, "kind": sub_kind(r, sub)}, "verbs": verbs})
                })
                .collect();
            let mut e = json!({
                "resource": r.plural,
                "responseKind": {"group": r.group, "version": r.version, "kind": r.kind},
                "scope": if r.namespaced { "Namespaced" } else { "Cluster" },
                "singularResource": r.singular,
                "verbs": r.verbs(),
            });
            if !r.short_names.is_empty() {
                e["shortNames"] = json!(r.short_names);
            }
            if !r.categories.is_empty() {
                e["categories"] = json!(r.categories);
            }
            if !subs.is_empty() {
                e["subresources"] = Value::Array(subs);
            }
            e
        })
        .collect();
    if group.is_empty() && version == "v1" {
        let (plural, singular, kind, _) = COMPONENT_STATUSES;
        resources.insert(
            0,
            json!({
                "resource": plural,
                "responseKind": {"group": "", "version": "v1", "kind": kind},
                "scope": "Cluster",
                "singularResource": singular,
                "verbs": COMPUTED_VERBS,
                "shortNames": ["cs"],
            }),
        );
    }
    json!({"version": version, "resources": resources, "freshness": "Current"})
}

/// The aggregated discovery document of the built-in resources.
pub fn aggregated_discovery(legacy: bool) -> Value {
    aggregated_discovery_in(&Catalog::new(), legacy)
}

/// The aggregated discovery document for `/api` (`legacy`) or `/apis`.
pub fn aggregated_discovery_in(cat: &Catalog, legacy: bool) -> Value {
    let items: Vec<Value> = if legacy {
        vec![
            json!({"metadata": {"creationTimestamp": null}, "versions": [discovery_version(cat, "", "v1")]}),
        ]
    } else {
        let mut items: Vec<Value> = cat
            .groups()
            .iter()
            .map(|(g, vs)| {
                let versions: Vec<Value> =
                    vs.iter().map(|v| discovery_version(cat, g, v)).collect();
                json!({"metadata": {"name": g, "creationTimestamp": null}, "versions": versions})
            })
            .collect();
        items.extend(COMPUTED.iter().map(|(g, v, computed)| {
            let resources: Vec<Value> = computed
                .iter()
                .map(|(plural, singular, kind, namespaced)| {
                    json!({
                        "resource": plural,
                        "responseKind": {"group": g, "version": v, "kind": kind},
                        "scope": if *namespaced { "Namespaced" } else { "Cluster" },
                        "singularResource": singular,
                        "verbs": COMPUTED_VERBS,
                    })
                })
                .collect();
            json!({"metadata": {"name": g, "creationTimestamp": null},
                "versions": [{"version": v, "resources": resources, "freshness": "Current"}]})
        }));
        items
    };
    json!({"kind": "APIGroupDiscoveryList", "apiVersion": "apidiscovery.k8s.io/v2", "metadata": {}, "items": items})
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `kubectl get cs` finds componentstatuses in both discovery forms,
    /// get and list only.
    #[test]
    fn the_core_resources_include_componentstatuses() {
        let l = api_resource_list("", "v1").unwrap();
        let cs = l["resources"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["name"] == "componentstatuses")
            .expect("componentstatuses in /api/v1");
        assert_eq!(cs["kind"], "ComponentStatus");
        assert_eq!(cs["namespaced"], false);
        assert_eq!(cs["verbs"], json!(["get", "list"]));
        assert_eq!(cs["shortNames"], json!(["cs"]));
        let agg = aggregated_discovery(true);
        let cs = agg["items"][0]["versions"][0]["resources"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["resource"] == "componentstatuses")
            .expect("componentstatuses in aggregated /api");
        assert_eq!(cs["scope"], "Cluster");
        assert_eq!(cs["verbs"], json!(["get", "list"]));
    }

    #[test]
    fn the_core_resource_list_has_pods_with_their_short_name_and_category() {
        let l = api_resource_list("", "v1").unwrap();
        let pods = l["resources"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["name"] == "pods")
            .unwrap();
        assert_eq!(pods["shortNames"], json!(["po"]));
        assert_eq!(pods["categories"], json!(["all"]));
        let scale = api_resource_list("apps", "v1").unwrap()["resources"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["name"] == "deployments/scale")
            .cloned()
            .unwrap();
        assert_eq!(
            (scale["group"].as_str(), scale["kind"].as_str()),
            (Some("autoscaling"), Some("Scale"))
        );
    }

    #[test]
    fn aggregated_discovery_lists_deployments_with_scale() {
        let d = aggregated_discovery(false);
        let apps = d["items"]
            .as_array()
            .unwrap()
            .iter()
            .find(|g| g["metadata"]["name"] == "apps")
            .unwrap();
        let dep = apps["versions"][0]["resources"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["resource"] == "deployments")
            .unwrap();
        assert!(dep["subresources"]
            .as_array()
            .unwrap()
            .iter()
            .any(|s| s["subresource"] == "scale"));
        assert_eq!(dep["scope"], "Namespaced");
    }

    #[test]
    fn the_metrics_group_is_discoverable_read_only_in_every_form() {
        let groups = api_group_list();
        assert!(groups["groups"]
            .as_array()
            .unwrap()
            .iter()
            .any(|g| g["name"] == "metrics.k8s.io"
                && g["preferredVersion"]["groupVersion"] == "metrics.k8s.io/v1beta1"));
        assert_eq!(
            api_group("metrics.k8s.io").unwrap()["versions"][0]["version"],
            "v1beta1"
        );
        let l = api_resource_list("metrics.k8s.io", "v1beta1").unwrap();
        assert_eq!(l["groupVersion"], "metrics.k8s.io/v1beta1");
        let r = l["resources"].as_array().unwrap();
        assert_eq!(
            (&r[0]["name"], &r[0]["kind"], &r[0]["namespaced"]),
            (&json!("nodes"), &json!("NodeMetrics"), &json!(false))
        );
        assert_eq!(
            (&r[1]["name"], &r[1]["kind"], &r[1]["namespaced"]),
            (&json!("pods"), &json!("PodMetrics"), &json!(true))
        );
        assert_eq!(r[1]["verbs"], json!(["get", "list"]));
        assert!(api_resource_list("metrics.k8s.io", "v1").is_none());
        let d = aggregated_discovery(false);
        let m = d["items"]
            .as_array()
            .unwrap()
            .iter()
            .find(|g| g["metadata"]["name"] == "metrics.k8s.io")
            .unwrap();
        let pods = &m["versions"][0]["resources"][1];
        assert_eq!(pods["resource"], "pods");
        assert_eq!(pods["scope"], "Namespaced");
        assert_eq!(pods["responseKind"]["kind"], "PodMetrics");
        assert_eq!(pods["verbs"], json!(["get", "list"]));
    }

    #[test]
    fn autoscaling_prefers_v2() {
        assert_eq!(
            api_group("autoscaling").unwrap()["preferredVersion"]["version"],
            "v2"
        );
    }
}
