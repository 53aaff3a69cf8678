"""The operator's own Prometheus metrics (prefix `pd_operator_`, base units, bounded labels)."""

from prometheus_client import Counter, Gauge, Histogram

RECONCILES = Counter(
    "pd_operator_reconciles_total", "Reconciles of PDDeployments, by result.", ["result"]
)
RECONCILE_SECONDS = Histogram(
    "pd_operator_reconcile_duration_seconds",
    "Wall time of one reconcile of one PDDeployment.",
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
)
API_WRITES = Counter(
    "pd_operator_api_writes_total", "Writes sent to the Kubernetes API.", ["verb", "kind"]
)
QUEUE_DEPTH = Gauge("pd_operator_workqueue_depth", "PDDeployments waiting to be reconciled.")
MANAGED = Gauge("pd_operator_managed_pddeployments", "PDDeployments the operator manages.")
LEADER = Gauge(
    "pd_operator_leader", "1 while this replica holds the leader lease (always 1 without one)."
)


def total_writes() -> float:
    """All API writes counted so far (for tests and benchmarks)."""
    return sum(
        sample.value
        for metric in API_WRITES.collect()
        for sample in metric.samples
        if sample.name.endswith("_total")
    )


# Autoscaler. Labels are bounded by the number of PDDeployments (two roles each).
SLO_MET = Gauge(
    "pd_operator_slo_met",
    "1 when the role's observed latency is within its SLO, 0 when not (absent when unknown).",
    ["namespace", "pddeployment", "role"],
)
METRICS_AVAILABLE = Gauge(
    "pd_operator_metrics_available",
    "1 when the role's SLO signals could be read from Prometheus, else 0.",
    ["namespace", "pddeployment", "role"],
)
CAPACITY_AVAILABLE = Gauge(
    "pd_operator_capacity_available",
    "1 when every pool could get the replicas the autoscaler wanted, else 0.",
    ["namespace", "pddeployment"],
)
POOL_REPLICAS = Gauge(
    "pd_operator_pool_replicas",
    "Replicas of a pool: its Deployment's (current), the Ready ones (ready), and the "
    "autoscaler's last decision (recommended; applied only in Active mode).",
    ["namespace", "pddeployment", "role", "pool", "state"],
)
POOL_STATES = ("current", "ready", "recommended")
OBSERVED_LATENCY = Gauge(
    "pd_operator_observed_latency_seconds",
    "The role's latency at its SLO percentile over the SLO window (TTFT for prefill, ITL for "
    "decode); absent when unknown.",
    ["namespace", "pddeployment", "role"],
)
LATENCY_TARGET = Gauge(
    "pd_operator_latency_target_seconds",
    "The role's SLO target (TTFT for prefill, ITL for decode).",
    ["namespace", "pddeployment", "role"],
)
# Series of one PDDeployment's roles: they go when the object goes (or stops being scaled).
ROLE_GAUGES = (SLO_MET, METRICS_AVAILABLE, OBSERVED_LATENCY, LATENCY_TARGET)
DECISIONS = Counter(
    "pd_operator_scaling_decisions_total",
    "Autoscaler decisions, by direction (up, down, hold) and what limited them.",
    ["direction", "limited_by"],
)
PROMETHEUS_QUERIES = Counter(
    "pd_operator_prometheus_queries_total", "Queries sent to Prometheus by the autoscaler."
)
DECISION_CYCLE_SECONDS = Histogram(
    "pd_operator_decision_cycle_duration_seconds",
    "Wall time of one autoscaler cycle over all due PDDeployments.",
    buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5),
)
