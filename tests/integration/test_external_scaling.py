"""Scaling mode External: the real HPA controller scales a role through its PDPool's /scale.

The HPA controller of the local kube-controller-manager clamps a target's replicas to
minReplicas/maxReplicas even without a metrics source, which is enough to drive a PDPool as
HPA or KEDA would: it writes spec.replicas through /scale, and the operator scales the role's
Deployment, within its bounds and the free cards of the virtual nodes, and says when it runs
fewer than asked.
"""

import copy

import pytest
from kubernetes import client

from kubetools import condition, create_pdd, custom, events, get_pdd, wait_for
from pdcases import ROOT, load_sample

HETERO = load_sample(ROOT / "config" / "samples" / "heterogeneous-s5000-h200.yaml")
NAME = "glm-hetero"
GROUP, VERSION = "pdoperator.io", "v1alpha1"
# The HPA controller resyncs every 15 s, and learns a new scale kind within 30 s.
HPA_SECONDS = 90


@pytest.fixture
def nodes(tiny_nodes):
    return tiny_nodes


@pytest.fixture
def operator(operator_on_tiny_nodes):
    return operator_on_tiny_nodes


def external_body() -> dict:
    """The sample in mode External; decode replicas take 2 of the H200 node's 8 cards, so the
    node holds 4 of them."""
    body = copy.deepcopy(HETERO)
    for role in ("prefill", "decode"):
        pool = body["spec"][role]["pools"][0]
        pool["template"] = {**pool.get("template", {}), "schedulerName": "pd-mock-scheduler"}
    decode = body["spec"]["decode"]["pools"][0]
    decode["accelerator"]["perReplica"] = 2
    decode["replicas"] = {"min": 1, "max": 10}
    body["spec"]["scaling"] = {
        "mode": "External",
        "prefillToDecodeRatio": {"minPercent": 25, "maxPercent": 400},
    }
    return body


def pdpool(api_client, namespace: str, name: str) -> dict | None:
    found = custom(api_client).list_namespaced_custom_object(
        GROUP, VERSION, namespace, "pdpools", field_selector=f"metadata.name={name}"
    )["items"]
    return found[0] if found else None


def deployment_replicas(api_client, namespace: str, name: str) -> int | None:
    found = (
        client.AppsV1Api(api_client)
        .list_namespaced_deployment(namespace, field_selector=f"metadata.name={name}")
        .items
    )
    return found[0].spec.replicas if found else None


def role_status(api_client, namespace: str, role: str) -> dict:
    status = get_pdd(api_client, namespace, NAME).get("status") or {}
    return next((e for e in status.get("externalScaling") or [] if e["role"] == role), {})


def hpa(namespace: str, replicas: int) -> dict:
    """An HPA on the decode PDPool that holds it at `replicas` (no metrics needed for that)."""
    return {
        "apiVersion": "autoscaling/v2",
        "kind": "HorizontalPodAutoscaler",
        "metadata": {"name": "decode", "namespace": namespace},
        "spec": {
            "scaleTargetRef": {
                "apiVersion": f"{GROUP}/{VERSION}",
                "kind": "PDPool",
                "name": f"{NAME}-decode",
            },
            "minReplicas": replicas,
            "maxReplicas": replicas,
        },
    }


def test_an_hpa_scales_decode_through_its_pdpool_and_status_says_when_capacity_overrides_it(
    operator, api_client, namespace
):
    created = create_pdd(api_client, namespace, external_body())
    decode = wait_for(
        lambda: pdpool(api_client, namespace, f"{NAME}-decode"), what="the decode PDPool"
    )
    # Owned by the PDDeployment, starting from what decode runs (replicas.min).
    (owner,) = decode["metadata"]["ownerReferences"]
    assert (owner["kind"], owner["uid"], owner["controller"]) == (
        "PDDeployment",
        created["metadata"]["uid"],
        True,
    )
    assert decode["spec"]["replicas"] == 1
    assert pdpool(api_client, namespace, f"{NAME}-prefill")["spec"]["replicas"] == 1
    selector = wait_for(
        lambda: ((pdpool(api_client, namespace, f"{NAME}-decode") or {}).get("status") or {}).get(
            "selector"
        ),
        what="the PDPool's selector",
    )
    assert selector == f"pdoperator.io/deployment={NAME},pdoperator.io/role=decode"

    autoscaling = client.AutoscalingV2Api(api_client)
    autoscaling.create_namespaced_horizontal_pod_autoscaler(namespace, hpa(namespace, 3))
    wait_for(
        lambda: deployment_replicas(api_client, namespace, f"{NAME}-decode-h200") == 3,
        timeout=HPA_SECONDS,
        interval=1,
        what="the HPA's 3 decode replicas on the decode Deployment",
    )
    # The HPA wrote spec.replicas through /scale; the operator never did after creating it.
    decode = pdpool(api_client, namespace, f"{NAME}-decode")
    assert decode["spec"]["replicas"] == 3
    writers = {
        entry["manager"]
        for entry in decode["metadata"]["managedFields"]
        if "f:replicas" in str(entry.get("fieldsV1", {}).get("f:spec", {}))
    }
    assert "pd-operator" not in writers, decode["metadata"]["managedFields"]
    entry = wait_for(
        lambda: (
            role_status(api_client, namespace, "decode").get("replicas") == 3
            and role_status(api_client, namespace, "decode")
        ),
        what="status.externalScaling for decode",
    )
    assert entry["requestedReplicas"] == 3
    assert entry["limitedBy"] == "none"
    assert condition(get_pdd(api_client, namespace, NAME), "ExternalScaling")["status"] == "True"
    wait_for(
        lambda: (
            (pdpool(api_client, namespace, f"{NAME}-decode").get("status") or {}).get(
                "readyReplicas"
            )
            == 3
        ),
        what="the PDPool's status to show 3 Ready replicas",
    )

    # Asked for more than the H200 node holds (4 replicas of 2 cards on 8): the operator runs
    # what fits, and says so in status, in a condition and in an event.
    autoscaling.patch_namespaced_horizontal_pod_autoscaler(
        "decode", namespace, {"spec": {"minReplicas": 6, "maxReplicas": 6}}
    )
    entry = wait_for(
        lambda: (
            role_status(api_client, namespace, "decode").get("requestedReplicas") == 6
            and role_status(api_client, namespace, "decode")
        ),
        timeout=HPA_SECONDS,
        interval=1,
        what="the PDPool's request of 6 in status",
    )
    assert entry["replicas"] == 4
    assert entry["limitedBy"] == "capacity"
    assert entry["message"] == "decode: PDPool asks 6, capacity allows 4"
    assert deployment_replicas(api_client, namespace, f"{NAME}-decode-h200") == 4
    overridden = condition(get_pdd(api_client, namespace, NAME), "ExternalScaling")
    assert (overridden["status"], overridden["reason"]) == ("False", "Overridden")
    assert "decode: PDPool asks 6, capacity allows 4" in overridden["message"]
    assert wait_for(
        lambda: events(api_client, namespace, "ScaleOverridden"), what="a ScaleOverridden event"
    )
    status = wait_for(
        lambda: (
            (pdpool(api_client, namespace, f"{NAME}-decode").get("status") or {}).get(
                "readyReplicas"
            )
            == 4
            and pdpool(api_client, namespace, f"{NAME}-decode")["status"]
        ),
        what="4 Ready decode replicas in the PDPool's status",
    )
    assert (status["desiredReplicas"], status["limitedBy"]) == (4, "capacity")
    # Never asked for a replica that does not fit (a pod created and not yet bound holds room).
    assert not events(api_client, namespace, "FailedScheduling")
    # The request stays the HPA's: the operator did not write it back.
    assert pdpool(api_client, namespace, f"{NAME}-decode")["spec"]["replicas"] == 6


def test_a_pdpool_of_someone_else_is_a_conflict_and_leaving_external_deletes_only_ours(
    operator, api_client, namespace
):
    theirs = custom(api_client).create_namespaced_custom_object(
        GROUP,
        VERSION,
        namespace,
        "pdpools",
        {
            "apiVersion": f"{GROUP}/{VERSION}",
            "kind": "PDPool",
            "metadata": {"name": f"{NAME}-decode"},
            "spec": {"replicas": 7},
        },
    )
    create_pdd(api_client, namespace, external_body())
    stalled = wait_for(
        lambda: (
            condition(get_pdd(api_client, namespace, NAME), "Stalled").get("status") == "True"
            and condition(get_pdd(api_client, namespace, NAME), "Stalled")
        ),
        what="Stalled",
    )
    assert stalled["reason"] == "NameConflict"
    assert f"PDPool {NAME}-decode" in stalled["message"]
    wait_for(lambda: pdpool(api_client, namespace, f"{NAME}-prefill"), what="our prefill PDPool")
    # Their PDPool is neither scaled from nor written: decode holds what it runs.
    held = wait_for(lambda: role_status(api_client, namespace, "decode"), what="decode's status")
    assert "requestedReplicas" not in held
    assert held["replicas"] == 1
    assert deployment_replicas(api_client, namespace, f"{NAME}-decode-h200") == 1
    untouched = pdpool(api_client, namespace, f"{NAME}-decode")
    assert untouched["metadata"]["resourceVersion"] == theirs["metadata"]["resourceVersion"]

    custom(api_client).patch_namespaced_custom_object(
        GROUP,
        VERSION,
        namespace,
        "pddeployments",
        NAME,
        {"spec": {"scaling": {"mode": "Disabled"}}},
    )
    wait_for(
        lambda: pdpool(api_client, namespace, f"{NAME}-prefill") is None,
        what="our prefill PDPool deleted when the mode leaves External",
    )
    still = pdpool(api_client, namespace, f"{NAME}-decode")
    assert still is not None
    assert still["metadata"]["resourceVersion"] == theirs["metadata"]["resourceVersion"]
    status = wait_for(
        lambda: (
            (get_pdd(api_client, namespace, NAME).get("status") or {}).get("observedGeneration")
            == 2
            and get_pdd(api_client, namespace, NAME)["status"]
        ),
        what="status of the Disabled spec",
    )
    assert "externalScaling" not in status
    assert condition({"status": status}, "Stalled")["status"] == "False"
