"""Test tiers: everything under tests/integration and tests/e2e is marked `integration`;
tests/kind runs only through `make kind-e2e` (a real kind cluster, PD_KIND_KUBECONFIG set).

With CI=true, property tests run on the same examples every time (Hypothesis' `derandomize`):
a developer's run draws anew and finds a rare failing draw (one did, 2026-12-01, in the
constant-load property of tests/unit/test_policy_decide.py), which is then kept as an `@example`;
such a draw does not decide at random whether a submission's CI passes.
"""

import os
from pathlib import Path

import pytest
from hypothesis import settings

settings.register_profile("ci", derandomize=True)
if os.environ.get("CI") == "true":
    settings.load_profile("ci")

INTEGRATION_DIRS = ("integration", "e2e")
# Not part of `make test`: hack/kind.sh e2e builds the cluster these tests need, then runs them.
collect_ignore = [] if os.environ.get("PD_KIND_KUBECONFIG") else ["kind"]


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if any(part in INTEGRATION_DIRS for part in Path(str(item.path)).parts):
            item.add_marker(pytest.mark.integration)
