"""The autoscaler's decision for one PDDeployment and one interval: one pure call.

`decide(spec, observation, state, now)` is what the operator loop and the offline simulator both
call, with the spec resolved once per generation (`core.resolved`). It runs `RULES` in order
over one record of the decision in the making (`_Round`): they read the signals
(`core.control_law`), correct each pool's capacity estimate (`core.learning`), turn each
role's need into replicas per pool (`core.allocation`) within the free capacity
(`core.capacity`); `decide` returns the replicas with the reason, what limited them, and the
policy's new memory. The numbers the rules are tuned by are `core.tuning`'s; the rules and
their reasons are in docs/autoscaling.md.
"""

import itertools
import math
import time
from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from pd_operator.api.spec import PDDeploymentSpec, PoolSpec, ReplicaBounds, Role
from pd_operator.api.status import LimitedBy
from pd_operator.core.allocation import (
    RatioRepair,
    Slot,
    ceiling,
    clamp,
    grow,
    one_less,
    ratio_percent,
    record,
    record_ready,
    repair_ratio,
    reserve,
    shrink,
    stabilize,
    step_limit,
)
from pd_operator.core.capacity import FreeCapacity
from pd_operator.core.control_law import (
    EPSILON,
    RoleLoad,
    backlogged,
    read_load,
    role_need,
)
from pd_operator.core.decision import Decision, Observation, PoolDecision, PoolObservation
from pd_operator.core.learning import (
    RoleCapacity,
    cache_speedup,
    decode_context_tokens,
    decode_utilisation,
    estimate_capacity,
    prefill_utilisation,
    seed_load_seconds,
)
from pd_operator.core.policy_state import PolicyState, PoolMemory, RoleMemory, pool_key
from pd_operator.core.resolved import ResolvedSpec, resolve
from pd_operator.core.schedules import Floor, active_floors
from pd_operator.core.seasonal import forecast
from pd_operator.core.signals import RoleSignals
from pd_operator.core.tuning import TUNING

__all__ = ["Decision", "Observation", "PoolDecision", "PoolObservation", "decide"]

ROLES: tuple[Role, Role] = ("prefill", "decode")
# Decode decides first: it claims shared nodes first, and prefill must know whether decode
# can still grow before it pushes more KV cache at it.
DECISION_ORDER: tuple[Role, Role] = ("decode", "prefill")
# What limited a pool's recommendation before the windows and steps, in words.
RAW_LIMIT_NOTES: dict[LimitedBy, str] = {
    "capacity": "no room on the nodes for more",
    "bounds": "at max",
    "metrics": "demand unreadable: not scaling down",
    "warmup": "the breach waits for the replicas loading or just Ready",
    "fabric": "the KV transfer, not prefill, breaches TTFT: not adding prefill for it",
}
# Which limit names a whole decision when pools were limited by different things.
LIMIT_PRIORITY: tuple[LimitedBy, ...] = (
    "metrics",
    "capacity",
    "ratio",
    "warmup",
    "fabric",
    "schedule",
    "forecast",
    "bounds",
    "rate",
)


@dataclass
class _Pool:
    """One pool while deciding: scratch state local to one `decide` call."""

    role: Role
    spec: PoolSpec
    seen: PoolObservation
    memory: PoolMemory
    placeable: int = 0
    weight: float = 1.0
    raw: int = 0
    value: int = 0
    limited_by: LimitedBy = "none"
    notes: list[str] = field(default_factory=list)
    steady_window: float | None = None  # the short scale-down window that let it shrink sooner
    # A schedule's or the seasonal forecast's floor over replicas.min; `spec` then carries it
    # as its min, so that every rule that keeps a pool at its min keeps it at the floor.
    floor: Floor | None = None

    def hold_at(self, floor: Floor) -> None:
        self.floor = floor
        bounds = ReplicaBounds(min=floor.replicas, max=self.spec.replicas.max)
        self.spec = self.spec.model_copy(update={"replicas": bounds})

    @property
    def current(self) -> int:
        return self.seen.replicas

    def _window_counts(self, now: float, window: float) -> list[int]:
        """The Ready counts in force at some time in the last window, the current one first."""
        runs, start = self.memory.ready_runs, now - window
        ends = [since for since, _ in runs[1:]] + [now]
        in_window = (count for (_, count), end in zip(runs, ends, strict=False) if end > start)
        return [self.seen.ready, *in_window]

    def window_ready(self, now: float, window: float) -> tuple[int, bool]:
        """The fewest replicas Ready at any time in the last window, and whether the Ready count
        held all that window (then the window's signals describe the replicas Ready now)."""
        runs, ready = self.memory.ready_runs, self.seen.ready
        # The first run is when the policy started watching, not a change.
        settled = not runs or (
            runs[-1][1] == ready and (len(runs) == 1 or runs[-1][0] <= now - window)
        )
        return min(self._window_counts(now, window)), settled

    def left_within(self, now: float, window: float) -> bool:
        """Replicas stopped being Ready within the last window (a scale-down, a failure)."""
        return max(self._window_counts(now, window)) > self.seen.ready

    def slot(self) -> Slot:
        blocked = self.seen.unschedulable > 0
        return Slot(self.spec, self.current, self.placeable, self.weight, blocked)

    def move(self, value: int, why: LimitedBy, note: str) -> None:
        if value != self.value:
            self.value, self.limited_by = value, why
            if note not in self.notes:  # a floor may be said at the start and at the end
                self.notes.append(note)


def _bound(pool: _Pool, note: str) -> None:
    """Move the pool's value within its bounds; a floor says it held the pool."""
    if pool.floor is not None and pool.value < pool.floor.replicas:
        pool.move(pool.floor.replicas, pool.floor.limit, pool.floor.note)
    pool.move(clamp(pool.spec, pool.value), "bounds", note)


def _expected_load_seconds(
    resolved: ResolvedSpec, role: Role, pool: PoolSpec, memory: PoolMemory
) -> float:
    """How long a new replica of the pool takes to become Ready: as measured, else the
    profiles' estimate, else TUNING.default_load_seconds."""
    return (
        memory.load_seconds
        or seed_load_seconds(resolved, role, pool)
        or TUNING.default_load_seconds
    )


def _reserve(pools: list[_Pool], ledger: FreeCapacity | None) -> FreeCapacity | None:
    """Room for pods that exist but are not bound yet, so it is not promised again."""
    for pool in pools:
        pool.placeable, ledger = reserve(pool.spec, pool.seen, ledger)
    return ledger


def _mean_prompt(spec: PDDeploymentSpec, loads: dict[Role, RoleLoad], role: Role) -> float:
    """The role's mean prompt; decode engines may not count the prompts whose KV cache they
    receive, and the prompts prefill served are the same ones."""
    return (
        loads[role].mean_prompt_tokens
        or loads["prefill"].mean_prompt_tokens
        or min(
            spec.model.context_length or TUNING.default_prompt_tokens, TUNING.default_prompt_tokens
        )
    )


def _decode_context(
    resolved: ResolvedSpec, load: RoleLoad, pools: list["_Pool"], memory: RoleMemory
) -> tuple[float | None, float | None]:
    """The moving averages of the KV tokens decode holds and of the sequences holding them
    (running, and waiting ones receiving their KV), after this decision's sample. Their ratio
    is the context a sequence holds: a ratio of averages, because a sample of a few sequences
    says little (one long prompt among three read as 37K tokens where the mean is 13K)."""
    tokens, sequences = memory.kv_tokens_mean, memory.kv_sequences_mean
    held = (load.running_requests or 0.0) + (load.waiting_requests or 0.0)
    context = decode_context_tokens(
        resolved, {p.spec.name: p.seen.ready for p in pools}, load.kv_cache_usage, held or None
    )
    if context is None:
        return tokens, sequences
    if tokens is None or sequences is None:
        return context * held, held
    w = TUNING.running_ema_weight
    return w * context * held + (1 - w) * tokens, w * held + (1 - w) * sequences


def _utilisation(
    resolved: ResolvedSpec,
    role: Role,
    capacity: RoleCapacity,
    prompt: float,
    slots: list[Slot],
    *,
    memory: RoleMemory,
    load: RoleLoad,
    demand: float | None = None,
) -> tuple[float, float]:
    """The shares of the estimated capacity the role grows at and shrinks to; prefill's
    growth share is the one of the size that `demand` (tokens/s; default: the load's growth
    demand) needs."""
    cached_share = load.cached_share
    demand = load.growth_demand if demand is None else demand
    if capacity.basis is None:
        return TUNING.target_utilisation, TUNING.scale_down_utilisation
    if role == "decode":
        # A bursty batch swings past the mean: the fixed margins are the most decode may use,
        # less when the batch at the ITL percentile would breach the target.
        room = decode_utilisation(resolved, prompt, memory.batch_dispersion())
        grow_at = min(TUNING.target_utilisation, room)
        return grow_at, grow_at * TUNING.scale_down_utilisation / TUNING.target_utilisation
    replicas = sum(s.placeable for s in slots)
    per_replica = capacity.per_replica

    def grow_share(servers: int) -> float:
        # The queueing estimate only raises the margins: it does not see bursts, nor lengths
        # more varied than it assumes, so it never sizes tighter than the fixed margins would.
        return max(
            TUNING.target_utilisation,
            TUNING.prefill_grow_share
            * prefill_utilisation(
                resolved, per_replica, prompt, servers, cached_share=cached_share
            ),
        )

    grow_at = grow_share(replicas)
    if demand is not None and demand > grow_at * _capacity_of(slots, replicas):
        # More replicas queue less, so each may run hotter: grow to the smallest size that
        # holds the demand at its own share, not at the current size's (which overshot: 2 -> 8
        # replicas where 7 held, and the 8th was shed a window later).
        most = sum(grow(slots, demand / grow_at, None).replicas.values())
        grow_at = next(
            (
                share
                for servers in range(replicas + 1, most + 1)
                if demand <= (share := grow_share(servers)) * _capacity_of(slots, servers)
            ),
            grow_at,
        )
    shrink_at = TUNING.prefill_shrink_share * prefill_utilisation(
        resolved, per_replica, prompt, replicas - 1, cached_share=cached_share
    )
    # A replica shed takes its prefix cache with it: the prefixes it held (its 1/N share, as
    # the router spreads them) come back cold to the replicas left until each is computed
    # again, so those must serve the demand at the hit share less that part. (Without the
    # cache's help at all, a 90 rps chat load held a second replica all hour at 0.04x the
    # TTFT target.) Growing counts on the whole share: a new replica destroys no cache.
    kept_share = cached_share * (replicas - 1) / replicas if replicas > 1 else 0.0
    cold = cache_speedup(resolved, prompt, cached_share) / cache_speedup(
        resolved, prompt, kept_share
    )
    return grow_at, max(TUNING.scale_down_utilisation, shrink_at) / cold


def _capacity_of(slots: list[Slot], replicas: int) -> float:
    """The role's capacity with `replicas` replicas, added in the pools' order of preference
    (as `allocation.grow` adds them) up to each pool's max."""
    total = sum(s.placeable * s.weight for s in slots)
    extra = replicas - sum(s.placeable for s in slots)
    for slot in slots:
        added = max(0, min(extra, slot.pool.replicas.max - slot.placeable))
        total, extra = total + added * slot.weight, extra - added
    return total


def _capacity(
    resolved: ResolvedSpec,
    role: Role,
    *,
    state: PolicyState,
    loads: dict[Role, RoleLoad],
    pools: list[_Pool],
    now: float,
    prompt: float,
) -> RoleCapacity:
    load = loads[role]
    remembered = {
        p.spec.name: p.memory.capacity_per_replica
        for p in pools
        if p.memory.capacity_per_replica is not None
    }
    # Signals over a window in which replicas became Ready (or left) mix two sizes: what they
    # say per replica is no measure until the window has passed. Where replicas only arrived,
    # each served at least the window's rate per replica Ready now: a lower bound, which a
    # latency well under the target lets raise the estimate (else the growth sized on an
    # estimate that low adds a replica that the next settled window sheds).
    window = settle_seconds(resolved.spec, role, loads)
    settled = all(p.window_ready(now, window)[1] for p in pools)
    arrived_only = not settled and not any(p.left_within(now, window) for p in pools)
    # A futile breach says nothing about capacity: replicas were not what it lacked.
    active = load.status == "active" and (settled or arrived_only) and not load.futile
    usable = active and not (
        load.breach_unresolved or load.latency_from_mean or load.tail_only or load.fabric_bound
    )
    memory = state.role(role)
    return estimate_capacity(
        resolved,
        role,
        remembered=remembered,
        basis=memory.capacity_basis,
        factor=memory.capacity_factor,
        pool_factors={
            p.spec.name: p.memory.capacity_factor
            for p in pools
            if p.memory.capacity_factor is not None
        },
        pools_read=load.pools if usable else None,
        ready={p.spec.name: p.seen.ready for p in pools},
        served_tokens_per_second=load.served_tokens_per_second if active else None,
        latency_ratio=load.latency_ratio if usable else None,
        prompt_tokens=max(1, round(prompt)),
        latency_bucket=load.latency_bucket,
        saturated=load.saturated,
        cached_share=load.cached_share,
        bound_only=not settled,
    )


def settle_seconds(spec: PDDeploymentSpec, role: Role, loads: Mapping[Role, RoleLoad]) -> float:
    """How long after a change of Ready replicas the role's signals describe the new size: the
    SLO window over which they are read, and for decode first the time the batch takes to
    turn over. A sequence stays on the replica it started on, so replicas added take only new
    ones and the old ones keep their batch until it finishes: a 2.5x ITL breach on the old
    replica outlasted a one-minute window and read as a capacity 0.45x the real one.

    The mean stay is running over the requests per second prefill serves (Little's law); the
    latency percentile counts tokens, and a token belongs to a sequence longer than the mean
    one by the factor 1 + CV^2 of the lengths (size bias): 2 for lengths spread as an
    exponential distribution (`core.learning.PROMPT_LENGTH_CV2`, the same assumption)."""
    window = float(spec.slo.window_seconds)
    running, requests = loads["decode"].running_requests, loads["prefill"].requests_per_second
    if role == "decode" and running and requests:
        return window + (1 + TUNING.prompt_length_cv2) * float(running) / requests
    return window


def _loading(pools: list[_Pool], now: float) -> bool:
    """Replicas of the last scale-up are placed but not Ready, before their expected ready time."""
    return any(
        p.memory.ready_by is not None and now < p.memory.ready_by and p.seen.ready < p.placeable
        for p in pools
    )


def _arriving_capacity(load: RoleLoad, pools: list[_Pool], now: float, window: float) -> RoleLoad:
    """Mark the load when replicas of the role are loading or became Ready within the window.

    Either way the latency does not show them yet. Replicas that became Ready drain the queue
    that built up before they served. A replica still loading counts only until the load time
    expected for it: one that never becomes Ready is a loss of capacity, not capacity coming.
    """
    arrived = any(p.window_ready(now, window)[0] < p.seen.ready for p in pools)
    if not (arrived or _loading(pools, now)):
        return load
    return replace(load, queue_drained=arrived, capacity_arriving=True)


def _futility(
    pools: list[_Pool], load: RoleLoad, memory: RoleMemory, now: float, window: float
) -> tuple[float | None, bool]:
    """The breach more replicas did not lower (None: none), and whether the last scale-up was
    judged now (its replicas have served a whole window).

    A futile breach stays futile while it is no more than `worse_factor` above the one
    recorded; it ends when the latency comes back under `hold_ratio` of the target. (Not merely
    within the tolerance: a tail set by a few long prompts dips near the target in a window
    without them and comes back with the next ones, and each return would otherwise add
    replicas.)
    """
    ratio = load.latency_ratio
    if load.status != "active" or ratio is None or load.breach_unresolved:
        return None, False  # a reading its bucket cannot place says nothing either way
    if (
        memory.futile_ratio is not None
        and TUNING.hold_ratio <= ratio <= memory.futile_ratio * TUNING.worse_factor
    ):
        return memory.futile_ratio, False
    before, demand_before = memory.latency_ratio_at_scale_up, memory.demand_at_scale_up
    settled = all(p.window_ready(now, window)[1] and p.memory.scaled_up_to is None for p in pools)
    if before is None or not settled:
        return None, False
    if ratio <= TUNING.breach_ratio or before <= TUNING.breach_ratio:
        return None, True
    # More load on each replica than at the scale-up would explain a breach that stayed.
    demand, ready = load.demand_tokens_per_second, sum(p.seen.ready for p in pools)
    ready_before = memory.ready_at_scale_up
    more_load = (
        demand is None
        or demand_before is None
        or not ready_before
        or ready <= ready_before
        or demand / ready > demand_before / ready_before
    )
    if ratio >= before * (1 - TUNING.futile_improvement) and not more_load:
        return ratio, True
    return None, True


def _warm_up_gate(pools: list[_Pool], load: RoleLoad, memory: RoleMemory, now: float) -> bool:
    """True while replicas of an earlier scale-up are still loading and the breach is not worse."""
    warming = _loading(pools, now)
    pairs = (
        (load.latency_ratio, memory.latency_ratio_at_scale_up),
        (load.demand_tokens_per_second, memory.demand_at_scale_up),
    )
    worse = any(n is not None and t is not None and n > t * TUNING.worse_factor for n, t in pairs)
    return warming and not worse


Sample = tuple[float, float | None, float | None]


def _recent(
    spec: PDDeploymentSpec, memory: RoleMemory, load: RoleLoad, now: float
) -> tuple[Sample, ...]:
    """The role's samples over the last scale-down window, this decision's last (rounded: they
    are stored in status)."""
    demand, ratio = load.demand_tokens_per_second, load.latency_ratio
    sample = (
        now,
        None if demand is None else float(f"{demand:.3g}"),
        None if ratio is None else round(ratio, 3),
    )
    window = spec.scaling.scale_down.stabilization_seconds
    kept = [s for s in memory.recent if now - window <= s[0] < now]
    if len(kept) > 1 and kept[-1][0] - kept[-2][0] < window / TUNING.steady_samples:
        kept.pop()  # samples at least window / TUNING.steady_samples apart, and the newest
    return (*kept, sample)


def _steady(spec: PDDeploymentSpec, samples: tuple[Sample, ...], now: float) -> bool:
    """The load was steady and far under the target over a whole scale-down window."""
    scale_down = spec.scaling.scale_down
    window = scale_down.stabilization_seconds
    if scale_down.steady_window_seconds >= window or len(samples) < 2:
        return False
    if samples[0][0] > now - window:
        return False  # not watched for a whole window yet
    # A gap (an operator restart resumes from the memory of its last status write) hides what
    # the load did in it.
    spacing = max(float(spec.scaling.interval_seconds), window / TUNING.steady_samples)
    if any(b[0] - a[0] > TUNING.stale_intervals * spacing for a, b in itertools.pairwise(samples)):
        return False
    demands = [d for _, d, _ in samples if d is not None]
    ratios = [r for _, _, r in samples if r is not None]
    if len(demands) < len(samples) or len(ratios) < len(samples):
        return False
    if max(ratios) >= TUNING.steady_latency_ratio:
        return False
    mean = sum(demands) / len(demands)
    changes = [(b - a) ** 2 for a, b in itertools.pairwise(demands)]
    spread = math.sqrt(sum(changes) / len(changes) / 2)
    return mean > 0 and spread <= TUNING.steady_demand_change * mean


def _stabilized(spec: PDDeploymentSpec, pool: _Pool, steady: bool, now: float) -> int:
    """The pool's value after the stabilization windows: the short scale-down window while
    the load is steady (said in the pool's notes where it let the pool shrink sooner)."""
    scaling = spec.scaling
    wait = pool.memory.shed_wait or 0.0
    windows = [max(float(scaling.scale_down.stabilization_seconds), wait)]
    if steady:
        # Not shorter than the wait that wrong sheds taught (`_shed_memory`).
        short = max(scaling.scale_down.steady_window_seconds, wait)
        windows.append(min(windows[0], short))
    values = [
        stabilize(
            pool.current,
            pool.raw,
            runs=pool.memory.recommendations,
            now=now,
            up_seconds=scaling.scale_up.stabilization_seconds,
            down_seconds=down_seconds,
            since=pool.memory.since,
        )
        for down_seconds in windows
    ]
    if values[-1] < values[0]:
        pool.steady_window = windows[-1]
        pool.notes.append(
            f"load steady and latency under {TUNING.steady_latency_ratio:g}x the target for "
            f"{windows[0]:.0f}s: the {windows[-1]:.0f}s scale-down window"
        )
    return values[-1]


def _seasonal_floors(
    resolved: ResolvedSpec,
    pools: list[_Pool],
    load: RoleLoad,
    signals: RoleSignals | None,
    *,
    capacity: RoleCapacity,
    prompt: float,
    memory: RoleMemory,
) -> None:
    """Hold the role's pools at the replicas the seasonal forecast needs (`core.seasonal`),
    filled in the pools' order of preference: a raised min, as a schedule's floor is."""
    spec = resolved.spec
    seasonal = spec.scaling.seasonal
    if seasonal is None or signals is None or not signals.seasons or capacity.basis is None:
        return  # no history, or no capacity estimate to turn tokens/s into replicas
    lead = max(_expected_load_seconds(resolved, p.role, p.spec, p.memory) for p in pools)
    today = {"active": load.served_tokens_per_second, "idle": 0.0}.get(load.status)
    expected = forecast(signals.seasons, lead + spec.scaling.interval_seconds, today)
    if expected is None or expected.tokens_per_second <= 0:
        return
    slots = [p.slot() for p in pools]
    role, demand = pools[0].role, expected.tokens_per_second
    grow_at, _ = _utilisation(
        resolved, role, capacity, prompt, slots, memory=memory, load=load, demand=demand
    )
    needed = demand / grow_at
    for pool in pools:
        if needed <= EPSILON or pool.weight <= 0:
            break
        replicas = min(pool.spec.replicas.max, math.ceil(needed / pool.weight - EPSILON))
        needed -= replicas * pool.weight
        if replicas > pool.spec.replicas.min:
            note = (
                f"seasonal forecast (the last {seasonal.seasons} {seasonal.unit} at this time) "
                f"keeps at least {replicas}"
            )
            pool.hold_at(Floor(replicas, note, "forecast"))


def _decide_role(
    resolved: ResolvedSpec,
    pools: list[_Pool],
    load: RoleLoad,
    *,
    capacity: RoleCapacity,
    prompt: float,
    gates: tuple[bool, LimitedBy | None],
    ledger: FreeCapacity | None,
    memory: RoleMemory,
    steady: bool,
    now: float,
) -> tuple[FreeCapacity | None, LimitedBy | None]:
    """Set every pool's value; return the ledger after it and whether the role fell short."""
    if load.status in ("unavailable", "stuck"):
        for pool in pools:
            pool.raw = pool.value = pool.current
            pool.limited_by = "metrics"
            _bound(pool, "outside min/max")
        return ledger, None
    slots = [p.slot() for p in pools]
    raw = {p.spec.name: p.placeable for p in pools}
    limits: dict[str, LimitedBy] = {}
    short: LimitedBy | None = None
    if load.status == "idle":
        raw = {p.spec.name: p.spec.replicas.min for p in pools}
    else:
        # The latency was produced by the replicas Ready over the window: ones that became Ready
        # within it have not shown their effect yet.
        window = resolved.spec.slo.window_seconds
        ready = sum(min(p.window_ready(now, window)[0], p.placeable) * p.weight for p in pools)
        placeable = sum(s.placeable * s.weight for s in slots)
        need = role_need(
            load,
            capacity,
            ready,
            placeable,
            one_less(slots),
            utilisation=_utilisation(
                resolved, pools[0].role, capacity, prompt, slots, memory=memory, load=load
            ),
        )
        if need.grow_to is not None:
            allocation = grow(slots, need.grow_to, ledger)
            raw, limits, short = allocation.replicas, allocation.limits, allocation.short
        elif need.shrink_to is not None:
            raw = shrink(slots, need.shrink_to)
        elif need.probe:
            raw = shrink(slots, one_less(slots))
        elif need.demand_unknown:
            limits = {p.spec.name: "metrics" for p in pools if p.current > p.spec.replicas.min}
        if need.awaiting_arrivals or need.fabric_held:
            limits = {p.spec.name: "fabric" if need.fabric_held else "warmup" for p in pools}
    warming, decode_short = gates
    scaling = resolved.spec.scaling
    for pool in pools:
        pool.raw = clamp(pool.spec, raw[pool.spec.name])
        pool.value, pool.limited_by = pool.raw, limits.get(pool.spec.name, "none")
        if pool.limited_by != "none":
            pool.notes.append(RAW_LIMIT_NOTES[pool.limited_by])
        elif pool.floor is not None and raw[pool.spec.name] < pool.raw:
            pool.limited_by = pool.floor.limit
            pool.notes.append(pool.floor.note)
        pool.move(_stabilized(resolved.spec, pool, steady, now), "rate", "stabilization window")
        up, down = scaling.scale_up.step(pool.current), scaling.scale_down.step(pool.current)
        pool.move(step_limit(pool.current, pool.value, up, down), "rate", "step limit")
        if warming and pool.value > pool.current:
            pool.move(pool.current, "warmup", "replicas of the last scale-up are still loading")
        if decode_short and pool.value > pool.current:
            pool.move(pool.current, decode_short, "decode cannot grow: not adding prefill")
        # Room is at least what the pool holds already: only a pool past it scans the nodes.
        if ledger is not None and pool.value > pool.placeable:
            room = ceiling(pool.slot(), pool.placeable, ledger)
            if room is not None and pool.value > room:
                pool.move(room, "capacity", f"room for {room} only")
        _bound(pool, "min/max")
        if ledger is not None and pool.value > pool.placeable:
            ledger = ledger.take(pool.spec, pool.value - pool.placeable)
    return ledger, short


def _apply_ratio(
    spec: PDDeploymentSpec,
    work: dict[Role, list[_Pool]],
    loads: dict[Role, RoleLoad],
    ledger: FreeCapacity | None,
) -> str:
    """Apply the prefill:decode guardrail; a note when it stays violated."""
    guard = spec.scaling.prefill_to_decode_ratio
    if guard is None:
        return ""
    held = {r for r in ROLES if loads[r].status in ("unavailable", "stuck")}
    movable = {r: [] if r in held else work[r] for r in ROLES}
    fixed = tuple(sum(p.value for p in work[r]) if r in held else 0 for r in ROLES)
    repaired = repair_ratio(
        guard,
        prefill=[p.slot() for p in movable["prefill"]],
        decode=[p.slot() for p in movable["decode"]],
        values=RatioRepair(
            {p.spec.name: p.value for p in movable["prefill"]},
            {p.spec.name: p.value for p in movable["decode"]},
        ),
        fixed=(fixed[0], fixed[1]),
        up_step=spec.scaling.scale_up.max_step_replicas,
        ledger=ledger,
    )
    for role, values in zip(ROLES, (repaired.prefill, repaired.decode), strict=True):
        for pool in movable[role]:
            pool.move(values[pool.spec.name], "ratio", "prefill:decode ratio guardrail")
    percent = ratio_percent(*(sum(p.value for p in work[r]) for r in ROLES))
    if guard.min_percent <= percent <= guard.max_percent:
        return ""
    return f"prefill:decode {percent:.0f}% outside [{guard.min_percent}, {guard.max_percent}]%"


def _warm_up(resolved: ResolvedSpec, pool: _Pool, now: float) -> PoolMemory:
    """The pool's warm-up memory after this decision; learns the load time when it can."""
    memory = pool.memory
    if pool.value > pool.current:
        expected = _expected_load_seconds(resolved, pool.role, pool.spec, memory)
        return PoolMemory(
            load_seconds=memory.load_seconds,
            scaled_up_at=now,
            scaled_up_to=pool.value,
            ready_by=now + expected,
        )
    target, since = memory.scaled_up_to, memory.scaled_up_at
    if target is None or since is None or pool.current < target:
        # Nothing loading, or the scale-up was never applied (Advisory) or was undone.
        return PoolMemory(load_seconds=memory.load_seconds)
    if pool.seen.ready < target:
        return replace(memory, recommendations=())
    took = now - since
    if memory.load_seconds is not None:
        took = TUNING.load_ema_weight * took + (1 - TUNING.load_ema_weight) * memory.load_seconds
    return PoolMemory(load_seconds=took)


def _shed_memory(
    resolved: ResolvedSpec, pool: _Pool, now: float
) -> tuple[float | None, float | None]:
    """(When the pool last shed a replica, if not judged yet; how long a steady load must last
    before it may shed the next.) A shed is judged one load time and an interval after it: if
    the pool grew again by then, the shed was wrong (it cost a load time of breach) and the
    wait doubles, up to `max_shed_wait`, for both scale-down windows; if not, the shed was
    right and the windows are the spec's again. (A load in waves a few load times long
    otherwise shed at every trough and grew back at every crest.)"""
    memory = pool.memory
    shed_at, wait = memory.shed_at, memory.shed_wait
    if shed_at is not None:
        load = _expected_load_seconds(resolved, pool.role, pool.spec, memory)
        spec = resolved.spec
        scale_down = spec.scaling.scale_down
        if pool.value > pool.current:
            wait = min(
                TUNING.max_shed_wait, 2 * max(wait or 0.0, load, scale_down.steady_window_seconds)
            )
            shed_at = None
        elif now - shed_at > load + spec.scaling.interval_seconds:
            shed_at, wait = None, None
    if pool.value < pool.current:
        shed_at = now
    return shed_at, wait


def _remember(r: "_Round") -> PolicyState:
    """The policy's memory after this decision (stored in status, read by the next)."""
    spec, state, work, now = r.spec, r.state, r.work, r.now
    loads, capacities, futility, settle = r.loads, r.capacities, r.futility, r.settle
    keep = max(
        spec.scaling.scale_up.stabilization_seconds, spec.scaling.scale_down.stabilization_seconds
    )
    pools: dict[str, PoolMemory] = {}
    roles: dict[str, RoleMemory] = {}
    for role in ROLES:
        load, capacity, old = loads[role], capacities[role], state.role(role)
        for pool in work[role]:
            shed_at, shed_wait = _shed_memory(r.resolved, pool, now)
            pools[pool_key(role, pool.spec.name)] = replace(
                _warm_up(r.resolved, pool, now),
                recommendations=record(
                    pool.memory.recommendations, now, pool.raw, max(keep, shed_wait or 0.0)
                ),
                since=now if pool.memory.since is None else pool.memory.since,
                ready_runs=record_ready(pool.memory.ready_runs, now, pool.seen.ready, settle[role]),
                capacity_per_replica=(
                    capacity.per_replica[pool.spec.name] if capacity.basis else None
                ),
                capacity_factor=capacity.pool_factors.get(pool.spec.name),
                shed_at=shed_at,
                shed_wait=shed_wait,
            )
        grew = any(p.value > p.current for p in work[role])
        futile, judged = futility[role]
        # A scale-up is judged once, when its replicas have served a window.
        kept = RoleMemory() if judged else old
        roles[role] = RoleMemory(
            capacity_basis=capacity.basis,
            capacity_factor=capacity.factor,
            latency_ratio_at_scale_up=(
                load.latency_ratio if grew else kept.latency_ratio_at_scale_up
            ),
            demand_at_scale_up=(load.demand_tokens_per_second if grew else kept.demand_at_scale_up),
            ready_at_scale_up=(
                sum(p.seen.ready for p in work[role]) if grew else kept.ready_at_scale_up
            ),
            futile_ratio=futile,
            no_traffic_since=_since(old.no_traffic_since, now, load.status == "idle"),
            unavailable_since=_since(old.unavailable_since, now, load.status == "unavailable"),
            stuck_since=_since(old.stuck_since, now, load.nothing_finished),
            **_running_averages(
                old,
                _batch(load, work[role]),
                resized=any(
                    p.memory.ready_runs and p.memory.ready_runs[-1][1] != p.seen.ready
                    for p in work[role]
                ),
            ),
            kv_tokens_mean=r.kv_means[0] if role == "decode" else None,
            kv_sequences_mean=r.kv_means[1] if role == "decode" else None,
            recent=r.recents[role],
        )
    return PolicyState(pools=pools, roles=roles)


def _batch(load: RoleLoad, pools: list[_Pool]) -> float | None:
    """Running requests per Ready replica: the batch one replica steps, as the router
    spreads them. (Summed over replicas, a swing common to all of them would count once per
    replica.)"""
    ready = sum(p.seen.ready for p in pools)
    if load.status != "active" or load.running_requests is None or ready == 0:
        return None
    return load.running_requests / ready


def _running_averages(
    old: RoleMemory, batch: float | None, *, resized: bool
) -> dict[str, float | None]:
    """The moving averages of the batch and of its change squared after one more sample
    (None: no sample this decision). A change across a change of Ready replicas is the policy's
    doing, not a swing of the load, and is not counted; nor is there one before the first two
    samples (until then the batch has shown no swing)."""
    mean, change = old.running_mean, old.running_change_square_mean
    if batch is None:
        return {"running_mean": mean, "running_change_square_mean": change, "running_last": None}
    w, last = TUNING.running_ema_weight, old.running_last
    if last is not None and not resized:
        change = w * (batch - last) ** 2 + (1 - w) * (change or 0.0)
    return {
        "running_mean": batch if mean is None else w * batch + (1 - w) * mean,
        "running_change_square_mean": change,
        "running_last": batch,
    }


def _since(old: float | None, now: float, still: bool) -> float | None:
    return (now if old is None else old) if still else None


def _role_words(
    spec: PDDeploymentSpec,
    role: Role,
    pools: list[_Pool],
    load: RoleLoad,
    *,
    memory: RoleMemory,
    now: float,
) -> str:
    since = {"idle": memory.no_traffic_since, "unavailable": memory.unavailable_since}.get(
        load.status
    )
    # "since <time>", not "for N s": the reason lands in status, and a text that changes every
    # cycle would cost a status write every cycle.
    stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(since)) if since is not None else ""
    note = load.note + (f" since {stamp}" if stamp else "")
    moves = [f"{p.spec.name} {p.current}->{p.value}" for p in pools if p.value != p.current]
    limits = sorted({p.limited_by for p in pools} - {"none"})
    schedules = sorted({p.floor.name for p in pools if p.floor and p.limited_by == "schedule"})
    named = [
        f"schedule {', '.join(schedules)}" if limit == "schedule" else limit for limit in limits
    ]
    limited = f" limited by {', '.join(named)}" if named else ""
    shrunk = [p.steady_window for p in pools if p.steady_window and p.value < p.current]
    if shrunk:
        limited += f", load steady: {max(shrunk):.0f}s scale-down window"
    return f"{role}: {', '.join(moves) or 'hold'}{limited} ({note})"


@dataclass
class _Round:
    """One decision in the making: what the rules of `decide` read, and what each adds."""

    resolved: ResolvedSpec
    observation: Observation
    state: PolicyState
    now: float
    wall_clock: float
    work: dict[Role, list[_Pool]]
    ledger: FreeCapacity | None = None
    loads: dict[Role, RoleLoad] = field(default_factory=dict)
    settle: dict[Role, float] = field(default_factory=dict)
    futility: dict[Role, tuple[float | None, bool]] = field(default_factory=dict)
    prompts: dict[Role, float] = field(default_factory=dict)
    kv_means: tuple[float | None, float | None] = (None, None)
    capacities: dict[Role, RoleCapacity] = field(default_factory=dict)
    recents: dict[Role, tuple[Sample, ...]] = field(default_factory=dict)
    ratio_note: str = ""

    @property
    def spec(self) -> PDDeploymentSpec:
        return self.resolved.spec


def _hold_schedule_floors(r: _Round) -> None:
    """Schedules raise a pool's min while their window is open (or about to be)."""
    resolved, state = r.resolved, r.state
    floors = active_floors(
        r.spec,
        r.wall_clock,
        lambda role, pool: _expected_load_seconds(
            resolved, role, pool, state.pool(role, pool.name)
        ),
    )
    for role in ROLES:
        for pool in r.work[role]:
            floor = floors.get((role, pool.spec.name))
            if floor is not None and floor.replicas > pool.spec.replicas.min:
                pool.hold_at(floor)


def _reserve_room(r: _Round) -> None:
    """Free capacity, less the room pods waiting to be bound will take."""
    pools = [p for role in DECISION_ORDER for p in r.work[role]]
    r.ledger = _reserve(pools, r.observation.room(r.spec))


def _read_loads(r: _Round) -> None:
    """Each role's load from its signals, with the capacity still arriving and the breaches
    that more replicas did not lower."""
    state, now = r.state, r.now
    r.loads = {
        role: read_load(
            r.resolved, role, r.observation.signals.get(role), now, state.role(role).stuck_since
        )
        for role in ROLES
    }
    r.settle = {role: settle_seconds(r.spec, role, r.loads) for role in ROLES}
    for role in ROLES:
        load = _arriving_capacity(r.loads[role], r.work[role], now, r.settle[role])
        r.futility[role] = _futility(r.work[role], load, state.role(role), now, r.settle[role])
        if r.futility[role][0] is not None:
            note = f"{load.note}; the last scale-up did not lower this breach"
            load = replace(load, futile=True, note=note)
        r.loads[role] = load


def _size_requests(r: _Round) -> None:
    """The tokens a request costs each role: the mean prompt for prefill, the context a
    running sequence holds (from the KV cache) for decode."""
    r.prompts = {role: _mean_prompt(r.spec, r.loads, role) for role in ROLES}
    decode = r.state.role("decode")
    r.kv_means = _decode_context(r.resolved, r.loads["decode"], r.work["decode"], decode)
    context = replace(
        decode, kv_tokens_mean=r.kv_means[0], kv_sequences_mean=r.kv_means[1]
    ).context_tokens()
    if context is not None:
        r.prompts["decode"] = context


def _estimate_capacity(r: _Round) -> None:
    """Each pool's capacity per replica, learned from what the role served."""
    r.capacities = {
        role: _capacity(
            r.resolved,
            role,
            state=r.state,
            loads=r.loads,
            pools=r.work[role],
            now=r.now,
            prompt=r.prompts[role],
        )
        for role in ROLES
    }
    for role in ROLES:
        for pool in r.work[role]:
            pool.weight = r.capacities[role].per_replica[pool.spec.name]


def _hold_seasonal_floors(r: _Round) -> None:
    """The seasonal forecast raises a pool's min one model load ahead of the load."""
    if r.spec.scaling.seasonal is None:
        return
    for role in ROLES:
        _seasonal_floors(
            r.resolved,
            r.work[role],
            r.loads[role],
            r.observation.signals.get(role),
            capacity=r.capacities[role],
            prompt=r.prompts[role],
            memory=r.state.role(role),
        )


def _size_roles(r: _Round) -> None:
    """Replicas per pool, decode first: it claims shared nodes first, and prefill holds while
    decode is full and cannot grow (more prefill would only queue KV at it)."""
    spec, state, now = r.spec, r.state, r.now
    r.recents = {role: _recent(spec, state.role(role), r.loads[role], now) for role in ROLES}
    decode_short: LimitedBy | None = None
    for role in DECISION_ORDER:
        gates = (
            _warm_up_gate(r.work[role], r.loads[role], state.role(role), now),
            decode_short if role == "prefill" else None,
        )
        r.ledger, short = _decide_role(
            r.resolved,
            r.work[role],
            r.loads[role],
            capacity=r.capacities[role],
            prompt=r.prompts[role],
            gates=gates,
            ledger=r.ledger,
            memory=state.role(role),
            steady=_steady(spec, r.recents[role], now),
            now=now,
        )
        grew = any(p.value > p.current for p in r.work[role])
        if role == "decode" and backlogged(r.loads[role]) and not grew:
            decode_short = short


def _guard_ratio(r: _Round) -> None:
    """The prefill:decode guardrail, last: it moves pools the rules above sized."""
    r.ratio_note = _apply_ratio(r.spec, r.work, r.loads, r.ledger)


# The rules of a decision, in order; each reads what those before it added to the round.
RULES = (
    _hold_schedule_floors,
    _reserve_room,
    _read_loads,
    _size_requests,
    _estimate_capacity,
    _hold_seasonal_floors,
    _size_roles,
    _guard_ratio,
)


def _decision(r: _Round, memory: PolicyState) -> Decision:
    """The decision as the operator records it: replicas, reasons, what limited them."""
    words = [
        _role_words(r.spec, role, r.work[role], r.loads[role], memory=memory.role(role), now=r.now)
        for role in ROLES
    ]
    details = tuple(
        PoolDecision(
            role=pool.role,
            pool=pool.spec.name,
            current_replicas=pool.current,
            ready_replicas=pool.seen.ready,
            desired_replicas=pool.value,
            limited_by=pool.limited_by,
            reason="; ".join([r.loads[pool.role].note, *pool.notes]),
            capacity_per_replica=memory.pool(pool.role, pool.spec.name).capacity_per_replica,
        )
        for role in ROLES
        for pool in r.work[role]
    )
    limits = {d.limited_by for d in details}
    if r.ratio_note:
        limits.add("ratio")
    return Decision(
        time=r.now,
        replicas={(d.role, d.pool): d.desired_replicas for d in details},
        pools=details,
        reason="; ".join(filter(None, [*words, r.ratio_note])),
        limited_by=next((limit for limit in LIMIT_PRIORITY if limit in limits), "none"),
        state=memory,
    )


def decide(
    spec: ResolvedSpec | PDDeploymentSpec,
    observation: Observation,
    state: PolicyState,
    now: float,
    *,
    wall_clock: float | None = None,
) -> Decision | None:
    """Desired replicas of every pool for this interval; None when scaling is Disabled or
    External (each role's PDPool decides, `core.external`).

    `spec` as `core.resolved.resolve` made it once per generation; a bare spec is resolved on
    the spot (tests, one-off callers). Advisory decides exactly as Active: the caller records
    the decision and does not apply it. `wall_clock` is the Unix time the schedules read;
    None: `now`, which is the operator's (the simulator's `now` is replay seconds, the clock
    of its signals).
    """
    plain = spec.spec if isinstance(spec, ResolvedSpec) else spec
    if plain.scaling.mode in ("Disabled", "External"):
        return None
    resolved = spec if isinstance(spec, ResolvedSpec) else resolve(spec)
    work = {
        role: [
            _Pool(
                role,
                pool,
                observation.pools.get((role, pool.name), PoolObservation(pool.replicas.min)),
                state.pool(role, pool.name),
            )
            for pool in plain.pools(role)
        ]
        for role in ROLES
    }
    r = _Round(resolved, observation, state, now, now if wall_clock is None else wall_clock, work)
    for rule in RULES:
        rule(r)
    return _decision(r, _remember(r))
