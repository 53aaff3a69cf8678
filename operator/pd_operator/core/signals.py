"""Metric reads as the autoscaler sees them: a value, no traffic, or unavailable.

A failed Prometheus query is not zero demand, and a latency percentile over a window without
requests is not a number (PromQL returns NaN or nothing). Both are easy to mistake for zero; here
each is its own state, and only `rate_or_zero` turns "no traffic" into 0, for rates, where that is
what it means. The adapter that queries Prometheus builds these; `core.policy` consumes them.
"""

import math
from dataclasses import dataclass
from enum import StrEnum


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
    generation_tokens_per_second: Reading = NOT_READ


# Upper bounds (seconds) of the engines' default latency histograms: the resolution of any
# `histogram_quantile` the adapter reads. vLLM: vllm/v1/metrics/loggers.py,
# PrometheusStatLogger (vllm:time_to_first_token_seconds, vllm:inter_token_latency_seconds).
# SGLang: python/sglang/srt/metrics/collector.py, TokenizerMetricsCollector
# (bucket_time_to_first_token, bucket_inter_token_latency).
# fmt: off
LATENCY_BUCKETS: dict[str, dict[str, tuple[float, ...]]] = {
    "VLLM": {
        "prefill": (
            0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5,
            10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
        ),
        "decode": (
            0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5,
            10.0, 20.0, 40.0, 80.0,
        ),
    },
    "SGLang": {
        "prefill": (
            0.1, 0.2, 0.4, 0.6, 0.8, 1.0, 2.0, 4.0, 6.0, 8.0, 10.0, 20.0, 40.0, 60.0, 80.0, 100.0,
            200.0, 400.0,
        ),
        "decode": (
            0.002, 0.004, 0.006, 0.008, 0.010, 0.015, 0.020, 0.025, 0.030, 0.035, 0.040, 0.060,
            0.080, 0.100, 0.200, 0.400, 0.600, 0.800, 1.000, 2.000, 4.000, 6.000, 8.000,
        ),
    },
}
# fmt: on


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
