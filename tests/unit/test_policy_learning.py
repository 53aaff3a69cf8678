"""Learning each pool's capacity per replica: the profile's seed (prompt lengths, the prefix
cache, decode context), corrections from what the replicas serve, and what a latency
reading inside its histogram bucket can teach."""

import math
from dataclasses import replace

import pytest

from pd_operator.api.spec import Role
from pd_operator.core.hardware import GLM_45_FP8, H200_SXM, MTT_S5000
from pd_operator.core.learning import (
    latency_evidence,
    seed_capacity,
)
from pd_operator.core.learning import seeds as learning_seeds
from pd_operator.core.policy import Decision, Observation, decide
from pd_operator.core.policy_state import PolicyState, RoleMemory
from pd_operator.core.resolved import resolve
from pd_operator.core.signals import (
    LATENCY_BUCKETS,
    NO_TRAFFIC,
    PoolSignals,
    Reading,
    bucket_of,
    unavailable,
)
from pd_operator.core.tuning import TUNING
from pd_tools.enginesim.engine import PDEngine, ReplicaSpec
from pd_tools.enginesim.engine import Role as EngineRole
from pd_tools.workloads.traces import Request
from policycases import (
    INTERVAL,
    PROFILED,
    PROFILED_CHANGES,
    SPEC,
    T0,
    calibrated,
    kv_share,
    observe,
    replicas,
    run,
    seed,
    spec_of,
)

# ---------------------------------------------------------------- per pool
# Prefill on two kinds of card, each with its profile: S5000 nodes and spare H200s.
TWO_PREFILL_CARDS = spec_of(
    {
        **PROFILED_CHANGES,
        "prefill.pools": [
            {"name": "s5000", "accelerator": PROFILED_CHANGES["prefill.pools.0.accelerator"]},
            {
                "name": "h200",
                "accelerator": PROFILED_CHANGES["decode.pools.0.accelerator"],
                "replicas": {"min": 1, "max": 10},
            },
        ],
    }
)
TWO_CARD_REPLICAS: dict[tuple[Role, str], int] = {
    ("prefill", "s5000"): 2,
    ("prefill", "h200"): 2,
    ("decode", "d"): 2,
}


def _prefill_estimates(state: PolicyState) -> dict[str, float]:
    found = {p: state.pool("prefill", p).capacity_per_replica for p in ("s5000", "h200")}
    assert all(v is not None for v in found.values()), found
    return {p: float(v or 0) for p, v in found.items()}


def test_each_prefill_pool_learns_its_own_capacity_from_its_own_signals():
    # The profiles' seeds for the 1000-token prompts observed.
    seeds = learning_seeds(resolve(TWO_PREFILL_CARDS), "prefill", 1000)
    # The S5000 replicas serve half what their profile says, in breach with a queue a whole
    # TTFT target long; the H200 replicas serve half theirs too, well under the target: they
    # were not asked more.
    served = {pool: 2 * 0.5 * seeds[pool] for pool in seeds}
    target = TWO_PREFILL_CARDS.slo.ttft.target_milliseconds / 1000
    queue = 2 * sum(served.values()) * target / 1000
    breach = {"ratio": 2.0, "tokens": sum(served.values()), "queue": queue}
    base = observe(TWO_PREFILL_CARDS, T0, TWO_CARD_REPLICAS, prefill=breach)
    per_pool = {
        "s5000": PoolSignals(Reading.of(2.0 * target), Reading.of(served["s5000"])),
        "h200": PoolSignals(Reading.of(0.5 * target), Reading.of(served["h200"])),
    }
    read = Observation(
        {**base.signals, "prefill": replace(base.signals["prefill"], pools=per_pool)},
        base.pools,
        base.capacity,
    )

    without = decide(TWO_PREFILL_CARDS, base, PolicyState(), T0)
    assert without is not None
    # One role-wide factor: both pools are cut by the same measure, the H200s for nothing.
    cut = _prefill_estimates(without.state)
    assert cut["s5000"] / seeds["s5000"] == pytest.approx(cut["h200"] / seeds["h200"])
    assert cut["h200"] == pytest.approx(0.5 * seeds["h200"], rel=0.01)

    with_pools = decide(TWO_PREFILL_CARDS, read, PolicyState(), T0)
    assert with_pools is not None
    own = _prefill_estimates(with_pools.state)
    assert own["s5000"] == pytest.approx(0.5 * seeds["s5000"], rel=0.01)
    assert own["h200"] == pytest.approx(seeds["h200"], rel=0.01)

    # A pool without a reading of its own (a spill-over not serving yet) is not cut for its
    # neighbour's breach.
    s5000_only = replace(base.signals["prefill"], pools={"s5000": per_pool["s5000"]})
    alone = Observation({**base.signals, "prefill": s5000_only}, base.pools, base.capacity)
    spared = decide(TWO_PREFILL_CARDS, alone, PolicyState(), T0)
    assert spared is not None
    assert _prefill_estimates(spared.state)["h200"] == pytest.approx(seeds["h200"], rel=0.01)

    # Each pool keeps its own correction through the stored state and a quiet interval (in
    # which the seeds follow the default prompt length, both pools alike).
    stored = PolicyState.from_dict(with_pools.state.to_dict())
    later = T0 + INTERVAL
    quiet = observe(TWO_PREFILL_CARDS, later, TWO_CARD_REPLICAS, prefill={"ratio": None})
    kept = decide(TWO_PREFILL_CARDS, quiet, stored, later)
    assert kept is not None
    again = _prefill_estimates(kept.state)
    assert again["s5000"] / again["h200"] == pytest.approx(own["s5000"] / own["h200"], rel=0.01)


# ---------------------------------------------------------------- corrections
def test_without_a_profile_capacity_is_learned_from_throughput_near_the_target():
    state, now = PolicyState(), T0
    for _ in range(30):
        observation = observe(
            SPEC,
            now,
            {("prefill", "p"): 3, ("decode", "d"): 1},
            prefill={"ratio": 1.0, "tokens": 3000.0},
        )
        decision = decide(SPEC, observation, state, now)
        assert decision is not None
        state, now = decision.state, now + INTERVAL
    learned = state.pool("prefill", "p").capacity_per_replica
    assert learned == pytest.approx(1000.0, rel=0.01)
    assert state.role("prefill").capacity_basis == "observed"


def test_a_breach_cuts_an_optimistic_estimate_and_low_latency_raises_a_pessimistic_one():
    optimistic = calibrated(SPEC, {"prefill": 1000.0, "decode": 5000.0})
    observation = observe(
        SPEC,
        T0,
        {("prefill", "p"): 1, ("decode", "d"): 2},
        decode={"ratio": 2.0, "tokens": 2000.0},
    )
    cut = decide(SPEC, observation, optimistic, T0)
    assert cut is not None
    # Past the target, what two replicas served is more than they take within it.
    assert cut.state.pool("decode", "d").capacity_per_replica == pytest.approx(2000 / 2 / 1.25)
    pessimistic = calibrated(SPEC, {"prefill": 100.0, "decode": 500.0})
    observation = observe(
        SPEC,
        T0,
        {("prefill", "p"): 2, ("decode", "d"): 1},
        prefill={"ratio": 0.5, "tokens": 2000.0},
    )
    raised = decide(SPEC, observation, pessimistic, T0)
    assert raised is not None
    assert raised.state.pool("prefill", "p").capacity_per_replica == pytest.approx(1000.0)


@pytest.mark.parametrize(
    ("waiting", "learned"),
    [
        # 10,000 prompt tokens wait, five seconds of what the replicas served against a 1 s
        # target: both were busy all the time, and 2000 tokens/s is what two replicas serve,
        # not what they would serve at the target.
        (10.0, 1000.0),
        # One prompt waits, half a second of it: replicas busy part of the time have that at
        # a sample. Read as saturation, a cold start's first minute cut the Mooncake trace's
        # estimate to 0.6 of the profile for the rest of the hour.
        (1.0, 5000.0),
        # None waits: the replicas caught up with all that arrived. The window's rate averages
        # a burst with the quiet around it; taken as a bound it would cut the estimate and keep
        # replicas long after the burst (the Azure code trace: to 0.38 of the profile).
        (0.0, 5000.0),
    ],
)
def test_a_prefill_breach_measures_throughput_only_while_a_target_of_work_waits(waiting, learned):
    state = calibrated(SPEC, {"prefill": 5000.0, "decode": 500.0})
    observation = observe(
        SPEC,
        T0,
        {("prefill", "p"): 2, ("decode", "d"): 1},
        prefill={"ratio": 2.0, "tokens": 2000.0, "queue": waiting},
    )
    decision = decide(SPEC, observation, state, T0)
    assert decision is not None
    assert decision.state.pool("prefill", "p").capacity_per_replica == pytest.approx(learned)
    assert decision.state.role("prefill").capacity_basis == "observed"


# ---------------------------------------------------------------- what a latency reading can tell
@pytest.mark.parametrize(
    ("value", "bucket"),
    [
        (0.0176, (0.01, 0.025)),
        (0.025, (0.01, 0.025)),
        (0.005, (0.0, 0.01)),
        (80.0, (80.0, math.inf)),
    ],
)
def test_a_quantile_lies_somewhere_in_its_histogram_bucket(value, bucket):
    assert bucket_of(LATENCY_BUCKETS["VLLM"]["decode"], value) == bucket


@pytest.mark.parametrize(
    ("ratio", "bucket", "evidence"),
    [
        (1.5, (1.25, 2.5), "breach"),
        (1.15, (0.5, 1.25), "breach"),  # interpolated past the tolerance: act on it
        (1.05, (1.0, 2.5), "breach"),  # a wide bucket, but wholly at or past the target
        (0.88, (0.5, 1.25), None),  # vLLM's 10-25 ms bucket around a 20 ms target
        (0.88, (0.75, 1.0), "near"),  # SGLang's 15-20 ms bucket
        (1.0, None, "near"),  # an exact latency
        (0.6, (0.5, 1.25), None),  # might be at 1.25x the target
        (0.4, (0.0, 0.5), "under"),
        (0.6, None, "under"),
    ],
)
def test_a_reading_teaches_only_what_its_bucket_can_resolve(ratio, bucket, evidence):
    assert latency_evidence(ratio, bucket) == evidence


SGLANG = spec_of({"model.engine": "SGLang"})


@pytest.mark.parametrize(("spec", "learns"), [(SPEC, False), (SGLANG, True)])
def test_itl_inside_a_wide_bucket_is_no_sign_of_running_at_the_slo(spec, learns):
    # ITL P50 reads 17.6 ms against 20 ms. vLLM's buckets only say "between 10 and 25 ms",
    # at any load; SGLang's say "between 15 and 20 ms": the replicas are near their capacity.
    state = calibrated(spec, {"prefill": 1000.0, "decode": 500.0})
    decisions = run(
        spec,
        state,
        {("prefill", "p"): 1, ("decode", "d"): 2},
        10,
        decode={"ratio": 0.88, "tokens": 300.0, "kv": 0.05},
    )
    learned = decisions[-1].state.pool("decode", "d").capacity_per_replica
    assert learned is not None
    if learns:
        assert learned == pytest.approx(150.0, rel=0.05)  # 300 tokens/s on two replicas
        assert decisions[-1].role_replicas("decode") >= 2
    else:
        assert learned == pytest.approx(500.0)
        assert [d.role_replicas("decode") for d in decisions] == [2] * 10


def test_a_low_reading_in_a_wide_bucket_does_not_raise_a_pessimistic_estimate():
    # 12 ms against 20 ms lies in vLLM's 10-25 ms bucket: the ITL may be 1.25x the target.
    state = calibrated(SPEC, {"prefill": 1000.0, "decode": 100.0})
    observation = observe(
        SPEC,
        T0,
        {("prefill", "p"): 1, ("decode", "d"): 2},
        decode={"ratio": 0.6, "tokens": 400.0},
    )
    decision = decide(SPEC, observation, state, T0)
    assert decision is not None
    assert decision.state.pool("decode", "d").capacity_per_replica == pytest.approx(100.0)


# ---------------------------------------------------------------- profile seeds and prefix cache


S5000_REPLICA = ReplicaSpec.from_profiles(MTT_S5000, GLM_45_FP8, 8)
H200_REPLICA = ReplicaSpec.from_profiles(H200_SXM, GLM_45_FP8, 8)


def test_varied_prompt_lengths_cost_more_prefill_than_prompts_of_the_mean_length():
    pool, decode_pool = PROFILED.prefill.pools[0], PROFILED.decode.pools[0]
    fixed = seed_capacity(resolve(PROFILED), "prefill", pool, 16000)
    varied = seed_capacity(
        resolve(PROFILED), "prefill", pool, 16000, prompt_length_cv2=TUNING.prompt_length_cv2
    )
    assert fixed is not None and varied is not None
    assert varied < 0.9 * fixed  # attention costs the square of each prompt's length
    short = seed_capacity(
        resolve(PROFILED), "prefill", pool, 500, prompt_length_cv2=TUNING.prompt_length_cv2
    )
    assert short == pytest.approx(seed_capacity(resolve(PROFILED), "prefill", pool, 500), rel=0.05)
    assert seed_capacity(
        resolve(PROFILED), "decode", decode_pool, 4000, prompt_length_cv2=TUNING.prompt_length_cv2
    ) == seed_capacity(resolve(PROFILED), "decode", decode_pool, 4000)


@pytest.mark.parametrize("cached_share", [0.0, 0.5, 0.8])
def test_a_prefill_seed_is_what_the_engine_serves_with_that_share_of_each_prompt_cached(
    cached_share: float,
) -> None:
    """One S5000 replica of the engine simulator, kept busy with 16K-token prompts whose first
    `cached_share` is in the prefix cache, serves prompt tokens (cached ones counted, as the
    engines' counters count them) at the seed's rate for prompts of one length and that share."""
    prompt, cached = 16_000, round(cached_share * 16_000)
    engine = PDEngine([Request(0.0, prompt, 1, cached) for _ in range(120)], model=GLM_45_FP8)
    engine.add_instance("p", EngineRole.PREFILL, S5000_REPLICA, ready_after_s=0)
    engine.add_instance("d", EngineRole.DECODE, H200_REPLICA, ready_after_s=0)
    records = engine.run().records
    served = len(records) * prompt / max(r.prefill_end_s for r in records)
    pool = PROFILED.prefill.pools[0]
    assert seed_capacity(resolve(PROFILED), "prefill", pool, prompt, cached_share=cached_share) == (
        pytest.approx(served, rel=0.05)
    )


def test_prefill_holds_on_a_load_its_prefix_cache_makes_light() -> None:
    """Demand at 1.4x what one replica computes for cold 8K-token prompts, with 60% of the
    prompt tokens found in the prefix cache (vLLM's prefix_cache_hits): one replica computes
    it, and the decision says why. Without the cache reading the same load grows prefill."""
    per_replica = seed("prefill", 8000)
    tokens = 1.4 * per_replica

    def decided(cached: Reading) -> Decision | None:
        observation = observe(
            PROFILED, T0, {("prefill", "p"): 1, ("decode", "d"): 1},
            prefill={"ratio": 0.4, "tokens": tokens},
        )  # fmt: skip
        prefill = replace(
            observation.signals["prefill"],
            requests_per_second=Reading.of(tokens / 8000),
            cached_prompt_tokens_per_second=cached,
        )
        observation = replace(observation, signals={**observation.signals, "prefill": prefill})
        return decide(PROFILED, observation, PolicyState(), T0)

    warm = decided(Reading.of(0.6 * tokens))
    assert replicas(warm) == 1
    assert warm is not None and "60% of prompt tokens cached" in warm.reason
    assert replicas(decided(unavailable("no series"))) > 1
    assert replicas(decided(Reading.of(0.0))) > 1


def test_prefill_sheds_a_replica_only_where_the_rest_serve_the_load_without_its_cache():
    """Two replicas, 60% of prompt tokens cached. A replica shed takes its prefix cache with
    it: the prefixes it held (half of them) come back cold, so the one left sees 30% cached
    until it has computed them again. At half of what one warm replica serves, more than one
    replica computes at 30% cached, both stay; at 60% of what it computes at 30% cached, one
    goes (with no cache counted at all, as before, it stayed all hour); at a fifth, one goes."""
    pool = PROFILED.prefill.pools[0]

    def seeded(share: float) -> float:
        value = seed_capacity(
            resolve(PROFILED), "prefill", pool, 1000, prompt_length_cv2=TUNING.prompt_length_cv2,
            cached_share=share,
        )  # fmt: skip
        assert value is not None
        return value

    warm, kept, cold = seeded(0.6), seeded(0.3), seeded(0.0)
    assert warm > kept > 1.2 * cold

    def sizes(demand: float) -> list[int]:
        decisions = run(
            PROFILED, PolicyState(), {("prefill", "p"): 2, ("decode", "d"): 1}, 20,
            prefill={"ratio": 0.3, "tokens": demand, "cached": 0.6},
        )  # fmt: skip
        return [replicas(d) for d in decisions]

    assert sizes(0.5 * warm) == [2] * 20
    assert 0.6 * kept > 0.7 * cold  # what the old rule, cold, would have kept two for
    assert sizes(0.6 * kept)[-1] == 1
    assert sizes(0.2 * warm)[-1] == 1


@pytest.mark.parametrize(
    ("prompt", "load", "grows"),
    [
        # 1,000-token prompts take ~30 ms against a 6 s TTFT: the queue allows 95%, and
        # prefill grows at 0.9 of that (86%), not at the fixed 80%.
        (1000, 0.84, False),
        (1000, 0.87, True),
        # 30,000-token prompts take seconds: the queueing estimate allows less than 80%, and
        # never sizes tighter than the fixed margin (it does not see bursts).
        (30000, 0.79, False),
        (30000, 0.81, True),
    ],
)
def test_prefill_runs_replicas_as_hot_as_its_queue_allows_under_the_ttft_target(
    prompt, load, grows
):
    per_replica = seed("prefill", prompt)
    observation = observe(
        PROFILED, T0, {("prefill", "p"): 1, ("decode", "d"): 1},
        prefill={"ratio": 0.3, "tokens": load * per_replica},
    )  # fmt: skip
    prefill = replace(
        observation.signals["prefill"],
        requests_per_second=Reading.of(load * per_replica / prompt),
    )
    observation = replace(observation, signals={**observation.signals, "prefill": prefill})
    decision = decide(PROFILED, observation, PolicyState(), T0)
    assert (replicas(decision) > 1) is grows


def profiled_capacity(decision: Decision | None, role: Role) -> float:
    assert decision is not None
    pool = next(d for d in decision.pools if d.role == role)
    assert pool.capacity_per_replica is not None
    return pool.capacity_per_replica


def test_what_was_learned_carries_over_when_prompts_get_longer():
    # Learned: the replicas serve half what the profile says. Prompts then grow from 1,000
    # to 8,000 tokens: the estimate follows the profile's curve at that learned efficiency.
    state = PolicyState(
        roles={"prefill": RoleMemory(capacity_basis="observed", capacity_factor=0.5)}
    )
    counts = {("prefill", "p"): 2, ("decode", "d"): 1}
    for prompt in (1000, 8000):
        tokens = 2000.0
        observation = observe(PROFILED, T0, counts, prefill={"ratio": 0.5, "tokens": tokens})
        prefill = observation.signals["prefill"]
        observation = Observation(
            {
                **observation.signals,
                "prefill": replace(prefill, requests_per_second=Reading.of(tokens / prompt)),
            },
            observation.pools,
        )
        decision = decide(PROFILED, observation, state, T0)
        assert profiled_capacity(decision, "prefill") == pytest.approx(
            0.5 * seed("prefill", prompt)
        )
        assert decision is not None
        assert decision.state.role("prefill").capacity_factor == pytest.approx(0.5)


# ---------------------------------------------------------------- decode context
def test_decode_sizes_its_seed_on_the_prompts_prefill_saw():
    # Decode engines may not count prompt tokens; the prefill's 1,000-token prompts are theirs.
    observation = observe(PROFILED, T0, {("prefill", "p"): 1, ("decode", "d"): 1})
    blind = replace(
        observation.signals["decode"],
        prompt_tokens_per_second=NO_TRAFFIC,
        requests_per_second=NO_TRAFFIC,
    )
    observation = Observation({**observation.signals, "decode": blind}, observation.pools)
    decision = decide(PROFILED, observation, PolicyState(), T0)
    assert profiled_capacity(decision, "decode") == pytest.approx(seed("decode", 1000))


def test_decode_sizes_on_the_context_its_kv_cache_holds_in_one_decision():
    # Reasoning: 1,000-token prompts, but a running sequence holds its answer so far too, 3,000
    # tokens on average, which the KV cache shows. Sized on the prompt, one replica read ~2.5x
    # its real capacity and decode stayed in breach; sized on the context, the decision grows
    # it at once to what the load needs at that context.
    per_replica = seed("decode", 3000)
    demand = 3.2 * per_replica
    running = demand * 0.02  # tokens/s x seconds per token at the 20 ms target
    observation = observe(
        PROFILED, T0, {("prefill", "p"): 4, ("decode", "d"): 1},
        prefill={"ratio": 0.3, "tokens": 4000.0},
        decode={"ratio": 1.2, "tokens": demand, "running": running,
                "kv": kv_share(running, 3000)},
    )  # fmt: skip
    decision = decide(PROFILED, observation, PolicyState(), T0)
    assert profiled_capacity(decision, "decode") == pytest.approx(per_replica, rel=0.02)
    assert replicas(decision, "decode", "d") >= 4  # 3.2 replicas' load at its margin
    assert decision is not None
    assert decision.state.role("decode").context_tokens() == pytest.approx(3000, rel=0.01)


def test_decode_breach_while_old_replicas_keep_their_batch_teaches_nothing():
    # Decode grew from 1 to 4; the sequences that started on the first replica stay there
    # until they finish (running / request rate = 60 s, and a token's sequence twice that),
    # so for a while the ITL breaches although four replicas carry the load. That breach is
    # no measure of a replica's capacity, nor a sign that replicas do not help.
    start = PolicyState()
    per_replica = seed("decode", 1000)
    now, state, current = T0, start, {("prefill", "p"): 4, ("decode", "d"): 1}
    for ready, ratio in [(1, 2.0), (4, 2.0), (4, 2.0), (4, 2.0), (4, 1.8)]:
        current[("decode", "d")] = ready
        demand = 2.4 * per_replica
        running = demand * 0.02
        observation = observe(
            PROFILED, now, dict(current),
            prefill={"ratio": 0.3, "tokens": running / 60 * 1000},
            decode={"ratio": ratio, "tokens": demand, "running": running,
                    "kv": kv_share(running / ready, 1000)},
        )  # fmt: skip
        decision = decide(PROFILED, observation, state, now)
        assert decision is not None
        state, now = decision.state, now + INTERVAL
    # 150 s after the replicas came: within the 60 s window + 2 x 60 s turnover.
    assert profiled_capacity(decision, "decode") >= 0.95 * per_replica
    assert state.role("decode").futile_ratio is None
