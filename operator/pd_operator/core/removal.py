"""Which replica goes when a pool shrinks: the one with the least work.

A ReplicaSet scaling down removes pods not yet Ready first, then, among Ready ones, the lowest
`controller.kubernetes.io/pod-deletion-cost`, and only then its own default (the most recently
Ready). Left to that default it often removes a replica in the middle of long decode streams,
which then hold its cards for the whole drain, or lose their tails when the drain runs out.
Just before it lowers a Deployment's replicas, the operator gives the Ready pods with the least
work (fewest running sequences on decode, fewest queued and running requests on prefill, read
from their engines' metrics) a cost below every other pod's, so that the ReplicaSet takes those.

Only the chosen pods are written. A chosen pod that stays (the scale-down was cancelled, or the
ReplicaSet took a pod that became unready meanwhile) keeps its low cost; the next scale-down
sets its own choice lower still, so a stale mark never decides one.
"""

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pd_operator.api.spec import Role
from pd_operator.core.children import (
    LABEL_POOL,
    LABEL_ROLE,
    POOL_WORKLOAD_KINDS,
    ROLES,
    child_key,
)
from pd_operator.core.observe import PodSummary

# The engine gauges that count a pod's work, per role: what a removal would delay or cut.
WORK_GAUGES: dict[Role, tuple[str, ...]] = {
    "decode": ("running",),  # running sequences: each holds KV and streams tokens
    "prefill": ("running", "waiting"),  # its queue: prompts re-routed or lost when it goes
}


@dataclass(frozen=True)
class Removal:
    """Pods to mark for one pool that is about to lose `count` replicas."""

    role: Role
    pool: str
    count: int
    chosen: tuple[PodSummary, ...]
    cost: int  # the deletion cost written on each chosen pod

    def summary(self, work: Mapping[str, float]) -> str:
        """One line for the log: which pods go and the work each holds."""
        gauges = " + ".join(WORK_GAUGES[self.role])
        picked = ", ".join(f"{pod.name} ({work[pod.name]:g})" for pod in self.chosen)
        return f"{self.role} pool {self.pool}: {self.count} fewer; least {gauges}: {picked}"


_ROLE_NAMED: dict[str, Role] = {role: role for role in ROLES}


@dataclass(frozen=True)
class Shrink:
    """A pool Deployment whose replicas the plan lowers."""

    role: Role
    pool: str
    deployment: str
    count: int  # replicas fewer


def shrinking_pools(
    manifests: Iterable[Mapping[str, Any]],
    existing: Mapping[tuple[str, str, str], Mapping[str, Any]],
) -> list[Shrink]:
    """The engine pools among the manifests to apply whose replicas go down."""
    found = []
    for manifest in manifests:
        labels = manifest["metadata"].get("labels") or {}
        role, pool = _ROLE_NAMED.get(labels.get(LABEL_ROLE, "")), labels.get(LABEL_POOL)
        if manifest["kind"] not in POOL_WORKLOAD_KINDS or role is None or not pool:
            continue  # the router's Deployment has no pool
        current = existing.get(child_key(manifest))
        if current is None:
            continue
        before = int((current.get("spec") or {}).get("replicas", 1))
        after = int(manifest["spec"]["replicas"])
        if after < before:
            found.append(Shrink(role, pool, manifest["metadata"]["name"], before - after))
    return found


def pool_pods_of(
    pods: Sequence[PodSummary], role: Role, pool: str, deployment: str
) -> list[PodSummary]:
    """The pool's live pods that our Deployment's ReplicaSets control (the only pods a
    scale-down of that Deployment removes, and the only ones the operator may annotate)."""
    prefix = f"{deployment}-"
    return [
        pod
        for pod in pods
        if pod.role == role
        and pod.pool == pool
        and not pod.terminating
        and pod.template_hash
        and pod.replica_set == f"{prefix}{pod.template_hash}"
    ]


def choose_removal(
    role: Role, pool: str, pods: Sequence[PodSummary], count: int, work: Mapping[str, float]
) -> Removal | None:
    """The Ready pods to remove first when `count` of the pool's `pods` go, or None when the
    ReplicaSet's own order already removes the right ones (pods not Ready go first) or no
    pod's work is known.

    Among pods with equal work the most recently created goes, as the ReplicaSet would choose:
    an older replica keeps its warm prefix cache."""
    not_ready = sum(1 for pod in pods if not pod.ready)
    wanted = count - not_ready
    known = [pod for pod in pods if pod.ready and pod.name in work]
    if wanted <= 0 or not known:
        return None
    newest_first = sorted(known, key=lambda pod: pod.created, reverse=True)
    chosen = sorted(newest_first, key=lambda pod: work[pod.name])[:wanted]
    names = {pod.name for pod in chosen}
    floor = min((pod.deletion_cost for pod in pods if pod.name not in names), default=0)
    return Removal(role, pool, count, tuple(chosen), min(floor, 0) - 1)


def marks_to_write(removal: Removal) -> list[PodSummary]:
    """The chosen pods whose cost is not already the one to write."""
    return [pod for pod in removal.chosen if pod.deletion_cost != removal.cost]
