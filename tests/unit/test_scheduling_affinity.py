"""Required podAffinity in the mock scheduler's fit logic, as kube-scheduler's InterPodAffinity
filter: a pod goes only to a domain where a pod its term selects runs, and the first pod of a
self-affine set goes anywhere."""

from typing import Any

from pd_operator.core.scheduling import (
    REASON_POD_AFFINITY,
    NodeFacts,
    PodGroup,
    milli,
    pod_demand,
    schedule,
)

GPU = "nvidia.com/gpu"
RACK = "example.com/rack"
TEAM = {"team": "a"}


def node(name: str, rack: str | None, cards: int = 8) -> NodeFacts:
    return NodeFacts(
        name=name,
        labels={RACK: rack} if rack else {},
        allocatable={"pods": milli(110), GPU: milli(cards)},
    )


def pod(cards: int = 4, labels: dict[str, str] | None = None, *, affine: bool = True) -> dict:
    spec: dict[str, Any] = {
        "containers": [{"name": "engine", "resources": {"requests": {GPU: str(cards)}}}]
    }
    if affine:
        term = {"labelSelector": {"matchLabels": TEAM}, "topologyKey": RACK}
        spec["affinity"] = {
            "podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [term]}
        }
    return {"metadata": {"name": "p", "namespace": "ns", "labels": labels or TEAM}, "spec": spec}


def identity(labels: dict[str, str] | None = None, namespace: str = "ns") -> tuple[str, dict]:
    return namespace, labels or TEAM


def place(pods: list[dict], nodes: list[NodeFacts], residents=None, groups=None):
    keyed = [(f"p{i}", pod_demand(p)) for i, p in enumerate(pods)]
    identities = {
        f"p{i}": (p["metadata"]["namespace"], p["metadata"]["labels"]) for i, p in enumerate(pods)
    }
    return schedule(
        keyed, nodes, {}, groups=groups, residents=residents or {}, identities=identities
    )


def test_the_term_is_read_with_the_pods_namespace_and_whether_it_matches_itself():
    demand = pod_demand(pod())
    (term,) = demand.pod_affinity
    assert (term.topology_key, term.namespaces, term.match_labels) == (
        RACK,
        ("ns",),
        (("team", "a"),),
    )
    assert demand.self_affine
    assert not pod_demand(pod(labels={"team": "b"})).self_affine
    assert pod_demand(pod(affine=False)).pod_affinity == ()


def test_pods_go_only_to_the_domain_where_a_selected_pod_runs():
    nodes = [node("a1", "a"), node("b1", "b")]
    # b1 runs a selected pod; a1 would otherwise win (first by name, equally empty).
    decisions = place([pod(), pod()], nodes, residents={"b1": [identity()]})
    assert [d.node for d in decisions] == ["b1", "b1"]


def test_a_pod_in_another_namespace_or_with_other_labels_does_not_count():
    nodes = [node("a1", "a"), node("b1", "b")]
    others = {"b1": [identity(namespace="other"), identity({"team": "b"})]}
    # No selected pod anywhere: a self-affine pod may go to any labelled node.
    assert [d.node for d in place([pod()], nodes, residents=others)] == ["a1"]


def test_the_first_pod_lands_anywhere_and_the_rest_follow_it_into_its_domain():
    nodes = [node("a1", "a"), node("b1", "b"), node("b2", "b")]
    decisions = place([pod(8), pod(8), pod(8)], nodes)
    assert [d.node for d in decisions[:1]] == ["a1"]
    # Rack a is full; rack b has room, but no pod of the set runs there.
    assert decisions[1].node is None and decisions[2].node is None
    assert decisions[1].message == (
        f"0/3 nodes are available: 1 Insufficient {GPU}, 2 {REASON_POD_AFFINITY}."
    )


def test_nodes_without_the_topology_label_never_qualify():
    decisions = place([pod()], [node("x1", None), node("b1", "b", cards=16)])
    assert decisions[0].node == "b1"
    alone = place([pod()], [node("x1", None)])
    assert alone[0].node is None and REASON_POD_AFFINITY in alone[0].message


def test_a_pod_that_does_not_match_its_own_term_waits_for_one_that_does():
    nodes = [node("a1", "a")]
    (decision,) = place([pod(labels={"team": "b"})], nodes)
    assert decision.node is None
    assert decision.message == f"0/1 nodes are available: 1 {REASON_POD_AFFINITY}."
    (decision,) = place([pod(labels={"team": "b"})], nodes, residents={"a1": [identity()]})
    assert decision.node == "a1"


def test_a_group_is_placed_in_one_domain_and_a_failed_group_leaves_no_trace():
    nodes = [node("a1", "a"), node("a2", "a"), node("b1", "b")]
    group = PodGroup("g", 2)
    decisions = place([pod(8), pod(8)], nodes, groups={"p0": group, "p1": group})
    assert [d.node for d in decisions] == ["a1", "a2"]
    # A group of three 8-card pods fits nowhere: none is bound, and the pod after it is not
    # drawn to the rack where the group's first pod was tried (a1: the fullest fit).
    nodes = [node("a1", "a"), node("b1", "b", cards=16)]
    big = PodGroup("big", 3)
    decisions = place(
        [pod(8), pod(8), pod(8), pod(16)], nodes, groups={"p0": big, "p1": big, "p2": big}
    )
    assert [d.node for d in decisions] == [None, None, None, "b1"]
