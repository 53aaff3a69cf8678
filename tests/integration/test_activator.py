"""Scale to zero's first request: client -> activator -> real router with no workers, held until
both pools start, then served, on the local control plane.

The operator reconciles a PDDeployment with `scaling.idleSeconds` whose pools are at zero; the
virtual kubelet runs its router pod's two containers as real processes on the pod's loopback
address: the activator (`python -m pd_operator.activator`, as the operator's image runs it) on
the public port and the real router behind it (vllm-router; sglang-router for SGLang). The
router answers 503 at once with no workers; the activator holds the request. The test then
raises both pools to one replica, as the operator's wake-up will, and the held request
completes; it prints the cold start's time to first token.
"""

import json
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from kubetools import RunningOperator, create_pdd, get_pdd, wait_for
from pd_operator.core.naming import deployment_name
from pd_operator.core.reconcile import ANNOTATION_DESIRED_REPLICAS
from pd_operator.core.router import ACTIVATOR_METRICS_PORT, INTERNAL_PORT
from pd_tools.simcluster.pod_processes import service_urls
from pd_tools.simcluster.virtual import VirtualCluster
from servingcases import MODEL, NAME, serving_cluster
from servingcases import pdd_body as serving_body

pytestmark = pytest.mark.integration

OUTPUT_TOKENS = 12


def pdd_body(engine: str = "VLLM") -> dict[str, Any]:
    """The serving sample with scale to zero: both pools 0..1, replicas moved by the test."""
    body = serving_body(engine=engine)
    for role in ("prefill", "decode"):
        body["spec"][role]["pools"][0]["replicas"] = {"min": 0, "max": 1}
    body["spec"]["scaling"] = {"mode": "Disabled", "idleSeconds": 300}
    return body


@pytest.fixture
def operator(cluster, namespace) -> Iterator[RunningOperator]:
    running = RunningOperator(str(cluster.kubeconfig), namespaces=[namespace], workers=2).start()
    yield running
    running.stop()


@pytest.fixture
def virtual(api_client, namespace, tmp_path: Path) -> Iterator[VirtualCluster]:
    cluster = serving_cluster(api_client, namespace, tmp_path)
    with cluster:
        yield cluster
        client.CoreV1Api(api_client).delete_collection_namespaced_pod(
            namespace, grace_period_seconds=0
        )
    assert cluster.processes is not None and not cluster.processes.running


def samples(url: str) -> dict[str, float]:
    """`name{labels}` -> value of a /metrics page."""
    with urllib.request.urlopen(url, timeout=5) as answer:
        text = answer.read().decode()
    result = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            result[name] = float(value)
    return result


def pods(api_client, namespace: str, role: str) -> list[Any]:
    selector = f"pdoperator.io/deployment={NAME},pdoperator.io/role={role}"
    return (
        client.CoreV1Api(api_client).list_namespaced_pod(namespace, label_selector=selector).items
    )


class StreamedRequest(threading.Thread):
    """One streamed completion through the endpoint; when its first token came, and its text."""

    def __init__(self, url: str) -> None:
        super().__init__(daemon=True)
        self.url = url
        self.sent = time.monotonic()
        self.first_token: float | None = None
        self.status: int | None = None
        self.events: list[dict[str, Any]] = []
        self.error: BaseException | None = None

    def run(self) -> None:
        body = {"model": MODEL, "prompt": "hello " * 50, "max_tokens": OUTPUT_TOKENS}
        request = urllib.request.Request(
            f"{self.url}/v1/completions",
            data=json.dumps({**body, "stream": True}).encode(),
            headers={"Content-Type": "application/json"},
        )
        try:
            with urllib.request.urlopen(request, timeout=120) as answer:
                self.status = answer.status
                for raw in answer:
                    line = raw.decode().strip()
                    if not line.startswith("data: ") or line == "data: [DONE]":
                        continue
                    self.first_token = self.first_token or time.monotonic()
                    self.events.append(json.loads(line.removeprefix("data: ")))
        except BaseException as error:  # reported by the test
            self.error = error


# What each router answers with no workers (the activator holds exactly these).
NO_WORKERS = {
    "VLLM": ("No available workers: 0 prefill, 0 decode", None),
    "SGLang": (None, "server_selection_failed"),
}


@pytest.mark.parametrize("engine", ["VLLM", "SGLang"])
def test_a_request_at_zero_is_held_by_the_activator_and_served_once_both_pools_start(
    api_client, namespace, operator, virtual, engine
):
    create_pdd(api_client, namespace, pdd_body(engine))
    # At zero the router pod is Ready all the same: the activator answers its probe.

    def routable() -> str | None:
        try:
            return (service_urls(api_client, namespace, NAME, "http") or [None])[0]
        except ApiException:
            return None  # the Service is not there yet

    url = wait_for(
        routable,
        timeout=90,
        what="the router pod Ready behind the endpoint with no engine pod",
    )
    (router_pod,) = pods(api_client, namespace, "router")
    assert [c.name for c in router_pod.spec.containers] == ["router", "activator"]
    ip = router_pod.status.pod_ip
    assert url == f"http://{ip}:8000"
    assert not pods(api_client, namespace, "prefill") and not pods(api_client, namespace, "decode")
    # What the activator hides: the real router, asked directly, refuses at once.
    refused = urllib.request.Request(
        f"http://{ip}:{INTERNAL_PORT}/v1/completions",
        data=json.dumps({"model": MODEL, "prompt": "hi", "max_tokens": 1}).encode(),
        headers={"Content-Type": "application/json"},
    )
    with pytest.raises(urllib.error.HTTPError) as answer:
        urllib.request.urlopen(refused, timeout=10)
    assert answer.value.code == 503
    body, code = NO_WORKERS[engine]
    if body is not None:
        assert answer.value.read().decode() == body
    if code is not None:
        assert answer.value.headers["x-smg-error-code"] == code

    metrics = f"http://{ip}:{ACTIVATOR_METRICS_PORT}/metrics"
    request = StreamedRequest(url)
    request.start()
    wait_for(
        lambda: samples(metrics).get("pd_activator_pending_requests") == 1,
        timeout=10,
        what="the activator holding the request",
    )
    time.sleep(2.0)  # held, not failed: no engine pod, and the client still waits
    assert request.is_alive() and request.status is None, request.error
    held = samples(metrics)
    assert held["pd_activator_in_flight_requests"] == 1
    assert held["pd_activator_requests_total"] == 1

    # The wake-up, as the operator's will do it: both pools' replica decision goes to one.
    woke = time.monotonic()
    apps = client.AppsV1Api(api_client)
    for role in ("prefill", "decode"):
        (pool,) = pdd_body(engine)["spec"][role]["pools"]
        apps.patch_namespaced_deployment(
            deployment_name(NAME, role, pool["name"]),
            namespace,
            {
                "metadata": {"annotations": {ANNOTATION_DESIRED_REPLICAS: "1"}},
                "spec": {"replicas": 1},
            },
        )
    request.join(timeout=120)
    assert not request.is_alive(), "the held request never completed"
    assert request.error is None, request.error
    assert request.status == 200
    text = "".join(event["choices"][0]["text"] for event in request.events)
    assert sum(1 for e in request.events if e["choices"][0]["text"]) == OUTPUT_TOKENS, text
    assert request.first_token is not None
    cold_start = request.first_token - request.sent
    print(
        f"\n{engine} cold start: time to first token {cold_start:.2f}s "
        f"({request.first_token - woke:.2f}s after the pools were raised)"
    )
    after = samples(metrics)
    assert after["pd_activator_pending_requests"] == 0
    assert after["pd_activator_in_flight_requests"] == 0
    assert after["pd_activator_hold_seconds_count"] == 1
    # Held about as long as the pools took to start: past the 2 s the test waited at zero.
    assert 2.0 < after["pd_activator_hold_seconds_sum"] <= cold_start
    assert after['pd_activator_hold_seconds_bucket{le="0.0"}'] == 0


def routable(api_client, namespace: str) -> str | None:
    """The endpoint's URL once a Ready router pod is behind it."""
    try:
        return (service_urls(api_client, namespace, NAME, "http") or [None])[0]
    except ApiException:
        return None  # the Service is not there yet


def at_zero(api_client, namespace: str) -> dict[str, Any] | None:
    """The ScaledToZero condition while it is True."""
    found = condition_of(api_client, namespace, "ScaledToZero")
    return found if found.get("status") == "True" else None


def condition_of(api_client, namespace: str, kind: str) -> dict[str, Any]:
    status = get_pdd(api_client, namespace, NAME).get("status") or {}
    return next((c for c in status.get("conditions") or [] if c["type"] == kind), {})


def test_the_operator_wakes_both_pools_for_a_held_request_and_takes_them_back_to_zero(
    cluster, api_client, namespace, prometheus, tmp_path: Path
):
    """The whole loop, nothing moved by hand: the operator (autoscaler Active) reads the
    activator's series from a real Prometheus, starts both pools for the held request and,
    after idleSeconds without one, takes both back to zero."""
    body = pdd_body()
    body["spec"]["scaling"] = {
        "mode": "Active",
        "idleSeconds": 30,
        "intervalSeconds": 5,
        "prometheus": {"url": prometheus.url},
    }
    virtual = serving_cluster(
        api_client, namespace, tmp_path, sd_file=prometheus.targets_dir / f"{namespace}.json"
    )
    running = RunningOperator(str(cluster.kubeconfig), namespaces=[namespace], workers=2)
    with virtual:
        running.start()
        try:
            create_pdd(api_client, namespace, body)
            url = wait_for(
                lambda: routable(api_client, namespace),
                timeout=90,
                what="the router pod Ready with both pools at zero",
            )
            idle = wait_for(
                lambda: at_zero(api_client, namespace),
                timeout=60,
                what="ScaledToZero=True at creation (min 0, no request)",
            )
            assert idle["reason"] == "Idle", idle
            assert not pods(api_client, namespace, "prefill")

            request = StreamedRequest(url)
            request.start()
            request.join(timeout=180)
            assert not request.is_alive(), "the held request never completed"
            assert request.error is None and request.status == 200, request.error
            assert request.first_token is not None
            cold_start = request.first_token - request.sent
            print(f"\ncold start through the operator: time to first token {cold_start:.2f}s")
            assert len(pods(api_client, namespace, "prefill")) == 1
            assert len(pods(api_client, namespace, "decode")) == 1
            serving = condition_of(api_client, namespace, "ScaledToZero")
            assert serving["status"] == "False", serving

            # No request for idleSeconds (30 s): both pools go, together.
            asleep = wait_for(
                lambda: at_zero(api_client, namespace),
                timeout=120,
                what="both pools back to zero after idleSeconds",
            )
            assert "idleSeconds 30" in asleep["message"] or "at zero" in asleep["message"]
            apps = client.AppsV1Api(api_client)
            for role in ("prefill", "decode"):
                (pool,) = body["spec"][role]["pools"]
                deployment = apps.read_namespaced_deployment(
                    deployment_name(NAME, role, pool["name"]), namespace
                )
                assert deployment.spec.replicas == 0, role
        finally:
            running.stop()
            client.CoreV1Api(api_client).delete_collection_namespaced_pod(
                namespace, grace_period_seconds=0
            )
