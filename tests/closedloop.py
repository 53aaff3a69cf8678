"""The closed loop's shared setup: the simulated cluster, the PDDeployment and the loads that
tests/integration/test_closed_loop.py and bench/reaction_bench.py both run.

Load levels come from the simulator (measured in test_sim_cluster.py): 4,000-token prompts at
5 requests per simulated second give a P50 TTFT of ~0.35 s on one 8-card S5000 prefill replica
and ~0.17 s on two. A 250 ms target is therefore breached by one replica and met by two; 1
request per second (~0.15 s on one replica) meets it with one.
"""

import copy
import math
from collections.abc import Iterator
from typing import Any

from pd_tools.simcluster.scheduler import SCHEDULER_NAME
from pd_tools.workloads.traces import RateProfile, RateSegment, TokenLengths, synthetic_requests
from pdcases import ROOT, load_sample

NAME = "glm"
TIME_SCALE = 0.05
INTERVAL = 5  # decision interval, wall seconds
WINDOW = 10  # SLO window, wall seconds: ten 1 s scrapes, 200 simulated seconds
SCALE_DOWN_WINDOW = 10
TTFT_TARGET_MS = 250
LENGTHS = TokenLengths(4000, 200, 1.0, 1.0)
STEP_S, DROP_S = 300, 1000  # simulated seconds of the load step and drop in the step test
LIGHT, BREACHING, HEAVY = 1.0, 5.0, 14.0  # requests per simulated second

# tiny.yaml's two S5000 nodes and, for spill-over, two more H200 nodes than decode needs.
PROFILE: dict[str, Any] = {
    "name": "closed-loop",
    "nodeGroups": [
        {
            "name": "s5000",
            "count": 2,
            "instanceType": "mtt-s5000-x8",
            "cpu": "32",
            "memory": "256Gi",
            "labels": {"mthreads.com/gpu.product": "MTT-S5000"},
            "taints": [{"key": "mthreads.com/gpu", "effect": "NoSchedule"}],
            "accelerators": [
                {"resourceName": "mthreads.com/gpu", "perNode": 8, "profile": "mtt-s5000"}
            ],
        },
        {
            "name": "h200",
            "count": 3,
            "instanceType": "nvidia-h200-x8",
            "cpu": "32",
            "memory": "256Gi",
            "labels": {"nvidia.com/gpu.product": "NVIDIA-H200"},
            "taints": [{"key": "nvidia.com/gpu", "effect": "NoSchedule"}],
            "accelerators": [{"resourceName": "nvidia.com/gpu", "perNode": 8, "profile": "h200"}],
        },
    ],
}


def load(*segments: tuple[float, float], seed: int = 11) -> Iterator[Any]:
    """Requests at `(rate, simulated seconds)` in turn; the last rate lasts forever."""
    start, parts = 0.0, []
    for index, (rate, seconds) in enumerate(segments):
        length = math.inf if index == len(segments) - 1 else seconds
        parts.append(RateSegment(start, length, rate, rate))
        start += seconds
    return synthetic_requests(RateProfile(tuple(parts)), LENGTHS, seed=seed)


def pdd_body(prometheus_url: str, *, prefill_max: int = 2, spill: bool = False) -> dict[str, Any]:
    """Prefill 1..prefill_max on S5000 (plus an H200 spill-over pool), decode 1 on H200."""
    body = copy.deepcopy(load_sample(ROOT / "config" / "samples" / "heterogeneous-s5000-h200.yaml"))
    body["metadata"]["name"] = NAME
    spec = body["spec"]
    # The sample's model (GLM-4.6) has no performance profile, so the policy learns capacity from
    # what Prometheus reports and the feedback loop under test acts first; with a profile (the
    # simulated engines are GLM-4.5-FP8's) feed-forward would size from the seed.
    spec["slo"] = {
        "ttft": {"percentile": "P50", "targetMilliseconds": TTFT_TARGET_MS},
        "itl": {"percentile": "P50", "targetMilliseconds": 25},
        "windowSeconds": WINDOW,
    }
    (prefill,) = spec["prefill"]["pools"]
    prefill["replicas"] = {"min": 1, "max": prefill_max}
    (decode,) = spec["decode"]["pools"]
    decode["replicas"] = {"min": 1, "max": 1}
    if spill:
        overflow = copy.deepcopy(decode)
        overflow["name"] = "h200"
        overflow["replicas"] = {"min": 0, "max": 2}
        spec["prefill"]["pools"].append(overflow)
    for role in ("prefill", "decode"):
        for pool in spec[role]["pools"]:
            pool["template"] = {**pool.get("template", {}), "schedulerName": SCHEDULER_NAME}
    spec["scaling"] = {
        "mode": "Active",
        "intervalSeconds": INTERVAL,
        "scaleUp": {"stabilizationSeconds": 0, "maxStepReplicas": 2},
        "scaleDown": {"stabilizationSeconds": SCALE_DOWN_WINDOW, "maxStepReplicas": 1},
        "prometheus": {"url": prometheus_url},
        "prefillToDecodeRatio": {"minPercent": 100, "maxPercent": 400},
    }
    return body
