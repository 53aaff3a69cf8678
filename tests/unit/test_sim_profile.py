"""Cluster profiles, the Node objects built from them, and the kind-mode patches."""

import copy
import ipaddress
from pathlib import Path
from typing import Any

import pytest

from pd_operator.api import parse_pddeployment
from pd_operator.core.observe import summarize_node
from pd_operator.core.placement import node_admits
from pd_tools.localcluster.cluster import SERVICE_CIDR
from pd_tools.simcluster.kind_mode import main as kind_mode
from pd_tools.simcluster.kind_mode import metadata_patch, plan, pointer_token, status_patch
from pd_tools.simcluster.kubelet import POD_ADDRESSES
from pd_tools.simcluster.nodes import LABEL_NODE_GROUP, NODE_ADDRESSES, build_node
from pd_tools.simcluster.profile import MAX_NODES, load_profile, parse_profile
from pdcases import ROOT, SAMPLES, load_sample

CLUSTERS = ROOT / "config" / "clusters"


def group(**changes: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "name": "s5000",
        "count": 2,
        "accelerators": [
            {"resourceName": "mthreads.com/gpu", "perNode": 8, "profile": "mtt-s5000"}
        ],
    }
    return {**base, **changes}


def profile(*groups: dict[str, Any]) -> dict[str, Any]:
    return {"name": "test", "nodeGroups": list(groups) or [group()]}


def nodes_of(path: str) -> list[dict[str, Any]]:
    loaded = load_profile(CLUSTERS / path)
    return [
        build_node(g, g.node_name(i), "198.19.0.1", loaded.name)
        for g in loaded.node_groups
        for i in range(g.count)
    ]


def test_the_articles_cluster_has_four_s5000_and_two_h200_machines_of_eight_cards():
    articles = load_profile(CLUSTERS / "articles.yaml")
    cards = {
        (g.name, g.count, a.resource_name, a.per_node, a.profile)
        for g in articles.node_groups
        for a in g.accelerators
    }
    assert cards == {
        ("s5000", 4, "mthreads.com/gpu", 8, "mtt-s5000"),
        ("h200", 2, "nvidia.com/gpu", 8, "h200"),
    }
    assert articles.group("s5000").taints[0].model_dump() == {
        "key": "mthreads.com/gpu",
        "value": "",
        "effect": "NoSchedule",
    }


@pytest.mark.parametrize("sample", SAMPLES, ids=lambda p: p.name)
def test_every_sample_pool_that_tolerates_the_taints_has_nodes_in_the_articles_cluster(sample):
    pdd = parse_pddeployment(load_sample(sample))
    nodes = [summarize_node(n) for n in nodes_of("articles.yaml")]
    for role in ("prefill", "decode"):
        for pool in pdd.spec.pools(role):
            admitting = [n.name for n in nodes if node_admits(pool, n)]
            if pool.accelerator.tolerations:
                assert admitting, f"{sample.name}: {role} pool {pool.name} has no node"
                assert all(pool.accelerator.resource_name in n.allocatable for n in nodes
                           if n.name in admitting)  # fmt: skip
            else:  # the baseline sample sets no toleration: tainted GPU nodes refuse it
                assert admitting == []


def test_tiny_and_large_profiles_load_with_their_node_counts():
    assert load_profile(CLUSTERS / "tiny.yaml").node_count == 3
    assert load_profile(CLUSTERS / "large.yaml").node_count == 1000


def test_node_names_are_zero_padded_so_they_sort_numerically():
    names = [n["metadata"]["name"] for n in nodes_of("large.yaml")]
    assert len(set(names)) == 1000
    s5000_a = [name for name in names if name.startswith("s5000-a-")]
    assert s5000_a[:2] == ["s5000-a-000", "s5000-a-001"] and s5000_a == sorted(s5000_a)


def test_a_built_node_advertises_its_cards_and_is_ready():
    g = load_profile(CLUSTERS / "articles.yaml").group("h200")
    node = build_node(g, "h200-0", "198.19.0.7", "articles")
    status = node["status"]
    assert status["capacity"]["nvidia.com/gpu"] == "8"
    assert status["allocatable"] == status["capacity"]
    assert {"type": "InternalIP", "address": "198.19.0.7"} in status["addresses"]
    summary = summarize_node(node)
    assert summary.ready and summary.labels["nvidia.com/gpu.product"] == "NVIDIA-H200"
    assert summary.labels["node.kubernetes.io/instance-type"] == "nvidia-h200-x8"
    assert summary.labels[LABEL_NODE_GROUP] == "h200"
    assert summary.taints == ({"key": "nvidia.com/gpu", "effect": "NoSchedule"},)


def test_nodes_pods_and_services_get_disjoint_addresses_that_nothing_dials():
    benchmarking = ipaddress.ip_network("198.18.0.0/15")  # RFC 2544
    services = ipaddress.ip_network(SERVICE_CIDR)
    assert NODE_ADDRESSES.subnet_of(benchmarking) and POD_ADDRESSES.subnet_of(benchmarking)
    assert not NODE_ADDRESSES.overlaps(POD_ADDRESSES)
    assert not services.overlaps(NODE_ADDRESSES) and not services.overlaps(POD_ADDRESSES)
    assert NODE_ADDRESSES.num_addresses > MAX_NODES


@pytest.mark.parametrize(
    ("case", "document", "complaint"),
    [
        ("unknown card", profile(group(accelerators=[
            {"resourceName": "x.com/gpu", "perNode": 1, "profile": "tpu-v9"}])),
         "unknown hardware profile 'tpu-v9'"),
        ("not an extended resource", profile(group(accelerators=[
            {"resourceName": "cpu", "perNode": 1, "profile": "h200"}])),
         "not an extended resource name"),
        ("kubernetes.io is reserved", profile(group(accelerators=[
            {"resourceName": "kubernetes.io/gpu", "perNode": 1, "profile": "h200"}])),
         "not an extended resource name"),
        ("duplicate group", profile(group(), group()), "node group names must be unique"),
        ("prefixes that can collide", profile(group(name="a", namePrefix="n-"),
                                              group(name="b", namePrefix="n-1")),
         "can name the same node"),
        ("negative count", profile(group(count=-1)), "greater than or equal to 0"),
        ("fractional cards", profile(group(accelerators=[
            {"resourceName": "x.com/gpu", "perNode": 1.5, "profile": "h200"}])), "integer"),
        ("unknown field", profile(group(gpus=8)), "Extra inputs are not permitted"),
        ("bad quantity", profile(group(memory="lots")), "memory"),
        ("same card twice", profile(group(accelerators=[
            {"resourceName": "x.com/gpu", "perNode": 1, "profile": "h200"},
            {"resourceName": "x.com/gpu", "perNode": 2, "profile": "h200"}])),
         "lists an accelerator resource twice"),
    ],
)  # fmt: skip
def test_invalid_profiles_are_rejected_naming_the_problem(case, document, complaint):
    with pytest.raises(ValueError) as raised:
        parse_profile(document)
    assert complaint in str(raised.value), case


def test_a_bad_profile_file_is_one_line_per_field_or_the_yaml_position(tmp_path: Path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: test\nnodeGroups:\n  - name: s5000\n    count: -1\n    gpus: 8\n")
    with pytest.raises(ValueError) as raised:
        load_profile(bad)
    said = str(raised.value)
    assert "nodeGroups[0].count: Input should be greater than or equal to 0" in said
    assert "nodeGroups[0].gpus: Extra inputs are not permitted (got 8)" in said
    assert "errors.pydantic.dev" not in said and "\n" not in said
    bad.write_text("name: test\nnodeGroups: [\n")
    with pytest.raises(ValueError, match=r"^not YAML: line 3, column 1: expected the node content"):
        load_profile(bad)


def test_prefixes_that_only_share_a_beginning_are_fine():
    parsed = parse_profile(profile(group(name="a", namePrefix="s5000-"),
                                   group(name="b", namePrefix="s5000-big-")))  # fmt: skip
    assert [g.node_name(0) for g in parsed.node_groups] == ["s5000-0", "s5000-big-0"]


# kind mode ---------------------------------------------------------------------------------


def apply_json_patch(document: dict[str, Any], operations: list[dict[str, Any]]) -> None:
    """The "add" operation of RFC 6902, enough to check the patches kind mode sends."""
    for operation in operations:
        assert operation["op"] == "add"
        *parents, last = [
            token.replace("~1", "/").replace("~0", "~")
            for token in operation["path"].lstrip("/").split("/")
        ]
        target = document
        for token in parents:
            target = target[token]
        target[last] = operation["value"]


def kind_worker(name: str, group_name: str | None, taints: list[dict[str, str]] | None = None):
    labels = {"kubernetes.io/hostname": name}
    if group_name:
        labels[LABEL_NODE_GROUP] = group_name
    return {
        "metadata": {"name": name, "labels": labels, "resourceVersion": "42"},
        "spec": {"taints": taints or []},
        "status": {"capacity": {"cpu": "8", "pods": "110"}, "allocatable": {"cpu": "8"}},
    }


def test_pointer_tokens_escape_slashes_and_tildes():
    assert pointer_token("mthreads.com/gpu") == "mthreads.com~1gpu"
    assert pointer_token("a~b/c") == "a~0b~1c"


def test_status_patch_advertises_cards_in_capacity_and_allocatable_and_is_idempotent():
    g = load_profile(CLUSTERS / "articles.yaml").group("s5000")
    patch = status_patch(g)
    assert {"op": "add", "path": "/status/capacity/mthreads.com~1gpu", "value": "8"} in patch
    node = kind_worker("w", "s5000")
    apply_json_patch(node, patch)
    once = copy.deepcopy(node)
    apply_json_patch(node, patch)
    assert node == once
    assert node["status"]["capacity"] == {"cpu": "8", "pods": "110", "mthreads.com/gpu": "8"}
    assert node["status"]["allocatable"]["mthreads.com/gpu"] == "8"


def test_metadata_patch_keeps_foreign_taints_and_replaces_its_own():
    g = load_profile(CLUSTERS / "articles.yaml").group("s5000")
    stale = {"key": "mthreads.com/gpu", "value": "old", "effect": "NoSchedule"}
    foreign = {"key": "node-role.kubernetes.io/control-plane", "effect": "NoSchedule"}
    patch = metadata_patch(g, kind_worker("w", "s5000", [foreign, stale]))
    assert patch["spec"]["taints"] == [foreign, {"key": "mthreads.com/gpu", "effect": "NoSchedule"}]
    assert patch["metadata"]["labels"]["mthreads.com/gpu.product"] == "MTT-S5000"
    assert patch["metadata"]["resourceVersion"] == "42"  # a concurrent edit makes it fail


def test_plan_covers_labelled_workers_only_and_rejects_unknown_groups():
    articles = load_profile(CLUSTERS / "articles.yaml")
    workers = [kind_worker("w2", "h200"), kind_worker("w1", "s5000"), kind_worker("sys", None)]
    assert [(p.node, p.group) for p in plan(articles, workers)] == [("w1", "s5000"), ("w2", "h200")]
    with pytest.raises(ValueError, match="does not have"):
        plan(articles, [kind_worker("w3", "h100")])


def test_kind_mode_names_a_bad_profile_or_kubeconfig_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: p\nnodes: 5\n")
    with pytest.raises(SystemExit) as raised:
        kind_mode([str(bad)])
    assert raised.value.code == 2
    err = capsys.readouterr().err
    assert f"error: {bad}: nodeGroups: Field required" in err and "Traceback" not in err
    with pytest.raises(SystemExit):
        kind_mode([str(CLUSTERS / "tiny.yaml"), "--kubeconfig", str(tmp_path / "none")])
    assert f"error: --kubeconfig: {tmp_path / 'none'}: no such file" in capsys.readouterr().err
