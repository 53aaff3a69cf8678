"""Summaries of observed pods and nodes: the few facts reconcile and capacity need."""

from collections.abc import Mapping
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from pd_operator.core.children import LABEL_GROUP_ROLE, LABEL_POOL, LABEL_ROLE
from pd_operator.core.quantity import parse_quantity

# Which pod a ReplicaSet removes first among Ready ones: the lowest cost (Kubernetes >= 1.22).
DELETION_COST = "controller.kubernetes.io/pod-deletion-cost"

# Every pod of one LeaderWorkerSet group carries its group's key (sigs.k8s.io/lws).
LWS_GROUP_KEY = "leaderworkerset.sigs.k8s.io/group-key"

IMAGE_PROBLEMS = frozenset(
    {"ErrImagePull", "ImagePullBackOff", "InvalidImageName", "ErrImageNeverPull"}
)


@dataclass(frozen=True)
class PodSummary:
    """One pool pod as the reconciler sees it."""

    name: str
    role: str
    pool: str
    ready: bool
    unschedulable: bool
    node_name: str = ""
    image_problem: str = ""  # the kubelet's waiting reason and message, when the image fails
    terminating: bool = False
    requests: Mapping[str, str] = field(default_factory=dict)
    uid: str = ""
    created: str = ""  # creationTimestamp, RFC 3339: sorts as time does
    replica_set: str = ""  # the ReplicaSet that controls it ("" for another controller or none)
    template_hash: str = ""  # its pod-template-hash label: the ReplicaSet's name ends with it
    deletion_cost: int = 0  # controller.kubernetes.io/pod-deletion-cost, 0 when unset
    group_role: str = ""  # of a multi-node pool's pod, leader or worker: its role
    group: str = ""  # of a multi-node pool's pod: its LeaderWorkerSet group's key


def _condition(obj: Mapping[str, Any], kind: str) -> Mapping[str, Any] | None:
    for condition in obj.get("status", {}).get("conditions") or []:
        if condition.get("type") == kind:
            return condition  # type: ignore[no-any-return]
    return None


def _container_requests(container: Mapping[str, Any]) -> dict[str, Decimal]:
    resources = container.get("resources") or {}
    # As the apiserver defaults it: a limit without a request is also the request.
    amounts = {**(resources.get("limits") or {}), **(resources.get("requests") or {})}
    return {name: parse_quantity(str(value)) for name, value in amounts.items()}


def pod_requests(spec: Mapping[str, Any]) -> dict[str, Decimal]:
    """What a pod holds on its node, as the scheduler counts it (simplified): the sum over its
    containers and sidecar init containers, at least the largest other init container, plus
    the pod overhead."""
    total: dict[str, Decimal] = {}
    for container in spec.get("containers") or []:
        for name, amount in _container_requests(container).items():
            total[name] = total.get(name, Decimal(0)) + amount
    init_peak: dict[str, Decimal] = {}
    for container in spec.get("initContainers") or []:
        amounts = _container_requests(container)
        if container.get("restartPolicy") == "Always":  # a sidecar runs alongside
            for name, amount in amounts.items():
                total[name] = total.get(name, Decimal(0)) + amount
        else:
            for name, amount in amounts.items():
                init_peak[name] = max(init_peak.get(name, Decimal(0)), amount)
    for name, amount in init_peak.items():
        total[name] = max(total.get(name, Decimal(0)), amount)
    for name, value in (spec.get("overhead") or {}).items():
        total[name] = total.get(name, Decimal(0)) + parse_quantity(str(value))
    return total


def summarize_pod(pod: Mapping[str, Any]) -> PodSummary:
    """Reduce a pod object to what reconcile and capacity need."""
    meta, spec, status = pod["metadata"], pod.get("spec", {}), pod.get("status", {})
    labels = meta.get("labels") or {}
    scheduled = _condition(pod, "PodScheduled")
    ready = _condition(pod, "Ready")
    image_problem = ""
    for container in status.get("containerStatuses") or []:
        waiting = (container.get("state") or {}).get("waiting") or {}
        if waiting.get("reason") in IMAGE_PROBLEMS:
            image_problem = f"{waiting['reason']}: {waiting.get('message', '')}".strip(": ")
    requests = {name: format(amount, "f") for name, amount in pod_requests(spec).items()}
    return PodSummary(
        name=meta["name"],
        role=labels.get(LABEL_ROLE, ""),
        pool=labels.get(LABEL_POOL, ""),
        ready=bool(ready and ready.get("status") == "True"),
        unschedulable=bool(
            scheduled
            and scheduled.get("status") == "False"
            and scheduled.get("reason") == "Unschedulable"
        ),
        node_name=spec.get("nodeName") or "",
        image_problem=image_problem,
        terminating=bool(meta.get("deletionTimestamp")),
        requests=requests,
        uid=meta.get("uid") or "",
        created=meta.get("creationTimestamp") or "",
        replica_set=_controller_named(meta, "ReplicaSet"),
        template_hash=labels.get("pod-template-hash", ""),
        deletion_cost=_int_or_zero((meta.get("annotations") or {}).get(DELETION_COST)),
        group_role=labels.get(LABEL_GROUP_ROLE, ""),
        group=labels.get(LWS_GROUP_KEY, ""),
    )


def _controller_named(meta: Mapping[str, Any], kind: str) -> str:
    for ref in meta.get("ownerReferences") or []:
        if ref.get("controller") and ref.get("kind") == kind:
            return str(ref.get("name") or "")
    return ""


def _int_or_zero(text: str | None) -> int:
    try:
        return int(text or 0)
    except ValueError:  # the ReplicaSet controller reads an unparsable cost as 0 too
        return 0


@dataclass(frozen=True)
class NodeSummary:
    """A node's labels, taints, allocatable resources and readiness."""

    name: str
    labels: Mapping[str, str]
    taints: tuple[Mapping[str, str], ...]
    allocatable: Mapping[str, str]
    ready: bool
    unschedulable: bool = False


def summarize_node(node: Mapping[str, Any]) -> NodeSummary:
    """Reduce a node object to what placement and capacity need."""
    ready = _condition(node, "Ready")
    spec = node.get("spec") or {}
    return NodeSummary(
        name=node["metadata"]["name"],
        labels=dict(node["metadata"].get("labels") or {}),
        taints=tuple(dict(t) for t in spec.get("taints") or []),
        allocatable=dict((node.get("status") or {}).get("allocatable") or {}),
        ready=bool(ready and ready.get("status") == "True"),
        unschedulable=bool(spec.get("unschedulable")),
    )
