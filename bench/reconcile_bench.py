"""Benchmark: create N PDDeployments at once and measure how the operator converges them.

Starts its own local control plane, runs the operator as a separate process (`python -m
pd_operator`), creates N copies of the heterogeneous sample, and prints a table: time until each
object is converged (children applied and status written), the operator's CPU seconds and peak
memory, API writes per object on creation, and writes during a quiet period afterwards.

    python bench/reconcile_bench.py --objects 200
"""

import argparse
import concurrent.futures
import copy
import os
import re
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client, config, watch

from pd_tools.localcluster import LocalCluster
from pd_tools.localcluster.processes import free_port

ROOT = Path(__file__).resolve().parent.parent
SAMPLE = ROOT / "config" / "samples" / "heterogeneous-s5000-h200.yaml"
NAMESPACE = "bench"
# Per pool a Deployment and a PodDisruptionBudget, per role a Service; the router's
# ServiceAccount, Role, RoleBinding, Deployment, PodDisruptionBudget and Service.
CHILDREN_PER_OBJECT = 12


def operator_writes(metrics_url: str, verb: str = "") -> float:
    """The operator's API writes so far (of one verb, or all)."""
    text = urllib.request.urlopen(metrics_url, timeout=5).read().decode()
    pattern = r"^pd_operator_api_writes_total\{([^}]*)\} ([0-9.e+]+)$"
    return sum(
        float(value)
        for labels, value in re.findall(pattern, text, re.M)
        if f'verb="{verb}"' in labels or not verb
    )


def writes_by_kind(metrics_url: str) -> dict[str, float]:
    """The operator's API writes so far, by verb and kind."""
    text = urllib.request.urlopen(metrics_url, timeout=5).read().decode()
    pattern = r"^pd_operator_api_writes_total\{([^}]*)\} ([0-9.e+]+)$"
    found: dict[str, float] = {}
    for labels, value in re.findall(pattern, text, re.M):
        named = dict(re.findall(r'(\w+)="([^"]*)"', labels))
        name = f"{named.get('verb')} {named.get('kind')}"
        found[name] = found.get(name, 0.0) + float(value)
    return found


def operator_events(core: client.CoreV1Api) -> dict[str, int]:
    """The operator's events in the namespace, by reason."""
    counts: dict[str, int] = {}
    for event in core.list_namespaced_event(NAMESPACE).items:
        if event.source and event.source.component == "pd-operator":
            counts[event.reason] = counts.get(event.reason, 0) + 1
    return dict(sorted(counts.items()))


def settled_writes(metrics_url: str, stable_seconds: float, limit_seconds: float) -> float:
    """Wait until the write counter has not moved for `stable_seconds`; return it."""
    deadline = time.monotonic() + limit_seconds
    last, since = operator_writes(metrics_url), time.monotonic()
    while time.monotonic() < deadline:
        time.sleep(0.5)
        current = operator_writes(metrics_url)
        if current != last:
            last, since = current, time.monotonic()
        elif time.monotonic() - since >= stable_seconds:
            break
    return last


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    ticks = os.sysconf("SC_CLK_TCK")
    return (int(fields[11]) + int(fields[12])) / ticks


def peak_rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return 0.0


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def spread(values: list[float]) -> str:
    """p50 / p99 / max of a list of seconds."""
    if not values:
        return "n/a"
    return f"{percentile(values, 0.5):.2f} / {percentile(values, 0.99):.2f} / {max(values):.2f} s"


def print_table(title: str, rows: list[tuple[str, str]]) -> None:
    """A two-column markdown table."""
    width = max(len(name) for name, _ in rows)
    print(f"\n{title}\n")
    print(f"| {'measure'.ljust(width)} | value |")
    print(f"|{'-' * (width + 2)}|-------|")
    for name, value in rows:
        print(f"| {name.ljust(width)} | {value} |")


def wait_converged(
    custom: client.CustomObjectsApi, created: dict[str, float], timeout: float
) -> tuple[dict[str, float], dict[str, float]]:
    """Seconds from creation until (1) the operator applied the children and wrote status,
    (2) the Deployments' pods exist (the controller-manager's share comes in here).

    One watch, not a list of every object a few times a second: the polling list cost about a
    tenth of the apiserver's CPU during the run, on the same two cores as what it measures.
    """
    applied: dict[str, float] = {}
    pods_made: dict[str, float] = {}
    deadline = time.monotonic() + timeout

    def note(item: dict[str, Any]) -> None:
        status = item.get("status") or {}
        name = item["metadata"]["name"]
        pools = status.get("pools") or []
        if name in created and status.get("observedGeneration") == 1 and len(pools) == 2:
            now = time.monotonic()
            applied.setdefault(name, now - created[name])
            if all(p["replicas"] == p["desiredReplicas"] for p in pools):
                pods_made.setdefault(name, now - created[name])

    def relist() -> str:
        listed = custom.list_namespaced_custom_object(
            "pdoperator.io", "v1alpha1", NAMESPACE, "pddeployments"
        )
        for item in listed["items"]:
            note(item)
        return str(listed["metadata"]["resourceVersion"])

    version = relist()
    while len(pods_made) < len(created) and time.monotonic() < deadline:
        stream = watch.Watch()
        remaining = max(1, int(deadline - time.monotonic()))
        for event in stream.stream(
            custom.list_namespaced_custom_object, "pdoperator.io", "v1alpha1", NAMESPACE,
            "pddeployments", resource_version=version, timeout_seconds=min(remaining, 60),
        ):  # fmt: skip
            if event["type"] == "ERROR":  # e.g. 410 Gone: list again, watch from there
                version = relist()
                break
            item = event["object"]
            version = item["metadata"]["resourceVersion"]
            note(item)
            if len(pods_made) == len(created):
                stream.stop()
    return applied, pods_made


def parse_args() -> argparse.Namespace:
    """Command-line options."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--objects", type=int, default=200)
    parser.add_argument("--timeout", type=float, default=300.0)
    parser.add_argument("--quiet-seconds", type=float, default=10.0)
    parser.add_argument("--workers", type=int, default=4, help="the operator's --workers")
    parser.add_argument("--log", default="/tmp/pd-operator-bench.log", help="operator log file")
    return parser.parse_args()


def main() -> int:
    args = parse_args()

    template = yaml.safe_load(SAMPLE.read_text())
    with LocalCluster() as cluster:
        api_client = config.new_client_from_config(config_file=str(cluster.kubeconfig))
        core = client.CoreV1Api(api_client)
        custom = client.CustomObjectsApi(api_client)
        core.create_namespace({"metadata": {"name": NAMESPACE}})
        metrics_port = free_port()
        log = open(args.log, "wb")  # noqa: SIM115 - closed when the operator exits
        operator = subprocess.Popen(
            [
                sys.executable, "-m", "pd_operator", "--kubeconfig", str(cluster.kubeconfig),
                "--metrics-port", str(metrics_port), "--health-port", "0",
                "--resync-seconds", "5", "--workers", str(args.workers),
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )  # fmt: skip
        metrics_url = f"http://127.0.0.1:{metrics_port}/metrics"
        try:
            deadline = time.monotonic() + 60
            while True:
                try:
                    operator_writes(metrics_url)
                    break
                except OSError:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.2)
            time.sleep(2)  # let kopf start its watches
            pids = {"operator": operator.pid} | {p.name: p.pid for p in cluster.processes}
            cpu_before = {name: cpu_seconds(pid) for name, pid in pids.items()}

            def create(index: int) -> tuple[str, float]:
                body: dict[str, Any] = copy.deepcopy(template)
                body["metadata"]["name"] = f"bench-{index:04d}"
                custom.create_namespaced_custom_object(
                    "pdoperator.io", "v1alpha1", NAMESPACE, "pddeployments", body
                )
                return body["metadata"]["name"], time.monotonic()

            began = time.monotonic()
            with concurrent.futures.ThreadPoolExecutor(16) as pool:
                created = dict(pool.map(create, range(args.objects)))
            created_in = time.monotonic() - began

            converged, pods_made = wait_converged(custom, created, args.timeout)
            creation_writes = settled_writes(metrics_url, 5.0, 120.0)
            applies = sum(operator_writes(metrics_url, verb) for verb in ("apply", "create"))
            status_patches = operator_writes(metrics_url, "patch_status")
            by_kind, event_counts = writes_by_kind(metrics_url), operator_events(core)
            time.sleep(args.quiet_seconds)
            quiet_writes = operator_writes(metrics_url) - creation_writes
            cpu = {name: cpu_seconds(pid) - cpu_before[name] for name, pid in pids.items()}
            rss = peak_rss_mib(operator.pid)
        finally:
            operator.terminate()
            operator.wait(timeout=30)
            log.close()

    per_child = (applies - by_kind.get("create Event", 0)) / args.objects / CHILDREN_PER_OBJECT
    rows = [
        ("objects created", f"{args.objects} in {created_in:.1f} s"),
        ("objects converged (children + status)", f"{len(converged)}/{args.objects}"),
        ("time to converge p50 / p99 / max", spread(list(converged.values()))),
        ("time until their pods exist p50 / p99 / max", spread(list(pods_made.values()))),
        ("operator CPU during the run", f"{cpu.pop('operator'):.1f} s"),
        ("control plane CPU during the run", ", ".join(
            f"{name} {seconds:.1f} s" for name, seconds in cpu.items()
        )),
        ("operator peak memory (VmHWM)", f"{rss:.0f} MiB"),
        ("API writes per object until settled", f"{creation_writes / args.objects:.2f}"),
        ("applies or creates per child (events left out)", f"{per_child:.2f}"),
        ("status patches per object", f"{status_patches / args.objects:.2f}"),
        (f"API writes in {args.quiet_seconds:.0f} s of steady state", f"{quiet_writes:.0f}"),
        ("writes per object by verb and kind", ", ".join(
            f"{name} {count / args.objects:.2f}" for name, count in sorted(by_kind.items())
        )),
        ("the operator's events per object by reason", ", ".join(
            f"{reason} {count / args.objects:.2f}" for reason, count in event_counts.items()
        )),
    ]  # fmt: skip
    print_table(f"reconcile benchmark ({args.objects} PDDeployments, 2 cores)", rows)
    return 0 if len(converged) == args.objects else 1


if __name__ == "__main__":
    sys.exit(main())
