"""Which node a pod fits on, and kube-scheduler's words when none does.

The fit logic of the mock scheduler (`pd_tools.simcluster`): the filters of kube-scheduler's default
profile that decide where accelerator pods go, in its order (NodeUnschedulable, TaintToleration,
NodeAffinity, NodeResourcesFit, then InterPodAffinity's required podAffinity terms), a
most-allocated score that packs cards onto as few nodes as possible, and the FailedScheduling
message. Like kube-scheduler, a node that is not Ready is kept
off by the taints the node-lifecycle controller puts on it, not by looking at its conditions.
The pods of one LeaderWorkerSet group (a multi-node replica) are placed together or not at all,
as a gang scheduler does: a half-placed group would hold cards and serve nothing.
"""

import math
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from pd_operator.core.observe import LWS_GROUP_KEY, summarize_node
from pd_operator.core.quantity import parse_quantity

# Filter reasons, word for word as kube-scheduler v1.36 reports them. Since kubernetes#134740
# (v1.34.2, v1.35) the taint reason no longer names the taint: pod status is readable by more
# people than node specs, and taint values can be sensitive.
REASON_UNSCHEDULABLE = "node(s) were unschedulable"
REASON_TAINT = "node(s) had untolerated taint(s)"
REASON_AFFINITY = "node(s) didn't match Pod's node affinity/selector"
REASON_TOO_MANY_PODS = "Too many pods"
REASON_POD_AFFINITY = "node(s) didn't match pod affinity rules"
PODS = "pods"
# A node with `spec.unschedulable` (kubectl cordon) admits pods that tolerate this taint.
UNSCHEDULABLE_TAINT_KEY = "node.kubernetes.io/unschedulable"
BLOCKING_EFFECTS = frozenset({"NoSchedule", "NoExecute"})

# How many pods the group of a LeaderWorkerSet pod has, leader included (sigs.k8s.io/lws).
LWS_SIZE = "leaderworkerset.sigs.k8s.io/size"

Usage = Mapping[str, int]  # resource name -> amount in milli-units ("pods" counts 1000 per pod)
# A pod as podAffinity terms see it: its namespace and labels.
Identity = tuple[str, Mapping[str, str]]


def milli(quantity: str | int) -> int:
    """A quantity in milli-units, rounded up as kube-scheduler rounds requests."""
    return math.ceil(parse_quantity(quantity) * 1000)


def insufficient(resource: str) -> str:
    """The NodeResourcesFit reason for a resource a node has too little of."""
    return f"Insufficient {resource}"


@dataclass(frozen=True)
class Toleration:
    """A pod toleration; an empty key with Exists tolerates every taint."""

    key: str = ""
    operator: str = "Equal"
    value: str = ""
    effect: str = ""  # empty: every effect

    def tolerates(self, taint: "Taint") -> bool:
        """The core/v1 matching rule for one taint."""
        if self.effect and self.effect != taint.effect:
            return False
        if not self.key:
            return self.operator == "Exists"
        if self.key != taint.key:
            return False
        return self.operator == "Exists" or self.value == taint.value


@dataclass(frozen=True)
class Taint:
    """A node taint."""

    key: str
    value: str = ""
    effect: str = "NoSchedule"


@dataclass(frozen=True)
class Requirement:
    """One entry of a node selector term's matchExpressions or matchFields."""

    key: str
    operator: str  # In, NotIn, Exists, DoesNotExist, Gt, Lt
    values: tuple[str, ...] = ()

    def matches(self, values: Mapping[str, str]) -> bool:
        """Whether a node's labels (or fields) satisfy this requirement."""
        present = self.key in values
        value = values.get(self.key, "")
        if self.operator == "In":
            return present and value in self.values
        if self.operator == "NotIn":
            return not present or value not in self.values
        if self.operator == "Exists":
            return present
        if self.operator == "DoesNotExist":
            return not present
        if self.operator in ("Gt", "Lt") and present and len(self.values) == 1:
            try:
                have, bound = int(value), int(self.values[0])
            except ValueError:
                return False
            return have > bound if self.operator == "Gt" else have < bound
        return False


@dataclass(frozen=True)
class SelectorTerm:
    """A node selector term: every expression and field requirement must hold."""

    expressions: tuple[Requirement, ...] = ()
    fields: tuple[Requirement, ...] = ()

    def matches(self, labels: Mapping[str, str], name: str) -> bool:
        """An empty term matches no node, as in core/v1."""
        if not self.expressions and not self.fields:
            return False
        node_fields = {"metadata.name": name}
        return all(r.matches(labels) for r in self.expressions) and all(
            r.matches(node_fields) for r in self.fields
        )


@dataclass(frozen=True)
class PodAffinityTerm:
    """A required podAffinity term: a node qualifies when a pod the term selects runs on a node
    with the same value of `topology_key`. Namespaces: the term's list, else the pod's own (a
    namespaceSelector is not read)."""

    topology_key: str
    namespaces: tuple[str, ...]
    match_labels: tuple[tuple[str, str], ...] = ()
    expressions: tuple[Requirement, ...] = ()

    def selects(self, pod: Identity) -> bool:
        """Whether the term's selector and namespaces match a pod."""
        namespace, labels = pod
        return (
            namespace in self.namespaces
            and all(labels.get(key) == value for key, value in self.match_labels)
            and all(r.matches(labels) for r in self.expressions)
        )


def _check_order(item: tuple[str, int]) -> tuple[int, str]:
    # kube-scheduler's order: pod count, cpu, memory, ephemeral storage, then the rest by name.
    rank = {PODS: 0, "cpu": 1, "memory": 2, "ephemeral-storage": 3}
    return (rank.get(item[0], 4), item[0])


@dataclass(frozen=True)
class PodDemand:
    """What a pod asks of a node. Hashable: pods of one template share one demand."""

    # (resource, milli-units), "pods" included; kept in kube-scheduler's order of checking.
    requests: tuple[tuple[str, int], ...] = ()
    node_selector: tuple[tuple[str, str], ...] = ()
    # Required node affinity: any term may match. None when the pod sets none.
    affinity: tuple[SelectorTerm, ...] | None = None
    tolerations: tuple[Toleration, ...] = ()
    # Required podAffinity terms, and whether the pod matches all of them itself (the first pod
    # of a self-affine set may go to any node, as kube-scheduler allows).
    pod_affinity: tuple[PodAffinityTerm, ...] = ()
    self_affine: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "requests", tuple(sorted(self.requests, key=_check_order)))


@dataclass(frozen=True)
class NodeFacts:
    """What the filters read of a node."""

    name: str
    labels: Mapping[str, str] = field(default_factory=dict)
    taints: tuple[Taint, ...] = ()
    allocatable: Usage = field(default_factory=dict)
    unschedulable: bool = False


def _requirements(entries: Iterable[Mapping[str, Any]]) -> tuple[Requirement, ...]:
    return tuple(
        Requirement(e["key"], e["operator"], tuple(str(v) for v in e.get("values") or ()))
        for e in entries
    )


def _add(total: dict[str, int], requests: Mapping[str, Any]) -> None:
    for resource, quantity in requests.items():
        total[resource] = total.get(resource, 0) + milli(quantity)


def pod_requests(spec: Mapping[str, Any]) -> dict[str, int]:
    """Requests of a pod spec in milli-units: containers summed, then the largest init
    container wherever it asks for more, plus the runtime class overhead (as kube-scheduler)."""
    total: dict[str, int] = {}
    for container in spec.get("containers") or []:
        _add(total, (container.get("resources") or {}).get("requests") or {})
    for container in spec.get("initContainers") or []:
        for resource, quantity in (
            (container.get("resources") or {}).get("requests") or {}
        ).items():
            total[resource] = max(total.get(resource, 0), milli(quantity))
    _add(total, spec.get("overhead") or {})
    total[PODS] = 1000
    return total


def pod_demand(pod: Mapping[str, Any]) -> PodDemand:
    """The demand of a pod object (camelCase dict as the apiserver returns it)."""
    spec = pod.get("spec") or {}
    required = ((spec.get("affinity") or {}).get("nodeAffinity") or {}).get(
        "requiredDuringSchedulingIgnoredDuringExecution"
    ) or {}
    terms = required.get("nodeSelectorTerms")
    affinity = (
        None
        if terms is None
        else tuple(
            SelectorTerm(
                _requirements(term.get("matchExpressions") or ()),
                _requirements(term.get("matchFields") or ()),
            )
            for term in terms
        )
    )
    tolerations = tuple(
        Toleration(
            key=t.get("key") or "",
            operator=t.get("operator") or "Equal",
            value=t.get("value") or "",
            effect=t.get("effect") or "",
        )
        for t in spec.get("tolerations") or ()
    )
    meta = pod.get("metadata") or {}
    own: Identity = (str(meta.get("namespace") or ""), meta.get("labels") or {})
    pod_affinity = _pod_affinity_terms(spec, own[0])
    return PodDemand(
        requests=tuple(pod_requests(spec).items()),
        node_selector=tuple(sorted((spec.get("nodeSelector") or {}).items())),
        affinity=affinity,
        tolerations=tolerations,
        pod_affinity=pod_affinity,
        self_affine=bool(pod_affinity) and all(term.selects(own) for term in pod_affinity),
    )


def _pod_affinity_terms(spec: Mapping[str, Any], namespace: str) -> tuple[PodAffinityTerm, ...]:
    terms = ((spec.get("affinity") or {}).get("podAffinity") or {}).get(
        "requiredDuringSchedulingIgnoredDuringExecution"
    ) or ()
    found = []
    for term in terms:
        selector = term.get("labelSelector") or {}
        found.append(
            PodAffinityTerm(
                topology_key=term["topologyKey"],
                namespaces=tuple(term.get("namespaces") or (namespace,)),
                match_labels=tuple(sorted((selector.get("matchLabels") or {}).items())),
                expressions=_requirements(selector.get("matchExpressions") or ()),
            )
        )
    return tuple(found)


@dataclass(frozen=True)
class PodGroup:
    """The group a pod is placed with: `size` pods sharing `key`, bound whole or not at all."""

    key: str
    size: int


def pod_group(pod: Mapping[str, Any]) -> PodGroup | None:
    """The LeaderWorkerSet group of a pod (None: it is placed alone)."""
    meta = pod.get("metadata") or {}
    key = (meta.get("labels") or {}).get(LWS_GROUP_KEY)
    size = str((meta.get("annotations") or {}).get(LWS_SIZE) or "")
    if not key or not size.isdigit() or int(size) < 2:
        return None
    return PodGroup(key, int(size))


def node_facts(node: Mapping[str, Any]) -> NodeFacts:
    """The facts of a node object that the filters read."""
    summary = summarize_node(node)
    return NodeFacts(
        name=summary.name,
        labels=summary.labels,
        taints=tuple(
            Taint(t.get("key", ""), t.get("value", ""), t.get("effect", "")) for t in summary.taints
        ),
        allocatable={resource: milli(value) for resource, value in summary.allocatable.items()},
        unschedulable=summary.unschedulable,
    )


def static_reason(demand: PodDemand, node: NodeFacts) -> str | None:
    """The first filter that rejects the node regardless of what already runs there."""
    if node.unschedulable and not any(
        t.tolerates(Taint(UNSCHEDULABLE_TAINT_KEY, "", "NoSchedule")) for t in demand.tolerations
    ):
        return REASON_UNSCHEDULABLE
    for taint in node.taints:
        if taint.effect in BLOCKING_EFFECTS and not any(
            t.tolerates(taint) for t in demand.tolerations
        ):
            return REASON_TAINT
    if any(node.labels.get(key) != value for key, value in demand.node_selector):
        return REASON_AFFINITY
    if demand.affinity is not None and not any(
        term.matches(node.labels, node.name) for term in demand.affinity
    ):
        return REASON_AFFINITY
    return None


def pod_counts(
    term: PodAffinityTerm, nodes: Iterable[NodeFacts], residents: Mapping[str, Iterable[Identity]]
) -> Counter[str]:
    """How many pods the term selects in each domain (value of its topology key); pods on nodes
    without the key are in no domain."""
    counts: Counter[str] = Counter()
    for node in nodes:
        domain = node.labels.get(term.topology_key)
        if domain is not None:
            counts[domain] += sum(term.selects(pod) for pod in residents.get(node.name, ()))
    return +counts  # drop the domains with none


def affinity_allows(demand: PodDemand, node: NodeFacts, counts: Sequence[Counter[str]]) -> bool:
    """kube-scheduler's InterPodAffinity filter for required podAffinity (`counts`: per term of
    the demand, its `pod_counts`): every term's topology key on the node, and a selected pod in
    the node's domain of each; or, when no term selects any pod anywhere, a pod that matches
    its own terms goes anywhere."""
    if not demand.pod_affinity:
        return True
    everywhere = True
    for term, count in zip(demand.pod_affinity, counts, strict=True):
        domain = node.labels.get(term.topology_key)
        if domain is None:
            return False
        everywhere = everywhere and count[domain] > 0
    return everywhere or (demand.self_affine and not any(count.total() for count in counts))


def resource_reasons(demand: PodDemand, node: NodeFacts, used: Usage) -> tuple[str, ...]:
    """Every resource the node lacks for the pod (NodeResourcesFit reports them all)."""
    reasons = []
    for resource, amount in demand.requests:
        if amount <= 0:
            continue
        free = node.allocatable.get(resource, 0) - used.get(resource, 0)
        if amount > free:
            reasons.append(REASON_TOO_MANY_PODS if resource == PODS else insufficient(resource))
    return tuple(reasons)


def packing_score(demand: PodDemand, node: NodeFacts, used: Usage) -> tuple[float, float]:
    """Higher is better: how full the node's accelerators (then cpu and memory) would be."""
    extended: list[float] = []
    basic: list[float] = []
    for resource, amount in demand.requests:
        capacity = node.allocatable.get(resource, 0)
        if resource == PODS or amount <= 0 or capacity <= 0:
            continue
        share = (used.get(resource, 0) + amount) / capacity
        (extended if "/" in resource else basic).append(share)
    return (
        sum(extended) / len(extended) if extended else 0.0,
        sum(basic) / len(basic) if basic else 0.0,
    )


def unschedulable_message(total_nodes: int, reasons: Iterable[str]) -> str:
    """kube-scheduler's FitError text: reasons counted over nodes, sorted as strings."""
    counts = Counter(reasons)
    if not total_nodes:
        return "no nodes available to schedule pods"
    histogram = sorted(f"{count} {reason}" for reason, count in counts.items())
    return f"0/{total_nodes} nodes are available: {', '.join(histogram)}."


@dataclass(frozen=True)
class Decision:
    """Where one pod goes: a node, or None with the message that says why not (an empty one:
    its group is not all there yet, nothing to say)."""

    key: str
    node: str | None
    message: str = ""


def _fits(requests: Sequence[tuple[str, int]], node: NodeFacts, used: Usage) -> bool:
    allocatable = node.allocatable
    return all(amount <= allocatable.get(r, 0) - used.get(r, 0) for r, amount in requests)


@dataclass
class _DemandState:
    """What one call of `schedule` has learnt about one demand."""

    feasible: list[NodeFacts]  # passed the static filters
    rejected: list[str]  # the static reasons of the others
    candidates: list[NodeFacts]  # feasible nodes not yet found too full (usage only grows)
    positive: tuple[tuple[str, int], ...]  # the requests worth checking


class _Books:
    """What one call of `schedule` has placed so far, and learnt about each demand."""

    def __init__(
        self,
        nodes: Sequence[NodeFacts],
        usage: Mapping[str, Usage],
        residents: Mapping[str, Iterable[Identity]],
    ) -> None:
        self.usage = usage
        self.used: dict[str, dict[str, int]] = {}
        self.ordered = sorted(nodes, key=lambda n: n.name)
        self.states: dict[PodDemand, _DemandState] = {}
        self.residents = residents
        self.arrived: dict[str, list[Identity]] = {}  # pods placed by this call, per node
        self._counts: dict[PodAffinityTerm, Counter[str]] = {}

    def counts(self, demand: PodDemand) -> list[Counter[str]]:
        """Per podAffinity term of the demand, the pods it selects per domain, placed ones too;
        counted once per term, then kept up to date by `arrive` and `leave`."""
        found = []
        for term in demand.pod_affinity:
            count = self._counts.get(term)
            if count is None:
                count = pod_counts(term, self.ordered, self.residents)
                count += pod_counts(term, self.ordered, self.arrived)
                self._counts[term] = count
            found.append(count)
        return found

    def arrive(self, node: NodeFacts, pod: Identity | None, step: int = 1) -> None:
        """A pod placed on the node (step -1: taken off again) for the terms counted so far."""
        if pod is None:
            return
        here = self.arrived.setdefault(node.name, [])
        if step > 0:
            here.append(pod)
        else:
            here.remove(pod)
        for term, count in self._counts.items():
            domain = node.labels.get(term.topology_key)
            if domain is not None and term.selects(pod):
                count[domain] += step

    def now(self, node: NodeFacts) -> Usage:
        return self.used.get(node.name) or self.usage.get(node.name) or {}

    def state_of(self, demand: PodDemand) -> _DemandState:
        state = self.states.get(demand)
        if state is None:
            feasible, rejected = [], []
            for node in self.ordered:
                reason = static_reason(demand, node)
                if reason is None:
                    feasible.append(node)
                else:
                    rejected.append(reason)
            positive = tuple((r, a) for r, a in demand.requests if a > 0)
            state = self.states[demand] = _DemandState(feasible, rejected, list(feasible), positive)
        return state

    def best_node(self, demand: PodDemand) -> NodeFacts | None:
        """The best-scoring node a lone pod fits on; forgets the candidates too full for it."""
        state = self.state_of(demand)
        best: NodeFacts | None = None
        best_score = (-1.0, -1.0)
        fitting = []
        counts = self.counts(demand)
        for node in state.candidates:
            current = self.now(node)
            if not _fits(state.positive, node, current):
                continue
            fitting.append(node)  # the affinity's domains change as pods are placed
            if not affinity_allows(demand, node, counts):
                continue
            score = packing_score(demand, node, current)
            if score > best_score:  # strict: ties keep the earlier name
                best, best_score = node, score
        state.candidates = fitting
        return best

    def failure(self, demand: PodDemand, seen: Callable[[NodeFacts], Usage]) -> str:
        state = self.state_of(demand)
        reasons = list(state.rejected)
        counts = self.counts(demand)
        for node in state.feasible:
            lacking = resource_reasons(demand, node, seen(node))
            if lacking:
                reasons.extend(lacking)
            elif not affinity_allows(demand, node, counts):
                reasons.append(REASON_POD_AFFINITY)
        return unschedulable_message(len(self.ordered), reasons)

    def place_group(
        self,
        group: PodGroup,
        gang: Sequence[tuple[str, PodDemand]],
        identities: Mapping[str, Identity],
    ) -> list[Decision]:
        """Every pod of a group on a node, booked; or none, and why."""
        trial: dict[str, dict[str, int]] = {}
        arrivals: list[tuple[NodeFacts, Identity | None]] = []

        def seen(node: NodeFacts) -> Usage:
            return trial.get(node.name) or self.now(node)

        chosen = []
        for key, demand in gang:
            state = self.state_of(demand)
            counts = self.counts(demand)
            best: NodeFacts | None = None
            best_score = (-1.0, -1.0)
            # Candidates were pruned on booked usage only, which this trial only adds to.
            for node in state.candidates:
                if _fits(state.positive, node, seen(node)) and affinity_allows(
                    demand, node, counts
                ):
                    score = packing_score(demand, node, seen(node))
                    if score > best_score:
                        best, best_score = node, score
            if best is None:
                message = (
                    f"{self.failure(demand, seen)} The {group.size} pods of group {group.key} "
                    "are bound together or not at all: none is bound."
                )
                for node, pod in arrivals:
                    self.arrive(node, pod, -1)
                return [Decision(k, None, message) for k, _ in gang]
            placed = dict(seen(best))
            for resource, amount in demand.requests:
                placed[resource] = placed.get(resource, 0) + amount
            trial[best.name] = placed
            arrivals.append((best, identities.get(key)))
            self.arrive(best, identities.get(key))
            chosen.append(Decision(key, best.name))
        self.used.update(trial)
        return chosen


def schedule(
    pods: Sequence[tuple[str, PodDemand]],
    nodes: Sequence[NodeFacts],
    usage: Mapping[str, Usage],
    groups: Mapping[str, PodGroup] | None = None,
    bound: Mapping[str, int] | None = None,
    *,
    residents: Mapping[str, Iterable[Identity]] | None = None,
    identities: Mapping[str, Identity] | None = None,
) -> list[Decision]:
    """Place pods in order, each seeing the nodes as the pods before it left them.

    `usage` is what already runs on each node; it is not modified. Pods with the same demand
    share work: static filters run once per demand; a node too full for a demand stays too full
    for the rest of the call; consecutive pods of one demand go on filling the node the previous
    one chose while it fits (it only got fuller, so it still scores best); and once a demand
    finds no node, later pods with it get the same message.

    A pod in `groups` (pod key -> its group) is placed with the rest of its group when the
    first of them comes in order: all of them, or none. `bound` counts the pods of each group
    already on a node; a group whose other pods do not exist yet waits (an empty message).

    Required podAffinity terms read `residents` (the pods on each node, bound or assumed) and
    the pods this call places (`identities`: pod key -> its namespace and labels).
    """
    books = _Books(nodes, usage, residents or {})
    identities = identities or {}
    failed: dict[PodDemand, str] = {}
    decisions = []
    last: tuple[PodDemand, NodeFacts] | None = None
    members: dict[str, list[tuple[str, PodDemand]]] = {}
    for key, demand in pods if groups else ():
        group = groups.get(key) if groups else None
        if group is not None:
            members.setdefault(group.key, []).append((key, demand))

    for key, demand in pods:
        group = groups.get(key) if groups else None
        if group is not None:
            gang = members.pop(group.key, None)
            if gang is None:
                continue  # decided with the first pod of its group
            if len(gang) + (bound or {}).get(group.key, 0) < group.size:
                decisions += [Decision(k, None) for k, _ in gang]
            else:
                decisions += books.place_group(group, gang, identities)
            last = None
            continue
        if demand in failed:
            decisions.append(Decision(key, None, failed[demand]))
            continue
        state = books.state_of(demand)
        best: NodeFacts | None = None
        if (
            last is not None
            and last[0] == demand
            and _fits(state.positive, last[1], books.now(last[1]))
        ):
            best = last[1]
        else:
            best = books.best_node(demand)
        if best is None:
            message = failed[demand] = books.failure(demand, books.now)
            decisions.append(Decision(key, None, message))
            last = None
            continue
        placed = dict(books.now(best))
        for resource, amount in demand.requests:
            placed[resource] = placed.get(resource, 0) + amount
        books.used[best.name] = placed
        books.arrive(best, identities.get(key))
        decisions.append(Decision(key, best.name))
        last = (demand, best)
    return decisions
