"""Offline simulation: a trace through `PDEngine` with an autoscaling policy in the loop.

The loop keeps the operator's real timing: engines are scraped every `scrape_interval_s`; the
policy runs every decision interval on signals computed from those scrapes over the rate window
(`sim.offline_metrics`); a new replica takes a node's cards at once but serves only after its
model-load time; nodes hold a fixed number of cards per accelerator type, so replicas that do not
fit stay pending (unschedulable), as on a real cluster. Card-hours count every replica from
placement until it has drained. `simulate` is pure apart from the optional progress callback.
"""

import copy
import itertools
import math
import time
from bisect import bisect_left
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from decimal import Decimal
from pathlib import Path
from typing import Any, TextIO

from pd_operator.api.spec import PDDeploymentSpec, PoolSpec, Role
from pd_operator.core.capacity import PODS, FreeCapacity, NodeRoom
from pd_operator.core.children import PoolKey
from pd_operator.core.decision import Observation, PoolObservation
from pd_operator.core.hardware import HARDWARE_PROFILES, ModelProfile
from pd_operator.core.observe import NodeSummary
from pd_operator.core.perfmodel import kv_transfer_seconds
from pd_tools.enginesim.engine import (
    DEFAULT_LINK_BYTES_PER_SECOND,
    PDEngine,
    ReplicaSpec,
    RequestRecord,
    Routing,
    State,
)
from pd_tools.enginesim.engine import Role as EngineRole
from pd_tools.replay import baselines
from pd_tools.replay.baselines import (
    ROLES,
    Arrivals,
    Policy,
    View,
    demand_tokens,
    fill,
    hindsight_demand,
    started_replicas,
)
from pd_tools.replay.offline_metrics import Scrape, role_signals, scrape, window_stats
from pd_tools.workloads.traces import (
    MOONCAKE_BLOCK_TOKENS,
    ReplayOptions,
    Request,
    read_trace,
    reused_prefix_tokens,
)

POLICY_NAMES = (
    "pd-operator",
    "static-peak",
    "hpa",
    "dynamo-sla",
    "llm-d-slo",
    "oracle",
    "prescient",
)
# `dynamo-sla:PREDICTOR`: the predictors of Dynamo's planner the baseline implements.
DYNAMO_PREDICTORS = ("constant", "arima")
# Prometheus' rate() needs several samples in the window; fewer than four is unreliable.
MIN_SCRAPES_PER_WINDOW = 4
# Load measured ahead of the start to size the initial deployment, as an operator would have
# it sized when the trace begins.
INITIAL_SIZING_S = 300.0
PEAK_WINDOW_S = 60.0
PODS_PER_NODE = 110  # the kubelet's default pod limit
SECONDS_PER_HOUR = 3600.0


@dataclass(frozen=True)
class Timing:
    """The operator's timing; None takes the value from the PDDeployment or the profiles."""

    scrape_interval_s: float = 15.0
    rate_window_s: float | None = None  # None: spec.slo.windowSeconds
    decision_interval_s: float | None = None  # None: spec.scaling.intervalSeconds
    load_seconds: float | None = None  # None: the performance model's model-load time
    drain_s: float = 1800.0  # after the last arrival, how long unfinished requests may run
    # Unix time of the replay's second 0: the wall clock `pd-operator`'s schedules
    # (`spec.scaling.schedules`) read. 0 is 1970-01-01T00:00:00Z.
    clock_s: float = 0.0


@dataclass(frozen=True)
class NodeType:
    """`nodes` nodes of one accelerator profile with `cards_per_node` cards each."""

    profile: str
    nodes: int
    cards_per_node: int = 8


@dataclass(frozen=True)
class Cluster:
    """Nodes per accelerator type and the card-hour price of each (profile's price if absent)."""

    node_types: tuple[NodeType, ...]
    prices: Mapping[str, float] = field(default_factory=dict)

    def price(self, profile: str) -> float:
        if profile in self.prices:
            return self.prices[profile]
        return HARDWARE_PROFILES[profile].hourly_price_usd

    def holds(self, pool: PoolSpec) -> bool:
        """Whether some node holds one replica of the pool (its profile, enough cards)."""
        return any(
            t.profile == pool.accelerator.profile
            and t.nodes > 0
            and t.cards_per_node >= pool.accelerator.per_replica
            for t in self.node_types
        )

    def missing_role(self, spec: PDDeploymentSpec) -> str:
        """Why a role has no pool any node can hold ("" when every role has one)."""
        for role in ROLES:
            pools = spec.pools(role)
            if not any(self.holds(pool) for pool in pools):
                wanted = ", ".join(
                    f"{p.name} ({p.accelerator.profile}, {p.accelerator.per_replica} cards)"
                    for p in pools
                )
                example = pools[0].accelerator.profile
                cards = max(8, pools[0].accelerator.per_replica)
                return (
                    f"no node holds a replica of any {role} pool: {wanted}; add nodes, e.g."
                    f" {example}=2x{cards}"
                )
        return ""

    @classmethod
    def fitting(cls, spec: PDDeploymentSpec, cards_per_node: int = 8) -> "Cluster":
        """Enough nodes for every pool at its max: a cluster that never limits the policy."""
        cards: dict[str, int] = {}
        for role in ROLES:
            for pool in spec.pools(role):
                name = _profile(pool)
                cards[name] = cards.get(name, 0) + pool.replicas.max * pool.accelerator.per_replica
        per_node = max(
            [cards_per_node] + [p.accelerator.per_replica for r in ROLES for p in spec.pools(r)]
        )
        return cls(tuple(NodeType(n, math.ceil(c / per_node), per_node) for n, c in cards.items()))


@dataclass(frozen=True)
class RequestOutcome:
    arrival_s: float
    input_tokens: int
    output_tokens: int
    ttft_s: float  # NaN: unfinished
    tpot_s: float  # mean inter-token latency; NaN for one-token answers or unfinished
    ttft_ok: bool
    itl_ok: bool
    # False when the request misses a target even alone on an idle deployment (see
    # `idle_latencies`): no capacity and no policy can serve it in time.
    feasible: bool = True
    # True when the engines refuse it: its prompt and answer exceed the context length
    # (`context_limit`). Never served, never feasible.
    rejected: bool = False


@dataclass(frozen=True)
class SimResult:
    """What a run cost and how well it served."""

    policy: str
    outcomes: list[RequestOutcome]
    card_hours: dict[str, float]  # per accelerator profile
    cost: float
    scale_actions: int
    timeline: list[tuple[float, dict[str, int]]]  # (time, replicas per "role/pool") on change
    end_s: float
    wall_s: float
    # Why each change after the first entry of `timeline` was made, at the same times: the
    # policy's own words (pd-operator: its decision's reason, as status shows it).
    reasons: list[tuple[float, str]] = field(default_factory=list)

    @property
    def requests(self) -> int:
        return len(self.outcomes)

    @property
    def unfinished(self) -> int:
        """Requests taken but not finished when the replay stopped."""
        return sum(1 for o in self.outcomes if math.isnan(o.ttft_s) and not o.rejected)

    @property
    def rejected(self) -> int:
        """Requests the engines refuse: prompt and answer over the context length."""
        return sum(1 for o in self.outcomes if o.rejected)

    @property
    def infeasible(self) -> int:
        """Requests taken that miss a target even alone on an idle deployment."""
        return sum(1 for o in self.outcomes if not o.feasible and not o.rejected)

    @property
    def feasible(self) -> int:
        """Requests an idle deployment serves in time: what attainment is held to."""
        return sum(1 for o in self.outcomes if o.feasible)

    def attainment(self) -> dict[str, float]:
        """Share of all requests meeting the TTFT target, the ITL target, and both (a rejected
        request meets neither); and `feasible`: the share meeting both among the requests that
        an idle deployment serves in time (what a policy can be held to)."""
        n = max(1, len(self.outcomes))
        feasible = [o for o in self.outcomes if o.feasible]
        return {
            "ttft": sum(o.ttft_ok for o in self.outcomes) / n,
            "itl": sum(o.itl_ok for o in self.outcomes) / n,
            "both": sum(o.ttft_ok and o.itl_ok for o in self.outcomes) / n,
            "feasible": sum(o.ttft_ok and o.itl_ok for o in feasible) / max(1, len(feasible)),
        }

    @property
    def tokens(self) -> int:
        """Input plus output tokens of the finished requests."""
        done = (o for o in self.outcomes if not math.isnan(o.ttft_s))
        return sum(o.input_tokens + o.output_tokens for o in done)

    @property
    def cost_per_million_tokens(self) -> float:
        return self.cost / (self.tokens / 1e6) if self.tokens else math.nan

    def summary(self) -> dict[str, Any]:
        """A JSON-ready summary (no per-request rows)."""
        return {
            "policy": self.policy,
            "requests": self.requests,
            "unfinished": self.unfinished,
            "rejected": self.rejected,
            "infeasible": self.infeasible,
            "attainment": self.attainment(),
            "card_hours": self.card_hours,
            "cost": self.cost,
            "tokens": self.tokens,
            "cost_per_million_tokens": self.cost_per_million_tokens,
            "scale_actions": self.scale_actions,
            "simulated_s": self.end_s,
            "wall_s": self.wall_s,
        }

    def changes(self) -> list[dict[str, Any]]:
        """The replica timeline: replicas per pool from `t`, and why they changed there."""
        why = dict(self.reasons)
        return [{"t": t, "replicas": r, "reason": why.get(t, "")} for t, r in self.timeline]

    def change_lines(self) -> list[str]:
        """Each change after the start as one line: time, the pools that moved, and why."""
        lines, why = [], dict(self.reasons)
        for (_, before), (t, after) in itertools.pairwise(self.timeline):
            moved = ", ".join(
                f"{pool} {before.get(pool, 0)}->{count}"
                for pool, count in after.items()
                if count != before.get(pool, 0)
            )
            reason = why.get(t, "")
            lines.append(f"{t:7.0f} s  {moved}" + (f": {reason}" if reason else ""))
        return lines

    def to_dict(self) -> dict[str, Any]:
        """The summary plus the replica timeline (with reasons) and per-request TTFT/TPOT."""
        out = self.summary()
        out["timeline"] = self.changes()
        out["requests_detail"] = [
            {
                "arrival_s": o.arrival_s,
                "input_tokens": o.input_tokens,
                "output_tokens": o.output_tokens,
                "ttft_s": _json_float(o.ttft_s),
                "tpot_s": _json_float(o.tpot_s),
                "feasible": o.feasible,
                "rejected": o.rejected,
            }
            for o in self.outcomes
        ]
        return out


def _json_float(value: float) -> float | None:
    return None if math.isnan(value) else value


def _profile(pool: PoolSpec) -> str:
    name = pool.accelerator.profile
    if name is None or name not in HARDWARE_PROFILES:
        raise ValueError(f"pool {pool.name} needs a known accelerator.profile to be simulated")
    return name


@dataclass
class _Replica:
    name: str
    node: int


class _Fleet:
    """Replicas per pool on the nodes, in the engine; pending ones wait for room."""

    def __init__(
        self, spec: PDDeploymentSpec, model: ModelProfile, cluster: Cluster, load_s: float | None
    ) -> None:
        self.spec = spec
        self.load_s = load_s
        self.pools = {(r, p.name): p for r in ROLES for p in spec.pools(r)}
        self.replica_spec = {
            key: ReplicaSpec.from_profiles(
                HARDWARE_PROFILES[_profile(p)], model, p.accelerator.per_replica
            )
            for key, p in self.pools.items()
        }
        labels: dict[str, dict[str, str]] = {}
        resources: dict[str, str] = {}
        for pool in self.pools.values():
            labels.setdefault(_profile(pool), {}).update(pool.accelerator.node_selector)
            resources[_profile(pool)] = pool.accelerator.resource_name
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
            if t == _profile(pool) and self.free[i] >= cards and self.pods[i] > 0
        ]

    def room(self) -> dict[PoolKey, int]:
        """Most replicas each pool could have now: its max, and what the free cards hold."""
        out = {}
        for key, pool in self.pools.items():
            cards = pool.accelerator.per_replica
            spare = sum(self.free[i] // cards for i in self._fits(pool))
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
        # older ones keep their warm prefix caches). `live` is in placement order.
        live = self.live[key]
        ranked = sorted(reversed(live), key=lambda r: engine.instance(r.name).state is State.READY)
        gone = ranked[:count]
        for replica in gone:
            engine.remove_instance(replica.name)
            self.draining.append(replica)
        self.live[key] = [r for r in live if r not in gone]

    def place(self, engine: PDEngine, warm_up: bool) -> None:
        for key, pool in self.pools.items():
            while self.pending[key] > 0:
                nodes = self._fits(pool)
                if not nodes:
                    break
                node = min(nodes, key=lambda i: (self.free[i], i))  # best fit, as the scheduler
                self.free[node] -= pool.accelerator.per_replica
                self.pods[node] -= 1
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
                self.live[key].append(_Replica(name, node))

    def release_drained(self, engine: PDEngine) -> None:
        still = []
        for replica in self.draining:
            if engine.instance(replica.name).state is State.GONE:
                pool = self.pools[self._key_of(replica.name)]
                self.free[replica.node] += pool.accelerator.per_replica
                self.pods[replica.node] += 1
            else:
                still.append(replica)
        self.draining = still

    def _key_of(self, name: str) -> PoolKey:
        role, rest = name.split("-", 1)
        pool = rest.rsplit("-", 1)[0]
        return ("prefill" if role == "prefill" else "decode", pool)

    def cards_by_type(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for key, replicas in self.live.items():
            pool = self.pools[key]
            out[_profile(pool)] = out.get(_profile(pool), 0) + len(replicas) * (
                pool.accelerator.per_replica
            )
        for replica in self.draining:
            pool = self.pools[self._key_of(replica.name)]
            out[_profile(pool)] = out.get(_profile(pool), 0) + pool.accelerator.per_replica
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


def peak_replicas(
    spec: PDDeploymentSpec, arrivals: Arrivals, room: Mapping[PoolKey, int]
) -> dict[PoolKey, int]:
    """Replicas for the busiest minute of the trace, each role on its own busiest minute."""
    end = arrivals.times[-1] if arrivals.times else 0.0
    out: dict[PoolKey, int] = {}
    for role in ROLES:
        best: dict[PoolKey, int] = {}
        for k in range(max(1, math.ceil(end / PEAK_WINDOW_S))):
            frontend = arrivals.between(k * PEAK_WINDOW_S, (k + 1) * PEAK_WINDOW_S)
            if frontend.rate_rps <= 0:
                continue
            demand = hindsight_demand(spec, frontend, role)
            sized = fill(spec, role, demand, frontend.mean_input_tokens, room)
            if sum(sized.values()) > sum(best.values()):
                best = sized
        out.update(best or {(role, p.name): p.replicas.min for p in spec.pools(role)})
    return out


def make_policy(
    name: str,
    spec: PDDeploymentSpec,
    arrivals: Arrivals,
    room: Mapping[PoolKey, int],
    timing: Timing,
    *,
    oracle: Callable[[], Sequence[Mapping[PoolKey, int]]] | None = None,
    prescient: Callable[[], tuple[Sequence[Mapping[PoolKey, int]], float]] | None = None,
) -> Policy:
    """A policy by name (see POLICY_NAMES); `dynamo-sla:arima` picks the ARIMA predictor.

    `oracle` computes the oracle's schedule, `prescient` the prescient one with its lead
    (they need the whole run; `simulate` passes them).
    """
    check_policy_name(name)
    base, _, option = name.partition(":")
    if base == "pd-operator":
        interval = timing.decision_interval_s or float(spec.scaling.interval_seconds)
        return baselines.OperatorPolicy(interval_s=interval, clock_s=timing.clock_s)
    if base == "static-peak":
        return baselines.StaticPeak(peak_replicas(spec, arrivals, room))
    if base == "hpa":
        return baselines.HPA()
    if base == "dynamo-sla":
        return baselines.DynamoSLA(predictor=option or "constant", name=name)
    if base == "llm-d-slo":
        return baselines.LlmdSLO()
    if base == "oracle":
        if oracle is None:
            raise ValueError("the oracle's schedule comes from the simulator: use simulate()")
        return baselines.Oracle(oracle(), interval_s=ORACLE_INTERVAL_S)
    if base == "prescient":
        if prescient is None:
            raise ValueError("the prescient schedule comes from the simulator: use simulate()")
        schedule, lead_s = prescient()
        return baselines.Prescient(schedule, lead_s=lead_s, period_s=ORACLE_INTERVAL_S)
    raise AssertionError(f"policy {name!r} passed its check but has no builder")


def check_policy_name(name: str) -> None:
    """Raise ValueError unless `make_policy` builds a policy of this name."""
    base, colon, option = name.partition(":")
    if base not in POLICY_NAMES:
        raise ValueError(f"unknown policy {name!r}; choose from {', '.join(POLICY_NAMES)}")
    if colon and (base != "dynamo-sla" or option not in DYNAMO_PREDICTORS):
        predictors = " or ".join(f"dynamo-sla:{p}" for p in DYNAMO_PREDICTORS)
        raise ValueError(f"unknown policy {name!r}: only {predictors} take an option")


def _first(spec: PDDeploymentSpec) -> str:
    return spec.pools("prefill")[0].name


def _prefill_work(replica: ReplicaSpec) -> Callable[[Request], float]:
    """Seconds of one replica's prefill a request costs: its own linear and attention work,
    and its share of the per-batch overhead (short prompts share a batch of up to
    max_batch_tokens; a long one is a batch of its own)."""
    coefficients = replica.prefill

    def seconds(request: Request) -> float:
        n, p = request.input_tokens, request.cached_tokens
        share = min(1.0, (n - p) / replica.max_batch_tokens)
        work = coefficients.b_ms_per_token * (n - p) + coefficients.c_ms_per_token2 * (
            n * n - p * p
        )
        return (work + coefficients.a_ms * share) / 1000

    return seconds


def _initial(
    policy: Policy, spec: PDDeploymentSpec, arrivals: Arrivals, room: Mapping[PoolKey, int]
) -> dict[PoolKey, int]:
    if isinstance(policy, baselines.StaticPeak):
        return dict(policy.replicas)
    if isinstance(policy, baselines.Oracle):
        return dict(policy.schedule[0])
    if isinstance(policy, baselines.Prescient):
        return started_replicas(policy.schedule, policy.period_s, policy.lead_s, 0.0)
    frontend = arrivals.between(0.0, INITIAL_SIZING_S)
    out: dict[PoolKey, int] = {}
    for role in ROLES:
        out.update(
            fill(spec, role, demand_tokens(frontend, role), frontend.mean_input_tokens or 1, room)
        )
    return out


def idle_latencies(
    spec: PDDeploymentSpec,
    requests: Sequence[Request],
    model: ModelProfile,
    *,
    link_bytes_per_second: float = DEFAULT_LINK_BYTES_PER_SECOND,
    block_tokens: int = MOONCAKE_BLOCK_TOKENS,
) -> list[tuple[float, float]]:
    """Each request's TTFT and mean inter-token time (s) alone on an idle deployment.

    The prompt is a prefill batch of its own on the fastest prefill pool's replica, with every
    prefix block that an earlier request of the trace carried already cached (an unbounded
    cache shared by all replicas), then its KV moves to decode; the answer runs alone in a
    decode batch on the fastest decode pool's replica. The engine can only be slower, so a
    request slower than a target here misses it on any capacity, under any policy.
    """
    replicas = {
        role: [
            ReplicaSpec.from_profiles(
                HARDWARE_PROFILES[_profile(p)], model, p.accelerator.per_replica
            )
            for p in spec.pools(role)
        ]
        for role in ROLES
    }
    out = []
    for request, cached in zip(requests, reused_prefix_tokens(requests, block_tokens), strict=True):
        n = request.input_tokens
        prefill_ms = min(r.prefill.batch_ms([n], [cached]) for r in replicas["prefill"])
        ttft, tpot = prefill_ms / 1000, math.nan
        if request.output_tokens > 1:  # a one-token answer is done at prefill, no KV moves
            ttft += kv_transfer_seconds(n, model, link_bytes_per_second)
            # Context at the first step is prompt + first token, one more each step.
            context = n + 1 + (request.output_tokens - 2) / 2
            tpot = (
                min(
                    r.decode.fixed_ms(1) + r.decode.b_ms_per_context_token * context
                    for r in replicas["decode"]
                )
                / 1000
            )
        out.append((ttft, tpot))
    return out


def _feasible(spec: PDDeploymentSpec, idle: Sequence[tuple[float, float]]) -> list[bool]:
    ttft_target = spec.slo.ttft.target_milliseconds / 1000
    itl_target = spec.slo.itl.target_milliseconds / 1000
    return [
        ttft <= ttft_target + 1e-12 and (math.isnan(tpot) or tpot <= itl_target + 1e-12)
        for ttft, tpot in idle
    ]


def _latencies(record: RequestRecord) -> tuple[float, float]:
    """TTFT and mean inter-token time as vLLM's disaggregated decode reports them.

    The engine delivers the first token with the KV and lets the request wait for the decode
    step in progress before its first step, so that wait (up to one step, ~15 ms on an H200
    replica) would land in the first inter-token gap; a 2-token answer then shows one gap of
    up to two steps. vLLM's P/D decode instead samples the first token in the request's first
    step on the decode instance: the wait is part of TTFT and every gap is a whole step.
    """
    joined = record.decode_start_s
    if record.output_tokens < 2 or math.isnan(joined):
        return record.ttft_s, record.itl_mean_s
    return joined - record.arrival_s, (record.finish_s - joined) / (record.output_tokens - 1)


def _outcome(
    spec: PDDeploymentSpec, request: Request, record: RequestRecord | None, feasible: bool
) -> RequestOutcome:
    ttft_target = spec.slo.ttft.target_milliseconds / 1000
    itl_target = spec.slo.itl.target_milliseconds / 1000
    if record is None:
        return RequestOutcome(
            request.arrival_s,
            request.input_tokens,
            request.output_tokens,
            math.nan,
            math.nan,
            False,
            False,
            feasible,
        )
    ttft, tpot = _latencies(record)
    return RequestOutcome(
        request.arrival_s,
        request.input_tokens,
        request.output_tokens,
        ttft,
        tpot,
        ttft <= ttft_target,
        math.isnan(tpot) or tpot <= itl_target,
        feasible,
    )


@dataclass(frozen=True)
class Progress:
    """Where a run is: simulated time against the last arrival, requests finished."""

    policy: str
    simulated_s: float
    span_s: float
    finished: int
    requests: int
    phase: str = "replay"  # "look-ahead": the oracle searching its schedule

    @property
    def fraction(self) -> float:
        return min(1.0, self.simulated_s / self.span_s) if self.span_s > 0 else 1.0

    def __str__(self) -> str:
        what = self.policy if self.phase == "replay" else f"{self.policy} {self.phase}"
        return (
            f"{what}: t={self.simulated_s:,.0f}s of {self.span_s:,.0f}s, "
            f"{self.finished:,}/{self.requests:,} done"
        )


class ProgressBar:
    """Shows `Progress` on a stream: a bar redrawn in place on a terminal, else one line per
    tenth of each run (or look-ahead). Pass it as `simulate(progress=...)`."""

    WIDTH = 30
    REDRAW_S = 0.2

    def __init__(self, stream: TextIO, *, terminal: bool | None = None) -> None:
        self.stream = stream
        self.terminal = stream.isatty() if terminal is None else terminal
        self.drawn = False
        self.last_draw = -math.inf
        self.last_tenth: tuple[str, str, int] | None = None

    def __call__(self, progress: Progress) -> None:
        if not self.terminal:
            tenth = (progress.policy, progress.phase, math.floor(progress.fraction * 10))
            if tenth != self.last_tenth:
                self.last_tenth = tenth
                print(progress, file=self.stream, flush=True)
            return
        now = time.monotonic()
        if now - self.last_draw < self.REDRAW_S and progress.fraction < 1:
            return
        self.last_draw = now
        filled = round(progress.fraction * self.WIDTH)
        bar = "#" * filled + "." * (self.WIDTH - filled)
        self.stream.write(f"\r[{bar}] {progress.fraction:4.0%} {progress}\x1b[K")
        self.stream.flush()
        self.drawn = True

    def close(self) -> None:
        """End the bar's line (call after each run)."""
        if self.drawn:
            self.stream.write("\n")
            self.stream.flush()
        self.drawn = False
        self.last_draw = -math.inf


# The oracle re-plans every minute: as often as the baselines' fastest loops act on
# replicas that need minutes to load, and each interval costs a search.
ORACLE_INTERVAL_S = 60.0
# Share of an interval's judged requests the oracle must serve in time (or as many as the
# largest deployment the nodes hold serves): the 99% target, held in every interval.
ORACLE_ATTAINMENT = 0.99


class _Feed:
    """The trace as the engine pulls it, with the cut-off an oracle look-ahead sets."""

    def __init__(self, requests: Sequence[Request]) -> None:
        self.requests = requests
        self.next = 0
        self.stop_s = math.inf

    def __iter__(self) -> Iterator[Request]:
        return self

    def __next__(self) -> Request:
        if self.next >= len(self.requests) or self.requests[self.next].arrival_s >= self.stop_s:
            raise StopIteration
        self.next += 1
        return self.requests[self.next - 1]


def _unchanging(engine: PDEngine, fleet: _Fleet, feed: _Feed) -> dict[int, Any]:
    """What a fork can share with the original: the requests and their prefix-block ids, the
    profiles (as a `copy.deepcopy` memo)."""
    shared: list[Any] = [
        feed.requests,
        fleet.spec,
        fleet.nodes,
        fleet.pools,
        fleet.replica_spec,
        engine.buckets,
        *fleet.replica_spec.values(),
        *(r.hash_ids for r in feed.requests),
    ]
    return {id(value): value for value in shared}


def _fork(
    engine: PDEngine, fleet: _Fleet, feed: _Feed, unchanging: Mapping[int, Any]
) -> tuple[PDEngine, _Fleet, _Feed]:
    """A copy of the running simulation; prefix caches (block ids only) are copied flat."""
    memo = dict(unchanging)
    for instance in engine.instances():
        cache = getattr(instance, "cache", None)
        if isinstance(cache, OrderedDict):
            memo[id(cache)] = OrderedDict(cache)
    return copy.deepcopy((engine, fleet, feed), memo)


class _Lookahead:
    """The trace run forward on the deployment a hindsight search chose so far, forkable at
    any moment to try a candidate (`oracle_schedule`, `prescient_schedule`)."""

    def __init__(
        self,
        spec: PDDeploymentSpec,
        requests: Sequence[Request],
        *,
        model: ModelProfile,
        cluster: Cluster,
        load_s: float | None,
        routing: Routing,
    ) -> None:
        self.fleet = _Fleet(spec, model, cluster, load_s)
        self.feed = _Feed(requests)
        self.engine = PDEngine(self.feed, model=model, routing=routing)
        self.times = [r.arrival_s for r in requests]
        self.span = self.times[-1] if self.times else 0.0
        self.lowest = {key: pool.replicas.min for key, pool in self.fleet.pools.items()}
        self._unchanging = _unchanging(self.engine, self.fleet, self.feed)

    def fork(self, stop_s: float) -> tuple[PDEngine, _Fleet]:
        """A copy of the run now, fed the arrivals before `stop_s` only."""
        engine, fleet, feed = _fork(self.engine, self.fleet, self.feed, self._unchanging)
        feed.stop_s = stop_s
        return engine, fleet


def oracle_schedule(
    spec: PDDeploymentSpec,
    requests: Sequence[Request],
    *,
    model: ModelProfile,
    cluster: Cluster,
    feasible: Sequence[bool],
    interval_s: float = ORACLE_INTERVAL_S,
    progress: Callable[[Progress], None] | None = None,
    routing: Routing = "prefix-aware",
) -> list[dict[PoolKey, int]]:
    """Per interval, the fewest replicas per pool with which the requests meet the SLO.

    Perfect knowledge, found with the simulator itself: the trace runs forward one interval
    at a time on the replicas chosen so far, new replicas serving at once (no warm-up, no
    stabilization, no step limits). At each interval's start the whole simulation is forked;
    a fork gets a candidate deployment and the arrivals up to the interval's end, and runs
    until they have all finished. Judged are the feasible requests (`idle_latencies`) still
    open at the start or arriving in the interval; a candidate passes when no more of them
    miss TTFT or ITL than `ORACLE_ATTAINMENT` allows, or than miss on the largest deployment
    the nodes hold. Each pool's count is scanned up from its minimum to the first that
    passes, a role's pools in preference order (later pools at their minimum); the roles are
    searched in both orders (the first with the other role at its largest, the second with
    the first's answer) and the cheaper answer at the cluster's card-hour prices is kept.
    """
    run = _Lookahead(spec, requests, model=model, cluster=cluster, load_s=None, routing=routing)
    fleet, engine, times, span, lowest = run.fleet, run.engine, run.times, run.span, run.lowest
    finished: set[int] = set()
    oldest_open = 0
    schedule: list[dict[PoolKey, int]] = []
    for k in range(math.floor(span / interval_s) + 1):
        end = (k + 1) * interval_s
        fleet.release_drained(engine)
        while oldest_open in finished:
            oldest_open += 1
        arrived = bisect_left(times, end)
        judged = [i for i in range(oldest_open, arrived) if feasible[i] and i not in finished]
        room = {key: max(lowest[key], n) for key, n in fleet.room().items()}
        tried: dict[tuple[tuple[PoolKey, int], ...], int] = {}

        def misses(
            config: Mapping[PoolKey, int],
            end: float = end,
            judged: Sequence[int] = judged,
            tried: dict[tuple[tuple[PoolKey, int], ...], int] = tried,
        ) -> int:
            key = tuple(sorted(config.items()))
            if key not in tried:
                fork, fork_fleet = run.fork(end)
                fork_fleet.apply(fork, config, warm_up=False)
                done = {r.id: r for r in fork.run().records}
                tried[key] = sum(1 for i in judged if not _meets(spec, requests[i], done.get(i)))
            return tried[key]

        chosen = dict(lowest)
        if judged:
            allowed = max(misses(room), math.floor((1 - ORACLE_ATTAINMENT) * len(judged)))
            chosen = _cheapest(misses, allowed, room, lowest, fleet=fleet, cluster=cluster)
        schedule.append(chosen)
        fleet.apply(engine, chosen, warm_up=False)
        engine.advance_to(end)
        finished.update(r.id for r in engine.take_finished())
        if progress:
            progress(Progress("oracle", end, span, len(finished), len(requests), "look-ahead"))
    return schedule


def prescient_schedule(
    spec: PDDeploymentSpec,
    requests: Sequence[Request],
    *,
    model: ModelProfile,
    cluster: Cluster,
    feasible: Sequence[bool],
    lead_s: float,
    load_s: float | None = None,
    interval_s: float = ORACLE_INTERVAL_S,
    progress: Callable[[Progress], None] | None = None,
    routing: Routing = "prefix-aware",
) -> list[dict[PoolKey, int]]:
    """Per interval, the fewest replicas per pool with which the requests meet the SLO when
    every new replica must load its model first: the oracle's search (`oracle_schedule`), but
    each interval's deployment is chosen `lead_s` before the interval begins, from the
    simulation as it stands then, and its new replicas start loading at once, so that they
    serve from the interval's start (`baselines.started_replicas`). A fork applies the
    candidate at the choice, plays the replica changes due before the interval (earlier
    intervals ending, each at its end), and runs the arrivals up to the interval's end; judged
    are the feasible requests open at the interval's start or arriving in it, with the
    oracle's rule and scan. Replicas are thus never late and never early by more than a
    second of the decision step: what remains is the load time's own cost. Replicas load
    for `load_s` (None: the profiles' model-load time), at most `lead_s`."""
    run = _Lookahead(spec, requests, model=model, cluster=cluster, load_s=load_s, routing=routing)
    fleet, engine, times, span, lowest = run.fleet, run.engine, run.times, run.span, run.lowest
    slowest = _lead_s(fleet)
    if lead_s < slowest:
        raise ValueError(f"lead_s {lead_s:g} is shorter than the model load ({slowest:g} s)")
    count = math.floor(span / interval_s) + 1
    starts = [max(0.0, k * interval_s - lead_s) for k in range(count)]
    events = sorted({*starts, *(k * interval_s for k in range(1, count))})
    finished: set[int] = set()
    oldest_open = 0
    schedule: list[dict[PoolKey, int]] = []

    def choose(k: int, now: float) -> dict[PoolKey, int]:
        begin, end = k * interval_s, (k + 1) * interval_s
        first, stop = bisect_left(times, begin), bisect_left(times, end)
        if not any(feasible[i] for i in range(oldest_open, stop) if i not in finished):
            return dict(lowest)
        later = [e for e in events if now < e <= begin]
        tried: dict[tuple[tuple[PoolKey, int], ...], tuple[int, int]] = {}

        def judge(config: Mapping[PoolKey, int]) -> tuple[int, int]:
            """(misses, judged requests) with `config` for interval k."""
            key = tuple(sorted(config.items()))
            if key not in tried:
                fork, fork_fleet = run.fork(end)
                planned = [*schedule, dict(config)]
                fork_fleet.apply(
                    fork, started_replicas(planned, interval_s, lead_s, now), warm_up=now > 0
                )
                for at in later:
                    fork.advance_to(at)
                    fork_fleet.release_drained(fork)
                    fork_fleet.apply(
                        fork, started_replicas(planned, interval_s, lead_s, at), warm_up=True
                    )
                early = {r.id for r in fork.take_finished()}
                done = {r.id: r for r in fork.run().records}
                judged = [
                    i
                    for i in range(oldest_open, stop)
                    if feasible[i] and i not in finished and (i >= first or i not in early)
                ]
                missed = sum(1 for i in judged if not _meets(spec, requests[i], done.get(i)))
                tried[key] = (missed, len(judged))
            return tried[key]

        room = {key: max(lowest[key], n) for key, n in fleet.room().items()}
        at_most, judged = judge(room)
        allowed = max(at_most, math.floor((1 - ORACLE_ATTAINMENT) * judged))
        return _cheapest(lambda c: judge(c)[0], allowed, room, lowest, fleet=fleet, cluster=cluster)

    for now in events:
        engine.advance_to(now)
        finished.update(r.id for r in engine.take_finished())
        fleet.release_drained(engine)
        while oldest_open in finished:
            oldest_open += 1
        while len(schedule) < count and starts[len(schedule)] <= now:
            schedule.append(choose(len(schedule), now))
        fleet.apply(engine, started_replicas(schedule, interval_s, lead_s, now), warm_up=now > 0)
        if progress:
            progress(Progress("prescient", now, span, len(finished), len(requests), "look-ahead"))
    return schedule


def _lead_s(fleet: _Fleet) -> float:
    """The prescient policy's lead: the slowest pool's model load (the fleet's, else the
    profiles'), rounded up to the whole second on which that policy decides."""
    if fleet.load_s is not None:
        return float(math.ceil(fleet.load_s))
    return float(math.ceil(max(r.load_seconds for r in fleet.replica_spec.values())))


def _cheapest(
    misses: Callable[[Mapping[PoolKey, int]], int],
    allowed: int,
    room: Mapping[PoolKey, int],
    lowest: Mapping[PoolKey, int],
    *,
    fleet: _Fleet,
    cluster: Cluster,
) -> dict[PoolKey, int]:
    """The cheaper, at the cluster's prices, of the two role orders' `_fewest` answers."""
    found = [_fewest(misses, allowed, room, lowest, order) for order in (ROLES, ROLES[::-1])]
    return min(found, key=lambda config: _cost_per_hour(fleet, cluster, config))


def _fewest(
    misses: Callable[[Mapping[PoolKey, int]], int],
    allowed: int,
    room: Mapping[PoolKey, int],
    lowest: Mapping[PoolKey, int],
    roles: Sequence[Role],
) -> dict[PoolKey, int]:
    """The fewest replicas per pool, roles searched in the given order (`oracle_schedule`).

    Each pool's count is scanned upward from its minimum and the first that passes is kept:
    misses are not monotone in replicas (removing a replica re-routes its queue, which can
    free requests stuck behind a long prompt), so a bisection could skip the smallest.
    """
    chosen = dict(room)
    for role in roles:
        pools = [key for key in room if key[0] == role]
        chosen.update({key: lowest[key] for key in pools})
        for key in pools:
            passing = next(
                (
                    n
                    for n in range(lowest[key], room[key] + 1)
                    if misses({**chosen, key: n}) <= allowed
                ),
                None,
            )
            chosen[key] = room[key] if passing is None else passing
            if passing is not None:
                break  # later pools stay at their minimum; else the next pool helps
    return chosen


def _cost_per_hour(fleet: _Fleet, cluster: Cluster, config: Mapping[PoolKey, int]) -> float:
    return sum(
        n * fleet.pools[key].accelerator.per_replica * cluster.price(_profile(fleet.pools[key]))
        for key, n in config.items()
    )


def context_limit(spec: PDDeploymentSpec, model: ModelProfile) -> int | None:
    """The most tokens, prompt plus answer, a replica takes: the spec's `model.contextLength`
    (vLLM's --max-model-len), else the model's own; None when neither is known."""
    return spec.model.context_length or model.max_context_tokens


def admitted(
    requests: Sequence[Request], limit: int | None
) -> tuple[Sequence[Request], list[Request]]:
    """The requests the engines take, and those they refuse: vLLM answers 400 at once to a
    prompt that, with its answer, exceeds the context length; it never reaches a queue."""
    if limit is None:
        return requests, []
    taken: list[Request] = []
    refused: list[Request] = []
    for request in requests:
        fits = request.input_tokens + request.output_tokens <= limit
        (taken if fits else refused).append(request)
    return (requests, []) if not refused else (taken, refused)


def _measured_outcomes(
    spec: PDDeploymentSpec,
    measured: Sequence[Request],
    records: Mapping[int, RequestRecord],
    feasible: Sequence[bool],
    *,
    refused: Sequence[Request],
    warmup_s: float,
) -> list[RequestOutcome]:
    """The outcomes of the measured requests, the engines' (`records` by index among all the
    requests taken, of which `measured` are the last) and the refused ones, by arrival."""
    first = len(feasible) - len(measured)
    outcomes = [
        _outcome(spec, _shifted(r, warmup_s), records.get(first + k), feasible[first + k])
        for k, r in enumerate(measured)
    ]
    if not refused:
        return outcomes
    rejected = [
        RequestOutcome(
            r.arrival_s - warmup_s,
            r.input_tokens,
            r.output_tokens,
            math.nan,
            math.nan,
            False,
            False,
            feasible=False,
            rejected=True,
        )
        for r in refused
        if r.arrival_s >= warmup_s
    ]
    return sorted(outcomes + rejected, key=lambda o: o.arrival_s)


def _meets(spec: PDDeploymentSpec, request: Request, record: RequestRecord | None) -> bool:
    outcome = _outcome(spec, request, record, True)
    return outcome.ttft_ok and outcome.itl_ok


def simulate(
    spec: PDDeploymentSpec,
    requests: Sequence[Request],
    policy: str | Policy,
    *,
    model: ModelProfile,
    cluster: Cluster | None = None,
    timing: Timing = Timing(),
    warmup_s: float = 0.0,
    progress: Callable[[Progress], None] | None = None,
    routing: Routing = "prefix-aware",
) -> SimResult:
    """Replay `requests` (sorted by arrival) under `policy`; see the module docstring.

    The first `warmup_s` seconds are a warm-up: their requests run through the same engine
    and policy (queues, prefix caches, replicas and the policy's memory carry over), but the
    result holds only what happens from `warmup_s` on: the requests arriving from then, the
    card-hours, cost and scale actions from then, times relative to it. `static-peak` is
    sized on the measured requests only; the oracle searches the whole span. `routing` is the
    router's choice of prefill instance (`sim.engine.Routing`). Requests over the context
    length are refused on arrival, as vLLM refuses them, and only counted (`rejected`).
    """
    if warmup_s < 0:
        raise ValueError(f"the warm-up must not be negative, got {warmup_s}")
    started = time.perf_counter()
    requests, refused = admitted(requests, context_limit(spec, model))
    cluster = cluster or Cluster.fitting(spec)
    fleet = _Fleet(spec, model, cluster, timing.load_seconds)
    arrivals, measured, first_measured = _arrivals(spec, fleet, requests, warmup_s)
    feasible = _feasible(spec, idle_latencies(spec, requests, model))
    chosen = (
        policy
        if not isinstance(policy, str)
        else make_policy(
            policy,
            spec,
            measured,
            fleet.room(),
            timing,
            oracle=lambda: oracle_schedule(
                spec,
                requests,
                model=model,
                cluster=cluster,
                feasible=feasible,
                progress=progress,
                routing=routing,
            ),
            prescient=lambda: (
                prescient_schedule(
                    spec,
                    requests,
                    model=model,
                    cluster=cluster,
                    feasible=feasible,
                    lead_s=_lead_s(fleet),
                    load_s=timing.load_seconds,
                    progress=progress,
                    routing=routing,
                ),
                _lead_s(fleet),
            ),
        )
    )
    window = max(
        timing.rate_window_s or float(spec.slo.window_seconds),
        MIN_SCRAPES_PER_WINDOW * timing.scrape_interval_s,
    )
    engine = PDEngine(requests, model=model, routing=routing)
    fleet.apply(engine, _initial(chosen, spec, arrivals, fleet.room()), warm_up=False)
    last_arrival = arrivals.times[-1] if arrivals.times else 0.0
    scrapes: list[Scrape] = []
    card_seconds: dict[str, float] = {}
    timeline = [(0.0, {f"{r}/{p}": n for (r, p), n in fleet.replicas().items()})]
    reasons: list[tuple[float, str]] = []
    actions = 0
    now, next_scrape, next_decision = 0.0, 0.0, chosen.interval_s
    records: dict[int, RequestRecord] = {}
    held: dict[str, int] = {}
    while True:
        # A step ends at the warm-up's end: card-hours count from it exactly.
        step_to = min(next_scrape, next_decision, warmup_s if now < warmup_s else math.inf)
        engine.advance_to(step_to)
        held = fleet.cards_by_type()
        _count_cards(card_seconds, held, max(now, warmup_s), step_to)
        now = step_to
        for record in engine.take_finished():
            records[record.id] = record
        fleet.release_drained(engine)
        fleet.place(engine, chosen.warm_up)
        if now >= next_scrape:
            scrapes.append(scrape(engine, now))
            scrapes = scrapes[-(int(window / timing.scrape_interval_s) + 4) :]
            next_scrape += timing.scrape_interval_s
        if now >= next_decision:
            next_decision += chosen.interval_s
            view = View(
                now=now,
                spec=spec,
                observation=fleet.observation(engine, role_signals(spec, scrapes, now, window)),
                stats=window_stats(scrapes, now, window),
                frontend=arrivals.between(max(0.0, now - window), now),
                replicas=fleet.replicas(),
                room=fleet.room(),
            )
            changed = _act(chosen, view, fleet, engine, timeline=timeline, reasons=reasons)
            actions += changed if now >= warmup_s else 0
        if progress:
            progress(Progress(chosen.name, now, last_arrival, len(records), len(requests)))
        past_end = now >= last_arrival
        if past_end and (engine.active_requests == 0 and len(records) >= len(requests)):
            break
        if now >= last_arrival + timing.drain_s:
            break
    if len(records) >= len(requests):
        now = _trim(
            card_seconds,
            held,
            max(now, warmup_s),
            max([last_arrival, warmup_s, *(r.finish_s for r in records.values())]),
        )
    hours = {k: v / SECONDS_PER_HOUR for k, v in sorted(card_seconds.items())}
    return SimResult(
        policy=chosen.name,
        outcomes=_measured_outcomes(
            spec, requests[first_measured:], records, feasible, refused=refused, warmup_s=warmup_s
        ),
        card_hours=hours,
        cost=sum(h * cluster.price(k) for k, h in hours.items()),
        scale_actions=actions,
        timeline=_measured_timeline(timeline, warmup_s),
        end_s=max(0.0, now - warmup_s),
        wall_s=time.perf_counter() - started,
        reasons=[(t - warmup_s, why) for t, why in reasons if t > warmup_s],
    )


def _arrivals(
    spec: PDDeploymentSpec, fleet: _Fleet, requests: Sequence[Request], warmup_s: float
) -> tuple[Arrivals, Arrivals, int]:
    """Arrivals of the whole replay, of the measured part (shifted to start at 0), and the
    index of the first measured request."""
    work = _prefill_work(fleet.replica_spec[("prefill", _first(spec))])
    arrivals = Arrivals(requests, work)
    first = bisect_left(arrivals.times, warmup_s)
    return arrivals, Arrivals([_shifted(r, warmup_s) for r in requests[first:]], work), first


def _shifted(request: Request, warmup_s: float) -> Request:
    return replace(request, arrival_s=request.arrival_s - warmup_s) if warmup_s else request


def _count_cards(
    card_seconds: dict[str, float], held: Mapping[str, int], start: float, end: float
) -> None:
    """Add the cards held from `start` to `end` (nothing when the span is empty)."""
    if end > start:
        for kind, cards in held.items():
            card_seconds[kind] = card_seconds.get(kind, 0.0) + cards * (end - start)


def _measured_timeline(
    timeline: Sequence[tuple[float, dict[str, int]]], warmup_s: float
) -> list[tuple[float, dict[str, int]]]:
    """The replicas at the end of the warm-up (at 0) and the changes after, shifted to it."""
    at_start = [replicas for t, replicas in timeline if t <= warmup_s][-1]
    return [(0.0, at_start), *((t - warmup_s, r) for t, r in timeline if t > warmup_s)]


def _act(
    policy: Policy,
    view: View,
    fleet: _Fleet,
    engine: PDEngine,
    *,
    timeline: list[tuple[float, dict[str, int]]],
    reasons: list[tuple[float, str]],
) -> int:
    """Apply the policy's answer; record a change, and why, on the timeline; pools changed."""
    before = fleet.replicas()
    fleet.apply(engine, policy.decide(view), policy.warm_up)
    after = fleet.replicas()
    if after != before:
        timeline.append((view.now, {f"{r}/{p}": n for (r, p), n in after.items()}))
        reasons.append((view.now, getattr(policy, "reason", "")))
    return sum(1 for k in after if after[k] != before[k])


def _trim(
    card_seconds: dict[str, float], held: Mapping[str, int], now: float, stop: float
) -> float:
    """Take back the card-seconds counted past `stop` (the last finish) in the last step: the
    loop stops at its first step after it, a time set by the policy's interval, not by what
    it served. Returns the end time."""
    for kind, cards in held.items():
        if now > stop:
            card_seconds[kind] = card_seconds.get(kind, 0.0) - cards * (now - stop)
    return min(now, stop)


def load_trace(path: str | Path, options: ReplayOptions | None = None) -> list[Request]:
    """A trace file in any of the formats `sim.workload.read_trace` reads, as a list."""
    return list(read_trace(path, options or ReplayOptions()))


def parse_cluster(text: str, prices: Mapping[str, float] | None = None) -> Cluster:
    """`h200=4x8,mtt-s5000=2x8`: nodes x cards per node of each profile."""
    types = []
    for part in filter(None, (p.strip() for p in text.split(","))):
        name, _, shape = part.partition("=")
        nodes, _, cards = shape.partition("x")
        if name not in HARDWARE_PROFILES:
            known = ", ".join(HARDWARE_PROFILES)
            raise ValueError(f"unknown profile in {part!r}; known: {known}")
        if not nodes.isdigit() or not (cards or "8").isdigit() or int(cards or 8) < 1:
            raise ValueError(f"bad entry {part!r}: want PROFILE=NODESxCARDS, e.g. h200=4x8")
        types.append(NodeType(name, int(nodes), int(cards or 8)))
    if not types:
        raise ValueError(f"no node in {text!r}: want PROFILE=NODESxCARDS,..., e.g. h200=4x8")
    return Cluster(tuple(types), dict(prices or {}))


def example_document(
    model_name: str = "zai-org/GLM-4.5-FP8", percentile: str = "P50"
) -> dict[str, Any]:
    """The articles' topology: MTT S5000 prefill, H200 decode, replicas of 8 cards; TTFT 6 s
    and ITL 20 ms, both at `percentile` (P99 for a ">= 99% of requests" objective)."""
    pool = {
        "prefill": ("s5000", "mthreads.com/gpu", "mtt-s5000", 16),
        "decode": ("h200", "nvidia.com/gpu", "h200", 8),
    }
    return {
        "apiVersion": "pdoperator.io/v1alpha1",
        "kind": "PDDeployment",
        "metadata": {"name": "example"},
        "spec": {
            "model": {"name": model_name, "image": "vllm/vllm-openai:v0.11.0"},
            "slo": {
                "ttft": {"percentile": percentile, "targetMilliseconds": 6000},
                "itl": {"percentile": percentile, "targetMilliseconds": 20},
                "windowSeconds": 60,
            },
            **{
                role: {
                    "pools": [
                        {
                            "name": name,
                            "accelerator": {
                                "resourceName": resource,
                                "perReplica": 8,
                                "profile": profile,
                            },
                            "replicas": {"min": 1, "max": most},
                        }
                    ]
                }
                for role, (name, resource, profile, most) in pool.items()
            },
            "scaling": {"mode": "Active", "intervalSeconds": 30},
        },
    }


TABLE_COLUMNS = (
    "policy",
    "attain_feasible",
    "infeasible",
    "rejected",
    "attain_both",
    "attain_ttft",
    "attain_itl",
    "card_hours",
    "cost",
    "cost_per_m_tokens",
    "scale_actions",
    "wall_s_per_10k",
)


def table_row(result: SimResult) -> dict[str, str]:
    """One result as the columns of `TABLE_COLUMNS` (card-hours per type as `type:hours`)."""
    attainment = result.attainment()
    per_10k = result.wall_s / max(1, result.requests) * 10_000
    return {
        "policy": result.policy,
        "attain_feasible": f"{attainment['feasible']:.3f}",
        "infeasible": str(result.infeasible),
        "rejected": str(result.rejected),
        "attain_both": f"{attainment['both']:.3f}",
        "attain_ttft": f"{attainment['ttft']:.3f}",
        "attain_itl": f"{attainment['itl']:.3f}",
        "card_hours": " ".join(f"{k}:{v:.1f}" for k, v in result.card_hours.items()),
        "cost": f"{result.cost:.2f}",
        "cost_per_m_tokens": f"{result.cost_per_million_tokens:.3f}",
        "scale_actions": str(result.scale_actions),
        "wall_s_per_10k": f"{per_10k:.2f}",
    }


def markdown_table(rows: Sequence[Mapping[str, str]], columns: Sequence[str]) -> str:
    """Rows as a GitHub markdown table."""
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(row.get(c, "") for c in columns) + " |" for row in rows]
    return "\n".join(lines)
