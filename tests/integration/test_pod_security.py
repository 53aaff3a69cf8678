"""Pools and routers in namespaces where Pod Security admission is enforced (a real apiserver's
PodSecurity plugin; pods are created but never run: the local cluster has no kubelet)."""

import copy

from kubernetes import client

from kubetools import condition, create_pdd, get_pdd, patch_pdd, wait_for
from pdcases import minimal

ENFORCE = "pod-security.kubernetes.io/enforce"
# What a user adds for `restricted` when the images allow it: any non-root uid.
NON_ROOT = {"runAsNonRoot": True, "runAsUser": 1000}


def enforce(api_client, namespace: str, level: str) -> None:
    body = {"metadata": {"labels": {ENFORCE: level, f"{ENFORCE}-version": "latest"}}}
    client.CoreV1Api(api_client).patch_namespace(namespace, body)


def pods(api_client, namespace: str) -> dict[str, str]:
    """Role label of each pod in the namespace, by pod name."""
    items = client.CoreV1Api(api_client).list_namespaced_pod(namespace).items
    return {p.metadata.name: (p.metadata.labels or {}).get("pdoperator.io/role") for p in items}


def pod_security_stall(api_client, namespace: str) -> dict | None:
    obj = get_pdd(api_client, namespace, "minimal")
    stalled = condition(obj, "Stalled")
    if stalled.get("reason") == "ReplicaFailure" and "PodSecurity" in stalled["message"]:
        return stalled
    return None


def test_restricted_refuses_the_defaults_in_status_and_a_non_root_template_lets_pods_in(
    operator, api_client, namespace
):
    enforce(api_client, namespace, "restricted")
    create_pdd(api_client, namespace, minimal())
    stalled = wait_for(
        lambda: pod_security_stall(api_client, namespace),
        timeout=60,
        what="Stalled=True, ReplicaFailure naming PodSecurity",
    )
    message = stalled["message"]
    assert message.startswith(("prefill pool p: ", "decode pool d: ")), message
    assert 'violates PodSecurity "restricted:latest"' in message, message
    # Everything else of `restricted` already holds: only the user is left to choose.
    assert "runAsNonRoot != true" in message and "allowPrivilegeEscalation" not in message
    assert "seccompProfile" not in message and "unrestricted capabilities" not in message
    assert pods(api_client, namespace) == {}

    spec = copy.deepcopy(get_pdd(api_client, namespace, "minimal")["spec"])
    for role in ("prefill", "decode"):
        for pool in spec[role]["pools"]:
            pool["template"] = {"securityContext": NON_ROOT}
    spec["router"]["template"] = {"securityContext": NON_ROOT}
    patch_pdd(api_client, namespace, "minimal", {"spec": spec})
    wait_for(
        lambda: sorted(pods(api_client, namespace).values()) == ["decode", "prefill", "router"],
        timeout=60,
        what="a prefill, a decode and a router pod admitted",
    )
    # The pools' stall clears once their new pods exist (no surge: the refused ReplicaSet goes
    # to zero first). The router surges: its refused old ReplicaSet keeps failing until the new
    # router pod is Ready, which takes a kubelet, so the router alone may still be named.
    wait_for(
        lambda: (
            " pool " not in (pod_security_stall(api_client, namespace) or {}).get("message", "")
        ),
        timeout=60,
        what="the pools' PodSecurity stall to clear",
    )


def test_baseline_admits_the_defaults(operator, api_client, namespace):
    enforce(api_client, namespace, "baseline")
    create_pdd(api_client, namespace, minimal())
    wait_for(
        lambda: sorted(pods(api_client, namespace).values()) == ["decode", "prefill", "router"],
        timeout=60,
        what="a prefill, a decode and a router pod admitted under baseline",
    )
    assert condition(get_pdd(api_client, namespace, "minimal"), "Stalled").get("status") != "True"
