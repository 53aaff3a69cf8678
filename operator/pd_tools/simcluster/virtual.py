"""A virtual cluster on a real apiserver: nodes, the mock scheduler and the virtual kubelet.

```python
with VirtualCluster(api_client, load_profile("config/clusters/tiny.yaml"), time_scale=0.01) as vc:
    ...  # create Deployments with schedulerName: pd-mock-scheduler; their pods run here
    vc.fail_node(vc.node_names[0])
```

Three list+watch streams feed everything: the cluster's nodes (by label), pending pods that name
the scheduler (field selector), and bound pods (field selector; those on other nodes are
ignored). No per-pod GETs.
"""

import contextlib
import logging
import re
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from types import TracebackType
from typing import Any

from kubernetes import client

from pd_operator.core.hardware import GLM_45_FP8, ModelProfile
from pd_tools.simcluster.kubelet import VirtualKubelet
from pd_tools.simcluster.nodes import (
    LABEL_VIRTUAL_CLUSTER,
    LEASE_WORKERS,
    TAINT_NOT_READY,
    KubeCalls,
    NodeFleet,
)
from pd_tools.simcluster.pod_processes import TOKEN_SECONDS, PodProcesses
from pd_tools.simcluster.profile import ClusterProfile, load_profile
from pd_tools.simcluster.scheduler import SCHEDULER_NAME, MockScheduler

log = logging.getLogger(__name__)

SYNC_TIMEOUT_SECONDS = 30.0
# API writer threads of the scheduler and of the kubelet each. A cluster has a kubelet per node
# and kube-scheduler binds each pod on a goroutine of its own: with 8, a thousand pending pods
# waited on the threads (bound 79/s, 92/s with 16, on the benchmark's loaded two cores).
WRITER_THREADS = 16
ADMISSION_TIMEOUT_SECONDS = 120.0
# The apiserver ends each watch after this long; the informer then resumes where it was.
WATCH_SECONDS = 300
MAX_BACKOFF_SECONDS = 5.0
LABEL_VALUE = re.compile(r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")

Handler = Callable[[str, Mapping[str, Any]], None]


class _GoneError(Exception):
    """The watch's resourceVersion is too old (410): list again."""


class Informer:
    """List, then watch from the list's resourceVersion; relist when the watch is gone.

    `handler(event, obj)` gets ADDED, MODIFIED and DELETED; on a relist, objects that vanished
    meanwhile come as DELETED. It runs on the informer's thread.
    """

    def __init__(
        self, calls: KubeCalls, name: str, path: str, query: Mapping[str, str], handler: Handler
    ) -> None:
        self.calls = calls
        self.name = name
        self.path = path
        self.query = dict(query)
        self.handler = handler
        self.known: dict[str, Mapping[str, Any]] = {}
        self.synced = threading.Event()
        self._stopping = threading.Event()
        self._response: Any = None
        self._thread = threading.Thread(target=self._run, name=f"pd-watch-{name}", daemon=True)

    def start(self) -> None:
        """Start listing and watching."""
        self._thread.start()

    def stop(self) -> None:
        """Stop, breaking off the watch in flight."""
        self._stopping.set()
        response = self._response
        if response is not None:
            # The watch may have closed its socket meanwhile (the server ended it, or the thread
            # is between two watches); shutting a closed socket down raises, and must not stop
            # the rest of the teardown (the nodes would be left behind for the next test).
            with contextlib.suppress(OSError):
                response.shutdown()
        if self._thread.ident is not None:  # started
            self._thread.join(timeout=10)

    def _emit(self, event: str, obj: Mapping[str, Any]) -> None:
        try:
            self.handler(event, obj)
        except Exception:  # one bad object must not stop the stream
            log.exception("%s handler failed on %s", self.name, obj["metadata"].get("name"))

    def _run(self) -> None:
        backoff = 0.2
        while not self._stopping.is_set():
            try:
                self._watch(self._list())
                backoff = 0.2
            except _GoneError:
                continue
            except Exception as error:
                if self._stopping.is_set():
                    break
                log.warning(
                    "%s watch failed, listing again in %.1fs: %s", self.name, backoff, error
                )
                self._stopping.wait(backoff)
                backoff = min(backoff * 2, MAX_BACKOFF_SECONDS)

    def _list(self) -> str:
        listing = self.calls.request(f"list-{self.name}", "GET", self.path, query=self.query)
        seen = set()
        for item in listing.get("items") or []:
            uid = item["metadata"]["uid"]
            seen.add(uid)
            event = "MODIFIED" if uid in self.known else "ADDED"
            self.known[uid] = item
            self._emit(event, item)
        for uid in [uid for uid in self.known if uid not in seen]:
            self._emit("DELETED", self.known.pop(uid))
        self.synced.set()
        return str(listing["metadata"]["resourceVersion"])

    def _watch(self, version: str) -> None:
        while not self._stopping.is_set():
            query = {
                **self.query,
                "resourceVersion": version,
                "allowWatchBookmarks": "true",
                "timeoutSeconds": str(WATCH_SECONDS),
            }
            for event in self.calls.watch(self.path, query, self._opened):
                kind, obj = event["type"], event["object"]
                if kind == "ERROR":
                    if obj.get("code") == 410:
                        raise _GoneError()
                    raise RuntimeError(f"watch error: {obj.get('message')}")
                version = obj["metadata"]["resourceVersion"]
                if kind == "BOOKMARK":
                    continue
                uid = obj["metadata"]["uid"]
                if kind == "DELETED":
                    self.known.pop(uid, None)
                else:
                    self.known[uid] = obj
                self._emit(kind, obj)

    def _opened(self, response: Any) -> None:
        self._response = response
        if self._stopping.is_set():
            response.shutdown()


class VirtualCluster:
    """Nodes of a cluster profile, the `pd-mock-scheduler` and a virtual kubelet, on a real
    apiserver. `time_scale` multiplies simulated durations (0.01: a 90 s model load takes 0.9 s);
    leases and heartbeats always run in real time, as the node controller reads them.

    `on_pod(event, pod)` sees every watch event of a pod bound to the cluster's nodes, on the
    watch thread, after the kubelet: the seam that runs an engine behind each Ready pod."""

    def __init__(
        self,
        api_client: client.ApiClient,
        profile: ClusterProfile | str | Path,
        *,
        time_scale: float = 1.0,
        name_prefix: str = "",
        namespace: str | None = None,
        model: ModelProfile = GLM_45_FP8,
        keep_nodes: bool = False,
        workers: int = WRITER_THREADS,
        on_pod: Handler | None = None,
        serve_dir: Path | None = None,
        sd_file: Path | None = None,
    ) -> None:
        self.profile = profile if isinstance(profile, ClusterProfile) else load_profile(profile)
        self.name = f"{name_prefix}{self.profile.name}"
        if len(self.name) > 63 or not LABEL_VALUE.match(self.name):
            raise ValueError(f"{self.name!r} is not a valid label value: shorten name_prefix")
        if time_scale <= 0:
            raise ValueError("time_scale must be positive")
        self.namespace = namespace
        self.keep_nodes = keep_nodes
        self.on_pod = on_pod
        # Connections for the scheduler's and the kubelet's writers, leases, status, watches.
        self.calls = KubeCalls(api_client, pool_size=2 * workers + LEASE_WORKERS + 8)
        self.fleet = NodeFleet(self.calls, self.profile, cluster=self.name, prefix=name_prefix)
        self.scheduler = MockScheduler(self.calls, workers=workers)
        # With a folder for their files, serving pods (engines, routers) run real processes.
        self.processes = (
            PodProcesses(
                serve_dir,
                server=api_client.configuration.host,
                ca_file=api_client.configuration.ssl_ca_cert,
                request_token=self._service_account_token,
                sd_file=sd_file,
            )
            if serve_dir is not None
            else None
        )
        self.kubelet = VirtualKubelet(
            self.calls,
            self.fleet,
            model=model,
            time_scale=time_scale,
            workers=workers,
            processes=self.processes,
        )
        pods = f"/api/v1/namespaces/{namespace}/pods" if namespace else "/api/v1/pods"
        self.informers = [
            Informer(
                self.calls,
                "nodes",
                "/api/v1/nodes",
                {"labelSelector": f"{LABEL_VIRTUAL_CLUSTER}={self.name}"},
                self._on_node,
            ),
            Informer(
                self.calls,
                "pending-pods",
                pods,
                {"fieldSelector": f"spec.schedulerName={SCHEDULER_NAME},spec.nodeName="},
                self.scheduler.on_pending,
            ),
            Informer(
                self.calls, "bound-pods", pods, {"fieldSelector": "spec.nodeName!="}, self._on_bound
            ),
        ]
        self.registration_seconds = 0.0
        self._started = False

    def __enter__(self) -> "VirtualCluster":
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    @property
    def node_names(self) -> list[str]:
        """Names of the cluster's nodes, in registration order."""
        return list(self.fleet.nodes)

    def _service_account_token(self, namespace: str, account: str) -> str:
        """A bound token of a ServiceAccount (TokenRequest), as a kubelet mounts for its pods."""
        answer = self.calls.request(
            "token",
            "POST",
            f"/api/v1/namespaces/{namespace}/serviceaccounts/{account}/token",
            {
                "apiVersion": "authentication.k8s.io/v1",
                "kind": "TokenRequest",
                "spec": {"expirationSeconds": TOKEN_SECONDS},
            },
        )
        return str(answer["status"]["token"])

    def start(self) -> None:
        """Register the nodes, start every loop, and return once every node takes pods."""
        self._started = True
        try:
            began = time.monotonic()
            self.fleet.register()
            self.fleet.start()
            self.scheduler.start()
            self.kubelet.start()
            for informer in self.informers:
                informer.start()
            deadline = time.monotonic() + SYNC_TIMEOUT_SECONDS
            for informer in self.informers:
                if not informer.synced.wait(max(deadline - time.monotonic(), 0)):
                    raise TimeoutError(f"the {informer.name} watch did not list in time")
            self._wait_until_schedulable(time.monotonic() + ADMISSION_TIMEOUT_SECONDS)
            self.registration_seconds = time.monotonic() - began
        except BaseException:
            self.stop()
            raise

    def _wait_until_schedulable(self, deadline: float) -> None:
        # The apiserver's TaintNodesByCondition admission taints every new node not-ready; the
        # node-lifecycle controller lifts the taint once it has seen the node Ready. Until then
        # no pod fits, with the real kube-scheduler as with this one.
        while time.monotonic() < deadline:
            known = dict(self.scheduler.nodes)
            if all(
                name in known and all(t.key != TAINT_NOT_READY for t in known[name].taints)
                for name in self.fleet.nodes
            ):
                return
            time.sleep(0.1)
        raise TimeoutError("the node-lifecycle controller did not accept the nodes in time")

    def stop(self) -> None:
        """Stop every loop and, unless `keep_nodes`, delete the nodes. Safe to call twice."""
        if not self._started:
            return
        self._started = False
        for informer in self.informers:
            informer.stop()
        self.scheduler.stop()
        self.kubelet.stop()
        self.fleet.stop()
        try:
            if not self.keep_nodes:
                self.fleet.delete_all()
        finally:
            self.calls.close()

    def _on_node(self, event: str, node: Mapping[str, Any]) -> None:
        if event != "DELETED":
            self.fleet.observe(node)
        self.scheduler.on_node(event, node)

    def _on_bound(self, event: str, pod: Mapping[str, Any]) -> None:
        if pod["spec"].get("nodeName") in self.fleet.nodes:
            self.scheduler.on_bound(event, pod)
            self.kubelet.on_pod(event, pod)
            if self.on_pod is not None:
                self.on_pod(event, pod)

    def add_nodes(self, group: str, count: int = 1) -> list[str]:
        """Register `count` more nodes of a group and return their names at once; pending pods
        are retried on them when the node-lifecycle controller lifts their not-ready taint."""
        created = self.fleet.register({group: count})
        for node in created:  # at once, not when the watch gets round to it
            self.scheduler.on_node("ADDED", node)
        return [node["metadata"]["name"] for node in created]

    def fail_node(self, name: str) -> None:
        """Take a node down: NotReady and tainted unreachable now (nothing new lands there),
        its pods NotReady now, evicted once their unreachable toleration (300 s by default)
        has passed in scaled time, and replaced by their ReplicaSets."""
        self.scheduler.on_node("MODIFIED", self.fleet.fail(name))
        self.kubelet.node_lost(name)

    def recover_node(self, name: str) -> None:
        """Bring a failed node back, as after a reboot: Ready, untainted, its pods restarted and
        its evicted (Terminating) pods removed."""
        self.scheduler.on_node("MODIFIED", self.fleet.recover(name))
        self.kubelet.node_back(name)

    def crash_pod(self, namespace: str, name: str) -> None:
        """Crash a running pod's engine: it restarts and reloads (or fails with restartPolicy
        Never)."""
        self.kubelet.crash(namespace, name)
