"""The public request traces in ../shared/traces, for tests that replay them."""

from pathlib import Path

import pytest

TRACES = Path(__file__).resolve().parents[2] / "shared" / "traces"


def real_trace(name: str) -> Path:
    """The trace's path; the test is skipped when the traces are not checked out beside us."""
    path = TRACES / name
    if not path.exists():
        pytest.skip(f"{path} not present: the public traces live in ../shared/traces (see README)")
    return path
