"""A demo run: bring everything up, send the load and watch it, report, and tear it all down."""

import calendar
import logging
import os
import signal
import sys
import tempfile
import threading
import time
from pathlib import Path
from types import FrameType
from typing import TextIO

import yaml
from kubernetes import client

from pd_operator.adapters.kube import load_api_client
from pd_tools.demo.client import END_GRACE_S, Client, Order, client_window
from pd_tools.demo.cluster import (
    OperatorThread,
    delete_pods,
    get_pdd,
    keep_pod_logs,
    pdd_body,
    scaling_events,
)
from pd_tools.demo.cpu import CpuMeter
from pd_tools.demo.load import build_load, describe, phase_of
from pd_tools.demo.report import plot, summarize_run, write_samples
from pd_tools.demo.settings import (
    GROUP,
    ITL_TARGET_MS,
    NAME,
    NAMESPACE,
    PLURAL,
    PROFILE,
    ROOT,
    SAMPLE,
    TIME_SCALE,
    TTFT_TARGET_MS,
    VERSION,
    WINDOW_SECONDS,
    DemoOptions,
)
from pd_tools.demo.table import DECISION_LINES, Sample, read_samples, render
from pd_tools.localcluster import LocalCluster, LocalPrometheus, find_binary
from pd_tools.simcluster.pod_processes import service_urls
from pd_tools.simcluster.virtual import VirtualCluster
from pd_tools.workloads.http_load import write_csv

READY_TIMEOUT_S = 180.0


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt  # SIGTERM cleans up exactly as Ctrl-C does


def _curl(url: str, model: str) -> str:
    body = f'{{"model": "{model}", "prompt": "Hello there", "max_tokens": 16}}'
    return f"curl -s {url}/v1/completions -H 'Content-Type: application/json' -d '{body}'"


class DemoRun:
    """One run: what it started (for the cleanup) and what it saw (for the report)."""

    def __init__(self, options: DemoOptions, output: Path, out: TextIO) -> None:
        self.options, self.output, self.out = options, output, out
        sample = yaml.safe_load(SAMPLE.read_text())
        self.model: str = sample["spec"]["model"]["name"]
        self.load = build_load(options, int(sample["spec"]["model"]["contextLength"]))
        self.cluster, self.prometheus = LocalCluster(), LocalPrometheus()
        self.serve_dir = Path(tempfile.mkdtemp(prefix="pd-demo-pods-"))
        self.client = Client(self.load)
        self.virtual: VirtualCluster | None = None
        self.operator: OperatorThread | None = None
        self.api: client.ApiClient | None = None
        self.samples: list[Sample] = []
        self.decisions: list[tuple[str, str]] = []  # (time, reason), each one once
        self.events = {"ScaledUp": 0, "ScaledDown": 0}
        self.meter = CpuMeter()
        self.cpu = "CPU: not measured (the load did not run to its end)"

    def say(self, text: str) -> None:
        print(text, file=self.out, flush=True)

    def bring_up(self) -> tuple[str, str]:
        """Everything up and the PDDeployment applied; its endpoint and a router URL once it is
        Ready."""
        self.say(f"output folder: {self.output}")
        self.say(f"starting the local control plane ({self.cluster.dir})")
        self.cluster.start()
        self.say(f"starting Prometheus ({self.prometheus.dir})")
        self.prometheus.start()
        self.api = api = load_api_client(str(self.cluster.kubeconfig))
        client.CoreV1Api(api).create_namespace(
            client.V1Namespace(metadata=client.V1ObjectMeta(name=NAMESPACE))
        )
        self.say(f"starting the virtual nodes of {PROFILE.name} and the operator")
        self.virtual = VirtualCluster(
            api,
            PROFILE,
            time_scale=TIME_SCALE,
            namespace=NAMESPACE,
            serve_dir=self.serve_dir,
            sd_file=self.prometheus.targets_dir / "demo-pods.json",
        )
        self.virtual.start()
        self.operator = OperatorThread(self.cluster.kubeconfig)
        self.operator.start()
        self.prometheus.set_targets(
            "pd-operator", [f"127.0.0.1:{self.operator.metrics_port}"], {"job": "pd-operator"}
        )
        self.client.start()
        client.CustomObjectsApi(api).create_namespaced_custom_object(
            GROUP, VERSION, NAMESPACE, PLURAL, pdd_body(self.prometheus.url)
        )
        self.say(f"applied {NAMESPACE}/{NAME} ({SAMPLE.relative_to(ROOT)})")
        return self._wait_for_endpoint(api)

    def _wait_for_endpoint(self, api: client.ApiClient) -> tuple[str, str]:
        deadline = time.monotonic() + READY_TIMEOUT_S
        said = ""
        while time.monotonic() < deadline:
            status = get_pdd(api).get("status") or {}
            ready = {c["type"]: c["status"] for c in status.get("conditions") or []}.get("Ready")
            urls = service_urls(api, NAMESPACE, NAME, "http") if ready == "True" else []
            if urls and status.get("endpoint"):
                return str(status["endpoint"]), urls[0]
            pools = ", ".join(
                f"{p['role']} {p.get('readyReplicas', 0)}/{p.get('desiredReplicas', 0)}"
                for p in status.get("pools") or []
            )
            routers = (status.get("router") or {}).get("readyReplicas", 0)
            now = f"waiting for Ready: {pools or 'no pools yet'}, router {routers}"
            if now != said:
                self.say(now)
                said = now
            time.sleep(1.0)
        raise TimeoutError(f"{NAMESPACE}/{NAME} was not Ready within {READY_TIMEOUT_S:g} s")

    def announce(self, endpoint: str, url: str) -> None:
        """Where everything is, and how to try the endpoint by hand."""
        assert self.operator is not None
        kubectl = find_binary("kubectl")
        self.say(
            "\n".join(
                [
                    f"kubectl:          {kubectl} --kubeconfig {self.cluster.kubeconfig} "
                    f"get pdd -n {NAMESPACE}",
                    f"Prometheus:       {self.prometheus.url}",
                    f"operator metrics: http://127.0.0.1:{self.operator.metrics_port}/metrics",
                    f"endpoint:         {endpoint} (status.endpoint); here: {url}",
                    f"try it:           {_curl(url, self.model)}",
                    f"load:             {self.load.what}",
                    f"                  from {self.load.source}",
                    *describe(self.load),
                    f"SLO (P50 over {WINDOW_SECONDS} s): TTFT {TTFT_TARGET_MS} ms (prefill), "
                    f"ITL {ITL_TARGET_MS} ms (decode)",
                ]
            )
        )

    def processes(self) -> dict[int, str]:
        """Every process of the demo by pid, named by what it is."""
        named = {os.getpid(): "demo (operator, kubelet, table)"}
        if self.client.process.pid:
            named[self.client.process.pid] = "client"
        for managed in self.cluster.processes:
            named[managed.pid] = "control plane"
        if self.prometheus.process is not None:
            named[self.prometheus.process.pid] = "Prometheus"
        if self.api is not None and self.virtual is not None and self.virtual.processes:
            roles = {
                (p.metadata.uid if p.metadata else ""): (
                    (p.metadata.labels or {}) if p.metadata else {}
                ).get("pdoperator.io/role", "?")
                for p in client.CoreV1Api(self.api).list_namespaced_pod(NAMESPACE).items
            }
            for uid, process in list(self.virtual.processes.running.items()):
                role = roles.get(uid, "?")
                named[process.popen.pid] = "router" if role == "router" else f"{role} engines"
        return named

    def serve(self, url: str) -> None:
        """Send the load and watch for its duration; measure the CPU it took."""
        began = time.time() + 1.0
        self.client.go(Order(url, self.model, began, self.options.duration_s))
        time.sleep(1.0)
        self.watch(began)
        self.cpu = self.meter.report()
        self.say(f"load over: up to {END_GRACE_S:g} s for the requests in flight")
        self.client.finish(END_GRACE_S + 5)

    def watch(self, began: float) -> None:
        """Redraw the table every `refresh_s` until the load's end."""
        assert self.api is not None
        tty = self.out.isatty()
        with (self.output / "decisions.log").open("w") as log:
            while (t := time.time() - began) < self.options.duration_s:
                self.client.collect()
                self.meter.sample(t, self.processes())
                now = client_window(self.client.records, self.client.sent, t, WINDOW_SECONDS)
                status = get_pdd(self.api).get("status") or {}
                rows, router = read_samples(status, t, now)
                self.samples += rows
                decision = status.get("lastDecision") or {}
                if decision and (decision["time"], decision["reason"]) not in self.decisions[-1:]:
                    self.decisions.append((decision["time"], decision["reason"]))
                    at = _seconds_since(decision["time"], began)
                    log.write(f"{decision['time']} (t={at:.0f} s) {decision['reason']}\n")
                    log.flush()
                shown = self._shown(began)
                table = render(rows, router, shown, self._header(t), self._footer(now))
                print(("\x1b[H\x1b[2J" if tty else "\n") + table, file=self.out, flush=True)
                time.sleep(max(0.0, min(self.options.refresh_s, self.options.duration_s - t)))

    def _header(self, t: float) -> str:
        return (
            f"pd-operator demo  {t:3.0f}/{self.options.duration_s:.0f} s  phase: "
            f"{phase_of(self.load, t)}  ({NAMESPACE}/{NAME}; Ctrl-C stops)"
        )

    def _footer(self, now: dict[str, float]) -> str:
        records = self.client.records
        failed = sum(1 for r in records if r.reason is not None)
        return (
            f"requests: sent {now['sent_per_s']:.1f}/s, completed {now['completed_per_s']:.1f}/s "
            f"(last {WINDOW_SECONDS} s); {len(self.client.sent)} sent, "
            f"{len(records) - failed} answered, {failed} failed\n"
            "decisions (full text in decisions.log):"
        )

    def _shown(self, began: float) -> list[tuple[str, str]]:
        """The last decisions that moved replicas, and the latest one if it did not; each
        with its time on the table's clock."""
        moved = [d for d in self.decisions if "->" in d[1]][-(DECISION_LINES - 1) :]
        if self.decisions and self.decisions[-1] not in moved:
            moved.append(self.decisions[-1])
        return [(f"{_seconds_since(stamp, began):3.0f}s", reason) for stamp, reason in moved]

    def teardown(self) -> None:
        """Stop everything this run started, in an order that leaves nothing behind."""
        # A second Ctrl-C during cleanup must not leave the processes below running.
        previous = signal.getsignal(signal.SIGINT)
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGINT, signal.SIG_IGN)
        try:
            if self.api is not None:
                self.events = scaling_events(self.api, self.events)
            self.client.stop()  # first: the engines then have nothing in flight to drain
            if self.operator is not None:
                self.operator.stop()  # next: nothing scales pods while they go
            if self.virtual is not None:
                if self.api is not None:
                    delete_pods(self.api)
                self.virtual.stop()
            self.prometheus.stop()
            self.cluster.stop()
        finally:
            keep_pod_logs(self.serve_dir, self.output / "pods")
            if threading.current_thread() is threading.main_thread():
                signal.signal(signal.SIGINT, previous)

    def report(self) -> None:
        """The summary and the files of the output folder."""
        records = sorted(self.client.records, key=lambda r: r.index)
        summary = summarize_run(self.load, self.samples, records, self.events, self.cpu)
        (self.output / "summary.txt").write_text(summary + "\n")
        write_samples(self.samples, self.output / "demo.csv")
        write_csv(records, self.output / "requests.csv")
        notes = [f"table: {self.output / 'demo.csv'}", f"requests: {self.output / 'requests.csv'}"]
        if self.options.plot and self.samples:
            notes.append(plot(self.load, self.samples, records, self.output / "demo.png"))
        notes.append(f"summary: {self.output / 'summary.txt'}")
        self.say("\nsummary\n" + summary)
        self.say("\n".join(notes))


def run_demo(options: DemoOptions, out: TextIO = sys.stdout) -> int:
    """Bring everything up, run the load for `options.duration_s` wall seconds, report, and tear
    everything down; 0 when the run completed, 130 when interrupted, 1 when it could not start."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _interrupt)
    output = options.output or Path(tempfile.gettempdir()) / time.strftime("pd-demo-%Y%m%d-%H%M%S")
    output.mkdir(parents=True, exist_ok=True)
    run = DemoRun(options, output, out)
    log_handler = _operator_log(output / "operator.log")
    status = 0
    try:
        endpoint, url = run.bring_up()
        run.announce(endpoint, url)
        run.serve(url)
    except KeyboardInterrupt:
        status = 130
        run.say("\ninterrupted: cleaning up")
    except (RuntimeError, TimeoutError) as error:  # a piece did not start (LocalClusterError too)
        status = 1
        run.say(f"\nfailed: {error}\ncleaning up (the logs are in {output})")
    finally:
        run.teardown()
        logging.getLogger().removeHandler(log_handler)
        log_handler.close()
    run.report()
    return status


def _operator_log(path: Path) -> logging.Handler:
    """The operator's and the kubelet's own log lines, INFO and up, go to `path`; the terminal
    keeps only what it showed before (the table would scroll away)."""
    root = logging.getLogger()
    for handler in root.handlers:
        if handler.level == logging.NOTSET:
            handler.setLevel(root.level)
    handler = logging.FileHandler(path)
    handler.setLevel(logging.INFO)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root.addHandler(handler)
    root.setLevel(min(root.level, logging.INFO))
    return handler


def _seconds_since(stamp: str, began: float) -> float:
    """An RFC 3339 UTC time (status.lastDecision.time) in seconds since `began` (Unix time)."""
    return calendar.timegm(time.strptime(stamp, "%Y-%m-%dT%H:%M:%SZ")) - began
