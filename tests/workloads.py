"""Plain Deployments of accelerator pods for the mock scheduler (tests and bench scripts)."""

from typing import Any

from pd_tools.simcluster.scheduler import SCHEDULER_NAME

# (extended resource, node selector) of the cards in config/clusters/*.yaml.
Card = tuple[str, dict[str, str]]
S5000: Card = ("mthreads.com/gpu", {"mthreads.com/gpu.product": "MTT-S5000"})
H200: Card = ("nvidia.com/gpu", {"nvidia.com/gpu.product": "NVIDIA-H200"})


def deployment(
    name: str,
    replicas: int,
    card: Card,
    *,
    cards: int = 8,
    cpu: str = "4",
    memory: str | None = None,
) -> dict[str, Any]:
    """A Deployment whose pods (label app=`name`) each ask the mock scheduler for `cards` cards."""
    resource, selector = card
    labels = {"app": name}
    requests = {resource: str(cards), "cpu": cpu} | ({"memory": memory} if memory else {})
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "schedulerName": SCHEDULER_NAME,
                    "nodeSelector": selector,
                    "tolerations": [
                        {"key": resource, "operator": "Exists", "effect": "NoSchedule"}
                    ],
                    "containers": [
                        {
                            "name": "engine",
                            "image": "engine:1",
                            "resources": {
                                "requests": requests,
                                "limits": {resource: str(cards)},
                            },
                        }
                    ],
                },
            },
        },
    }
