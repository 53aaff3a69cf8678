"""The issue's targets on every window the benchmark is judged on, in one table.

    .venv/bin/python bench/windows.py [--unseen TRACE ...] [--policy NAME ...] [--rivals]
        [--seed 0] [--jobs 2] [--oracle-cache oracle.json] [--only SUBSTRING] [--csv out.csv]

Runs `pd-operator` (and any `--policy` given) with the oracle on the windows
docs/simulator-and-planner.md reports: each shared trace's 10-minute window, the Mooncake hour
and its held-out window, the rate-scaled hours (Mooncake x0.5, x1.5, x2; Azure x2, x3, x4, x6),
Azure x4 from 1,800 s and two held-out ServeGen windows. Each `--unseen` trace (a trace of the
same formats the project has not seen) adds five windows: 10 minutes, the hour, the hour at
twice its rate, and 10 minutes from 900 s and from 1,200 s. Prints one row per window and
policy: attainment of the feasible requests, card-hours against the oracle's, scale actions,
and whether both targets hold (>= 0.99 within both SLOs, <= 1.15x the oracle), then how many
windows meet both. `--rivals` also runs the baselines (static-peak, hpa, dynamo-sla,
llm-d-slo) and judges the third target per window: no other policy reaches `pd-operator`'s
attainment with fewer card-hours (`fewest`: yes, or the cheaper ones named; about five times
the run time).

The oracle depends on the trace and the simulator, not on the policy: `--oracle-cache FILE`
keeps its card-hours per window in FILE and reuses them, so iterating on the policy reruns
only `pd-operator` (about 35 s for every window on two cores; the first run, with the oracle,
about 10 minutes).
Delete the file when the simulator or the deployment changes. `--only` runs the windows whose
name contains the substring.
"""

import argparse
import csv
import json
import sys
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from policies import (
    ATTAINMENT_TARGET,
    HINDSIGHT,
    ORACLE_RATIO_TARGET,
    TRACES,
    _options,
    rivals_against,
)

from pd_operator.api.document import parse_pddeployment
from pd_operator.core.hardware import GLM_45_FP8
from pd_tools.replay.example import example_document
from pd_tools.replay.offline import (
    POLICY_NAMES,
    check_policy_name,
    load_trace,
    simulate,
)

WARMUP_S = 300.0
# A window with less of the trace in it than this (a trace that ends soon after the window's
# start) judges a policy on a minute or two: it is left out, and named.
MIN_SPAN_S = 300.0
COLUMNS = (
    "window",
    "policy",
    "attain_feasible",
    "card_hours",
    "x_oracle",
    "actions",
    "both",
    "fewest",
)
# The policies `--rivals` adds: every one the simulator has but the hindsight references.
RIVALS = tuple(p for p in POLICY_NAMES if p not in ("pd-operator", *HINDSIGHT))


@dataclass(frozen=True)
class Window:
    """One measured span of one trace."""

    name: str
    trace: Path
    start: float = 0.0
    duration: float = 600.0
    rate_scale: float = 1.0
    servegen_rps: float = 20.0


def shared_windows(traces: Path) -> list[Window]:
    """The windows of ../shared/traces that docs/simulator-and-planner.md reports."""
    moon = traces / "conversation_trace.jsonl"
    azure = traces / "AzureLLMInferenceTrace_conv.csv"
    mid = traces / "servegen_m-mid_aggregate.csv"
    small = traces / "servegen_m-small_aggregate.csv"
    return [
        Window("mooncake 10 min", moon),
        Window("azure 10 min", azure),
        Window("servegen m-mid 10 min", mid),
        Window("servegen m-small 10 min", small),
        Window("mooncake hour", moon, duration=3600),
        Window("mooncake from 1800 s", moon, start=1800),
        Window("mooncake x0.5 hour", moon, duration=3600, rate_scale=0.5),
        Window("mooncake x1.5 hour", moon, duration=3600, rate_scale=1.5),
        Window("mooncake x2 hour", moon, duration=3600, rate_scale=2),
        Window("azure x2 hour", azure, duration=3600, rate_scale=2),
        Window("azure x3 hour", azure, duration=3600, rate_scale=3),
        Window("azure x4 hour", azure, duration=3600, rate_scale=4),
        Window("azure x6 hour", azure, duration=3600, rate_scale=6),
        Window("azure x4 from 1800 s", azure, start=1800, rate_scale=4),
        Window("servegen m-mid from 1800 s, 60 rps", mid, start=1800, servegen_rps=60),
        Window("servegen m-mid from 4320 s, 60 rps", mid, start=4320, servegen_rps=60),
    ]


def unseen_windows(trace: Path) -> list[Window]:
    """Five windows of a trace the project has not seen."""
    name = trace.stem
    return [
        Window(f"{name} 10 min", trace),
        Window(f"{name} hour", trace, duration=3600),
        Window(f"{name} x2 hour", trace, duration=3600, rate_scale=2),
        Window(f"{name} from 900 s", trace, start=900),
        Window(f"{name} from 1200 s", trace, start=1200),
    ]


def run_window(window: Window, policy: str, seed: int) -> tuple[float, float, int] | None:
    """(feasible attainment, card-hours, scale actions) of one policy on one window; None when
    the trace holds less than MIN_SPAN_S of it."""
    spec = parse_pddeployment(example_document(percentile="P99")).spec
    options = _options(
        window.trace,
        window.start,
        window.duration,
        window.servegen_rps,
        window.rate_scale,
        seed=seed,
    )
    requests = load_trace(window.trace, options.with_warmup(WARMUP_S))
    result = simulate(spec, requests, policy, model=GLM_45_FP8, warmup_s=WARMUP_S)
    if result.requests == 0 or result.end_s < MIN_SPAN_S:
        return None
    hours = sum(result.card_hours.values())
    return result.attainment()["feasible"], hours, result.scale_actions


def cache_key(window: Window, seed: int) -> str:
    size = window.trace.stat().st_size
    return f"{window.name}|{window.trace.name}|{size}|seed {seed}"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--unseen", type=Path, action="append", default=[])
    parser.add_argument("--policy", action="append", help="default: pd-operator")
    parser.add_argument("--rivals", action="store_true", help="also run " + ", ".join(RIVALS))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--oracle-cache", type=Path)
    parser.add_argument("--only", default="")
    parser.add_argument("--csv", type=Path)
    args = parser.parse_args(argv)
    policies = args.policy or ["pd-operator"]
    if args.rivals:
        policies = list(dict.fromkeys(["pd-operator", *policies, *RIVALS]))
    for name in policies:
        try:
            check_policy_name(name)
        except ValueError as error:
            parser.error(f"argument --policy: {error}")
    windows = shared_windows(TRACES) + [w for t in args.unseen for w in unseen_windows(t)]
    windows = [w for w in windows if args.only in w.name]
    if not windows:
        parser.error(f"argument --only: no window name contains {args.only!r}")
    missing = sorted({str(w.trace) for w in windows if not w.trace.is_file()})
    if missing:
        parser.error(f"no trace file {', '.join(missing)}")
    cache: dict[str, list[float] | None] = {}
    if args.oracle_cache and args.oracle_cache.is_file():
        cache = json.loads(args.oracle_cache.read_text())
    runs = [(w, p) for w in windows for p in policies if p != "oracle"]
    runs += [(w, "oracle") for w in windows if cache_key(w, args.seed) not in cache]
    with ProcessPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        futures = {run: pool.submit(run_window, run[0], run[1], args.seed) for run in runs}
        results = {run: future.result() for run, future in futures.items()}
    for (window, policy), outcome in results.items():
        if policy == "oracle":
            cache[cache_key(window, args.seed)] = None if outcome is None else list(outcome)
    if args.oracle_cache:
        args.oracle_cache.write_text(json.dumps(cache, indent=1, sort_keys=True) + "\n")
    print_table(windows, policies, results, cache, seed=args.seed, csv_path=args.csv)
    return 0


def print_table(
    windows: Sequence[Window],
    policies: Sequence[str],
    results: dict[tuple[Window, str], tuple[float, float, int] | None],
    cache: dict[str, list[float] | None],
    *,
    seed: int,
    csv_path: Path | None,
) -> None:
    """One row per window and policy, the oracle first; then how many windows meet both (and,
    with every rival run, how many meet all three targets)."""
    rows, met, empty, fewest, judged = [], 0, [], 0, all(r in policies for r in RIVALS)
    for window in windows:
        cached = cache[cache_key(window, seed)]
        if cached is None:
            empty.append(window.name)
            continue
        attained, oracle_hours, actions = cached
        rows.append(_row(window.name, "oracle", (attained, oracle_hours, int(actions)), 1.0))
        outcomes = {p: results[(window, p)] for p in policies if p != "oracle"}
        for policy, outcome in outcomes.items():
            assert outcome is not None  # the oracle saw requests in the same window
            rows.append(_row(window.name, policy, outcome, outcome[1] / max(1e-9, oracle_hours)))
            if policy != "pd-operator":
                continue
            met += rows[-1]["both"] == "yes"
            if judged:
                others = {p: (o[0], o[1]) for p, o in outcomes.items() if o is not None}
                cheaper, _ = rivals_against(outcome[0], outcome[1], others)
                rows[-1]["fewest"] = ", ".join(cheaper) or "yes"
                fewest += rows[-1]["both"] == "yes" and not cheaper
    print(f"warm-up {WARMUP_S:.0f} s; replay seed {seed}; TTFT 6 s and ITL 20 ms at P99")
    print()
    print("| " + " | ".join(COLUMNS) + " |")
    print("|" + "---|" * len(COLUMNS))
    for row in rows:
        print("| " + " | ".join(row[c] for c in COLUMNS) + " |")
    print()
    if "pd-operator" in policies:
        print(f"pd-operator meets both targets on {met} of {len(windows) - len(empty)} windows")
        if judged:
            print(f"and all three (fewest card-hours for its attainment too) on {fewest}")
    if empty:
        print(f"left out, under {MIN_SPAN_S:.0f} s of trace in the window: {', '.join(empty)}")
    if csv_path:
        with csv_path.open("w", newline="") as handle:
            writer = csv.DictWriter(handle, fieldnames=COLUMNS)
            writer.writeheader()
            writer.writerows(rows)


def _row(
    window: str, policy: str, outcome: tuple[float, float, int], ratio: float
) -> dict[str, str]:
    attained, hours, actions = outcome
    both = attained >= ATTAINMENT_TARGET and ratio <= ORACLE_RATIO_TARGET
    return {
        "window": window,
        "policy": policy,
        "attain_feasible": f"{attained:.3f}",
        "card_hours": f"{hours:.1f}",
        "x_oracle": f"{ratio:.2f}",
        "actions": str(int(actions)),
        "both": "yes" if both else ("-" if policy == "oracle" else "no"),
        "fewest": "-",
    }


if __name__ == "__main__":
    sys.exit(main())
