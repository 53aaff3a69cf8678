"""Does a pod of a pool fit a node: node selector, taints and tolerations, resources."""

from collections.abc import Iterable, Mapping
from decimal import Decimal

from pd_operator.api.spec import PoolSpec, Toleration
from pd_operator.core.observe import NodeSummary
from pd_operator.core.quantity import parse_quantity

# Taint effects that keep a pod off a node unless it tolerates them.
BLOCKING_EFFECTS = frozenset({"NoSchedule", "NoExecute"})


def tolerates(tolerations: Iterable[Toleration], taint: Mapping[str, str]) -> bool:
    """The core/v1 toleration matching rules for one taint."""
    for toleration in tolerations:
        if toleration.effect and toleration.effect != taint.get("effect"):
            continue
        if toleration.key is None and toleration.operator == "Exists":
            return True
        if toleration.key != taint.get("key"):
            continue
        if toleration.operator == "Exists" or (toleration.value or "") == taint.get("value", ""):
            return True
    return False


def replica_cards(pool: PoolSpec) -> int:
    """The cards one replica of the pool runs on: `perReplica` on each of its nodes."""
    return pool.accelerator.per_replica * pool.accelerator.nodes_per_replica


def node_admits(pool: PoolSpec, node: NodeSummary) -> bool:
    """Node labels match the pool's selector and every blocking taint is tolerated."""
    selector = pool.accelerator.node_selector
    if any(node.labels.get(key) != value for key, value in selector.items()):
        return False
    tolerations = pool.accelerator.tolerations
    return all(
        tolerates(tolerations, taint)
        for taint in node.taints
        if taint.get("effect") in BLOCKING_EFFECTS
    )


def allocatable(node: NodeSummary, resource: str) -> Decimal:
    """A node's allocatable amount of a resource (0 when it has none)."""
    value = node.allocatable.get(resource)
    return parse_quantity(value) if value is not None else Decimal(0)


def advertised(nodes: Iterable[NodeSummary], resource: str) -> bool:
    """Some node offers the resource at all. Room is judged only then: in clusters whose
    accelerator nodes come and go (cluster autoscaler), an empty view proves nothing."""
    return any(allocatable(node, resource) > 0 for node in nodes)
