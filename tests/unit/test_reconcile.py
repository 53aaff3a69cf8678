"""The pure reconcile: which writes a state needs, and what status says about it."""

import copy
from typing import Any

import pytest

from pd_operator.api import parse_pddeployment
from pd_operator.core.children import child_key, revision
from pd_operator.core.decision import DecidedReplicas, ScaleRecord
from pd_operator.core.observe import PodSummary, summarize_node
from pd_operator.core.reconcile import (
    ANNOTATION_DESIRED_REPLICAS,
    ANNOTATION_LAST_SCALE,
    ANNOTATION_SPEC_HASH,
    is_subset,
    plan_children,
    pool_observations,
    unplaceable,
)
from pd_operator.core.status import compute_status, invalid_spec_status
from pdcases import ROOT, load_sample

NOW = "2026-11-30T00:00:00Z"
LATER = "2026-11-30T00:05:00Z"


def hetero(**spec_changes: Any):
    document = load_sample(ROOT / "config" / "samples" / "heterogeneous-s5000-h200.yaml")
    document["metadata"].update(namespace="ns", uid="uid-1", generation=1)
    document["spec"].update(spec_changes)
    return parse_pddeployment(document)


def applied(plan) -> dict:
    """What the apiserver would hold after the plan: the manifests plus server defaults."""
    result = {}
    for manifest in plan.apply:
        obj = copy.deepcopy(manifest)
        obj["metadata"]["uid"] = f"uid-{manifest['metadata']['name']}"
        obj["metadata"]["generation"] = 1
        if obj["kind"] == "Deployment":
            obj["spec"]["revisionHistoryLimit"] = 10  # a server default we never set
        result[child_key(obj)] = obj
    return result


def node(name: str, labels: dict[str, str], cards: str, taint: str | None = None):
    spec = {"taints": [{"key": taint, "effect": "NoSchedule"}]} if taint else {}
    return summarize_node(
        {
            "metadata": {"name": name, "labels": labels},
            "spec": spec,
            "status": {
                "allocatable": {taint or "nvidia.com/gpu": cards},
                "conditions": [{"type": "Ready", "status": "True"}],
            },
        }
    )


def test_first_reconcile_creates_every_child_with_hash_and_replica_annotations():
    plan = plan_children(hetero(), {}, [])
    kinds = sorted((m["kind"], m["metadata"]["name"]) for m in plan.apply)
    assert kinds == [
        ("Deployment", "glm-hetero-decode-h200"),
        ("Deployment", "glm-hetero-prefill-s5000"),
        ("Deployment", "glm-hetero-router"),
        ("PodDisruptionBudget", "glm-hetero-decode-h200"),
        ("PodDisruptionBudget", "glm-hetero-prefill-s5000"),
        ("PodDisruptionBudget", "glm-hetero-router"),
        ("Role", "glm-hetero-router"),
        ("RoleBinding", "glm-hetero-router"),
        ("Service", "glm-hetero"),
        ("Service", "glm-hetero-decode"),
        ("Service", "glm-hetero-prefill"),
        ("ServiceAccount", "glm-hetero-router"),
    ]
    for manifest in plan.apply:
        assert ANNOTATION_SPEC_HASH in manifest["metadata"]["annotations"]
    deployment = next(m for m in plan.apply if m["kind"] == "Deployment")
    assert deployment["metadata"]["annotations"][ANNOTATION_DESIRED_REPLICAS] == "1"
    router = next(m for m in plan.apply if m["metadata"]["name"] == "glm-hetero-router")
    # The router's replicas are its spec's (or its HPA's), never an autoscaler decision.
    assert ANNOTATION_DESIRED_REPLICAS not in router["metadata"]["annotations"]
    assert plan.delete == [] and plan.problems == []


def test_converged_state_needs_no_write():
    first = plan_children(hetero(), {}, [])
    second = plan_children(hetero(), applied(first), [])
    assert second.apply == [] and second.delete == [] and second.events == []


def test_manual_edit_is_restored_with_a_drift_event():
    children = applied(plan_children(hetero(), {}, []))
    key = ("apps/v1", "Deployment", "glm-hetero-decode-h200")
    children[key]["spec"]["replicas"] = 5  # kubectl scale
    plan = plan_children(hetero(), children, [])
    assert [m["metadata"]["name"] for m in plan.apply] == ["glm-hetero-decode-h200"]
    assert plan.apply[0]["spec"]["replicas"] == 1
    assert [e.reason for e in plan.events] == ["DriftCorrected"]


def test_spec_change_is_applied_without_a_drift_event():
    children = applied(plan_children(hetero(), {}, []))
    body = load_sample(ROOT / "config" / "samples" / "heterogeneous-s5000-h200.yaml")
    body["metadata"].update(namespace="ns", uid="uid-1", generation=1)
    body["spec"]["decode"]["pools"][0]["template"] = {"labels": {"team": "a"}}
    plan = plan_children(parse_pddeployment(body), children, [])
    assert {m["metadata"]["name"] for m in plan.apply} == {"glm-hetero-decode-h200"}
    assert plan.events == []


def test_an_engine_change_rolls_both_roles_beside_the_old_ones_without_a_drift_event():
    children = applied(plan_children(hetero(), {}, []))
    model = {
        "name": "zai-org/GLM-4.6-FP8",
        "image": "vllm/vllm-openai:v0.12.0",
        "contextLength": 65536,
    }
    # The prefill pool overrides the image, yet prefill rolls too: its engines must agree with
    # decode's (tests/unit/test_rollout.py).
    changed = hetero(model=model)
    plan = plan_children(changed, children, [])
    assert {m["metadata"]["name"] for m in plan.apply} == {
        f"glm-hetero-prefill-s5000-{revision(changed)}",
        f"glm-hetero-decode-h200-{revision(changed)}",
    }
    assert plan.events == []


def test_equal_quantities_in_another_spelling_are_not_drift():
    body = load_sample(ROOT / "config" / "samples" / "heterogeneous-s5000-h200.yaml")
    body["metadata"].update(namespace="ns", uid="u", generation=1)
    body["spec"]["decode"]["pools"][0]["template"] = {"resources": {"requests": {"cpu": "1000m"}}}
    pdd = parse_pddeployment(body)
    children = applied(plan_children(pdd, {}, []))
    container = children[("apps/v1", "Deployment", "glm-hetero-decode-h200")]["spec"]["template"][
        "spec"
    ]["containers"][0]
    container["resources"]["requests"]["cpu"] = "1"  # how the apiserver may print it
    assert plan_children(pdd, children, []).apply == []


def test_removed_pool_deletes_exactly_its_deployment_and_disruption_budget():
    spill = load_sample(ROOT / "config" / "samples" / "multipool-spillover.yaml")
    spill["metadata"].update(namespace="ns", uid="u", generation=1)
    children = applied(plan_children(parse_pddeployment(spill), {}, []))
    spill["spec"]["prefill"]["pools"] = spill["spec"]["prefill"]["pools"][:1]
    plan = plan_children(parse_pddeployment(spill), children, [])
    assert [(r.kind, r.name) for r in plan.delete] == [
        ("Deployment", "glm-spillover-prefill-h200-overflow"),
        ("PodDisruptionBudget", "glm-spillover-prefill-h200-overflow"),
    ]
    assert plan.apply == []


def _set_ready(children: dict, name: str, ready: int) -> None:
    children[("apps/v1", "Deployment", name)]["status"] = {"readyReplicas": ready}


def _renamed_prefill(new_name: str):
    document = load_sample(ROOT / "config" / "samples" / "heterogeneous-s5000-h200.yaml")
    document["metadata"].update(namespace="ns", uid="uid-1", generation=1)
    document["spec"]["prefill"]["pools"][0]["name"] = new_name
    return parse_pddeployment(document)


def test_renamed_pool_keeps_the_old_one_until_the_new_one_exists_and_is_ready():
    children = applied(plan_children(hetero(), {}, []))
    old = "glm-hetero-prefill-s5000"
    _set_ready(children, old, 2)
    renamed = _renamed_prefill("s5000-v2")
    # The new Deployment is not applied yet (or the apiserver refused it): nothing goes.
    first = plan_children(renamed, children, [])
    assert first.delete == []
    assert ("Deployment", "glm-hetero-prefill-s5000-v2") in [
        (m["kind"], m["metadata"]["name"]) for m in first.apply
    ]
    # Applied but not Ready while the old one serves: still nothing goes.
    children.update(applied(first))
    _set_ready(children, "glm-hetero-prefill-s5000-v2", 0)
    assert plan_children(renamed, children, []).delete == []
    # Ready: the old pool's Deployment and budget go, and nothing else.
    _set_ready(children, "glm-hetero-prefill-s5000-v2", 1)
    assert sorted((r.kind, r.name) for r in plan_children(renamed, children, []).delete) == [
        ("Deployment", old),
        ("PodDisruptionBudget", old),
    ]


def test_renamed_pool_that_serves_nothing_goes_once_its_replacement_exists():
    children = applied(plan_children(hetero(), {}, []))
    renamed = _renamed_prefill("s5000-v2")
    children.update(applied(plan_children(renamed, children, [])))
    deleted = {r.name for r in plan_children(renamed, children, []).delete}
    assert deleted == {"glm-hetero-prefill-s5000"}


def test_disabling_the_disruption_budget_deletes_only_the_budgets():
    spill = load_sample(ROOT / "config" / "samples" / "multipool-spillover.yaml")
    spill["metadata"].update(namespace="ns", uid="u", generation=1)
    children = applied(plan_children(parse_pddeployment(spill), {}, []))
    spill["spec"]["disruptionBudget"] = {"enabled": False}
    plan = plan_children(parse_pddeployment(spill), children, [])
    assert sorted((r.kind, r.name) for r in plan.delete) == [
        ("PodDisruptionBudget", "glm-spillover-decode-h200"),
        ("PodDisruptionBudget", "glm-spillover-prefill-h200-overflow"),
        ("PodDisruptionBudget", "glm-spillover-prefill-s5000"),
    ]
    # The pools keep running untouched: their Deployments are neither re-applied nor deleted.
    assert plan.apply == []


@pytest.mark.parametrize(
    ("recorded", "decision", "expected"),
    [
        (None, None, 1),  # min
        ("3", None, 3),  # the recorded decision survives a restart
        ("9", None, 4),  # clamped to the new max
        ("3", 2, 2),  # a fresh decision wins
        (None, 0, 1),  # clamped to min
    ],
)
def test_replicas_come_from_decision_record_or_min(recorded, decision, expected):
    children = applied(plan_children(hetero(), {}, []))
    key = ("apps/v1", "Deployment", "glm-hetero-prefill-s5000")
    if recorded:
        children[key]["metadata"]["annotations"][ANNOTATION_DESIRED_REPLICAS] = recorded
    decisions = {("prefill", "s5000"): decision} if decision is not None else None
    plan = plan_children(hetero(), children, [], decisions)
    assert plan.replicas[("prefill", "s5000")] == expected


def test_pool_that_no_node_can_hold_is_a_problem_and_is_not_rolled_out():
    children = applied(plan_children(hetero(), {}, []))
    body = load_sample(ROOT / "config" / "samples" / "heterogeneous-s5000-h200.yaml")
    body["metadata"].update(namespace="ns", uid="uid-1", generation=2)
    body["spec"]["prefill"]["pools"][0]["accelerator"]["perReplica"] = 16
    nodes = [node("s1", {"mthreads.com/gpu.product": "MTT-S5000"}, "8", "mthreads.com/gpu")]
    plan = plan_children(parse_pddeployment(body), children, nodes)
    assert [p.reason for p in plan.problems] == ["NoNodeFits"]
    assert "16 mthreads.com/gpu" in plan.problems[0].message
    assert all(m["metadata"]["name"] != "glm-hetero-prefill-s5000" for m in plan.apply)


def test_untolerated_taint_makes_a_pool_unplaceable():
    body = load_sample(ROOT / "config" / "samples" / "heterogeneous-s5000-h200.yaml")
    body["metadata"].update(namespace="ns", uid="uid-1", generation=1)
    body["spec"]["prefill"]["pools"][0]["accelerator"]["tolerations"] = []
    nodes = [node("s1", {"mthreads.com/gpu.product": "MTT-S5000"}, "8", "mthreads.com/gpu")]
    assert [p.reason for p in plan_children(parse_pddeployment(body), {}, nodes).problems] == [
        "NoNodeFits"
    ]


def test_no_node_advertising_the_resource_is_not_judged():
    # Node autoscalers add accelerator nodes on demand: an empty view proves nothing.
    assert plan_children(hetero(), {}, []).problems == []


def _status(children, pods=(), problems=(), previous=None, now=NOW):
    plan = plan_children(hetero(), children, [])
    return compute_status(
        hetero(),
        children=children,
        pods=list(pods),
        replicas=plan.replicas,
        problems=list(problems),
        previous=previous or {},
        now=now,
    )


def _ready(children):
    for obj in children.values():
        if obj["kind"] == "Deployment":
            n = obj["spec"]["replicas"]
            obj["status"] = {
                "observedGeneration": 1,
                "replicas": n,
                "updatedReplicas": n,
                "readyReplicas": n,
            }
    return children


def conditions(status) -> dict[str, tuple[str, str]]:
    return {c["type"]: (c["status"], c["reason"]) for c in status["conditions"]}


def test_status_is_ready_when_every_pool_is_rolled_out():
    children = _ready(applied(plan_children(hetero(), {}, [])))
    status, events = _status(children)
    assert conditions(status)["Ready"] == ("True", "AllPoolsReady")
    assert conditions(status)["Reconciling"][0] == "False"
    assert conditions(status)["Stalled"][0] == "False"
    assert status["replicaSummary"] == {"prefill": "1/1", "decode": "1/1"}
    assert status["observedGeneration"] == 1
    assert events == []


def test_status_counts_unschedulable_pods_and_keeps_reconciling():
    children = applied(plan_children(hetero(), {}, []))
    pods = [PodSummary("p1", "prefill", "s5000", ready=False, unschedulable=True)]
    status, _ = _status(children, pods)
    assert conditions(status)["Reconciling"] == ("True", "PodsNotReady")
    assert conditions(status)["PodsSchedulable"] == ("False", "Unschedulable")
    prefill = next(p for p in status["pools"] if p["role"] == "prefill")
    assert prefill["unschedulableReplicas"] == 1
    assert (
        "prefill/s5000 0/1 ready (1 unschedulable)"
        in dict((c["type"], c["message"]) for c in status["conditions"])["Reconciling"]
    )


def test_image_pull_failure_stalls_with_a_warning_once():
    children = applied(plan_children(hetero(), {}, []))
    pods = [PodSummary("d1", "decode", "h200", False, False, image_problem="ImagePullBackOff")]
    status, events = _status(children, pods)
    assert conditions(status)["Stalled"] == ("True", "ImageUnavailable")
    assert [(e.type, e.reason) for e in events] == [("Warning", "Stalled")]
    again, repeat_events = _status(children, pods, previous=status, now=LATER)
    assert repeat_events == []
    assert again["conditions"] == status["conditions"]  # transition times kept


def test_router_pods_refused_by_the_apiserver_stall_in_the_router_s_words():
    children = applied(plan_children(hetero(), {}, []))
    router = next(key for key in children if key[1] == "Deployment" and key[2].endswith("-router"))
    refused = 'pods "glm-hetero-router-x" is forbidden: violates PodSecurity "restricted:latest"'
    children[router]["status"] = {
        "conditions": [
            {
                "type": "ReplicaFailure",
                "status": "True",
                "reason": "FailedCreate",
                "message": refused,
            }
        ]
    }
    status, _ = _status(children, [])
    assert conditions(status)["Stalled"] == ("True", "ReplicaFailure")
    assert (
        f"router: {refused}"
        in dict((c["type"], c["message"]) for c in status["conditions"])["Stalled"]
    )


def test_recovery_posts_a_normal_event_and_moves_the_transition_time():
    children = _ready(applied(plan_children(hetero(), {}, [])))
    pods = [PodSummary("d1", "decode", "h200", False, False, image_problem="ErrImagePull")]
    stalled, _ = _status(children, pods)
    recovered, events = _status(children, [], previous=stalled, now=LATER)
    assert [(e.type, e.reason) for e in events] == [("Normal", "Recovered")]
    ready = next(c for c in recovered["conditions"] if c["type"] == "Ready")
    assert ready["status"] == "True" and ready["lastTransitionTime"] == LATER


def test_status_keeps_the_autoscalers_fields():
    children = _ready(applied(plan_children(hetero(), {}, [])))
    previous = {"observed": {"ttftMilliseconds": 900}, "lastDecision": {"reason": "x"}}
    status, _ = _status(children, previous=previous)
    assert status["observed"] == {"ttftMilliseconds": 900}
    assert status["lastDecision"] == {"reason": "x"}


def test_invalid_stored_spec_stalls_and_keeps_pool_status():
    previous = {"pools": [{"role": "prefill", "name": "s5000", "readyReplicas": 2}]}
    status, events = invalid_spec_status(3, ["spec.model.engine: bad"], previous, NOW)
    assert conditions(status)["Stalled"] == ("True", "InvalidSpec")
    assert conditions(status)["Ready"] == ("False", "InvalidSpec")
    assert status["pools"] == previous["pools"] and status["observedGeneration"] == 3
    assert events[0].reason == "Stalled"


@pytest.mark.parametrize(
    ("desired", "actual", "expected"),
    [
        ({"a": 1}, {"a": 1, "b": 2}, True),
        ({"a": 1}, {"a": 2}, False),
        ({"a": [{"x": 1}]}, {"a": [{"x": 1, "y": 2}]}, True),
        ({"a": [1, 2]}, {"a": [1]}, False),
        ({"memory": "1Gi"}, {"memory": "1024Mi"}, True),
        ({"a": {"b": 1}}, {"a": None}, False),
    ],
)
def test_is_subset(desired, actual, expected):
    assert is_subset(desired, actual) is expected


def scale_record(to: int, time: str = NOW) -> ScaleRecord:
    decided = {"time": time, "prefillReplicas": to, "decodeReplicas": 1,
               "reason": "TTFT above target", "limitedBy": "none"}  # fmt: skip
    return ScaleRecord("prefill", "s5000", 1, to, decided)


def test_the_apply_that_scales_a_pool_records_the_decision_and_later_ones_keep_it():
    pdd = hetero()
    children = applied(plan_children(pdd, {}, []))
    prefill = ("apps/v1", "Deployment", "glm-hetero-prefill-s5000")
    assert ANNOTATION_LAST_SCALE not in children[prefill]["metadata"]["annotations"]
    replicas = {("prefill", "s5000"): 2, ("decode", "h200"): 1}
    scale = DecidedReplicas(replicas, {("prefill", "s5000"): scale_record(2)})
    plan = plan_children(pdd, children, [], scale)
    assert [child_key(m) for m in plan.apply] == [prefill]  # one write: replicas and record
    annotations = plan.apply[0]["metadata"]["annotations"]
    assert plan.apply[0]["spec"]["replicas"] == 2
    assert ScaleRecord.from_json(annotations[ANNOTATION_LAST_SCALE]) == scale_record(2)
    assert plan.events == []  # a decision, not drift
    children |= applied(plan)
    # The same decision handed out again, then decisions that change nothing: no write, and the
    # record stays (an apply without it would drop it).
    assert plan_children(pdd, children, [], scale).apply == []
    assert plan_children(pdd, children, [], replicas).apply == []
    repeated = DecidedReplicas(replicas, {("prefill", "s5000"): scale_record(2, LATER)})
    assert plan_children(pdd, children, [], repeated).apply == []
    children[prefill]["spec"]["replicas"] = 5  # kubectl scale
    restored = plan_children(pdd, children, [], replicas).apply[0]["metadata"]["annotations"]
    assert restored[ANNOTATION_LAST_SCALE] == annotations[ANNOTATION_LAST_SCALE]


def test_a_huge_invalid_value_gives_a_bounded_condition_message():
    # The models' error repeats the value; a condition message over 32,768 characters would
    # make the status write fail, and the object could never show Stalled.
    status, _ = invalid_spec_status(1, ["spec.model.engine: " + "x" * 40_000], {}, NOW)
    stalled = next(c for c in status["conditions"] if c["type"] == "Stalled")
    assert len(stalled["message"]) == 4096
    assert stalled["message"].startswith("invalid spec: spec.model.engine: xxx")
    assert stalled["message"].endswith("more characters)")


def test_a_profile_name_that_matches_no_profile_is_a_condition_and_one_event():
    children = _ready(applied(plan_children(hetero(), {}, [])))
    status, _ = _status(children)
    assert conditions(status)["ProfilesKnown"] == ("True", "AsExpected")

    document = load_sample(ROOT / "config" / "samples" / "heterogeneous-s5000-h200.yaml")
    document["metadata"].update(namespace="ns", uid="uid-1", generation=1)
    document["spec"]["decode"]["pools"][0]["accelerator"]["profile"] = "h2oo"
    typo = parse_pddeployment(document)
    plan = plan_children(typo, children, [])
    status, events = compute_status(
        typo,
        children=children,
        pods=[],
        replicas=plan.replicas,
        problems=[],
        previous={},
        now=NOW,
    )
    assert conditions(status)["ProfilesKnown"] == ("False", "UnknownProfile")
    message = {c["type"]: c["message"] for c in status["conditions"]}["ProfilesKnown"]
    assert message.startswith("spec.decode.pools[0].accelerator.profile 'h2oo' matches no")
    assert "h200" in message and "learned online" in message
    assert [(e.type, e.reason) for e in events] == [("Warning", "UnknownProfile")]
    # Serving is not stopped for it: the object is Ready, and the warning is said once.
    assert conditions(status)["Ready"] == ("True", "AllPoolsReady")
    _, again = compute_status(
        typo,
        children=children,
        pods=[],
        replicas=plan.replicas,
        problems=[],
        previous=status,
        now=NOW,
    )
    assert again == []


def test_a_pool_whose_devices_no_node_with_its_cards_offers_is_unplaceable():
    body = load_sample(ROOT / "config" / "samples" / "heterogeneous-s5000-h200.yaml")
    body["metadata"].update(namespace="ns", uid="uid-1", generation=1)
    accelerator = body["spec"]["decode"]["pools"][0]["accelerator"]
    accelerator["devices"] = {"rdma/hca": 2}
    gpu = {"nvidia.com/gpu.product": "NVIDIA-H200"}
    with_gpus = node("g1", gpu, "8")
    with_hca = summarize_node(
        {
            "metadata": {"name": "r1", "labels": {}},
            "spec": {},
            "status": {
                "allocatable": {"rdma/hca": "4"},
                "conditions": [{"type": "Ready", "status": "True"}],
            },
        }
    )
    # Nothing advertises the HCA: nothing can be judged (its nodes may be added on demand).
    assert unplaceable(parse_pddeployment(body).spec.decode.pools[0], [with_gpus]) is None
    # Some node has HCAs, but none with the cards: no node can hold a replica.
    why = unplaceable(parse_pddeployment(body).spec.decode.pools[0], [with_gpus, with_hca])
    assert why is not None and "and 2 rdma/hca per replica" in why
    both = summarize_node(
        {
            "metadata": {"name": "g2", "labels": gpu},
            "spec": {},
            "status": {
                "allocatable": {"nvidia.com/gpu": "8", "rdma/hca": "2"},
                "conditions": [{"type": "Ready", "status": "True"}],
            },
        }
    )
    assert unplaceable(parse_pddeployment(body).spec.decode.pools[0], [with_gpus, both]) is None


def test_pool_observations_say_which_nodes_each_pool_runs_on() -> None:
    # spec.placement's Required domain is read from where the pools' pods are bound.
    pods = [
        PodSummary("p1", "prefill", "s5000", ready=True, unschedulable=False, node_name="n1"),
        PodSummary("p2", "prefill", "s5000", ready=False, unschedulable=False),  # not bound yet
        PodSummary("d1", "decode", "h200", ready=True, unschedulable=False, node_name="n2"),
    ]
    observed = pool_observations(hetero(), {}, pods)
    assert observed[("prefill", "s5000")].nodes == frozenset({"n1"})
    assert observed[("decode", "h200")].nodes == frozenset({"n2"})
