"""The official python client against skiff: list, then watch from the
list's resourceVersion; every later change arrives once and in order; a
watch resumed after a disconnect continues where it stopped; a watch from a
compacted revision gets 410 Gone; a live watch sees changes as they are made.
The test's ConfigMaps carry a label and every list and watch selects it, so
what controllers add to the namespace (kube-root-ca.crt) stays out of view.

Usage: watch_test.py KUBECONFIG  (the server must compact every second)
"""

import sys
import threading
import time

from kubernetes import client, config, watch
from kubernetes.client.rest import ApiException

NS = "watch-test"
LABEL = "test=watch"


def events(v1, rv, count, timeout=10):
    """Up to `count` (type, name, data, resourceVersion) events after rv."""
    got = []
    w = watch.Watch()
    for ev in w.stream(v1.list_namespaced_config_map, NS, resource_version=rv, label_selector=LABEL, timeout_seconds=timeout):
        o = ev["object"]
        got.append((ev["type"], o.metadata.name, (o.data or {}).get("v"), o.metadata.resource_version))
        if len(got) == count:
            w.stop()
            break
    return got


def main():
    config.load_kube_config(config_file=sys.argv[1])
    v1 = client.CoreV1Api()
    v1.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=NS)))
    first = v1.list_namespaced_config_map(NS, label_selector=LABEL)
    assert first.items == [], first.items
    rv0 = first.metadata.resource_version

    def cm(name, v):
        return client.V1ConfigMap(metadata=client.V1ObjectMeta(name=name, labels={"test": "watch"}), data={"v": v})

    v1.create_namespaced_config_map(NS, cm("a", "1"))
    v1.create_namespaced_config_map(NS, cm("b", "1"))
    v1.replace_namespaced_config_map("a", NS, cm("a", "2"))
    v1.delete_namespaced_config_map("b", NS)
    v1.patch_namespaced_config_map("a", NS, {"data": {"v": "3"}})

    # Two events, then the connection is dropped.
    part1 = events(v1, rv0, 2)
    assert [(t, n, d) for t, n, d, _ in part1] == [("ADDED", "a", "1"), ("ADDED", "b", "1")], part1
    # Resume from the last event seen: the rest, nothing repeated.
    part2 = events(v1, part1[-1][3], 3)
    assert [(t, n, d) for t, n, d, _ in part2] == [("MODIFIED", "a", "2"), ("DELETED", "b", "1"), ("MODIFIED", "a", "3")], part2
    revs = [int(r) for *_, r in part1 + part2]
    assert revs == sorted(revs) and len(set(revs)) == len(revs), revs

    # A watch from the start sees the same five events in the same order.
    again = events(v1, rv0, 5)
    assert [e[:3] for e in again] == [e[:3] for e in part1 + part2], again

    # A live watch sees changes made while it runs, in order.
    rv_live = v1.list_namespaced_config_map(NS, label_selector=LABEL).metadata.resource_version
    live = []
    t = threading.Thread(target=lambda: live.extend(events(v1, rv_live, 3, timeout=20)))
    t.start()
    time.sleep(0.5)
    v1.create_namespaced_config_map(NS, cm("c", "1"))
    v1.patch_namespaced_config_map("c", NS, {"data": {"v": "2"}})
    v1.delete_namespaced_config_map("c", NS)
    t.join(30)
    assert [e[:3] for e in live] == [("ADDED", "c", "1"), ("MODIFIED", "c", "2"), ("DELETED", "c", "2")], live

    # After compaction (the server keeps one second), the old revision is gone.
    time.sleep(3.5)
    v1.patch_namespaced_config_map("a", NS, {"data": {"v": "4"}})
    time.sleep(2.5)
    try:
        late = events(v1, rv0, 1, timeout=5)
    except ApiException as e:
        assert e.status == 410, e
        print("watch: ok")
        return
    raise AssertionError(f"expected 410 Gone, got {late}")


if __name__ == "__main__":
    main()
