"""The KV fabric per pool: extra devices, IPC_LOCK, hostNetwork, the template patch, and the
Mooncake/NIXL settings the engines get (issue #31, item 4)."""

import copy
import json
from decimal import Decimal
from typing import Any

import pytest
from pydantic import ValidationError

from pd_operator.api import InvalidSpecError, PDDeployment, parse_pddeployment
from pd_operator.api.spec import KVTransferSpec, PoolSpec
from pd_operator.core.capacity import free_capacity, replica_request
from pd_operator.core.children import build_deployment
from pd_operator.core.engine_args import engine_command, engine_env
from pd_operator.core.observe import NodeSummary, PodSummary
from pd_operator.core.scheduling import NodeFacts, milli, pod_demand, schedule
from pd_operator.core.strategic_merge import strategic_merge
from pdcases import ROOT, load_sample, minimal

GPU = "nvidia.com/gpu"
HCA = "rdma/hca_shared_devices_a"


def document(pool_changes: dict[str, Any] | None = None, **spec_changes: Any) -> dict[str, Any]:
    """The minimal document, its decode pool changed (accelerator merged) and spec fields set."""
    doc = minimal()
    doc["metadata"].update(namespace="inference", uid="0b6f-uid")
    pool = doc["spec"]["decode"]["pools"][0]
    for key, value in (pool_changes or {}).items():
        pool[key] = {**pool.get(key, {}), **value} if key == "accelerator" else value
    doc["spec"].update(spec_changes)
    return doc


def pdd(pool_changes: dict[str, Any] | None = None, **spec_changes: Any) -> PDDeployment:
    return parse_pddeployment(document(pool_changes, **spec_changes))


def decode_deployment(deployment: PDDeployment) -> dict[str, Any]:
    return build_deployment(deployment, "decode", deployment.spec.decode.pools[0], 1)


def pod_spec(deployment: PDDeployment) -> dict[str, Any]:
    spec: dict[str, Any] = decode_deployment(deployment)["spec"]["template"]["spec"]
    return spec


def containers(deployment: PDDeployment) -> dict[str, dict[str, Any]]:
    return {c["name"]: c for c in pod_spec(deployment)["containers"]}


FABRIC = {
    "accelerator": {"perReplica": 8, "devices": {HCA: 1}},
    "template": {"ipcLock": True, "hostNetwork": True},
}

# --- the strategic merge ---------------------------------------------------------------------


def test_containers_env_and_volumes_merge_by_name_and_other_lists_are_replaced():
    ours = {
        "metadata": {"labels": {"a": "1"}, "annotations": {"x": "1"}},
        "spec": {
            "containers": [
                {
                    "name": "engine",
                    "image": "img:1",
                    "env": [{"name": "A", "value": "1"}, {"name": "B", "value": "2"}],
                    "volumeMounts": [{"name": "shm", "mountPath": "/dev/shm"}],
                }
            ],
            "volumes": [{"name": "shm", "emptyDir": {"medium": "Memory"}}],
            "tolerations": [{"key": "gpu", "operator": "Exists"}],
        },
    }
    before = copy.deepcopy(ours)
    patch = {
        "metadata": {"annotations": {"y": "2"}},
        "spec": {
            "containers": [
                {
                    "name": "engine",
                    "env": [{"name": "B", "value": "3"}, {"name": "C", "value": "4"}],
                },
                {"name": "sidecar", "image": "side:1"},
            ],
            # retainKeys: the patched volume's source replaces ours instead of joining it.
            "volumes": [{"name": "shm", "hostPath": {"path": "/dev/shm"}}],
            "tolerations": [{"key": "rdma", "operator": "Exists"}],
            "dnsConfig": {"options": [{"name": "ndots", "value": "2"}]},
        },
    }
    merged = strategic_merge(ours, patch)
    assert ours == before  # neither input is changed
    engine, sidecar = merged["spec"]["containers"]
    assert engine["image"] == "img:1"
    assert engine["env"] == [
        {"name": "A", "value": "1"},
        {"name": "B", "value": "3"},
        {"name": "C", "value": "4"},
    ]
    assert engine["volumeMounts"] == [{"name": "shm", "mountPath": "/dev/shm"}]
    assert sidecar == {"name": "sidecar", "image": "side:1"}
    assert merged["spec"]["volumes"] == [{"name": "shm", "hostPath": {"path": "/dev/shm"}}]
    assert merged["spec"]["tolerations"] == [{"key": "rdma", "operator": "Exists"}]
    assert merged["metadata"] == {"labels": {"a": "1"}, "annotations": {"x": "1", "y": "2"}}
    assert merged["spec"]["dnsConfig"] == {"options": [{"name": "ndots", "value": "2"}]}


def test_null_removes_a_key_and_a_new_entry_carries_no_nulls():
    ours = {"spec": {"enableServiceLinks": False, "containers": [{"name": "engine", "x": 1}]}}
    patch = {
        "spec": {
            "enableServiceLinks": None,
            "containers": [{"name": "engine", "x": None}, {"name": "new", "y": None, "z": 2}],
        }
    }
    assert strategic_merge(ours, patch) == {
        "spec": {"containers": [{"name": "engine"}, {"name": "new", "z": 2}]}
    }


def test_an_entry_without_its_merge_key_is_appended_for_the_apiserver_to_judge():
    merged = strategic_merge({"containers": [{"name": "engine"}]}, {"containers": [{"image": "x"}]})
    assert merged == {"containers": [{"name": "engine"}, {"image": "x"}]}


# --- the pool's pods -------------------------------------------------------------------------


def test_by_default_nothing_of_the_fabric_is_in_the_pod():
    pod = pod_spec(pdd())
    assert "hostNetwork" not in pod and "dnsPolicy" not in pod
    engine = containers(pdd())["engine"]
    assert engine["securityContext"] == {
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
    }
    assert set(engine["resources"]["limits"]) == {GPU}


def test_devices_are_requested_and_limited_beside_the_cards():
    engine = containers(pdd(FABRIC))["engine"]
    assert engine["resources"] == {
        "requests": {GPU: "8", HCA: "1"},
        "limits": {GPU: "8", HCA: "1"},
    }


def test_ipc_lock_is_the_one_capability_added_and_the_rest_of_the_hardening_stays():
    context = containers(pdd(FABRIC))["engine"]["securityContext"]
    assert context == {
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"], "add": ["IPC_LOCK"]},
    }
    # A template that adds capabilities of its own keeps IPC_LOCK too.
    mine = {"containerSecurityContext": {"capabilities": {"add": ["SYS_NICE"]}}, "ipcLock": True}
    context = containers(pdd({"template": mine}))["engine"]["securityContext"]
    assert context["capabilities"] == {"drop": ["ALL"], "add": ["SYS_NICE", "IPC_LOCK"]}


def test_host_network_resolves_cluster_names():
    pod = pod_spec(pdd(FABRIC))
    assert pod["hostNetwork"] is True
    assert pod["dnsPolicy"] == "ClusterFirstWithHostNet"


def test_the_patch_goes_over_the_built_template_and_keeps_what_the_operator_relies_on():
    patch = {
        "metadata": {"annotations": {"k8s.v1.cni.cncf.io/networks": "rdma-net"}},
        "spec": {
            "containers": [
                {
                    "name": "engine",
                    "env": [{"name": "NCCL_IB_HCA", "value": "mlx5_0"}],
                    "volumeMounts": [{"name": "infiniband", "mountPath": "/dev/infiniband"}],
                    "readinessProbe": {"timeoutSeconds": 10},
                },
                {"name": "exporter", "image": "rdma-exporter:1"},
            ],
            "volumes": [{"name": "infiniband", "hostPath": {"path": "/dev/infiniband"}}],
        },
    }
    plain = decode_deployment(pdd(FABRIC))
    built = decode_deployment(pdd({**FABRIC, "template": {**FABRIC["template"], "patch": patch}}))
    template = built["spec"]["template"]
    assert template["metadata"]["labels"] == plain["spec"]["template"]["metadata"]["labels"]
    assert template["metadata"]["annotations"]["k8s.v1.cni.cncf.io/networks"] == "rdma-net"
    engine, exporter = template["spec"]["containers"]
    assert engine["command"] == plain["spec"]["template"]["spec"]["containers"][0]["command"]
    assert {"name": "NCCL_IB_HCA", "value": "mlx5_0"} in engine["env"]
    assert [m["mountPath"] for m in engine["volumeMounts"]] == ["/dev/shm", "/dev/infiniband"]
    assert engine["readinessProbe"]["timeoutSeconds"] == 10
    assert engine["readinessProbe"]["httpGet"] == {"path": "/health", "port": "http"}
    assert exporter == {"name": "exporter", "image": "rdma-exporter:1"}
    assert [v["name"] for v in template["spec"]["volumes"]] == ["pd-shm", "infiniband"]
    assert built["spec"]["selector"] == plain["spec"]["selector"]


@pytest.mark.parametrize(
    ("patch", "words"),
    [
        (
            {"spec": {"containers": [{"name": "engine", "command": ["sh"]}]}},
            "containers[engine].command cannot be patched",
        ),
        (
            {"spec": {"containers": [{"name": "engine", "args": ["--x"]}]}},
            "add arguments with spec.model.args",
        ),
        (
            {"spec": {"containers": [{"name": "engine", "resources": {"limits": {HCA: "2"}}}]}},
            f"resources.limits.{HCA} cannot be patched",
        ),
        (
            {"spec": {"containers": [{"name": "engine", "resources": {"requests": {GPU: "1"}}}]}},
            f"resources.requests.{GPU} cannot be patched",
        ),
        (
            {"spec": {"containers": [{"name": "engine", "resources": None}]}},
            "resources cannot be removed",
        ),
        (
            {"metadata": {"labels": {"pdoperator.io/pool": "x"}}},
            "labels.pdoperator.io/pool cannot be patched",
        ),
        ({"metadata": {"labels": None}}, "labels cannot be removed"),
        ({"metadata": {"name": "x"}}, "only labels and annotations"),
        ({"containers": []}, "template.patch.containers: a patch of the pod template has only"),
        ({"spec": {"containers": None}}, "spec.containers must be a list"),
        ({"spec": {"hostNetwork": True}}, "set template.hostNetwork"),
        ({"spec": {"$patch": "replace"}}, "$patch: patch directives"),
        (
            {"spec": {"volumes": [{"name": "pd-shm", "$patch": "delete"}]}},
            "are not supported",
        ),
    ],
)
def test_a_patch_of_what_the_operator_relies_on_is_refused_naming_the_field_and_the_fix(
    patch, words
):
    doc = document({**FABRIC, "template": {"patch": patch}})
    with pytest.raises(InvalidSpecError) as error:
        parse_pddeployment(doc)
    assert words in str(error.value)


def test_a_device_named_like_the_cards_is_refused():
    with pytest.raises(ValidationError, match=r"must not name accelerator\.resourceName"):
        PoolSpec.model_validate(
            {"name": "p", "accelerator": {"resourceName": GPU, "devices": {GPU: 1}}}
        )


@pytest.mark.parametrize("name", ["hca", "requests.x/hca", "Rdma/hca", "rdma/"])
def test_a_device_must_be_an_extended_resource_name(name):
    with pytest.raises(ValidationError, match="extended resource"):
        PoolSpec.model_validate(
            {"name": "p", "accelerator": {"resourceName": GPU, "devices": {name: 1}}}
        )


def test_a_nixl_backend_needs_the_nixl_connector():
    with pytest.raises(ValidationError, match="applies only to connector NIXL"):
        KVTransferSpec.model_validate({"connector": "Mooncake", "nixlBackend": "LIBFABRIC"})


# --- capacity and the mock scheduler ---------------------------------------------------------


def fabric_pool() -> PoolSpec:
    return PoolSpec.model_validate(
        {"name": "p", "accelerator": {"resourceName": GPU, "perReplica": 4, "devices": {HCA: 1}}}
    )


def hca_node(name: str, hcas: int) -> NodeSummary:
    allocatable = {GPU: "8", "pods": "110"} | ({HCA: str(hcas)} if hcas else {})
    return NodeSummary(name=name, labels={}, taints=(), allocatable=allocatable, ready=True)


def test_a_replica_asks_for_its_devices():
    assert replica_request(fabric_pool())[HCA] == Decimal(1)


def test_a_node_without_a_free_hca_is_no_room():
    pool = fabric_pool()
    # 8 cards hold 2 replicas of 4; the HCAs decide: none, one (taken by another pod), two.
    taken = PodSummary("other", "", "", True, False, node_name="one", requests={HCA: "1"})
    capacity = free_capacity([hca_node("none", 0), hca_node("one", 2), hca_node("two", 2)], [taken])
    assert capacity.fits(pool) == 3
    assert capacity.take(pool, 3).fits(pool) == 0
    message = free_capacity([hca_node("none", 0)], []).shortage(pool, not_ready=1, unschedulable=0)
    assert message is not None and f"4 {GPU} and 1 {HCA} per replica" in message


def test_the_mock_scheduler_keeps_a_pod_off_a_node_without_a_free_hca():
    deployment = pdd({"accelerator": {"perReplica": 4, "devices": {HCA: 1}}})
    template = decode_deployment(deployment)["spec"]["template"]
    demand = pod_demand({"spec": template["spec"]})
    nodes = [
        NodeFacts("a", allocatable={GPU: milli(8), HCA: milli(1), "pods": milli(110)}),
        NodeFacts("b", allocatable={GPU: milli(8), "pods": milli(110)}),
    ]
    decisions = schedule([("p1", demand), ("p2", demand)], nodes, {})
    assert decisions[0].node == "a"
    assert decisions[1].node is None
    assert f"Insufficient {HCA}" in decisions[1].message


# --- the engines' settings -------------------------------------------------------------------

DEVICES = {"accelerator": {"rdmaDevices": ["mlx5_0", "mlx5_1"]}}


def flag(argv: list[str], name: str) -> str | None:
    return argv[argv.index(name) + 1] if name in argv else None


def kv_config(deployment: PDDeployment) -> dict[str, Any]:
    argv = engine_command(deployment.spec, "decode", deployment.spec.decode.pools[0])
    value = flag(argv, "--kv-transfer-config")
    assert value is not None
    config: dict[str, Any] = json.loads(value)
    return config


def test_vllm_mooncake_gets_the_pools_rdma_devices():
    assert kv_config(pdd(DEVICES))["kv_connector_extra_config"] == {
        "mooncake_protocol": "rdma",
        "device_name": "mlx5_0,mlx5_1",
    }
    # The prefill pool names none: Mooncake discovers every device there.
    deployment = pdd(DEVICES)
    prefill = deployment.spec.prefill.pools[0]
    argv = engine_command(deployment.spec, "prefill", prefill)
    assert "device_name" not in (flag(argv, "--kv-transfer-config") or "")


def test_over_tcp_the_devices_are_not_passed():
    tcp = {"connector": "Mooncake", "protocol": "TCP"}
    assert "device_name" not in kv_config(pdd(DEVICES, kvTransfer=tcp))["kv_connector_extra_config"]


def test_sglang_mooncake_gets_the_ib_devices():
    model = {"name": "m", "image": "img:1", "engine": "SGLang"}
    deployment = pdd(DEVICES, model=model)
    argv = engine_command(deployment.spec, "decode", deployment.spec.decode.pools[0])
    assert flag(argv, "--disaggregation-ib-device") == "mlx5_0,mlx5_1"
    assert flag(argv, "--disaggregation-transfer-backend") == "mooncake"


def test_nixl_gets_its_devices_through_ucx_and_its_backend():
    deployment = pdd(DEVICES, kvTransfer={"connector": "NIXL"})
    pool = deployment.spec.decode.pools[0]
    env = {var["name"]: var.get("value") for var in engine_env(deployment.spec, pool)}
    assert env["UCX_NET_DEVICES"] == "mlx5_0:1,mlx5_1:1"
    assert "kv_connector_extra_config" not in kv_config(deployment)

    efa = pdd(DEVICES, kvTransfer={"connector": "NIXL", "nixlBackend": "LIBFABRIC"})
    assert kv_config(efa)["kv_connector_extra_config"] == {"backends": ["LIBFABRIC"]}
    env = {var["name"] for var in engine_env(efa.spec, efa.spec.decode.pools[0])}
    assert "UCX_NET_DEVICES" not in env  # UCX is not the transport then

    model = {"name": "m", "image": "img:1", "engine": "SGLang"}
    sglang = pdd(kvTransfer={"connector": "NIXL", "nixlBackend": "LIBFABRIC"}, model=model)
    env_values = {var["name"]: var.get("value") for var in engine_env(sglang.spec)}
    assert env_values["SGLANG_DISAGGREGATION_NIXL_BACKEND"] == "LIBFABRIC"


def test_the_pools_env_carries_the_devices():
    deployment = pdd(DEVICES, kvTransfer={"connector": "NIXL"})
    env = {var["name"]: var.get("value") for var in containers(deployment)["engine"]["env"]}
    assert env["UCX_NET_DEVICES"] == "mlx5_0:1,mlx5_1:1"


def test_an_rdma_device_listed_twice_is_refused_as_the_apiserver_refuses_it():
    # The fuzz test found the models accepting what the CRD's list-type set refuses.
    body = load_sample(ROOT / "config" / "samples" / "heterogeneous-s5000-h200.yaml")
    body["spec"]["prefill"]["pools"][0]["accelerator"]["rdmaDevices"] = ["mlx5_0", "mlx5_0"]
    with pytest.raises(ValueError, match="duplicate rdmaDevices name"):
        parse_pddeployment(body)
