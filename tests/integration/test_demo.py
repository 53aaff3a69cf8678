"""`pdctl demo` as a user runs it: a subprocess that brings the whole closed loop up, sends its
load through the PDDeployment's endpoint, shows the table, reports, and leaves nothing running,
whether it runs out its duration or gets Ctrl-C.

The demo starts its own control plane, Prometheus, engine and router processes (it is what
`make demo` runs on a fresh machine), so these tests need only the binaries, not the session
fixtures. Every process it starts inherits a mark in its environment, by which the tests find
whatever would be left behind; the router, which rewrites its own environment with its process
title, is found by the address it listens on.
"""

import importlib.util
import os
import re
import signal
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from pd_tools.localcluster import MissingBinaryError, find_binary
from pdcases import ROOT

TABLE_HEADER = re.compile(r"^pool\s+ready\s+desired\s+pending\s+operator P50\s+target\s+SLO", re.M)
STARTED_DIRS = re.compile(r"^starting .* \((/\S+)\)$", re.M)
MARK = "PD_DEMO_TEST_MARK"
ROUTER_URL = re.compile(r"^endpoint: .*; here: http://(127\.[\d.]+):(\d+)$", re.M)


@pytest.fixture(autouse=True)
def binaries() -> None:
    try:
        for name in ("etcd", "kube-apiserver", "kube-controller-manager", "kubectl", "prometheus"):
            find_binary(name)
        if not (Path(sys.executable).parent / "vllm-router").exists():
            raise MissingBinaryError("vllm-router is not installed beside this Python")
    except MissingBinaryError as error:
        if os.environ.get("CI", "").lower() in {"1", "true", "yes"}:
            pytest.fail(str(error), pytrace=False)
        pytest.skip(f"{error}; fix: make testenv install")


def demo(output: Path, duration_s: float, mark: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [
            *(sys.executable, "-m", "pd_tools.cli.main", "demo", "--workload", "slice"),
            *("--duration", str(duration_s), "--output", str(output)),
        ],
        cwd=ROOT,
        env={**os.environ, MARK: mark},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def processes_marked(mark: str) -> list[str]:
    """Command lines of live processes whose environment carries `mark`: the demo's control
    plane, Prometheus, engines, router and client all inherit it."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if f"{MARK}={mark}".encode() not in (entry / "environ").read_bytes().split(b"\0"):
                continue
            found.append((entry / "cmdline").read_bytes().replace(b"\0", b" ").decode())
        except OSError:
            continue  # gone meanwhile, or not ours to read
    return found


def listening(out: str) -> bool:
    """Something accepts connections at the router address the demo printed."""
    found = ROUTER_URL.search(out)
    assert found, out[:3000]
    with socket.socket() as probe:
        probe.settimeout(2)
        return probe.connect_ex((found.group(1), int(found.group(2)))) == 0


def test_the_demo_serves_its_load_through_the_endpoint_reports_and_leaves_nothing_running(
    tmp_path: Path,
):
    mark = uuid.uuid4().hex
    run = demo(tmp_path, 40, mark)
    out, _ = run.communicate(timeout=240)
    assert run.returncode == 0, out[-3000:]
    # Where to look, printed before the load: kubectl, Prometheus, the operator's metrics, the
    # endpoint (the Service's in-cluster URL and the router here) and a curl to paste.
    assert re.search(r"^kubectl: +\S+kubectl --kubeconfig \S+ get pdd -n demo$", out, re.M)
    assert re.search(r"^Prometheus: +http://127\.0\.0\.1:\d+$", out, re.M)
    assert re.search(r"^operator metrics: +http://127\.0\.0\.1:\d+/metrics$", out, re.M)
    endpoint = re.search(
        r"^endpoint: +http://glm-hetero\.demo\.svc:8000 \(status\.endpoint\); here: "
        r"(http://127\.\d+\.\d+\.\d+:\d+)$",
        out,
        re.M,
    )
    assert endpoint, out[:3000]
    assert f"curl -s {endpoint.group(1)}/v1/completions" in out
    # The table: a row per pool with a Ready replica and its role's own SLO verdict, a line per
    # decision that fits 100 columns.
    assert TABLE_HEADER.search(out), out[-3000:]
    for pool, kind in (("prefill/s5000", "TTFT"), ("decode/h200", "ITL")):
        verdicts = re.findall(
            rf"^{pool}\s+[1-9]\d*\s+\d+\s+\d+\s+{kind}\s.*(met|VIOLATED)", out, re.M
        )
        assert verdicts, f"{pool}: no row with a verdict\n{out[-3000:]}"
    assert re.search(r"^router\s+1\s+1$", out, re.M)
    decisions = re.findall(r"^ +-?\d+s (?:prefill|decode): .*$", out, re.M)
    assert decisions and all(len(line) <= 100 for line in decisions), decisions[-5:]
    # Requests went through the router and were answered.
    summary = (tmp_path / "summary.txt").read_text()
    sent = int(re.search(r"^  sent +([\d,]+)$", summary, re.M).group(1).replace(",", ""))
    done = int(re.search(r"^  completed +([\d,]+)$", summary, re.M).group(1).replace(",", ""))
    assert sent > 50 and done >= 0.9 * sent, summary
    assert re.search(r"^  TTFT p50 / p99 +[\d,.]+ ms", summary, re.M), summary
    assert re.search(r"^prefill/s5000: ready 1\.\.\d", summary, re.M), summary
    assert re.search(r"^decode/h200: ready 1\.\.\d", summary, re.M), summary
    # The output folder holds the record of the run.
    table = (tmp_path / "demo.csv").read_text().splitlines()
    assert table[0].startswith("t_s,role,pool,ready,desired,pending,latency_ms,target_ms,slo")
    assert len(table) > 20
    requests = (tmp_path / "requests.csv").read_text().splitlines()
    assert len(requests) == sent + 1
    assert (tmp_path / "decisions.log").read_text().strip()
    assert list((tmp_path / "pods").glob("*router*/container-0.log"))
    if importlib.util.find_spec("matplotlib"):
        assert (tmp_path / "demo.png").stat().st_size > 10_000
    else:
        assert "no plot: matplotlib is not installed" in out
    dirs = STARTED_DIRS.findall(out)
    assert len(dirs) == 2, out[:2000]  # the control plane's and Prometheus's folders
    assert not any(Path(d).exists() for d in dirs)
    assert not processes_marked(mark)
    assert not listening(out)


def test_ctrl_c_stops_every_process(tmp_path: Path):
    mark = uuid.uuid4().hex
    run = demo(tmp_path, 600, mark)
    assert run.stdout is not None
    seen = ""
    deadline = time.monotonic() + 150
    while not TABLE_HEADER.search(seen) and time.monotonic() < deadline:
        line = run.stdout.readline()
        if not line:
            break
        seen += line
    assert TABLE_HEADER.search(seen), seen
    # Engines, router, client, control plane and Prometheus run until the interrupt.
    running = processes_marked(mark)
    assert any("http_engine" in c for c in running), running
    assert any("spawn_main" in c for c in running), running  # the client
    assert listening(seen)
    run.send_signal(signal.SIGINT)
    out, _ = run.communicate(timeout=90)
    assert run.returncode == 130, (seen + out)[-3000:]
    assert "interrupted: cleaning up" in out
    assert (tmp_path / "summary.txt").exists()
    assert not processes_marked(mark)
    assert not listening(seen)
