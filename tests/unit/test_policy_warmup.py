"""Replicas loading or just Ready: capacity that is coming, signals from before it served,
load times, and a breach that more replicas did not lower (futility)."""

from dataclasses import replace
from typing import Any

import pytest

from pd_operator.api.spec import PDDeploymentSpec
from pd_operator.core.allocation import record_ready
from pd_operator.core.learning import seed_load_seconds
from pd_operator.core.policy import PoolObservation, decide
from pd_operator.core.policy_state import PolicyState
from pd_operator.core.resolved import resolve
from policycases import INTERVAL, PROFILED, SPEC, T0, calibrated, limit, observe, replicas, spec_of


# ---------------------------------------------------------------- replicas that just became Ready
def just_ready(spec: PDDeploymentSpec, before: int, now_ready: int, ago: float) -> PolicyState:
    """A calibrated state whose prefill pool had `before` Ready replicas until `ago` s ago."""
    state = calibrated(spec, {"prefill": 1000.0, "decode": 500.0}, since=T0 - 3600)
    runs = ((T0 - 3600, before), (T0 - ago, now_ready))
    pools = dict(state.pools)
    pools["prefill/p"] = replace(pools["prefill/p"], ready_runs=runs)
    return PolicyState(pools, state.roles)


def test_signals_from_before_new_replicas_served_teach_nothing_and_add_nothing():
    # Two replicas breached (1.6x) serving 2000 tokens/s with prompts waiting; two more became
    # Ready 20 s ago. Read against four, the breach would cut the estimate to 500/replica.
    state = just_ready(SPEC, 2, 4, ago=20)
    observation = observe(
        SPEC,
        T0,
        {("prefill", "p"): 4, ("decode", "d"): 1},
        prefill={"ratio": 1.6, "tokens": 2000.0, "queue": 10.0},
    )
    decision = decide(SPEC, observation, state, T0)
    assert decision is not None
    assert replicas(decision) == 4
    assert decision.state.pool("prefill", "p").capacity_per_replica == pytest.approx(1000.0)
    # A window later the same signals describe the four: the breach is theirs.
    settled = just_ready(SPEC, 2, 4, ago=SPEC.slo.window_seconds + 1)
    later = decide(SPEC, observation, settled, T0)
    assert later is not None
    assert replicas(later) > 4
    assert later.state.pool("prefill", "p").capacity_per_replica < 1000.0


def test_replicas_just_ready_and_well_under_the_target_raise_a_low_estimate_only():
    # Four replicas Ready for 20 s (two before) serve 6000 tokens/s at half the target: each
    # served at least 1500 of the window, more than the 1000 estimated, so the estimate rises.
    def learned(before: int, ratio: float) -> float | None:
        observation = observe(
            SPEC,
            T0,
            {("prefill", "p"): 4, ("decode", "d"): 1},
            prefill={"ratio": ratio, "tokens": 6000.0},
        )
        decision = decide(SPEC, observation, just_ready(SPEC, before, 4, ago=20), T0)
        assert decision is not None
        return decision.state.pool("prefill", "p").capacity_per_replica

    assert learned(2, 0.5) == pytest.approx(1500.0)
    # Near the target the reading would set the estimate, not bound it: no measure yet.
    assert learned(2, 1.0) == pytest.approx(1000.0)
    # Six served most of the window: 1500 per replica Ready now overstates what each did.
    assert learned(6, 0.5) == pytest.approx(1000.0)


def test_the_queue_new_replicas_drain_is_no_demand_for_more():
    # 120 prompts of 1000 tokens wait: +2000 tokens/s over the window (5 replicas, see
    # test_a_prefill_queue_adds_to_the_demand) unless replicas just became Ready to drain them.
    observation = observe(
        SPEC,
        T0,
        {("prefill", "p"): 4, ("decode", "d"): 1},
        prefill={"ratio": 0.8, "tokens": 1500.0, "queue": 120.0},
    )
    fresh = decide(SPEC, observation, just_ready(SPEC, 2, 4, ago=20), T0)
    steady = decide(SPEC, observation, just_ready(SPEC, 4, 4, ago=3600), T0)
    assert replicas(fresh) == 4
    assert replicas(steady) == 5


def test_the_ready_history_keeps_one_window():
    runs: tuple[tuple[float, int], ...] = ()
    for t, ready in [(0, 1), (30, 1), (60, 2), (90, 2), (200, 3), (400, 3)]:
        runs = record_ready(runs, float(t), ready, 60.0)
    assert runs == ((200.0, 3),)  # in force since before the window; nothing changed within


# ---------------------------------------------------------------- warm-up
def test_loading_replicas_count_as_coming_capacity_until_their_ready_time():
    spec = spec_of({"scaling": {"scaleUp": {"stabilizationSeconds": 0, "maxStepReplicas": 1}}})
    state = calibrated(spec, {"prefill": 1000.0, "decode": 500.0})
    breach = {"ratio": 1.6, "tokens": 2000.0}
    first = decide(
        spec,
        observe(spec, T0, {("prefill", "p"): 2, ("decode", "d"): 1}, prefill=breach),
        state,
        T0,
    )
    assert replicas(first) == 3
    assert first is not None
    loading = {("prefill", "p"): PoolObservation(3, ready=2), ("decode", "d"): 1}
    held = decide(spec, observe(spec, T0 + 30, loading, prefill=breach), first.state, T0 + 30)
    assert replicas(held) == 3
    assert limit(held) == "warmup"
    worse = {"ratio": 2.5, "tokens": 3000.0}
    grown = decide(spec, observe(spec, T0 + 30, loading, prefill=worse), first.state, T0 + 30)
    assert replicas(grown) == 4
    ready_by = first.state.pool("prefill", "p").ready_by
    assert ready_by is not None
    late = decide(
        spec, observe(spec, ready_by + 1, loading, prefill=breach), first.state, ready_by + 1
    )
    assert replicas(late) == 4


def test_a_breach_waits_for_the_replicas_arriving_when_the_demand_sizes_the_role():
    # The demand grows and feed-forward adds a replica while the TTFT is still met. While it
    # loads, a burst of long prompts reads as a 3x breach at the same demand. The replica
    # coming was sized for that demand: doubling the Ready ones on top of it (the feedback
    # term) over-provisioned the Mooncake synthetic trace for five minutes.
    spec = spec_of({"scaling": {"scaleUp": {"stabilizationSeconds": 0, "maxStepReplicas": 4}}})
    state = calibrated(spec, {"prefill": 1000.0, "decode": 500.0})
    grown = decide(
        spec,
        observe(
            spec,
            T0,
            {("prefill", "p"): 2, ("decode", "d"): 1},
            prefill={"ratio": 0.8, "tokens": 2000.0},
        ),
        state,
        T0,
    )
    assert grown is not None and replicas(grown) == 3
    burst = {"ratio": 3.0, "tokens": 2000.0}
    loading = {("prefill", "p"): PoolObservation(3, ready=2), ("decode", "d"): 1}
    held = decide(spec, observe(spec, T0 + 30, loading, prefill=burst), grown.state, T0 + 30)
    assert replicas(held) == 3
    assert limit(held) == "warmup"
    assert held is not None
    assert "waits for the replicas loading or just Ready" in held.pools[0].reason  # prefill
    # More demand than the replica coming was sized for still grows the role at once.
    more = {"ratio": 3.0, "tokens": 4000.0}
    assert (
        replicas(decide(spec, observe(spec, T0 + 30, loading, prefill=more), grown.state, T0 + 30))
        > 3
    )
    # Once Ready, the replica has a window to show its effect; then a breach that stays is one
    # of capacity again, and feedback acts.
    now, state, sizes = T0 + 90, held.state, []
    while now <= T0 + 90 + spec.slo.window_seconds + INTERVAL:
        decision = decide(
            spec,
            observe(spec, now, {("prefill", "p"): 3, ("decode", "d"): 1}, prefill=burst),
            state,
            now,
        )
        assert decision is not None
        sizes.append(replicas(decision))
        state, now = decision.state, now + INTERVAL
    assert sizes[0] == 3
    assert sizes[-1] > 3
    # Without an estimate, feedback is the only term that grows a role: it does not wait.
    unknown = decide(spec, observe(spec, T0 + 30, loading, prefill=burst), PolicyState(), T0 + 30)
    assert replicas(unknown) > 3


def test_the_load_time_comes_from_the_profile_and_is_then_learned():
    state = calibrated(PROFILED, {"prefill": 5000.0, "decode": 500.0})
    up = decide(
        PROFILED,
        observe(
            PROFILED,
            T0,
            {("prefill", "p"): 1, ("decode", "d"): 1},
            prefill={"ratio": 2.0, "tokens": 10000.0},
        ),
        state,
        T0,
    )
    assert up is not None
    expected = seed_load_seconds(resolve(PROFILED), "prefill", PROFILED.prefill.pools[0])
    assert up.state.pool("prefill", "p").ready_by == pytest.approx(T0 + expected)
    grown = up.replicas[("prefill", "p")]
    ready = decide(
        PROFILED,
        observe(
            PROFILED,
            T0 + 240,
            {("prefill", "p"): grown, ("decode", "d"): 1},
            prefill={"ratio": 0.8, "tokens": 10000.0},
        ),
        up.state,
        T0 + 240,
    )
    assert ready is not None
    assert ready.state.pool("prefill", "p").load_seconds == pytest.approx(240)


# ---------------------------------------------------------------- futility
def breach_loop(
    state: PolicyState, sizes: int, phases: list[tuple[int, dict[str, Any]]], start: float = T0
) -> tuple[list[int], PolicyState, str]:
    """Prefill signals per phase (steps, kwargs of `signals`) from `start`, pods Ready at once;
    the sizes, the last state and the last reason."""
    now, current, seen, reason = start, {("prefill", "p"): sizes, ("decode", "d"): 1}, [], ""
    for steps, prefill in phases:
        for _ in range(steps):
            decision = decide(SPEC, observe(SPEC, now, dict(current), prefill=prefill), state, now)
            assert decision is not None
            current.update(decision.replicas)
            seen.append(replicas(decision))
            state, now, reason = decision.state, now + INTERVAL, decision.reason
    return seen, state, reason


def test_a_breach_that_more_replicas_did_not_lower_adds_no_more():
    # Two replicas breach (1.5x) serving 2000 tokens/s, no prompt waiting: feedback takes the
    # policy to 3. Once the three have served a whole window the TTFT still reads 1.5x for the
    # same demand: a latency floor (long prompts, a tail percentile), not a lack of replicas.
    # Acted on again, it would add half as many again each window, up to max.
    start = calibrated(SPEC, {"prefill": 1000.0, "decode": 500.0}, since=T0 - 3600)
    breach = {"ratio": 1.5, "tokens": 2000.0}
    sizes, state, reason = breach_loop(start, 2, [(12, breach)])
    assert sizes == [3] * 12
    assert "the last scale-up did not lower this breach" in reason
    assert state.role("prefill").futile_ratio == pytest.approx(1.5)
    # Nothing waits: the breach says nothing about what a replica serves.
    assert state.pool("prefill", "p").capacity_per_replica == pytest.approx(1000.0)
    # It stays futile while the breach is not clearly worse...
    later = T0 + 12 * INTERVAL
    sizes, _, _ = breach_loop(state, 3, [(4, {"ratio": 1.7, "tokens": 2000.0})], later)
    assert sizes == [3] * 4
    # ...and a breach 20% worse is acted on again.
    sizes, _, _ = breach_loop(state, 3, [(1, {"ratio": 1.9, "tokens": 2000.0})], later)
    assert sizes[-1] > 3


def test_a_breach_that_stays_under_more_load_per_replica_is_still_one_of_capacity():
    start = calibrated(SPEC, {"prefill": 1000.0, "decode": 500.0}, since=T0 - 3600)
    # The demand tripled while the four were loading: each replica now carries more than each
    # of the two did when they breached.
    sizes, state, _ = breach_loop(
        start, 2, [(1, {"ratio": 1.5, "tokens": 2000.0}), (4, {"ratio": 1.5, "tokens": 6000.0})]
    )
    assert sizes[-1] > 4
    assert state.role("prefill").futile_ratio is None
