"""Polling for unit tests that drive a background thread (no apiserver: see kubetools)."""

import time
from collections.abc import Callable


def wait_until(check: Callable[[], object], timeout: float = 5.0) -> bool:
    """True as soon as `check()` is truthy, polled every 10 ms; False after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.01)
    return False
