"""Offline simulator warm-up: what happens before the measured window runs but is not counted."""

import json
from collections.abc import Mapping
from dataclasses import dataclass, replace

import pytest

from pd_operator.api.document import parse_pddeployment
from pd_operator.api.spec import PDDeploymentSpec
from pd_operator.core.children import PoolKey
from pd_operator.core.hardware import GLM_45_FP8
from pd_tools.cli.main import main
from pd_tools.replay.baselines import StaticPeak, View
from pd_tools.replay.example import example_document
from pd_tools.replay.offline import simulate
from pd_tools.workloads.traces import (
    ReplayOptions,
    Request,
    TokenLengths,
    constant_rate,
    step_rate,
    synthetic_requests,
)

PREFILL: PoolKey = ("prefill", "s5000")
DECODE: PoolKey = ("decode", "h200")


def spec(percentile: str = "P50") -> PDDeploymentSpec:
    return parse_pddeployment(example_document(percentile=percentile)).spec


def light(duration_s: float, seed: int = 2) -> list[Request]:
    lengths = TokenLengths(2000, 100, 1.0, 1.0)
    return list(synthetic_requests(constant_rate(0.5, duration_s), lengths, seed=seed))


@dataclass
class Scripted:
    """Two prefill replicas until 300 s, three after; one decode replica."""

    name: str = "scripted"
    interval_s: float = 30.0
    warm_up: bool = True

    def decide(self, view: View) -> Mapping[PoolKey, int]:
        return {PREFILL: 2 if view.now < 300 else 3, DECODE: 1}


def test_warm_up_requests_actions_and_card_hours_are_not_counted() -> None:
    requests = light(600)
    result = simulate(spec(), requests, Scripted(), model=GLM_45_FP8, warmup_s=200)
    measured = [r for r in requests if r.arrival_s >= 200]
    assert result.requests == len(measured)
    assert [o.arrival_s for o in result.outcomes] == pytest.approx(
        [r.arrival_s - 200 for r in measured]
    )
    # 1 -> 2 prefill replicas at 30 s is in the warm-up; 2 -> 3 at 300 s is counted.
    assert result.scale_actions == 1
    assert simulate(spec(), requests, Scripted(), model=GLM_45_FP8).scale_actions == 2
    assert result.timeline == [
        (0.0, {"prefill/s5000": 2, "decode/h200": 1}),
        (100.0, {"prefill/s5000": 3, "decode/h200": 1}),
    ]
    # Cards from the end of the warm-up only: 16 S5000 cards for 100 s, then 24; 8 H200.
    end = result.end_s
    assert end > measured[-1].arrival_s - 200  # cards count until the last request is served
    assert result.card_hours["h200"] == pytest.approx(8 * end / 3600)
    assert result.card_hours["mtt-s5000"] == pytest.approx((16 * 100 + 24 * (end - 100)) / 3600)


def test_a_fixed_deployment_after_a_warm_up_costs_what_it_costs_from_the_start() -> None:
    requests = light(900)
    fixed = {PREFILL: 1, DECODE: 1}
    whole = simulate(spec(), requests, StaticPeak(fixed), model=GLM_45_FP8)
    warm = simulate(spec(), requests, StaticPeak(fixed), model=GLM_45_FP8, warmup_s=300)
    assert warm.end_s == pytest.approx(whole.end_s - 300)
    for kind, hours in whole.card_hours.items():
        assert warm.card_hours[kind] == pytest.approx(hours - 8 * 300 / 3600)
    # Same requests, same engine: the measured ones meet the SLO the same way.
    assert warm.outcomes == [
        replace(o, arrival_s=o.arrival_s - 300) for o in whole.outcomes if o.arrival_s >= 300
    ]


def test_a_policy_cold_at_the_start_is_warm_when_the_window_begins() -> None:
    """Long, varied prompts: the starting size (the first 5 minutes' mean prompt) is too small.
    Cold, the operator's policy loses the window's first minutes growing; after a warm-up it
    enters the window at the size the load needs."""
    lengths = TokenLengths(20000, 300, 1.5, 1.0)
    requests = list(synthetic_requests(constant_rate(1.0, 900), lengths, seed=1))
    window = [replace(r, arrival_s=r.arrival_s - 300) for r in requests if r.arrival_s >= 300]
    cold = simulate(spec(), window, "pd-operator", model=GLM_45_FP8)
    warm = simulate(spec(), requests, "pd-operator", model=GLM_45_FP8, warmup_s=300)
    assert warm.requests == cold.requests
    assert warm.timeline[0][1]["prefill/s5000"] > cold.timeline[0][1]["prefill/s5000"]
    assert warm.attainment()["feasible"] > cold.attainment()["feasible"] + 0.1
    assert warm.attainment()["feasible"] >= 0.95


def test_static_peak_is_sized_on_the_measured_window_only() -> None:
    """A busy warm-up does not enlarge static-peak: it is sized for the window it is judged on."""
    lengths = TokenLengths(8000, 300, 1.0, 1.0)
    requests = list(synthetic_requests(step_rate([4.0, 0.5, 0.5], 300), lengths, seed=4))
    window = [replace(r, arrival_s=r.arrival_s - 300) for r in requests if r.arrival_s >= 300]
    warm = simulate(spec(), requests, "static-peak", model=GLM_45_FP8, warmup_s=300)
    alone = simulate(spec(), window, "static-peak", model=GLM_45_FP8)
    busy = simulate(spec(), requests, "static-peak", model=GLM_45_FP8)
    assert warm.timeline[0] == alone.timeline[0]
    assert busy.timeline[0][1]["prefill/s5000"] > warm.timeline[0][1]["prefill/s5000"]


def test_the_oracle_searches_the_warm_up_but_counts_from_the_window() -> None:
    requests = light(420)
    warm = simulate(spec(), requests, "oracle", model=GLM_45_FP8, warmup_s=120)
    assert warm.requests == sum(1 for r in requests if r.arrival_s >= 120)
    assert warm.attainment()["feasible"] >= 0.99
    assert sum(warm.card_hours.values()) == pytest.approx(16 * warm.end_s / 3600)


def test_a_negative_warm_up_is_refused() -> None:
    with pytest.raises(ValueError, match="warm-up"):
        simulate(spec(), light(60), "hpa", model=GLM_45_FP8, warmup_s=-1)


@pytest.mark.parametrize(
    ("options", "warmup", "replayed", "measured"),
    [
        (ReplayOptions(start_s=1800, duration_s=600), 300, (1500, 900), 1800),
        # Less than the warm-up before the start: replay from 0, the window moves to 300 s.
        (ReplayOptions(start_s=100, duration_s=600), 300, (0, 900), 300),
        (ReplayOptions(start_s=0, duration_s=None), 300, (0, None), 300),
        # Compressed replays: the warm-up is in replayed seconds.
        (ReplayOptions(start_s=0, duration_s=6000, time_compression=10), 60, (0, 6600), 600),
        (ReplayOptions(start_s=1000, duration_s=600), 0, (1000, 600), 1000),
    ],
)
def test_replay_options_with_a_warm_up(
    options: ReplayOptions,
    warmup: float,
    replayed: tuple[float, float | None],
    measured: float,
) -> None:
    warmed = options.with_warmup(warmup)
    assert (warmed.start_s, warmed.duration_s) == replayed
    assert options.measured_start_s(warmup) == measured


def test_the_example_deployment_declares_the_percentile_asked_for() -> None:
    assert spec().slo.ttft.percentile == "P50"
    p99 = spec("P99").slo
    assert (p99.ttft.percentile, p99.itl.percentile) == ("P99", "P99")
    assert (p99.ttft.target_milliseconds, p99.itl.target_milliseconds) == (6000, 20)


def test_pdctl_simulate_warm_up_leaves_the_window_s_requests(
    capsys: pytest.CaptureFixture[str],
) -> None:
    argv = ["sim", "replay", "--rate", "1", "--duration", "120", "--warmup", "60", "-o", "json"]
    assert main([*argv, "--policy", "hpa"]) == 0
    (summary,) = json.loads(capsys.readouterr().out)
    assert 80 <= summary["requests"] <= 160  # ~120 at 1/s: the window's, not the warm-up's
    assert summary["simulated_s"] >= 120
