"""What GitOps tools conclude from a PDDeployment's status, given what the operator writes.

Argo CD: deploy/argocd/health.lua runs in a real Lua 5.1 interpreter (lupa), the language
version of Argo CD's gopher-lua. Flux: kstatus' documented rules (sigs.k8s.io/cli-utils
pkg/kstatus), implemented below, applied to statuses that core/status.py computes.
"""

import copy
from pathlib import Path
from typing import Any

import lupa.lua51 as lua51
import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from pd_operator.api import parse_pddeployment
from pd_operator.core import reasons
from pd_operator.core.children import child_key
from pd_operator.core.observe import PodSummary
from pd_operator.core.reconcile import Problem, plan_children
from pd_operator.core.status import compute_status, invalid_spec_status
from pdcases import ROOT, load_sample, minimal
from schema_tools import apply_defaults, crd_schema

ARGOCD = ROOT / "deploy" / "argocd"
HEALTH_LUA = (ARGOCD / "health.lua").read_text()
NOW, LATER = "2026-11-30T00:00:00Z", "2026-11-30T00:05:00Z"
SAMPLE = load_sample(ROOT / "config" / "samples" / "heterogeneous-s5000-h200.yaml")
POOLS = (("prefill", "s5000"), ("decode", "h200"))


def argocd_health(obj: dict[str, Any]) -> dict[str, str]:
    """Run health.lua the way Argo CD does: `obj` is a global, the chunk returns a table."""
    lua = lua51.LuaRuntime(unpack_returned_tuples=True)
    lua.globals().obj = lua.table_from(obj, recursive=True)
    result = lua.execute(HEALTH_LUA)
    return {"status": result["status"], "message": result["message"]}


def kstatus(obj: dict[str, Any]) -> str:
    """kstatus' generic rules for a custom resource, in their documented order."""
    if obj["metadata"].get("deletionTimestamp"):
        return "Terminating"
    status = obj.get("status") or {}
    generation = obj["metadata"].get("generation")
    observed = status.get("observedGeneration")
    if generation is not None and observed is not None and observed != generation:
        return "InProgress"
    for condition in status.get("conditions") or []:
        if condition["type"] == "Reconciling" and condition["status"] == "True":
            return "InProgress"
        if condition["type"] == "Stalled" and condition["status"] == "True":
            return "Failed"
    # No standard condition says otherwise: kstatus assumes the resource is current.
    return "Current"


# --- statuses as the operator computes them -----------------------------------------------


def pdd(generation: int = 1):
    document = copy.deepcopy(SAMPLE)
    document["metadata"].update(namespace="llm", uid="uid-1", generation=generation)
    return parse_pddeployment(document)


def children(ready: tuple[bool, bool] = (False, False), router: bool | None = None) -> dict:
    """The children as applied; the pools' and the router's Deployments Ready or not (the router
    is Ready with the pools unless told)."""
    plan = plan_children(pdd(), {}, [])
    result = {}
    for manifest in plan.apply:
        obj = copy.deepcopy(manifest)
        obj["metadata"]["generation"] = 1
        result[child_key(obj)] = obj
    names = [f"glm-hetero-{role}-{pool}" for role, pool in POOLS] + ["glm-hetero-router"]
    states = [*ready, all(ready) if router is None else router]
    for name, is_ready in zip(names, states, strict=True):
        deployment = result[("apps/v1", "Deployment", name)]
        n = deployment["spec"]["replicas"] if is_ready else 0
        deployment["status"] = {
            "observedGeneration": 1,
            "replicas": deployment["spec"]["replicas"],
            "updatedReplicas": deployment["spec"]["replicas"],
            "readyReplicas": n,
        }
    return result


def status_of(
    ready=(False, False), pods=(), problems=(), previous=None, now=NOW, router=None
) -> dict[str, Any]:
    plan = plan_children(pdd(), {}, [])
    status, _ = compute_status(
        pdd(),
        children=children(ready, router),
        pods=list(pods),
        replicas=plan.replicas,
        problems=list(problems),
        previous=previous or {},
        now=now,
    )
    return status


def pdd_object(status: dict[str, Any] | None, generation: int = 1) -> dict[str, Any]:
    obj = copy.deepcopy(SAMPLE)
    obj["metadata"].update(namespace="llm", generation=generation)
    if status is not None:
        obj["status"] = status
    return obj


UNSCHEDULABLE = PodSummary("p-1", "prefill", "s5000", ready=False, unschedulable=True)
IMAGE_PULL = PodSummary("d-1", "decode", "h200", False, False, image_problem="ImagePullBackOff")
NO_NODE = Problem(reasons.NO_NODE_FITS, "prefill pool s5000: no node offers 16 mthreads.com/gpu")

# scenario -> (object as stored, Argo CD health, kstatus)
SCENARIOS: dict[str, tuple[dict[str, Any], str, str]] = {
    "all pools ready": (pdd_object(status_of((True, True))), "Healthy", "Current"),
    "first visit, pods starting": (pdd_object(status_of()), "Progressing", "InProgress"),
    "pools ready, router not yet": (
        pdd_object(status_of((True, True), router=False)),
        "Progressing",
        "InProgress",
    ),
    "one pool ready": (pdd_object(status_of((True, False))), "Progressing", "InProgress"),
    "pods unschedulable": (
        pdd_object(status_of(pods=[UNSCHEDULABLE])),
        "Progressing",
        "InProgress",
    ),
    "spec changed, not yet observed": (
        pdd_object(status_of((True, True)), generation=2),
        "Progressing",
        "InProgress",
    ),
    "image cannot be pulled": (
        pdd_object(status_of((True, False), pods=[IMAGE_PULL])),
        "Degraded",
        "Failed",
    ),
    "no node fits": (pdd_object(status_of(problems=[NO_NODE])), "Degraded", "Failed"),
    "stored spec invalid": (
        pdd_object(
            invalid_spec_status(1, ["spec.model.engine: bad"], status_of((True, True)), NOW)[0]
        ),
        "Degraded",
        "Failed",
    ),
    "recovered": (
        pdd_object(status_of((True, True), previous=status_of(pods=[IMAGE_PULL]), now=LATER)),
        "Healthy",
        "Current",
    ),
}


# --- Argo CD --------------------------------------------------------------------------------


def argocd_cases() -> list[tuple[str, dict[str, str]]]:
    tests = yaml.safe_load((ARGOCD / "health_test.yaml").read_text())["tests"]
    return [(case["inputPath"], case["healthStatus"]) for case in tests]


@pytest.mark.parametrize(("input_path", "expected"), argocd_cases())
def test_argocd_health_check_cases(input_path, expected):
    obj = yaml.safe_load((ARGOCD / input_path).read_text())
    assert argocd_health(obj) == expected


def test_argocd_cases_cover_every_health_the_script_returns():
    statuses = {expected["status"] for _, expected in argocd_cases()}
    assert statuses == {"Healthy", "Progressing", "Degraded"}
    assert {Path(p).name for p, _ in argocd_cases()} == {
        p.name for p in (ARGOCD / "testdata").glob("*.yaml")
    }


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_argocd_health_of_what_the_operator_writes(scenario):
    obj, health, _ = SCENARIOS[scenario]
    result = argocd_health(obj)
    assert result["status"] == health
    assert result["message"]


def test_argocd_shows_the_operators_reason_to_the_user():
    obj, _, _ = SCENARIOS["image cannot be pulled"]
    assert "ImagePullBackOff" in argocd_health(obj)["message"]
    obj, _, _ = SCENARIOS["pods unschedulable"]
    assert "unschedulable" in argocd_health(obj)["message"]
    obj, _, _ = SCENARIOS["spec changed, not yet observed"]
    assert "generation 2" in argocd_health(obj)["message"]


def test_argocd_waits_for_the_operator_on_a_new_object():
    assert argocd_health(pdd_object(None))["status"] == "Progressing"
    assert argocd_health(pdd_object({"conditions": []}))["status"] == "Progressing"


# --- Flux (kstatus) -------------------------------------------------------------------------


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_kstatus_result_of_what_the_operator_writes(scenario):
    obj, health, expected = SCENARIOS[scenario]
    assert kstatus(obj) == expected
    # Both tools agree on every state the operator reports.
    assert {"Healthy": "Current", "Progressing": "InProgress", "Degraded": "Failed"}[
        health
    ] == expected


def test_kstatus_terminating_while_being_deleted():
    obj, _, _ = SCENARIOS["all pools ready"]
    obj = copy.deepcopy(obj)
    obj["metadata"]["deletionTimestamp"] = LATER
    assert kstatus(obj) == "Terminating"


pool_state = st.tuples(
    st.booleans(),  # the pool's Deployment is rolled out and ready
    st.integers(0, 2),  # unschedulable pods
    st.sampled_from([None, "ErrImagePull", "ImagePullBackOff"]),
)


@settings(max_examples=150, deadline=None)
@given(
    pools=st.tuples(pool_state, pool_state),
    no_node_fits=st.booleans(),
    previous_stalled=st.booleans(),
)
def test_status_always_satisfies_kstatus_conventions(pools, no_node_fits, previous_stalled):
    pods = []
    for (role, pool), (_, unschedulable, image) in zip(POOLS, pools, strict=True):
        pods += [PodSummary(f"{role}-u{i}", role, pool, False, True) for i in range(unschedulable)]
        if image:
            pods.append(PodSummary(f"{role}-i", role, pool, False, False, image_problem=image))
    previous = status_of(pods=[IMAGE_PULL]) if previous_stalled else None
    status = status_of(
        ready=tuple(p[0] for p in pools),
        pods=pods,
        problems=[NO_NODE] if no_node_fits else [],
        previous=previous,
        now=LATER,
    )
    obj = pdd_object(status)
    conditions = {c["type"]: c for c in status["conditions"]}
    true = [
        kind for kind in ("Ready", "Reconciling", "Stalled") if conditions[kind]["status"] == "True"
    ]
    # Exactly one of the three describes the object: settled, progressing or stuck.
    assert len(true) == 1, true
    # Every condition speaks about the generation the status speaks about.
    assert status["observedGeneration"] == obj["metadata"]["generation"]
    assert {c["observedGeneration"] for c in status["conditions"]} == {status["observedGeneration"]}
    # metav1.Condition shape: a CamelCase reason, a status string, a transition time.
    for condition in status["conditions"]:
        assert condition["status"] in ("True", "False")
        assert condition["reason"][:1].isupper() and condition["reason"].isalnum()
        assert condition["lastTransitionTime"] in (NOW, LATER)
    # What Flux concludes matches what the operator means.
    expected = {"Ready": "Current", "Reconciling": "InProgress", "Stalled": "Failed"}[true[0]]
    assert kstatus(obj) == expected
    assert (
        argocd_health(obj)["status"]
        == {
            "Current": "Healthy",
            "InProgress": "Progressing",
            "Failed": "Degraded",
        }[expected]
    )


def test_kstatus_does_not_call_a_new_object_current():
    document = minimal()
    document["metadata"].update(namespace="llm", generation=1)
    stored = apply_defaults(crd_schema(), document)  # what the apiserver stores and returns
    assert kstatus(stored) == "InProgress"
