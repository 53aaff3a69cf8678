"""The autoscaling policy: every rule as a table test, and properties under a simple plant model."""

import copy
import itertools
import json
import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from pd_operator.api import parse_pddeployment
from pd_operator.api.spec import PDDeploymentSpec, Role
from pd_operator.core.allocation import record_ready
from pd_operator.core.capacity import FreeCapacity, free_capacity
from pd_operator.core.hardware import GLM_45_FP8, H200_SXM, HARDWARE_PROFILES, MTT_S5000
from pd_operator.core.learning import (
    PROMPT_LENGTH_CV2,
    latency_evidence,
    model_profile_for,
    seed_capacity,
    seed_load_seconds,
)
from pd_operator.core.observe import NodeSummary
from pd_operator.core.perfmodel import kv_capacity_tokens
from pd_operator.core.policy import Decision, Observation, PoolObservation, _steady, decide
from pd_operator.core.policy_state import PolicyState, PoolMemory, RoleMemory
from pd_operator.core.signals import (
    LATENCY_BUCKETS,
    NO_TRAFFIC,
    Reading,
    RoleSignals,
    bucket_of,
    unavailable,
)
from pd_tools.enginesim.engine import PDEngine, ReplicaSpec
from pd_tools.enginesim.engine import Role as EngineRole
from pd_tools.workloads.traces import Request
from pdcases import minimal

T0 = 1_000_000.0
S5000_REPLICA = ReplicaSpec.from_profiles(MTT_S5000, GLM_45_FP8, 8)
H200_REPLICA = ReplicaSpec.from_profiles(H200_SXM, GLM_45_FP8, 8)
INTERVAL = 30.0
ROLES: tuple[Role, Role] = ("prefill", "decode")


def spec_of(changes: dict[str, Any] | None = None) -> PDDeploymentSpec:
    """The minimal PDDeployment (TTFT 1 s, ITL 20 ms, pools p and d, 1..10) with changes."""
    document = minimal()
    for path, value in (changes or {}).items():
        node = document["spec"]
        *parents, last = path.split(".")
        for part in parents:
            node = node[int(part)] if part.isdigit() else node.setdefault(part, {})
        node[int(last) if last.isdigit() else last] = copy.deepcopy(value)
    return parse_pddeployment(document).spec


SPEC = spec_of()
PROFILED = spec_of(
    {
        "model.name": "zai-org/GLM-4.5-FP8",
        "prefill.pools.0.accelerator": {
            "resourceName": "mthreads.com/gpu",
            "perReplica": 8,
            "profile": "mtt-s5000",
        },
        "decode.pools.0.accelerator": {
            "resourceName": "nvidia.com/gpu",
            "perReplica": 8,
            "profile": "h200",
        },
        "slo.ttft.targetMilliseconds": 6000,
    }
)


def on_nodes(group: str) -> dict[str, Any]:
    """An accelerator of 8 cards per replica on the nodes labelled g=`group`."""
    return {"resourceName": "g/pu", "perReplica": 8, "nodeSelector": {"g": group}}


TWO_PREFILL_POOLS = spec_of(
    {
        "prefill.pools": [
            {"name": "a", "accelerator": on_nodes("a")},
            {"name": "b", "accelerator": on_nodes("b"), "replicas": {"min": 0, "max": 10}},
        ],
        "decode.pools.0.accelerator": on_nodes("d"),
    }
)


def target_seconds(spec: PDDeploymentSpec, role: Role) -> float:
    return (spec.slo.ttft if role == "prefill" else spec.slo.itl).target_milliseconds / 1000


def signals(
    spec: PDDeploymentSpec,
    role: Role,
    now: float,
    *,
    ratio: float | None = None,
    tokens: float | None = None,
    queue: float = 0.0,
    running: float = 0.0,
    kv: float = 0.3,
    cached: float = 0.0,
) -> RoleSignals:
    """One role's signals: latency at `ratio` x target, `tokens`/s of work, 1000-token prompts,
    `cached` of the prompt tokens found in the prefix cache."""
    latency = NO_TRAFFIC if ratio is None else Reading.of(ratio * target_seconds(spec, role))
    work = NO_TRAFFIC if not tokens else Reading.of(tokens)
    common: dict[str, Any] = {
        "sample_time": now,
        "queue_depth": Reading.of(queue),
        "running_requests": Reading.of(running),
        "requests_per_second": Reading.of((tokens or 0) / 1000) if tokens else NO_TRAFFIC,
        "prompt_tokens_per_second": work,
    }
    if role == "prefill":
        found = Reading.of(cached * tokens) if tokens else NO_TRAFFIC
        return RoleSignals(ttft_seconds=latency, cached_prompt_tokens_per_second=found, **common)
    return RoleSignals(
        itl_seconds=latency,
        generation_tokens_per_second=work,
        kv_cache_usage=Reading.of(kv),
        **common,
    )


def observe(
    spec: PDDeploymentSpec,
    now: float,
    replicas: dict[tuple[Role, str], int | PoolObservation],
    capacity: FreeCapacity | None = None,
    **per_role: dict[str, Any],
) -> Observation:
    """Signals from `per_role` (kwargs of `signals`; a role left out is healthy and idle-ish),
    replicas as counts (all Ready) or PoolObservations."""
    pools = {
        key: value if isinstance(value, PoolObservation) else PoolObservation(value, value)
        for key, value in replicas.items()
    }
    healthy = {"ratio": 0.6, "tokens": 300.0}
    return Observation(
        {role: signals(spec, role, now, **per_role.get(role, healthy)) for role in ROLES},
        pools,
        capacity,
    )


def calibrated(
    spec: PDDeploymentSpec, per_replica: dict[Role, float], since: float | None = None
) -> PolicyState:
    """A state whose capacity estimates are calibrated (as after running near the SLO)."""
    pools = {
        f"{role}/{pool.name}": PoolMemory(capacity_per_replica=per_replica[role], since=since)
        for role in ROLES
        for pool in spec.pools(role)
    }
    return PolicyState(pools, {role: RoleMemory(capacity_basis="observed") for role in ROLES})


def replicas(decision: Decision | None, role: Role = "prefill", pool: str = "p") -> int:
    assert decision is not None
    return decision.replicas[(role, pool)]


def limit(decision: Decision | None, role: Role = "prefill", pool: str = "p") -> str:
    assert decision is not None
    return next(d.limited_by for d in decision.pools if (d.role, d.pool) == (role, pool))


def gpu_nodes(**groups: int) -> FreeCapacity:
    """A ledger of 8-card nodes: `a=2` is two free nodes labelled g=a."""
    nodes = [
        NodeSummary(f"{group}{i}", {"g": group}, (), {"g/pu": "8"}, ready=True)
        for group, count in groups.items()
        for i in range(count)
    ]
    return free_capacity(nodes, [])


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


@pytest.mark.parametrize(
    ("spec", "mean_ratio", "grows"),
    [
        # A P99 TTFT at twice the target while the mean is a fifth of it: a few prompts too
        # long for the target set the tail; replicas would not move it.
        (P99, 0.2, False),
        # The mean near the target too: the load is what is slow.
        (P99, 0.8, True),
        # A P50 target is the bulk of requests, never a tail.
        (SPEC, 0.2, True),
    ],
)
def test_a_tail_percentile_set_by_a_few_long_requests_adds_no_replicas(spec, mean_ratio, grows):
    observation = observe(
        spec, T0, {("prefill", "p"): 2, ("decode", "d"): 2},
        prefill={"ratio": 2.0, "tokens": 2000.0},
    )  # fmt: skip
    prefill = replace(
        observation.signals["prefill"],
        mean_latency_seconds=Reading.of(mean_ratio * target_seconds(spec, "prefill")),
    )
    observation = replace(observation, signals={**observation.signals, "prefill": prefill})
    decision = decide(spec, observation, PolicyState(), T0)
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
    per_replica = seed_capacity(PROFILED, "prefill", PROFILED.prefill.pools[0], 1000)
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


# ---------------------------------------------------------------- profile seeds and learning


def test_varied_prompt_lengths_cost_more_prefill_than_prompts_of_the_mean_length():
    pool, decode_pool = PROFILED.prefill.pools[0], PROFILED.decode.pools[0]
    fixed = seed_capacity(PROFILED, "prefill", pool, 16000)
    varied = seed_capacity(PROFILED, "prefill", pool, 16000, prompt_length_cv2=PROMPT_LENGTH_CV2)
    assert fixed is not None and varied is not None
    assert varied < 0.9 * fixed  # attention costs the square of each prompt's length
    short = seed_capacity(PROFILED, "prefill", pool, 500, prompt_length_cv2=PROMPT_LENGTH_CV2)
    assert short == pytest.approx(seed_capacity(PROFILED, "prefill", pool, 500), rel=0.05)
    assert seed_capacity(
        PROFILED, "decode", decode_pool, 4000, prompt_length_cv2=PROMPT_LENGTH_CV2
    ) == seed_capacity(PROFILED, "decode", decode_pool, 4000)


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
    assert seed_capacity(PROFILED, "prefill", pool, prompt, cached_share=cached_share) == (
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
            PROFILED, "prefill", pool, 1000, prompt_length_cv2=PROMPT_LENGTH_CV2,
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


def profiled_capacity(decision: Decision | None, role: Role) -> float:
    assert decision is not None
    pool = next(d for d in decision.pools if d.role == role)
    assert pool.capacity_per_replica is not None
    return pool.capacity_per_replica


def kv_share(running: float, context: int) -> float:
    """The KV cache share `running` sequences of `context` tokens hold in one of PROFILED's
    decode replicas: what its engine reports (the mean over replicas, per replica)."""
    pool = PROFILED.pools("decode")[0]
    hardware = HARDWARE_PROFILES[pool.accelerator.profile or ""]
    model = model_profile_for(PROFILED.model.name)
    assert model is not None
    return running * context / kv_capacity_tokens(hardware, model, pool.accelerator.per_replica)


def seed(role: Role, prompt: int) -> float:
    pool = PROFILED.pools(role)[0]
    value = seed_capacity(PROFILED, role, pool, prompt, prompt_length_cv2=PROMPT_LENGTH_CV2)
    assert value is not None
    return value


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


# ---------------------------------------------------------------- scale-down and hysteresis


def run(
    spec: PDDeploymentSpec,
    state: PolicyState,
    start: dict[tuple[Role, str], int],
    steps: int,
    *,
    now: float = T0,
    **per_role: dict[str, Any],
) -> list[Decision]:
    """Decide every INTERVAL from `now` with fixed signals, applying each decision (pods Ready
    at once)."""
    current, decisions = dict(start), []
    for _ in range(steps):
        decision = decide(spec, observe(spec, now, dict(current), **per_role), state, now)
        assert decision is not None
        decisions.append(decision)
        current.update(decision.replicas)
        state, now = decision.state, now + INTERVAL
    return decisions


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


LONG_WINDOW_ONLY = spec_of(
    {
        "scaling.scaleDown": {
            "stabilizationSeconds": 300,
            "maxStepReplicas": 1,
            "steadyStabilizationSeconds": 300,
        }
    }
)


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


def test_scale_down_removes_from_the_least_preferred_pool_first():
    state = calibrated(TWO_PREFILL_POOLS, {"prefill": 1000.0, "decode": 500.0})
    decisions = run(
        TWO_PREFILL_POOLS,
        state,
        {("prefill", "a"): 3, ("prefill", "b"): 2, ("decode", "d"): 1},
        14,
        prefill={"ratio": 0.3, "tokens": 1000.0},
    )
    last = decisions[-1].replicas
    assert (last[("prefill", "a")], last[("prefill", "b")]) == (2, 0)
    first_moves = [d.replicas[("prefill", "b")] for d in decisions[10:12]]
    assert first_moves == [1, 0]


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


# ---------------------------------------------------------------- rate limits and bounds


def test_scale_up_moves_at_most_max_step_replicas():
    spec = spec_of({"scaling": {"scaleUp": {"stabilizationSeconds": 0, "maxStepReplicas": 2}}})
    observation = observe(
        spec,
        T0,
        {("prefill", "p"): 1, ("decode", "d"): 1},
        prefill={"ratio": 3.0, "tokens": 5000.0},
    )
    decision = decide(spec, observation, calibrated(spec, {"prefill": 1000.0, "decode": 500.0}), T0)
    assert replicas(decision) == 3
    assert limit(decision) == "rate"


def test_by_default_a_pool_may_double_in_one_step_as_the_hpa_allows():
    # A load stepped up: 12 prefill replicas, the demand of 30. Four at a time held the role
    # in breach for minutes; by default a pool may double per decision.
    wide = {"prefill.pools.0.replicas.max": 64, "decode.pools.0.replicas.max": 64}
    spec = spec_of(wide)
    state = calibrated(spec, {"prefill": 1000.0, "decode": 500.0})
    observation = observe(
        spec, T0, {("prefill", "p"): 12, ("decode", "d"): 12},
        prefill={"ratio": 3.0, "tokens": 30 * 800.0},
    )  # fmt: skip
    assert spec.scaling.scale_up.max_step_percent == 100
    assert replicas(decide(spec, observation, state, T0)) == 24
    # A spec that names its own step keeps it (no percent unless it says one).
    named = spec_of(
        {**wide, "scaling": {"scaleUp": {"stabilizationSeconds": 0, "maxStepReplicas": 4}}}
    )
    assert named.scaling.scale_up.max_step_percent is None
    assert replicas(decide(named, observation, state, T0)) == 16


def test_scale_up_stabilization_ignores_a_single_spike():
    spec = spec_of({"scaling": {"scaleUp": {"stabilizationSeconds": 60, "maxStepReplicas": 4}}})
    state = calibrated(spec, {"prefill": 1000.0, "decode": 500.0})
    calm = {"ratio": 0.7, "tokens": 1000.0}
    spike = {"ratio": 2.0, "tokens": 3000.0}
    sizes, now, current = [], T0, 2
    for load in (calm, spike, calm, spike, spike, spike):
        observation = observe(
            spec, now, {("prefill", "p"): current, ("decode", "d"): 1}, prefill=load
        )
        decision = decide(spec, observation, state, now)
        assert decision is not None
        current, state, now = replicas(decision), decision.state, now + INTERVAL
        sizes.append(current)
    # A spike right after a calm recommendation is outvoted by it within the 60 s window.
    assert sizes[:4] == [2, 2, 2, 2]
    assert sizes[4] > 2


@pytest.mark.parametrize(
    ("bounds", "current", "expected"),
    [({"min": 1, "max": 4}, 6, 4), ({"min": 3, "max": 10}, 1, 3), ({"min": 2, "max": 2}, 2, 2)],
)
def test_min_and_max_are_always_honoured(bounds, current, expected):
    spec = spec_of({"prefill.pools.0.replicas": bounds})
    for load in ({"ratio": 3.0, "tokens": 9000.0}, {"ratio": 0.2, "tokens": 10.0}):
        observation = observe(
            spec, T0, {("prefill", "p"): current, ("decode", "d"): 1}, prefill=load
        )
        decision = decide(spec, observation, PolicyState(), T0)
        assert replicas(decision) == expected


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
    expected = seed_load_seconds(PROFILED, PROFILED.prefill.pools[0])
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


# ---------------------------------------------------------------- capacity


def test_no_replica_is_asked_for_that_no_node_can_hold():
    ledger = gpu_nodes(a=2, d=1)  # two prefill nodes free, pool a already runs 2 elsewhere
    observation = observe(
        TWO_PREFILL_POOLS,
        T0,
        {("prefill", "a"): 2, ("prefill", "b"): 0, ("decode", "d"): 1},
        ledger,
        prefill={"ratio": 3.0, "tokens": 8000.0},
    )
    state = calibrated(TWO_PREFILL_POOLS, {"prefill": 1000.0, "decode": 500.0})
    decision = decide(TWO_PREFILL_POOLS, observation, state, T0)
    assert replicas(decision, "prefill", "a") == 4
    assert replicas(decision, "prefill", "b") == 0
    assert limit(decision, "prefill", "a") == "capacity"
    assert decision is not None and decision.limited_by == "capacity"


def test_when_the_preferred_pool_is_full_the_rest_spills_to_the_next():
    ledger = gpu_nodes(a=1, b=3, d=1)
    observation = observe(
        TWO_PREFILL_POOLS,
        T0,
        {("prefill", "a"): 2, ("prefill", "b"): 0, ("decode", "d"): 1},
        ledger,
        prefill={"ratio": 1.5, "tokens": 4000.0},
    )
    state = calibrated(TWO_PREFILL_POOLS, {"prefill": 1000.0, "decode": 500.0})
    decision = decide(TWO_PREFILL_POOLS, observation, state, T0)
    assert replicas(decision, "prefill", "a") == 3
    assert replicas(decision, "prefill", "b") == 2  # 5 x 1000 at 80% = 4000


def test_unschedulable_pods_are_given_up_when_the_nodes_have_no_room():
    pending = PoolObservation(4, ready=2, unschedulable=2)
    observation = observe(
        TWO_PREFILL_POOLS,
        T0,
        {("prefill", "a"): pending, ("prefill", "b"): 0, ("decode", "d"): 1},
        gpu_nodes(b=2, d=1),
        prefill={"ratio": 1.0, "tokens": 3200.0},
    )
    state = calibrated(TWO_PREFILL_POOLS, {"prefill": 1000.0, "decode": 500.0})
    decision = decide(TWO_PREFILL_POOLS, observation, state, T0)
    assert replicas(decision, "prefill", "a") == 2
    assert replicas(decision, "prefill", "b") == 2


def test_with_no_node_view_unschedulable_pods_stay_but_none_are_added():
    pending = PoolObservation(4, ready=2, unschedulable=2)
    observation = observe(
        TWO_PREFILL_POOLS,
        T0,
        {("prefill", "a"): pending, ("prefill", "b"): 0, ("decode", "d"): 1},
        prefill={"ratio": 1.0, "tokens": 3200.0},
    )
    state = calibrated(TWO_PREFILL_POOLS, {"prefill": 1000.0, "decode": 500.0})
    decision = decide(TWO_PREFILL_POOLS, observation, state, T0)
    assert replicas(decision, "prefill", "a") == 4  # a cluster autoscaler may be adding nodes
    assert replicas(decision, "prefill", "b") == 2


def test_with_no_node_view_unschedulable_pods_go_after_a_whole_scale_down_window():
    """They count as no capacity: once a whole scale-down window has been watched, they are
    removed at the down-step, and the demand they were for stays on the pool with room."""
    pending = PoolObservation(4, ready=2, unschedulable=2)
    observation = observe(
        TWO_PREFILL_POOLS,
        T0,
        {("prefill", "a"): pending, ("prefill", "b"): 2, ("decode", "d"): 1},
        prefill={"ratio": 1.0, "tokens": 3200.0},
    )
    state = calibrated(TWO_PREFILL_POOLS, {"prefill": 1000.0, "decode": 500.0}, since=T0 - 3600)
    decision = decide(TWO_PREFILL_POOLS, observation, state, T0)
    assert replicas(decision, "prefill", "a") == 3  # one down-step
    assert replicas(decision, "prefill", "b") >= 2


def test_room_reserved_for_pods_not_yet_bound_is_not_promised_again():
    starting = PoolObservation(3, ready=2, scheduled=2)  # the third is not bound yet
    observation = observe(
        TWO_PREFILL_POOLS,
        T0,
        {("prefill", "a"): starting, ("prefill", "b"): 0, ("decode", "d"): 1},
        gpu_nodes(a=1, d=1),
        prefill={"ratio": 2.0, "tokens": 4000.0},
    )
    state = calibrated(TWO_PREFILL_POOLS, {"prefill": 1000.0, "decode": 500.0})
    decision = decide(TWO_PREFILL_POOLS, observation, state, T0)
    assert replicas(decision, "prefill", "a") == 3


def test_prefill_does_not_grow_into_a_decode_pool_that_is_full():
    observation = observe(
        TWO_PREFILL_POOLS,
        T0,
        {("prefill", "a"): 2, ("prefill", "b"): 0, ("decode", "d"): 2},
        gpu_nodes(a=4, b=4),  # no decode node free
        prefill={"ratio": 2.0, "tokens": 4000.0},
        decode={"ratio": 1.5, "tokens": 1500.0},
    )
    state = calibrated(TWO_PREFILL_POOLS, {"prefill": 1000.0, "decode": 500.0})
    decision = decide(TWO_PREFILL_POOLS, observation, state, T0)
    assert decision is not None
    assert decision.role_replicas("decode") == 2
    assert decision.role_replicas("prefill") == 2
    assert limit(decision, "prefill", "a") == "capacity"
    assert "decode cannot grow" in next(d.reason for d in decision.pools if d.pool == "a")


def test_shared_nodes_go_to_decode_first_and_are_never_promised_twice():
    spec = spec_of(
        {
            "prefill.pools.0.accelerator": on_nodes("x"),
            "decode.pools.0.accelerator": on_nodes("x"),
        }
    )
    observation = observe(
        spec,
        T0,
        {("prefill", "p"): 1, ("decode", "d"): 1},
        gpu_nodes(x=3),
        prefill={"ratio": 2.0, "tokens": 4000.0},
        decode={"ratio": 2.0, "tokens": 2000.0},
    )
    decision = decide(spec, observation, calibrated(spec, {"prefill": 1000.0, "decode": 500.0}), T0)
    assert decision is not None
    assert decision.role_replicas("decode") + decision.role_replicas("prefill") == 2 + 3
    assert decision.role_replicas("decode") == 4


# ---------------------------------------------------------------- ratio guardrail


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


# ---------------------------------------------------------------- modes and state


def test_disabled_decides_nothing_and_advisory_decides_like_active():
    observation = observe(
        SPEC,
        T0,
        {("prefill", "p"): 2, ("decode", "d"): 2},
        prefill={"ratio": 2.0, "tokens": 3000.0},
    )
    assert (
        decide(spec_of({"scaling": {"mode": "Disabled"}}), observation, PolicyState(), T0) is None
    )
    advisory = decide(spec_of({"scaling": {"mode": "Advisory"}}), observation, PolicyState(), T0)
    active = decide(SPEC, observation, PolicyState(), T0)
    assert advisory is not None and active is not None
    assert advisory.replicas == active.replicas
    assert advisory.state == active.state


def test_an_advisory_decision_that_is_not_applied_teaches_no_load_time():
    spec = spec_of({"scaling": {"mode": "Advisory"}})
    state, now = calibrated(spec, {"prefill": 1000.0, "decode": 500.0}), T0
    for load in ({"ratio": 2.0, "tokens": 3000.0}, {"ratio": 0.5, "tokens": 800.0}):
        observation = observe(spec, now, {("prefill", "p"): 2, ("decode", "d"): 1}, prefill=load)
        decision = decide(spec, observation, state, now)
        assert decision is not None
        state, now = decision.state, now + INTERVAL
    assert state.pool("prefill", "p").load_seconds is None
    assert state.pool("prefill", "p").ready_by is None


def test_the_state_survives_a_json_round_trip():
    decisions = run(
        PROFILED,
        PolicyState(),
        {("prefill", "p"): 1, ("decode", "d"): 1},
        5,
        prefill={"ratio": 1.5, "tokens": 20000.0},
    )
    state = decisions[-1].state
    restored = PolicyState.from_dict(json.loads(json.dumps(state.to_dict())))
    assert restored == state
    observation = observe(PROFILED, T0 + 600, {("prefill", "p"): 3, ("decode", "d"): 1})
    assert decide(PROFILED, observation, restored, T0 + 600) == decide(
        PROFILED, observation, state, T0 + 600
    )
    with pytest.raises(ValueError, match="unreadable"):
        PolicyState.from_dict({"pools": {"prefill/p": {"since": "yesterday"}}})


def test_every_field_of_the_state_is_plain_json():
    full = PolicyState(
        pools={
            "prefill/p": PoolMemory(
                recommendations=((T0, T0 + 30, 3),),
                since=T0,
                capacity_per_replica=1234.5,
                load_seconds=80.0,
                scaled_up_at=T0,
                scaled_up_to=4,
                ready_by=T0 + 80,
                ready_runs=((T0, 2), (T0 + 30, 3)),
                shed_at=T0 - 60,
                shed_wait=420.0,
            )
        },
        roles={
            "prefill": RoleMemory(
                capacity_basis="observed",
                capacity_factor=0.62,
                latency_ratio_at_scale_up=1.4,
                demand_at_scale_up=5e4,
                ready_at_scale_up=3,
                futile_ratio=1.3,
                no_traffic_since=T0,
                unavailable_since=T0,
                stuck_since=T0,
                running_mean=24.0,
                running_change_square_mean=700.0,
                running_last=20.0,
                kv_tokens_mean=2.9e5,
                kv_sequences_mean=100.0,
                recent=((T0, 5e4, 0.4), (T0 + 30, None, None)),
            )
        },
    )
    data = full.to_dict()
    assert json.loads(json.dumps(data, allow_nan=False)) == data  # lists, not tuples; no NaN
    assert PolicyState.from_dict(data) == full
    assert PolicyState.from_dict({**data, "future": 1}) == full
    for bad in ({"ready_runs": [[T0, -1]]}, {"ready_runs": [[T0, 2.5]]}, {"scaled_up_to": True}):
        with pytest.raises(ValueError, match="unreadable"):
            PolicyState.from_dict({"pools": {"prefill/p": bad}})
    with pytest.raises(ValueError, match="unreadable"):
        PolicyState.from_dict({"roles": {"prefill": {"ready_at_scale_up": "3"}}})
    with pytest.raises(ValueError, match="unreadable"):
        PolicyState.from_dict({"roles": {"prefill": {"recent": [[T0, "lots", 0.4]]}}})


def test_decide_does_not_touch_its_inputs():
    state = calibrated(SPEC, {"prefill": 1000.0, "decode": 500.0})
    observation = observe(
        SPEC,
        T0,
        {("prefill", "p"): 2, ("decode", "d"): 2},
        prefill={"ratio": 2.0, "tokens": 3000.0},
    )
    before = (copy.deepcopy(state), copy.deepcopy(observation))
    decide(SPEC, observation, state, T0)
    assert (state, observation) == before


# ---------------------------------------------------------------- properties, with a plant


def plant_latency_ratio(utilisation: float) -> float:
    """Latency / target of replicas running at `utilisation` of their SLO capacity: a base
    latency, a queueing rise, 1.0 at full SLO capacity, saturating at 130%."""
    return 0.3 / (1 - 0.7 * min(utilisation, 1.3))


@dataclass
class Plant:
    """Replicas with a fixed SLO capacity, an offered load (constant, or in waves of
    `wave_share` around it with period `wave_seconds`), and a load time."""

    spec: PDDeploymentSpec
    capacity: dict[Role, float]
    load: dict[Role, float]
    load_seconds: float = 90.0
    pods: dict[tuple[Role, str], list[float]] = field(default_factory=dict)  # ready times
    wave_share: float = 0.0
    wave_seconds: float = 600.0

    def observation(self, now: float) -> Observation:
        signals_by_role = {}
        wave = 1 + self.wave_share * math.sin(2 * math.pi * (now - T0) / self.wave_seconds)
        for role in ROLES:
            key = (role, self.spec.pools(role)[0].name)
            ready = sum(1 for t in self.pods[key] if t <= now)
            offered = self.load[role] * wave
            utilisation = offered / max(ready, 1e-9) / self.capacity[role]
            served = min(offered, ready * self.capacity[role] * 1.3)
            signals_by_role[role] = signals(
                self.spec,
                role,
                now,
                ratio=plant_latency_ratio(utilisation) if ready else 50.0,
                tokens=served,
                kv=min(1.0, 0.5 * min(utilisation, 1.3)),
                queue=max(0.0, (utilisation - 1) * 10),
            )
        pools = {
            key: PoolObservation(len(times), sum(1 for t in times if t <= now))
            for key, times in self.pods.items()
        }
        return Observation(signals_by_role, pools)

    def apply(self, decision: Decision, now: float) -> None:
        for key, count in decision.replicas.items():
            times = self.pods[key]
            times.extend([now + self.load_seconds] * max(0, count - len(times)))
            del times[count:]  # the newest go first


def simulate(plant: Plant, start: int, steps: int, state: PolicyState) -> list[tuple[int, int]]:
    for role in ROLES:
        plant.pods[(role, plant.spec.pools(role)[0].name)] = [0.0] * start
    now, sizes = T0, []
    for _ in range(steps):
        decision = decide(plant.spec, plant.observation(now), state, now)
        assert decision is not None
        plant.apply(decision, now)
        sizes.append((decision.role_replicas("prefill"), decision.role_replicas("decode")))
        state, now = decision.state, now + INTERVAL
    return sizes


def reversals(sizes: list[int]) -> int:
    moves = [b - a for a, b in itertools.pairwise(sizes) if b != a]
    return sum(1 for a, b in itertools.pairwise(moves) if (a > 0) != (b > 0))


@settings(max_examples=40, deadline=None)
@given(
    load=st.floats(50.0, 9000.0),
    capacity=st.floats(400.0, 3000.0),
    start=st.integers(1, 6),
    error=st.one_of(st.none(), st.floats(0.8, 1.25)),
)
# Found in session 9: the probe one replica down breached by 11% with no prompt waiting, which
# taught nothing (a burst, the rule said), so the probe came back every window.
@example(load=1848.0, capacity=885.0, start=3, error=None)
# Found on 2026-12-01 (a rare draw, so CI passed by chance): prefill grew 2 -> 5 -> 8 at the
# queueing share of the size it had, where 7 held at their own, and shed the 8th a window later.
@example(load=4128.0, capacity=916.0, start=2, error=0.8046875)
# The same draw's neighbour: 5 Ready replicas well under the target showed the estimate low,
# but the window in which they became Ready taught nothing, so growth sized on it added an 8th.
@example(load=3975.0, capacity=861.0, start=2, error=0.8125)
def test_constant_load_settles_without_oscillation(load, capacity, start, error):
    """With a capacity estimate within 25% of the truth: no reversal at all. With none (no
    profile): at most one, the probe that finds the capacity, and then a steady size."""
    plant = Plant(
        SPEC, {"prefill": capacity, "decode": capacity / 2}, {"prefill": load, "decode": load / 2}
    )
    state = PolicyState()
    if error is not None:
        state = calibrated(SPEC, {"prefill": capacity * error, "decode": capacity * error / 2})
    sizes = simulate(plant, start, 150, state)
    for index in range(2):
        series = [size[index] for size in sizes]
        assert reversals(series) <= (0 if error is not None else 1), series
        assert len(set(series[-40:])) == 1, series


def shed_grow_shed(sizes: list[int], within_steps: int) -> bool:
    """A shed, a grow and a shed again, the first and last within `within_steps` decisions."""
    moves = [(i, b - a) for i, (a, b) in enumerate(itertools.pairwise(sizes)) if b != a]
    return any(
        first[1] < 0 < middle[1] and last[1] < 0 and last[0] - first[0] <= within_steps
        for first, middle, last in zip(moves, moves[1:], moves[2:], strict=False)
    )


@settings(max_examples=40, deadline=None)
@given(
    load=st.floats(500.0, 6000.0),
    capacity=st.floats(400.0, 2000.0),
    wave_share=st.floats(0.05, 0.3),
    wave_seconds=st.floats(120.0, 1200.0),
    load_seconds=st.floats(30.0, 300.0),
)
def test_a_stationary_load_in_waves_is_never_shed_grown_and_shed_within_three_load_times(
    load, capacity, wave_share, wave_seconds, load_seconds
):
    """A wrong shed costs a load time of breach: under a load that only waves around a level,
    no role sheds a replica, grows it back and sheds again within three load times (the
    issue's chat load flapped 1-2-1 through the 60 s window)."""
    plant = Plant(
        SPEC,
        {"prefill": capacity, "decode": capacity / 2},
        {"prefill": load, "decode": load / 2},
        load_seconds=load_seconds,
        wave_share=wave_share,
        wave_seconds=wave_seconds,
    )
    state = calibrated(SPEC, {"prefill": capacity, "decode": capacity / 2})
    sizes = simulate(plant, 1, 200, state)
    within = math.ceil(3 * load_seconds / INTERVAL)
    for index in range(2):
        series = [size[index] for size in sizes]
        assert not shed_grow_shed(series[20:], within), series


role_reading = st.sampled_from(
    [Reading.of(0.0), Reading.of(0.5), Reading.of(30.0), NO_TRAFFIC, unavailable("x")]
)


@st.composite
def random_signals(draw: st.DrawFn, now: float) -> RoleSignals:
    return RoleSignals(
        sample_time=now - draw(st.sampled_from([0.0, 10.0, 1000.0])),
        ttft_seconds=draw(role_reading),
        itl_seconds=draw(role_reading),
        queue_depth=draw(role_reading),
        running_requests=draw(role_reading),
        kv_cache_usage=draw(st.sampled_from([Reading.of(0.2), Reading.of(1.0), NO_TRAFFIC])),
        requests_per_second=draw(role_reading),
        prompt_tokens_per_second=draw(st.sampled_from([Reading.of(100.0), Reading.of(9e4)])),
        generation_tokens_per_second=draw(st.sampled_from([Reading.of(50.0), NO_TRAFFIC])),
    )


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), low=st.integers(0, 5), span=st.integers(1, 6), ratio=st.booleans())
def test_bounds_always_hold(data, low, span, ratio):
    changes: dict[str, Any] = {
        "prefill.pools": [
            {
                "name": "a",
                "accelerator": {"resourceName": "g/pu"},
                "replicas": {"min": low, "max": low + span},
            },
            {
                "name": "b",
                "accelerator": {"resourceName": "g/pu"},
                "replicas": {"min": 0, "max": 1 + span},
            },
        ],
    }
    if ratio:
        changes["scaling"] = {"prefillToDecodeRatio": {"minPercent": 50, "maxPercent": 150}}
    spec = spec_of(changes)
    state, now = PolicyState(), T0
    for _ in range(3):
        current = {
            (role, pool.name): data.draw(st.integers(0, 12))
            for role in ROLES
            for pool in spec.pools(role)
        }
        observation = Observation(
            {role: data.draw(random_signals(now)) for role in ROLES},
            {key: PoolObservation(n, data.draw(st.integers(0, n))) for key, n in current.items()},
            data.draw(st.sampled_from([None, gpu_nodes(), gpu_nodes(x=1)])),
        )
        decision = decide(spec, observation, state, now)
        assert decision is not None
        for role in ROLES:
            for pool in spec.pools(role):
                value = decision.replicas[(role, pool.name)]
                assert pool.replicas.min <= value <= pool.replicas.max
        state, now = decision.state, now + INTERVAL


@settings(max_examples=150, deadline=None)
@given(
    low=st.floats(0.05, 3.0),
    extra=st.floats(0.0, 3.0),
    current=st.integers(1, 8),
    estimate=st.sampled_from([None, 600.0, 1000.0, 1500.0]),
    basis=st.sampled_from(["observed", "lower-bound"]),
)
# More load moved the TTFT from the 0.75-1 s bucket to the 1-2.5 s bucket (too wide to say
# "near", but wholly past the target), with a third of a prompt waiting: no saturation, but
# a role with no estimate yet still takes its first one from it.
@example(low=1.0, extra=0.03125, current=1, estimate=None, basis="observed")
# A floor between one replica less and the current size once blocked the probe at low load.
@example(low=0.21875, extra=0.21875, current=2, estimate=600.0, basis="lower-bound")
def test_more_load_never_means_fewer_replicas(low, extra, current, estimate, basis):
    state = PolicyState()
    if estimate is not None:
        state = calibrated(SPEC, {"prefill": estimate, "decode": estimate / 2}, since=T0 - 3600)
        state = PolicyState(state.pools, {r: RoleMemory(capacity_basis=basis) for r in ROLES})
    plant = Plant(SPEC, {"prefill": 1000.0, "decode": 500.0}, {"prefill": 0.0, "decode": 0.0})
    plant.pods = {("prefill", "p"): [0.0] * current, ("decode", "d"): [0.0] * current}
    totals = []
    for utilisation in (low, low + extra):
        plant.load = {
            "prefill": utilisation * current * 1000.0,
            "decode": utilisation * current * 500.0,
        }
        decision = decide(SPEC, plant.observation(T0), state, T0)
        assert decision is not None
        totals.append((decision.role_replicas("prefill"), decision.role_replicas("decode")))
    assert totals[1][0] >= totals[0][0]
    assert totals[1][1] >= totals[0][1]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), which=st.sampled_from(["prefill", "decode", "both"]))
def test_unavailable_metrics_never_lower_replicas(data, which):
    now = T0
    current = {
        ("prefill", "p"): data.draw(st.integers(1, 10)),
        ("decode", "d"): data.draw(st.integers(1, 10)),
    }
    signal_map = {role: data.draw(random_signals(now)) for role in ROLES}
    for role in ROLES if which == "both" else (which,):
        signal_map[role] = RoleSignals(now, unavailable("down"), unavailable("down"))
    history = data.draw(
        st.sampled_from(
            [PolicyState(), calibrated(SPEC, {"prefill": 9e9, "decode": 9e9}, T0 - 9e3)]
        )
    )
    observation = Observation(signal_map, {k: PoolObservation(n, n) for k, n in current.items()})
    decision = decide(SPEC, observation, history, now)
    assert decision is not None
    for role in ROLES if which == "both" else (which,):
        key = (role, "p" if role == "prefill" else "d")
        assert decision.replicas[key] >= current[key]


@settings(max_examples=150, deadline=None)
@given(
    free=st.lists(st.integers(0, 8), min_size=1, max_size=6),
    group=st.lists(st.sampled_from("ab"), min_size=6, max_size=6),
    per=st.tuples(st.sampled_from([1, 2, 4, 8]), st.sampled_from([1, 2, 4, 8])),
    shared_decode=st.booleans(),
    breach=st.floats(1.2, 5.0),
)
def test_growth_never_exceeds_free_capacity(free, group, per, shared_decode, breach):
    spec = spec_of(
        {
            "prefill.pools": [
                {
                    "name": "a",
                    "replicas": {"min": 0, "max": 20},
                    "accelerator": {
                        "resourceName": "g/pu",
                        "perReplica": per[0],
                        "nodeSelector": {"g": "a"},
                    },
                },
                {
                    "name": "b",
                    "replicas": {"min": 0, "max": 20},
                    "accelerator": {
                        "resourceName": "g/pu",
                        "perReplica": per[1],
                        "nodeSelector": {"g": "b"},
                    },
                },
            ],
            "decode.pools.0": {
                "name": "d",
                "replicas": {"min": 0, "max": 20},
                "accelerator": {
                    "resourceName": "g/pu",
                    "perReplica": per[0],
                    "nodeSelector": {"g": "a" if shared_decode else "c"},
                },
            },
        }
    )
    nodes = [
        NodeSummary(f"n{i}", {"g": group[i]}, (), {"g/pu": str(cards)}, ready=True)
        for i, cards in enumerate(free)
    ]
    current = {("prefill", "a"): 1, ("prefill", "b"): 1, ("decode", "d"): 1}
    observation = observe(
        spec,
        T0,
        dict(current),
        free_capacity(nodes, []),
        prefill={"ratio": breach, "tokens": 4000.0},
        decode={"ratio": breach, "tokens": 2000.0},
    )
    decision = decide(spec, observation, calibrated(spec, {"prefill": 500.0, "decode": 250.0}), T0)
    assert decision is not None
    pools = {("prefill", "a"): per[0], ("prefill", "b"): per[1], ("decode", "d"): per[0]}
    labels = {
        ("prefill", "a"): "a",
        ("prefill", "b"): "b",
        ("decode", "d"): "a" if shared_decode else "c",
    }
    for label in "abc":
        on_group = [key for key in pools if labels[key] == label]
        added_cards = sum(
            max(0, decision.replicas[key] - current[key]) * pools[key] for key in on_group
        )
        free_cards = sum(c for c, g in zip(free, group, strict=False) if g == label)
        assert added_cards <= free_cards
        for key in on_group:
            fits = sum(c // pools[key] for c, g in zip(free, group, strict=False) if g == label)
            assert decision.replicas[key] - current[key] <= fits


# ---------------------------------------------------------------- schedules

OFFICE_HOURS = spec_of(
    {
        "scaling.schedules": [
            {
                "name": "office",
                "timeZone": "Asia/Shanghai",
                "days": ["Mon", "Tue", "Wed", "Thu", "Fri"],
                "start": "09:00",
                "end": "18:00",
                "prefill": {"p": 4},
            }
        ]
    }
)
MONDAY_9 = datetime.fromisoformat("2026-11-30T09:00:00+08:00").timestamp()
QUIET = {"ratio": 0.3, "tokens": 300.0}


def across(
    spec: PDDeploymentSpec, start: float, end: float, prefill: int, state: PolicyState
) -> list[Decision]:
    """Decide every INTERVAL from `start` to before `end` under a quiet load."""
    steps = math.ceil((end - start) / INTERVAL)
    initial = {("prefill", "p"): prefill, ("decode", "d"): 1}
    return run(spec, state, initial, steps, now=start, prefill=QUIET)


def test_a_schedule_holds_its_floor_from_one_model_load_before_it_opens_until_it_closes():
    # No profile: a replica is expected to take DEFAULT_LOAD_SECONDS (300 s) to load, so the
    # floor starts 330 s (one load and one interval) before 09:00.
    state = calibrated(OFFICE_HOURS, {"prefill": 1000.0, "decode": 500.0})
    before = across(OFFICE_HOURS, MONDAY_9 - 600, MONDAY_9 - 330, 1, state)
    assert {d.role_replicas("prefill") for d in before} == {1}
    opening = across(OFFICE_HOURS, MONDAY_9 - 330, MONDAY_9 - 300, 1, before[-1].state)[0]
    assert replicas(opening) == 4 and limit(opening) == "schedule"
    assert opening.limited_by == "schedule"
    assert "prefill: p 1->4 limited by schedule office" in opening.reason
    (pool,) = [d for d in opening.pools if d.role == "prefill"]
    assert "schedule office (09:00-18:00 Asia/Shanghai) keeps at least 4" in pool.reason
    # The quiet load would have 1 replica; the floor holds 4 all day.
    day = across(OFFICE_HOURS, MONDAY_9, MONDAY_9 + 9 * 3600, 4, opening.state)
    assert {d.role_replicas("prefill") for d in day} == {4}
    # At 18:00 the floor lifts and the pool sheds as after lowering replicas.min, under the
    # scale-down rules: this quiet load was steady all day, so the short window (60 s), one
    # step per decision...
    evening = across(OFFICE_HOURS, MONDAY_9 + 9 * 3600, MONDAY_9 + 9 * 3600 + 600, 4, day[-1].state)
    assert [d.role_replicas("prefill") for d in evening][:5] == [4, 3, 2, 1, 1]
    # ...and with the long window only, 300 s first.
    patient = OFFICE_HOURS.model_copy(
        update={
            "scaling": LONG_WINDOW_ONLY.scaling.model_copy(
                update={"schedules": OFFICE_HOURS.scaling.schedules}
            )
        }
    )
    day = across(patient, MONDAY_9 + 8 * 3600, MONDAY_9 + 9 * 3600, 4, day[-1].state)
    evening = across(patient, MONDAY_9 + 9 * 3600, MONDAY_9 + 9 * 3600 + 600, 4, day[-1].state)
    sizes = [d.role_replicas("prefill") for d in evening]
    assert sizes[:9] == [4] * 9 and sizes[9] == 3 and sizes[-1] == 1  # 300 s after 17:59:30


def test_a_floor_beyond_one_step_applies_at_once_and_is_said_once():
    # Like a raised min, a floor is a bound: the step limit (4 per decision) does not apply.
    spec = spec_of(
        {
            "scaling.schedules": [
                {"name": "launch", "start": "00:00", "end": "00:00", "prefill": {"p": 9}}
            ]
        }
    )
    state = calibrated(spec, {"prefill": 1000.0, "decode": 500.0})
    quiet = observe(spec, MONDAY_9, {("prefill", "p"): 1, ("decode", "d"): 1}, prefill=QUIET)
    decision = decide(spec, quiet, state, MONDAY_9)
    assert replicas(decision) == 9 and limit(decision) == "schedule"
    assert decision is not None
    (pool,) = [d for d in decision.pools if d.role == "prefill"]
    assert pool.reason.count("schedule launch") == 1


def test_a_schedule_is_a_floor_not_a_cap_and_applies_on_its_days_only():
    state = calibrated(OFFICE_HOURS, {"prefill": 1000.0, "decode": 500.0})
    busy = observe(
        OFFICE_HOURS,
        MONDAY_9 + 3600,
        {("prefill", "p"): 4, ("decode", "d"): 1},
        prefill={"ratio": 1.5, "tokens": 6000.0},
    )
    assert replicas(decide(OFFICE_HOURS, busy, state, MONDAY_9 + 3600)) > 4
    saturday = MONDAY_9 + 5 * 86400 + 3600
    quiet = observe(OFFICE_HOURS, saturday, {("prefill", "p"): 1, ("decode", "d"): 1})
    decision = decide(OFFICE_HOURS, quiet, state, saturday)
    assert replicas(decision) == 1 and limit(decision) != "schedule"


def test_a_schedule_warms_its_pools_even_while_the_metrics_are_unreadable():
    now, refused = MONDAY_9 - 60, unavailable("prometheus: connection refused")
    observation = Observation(
        {
            "prefill": RoleSignals(now, ttft_seconds=refused),
            "decode": RoleSignals(now, itl_seconds=refused),
        },
        {("prefill", "p"): PoolObservation(1, 1), ("decode", "d"): PoolObservation(1, 1)},
    )
    decision = decide(OFFICE_HOURS, observation, PolicyState(), now)
    assert replicas(decision) == 4 and limit(decision) == "schedule"
    assert replicas(decision, "decode", "d") == 1 and limit(decision, "decode", "d") == "metrics"


@pytest.mark.parametrize(
    ("load_seconds", "lead_seconds", "floored_from"),
    [
        (600.0, None, 630.0),  # the pool's measured load time, and one interval
        (600.0, 0, 0.0),  # leadSeconds 0: from the start exactly
        (600.0, 120, 120.0),
    ],
)
def test_the_floor_starts_one_measured_load_ahead_unless_lead_seconds_says(
    load_seconds, lead_seconds, floored_from
):
    schedule = dict(OFFICE_HOURS.scaling.schedules[0].model_dump(by_alias=True))
    schedule["leadSeconds"] = lead_seconds
    spec = spec_of({"scaling.schedules": [schedule]})
    state = calibrated(spec, {"prefill": 1000.0, "decode": 500.0})
    state = replace(
        state,
        pools={
            **state.pools,
            "prefill/p": replace(state.pool("prefill", "p"), load_seconds=load_seconds),
        },
    )

    def size(now: float) -> int:
        observation = observe(spec, now, {("prefill", "p"): 1, ("decode", "d"): 1}, prefill=QUIET)
        return replicas(decide(spec, observation, state, now))

    assert size(MONDAY_9 - floored_from) == 4
    assert size(MONDAY_9 - floored_from - 1) == 1


# ---------------------------------------------------------------- seasonal forecasts

SEASONAL = spec_of({"scaling.seasonal": {"period": "Day", "seasons": 2}})
# Without a profile a replica loads in DEFAULT_LOAD_SECONDS (300 s): the lead is 330 s.
LEAD = 330.0


def seasons_of(*peaks: tuple[float, float]) -> tuple[tuple[tuple[float, float], ...], ...]:
    """Seasons at 300 tokens/s that each rise to `peak` tokens/s `at` seconds from now."""
    return tuple(
        tuple((float(t), peak if t >= at else 300.0) for t in range(0, 901, 30))
        for peak, at in peaks
    )


def seasonal_decision(
    spec: PDDeploymentSpec,
    seasons: tuple[tuple[tuple[float, float], ...], ...],
    *,
    today: dict[str, Any] | None = None,
    state: PolicyState | None = None,
) -> Decision:
    now = T0
    observation = observe(
        spec,
        now,
        {**{("prefill", p.name): 1 for p in spec.prefill.pools}, ("decode", "d"): 1},
        prefill=today or {"ratio": 0.3, "tokens": 300.0},
    )
    with_seasons = replace(
        observation,
        signals={
            **observation.signals,
            "prefill": replace(observation.signals["prefill"], seasons=seasons),
        },
    )
    state = state or calibrated(spec, {"prefill": 1000.0, "decode": 500.0})
    decision = decide(spec, with_seasons, state, now)
    assert decision is not None
    return decision


def test_a_load_every_season_showed_starts_its_replicas_one_load_ahead():
    # Both past days rose to 3,000 tokens/s two minutes from now, within a load and an interval.
    decision = seasonal_decision(SEASONAL, seasons_of((3000, 120), (3200, 120)))
    # 3,000 tokens/s at 80% of 1,000 per replica: 4 replicas, where today's 300 needs 1.
    assert replicas(decision) == 4 and limit(decision) == "forecast"
    assert decision.limited_by == "forecast"
    assert "prefill: p 1->4 limited by forecast" in decision.reason
    (pool,) = [d for d in decision.pools if d.role == "prefill"]
    assert "seasonal forecast (the last 2 days at this time) keeps at least 4" in pool.reason
    assert replicas(decision, "decode", "d") == 1  # no decode history: decode as before


@pytest.mark.parametrize(
    "seasons",
    [
        seasons_of((3000, LEAD + 60), (3000, LEAD + 60)),  # after the lead: not yet
        seasons_of((3000, 120), (300, 120)),  # one day lacked it
        (),  # no history
    ],
)
def test_no_floor_for_a_load_not_due_within_the_lead_or_not_in_every_season(seasons):
    assert replicas(seasonal_decision(SEASONAL, seasons)) == 1


def test_without_seasonal_on_history_changes_nothing():
    assert replicas(seasonal_decision(SPEC, seasons_of((3000, 120), (3000, 120)))) == 1


def test_a_day_without_the_load_its_seasons_had_by_now_gets_no_floor():
    # The seasons already ran 3,000 tokens/s at this moment, and kept it up. Today has no
    # traffic (a holiday), or a tenth of it: the forecast is scaled to today's share.
    busy = tuple(tuple((float(t), 3000.0) for t in range(0, 901, 30)) for _ in range(2))
    holiday = seasonal_decision(SEASONAL, busy, today={"ratio": None, "tokens": None})
    assert replicas(holiday) == 1 and "forecast" not in holiday.reason
    tenth = seasonal_decision(SEASONAL, busy, today={"ratio": 0.3, "tokens": 300.0})
    assert replicas(tenth) == 1 and "forecast" not in tenth.reason
    # Where the seasons were as quiet as today at this moment, today tells nothing: the peak
    # they had two minutes later is expected whole.
    rising = seasonal_decision(SEASONAL, seasons_of((3000, 120), (3000, 120)))
    assert replicas(rising) == 4


def test_a_forecast_fills_the_pools_in_their_order_of_preference():
    spec = spec_of(
        {
            "prefill.pools": [
                {"name": "a", "accelerator": on_nodes("a"), "replicas": {"min": 1, "max": 2}},
                {"name": "b", "accelerator": on_nodes("b"), "replicas": {"min": 0, "max": 10}},
            ],
            "decode.pools.0.accelerator": on_nodes("d"),
            "scaling.seasonal": {"seasons": 2},
        }
    )
    decision = seasonal_decision(spec, seasons_of((3000, 120), (3000, 120)))
    assert replicas(decision, "prefill", "a") == 2  # its max, then the next pool
    assert replicas(decision, "prefill", "b") == 2
    assert limit(decision, "prefill", "b") == "forecast"
