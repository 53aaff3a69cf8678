"""Scraping the engine pods: the chart's PodMonitor (engineMonitor) and the plain scrape job
deploy/prometheus/engine-scrape.yaml must give every engine series the labels the autoscaler's
queries group by (adapters/promql.py), from the pod labels the operator sets (core/children.py).

The relabelling runs in the real Prometheus code: `promtool check service-discovery` relabels
static targets that carry the labels Kubernetes pod discovery would give the pool pods. promtool
comes with Debian's prometheus package, and helm with the test environment (`make testenv`);
with CI=true a missing one fails these tests, elsewhere they are skipped with the fix.
"""

import json
import os
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from pd_operator.adapters.promql import GROUP_LABELS
from pd_operator.api import parse_pddeployment
from pd_operator.core.children import (
    CONTAINER_NAME,
    ENGINE_APP_NAME,
    LABEL_DEPLOYMENT,
    LABEL_POOL,
    LABEL_ROLE,
    MANAGED_BY,
    PORT_NAME,
    desired_children,
)
from pd_operator.core.engine_args import METRICS_PATH
from pd_operator.core.router import (
    ACTIVATOR_METRICS_PORT,
    METRICS_PORT,
    build_router_deployment,
)
from pd_tools.localcluster.processes import MissingBinaryError, find_binary
from pdcases import ROOT, load_sample

SCRAPE = ROOT / "deploy" / "prometheus" / "engine-scrape.yaml"
ROUTER_SCRAPE = ROOT / "deploy" / "prometheus" / "router-scrape.yaml"
OBSERVABILITY = ROOT / "docs" / "observability.md"
CHART = ROOT / "charts" / "pd-operator"
SAMPLE = ROOT / "config" / "samples" / "heterogeneous-s5000-h200.yaml"
NAMESPACE = "llm"
FIX = "make testenv  (installs Debian's prometheus package, which ships promtool, and helm)"
# The labels an engine series must carry: the autoscaler's grouping, and the pool.
WANTED = (*GROUP_LABELS, "pool")
Target = dict[str, Any]  # a static_configs entry: {"targets": [...], "labels": {...}}


@pytest.fixture(scope="module")
def pod_monitor() -> dict[str, Any]:
    """The chart's PodMonitor of the engines, rendered with its defaults where the Prometheus
    Operator runs."""
    return render_monitor("templates/podmonitor.yaml")


@pytest.fixture(scope="module")
def router_monitor() -> dict[str, Any]:
    """The chart's PodMonitor of the routers, rendered like the engines' one."""
    return render_monitor("templates/podmonitor-routers.yaml")


def render_monitor(template: str) -> dict[str, Any]:
    try:
        helm = find_binary("helm")
    except MissingBinaryError as error:
        if os.environ.get("CI", "").lower() in {"1", "true", "yes"}:
            pytest.fail(str(error), pytrace=False)
        pytest.skip(f"{error}\n  fix: {FIX}")
    flags = [
        "--namespace=pd-system",
        "--set=engineMonitor.enabled=true",
        "--api-versions=monitoring.coreos.com/v1",
        f"--show-only={template}",
    ]
    result = run([helm, "template", "pdo", CHART, *flags])
    assert result.returncode == 0, result.stderr
    monitor: dict[str, Any] = yaml.safe_load(result.stdout)
    assert monitor["kind"] == "PodMonitor"
    return monitor


def run(argv: list[str | Path]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(a) for a in argv], capture_output=True, text=True, timeout=120, check=False
    )


def scrape_job(path: Path = SCRAPE) -> dict[str, Any]:
    (job,) = yaml.safe_load(path.read_text())["scrape_configs"]
    return dict(job)


def snake(name: str) -> str:
    return re.sub(r"[A-Z]", lambda m: "_" + m.group().lower(), name)


def sanitize(name: str) -> str:
    """A Kubernetes label name as Prometheus' discovery spells it in a label name."""
    return re.sub(r"[^a-zA-Z0-9_]", "_", name)


def pod_monitor_relabel_configs(
    monitor: dict[str, Any], endpoint: dict[str, Any] | None = None
) -> list[dict[str, Any]]:
    """The relabel_configs the Prometheus Operator generates for one endpoint of a PodMonitor
    (its promcfg.go; by default its only one): keep the selected pods and the named port, drop
    finished pods, set its own target labels, then the endpoint's relabelings."""
    if endpoint is None:
        (endpoint,) = monitor["spec"]["podMetricsEndpoints"]
    configs: list[dict[str, Any]] = [
        {
            "source_labels": [
                f"__meta_kubernetes_pod_label_{sanitize(key)}",
                f"__meta_kubernetes_pod_labelpresent_{sanitize(key)}",
            ],
            "regex": f"({value});true",
            "action": "keep",
        }
        for key, value in monitor["spec"]["selector"]["matchLabels"].items()
    ]
    configs += [
        {
            "source_labels": ["__meta_kubernetes_pod_container_port_name"],
            "regex": endpoint["port"],
            "action": "keep",
        },
        {
            "source_labels": ["__meta_kubernetes_pod_phase"],
            "regex": "(Failed|Succeeded)",
            "action": "drop",
        },
        *(
            {"source_labels": [source], "target_label": target}
            for source, target in (
                ("__meta_kubernetes_namespace", "namespace"),
                ("__meta_kubernetes_pod_container_name", "container"),
                ("__meta_kubernetes_pod_name", "pod"),
            )
        ),
        {
            "target_label": "job",
            "replacement": f"{monitor['metadata']['namespace']}/{monitor['metadata']['name']}",
        },
        {"target_label": "endpoint", "replacement": endpoint["port"]},
    ]
    configs += [{snake(k): v for k, v in rule.items()} for rule in endpoint["relabelings"]]
    return configs


def pod_targets(pod: dict[str, Any], name: str, ip: str, phase: str = "Running") -> list[Target]:
    """What Kubernetes pod discovery (role: pod) gives for a pod: one target per container
    port, labelled with the pod's metadata."""
    metadata = pod["metadata"]
    common = {
        "__meta_kubernetes_namespace": NAMESPACE,
        "__meta_kubernetes_pod_name": name,
        "__meta_kubernetes_pod_ip": ip,
        "__meta_kubernetes_pod_phase": phase,
    }
    for kind, values in (("label", metadata["labels"]), ("annotation", metadata["annotations"])):
        for key, value in values.items():
            common[f"__meta_kubernetes_pod_{kind}_{sanitize(key)}"] = value
            common[f"__meta_kubernetes_pod_{kind}present_{sanitize(key)}"] = "true"
    return [
        {
            "targets": [f"{ip}:{port['containerPort']}"],
            "labels": {
                **common,
                "__meta_kubernetes_pod_container_name": container["name"],
                "__meta_kubernetes_pod_container_port_name": port.get("name", ""),
                "__meta_kubernetes_pod_container_port_number": str(port["containerPort"]),
            },
        }
        for container in pod["spec"]["containers"]
        for port in container.get("ports", [])
    ]


def engine_pods() -> tuple[list[Target], dict[str, dict[str, str]]]:
    """Discovered targets: the sample's pool pods, a sidecar, a finished pod and a user's pod
    that copies our labels; and the labels that each kept target must end up with."""
    document = load_sample(SAMPLE)
    document["metadata"].update(namespace=NAMESPACE, uid="0b6f-uid")
    pdd = parse_pddeployment(document)
    pools = [c for c in desired_children(pdd, {}) if c["kind"] == "Deployment"]
    assert {p["spec"]["template"]["metadata"]["labels"][LABEL_ROLE] for p in pools} == {
        "prefill",
        "decode",
    }
    targets: list[Target] = []
    expected: dict[str, dict[str, str]] = {}
    for number, deployment in enumerate(pools, start=1):
        pod = json.loads(json.dumps(deployment["spec"]["template"]))
        labels = pod["metadata"]["labels"]
        ip = f"10.0.0.{number}"
        (engine_port,) = pod["spec"]["containers"][0]["ports"]
        expected[f"{ip}:{engine_port['containerPort']}"] = {
            "namespace": NAMESPACE,
            "deployment": labels[LABEL_DEPLOYMENT],
            "role": labels[LABEL_ROLE],
            "pool": labels[LABEL_POOL],
        }
        # A sidecar that also calls its port http: not the engine.
        pod["spec"]["containers"].append(
            {"name": "proxy", "ports": [{"name": PORT_NAME, "containerPort": 15001}]}
        )
        name = deployment["metadata"]["name"]
        targets += pod_targets(pod, f"{name}-abc12", ip)
        # A pod of the same pool that was evicted keeps its labels but serves nothing.
        targets += pod_targets(pod, f"{name}-old", f"10.0.1.{number}", "Failed")
        # A benchmark client labelled like the pool, but not run by the operator.
        client = json.loads(json.dumps(pod))
        del client["metadata"]["labels"]["app.kubernetes.io/managed-by"]
        targets += pod_targets(client, f"bench-{number}", f"10.0.2.{number}")
    return targets, expected


def discover(
    promtool: Path, tmp_path: Path, relabel_configs: list[dict[str, Any]], targets: list[Target]
) -> dict[str, dict[str, str]]:
    """Relabel `targets` with Prometheus' own code: the kept targets' labels by address."""
    config = {
        "scrape_configs": [
            {
                "job_name": "engines",
                "static_configs": targets,
                "relabel_configs": relabel_configs,
            }
        ]
    }
    path = tmp_path / "prometheus.yml"
    path.write_text(yaml.safe_dump(config))
    result = run([promtool, "check", "service-discovery", path, "engines", "--timeout=1s"])
    assert result.returncode == 0, result.stdout + result.stderr
    found = json.loads(result.stdout)
    assert len(found) == len(targets)
    return {t["labels"]["__address__"]: t["labels"] for t in found if t["labels"]}


def test_scrape_job_passes_promtool_check_config(promtool, tmp_path):
    result = run([promtool, "check", "config", SCRAPE])
    if "field kubernetes_sd_configs not found" in result.stdout + result.stderr:
        # Debian's promtool is built without Kubernetes discovery: check everything else of
        # the job, with a static target in place of the discovery.
        job = scrape_job()
        assert job.pop("kubernetes_sd_configs") == [{"role": "pod"}]
        job["static_configs"] = [{"targets": ["10.0.0.1:8000"]}]
        path = tmp_path / "engine-scrape.yaml"
        path.write_text(yaml.safe_dump({"scrape_configs": [job]}))
        result = run([promtool, "check", "config", path])
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout + result.stderr


@pytest.mark.parametrize("source", ["scrape job", "PodMonitor"])
def test_engine_series_get_the_labels_the_autoscaler_groups_by(
    promtool, tmp_path, pod_monitor, source
):
    relabel_configs = (
        scrape_job()["relabel_configs"]
        if source == "scrape job"
        else pod_monitor_relabel_configs(pod_monitor)
    )
    targets, expected = engine_pods()
    kept = discover(promtool, tmp_path, relabel_configs, targets)
    # Only the engine container of running pods that the operator runs.
    assert set(kept) == set(expected)
    for address, labels in kept.items():
        assert {name: labels.get(name) for name in WANTED} == expected[address], address
        assert labels["__metrics_path__"] == METRICS_PATH
        assert labels["pod"].endswith("-abc12")


def test_pod_monitor_and_scrape_job_agree(pod_monitor):
    job = scrape_job()
    spec = pod_monitor["spec"]
    (endpoint,) = spec["podMetricsEndpoints"]
    # Both select by the labels and port name of core/children.py, in every namespace.
    assert spec["selector"]["matchLabels"] == {
        "app.kubernetes.io/name": ENGINE_APP_NAME,
        "app.kubernetes.io/managed-by": MANAGED_BY,
    }
    assert spec["namespaceSelector"] == {"any": True}
    assert job["kubernetes_sd_configs"] == [{"role": "pod"}]
    keep = {
        tuple(rule["source_labels"]): rule["regex"]
        for rule in job["relabel_configs"]
        if rule["action"] == "keep"
    }
    assert keep == {
        (
            "__meta_kubernetes_pod_label_app_kubernetes_io_name",
            "__meta_kubernetes_pod_label_app_kubernetes_io_managed_by",
        ): f"{ENGINE_APP_NAME};{MANAGED_BY}",
        ("__meta_kubernetes_pod_container_port_name",): endpoint["port"],
        ("__meta_kubernetes_pod_container_name",): CONTAINER_NAME,
    }
    assert endpoint["port"] == PORT_NAME
    assert (endpoint["path"], endpoint["interval"], endpoint["scrapeTimeout"]) == (
        job["metrics_path"],
        job["scrape_interval"],
        job["scrape_timeout"],
    )
    # The PodMonitor's relabelings are the job's, in the same order.
    relabelings = [{snake(k): v for k, v in rule.items()} for rule in endpoint["relabelings"]]
    assert [r for r in job["relabel_configs"] if r in relabelings] == relabelings
    mapped = {
        rule["source_labels"][0]: rule["target_label"]
        for rule in relabelings
        if rule.get("action") == "replace"
    }
    assert mapped == {
        "__meta_kubernetes_namespace": "namespace",
        f"__meta_kubernetes_pod_label_{sanitize(LABEL_DEPLOYMENT)}": "deployment",
        f"__meta_kubernetes_pod_label_{sanitize(LABEL_ROLE)}": "role",
        f"__meta_kubernetes_pod_label_{sanitize(LABEL_POOL)}": "pool",
    }
    assert set(mapped.values()) == set(WANTED)


def test_docs_show_the_scrape_job_as_it_is_in_the_file():
    job = SCRAPE.read_text()
    shown = job[job.index("scrape_configs:") :]
    assert f"# prometheus.yml\n{shown}```" in OBSERVABILITY.read_text()


def router_and_engine_pods() -> tuple[list[Target], dict[str, dict[str, str]]]:
    """Discovered targets of the sample's router pod, of its router pod with scale to zero
    (router and activator), and of its engine pods; the labels that each kept target (the
    router's metrics port, the activator's) must end up with."""
    document = load_sample(SAMPLE)
    document["metadata"].update(namespace=NAMESPACE, uid="0b6f-uid")
    idle = json.loads(json.dumps(document))
    idle["spec"]["scaling"]["idleSeconds"] = 300
    for role in ("prefill", "decode"):
        for pool in idle["spec"][role]["pools"]:
            pool["replicas"] = {**pool.get("replicas", {}), "min": 0}
    targets, expected = engine_pods()[0], {}
    for ip, doc, ports in (
        ("10.0.3.1", document, (METRICS_PORT,)),
        ("10.0.3.2", idle, (METRICS_PORT, ACTIVATOR_METRICS_PORT)),
    ):
        router = build_router_deployment(parse_pddeployment(doc))["spec"]["template"]
        targets += pod_targets(json.loads(json.dumps(router)), f"glm-hetero-router-{ip}", ip)
        for port in ports:
            expected[f"{ip}:{port}"] = {
                "namespace": NAMESPACE,
                "deployment": router["metadata"]["labels"][LABEL_DEPLOYMENT],
                "role": "router",
                "pod": f"glm-hetero-router-{ip}",
            }
    return targets, expected


@pytest.mark.parametrize("source", ["scrape job", "PodMonitor"])
def test_router_metrics_are_scraped_on_their_own_port_with_the_objects_labels(
    promtool, tmp_path, router_monitor, source
):
    jobs = (
        [scrape_job(ROUTER_SCRAPE)["relabel_configs"]]
        if source == "scrape job"
        else [
            pod_monitor_relabel_configs(router_monitor, endpoint)
            for endpoint in router_monitor["spec"]["podMetricsEndpoints"]
        ]
    )
    targets, expected = router_and_engine_pods()
    kept: dict[str, dict[str, str]] = {}
    for relabel_configs in jobs:
        found = discover(promtool, tmp_path, relabel_configs, targets)
        assert not set(found) & set(kept), "two endpoints scrape the same port"
        kept |= found
    # The router's and the activator's metrics ports, not their API ports, and no engine.
    assert set(kept) == set(expected)
    for address, labels in kept.items():
        wanted = ("namespace", "deployment", "role", "pod")
        assert {k: labels.get(k) for k in wanted} == expected[address]
    assert router_monitor["spec"]["selector"]["matchLabels"]["app.kubernetes.io/name"] == (
        "pd-operator-router"
    )
