"""PNG plots of an offline run: load, replicas per pool, TTFT and ITL percentiles vs targets.

matplotlib is imported only here and only when a plot is asked for (`pip install
'pd-operator[plot]'`); figures are drawn on the Agg canvas, with no pyplot state and no
display, so plotting works on a headless machine and from any thread.
"""

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pd_operator.api.spec import PDDeploymentSpec
from pd_tools.replay.results import SimResult

QUANTILES = (0.5, 0.9, 0.99)
CLIP = 20.0  # latencies above this many times the target (and unfinished ones) drawn there


def _quantile(values: Sequence[float], q: float) -> float:
    """Nearest-rank quantile of sorted `values`; NaN when empty."""
    if not values:
        return math.nan
    return values[min(len(values) - 1, max(0, math.ceil(q * len(values)) - 1))]


def _binned(result: SimResult, bin_s: float) -> dict[str, list[Any]]:
    """Per bin of arrival time: request rate, prompt tokens/s, and latency quantiles."""
    span = max((o.arrival_s for o in result.outcomes), default=0.0)
    bins = max(1, math.floor(span / bin_s) + 1)
    ttft: list[list[float]] = [[] for _ in range(bins)]
    tpot: list[list[float]] = [[] for _ in range(bins)]
    count = [0] * bins
    prompt = [0] * bins
    for o in result.outcomes:
        k = min(bins - 1, int(o.arrival_s // bin_s))
        count[k] += 1
        prompt[k] += o.input_tokens
        # Unfinished requests count as infinitely late (drawn at the top of the panel).
        ttft[k].append(math.inf if math.isnan(o.ttft_s) else o.ttft_s)
        if o.output_tokens > 1:
            tpot[k].append(math.inf if math.isnan(o.tpot_s) else o.tpot_s)
    out: dict[str, list[Any]] = {
        "t_min": [(k + 0.5) * bin_s / 60 for k in range(bins)],
        "rps": [c / bin_s for c in count],
        "prompt_tps": [p / bin_s for p in prompt],
    }
    for name, series in (("ttft", ttft), ("tpot", tpot)):
        for q in QUANTILES:
            out[f"{name}_p{round(q * 100)}"] = [_quantile(sorted(v), q) for v in series]
    return out


def plot_result(
    result: SimResult, spec: PDDeploymentSpec, path: str | Path, *, bin_s: float = 60.0
) -> Path:
    """Write a four-panel PNG of `result` to `path`: load, replicas per pool, TTFT and ITL
    (per-request mean inter-token time) P50/P90/P99 per `bin_s` of arrivals against the
    SLO targets. Returns the path."""
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg  # noqa: PLC0415
        from matplotlib.figure import Figure  # noqa: PLC0415
    except ImportError as error:  # pragma: no cover - depends on the installation
        raise RuntimeError("plots need matplotlib: pip install 'pd-operator[plot]'") from error
    path = Path(path)
    data = _binned(result, bin_s)
    figure = Figure(figsize=(10, 11), layout="constrained")
    FigureCanvasAgg(figure)
    load, replicas, ttft, itl = figure.subplots(4, 1, sharex=True)
    attainment = result.attainment()
    figure.suptitle(
        f"{result.policy}: {result.requests:,} requests, both SLOs met by "
        f"{attainment['both']:.1%} ({attainment['feasible']:.1%} of the "
        f"{result.feasible:,} feasible), cost {result.cost:,.2f}"
    )

    load.plot(data["t_min"], data["rps"], color="tab:blue", label="requests/s")
    load.set_ylabel("requests/s")
    tokens = load.twinx()
    tokens.plot(data["t_min"], data["prompt_tps"], color="tab:gray", alpha=0.6)
    tokens.set_ylabel("prompt tokens/s", color="tab:gray")
    load.set_title(f"offered load (per {bin_s:.0f} s of arrivals)")

    end_min = result.end_s / 60
    for pool in result.timeline[0][1]:
        times = [t / 60 for t, _ in result.timeline] + [end_min]
        counts = [r[pool] for _, r in result.timeline]
        replicas.step(times, [*counts, counts[-1]], where="post", label=pool)
    replicas.set_ylabel("replicas")
    replicas.set_title("replicas per pool (asked for, pending included)")
    replicas.legend(loc="best")

    panels = (
        (ttft, "ttft", spec.slo.ttft, 1.0, "s", "TTFT", "log"),
        (
            itl,
            "tpot",
            spec.slo.itl,
            1000.0,
            "ms",
            "ITL (mean inter-token time per request)",
            "linear",
        ),
    )
    for axis, key, target, scale, unit, title, yscale in panels:
        limit = target.target_milliseconds / 1000 * scale
        top = CLIP * limit
        for q, style in zip(QUANTILES, ("-", "--", ":"), strict=True):
            values = [min(v * scale, top) for v in data[f"{key}_p{round(q * 100)}"]]
            axis.plot(data["t_min"], values, style, label=f"P{round(q * 100)}")
        axis.axhline(limit, color="tab:red", label=f"target ({target.percentile})")
        axis.set_yscale(yscale)
        if yscale == "linear":
            axis.set_ylim(bottom=0)
        axis.set_ylabel(unit)
        axis.set_title(f"{title} per {bin_s:.0f} s of arrivals")
        axis.legend(loc="best")
    itl.set_xlabel("simulated minutes")
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=100)
    return path
