"""The autoscaler's per-PDDeployment series on /metrics: replicas per pool, latency against its
target, and that an object's series leave with it. A fake stands in for the Prometheus reader
only."""

import copy

import pytest
from prometheus_client import REGISTRY

from pd_operator.adapters.cache import ClusterCache
from pd_operator.adapters.prometheus import ReadReport
from pd_operator.core.signals import Reading, RoleSignals
from pd_operator.handlers.autoscaler import Autoscaler
from pdcases import pool_deployment

NAMESPACE = "llm"
NAME = "minimal"  # `pool_deployment()` builds this object's children
LABELS = {"namespace": NAMESPACE, "pddeployment": NAME}
PER_OBJECT = (
    "pd_operator_slo_met",
    "pd_operator_metrics_available",
    "pd_operator_capacity_available",
    "pd_operator_pool_replicas",
    "pd_operator_observed_latency_seconds",
    "pd_operator_latency_target_seconds",
)


class SteadyReader:
    """A Prometheus where prefill shows a P50 TTFT of 0.4 s and decode an ITL of 12 ms."""

    def __init__(self, url, *, bearer_token=None, ca_path=None):
        self.url = url

    def read(self, targets, now):
        signals = {}
        for t in targets:
            signals[(t.namespace, t.name, "prefill")] = RoleSignals(
                sample_time=now, ttft_seconds=Reading.of(0.4), itl_seconds=Reading.of(0.012)
            )
            signals[(t.namespace, t.name, "decode")] = RoleSignals(
                sample_time=now, ttft_seconds=Reading.of(0.4), itl_seconds=Reading.of(0.012)
            )
        return signals, ReadReport(queries=1)


def pdd(decode_pool: str = "d", mode: str = "Active") -> dict:
    return {
        "apiVersion": "pdoperator.io/v1alpha1",
        "kind": "PDDeployment",
        "metadata": {"name": NAME, "namespace": NAMESPACE, "uid": "u1", "generation": 1},
        "spec": {
            "model": {"name": "m", "image": "img:1"},
            "slo": {"ttft": {"targetMilliseconds": 1000}, "itl": {"targetMilliseconds": 20}},
            "prefill": {
                "pools": [
                    {
                        "name": "p",
                        "accelerator": {"resourceName": "mthreads.com/gpu"},
                        "replicas": {"min": 1, "max": 4},
                    }
                ]
            },
            "decode": {
                "pools": [
                    {
                        "name": decode_pool,
                        "accelerator": {"resourceName": "nvidia.com/gpu"},
                        "replicas": {"min": 1, "max": 4},
                    }
                ]
            },
            "scaling": {"mode": mode, "prometheus": {"url": "http://prometheus:9090"}},
        },
    }


def value(name: str, **labels: str) -> float | None:
    return REGISTRY.get_sample_value(name, {**LABELS, **labels})


def series_of_the_object() -> list[str]:
    """Every exported series that names the test's PDDeployment."""
    found = []
    for metric in REGISTRY.collect():
        for sample in metric.samples:
            if sample.name in PER_OBJECT and all(
                sample.labels.get(k) == v for k, v in LABELS.items()
            ):
                found.append(f"{sample.name}{sample.labels}")
    return found


@pytest.fixture
def scaled():
    """The object with three Ready replicas per pool, decided once."""
    cache = ClusterCache()
    cache.put_pdd(pdd())
    cache.put_child(pool_deployment("prefill", "p", 3))
    cache.put_child(pool_deployment("decode", "d", 3))
    clock = [1000.0]
    autoscaler = Autoscaler(cache, lambda keys: None, readers=SteadyReader, clock=lambda: clock[0])
    assert autoscaler.cycle() == 1
    yield cache, autoscaler, clock
    cache.put_pdd(pdd(), deleted=True)
    clock[0] += 3600
    autoscaler.cycle()


def test_replicas_per_pool_and_latency_against_its_target_are_exported(scaled) -> None:
    _, autoscaler, _ = scaled
    decided = autoscaler.decisions_for((NAMESPACE, NAME))
    assert decided is not None
    for role, pool in (("prefill", "p"), ("decode", "d")):
        pool_labels = {"role": role, "pool": pool}
        assert value("pd_operator_pool_replicas", **pool_labels, state="current") == 3
        assert value("pd_operator_pool_replicas", **pool_labels, state="ready") == 3
        assert (
            value("pd_operator_pool_replicas", **pool_labels, state="recommended")
            == decided[(role, pool)]
        )
    assert value("pd_operator_observed_latency_seconds", role="prefill") == 0.4
    assert value("pd_operator_observed_latency_seconds", role="decode") == 0.012
    assert value("pd_operator_latency_target_seconds", role="prefill") == 1.0
    assert value("pd_operator_latency_target_seconds", role="decode") == 0.02
    assert value("pd_operator_slo_met", role="prefill") == 1


def test_a_deleted_pddeployment_takes_its_series_with_it(scaled) -> None:
    """Otherwise the last values stay exported, and an alert on pd_operator_slo_met == 0
    fires for an object that is not there any more."""
    cache, autoscaler, clock = scaled
    assert len(series_of_the_object()) == 2 * 4 + 2 * 3 + 1  # 4 per role, 3 per pool, 1
    cache.put_pdd(pdd(), deleted=True)
    clock[0] += 60
    autoscaler.cycle()
    assert series_of_the_object() == []


def test_a_pool_that_leaves_the_spec_takes_its_series_with_it(scaled) -> None:
    cache, autoscaler, clock = scaled
    renamed = pdd(decode_pool="h200")
    renamed["metadata"]["generation"] = 2
    cache.put_pdd(renamed)
    clock[0] += 60
    assert autoscaler.cycle() == 1
    assert value("pd_operator_pool_replicas", role="decode", pool="d", state="current") is None
    for state in ("current", "ready", "recommended"):
        assert (
            value("pd_operator_pool_replicas", role="decode", pool="h200", state=state) is not None
        )
    assert value("pd_operator_pool_replicas", role="prefill", pool="p", state="current") == 3


def test_a_pddeployment_no_longer_scaled_takes_its_series_with_it(scaled) -> None:
    cache, autoscaler, clock = scaled
    disabled = copy.deepcopy(pdd(mode="Disabled"))
    disabled["metadata"]["generation"] = 2
    cache.put_pdd(disabled)
    clock[0] += 60
    autoscaler.cycle()
    assert series_of_the_object() == []
