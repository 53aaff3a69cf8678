"""Multi-node replicas (`accelerator.nodesPerReplica` > 1): a pool runs as a LeaderWorkerSet whose
leaders alone are endpoints, and whose engines find each other through LWS's environment."""

import copy
from typing import Any

import pytest

from pd_operator.api import InvalidSpecError, PDDeployment, parse_pddeployment
from pd_operator.core.children import (
    LWS_API_VERSION,
    LWS_KIND,
    build_service,
    child_key,
    desired_children,
    workload_key,
)
from pd_operator.core.reconcile import ANNOTATION_DESIRED_REPLICAS, plan_children
from pd_operator.core.status import compute_status
from pdcases import minimal

NOW = "2026-12-05T00:00:00Z"


def multinode(nodes: int = 2, engine: str = "VLLM", per_replica: int = 8) -> PDDeployment:
    """The minimal document whose prefill pool spans `nodes` nodes of `per_replica` cards."""
    document = minimal()
    document["metadata"].update(namespace="ns", uid="uid-1", generation=1)
    document["spec"]["model"]["engine"] = engine
    document["spec"]["model"]["args"] = ["--user-flag"]
    accelerator = document["spec"]["prefill"]["pools"][0]["accelerator"]
    accelerator.update(nodesPerReplica=nodes, perReplica=per_replica)
    return parse_pddeployment(document)


def by_kind(children: list[dict[str, Any]], kind: str) -> dict[str, dict[str, Any]]:
    return {c["metadata"]["name"]: c for c in children if c["kind"] == kind}


def lws_of(pdd: PDDeployment, replicas: int = 3) -> dict[str, Any]:
    children = desired_children(pdd, {("prefill", "p"): replicas})
    return by_kind(children, LWS_KIND)["minimal-prefill-p"]


def templates(lws: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    group = lws["spec"]["leaderWorkerTemplate"]
    return group["leaderTemplate"], group["workerTemplate"]


def container(template: dict[str, Any]) -> dict[str, Any]:
    (engine,) = template["spec"]["containers"]
    return engine


def selects(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return all(labels.get(key) == value for key, value in selector.items())


def test_a_single_node_pool_stays_a_deployment() -> None:
    document = minimal()
    document["metadata"].update(namespace="ns", uid="uid-1")
    pdd = parse_pddeployment(document)
    assert pdd.spec.prefill.pools[0].accelerator.nodes_per_replica == 1
    children = desired_children(pdd, {})
    assert not by_kind(children, LWS_KIND)
    assert set(by_kind(children, "Deployment")) == {"minimal-prefill-p", "minimal-decode-d"}


def test_a_multi_node_pool_is_a_leader_worker_set_of_one_group_per_replica() -> None:
    pdd = multinode(nodes=4)
    children = desired_children(pdd, {("prefill", "p"): 3})
    assert "minimal-prefill-p" not in by_kind(children, "Deployment")
    lws = by_kind(children, LWS_KIND)["minimal-prefill-p"]
    assert lws["apiVersion"] == LWS_API_VERSION == "leaderworkerset.x-k8s.io/v1"
    assert lws["spec"]["replicas"] == 3
    group = lws["spec"]["leaderWorkerTemplate"]
    assert group["size"] == 4
    assert group["restartPolicy"] == "RecreateGroupOnPodRestart"
    # What LWS's defaulting webhook would set, so the object is the same with or without it.
    assert lws["spec"]["networkConfig"] == {"subdomainPolicy": "Shared"}
    assert lws["spec"]["rolloutStrategy"]["rollingUpdateConfiguration"] == {
        "maxUnavailable": 1,
        "maxSurge": 0,
    }
    assert lws["metadata"]["ownerReferences"][0]["uid"] == "uid-1"
    pool = pdd.spec.prefill.pools[0]
    assert workload_key("minimal", "prefill", pool) == child_key(lws)
    # The single-node decode pool next to it is untouched.
    assert "minimal-decode-d" in by_kind(children, "Deployment")


def test_every_pod_of_a_group_takes_the_pools_cards_on_its_own_node() -> None:
    for template in templates(lws_of(multinode(nodes=2, per_replica=8))):
        resources = container(template)["resources"]
        assert resources["requests"]["mthreads.com/gpu"] == "8"
        assert resources["limits"]["mthreads.com/gpu"] == "8"


def test_only_leaders_are_endpoints_of_the_role_service_and_the_budget_covers_whole_groups() -> (
    None
):
    pdd = multinode()
    leader, worker = templates(lws_of(pdd))
    leader_labels, worker_labels = leader["metadata"]["labels"], worker["metadata"]["labels"]
    service = build_service(pdd, "prefill")["spec"]["selector"]
    assert selects(service, leader_labels)
    assert not selects(service, worker_labels)
    children = desired_children(pdd, {})
    budget = by_kind(children, "PodDisruptionBudget")["minimal-prefill-p"]
    selector = budget["spec"]["selector"]["matchLabels"]
    assert selects(selector, leader_labels) and selects(selector, worker_labels)
    # Not the decode pool's pods, even if a pool there had the same name.
    decode = by_kind(children, "Deployment")["minimal-decode-d"]["spec"]["template"]
    assert not selects(selector, {**decode["metadata"]["labels"], "pdoperator.io/pool": "p"})


def test_workers_serve_no_http_so_nothing_probes_drains_or_scrapes_them() -> None:
    leader, worker = templates(lws_of(multinode()))
    assert "readinessProbe" in container(leader) and "startupProbe" in container(leader)
    assert "lifecycle" in container(leader)  # the drain before the engine stops
    assert leader["metadata"]["annotations"]["prometheus.io/scrape"] == "true"
    for field in ("readinessProbe", "startupProbe", "livenessProbe", "lifecycle"):
        assert field not in container(worker)
    assert "prometheus.io/scrape" not in worker["metadata"]["annotations"]


def test_vllm_spreads_data_parallel_ranks_over_the_group_with_lws_environment() -> None:
    leader, worker = templates(lws_of(multinode(nodes=4, engine="VLLM", per_replica=8)))
    lead, work = container(leader)["command"], container(worker)["command"]
    for argv in (lead, work):
        assert flag(argv, "--tensor-parallel-size") == "8"
        assert flag(argv, "--data-parallel-size") == "4"
        assert flag(argv, "--data-parallel-size-local") == "1"
        assert flag(argv, "--data-parallel-address") == "$(LWS_LEADER_ADDRESS)"
        assert flag(argv, "--data-parallel-rpc-port") == "13345"
        assert "--enable-expert-parallel" in argv
        assert argv[-1] == "--user-flag"  # the user's args still come last
    assert "--headless" not in lead and "--data-parallel-start-rank" not in lead
    assert "--headless" in work
    assert flag(work, "--data-parallel-start-rank") == "$(LWS_WORKER_INDEX)"


def test_sglang_spans_the_group_with_one_tensor_parallel_group() -> None:
    leader, worker = templates(lws_of(multinode(nodes=2, engine="SGLang", per_replica=8)))
    for argv in (container(leader)["command"], container(worker)["command"]):
        assert flag(argv, "--tp-size") == "16"
        assert flag(argv, "--nnodes") == "2"
        assert flag(argv, "--node-rank") == "$(LWS_WORKER_INDEX)"
        assert flag(argv, "--dist-init-addr") == "$(LWS_LEADER_ADDRESS):20000"
    # sglang-router finds the prefill bootstrap server on the leader only.
    assert "sglang.ai/bootstrap-port" in leader["metadata"]["annotations"]
    assert "sglang.ai/bootstrap-port" not in worker["metadata"]["annotations"]


def test_single_node_engines_get_no_multi_node_flags() -> None:
    document = minimal()
    document["metadata"].update(namespace="ns", uid="uid-1")
    deployment = by_kind(desired_children(parse_pddeployment(document), {}), "Deployment")
    argv = container(deployment["minimal-prefill-p"]["spec"]["template"])["command"]
    assert not [a for a in argv if a.startswith("--data-parallel") or a == "--headless"]


@pytest.mark.parametrize("nodes", [0, 17])
def test_nodes_per_replica_is_bounded(nodes: int) -> None:
    document = minimal()
    document["spec"]["prefill"]["pools"][0]["accelerator"]["nodesPerReplica"] = nodes
    with pytest.raises(InvalidSpecError, match="nodesPerReplica"):
        parse_pddeployment(document)


def test_the_plan_applies_the_leader_worker_set_with_its_replica_decision() -> None:
    pdd = multinode()
    plan = plan_children(pdd, {}, [])
    (lws,) = [m for m in plan.apply if m["kind"] == LWS_KIND]
    assert lws["metadata"]["annotations"][ANNOTATION_DESIRED_REPLICAS] == "1"
    # Converged: applied and read back, nothing more to write.
    held = {child_key(m): copy.deepcopy(m) for m in plan.apply}
    assert plan_children(pdd, held, []).apply == []


def test_a_pool_that_becomes_multi_node_replaces_its_deployment() -> None:
    single = minimal()
    single["metadata"].update(namespace="ns", uid="uid-1", generation=1)
    before = plan_children(parse_pddeployment(single), {}, [])
    held = {child_key(m): copy.deepcopy(m) for m in before.apply}
    after = plan_children(multinode(), held, [])
    assert [m["metadata"]["name"] for m in after.apply if m["kind"] == LWS_KIND] == [
        "minimal-prefill-p"
    ]
    # The Deployment stays until the LeaderWorkerSet exists (a role never goes without).
    assert not [d for d in after.delete if d.kind == "Deployment"]
    held |= {child_key(m): copy.deepcopy(m) for m in after.apply}
    last = plan_children(multinode(), held, [])
    assert [(d.kind, d.name) for d in last.delete] == [("Deployment", "minimal-prefill-p")]


def test_status_counts_ready_groups_from_the_leader_worker_set() -> None:
    pdd = multinode()
    plan = plan_children(pdd, {}, [])
    held = {child_key(m): copy.deepcopy(m) for m in plan.apply}
    key = workload_key("minimal", "prefill", pdd.spec.prefill.pools[0])

    def status_with(lws_status: dict[str, Any]) -> tuple[dict[str, Any], str]:
        held[key]["status"] = lws_status
        status, _ = compute_status(
            pdd, children=held, pods=[], replicas=plan.replicas, problems=[], previous={}, now=NOW
        )
        ready = next(c for c in status["conditions"] if c["type"] == "Ready")
        return next(p for p in status["pools"] if p["role"] == "prefill"), ready["message"]

    # LWS reports no observedGeneration: its replica counts and conditions say it all.
    rolled_out = {"replicas": 1, "readyReplicas": 1, "updatedReplicas": 1}
    pool, waiting_for = status_with(rolled_out)
    assert (pool["replicas"], pool["readyReplicas"]) == (1, 1)
    assert "prefill/p" not in waiting_for
    updating = [{"type": "UpdateInProgress", "status": "True"}]
    _, waiting_for = status_with({**rolled_out, "conditions": updating})
    assert "prefill/p 1/1 ready" in waiting_for


def flag(argv: list[str], name: str) -> str | None:
    return argv[argv.index(name) + 1] if name in argv else None
