"""One level-based reconcile, as pure functions: what to apply, what to delete, what status says.

`plan_children` compares the complete desired children with what exists and keeps only the
writes that change something; `compute_status` turns observed state into status and conditions.
Neither does I/O; `pd_operator.handlers.reconciler` executes their results.
"""

import hashlib
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from pd_operator.api import PDDeployment, PoolSpec, Role
from pd_operator.api.pdpool import POOL_KIND
from pd_operator.core import reasons
from pd_operator.core.capacity import FreeCapacity
from pd_operator.core.children import (
    LABEL_POOL,
    LABEL_ROLE,
    POOL_WORKLOAD_KINDS,
    ROLES,
    Manifest,
    PoolKey,
    build_pdpool,
    child_key,
    desired_children,
    workload_key,
)
from pd_operator.core.decision import DecidedReplicas, PoolObservation
from pd_operator.core.naming import deployment_name
from pd_operator.core.observe import NodeSummary, PodSummary
from pd_operator.core.placement import advertised, allocatable, node_admits
from pd_operator.core.quantity import same_quantity
from pd_operator.core.rollout import Rollout, plan_rollout, surge
from pd_operator.core.router import DEFAULT_ACTIVATOR_IMAGE, router_children

ANNOTATION_SPEC_HASH = "pdoperator.io/spec-hash"
# The operator's (or the autoscaler's) replica decision, kept on the child so that it survives
# restarts and a manual `kubectl scale` can be put back.
ANNOTATION_DESIRED_REPLICAS = "pdoperator.io/desired-replicas"
# The decision that last changed the pool's replicas (`decision.ScaleRecord`), written by the
# same apply: a restart between it and the status write still reports the decision.
ANNOTATION_LAST_SCALE = "pdoperator.io/last-scale"

ChildKey = tuple[str, str, str]  # (apiVersion, kind, name)
# Kinds whose created fields stay with the create: a field the operator sets only once (a
# PDPool's spec.replicas, then HPA's) must not be removed by a later apply that leaves it out.
CREATE_ONLY_KINDS = frozenset({POOL_KIND})


@dataclass(frozen=True)
class Problem:
    """Why a spec that passed the schema cannot work; sets Stalled."""

    reason: str
    message: str


@dataclass(frozen=True)
class EventSpec:
    """A Kubernetes Event to post about the PDDeployment."""

    type: str
    reason: str
    message: str


@dataclass(frozen=True)
class ChildRef:
    """An existing child to delete (uid guards against deleting a newer namesake)."""

    api_version: str
    kind: str
    name: str
    uid: str


@dataclass
class ChildPlan:
    """The writes that converge the children, and what the plan learned on the way."""

    apply: list[Manifest] = field(default_factory=list)
    delete: list[ChildRef] = field(default_factory=list)
    events: list[EventSpec] = field(default_factory=list)
    problems: list[Problem] = field(default_factory=list)
    replicas: dict[PoolKey, int] = field(default_factory=dict)
    rollout: Rollout | None = None  # a rollout across roles in progress, or just completed


def all_pools(pdd: PDDeployment) -> list[tuple[Role, PoolSpec]]:
    """Every pool with its role, prefill first, each role in preference order."""
    return [(role, pool) for role in ROLES for pool in pdd.spec.pools(role)]


def current_replicas(
    pdd: PDDeployment,
    children: Mapping[ChildKey, Mapping[str, Any]],
    decisions: Mapping[PoolKey, int] | None = None,
) -> dict[PoolKey, int]:
    """Desired replicas per pool: a fresh decision, else the recorded one, else min; clamped."""
    result: dict[PoolKey, int] = {}
    for role, pool in all_pools(pdd):
        key = (role, pool.name)
        value: int | None = (decisions or {}).get(key)
        if value is None:
            existing = children.get(workload_key(pdd.metadata.name, role, pool))
            recorded = ((existing or {}).get("metadata", {}).get("annotations") or {}).get(
                ANNOTATION_DESIRED_REPLICAS
            )
            value = int(recorded) if recorded and recorded.isdigit() else pool.replicas.min
        result[key] = max(pool.replicas.min, min(pool.replicas.max, value))
    return result


def replica_pods(role: Role, pool: PoolSpec, pods: Sequence[PodSummary]) -> list[list[PodSummary]]:
    """The live (not terminating) pods of a pool, one list per replica: a pod, or the leader
    and workers of a multi-node replica's group."""
    groups: dict[str, list[PodSummary]] = {}
    for pod in pods:
        if pod.pool == pool.name and (pod.group_role or pod.role) == role and not pod.terminating:
            groups.setdefault(pod.group or pod.name, []).append(pod)
    return list(groups.values())


def lost_group_nodes(
    pdd: PDDeployment, pods: Sequence[PodSummary], nodes: Sequence[NodeSummary]
) -> list[str]:
    """One line per multi-node replica with a pod on a node that is gone or not Ready: the
    engine spans every node of its group, so the whole replica is lost with one of them."""
    ready = {node.name for node in nodes if node.ready}
    lines = []
    for role, pool in all_pools(pdd):
        if pool.accelerator.nodes_per_replica == 1:
            continue
        for group in replica_pods(role, pool, pods):
            lost = sorted(
                (p.node_name, p.name) for p in group if p.node_name and p.node_name not in ready
            )
            if lost:
                leader = min((p.name for p in group if p.role), default=lost[0][1])
                on = ", ".join(f"{node} ({pod})" for node, pod in lost)
                lines.append(
                    f"{role} pool {pool.name}: the group of {leader} lost node(s) {on}: "
                    "the replica serves nothing until its group is recreated"
                )
    return lines


def pool_observations(
    pdd: PDDeployment,
    children: Mapping[ChildKey, Mapping[str, Any]],
    pods: Sequence[PodSummary],
    *,
    count_bound: bool = False,
) -> dict[PoolKey, PoolObservation]:
    """Every pool as a decision sees it: its replicas now, Ready and unschedulable pods, and
    with `count_bound` the pods bound to a node (else: all but the unschedulable). A decision
    made on every pod event needs them: a pod just created and not yet bound has no room on
    the nodes' ledger, and must reserve it instead of counting as placed."""
    replicas = current_replicas(pdd, children)
    observed = {}
    for role, pool in all_pools(pdd):
        workload = children.get(workload_key(pdd.metadata.name, role, pool)) or {}
        status = workload.get("status") or {}
        groups = replica_pods(role, pool, pods)
        count = replicas[(role, pool.name)]
        size = pool.accelerator.nodes_per_replica
        # A group is bound once all its pods are; extra ones are going away.
        placed = sum(sum(bool(p.node_name) for p in group) >= size for group in groups)
        bound = min(count, placed)
        observed[(role, pool.name)] = PoolObservation(
            replicas=count,
            ready=status.get("readyReplicas", 0),
            unschedulable=sum(any(p.unschedulable for p in group) for group in groups),
            scheduled=bound if count_bound else None,
            # Where the pool runs: spec.placement's Required domain is read from it.
            nodes=frozenset(p.node_name for group in groups for p in group if p.node_name),
        )
    return observed


def spec_hash(manifest: Mapping[str, Any]) -> str:
    """A short stable hash of a manifest, recorded on the child to detect spec changes."""
    encoded = json.dumps(manifest, sort_keys=True, separators=(",", ":")).encode()
    return hashlib.sha256(encoded).hexdigest()[:16]


# Values the apiserver drops from a struct field (Go's omitempty): a field we set to one of them
# is stored absent, which is no drift (`env: [{name: X}]`, a toleration with `key: ""`).
_DROPPED_EMPTY: tuple[Any, ...] = ("", [], {})


def is_subset(desired: Any, actual: Any) -> bool:
    """Every field we set is present with the same value (server defaults may add more)."""
    if desired == actual:  # most fields: decided in C, before walking them in Python
        return True
    if isinstance(desired, Mapping):
        return isinstance(actual, Mapping) and all(
            is_subset(value, actual[key]) if key in actual else value in _DROPPED_EMPTY
            for key, value in desired.items()
        )
    if isinstance(desired, list):
        return (
            isinstance(actual, list)
            and len(desired) == len(actual)
            and all(is_subset(d, a) for d, a in zip(desired, actual, strict=True))
        )
    return bool(desired == actual or same_quantity(desired, actual))


def unplaceable(pool: PoolSpec, nodes: Sequence[NodeSummary]) -> str | None:
    """Why the nodes can never hold one replica of the pool, or None when they can (or we can't
    tell). A replica of a multi-node pool needs `nodesPerReplica` pods' worth of nodes at once.

    Only judged when some node advertises the pool's resource at all: in clusters whose
    accelerator nodes come and go (cluster autoscaler), an empty view proves nothing.
    """
    resource, needed = pool.accelerator.resource_name, pool.accelerator.per_replica
    if not advertised(nodes, resource):
        return None
    admitting = [node for node in nodes if node_admits(pool, node)]
    largest = max((allocatable(node, resource) for node in admitting), default=0)
    selector = ", ".join(f"{k}={v}" for k, v in pool.accelerator.node_selector.items()) or "any"
    where = f"no node matching nodeSelector {{{selector}}} (and tolerating its taints)"
    if largest < needed:
        return (
            f"{where} offers {needed} {resource} per replica; the largest such node has {largest}"
        )
    # Other devices (an RDMA HCA) on the same node, each judged like the cards: only once some
    # node advertises it at all.
    devices = {
        name: count for name, count in pool.accelerator.devices.items() if advertised(nodes, name)
    }
    wants = {resource: needed, **devices}
    # Pods of one group share a node only where it has room for each of them.
    slots = sum(
        min(int(allocatable(node, name) // count) for name, count in wants.items() if count > 0)
        for node in admitting
    )
    size = pool.accelerator.nodes_per_replica
    if slots >= size:
        return None
    if slots == 0:
        wanted = ", ".join(f"{count} {name}" for name, count in devices.items())
        return f"{where} offers {needed} {resource} and {wanted} per replica"
    offer = " and ".join(f"{count} {name}" for name, count in wants.items())
    return (
        f"a replica needs {size} nodes x {offer}: the nodes matching nodeSelector "
        f"{{{selector}}} (and tolerating its taints) have room for {slots} such pod(s) in all"
    )


def _last_scale(
    decisions: Mapping[PoolKey, int] | None,
    built: Manifest,
    actual: Mapping[str, Any] | None,
) -> dict[str, str]:
    """The pool Deployment's ANNOTATION_LAST_SCALE: the decision's record when this apply
    changes the replicas to it, else the one it has (an apply that left it out would drop it)."""
    labels = built["metadata"]["labels"]
    records = decisions.records if isinstance(decisions, DecidedReplicas) else {}
    record = records.get((labels[LABEL_ROLE], labels[LABEL_POOL]))
    annotations = (actual or {}).get("metadata", {}).get("annotations") or {}
    replicas = built["spec"]["replicas"]
    changes = replicas != _int(annotations.get(ANNOTATION_DESIRED_REPLICAS))
    if record is not None and record.to_replicas == replicas and changes:
        return {ANNOTATION_LAST_SCALE: record.to_json()}
    kept = annotations.get(ANNOTATION_LAST_SCALE)
    return {ANNOTATION_LAST_SCALE: kept} if kept else {}


def _int(text: str | None) -> int | None:
    return int(text) if text and text.isdigit() else None


def _annotate(manifest: Manifest, annotations: Mapping[str, str]) -> Manifest:
    metadata = {**manifest["metadata"]}
    metadata["annotations"] = {**(metadata.get("annotations") or {}), **annotations}
    return {**manifest, "metadata": metadata}


def _role(obj: Mapping[str, Any]) -> str | None:
    return (obj["metadata"].get("labels") or {}).get(LABEL_ROLE)


def _ready_replicas(obj: Mapping[str, Any]) -> int:
    return int((obj.get("status") or {}).get("readyReplicas") or 0)


def kept_until_replaced(
    children: Mapping[ChildKey, Mapping[str, Any]], wanted: Mapping[ChildKey, Manifest]
) -> set[str]:
    """Names of workloads gone from the spec that stay (with their budget, account and
    autoscaler of the same name) until their role's replacement can take over.

    A renamed or removed pool goes only once every Deployment of its role exists (a rejected
    or unplaceable one never does), and, while it still has Ready replicas, once one of them
    has Ready replicas too (unless the role is meant to have none): a role is never left
    without a workload by a spec change.
    """
    kept: set[str] = set()
    for key, actual in children.items():
        if key[1] not in POOL_WORKLOAD_KINDS or key in wanted:
            continue
        successors = [
            k
            for k, manifest in wanted.items()
            if k[1] in POOL_WORKLOAD_KINDS and _role(manifest) == _role(actual)
        ]
        if not successors:
            continue  # the role is gone (a router turned off): nothing takes over
        if any(k not in children for k in successors):
            kept.add(key[2])
            continue
        meant_to_serve = any(wanted[k]["spec"].get("replicas", 1) > 0 for k in successors)
        serving = any(_ready_replicas(children[k]) > 0 for k in successors)
        if _ready_replicas(actual) > 0 and meant_to_serve and not serving:
            kept.add(key[2])
    return kept


def plan_children(
    pdd: PDDeployment,
    children: Mapping[ChildKey, Mapping[str, Any]],
    nodes: Sequence[NodeSummary],
    decisions: Mapping[PoolKey, int] | None = None,
    activator_image: str = DEFAULT_ACTIVATOR_IMAGE,
    *,
    free: Callable[[], FreeCapacity] | None = None,
) -> ChildPlan:
    """The applies and deletes that make the children match the spec; nothing when converged.
    `activator_image` is the operator's own image (the router pod's activator); `free` the
    free capacity that limits a rollout's surge (`core.rollout`)."""
    plan = ChildPlan(replicas=current_replicas(pdd, children, decisions))
    rollout = plan_rollout(pdd, children, plan.replicas, free)
    plan.rollout = rollout.rollout
    if rollout.rollout is not None and rollout.rollout.state == "Stalled":
        plan.problems.append(Problem(reasons.ROLLOUT_STALLED, rollout.rollout.message))
    # The pools that keep their old revision until the routers select the new one.
    blocked: set[str] = set(rollout.frozen)
    for role, pool in all_pools(pdd):
        why = unplaceable(pool, nodes)
        if why:
            plan.problems.append(Problem(reasons.NO_NODE_FITS, f"{role} pool {pool.name}: {why}"))
            blocked.add(deployment_name(pdd.metadata.name, role, pool.name))
    wanted: set[ChildKey] = set()
    wanted_manifests: dict[ChildKey, Manifest] = {}
    external = pdd.spec.scaling.mode == "External"
    pdpools = [build_pdpool(pdd, role) for role in ROLES] if external else []
    for built in [
        *desired_children(pdd, plan.replicas),
        *rollout.surge,
        *router_children(pdd, activator_image, rollout.serving),
        *pdpools,
    ]:
        key = child_key(built)
        wanted.add(key)
        wanted_manifests[key] = built
        if key[1] in POOL_WORKLOAD_KINDS and key[2] in blocked:
            continue  # keep what runs; a new spec that cannot be placed is not rolled out
        extra = {ANNOTATION_SPEC_HASH: spec_hash(built)}
        labels = built["metadata"]["labels"]
        # A surge workload (`core.rollout`) holds no replica decision: its pool's own one does.
        if key[1] in POOL_WORKLOAD_KINDS and labels.get(LABEL_ROLE) in ROLES and not surge(built):
            extra[ANNOTATION_DESIRED_REPLICAS] = str(built["spec"]["replicas"])
            extra |= _last_scale(decisions, built, children.get(key))
        manifest = _annotate(built, extra)
        actual = children.get(key)
        if actual is None:
            if key[1] == POOL_KIND:  # starts from what the role runs now
                of: Role = built["metadata"]["labels"][LABEL_ROLE]
                total = sum(n for (r, _), n in plan.replicas.items() if r == of)
                manifest = _annotate(build_pdpool(pdd, of, total), extra)
            plan.apply.append(manifest)
            continue
        recorded = (actual["metadata"].get("annotations") or {}).get(ANNOTATION_SPEC_HASH)
        if recorded == extra[ANNOTATION_SPEC_HASH] and is_subset(manifest, actual):
            continue
        plan.apply.append(manifest)
        if recorded == extra[ANNOTATION_SPEC_HASH]:
            plan.events.append(
                EventSpec(
                    "Normal",
                    reasons.EVENT_DRIFT_CORRECTED,
                    f"{key[1]} {key[2]} was changed outside the operator; restored",
                )
            )
    kept = kept_until_replaced(children, wanted_manifests)
    for key, actual in children.items():
        if key not in wanted and key[2] not in kept:
            meta = actual["metadata"]
            plan.delete.append(ChildRef(key[0], key[1], key[2], meta.get("uid", "")))
            if key[1] in POOL_WORKLOAD_KINDS:
                plan.events.append(
                    EventSpec("Normal", reasons.EVENT_POOL_DELETED, f"deleted {key[1]} {key[2]}")
                )
    return plan
