"""The Prometheus alert rules and the Grafana dashboard: valid PromQL, unit-tested alerts, and
only metrics that the operator exports or docs/observability.md promises.

promtool comes with Debian's prometheus package (`make testenv` installs it); with CI=true a
missing promtool fails these tests, elsewhere they are skipped with the command that fixes it.
"""

import json
import re
import subprocess
from pathlib import Path

import yaml
from prometheus_client.metrics import MetricWrapperBase

from pd_operator.adapters import metrics
from pdcases import ROOT

RULES = ROOT / "deploy" / "prometheus" / "pd-operator-rules.yaml"
RULE_TESTS = ROOT / "deploy" / "prometheus" / "pd-operator-rules.test.yaml"
CHART_RULES = ROOT / "charts" / "pd-operator" / "files" / "pd-operator-rules.yaml"
DASHBOARD = ROOT / "charts" / "pd-operator" / "files" / "grafana-dashboard.json"
OBSERVABILITY = (ROOT / "docs" / "observability.md").read_text()
METRIC = re.compile(r"\b(pd_operator_[a-z0-9_]+|up)\b")


def run(argv: list[str | Path], cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(a) for a in argv], capture_output=True, text=True, timeout=120, check=False, cwd=cwd
    )


def alerts() -> list[dict]:
    groups = yaml.safe_load(RULES.read_text())["groups"]
    return [rule for group in groups for rule in group["rules"] if "alert" in rule]


def exported_metrics() -> set[str]:
    """Names the operator's /metrics exposes, as PromQL sees them (counters end in _total)."""
    collectors = [v for v in vars(metrics).values() if isinstance(v, MetricWrapperBase)]
    assert collectors
    return {
        family.name + "_total" if family.type == "counter" else family.name
        for collector in collectors
        for family in collector.collect()
    }


def documented_metrics() -> set[str]:
    return set(re.findall(r"`(pd_operator_[a-z0-9_]+)`", OBSERVABILITY))


def test_rules_pass_promtool_check(promtool):
    result = run([promtool, "check", "rules", RULES])
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(alerts())} rules found" in result.stdout


def test_alerts_pass_their_promtool_unit_tests(promtool):
    result = run([promtool, "test", "rules", RULE_TESTS.name], cwd=RULE_TESTS.parent)
    assert result.returncode == 0, result.stdout + result.stderr


def test_every_alert_is_tested_firing_and_not_firing():
    fired, silent = set(), set()
    for case in yaml.safe_load(RULE_TESTS.read_text())["tests"]:
        for check in case.get("alert_rule_test", []):
            (fired if check.get("exp_alerts") else silent).add(check["alertname"])
    names = {rule["alert"] for rule in alerts()}
    assert fired == names
    assert silent == names


def test_alerts_cover_what_an_operator_of_pd_operator_must_hear_about():
    by_name = {rule["alert"]: rule for rule in alerts()}
    assert set(by_name) == {
        "PDOperatorDown",
        "PDOperatorReconcileErrors",
        "PDDeploymentSLOViolated",
        "PDDeploymentMetricsUnavailable",
        "PDDeploymentCapacityExhausted",
    }
    for name, rule in by_name.items():
        assert rule["labels"]["severity"] in {"critical", "warning"}, name
        assert rule["annotations"]["summary"] and rule["annotations"]["description"], name
        assert rule.get("for"), f"{name} would fire on a single evaluation"
        assert name in OBSERVABILITY, f"docs/observability.md does not explain {name}"
    # Per-PDDeployment alerts keep the labels that say which object and role.
    for name in ("PDDeploymentSLOViolated", "PDDeploymentMetricsUnavailable"):
        assert "pddeployment" in by_name[name]["annotations"]["summary"]


def test_chart_renders_the_same_rules_file():
    assert CHART_RULES.read_bytes() == RULES.read_bytes(), f"cp {RULES} {CHART_RULES}"


def test_every_metric_is_documented_and_queries_use_only_known_metrics():
    exported, documented = exported_metrics(), documented_metrics()
    assert exported - documented == set(), "undocumented in docs/observability.md"
    queries = [rule["expr"] for rule in alerts()] + dashboard_queries()
    used = {
        re.sub(r"_(bucket|count|sum)$", "", name) for q in queries for name in METRIC.findall(q)
    }
    # `up` is Prometheus' own; the rest is exported now or promised by the docs (autoscaler).
    assert used - {"up"} - exported - documented == set()


def dashboard_queries() -> list[str]:
    dashboard = json.loads(DASHBOARD.read_text())
    return [target["expr"] for panel in dashboard["panels"] for target in panel["targets"]]


def test_dashboard_queries_are_valid_promql(promtool, tmp_path):
    # promtool parses every expression of a rules file: one recording rule per panel query,
    # with Grafana's variables replaced by what Grafana would substitute.
    queries = [
        q.replace("$__rate_interval", "5m").replace("$namespace", ".*") for q in dashboard_queries()
    ]
    assert queries
    rules = {
        "groups": [
            {
                "name": "dashboard",
                "rules": [
                    {"record": f"dashboard:query{i}", "expr": q} for i, q in enumerate(queries)
                ],
            }
        ]
    }
    path = tmp_path / "dashboard-queries.yaml"
    path.write_text(yaml.safe_dump(rules))
    result = run([promtool, "check", "rules", path])
    assert result.returncode == 0, result.stdout + result.stderr


def test_dashboard_panels_have_unique_ids_and_a_prometheus_datasource_variable():
    dashboard = json.loads(DASHBOARD.read_text())
    ids = [panel["id"] for panel in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["datasource"]["query"] == "prometheus"
    for panel in dashboard["panels"]:
        assert panel["datasource"]["uid"] == "${datasource}", panel["title"]
