"""What one autoscaler decision puts into status: observed values, the decision, conditions and
transition events, with the churn damped so that a steady object costs no status write.

Pure functions of the spec, the observation, the decision and the status as it stands; the
autoscaler keeps the results and the reconciler writes them.
"""

import datetime
import json
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pd_operator.api.spec import PDDeploymentSpec, SeasonalSpec
from pd_operator.core import reasons
from pd_operator.core.children import ROLES, PoolKey
from pd_operator.core.control_law import fabric_words, transfer_explains
from pd_operator.core.decision import Decision, Observation, ScaleRecord
from pd_operator.core.idle import IdleOutcome
from pd_operator.core.reconcile import EventSpec
from pd_operator.core.signals import Reading, ReadingKind, RoleSignals
from pd_operator.core.status import ConditionSpec, ScalingView

# Status is rewritten at least this often while values drift within the tolerance below.
REFRESH_SECONDS = 300.0
# Observed values that moved less than this (relative) are not worth a status write.
OBSERVED_TOLERANCE = 0.05
_STAMP = "%Y-%m-%dT%H:%M:%SZ"


def iso(unix_seconds: float) -> str:
    """An RFC 3339 UTC time, to the second."""
    return time.strftime(_STAMP, time.gmtime(unix_seconds))


def _milliseconds(reading: Reading) -> int | None:
    if reading.kind is not ReadingKind.VALUE or reading.value is None:
        return None
    return round(float(reading.value) * 1000)


def policy_memory_json(decision: Decision) -> str:
    """The decision's policy memory as status keeps it."""
    return json.dumps(decision.state.to_dict(), separators=(",", ":"))


@dataclass
class ScalingOutcome:
    """A decision as status shows it, and the facts the operator's metrics report."""

    view: ScalingView
    slo_met: tuple[bool | None, bool | None]  # prefill (TTFT), decode (ITL); None: unknown
    missing: dict[str, Reading]  # role -> its unavailable latency reading
    capacity_short: bool


def scaling_outcome(
    spec: PDDeploymentSpec,
    observation: Observation,
    decision: Decision,
    *,
    no_series: Mapping[str, float | None],
    now: float,
    memory: bool = True,
    idle: IdleOutcome | None = None,
) -> ScalingOutcome:
    """Observed values, the decision, and the conditions SLOMet, MetricsAvailable,
    MetricsConfigured and CapacityAvailable. `no_series`: the roles whose latency query found
    no series, with since when their pods have been Ready without it (None: none Ready).
    `memory=False` leaves the policy memory out (`policy_memory_json` when it is written)."""
    prefill, decode = observation.signals["prefill"], observation.signals["decode"]
    ttft_ms, itl_ms = _milliseconds(prefill.ttft_seconds), _milliseconds(decode.itl_seconds)
    transfer_ms = _milliseconds(prefill.kv_transfer_seconds)
    rps = prefill.requests_per_second.rate_or_zero()
    view = ScalingView(
        observed={  # unknown values are left out, never written as 0
            name: value
            for name, value in (
                ("ttftMilliseconds", ttft_ms),
                ("itlMilliseconds", itl_ms),
                ("kvTransferMilliseconds", transfer_ms),
                ("requestsPerSecond", round(rps, 3) if rps is not None else None),
                ("sampleTime", iso(now)),
            )
            if value is not None
        },
        last_decision={
            "time": iso(now),
            "prefillReplicas": decision.role_replicas("prefill"),
            "decodeReplicas": decision.role_replicas("decode"),
            "reason": decision.reason[:1024],
            "limitedBy": decision.limited_by,
        },
        policy_memory=policy_memory_json(decision) if memory else None,
    )
    slo_met = (
        None if ttft_ms is None else ttft_ms <= spec.slo.ttft.target_milliseconds,
        None if itl_ms is None else itl_ms <= spec.slo.itl.target_milliseconds,
    )
    latencies = {"prefill": prefill.ttft_seconds, "decode": decode.itl_seconds}
    missing = {r: s for r, s in latencies.items() if s.kind is ReadingKind.UNAVAILABLE}
    at_zero = idle is not None and idle.scaled_to_zero and idle.traffic_known
    if missing and at_zero:
        # No engine runs, so none exports; the router's activator is read instead.
        missing = {}
        available = ConditionSpec(
            reasons.METRICS_AVAILABLE, True, reasons.SCALED_TO_ZERO,
            "no engine runs: the router's activator is read for requests",
        )  # fmt: skip
    elif missing:
        detail = "; ".join(f"{role}: {reading.reason}" for role, reading in missing.items())
        available = ConditionSpec(
            reasons.METRICS_AVAILABLE, False, reasons.METRICS_UNAVAILABLE, detail
        )
    else:
        available = ConditionSpec(reasons.METRICS_AVAILABLE, True, reasons.AS_EXPECTED, "")
    grace = spec.slo.window_seconds + spec.scaling.interval_seconds
    capacity = capacity_available(spec, observation, decision)
    capacity_short = capacity.status is False
    view.conditions = [
        available,
        metrics_configured(missing, observation, no_series, grace, now),
        _slo_met(spec, slo_met, fabric=_fabric_bound(spec, prefill)),
        capacity,
    ]
    if spec.scaling.seasonal is not None:
        view.conditions.append(_seasonal_history(spec.scaling.seasonal, observation, bool(missing)))
    if spec.scaling.idle_seconds is not None and idle is not None:
        view.conditions.append(scaled_to_zero(idle))
    return ScalingOutcome(view, slo_met, missing, capacity_short)


def scaled_to_zero(idle: IdleOutcome) -> ConditionSpec:
    """ScaledToZero: True while every pool is at zero for lack of requests."""
    if idle.scaled_to_zero:
        return ConditionSpec(reasons.SCALED_TO_ZERO, True, reasons.IDLE, idle.reason)
    if not idle.traffic_known:
        message = "no activator metrics from the router: idleness unknown, replicas kept"
        return ConditionSpec(reasons.SCALED_TO_ZERO, False, reasons.ROUTER_TRAFFIC_UNKNOWN, message)
    return ConditionSpec(reasons.SCALED_TO_ZERO, False, reasons.SERVING, idle.reason)


def capacity_available(
    spec: PDDeploymentSpec, observation: Observation, decision: Decision
) -> ConditionSpec:
    """False when the decision wanted more than the nodes have room for, or when the nodes
    cannot hold the replicas a pool has now: that needs no metrics, so it stays current while
    the autoscaler holds for lack of them."""
    if decision.limited_by == "capacity" or any(p.limited_by == "capacity" for p in decision.pools):
        return ConditionSpec(
            reasons.CAPACITY_AVAILABLE, False, reasons.CAPACITY_EXHAUSTED, decision.reason
        )
    short = []
    room = observation.room(spec)
    for role, pool in ((r, p) for r in ROLES for p in spec.pools(r)):
        seen = observation.pools.get((role, pool.name))
        if seen is None or room is None:
            continue
        why = room.shortage(
            pool, not_ready=seen.replicas - seen.ready, unschedulable=seen.unschedulable
        )
        if why:
            short.append(f"{role} pool {pool.name}: {why}")
    if short:
        message = "; ".join(short)[:1024]
        return ConditionSpec(reasons.CAPACITY_AVAILABLE, False, reasons.CAPACITY_EXHAUSTED, message)
    return ConditionSpec(reasons.CAPACITY_AVAILABLE, True, reasons.AS_EXPECTED, "")


def _seasonal_history(
    seasonal: SeasonalSpec, observation: Observation, unavailable: bool
) -> ConditionSpec:
    """Whether Prometheus held each role's demand on every season `spec.scaling.seasonal`
    reads: without all of them there is no forecast, and a platform engineer who turned it on
    should see why nothing is pre-warmed."""
    if unavailable:
        return ConditionSpec(
            reasons.SEASONAL_HISTORY, None, reasons.METRICS_UNAVAILABLE, "metrics unavailable"
        )
    found = {
        role: sum(1 for season in signals.seasons if season)
        for role, signals in sorted(observation.signals.items())
    }
    if all(count == seasonal.seasons for count in found.values()):
        message = f"the last {seasonal.seasons} {seasonal.unit} found for every role"
        return ConditionSpec(reasons.SEASONAL_HISTORY, True, reasons.HISTORY_FOUND, message)
    short = ", ".join(
        f"{role} {count} of {seasonal.seasons}"
        for role, count in found.items()
        if count < seasonal.seasons
    )
    message = (
        f"history found for {short} {seasonal.unit}: no pre-warming from history until "
        "Prometheus holds "
        f"all {seasonal.seasons} (its --storage.tsdb.retention.time must cover them), or lower "
        "spec.scaling.seasonal.seasons"
    )
    return ConditionSpec(reasons.SEASONAL_HISTORY, False, reasons.HISTORY_MISSING, message)


def _fabric_bound(spec: PDDeploymentSpec, prefill: RoleSignals) -> bool:
    """The TTFT breach is the KV hand-off's, as the policy judges it (`transfer_explains`)."""
    ttft = prefill.ttft_seconds
    return (
        ttft.kind is ReadingKind.VALUE
        and ttft.value is not None
        and transfer_explains(
            ttft.value, prefill.kv_transfer_seconds, spec.slo.ttft.target_milliseconds / 1000
        )
    )


def _slo_met(
    spec: PDDeploymentSpec, slo_met: tuple[bool | None, bool | None], *, fabric: bool = False
) -> ConditionSpec:
    if None in slo_met:
        return ConditionSpec(reasons.SLO_MET, None, reasons.METRICS_UNAVAILABLE, "latency unknown")
    met = all(slo_met)
    # Words, not the numbers (those are in status.observed): a message that changed with every
    # sample would cost a status write every cycle.
    message = "; ".join(
        f"{name} {'within' if ok else 'above'} its {target} ms target"
        for name, ok, target in (
            ("TTFT", slo_met[0], spec.slo.ttft.target_milliseconds),
            ("ITL", slo_met[1], spec.slo.itl.target_milliseconds),
        )
    )
    if fabric and slo_met[0] is False:
        # Named, so that a platform engineer looks at the fabric rather than at prefill.
        message += (
            f"; the TTFT breach is the KV transfer's: the fabric "
            f"({fabric_words(spec.kv_transfer)}), not prefill (spec.kvTransfer)"
        )
        return ConditionSpec(reasons.SLO_MET, False, reasons.KV_TRANSFER_BOUND, message)
    return ConditionSpec(
        reasons.SLO_MET, met, reasons.WITHIN_SLO if met else reasons.SLO_VIOLATED, message
    )


def metrics_configured(
    missing: Mapping[str, Reading],
    observation: Observation,
    no_series: Mapping[str, float | None],
    grace_seconds: float,
    now: float,
) -> ConditionSpec:
    """False when a role's latency query has found no series for longer than `grace_seconds`
    although pods of the role are Ready: the engines run, so Prometheus does not scrape them
    or their labels do not match. (A new target needs a scrape and a rate window first.)"""
    problems, waiting = [], []
    for role, reading in missing.items():
        if role not in no_series:
            continue  # an error or an outage, not a query that finds nothing
        ready = sum(p.ready for (r, _), p in observation.pools.items() if r == role)
        since = no_series[role]
        if not ready or since is None or now - since < grace_seconds:
            waiting.append(role)
        else:
            problems.append(f"{role}: {ready} pods Ready but {reading.reason}")
    if problems:
        message = "; ".join(problems) + (
            ". Check that Prometheus scrapes the pods and relabels pdoperator.io/deployment and "
            "pdoperator.io/role to the labels deployment and role (docs/observability.md), and "
            "that spec.model.engine names the engine that serves them"
        )
        return ConditionSpec(
            reasons.METRICS_CONFIGURED, False, reasons.METRICS_MISCONFIGURED, message[:1024]
        )
    if waiting:
        return ConditionSpec(
            reasons.METRICS_CONFIGURED,
            None,
            reasons.NO_READY_PODS,
            f"no series yet for {', '.join(waiting)}: its pods are not Ready or just started",
        )
    return ConditionSpec(reasons.METRICS_CONFIGURED, True, reasons.AS_EXPECTED, "")


def _close(new: Any, old: Any) -> bool:
    if isinstance(new, int | float) and isinstance(old, int | float):
        return abs(new - old) <= OBSERVED_TOLERANCE * max(abs(new), abs(old), 1e-9)
    return bool(new == old)


def _age_seconds(stamp: str | None, now: float) -> float:
    if not stamp:
        return float("inf")
    # fromisoformat: strptime was 5% of an autoscaler cycle at 500 objects.
    return now - datetime.datetime.fromisoformat(stamp).timestamp()


def damp_churn(
    view: ScalingView, previous: Mapping[str, Any], now: float, *, scaled: bool = False
) -> None:
    """Keep what status already says when nothing that matters changed, so that a steady
    object costs no status write per cycle: the decision counts when it changes a pool's
    replicas (`scaled`), its role totals or its limit; observed values when they move by more
    than the tolerance; both at least every REFRESH_SECONDS."""
    old_decision, new_decision = previous.get("lastDecision"), view.last_decision
    if old_decision and new_decision and not scaled:
        same = all(
            old_decision.get(k) == new_decision.get(k)
            for k in ("prefillReplicas", "decodeReplicas", "limitedBy")
        )
        if same and _age_seconds(old_decision.get("time"), now) < REFRESH_SECONDS:
            view.last_decision = dict(old_decision)
    old_observed, new_observed = previous.get("observed"), view.observed
    if old_observed and new_observed:
        keys = (set(old_observed) | set(new_observed)) - {"sampleTime"}
        same = all(_close(new_observed.get(k), old_observed.get(k)) for k in keys)
        if same and _age_seconds(old_observed.get("sampleTime"), now) < REFRESH_SECONDS:
            view.observed = dict(old_observed)
            # The memory changes with every decision (its windows hold times); it is written
            # when status is written for another reason, and read back after a restart.
            if view.last_decision == old_decision and previous.get("policyMemory"):
                view.policy_memory = previous["policyMemory"]


def transition_events(
    previous: Mapping[str, Any],
    view: ScalingView,
    decision: Decision,
    observation: Observation,
    *,
    advisory: bool,
) -> list[EventSpec]:
    """Events for changes only: a scale step, or a condition turning bad since `previous`
    (the status as it stands)."""
    before = {c["type"]: c.get("status") for c in previous.get("conditions") or []}
    events = []
    for kind, reason in (
        (reasons.SLO_MET, reasons.EVENT_SLO_VIOLATED),
        (reasons.METRICS_AVAILABLE, reasons.EVENT_METRICS_UNAVAILABLE),
        (reasons.METRICS_CONFIGURED, reasons.EVENT_METRICS_MISCONFIGURED),
        (reasons.CAPACITY_AVAILABLE, reasons.EVENT_CAPACITY_EXHAUSTED),
    ):
        condition = next(c for c in view.conditions if c.type == kind)
        if condition.status is False and before.get(kind) != "False":
            events.append(EventSpec("Warning", reason, condition.message))
    for (role, pool), desired in decision.replicas.items():
        current = observation.pools[(role, pool)].replicas
        if desired != current:
            events.append(
                scale_event((role, pool), current, desired, decision.reason, advisory=advisory)
            )
    return events


def scale_event(
    pool: PoolKey, current: int, desired: int, why: str, *, advisory: bool = False
) -> EventSpec:
    """The ScaledUp or ScaledDown event of a pool's new replicas."""
    reason = reasons.EVENT_SCALED_UP if desired > current else reasons.EVENT_SCALED_DOWN
    mode = " (advisory)" if advisory else ""
    message = f"{pool[0]} pool {pool[1]}: {current} -> {desired}{mode}: {why}"
    return EventSpec("Normal", reason, message[:1024])


def unreported_scales(recorded: Iterable[str], reported: str | None) -> list[ScaleRecord]:
    """The scale records kept on the pools' Deployments (`ANNOTATION_LAST_SCALE`) that are newer
    than `reported`, the time of the last decision status shows or is about to: decisions whose
    status write and events a stopped operator did not get to. Oldest first."""
    records = [r for r in map(ScaleRecord.from_json, recorded) if r is not None]
    newer = [r for r in records if reported is None or r.time > reported]
    return sorted(newer, key=lambda record: record.time)


def finish_scales(
    previous: Mapping[str, Any], unreported: Sequence[ScaleRecord]
) -> tuple[Mapping[str, Any], list[EventSpec]]:
    """Status as if it had reported the newest of `unreported` (what `damp_churn` keeps when
    the new decision changes nothing), and the events they never got."""
    events = [
        scale_event(
            (r.role, r.pool), r.from_replicas, r.to_replicas, str(r.last_decision["reason"])
        )
        for r in unreported
    ]
    if unreported:
        previous = {**previous, "lastDecision": dict(unreported[-1].last_decision)}
    return previous, events
