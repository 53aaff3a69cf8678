"""`pdctl demo`: the closed loop on one machine, with real requests through the endpoint.

A local control plane, a real Prometheus, the serving cluster (four S5000 and two H200 virtual
nodes and a CPU node for the router) with the mock scheduler, and the operator, all started
here. The virtual kubelet runs each engine pod as an engine-simulator process and the router pod
as the real `vllm-router`, each on its own loopback address. A client process sends a load with
a prefill surge and a decode step through the PDDeployment's endpoint and measures what its
users see; the table shows the pools, each role's latency against its own target and the
operator's decisions. Every process and thread started here is stopped on the way out, Ctrl-C
and SIGTERM included.
"""

import asyncio
import calendar
import contextlib
import copy
import csv
import importlib
import itertools
import logging
import math
import multiprocessing
import os
import queue
import random
import re
import shutil
import signal
import sys
import tempfile
import textwrap
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from types import FrameType
from typing import Any, TextIO

import yaml
from kubernetes import client
from prometheus_client import start_http_server

from pd_operator.adapters.kube import load_api_client
from pd_operator.core.hardware import GLM_45_FP8, MTT_S5000
from pd_operator.core.perfmodel import PrefillCoefficients
from pd_operator.handlers.operator import OperatorConfig, OperatorState, run_operator
from pd_operator.localcluster import LocalCluster, LocalPrometheus, find_binary
from pd_operator.sim.http_load import (
    REJECTED,
    LoadConfig,
    RequestRecord,
    format_summary,
    quantile,
    replay,
    summarize,
    write_csv,
)
from pd_operator.sim.pod_processes import service_urls
from pd_operator.sim.scheduler import SCHEDULER_NAME
from pd_operator.sim.virtual import VirtualCluster
from pd_operator.sim.workload import (
    ReplayOptions,
    Request,
    TokenLengths,
    read_trace,
)

ROOT = Path(__file__).resolve().parents[3]
PROFILE = ROOT / "config" / "clusters" / "serving.yaml"
SAMPLE = ROOT / "config" / "samples" / "heterogeneous-s5000-h200.yaml"
TRACE = ROOT.parent / "shared" / "traces" / "conversation_trace.jsonl"
SLICE = ROOT / "data" / "traces" / "mooncake_conversation_head300.jsonl"
NAMESPACE, NAME = "demo", "glm-hetero"
GROUP, VERSION, PLURAL = "pdoperator.io", "v1alpha1", "pddeployments"
# Container start and model load 20x faster than the wall clock (an 82 s load takes 4 s). The
# engines serve in real time: every latency here is a wall-clock one.
TIME_SCALE = 0.05
INTERVAL_SECONDS = 5
WINDOW_SECONDS = 10  # the SLO window; also the client's window in the table
# Both targets sit on a bound of vLLM's histogram buckets, so that a reading in the bucket above
# is a certain breach (docs/autoscaling.md, "histogram buckets"). TTFT: 2.5x a median prompt's
# own prefill on one S5000, which the calm load meets and a queue soon exceeds. ITL: vLLM's
# first bucket; one H200 generates ~1,600 tokens/s within it at the decode step's contexts.
TTFT_TARGET_MS = 750
ITL_TARGET_MS = 10
# The decode step asks 1.5x what one H200 generates within the ITL target (one: ~13 ms, two:
# ~7 ms); its answers are lengthened, up to the trace's longest (2,000 tokens), to ask it.
DECODE_STEP_TOKENS_PER_S = 2400.0
LONGEST_ANSWER = 2000
# The decode step's prompts: the trace's requests with prompts up to this long (a third of them),
# so that prefill stays calm while decode is not; long answers keep streams for tens of seconds
# and a stream stays on its replica, so the step's answers must also stay short enough (~800
# tokens, ~10 s) for a new decode replica to take over within the phase.
SHORT_PROMPT_TOKENS = 4096
# Synthetic prompts when no trace is wanted: one S5000 prefills ~4.8 of them per second.
SYNTHETIC = TokenLengths(6000, 150, input_cv=0.25, output_cv=0.5)
SYNTHETIC_SHORT = TokenLengths(1700, 150, input_cv=0.25, output_cv=0.5)  # the trace's short ones
REQUEST_TIMEOUT_S = 120.0
END_GRACE_S = 10.0  # after the load: how long requests in flight may finish
MAX_IN_FLIGHT = 256  # the client's bound; beyond it a request is rejected, never queued
READY_TIMEOUT_S = 180.0
WIDTH = 100  # the table fits a terminal this wide
DECISION_LINES = 4
RATE_BIN_S = 5.0  # the plot's request rates
STRATUM_S = 5.0  # a phase's rate holds over each stretch this long
SINGLE_REPLICA_CARDS = 8  # the sample's perReplica on the S5000 pool


@dataclass(frozen=True)
class Phase:
    """A stretch of the load: its share of the run, its request rate as a multiple of what one
    S5000 replica prefills of its prompts, the generated tokens/s it asks (None: the load's own
    answers), and whether its prompts are the short ones."""

    name: str
    share: float
    prefill_load: float
    decode_tokens_per_s: float | None = None
    short_prompts: bool = False


# Calm; a decode step that keeps prefill as calm (30% of one S5000) and asks 1.5x of one H200;
# a prefill surge that two S5000 cannot serve (1.3x their capacity: a queue, TTFT past the
# target); calm again. Two, because the sample's prefill-to-decode ratio (at least 100%) grows
# prefill to two with decode. The decode step comes first: after a surge, the queue that
# prefill drains once it has grown reaches decode as one burst of streams, which breaches ITL
# by itself and would blur which phase scaled decode.
PHASES = (
    Phase("calm", 0.10, 0.3),
    Phase("decode step", 0.45, 0.3, DECODE_STEP_TOKENS_PER_S, short_prompts=True),
    Phase("prefill surge", 0.30, 2.6),
    Phase("calm", 0.15, 0.3),
)


@dataclass(frozen=True)
class PhaseLoad:
    """One phase as built: where it lies in the run and what it sends."""

    name: str
    start_s: float
    end_s: float
    rate_rps: float
    answer_tokens: float  # mean answer length
    lengthened: bool  # answers longer than in the load


@dataclass
class Load:
    """What the client sends: requests with arrivals in seconds from the load's start."""

    what: str
    source: str  # where the requests come from
    requests: list[Request]
    phases: list[PhaseLoad]
    skipped: int = 0  # trace requests longer than the model's context, left out


@dataclass
class Sample:
    """One table row at one moment (seconds since the load started)."""

    t: float
    role: str
    pool: str
    ready: int
    desired: int
    pending: int
    latency_ms: int | None  # the operator's reading for the role: TTFT (prefill), ITL (decode)
    target_ms: int
    slo: str  # met, VIOLATED, or - (no reading)
    client_ms: float | None  # the client's P50 of the same latency over the last window
    sent_per_s: float
    completed_per_s: float


@dataclass
class DemoOptions:
    """What `pdctl demo` runs: wall seconds of load, the load, the output folder."""

    duration_s: float = 180.0
    load: str = "auto"  # auto: the shared trace if present, else the shipped slice
    plot: bool = True
    output: Path | None = None  # None: pd-demo-<time> in the temporary folder
    refresh_s: float = 2.0


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt  # SIGTERM cleans up exactly as Ctrl-C does


# --- the load -------------------------------------------------------------------------------


def prefill_capacity_rps(prompts: Sequence[int]) -> float:
    """Requests/s one 8-card S5000 replica prefills of these prompts, one at a time (most are
    longer than half a batch of 8,192 tokens): the performance model the engines run."""
    model = PrefillCoefficients.from_profiles(MTT_S5000, GLM_45_FP8, SINGLE_REPLICA_CARDS)
    seconds = sum(model.batch_ms([n]) for n in prompts) / 1000 / len(prompts)
    return 1 / seconds


def lengthen(requests: list[Request], tokens: float, context: int) -> tuple[list[Request], float]:
    """The requests with their answers scaled to add up to `tokens`, each at most
    LONGEST_ANSWER and within the context; and the scale."""

    def scaled(scale: float) -> list[int]:
        return [
            max(1, min(LONGEST_ANSWER, context - r.input_tokens, round(r.output_tokens * scale)))
            for r in requests
        ]

    low, high = 1.0, 64.0
    for _ in range(40):  # bisection: the capped total grows with the scale
        middle = (low + high) / 2
        low, high = (middle, high) if sum(scaled(middle)) < tokens else (low, middle)
    answers = scaled(high)
    return [replace(r, output_tokens=n) for r, n in zip(requests, answers, strict=True)], high


def _phase_bounds(duration_s: float) -> list[tuple[Phase, float, float]]:
    bounds, start = [], 0.0
    for phase in PHASES:
        end = start + phase.share * duration_s
        bounds.append((phase, start, end))
        start = end
    return bounds


def trace_load(
    path: Path, duration_s: float, context: int, *, name: str, where: str, seed: int = 1
) -> Load:
    """The trace end to end over the run (its timeline compressed, or stretched, to the run's
    length), each phase keeping as many of its requests as give the phase its rate: a seeded
    sample of them (of copies of them where the trace has too few), drawn per STRATUM_S of the
    run, so that the rate holds through the phase while the trace's own bursts stay. Requests
    longer than the context are left out."""
    fits = [r for r in read_trace(path) if r.input_tokens + r.output_tokens <= context]
    skipped = sum(1 for _ in read_trace(path)) - len(fits)
    if not fits:
        raise ValueError(f"{path}: no request fits the model's {context:,}-token context")
    compression = max(fits[-1].arrival_s, 1.0) / duration_s

    def takes(phase: Phase, request: Request) -> bool:
        short = not phase.short_prompts or request.input_tokens <= SHORT_PROMPT_TOKENS
        return short and request.input_tokens + request.output_tokens <= context

    draws = random.Random(seed)
    requests: list[Request] = []
    phases: list[PhaseLoad] = []
    for phase, start, end in _phase_bounds(duration_s):
        capacity = prefill_capacity_rps([r.input_tokens for r in fits if takes(phase, r)])
        count = max(1, round((end - start) / STRATUM_S))
        edges = [start + (end - start) * i / count for i in range(count + 1)]
        wanted = [
            round(phase.prefill_load * capacity * edges[i + 1])
            - round(phase.prefill_load * capacity * edges[i])
            for i in range(count)
        ]
        present = [
            sum(1 for r in fits if takes(phase, r) and low <= r.arrival_s / compression < high)
            for low, high in itertools.pairwise(edges)
        ]
        copies = max(math.ceil(w / p) for w, p in zip(wanted, present, strict=True) if p)
        options = ReplayOptions(
            start_s=start * compression,
            duration_s=(end - start) * compression,
            rate_scale=max(1, copies),
            time_compression=compression,
            seed=draws.randrange(1 << 30),
        )
        offered = [
            replace(r, arrival_s=start + r.arrival_s)
            for r in read_trace(path, options)
            if takes(phase, r)
        ]
        chosen: list[Request] = []
        for index, (low, high) in enumerate(itertools.pairwise(edges)):
            # What a stratum with too few requests could not take is spread over the rest.
            need = round((sum(wanted) - len(chosen)) / (count - index))
            stratum = [r for r in offered if low <= r.arrival_s < high]
            chosen += sorted(
                draws.sample(stratum, min(need, len(stratum))), key=lambda r: r.arrival_s
            )
        chosen, shape = _shaped(phase, chosen, (start, end), context)
        requests += chosen
        phases.append(shape)
    span = fits[-1].arrival_s
    what = f"{name}, its {span:,.0f} s played over {duration_s:,.0f} s"
    return Load(what, where, requests, phases, skipped)


def synthetic_load(duration_s: float, context: int, seed: int = 1) -> Load:
    """SYNTHETIC prompts (SYNTHETIC_SHORT for short-prompt phases) at each phase's rate: as many
    as the rate asks, at uniformly drawn times (Poisson arrivals given their number)."""
    draws = random.Random(seed)
    requests: list[Request] = []
    phases: list[PhaseLoad] = []
    for phase, start, end in _phase_bounds(duration_s):
        lengths = SYNTHETIC_SHORT if phase.short_prompts else SYNTHETIC
        capacity = prefill_capacity_rps([lengths.sample(draws)[0] for _ in range(1000)])
        times = sorted(
            draws.uniform(start, end)
            for _ in range(round(phase.prefill_load * capacity * (end - start)))
        )
        chosen = []
        for at in times:
            prompt, answer, _ = lengths.sample(draws)
            chosen.append(Request(at, prompt, min(answer, context - prompt)))
        chosen, shape = _shaped(phase, chosen, (start, end), context)
        requests += chosen
        phases.append(shape)
    what = f"synthetic {SYNTHETIC.input_mean:,.0f}-token prompts, Poisson arrivals"
    return Load(what, f"sim.workload.TokenLengths, seed {seed}", requests, phases)


def _shaped(
    phase: Phase, chosen: list[Request], span: tuple[float, float], context: int
) -> tuple[list[Request], PhaseLoad]:
    """A phase's requests, their answers lengthened when it asks for generated tokens."""
    scale = 1.0
    if phase.decode_tokens_per_s is not None and chosen:
        wanted = phase.decode_tokens_per_s * (span[1] - span[0])
        chosen, scale = lengthen(chosen, wanted, context)
    rate = len(chosen) / (span[1] - span[0])
    answers = sum(r.output_tokens for r in chosen) / max(len(chosen), 1)
    return chosen, PhaseLoad(phase.name, *span, rate, answers, scale > 1)


def build_load(options: DemoOptions, context: int) -> Load:
    """The requests the client sends, from the option `--load`."""
    if options.load == "synthetic":
        return synthetic_load(options.duration_s, context)
    path = (
        TRACE if options.load == "trace" or (options.load == "auto" and TRACE.exists()) else SLICE
    )
    if path == TRACE:
        name, where = "Mooncake conversation trace", str(path.relative_to(ROOT.parent))
    else:
        name, where = "Mooncake conversation trace, first 300 requests", str(path.relative_to(ROOT))
    return trace_load(path, options.duration_s, context, name=name, where=where)


def describe(load: Load) -> list[str]:
    """The load's phases, one line each."""
    lines = []
    for p in load.phases:
        longer = " (lengthened)" if p.lengthened else ""
        lines.append(
            f"  {p.start_s:4.0f}-{p.end_s:3.0f} s  {p.name:<14}{p.rate_rps:5.1f} req/s, answers "
            f"{p.answer_tokens:5,.0f} tokens on average{longer}"
        )
    return lines


# --- the client (its own process, so that its timing does not share a GIL) -------------------


@dataclass(frozen=True)
class Order:
    """What the client process is told once the endpoint is there."""

    url: str
    model: str
    start_wall: float  # time.time() of the load's start
    end_s: float  # no arrival after this many seconds


def _client(requests: list[Request], go: Any, records: Any) -> None:
    """The client process: waits for an `Order` on `go` (None: stop), then sends."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the demo stops it, after its own cleanup
    order = go.get()
    if order is not None:
        asyncio.run(_send_all(requests, order, records))


async def _send_all(requests: list[Request], order: Order, out: Any) -> None:
    """Open loop: each request at its arrival, as its own one-request `replay`, so that its
    record comes back the moment it is answered (times shifted to seconds since the start)."""
    loop = asyncio.get_running_loop()
    began = loop.time() + (order.start_wall - time.time())
    end_s = order.end_s
    in_flight: set[asyncio.Task[None]] = set()

    async def one(index: int, request: Request, sent_s: float) -> None:
        out.put(sent_s)  # the demo counts what is sent as it goes, not when it is answered
        config = LoadConfig(
            url=order.url,
            model=order.model,
            max_in_flight=1,
            timeout_s=REQUEST_TIMEOUT_S,
            deadline_s=max(end_s + END_GRACE_S - sent_s, 0.1),
        )
        (record,) = (await replay([replace(request, arrival_s=0.0)], config)).records
        record.index, record.arrival_s = index, request.arrival_s
        record.start_s = None if record.start_s is None else record.start_s + sent_s
        record.end_s = None if record.end_s is None else record.end_s + sent_s
        out.put(record)

    for index, request in enumerate(requests):
        if request.arrival_s >= end_s:
            break
        await asyncio.sleep(max(0.0, began + request.arrival_s - loop.time()))
        if len(in_flight) >= MAX_IN_FLIGHT:
            record = RequestRecord(
                index, request.arrival_s, request.input_tokens, request.output_tokens
            )
            record.fail(REJECTED, f"{MAX_IN_FLIGHT} requests already in flight")
            out.put(record)
            continue
        task = asyncio.create_task(one(index, request, loop.time() - began))
        in_flight.add(task)
        task.add_done_callback(in_flight.discard)
    if in_flight:
        await asyncio.wait(set(in_flight))  # each ends by its own deadline


class Client:
    """The client process and the records it has sent back so far."""

    def __init__(self, load: Load) -> None:
        context = multiprocessing.get_context("spawn")
        self._go: Any = context.Queue()
        self._records: Any = context.Queue()
        self.records: list[RequestRecord] = []
        self.sent: list[float] = []  # seconds since the start at which requests went out
        self.process = context.Process(
            target=_client,
            args=(load.requests, self._go, self._records),
            name="pd-demo-client",
            daemon=True,
        )

    def start(self) -> None:
        self.process.start()  # imports while the cluster comes up; sends only on `go`

    def go(self, order: Order) -> None:
        self._go.put(order)

    def collect(self) -> None:
        """Take what the client has sent back: send times and answered requests' records."""
        with contextlib.suppress(queue.Empty):
            while True:
                item = self._records.get_nowait()
                if isinstance(item, RequestRecord):
                    self.records.append(item)
                else:
                    self.sent.append(item)

    def finish(self, timeout_s: float) -> None:
        """Wait up to `timeout_s` for the client to end on its own, collecting as it goes."""
        deadline = time.monotonic() + timeout_s
        while self.process.is_alive() and time.monotonic() < deadline:
            self.collect()
            self.process.join(0.2)
        self.collect()

    def stop(self) -> None:
        """End the client now (its open connections close with it)."""
        if self.process.pid is None:
            return
        with contextlib.suppress(ValueError, OSError):
            self._go.put(None)  # still waiting for `go`: it returns
        self.process.join(1.0)
        if self.process.is_alive():
            self.process.terminate()
            self.process.join(5.0)
        if self.process.is_alive():
            self.process.kill()
            self.process.join(5.0)
        self.collect()
        for channel in (self._go, self._records):
            channel.close()
            channel.cancel_join_thread()


def client_window(
    records: list[RequestRecord], sent_s: list[float], t: float, window_s: float
) -> dict[str, float]:
    """What users saw over the last `window_s`: TTFT and ITL P50 (ms) of requests answered in
    it (every gap counts, as in the engines' histograms), requests sent and completed per s."""
    done = [
        r for r in records if r.reason is None and r.end_s is not None and t - window_s < r.end_s
    ]
    ttft = sorted(r.ttft_s for r in done if r.ttft_s is not None)
    itl = sorted(gap for r in done for gap in r.itl_s)
    sent = sum(1 for at in sent_s if t - window_s < at <= t)
    return {
        "ttft_ms": quantile(ttft, 0.5) * 1000,
        "itl_ms": quantile(itl, 0.5) * 1000,
        "sent_per_s": sent / window_s,
        "completed_per_s": len(done) / window_s,
    }


# --- the PDDeployment, the operator, the table ----------------------------------------------


def pdd_body(prometheus_url: str) -> dict[str, Any]:
    """The heterogeneous sample on the mock scheduler, Active, with short intervals, the router
    on the CPU node."""
    body: dict[str, Any] = copy.deepcopy(yaml.safe_load(SAMPLE.read_text()))
    spec = body["spec"]
    spec["slo"] = {
        "ttft": {"percentile": "P50", "targetMilliseconds": TTFT_TARGET_MS},
        "itl": {"percentile": "P50", "targetMilliseconds": ITL_TARGET_MS},
        "windowSeconds": WINDOW_SECONDS,
    }
    for role in ("prefill", "decode"):
        for pool in spec[role]["pools"]:
            pool["template"] = {**pool.get("template", {}), "schedulerName": SCHEDULER_NAME}
    # The engine simulator has no prefix cache, so cache-aware routing would only keep a
    # repeated prefix on the replica that saw it first; the less loaded of two spreads a surge.
    spec["router"] = {"prefillPolicy": "PowerOfTwo", "template": {"schedulerName": SCHEDULER_NAME}}
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
    """The operator on its own event loop in a thread of this process, its /metrics on a free
    port of 127.0.0.1."""

    def __init__(self, kubeconfig: Path) -> None:
        self._server, _ = start_http_server(0, addr="127.0.0.1")
        self.metrics_port = int(self._server.server_port)
        settings = OperatorConfig(
            namespaces=[NAMESPACE], workers=2, resync_seconds=5, metrics_port=self.metrics_port
        )
        self.state = OperatorState(load_api_client(str(kubeconfig)), settings)
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
        self._server.shutdown()
        self._server.server_close()


def get_pdd(api: client.ApiClient) -> dict[str, Any]:
    """The demo's PDDeployment as the apiserver has it."""
    obj: Any = client.CustomObjectsApi(api).get_namespaced_custom_object(
        GROUP, VERSION, NAMESPACE, PLURAL, NAME
    )
    return dict(obj)


def verdict(latency_ms: int | None, target_ms: int) -> str:
    """A role's SLO from its own reading against its own target."""
    if latency_ms is None:
        return "-"
    return "met" if latency_ms <= target_ms else "VIOLATED"


def read_samples(
    status: dict[str, Any], t: float, client_now: dict[str, float]
) -> tuple[list[Sample], dict[str, Any]]:
    """The pool rows from the PDDeployment's status, and its router status."""
    observed = status.get("observed") or {}
    rows = []
    for pool in status.get("pools") or []:
        prefill = pool["role"] == "prefill"
        latency = observed.get("ttftMilliseconds" if prefill else "itlMilliseconds")
        target = TTFT_TARGET_MS if prefill else ITL_TARGET_MS
        mine = client_now["ttft_ms" if prefill else "itl_ms"]
        rows.append(
            Sample(
                t=t,
                role=pool["role"],
                pool=pool["name"],
                ready=pool.get("readyReplicas", 0),
                desired=pool.get("desiredReplicas", 0),
                pending=pool.get("unschedulableReplicas", 0),
                latency_ms=latency,
                target_ms=target,
                slo=verdict(latency, target),
                client_ms=None if math.isnan(mine) else mine,
                sent_per_s=client_now["sent_per_s"],
                completed_per_s=client_now["completed_per_s"],
            )
        )
    return rows, status.get("router") or {}


def _top_level(text: str, separator: str) -> list[str]:
    """`text` split at `separator` outside parentheses."""
    parts, depth, start, i = [], 0, 0, 0
    while i < len(text):
        if text[i] == "(":
            depth += 1
        elif text[i] == ")":
            depth -= 1
        elif depth == 0 and text.startswith(separator, i):
            parts.append(text[start:i])
            start = i = i + len(separator)
            continue
        i += 1
    return [*parts, text[start:]]


def short_reason(reason: str, width: int) -> str:
    """A decision's reason in `width` columns: per role its move and as many of the first
    clauses of why as fit, without nested details; cut with '~' when even one does not."""
    roles = []
    for part in _top_level(reason, "; "):
        head, bracket, why = part.partition(" (")
        clauses = _top_level(why.removesuffix(")"), ", ") if bracket else []
        roles.append((head, [_NESTED.sub("", clause) for clause in clauses]))
    # The roles that move replicas keep their second clause (the demand) longest.
    for moved, held in ((2, 2), (2, 1), (1, 1)):
        text = "; ".join(
            f"{head} ({', '.join(clauses[: moved if '->' in head else held])})" if clauses else head
            for head, clauses in roles
        )
        if len(text) <= width:
            return text
    text = text.replace("x target", "x")  # "TTFT 1.5x": still says what it is
    return text if len(text) <= width else text[: width - 1] + "~"


_NESTED = re.compile(r" \([^()]*\)")


def render(
    rows: list[Sample],
    router: dict[str, Any],
    decisions: list[tuple[str, str]],
    header: str,
    footer: str,
) -> str:
    """The live table, WIDTH columns at most."""
    lines = [
        header,
        f"{'pool':<16}{'ready':>6}{'desired':>8}{'pending':>8}   {'operator P50':<13}"
        f"{'target':>8}  {'SLO':<10}{'client P50':>11}",
    ]
    for row in rows:
        kind = "TTFT" if row.role == "prefill" else "ITL"
        seen = f"{row.latency_ms} ms" if row.latency_ms is not None else "-"
        mine = "-" if row.client_ms is None else f"{row.client_ms:,.1f} ms"
        lines.append(
            f"{row.role + '/' + row.pool:<16}{row.ready:>6}{row.desired:>8}{row.pending:>8}   "
            f"{kind:<5}{seen:>8}{row.target_ms:>5} ms  {row.slo:<10}{mine:>11}"
        )
    if router:
        lines.append(
            f"{'router':<16}{router.get('readyReplicas', 0):>6}"
            f"{router.get('desiredReplicas', 0):>8}"
        )
    lines += footer.splitlines()
    for stamp, reason in decisions[-DECISION_LINES:]:
        lines.append(f" {stamp} {short_reason(reason, WIDTH - 2 - len(stamp))}")
    return "\n".join(line[:WIDTH] for line in lines)


# --- CPU ------------------------------------------------------------------------------------

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float | None:
    """User + system CPU seconds of a process (all its threads); None when it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


def machine_busy_seconds() -> float:
    """CPU seconds all cores spent not idle since boot."""
    values = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = values[3] + (values[4] if len(values) > 4 else 0)
    return (sum(values) - idle) / CLOCK_TICKS


class CpuMeter:
    """CPU of the demo's processes, sampled as the load runs: on average, in its busiest
    window, per kind of process; and of the whole machine (other work on it included)."""

    def __init__(self) -> None:
        self.start: dict[int, float] = {}  # CPU seconds when first seen (0: started in the run)
        self.last: dict[int, float] = {}
        self.names: dict[int, str] = {}
        self.totals: list[tuple[float, float]] = []  # (t, the processes' CPU seconds so far)
        self.machine: list[tuple[float, float]] = []

    def sample(self, t: float, named: dict[int, str]) -> None:
        """Read every process's CPU at `t` (seconds since the load started)."""
        for pid, name in named.items():
            seconds = cpu_seconds(pid)
            if seconds is None:
                continue  # gone: what it used until the last sample is kept
            if pid not in self.last:
                self.start[pid] = seconds if not self.totals else 0.0
            self.last[pid], self.names[pid] = seconds, name
        self.totals.append((t, sum(self.last[pid] - self.start[pid] for pid in self.last)))
        self.machine.append((t, machine_busy_seconds()))

    def report(self, window_s: float = WINDOW_SECONDS) -> str:
        """One line: cores used on average and at the busiest `window_s`, who used them."""
        if len(self.totals) < 2 or self.totals[-1][0] - self.totals[0][0] < window_s:
            return "CPU: not measured (the load ran too short)"
        wall = self.totals[-1][0] - self.totals[0][0]
        used: dict[str, float] = {}
        for pid, seconds in self.last.items():
            used[self.names[pid]] = used.get(self.names[pid], 0.0) + seconds - self.start[pid]
        peak = max(
            (b[1] - a[1]) / (b[0] - a[0])
            for i, a in enumerate(self.totals)
            for b in self.totals[i + 1 :]
            if b[0] - a[0] >= window_s
        )
        machine = (self.machine[-1][1] - self.machine[0][1]) / wall
        ranked = sorted(used.items(), key=lambda item: -item[1])
        parts = ", ".join(f"{name} {seconds / wall:.2f}" for name, seconds in ranked)
        by_process = textwrap.fill(
            f"by process: {parts};", WIDTH, initial_indent="  ", subsequent_indent="    "
        )
        return (
            f"CPU during the load, in cores of {os.cpu_count()}: the demo's processes "
            f"{sum(used.values()) / wall:.2f} on average, {peak:.2f} in the busiest {window_s} s;\n"
            f"{by_process}\n  the whole machine: {machine:.2f} (with whatever else runs on it)"
        )


# --- report ---------------------------------------------------------------------------------


def phase_of(load: Load, t: float) -> str:
    """The name of the phase the load is in at `t`."""
    return next((p.name for p in load.phases if p.start_s <= t < p.end_s), "end")


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


# --- the run --------------------------------------------------------------------------------


def _curl(url: str, model: str) -> str:
    body = f'{{"model": "{model}", "prompt": "Hello there", "max_tokens": 16}}'
    return f"curl -s {url}/v1/completions -H 'Content-Type: application/json' -d '{body}'"


class DemoRun:
    """One run: what it started (for the cleanup) and what it saw (for the report)."""

    def __init__(self, options: DemoOptions, output: Path, out: TextIO) -> None:
        self.options, self.output, self.out = options, output, out
        sample = yaml.safe_load(SAMPLE.read_text())
        self.model: str = sample["spec"]["model"]["name"]
        self.load = build_load(options, int(sample["spec"]["model"]["contextLength"]))
        self.cluster, self.prometheus = LocalCluster(), LocalPrometheus()
        self.serve_dir = Path(tempfile.mkdtemp(prefix="pd-demo-pods-"))
        self.client = Client(self.load)
        self.virtual: VirtualCluster | None = None
        self.operator: OperatorThread | None = None
        self.api: client.ApiClient | None = None
        self.samples: list[Sample] = []
        self.decisions: list[tuple[str, str]] = []  # (time, reason), each one once
        self.events = {"ScaledUp": 0, "ScaledDown": 0}
        self.meter = CpuMeter()
        self.cpu = "CPU: not measured (the load did not run to its end)"

    def say(self, text: str) -> None:
        print(text, file=self.out, flush=True)

    def bring_up(self) -> tuple[str, str]:
        """Everything up and the PDDeployment applied; its endpoint and a router URL once it is
        Ready."""
        self.say(f"output folder: {self.output}")
        self.say(f"starting the local control plane ({self.cluster.dir})")
        self.cluster.start()
        self.say(f"starting Prometheus ({self.prometheus.dir})")
        self.prometheus.start()
        self.api = api = load_api_client(str(self.cluster.kubeconfig))
        client.CoreV1Api(api).create_namespace(
            client.V1Namespace(metadata=client.V1ObjectMeta(name=NAMESPACE))
        )
        self.say(f"starting the virtual nodes of {PROFILE.name} and the operator")
        self.virtual = VirtualCluster(
            api,
            PROFILE,
            time_scale=TIME_SCALE,
            namespace=NAMESPACE,
            serve_dir=self.serve_dir,
            sd_file=self.prometheus.targets_dir / "demo-pods.json",
        )
        self.virtual.start()
        self.operator = OperatorThread(self.cluster.kubeconfig)
        self.operator.start()
        self.prometheus.set_targets(
            "pd-operator", [f"127.0.0.1:{self.operator.metrics_port}"], {"job": "pd-operator"}
        )
        self.client.start()
        client.CustomObjectsApi(api).create_namespaced_custom_object(
            GROUP, VERSION, NAMESPACE, PLURAL, pdd_body(self.prometheus.url)
        )
        self.say(f"applied {NAMESPACE}/{NAME} ({SAMPLE.relative_to(ROOT)})")
        return self._wait_for_endpoint(api)

    def _wait_for_endpoint(self, api: client.ApiClient) -> tuple[str, str]:
        deadline = time.monotonic() + READY_TIMEOUT_S
        said = ""
        while time.monotonic() < deadline:
            status = get_pdd(api).get("status") or {}
            ready = {c["type"]: c["status"] for c in status.get("conditions") or []}.get("Ready")
            urls = service_urls(api, NAMESPACE, NAME, "http") if ready == "True" else []
            if urls and status.get("endpoint"):
                return str(status["endpoint"]), urls[0]
            pools = ", ".join(
                f"{p['role']} {p.get('readyReplicas', 0)}/{p.get('desiredReplicas', 0)}"
                for p in status.get("pools") or []
            )
            routers = (status.get("router") or {}).get("readyReplicas", 0)
            now = f"waiting for Ready: {pools or 'no pools yet'}, router {routers}"
            if now != said:
                self.say(now)
                said = now
            time.sleep(1.0)
        raise TimeoutError(f"{NAMESPACE}/{NAME} was not Ready within {READY_TIMEOUT_S:g} s")

    def announce(self, endpoint: str, url: str) -> None:
        """Where everything is, and how to try the endpoint by hand."""
        assert self.operator is not None
        kubectl = find_binary("kubectl")
        self.say(
            "\n".join(
                [
                    f"kubectl:          {kubectl} --kubeconfig {self.cluster.kubeconfig} "
                    f"get pdd -n {NAMESPACE}",
                    f"Prometheus:       {self.prometheus.url}",
                    f"operator metrics: http://127.0.0.1:{self.operator.metrics_port}/metrics",
                    f"endpoint:         {endpoint} (status.endpoint); here: {url}",
                    f"try it:           {_curl(url, self.model)}",
                    f"load:             {self.load.what}",
                    f"                  from {self.load.source}",
                    *describe(self.load),
                    f"SLO (P50 over {WINDOW_SECONDS} s): TTFT {TTFT_TARGET_MS} ms (prefill), "
                    f"ITL {ITL_TARGET_MS} ms (decode)",
                ]
            )
        )

    def processes(self) -> dict[int, str]:
        """Every process of the demo by pid, named by what it is."""
        named = {os.getpid(): "demo (operator, kubelet, table)"}
        if self.client.process.pid:
            named[self.client.process.pid] = "client"
        for managed in self.cluster.processes:
            named[managed.pid] = "control plane"
        if self.prometheus.process is not None:
            named[self.prometheus.process.pid] = "Prometheus"
        if self.api is not None and self.virtual is not None and self.virtual.processes:
            roles = {
                (p.metadata.uid if p.metadata else ""): (
                    (p.metadata.labels or {}) if p.metadata else {}
                ).get("pdoperator.io/role", "?")
                for p in client.CoreV1Api(self.api).list_namespaced_pod(NAMESPACE).items
            }
            for uid, process in list(self.virtual.processes.running.items()):
                role = roles.get(uid, "?")
                named[process.popen.pid] = "router" if role == "router" else f"{role} engines"
        return named

    def serve(self, url: str) -> None:
        """Send the load and watch for its duration; measure the CPU it took."""
        began = time.time() + 1.0
        self.client.go(Order(url, self.model, began, self.options.duration_s))
        time.sleep(1.0)
        self.watch(began)
        self.cpu = self.meter.report()
        self.say(f"load over: up to {END_GRACE_S:g} s for the requests in flight")
        self.client.finish(END_GRACE_S + 5)

    def watch(self, began: float) -> None:
        """Redraw the table every `refresh_s` until the load's end."""
        assert self.api is not None
        tty = self.out.isatty()
        with (self.output / "decisions.log").open("w") as log:
            while (t := time.time() - began) < self.options.duration_s:
                self.client.collect()
                self.meter.sample(t, self.processes())
                now = client_window(self.client.records, self.client.sent, t, WINDOW_SECONDS)
                status = get_pdd(self.api).get("status") or {}
                rows, router = read_samples(status, t, now)
                self.samples += rows
                decision = status.get("lastDecision") or {}
                if decision and (decision["time"], decision["reason"]) not in self.decisions[-1:]:
                    self.decisions.append((decision["time"], decision["reason"]))
                    at = _seconds_since(decision["time"], began)
                    log.write(f"{decision['time']} (t={at:.0f} s) {decision['reason']}\n")
                    log.flush()
                shown = self._shown(began)
                table = render(rows, router, shown, self._header(t), self._footer(now))
                print(("\x1b[H\x1b[2J" if tty else "\n") + table, file=self.out, flush=True)
                time.sleep(max(0.0, min(self.options.refresh_s, self.options.duration_s - t)))

    def _header(self, t: float) -> str:
        return (
            f"pd-operator demo  {t:3.0f}/{self.options.duration_s:.0f} s  phase: "
            f"{phase_of(self.load, t)}  ({NAMESPACE}/{NAME}; Ctrl-C stops)"
        )

    def _footer(self, now: dict[str, float]) -> str:
        records = self.client.records
        failed = sum(1 for r in records if r.reason is not None)
        return (
            f"requests: sent {now['sent_per_s']:.1f}/s, completed {now['completed_per_s']:.1f}/s "
            f"(last {WINDOW_SECONDS} s); {len(self.client.sent)} sent, "
            f"{len(records) - failed} answered, {failed} failed\n"
            "decisions (full text in decisions.log):"
        )

    def _shown(self, began: float) -> list[tuple[str, str]]:
        """The last decisions that moved replicas, and the latest one if it did not; each
        with its time on the table's clock."""
        moved = [d for d in self.decisions if "->" in d[1]][-(DECISION_LINES - 1) :]
        if self.decisions and self.decisions[-1] not in moved:
            moved.append(self.decisions[-1])
        return [(f"{_seconds_since(stamp, began):3.0f}s", reason) for stamp, reason in moved]

    def teardown(self) -> None:
        """Stop everything this run started, in an order that leaves nothing behind."""
        # A second Ctrl-C during cleanup must not leave the processes below running.
        previous = signal.getsignal(signal.SIGINT)
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGINT, signal.SIG_IGN)
        try:
            if self.api is not None:
                self.events = _scaling_events(self.api, self.events)
            self.client.stop()  # first: the engines then have nothing in flight to drain
            if self.operator is not None:
                self.operator.stop()  # next: nothing scales pods while they go
            if self.virtual is not None:
                if self.api is not None:
                    _delete_pods(self.api)
                self.virtual.stop()
            self.prometheus.stop()
            self.cluster.stop()
        finally:
            _keep_pod_logs(self.serve_dir, self.output / "pods")
            if threading.current_thread() is threading.main_thread():
                signal.signal(signal.SIGINT, previous)

    def report(self) -> None:
        """The summary and the files of the output folder."""
        records = sorted(self.client.records, key=lambda r: r.index)
        summary = summarize_run(self.load, self.samples, records, self.events, self.cpu)
        (self.output / "summary.txt").write_text(summary + "\n")
        write_samples(self.samples, self.output / "demo.csv")
        write_csv(records, self.output / "requests.csv")
        notes = [f"table: {self.output / 'demo.csv'}", f"requests: {self.output / 'requests.csv'}"]
        if self.options.plot and self.samples:
            notes.append(plot(self.load, self.samples, records, self.output / "demo.png"))
        notes.append(f"summary: {self.output / 'summary.txt'}")
        self.say("\nsummary\n" + summary)
        self.say("\n".join(notes))


def run_demo(options: DemoOptions, out: TextIO = sys.stdout) -> int:
    """Bring everything up, run the load for `options.duration_s` wall seconds, report, and tear
    everything down; 0 when the run completed, 130 when interrupted, 1 when it could not start."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _interrupt)
    output = options.output or Path(tempfile.gettempdir()) / time.strftime("pd-demo-%Y%m%d-%H%M%S")
    output.mkdir(parents=True, exist_ok=True)
    run = DemoRun(options, output, out)
    log_handler = _operator_log(output / "operator.log")
    status = 0
    try:
        endpoint, url = run.bring_up()
        run.announce(endpoint, url)
        run.serve(url)
    except KeyboardInterrupt:
        status = 130
        run.say("\ninterrupted: cleaning up")
    except (RuntimeError, TimeoutError) as error:  # a piece did not start (LocalClusterError too)
        status = 1
        run.say(f"\nfailed: {error}\ncleaning up (the logs are in {output})")
    finally:
        run.teardown()
        logging.getLogger().removeHandler(log_handler)
        log_handler.close()
    run.report()
    return status


def _operator_log(path: Path) -> logging.Handler:
    """The operator's and the kubelet's own log lines, INFO and up, go to `path`; the terminal
    keeps only what it showed before (the table would scroll away)."""
    root = logging.getLogger()
    for handler in root.handlers:
        if handler.level == logging.NOTSET:
            handler.setLevel(root.level)
    handler = logging.FileHandler(path)
    handler.setLevel(logging.INFO)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root.addHandler(handler)
    root.setLevel(min(root.level, logging.INFO))
    return handler


def _seconds_since(stamp: str, began: float) -> float:
    """An RFC 3339 UTC time (status.lastDecision.time) in seconds since `began` (Unix time)."""
    return calendar.timegm(time.strptime(stamp, "%Y-%m-%dT%H:%M:%SZ")) - began


def _delete_pods(api: client.ApiClient) -> None:
    """The pods go while their kubelet still runs (then the kubelet's stop takes the nodes);
    their Deployments and ReplicaSets go first, orphaning them, so that nothing replaces them."""
    apps, core = client.AppsV1Api(api), client.CoreV1Api(api)
    with contextlib.suppress(client.ApiException):
        apps.delete_collection_namespaced_deployment(NAMESPACE, propagation_policy="Orphan")
        apps.delete_collection_namespaced_replica_set(NAMESPACE, propagation_policy="Orphan")
    with contextlib.suppress(client.ApiException):
        core.delete_collection_namespaced_pod(NAMESPACE, grace_period_seconds=0)


def _scaling_events(api: client.ApiClient, counts: dict[str, int]) -> dict[str, int]:
    try:
        events = client.CoreV1Api(api).list_namespaced_event(NAMESPACE).items
    except client.ApiException:
        return counts  # the summary says 0; the cleanup matters more
    return {reason: sum(e.count or 1 for e in events if e.reason == reason) for reason in counts}


def _keep_pod_logs(serve_dir: Path, target: Path) -> None:
    """The engines' and the router's logs into the output folder; the rest of the pods' files
    (their ServiceAccount tokens among them) go."""
    try:
        for log_file in sorted(serve_dir.glob("*/container-*.log")):
            destination = target / log_file.parent.name / log_file.name
            destination.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(log_file, destination)
    finally:
        shutil.rmtree(serve_dir, ignore_errors=True)
