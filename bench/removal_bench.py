"""Which replica goes: pd-operator's choice (least work) against the ReplicaSet's default.

    .venv/bin/python bench/removal_bench.py [--seed 1] [--scenarios 40] [--duration 900]
        [--warmup 300] [--jobs 2]

Runs pd-operator on the robustness benchmark's scenarios (`replay/families.py`, deterministic
from `--seed`) twice: the replicas each scale-down removes chosen as pd-operator marks them
(the Ready replicas with the fewest running sequences on decode, the shortest queue on prefill:
`core/removal.py`) and as a ReplicaSet chooses by default (the most recently started). The
policy is the same; only which replica goes differs. One row per scenario where a Ready
replica was removed: what the removed replicas held when they went (decode streams and the output
tokens they had still to produce; prompts being prefilled and requests waiting, which go to
another replica), the streams the drain limit (`termination.drainSeconds`, 60 s) cuts, the
card-seconds the removed replicas spent draining, attainment and card-hours. Then the totals
(attainment: the mean over all scenarios). About a minute per seed on two cores.
"""

import argparse
import sys
import time
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor

from robustness import scenario_arguments

from pd_tools.replay.families import Scenario, draw_scenarios
from pd_tools.replay.fleet import RemovalOrder
from pd_tools.replay.offline import simulate

ORDERS: tuple[RemovalOrder, ...] = ("replicaset", "least-work")
COLUMNS = (
    "replicas removed",
    "decode streams in flight",
    "their tokens to come",
    "streams cut by the drain limit",
    "tokens cut",
    "requests held or re-routed",
    "drain card-seconds",
)


def run(scenario: Scenario, order: RemovalOrder) -> dict[str, float]:
    """pd-operator on one scenario with one removal order: the removal costs and the result."""
    result = simulate(
        scenario.spec(),
        scenario.requests(),
        "pd-operator",
        model=scenario.model,
        warmup_s=scenario.warmup_s,
        removal=order,
    )
    return {
        **result.removed,
        "attainment": result.attainment()["feasible"],
        "card-hours": sum(result.card_hours.values()),
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    scenario_arguments(parser)
    args = parser.parse_args(argv)
    scenarios = draw_scenarios(
        args.seed, args.scenarios, duration_s=args.duration, warmup_s=args.warmup
    )
    started = time.perf_counter()
    with ProcessPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        futures = {(s.id, o): pool.submit(run, s, o) for s in scenarios for o in ORDERS}
        results = {key: future.result() for key, future in futures.items()}
    print(
        f"{len(scenarios)} scenarios (seed {args.seed}), pd-operator's policy; each cell: "
        "the ReplicaSet's default / pd-operator's choice (least work)"
    )
    print()
    header = ("scenario", *COLUMNS, "attainment", "card-hours")
    rows = []
    for scenario in scenarios:
        default, ours = results[(scenario.id, "replicaset")], results[(scenario.id, "least-work")]
        if not default["replicas removed"] and not ours["replicas removed"]:
            continue
        rows.append((scenario.id, *(_pair(default[c], ours[c]) for c in header[1:])))
    totals = {
        order: {c: sum(results[(s.id, order)][c] for s in scenarios) for c in header[1:]}
        for order in ORDERS
    }
    for order in ORDERS:  # attainment: the mean over scenarios
        totals[order]["attainment"] /= len(scenarios)
    rows.append(
        ("total", *(_pair(totals["replicaset"][c], totals["least-work"][c]) for c in header[1:]))
    )
    widths = [max(len(str(r[i])) for r in (header, *rows)) for i in range(len(header))]
    for row in (header, *rows):
        print("  ".join(str(cell).ljust(width) for cell, width in zip(row, widths, strict=False)))
    print()
    print(
        f"{len(rows) - 1} of {len(scenarios)} scenarios removed a Ready replica; "
        f"took {time.perf_counter() - started:.0f} s on {args.jobs} worker(s)"
    )
    return 0


def _pair(default: float, ours: float) -> str:
    def text(value: float) -> str:
        return f"{value:.3f}" if 0 < value < 1 or value != int(value) else f"{value:.0f}"

    return f"{text(default)} / {text(ours)}"


if __name__ == "__main__":
    sys.exit(main())
