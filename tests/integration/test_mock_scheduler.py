"""The mock scheduler, virtual nodes and kubelet, and kind mode, on the real local control plane.

Each test gets its own VirtualCluster (nodes prefixed with the test's namespace) on the session's
apiserver and controller-manager: Deployments and ReplicaSets are the real controllers'.
"""

import ipaddress
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from kubernetes import client, watch

from pd_operator.api import parse_pddeployment
from pd_operator.core.children import LABEL_DEPLOYMENT, LABEL_ROLE, build_deployment
from pd_operator.core.hardware import GLM_45_FP8, MTT_S5000
from pd_operator.core.perfmodel import model_load_seconds
from pd_operator.core.scheduling import REASON_TAINT
from pd_tools.simcluster.kind_mode import apply_profile
from pd_tools.simcluster.kubelet import POD_ADDRESSES
from pd_tools.simcluster.nodes import LABEL_NODE_GROUP, LABEL_VIRTUAL_CLUSTER, LEASE_NAMESPACE
from pd_tools.simcluster.profile import ClusterProfile, load_profile
from pd_tools.simcluster.scheduler import SCHEDULER_NAME
from pd_tools.simcluster.virtual import VirtualCluster
from pdcases import ROOT, minimal
from workloads import H200, S5000, deployment

TINY = ROOT / "config" / "clusters" / "tiny.yaml"

MakeCluster = Callable[..., VirtualCluster]


def wait_for(check: Callable[[], Any], timeout: float = 20, what: str = "condition") -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


@pytest.fixture
def virtual(api_client: client.ApiClient, namespace: str) -> Iterator[MakeCluster]:
    started: list[VirtualCluster] = []

    def make(profile: Any = TINY, time_scale: float = 0.02) -> VirtualCluster:
        cluster = VirtualCluster(
            api_client,
            profile,
            time_scale=time_scale,
            name_prefix=f"{namespace}-",
            namespace=namespace,
        )
        cluster.start()
        started.append(cluster)
        return cluster

    yield make
    # Remove the pods while their kubelet still runs; then the nodes go with stop().
    client.AppsV1Api(api_client).delete_collection_namespaced_deployment(namespace)
    client.CoreV1Api(api_client).delete_collection_namespaced_pod(namespace, grace_period_seconds=0)
    core = client.CoreV1Api(api_client)
    for cluster in started:
        cluster.stop()
        selector = f"{LABEL_VIRTUAL_CLUSTER}={cluster.name}"
        assert not core.list_node(label_selector=selector).items, "stop() leaves no node"


def pods(api_client: client.ApiClient, namespace: str, app: str) -> list[client.V1Pod]:
    core = client.CoreV1Api(api_client)
    return list(core.list_namespaced_pod(namespace, label_selector=f"app={app}").items)


def condition(pod: client.V1Pod, kind: str) -> client.V1PodCondition | None:
    return next((c for c in pod.status.conditions or [] if c.type == kind), None)


def is_ready(pod: client.V1Pod) -> bool:
    ready = condition(pod, "Ready")
    return bool(ready and ready.status == "True" and not pod.metadata.deletion_timestamp)


def pending_message(pod: client.V1Pod) -> str | None:
    scheduled = condition(pod, "PodScheduled")
    if scheduled and scheduled.status == "False" and scheduled.reason == "Unschedulable":
        return str(scheduled.message)
    return None


def failed_scheduling(api_client: client.ApiClient, namespace: str, pod: str) -> list[str]:
    events = client.CoreV1Api(api_client).list_namespaced_event(
        namespace, field_selector=f"involvedObject.name={pod},reason=FailedScheduling"
    )
    return [e.message for e in events.items if e.source.component == SCHEDULER_NAME]


def settle(
    api_client: client.ApiClient, namespace: str, app: str, ready: int, pending: int
) -> tuple[list[client.V1Pod], list[client.V1Pod]]:
    """Wait until the app has exactly `ready` Ready pods and `pending` Unschedulable ones."""

    def check() -> tuple[list[client.V1Pod], list[client.V1Pod]] | None:
        live = [p for p in pods(api_client, namespace, app) if not p.metadata.deletion_timestamp]
        up = [p for p in live if is_ready(p)]
        waiting = [p for p in live if pending_message(p)]
        if len(up) == ready and len(waiting) == pending and len(live) == ready + pending:
            return up, waiting
        return None

    # A generous budget: a new node waits for the node-lifecycle controller to lift its
    # not-ready taint, which takes longer on a loaded 2-core machine.
    try:
        result: tuple[list[client.V1Pod], list[client.V1Pod]] = wait_for(
            check, timeout=60, what=f"{app}: {ready} Ready and {pending} Pending"
        )
    except AssertionError as error:
        raise AssertionError(f"{error}\n{what_is_there(api_client, namespace, app)}") from error
    return result


def what_is_there(api_client: client.ApiClient, namespace: str, app: str) -> str:
    """The app's pods and the test's nodes as they are: what a timed-out wait saw."""
    lines = []
    for pod in pods(api_client, namespace, app):
        ready = condition(pod, "Ready")
        lines.append(
            f"pod {pod.metadata.name}: node={pod.spec.node_name} phase={pod.status.phase} "
            f"ready={ready.status if ready else None} pending={pending_message(pod)!r} "
            f"deleting={pod.metadata.deletion_timestamp is not None}"
        )
    for node in client.CoreV1Api(api_client).list_node().items:
        if node.metadata.name.startswith(f"{namespace}-"):
            taints = [f"{t.key}:{t.effect}" for t in node.spec.taints or []]
            ready = next((c for c in node.status.conditions or [] if c.type == "Ready"), None)
            lines.append(
                f"node {node.metadata.name}: ready={ready.status if ready else None} "
                f"taints={taints}"
            )
    return "\n".join(lines)


def test_pods_that_do_not_fit_stay_pending_with_the_schedulers_words_and_one_event(
    api_client, namespace, virtual
):
    cluster = virtual()
    apps = client.AppsV1Api(api_client)
    apps.create_namespaced_deployment(namespace, deployment("prefill", 3, S5000))
    running, waiting = settle(api_client, namespace, "prefill", ready=2, pending=1)
    s5000_nodes = [n for n in cluster.node_names if "-s5000-" in n]
    assert sorted(p.spec.node_name for p in running) == s5000_nodes
    message = f"0/3 nodes are available: 1 {REASON_TAINT}, 2 Insufficient mthreads.com/gpu."
    assert pending_message(waiting[0]) == message
    stuck = waiting[0].metadata.name
    assert wait_for(lambda: failed_scheduling(api_client, namespace, stuck)) == [message]

    # Decode does not fit either; the pass that says so must not repeat prefill's event.
    apps.create_namespaced_deployment(namespace, deployment("decode", 2, H200))
    _, decode_waiting = settle(api_client, namespace, "decode", ready=1, pending=1)
    assert pending_message(decode_waiting[0]) == (
        f"0/3 nodes are available: 1 Insufficient nvidia.com/gpu, 2 {REASON_TAINT}."
    )
    assert failed_scheduling(api_client, namespace, stuck) == [message]


def test_freed_capacity_and_new_nodes_get_pending_pods_bound_and_ready(
    api_client, namespace, virtual
):
    cluster = virtual()
    apps = client.AppsV1Api(api_client)
    apps.create_namespaced_deployment(namespace, deployment("first", 2, S5000))
    settle(api_client, namespace, "first", ready=2, pending=0)
    apps.create_namespaced_deployment(namespace, deployment("second", 2, S5000))
    settle(api_client, namespace, "second", ready=0, pending=2)

    apps.patch_namespaced_deployment_scale("first", namespace, {"spec": {"replicas": 1}})
    (kept,), _ = settle(api_client, namespace, "first", ready=1, pending=0)
    (moved_in,), _ = settle(api_client, namespace, "second", ready=1, pending=1)
    assert moved_in.spec.node_name != kept.spec.node_name

    (added,) = cluster.add_nodes("s5000")
    up, _ = settle(api_client, namespace, "second", ready=2, pending=0)
    assert added in {p.spec.node_name for p in up}


def test_a_bound_pod_creates_containers_then_loads_the_model_then_turns_ready(
    api_client, namespace, virtual
):
    scale = 0.05
    cluster = virtual(time_scale=scale)
    core = client.CoreV1Api(api_client)
    stream = watch.Watch()
    client.AppsV1Api(api_client).create_namespaced_deployment(
        namespace, deployment("prefill", 1, S5000)
    )
    seen: dict[str, float] = {}
    for event in stream.stream(core.list_namespaced_pod, namespace, timeout_seconds=20):
        pod, now = event["object"], time.monotonic()
        state = (pod.status.container_statuses or [None])[0]
        if state and state.state.waiting and state.state.waiting.reason == "ContainerCreating":
            seen.setdefault("creating", now)
        if pod.status.phase == "Running" and not is_ready(pod):
            seen.setdefault("loading", now)
        if is_ready(pod):
            seen["ready"] = now
            stream.stop()
    assert list(seen) == ["creating", "loading", "ready"]
    load = model_load_seconds(MTT_S5000, GLM_45_FP8, 8) * scale
    assert seen["ready"] - seen["loading"] >= 0.9 * load  # not Ready before the weights load

    (pod,) = pods(api_client, namespace, "prefill")
    node = client.CoreV1Api(api_client).read_node(pod.spec.node_name)
    internal = next(a.address for a in node.status.addresses if a.type == "InternalIP")
    assert pod.status.host_ip == internal
    assert ipaddress.ip_address(pod.status.pod_ip) in POD_ADDRESSES
    assert pod.status.start_time is not None
    assert {c.type for c in pod.status.conditions if c.status == "True"} >= {
        "PodScheduled",
        "Initialized",
        "ContainersReady",
        "Ready",
    }
    assert pod.spec.node_name in cluster.node_names
    # The node's kubelet is represented by a Lease the node-lifecycle controller reads.
    lease = client.CoordinationV1Api(api_client).read_namespaced_lease(
        pod.spec.node_name, LEASE_NAMESPACE
    )
    assert lease.spec.holder_identity == pod.spec.node_name
    assert [o.name for o in lease.metadata.owner_references] == [pod.spec.node_name]


def test_a_failed_node_has_its_pods_replaced_elsewhere_or_left_pending_until_it_recovers(
    api_client, namespace, virtual
):
    cluster = virtual(time_scale=0.01)  # the 300 s unreachable toleration takes 3 s
    core = client.CoreV1Api(api_client)
    client.AppsV1Api(api_client).create_namespaced_deployment(
        namespace, deployment("prefill", 1, S5000)
    )
    (first,), _ = settle(api_client, namespace, "prefill", ready=1, pending=0)
    lost = first.spec.node_name

    cluster.fail_node(lost)
    node = core.read_node(lost)
    assert condition(node, "Ready").status == "Unknown"
    assert "node.kubernetes.io/unreachable" in {t.key for t in node.spec.taints}
    # Until the taint manager evicts it, the lost pod still reads Ready: wait for the eviction.
    wait_for(
        lambda: (
            core.read_namespaced_pod(first.metadata.name, namespace).metadata.deletion_timestamp
        ),
        timeout=60,
        what="the pod on the failed node to be evicted",
    )
    (second,), _ = settle(api_client, namespace, "prefill", ready=1, pending=0)
    assert second.spec.node_name not in (lost, None)
    old = core.read_namespaced_pod(first.metadata.name, namespace)
    assert old.metadata.deletion_timestamp and not is_ready(old)  # Terminating on a dead node

    cluster.fail_node(second.spec.node_name)
    _, (third,) = settle(api_client, namespace, "prefill", ready=0, pending=1)
    assert pending_message(third) == f"0/3 nodes are available: 3 {REASON_TAINT}."

    cluster.recover_node(lost)
    (back,), _ = settle(api_client, namespace, "prefill", ready=1, pending=0)
    assert back.metadata.name == third.metadata.name and back.spec.node_name == lost
    wait_for(
        lambda: (
            first.metadata.name
            not in {p.metadata.name for p in pods(api_client, namespace, "prefill")}
        ),
        what="the evicted pod to be removed once its node is back",
    )


def test_a_live_node_marked_unknown_by_the_node_controller_posts_ready_again(api_client, virtual):
    cluster = virtual()
    core = client.CoreV1Api(api_client)
    name = cluster.node_names[0]
    # What the node-lifecycle controller writes when a lease renewal comes too late.
    core.patch_node_status(
        name,
        {"status": {"conditions": [{"type": "Ready", "status": "Unknown",
                                    "reason": "NodeStatusUnknown"}]}},
    )  # fmt: skip
    wait_for(
        lambda: condition(core.read_node(name), "Ready").status == "True",
        timeout=10,
        what="the virtual kubelet to post Ready again",
    )


def test_a_crashed_engine_restarts_and_reloads_in_the_same_pod(api_client, namespace, virtual):
    cluster = virtual()
    client.AppsV1Api(api_client).create_namespaced_deployment(
        namespace, deployment("decode", 1, H200)
    )
    (before,), _ = settle(api_client, namespace, "decode", ready=1, pending=0)
    cluster.crash_pod(namespace, before.metadata.name)

    def restarted() -> client.V1Pod | None:
        (pod,) = pods(api_client, namespace, "decode")
        status = pod.status.container_statuses[0]
        return pod if status.restart_count == 1 and is_ready(pod) else None

    after = wait_for(restarted, what="the engine to restart and load again")
    assert after.metadata.name == before.metadata.name
    assert after.status.container_statuses[0].last_state.terminated.exit_code == 1


def test_kind_mode_labels_taints_and_advertises_cards_on_labelled_workers(api_client, namespace):
    core = client.CoreV1Api(api_client)
    workers = {f"{namespace}-w1": "s5000", f"{namespace}-w2": "h200", f"{namespace}-sys": None}
    for name, group in workers.items():
        labels = {LABEL_NODE_GROUP: group} if group else {}
        core.create_node(
            {
                "apiVersion": "v1",
                "kind": "Node",
                "metadata": {"name": name, "labels": labels},
                "status": {"capacity": {"cpu": "8", "memory": "32Gi", "pods": "110"}},
            }
        )
    try:
        articles = load_profile(ROOT / "config" / "clusters" / "articles.yaml")
        apply_profile(api_client, articles)
        apply_profile(api_client, articles)  # again, as after a kubelet restart: no duplicates
        s5000 = core.read_node(f"{namespace}-w1")
        assert s5000.metadata.labels["mthreads.com/gpu.product"] == "MTT-S5000"
        assert s5000.status.capacity["mthreads.com/gpu"] == "8"
        assert s5000.status.allocatable["mthreads.com/gpu"] == "8"
        ours = [t for t in s5000.spec.taints if t.key == "mthreads.com/gpu"]
        assert [(t.effect, t.value) for t in ours] == [("NoSchedule", None)]
        h200 = core.read_node(f"{namespace}-w2")
        assert h200.status.capacity["nvidia.com/gpu"] == "8"
        assert "mthreads.com/gpu" not in h200.status.capacity
        plain = core.read_node(f"{namespace}-sys")
        assert not any(k.endswith("/gpu") for k in plain.status.capacity)
        assert "mthreads.com/gpu.product" not in (plain.metadata.labels or {})
    finally:
        for name in workers:
            core.delete_node(name)


RACK = "example.com/rack"


def racks() -> ClusterProfile:
    """Two racks of two 8-card H200 nodes, told apart by the RACK label."""
    return ClusterProfile.model_validate(
        {
            "name": "racks",
            "nodeGroups": [
                {
                    "name": f"rack-{rack}",
                    "count": 2,
                    "labels": {RACK: rack, "nvidia.com/gpu.product": "NVIDIA-H200"},
                    "taints": [{"key": "nvidia.com/gpu", "effect": "NoSchedule"}],
                    "accelerators": [
                        {"resourceName": "nvidia.com/gpu", "perNode": 8, "profile": "h200"}
                    ],
                }
                for rack in ("a", "b")
            ],
        }
    )


def blocker(name: str, node: str) -> dict[str, Any]:
    """Another workload's pod holding 4 cards on a given node."""
    cards = {"nvidia.com/gpu": "4"}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {"app": "blocker"}},
        "spec": {
            "nodeName": node,
            "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists"}],
            "containers": [
                {"name": "c", "image": "other:1", "resources": {"requests": cards, "limits": cards}}
            ],
        },
    }


@pytest.mark.parametrize("mode", ["Required", None])
def test_required_placement_keeps_a_deployments_prefill_and_decode_in_one_rack(
    api_client, namespace, virtual, mode
):
    cluster = virtual(racks())
    document = minimal()
    document["metadata"].update(namespace=namespace, uid="uid-racks")
    if mode:
        document["spec"]["placement"] = {"topologyKey": RACK, "mode": mode}
    for role in ("prefill", "decode"):
        (pool,) = document["spec"][role]["pools"]
        pool["accelerator"] = {
            "resourceName": "nvidia.com/gpu",
            "perReplica": 4,
            "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists"}],
        }
        pool["template"] = {"schedulerName": SCHEDULER_NAME}
    pdd = parse_pddeployment(document)
    core, apps = client.CoreV1Api(api_client), client.AppsV1Api(api_client)
    node_rack = {
        n.metadata.name: n.metadata.labels[RACK]
        for n in core.list_node(label_selector=RACK).items
        if n.metadata.name in cluster.node_names
    }
    a0, _, b0, _ = sorted(node_rack)

    def create(role: str, replicas: int) -> None:
        manifest = build_deployment(pdd, role, pdd.spec.pools(role)[0], replicas)
        del manifest["metadata"]["ownerReferences"]  # no PDDeployment object: no GC owner
        apps.create_namespaced_deployment(namespace, manifest)

    def bound(role: str) -> list[client.V1Pod]:
        selector = f"{LABEL_DEPLOYMENT}={pdd.metadata.name},{LABEL_ROLE}={role}"
        return [
            p
            for p in core.list_namespaced_pod(namespace, label_selector=selector).items
            if p.spec.node_name and not p.metadata.deletion_timestamp
        ]

    # The first prefill pod goes to the fullest node: b0, which another workload half fills.
    core.create_namespaced_pod(namespace, blocker("blocker-b", b0))
    wait_for(lambda: running(core, namespace, "blocker-b"), what="the blocker in rack b")
    create("prefill", 1)
    (first,) = wait_for(lambda: bound("prefill"), what="the first prefill pod bound")
    assert node_rack[first.spec.node_name] == "b"
    # Now rack a's a0 is the fullest node with room; decode would go there unless placement
    # keeps it beside prefill.
    core.create_namespaced_pod(namespace, blocker("blocker-a", a0))
    wait_for(lambda: running(core, namespace, "blocker-a"), what="the blocker in rack a")
    create("decode", 2)
    pods_bound = wait_for(lambda: len(bound("decode")) == 2 and bound("decode"), what="decode")
    racks_used = {node_rack[p.spec.node_name] for p in [first, *pods_bound]}
    assert racks_used == ({"b"} if mode == "Required" else {"a", "b"})


def running(core: client.CoreV1Api, namespace: str, name: str) -> bool:
    return core.read_namespaced_pod(name, namespace).status.phase == "Running"
