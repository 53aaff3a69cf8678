"""Engine simulator speed: offline and live replay of public traces, and /metrics scrape time.

Run: .venv/bin/python bench/engine_bench.py [--traces ../shared/traces] [--pods 1000]
Prints Markdown tables; docs/engine-simulator.md quotes them.
"""

import argparse
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from pd_operator.core.hardware import GLM_45_FP8, H200_SXM, MTT_S5000
from pd_tools.enginesim.engine import PDEngine, ReplicaSpec, Role, SimulationResult
from pd_tools.enginesim.metrics import EngineMetricsServer, SimPod
from pd_tools.workloads.traces import (
    Request,
    TokenLengths,
    constant_rate,
    read_azure,
    read_mooncake,
    synthetic_requests,
)

REPO = Path(__file__).resolve().parents[1]
# The articles' heterogeneous pair: S5000 prefill, H200 decode, GLM-class FP8, 8 cards each.
PREFILL = ReplicaSpec.from_profiles(MTT_S5000, GLM_45_FP8, 8)
DECODE = ReplicaSpec.from_profiles(H200_SXM, GLM_45_FP8, 8)
LIVE_TICK_S = 0.1  # simulated time per advance_to in the live mode


def deployment(requests: Iterator[Request], prefill: int, decode: int) -> PDEngine:
    engine = PDEngine(requests, model=GLM_45_FP8)
    for index in range(prefill):
        engine.add_instance(f"p{index}", Role.PREFILL, PREFILL, ready_after_s=0)
    for index in range(decode):
        engine.add_instance(f"d{index}", Role.DECODE, DECODE, ready_after_s=0)
    return engine


def offline(engine: PDEngine) -> tuple[SimulationResult, float]:
    began = time.perf_counter()
    result = engine.run()
    return result, time.perf_counter() - began


def live(engine: PDEngine) -> tuple[SimulationResult, float]:
    """Stepped the way a live driver steps it: advance_to every LIVE_TICK_S simulated."""
    began = time.perf_counter()
    t = 0.0
    records = []
    while not engine.done:
        t += LIVE_TICK_S
        engine.advance_to(t)
        records += engine.take_finished()
    wall = time.perf_counter() - began
    result = SimulationResult(
        records, engine.token_itl_s, engine.instances(), engine.active_requests, engine.now_s
    )
    return result, wall


def trace_rows(traces: Path) -> list[str]:
    sources: list[tuple[str, Callable[[], Iterator[Request]]]] = [
        ("Mooncake conversation", lambda: read_mooncake(traces / "conversation_trace.jsonl")),
        ("Azure conversation", lambda: read_azure(traces / "AzureLLMInferenceTrace_conv.csv")),
    ]
    rows = [
        "| trace | mode | P+D | requests | simulated s | wall s | speed-up | wall s / 10k req "
        "| TTFT p50 / p99 s | ITL p50 / p99 ms |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, read in sources:
        for mode, simulate in (("offline", offline), ("live", live)):
            result, wall = simulate(deployment(read(), 8, 8))
            ttft = sorted(r.ttft_s for r in result.records)
            itl = result.token_itl_s
            n = len(ttft)
            rows.append(
                f"| {name} | {mode} | 8+8 | {n:,} | {result.end_s:,.0f} | {wall:.2f} "
                f"| {result.end_s / wall:,.0f}x | {wall / n * 10_000:.2f} "
                f"| {ttft[n // 2]:.2f} / {ttft[int(n * 0.99)]:.2f} "
                f"| {itl.quantile(0.5) * 1000:.1f} / {itl.quantile(0.99) * 1000:.1f} |"
            )
    return rows


def scrape(address: str, paths: list[str]) -> None:
    """GET each path over one keep-alive connection with a bare client."""
    host, port = address.split(":")
    with socket.create_connection((host, int(port))) as connection:
        connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        reader = connection.makefile("rb")
        for path in paths:
            connection.sendall(f"GET {path} HTTP/1.1\r\nHost: {address}\r\n\r\n".encode())
            assert reader.readline().startswith(b"HTTP/1.1 200")
            length = 0
            while (line := reader.readline()) != b"\r\n":
                if line.lower().startswith(b"content-length:"):
                    length = int(line.split(b":")[1])
            reader.read(length)


def scrape_client(address: str, connections: int) -> None:
    """The scraper process (as Prometheus is one): paths on stdin, prints wall ms."""
    paths = sys.stdin.read().split()
    threads = [
        threading.Thread(target=scrape, args=(address, paths[i::connections]))
        for i in range(connections)
    ]
    began = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    print((time.perf_counter() - began) * 1000)


def scrape_rows(pods: int) -> list[str]:
    half = pods // 2
    requests = synthetic_requests(constant_rate(pods / 4, 120), TokenLengths(2000, 200, 1, 1))
    engine = deployment(requests, half, pods - half)
    engine.advance_to(60)  # every pod holds counters and filled histograms
    rows = ["| pods | what | wall ms | bytes |", "|---|---|---|---|"]
    with EngineMetricsServer(engine, threading.Lock()) as server:
        sim_pods = [
            SimPod("bench", f"pod-{i.name}", i.name, "demo", i.role, "pool", "glm")
            for i in engine.instances()
        ]
        for pod in sim_pods:
            server.add_pod(pod)
        began = time.perf_counter()
        size = sum(len(server.render(p.namespace, p.pod) or "") for p in sim_pods)
        wall_ms = (time.perf_counter() - began) * 1000
        rows.append(f"| {pods} | render the text of every pod | {wall_ms:.0f} | {size:,} |")
        paths = "\n".join(p.metrics_path for p in sim_pods)
        for connections in (1, 4):
            client = [sys.executable, __file__, "--scrape-client", server.address, str(connections)]
            reply = subprocess.run(client, input=paths, capture_output=True, text=True, check=True)
            what = f"HTTP GET of every pod, {connections} keep-alive connection(s)"
            rows.append(f"| {pods} | {what} | {float(reply.stdout):.0f} | {size:,} |")
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--traces", type=Path, default=REPO.parent / "shared" / "traces")
    parser.add_argument("--pods", type=int, default=1000)
    parser.add_argument("--scrape-client", nargs=2, metavar=("ADDRESS", "CONNECTIONS"))
    args = parser.parse_args()
    if args.scrape_client:
        scrape_client(args.scrape_client[0], int(args.scrape_client[1]))
        return
    print(f"prefill {MTT_S5000.name} x8, decode {H200_SXM.name} x8, model {GLM_45_FP8.name}\n")
    print("\n".join(trace_rows(args.traces)))
    print()
    print("\n".join(scrape_rows(args.pods)))


if __name__ == "__main__":
    main()
