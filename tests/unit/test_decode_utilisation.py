"""How much of its seed a decode replica may serve under an ITL percentile: the batch's bursts."""

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
from pd_tools.replay.offline import example_document


def spec(percentile: str) -> PDDeploymentSpec:
    """The example deployment (GLM-4.5-FP8, 8 H200 per decode replica, ITL 20 ms)."""
    return parse_pddeployment(example_document(percentile=percentile)).spec


P99, P50 = spec("P99"), spec("P50")


@given(st.floats(min_value=1, max_value=100))
def test_at_the_median_the_seed_itself_is_the_limit(dispersion):
    assert decode_utilisation(P50, 13_000, dispersion) == 1.0


@given(
    st.floats(min_value=500, max_value=60_000),
    st.floats(min_value=1, max_value=50),
    st.floats(min_value=1.1, max_value=4),
)
def test_burstier_batches_leave_less_room(context, dispersion, more):
    calm = decode_utilisation(P99, context, dispersion)
    # 1 where the engine's batch limit, not the ITL target, bounds the seed (short contexts).
    assert 0 < decode_utilisation(P99, context, dispersion * more) <= calm <= 1


def test_the_batch_at_the_percentile_steps_within_the_target():
    """13,000-token contexts (the Mooncake trace's mean), variance five times the mean."""
    context, dispersion = 13_000, 5.0
    share = decode_utilisation(P99, context, dispersion)
    pool = P99.pools("decode")[0]
    seed = seed_capacity(P99, "decode", pool, context)
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
    assert decode_utilisation(unprofiled, 13_000, 10.0) == 1.0
