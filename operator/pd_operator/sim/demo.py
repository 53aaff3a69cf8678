"""`pdctl demo`: the whole closed loop on one machine, watched from a terminal table.

A local control plane, a real Prometheus, the articles' cluster of virtual S5000 and H200 nodes
with the mock scheduler, an engine behind every Ready pod, and the operator itself, all started
here; the heterogeneous sample applied in Active mode with short intervals; a time-compressed
load with a surge replayed against it. Every process and thread started here is stopped on the
way out, Ctrl-C and SIGTERM included.
"""

import asyncio
import contextlib
import copy
import csv
import importlib
import math
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import FrameType
from typing import Any, TextIO

import yaml
from kubernetes import client

from pd_operator.adapters.kube import load_api_client
from pd_operator.handlers.operator import OperatorConfig, OperatorState, run_operator
from pd_operator.localcluster import LocalCluster, LocalPrometheus
from pd_operator.sim.cluster import SimCluster
from pd_operator.sim.engine import RequestRecord
from pd_operator.sim.scheduler import SCHEDULER_NAME
from pd_operator.sim.workload import (
    ReplayOptions,
    Request,
    TokenLengths,
    read_trace,
    step_rate,
    synthetic_requests,
)

ROOT = Path(__file__).resolve().parents[3]
PROFILE = ROOT / "config" / "clusters" / "articles.yaml"
SAMPLE = ROOT / "config" / "samples" / "heterogeneous-s5000-h200.yaml"
TRACE = ROOT.parent / "shared" / "traces" / "conversation_trace.jsonl"
NAMESPACE, NAME = "demo", "glm-hetero"
GROUP, VERSION, PLURAL = "pdoperator.io", "v1alpha1", "pddeployments"
# 20 simulated seconds per wall second: an 82 s model load takes 4 s, the hour-long trace 3 min.
TIME_SCALE = 0.05
INTERVAL_SECONDS = 5
WINDOW_SECONDS = 20
# Synthetic load when no trace is found: 4,000-token prompts, calm, a surge, calm again. One S5000
# prefill replica meets a 250 ms P50 TTFT at the calm rate; the surge needs more.
SYNTHETIC = TokenLengths(4000, 200, 1.0, 1.0)
SYNTHETIC_RATES = (2.0, 8.0, 2.0)  # requests per simulated second, each a third of the run
SYNTHETIC_TTFT_MS = 250
# The trace at its own rate needs more S5000 replicas than the articles' four nodes hold (its
# prompts average 12K tokens), so it plays at a quarter of its requests, and the middle third,
# the surge, at three times that.
TRACE_RATE = 0.25
SURGE = 3.0
TRACE_TTFT_MS = 1000


@dataclass
class Sample:
    """One row of the table at one moment (wall seconds since the PDDeployment was applied)."""

    t: float
    role: str
    pool: str
    ready: int
    desired: int
    pending: int
    ttft_ms: int | None
    itl_ms: int | None
    slo: str


@dataclass
class DemoOptions:
    """What `pdctl demo` runs: wall seconds, the load, the output folder."""

    duration_s: float = 180.0
    load: str = "auto"  # auto: the trace if present, else synthetic
    plot: bool = True
    output: Path = field(default_factory=lambda: Path(tempfile.gettempdir()) / "pd-demo")
    refresh_s: float = 2.0


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt  # SIGTERM cleans up exactly as Ctrl-C does


def build_load(options: DemoOptions) -> tuple[str, Iterator[Request], int]:
    """The requests (in simulated seconds), what they are, and the TTFT target that suits them."""
    simulated_s = options.duration_s / TIME_SCALE
    third = simulated_s / 3
    if options.load == "trace" or (options.load == "auto" and TRACE.exists()):

        def window(index: int, scale: float) -> Iterator[Request]:
            replay = ReplayOptions(start_s=index * third, duration_s=third, rate_scale=scale)
            for request in read_trace(TRACE, replay):
                yield replace(request, arrival_s=request.arrival_s + index * third)

        def chained() -> Iterator[Request]:
            for index, scale in enumerate((TRACE_RATE, TRACE_RATE * SURGE, TRACE_RATE)):
                yield from window(index, scale)

        what = f"{TRACE.name} at {TRACE_RATE:g}x its requests, middle third at {SURGE:g}x that"
        return what, chained(), TRACE_TTFT_MS
    rates = step_rate(list(SYNTHETIC_RATES), third)
    what = "synthetic 4K-token prompts at " + " -> ".join(f"{r:g}" for r in SYNTHETIC_RATES)
    return f"{what} req/s", synthetic_requests(rates, SYNTHETIC, seed=1), SYNTHETIC_TTFT_MS


def pdd_body(prometheus_url: str, ttft_ms: int) -> dict[str, Any]:
    """The heterogeneous sample on the mock scheduler, Active, with short intervals."""
    body: dict[str, Any] = copy.deepcopy(yaml.safe_load(SAMPLE.read_text()))
    spec = body["spec"]
    spec["slo"]["ttft"]["targetMilliseconds"] = ttft_ms
    spec["slo"]["itl"]["targetMilliseconds"] = 25
    spec["slo"]["windowSeconds"] = WINDOW_SECONDS
    for role in ("prefill", "decode"):
        for pool in spec[role]["pools"]:
            pool["template"] = {**pool.get("template", {}), "schedulerName": SCHEDULER_NAME}
    spec["scaling"] = {
        **spec["scaling"],
        "mode": "Active",
        "intervalSeconds": INTERVAL_SECONDS,
        "scaleUp": {"stabilizationSeconds": 0, "maxStepReplicas": 2},
        "scaleDown": {"stabilizationSeconds": 30, "maxStepReplicas": 1},
        "prometheus": {"url": prometheus_url},
    }
    return body


class OperatorThread:
    """The operator on its own event loop in a thread of this process."""

    def __init__(self, kubeconfig: Path) -> None:
        settings = OperatorConfig(namespaces=[NAMESPACE], workers=2, resync_seconds=5)
        api = load_api_client(str(kubeconfig))
        self.state = OperatorState(api, settings)
        self._stop, self._ready = threading.Event(), threading.Event()
        self._thread = threading.Thread(target=self._main, name="pd-operator", daemon=True)

    def _main(self) -> None:
        asyncio.run(run_operator(self.state, stop_flag=self._stop, ready_flag=self._ready))

    def start(self) -> None:
        self._thread.start()
        if not self._ready.wait(60):
            raise RuntimeError("the operator did not become ready within 60 s")

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=30)


def read_samples(api: client.ApiClient, t: float) -> tuple[list[Sample], str]:
    """The table's rows from the PDDeployment's status, and its last decision."""
    obj: Any = client.CustomObjectsApi(api).get_namespaced_custom_object(
        GROUP, VERSION, NAMESPACE, PLURAL, NAME
    )
    status = obj.get("status") or {}
    observed = status.get("observed") or {}
    slo = next(
        (c for c in status.get("conditions") or [] if c["type"] == "SLOMet"), {"status": "?"}
    )
    state = {"True": "met", "False": "VIOLATED"}.get(slo["status"], "unknown")
    rows = [
        Sample(
            t=t,
            role=pool["role"],
            pool=pool["name"],
            ready=pool.get("readyReplicas", 0),
            desired=pool.get("desiredReplicas", 0),
            pending=pool.get("unschedulableReplicas", 0),
            ttft_ms=observed.get("ttftMilliseconds") if pool["role"] == "prefill" else None,
            itl_ms=observed.get("itlMilliseconds") if pool["role"] == "decode" else None,
            slo=state,
        )
        for pool in status.get("pools") or []
    ]
    decision = status.get("lastDecision") or {}
    why = f"{decision.get('time', '-')}: {decision.get('reason', 'no decision yet')}"
    return rows, why


def render(rows: list[Sample], why: str, header: str) -> str:
    """The live table."""
    lines = [
        header,
        f"{'pool':<18}{'ready':>6}{'desired':>8}{'pending':>8}{'TTFT':>9}{'ITL':>7}  SLO",
    ]
    for row in rows:
        ttft = f"{row.ttft_ms}ms" if row.ttft_ms is not None else "-"
        itl = f"{row.itl_ms}ms" if row.itl_ms is not None else "-"
        name = f"{row.role}/{row.pool}"
        lines.append(
            f"{name:<18}{row.ready:>6}{row.desired:>8}{row.pending:>8}{ttft:>9}{itl:>7}  {row.slo}"
        )
    lines.append(f"last decision {why}")
    return "\n".join(lines)


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else math.nan


def summarize(samples: list[Sample], records: list[RequestRecord], scaled: int, what: str) -> str:
    """What the run showed, in a few lines."""
    lines = [f"load: {what}", f"requests finished: {len(records):,}"]
    if records:
        ttft = [r.ttft_s for r in records]
        itl = [r.itl_mean_s for r in records if r.output_tokens > 1]
        lines.append(
            f"TTFT p50 {percentile(ttft, 0.5):.3f}s p90 {percentile(ttft, 0.9):.3f}s; "
            f"ITL p50 {percentile(itl, 0.5) * 1000:.1f}ms"
        )
    pools = sorted({(s.role, s.pool) for s in samples})
    for role, pool in pools:
        mine = [s for s in samples if (s.role, s.pool) == (role, pool)]
        lines.append(
            f"{role}/{pool}: ready {min(s.ready for s in mine)}..{max(s.ready for s in mine)}, "
            f"most desired {max(s.desired for s in mine)}, "
            f"most pending {max(s.pending for s in mine)}"
        )
    moments = {s.t: s.slo for s in samples}
    if moments:
        met = sum(1 for slo in moments.values() if slo == "met") / len(moments)
        lines.append(f"SLO met in {met:.0%} of {len(moments)} looks")
    lines.append(f"scaling events (ScaledUp/ScaledDown): {scaled}")
    return "\n".join(lines)


def write_outputs(samples: list[Sample], output: Path, plot: bool) -> list[str]:
    """The CSV of every sample, and a PNG when matplotlib is importable; what was written."""
    output.mkdir(parents=True, exist_ok=True)
    table = output / "demo.csv"
    with table.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["t_s", "role", "pool", "ready", "desired", "pending", "ttft_ms", "itl_ms"])
        for s in samples:
            writer.writerow([f"{s.t:.1f}", s.role, s.pool, s.ready, s.desired, s.pending,
                             s.ttft_ms if s.ttft_ms is not None else "",
                             s.itl_ms if s.itl_ms is not None else ""])  # fmt: skip
    notes = [f"samples: {table}"]
    if not plot:
        return notes
    try:  # optional: not a dependency of pd-operator
        importlib.import_module("matplotlib").use("Agg")
        plt: Any = importlib.import_module("matplotlib.pyplot")
    except ImportError:
        return [
            *notes,
            "no plot: matplotlib is not installed (pip install matplotlib); see the CSV",
        ]
    figure, (replicas, latency) = plt.subplots(2, 1, sharex=True, figsize=(10, 6))
    for role, pool in sorted({(s.role, s.pool) for s in samples}):
        mine = [s for s in samples if (s.role, s.pool) == (role, pool)]
        replicas.step([s.t for s in mine], [s.ready for s in mine], label=f"{role}/{pool} ready")
        replicas.step(
            [s.t for s in mine], [s.desired for s in mine], "--", label=f"{role}/{pool} desired"
        )
        key = "ttft_ms" if role == "prefill" else "itl_ms"
        points = [(s.t, getattr(s, key)) for s in mine if getattr(s, key) is not None]
        if points and pool == mine[0].pool:
            latency.plot(*zip(*points, strict=True), label=f"{role} {key}")
    replicas.set_ylabel("replicas")
    replicas.legend(fontsize="small")
    latency.set_ylabel("ms (P50)")
    latency.set_yscale("log")
    latency.set_xlabel("wall seconds")
    latency.legend(fontsize="small")
    image = output / "demo.png"
    figure.savefig(image, dpi=100)
    plt.close(figure)
    return [*notes, f"plot: {image}"]


def watch(
    api: client.ApiClient,
    sim: SimCluster,
    options: DemoOptions,
    ttft_ms: int,
    samples: list[Sample],
    *,
    out: TextIO,
) -> None:
    """Redraw the table every `refresh_s` for `duration_s` wall seconds, keeping the samples."""
    began = time.monotonic()
    tty = out.isatty()
    while (t := time.monotonic() - began) < options.duration_s:
        rows, why = read_samples(api, t)
        samples += rows
        header = (
            f"pd-operator demo: {t:5.0f}/{options.duration_s:.0f} s wall, "
            f"{sim.now_s():,.0f} simulated s, TTFT target {ttft_ms} ms (Ctrl-C stops)"
        )
        print(("\x1b[H\x1b[2J" if tty else "\n") + render(rows, why, header), file=out,
              flush=True)  # fmt: skip
        time.sleep(options.refresh_s)


def run_demo(options: DemoOptions, out: TextIO = sys.stdout) -> int:
    """Bring everything up, run the load for `options.duration_s` wall seconds, report, and tear
    everything down; 0 when the run completed, 130 when interrupted."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _interrupt)
    what, requests, ttft_ms = build_load(options)
    samples: list[Sample] = []
    interrupted = False
    cluster, prometheus = LocalCluster(), LocalPrometheus()
    sim: SimCluster | None = None
    operator: OperatorThread | None = None
    api: client.ApiClient | None = None
    try:
        print(f"starting the local control plane ({cluster.dir})", file=out, flush=True)
        cluster.start()
        print(f"starting Prometheus ({prometheus.dir})", file=out, flush=True)
        prometheus.start()
        api = load_api_client(str(cluster.kubeconfig))
        core = client.CoreV1Api(api)
        core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=NAMESPACE)))
        sim = SimCluster(
            api,
            PROFILE,
            loads={(NAMESPACE, NAME): requests},
            time_scale=TIME_SCALE,
            sd_file=prometheus.targets_dir / "demo.json",
            namespace=NAMESPACE,
        )
        print(f"starting the virtual nodes of {PROFILE.name}", file=out, flush=True)
        sim.start()
        operator = OperatorThread(cluster.kubeconfig)
        operator.start()
        client.CustomObjectsApi(api).create_namespaced_custom_object(
            GROUP, VERSION, NAMESPACE, PLURAL, pdd_body(prometheus.url, ttft_ms)
        )
        print(f"applied {NAMESPACE}/{NAME}; load: {what}", file=out, flush=True)
        watch(api, sim, options, ttft_ms, samples, out=out)
    except KeyboardInterrupt:
        interrupted = True
        print("\ninterrupted: cleaning up", file=out, flush=True)
    finally:
        records: list[RequestRecord] = []
        scaled = 0
        deployment = sim.deployment(NAMESPACE, NAME) if sim is not None else None
        if deployment is not None:
            with deployment.lock:
                records = list(deployment.records)
        if api is not None and sim is not None:
            try:
                events = client.CoreV1Api(api).list_namespaced_event(NAMESPACE).items
                scaled = sum(1 for e in events if e.reason in ("ScaledUp", "ScaledDown"))
            except client.ApiException:
                pass  # the summary says 0; the cleanup below matters more
        _teardown(operator, sim, api, prometheus, cluster)
    summary = summarize(samples, records, scaled, what)
    notes = write_outputs(samples, options.output, options.plot)
    (options.output / "summary.txt").write_text(summary + "\n")
    print("\nsummary\n" + summary, file=out)
    print("\n".join([*notes, f"summary: {options.output / 'summary.txt'}"]), file=out, flush=True)
    return 130 if interrupted else 0


def _teardown(
    operator: OperatorThread | None,
    sim: SimCluster | None,
    api: client.ApiClient | None,
    prometheus: LocalPrometheus,
    cluster: LocalCluster,
) -> None:
    # A second Ctrl-C during cleanup must not leave the processes below running.
    previous = signal.getsignal(signal.SIGINT)
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        if operator is not None:
            operator.stop()  # first: nothing scales pods while they go
        if sim is not None:
            if api is not None:
                # Pods go while their kubelet still runs; then stop() takes the nodes.
                with contextlib.suppress(client.ApiException):
                    client.CoreV1Api(api).delete_collection_namespaced_pod(
                        NAMESPACE, grace_period_seconds=0
                    )
            sim.stop()
        prometheus.stop()
        cluster.stop()
    finally:
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGINT, previous)
