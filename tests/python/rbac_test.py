"""The official python client with a ServiceAccount token: TokenRequest
through the client, 403 without rights, a RoleBinding granting one
namespace, a SelfSubjectAccessReview, and 401 once the ServiceAccount is
deleted.

Usage: rbac_test.py KUBECONFIG
"""

import json
import sys
import time

from kubernetes import client, config
from kubernetes.client.rest import ApiException

NS = "rbac-test"


def status_of(fn, *args, **kwargs):
    try:
        fn(*args, **kwargs)
        return 200, None
    except ApiException as e:
        return e.status, json.loads(e.body) if e.body else None


def wait_for(what, fn, secs=30):
    deadline = time.time() + secs
    while time.time() < deadline:
        if fn():
            return
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def main():
    config.load_kube_config(config_file=sys.argv[1])
    admin_cfg = client.Configuration.get_default_copy()
    v1 = client.CoreV1Api()
    rbac = client.RbacAuthorizationV1Api()
    v1.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=NS)))
    v1.create_namespaced_service_account(NS, client.V1ServiceAccount(metadata=client.V1ObjectMeta(name="app")))
    tr = v1.create_namespaced_service_account_token(
        "app", NS, client.AuthenticationV1TokenRequest(spec=client.V1TokenRequestSpec(audiences=[], expiration_seconds=1800))
    )
    token = tr.status.token

    cfg = client.Configuration()
    cfg.host = admin_cfg.host
    cfg.ssl_ca_cert = admin_cfg.ssl_ca_cert
    cfg.api_key = {"authorization": token}
    cfg.api_key_prefix = {"authorization": "Bearer"}
    sa = client.ApiClient(cfg)
    sa_v1 = client.CoreV1Api(sa)

    code, body = status_of(sa_v1.list_namespaced_config_map, NS)
    assert code == 403, (code, body)
    assert body["message"] == (
        'configmaps is forbidden: User "system:serviceaccount:rbac-test:app" cannot list '
        'resource "configmaps" in API group "" in the namespace "rbac-test"'
    ), body

    rbac.create_namespaced_role_binding(NS, client.V1RoleBinding(
        metadata=client.V1ObjectMeta(name="app-edit"),
        role_ref=client.V1RoleRef(api_group="rbac.authorization.k8s.io", kind="ClusterRole", name="edit"),
        subjects=[client.RbacV1Subject(kind="ServiceAccount", name="app", namespace=NS)],
    ))
    wait_for("the binding", lambda: status_of(sa_v1.list_namespaced_config_map, NS)[0] == 200)
    sa_v1.create_namespaced_config_map(NS, client.V1ConfigMap(metadata=client.V1ObjectMeta(name="made-by-app")))
    code, _ = status_of(sa_v1.list_namespaced_config_map, "default")
    assert code == 403, code

    review = client.AuthorizationV1Api(sa).create_self_subject_access_review(client.V1SelfSubjectAccessReview(
        spec=client.V1SelfSubjectAccessReviewSpec(resource_attributes=client.V1ResourceAttributes(
            namespace=NS, verb="delete", resource="configmaps"))))
    assert review.status.allowed is True, review.status
    review = client.AuthorizationV1Api(sa).create_self_subject_access_review(client.V1SelfSubjectAccessReview(
        spec=client.V1SelfSubjectAccessReviewSpec(resource_attributes=client.V1ResourceAttributes(
            namespace=NS, verb="create", resource="roles", group="rbac.authorization.k8s.io"))))
    assert review.status.allowed is False, review.status

    v1.delete_namespaced_service_account("app", NS)
    wait_for("the token to be refused", lambda: status_of(sa_v1.list_namespaced_config_map, NS)[0] == 401)
    print("rbac: ok")


if __name__ == "__main__":
    main()
