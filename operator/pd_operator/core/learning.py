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

Signals are per role, so one role's observation corrects all its pools by the same factor: the
pools keep their relative speeds (from profiles, else cards per replica).
"""

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from pd_operator.api.spec import PDDeploymentSpec, PoolSpec, Role
from pd_operator.core.hardware import HARDWARE_PROFILES, MODEL_PROFILES, ModelProfile
from pd_operator.core.perfmodel import (
    decode_itl_ms,
    max_concurrent_sequences,
    model_load_seconds,
    prefill_tokens_per_second_per_card,
)
from pd_operator.core.policy_state import CapacityBasis

# Latency/target above which the replicas are past their SLO capacity.
BREACH_RATIO = 1.1
# Latency/target under which the served rate only bounds capacity from below.
LEARN_LOW_RATIO = 0.85
# Weight of one near-target observation in the moving average.
EMA_WEIGHT = 0.3
# In a breach the served rate is divided by the latency ratio (a linear latency model) to
# estimate the rate at the target; capped because far past saturation latency is all queueing
# and says nothing more about capacity.
MAX_BREACH_CORRECTION = 1.25
# Prompt length for seeds before any traffic shows the real one. Assumption: a typical chat or
# RAG prompt; learning replaces it within minutes of traffic.
DEFAULT_PROMPT_TOKENS = 4096
# Tokens per prefill batch: vLLM's default max_num_batched_tokens on large cards.
PREFILL_BATCH_TOKENS = 8192
# Decode batches searched for the seed; engines default to at most 1024 sequences.
MAX_DECODE_BATCH = 1024


def model_profile_for(model_name: str) -> ModelProfile | None:
    """The model profile whose name is the model's last path component, case-insensitively."""
    return MODEL_PROFILES.get(model_name.rstrip("/").rsplit("/", 1)[-1].lower())


def seed_capacity(
    spec: PDDeploymentSpec, role: Role, pool: PoolSpec, prompt_tokens: int
) -> float | None:
    """Tokens/s per replica from the performance model, or None when the profiles are unknown.

    Prefill: prompts of `prompt_tokens` in batches of up to PREFILL_BATCH_TOKENS. Decode: the
    largest batch of sequences holding `prompt_tokens` of context whose ITL meets the target and
    whose KV cache fits, at that batch's token rate.
    """
    hardware = HARDWARE_PROFILES.get(pool.accelerator.profile or "")
    model = model_profile_for(spec.model.name)
    if hardware is None or model is None:
        return None
    cards = pool.accelerator.per_replica
    if role == "prefill":
        batch = max(1, PREFILL_BATCH_TOKENS // prompt_tokens)
        per_card = prefill_tokens_per_second_per_card(hardware, model, cards, prompt_tokens, batch)
        return per_card * cards
    most = min(MAX_DECODE_BATCH, max_concurrent_sequences(hardware, model, cards, prompt_tokens))
    if most < 1:
        return None  # the weights, or one sequence's KV, do not fit
    target_ms = spec.slo.itl.target_milliseconds
    low, high = 1, most  # ITL grows with the batch: find the largest batch within the target
    while low < high:
        middle = (low + high + 1) // 2
        if decode_itl_ms(hardware, model, cards, middle, prompt_tokens) <= target_ms:
            low = middle
        else:
            high = middle - 1
    return low / (decode_itl_ms(hardware, model, cards, low, prompt_tokens) / 1000)


def seed_load_seconds(spec: PDDeploymentSpec, pool: PoolSpec) -> float | None:
    """Model-load time of one replica from the profiles, or None when they are unknown."""
    hardware = HARDWARE_PROFILES.get(pool.accelerator.profile or "")
    model = model_profile_for(spec.model.name)
    if hardware is None or model is None:
        return None
    return model_load_seconds(hardware, model, pool.accelerator.per_replica)


def _breach_correction(latency_ratio: float) -> float:
    return min(latency_ratio, MAX_BREACH_CORRECTION) if latency_ratio > BREACH_RATIO else 1.0


@dataclass(frozen=True)
class RoleCapacity:
    """Per-replica capacity of a role's pools, and how it was obtained.

    With a basis, values are tokens/s per replica. Without one (no profile, no traffic yet) they
    are cards per replica: good for relative sizes between pools, not for demand.
    """

    per_replica: Mapping[str, float]
    basis: CapacityBasis | None


def _fill_missing(
    spec: PDDeploymentSpec,
    role: Role,
    known: dict[str, float],
    basis: CapacityBasis | None,
    prompt_tokens: int,
) -> CapacityBasis | None:
    pools = spec.pools(role)
    for pool in pools:
        if pool.name not in known:
            seed = seed_capacity(spec, role, pool, prompt_tokens)
            if seed is not None:
                known[pool.name] = seed
                basis = basis or "profile"
    if known and len(known) < len(pools):
        # A pool without a profile runs at the known pools' average rate per card.
        cards = sum(p.accelerator.per_replica for p in pools if p.name in known)
        per_card = sum(known.values()) / cards
        for pool in pools:
            known.setdefault(pool.name, per_card * pool.accelerator.per_replica)
    return basis


def estimate_capacity(
    spec: PDDeploymentSpec,
    role: Role,
    *,
    remembered: Mapping[str, float],
    basis: CapacityBasis | None,
    ready: Mapping[str, int],
    served_tokens_per_second: float | None,
    latency_ratio: float | None,
    prompt_tokens: int,
) -> RoleCapacity:
    """This interval's capacity estimate: the remembered one (or seeds), corrected by what the
    ready replicas serve at the latency they show."""
    pools: Sequence[PoolSpec] = spec.pools(role)
    known = {p.name: remembered[p.name] for p in pools if p.name in remembered}
    if known and basis is None:
        basis = "lower-bound"  # a remembered value of unknown origin: trust it least
    basis = _fill_missing(spec, role, known, basis, prompt_tokens)
    served = served_tokens_per_second or 0.0
    ratio = latency_ratio if served > 0 else None  # idle replicas say nothing about capacity
    if not known:
        ready_cards = sum(ready.get(p.name, 0) * p.accelerator.per_replica for p in pools)
        cards = {p.name: float(p.accelerator.per_replica) for p in pools}
        if ratio is None or ready_cards == 0:
            return RoleCapacity(cards, None)
        per_card = served / ready_cards / _breach_correction(ratio)
        first: CapacityBasis = "observed" if ratio >= LEARN_LOW_RATIO else "lower-bound"
        return RoleCapacity({name: per_card * c for name, c in cards.items()}, first)
    estimated = sum(ready.get(name, 0) * value for name, value in known.items())
    if ratio is None or estimated <= 0:
        return RoleCapacity(known, basis)
    measured = served / estimated  # what the estimate must be multiplied by to match
    # A lower bound is no estimate to average with: the first observation at or past the SLO
    # replaces it.
    from_below = basis == "lower-bound"
    if ratio > BREACH_RATIO:
        bound = measured / _breach_correction(ratio)
        factor, basis = (bound if from_below else min(1.0, bound)), "observed"
    elif ratio >= LEARN_LOW_RATIO:
        factor = measured if from_below else 1 + EMA_WEIGHT * (measured - 1)
        basis = "observed"
    else:
        factor = max(1.0, measured)
    return RoleCapacity({name: value * factor for name, value in known.items()}, basis)
