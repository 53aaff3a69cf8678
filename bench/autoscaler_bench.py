"""Benchmark: one autoscaler decision cycle over many PDDeployments.

Starts a local control plane and Prometheus, serves engine metrics for every object from one
endpoint (labels namespace/deployment/role on the series, as the PodMonitor relabels them),
creates N PDDeployments (2N pools), runs the operator in-process, and then times autoscaler
cycles in which every object is due. Prints: wall time and CPU of one cycle, Prometheus queries
per cycle, and API writes per cycle once the objects are steady.

    python bench/autoscaler_bench.py --objects 500
"""

import argparse
import copy
import cProfile
import multiprocessing
import pstats
import statistics
import sys
import time
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client, config

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from kubetools import RunningOperator, create_pdd, wait_for, writes
from pd_tools.localcluster import LocalCluster, LocalPrometheus
from pd_tools.localcluster.processes import free_port

ROOT = Path(__file__).resolve().parent.parent
SAMPLE = ROOT / "config" / "samples" / "heterogeneous-s5000-h200.yaml"
NAMESPACE = "bench"


# vLLM's bucket bounds for the two latency histograms (a subset is enough for the quantiles).
TTFT_BOUNDS = (0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0)
ITL_BOUNDS = (0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25)


def _exposition(objects: int, started: float) -> bytes:
    """Text-format series for every object: one request per second each, TTFT 1 s, ITL 12 ms."""
    n = max(1, int(time.time() - started))
    lines = []
    for i in range(objects):
        name = f"bench-{i:04d}"
        for role, metric, bounds, value in (
            ("prefill", "vllm:time_to_first_token_seconds", TTFT_BOUNDS, 1.0),
            ("decode", "vllm:inter_token_latency_seconds", ITL_BOUNDS, 0.012),
        ):
            labels = f'namespace="{NAMESPACE}",deployment="{name}",role="{role}"'
            for bound in bounds:
                count = n if value <= bound else 0
                lines.append(f'{metric}_bucket{{{labels},le="{bound}"}} {count}')
            lines.append(f'{metric}_bucket{{{labels},le="+Inf"}} {n}')
            lines.append(f"{metric}_sum{{{labels}}} {n * value}")
            lines.append(f"{metric}_count{{{labels}}} {n}")
        labels = f'namespace="{NAMESPACE}",deployment="{name}",role="prefill"'
        lines.append(f"vllm:prompt_tokens_total{{{labels}}} {n * 1000}")
    return ("\n".join(lines) + "\n").encode()


def _serve_metrics_forever(port: int, objects: int) -> None:
    """The metrics endpoint, in its own process: rendering ~20,000 series per scrape in the
    operator's process would take the GIL from the operator being measured."""
    started = time.time()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = _exposition(objects, started)
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *_: Any) -> None:
            pass

    HTTPServer(("127.0.0.1", port), Handler).serve_forever()


def serve_metrics(prometheus: LocalPrometheus, objects: int) -> multiprocessing.Process:
    """Start the metrics endpoint in a child process and point Prometheus at it."""
    port = free_port()
    process = multiprocessing.get_context("spawn").Process(
        target=_serve_metrics_forever, args=(port, objects), daemon=True
    )
    process.start()
    prometheus.set_targets("bench", [f"127.0.0.1:{port}"], {})
    return process


def timed_cycle(autoscaler: Any, *, profile: bool) -> tuple[float, float, int]:
    """Wall and CPU seconds of one cycle, and how many objects it decided."""
    profiler = cProfile.Profile() if profile else None
    wall, cpu = time.perf_counter(), time.thread_time()
    if profiler:
        profiler.enable()
    decided = autoscaler.cycle()
    if profiler:
        profiler.disable()
    wall, cpu = time.perf_counter() - wall, time.thread_time() - cpu
    if profiler:
        pstats.Stats(profiler).sort_stats("cumulative").print_stats(30)
    return wall, cpu, decided


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--objects", type=int, default=500)
    parser.add_argument("--cycles", type=int, default=6)
    parser.add_argument("--profile", action="store_true", help="cProfile the last cycle")
    args = parser.parse_args()
    template: dict[str, Any] = yaml.safe_load(SAMPLE.read_text())
    template["spec"]["scaling"].update(intervalSeconds=10)
    template["spec"]["slo"]["windowSeconds"] = 20

    with LocalCluster() as cluster, LocalPrometheus() as prometheus:
        feed = serve_metrics(prometheus, args.objects)
        api_client = config.new_client_from_config(config_file=str(cluster.kubeconfig))
        client.CoreV1Api(api_client).create_namespace({"metadata": {"name": NAMESPACE}})
        operator = RunningOperator(
            str(cluster.kubeconfig), workers=4, resync_seconds=3600, autoscale=False,
            prometheus_url=prometheus.url,
        ).start()  # fmt: skip
        try:
            for i in range(args.objects):
                body = copy.deepcopy(template)
                body["metadata"]["name"] = f"bench-{i:04d}"
                create_pdd(api_client, NAMESPACE, body)
            autoscaler = operator.state.autoscaler
            wait_for(
                lambda: len(operator.state.cache.pdd_keys()) == args.objects,
                timeout=300, what="every object in the operator's cache",
            )  # fmt: skip
            wait_for(operator.settled, timeout=600, what="the reconciles to finish")
            time.sleep(25)  # a full rate window of scrapes
            fake_now = [time.time()]
            autoscaler.clock = lambda: fake_now[0]
            rows: list[tuple[float, float, int, float]] = []
            for _ in range(args.cycles):
                fake_now[0] += 10.0  # every object is due
                before = writes()
                last = len(rows) == args.cycles - 1
                wall, cpu, decided = timed_cycle(autoscaler, profile=args.profile and last)
                assert decided == args.objects, f"only {decided} decided"
                wait_for(operator.settled, timeout=300, what="the reconciles to finish")
                time.sleep(1)
                wait_for(operator.settled, timeout=300, what="the reconciles to finish")
                rows.append((wall, cpu, autoscaler.source.last_report.queries, writes() - before))
        finally:
            operator.stop()
            feed.terminate()

    pools = 2 * args.objects
    steady = rows[2:] or rows
    table = [
        ("objects / pools", f"{args.objects} / {pools}"),
        ("cycle wall time p50 / max", (
            f"{statistics.median(r[0] for r in rows):.2f} / {max(r[0] for r in rows):.2f} s"
        )),
        ("cycle CPU (autoscaler thread) p50", f"{statistics.median(r[1] for r in rows):.2f} s"),
        ("Prometheus queries per cycle", ", ".join(str(r[2]) for r in rows)),
        ("API writes per cycle (all cycles)", ", ".join(f"{r[3]:.0f}" for r in rows)),
        ("API writes per cycle at steady state", f"{statistics.mean(r[3] for r in steady):.1f}"),
    ]  # fmt: skip
    width = max(len(name) for name, _ in table)
    print(f"\nautoscaler benchmark ({args.objects} PDDeployments, 2 cores)\n")
    print(f"| {'measure'.ljust(width)} | value |")
    print(f"|{'-' * (width + 2)}|-------|")
    for name, value in table:
        print(f"| {name.ljust(width)} | {value} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
