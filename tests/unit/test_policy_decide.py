"""`decide` as a whole: its modes, its inputs left alone, and properties under a simple plant
model (no oscillation, bounds, monotone in load, unknown never lowers, within free
capacity)."""

import copy
import itertools
import math
from dataclasses import dataclass, field
from typing import Any

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from pd_operator.api.spec import PDDeploymentSpec, Role
from pd_operator.core.capacity import free_capacity
from pd_operator.core.observe import NodeSummary
from pd_operator.core.policy import Decision, Observation, PoolObservation, decide
from pd_operator.core.policy_state import PolicyState, RoleMemory
from pd_operator.core.signals import NO_TRAFFIC, Reading, RoleSignals, unavailable
from policycases import (
    INTERVAL,
    ROLES,
    SPEC,
    T0,
    calibrated,
    gpu_nodes,
    observe,
    plant_latency_ratio,
    signals,
    spec_of,
)


# ---------------------------------------------------------------- modes
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
# Sheds 450 s apart at a 141 s load time: not within three load times (423 s).
@example(load=500.0, capacity=400.0, wave_share=0.28125, wave_seconds=451.0, load_seconds=141.0)
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
    # Decisions within three load times of each other: 15 decisions (450 s) apart are not
    # within 3 x 141 s (ceil said they were; hypothesis found that boundary).
    within = math.floor(3 * load_seconds / INTERVAL)
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
