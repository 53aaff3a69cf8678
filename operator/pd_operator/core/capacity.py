"""Free capacity: how many more replicas of a pool fit on the nodes, now.

A pod of a replica needs `accelerator.perReplica` cards on ONE node (an engine does not span a
node's fragments), plus its `accelerator.devices` (an RDMA HCA: a node whose HCAs are taken has no
room for an engine that moves its KV cache over one), its CPU and memory requests and one pod slot.
A replica of a multi-node pool is a group of `accelerator.nodesPerReplica` such pods, placed whole
or not at all: it fits when that many pod slots are free (two on one node if it has room for both).
Free is allocatable minus the requests of the pods bound to the node. Only Ready, uncordoned
nodes that the pool admits (`placement.node_admits`: selector and taints) count.

`FreeCapacity` is a ledger: `take` places replicas on it and returns a new ledger, so pools that
share nodes are never promised the same cards twice within one decision. With
`spec.placement.mode: Required` a PDDeployment sees only its topology domain's nodes
(`in_domain`), as kube-scheduler's required podAffinity lets its pods go nowhere else.
"""

from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from decimal import Decimal

from pd_operator.api.spec import ROLE_NAMES, ContainerResources, PDDeploymentSpec, PoolSpec
from pd_operator.core.observe import NodeSummary, PodSummary
from pd_operator.core.placement import node_admits
from pd_operator.core.quantity import parse_quantity

PODS = "pods"


def _container_request(resources: ContainerResources | None, name: str) -> str | None:
    # As the apiserver defaults it: a limit without a request is also the request.
    for amounts in (resources.requests, resources.limits) if resources else ():
        value: str | None = getattr(amounts, name) if amounts else None
        if value is not None:
            return value
    return None


def replica_request(pool: PoolSpec) -> dict[str, Decimal]:
    """What one replica of the pool asks of a node: cards, other devices, CPU and memory, one
    pod slot."""
    request = {pool.accelerator.resource_name: Decimal(pool.accelerator.per_replica)}
    request |= {name: Decimal(count) for name, count in pool.accelerator.devices.items()}
    request[PODS] = Decimal(1)
    resources = pool.template.resources if pool.template else None
    for name in ("cpu", "memory"):
        value = _container_request(resources, name)
        if value is not None:
            request[name] = parse_quantity(value)
    return request


@dataclass(frozen=True)
class NodeRoom:
    """One schedulable node and what is still free on it."""

    node: NodeSummary
    free: Mapping[str, Decimal]

    def replicas_fitting(self, request: Mapping[str, Decimal]) -> int:
        """How many replicas with this request fit in the free room."""
        counts = []
        for name, amount in request.items():
            if amount <= 0:
                continue
            if name == PODS and name not in self.free:
                continue  # a node view without a pod limit (some fakes) is not full
            counts.append(int(self.free.get(name, Decimal(0)) // amount))
        return max(0, min(counts, default=0))


@dataclass(frozen=True)
class FreeCapacity:
    """Free room per schedulable node; immutable, `take` returns a new ledger."""

    rooms: tuple[NodeRoom, ...]
    # Labels of every node, schedulable or not: a deployment's pods may run on a cordoned one.
    labels: Mapping[str, Mapping[str, str]] = field(default_factory=dict)

    def in_domain(self, spec: PDDeploymentSpec, running: Collection[str]) -> "FreeCapacity":
        """The ledger a PDDeployment can grow on: with placement Required, only the nodes of the
        topology domains its pool pods run in (`running`: their nodes), or with none running the
        one domain with the most room for it; nodes without the label never. Else all nodes."""
        placement = spec.placement
        if placement is None or placement.mode != "Required":
            return self
        key = placement.topology_key
        domains: dict[str, list[NodeRoom]] = {}
        for room in self.rooms:
            if key in room.node.labels:
                domains.setdefault(room.node.labels[key], []).append(room)
        node_labels = {room.node.name: room.node.labels for room in self.rooms} | dict(self.labels)
        taken = {node_labels[n][key] for n in running if key in node_labels.get(n, {})}
        if not taken and domains:
            # kube-scheduler lets the first pod go to any labelled node; the rest follow it.
            taken = {min(domains, key=lambda d: (_rank(spec, domains[d]), d))}
        rooms = tuple(room for room in self.rooms if room.node.labels.get(key) in taken)
        return FreeCapacity(rooms, self.labels)

    def _admitting(self, pool: PoolSpec) -> list[int]:
        return [i for i, room in enumerate(self.rooms) if node_admits(pool, room.node)]

    def fits(self, pool: PoolSpec) -> int:
        """How many more replicas of the pool fit: whole groups of `nodesPerReplica` pods, each
        pod on a single node."""
        request = replica_request(pool)
        slots = sum(self.rooms[i].replicas_fitting(request) for i in self._admitting(pool))
        return slots // pool.accelerator.nodes_per_replica

    def holds_one(self, pool: PoolSpec) -> bool:
        """The schedulable nodes the pool admits could hold one replica (a whole group) if they
        were empty."""
        request = replica_request(pool)
        slots = 0
        for room in (self.rooms[i] for i in self._admitting(pool)):
            slots += NodeRoom(room.node, _allocatable(room.node)).replicas_fitting(request)
            if slots >= pool.accelerator.nodes_per_replica:
                return True
        return False

    def shortage(self, pool: PoolSpec, *, not_ready: int, unschedulable: int) -> str | None:
        """Why the nodes cannot hold the replicas a pool has now (None: they can), whatever
        the autoscaler wants: no schedulable node could hold one of its replicas that are not
        Ready, or the free room cannot take its unschedulable pods."""
        if not_ready > 0 and not self.holds_one(pool):
            accelerator = pool.accelerator
            devices = "".join(
                f" and {count} {name}" for name, count in sorted(accelerator.devices.items())
            )
            offer = f"{accelerator.per_replica} {accelerator.resource_name}{devices}"
            if accelerator.nodes_per_replica > 1:
                return (
                    f"fewer than {accelerator.nodes_per_replica} Ready, schedulable nodes "
                    f"matching its nodeSelector and taints offer {offer} each: a replica needs "
                    f"{accelerator.nodes_per_replica} nodes x {offer}"
                )
            return (
                f"no Ready, schedulable node matching its nodeSelector and taints offers "
                f"{offer} per replica"
            )
        room = self.fits(pool) if unschedulable else 0
        if unschedulable > room:
            return f"{unschedulable} pod(s) cannot be scheduled, room for {room}"
        return None

    def take(self, pool: PoolSpec, replicas: int) -> "FreeCapacity":
        """The ledger after placing up to `replicas` replicas (as many as fit, whole groups).

        Best fit: each pod goes to the admitting node with the fewest free cards that still
        holds it, so large holes stay open for pools with more cards per replica.
        """
        request = replica_request(pool)
        cards = pool.accelerator.resource_name
        rooms = list(self.rooms)
        candidates = self._admitting(pool)
        size = pool.accelerator.nodes_per_replica
        # A group that does not fit whole takes nothing: no half-placed replica holds cards.
        groups = max(0, replicas) if size == 1 else min(max(0, replicas), self.fits(pool))
        for _ in range(groups * size):
            fitting = [i for i in candidates if rooms[i].replicas_fitting(request) > 0]
            if not fitting:
                break
            best = min(fitting, key=lambda i: (rooms[i].free.get(cards, Decimal(0)), i))
            free = dict(rooms[best].free)
            for name, amount in request.items():
                if name in free:
                    free[name] -= amount
            rooms[best] = replace(rooms[best], free=free)
        return FreeCapacity(tuple(rooms), self.labels)


def _rank(spec: PDDeploymentSpec, rooms: Sequence[NodeRoom]) -> tuple[int, Decimal]:
    """A domain's rank for a PDDeployment with no pod running yet, lowest first: most roles
    with a pool that fits one replica there, then most free cards its pools could use."""
    ledger = FreeCapacity(tuple(rooms))
    roles = sum(any(ledger.fits(pool) for pool in spec.pools(role)) for role in ROLE_NAMES)
    pools = [pool for role in ROLE_NAMES for pool in spec.pools(role)]
    cards = Decimal(0)
    for room in rooms:
        usable = {p.accelerator.resource_name for p in pools if node_admits(p, room.node)}
        cards += sum((room.free.get(name, Decimal(0)) for name in usable), Decimal(0))
    return -roles, -cards


def _allocatable(node: NodeSummary) -> dict[str, Decimal]:
    return {name: parse_quantity(value) for name, value in node.allocatable.items()}


def free_capacity(nodes: Sequence[NodeSummary], pods: Iterable[PodSummary]) -> FreeCapacity:
    """The ledger of Ready, uncordoned nodes after the requests of the pods bound to them.

    `pods` are every pod in the cluster that holds resources: bound and not Succeeded or Failed
    (the caller filters the phase). Terminating pods still hold their requests until they are
    gone, as the scheduler counts them.
    """
    used: dict[str, dict[str, Decimal]] = {}
    for pod in pods:
        if not pod.node_name:
            continue
        on_node = used.setdefault(pod.node_name, {})
        for name, value in pod.requests.items():
            on_node[name] = on_node.get(name, Decimal(0)) + parse_quantity(value)
        on_node[PODS] = on_node.get(PODS, Decimal(0)) + 1
    rooms = []
    for node in sorted(nodes, key=lambda n: n.name):
        if not node.ready or node.unschedulable:
            continue
        free = _allocatable(node)
        for name, amount in used.get(node.name, {}).items():
            if name in free:
                free[name] = max(Decimal(0), free[name] - amount)
        rooms.append(NodeRoom(node, free))
    return FreeCapacity(tuple(rooms), {node.name: node.labels for node in nodes})
