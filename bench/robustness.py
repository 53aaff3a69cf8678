"""pd-operator, the baselines and the oracle on scenarios drawn from workload families.

    .venv/bin/python bench/robustness.py [--seed 1] [--scenarios 40] [--duration 900]
        [--warmup 300] [--jobs 2] [--only ID ...] [--json PATH] [--from PATH | --examples]
        [--oracle-cache FILE] [--buckets {engine,at-targets}] [--explain]

Draws `--scenarios` scenarios from `sim.families` (every family with every arrival shape in
turn; rate, burstiness, lengths, prefix reuse and deployment drawn; deterministic from
`--seed`) and runs each through the offline simulator as bench/windows.py runs a window:
`--warmup` seconds uncounted, then `--duration` measured, TTFT 6 s and ITL 20 ms at P99,
with `pd-operator`, every baseline (static-peak, hpa, dynamo-sla, llm-d-slo) and the oracle.
One row per scenario: its parameters, the oracle's attainment and card-hours, each policy's
attainment of the feasible requests and card-hours against the oracle's, pd-operator's mean
prefill/decode replicas against the oracle's, the verdict as bench/windows.py judges a
window (>= 0.99 and <= 1.15x the oracle), and the baselines that dominate pd-operator (reach
its attainment with fewer card-hours). Then the totals with the issue's targets beside them.

`--json PATH` writes the scenarios (and each policy's results) to PATH; `--from PATH` reruns
the scenarios of such a file instead of drawing; `--only ID` runs only the scenarios named
(repeatable), e.g. `--seed 2 --only 2-17 --explain` prints why pd-operator and the oracle
scaled. `--examples` runs the two shapes issue #29 names instead (`sim.families.examples`).
`--oracle-cache FILE` keeps the oracle's results per scenario, as bench/windows.py does:
delete it when the simulator changes. `--buckets at-targets` has the simulated engines export
TTFT and ITL histograms with bounds at the targets and at 0.85 of them, as a user may give
SGLang in `spec.model.args` (core.histogram_bounds.at_target; pd-operator assumes them; the
operator does not set them itself), where `engine` (the default) keeps the engine's own bounds
(vLLM's: none at 20 ms); the oracle's search reads no
histogram, so its cache serves both. 5 to 6 minutes per seed on two cores at the defaults (the
oracle's search is 85% of it); about 1 minute with the oracle cached.
"""

import argparse
import hashlib
import itertools
import json
import statistics
import sys
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from policies import ATTAINMENT_TARGET, ORACLE_RATIO_TARGET, rivals_against
from windows import RIVALS

from pd_operator.cli.arguments import POSITIVE
from pd_tools.replay.families import Scenario, draw_scenarios, examples
from pd_tools.replay.offline import BUCKETS, Buckets, simulate
from pd_tools.replay.results import SimResult

POLICIES = ("pd-operator", *RIVALS)
# The targets over all scenarios.
SHARE_TARGET = 0.95  # of scenarios with attainment >= ATTAINMENT_TARGET
MEDIAN_TARGET = 1.10  # median card-hours over the oracle's
P90_TARGET = 1.25


@dataclass(frozen=True)
class Outcome:
    """What one policy did on one scenario."""

    attained: float  # share of the feasible requests within both SLOs
    card_hours: float
    actions: int
    replicas: tuple[float, float]  # mean prefill and decode replicas over the window
    requests: int
    infeasible: int
    rejected: int
    wall_s: float
    changes: tuple[str, ...] = ()


def mean_replicas(result: SimResult) -> tuple[float, float]:
    """Time-weighted mean replicas each role asked for over the measured window."""
    end = max(result.end_s, 1e-9)
    totals = {"prefill": 0.0, "decode": 0.0}
    steps = [*result.timeline, (end, {})]
    for (t, replicas), (after, _) in itertools.pairwise(steps):
        span = max(0.0, min(after, end) - t)
        for pool, count in replicas.items():
            totals[pool.split("/")[0]] += count * span
    return totals["prefill"] / end, totals["decode"] / end


def run(scenario: Scenario, policy: str, explain: bool, buckets: Buckets = "engine") -> Outcome:
    """One policy on one scenario."""
    result = simulate(
        scenario.spec(),
        scenario.requests(),
        policy,
        model=scenario.model,
        warmup_s=scenario.warmup_s,
        buckets=buckets,
    )
    return Outcome(
        result.attainment()["feasible"],
        sum(result.card_hours.values()),
        result.scale_actions,
        mean_replicas(result),
        result.requests,
        result.infeasible,
        result.rejected,
        result.wall_s,
        tuple(result.change_lines()) if explain else (),
    )


def cache_key(scenario: Scenario) -> str:
    text = json.dumps(scenario.to_json(), sort_keys=True)
    return f"{scenario.id}|{hashlib.sha256(text.encode()).hexdigest()[:16]}"


def verdict(attained: float, ratio: float) -> str:
    """bench/windows.py's judgement of one window: both targets, or which are missed."""
    missed = [
        name
        for name, ok in (
            ("SLO", attained >= ATTAINMENT_TARGET),
            ("cost", ratio <= ORACLE_RATIO_TARGET),
        )
        if not ok
    ]
    return "yes" if not missed else "no: " + ", ".join(missed)


def percentile(values: Sequence[float], share: float) -> float:
    """Linear interpolation between closest ranks (numpy's default)."""
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    position = share * (len(ordered) - 1)
    low = int(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def scenario_arguments(parser: argparse.ArgumentParser) -> None:
    """The options that draw the scenarios and run them (bench/removal_bench.py has them too)."""
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--scenarios", type=int, default=40)
    parser.add_argument(
        "--duration", type=POSITIVE.for_argparse, default=900.0, help="measured seconds"
    )
    parser.add_argument("--warmup", type=float, default=300.0, help="uncounted seconds first")
    parser.add_argument("--jobs", type=int, default=2)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    scenario_arguments(parser)
    parser.add_argument("--only", action="append", default=[], help="a scenario id, e.g. 1-07")
    parser.add_argument("--json", type=Path, help="write the scenarios and results here")
    parser.add_argument(
        "--from",
        dest="source",
        type=Path,
        help="rerun the scenarios of a --json file (--seed, --scenarios, --duration and"
        " --warmup are then the file's)",
    )
    parser.add_argument(
        "--examples",
        action="store_true",
        help="run the two shapes issue #29 names (chat at 60 rps in waves, reasoning at 20 rps)"
        " instead of drawing",
    )
    parser.add_argument("--oracle-cache", type=Path)
    parser.add_argument(
        "--buckets",
        choices=list(BUCKETS),
        default="engine",
        help="the engines' TTFT and ITL histogram bounds: the engine's own, or with the targets"
        " among them",
    )
    parser.add_argument("--explain", action="store_true", help="print why each run scaled")
    args = parser.parse_args(argv)
    if args.scenarios < 1:
        parser.error("argument --scenarios: need at least 1")
    if args.warmup < 0:
        parser.error("argument --warmup: must not be negative")
    if args.source and args.examples:
        parser.error("argument --examples: not with --from")
    scenarios = _scenarios(args, parser)
    cache: dict[str, dict[str, Any]] = {}
    if args.oracle_cache and args.oracle_cache.is_file():
        cache = json.loads(args.oracle_cache.read_text())
    started = time.perf_counter()
    results = run_all(scenarios, cache, jobs=args.jobs, explain=args.explain, buckets=args.buckets)
    wall = time.perf_counter() - started
    if args.oracle_cache:
        args.oracle_cache.write_text(json.dumps(cache, indent=1, sort_keys=True) + "\n")
    source = (
        f"from {args.source}"
        if args.source
        else "issue #29's examples"
        if args.examples
        else f"seed {args.seed}"
    )
    print(
        f"{len(scenarios)} scenarios ({source}), each {scenarios[0].warmup_s:.0f} s warm-up"
        f" then {scenarios[0].duration_s:.0f} s measured; TTFT 6 s and ITL 20 ms at P99;"
        f" histogram bounds: {args.buckets}"
    )
    print()
    print_table(scenarios, results)
    print()
    print_totals(scenarios, results)
    cpu = {
        p: sum(o.wall_s for (_, q), o in results.items() if q == p) for p in ("oracle", *POLICIES)
    }
    print()
    print(
        f"took {wall:.0f} s wall on {args.jobs} worker(s); simulation seconds per policy: "
        + ", ".join(f"{p} {s:.0f}" for p, s in cpu.items())
        + (" (the oracle's from the cache)" if not cpu["oracle"] else "")
    )
    if args.explain:
        for scenario in scenarios:
            for policy in ("pd-operator", "oracle"):
                outcome = results[(scenario.id, policy)]
                print(f"\n{scenario.id} {policy}: scale changes (s from the window's start)")
                print("\n".join(outcome.changes) or "  none")
    if args.json:
        write_json(args.json, args.seed, scenarios, results, args.buckets)
    return 0


def _scenarios(args: argparse.Namespace, parser: argparse.ArgumentParser) -> list[Scenario]:
    """The scenarios drawn from --seed or read --from a file, less those --only leaves out."""
    if args.source:
        try:
            data = json.loads(args.source.read_text())
            scenarios = [Scenario.from_json(entry["scenario"]) for entry in data["scenarios"]]
        except (OSError, ValueError, KeyError, TypeError) as error:
            parser.error(f"argument --from: {args.source}: {error}")
    elif args.examples:
        scenarios = examples(duration_s=args.duration, warmup_s=args.warmup)
    else:
        scenarios = draw_scenarios(
            args.seed, args.scenarios, duration_s=args.duration, warmup_s=args.warmup
        )
    if args.only:
        unknown = sorted(set(args.only) - {s.id for s in scenarios})
        if unknown:
            parser.error(f"argument --only: no scenario {', '.join(unknown)}")
        scenarios = [s for s in scenarios if s.id in args.only]
    return scenarios


def run_all(
    scenarios: Sequence[Scenario],
    cache: dict[str, dict[str, Any]],
    *,
    jobs: int,
    explain: bool,
    buckets: Buckets = "engine",
) -> dict[tuple[str, str], Outcome]:
    """Every policy on every scenario, the oracle first (the longest runs) unless `cache`
    holds its result (`cache` gains the oracle's fresh ones), in a pool of `jobs` processes;
    `buckets`: the engines' histogram bounds (`replay.offline.BUCKETS`)."""
    runs = [(s, "oracle") for s in scenarios if explain or cache_key(s) not in cache]
    runs += [(s, p) for s in scenarios for p in POLICIES]
    with ProcessPoolExecutor(max_workers=max(1, jobs)) as pool:
        futures = {(s.id, p): pool.submit(run, s, p, explain, buckets) for s, p in runs}
        results = {key: future.result() for key, future in futures.items()}
    for scenario in scenarios:
        fresh = results.get((scenario.id, "oracle"))
        if fresh is not None:
            cache[cache_key(scenario)] = _plain(fresh)
        else:
            results[(scenario.id, "oracle")] = _outcome(cache[cache_key(scenario)])
    return results


def write_json(
    path: Path,
    seed: int,
    scenarios: Sequence[Scenario],
    results: Mapping[tuple[str, str], Outcome],
    buckets: Buckets = "engine",
) -> None:
    """The scenarios (what `--from` reads) with each policy's results and the histogram
    bounds they ran with."""
    entries = [
        {
            "scenario": s.to_json(),
            "description": s.short(),
            "results": {p: _plain(results[(s.id, p)]) for p in ("oracle", *POLICIES)},
        }
        for s in scenarios
    ]
    document = {"seed": seed, "buckets": buckets, "scenarios": entries}
    path.write_text(json.dumps(document, indent=1) + "\n")


def _plain(outcome: Outcome) -> dict[str, Any]:
    return {
        "attained": outcome.attained,
        "card_hours": outcome.card_hours,
        "actions": outcome.actions,
        "replicas": list(outcome.replicas),
        "requests": outcome.requests,
        "infeasible": outcome.infeasible,
        "rejected": outcome.rejected,
        "wall_s": outcome.wall_s,
    }


def _outcome(data: Mapping[str, Any]) -> Outcome:
    """An outcome read back from the oracle cache (its run time spent earlier: 0 now)."""
    return Outcome(**{**data, "replicas": tuple(data["replicas"]), "wall_s": 0.0})


def dominated_by(results: Mapping[tuple[str, str], Outcome], scenario: str) -> list[str]:
    """The baselines reaching pd-operator's attainment with fewer card-hours (bench/policies.py's
    rule, 1% card-hours counting as a tie)."""
    ours = results[(scenario, "pd-operator")]
    others = {
        p: (results[(scenario, p)].attained, results[(scenario, p)].card_hours) for p in RIVALS
    }
    cheaper, _ = rivals_against(ours.attained, ours.card_hours, others)
    return cheaper


def print_table(scenarios: Sequence[Scenario], results: Mapping[tuple[str, str], Outcome]) -> None:
    columns = [
        "id",
        "scenario",
        "oracle",
        "pd-operator",
        "P/D replicas vs oracle",
        "verdict",
        *RIVALS,
        "dominated by",
    ]
    print("| " + " | ".join(columns) + " |")
    print("|" + "---|" * len(columns))
    for scenario in scenarios:
        oracle = results[(scenario.id, "oracle")]
        ours = results[(scenario.id, "pd-operator")]
        ratio = ours.card_hours / max(1e-9, oracle.card_hours)

        def cell(policy: str, oracle: Outcome = oracle, scenario: Scenario = scenario) -> str:
            outcome = results[(scenario.id, policy)]
            x = outcome.card_hours / max(1e-9, oracle.card_hours)
            return f"{outcome.attained:.3f} {x:.2f}x"

        skipped = ours.infeasible + ours.rejected
        infeasible = f" ({skipped / max(1, ours.requests):.0%} infeasible)" if skipped else ""
        row = [
            scenario.id,
            scenario.short() + infeasible,
            f"{oracle.attained:.3f} {oracle.card_hours:.1f} ch",
            cell("pd-operator"),
            f"{ours.replicas[0]:.1f}/{ours.replicas[1]:.1f} vs"
            f" {oracle.replicas[0]:.1f}/{oracle.replicas[1]:.1f}",
            verdict(ours.attained, ratio),
            *(cell(p) for p in RIVALS),
            ", ".join(dominated_by(results, scenario.id)) or "-",
        ]
        print("| " + " | ".join(row) + " |")


def print_totals(scenarios: Sequence[Scenario], results: Mapping[tuple[str, str], Outcome]) -> None:
    """Per policy: the share of scenarios at >= 99%, the median and P90 card-hours over the
    oracle's; then pd-operator's against the issue's targets and the dominated scenarios."""
    n = len(scenarios)
    print(
        "| policy | attainment >= 0.99 | median x oracle | P90 x oracle | both (windows' verdict) |"
    )
    print("|---|---|---|---|---|")
    summary: dict[str, tuple[float, float, float]] = {}
    for policy in ("oracle", *POLICIES):
        outcomes = [(s, results[(s.id, policy)]) for s in scenarios]
        ratios = [
            o.card_hours / max(1e-9, results[(s.id, "oracle")].card_hours) for s, o in outcomes
        ]
        good = sum(o.attained >= ATTAINMENT_TARGET for _, o in outcomes)
        both = sum(
            o.attained >= ATTAINMENT_TARGET and r <= ORACLE_RATIO_TARGET
            for (_, o), r in zip(outcomes, ratios, strict=True)
        )
        median, p90 = statistics.median(ratios), percentile(ratios, 0.9)
        summary[policy] = (good / n, median, p90)
        print(f"| {policy} | {good}/{n} ({good / n:.0%}) | {median:.2f} | {p90:.2f} | {both}/{n} |")
    share, median, p90 = summary["pd-operator"]
    dominated = [(s, dominated_by(results, s.id)) for s in scenarios]
    dominated = [(s, by) for s, by in dominated if by]
    print()
    print("pd-operator against the targets:")
    print(
        f"* attainment >= 0.99 in {share:.0%} of scenarios (target >= {SHARE_TARGET:.0%}: "
        + ("met)" if share >= SHARE_TARGET else "missed)")
    )
    print(
        f"* card-hours over the oracle's: median {median:.2f}x (target <= {MEDIAN_TARGET:.2f}:"
        + (" met)" if median <= MEDIAN_TARGET else " missed)")
        + f", P90 {p90:.2f}x (target <= {P90_TARGET:.2f}:"
        + (" met)" if p90 <= P90_TARGET else " missed)")
    )
    print(
        f"* dominated (a baseline at least as good and cheaper) in {len(dominated)} scenarios"
        " (target: none)" + (":" if dominated else "")
    )
    for scenario, by in dominated:
        print(f"  * {scenario.id} {scenario.short()}: {', '.join(by)}")
    floor = {s.id for s in scenarios if results[(s.id, "oracle")].replicas == (1.0, 1.0)}
    print(
        f"* {len(floor)} of {n} scenarios need one replica per role throughout (the oracle never"
        " leaves it): they judge only that a policy does not scale beyond it"
    )
    scaling = [s for s in scenarios if s.id not in floor]
    if scaling and floor:
        ours = [results[(s.id, "pd-operator")] for s in scaling]
        ratios = [
            o.card_hours / max(1e-9, results[(s.id, "oracle")].card_hours)
            for s, o in zip(scaling, ours, strict=True)
        ]
        good = sum(o.attained >= ATTAINMENT_TARGET for o in ours)
        print(
            f"* on the other {len(scaling)}: attainment >= 0.99 in {good}"
            f" ({good / len(scaling):.0%}), card-hours median {statistics.median(ratios):.2f}x, P90"
            f" {percentile(ratios, 0.9):.2f}x the oracle's"
        )


if __name__ == "__main__":
    sys.exit(main())
