"""The offline replay with multi-node replicas (`accelerator.nodesPerReplica`): the simulated fleet
places a replica's group whole or not at all, and counts its cards over all its nodes, as the
operator's capacity ledger and the mock scheduler do."""

from dataclasses import dataclass
from typing import Any

from pd_operator.core.children import PoolKey
from pd_operator.core.hardware import HARDWARE_PROFILES, MODEL_PROFILES
from pd_tools.enginesim.engine import ReplicaSpec, Role, State
from pd_tools.replay.cluster import Cluster, NodeType
from pd_tools.replay.fleet import Fleet
from policycases import PROFILED_CHANGES, spec_of

DECODE: PoolKey = ("decode", "d")
MODEL = MODEL_PROFILES["glm-4.5-fp8"]
TWO_NODE_DECODE = {
    **PROFILED_CHANGES,
    "decode.pools.0.accelerator.nodesPerReplica": 2,
    "decode.pools.0.replicas": {"min": 1, "max": 4},
}


@dataclass
class Idle:
    """An engine instance with no work: removed, it is gone at once."""

    role: Role
    state: State = State.READY
    running: int = 0
    waiting: int = 0

    def in_flight(self) -> list[Any]:
        return []


class Engine:
    """The engine at the fleet's boundary: which replicas it runs, on what spec."""

    def __init__(self) -> None:
        self.now_s = 0.0
        self.specs: dict[str, ReplicaSpec] = {}
        self.instances: dict[str, Idle] = {}

    def add_instance(self, name: str, role: Role, spec: Any, *, ready_after_s: float) -> None:
        self.specs[name] = spec
        self.instances[name] = Idle(role)

    def instance(self, name: str) -> Idle:
        return self.instances[name]

    def remove_instance(self, name: str) -> None:
        self.instances[name].state = State.GONE


def fleet_on(h200_nodes: int) -> tuple[Fleet, Engine]:
    spec = spec_of(TWO_NODE_DECODE)
    cluster = Cluster((NodeType("mtt-s5000", 4), NodeType("h200", h200_nodes)))
    return Fleet(spec, MODEL, cluster, None), Engine()


def test_a_group_takes_two_nodes_and_a_third_node_is_half_a_group():
    fleet, engine = fleet_on(3)
    assert fleet.room()[DECODE] == 1
    fleet.apply(engine, {DECODE: 2}, warm_up=False)  # type: ignore[arg-type]
    (replica,) = fleet.live[DECODE]
    assert len(set(replica.nodes)) == 2
    assert fleet.pending[DECODE] == 1  # the second group waits whole
    h200 = [i for i, kind in enumerate(fleet.node_type) if kind == "h200"]
    assert sorted(fleet.free[i] for i in h200) == [0, 0, 8]  # nothing held by a half group
    observed = fleet.observation(engine, {})  # type: ignore[arg-type]
    assert (observed.pools[DECODE].replicas, observed.pools[DECODE].unschedulable) == (2, 1)
    assert observed.capacity is not None and observed.capacity.fits(fleet.pools[DECODE]) == 0


def test_a_replica_runs_on_the_cards_of_all_its_nodes_and_gives_them_all_back():
    fleet, engine = fleet_on(4)
    fleet.apply(engine, {DECODE: 2}, warm_up=False)  # type: ignore[arg-type]
    sixteen = ReplicaSpec.from_profiles(HARDWARE_PROFILES["h200"], MODEL, 16)
    assert [engine.specs[r.name] for r in fleet.live[DECODE]] == [sixteen, sixteen]
    assert fleet.cards_by_type()["h200"] == 32
    fleet.apply(engine, {DECODE: 1}, warm_up=False)  # type: ignore[arg-type]
    fleet.release_drained(engine)  # type: ignore[arg-type]
    assert fleet.cards_by_type()["h200"] == 16
    assert fleet.room()[DECODE] == 2


def test_a_cluster_holds_a_group_only_with_enough_nodes():
    spec = spec_of(TWO_NODE_DECODE)
    (decode,) = spec.decode.pools
    assert Cluster((NodeType("h200", 2),)).holds(decode)
    assert not Cluster((NodeType("h200", 1),)).holds(decode)
    assert Cluster((NodeType("h200", 1, 16),)).holds(decode)  # two 8-card pods on one node
    missing = Cluster((NodeType("mtt-s5000", 2), NodeType("h200", 1))).missing_role(spec)
    assert "d (h200, 2 nodes x 8 cards)" in missing and "h200=2x8" in missing
    fitting = Cluster.fitting(spec)
    assert {t.profile: t.nodes for t in fitting.node_types}["h200"] == 8  # 4 groups of 2
