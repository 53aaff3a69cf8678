"""The prefill-to-decode ratio guardrail: repaired by growing the smaller side."""

from pd_operator.core.policy import decide
from policycases import T0, calibrated, gpu_nodes, limit, observe, on_nodes, replicas, spec_of

RATIO = {"scaling": {"prefillToDecodeRatio": {"minPercent": 100, "maxPercent": 200}}}


def test_the_ratio_is_repaired_by_growing_the_smaller_side():
    spec = spec_of(RATIO)
    observation = observe(
        spec,
        T0,
        {("prefill", "p"): 2, ("decode", "d"): 1},
        prefill={"ratio": 2.0, "tokens": 3000.0},
        decode={"ratio": 0.7, "tokens": 300.0},
    )
    decision = decide(spec, observation, calibrated(spec, {"prefill": 1000.0, "decode": 500.0}), T0)
    assert decision is not None
    prefill, decode = decision.role_replicas("prefill"), decision.role_replicas("decode")
    assert prefill == 4
    assert decode == 2
    assert limit(decision, "decode", "d") == "ratio"


def test_when_the_smaller_side_cannot_grow_the_larger_side_grows_less():
    spec = spec_of(
        {
            **RATIO,
            "prefill.pools.0.accelerator": on_nodes("a"),
            "decode.pools.0.accelerator": on_nodes("d"),
        }
    )
    observation = observe(
        spec,
        T0,
        {("prefill", "p"): 2, ("decode", "d"): 1},
        gpu_nodes(a=4),
        prefill={"ratio": 2.0, "tokens": 3000.0},
        decode={"ratio": 0.7, "tokens": 300.0},
    )
    decision = decide(spec, observation, calibrated(spec, {"prefill": 1000.0, "decode": 500.0}), T0)
    assert decision is not None
    assert (decision.role_replicas("prefill"), decision.role_replicas("decode")) == (2, 1)
    assert limit(decision) == "ratio"


def test_a_low_ratio_grows_prefill():
    spec = spec_of(RATIO)
    observation = observe(
        spec,
        T0,
        {("prefill", "p"): 1, ("decode", "d"): 3},
        prefill={"ratio": 0.7, "tokens": 500.0},
        decode={"ratio": 0.95, "tokens": 1000.0},
    )
    decision = decide(spec, observation, calibrated(spec, {"prefill": 1000.0, "decode": 500.0}), T0)
    assert replicas(decision) == 3
    assert limit(decision) == "ratio"
