"""The offline replay's scale-down: which replica goes (the ReplicaSet's default, or pd-operator's
least-work mark) and what the removed replicas were doing (`replay/fleet.py`).

The engine is a stand-in here (the adapter boundary of the fleet): the test sets each replica's
running sequences directly, which the real engine's router does not let a test choose."""

from dataclasses import dataclass, field
from typing import Any

import pytest

from pd_operator.core.children import PoolKey
from pd_operator.core.hardware import MODEL_PROFILES
from pd_tools.enginesim.engine import Role, State
from pd_tools.replay.cluster import Cluster
from pd_tools.replay.fleet import Fleet, RemovalOrder
from policycases import PROFILED_CHANGES, spec_of

DECODE: PoolKey = ("decode", "d")


@dataclass
class Finishing:
    finish_s: float


@dataclass
class StandIn:
    name: str
    role: Role
    state: State = State.READY
    running_requests: list[tuple[Finishing, int]] = field(default_factory=list)
    waiting: int = 0

    @property
    def running(self) -> int:
        return len(self.running_requests)

    def in_flight(self) -> list[tuple[Finishing, int]]:
        return list(self.running_requests)

    def done_with(self, req: Finishing) -> float:
        return req.finish_s


class StandInEngine:
    def __init__(self) -> None:
        self.now_s = 0.0
        self.instances: dict[str, StandIn] = {}

    def add_instance(self, name: str, role: Role, spec: Any, *, ready_after_s: float) -> None:
        self.instances[name] = StandIn(name, role)

    def instance(self, name: str) -> StandIn:
        return self.instances[name]

    def remove_instance(self, name: str) -> None:
        self.instances[name].state = State.DRAINING


def fleet_of_three(order: RemovalOrder) -> tuple[Fleet, StandInEngine, list[str]]:
    # The profiled minimal spec (decode pool "d" on 8-card H200), 60 s drain, up to 4 replicas.
    spec = spec_of({**PROFILED_CHANGES, "decode.pools.0.replicas": {"min": 1, "max": 4}})
    assert spec.termination.drain_seconds == 60
    model = MODEL_PROFILES["glm-4.5-fp8"]
    fleet = Fleet(spec, model, Cluster.fitting(spec), None, removal=order)
    engine = StandInEngine()
    fleet.apply(engine, {DECODE: 3}, warm_up=False)  # type: ignore[arg-type]
    oldest, older, newest = (r.name for r in fleet.live[DECODE])
    # The newest streams 4 answers (one runs past the 60 s drain), the oldest 2, the middle one
    # is idle.
    engine.instances[newest].running_requests = [
        (Finishing(10.0), 100),
        (Finishing(20.0), 300),
        (Finishing(30.0), 500),
        (Finishing(90.0), 4000),
    ]
    engine.instances[oldest].running_requests = [(Finishing(5.0), 50), (Finishing(8.0), 80)]
    return fleet, engine, [oldest, older, newest]


def shrink_to_two(order: RemovalOrder) -> tuple[Fleet, list[str]]:
    fleet, engine, names = fleet_of_three(order)
    fleet.apply(engine, {DECODE: 2}, warm_up=False)  # type: ignore[arg-type]
    (gone,) = fleet.draining
    engine.now_s = 95.0  # every request above has finished by now
    engine.instances[gone.name].state = State.GONE
    fleet.release_drained(engine)  # type: ignore[arg-type]
    return fleet, names


def test_by_default_the_newest_replica_goes_with_the_streams_it_runs():
    fleet, (oldest, older, _) = shrink_to_two("replicaset")
    assert [r.name for r in fleet.live[DECODE]] == [oldest, older]
    removed = fleet.removed.row()
    assert removed["replicas removed"] == 1
    assert removed["decode streams in flight"] == 4
    assert removed["their tokens to come"] == 4900
    assert removed["streams cut by the drain limit"] == 1  # finishes at 90 s, drain ends at 60 s
    assert removed["tokens cut"] == 4000
    assert removed["drain card-seconds"] == 8 * 60  # drained past the limit: stopped at 60 s


def test_pd_operator_removes_the_idle_replica_and_cuts_nothing():
    fleet, (oldest, _, newest) = shrink_to_two("least-work")
    assert [r.name for r in fleet.live[DECODE]] == [oldest, newest]
    removed = fleet.removed.row()
    assert removed["replicas removed"] == 1
    assert removed["decode streams in flight"] == removed["their tokens to come"] == 0
    assert removed["streams cut by the drain limit"] == 0
    assert removed["drain card-seconds"] == 0  # idle: its cards come back at once


@pytest.mark.parametrize("order", ["replicaset", "least-work"])
def test_a_replica_not_ready_goes_first_whatever_the_order(order: RemovalOrder):
    fleet, engine, (oldest, older, newest) = fleet_of_three(order)
    engine.instances[oldest].state = State.LOADING
    fleet.apply(engine, {DECODE: 2}, warm_up=False)  # type: ignore[arg-type]
    assert [r.name for r in fleet.draining] == [oldest]
    assert fleet.removed.replicas == 0  # not Ready: it held no work
    assert [r.name for r in fleet.live[DECODE]] == [older, newest]
