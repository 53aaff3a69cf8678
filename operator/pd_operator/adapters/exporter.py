"""The autoscaler's per-PDDeployment series on the operator's /metrics (gauges: `metrics.py`).

Each decision sets its object's series; they go when the object goes, stops being scaled, or
(a pool's) leaves the spec, so that an alert never fires for something that is not there.
"""

import contextlib
from collections.abc import Set

from prometheus_client import Gauge

from pd_operator.adapters import metrics
from pd_operator.adapters.cache import ObjectKey
from pd_operator.api.spec import PDDeploymentSpec
from pd_operator.core.children import ROLES, PoolKey
from pd_operator.core.decision import Decision, Observation
from pd_operator.core.scaling_view import ScalingOutcome


def export_decision(
    key: ObjectKey,
    spec: PDDeploymentSpec,
    outcome: ScalingOutcome,
    decision: Decision,
    observation: Observation,
    *,
    exported: Set[PoolKey],
) -> set[PoolKey]:
    """Set one object's series for a decision, removing those of pools `exported` before and
    observed no more; returns the pools exported now."""
    for role, met in zip(ROLES, outcome.slo_met, strict=True):
        labels = (key[0], key[1], role)
        _set_or_remove(metrics.SLO_MET, labels, None if met is None else float(met))
        _set(metrics.METRICS_AVAILABLE, labels, 0 if role in outcome.missing else 1)
        signals = observation.signals[role]
        _set_or_remove(metrics.OBSERVED_LATENCY, labels, signals.latency(role).value)
        _set(metrics.LATENCY_TARGET, labels, spec.slo.target(role).target_milliseconds / 1000)
    _set(metrics.CAPACITY_AVAILABLE, key, 0 if outcome.capacity_short else 1)
    for pool_key, seen in observation.pools.items():
        values = (seen.replicas, seen.ready, decision.replicas.get(pool_key, seen.replicas))
        for state, value in zip(metrics.POOL_STATES, values, strict=True):
            _set(metrics.POOL_REPLICAS, (*key, *pool_key, state), value)
    now_exported = set(observation.pools)
    _remove_pools(key, exported - now_exported)
    current = sum(p.replicas for p in observation.pools.values())
    wanted = sum(decision.replicas.values())
    direction = "up" if wanted > current else "down" if wanted < current else "hold"
    metrics.DECISIONS.labels(direction=direction, limited_by=decision.limited_by).inc()
    return now_exported


def remove_object(key: ObjectKey, pools: Set[PoolKey]) -> None:
    """Remove every series of an object (deleted, or no longer scaled): they would otherwise
    keep their last values, and an alert on them would fire for an object that is not there."""
    _remove_pools(key, pools)
    for role in ROLES:
        for gauge in metrics.ROLE_GAUGES:
            _remove(gauge, (key[0], key[1], role))
    _remove(metrics.CAPACITY_AVAILABLE, key)


def observe_cycle(seconds: float) -> None:
    """Record the wall time of one autoscaler cycle."""
    metrics.DECISION_CYCLE_SECONDS.observe(seconds)


# The series this module exports, by gauge and labels: `Gauge.labels` costs more than the
# `set` itself, and a cycle sets about 16 series per object. Only `_remove` removes them.
_SERIES: dict[tuple[Gauge, tuple[str, ...]], Gauge] = {}


def _set(gauge: Gauge, labels: tuple[str, ...], value: float) -> None:
    series = _SERIES.get((gauge, labels))
    if series is None:
        series = _SERIES[(gauge, labels)] = gauge.labels(*labels)
    series.set(value)


def _set_or_remove(gauge: Gauge, labels: tuple[str, ...], value: float | None) -> None:
    """Set a gauge's series, or remove it for an unknown value (absent, not 0)."""
    if value is None:
        _remove(gauge, labels)
    else:
        _set(gauge, labels, value)


def _remove(gauge: Gauge, labels: tuple[str, ...]) -> None:
    _SERIES.pop((gauge, labels), None)
    with contextlib.suppress(KeyError):  # never exported
        gauge.remove(*labels)


def _remove_pools(key: ObjectKey, pools: Set[PoolKey]) -> None:
    for pool_key in pools:
        for state in metrics.POOL_STATES:
            _remove(metrics.POOL_REPLICAS, (*key, *pool_key, state))
