"""Liveness under faults, with fakes at the adapter boundary only (the Prometheus readers and the
Kubernetes API): a hung Prometheus holds back only its own objects, metrics lost for many cycles
cost no status write after the first, and a decision applied by an operator stopped before its
status write is reported after a restart, once."""

import copy
import threading
import time
from typing import Any

import pytest

from pd_operator.adapters.cache import ClusterCache
from pd_operator.adapters.prometheus import ReadReport
from pd_operator.core.children import child_key
from pd_operator.core.signals import Reading, RoleSignals, unavailable
from pd_operator.handlers.autoscaler import Autoscaler
from pd_operator.handlers.reconciler import Reconciler
from pdcases import minimal

INTERVAL = 30  # the default decision interval
UP = {"ttft": Reading.of(0.5), "itl": Reading.of(0.012)}
ROLES = ("prefill", "decode")


class Prometheus:
    """Readers whose answers each test sets per URL: values, unavailable, or a hang."""

    def __init__(self) -> None:
        self.answers: dict[str, dict[str, Reading] | None] = {}
        self.hung = threading.Event()  # set: hung reads return
        self.reads: dict[str, int] = {}

    def reader(self, url: str, *, bearer_token: str | None = None, ca_path: str | None = None):
        prometheus = self

        class Reader:
            def read(self, targets, now):
                prometheus.reads[url] = prometheus.reads.get(url, 0) + 1
                answer = prometheus.answers.get(url, UP)
                if answer is None:
                    prometheus.hung.wait(30)
                    answer = UP
                ttft = answer.get("ttft", unavailable("down"))
                itl = answer.get("itl", unavailable("down"))
                signals = RoleSignals(sample_time=now, ttft_seconds=ttft, itl_seconds=itl)
                keys = [(t.namespace, t.name, role) for t in targets for role in ROLES]
                return dict.fromkeys(keys, signals), ReadReport(queries=1)

        return Reader()


class KilledError(Exception):
    """The operator process ends here."""


class Api:
    """The Kubernetes API as the reconciler writes to it; what is written arrives in the cache
    as the watch would bring it. Status is written as the real writer does: a merge patch."""

    def __init__(self, cache: ClusterCache) -> None:
        self.cache = cache
        self.status_writes = 0
        self.events: list[tuple[str, str]] = []
        self.kill_before_status = False
        self.watch_lag = False  # statuses reach the cache only at `deliver`
        self._statuses: dict[tuple[str, str], dict[str, Any]] = {}

    def apply(self, manifest: dict[str, Any], uid: str | None = None) -> dict[str, Any]:
        stored = copy.deepcopy(manifest)
        stored["metadata"].update(uid=uid or f"uid-{manifest['metadata']['name']}", generation=1)
        if stored["kind"] == "Deployment":  # its pods are Ready at once
            n = stored["spec"]["replicas"]
            stored["status"] = {"observedGeneration": 1, "replicas": n, "updatedReplicas": n,
                                "readyReplicas": n}  # fmt: skip
        self.cache.put_child(stored)
        return stored

    def create(self, manifest: dict[str, Any]) -> dict[str, Any]:
        return self.apply(manifest)

    def patch_status(self, namespace: str, name: str, status: dict[str, Any]) -> dict[str, Any]:
        if self.kill_before_status:
            raise KilledError
        # KubeWriter.patch_status replaces status whole, and answers with the object.
        self._statuses[(namespace, name)] = copy.deepcopy(dict(status))
        self.status_writes += 1
        if not self.watch_lag:
            self.deliver()
        return {**(self.cache.pdd((namespace, name)) or {}), "status": copy.deepcopy(dict(status))}

    def deliver(self) -> None:
        """The watch brings the statuses written so far."""
        for key, status in self._statuses.items():
            self.cache.put_pdd({**(self.cache.pdd(key) or {}), "status": copy.deepcopy(status)})

    def post_event(self, involved: Any, event_type: str, reason: str, message: str) -> None:
        self.events.append((reason, message))

    def scaled(self) -> list[str]:
        return [message for reason, message in self.events if reason.startswith("Scaled")]


def world(*names: str, schedule: bool = False) -> ClusterCache:
    """PDDeployments reading Prometheus at http://<name>, and nodes with room for them."""
    cache = ClusterCache()
    for name in names:
        body = copy.deepcopy(minimal())
        body["metadata"].update(name=name, namespace="llm", uid=f"u-{name}", generation=1)
        body["spec"]["prefill"]["pools"][0]["replicas"] = {"min": 1, "max": 4}
        body["spec"]["scaling"] = {"prometheus": {"url": f"http://{name}"}}
        if schedule:  # a floor of two prefill replicas all day: a scale-up without metrics
            floor = {"name": "all-day", "start": "00:00", "end": "00:00", "prefill": {"p": 2}}
            body["spec"]["scaling"]["schedules"] = [floor]
        cache.put_pdd(body)
    for resource in ("mthreads.com/gpu", "nvidia.com/gpu"):
        cache.put_node({
            "metadata": {"name": resource.split(".")[0], "labels": {}}, "spec": {},
            "status": {"allocatable": {resource: "8"},
                       "conditions": [{"type": "Ready", "status": "True"}]},
        })  # fmt: skip
    return cache


class Operator:
    """The autoscaler and the reconciler of one operator process, run a cycle at a time."""

    def __init__(self, cache: ClusterCache, api: Api, prometheus: Prometheus, clock: list[float]):
        self.queued: list[tuple[str, str]] = []
        self.autoscaler = Autoscaler(
            cache, self.queued.extend, readers=prometheus.reader, clock=lambda: clock[0],
            read_deadline_seconds=0.5,
        )  # fmt: skip
        self.reconciler = Reconciler(
            cache, api, decisions=self.autoscaler.decisions_for,
            scaling=self.autoscaler.view_for, clock=lambda: "2026-12-01T00:00:00Z",
        )  # fmt: skip
        self.cache = cache

    def reconcile(self) -> None:
        for key in self.cache.pdd_keys():  # what was queued, and the resync of the others
            self.reconciler.reconcile(key)
        self.queued.clear()

    def cycle(self) -> None:
        self.autoscaler.cycle()
        self.reconcile()


def test_a_hung_prometheus_holds_back_only_its_own_objects():
    prometheus, clock = Prometheus(), [1_000_000.0]
    cache = world("near", "far")
    operator = Operator(cache, Api(cache), prometheus, clock)
    prometheus.answers["http://far"] = None
    try:
        began = time.monotonic()
        operator.cycle()
        assert time.monotonic() - began < 2  # the deadline (0.5 s), not the hang
        near = operator.cache.pdd(("llm", "near"))["status"]
        far = operator.cache.pdd(("llm", "far"))["status"]
        assert near["observed"]["ttftMilliseconds"] == 500
        available = next(c for c in far["conditions"] if c["type"] == "MetricsAvailable")
        assert available["status"] == "False"
        assert "Prometheus at http://far did not answer within 0.5 s" in available["message"]
        assert far["lastDecision"]["limitedBy"] == "metrics"
        for _ in range(5):
            clock[0] += INTERVAL
            operator.cycle()
        # The hung read is not started again while it runs: one thread, not one per cycle.
        assert prometheus.reads == {"http://near": 6, "http://far": 1}
        readers = [t for t in threading.enumerate() if t.name.startswith("prometheus-read")]
        assert len(readers) <= 2
    finally:
        prometheus.hung.set()
    # Once it answers again, the next cycle reads it.
    time.sleep(0.1)
    clock[0] += INTERVAL
    operator.cycle()
    assert prometheus.reads["http://far"] == 2


def test_metrics_lost_for_many_cycles_cost_one_status_write():
    prometheus, clock = Prometheus(), [1_000_000.0]
    cache = world("m")
    api = Api(cache)
    operator = Operator(cache, api, prometheus, clock)
    for _ in range(3):
        operator.cycle()
        clock[0] += INTERVAL
    assert cache.pdd(("llm", "m"))["status"]["observed"]["ttftMilliseconds"] == 500
    prometheus.answers["http://m"] = {}  # every reading unavailable from now on
    operator.cycle()
    written = api.status_writes
    for _ in range(9):  # 4.5 minutes: under the 5-minute refresh
        clock[0] += INTERVAL
        operator.cycle()
    assert api.status_writes == written
    # Unknown is absent, not the last value seen.
    assert "ttftMilliseconds" not in cache.pdd(("llm", "m"))["status"]["observed"]


def test_a_scale_up_applied_before_a_kill_is_reported_after_the_restart_once():
    prometheus, clock = Prometheus(), [1_000_000.0]
    cache = world("m", schedule=True)
    prometheus.answers["http://m"] = {}  # no metrics: the schedule alone grows prefill
    api = Api(cache)
    first = Operator(cache, api, prometheus, clock)
    first.autoscaler.cycle()
    decided = first.autoscaler.view_for(("llm", "m")).last_decision
    api.kill_before_status = True
    with pytest.raises(KilledError):
        first.reconciler.reconcile(("llm", "m"))
    deployment = cache.snapshot(("llm", "m")).children
    prefill = next(d for k, d in deployment.items() if child_key(d)[2] == "m-prefill-p")
    assert prefill["spec"]["replicas"] == 2  # applied, but status and event lost
    assert "lastDecision" not in (cache.pdd(("llm", "m")).get("status") or {})
    assert api.events == []

    api.kill_before_status = False
    second = Operator(cache, api, prometheus, clock)
    second.reconcile()  # the restarted operator's first pass, before any decision
    for _ in range(4):
        clock[0] += INTERVAL
        second.cycle()
    assert api.scaled() == ["prefill pool p: 1 -> 2: " + decided["reason"]]
    assert cache.pdd(("llm", "m"))["status"]["lastDecision"] == decided


def test_a_scale_up_in_one_process_is_reported_once():
    prometheus, clock = Prometheus(), [1_000_000.0]
    cache = world("m", schedule=True)
    prometheus.answers["http://m"] = {}
    api = Api(cache)
    operator = Operator(cache, api, prometheus, clock)
    api.watch_lag = True  # the next decision comes before the watch brings the status
    for _ in range(5):
        operator.autoscaler.cycle()
        api.deliver()
        operator.reconcile()
        clock[0] += INTERVAL
    assert len(api.scaled()) == 1 and api.scaled()[0].startswith("prefill pool p: 1 -> 2: ")
    status = cache.pdd(("llm", "m"))["status"]
    assert status["lastDecision"]["prefillReplicas"] == 2
