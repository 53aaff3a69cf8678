"""Per-replica capacity of each pool: seeded from hardware profiles, learned from what it serves.

Capacity is tokens per second one replica serves while the SLO holds: prompt tokens for prefill,
generated tokens for decode. A pool whose `accelerator.profile` names a known card, serving a
known model, starts from the performance model. Otherwise the first traffic gives the first
estimate. After that every observation corrects it by what the latency says about the load:

* latency near the target: the replicas run at about their SLO capacity, so the estimate moves
  toward the served rate per replica (an exponential moving average);
* latency over the target: the served rate is more than the replicas can take within the SLO,
  an upper bound; an estimate above it is cut at once;
* latency well under the target: the served rate is a lower bound; an estimate below it is raised.

An estimate known only as a lower bound is replaced outright by the first observation near or
over the target.

A latency percentile is read from a histogram, so it is only known to lie in its bucket. A
reading near the target counts as "at the SLO" only when its bucket is narrow (vLLM's ITL bucket
from 10 to 25 ms holds any P50 between them, interpolated to about 17.5 ms whatever the load), and
as "well under" only when the whole bucket is within the tolerance. A reading that cannot tell
teaches nothing; the estimate stays what the profile or earlier observations made it.

The role's signals correct all its pools by the same factor, keeping their relative speeds (from
profiles, else cards per replica). Where a role has several pools and each pool's own latency and
served rate are read (the engines' `pool` label), each pool is corrected by its own: two prefill
pools on different cards are seldom off their profiles by the same factor. A pool reading its
bucket cannot place as a breach teaches nothing unless the role's breach is confirmed.
"""

import functools
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from statistics import NormalDist
from typing import Literal

from pd_operator.api.spec import PoolSpec, Role
from pd_operator.core.hardware import HardwareProfile, ModelProfile
from pd_operator.core.perfmodel import (
    DecodeCoefficients,
    PrefillCoefficients,
    decode_itl_ms,
    kv_capacity_tokens,
    max_concurrent_sequences,
    model_load_seconds,
)
from pd_operator.core.placement import replica_cards
from pd_operator.core.policy_state import CapacityBasis
from pd_operator.core.queueing import MAX_UTILISATION, exponential_lengths, pooled_utilisation
from pd_operator.core.resolved import Profiles, ResolvedSpec
from pd_operator.core.tuning import TUNING


def seed_capacity(
    resolved: ResolvedSpec,
    role: Role,
    pool: PoolSpec,
    prompt_tokens: int,
    *,
    prompt_length_cv2: float = 0.0,
    cached_share: float = 0.0,
) -> float | None:
    """Tokens/s per replica from the performance model, or None when the profiles are unknown.

    Prefill: prompts of mean length `prompt_tokens` in batches of up to TUNING.prefill_batch_tokens
    computed tokens, whose lengths vary with squared coefficient of variation
    `prompt_length_cv2` (0: all the same length, as a fixed-length benchmark measures), with
    `cached_share` of each prompt's tokens, a prefix, found in the prefix cache (not computed;
    at most TUNING.max_cached_share). Attention costs the square of a prompt's length, so varied
    lengths cost more than prompts of the mean length. The rate counts every prompt token,
    cached or not, as the engines' prompt-token counters do. Decode: the largest
    batch of sequences holding `prompt_tokens` of context whose ITL meets the target and whose
    KV cache fits, at that batch's token rate (linear in the context: the mean is enough).
    """
    profiles = resolved.profiles(role, pool.name)
    if profiles is None:
        return None
    hardware, model = profiles
    cards = replica_cards(pool)
    if role == "prefill":
        return _prefill_tokens_per_second(
            hardware, model, cards, prompt_tokens, prompt_length_cv2, cached_share=cached_share
        )
    most = min(
        TUNING.max_decode_batch, max_concurrent_sequences(hardware, model, cards, prompt_tokens)
    )
    if most < 1:
        return None  # the weights, or one sequence's KV, do not fit
    target_ms = resolved.role(role).target.target_milliseconds
    low, high = 1, most  # ITL grows with the batch: find the largest batch within the target
    while low < high:
        middle = (low + high + 1) // 2
        if decode_itl_ms(hardware, model, cards, middle, prompt_tokens) <= target_ms:
            low = middle
        else:
            high = middle - 1
    return low / (decode_itl_ms(hardware, model, cards, low, prompt_tokens) / 1000)


def _prefill_tokens_per_second(
    hardware: HardwareProfile,
    model: ModelProfile,
    cards: int,
    prompt_tokens: float,
    cv2: float,
    *,
    cached_share: float = 0.0,
) -> float:
    prompt = max(1.0, prompt_tokens)
    # A cached prefix of share h costs neither its tokens nor their attention: a prompt's
    # computed work is n(1 - h) tokens and n^2(1 - h^2) of attention (`batch_ms`).
    cached = min(max(cached_share, 0.0), TUNING.max_cached_share)
    computed = max(1.0, prompt * (1 - cached))
    batch = max(1, int(TUNING.prefill_batch_tokens // computed))
    coefficients = PrefillCoefficients.from_profiles(hardware, model, cards)
    squares = (1 + cv2) * prompt**2 * (1 - cached**2)
    batch_ms = coefficients.a_ms + batch * (
        coefficients.b_ms_per_token * computed + coefficients.c_ms_per_token2 * squares
    )
    return batch * prompt / (batch_ms / 1000)


def cache_speedup(resolved: ResolvedSpec, prompt_tokens: float, cached_share: float) -> float:
    """How many times the prompt tokens/s of cold prompts of mean length `prompt_tokens` a
    prefill replica serves with `cached_share` of each prompt found cached: the first prefill
    pool with a known profile's; 1.0 without one."""
    if cached_share <= 0:
        return 1.0
    for pool in resolved.spec.pools("prefill"):
        profiles = resolved.profiles("prefill", pool.name)
        if profiles is not None:
            hardware, model = profiles
            cards, cv2 = replica_cards(pool), TUNING.prompt_length_cv2
            warm = _prefill_tokens_per_second(
                hardware, model, cards, prompt_tokens, cv2, cached_share=cached_share
            )
            return warm / _prefill_tokens_per_second(hardware, model, cards, prompt_tokens, cv2)
    return 1.0


def prefill_utilisation(
    resolved: ResolvedSpec,
    per_replica: Mapping[str, float],
    prompt_tokens: float,
    servers: int,
    *,
    cached_share: float = 0.0,
) -> float:
    """The utilisation at which `servers` prefill replicas still meet the TTFT target at its
    percentile (`core.queueing.pooled_utilisation`), for the slowest pool with an estimate in
    `per_replica` (tokens/s). Prompts of mean `prompt_tokens` are taken as exponentially
    distributed (TUNING.prompt_length_cv2); with a known profile a prompt's service grows with its
    length as the performance model says (attention), `cached_share` of each prompt cached,
    else linearly. MAX_UTILISATION when no pool has an estimate."""
    terms = resolved.role("prefill")
    found = [
        _pool_utilisation(
            terms.profiles[pool.name],
            replica_cards(pool),
            prompt_tokens=_two_digits(prompt_tokens),
            cached_share=round(cached_share, 2),
            tokens_per_second=_two_digits(per_replica[pool.name]),
            target_s=terms.target.target_milliseconds / 1000,
            share=terms.share,
            servers=max(1, servers),
        )
        for pool in resolved.spec.pools("prefill")
        if per_replica.get(pool.name, 0.0) > 0
    ]
    return min(found, default=MAX_UTILISATION)


def _two_digits(value: float) -> float:
    """`value` to two significant digits: nearby inputs share one cached answer."""
    return float(f"{max(value, 1.0):.2g}")


@functools.lru_cache(maxsize=4096)
def _pool_utilisation(
    profiles: Profiles | None,
    cards: int,
    *,
    prompt_tokens: float,
    cached_share: float,
    tokens_per_second: float,
    target_s: float,
    share: float,
    servers: int,
) -> float:
    lengths = exponential_lengths(prompt_tokens, TUNING.length_classes)
    if profiles is None:
        service = [length / tokens_per_second for length in lengths]
    else:
        hardware, model = profiles
        # The estimate is the profile's rate for this mean prompt times a learned speed.
        cv2 = TUNING.prompt_length_cv2
        speed = tokens_per_second / _prefill_tokens_per_second(
            hardware, model, cards, prompt_tokens, cv2, cached_share=cached_share
        )
        service = [
            length
            / (
                _prefill_tokens_per_second(
                    hardware, model, cards, length, 0.0, cached_share=cached_share
                )
                * speed
            )
            for length in lengths
        ]
    return pooled_utilisation(service, target_s, share, servers)


def decode_utilisation(resolved: ResolvedSpec, context_tokens: float, dispersion: float) -> float:
    """The share of its seed capacity a decode replica may serve and still meet the ITL target
    at its percentile, for the slowest decode pool with a known profile; 1.0 without one.

    The batch swings around its mean: its variance is `dispersion` times the mean (1 for
    Poisson arrivals, more for bursts), and a step of the batch at the percentile (a normal
    approximation) must stay within the target. The seed is the batch whose mean step meets
    it, so a percentile above the median leaves less room; at P50 the seed itself.
    """
    terms = resolved.role("decode")
    found = [
        _decode_utilisation(
            *profiles,
            replica_cards(pool),
            context_tokens=_two_digits(context_tokens),
            target_ms=terms.target.target_milliseconds,
            z=NormalDist().inv_cdf(terms.share),
            dispersion=_two_digits(dispersion),
        )
        for pool in resolved.spec.pools("decode")
        if (profiles := terms.profiles[pool.name]) is not None
    ]
    return min((u for u in found if u is not None), default=1.0)


@functools.lru_cache(maxsize=4096)
def _decode_utilisation(
    hardware: HardwareProfile,
    model: ModelProfile,
    cards: int,
    *,
    context_tokens: float,
    target_ms: float,
    z: float,
    dispersion: float,
) -> float | None:
    coefficients = DecodeCoefficients.from_profiles(hardware, model, cards)
    most = min(
        TUNING.max_decode_batch,
        max_concurrent_sequences(hardware, model, cards, round(context_tokens)),
    )
    if most < 1:
        return None

    def step_ms(batch: float) -> float:
        return coefficients.step_ms(batch, batch * context_tokens)

    def fits(mean: float) -> bool:
        swing = max(0.0, z) * math.sqrt(dispersion * mean)
        return step_ms(min(float(most), mean + swing)) <= target_ms

    seed = _largest(lambda batch: step_ms(batch) <= target_ms, most)
    mean = _largest(fits, seed)
    if seed <= 0 or mean <= 0:
        return None
    return (mean / step_ms(mean)) / (seed / step_ms(seed))


def _largest(holds: Callable[[float], bool], most: float) -> float:
    """The largest batch in (0, most] for which `holds` is true (it is monotone); 0: none."""
    if holds(most):
        return most
    low, high = 0.0, most
    for _ in range(40):  # to well under a sequence
        middle = (low + high) / 2
        low, high = (middle, high) if holds(middle) else (low, middle)
    return low


def decode_context_tokens(
    resolved: ResolvedSpec,
    ready: Mapping[str, int],
    kv_cache_usage: float | None,
    running: float | None,
) -> float | None:
    """Tokens of context a running decode sequence holds on average: the KV cache the Ready
    replicas hold (their mean usage times each one's capacity from its profile) over the
    sequences running. None when no sequence runs, the usage is unknown, or a Ready pool has
    no known profile.

    A decode step reads every running sequence's context, so its cost follows this, not the
    prompt: a long answer holds its prompt and the answer so far (reasoning at 1K in, 3K out
    holds about 3K, and sized on the prompt a replica's capacity read three times too high).
    """
    if kv_cache_usage is None or running is None or running < 1:
        return None
    held = 0.0
    for pool in resolved.spec.pools("decode"):
        count = ready.get(pool.name, 0)
        if count == 0:
            continue
        profiles = resolved.profiles("decode", pool.name)
        if profiles is None:
            return None
        held += count * kv_capacity_tokens(*profiles, replica_cards(pool))
    if held <= 0:
        return None
    return max(1.0, kv_cache_usage * held / running)


def seed_load_seconds(resolved: ResolvedSpec, role: Role, pool: PoolSpec) -> float | None:
    """Model-load time of one replica from the profiles, or None when they are unknown."""
    profiles = resolved.profiles(role, pool.name)
    if profiles is None:
        return None
    return model_load_seconds(*profiles, replica_cards(pool))


def _breach_correction(latency_ratio: float) -> float:
    return (
        min(latency_ratio, TUNING.max_breach_correction)
        if latency_ratio > TUNING.breach_ratio
        else 1.0
    )


Evidence = Literal["breach", "near", "under"]


def latency_evidence(ratio: float, bucket: tuple[float, float] | None) -> Evidence | None:
    """What a latency reading (observed/target, in its histogram bucket, also /target; None:
    exact) says about the load: past the SLO capacity, at it, under it, or nothing certain."""
    if ratio > TUNING.breach_ratio or (bucket is not None and bucket[0] >= 1):
        return "breach"  # past the target for sure: what is served bounds the capacity
    lower, upper = bucket or (ratio, ratio)
    if ratio >= TUNING.learn_low_ratio:
        return "near" if lower > 0 and upper <= TUNING.max_bucket_span * lower else None
    return "under" if upper <= TUNING.breach_ratio else None


@dataclass(frozen=True)
class PoolEvidence:
    """One pool's own reading over the window: its latency (observed/target, in its bucket,
    also /target; None: exact) and the tokens/s its replicas served."""

    latency_ratio: float
    latency_bucket: tuple[float, float] | None
    served_tokens_per_second: float


@dataclass(frozen=True)
class RoleCapacity:
    """Per-replica capacity of a role's pools, and how it was obtained.

    With a basis, values are tokens/s per replica. Without one (no profile, no traffic yet) they
    are cards per replica: good for relative sizes between pools, not for demand.
    """

    per_replica: Mapping[str, float]
    basis: CapacityBasis | None
    # With profile seeds, the learned correction: estimate / seed. The seeds follow the prompt
    # length the role sees now; the factor carries what observation taught (the engine's real
    # efficiency, the prompt mix), so a change of prompt length does not undo the learning.
    # None without seeds: the estimates themselves are remembered.
    factor: float | None = None
    # Each pool's own factor where it differs from the role's (`PoolEvidence`); a pool not
    # named here takes `factor`.
    pool_factors: Mapping[str, float] = field(default_factory=dict)


def _per_card_fill(pools: Sequence[PoolSpec], known: dict[str, float]) -> None:
    """A pool without an estimate runs at the known pools' average rate per card."""
    if known and len(known) < len(pools):
        cards = sum(replica_cards(p) for p in pools if p.name in known)
        per_card = sum(known.values()) / cards
        for pool in pools:
            known.setdefault(pool.name, per_card * replica_cards(pool))


def seeds(
    resolved: ResolvedSpec, role: Role, prompt_tokens: int, cached_share: float = 0.0
) -> dict[str, float]:
    """Profile seeds of a role's pools for prompts of mean length `prompt_tokens` with
    `cached_share` of their tokens in the prefix cache; empty when no pool of the role has a
    known profile."""
    pools = resolved.spec.pools(role)
    known: dict[str, float] = {}
    for pool in pools:
        seed = seed_capacity(
            resolved,
            role,
            pool,
            prompt_tokens,
            prompt_length_cv2=TUNING.prompt_length_cv2,
            cached_share=cached_share,
        )
        if seed is not None:
            known[pool.name] = seed
    _per_card_fill(pools, known)
    return known


def estimate_capacity(
    resolved: ResolvedSpec,
    role: Role,
    *,
    remembered: Mapping[str, float],
    basis: CapacityBasis | None,
    ready: Mapping[str, int],
    served_tokens_per_second: float | None,
    latency_ratio: float | None,
    prompt_tokens: int,
    latency_bucket: tuple[float, float] | None = None,
    factor: float | None = None,
    saturated: bool = False,
    cached_share: float = 0.0,
    bound_only: bool = False,
    pool_factors: Mapping[str, float] | None = None,
    pools_read: Mapping[str, PoolEvidence] | None = None,
) -> RoleCapacity:
    """This interval's capacity estimate, corrected by what the ready replicas serve at the
    latency they show: the seeds times the learned `factor`, or without seeds the remembered
    estimates. `saturated`: the replicas were busy all the time (a TTFT target's worth of
    prompts waiting, `RoleLoad.saturated`), so in a breach what they served is their throughput,
    the quantity prefill seeds estimate; a prefill breach without it teaches nothing, except
    as a role's first estimate. `bound_only`: what was served bounds the capacity from below
    and no more (replicas became Ready within the window), so only a reading well under the
    target teaches, and only upward. `pool_factors`: pools' own learned factors (`factor` for
    the others); `pools_read`: each pool's own reading, which corrects that pool alone where
    the role has several."""
    pools: Sequence[PoolSpec] = resolved.spec.pools(role)
    known = seeds(resolved, role, prompt_tokens, cached_share)
    from_seeds = bool(known)
    scale = 1.0 if factor is None else factor
    scales = {p.name: (pool_factors or {}).get(p.name, scale) for p in pools}
    if from_seeds:
        known = {name: value * scales[name] for name, value in known.items()}
        if factor is None or basis is None:
            basis = "profile"
    else:
        known = {p.name: remembered[p.name] for p in pools if p.name in remembered}
        if known and basis is None:
            basis = "lower-bound"  # a remembered value of unknown origin: trust it least
        _per_card_fill(pools, known)

    def result(
        per_replica: dict[str, float],
        change: float,
        how: CapacityBasis | None,
        changes: Mapping[str, float] | None = None,
    ) -> RoleCapacity:
        if not from_seeds:
            return RoleCapacity(per_replica, how)
        own = {
            name: scales[name] * (changes or {}).get(name, change)
            for name in per_replica
            if name in (changes or {}) or name in (pool_factors or {})
        }
        return RoleCapacity(per_replica, how, scale * change, own)

    served = served_tokens_per_second or 0.0
    # Idle replicas say nothing about capacity, nor does a reading its bucket cannot resolve.
    evidence = None if latency_ratio is None else latency_evidence(latency_ratio, latency_bucket)
    if bound_only and evidence != "under":
        evidence = None
    if (
        role == "prefill"
        and evidence == "breach"
        and not saturated
        and known
        and basis != "lower-bound"
    ):
        # No queue to speak of: the replicas had (nearly) caught up with all that arrived, so
        # the breach came from a burst inside the window that they absorbed, not from a
        # throughput short of the load. The window's served rate averages the burst with the
        # quiet around it and bounds nothing (a 30 s burst at half the window's mean cut the
        # estimate to 0.4). A role with no estimate yet still takes it as its first: a low one
        # over-provisions, none would leave the role to feedback alone; so does a lower bound
        # (the breach of a probe one replica down is what ends the probing).
        evidence = None
    ratio = latency_ratio if served > 0 and evidence else None
    if not known:
        ready_cards = sum(ready.get(p.name, 0) * replica_cards(p) for p in pools)
        cards = {p.name: float(replica_cards(p)) for p in pools}
        if ratio is None or ready_cards == 0:
            return RoleCapacity(cards, None)
        per_card = served / ready_cards / _breach_correction(ratio)
        first: CapacityBasis = "lower-bound" if evidence == "under" else "observed"
        return RoleCapacity({name: per_card * c for name, c in cards.items()}, first)
    estimated = sum(ready.get(name, 0) * value for name, value in known.items())
    if ratio is None or evidence is None or estimated <= 0:
        return result(known, 1.0, basis)
    from_below = basis == "lower-bound"
    measured = served / estimated  # what the estimate must be multiplied by to match
    change = _change(evidence, measured, ratio, saturated=saturated, from_below=from_below)
    if evidence in ("breach", "near"):
        basis = "observed"
    changes: dict[str, float] = {}
    if pools_read and len(pools) > 1:
        # Read per pool, a pool is corrected by its own reading or not at all: another pool's
        # breach says nothing of it (a spill-over pool that was not running yet kept the cut
        # its busy neighbour had earned).
        own = _pool_changes(
            role,
            pools_read,
            known,
            ready,
            role_evidence=evidence,
            bound_only=bound_only,
            saturated=saturated,
            from_below=from_below,
        )
        changes = {name: own.get(name, 1.0) for name in known}
    per_replica = {name: value * changes.get(name, change) for name, value in known.items()}
    return result(per_replica, change, basis, changes)


def _change(
    evidence: Evidence, measured: float, ratio: float, *, saturated: bool, from_below: bool
) -> float:
    """What an estimate is multiplied by after a reading: `measured` is served / estimated."""
    # A lower bound is no estimate to average with: the first observation at or past the SLO
    # replaces it.
    if evidence == "breach":
        bound = measured if saturated else measured / _breach_correction(ratio)
        return bound if from_below else min(1.0, bound)
    if evidence == "near":
        return measured if from_below else 1 + TUNING.ema_weight * (measured - 1)
    return max(1.0, measured)


def _pool_changes(
    role: Role,
    pools_read: Mapping[str, PoolEvidence],
    known: Mapping[str, float],
    ready: Mapping[str, int],
    *,
    role_evidence: Evidence,
    bound_only: bool,
    saturated: bool,
    from_below: bool,
) -> dict[str, float]:
    """Each pool's correction from its own reading, for the pools that have one that teaches.

    The same rules as the role's, with what is only known per role taken from it: whether the
    replicas were saturated, whether a breach is confirmed by queueing (a pool's breach read in
    a bucket that also holds values under the target teaches only when the role's does).
    """
    changes: dict[str, float] = {}
    for name, read in pools_read.items():
        estimated = ready.get(name, 0) * known.get(name, 0.0)
        if estimated <= 0 or read.served_tokens_per_second <= 0:
            continue
        evidence = latency_evidence(read.latency_ratio, read.latency_bucket)
        unplaced = read.latency_bucket is not None and read.latency_bucket[0] < 1
        if evidence == "breach" and (
            (unplaced and role_evidence != "breach")
            # As for the role: a prefill breach without a queue is a burst absorbed.
            or (role == "prefill" and not saturated and not from_below)
        ):
            evidence = None
        if bound_only and evidence != "under":
            evidence = None
        if evidence is None:
            continue
        measured = read.served_tokens_per_second / estimated
        changes[name] = _change(
            evidence, measured, read.latency_ratio, saturated=saturated, from_below=from_below
        )
    return changes
