"""The control law of one role: how much serving capacity its signals call for.

Capacity is counted in the role's capacity units: tokens/s when the pools have an estimate
(`core.learning`), cards otherwise. Three terms, each a capacity the role should have:

* feedback: ready capacity x latency/target (at most doubled), when latency is over the target
  by more than the tolerance and no replicas are arriving (where the demand can size the role:
  the latency does not show arriving replicas yet);
* feed-forward: demand (tokens/s, plus the prefill queue drained within one SLO window) at
  `target_utilisation` of the estimated capacity (prefill: at `prefill_grow_share` of the
  utilisation at which its queue still meets the TTFT target, `core.queueing`);
* memory (decode): KV-cache usage, grown by the requests waiting for room, at `kv_target`.

The role grows to the largest term. It may shrink only to a size predicted to hold the demand
at `scale_down_utilisation` (prefill: `prefill_shrink_share` of the one replica less's
utilisation at the SLO), below the growth target: that gap is the hysteresis that keeps a
steady load from flapping between two sizes. Latency near the target holds the size (a tail of
a few long requests only from `tail_hold_ratio` times the target). A role
whose capacity is only known from below may probe one replica down while latency is far under
the target. The numbers are `core.tuning`'s.
"""

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

from pd_operator.api.spec import KVTransferSpec, LatencyTarget, Role
from pd_operator.core.learning import PoolEvidence, RoleCapacity
from pd_operator.core.resolved import ResolvedSpec, RoleTerms
from pd_operator.core.signals import Reading, ReadingKind, RoleSignals, bucket_of
from pd_operator.core.tuning import TUNING

EPSILON = 1e-9

LoadStatus = Literal["active", "idle", "unavailable", "stuck"]


@dataclass(frozen=True)
class RoleLoad:
    """What one role's signals say, reduced to what the control law uses."""

    status: LoadStatus
    note: str = ""  # the signals in words
    latency_ratio: float | None = None  # observed/target at the SLO percentile
    # The histogram bucket the percentile was read in, over the target; None: exact.
    latency_bucket: tuple[float, float] | None = None
    served_tokens_per_second: float | None = None
    demand_tokens_per_second: float | None = None  # served, plus the queue to drain
    memory_pressure: float | None = None  # decode KV usage x (running + waiting) / running
    kv_cache_usage: float | None = None  # decode: the share of KV cache the replicas hold
    # Prefill: requests per second (each observes one TTFT). Decode's latency histogram counts
    # tokens, not requests.
    requests_per_second: float | None = None
    mean_prompt_tokens: float | None = None
    # Prefill: the share of prompt tokens served from the prefix cache over the window (0 when
    # the engines do not say): the seeds count what these prompts cost to compute.
    cached_share: float = 0.0
    running_requests: float | None = None  # summed over the Ready replicas, at the sample
    waiting_requests: float | None = None  # likewise: queued, or (decode) receiving their KV
    # Prefill prompts wait, at least one TTFT target's worth of what the replicas served: they
    # were busy all the time, so what they served is their throughput.
    saturated: bool = False
    # Replicas became Ready within the window: they drain the queue, which is then no reason
    # to grow (it still counts against shrinking).
    queue_drained: bool = False
    # Replicas are loading or became Ready within the window: the latency does not show them
    # yet, so it is no measure of how much more the role needs. Feedback waits for them; the
    # demand and memory terms still size the role. (Without this, a burst of long prompts
    # that read as a 3x breach doubled prefill while the replica sized for it was loading.)
    capacity_arriving: bool = False
    # A breach that more replicas did not lower (see `core.policy`): no reason to add more.
    futile: bool = False
    # Over the target, but read in a bucket that also holds values under it, and no queue
    # confirms it: `histogram_quantile` cannot tell a breach from a met SLO there (a P99 in vLLM's
    # 10-25 ms ITL bucket reads 24.9 ms whatever the gaps are), so it neither grows nor holds.
    breach_unresolved: bool = False
    # A tail percentile over the target while the mean is far under it: a few requests too long
    # for the target (prompts no replica count serves in time) set it, not the load. It says
    # nothing about capacity per replica. Not where prompts wait a whole TTFT target's worth
    # (`saturated`): then the replicas are short, whatever the tail (a mixed load on a
    # compressed day held prefill at 4 with 119 prompts waiting).
    tail_only: bool = False
    # Prefill: over the target by more than the prompts' waits can explain (`waits_explain`):
    # prompts too long for the target on their own set the percentile. It is a tail
    # (`tail_only`) that does not hold the size either: shedding a replica adds waits, which
    # the demand's queueing model sizes for, not what this percentile measures.
    beyond_waits: bool = False
    # The percentile's bucket could not place it, and the exact mean, a lower bound of it, did
    # (`latency_ratio` is then the mean's). A floor of the latency the load does not move
    # (a slow card's step) reads the same, so it teaches nothing about capacity per replica.
    latency_from_mean: bool = False
    nothing_finished: bool = False  # requests were held but none finished in the window
    # Prefill: a TTFT breach that the KV hand-off to decode explains (`transfer_explains`):
    # more prefill would not lower it, so feedback does not grow prefill for it.
    fabric_bound: bool = False
    # Each pool's own latency and served rate, where read (`core.learning.PoolEvidence`).
    pools: Mapping[str, PoolEvidence] = field(default_factory=dict)

    @property
    def growth_demand(self) -> float | None:
        """The demand growth sizes for: served tokens/s only while arriving replicas drain the
        queue (`queue_drained`), else the demand with the queue."""
        return (
            self.served_tokens_per_second if self.queue_drained else self.demand_tokens_per_second
        )


def transfer_explains(ttft_seconds: float, transfer: Reading, target_seconds: float) -> bool:
    """A TTFT over the target that would be within it (and its tolerance) without the KV
    hand-off: the fabric, not prefill, is what breaches it."""
    seconds = transfer.value if transfer.kind is ReadingKind.VALUE else None
    return (
        seconds is not None
        and seconds > 0
        and ttft_seconds > TUNING.breach_ratio * target_seconds
        and ttft_seconds - seconds <= TUNING.breach_ratio * target_seconds
    )


def fabric_words(kv_transfer: KVTransferSpec) -> str:
    """The fabric as `spec.kvTransfer` names it."""
    backend = f" {kv_transfer.nixl_backend}" if kv_transfer.nixl_backend else ""
    return f"{kv_transfer.connector}{backend} over {kv_transfer.protocol}"


def read_load(
    resolved: ResolvedSpec,
    role: Role,
    signals: RoleSignals | None,
    now: float,
    stuck_since: float | None = None,
) -> RoleLoad:
    """Classify one role's signals: active, idle (no traffic), unavailable, or stuck.

    Stuck: requests are held but none finished within the window. Right after a quiet spell
    that is normal (the first requests are still running), so the role holds; once it has
    lasted a whole window since `stuck_since`, the latency is at least that long: a breach.
    """
    if signals is None:
        return RoleLoad("unavailable", "no signals for the role")
    spec, terms = resolved.spec, resolved.role(role)
    age = now - signals.sample_time
    if age > TUNING.stale_intervals * spec.scaling.interval_seconds:
        return RoleLoad("unavailable", f"newest sample is {age:.0f}s old")
    name, latency, target = terms.latency_name, signals.latency(role), terms.target
    if latency.kind is ReadingKind.UNAVAILABLE:
        return RoleLoad("unavailable", f"{name} unavailable: {latency.reason or 'no reason'}")
    served = (
        signals.prompt_tokens_per_second
        if role == "prefill"
        else signals.generation_tokens_per_second
    ).rate_or_zero()
    waiting = signals.queue_depth.rate_or_zero()
    running = signals.running_requests.rate_or_zero()
    requests = signals.requests_per_second.rate_or_zero()
    seconds = latency.value
    if seconds is None:  # no request finished within the window
        if (waiting or 0) > 0 or (running or 0) > 0:
            held = f"{waiting or 0:.0f} waiting and {running or 0:.0f} running, none finished"
            stuck = now - (now if stuck_since is None else stuck_since)
            if stuck < spec.slo.window_seconds:
                return RoleLoad("stuck", f"{held} in the window", nothing_finished=True)
            seconds = stuck
        elif not (served or 0) > 0 and not (requests or 0) > 0:
            return RoleLoad("idle", "no traffic")
    prompts = signals.prompt_tokens_per_second.rate_or_zero()
    mean_prompt = prompts / requests if prompts and requests else None
    cached = signals.cached_prompt_tokens_per_second.rate_or_zero()
    cached_share = min(1.0, cached / prompts) if role == "prefill" and cached and prompts else 0.0
    demand = served
    if role == "prefill" and demand is not None and waiting and mean_prompt:
        # Waiting requests already miss the TTFT target; clearing them within one SLO window
        # brings the percentile back, without sizing for a burst that is already over.
        demand += waiting * mean_prompt / spec.slo.window_seconds
    pressure = None
    usage = signals.kv_cache_usage.rate_or_zero()
    if role == "decode" and usage is not None:
        # Requests waiting for KV room need cache on top of what the running ones hold.
        pressure = usage * (1 + waiting / running) if waiting and running else usage
    target_seconds = target.target_milliseconds / 1000
    ratio = seconds / target_seconds if seconds is not None else None
    # A prompt or two waiting at the sample is normal for replicas busy part of the time (a
    # cold start's first minute at 60% load read as saturation and cut the estimate to 0.6 for
    # good); a queue that takes a whole TTFT target to serve is not.
    saturated = (
        role == "prefill"
        and waiting is not None
        and waiting > 0
        and waiting * (mean_prompt or 0.0) >= (served or 0.0) * target_seconds
    )
    # Queueing confirms a breach: prefill requests waiting for compute, or decode requests
    # short of KV room (one decode request waiting for the next step is no shortage).
    queued = bool(waiting if role == "prefill" else (pressure or 0.0) >= TUNING.kv_target)
    ratio, bucket, unresolved, by_mean = _placed(
        ratio, latency.value, terms, queued=queued, mean=signals.mean_latency_seconds
    )
    words = [_latency_words(name, target.percentile, ratio, bucket, unresolved, by_mean=by_mean)]
    transfer = signals.kv_transfer_seconds
    fabric = (
        role == "prefill"
        and seconds is not None
        and not unresolved
        and transfer_explains(seconds, transfer, target_seconds)
    )
    # The KV hand-off is part of a prompt's own TTFT: where it explains the breach, that is
    # the more precise answer.
    beyond_waits = (
        role == "prefill"
        and not saturated
        and not fabric
        and not waits_explain(ratio, signals.queue_seconds, terms.share, target_seconds)
    )
    if beyond_waits and not unresolved and signals.queue_seconds.value is not None:
        words[0] += f" with prompts waiting {signals.queue_seconds.value:.2g}s on average"
    if fabric and seconds is not None and transfer.value is not None:
        words[0] = (
            f"{name} {seconds:.1f}s over {target_seconds:g}s target, of which KV transfer "
            f"{transfer.value:.1f}s: the fabric ({fabric_words(spec.kv_transfer)}), not prefill"
        )
    if latency.value is None and seconds is not None:
        words[0] += f" (nothing finished for {seconds:.0f}s)"
    words += _load_words(role, demand, usage, cached_share, waiting)
    return RoleLoad(
        "active",
        ", ".join(words),
        latency_ratio=ratio,
        latency_bucket=bucket,
        served_tokens_per_second=served,
        demand_tokens_per_second=demand,
        memory_pressure=pressure,
        kv_cache_usage=usage if role == "decode" else None,
        requests_per_second=requests if role == "prefill" else None,
        mean_prompt_tokens=mean_prompt,
        cached_share=cached_share,
        running_requests=running,
        waiting_requests=waiting,
        saturated=saturated,
        nothing_finished=latency.value is None and seconds is not None,
        tail_only=(_tail_only(target, ratio, signals, target_seconds) or beyond_waits)
        and not saturated,
        beyond_waits=beyond_waits,
        breach_unresolved=unresolved,
        latency_from_mean=by_mean,
        fabric_bound=fabric,
        pools=_pool_evidence(terms.latency_buckets, signals, target_seconds),
    )


def waits_explain(ratio: float | None, queue: Reading, share: float, target_seconds: float) -> bool:
    """Whether the prompts' waits can put the percentile that far over the target.

    A prompt that its own prefill serves within the target is over it by `excess` only after
    waiting at least that long, and by Markov's inequality at most mean wait / excess of the
    prompts wait that long. Under the percentile's tail share (1 - share), prompts too long for
    the target on their own fill the tail, and no replica count brings it back. Not read, or
    within the target: they may.
    """
    if ratio is None or ratio <= 1 or queue.value is None:
        return True
    return queue.value >= (1 - share) * (ratio - 1) * target_seconds


def _pool_evidence(
    bounds: tuple[float, ...], signals: RoleSignals, target_seconds: float
) -> dict[str, PoolEvidence]:
    """Each pool's latency over the target, in its bucket, and what it served; pools whose
    latency or served rate is not a value (no traffic, not read) are left out."""
    found = {}
    for name, pool in signals.pools.items():
        seconds, served = pool.latency_seconds.value, pool.served_tokens_per_second.value
        if seconds is None or served is None:
            continue
        found[name] = PoolEvidence(
            seconds / target_seconds, _bucket_ratio(bounds, seconds, target_seconds), served
        )
    return found


def _placed(
    ratio: float | None, seconds: float | None, terms: RoleTerms, *, queued: bool, mean: Reading
) -> tuple[float | None, tuple[float, float] | None, bool, bool]:
    """The latency ratio, the bucket over the target that the percentile `seconds` was read in
    (None: none read), whether it is an unresolved breach (over the tolerance in a bucket that
    also holds values under the target, no queue confirming it), and whether the exact mean
    placed it instead (`_placed_by_mean`)."""
    if ratio is None or seconds is None:
        return ratio, None, False, False
    target_seconds = terms.target.target_milliseconds / 1000
    bucket = _bucket_ratio(terms.latency_buckets, seconds, target_seconds)
    if not (ratio > TUNING.breach_ratio and bucket[0] < 1 and not queued):
        return ratio, bucket, False, False
    placed = _placed_by_mean(bucket, mean, terms.target.percentile, target_seconds)
    if placed is None:
        return ratio, bucket, True, False
    return placed[0], placed, False, True


def _placed_by_mean(
    bucket: tuple[float, float], mean: Reading, percentile: str, target_seconds: float
) -> tuple[float, float] | None:
    """Where the exact mean (sum over count) places a tail percentile its bucket could not:
    such a percentile is at least the mean unless a tenth or less of the observations, far out,
    carry it (not a latency that steps or queues make), so a mean inside the bucket narrows it
    from below, to (mean, bucket top) over the target. None: the mean says nothing more."""
    if mean.value is None or percentile not in TUNING.tail_percentiles:
        return None
    ratio = mean.value / target_seconds
    return (ratio, bucket[1]) if ratio > bucket[0] else None


def _bucket_ratio(
    bounds: tuple[float, ...], seconds: float, target_seconds: float
) -> tuple[float, float]:
    """The histogram bucket a latency was read in, over the target."""
    lower, upper = bucket_of(bounds, seconds)
    return lower / target_seconds, upper / target_seconds


def _load_words(
    role: Role,
    demand: float | None,
    usage: float | None,
    cached_share: float,
    waiting: float | None,
) -> list[str]:
    words = []
    if demand is not None:
        words.append(f"demand {demand:,.0f} tokens/s")
    if role == "decode" and usage is not None:
        words.append(f"KV cache {usage:.0%} used")
    if cached_share >= 0.01:
        words.append(f"{cached_share:.0%} of prompt tokens cached")
    if waiting:
        words.append(f"{waiting:.0f} waiting")
    return words


def _latency_words(
    name: str,
    percentile: str,
    ratio: float | None,
    bucket: tuple[float, float] | None,
    unresolved: bool,
    *,
    by_mean: bool = False,
) -> str:
    """The latency reading in words: the interpolated ratio, or, where the percentile lies in a
    bucket around the target that no queue confirms as a breach, the bucket and that the
    demand decides (vLLM's ITL bucket holds any P99 from 10 to 25 ms, interpolated to 24.9
    whatever the load: "1.24x" said nothing)."""
    if ratio is None:
        return f"no {name} sample"
    if by_mean and bucket is not None:
        return (
            f"{name} {percentile} at least {ratio:.2f}x target (its mean; the percentile's "
            f"histogram bucket reaches {bucket[1]:.2g}x)"
        )
    if not unresolved or bucket is None:
        return f"{name} {ratio:.2f}x target"
    lower, upper = (f"{bound:.2g}" for bound in bucket)
    return f"{name} {percentile} {lower}-{upper}x target (its histogram bucket): the demand decides"


def _tail_only(
    target: LatencyTarget,
    ratio: float | None,
    signals: RoleSignals,
    target_seconds: float,
) -> bool:
    mean = signals.mean_latency_seconds
    return (
        ratio is not None
        and ratio >= TUNING.learn_low_ratio  # near or past the target: what learning would act on
        and target.percentile in TUNING.tail_percentiles
        and mean.kind is ReadingKind.VALUE
        and mean.value is not None
        and mean.value <= TUNING.tail_mean_ratio * target_seconds
    )


@dataclass(frozen=True)
class Need:
    """The capacity a role should grow to, or may shrink to (capacity units)."""

    grow_to: float | None  # None: no term calls for more than the role has
    shrink_to: float | None  # None: no shrinking (a term holds, or the demand is unknown)
    probe: bool  # no prediction allows shrinking, but one replica less may be tried
    demand_unknown: bool  # shrinking was blocked only because the demand could not be read
    # Feedback called for more, but waits for the replicas arriving (`RoleLoad.capacity_arriving`).
    awaiting_arrivals: bool = False
    # Feedback would have called for more, for a breach the KV hand-off explains.
    fabric_held: bool = False


def role_need(
    load: RoleLoad,
    capacity: RoleCapacity,
    ready_capacity: float,
    placeable_capacity: float,
    smaller_capacity: float,
    *,
    utilisation: tuple[float, float] = (TUNING.target_utilisation, TUNING.scale_down_utilisation),
) -> Need:
    """Apply the control law to one active role.

    `ready_capacity` is what the Ready replicas offer (it produced the latency);
    `placeable_capacity` adds the replicas still starting, which count as coming capacity;
    `smaller_capacity` is what would be left with one replica less; `utilisation` is the
    share of the estimated capacity to grow at and the one to shrink to.
    """
    grow_at, shrink_to_at = utilisation
    grow: list[float] = []
    floors: list[float] = []
    ratio = load.latency_ratio
    demand = load.demand_tokens_per_second
    predictable = demand is not None and capacity.basis is not None
    # A lower bound would over-provision on the way up: it does not size growth.
    sizes_growth = predictable and capacity.basis != "lower-bound"
    feedback = None
    if ratio is not None:
        resolved = not load.breach_unresolved
        if (
            ratio > TUNING.breach_ratio
            and ready_capacity > 0
            and not load.futile
            and resolved
            and not load.tail_only
        ):
            feedback = ready_capacity * min(ratio, TUNING.max_feedback_gain)
            # Feedback waits for arriving replicas where the demand can size the role; without
            # an estimate it is the only term, and acts as before.
            if not (load.capacity_arriving and sizes_growth) and not load.fabric_bound:
                grow.append(feedback)
        holding = TUNING.tail_hold_ratio if load.tail_only else TUNING.hold_ratio
        if ratio >= holding and resolved and not load.beyond_waits:
            floors.append(placeable_capacity)
    if demand is not None and capacity.basis is not None:
        if sizes_growth:
            grow.append((load.growth_demand or 0.0) / grow_at)
        floors.append(demand / shrink_to_at)
    pressure = load.memory_pressure
    if pressure is not None and ready_capacity > 0:
        grow.append(ready_capacity * pressure / TUNING.kv_target)
        floors.append(ready_capacity * pressure / TUNING.kv_scale_down)
    wanted = max(grow, default=0.0)
    floor = max(floors, default=0.0)
    grow_to = wanted if wanted > placeable_capacity * (1 + EPSILON) else None
    # Shrinking only when it removes a replica: a floor between the smaller and the current
    # capacity keeps the size, and leaves the probe its chance.
    shrink_to = floor if predictable and floor <= smaller_capacity * (1 + EPSILON) else None
    quiet = ratio is not None and ratio < TUNING.probe_ratio
    roomy = pressure is None or pressure < TUNING.kv_scale_down
    return Need(
        grow_to=grow_to,
        shrink_to=shrink_to,
        probe=grow_to is None
        and shrink_to is None
        and capacity.basis == "lower-bound"
        and demand is not None
        and demand <= TUNING.max_probe_load * smaller_capacity
        and quiet
        and roomy,
        demand_unknown=demand is None and (ratio is None or ratio < TUNING.hold_ratio),
        awaiting_arrivals=grow_to is None
        and feedback is not None
        and feedback > placeable_capacity * (1 + EPSILON)
        and not load.fabric_bound,
        fabric_held=grow_to is None
        and feedback is not None
        and feedback > placeable_capacity * (1 + EPSILON)
        and load.fabric_bound,
    )


def backlogged(load: RoleLoad) -> bool:
    """Decode shows a KV backlog: cache near full (or requests waiting for it), or ITL breached."""
    pressure, ratio = load.memory_pressure, load.latency_ratio
    return (pressure is not None and pressure >= TUNING.kv_target) or (
        ratio is not None and ratio > TUNING.breach_ratio and not load.breach_unresolved
    )
