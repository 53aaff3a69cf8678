"""The demo's PDDeployment and the operator thread, and what the cleanup needs of the cluster."""

import asyncio
import contextlib
import copy
import shutil
import threading
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client
from prometheus_client import start_http_server

from pd_operator.adapters.kube import load_api_client
from pd_operator.handlers.operator import OperatorConfig, OperatorState, run_operator
from pd_tools.demo.settings import (
    GROUP,
    INTERVAL_SECONDS,
    ITL_TARGET_MS,
    NAME,
    NAMESPACE,
    PLURAL,
    SAMPLE,
    TTFT_TARGET_MS,
    VERSION,
    WINDOW_SECONDS,
)
from pd_tools.simcluster.scheduler import SCHEDULER_NAME


def pdd_body(prometheus_url: str) -> dict[str, Any]:
    """The heterogeneous sample on the mock scheduler, Active, with short intervals, the router
    on the CPU node."""
    body: dict[str, Any] = copy.deepcopy(yaml.safe_load(SAMPLE.read_text()))
    spec = body["spec"]
    spec["slo"] = {
        "ttft": {"percentile": "P50", "targetMilliseconds": TTFT_TARGET_MS},
        "itl": {"percentile": "P50", "targetMilliseconds": ITL_TARGET_MS},
        "windowSeconds": WINDOW_SECONDS,
    }
    for role in ("prefill", "decode"):
        for pool in spec[role]["pools"]:
            pool["template"] = {**pool.get("template", {}), "schedulerName": SCHEDULER_NAME}
    # The engine simulator has no prefix cache, so cache-aware routing would only keep a
    # repeated prefix on the replica that saw it first; the less loaded of two spreads a surge.
    spec["router"] = {"prefillPolicy": "PowerOfTwo", "template": {"schedulerName": SCHEDULER_NAME}}
    spec["scaling"] = {
        **spec["scaling"],
        "mode": "Active",
        "intervalSeconds": INTERVAL_SECONDS,
        "scaleUp": {"stabilizationSeconds": 0, "maxStepReplicas": 2},
        "scaleDown": {"stabilizationSeconds": 30, "maxStepReplicas": 1},
        "prometheus": {"url": prometheus_url},
    }
    return body


class OperatorThread:
    """The operator on its own event loop in a thread of this process, its /metrics on a free
    port of 127.0.0.1."""

    def __init__(self, kubeconfig: Path) -> None:
        self._server, _ = start_http_server(0, addr="127.0.0.1")
        self.metrics_port = int(self._server.server_port)
        settings = OperatorConfig(
            namespaces=[NAMESPACE], workers=2, resync_seconds=5, metrics_port=self.metrics_port
        )
        self.state = OperatorState(load_api_client(str(kubeconfig)), settings)
        self._stop, self._ready = threading.Event(), threading.Event()
        self._thread = threading.Thread(target=self._main, name="pd-operator", daemon=True)

    def _main(self) -> None:
        asyncio.run(run_operator(self.state, stop_flag=self._stop, ready_flag=self._ready))

    def start(self) -> None:
        self._thread.start()
        if not self._ready.wait(60):
            raise RuntimeError("the operator did not become ready within 60 s")

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=30)
        self._server.shutdown()
        self._server.server_close()


def get_pdd(api: client.ApiClient) -> dict[str, Any]:
    """The demo's PDDeployment as the apiserver has it."""
    obj: Any = client.CustomObjectsApi(api).get_namespaced_custom_object(
        GROUP, VERSION, NAMESPACE, PLURAL, NAME
    )
    return dict(obj)


def delete_pods(api: client.ApiClient) -> None:
    """The pods go while their kubelet still runs (then the kubelet's stop takes the nodes);
    their Deployments and ReplicaSets go first, orphaning them, so that nothing replaces them."""
    apps, core = client.AppsV1Api(api), client.CoreV1Api(api)
    with contextlib.suppress(client.ApiException):
        apps.delete_collection_namespaced_deployment(NAMESPACE, propagation_policy="Orphan")
        apps.delete_collection_namespaced_replica_set(NAMESPACE, propagation_policy="Orphan")
    with contextlib.suppress(client.ApiException):
        core.delete_collection_namespaced_pod(NAMESPACE, grace_period_seconds=0)


def scaling_events(api: client.ApiClient, counts: dict[str, int]) -> dict[str, int]:
    try:
        events = client.CoreV1Api(api).list_namespaced_event(NAMESPACE).items
    except client.ApiException:
        return counts  # the summary says 0; the cleanup matters more
    return {reason: sum(e.count or 1 for e in events if e.reason == reason) for reason in counts}


def keep_pod_logs(serve_dir: Path, target: Path) -> None:
    """The engines' and the router's logs into the output folder; the rest of the pods' files
    (their ServiceAccount tokens among them) go."""
    try:
        for log_file in sorted(serve_dir.glob("*/container-*.log")):
            destination = target / log_file.parent.name / log_file.name
            destination.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(log_file, destination)
    finally:
        shutil.rmtree(serve_dir, ignore_errors=True)
