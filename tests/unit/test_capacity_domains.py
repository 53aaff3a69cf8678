"""Free capacity per topology domain: with placement Required a PDDeployment grows only where its
pods run, or, with none running, in the one domain with the most room for it."""

from typing import Any

import pytest

from pd_operator.api import PDDeployment, parse_pddeployment
from pd_operator.core.capacity import free_capacity
from pd_operator.core.decision import Observation, PoolObservation
from pd_operator.core.external import decide_external
from pd_operator.core.observe import NodeSummary, PodSummary
from pdcases import minimal

GPU = "nvidia.com/gpu"
RACK = "example.com/rack"


def deployment(
    mode: str | None, *, prefill_group: str = "", decode_group: str = ""
) -> PDDeployment:
    """Prefill replicas of 8 cards, decode replicas of 4, up to 10 each."""
    document = minimal()
    document["metadata"].update(namespace="ns", uid="uid-1")
    spec = document["spec"]
    if mode is not None:
        spec["placement"] = {"topologyKey": RACK, "mode": mode}
    for role, cards, group in (("prefill", 8, prefill_group), ("decode", 4, decode_group)):
        pool = spec[role]["pools"][0]
        pool["accelerator"] = {"resourceName": GPU, "perReplica": cards}
        if group:
            pool["accelerator"]["nodeSelector"] = {"g": group}
        pool["replicas"] = {"min": 0, "max": 10}
    return parse_pddeployment(document)


def node(
    name: str, rack: str | None, *, group: str = "h200", cordoned: bool = False
) -> NodeSummary:
    labels = {"g": group} | ({RACK: rack} if rack else {})
    return NodeSummary(name, labels, (), {GPU: "8"}, ready=True, unschedulable=cordoned)


def decode_pod(node_name: str) -> PodSummary:
    return PodSummary(
        f"d-{node_name}", "decode", "d", ready=True, unschedulable=False, node_name=node_name,
        requests={GPU: "4"},
    )  # fmt: skip


# Rack a: two nodes and a cordoned one; rack b: three nodes; x1 has no rack label.
NODES = [
    node("a1", "a"),
    node("a2", "a"),
    node("a3", "a", cordoned=True),
    node("b1", "b"),
    node("b2", "b"),
    node("b3", "b"),
    node("x1", None),
]


def fits(pdd: PDDeployment, running: list[str], role: str = "prefill") -> int:
    capacity = free_capacity(NODES, [decode_pod(n) for n in running])
    room = capacity.in_domain(pdd.spec, set(running))
    return room.fits(pdd.spec.pools(role)[0])


@pytest.mark.parametrize(
    ("mode", "running", "prefill", "decode"),
    [
        (None, [], 6, 12),  # every schedulable node
        ("Preferred", ["a1"], 5, 11),  # a preference never shrinks the room
        ("Required", ["a1"], 1, 3),  # a2 whole, a1's other half
        ("Required", ["a1", "b1"], 3, 8),  # pods in two racks: both racks' room
        ("Required", [], 3, 6),  # none running: the rack with the most room (b)
        ("Required", ["x1"], 3, 6),  # a node without the label is in no domain
        ("Required", ["a3"], 2, 4),  # a cordoned node still says where the pods are
    ],
    ids=["none", "preferred", "required", "two-racks", "fresh", "unlabelled", "cordoned"],
)
def test_required_placement_counts_only_the_domain_the_pods_run_in(mode, running, prefill, decode):
    pdd = deployment(mode)
    assert fits(pdd, running, "prefill") == prefill
    assert fits(pdd, running, "decode") == decode


def test_a_fresh_deployment_takes_the_domain_that_holds_both_roles_over_a_bigger_one():
    pdd = deployment("Required", prefill_group="s5000", decode_group="h200")
    nodes = [node("a1", "a", group="s5000"), node("a2", "a")] + [
        node(f"b{i}", "b") for i in range(3)
    ]
    room = free_capacity(nodes, []).in_domain(pdd.spec, set())
    assert [r.node.name for r in room.rooms] == ["a1", "a2"]


def test_ties_go_to_the_first_domain_by_name():
    nodes = [node("n1", "rack-2"), node("n2", "rack-1")]
    room = free_capacity(nodes, []).in_domain(deployment("Required").spec, set())
    assert [r.node.name for r in room.rooms] == ["n2"]


def test_a_domain_ledger_stays_a_ledger_after_take():
    pdd = deployment("Required")
    decode = pdd.spec.decode.pools[0]
    room = free_capacity(NODES, [decode_pod("a1")]).in_domain(pdd.spec, {"a1"})
    after = room.take(decode, 2)
    assert after.fits(decode) == 1
    assert after.in_domain(pdd.spec, {"a1"}).fits(decode) == 1


def test_the_decision_s_view_of_room_comes_from_the_nodes_its_pools_run_on():
    pdd = deployment("Required")
    capacity = free_capacity(NODES, [decode_pod("a1")])
    pools = {("decode", "d"): PoolObservation(1, 1, nodes=frozenset({"a1"}))}
    room = Observation({}, pools, capacity).room(pdd.spec)
    assert room is not None
    assert sorted(r.node.name for r in room.rooms) == ["a1", "a2"]
    assert Observation({}, pools, None).room(pdd.spec) is None


def test_an_external_request_is_held_to_the_room_of_its_domain():
    pdd = deployment("Required")
    capacity = free_capacity(NODES, [decode_pod("a1")])
    pools: dict[Any, PoolObservation] = {
        ("prefill", "p"): PoolObservation(0, 0),
        ("decode", "d"): PoolObservation(1, 1, nodes=frozenset({"a1"})),
    }
    decision = decide_external(pdd, {"prefill": 3, "decode": 1}, pools, capacity)
    outcome = decision.roles["prefill"]
    # Rack a holds one more 8-card replica (a2); rack b's three free nodes are out of reach.
    assert (outcome.replicas, outcome.limited_by) == (1, "capacity")
    unplaced = deployment(None)
    assert (
        decide_external(unplaced, {"prefill": 3, "decode": 1}, pools, capacity).replicas[
            ("prefill", "p")
        ]
        == 3
    )
