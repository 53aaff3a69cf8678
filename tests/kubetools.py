"""Helpers for tests against the real apiserver: polling, custom objects, a running operator."""

import asyncio
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

from kubernetes import client, config

from pd_operator.adapters import metrics
from pd_operator.handlers.operator import OperatorConfig, OperatorState, run_operator

GROUP, VERSION, PLURAL = "pdoperator.io", "v1alpha1", "pddeployments"
T = TypeVar("T")


def wait_for(
    check: Callable[[], T], timeout: float = 30, interval: float = 0.2, what: str = "condition"
) -> T:
    """Poll until `check` returns something truthy; fail naming what never happened."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        last = check()
        if last:
            return last
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what} (last: {last!r})")


def custom(api_client: client.ApiClient) -> client.CustomObjectsApi:
    return client.CustomObjectsApi(api_client)


def create_pdd(
    api_client: client.ApiClient, namespace: str, body: dict[str, Any]
) -> dict[str, Any]:
    return custom(api_client).create_namespaced_custom_object(  # type: ignore[no-any-return]
        GROUP, VERSION, namespace, PLURAL, body, field_validation="Strict"
    )


def get_pdd(api_client: client.ApiClient, namespace: str, name: str) -> dict[str, Any]:
    return custom(api_client).get_namespaced_custom_object(  # type: ignore[no-any-return]
        GROUP, VERSION, namespace, PLURAL, name
    )


def patch_pdd(api_client: client.ApiClient, namespace: str, name: str, patch: Any) -> None:
    custom(api_client).patch_namespaced_custom_object(
        GROUP, VERSION, namespace, PLURAL, name, patch
    )


def condition(obj: dict[str, Any], kind: str) -> dict[str, Any]:
    for item in (obj.get("status") or {}).get("conditions") or []:
        if item["type"] == kind:
            return item  # type: ignore[no-any-return]
    return {}


def events(api_client: client.ApiClient, namespace: str, reason: str) -> list[Any]:
    items = client.CoreV1Api(api_client).list_namespaced_event(namespace).items
    return [e for e in items if e.reason == reason]


class RunningOperator:
    """The operator in a background thread of the test process, talking to the real apiserver."""

    def __init__(self, kubeconfig: str, **settings: Any) -> None:
        self.api_client = config.new_client_from_config(config_file=kubeconfig)
        self.state = OperatorState(self.api_client, OperatorConfig(**settings))
        self._stop = threading.Event()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._main, name="pd-operator", daemon=True)

    def _main(self) -> None:
        asyncio.run(run_operator(self.state, stop_flag=self._stop, ready_flag=self._ready))

    def start(self) -> "RunningOperator":
        self._thread.start()
        if not self._ready.wait(30):
            raise AssertionError("operator did not become ready within 30s")
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=30)
        assert not self._thread.is_alive(), "operator did not stop within 30s"

    def settled(self) -> bool:
        return self.state.queue.idle()


def writes() -> float:
    return metrics.total_writes()


def writes_by_kind() -> dict[tuple[str, str], float]:
    """(verb, kind) -> writes so far: what a failed zero-writes assertion shows."""
    return {
        (sample.labels["verb"], sample.labels["kind"]): sample.value
        for metric in metrics.API_WRITES.collect()
        for sample in metric.samples
        if sample.name.endswith("_total")
    }


def new_writes(before: dict[tuple[str, str], float]) -> dict[tuple[str, str], float]:
    """The writes made since `before` (from writes_by_kind), by verb and kind."""
    return {k: v - before.get(k, 0) for k, v in writes_by_kind().items() if v != before.get(k, 0)}
