"""How much of its seed a decode replica may serve under an ITL percentile: the batch's bursts,
as the policy measures them and leaves room for them."""

import math
from statistics import NormalDist

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pd_operator.api.document import parse_pddeployment
from pd_operator.api.spec import PDDeploymentSpec
from pd_operator.core.hardware import GLM_45_FP8, H200_SXM
from pd_operator.core.learning import decode_utilisation, seed_capacity
from pd_operator.core.perfmodel import DecodeCoefficients
from pd_operator.core.policy import decide
from pd_operator.core.policy_state import PolicyState
from pd_operator.core.resolved import resolve
from pd_tools.replay.example import example_document
from policycases import INTERVAL, PROFILED, T0, kv_share, observe, replicas, seed, spec_of


def spec(percentile: str) -> PDDeploymentSpec:
    """The example deployment (GLM-4.5-FP8, 8 H200 per decode replica, ITL 20 ms)."""
    return parse_pddeployment(example_document(percentile=percentile)).spec


P99, P50 = spec("P99"), spec("P50")


@given(st.floats(min_value=1, max_value=100))
def test_at_the_median_the_seed_itself_is_the_limit(dispersion):
    assert decode_utilisation(resolve(P50), 13_000, dispersion) == 1.0


@given(
    st.floats(min_value=500, max_value=60_000),
    st.floats(min_value=1, max_value=50),
    st.floats(min_value=1.1, max_value=4),
)
def test_burstier_batches_leave_less_room(context, dispersion, more):
    calm = decode_utilisation(resolve(P99), context, dispersion)
    # 1 where the engine's batch limit, not the ITL target, bounds the seed (short contexts).
    assert 0 < decode_utilisation(resolve(P99), context, dispersion * more) <= calm <= 1


def test_the_batch_at_the_percentile_steps_within_the_target():
    """13,000-token contexts (the Mooncake trace's mean), variance five times the mean."""
    context, dispersion = 13_000, 5.0
    share = decode_utilisation(resolve(P99), context, dispersion)
    pool = P99.pools("decode")[0]
    seed = seed_capacity(resolve(P99), "decode", pool, context)
    assert seed is not None
    coefficients = DecodeCoefficients.from_profiles(H200_SXM, GLM_45_FP8, 8)

    def tokens_per_second(batch: float) -> float:
        return batch / coefficients.step_ms(batch, batch * context) * 1000

    # The mean batch that serves `share` of the seed.
    low, high = 0.0, 1024.0
    for _ in range(60):
        middle = (low + high) / 2
        low, high = (middle, high) if tokens_per_second(middle) < share * seed else (low, middle)
    peak = low + NormalDist().inv_cdf(0.99) * math.sqrt(dispersion * low)
    assert coefficients.step_ms(peak, peak * context) == pytest.approx(20.0, rel=0.01)
    assert 0.6 < share < 0.75  # the figure docs/autoscaling.md quotes


def test_without_a_profile_nothing_is_assumed():
    document = example_document(percentile="P99")
    document["spec"]["decode"]["pools"][0]["accelerator"].pop("profile")
    unprofiled = parse_pddeployment(document).spec
    assert decode_utilisation(resolve(unprofiled), 13_000, 10.0) == 1.0


# ---------------------------------------------------------------- the batch's bursts in decisions


ITL_P99 = spec_of({"slo.itl.percentile": "P99"})


@pytest.mark.parametrize(
    ("running", "grows"),
    [
        # 72% of the seed with 1,000-token prompts: some 300 sequences in the batch, 12 ms
        # steps. A batch that barely moves keeps within the 80% margin...
        ([300.0] * 20, False),
        # ...one swinging between 150 and 450 (variance over mean 75) would breach the P99
        # ITL at its peaks: decode grows before the mean does.
        ([150.0, 450.0] * 10, True),
    ],
)
def test_decode_leaves_room_for_the_bursts_its_batch_has_shown(running, grows):
    slo = PROFILED.slo.model_copy(update={"itl": ITL_P99.slo.itl})
    spec = PROFILED.model_copy(update={"slo": slo})
    per_replica, state, now = seed("decode", 1000), PolicyState(), T0
    counts = {("prefill", "p"): 2, ("decode", "d"): 1}
    sizes = []
    for sample in running:
        observation = observe(
            spec, now, counts, prefill={"ratio": 0.3, "tokens": 1000.0},
            decode={"ratio": 0.6, "tokens": 0.72 * per_replica, "running": sample,
                    "kv": kv_share(sample, 1000)},
        )  # fmt: skip
        decision = decide(spec, observation, state, now)
        assert decision is not None
        sizes.append(replicas(decision, "decode", "d"))
        state, now = decision.state, now + INTERVAL
    assert (max(sizes) > 1) is grows
    assert sizes[0] == 1  # one sample shows no bursts yet


def test_a_ramp_or_a_resize_is_no_swing_of_the_batch():
    # The batch grows steadily (a ramp the feed-forward follows) and is halved by a scale-up:
    # neither is a swing decode must leave room for. A batch that jumps between 150 and 450
    # per replica is.
    def dispersion(samples: list[tuple[float, int]]) -> float:
        state, now = PolicyState(), T0
        for running, ready in samples:
            observation = observe(
                PROFILED, now, {("prefill", "p"): 2, ("decode", "d"): ready},
                decode={"ratio": 0.6, "tokens": 1000.0, "running": running,
                        "kv": kv_share(running / ready, 1000)},
            )  # fmt: skip
            decision = decide(PROFILED, observation, state, now)
            assert decision is not None
            state, now = decision.state, now + INTERVAL
        return state.role("decode").batch_dispersion()

    ramp = [(100.0 + 10 * k, 1) for k in range(20)]
    resized = [(300.0, 1)] * 10 + [(300.0, 2)] * 10
    swinging = [(150.0, 1), (450.0, 1)] * 10
    assert dispersion(ramp) < 1.5
    assert dispersion(resized) == 1.0
    assert dispersion(swinging) > 20
