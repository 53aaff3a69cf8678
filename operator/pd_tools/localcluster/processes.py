"""Child processes of the local cluster: started in their own session, stopped by process group."""

import os
import shutil
import signal
import socket
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path

# The Makefile exports the testbin folder that `hack/testenv.sh` provisioned.
TESTBIN_ENV = "PD_TESTBIN"
FIX_HINT = "run `make testenv` (it builds the binaries into ~/.cache/pd-operator/testbin)"


class LocalClusterError(RuntimeError):
    """A component of the local cluster failed to start."""


class MissingBinaryError(LocalClusterError):
    """A binary of the local cluster is not provisioned (`make testenv` fixes it)."""


def find_binary(name: str) -> Path:
    """A binary from $PD_TESTBIN, else from PATH; a clear error naming the fix otherwise."""
    folder = os.environ.get(TESTBIN_ENV)
    if folder and (Path(folder) / name).is_file():
        return Path(folder) / name
    found = shutil.which(name)
    if found:
        return Path(found)
    where = f"${TESTBIN_ENV}={folder} or PATH" if folder else "PATH"
    raise MissingBinaryError(f"{name} not found in {where}: {FIX_HINT}")


def free_port() -> int:
    """An ephemeral loopback port that is free right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


class ManagedProcess:
    """One long-running child, logging to a file, killed with its whole process group."""

    def __init__(self, name: str, argv: list[str], log_dir: Path) -> None:
        self.name = name
        self.log_path = log_dir / f"{name}.log"
        self._log = self.log_path.open("wb")
        self.process = subprocess.Popen(
            argv,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )

    @property
    def pid(self) -> int:
        return self.process.pid

    def alive(self) -> bool:
        return self.process.poll() is None

    def log_tail(self, lines: int = 20) -> str:
        text = self.log_path.read_text(errors="replace").splitlines()
        return "\n".join(text[-lines:])

    def wait_until(self, check: Callable[[], bool], timeout_seconds: float, what: str) -> None:
        """Poll `check` until it holds; fail early (with the log) if the process exits."""
        deadline = time.monotonic() + timeout_seconds
        while time.monotonic() < deadline:
            if not self.alive():
                raise LocalClusterError(
                    f"{self.name} exited with {self.process.returncode} before {what}:\n"
                    f"{self.log_tail()}"
                )
            if check():
                return
            time.sleep(0.1)
        raise LocalClusterError(
            f"{self.name} not {what} within {timeout_seconds:.0f}s:\n{self.log_tail()}"
        )

    def stop(self, grace_seconds: float = 10) -> None:
        """SIGTERM the process group, SIGKILL it after the grace period."""
        if self.alive():
            for sig, wait in ((signal.SIGTERM, grace_seconds), (signal.SIGKILL, 5.0)):
                try:
                    os.killpg(self.process.pid, sig)
                except ProcessLookupError:
                    break
                try:
                    self.process.wait(timeout=wait)
                    break
                except subprocess.TimeoutExpired:
                    continue
        self._log.close()


def port_open(port: int) -> bool:
    """True when something accepts TCP connections on 127.0.0.1:port."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1):
            return True
    except OSError:
        return False


def http_ok(
    url: str, context: ssl.SSLContext | None = None, headers: dict[str, str] | None = None
) -> bool:
    """True when GET url answers 200; connection errors are just 'not yet'."""
    request = urllib.request.Request(url, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=2, context=context) as response:
            return bool(response.status == 200)
    except (urllib.error.URLError, ConnectionError, TimeoutError, ssl.SSLError):
        return False
