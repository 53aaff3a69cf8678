"""A PDDeployment never takes, deletes or rewrites an object it does not own (real apiserver).

Names that read two ways, a Service a user made first, a crafted name equal to another
PDDeployment's hashed one, a pool renamed to something the apiserver refuses, an apply the
apiserver cannot even parse: each with the operator running, and across its restart.
"""

import copy
import logging
import time

from kubernetes import client
from prometheus_client import REGISTRY

from kubetools import (
    RunningOperator,
    condition,
    create_pdd,
    events,
    get_pdd,
    patch_pdd,
    wait_for,
    writes,
    writes_by_kind,
)
from pd_operator.core.naming import deployment_name
from pdcases import minimal


def pdd(name: str, prefill: str = "p", decode: str = "d") -> dict:
    body = minimal()
    body["metadata"]["name"] = name
    body["spec"]["prefill"]["pools"][0]["name"] = prefill
    body["spec"]["decode"]["pools"][0]["name"] = decode
    return body


def owned(api_client, namespace) -> dict[tuple[str, str], tuple[str, str, str]]:
    """(kind, name) -> (controller kind/name, uid, resourceVersion) of the namespace's
    Deployments, Services and budgets."""
    core, apps = client.CoreV1Api(api_client), client.AppsV1Api(api_client)
    policy = client.PolicyV1Api(api_client)
    listed = [
        ("Deployment", apps.list_namespaced_deployment(namespace).items),
        ("Service", core.list_namespaced_service(namespace).items),
        ("PodDisruptionBudget", policy.list_namespaced_pod_disruption_budget(namespace).items),
    ]
    result = {}
    for kind, items in listed:
        for item in items:
            controller = next(
                (r for r in item.metadata.owner_references or [] if r.controller), None
            )
            owner = f"{controller.kind}/{controller.name}" if controller else "-"
            result[(kind, item.metadata.name)] = (
                owner,
                item.metadata.uid,
                item.metadata.resource_version,
            )
    return result


def deployments_reported(api_client, namespace) -> bool:
    """Every Deployment's status is the controller-manager's answer to its current spec."""
    items = client.AppsV1Api(api_client).list_namespaced_deployment(namespace).items
    return bool(items) and all(
        (d.status.observed_generation or 0) >= d.metadata.generation
        and (d.status.replicas or 0) == (d.spec.replicas or 0)
        for d in items
    )


def quiet(operator: RunningOperator, api_client, namespace, names, seconds: float = 3.0) -> None:
    """Wait until the operator's queue has stayed empty and the PDDeployments unchanged for
    `seconds` (an autoscaling cycle included: it ticks every second): work still on its way
    would otherwise be done by the next operator instead."""
    seen: list[tuple[float, tuple[str, ...]]] = []

    def still() -> bool:
        versions = tuple(
            get_pdd(api_client, namespace, name)["metadata"]["resourceVersion"] for name in names
        )
        if not operator.settled() or not seen or seen[0][1] != versions:
            seen[:] = [(time.monotonic(), versions)]
            return False
        return time.monotonic() - seen[0][0] >= seconds

    wait_for(still, what=f"the operator to have nothing to do for {seconds:g}s")


def stalled(api_client, namespace, name) -> dict:
    return wait_for(
        lambda: (
            condition(get_pdd(api_client, namespace, name), "Stalled").get("status") == "True"
            and condition(get_pdd(api_client, namespace, name), "Stalled")
        ),
        what=f"{name} Stalled=True",
    )


def reconcile_errors() -> float:
    value = REGISTRY.get_sample_value("pd_operator_reconciles_total", {"result": "error"})
    return value or 0.0


def children_of(objects, owner: str) -> set[tuple[str, str]]:
    return {key for key, (by, _, _) in objects.items() if by == f"PDDeployment/{owner}"}


def test_names_that_read_two_ways_give_each_pddeployment_its_own_children(
    cluster, api_client, namespace
):
    # The pairs: `1a`/`pd-1a` and `a` (pool prefill-x)/`a-prefill` (pool x) once took
    # each other's Services and budgets, and flipped back after a restart.
    every = ("1a", "pd-1a", "a", "a-prefill")
    first = RunningOperator(str(cluster.kubeconfig), namespaces=[namespace], workers=2).start()
    try:
        for body in (pdd("1a"), pdd("pd-1a"), pdd("a", "prefill-x"), pdd("a-prefill", "x")):
            create_pdd(api_client, namespace, body)
        # Each: 3 Services (prefill, decode, endpoint), 3 Deployments (2 pools and the
        # router), 3 budgets.
        objects = wait_for(
            lambda: (
                (found := owned(api_client, namespace))
                and all(len(children_of(found, name)) == 9 for name in every)
                and found
            ),
            what="nine children for each of the four PDDeployments",
        )
        # The controller-manager's own status writes come after the children: the restarted
        # operator must find nothing new, so the first one must have seen them all.
        wait_for(
            lambda: deployments_reported(api_client, namespace),
            what="the controller-manager to report every Deployment",
        )
        quiet(first, api_client, namespace, every)
    finally:
        first.stop()
    for name in every:
        assert condition(get_pdd(api_client, namespace, name), "Stalled").get("status") != "True"
    before, kinds = writes(), writes_by_kind()
    statuses = {name: get_pdd(api_client, namespace, name).get("status") for name in every}
    second = RunningOperator(
        str(cluster.kubeconfig), namespaces=[namespace], workers=2, resync_seconds=1
    ).start()
    try:
        time.sleep(3)
        wait_for(second.settled, what="the restarted operator to settle")
        after = owned(api_client, namespace)
        assert {k: v[:2] for k, v in after.items()} == {k: v[:2] for k, v in objects.items()}
        new = {k: n - kinds.get(k, 0) for k, n in writes_by_kind().items() if n != kinds.get(k)}
        changed = {
            (name, key): (was.get(key), now.get(key))
            for name in every
            for was, now in [
                (statuses[name] or {}, get_pdd(api_client, namespace, name).get("status") or {})
            ]
            for key in {*was, *now}
            if was.get(key) != now.get(key)
        }
        assert writes() - before == 0, (new, changed)
    finally:
        second.stop()


def test_a_service_the_user_made_is_never_taken_and_survives_the_pddeployment(
    operator, api_client, namespace
):
    core = client.CoreV1Api(api_client)
    theirs = core.create_namespaced_service(
        namespace,
        {
            "metadata": {"name": "cx-prefill", "labels": {"team": "search"}},
            "spec": {"selector": {"app": "search"}, "ports": [{"port": 8080}]},
        },
    )
    create_pdd(api_client, namespace, pdd("cx"))
    stall = stalled(api_client, namespace, "cx")
    assert stall["reason"] == "NameConflict"
    assert "Service cx-prefill already exists and belongs to no controller" in stall["message"]
    # The user's Service is exactly as they left it; the other children were made.
    kept = core.read_namespaced_service("cx-prefill", namespace)
    assert kept.metadata.resource_version == theirs.metadata.resource_version
    assert kept.metadata.owner_references is None
    assert kept.spec.selector == {"app": "search"}
    assert ("Deployment", "cx-prefill-p") in owned(api_client, namespace)
    # Said once, not on every pass.
    time.sleep(3)
    assert (
        len([e for e in events(api_client, namespace, "Stalled") if "cx-prefill" in e.message]) == 1
    )

    client.CustomObjectsApi(api_client).delete_namespaced_custom_object(
        "pdoperator.io", "v1alpha1", namespace, "pddeployments", "cx"
    )
    wait_for(
        lambda: ("Deployment", "cx-prefill-p") not in owned(api_client, namespace),
        what="the garbage collector to remove cx's children",
    )
    assert core.read_namespaced_service("cx-prefill", namespace).metadata.uid == theirs.metadata.uid


def test_a_name_crafted_to_match_another_pddeployments_child_never_touches_it(
    operator, api_client, namespace
):
    create_pdd(api_client, namespace, pdd("a-prefill", prefill="x"))
    victim = deployment_name("a-prefill", "prefill", "x")  # hashed: the name reads two ways
    wait_for(
        lambda: ("Deployment", victim) in owned(api_client, namespace), what="a-prefill's pool"
    )
    # Its resourceVersion is compared below: the controller-manager's status writes first.
    wait_for(
        lambda: deployments_reported(api_client, namespace),
        what="the controller-manager to report every Deployment",
    )
    wait_for(operator.settled, what="the queue to drain")
    before = owned(api_client, namespace)[("Deployment", victim)]
    # `a` with prefill pool `prefill-x-<hash>` asks for exactly that name.
    crafted = victim.removeprefix("a-prefill-")
    create_pdd(api_client, namespace, pdd("a", prefill=crafted))
    stall = stalled(api_client, namespace, "a")
    assert stall["reason"] == "NameConflict"
    assert (
        f"Deployment {victim} already exists and belongs to PDDeployment a-prefill"
        in (stall["message"])
    )
    time.sleep(2)
    assert owned(api_client, namespace)[("Deployment", victim)] == before


def test_a_renamed_pool_whose_deployment_is_refused_keeps_the_old_one(
    operator, api_client, namespace
):
    create_pdd(api_client, namespace, pdd("rn"))
    wait_for(lambda: ("Deployment", "rn-prefill-p") in owned(api_client, namespace), what="pool p")
    pools = get_pdd(api_client, namespace, "rn")["spec"]["prefill"]["pools"]
    renamed = copy.deepcopy(pools)
    renamed[0]["name"] = "p2"
    # Schema-valid, but no valid Volume: the apiserver refuses the new Deployment.
    renamed[0]["template"] = {"volumes": [{"name": "Bad_Name", "emptyDir": {}}]}
    patch_pdd(api_client, namespace, "rn", {"spec": {"prefill": {"pools": renamed}}})
    stall = stalled(api_client, namespace, "rn")
    assert stall["reason"] == "ApplyRejected" and "rn-prefill-p2" in stall["message"]
    time.sleep(2)
    objects = owned(api_client, namespace)
    assert ("Deployment", "rn-prefill-p") in objects  # the role still has its workload
    assert ("PodDisruptionBudget", "rn-prefill-p") in objects
    assert not events(api_client, namespace, "PoolDeleted")
    # Fixed: the new pool is made, and the old one goes once it exists (it served nothing).
    renamed[0]["template"] = {}
    patch_pdd(api_client, namespace, "rn", {"spec": {"prefill": {"pools": renamed}}})
    wait_for(
        lambda: (
            ("Deployment", "rn-prefill-p2") in (found := owned(api_client, namespace))
            and ("Deployment", "rn-prefill-p") not in found
            and ("PodDisruptionBudget", "rn-prefill-p") not in found
        ),
        what="the new pool in place of the old one",
    )


def test_an_apply_the_apiserver_cannot_parse_stalls_once_without_retrying(
    operator, api_client, namespace, caplog
):
    caplog.set_level(logging.WARNING, logger="pd_operator")
    create_pdd(api_client, namespace, pdd("typo"))
    wait_for(lambda: ("Deployment", "typo-decode-d") in owned(api_client, namespace), what="pool d")
    # Accepted by the CRD (affinity passes through); the apply over the existing Deployment
    # fails as a 500 while the apiserver builds the typed object. It was retried forever,
    # each time with a 34-line traceback.
    pools = get_pdd(api_client, namespace, "typo")["spec"]["decode"]["pools"]
    pools[0]["template"] = {"affinity": {"nodeAfinity": {}}}
    patch_pdd(api_client, namespace, "typo", {"spec": {"decode": {"pools": pools}}})
    stall = stalled(api_client, namespace, "typo")
    assert stall["reason"] == "ApplyRejected"
    assert "nodeAfinity: field not declared in schema" in stall["message"]
    wait_for(operator.settled, what="the queue to drain")
    failed = reconcile_errors()
    time.sleep(3)
    # Refused is final until the spec changes: no retries, and the Stalled event said once.
    assert reconcile_errors() == failed
    assert len(events(api_client, namespace, "Stalled")) == 1
    assert not [r for r in caplog.records if r.exc_info]
    # A typo in a new child is refused by the create the same way, naming the field.
    create_pdd(
        api_client,
        namespace,
        {**pdd("typo2"), "spec": get_pdd(api_client, namespace, "typo")["spec"]},
    )
    stall = stalled(api_client, namespace, "typo2")
    assert stall["reason"] == "ApplyRejected"
    assert "Deployment typo2-decode-d rejected" in stall["message"]
    assert "nodeAfinity: field not declared in schema" in stall["message"]


def test_a_field_dropped_from_the_spec_leaves_the_child_it_was_created_in(
    operator, api_client, namespace
):
    # Children are created by an apply that refuses any existing object, so they are owned as
    # applied: a field the spec no longer sets must go, not linger under a create's owner.
    body = pdd("env")
    body["spec"]["decode"]["pools"][0]["template"] = {"env": [{"name": "FLAG", "value": "1"}]}
    create_pdd(api_client, namespace, body)
    apps = client.AppsV1Api(api_client)

    def env_names():
        found = apps.list_namespaced_deployment(
            namespace, field_selector="metadata.name=env-decode-d"
        ).items
        if not found:
            return set()
        deployment = found[0]
        return {e.name for e in deployment.spec.template.spec.containers[0].env or []}

    wait_for(lambda: "FLAG" in env_names(), what="FLAG on the decode Deployment")
    managers = {
        (m.manager, m.operation)
        for m in apps.read_namespaced_deployment("env-decode-d", namespace).metadata.managed_fields
    }
    assert ("pd-operator", "Update") not in managers
    patch_pdd(
        api_client,
        namespace,
        "env",
        {"spec": {"decode": {"pools": [{**body["spec"]["decode"]["pools"][0], "template": {}}]}}},
    )
    wait_for(lambda: "FLAG" not in env_names(), what="FLAG to be removed")
