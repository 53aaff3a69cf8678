"""A rollout across roles: the new revision starts beside the old one, the routers switch once
it is Ready, the pools' own workloads follow in place, the surge goes; a stuck one stalls."""

import copy
from typing import Any

from pd_operator.api import parse_pddeployment
from pd_operator.core.capacity import free_capacity
from pd_operator.core.children import LABEL_REVISION, child_key, revision
from pd_operator.core.observe import summarize_node
from pd_operator.core.reconcile import ChildKey, ChildPlan, plan_children
from pd_operator.core.rollout import workload_revision
from pd_operator.core.status import compute_status
from pdcases import ROOT, load_sample

NOW = "2026-11-30T00:00:00Z"
LATER = "2026-11-30T00:05:00Z"
PREFILL = ("apps/v1", "Deployment", "glm-hetero-prefill-s5000")
DECODE = ("apps/v1", "Deployment", "glm-hetero-decode-h200")
ROUTER = ("apps/v1", "Deployment", "glm-hetero-router")
NEW_IMAGE = "vllm/vllm-openai:v0.12.0"


def hetero(image: str = "vllm/vllm-openai:v0.11.0", **changes: Any):
    document = load_sample(ROOT / "config" / "samples" / "heterogeneous-s5000-h200.yaml")
    document["metadata"].update(namespace="ns", uid="uid-1", generation=1)
    document["spec"]["model"]["image"] = image
    document["spec"].update(changes)
    return parse_pddeployment(document)


def converge(plan: ChildPlan, children: dict[ChildKey, Any]) -> dict[ChildKey, Any]:
    """What the apiserver holds after the plan, every workload rolled out and Ready."""
    result = dict(children)
    for ref in plan.delete:
        result.pop((ref.api_version, ref.kind, ref.name), None)
    for manifest in plan.apply:
        obj = copy.deepcopy(manifest)
        before = children.get(child_key(obj))
        generation = (before["metadata"]["generation"] + 1) if before else 1
        obj["metadata"].update(
            uid=f"uid-{obj['metadata']['name']}", generation=generation, creationTimestamp=NOW
        )
        if before:
            obj["metadata"]["creationTimestamp"] = before["metadata"]["creationTimestamp"]
        result[child_key(obj)] = obj
    for key, obj in result.items():
        if key[1] == "Deployment":
            ready(obj)
    return result


def ready(obj: dict[str, Any], count: int | None = None) -> dict[str, Any]:
    wanted = obj["spec"].get("replicas", 1)
    count = wanted if count is None else count
    obj["status"] = {
        "observedGeneration": obj["metadata"]["generation"],
        "replicas": wanted,
        "updatedReplicas": count,
        "readyReplicas": count,
    }
    return obj


def surge_keys(children: dict[ChildKey, Any], target: str) -> list[ChildKey]:
    return sorted(k for k in children if k[1] == "Deployment" and k[2].endswith(f"-{target}"))


def router_revision(children: dict[ChildKey, Any]) -> str | None:
    return workload_revision(children[ROUTER])


def gpu_node(name: str, resource: str, product: str, cards: str):
    return summarize_node(
        {
            "metadata": {"name": name, "labels": {f"{resource}.product": product}},
            "spec": {"taints": [{"key": resource, "effect": "NoSchedule"}]},
            "status": {
                "allocatable": {resource: cards},
                "conditions": [{"type": "Ready", "status": "True"}],
            },
        }
    )


def test_pods_carry_a_revision_of_what_the_engines_share_not_of_replicas_or_scaling():
    old = hetero()
    built = plan_children(old, {}, []).apply
    pool_pods = [
        m["spec"]["template"]["metadata"]["labels"]
        for m in built
        if "template" in m.get("spec", {})
    ]
    assert {labels[LABEL_REVISION] for labels in pool_pods} == {revision(old)}
    assert revision(hetero(scaling={"mode": "Active", "intervalSeconds": 60})) == revision(old)
    assert revision(hetero(NEW_IMAGE)) != revision(old)
    args = hetero(model={**old.spec.model.model_dump(by_alias=True), "args": ["--x"]})
    assert revision(args) != revision(old)
    # The Deployment's selector is immutable: a revision never enters it.
    deployment = next(m for m in built if child_key(m) == DECODE)
    assert LABEL_REVISION not in deployment["spec"]["selector"]["matchLabels"]


def test_an_image_change_starts_the_new_revision_beside_the_old_one():
    old, new = hetero(), hetero(NEW_IMAGE)
    children = converge(plan_children(old, {}, []), {})
    plan = plan_children(new, children, [])
    target = revision(new)
    names = {m["metadata"]["name"] for m in plan.apply}
    assert names == {f"glm-hetero-prefill-s5000-{target}", f"glm-hetero-decode-h200-{target}"}
    assert plan.delete == [] and plan.events == []
    for manifest in plan.apply:
        assert manifest["spec"]["selector"]["matchLabels"][LABEL_REVISION] == target
        assert manifest["spec"]["template"]["metadata"]["labels"][LABEL_REVISION] == target
    assert plan.rollout is not None and plan.rollout.state == "Progressing"
    assert plan.rollout.previous == revision(old)
    # Status says so, and the object is not Ready until the rollout is over.
    status, _ = compute_status(
        new, children=children, pods=[], replicas=plan.replicas, problems=[], previous={},
        now=NOW, rollout=plan.rollout,
    )  # fmt: skip
    assert status["rollout"]["revision"] == target
    assert status["rollout"]["previousRevision"] == revision(old)
    assert status["rollout"]["state"] == "Progressing"
    conditions = {c["type"]: c for c in status["conditions"]}
    assert conditions["Ready"]["status"] == "False"
    assert conditions["Reconciling"]["status"] == "True"
    assert "rollout" in conditions["Reconciling"]["message"]


def test_routers_switch_once_every_new_pool_is_ready_then_pools_follow_and_the_surge_goes():
    old, new = hetero(), hetero(NEW_IMAGE)
    target, previous = revision(new), revision(old)
    children = converge(plan_children(old, {}, []), {})
    assert router_revision(children) == previous
    # The surge exists but is not Ready yet: the routers stay on the old revision.
    plan = plan_children(new, children, [])
    children = converge(plan, children)
    for key in surge_keys(children, target):
        ready(children[key], 0)
    assert all(child_key(m) != ROUTER for m in plan_children(new, children, []).apply)
    # Every new pool is Ready: the routers switch, the pools' own workloads still wait.
    for key in surge_keys(children, target):
        ready(children[key])
    plan = plan_children(new, children, [])
    assert {child_key(m) for m in plan.apply} == {ROUTER}
    router = next(m for m in plan.apply if child_key(m) == ROUTER)
    command = router["spec"]["template"]["spec"]["containers"][0]["command"]
    assert f"pdoperator.io/revision={target}" in command
    assert plan.rollout is not None and "switching the routers" in plan.rollout.message
    # The routers have rolled: the pools' own workloads take the new revision in place.
    children = converge(plan, children)
    plan = plan_children(new, children, [])
    assert {child_key(m) for m in plan.apply} == {PREFILL, DECODE}
    assert all(workload_revision(m) == target for m in plan.apply)
    assert plan.delete == []
    # While they roll, the surge serves.
    children = converge(plan, children)
    ready(children[PREFILL], 0)
    plan = plan_children(new, children, [])
    assert plan.apply == [] and plan.delete == []
    assert plan.rollout is not None and plan.rollout.state == "Progressing"
    # Once they are Ready, the surge goes and the rollout is complete; names are the old ones.
    ready(children[PREFILL])
    plan = plan_children(new, children, [])
    assert sorted((r.kind, r.name) for r in plan.delete) == [
        ("Deployment", f"glm-hetero-decode-h200-{target}"),
        ("Deployment", f"glm-hetero-prefill-s5000-{target}"),
    ]
    assert plan.rollout is not None and plan.rollout.state == "Complete"
    children = converge(plan, children)
    plan = plan_children(new, children, [])
    assert plan.apply == [] and plan.delete == [] and plan.rollout is None
    assert {PREFILL, DECODE, ROUTER} <= set(children)
    # status.rollout keeps the last one, Complete, with where it came from.
    before = {
        "rollout": {
            "revision": target, "previousRevision": previous, "state": "Progressing",
            "message": "", "startedAt": NOW,
        }
    }  # fmt: skip
    status, _ = compute_status(
        new, children=children, pods=[], replicas=plan.replicas, problems=[], previous=before,
        now=LATER, rollout=plan.rollout,
    )  # fmt: skip
    assert status["rollout"]["revision"] == target
    assert status["rollout"]["previousRevision"] == previous
    assert status["rollout"]["startedAt"] == NOW


def test_the_surge_is_limited_by_free_capacity_and_waits_when_not_even_one_fits():
    old, new = hetero(), hetero(NEW_IMAGE)
    children = converge(plan_children(old, {}, [], {("prefill", "s5000"): 3}), {})
    s5000 = gpu_node("m1", "mthreads.com/gpu", "MTT-S5000", "8")
    h200 = gpu_node("n1", "nvidia.com/gpu", "NVIDIA-H200", "8")
    nodes = [s5000, h200]
    plan = plan_children(new, children, nodes, free=lambda: free_capacity(nodes, []))
    replicas = {
        m["metadata"]["labels"]["pdoperator.io/role"]: m["spec"]["replicas"] for m in plan.apply
    }
    assert replicas == {"prefill": 1, "decode": 1}  # 3 prefill wanted, room for 1
    # No room at all for decode: the rollout waits and says so; nothing old is touched.
    h200_full = gpu_node("n1", "nvidia.com/gpu", "NVIDIA-H200", "0")
    nodes = [s5000, h200_full, gpu_node("n2", "nvidia.com/gpu", "NVIDIA-A100", "8")]
    plan = plan_children(new, children, nodes, free=lambda: free_capacity(nodes, []))
    assert plan.rollout is not None and plan.rollout.state == "Progressing"
    assert "waiting for free capacity for one decode replica" in plan.rollout.message
    assert all(child_key(m) not in (PREFILL, DECODE, ROUTER) for m in plan.apply)


def test_a_new_revision_that_never_becomes_ready_stalls_and_the_old_one_keeps_serving():
    old, new = hetero(), hetero("registry.invalid/none:v1", rollout={"progressDeadlineSeconds": 30})
    target = revision(new)
    children = converge(plan_children(old, {}, []), {})
    plan = plan_children(new, children, [])
    assert {m["spec"]["progressDeadlineSeconds"] for m in plan.apply} == {30}
    children = converge(plan, children)
    for key in surge_keys(children, target):
        ready(children[key], 0)
    children[surge_keys(children, target)[0]]["status"]["conditions"] = [
        {"type": "Progressing", "status": "False", "reason": "ProgressDeadlineExceeded"}
    ]
    plan = plan_children(new, children, [])
    assert plan.apply == [] and plan.delete == []  # the routers stay, the surge is left
    assert router_revision(children) == revision(old)
    assert plan.rollout is not None and plan.rollout.state == "Stalled"
    status, events = compute_status(
        new, children=children, pods=[], replicas=plan.replicas, problems=plan.problems,
        previous={}, now=NOW, rollout=plan.rollout,
    )  # fmt: skip
    stalled = next(c for c in status["conditions"] if c["type"] == "Stalled")
    assert (stalled["status"], stalled["reason"]) == ("True", "RolloutStalled")
    assert f"revision {revision(old)} keeps serving" in stalled["message"]
    assert status["rollout"]["state"] == "Stalled"
    assert [e.reason for e in events] == ["Stalled"]
    # Going back to the old spec gives the rollout up: the surge goes, nothing else changes.
    plan = plan_children(old, children, [])
    assert plan.apply == []
    assert sorted(r.name for r in plan.delete) == [k[2] for k in surge_keys(children, target)]
    status, _ = compute_status(
        old, children=children, pods=[], replicas=plan.replicas, problems=[],
        previous=status, now=LATER, rollout=plan.rollout,
    )  # fmt: skip
    assert status["rollout"]["state"] == "Complete"
    assert status["rollout"]["revision"] == revision(old)


def test_objects_built_before_revisions_take_one_in_place_without_a_surge():
    old = hetero()
    children = converge(plan_children(old, {}, []), {})
    for key in (PREFILL, DECODE):
        del children[key]["spec"]["template"]["metadata"]["labels"][LABEL_REVISION]
    plan = plan_children(old, children, [])
    assert {child_key(m) for m in plan.apply} == {PREFILL, DECODE}
    assert plan.rollout is None
