"""Scale-down: the short window for a steady load and the long one otherwise, one step at a
time, never into a breach, no flapping at a boundary, and the probe that sheds an unknown
capacity one replica at a time."""

import itertools
import math
from collections.abc import Callable
from typing import Any

import pytest

from pd_operator.api.spec import PDDeploymentSpec
from pd_operator.core.policy import Decision, _steady, decide
from pd_operator.core.policy_state import PolicyState
from policycases import (
    INTERVAL,
    LONG_WINDOW_ONLY,
    SPEC,
    T0,
    calibrated,
    limit,
    observe,
    plant_latency_ratio,
    replicas,
    run,
    spec_of,
)


def test_scale_down_waits_for_the_window_and_moves_one_step_at_a_time():
    # 5 replicas of 1000 tokens/s each serve 1000 tokens/s: 2 would hold it at <= 70%.
    decisions = run(
        SPEC,
        calibrated(SPEC, {"prefill": 1000.0, "decode": 500.0}),
        {("prefill", "p"): 5, ("decode", "d"): 1},
        20,
        prefill={"ratio": 0.3, "tokens": 1000.0},
    )
    sizes = [d.role_replicas("prefill") for d in decisions]
    window = SPEC.scaling.scale_down.stabilization_seconds // INTERVAL
    assert sizes[: int(window)] == [5] * int(window)
    assert sizes[int(window) : int(window) + 4] == [4, 3, 2, 2]
    assert sizes[-1] == 2
    assert limit(decisions[0]) == "rate"


def drive(
    spec: PDDeploymentSpec,
    steps: int,
    prefill_at: Callable[[int, int], dict[str, Any]],
    *,
    start: int,
    interval: float = INTERVAL,
) -> list[Decision]:
    """Decide every `interval` from calibrated estimates (1,000 tokens/s per prefill replica),
    applying each decision (pods Ready at once); prefill's signals are `prefill_at(step,
    replicas now)` (kwargs of `signals`), decode one healthy replica."""
    state = calibrated(spec, {"prefill": 1000.0, "decode": 500.0})
    current, now, decisions = start, T0, []
    for step in range(steps):
        observation = observe(
            spec,
            now,
            {("prefill", "p"): current, ("decode", "d"): 1},
            prefill=prefill_at(step, current),
        )
        decision = decide(spec, observation, state, now)
        assert decision is not None
        decisions.append(decision)
        current, state, now = replicas(decision), decision.state, now + interval
    return decisions


def falling_load(
    spec: PDDeploymentSpec, steps: int, *, wobble: float = 0.0, ratio: float = 0.3
) -> list[Decision]:
    """Prefill demand falling 3% a decision from 4,000 tokens/s (1,000 per replica), with
    `wobble` (every other decision that much above, then below) and latency at `ratio`."""

    def prefill_at(step: int, _current: int) -> dict[str, Any]:
        demand = 4000.0 * 0.97**step * (1 + (wobble if step % 2 else -wobble))
        return {"ratio": ratio, "tokens": demand}

    return drive(spec, steps, prefill_at, start=6)


def test_a_steady_load_far_under_the_target_sheds_replicas_after_the_short_window():
    sizes = {
        name: [d.role_replicas("prefill") for d in falling_load(spec, 40)]
        for name, spec in (("steady", SPEC), ("long", LONG_WINDOW_ONLY))
    }
    # The short window trails the falling demand by 60 s, the long one by 300 s; neither runs
    # a replica over its capacity.
    assert all(a <= b for a, b in zip(sizes["steady"], sizes["long"], strict=True))
    assert sum(sizes["steady"]) < sum(sizes["long"]) - 10
    needed = [math.ceil(4000 * 0.97**step / 1000) for step in range(40)]
    assert all(size >= need for size, need in zip(sizes["steady"], needed, strict=True))
    assert sizes["steady"][-1] == 2 and sizes["long"][-1] == 3
    shed = next(d for d in falling_load(SPEC, 40) if d.role_replicas("prefill") < 6)
    [prefill] = [p for p in shed.pools if p.role == "prefill"]
    assert "load steady and latency under 0.5x the target for 300s" in prefill.reason
    assert "the 60s scale-down window" in prefill.reason
    assert "prefill: p 6->5, load steady: 60s scale-down window (TTFT 0.30x" in shed.reason


def test_steady_means_a_whole_window_watched_without_gaps_far_under_the_target():
    window = SPEC.scaling.scale_down.stabilization_seconds
    now = T0 + window
    steady = [(T0 + t, 1000.0 + (t % 60) / 10, 0.3) for t in range(0, int(window) + 1, 30)]
    assert _steady(SPEC, tuple(steady), now)
    assert not _steady(SPEC, tuple(steady[1:]), now)  # not watched for a whole window
    # A restart resumes from the memory of the last status write: a gap hides the load.
    assert not _steady(SPEC, tuple(s for s in steady if not T0 + 60 < s[0] < T0 + 200), now)
    assert not _steady(SPEC, tuple((t, d, 0.5 if t == now else r) for t, d, r in steady), now)
    assert not _steady(SPEC, tuple((t, None if t == T0 else d, r) for t, d, r in steady), now)
    swinging = [(t, d * (1.2 if i % 2 else 0.8), r) for i, (t, d, r) in enumerate(steady)]
    assert not _steady(SPEC, tuple(swinging), now)


def test_the_steady_samples_stay_few_however_often_the_policy_decides():
    # Decisions every 5 s over a 600 s window: about 30 samples kept, not 120, and still read.
    spec = spec_of(
        {
            "scaling.intervalSeconds": 5,
            "scaling.scaleDown": {
                "stabilizationSeconds": 600,
                "maxStepReplicas": 1,
                "steadyStabilizationSeconds": 60,
            },
        }
    )
    decisions = drive(
        spec,
        200,
        lambda step, _: {"ratio": 0.3, "tokens": 4000.0 * 0.995**step},
        start=6,
        interval=5,
    )
    assert all(len(d.state.role("prefill").recent) <= 32 for d in decisions)
    reasons = [d.reason for d in decisions]
    assert any("p 6->5 limited by rate, load steady: 60s scale-down window" in r for r in reasons)


@pytest.mark.parametrize(
    ("wobble", "ratio"),
    [(0.2, 0.3), (0.0, 0.6)],
    ids=["demand swings 20% between decisions", "latency at 0.6x the target"],
)
def test_a_swinging_load_or_one_near_the_target_waits_the_long_window(wobble, ratio):
    steady = [
        d.role_replicas("prefill") for d in falling_load(SPEC, 40, wobble=wobble, ratio=ratio)
    ]
    long = [
        d.role_replicas("prefill")
        for d in falling_load(LONG_WINDOW_ONLY, 40, wobble=wobble, ratio=ratio)
    ]
    assert steady == long


def test_no_scale_down_when_the_smaller_size_would_breach():
    # 2 x 1000 tokens/s serve 1500: one replica would run at 150%.
    decisions = run(
        SPEC,
        calibrated(SPEC, {"prefill": 1000.0, "decode": 500.0}),
        {("prefill", "p"): 2, ("decode", "d"): 1},
        40,
        prefill={"ratio": 0.4, "tokens": 1500.0},
    )
    assert {d.role_replicas("prefill") for d in decisions} == {2}


def test_a_load_at_the_boundary_does_not_flap_between_two_and_one():
    # Plant: latency follows load; demand wobbles +-5% around 80% of one replica's capacity.
    def prefill_at(step: int, current: int) -> dict[str, Any]:
        demand = 800.0 * (1.05 if step % 2 else 0.95)
        return {"ratio": plant_latency_ratio(demand / (current * 1000.0)), "tokens": demand}

    sizes = [replicas(d) for d in drive(SPEC, 60, prefill_at, start=1)]
    changes = sum(1 for a, b in itertools.pairwise(sizes) if a != b)
    assert changes <= 1
    assert sizes[-1] == 2


def test_an_unseen_window_is_not_a_quiet_one():
    # A lost state (restart) must not scale down on the first look.
    decision = decide(
        SPEC,
        observe(
            SPEC,
            T0,
            {("prefill", "p"): 5, ("decode", "d"): 1},
            prefill={"ratio": 0.3, "tokens": 100.0},
        ),
        calibrated(SPEC, {"prefill": 1000.0, "decode": 500.0}),
        T0,
    )
    assert replicas(decision) == 5


def test_a_probe_learns_an_unknown_capacity_one_replica_at_a_time():
    # No profile, never near the SLO: the estimate is a lower bound; shed one at a time.
    decisions = run(
        SPEC,
        PolicyState(),
        {("prefill", "p"): 6, ("decode", "d"): 1},
        60,
        prefill={"ratio": 0.3, "tokens": 1200.0},
    )
    sizes = [d.role_replicas("prefill") for d in decisions]
    assert all(b in (a, a - 1) for a, b in itertools.pairwise(sizes))
    assert sizes[-1] < 6
    # Each remaining replica carries at most 1.5x the load already seen within the SLO.
    assert sizes[-1] >= 2
