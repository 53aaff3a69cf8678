"""`pdctl demo` as a user runs it: a subprocess that brings the whole closed loop up, shows the
table, reports, and leaves nothing running, whether it runs out its duration or gets Ctrl-C.

The demo starts its own control plane and Prometheus (it is what `make demo` runs on a fresh
machine), so these tests need only the binaries, not the session fixtures.
"""

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pd_operator.localcluster import MissingBinaryError, find_binary
from pdcases import ROOT

TABLE_HEADER = re.compile(r"^pool\s+ready\s+desired\s+pending\s+TTFT\s+ITL\s+SLO$", re.M)
STARTED_DIRS = re.compile(r"^starting .* \((/\S+)\)$", re.M)


@pytest.fixture(autouse=True)
def binaries() -> None:
    try:
        for name in ("etcd", "kube-apiserver", "kube-controller-manager", "kubectl", "prometheus"):
            find_binary(name)
    except MissingBinaryError as error:
        if os.environ.get("CI", "").lower() in {"1", "true", "yes"}:
            pytest.fail(str(error), pytrace=False)
        pytest.skip(f"{error}; fix: make testenv")


def demo(output: Path, duration_s: float) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [
            *(sys.executable, "-m", "pd_operator.cli.main", "demo", "--load", "synthetic"),
            *("--duration", str(duration_s), "--no-plot", "--output", str(output)),
        ],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def processes_using(paths: list[str]) -> list[str]:
    """Command lines of live processes that name one of `paths` (the demo's etcd, apiserver,
    controller manager and Prometheus all take their folder on the command line)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            command = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue  # gone meanwhile
        if any(path in command for path in paths):
            found.append(command)
    return found


def test_demo_shows_the_loop_reports_and_leaves_nothing_running(tmp_path: Path):
    run = demo(tmp_path, 25)
    out, _ = run.communicate(timeout=180)
    assert run.returncode == 0, out[-3000:]
    assert TABLE_HEADER.search(out), out[-3000:]
    # The pools came up and were served: a row with a Ready replica of each role.
    assert re.search(r"^prefill/s5000\s+[1-9]", out, re.M), out[-3000:]
    assert re.search(r"^decode/h200\s+[1-9]", out, re.M), out[-3000:]
    summary = (tmp_path / "summary.txt").read_text()
    finished = re.search(r"requests finished: ([\d,]+)", summary)
    assert finished and int(finished.group(1).replace(",", "")) > 100, summary
    rows = (tmp_path / "demo.csv").read_text().splitlines()
    assert rows[0].startswith("t_s,role,pool,ready,desired") and len(rows) > 10
    # Without matplotlib the user is told where the numbers are instead of a plot.
    assert "samples: " in out
    dirs = STARTED_DIRS.findall(out)
    assert len(dirs) == 2, out[:2000]  # the control plane's and Prometheus's folders
    assert not processes_using(dirs)
    assert not any(Path(d).exists() for d in dirs)


def test_ctrl_c_stops_every_process(tmp_path: Path):
    run = demo(tmp_path, 600)
    assert run.stdout is not None
    seen = ""
    deadline = time.monotonic() + 120
    while not TABLE_HEADER.search(seen) and time.monotonic() < deadline:
        line = run.stdout.readline()
        if not line:
            break
        seen += line
    assert TABLE_HEADER.search(seen), seen
    dirs = STARTED_DIRS.findall(seen)
    assert len(dirs) == 2 and processes_using(dirs)  # they run until the interrupt
    run.send_signal(signal.SIGINT)
    out, _ = run.communicate(timeout=90)
    assert run.returncode == 130, (seen + out)[-3000:]
    assert "interrupted: cleaning up" in out
    assert (tmp_path / "summary.txt").exists()
    assert not processes_using(dirs)
