"""`pdctl plan --replay`: a plan replayed on its trace, and grown where bursts break it."""

import dataclasses
import itertools
import json
import random
from pathlib import Path

import pytest
import yaml

from pd_operator.api.document import parse_pddeployment
from pd_operator.core.hardware import GLM_45_FP8, H200_SXM, MTT_S5000
from pd_tools.cli.main import main
from pd_tools.planner.plan_replay import Replayed, ReplaySearch, cheapest_replayed, replay_plan
from pd_tools.planner.sizing import (
    Candidate,
    Plan,
    PoolPlan,
    Target,
    Workload,
    decode_itl_at,
    deployment_document,
    plan,
)
from pd_tools.replay.baselines import StaticPeak
from pd_tools.replay.offline import simulate
from pd_tools.workloads.traces import Request

MODEL_NAME = "zai-org/GLM-4.5-FP8"
SLO = Target(ttft_ms=6000, itl_ms=20)
CANDIDATES = [Candidate(MTT_S5000, card_hour_price=1.5), Candidate(H200_SXM, card_hour_price=3.5)]
CANDIDATE_FLAGS = ["--candidate", "mtt-s5000:price=1.5", "--candidate", "h200:price=3.5"]


def bursty(span_s: int = 900) -> list[Request]:
    """A quiet Poisson stream of 4K prompts, and every 2 minutes 60 prompts of 8K within 3 s:
    a mean rate the queueing model sizes one replica per role for."""
    rng = random.Random(1)
    requests, t = [], 0.0
    while t < span_s:
        t += rng.expovariate(0.5)
        requests.append(Request(t, 4000, 200))
    for start in range(60, span_s, 120):
        requests += [Request(start + rng.uniform(0, 3), 8000, 200) for _ in range(60)]
    return sorted(requests, key=lambda r: r.arrival_s)


def steady(rate_rps: float, prompt: int = 4000, output: int = 200) -> list[Request]:
    """Ten minutes of Poisson arrivals of one length: what the queueing model assumes."""
    rng = random.Random(2)
    requests, t = [], 0.0
    while t < 600:
        t += rng.expovariate(rate_rps)
        requests.append(Request(t, prompt, output))
    return requests


def workload_of(requests: list[Request]) -> Workload:
    span = requests[-1].arrival_s - requests[0].arrival_s
    return Workload.from_lengths(
        len(requests) / span, [(r.input_tokens, r.output_tokens) for r in requests]
    )


def plan_and_search(requests: list[Request]) -> tuple[Plan, ReplaySearch]:
    """The queueing model's plan for `requests`, and the replay search's."""
    workload = workload_of(requests)
    planned = plan(workload, SLO, GLM_45_FP8, CANDIDATES)
    search = cheapest_replayed(
        workload, SLO, GLM_45_FP8, CANDIDATES, requests, model_name=MODEL_NAME
    )
    assert planned is not None and search is not None
    return planned, search


def replayed_share(pools: tuple[PoolPlan, ...], requests: list[Request], base: Plan) -> float:
    sized = Plan(base.workload, base.target, pools, 0.0, 0.0, 0.0)
    spec = parse_pddeployment(deployment_document(sized, name="x", model_name=MODEL_NAME)).spec
    fixed = StaticPeak({(p.role, p.name): p.replicas for p in pools})
    return simulate(spec, requests, fixed, model=GLM_45_FP8).attainment()["feasible"]


def write_trace(path: Path, requests: list[Request]) -> Path:
    rows = [
        {
            "timestamp": round(r.arrival_s * 1000),
            "input_length": r.input_tokens,
            "output_length": r.output_tokens,
            "hash_ids": [],
        }
        for r in requests
    ]
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def test_bursts_the_queueing_model_misses_get_the_cheapest_plan_the_replay_confirms() -> None:
    requests = bursty()
    planned, search = plan_and_search(requests)
    # As planned, the bursts break the SLO for many requests; the chosen plan holds it.
    assert search.planned.pools == planned.pools
    assert search.planned.both < 0.9
    assert search.met and search.chosen.steps[-1].both >= 0.99
    chosen = search.chosen.plan
    assert chosen.cost_per_hour > planned.cost_per_hour
    # No fixed deployment of one card type per role that costs less meets the share.
    cheaper = [
        (PoolPlan("prefill", p, n_p), PoolPlan("decode", d, n_d))
        for p, d in itertools.product(CANDIDATES, CANDIDATES)
        for n_p, n_d in itertools.product(range(1, 4), range(1, 4))
        if n_p * 8 * p.price + n_d * 8 * d.price < chosen.cost_per_hour - 1e-9
    ]
    assert len(cheaper) >= 5
    for pools in cheaper:
        assert replayed_share(pools, requests, planned) < 0.99, pools


@pytest.mark.parametrize(
    ("rate", "prompt", "output"),
    [
        (1, 4000, 200),
        (2, 4000, 200),
        (5, 4000, 200),
        (1, 12000, 350),
        (8, 12000, 350),
        (0.5, 2000, 800),
        (1, 2000, 800),
    ],
)
def test_steady_poisson_loads_keep_the_queueing_model_s_plan(
    rate: float, prompt: int, output: int
) -> None:
    """Where arrivals are what the queueing model assumes, its plan holds when replayed: one
    replay, nothing grown. (Checked at the mean batch, as before, 5 of these 7 plans had too
    little decode: 50-87% of the requests met the ITL target as planned.)"""
    planned, search = plan_and_search(steady(rate, prompt, output))
    assert search.planned.both >= 0.99
    assert search.chosen.plan.pools == planned.pools and search.replays == 1


def test_decode_is_planned_for_the_batch_s_swing_not_its_mean() -> None:
    """At 2 requests/s one S5000 decode replica runs a mean step of 15.7 ms, under the 20 ms
    target, but the batch swings around its mean, and the requests decoded in the larger
    batches see slower steps: replayed, under 90% meet the target. The planner checks the step
    that 99% of the requests meet, and plans a second replica."""
    requests = steady(2.0)
    workload = workload_of(requests)
    s5000 = CANDIDATES[0]
    assert decode_itl_at([s5000], [1], GLM_45_FP8, workload, share=0.5) < SLO.itl_ms
    assert decode_itl_at([s5000], [1], GLM_45_FP8, workload, share=0.99) > SLO.itl_ms
    planned, _ = plan_and_search(requests)
    one = (PoolPlan("prefill", s5000, 1), PoolPlan("decode", s5000, 1))
    assert replayed_share(one, requests, planned) < 0.9
    assert [(p.role, p.replicas) for p in planned.pools if p.candidate == s5000] == [
        ("prefill", 1),
        ("decode", 2),
    ]


def test_the_share_left_out_is_the_one_no_candidate_serves_in_time() -> None:
    """One prompt in 50 is 80K tokens: an S5000 replica cannot prefill it within 6 s, an H200
    one can. The search plans subsets of the candidates too (S5000 alone leaves those prompts
    out), but what it reports as left out is what the fastest of all candidates misses."""
    requests = [
        Request(r.arrival_s, 80_000 if k % 50 == 0 else r.input_tokens, r.output_tokens)
        for k, r in enumerate(steady(1.0))
    ]
    s5000_only = plan(workload_of(requests), SLO, GLM_45_FP8, CANDIDATES[:1])
    assert s5000_only is not None and s5000_only.infeasible_share > 0.01
    planned, search = plan_and_search(requests)
    assert planned.infeasible_share == search.chosen.plan.infeasible_share == 0


def test_pdctl_plan_replay_prints_and_deploys_the_grown_plan(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = write_trace(tmp_path / "bursty.jsonl", bursty())
    common = ["plan", "--trace", str(trace), *CANDIDATE_FLAGS]

    assert main([*common, "--replay"]) == 0
    out, err = capsys.readouterr()
    assert "as planned  prefill mtt-s5000 x1" in out
    assert "chosen      prefill" in out
    assert "the queueing model (the mean rate, Poisson arrivals) planned too few" in out
    assert err.count("pdctl plan: replayed ") >= 2  # each replay said as it ends

    assert main([*common, "--replay", "-o", "json"]) == 0
    found = json.loads(capsys.readouterr().out)
    replay = found["replay"]
    assert replay["met"] and replay["steps"][-1]["both"] >= 0.99
    assert replay["planned"]["both"] < 0.9
    chosen = {f"{p['role']}/{p['profile']}": p["replicas"] for p in found["pools"]}
    assert chosen == replay["steps"][-1]["pools"]

    assert main([*common, "--replay", "-o", "yaml"]) == 0
    spec = parse_pddeployment(yaml.safe_load(capsys.readouterr().out)).spec
    deployed = {
        f"{role}/{p.accelerator.profile}": p.replicas.max - 2
        for role in ("prefill", "decode")
        for p in spec.pools(role)
    }
    assert deployed == chosen

    # Without --replay the table says that only the queueing model checked it.
    assert main(common) == 0
    assert "--replay replays the trace through it" in capsys.readouterr().out


def test_pdctl_plan_replay_short_of_cards_says_which_flag_to_change(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = write_trace(tmp_path / "bursty.jsonl", bursty())
    # 16 S5000 cards: one replica per role, and the bursts need more.
    args = ["plan", "--trace", str(trace), "--candidate", "mtt-s5000:max=16", "--replay"]
    assert main(args) == 1
    err = capsys.readouterr().err
    assert "no replayed plan meets the share with the candidates at their limits" in err
    assert "--candidate PROFILE:max=N" in err
    # No document to apply comes out of a plan that misses.
    assert main([*args, "-o", "yaml"]) == 1
    assert capsys.readouterr().out == ""


def test_pdctl_plan_replay_without_a_trace_replays_a_poisson_load_of_the_flags(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The queueing model checked against a load of its own assumptions: 2 requests/s of 4K
    prompts, with one S5000 decode replica's batch swinging past the ITL target at its mean,
    is planned with two, and the replay confirms it as planned."""
    flags = ["--rate", "2", "--input-tokens", "4000", "--output-tokens", "200", *CANDIDATE_FLAGS]
    assert main(["plan", *flags, "--replay", "--duration", "600", "-o", "json"]) == 0
    found = json.loads(capsys.readouterr().out)
    replay = found["replay"]
    assert replay["met"] and replay["replays"] == 1
    assert 1100 <= replay["requests"] <= 1300  # Poisson arrivals at 2/s for 600 s
    assert replay["steps"][-1]["pools"] == {"prefill/mtt-s5000": 1, "decode/mtt-s5000": 2}


def test_a_slower_kv_fabric_is_planned_and_replayed_with_its_hand_off_in_the_ttft() -> None:
    """`pdctl plan --kv-link`: each 4K prompt's KV cache crosses the fabric inside its TTFT.
    At 1 GB/s that hand-off takes most of a second, so the plan predicts a TTFT that much longer,
    and its replay hands KV over the same link: under a 500 ms target the same pools meet it
    with the default fabric and miss it over 1 GB/s."""
    requests = steady(0.5)[:120]
    workload = workload_of(requests)
    fast = plan(workload, SLO, GLM_45_FP8, CANDIDATES)
    slow = plan(workload, SLO, GLM_45_FP8, CANDIDATES, link_bytes_per_second=1e9)
    assert fast is not None and slow is not None
    assert slow.link_bytes_per_second == 1e9
    assert slow.ttft_ms > fast.ttft_ms + 500

    def first_replay_meeting_ttft(link: float) -> float:
        sized = dataclasses.replace(
            fast, link_bytes_per_second=link, target=Target(ttft_ms=500, itl_ms=SLO.itl_ms)
        )
        steps: list[Replayed] = []
        # No dearer plan is worth replaying: the plan's own pools are replayed once.
        replay_plan(
            sized,
            requests,
            GLM_45_FP8,
            model_name=MODEL_NAME,
            progress=steps.append,
            below_cost=sized.cost_per_hour + 1e-6,
        )
        return steps[0].ttft

    assert first_replay_meeting_ttft(100e9) > 0.9
    assert first_replay_meeting_ttft(1e9) < 0.1


def test_pdctl_plan_names_the_fabric_when_the_hand_off_alone_misses_the_ttft(
    capsys: pytest.CaptureFixture[str],
) -> None:
    argv = ["plan", "--rate", "4", "--input-tokens", "6000", "--output-tokens", "300"]
    argv += ["--ttft-ms", "2000", *CANDIDATE_FLAGS]
    assert main([*argv, "--kv-link", "1"]) == 0
    assert "KV hand-off over 1 GB/s" in capsys.readouterr().out
    assert main([*argv, "--kv-link", "0.19"]) == 1
    err = capsys.readouterr().err
    assert "of it the KV hand-off over 0.19 GB/s" in err and "--kv-link" in err
