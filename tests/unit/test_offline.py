"""Offline simulator: same latencies as the engine, the real policy in the loop, determinism."""

import dataclasses
import io
import itertools
import json
import math
import statistics
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

import pytest
import yaml

from pd_operator.api.document import parse_pddeployment
from pd_operator.api.spec import PDDeploymentSpec, ScheduleSpec, SeasonalSpec
from pd_operator.core.children import PoolKey
from pd_operator.core.hardware import GLM_45_FP8, H200_SXM, HARDWARE_PROFILES, MTT_S5000
from pd_operator.core.learning import seed_load_seconds
from pd_operator.core.policy import decide
from pd_operator.core.policy_state import PolicyState
from pd_operator.core.resolved import resolve
from pd_tools.cli.main import main
from pd_tools.enginesim.engine import ROUTINGS, PDEngine, ReplicaSpec, Role
from pd_tools.replay.baselines import OperatorPolicy, StaticPeak, View
from pd_tools.replay.cluster import Cluster, NodeType
from pd_tools.replay.example import example_document
from pd_tools.replay.fleet import Fleet
from pd_tools.replay.offline import POLICY_NAMES, Timing, simulate
from pd_tools.replay.offline_metrics import histogram_quantile, scrape, window_stats
from pd_tools.replay.oracle_search import prescient_schedule
from pd_tools.replay.outcomes import idle_latencies
from pd_tools.replay.progress import Progress, ProgressBar
from pd_tools.workloads.traces import (
    Request,
    TokenLengths,
    constant_rate,
    step_rate,
    synthetic_requests,
)
from pdcases import ROOT
from traces import real_trace


def make_spec(
    prefill_max: int = 8, decode_max: int = 4, interval: int = 30, ttft_ms: int = 6000
) -> PDDeploymentSpec:
    doc: dict[str, Any] = {
        "apiVersion": "pdoperator.io/v1alpha1",
        "kind": "PDDeployment",
        "metadata": {"name": "glm"},
        "spec": {
            "model": {"name": "zai-org/GLM-4.5-FP8", "image": "vllm/vllm-openai:v0.11.0"},
            "slo": {
                "ttft": {"percentile": "P50", "targetMilliseconds": ttft_ms},
                "itl": {"percentile": "P50", "targetMilliseconds": 20},
                "windowSeconds": 60,
            },
            "prefill": {
                "pools": [
                    {
                        "name": "s5000",
                        "accelerator": {
                            "resourceName": "mthreads.com/gpu",
                            "perReplica": 8,
                            "profile": "mtt-s5000",
                        },
                        "replicas": {"min": 1, "max": prefill_max},
                    }
                ]
            },
            "decode": {
                "pools": [
                    {
                        "name": "h200",
                        "accelerator": {
                            "resourceName": "nvidia.com/gpu",
                            "perReplica": 8,
                            "profile": "h200",
                        },
                        "replicas": {"min": 1, "max": decode_max},
                    }
                ]
            },
            "scaling": {"intervalSeconds": interval},
        },
    }
    return parse_pddeployment(doc).spec


def load(rates: list[float], step_s: float = 300.0, seed: int = 1) -> list[Any]:
    lengths = TokenLengths(8000, 300, input_cv=1.0, output_cv=1.0)
    return list(synthetic_requests(step_rate(rates, step_s), lengths, seed=seed))


def test_fixed_replicas_give_the_engine_s_own_latencies() -> None:
    """With replicas held fixed, the offline loop changes nothing the engine computes."""
    spec = make_spec()
    requests = list(
        synthetic_requests(constant_rate(1.0, 600), TokenLengths(8000, 300, 1.0, 1.0), seed=3)
    )
    fixed: dict[PoolKey, int] = {("prefill", "s5000"): 2, ("decode", "h200"): 1}
    result = simulate(spec, requests, StaticPeak(fixed), model=GLM_45_FP8)
    engine = PDEngine(requests, model=GLM_45_FP8)
    for n in range(2):
        engine.add_instance(
            f"p{n}",
            Role.PREFILL,
            ReplicaSpec.from_profiles(MTT_S5000, GLM_45_FP8, 8),
            ready_after_s=0,
        )
    engine.add_instance(
        "d0", Role.DECODE, ReplicaSpec.from_profiles(H200_SXM, GLM_45_FP8, 8), ready_after_s=0
    )
    records = sorted(engine.run().records, key=lambda r: r.id)
    assert result.unfinished == 0 and len(records) == len(requests)
    offline_ttft = [o.ttft_s for o in result.outcomes]
    engine_ttft = [r.ttft_s for r in records]
    assert statistics.mean(offline_ttft) == pytest.approx(statistics.mean(engine_ttft), rel=0.05)
    tpot = [o.tpot_s for o in result.outcomes if not math.isnan(o.tpot_s)]
    engine_tpot = [r.itl_mean_s for r in records if r.output_tokens > 1]
    assert statistics.mean(tpot) == pytest.approx(statistics.mean(engine_tpot), rel=0.05)
    # Card-hours: 3 replicas x 8 cards for the whole run.
    total = sum(result.card_hours.values())
    assert total == pytest.approx(24 * result.end_s / 3600, rel=0.01)
    assert result.scale_actions == 0


def test_scraped_percentile_is_what_prometheus_would_answer() -> None:
    bounds = (0.1, 0.2, 0.5)
    # 10 observations <= 0.1, 10 in (0.1, 0.2], none above: the median is at the first bound.
    assert histogram_quantile(0.5, bounds, [10, 20, 20, 20]) == pytest.approx(0.1)
    assert histogram_quantile(0.75, bounds, [10, 20, 20, 20]) == pytest.approx(0.15)
    assert histogram_quantile(0.99, bounds, [0, 0, 0, 5]) == 0.5  # +Inf: highest finite bound
    assert math.isnan(histogram_quantile(0.5, bounds, [0, 0, 0, 0]))


class Recorder:
    """Wraps the operator policy and keeps every view it was given and what it answered."""

    def __init__(self, interval_s: float) -> None:
        self.inner = OperatorPolicy(interval_s=interval_s)
        self.name = "pd-operator"
        self.interval_s = interval_s
        self.warm_up = True
        self.calls: list[tuple[View, Mapping[PoolKey, int]]] = []

    def decide(self, view: View) -> Mapping[PoolKey, int]:
        answer = self.inner.decide(view)
        self.calls.append((view, dict(answer)))
        return answer


def test_the_simulator_runs_the_operator_s_decide_unchanged() -> None:
    spec = make_spec()
    recorder = Recorder(30.0)
    result = simulate(spec, load([0.5, 3.0, 0.5]), recorder, model=GLM_45_FP8)
    assert result.scale_actions > 0
    state = PolicyState()
    for view, answer in recorder.calls:
        decision = decide(spec, view.observation, state, view.now)
        assert decision is not None
        assert dict(decision.replicas) == answer
        state = decision.state


def test_a_role_of_two_pools_is_scraped_per_pool_as_the_pool_label_gives_it() -> None:
    """Prefill on S5000 and on H200 nodes: the policy's view has each pool's own TTFT and
    prompt tokens (what it learns each pool's capacity from), summing to the role's."""
    spec = make_spec()
    s5000 = spec.prefill.pools[0]
    h200 = s5000.model_copy(
        update={
            "name": "h200",
            "accelerator": spec.decode.pools[0].accelerator,
            "replicas": s5000.replicas.model_copy(update={"min": 1}),
        }
    )
    spec = spec.model_copy(
        update={"prefill": spec.prefill.model_copy(update={"pools": [s5000, h200]})}
    )
    recorder = Recorder(30.0)
    simulate(spec, load([1.0], step_s=600.0), recorder, model=GLM_45_FP8)
    read = [
        view.observation.signals["prefill"]
        for view, _ in recorder.calls
        if "prefill" in view.observation.signals
        and set(view.observation.signals["prefill"].pools) == {"s5000", "h200"}
    ]
    assert len(read) > 10
    for signals in read:
        pools = signals.pools
        served = sum(p.served_tokens_per_second.value or 0.0 for p in pools.values())
        assert served == pytest.approx(signals.prompt_tokens_per_second.value, rel=1e-6)
    # Both pools served: the router spreads prompts over every Ready prefill replica.
    assert all((p.served_tokens_per_second.value or 0.0) > 0 for p in read[-1].pools.values())


def test_the_operator_grows_prefill_when_load_triples_and_shrinks_after() -> None:
    result = simulate(
        make_spec(), load([0.5, 3.0, 3.0, 0.5, 0.5, 0.5]), "pd-operator", model=GLM_45_FP8
    )
    prefill = [r["prefill/s5000"] for _, r in result.timeline]
    assert max(prefill) > prefill[0]
    assert prefill[-1] < max(prefill)


def test_each_scale_change_carries_the_operator_s_reason_for_it() -> None:
    # What a platform engineer reads to see why the policy scaled: the decision's own reason,
    # at the time of each change, after the warm-up shifted to the window's start.
    result = simulate(
        make_spec(),
        load([0.5, 3.0, 3.0, 0.5, 0.5, 0.5]),
        "pd-operator",
        model=GLM_45_FP8,
        warmup_s=120,
    )
    changes = result.changes()
    assert len(changes) > 2
    assert [t for t, _ in result.reasons] == [c["t"] for c in changes[1:]]
    for before, after in itertools.pairwise(changes):
        moved = {p: n for p, n in after["replicas"].items() if n != before["replicas"][p]}
        assert moved
        for key, count in moved.items():
            pool = key.split("/")[1]
            assert f"{pool} {before['replicas'][key]}->{count}" in after["reason"]
    lines = result.change_lines()
    assert len(lines) == len(changes) - 1
    assert all(": prefill: " in line for line in lines)
    assert result.to_dict()["timeline"] == changes


@pytest.mark.parametrize(
    ("policy", "says"),
    [
        ("hpa", "{role}/{pool}: "),  # the pool's metric against its target
        ("llm-d-slo", "{role}: P90 "),  # s = P90 latency over its target
        ("dynamo-sla", "{role} mean "),  # the reactive loop, or "predictive" for both roles
    ],
)
def test_the_baselines_say_why_they_scaled(policy: str, says: str) -> None:
    result = simulate(make_spec(), load([0.5, 3.0, 3.0, 0.5, 0.5, 0.5]), policy, model=GLM_45_FP8)
    changes = result.changes()
    assert len(changes) > 1
    for before, after in itertools.pairwise(changes):
        for key, count in after["replicas"].items():
            if count != before["replicas"][key]:
                role, pool = key.split("/")
                reason = after["reason"]
                assert says.format(role=role, pool=pool) in reason or reason.startswith(
                    "predictive"
                ), reason


def test_a_burst_one_prefill_replica_absorbed_does_not_keep_a_second_one() -> None:
    # 12K prompt tokens/s on one S5000 replica (~40% of it), and 600 prompts in 10 s: the
    # queue is gone within half a minute, but the minute's P99 TTFT breaches. The second
    # replica is right to come; it must go once the scale-down window has passed, not be kept
    # by a capacity estimate cut to the minute's average rate.
    spec = parse_pddeployment(example_document(percentile="P99")).spec
    burst_at, step = 610, 10.0
    rates = [6.0] * int(1800 / step)
    rates[int(burst_at / step)] = 60.0
    requests = list(synthetic_requests(step_rate(rates, step), TokenLengths(2000, 20), seed=3))
    result = simulate(spec, requests, "pd-operator", model=GLM_45_FP8)
    prefill = [(t, r["prefill/s5000"]) for t, r in result.timeline]
    assert max(size for _, size in prefill) == 2
    grown = next(t for t, size in prefill if size == 2)
    back = next(t for t, size in prefill if t > grown and size == 1)
    down = spec.scaling.scale_down.stabilization_seconds
    assert back <= burst_at + down + spec.slo.window_seconds + 2 * spec.scaling.interval_seconds
    assert prefill[-1][1] == 1


def test_same_seed_same_result() -> None:
    spec = make_spec()
    runs = [simulate(spec, load([1.0, 2.0], seed=7), "hpa", model=GLM_45_FP8) for _ in range(2)]
    first, second = (r.summary() for r in runs)
    first.pop("wall_s"), second.pop("wall_s")
    assert first == second
    other = simulate(spec, load([1.0, 2.0], seed=8), "hpa", model=GLM_45_FP8).summary()
    assert other["tokens"] != first["tokens"]


@pytest.mark.parametrize("policy", POLICY_NAMES)
def test_every_policy_serves_a_short_load(policy: str) -> None:
    result = simulate(make_spec(), load([1.0, 2.0], step_s=180), policy, model=GLM_45_FP8)
    assert result.unfinished == 0
    assert result.attainment()["both"] > 0.5
    assert result.cost > 0 and result.cost_per_million_tokens > 0


def test_replicas_that_do_not_fit_on_the_nodes_stay_pending() -> None:
    """One S5000 node of 8 cards holds one prefill replica, whatever the policy asks."""
    cluster = Cluster((NodeType("mtt-s5000", 1), NodeType("h200", 2)))
    result = simulate(
        make_spec(), load([4.0, 4.0]), "pd-operator", model=GLM_45_FP8, cluster=cluster
    )
    assert result.card_hours["mtt-s5000"] <= 8 * result.end_s / 3600 + 1e-9


def test_cost_uses_the_cluster_s_card_hour_prices() -> None:
    cluster = Cluster(
        (NodeType("mtt-s5000", 8), NodeType("h200", 4)), prices={"mtt-s5000": 1.0, "h200": 2.0}
    )
    result = simulate(make_spec(), load([1.0]), "static-peak", model=GLM_45_FP8, cluster=cluster)
    hours = result.card_hours
    assert result.cost == pytest.approx(hours["mtt-s5000"] * 1.0 + hours["h200"] * 2.0)
    assert set(hours) <= set(HARDWARE_PROFILES)


def test_warm_up_delays_new_replicas() -> None:
    """With a long model-load time, a scale-up serves later, so TTFT attainment can only drop."""
    spec = make_spec()
    requests = load([0.5, 3.0, 3.0])
    fast = simulate(spec, requests, "hpa", model=GLM_45_FP8, timing=Timing(load_seconds=0))
    slow = simulate(spec, requests, "hpa", model=GLM_45_FP8, timing=Timing(load_seconds=600))
    assert slow.attainment()["ttft"] <= fast.attainment()["ttft"]


def test_pdctl_simulate_prints_one_summary_per_policy(capsys: pytest.CaptureFixture[str]) -> None:
    argv = [
        "sim",
        "replay",
        "--rate",
        "1",
        "--duration",
        "300",
        "--policy",
        "hpa",
        "--policy",
        "oracle",
        "-o",
        "json",
        "--progress",
    ]
    assert main(argv) == 0
    captured = capsys.readouterr()
    summaries = json.loads(captured.out)
    assert [s["policy"] for s in summaries] == ["hpa", "oracle"]
    assert all(0 <= s["attainment"]["both"] <= 1 for s in summaries)
    assert "hpa: t=" in captured.err  # progress goes to stderr


def test_pdctl_simulate_replays_a_slow_kv_fabric(capsys: pytest.CaptureFixture[str]) -> None:
    """--kv-link sets the fabric's speed: prompts of 8K tokens on average over 0.19 GB/s take 8 s
    to hand off, past the TTFT target for every longer-than-average one, where the default
    100 GB/s link serves them in time."""
    argv = [
        "sim", "replay", "--rate", "0.25", "--duration", "300", "--input-tokens", "8000",
        "--output-tokens", "20", "--policy", "static-peak", "-o", "json",
    ]  # fmt: skip
    assert main(argv) == 0
    fast = json.loads(capsys.readouterr().out)[0]
    assert main([*argv, "--kv-link", "0.19"]) == 0
    slow = json.loads(capsys.readouterr().out)[0]
    assert fast["attainment"]["both"] > 0.9
    assert slow["attainment"]["both"] < 0.6


def test_a_shipped_sample_whose_model_has_no_profile_simulates_as_the_model_given(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # The sample serves GLM-4.6, which has no profile: with --model the baselines (which need
    # a profile) run, and the substitution is said, not silent.
    sample = ROOT / "config" / "samples" / "homogeneous-h200-2p2d.yaml"
    argv = ["sim", "replay", "--spec", str(sample), "--model", "glm-4.5-fp8", "--rate", "1"]
    argv += ["--duration", "60", "--policy", "pd-operator", "--policy", "hpa", "-o", "json"]
    assert main(argv) == 0
    captured = capsys.readouterr()
    assert [s["policy"] for s in json.loads(captured.out)] == ["pd-operator", "hpa"]
    assert (
        "spec.model.name 'zai-org/GLM-4.6-FP8' has no model profile; simulated as glm-4.5-fp8"
        in captured.err
    )
    assert main(argv[:4] + argv[6:]) == 2  # without --model: the error says to pass one
    assert "pass --model, one of" in capsys.readouterr().err


def test_pdctl_simulate_explain_lists_each_scale_change_with_its_reason(
    capsys: pytest.CaptureFixture[str],
) -> None:
    argv = ["sim", "replay", "--rate", "12", "--duration", "240", "--explain"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    changes = out.split("pd-operator: scale changes (seconds from the window's start)\n")[1]
    lines = changes.strip().splitlines()
    assert lines
    for line in lines:
        when, _, rest = line.strip().partition(" s  ")
        assert float(when) > 0
        pool_move, _, reason = rest.partition(": ")
        assert "->" in pool_move and reason.startswith("prefill: ")
    assert main([*argv, "-o", "json", "--policy", "pd-operator", "--policy", "static-peak"]) == 0
    ours, fixed = json.loads(capsys.readouterr().out)
    assert ours["changes"][0]["t"] == 0 and len(ours["changes"]) == len(lines) + 1
    assert all(c["reason"].startswith("prefill: ") for c in ours["changes"][1:])
    assert len(fixed["changes"]) == 1  # static-peak never changes
    assert main([*argv[:-1], "-o", "json"]) == 0
    assert "changes" not in json.loads(capsys.readouterr().out)[0]


def test_pdctl_simulate_replays_a_trace_behind_either_router(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Five minutes of the Mooncake trace on a fixed deployment: routing requests to their
    cached prefixes serves more of them in time than a router blind to the caches."""
    trace = str(real_trace("conversation_trace.jsonl"))
    attained = {}
    for routing in ROUTINGS:
        argv = ["sim", "replay", "--trace", trace, "--duration", "300", "--policy", "static-peak"]
        assert main([*argv, "--routing", routing, "-o", "json"]) == 0
        attained[routing] = json.loads(capsys.readouterr().out)[0]["attainment"]["feasible"]
    assert attained["prefix-aware"] > attained["least-loaded"]


def test_scraped_window_means_match_the_requests_in_the_window() -> None:
    """The Prometheus view (rate of histogram sum over rate of count) at constant load gives
    the same mean TTFT as the requests whose first token fell in that window, within 5%."""
    requests = list(
        synthetic_requests(constant_rate(1.0, 600), TokenLengths(8000, 300, 1.0, 1.0), seed=5)
    )
    engine = PDEngine(requests, model=GLM_45_FP8)
    prefill = ReplicaSpec.from_profiles(MTT_S5000, GLM_45_FP8, 8)
    engine.add_instance("p0", Role.PREFILL, prefill, ready_after_s=0)
    engine.add_instance("p1", Role.PREFILL, prefill, ready_after_s=0)
    engine.add_instance(
        "d0", Role.DECODE, ReplicaSpec.from_profiles(H200_SXM, GLM_45_FP8, 8), ready_after_s=0
    )
    scrapes, records = [], []
    for step in range(0, 21):
        engine.advance_to(step * 15.0)
        records += engine.take_finished()
        scrapes.append(scrape(engine, step * 15.0))
    stats = window_stats(scrapes, 300.0, 60.0)["prefill"]
    inside = [r.ttft_s for r in records if 240.0 < r.first_token_s <= 300.0]
    # `records` holds finished requests only: a few whose first token fell in the window are
    # still decoding, hence the tolerance.
    assert inside and stats.mean_latency_s is not None
    assert stats.mean_latency_s == pytest.approx(statistics.mean(inside), rel=0.05)


def test_pdctl_simulate_shows_no_progress_off_a_terminal_unless_asked(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["sim", "replay", "--rate", "1", "--duration", "120", "-o", "json"]) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out)[0]["policy"] == "pd-operator"
    assert captured.err == ""


def test_a_prompt_too_long_for_any_capacity_is_reported_as_infeasible() -> None:
    """A 120K-token prompt takes ~13 s of S5000 prefill alone: it misses a 6 s TTFT target on
    any deployment, so it is counted apart and does not hide in the policy's attainment."""
    requests = [Request(k * 2.0, 4000, 200) for k in range(60)]
    requests.insert(30, Request(59.0, 120_000, 200))
    spec = make_spec()
    ttft, _ = idle_latencies(spec, requests, GLM_45_FP8)[30]
    assert ttft > 6.0
    fixed: dict[PoolKey, int] = {("prefill", "s5000"): 2, ("decode", "h200"): 1}
    result = simulate(spec, requests, StaticPeak(fixed), model=GLM_45_FP8)
    assert result.infeasible == 1
    assert not result.outcomes[30].ttft_ok
    attainment = result.attainment()
    assert attainment["both"] == pytest.approx(60 / 61)
    assert attainment["feasible"] == 1.0
    assert result.summary()["infeasible"] == 1


def test_a_request_over_the_context_length_is_refused_on_arrival() -> None:
    """vLLM answers 400 at once to a prompt that, with its answer, exceeds --max-model-len:
    it holds no replica, so the requests behind it are served as if it never came. It is
    counted as rejected, never as infeasible or unfinished, and meets no target."""
    requests = [Request(k * 2.0, 4000, 200) for k in range(60)]
    requests.insert(30, Request(59.0, 140_000, 200))  # GLM-4.5 takes 131,072 tokens
    spec = make_spec()
    fixed: dict[PoolKey, int] = {("prefill", "s5000"): 1, ("decode", "h200"): 1}
    result = simulate(spec, requests, StaticPeak(fixed), model=GLM_45_FP8)
    without = simulate(spec, requests[:30] + requests[31:], StaticPeak(fixed), model=GLM_45_FP8)
    assert (result.rejected, result.infeasible, result.unfinished) == (1, 0, 0)
    refused = result.outcomes[30]
    assert refused.rejected and refused.input_tokens == 140_000
    assert not (refused.ttft_ok or refused.itl_ok or refused.feasible)
    served = [o.ttft_s for o in result.outcomes if not o.rejected]
    assert served == [o.ttft_s for o in without.outcomes]
    assert result.attainment()["both"] == pytest.approx(60 / 61)
    assert result.attainment()["feasible"] == 1.0
    assert result.summary()["rejected"] == 1
    assert result.to_dict()["requests_detail"][30]["rejected"] is True


def test_the_spec_context_length_refuses_what_the_model_would_take() -> None:
    """`model.contextLength` is the engines' --max-model-len: a 40K-token prompt fits GLM-4.5
    but not a deployment capped at 32K; a model profile without a known limit takes all."""
    requests = [Request(1.0, 4000, 100), Request(2.0, 40_000, 100)]
    fixed: dict[PoolKey, int] = {("prefill", "s5000"): 1, ("decode", "h200"): 1}
    spec = make_spec()
    assert simulate(spec, requests, StaticPeak(fixed), model=GLM_45_FP8).rejected == 0
    capped = spec.model_copy(
        update={"model": spec.model.model_copy(update={"context_length": 32_768})}
    )
    result = simulate(capped, requests, StaticPeak(fixed), model=GLM_45_FP8)
    assert [o.rejected for o in result.outcomes] == [False, True]
    unknown = dataclasses.replace(GLM_45_FP8, max_context_tokens=None)
    long = [Request(1.0, 140_000, 100)]
    assert simulate(spec, long, StaticPeak(fixed), model=unknown).rejected == 0


def test_latency_is_never_below_the_idle_service_time() -> None:
    requests = load([2.0, 2.0], step_s=120)
    spec = make_spec()
    idle = idle_latencies(spec, requests, GLM_45_FP8)
    result = simulate(spec, requests, "hpa", model=GLM_45_FP8)
    for outcome, (ttft, tpot) in zip(result.outcomes, idle, strict=True):
        assert outcome.ttft_s >= ttft * (1 - 1e-9)
        if outcome.output_tokens > 1:
            assert outcome.tpot_s >= tpot * (1 - 1e-9)


def test_short_answers_on_a_busy_decode_replica_meet_the_itl_target() -> None:
    """A 2-token answer has one inter-token gap. Its wait for the decode step in progress is
    part of its TTFT (as in vLLM's P/D decode), so a busy replica whose step meets the
    target serves it in time, and its TTFT still shows the wait."""
    background = [Request(k * 0.5, 2000, 400) for k in range(240)]
    short = [Request(k * 0.5 + 0.2537, 500, 2) for k in range(240)]
    requests = sorted(background + short, key=lambda r: r.arrival_s)
    spec = make_spec()
    fixed: dict[PoolKey, int] = {("prefill", "s5000"): 2, ("decode", "h200"): 1}
    result = simulate(spec, requests, StaticPeak(fixed), model=GLM_45_FP8)
    answers = [o for o in result.outcomes if o.output_tokens == 2]
    assert all(o.itl_ok for o in answers)
    assert result.attainment()["itl"] == 1.0
    idle = idle_latencies(spec, requests, GLM_45_FP8)
    waited = [
        o.ttft_s - ttft
        for o, (ttft, _) in zip(result.outcomes, idle, strict=True)
        if o.output_tokens == 2
    ]
    assert statistics.mean(waited) > 0.001  # the join wait went to TTFT


def test_the_oracle_meets_the_slo_with_no_more_card_hours_than_any_fixed_deployment() -> None:
    """The oracle's hindsight schedule serves >= 99% of the feasible requests, grows for the
    burst, and costs no more card-hours than the smallest fixed deployment that meets the
    SLO, while a fixed deployment below its peak misses it."""
    spec = make_spec(ttft_ms=2000)
    requests = load([0.5, 6.0, 0.5], step_s=120)
    oracle = simulate(spec, requests, "oracle", model=GLM_45_FP8)
    assert oracle.attainment()["feasible"] >= 0.99
    prefill = [r["prefill/s5000"] for _, r in oracle.timeline]
    assert max(prefill) > prefill[0]
    peak = max(prefill)
    fixed = {
        n: simulate(
            spec,
            requests,
            StaticPeak({("prefill", "s5000"): n, ("decode", "h200"): 1}),
            model=GLM_45_FP8,
        )
        for n in (peak - 1, peak)
    }
    assert fixed[peak - 1].attainment()["feasible"] < 0.99
    if fixed[peak].attainment()["feasible"] >= 0.99:
        assert sum(oracle.card_hours.values()) <= sum(fixed[peak].card_hours.values())


@pytest.mark.parametrize("load_s", [None, 40.0])
def test_prescient_starts_the_oracle_s_replicas_one_model_load_ahead(load_s: float | None) -> None:
    """With the trace known, replicas start loading one model-load time before the burst and
    serve it as the oracle (which needs no load) does; the load time is all they cost more.
    A reactive policy on the same burst misses most of it."""
    spec = make_spec(ttft_ms=2000)
    requests = load([0.5, 6.0, 0.5], step_s=120)
    timing = Timing(load_seconds=load_s)
    oracle = simulate(spec, requests, "oracle", model=GLM_45_FP8, timing=timing)
    prescient = simulate(spec, requests, "prescient", model=GLM_45_FP8, timing=timing)
    lead = math.ceil(load_s or ReplicaSpec.from_profiles(MTT_S5000, GLM_45_FP8, 8).load_seconds)
    # The burst begins at 120 s. The same deployments: each rise one lead earlier, each drop
    # when the oracle's.
    assert oracle.timeline[1] == (120, {"prefill/s5000": 3, "decode/h200": 1})
    shifted = [oracle.timeline[0]]
    for (_, before), (t, after) in zip(oracle.timeline, oracle.timeline[1:], strict=False):
        grows = any(after[pool] > before[pool] for pool in after)
        shifted.append((t - lead if grows else t, after))
    assert prescient.timeline == shifted
    assert prescient.attainment()["feasible"] >= 0.99
    # Two more replicas of 8 cards each, held one load longer (less what drains sooner).
    extra = sum(prescient.card_hours.values()) - sum(oracle.card_hours.values())
    assert 0 < extra <= 2 * 8 * lead / 3600
    reactive = simulate(spec, requests, "pd-operator", model=GLM_45_FP8, timing=timing)
    assert reactive.attainment()["feasible"] < 0.9


def test_scale_down_removes_a_loading_replica_first_then_the_newest_ready_one() -> None:
    """As a ReplicaSet does: the older replicas, with their warm prefix caches, stay."""
    spec = make_spec()
    fleet = Fleet(spec, GLM_45_FP8, Cluster.fitting(spec), None)
    engine = PDEngine([], model=GLM_45_FP8)
    key: PoolKey = ("prefill", "s5000")
    fleet.apply(engine, {key: 3}, warm_up=False)
    first, second, third = (r.name for r in fleet.live[key])
    fleet.apply(engine, {key: 4}, warm_up=True)  # the fourth loads its model
    fleet.apply(engine, {key: 3}, warm_up=True)
    assert [r.name for r in fleet.live[key]] == [first, second, third]
    fleet.apply(engine, {key: 2}, warm_up=True)
    assert [r.name for r in fleet.live[key]] == [first, second]
    assert [r.name for r in fleet.draining][-1] == third


def test_a_prescient_lead_shorter_than_the_model_load_is_refused() -> None:
    spec = make_spec()
    requests = load([0.5], step_s=60)
    feasible = [True] * len(requests)
    cluster = Cluster.fitting(spec)
    with pytest.raises(ValueError, match="lead_s 30 is shorter than the model load"):
        prescient_schedule(
            spec, requests, model=GLM_45_FP8, cluster=cluster, feasible=feasible, lead_s=30.0
        )
    schedule = prescient_schedule(
        spec,
        requests,
        model=GLM_45_FP8,
        cluster=cluster,
        feasible=feasible,
        lead_s=30.0,
        load_s=30.0,
    )
    assert len(schedule) == math.floor(requests[-1].arrival_s / 60) + 1


def test_progress_bar_redraws_one_line_on_a_terminal_and_prints_tenths_elsewhere() -> None:
    terminal, log = io.StringIO(), io.StringIO()
    bar, lines = ProgressBar(terminal, terminal=True), ProgressBar(log, terminal=False)
    for t in range(0, 601, 15):
        for sink in (bar, lines):
            sink(Progress("hpa", float(t), 600.0, t, 600))
    bar.close()
    drawn = terminal.getvalue()
    assert drawn.startswith("\r[") and drawn.endswith("\n") and drawn.count("\n") == 1
    assert "[" + "#" * ProgressBar.WIDTH + "] 100% hpa: t=600s of 600s, 600/600 done" in drawn
    printed = log.getvalue().splitlines()
    assert len(printed) == 11  # 0%, 10%, ..., 100%
    assert printed[0] == "hpa: t=0s of 600s, 0/600 done"


def test_a_schedule_for_a_known_peak_serves_it_from_its_first_minute() -> None:
    # A peak at 09:00 UTC: 0.5 then 6 requests/s of 8K-token prompts. Reacting to it waits for
    # the latency to show it, then one model load, while the queue grows; a schedule for it has
    # the replicas Ready at 09:00, started one load and one interval ahead.
    spec = make_spec()
    requests = load([0.5, 6.0], step_s=600)
    timing = Timing(clock_s=datetime(2026, 11, 30, 9, 0, tzinfo=UTC).timestamp() - 600)
    peak = ScheduleSpec(name="peak", start="09:00", end="09:10", prefill={"s5000": 3})
    scheduled = spec.model_copy(
        update={"scaling": spec.scaling.model_copy(update={"schedules": [peak]})}
    )
    reactive = simulate(spec, requests, "pd-operator", model=GLM_45_FP8, timing=timing)
    ready = simulate(scheduled, requests, "pd-operator", model=GLM_45_FP8, timing=timing)
    assert reactive.attainment()["both"] < 0.9
    assert ready.attainment()["both"] == 1.0
    load_s = seed_load_seconds(resolve(spec), "prefill", spec.prefill.pools[0])
    assert load_s is not None
    grown, why = next(
        (t, why)
        for (t, sizes), (_, why) in zip(ready.timeline[1:], ready.reasons, strict=True)
        if sizes["prefill/s5000"] == 3
    )
    assert 600 - load_s - 2 * spec.scaling.interval_seconds <= grown <= 600 - load_s
    assert "prefill: s5000 1->3 limited by schedule peak" in why


DAY = 86_400.0
NINE = 9 * 3600.0


def daily_peak(peak_today: bool) -> list[Any]:
    """Two days of 0.02 requests/s of 8K-token prompts with a 20-minute peak of 6 requests/s at
    09:00 on the first day, and on the second unless it is a holiday."""

    def day(peak: bool) -> list[float]:
        rates = [0.02] * 72  # 20-minute steps
        rates[27] = 6.0 if peak else 0.02
        return rates

    rates = day(True) + day(peak_today)
    return list(
        synthetic_requests(step_rate(rates, 1200), TokenLengths(8000, 300, 1.0, 1.0), seed=1)
    )


def seasonal(spec: PDDeploymentSpec) -> PDDeploymentSpec:
    update = {"seasonal": SeasonalSpec(period="Day", seasons=1)}
    return spec.model_copy(update={"scaling": spec.scaling.model_copy(update=update)})


def changes(result: Any, start: float, end: float) -> list[tuple[float, int, str]]:
    """(seconds from 09:00 on day two, prefill replicas, why) of each change in [start, end)."""
    return [
        (t - DAY - NINE, sizes["prefill/s5000"], why)
        for (t, sizes), (_, why) in zip(result.timeline[1:], result.reasons, strict=True)
        if DAY + NINE + start <= t < DAY + NINE + end
    ]


def test_a_peak_that_came_yesterday_is_pre_warmed_today_and_a_holiday_costs_minutes() -> None:
    spec = make_spec()
    requests = daily_peak(peak_today=True)
    reactive = simulate(spec, requests, "pd-operator", model=GLM_45_FP8)
    warmed = simulate(seasonal(spec), requests, "pd-operator", model=GLM_45_FP8)

    def peak_attainment(result: Any) -> float:
        peak = [o for o in result.outcomes if DAY + NINE <= o.arrival_s < DAY + NINE + 1200]
        return sum(o.ttft_ok and o.itl_ok for o in peak) / len(peak)

    assert peak_attainment(reactive) < 0.95
    assert peak_attainment(warmed) >= 0.999
    assert sum(warmed.card_hours.values()) <= 1.01 * sum(reactive.card_hours.values())
    # The first replica for it starts one load and one interval ahead of 09:00.
    load_s = seed_load_seconds(resolve(spec), "prefill", spec.prefill.pools[0])
    assert load_s is not None
    lead = load_s + spec.scaling.interval_seconds
    first = next(c for c in changes(warmed, -600, 600) if "limited by forecast" in c[2])
    assert (
        -lead - spec.scaling.interval_seconds <= first[0] <= -lead + spec.scaling.interval_seconds
    )
    assert "prefill: s5000 1->" in first[2]

    # A holiday: the same pre-warming, lifted within two decisions of 09:00 when no load comes,
    # and the pool is back at one replica within ten minutes.
    holiday = simulate(
        seasonal(spec), daily_peak(peak_today=False), "pd-operator", model=GLM_45_FP8
    )
    after = changes(holiday, -600, 3600)
    assert max(t for t, _, why in after if "limited by forecast" in why) <= 2 * 30
    assert after[-1][1] == 1 and after[-1][0] <= 600


def test_pdctl_simulate_clock_sets_the_wall_time_schedules_read(
    tmp_path: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    document = yaml.safe_load(
        (ROOT / "config" / "samples" / "heterogeneous-s5000-h200.yaml").read_text()
    )
    pool = document["spec"]["prefill"]["pools"][0]["name"]
    document["spec"].setdefault("scaling", {})["schedules"] = [
        {"name": "peak", "start": "09:00", "end": "10:00", "prefill": {pool: 2}}
    ]
    path = tmp_path / "scheduled.yaml"
    path.write_text(yaml.safe_dump(document))
    argv = ["sim", "replay", "--spec", str(path), "--model", "glm-4.5-fp8", "--rate", "0.2"]
    argv += ["--duration", "300", "--explain"]
    # The window's start at 08:58 UTC: the floor's lead (a load and an interval) has begun.
    assert main([*argv, "--clock", "2026-11-30T08:58:00Z"]) == 0
    captured = capsys.readouterr()
    assert "limited by schedule peak" in captured.out
    assert "without --clock" not in captured.err
    # Without --clock the replay runs in 1970, at midnight: no floor, and a note says why.
    assert main(argv) == 0
    captured = capsys.readouterr()
    assert "schedule peak" not in captured.out
    assert "without --clock the replay starts at 1970-01-01T00:00:00Z" in captured.err
    assert main([*argv, "--clock", "9am"]) == 2
    assert "pdctl sim replay: --clock: want an ISO 8601 time" in capsys.readouterr().err
