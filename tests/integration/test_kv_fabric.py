"""The KV fabric of a pool on the real apiserver: devices, IPC_LOCK, hostNetwork and a template
patch are accepted and carried by the pool's Deployment; a patch the apiserver refuses stalls
the PDDeployment with its words and leaves the running Deployment as it was."""

import copy
import time

from kubernetes import client

from kubetools import RunningOperator, condition, create_pdd, get_pdd, patch_pdd, wait_for, writes
from pdcases import ROOT, load_sample

HETERO = load_sample(ROOT / "config" / "samples" / "heterogeneous-s5000-h200.yaml")
HCA = "rdma/hca_shared_devices_a"
DECODE = "glm-hetero-decode-h200"
PATCH = {
    "metadata": {"annotations": {"k8s.v1.cni.cncf.io/networks": "rdma-net"}},
    "spec": {
        "containers": [
            {
                "name": "engine",
                "env": [{"name": "NCCL_IB_HCA", "value": "mlx5_0"}],
                "volumeMounts": [{"name": "infiniband", "mountPath": "/dev/infiniband"}],
            }
        ],
        "volumes": [{"name": "infiniband", "hostPath": {"path": "/dev/infiniband"}}],
    },
}


def decode_deployment(api_client, namespace):
    apps = client.AppsV1Api(api_client)
    items = apps.list_namespaced_deployment(namespace, label_selector="pdoperator.io/role=decode")
    return {d.metadata.name: d for d in items.items}.get(DECODE)


def settled_writes(running: RunningOperator, seconds: float = 3.0) -> float:
    wait_for(running.settled, what="the work queue to drain")
    before = writes()
    time.sleep(seconds)
    wait_for(running.settled, what="the work queue to drain")
    return writes() - before


def test_a_pool_with_devices_ipc_lock_host_network_and_a_patch_is_applied_and_converges(
    operator, api_client, namespace
):
    body = copy.deepcopy(HETERO)
    pool = body["spec"]["decode"]["pools"][0]
    pool["accelerator"].update(devices={HCA: 1}, rdmaDevices=["mlx5_0", "mlx5_1"])
    pool["template"] = {"ipcLock": True, "hostNetwork": True, "patch": PATCH}
    create_pdd(api_client, namespace, body)

    deployment = wait_for(lambda: decode_deployment(api_client, namespace), what="the decode pool")
    pod = deployment.spec.template.spec
    engine = pod.containers[0]
    assert engine.resources.requests[HCA] == engine.resources.limits[HCA] == "1"
    assert engine.security_context.capabilities.add == ["IPC_LOCK"]
    assert engine.security_context.capabilities.drop == ["ALL"]
    assert engine.security_context.allow_privilege_escalation is False
    assert pod.host_network is True and pod.dns_policy == "ClusterFirstWithHostNet"
    assert {"name": "NCCL_IB_HCA", "value": "mlx5_0"} in [
        {"name": e.name, "value": e.value} for e in engine.env
    ]
    assert [m.mount_path for m in engine.volume_mounts] == ["/dev/shm", "/dev/infiniband"]
    assert [v.name for v in pod.volumes] == ["pd-shm", "infiniband"]
    annotations = deployment.spec.template.metadata.annotations
    assert annotations["k8s.v1.cni.cncf.io/networks"] == "rdma-net"
    assert '"device_name":"mlx5_0,mlx5_1"' in " ".join(engine.command)

    # What the apiserver defaults in (hostPort under hostNetwork) is no drift: no steady writes.
    wait_for(
        lambda: get_pdd(api_client, namespace, "glm-hetero").get("status", {}).get("pools"),
        what="status",
    )
    wait_for(lambda: settled_writes(operator, seconds=2) == 0, timeout=60, what="no writes")


def test_a_patch_the_apiserver_refuses_stalls_with_its_words_and_keeps_what_runs(
    operator, api_client, namespace
):
    create_pdd(api_client, namespace, copy.deepcopy(HETERO))
    running = wait_for(lambda: decode_deployment(api_client, namespace), what="the decode pool")
    decode = get_pdd(api_client, namespace, "glm-hetero")["spec"]["decode"]
    # Schema-valid and accepted by the models; a Deployment's pods must restart Always.
    decode["pools"][0]["template"] = {"patch": {"spec": {"restartPolicy": "Never"}}}
    patch_pdd(api_client, namespace, "glm-hetero", {"spec": {"decode": decode}})

    obj = wait_for(
        lambda: (
            condition(o := get_pdd(api_client, namespace, "glm-hetero"), "Stalled").get("status")
            == "True"
            and o
        ),
        what="Stalled=True",
    )
    stalled = condition(obj, "Stalled")
    assert stalled["reason"] == "ApplyRejected"
    assert DECODE in stalled["message"] and "restartPolicy" in stalled["message"]
    kept = decode_deployment(api_client, namespace)
    assert kept.metadata.uid == running.metadata.uid
    assert kept.metadata.generation == running.metadata.generation
    assert kept.spec.template.spec.restart_policy == "Always"
