"""kind mode: make the workers of a real (kind) cluster look like a cluster profile's nodes.

A worker joins a node group through the label `pdoperator.io/node-group` (config/kind/
kind-cluster.yaml sets it). Each such worker gets its group's labels and taints, and its cards
are advertised as extended resources with a JSON patch on `nodes/status`, the documented way
(kubernetes.io "Advertise Extended Resources for a Node"). The real kube-scheduler and kubelet
then place and run pods; nothing is simulated. Group `count` is ignored: the kind cluster decides
how many workers there are. A kubelet restart zeroes extended resources it does not manage, so
run this again after one; it is idempotent.

    python -m pd_tools.simcluster.kind_mode config/clusters/articles.yaml [--kubeconfig PATH]
"""

import argparse
import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from pd_operator.adapters.kube import load_api_client
from pd_tools.simcluster.nodes import (
    JSON_PATCH,
    LABEL_NODE_GROUP,
    LABEL_VIRTUAL_CLUSTER,
    MERGE_PATCH,
    KubeCalls,
)
from pd_tools.simcluster.profile import ClusterProfile, NodeGroup, load_profile

log = logging.getLogger(__name__)

CONFLICT_ATTEMPTS = 5


def pointer_token(name: str) -> str:
    """A JSON Pointer (RFC 6901) token: mthreads.com/gpu -> mthreads.com~1gpu."""
    return name.replace("~", "~0").replace("/", "~1")


def status_patch(group: NodeGroup) -> list[dict[str, Any]]:
    """JSON patch that advertises the group's cards in capacity and allocatable.

    "add" on an existing member replaces it, so applying it twice is harmless. The kubelet
    derives allocatable from capacity by itself; a cluster without kubelets (the local control
    plane in tests) needs it written too.
    """
    return [
        {
            "op": "add",
            "path": f"/status/{field}/{pointer_token(accelerator.resource_name)}",
            "value": str(accelerator.per_node),
        }
        for accelerator in group.accelerators
        for field in ("capacity", "allocatable")
    ]


def metadata_patch(group: NodeGroup, node: Mapping[str, Any]) -> dict[str, Any]:
    """Merge patch with the group's labels and taints, guarded by the node's resourceVersion.

    Taints the node already has are kept, except those with the key and effect of one of the
    group's taints, which the group's version replaces.
    """
    ours = [taint.model_dump(exclude_defaults=True) for taint in group.taints]
    replaced = {(taint["key"], taint["effect"]) for taint in ours}
    kept = [
        taint
        for taint in (node.get("spec") or {}).get("taints") or []
        if (taint.get("key"), taint.get("effect")) not in replaced
    ]
    labels = {
        **group.labels,
        "node.kubernetes.io/instance-type": group.instance,
        LABEL_NODE_GROUP: group.name,
    }
    return {
        "metadata": {"labels": labels, "resourceVersion": node["metadata"]["resourceVersion"]},
        "spec": {"taints": kept + ours},
    }


@dataclass(frozen=True)
class NodePlan:
    """What one worker gets."""

    node: str
    group: str
    metadata_patch: dict[str, Any]
    status_patch: list[dict[str, Any]]


def plan(profile: ClusterProfile, nodes: Iterable[Mapping[str, Any]]) -> list[NodePlan]:
    """Patches for every node labelled with a group of the profile, in name order.

    ValueError if a node names a group the profile lacks: a typo would otherwise leave the
    worker without cards and its pools Pending for no visible reason.
    """
    groups = {group.name: group for group in profile.node_groups}
    plans = []
    for node in sorted(nodes, key=lambda n: n["metadata"]["name"]):
        name = (node["metadata"].get("labels") or {}).get(LABEL_NODE_GROUP)
        if name is None:
            continue
        if name not in groups:
            raise ValueError(
                f"node {node['metadata']['name']} is labelled {LABEL_NODE_GROUP}={name}, "
                f"a group profile {profile.name!r} does not have (it has {sorted(groups)})"
            )
        group = groups[name]
        plans.append(
            NodePlan(
                node["metadata"]["name"], name, metadata_patch(group, node), status_patch(group)
            )
        )
    return plans


def apply_profile(api_client: client.ApiClient, profile: ClusterProfile) -> list[NodePlan]:
    """Label, taint and advertise cards on every worker of a group; returns what was done.

    Nodes of a VirtualCluster carry the group label too but are the simulator's: skipped.
    """
    calls = KubeCalls(api_client, pool_size=2)
    selector = f"{LABEL_NODE_GROUP},!{LABEL_VIRTUAL_CLUSTER}"
    try:
        listing = calls.request(
            "list-nodes", "GET", "/api/v1/nodes", query={"labelSelector": selector}
        )
        plans = plan(profile, listing.get("items") or [])
        for step in plans:
            _patch_metadata(calls, profile.group(step.group), step)
            if step.status_patch:
                calls.request(
                    "node-capacity",
                    "PATCH",
                    f"/api/v1/nodes/{step.node}/status",
                    step.status_patch,
                    content_type=JSON_PATCH,
                )
        missing = {g.name for g in profile.node_groups} - {step.group for step in plans}
        if missing:
            log.warning("no worker is labelled for node group(s) %s", ", ".join(sorted(missing)))
        return plans
    finally:
        calls.close()


def _patch_metadata(calls: KubeCalls, group: NodeGroup, step: NodePlan) -> None:
    patch = step.metadata_patch
    for _ in range(CONFLICT_ATTEMPTS):
        try:
            calls.request(
                "node-labels",
                "PATCH",
                f"/api/v1/nodes/{step.node}",
                patch,
                content_type=MERGE_PATCH,
            )
            return
        except ApiException as error:
            if error.status != 409:
                raise
        # The node changed since it was read (the kubelet or a controller wrote it): read again.
        patch = metadata_patch(
            group, calls.request("node-get", "GET", f"/api/v1/nodes/{step.node}")
        )
    raise RuntimeError(f"node {step.node} kept changing; run kind mode again")


def main(argv: Sequence[str] | None = None) -> int:
    """Command line: apply a profile to the cluster of a kubeconfig."""
    parser = argparse.ArgumentParser(
        prog="python -m pd_tools.simcluster.kind_mode", description=__doc__.splitlines()[0]
    )
    parser.add_argument("profile", help="cluster profile YAML, e.g. config/clusters/articles.yaml")
    parser.add_argument("--kubeconfig", help="default: in-cluster, then ~/.kube/config")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        profile = load_profile(args.profile)
    except (OSError, ValueError) as error:
        parser.error(f"{args.profile}: {getattr(error, 'strerror', None) or error}")
    try:
        api = load_api_client(args.kubeconfig)
    except ValueError as error:
        parser.error(f"--kubeconfig: {error}")
    for step in apply_profile(api, profile):
        cards = [f"{a.per_node} {a.resource_name}" for a in profile.group(step.group).accelerators]
        print(f"{step.node}: node group {step.group}; {', '.join(cards) or 'no cards'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
