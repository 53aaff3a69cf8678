"""The example PDDeployment the replay tools default to: the articles' topology."""

from typing import Any


def example_document(
    model_name: str = "zai-org/GLM-4.5-FP8", percentile: str = "P50"
) -> dict[str, Any]:
    """The articles' topology: MTT S5000 prefill, H200 decode, replicas of 8 cards; TTFT 6 s
    and ITL 20 ms, both at `percentile` (P99 for a ">= 99% of requests" objective)."""
    pool = {
        "prefill": ("s5000", "mthreads.com/gpu", "mtt-s5000", 16),
        "decode": ("h200", "nvidia.com/gpu", "h200", 8),
    }
    return {
        "apiVersion": "pdoperator.io/v1alpha1",
        "kind": "PDDeployment",
        "metadata": {"name": "example"},
        "spec": {
            "model": {"name": model_name, "image": "vllm/vllm-openai:v0.11.0"},
            "slo": {
                "ttft": {"percentile": percentile, "targetMilliseconds": 6000},
                "itl": {"percentile": percentile, "targetMilliseconds": 20},
                "windowSeconds": 60,
            },
            **{
                role: {
                    "pools": [
                        {
                            "name": name,
                            "accelerator": {
                                "resourceName": resource,
                                "perReplica": 8,
                                "profile": profile,
                            },
                            "replicas": {"min": 1, "max": most},
                        }
                    ]
                }
                for role, (name, resource, profile, most) in pool.items()
            },
            "scaling": {"mode": "Active", "intervalSeconds": 30},
        },
    }
