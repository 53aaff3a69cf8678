"""The operator against the real local control plane: children, status, lifecycle, writes."""

import copy
import json
import time
import uuid

import pytest
import yaml
from kubernetes import client, config
from kubernetes.client.rest import ApiException

from kubetools import (
    RunningOperator,
    condition,
    create_pdd,
    events,
    get_pdd,
    new_writes,
    patch_pdd,
    wait_for,
    writes,
    writes_by_kind,
)
from pd_operator.api import parse_pddeployment
from pd_operator.core.children import revision
from pd_operator.handlers.operator import OperatorConfig, OperatorState
from pdcases import ROOT, load_sample

HETERO = load_sample(ROOT / "config" / "samples" / "heterogeneous-s5000-h200.yaml")
SPILLOVER = load_sample(ROOT / "config" / "samples" / "multipool-spillover.yaml")


# The pools' children; the router's (tests/integration/test_serving.py) are left out.
POOLS = "pdoperator.io/role in (prefill,decode)"


def deployments(api_client, namespace, selector=POOLS):
    apps = client.AppsV1Api(api_client)
    items = apps.list_namespaced_deployment(namespace, label_selector=selector).items
    return {d.metadata.name: d for d in items}


def budgets(api_client, namespace, selector=POOLS):
    policy = client.PolicyV1Api(api_client)
    items = policy.list_namespaced_pod_disruption_budget(namespace, label_selector=selector).items
    return {b.metadata.name: b for b in items}


def converged(api_client, namespace, name, generation=1):
    """Status written for this generation, including the autoscaler's first record."""

    def check():
        obj = get_pdd(api_client, namespace, name)
        status = obj.get("status") or {}
        autoscaled = obj["spec"]["scaling"]["mode"] != "Disabled"
        return (
            obj
            if status.get("observedGeneration") == generation
            and status.get("pools")
            and (status.get("lastDecision") or not autoscaled)
            else None
        )

    return wait_for(check, what=f"status of {name} at generation {generation}")


def quiet(running: RunningOperator, seconds: float = 3.0) -> float:
    """Wait for the queue to drain, then count writes over `seconds` of resyncs."""
    wait_for(running.settled, what="the work queue to drain")
    before = writes()
    time.sleep(seconds)
    wait_for(running.settled, what="the work queue to drain")
    return writes() - before


def settle(running: RunningOperator) -> None:
    """Wait until the operator has written nothing for 2 s (pods appearing change status)."""
    wait_for(lambda: quiet(running, seconds=2) == 0, timeout=60, what="writes to stop")


def test_create_builds_placed_and_owned_children_and_reports_status(
    operator, api_client, namespace, cluster
):
    body = copy.deepcopy(HETERO)
    body["metadata"]["labels"] = {"team": "inference"}
    body["metadata"]["annotations"] = {"argocd.argoproj.io/tracking-id": "x"}
    decode_pool = body["spec"]["decode"]["pools"][0]
    decode_pool["template"] = {
        **decode_pool.get("template", {}),
        "imagePullSecrets": ["registry-creds"],
        "topologySpreadConstraints": [
            {
                "maxSkew": 1,
                "topologyKey": "kubernetes.io/hostname",
                "whenUnsatisfiable": "ScheduleAnyway",
            }
        ],
        "affinity": {
            "nodeAffinity": {
                "preferredDuringSchedulingIgnoredDuringExecution": [
                    {
                        "weight": 10,
                        "preference": {
                            "matchExpressions": [
                                {"key": "example.com/rack", "operator": "In", "values": ["a"]}
                            ]
                        },
                    }
                ]
            }
        },
    }
    created = create_pdd(api_client, namespace, body)

    found = wait_for(
        lambda: len(deployments(api_client, namespace)) == 2 and deployments(api_client, namespace),
        what="two Deployments",
    )
    prefill = found["glm-hetero-prefill-s5000"].to_dict()
    decode = found["glm-hetero-decode-h200"].to_dict()

    pod = prefill["spec"]["template"]["spec"]
    assert pod["node_selector"] == {"mthreads.com/gpu.product": "MTT-S5000"}
    assert pod["tolerations"][0]["key"] == "mthreads.com/gpu"
    engine = pod["containers"][0]
    assert engine["image"] == "registry.mthreads.com/mcconline/vllm-musa:v0.11.0"
    assert engine["resources"]["limits"]["mthreads.com/gpu"] == "8"
    command = " ".join(engine["command"] + (engine.get("args") or []))
    assert "vllm serve zai-org/GLM-4.6-FP8" in command and "kv_producer" in command
    # A replica being removed serves what it runs (60 s at most) before SIGTERM: the apiserver
    # takes the hook as valid.
    hook = engine["lifecycle"]["pre_stop"]["_exec"]["command"]
    assert hook[:2] == ["python3", "-c"] and hook[-1] == "60"
    assert pod["termination_grace_period_seconds"] == 90
    decode_pod = decode["spec"]["template"]["spec"]
    assert decode_pod["image_pull_secrets"] == [{"name": "registry-creds"}]
    (spread,) = decode_pod["topology_spread_constraints"]
    assert spread["label_selector"]["match_labels"] == decode["spec"]["selector"]["match_labels"]
    assert decode_pod["affinity"]["node_affinity"][
        "preferred_during_scheduling_ignored_during_execution"
    ]
    decode_engine = decode_pod["containers"][0]
    assert decode_engine["resources"]["limits"]["nvidia.com/gpu"] == "8"
    assert "kv_consumer" in " ".join(decode_engine["command"] + (decode_engine.get("args") or []))

    for child in (prefill, decode):
        labels = child["metadata"]["labels"]
        assert labels["pdoperator.io/deployment"] == "glm-hetero"
        assert "team" not in labels
        assert "argocd.argoproj.io/tracking-id" not in (child["metadata"]["annotations"] or {})
        (owner,) = child["metadata"]["owner_references"]
        assert owner["uid"] == created["metadata"]["uid"] and owner["controller"] is True
        assert child["spec"]["replicas"] == 1

    services = {
        s.metadata.name
        for s in client.CoreV1Api(api_client).list_namespaced_service(namespace).items
    }
    assert {"glm-hetero-prefill", "glm-hetero-decode"} <= services

    obj = converged(api_client, namespace, "glm-hetero")
    assert condition(obj, "Ready")["status"] == "False"  # no nodes: pods stay Pending
    assert condition(obj, "Reconciling")["status"] == "True"
    assert condition(obj, "Stalled")["status"] == "False"
    assert obj["status"]["replicaSummary"] == {"prefill": "0/1", "decode": "0/1"}
    assert {(p["role"], p["name"], p["desiredReplicas"]) for p in obj["status"]["pools"]} == {
        ("prefill", "s5000", 1),
        ("decode", "h200", 1),
    }
    table = cluster.kubectl("get", "pdd", "-n", namespace).splitlines()
    assert table[1].split()[:4] == ["glm-hetero", "False", "0/1", "0/1"]


def test_converged_object_costs_zero_writes(operator, api_client, namespace):
    create_pdd(api_client, namespace, copy.deepcopy(HETERO))
    converged(api_client, namespace, "glm-hetero")
    assert quiet(operator, seconds=4) == 0  # several resyncs, nothing written


def test_empty_values_the_apiserver_drops_are_no_drift(operator, api_client, namespace):
    # Valid specs whose empty strings the apiserver stores as absent: an env var without a
    # value, a toleration of every taint (key ""). They once re-applied on every event.
    body = copy.deepcopy(HETERO)
    pool = body["spec"]["prefill"]["pools"][0]
    pool["template"] = {**pool.get("template", {}), "env": [{"name": "EMPTY"}]}
    pool["accelerator"]["tolerations"] = [{"key": "", "operator": "Exists"}]
    create_pdd(api_client, namespace, body)
    converged(api_client, namespace, "glm-hetero")
    assert quiet(operator, seconds=4) == 0
    assert not events(api_client, namespace, "DriftCorrected")


def test_spec_change_rolls_out_and_removed_pool_is_deleted(operator, api_client, namespace):
    create_pdd(api_client, namespace, copy.deepcopy(SPILLOVER))
    wait_for(lambda: len(deployments(api_client, namespace)) == 3, what="three Deployments")
    patch_pdd(
        api_client,
        namespace,
        "glm-spillover",
        {"spec": {"model": {"image": "lmsysorg/sglang:v0.5.4"}}},
    )
    # The engines' revision changed: it starts beside the old one (`core/rollout.py`), which
    # keeps its Deployments, image included, until the new pods are Ready (here never: no kubelet).
    target = revision(parse_pddeployment(get_pdd(api_client, namespace, "glm-spillover")))
    surge = wait_for(
        lambda: (
            (found := deployments(api_client, namespace).get(f"glm-spillover-decode-h200-{target}"))
            and found.spec.template.spec.containers[0].image == "lmsysorg/sglang:v0.5.4"
            and found
        ),
        what="the new image on the decode pool's new-revision Deployment",
    )
    assert surge.spec.template.metadata.labels["pdoperator.io/revision"] == target
    decode = deployments(api_client, namespace)["glm-spillover-decode-h200"]
    assert decode.spec.template.spec.containers[0].image != "lmsysorg/sglang:v0.5.4"
    # The S5000 pool keeps its own image override.
    s5000 = wait_for(
        lambda: deployments(api_client, namespace).get(f"glm-spillover-prefill-s5000-{target}"),
        what="the S5000 pool's new-revision Deployment",
    )
    assert s5000.spec.template.spec.containers[0].image.endswith("sglang-musa:v0.5.3")

    spec = get_pdd(api_client, namespace, "glm-spillover")["spec"]
    spec["prefill"]["pools"] = [p for p in spec["prefill"]["pools"] if p["name"] == "s5000"]
    patch_pdd(api_client, namespace, "glm-spillover", {"spec": {"prefill": spec["prefill"]}})
    kept = {"glm-spillover-prefill-s5000", "glm-spillover-decode-h200"}
    remaining = wait_for(
        lambda: (
            set(deployments(api_client, namespace)) == kept | {f"{name}-{target}" for name in kept}
            and deployments(api_client, namespace)
        ),
        what="the removed pool's Deployments (both revisions) to be deleted (and only they)",
    )
    assert len(remaining) == 4
    assert wait_for(
        lambda: events(api_client, namespace, "PoolDeleted"), what="a PoolDeleted event"
    )


def test_manual_scale_is_put_back_with_an_event(operator, api_client, namespace):
    create_pdd(api_client, namespace, copy.deepcopy(HETERO))
    converged(api_client, namespace, "glm-hetero")
    apps = client.AppsV1Api(api_client)
    apps.patch_namespaced_deployment_scale(
        "glm-hetero-decode-h200", namespace, {"spec": {"replicas": 5}}
    )
    wait_for(
        lambda: (
            apps.read_namespaced_deployment("glm-hetero-decode-h200", namespace).spec.replicas == 1
        ),
        what="the operator to restore replicas to 1",
    )
    assert wait_for(
        lambda: events(api_client, namespace, "DriftCorrected"), what="a DriftCorrected event"
    )


def test_deleting_the_pddeployment_removes_every_child(operator, api_client, namespace):
    create_pdd(api_client, namespace, copy.deepcopy(HETERO))
    wait_for(lambda: len(deployments(api_client, namespace)) == 2, what="two Deployments")
    wait_for(lambda: len(budgets(api_client, namespace)) == 2, what="two PodDisruptionBudgets")
    client.CustomObjectsApi(api_client).delete_namespaced_custom_object(
        "pdoperator.io", "v1alpha1", namespace, "pddeployments", "glm-hetero"
    )
    core = client.CoreV1Api(api_client)
    wait_for(
        lambda: (
            not deployments(api_client, namespace, selector="")
            and not [s for s in core.list_namespaced_service(namespace).items]
            and not budgets(api_client, namespace, selector="")
        ),
        what="garbage collection of Deployments, Services and PodDisruptionBudgets",
    )


def test_restarted_operator_creates_no_duplicates_and_writes_nothing(
    cluster, api_client, namespace
):
    first = RunningOperator(str(cluster.kubeconfig), namespaces=[namespace], workers=2).start()
    try:
        create_pdd(api_client, namespace, copy.deepcopy(HETERO))
        converged(api_client, namespace, "glm-hetero")
        settle(first)
    finally:
        first.stop()
    before = writes_by_kind()
    second = RunningOperator(
        str(cluster.kubeconfig), namespaces=[namespace], workers=2, resync_seconds=1
    ).start()
    try:
        time.sleep(3)
        wait_for(second.settled, what="the restarted operator to settle")
        assert new_writes(before) == {}
    finally:
        second.stop()
    assert sorted(deployments(api_client, namespace)) == [
        "glm-hetero-decode-h200",
        "glm-hetero-prefill-s5000",
    ]


@pytest.fixture
def s5000_node(api_client):
    """One node advertising 8 S5000 cards (cluster-scoped: a unique name per test)."""
    core = client.CoreV1Api(api_client)
    name = f"s5000-{uuid.uuid4().hex[:8]}"
    node = {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": {"mthreads.com/gpu.product": "MTT-S5000"}},
        "spec": {"taints": [{"key": "mthreads.com/gpu", "effect": "NoSchedule"}]},
        "status": {
            "capacity": {"mthreads.com/gpu": "8", "cpu": "64", "memory": "512Gi", "pods": "110"},
            "allocatable": {"mthreads.com/gpu": "8", "cpu": "64", "memory": "512Gi", "pods": "110"},
        },
    }
    core.create_node(node)
    yield name
    core.delete_node(name)


def test_pool_no_node_can_hold_stalls_and_keeps_what_runs(
    operator, api_client, namespace, s5000_node
):
    create_pdd(api_client, namespace, copy.deepcopy(HETERO))
    converged(api_client, namespace, "glm-hetero")
    prefill = get_pdd(api_client, namespace, "glm-hetero")["spec"]["prefill"]
    prefill["pools"][0]["accelerator"]["perReplica"] = 16
    patch_pdd(api_client, namespace, "glm-hetero", {"spec": {"prefill": prefill}})
    obj = wait_for(
        lambda: (
            condition(get_pdd(api_client, namespace, "glm-hetero"), "Stalled").get("status")
            == "True"
            and get_pdd(api_client, namespace, "glm-hetero")
        ),
        what="Stalled=True",
    )
    stalled = condition(obj, "Stalled")
    assert stalled["reason"] == "NoNodeFits"
    assert (
        "prefill pool s5000" in stalled["message"] and "16 mthreads.com/gpu" in stalled["message"]
    )
    assert condition(obj, "Ready")["status"] == "False"
    assert (
        wait_for(lambda: events(api_client, namespace, "Stalled"), what="a Stalled event")[0].type
        == "Warning"
    )
    running = deployments(api_client, namespace)["glm-hetero-prefill-s5000"]
    assert running.spec.template.spec.containers[0].resources.limits["mthreads.com/gpu"] == "8"


def test_rejected_child_stalls_with_the_apiserver_message(operator, api_client, namespace):
    body = copy.deepcopy(HETERO)
    # Schema-valid (volumes pass through), but no valid Volume: the apiserver rejects the child.
    body["spec"]["decode"]["pools"][0]["template"] = {
        "volumes": [{"name": "Bad_Name", "emptyDir": {}}]
    }
    create_pdd(api_client, namespace, body)
    obj = wait_for(
        lambda: (
            condition(get_pdd(api_client, namespace, "glm-hetero"), "Stalled").get("status")
            == "True"
            and get_pdd(api_client, namespace, "glm-hetero")
        ),
        what="Stalled=True",
    )
    stalled = condition(obj, "Stalled")
    assert stalled["reason"] == "ApplyRejected"
    assert "glm-hetero-decode-h200" in stalled["message"]
    assert "glm-hetero-prefill-s5000" in deployments(
        api_client, namespace
    )  # the rest still applied


def test_multi_node_pool_without_leaderworkerset_installed_says_what_to_install(
    operator, api_client, namespace
):
    # This cluster serves no LeaderWorkerSet CRD (tests/integration/test_lws.py runs one that does).
    body = copy.deepcopy(HETERO)
    body["spec"]["decode"]["pools"][0]["accelerator"]["nodesPerReplica"] = 2
    create_pdd(api_client, namespace, body)
    obj = wait_for(
        lambda: (
            condition(get_pdd(api_client, namespace, "glm-hetero"), "Stalled").get("status")
            == "True"
            and get_pdd(api_client, namespace, "glm-hetero")
        ),
        what="Stalled=True",
    )
    message = condition(obj, "Stalled")["message"]
    assert "LeaderWorkerSet glm-hetero-decode-h200 not applied" in message, message
    assert "accelerator.nodesPerReplica" in message and "sigs.k8s.io/lws" in message, message
    assert "glm-hetero-prefill-s5000" in deployments(api_client, namespace)  # the rest applied


def test_image_that_cannot_be_pulled_stalls(operator, api_client, namespace):
    create_pdd(api_client, namespace, copy.deepcopy(HETERO))
    core = client.CoreV1Api(api_client)
    pod = wait_for(
        lambda: [
            p
            for p in core.list_namespaced_pod(namespace).items
            if p.metadata.labels.get("pdoperator.io/role") == "decode"
        ],
        what="a decode pod",
    )[0]
    waiting = {"waiting": {"reason": "ImagePullBackOff", "message": "not found"}}
    container = {"name": "engine", "image": "x", "imageID": "", "ready": False, "restartCount": 0}
    core.patch_namespaced_pod_status(
        pod.metadata.name,
        namespace,
        {"status": {"containerStatuses": [{**container, "state": waiting}]}},
    )
    obj = wait_for(
        lambda: (
            condition(get_pdd(api_client, namespace, "glm-hetero"), "Stalled").get("reason")
            == "ImageUnavailable"
            and get_pdd(api_client, namespace, "glm-hetero")
        ),
        what="Stalled=True with ImageUnavailable",
    )
    assert "decode pool h200" in condition(obj, "Stalled")["message"]
    assert json.dumps(obj["status"]).count("ImagePullBackOff") >= 1


def test_a_pool_whose_pods_cannot_be_created_stalls_with_the_controllers_words(
    operator, api_client, namespace
):
    # The ReplicaSet cannot create a pod naming a ServiceAccount that does not exist: the
    # Deployment reports ReplicaFailure, which the PDDeployment must show, per pool.
    body = copy.deepcopy(HETERO)
    pool = body["spec"]["decode"]["pools"][0]
    pool["template"] = {**pool.get("template", {}), "serviceAccountName": "nobody"}
    create_pdd(api_client, namespace, body)
    obj = wait_for(
        lambda: (
            condition(o := get_pdd(api_client, namespace, "glm-hetero"), "Stalled").get("reason")
            == "ReplicaFailure"
            and o
        ),
        timeout=60,
        what="Stalled=True with ReplicaFailure",
    )
    message = condition(obj, "Stalled")["message"]
    assert message.startswith("decode pool h200: ") and "nobody" in message, message
    assert condition(obj, "Ready")["status"] == "False"


def evict(api_client, namespace, pod: str) -> int:
    """Ask to evict a pod, as `kubectl drain` does; the HTTP status of the answer."""
    body = client.V1Eviction(metadata=client.V1ObjectMeta(name=pod, namespace=namespace))
    try:
        client.CoreV1Api(api_client).create_namespaced_pod_eviction(pod, namespace, body)
    except ApiException as error:
        return int(error.status)
    return 201


def set_running(api_client, namespace, pod: str, ready: bool) -> None:
    """What the kubelet reports: the engine runs, and is Ready once its model is loaded."""
    status = "True" if ready else "False"
    client.CoreV1Api(api_client).patch_namespaced_pod_status(
        pod,
        namespace,
        {"status": {"phase": "Running", "conditions": [{"type": "Ready", "status": status}]}},
    )


def test_a_drain_takes_one_ready_replica_of_a_pool_at_a_time_and_never_waits_on_loading_ones(
    operator, api_client, namespace
):
    body = copy.deepcopy(HETERO)
    body["spec"]["scaling"]["mode"] = "Disabled"
    body["spec"]["prefill"]["pools"][0]["replicas"] = {"min": 2, "max": 2}
    create_pdd(api_client, namespace, body)
    budget = wait_for(
        lambda: budgets(api_client, namespace).get("glm-hetero-prefill-s5000"),
        what="the prefill pool's PodDisruptionBudget",
    ).to_dict()
    assert budget["spec"]["max_unavailable"] == 1
    assert budget["spec"]["selector"]["match_labels"]["pdoperator.io/pool"] == "s5000"
    assert budget["metadata"]["owner_references"][0]["kind"] == "PDDeployment"
    core = client.CoreV1Api(api_client)

    def prefill_pods():
        items = core.list_namespaced_pod(
            namespace, label_selector="pdoperator.io/role=prefill"
        ).items
        live = [p.metadata.name for p in items if p.metadata.deletion_timestamp is None]
        return sorted(live) if len(live) == 2 else None

    # Both replicas still loading their model: neither holds a drain up.
    loading = wait_for(prefill_pods, what="two prefill pods")
    for pod in loading:
        set_running(api_client, namespace, pod, ready=False)
    assert evict(api_client, namespace, loading[0]) == 201

    # Both Ready: a drain may take one, and the second waits for the budget.
    serving = wait_for(
        lambda: (pods := prefill_pods()) and loading[0] not in pods and pods,
        what="the ReplicaSet to replace the evicted pod",
    )
    for pod in serving:
        set_running(api_client, namespace, pod, ready=True)
    policy = client.PolicyV1Api(api_client)
    wait_for(
        lambda: (
            policy.read_namespaced_pod_disruption_budget(
                "glm-hetero-prefill-s5000", namespace
            ).status.current_healthy
            == 2
        ),
        what="the disruption controller to count two healthy replicas",
    )
    assert evict(api_client, namespace, serving[0]) == 201
    assert evict(api_client, namespace, serving[1]) == 429  # TooManyRequests: over the budget


def test_an_operator_whose_rbac_predates_a_kind_it_lists_names_the_rule_and_the_fix(
    cluster, api_client, namespace
):
    # The ClusterRole of the release before PodDisruptionBudgets, for an impersonated user.
    rules = yaml.safe_load((ROOT / "config" / "rbac" / "role.yaml").read_text())["rules"]
    older = [rule for rule in rules if "poddisruptionbudgets" not in rule["resources"]]
    assert len(older) == len(rules) - 1
    user = f"older-operator-{uuid.uuid4().hex[:8]}"
    rbac = client.RbacAuthorizationV1Api(api_client)
    rbac.create_cluster_role({"metadata": {"name": user}, "rules": older})
    rbac.create_cluster_role_binding(
        {
            "metadata": {"name": user},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "ClusterRole",
                "name": user,
            },
            "subjects": [{"kind": "User", "name": user, "apiGroup": "rbac.authorization.k8s.io"}],
        }
    )
    try:
        as_older = config.new_client_from_config(config_file=str(cluster.kubeconfig))
        as_older.set_default_header("Impersonate-User", user)
        apps = client.AppsV1Api(as_older)

        def bound():
            try:
                return apps.list_namespaced_deployment(namespace) is not None
            except ApiException:
                return False

        wait_for(bound, what="the older role to apply")
        with pytest.raises(PermissionError) as refused:
            OperatorState(as_older, OperatorConfig(namespaces=[namespace])).prime()
    finally:
        rbac.delete_cluster_role_binding(user)
        rbac.delete_cluster_role(user)
    message = str(refused.value)
    assert '"poddisruptionbudgets"' in message and "forbidden" in message
    assert "helm upgrade" in message and "kubectl apply -k config/default" in message
