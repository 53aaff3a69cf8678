"""The watch cache keeps the newest version the operator knows, its own writes included."""

from typing import Any

from pd_operator.adapters.cache import ClusterCache


def pdd(version: str, uid: str = "u1", phase: str = "") -> dict[str, Any]:
    return {
        "apiVersion": "pdoperator.io/v1alpha1",
        "kind": "PDDeployment",
        "metadata": {"namespace": "ns", "name": "m", "uid": uid, "resourceVersion": version},
        "status": {"phase": phase},
    }


def test_an_event_queued_before_our_status_write_does_not_bring_the_old_status_back():
    cache = ClusterCache()
    cache.put_pdd(pdd("10"))
    cache.refresh_pdd(pdd("12", phase="Stalled"))
    cache.put_pdd(pdd("11"))  # the watch event of an earlier change, delivered late
    assert cache.pdd(("ns", "m"))["status"]["phase"] == "Stalled"
    cache.put_pdd(pdd("13", phase="Ready"))
    assert cache.pdd(("ns", "m"))["status"]["phase"] == "Ready"


def test_our_write_after_the_deletion_event_does_not_bring_the_object_back():
    cache = ClusterCache()
    cache.put_pdd(pdd("10"))
    cache.put_pdd(pdd("10"), deleted=True)
    cache.refresh_pdd(pdd("12", phase="Stalled"))
    assert cache.pdd(("ns", "m")) is None
    assert cache.pdd_keys() == []


def test_a_recreated_object_replaces_the_old_one_whatever_its_version():
    cache = ClusterCache()
    cache.put_pdd(pdd("20", uid="old"))
    cache.refresh_pdd(pdd("30", uid="new", phase="Stalled"))  # not the one we know: ignored
    assert cache.pdd(("ns", "m"))["metadata"]["uid"] == "old"
    cache.put_pdd(pdd("5", uid="new"))  # another uid is never "older"
    assert cache.pdd(("ns", "m"))["metadata"]["uid"] == "new"


def test_a_child_we_applied_is_not_replaced_by_an_earlier_event():
    cache = ClusterCache()
    child = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {
            "namespace": "ns",
            "name": "m-prefill",
            "uid": "c1",
            "labels": {"pdoperator.io/deployment": "m"},
            "ownerReferences": [{"kind": "PDDeployment", "uid": "u1", "controller": True}],
        },
    }
    for version, replicas in (("7", 3), ("6", 1)):
        meta = {**child["metadata"], "resourceVersion": version}
        cache.put_child({**child, "metadata": meta, "spec": {"replicas": replicas}})
    cache.put_pdd(pdd("1"))
    (kept,) = cache.snapshot(("ns", "m")).children.values()
    assert kept["spec"]["replicas"] == 3
