"""The replicas of an offline replay placed on the cluster's nodes and run in the engine.

`Fleet` keeps each pool's replicas as a Deployment and the scheduler would: new ones take a
node's cards at once (best fit) or stay pending when none fits, removed ones drain before their
cards come back; it reports the replicas, the room left and the `Observation` a policy reads.
"""

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any, Literal

from pd_operator.api.spec import PDDeploymentSpec, PoolSpec, Role
from pd_operator.core.capacity import PODS, FreeCapacity, NodeRoom
from pd_operator.core.children import PoolKey
from pd_operator.core.decision import Observation, PoolObservation
from pd_operator.core.hardware import HARDWARE_PROFILES, HardwareProfile, ModelProfile
from pd_operator.core.observe import NodeSummary
from pd_operator.core.placement import replica_cards
from pd_tools.enginesim.engine import Instance, PDEngine, ReplicaSpec, State
from pd_tools.enginesim.engine import Role as EngineRole
from pd_tools.replay.baselines import ROLES
from pd_tools.replay.cluster import Cluster, accelerator_profile

PODS_PER_NODE = 110  # the kubelet's default pod limit

# Which Ready replica a scale-down removes: the ReplicaSet's default (the most recently started),
# or the one with the least work, as pd-operator marks it (`core.removal`).
RemovalOrder = Literal["replicaset", "least-work"]


@dataclass
class _Replica:
    name: str
    nodes: tuple[int, ...]  # one per pod: a multi-node replica's group spans several
    # A Ready replica counted when removed: when it went, and the requests it was running then
    # (each with its tokens still ahead there), to judge its drain once it is gone.
    removed_s: float | None = None
    running: list[tuple[Any, int]] = field(default_factory=list)


@dataclass
class RemovalCost:
    """What the replicas a run removed were doing when they went."""

    replicas: int = 0  # Ready replicas removed
    streams: int = 0  # decode: sequences running on them then
    tokens: int = 0  # decode: the output tokens those had still to produce
    cut: int = 0  # decode: streams still running when the drain ran out (a real engine stops)
    cut_tokens: int = 0  # decode: their output tokens still to come at the removal
    held: int = 0  # prompts being prefilled, and requests waiting (sent elsewhere, delayed)
    drain_card_seconds: float = 0.0  # cards held by removed replicas until idle (or the limit)

    def row(self) -> dict[str, float]:
        return {
            "replicas removed": self.replicas,
            "decode streams in flight": self.streams,
            "their tokens to come": self.tokens,
            "streams cut by the drain limit": self.cut,
            "tokens cut": self.cut_tokens,
            "requests held or re-routed": self.held,
            "drain card-seconds": round(self.drain_card_seconds, 1),
        }


def _not_ready_first(instance: Instance) -> bool:
    """A ReplicaSet's order among replicas of equal cost: not Ready first (then the newest)."""
    return instance.state is State.READY


class Fleet:
    """Replicas per pool on the nodes, in the engine; pending ones wait for room."""

    def __init__(
        self,
        spec: PDDeploymentSpec,
        model: ModelProfile,
        cluster: Cluster,
        load_s: float | None,
        *,
        removal: RemovalOrder = "replicaset",
        count_removals_from_s: float = 0.0,
        hardware: Mapping[str, HardwareProfile] = HARDWARE_PROFILES,
    ) -> None:
        self.spec = spec
        self.load_s = load_s
        self.removal = removal
        self.removed = RemovalCost()
        self.count_removals_from_s = count_removals_from_s  # not before: a warm-up
        self.drain_s = float(spec.termination.drain_seconds)
        self.pools = {(r, p.name): p for r in ROLES for p in spec.pools(r)}
        self.replica_spec = {
            key: ReplicaSpec.from_profiles(
                hardware[accelerator_profile(p)], model, replica_cards(p)
            )
            for key, p in self.pools.items()
        }
        labels: dict[str, dict[str, str]] = {}
        resources: dict[str, str] = {}
        for pool in self.pools.values():
            labels.setdefault(accelerator_profile(pool), {}).update(pool.accelerator.node_selector)
            resources[accelerator_profile(pool)] = pool.accelerator.resource_name
        self.nodes: list[NodeSummary] = []
        self.node_type: list[str] = []
        self.free: list[int] = []
        self.pods: list[int] = []
        for node_type in cluster.node_types:
            for index in range(node_type.nodes):
                self.nodes.append(
                    NodeSummary(
                        name=f"{node_type.profile}-{index}",
                        labels=labels.get(node_type.profile, {}),
                        taints=(),
                        allocatable={
                            resources.get(node_type.profile, "cards"): str(
                                node_type.cards_per_node
                            ),
                            PODS: str(PODS_PER_NODE),
                        },
                        ready=True,
                    )
                )
                self.node_type.append(node_type.profile)
                self.free.append(node_type.cards_per_node)
                self.pods.append(PODS_PER_NODE)
        self.live: dict[PoolKey, list[_Replica]] = {key: [] for key in self.pools}
        self.pending: dict[PoolKey, int] = dict.fromkeys(self.pools, 0)
        self.draining: list[_Replica] = []
        self.serial = 0

    def replicas(self) -> dict[PoolKey, int]:
        return {key: len(self.live[key]) + self.pending[key] for key in self.pools}

    def _fits(self, pool: PoolSpec) -> list[int]:
        cards = pool.accelerator.per_replica
        return [
            i
            for i, t in enumerate(self.node_type)
            if t == accelerator_profile(pool) and self.free[i] >= cards and self.pods[i] > 0
        ]

    def room(self) -> dict[PoolKey, int]:
        """Most replicas each pool could have now: its max, and what the free cards hold (whole
        groups of `nodesPerReplica` pods)."""
        out = {}
        for key, pool in self.pools.items():
            cards = pool.accelerator.per_replica
            slots = sum(min(self.free[i] // cards, self.pods[i]) for i in self._fits(pool))
            spare = slots // pool.accelerator.nodes_per_replica
            out[key] = min(pool.replicas.max, len(self.live[key]) + spare)
        return out

    def capacity(self) -> FreeCapacity:
        rooms = []
        for node, free, pods, kind in zip(
            self.nodes, self.free, self.pods, self.node_type, strict=True
        ):
            resource = next(iter(k for k in node.allocatable if k != PODS), kind)
            rooms.append(NodeRoom(node, {resource: Decimal(free), PODS: Decimal(pods)}))
        return FreeCapacity(tuple(rooms))

    def apply(self, engine: PDEngine, desired: Mapping[PoolKey, int], warm_up: bool) -> None:
        for key, value in desired.items():
            if key not in self.pools:
                continue
            current = len(self.live[key]) + self.pending[key]
            if value > current:
                self.pending[key] += value - current
            elif value < current:
                self._remove(engine, key, current - value)
        self.place(engine, warm_up)

    def _remove(self, engine: PDEngine, key: PoolKey, count: int) -> None:
        dropped = min(count, self.pending[key])
        self.pending[key] -= dropped
        count -= dropped
        # A ReplicaSet scales down not-ready pods first, then the most recently started (the
        # older ones keep their warm prefix caches); pd-operator's mark puts the Ready ones
        # with the least work first (ties: the most recent). `live` is in placement order.
        live = self.live[key]
        order = self._work if self.removal == "least-work" else _not_ready_first
        gone = sorted(reversed(live), key=lambda r: order(engine.instance(r.name)))[:count]
        for replica in gone:
            self._note_removal(engine, replica)
            engine.remove_instance(replica.name)
            self.draining.append(replica)
        self.live[key] = [r for r in live if r not in gone]

    def _work(self, instance: Instance) -> tuple[bool, int]:
        """A replica's place in pd-operator's removal order: not Ready first, then least work
        (`core.removal.WORK_GAUGES`: running sequences on decode, queue and batch on prefill)."""
        work = instance.running + (instance.waiting if instance.role is EngineRole.PREFILL else 0)
        return instance.state is State.READY, work

    def _note_removal(self, engine: PDEngine, replica: _Replica) -> None:
        instance = engine.instance(replica.name)
        if instance.state is not State.READY or engine.now_s < self.count_removals_from_s:
            return
        running = instance.in_flight()
        cost = self.removed
        cost.replicas += 1
        cost.held += instance.waiting
        if instance.role is EngineRole.DECODE:
            cost.streams += len(running)
            cost.tokens += sum(tokens for _, tokens in running)
        else:  # a prompt being prefilled finishes there, then its KV cache is handed off
            cost.held += len(running)
        replica.removed_s, replica.running = engine.now_s, running

    def _note_drained(self, instance: Instance, replica: _Replica, cards: int, now: float) -> None:
        since, running = replica.removed_s, replica.running
        if since is None:
            return  # not counted: not Ready when removed, or removed during the warm-up
        deadline = since + self.drain_s
        # It drains until the last request it ran ends there (an idle one goes at once), at
        # most the limit.
        ends = [instance.done_with(req) for req, _ in running]
        ends = [now if math.isnan(end) else end for end in ends]
        drained = min(max([since, *ends]), deadline) - since
        self.removed.drain_card_seconds += cards * drained
        if instance.role is EngineRole.DECODE:
            cut = [tokens for end, (_, tokens) in zip(ends, running, strict=True) if end > deadline]
            self.removed.cut += len(cut)
            self.removed.cut_tokens += sum(cut)

    def _place_group(self, pool: PoolSpec) -> tuple[int, ...]:
        """The nodes of one replica's pods, booked; () when its whole group does not fit (then
        nothing is booked, as the mock scheduler binds a group whole or not at all)."""
        nodes: list[int] = []
        for _ in range(pool.accelerator.nodes_per_replica):
            fitting = self._fits(pool)
            if not fitting:
                for node in nodes:
                    self.free[node] += pool.accelerator.per_replica
                    self.pods[node] += 1
                return ()
            node = min(fitting, key=lambda i: (self.free[i], i))  # best fit, as the scheduler
            self.free[node] -= pool.accelerator.per_replica
            self.pods[node] -= 1
            nodes.append(node)
        return tuple(nodes)

    def place(self, engine: PDEngine, warm_up: bool) -> None:
        for key, pool in self.pools.items():
            while self.pending[key] > 0:
                nodes = self._place_group(pool)
                if not nodes:
                    break
                self.pending[key] -= 1
                self.serial += 1
                name = f"{key[0]}-{key[1]}-{self.serial}"
                spec = self.replica_spec[key]
                delay = (
                    0.0
                    if not warm_up
                    else (spec.load_seconds if self.load_s is None else self.load_s)
                )
                engine.add_instance(name, EngineRole(key[0]), spec, ready_after_s=delay)
                self.live[key].append(_Replica(name, nodes))

    def release_drained(self, engine: PDEngine) -> None:
        still = []
        for replica in self.draining:
            instance = engine.instance(replica.name)
            if instance.state is State.GONE:
                pool = self.pools[self._key_of(replica.name)]
                self._note_drained(instance, replica, replica_cards(pool), engine.now_s)
                for node in replica.nodes:
                    self.free[node] += pool.accelerator.per_replica
                    self.pods[node] += 1
            else:
                still.append(replica)
        self.draining = still

    def pool_labels(self) -> Callable[[str], str] | None:
        """What the engines' `pool` label says of a replica (by its name), where a role has
        more than one pool; None where each role has one (a lone pool's signals are its
        role's, and the scrape need not split them)."""
        several = len(self.pools) > len({role for role, _ in self.pools})
        return (lambda name: self._key_of(name)[1]) if several else None

    def _key_of(self, name: str) -> PoolKey:
        role, rest = name.split("-", 1)
        pool = rest.rsplit("-", 1)[0]
        return ("prefill" if role == "prefill" else "decode", pool)

    def cards_by_type(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for key, replicas in self.live.items():
            pool = self.pools[key]
            profile = accelerator_profile(pool)
            out[profile] = out.get(profile, 0) + len(replicas) * replica_cards(pool)
        for replica in self.draining:
            pool = self.pools[self._key_of(replica.name)]
            profile = accelerator_profile(pool)
            out[profile] = out.get(profile, 0) + replica_cards(pool)
        return out

    def observation(self, engine: PDEngine, signals: Mapping[Role, Any]) -> Observation:
        pools = {}
        for key, live in self.live.items():
            ready = sum(1 for r in live if engine.instance(r.name).state is State.READY)
            pools[key] = PoolObservation(
                replicas=len(live) + self.pending[key],
                ready=ready,
                unschedulable=self.pending[key],
                scheduled=len(live),
            )
        return Observation(signals=signals, pools=pools, capacity=self.capacity())
