"""The whole system in a real kind cluster (`make kind-e2e`, docs/kind.md).

hack/kind.sh e2e has made the cluster (kind mode: the workers carry the articles' labels, taints
and fake cards), loaded the images, installed the chart (the operator runs as a pod with its
ServiceAccount) and the Prometheus of config/kind/prometheus.yaml. This test then does what a
user would: a PDDeployment of engine-simulator pods behind the real router, a load from the host
through a port kind publishes, and checks that the operator reads the TTFT breach from the
in-cluster Prometheus and adds prefill, that the real kube-scheduler puts the replicas only where
fake cards are free, and that a replica that cannot fit stays Pending and the operator says so.
It prints how long each step took.
"""

import asyncio
import json
import os
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from kubetools import condition, wait_for
from pd_tools.workloads.http_load import LoadConfig, LoadResult, replay
from pd_tools.workloads.traces import Request

NAMESPACE = "pd-e2e"
NAME = "glm-sim"
MODEL = "zai-org/GLM-4.6-FP8"
OPERATOR_NAMESPACE = "pd-operator-system"
ENGINE_IMAGE = os.environ.get("ENGINE_SIM_IMAGE", "pd-operator/engine-sim:dev")
# config/kind/kind-cluster.yaml publishes these NodePorts on the host's loopback.
ENDPOINT_PORT = 30080
PROMETHEUS_URL = "http://127.0.0.1:30090"
S5000_NODES = 4  # config/kind/kind-cluster.yaml's s5000 workers, 8 cards each: 4 replicas of 8
TTFT_TARGET_MS = 1500
GROUP = ("pdoperator.io", "v1alpha1", "pddeployments")

timings: list[tuple[str, float]] = []


@pytest.fixture(scope="module")
def api() -> client.ApiClient:
    kubeconfig = os.environ.get("PD_KIND_KUBECONFIG")
    if not kubeconfig:
        pytest.fail("PD_KIND_KUBECONFIG is not set: run this test through `make kind-e2e`")
    return config.new_client_from_config(config_file=kubeconfig)


def step(what: str, check: Callable[[], Any], timeout: float) -> Any:
    """wait_for, recording how long it took."""
    started = time.monotonic()
    value = wait_for(check, timeout=timeout, interval=1, what=what)
    timings.append((what, time.monotonic() - started))
    return value


def pool(name: str, resource: str, product: str, hardware: str, replicas: dict[str, int]):
    return {
        "name": name,
        "accelerator": {
            "resourceName": resource,
            "perReplica": 8,
            "nodeSelector": {f"{resource}.product": product},
            "tolerations": [{"key": resource, "operator": "Exists", "effect": "NoSchedule"}],
            "profile": hardware,
        },
        "replicas": replicas,
        "template": {
            "env": [
                {"name": "PD_SIM_HARDWARE", "value": hardware},
                {"name": "PD_SIM_MODEL", "value": "glm-4.5-fp8"},
                {"name": "PD_SIM_LOAD_SECONDS", "value": "5"},
            ],
        },
    }


def pdd_body() -> dict[str, Any]:
    """docs/install.md's simulated articles' topology, with an SLO the load below breaches."""
    return {
        "apiVersion": "pdoperator.io/v1alpha1",
        "kind": "PDDeployment",
        "metadata": {"name": NAME, "namespace": NAMESPACE},
        "spec": {
            "model": {
                "name": MODEL, "engine": "VLLM", "image": ENGINE_IMAGE, "contextLength": 65536
            },
            "kvTransfer": {"connector": "NIXL", "protocol": "TCP", "cacheDtype": "FP8"},
            "slo": {
                "ttft": {"percentile": "P90", "targetMilliseconds": TTFT_TARGET_MS},
                "itl": {"percentile": "P90", "targetMilliseconds": 100},
                "windowSeconds": 15,
            },
            "prefill": {
                "pools": [
                    pool(
                        "s5000", "mthreads.com/gpu", "MTT-S5000", "mtt-s5000",
                        {"min": 1, "max": S5000_NODES + 2},
                    )
                ]
            },
            "decode": {
                "pools": [
                    pool("h200", "nvidia.com/gpu", "NVIDIA-H200", "h200", {"min": 1, "max": 1})
                ]
            },
            "scaling": {
                "mode": "Active",
                "intervalSeconds": 5,
                "scaleUp": {"stabilizationSeconds": 0, "maxStepReplicas": S5000_NODES + 2},
            },
            "termination": {"drainSeconds": 0},
        },
    }  # fmt: skip


@pytest.fixture(scope="module")
def namespace(api: client.ApiClient) -> Iterator[str]:
    core = client.CoreV1Api(api)
    try:
        core.delete_namespace(NAMESPACE)
    except ApiException as error:
        if error.status != 404:
            raise
    step("an earlier run's namespace gone", lambda: _absent(core, NAMESPACE), timeout=180)
    core.create_namespace({"metadata": {"name": NAMESPACE}})
    yield NAMESPACE
    # Left in place on failure, for `kubectl -n pd-e2e describe`; the next run starts anew.


def _absent(core: client.CoreV1Api, name: str) -> bool:
    try:
        core.read_namespace(name)
    except ApiException as error:
        if error.status == 404:
            return True
        raise
    return False


def get_pdd(api: client.ApiClient) -> dict[str, Any]:
    group, version, plural = GROUP
    obj: dict[str, Any] = client.CustomObjectsApi(api).get_namespaced_custom_object(
        group, version, NAMESPACE, plural, NAME
    )
    return obj


def patch_pdd(api: client.ApiClient, patch: dict[str, Any]) -> None:
    group, version, plural = GROUP
    client.CustomObjectsApi(api).patch_namespaced_custom_object(
        group, version, NAMESPACE, plural, NAME, patch
    )


def prefill_pods(api: client.ApiClient) -> list[Any]:
    selector = f"pdoperator.io/deployment={NAME},pdoperator.io/role=prefill"
    pods = client.CoreV1Api(api).list_namespaced_pod(NAMESPACE, label_selector=selector).items
    return [p for p in pods if p.metadata.deletion_timestamp is None]


def is_ready(pod: Any) -> bool:
    return any(c.type == "Ready" and c.status == "True" for c in pod.status.conditions or [])


def unschedulable(pod: Any) -> str | None:
    """The scheduler's message for a pod it could not place, else None."""
    for c in pod.status.conditions or []:
        if c.type == "PodScheduled" and c.status == "False" and c.reason == "Unschedulable":
            return str(c.message)
    return None


def requests(count: int, rate: float, input_tokens: int, output_tokens: int) -> list[Request]:
    return [Request(i / rate, input_tokens + i % 7, output_tokens) for i in range(count)]


def prometheus_query(query: str) -> list[dict[str, Any]]:
    url = f"{PROMETHEUS_URL}/api/v1/query?{urllib.parse.urlencode({'query': query})}"
    with urllib.request.urlopen(url, timeout=10) as reply:
        result: list[dict[str, Any]] = json.load(reply)["data"]["result"]
    return result


def test_the_operator_scales_prefill_on_a_ttft_breach_in_a_real_kind_cluster(api, namespace):
    core, apps = client.CoreV1Api(api), client.AppsV1Api(api)
    group, version, plural = GROUP

    # The operator runs as the chart's pod, with the chart's ServiceAccount.
    (operator,) = [
        p
        for p in core.list_namespaced_pod(
            OPERATOR_NAMESPACE, label_selector="app.kubernetes.io/name=pd-operator"
        ).items
        if p.status.phase == "Running"
    ]
    assert operator.spec.service_account_name == "pd-operator", operator.spec
    nodes = {n.metadata.name: n for n in core.list_node().items}
    s5000 = {
        name
        for name, node in nodes.items()
        if (node.metadata.labels or {}).get("pdoperator.io/node-group") == "s5000"
    }
    assert len(s5000) == S5000_NODES, sorted(s5000)
    assert all(nodes[n].status.allocatable.get("mthreads.com/gpu") == "8" for n in s5000)

    client.CustomObjectsApi(api).create_namespaced_custom_object(
        group, version, namespace, plural, pdd_body()
    )

    def ready() -> bool:
        status = get_pdd(api).get("status") or {}
        return condition({"status": status}, "Ready").get("status") == "True"

    step("PDDeployment Ready (1 prefill, 1 decode, router)", ready, timeout=300)

    # The endpoint on a NodePort that kind publishes on 127.0.0.1 (the operator's own Service
    # is ClusterIP, as a user's ingress would front it).
    endpoint = core.read_namespaced_service(NAME, namespace)
    (port,) = [p for p in endpoint.spec.ports if p.name == "http"]
    core.create_namespaced_service(
        namespace,
        {
            "metadata": {"name": f"{NAME}-e2e"},
            "spec": {
                "type": "NodePort",
                "selector": endpoint.spec.selector,
                "ports": [{"port": port.port, "targetPort": port.target_port,
                           "nodePort": ENDPOINT_PORT}],
            },
        },
    )  # fmt: skip
    url = f"http://127.0.0.1:{ENDPOINT_PORT}"

    def serves() -> bool:
        body = b'{"model": "' + MODEL.encode() + b'", "prompt": "hello world", "max_tokens": 3}'
        request = urllib.request.Request(
            url + "/v1/completions", body, {"Content-Type": "application/json"}
        )
        try:
            with urllib.request.urlopen(request, timeout=10) as answer:
                return answer.status == 200
        except OSError:
            return False

    step("a completion through the router from the host", serves, timeout=120)
    step(
        "Prometheus scrapes the engines",
        lambda: len(prometheus_query(f'up{{job="pd-engines",namespace="{namespace}"}} == 1')) == 2,
        timeout=60,
    )

    # 6,000-token prompts at 20 per second for a minute: about four times what one 8-card S5000
    # replica prefills, so requests queue on it and TTFT grows past the target.
    config_ = LoadConfig(url=url, model=MODEL, max_in_flight=600, timeout_s=90, deadline_s=120)
    outcome: list[LoadResult] = []
    load = threading.Thread(
        target=lambda: outcome.append(asyncio.run(replay(requests(1200, 20.0, 6000, 4), config_))),
        daemon=True,
    )
    load.start()

    def grown() -> dict[str, Any] | None:
        status = get_pdd(api).get("status") or {}
        decision = status.get("lastDecision") or {}
        return status if decision.get("prefillReplicas", 1) >= 2 else None

    status = step("the operator adds prefill on the TTFT breach", grown, timeout=120)
    assert status["observed"]["ttftMilliseconds"] > TTFT_TARGET_MS, status["observed"]
    decision = status["lastDecision"]

    def placed() -> list[Any] | None:
        pods = prefill_pods(api)
        return pods if len(pods) >= 2 and all(is_ready(p) for p in pods) else None

    pods = step("the new prefill replicas Ready", placed, timeout=180)
    # The real kube-scheduler put each 8-card replica on an S5000 worker of its own.
    assert {p.spec.node_name for p in pods} <= s5000, [p.spec.node_name for p in pods]
    assert len({p.spec.node_name for p in pods}) == len(pods)

    load.join(timeout=150)
    assert outcome, "the load did not finish"
    summary = outcome[0].summary
    assert summary.completed > 0, summary

    # More replicas than the fake cards hold: the fifth cannot be placed anywhere.
    patch_pdd(api, {"spec": {"prefill": {"pools": [
        {**pdd_body()["spec"]["prefill"]["pools"][0],
         "replicas": {"min": S5000_NODES + 1, "max": S5000_NODES + 2}}]}}})  # fmt: skip

    def pending() -> tuple[str, dict[str, Any]] | None:
        messages = [m for m in map(unschedulable, prefill_pods(api)) if m]
        obj = get_pdd(api)
        (prefill,) = [p for p in obj["status"]["pools"] if p["role"] == "prefill"]
        available = condition(obj, "CapacityAvailable")
        if messages and prefill["unschedulableReplicas"] == 1 and available["status"] == "False":
            return messages[0], obj
        return None

    message, obj = step("a replica that does not fit: Pending, and said", pending, timeout=180)
    assert "Insufficient mthreads.com/gpu" in message, message
    running = [p for p in prefill_pods(api) if p.spec.node_name]
    assert len(running) == S5000_NODES
    assert {p.spec.node_name for p in running} == s5000
    deployment = apps.read_namespaced_deployment(f"{NAME}-prefill-s5000", namespace)
    assert deployment.spec.replicas == S5000_NODES + 1

    print("\nkind e2e:")
    print(f"  load: {summary.completed} completed of {summary.offered}, failed {summary.failed}")
    print(f"  decision on the breach: {decision}")
    print(f"  the Pending replica: {message}")
    print(f"  CapacityAvailable: {condition(obj, 'CapacityAvailable')}")
    for what, seconds in timings:
        print(f"  {what:<56} {seconds:6.1f} s")
