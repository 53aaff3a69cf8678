"""A PDDeployment that really serves on the local control plane: the sample on the mock
scheduler, its engine and router pods run as processes by the virtual kubelet (shared by
tests/integration/test_serving.py and test_activator.py)."""

import copy
from pathlib import Path
from typing import Any

from pd_tools.simcluster.scheduler import SCHEDULER_NAME
from pd_tools.simcluster.virtual import VirtualCluster
from pdcases import ROOT, load_sample

SERVING = ROOT / "config" / "clusters" / "serving.yaml"
NAME = "chat"
MODEL = "zai-org/GLM-4.6-FP8"  # the sample's
# Container start and model load 50x faster than the wall clock (82 s load -> 1.6 s); the
# engines themselves serve in real time, so the client measures real latencies.
TIME_SCALE = 0.02


def pdd_body(
    prefill: int = 1,
    router: bool = True,
    policy: str = "CacheAware",
    engine: str = "VLLM",
    drain_seconds: int = 0,
) -> dict[str, Any]:
    body = copy.deepcopy(load_sample(ROOT / "config" / "samples" / "heterogeneous-s5000-h200.yaml"))
    body["metadata"]["name"] = NAME
    spec = body["spec"]
    spec["model"]["engine"] = engine
    spec["kvTransfer"] = {"connector": "NIXL", "protocol": "TCP", "cacheDtype": "FP8"}
    for role, count in (("prefill", prefill), ("decode", 1)):
        (pool,) = spec[role]["pools"]
        pool["template"] = {**pool.get("template", {}), "schedulerName": SCHEDULER_NAME}
        pool["replicas"] = {"min": count, "max": count}
    spec["scaling"] = {"mode": "Disabled"}  # replicas move only when the test says so
    spec["termination"] = {"drainSeconds": drain_seconds}
    spec["router"] = {
        "enabled": router,
        "prefillPolicy": policy,
        "template": {"schedulerName": SCHEDULER_NAME, "resources": {"requests": {"cpu": "1"}}},
    }
    return body


def serving_cluster(
    api_client, namespace: str, folder: Path, sd_file: Path | None = None
) -> VirtualCluster:
    """serving.yaml's nodes for this test's namespace; engine and router pods run as processes."""
    return VirtualCluster(
        api_client,
        SERVING,
        time_scale=TIME_SCALE,
        name_prefix=f"{namespace}-",
        namespace=namespace,
        serve_dir=folder / "pods",
        sd_file=sd_file,
    )
