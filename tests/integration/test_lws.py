"""The real LeaderWorkerSet controller (sigs.k8s.io/lws, built by `make testenv`) against the
local control plane: what a user of a multi-node pool sees it create."""

import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import yaml
from kubernetes import client, config

from kubetools import RunningOperator, create_pdd, get_pdd, patch_pdd, wait_for
from pd_operator.api import parse_pddeployment
from pd_operator.core.children import build_service, desired_children
from pd_tools.localcluster import LocalCluster
from pd_tools.simcluster.nodes import LABEL_VIRTUAL_CLUSTER
from pd_tools.simcluster.profile import parse_profile
from pd_tools.simcluster.scheduler import SCHEDULER_NAME
from pd_tools.simcluster.virtual import VirtualCluster
from pdcases import minimal

GROUP, VERSION, PLURAL = "leaderworkerset.x-k8s.io", "v1", "leaderworkersets"
NAME_LABEL = "leaderworkerset.sigs.k8s.io/name"
WORKER_INDEX_LABEL = "leaderworkerset.sigs.k8s.io/worker-index"
GROUP_INDEX_LABEL = "leaderworkerset.sigs.k8s.io/group-index"


@pytest.fixture(scope="module")
def lws_api(lws_cluster: LocalCluster) -> client.ApiClient:
    return config.new_client_from_config(config_file=str(lws_cluster.kubeconfig))


@pytest.fixture
def lws_namespace(lws_api: client.ApiClient) -> Iterator[str]:
    name = f"t-{uuid.uuid4().hex[:10]}"
    core = client.CoreV1Api(lws_api)
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=name)))
    yield name
    core.delete_namespace(name)


def leader_worker_set(name: str, *, size: int, replicas: int) -> dict[str, Any]:
    pod = {
        "metadata": {"labels": {"app": name}},
        "spec": {"containers": [{"name": "engine", "image": "registry.invalid/engine:1"}]},
    }
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "LeaderWorkerSet",
        "metadata": {"name": name},
        "spec": {
            "replicas": replicas,
            "leaderWorkerTemplate": {"size": size, "leaderTemplate": pod, "workerTemplate": pod},
        },
    }


def pods_of(api: client.ApiClient, namespace: str, name: str) -> dict[str, client.V1Pod]:
    pods = client.CoreV1Api(api).list_namespaced_pod(
        namespace, label_selector=f"{NAME_LABEL}={name}"
    )
    return {pod.metadata.name: pod for pod in pods.items}


def labels(pod: client.V1Pod) -> dict[str, str]:
    return dict(pod.metadata.labels)


def env(pod: client.V1Pod) -> dict[str, str]:
    return {var.name: var.value for var in pod.spec.containers[0].env or []}


def statefulsets(api: client.ApiClient, namespace: str) -> dict[str, int]:
    sets = client.AppsV1Api(api).list_namespaced_stateful_set(namespace).items
    return {s.metadata.name: s.spec.replicas for s in sets}


def test_lws_controller_creates_leader_and_worker_pods_and_scales_by_groups(
    lws_api: client.ApiClient, lws_namespace: str
) -> None:
    custom = client.CustomObjectsApi(lws_api)
    custom.create_namespaced_custom_object(
        GROUP, VERSION, lws_namespace, PLURAL, leader_worker_set("engine", size=2, replicas=1)
    )

    # One group: the leader StatefulSet `engine` (one pod per group) and the group's worker
    # StatefulSet `engine-0` (size - 1 pods), created once the leader pod exists.
    wait_for(
        lambda: statefulsets(lws_api, lws_namespace) == {"engine": 1, "engine-0": 1},
        what="the leader and worker StatefulSets",
    )
    pods = wait_for(
        lambda: (
            (p := pods_of(lws_api, lws_namespace, "engine")).keys() == {"engine-0", "engine-0-1"}
            and p
        ),
        what="a leader pod and a worker pod",
    )
    # LWS's webhooks label each pod with its place in the group (the leader, the group's only
    # endpoint, is worker 0) and tell each engine where its leader is.
    leader, worker = pods["engine-0"], pods["engine-0-1"]
    assert labels(leader)[WORKER_INDEX_LABEL] == "0"
    assert labels(worker)[WORKER_INDEX_LABEL] == "1"
    assert labels(leader)["app"] == labels(worker)["app"] == "engine"
    assert env(worker)["LWS_WORKER_INDEX"] == "1"
    assert env(worker)["LWS_GROUP_SIZE"] == "2"
    assert env(worker)["LWS_LEADER_ADDRESS"] == env(leader)["LWS_LEADER_ADDRESS"]
    assert env(leader)["LWS_LEADER_ADDRESS"].startswith("engine-0.engine.")

    custom.patch_namespaced_custom_object_scale(
        GROUP, VERSION, lws_namespace, PLURAL, "engine", {"spec": {"replicas": 2}}
    )
    wait_for(
        lambda: statefulsets(lws_api, lws_namespace) == {"engine": 2, "engine-0": 1, "engine-1": 1},
        what="a second group's StatefulSets",
    )
    pods = wait_for(
        lambda: len(p := pods_of(lws_api, lws_namespace, "engine")) == 4 and p,
        what="four pods in two groups",
    )
    assert set(pods) == {"engine-0", "engine-0-1", "engine-1", "engine-1-1"}
    leaders = {name for name, pod in pods.items() if labels(pod)[WORKER_INDEX_LABEL] == "0"}
    assert leaders == {"engine-0", "engine-1"}
    stored = custom.get_namespaced_custom_object(GROUP, VERSION, lws_namespace, PLURAL, "engine")
    assert stored["spec"]["replicas"] == 2
    # The controller reconciles the object without errors: it reports its status.
    wait_for(
        lambda: (
            custom.get_namespaced_custom_object_status(
                GROUP, VERSION, lws_namespace, PLURAL, "engine"
            )
            .get("status", {})
            .get("replicas")
            == 2
        ),
        what="the LeaderWorkerSet's status",
    )


def test_the_operators_leader_worker_set_runs_groups_whose_leaders_alone_are_endpoints(
    lws_cluster: LocalCluster, lws_api: client.ApiClient, lws_namespace: str
) -> None:
    # The manifests the operator builds for a 2-node pool, server-side applied as it applies
    # them: the CRD's schema, LWS's webhooks and its controller take them as they are.
    document = minimal()
    document["metadata"]["namespace"] = lws_namespace
    document["spec"]["prefill"]["pools"][0]["accelerator"]["nodesPerReplica"] = 2
    stored = client.CustomObjectsApi(lws_api).create_namespaced_custom_object(
        "pdoperator.io", "v1alpha1", lws_namespace, "pddeployments", document
    )
    pdd = parse_pddeployment(stored)
    children = [
        c for c in desired_children(pdd, {("prefill", "p"): 2}) if c["kind"] != "Deployment"
    ]
    lws_cluster.kubectl(
        "apply", "--server-side", "--field-manager=pd-operator", "-n", lws_namespace, "-f", "-",
        input_text=yaml.safe_dump_all(children),
    )  # fmt: skip

    pods = wait_for(
        lambda: len(p := pods_of(lws_api, lws_namespace, "minimal-prefill-p")) == 4 and p,
        what="two groups of two pods",
    )
    service = build_service(pdd, "prefill")["spec"]["selector"]
    endpoints = client.CoreV1Api(lws_api).list_namespaced_pod(
        lws_namespace, label_selector=",".join(f"{k}={v}" for k, v in service.items())
    )
    assert {pod.metadata.name for pod in endpoints.items} == {
        "minimal-prefill-p-0",
        "minimal-prefill-p-1",
    }
    for name, pod in pods.items():
        command = pod.spec.containers[0].command
        is_leader = labels(pod)[WORKER_INDEX_LABEL] == "0"
        assert ("--headless" not in command) == is_leader, name
        # What the kubelet expands $(LWS_...) in the command with.
        assert {"LWS_LEADER_ADDRESS", "LWS_WORKER_INDEX"} <= env(pod).keys(), name
    budget = next(c for c in children if c["kind"] == "PodDisruptionBudget")
    selector = budget["spec"]["selector"]["matchLabels"]
    covered = client.CoreV1Api(lws_api).list_namespaced_pod(
        lws_namespace, label_selector=",".join(f"{k}={v}" for k, v in selector.items())
    )
    assert {pod.metadata.name for pod in covered.items} == set(pods)


def test_the_operator_runs_a_two_node_decode_pool_as_groups_and_grows_it_by_whole_groups(
    lws_cluster: LocalCluster, lws_api: client.ApiClient, lws_namespace: str
) -> None:
    # The operator itself, watching this namespace: a decode replica spans two H200 nodes.
    running = RunningOperator(
        str(lws_cluster.kubeconfig), namespaces=[lws_namespace], workers=2, resync_seconds=1
    ).start()
    try:
        document = minimal()
        decode = document["spec"]["decode"]["pools"][0]
        decode["accelerator"] |= {"nodesPerReplica": 2, "perReplica": 8}
        decode["replicas"] = {"min": 1, "max": 4}
        create_pdd(lws_api, lws_namespace, document)

        group = "minimal-decode-d"
        pods = wait_for(
            lambda: len(p := pods_of(lws_api, lws_namespace, group)) == 2 and p,
            what="one group of two pods",
        )
        assert sorted(labels(pod)[WORKER_INDEX_LABEL] for pod in pods.values()) == ["0", "1"]
        for pod in pods.values():
            limits = pod.spec.containers[0].resources.limits
            assert limits["nvidia.com/gpu"] == "8", pod.metadata.name
        # No Deployment for a multi-node pool: the LeaderWorkerSet is its workload.
        apps = client.AppsV1Api(lws_api)
        assert group not in {d.metadata.name for d in apps.list_namespaced_deployment(
            lws_namespace).items}  # fmt: skip

        decode["replicas"]["min"] = 2  # a merge patch replaces the list of pools whole
        patch_pdd(lws_api, lws_namespace, "minimal", {"spec": {"decode": {"pools": [decode]}}})
        pods = wait_for(
            lambda: len(p := pods_of(lws_api, lws_namespace, group)) == 4 and p,
            what="two groups of two pods",
        )
        leaders = {n for n, pod in pods.items() if labels(pod)[WORKER_INDEX_LABEL] == "0"}
        assert leaders == {f"{group}-0", f"{group}-1"}

        def reported() -> dict[str, Any] | None:
            status = get_pdd(lws_api, lws_namespace, "minimal").get("status") or {}
            pool = next((p for p in status.get("pools") or [] if p["role"] == "decode"), None)
            return pool if pool and pool.get("desiredReplicas") == 2 else None

        pool = wait_for(reported, what="status reporting two decode groups")
        assert pool["replicas"] == 2, pool
        lws = client.CustomObjectsApi(lws_api).get_namespaced_custom_object(
            GROUP, VERSION, lws_namespace, PLURAL, group
        )
        assert lws["spec"]["replicas"] == 2
        assert lws["spec"]["leaderWorkerTemplate"]["size"] == 2
        owner = lws["metadata"]["ownerReferences"][0]
        assert (owner["kind"], owner["name"]) == ("PDDeployment", "minimal")
    finally:
        running.stop()


def unschedulable(pod: client.V1Pod) -> bool:
    return any(
        c.type == "PodScheduled" and c.status == "False" and c.reason == "Unschedulable"
        for c in pod.status.conditions or []
    )


def test_the_mock_scheduler_binds_a_group_whole_or_leaves_all_of_it_pending(
    lws_api: client.ApiClient, lws_namespace: str
) -> None:
    # Three 8-card H200 nodes; a group is two pods of 8 cards: one group fits, a second not.
    profile = parse_profile(
        {
            "name": "three",
            "nodeGroups": [
                {
                    "name": "h200",
                    "count": 3,
                    "cpu": "32",
                    "memory": "256Gi",
                    "accelerators": [
                        {"resourceName": "nvidia.com/gpu", "perNode": 8, "profile": "h200"}
                    ],
                }
            ],
        }
    )
    virtual = VirtualCluster(
        lws_api, profile, time_scale=0.01, name_prefix=f"{lws_namespace}-", namespace=lws_namespace
    )
    virtual.start()
    custom = client.CustomObjectsApi(lws_api)
    try:
        body = leader_worker_set("engine", size=2, replicas=1)
        for template in ("leaderTemplate", "workerTemplate"):
            spec = body["spec"]["leaderWorkerTemplate"][template]["spec"]
            spec["schedulerName"] = SCHEDULER_NAME
            spec["nodeSelector"] = {LABEL_VIRTUAL_CLUSTER: virtual.name}
            spec["containers"][0]["resources"] = {
                "requests": {"nvidia.com/gpu": "8"},
                "limits": {"nvidia.com/gpu": "8"},
            }
        custom.create_namespaced_custom_object(GROUP, VERSION, lws_namespace, PLURAL, body)

        def group(index: str) -> list[client.V1Pod]:
            pods = pods_of(lws_api, lws_namespace, "engine").values()
            return [pod for pod in pods if labels(pod).get(GROUP_INDEX_LABEL) == index]

        first = wait_for(
            lambda: len(g := group("0")) == 2 and all(p.spec.node_name for p in g) and g,
            what="the first group of two pods bound",
        )
        assert len({pod.spec.node_name for pod in first}) == 2  # 8 cards each: a node each

        custom.patch_namespaced_custom_object(
            GROUP, VERSION, lws_namespace, PLURAL, "engine", {"spec": {"replicas": 2}}
        )
        second = wait_for(
            lambda: len(g := group("1")) == 2 and all(unschedulable(p) for p in g) and g,
            what="both pods of the second group marked Unschedulable",
        )
        assert [pod.spec.node_name for pod in second] == [None, None]
        message = next(c.message for c in second[0].status.conditions if c.type == "PodScheduled")
        assert "The 2 pods of group" in message and "none is bound" in message
        # The third node is free, yet no pod of the group takes it: a pass later, still none.
        time.sleep(2)
        assert [pod.spec.node_name for pod in group("1")] == [None, None]
        assert all(pod.spec.node_name for pod in group("0"))
    finally:
        custom.delete_namespaced_custom_object(GROUP, VERSION, lws_namespace, PLURAL, "engine")
        client.CoreV1Api(lws_api).delete_collection_namespaced_pod(
            lws_namespace, grace_period_seconds=0
        )
        virtual.stop()


def operator_on_nodes(
    lws_cluster: LocalCluster, api: client.ApiClient, namespace: str, name: str
) -> tuple[VirtualCluster, RunningOperator]:
    """One 8-card S5000 node and three 8-card H200 nodes on the mock scheduler, and the
    operator watching `namespace`; both started (the caller stops them)."""
    node_group = {"cpu": "32", "memory": "256Gi"}
    profile = parse_profile({
        "name": name,
        "nodeGroups": [
            {"name": "s5000", "count": 1, **node_group, "accelerators": [
                {"resourceName": "mthreads.com/gpu", "perNode": 8, "profile": "mtt-s5000"}]},
            {"name": "h200", "count": 3, **node_group, "accelerators": [
                {"resourceName": "nvidia.com/gpu", "perNode": 8, "profile": "h200"}]},
        ],
    })  # fmt: skip
    virtual = VirtualCluster(
        api, profile, time_scale=0.01, name_prefix=f"{namespace}-", namespace=namespace
    )
    virtual.start()
    running = RunningOperator(
        str(lws_cluster.kubeconfig), namespaces=[namespace], workers=2, resync_seconds=1
    ).start()
    return virtual, running


def test_a_node_lost_from_a_running_group_is_reported_by_the_operator(
    lws_cluster: LocalCluster, lws_api: client.ApiClient, lws_namespace: str
) -> None:
    # One S5000 node for prefill; three H200 nodes, a decode replica spans two of them.
    virtual, running = operator_on_nodes(lws_cluster, lws_api, lws_namespace, "lost")
    try:
        document = minimal()
        document["spec"]["scaling"] = {"mode": "Disabled"}
        for role, cards in (("prefill", 8), ("decode", 8)):
            pool = document["spec"][role]["pools"][0]
            pool["accelerator"]["perReplica"] = cards
            pool["template"] = {"schedulerName": SCHEDULER_NAME}
        document["spec"]["decode"]["pools"][0]["accelerator"]["nodesPerReplica"] = 2
        create_pdd(lws_api, lws_namespace, document)
        group = wait_for(
            lambda: (
                len(g := pods_of(lws_api, lws_namespace, "minimal-decode-d")) == 2
                and all(p.spec.node_name for p in g.values())
                and g
            ),
            what="the decode group bound whole",
        )
        worker = next(p for p in group.values() if labels(p)[WORKER_INDEX_LABEL] == "1")
        lost = worker.spec.node_name
        client.CoreV1Api(lws_api).delete_node(lost)

        def stalled() -> dict[str, Any] | None:
            status = get_pdd(lws_api, lws_namespace, "minimal").get("status") or {}
            found = [c for c in status.get("conditions") or [] if c["type"] == "Stalled"]
            return found[0] if found and found[0]["status"] == "True" else None

        condition = wait_for(stalled, what="the lost node reported")
        assert condition["reason"] == "GroupNodeLost", condition
        assert lost in condition["message"] and "minimal-decode-d-0" in condition["message"]
    finally:
        running.stop()
        client.CoreV1Api(lws_api).delete_collection_namespaced_pod(
            lws_namespace, grace_period_seconds=0
        )
        virtual.stop()


def test_a_group_that_cannot_be_placed_is_never_requested(
    lws_cluster: LocalCluster, lws_api: client.ApiClient, lws_namespace: str
) -> None:
    # Three H200 nodes hold one 2-node decode replica, not two. A GitOps tool asks for three
    # through the decode PDPool (scaling mode External): the operator runs the one that fits.
    virtual, running = operator_on_nodes(lws_cluster, lws_api, lws_namespace, "few")
    custom = client.CustomObjectsApi(lws_api)
    try:
        document = minimal()
        document["spec"]["scaling"] = {"mode": "External"}
        for role in ("prefill", "decode"):
            pool = document["spec"][role]["pools"][0]
            pool["accelerator"]["perReplica"] = 8
            pool["template"] = {"schedulerName": SCHEDULER_NAME}
            pool["replicas"] = {"min": 1, "max": 4}
        document["spec"]["decode"]["pools"][0]["accelerator"]["nodesPerReplica"] = 2
        create_pdd(lws_api, lws_namespace, document)
        wait_for(
            lambda: (
                len(g := pods_of(lws_api, lws_namespace, "minimal-decode-d")) == 2
                and all(p.spec.node_name for p in g.values())
            ),
            what="the first decode group bound whole",
        )
        wait_for(
            lambda: custom.list_namespaced_custom_object(
                "pdoperator.io", "v1alpha1", lws_namespace, "pdpools",
                field_selector="metadata.name=minimal-decode",
            )["items"],
            what="the decode PDPool",
        )  # fmt: skip
        custom.patch_namespaced_custom_object(
            "pdoperator.io", "v1alpha1", lws_namespace, "pdpools", "minimal-decode",
            {"spec": {"replicas": 3}},
        )  # fmt: skip

        def overridden() -> dict[str, Any] | None:
            status = get_pdd(lws_api, lws_namespace, "minimal").get("status") or {}
            entries = {e["role"]: e for e in status.get("externalScaling") or []}
            decode = entries.get("decode") or {}
            return decode if decode.get("requestedReplicas") == 3 else None

        entry = wait_for(overridden, what="the PDPool's request of 3 in status")
        assert (entry["replicas"], entry["limitedBy"]) == (1, "capacity"), entry
        assert entry["message"] == "decode: PDPool asks 3, capacity allows 1", entry
        # Nothing beyond the one group was asked of LWS, so no pod waits for nodes.
        time.sleep(2)
        lws = custom.get_namespaced_custom_object(
            GROUP, VERSION, lws_namespace, PLURAL, "minimal-decode-d"
        )
        assert lws["spec"]["replicas"] == 1
        assert len(pods_of(lws_api, lws_namespace, "minimal-decode-d")) == 2
    finally:
        running.stop()
        client.CoreV1Api(lws_api).delete_collection_namespaced_pod(
            lws_namespace, grace_period_seconds=0
        )
        virtual.stop()
