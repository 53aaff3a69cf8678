"""The closed loop: the real operator sizes pools on virtual nodes whose Ready pods serve the engine
simulator, read back through a real Prometheus.

Nothing here is faked at the operator's boundary: latencies are the simulated engine's, as
Prometheus scrapes them from exactly the pods Kubernetes reports Ready, and the only way a test
moves TTFT is by changing the load or the replicas. Everything runs 20 times faster than the wall
clock (an 82 s model load takes about 4 s); PromQL windows and decision intervals are wall time.

The setup (cluster, PDDeployment, loads and why their levels) is in tests/closedloop.py.
"""

import contextlib
import json
import math
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from datetime import datetime
from typing import Any

import pytest
from kubernetes import client

from closedloop import (
    BREACHING,
    DROP_S,
    HEAVY,
    INTERVAL,
    LIGHT,
    NAME,
    PROFILE,
    SCALE_DOWN_WINDOW,
    STEP_S,
    TIME_SCALE,
    TTFT_TARGET_MS,
    WINDOW,
    load,
    pdd_body,
)
from kubetools import RunningOperator, condition, create_pdd, get_pdd, wait_for
from pd_tools.localcluster import LocalPrometheus
from pd_tools.simcluster.cluster import SimCluster
from pd_tools.simcluster.profile import parse_profile


class Watcher:
    """Samples every pool's Deployment replicas and the Pending pods twice a second, so a test
    can assert on the whole history (never below min, never runaway), not just the last look."""

    def __init__(self, api_client: client.ApiClient, namespace: str) -> None:
        self.apps = client.AppsV1Api(api_client)
        self.core = client.CoreV1Api(api_client)
        self.namespace = namespace
        self.history: list[tuple[float, dict[str, int], int]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(0.5):
            # A read that failed is a gap in the history, not a sample; the history starts once
            # the operator has made both roles' Deployments.
            with contextlib.suppress(client.ApiException):
                replicas = self.replicas()
                if {"prefill-s5000", "decode-h200"} <= set(replicas):
                    self.history.append((time.monotonic(), replicas, self.pending()))

    def replicas(self) -> dict[str, int]:
        """Deployment name suffix (`prefill-s5000`) -> spec.replicas."""
        items = self.apps.list_namespaced_deployment(self.namespace).items
        return {d.metadata.name.removeprefix(f"{NAME}-"): d.spec.replicas for d in items}

    def pending(self) -> int:
        pods = self.core.list_namespaced_pod(self.namespace, field_selector="status.phase=Pending")
        return sum(1 for p in pods.items if not (p.spec and p.spec.node_name))

    def since(self, start: float) -> list[dict[str, int]]:
        return [replicas for at, replicas, _ in list(self.history) if at >= start]

    def __enter__(self) -> "Watcher":
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)


@pytest.fixture
def operator(cluster, namespace) -> Iterator[RunningOperator]:
    running = RunningOperator(
        str(cluster.kubeconfig), namespaces=[namespace], workers=2, resync_seconds=2
    ).start()
    yield running
    running.stop()


@pytest.fixture
def simulate(api_client, namespace, prometheus: LocalPrometheus) -> Iterator[Callable[..., Any]]:
    """Start a SimCluster on PROFILE under `requests` aimed at the PDDeployment."""
    started: list[SimCluster] = []

    def start(requests: Iterator[Any]) -> SimCluster:
        sim = SimCluster(
            api_client,
            parse_profile(PROFILE),
            loads={(namespace, NAME): requests},
            time_scale=TIME_SCALE,
            sd_file=prometheus.targets_dir / f"{namespace}.json",
            name_prefix=f"{namespace}-",
            namespace=namespace,
        )
        sim.start()
        started.append(sim)
        return sim

    yield start
    custom = client.CustomObjectsApi(api_client)
    for sim in started:
        # The pods go while their kubelet still runs; then stop() takes the nodes.
        custom.delete_namespaced_custom_object(
            "pdoperator.io", "v1alpha1", namespace, "pddeployments", NAME
        )
        client.CoreV1Api(api_client).delete_collection_namespaced_pod(
            namespace, grace_period_seconds=0
        )
        sim.stop()


def ttft_seconds(prometheus: LocalPrometheus, namespace: str) -> float | None:
    """The prefill P50 TTFT over the SLO window as Prometheus reports it now (None: no data)."""
    promql = (
        "histogram_quantile(0.5, sum by (le) (rate(vllm:time_to_first_token_seconds_bucket"
        f'{{namespace="{namespace}",role="prefill"}}[{WINDOW}s])))'
    )
    params = urllib.parse.urlencode({"query": promql})
    try:
        with urllib.request.urlopen(f"{prometheus.url}/api/v1/query?{params}", timeout=5) as r:
            result = json.load(r)["data"]["result"]
    except OSError:
        return None
    value = float(result[0]["value"][1]) if result else math.nan
    return None if math.isnan(value) else value


def slo_met(api_client: client.ApiClient, namespace: str) -> dict[str, Any] | None:
    obj = get_pdd(api_client, namespace, NAME)
    return obj if condition(obj, "SLOMet").get("status") == "True" else None


def test_load_step_grows_prefill_until_ttft_meets_target_then_shrinks_after_the_drop(
    api_client, namespace, prometheus, operator, simulate
):
    # 15 wall seconds light, 35 breaching, then almost nothing.
    requests = load((LIGHT, STEP_S), (BREACHING, DROP_S - STEP_S), (0.2, 0))
    sim = simulate(requests)
    create_pdd(api_client, namespace, pdd_body(prometheus.url))
    with Watcher(api_client, namespace) as watcher:
        wait_for(
            lambda: (d := sim.deployment(namespace, NAME)) and d.load_start_s is not None,
            timeout=60,
            what="a Ready prefill and decode pod serving the load",
        )
        deployment = sim.deployment(namespace, NAME)
        assert deployment is not None and deployment.load_start_s is not None
        began = deployment.load_start_s
        stepped = wait_for(
            lambda: sim.now_s() >= began + STEP_S and time.monotonic(),
            timeout=30,
            what="the load step",
        )
        # The light load needs one replica.
        assert {r["prefill-s5000"] for r in watcher.since(0)} == {1}

        breach: float | None = None

        def grown_noting_breach() -> float | bool:
            nonlocal breach
            ttft = ttft_seconds(prometheus, namespace)
            if breach is None and ttft is not None and ttft > 1.1 * TTFT_TARGET_MS / 1000:
                breach = time.monotonic()
            return watcher.replicas()["prefill-s5000"] == 2 and time.monotonic()

        grown = wait_for(grown_noting_breach, timeout=40, what="prefill to grow to two replicas")
        grown_at = math.floor(time.time())
        # The policy may act on demand (waiting prompts) before the percentile crosses the
        # target; it must not wait more than two intervals once Prometheus shows the breach.
        assert grown - (breach or grown) <= 2 * INTERVAL + 1
        assert grown - stepped <= WINDOW + 2 * INTERVAL  # the step is seen within a window

        def met_at_two() -> dict[str, Any] | None:
            # SLOMet from a reading taken at two replicas: grown on demand, before the
            # percentile crossed the target, the condition never turned False, and its True
            # from the light load says nothing of the two replicas yet.
            obj = slo_met(api_client, namespace)
            sampled = ((obj or {}).get("status", {}).get("observed") or {}).get("sampleTime")
            if obj is None or sampled is None:
                return None
            return obj if datetime.fromisoformat(sampled).timestamp() >= grown_at else None

        obj = wait_for(met_at_two, timeout=30, what="SLOMet=True read at two replicas")
        observed = obj["status"]["observed"]
        assert observed["ttftMilliseconds"] <= TTFT_TARGET_MS, observed
        assert (ttft_seconds(prometheus, namespace) or math.inf) < TTFT_TARGET_MS / 1000
        # The met SLO is held: no flapping back to one replica while the load lasts.
        steady = time.monotonic()
        time.sleep(2 * INTERVAL)
        assert all(r["prefill-s5000"] == 2 for r in watcher.since(steady))

        # The load drops at simulated second 1000 after the load started.
        dropped = wait_for(
            lambda: sim.now_s() >= began + DROP_S and time.monotonic(),
            timeout=60,
            what="the load drop",
        )
        shrunk = wait_for(
            lambda: watcher.replicas()["prefill-s5000"] == 1 and time.monotonic(),
            timeout=SCALE_DOWN_WINDOW + WINDOW + 4 * INTERVAL,
            what="prefill to shrink back to one replica",
        )
        # Not before the scale-down window has watched the low load.
        assert shrunk - dropped >= SCALE_DOWN_WINDOW
        time.sleep(INTERVAL)
    history = [r for _, r, _ in watcher.history]
    assert min(r["prefill-s5000"] for r in history) == 1  # never below min
    assert min(r["decode-h200"] for r in history) == 1


def test_a_profiled_model_under_time_compression_reads_its_demand_per_simulated_second(
    api_client, namespace, prometheus, operator, simulate
):
    # The engines run 20x faster than Prometheus's clock; their counters are scaled so rates
    # are per simulated second, the unit of the profile seeds. One request per simulated second
    # of 4,000-token prompts is ~4,000 tokens/s against ~30,000 one S5000 replica serves: one
    # replica. Read per wall second (20 requests/s, 80,000 tokens/s) feed-forward would have
    # grown prefill to its max of four at once.
    sim = simulate(load((LIGHT, 0)))
    body = pdd_body(prometheus.url, prefill_max=4)
    body["spec"]["model"]["name"] = "zai-org/GLM-4.5-FP8"  # the profile the engines simulate
    create_pdd(api_client, namespace, body)
    with Watcher(api_client, namespace) as watcher:
        wait_for(
            lambda: (d := sim.deployment(namespace, NAME)) and d.load_start_s is not None,
            timeout=60,
            what="a Ready prefill and decode pod serving the load",
        )

        def observed_rate() -> float | None:
            status = get_pdd(api_client, namespace, NAME).get("status") or {}
            return (status.get("observed") or {}).get("requestsPerSecond")

        wait_for(observed_rate, timeout=60, what="the request rate in status.observed")
        time.sleep(WINDOW + 2 * INTERVAL)  # a whole window of steady load, two decisions
        rate = observed_rate()
        assert rate is not None and 0.6 <= rate <= 1.5, rate
        assert {r["prefill-s5000"] for r in watcher.since(0)} == {1}
        obj = get_pdd(api_client, namespace, NAME)
        assert "demand" in obj["status"]["lastDecision"]["reason"]  # feed-forward had a say


def test_prometheus_outage_holds_replicas_and_recovers(
    api_client, namespace, prometheus, operator, simulate
):
    sim = simulate(load((BREACHING, 0)))
    create_pdd(api_client, namespace, pdd_body(prometheus.url))
    with Watcher(api_client, namespace) as watcher:
        wait_for(
            lambda: (d := sim.deployment(namespace, NAME)) and d.load_start_s is not None,
            timeout=60,
            what="a Ready prefill and decode pod serving the load",
        )
        # The breach grows prefill to 2, which then meets the SLO. (SLOMet can also read True
        # in the first seconds, before a queue has built up at one replica: not the state
        # this test starts the outage from.)
        wait_for(
            lambda: watcher.replicas()["prefill-s5000"] == 2, timeout=60, what="prefill grown to 2"
        )
        wait_for(lambda: slo_met(api_client, namespace), timeout=60, what="SLOMet=True")
        assert watcher.replicas()["prefill-s5000"] == 2

        port = prometheus.port
        prometheus.pause()
        outage = time.monotonic()
        try:
            # Unknown is not zero: an operator that read the outage as no traffic would shrink
            # prefill to min once the scale-down window passed; four intervals outlast it.
            obj = wait_for(
                lambda: (
                    condition(get_pdd(api_client, namespace, NAME), "MetricsAvailable").get(
                        "status"
                    )
                    == "False"
                    and get_pdd(api_client, namespace, NAME)
                ),
                timeout=3 * INTERVAL,
                what="MetricsAvailable=False during the outage",
            )
            assert obj["status"]["lastDecision"]["limitedBy"] == "metrics"
            time.sleep(max(0.0, outage + 4 * INTERVAL - time.monotonic()))
            assert [r["prefill-s5000"] for r in watcher.since(outage)] == [2] * len(
                watcher.since(outage)
            )
        finally:
            prometheus.start(port=port)
        assert prometheus.port == port
        wait_for(
            lambda: (
                condition(get_pdd(api_client, namespace, NAME), "MetricsAvailable").get("status")
                == "True"
            ),
            timeout=4 * INTERVAL,
            what="MetricsAvailable=True after Prometheus returns",
        )
        wait_for(lambda: slo_met(api_client, namespace), timeout=30, what="SLOMet=True again")
        assert watcher.replicas()["prefill-s5000"] == 2


@pytest.mark.parametrize("spill", [True, False], ids=["spills-to-h200", "no-second-pool"])
def test_exhausted_s5000_capacity_spills_or_says_so_without_pending_pods(
    api_client, namespace, prometheus, operator, simulate, spill
):
    # More than two S5000 replicas can take: the policy wants a third and a fourth.
    sim = simulate(load((HEAVY, 0)))
    create_pdd(api_client, namespace, pdd_body(prometheus.url, prefill_max=4, spill=spill))
    with Watcher(api_client, namespace) as watcher:
        wait_for(
            lambda: (d := sim.deployment(namespace, NAME)) and d.load_start_s is not None,
            timeout=60,
            what="a Ready prefill and decode pod serving the load",
        )
        if spill:
            wait_for(
                lambda: watcher.replicas().get("prefill-h200", 0) >= 1,
                timeout=60,
                what="prefill to spill onto the H200 pool",
            )
            # The preferred pool is full first (its Deployment may be written just after).
            wait_for(
                lambda: watcher.replicas()["prefill-s5000"] == 2,
                timeout=INTERVAL,
                what="the S5000 pool at its two nodes",
            )
            time.sleep(2 * INTERVAL)  # a few more decisions at the full S5000 pool
        else:
            obj = wait_for(
                lambda: (
                    condition(o := get_pdd(api_client, namespace, NAME), "CapacityAvailable").get(
                        "status"
                    )
                    == "False"
                    and o
                ),
                timeout=60,
                what="CapacityAvailable=False",
            )
            assert "prefill" in condition(obj, "CapacityAvailable")["message"]
            time.sleep(3 * INTERVAL)  # a few more decisions under the same shortage
    history = watcher.history
    # Only what fits is asked for: two S5000 nodes hold two replicas, the H200 nodes left by
    # decode hold two more, and nothing piles up Pending.
    assert max(r.get("prefill-s5000", 0) for _, r, _ in history) <= 2
    assert max(r.get("prefill-h200", 0) for _, r, _ in history) <= 2
    assert max(pending for _, _, pending in history) <= 1


def test_operator_restarted_mid_scale_up_neither_repeats_nor_reverts_it(
    cluster, api_client, namespace, prometheus, simulate
):
    sim = simulate(load((BREACHING, 0)))
    # Room for four replicas: a repeated decision would show as a third or fourth.
    create_pdd(api_client, namespace, pdd_body(prometheus.url, prefill_max=4))
    first = RunningOperator(
        str(cluster.kubeconfig), namespaces=[namespace], workers=2, resync_seconds=2
    ).start()
    second: RunningOperator | None = None
    try:
        with Watcher(api_client, namespace) as watcher:
            wait_for(
                lambda: (d := sim.deployment(namespace, NAME)) and d.load_start_s is not None,
                timeout=60,
                what="a Ready prefill and decode pod serving the load",
            )
            wait_for(
                lambda: watcher.replicas()["prefill-s5000"] >= 2,
                timeout=40,
                what="the scale-up decision",
            )
            first.stop()  # while the new replica is still loading
            restarted = time.monotonic()
            second = RunningOperator(
                str(cluster.kubeconfig), namespaces=[namespace], workers=2, resync_seconds=2
            ).start()
            wait_for(
                lambda: slo_met(api_client, namespace),
                timeout=40,
                what="SLOMet=True under the restarted operator",
            )
            time.sleep(3 * INTERVAL)  # several decisions of the new operator
            after = [r["prefill-s5000"] for r in watcher.since(restarted)]
    finally:
        (second or first).stop()  # stopping twice is harmless
    decided = max(r["prefill-s5000"] for _, r, _ in watcher.history)
    assert set(after) == {decided}, after  # neither reverted nor repeated
    assert decided == 2  # two replicas meet the target at this load
