"""A spec resolved once (`core.resolved`): each pool's profiles, or None where one is unknown,
each role's SLO terms, and the same decision as the bare spec."""

from pd_operator.core.hardware import GLM_45_FP8, H200_SXM, MTT_S5000
from pd_operator.core.policy import decide
from pd_operator.core.policy_state import PolicyState
from pd_operator.core.resolved import resolve
from pd_operator.core.signals import LATENCY_BUCKETS
from policycases import PROFILED, SPEC, T0, observe, spec_of


def test_each_pool_gets_its_card_and_the_model():
    resolved = resolve(PROFILED)
    assert resolved.model is GLM_45_FP8
    assert resolved.profiles("prefill", "p") == (MTT_S5000, GLM_45_FP8)
    assert resolved.profiles("decode", "d") == (H200_SXM, GLM_45_FP8)


def test_an_unknown_profile_resolves_to_none_for_that_pool_only():
    typo = spec_of(
        {
            "model.name": "zai-org/GLM-4.5-FP8",
            "prefill.pools.0.accelerator": {
                "resourceName": "nvidia.com/gpu",
                "perReplica": 8,
                "profile": "h2000",
            },
            "decode.pools.0.accelerator": {
                "resourceName": "nvidia.com/gpu",
                "perReplica": 8,
                "profile": "h200",
            },
        }
    )
    resolved = resolve(typo)
    assert resolved.profiles("prefill", "p") is None
    assert resolved.profiles("decode", "d") == (H200_SXM, GLM_45_FP8)


def test_an_unknown_model_leaves_every_pool_to_learn_online():
    resolved = resolve(spec_of({"model.name": "acme/unheard-of-7b"}))
    assert resolved.model is None
    assert resolved.role("prefill").profiles == {"p": None}
    assert resolved.role("decode").profiles == {"d": None}


def test_each_role_carries_its_target_percentile_latency_name_and_buckets():
    spec = spec_of({"slo.itl.percentile": "P99"})
    prefill, decode = resolve(spec).role("prefill"), resolve(spec).role("decode")
    assert prefill.target == spec.slo.ttft and decode.target == spec.slo.itl
    assert (prefill.share, decode.share) == (0.5, 0.99)
    assert (prefill.latency_name, decode.latency_name) == ("TTFT", "ITL")
    assert decode.latency_buckets == LATENCY_BUCKETS[spec.model.engine]["decode"]


def test_a_resolved_spec_decides_as_the_bare_spec():
    for spec in (SPEC, PROFILED):
        observation = observe(
            spec,
            T0,
            {("prefill", "p"): 2, ("decode", "d"): 2},
            prefill={"ratio": 2.0, "tokens": 3000.0},
        )
        assert decide(resolve(spec), observation, PolicyState(), T0) == decide(
            spec, observation, PolicyState(), T0
        )
