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
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client, config
from prometheus_client import CollectorRegistry, Counter, Histogram, start_http_server

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from kubetools import RunningOperator, create_pdd, wait_for, writes
from pd_operator.localcluster import LocalCluster, LocalPrometheus
from pd_operator.localcluster.processes import free_port

ROOT = Path(__file__).resolve().parent.parent
SAMPLE = ROOT / "config" / "samples" / "heterogeneous-s5000-h200.yaml"
NAMESPACE = "bench"


def serve_metrics(prometheus: LocalPrometheus, objects: int) -> threading.Event:
    """One endpoint with vLLM-named series for every object, refreshed until the event is set."""
    registry = CollectorRegistry()
    labels = ["namespace", "deployment", "role", "model_name"]
    ttft = Histogram("vllm:time_to_first_token_seconds", "t", labels, registry=registry)
    itl = Histogram("vllm:inter_token_latency_seconds", "i", labels, registry=registry)
    prompt = Counter("vllm:prompt_tokens", "p", labels, registry=registry)
    port = free_port()
    start_http_server(port, addr="127.0.0.1", registry=registry)
    prometheus.set_targets("bench", [f"127.0.0.1:{port}"], {})
    stop = threading.Event()

    def feed() -> None:
        while not stop.wait(1.0):
            for i in range(objects):
                name = f"bench-{i:04d}"
                ttft.labels(NAMESPACE, name, "prefill", "m").observe(1.0)
                itl.labels(NAMESPACE, name, "decode", "m").observe(0.012)
                prompt.labels(NAMESPACE, name, "prefill", "m").inc(1000)

    threading.Thread(target=feed, daemon=True).start()
    return stop


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--objects", type=int, default=500)
    parser.add_argument("--cycles", type=int, default=6)
    args = parser.parse_args()
    template: dict[str, Any] = yaml.safe_load(SAMPLE.read_text())
    template["spec"]["scaling"].update(intervalSeconds=10)
    template["spec"]["slo"]["windowSeconds"] = 20

    with LocalCluster() as cluster, LocalPrometheus() as prometheus:
        stop_feed = serve_metrics(prometheus, args.objects)
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
                wall, cpu = time.perf_counter(), time.thread_time()
                decided = autoscaler.cycle()
                wall, cpu = time.perf_counter() - wall, time.thread_time() - cpu
                assert decided == args.objects, f"only {decided} decided"
                wait_for(operator.settled, timeout=300, what="the reconciles to finish")
                time.sleep(1)
                wait_for(operator.settled, timeout=300, what="the reconciles to finish")
                rows.append((wall, cpu, autoscaler.last_report.queries, writes() - before))
        finally:
            operator.stop()
            stop_feed.set()

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
