"""Scaling mode External: each role's replicas come from its PDPool, within the object's limits.

HPA, KEDA or a GitOps tool writes a PDPool's `spec.replicas` (through `/scale`); the operator
creates the PDPool with what the role runs then and never writes `spec.replicas` again. The
request is spread over the role's pools as the policy spreads a need (`core.allocation`:
preference order and spill-over up, least preferred first down) and held to `replicas.min/max`,
free capacity and the prefill:decode guardrail, with the policy's own code. Whatever differs
from the request is said per role: in the PDDeployment's status (`externalScaling`, the
condition `ExternalScaling`, an event when it changes) and in the PDPool's status.
"""

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pd_operator.api import PDDeployment, Role
from pd_operator.api.pdpool import POOL_KIND
from pd_operator.api.status import LimitedBy
from pd_operator.core import reasons
from pd_operator.core.allocation import (
    RatioRepair,
    Slot,
    clamp,
    grow,
    ratio_percent,
    repair_ratio,
    reserve,
    shrink,
)
from pd_operator.core.capacity import FreeCapacity
from pd_operator.core.children import ROLES, PoolKey, pod_selector, workload_key
from pd_operator.core.decision import PoolObservation, running_nodes
from pd_operator.core.naming import pdpool_name
from pd_operator.core.reconcile import ChildKey, EventSpec, all_pools
from pd_operator.core.status import ConditionSpec, ScalingView

# Decode first, as in the policy: it claims shared nodes first.
ORDER: tuple[Role, Role] = ("decode", "prefill")
# What bounded a role, in the words of the override message.
LIMIT_WORDS: dict[LimitedBy, str] = {
    "capacity": "capacity allows",
    "ratio": "the prefill:decode ratio guardrail allows",
}


@dataclass(frozen=True)
class RoleOutcome:
    """One role: what its PDPool asks and what the operator runs."""

    role: Role
    pdpool: str
    requested: int | None  # None: no PDPool of ours (not created yet, or a name conflict)
    replicas: int
    limited_by: LimitedBy
    message: str  # empty when the request is met

    def to_status(self) -> dict[str, Any]:
        """The role's entry of status.externalScaling."""
        entry: dict[str, Any] = {"role": self.role, "pdPool": self.pdpool}
        if self.requested is not None:
            entry["requestedReplicas"] = self.requested
        # Every field with a schema default written out: the stored form is compared with it.
        return entry | {
            "replicas": self.replicas,
            "limitedBy": self.limited_by,
            "message": self.message,
        }


@dataclass(frozen=True)
class ExternalDecision:
    """Replicas per pool (what `reconcile.plan_children(decisions=...)` takes) and per role."""

    replicas: dict[PoolKey, int]
    roles: dict[Role, RoleOutcome]
    ratio_note: str = ""  # the guardrail is still violated (replicas that serve stay)


def requested_replicas(
    pdd: PDDeployment, children: Mapping[ChildKey, Mapping[str, Any]]
) -> dict[Role, int | None]:
    """spec.replicas of each role's PDPool among the children (owned ones only)."""
    found: dict[Role, int | None] = {}
    for role in ROLES:
        pdpool = children.get((pdd.api_version, POOL_KIND, pdpool_name(pdd.metadata.name, role)))
        value = ((pdpool or {}).get("spec") or {}).get("replicas")
        found[role] = value if isinstance(value, int) and value >= 0 else None
    return found


def _message(role: Role, asked: int, got: int, limit: LimitedBy) -> str:
    if limit in LIMIT_WORDS:
        words = LIMIT_WORDS[limit]
        if limit == "ratio" and got > asked:
            words = "the prefill:decode ratio guardrail needs"
    else:
        words = "replicas.min keeps" if got > asked else "replicas.max allows"
    return f"{role}: PDPool asks {asked}, {words} {got}"


def decide_external(
    pdd: PDDeployment,
    requested: Mapping[Role, int | None],
    pools: Mapping[PoolKey, PoolObservation],
    capacity: FreeCapacity | None,
) -> ExternalDecision:
    """Replicas per pool for the roles' requests; a role without one holds what it runs."""
    # Required placement: only the domain its pods run in.
    ledger = None if capacity is None else capacity.in_domain(pdd.spec, running_nodes(pools))
    slots: dict[Role, list[Slot]] = {role: [] for role in ROLES}
    for role in ORDER:
        for pool in pdd.spec.pools(role):
            seen = pools.get((role, pool.name), PoolObservation(pool.replicas.min))
            placeable, ledger = reserve(pool, seen, ledger)
            slots[role].append(Slot(pool, seen.replicas, placeable, 1.0, seen.unschedulable > 0))
    values: dict[Role, dict[str, int]] = {}
    short: dict[Role, LimitedBy | None] = dict.fromkeys(ROLES)
    for role in ORDER:
        asked = requested.get(role)
        if asked is None:
            values[role] = {s.pool.name: s.current for s in slots[role]}
            continue
        if asked > sum(s.placeable for s in slots[role]):
            allocation = grow(slots[role], asked, ledger)
            raw, short[role] = allocation.replicas, allocation.short
        else:
            raw = shrink(slots[role], asked)
        values[role] = {s.pool.name: clamp(s.pool, raw[s.pool.name]) for s in slots[role]}
        for slot in slots[role]:
            added = values[role][slot.pool.name] - slot.placeable
            if ledger is not None and added > 0:
                ledger = ledger.take(slot.pool, added)
    allocated = {role: sum(values[role].values()) for role in ROLES}
    ratio_note = ""
    guard = pdd.spec.scaling.prefill_to_decode_ratio
    if guard is not None:
        held = {role for role in ROLES if requested.get(role) is None}
        movable = {role: [] if role in held else slots[role] for role in ROLES}
        repaired = repair_ratio(
            guard,
            prefill=movable["prefill"],
            decode=movable["decode"],
            values=RatioRepair(
                {s.pool.name: values["prefill"][s.pool.name] for s in movable["prefill"]},
                {s.pool.name: values["decode"][s.pool.name] for s in movable["decode"]},
            ),
            fixed=(
                allocated["prefill"] if "prefill" in held else 0,
                allocated["decode"] if "decode" in held else 0,
            ),
            # Rate is the external scaler's: the guardrail may move a role all the way.
            up_step=sum(pool.replicas.max for _, pool in all_pools(pdd)),
            ledger=ledger,
        )
        for role, fixed in (("prefill", repaired.prefill), ("decode", repaired.decode)):
            values[role] |= fixed
        percent = ratio_percent(*(sum(values[role].values()) for role in ROLES))
        if not guard.min_percent <= percent <= guard.max_percent:
            ratio_note = (
                f"prefill:decode {percent:.0f}% outside [{guard.min_percent}, "
                f"{guard.max_percent}]%: replicas that serve are not removed for it"
            )
    outcomes: dict[Role, RoleOutcome] = {}
    for role in ROLES:
        asked, total = requested.get(role), sum(values[role].values())
        name = pdpool_name(pdd.metadata.name, role)
        limit: LimitedBy = "none"
        if asked is None:
            message = f"{role}: no PDPool {name} of this PDDeployment: holding {total}"
        elif total == asked:
            message = ""
        else:
            if total != allocated[role]:
                limit = "ratio"
            elif total < asked and short[role] == "capacity":
                limit = "capacity"
            else:
                limit = "bounds"
            message = _message(role, asked, total, limit)
        outcomes[role] = RoleOutcome(role, name, asked, total, limit, message)
    replicas = {(role, name): n for role in ROLES for name, n in values[role].items()}
    return ExternalDecision(replicas, outcomes, ratio_note)


def external_view(decision: ExternalDecision, previous: Mapping[str, Any]) -> ScalingView:
    """The status fields, condition and events of a decision; an event only when what is
    overridden changes (not on every pass that finds it so)."""
    roles = decision.roles.values()
    overrides = [o.message for o in roles if o.message and o.requested is not None]
    overrides += [decision.ratio_note] if decision.ratio_note else []
    missing = [o.message for o in decision.roles.values() if o.requested is None]
    if missing:
        condition = ConditionSpec(
            reasons.EXTERNAL_SCALING, None, reasons.PDPOOL_MISSING, "; ".join(missing + overrides)
        )
    elif overrides:
        condition = ConditionSpec(
            reasons.EXTERNAL_SCALING, False, reasons.OVERRIDDEN, "; ".join(overrides)
        )
    else:
        asked = ", ".join(f"{o.role} {o.replicas}" for o in decision.roles.values())
        condition = ConditionSpec(
            reasons.EXTERNAL_SCALING, True, reasons.AS_REQUESTED, f"as the PDPools ask: {asked}"
        )
    before: Mapping[str, Any] = next(
        (c for c in previous.get("conditions") or [] if c.get("type") == reasons.EXTERNAL_SCALING),
        {},
    )
    events = []
    if overrides and before.get("message") != condition.message:
        events.append(EventSpec("Warning", reasons.EVENT_SCALE_OVERRIDDEN, "; ".join(overrides)))
    return ScalingView(
        conditions=[condition],
        events=events,
        external=[o.to_status() for o in decision.roles.values()],
    )


def pdpool_status(
    pdd: PDDeployment,
    role: Role,
    children: Mapping[ChildKey, Mapping[str, Any]],
    outcome: RoleOutcome,
    desired: int,
) -> dict[str, Any]:
    """A PDPool's status: the role's pods (actual and Ready), what the operator runs, why it
    differs from spec.replicas, and the selector of the role's pods."""
    replicas = ready = 0
    for pool in pdd.spec.pools(role):
        observed = (children.get(workload_key(pdd.metadata.name, role, pool)) or {}).get(
            "status"
        ) or {}
        replicas += observed.get("replicas", 0)
        ready += observed.get("readyReplicas", 0)
    return {
        "replicas": replicas,
        "readyReplicas": ready,
        "desiredReplicas": desired,
        "limitedBy": outcome.limited_by,
        "message": outcome.message,
        "selector": pod_selector(pdd.metadata.name, role),
    }


def pdpool_status_changes(
    pdd: PDDeployment,
    children: Mapping[ChildKey, Mapping[str, Any]],
    decision: ExternalDecision,
    replicas: Mapping[PoolKey, int],
) -> list[tuple[Mapping[str, Any], dict[str, Any]]]:
    """(PDPool, new status) for each owned PDPool whose status is not what it should be."""
    changes: list[tuple[Mapping[str, Any], dict[str, Any]]] = []
    for role in ROLES:
        key = (pdd.api_version, POOL_KIND, pdpool_name(pdd.metadata.name, role))
        pdpool = children.get(key)
        if pdpool is None:
            continue
        desired = sum(n for (r, _), n in replicas.items() if r == role)
        status = pdpool_status(pdd, role, children, decision.roles[role], desired)
        if (pdpool.get("status") or {}) != status:
            changes.append((pdpool, status))
    return changes
