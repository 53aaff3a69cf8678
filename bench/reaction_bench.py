"""Benchmark: the autoscaler's reaction time in the closed loop.

The setup is the closed-loop test's (tests/closedloop.py): a local control
plane, the mock scheduler's virtual nodes whose Ready pods serve the engine simulator 20 times
faster than the wall clock, a real Prometheus scraping them, and the operator running in this
process. Each trial starts from one prefill replica under a light load that then steps to a load
one replica cannot serve within the TTFT target, and measures, in wall time:

- breach visible: the first moment the operator's own TTFT query (`promql.quantile_query`, P50
  over the SLO window), polled every 0.25 s, shows a value above the target;
- replicas written: the moment a watch on the prefill Deployment sees spec.replicas grow;
- the deciding cycle: the autoscaler cycle that first decided more prefill replicas (its start,
  when it read Prometheus, and its end, when it handed the decision to the reconciler).

Reaction = written - visible; it splits into waiting for the deciding cycle (start - visible),
the cycle itself (end - start) and the apply (written - end: work queue, reconcile,
server-side apply, watch delivery). A negative reaction means the operator grew prefill before
the percentile crossed the target (it also acts on queue pressure and demand).

Each trial gets a fresh namespace, simulated cluster, operator and PDDeployment, so trials are
independent (nothing learned carries over) and the reset is bounded: tear down and start again.

    python bench/reaction_bench.py --trials 5
"""

import argparse
import contextlib
import json
import math
import statistics
import sys
import threading
import time
import urllib.parse
import urllib.request
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kubernetes import client, config, watch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from closedloop import (
    BREACHING,
    INTERVAL,
    LIGHT,
    NAME,
    PROFILE,
    STEP_S,
    TIME_SCALE,
    TTFT_TARGET_MS,
    WINDOW,
    load,
    pdd_body,
)
from kubetools import RunningOperator, create_pdd, wait_for
from pd_operator.adapters.promql import VLLM, quantile_query
from pd_operator.core.naming import deployment_name
from pd_tools.localcluster import LocalCluster, LocalPrometheus
from pd_tools.simcluster.cluster import SimCluster
from pd_tools.simcluster.profile import parse_profile

# The closed-loop test's operating point (tests/closedloop.py): one S5000 prefill replica meets
# a 250 ms P50 TTFT at LIGHT load and breaches it at BREACHING; two replicas meet it.
POLL_S = 0.25  # how often Prometheus is asked whether the breach is visible
PREFILL = deployment_name(NAME, "prefill", "s5000")
# Per-trial bounds, wall seconds.
READY_TIMEOUT = 90  # until a Ready prefill and decode pod serve the load
REACTION_TIMEOUT = WINDOW + 6 * INTERVAL  # from the step until breach and growth are both seen
MAX_TRIALS = 20


def ttft_seconds(prometheus_url: str, namespace: str) -> float | None:
    """This object's prefill TTFT as the operator's grouped query reports it (None: no value)."""
    promql = quantile_query(VLLM.ttft_histogram, "prefill", "P50", WINDOW)
    params = urllib.parse.urlencode({"query": promql})
    try:
        with urllib.request.urlopen(f"{prometheus_url}/api/v1/query?{params}", timeout=2) as r:
            result = json.load(r)["data"]["result"]
    except (OSError, ValueError, KeyError):
        return None
    for series in result:
        labels = series["metric"]
        if labels.get("namespace") == namespace and labels.get("deployment") == NAME:
            value = float(series["value"][1])
            return None if math.isnan(value) else value
    return None


class ReplicaWatch:
    """A watch on the prefill Deployment: when spec.replicas first exceeded one."""

    def __init__(self, api_client: client.ApiClient, namespace: str) -> None:
        self.apps = client.AppsV1Api(api_client)
        self.namespace = namespace
        self.grown: float | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="replica-watch", daemon=True)

    def _run(self) -> None:
        resource_version: str | None = None
        # Short watches resumed from the last resource version: no gap, and the thread sees
        # the stop flag within a few seconds even when no event arrives.
        while not self._stop.is_set() and self.grown is None:
            stream = watch.Watch()  # type: ignore[no-untyped-call]
            kwargs: dict[str, Any] = {
                "field_selector": f"metadata.name={PREFILL}",
                "timeout_seconds": 3,
                "_request_timeout": 10,
            }
            if resource_version:
                kwargs["resource_version"] = resource_version
            try:
                for event in stream.stream(  # type: ignore[no-untyped-call]
                    self.apps.list_namespaced_deployment, self.namespace, **kwargs
                ):
                    deployment = event["object"]
                    resource_version = deployment.metadata.resource_version
                    if (deployment.spec.replicas or 0) > 1 and self.grown is None:
                        self.grown = time.monotonic()
                    if self._stop.is_set() or self.grown is not None:
                        stream.stop()  # type: ignore[no-untyped-call]
            except client.ApiException as error:
                if error.status == 410:  # too old: start from a fresh list
                    resource_version = None
                self._stop.wait(0.2)
            except Exception:  # a dropped connection: resume
                self._stop.wait(0.2)

    def __enter__(self) -> "ReplicaWatch":
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(timeout=15)


@dataclass
class Cycle:
    """One autoscaler cycle that decided this object."""

    began: float
    ended: float
    prefill: int | None  # the prefill replicas it decided


@dataclass
class Trial:
    stepped: float = math.nan  # the load step, wall (monotonic)
    visible: float | None = None  # breach first visible in Prometheus
    written: float | None = None  # prefill spec.replicas grew
    early: bool = False  # grew before the step: the light load was misjudged
    cycles: list[Cycle] = field(default_factory=list)

    def deciding(self) -> Cycle | None:
        return next((c for c in self.cycles if (c.prefill or 0) > 1), None)

    def due_cycles_after_visible(self) -> int:
        """Cycles that started after the breach was visible and did not grow prefill."""
        if self.visible is None:
            return 0
        return sum(1 for c in self.cycles if c.began >= self.visible and (c.prefill or 0) <= 1)


def instrument(operator: RunningOperator, namespace: str, trial: Trial) -> None:
    """Note every autoscaler cycle that decided this object, with the prefill it decided."""
    autoscaler = operator.state.autoscaler
    original = autoscaler.cycle
    key = (namespace, NAME)

    def timed() -> int:
        began = time.monotonic()
        decided = original()
        ended = time.monotonic()
        if decided:
            replicas = autoscaler.decisions_for(key) or {}
            trial.cycles.append(Cycle(began, ended, replicas.get(("prefill", "s5000"))))
        return decided

    autoscaler.cycle = timed  # type: ignore[method-assign]


def run_trial(
    api_client: client.ApiClient,
    cluster: LocalCluster,
    prometheus: LocalPrometheus,
    index: int,
) -> Trial:
    namespace = f"rb-{index}-{uuid.uuid4().hex[:6]}"
    core = client.CoreV1Api(api_client)
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=namespace)))
    trial = Trial()
    sim = SimCluster(
        api_client,
        parse_profile(PROFILE),
        loads={(namespace, NAME): load((LIGHT, STEP_S), (BREACHING, 0), seed=11 + index)},
        time_scale=TIME_SCALE,
        sd_file=prometheus.targets_dir / f"{namespace}.json",
        name_prefix=f"{namespace}-",
        namespace=namespace,
    )
    operator: RunningOperator | None = None
    try:
        sim.start()
        operator = RunningOperator(
            str(cluster.kubeconfig), namespaces=[namespace], workers=2, resync_seconds=2
        )
        instrument(operator, namespace, trial)
        operator.start()
        create_pdd(api_client, namespace, pdd_body(prometheus.url))
        with ReplicaWatch(api_client, namespace) as watcher:
            wait_for(
                lambda: (d := sim.deployment(namespace, NAME)) and d.load_start_s is not None,
                timeout=READY_TIMEOUT,
                what="a Ready prefill and decode pod serving the load",
            )
            deployment = sim.deployment(namespace, NAME)
            assert deployment is not None and deployment.load_start_s is not None
            began = deployment.load_start_s
            trial.stepped = wait_for(
                lambda: sim.now_s() >= began + STEP_S and time.monotonic(),
                timeout=STEP_S * TIME_SCALE + 15,
                what="the load step",
            )
            trial.early = watcher.grown is not None
            deadline = trial.stepped + REACTION_TIMEOUT
            while time.monotonic() < deadline:
                asked = time.monotonic()
                if trial.visible is None:
                    ttft = ttft_seconds(prometheus.url, namespace)
                    if ttft is not None and ttft > TTFT_TARGET_MS / 1000:
                        trial.visible = asked
                if trial.visible is not None and watcher.grown is not None:
                    break
                time.sleep(max(0.0, asked + POLL_S - time.monotonic()))
            trial.written = watcher.grown
    finally:
        with contextlib.suppress(client.ApiException):
            client.CustomObjectsApi(api_client).delete_namespaced_custom_object(
                "pdoperator.io", "v1alpha1", namespace, "pddeployments", NAME
            )
        with contextlib.suppress(client.ApiException):
            core.delete_collection_namespaced_pod(namespace, grace_period_seconds=0)
        sim.stop()
        if operator is not None:
            operator.stop()
        with contextlib.suppress(client.ApiException):
            core.delete_namespace(namespace)
    return trial


def fmt(value: float | None) -> str:
    return "—" if value is None or math.isnan(value) else f"{value:.2f}"


def period(trials: list[Trial]) -> float | None:
    """The median time between consecutive cycles that decided the object."""
    gaps = [b.began - a.began for t in trials for a, b in zip(t.cycles, t.cycles[1:], strict=False)]
    return statistics.median(gaps) if gaps else None


def report(trials: list[Trial], elapsed: float) -> None:
    rows = []
    reactions: list[float] = []
    splits: list[tuple[float, float, float]] = []
    for number, t in enumerate(trials, 1):
        deciding = t.deciding()
        reaction = t.written - t.visible if t.written and t.visible else None
        if reaction is not None and not t.early:
            reactions.append(reaction)
            if deciding and t.visible and t.written:
                splits.append(
                    (
                        deciding.began - t.visible,
                        deciding.ended - deciding.began,
                        t.written - deciding.ended,
                    )
                )
        rows.append(
            (
                str(number),
                fmt(t.visible - t.stepped if t.visible else None),
                fmt(t.written - t.stepped if t.written else None),
                fmt(reaction) + (" (grew before the step)" if t.early else ""),
                fmt(deciding.began - t.visible if deciding and t.visible else None),
                fmt(deciding.ended - deciding.began if deciding else None),
                fmt(t.written - deciding.ended if deciding and t.written else None),
                str(t.due_cycles_after_visible()),
            )
        )
    header = (
        "trial",
        "breach visible after step (s)",
        "replicas written after step (s)",
        "reaction: written - visible (s)",
        "wait for deciding cycle (s)",
        "cycle (s)",
        "apply (s)",
        "cycles after breach that held",
    )
    print(f"\nautoscaler reaction time ({len(trials)} trials, {elapsed:.0f} s, 2 cores)\n")
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    for row in rows:
        print("| " + " | ".join(row) + " |")
    cycle_period = period(trials)
    summary = [
        ("decision interval (spec.scaling.intervalSeconds)", f"{INTERVAL} s"),
        ("measured period between deciding cycles (p50)", f"{fmt(cycle_period)} s"),
        (
            "reaction p50 / max",
            f"{fmt(statistics.median(reactions) if reactions else None)} / "
            f"{fmt(max(reactions) if reactions else None)} s",
        ),
        (
            "split p50: wait for the cycle / cycle / apply",
            " / ".join(
                fmt(statistics.median(p[i] for p in splits) if splits else None) for i in range(3)
            )
            + " s",
        ),
        (
            "trials within one interval",
            f"{sum(r <= INTERVAL for r in reactions)} / {len(trials)}",
        ),
    ]
    print("\n| measure | value | target |\n|---|---|---|")
    for name, value in summary:
        target = "≤ one interval" if name.startswith("reaction") else ""
        print(f"| {name} | {value} | {target} |")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--trials", type=int, default=5, help=f"at most {MAX_TRIALS}")
    parser.add_argument(
        "--budget", type=float, default=420, help="wall seconds after which no trial starts"
    )
    args = parser.parse_args()
    trials_wanted = max(1, min(args.trials, MAX_TRIALS))
    started = time.monotonic()
    trials: list[Trial] = []
    with LocalCluster() as cluster, LocalPrometheus() as prometheus:
        api_client = config.new_client_from_config(config_file=str(cluster.kubeconfig))  # type: ignore[no-untyped-call]
        for index in range(trials_wanted):
            if time.monotonic() - started > args.budget:
                print(f"budget of {args.budget:.0f} s spent after {index} trials", file=sys.stderr)
                break
            try:
                trial = run_trial(api_client, cluster, prometheus, index)
            except AssertionError as error:  # a bounded wait that ran out
                print(f"trial {index + 1} failed: {error}", file=sys.stderr)
                continue
            trials.append(trial)
            print(
                f"trial {index + 1}: visible {fmt(trial.visible and trial.visible - trial.stepped)}"
                f" s, written {fmt(trial.written and trial.written - trial.stepped)} s after the"
                f" step; {len(trial.cycles)} cycles",
                file=sys.stderr,
            )
    if not trials:
        print("no trial completed", file=sys.stderr)
        return 1
    report(trials, time.monotonic() - started)
    return 0


if __name__ == "__main__":
    sys.exit(main())
