"""The virtual kubelet writes a pod's status as a kubelet's status manager does: one write per pod
at a time, the latest status in it. Its Kubernetes calls and node fleet are faked at the boundary.

A pod whose first status write is held back by a slow apiserver goes on through its stages; once
the write returns, one more write carries where the pod is now (Running and Ready), not each
stage it passed through on the way.
"""

import threading
from typing import Any

from pd_operator.core.hardware import GLM_45_FP8, MTT_S5000, HardwareProfile
from pd_tools.simcluster.kubelet import VirtualKubelet
from polling import wait_until
from workloads import S5000, deployment


class HeldStatusWrites:
    """Kubernetes calls that answer at once, except the first status write, which waits for
    `release`."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.statuses: list[dict[str, Any]] = []  # status writes, in the order they completed
        self._lock = threading.Lock()

    def request(self, what: str, method: str, path: str, body: Any = None, **_: Any) -> dict:
        if what == "pod-status":
            with self._lock:
                first = not self.statuses
            if first:
                assert self.release.wait(10), "the test never released the status write"
            with self._lock:
                self.statuses.append(body["status"])
        return {}


class OneNode:
    """A fleet of one live S5000 node."""

    def address(self, name: str) -> str:
        return "198.19.0.1"

    def accelerators(self, name: str) -> dict[str, HardwareProfile]:
        return {S5000[0]: MTT_S5000}

    def is_running(self, name: str) -> bool:
        return True


def bound_pod() -> dict[str, Any]:
    template = deployment("prefill", 1, S5000, cards=1)["spec"]["template"]
    return {
        "metadata": {"uid": "u-1", "name": "prefill-0", "namespace": "ns", **template["metadata"]},
        "spec": {**template["spec"], "nodeName": "node-0"},
        "status": {"phase": "Pending"},
    }


def test_stages_passed_while_a_write_is_out_are_written_as_one_latest_status() -> None:
    calls = HeldStatusWrites()
    kubelet = VirtualKubelet(calls, OneNode(), model=GLM_45_FP8, time_scale=1e-4)  # type: ignore[arg-type]
    kubelet.start()
    try:
        kubelet.on_pod("ADDED", bound_pod())
        # ContainerCreating is out; the pod starts and loads its model meanwhile.
        assert wait_until(lambda: kubelet.runs["u-1"].stage == "ready")
        assert calls.statuses == [] and kubelet.ready_times == []
        calls.release.set()
        assert wait_until(lambda: len(kubelet.ready_times) == 1)
    finally:
        kubelet.stop()

    creating, now = calls.statuses
    assert creating["phase"] == "Pending"
    waiting = creating["containerStatuses"][0]["state"]["waiting"]
    assert waiting == {"reason": "ContainerCreating"}
    assert now["phase"] == "Running" and now["podIP"]
    assert {c["type"]: c["status"] for c in now["conditions"]} == {
        "PodReadyToStartContainers": "True",
        "Initialized": "True",
        "Ready": "True",
        "ContainersReady": "True",
    }
    assert now["containerStatuses"][0]["ready"] is True
