"""The desired children of a PDDeployment: names, placement, resources, engines, labels, owners."""

import copy
import json
import re
from typing import Any

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from pd_operator.api import PDDeployment, parse_pddeployment
from pd_operator.core.children import (
    build_deployment,
    build_service,
    child_key,
    desired_children,
)
from pd_operator.core.drain import drain_command
from pd_operator.core.engine_args import engine_command, engine_env
from pd_operator.core.naming import deployment_name, service_name
from pd_operator.core.router import router_children
from pdcases import ROOT, SAMPLES, load_sample, minimal

DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
DNS_1035_LABEL = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
OUR_LABELS = {
    "pdoperator.io/deployment",
    "pdoperator.io/role",
    "app.kubernetes.io/name",
    "app.kubernetes.io/instance",
    "app.kubernetes.io/component",
    "app.kubernetes.io/managed-by",
    "app.kubernetes.io/part-of",
}
HETERO = "heterogeneous-s5000-h200.yaml"
BASELINE = "homogeneous-h200-2p2d.yaml"
SPILLOVER = "multipool-spillover.yaml"


def with_identity(document: dict[str, Any]) -> PDDeployment:
    document = copy.deepcopy(document)
    document["metadata"].update(namespace="inference", uid="0b6f-uid")
    return parse_pddeployment(document)


def sample(name: str) -> PDDeployment:
    return with_identity(load_sample(ROOT / "config" / "samples" / name))


def custom(**spec_changes: Any) -> PDDeployment:
    """The minimal document with top-level spec fields replaced."""
    document = minimal()
    document["spec"].update(spec_changes)
    return with_identity(document)


def deployments(children: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {c["metadata"]["name"]: c for c in children if c["kind"] == "Deployment"}


def services(children: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {c["metadata"]["name"]: c for c in children if c["kind"] == "Service"}


def pod_spec(deployment: dict[str, Any]) -> dict[str, Any]:
    return deployment["spec"]["template"]["spec"]


def engine(deployment: dict[str, Any]) -> dict[str, Any]:
    (container,) = pod_spec(deployment)["containers"]
    assert container["name"] == "engine"
    return container


def flag(argv: list[str], name: str) -> str | None:
    """The value after `name` in argv, or None when the flag is absent."""
    return argv[argv.index(name) + 1] if name in argv else None


def env_of(deployment: dict[str, Any]) -> dict[str, Any]:
    return {var["name"]: var for var in engine(deployment).get("env", [])}


# --- names and order ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "keys"),
    [
        (
            HETERO,
            [
                ("v1", "Service", "glm-hetero-prefill"),
                ("apps/v1", "Deployment", "glm-hetero-prefill-s5000"),
                ("policy/v1", "PodDisruptionBudget", "glm-hetero-prefill-s5000"),
                ("v1", "Service", "glm-hetero-decode"),
                ("apps/v1", "Deployment", "glm-hetero-decode-h200"),
                ("policy/v1", "PodDisruptionBudget", "glm-hetero-decode-h200"),
            ],
        ),
        (
            SPILLOVER,
            [
                ("v1", "Service", "glm-spillover-prefill"),
                ("apps/v1", "Deployment", "glm-spillover-prefill-s5000"),
                ("policy/v1", "PodDisruptionBudget", "glm-spillover-prefill-s5000"),
                ("apps/v1", "Deployment", "glm-spillover-prefill-h200-overflow"),
                ("policy/v1", "PodDisruptionBudget", "glm-spillover-prefill-h200-overflow"),
                ("v1", "Service", "glm-spillover-decode"),
                ("apps/v1", "Deployment", "glm-spillover-decode-h200"),
                ("policy/v1", "PodDisruptionBudget", "glm-spillover-decode-h200"),
            ],
        ),
    ],
)
def test_children_have_deterministic_names_in_a_stable_order(name, keys):
    pdd = sample(name)
    assert [child_key(c) for c in desired_children(pdd, {})] == keys
    assert desired_children(pdd, {}) == desired_children(pdd, {})


def test_same_pool_name_in_both_roles_gets_two_deployments():
    children = desired_children(sample(BASELINE), {})
    assert set(deployments(children)) == {"glm-h200-2p2d-prefill-h200", "glm-h200-2p2d-decode-h200"}


def test_long_names_are_cut_to_63_with_a_stable_hash_of_the_full_name():
    pdd_name, pool = "a" * 63, "p" * 32
    name = deployment_name(pdd_name, "prefill", pool)
    assert len(name) == 63
    assert DNS_LABEL.match(name)
    assert re.fullmatch(r"a{54}-[0-9a-f]{8}", name)
    assert name == deployment_name(pdd_name, "prefill", pool)
    # Pools that differ only past the cut still get different Deployments.
    assert deployment_name(pdd_name, "prefill", "p" * 31 + "q") != name
    assert deployment_name(pdd_name, "decode", pool) != name


def test_names_that_fit_are_not_hashed():
    assert deployment_name("x" * 40, "decode", "y" * 15) == "x" * 40 + "-decode-" + "y" * 15


def test_service_names_start_with_a_letter_even_when_the_pdd_name_does_not():
    assert service_name("glm", "prefill") == "glm-prefill"
    assert service_name("4p2d", "decode") == "pd-4p2d-decode"
    assert DNS_1035_LABEL.match(service_name("9" * 63, "prefill"))


# --- placement and resources -------------------------------------------------------------------


@pytest.mark.parametrize("path", SAMPLES, ids=lambda p: p.name)
def test_pods_land_on_their_pools_accelerator_nodes(path):
    document = load_sample(path)
    children = deployments(desired_children(with_identity(document), {}))
    for role in ("prefill", "decode"):
        for pool in document["spec"][role]["pools"]:
            name = f"{document['metadata']['name']}-{role}-{pool['name']}"
            spec = pod_spec(children[name])
            accelerator = pool["accelerator"]
            assert spec["nodeSelector"] == accelerator["nodeSelector"]
            assert spec.get("tolerations", []) == accelerator.get("tolerations", [])
            cards = {accelerator["resourceName"]: str(accelerator["perReplica"])}
            assert engine(children[name])["resources"] == {"requests": cards, "limits": cards}


def test_tolerations_use_core_v1_fields_and_omit_unset_ones():
    pool = {
        "name": "p",
        "accelerator": {
            "resourceName": "mthreads.com/gpu",
            "tolerations": [
                {"key": "mthreads.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
                {
                    "key": "maintenance",
                    "value": "soon",
                    "effect": "NoExecute",
                    "tolerationSeconds": 300,
                },
            ],
        },
    }
    pdd = custom(prefill={"pools": [pool]})
    tolerations = pod_spec(deployments(desired_children(pdd, {}))["minimal-prefill-p"])[
        "tolerations"
    ]
    assert tolerations == [
        {"key": "mthreads.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
        {
            "key": "maintenance",
            "operator": "Equal",
            "value": "soon",
            "effect": "NoExecute",
            "tolerationSeconds": 300,
        },
    ]


def test_pool_without_node_selector_or_tolerations_sends_neither():
    spec = pod_spec(deployments(desired_children(custom(), {}))["minimal-decode-d"])
    assert "nodeSelector" not in spec
    assert "tolerations" not in spec


def test_template_cpu_and_memory_join_the_accelerator_which_stays_requests_equal_limits():
    pool = {
        "name": "p",
        "accelerator": {"resourceName": "nvidia.com/gpu", "perReplica": 4},
        "template": {
            "resources": {
                "requests": {"cpu": "32", "memory": "512Gi"},
                "limits": {"memory": "768Gi"},
            }
        },
    }
    pdd = custom(decode={"pools": [pool]})
    resources = engine(deployments(desired_children(pdd, {}))["minimal-decode-p"])["resources"]
    assert resources == {
        "requests": {"cpu": "32", "memory": "512Gi", "nvidia.com/gpu": "4"},
        "limits": {"memory": "768Gi", "nvidia.com/gpu": "4"},
    }


# --- replicas and rollout ----------------------------------------------------------------------


def test_replicas_come_from_the_mapping_and_default_to_the_pool_minimum():
    pdd = sample(SPILLOVER)
    children = deployments(desired_children(pdd, {("prefill", "s5000"): 3, ("decode", "gone"): 7}))
    assert children["glm-spillover-prefill-s5000"]["spec"]["replicas"] == 3
    assert children["glm-spillover-prefill-h200-overflow"]["spec"]["replicas"] == 0
    assert children["glm-spillover-decode-h200"]["spec"]["replicas"] == 1
    assert len(children) == 3  # a key for a pool no longer in the spec creates nothing


def test_negative_replicas_are_refused():
    pdd = sample(HETERO)
    with pytest.raises(ValueError, match="s5000"):
        desired_children(pdd, {("prefill", "s5000"): -1})


def test_rollouts_never_surge_past_the_pools_cards():
    for deployment in deployments(desired_children(sample(HETERO), {})).values():
        assert deployment["spec"]["strategy"] == {
            "type": "RollingUpdate",
            "rollingUpdate": {"maxSurge": 0, "maxUnavailable": 1},
        }


def test_a_removed_replica_finishes_what_it_runs_before_its_engine_is_stopped():
    pdd = sample(SPILLOVER)
    for deployment in deployments(desired_children(pdd, {})).values():
        role = deployment["metadata"]["labels"]["pdoperator.io/role"]
        # The kubelet sends SIGTERM when the hook returns: once idle, 60 s at most (test_drain.py).
        hook = engine(deployment)["lifecycle"]["preStop"]["exec"]["command"]
        assert hook == drain_command("SGLang", role, 60)
        assert hook[3] == "http://127.0.0.1:30000/metrics"  # the engine's own port
        # ...and kills it only after the drain and the engine's own shutdown.
        assert pod_spec(deployment)["terminationGracePeriodSeconds"] == 60 + 30


def test_drain_seconds_sizes_the_wait_and_zero_leaves_kubernetes_defaults():
    longer = deployments(desired_children(custom(termination={"drainSeconds": 600}), {}))
    for deployment in longer.values():
        assert engine(deployment)["lifecycle"]["preStop"]["exec"]["command"][-1] == "600"
        assert pod_spec(deployment)["terminationGracePeriodSeconds"] == 630
    # 0: no hook, and the grace period Kubernetes gives a pod that sets none (30 s), so pools
    # made before drains existed are not rolled out for them.
    off = deployments(desired_children(custom(termination={"drainSeconds": 0}), {}))
    for deployment in off.values():
        assert "lifecycle" not in engine(deployment)
        assert pod_spec(deployment)["terminationGracePeriodSeconds"] == 30


# --- probes, ports and metrics -----------------------------------------------------------------


@pytest.mark.parametrize(("name", "port"), [(HETERO, 8000), (SPILLOVER, 30000)])
def test_engine_port_probes_and_prometheus_discovery(name, port):
    for deployment in deployments(desired_children(sample(name), {})).values():
        container = engine(deployment)
        assert container["ports"] == [{"name": "http", "containerPort": port, "protocol": "TCP"}]
        assert flag(container["command"], "--port") == str(port)
        for probe in ("readinessProbe", "startupProbe"):
            assert container[probe]["httpGet"] == {"path": "/health", "port": "http"}
        startup = container["startupProbe"]
        assert startup["periodSeconds"] * startup["failureThreshold"] >= 30 * 60
        assert deployment["spec"]["progressDeadlineSeconds"] > (
            startup["periodSeconds"] * startup["failureThreshold"]
        )
        annotations = dict(deployment["spec"]["template"]["metadata"]["annotations"])
        # SGLang prefill pods also name their KV bootstrap port for sglang-router.
        annotations.pop("sglang.ai/bootstrap-port", None)
        assert annotations == {
            "prometheus.io/scrape": "true",
            "prometheus.io/port": str(port),
            "prometheus.io/path": "/metrics",
        }


def test_engines_get_a_memory_backed_dev_shm():
    spec = pod_spec(deployments(desired_children(sample(HETERO), {}))["glm-hetero-decode-h200"])
    shm = {"name": "pd-shm", "emptyDir": {"medium": "Memory", "sizeLimit": "16Gi"}}
    assert shm in spec["volumes"]
    assert {"name": "pd-shm", "mountPath": "/dev/shm"} in spec["containers"][0]["volumeMounts"]
    assert spec["enableServiceLinks"] is False


# --- labels, owners, and what is never copied --------------------------------------------------


def test_every_child_and_pod_carries_our_labels_and_nothing_of_the_parents():
    document = load_sample(ROOT / "config" / "samples" / SPILLOVER)
    document["metadata"]["labels"] = {"argocd.argoproj.io/instance": "prod", "team": "llm"}
    document["metadata"]["annotations"] = {"kubectl.kubernetes.io/last-applied-configuration": "{}"}
    children = desired_children(with_identity(document), {})
    for child in children:
        labels = child["metadata"]["labels"]
        assert set(labels) >= OUR_LABELS
        assert labels["app.kubernetes.io/managed-by"] == "pd-operator"
        assert labels["pdoperator.io/deployment"] == "glm-spillover"
        assert labels["app.kubernetes.io/component"] == labels["pdoperator.io/role"]
        assert "annotations" not in child["metadata"]
        assert not {"argocd.argoproj.io/instance", "team"} & set(labels)
    for deployment in deployments(children).values():
        pool = deployment["metadata"]["labels"]["pdoperator.io/pool"]
        pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
        assert pod_labels["pdoperator.io/pool"] == pool
        assert deployment["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
        assert not {"argocd.argoproj.io/instance", "team"} & set(pod_labels)
    for service in services(children).values():
        assert "pdoperator.io/pool" not in service["metadata"]["labels"]


def test_children_are_controlled_by_the_pddeployment():
    for child in desired_children(sample(HETERO), {}):
        assert child["metadata"]["namespace"] == "inference"
        assert child["metadata"]["ownerReferences"] == [
            {
                "apiVersion": "pdoperator.io/v1alpha1",
                "kind": "PDDeployment",
                "name": "glm-hetero",
                "uid": "0b6f-uid",
                "controller": True,
                "blockOwnerDeletion": True,
            }
        ]


def test_a_pddeployment_without_uid_cannot_own_children():
    pdd = parse_pddeployment(minimal())
    with pytest.raises(ValueError, match="uid"):
        desired_children(pdd, {})


# --- template overrides ------------------------------------------------------------------------

OVERRIDDEN_POOL = {
    "name": "s5000",
    "accelerator": {"resourceName": "mthreads.com/gpu", "perReplica": 8},
    "template": {
        "image": "registry.example/vllm-musa:1",
        "labels": {"pdoperator.io/role": "decode", "cost-centre": "ai"},
        "annotations": {"example.com/owner": "llm-team", "prometheus.io/scrape": "false"},
        "env": [{"name": "UCX_TLS", "value": "rc"}, {"name": "HF_HOME", "value": "/models"}],
        "schedulerName": "pd-mock-scheduler",
        "serviceAccountName": "engine",
        "priorityClassName": "inference-high",
        "volumes": [
            {"name": "models", "persistentVolumeClaim": {"claimName": "models"}},
            {"name": "big-shm", "emptyDir": {"medium": "Memory", "sizeLimit": "64Gi"}},
        ],
        "volumeMounts": [
            {"name": "models", "mountPath": "/models"},
            {"name": "big-shm", "mountPath": "/dev/shm"},
        ],
        "imagePullSecrets": ["registry-creds"],
        "affinity": {
            "podAntiAffinity": {
                "preferredDuringSchedulingIgnoredDuringExecution": [
                    {
                        "weight": 100,
                        "podAffinityTerm": {
                            "topologyKey": "kubernetes.io/hostname",
                            "labelSelector": {"matchLabels": {"cost-centre": "ai"}},
                        },
                    }
                ]
            }
        },
        "topologySpreadConstraints": [
            {
                "maxSkew": 1,
                "topologyKey": "topology.kubernetes.io/zone",
                "whenUnsatisfiable": "DoNotSchedule",
            },
            {
                "maxSkew": 2,
                "topologyKey": "kubernetes.io/hostname",
                "whenUnsatisfiable": "ScheduleAnyway",
                "labelSelector": {"matchLabels": {"cost-centre": "ai"}},
            },
        ],
    },
}


def overridden() -> dict[str, Any]:
    pdd = custom(
        prefill={"pools": [OVERRIDDEN_POOL]},
        kvTransfer={"connector": "NIXL", "protocol": "TCP"},
    )
    return deployments(desired_children(pdd, {}))["minimal-prefill-s5000"]


def test_template_overrides_reach_the_pod():
    deployment = overridden()
    pod = deployment["spec"]["template"]
    spec = pod_spec(deployment)
    assert engine(deployment)["image"] == "registry.example/vllm-musa:1"
    assert spec["schedulerName"] == "pd-mock-scheduler"
    assert spec["serviceAccountName"] == "engine"
    assert spec["priorityClassName"] == "inference-high"
    assert pod["metadata"]["labels"]["cost-centre"] == "ai"
    assert pod["metadata"]["annotations"]["example.com/owner"] == "llm-team"
    assert spec["imagePullSecrets"] == [{"name": "registry-creds"}]
    assert spec["affinity"] == OVERRIDDEN_POOL["template"]["affinity"]
    # A constraint without a selector spreads the pool's own pods; one with keeps its own.
    zone, host = spec["topologySpreadConstraints"]
    assert zone["labelSelector"] == {"matchLabels": deployment["spec"]["selector"]["matchLabels"]}
    assert zone["topologyKey"] == "topology.kubernetes.io/zone" and zone["maxSkew"] == 1
    assert host["labelSelector"] == {"matchLabels": {"cost-centre": "ai"}}


def test_our_labels_and_scrape_annotations_win_over_the_template():
    pod = overridden()["spec"]["template"]["metadata"]
    assert pod["labels"]["pdoperator.io/role"] == "prefill"
    assert pod["annotations"]["prometheus.io/scrape"] == "true"


def test_template_env_and_mounts_replace_ours_by_key_without_duplicates():
    deployment = overridden()
    env = engine(deployment)["env"]
    assert [var["name"] for var in env].count("UCX_TLS") == 1
    assert env_of(deployment)["UCX_TLS"] == {"name": "UCX_TLS", "value": "rc"}
    assert env_of(deployment)["HF_HOME"] == {"name": "HF_HOME", "value": "/models"}
    spec = pod_spec(deployment)
    assert [v["name"] for v in spec["volumes"]] == ["models", "big-shm"]
    assert [m["mountPath"] for m in engine(deployment)["volumeMounts"]] == ["/models", "/dev/shm"]


def test_image_falls_back_to_the_model_image():
    children = deployments(desired_children(sample(HETERO), {}))
    images = {name: engine(d)["image"] for name, d in children.items()}
    assert images == {
        "glm-hetero-prefill-s5000": "registry.mthreads.com/mcconline/vllm-musa:v0.11.0",
        "glm-hetero-decode-h200": "vllm/vllm-openai:v0.11.0",
    }


def test_builders_do_not_mutate_or_alias_the_spec():
    pdd = custom(prefill={"pools": [OVERRIDDEN_POOL]})
    before = pdd.model_dump()
    children = desired_children(pdd, {})
    for child in children:
        for volume in child["spec"].get("template", {}).get("spec", {}).get("volumes", []):
            volume["name"] = "changed"
    assert pdd.model_dump() == before


# --- Pod Security ------------------------------------------------------------------------------


def pool_pod(template: dict[str, Any] | None = None) -> dict[str, Any]:
    pool: dict[str, Any] = {"name": "p", "accelerator": {"resourceName": "nvidia.com/gpu"}}
    if template is not None:
        pool["template"] = template
    return pod_spec(
        deployments(desired_children(custom(prefill={"pools": [pool]}), {}))["minimal-prefill-p"]
    )


def test_pool_pods_pass_pod_security_baseline_and_all_of_restricted_but_the_user():
    pod = pool_pod()
    (container,) = pod["containers"]
    assert pod["securityContext"] == {"seccompProfile": {"type": "RuntimeDefault"}}
    assert container["securityContext"] == {
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
    }
    # Engines never call the Kubernetes API.
    assert pod["automountServiceAccountToken"] is False
    # Most engine images run as root: runAsNonRoot is the user's to set.
    assert "runAsNonRoot" not in json.dumps(pod)
    assert "privileged" not in json.dumps(pod) and "hostPath" not in json.dumps(pod)


def test_a_privileged_container_drops_our_no_escalation_which_the_apiserver_refuses_beside_it():
    pod = pool_pod({"containerSecurityContext": {"privileged": True}})
    context = pod["containers"][0]["securityContext"]
    assert context["privileged"] is True and "allowPrivilegeEscalation" not in context
    assert context["capabilities"] == {"drop": ["ALL"]}


def test_template_security_contexts_merge_over_ours_key_by_key():
    pod = pool_pod(
        {
            "securityContext": {"runAsNonRoot": True, "runAsUser": 1000, "fsGroup": 1000},
            "containerSecurityContext": {
                "capabilities": {"add": ["IPC_LOCK"]},
                "readOnlyRootFilesystem": True,
                "allowPrivilegeEscalation": None,  # a null takes ours away
            },
        }
    )
    assert pod["securityContext"] == {
        "seccompProfile": {"type": "RuntimeDefault"},
        "runAsNonRoot": True,
        "runAsUser": 1000,
        "fsGroup": 1000,
    }
    assert pod["containers"][0]["securityContext"] == {
        "capabilities": {"drop": ["ALL"], "add": ["IPC_LOCK"]},
        "readOnlyRootFilesystem": True,
    }
    localhost = {"type": "Localhost", "localhostProfile": "profiles/engine.json"}
    pod = pool_pod(
        {
            "securityContext": {"seccompProfile": localhost},
            "containerSecurityContext": {"capabilities": {"drop": ["NET_RAW"]}},
        }
    )
    assert pod["securityContext"] == {"seccompProfile": localhost}
    assert pod["containers"][0]["securityContext"]["capabilities"] == {"drop": ["NET_RAW"]}


def test_a_pool_may_mount_its_service_account_token():
    assert pool_pod({"automountServiceAccountToken": True})["automountServiceAccountToken"] is True
    assert pool_pod({})["automountServiceAccountToken"] is False


def test_dev_shm_is_bounded_by_the_template_unless_the_user_mounts_their_own():
    (shm,) = pool_pod({"shmSize": "64Gi"})["volumes"]
    assert shm == {"name": "pd-shm", "emptyDir": {"medium": "Memory", "sizeLimit": "64Gi"}}
    (shm,) = pool_pod()["volumes"]
    assert shm["emptyDir"]["sizeLimit"] == "16Gi"
    own = pool_pod(
        {
            "shmSize": "1Gi",
            "volumes": [{"name": "big-shm", "emptyDir": {"medium": "Memory"}}],
            "volumeMounts": [{"name": "big-shm", "mountPath": "/dev/shm"}],
        }
    )
    assert own["volumes"] == [{"name": "big-shm", "emptyDir": {"medium": "Memory"}}]


# --- engine command lines ----------------------------------------------------------------------


def test_vllm_prefill_command_line_of_the_heterogeneous_sample():
    pdd = sample(HETERO)
    argv = engine(deployments(desired_children(pdd, {}))["glm-hetero-prefill-s5000"])["command"]
    assert argv == [
        "vllm",
        "serve",
        "zai-org/GLM-4.6-FP8",
        "--port",
        "8000",
        "--tensor-parallel-size",
        "8",
        "--max-model-len",
        "65536",
        "--kv-cache-dtype",
        "fp8",
        "--kv-transfer-config",
        '{"kv_connector":"MooncakeConnector",'
        '"kv_connector_extra_config":{"mooncake_protocol":"rdma"},"kv_role":"kv_producer"}',
    ]


def test_sglang_decode_command_line_of_the_spillover_sample():
    pdd = sample(SPILLOVER)
    argv = engine(deployments(desired_children(pdd, {}))["glm-spillover-decode-h200"])["command"]
    assert argv == [
        "python3",
        "-m",
        "sglang.launch_server",
        "--model-path",
        "zai-org/GLM-4.6-FP8",
        "--host",
        "0.0.0.0",
        "--port",
        "30000",
        "--tp-size",
        "8",
        "--enable-metrics",
        "--context-length",
        "65536",
        "--kv-cache-dtype",
        "fp8_e4m3",
        "--disaggregation-mode",
        "decode",
        "--disaggregation-transfer-backend",
        "mooncake",
    ]


VLLM_CONNECTOR = {"Mooncake": "MooncakeConnector", "NIXL": "NixlConnector"}
KV_ROLE = {"prefill": "kv_producer", "decode": "kv_consumer"}


@pytest.mark.parametrize("role", ["prefill", "decode"])
@pytest.mark.parametrize(
    ("dtype", "vllm_dtype", "sglang_dtype"),
    [("FP8", "fp8", "fp8_e4m3"), ("BF16", None, None), ("Auto", None, None)],
)
@pytest.mark.parametrize("connector", ["Mooncake", "NIXL", "None"])
@pytest.mark.parametrize("engine_name", ["VLLM", "SGLang"])
def test_engine_flags_for_every_engine_connector_and_cache_dtype(
    engine_name, connector, dtype, vllm_dtype, sglang_dtype, role
):
    pdd = custom(
        model={"name": "m", "image": "img:1", "engine": engine_name},
        kvTransfer={"connector": connector, "cacheDtype": dtype},
    )
    pool = pdd.spec.pools(role)[0]
    argv = engine_command(pdd.spec, role, pool)
    assert flag(argv, "--max-model-len") is None
    assert flag(argv, "--context-length") is None
    if engine_name == "VLLM":
        assert argv[:3] == ["vllm", "serve", "m"]
        assert flag(argv, "--tensor-parallel-size") == "1"
        assert flag(argv, "--kv-cache-dtype") == vllm_dtype
        config = flag(argv, "--kv-transfer-config")
        if connector == "None":
            assert config is None
        else:
            assert config is not None
            parsed = json.loads(config)
            assert parsed["kv_connector"] == VLLM_CONNECTOR[connector]
            assert parsed["kv_role"] == KV_ROLE[role]
        assert "--disaggregation-mode" not in argv
    else:
        assert argv[:5] == ["python3", "-m", "sglang.launch_server", "--model-path", "m"]
        assert flag(argv, "--tp-size") == "1"
        assert flag(argv, "--kv-cache-dtype") == sglang_dtype
        assert "--enable-metrics" in argv
        if connector == "None":
            assert "--disaggregation-mode" not in argv
            assert "--disaggregation-transfer-backend" not in argv
        else:
            assert flag(argv, "--disaggregation-mode") == role
            assert flag(argv, "--disaggregation-transfer-backend") == connector.lower()
        assert "--kv-transfer-config" not in argv


@pytest.mark.parametrize("engine_name", ["VLLM", "SGLang"])
def test_context_length_tensor_parallel_and_user_args_last(engine_name):
    pool = {"name": "p", "accelerator": {"resourceName": "mthreads.com/gpu", "perReplica": 4}}
    pdd = custom(
        model={
            "name": "m",
            "image": "img:1",
            "engine": engine_name,
            "contextLength": 131072,
            "args": ["--trust-remote-code", "--kv-cache-dtype", "bfloat16"],
        },
        prefill={"pools": [pool]},
    )
    argv = engine_command(pdd.spec, "prefill", pdd.spec.prefill.pools[0])
    context, tp = {
        "VLLM": ("--max-model-len", "--tensor-parallel-size"),
        "SGLang": ("--context-length", "--tp-size"),
    }[engine_name]
    assert flag(argv, context) == "131072"
    assert flag(argv, tp) == "4"
    assert argv[-3:] == ["--trust-remote-code", "--kv-cache-dtype", "bfloat16"]


@pytest.mark.parametrize(
    ("engine_name", "connector", "protocol", "env", "mooncake_protocol"),
    [
        ("VLLM", "Mooncake", "RDMA", {}, "rdma"),
        ("VLLM", "Mooncake", "TCP", {"MC_FORCE_TCP": "1"}, "tcp"),
        ("SGLang", "Mooncake", "RDMA", {}, None),
        ("SGLang", "Mooncake", "TCP", {"MC_FORCE_TCP": "1"}, None),
        ("SGLang", "NIXL", "RDMA", {}, None),
        ("SGLang", "NIXL", "TCP", {"UCX_TLS": "^ib"}, None),
        ("VLLM", "None", "TCP", {}, None),
        ("SGLang", "None", "TCP", {}, None),
    ],
)
def test_transport_protocol_reaches_the_engine(
    engine_name, connector, protocol, env, mooncake_protocol
):
    pdd = custom(
        model={"name": "m", "image": "img:1", "engine": engine_name},
        kvTransfer={"connector": connector, "protocol": protocol},
    )
    assert {var["name"]: var["value"] for var in engine_env(pdd.spec)} == env
    for deployment in deployments(desired_children(pdd, {})).values():
        assert {name: var["value"] for name, var in env_of(deployment).items()} == env
        config = flag(engine(deployment)["command"], "--kv-transfer-config")
        extra = json.loads(config).get("kv_connector_extra_config", {}) if config else {}
        assert extra.get("mooncake_protocol") == mooncake_protocol


@pytest.mark.parametrize(("protocol", "ucx"), [("RDMA", None), ("TCP", "^ib")])
def test_vllm_nixl_advertises_the_pod_ip_for_its_handshake(protocol, ucx):
    pdd = custom(kvTransfer={"connector": "NIXL", "protocol": protocol})
    for deployment in deployments(desired_children(pdd, {})).values():
        env = env_of(deployment)
        assert env["VLLM_NIXL_SIDE_CHANNEL_HOST"] == {
            "name": "VLLM_NIXL_SIDE_CHANNEL_HOST",
            "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}},
        }
        assert env.get("UCX_TLS", {}).get("value") == ucx


# --- services ----------------------------------------------------------------------------------


@pytest.mark.parametrize(("name", "port"), [(HETERO, 8000), (SPILLOVER, 30000)])
def test_one_service_per_role_selects_every_pool_of_that_role_only(name, port):
    pdd = sample(name)
    children = desired_children(pdd, {})
    for role in ("prefill", "decode"):
        service = build_service(pdd, role)
        assert service == services(children)[f"{pdd.metadata.name}-{role}"]
        assert service["spec"]["type"] == "ClusterIP"
        assert "clusterIP" not in service["spec"]
        assert service["spec"]["ports"] == [
            {"name": "http", "port": port, "targetPort": "http", "protocol": "TCP"},
            {"name": "metrics", "port": 9090, "targetPort": "http", "protocol": "TCP"},
        ]
        selector = service["spec"]["selector"].items()
        for deployment in deployments(children).values():
            pod_labels = deployment["spec"]["template"]["metadata"]["labels"].items()
            assert (selector <= pod_labels) == (
                deployment["metadata"]["labels"]["pdoperator.io/role"] == role
            )


def test_build_deployment_matches_the_listed_child():
    pdd = sample(SPILLOVER)
    pool = pdd.spec.prefill.pools[1]
    listed = deployments(desired_children(pdd, {("prefill", pool.name): 2}))
    assert (
        build_deployment(pdd, "prefill", pool, 2) == listed["glm-spillover-prefill-h200-overflow"]
    )


# --- disruption budgets ------------------------------------------------------------------------


def budgets(children: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {c["metadata"]["name"]: c for c in children if c["kind"] == "PodDisruptionBudget"}


def test_each_pool_gets_a_budget_over_exactly_its_own_pods():
    pdd = sample(SPILLOVER)
    children = desired_children(pdd, {})
    pods_of = {
        name: deployment["spec"]["template"]["metadata"]["labels"].items()
        for name, deployment in deployments(children).items()
    }
    assert set(budgets(children)) == set(pods_of)
    for name, budget in budgets(children).items():
        assert budget["spec"]["maxUnavailable"] == 1
        # A replica loading its model serves nothing: it never holds a node drain up.
        assert budget["spec"]["unhealthyPodEvictionPolicy"] == "AlwaysAllow"
        selector = budget["spec"]["selector"]["matchLabels"].items()
        selected = {other for other, labels in pods_of.items() if selector <= labels}
        assert selected == {name}
        assert budget["metadata"]["labels"] == deployments(children)[name]["metadata"]["labels"]


def test_budget_size_and_switch_come_from_the_spec():
    sized = desired_children(custom(disruptionBudget={"maxUnavailable": 3}), {})
    assert {b["spec"]["maxUnavailable"] for b in budgets(sized).values()} == {3}
    off = desired_children(custom(disruptionBudget={"enabled": False}), {})
    assert budgets(off) == {}
    assert len(deployments(off)) == len(deployments(sized))


def test_a_budget_of_zero_is_refused_with_the_field_named():
    with pytest.raises(ValueError, match="maxUnavailable"):
        custom(disruptionBudget={"maxUnavailable": 0})


# --- properties --------------------------------------------------------------------------------

PDD_NAMES = st.from_regex(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?", fullmatch=True)
POOL_NAMES = st.from_regex(r"[a-z0-9]([-a-z0-9]{0,30}[a-z0-9])?", fullmatch=True)
POOL_LISTS = st.lists(POOL_NAMES, min_size=1, max_size=8, unique=True)


def pools(names: list[str]) -> dict[str, Any]:
    return {"pools": [{"name": n, "accelerator": {"resourceName": "x.io/gpu"}} for n in names]}


@given(pdd_name=PDD_NAMES, prefill=POOL_LISTS, decode=POOL_LISTS)
def test_child_names_are_valid_and_unique_for_any_admitted_names(pdd_name, prefill, decode):
    document = minimal()
    document["metadata"]["name"] = pdd_name
    document["spec"].update(prefill=pools(prefill), decode=pools(decode))
    children = desired_children(with_identity(document), {})
    names = [child["metadata"]["name"] for child in children]
    # A Service per role; per pool a Deployment and its PodDisruptionBudget.
    assert len(children) == 2 + 2 * (len(prefill) + len(decode))
    assert all(len(name) <= 63 and DNS_LABEL.match(name) for name in names), names
    keys = [(child["kind"], child["metadata"]["name"]) for child in children]
    assert len(set(keys)) == len(keys)  # names are unique per kind
    assert all(DNS_1035_LABEL.match(name) for name in services(children))
    for child in children:
        assert all(len(value) <= 63 for value in child["metadata"]["labels"].values())


# Words that make '-'-joined names ambiguous, so that collisions are likely if any can happen.
NAME_WORDS = st.sampled_from(["a", "b", "1a", "pd", "prefill", "decode", "router", "x", "9"])


def _joined(words: list[str]) -> str:
    return "-".join(words)


CLASHY_PDD_NAMES = st.lists(NAME_WORDS, min_size=1, max_size=4).map(_joined)
CLASHY_POOL_LISTS = st.lists(
    st.lists(NAME_WORDS, min_size=1, max_size=3).map(_joined), min_size=1, max_size=3, unique=True
)


def every_child(pdd_name: str, prefill: list[str], decode: list[str]) -> set[tuple[str, str]]:
    """(kind, name) of every child, router included, of a PDDeployment in one namespace."""
    document = minimal()
    document["metadata"]["name"] = pdd_name
    document["spec"].update(prefill=pools(prefill), decode=pools(decode))
    pdd = with_identity(document)
    built = [*desired_children(pdd, {}), *router_children(pdd)]
    return {(child["kind"], child["metadata"]["name"]) for child in built}


@settings(max_examples=400)
@given(
    first=st.tuples(CLASHY_PDD_NAMES, CLASHY_POOL_LISTS, CLASHY_POOL_LISTS),
    second=st.tuples(CLASHY_PDD_NAMES, CLASHY_POOL_LISTS, CLASHY_POOL_LISTS),
)
def test_two_pddeployments_in_one_namespace_never_ask_for_one_child_name(first, second):
    assume(first[0] != second[0])
    shared = every_child(*first) & every_child(*second)
    assert not shared, f"{first} and {second} both want {sorted(shared)}"


@pytest.mark.parametrize(
    ("first", "second"),
    [
        # The issue's cases: each pair asked for the same Service or Deployment before.
        (("1a", ["p"], ["d"]), ("pd-1a", ["p"], ["d"])),
        (("a", ["prefill-x"], ["d"]), ("a-prefill", ["x"], ["d"])),
        (("a", ["p"], ["d"]), ("a-prefill", ["p"], ["d"])),
    ],
)
def test_names_that_read_two_ways_get_a_hash_and_never_clash(first, second):
    assert not every_child(*first) & every_child(*second)
    # The PDDeployment whose name reads one way keeps the readable names users know.
    assert ("Deployment", f"{first[0]}-prefill-{first[1][0]}") in every_child(*first)


def test_readable_names_are_kept_for_names_without_suffix_words():
    assert deployment_name("llama", "prefill", "s5000") == "llama-prefill-s5000"
    assert service_name("llama", "decode") == "llama-decode"
    assert deployment_name("pd-demo", "decode", "h200") == "pd-demo-decode-h200"
    hashed = deployment_name("llama-decode", "prefill", "s5000")
    assert hashed.startswith("llama-decode-prefill-s5000-") and len(hashed) == 35
