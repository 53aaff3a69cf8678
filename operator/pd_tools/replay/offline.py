"""Offline simulation: a trace through `PDEngine` with an autoscaling policy in the loop.

The loop keeps the operator's real timing: engines are scraped every `scrape_interval_s`; the
policy runs every decision interval on signals computed from those scrapes over the rate window
(`replay.offline_metrics`); a new replica takes a node's cards at once but serves only after its
model-load time; nodes hold a fixed number of cards per accelerator type, so replicas that do not
fit stay pending (unschedulable), as on a real cluster. Card-hours count every replica from
placement until it has drained. `simulate` is pure apart from the optional progress callback.

Beside the loop: the nodes (`replay.cluster`) and the replicas on them (`replay.fleet`), how a
request is judged (`replay.outcomes`), the oracle's and the prescient policy's schedule searches
(`replay.oracle_search`), the result and its table (`replay.results`), progress
(`replay.progress`).
"""

import math
import time
from bisect import bisect_left
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Literal

from pd_operator.api.spec import PDDeploymentSpec, Role
from pd_operator.core.children import PoolKey
from pd_operator.core.engine_metrics import DEFAULT_BOUNDS
from pd_operator.core.hardware import HARDWARE_PROFILES, HardwareProfile, ModelProfile
from pd_operator.core.histogram_bounds import at_target, exported_bounds
from pd_operator.core.resolved import ResolvedSpec, resolve
from pd_tools.enginesim.engine import (
    LatencyBuckets,
    PDEngine,
    ReplicaSpec,
    RequestRecord,
    Routing,
)
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
from pd_tools.replay.cluster import Cluster
from pd_tools.replay.fleet import Fleet, RemovalOrder
from pd_tools.replay.offline_metrics import Scrape, role_signals, scrape, window_stats
from pd_tools.replay.oracle_search import (
    ORACLE_INTERVAL_S,
    oracle_schedule,
    prescient_lead_s,
    prescient_schedule,
)
from pd_tools.replay.outcomes import (
    admitted,
    context_limit,
    feasibility,
    idle_latencies,
    request_outcome,
)
from pd_tools.replay.progress import Progress
from pd_tools.replay.results import RequestOutcome, SimResult
from pd_tools.workloads.traces import ReplayOptions, Request, read_trace

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
SECONDS_PER_HOUR = 3600.0
# The bounds of the simulated engines' TTFT and ITL histograms, which the policies read and
# pd-operator assumes: "engine", the spec's engines' (`core.histogram_bounds.exported_bounds`);
# "at-targets", the engine's defaults with bounds at the SLO targets (`at_target`), as a user
# may give SGLang: what they are worth where the engine (vLLM) cannot have them.
Buckets = Literal["engine", "at-targets"]
BUCKETS: dict[Buckets, Callable[[PDDeploymentSpec, Role], tuple[float, ...]]] = {
    "engine": exported_bounds,
    "at-targets": at_target,
}


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


def peak_replicas(
    resolved: ResolvedSpec, arrivals: Arrivals, room: Mapping[PoolKey, int]
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
            demand = hindsight_demand(resolved, frontend, role)
            sized = fill(resolved, role, demand, frontend.mean_input_tokens, room)
            if sum(sized.values()) > sum(best.values()):
                best = sized
        out.update(best or {(role, p.name): p.replicas.min for p in resolved.spec.pools(role)})
    return out


def make_policy(
    name: str,
    resolved: ResolvedSpec,
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
        interval = timing.decision_interval_s or float(resolved.spec.scaling.interval_seconds)
        return baselines.OperatorPolicy(interval_s=interval, clock_s=timing.clock_s)
    if base == "static-peak":
        return baselines.StaticPeak(peak_replicas(resolved, arrivals, room))
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


def engine_buckets(
    spec: PDDeploymentSpec, bounds: Callable[[PDDeploymentSpec, Role], tuple[float, ...]]
) -> LatencyBuckets:
    """The simulated engines' histogram bounds: TTFT and ITL per `bounds`, E2E the engine's."""
    return LatencyBuckets(
        bounds(spec, "prefill"), bounds(spec, "decode"), DEFAULT_BOUNDS[spec.model.engine].e2e
    )


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
    policy: Policy, resolved: ResolvedSpec, arrivals: Arrivals, room: Mapping[PoolKey, int]
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
            fill(
                resolved,
                role,
                demand_tokens(frontend, role),
                frontend.mean_input_tokens or 1,
                room,
            )
        )
    return out


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
        request_outcome(spec, _shifted(r, warmup_s), records.get(first + k), feasible[first + k])
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
    removal: RemovalOrder | None = None,
    hardware: Mapping[str, HardwareProfile] = HARDWARE_PROFILES,
    buckets: Buckets = "engine",
) -> SimResult:
    """Replay `requests` (sorted by arrival) under `policy`; see the module docstring.

    The first `warmup_s` seconds are a warm-up: their requests run through the same engine
    and policy (queues, prefix caches, replicas and the policy's memory carry over), but the
    result holds only what happens from `warmup_s` on: the requests arriving from then, the
    card-hours, cost and scale actions from then, times relative to it. `static-peak` is
    sized on the measured requests only; the oracle searches the whole span. `routing` is the
    router's choice of prefill instance (`enginesim.engine.Routing`). Requests over the context
    length are refused on arrival, as vLLM refuses them, and only counted (`rejected`).
    `removal` chooses which Ready replica a scale-down removes (`fleet.RemovalOrder`); None:
    as the policy would have it (pd-operator's mark, else the ReplicaSet's default).
    `hardware`: the cards the replicas really run on, by profile name, where they differ from
    the profiles the spec names and the policy seeds from (a card slower than its profile).
    `buckets` chooses the engines' TTFT and ITL histogram bounds (`BUCKETS`); the oracle's
    search judges each request's own latencies, whatever they are.
    """
    if warmup_s < 0:
        raise ValueError(f"the warm-up must not be negative, got {warmup_s}")
    started = time.perf_counter()
    requests, refused = admitted(requests, context_limit(spec, model))
    cluster = cluster or Cluster.fitting(spec)
    fleet = Fleet(
        spec,
        model,
        cluster,
        timing.load_seconds,
        removal=removal or _removal_of(policy),
        count_removals_from_s=warmup_s,
        hardware=hardware,
    )
    arrivals, measured, first_measured = _arrivals(spec, fleet, requests, warmup_s)
    feasible = feasibility(spec, idle_latencies(spec, requests, model))
    resolved = resolve(spec, BUCKETS[buckets])  # once per run: every decision reads it
    chosen = (
        policy
        if not isinstance(policy, str)
        else make_policy(
            policy,
            resolved,
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
                    lead_s=prescient_lead_s(fleet),
                    load_s=timing.load_seconds,
                    progress=progress,
                    routing=routing,
                ),
                prescient_lead_s(fleet),
            ),
        )
    )
    window = max(
        timing.rate_window_s or float(spec.slo.window_seconds),
        MIN_SCRAPES_PER_WINDOW * timing.scrape_interval_s,
    )
    engine = PDEngine(
        requests,
        model=model,
        routing=routing,
        link_bytes_per_second=cluster.link_bytes_per_second,
        buckets=engine_buckets(spec, BUCKETS[buckets]),
    )
    fleet.apply(engine, _initial(chosen, resolved, arrivals, fleet.room()), warm_up=False)
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
            scrapes.append(scrape(engine, now, fleet.pool_labels()))
            scrapes = scrapes[-(int(window / timing.scrape_interval_s) + 4) :]
            next_scrape += timing.scrape_interval_s
        if now >= next_decision:
            next_decision += chosen.interval_s
            view = View(
                now=now,
                resolved=resolved,
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
        if now >= last_arrival and engine.active_requests == 0 and len(records) >= len(requests):
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
        removed=fleet.removed.row(),
    )


def _removal_of(policy: str | Policy) -> RemovalOrder:
    """pd-operator marks the replicas with the least work for removal (`core.removal`); every
    other policy leaves the choice to the ReplicaSet."""
    if isinstance(policy, str):
        operator = policy.partition(":")[0] == "pd-operator"
    else:
        operator = isinstance(policy, baselines.OperatorPolicy)
    return "least-work" if operator else "replicaset"


def _arrivals(
    spec: PDDeploymentSpec, fleet: Fleet, requests: Sequence[Request], warmup_s: float
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
    fleet: Fleet,
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
    """A trace file in any of the formats `workloads.traces.read_trace` reads, as a list."""
    return list(read_trace(path, options or ReplayOptions()))
