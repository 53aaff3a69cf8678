"""Fit logic of the mock scheduler: filters, their order, packing, and kube-scheduler's words."""

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pd_operator.api import parse_pddeployment
from pd_operator.core.children import build_deployment
from pd_operator.core.scheduling import (
    REASON_AFFINITY,
    REASON_TAINT,
    REASON_TOO_MANY_PODS,
    REASON_UNSCHEDULABLE,
    Decision,
    NodeFacts,
    PodDemand,
    PodGroup,
    Requirement,
    Taint,
    Toleration,
    milli,
    node_facts,
    packing_score,
    pod_demand,
    pod_group,
    pod_requests,
    resource_reasons,
    schedule,
    static_reason,
    unschedulable_message,
)
from pd_tools.simcluster.nodes import build_node
from pd_tools.simcluster.profile import load_profile
from pdcases import ROOT, load_sample

GPU = "mthreads.com/gpu"
S5000 = {"mthreads.com/gpu.product": "MTT-S5000"}


def node(
    name: str,
    cards: int = 8,
    *,
    labels: dict[str, str] | None = None,
    taints: tuple[Taint, ...] = (),
    cpu: str = "64",
    unschedulable: bool = False,
    pods: int = 110,
) -> NodeFacts:
    return NodeFacts(
        name=name,
        labels=labels or {},
        taints=taints,
        allocatable={
            "cpu": milli(cpu),
            "memory": milli("512Gi"),
            "pods": milli(pods),
            GPU: milli(cards),
        },
        unschedulable=unschedulable,
    )


def pod(
    cards: int = 8,
    *,
    cpu: str | None = None,
    selector: dict[str, str] | None = None,
    tolerations: list[dict[str, Any]] | None = None,
    affinity: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    requests: dict[str, str] = {GPU: str(cards)} if cards else {}
    if cpu:
        requests["cpu"] = cpu
    spec: dict[str, Any] = {"containers": [{"name": "engine", "resources": {"requests": requests}}]}
    if selector:
        spec["nodeSelector"] = selector
    if tolerations:
        spec["tolerations"] = tolerations
    if affinity is not None:
        spec["affinity"] = {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": affinity}
            }
        }
    return {"metadata": {"name": "p", "namespace": "ns"}, "spec": spec}


def demand(**kwargs: Any) -> PodDemand:
    return pod_demand(pod(**kwargs))


GPU_TAINT = Taint(GPU, "", "NoSchedule")
TOLERATE_GPU = [{"key": GPU, "operator": "Exists", "effect": "NoSchedule"}]


@pytest.mark.parametrize(
    ("toleration", "taint", "tolerated"),
    [
        (Toleration(GPU, "Exists", "", "NoSchedule"), GPU_TAINT, True),
        (Toleration(GPU, "Exists"), GPU_TAINT, True),  # no effect: every effect
        (Toleration(GPU, "Exists", "", "NoExecute"), GPU_TAINT, False),
        (Toleration("", "Exists"), Taint("anything", "x", "NoExecute"), True),
        (Toleration("", "Equal"), GPU_TAINT, False),  # an empty key needs Exists
        (Toleration("dedicated", "Equal", "prefill"), Taint("dedicated", "prefill"), True),
        (Toleration("dedicated", "Equal", "decode"), Taint("dedicated", "prefill"), False),
        (Toleration("other", "Exists"), GPU_TAINT, False),
    ],
)
def test_toleration_matching_follows_core_v1(toleration, taint, tolerated):
    assert toleration.tolerates(taint) is tolerated


@pytest.mark.parametrize(
    ("requirement", "labels", "matches"),
    [
        (Requirement("zone", "In", ("a", "b")), {"zone": "b"}, True),
        (Requirement("zone", "In", ("a",)), {"zone": "b"}, False),
        (Requirement("zone", "In", ("a",)), {}, False),
        (Requirement("zone", "NotIn", ("a",)), {"zone": "b"}, True),
        (Requirement("zone", "NotIn", ("a",)), {}, True),  # absent label is not in any set
        (Requirement("zone", "NotIn", ("a",)), {"zone": "a"}, False),
        (Requirement("zone", "Exists"), {"zone": ""}, True),
        (Requirement("zone", "Exists"), {}, False),
        (Requirement("zone", "DoesNotExist"), {}, True),
        (Requirement("zone", "DoesNotExist"), {"zone": "a"}, False),
        (Requirement("cards", "Gt", ("4",)), {"cards": "8"}, True),
        (Requirement("cards", "Gt", ("8",)), {"cards": "8"}, False),
        (Requirement("cards", "Lt", ("8",)), {"cards": "4"}, True),
        (Requirement("cards", "Lt", ("8",)), {"cards": "many"}, False),
        (Requirement("cards", "Gt", ("4",)), {}, False),
    ],
)
def test_node_selector_requirements(requirement, labels, matches):
    assert requirement.matches(labels) is matches


@pytest.mark.parametrize(
    ("case", "pod_kwargs", "node_kwargs", "reason"),
    [
        ("fits", {"selector": S5000, "tolerations": TOLERATE_GPU},
         {"labels": S5000, "taints": (GPU_TAINT,)}, None),
        ("untolerated taint", {"selector": S5000}, {"labels": S5000, "taints": (GPU_TAINT,)},
         REASON_TAINT),
        ("PreferNoSchedule never blocks", {}, {"taints": (Taint(GPU, "", "PreferNoSchedule"),)},
         None),
        ("NoExecute blocks", {}, {"taints": (Taint("evict", "", "NoExecute"),)}, REASON_TAINT),
        ("selector mismatch", {"selector": S5000}, {"labels": {"other": "x"}}, REASON_AFFINITY),
        ("taint is checked before the selector", {"selector": S5000},
         {"labels": {}, "taints": (GPU_TAINT,)}, REASON_TAINT),
        ("cordoned", {}, {"unschedulable": True}, REASON_UNSCHEDULABLE),
        ("cordon checked before taints", {}, {"unschedulable": True, "taints": (GPU_TAINT,)},
         REASON_UNSCHEDULABLE),
        ("cordon tolerated",
         {"tolerations": [{"key": "node.kubernetes.io/unschedulable", "operator": "Exists"}]},
         {"unschedulable": True}, None),
        ("affinity In matches",
         {"affinity": [{"matchExpressions": [
             {"key": "mthreads.com/gpu.product", "operator": "In", "values": ["MTT-S5000"]}]}]},
         {"labels": S5000}, None),
        ("affinity DoesNotExist fails",
         {"affinity": [{"matchExpressions": [
             {"key": "mthreads.com/gpu.product", "operator": "DoesNotExist"}]}]},
         {"labels": S5000}, REASON_AFFINITY),
        ("any term may match",
         {"affinity": [
             {"matchExpressions": [{"key": "x", "operator": "Exists"}]},
             {"matchExpressions": [{"key": "mthreads.com/gpu.product", "operator": "Exists"}]}]},
         {"labels": S5000}, None),
        ("an empty term matches nothing", {"affinity": [{}]}, {}, REASON_AFFINITY),
        ("matchFields on the node name",
         {"affinity": [{"matchFields": [
             {"key": "metadata.name", "operator": "NotIn", "values": ["n1"]}]}]},
         {}, REASON_AFFINITY),
        ("selector and affinity must both hold",
         {"selector": {"other": "x"},
          "affinity": [{"matchExpressions": [{"key": "mthreads.com/gpu.product",
                                              "operator": "Exists"}]}]},
         {"labels": S5000}, REASON_AFFINITY),
    ],
)  # fmt: skip
def test_static_filters_in_kube_scheduler_order(case, pod_kwargs, node_kwargs, reason):
    assert static_reason(demand(**pod_kwargs), node("n1", **node_kwargs)) == reason, case


def test_resource_reasons_name_every_shortage_in_kube_scheduler_order():
    full = node("n1", cards=8, cpu="4", pods=1)
    used = {GPU: milli(4), "cpu": milli(3), "pods": milli(1)}
    reasons = resource_reasons(demand(cards=8, cpu="2"), full, used)
    assert reasons == (REASON_TOO_MANY_PODS, "Insufficient cpu", f"Insufficient {GPU}")


def test_a_resource_the_node_lacks_entirely_is_insufficient():
    plain = NodeFacts("plain", allocatable={"cpu": milli(8), "pods": milli(110)})
    assert resource_reasons(demand(cards=1), plain, {}) == (f"Insufficient {GPU}",)


def test_requests_sum_containers_take_the_largest_init_container_and_add_overhead():
    spec = {
        "containers": [
            {"name": "a", "resources": {"requests": {"cpu": "500m", GPU: "4"}}},
            {"name": "b", "resources": {"requests": {"cpu": "1", "memory": "1Gi"}}},
        ],
        "initContainers": [{"name": "load", "resources": {"requests": {"cpu": "3"}}}],
        "overhead": {"memory": "128Mi"},
    }
    assert pod_requests(spec) == {
        "cpu": 3000,
        GPU: 4000,
        "memory": milli("1Gi") + milli("128Mi"),
        "pods": 1000,
    }


@pytest.mark.parametrize(
    ("total", "reasons", "message"),
    [
        (
            6,
            [f"Insufficient {GPU}"] * 4 + [REASON_AFFINITY] * 2,
            f"0/6 nodes are available: 2 {REASON_AFFINITY}, 4 Insufficient {GPU}.",
        ),
        (
            3,
            [REASON_TAINT, f"Insufficient {GPU}", f"Insufficient {GPU}"],
            f"0/3 nodes are available: 1 {REASON_TAINT}, 2 Insufficient {GPU}.",
        ),
        # kube-scheduler sorts the "count reason" strings, so 10 comes before 2.
        (
            12,
            [REASON_TAINT] * 10 + ["Insufficient cpu"] * 2,
            f"0/12 nodes are available: 10 {REASON_TAINT}, 2 Insufficient cpu.",
        ),
        # One node lacking two resources counts under both.
        (
            1,
            ["Insufficient cpu", "Insufficient memory"],
            "0/1 nodes are available: 1 Insufficient cpu, 1 Insufficient memory.",
        ),
        (0, [], "no nodes available to schedule pods"),
    ],
)
def test_unschedulable_message_is_worded_and_sorted_like_kube_scheduler(total, reasons, message):
    assert unschedulable_message(total, reasons) == message


def articles_nodes() -> list[NodeFacts]:
    profile = load_profile(ROOT / "config" / "clusters" / "articles.yaml")
    return [
        node_facts(build_node(group, group.node_name(i), "198.19.0.1", "articles"))
        for group in profile.node_groups
        for i in range(group.count)
    ]


def test_the_articles_cluster_message_when_s5000_cards_run_out():
    nodes = articles_nodes()
    usage = {n.name: {GPU: milli(8), "pods": milli(1)} for n in nodes if GPU in n.allocatable}
    decisions = schedule([("p", demand(selector=S5000, tolerations=TOLERATE_GPU))], nodes, usage)
    assert decisions[0].node is None
    assert decisions[0].message == (
        f"0/6 nodes are available: 2 {REASON_TAINT}, 4 Insufficient {GPU}."
    )


def test_the_operators_own_pods_land_on_the_articles_nodes_of_their_pool():
    document = load_sample(ROOT / "config" / "samples" / "heterogeneous-s5000-h200.yaml")
    document["metadata"].update(namespace="inference", uid="0b6f-uid")
    pdd = parse_pddeployment(document)
    pods = []
    for role in ("prefill", "decode"):
        pool = pdd.spec.pools(role)[0]
        template = build_deployment(pdd, role, pool, 1)["spec"]["template"]
        pods.append((role, pod_demand({"metadata": {}, "spec": template["spec"]})))
    placed = {d.key: d.node for d in schedule(pods, articles_nodes(), {})}
    assert placed == {"prefill": "s5000-0", "decode": "h200-0"}


def test_accelerator_pods_are_packed_onto_the_fullest_node_that_fits():
    nodes = [node("a"), node("b"), node("c")]
    usage = {"b": {GPU: milli(2), "pods": milli(1)}}
    decisions = schedule([(f"p{i}", demand(cards=2)) for i in range(4)], nodes, usage)
    # b is fullest; once b is full (2 + 3 x 2 = 8) the next pod starts on a, the first by name.
    assert [d.node for d in decisions] == ["b", "b", "b", "a"]


def test_ties_go_to_the_first_node_by_name_whatever_the_input_order():
    decisions = schedule([("p", demand(cards=8))], [node("z"), node("m"), node("b")], {})
    assert decisions[0].node == "b"


def test_pods_that_do_not_fit_get_the_message_and_later_pods_see_earlier_placements():
    nodes = [node("a"), node("b")]
    decisions = schedule([(f"p{i}", demand(cards=8)) for i in range(3)], nodes, {})
    assert [d.node for d in decisions] == ["a", "b", None]
    assert decisions[2].message == f"0/2 nodes are available: 2 Insufficient {GPU}."


def test_schedule_leaves_the_usage_it_is_given_untouched():
    usage = {"a": {GPU: milli(4), "pods": milli(1)}}
    schedule([("p", demand(cards=4))], [node("a")], usage)
    assert usage == {"a": {GPU: milli(4), "pods": milli(1)}}


@given(
    st.lists(st.integers(min_value=1, max_value=8), max_size=30),
    st.lists(st.integers(min_value=0, max_value=8), min_size=1, max_size=6),
)
def test_schedule_never_overcommits_and_refuses_only_when_nothing_fits(cards, capacities):
    nodes = [node(f"n{i}", cards=c) for i, c in enumerate(capacities)]
    decisions = schedule([(f"p{i}", demand(cards=c)) for i, c in enumerate(cards)], nodes, {})
    free = {n.name: n.allocatable[GPU] for n in nodes}
    for asked, decision in zip(cards, decisions, strict=True):
        if decision.node is None:
            assert all(room < milli(asked) for room in free.values())
        else:
            free[decision.node] -= milli(asked)
            assert free[decision.node] >= 0


def naive_schedule(pods, nodes, usage):
    """The definition `schedule` must match: every pod scans every node."""
    used = {name: dict(u) for name, u in usage.items()}
    placed = []
    for key, want in pods:
        fitting = [
            n
            for n in sorted(nodes, key=lambda n: n.name)
            if static_reason(want, n) is None
            and not resource_reasons(want, n, used.get(n.name, {}))
        ]
        if not fitting:
            placed.append((key, None))
            continue
        best = max(fitting, key=lambda n: packing_score(want, n, used.get(n.name, {})))
        for resource, amount in want.requests:
            used.setdefault(best.name, {})[resource] = (
                used.get(best.name, {}).get(resource, 0) + amount
            )
        placed.append((key, best.name))
    return placed


@settings(max_examples=300)
@given(
    st.lists(st.tuples(st.sampled_from(["s5000", "any"]), st.integers(1, 8)), max_size=20),
    st.lists(
        st.tuples(st.booleans(), st.integers(0, 8), st.integers(0, 8)), min_size=1, max_size=4
    ),
)
def test_schedule_places_every_pod_where_scanning_every_node_would(pods_spec, nodes_spec):
    nodes = [
        node(f"n{i}", cards=cards, labels=S5000 if labelled else {})
        for i, (labelled, cards, _) in enumerate(nodes_spec)
    ]
    usage = {
        f"n{i}": {GPU: milli(min(busy, cards))} for i, (_, cards, busy) in enumerate(nodes_spec)
    }
    pods = [
        (f"p{i}", demand(cards=c, selector=S5000 if kind == "s5000" else None))
        for i, (kind, c) in enumerate(pods_spec)
    ]
    fast = [(d.key, d.node) for d in schedule(pods, nodes, usage)]
    assert fast == naive_schedule(pods, nodes, usage)


def lws_pod(group: str, size: int, cards: int = 8) -> dict[str, Any]:
    body = pod(cards)
    body["metadata"]["labels"] = {"leaderworkerset.sigs.k8s.io/group-key": group}
    body["metadata"]["annotations"] = {"leaderworkerset.sigs.k8s.io/size": str(size)}
    return body


@pytest.mark.parametrize(
    ("labels", "annotations", "expected"),
    [
        ({"leaderworkerset.sigs.k8s.io/group-key": "k"}, {"leaderworkerset.sigs.k8s.io/size": "2"},
         PodGroup("k", 2)),
        ({"leaderworkerset.sigs.k8s.io/group-key": "k"}, {"leaderworkerset.sigs.k8s.io/size": "1"},
         None),
        ({"leaderworkerset.sigs.k8s.io/group-key": "k"}, {}, None),
        ({}, {"leaderworkerset.sigs.k8s.io/size": "2"}, None),
        ({"leaderworkerset.sigs.k8s.io/group-key": "k"}, {"leaderworkerset.sigs.k8s.io/size": "x"},
         None),
    ],
    ids=["group", "size-one", "no-size", "no-key", "bad-size"],
)  # fmt: skip
def test_a_pods_group_is_read_from_lws_labels(labels, annotations, expected):
    body = {"metadata": {"labels": labels, "annotations": annotations}}
    assert pod_group(body) == expected


@pytest.mark.parametrize(
    ("capacities", "groups", "placed"),
    [
        ([8, 8], [("g0", 2, 2)], {"g0": 2}),  # fits: both bound
        ([8], [("g0", 2, 2)], {"g0": 0}),  # one node for a group of two: none bound
        ([8, 8, 8], [("g0", 2, 2), ("g1", 2, 2)], {"g0": 2, "g1": 0}),  # the second: none
        ([16], [("g0", 2, 2)], {"g0": 2}),  # two pods share a node with room for both
        ([8, 8], [("g0", 2, 1)], {"g0": 0}),  # the worker is not created yet: wait
        ([8, 8, 8, 8], [("g0", 3, 3), ("g1", 2, 2)], {"g0": 3, "g1": 0}),
    ],
    ids=["fits", "too-few-nodes", "second-group", "shared-node", "incomplete", "sizes"],
)
def test_a_group_is_bound_whole_or_not_at_all(capacities, groups, placed):
    nodes = [node(f"n{i}", cards) for i, cards in enumerate(capacities)]
    pods, members = [], {}
    for key, size, present in groups:
        for index in range(present):
            pods.append((f"{key}-{index}", pod_demand(lws_pod(key, size))))
            members[f"{key}-{index}"] = PodGroup(key, size)
    decisions = {d.key: d for d in schedule(pods, nodes, {}, groups=members)}
    assert set(decisions) == {key for key, _ in pods}
    got = {key: 0 for key, _, _ in groups}
    for decision in decisions.values():
        got[members[decision.key].key] += decision.node is not None
    assert got == placed
    cards: dict[str, int] = {}
    for decision in decisions.values():
        if decision.node is not None:
            cards[decision.node] = cards.get(decision.node, 0) + 8
    assert all(cards[n.name] * 1000 <= n.allocatable[GPU] for n in nodes if n.name in cards)


def test_an_unplaced_group_says_why_and_an_incomplete_one_says_nothing():
    nodes = [node("n0")]
    full = [(f"g-{i}", pod_demand(lws_pod("g", 2))) for i in range(2)]
    refused = schedule(full, nodes, {}, groups=dict.fromkeys(["g-0", "g-1"], PodGroup("g", 2)))
    assert {d.node for d in refused} == {None}
    message = refused[0].message
    assert message.startswith("0/1 nodes are available: 1 Insufficient mthreads.com/gpu.")
    assert "The 2 pods of group g are bound together or not at all: none is bound." in message
    waiting = schedule(full[:1], nodes, {}, groups={"g-0": PodGroup("g", 2)})
    assert waiting == [Decision("g-0", None, "")]


def test_a_group_with_pods_bound_already_places_the_rest():
    """A Binding that failed for one pod of a group: the others are bound; it goes alone."""
    nodes = [node("n0"), node("n1")]
    usage = {"n0": {GPU: milli(8), "pods": 1000}}
    rest = [("g-1", pod_demand(lws_pod("g", 2)))]
    (decision,) = schedule(rest, nodes, usage, groups={"g-1": PodGroup("g", 2)}, bound={"g": 1})
    assert decision.node == "n1"


def test_pods_alone_still_fill_what_a_refused_group_left():
    nodes = [node("n0")]
    pods = [(f"g-{i}", pod_demand(lws_pod("g", 2))) for i in range(2)] + [("alone", demand())]
    members = {"g-0": PodGroup("g", 2), "g-1": PodGroup("g", 2)}
    decisions = {d.key: d.node for d in schedule(pods, nodes, {}, groups=members)}
    assert decisions == {"g-0": None, "g-1": None, "alone": "n0"}
