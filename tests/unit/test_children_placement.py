"""spec.placement: every pool pod seeks the domain of its PDDeployment's other pool pods."""

from typing import Any

import pytest

from pd_operator.api import PDDeployment, parse_pddeployment
from pd_operator.core.children import LWS_KIND, desired_children
from pd_operator.core.router import router_children
from pdcases import minimal

RACK = "example.com/rack"
REQUIRED = "requiredDuringSchedulingIgnoredDuringExecution"
PREFERRED = "preferredDuringSchedulingIgnoredDuringExecution"


def placed(
    mode: str | None = "Required", *, nodes: int = 1, **prefill_template: Any
) -> PDDeployment:
    document = minimal()
    document["metadata"].update(namespace="ns", uid="uid-1")
    if mode is not None:
        document["spec"]["placement"] = {"topologyKey": RACK, "mode": mode}
    prefill = document["spec"]["prefill"]["pools"][0]
    prefill["accelerator"]["nodesPerReplica"] = nodes
    if prefill_template:
        prefill["template"] = prefill_template
    return parse_pddeployment(document)


def pod_templates(pdd: PDDeployment) -> list[dict[str, Any]]:
    """Every pool pod template: Deployments' and LeaderWorkerSets' leaders and workers."""
    found = []
    for child in desired_children(pdd, {}):
        if child["kind"] == "Deployment":
            found.append(child["spec"]["template"])
        elif child["kind"] == LWS_KIND:
            group = child["spec"]["leaderWorkerTemplate"]
            found += [group["leaderTemplate"], group["workerTemplate"]]
    return found


def selects(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    """matchLabels and the Exists expressions the placement term uses."""
    if any(labels.get(key) != value for key, value in selector.get("matchLabels", {}).items()):
        return False
    for expression in selector.get("matchExpressions", []):
        assert expression["operator"] == "Exists"
        if expression["key"] not in labels:
            return False
    return True


@pytest.mark.parametrize("nodes", [1, 2])
def test_required_puts_every_pool_pod_in_the_domain_of_the_deployments_pool_pods(nodes):
    pdd = placed("Required", nodes=nodes)
    templates = pod_templates(pdd)
    assert len(templates) == (3 if nodes == 2 else 2)  # decode, prefill leader (+ worker)
    for template in templates:
        affinity = template["spec"]["affinity"]["podAffinity"]
        (term,) = affinity[REQUIRED]
        assert PREFERRED not in affinity
        assert term["topologyKey"] == RACK
        # The term selects every pool pod of this PDDeployment, its own pod included, so the
        # first one may land anywhere (Kubernetes' self-affinity rule) and the rest follow it.
        assert all(selects(term["labelSelector"], t["metadata"]["labels"]) for t in templates)


def test_the_term_selects_neither_the_routers_nor_another_deployments_pods():
    pdd = placed("Required")
    term = pod_templates(pdd)[0]["spec"]["affinity"]["podAffinity"][REQUIRED][0]
    routers = [c for c in router_children(pdd) if c["kind"] == "Deployment"]
    assert routers
    for router in routers:
        assert not selects(term["labelSelector"], router["spec"]["template"]["metadata"]["labels"])
    other = parse_pddeployment(minimal() | {"metadata": {"name": "other", "uid": "u2"}})
    for template in pod_templates(other):
        assert not selects(term["labelSelector"], template["metadata"]["labels"])


def test_preferred_is_a_weighted_preference_and_never_a_requirement():
    for template in pod_templates(placed("Preferred")):
        affinity = template["spec"]["affinity"]["podAffinity"]
        assert REQUIRED not in affinity
        (preference,) = affinity[PREFERRED]
        assert preference["weight"] == 100
        assert preference["podAffinityTerm"]["topologyKey"] == RACK


def test_the_mode_defaults_to_preferred():
    document = minimal()
    document["metadata"].update(namespace="ns", uid="uid-1")
    document["spec"]["placement"] = {"topologyKey": RACK}
    pdd = parse_pddeployment(document)
    assert pdd.spec.placement is not None and pdd.spec.placement.mode == "Preferred"


def test_the_templates_own_affinity_terms_are_kept_beside_the_placement():
    user_term = {"labelSelector": {"matchLabels": {"cache": "warm"}}, "topologyKey": "zone"}
    node_affinity = {
        REQUIRED: {
            "nodeSelectorTerms": [
                {"matchExpressions": [{"key": "fabric", "operator": "In", "values": ["ib"]}]}
            ]
        }
    }
    anti = {PREFERRED: [{"weight": 5, "podAffinityTerm": user_term}]}
    affinity = {"nodeAffinity": node_affinity, "podAffinity": {REQUIRED: [user_term]}}
    pdd = placed("Required", affinity=affinity | {"podAntiAffinity": anti})
    prefill = next(t for t in pod_templates(pdd) if "prefill" in t["metadata"]["labels"].values())
    built = prefill["spec"]["affinity"]
    assert built["nodeAffinity"] == node_affinity
    assert built["podAntiAffinity"] == anti
    assert built["podAffinity"][REQUIRED][0] == user_term
    assert built["podAffinity"][REQUIRED][1]["topologyKey"] == RACK
    # The spec is not changed by building from it.
    assert pdd.spec.prefill.pools[0].template is not None
    assert pdd.spec.prefill.pools[0].template.affinity == affinity | {"podAntiAffinity": anti}


def test_without_placement_no_affinity_is_added():
    assert all("affinity" not in t["spec"] for t in pod_templates(placed(None)))
