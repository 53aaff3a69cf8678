"""PromQL for the SLO signals: engine metric names, and one grouped query per signal.

Every query serves all PDDeployments at once (`by (namespace, deployment, role)`), so the
number of queries per cycle is a small constant, independent of how many objects there are.
Percentile queries differ by quantile and window, so there is one per distinct (percentile,
window) pair among the objects; in practice one or two.
"""

from dataclasses import dataclass

# Scrape-time labels that identify a role's series. Prometheus sanitises label names, so our pod
# labels pdoperator.io/{deployment,role} arrive under these names (the chart's engineMonitor
# PodMonitor, deploy/prometheus/engine-scrape.yaml and the simulator's file-SD targets all
# relabel them so; docs/observability.md#engine-metrics). The policy reads signals per role: the
# pools of a role share one SLO and one queue in front of them.
GROUP_LABELS = ("namespace", "deployment", "role")

QUANTILES = {"P50": 0.5, "P90": 0.9, "P95": 0.95, "P99": 0.99}


@dataclass(frozen=True)
class EngineMetrics:
    """The metric names one engine (version) exports."""

    name: str
    ttft_histogram: str  # without the _bucket/_count suffix
    itl_histogram: str
    # None: the engine (or the frontend that measures for it) does not export the signal.
    waiting: str | None
    running: str | None
    kv_usage: str | None  # fraction 0..1
    prompt_tokens: str | None  # counter
    generation_tokens: str | None  # counter


VLLM = EngineMetrics(
    name="vllm",
    ttft_histogram="vllm:time_to_first_token_seconds",
    itl_histogram="vllm:inter_token_latency_seconds",
    waiting="vllm:num_requests_waiting",
    running="vllm:num_requests_running",
    kv_usage="vllm:kv_cache_usage_perc",
    prompt_tokens="vllm:prompt_tokens_total",
    generation_tokens="vllm:generation_tokens_total",
)
# vLLM before the V1 metrics rename: ITL was "time per output token".
VLLM_LEGACY = EngineMetrics(
    name="vllm-legacy",
    ttft_histogram="vllm:time_to_first_token_seconds",
    itl_histogram="vllm:time_per_output_token_seconds",
    waiting="vllm:num_requests_waiting",
    running="vllm:num_requests_running",
    kv_usage="vllm:gpu_cache_usage_perc",
    prompt_tokens="vllm:prompt_tokens_total",
    generation_tokens="vllm:generation_tokens_total",
)
SGLANG = EngineMetrics(
    name="sglang",
    ttft_histogram="sglang:time_to_first_token_seconds",
    itl_histogram="sglang:inter_token_latency_seconds",
    waiting="sglang:num_queue_reqs",
    running="sglang:num_running_reqs",
    kv_usage="sglang:token_usage",
    prompt_tokens="sglang:prompt_tokens_total",
    generation_tokens="sglang:generation_tokens_total",
)
# Some SGLang versions write an underscore instead of the colon.
SGLANG_UNDERSCORE = EngineMetrics(
    name="sglang-underscore",
    ttft_histogram="sglang_time_to_first_token_seconds",
    itl_histogram="sglang_inter_token_latency_seconds",
    waiting="sglang_num_queue_reqs",
    running="sglang_num_running_reqs",
    kv_usage="sglang_token_usage",
    prompt_tokens="sglang_prompt_tokens_total",
    generation_tokens="sglang_generation_tokens_total",
)
# Dynamo's frontend measures latency at the router (label `model`, lower-cased). Only its two
# latency histograms are relied on; per-pool gauges and token counters are not read from it.
DYNAMO = EngineMetrics(
    name="dynamo",
    ttft_histogram="dynamo_frontend_time_to_first_token_seconds",
    itl_histogram="dynamo_frontend_inter_token_latency_seconds",
    waiting=None,
    running=None,
    kv_usage=None,
    prompt_tokens=None,
    generation_tokens=None,
)

# vLLM's names as they arrive when its prometheus_client answers an OpenMetrics scrape and
# escapes the colons (prometheus_client >= 0.22 with Prometheus asking for OpenMetrics).
VLLM_UNDERSCORE = EngineMetrics(
    name="vllm-underscore",
    ttft_histogram="vllm_time_to_first_token_seconds",
    itl_histogram="vllm_inter_token_latency_seconds",
    waiting="vllm_num_requests_waiting",
    running="vllm_num_requests_running",
    kv_usage="vllm_kv_cache_usage_perc",
    prompt_tokens="vllm_prompt_tokens_total",
    generation_tokens="vllm_generation_tokens_total",
)

# Candidates per engine of the spec, in order of preference.
ADAPTERS = {
    "VLLM": (VLLM, VLLM_UNDERSCORE, VLLM_LEGACY, DYNAMO),
    "SGLang": (SGLANG, SGLANG_UNDERSCORE, DYNAMO),
}
ALL_ADAPTERS = (VLLM, VLLM_UNDERSCORE, VLLM_LEGACY, SGLANG, SGLANG_UNDERSCORE, DYNAMO)


def _histograms(adapter: EngineMetrics) -> tuple[str, str]:
    return f"{adapter.ttft_histogram}_count", f"{adapter.itl_histogram}_count"


def detection_query() -> str:
    """Which latency histograms exist at all, one series per metric name present."""
    names = sorted({name for a in ALL_ADAPTERS for name in _histograms(a)})
    return f'group by (__name__) ({{__name__=~"{"|".join(names)}"}})'


def detect(present: set[str], engine: str) -> EngineMetrics | None:
    """The first adapter of the engine with a latency histogram present (TTFT or ITL)."""
    for adapter in ADAPTERS[engine]:
        if any(name in present for name in _histograms(adapter)):
            return adapter
    return None


def _by(labels: tuple[str, ...]) -> str:
    return ", ".join(labels)


def quantile_query(histogram: str, role: str, percentile: str, window_seconds: int) -> str:
    """The percentile of a latency histogram per pool role, across all objects."""
    q = QUANTILES[percentile]
    group = _by((*GROUP_LABELS, "le"))
    return (
        f"histogram_quantile({q}, sum by ({group}) "
        f'(rate({histogram}_bucket{{role="{role}"}}[{window_seconds}s])))'
    )


def request_rate_query(histogram: str, role: str, window_seconds: int) -> str:
    """Requests per second per role (the histogram's count rate)."""
    return (
        f"sum by ({_by(GROUP_LABELS)}) "
        f'(rate({histogram}_count{{role="{role}"}}[{window_seconds}s]))'
    )


def counter_rate_query(counter: str, window_seconds: int) -> str:
    """A counter's rate per role."""
    return f"sum by ({_by(GROUP_LABELS)}) (rate({counter}[{window_seconds}s]))"


def gauge_query(gauge: str, aggregate: str = "sum") -> str:
    """A gauge per role (`sum` for counts, `avg` for fractions)."""
    return f"{aggregate} by ({_by(GROUP_LABELS)}) ({gauge})"
