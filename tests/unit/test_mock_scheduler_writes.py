"""The mock scheduler's writes to one pod never cross: its Kubernetes calls faked at the boundary.

A pod found unschedulable gets a status write (PodScheduled=False); if a node that fits arrives
while that write is still out, the Binding must wait for it. Sent first, it would be overwritten:
the pod runs on its node and reads Unschedulable for good (CI saw exactly that).
"""

import threading
import time
from typing import Any

from pd_tools.simcluster.nodes import build_node
from pd_tools.simcluster.profile import load_profile
from pd_tools.simcluster.scheduler import MockScheduler
from pdcases import ROOT
from polling import wait_until
from workloads import S5000, deployment

TINY = load_profile(ROOT / "config" / "clusters" / "tiny.yaml")


class SlowStatusWrites:
    """Kubernetes calls that answer at once, except status writes, which wait for `release`."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.calls: list[tuple[str, str]] = []  # (what, path) in the order they completed
        self._lock = threading.Lock()

    def request(self, what: str, method: str, path: str, body: Any = None, **_: Any) -> dict:
        if what == "pod-unschedulable":
            assert self.release.wait(10), "the test never released the status write"
        with self._lock:
            self.calls.append((what, path))
        return {}

    def completed(self, what: str) -> list[str]:
        with self._lock:
            return [path for kind, path in self.calls if kind == what]


def pending_pod() -> dict[str, Any]:
    template = deployment("prefill", 1, S5000)["spec"]["template"]
    return {
        "metadata": {
            "uid": "u-1",
            "name": "prefill-0",
            "namespace": "ns",
            "creationTimestamp": "2026-11-30T00:00:00Z",
            **template["metadata"],
        },
        "spec": template["spec"],
        "status": {},
    }


def test_a_binding_waits_for_the_status_write_already_out_for_its_pod() -> None:
    calls = SlowStatusWrites()
    scheduler = MockScheduler(calls)  # type: ignore[arg-type]
    scheduler.start()
    try:
        scheduler.on_pending("ADDED", pending_pod())  # no node yet: unschedulable
        assert wait_until(lambda: scheduler.pending["u-1"].message)
        node = build_node(TINY.group("s5000"), "s5000-0", "192.0.2.1", "test")
        node["metadata"]["resourceVersion"] = "1"
        scheduler.on_node("ADDED", node)  # now it fits, while the status write is still out
        time.sleep(0.3)
        assert calls.completed("bind") == []
        calls.release.set()
        assert wait_until(lambda: calls.completed("bind"))
        order = [what for what, _ in calls.calls if what in ("pod-unschedulable", "bind")]
        assert order == ["pod-unschedulable", "bind"]
        assert calls.completed("bind") == ["/api/v1/namespaces/ns/pods/prefill-0/binding"]
    finally:
        calls.release.set()
        scheduler.stop()
