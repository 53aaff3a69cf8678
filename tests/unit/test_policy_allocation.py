"""From a need to replicas per pool: preference order, step limits and stabilization, the
bounds, and the free capacity of the nodes."""

import pytest

from pd_operator.core.capacity import free_capacity
from pd_operator.core.observe import NodeSummary, PodSummary
from pd_operator.core.policy import PoolObservation, decide
from pd_operator.core.policy_state import PolicyState
from policycases import (
    INTERVAL,
    T0,
    TWO_PREFILL_POOLS,
    calibrated,
    gpu_nodes,
    limit,
    observe,
    on_nodes,
    replicas,
    run,
    spec_of,
)


# ---------------------------------------------------------------- pools in order of preference
def test_scale_down_removes_from_the_least_preferred_pool_first():
    state = calibrated(TWO_PREFILL_POOLS, {"prefill": 1000.0, "decode": 500.0})
    decisions = run(
        TWO_PREFILL_POOLS,
        state,
        {("prefill", "a"): 3, ("prefill", "b"): 2, ("decode", "d"): 1},
        14,
        prefill={"ratio": 0.3, "tokens": 1000.0},
    )
    last = decisions[-1].replicas
    assert (last[("prefill", "a")], last[("prefill", "b")]) == (2, 0)
    first_moves = [d.replicas[("prefill", "b")] for d in decisions[10:12]]
    assert first_moves == [1, 0]


# ---------------------------------------------------------------- rate limits and bounds
def test_scale_up_moves_at_most_max_step_replicas():
    spec = spec_of({"scaling": {"scaleUp": {"stabilizationSeconds": 0, "maxStepReplicas": 2}}})
    observation = observe(
        spec,
        T0,
        {("prefill", "p"): 1, ("decode", "d"): 1},
        prefill={"ratio": 3.0, "tokens": 5000.0},
    )
    decision = decide(spec, observation, calibrated(spec, {"prefill": 1000.0, "decode": 500.0}), T0)
    assert replicas(decision) == 3
    assert limit(decision) == "rate"


def test_by_default_a_pool_may_double_in_one_step_as_the_hpa_allows():
    # A load stepped up: 12 prefill replicas, the demand of 30. Four at a time held the role
    # in breach for minutes; by default a pool may double per decision.
    wide = {"prefill.pools.0.replicas.max": 64, "decode.pools.0.replicas.max": 64}
    spec = spec_of(wide)
    state = calibrated(spec, {"prefill": 1000.0, "decode": 500.0})
    observation = observe(
        spec, T0, {("prefill", "p"): 12, ("decode", "d"): 12},
        prefill={"ratio": 3.0, "tokens": 30 * 800.0},
    )  # fmt: skip
    assert spec.scaling.scale_up.max_step_percent == 100
    assert replicas(decide(spec, observation, state, T0)) == 24
    # A spec that names its own step keeps it (no percent unless it says one).
    named = spec_of(
        {**wide, "scaling": {"scaleUp": {"stabilizationSeconds": 0, "maxStepReplicas": 4}}}
    )
    assert named.scaling.scale_up.max_step_percent is None
    assert replicas(decide(named, observation, state, T0)) == 16


def test_scale_up_stabilization_ignores_a_single_spike():
    spec = spec_of({"scaling": {"scaleUp": {"stabilizationSeconds": 60, "maxStepReplicas": 4}}})
    state = calibrated(spec, {"prefill": 1000.0, "decode": 500.0})
    calm = {"ratio": 0.7, "tokens": 1000.0}
    spike = {"ratio": 2.0, "tokens": 3000.0}
    sizes, now, current = [], T0, 2
    for load in (calm, spike, calm, spike, spike, spike):
        observation = observe(
            spec, now, {("prefill", "p"): current, ("decode", "d"): 1}, prefill=load
        )
        decision = decide(spec, observation, state, now)
        assert decision is not None
        current, state, now = replicas(decision), decision.state, now + INTERVAL
        sizes.append(current)
    # A spike right after a calm recommendation is outvoted by it within the 60 s window.
    assert sizes[:4] == [2, 2, 2, 2]
    assert sizes[4] > 2


@pytest.mark.parametrize(
    ("bounds", "current", "expected"),
    [({"min": 1, "max": 4}, 6, 4), ({"min": 3, "max": 10}, 1, 3), ({"min": 2, "max": 2}, 2, 2)],
)
def test_min_and_max_are_always_honoured(bounds, current, expected):
    spec = spec_of({"prefill.pools.0.replicas": bounds})
    for load in ({"ratio": 3.0, "tokens": 9000.0}, {"ratio": 0.2, "tokens": 10.0}):
        observation = observe(
            spec, T0, {("prefill", "p"): current, ("decode", "d"): 1}, prefill=load
        )
        decision = decide(spec, observation, PolicyState(), T0)
        assert replicas(decision) == expected


# ---------------------------------------------------------------- capacity
def test_no_replica_is_asked_for_that_no_node_can_hold():
    ledger = gpu_nodes(a=2, d=1)  # two prefill nodes free, pool a already runs 2 elsewhere
    observation = observe(
        TWO_PREFILL_POOLS,
        T0,
        {("prefill", "a"): 2, ("prefill", "b"): 0, ("decode", "d"): 1},
        ledger,
        prefill={"ratio": 3.0, "tokens": 8000.0},
    )
    state = calibrated(TWO_PREFILL_POOLS, {"prefill": 1000.0, "decode": 500.0})
    decision = decide(TWO_PREFILL_POOLS, observation, state, T0)
    assert replicas(decision, "prefill", "a") == 4
    assert replicas(decision, "prefill", "b") == 0
    assert limit(decision, "prefill", "a") == "capacity"
    assert decision is not None and decision.limited_by == "capacity"


def test_when_the_preferred_pool_is_full_the_rest_spills_to_the_next():
    ledger = gpu_nodes(a=1, b=3, d=1)
    observation = observe(
        TWO_PREFILL_POOLS,
        T0,
        {("prefill", "a"): 2, ("prefill", "b"): 0, ("decode", "d"): 1},
        ledger,
        prefill={"ratio": 1.5, "tokens": 4000.0},
    )
    state = calibrated(TWO_PREFILL_POOLS, {"prefill": 1000.0, "decode": 500.0})
    decision = decide(TWO_PREFILL_POOLS, observation, state, T0)
    assert replicas(decision, "prefill", "a") == 3
    assert replicas(decision, "prefill", "b") == 2  # 5 x 1000 at 80% = 4000


def test_unschedulable_pods_are_given_up_when_the_nodes_have_no_room():
    pending = PoolObservation(4, ready=2, unschedulable=2)
    observation = observe(
        TWO_PREFILL_POOLS,
        T0,
        {("prefill", "a"): pending, ("prefill", "b"): 0, ("decode", "d"): 1},
        gpu_nodes(b=2, d=1),
        prefill={"ratio": 1.0, "tokens": 3200.0},
    )
    state = calibrated(TWO_PREFILL_POOLS, {"prefill": 1000.0, "decode": 500.0})
    decision = decide(TWO_PREFILL_POOLS, observation, state, T0)
    assert replicas(decision, "prefill", "a") == 2
    assert replicas(decision, "prefill", "b") == 2


def test_with_no_node_view_unschedulable_pods_stay_but_none_are_added():
    pending = PoolObservation(4, ready=2, unschedulable=2)
    observation = observe(
        TWO_PREFILL_POOLS,
        T0,
        {("prefill", "a"): pending, ("prefill", "b"): 0, ("decode", "d"): 1},
        prefill={"ratio": 1.0, "tokens": 3200.0},
    )
    state = calibrated(TWO_PREFILL_POOLS, {"prefill": 1000.0, "decode": 500.0})
    decision = decide(TWO_PREFILL_POOLS, observation, state, T0)
    assert replicas(decision, "prefill", "a") == 4  # a cluster autoscaler may be adding nodes
    assert replicas(decision, "prefill", "b") == 2


def test_with_no_node_view_unschedulable_pods_go_after_a_whole_scale_down_window():
    """They count as no capacity: once a whole scale-down window has been watched, they are
    removed at the down-step, and the demand they were for stays on the pool with room."""
    pending = PoolObservation(4, ready=2, unschedulable=2)
    observation = observe(
        TWO_PREFILL_POOLS,
        T0,
        {("prefill", "a"): pending, ("prefill", "b"): 2, ("decode", "d"): 1},
        prefill={"ratio": 1.0, "tokens": 3200.0},
    )
    state = calibrated(TWO_PREFILL_POOLS, {"prefill": 1000.0, "decode": 500.0}, since=T0 - 3600)
    decision = decide(TWO_PREFILL_POOLS, observation, state, T0)
    assert replicas(decision, "prefill", "a") == 3  # one down-step
    assert replicas(decision, "prefill", "b") >= 2


def test_room_reserved_for_pods_not_yet_bound_is_not_promised_again():
    starting = PoolObservation(3, ready=2, scheduled=2)  # the third is not bound yet
    observation = observe(
        TWO_PREFILL_POOLS,
        T0,
        {("prefill", "a"): starting, ("prefill", "b"): 0, ("decode", "d"): 1},
        gpu_nodes(a=1, d=1),
        prefill={"ratio": 2.0, "tokens": 4000.0},
    )
    state = calibrated(TWO_PREFILL_POOLS, {"prefill": 1000.0, "decode": 500.0})
    decision = decide(TWO_PREFILL_POOLS, observation, state, T0)
    assert replicas(decision, "prefill", "a") == 3


def test_prefill_does_not_grow_into_a_decode_pool_that_is_full():
    observation = observe(
        TWO_PREFILL_POOLS,
        T0,
        {("prefill", "a"): 2, ("prefill", "b"): 0, ("decode", "d"): 2},
        gpu_nodes(a=4, b=4),  # no decode node free
        prefill={"ratio": 2.0, "tokens": 4000.0},
        decode={"ratio": 1.5, "tokens": 1500.0},
    )
    state = calibrated(TWO_PREFILL_POOLS, {"prefill": 1000.0, "decode": 500.0})
    decision = decide(TWO_PREFILL_POOLS, observation, state, T0)
    assert decision is not None
    assert decision.role_replicas("decode") == 2
    assert decision.role_replicas("prefill") == 2
    assert limit(decision, "prefill", "a") == "capacity"
    assert "decode cannot grow" in next(d.reason for d in decision.pools if d.pool == "a")


def test_shared_nodes_go_to_decode_first_and_are_never_promised_twice():
    spec = spec_of(
        {
            "prefill.pools.0.accelerator": on_nodes("x"),
            "decode.pools.0.accelerator": on_nodes("x"),
        }
    )
    observation = observe(
        spec,
        T0,
        {("prefill", "p"): 1, ("decode", "d"): 1},
        gpu_nodes(x=3),
        prefill={"ratio": 2.0, "tokens": 4000.0},
        decode={"ratio": 2.0, "tokens": 2000.0},
    )
    decision = decide(spec, observation, calibrated(spec, {"prefill": 1000.0, "decode": 500.0}), T0)
    assert decision is not None
    assert decision.role_replicas("decode") + decision.role_replicas("prefill") == 2 + 3
    assert decision.role_replicas("decode") == 4


def test_with_required_placement_the_autoscaler_grows_only_in_the_rack_its_pods_run_in():
    racked = {
        "prefill.pools.0.accelerator": on_nodes("x"),
        "decode.pools.0.accelerator": on_nodes("x"),
    }
    nodes = [
        NodeSummary(f"{rack}-{i}", {"g": "x", "rack": rack}, (), {"g/pu": "8"}, ready=True)
        for rack in ("r1", "r2")
        for i in range(4)
    ]
    # Prefill runs on r1-0 and r1-1, decode on r1-2: one node of r1 is left, r2 is empty.
    running = {"r1-0": "p", "r1-1": "p", "r1-2": "d"}
    pods = [
        PodSummary(f"pod-{node}", "", pool, ready=True, unschedulable=False, node_name=node,
                   requests={"g/pu": "8"})
        for node, pool in running.items()
    ]  # fmt: skip
    ledger = free_capacity(nodes, pods)
    on = {pool: frozenset(n for n, p in running.items() if p == pool) for pool in ("p", "d")}
    pools = {
        ("prefill", "p"): PoolObservation(2, 2, nodes=on["p"]),
        ("decode", "d"): PoolObservation(1, 1, nodes=on["d"]),
    }
    wanted = {}
    for placement in (None, {"topologyKey": "rack", "mode": "Required"}):
        spec = spec_of(racked | ({"placement": placement} if placement else {}))
        observation = observe(spec, T0, pools, ledger, prefill={"ratio": 3.0, "tokens": 8000.0})
        state = calibrated(spec, {"prefill": 1000.0, "decode": 500.0})
        decision = decide(spec, observation, state, T0)
        wanted[placement is not None] = (replicas(decision), limit(decision))
    assert wanted == {False: (6, "rate"), True: (3, "capacity")}
