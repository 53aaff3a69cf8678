"""Learning per pool against one factor per role, where a card is slower than its profile.

    .venv/bin/python bench/pool_learning.py [--rates 4,8,12,16] [--speeds 0.5,0.7] [--seeds 1,2]

GLM-4.5-FP8 with two prefill pools, as the issue #29 item 6 sets it: S5000 nodes first (at most
2 replicas) and H200 nodes as the spill-over, decode on H200; TTFT 6 s and ITL 20 ms at P99. The
S5000 cards really reach `--speeds` of the MFU their profile says (the profile the policy seeds
from is unchanged), the H200s reach theirs. The load: 4,000-token prompts and 200-token answers
(lognormal, CV 1), Poisson, 10 minutes at the rate, 10 at 1.6x, 10 at the rate; the first 300 s
are a warm-up. pd-operator runs twice on each: with each pool's signals (the engines' `pool`
label: each pool learns its own factor) and without (one factor per role, as without the label).
One row per (rate, speed, seed): attainment of the feasible requests, card-hours and the mean
replicas of each prefill pool, both ways. A few seconds in all.
"""

import argparse
import copy
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import replace

from pd_operator.api.document import parse_pddeployment
from pd_operator.api.spec import PDDeploymentSpec
from pd_operator.core.hardware import GLM_45_FP8, HARDWARE_PROFILES, MTT_S5000
from pd_tools.replay.example import example_document
from pd_tools.replay.fleet import Fleet
from pd_tools.replay.offline import simulate
from pd_tools.replay.results import SimResult
from pd_tools.workloads.traces import TokenLengths, step_rate, synthetic_requests

STEP_S = 600.0
WARMUP_S = 300.0


def two_prefill_pools() -> PDDeploymentSpec:
    """The example deployment with an H200 prefill pool beside the S5000 one."""
    document = example_document(percentile="P99")
    prefill = document["spec"]["prefill"]["pools"][0]
    prefill["replicas"] = {"min": 1, "max": 2}
    spill = copy.deepcopy(document["spec"]["decode"]["pools"][0])
    spill["name"] = "h200"
    spill["replicas"] = {"min": 0, "max": 16}
    document["spec"]["prefill"]["pools"] = [prefill, spill]
    return parse_pddeployment(document).spec


@contextmanager
def one_factor_per_role() -> Iterator[None]:
    """The replay's scrape without the `pool` label: the operator reads each role as a whole."""
    labels = Fleet.pool_labels
    Fleet.pool_labels = lambda self: None  # type: ignore[method-assign]
    try:
        yield
    finally:
        Fleet.pool_labels = labels  # type: ignore[method-assign]


def mean_replicas(result: SimResult, key: str) -> float:
    """A pool's replicas averaged over the measured time."""
    ends = [t for t, _ in result.timeline[1:]] + [result.end_s]
    total = sum(
        counts.get(key, 0) * (end - t)
        for (t, counts), end in zip(result.timeline, ends, strict=True)
    )
    return total / result.end_s if result.end_s > 0 else 0.0


def run(spec: PDDeploymentSpec, rate: float, speed: float, seed: int) -> dict[str, SimResult]:
    lengths = TokenLengths(4000, 200, input_cv=1.0, output_cv=1.0)
    requests = list(
        synthetic_requests(step_rate([rate, 1.6 * rate, rate], STEP_S), lengths, seed=seed)
    )
    hardware = {**HARDWARE_PROFILES, "mtt-s5000": replace(MTT_S5000, mfu=MTT_S5000.mfu * speed)}

    def replay() -> SimResult:
        return simulate(
            spec, requests, "pd-operator", model=GLM_45_FP8, warmup_s=WARMUP_S, hardware=hardware
        )

    per_pool = replay()
    with one_factor_per_role():
        per_role = replay()
    return {"per pool": per_pool, "per role": per_role}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rates", default="4,8,12,16", help="mean request rates (req/s)")
    parser.add_argument("--speeds", default="0.5,0.7", help="the S5000s' real MFU / profile's")
    parser.add_argument("--seeds", default="1,2", help="arrival and length draws")
    args = parser.parse_args(argv)
    spec = two_prefill_pools()
    header = (
        f"{'rate':>5} {'speed':>5} {'seed':>4} | {'per pool: att':>13} {'card-h':>7} "
        f"{'s5000':>5} {'h200':>5} | {'per role: att':>13} {'card-h':>7} {'s5000':>5} "
        f"{'h200':>5} | {'card-h':>7}"
    )
    print(header)
    print("-" * len(header))
    totals = {"per pool": [0.0, 0], "per role": [0.0, 0]}
    for rate in (float(r) for r in args.rates.split(",")):
        for speed in (float(s) for s in args.speeds.split(",")):
            for seed in (int(s) for s in args.seeds.split(",")):
                results = run(spec, rate, speed, seed)
                cells = []
                for name, result in results.items():
                    attainment = result.attainment()["feasible"]
                    hours = sum(result.card_hours.values())
                    totals[name][0] += hours
                    totals[name][1] += attainment >= 0.99
                    cells.append(
                        f"{attainment:>13.4f} {hours:>7.2f} "
                        f"{mean_replicas(result, 'prefill/s5000'):>5.2f} "
                        f"{mean_replicas(result, 'prefill/h200'):>5.2f}"
                    )
                ratio = sum(results["per pool"].card_hours.values()) / sum(
                    results["per role"].card_hours.values()
                )
                print(
                    f"{rate:>5g} {speed:>5g} {seed:>4} | {cells[0]} | {cells[1]} | {ratio:>6.3f}x"
                )
    print("-" * len(header))
    for name, (hours, met) in totals.items():
        print(f"{name}: {hours:.2f} card-hours in all, attainment >= 0.99 in {met} runs")
    return 0


if __name__ == "__main__":
    sys.exit(main())
