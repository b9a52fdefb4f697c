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

/// The certificate roles of Kubernetes' bootstrap policy: bootstrapping
/// nodes create CertificateSigningRequests (`system:node-bootstrapper`);
/// the `nodeclient` and `selfnodeclient` roles are what the CSR approver
/// checks before approving a node's client certificate.
pub fn cluster_roles() -> Vec<serde_json::Value> {
    use crate::bootstrap_policy::cluster_role;
    let csr = "certificates.k8s.io";
    vec![
        cluster_role(
            "system:node-bootstrapper",
            &[],
            vec![r(
                &["create", "get", "list", "watch"],
                &[csr],
                &["certificatesigningrequests"],
            )],
        ),
        cluster_role(
            "system:certificates.k8s.io:certificatesigningrequests:nodeclient",
            &[],
            vec![r(
                &["create"],
                &[csr],
                &["certificatesigningrequests/nodeclient"],
            )],
        ),
        cluster_role(
            "system:certificates.k8s.io:certificatesigningrequests:selfnodeclient",
            &[],
            vec![r(
                &["create"],
                &[csr],
                &["certificatesigningrequests/selfnodeclient"],
            )],
        ),
        // What skiff's agent does beyond kubelet: the service proxy and
        // cluster DNS watch EndpointSlices (kube-proxy's and CoreDNS's
        // reads), NetworkPolicy enforcement watches policies and
        // namespaces (a network plugin's reads), and the ServiceLB writes
        // LoadBalancer ingress.
        cluster_role(
            "skiff:node",
            &[],
            vec![
                r(
                    &["get", "list", "watch"],
                    &["discovery.k8s.io"],
                    &["endpointslices"],
                ),
                r(
                    &["get", "list", "watch"],
                    &["networking.k8s.io"],
                    &["networkpolicies"],
                ),
                r(&["get", "list", "watch"], &[""], &["namespaces"]),
                r(&["patch", "update"], &[""], &["services/status"]),
            ],
        ),
    ]
    .into_iter()
    .chain(scheduler_roles())
    .chain(controller_manager_roles())
    .collect()
}

/// skiff's bindings for joining nodes (kubeadm makes the same three): join
/// tokens may request node client certificates, which are approved at
/// once, and nodes may renew their own.
pub fn cluster_role_bindings() -> Vec<serde_json::Value> {
    use crate::bootstrap_policy::cluster_role_binding;
    vec![
        cluster_role_binding(
            "skiff:kubelet-bootstrap",
            "system:node-bootstrapper",
            &[("Group", "system:bootstrappers")],
        ),
        cluster_role_binding(
            "skiff:node-autoapprove-bootstrap",
            "system:certificates.k8s.io:certificatesigningrequests:nodeclient",
            &[("Group", "system:bootstrappers")],
        ),
        cluster_role_binding("skiff:node", "skiff:node", &[("Group", "system:nodes")]),
        cluster_role_binding(
            "skiff:node-autoapprove-certificate-rotation",
            "system:certificates.k8s.io:certificatesigningrequests:selfnodeclient",
            &[("Group", "system:nodes")],
        ),
    ]
    .into_iter()
    .chain(scheduler_bindings())
    .chain([cluster_role_binding(
        "skiff:kube-controller-manager",
        "skiff:kube-controller-manager",
        &[("User", "system:kube-controller-manager")],
    )])
    .collect()
}

/// The scheduler's roles as Kubernetes' bootstrap policy has them
/// (`system:kube-scheduler`, `system:volume-scheduler`), and what skiff's
/// scheduler reads beyond them (`skiff:kube-scheduler`: PriorityClasses).
pub fn scheduler_roles() -> Vec<serde_json::Value> {
    use crate::bootstrap_policy::cluster_role;
    const READ: &[&str] = &["get", "list", "watch"];
    let mut leases = r(&["get", "update"], &["coordination.k8s.io"], &["leases"]);
    leases.resource_names = vec!["kube-scheduler".into()];
    vec![
        cluster_role(
            "system:kube-scheduler",
            &[],
            vec![
                r(
                    &["create", "update", "patch"],
                    &["", "events.k8s.io"],
                    &["events"],
                ),
                r(&["create"], &["coordination.k8s.io"], &["leases"]),
                leases,
                r(READ, &[""], &["nodes"]),
                r(&["get", "list", "watch", "delete"], &[""], &["pods"]),
                r(&["create"], &[""], &["pods/binding", "bindings"]),
                r(&["patch", "update"], &[""], &["pods/status"]),
                r(READ, &[""], &["services", "replicationcontrollers"]),
                r(READ, &["apps", "extensions"], &["replicasets"]),
                r(READ, &["apps"], &["statefulsets"]),
                r(READ, &["policy"], &["poddisruptionbudgets"]),
                r(
                    READ,
                    &[""],
                    &["persistentvolumeclaims", "persistentvolumes"],
                ),
                r(READ, &["storage.k8s.io"], &["csinodes"]),
                r(READ, &[""], &["namespaces"]),
                r(READ, &["storage.k8s.io"], &["csidrivers"]),
                r(READ, &["storage.k8s.io"], &["csistoragecapacities"]),
            ],
        ),
        cluster_role(
            "system:volume-scheduler",
            &[],
            vec![
                r(
                    &["get", "list", "patch", "update", "watch"],
                    &[""],
                    &["persistentvolumes"],
                ),
                r(READ, &["storage.k8s.io"], &["storageclasses"]),
                r(
                    &["get", "list", "patch", "update", "watch"],
                    &[""],
                    &["persistentvolumeclaims"],
                ),
            ],
        ),
        cluster_role(
            "skiff:kube-scheduler",
            &[],
            vec![r(READ, &["scheduling.k8s.io"], &["priorityclasses"])],
        ),
    ]
}

/// Bindings of the scheduler's roles to `system:kube-scheduler`.
pub fn scheduler_bindings() -> Vec<serde_json::Value> {
    use crate::bootstrap_policy::cluster_role_binding;
    [
        "system:kube-scheduler",
        "system:volume-scheduler",
        "skiff:kube-scheduler",
    ]
    .iter()
    .map(|role| cluster_role_binding(role, role, &[("User", "system:kube-scheduler")]))
    .collect()
}

/// The in-process controller manager's role (skiff runs every controller
/// under one identity, `system:kube-controller-manager`): the union of what
/// Kubernetes' `system:controller:*` roles grant the controllers skiff
/// has. The garbage collector and namespace controller read and delete
/// every kind (as theirs do); creation is limited to the kinds controllers
/// make (skiff's dependencies controller makes NetworkPolicies); the
/// ClusterRole aggregation controller needs `escalate`.
pub fn controller_manager_roles() -> Vec<serde_json::Value> {
    use crate::bootstrap_policy::cluster_role;
    vec![cluster_role(
        "skiff:kube-controller-manager",
        &[],
        vec![
            r(
                &[
                    "get",
                    "list",
                    "watch",
                    "update",
                    "patch",
                    "delete",
                    "deletecollection",
                ],
                &["*"],
                &["*"],
            ),
            r(
                &["create"],
                &[""],
                &[
                    "pods",
                    "events",
                    "endpoints",
                    "serviceaccounts",
                    "configmaps",
                    "persistentvolumeclaims",
                    "pods/eviction",
                    "pods/binding",
                    "persistentvolumes",
                ],
            ),
            r(
                &["create"],
                &["apps"],
                &["replicasets", "controllerrevisions"],
            ),
            r(&["create"], &["batch"], &["jobs"]),
            r(&["create"], &["discovery.k8s.io"], &["endpointslices"]),
            // The dependencies controller's generated policies.
            r(&["create"], &["networking.k8s.io"], &["networkpolicies"]),
            r(&["create"], &["events.k8s.io"], &["events"]),
            r(&["create"], &["coordination.k8s.io"], &["leases"]),
            r(&["create"], &["authentication.k8s.io"], &["tokenreviews"]),
            r(
                &["create"],
                &["authorization.k8s.io"],
                &["subjectaccessreviews"],
            ),
            r(
                &["escalate"],
                &["rbac.authorization.k8s.io"],
                &["clusterroles"],
            ),
        ],
    )]
}
