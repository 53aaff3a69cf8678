"""An in-memory view of the cluster, fed by kopf's watch streams (list + watch, no GETs).

Reconciles read from here instead of asking the apiserver per object. Updates arrive on the
event loop; reconciles read from worker threads, so every access takes the lock.
"""

import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pd_operator.core.children import LABEL_DEPLOYMENT
from pd_operator.core.observe import NodeSummary, PodSummary, summarize_node, summarize_pod
from pd_operator.core.reconcile import ChildKey

ObjectKey = tuple[str, str]  # (namespace, name)


@dataclass(frozen=True)
class Snapshot:
    """Everything one reconcile of one PDDeployment reads."""

    pdd: Mapping[str, Any]
    children: dict[ChildKey, Mapping[str, Any]]
    pods: list[PodSummary]
    nodes: list[NodeSummary]


def _owner_uid(obj: Mapping[str, Any]) -> str | None:
    for ref in obj["metadata"].get("ownerReferences") or []:
        if ref.get("controller") and ref.get("kind") == "PDDeployment":
            return str(ref.get("uid"))
    return None


def _older(obj: Mapping[str, Any], than: Mapping[str, Any] | None) -> bool:
    """Whether `obj` is an earlier version of the same object than `than`. The reconciler
    records its own writes before their watch events arrive, and an event queued before the
    write must not put the older version back. etcd's resourceVersions are increasing integers;
    one that is not (another storage) is never judged older."""
    if than is None or than["metadata"].get("uid") != obj["metadata"].get("uid"):
        return False
    mine, theirs = obj["metadata"].get("resourceVersion"), than["metadata"].get("resourceVersion")
    if not (isinstance(mine, str) and isinstance(theirs, str)):
        return False
    return mine.isdigit() and theirs.isdigit() and int(mine) < int(theirs)


def owner_key(obj: Mapping[str, Any]) -> ObjectKey | None:
    """The PDDeployment an object belongs to, by our label."""
    meta = obj["metadata"]
    owner = (meta.get("labels") or {}).get(LABEL_DEPLOYMENT)
    return (meta.get("namespace", ""), owner) if owner else None


class ClusterCache:
    """PDDeployments, their children and pods, and nodes, as last seen on the watches."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pdds: dict[ObjectKey, Mapping[str, Any]] = {}
        self._children: dict[ObjectKey, dict[ChildKey, Mapping[str, Any]]] = {}
        self._pods: dict[ObjectKey, dict[str, PodSummary]] = {}
        self._nodes: dict[str, NodeSummary] = {}
        # Bound, running pods that are not ours (other workloads on the same nodes): only what
        # they hold, for free capacity.
        self._others: dict[tuple[str, str], PodSummary] = {}

    def pdd_keys(self) -> list[ObjectKey]:
        """Every PDDeployment currently known."""
        with self._lock:
            return list(self._pdds)

    def pdd(self, key: ObjectKey) -> Mapping[str, Any] | None:
        """A PDDeployment as last seen, or None when it is gone."""
        with self._lock:
            return self._pdds.get(key)

    def put_pdd(self, obj: Mapping[str, Any], deleted: bool = False) -> ObjectKey:
        """Record (or forget) a PDDeployment."""
        key = (obj["metadata"]["namespace"], obj["metadata"]["name"])
        with self._lock:
            if deleted:
                self._pdds.pop(key, None)
            elif not _older(obj, self._pdds.get(key)):
                self._pdds[key] = obj
        return key

    def refresh_pdd(self, obj: Mapping[str, Any]) -> None:
        """Record our own write of a PDDeployment, only while it is still the one we know: its
        deletion's watch event may have arrived first, and must not be undone."""
        key = (obj["metadata"]["namespace"], obj["metadata"]["name"])
        with self._lock:
            known = self._pdds.get(key)
            same = known is not None and known["metadata"].get("uid") == obj["metadata"].get("uid")
            if same and not _older(obj, known):
                self._pdds[key] = obj

    def put_child(self, obj: Mapping[str, Any], deleted: bool = False) -> ObjectKey | None:
        """Record (or forget) a child of ours: a Deployment, Service or PodDisruptionBudget."""
        owner = owner_key(obj)
        if owner is None:
            return None
        key = (obj["apiVersion"], obj["kind"], obj["metadata"]["name"])
        with self._lock:
            children = self._children.setdefault(owner, {})
            if deleted:
                children.pop(key, None)
            elif not _older(obj, children.get(key)):
                children[key] = obj
        return owner

    def put_pod(self, obj: Mapping[str, Any], deleted: bool = False) -> ObjectKey | None:
        """Record (or forget) a pool pod."""
        owner = owner_key(obj)
        if owner is None:
            return None
        with self._lock:
            pods = self._pods.setdefault(owner, {})
            if deleted:
                pods.pop(obj["metadata"]["name"], None)
            else:
                pods[obj["metadata"]["name"]] = summarize_pod(obj)
        return owner

    def put_other_pod(self, obj: Mapping[str, Any], deleted: bool = False) -> None:
        """Record (or forget) a pod of another workload (the autoscaler reads it each cycle)."""
        meta = obj["metadata"]
        key = (meta.get("namespace", ""), meta["name"])
        phase = (obj.get("status") or {}).get("phase")
        holds = not deleted and bool((obj.get("spec") or {}).get("nodeName"))
        holds = holds and phase not in ("Succeeded", "Failed")
        summary = summarize_pod(obj) if holds else None
        with self._lock:
            if summary is None:
                self._others.pop(key, None)
            else:
                self._others[key] = summary

    def put_node(self, obj: Mapping[str, Any], deleted: bool = False) -> bool:
        """Record (or forget) a node; True when what placement reads changed (not heartbeats)."""
        name = obj["metadata"]["name"]
        with self._lock:
            before = self._nodes.pop(name, None)
            if not deleted:
                self._nodes[name] = summarize_node(obj)
            return before != self._nodes.get(name)

    def all_pods(self) -> list[PodSummary]:
        """Every pod that holds resources on the nodes: the pool pods of every PDDeployment
        and the bound pods of other workloads."""
        with self._lock:
            ours = [pod for pods in self._pods.values() for pod in pods.values()]
            return ours + list(self._others.values())

    def nodes(self) -> list[NodeSummary]:
        """Every node currently known."""
        with self._lock:
            return list(self._nodes.values())

    def snapshot(self, key: ObjectKey) -> Snapshot | None:
        """The PDDeployment and what it owns (by controller uid), or None when it is gone."""
        with self._lock:
            pdd = self._pdds.get(key)
            if pdd is None:
                return None
            uid = pdd["metadata"].get("uid")
            children = {
                child_key: child
                for child_key, child in self._children.get(key, {}).items()
                if _owner_uid(child) == uid
            }
            return Snapshot(
                pdd=pdd,
                children=children,
                pods=list(self._pods.get(key, {}).values()),
                nodes=list(self._nodes.values()),
            )
