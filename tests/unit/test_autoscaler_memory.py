"""The autoscaler's memory survives an operator restart through status.policyMemory: a restarted
operator decides as the one before it would have; a spec is parsed and resolved once per
generation, not per cycle; and its log says each decision that changes something in one INFO
line. Fakes stand in for the Prometheus reader only."""

import copy
import json
import logging

import pytest

from pd_operator.adapters.cache import ClusterCache
from pd_operator.adapters.prometheus import ReadReport
from pd_operator.api.spec import PDDeploymentSpec
from pd_operator.core import policy
from pd_operator.core.resolved import ResolvedSpec, resolve
from pd_operator.core.signals import NO_TRAFFIC, RoleSignals
from pd_operator.handlers import autoscaler as autoscaler_module
from pd_operator.handlers.autoscaler import Autoscaler
from pdcases import minimal, pool_deployment

LOGGER = "pd_operator.handlers.autoscaler"
KEY = ("llm", "minimal")
INTERVAL, WINDOW = 30, 300  # decision interval, scale-down stabilization (the defaults)


class IdleReader:
    """A Prometheus that sees no traffic at all."""

    def __init__(self, url, *, bearer_token=None, ca_path=None):
        self.url = url

    def read(self, targets, now):
        idle = RoleSignals(sample_time=now, ttft_seconds=NO_TRAFFIC, itl_seconds=NO_TRAFFIC)
        signals = {(t.namespace, t.name, r): idle for t in targets for r in ("prefill", "decode")}
        return signals, ReadReport(queries=1)


def cluster(status: dict | None = None) -> ClusterCache:
    """Three Ready replicas of each pool, min 1; `status` is what the object's status says."""
    body = copy.deepcopy(minimal())
    body["metadata"].update(namespace="llm", uid="u1", generation=1)
    for role in ("prefill", "decode"):
        body["spec"][role]["pools"][0]["replicas"] = {"min": 1, "max": 4}
    body["spec"]["scaling"] = {"prometheus": {"url": "http://prometheus:9090"}}
    if status:
        body["status"] = status
    cache = ClusterCache()
    cache.put_pdd(body)
    cache.put_child(pool_deployment("prefill", "p", 3))
    cache.put_child(pool_deployment("decode", "d", 3))
    return cache


def autoscaler(cache: ClusterCache, clock: list[float]) -> Autoscaler:
    return Autoscaler(cache, lambda keys: None, readers=IdleReader, clock=lambda: clock[0])


@pytest.mark.parametrize("written", ["first", "last"])
def test_a_restart_does_not_restart_the_scale_down_window(written: str):
    clock = [1000.0]
    before = autoscaler(cluster(), clock)
    memories = []
    while clock[0] < 1000 + WINDOW - INTERVAL:  # idle, but not for a whole window yet
        before.cycle()
        assert before.decisions_for(KEY) == {("prefill", "p"): 3, ("decode", "d"): 3}
        view = before.view_for(KEY)
        assert view is not None and view.policy_memory
        memories.append(json.loads(view.policy_memory))  # what the reconciler writes
        clock[0] += INTERVAL
    # Status holds the memory of the last status write: with nothing else changing, that may
    # be as old as the first decision.
    memory = memories[0] if written == "first" else memories[-1]

    clock[0] = 1000 + WINDOW + 1  # the window has passed, across the restart
    restarted = autoscaler(cluster({"policyMemory": json.dumps(memory)}), clock)
    restarted.cycle()
    assert restarted.decisions_for(KEY) == {("prefill", "p"): 2, ("decode", "d"): 2}

    # Without the memory, a restarted operator could not know the window held only lower
    # recommendations, and would wait a whole window more.
    forgetful = autoscaler(cluster(), clock)
    forgetful.cycle()
    assert forgetful.decisions_for(KEY) == {("prefill", "p"): 3, ("decode", "d"): 3}


def test_unreadable_memory_is_ignored_not_fatal():
    clock = [1000.0]
    scaler = autoscaler(cluster({"policyMemory": "{not json"}), clock)
    assert scaler.cycle() == 1
    assert scaler.decisions_for(KEY) == {("prefill", "p"): 3, ("decode", "d"): 3}


def test_a_spec_is_resolved_once_per_generation_not_per_cycle(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    resolved: list[PDDeploymentSpec] = []
    on_the_spot: list[PDDeploymentSpec] = []

    def counted(into: list[PDDeploymentSpec]):
        def resolving(spec: PDDeploymentSpec) -> ResolvedSpec:
            into.append(spec)
            return resolve(spec)

        return resolving

    monkeypatch.setattr(autoscaler_module, "resolve", counted(resolved))
    monkeypatch.setattr(policy, "resolve", counted(on_the_spot))  # decide's own fallback
    clock = [1000.0]
    cache = cluster()
    scaler = autoscaler(cache, clock)
    for _ in range(4):
        assert scaler.cycle() == 1
        clock[0] += INTERVAL
    assert len(resolved) == 1 and on_the_spot == []

    body = copy.deepcopy(dict(cache.pdd(KEY) or {}))
    body["metadata"]["generation"] = 2
    body["spec"]["slo"]["ttft"]["targetMilliseconds"] = 700
    cache.put_pdd(body)
    assert scaler.cycle() == 1
    assert len(resolved) == 2 and on_the_spot == []
    assert resolved[-1].slo.ttft.target_milliseconds == 700


def test_a_scale_down_is_one_info_line_naming_the_object_and_the_change(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger=LOGGER)
    clock = [1000.0]
    scaler = autoscaler(cluster(), clock)
    while clock[0] <= 1000 + WINDOW:  # idle: holds for a whole window, then steps down
        scaler.cycle()
        clock[0] += INTERVAL
    assert scaler.decisions_for(KEY) == {("prefill", "p"): 2, ("decode", "d"): 2}
    scaler.cycle()  # the same decision again, not yet applied: nothing new to say
    assert scaler.decisions_for(KEY) == {("prefill", "p"): 2, ("decode", "d"): 2}
    lines = [r.getMessage() for r in caplog.records if r.name == LOGGER]
    assert len(lines) == 1, lines
    assert all(r.levelno == logging.INFO for r in caplog.records if r.name == LOGGER)
    line = lines[0]
    assert line.startswith("scaling llm/minimal: ")
    assert "prefill/p 3 -> 2" in line and "decode/d 3 -> 2" in line
