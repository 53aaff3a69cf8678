"""Metric reads as the autoscaler sees them: a value, no traffic, or unavailable.

A failed Prometheus query is not zero demand, and a latency percentile over a window without
requests is not a number (PromQL returns NaN or nothing). Both are easy to mistake for zero; here
each is its own state, and only `rate_or_zero` turns "no traffic" into 0, for rates, where that is
what it means. The adapter that queries Prometheus builds these; `core.policy` consumes them.
"""

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum

from pd_operator.api.spec import Role
from pd_operator.core.engine_metrics import DEFAULT_BOUNDS
from pd_operator.core.seasonal import Season


class ReadingKind(StrEnum):
    VALUE = "Value"
    NO_TRAFFIC = "NoTraffic"
    UNAVAILABLE = "Unavailable"


@dataclass(frozen=True)
class Reading:
    """One metric read: a finite non-negative value, no traffic, or unavailable (with why)."""

    kind: ReadingKind
    value: float | None = None
    reason: str = ""

    def __post_init__(self) -> None:
        if self.kind is ReadingKind.VALUE:
            if self.value is None or not math.isfinite(self.value) or self.value < 0:
                raise ValueError(f"a metric value must be finite and >= 0, got {self.value}")
        elif self.value is not None:
            raise ValueError(f"a {self.kind} reading carries no value")

    @classmethod
    def of(cls, value: float) -> "Reading":
        """A measured value."""
        return cls(ReadingKind.VALUE, float(value))

    def rate_or_zero(self) -> float | None:
        """For rates and counts: no traffic is 0; unavailable stays None (unknown)."""
        if self.kind is ReadingKind.NO_TRAFFIC:
            return 0.0
        return self.value


NO_TRAFFIC = Reading(ReadingKind.NO_TRAFFIC)


def unavailable(reason: str) -> Reading:
    """A read that failed or returned nothing usable; `reason` says which and why."""
    return Reading(ReadingKind.UNAVAILABLE, reason=reason)


NOT_READ = unavailable("not read")


@dataclass(frozen=True)
class RouterTraffic:
    """The router's activator (`spec.scaling.idleSeconds`) as Prometheus last scraped it,
    summed over its pods: the one signal left when both roles are at zero (`core.idle`)."""

    requests_total: float  # requests received (a counter: a restart resets it)
    pending: float  # requests held now, waiting for both roles
    in_flight: float  # requests received and not yet answered, the held ones included


@dataclass(frozen=True)
class PoolSignals:
    """One pool's own share of its role's signals (series grouped by the engines' `pool`
    label): what lets a role of several pools learn each pool's capacity on its own."""

    latency_seconds: Reading = NOT_READ  # at the role's SLO percentile, over the SLO window
    # Prompt tokens for prefill, generated tokens for decode: what `latency` was served at.
    served_tokens_per_second: Reading = NOT_READ


@dataclass(frozen=True)
class RoleSignals:
    """What Prometheus said about one role (prefill or decode) at `sample_time`.

    Latencies are at the percentile of the role's SLO over the SLO window. Gauges (queue depth,
    running requests, KV-cache usage) are summed over the role's ready replicas, except KV-cache
    usage, which is their mean (0..1). Anything not read stays unavailable, never zero.
    """

    sample_time: float  # unix seconds of the evaluation
    ttft_seconds: Reading = NOT_READ
    itl_seconds: Reading = NOT_READ
    queue_depth: Reading = NOT_READ  # requests waiting
    running_requests: Reading = NOT_READ
    kv_cache_usage: Reading = NOT_READ  # a fraction; above 1 only by rounding
    requests_per_second: Reading = NOT_READ
    prompt_tokens_per_second: Reading = NOT_READ
    # Of those, the prompt tokens found in the engines' prefix cache (vLLM's
    # prefix_cache_hits, SGLang's cached_tokens): not computed again.
    cached_prompt_tokens_per_second: Reading = NOT_READ
    generation_tokens_per_second: Reading = NOT_READ
    # The role's mean latency over the window (TTFT for prefill, ITL for decode), from the
    # histogram's sum and count: exact, unlike a percentile read inside a bucket.
    mean_latency_seconds: Reading = NOT_READ
    # Prefill: the mean KV hand-off to decode inside the TTFT read (`hand_off_seconds`).
    kv_transfer_seconds: Reading = NOT_READ
    # Prefill: a prompt's mean wait in the engines' queue over the window (vLLM's
    # request_queue_time, SGLang's queue_time): what queueing adds to the TTFT.
    queue_seconds: Reading = NOT_READ
    # With `spec.scaling.seasonal`: what the role served (tokens/s) from this moment one, two,
    # ... periods ago onwards (`core.seasonal.Season`); empty: not read or no history.
    seasons: tuple[Season, ...] = ()
    # With `spec.scaling.idleSeconds`: the router's traffic, the same in both roles' signals
    # (it is the object's, not a role's); None: not read, or no activator series.
    router_traffic: RouterTraffic | None = None
    # Per pool (by name), where the series carry the `pool` label; empty: not read.
    pools: Mapping[str, PoolSignals] = field(default_factory=dict)

    def latency(self, role: Role) -> Reading:
        """The latency the role is scaled on: TTFT for prefill, ITL for decode."""
        return self.ttft_seconds if role == "prefill" else self.itl_seconds


def hand_off_seconds(
    ttft_mean: Reading, queue_mean: Reading, prefill_mean: Reading, connector_mean: Reading
) -> Reading:
    """The mean KV hand-off inside the TTFT read: the connector's mean transfer time, no more
    than what the TTFT holds besides queue and prefill (TTFT less both, never below 0).

    Where the TTFT is measured on the prefill engine alone (vLLM's prefill side) the remainder
    is about 0, and a slow fabric explains none of it. Without the connector the remainder is
    the hand-off, which also counts a wait for decode's KV room; without the remainder the
    connector's time is taken as part of the TTFT (a router's or frontend's).
    """
    parts = (ttft_mean, queue_mean, prefill_mean)
    values = [p.value for p in parts if p.kind is ReadingKind.VALUE and p.value is not None]
    rest = max(0.0, values[0] - values[1] - values[2]) if len(values) == 3 else None
    if connector_mean.kind is ReadingKind.VALUE and connector_mean.value is not None:
        return Reading.of(connector_mean.value if rest is None else min(rest, connector_mean.value))
    if rest is not None:
        return Reading.of(rest)
    if NO_TRAFFIC in (ttft_mean, connector_mean):
        return NO_TRAFFIC
    missing = next(
        (p.reason for p in (connector_mean, *parts) if p.kind is ReadingKind.UNAVAILABLE), ""
    )
    return unavailable(f"no KV transfer time and no TTFT, queue and prefill means: {missing}")


# What each role's latency is called in reasons and logs.
LATENCY_NAMES: dict[Role, str] = {"prefill": "TTFT", "decode": "ITL"}

# The engines' default bounds of the histogram each role's latency is read from, per engine
# and role: where a reading may lie (SGLang's may be set otherwise: `core.histogram_bounds`).
LATENCY_BUCKETS: dict[str, dict[str, tuple[float, ...]]] = {
    engine: {"prefill": bounds.ttft, "decode": bounds.itl}
    for engine, bounds in DEFAULT_BOUNDS.items()
}


def bucket_of(bounds: tuple[float, ...], value: float) -> tuple[float, float]:
    """The histogram bucket (lower, upper] a quantile `value` was interpolated in.

    `histogram_quantile` interpolates linearly inside a bucket, so a value says only that the
    percentile lies somewhere in its bucket. Past the last bound Prometheus answers that bound:
    the percentile is at least it.
    """
    if bounds and value >= bounds[-1]:
        return bounds[-1], math.inf
    lower = 0.0
    for upper in bounds:
        if value <= upper:
            return lower, upper
        lower = upper
    return lower, math.inf
