"""The mock scheduler `pd-mock-scheduler`: binds pending pods to virtual nodes.

Fed by watches (simcluster/virtual.py): pending pods that name this scheduler, bound pods (what runs
where), and the fleet's nodes. Decisions come from `core.scheduling.schedule`; this module keeps
the books (what is bound, what is assumed bound while the Binding call is in flight) and writes:
Bindings, the PodScheduled=False condition and FailedScheduling events (once per new message).
Unschedulable pods are retried when capacity frees or nodes change, and every
BACKUP_RETRY_SECONDS regardless, as kube-scheduler flushes its unschedulable queue.
The pods of a LeaderWorkerSet group wait, unmarked, until all of them exist; then all are bound
or all are marked Unschedulable.
"""

import concurrent.futures
import logging
import threading
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kubernetes.client.exceptions import ApiException

from pd_operator.core.scheduling import (
    Identity,
    NodeFacts,
    PodDemand,
    PodGroup,
    node_facts,
    pod_demand,
    pod_group,
    pod_requests,
    schedule,
)
from pd_tools.simcluster.nodes import STRATEGIC_PATCH, TERMINAL_PHASES, KubeCalls, now_rfc3339

log = logging.getLogger(__name__)

SCHEDULER_NAME = "pd-mock-scheduler"
BACKUP_RETRY_SECONDS = 10.0
# A bound pod that the bound-pods watch has not shown after this long is forgotten: its capacity
# would otherwise stay booked forever if the pod vanished while the watch was relisting.
ASSUMED_POD_TTL_SECONDS = 60.0
# `Scheduled` events go out on threads of their own, as kube-scheduler's event broadcaster sends
# them apart from the bindings: with thousands of pods pending, a binding waits for no event.
EVENT_WORKERS = 2


@dataclass
class PendingPod:
    """A pod waiting for a node."""

    uid: str
    namespace: str
    name: str
    pod: Mapping[str, Any]
    demand: PodDemand
    order: tuple[int, str, str, str]  # higher priority first, then older, then by name
    message: str = ""  # the Unschedulable message last written to the pod
    group: PodGroup | None = None  # the LeaderWorkerSet group it is bound with
    in_flight: bool = False  # a Binding or a status write is out
    passed_over: bool = False  # a pass ran while it was in flight


@dataclass
class _Placement:
    node: str
    requests: dict[str, int]
    confirmed: bool = False  # seen bound on the watch (else only assumed)
    expires: float = float("inf")  # when an unconfirmed placement is given up
    group: str = ""  # its LeaderWorkerSet group's key
    pod: Identity = ("", {})  # its namespace and labels, for podAffinity terms


def _identity(pod: Mapping[str, Any]) -> Identity:
    meta = pod["metadata"]
    return str(meta.get("namespace") or ""), meta.get("labels") or {}


def _version(obj: Mapping[str, Any]) -> int:
    # resourceVersion is opaque by contract, yet an etcd revision in every apiserver there is;
    # an unparseable one orders first, so that it is never mistaken for a newer state.
    try:
        return int(obj["metadata"].get("resourceVersion", -1))
    except ValueError:
        return -1


def _scheduled_message(pod: Mapping[str, Any]) -> str:
    for condition in (pod.get("status") or {}).get("conditions") or []:
        if condition.get("type") == "PodScheduled" and condition.get("reason") == "Unschedulable":
            return str(condition.get("message") or "")
    return ""


class MockScheduler:
    """Binds pods with `spec.schedulerName: pd-mock-scheduler` to the nodes it is shown."""

    def __init__(self, calls: KubeCalls, *, workers: int = 8) -> None:
        self.calls = calls
        self.nodes: dict[str, NodeFacts] = {}
        self._node_versions: dict[str, int] = {}
        self.pending: dict[str, PendingPod] = {}
        self.placed: dict[str, _Placement] = {}  # uid -> node, for bound and assumed pods
        self.usage: dict[str, dict[str, int]] = {}
        self.residents: dict[str, dict[str, Identity]] = {}  # node -> uid -> pod, bound or assumed
        self.group_placed: dict[str, int] = {}  # group key -> its pods bound or assumed
        self.bound_times: list[float] = []  # time.monotonic() of each successful Binding
        self.passes = 0
        self.pass_seconds = 0.0
        self._lock = threading.Condition()
        self._wanted = False
        self._stopping = False
        self._thread: threading.Thread | None = None
        self._pool = concurrent.futures.ThreadPoolExecutor(workers, thread_name_prefix="pd-bind")
        self._events = concurrent.futures.ThreadPoolExecutor(
            EVENT_WORKERS, thread_name_prefix="pd-scheduled-event"
        )

    def start(self) -> None:
        """Start the scheduling loop."""
        self._thread = threading.Thread(target=self._run, name="pd-mock-scheduler", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop the loop and wait for the calls in flight."""
        with self._lock:
            self._stopping = True
            self._lock.notify_all()
        if self._thread:
            self._thread.join(timeout=10)
        self._pool.shutdown(wait=True, cancel_futures=True)
        self._events.shutdown(wait=True, cancel_futures=True)

    def _wake(self) -> None:
        """Ask for a scheduling pass. Caller holds the lock."""
        self._wanted = True
        self._lock.notify_all()

    # -- watch events ------------------------------------------------------------------------

    def on_node(self, event: str, node: Mapping[str, Any]) -> None:
        """A node of the fleet was added, changed or deleted."""
        name = node["metadata"]["name"]
        version = _version(node)
        with self._lock:
            if event == "DELETED":
                self.nodes.pop(name, None)
                self._node_versions.pop(name, None)
                return
            # fail_node() hands over the node it wrote before the watch shows it; an older
            # event arriving after that must not bring back the state before the failure.
            if version < self._node_versions.get(name, -1):
                return
            self._node_versions[name] = version
            facts = node_facts(node)
            if self.nodes.get(name) != facts:  # heartbeats change nothing the filters read
                self.nodes[name] = facts
                self._wake()

    def on_pending(self, event: str, pod: Mapping[str, Any]) -> None:
        """A pod that names this scheduler and has no node was added, changed or deleted."""
        meta, spec = pod["metadata"], pod.get("spec") or {}
        uid = meta["uid"]
        with self._lock:
            if event == "DELETED" or meta.get("deletionTimestamp") or spec.get("schedulingGates"):
                self.pending.pop(uid, None)
                return
            demand = pod_demand(pod)
            known = self.pending.get(uid)
            if known is not None:
                known.pod = pod
                if known.demand != demand:  # e.g. a toleration added
                    known.demand = demand
                    self._wake()
                return
            self.pending[uid] = PendingPod(
                uid=uid,
                namespace=meta["namespace"],
                name=meta["name"],
                pod=pod,
                demand=demand,
                order=(
                    -int(spec.get("priority") or 0),
                    meta.get("creationTimestamp", ""),
                    meta["namespace"],
                    meta["name"],
                ),
                message=_scheduled_message(pod),
                group=pod_group(pod),
            )
            self._wake()

    def on_bound(self, event: str, pod: Mapping[str, Any]) -> None:
        """A pod bound to one of the fleet's nodes was added, changed or deleted."""
        uid = pod["metadata"]["uid"]
        finished = event == "DELETED" or (pod.get("status") or {}).get("phase") in TERMINAL_PHASES
        with self._lock:
            if finished:
                if self._release(uid):
                    self._wake()  # capacity freed: unschedulable pods may fit now
                return
            placement = self.placed.get(uid)
            if placement is None:
                requests = pod_requests(pod["spec"])
                group = pod_group(pod)
                self._book(
                    uid,
                    _Placement(
                        pod["spec"]["nodeName"],
                        requests,
                        confirmed=True,
                        group=group.key if group else "",
                        pod=_identity(pod),
                    ),
                )
            else:
                placement.confirmed = True

    def _book(self, uid: str, placement: _Placement) -> None:
        self.placed[uid] = placement
        if placement.group:
            self.group_placed[placement.group] = self.group_placed.get(placement.group, 0) + 1
        used = self.usage.setdefault(placement.node, {})
        for resource, amount in placement.requests.items():
            used[resource] = used.get(resource, 0) + amount
        self.residents.setdefault(placement.node, {})[uid] = placement.pod

    def _release(self, uid: str) -> bool:
        placement = self.placed.pop(uid, None)
        if placement is None:
            return False
        if placement.group:
            left = self.group_placed.pop(placement.group, 0) - 1
            if left > 0:
                self.group_placed[placement.group] = left
        used = self.usage.get(placement.node, {})
        for resource, amount in placement.requests.items():
            used[resource] = used.get(resource, 0) - amount
        residents = self.residents.get(placement.node, {})
        residents.pop(uid, None)
        if not residents:
            self.residents.pop(placement.node, None)
        return True

    # -- scheduling --------------------------------------------------------------------------

    def _run(self) -> None:
        with self._lock:
            while not self._stopping:
                if not self._wanted:
                    self._lock.wait(BACKUP_RETRY_SECONDS)
                    if self._stopping:
                        break
                self._wanted = False
                self._pass()

    def _pass(self) -> None:
        """One pass over every pending pod. Caller holds the lock."""
        began = time.monotonic()
        for uid in [u for u, p in self.placed.items() if not p.confirmed and p.expires < began]:
            self._release(uid)
        queue = []
        for pod in self.pending.values():
            if pod.in_flight:
                pod.passed_over = True
            else:
                queue.append(pod)
        queue.sort(key=lambda p: p.order)
        decisions = schedule(
            [(p.uid, p.demand) for p in queue],
            list(self.nodes.values()),
            self.usage,
            groups={p.uid: p.group for p in queue if p.group is not None},
            bound=self.group_placed,
            residents={node: pods.values() for node, pods in self.residents.items()},
            identities={p.uid: _identity(p.pod) for p in queue},
        )
        for decision in decisions:
            pending = self.pending[decision.key]
            if decision.node is not None:
                pending.in_flight = True
                group = pending.group.key if pending.group else ""
                placement = _Placement(
                    decision.node,
                    dict(pending.demand.requests),
                    group=group,
                    pod=_identity(pending.pod),
                )
                self._book(pending.uid, placement)
                self._pool.submit(self._bind, pending, decision.node)
            elif decision.message and decision.message != pending.message:
                # One write per pod at a time, as kube-scheduler handles one pod at a time: a
                # Binding sent while this status write waits would be overwritten by it, and
                # the bound pod would read Unschedulable for good.
                pending.message, pending.in_flight = decision.message, True
                self._pool.submit(self._mark_unschedulable, pending, decision.message)
        self.passes += 1
        self.pass_seconds += time.monotonic() - began

    def _bind(self, pending: PendingPod, node: str) -> None:
        body = {
            "apiVersion": "v1",
            "kind": "Binding",
            "metadata": {"name": pending.name, "namespace": pending.namespace, "uid": pending.uid},
            "target": {"apiVersion": "v1", "kind": "Node", "name": node},
        }
        path = f"/api/v1/namespaces/{pending.namespace}/pods/{pending.name}/binding"
        try:
            # Raw call: the python client cannot deserialize the Binding the apiserver answers
            # with (kubernetes-client/python#547).
            self.calls.request("bind", "POST", path, body)
        except Exception as error:
            with self._lock:
                self._release(pending.uid)
                pending.in_flight = False
                # 404: deleted; 409: bound by someone else. Anything else: try again.
                if not (isinstance(error, ApiException) and error.status in (404, 409)):
                    log.warning("binding %s/%s failed: %s", pending.namespace, pending.name, error)
                    self._wake()
            return
        with self._lock:
            placement = self.placed.get(pending.uid)
            if placement is not None and not placement.confirmed:
                placement.expires = time.monotonic() + ASSUMED_POD_TTL_SECONDS
            self.bound_times.append(time.monotonic())
        self._events.submit(
            self._event,
            pending,
            "Normal",
            "Scheduled",
            f"Successfully assigned {pending.namespace}/{pending.name} to {node}",
        )

    def _mark_unschedulable(self, pending: PendingPod, message: str) -> None:
        previous: Mapping[str, Any] = next(
            (
                c
                for c in (pending.pod.get("status") or {}).get("conditions") or []
                if c.get("type") == "PodScheduled"
            ),
            {},
        )
        since = previous.get("lastTransitionTime") if previous.get("status") == "False" else None
        condition = {
            "type": "PodScheduled",
            "status": "False",
            "reason": "Unschedulable",
            "message": message,
            "lastProbeTime": None,
            "lastTransitionTime": since or now_rfc3339(),
        }
        written = False
        try:
            self.calls.request(
                "pod-unschedulable",
                "PATCH",
                f"/api/v1/namespaces/{pending.namespace}/pods/{pending.name}/status",
                {"status": {"conditions": [condition]}},
                content_type=STRATEGIC_PATCH,
            )
            written = True
        except Exception as error:
            if not (isinstance(error, ApiException) and error.status == 404):
                log.warning(
                    "marking %s/%s unschedulable failed: %s", pending.namespace, pending.name, error
                )
                with self._lock:
                    pending.message = ""  # write it again on the next pass
        finally:
            with self._lock:
                pending.in_flight = False
                if pending.passed_over:  # a pass left it out meanwhile: decide it now
                    pending.passed_over = False
                    self._wake()
        if written:
            self._event(pending, "Warning", "FailedScheduling", message)

    def _event(self, pending: PendingPod, kind: str, reason: str, message: str) -> None:
        stamp = now_rfc3339()
        event = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {
                "name": f"{pending.name}.{uuid.uuid4().hex[:16]}",
                "namespace": pending.namespace,
            },
            "involvedObject": {
                "apiVersion": "v1",
                "kind": "Pod",
                "name": pending.name,
                "namespace": pending.namespace,
                "uid": pending.uid,
            },
            "type": kind,
            "reason": reason,
            "message": message[:1024],
            "action": "Scheduling" if kind == "Warning" else "Binding",
            "source": {"component": SCHEDULER_NAME},
            "reportingComponent": SCHEDULER_NAME,
            "reportingInstance": SCHEDULER_NAME,
            "firstTimestamp": stamp,
            "lastTimestamp": stamp,
            "count": 1,
        }
        try:
            self.calls.request(
                "event", "POST", f"/api/v1/namespaces/{pending.namespace}/events", event
            )
        except ApiException as error:  # events are best effort, as in client-go's recorder
            log.info("event for %s/%s dropped: %s", pending.namespace, pending.name, error)
