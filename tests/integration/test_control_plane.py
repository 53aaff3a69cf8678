"""Smoke tests of the local control plane, the CRD on a real apiserver, and Prometheus."""

import json
import os
import re
import time
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException
from prometheus_api_client import PrometheusConnect
from prometheus_client import CollectorRegistry, Gauge, start_http_server

from pd_operator.adapters.kube import call_json
from pd_operator.api import parse_pddeployment
from pd_tools.localcluster import LocalCluster
from pd_tools.localcluster.processes import free_port
from pdcases import CRD_PATH, INVALID, SAMPLES, load_sample, minimal, schedule
from schema_tools import normalise

GROUP, VERSION, PLURAL = "pdoperator.io", "v1alpha1", "pddeployments"


def create(
    api_client: client.ApiClient, namespace: str, body: dict[str, Any], dry_run: bool = False
) -> dict[str, Any]:
    api = client.CustomObjectsApi(api_client)
    extra = {"dry_run": "All"} if dry_run else {}
    return api.create_namespaced_custom_object(  # type: ignore[no-any-return]
        GROUP, VERSION, namespace, PLURAL, body, field_validation="Strict", **extra
    )


def wait_for(check, timeout: float = 30, interval: float = 0.2, what: str = "condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def test_crd_is_served_with_printer_columns_and_explain(cluster, api_client, namespace):
    resources = cluster.kubectl("api-resources", "--api-group=pdoperator.io")
    assert "pddeployments" in resources and "pdd" in resources
    create(api_client, namespace, minimal())
    table = cluster.kubectl("get", "pdd", "-n", namespace).splitlines()
    assert table[0].split() == [
        "NAME",
        "READY",
        "PREFILL",
        "DECODE",
        "TTFT(MS)",
        "ITL(MS)",
        "ENDPOINT",
        "AGE",
    ]
    assert table[1].split()[0] == "minimal"
    wide = cluster.kubectl("get", "pdd", "-n", namespace, "-o", "wide").splitlines()[0].split()
    assert wide[wide.index("ENDPOINT") + 1 : wide.index("AGE")] == ["IDLE", "MODE", "LIMITED"]
    explained = cluster.kubectl("explain", "pdd.spec.prefill.pools.accelerator")
    assert "resourceName" in explained and "mthreads.com/gpu" in explained


def test_a_fresh_cluster_starts_accepts_the_crd_file_and_leaves_nothing_behind(cluster):
    # A second cluster beside the session's: `kubectl apply --dry-run=client` is judged on a
    # cluster where the CRD is not installed yet, as on a user's first install.
    fresh = LocalCluster(install_crds=False)
    fresh.start()
    pids = [process.pid for process in fresh.processes]
    try:
        assert fresh.startup_seconds < 60
        out = fresh.kubectl("apply", "--dry-run=client", "-f", str(CRD_PATH))
        assert "pddeployments.pdoperator.io created (dry run)" in out
    finally:
        fresh.stop()
    assert not fresh.dir.exists()
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


@pytest.mark.parametrize("sample", SAMPLES, ids=lambda p: p.name)
def test_apiserver_accepts_every_sample_and_defaults_like_the_models(api_client, namespace, sample):
    document = load_sample(sample)
    stored = create(api_client, namespace, document)
    expected = parse_pddeployment(document).spec.model_dump(by_alias=True, mode="json")
    assert normalise(stored["spec"]) == normalise(expected)


def test_apiserver_defaults_a_minimal_document_like_the_models(api_client, namespace):
    stored = create(api_client, namespace, minimal())
    expected = parse_pddeployment(minimal()).spec.model_dump(by_alias=True, mode="json")
    assert normalise(stored["spec"]) == normalise(expected)
    assert stored["spec"]["scaling"]["scaleDown"] == {
        "stabilizationSeconds": 300,
        "maxStepReplicas": 1,
        "steadyStabilizationSeconds": 60,
    }


def test_apiserver_defaults_a_schedule_like_the_models(api_client, namespace):
    document = minimal()
    document["spec"]["scaling"] = {"schedules": [schedule(decode={"d": 3})]}
    stored = create(api_client, namespace, document)
    expected = parse_pddeployment(document).spec.model_dump(by_alias=True, mode="json")
    assert normalise(stored["spec"]) == normalise(expected)
    (defaulted,) = stored["spec"]["scaling"]["schedules"]
    assert defaulted["timeZone"] == "UTC" and len(defaulted["days"]) == 7


@pytest.mark.parametrize(("case", "document", "field"), INVALID, ids=[c[0] for c in INVALID])
def test_apiserver_rejects_invalid_documents_naming_the_field(
    api_client, namespace, case, document, field
):
    with pytest.raises(ApiException) as raised:
        create(api_client, namespace, document, dry_run=True)
    assert raised.value.status in (400, 422), raised.value.body
    message = json.loads(raised.value.body)["message"]
    # Reported at the field (`path: ...`, `path.child`, `path[0]`), not at `<nil>` naming it.
    assert re.search(re.escape(field) + r"[.\[:]", message), message


def test_a_raw_client_sending_whole_floats_gets_the_fields_named(api_client, namespace):
    # JSON's 1.0 reaches the apiserver as a float (kubectl turns a YAML 1.0 into 1): what a rule
    # reads is refused at the field; what no rule reads is taken as the integer it is.
    path = f"/apis/{GROUP}/{VERSION}/namespaces/{namespace}/{PLURAL}"
    document = minimal()
    document["spec"]["prefill"]["pools"][0]["replicas"] = {"min": 1.0, "max": 2}
    with pytest.raises(ApiException) as raised:
        call_json(api_client, "POST", path, document)
    message = json.loads(raised.value.body)["message"]
    assert (
        'spec.prefill.pools[0].replicas.min: Invalid value: "integer": invalid data, expected '
        "int, got float64 evaluating rule: must be written as an integer (1, not 1.0)" in message
    ), message
    document = minimal()
    document["spec"]["slo"]["windowSeconds"] = 60.0
    stored = call_json(api_client, "POST", path, document)
    assert stored["spec"]["slo"]["windowSeconds"] == 60


def test_a_short_scale_down_window_needs_no_steady_window(api_client, namespace):
    # A fixed default of 60 would put the steady window over a 30 s long one and be refused.
    document = minimal()
    document["spec"]["scaling"] = {"scaleDown": {"stabilizationSeconds": 30, "maxStepReplicas": 1}}
    stored = create(api_client, namespace, document)
    assert "steadyStabilizationSeconds" not in stored["spec"]["scaling"]["scaleDown"]
    assert parse_pddeployment(stored).spec.scaling.scale_down.steady_window_seconds == 30


def test_a_steady_window_over_the_long_one_is_refused_at_admission_naming_the_field(
    api_client, namespace
):
    document = minimal()
    document["spec"]["scaling"] = {
        "scaleDown": {
            "stabilizationSeconds": 30,
            "maxStepReplicas": 1,
            "steadyStabilizationSeconds": 60,
        }
    }
    with pytest.raises(ApiException) as raised:
        create(api_client, namespace, document, dry_run=True)
    message = json.loads(raised.value.body)["message"]
    assert "spec.scaling.scaleDown.steadyStabilizationSeconds: Invalid value" in message
    assert "lower it, or leave it out" in message


def test_model_name_is_immutable(api_client, namespace):
    create(api_client, namespace, minimal())
    api = client.CustomObjectsApi(api_client)
    with pytest.raises(ApiException) as raised:
        api.patch_namespaced_custom_object(
            GROUP, VERSION, namespace, PLURAL, "minimal", {"spec": {"model": {"name": "other"}}}
        )
    assert "spec.model.name is immutable" in json.loads(raised.value.body)["message"]


def _deployment(name: str) -> client.V1Deployment:
    labels = {"app": name}
    return client.V1Deployment(
        metadata=client.V1ObjectMeta(name=name),
        spec=client.V1DeploymentSpec(
            replicas=2,
            selector=client.V1LabelSelector(match_labels=labels),
            template=client.V1PodTemplateSpec(
                metadata=client.V1ObjectMeta(labels=labels),
                spec=client.V1PodSpec(containers=[client.V1Container(name="c", image="engine:1")]),
            ),
        ),
    )


def test_deployment_creates_pending_pods_and_deletion_garbage_collects(api_client, namespace):
    apps, core = client.AppsV1Api(api_client), client.CoreV1Api(api_client)
    apps.create_namespaced_deployment(namespace, _deployment("engine"))

    def two_pods():
        pods = core.list_namespaced_pod(namespace).items
        return pods if len(pods) == 2 else None

    pods = wait_for(two_pods, what="two pods from the Deployment's ReplicaSet")
    assert all(p.status.phase == "Pending" for p in pods)  # no nodes, no scheduler yet
    assert len(apps.list_namespaced_replica_set(namespace).items) == 1

    apps.delete_namespaced_deployment("engine", namespace, propagation_policy="Background")
    wait_for(
        lambda: (
            not apps.list_namespaced_replica_set(namespace).items
            and not core.list_namespaced_pod(namespace).items
        ),
        what="the garbage collector to delete the ReplicaSet and its pods",
    )


def test_deleting_a_pddeployment_garbage_collects_its_owned_objects(api_client, namespace):
    owner = create(api_client, namespace, minimal())
    core = client.CoreV1Api(api_client)
    core.create_namespaced_config_map(
        namespace,
        client.V1ConfigMap(
            metadata=client.V1ObjectMeta(
                name="owned",
                owner_references=[
                    client.V1OwnerReference(
                        api_version=f"{GROUP}/{VERSION}",
                        kind="PDDeployment",
                        name="minimal",
                        uid=owner["metadata"]["uid"],
                        controller=True,
                        block_owner_deletion=True,
                    )
                ],
            ),
            data={"k": "v"},
        ),
    )
    client.CustomObjectsApi(api_client).delete_namespaced_custom_object(
        GROUP, VERSION, namespace, PLURAL, "minimal"
    )
    wait_for(
        lambda: (
            not core.list_namespaced_config_map(
                namespace, field_selector="metadata.name=owned"
            ).items
        ),
        what="the ConfigMap owned by the deleted PDDeployment to be collected",
    )


def test_prometheus_scrapes_a_local_endpoint_and_the_client_reads_it(prometheus):
    registry = CollectorRegistry()
    gauge = Gauge("pd_smoke_value", "smoke test value", registry=registry)
    gauge.set(42)
    port = free_port()
    server, thread = start_http_server(port, addr="127.0.0.1", registry=registry)
    try:
        prometheus.set_targets("smoke", [f"127.0.0.1:{port}"], {"suite": "smoke"})
        prom = PrometheusConnect(url=prometheus.url, disable_ssl=True)
        result = wait_for(
            lambda: prom.custom_query('pd_smoke_value{suite="smoke"}'),
            what="Prometheus to scrape the smoke endpoint",
        )
        assert float(result[0]["value"][1]) == 42.0
    finally:
        prometheus.set_targets("smoke", [], {})
        server.shutdown()
        thread.join(timeout=5)
