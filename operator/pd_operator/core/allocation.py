"""From a role's capacity need to replicas per pool, and the limits on how fast pools move.

Pools of a role are filled in preference order: when the first is full (capacity) or at its
max, the rest spills to the next. Shrinking removes from the least preferred pool first.
Stabilization follows the HPA: over the scale-up window the lowest recommendation wins, over the
scale-down window the highest, so a size is only left after the window agrees.
"""

import math
from collections.abc import Sequence
from dataclasses import dataclass

from pd_operator.api.spec import PoolSpec, RatioGuardrail
from pd_operator.api.status import LimitedBy
from pd_operator.core.capacity import FreeCapacity
from pd_operator.core.decision import PoolObservation

EPSILON = 1e-9
Run = tuple[float, float, int]  # (first, last decision time, recommended replicas)


@dataclass(frozen=True)
class Slot:
    """One pool as allocation sees it."""

    pool: PoolSpec
    current: int  # the pool's replicas now (what its Deployment asks for)
    placeable: int  # replicas placed on a node, or with room reserved for them
    weight: float  # capacity of one replica, in the role's capacity units
    blocked: bool = False  # some pods are unschedulable (the only hint when capacity is unknown)


def clamp(pool: PoolSpec, value: int) -> int:
    """`value` within the pool's replicas.min and max."""
    return max(pool.replicas.min, min(pool.replicas.max, value))


def ceiling(slot: Slot, placed: int, ledger: FreeCapacity | None) -> int | None:
    """Most replicas the pool can have when `placed` of them hold room already; None: no limit
    is known."""
    if ledger is None:
        return placed if slot.blocked else None
    return placed + ledger.fits(slot.pool)


def reserve(
    pool: PoolSpec, seen: PoolObservation, ledger: FreeCapacity | None
) -> tuple[int, FreeCapacity | None]:
    """The pool's placeable replicas (bound to a node, or waiting with room that this takes
    from the ledger, so it is not promised again) and the ledger after; without a node view,
    all but the unschedulable."""
    if ledger is None:
        return seen.replicas - seen.unschedulable, None
    scheduled = seen.replicas - seen.unschedulable if seen.scheduled is None else seen.scheduled
    if seen.replicas <= scheduled:
        return scheduled, ledger  # nothing waits to be bound (the usual case): no node scan
    fitting = min(seen.replicas - scheduled, ledger.fits(pool))
    return scheduled + fitting, ledger.take(pool, fitting)


@dataclass(frozen=True)
class Allocation:
    """Replicas per pool for a need, and why pools got less than they were asked for."""

    replicas: dict[str, int]
    limits: dict[str, LimitedBy]
    short: LimitedBy | None  # the role as a whole could not reach its need: capacity or bounds


def grow(slots: Sequence[Slot], target: float, ledger: FreeCapacity | None) -> Allocation:
    """Add replicas in preference order until the role has `target` capacity."""
    replicas = {s.pool.name: s.placeable for s in slots}
    limits: dict[str, LimitedBy] = {}
    missing = target - sum(s.placeable * s.weight for s in slots)
    for slot in slots:
        if missing <= EPSILON:
            break
        name = slot.pool.name
        wanted = math.ceil(missing / slot.weight - EPSILON)
        top = slot.pool.replicas.max
        why: LimitedBy = "bounds"
        room = ceiling(slot, replicas[name], ledger)
        if room is not None and room < top:
            top, why = room, "capacity"
        added = max(0, min(wanted, top - replicas[name]))
        if added < wanted:
            limits[name] = why
        if ledger is not None:
            ledger = ledger.take(slot.pool, added)
        replicas[name] += added
        missing -= added * slot.weight
    short: LimitedBy | None = None
    if missing > EPSILON:
        short = "capacity" if "capacity" in limits.values() else "bounds"
    return Allocation(replicas, limits, short)


def shrink(slots: Sequence[Slot], floor: float) -> dict[str, int]:
    """Remove replicas, least preferred pool first, while the role keeps `floor` capacity."""
    replicas = {s.pool.name: s.placeable for s in slots}
    total = sum(s.placeable * s.weight for s in slots)
    for slot in reversed(slots):
        name = slot.pool.name
        while replicas[name] > slot.pool.replicas.min and total - slot.weight >= floor - EPSILON:
            replicas[name] -= 1
            total -= slot.weight
    return replicas


def one_less(slots: Sequence[Slot]) -> float:
    """The capacity floor at which `shrink` removes exactly one replica (least preferred)."""
    total = sum(s.placeable * s.weight for s in slots)
    for slot in reversed(slots):
        if slot.placeable > slot.pool.replicas.min:
            return total - slot.weight
    return total


def record(runs: Sequence[Run], now: float, replicas: int, keep_seconds: float) -> tuple[Run, ...]:
    """The recommendation history with this decision added; runs older than the windows drop.

    Equal consecutive recommendations share one run, so a steady pool keeps one entry.
    """
    kept = [run for run in runs if run[1] > now - keep_seconds]
    if kept and kept[-1][2] == replicas:
        kept[-1] = (kept[-1][0], now, replicas)
    else:
        kept.append((now, now, replicas))
    return tuple(kept)


def record_ready(
    runs: Sequence[tuple[float, int]], now: float, ready: int, keep_seconds: float
) -> tuple[tuple[float, int], ...]:
    """The Ready-count history with this observation added: (since, ready) runs, keeping the
    run in force at the start of the last `keep_seconds` and every later one."""
    kept = list(runs)
    if not kept or kept[-1][1] != ready:
        kept.append((now, ready))
    while len(kept) > 1 and kept[1][0] <= now - keep_seconds:
        kept.pop(0)
    return tuple(kept)


def stabilize(
    current: int,
    raw: int,
    *,
    runs: Sequence[Run],
    now: float,
    up_seconds: float,
    down_seconds: float,
    since: float | None,
) -> int:
    """The HPA's stabilization: up to the lowest recommendation of the up window, down to the
    highest of the down window.

    Until the policy has watched a whole down window (new pool, lost state), the current size
    counts as one of its recommendations: an unseen window is not a quiet one.
    """
    up = min([raw] + [value for _, last, value in runs if last > now - up_seconds])
    downs = [raw] + [value for _, last, value in runs if last > now - down_seconds]
    if down_seconds > 0 and (since is None or now - since < down_seconds):
        downs.append(current)
    value = max(current, up)
    return min(value, max(downs))


def step_limit(current: int, value: int, up_step: int, down_step: int) -> int:
    """Move at most `up_step` up or `down_step` down from `current`."""
    return max(current - down_step, min(current + up_step, value))


def ratio_percent(prefill: int, decode: int) -> float:
    """Prefill replicas as a percentage of decode replicas (inf with no decode replica)."""
    if decode == 0:
        return math.inf if prefill else 100.0
    return 100 * prefill / decode


def _add(
    slots: Sequence[Slot],
    values: dict[str, int],
    count: int,
    up_step: int,
    ledger: FreeCapacity | None,
) -> tuple[dict[str, int], FreeCapacity | None]:
    values = dict(values)
    for slot in slots:
        if count <= 0:
            break
        name = slot.pool.name
        top = min(slot.pool.replicas.max, slot.current + up_step)
        room = ceiling(slot, values[name], ledger)
        if room is not None:
            top = min(top, room)
        added = max(0, min(count, top - values[name]))
        if ledger is not None:
            ledger = ledger.take(slot.pool, added)
        values[name] += added
        count -= added
    return values, ledger


def _trim(slots: Sequence[Slot], values: dict[str, int], count: int) -> dict[str, int]:
    values = dict(values)
    for slot in reversed(slots):
        name = slot.pool.name
        removed = max(0, min(count, values[name] - max(slot.current, slot.pool.replicas.min)))
        values[name] -= removed
        count -= removed
    return values


@dataclass(frozen=True)
class RatioRepair:
    """Replicas after the ratio guardrail, for the pools it may move."""

    prefill: dict[str, int]
    decode: dict[str, int]


def repair_ratio(
    guard: RatioGuardrail,
    *,
    prefill: Sequence[Slot],
    decode: Sequence[Slot],
    values: RatioRepair,
    fixed: tuple[int, int],
    up_step: int,
    ledger: FreeCapacity | None,
) -> RatioRepair:
    """Bring prefill*100/decode into [minPercent, maxPercent].

    The smaller side grows first (capacity, bounds and step permitting); what that cannot fix
    is taken out of the larger side's growth in this decision. Replicas that already serve are
    never removed for the ratio. `fixed` are replicas of pools the guardrail may not move (a role
    held for missing metrics), prefill then decode.
    """
    p_values, d_values = values.prefill, values.decode

    def totals() -> tuple[int, int]:
        return fixed[0] + sum(p_values.values()), fixed[1] + sum(d_values.values())

    p_total, d_total = totals()
    if 100 * p_total < guard.min_percent * d_total:
        p_values, ledger = _add(
            prefill, p_values, -(-guard.min_percent * d_total // 100) - p_total, up_step, ledger
        )
        p_total, d_total = totals()
        allowed = 100 * p_total // guard.min_percent
        d_values = _trim(decode, d_values, d_total - allowed)
    elif 100 * p_total > guard.max_percent * d_total:
        d_values, ledger = _add(
            decode, d_values, -(-100 * p_total // guard.max_percent) - d_total, up_step, ledger
        )
        p_total, d_total = totals()
        allowed = guard.max_percent * d_total // 100
        p_values = _trim(prefill, p_values, p_total - allowed)
    return RatioRepair(p_values, d_values)
