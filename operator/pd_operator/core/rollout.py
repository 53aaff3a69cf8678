"""A rollout across roles: new prefill hands off to new decode only, and the old revision serves
until the new one is Ready.

A change of what the engines must agree on (`children.revision`) does not roll each pool on its
own. Each pool's own workload (the name it always had) keeps the old revision while a surge
workload per pool, `{workload}-{revision}`, starts the new one with what free capacity holds.
Once every surge pool is Ready, the routers switch their selectors to the new revision; once
they have rolled, the pools' own workloads take the new revision in place (one replica at a
time, the surge serving meanwhile), and when those are Ready the surge workloads go. Names of
steady-state objects never change, and the cards a pool holds are reused, not doubled.
"""

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from pd_operator.api import PDDeployment, PoolSpec, Role
from pd_operator.core.capacity import FreeCapacity
from pd_operator.core.children import (
    LABEL_REVISION,
    LWS_KIND,
    PROGRESS_DEADLINE_SECONDS,
    ROLES,
    Manifest,
    PoolKey,
    build_workload,
    child_key,
    revision,
    workload_key,
)
from pd_operator.core.naming import bounded_name, router_name
from pd_operator.core.placement import advertised

ChildKey = tuple[str, str, str]
RolloutState = Literal["Progressing", "Complete", "Stalled"]


@dataclass(frozen=True)
class Rollout:
    """Where a rollout of `revision` over `previous` stands (status.rollout)."""

    revision: str
    previous: str | None  # None: no longer known from the objects (status keeps it)
    state: RolloutState
    message: str
    started_at: str | None = None


@dataclass
class RolloutPlan:
    """What the rollout adds to the children plan."""

    serving: str  # the revision the routers select
    surge: list[Manifest]  # surge workloads to keep (applied like any child)
    frozen: set[str]  # pool workloads that keep their old revision for now (not applied)
    rollout: Rollout | None = None


def workload_revision(obj: Mapping[str, Any]) -> str | None:
    """The revision label of a workload's (leader) pod template; None on one built before
    revisions existed."""
    spec = obj.get("spec") or {}
    template = spec.get("template")
    if obj.get("kind") == LWS_KIND:
        template = (spec.get("leaderWorkerTemplate") or {}).get("leaderTemplate")
    labels = ((template or {}).get("metadata") or {}).get("labels") or {}
    value = labels.get(LABEL_REVISION)
    return str(value) if value else None


def surge_name(base: str, revision: str) -> str:
    """The surge workload of a pool for one revision."""
    return bounded_name(f"{base}-{revision}")


def build_surge(
    pdd: PDDeployment, role: Role, pool: PoolSpec, replicas: int, revision: str
) -> Manifest:
    """The pool's workload as `build_workload` makes it, under the surge name, selecting its
    revision's pods only; a Deployment's progress deadline is `spec.rollout`'s."""
    manifest = build_workload(pdd, role, pool, replicas)
    name = surge_name(manifest["metadata"]["name"], revision)
    labels = {**manifest["metadata"]["labels"], LABEL_REVISION: revision}
    manifest["metadata"] = {**manifest["metadata"], "name": name, "labels": labels}
    spec = manifest["spec"]
    if manifest["kind"] == "Deployment":
        match = spec["selector"]["matchLabels"]
        spec["selector"] = {"matchLabels": {**match, LABEL_REVISION: revision}}
        deadline = pdd.spec.rollout.progress_deadline_seconds
        spec["progressDeadlineSeconds"] = deadline or PROGRESS_DEADLINE_SECONDS
    return manifest


def surge(obj: Mapping[str, Any]) -> bool:
    """Whether a workload is a rollout's surge (only those carry the revision themselves)."""
    return LABEL_REVISION in (obj["metadata"].get("labels") or {})


def _ready(obj: Mapping[str, Any] | None) -> int:
    return int(((obj or {}).get("status") or {}).get("readyReplicas") or 0)


def _wanted(obj: Mapping[str, Any] | None) -> int:
    return int(((obj or {}).get("spec") or {}).get("replicas") or 0)


def rolled_out(obj: Mapping[str, Any] | None) -> bool:
    """A workload whose pods all run its current template and are Ready."""
    if obj is None:
        return False
    status = obj.get("status") or {}
    wanted = _wanted(obj)
    if obj.get("kind") == LWS_KIND:
        updating = any(
            c.get("type") == "UpdateInProgress" and c.get("status") == "True"
            for c in status.get("conditions") or []
        )
        generation_seen = not updating
    else:
        generation = obj["metadata"].get("generation", 0)
        generation_seen = status.get("observedGeneration", 0) >= generation
    return bool(
        generation_seen
        and status.get("updatedReplicas", 0) >= wanted
        and _ready(obj) >= wanted
        and status.get("replicas", 0) == wanted
    )


def _deadline_exceeded(obj: Mapping[str, Any] | None) -> bool:
    return any(
        c.get("type") == "Progressing" and c.get("reason") == "ProgressDeadlineExceeded"
        for c in ((obj or {}).get("status") or {}).get("conditions") or []
    )


def plan_rollout(
    pdd: PDDeployment,
    children: Mapping[ChildKey, Mapping[str, Any]],
    replicas: Mapping[PoolKey, int],
    free: Callable[[], FreeCapacity] | None = None,
) -> RolloutPlan:
    """Which revision the routers select, which surge workloads run and which pool workloads
    wait, from what exists now (level-based: no state besides the objects). `free` gives the
    free capacity that limits the surge (None: unknown, the surge asks for every replica)."""
    name, target = pdd.metadata.name, revision(pdd)
    pools = [(role, pool) for role in ROLES for pool in pdd.spec.pools(role)]
    bases = {
        (role, pool.name): children.get(workload_key(name, role, pool)) for role, pool in pools
    }
    older = [
        found
        for base in bases.values()
        if base is not None and (found := workload_revision(base)) not in (None, target)
    ]
    if not older:
        return _finishing(pdd, children, target)
    previous = older[0]
    surge: list[Manifest] = []
    frozen: set[str] = set()
    ledger = free() if free is not None else None
    stalled: list[str] = []
    ready = dict.fromkeys(ROLES, 0)
    wanted = dict.fromkeys(ROLES, 0)
    started = dict.fromkeys(ROLES, 0)
    all_ready = True
    for role, pool in pools:
        base = bases[(role, pool.name)]
        if base is None or workload_revision(base) in (None, target):
            continue  # a new pool, or one already on the new revision: applied as usual
        key = workload_key(name, role, pool)
        frozen.add(key[2])
        existing = children.get((key[0], key[1], surge_name(key[2], target)))
        desired = replicas[(role, pool.name)]
        count = desired
        if ledger is not None and _judged(ledger, pool):
            # What fits beside the old revision, never less than it has already.
            count = min(desired, max(_wanted(existing), ledger.fits(pool)))
            ledger = ledger.take(pool, count - _wanted(existing))
        surge.append(build_surge(pdd, role, pool, count, target))
        wanted[role] += desired
        started[role] += count
        ready[role] += min(_ready(existing), count)
        all_ready = all_ready and existing is not None and _ready(existing) >= count
        if _deadline_exceeded(existing):
            stalled.append(f"{role}/{pool.name}")
    short = [role for role in ROLES if wanted[role] and not started[role]]
    all_ready = all_ready and not any(wanted[role] and not ready[role] for role in ROLES)
    router = children.get(("apps/v1", "Deployment", router_name(name)))
    switched = router is not None and workload_revision(router) == target
    serving = target if all_ready or switched else previous
    routed = switched and rolled_out(router) if pdd.spec.router.enabled else all_ready
    if routed:
        frozen = set()  # the pools' own workloads take the new revision now, the surge serving
    state, message = _progress(
        target, previous, stalled=stalled, short=short, ready=all_ready, frozen=bool(frozen)
    )
    rollout = Rollout(target, previous, state, message, _started(children, surge))
    return RolloutPlan(serving=serving, surge=surge, frozen=frozen, rollout=rollout)


def _progress(
    target: str, previous: str, *, stalled: list[str], short: list[Role], ready: bool, frozen: bool
) -> tuple[RolloutState, str]:
    """The state and message of a rollout that still has pools on the old revision."""
    if stalled:
        return "Stalled", (
            f"pods of revision {target} not Ready within the progress deadline in "
            f"{', '.join(stalled)}; revision {previous} keeps serving"
        )
    if short:
        return "Progressing", (
            f"waiting for free capacity for one {' and one '.join(short)} replica of revision "
            f"{target}; revision {previous} keeps serving"
        )
    if not ready:
        return "Progressing", f"starting revision {target} beside revision {previous}"
    if frozen:
        return "Progressing", f"switching the routers to revision {target}"
    return "Progressing", f"replacing the pods of revision {previous}"


def _judged(ledger: FreeCapacity, pool: PoolSpec) -> bool:
    """Free room is judged only once some node advertises the pool's cards at all (as in
    `reconcile.unplaceable`)."""
    return advertised((room.node for room in ledger.rooms), pool.accelerator.resource_name)


def _finishing(
    pdd: PDDeployment, children: Mapping[ChildKey, Mapping[str, Any]], target: str
) -> RolloutPlan:
    """Every pool's own workload is on the target revision: the surge workloads of the target
    serve (at the replicas they have) until those are rolled out, then they go."""
    name = pdd.metadata.name
    surge: list[Manifest] = []
    done = True
    for role in ROLES:
        for pool in pdd.spec.pools(role):
            key = workload_key(name, role, pool)
            existing = children.get((key[0], key[1], surge_name(key[2], target)))
            if existing is None:
                continue
            surge.append(build_surge(pdd, role, pool, _wanted(existing), target))
            base = children.get(key)
            done = done and (base is None or rolled_out(base))
    if not surge:
        return RolloutPlan(serving=target, surge=[], frozen=set())
    if done:
        complete = Rollout(target, None, "Complete", f"revision {target} serves")
        return RolloutPlan(serving=target, surge=[], frozen=set(), rollout=complete)
    message = f"replacing the pods of the previous revision with revision {target}"
    rollout = Rollout(target, None, "Progressing", message, _started(children, surge))
    return RolloutPlan(serving=target, surge=surge, frozen=set(), rollout=rollout)


def _started(children: Mapping[ChildKey, Mapping[str, Any]], surge: list[Manifest]) -> str | None:
    """When the rollout began: the creation of its first surge workload."""
    times = [
        str(stamp)
        for manifest in surge
        if (obj := children.get(child_key(manifest)))
        and (stamp := obj["metadata"].get("creationTimestamp"))
    ]
    return min(times, default=None)
