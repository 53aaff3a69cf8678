"""The control law: how a role's latency, demand, queue and KV cache read into a need for
replicas (feedback, feed-forward, memory), and what it does when a reading is unknown."""

from dataclasses import replace

import pytest

from pd_operator.core.learning import seed_capacity
from pd_operator.core.policy import Observation, decide
from pd_operator.core.policy_state import PolicyState
from pd_operator.core.resolved import resolve
from pd_operator.core.signals import Reading, RoleSignals, unavailable
from policycases import (
    INTERVAL,
    PROFILED,
    ROLES,
    SPEC,
    T0,
    calibrated,
    limit,
    observe,
    replicas,
    run,
    signals,
    spec_of,
    target_seconds,
)


# ---------------------------------------------------------------- feedback and feed-forward
@pytest.mark.parametrize("breached", ROLES)
def test_a_breached_role_grows_and_the_other_holds(breached):
    other = "decode" if breached == "prefill" else "prefill"
    observation = observe(
        SPEC,
        T0,
        {("prefill", "p"): 2, ("decode", "d"): 2},
        **{breached: {"ratio": 1.5, "tokens": 2000.0}, other: {"ratio": 0.6, "tokens": 2000.0}},
    )
    decision = decide(SPEC, observation, PolicyState(), T0)
    pool = "p" if breached == "prefill" else "d"
    assert replicas(decision, breached, pool) > 2
    assert replicas(decision, other, "d" if pool == "p" else "p") == 2


@pytest.mark.parametrize(
    ("decode", "grows"),
    [
        # vLLM's ITL buckets around the 20 ms target are (10, 25] ms: a P99 there reads 24.9 ms
        # whatever the gaps are, so the reading alone is no breach...
        ({"ratio": 24.87 / 20, "tokens": 2000.0}, False),
        # ...nor is one request waiting for the next step (no KV shortage)...
        ({"ratio": 24.87 / 20, "tokens": 2000.0, "queue": 1.0, "running": 20.0}, False),
        # ...unless requests queue for KV room, which says decode is short;
        ({"ratio": 24.87 / 20, "tokens": 2000.0, "queue": 5.0, "running": 20.0, "kv": 0.7}, True),
        # a reading in (25, 50] ms is over the target whatever the gaps are.
        ({"ratio": 30 / 20, "tokens": 2000.0}, True),
    ],
)
def test_a_breach_the_histogram_cannot_resolve_neither_grows_nor_holds(decode, grows):
    observation = observe(SPEC, T0, {("prefill", "p"): 2, ("decode", "d"): 2}, decode=decode)
    decision = decide(SPEC, observation, PolicyState(), T0)
    assert (replicas(decision, "decode", "d") > 2) is grows
    # The reason says which one decided: the bucket and the demand, or the reading.
    assert decision is not None
    if grows:
        assert "ITL P50 0.5-1.2x target (its histogram bucket)" not in decision.reason
    else:
        assert "ITL P50 0.5-1.2x target (its histogram bucket): the demand decides" in (
            decision.reason
        )
        assert "1.24x" not in decision.reason


P99 = spec_of({"slo.ttft.percentile": "P99"})


def with_mean(spec, observation, role, mean_ratio):
    """The observation with the role's mean latency at `mean_ratio` x its target."""
    read = replace(
        observation.signals[role],
        mean_latency_seconds=Reading.of(mean_ratio * target_seconds(spec, role)),
    )
    return replace(observation, signals={**observation.signals, role: read})


ITL_P99 = spec_of({"slo.itl.percentile": "P99"})


@pytest.mark.parametrize(
    ("spec", "mean_ratio", "grows", "words"),
    [
        # A P99 read in the (10, 25] ms bucket with the exact mean at 24 ms: the P99 is at least
        # the mean, past the tolerance: a breach, and the reason says the mean decided.
        (ITL_P99, 1.2, True, "ITL P99 at least 1.20x target (its mean; the percentile's"),
        # A mean under the bucket's lower bound places nothing: the demand decides.
        (ITL_P99, 0.4, False, "ITL P99 0.5-1.2x target (its histogram bucket): the demand"),
        # A mean is no lower bound of a median (a skewed latency's mean lies above it).
        (SPEC, 1.2, False, "ITL P50 0.5-1.2x target (its histogram bucket): the demand"),
    ],
)
def test_the_exact_mean_places_a_tail_percentile_its_bucket_cannot(spec, mean_ratio, grows, words):
    observation = observe(
        spec, T0, {("prefill", "p"): 2, ("decode", "d"): 2},
        decode={"ratio": 24.87 / 20, "tokens": 2000.0},
    )  # fmt: skip
    decision = decide(spec, with_mean(spec, observation, "decode", mean_ratio), PolicyState(), T0)
    assert decision is not None
    assert (replicas(decision, "decode", "d") > 2) is grows
    assert words in decision.reason


@pytest.mark.parametrize(
    ("spec", "mean_ratio", "queue", "grows"),
    [
        # A P99 TTFT at twice the target while the mean is a fifth of it: a few prompts too
        # long for the target set the tail; replicas would not move it.
        (P99, 0.2, 0.0, False),
        # The same tail with prompts waiting, a whole TTFT target's worth of what the replicas
        # served (2000 tokens/s x 1 s, 1000-token prompts): the replicas are short, not the
        # prompts too long.
        (P99, 0.2, 2.0, True),
        # The mean near the target too: the load is what is slow.
        (P99, 0.8, 0.0, True),
        # A P50 target is the bulk of requests, never a tail.
        (SPEC, 0.2, 0.0, True),
    ],
)
def test_a_tail_percentile_set_by_a_few_long_requests_adds_no_replicas(
    spec, mean_ratio, queue, grows
):
    observation = observe(
        spec, T0, {("prefill", "p"): 2, ("decode", "d"): 2},
        prefill={"ratio": 2.0, "tokens": 2000.0, "queue": queue},
    )  # fmt: skip
    decision = decide(spec, with_mean(spec, observation, "prefill", mean_ratio), PolicyState(), T0)
    assert (replicas(decision) > 2) is grows


@pytest.mark.parametrize(
    ("ratio", "grows"), [(0.8, False), (0.9, False), (1.1, False), (1.15, True)]
)
def test_feedback_alone_acts_only_outside_its_dead_band(ratio, grows):
    # Demand unreadable: the latency loop is all there is; within +-10% of the target it holds.
    state, now = calibrated(SPEC, {"prefill": 1000.0, "decode": 500.0}), T0
    base = observe(SPEC, now, {("prefill", "p"): 3, ("decode", "d"): 1})
    for _ in range(12):
        blind = RoleSignals(
            now, ttft_seconds=Reading.of(ratio), prompt_tokens_per_second=unavailable("timeout")
        )
        observation = Observation({**base.signals, "prefill": blind}, base.pools)
        decision = decide(SPEC, observation, state, now)
        assert decision is not None
        assert (replicas(decision) > 3) is grows
        state, now = decision.state, now + INTERVAL


def test_demand_from_the_hardware_profile_scales_up_before_the_slo_breaks():
    per_replica = seed_capacity(resolve(PROFILED), "prefill", PROFILED.prefill.pools[0], 1000)
    assert per_replica is not None
    observation = observe(
        PROFILED,
        T0,
        {("prefill", "p"): 3, ("decode", "d"): 1},
        prefill={"ratio": 0.8, "tokens": 2.9 * per_replica},
    )
    decision = decide(PROFILED, observation, PolicyState(), T0)
    assert replicas(decision) == 4  # 2.9 replicas of work need 3.6 at 80% utilisation
    assert decision is not None and decision.state.role("prefill").capacity_basis == "profile"


def test_a_prefill_queue_adds_to_the_demand():
    state = calibrated(SPEC, {"prefill": 1000.0, "decode": 500.0})
    quiet, queued = (
        decide(
            SPEC,
            observe(
                SPEC,
                T0,
                {("prefill", "p"): 2, ("decode", "d"): 1},
                prefill={"ratio": 0.8, "tokens": 1500.0, "queue": queue},
            ),
            state,
            T0,
        )
        for queue in (0.0, 120.0)
    )
    assert replicas(quiet) == 2
    # 120 waiting x 1000 tokens drained over the 60 s window: +2000 tokens/s.
    assert replicas(queued) == 5


@pytest.mark.parametrize(("kv", "expected"), [(0.5, 2), (0.79, 2), (0.95, 3)])
def test_decode_grows_on_kv_cache_usage_even_when_itl_holds(kv, expected):
    observation = observe(
        SPEC,
        T0,
        {("prefill", "p"): 1, ("decode", "d"): 2},
        decode={"ratio": 0.7, "tokens": 400.0, "kv": kv},
    )
    state = calibrated(SPEC, {"prefill": 1000.0, "decode": 500.0})
    assert replicas(decide(SPEC, observation, state, T0), "decode", "d") == expected


def test_requests_waiting_for_kv_room_count_as_kv_demand():
    observation = observe(
        SPEC,
        T0,
        {("prefill", "p"): 1, ("decode", "d"): 2},
        decode={"ratio": 0.7, "tokens": 400.0, "kv": 0.7, "running": 40.0, "queue": 20.0},
    )
    state = calibrated(SPEC, {"prefill": 1000.0, "decode": 500.0})
    decision = decide(SPEC, observation, state, T0)
    assert replicas(decision, "decode", "d") == 3  # 0.7 x 60/40 = 1.05 of the cache: +1


def test_a_tail_far_over_the_target_holds_the_size_and_a_small_one_lets_it_shrink():
    # P99 TTFT over the target with the mean at a fifth of it: a tail of long prompts, or the
    # queue behind them. The demand fits two replicas at 70%. A tail at 1.2x the target lets
    # the third go after the window; one at 2x holds it (shedding would add to the queue behind
    # the long prompts), and neither adds a replica. With the mean near the target too, the
    # breach is the load's: no replica goes.
    def sizes(ratio: float, mean_ratio: float) -> list[int]:
        now, state, current = T0, calibrated(P99, {"prefill": 1000.0, "decode": 500.0}), 3
        out = []
        for _ in range(14):
            observation = observe(
                P99, now, {("prefill", "p"): current, ("decode", "d"): 1},
                prefill={"ratio": ratio, "tokens": 1200.0},
            )  # fmt: skip
            prefill = replace(
                observation.signals["prefill"],
                mean_latency_seconds=Reading.of(mean_ratio * target_seconds(P99, "prefill")),
            )
            observation = replace(observation, signals={**observation.signals, "prefill": prefill})
            decision = decide(P99, observation, state, now)
            assert decision is not None
            current, state, now = replicas(decision), decision.state, now + INTERVAL
            out.append(current)
        return out

    assert sizes(1.2, 0.2)[-1] == 2
    assert set(sizes(2.0, 0.2)) == {3}
    assert min(sizes(2.0, 0.8)) >= 3


@pytest.mark.parametrize(
    ("wait_ratio", "mean_ratio", "expected"),
    [
        # Prompts barely wait (mean 0.2% of the target): no wait explains a tail 1x over it,
        # so prompts too long for the target set it. The demand's two replicas serve the rest.
        (0.002, 0.2, {3, 2}),
        # The same with the mean near the target: the prompts are slow on their own, and more
        # replicas would not make them faster; no replica is added for it.
        (0.002, 0.8, {3, 2}),
        # Prompts wait 5% of the target on average: queueing may explain the tail (1% of them
        # waiting a whole target), so it holds the size as before.
        (0.05, 0.2, {3}),
    ],
)
def test_a_tail_the_prompts_waits_cannot_explain_holds_nothing(wait_ratio, mean_ratio, expected):
    # P99 TTFT at 2x the target. Markov: at most mean wait / (1x target) of the prompts waited
    # the excess; under the 1% tail, prompts too long on their own fill it.
    now, state, current, sizes = T0, calibrated(P99, {"prefill": 1000.0, "decode": 500.0}), 3, []
    target = target_seconds(P99, "prefill")
    for _ in range(14):
        observation = observe(
            P99, now, {("prefill", "p"): current, ("decode", "d"): 1},
            prefill={"ratio": 2.0, "tokens": 1200.0},
        )  # fmt: skip
        prefill = replace(
            observation.signals["prefill"],
            mean_latency_seconds=Reading.of(mean_ratio * target),
            queue_seconds=Reading.of(wait_ratio * target),
        )
        observation = replace(observation, signals={**observation.signals, "prefill": prefill})
        decision = decide(P99, observation, state, now)
        assert decision is not None
        if expected != {3}:
            assert "with prompts waiting" in decision.reason
        current, state, now = replicas(decision), decision.state, now + INTERVAL
        sizes.append(current)
    assert set(sizes) == expected
    assert sizes[-1] == min(expected)


# ---------------------------------------------------------------- unknown is never zero
@pytest.mark.parametrize(
    "broken",
    [
        {"prefill": unavailable("prometheus: connection refused")},
        {"prefill": "stale"},
        {"prefill": "missing"},
        {"prefill": "stuck"},
    ],
    ids=["query-failed", "stale-sample", "role-not-read", "queued-but-nothing-finished"],
)
def test_missing_metrics_hold_every_pool_of_the_role(broken):
    now = T0
    base = observe(SPEC, now, {("prefill", "p"): 6, ("decode", "d"): 1})
    what = broken["prefill"]
    prefill_signals: RoleSignals | None
    if what == "stale":
        prefill_signals = signals(SPEC, "prefill", now - 600, ratio=0.2, tokens=10.0)
    elif what == "missing":
        prefill_signals = None
    elif what == "stuck":
        prefill_signals = signals(SPEC, "prefill", now, queue=50.0)
    else:
        prefill_signals = RoleSignals(now, ttft_seconds=what)
    observation = Observation(
        {"decode": base.signals["decode"]}
        | ({"prefill": prefill_signals} if prefill_signals else {}),
        base.pools,
    )
    state = calibrated(SPEC, {"prefill": 1000.0, "decode": 500.0}, since=now - 3600)
    decision = decide(SPEC, observation, state, now)
    assert replicas(decision) == 6
    assert limit(decision) == "metrics"
    assert decision is not None and decision.limited_by == "metrics"


def test_requests_held_for_a_whole_window_without_finishing_read_as_a_breach():
    # Right after a quiet spell the first requests are still running: hold. A window later,
    # nothing has finished: latency is at least that long.
    state, now, sizes = calibrated(SPEC, {"prefill": 1000.0, "decode": 500.0}), T0, []
    for _ in range(4):
        observation = observe(
            SPEC,
            now,
            {("prefill", "p"): 2, ("decode", "d"): 1},
            prefill={"queue": 40.0, "running": 4.0},
        )
        decision = decide(SPEC, observation, state, now)
        assert decision is not None
        sizes.append(replicas(decision))
        state, now = decision.state, now + INTERVAL
    assert sizes[:2] == [2, 2]
    assert sizes[2] > 2  # 60 s window, decisions every 30 s
    assert "nothing finished" in decision.reason


def test_an_unreadable_demand_blocks_scale_down_but_not_the_latency_loop():
    state = calibrated(SPEC, {"prefill": 1000.0, "decode": 500.0}, since=T0 - 3600)
    low = Reading.of(0.2)
    blind = RoleSignals(T0, ttft_seconds=low, prompt_tokens_per_second=unavailable("timeout"))
    base = observe(SPEC, T0, {("prefill", "p"): 6, ("decode", "d"): 1})
    decision = decide(SPEC, Observation({**base.signals, "prefill": blind}, base.pools), state, T0)
    assert replicas(decision) == 6
    assert limit(decision) == "metrics"
    breach = RoleSignals(
        T0, ttft_seconds=Reading.of(2.0), prompt_tokens_per_second=unavailable("x")
    )
    decision = decide(SPEC, Observation({**base.signals, "prefill": breach}, base.pools), state, T0)
    assert replicas(decision) > 6


def test_no_traffic_scales_to_min_only_after_the_scale_down_window():
    spec = spec_of({"prefill.pools.0.replicas": {"min": 1, "max": 10}})
    decisions = run(
        spec,
        calibrated(spec, {"prefill": 1000.0, "decode": 500.0}),
        {("prefill", "p"): 3, ("decode", "d"): 1},
        14,
        prefill={"ratio": None, "tokens": None},
    )
    sizes = [d.role_replicas("prefill") for d in decisions]
    assert sizes == [3] * 10 + [2, 1, 1, 1]
    assert "no traffic" in decisions[0].reason
