"""Benchmark of the virtual cluster: register N nodes, take M pool pods from Pending to Ready.

Starts its own local control plane (etcd, kube-apiserver, kube-controller-manager), registers
the nodes of config/clusters/large.yaml scaled to --nodes, creates two Deployments (prefill on
S5000, decode on H200, one card per pod, 60/40) with --pods replicas in all, and prints how fast
nodes registered, pods were bound and turned Ready, and where the time went.

    python bench/scheduler_bench.py --nodes 200 --pods 1000
"""

import argparse
import datetime
import os
import resource
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from kubernetes import client, config

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from pd_tools.localcluster import LocalCluster
from pd_tools.simcluster.profile import ClusterProfile, load_profile
from pd_tools.simcluster.virtual import WRITER_THREADS, VirtualCluster
from workloads import H200, S5000, deployment

LARGE = Path(__file__).resolve().parents[1] / "config" / "clusters" / "large.yaml"
NAMESPACE = "bench"
PREFILL_SHARE = 0.6


def scaled_profile(nodes: int) -> ClusterProfile:
    """large.yaml with every group scaled so that the groups add up to `nodes`."""
    large = load_profile(LARGE)
    total = large.node_count
    counts = [group.count * nodes // total for group in large.node_groups]
    for index in range(nodes - sum(counts)):  # hand out the rounding remainder
        counts[index % len(counts)] += 1
    groups = [
        g.model_copy(update={"count": c}) for g, c in zip(large.node_groups, counts, strict=True)
    ]
    return large.model_copy(update={"node_groups": groups})


def own_cpu_seconds() -> float:
    """User plus system CPU seconds of this process so far."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def cpu_seconds(pid: int) -> float:
    """User plus system CPU seconds of a process so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def rate(count: int, seconds: float) -> str:
    return f"{count / seconds:8.1f}/s" if seconds > 0 else "       -"


@dataclass
class Run:
    """What one benchmark run measured."""

    cluster: VirtualCluster
    pods: list[client.V1Pod]
    began: float  # time.monotonic() when the Deployments were created
    elapsed: float
    cpu: dict[str, float] = field(default_factory=dict)  # CPU seconds per process


def run(args: argparse.Namespace) -> Run:
    """Start a control plane and a virtual cluster, create the pools, wait for Ready."""
    prefill = round(args.pods * PREFILL_SHARE)
    pools = [
        deployment("prefill", prefill, S5000, cards=1, cpu="8", memory="64Gi"),
        deployment("decode", args.pods - prefill, H200, cards=1, cpu="8", memory="64Gi"),
    ]
    with LocalCluster(install_crds=False) as local:
        api = config.new_client_from_config(config_file=str(local.kubeconfig))
        core, apps = client.CoreV1Api(api), client.AppsV1Api(api)
        core.create_namespace({"metadata": {"name": NAMESPACE}})
        cpu = {p.name: -cpu_seconds(p.pid) for p in local.processes}
        cpu["simulator (this process)"] = -own_cpu_seconds()
        cluster = VirtualCluster(
            api, scaled_profile(args.nodes), time_scale=args.time_scale, keep_nodes=True,
            workers=args.workers,
        )  # fmt: skip
        cluster.start()
        try:
            began = time.monotonic()
            for manifest in pools:
                apps.create_namespaced_deployment(NAMESPACE, manifest)
            deadline = began + args.timeout
            while len(cluster.kubelet.ready_times) < args.pods and time.monotonic() < deadline:
                time.sleep(0.5)
            elapsed = time.monotonic() - began
            listed = core.list_namespaced_pod(NAMESPACE).items
        finally:
            cluster.stop()
        for process in local.processes:
            cpu[process.name] += cpu_seconds(process.pid)
        cpu["simulator (this process)"] += own_cpu_seconds()
    return Run(cluster, listed, began, elapsed, cpu)


def report(result: Run, nodes: int) -> None:
    """Print the tables."""
    cluster = result.cluster
    created = sorted(p.metadata.creation_timestamp for p in result.pods)
    creation_span = (created[-1] - created[0]).total_seconds() if created else 0.0
    bound = [t - result.began for t in cluster.scheduler.bound_times]
    ready = [t - result.began for t in cluster.kubelet.ready_times]
    rows = [
        ("nodes registered and schedulable", nodes, cluster.registration_seconds, ""),
        ("pods created by the ReplicaSets", len(result.pods), creation_span, "(1 s timestamps)"),
        ("pods bound", len(bound), max(bound, default=0.0), ""),
        ("pods Ready", len(ready), max(ready, default=0.0), ""),
    ]
    print(f"\n{'stage':<34}{'count':>7}{'seconds':>10}{'rate':>12}")
    for name, count, seconds, note in rows:
        print(f"{name:<34}{count:>7}{seconds:>10.1f}{rate(count, seconds):>12}   {note}")
    print(f"{'wall time, Deployments to Ready':<34}{'':>7}{result.elapsed:>10.1f}")

    print("\nwhere the time goes: the simulator's API calls (latency summed over its threads)")
    print(f"{'call':<22}{'count':>8}{'errors':>8}{'total s':>10}{'mean ms':>10}")
    for what, stat in sorted(cluster.calls.stats.items(), key=lambda kv: -kv[1].seconds):
        mean = 1000 * stat.seconds / stat.calls if stat.calls else 0.0
        print(f"{what:<22}{stat.calls:>8}{stat.errors:>8}{stat.seconds:>10.1f}{mean:>10.1f}")

    print(f"\nCPU seconds from registration to the end ({os.cpu_count()} CPUs shared by all)")
    for name, seconds in result.cpu.items():
        print(f"{name:<34}{seconds:>8.1f}")
    passes = cluster.scheduler
    print(f"{'  of which scheduling passes':<34}{passes.pass_seconds:>8.1f}   ({passes.passes})")
    gap = cluster.fleet.max_renew_gap_seconds
    print(f"\nlongest gap between two lease renewals of a node: {gap:.1f} s (the limit is 50 s)")
    print(datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--pods", type=int, default=5000)
    parser.add_argument(
        "--time-scale",
        type=float,
        default=0.001,
        help="simulated-time factor (default 0.001: an 82 s model load takes 82 ms)",
    )
    parser.add_argument(
        "--workers", type=int, default=WRITER_THREADS, help="API writer threads per component"
    )
    parser.add_argument("--timeout", type=float, default=900, help="give up after this many s")
    args = parser.parse_args()
    print(f"local control plane, {args.nodes} nodes, {args.pods} pods ...", flush=True)
    result = run(args)
    report(result, args.nodes)
    return 0 if len(result.cluster.kubelet.ready_times) >= args.pods else 1


if __name__ == "__main__":
    raise SystemExit(main())
