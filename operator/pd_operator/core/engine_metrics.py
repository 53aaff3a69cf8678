"""The metric names each inference engine (version) exports: one table for reader and writer.

The operator's Prometheus reader (adapters/promql.py) queries these names and the engine
simulator (enginesim/metrics.py) writes them; both derive their tables from this one, so what the
simulator writes is what the operator reads. Counters are named without the `_total` that
their samples carry, histograms without the `_bucket`/`_sum`/`_count` suffixes.
"""

from dataclasses import dataclass, fields, replace


@dataclass(frozen=True)
class EngineMetricNames:
    """The metric names one engine (version) exports; None: not exported (or not relied on)."""

    name: str
    ttft_histogram: str
    itl_histogram: str
    e2e_histogram: str | None
    waiting: str | None  # gauge
    running: str | None  # gauge
    kv_usage: str | None  # gauge, fraction 0..1
    prompt_tokens: str | None  # counter
    generation_tokens: str | None  # counter
    cache_hit_tokens: str | None  # counter: prompt tokens found in the prefix cache
    cache_query_tokens: str | None  # counter: prompt tokens looked up in it
    # The KV hand-off (docs/autoscaling.md, "The KV hand-off"): the connector's transfer-time
    # histogram (seconds, or milliseconds where the name ends in `_ms`), on whichever side
    # moves the KV; and the prefill side's queue and compute time, whose difference from
    # TTFT is the hand-off where the connector says nothing.
    kv_transfer_histogram: str | None = None
    queue_time_histogram: str | None = None
    prefill_time_histogram: str | None = None

    def underscored(self) -> "EngineMetricNames":
        """The same metrics with `_` instead of the `:` after the engine prefix."""
        names = {
            field.name: value.replace(":", "_", 1)
            for field in fields(self)
            if field.name != "name" and (value := getattr(self, field.name)) is not None
        }
        return replace(self, name=f"{self.name}-underscore", **names)


# vLLM v1 (vllm/v1/metrics/loggers.py).
VLLM = EngineMetricNames(
    name="vllm",
    ttft_histogram="vllm:time_to_first_token_seconds",
    itl_histogram="vllm:inter_token_latency_seconds",
    e2e_histogram="vllm:e2e_request_latency_seconds",
    waiting="vllm:num_requests_waiting",
    running="vllm:num_requests_running",
    kv_usage="vllm:kv_cache_usage_perc",
    prompt_tokens="vllm:prompt_tokens",
    generation_tokens="vllm:generation_tokens",
    cache_hit_tokens="vllm:prefix_cache_hits",
    cache_query_tokens="vllm:prefix_cache_queries",
    # NixlConnector (vllm/distributed/kv_transfer/kv_connector/v1/nixl_connector.py's
    # NixlPromMetrics), observed where the transfer is issued: the decode side, which pulls.
    kv_transfer_histogram="vllm:nixl_xfer_time_seconds",
    queue_time_histogram="vllm:request_queue_time_seconds",
    prefill_time_histogram="vllm:request_prefill_time_seconds",
)
# vLLM's names as they arrive when its prometheus_client answers an OpenMetrics scrape and
# escapes the colons (prometheus_client >= 0.22 with Prometheus asking for OpenMetrics).
VLLM_UNDERSCORE = VLLM.underscored()
# vLLM before the V1 metrics rename: ITL was "time per output token", and there were no
# prefix-cache token counters.
VLLM_LEGACY = replace(
    VLLM,
    name="vllm-legacy",
    itl_histogram="vllm:time_per_output_token_seconds",
    kv_usage="vllm:gpu_cache_usage_perc",
    cache_hit_tokens=None,
    cache_query_tokens=None,
    kv_transfer_histogram=None,
)
# SGLang (python/sglang/srt/metrics/collector.py).
SGLANG = EngineMetricNames(
    name="sglang",
    ttft_histogram="sglang:time_to_first_token_seconds",
    itl_histogram="sglang:inter_token_latency_seconds",
    e2e_histogram="sglang:e2e_request_latency_seconds",
    waiting="sglang:num_queue_reqs",
    running="sglang:num_running_reqs",
    kv_usage="sglang:token_usage",
    prompt_tokens="sglang:prompt_tokens",
    generation_tokens="sglang:generation_tokens",
    cache_hit_tokens="sglang:cached_tokens",
    cache_query_tokens=None,
    # The disaggregation metrics (python/sglang/srt/metrics/collector.py; a gauge before they
    # became histograms, which reads as no series). SGLang has no prefill-time histogram.
    kv_transfer_histogram="sglang:kv_transfer_latency_ms",
    queue_time_histogram="sglang:queue_time_seconds",
)
# Some SGLang versions write an underscore instead of the colon (CONTEXT.md).
SGLANG_UNDERSCORE = SGLANG.underscored()
# Dynamo's frontend measures latency at the router (label `model`, lower-cased). Only its two
# latency histograms are relied on; per-pool gauges and token counters are not read from it.
DYNAMO = EngineMetricNames(
    name="dynamo",
    ttft_histogram="dynamo_frontend_time_to_first_token_seconds",
    itl_histogram="dynamo_frontend_inter_token_latency_seconds",
    e2e_histogram=None,
    waiting=None,
    running=None,
    kv_usage=None,
    prompt_tokens=None,
    generation_tokens=None,
    cache_hit_tokens=None,
    cache_query_tokens=None,
)


@dataclass(frozen=True)
class LatencyBounds:
    """Upper bounds (seconds) of an engine's default latency histograms: what the simulator
    writes, and the resolution of any `histogram_quantile` the operator reads."""

    ttft: tuple[float, ...]
    itl: tuple[float, ...]
    e2e: tuple[float, ...]
    # vLLM's request_queue_time and request_prefill_time share the e2e bounds
    # (request_latency_buckets); the NIXL transfer time has its own.
    kv_transfer: tuple[float, ...] = ()


# fmt: off
# vLLM: vllm/v1/metrics/loggers.py, PrometheusStatLogger (vllm:time_to_first_token_seconds,
# vllm:inter_token_latency_seconds, vllm:e2e_request_latency_seconds' request_latency_buckets).
VLLM_BOUNDS = LatencyBounds(
    ttft=(
        0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5,
        10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
    ),
    itl=(
        0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
        20.0, 40.0, 80.0,
    ),
    e2e=(
        0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0,
        240.0, 480.0, 960.0, 1920.0, 7680.0,
    ),
    # NixlPromMetrics' buckets[1:].
    kv_transfer=(0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 5.0),
)
# SGLang: python/sglang/srt/metrics/collector.py, TokenizerMetricsCollector
# (bucket_time_to_first_token, bucket_inter_token_latency, bucket_e2e_request_latency).
SGLANG_BOUNDS = LatencyBounds(
    ttft=(
        0.1, 0.2, 0.4, 0.6, 0.8, 1.0, 2.0, 4.0, 6.0, 8.0, 10.0, 20.0, 40.0, 60.0, 80.0, 100.0,
        200.0, 400.0,
    ),
    itl=(
        0.002, 0.004, 0.006, 0.008, 0.010, 0.015, 0.020, 0.025, 0.030, 0.035, 0.040, 0.060,
        0.080, 0.100, 0.200, 0.400, 0.600, 0.800, 1.000, 2.000, 4.000, 6.000, 8.000,
    ),
    e2e=(
        0.1, 0.2, 0.4, 0.6, 0.8, 1.0, 2.0, 4.0, 6.0, 8.0, 10.0, 20.0, 40.0, 60.0, 80.0, 100.0,
        200.0, 400.0, 600.0, 1200.0, 1800.0, 2400.0,
    ),
)
# fmt: on
# Per `spec.model.engine`.
DEFAULT_BOUNDS = {"VLLM": VLLM_BOUNDS, "SGLang": SGLANG_BOUNDS}
