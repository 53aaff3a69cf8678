"""Multi-node replicas in capacity: a replica of `nodesPerReplica` N is a group of N pods, placed
whole or not at all, so only whole groups count as room, and a group counts as one replica."""

from typing import Any

import pytest

from pd_operator.api import parse_pddeployment
from pd_operator.api.spec import PoolSpec
from pd_operator.core.capacity import free_capacity
from pd_operator.core.children import LABEL_GROUP_ROLE, LABEL_POOL, LABEL_ROLE
from pd_operator.core.observe import LWS_GROUP_KEY, NodeSummary, PodSummary, summarize_pod
from pd_operator.core.reconcile import (
    lost_group_nodes,
    plan_children,
    pool_observations,
    unplaceable,
)
from pdcases import minimal

GPU = "nvidia.com/gpu"


def pool(nodes: int = 2, per_replica: int = 8, **accelerator: Any) -> PoolSpec:
    fields = {"resource_name": GPU, "per_replica": per_replica, "nodes_per_replica": nodes}
    return PoolSpec.model_validate({"name": "d", "accelerator": {**fields, **accelerator}})


def node(name: str, cards: int = 8, *, ready: bool = True, **allocatable: str) -> NodeSummary:
    return NodeSummary(name, {}, (), {GPU: str(cards), **allocatable}, ready=ready)


def holding(node_name: str, cards: int) -> PodSummary:
    return PodSummary(f"other-{node_name}-{cards}", "", "", True, False, node_name, requests={
        GPU: str(cards)
    })  # fmt: skip


@pytest.mark.parametrize(
    ("nodes", "cards", "taken", "groups"),
    [
        (2, 8, {}, 2),  # 4 free nodes of 8 cards
        (2, 8, {"a": 8}, 1),  # 3 free nodes: one group, the third node alone holds none
        (2, 8, {"a": 8, "b": 8, "c": 8}, 0),  # one free node is half a group
        (2, 4, {}, 4),  # 4-card pods: 2 per node, 8 slots, 4 groups
        (2, 4, {"a": 4, "b": 4, "c": 4}, 2),  # 1+1+1+2 slots
        (3, 8, {}, 1),  # 4 slots, 3 per group
        (4, 8, {"d": 1}, 0),  # a node with 7 free cards is no slot for an 8-card pod
        (1, 8, {"a": 4}, 3),  # single-node pools unchanged
    ],
    ids=[
        "four-free-nodes",
        "odd-node-left-over",
        "half-a-group",
        "two-pods-share-a-node",
        "fragments",
        "three-node-groups",
        "one-card-short",
        "single-node",
    ],
)
def test_room_is_whole_groups(nodes, cards, taken, groups):
    fleet = [node(name) for name in "abcd"]
    used = [holding(name, count) for name, count in taken.items()]
    room = free_capacity(fleet, used)
    assert room.fits(pool(nodes=nodes, per_replica=cards)) == groups


def test_taking_a_group_takes_its_nodes_whole_and_never_half_a_group():
    room = free_capacity([node("a"), node("b"), node("c")], [])
    groups = pool(nodes=2)
    after = room.take(groups, 5)  # asks for 5: only one group fits
    assert after.fits(groups) == 0
    single = pool(nodes=1)
    assert after.fits(single) == 1  # the third node is still free: no half group holds it
    assert room.take(groups, 0) == room


def test_pools_sharing_nodes_are_not_promised_the_same_nodes():
    room = free_capacity([node(n) for n in "abcd"], [])
    after = room.take(pool(nodes=3), 1)
    assert after.fits(pool(nodes=2)) == 0
    assert after.fits(pool(nodes=1)) == 1


@pytest.mark.parametrize(
    ("fleet", "expected"),
    [
        ([node("a"), node("b")], None),
        ([node("a"), node("b", ready=False)], "a replica needs 2 nodes x 8 nvidia.com/gpu"),
        ([node("a")], "a replica needs 2 nodes x 8 nvidia.com/gpu"),
        ([node("a", cards=16)], None),  # two 8-card pods on one 16-card node
    ],
    ids=["two-nodes", "one-ready", "one-node", "one-big-node"],
)
def test_shortage_of_not_ready_groups_names_the_nodes_a_group_needs(fleet, expected):
    why = free_capacity(fleet, []).shortage(pool(nodes=2), not_ready=1, unschedulable=0)
    if expected is None:
        assert why is None
    else:
        assert why is not None and expected in why and "fewer than 2" in why


def test_unschedulable_groups_are_compared_with_room_in_groups():
    room = free_capacity([node(n) for n in "abc"], [])
    assert room.shortage(pool(nodes=2), not_ready=1, unschedulable=1) is None
    why = room.shortage(pool(nodes=2), not_ready=2, unschedulable=2)
    assert why == "2 pod(s) cannot be scheduled, room for 1"


@pytest.mark.parametrize(
    ("nodes", "per_replica", "fleet", "expected"),
    [
        (2, 8, ["8", "8"], None),
        (2, 8, ["8"], "a replica needs 2 nodes x 8 nvidia.com/gpu: the nodes matching "
         "nodeSelector {any} (and tolerating its taints) have room for 1 such pod(s) in all"),
        (2, 8, ["16"], None),  # both pods on one node that has room for both
        (2, 4, ["4", "2"], "room for 1 such pod(s)"),
        (4, 8, ["8", "8", "8"], "a replica needs 4 nodes x 8 nvidia.com/gpu"),
        (2, 8, ["4", "4"], "offers 8 nvidia.com/gpu per replica; the largest such node has 4"),
        (1, 8, ["8"], None),
    ],
    ids=["fits", "one-node", "big-node", "fragments", "four-nodes", "too-small", "single"],
)  # fmt: skip
def test_a_group_that_can_never_fit_is_unplaceable(nodes, per_replica, fleet, expected):
    summaries = [node(f"n{i}", int(cards)) for i, cards in enumerate(fleet)]
    why = unplaceable(pool(nodes=nodes, per_replica=per_replica), summaries)
    if expected is None:
        assert why is None
    else:
        assert why is not None and expected in why


def test_a_group_needs_each_pods_devices_on_its_node():
    hca = "rdma/hca"
    wants = pool(nodes=2, devices={hca: 1})
    assert unplaceable(wants, [node("a", **{hca: "1"}), node("b", **{hca: "1"})]) is None
    why = unplaceable(wants, [node("a", **{hca: "1"}), node("b", **{hca: "0"})])
    assert why is not None and "2 nodes x 8 nvidia.com/gpu and 1 rdma/hca" in why


def test_plan_does_not_roll_out_a_multi_node_pool_that_can_never_fit():
    document = minimal()
    document["metadata"].update(namespace="ns", uid="uid-1", generation=1)
    document["spec"]["decode"]["pools"][0]["accelerator"].update(nodesPerReplica=2, perReplica=8)
    plan = plan_children(parse_pddeployment(document), {}, [node("a")])
    assert [(p.reason, p.message.split(":")[0]) for p in plan.problems] == [
        ("NoNodeFits", "decode pool d")
    ]
    assert "2 nodes x 8 nvidia.com/gpu" in plan.problems[0].message


def lws_pod(
    name: str, group: str, *, leader: bool, node_name: str = "", **status: bool
) -> PodSummary:
    """A pod of a decode group: only the leader carries the role label."""
    return PodSummary(
        name,
        role="decode" if leader else "",
        pool="d",
        ready=False,
        unschedulable=status.get("unschedulable", False),
        node_name=node_name,
        terminating=status.get("terminating", False),
        group_role="decode",
        group=group,
    )


@pytest.mark.parametrize(
    ("pods", "scheduled", "unschedulable"),
    [
        ([], 0, 0),
        (
            [lws_pod("g0", "k0", leader=True, node_name="a"),
             lws_pod("g0-1", "k0", leader=False, node_name="b")],
            1, 0,
        ),
        (  # the worker is not bound yet: the group holds no room
            [lws_pod("g0", "k0", leader=True, node_name="a"), lws_pod("g0-1", "k0", leader=False)],
            0, 0,
        ),
        (  # both pods unschedulable: one replica
            [lws_pod("g0", "k0", leader=True, unschedulable=True),
             lws_pod("g0-1", "k0", leader=False, unschedulable=True)],
            0, 1,
        ),
        (  # a worker alone unschedulable (a leader-only label would miss it)
            [lws_pod("g0", "k0", leader=True, node_name="a"),
             lws_pod("g0-1", "k0", leader=False, unschedulable=True),
             lws_pod("g1", "k1", leader=True, node_name="c"),
             lws_pod("g1-1", "k1", leader=False, node_name="d")],
            1, 1,
        ),
        (  # a terminating worker is going away
            [lws_pod("g0", "k0", leader=True, node_name="a"),
             lws_pod("g0-1", "k0", leader=False, node_name="b", terminating=True)],
            0, 0,
        ),
    ],
    ids=["none", "bound", "half-bound", "unschedulable", "worker-unschedulable", "terminating"],
)  # fmt: skip
def test_a_group_is_one_replica_in_pool_observations(pods, scheduled, unschedulable):
    document = minimal()
    document["metadata"].update(namespace="ns", uid="uid-1", generation=1)
    document["spec"]["decode"]["pools"][0]["accelerator"].update(nodesPerReplica=2)
    document["spec"]["decode"]["pools"][0]["replicas"] = {"min": 2, "max": 4}
    pdd = parse_pddeployment(document)
    seen = pool_observations(pdd, {}, pods, count_bound=True)[("decode", "d")]
    assert (seen.replicas, seen.scheduled, seen.unschedulable) == (2, scheduled, unschedulable)


def test_a_worker_pod_is_summarized_with_its_role_and_group():
    labels = {LABEL_GROUP_ROLE: "decode", LABEL_POOL: "d", LWS_GROUP_KEY: "abc"}
    summary = summarize_pod({"metadata": {"name": "w", "labels": labels}, "spec": {}})
    assert (summary.role, summary.group_role, summary.group) == ("", "decode", "abc")
    leader = summarize_pod(
        {"metadata": {"name": "l", "labels": {**labels, LABEL_ROLE: "decode"}}, "spec": {}}
    )
    assert (leader.role, leader.group_role, leader.group) == ("decode", "decode", "abc")


def test_a_node_lost_from_a_group_is_reported():
    document = minimal()
    document["metadata"].update(namespace="ns", uid="uid-1", generation=1)
    document["spec"]["decode"]["pools"][0]["accelerator"].update(nodesPerReplica=2)
    pdd = parse_pddeployment(document)
    pods = [
        lws_pod("minimal-decode-d-0", "k0", leader=True, node_name="a"),
        lws_pod("minimal-decode-d-0-1", "k0", leader=False, node_name="b"),
        lws_pod("minimal-decode-d-1", "k1", leader=True, node_name="c"),
        lws_pod("minimal-decode-d-1-1", "k1", leader=False, node_name="d"),
    ]
    fleet = [node("a"), node("b", ready=False), node("c")]  # b NotReady, d gone
    assert lost_group_nodes(pdd, pods, fleet) == [
        "decode pool d: the group of minimal-decode-d-0 lost node(s) b (minimal-decode-d-0-1): "
        "the replica serves nothing until its group is recreated",
        "decode pool d: the group of minimal-decode-d-1 lost node(s) d (minimal-decode-d-1-1): "
        "the replica serves nothing until its group is recreated",
    ]
    assert lost_group_nodes(pdd, pods, [node(n) for n in "abcd"]) == []
