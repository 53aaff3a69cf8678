"""The virtual kubelet: runs the pods bound to virtual nodes without running anything.

A bound pod goes ContainerCreating -> Running (engine loading weights, not Ready) -> Ready after
the model-load time of its cards (`core.perfmodel.model_load_seconds`), all scaled by
`time_scale`. Deleted pods are removed after a short shutdown. For a failed node it plays the
node-lifecycle and taint-eviction controllers, in scaled time: its pods turn NotReady at once and
are evicted when their toleration of `node.kubernetes.io/unreachable` runs out.
"""

import concurrent.futures
import heapq
import ipaddress
import itertools
import logging
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from kubernetes.client.exceptions import ApiException

from pd_operator.core.hardware import MODEL_PROFILES, ModelProfile
from pd_operator.core.perfmodel import model_load_seconds
from pd_operator.core.scheduling import Taint, Toleration, pod_requests
from pd_tools.simcluster.nodes import (
    STRATEGIC_PATCH,
    TAINT_UNREACHABLE,
    TERMINAL_PHASES,
    KubeCalls,
    NodeFleet,
    now_rfc3339,
)
from pd_tools.simcluster.pod_processes import PodProcesses

log = logging.getLogger(__name__)

# Beside the nodes' 198.19.0.0/18 in RFC 2544's benchmarking range (see simcluster/nodes.py).
POD_ADDRESSES = ipaddress.IPv4Network("198.19.128.0/17")
# Sandbox and a cached image: the engine image is assumed to be on the node already.
CONTAINER_CREATING_SECONDS = 5.0
# From a deletion to the pod object being gone, for a pod without a real preStop hook to run.
SHUTDOWN_SECONDS = 2.0
# What the DefaultTolerationSeconds admission plugin gives pods that set no toleration themselves.
DEFAULT_UNREACHABLE_TOLERATION_SECONDS = 300
ACTION_ATTEMPTS = 3
# A serving pod's readiness probe and liveness watch, in wall seconds (never scaled: the
# process runs in real time).
PROBE_SECONDS = 0.25
WATCH_SECONDS = 1.0
MAX_RESTART_BACKOFF_SECONDS = 10.0
# What the controllers do to pods of a node whose kubelet is gone; everything else is the kubelet's.
CONTROLLER_ACTIONS = frozenset({"mark_not_ready", "evict"})
# Actions that only change the pod's status (written by the status manager, not by the action):
# run on the timer thread, so that a stage is never late behind the writes of other pods.
STATUS_ACTIONS = frozenset({"create", "start", "ready", "mark_not_ready"})


@dataclass
class PodRun:
    """One pod on a virtual node, as this kubelet runs it."""

    uid: str
    namespace: str
    name: str
    node: str
    pod: Mapping[str, Any]
    epoch: int = 0  # bumped on every change of plan; timers of an older epoch are dropped
    stage: str = "new"  # new, creating, loading, ready, failed, deleting, lost
    restarts: int = 0
    ip: str = ""
    start_time: str = ""
    started_at: str = ""  # when the container last started (containerStatuses' startedAt)
    # The status manager's state: what is yet to be written, merged; whether a write is out;
    # whether what is yet to be written turns the pod Ready.
    unsent: dict[str, Any] | None = None
    writing: bool = False
    unsent_ready: bool = False


@dataclass(order=True)
class _Timer:
    due: float
    seq: int
    uid: str = field(compare=False)
    epoch: int = field(compare=False)
    action: str = field(compare=False)
    attempt: int = field(compare=False, default=1)


def eviction_delay_seconds(pod: Mapping[str, Any]) -> float | None:
    """Seconds a pod stays on an unreachable node before the taint-eviction controller deletes
    it: the shortest matching toleration, None when one tolerates it forever, 0 when none does."""
    taint = Taint(TAINT_UNREACHABLE, "", "NoExecute")
    matching = [
        t
        for t in (pod.get("spec") or {}).get("tolerations") or []
        if Toleration(
            t.get("key") or "",
            t.get("operator") or "Equal",
            t.get("value") or "",
            t.get("effect") or "",
        ).tolerates(taint)
    ]
    if not matching:
        return 0.0
    seconds = [t["tolerationSeconds"] for t in matching if t.get("tolerationSeconds") is not None]
    return float(max(min(seconds), 0)) if seconds else None


def _merged(older: Mapping[str, Any] | None, newer: Mapping[str, Any]) -> dict[str, Any]:
    """Two status patches as one: the newer's fields win, conditions merged by type (as the
    strategic merge patch of the two in turn would)."""
    merged = {**(older or {}), **newer}
    if older and "conditions" in older and "conditions" in newer:
        by_type = {c["type"]: c for c in older["conditions"]}
        by_type.update((c["type"], c) for c in newer["conditions"])
        merged["conditions"] = list(by_type.values())
    return merged


def _containers(pod: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    return list((pod.get("spec") or {}).get("containers") or [])


def _has_pre_stop(pod: Mapping[str, Any]) -> bool:
    return any((c.get("lifecycle") or {}).get("preStop") for c in _containers(pod))


class VirtualKubelet:
    """Drives the status of pods bound to the fleet's nodes; `on_pod` feeds it bound pods."""

    def __init__(
        self,
        calls: KubeCalls,
        fleet: NodeFleet,
        *,
        model: ModelProfile,
        time_scale: float = 1.0,
        workers: int = 8,
        processes: PodProcesses | None = None,
    ) -> None:
        self.calls = calls
        self.fleet = fleet
        self.model = model
        self.time_scale = time_scale
        # Serving pods (engines, routers) run real processes; the rest are simulated.
        self.processes = processes
        self.runs: dict[str, PodRun] = {}
        self.ready_times: list[float] = []  # time.monotonic() of each Ready, for benchmarks
        self._addresses = itertools.count()
        self._seq = itertools.count()
        self._timers: list[_Timer] = []
        self._lock = threading.Condition()
        self._stopping = False
        self._thread: threading.Thread | None = None
        self._pool = concurrent.futures.ThreadPoolExecutor(workers, thread_name_prefix="pd-kubelet")

    def start(self) -> None:
        """Start the timer thread."""
        self._thread = threading.Thread(target=self._run_timers, name="pd-kubelet", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Drop every pending timer and wait for the writes in flight."""
        with self._lock:
            self._stopping = True
            self._timers.clear()
            self._lock.notify_all()
        if self._thread:
            self._thread.join(timeout=10)
        self._pool.shutdown(wait=True, cancel_futures=True)
        if self.processes is not None:
            self.processes.stop_all()

    # -- timers ------------------------------------------------------------------------------

    def _after(self, seconds: float, run: PodRun, action: str, attempt: int = 1) -> None:
        """Run `action` for `run` after `seconds` of simulated time. Caller holds the lock."""
        due = time.monotonic() + seconds * self.time_scale
        heapq.heappush(
            self._timers, _Timer(due, next(self._seq), run.uid, run.epoch, action, attempt)
        )
        self._lock.notify_all()

    def _run_timers(self) -> None:
        with self._lock:
            while not self._stopping:
                now = time.monotonic()
                while self._timers and self._timers[0].due <= now:
                    timer = heapq.heappop(self._timers)
                    if self._status_only(timer):
                        self._fire(timer)
                    else:
                        self._pool.submit(self._fire, timer)
                wait = self._timers[0].due - now if self._timers else None
                self._lock.wait(wait)

    def _status_only(self, timer: _Timer) -> bool:
        """Whether the action only sets status: not a serving pod's (which starts a process)."""
        if timer.action == "flush":
            return False
        run = self.runs.get(timer.uid)
        return timer.action in STATUS_ACTIONS and run is not None and not self._serves(run)

    def _fire(self, timer: _Timer) -> None:
        with self._lock:
            run = self.runs.get(timer.uid)
            if run is None or self._stopping:
                return
            flush = timer.action == "flush"  # the latest status, whatever happened since
            # Only the node controller's eviction acts on a node whose kubelet is gone.
            stale = run.epoch != timer.epoch or (
                (timer.action in CONTROLLER_ACTIONS) == self.fleet.is_running(run.node)
            )
            if stale and not flush:
                return
        if flush:
            self._do_flush(run, timer.attempt)
            return
        try:
            getattr(self, f"_do_{timer.action}")(run)
        except ApiException as error:
            if error.status == 404:
                return  # the pod is gone; its DELETED event forgets it
            self._retry(timer, run, error)
        except Exception as error:  # a write that failed for any other reason is retried
            self._retry(timer, run, error)

    def _retry(self, timer: _Timer, run: PodRun, error: Exception) -> None:
        log.warning("%s of pod %s/%s failed: %s", timer.action, run.namespace, run.name, error)
        with self._lock:
            if timer.attempt < ACTION_ATTEMPTS and run.epoch == timer.epoch:
                self._after(1.0 / self.time_scale, run, timer.action, timer.attempt + 1)

    # -- pod events --------------------------------------------------------------------------

    def on_pod(self, event: str, pod: Mapping[str, Any]) -> None:
        """A bound pod on one of the fleet's nodes was added, modified or deleted."""
        meta = pod["metadata"]
        uid = meta["uid"]
        with self._lock:
            if event == "DELETED":
                self.runs.pop(uid, None)
                if self.processes is not None and not self._stopping:
                    self._pool.submit(self.processes.stop, uid)
                return
            run = self.runs.get(uid)
            if run is None:
                if (pod.get("status") or {}).get("phase") in TERMINAL_PHASES:
                    return
                run = PodRun(uid, meta["namespace"], meta["name"], pod["spec"]["nodeName"], pod)
                self.runs[uid] = run
                self._after(0.0, run, "create")
            run.pod = pod
            if meta.get("deletionTimestamp") and run.stage not in ("deleting", "lost"):
                run.stage = "deleting"
                run.epoch += 1
                grace = float((pod.get("spec") or {}).get("terminationGracePeriodSeconds", 30))
                if self._serves(run) and _has_pre_stop(pod):
                    # A real engine drains in its preStop hook: it runs in real time.
                    threading.Thread(
                        target=self._drain_then_delete, args=(run, run.epoch, grace), daemon=True
                    ).start()
                else:
                    self._after(min(grace, SHUTDOWN_SECONDS), run, "delete")

    # -- actions (on the worker pool; those that only set status on the timer thread) --------

    def _patch_status(self, run: PodRun, status: dict[str, Any], *, ready: bool = False) -> None:
        """Write a pod's status as the kubelet's status manager does: one write per pod at a
        time, the latest status merged into it, so a stage passed through while the apiserver
        was slow to take the previous write is never written. A serving pod's is written now."""
        if self._serves(run):
            self._write_status(run, status)
            if ready:
                with self._lock:
                    self.ready_times.append(time.monotonic())
            return
        with self._lock:
            run.unsent = _merged(run.unsent, status)
            run.unsent_ready = ready or (run.unsent_ready and "conditions" not in status)
            if not run.writing:
                run.writing = True
                self._pool.submit(self._flush, run, 1)

    def _write_status(self, run: PodRun, status: dict[str, Any]) -> None:
        self.calls.request(
            "pod-status",
            "PATCH",
            f"/api/v1/namespaces/{run.namespace}/pods/{run.name}/status",
            {"status": status},
            content_type=STRATEGIC_PATCH,
        )

    def _flush(self, run: PodRun, attempt: int) -> None:
        """Write what is unsent until nothing is; a failed write is tried again later."""
        while True:
            with self._lock:
                status, ready = run.unsent, run.unsent_ready
                run.unsent, run.unsent_ready = None, False
                if status is None or self._stopping:
                    run.writing = False
                    return
            try:
                self._write_status(run, status)
            except Exception as error:
                if isinstance(error, ApiException) and error.status == 404:
                    with self._lock:  # the pod is gone; its DELETED event forgets it
                        run.writing = False
                    return
                log.warning("status of pod %s/%s failed: %s", run.namespace, run.name, error)
                with self._lock:
                    if attempt >= ACTION_ATTEMPTS:  # given up; a newer status is still written
                        attempt = 1
                        continue
                    run.writing = False
                    run.unsent = _merged(status, run.unsent or {})
                    run.unsent_ready = ready or run.unsent_ready
                    self._after(1.0 / self.time_scale, run, "flush", attempt + 1)
                return
            attempt = 1
            if ready:
                with self._lock:
                    self.ready_times.append(time.monotonic())

    def _do_flush(self, run: PodRun, attempt: int) -> None:
        with self._lock:
            if run.writing or run.unsent is None:
                return
            run.writing = True
        self._flush(run, attempt)

    def _conditions(self, run: PodRun, *, sandbox: bool, ready: bool) -> list[dict[str, Any]]:
        stamp = now_rfc3339()
        names = " ".join(c["name"] for c in _containers(run.pod))
        not_ready = {
            "status": "False",
            "reason": "ContainersNotReady",
            "message": f"containers with unready status: [{names}]",
        }
        readiness = {"status": "True"} if ready else not_ready
        return [
            {
                "type": "PodReadyToStartContainers",
                "status": str(sandbox),
                "lastTransitionTime": stamp,
            },
            {"type": "Initialized", "status": "True", "lastTransitionTime": stamp},
            {"type": "Ready", **readiness, "lastTransitionTime": stamp},
            {"type": "ContainersReady", **readiness, "lastTransitionTime": stamp},
        ]

    def _container_statuses(
        self, run: PodRun, state: dict[str, Any], *, ready: bool, crashed: bool = False
    ) -> list[dict[str, Any]]:
        statuses = []
        for container in _containers(run.pod):
            status: dict[str, Any] = {
                "name": container["name"],
                "image": container.get("image", ""),
                "imageID": f"virtual://{container.get('image', '')}",
                "ready": ready,
                "started": ready,
                "restartCount": run.restarts,
                # Exactly one state: null out the others, whatever the patch strategy is.
                "state": {"waiting": None, "running": None, "terminated": None, **state},
            }
            if "waiting" not in state:
                status["containerID"] = f"virtual://{run.uid}/{container['name']}/{run.restarts}"
            if crashed:
                status["lastState"] = {
                    "terminated": {"exitCode": 1, "reason": "Error", "finishedAt": now_rfc3339()}
                }
            statuses.append(status)
        return statuses

    def _do_create(self, run: PodRun) -> None:
        address = self.fleet.address(run.node)
        run.start_time = run.start_time or now_rfc3339()
        self._patch_status(
            run,
            {
                "phase": "Pending",
                "hostIP": address,
                "hostIPs": [{"ip": address}],
                "startTime": run.start_time,
                "conditions": self._conditions(run, sandbox=False, ready=False),
                "containerStatuses": self._container_statuses(
                    run, {"waiting": {"reason": "ContainerCreating"}}, ready=False
                ),
            },
        )
        with self._lock:
            run.stage = "creating"
            self._after(CONTAINER_CREATING_SECONDS, run, "start")

    def _serves(self, run: PodRun) -> bool:
        return self.processes is not None and self.processes.handles(run.pod)

    def _do_start(self, run: PodRun, crashed: bool = False) -> None:
        serves = self._serves(run)
        if not run.ip:
            if serves:
                assert self.processes is not None
                run.ip = self.processes.address()
            else:
                offset = next(self._addresses) % (POD_ADDRESSES.num_addresses - 2)
                run.ip = str(POD_ADDRESSES.network_address + 1 + offset)
        run.started_at = now_rfc3339()
        self._patch_status(
            run,
            {
                "phase": "Running",
                "podIP": run.ip,
                "podIPs": [{"ip": run.ip}],
                "conditions": self._conditions(run, sandbox=True, ready=False),
                "containerStatuses": self._container_statuses(
                    run, {"running": {"startedAt": run.started_at}}, ready=False, crashed=crashed
                ),
            },
        )
        if serves:
            assert self.processes is not None
            self.processes.start(run.pod, run.ip, self._engine_env(run), restart=run.restarts)
            with self._lock:
                run.stage = "loading"
                self._after(PROBE_SECONDS / self.time_scale, run, "probe")
            return
        with self._lock:
            run.stage = "loading"
            self._after(self.load_seconds(run), run, "ready")

    def _engine_env(self, run: PodRun) -> dict[str, str]:
        """What the engine simulator needs to know that a real engine knows from its cards."""
        requests = pod_requests(run.pod.get("spec") or {})
        cards = [
            card
            for name, card in self.fleet.accelerators(run.node).items()
            if requests.get(name, 0) >= 1000
        ]
        if not cards:
            return {}
        model = next((key for key, value in MODEL_PROFILES.items() if value is self.model), "")
        return {
            "PD_SIM_HARDWARE": cards[0].name,
            "PD_SIM_MODEL": model,
            "PD_SIM_LOAD_SECONDS": f"{self.load_seconds(run) * self.time_scale:.3f}",
        }

    def _do_probe(self, run: PodRun) -> None:
        """Until the readiness probe passes: Ready then, or a restart if the process died."""
        assert self.processes is not None
        if not self.processes.alive(run.uid):
            self._process_exited(run)
        elif self.processes.ready(run.uid):
            self._do_ready(run)
            self.processes.publish(run.pod)
            with self._lock:
                self._after(WATCH_SECONDS / self.time_scale, run, "watch")
        else:
            with self._lock:
                self._after(PROBE_SECONDS / self.time_scale, run, "probe")

    def _do_watch(self, run: PodRun) -> None:
        """A Ready serving pod whose process exits restarts, as its container would."""
        assert self.processes is not None
        if not self.processes.alive(run.uid):
            self._process_exited(run)
            return
        with self._lock:
            self._after(WATCH_SECONDS / self.time_scale, run, "watch")

    def _process_exited(self, run: PodRun) -> None:
        """Not Ready at once; restarted after a back-off that doubles, as CrashLoopBackOff."""
        log.warning("pod %s/%s: its process exited; restarting", run.namespace, run.name)
        self._do_mark_not_ready(run)
        with self._lock:
            run.epoch += 1
            run.restarts += 1
            backoff = min(MAX_RESTART_BACKOFF_SECONDS, 0.5 * 2**run.restarts)
            self._after(backoff / self.time_scale, run, "restart")

    def _do_ready(self, run: PodRun) -> None:
        state = (run.pod.get("status") or {}).get("containerStatuses") or [{}]
        started = (state[0].get("state") or {}).get("running") or {"startedAt": now_rfc3339()}
        if run.started_at:
            started = {"startedAt": run.started_at}
        self._patch_status(
            run,
            {
                "conditions": self._conditions(run, sandbox=True, ready=True),
                "containerStatuses": self._container_statuses(
                    run, {"running": started}, ready=True, crashed=run.restarts > 0
                ),
            },
            ready=True,
        )
        with self._lock:
            run.stage = "ready"

    def _drain_then_delete(self, run: PodRun, epoch: int, grace: float) -> None:
        assert self.processes is not None
        self.processes.pre_stop(run.pod, grace)
        with self._lock:
            if not self._stopping and run.epoch == epoch:
                self._after(0.0, run, "delete")

    def _do_delete(self, run: PodRun) -> None:
        if self.processes is not None:
            self.processes.stop(run.uid)
        self.calls.request(
            "pod-delete",
            "DELETE",
            f"/api/v1/namespaces/{run.namespace}/pods/{run.name}",
            {"gracePeriodSeconds": 0, "preconditions": {"uid": run.uid}},
        )

    def _do_evict(self, run: PodRun) -> None:
        # As the taint-eviction controller: an ordinary delete. With no kubelet to finish it the
        # pod stays Terminating (its ReplicaSet replaces it at once) until the node comes back.
        self.calls.request(
            "pod-evict",
            "DELETE",
            f"/api/v1/namespaces/{run.namespace}/pods/{run.name}",
            {"preconditions": {"uid": run.uid}},
        )

    def _do_mark_not_ready(self, run: PodRun) -> None:
        # As the node-lifecycle controller's MarkPodsNotReady: only the Ready condition changes.
        self._patch_status(
            run,
            {
                "conditions": [
                    {"type": "Ready", "status": "False", "lastTransitionTime": now_rfc3339()}
                ]
            },
        )

    def load_seconds(self, run: PodRun) -> float:
        """Simulated seconds from engine start to Ready: the slowest card kind's model load."""
        requests = pod_requests(run.pod.get("spec") or {})
        return max(
            (
                model_load_seconds(card, self.model, requests[name] // 1000)
                for name, card in self.fleet.accelerators(run.node).items()
                if requests.get(name, 0) >= 1000
            ),
            default=0.0,
        )

    # -- faults ------------------------------------------------------------------------------

    def crash(self, namespace: str, name: str) -> None:
        """The engine of a running pod exits with an error: restarted (and reloading) unless
        its restartPolicy is Never, in which case the pod fails."""
        with self._lock:
            run = next(
                (r for r in self.runs.values() if (r.namespace, r.name) == (namespace, name)), None
            )
            if run is None or run.stage not in ("loading", "ready"):
                raise LookupError(f"pod {namespace}/{name} has no running engine to crash")
            run.epoch += 1
            never = (run.pod.get("spec") or {}).get("restartPolicy") == "Never"
            if not never:
                run.restarts += 1
        if never:
            terminated = {
                "terminated": {"exitCode": 1, "reason": "Error", "finishedAt": now_rfc3339()}
            }
            self._patch_status(
                run,
                {
                    "phase": "Failed",
                    "conditions": self._conditions(run, sandbox=False, ready=False),
                    "containerStatuses": self._container_statuses(run, terminated, ready=False),
                },
            )
            run.stage = "failed"
        else:
            self._do_start(run, crashed=True)

    def node_lost(self, node: str) -> None:
        """The node's kubelet is gone: its pods turn NotReady now and are evicted later."""
        with self._lock:
            lost = [run for run in self.runs.values() if run.node == node]
            for run in lost:
                run.epoch += 1
                run.stage = "lost"
                self._after(0.0, run, "mark_not_ready")
                delay = eviction_delay_seconds(run.pod)
                if delay is not None and not run.pod["metadata"].get("deletionTimestamp"):
                    self._after(delay, run, "evict")

    def node_back(self, node: str) -> None:
        """The node's kubelet is back (after a reboot): it finishes deletions and restarts
        every other container, which loads its model again."""
        with self._lock:
            for run in [r for r in self.runs.values() if r.node == node]:
                run.epoch += 1
                if run.pod["metadata"].get("deletionTimestamp"):
                    run.stage = "deleting"
                    self._after(0.0, run, "delete")
                elif run.stage == "new":  # bound while the node was down: never started
                    self._after(0.0, run, "create")
                else:
                    run.restarts += 1
                    self._after(0.0, run, "restart")

    def _do_restart(self, run: PodRun) -> None:
        self._do_start(run, crashed=True)
