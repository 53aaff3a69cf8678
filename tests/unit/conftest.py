"""Fixtures shared by unit tests that run a tool of the test environment."""

import os
import shutil
from pathlib import Path

import pytest

PROMTOOL_FIX = "make testenv  (installs Debian's prometheus package, which ships promtool)"


@pytest.fixture(scope="session")
def promtool() -> Path:
    """promtool from PATH: with CI=true its absence fails the test, elsewhere it skips."""
    found = shutil.which("promtool")
    if found:
        return Path(found)
    message = "promtool not found on PATH"
    if os.environ.get("CI", "").lower() in {"1", "true", "yes"}:
        pytest.fail(message, pytrace=False)
    pytest.skip(f"{message}\n  fix: {PROMTOOL_FIX}")
