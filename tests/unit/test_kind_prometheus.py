"""config/kind/prometheus.yaml, the Prometheus of `make kind-e2e`: a user would notice a scrape job
that labels the engines' series differently from deploy/prometheus (the autoscaler would find no
series), or an address that the operator (hack/kind.sh's prometheusUrl) or the host (the port
config/kind/kind-cluster.yaml publishes) does not reach."""

from typing import Any

import yaml

from pdcases import ROOT

MANIFEST = ROOT / "config" / "kind" / "prometheus.yaml"


def documents() -> dict[str, dict[str, Any]]:
    return {doc["kind"]: doc for doc in yaml.safe_load_all(MANIFEST.read_text())}


def jobs(path: str) -> dict[str, dict[str, Any]]:
    config = yaml.safe_load((ROOT / path).read_text())
    return {job["job_name"]: job for job in config["scrape_configs"]}


def test_its_jobs_are_deploy_prometheus_jobs_scraped_more_often():
    config = yaml.safe_load(documents()["ConfigMap"]["data"]["prometheus.yml"])
    ours = {job["job_name"]: job for job in config["scrape_configs"]}
    theirs = jobs("deploy/prometheus/engine-scrape.yaml") | jobs(
        "deploy/prometheus/router-scrape.yaml"
    )
    assert ours.keys() == theirs.keys() == {"pd-engines", "pd-routers"}
    for name, job in theirs.items():
        timing = ("scrape_interval", "scrape_timeout")
        assert {k: v for k, v in ours[name].items() if k not in timing} == {
            k: v for k, v in job.items() if k not in timing
        }, name
        assert ours[name]["scrape_interval"] == "5s"


def test_the_operator_and_the_host_reach_it():
    docs = documents()
    service, deployment = docs["Service"], docs["Deployment"]
    (port,) = service["spec"]["ports"]
    namespace = service["metadata"]["namespace"]
    url = f"http://{service['metadata']['name']}.{namespace}.svc:{port['port']}"
    assert f"PROMETHEUS_IN_CLUSTER={url}\n" in (ROOT / "hack" / "kind.sh").read_text()
    assert service["spec"]["selector"] == deployment["spec"]["template"]["metadata"]["labels"]
    cluster = yaml.safe_load((ROOT / "config" / "kind" / "kind-cluster.yaml").read_text())
    (control_plane,) = [n for n in cluster["nodes"] if n["role"] == "control-plane"]
    published = {m["containerPort"]: m for m in control_plane["extraPortMappings"]}
    assert published[port["nodePort"]]["listenAddress"] == "127.0.0.1"
    # Pod discovery in every namespace, and nothing more.
    (rule,) = docs["ClusterRole"]["rules"]
    assert rule == {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]}
    binding = docs["ClusterRoleBinding"]
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "prometheus", "namespace": namespace}
    ]
