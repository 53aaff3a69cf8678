"""Installing the CRDs on a test cluster waits until each is served, whatever its first status."""

import json
from pathlib import Path

import pytest

from pd_tools.localcluster import cluster as localcluster
from pd_tools.localcluster.cluster import KubectlCluster
from pd_tools.localcluster.processes import LocalClusterError


class ScriptedKubectl(KubectlCluster):
    """kubectl faked at the process boundary: `get` answers the CRD's statuses in turn."""

    def __init__(self, statuses: list[dict | None]) -> None:
        self.kubeconfig = self.kubectl_path = Path("/nonexistent")
        self.statuses = statuses
        self.calls: list[tuple[str, ...]] = []

    def kubectl(self, *args: str, input_text: str | None = None, check: bool = True) -> str:
        self.calls.append(args)
        if args[0] == "get":
            status = self.statuses.pop(0) if len(self.statuses) > 1 else self.statuses[0]
            return json.dumps({"kind": "CustomResourceDefinition", "status": status})
        return ""


ESTABLISHED = {"conditions": [{"type": "Established", "status": "True"}]}


def test_a_crd_without_status_yet_is_waited_for_until_established(monkeypatch):
    monkeypatch.setattr(localcluster.time, "sleep", lambda _: None)
    # The apiserver's first answers: no status, then conditions still nil, then not yet served.
    kube = ScriptedKubectl(
        [
            None,
            {"conditions": None},
            {"conditions": [{"type": "Established", "status": "False"}]},
            ESTABLISHED,
        ]
    )
    kube.apply_crds()
    # One apply of both CRDs; four reads until the PDDeployment CRD is served, one for PDPool.
    assert [call[0] for call in kube.calls] == ["apply", "get", "get", "get", "get", "get"]
    assert [call[1] for call in kube.calls[1:]] == [
        *["crd/pddeployments.pdoperator.io"] * 4,
        "crd/pdpools.pdoperator.io",
    ]


def test_a_crd_never_established_fails_naming_it(monkeypatch):
    clock = iter(range(0, 1000, 10))
    monkeypatch.setattr(localcluster.time, "monotonic", lambda: float(next(clock)))
    monkeypatch.setattr(localcluster.time, "sleep", lambda _: None)
    with pytest.raises(LocalClusterError, match="PDDeployment CRD was not Established within 60 s"):
        ScriptedKubectl([{"conditions": None}]).apply_crds()
