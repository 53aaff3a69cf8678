"""The Helm chart (charts/pd-operator) and the kustomize base (config/default), rendered by the
real `helm` and `kubectl kustomize`: what they would install, with which rights.

helm and kubectl come from the test environment (`make testenv`); with CI=true a missing one
fails these tests, elsewhere they are skipped with the command that fixes it.
"""

import functools
import json
import os
import re
import shutil
import subprocess
import tomllib
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest
import yaml

from pd_operator.cli.run import run as pdctl_run
from pd_operator.core.children import ENGINE_APP_NAME, MANAGED_BY, PORT_NAME
from pd_operator.core.engine_args import METRICS_PATH
from pdcases import ROOT

CHART = ROOT / "charts" / "pd-operator"
KUSTOMIZE_BASE = ROOT / "config" / "default"
RELEASE, RELEASE_NAMESPACE = "pdo", "pd-system"
FULLNAME = "pdo-pd-operator"
VERSION = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
FIX = "make testenv  (or set PD_TESTBIN to the folder that holds helm and kubectl)"
STANDARD_LABELS = {
    "app.kubernetes.io/name",
    "app.kubernetes.io/instance",
    "app.kubernetes.io/version",
    "app.kubernetes.io/managed-by",
    "helm.sh/chart",
}
CLUSTER_SCOPED = {"ClusterRole", "ClusterRoleBinding", "CustomResourceDefinition", "Namespace"}

Rule = tuple[str, str, str]  # (apiGroup, resource, verb)

# Everything the operator does in a namespace it serves (adapters/kube.py, handlers/operator.py).
NAMESPACED_RIGHTS: set[Rule] = {
    ("pdoperator.io", "pddeployments", "list"),
    ("pdoperator.io", "pddeployments", "watch"),
    ("pdoperator.io", "pddeployments/status", "patch"),
    # blockOwnerDeletion on children, under OwnerReferencesPermissionEnforcement.
    ("pdoperator.io", "pddeployments/finalizers", "update"),
    # Mode External: the PDPools it creates and deletes, and their status (never their spec).
    *{("pdoperator.io", "pdpools", v) for v in ("list", "watch", "create", "patch", "delete")},
    ("pdoperator.io", "pdpools/status", "patch"),
    *{
        (group, resource, verb)
        for group, resource in (
            ("apps", "deployments"),
            # Multi-node pools (accelerator.nodesPerReplica > 1).
            ("leaderworkerset.x-k8s.io", "leaderworkersets"),
            ("", "services"),
            ("policy", "poddisruptionbudgets"),
            # The router's own identity, its pod-watching Role and binding, and its HPA.
            ("", "serviceaccounts"),
            ("rbac.authorization.k8s.io", "roles"),
            ("rbac.authorization.k8s.io", "rolebindings"),
            ("autoscaling", "horizontalpodautoscalers"),
        )
        for verb in ("list", "watch", "create", "patch", "delete")
    },
    ("", "pods", "list"),
    ("", "pods", "watch"),
    ("", "pods", "patch"),  # pod-deletion-cost before a pool shrinks
    ("", "events", "create"),
    # The Secrets that spec.scaling.prometheus names, by name: get, never list or watch.
    ("", "secrets", "get"),
}
# The leader Lease, in the release's namespace only (leaderElection, on by default).
LEADER = {
    ("RoleBinding", RELEASE_NAMESPACE): {
        ("coordination.k8s.io", "leases", verb) for verb in ("get", "create", "update")
    }
}
# Cluster-scoped reads: nodes for placement and capacity, CRDs for kopf's resource discovery.
CLUSTER_RIGHTS: set[Rule] = {
    ("", "nodes", "list"),
    ("", "nodes", "watch"),
    ("apiextensions.k8s.io", "customresourcedefinitions", "list"),
    ("apiextensions.k8s.io", "customresourcedefinitions", "watch"),
}


def find_tool(name: str) -> Path:
    """A binary from $PD_TESTBIN, PATH or the test environment's cache; skip or fail if none."""
    folder = os.environ.get("PD_TESTBIN")
    candidates = [Path(folder) / name] if folder else []
    on_path = shutil.which(name)
    candidates += [Path(on_path)] if on_path else []
    cache = Path(
        os.environ.get("PD_TESTBIN_CACHE")
        or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
        / "pd-operator"
        / "testbin"
    )
    candidates += sorted(cache.glob(f"k8s-*/{name}"), reverse=True)
    for candidate in candidates:
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return candidate
    message = f"{name} not found in $PD_TESTBIN, PATH or {cache}"
    if os.environ.get("CI", "").lower() in {"1", "true", "yes"}:
        pytest.fail(message, pytrace=False)
    pytest.skip(f"{message}\n  fix: {FIX}")


def run(argv: list[str | Path]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(a) for a in argv], capture_output=True, text=True, timeout=120, check=False
    )


def helm_args(values: dict[str, Any], api_versions: Iterable[str]) -> list[str]:
    args = [f"--set-json={key}={json.dumps(value)}" for key, value in values.items()]
    return args + [f"--api-versions={api}" for api in api_versions]


@functools.cache
def _render(values_json: str, api_versions: tuple[str, ...]) -> tuple[int, str, str]:
    argv = [find_tool("helm"), "template", RELEASE, CHART, f"--namespace={RELEASE_NAMESPACE}"]
    result = run(argv + helm_args(json.loads(values_json), api_versions))
    return result.returncode, result.stdout, result.stderr


def render(values: dict[str, Any] | None = None, api_versions: Iterable[str] = ()) -> list[dict]:
    """The objects `helm template` renders; fails the test with helm's error otherwise."""
    code, out, err = _render(json.dumps(values or {}, sort_keys=True), tuple(api_versions))
    assert code == 0, err
    return [doc for doc in yaml.safe_load_all(out) if doc]


def render_error(values: dict[str, Any], api_versions: Iterable[str] = ()) -> str:
    code, _, err = _render(json.dumps(values, sort_keys=True), tuple(api_versions))
    assert code != 0, f"helm template accepted {values}"
    return err


def kinds(objects: list[dict]) -> list[tuple[str, str, str]]:
    return sorted(
        (o["kind"], o["metadata"].get("namespace", ""), o["metadata"]["name"]) for o in objects
    )


def one(objects: list[dict], kind: str, name: str | None = None) -> dict:
    found = [o for o in objects if o["kind"] == kind and name in (None, o["metadata"]["name"])]
    assert len(found) == 1, f"expected one {kind} {name or ''}, got {kinds(found)}"
    return found[0]


def rights(rules: Iterable[dict]) -> set[Rule]:
    """Rules expanded to (group, resource, verb), so that grouping does not matter."""
    return {
        (group, resource, verb)
        for rule in rules
        for group in rule.get("apiGroups", [])
        for resource in rule.get("resources", [])
        for verb in rule["verbs"]
    }


def granted(objects: list[dict]) -> dict[tuple[str, str], set[Rule]]:
    """What the operator's ServiceAccount is bound to: (kind, namespace) -> rights."""
    roles = {
        (o["kind"], o["metadata"].get("namespace", ""), o["metadata"]["name"]): o for o in objects
    }
    result: dict[tuple[str, str], set[Rule]] = {}
    for binding in objects:
        if binding["kind"] not in ("ClusterRoleBinding", "RoleBinding"):
            continue
        namespace = binding["metadata"].get("namespace", "")
        ref = binding["roleRef"]
        role = roles[(ref["kind"], "" if ref["kind"] == "ClusterRole" else namespace, ref["name"])]
        assert all(s["kind"] == "ServiceAccount" for s in binding["subjects"])
        result.setdefault((binding["kind"], namespace), set()).update(rights(role["rules"]))
    return result


def container(objects: list[dict]) -> dict:
    return one(objects, "Deployment")["spec"]["template"]["spec"]["containers"][0]


# Values combinations a user would install, with the APIs the cluster serves.
MATRIX = {
    "default": ({}, ()),
    "watch-namespaces": ({"watchNamespaces": ["team-a", "team-b"]}, ()),
    "monitoring-without-api": (
        {
            "serviceMonitor": {"enabled": True},
            "prometheusRule": {"enabled": True},
            "grafanaDashboard": {"enabled": True},
            "engineMonitor": {"enabled": True},
        },
        (),
    ),
    "monitoring-with-api": (
        {
            "serviceMonitor": {"enabled": True},
            "prometheusRule": {"enabled": True},
            "engineMonitor": {"enabled": True},
        },
        ("monitoring.coreos.com/v1",),
    ),
    "engine-monitor-namespaced": (
        {"engineMonitor": {"enabled": True}, "watchNamespaces": ["team-a"]},
        ("monitoring.coreos.com/v1",),
    ),
    "crds-managed-elsewhere": ({"crds": {"install": False, "keep": True}}, ()),
}


def test_chart_passes_helm_lint_strict():
    result = run([find_tool("helm"), "lint", "--strict", CHART])
    assert result.returncode == 0, result.stdout + result.stderr


def test_chart_crds_are_the_repositorys_crds_byte_for_byte():
    repo = {p.name: p.read_bytes() for p in (ROOT / "crds").glob("*.yaml")}
    chart = {p.name: p.read_bytes() for p in (CHART / "files" / "crds").glob("*.yaml")}
    assert repo, "no CRD in crds/"
    assert chart == repo, (
        "charts/pd-operator/files/crds is stale: cp crds/*.yaml charts/pd-operator/files/crds/"
    )
    # Helm installs a chart's crds/ once and never upgrades it: the CRD is a template instead.
    assert not (CHART / "crds").exists()


def test_crd_is_a_template_that_helm_upgrade_upgrades_and_uninstall_keeps():
    sources = [yaml.safe_load(p.read_text()) for p in sorted((ROOT / "crds").glob("*.yaml"))]
    rendered = [o for o in render() if o["kind"] == "CustomResourceDefinition"]
    assert [c["metadata"]["name"] for c in rendered] == [c["metadata"]["name"] for c in sources]
    for crd, source in zip(rendered, sources, strict=True):
        assert crd["spec"] == source["spec"]
        assert crd["metadata"]["annotations"] == {"helm.sh/resource-policy": "keep"}
    unkept = [
        o
        for o in render({"crds": {"install": True, "keep": False}})
        if o["kind"] == "CustomResourceDefinition"
    ]
    assert len(unkept) == len(sources)
    for crd in unkept:
        assert "helm.sh/resource-policy" not in crd["metadata"].get("annotations", {})
    elsewhere = render({"crds": {"install": False, "keep": True}})
    assert not [o for o in elsewhere if o["kind"] == "CustomResourceDefinition"]


def test_chart_and_kustomize_image_follow_the_package_version():
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert chart["apiVersion"] == "v2"
    assert chart["appVersion"] == VERSION
    assert container(render())["image"] == f"pd-operator:{VERSION}"
    kustomization = yaml.safe_load((KUSTOMIZE_BASE / "kustomization.yaml").read_text())
    assert {i["name"]: i["newTag"] for i in kustomization["images"]} == {"pd-operator": VERSION}


def test_default_install_runs_one_restricted_operator_pod():
    objects = render()
    deployment = one(objects, "Deployment", FULLNAME)
    assert deployment["spec"]["replicas"] == 1
    # Leader election: a new pod starts as a standby before the old one stops.
    assert deployment["spec"]["strategy"] == {
        "type": "RollingUpdate",
        "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0},
    }
    pod = deployment["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == FULLNAME
    assert pod["securityContext"]["runAsNonRoot"] is True
    # The image's USER (the Dockerfile), so that runAsNonRoot holds with either.
    image_user = re.findall(r"^USER (\d+)", (ROOT / "Dockerfile").read_text(), re.MULTILINE)
    assert pod["securityContext"]["runAsUser"] == int(image_user[-1]) == 65532
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    main = container(objects)
    assert main["securityContext"] == {
        "runAsNonRoot": True,
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "capabilities": {"drop": ["ALL"]},
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    ports = {p["name"]: p["containerPort"] for p in main["ports"]}
    assert ports == {"metrics": 8000, "health": 8080}
    assert main["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "health"}
    assert main["resources"]["requests"] and main["resources"]["limits"]["memory"]
    assert main["args"] == [
        "--metrics-port=8000",
        "--health-port=8080",
        "--workers=4",
        "--resync-seconds=300",
        f"--activator-image={main['image']}",  # the router pods' activator: this very image
        "--leader-election",
    ]
    service = one(objects, "Service", f"{FULLNAME}-metrics")
    assert service["spec"]["ports"][0]["targetPort"] == "metrics"
    selector = deployment["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= selector.items()


def test_values_become_the_operators_command_line():
    values = {
        "watchNamespaces": ["team-a", "team-b"],
        "workers": 2,
        "resyncSeconds": 60,
        "verbose": True,
        "ports": {"metrics": 9000, "health": 9001},
        "prometheusUrl": "http://prometheus-operated.monitoring.svc:9090",
        "autoscale": False,
        "countOtherPods": False,
    }
    main = container(render(values))
    assert main["args"] == [
        "--metrics-port=9000",
        "--health-port=9001",
        "--workers=2",
        "--resync-seconds=60",
        f"--activator-image={main['image']}",
        "--namespace=team-a",
        "--namespace=team-b",
        "--leader-election",
        "--prometheus-url=http://prometheus-operated.monitoring.svc:9090",
        "--no-autoscale",
        "--ignore-other-pods",
        "--verbose",
    ]
    # Every flag the chart can pass is one `pdctl run` (python -m pd_operator) accepts.
    parsed = pdctl_run.make_context("run", list(main["args"])).params
    assert (
        parsed["namespace"],
        parsed["workers"],
        parsed["no_autoscale"],
        parsed["ignore_other_pods"],
    ) == (("team-a", "team-b"), 2, True, True)
    assert parsed["activator_image"] == main["image"]
    assert {p["containerPort"] for p in main["ports"]} == {9000, 9001}


def test_cluster_wide_rbac_grants_exactly_what_the_operator_uses():
    assert granted(render()) == {
        ("ClusterRoleBinding", ""): NAMESPACED_RIGHTS | CLUSTER_RIGHTS,
        **LEADER,
    }


def test_one_operator_without_leader_election_and_standbys_with_it():
    alone = render({"leaderElection": {"enabled": False}})
    deployment = one(alone, "Deployment", FULLNAME)
    assert deployment["spec"]["strategy"] == {"type": "Recreate"}  # never two at once
    assert "--leader-election" not in container(alone)["args"]
    assert granted(alone) == {("ClusterRoleBinding", ""): NAMESPACED_RIGHTS | CLUSTER_RIGHTS}
    error = render_error({"leaderElection": {"enabled": False}, "replicaCount": 2})
    assert "replicaCount above 1 needs leaderElection.enabled" in error
    standbys = one(render({"replicaCount": 2}), "Deployment", FULLNAME)
    assert standbys["spec"]["replicas"] == 2


@pytest.mark.parametrize("case", sorted(MATRIX))
def test_secrets_are_only_ever_got_by_name_never_listed_or_watched(case):
    values, api_versions = MATRIX[case]
    for scope, granted_rights in granted(render(values, api_versions)).items():
        on_secrets = {verb for group, resource, verb in granted_rights if resource == "secrets"}
        assert on_secrets <= {"get"}, scope


def test_reading_prometheus_secrets_can_be_turned_off():
    off = {"rbac": {"create": True, "readPrometheusSecrets": False}}
    assert granted(render(off)) == {
        ("ClusterRoleBinding", ""): (NAMESPACED_RIGHTS | CLUSTER_RIGHTS) - {("", "secrets", "get")},
        **LEADER,
    }
    namespaced = granted(render({**off, "watchNamespaces": ["team-a"]}))
    assert namespaced[("RoleBinding", "team-a")] == NAMESPACED_RIGHTS - {("", "secrets", "get")}


def test_prometheus_auth_mounts_its_secret_and_passes_the_files():
    values = {
        "prometheusUrl": "https://prometheus.monitoring.svc:9091",
        "prometheusAuth": {"secretName": "prom-auth", "tokenKey": "token", "caKey": "ca.crt"},
    }
    objects = render(values)
    main = container(objects)
    assert main["args"][-3:] == [
        "--prometheus-url=https://prometheus.monitoring.svc:9091",
        "--prometheus-bearer-token-file=/etc/pd-operator/prometheus/token",
        "--prometheus-ca-file=/etc/pd-operator/prometheus/ca.crt",
    ]
    parsed = pdctl_run.make_context("run", list(main["args"])).params
    assert parsed["prometheus_bearer_token_file"] == "/etc/pd-operator/prometheus/token"
    assert parsed["prometheus_ca_file"] == "/etc/pd-operator/prometheus/ca.crt"
    mount = next(m for m in main["volumeMounts"] if m["name"] == "prometheus-auth")
    assert mount == {
        "name": "prometheus-auth",
        "mountPath": "/etc/pd-operator/prometheus",
        "readOnly": True,
    }
    pod = one(objects, "Deployment")["spec"]["template"]["spec"]
    volume = next(v for v in pod["volumes"] if v["name"] == "prometheus-auth")
    assert volume["secret"]["secretName"] == "prom-auth"
    # A mounted volume, not an API read: no right comes with it.
    assert granted(objects) == granted(render())
    only_token = {"prometheusAuth": {"secretName": "prom-auth", "tokenKey": "token", "caKey": ""}}
    assert not any("ca-file" in a for a in container(render(only_token))["args"])
    error = render_error({"prometheusAuth": {"secretName": "", "tokenKey": "token", "caKey": ""}})
    assert "prometheusAuth.secretName is required" in error
    error = render_error(
        {"prometheusAuth": {"secretName": "prom-auth", "tokenKey": "", "caKey": ""}}
    )
    assert "prometheusAuth.secretName needs" in error


def test_namespaced_rbac_grants_namespaced_rights_only_in_the_watched_namespaces():
    objects = render({"watchNamespaces": ["team-a", "team-b"]})
    # kopf lists and watches namespaces when it serves a list of them.
    namespaces = {("", "namespaces", "list"), ("", "namespaces", "watch")}
    assert granted(objects) == {
        ("ClusterRoleBinding", ""): CLUSTER_RIGHTS | namespaces,
        ("RoleBinding", "team-a"): NAMESPACED_RIGHTS,
        ("RoleBinding", "team-b"): NAMESPACED_RIGHTS,
        **LEADER,
    }


@pytest.mark.parametrize("case", sorted(MATRIX))
def test_no_kopf_peering_the_leader_lease_guards_every_write(case):
    # kopf peering pauses only kopf's watch streams: the workers, resync and autoscaler the
    # Lease guards would run on from a stale cache. So the chart neither joins nor creates one.
    values, api_versions = MATRIX[case]
    objects = render(values, api_versions)
    assert not [o for o in objects if o["apiVersion"].startswith(("kopf.dev/", "zalando.org/"))]
    for granted_rights in granted(objects).values():
        assert not {r for r in granted_rights if r[0] in ("kopf.dev", "zalando.org")}
    main = container(objects)
    assert not [a for a in main["args"] if a.startswith("--peering")]
    assert "env" not in main  # POD_ID was kopf's peering identity
    assert "additional properties 'peering' not allowed" in render_error(
        {"peering": {"enabled": True, "name": "pd"}}
    )


def test_aggregated_roles_extend_view_and_edit_to_pddeployments():
    objects = render()
    view = one(objects, "ClusterRole", f"{FULLNAME}-view")
    edit = one(objects, "ClusterRole", f"{FULLNAME}-edit")
    assert view["metadata"]["labels"]["rbac.authorization.k8s.io/aggregate-to-view"] == "true"
    assert rights(view["rules"]) == {
        ("pdoperator.io", resource, verb)
        for resource in (
            "pddeployments",
            "pddeployments/status",
            "pdpools",
            "pdpools/status",
            "pdpools/scale",
        )
        for verb in ("get", "list", "watch")
    }
    labels = edit["metadata"]["labels"]
    assert labels["rbac.authorization.k8s.io/aggregate-to-edit"] == "true"
    assert labels["rbac.authorization.k8s.io/aggregate-to-admin"] == "true"
    # Users edit the spec (and scale PDPools); only the operator writes status.
    assert {r[1] for r in rights(edit["rules"])} == {"pddeployments", "pdpools", "pdpools/scale"}
    assert {r[2] for r in rights(edit["rules"]) if r[1].startswith("pdpools")} == {
        "update",
        "patch",
    }
    off = render({"rbac": {"create": True, "aggregateToDefaultRoles": False}})
    assert not [o for o in off if o["metadata"]["name"].endswith(("-view", "-edit"))]


def test_rbac_and_service_account_can_be_brought_by_the_user():
    objects = render(
        {"rbac": {"create": False}, "serviceAccount": {"create": False, "name": "platform-sa"}}
    )
    assert {o["kind"] for o in objects} == {"Deployment", "Service", "CustomResourceDefinition"}
    assert (
        one(objects, "Deployment")["spec"]["template"]["spec"]["serviceAccountName"]
        == "platform-sa"
    )
    error = render_error({"serviceAccount": {"create": False, "name": ""}})
    assert "serviceAccount.name is required" in error


def test_monitoring_objects_render_whenever_enabled_whatever_the_cluster_serves():
    values, _ = MATRIX["monitoring-with-api"]
    # A value the user set renders without the API (GitOps rendering without cluster access,
    # the Prometheus Operator's CRDs applied later), and the same as with it.
    without_api = render(values)
    monitoring = [o["kind"] for o in without_api if o["apiVersion"].startswith("monitoring.")]
    assert sorted(monitoring) == ["PodMonitor", "PodMonitor", "PrometheusRule", "ServiceMonitor"]
    with_api = render(values, ["monitoring.coreos.com/v1"])
    assert with_api == without_api
    monitor = one(with_api, "ServiceMonitor")
    assert monitor["spec"]["endpoints"][0]["port"] == "metrics"
    # The alert rules select job="pd-operator"; the autoscaler's `namespace` label must win.
    assert monitor["spec"]["endpoints"][0]["honorLabels"] is True
    assert {"action": "replace", "targetLabel": "job", "replacement": "pd-operator"} in monitor[
        "spec"
    ]["endpoints"][0]["relabelings"]
    rule = one(with_api, "PrometheusRule")
    source = yaml.safe_load((ROOT / "deploy" / "prometheus" / "pd-operator-rules.yaml").read_text())
    assert rule["spec"] == source
    # Flags off: nothing, even where the API exists.
    assert not {o["kind"] for o in render({}, ["monitoring.coreos.com/v1"])} & {
        "ServiceMonitor",
        "PrometheusRule",
        "PodMonitor",
    }


def test_engine_pod_monitor_scrapes_the_pool_pods_in_the_namespaces_the_operator_serves():
    # Relabelling semantics, and agreement with deploy/prometheus/engine-scrape.yaml:
    # tests/unit/test_engine_scrape.py.
    enabled = {"engineMonitor": {"enabled": True, "labels": {"release": "kps"}}}
    assert not [o for o in render({}, ["monitoring.coreos.com/v1"]) if o["kind"] == "PodMonitor"]
    # No monitoring.coreos.com/v1 among the cluster's APIs: rendered all the same.
    rendered = render(enabled)
    monitor = one(rendered, "PodMonitor", "pdo-pd-operator-engines")
    # The routers' own monitor comes with it (tests/unit/test_engine_scrape.py checks its rules).
    assert (
        one(rendered, "PodMonitor", "pdo-pd-operator-routers")["metadata"]["labels"]["release"]
        == "kps"
    )
    assert monitor["metadata"]["namespace"] == RELEASE_NAMESPACE
    assert monitor["metadata"]["labels"]["release"] == "kps"
    spec = monitor["spec"]
    assert spec["selector"] == {
        "matchLabels": {
            "app.kubernetes.io/name": ENGINE_APP_NAME,
            "app.kubernetes.io/managed-by": MANAGED_BY,
        }
    }
    assert spec["namespaceSelector"] == {"any": True}
    (endpoint,) = spec["podMetricsEndpoints"]
    assert (endpoint["port"], endpoint["path"]) == (PORT_NAME, METRICS_PATH)
    assert (endpoint["interval"], endpoint["scrapeTimeout"]) == ("15s", "10s")
    assert "honorLabels" not in endpoint  # ours win over any label an engine exports
    namespaced = render(
        {"engineMonitor": {"enabled": True, "interval": "5s"}, "watchNamespaces": ["a", "b"]},
        ["monitoring.coreos.com/v1"],
    )
    spec = one(namespaced, "PodMonitor", "pdo-pd-operator-engines")["spec"]
    assert spec["namespaceSelector"] == {"matchNames": ["a", "b"]}
    assert spec["podMetricsEndpoints"][0]["interval"] == "5s"


def test_grafana_dashboard_configmap_is_opt_in():
    assert not [o for o in render() if o["kind"] == "ConfigMap"]
    values = {"grafanaDashboard": {"enabled": True, "namespace": "grafana"}}
    configmap = one(render(values), "ConfigMap")
    assert configmap["metadata"]["namespace"] == "grafana"
    assert configmap["metadata"]["labels"]["grafana_dashboard"] == "1"
    dashboard = json.loads(configmap["data"]["pd-operator.json"])
    assert dashboard["uid"] == "pd-operator" and dashboard["panels"]


def notes(values: dict[str, Any]) -> str:
    """NOTES.txt as `helm install` prints it (rendered without a cluster)."""
    argv = [find_tool("helm"), "install", RELEASE, CHART, f"--namespace={RELEASE_NAMESPACE}"]
    result = run([*argv, "--dry-run=client", *helm_args(values, ())])
    assert result.returncode == 0, result.stderr
    return result.stdout.partition("NOTES:")[2]


# Where an installed user has no checkout: files of this repository, or its make targets.
REPOSITORY_PATH = re.compile(
    r"(?<![\w.-])(config|hack|deploy|crds|charts|docs|tests|operator|bench)/"
    r"|\bmake "
    r"|(?<![\w./-])[\w-]+\.(yaml|md)\b"  # a file named bare; templates/crds.yaml is the chart's
)


@pytest.mark.parametrize("case", sorted(MATRIX))
def test_install_notes_name_kubectl_commands_and_no_repository_file(case):
    values, _ = MATRIX[case]
    text = notes(values)
    assert f"rollout status deployment/{FULLNAME}" in text
    assert "kubectl explain pdd" in text
    assert not REPOSITORY_PATH.search(text), REPOSITORY_PATH.search(text)


def test_install_notes_say_who_upgrades_the_crd():
    assert "`helm upgrade` upgrades it" in notes({})
    assert "helm.sh/resource-policy: keep" in notes({})
    assert "DELETES it" in notes({"crds": {"install": True, "keep": False}})
    elsewhere = notes({"crds": {"install": False, "keep": True}})
    assert "--show-only templates/crds.yaml | kubectl apply --server-side --force-conflicts" in (
        " ".join(elsewhere.replace("\\\n", " ").split())
    )


@pytest.mark.parametrize("case", sorted(MATRIX))
def test_every_object_is_labelled_and_owns_no_field_of_another_manager(case):
    values, api_versions = MATRIX[case]
    objects = render(values, api_versions)
    assert objects
    for obj in objects:
        where = f"{obj['kind']} {obj['metadata']['name']}"
        assert obj["metadata"]["labels"].keys() >= STANDARD_LABELS, where
        assert obj["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "Helm", where
        # Status belongs to controllers; PDDeployments (and their replicas) belong to users.
        assert "status" not in obj, where
        assert obj["kind"] != "PDDeployment", where
        if obj["kind"] in CLUSTER_SCOPED:
            assert "namespace" not in obj["metadata"], where
        else:
            assert obj["metadata"].get("namespace"), where


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"replicas": 2}, "additional properties 'replicas' not allowed"),
        (
            {
                "image": {
                    "repository": "r",
                    "tag": "1",
                    "digest": "",
                    "pullPolicy": "IfNotPresent",
                    "registry": "x",
                }
            },
            "additional properties 'registry' not allowed",
        ),
        ({"workers": "four"}, "/workers"),
        ({"watchNamespaces": "team-a"}, "/watchNamespaces"),
        ({"watchNamespaces": ["Team_A"]}, "/watchNamespaces/0"),
        ({"crds": {"install": "yes", "keep": True}}, "/crds/install"),
        (
            {"image": {"repository": "r", "tag": "", "digest": "", "pullPolicy": "Sometimes"}},
            "/image/pullPolicy",
        ),
        ({"ports": {"metrics": 70000, "health": 8080}}, "/ports/metrics"),
        ({"serviceMonitor": {"enabled": True, "interval": "soon"}}, "/serviceMonitor/interval"),
        ({"engineMonitor": {"enabled": True, "port": "http"}}, "additional properties 'port'"),
        ({"rbac": {"create": True, "readPrometheusSecrets": "yes"}}, "/rbac/readPrometheusSecrets"),
    ],
)
def test_schema_rejects_unknown_keys_and_wrong_types(values, message):
    assert message in render_error(values)


def test_schema_rejects_unknown_keys_at_every_level():
    schema = json.loads((CHART / "values.schema.json").read_text())
    open_objects = []

    def walk(node: dict, path: str) -> None:
        if node.get("type") == "object" and "properties" in node:
            if node.get("additionalProperties") is not False:
                open_objects.append(path)
            for name, child in node["properties"].items():
                walk(child, f"{path}.{name}")
        if isinstance(node.get("items"), dict):
            walk(node["items"], f"{path}[]")

    walk(schema, "values")
    assert open_objects == []
    # Every key of values.yaml is declared (so the defaults themselves pass the schema).
    defaults = yaml.safe_load((CHART / "values.yaml").read_text())
    assert set(defaults) <= set(schema["properties"])


@functools.cache
def kustomize() -> list[dict]:
    result = run([find_tool("kubectl"), "kustomize", KUSTOMIZE_BASE])
    assert result.returncode == 0, result.stderr
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


def test_kustomize_base_renders_the_operator_in_its_restricted_namespace():
    objects = kustomize()
    namespace = one(objects, "Namespace")["metadata"]
    assert namespace["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"
    for obj in objects:
        if obj["kind"] not in CLUSTER_SCOPED:
            assert obj["metadata"]["namespace"] == namespace["name"], obj["metadata"]["name"]
    binding = one(objects, "ClusterRoleBinding")
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "pd-operator", "namespace": namespace["name"]}
    ]
    assert not [o for o in objects if o["kind"] == "CustomResourceDefinition"]


def test_kustomize_base_grants_the_same_rights_as_the_charts_default():
    chart, base = render(), kustomize()
    namespace = one(base, "Namespace")["metadata"]["name"]
    # The same bindings, the release's namespace being the kustomize base's.
    assert granted(base) == {
        (kind, namespace if where == RELEASE_NAMESPACE else where): rights_
        for (kind, where), rights_ in granted(chart).items()
    }

    def aggregated(objects: list[dict]) -> dict[str, set[Rule]]:
        return {
            key: rights(o["rules"])
            for o in objects
            for key in o["metadata"].get("labels", {})
            if key.startswith("rbac.authorization.k8s.io/aggregate-to-")
        }

    assert aggregated(base) == aggregated(chart)


def test_kustomize_base_runs_the_same_pod_as_the_charts_default():
    chart, base = one(render(), "Deployment"), one(kustomize(), "Deployment")
    for field in ("replicas", "strategy"):
        assert base["spec"][field] == chart["spec"][field], field
    chart_pod, base_pod = chart["spec"]["template"]["spec"], base["spec"]["template"]["spec"]
    assert base_pod["securityContext"] == chart_pod["securityContext"]
    assert base_pod["volumes"] == chart_pod["volumes"]
    chart_main, base_main = chart_pod["containers"][0], base_pod["containers"][0]
    for field in (
        "args",
        "env",
        "ports",
        "securityContext",
        "startupProbe",
        "livenessProbe",
        "resources",
        "volumeMounts",
    ):
        assert base_main.get(field) == chart_main.get(field), field
    assert base_main["image"] == chart_main["image"]
