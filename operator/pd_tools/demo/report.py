"""What a run leaves: its summary, the table as CSV, and the plot."""

import csv
import importlib
import math
from pathlib import Path
from typing import Any

from pd_tools.demo.load import Load, describe
from pd_tools.demo.settings import NAME, NAMESPACE
from pd_tools.demo.table import Sample
from pd_tools.workloads.http_load import RequestRecord, format_summary, quantile, summarize

RATE_BIN_S = 5.0  # the plot's request rates


def summarize_run(
    load: Load,
    samples: list[Sample],
    records: list[RequestRecord],
    events: dict[str, int],
    cpu: str,
) -> str:
    """What the run showed."""
    lines = [f"load: {load.what}", f"  from {load.source}", *describe(load)]
    if load.skipped:
        lines.append(f"  ({load.skipped} trace requests longer than the model's context left out)")
    lines += ["", "client (every request, through the router):"]
    lines += [
        "  " + line for line in format_summary(summarize(records, peak(records))).splitlines()
    ]
    lines += ["", f"  {'phase':<16}{'sent':>6}{'done':>6}{'TTFT P50':>11}{'ITL P50':>10}"]
    for p in load.phases:
        sent = [r for r in records if p.start_s <= r.arrival_s < p.end_s]
        done = [r for r in sent if r.reason is None]
        ttft = quantile(sorted(r.ttft_s for r in done if r.ttft_s is not None), 0.5)
        itl = quantile(sorted(g for r in done for g in r.itl_s), 0.5)
        lines.append(
            f"  {p.name:<16}{sum(1 for r in sent if r.start_s is not None):>6}{len(done):>6}"
            f"{_ms(ttft):>11}{_ms(itl):>10}"
        )
    lines.append("")
    for role, pool in sorted({(s.role, s.pool) for s in samples}):
        mine = [s for s in samples if (s.role, s.pool) == (role, pool)]
        seen = [s for s in mine if s.slo != "-"]
        met = sum(1 for s in seen if s.slo == "met") / len(seen) if seen else math.nan
        lines.append(
            f"{role}/{pool}: ready {min(s.ready for s in mine)}..{max(s.ready for s in mine)}, "
            f"most desired {max(s.desired for s in mine)}; SLO met in {met:.0%} of "
            f"{len(seen)} looks (target {mine[0].target_ms} ms)"
        )
    lines.append(", ".join(f"{k} events: {v}" for k, v in events.items()))
    lines.append(cpu)
    return "\n".join(lines)


def peak(records: list[RequestRecord]) -> int:
    """The most requests in flight at once."""
    edges = sorted(
        edge
        for r in records
        if r.start_s is not None and r.end_s is not None
        for edge in ((r.start_s, 1), (r.end_s, -1))
    )
    most = now = 0
    for _, step in edges:
        now += step
        most = max(most, now)
    return most


def _ms(seconds: float) -> str:
    return "-" if math.isnan(seconds) else f"{seconds * 1000:,.1f} ms"


def write_samples(samples: list[Sample], path: Path) -> None:
    """Every table row as CSV."""
    with path.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(
            [
                "t_s",
                "role",
                "pool",
                "ready",
                "desired",
                "pending",
                "latency_ms",
                "target_ms",
                "slo",
                "client_p50_ms",
                "sent_per_s",
                "completed_per_s",
            ]
        )
        for s in samples:
            writer.writerow([f"{s.t:.1f}", s.role, s.pool, s.ready, s.desired, s.pending,
                             "" if s.latency_ms is None else s.latency_ms, s.target_ms, s.slo,
                             "" if s.client_ms is None else f"{s.client_ms:.1f}",
                             f"{s.sent_per_s:.2f}", f"{s.completed_per_s:.2f}"])  # fmt: skip


def _per_second(times: list[float], bin_s: float) -> list[tuple[float, float]]:
    """Events per second in consecutive bins of `bin_s` from 0: (bin start, rate)."""
    if not times:
        return []
    counts = [0] * (int(max(times) // bin_s) + 1)
    for at in times:
        if at >= 0:
            counts[int(at // bin_s)] += 1
    return [(i * bin_s, count / bin_s) for i, count in enumerate(counts)]


def plot(load: Load, samples: list[Sample], records: list[RequestRecord], path: Path) -> str:
    """Replicas, TTFT and ITL against their targets, and the request rate, over the run, with
    the phases marked; what was written, or why not."""
    try:  # optional: not a dependency of pd-operator
        importlib.import_module("matplotlib").use("Agg")
        plt: Any = importlib.import_module("matplotlib.pyplot")
    except ImportError:
        return "no plot: matplotlib is not installed (pip install matplotlib); see demo.csv"
    figure, axes = plt.subplots(4, 1, sharex=True, figsize=(11, 10))
    replicas, ttft, itl, rate = axes
    figure.suptitle(f"pd-operator demo: {NAMESPACE}/{NAME}, {load.what}", fontsize="medium")
    for role, pool in sorted({(s.role, s.pool) for s in samples}, reverse=True):
        mine = [s for s in samples if (s.role, s.pool) == (role, pool)]
        times = [s.t for s in mine]
        # Prefill wide underneath, decode thin on top: equal counts stay visible.
        width = 4.0 if role == "prefill" else 1.5
        line = replicas.step(
            times,
            [s.ready for s in mine],
            where="post",
            linewidth=width,
            alpha=0.6 if role == "prefill" else 1.0,
            label=f"{role}/{pool} ready",
        )
        replicas.step(times, [s.desired for s in mine], "--", where="post", linewidth=width / 2,
                      color=line[0].get_color(), label=f"{role}/{pool} desired")  # fmt: skip
        panel, kind = (ttft, "TTFT") if role == "prefill" else (itl, "ITL")
        seen = [(s.t, s.latency_ms) for s in mine if s.latency_ms is not None]
        if seen:
            panel.plot(*zip(*seen, strict=True), label=f"{kind} P50, engines (operator)")
        users = [(s.t, s.client_ms) for s in mine if s.client_ms is not None]
        if users:
            panel.plot(*zip(*users, strict=True), label=f"{kind} P50, client", alpha=0.7)
        panel.axhline(
            mine[0].target_ms,
            color="red",
            linestyle=":",
            label=f"{kind} target ({mine[0].target_ms} ms)",
        )
        panel.set_ylabel(f"{kind} (ms)")
        panel.legend(fontsize="small", loc="upper left")
    replicas.set_ylabel("replicas")
    replicas.yaxis.set_major_locator(
        importlib.import_module("matplotlib.ticker").MaxNLocator(integer=True)
    )
    replicas.legend(fontsize="small", loc="upper left", ncol=2)
    ttft.set_yscale("log")
    sent = _per_second([r.start_s for r in records if r.start_s is not None], RATE_BIN_S)
    completed = _per_second(
        [r.end_s for r in records if r.reason is None and r.end_s is not None], RATE_BIN_S
    )
    for label, series in (("sent", sent), ("completed", completed)):
        if series:
            rate.step(*zip(*series, strict=True), where="post", label=label)
    rate.set_ylabel(f"requests/s ({RATE_BIN_S:g} s bins)")
    rate.set_xlabel("seconds since the load started")
    rate.legend(fontsize="small", loc="upper left")
    for p in load.phases:
        if p.name != "calm":
            for axis in axes:
                axis.axvspan(p.start_s, p.end_s, color="orange" if "prefill" in p.name
                             else "purple", alpha=0.08)  # fmt: skip
            replicas.annotate(p.name, (p.start_s, 1.0), xycoords=("data", "axes fraction"),
                              va="bottom", fontsize="small")  # fmt: skip
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)
    return f"plot: {path}"
