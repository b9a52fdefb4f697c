//! The bootstrap policy's node roles: `system:node` (the rules the Node
//! authorizer grants every node, then narrows by its graph and the
//! NodeRestriction admission plugin), as Kubernetes' `NodeRules()`.

use crate::rbac::PolicyRule;

fn r(verbs: &[&str], groups: &[&str], resources: &[&str]) -> PolicyRule {
    PolicyRule::new(verbs, groups, resources)
}

/// Kubernetes' `NodeRules()`: what the Node authorizer allows a node on
/// resources it does not subdivide by the graph.
pub fn node_rules() -> Vec<PolicyRule> {
    const READ: &[&str] = &["get", "list", "watch"];
    vec![
        r(&["create"], &["authentication.k8s.io"], &["tokenreviews"]),
        r(
            &["create"],
            &["authorization.k8s.io"],
            &["subjectaccessreviews", "localsubjectaccessreviews"],
        ),
        r(READ, &[""], &["services"]),
        r(&["create", "get", "list", "watch"], &[""], &["nodes"]),
        r(&["update", "patch"], &[""], &["nodes/status"]),
        r(&["update", "patch"], &[""], &["nodes"]),
        r(&["create", "update", "patch"], &[""], &["events"]),
        r(READ, &[""], &["pods"]),
        r(&["create", "delete"], &[""], &["pods"]),
        r(&["update", "patch"], &[""], &["pods/status"]),
        r(&["create"], &[""], &["pods/eviction"]),
        r(READ, &[""], &["secrets", "configmaps"]),
        r(
            &["get"],
            &[""],
            &["persistentvolumeclaims", "persistentvolumes"],
        ),
        r(&["get"], &[""], &["endpoints"]),
        r(
            &["create", "get", "list", "watch"],
            &["certificates.k8s.io"],
            &["certificatesigningrequests"],
        ),
        r(
            &["get", "create", "update", "patch", "delete"],
            &["coordination.k8s.io"],
            &["leases"],
        ),
        r(&["get"], &["storage.k8s.io"], &["volumeattachments"]),
        r(&["create"], &[""], &["serviceaccounts/token"]),
        r(
            &["get", "update", "patch"],
            &[""],
            &["persistentvolumeclaims/status"],
        ),
        r(READ, &["storage.k8s.io"], &["csidrivers"]),
        r(
            &["get", "create", "update", "patch", "delete"],
            &["storage.k8s.io"],
            &["csinodes"],
        ),
        r(READ, &["node.k8s.io"], &["runtimeclasses"]),
    ]
}
