"""The hindsight searches behind the `oracle` and `prescient` reference policies.

Both find, per interval, the fewest replicas per pool with which the requests meet the SLO, by
forking the running simulation and trying candidate deployments on the trace itself:
`oracle_schedule` with replicas serving at once, `prescient_schedule` with each interval's
replicas chosen a model load ahead. `baselines.Oracle` and `baselines.Prescient` replay them.
"""

import copy
import math
from bisect import bisect_left
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

from pd_operator.api.spec import PDDeploymentSpec, Role
from pd_operator.core.children import PoolKey
from pd_operator.core.hardware import ModelProfile
from pd_operator.core.placement import replica_cards
from pd_tools.enginesim.engine import PDEngine, Routing
from pd_tools.replay.baselines import ROLES, started_replicas
from pd_tools.replay.cluster import Cluster, accelerator_profile
from pd_tools.replay.fleet import Fleet
from pd_tools.replay.outcomes import meets_slo
from pd_tools.replay.progress import Progress
from pd_tools.workloads.traces import Request

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


def _unchanging(engine: PDEngine, fleet: Fleet, feed: _Feed) -> dict[int, Any]:
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
    engine: PDEngine, fleet: Fleet, feed: _Feed, unchanging: Mapping[int, Any]
) -> tuple[PDEngine, Fleet, _Feed]:
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
        self.fleet = Fleet(spec, model, cluster, load_s)
        self.feed = _Feed(requests)
        self.engine = PDEngine(
            self.feed,
            model=model,
            routing=routing,
            link_bytes_per_second=cluster.link_bytes_per_second,
        )
        self.times = [r.arrival_s for r in requests]
        self.span = self.times[-1] if self.times else 0.0
        self.lowest = {key: pool.replicas.min for key, pool in self.fleet.pools.items()}
        self._unchanging = _unchanging(self.engine, self.fleet, self.feed)

    def fork(self, stop_s: float) -> tuple[PDEngine, Fleet]:
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
                tried[key] = sum(1 for i in judged if not meets_slo(spec, requests[i], done.get(i)))
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
    slowest = prescient_lead_s(fleet)
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
                missed = sum(1 for i in judged if not meets_slo(spec, requests[i], done.get(i)))
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


def prescient_lead_s(fleet: Fleet) -> float:
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
    fleet: Fleet,
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


def _cost_per_hour(fleet: Fleet, cluster: Cluster, config: Mapping[PoolKey, int]) -> float:
    return sum(
        n * replica_cards(fleet.pools[key]) * cluster.price(accelerator_profile(fleet.pools[key]))
        for key, n in config.items()
    )
