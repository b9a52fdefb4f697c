//! The RBAC policy kube-apiserver reconciles at every start (its
//! `bootstrappolicy` package): the user-facing roles `cluster-admin`,
//! `admin`, `edit` and `view` (the last three aggregated from the
//! `system:aggregate-to-*` roles by label), discovery, basic-user and
//! public-info roles, component roles, and their bindings.

use serde_json::{json, Value};

use crate::rbac::PolicyRule;

const READ: &[&str] = &["get", "list", "watch"];
const WRITE: &[&str] = &["create", "delete", "deletecollection", "patch", "update"];
const READ_WRITE: &[&str] = &[
    "create",
    "delete",
    "deletecollection",
    "get",
    "list",
    "patch",
    "update",
    "watch",
];

/// The label every bootstrap object carries.
pub const BOOTSTRAPPING_LABEL: (&str, &str) = ("kubernetes.io/bootstrapping", "rbac-defaults");
/// The annotation that lets reconciliation add missing rules and subjects.
pub const AUTOUPDATE: &str = "rbac.authorization.kubernetes.io/autoupdate";

fn r(verbs: &[&str], groups: &[&str], resources: &[&str]) -> PolicyRule {
    PolicyRule::new(verbs, groups, resources)
}

fn events_rule() -> PolicyRule {
    r(
        &["create", "update", "patch"],
        &["", "events.k8s.io"],
        &["events"],
    )
}

pub(crate) fn cluster_role(name: &str, labels: &[(&str, &str)], rules: Vec<PolicyRule>) -> Value {
    let mut l = serde_json::Map::new();
    l.insert(BOOTSTRAPPING_LABEL.0.into(), json!(BOOTSTRAPPING_LABEL.1));
    for (k, v) in labels {
        l.insert((*k).into(), json!(v));
    }
    json!({
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRole",
        "metadata": {"name": name, "labels": l, "annotations": {AUTOUPDATE: "true"}},
        "rules": rules.iter().map(PolicyRule::to_json).collect::<Vec<_>>(),
    })
}

fn aggregated(name: &str, labels: &[(&str, &str)], select: &str) -> Value {
    let mut v = cluster_role(name, labels, Vec::new());
    v["aggregationRule"] = json!({"clusterRoleSelectors": [{"matchLabels": {select: "true"}}]});
    v
}

const AGG_ADMIN: &str = "rbac.authorization.k8s.io/aggregate-to-admin";
const AGG_EDIT: &str = "rbac.authorization.k8s.io/aggregate-to-edit";
const AGG_VIEW: &str = "rbac.authorization.k8s.io/aggregate-to-view";

/// The bootstrap ClusterRoles.
pub fn cluster_roles() -> Vec<Value> {
    let all = PolicyRule::new(&["*"], &["*"], &["*"]);
    vec![
        cluster_role(
            "cluster-admin",
            &[],
            vec![all, PolicyRule::urls(&["*"], &["*"])],
        ),
        cluster_role(
            "system:discovery",
            &[],
            vec![PolicyRule::urls(
                &["get"],
                &[
                    "/api",
                    "/api/*",
                    "/apis",
                    "/apis/*",
                    "/healthz",
                    "/livez",
                    "/openapi",
                    "/openapi/*",
                    "/readyz",
                    "/version",
                    "/version/",
                ],
            )],
        ),
        cluster_role(
            "system:monitoring",
            &[],
            vec![PolicyRule::urls(
                &["get"],
                &[
                    "/healthz",
                    "/healthz/*",
                    "/livez",
                    "/livez/*",
                    "/metrics",
                    "/metrics/slis",
                    "/readyz",
                    "/readyz/*",
                ],
            )],
        ),
        cluster_role(
            "system:basic-user",
            &[],
            vec![
                r(
                    &["create"],
                    &["authorization.k8s.io"],
                    &["selfsubjectaccessreviews", "selfsubjectrulesreviews"],
                ),
                r(
                    &["create"],
                    &["authentication.k8s.io"],
                    &["selfsubjectreviews"],
                ),
            ],
        ),
        cluster_role(
            "system:public-info-viewer",
            &[],
            vec![PolicyRule::urls(
                &["get"],
                &["/healthz", "/livez", "/readyz", "/version", "/version/"],
            )],
        ),
        cluster_role(
            "system:service-account-issuer-discovery",
            &[],
            vec![PolicyRule::urls(
                &["get"],
                &[
                    "/.well-known/openid-configuration",
                    "/.well-known/openid-configuration/",
                    "/openid/v1/jwks",
                    "/openid/v1/jwks/",
                ],
            )],
        ),
        aggregated("admin", &[], AGG_ADMIN),
        aggregated("edit", &[(AGG_ADMIN, "true")], AGG_EDIT),
        aggregated("view", &[(AGG_EDIT, "true")], AGG_VIEW),
        cluster_role(
            "system:aggregate-to-admin",
            &[(AGG_ADMIN, "true")],
            vec![
                r(
                    &["create"],
                    &["authorization.k8s.io"],
                    &["localsubjectaccessreviews"],
                ),
                r(
                    READ_WRITE,
                    &["rbac.authorization.k8s.io"],
                    &["rolebindings", "roles"],
                ),
            ],
        ),
        cluster_role(
            "system:aggregate-to-edit",
            &[(AGG_EDIT, "true")],
            vec![
                r(
                    READ,
                    &[""],
                    &[
                        "pods/attach",
                        "pods/exec",
                        "pods/portforward",
                        "pods/proxy",
                        "secrets",
                        "services/proxy",
                    ],
                ),
                r(&["impersonate"], &[""], &["serviceaccounts"]),
                r(
                    WRITE,
                    &[""],
                    &[
                        "pods",
                        "pods/attach",
                        "pods/exec",
                        "pods/portforward",
                        "pods/proxy",
                    ],
                ),
                r(&["create"], &[""], &["pods/eviction"]),
                r(
                    WRITE,
                    &[""],
                    &[
                        "configmaps",
                        "events",
                        "persistentvolumeclaims",
                        "replicationcontrollers",
                        "replicationcontrollers/scale",
                        "secrets",
                        "serviceaccounts",
                        "services",
                        "services/proxy",
                    ],
                ),
                r(&["create"], &[""], &["serviceaccounts/token"]),
                r(
                    WRITE,
                    &["apps"],
                    &[
                        "daemonsets",
                        "deployments",
                        "deployments/rollback",
                        "deployments/scale",
                        "replicasets",
                        "replicasets/scale",
                        "statefulsets",
                        "statefulsets/scale",
                    ],
                ),
                r(WRITE, &["autoscaling"], &["horizontalpodautoscalers"]),
                r(WRITE, &["batch"], &["cronjobs", "jobs"]),
                r(WRITE, &["policy"], &["poddisruptionbudgets"]),
                r(
                    WRITE,
                    &["networking.k8s.io"],
                    &["ingresses", "networkpolicies"],
                ),
                r(READ_WRITE, &["coordination.k8s.io"], &["leases"]),
            ],
        ),
        cluster_role(
            "system:aggregate-to-view",
            &[(AGG_VIEW, "true")],
            vec![
                r(
                    READ,
                    &[""],
                    &[
                        "configmaps",
                        "endpoints",
                        "persistentvolumeclaims",
                        "persistentvolumeclaims/status",
                        "pods",
                        "replicationcontrollers",
                        "replicationcontrollers/scale",
                        "serviceaccounts",
                        "services",
                        "services/status",
                    ],
                ),
                r(
                    READ,
                    &[""],
                    &[
                        "bindings",
                        "events",
                        "limitranges",
                        "namespaces/status",
                        "pods/log",
                        "pods/status",
                        "replicationcontrollers/status",
                        "resourcequotas",
                        "resourcequotas/status",
                    ],
                ),
                r(READ, &[""], &["namespaces"]),
                r(READ, &["discovery.k8s.io"], &["endpointslices"]),
                r(
                    READ,
                    &["apps"],
                    &[
                        "controllerrevisions",
                        "daemonsets",
                        "daemonsets/status",
                        "deployments",
                        "deployments/scale",
                        "deployments/status",
                        "replicasets",
                        "replicasets/scale",
                        "replicasets/status",
                        "statefulsets",
                        "statefulsets/scale",
                        "statefulsets/status",
                    ],
                ),
                r(
                    READ,
                    &["autoscaling"],
                    &[
                        "horizontalpodautoscalers",
                        "horizontalpodautoscalers/status",
                    ],
                ),
                r(
                    READ,
                    &["batch"],
                    &["cronjobs", "cronjobs/status", "jobs", "jobs/status"],
                ),
                r(
                    READ,
                    &["policy"],
                    &["poddisruptionbudgets", "poddisruptionbudgets/status"],
                ),
                r(
                    READ,
                    &["networking.k8s.io"],
                    &["ingresses", "ingresses/status", "networkpolicies"],
                ),
                r(READ, &["metrics.k8s.io"], &["nodes", "pods"]),
            ],
        ),
        cluster_role(
            "system:auth-delegator",
            &[],
            vec![
                r(&["create"], &["authentication.k8s.io"], &["tokenreviews"]),
                r(
                    &["create"],
                    &["authorization.k8s.io"],
                    &["subjectaccessreviews"],
                ),
            ],
        ),
        cluster_role(
            "system:node-proxier",
            &[],
            vec![
                r(&["list", "watch"], &[""], &["endpoints", "services"]),
                r(&["get", "list", "watch"], &[""], &["nodes"]),
                events_rule(),
                r(
                    &["list", "watch"],
                    &["discovery.k8s.io"],
                    &["endpointslices"],
                ),
            ],
        ),
        cluster_role("system:node", &[], crate::bootstrap_nodes::node_rules()),
    ]
    .into_iter()
    .chain(crate::bootstrap_nodes::cluster_roles())
    .collect()
}

pub(crate) fn cluster_role_binding(name: &str, role: &str, subjects: &[(&str, &str)]) -> Value {
    json!({
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRoleBinding",
        "metadata": {
            "name": name,
            "labels": {BOOTSTRAPPING_LABEL.0: BOOTSTRAPPING_LABEL.1},
            "annotations": {AUTOUPDATE: "true"},
        },
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
        "subjects": subjects.iter().map(|(kind, n)| json!({"apiGroup": "rbac.authorization.k8s.io", "kind": kind, "name": n})).collect::<Vec<_>>(),
    })
}

/// The bootstrap ClusterRoleBindings.
pub fn cluster_role_bindings() -> Vec<Value> {
    vec![
        cluster_role_binding(
            "cluster-admin",
            "cluster-admin",
            &[("Group", "system:masters")],
        ),
        cluster_role_binding(
            "system:discovery",
            "system:discovery",
            &[("Group", "system:authenticated")],
        ),
        cluster_role_binding(
            "system:monitoring",
            "system:monitoring",
            &[("Group", "system:monitoring")],
        ),
        cluster_role_binding(
            "system:basic-user",
            "system:basic-user",
            &[("Group", "system:authenticated")],
        ),
        cluster_role_binding(
            "system:public-info-viewer",
            "system:public-info-viewer",
            &[
                ("Group", "system:authenticated"),
                ("Group", "system:unauthenticated"),
            ],
        ),
        cluster_role_binding(
            "system:service-account-issuer-discovery",
            "system:service-account-issuer-discovery",
            &[("Group", "system:serviceaccounts")],
        ),
        cluster_role_binding(
            "system:node-proxier",
            "system:node-proxier",
            &[("User", "system:kube-proxy")],
        ),
        // Bound to nobody, as in Kubernetes: nodes are authorized by the
        // Node authorizer, not through this role.
        cluster_role_binding("system:node", "system:node", &[]),
    ]
    .into_iter()
    .chain(crate::bootstrap_nodes::cluster_role_bindings())
    .collect()
}

/// The rules of an aggregated ClusterRole: the rules of every other role
/// whose labels match one of `selectors`, in role-name order, each once
/// (the ClusterRole aggregation controller's computation). `roles` are
/// `(name, labels, rules)`.
pub fn aggregate_rules(
    self_name: &str,
    selectors: &[crate::selector::LabelSelector],
    roles: &[(String, serde_json::Map<String, Value>, Vec<Value>)],
) -> Vec<Value> {
    let mut sorted: Vec<&(String, serde_json::Map<String, Value>, Vec<Value>)> =
        roles.iter().filter(|(n, _, _)| n != self_name).collect();
    sorted.sort_by(|a, b| a.0.cmp(&b.0));
    let mut out: Vec<Value> = Vec::new();
    for (_, labels, rules) in sorted {
        if !selectors.iter().any(|s| s.matches(labels)) {
            continue;
        }
        for rule in rules {
            if !out.contains(rule) {
                out.push(rule.clone());
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn view_edit_admin_aggregate_upward() {
        let roles = cluster_roles();
        let labels = |name: &str| {
            roles
                .iter()
                .find(|r| r["metadata"]["name"] == name)
                .unwrap()["metadata"]["labels"]
                .clone()
        };
        assert_eq!(labels("view")[AGG_EDIT], "true");
        assert_eq!(labels("edit")[AGG_ADMIN], "true");
        let admin = roles
            .iter()
            .find(|r| r["metadata"]["name"] == "admin")
            .unwrap();
        assert_eq!(
            admin["aggregationRule"]["clusterRoleSelectors"][0]["matchLabels"][AGG_ADMIN],
            "true"
        );
        for b in cluster_role_bindings() {
            let role = b["roleRef"]["name"].as_str().unwrap();
            assert!(
                roles.iter().any(|r| r["metadata"]["name"] == role),
                "{role}"
            );
        }
    }
}
