"""The official python client's everyday calls against skiff: typed create,
read, list with selectors and paging, replace, patch, delete, and the
errors a program handles (404, 409 AlreadyExists, 409 Conflict, 422).

Usage: client_test.py KUBECONFIG
"""

import sys

from kubernetes import client, config
from kubernetes.client.rest import ApiException

NS = "client-test"


def expect_error(code, reason, fn, *args, **kwargs):
    try:
        fn(*args, **kwargs)
    except ApiException as e:
        assert e.status == code, (e.status, e.body)
        import json

        status = json.loads(e.body)
        assert status["kind"] == "Status" and status["reason"] == reason, status
        return status
    raise AssertionError(f"expected {code} {reason}")


def main():
    config.load_kube_config(config_file=sys.argv[1])
    v1 = client.CoreV1Api()
    apps = client.AppsV1Api()

    # Server version and the system namespaces.
    version = client.VersionApi().get_code()
    assert (version.major, version.minor) == ("1", "33"), version
    names = {n.metadata.name for n in v1.list_namespace().items}
    assert {"default", "kube-system", "kube-public", "kube-node-lease"} <= names, names

    v1.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=NS)))

    # A typed Deployment round-trips, with Kubernetes' defaults filled in.
    dep = client.V1Deployment(
        metadata=client.V1ObjectMeta(name="web", labels={"app": "web"}),
        spec=client.V1DeploymentSpec(
            replicas=2,
            selector=client.V1LabelSelector(match_labels={"app": "web"}),
            template=client.V1PodTemplateSpec(
                metadata=client.V1ObjectMeta(labels={"app": "web"}),
                spec=client.V1PodSpec(
                    containers=[client.V1Container(name="httpd", image="busybox:1.36")]
                ),
            ),
        ),
    )
    created = apps.create_namespaced_deployment(NS, dep)
    assert created.metadata.uid and created.metadata.generation == 1, created.metadata
    assert created.spec.strategy.type == "RollingUpdate", created.spec.strategy
    assert created.spec.template.spec.restart_policy == "Always"
    expect_error(409, "AlreadyExists", apps.create_namespaced_deployment, NS, dep)

    # Scale through the scale subresource, then read it back.
    apps.patch_namespaced_deployment_scale("web", NS, {"spec": {"replicas": 5}})
    assert apps.read_namespaced_deployment("web", NS).spec.replicas == 5
    assert apps.read_namespaced_deployment_scale("web", NS).spec.replicas == 5

    # A strategic merge patch (the client's default for dicts) merges
    # containers by name.
    apps.patch_namespaced_deployment(
        "web",
        NS,
        {"spec": {"template": {"spec": {"containers": [{"name": "httpd", "image": "busybox:1.37"}]}}}},
    )
    got = apps.read_namespaced_deployment("web", NS)
    assert [c.image for c in got.spec.template.spec.containers] == ["busybox:1.37"], got.spec
    assert got.metadata.generation == 3, got.metadata.generation

    # Optimistic concurrency: a replace with a stale resourceVersion is 409.
    stale = v1.create_namespaced_config_map(
        NS, client.V1ConfigMap(metadata=client.V1ObjectMeta(name="cfg"), data={"k": "1"})
    )
    fresh = v1.read_namespaced_config_map("cfg", NS)
    fresh.data["k"] = "2"
    v1.replace_namespaced_config_map("cfg", NS, fresh)
    stale.data["k"] = "3"
    status = expect_error(409, "Conflict", v1.replace_namespaced_config_map, "cfg", NS, stale)
    assert "the object has been modified" in status["message"], status
    assert v1.read_namespaced_config_map("cfg", NS).data == {"k": "2"}

    # Not found and invalid objects.
    expect_error(404, "NotFound", v1.read_namespaced_pod, "nope", NS)
    status = expect_error(
        422,
        "Invalid",
        v1.create_namespaced_pod,
        NS,
        client.V1Pod(metadata=client.V1ObjectMeta(name="Bad_Name"), spec=client.V1PodSpec(containers=[])),
    )
    fields = {c["field"] for c in status["details"]["causes"]}
    assert "metadata.name" in fields and "spec.containers" in fields, status

    # Label selectors and paging with limit/continue.
    for i in range(7):
        v1.create_namespaced_config_map(
            NS,
            client.V1ConfigMap(
                metadata=client.V1ObjectMeta(name=f"item-{i}", labels={"batch": "odd" if i % 2 else "even"}),
                data={"i": str(i)},
            ),
        )
    odd = v1.list_namespaced_config_map(NS, label_selector="batch=odd")
    assert sorted(c.metadata.name for c in odd.items) == ["item-1", "item-3", "item-5"], odd.items
    seen, cont, pages = [], None, 0
    while True:
        page = v1.list_namespaced_config_map(NS, label_selector="batch", limit=3, _continue=cont)
        pages += 1
        seen += [c.metadata.name for c in page.items]
        cont = page.metadata._continue
        if not cont:
            break
    assert pages == 3 and seen == [f"item-{i}" for i in range(7)], (pages, seen)
    one = v1.list_namespaced_config_map(NS, field_selector="metadata.name=item-4")
    assert [c.metadata.name for c in one.items] == ["item-4"], one.items

    # A Service comes back with its status (clients read resp.status) and
    # its delete answers the deleted Service, which the typed client decodes.
    svc = v1.create_namespaced_service(
        NS,
        client.V1Service(
            metadata=client.V1ObjectMeta(name="web"),
            spec=client.V1ServiceSpec(selector={"app": "web"}, ports=[client.V1ServicePort(port=80)]),
        ),
    )
    assert svc.status is not None and svc.status.load_balancer is not None, svc.status
    assert v1.read_namespaced_service("web", NS).status.load_balancer is not None
    patched = v1.patch_namespaced_service("web", NS, {"metadata": {"labels": {"tier": "front"}}})
    assert patched.status.load_balancer is not None and patched.metadata.labels == {"tier": "front"}
    gone = v1.delete_namespaced_service("web", NS)
    assert isinstance(gone, client.V1Service) and gone.metadata.name == "web", gone
    expect_error(404, "NotFound", v1.read_namespaced_service, "web", NS)

    # stringData is written into data (base64) and never returned.
    sec = v1.create_namespaced_secret(
        NS, client.V1Secret(metadata=client.V1ObjectMeta(name="creds"), string_data={"pw": "hunter2"})
    )
    assert sec.data == {"pw": "aHVudGVyMg=="} and sec.string_data is None, sec
    assert v1.read_namespaced_secret("creds", NS).data == {"pw": "aHVudGVyMg=="}

    # Delete by name, by selector (deletecollection), then the namespace.
    v1.delete_namespaced_config_map("cfg", NS)
    expect_error(404, "NotFound", v1.read_namespaced_config_map, "cfg", NS)
    v1.delete_collection_namespaced_config_map(NS, label_selector="batch=even")
    left = sorted(c.metadata.name for c in v1.list_namespaced_config_map(NS, label_selector="batch").items)
    assert left == ["item-1", "item-3", "item-5"], left
    apps.delete_namespaced_deployment("web", NS, propagation_policy="Background")
    expect_error(404, "NotFound", apps.read_namespaced_deployment, "web", NS)
    v1.delete_namespace(NS)
    print("client: ok")


if __name__ == "__main__":
    main()
