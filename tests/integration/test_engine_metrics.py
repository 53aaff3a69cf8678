"""The engine simulator's pods scraped by a real Prometheus: PromQL sees what the engine recorded.

The engine runs 10x faster than the wall clock under a steady Poisson load; its four pods are
published through file SD. Over a 20 s window, PromQL's TTFT and ITL medians must match the
engine's own latencies as vLLM's buckets resolve them (Prometheus interpolates inside a
bucket), and the raw medians must sit in the buckets PromQL points at.
"""

import bisect
import json
import math
import threading
import time
import urllib.parse
import urllib.request
import uuid
from collections.abc import Callable, Sequence
from typing import Any

import pytest

from pd_operator.core.hardware import GLM_45_FP8
from pd_operator.core.perfmodel import DecodeCoefficients, PrefillCoefficients
from pd_tools.enginesim.engine import VLLM_BUCKETS, LogHistogram, PDEngine, ReplicaSpec, Role
from pd_tools.enginesim.metrics import EngineMetricsServer, LiveDriver, SimPod
from pd_tools.localcluster import LocalPrometheus
from pd_tools.workloads.traces import TokenLengths, constant_rate, synthetic_requests

SPEED = 10.0  # simulated seconds per wall second
WINDOW_S = 20  # PromQL rate window (wall time): 20 scrapes
# TTFT spreads over 0.1-2.5 s (several vLLM buckets); decode steps take 30-60 ms.
SPEC = ReplicaSpec(
    PrefillCoefficients(a_ms=50.0, b_ms_per_token=0.1, c_ms_per_token2=0.0),
    DecodeCoefficients(a_ms=20.0, b_ms_per_context_token=0.0004, c_ms_per_sequence=0.5),
    kv_capacity_tokens=1_000_000,
    load_seconds=0.0,
)
LABELS = {"namespace", "pod", "deployment", "role", "pool", "model_name", "engine"}


def query(prometheus: LocalPrometheus, promql: str, at_s: float) -> list[dict[str, Any]]:
    params = urllib.parse.urlencode({"query": promql, "time": f"{at_s:.3f}"})
    with urllib.request.urlopen(f"{prometheus.url}/api/v1/query?{params}", timeout=10) as reply:
        body = json.load(reply)
    assert body["status"] == "success", body
    result: list[dict[str, Any]] = body["data"]["result"]
    return result


def scalar(prometheus: LocalPrometheus, promql: str, at_s: float) -> float:
    result = query(prometheus, promql, at_s)
    assert len(result) == 1, (promql, result)
    return float(result[0]["value"][1])


def bucket_quantile(q: float, bounds: Sequence[float], at_most: Callable[[float], float]) -> float:
    """Prometheus's histogram_quantile over buckets whose cumulative share is `at_most(bound)`."""
    cumulative = [at_most(b) for b in bounds]
    index = bisect.bisect_left(cumulative, q)
    if index == len(bounds):
        return bounds[-1]
    lower = bounds[index - 1] if index else 0.0
    below = cumulative[index - 1] if index else 0.0
    return lower + (bounds[index] - lower) * (q - below) / (cumulative[index] - below)


def bucket_of(value: float, bounds: Sequence[float]) -> tuple[float, float]:
    index = bisect.bisect_left(bounds, value)
    return (bounds[index - 1] if index else 0.0), bounds[index]


def window_histogram(before: dict[int, int], after: LogHistogram) -> LogHistogram:
    window = LogHistogram()
    for index, count in after.bins.items():
        if count > before.get(index, 0):
            window.bins[index] = count - before.get(index, 0)
    window.count = sum(window.bins.values())
    return window


def test_promql_sees_the_engines_latencies_and_gauges(prometheus: LocalPrometheus):
    namespace = f"sim-{uuid.uuid4().hex[:8]}"
    requests = synthetic_requests(constant_rate(4, 3600), TokenLengths(3000, 150, 1.0, 1.0))
    engine = PDEngine(requests, model=GLM_45_FP8)
    lock = threading.Lock()
    pods = []
    for role, pool in ((Role.PREFILL, "s5000"), (Role.DECODE, "h200")):
        for index in range(2):
            instance = engine.add_instance(f"{role}-{index}", role, SPEC, ready_after_s=0)
            pods.append(
                SimPod(namespace, f"demo-{pool}-{index}", instance.name, "demo", role, pool, "glm")
            )
    driver = LiveDriver(engine, lock, speed=SPEED)
    with EngineMetricsServer(engine, lock) as server:
        for pod in pods:
            server.add_pod(pod)
            labels = server.target_labels(namespace, pod.pod)
            prometheus.set_targets(f"{namespace}-{pod.pod}", [server.address], labels)
        driver.start()
        try:
            deadline = time.time() + 20
            while len(query(prometheus, f'up{{namespace="{namespace}"}} == 1', time.time())) < 4:
                assert time.time() < deadline, "Prometheus did not scrape the simulated pods"
                time.sleep(0.5)
            time.sleep(2)  # past the empty-system start
            with lock:
                sim_start_s, itl_before = engine.now_s, dict(engine.token_itl_s.bins)
                tokens_before = sum(i.generation_tokens_total for i in engine.instances())
            time.sleep(WINDOW_S)
            with lock:
                sim_end_s, at_s = engine.now_s, time.time()
                tokens_after = sum(i.generation_tokens_total for i in engine.instances())
                itl_window = window_histogram(itl_before, engine.token_itl_s)
            time.sleep(2)  # the scrape that covers `at_s`

            def promql(expression: str) -> float:
                return scalar(prometheus, expression, at_s)

            selector = f'namespace="{namespace}"'
            ttft_p50 = promql(
                "histogram_quantile(0.5, sum by (le) ("
                f"rate(vllm:time_to_first_token_seconds_bucket{{{selector}}}[{WINDOW_S}s])))"
            )
            itl_p50 = promql(
                "histogram_quantile(0.5, sum by (le) ("
                f"rate(vllm:inter_token_latency_seconds_bucket{{{selector}}}[{WINDOW_S}s])))"
            )
            tokens_per_s = promql(
                f"sum(rate(vllm:generation_tokens_total{{{selector}}}[{WINDOW_S}s]))"
            )
            gauges = {
                name: query(prometheus, f"{name}{{{selector}}}", at_s)
                for name in (
                    "vllm:num_requests_running",
                    "vllm:num_requests_waiting",
                    "vllm:kv_cache_usage_perc",
                    "vllm:prompt_tokens_total",
                )
            }
        finally:
            driver.stop()
            for pod in pods:
                prometheus.set_targets(f"{namespace}-{pod.pod}", [], {})

    # TTFT: the engine's records of first tokens inside the window.
    records = engine.run().records
    ttfts = sorted(r.ttft_s for r in records if sim_start_s <= r.first_token_s < sim_end_s)
    assert len(ttfts) > 300
    raw_ttft_p50 = ttfts[len(ttfts) // 2]
    expected_ttft = bucket_quantile(
        0.5, VLLM_BUCKETS.ttft_s, lambda b: bisect.bisect_right(ttfts, b) / len(ttfts)
    )
    assert ttft_p50 == pytest.approx(expected_ttft, rel=0.1)
    lower, upper = bucket_of(raw_ttft_p50, VLLM_BUCKETS.ttft_s)
    assert 0.9 * lower <= ttft_p50 <= 1.1 * upper

    # ITL: every output token the engine produced inside the window.
    assert itl_window.count > 10_000
    expected_itl = bucket_quantile(0.5, VLLM_BUCKETS.itl_s, itl_window.fraction_at_most)
    assert itl_p50 == pytest.approx(expected_itl, rel=0.1)
    lower, upper = bucket_of(itl_window.quantile(0.5), VLLM_BUCKETS.itl_s)
    assert 0.9 * lower <= itl_p50 <= 1.1 * upper

    # Token counters: Prometheus's rate is per wall second.
    engine_tokens_per_s = (tokens_after - tokens_before) / ((sim_end_s - sim_start_s) / SPEED)
    assert tokens_per_s == pytest.approx(engine_tokens_per_s, rel=0.1)

    # Every pod's gauges and counters, with the target labels Prometheus attached.
    for name, series in gauges.items():
        assert len(series) == 4, name
        for sample in series:
            labels = sample["metric"]
            assert set(labels) >= LABELS, (name, labels)
            assert labels["model_name"] == "glm"
            assert (labels["role"], labels["pool"]) in {("prefill", "s5000"), ("decode", "h200")}
            assert math.isfinite(float(sample["value"][1]))
    decode_running = sum(
        float(s["value"][1])
        for s in gauges["vllm:num_requests_running"]
        if s["metric"]["role"] == "decode"
    )
    assert decode_running > 0  # decode batches are never empty under this load
