"""The PD engine simulator: conservation, service-time bounds, queueing laws, routing, scaling."""

import bisect
import itertools
import math
import statistics
import threading
from collections.abc import Iterable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pd_operator.core.hardware import GLM_45_FP8, H200_SXM, MTT_S5000
from pd_operator.core.perfmodel import DecodeCoefficients, PrefillCoefficients, decode_itl_ms
from pd_tools.enginesim.engine import (
    DEFAULT_LINK_BYTES_PER_SECOND,
    ROUTINGS,
    SGLANG_BUCKETS,
    PDEngine,
    ReplicaSpec,
    RequestRecord,
    Role,
    SimulationResult,
    State,
)
from pd_tools.enginesim.metrics import SGLANG, SGLANG_UNDERSCORE, EngineMetricsServer, SimPod
from pd_tools.workloads.traces import (
    ReplayOptions,
    Request,
    TokenLengths,
    constant_rate,
    read_mooncake,
    synthetic_requests,
)
from traces import real_trace

# Round fitted numbers so expected times are easy to read: a 1,000-token prompt takes 70 ms
# alone; a decode step of one 1,000-token sequence takes 10.6 ms.
PREFILL = PrefillCoefficients(a_ms=20.0, b_ms_per_token=0.05, c_ms_per_token2=0.0)
DECODE = DecodeCoefficients(a_ms=10.0, b_ms_per_context_token=0.0005, c_ms_per_sequence=0.1)
SPEC = ReplicaSpec(PREFILL, DECODE, kv_capacity_tokens=400_000, load_seconds=30.0)
MODEL = GLM_45_FP8
# The articles' pair from the performance model: S5000 prefill, H200 decode, 8 cards each.
S5000 = ReplicaSpec.from_profiles(MTT_S5000, GLM_45_FP8, 8)
H200 = ReplicaSpec.from_profiles(H200_SXM, GLM_45_FP8, 8)
TRANSFER_S_PER_TOKEN = 2 * 92 * 8 * 128 / DEFAULT_LINK_BYTES_PER_SECOND  # GLM-4.5 FP8 KV
EPS = 1e-9


def engine(
    requests: Iterable[Request],
    prefill: int = 1,
    decode: int = 1,
    spec: ReplicaSpec = SPEC,
    decode_spec: ReplicaSpec | None = None,
) -> PDEngine:
    sim = PDEngine(requests, model=MODEL)
    for index in range(prefill):
        sim.add_instance(f"p{index}", Role.PREFILL, spec, ready_after_s=0)
    for index in range(decode):
        sim.add_instance(f"d{index}", Role.DECODE, decode_spec or spec, ready_after_s=0)
    return sim


def poisson(rate_rps: float, duration_s: float, lengths: TokenLengths, seed: int = 0):
    return synthetic_requests(constant_rate(rate_rps, duration_s), lengths, seed=seed)


def served_by(result: SimulationResult, name: str) -> list[RequestRecord]:
    return [r for r in result.records if name in (r.prefill_instance, r.decode_instance)]


def median(values: Iterable[float]) -> float:
    return statistics.median(values)


# --- conservation -----------------------------------------------------------------------------

request_lists = st.lists(
    st.tuples(
        st.floats(0, 5),  # gap to the previous arrival (s)
        st.integers(1, 6000),  # prompt tokens
        st.integers(1, 300),  # output tokens
        st.floats(0, 1),  # cached share of the prompt
    ),
    min_size=1,
    max_size=60,
)


def to_requests(rows: list[tuple[float, int, int, float]]) -> list[Request]:
    arrivals = itertools.accumulate(gap for gap, *_ in rows)
    return [
        Request(t, tokens, output, math.floor(share * tokens))
        for t, (_, tokens, output, share) in zip(arrivals, rows, strict=True)
    ]


@settings(max_examples=60, deadline=None)
@given(
    rows=request_lists,
    prefill=st.integers(1, 3),
    decode=st.integers(1, 3),
    kv_capacity=st.sampled_from([6_400, 20_000, 400_000]),
    budget=st.sampled_from([512, 8192]),
    scale_at_s=st.floats(0, 60),
)
def test_every_request_finishes_exactly_once(
    rows, prefill, decode, kv_capacity, budget, scale_at_s
):
    requests = to_requests(rows)
    spec = ReplicaSpec(PREFILL, DECODE, kv_capacity, 30.0, max_batch_tokens=budget)
    sim = engine(requests, prefill, decode, spec)
    # Scale while requests are in flight: one instance of each role leaves, a new one comes.
    sim.advance_to(scale_at_s)
    sim.remove_instance("p0")
    sim.remove_instance("d0")
    sim.add_instance("p-new", Role.PREFILL, spec, ready_after_s=5)
    sim.add_instance("d-new", Role.DECODE, spec, ready_after_s=5)
    result = sim.run()

    assert result.unfinished == 0
    assert sorted(r.id for r in result.records) == list(range(len(requests)))
    instances = result.instances
    assert sum(i.prompt_tokens_total for i in instances) == sum(r.input_tokens for r in requests)
    assert sum(i.generation_tokens_total for i in instances) == sum(
        r.output_tokens for r in requests
    )
    assert sum(i.itl.count for i in instances) == sum(r.output_tokens - 1 for r in requests)
    assert result.token_itl_s.count == sum(r.output_tokens - 1 for r in requests)
    assert sum(i.ttft.count for i in instances) == len(requests)
    assert sum(i.e2e.count for i in instances) == len(requests)
    assert all(min(i.itl.counts) >= 0 for i in instances)
    for record in result.records:
        assert record.arrival_s <= record.prefill_start_s < record.prefill_end_s
        assert record.prefill_end_s <= record.first_token_s <= record.finish_s
    assert {i.state for i in instances if i.name in ("p0", "d0")} == {State.GONE}


# --- service-time bounds ----------------------------------------------------------------------


def test_latency_is_never_below_the_models_service_time():
    lengths = TokenLengths(3000, 150, input_cv=1.0, output_cv=1.0, cached_fraction=0.3)
    result = engine(poisson(8, 300, lengths, seed=1), prefill=2, decode=1).run()
    queued = 0
    for r in result.records:
        alone_s = PREFILL.batch_ms([r.input_tokens], [r.cached_tokens]) / 1000
        transfer_s = r.input_tokens * TRANSFER_S_PER_TOKEN if r.output_tokens > 1 else 0.0
        assert r.ttft_s >= alone_s + transfer_s - EPS
        decode_s = (r.output_tokens - 1) * DECODE.step_ms(1, r.input_tokens + 1) / 1000
        assert r.e2e_s - r.ttft_s >= decode_s - EPS
        queued += r.ttft_s > 1.5 * (alone_s + transfer_s)
    assert queued > len(result.records) / 10  # the bound was tested under real queueing


def step_by_step_finish_times(
    joins: list[tuple[float, int, int, int]], coefficients: DecodeCoefficients
) -> tuple[dict[int, float], list[float]]:
    """A decode instance one step at a time: finish times and every token's gap (a joiner's
    first gap starts with the step it joins: the wait for that step is time to first token)."""
    joins = sorted(joins)
    finish: dict[int, float] = {}
    gaps: list[float] = []
    running: list[list[float]] = []  # [id, context, tokens left, time of the last token]
    now, index = 0.0, 0
    while index < len(joins) or running:
        if not running:
            now = max(now, joins[index][0])
        while index < len(joins) and joins[index][0] <= now:
            _, request_id, prompt, output = joins[index]
            running.append([request_id, prompt + 1, output - 1, now])
            index += 1
        step_s = coefficients.step_ms(len(running), int(sum(r[1] for r in running))) / 1000
        now += step_s
        for r in running:
            gaps.append(now - r[3])
            r[1] += 1
            r[2] -= 1
            r[3] = now
        for r in [r for r in running if r[2] == 0]:
            finish[int(r[0])] = now
            running.remove(r)
    return finish, gaps


@pytest.mark.parametrize("decode_spec", [SPEC, H200], ids=["fitted", "moe-h200"])
def test_batched_decode_matches_a_step_by_step_simulation(decode_spec: ReplicaSpec):
    """Also for an MoE replica, whose step reads only the experts its batch touches: the step
    time changes with every join and finish."""
    lengths = TokenLengths(2000, 120, input_cv=1.0, output_cv=1.0)
    requests = [r for r in poisson(6, 120, lengths, seed=2) if r.output_tokens > 1]
    result = engine(requests, prefill=4, decode=1, decode_spec=decode_spec).run()
    joins = [(r.first_token_s, r.id, r.input_tokens, r.output_tokens) for r in result.records]
    finish, gaps = step_by_step_finish_times(joins, decode_spec.decode)
    for record in result.records:
        assert record.finish_s == pytest.approx(finish[record.id], abs=1e-6)
    # The instance's ITL histogram holds exactly the reference's per-token gaps.
    histogram = result.instances[-1].itl
    expected = [0] * (len(histogram.bounds) + 1)
    for gap in gaps:
        expected[bisect.bisect_left(histogram.bounds, gap)] += 1
    assert histogram.counts == expected
    assert histogram.sum == pytest.approx(sum(gaps), rel=1e-9)
    assert result.token_itl_s.quantile(0.5) == pytest.approx(median(gaps), rel=0.01)


def test_stepping_with_advance_to_matches_one_run():
    def requests():
        return poisson(5, 200, TokenLengths(2500, 200, 1.0, 1.0, 0.2), seed=3)

    whole = engine(requests(), prefill=2, decode=2).run()
    stepped = engine(requests(), prefill=2, decode=2)
    t = 0.0
    while stepped.active_requests or t < 200:
        t += 0.37
        stepped.advance_to(t)
    records = sorted(stepped.take_finished(), key=lambda r: r.id)
    assert len(records) == len(whole.records)
    for a, b in zip(sorted(whole.records, key=lambda r: r.id), records, strict=True):
        assert (a.prefill_instance, a.decode_instance) == (b.prefill_instance, b.decode_instance)
        assert a.finish_s == pytest.approx(b.finish_s, abs=1e-6)
    for a, b in zip(whole.instances, stepped.instances(), strict=True):
        assert a.itl.counts == b.itl.counts
        assert a.generation_tokens_total == b.generation_tokens_total


# --- queueing laws ----------------------------------------------------------------------------


def test_littles_law_holds_for_the_gauges_on_a_steady_poisson_load():
    rate, start_s, end_s = 4.0, 100.0, 1500.0
    sim = engine(poisson(rate, 1600, TokenLengths(3000, 200, 1.0, 1.0), seed=4), 2, 2)
    in_system = []
    t = start_s
    while t < end_s:
        sim.advance_to(t)
        gauges = sum(i.waiting + i.running for i in sim.instances())
        in_system.append(gauges + sim.pending_requests)
        t += 0.5
    result = sim.run()
    window = [r for r in result.records if start_s <= r.arrival_s < end_s]
    arrival_rate = len(window) / (end_s - start_s)
    mean_e2e = statistics.fmean(r.e2e_s for r in window)
    assert statistics.fmean(in_system) == pytest.approx(arrival_rate * mean_e2e, rel=0.05)


def test_more_prefill_replicas_lower_ttft():
    def ttft_p50(prefill: int) -> float:
        requests = poisson(12, 600, TokenLengths(1200, 50, 1.0, 1.0), seed=5)
        return median(r.ttft_s for r in engine(requests, prefill, 2).run().records)

    one, two = ttft_p50(1), ttft_p50(2)
    assert two < 0.7 * one


def test_more_decode_replicas_lower_itl():
    def itl_p50(decode: int) -> float:
        requests = poisson(4, 600, TokenLengths(1000, 400, 1.0, 1.0), seed=6)
        return engine(requests, 2, decode).run().token_itl_s.quantile(0.5)

    one, two, four = itl_p50(1), itl_p50(2), itl_p50(4)
    assert four < two < 0.85 * one


# --- routing and scaling ----------------------------------------------------------------------


@pytest.mark.parametrize("role", [Role.PREFILL, Role.DECODE])
def test_a_new_instance_serves_only_after_its_ready_time(role: Role):
    sim = engine(poisson(10, 300, TokenLengths(1500, 100, 1.0, 1.0), seed=7), 1, 1)
    sim.advance_to(60)
    late = sim.add_instance("late", role, SPEC)  # ready after its load time: 90 s
    sim.advance_to(89.9)
    assert late.state is State.LOADING
    result = sim.run()
    assert late.ready_at_s == 90
    served = served_by(result, "late")
    assert served  # it did take work once ready
    start = (lambda r: r.prefill_start_s) if role is Role.PREFILL else (lambda r: r.first_token_s)
    assert min(start(r) for r in served) >= 90


def test_requests_wait_at_the_router_while_no_instance_is_ready():
    sim = PDEngine(poisson(2, 100, TokenLengths(1000, 20), seed=8), model=MODEL)
    sim.add_instance("p0", Role.PREFILL, SPEC, ready_after_s=40)
    sim.add_instance("d0", Role.DECODE, SPEC, ready_after_s=0)
    sim.advance_to(39)
    assert sim.pending_requests > 50
    result = sim.run()
    early = [r for r in result.records if r.arrival_s < 39]
    assert all(r.prefill_start_s >= 40 for r in early)
    assert all(r.ttft_s >= 40 - r.arrival_s for r in early)


@pytest.mark.parametrize("name", ["p0", "d0"])
def test_a_removed_instance_takes_nothing_new_and_drains(name: str):
    sim = engine(poisson(10, 300, TokenLengths(1500, 100, 1.0, 1.0), seed=9), 2, 2)
    sim.advance_to(100)
    removed = sim.instance(name)
    sim.remove_instance(name)
    result = sim.run()
    assert result.unfinished == 0
    if name == "p0":
        starts = [r.prefill_start_s for r in result.records if r.prefill_instance == name]
    else:
        # A decode instance may still be receiving KV it admitted before removal.
        starts = [r.prefill_end_s for r in result.records if r.decode_instance == name]
    assert starts and max(starts) <= 100
    assert removed.state is State.GONE
    assert removed.waiting == removed.running == 0


def test_routing_balances_load_across_ready_instances():
    result = engine(poisson(10, 600, TokenLengths(1500, 100, 1.0, 1.0), seed=10), 3, 3).run()
    # Requests through each prefill (TTFT observed) and each decode instance (finished there).
    for counts in (
        [i.ttft.count for i in result.instances[:3]],
        [i.requests_total for i in result.instances[3:]],
    ):
        assert max(counts) < 1.2 * min(counts)


# --- prefix cache and KV memory ---------------------------------------------------------------


def test_a_shared_prefix_hits_the_cache_on_the_same_instance():
    shared = tuple(range(8))  # 8 blocks of 512 tokens
    requests = [
        Request(0.0, 4096, 10, hash_ids=shared),
        Request(5.0, 4096 + 300, 10, hash_ids=(*shared, 99)),
        Request(10.0, 4096, 10, hash_ids=tuple(range(100, 108))),
    ]
    result = engine(requests, 1, 1).run()
    first, second, other = sorted(result.records, key=lambda r: r.id)
    assert (first.cached_tokens, second.cached_tokens, other.cached_tokens) == (0, 4096, 0)
    prefill_s = [r.prefill_end_s - r.prefill_start_s for r in (first, second, other)]
    assert prefill_s[1] < 0.3 * prefill_s[0]
    assert result.instances[0].prefix_cache_hits_total == 4096


def by_id(result: SimulationResult) -> list[RequestRecord]:
    return sorted(result.records, key=lambda r: r.id)


@pytest.mark.parametrize(("other_tokens", "follows_cache"), [(1000, True), (40_000, False)])
def test_the_router_sends_a_prefix_where_it_is_cached_unless_the_queue_there_costs_more(
    other_tokens, follows_cache
):
    # A leaves its 4,096-token prefix on one instance. At 5 s a cache-less prompt lands on one
    # of the two idle instances; just after it, B (A's prefix and one block more) arrives. A
    # short prompt ahead costs less than recomputing the prefix, so B follows its cache; a
    # 40,000-token one costs more, so B goes to the other instance whichever that is.
    prefix = tuple(range(8))
    requests = [
        Request(0.0, 4096, 10, hash_ids=prefix),
        Request(5.0, other_tokens, 10),
        Request(5.001, 4096 + 512, 10, hash_ids=(*prefix, 99)),
    ]
    first, other, second = by_id(engine(requests, prefill=2).run())
    if follows_cache:
        assert second.prefill_instance == first.prefill_instance
        assert second.cached_tokens == 4096
    else:
        assert second.prefill_instance != other.prefill_instance


def test_a_router_blind_to_the_caches_spreads_a_shared_prefix_and_recomputes_it():
    prefix = tuple(range(8))
    requests = [Request(t * 5.0, 4096 + 512, 10, hash_ids=(*prefix, 100 + t)) for t in range(6)]
    aware = engine(requests, prefill=3).run()
    blind = PDEngine(requests, model=MODEL, routing="least-loaded")
    for index in range(3):
        blind.add_instance(f"p{index}", Role.PREFILL, SPEC, ready_after_s=0)
    blind.add_instance("d0", Role.DECODE, SPEC, ready_after_s=0)
    # Aware: every request after the first finds the prefix. Blind: idle ties rotate over the
    # three instances, and each computes the prefix once.
    assert [r.cached_tokens for r in by_id(aware)] == [0] + [4096] * 5
    blind_cached = [r.cached_tokens for r in by_id(blind.run())]
    assert blind_cached.count(0) == 3 and blind_cached.count(4096) == 3


def test_on_the_mooncake_trace_a_cache_aware_router_reuses_prefixes_and_cuts_the_tail():
    # 15 minutes of the conversation trace on 8 S5000 prefill replicas: blind routing finds
    # ~8% of prompt tokens cached (an unbounded shared cache would find 37%); following the
    # caches finds ~24% and shortens the TTFT tail.
    path = real_trace("conversation_trace.jsonl")
    outcome = {}
    for routing in ROUTINGS:
        sim = PDEngine(
            read_mooncake(path, ReplayOptions(duration_s=900)), model=MODEL, routing=routing
        )
        for index in range(8):
            sim.add_instance(f"p{index}", Role.PREFILL, S5000, ready_after_s=0)
        for index in range(4):
            sim.add_instance(f"d{index}", Role.DECODE, H200, ready_after_s=0)
        result = sim.run()
        hits = sum(i.prefix_cache_hits_total for i in result.instances)
        queries = sum(i.prefix_cache_queries_total for i in result.instances)
        ttft = sorted(r.ttft_s for r in result.records)
        outcome[routing] = (hits / queries, ttft[int(0.99 * len(ttft))])
    (aware_hits, aware_p99), (blind_hits, blind_p99) = (
        outcome["prefix-aware"],
        outcome["least-loaded"],
    )
    assert aware_hits > 2 * blind_hits
    assert aware_p99 < blind_p99


def test_an_unknown_routing_is_refused_with_the_choices():
    with pytest.raises(ValueError, match="prefix-aware, least-loaded"):
        PDEngine([], model=MODEL, routing="random")  # type: ignore[arg-type]


def test_the_prefix_cache_evicts_least_recently_used_blocks():
    small = ReplicaSpec(PREFILL, DECODE, kv_capacity_tokens=8 * 512, load_seconds=0)
    requests = [
        Request(0.0, 2048, 5, hash_ids=(1, 2, 3, 4)),
        Request(1.0, 2048, 5, hash_ids=(5, 6, 7, 8)),
        Request(2.0, 2048, 5, hash_ids=(1, 2, 3, 4)),  # still cached: 8 blocks fit
        Request(3.0, 2048, 5, hash_ids=(9, 10, 11, 12)),  # evicts 5-8, the least recent
        Request(4.0, 2048, 5, hash_ids=(5, 6, 7, 8)),
    ]
    result = engine(requests, 1, 1, spec=small).run()
    cached = [r.cached_tokens for r in sorted(result.records, key=lambda r: r.id)]
    assert cached == [0, 0, 2047, 0, 0]  # the last prompt token is always computed


def test_decode_batch_is_limited_by_kv_memory():
    # Each request needs 2,000 + 100 KV tokens: ten fit at once.
    tight = ReplicaSpec(PREFILL, DECODE, kv_capacity_tokens=21_000, load_seconds=0)
    requests = [Request(i * 0.01, 2000, 100) for i in range(60)]
    sim = engine(requests, 4, 1, decode_spec=tight)
    decode = sim.instance("d0")
    running, waiting, usage = [], [], []
    for step in range(1, 400):
        sim.advance_to(step * 0.05)
        running.append(decode.running)
        waiting.append(decode.waiting)
        usage.append(decode.kv_usage)
    assert max(running) == 10
    assert max(waiting) > 10
    # Ten sequences of 2,001-2,100 tokens in 21,000: the cache runs nearly full, never over.
    assert 0.95 < max(usage) <= 1.0
    assert min(usage) >= 0
    assert sim.run().unfinished == 0
    assert decode.kv_usage == 0


def test_instance_histograms_agree_with_the_recorded_latencies():
    result = engine(poisson(8, 300, TokenLengths(2000, 100, 1.0, 1.0), seed=11), 2, 2).run()
    for instance in result.instances:
        mine = [r for r in result.records if r.prefill_instance == instance.name]
        bounds = instance.ttft.bounds
        expected = [0] * (len(bounds) + 1)
        for r in mine:
            expected[bisect.bisect_left(bounds, r.ttft_s)] += 1
        assert instance.ttft.counts == expected
        assert instance.ttft.sum == pytest.approx(sum(r.ttft_s for r in mine))


def test_a_lone_moe_sequence_decodes_at_the_models_batch_of_one_itl():
    """GLM-4.5 on 8 H200: one sequence touches 8 of 160 routed experts per layer, so its steps
    read a fraction of the weights; the engine agrees with the planner's `decode_itl_ms`."""
    prompt, output = 13_000, 50
    result = engine([Request(0.0, prompt, output)], prefill=1, decode=1, decode_spec=H200).run()
    steps = [decode_itl_ms(H200_SXM, GLM_45_FP8, 8, 1, prompt + 1 + k) for k in range(output - 1)]
    assert result.records[0].itl_mean_s * 1000 == pytest.approx(statistics.mean(steps), rel=1e-6)
    # Reading every expert each step would take over four times as long.
    every_expert = H200.decode.a_ms + H200.decode.routed_ms
    assert result.records[0].itl_mean_s * 1000 < every_expert / 4


def test_replica_spec_from_profiles_uses_the_performance_model():
    spec = ReplicaSpec.from_profiles(MTT_S5000, GLM_45_FP8, 8)
    assert spec.prefill == PrefillCoefficients.from_profiles(MTT_S5000, GLM_45_FP8, 8)
    assert spec.load_seconds == pytest.approx(60 + 355e9 / 8 / 2e9)
    with pytest.raises(ValueError, match="KV"):
        ReplicaSpec.from_profiles(H200_SXM, GLM_45_FP8, 2)  # 355 GB of weights on 2 cards


# --- exposition -------------------------------------------------------------------------------


def test_sglang_exposition_uses_sglang_names_and_bounds():
    sim = PDEngine(
        poisson(5, 60, TokenLengths(1000, 50), seed=12), model=MODEL, buckets=SGLANG_BUCKETS
    )
    sim.add_instance("p0", Role.PREFILL, SPEC, ready_after_s=0)
    sim.add_instance("d0", Role.DECODE, SPEC, ready_after_s=0)
    sim.advance_to(30)
    server = EngineMetricsServer(sim, threading.Lock(), dialect=SGLANG_UNDERSCORE)
    try:
        server.add_pod(SimPod("ns", "decode-0", "d0", "demo", "decode", "h200", "glm"))
        text = server.render("ns", "decode-0") or ""
    finally:
        server.stop()
    lines = text.splitlines()
    running = next(line for line in lines if line.startswith("sglang_num_running_reqs{"))
    assert running == f'sglang_num_running_reqs{{model_name="glm"}} {sim.instance("d0").running}'
    itl_bounds = [line for line in lines if line.startswith("sglang_inter_token_latency_seconds_b")]
    assert len(itl_bounds) == len(SGLANG_BUCKETS.itl_s) + 1
    assert itl_bounds[-1].endswith(f'le="+Inf"}} {sim.instance("d0").itl.count}')
    assert not any(line.startswith("vllm") or line.startswith("sglang:") for line in lines)
    with pytest.raises(ValueError, match="bounds"):
        EngineMetricsServer(engine([]), threading.Lock(), dialect=SGLANG)
