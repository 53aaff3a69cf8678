"""The autoscaler in the running operator, reading a real Prometheus.

Latencies come from engine-shaped metrics that the test controls (the closed loop through the
engine simulator lives in test_closed_loop.py); what is checked here is the operator's side:
breach → replicas written within two intervals, unknown metrics → hold and say so, Advisory →
recorded but not applied.
"""

import copy
import itertools
import logging
import os
import signal
import time
from datetime import datetime

import pytest
from kubernetes import client
from prometheus_client import REGISTRY

from fakeengine import FakeEngine
from kubetools import condition, create_pdd, events, get_pdd, wait_for
from pd_tools.localcluster import LocalPrometheus
from pdcases import ROOT, load_sample

HETERO = load_sample(ROOT / "config" / "samples" / "heterogeneous-s5000-h200.yaml")
INTERVAL = 5


@pytest.fixture
def nodes(tiny_nodes):
    return tiny_nodes


@pytest.fixture
def operator(operator_on_tiny_nodes):
    return operator_on_tiny_nodes


def pdd_body(prometheus_url: str, mode: str = "Active") -> dict:
    body = copy.deepcopy(HETERO)
    body["spec"]["slo"]["windowSeconds"] = 10
    for role in ("prefill", "decode"):
        pool = body["spec"][role]["pools"][0]
        pool["template"] = {**pool.get("template", {}), "schedulerName": "pd-mock-scheduler"}
    body["spec"]["scaling"] = {
        "mode": mode,
        "intervalSeconds": INTERVAL,
        "scaleUp": {"stabilizationSeconds": 0, "maxStepReplicas": 2},
        "scaleDown": {"stabilizationSeconds": 10, "maxStepReplicas": 1},
        "prometheus": {"url": prometheus_url},
    }
    return body


@pytest.fixture
def engine_metrics(prometheus, namespace):
    made = []

    def make(role: str) -> FakeEngine:
        name = f"{namespace}-{role}"
        engine = FakeEngine(
            prometheus, name, {"namespace": namespace, "deployment": "glm-hetero", "role": role}
        )
        made.append((name, engine))
        return engine

    yield make
    for name, engine in made:
        prometheus.set_targets(name, [], {})
        engine.close()


def feed_ttft_breach(prefill: FakeEngine, decode: FakeEngine) -> None:
    """One more second of a prefill pool breaching its 6 s TTFT target under a queue, while
    decode meets its ITL target."""
    for _ in range(50):
        prefill.ttft.labels(model_name="m").observe(9.0)
        decode.itl.labels(model_name="m").observe(0.012)
    prefill.prompt.labels(model_name="m").inc(200_000)
    prefill.waiting.labels(model_name="m").set(20)


def prefill_replicas(api_client, namespace) -> int:
    """Replicas of the prefill pool's Deployment (0 before it exists)."""
    apps = client.AppsV1Api(api_client)
    found = apps.list_namespaced_deployment(
        namespace, field_selector="metadata.name=glm-hetero-prefill-s5000"
    ).items
    return found[0].spec.replicas if found else 0


def test_ttft_breach_grows_prefill_and_status_says_why(
    operator, api_client, namespace, prometheus, engine_metrics, caplog
):
    caplog.set_level(logging.INFO)
    prefill, decode = engine_metrics("prefill"), engine_metrics("decode")
    create_pdd(api_client, namespace, pdd_body(prometheus.url))

    def breach():
        feed_ttft_breach(prefill, decode)
        return prefill_replicas(api_client, namespace) > 1

    wait_for(breach, timeout=60, interval=1, what="prefill to grow after the TTFT breach")
    # Two S5000 nodes of eight cards hold two replicas of eight: never ask for more.
    assert prefill_replicas(api_client, namespace) == 2
    obj = wait_for(
        lambda: (
            (get_pdd(api_client, namespace, "glm-hetero").get("status") or {}).get("lastDecision")
            and get_pdd(api_client, namespace, "glm-hetero")
        ),
        what="lastDecision in status",
    )
    assert condition(obj, "SLOMet")["status"] == "False"
    assert condition(obj, "MetricsAvailable")["status"] == "True"
    assert condition(obj, "MetricsConfigured")["status"] == "True"
    assert obj["status"]["observed"]["ttftMilliseconds"] > 6000
    assert wait_for(lambda: events(api_client, namespace, "ScaledUp"), what="a ScaledUp event")
    assert events(api_client, namespace, "SLOViolated")
    # The log says the decision once, in one line, and kopf's per-event lines stay out of it.
    info = [r.getMessage() for r in caplog.records if r.levelno == logging.INFO]
    scaled = [line for line in info if "prefill/s5000 1 -> 2" in line]
    assert len(scaled) == 1, info
    assert scaled[0].startswith(f"scaling {namespace}/glm-hetero: ")
    # (kopf's "Activity 'login' succeeded." at start-up is not per event: it may fall inside.)
    assert not [line for line in info if line.startswith("Handler ") and "succeeded" in line]


def test_unknown_metrics_hold_replicas_and_set_the_condition(operator, api_client, namespace):
    body = pdd_body("http://127.0.0.1:9")  # nothing listens there
    body["spec"]["prefill"]["pools"][0]["replicas"] = {"min": 1, "max": 4}
    create_pdd(api_client, namespace, body)
    obj = wait_for(
        lambda: (
            condition(get_pdd(api_client, namespace, "glm-hetero"), "MetricsAvailable").get(
                "status"
            )
            == "False"
            and get_pdd(api_client, namespace, "glm-hetero")
        ),
        timeout=40,
        what="MetricsAvailable=False",
    )
    assert obj["status"]["lastDecision"]["limitedBy"] == "metrics"
    assert condition(obj, "SLOMet")["status"] == "Unknown"
    assert prefill_replicas(api_client, namespace) == 1
    assert wait_for(
        lambda: events(api_client, namespace, "MetricsUnavailable"),
        what="a MetricsUnavailable event",
    )


def test_an_open_schedule_warms_its_pool_even_without_metrics_and_status_names_it(
    operator, api_client, namespace
):
    body = pdd_body("http://127.0.0.1:9")  # nothing listens there: no metrics at all
    body["spec"]["scaling"]["schedules"] = [
        {"name": "all-day", "start": "00:00", "end": "00:00", "prefill": {"s5000": 2}}
    ]
    create_pdd(api_client, namespace, body)
    wait_for(
        lambda: prefill_replicas(api_client, namespace) == 2,
        timeout=40,
        what="the schedule's floor of 2 prefill replicas",
    )

    scaled = wait_for(lambda: events(api_client, namespace, "ScaledUp"), what="a ScaledUp event")
    assert scaled[0].message.startswith("prefill pool s5000: 1 -> 2: ")
    assert "limited by schedule all-day" in scaled[0].message
    # The floor holds: without metrics nothing else would move the pool either way.
    obj = get_pdd(api_client, namespace, "glm-hetero")
    assert condition(obj, "MetricsAvailable")["status"] == "False"
    assert prefill_replicas(api_client, namespace) == 2


def test_advisory_mode_records_but_does_not_apply(
    operator, api_client, namespace, prometheus, engine_metrics
):
    prefill, decode = engine_metrics("prefill"), engine_metrics("decode")
    create_pdd(api_client, namespace, pdd_body(prometheus.url, mode="Advisory"))

    def advised():
        feed_ttft_breach(prefill, decode)
        status = get_pdd(api_client, namespace, "glm-hetero").get("status") or {}
        return (status.get("lastDecision") or {}).get("prefillReplicas", 1) > 1

    wait_for(advised, timeout=60, interval=1, what="an advisory decision to grow prefill")
    assert prefill_replicas(api_client, namespace) == 1
    scaled = wait_for(lambda: events(api_client, namespace, "ScaledUp"), what="a ScaledUp event")
    assert "advisory" in scaled[0].message


def test_ready_pods_without_series_say_metrics_misconfigured(
    operator, api_client, namespace, prometheus, engine_metrics
):
    # Prometheus scrapes the decode engines only: the prefill pods run, their series never come.
    decode = engine_metrics("decode")
    create_pdd(api_client, namespace, pdd_body(prometheus.url))

    def misconfigured():
        decode.itl.labels(model_name="m").observe(0.012)
        obj = get_pdd(api_client, namespace, "glm-hetero")
        return condition(obj, "MetricsConfigured").get("status") == "False" and obj

    obj = wait_for(misconfigured, timeout=60, interval=1, what="MetricsConfigured=False")
    message = condition(obj, "MetricsConfigured")["message"]
    assert condition(obj, "MetricsConfigured")["reason"] == "MetricsMisconfigured"
    assert message.startswith("prefill: 1 pods Ready but no series: ")
    assert 'role="prefill"' in message and "time_to_first_token" in message  # the query
    assert "decode" not in message.split(". Check")[0]  # decode's series are found
    assert condition(obj, "MetricsAvailable")["status"] == "False"
    assert obj["status"]["lastDecision"]["limitedBy"] == "metrics"
    assert prefill_replicas(api_client, namespace) == 1
    assert wait_for(
        lambda: events(api_client, namespace, "MetricsMisconfigured"),
        what="a MetricsMisconfigured event",
    )


def test_other_workloads_on_the_nodes_count_against_free_capacity(
    operator, api_client, namespace, prometheus, engine_metrics
):
    # A pod of another workload holds every card of one of the two S5000 nodes.
    core = client.CoreV1Api(api_client)
    s5000 = sorted(
        n.metadata.name
        for n in core.list_node(label_selector="mthreads.com/gpu.product=MTT-S5000").items
        if n.metadata.name.startswith(f"{namespace}-")
    )
    assert len(s5000) == 2
    core.create_namespaced_pod(namespace, {
        "metadata": {"name": "other-team-training"},
        "spec": {
            "nodeName": s5000[0],
            "tolerations": [{"key": "mthreads.com/gpu", "operator": "Exists"}],
            "containers": [{
                "name": "train", "image": "example.invalid/train:1",
                "resources": {"limits": {"mthreads.com/gpu": "8"}},
            }],
        },
    })  # fmt: skip
    prefill, decode = engine_metrics("prefill"), engine_metrics("decode")
    create_pdd(api_client, namespace, pdd_body(prometheus.url))

    def capacity_short():
        feed_ttft_breach(prefill, decode)
        obj = get_pdd(api_client, namespace, "glm-hetero")
        return condition(obj, "CapacityAvailable").get("status") == "False" and obj

    obj = wait_for(capacity_short, timeout=60, interval=1, what="CapacityAvailable=False")
    assert obj["status"]["lastDecision"]["limitedBy"] == "capacity"
    # Only the other node's eight cards were free: one replica, never a Pending second one.
    assert prefill_replicas(api_client, namespace) == 1
    pods = core.list_namespaced_pod(namespace, label_selector="pdoperator.io/role=prefill").items
    assert len(pods) == 1


def status_writes() -> float:
    """Status patches the operator has sent so far (pd_operator_api_writes_total)."""
    labels = {"verb": "patch_status", "kind": "PDDeployment"}
    return REGISTRY.get_sample_value("pd_operator_api_writes_total", labels) or 0.0


def pools_ready(obj: dict) -> bool:
    """Every pool has its replicas Ready (the router's pod is not scheduled in these tests)."""
    pools = (obj.get("status") or {}).get("pools") or []
    return bool(pools) and all(p["readyReplicas"] == p["desiredReplicas"] for p in pools)


def fake_engines(prometheus, namespace: str, name: str) -> tuple[FakeEngine, FakeEngine]:
    """A prefill and a decode engine of PDDeployment `name`, scraped by `prometheus`."""
    prefill, decode = (
        FakeEngine(
            prometheus, f"{namespace}-{name}-{role}",
            {"namespace": namespace, "deployment": name, "role": role},
        )
        for role in ("prefill", "decode")
    )  # fmt: skip
    return prefill, decode


def serve(engines: tuple[FakeEngine, FakeEngine], requests: int) -> None:
    """`requests` more requests, each within its TTFT and ITL targets."""
    for _ in range(requests):
        engines[0].ttft.labels(model_name="m").observe(0.5)
        engines[1].itl.labels(model_name="m").observe(0.012)


def reading_and_ready(api_client, namespace: str, *names: str) -> bool:
    objects = [get_pdd(api_client, namespace, name) for name in names]
    return all(
        condition(obj, "MetricsAvailable").get("status") == "True" and pools_ready(obj)
        for obj in objects
    )


def test_a_hung_prometheus_holds_back_only_its_own_objects(
    operator, api_client, namespace, prometheus
):
    far = LocalPrometheus()
    far.start()
    near_engines = fake_engines(prometheus, namespace, "glm-near")
    far_engines = fake_engines(far, namespace, "glm-far")
    stopped = False
    try:
        for name, url in (("glm-near", prometheus.url), ("glm-far", far.url)):
            body = pdd_body(url)
            body["metadata"]["name"] = name
            # Four-card decode replicas: both objects' decode pools share the one H200 node.
            body["spec"]["decode"]["pools"][0]["accelerator"]["perReplica"] = 4
            create_pdd(api_client, namespace, body)

        def both_read() -> bool:
            serve(near_engines, 5)
            serve(far_engines, 5)
            return reading_and_ready(api_client, namespace, "glm-near", "glm-far")

        wait_for(both_read, timeout=90, interval=1, what="both objects reading their Prometheus")
        os.kill(far.process.pid, signal.SIGSTOP)
        stopped = True
        since = time.monotonic()

        # A load that grows by one request per second every second: the healthy object's
        # observed rate moves by more than the 5% that is worth a status write at every
        # decision, so that each decision shows as a new status.observed.sampleTime.
        samples: list[str] = []
        unavailable_at: tuple[float, dict, str] | None = None
        for second in range(8 * INTERVAL):
            serve(near_engines, 5 + second)
            near = get_pdd(api_client, namespace, "glm-near")["status"]
            if not samples or samples[-1] != near["observed"]["sampleTime"]:
                samples.append(near["observed"]["sampleTime"])
            far_obj = get_pdd(api_client, namespace, "glm-far")
            available = condition(far_obj, "MetricsAvailable")
            if unavailable_at is None and available.get("status") == "False":
                version = far_obj["metadata"]["resourceVersion"]
                unavailable_at = (time.monotonic() - since, available, version)
            time.sleep(max(0.0, since + second + 1 - time.monotonic()))
        times = [datetime.fromisoformat(s).timestamp() for s in samples]
        gaps = [b - a for a, b in itertools.pairwise(times)]
        # Every decision of the healthy object within its interval (and the 1 s tick).
        assert len(gaps) >= 5 and max(gaps) <= INTERVAL + 1, gaps
        assert unavailable_at is not None, "the stopped Prometheus' object never said so"
        after, available, version = unavailable_at
        assert after <= 2 * INTERVAL + 3  # its next decision, once the read deadline passed
        assert f"Prometheus at {far.url} did not answer within" in available["message"]
        far_obj = get_pdd(api_client, namespace, "glm-far")
        assert far_obj["status"]["lastDecision"]["limitedBy"] == "metrics"
        # Holding, with nothing new to say: no status write after the one that said so.
        assert far_obj["metadata"]["resourceVersion"] == version
        assert "ttftMilliseconds" not in far_obj["status"]["observed"]  # unknown, not stale
    finally:
        if stopped:
            os.kill(far.process.pid, signal.SIGCONT)
        for engine in (*near_engines, *far_engines):
            engine.close()
        far.stop()


def test_lost_metrics_cost_no_status_writes_and_capacity_still_follows_the_nodes(
    operator, api_client, namespace, nodes
):
    source = LocalPrometheus()
    source.start()
    engines = fake_engines(source, namespace, "glm-hetero")
    try:
        create_pdd(api_client, namespace, pdd_body(source.url))

        def reading() -> bool:
            serve(engines, 5)
            return reading_and_ready(api_client, namespace, "glm-hetero")

        wait_for(reading, timeout=90, interval=1, what="metrics read with every pool Ready")
        source.pause()  # Prometheus is gone

        def lost():
            obj = get_pdd(api_client, namespace, "glm-hetero")
            return condition(obj, "MetricsAvailable").get("status") == "False" and obj

        wait_for(lost, timeout=3 * INTERVAL, what="MetricsAvailable=False")
        wait_for(operator.settled, what="the work queue to drain")
        before = status_writes()
        time.sleep(6 * INTERVAL)
        assert status_writes() - before == 0
        obj = get_pdd(api_client, namespace, "glm-hetero")
        assert "ttftMilliseconds" not in obj["status"]["observed"]  # unknown, not stale
        assert condition(obj, "CapacityAvailable")["status"] == "True"

        # Every node goes, and its pods with it: capacity needs no metrics to be known.
        nodes.stop()
        client.CoreV1Api(api_client).delete_collection_namespaced_pod(
            namespace, grace_period_seconds=0
        )

        def exhausted():
            obj = get_pdd(api_client, namespace, "glm-hetero")
            return condition(obj, "CapacityAvailable").get("status") == "False" and obj

        obj = wait_for(exhausted, timeout=3 * INTERVAL, what="CapacityAvailable=False")
        assert "no Ready, schedulable node" in condition(obj, "CapacityAvailable")["message"]
        assert condition(obj, "MetricsAvailable")["status"] == "False"
        assert obj["status"]["lastDecision"]["limitedBy"] == "metrics"
    finally:
        for engine in engines:
            engine.close()
        source.stop()
