"""PromQL for the SLO signals: the engine metric names read, and one grouped query per signal.

Every query serves all PDDeployments at once (`by (namespace, deployment, role)`), so the
number of queries per cycle is a small constant, independent of how many objects there are.
Percentile queries differ by quantile and window, so there is one per distinct (percentile,
window) pair among the objects; in practice one or two.
"""

from collections.abc import Sequence
from dataclasses import dataclass

from pd_operator.api.spec import PERCENTILE_SHARES, Engine, Role
from pd_operator.core import engine_metrics
from pd_operator.core.removal import WORK_GAUGES

# Scrape-time labels that identify a role's series. Prometheus sanitises label names, so our pod
# labels pdoperator.io/{deployment,role} arrive under these names (the chart's engineMonitor
# PodMonitor, deploy/prometheus/engine-scrape.yaml and the simulator's file-SD targets all
# relabel them so; docs/observability.md#engine-metrics). The policy reads signals per role: the
# pools of a role share one SLO and one queue in front of them.
GROUP_LABELS = ("namespace", "deployment", "role")
# And per pool, for what the policy learns of each pool's capacity (`core.signals.PoolSignals`).
POOL_GROUP_LABELS = (*GROUP_LABELS, "pool")


@dataclass(frozen=True)
class EngineMetrics:
    """The metric names the reader queries for one engine (version)."""

    name: str
    ttft_histogram: str  # without the _bucket/_count suffix
    itl_histogram: str
    # None: the engine (or the frontend that measures for it) does not export the signal.
    waiting: str | None
    running: str | None
    kv_usage: str | None  # fraction 0..1
    prompt_tokens: str | None  # counter, with its _total
    generation_tokens: str | None  # counter, with its _total
    cached_prompt_tokens: str | None = None  # counter of prefix-cache hits, with its _total
    kv_transfer: str | None = None  # the connector's transfer-time histogram
    queue_time: str | None = None  # histograms of the prefill side's queue and compute time
    prefill_time: str | None = None

    @classmethod
    def of(cls, names: engine_metrics.EngineMetricNames) -> "EngineMetrics":
        """The names of the engine table (core/engine_metrics.py) that the reader queries."""
        return cls(
            name=names.name,
            ttft_histogram=names.ttft_histogram,
            itl_histogram=names.itl_histogram,
            waiting=names.waiting,
            running=names.running,
            kv_usage=names.kv_usage,
            prompt_tokens=_total(names.prompt_tokens),
            generation_tokens=_total(names.generation_tokens),
            cached_prompt_tokens=_total(names.cache_hit_tokens),
            kv_transfer=names.kv_transfer_histogram,
            queue_time=names.queue_time_histogram,
            prefill_time=names.prefill_time_histogram,
        )


def _total(counter: str | None) -> str | None:
    return f"{counter}_total" if counter else None


VLLM = EngineMetrics.of(engine_metrics.VLLM)
VLLM_UNDERSCORE = EngineMetrics.of(engine_metrics.VLLM_UNDERSCORE)
VLLM_LEGACY = EngineMetrics.of(engine_metrics.VLLM_LEGACY)
SGLANG = EngineMetrics.of(engine_metrics.SGLANG)
SGLANG_UNDERSCORE = EngineMetrics.of(engine_metrics.SGLANG_UNDERSCORE)
DYNAMO = EngineMetrics.of(engine_metrics.DYNAMO)

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


def quantile_query(
    histogram: str, role: str, percentile: str, window_seconds: int, *, per_pool: bool = False
) -> str:
    """The percentile of a latency histogram per role (or per pool), across all objects."""
    q = PERCENTILE_SHARES[percentile]
    group = _by((*(POOL_GROUP_LABELS if per_pool else GROUP_LABELS), "le"))
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


def mean_query(histogram: str, role: str, window_seconds: int) -> str:
    """A latency histogram's mean per role: exact, where a percentile is read inside a bucket
    (NaN, no traffic, over a window without requests)."""
    by, window = _by(GROUP_LABELS), f"[{window_seconds}s]"
    return (
        f'sum by ({by}) (rate({histogram}_sum{{role="{role}"}}{window})) / '
        f'sum by ({by}) (rate({histogram}_count{{role="{role}"}}{window}))'
    )


def transfer_mean_query(histogram: str, window_seconds: int) -> str:
    """The connector's mean transfer time (seconds) per object, as the prefill role's: the side
    that moves the KV (decode for vLLM's NIXL, which pulls) is not the side whose TTFT it
    delays."""
    by, window = "namespace, deployment", f"[{window_seconds}s]"
    unit = " / 1000" if histogram.endswith("_ms") else ""
    mean = (
        f"sum by ({by}) (rate({histogram}_sum{window})){unit} / "
        f"sum by ({by}) (rate({histogram}_count{window}))"
    )
    return f'label_replace({mean}, "role", "prefill", "deployment", ".*")'


def counter_rate_query(counter: str, window_seconds: int, *, per_pool: bool = False) -> str:
    """A counter's rate per role (or per pool: the reader sums the pools for the role)."""
    by = _by(POOL_GROUP_LABELS if per_pool else GROUP_LABELS)
    return f"sum by ({by}) (rate({counter}[{window_seconds}s]))"


def gauge_query(gauge: str, aggregate: str = "sum") -> str:
    """A gauge per role (`sum` for counts, `avg` for fractions)."""
    return f"{aggregate} by ({_by(GROUP_LABELS)}) ({gauge})"


def pod_work_query(engine: Engine, role: Role, namespace: str, pods: Sequence[str]) -> str:
    """The work each of these pods holds now (`core.removal.WORK_GAUGES`), one series per pod.

    Every spelling the engine's versions use is matched: a pod exports one of them."""
    names = sorted(
        {
            name
            for adapter in ADAPTERS[engine]
            for gauge in WORK_GAUGES[role]
            if (name := getattr(adapter, gauge))
        }
    )
    # Pod names are DNS subdomains: a dot is their only regex metacharacter (escaped once for
    # the regex, once for the PromQL string).
    pattern = "|".join(pod.replace(".", "\\\\.") for pod in pods)
    return (
        f'sum by (pod) ({{__name__=~"{"|".join(names)}",namespace="{namespace}",pod=~"{pattern}"}})'
    )


# The router's activator (`pd_operator.activator`, `spec.scaling.idleSeconds`): scraped with the
# router's target labels (deploy/prometheus/router-scrape.yaml).
ACTIVATOR_REQUESTS = "pd_activator_requests_total"
ACTIVATOR_PENDING = "pd_activator_pending_requests"
ACTIVATOR_IN_FLIGHT = "pd_activator_in_flight_requests"


def router_traffic_query() -> str:
    """The activator's three series, each summed per PDDeployment, in one query."""
    names = "|".join((ACTIVATOR_REQUESTS, ACTIVATOR_PENDING, ACTIVATOR_IN_FLIGHT))
    return f'sum by (namespace, deployment, __name__) ({{__name__=~"{names}"}})'
