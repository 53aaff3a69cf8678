"""Every autoscaling policy on every trace: SLO attainment, card-hours, cost, scale actions.

    .venv/bin/python bench/policies.py [TRACE ...] [--start 0] [--duration 600] [--warmup 300]
        [--percentile P99] [--rate-scale 1] [--seed 0] [--csv out.csv]

Without paths it runs every trace in ../shared/traces. Each trace is measured over `--duration`
seconds (a window from `--start`) through the offline simulator with the example deployment
(MTT S5000 prefill, H200 decode, GLM-4.5-FP8, replicas of 8 cards, TTFT 6 s and ITL 20 ms at
`--percentile`, P99 by default: the objective measured is ">= 99% of requests", a P99 one).
The `--warmup` seconds before the window are replayed first through the same simulation and
policy, uncounted, so every policy enters the window warm, as a continuously running operator
would; where the trace has less before `--start`, the window moves to `--warmup` seconds in.
A `--rate-scale` other than 1 keeps or copies requests at random, and ServeGen's arrivals are
drawn from its rates: `--seed` picks the draw.
ServeGen aggregates are rate curves over 14 days: they are replayed 144x faster (one day per
10 minutes) and scaled to `--servegen-rps` mean requests per second (times `--rate-scale`).
Prints a markdown table; `--csv` also writes CSV.
Then, per trace, the issue's targets for `pd-operator`: >= 99% of the feasible requests within
both SLOs, card-hours <= 1.15x the oracle's, and fewer card-hours than every other policy
that reaches the same attainment (printed, never asserted: a benchmark, not a test), with
what `prescient` (the oracle's search with every replica started one model load ahead)
attains at what multiple of the oracle's card-hours. Its excess over the oracle is the
model-load time's own cost, which no policy avoids; what `pd-operator` needs beyond it is the
cost of not knowing the load in advance.
"""

import argparse
import csv
import sys
from collections.abc import Mapping
from pathlib import Path

from pd_operator.api.document import parse_pddeployment
from pd_operator.api.spec import PERCENTILE_SHARES, PDDeploymentSpec
from pd_operator.cli.arguments import NON_NEGATIVE, POSITIVE
from pd_operator.core.hardware import GLM_45_FP8
from pd_tools.enginesim.engine import ROUTINGS
from pd_tools.replay.example import example_document
from pd_tools.replay.offline import (
    PEAK_WINDOW_S,
    POLICY_NAMES,
    check_policy_name,
    load_trace,
    simulate,
)
from pd_tools.replay.results import TABLE_COLUMNS, SimResult, markdown_table, table_row
from pd_tools.workloads.traces import ReplayOptions

TRACES = Path(__file__).resolve().parents[2] / "shared" / "traces"
SERVEGEN_COMPRESSION = 144.0  # one day of windows per 10 replayed minutes
SERVEGEN_MEAN_RPS = 1790.0  # the m-mid aggregate's mean; m-small's is close enough for scaling
COLUMNS = ("trace", *TABLE_COLUMNS)


def _options(
    path: Path,
    start: float,
    duration: float,
    servegen_rps: float,
    rate_scale: float,
    *,
    seed: int = 0,
) -> ReplayOptions:
    if "servegen" in path.name:
        return ReplayOptions(
            start_s=start * SERVEGEN_COMPRESSION,
            duration_s=duration * SERVEGEN_COMPRESSION,
            rate_scale=rate_scale * servegen_rps / SERVEGEN_MEAN_RPS / SERVEGEN_COMPRESSION,
            time_compression=SERVEGEN_COMPRESSION,
            seed=seed,
        )
    return ReplayOptions(start_s=start, duration_s=duration, rate_scale=rate_scale, seed=seed)


ATTAINMENT_TARGET = 0.99
ORACLE_RATIO_TARGET = 1.15
TIE = 0.01  # card-hours within 1% count as the same
# Bounds computed with knowledge of the trace: references, not rivals.
HINDSIGHT = ("oracle", "prescient")


def rivals_against(
    attained: float, hours: float, others: Mapping[str, tuple[float, float]]
) -> tuple[list[str], list[str]]:
    """The policies (not pd-operator, nor a hindsight bound) among `others` (attainment,
    card-hours) that reach `attained`: those with fewer card-hours than `hours`, and those
    with the same (within TIE)."""
    rivals = {
        name: their_hours
        for name, (their_attained, their_hours) in others.items()
        if name not in ("pd-operator", *HINDSIGHT) and their_attained >= attained
    }
    cheaper = [name for name, h in rivals.items() if h < hours * (1 - TIE)]
    tied = [name for name, h in rivals.items() if abs(h - hours) <= hours * TIE]
    return cheaper, tied


def targets(results: Mapping[str, SimResult]) -> str:
    """The issue's targets for pd-operator on one trace, as a line of text."""
    ours = results.get("pd-operator")
    if ours is None:
        return "pd-operator not run"
    hours = sum(ours.card_hours.values())
    attained = ours.attainment()["feasible"]
    parts = [f"pd-operator attains {attained:.3f} of feasible requests"]
    parts[-1] += " (target >= 0.99: " + ("met)" if attained >= ATTAINMENT_TARGET else "missed)")
    oracle = results.get("oracle")
    if oracle is not None:
        ratio = hours / max(1e-9, sum(oracle.card_hours.values()))
        verdict = "met" if ratio <= ORACLE_RATIO_TARGET else "missed"
        parts.append(f"card-hours {ratio:.2f}x the oracle's (target <= 1.15: {verdict})")
    prescient = results.get("prescient")
    if oracle is not None and prescient is not None:
        ratio = sum(prescient.card_hours.values()) / max(1e-9, sum(oracle.card_hours.values()))
        foreseen = prescient.attainment()["feasible"]
        parts.append(f"a perfect forecast with the model load: {foreseen:.3f} at {ratio:.2f}x")
    cheaper, tied = rivals_against(
        attained,
        hours,
        {
            name: (other.attainment()["feasible"], sum(other.card_hours.values()))
            for name, other in results.items()
        },
    )
    if cheaper:
        parts.append(f"{', '.join(cheaper)} reach(es) that attainment with fewer card-hours")
    else:
        parts.append("no other policy reaches that attainment with fewer card-hours")
    if tied:
        parts[-1] += f" ({', '.join(tied)}: the same card-hours)"
    return "; ".join(parts)


def header(spec: PDDeploymentSpec, warmup: float, rate_scale: float, windows: list[str]) -> str:
    """What the table measured: the SLO with its percentiles, the warm-up, the windows."""
    slo = spec.slo
    return (
        f"SLO: TTFT {slo.ttft.percentile} <= {slo.ttft.target_milliseconds} ms, "
        f"ITL {slo.itl.percentile} <= {slo.itl.target_milliseconds} ms "
        f"(window {slo.window_seconds} s); warm-up {warmup:.0f} s uncounted; "
        f"rate x{rate_scale:g}; measured (replayed seconds of each trace): {'; '.join(windows)}"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("traces", nargs="*", type=Path)
    parser.add_argument("--start", type=NON_NEGATIVE.for_argparse, default=0.0)
    parser.add_argument("--duration", type=POSITIVE.for_argparse, default=600.0)
    parser.add_argument(
        "--warmup",
        type=NON_NEGATIVE.for_argparse,
        default=300.0,
        help="seconds replayed before the window, uncounted (0: every policy starts cold)",
    )
    parser.add_argument(
        "--percentile",
        choices=sorted(PERCENTILE_SHARES),
        default="P99",
        help="the SLO percentile of the example deployment (P99 matches '>= 99%% of requests')",
    )
    parser.add_argument(
        "--rate-scale", type=POSITIVE.for_argparse, default=1.0, help="multiply each trace's rate"
    )
    parser.add_argument("--servegen-rps", type=POSITIVE.for_argparse, default=20.0)
    parser.add_argument(
        "--seed",
        type=int,
        default=0,
        help="replay seed: which requests a --rate-scale other than 1 keeps or copies, and the "
        "arrivals drawn from ServeGen's rates",
    )
    parser.add_argument("--policy", action="append", help="default: every policy")
    parser.add_argument("--routing", choices=ROUTINGS, default="prefix-aware")
    parser.add_argument("--csv", type=Path)
    args = parser.parse_args()
    for name in args.policy or ():  # before any run: a typo would waste the runs before it
        try:
            check_policy_name(name)
        except ValueError as error:
            parser.error(f"argument --policy: {error}")
    for path in args.traces:
        if not path.is_file():
            parser.error(f"argument traces: no file {path}")
    paths = args.traces or sorted(p for p in TRACES.iterdir() if p.suffix in (".csv", ".jsonl"))
    spec = parse_pddeployment(example_document(percentile=args.percentile)).spec
    # Every trace is read before any run: a malformed or empty one fails in seconds, not after
    # the runs before it.
    loaded = []
    for path in paths:
        options = _options(
            path, args.start, args.duration, args.servegen_rps, args.rate_scale, seed=args.seed
        )
        try:
            requests = load_trace(path, options.with_warmup(args.warmup))
        except (OSError, ValueError) as error:
            parser.error(f"argument traces: {error}")
        if not requests:
            parser.error(
                f"argument traces: {path} holds no request in the window from --start"
                f" {args.start:g} s (of --duration {args.duration:g} s)"
            )
        loaded.append((path, options, requests))
    rows = []
    verdicts = []
    windows = []
    for path, options, requests in loaded:
        measured = options.measured_start_s(args.warmup) / options.time_compression
        window = f"[{measured:.0f}, {measured + args.duration:.0f}) s"
        last = measured - args.warmup + (requests[-1].arrival_s if requests else 0.0)
        if last < measured + args.duration - PEAK_WINDOW_S:
            window += f" (the trace ends at {last:.0f} s)"
        windows.append(f"{path.name} {window}")
        print(f"{path.name}: {len(requests):,} requests, measured {window}", file=sys.stderr)
        results = {}
        for policy in args.policy or POLICY_NAMES:
            results[policy] = simulate(
                spec,
                requests,
                policy,
                model=GLM_45_FP8,
                warmup_s=args.warmup,
                routing=args.routing,
            )
            rows.append({"trace": path.name, **table_row(results[policy])})
            print(f"  {policy}: {rows[-1]}", file=sys.stderr)
        verdicts.append(f"{path.name}: {targets(results)}")
    seed = f"; replay seed {args.seed}" if args.seed else ""
    print(header(spec, args.warmup, args.rate_scale, windows) + f"; routing {args.routing}{seed}")
    print()
    print(markdown_table(rows, COLUMNS))
    print()
    print("\n".join(f"* {line}" for line in verdicts))
    if args.csv:
        with args.csv.open("w", newline="") as handle:
            writer = csv.DictWriter(handle, fieldnames=COLUMNS)
            writer.writeheader()
            writer.writerows(rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
