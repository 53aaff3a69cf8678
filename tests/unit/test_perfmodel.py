"""The performance model against the published anchors, and its physical properties.

Each anchor test names the published figure and states the band the model is held to. Where the
model and a figure disagree, the test pins the measured gap (and docs/performance-model.md
explains it) rather than bending a profile number to hit the figure.
"""

import dataclasses
import re

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from pd_operator.core.hardware import (
    DEEPSEEK_V3_FP8,
    GLM_45_FP8,
    H100_SXM,
    H200_SXM,
    HARDWARE_PROFILES,
    KIMI_K2_FP8,
    LLAMA2_70B,
    MODEL_PROFILES,
    MTT_S5000,
)
from pd_operator.core.perfmodel import (
    DEFAULT_DECODE_OVERHEAD_MS,
    DecodeCoefficients,
    PrefillCoefficients,
    decode_itl_ms,
    decode_weight_bytes,
    kv_bytes_per_token,
    kv_capacity_tokens,
    kv_transfer_seconds,
    max_concurrent_sequences,
    model_load_seconds,
    prefill_tokens_per_second_per_card,
)

K = 1024


def published_llama_fit_ms(prompt_tokens: int) -> float:
    """Llama-2-70B on 8xH100, fitted on measured prefill times (CONTEXT.md)."""
    return 29.8 + 0.056 * prompt_tokens + 5.4e-6 * prompt_tokens**2


# --- profiles -----------------------------------------------------------------------------------


def test_registries_hold_the_named_cards_and_models():
    assert set(HARDWARE_PROFILES) == {"mtt-s5000", "h200", "h20", "h100"}
    assert HARDWARE_PROFILES["mtt-s5000"].resource_name == "mthreads.com/gpu"
    assert {p.resource_name for n, p in HARDWARE_PROFILES.items() if n != "mtt-s5000"} == {
        "nvidia.com/gpu"
    }
    assert {"glm-4.5-fp8", "llama-2-70b", "deepseek-v3-fp8", "kimi-k2-fp8"} <= set(MODEL_PROFILES)


def test_each_model_knows_its_context_length_and_refuses_a_non_positive_one():
    """config.json's max_position_embeddings: what vLLM takes without --max-model-len."""
    assert {m.name: m.max_context_tokens for m in MODEL_PROFILES.values()} == {
        "glm-4.5-fp8": 131_072,
        "llama-2-70b": 4096,
        "deepseek-v3-fp8": 163_840,
        "kimi-k2-fp8": 131_072,
    }
    with pytest.raises(ValueError, match="max_context_tokens"):
        dataclasses.replace(GLM_45_FP8, max_context_tokens=0)


@pytest.mark.parametrize(
    ("model", "expected_shared_billions"),
    [
        # Dense: every parameter is shared.
        (LLAMA2_70B, 69.0),
        # A = S + (P - S) k/E, solved for S; GLM-4.5 and DeepSeek-V3 land near their published
        # non-routed sizes (attention, dense layers, shared expert, embeddings: ~15-17B).
        (GLM_45_FP8, 15.0),
        (DEEPSEEK_V3_FP8, 16.5),
        (KIMI_K2_FP8, 11.9),
    ],
    ids=lambda v: getattr(v, "name", v),
)
def test_shared_parameters_follow_from_total_active_and_routing(model, expected_shared_billions):
    assert model.shared_params / 1e9 == pytest.approx(expected_shared_billions, abs=0.1)


@pytest.mark.parametrize(
    "change",
    [
        {"memory_bytes": 0},
        {"mfu": 0.0},
        {"mbu": 1.5},
        {"interconnect_bytes_per_second": -1.0},
        {"hourly_price_usd": -0.1},
    ],
    ids=str,
)
def test_an_impossible_hardware_profile_is_rejected(change):
    with pytest.raises(ValueError, match="h200"):
        dataclasses.replace(H200_SXM, **change)


@pytest.mark.parametrize(
    "change",
    [
        {"active_params": 400_000_000_000},  # more active than total
        {"routed_experts": 0},  # experts per token without experts
        {"experts_per_token": 200},  # more per token than exist
        {"active_params": 1_000_000_000},  # fewer than the routed experts alone need
        {"layers": 0},
    ],
    ids=str,
)
def test_an_impossible_model_profile_is_rejected(change):
    with pytest.raises(ValueError, match=re.escape(GLM_45_FP8.name)):
        dataclasses.replace(GLM_45_FP8, **change)


# --- KV cache -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("model", "kv_dtype_bytes", "expected"),
    [
        # 2 x 80 layers x 8 KV heads x 128 x 2 bytes: the often-quoted 320 KiB per token.
        (LLAMA2_70B, None, 327_680),
        # 2 x 92 x 8 x 128 x 1 byte (FP8).
        (GLM_45_FP8, None, 188_416),
        # MLA: 576 cached values per layer, 61 layers; FP8 then BF16. The BF16 figure is the
        # ~70 KB per token DeepSeek reports for V3.
        (DEEPSEEK_V3_FP8, None, 35_136),
        (DEEPSEEK_V3_FP8, 2, 70_272),
    ],
    ids=["llama2-70b-bf16", "glm-4.5-fp8", "deepseek-v3-fp8", "deepseek-v3-bf16"],
)
def test_kv_bytes_per_token(model, kv_dtype_bytes, expected):
    assert kv_bytes_per_token(model, kv_dtype_bytes) == expected


def test_kv_transfer_of_a_64k_glm_prompt_at_mooncake_bandwidths():
    # 64K tokens x 188,416 B = 12.3 GB; Mooncake measured 87-190 GB/s per 8-GPU node.
    tokens = 64 * K
    assert kv_transfer_seconds(tokens, GLM_45_FP8, 87e9) == pytest.approx(0.1419, rel=1e-3)
    assert kv_transfer_seconds(tokens, GLM_45_FP8, 190e9) == pytest.approx(0.0650, rel=1e-3)
    with pytest.raises(ValueError):
        kv_transfer_seconds(tokens, GLM_45_FP8, 0)


# --- fitted coefficients ------------------------------------------------------------------------


def test_fitted_prefill_coefficients_apply_the_published_form():
    fit = PrefillCoefficients(a_ms=29.8, b_ms_per_token=0.056, c_ms_per_token2=5.4e-6)
    assert fit.batch_ms([1000]) == pytest.approx(29.8 + 56 + 5.4)
    # A 600-token cached prefix removes 600 tokens of linear work, but the 400 new rows still
    # attend to it: quadratic work 1000^2 - 600^2, not 400^2.
    assert fit.batch_ms([1000], [600]) == pytest.approx(29.8 + 0.056 * 400 + 5.4e-6 * 640_000)
    # One overhead per batch, not per prompt.
    assert fit.batch_ms([1000, 1000]) == pytest.approx(29.8 + 112 + 10.8)
    assert fit.batch_ms([]) == 0.0


@pytest.mark.parametrize(
    ("prompts", "cached"),
    [([100], [101]), ([100], [-1]), ([100, 50], [0])],
    ids=["cached-beyond-prompt", "negative-cache", "length-mismatch"],
)
def test_prefill_rejects_inconsistent_cache_figures(prompts, cached):
    with pytest.raises(ValueError):
        PrefillCoefficients(1.0, 0.1, 0.0).batch_ms(prompts, cached)


def test_coefficients_reject_negative_or_infinite_values():
    with pytest.raises(ValueError):
        PrefillCoefficients(a_ms=-1.0, b_ms_per_token=0.1, c_ms_per_token2=0.0)
    with pytest.raises(ValueError):
        DecodeCoefficients(a_ms=1.0, b_ms_per_context_token=float("inf"), c_ms_per_sequence=0.0)


def test_fitted_decode_coefficients_apply_the_published_form():
    fit = DecodeCoefficients(a_ms=10.0, b_ms_per_context_token=1e-5, c_ms_per_sequence=0.1)
    assert fit.step_ms(batch=4, total_context_tokens=100_000) == pytest.approx(10 + 1 + 0.4)
    assert fit.step_ms(batch=0, total_context_tokens=0) == 0.0


def test_moe_decode_steps_read_the_routed_experts_their_batch_touches():
    moe = DecodeCoefficients(
        a_ms=2.0,
        b_ms_per_context_token=0.0,
        c_ms_per_sequence=0.0,
        routed_ms=10.0,
        expert_share=0.5,
    )
    assert moe.step_ms(1, 0) == pytest.approx(2 + 10 * 0.5)
    assert moe.step_ms(2, 0) == pytest.approx(2 + 10 * 0.75)
    assert moe.step_ms(64, 0) == pytest.approx(12.0)
    with pytest.raises(ValueError, match="expert_share"):
        dataclasses.replace(moe, expert_share=1.5)


# --- anchor: Llama-2-70B on 8xH100 (fitted: 29.8 + 0.056 L + 5.4e-6 L^2 ms) ---------------------

LLAMA_H100 = PrefillCoefficients.from_profiles(H100_SXM, LLAMA2_70B, 8)


def test_llama_linear_term_matches_the_fit_from_flops_and_tensor_parallel_exchange():
    # Not calibrated: 2 x 69B FLOPs at 8 x 989 TFLOPS x MFU 0.4 (0.0436 ms) plus the exposed
    # all-reduce of 80 layers x 2 x 16 KiB over NVLink (0.0102 ms) = 0.0538 vs the fit's 0.056.
    assert LLAMA_H100.b_ms_per_token == pytest.approx(0.056, rel=0.10)
    assert LLAMA_H100.b_ms_per_token == pytest.approx(0.0538, rel=0.01)


def test_llama_intercept_is_close_to_the_fit_because_the_overhead_came_from_it():
    # DEFAULT_PREFILL_OVERHEAD_MS (20 ms) was read off this very fit, so this is a consistency
    # check, not evidence: 20 ms + 138 GB / (8 x 3.35 TB/s x 0.7) = 27.4 ms vs 29.8 ms.
    assert LLAMA_H100.a_ms == pytest.approx(27.36, rel=0.01)
    assert LLAMA_H100.a_ms == pytest.approx(29.8, rel=0.10)


def test_llama_quadratic_term_is_thirteen_times_below_the_fit_documented_gap():
    # Causal attention FLOPs, 2 x 80 x 8192 per token pair at the same MFU, give 4.1e-7 ms/token^2;
    # the fit says 5.4e-6. The fitted engine's attention ran ~13x below its GEMM efficiency (or
    # the term absorbs other length-dependent costs); the model keeps the FLOP-derived term.
    ratio = LLAMA_H100.c_ms_per_token2 / 5.4e-6
    assert 0.06 < ratio < 0.09


@pytest.mark.parametrize(
    ("prompt_tokens", "low", "high"),
    [
        # Within 10% while the linear term dominates...
        (512, -0.10, 0.0),
        # ...and below the fit by a gap that grows with L, all from the quadratic term above.
        (1024, -0.12, -0.09),
        (2048, -0.19, -0.15),
        (4096, -0.29, -0.25),
        (8192, -0.44, -0.40),
    ],
)
def test_llama_prefill_time_against_the_fit(prompt_tokens, low, high):
    relative_gap = LLAMA_H100.batch_ms([prompt_tokens]) / published_llama_fit_ms(prompt_tokens) - 1
    assert low <= relative_gap <= high


# --- anchors: the articles' prefill figures (Kimi K2.6 FP8; S5000 prefill, H200 decode) ---------

# Kimi K2's ~1.03 TB of FP8 weights need two 8-card S5000 machines per prefill replica.
ARTICLE_PREFILL_CARDS = 16


@pytest.mark.parametrize("context_tokens", [16 * K, 32 * K, 64 * K, 128 * K])
def test_s5000_prefill_per_card_is_46_to_54_percent_of_h200(context_tokens):
    s5000, h200 = (
        prefill_tokens_per_second_per_card(
            hardware, KIMI_K2_FP8, ARTICLE_PREFILL_CARDS, context_tokens, concurrency=16
        )
        for hardware in (MTT_S5000, H200_SXM)
    )
    # Prefill is compute-bound and the MFU assumption is the same for both cards, so the ratio
    # is the peak-FLOPs ratio 1000/1979 = 0.505, shifted only by the weight-read intercept.
    assert 0.46 <= s5000 / h200 <= 0.54
    assert s5000 / h200 == pytest.approx(1000 / 1979, abs=0.01)


def test_s5000_128k_16_concurrent_is_below_the_articles_2047_tokens_per_second_documented_gap():
    assert max_concurrent_sequences(MTT_S5000, KIMI_K2_FP8, ARTICLE_PREFILL_CARDS, 128 * K) >= 16
    model = prefill_tokens_per_second_per_card(
        MTT_S5000, KIMI_K2_FP8, ARTICLE_PREFILL_CARDS, 128 * K, concurrency=16
    )
    # The model gives ~1,740 tokens/s per card, 85% of the article's 2,047. At 128K about 70%
    # of the FLOPs are attention; matching the article needs an effective MFU of ~0.47 instead
    # of the assumed 0.4 (or the article counted cached tokens). Not tuned; the band pins the
    # gap so that a change to the model that moves it shows up here.
    assert 0.80 <= model / 2047 <= 0.90


def test_glm_long_context_machine_throughput_near_the_whitepaper_at_the_ttft_slo():
    # Whitepaper: GLM-5.2-FP8 on one 8-card S5000 machine, 64K prompts, 90% prefix-cache hits,
    # P50 TTFT <= 6,000 ms: 5.8M tokens per minute = 96,667 tokens/s per machine.
    cards, context, hits = 8, 64 * K, 0.9
    coefficients = PrefillCoefficients.from_profiles(MTT_S5000, GLM_45_FP8, cards)
    cached = int(hits * context)
    # Four prompts per batch keep a batch (hence TTFT without queueing) under the 6 s SLO.
    assert coefficients.batch_ms([context] * 4, [cached] * 4) < 6000
    per_machine = cards * prefill_tokens_per_second_per_card(
        MTT_S5000, GLM_45_FP8, cards, context, concurrency=4, cache_hit_rate=hits
    )
    # GLM-4.5 stands in for GLM-5.2 (architecture not public in our sources); ~94%.
    assert 0.88 <= per_machine / 96_667 <= 1.0


# --- anchor: decode TPOT 0.011-0.020 s on the 4.8 TB/s GPU --------------------------------------


@pytest.mark.parametrize("batch", [10, 12, 16, 20])
def test_glm_decode_itl_on_8_h200_at_64k_is_in_the_articles_band(batch):
    assert 11 <= decode_itl_ms(H200_SXM, GLM_45_FP8, 8, batch, 64 * K) <= 20


def test_glm_decode_leaves_the_band_beyond_20_sequences_of_64k():
    # Each 64K sequence adds 12.3 GB of FP8 KV to every step (0.46 ms at 8 x 4.8 TB/s x 0.7), so
    # the published band caps a GLM-class 8xH200 replica near 20 such sequences, although its
    # KV memory holds 53. Serving more needs speculative decoding (MTP) or more replicas.
    assert decode_itl_ms(H200_SXM, GLM_45_FP8, 8, 21, 64 * K) > 20
    assert max_concurrent_sequences(H200_SXM, GLM_45_FP8, 8, 64 * K) == 53
    assert decode_itl_ms(H200_SXM, GLM_45_FP8, 8, 53, 64 * K) > 35


@pytest.mark.parametrize("batch", [32, 48, 64])
def test_kimi_decode_itl_on_two_h200_machines_at_64k_is_in_the_articles_band(batch):
    # The articles' decode pool: Kimi K2.6 FP8 on 2 x 8 H200. MLA's 35 KB per token leaves the
    # step dominated by the experts a batch touches.
    assert 11 <= decode_itl_ms(H200_SXM, KIMI_K2_FP8, 16, batch, 64 * K) <= 20


# --- capacity and load --------------------------------------------------------------------------


def test_weights_that_do_not_fit_leave_no_kv_capacity():
    # 671 GB of DeepSeek-V3 weights on 8 x 80 GB cards.
    assert kv_capacity_tokens(MTT_S5000, DEEPSEEK_V3_FP8, 8) == 0
    assert max_concurrent_sequences(MTT_S5000, DEEPSEEK_V3_FP8, 8, 4 * K) == 0
    assert kv_capacity_tokens(MTT_S5000, DEEPSEEK_V3_FP8, 16) > 0


def test_model_load_time_of_an_8_card_glm_replica():
    # 60 s engine start + 355 GB / 8 cards / 2 GB/s per card.
    assert model_load_seconds(H200_SXM, GLM_45_FP8, 8) == pytest.approx(60 + 355e9 / 8 / 2e9)


# --- properties ---------------------------------------------------------------------------------

hardware_profiles = st.sampled_from(sorted(HARDWARE_PROFILES.values(), key=lambda h: h.name))
model_profiles = st.sampled_from(sorted(MODEL_PROFILES.values(), key=lambda m: m.name))
card_counts = st.integers(min_value=1, max_value=64)
prompt_lengths = st.lists(st.integers(min_value=1, max_value=1_000_000), min_size=1, max_size=32)


@given(hardware_profiles, model_profiles, card_counts, card_counts, prompt_lengths)
def test_more_cards_never_slow_prefill(hardware, model, cards, more_cards, prompts):
    assume(cards < more_cards)
    fewer = PrefillCoefficients.from_profiles(hardware, model, cards).batch_ms(prompts)
    more = PrefillCoefficients.from_profiles(hardware, model, more_cards).batch_ms(prompts)
    assert more < fewer


@given(
    hardware_profiles,
    model_profiles,
    card_counts,
    st.integers(min_value=1, max_value=1_000_000),
    st.floats(min_value=0, max_value=1),
    st.floats(min_value=0, max_value=1),
)
def test_more_cached_tokens_never_slow_prefill(hardware, model, cards, prompt, hit, more_hit):
    assume(hit < more_hit)
    coefficients = PrefillCoefficients.from_profiles(hardware, model, cards)
    cached, more_cached = int(hit * prompt), int(more_hit * prompt)
    assume(cached < more_cached)
    assert coefficients.batch_ms([prompt], [more_cached]) < coefficients.batch_ms(
        [prompt], [cached]
    )


@given(
    hardware_profiles,
    model_profiles,
    card_counts,
    st.integers(min_value=1, max_value=512),
    st.integers(min_value=1, max_value=1_000_000),
)
def test_decode_step_grows_with_batch_and_context_and_shrinks_with_cards(
    hardware, model, cards, batch, context
):
    itl = decode_itl_ms(hardware, model, cards, batch, context)
    assert decode_itl_ms(hardware, model, cards, batch + 1, context) > itl
    assert decode_itl_ms(hardware, model, cards, batch, context + 1) > itl
    assert decode_itl_ms(hardware, model, cards + 1, batch, context) < itl


@given(model_profiles, st.integers(min_value=1, max_value=4096))
def test_decode_weight_reads_grow_with_batch_within_shared_and_all(model, batch):
    read = decode_weight_bytes(model, batch)
    assert model.shared_params * model.weight_dtype_bytes <= read <= model.weight_bytes
    assert decode_weight_bytes(model, batch + 1) >= read
    assert decode_weight_bytes(model, None) == model.weight_bytes


@given(
    hardware_profiles,
    model_profiles,
    st.integers(min_value=1, max_value=32),
    st.integers(min_value=1, max_value=2_000_000),
)
def test_max_concurrent_sequences_is_the_largest_count_that_fits(hardware, model, cards, context):
    count = max_concurrent_sequences(hardware, model, cards, context)
    budget = cards * hardware.memory_bytes * 0.9 - model.weight_bytes
    per_sequence = context * kv_bytes_per_token(model)
    assert count * per_sequence <= max(budget, 0)
    assert (count + 1) * per_sequence > budget
    assert max_concurrent_sequences(hardware, model, cards, context + 1) <= count


@given(model_profiles, st.integers(min_value=1, max_value=10**7), st.floats(1e9, 1e12))
def test_kv_transfer_is_linear_in_tokens_and_inverse_in_bandwidth(model, tokens, link):
    once = kv_transfer_seconds(tokens, model, link)
    assert kv_transfer_seconds(2 * tokens, model, link) == pytest.approx(2 * once)
    assert kv_transfer_seconds(tokens, model, 2 * link) == pytest.approx(once / 2)


@given(hardware_profiles, model_profiles, st.integers(min_value=1, max_value=32))
def test_model_load_shrinks_with_cards_towards_engine_start(hardware, model, cards):
    load = model_load_seconds(hardware, model, cards)
    assert hardware.engine_start_seconds < model_load_seconds(hardware, model, 2 * cards) < load


def test_profiles_are_immutable_values():
    # Simulators key caches by profile; a mutable profile would silently change cached results.
    assert dataclasses.replace(H200_SXM) == H200_SXM
    assert hash(dataclasses.replace(GLM_45_FP8)) == hash(GLM_45_FP8)
    with pytest.raises(dataclasses.FrozenInstanceError):
        H200_SXM.mfu = 0.9  # type: ignore[misc]


@given(model_profiles, st.integers(min_value=1, max_value=4096))
def test_decode_step_of_a_batch_reads_what_decode_weight_bytes_says(model, batch):
    hardware = HARDWARE_PROFILES["h200"]
    cards = 8
    coefficients = DecodeCoefficients.from_profiles(hardware, model, cards)
    no_context = coefficients.step_ms(batch, 0) - coefficients.c_ms_per_sequence * batch
    weights_ms = decode_weight_bytes(model, batch) / (
        cards * hardware.memory_bandwidth_bytes_per_second * hardware.mbu
    )
    assert no_context == pytest.approx(DEFAULT_DECODE_OVERHEAD_MS + weights_ms * 1000, rel=1e-9)
