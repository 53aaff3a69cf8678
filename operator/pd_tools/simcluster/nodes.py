"""Virtual nodes: Node objects built from a cluster profile, kept alive with leases and heartbeats.

Also home of `KubeCalls`, the raw JSON calls that every part of the simulator makes: at
thousands of pods, building and validating client models for each call costs more than the call.
"""

import concurrent.futures
import copy
import datetime
import ipaddress
import json
import logging
import math
import threading
import time
import zlib
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from pd_operator.core.hardware import HardwareProfile
from pd_tools.simcluster.profile import ClusterProfile, NodeGroup

log = logging.getLogger(__name__)

LABEL_NODE_GROUP = "pdoperator.io/node-group"
LABEL_VIRTUAL_CLUSTER = "pdoperator.io/virtual-cluster"
LEASE_NAMESPACE = "kube-node-lease"
# Like the kubelet's: a 40 s lease renewed every 10 s; the node controller waits 50 s
# (node-monitor-grace-period) for a renewal before it marks the node Unknown.
LEASE_DURATION_SECONDS = 40
LEASE_RENEW_SECONDS = 10.0
# The kubelet's nodeStatusReportFrequency: with a lease it posts unchanged status (the Ready
# heartbeat) every 5 minutes. More often would take apiserver time from the leases.
STATUS_REPORT_SECONDS = 300.0
# Renewals have threads of their own: with all 1,000 nodes of large.yaml they need ~100 calls a
# second, and behind pod writes on a loaded apiserver they would come too late. (In a real
# cluster API Priority and Fairness keeps kubelets' leases apart from workload writes.)
LEASE_WORKERS = 16
# The upper half of RFC 2544's benchmarking range 198.18.0.0/15, which nothing routes or dials;
# the local control plane gives the lower half to Services. Nodes here, pods in 198.19.128.0/17.
NODE_ADDRESSES = ipaddress.IPv4Network("198.19.0.0/18")
TAINT_UNREACHABLE = "node.kubernetes.io/unreachable"
# Pods in these phases hold no resources and have nothing left to run.
TERMINAL_PHASES = frozenset({"Succeeded", "Failed"})
TAINT_NOT_READY = "node.kubernetes.io/not-ready"
KUBELET_VERSION = "v1.36.3-pd-virtual"
JSON = "application/json"
MERGE_PATCH = "application/merge-patch+json"
STRATEGIC_PATCH = "application/strategic-merge-patch+json"
JSON_PATCH = "application/json-patch+json"


def now_rfc3339() -> str:
    """The current time as metav1.Time (second precision)."""
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def now_micro() -> str:
    """The current time as metav1.MicroTime, the format of lease renewTime."""
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


@dataclass
class CallStat:
    """Calls of one kind: how many, how many failed, and the seconds they took together."""

    calls: int = 0
    errors: int = 0
    seconds: float = 0.0


class KubeCalls:
    """JSON in, dict out, through a private ApiClient with a connection pool sized for threads."""

    def __init__(self, api_client: client.ApiClient, pool_size: int = 32) -> None:
        configuration = copy.deepcopy(api_client.configuration)
        configuration.connection_pool_maxsize = pool_size
        self._client = client.ApiClient(configuration)
        self._lock = threading.Lock()
        self.stats: dict[str, CallStat] = {}

    def close(self) -> None:
        """Release the connection pool."""
        self._client.close()  # type: ignore[no-untyped-call]

    def _record(self, what: str, began: float, failed: bool) -> None:
        with self._lock:
            stat = self.stats.setdefault(what, CallStat())
            stat.calls += 1
            stat.errors += failed
            stat.seconds += time.monotonic() - began

    def _send(
        self,
        method: str,
        path: str,
        body: Any,
        *,
        content_type: str,
        query: Mapping[str, str] | None,
        timeout: float | tuple[float, float],
    ) -> Any:
        method, url, headers, payload, _ = self._client.param_serialize(
            method=method,
            resource_path=path,
            query_params=list((query or {}).items()),
            header_params={"Content-Type": content_type, "Accept": JSON},
            body=body,
            auth_settings=["BearerToken"],
        )
        return self._client.call_api(
            method, url, header_params=headers, body=payload, _request_timeout=timeout
        )

    def request(
        self,
        what: str,
        method: str,
        path: str,
        body: Any = None,
        *,
        content_type: str = JSON,
        query: Mapping[str, str] | None = None,
        timeout: float = 30.0,
    ) -> dict[str, Any]:
        """One call; ApiException on a non-2xx answer. `what` names it in `stats`."""
        began = time.monotonic()
        failed = True
        try:
            response = self._send(
                method, path, body, content_type=content_type, query=query, timeout=timeout
            )
            data: bytes = response.read()
            if not 200 <= response.status < 300:
                raise ApiException.from_response(http_resp=response, body=data.decode(), data=None)
            failed = False
            result: dict[str, Any] = json.loads(data) if data else {}
            return result
        finally:
            self._record(what, began, failed)

    def watch(
        self, path: str, query: Mapping[str, str], on_open: Callable[[Any], None]
    ) -> Iterator[dict[str, Any]]:
        """Watch events (decoded JSON) until the server ends the watch or it is shut down.

        `on_open` receives the urllib3 response so that another thread can `shutdown()` it.
        """
        response = self._send(
            "GET",
            path,
            None,
            content_type=JSON,
            query={**query, "watch": "true"},
            timeout=(10.0, 600.0),
        )
        raw = response.response
        if not 200 <= response.status < 300:
            data = raw.read()
            raise ApiException.from_response(http_resp=response, body=data.decode(), data=None)
        on_open(raw)
        buffer = b""
        try:
            for chunk in raw.stream(65536, decode_content=False):
                buffer += chunk
                *lines, buffer = buffer.split(b"\n")
                for line in lines:
                    if line.strip():
                        yield json.loads(line)
        finally:
            raw.release_conn()


@dataclass
class VirtualNode:
    """One node of the fleet and where it stands."""

    name: str
    group: NodeGroup
    address: str
    uid: str = ""
    failed: bool = False
    renewed_at: float = 0.0
    next_renew: float = 0.0
    next_status: float = 0.0


def node_conditions(ready: bool) -> list[dict[str, str]]:
    """The kubelet's four conditions, healthy; or all Unknown as the node controller sets them."""
    stamp = now_rfc3339()
    if not ready:
        return [
            {
                "type": kind,
                "status": "Unknown",
                "reason": "NodeStatusUnknown",
                "message": "Kubelet stopped posting node status.",
                "lastHeartbeatTime": stamp,
                "lastTransitionTime": stamp,
            }
            for kind in ("Ready", "MemoryPressure", "DiskPressure", "PIDPressure")
        ]
    healthy = [
        ("Ready", "True", "KubeletReady", "kubelet is posting ready status"),
        ("MemoryPressure", "False", "KubeletHasSufficientMemory",
         "kubelet has sufficient memory available"),
        ("DiskPressure", "False", "KubeletHasNoDiskPressure", "kubelet has no disk pressure"),
        ("PIDPressure", "False", "KubeletHasSufficientPID", "kubelet has sufficient PID available"),
    ]  # fmt: skip
    return [
        {
            "type": kind,
            "status": status,
            "reason": reason,
            "message": message,
            "lastHeartbeatTime": stamp,
            "lastTransitionTime": stamp,
        }
        for kind, status, reason, message in healthy
    ]


def build_node(group: NodeGroup, name: str, address: str, cluster: str) -> dict[str, Any]:
    """A whole Node object, status included (the apiserver accepts status on node create)."""
    labels = {
        "kubernetes.io/hostname": name,
        "kubernetes.io/os": "linux",
        "kubernetes.io/arch": "amd64",
        "node.kubernetes.io/instance-type": group.instance,
        LABEL_NODE_GROUP: group.name,
        LABEL_VIRTUAL_CLUSTER: cluster,
        **group.labels,
    }
    capacity = group.capacity()
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": labels},
        "spec": {
            "providerID": f"pd-virtual://{cluster}/{name}",
            "taints": [t.model_dump(exclude_defaults=True) for t in group.taints],
        },
        "status": {
            "capacity": capacity,
            "allocatable": dict(capacity),
            "conditions": node_conditions(ready=True),
            "addresses": [
                {"type": "InternalIP", "address": address},
                {"type": "Hostname", "address": name},
            ],
            "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}},
            "nodeInfo": {
                "machineID": name,
                "systemUUID": name,
                "bootID": name,
                "kernelVersion": "6.8.0-virtual",
                "osImage": "pd-operator virtual node",
                "containerRuntimeVersion": "virtual://1.0",
                "kubeletVersion": KUBELET_VERSION,
                "kubeProxyVersion": "",
                "operatingSystem": "linux",
                "architecture": "amd64",
            },
        },
    }


def build_lease(name: str, node_uid: str) -> dict[str, Any]:
    """The node's lease, owned by the node so that deleting the node collects it."""
    return {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {
            "name": name,
            "namespace": LEASE_NAMESPACE,
            "ownerReferences": [
                {"apiVersion": "v1", "kind": "Node", "name": name, "uid": node_uid}
            ],
        },
        "spec": {
            "holderIdentity": name,
            "leaseDurationSeconds": LEASE_DURATION_SECONDS,
            "renewTime": now_micro(),
        },
    }


def lease_path(name: str = "") -> str:
    """The REST path of a node lease (or of the collection)."""
    base = f"/apis/coordination.k8s.io/v1/namespaces/{LEASE_NAMESPACE}/leases"
    return f"{base}/{name}" if name else base


class NodeFleet:
    """Registers a profile's nodes and keeps them Ready until `stop()` or `fail(name)`."""

    def __init__(
        self,
        calls: KubeCalls,
        profile: ClusterProfile,
        *,
        cluster: str,
        prefix: str = "",
        renew_seconds: float = LEASE_RENEW_SECONDS,
        status_seconds: float = STATUS_REPORT_SECONDS,
    ) -> None:
        self.calls = calls
        self.profile = profile
        self.cluster = cluster
        self.prefix = prefix
        self.renew_seconds = renew_seconds
        self.status_seconds = status_seconds
        self.nodes: dict[str, VirtualNode] = {}
        # The longest a live node went between lease renewals; the node controller waits 50 s.
        self.max_renew_gap_seconds = 0.0
        self._next_index: dict[str, int] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._pool = concurrent.futures.ThreadPoolExecutor(
            LEASE_WORKERS, thread_name_prefix="pd-lease"
        )
        self._status_pool = concurrent.futures.ThreadPoolExecutor(
            2, thread_name_prefix="pd-node-status"
        )

    def _allocate(self, group: NodeGroup, count: int) -> list[VirtualNode]:
        with self._lock:
            start = self._next_index.get(group.name, 0)
            self._next_index[group.name] = start + count
            created = []
            for index in range(start, start + count):
                name = group.node_name(index, self.prefix)
                address = str(NODE_ADDRESSES.network_address + 1 + len(self.nodes))
                node = VirtualNode(name, group, address)
                self.nodes[name] = node
                created.append(node)
            return created

    def _register(self, node: VirtualNode) -> dict[str, Any]:
        created = self.calls.request(
            "node-create",
            "POST",
            "/api/v1/nodes",
            build_node(node.group, node.name, node.address, self.cluster),
        )
        node.uid = created["metadata"]["uid"]
        self.calls.request("lease-create", "POST", lease_path(), build_lease(node.name, node.uid))
        began = node.renewed_at = time.monotonic()
        # Spread renewals over the interval instead of renewing every node at the same instant.
        spread = zlib.crc32(node.name.encode()) % 1000 / 1000
        node.next_renew = began + self.renew_seconds * spread
        node.next_status = began + self.status_seconds
        return created

    def register(self, groups: Mapping[str, int] | None = None) -> list[dict[str, Any]]:
        """Create nodes (every group's `count`, or the counts given) and their leases."""
        wanted = groups or {g.name: g.count for g in self.profile.node_groups}
        nodes = [
            n
            for name, count in wanted.items()
            for n in self._allocate(self.profile.group(name), count)
        ]
        return list(self._pool.map(self._register, nodes))

    def start(self) -> None:
        """Start renewing leases and posting heartbeats."""
        self._thread = threading.Thread(target=self._run, name="pd-node-heartbeats", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop the heartbeats; nodes stay as they are until `delete_all()`."""
        self._stop.set()
        if self._thread:
            self._thread.join(timeout=10)
        self._pool.shutdown(wait=True, cancel_futures=True)
        self._status_pool.shutdown(wait=True, cancel_futures=True)

    def _run(self) -> None:
        while not self._stop.wait(0.25):
            now = time.monotonic()
            with self._lock:
                live = [n for n in self.nodes.values() if n.uid and not n.failed]
            for node in live:
                # One heartbeat of each kind in flight per node, the next one due an interval
                # after it ends: an overloaded apiserver spaces them out instead of piling up
                # a queue that would deliver them too late anyway.
                if now >= node.next_renew:
                    node.next_renew = math.inf
                    self._pool.submit(self._beat, node, renew=True)
                if now >= node.next_status:
                    node.next_status = math.inf
                    self._status_pool.submit(self._beat, node, renew=False)

    def _beat(self, node: VirtualNode, *, renew: bool) -> None:
        try:
            if renew:
                self._renew(node)
                now = time.monotonic()
                self.max_renew_gap_seconds = max(self.max_renew_gap_seconds, now - node.renewed_at)
                node.renewed_at = now
            else:
                self._post_status(node)
        except Exception as error:  # a missed heartbeat is retried on the next one
            log.warning("heartbeat of node %s failed: %s", node.name, error)
        finally:
            if renew:
                node.next_renew = time.monotonic() + self.renew_seconds
            else:
                node.next_status = time.monotonic() + self.status_seconds

    def _renew(self, node: VirtualNode) -> None:
        self.calls.request(
            "lease-renew",
            "PATCH",
            lease_path(node.name),
            {"spec": {"renewTime": now_micro()}},
            content_type=MERGE_PATCH,
        )

    def _post_status(self, node: VirtualNode, ready: bool = True) -> dict[str, Any]:
        return self.calls.request(
            "node-status",
            "PATCH",
            f"/api/v1/nodes/{node.name}/status",
            {"status": {"conditions": node_conditions(ready)}},
            content_type=STRATEGIC_PATCH,
        )

    def _edit_taints(
        self, name: str, edit: Callable[[list[dict[str, Any]]], list[dict[str, Any]]]
    ) -> dict[str, Any]:
        """Read-modify-write of spec.taints, guarded by resourceVersion: the node-lifecycle
        controller edits the same list."""
        for _ in range(10):
            current = self.calls.request("node-get", "GET", f"/api/v1/nodes/{name}")
            taints = list(current["spec"].get("taints") or [])
            wanted = edit(taints)
            if wanted == taints:
                return current
            patch = {
                "metadata": {"resourceVersion": current["metadata"]["resourceVersion"]},
                "spec": {"taints": wanted},
            }
            try:
                return self.calls.request(
                    "node-taints", "PATCH", f"/api/v1/nodes/{name}", patch, content_type=MERGE_PATCH
                )
            except ApiException as error:
                if error.status != 409:
                    raise
        raise RuntimeError(f"node {name}: taints kept changing under us")

    def fail(self, name: str) -> dict[str, Any]:
        """The node goes silent: its lease stops, it reads NotReady (Unknown) and is tainted
        unreachable at once (a real cluster notices after the 50 s grace period)."""
        node = self.nodes[name]
        node.failed = True
        self._post_status(node, ready=False)

        def add(taints: list[dict[str, Any]]) -> list[dict[str, Any]]:
            if any(
                t.get("key") == TAINT_UNREACHABLE and t.get("effect") == "NoSchedule"
                for t in taints
            ):
                return taints
            return [*taints, {"key": TAINT_UNREACHABLE, "effect": "NoSchedule"}]

        return self._edit_taints(name, add)

    def recover(self, name: str) -> dict[str, Any]:
        """The node is back: Ready, lease renewed, the controller's condition taints removed."""
        node = self.nodes[name]
        self._post_status(node, ready=True)
        self._renew(node)
        node.renewed_at = time.monotonic()
        node.failed = False
        return self._edit_taints(
            name,
            lambda taints: [
                t for t in taints if t.get("key") not in (TAINT_UNREACHABLE, TAINT_NOT_READY)
            ],
        )

    def observe(self, obj: Mapping[str, Any]) -> None:
        """A node as the watch shows it. If the node controller marked a live node Unknown (a
        renewal came too late), post Ready now, as a kubelet does when the stored status differs
        from its own, instead of at the next 5-minute report."""
        node = self.nodes.get(obj["metadata"]["name"])
        conditions = (obj.get("status") or {}).get("conditions") or []
        ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)
        if node is not None and not node.failed and not ready and node.next_status != math.inf:
            node.next_status = 0.0

    def is_running(self, name: str) -> bool:
        """A node of this fleet whose kubelet is alive."""
        node = self.nodes.get(name)
        return node is not None and not node.failed

    def address(self, name: str) -> str:
        """The node's InternalIP."""
        return self.nodes[name].address

    def accelerators(self, name: str) -> dict[str, HardwareProfile]:
        """Extended resource name -> the card behind it, on this node."""
        return {a.resource_name: a.hardware for a in self.nodes[name].group.accelerators}

    def delete_all(self) -> None:
        """Delete every node of the fleet; the garbage collector takes their leases."""
        for name in [n.name for n in self.nodes.values() if n.uid]:  # created ones only
            try:
                self.calls.request("node-delete", "DELETE", f"/api/v1/nodes/{name}")
            except ApiException as error:
                if error.status != 404:
                    raise
