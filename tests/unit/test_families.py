"""Workload families (sim.families): scenarios are reproducible from a seed, their draws have
the means, CVs and shapes asked for, and no request exceeds its model's context."""

import itertools
import json
import math
import random
import statistics

import pytest

from pd_tools.replay.families import (
    DEPLOYMENTS,
    FAMILIES,
    SHAPES,
    Arrivals,
    LengthMix,
    LogNormal,
    Scenario,
    chat_output,
    draw_scenarios,
    replicas_needed,
    single,
    window_mean,
)
from pd_tools.workloads.traces import Request, reused_prefix_tokens

CHAT = single(LogNormal(770, 1.0, 16, 16_384))
ANSWER = single(LogNormal(75, 0.9, 1, 2048))


def scenario(
    arrivals: Arrivals,
    *,
    inputs: LengthMix = CHAT,
    outputs: LengthMix = ANSWER,
    reuse: float = 0.0,
    duration_s: float = 600.0,
    warmup_s: float = 0.0,
    deployment: str = "glm/s5000-h200",
    seed: int = 7,
) -> Scenario:
    return Scenario(
        "t-01", "chat", deployment, arrivals, inputs, outputs, reuse, duration_s, warmup_s, seed
    )


def gaps_cv(requests: list[Request]) -> float:
    gaps = [b.arrival_s - a.arrival_s for a, b in itertools.pairwise(requests)]
    return statistics.pstdev(gaps) / statistics.fmean(gaps)


def test_the_same_seed_draws_the_same_scenarios_and_requests():
    first, again = draw_scenarios(3, 12, duration_s=120), draw_scenarios(3, 12, duration_s=120)
    assert first == again
    assert first[4].requests() == again[4].requests()
    other = draw_scenarios(4, 12, duration_s=120)
    assert [s.short() for s in other] != [s.short() for s in first]
    assert [s.id for s in first] == [f"3-{k:02d}" for k in range(1, 13)]


def test_a_scenario_survives_json_and_replays_the_same_requests():
    for drawn in draw_scenarios(5, 20, duration_s=60, warmup_s=30):
        text = json.dumps(drawn.to_json())
        back = Scenario.from_json(json.loads(text))
        assert back == drawn
    assert back.requests() == drawn.requests()


def test_every_family_meets_every_shape_in_one_round():
    drawn = draw_scenarios(2, len(FAMILIES) * len(SHAPES), duration_s=60)
    pairs = {(s.family, s.arrivals.shape) for s in drawn}
    assert pairs == set(itertools.product(FAMILIES, SHAPES))


@pytest.mark.parametrize("cv", [0.5, 1.0, 2.0, 4.0])
def test_steady_arrivals_have_the_gamma_cv_and_the_mean_rate(cv: float):
    requests = scenario(Arrivals("steady", 20.0, cv), duration_s=1000).requests()
    assert gaps_cv(requests) == pytest.approx(cv, rel=0.05)
    # The count's noise grows with the CV: sd of the count ~ cv * sqrt(N), N = 20,000.
    assert len(requests) / 1000 == pytest.approx(20.0, rel=3 * cv / math.sqrt(20_000))


def test_lognormal_lengths_have_the_truncated_mean_and_stay_in_bounds():
    rng = random.Random(1)
    for lengths in (
        LogNormal(770, 1.0, 16, 16_384),  # chat prompts
        LogNormal(60_000, 0.5, 32_768, 131_072),  # long contexts: truncated on both sides
        LogNormal(2500, 0.6, 1024, 8192),  # reasoning answers
    ):
        draws = [lengths.sample(rng) for _ in range(20_000)]
        assert min(draws) >= lengths.low and max(draws) <= lengths.high
        assert statistics.fmean(draws) == pytest.approx(lengths.expected(), rel=0.03)
    # Little is cut off a chat prompt's distribution: its mean stays near the one asked for.
    assert LogNormal(770, 1.0, 16, 16_384).expected() == pytest.approx(770, rel=0.03)


def test_a_scenario_has_the_families_mean_lengths():
    drawn = scenario(Arrivals("steady", 30.0, 1.0), duration_s=600)
    requests = drawn.requests()
    mean_in = statistics.fmean(r.input_tokens for r in requests)
    mean_out = statistics.fmean(r.output_tokens for r in requests)
    assert mean_in == pytest.approx(drawn.input.expected(), rel=0.05)
    assert mean_out == pytest.approx(drawn.output.expected(), rel=0.05)
    assert 700 < mean_in < 840 and 65 < mean_out < 85  # short chat: ~770 in, ~75 out


def test_no_request_exceeds_its_models_context():
    for drawn in draw_scenarios(11, 40, duration_s=60, warmup_s=0):
        context = DEPLOYMENTS[drawn.deployment].context_tokens
        assert drawn.input.high + drawn.output.high <= context
        assert all(r.input_tokens + r.output_tokens <= context for r in drawn.requests())
    # Long prompts on a model of 128K: the prompt gives way to the answer.
    long = single(LogNormal(120_000, 0.3, 32_768, 131_072))
    with pytest.raises(ValueError, match="exceed the context"):
        scenario(Arrivals("steady", 1.0, 1.0), inputs=long, outputs=ANSWER)
    capped = long.capped(131_072 - ANSWER.high)
    requests = scenario(Arrivals("steady", 1.0, 1.0), inputs=capped, duration_s=300).requests()
    assert max(r.input_tokens + r.output_tokens for r in requests) <= 131_072


def test_drawn_rates_lie_in_their_familys_range_and_the_window_has_that_mean():
    for drawn in draw_scenarios(12, 40, duration_s=900, warmup_s=300):
        low, high = FAMILIES[drawn.family].rate_rps
        assert low <= drawn.arrivals.rate_rps <= high
        assert 0.5 <= drawn.arrivals.rate_rps <= 100
        profile = drawn.rate_profile()
        assert profile.duration_s == pytest.approx(1200)
        assert window_mean(profile, 300, 1200) == pytest.approx(drawn.arrivals.rate_rps)
        assert min(min(s.start_rps, s.end_rps) for s in profile.segments) >= 0
        assert 0.5 <= drawn.arrivals.cv <= 4


@pytest.mark.parametrize(
    ("arrivals", "low", "high"),
    [
        # waves of +-50%: the rate runs from half to one and a half times its mean
        (Arrivals("waves", 10.0, 1.0, swing=0.5, period_s=300), 5.0, 15.0),
        # bursts 4 times the rate between them, 60 s of every 300 s: mean (4*60 + 240)/300 = 1.6
        (Arrivals("onoff", 16.0, 1.0, swing=4.0, period_s=300, on_s=60), 10.0, 40.0),
        # one day over the replay, peak 5 times the trough
        (Arrivals("diurnal", 10.0, 1.0, swing=5.0), 10 / 3, 50 / 3),
        # a drift from one rate to twice it
        (Arrivals("drift", 15.0, 1.0, swing=2.0), 10.0, 20.0),
    ],
)
def test_shapes_move_the_rate_as_asked(arrivals: Arrivals, low: float, high: float):
    profile = arrivals.profile(0, 1200)
    rates = [r for s in profile.segments for r in (s.start_rps, s.end_rps)]
    assert min(rates) == pytest.approx(low, rel=0.02)
    assert max(rates) == pytest.approx(high, rel=0.02)
    assert window_mean(profile, 0, 1200) == pytest.approx(arrivals.rate_rps)
    # The requests follow: the busiest minute is well above the quietest.
    requests = scenario(arrivals, duration_s=1200).requests()
    counts = [sum(60 * k <= r.arrival_s < 60 * (k + 1) for r in requests) for k in range(20)]
    assert max(counts) > 1.5 * min(counts)


@pytest.mark.parametrize("reuse", [0.0, 0.3, 0.9])
def test_prefix_reuse_covers_the_share_asked_for(reuse: float):
    drawn = scenario(Arrivals("steady", 20.0, 1.0), reuse=reuse, duration_s=600)
    requests = drawn.requests()
    cached = reused_prefix_tokens(requests)
    share = sum(cached) / sum(r.input_tokens for r in requests)
    # The first request of each shared prefix finds nothing cached: a little below the share.
    assert share == pytest.approx(reuse, abs=0.02)
    assert all(len(r.hash_ids) == math.ceil(r.input_tokens / 512) for r in requests)


def test_prefix_groups_are_shared_and_zipf_popular():
    requests = scenario(Arrivals("steady", 20.0, 1.0), reuse=0.5, duration_s=600).requests()
    firsts = [r.hash_ids[0] >> 24 for r in requests if r.hash_ids and r.hash_ids[0] < 1 << 40]
    counts = sorted((firsts.count(g) for g in set(firsts)), reverse=True)
    assert len(counts) == 16
    assert counts[0] > 4 * counts[-1]  # rank 1 over rank 16: Zipf gives 16x


def test_every_deployment_has_capacity_for_its_families():
    outputs = single(chat_output(random.Random(0)))
    for deployment in DEPLOYMENTS.values():
        prefill, decode = replicas_needed(deployment, 10.0, CHAT, outputs, 0.5)
        assert 0 < prefill < 10 and 0 < decode < 10
    for drawn in draw_scenarios(13, 40, duration_s=60):
        assert DEPLOYMENTS[drawn.deployment].context_tokens >= FAMILIES[drawn.family].min_context
        spec = drawn.spec()
        assert spec.model.name == DEPLOYMENTS[drawn.deployment].model_name
        assert [p.replicas.max for r in ("prefill", "decode") for p in spec.pools(r)] == list(
            drawn.max_replicas
        )
