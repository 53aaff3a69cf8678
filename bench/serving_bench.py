"""Serving path under load: simulated prefill and decode engines behind the real vllm-router.

Starts a prefill and a decode `pd_tools.enginesim.http_engine` process and
`vllm-router --vllm-pd-disaggregation` on their own loopback addresses, then runs a ramp of
Poisson load through the router with `pd_tools.workloads.http_load` (open loop). Per step it prints
the streams and requests/s sustained, CPU seconds per 1,000 streamed tokens of each process
(/proc/PID/stat), and client vs engine TTFT and ITL.

Engine side: TTFT is the prefill engine's plus the decode engine's (a user waits for both; the
P50/P99 of a sum is not the sum of P50/P99s, so the means are the exact comparison); ITL is the
decode engine's. Engines report latencies in histograms, so the client's samples are put in the
same buckets before their quantiles are compared.

Run: .venv/bin/python bench/serving_bench.py [--rates 10,20,40,60] [--step-s 30]
"""

import argparse
import bisect
import contextlib
import math
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from pd_tools.replay.offline_metrics import histogram_quantile
from pd_tools.workloads.http_load import LoadConfig, LoadResult, run
from pd_tools.workloads.traces import TokenLengths, constant_rate, synthetic_requests

VENV_BIN = Path(sys.executable).parent
TTFT = "vllm:time_to_first_token_seconds"
ITL = "vllm:inter_token_latency_seconds"
RUNNING, WAITING = "vllm:num_requests_running", "vllm:num_requests_waiting"
MAX_STEP_S = 60.0
STARTUP_S = 60.0  # for a process's /health to answer 200
IDLE_S = 30.0  # for the engines to empty between steps
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
PORT, METRICS_PORT = 8000, 29000  # each process on its own address, so one port for all
TARGET_STREAMS = 300
TARGET_AGREEMENT = 0.10


# --- processes ------------------------------------------------------------------------------


def free(host: str, port: int) -> bool:
    """Nobody listens there (connections of an earlier run in TIME_WAIT do not count)."""
    with socket.socket() as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError:
            return False
    return True


def get(url: str, timeout_s: float = 5.0) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, ""
    except OSError:
        return 0, ""


def wait_healthy(name: str, url: str, process: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + STARTUP_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"{name} exited ({process.returncode}):\n{log.read_text()[-2000:]}")
        if get(f"{url}/health", timeout_s=1)[0] == 200:
            return
        time.sleep(0.5)
    raise RuntimeError(f"{name}: {url}/health not 200 in {STARTUP_S:.0f} s:\n{log.read_text()}")


@contextlib.contextmanager
def started(argv: list[str], env: dict[str, str], log: Path) -> Iterator[subprocess.Popen[bytes]]:
    with log.open("wb") as out:
        process = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env)
    try:
        yield process
    finally:
        process.terminate()
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=5)


def cpu_seconds(pid: int) -> float:
    """User + system CPU of `pid` and its descendants (reaped children included)."""
    parents: dict[int, int] = {}
    ticks: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue  # exited while we looked
        # Fields after the command name, which may hold spaces: ppid is the 2nd, utime the 12th.
        fields = stat[stat.rindex(")") + 2 :].split()
        parents[int(entry.name)] = int(fields[1])
        ticks[int(entry.name)] = sum(int(f) for f in fields[11:15])  # utime stime cutime cstime
    tree, frontier = {pid}, [pid]
    while frontier:
        parent = frontier.pop()
        children = [p for p, pp in parents.items() if pp == parent and p not in tree]
        tree.update(children)
        frontier += children
    return sum(ticks.get(p, 0) for p in tree) / CLOCK_TICKS


def own_cpu_seconds() -> float:
    times = os.times()
    return times.user + times.system


# --- engine metrics -------------------------------------------------------------------------


@dataclass(frozen=True)
class Buckets:
    """A histogram's cumulative counts (last: +Inf), its sum and count."""

    bounds: tuple[float, ...]
    cumulative: tuple[float, ...]
    sum: float
    count: float

    def __sub__(self, earlier: "Buckets") -> "Buckets":
        return Buckets(
            self.bounds,
            tuple(a - b for a, b in zip(self.cumulative, earlier.cumulative, strict=True)),
            self.sum - earlier.sum,
            self.count - earlier.count,
        )

    def quantile(self, q: float) -> float:
        return histogram_quantile(q, self.bounds, [round(c) for c in self.cumulative])

    @property
    def mean(self) -> float:
        return self.sum / self.count if self.count else math.nan


def scrape(url: str) -> dict[str, Buckets | float]:
    """The TTFT and ITL histograms and the running/waiting gauges of one engine's /metrics."""
    status, text = get(f"{url}/metrics")
    if status != 200:
        raise RuntimeError(f"{url}/metrics answered {status}")
    out: dict[str, Buckets | float] = {}
    for family in text_string_to_metric_families(text):
        if family.name in (RUNNING, WAITING):
            out[family.name] = sum(s.value for s in family.samples)
        if family.name not in (TTFT, ITL):
            continue
        by_bound: dict[float, float] = {}
        total = count = 0.0
        for sample in family.samples:
            if sample.name.endswith("_bucket"):
                bound = float(sample.labels["le"])
                by_bound[bound] = by_bound.get(bound, 0.0) + sample.value
            elif sample.name.endswith("_sum"):
                total += sample.value
            elif sample.name.endswith("_count"):
                count += sample.value
        bounds = sorted(by_bound)
        finite = tuple(b for b in bounds if b != float("inf"))
        out[family.name] = Buckets(finite, tuple(by_bound[b] for b in bounds), total, count)
    return out


def histogram(
    name: str, before: dict[str, Buckets | float], after: dict[str, Buckets | float]
) -> Buckets:
    """What `name` counted between two scrapes."""
    first, last = before[name], after[name]
    assert isinstance(first, Buckets) and isinstance(last, Buckets)
    return last - first


def bucketed(values: Sequence[float], like: Buckets) -> Buckets:
    """`values` counted in `like`'s buckets, so both quantiles carry the same bucket error."""
    counts = [0] * (len(like.bounds) + 1)
    for value in values:
        counts[bisect.bisect_left(like.bounds, value)] += 1
    cumulative, running = [], 0
    for count in counts:
        running += count
        cumulative.append(float(running))
    return Buckets(like.bounds, tuple(cumulative), sum(values), float(len(values)))


def wait_idle(urls: Sequence[str]) -> None:
    """Until no engine runs or holds a request (a step's stragglers), at most IDLE_S."""
    deadline = time.monotonic() + IDLE_S
    while time.monotonic() < deadline:
        if all(scrape(u).get(RUNNING, 0) == 0 and scrape(u).get(WAITING, 0) == 0 for u in urls):
            return
        time.sleep(0.5)


@dataclass(frozen=True)
class Deployment:
    router: str
    engines: dict[str, str]  # role -> base URL
    pids: dict[str, int]  # process name -> pid


# --- the ramp -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Steady:
    """A step's second half of arrivals: the streams have filled up, arrivals still come."""

    streams: float  # time-averaged open requests
    requests_per_s: float  # answered in full
    tokens_per_s: float  # streamed to the client


@dataclass(frozen=True)
class Step:
    rate: float
    result: LoadResult
    steady: Steady
    cpu_s: dict[str, float]
    ttft_prefill: Buckets
    ttft_decode: Buckets
    itl_engine: Buckets
    time_scale: float


def steady(result: LoadResult, begin_s: float, end_s: float) -> Steady:
    open_s, answered, tokens = 0.0, 0, 0
    for r in result.records:
        if r.start_s is None or r.end_s is None:
            continue
        open_s += max(0.0, min(r.end_s, end_s) - max(r.start_s, begin_s))
        answered += r.reason is None and begin_s <= r.end_s < end_s
        if r.ttft_s is not None:
            at = r.start_s + r.ttft_s
            tokens += begin_s <= at < end_s
            for gap in r.itl_s:
                at += gap
                tokens += begin_s <= at < end_s
    length = end_s - begin_s
    return Steady(open_s / length, answered / length, tokens / length)


def run_step(rate: float, args: argparse.Namespace, deployment: Deployment) -> Step:
    lengths = TokenLengths(args.input_tokens, args.output_tokens)
    requests = synthetic_requests(constant_rate(rate, args.step_s), lengths, seed=int(rate))
    config = LoadConfig(
        url=deployment.router,
        model=args.model_name,
        max_in_flight=args.max_in_flight,
        timeout_s=args.step_s + args.drain_s,
        deadline_s=args.step_s + args.drain_s,
    )
    engines, pids = deployment.engines, deployment.pids
    before = {role: scrape(url) for role, url in engines.items()}
    cpu_before = {name: cpu_seconds(pid) for name, pid in pids.items()}
    client_before = own_cpu_seconds()
    result = run(requests, config)
    cpu = {name: cpu_seconds(pid) - cpu_before[name] for name, pid in pids.items()}
    cpu["client"] = own_cpu_seconds() - client_before
    after = {role: scrape(url) for role, url in engines.items()}
    prefill_ttft = histogram(TTFT, before["prefill"], after["prefill"])
    decode_ttft = histogram(TTFT, before["decode"], after["decode"])
    return Step(
        rate,
        result,
        steady(result, args.step_s / 2, args.step_s),
        cpu,
        prefill_ttft,
        decode_ttft,
        histogram(ITL, before["decode"], after["decode"]),
        args.time_scale,
    )


def ms(seconds: float) -> str:
    return "-" if math.isnan(seconds) else f"{seconds * 1000:,.1f}"


def difference(client: float, engine: float) -> str:
    return f"{(client - engine) / engine:+.0%}" if engine > 0 else "-"


def load_row(step: Step) -> str:
    s, mid = step.result.summary, step.steady
    per_k = {
        name: cpu / s.tokens * 1000 if s.tokens else math.nan for name, cpu in step.cpu_s.items()
    }
    failed = ", ".join(f"{k} {v}" for k, v in s.failed.items()) or "0"
    return (
        f"| {step.rate:g} | {mid.requests_per_s:.1f} | {mid.streams:.0f} / {s.peak_in_flight} "
        f"| {mid.tokens_per_s:,.0f} | {failed} | {ms(s.send_lag_p99_s)} "
        f"| {per_k['router']:.3f} | {per_k['prefill']:.3f} | {per_k['decode']:.3f} "
        f"| {per_k['client']:.3f} |"
    )


def latency_row(step: Step) -> str:
    """Client vs engine, in wall seconds (engine model seconds times the time scale)."""
    records = step.result.records
    scale = step.time_scale
    itl, prefill, decode = step.itl_engine, step.ttft_prefill, step.ttft_decode
    client_itl = bucketed([g / scale for r in records for g in r.itl_s], itl)
    client_ttft = bucketed([r.ttft_s / scale for r in records if r.ttft_s is not None], decode)
    # A user's TTFT is both engines' in turn: their quantiles added (approximate), means exact.
    pairs = {
        "TTFT p50": (client_ttft.quantile(0.5), prefill.quantile(0.5) + decode.quantile(0.5)),
        "TTFT p99": (client_ttft.quantile(0.99), prefill.quantile(0.99) + decode.quantile(0.99)),
        "TTFT mean": (client_ttft.mean, prefill.mean + decode.mean),
        "ITL p50": (client_itl.quantile(0.5), itl.quantile(0.5)),
        "ITL p99": (client_itl.quantile(0.99), itl.quantile(0.99)),
        "ITL mean": (client_itl.mean, itl.mean),
    }
    cells = [f"{ms(c * scale)} / {ms(e * scale)} ({difference(c, e)})" for c, e in pairs.values()]
    off = [name for name, (c, e) in pairs.items() if not abs(c - e) <= TARGET_AGREEMENT * e]
    return f"| {step.rate:g} | " + " | ".join(cells) + f" | {', '.join(off) or 'none'} |"


def deploy(stack: contextlib.ExitStack, args: argparse.Namespace, logs: Path) -> Deployment:
    """The two engines and the router, each healthy, stopped when `stack` closes."""
    prefill, decode, router = (f"{args.subnet}.{i}" for i in (1, 2, 3))
    for host, port in ((prefill, PORT), (decode, PORT), (router, PORT), (router, METRICS_PORT)):
        if not free(host, port):
            raise RuntimeError(f"{host}:{port} is in use: pick another --subnet")
    engines = {"prefill": f"http://{prefill}:{PORT}", "decode": f"http://{decode}:{PORT}"}
    # No model load and no drain: the bench starts serving at once and stops at once.
    env = {**os.environ, "PD_SIM_MODEL": args.model, "PD_SIM_LOAD_SECONDS": "0"}
    env["PD_SIM_DRAIN_SECONDS"] = "0"
    env["PD_SIM_TIME_SCALE"] = repr(args.time_scale)
    pids: dict[str, int] = {}
    for role, host, hardware, kv_role in (
        ("prefill", prefill, args.prefill_hardware, "kv_producer"),
        ("decode", decode, args.decode_hardware, "kv_consumer"),
    ):
        argv = [
            sys.executable, "-m", "pd_tools.enginesim.http_engine", "vllm", "serve",
            args.model_name, "--host", host, "--port", str(PORT),
            "--tensor-parallel-size", "8", "--kv-transfer-config",
            f'{{"kv_connector":"NixlConnector","kv_role":"{kv_role}"}}',
        ]  # fmt: skip
        log = logs / f"{role}.log"
        process = stack.enter_context(started(argv, {**env, "PD_SIM_HARDWARE": hardware}, log))
        wait_healthy(role, engines[role], process, log)
        pids[role] = process.pid
    router_url = f"http://{router}:{PORT}"
    argv = [
        str(VENV_BIN / "vllm-router"), "--vllm-pd-disaggregation",
        "--prefill", engines["prefill"], "--decode", engines["decode"],
        "--host", router, "--port", str(PORT),
        "--prometheus-host", router, "--prometheus-port", str(METRICS_PORT),
        "--worker-startup-check-interval", "1", "--log-level", "warning",
    ]  # fmt: skip
    log = logs / "router.log"
    process = stack.enter_context(started(argv, dict(os.environ), log))
    wait_healthy("router", router_url, process, log)
    pids["router"] = process.pid
    return Deployment(router_url, engines, pids)


def print_tables(steps: Sequence[Step]) -> None:
    print(
        "| offered req/s | answered req/s | streams mean / peak | tokens/s | failed "
        "| send lag p99 ms | CPU s / 1k tokens: router | prefill | decode | client |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for step in steps:
        print(load_row(step))
    print(
        "\n(answered, mean streams and tokens/s: the second half of each step's arrivals;"
        " peak: the whole step)"
    )
    print(
        "\nClient / engine, ms (client samples in the engine's buckets; engine TTFT = prefill"
        " + decode)\n"
    )
    print(
        "| offered req/s | TTFT p50 | TTFT p99 | TTFT mean | ITL p50 | ITL p99 | ITL mean "
        f"| off by > {TARGET_AGREEMENT:.0%} |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for step in steps:
        print(latency_row(step))
    best = max((s.steady.streams for s in steps), default=0.0)
    print(
        f"\ntarget: >= {TARGET_STREAMS} concurrent streams sustained: "
        f"{'met' if best >= TARGET_STREAMS else 'not met'} (best {best:.0f})"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rates", default="10,20,30,40", help="offered requests/s, one per step")
    parser.add_argument("--step-s", type=float, default=30.0, help=f"arrivals, <= {MAX_STEP_S:g}")
    parser.add_argument("--drain-s", type=float, default=30.0, help="after the arrivals, at most")
    parser.add_argument("--input-tokens", type=int, default=1024)
    parser.add_argument("--output-tokens", type=int, default=512)
    parser.add_argument("--max-in-flight", type=int, default=1024)
    parser.add_argument("--prefill-hardware", default="h200")
    parser.add_argument("--decode-hardware", default="h200")
    parser.add_argument("--model", default="glm-4.5-fp8", help="the simulator's model profile")
    parser.add_argument("--model-name", default="zai-org/GLM-4.5-FP8", help="served name")
    parser.add_argument("--time-scale", type=float, default=1.0, help="PD_SIM_TIME_SCALE")
    parser.add_argument("--subnet", default="127.0.91", help="prefill .1, decode .2, router .3")
    args = parser.parse_args()
    rates = [float(r) for r in args.rates.split(",")]
    if not 0 < args.step_s <= MAX_STEP_S or not all(r > 0 for r in rates):
        parser.error(f"--step-s must lie in (0, {MAX_STEP_S:g}] and rates be positive")
    print(
        f"prefill {args.prefill_hardware} x8, decode {args.decode_hardware} x8, {args.model}; "
        f"{args.input_tokens} in / {args.output_tokens} out tokens; Poisson arrivals for "
        f"{args.step_s:g} s a step; time scale {args.time_scale:g}; {os.cpu_count()} host cores\n"
    )
    steps: list[Step] = []
    with (
        tempfile.TemporaryDirectory(prefix="serving-bench-") as logs,
        contextlib.ExitStack() as stack,
    ):
        deployment = deploy(stack, args, Path(logs))
        for rate in rates:
            step = run_step(rate, args, deployment)
            steps.append(step)
            done = step.result.summary.completed
            print(f"step {rate:g} req/s: {done} completed", file=sys.stderr)
            wait_idle(list(deployment.engines.values()))
    print_tables(steps)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
