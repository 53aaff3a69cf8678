"""Session-scoped local control plane and Prometheus; a fresh namespace per test.

With CI=true a missing binary or a failed start fails the tests; elsewhere they are skipped
with the command that fixes it.
"""

import os
import uuid
from collections.abc import Callable, Iterator

import pytest
from kubernetes import client, config

from kubetools import RunningOperator
from pd_tools.localcluster import (
    ExistingCluster,
    LocalCluster,
    LocalClusterError,
    LocalPrometheus,
    MissingBinaryError,
)
from pd_tools.simcluster.virtual import VirtualCluster
from pdcases import ROOT

FIX = "make testenv  (or: make test, which runs it)"
TINY = ROOT / "config" / "clusters" / "tiny.yaml"


def _unavailable(what: str, error: LocalClusterError) -> None:
    message = f"{what} unavailable: {error}"
    ci = os.environ.get("CI", "").lower() in {"1", "true", "yes"}
    if ci or not isinstance(error, MissingBinaryError):
        pytest.fail(message, pytrace=False)
    pytest.skip(f"{message}\n  fix: {FIX}")


@pytest.fixture(scope="session")
def cluster() -> Iterator[LocalCluster | ExistingCluster]:
    """The local control plane, or the cluster named by PD_TEST_KUBECONFIG (e.g. kind)."""
    existing = os.environ.get("PD_TEST_KUBECONFIG")
    try:
        local = ExistingCluster(existing) if existing else LocalCluster()
        local.start()
    except LocalClusterError as error:
        _unavailable("local control plane", error)
    print(f"\nlocal control plane ready in {local.startup_seconds:.1f}s at {local.server}")
    yield local
    local.stop()


@pytest.fixture(scope="module")
def lws_cluster() -> Iterator[LocalCluster]:
    """A private local control plane that also runs the LeaderWorkerSet controller (and the
    StatefulSet controller it needs); only the modules that ask for it pay for it."""
    try:
        local = LocalCluster(lws=True)
        local.start()
    except LocalClusterError as error:
        _unavailable("local control plane with the LeaderWorkerSet controller", error)
    print(f"\nlocal control plane with LWS ready in {local.startup_seconds:.1f}s at {local.server}")
    yield local
    local.stop()


@pytest.fixture(scope="session")
def prometheus() -> Iterator[LocalPrometheus]:
    try:
        server = LocalPrometheus()
        server.start()
    except LocalClusterError as error:
        _unavailable("Prometheus", error)
    yield server
    server.stop()


@pytest.fixture
def prometheus_with_history() -> Iterator[Callable[[str, str], LocalPrometheus]]:
    """Starts a Prometheus of its own whose data folder holds `openmetrics` history (promtool
    backfill), kept for `retention`: `make(openmetrics, retention)`."""
    started: list[LocalPrometheus] = []

    def make(openmetrics: str, retention: str) -> LocalPrometheus:
        server = LocalPrometheus(retention=retention)
        started.append(server)
        try:
            server.backfill(openmetrics)
            server.start()
        except LocalClusterError as error:
            _unavailable("Prometheus with backfilled history", error)
        return server

    yield make
    for server in started:
        server.stop()


@pytest.fixture(scope="session")
def api_client(cluster: LocalCluster) -> client.ApiClient:
    return config.new_client_from_config(config_file=str(cluster.kubeconfig))


@pytest.fixture
def namespace(api_client: client.ApiClient) -> Iterator[str]:
    name = f"t-{uuid.uuid4().hex[:10]}"
    core = client.CoreV1Api(api_client)
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=name)))
    yield name
    core.delete_namespace(name)


@pytest.fixture
def operator(cluster: LocalCluster, namespace: str) -> Iterator[RunningOperator]:
    """The operator watching only this test's namespace, so that writes are counted per test."""
    running = RunningOperator(
        str(cluster.kubeconfig), namespaces=[namespace], workers=2, resync_seconds=1
    ).start()
    yield running
    running.stop()


@pytest.fixture
def tiny_nodes(api_client: client.ApiClient, namespace: str) -> Iterator[VirtualCluster]:
    """Two 8-card S5000 nodes and one 8-card H200 node whose pods turn Ready in about a second."""
    virtual = VirtualCluster(
        api_client, TINY, time_scale=0.01, name_prefix=f"{namespace}-", namespace=namespace
    )
    virtual.start()
    yield virtual
    client.AppsV1Api(api_client).delete_collection_namespaced_deployment(namespace)
    client.CoreV1Api(api_client).delete_collection_namespaced_pod(namespace, grace_period_seconds=0)
    virtual.stop()


@pytest.fixture
def operator_on_tiny_nodes(
    cluster: LocalCluster, namespace: str, tiny_nodes: VirtualCluster
) -> Iterator[RunningOperator]:
    """The operator watching this test's namespace, with the tiny cluster's nodes running."""
    running = RunningOperator(
        str(cluster.kubeconfig), namespaces=[namespace], workers=2, resync_seconds=2
    ).start()
    yield running
    running.stop()
