"""Free capacity: how many more replicas of a pool fit on the nodes, and no card promised twice."""

from decimal import Decimal
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pd_operator.adapters.cache import ClusterCache
from pd_operator.api.spec import PoolSpec
from pd_operator.core.capacity import free_capacity, replica_request
from pd_operator.core.observe import NodeSummary, PodSummary, pod_requests

GPU = "nvidia.com/gpu"


def pool(per_replica: int = 8, group: str = "h200", **extra: Any) -> PoolSpec:
    accelerator = {"resource_name": GPU, "per_replica": per_replica, "node_selector": {"g": group}}
    accelerator.update(extra.pop("accelerator", {}))
    return PoolSpec.model_validate({"name": "p", "accelerator": accelerator, **extra})


def node(
    name: str,
    cards: int = 8,
    group: str = "h200",
    *,
    ready: bool = True,
    cordoned: bool = False,
    taints: tuple[dict[str, str], ...] = (),
    **allocatable: str,
) -> NodeSummary:
    return NodeSummary(
        name=name,
        labels={"g": group},
        taints=taints,
        allocatable={GPU: str(cards), **allocatable},
        ready=ready,
        unschedulable=cordoned,
    )


def bound(node_name: str, cards: int, **requests: str) -> PodSummary:
    return PodSummary(
        name=f"pod-on-{node_name}-{cards}",
        role="",
        pool="",
        ready=True,
        unschedulable=False,
        node_name=node_name,
        requests={GPU: str(cards), **requests},
    )


@pytest.mark.parametrize(
    ("nodes", "pods", "expected"),
    [
        ([node("a"), node("b")], [], 2),
        ([node("a"), node("b", group="s5000")], [], 1),  # selector
        ([node("a"), node("b", ready=False)], [], 1),  # NotReady
        ([node("a"), node("b", cordoned=True)], [], 1),  # kubectl cordon
        ([node("a", taints=({"key": "gpu", "effect": "NoSchedule"},))], [], 0),  # untolerated
        ([node("a", taints=({"key": "gpu", "effect": "PreferNoSchedule"},))], [], 1),
        ([node("a"), node("b")], [bound("a", 8)], 1),  # a bound pod uses its cards
        ([node("a"), node("b")], [bound("a", 4), bound("b", 4)], 0),  # 4+4 free is not one 8
        ([node("a", cards=16)], [bound("a", 4)], 1),
        ([node("a")], [bound("elsewhere", 8)], 1),  # pods on other nodes do not count
    ],
    ids=[
        "two-free-nodes",
        "selector",
        "not-ready",
        "cordoned",
        "taint-not-tolerated",
        "soft-taint-ignored",
        "bound-pod",
        "fragments-do-not-add-up",
        "remainder-of-a-big-node",
        "other-nodes",
    ],
)
def test_replicas_that_fit(nodes, pods, expected):
    assert free_capacity(nodes, pods).fits(pool()) == expected


def test_a_tolerated_taint_admits_the_pool():
    tainted = node("a", taints=({"key": "gpu", "value": "h200", "effect": "NoSchedule"},))
    tolerant = pool(accelerator={"tolerations": [{"key": "gpu", "operator": "Exists"}]})
    assert free_capacity([tainted], []).fits(tolerant) == 1


def test_terminating_pods_still_hold_their_cards():
    leaving = PodSummary(
        "old", "", "", False, False, node_name="a", terminating=True, requests={GPU: "8"}
    )
    assert free_capacity([node("a")], [leaving]).fits(pool()) == 0


def test_unbound_pods_take_no_room():
    pending = PodSummary("new", "", "", False, True, requests={GPU: "8"})
    assert free_capacity([node("a")], [pending]).fits(pool()) == 1


def test_cpu_and_memory_requests_limit_replicas_per_node():
    big = node("a", cards=8, cpu="16", memory="256Gi")
    hungry = pool(
        per_replica=1, template={"resources": {"requests": {"cpu": "6", "memory": "64Gi"}}}
    )
    assert free_capacity([big], []).fits(hungry) == 2  # CPU: 16 // 6
    used = [bound("a", 0, cpu="4")]
    assert free_capacity([big], used).fits(hungry) == 2  # 12 // 6
    assert free_capacity([big], [bound("a", 0, memory="200Gi")]).fits(hungry) == 0


def test_a_limit_without_request_counts_as_the_request():
    limited = pool(per_replica=1, template={"resources": {"limits": {"cpu": "8"}}})
    assert replica_request(limited)["cpu"] == 8
    assert free_capacity([node("a", cpu="16")], []).fits(limited) == 2


def test_the_node_pod_limit_counts():
    full = node("a", cards=8, pods="1")
    assert free_capacity([full], [bound("a", 0)]).fits(pool(per_replica=1)) == 0
    assert free_capacity([node("a", pods="3")], [bound("a", 0)]).fits(pool(per_replica=1)) == 2


def test_pools_sharing_nodes_are_not_promised_the_same_cards():
    prefill, decode = pool(per_replica=4), pool(per_replica=4)
    ledger = free_capacity([node("a"), node("b")], [])
    assert ledger.fits(prefill) == ledger.fits(decode) == 4
    after = ledger.take(prefill, 3)
    assert after.fits(decode) == 1
    assert ledger.fits(decode) == 4  # the ledger is immutable


def test_best_fit_keeps_a_whole_node_for_a_bigger_replica():
    small, large = pool(per_replica=4), pool(per_replica=8)
    ledger = free_capacity([node("a", cards=8), node("b", cards=4)], [])
    assert ledger.take(small, 1).fits(large) == 1


def test_take_places_only_what_fits():
    ledger = free_capacity([node("a")], [])
    assert ledger.take(pool(), 5).fits(pool(per_replica=1)) == 0


@given(
    cards=st.lists(st.integers(0, 16), min_size=1, max_size=6),
    used=st.lists(st.integers(0, 16), min_size=6, max_size=6),
    per_replica=st.integers(1, 8),
    taken=st.integers(0, 20),
)
def test_take_removes_exactly_what_it_places(cards, used, per_replica, taken):
    nodes = [node(f"n{i}", c) for i, c in enumerate(cards)]
    pods = [bound(f"n{i}", u) for i, u in enumerate(used[: len(cards)])]
    ledger = free_capacity(nodes, pods)
    expected = sum(max(0, c - u) // per_replica for c, u in zip(cards, used, strict=False))
    assert ledger.fits(pool(per_replica)) == expected
    assert ledger.take(pool(per_replica), taken).fits(pool(per_replica)) == max(0, expected - taken)


# What a pod holds, as the scheduler counts it: every container, not the last one read.
def _pod(containers, init=(), overhead=None, node_name="n1", phase="Running", name="x"):
    return {
        "metadata": {"name": name, "namespace": "other"},
        "spec": {
            "nodeName": node_name,
            "containers": [{"name": f"c{i}", "resources": r} for i, r in enumerate(containers)],
            "initContainers": list(init),
            **({"overhead": overhead} if overhead else {}),
        },
        "status": {"phase": phase},
    }


def test_pod_requests_sum_containers_and_take_limits_as_requests():
    spec = _pod([
        {"requests": {"cpu": "500m", "memory": "1Gi"}},
        {"limits": {GPU: "4", "cpu": "1"}},  # limits only: they are the requests
    ])["spec"]  # fmt: skip
    assert pod_requests(spec) == {
        "cpu": Decimal("1.5"), "memory": Decimal(2**30), GPU: Decimal(4)
    }  # fmt: skip


def test_pod_requests_count_init_peak_sidecars_and_overhead():

    spec = _pod(
        [{"requests": {"cpu": "1"}}],
        init=[
            {"name": "setup", "resources": {"requests": {"cpu": "3", GPU: "8"}}},
            {"name": "proxy", "restartPolicy": "Always", "resources": {"requests": {"cpu": "1"}}},
        ],
        overhead={"cpu": "250m"},
    )["spec"]
    # containers + sidecar = 2 CPUs < the setup container's 3; the overhead comes on top.
    assert pod_requests(spec) == {"cpu": Decimal("3.25"), GPU: Decimal(8)}


def test_other_workloads_pods_hold_capacity_until_they_finish():

    cache = ClusterCache()
    cache.put_node({
        "metadata": {"name": "n1", "labels": {"g": "h200"}},
        "spec": {},
        "status": {
            "allocatable": {GPU: "8", "cpu": "32", "memory": "256Gi", "pods": "110"},
            "conditions": [{"type": "Ready", "status": "True"}],
        },
    })  # fmt: skip
    training = _pod([{"limits": {GPU: "8"}}], name="training")
    cache.put_other_pod(training)
    cache.put_other_pod(_pod([{"limits": {GPU: "8"}}], node_name="", name="pending"))
    assert free_capacity(cache.nodes(), cache.all_pods()).fits(pool()) == 0
    cache.put_other_pod({**training, "status": {"phase": "Succeeded"}})
    assert free_capacity(cache.nodes(), cache.all_pods()).fits(pool()) == 1
    cache.put_other_pod(training)
    cache.put_other_pod(training, deleted=True)
    assert free_capacity(cache.nodes(), cache.all_pods()).fits(pool()) == 1
