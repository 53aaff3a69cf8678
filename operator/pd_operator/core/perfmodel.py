"""Performance model of one engine replica: prefill and decode time, KV size, capacity.

Pure functions of a `HardwareProfile`, a `ModelProfile` and the replica's card count (a pool's
cards per replica). The engine simulator, the offline simulator and the capacity planner all
use these, so one set of assumptions drives every estimate. The formulas, every assumption and
the published anchors they are checked against are in docs/performance-model.md.

Prefill batch time is `a + b*sum(L - P) + c*sum(L**2 - P**2)` for prompts of L tokens whose
first P tokens hit the prefix cache: cached tokens skip the linear (GEMM) work, and the uncached
rows of causal attention still attend to the cached prefix. Decode step time is
`a + routed*touched(batch) + b*sum(context) + c*batch`, where an MoE batch reads only the
routed experts it touches.
"""

import math
from collections.abc import Sequence
from dataclasses import dataclass

from pd_operator.core.hardware import HardwareProfile, ModelProfile

# Activations exchanged between tensor-parallel cards are BF16 even for FP8 models.
ACTIVATION_BYTES = 2
# Engine time per prefill forward beyond weights and FLOPs: scheduling, eager kernel launches,
# sampling. Assumption: the published Llama-2-70B fit's 29.8 ms intercept minus the ~7 ms weight
# read the model already counts, rounded down; no other engine publishes an intercept.
DEFAULT_PREFILL_OVERHEAD_MS = 20.0
# The same per decode step, where engines replay captured graphs. Assumption: a few ms on
# large tensor-parallel replicas (order of magnitude from vLLM/SGLang step traces).
DEFAULT_DECODE_OVERHEAD_MS = 2.0
# Fraction of card memory the engine may use for weights and KV (vLLM's default
# --gpu-memory-utilization); the rest covers activations and runtime buffers.
DEFAULT_MEMORY_UTILIZATION = 0.9

MS_PER_SECOND = 1000.0


def _require_cards(cards: int) -> None:
    if cards < 1:
        raise ValueError(f"a replica needs at least one card, got {cards}")


def kv_bytes_per_token(model: ModelProfile, kv_dtype_bytes: int | None = None) -> int:
    """KV-cache bytes one token occupies: 2 * layers * kv_heads * head_dim * element bytes.

    `kv_dtype_bytes` overrides the model's KV element size (a pool's cacheDtype).
    """
    element_bytes = model.kv_dtype_bytes if kv_dtype_bytes is None else kv_dtype_bytes
    return 2 * model.layers * model.kv_heads * model.head_dim * element_bytes


def kv_transfer_seconds(tokens: int, model: ModelProfile, link_bytes_per_second: float) -> float:
    """Seconds to move the KV cache of `tokens` tokens over a link (RDMA, prefill to decode)."""
    if link_bytes_per_second <= 0:
        raise ValueError("link bandwidth must be positive")
    return tokens * kv_bytes_per_token(model) / link_bytes_per_second


def _weight_read_ms(hardware: HardwareProfile, cards: int, nbytes: float) -> float:
    # Each card streams its own shard; all cards read in parallel.
    rate = cards * hardware.memory_bandwidth_bytes_per_second * hardware.mbu
    return nbytes / rate * MS_PER_SECOND


def _exchange_ms_per_token(
    hardware: HardwareProfile, model: ModelProfile, cards: int, exposed_exchange: bool | None
) -> float:
    """Card-to-card exchange per token that adds to its time.

    Dense models are served tensor-parallel: two all-reduces of the hidden state per layer, a
    ring sending 2(k-1)/k of the message from each card one direction at a time, not overlapped
    with compute (vLLM, SGLang). Large MoE models are served expert-parallel with dispatch and
    combine overlapped with compute (two-batch overlap), which hides the exchange. `None` picks
    by model: exposed for dense, hidden for MoE.
    """
    exposed = model.routed_experts == 0 if exposed_exchange is None else exposed_exchange
    if cards == 1 or not exposed:
        return 0.0
    message_bytes = model.d_model * ACTIVATION_BYTES
    bytes_per_card = model.layers * 2 * 2 * (cards - 1) / cards * message_bytes
    one_direction = hardware.interconnect_bytes_per_second / 2
    return bytes_per_card / one_direction * MS_PER_SECOND


@dataclass(frozen=True)
class PrefillCoefficients:
    """Prefill batch time `a + b*sum(L - P) + c*sum(L**2 - P**2)` in milliseconds."""

    a_ms: float
    b_ms_per_token: float
    c_ms_per_token2: float

    def __post_init__(self) -> None:
        for value in (self.a_ms, self.b_ms_per_token, self.c_ms_per_token2):
            if not math.isfinite(value) or value < 0:
                raise ValueError(f"prefill coefficients must be finite and >= 0, got {self}")

    @classmethod
    def from_profiles(
        cls,
        hardware: HardwareProfile,
        model: ModelProfile,
        cards: int,
        *,
        overhead_ms: float = DEFAULT_PREFILL_OVERHEAD_MS,
        exposed_exchange: bool | None = None,
    ) -> "PrefillCoefficients":
        """Coefficients from FLOPs: 2*P_active per token, 2*layers*attention_width per token pair.

        The quadratic term counts causal attention (kernels skip the masked half of the n x n
        scores); `b` adds the exposed card-to-card exchange per token (see
        `_exchange_ms_per_token`). `a` is the engine overhead plus one read of all weights, which
        bounds a short prompt from below. Fitted coefficients go straight to the constructor.
        """
        _require_cards(cards)
        flops_per_ms = cards * hardware.dense_flops(model.weight_dtype_bytes) * hardware.mfu
        flops_per_ms /= MS_PER_SECOND
        return cls(
            a_ms=overhead_ms + _weight_read_ms(hardware, cards, model.weight_bytes),
            b_ms_per_token=2 * model.active_params / flops_per_ms
            + _exchange_ms_per_token(hardware, model, cards, exposed_exchange),
            c_ms_per_token2=2 * model.layers * model.attention_width / flops_per_ms,
        )

    def batch_ms(
        self, prompt_tokens: Sequence[int], cached_tokens: Sequence[int] | None = None
    ) -> float:
        """Time of one prefill batch; `cached_tokens[i]` of prompt i hit the prefix cache."""
        if not prompt_tokens:
            return 0.0
        cached = [0] * len(prompt_tokens) if cached_tokens is None else cached_tokens
        if len(cached) != len(prompt_tokens):
            raise ValueError("cached_tokens needs one entry per prompt")
        if any(not 0 <= p <= n for n, p in zip(prompt_tokens, cached, strict=True)):
            raise ValueError("cached tokens must lie between 0 and the prompt length")
        linear = sum(n - p for n, p in zip(prompt_tokens, cached, strict=True))
        quadratic = sum(n * n - p * p for n, p in zip(prompt_tokens, cached, strict=True))
        return self.a_ms + self.b_ms_per_token * linear + self.c_ms_per_token2 * quadratic


def decode_weight_bytes(model: ModelProfile, batch: int | None = None) -> float:
    """Weight bytes one decode step reads for `batch` sequences.

    A dense model reads all of them. An MoE step reads the shared parameters plus the routed
    experts the batch touches: `routed_share_touched` of them. `None` reads every expert.
    """
    if batch is None or model.routed_experts == 0:
        return float(model.weight_bytes)
    if batch < 1:
        raise ValueError(f"a decode batch has at least one sequence, got {batch}")
    every_step, routed, share = _decode_weight_split(model)
    return every_step + routed * routed_share_touched(share, batch)


def _decode_weight_split(model: ModelProfile) -> tuple[float, float, float]:
    """Bytes every decode step reads, bytes of all routed experts, and the share of them one
    sequence uses: all weights, 0 and 0 for a dense model."""
    if model.routed_experts == 0:
        return float(model.weight_bytes), 0.0, 0.0
    shared = float(model.shared_params * model.weight_dtype_bytes)
    return (
        shared,
        model.total_params * model.weight_dtype_bytes - shared,
        model.experts_per_token / model.routed_experts,
    )


def routed_share_touched(expert_share: float, batch: float) -> float:
    """Share of the routed experts a step of `batch` sequences reads when each sequence uses
    `expert_share` of them: 1 - (1 - share)**batch under uniform independent routing, an upper
    bound (real routing concentrates on hot experts)."""
    return 1 - (1 - expert_share) ** batch if batch > 0 else 0.0


@dataclass(frozen=True)
class DecodeCoefficients:
    """Decode step time `a + routed*touched(batch) + b*sum(context) + c*batch` in milliseconds.

    `routed` is one read of every routed expert (MoE; 0 for a dense model or a fit), of which a
    step reads the share its batch touches (`routed_share_touched` at `expert_share`): small
    batches of an MoE model skip experts no sequence routes to.
    """

    a_ms: float
    b_ms_per_context_token: float
    c_ms_per_sequence: float
    routed_ms: float = 0.0
    expert_share: float = 0.0

    def __post_init__(self) -> None:
        for value in (self.a_ms, self.b_ms_per_context_token, self.c_ms_per_sequence):
            if not math.isfinite(value) or value < 0:
                raise ValueError(f"decode coefficients must be finite and >= 0, got {self}")
        if not math.isfinite(self.routed_ms) or self.routed_ms < 0:
            raise ValueError(f"routed_ms must be finite and >= 0, got {self.routed_ms}")
        if not 0 <= self.expert_share <= 1:
            raise ValueError(f"expert_share must lie in [0, 1], got {self.expert_share}")

    @classmethod
    def from_profiles(
        cls,
        hardware: HardwareProfile,
        model: ModelProfile,
        cards: int,
        *,
        overhead_ms: float = DEFAULT_DECODE_OVERHEAD_MS,
        exposed_exchange: bool | None = None,
    ) -> "DecodeCoefficients":
        """Memory-bound coefficients: weight and KV bytes over cards x bandwidth x MBU.

        `a` reads the weights every step reads (all of a dense model, an MoE model's shared
        parameters), `routed` every routed expert once. Per-sequence GEMM FLOPs stay hidden under
        the weight read at decode batch sizes; `c` is each sequence's exposed card-to-card
        exchange (dense models; 0 for MoE by default).
        """
        _require_cards(cards)
        kv_read_ms = _weight_read_ms(hardware, cards, kv_bytes_per_token(model))
        every_step, routed, share = _decode_weight_split(model)
        return cls(
            a_ms=overhead_ms + _weight_read_ms(hardware, cards, every_step),
            b_ms_per_context_token=kv_read_ms,
            c_ms_per_sequence=_exchange_ms_per_token(hardware, model, cards, exposed_exchange),
            routed_ms=_weight_read_ms(hardware, cards, routed),
            expert_share=share,
        )

    def fixed_ms(self, batch: float) -> float:
        """The part of a step of `batch` sequences that does not grow with their context."""
        routed = self.routed_ms * routed_share_touched(self.expert_share, batch)
        return self.a_ms + routed + self.c_ms_per_sequence * batch

    def step_ms(self, batch: float, total_context_tokens: float) -> float:
        """Time of one decode step for `batch` sequences holding `total_context_tokens`."""
        if batch < 0 or total_context_tokens < 0:
            raise ValueError("batch and context must not be negative")
        if batch == 0:
            return 0.0
        return self.fixed_ms(batch) + self.b_ms_per_context_token * total_context_tokens


def prefill_tokens_per_second_per_card(
    hardware: HardwareProfile,
    model: ModelProfile,
    cards: int,
    context_tokens: int,
    concurrency: int,
    *,
    cache_hit_rate: float = 0.0,
) -> float:
    """Prompt tokens per second per card for `concurrency` prompts of `context_tokens` each.

    The prompts form one batch. Cached tokens count as served, as engines' prompt-token counters
    count them, but cost only their share of attention.
    """
    if context_tokens < 1 or concurrency < 1:
        raise ValueError("context and concurrency must be positive")
    if not 0 <= cache_hit_rate <= 1:
        raise ValueError(f"cache hit rate must lie in [0, 1], got {cache_hit_rate}")
    coefficients = PrefillCoefficients.from_profiles(hardware, model, cards)
    cached = math.floor(cache_hit_rate * context_tokens)
    batch_ms = coefficients.batch_ms([context_tokens] * concurrency, [cached] * concurrency)
    return concurrency * context_tokens / (batch_ms / MS_PER_SECOND) / cards


def decode_itl_ms(
    hardware: HardwareProfile, model: ModelProfile, cards: int, batch: int, context_tokens: int
) -> float:
    """Inter-token latency of `batch` sequences that each hold `context_tokens` tokens."""
    coefficients = DecodeCoefficients.from_profiles(hardware, model, cards)
    return coefficients.step_ms(batch, batch * context_tokens)


def kv_capacity_tokens(
    hardware: HardwareProfile,
    model: ModelProfile,
    cards: int,
    *,
    memory_utilization: float = DEFAULT_MEMORY_UTILIZATION,
) -> int:
    """Tokens of KV cache a replica holds after its weights; 0 when the weights do not fit."""
    _require_cards(cards)
    if not 0 < memory_utilization <= 1:
        raise ValueError(f"memory utilisation must lie in (0, 1], got {memory_utilization}")
    free_bytes = cards * hardware.memory_bytes * memory_utilization - model.weight_bytes
    return max(0, math.floor(free_bytes / kv_bytes_per_token(model)))


def max_concurrent_sequences(
    hardware: HardwareProfile,
    model: ModelProfile,
    cards: int,
    context_tokens: int,
    *,
    memory_utilization: float = DEFAULT_MEMORY_UTILIZATION,
) -> int:
    """Sequences of `context_tokens` tokens whose KV cache fits in a replica at once."""
    if context_tokens < 1:
        raise ValueError("context must be positive")
    return (
        kv_capacity_tokens(hardware, model, cards, memory_utilization=memory_utilization)
        // context_tokens
    )


def model_load_seconds(hardware: HardwareProfile, model: ModelProfile, cards: int) -> float:
    """Seconds from engine start to serving: start-up plus each card loading its weight shard."""
    _require_cards(cards)
    shard_bytes = model.weight_bytes / cards
    return hardware.engine_start_seconds + shard_bytes / hardware.weight_load_bytes_per_second
