"""The whole simulated cluster: the operator's pods on virtual nodes, an engine behind every Ready
pod, scraped by a real Prometheus through file SD.

A PDDeployment whose pools name pd-mock-scheduler runs on tiny.yaml's nodes (S5000 prefill, H200
decode), 20 times faster than the wall clock, under a constant load aimed at it. PromQL's TTFT and
ITL medians must equal the engine's own latencies as vLLM's buckets resolve them (Prometheus
interpolates inside a bucket); a second Ready prefill replica must lower TTFT; the operator's
PrometheusReader must read both signals for the object, which checks the label contract end to
end; and a replica scaled away must leave the engine and Prometheus's targets.
"""

import bisect
import copy
import json
import math
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from kubetools import RunningOperator, create_pdd, patch_pdd, wait_for
from pd_operator.adapters.prometheus import PrometheusReader, SignalTarget
from pd_operator.core.signals import ReadingKind
from pd_tools.enginesim.engine import VLLM_BUCKETS, LogHistogram, Role, State
from pd_tools.localcluster import LocalPrometheus
from pd_tools.simcluster.cluster import SimCluster, SimDeployment, parse_load, parse_target
from pd_tools.simcluster.nodes import LABEL_VIRTUAL_CLUSTER
from pd_tools.simcluster.scheduler import SCHEDULER_NAME
from pd_tools.workloads.traces import ReplayOptions, TokenLengths, constant_rate, synthetic_requests
from pdcases import ROOT, load_sample

TINY = ROOT / "config" / "clusters" / "tiny.yaml"
NAME = "glm"
TIME_SCALE = 0.05  # 20 simulated seconds per wall second: an 82 s model load takes 4 s
WINDOW_S = 12  # PromQL rate window (wall time): 12 scrapes, 240 simulated seconds
# 4,000-token prompts at 5 per second keep one 8-card S5000 prefill replica busy enough that
# requests queue (TTFT ~0.35 s); two replicas halve that. One H200 replica decodes it all.
RATE = 5.0
LENGTHS = TokenLengths(4000, 200, 1.0, 1.0)


def pdd_body() -> dict[str, Any]:
    body = copy.deepcopy(load_sample(ROOT / "config" / "samples" / "heterogeneous-s5000-h200.yaml"))
    body["metadata"]["name"] = NAME
    spec = body["spec"]
    for role, most in (("prefill", 2), ("decode", 1)):
        (pool,) = spec[role]["pools"]
        pool["template"] = {**pool.get("template", {}), "schedulerName": SCHEDULER_NAME}
        pool["replicas"] = {"min": 1, "max": most}
    spec["scaling"] = {"mode": "Disabled"}  # replicas move only when the test says so
    return body


def set_prefill_replicas(api_client: client.ApiClient, namespace: str, replicas: int) -> None:
    body = pdd_body()
    body["spec"]["prefill"]["pools"][0]["replicas"] = {"min": replicas, "max": replicas}
    patch_pdd(api_client, namespace, NAME, {"spec": {"prefill": body["spec"]["prefill"]}})


@pytest.fixture
def operator(cluster, namespace) -> Iterator[RunningOperator]:
    running = RunningOperator(str(cluster.kubeconfig), namespaces=[namespace], workers=2).start()
    yield running
    running.stop()


@pytest.fixture
def sim(api_client, namespace, prometheus: LocalPrometheus) -> Iterator[SimCluster]:
    load = synthetic_requests(constant_rate(RATE, math.inf), LENGTHS, seed=7)
    cluster = SimCluster(
        api_client,
        TINY,
        loads={(namespace, NAME): load},
        time_scale=TIME_SCALE,
        sd_file=prometheus.targets_dir / f"{namespace}.json",
        name_prefix=f"{namespace}-",
        namespace=namespace,
    )
    with cluster:
        yield cluster
        # Pods go while their kubelet still runs; then stop() takes the nodes.
        client.CustomObjectsApi(api_client).delete_namespaced_custom_object(
            "pdoperator.io", "v1alpha1", namespace, "pddeployments", NAME
        )
        client.CoreV1Api(api_client).delete_collection_namespaced_pod(
            namespace, grace_period_seconds=0
        )
    assert cluster.sd_file is not None and not cluster.sd_file.exists(), "targets withdrawn"
    nodes = client.CoreV1Api(api_client).list_node(
        label_selector=f"{LABEL_VIRTUAL_CLUSTER}={cluster.virtual.name}"
    )
    assert not nodes.items, "stop() leaves no node"


def query(prometheus: LocalPrometheus, promql: str, at_s: float | None = None) -> list[Any]:
    params = urllib.parse.urlencode({"query": promql, "time": f"{at_s or time.time():.3f}"})
    with urllib.request.urlopen(f"{prometheus.url}/api/v1/query?{params}", timeout=10) as reply:
        body = json.load(reply)
    assert body["status"] == "success", body
    result: list[Any] = body["data"]["result"]
    return result


def bucket_quantile(q: float, bounds: Sequence[float], at_most: Callable[[float], float]) -> float:
    """Prometheus's histogram_quantile over buckets whose cumulative share is `at_most(bound)`."""
    cumulative = [at_most(b) for b in bounds]
    index = bisect.bisect_left(cumulative, q)
    if index == len(bounds):
        return bounds[-1]
    lower = bounds[index - 1] if index else 0.0
    below = cumulative[index - 1] if index else 0.0
    return lower + (bounds[index] - lower) * (q - below) / (cumulative[index] - below)


@dataclass(frozen=True)
class Medians:
    """TTFT and ITL medians of one window: PromQL's, and the engine's as the buckets resolve
    them."""

    ttft_promql: float
    ttft_engine: float
    itl_promql: float
    itl_engine: float
    requests: int


def measure(prometheus: LocalPrometheus, deployment: SimDeployment, namespace: str) -> Medians:
    """The medians over the next WINDOW_S wall seconds."""
    engine = deployment.engine
    with deployment.lock:
        start_s, itl_before = engine.now_s, dict(engine.token_itl_s.bins)
    time.sleep(WINDOW_S)
    with deployment.lock:
        end_s, at_s = engine.now_s, time.time()
        itl = LogHistogram()
        for index, count in engine.token_itl_s.bins.items():
            if count > itl_before.get(index, 0):
                itl.bins[index] = count - itl_before.get(index, 0)
        itl.count = sum(itl.bins.values())
    time.sleep(2)  # the scrape that covers `at_s`; the window's last requests finish

    def median(histogram: str) -> float:
        (series,) = query(
            prometheus,
            f"histogram_quantile(0.5, sum by (le) (rate({histogram}_bucket"
            f'{{namespace="{namespace}"}}[{WINDOW_S}s])))',
            at_s,
        )
        return float(series["value"][1])

    with deployment.lock:
        ttfts = sorted(r.ttft_s for r in deployment.records if start_s <= r.first_token_s < end_s)
    assert len(ttfts) > 500
    return Medians(
        ttft_promql=median("vllm:time_to_first_token_seconds"),
        ttft_engine=bucket_quantile(
            0.5, VLLM_BUCKETS.ttft_s, lambda b: bisect.bisect_right(ttfts, b) / len(ttfts)
        ),
        itl_promql=median("vllm:inter_token_latency_seconds"),
        itl_engine=bucket_quantile(0.5, VLLM_BUCKETS.itl_s, itl.fraction_at_most),
        requests=len(ttfts),
    )


def scraped_pods(prometheus: LocalPrometheus, namespace: str) -> dict[str, str]:
    """Pod -> role of every target Prometheus scrapes successfully in the namespace."""
    series = query(prometheus, f'up{{namespace="{namespace}", deployment="{NAME}"}} == 1')
    return {s["metric"]["pod"]: s["metric"]["role"] for s in series}


def ready_pods(api_client: client.ApiClient, namespace: str) -> dict[str, str]:
    """Pod -> role of every Ready pod of the PDDeployment, as Kubernetes reports them."""
    pods = client.CoreV1Api(api_client).list_namespaced_pod(
        namespace, label_selector=f"pdoperator.io/deployment={NAME}"
    )
    return {
        p.metadata.name: p.metadata.labels["pdoperator.io/role"]
        for p in pods.items
        if not p.metadata.deletion_timestamp
        and any(c.type == "Ready" and c.status == "True" for c in p.status.conditions or [])
    }


def targets_are_the_ready_pods(
    api_client: client.ApiClient, prometheus: LocalPrometheus, namespace: str, prefill: int
) -> dict[str, str] | None:
    ready = ready_pods(api_client, namespace)
    roles = sorted(ready.values())
    if roles != ["decode"] + ["prefill"] * prefill or scraped_pods(prometheus, namespace) != ready:
        return None
    return ready


def test_ready_pods_serve_the_load_and_prometheus_sees_the_engines_latencies(
    api_client, namespace, prometheus, operator, sim
):
    create_pdd(api_client, namespace, pdd_body())
    deployment = wait_for(
        lambda: (d := sim.deployment(namespace, NAME)) and d.load_start_s is not None and d,
        timeout=60,
        what="a Ready prefill and decode pod, and the load aimed at them",
    )
    wait_for(
        lambda: targets_are_the_ready_pods(api_client, prometheus, namespace, prefill=1),
        timeout=30,
        what="Prometheus scraping exactly the Ready pods",
    )
    time.sleep(2)  # past the empty-system start
    one = measure(prometheus, deployment, namespace)
    assert one.ttft_promql == pytest.approx(one.ttft_engine, rel=0.1)
    assert one.itl_promql == pytest.approx(one.itl_engine, rel=0.1)

    set_prefill_replicas(api_client, namespace, 2)
    wait_for(
        lambda: targets_are_the_ready_pods(api_client, prometheus, namespace, prefill=2),
        timeout=30,
        what="the second prefill replica Ready and scraped",
    )
    time.sleep(2)  # the queue built by one replica drains
    two = measure(prometheus, deployment, namespace)
    assert two.ttft_promql == pytest.approx(two.ttft_engine, rel=0.1)
    assert two.itl_promql == pytest.approx(two.itl_engine, rel=0.1)
    assert two.ttft_promql < 0.75 * one.ttft_promql  # twice the prefill capacity queues less
    assert abs(two.requests - one.requests) < 0.2 * one.requests  # under the same load

    # The operator's reader finds the object's series by their namespace/deployment/role labels.
    reader = PrometheusReader(prometheus.url)
    signals, report = reader.read([SignalTarget(namespace, NAME, "VLLM", "P50", "P50", WINDOW_S)])
    ttft = signals[(namespace, NAME, "prefill")].ttft_seconds
    itl = signals[(namespace, NAME, "decode")].itl_seconds
    assert ttft.kind is ReadingKind.VALUE and itl.kind is ReadingKind.VALUE, (ttft, itl)
    assert ttft.value == pytest.approx(two.ttft_promql, rel=0.25)
    assert itl.value == pytest.approx(two.itl_promql, rel=0.25)
    assert report.adapters == {"VLLM": "vllm"}

    # A replica scaled away stops taking requests, drains, and leaves Prometheus's targets.
    before = set(ready_pods(api_client, namespace))
    set_prefill_replicas(api_client, namespace, 1)
    after = wait_for(
        lambda: targets_are_the_ready_pods(api_client, prometheus, namespace, prefill=1),
        timeout=30,
        what="the removed prefill replica gone from the targets",
    )
    (removed,) = before - set(after)
    with deployment.lock:
        assert deployment.serving(Role.PREFILL) == 1
        assert removed not in deployment.instances
        gone = [i for i in deployment.engine.instances() if i.name.startswith(f"{removed}-")]
        assert [i.state for i in gone] in ([State.DRAINING], [State.GONE])
    assert removed not in {g["labels"]["pod"] for g in sim.file_sd_groups()}


def test_load_specs_give_the_requests_they_name(tmp_path: Path):
    constant = list(parse_load("constant:5:200", LENGTHS, seed=1))
    assert 800 < len(constant) < 1200 and constant[-1].arrival_s < 200
    steps = list(parse_load("step:1,4:100", LENGTHS, seed=1))
    first = sum(1 for r in steps if r.arrival_s < 100)
    assert 2.5 < (len(steps) - first) / first < 6  # four times the rate in the second step

    mooncake = tmp_path / "trace.jsonl"
    mooncake.write_text(
        '{"timestamp": 0, "input_length": 100, "output_length": 5, "hash_ids": [1]}\n'
        '{"timestamp": 2000, "input_length": 300, "output_length": 7, "hash_ids": [1, 2]}\n'
    )
    azure = tmp_path / "trace.csv"
    azure.write_text(
        "TIMESTAMP,ContextTokens,GeneratedTokens\n"
        "2023-11-16 18:15:46.6805900,374,44\n2023-11-16 18:15:50.9951690,396,109\n"
    )
    replay = ReplayOptions(time_compression=2)
    assert [(r.arrival_s, r.input_tokens) for r in parse_load(f"trace:{mooncake}", LENGTHS)] == [
        (0.0, 100),
        (2.0, 300),
    ]
    assert [r.arrival_s for r in parse_load(f"trace:{mooncake}", LENGTHS, replay=replay)] == [
        0.0,
        1.0,
    ]
    assert [r.output_tokens for r in parse_load(f"trace:{azure}", LENGTHS)] == [44, 109]

    for bad in ("constant", "constant:fast", "step:1,2", "ramp:1:10", "poisson:3"):
        with pytest.raises(ValueError, match="constant:RATE"):
            parse_load(bad, LENGTHS)
    # A trace is read through before the run starts: its problem is named, not the load forms.
    with pytest.raises(ValueError, match=r"^/no: No such file"):
        parse_load("trace:/no", LENGTHS)
    mooncake.write_text(mooncake.read_text() + '{"timestamp": 3000, "output_length": 5}\n')
    with pytest.raises(ValueError, match="line 3: no input_length"):
        parse_load(f"trace:{mooncake}", LENGTHS)
    assert parse_target("ns/glm") == ("ns", "glm")
    with pytest.raises(ValueError):
        parse_target("glm")
