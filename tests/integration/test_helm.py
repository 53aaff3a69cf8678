"""The Helm chart on the real control plane: it installs, its ServiceAccount's rights are enough
for the operator to reconcile a sample and deny what it never needs (Secrets: get by name only,
never list or watch), and the CRD is upgraded by `helm upgrade` and outlives the release.

`helm lint --strict`, `helm template` matrices and the values schema: tests/unit/test_chart.py.
"""

import copy
import json
import logging
import os
import shutil
import subprocess
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from kubetools import RunningOperator, condition, create_pdd, get_pdd, wait_for
from pd_operator.handlers.operator import OperatorConfig, OperatorState
from pd_tools.localcluster import LocalCluster, LocalClusterError
from pd_tools.localcluster.processes import MissingBinaryError, find_binary
from pdcases import ROOT, load_sample

CHART = ROOT / "charts" / "pd-operator"
SAMPLE_PATH = ROOT / "config" / "samples" / "heterogeneous-s5000-h200.yaml"
SAMPLE = load_sample(SAMPLE_PATH)
CRD_NAME = "pddeployments.pdoperator.io"


@pytest.fixture(scope="module")
def helm_bin() -> Path:
    try:
        return find_binary("helm")
    except MissingBinaryError as error:
        if os.environ.get("CI", "").lower() in {"1", "true", "yes"}:
            pytest.fail(str(error), pytrace=False)
        pytest.skip(f"{error}\n  fix: make testenv")


@pytest.fixture(scope="module")
def helm_env(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """Helm's config, cache and data in a throwaway folder: no state from the user's home."""
    home = tmp_path_factory.mktemp("helm-home")
    return {
        **os.environ,
        "HELM_CONFIG_HOME": str(home / "config"),
        "HELM_CACHE_HOME": str(home / "cache"),
        "HELM_DATA_HOME": str(home / "data"),
    }


@dataclass
class Release:
    name: str
    namespace: str
    service_account: str
    output: str


class Helm:
    def __init__(self, binary: Path, env: dict[str, str], cluster: LocalCluster) -> None:
        self.binary, self.env, self.cluster = binary, env, cluster
        self.releases: list[Release] = []

    def __call__(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        result = subprocess.run(
            [str(self.binary), *args, f"--kubeconfig={self.cluster.kubeconfig}"],
            capture_output=True,
            text=True,
            timeout=180,
            check=False,
            env=self.env,
        )
        if check:
            assert result.returncode == 0, f"helm {' '.join(args)}: {result.stderr}"
        return result

    def install(self, values: dict | None = None, *, crds: bool = False) -> Release:
        """Install the chart as a fresh release in a fresh namespace that enforces the
        restricted Pod Security Standard. Without `crds` the release leaves the CRD alone: the
        local cluster applied it, as another release or a GitOps application would."""
        values = {"crds": {"install": crds, "keep": True}, **(values or {})}
        suffix = uuid.uuid4().hex[:6]
        name, namespace = f"pdo-{suffix}", f"pdo-system-{suffix}"
        self.cluster.kubectl("create", "namespace", namespace)
        self.cluster.kubectl(
            "label", "namespace", namespace, "pod-security.kubernetes.io/enforce=restricted"
        )
        args = [f"--set-json={key}={json.dumps(value)}" for key, value in values.items()]
        result = self("install", name, str(CHART), f"--namespace={namespace}", *args)
        release = Release(name, namespace, f"{name}-pd-operator", result.stdout)
        self.releases.append(release)
        return release

    def uninstall_all(self) -> None:
        for release in self.releases:
            self("uninstall", release.name, f"--namespace={release.namespace}", check=False)
            self.cluster.kubectl("delete", "namespace", release.namespace, "--wait=false")
        self.releases.clear()


@pytest.fixture(scope="module")
def helm(helm_bin, helm_env, cluster) -> Iterator[Helm]:
    tool = Helm(helm_bin, helm_env, cluster)
    yield tool
    tool.uninstall_all()


@pytest.fixture(scope="module")
def release(helm) -> Release:
    """The default (cluster-wide) install."""
    return helm.install()


def token_kubeconfig(cluster: LocalCluster, release: Release, path: Path) -> Path:
    """A kubeconfig that authenticates as the chart's ServiceAccount (TokenRequest API)."""
    token = cluster.kubectl(
        "create", "token", release.service_account, f"--namespace={release.namespace}",
        "--duration=1h",
    ).strip()  # fmt: skip
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [
                    {
                        "name": "local",
                        "cluster": {
                            "server": cluster.server,
                            "certificate-authority": str(cluster.ca_path),
                        },
                    }
                ],
                "users": [{"name": release.service_account, "user": {"token": token}}],
                "contexts": [
                    {
                        "name": "sa",
                        "context": {"cluster": "local", "user": release.service_account},
                    }
                ],
                "current-context": "sa",
            }
        )
    )
    return path


def can_i(cluster: LocalCluster, release: Release, *request: str) -> bool:
    answer = cluster.kubectl(
        "auth", "can-i", *request,
        f"--as=system:serviceaccount:{release.namespace}:{release.service_account}",
        check=False,
    ).strip()  # fmt: skip
    assert answer in ("yes", "no"), answer
    return answer == "yes"


def permission_problems(records: list[logging.LogRecord]) -> list[str]:
    words = ("forbidden", "not enough permissions", "403")
    return [
        r.getMessage()
        for r in records
        if r.levelno >= logging.WARNING and any(w in r.getMessage().lower() for w in words)
    ]


def test_install_notes_and_objects(helm, release):
    assert f"rollout status deployment/{release.service_account}" in release.output
    assert "this release does not manage the PDDeployment CRD" in release.output
    manifest = helm("get", "manifest", release.name, f"--namespace={release.namespace}").stdout
    kinds = {doc["kind"] for doc in yaml.safe_load_all(manifest) if doc}
    assert kinds == {
        "ServiceAccount",
        "ClusterRole",
        "ClusterRoleBinding",
        "Role",  # the leader Lease's, in the release's namespace
        "RoleBinding",
        "Service",
        "Deployment",
    }


def test_monitors_asked_for_are_rendered_and_refused_loudly_without_their_api(helm):
    # This cluster has no Prometheus Operator: the install fails naming the kind, instead of
    # succeeding without the PodMonitor the autoscaler's metrics depend on.
    name, namespace = f"pdo-{uuid.uuid4().hex[:6]}", "default"
    result = helm(
        "install", name, str(CHART), f"--namespace={namespace}",
        "--set=crds.install=false", "--set=engineMonitor.enabled=true",
        check=False,
    )  # fmt: skip
    helm("uninstall", name, f"--namespace={namespace}", check=False)
    assert result.returncode != 0
    assert "PodMonitor" in result.stderr, result.stderr


def test_operator_pod_is_admitted_under_restricted_pod_security(cluster, api_client, release):
    core = client.CoreV1Api(api_client)
    selector = f"app.kubernetes.io/instance={release.name}"

    def pod_created():
        return core.list_namespaced_pod(release.namespace, label_selector=selector).items

    try:
        (pod,) = wait_for(pod_created, timeout=30, what="the operator's pod")
    except AssertionError:
        # Pod Security rejections show up as the ReplicaSet's FailedCreate events.
        raise AssertionError(cluster.kubectl("get", "events", "-n", release.namespace)) from None
    assert pod.spec.security_context.run_as_non_root is True
    assert pod.spec.service_account_name == release.service_account


def test_service_account_token_is_enough_to_reconcile_a_sample(
    cluster, api_client, namespace, release, tmp_path, caplog
):
    kubeconfig = token_kubeconfig(cluster, release, tmp_path / "sa.kubeconfig")
    caplog.set_level(logging.WARNING)
    # As the chart runs it: leader election on, the Lease in the release's namespace.
    operator = RunningOperator(
        str(kubeconfig), workers=2, resync_seconds=5, lease_namespace=release.namespace
    ).start()
    try:
        wait_for(
            lambda: operator.state.leading, what="the Lease, taken with the ServiceAccount's rights"
        )
        create_pdd(api_client, namespace, copy.deepcopy(SAMPLE))
        apps, core = client.AppsV1Api(api_client), client.CoreV1Api(api_client)
        wait_for(
            lambda: len(apps.list_namespaced_deployment(namespace).items) == 3,
            what="the pools' and the router's Deployments, with the ServiceAccount's rights",
        )
        services = wait_for(
            lambda: (
                (names := {s.metadata.name for s in core.list_namespaced_service(namespace).items})
                == {"glm-hetero-prefill", "glm-hetero-decode", "glm-hetero"}
                and names
            ),
            what="the roles' Services and the endpoint",
        )
        assert services
        # The router's Role grants pod reads the operator holds itself: no escalation refused.
        rbac = client.RbacAuthorizationV1Api(api_client)
        assert rbac.read_namespaced_role("glm-hetero-router", namespace).rules[0].resources == [
            "pods"
        ]
        assert rbac.read_namespaced_role_binding("glm-hetero-router", namespace)
        obj = wait_for(
            lambda: (
                (o := get_pdd(api_client, namespace, "glm-hetero")).get("status", {}).get("pools")
                and o
            ),
            what="status written with the ServiceAccount's rights",
        )
        assert obj["status"]["observedGeneration"] == 1
        assert condition(obj, "Reconciling")["status"] == "True"  # no nodes: pods stay Pending
        wait_for(operator.settled, what="the work queue to drain")
    finally:
        operator.stop()
    assert permission_problems(caplog.records) == []


@pytest.mark.parametrize(
    "request_",
    [
        # Secrets: get by name only (spec.scaling.prometheus), never enumerated or watched.
        ("list", "secrets"),
        ("watch", "secrets"),
        ("list", "secrets", "--all-namespaces"),
        ("list", "configmaps"),
        ("create", "pods"),
        ("delete", "pods"),  # pods are marked for their ReplicaSet to remove, never deleted
        ("update", "pddeployments.pdoperator.io"),  # the user's spec is never written
        ("patch", "pddeployments.pdoperator.io"),
        ("get", "deployments.apps"),  # every read comes from a watch
        ("patch", "nodes"),
        ("create", "clusterrolebindings.rbac.authorization.k8s.io"),
    ],
    ids=" ".join,
)
def test_service_account_is_denied_what_the_operator_never_needs(
    cluster, namespace, release, request_
):
    assert not can_i(cluster, release, *request_, f"--namespace={namespace}")


def test_service_account_may_do_what_the_operator_does(cluster, namespace, release):
    for request_ in (
        ("watch", "pddeployments.pdoperator.io"),
        ("patch", "pddeployments.pdoperator.io", "--subresource=status"),
        ("create", "deployments.apps"),
        ("delete", "services"),
        ("patch", "poddisruptionbudgets.policy"),
        ("create", "events"),
        ("watch", "pods"),
        ("patch", "pods"),  # pod-deletion-cost on the pods a shrinking pool should lose
        ("get", "secrets"),  # the Secrets a PDDeployment's spec.scaling.prometheus names
    ):
        assert can_i(cluster, release, *request_, f"--namespace={namespace}"), request_
    assert can_i(cluster, release, "watch", "nodes")
    # The leader Lease: in the release's namespace only.
    lease = ("update", "leases.coordination.k8s.io")
    assert can_i(cluster, release, *lease, f"--namespace={release.namespace}")
    assert not can_i(cluster, release, *lease, f"--namespace={namespace}")


def test_secrets_are_read_by_name_only_with_the_service_accounts_own_token(
    cluster, api_client, namespace, release, tmp_path
):
    client.CoreV1Api(api_client).create_namespaced_secret(
        namespace, {"metadata": {"name": "prom-auth"}, "stringData": {"token": "x"}}
    )
    kubeconfig = token_kubeconfig(cluster, release, tmp_path / "sa.kubeconfig")
    as_operator = client.CoreV1Api(config.new_client_from_config(config_file=str(kubeconfig)))
    # What the autoscaler does for spec.scaling.prometheus.bearerTokenSecretRef.
    assert as_operator.read_namespaced_secret("prom-auth", namespace).data["token"]
    # Which Secrets exist stays hidden: no list, in the namespace or anywhere.
    for listing in (
        lambda: as_operator.list_namespaced_secret(namespace),
        as_operator.list_secret_for_all_namespaces,
    ):
        with pytest.raises(ApiException) as denied:
            listing()
        assert denied.value.status == 403


def test_namespaced_install_is_enough_for_an_operator_watching_those_namespaces(
    cluster, api_client, namespace, helm, tmp_path
):
    # Without the right to read Secrets (rbac.readPrometheusSecrets=false): the operator needs
    # it only for PDDeployments that name one.
    scoped = helm.install(
        {"watchNamespaces": [namespace], "rbac": {"create": True, "readPrometheusSecrets": False}}
    )
    assert not can_i(cluster, scoped, "list", "deployments.apps", "--all-namespaces")
    assert not can_i(cluster, scoped, "get", "secrets", f"--namespace={namespace}")
    kubeconfig = token_kubeconfig(cluster, scoped, tmp_path / "sa.kubeconfig")
    api = config.new_client_from_config(config_file=str(kubeconfig))
    # What the operator does first, before kopf reports ready: fails fast where it lacks rights.
    OperatorState(api, OperatorConfig(namespaces=[namespace])).prime()
    operator = RunningOperator(str(kubeconfig), namespaces=[namespace], workers=2).start()
    try:
        create_pdd(api_client, namespace, copy.deepcopy(SAMPLE))
        wait_for(
            lambda: get_pdd(api_client, namespace, "glm-hetero").get("status", {}).get("pools"),
            what="status written with the namespaced rights",
        )
    finally:
        operator.stop()


def newer_chart(folder: Path) -> Path:
    """A copy of the chart whose CRD is the next version's (here: one more short name)."""
    chart = folder / "pd-operator"
    shutil.copytree(CHART, chart)
    path = chart / "files" / "crds" / "pdoperator.io_pddeployments.yaml"
    crd = yaml.safe_load(path.read_text())
    crd["spec"]["names"]["shortNames"] = ["pdd", "pdds"]
    path.write_text(yaml.safe_dump(crd))
    return chart


def test_crd_comes_with_the_release_upgrades_with_it_and_outlives_it(helm_bin, helm_env, tmp_path):
    # A cluster without the CRD, so that the release creates it.
    fresh = LocalCluster(install_crds=False)
    fresh.start()
    try:
        tool = Helm(helm_bin, helm_env, fresh)
        release = tool.install(crds=True)
        crd = yaml.safe_load(fresh.kubectl("get", "crd", CRD_NAME, "-o", "yaml"))
        assert crd["spec"]["names"]["shortNames"] == ["pdd"]
        assert crd["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
        fresh.kubectl("create", "namespace", "llm")
        fresh.kubectl("apply", "-n", "llm", "-f", str(SAMPLE_PATH))
        # A second release in the same cluster leaves the first one's CRD alone.
        tool.install({"watchNamespaces": ["llm"]})

        # `helm upgrade` to the next chart version upgrades the CRD: no step before it.
        newer = newer_chart(tmp_path)
        where = f"--namespace={release.namespace}"
        tool("upgrade", release.name, str(newer), where, "--reuse-values")
        names = fresh.kubectl("get", "crd", CRD_NAME, "-o", "jsonpath={.spec.names.shortNames}")
        assert yaml.safe_load(names) == ["pdd", "pdds"]

        # Uninstalling the release leaves the CRD, hence every PDDeployment, in place.
        tool("uninstall", release.name, where)
        assert fresh.kubectl("get", "pdds", "-n", "llm", "-o", "name").split() == [
            "pddeployment.pdoperator.io/glm-hetero"
        ]

        # A release that finds the CRD already there (left by an uninstalled release, applied
        # by hand, or installed from an older chart's crds/) adopts it only when told to.
        fresh.kubectl("create", "namespace", "pdo-again")
        tool.releases.append(Release("pdo-again", "pdo-again", "", ""))
        args = ("upgrade", "--install", "pdo-again", str(CHART), "--namespace=pdo-again")
        refused = tool(*args, check=False)
        assert refused.returncode != 0 and CRD_NAME in refused.stderr, refused.stderr
        tool(*args, "--take-ownership")
        crd = yaml.safe_load(fresh.kubectl("get", "crd", CRD_NAME, "-o", "yaml"))
        assert crd["metadata"]["annotations"]["meta.helm.sh/release-name"] == "pdo-again"

        # CRDs managed outside any release (crds.install=false): the documented path renders
        # the next chart's CRD and applies it over the fields Helm wrote.
        rendered = tool(
            "template", "pd-operator", str(newer), "--set=crds.install=true",
            "--show-only=templates/crds.yaml",
        ).stdout  # fmt: skip
        path = tmp_path / "crd.yaml"
        path.write_text(rendered)
        with pytest.raises(LocalClusterError, match=r'conflicts? with "helm'):
            fresh.kubectl("apply", "--server-side", "-f", str(path))
        fresh.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(path))
        names = fresh.kubectl("get", "crd", CRD_NAME, "-o", "jsonpath={.spec.names.shortNames}")
        assert yaml.safe_load(names) == ["pdd", "pdds"]
    finally:
        tool.uninstall_all()
        fresh.stop()


def test_owner_reference_enforcement_admits_what_the_charts_rights_write(
    helm_bin, helm_env, tmp_path
):
    # OwnerReferencesPermissionEnforcement (on by default in OpenShift) lets a client set
    # blockOwnerDeletion on a child only with `update` on the owner's finalizers.
    enforced = LocalCluster(admission_plugins=["OwnerReferencesPermissionEnforcement"])
    try:
        enforced.start()
    except LocalClusterError as error:
        pytest.fail(f"a control plane with owner-reference enforcement: {error}", pytrace=False)
    tool = Helm(helm_bin, helm_env, enforced)
    try:
        release = tool.install()
        api = config.new_client_from_config(config_file=str(enforced.kubeconfig))
        namespace = f"t-{uuid.uuid4().hex[:10]}"
        enforced.kubectl("create", "namespace", namespace)
        kubeconfig = token_kubeconfig(enforced, release, tmp_path / "sa.kubeconfig")
        operator = RunningOperator(str(kubeconfig), workers=2, resync_seconds=5).start()
        try:
            create_pdd(api, namespace, copy.deepcopy(SAMPLE))
            # Every child, the router's included, carries blockOwnerDeletion: all admitted.
            wait_for(
                lambda: len(client.AppsV1Api(api).list_namespaced_deployment(namespace).items) == 3,
                what="the pools' and the router's Deployments under owner-reference enforcement",
            )
            obj = wait_for(
                lambda: (
                    (o := get_pdd(api, namespace, "glm-hetero")).get("status", {}).get("conditions")
                    and o
                ),
                what="a first status",
            )
            assert condition(obj, "Stalled")["status"] == "False", obj["status"]
        finally:
            operator.stop()
    finally:
        tool.uninstall_all()
        enforced.stop()
