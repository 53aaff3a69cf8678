"""Status of a PDDeployment from observed children and pods: pools, conditions, events.

Ready, Reconciling and Stalled follow kstatus (what Flux and Argo CD read): exactly one of
Ready=True, Reconciling=True or Stalled=True describes a settled, progressing or stuck object.
"""

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from pd_operator.api import PDDeployment
from pd_operator.core import reasons
from pd_operator.core.children import LWS_KIND, ROLES, PoolKey, revision, workload_key
from pd_operator.core.naming import router_name
from pd_operator.core.observe import PodSummary
from pd_operator.core.profiles import unknown_profiles
from pd_operator.core.reconcile import ChildKey, EventSpec, Problem, all_pools, replica_pods
from pd_operator.core.rollout import Rollout
from pd_operator.core.router import endpoint_url

# Status fields that the autoscaler owns; carried over unchanged when it has nothing new.
FOREIGN_FIELDS = ("observed", "lastDecision", "policyMemory")
AUTOSCALER_CONDITIONS = (
    reasons.SLO_MET,
    reasons.METRICS_AVAILABLE,
    reasons.METRICS_CONFIGURED,
    reasons.CAPACITY_AVAILABLE,
    reasons.SEASONAL_HISTORY,
)


@dataclass(frozen=True)
class ConditionSpec:
    """A condition the autoscaler asks the reconciler to write."""

    type: str
    status: bool | None  # None: Unknown
    reason: str
    message: str


@dataclass
class ScalingView:
    """What the autoscaler last saw and decided for one PDDeployment, for its status."""

    observed: dict[str, Any] | None = None
    last_decision: dict[str, Any] | None = None
    policy_memory: str | None = None  # PolicyState as JSON
    conditions: list[ConditionSpec] = field(default_factory=list)
    events: list[EventSpec] = field(default_factory=list)
    external: list[dict[str, Any]] | None = None  # status.externalScaling (mode External)


def _condition(
    kind: str,
    *,
    status: bool | None,
    reason: str,
    message: str,
    generation: int | None,
    previous: Mapping[str, Mapping[str, Any]],
    now: str,
) -> dict[str, Any]:
    text = "Unknown" if status is None else "True" if status else "False"
    before = previous.get(kind)
    changed = before is None or before.get("status") != text
    return {
        "type": kind,
        "status": text,
        "observedGeneration": generation,
        "lastTransitionTime": now if changed else before["lastTransitionTime"],  # type: ignore[index]
        "reason": reason,
        "message": bounded_message(message),
    }


# metav1.Condition allows 32,768 characters; a message that repeats a huge invalid value (or
# joins many problems) is cut well before, so the status write is never refused.
MAX_MESSAGE_LENGTH = 4096


def bounded_message(message: str) -> str:
    """`message`, cut to MAX_MESSAGE_LENGTH characters with a note of how much was left out."""
    if len(message) <= MAX_MESSAGE_LENGTH:
        return message
    note = f" ... ({len(message) - MAX_MESSAGE_LENGTH} more characters)"
    return message[: MAX_MESSAGE_LENGTH - len(note)] + note


def _pool_rolled_out(deployment: Mapping[str, Any] | None, desired: int, kind: str) -> bool:
    if deployment is None:
        return desired == 0
    status = deployment.get("status") or {}
    generation = deployment["metadata"].get("generation", 0)
    if kind == LWS_KIND:
        # A LeaderWorkerSet reports no observedGeneration; while it rolls out, it says so.
        generation = 0
        if any(
            c.get("type") == "UpdateInProgress" and c.get("status") == "True"
            for c in status.get("conditions") or []
        ):
            return False
    return bool(
        status.get("observedGeneration", 0) >= generation
        and status.get("updatedReplicas", 0) >= desired
        and status.get("readyReplicas", 0) >= desired
        and status.get("replicas", 0) == desired
    )


def _router_status(
    pdd: PDDeployment, children: Mapping[ChildKey, Mapping[str, Any]]
) -> dict[str, int] | None:
    """The router's replicas, or None without a router. Desired: what its Deployment asks
    (the HPA's choice when it scales the router), at least replicas.min."""
    if not pdd.spec.router.enabled:
        return None
    deployment = children.get(("apps/v1", "Deployment", router_name(pdd.metadata.name))) or {}
    observed = deployment.get("status") or {}
    asked = (deployment.get("spec") or {}).get("replicas", 0)
    return {
        "replicas": observed.get("replicas", 0),
        "readyReplicas": observed.get("readyReplicas", 0),
        "desiredReplicas": max(asked, pdd.spec.router.replicas.min),
    }


def _pool_problems(
    where: str, pods: Sequence[PodSummary], observed: Mapping[str, Any]
) -> list[Problem]:
    """What stops a pool's pods: an image that cannot be pulled, or a Deployment whose
    ReplicaSet cannot create pods at all (its ReplicaFailure condition, e.g. a missing
    ServiceAccount or PriorityClass, or a Pod Security rejection)."""
    problems = []
    images = sorted({p.image_problem for p in pods if p.image_problem})
    if images:
        problems.append(
            Problem(reasons.IMAGE_UNAVAILABLE, f"{where}: image cannot be pulled ({images[0]})")
        )
    for condition in observed.get("conditions") or []:
        if condition.get("type") == "ReplicaFailure" and condition.get("status") == "True":
            message = condition.get("message") or condition.get("reason") or "ReplicaFailure"
            problems.append(Problem(reasons.REPLICA_FAILURE, f"{where}: {message}"))
    return problems


def _router_problems(
    pdd: PDDeployment, children: Mapping[ChildKey, Mapping[str, Any]]
) -> list[Problem]:
    """The router's pods refused like a pool's (Pod Security, a missing PriorityClass)."""
    if not pdd.spec.router.enabled:
        return []
    deployment = children.get(("apps/v1", "Deployment", router_name(pdd.metadata.name))) or {}
    return _pool_problems("router", [], deployment.get("status") or {})


def _router_waiting(router: Mapping[str, int] | None) -> list[str]:
    if router is None or router["readyReplicas"] >= router["desiredReplicas"]:
        return []
    return [f"router {router['readyReplicas']}/{router['desiredReplicas']} ready"]


def compute_status(
    pdd: PDDeployment,
    *,
    children: Mapping[ChildKey, Mapping[str, Any]],
    pods: Sequence[PodSummary],
    replicas: Mapping[PoolKey, int],
    problems: Sequence[Problem],
    previous: Mapping[str, Any],
    now: str,
    scaling: ScalingView | None = None,
    rollout: Rollout | None = None,
) -> tuple[dict[str, Any], list[EventSpec]]:
    """The new status (wire form) and the events its transitions call for.

    `scaling` is the autoscaler's latest view: its fields and conditions go into status as is;
    `rollout` the plan's rollout across roles (`core.rollout`), if one runs or just completed.
    """
    problems = list(problems)
    generation = pdd.metadata.generation
    pools, waiting = [], []
    ready_sum = dict.fromkeys(ROLES, 0)
    desired_sum = dict.fromkeys(ROLES, 0)
    unschedulable_total = 0
    for role, pool in all_pools(pdd):
        key = workload_key(pdd.metadata.name, role, pool)
        deployment = children.get(key)
        observed = (deployment or {}).get("status") or {}
        desired = replicas[(role, pool.name)]
        # One list per replica: a multi-node replica's workers count, the group once.
        groups = replica_pods(role, pool, pods)
        pool_pods = [p for group in groups for p in group]
        unschedulable = sum(any(p.unschedulable for p in group) for group in groups)
        problems += _pool_problems(f"{role} pool {pool.name}", pool_pods, observed)
        ready = observed.get("readyReplicas", 0)
        pools.append(
            {
                "role": role,
                "name": pool.name,
                "replicas": observed.get("replicas", 0),
                "readyReplicas": ready,
                "desiredReplicas": desired,
                "unschedulableReplicas": unschedulable,
            }
        )
        ready_sum[role] += ready
        desired_sum[role] += desired
        unschedulable_total += unschedulable
        if not _pool_rolled_out(deployment, desired, key[1]):
            note = f" ({unschedulable} unschedulable)" if unschedulable else ""
            waiting.append(f"{role}/{pool.name} {ready}/{desired} ready{note}")

    router = _router_status(pdd, children)
    waiting += _router_waiting(router)
    waiting += _rollout_waiting(rollout)
    problems += _router_problems(pdd, children)

    before = {c["type"]: c for c in previous.get("conditions") or []}
    unknown = unknown_profiles(pdd.spec)  # a typo'd profile is said, not silently learned
    stalled = bool(problems)
    ready = not stalled and not waiting
    stall_message = "; ".join(p.message for p in problems)
    wait_message = "waiting for " + ", ".join(waiting) if waiting else "all pools ready"

    def condition(kind: str, status: bool | None, reason: str, message: str) -> dict[str, Any]:
        return _condition(
            kind,
            status=status,
            reason=reason,
            message=message,
            generation=generation,
            previous=before,
            now=now,
        )

    if ready:
        ready_reason = reasons.ALL_POOLS_READY
    else:
        ready_reason = problems[0].reason if stalled else reasons.PODS_NOT_READY
    conditions = [
        condition(reasons.READY, ready, ready_reason, stall_message if stalled else wait_message),
        condition(
            reasons.RECONCILING,
            not ready and not stalled,
            ready_reason if stalled else reasons.PODS_NOT_READY if waiting else reasons.AS_EXPECTED,
            wait_message if waiting and not stalled else "",
        ),
        condition(
            reasons.STALLED,
            stalled,
            problems[0].reason if stalled else reasons.AS_EXPECTED,
            stall_message,
        ),
        condition(
            reasons.PODS_SCHEDULABLE,
            unschedulable_total == 0,
            reasons.UNSCHEDULABLE if unschedulable_total else reasons.ALL_SCHEDULED,
            f"{unschedulable_total} pod(s) cannot be scheduled" if unschedulable_total else "",
        ),
        condition(
            reasons.PROFILES_KNOWN,
            not unknown,
            reasons.UNKNOWN_PROFILE if unknown else reasons.AS_EXPECTED,
            "; ".join(unknown),
        ),
    ]
    status: dict[str, Any] = {
        "observedGeneration": generation,
        "conditions": conditions,
        "pools": pools,
        "replicaSummary": {role: f"{ready_sum[role]}/{desired_sum[role]}" for role in ROLES},
    }
    if router is not None:
        status["endpoint"] = endpoint_url(pdd)
        status["router"] = router
    status.update(_rollout_status(pdd, rollout, previous.get("rollout") or {}, now))
    status.update({k: previous[k] for k in FOREIGN_FIELDS if k in previous})
    if scaling is not None:
        _add_scaling(status, scaling)
        conditions += [condition(c.type, c.status, c.reason, c.message) for c in scaling.conditions]
    else:  # keep the autoscaler's conditions until it says something new
        conditions += [
            c for c in previous.get("conditions") or [] if c["type"] in AUTOSCALER_CONDITIONS
        ]

    return status, _stall_events(before, stalled, stall_message) + _profile_events(before, unknown)


def _rollout_waiting(rollout: Rollout | None) -> list[str]:
    if rollout is None or rollout.state != "Progressing":
        return []
    return [f"rollout: {rollout.message}"]


def _rollout_status(
    pdd: PDDeployment, rollout: Rollout | None, before: Mapping[str, Any], now: str
) -> dict[str, Any]:
    """{"rollout": ...}: the rollout the plan reports, with what only status remembers (its
    start, the revision it replaced); once it is over, the last one, Complete; {} before the
    first rollout."""
    if rollout is None:
        if not before or before.get("state") == "Complete":
            return {"rollout": dict(before)} if before else {}
        current = revision(pdd)  # a rollout given up (the spec went back): what serves now
        return {"rollout": {**before, "revision": current, "state": "Complete", "message": ""}}
    same = before.get("revision") == rollout.revision
    result = {
        "revision": rollout.revision,
        "previousRevision": rollout.previous or (before.get("previousRevision") if same else None),
        "state": rollout.state,
        "message": rollout.message,
        "startedAt": (before.get("startedAt") if same else None) or rollout.started_at or now,
    }
    return {"rollout": {key: value for key, value in result.items() if value is not None}}


def _add_scaling(status: dict[str, Any], scaling: ScalingView) -> None:
    status["observed"] = scaling.observed
    status["lastDecision"] = scaling.last_decision
    if scaling.policy_memory is not None:
        status["policyMemory"] = scaling.policy_memory
    if scaling.external is not None:
        status["externalScaling"] = scaling.external


def _profile_events(before: Mapping[str, Mapping[str, Any]], unknown: list[str]) -> list[EventSpec]:
    """A Warning when a profile name matches no profile (or the list of them changes)."""
    message = bounded_message("; ".join(unknown))
    was = before.get(reasons.PROFILES_KNOWN, {})
    if unknown and (was.get("status") != "False" or was.get("message") != message):
        return [EventSpec("Warning", reasons.EVENT_UNKNOWN_PROFILE, message)]
    return []


def _stall_events(
    before: Mapping[str, Mapping[str, Any]], stalled: bool, message: str
) -> list[EventSpec]:
    """A Warning when the object stalls (or stalls for a new reason); Normal on recovery."""
    was_stalled = before.get(reasons.STALLED, {}).get("status") == "True"
    if stalled and (not was_stalled or before[reasons.STALLED].get("message") != message):
        return [EventSpec("Warning", reasons.EVENT_STALLED, message)]
    if was_stalled and not stalled:
        return [EventSpec("Normal", reasons.EVENT_RECOVERED, "the spec can be served again")]
    return []


def invalid_spec_status(
    generation: int | None, problems: Sequence[str], previous: Mapping[str, Any], now: str
) -> tuple[dict[str, Any], list[EventSpec]]:
    """Status for a stored object the models reject (e.g. a CRD older than the operator).

    Pools and the autoscaler's fields stay as they were: nothing that runs is touched.
    """
    before = {c["type"]: c for c in previous.get("conditions") or []}
    message = "invalid spec: " + "; ".join(problems)
    replaced = {
        kind: _condition(
            kind,
            status=kind == reasons.STALLED,
            reason=reasons.INVALID_SPEC,
            message=message,
            generation=generation,
            previous=before,
            now=now,
        )
        for kind in (reasons.READY, reasons.RECONCILING, reasons.STALLED)
    }
    others = [c for c in previous.get("conditions") or [] if c["type"] not in replaced]
    status = {
        **previous,
        "observedGeneration": generation,
        "conditions": [*replaced.values(), *others],
    }
    return status, _stall_events(before, True, message)
