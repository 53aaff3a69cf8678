"""Scaling mode External: the PDPool builder, and the replicas a role's request turns into."""

import copy
from typing import Any

import pytest

from pd_operator.api import parse_pddeployment
from pd_operator.core.capacity import free_capacity
from pd_operator.core.children import build_pdpool, child_key
from pd_operator.core.decision import PoolObservation
from pd_operator.core.external import decide_external, external_view, requested_replicas
from pd_operator.core.observe import PodSummary, summarize_node
from pd_operator.core.reconcile import plan_children, pool_observations
from pdcases import ROOT, load_sample

S5000 = {"mthreads.com/gpu.product": "MTT-S5000"}
H200 = {"nvidia.com/gpu.product": "NVIDIA-H200"}


def external(mode: str = "External", ratio: dict[str, int] | None = None):
    """The sample with decode replicas of 2 cards (4 on the H200 node), at most 10."""
    document = load_sample(ROOT / "config" / "samples" / "heterogeneous-s5000-h200.yaml")
    document["metadata"].update(namespace="ns", uid="uid-1", generation=1)
    decode = document["spec"]["decode"]["pools"][0]
    decode["accelerator"]["perReplica"] = 2
    decode["replicas"] = {"min": 1, "max": 10}
    document["spec"]["scaling"] = {"mode": mode}
    if ratio is not None:
        document["spec"]["scaling"]["prefillToDecodeRatio"] = ratio
    return parse_pddeployment(document)


def node(name: str, labels: dict[str, str], resource: str):
    return summarize_node(
        {
            "metadata": {"name": name, "labels": labels},
            "spec": {"taints": [{"key": resource, "effect": "NoSchedule"}]},
            "status": {
                "allocatable": {resource: "8"},
                "conditions": [{"type": "Ready", "status": "True"}],
            },
        }
    )


NODES = [
    node("s1", S5000, "mthreads.com/gpu"),
    node("s2", S5000, "mthreads.com/gpu"),
    node("h1", H200, "nvidia.com/gpu"),
]
# One replica of each role runs, bound to its node.
RUNNING_PODS = [
    PodSummary("p0", "prefill", "s5000", ready=True, unschedulable=False, node_name="s1",
               requests={"mthreads.com/gpu": "8"}),
    PodSummary("d0", "decode", "h200", ready=True, unschedulable=False, node_name="h1",
               requests={"nvidia.com/gpu": "2"}),
]  # fmt: skip
CAPACITY = free_capacity(NODES, RUNNING_PODS)
RUNNING = {("prefill", "s5000"): PoolObservation(1, 1), ("decode", "h200"): PoolObservation(1, 1)}


def decide(pdd, prefill: int | None, decode: int | None, pools=None, capacity=CAPACITY):
    return decide_external(pdd, {"prefill": prefill, "decode": decode}, pools or RUNNING, capacity)


def stored(manifests: list[dict[str, Any]]) -> dict:
    """The objects as the apiserver holds them after the plan's writes."""
    result = {}
    for manifest in manifests:
        obj = copy.deepcopy(manifest)
        obj["metadata"]["uid"] = f"uid-{obj['metadata']['name']}"
        result[child_key(obj)] = obj
    return result


def test_a_pdpool_is_owned_by_its_pddeployment_and_carries_replicas_only_when_created():
    pdd = external()
    pdpool = build_pdpool(pdd, "decode", 3)
    assert (pdpool["apiVersion"], pdpool["kind"]) == ("pdoperator.io/v1alpha1", "PDPool")
    assert pdpool["metadata"]["name"] == "glm-hetero-decode"
    (owner,) = pdpool["metadata"]["ownerReferences"]
    assert (owner["kind"], owner["uid"], owner["controller"]) == ("PDDeployment", "uid-1", True)
    assert pdpool["metadata"]["labels"]["pdoperator.io/role"] == "decode"
    assert pdpool["spec"] == {"replicas": 3}
    assert "spec" not in build_pdpool(pdd, "decode")


def test_external_mode_creates_one_pdpool_per_role_from_what_it_runs_and_never_rewrites_it():
    pdd = external()
    first = plan_children(pdd, {}, NODES)
    pdpools = [m for m in first.apply if m["kind"] == "PDPool"]
    assert {m["metadata"]["name"]: m["spec"] for m in pdpools} == {
        "glm-hetero-prefill": {"replicas": 1},
        "glm-hetero-decode": {"replicas": 1},
    }
    children = stored(first.apply)
    # HPA asks for more; the operator applies the new replicas to the Deployment only.
    children[("pdoperator.io/v1alpha1", "PDPool", "glm-hetero-decode")]["spec"]["replicas"] = 3
    again = plan_children(pdd, children, NODES, {("prefill", "s5000"): 1, ("decode", "h200"): 3})
    assert [child_key(m)[1:] for m in again.apply] == [("Deployment", "glm-hetero-decode-h200")]
    # Drift on a PDPool (a label removed) is repaired by an apply without spec.replicas.
    del children[("pdoperator.io/v1alpha1", "PDPool", "glm-hetero-decode")]["metadata"]["labels"][
        "app.kubernetes.io/part-of"
    ]
    repaired = [m for m in plan_children(pdd, children, NODES).apply if m["kind"] == "PDPool"]
    assert len(repaired) == 1 and "spec" not in repaired[0]


def test_leaving_external_mode_deletes_the_pdpools_it_owns():
    children = stored(plan_children(external(), {}, NODES).apply)
    plan = plan_children(external(mode="Active"), children, NODES)
    assert sorted(ref.name for ref in plan.delete if ref.kind == "PDPool") == [
        "glm-hetero-decode",
        "glm-hetero-prefill",
    ]


def test_the_request_is_read_from_owned_pdpools_only():
    pdd = external()
    children = stored(plan_children(pdd, {}, NODES).apply)
    children[("pdoperator.io/v1alpha1", "PDPool", "glm-hetero-decode")]["spec"]["replicas"] = 3
    del children[("pdoperator.io/v1alpha1", "PDPool", "glm-hetero-prefill")]
    assert requested_replicas(pdd, children) == {"prefill": None, "decode": 3}


def test_a_request_that_fits_is_run_as_asked():
    decision = decide(external(), 2, 3)
    assert decision.replicas == {("prefill", "s5000"): 2, ("decode", "h200"): 3}
    assert {o.limited_by for o in decision.roles.values()} == {"none"}
    view = external_view(decision, {})
    (condition,) = view.conditions
    assert (condition.status, condition.reason) == (True, "AsRequested")
    assert view.events == []
    assert view.external == [
        {"role": "prefill", "pdPool": "glm-hetero-prefill", "requestedReplicas": 2,
         "replicas": 2, "limitedBy": "none", "message": ""},
        {"role": "decode", "pdPool": "glm-hetero-decode", "requestedReplicas": 3,
         "replicas": 3, "limitedBy": "none", "message": ""},
    ]  # fmt: skip


@pytest.mark.parametrize(
    ("prefill", "decode", "role", "got", "limit", "message"),
    [
        # 4 decode replicas of 2 cards fit on the one 8-card H200 node.
        (1, 12, "decode", 4, "capacity", "decode: PDPool asks 12, capacity allows 4"),
        # Two S5000 nodes hold two 8-card prefill replicas; max is 4.
        (3, 1, "prefill", 2, "capacity", "prefill: PDPool asks 3, capacity allows 2"),
        (1, 0, "decode", 1, "bounds", "decode: PDPool asks 0, replicas.min keeps 1"),
    ],
)
def test_a_request_beyond_bounds_or_capacity_is_overridden_and_said(
    prefill, decode, role, got, limit, message
):
    decision = decide(external(), prefill, decode)
    outcome = decision.roles[role]
    assert (outcome.replicas, outcome.limited_by, outcome.message) == (got, limit, message)
    view = external_view(decision, {})
    (condition,) = view.conditions
    assert (condition.status, condition.reason, condition.message) == (False, "Overridden", message)
    assert [(e.type, e.reason, e.message) for e in view.events] == [
        ("Warning", "ScaleOverridden", message)
    ]
    # Said once: the next pass that finds the same override posts no event.
    previous = {"conditions": [{"type": "ExternalScaling", "message": message}]}
    assert external_view(decision, previous).events == []


def test_a_request_over_max_is_held_to_max():
    pdd = external()
    many = free_capacity(
        [*NODES, *(node(f"s{i}", S5000, "mthreads.com/gpu") for i in range(3, 9))], []
    )
    outcome = decide(pdd, 6, 2, capacity=many).roles["prefill"]
    assert (outcome.replicas, outcome.limited_by) == (4, "bounds")
    assert outcome.message == "prefill: PDPool asks 6, replicas.max allows 4"


def test_the_ratio_guardrail_grows_the_smaller_role_and_says_so():
    pdd = external(ratio={"minPercent": 50, "maxPercent": 400})
    decision = decide(pdd, 1, 4)
    # 1 prefill per 4 decode is 25%: prefill grows to 2 (50%), what its PDPool did not ask.
    assert decision.replicas == {("prefill", "s5000"): 2, ("decode", "h200"): 4}
    prefill = decision.roles["prefill"]
    assert (prefill.limited_by, prefill.message) == (
        "ratio",
        "prefill: PDPool asks 1, the prefill:decode ratio guardrail needs 2",
    )
    assert decision.roles["decode"].limited_by == "none"


def test_the_ratio_guardrail_caps_growth_it_cannot_balance():
    pdd = external(ratio={"minPercent": 100, "maxPercent": 100})
    # Prefill cannot grow past 2 (capacity): decode's growth to 4 is cut to 2.
    decision = decide(pdd, 1, 4)
    assert decision.replicas == {("prefill", "s5000"): 2, ("decode", "h200"): 2}
    decode = decision.roles["decode"]
    assert (decode.limited_by, decode.message) == (
        "ratio",
        "decode: PDPool asks 4, the prefill:decode ratio guardrail allows 2",
    )


def test_without_its_pdpool_a_role_holds_what_it_runs_and_status_says_why():
    running = {
        ("prefill", "s5000"): PoolObservation(2, 2),
        ("decode", "h200"): PoolObservation(1, 1),
    }
    decision = decide(external(), None, 3, pools=running)
    assert decision.replicas == {("prefill", "s5000"): 2, ("decode", "h200"): 3}
    (condition,) = external_view(decision, {}).conditions
    assert (condition.status, condition.reason) == (None, "PDPoolMissing")
    assert "no PDPool glm-hetero-prefill of this PDDeployment: holding 2" in condition.message
    assert "requestedReplicas" not in external_view(decision, {}).external[0]


def test_pods_created_but_not_yet_bound_hold_their_room():
    """3 decode pods bound, a 4th created and not bound yet: its room is not promised again."""
    pdd = external()
    pods = [
        PodSummary(f"d{i}", "decode", "h200", ready=True, unschedulable=False, node_name="h1",
                   requests={"nvidia.com/gpu": "2"})
        for i in range(3)
    ] + [PodSummary("d3", "decode", "h200", ready=False, unschedulable=False)]  # fmt: skip
    children = stored(plan_children(pdd, {}, NODES, {("decode", "h200"): 4}).apply)
    pools = pool_observations(pdd, children, pods, count_bound=True)
    assert pools[("decode", "h200")].scheduled == 3
    capacity = free_capacity(NODES, pods)
    outcome = decide(pdd, 1, 6, pools=pools, capacity=capacity).roles["decode"]
    assert (outcome.replicas, outcome.message) == (4, "decode: PDPool asks 6, capacity allows 4")
