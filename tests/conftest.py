"""Test tiers: everything under tests/integration and tests/e2e is marked `integration`."""

from pathlib import Path

import pytest

INTEGRATION_DIRS = ("integration", "e2e")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if any(part in INTEGRATION_DIRS for part in Path(str(item.path)).parts):
            item.add_marker(pytest.mark.integration)
