"""The Prometheus reader against a real Prometheus scraping vLLM-named metrics."""

import time

import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge, start_http_server

from fakeengine import FakeEngine
from kubetools import wait_for
from pd_operator.adapters.prometheus import PrometheusReader, SignalTarget
from pd_operator.core.seasonal import forecast
from pd_operator.core.signals import ReadingKind, RouterTraffic
from pd_tools.localcluster.processes import free_port


@pytest.fixture
def engines(prometheus):
    made = []

    def make(name, labels):
        engine = FakeEngine(prometheus, name, labels)
        made.append((name, engine))
        return engine

    yield make
    for name, engine in made:
        prometheus.set_targets(name, [], {})
        engine.close()


def target(
    name: str, engine: str = "VLLM", window: int = 10, *, several_pools: bool = False
) -> SignalTarget:
    return SignalTarget("ns", name, engine, "P50", "P90", window, several_pools=several_pools)


def test_grouped_reads_give_each_object_its_own_latency(prometheus, engines):
    fast = engines("fast-prefill", {"namespace": "ns", "deployment": "fast", "role": "prefill"})
    slow = engines("slow-prefill", {"namespace": "ns", "deployment": "slow", "role": "prefill"})
    decode = engines("fast-decode", {"namespace": "ns", "deployment": "fast", "role": "decode"})
    idle = engines("idle-prefill", {"namespace": "ns", "deployment": "idle", "role": "prefill"})
    idle.ttft.labels(model_name="m")  # the series exist, but nothing is observed
    reader = PrometheusReader(prometheus.url)
    targets = [target("fast"), target("slow"), target("idle")]

    def observe_and_read():
        for _ in range(20):
            fast.ttft.labels(model_name="m").observe(0.3)
            slow.ttft.labels(model_name="m").observe(3.0)
            decode.itl.labels(model_name="m").observe(0.015)
        fast.waiting.labels(model_name="m").set(7)
        fast.prompt.labels(model_name="m").inc(5000)
        fast.cached.labels(model_name="m").inc(2000)  # 40% of the prompt tokens
        signals, report = reader.read(targets)
        # Every series scraped at least twice (a rate needs two samples), whichever came last.
        fast_prefill = signals[("ns", "fast", "prefill")]
        ready = all(
            reading.kind is ReadingKind.VALUE
            for reading in (
                fast_prefill.ttft_seconds,
                signals[("ns", "slow", "prefill")].ttft_seconds,
                signals[("ns", "fast", "decode")].itl_seconds,
                fast_prefill.queue_depth,
                fast_prefill.prompt_tokens_per_second,
                fast_prefill.mean_latency_seconds,
            )
        )
        ready = ready and signals[("ns", "idle", "prefill")].ttft_seconds.kind is not (
            ReadingKind.UNAVAILABLE
        )
        return (signals, report) if ready else None

    signals, report = wait_for(observe_and_read, timeout=40, interval=1, what="rates over scrapes")
    fast_ttft = signals[("ns", "fast", "prefill")].ttft_seconds.value
    slow_ttft = signals[("ns", "slow", "prefill")].ttft_seconds.value
    assert 0.25 <= fast_ttft <= 0.5  # inside the bucket that holds 0.3 s
    assert 2.5 <= slow_ttft <= 5.0
    assert signals[("ns", "fast", "decode")].itl_seconds.value <= 0.02
    # The mean is exact where the percentile is only known within its bucket.
    assert signals[("ns", "fast", "prefill")].mean_latency_seconds.value == pytest.approx(0.3)
    assert signals[("ns", "fast", "decode")].mean_latency_seconds.value == pytest.approx(0.015)
    assert signals[("ns", "fast", "prefill")].queue_depth.value == 7
    fast_prefill = signals[("ns", "fast", "prefill")]
    assert fast_prefill.prompt_tokens_per_second.value > 0
    # Both counters come from the same scrapes of one pod: their rates keep about the 2:5 of
    # the increments (a scrape between the two increments moves it a little).
    cached = fast_prefill.cached_prompt_tokens_per_second.value
    assert cached == pytest.approx(0.4 * fast_prefill.prompt_tokens_per_second.value, rel=0.02)
    slow_cached = signals[("ns", "slow", "prefill")].cached_prompt_tokens_per_second
    assert slow_cached.kind is ReadingKind.UNAVAILABLE
    # A histogram without requests in the window is no traffic, not zero latency.
    assert signals[("ns", "idle", "prefill")].ttft_seconds.kind is ReadingKind.NO_TRAFFIC
    assert report.adapters == {"VLLM": "vllm-underscore"}
    assert report.errors == []


def test_the_kv_hand_off_is_read_from_the_connector_or_inferred(prometheus, engines):
    """NIXL's transfer time is recorded on decode and read as prefill's hand-off, bounded by
    what the TTFT holds besides queue and prefill; without it, that remainder is the hand-off."""
    nixl = engines("nixl-prefill", {"namespace": "ns", "deployment": "nixl", "role": "prefill"})
    pulls = engines("nixl-decode", {"namespace": "ns", "deployment": "nixl", "role": "decode"})
    bare = engines("bare-prefill", {"namespace": "ns", "deployment": "bare", "role": "prefill"})
    reader = PrometheusReader(prometheus.url)

    def observe_and_read():
        for _ in range(20):
            for engine in (nixl, bare):
                engine.ttft.labels(model_name="m").observe(5.0)
                engine.queue_time.labels(model_name="m").observe(1.0)
                engine.prefill_time.labels(model_name="m").observe(0.5)
            pulls.transfer.labels(model_name="m").observe(2.5)
            pulls.itl.labels(model_name="m").observe(0.015)
        signals, _ = reader.read([target("nixl"), target("bare")])
        found = [signals[("ns", name, "prefill")].kv_transfer_seconds for name in ("nixl", "bare")]
        waits = signals[("ns", "bare", "prefill")].queue_seconds
        # The decode engine (which holds the connector's histogram) is scraped on its own
        # schedule: until it has two scrapes, nixl's hand-off is the remainder, as it should be.
        pulled = signals[("ns", "nixl", "decode")].itl_seconds
        ready = pulled.kind is ReadingKind.VALUE and all(
            r.kind is ReadingKind.VALUE for r in (*found, waits)
        )
        return (*found, waits) if ready else None

    connector, inferred, waits = wait_for(observe_and_read, timeout=40, interval=1, what="hand-off")
    assert connector.value == pytest.approx(2.5)
    assert inferred.value == pytest.approx(3.5)  # 5 s TTFT less 1 s queue and 0.5 s prefill
    # The prompts' mean wait, which says whether queueing can explain a TTFT tail.
    assert waits.value == pytest.approx(1.0)


def test_each_pool_of_a_role_is_read_on_its_own_and_the_role_as_their_sum(prometheus, engines):
    """Two prefill pools on different cards: each pool's TTFT and prompt tokens come back under
    its `pool` label, and the role's prompt tokens are both pools' together."""
    labels = {"namespace": "ns", "deployment": "mixed", "role": "prefill"}
    slow = engines("mixed-s5000", {**labels, "pool": "s5000"})
    fast = engines("mixed-h200", {**labels, "pool": "h200"})
    reader = PrometheusReader(prometheus.url)

    def observe_and_read():
        for _ in range(20):
            slow.ttft.labels(model_name="m").observe(3.0)
            fast.ttft.labels(model_name="m").observe(0.3)
        slow.prompt.labels(model_name="m").inc(1000)
        fast.prompt.labels(model_name="m").inc(3000)
        signals, report = reader.read([target("mixed", several_pools=True)])
        prefill = signals[("ns", "mixed", "prefill")]
        pools = prefill.pools
        ready = set(pools) == {"s5000", "h200"} and all(
            read.kind is ReadingKind.VALUE
            for pool in pools.values()
            for read in (pool.latency_seconds, pool.served_tokens_per_second)
        )
        return (prefill, report) if ready else None

    prefill, report = wait_for(observe_and_read, timeout=40, interval=1, what="per-pool reads")
    pools = prefill.pools
    assert 2.5 <= pools["s5000"].latency_seconds.value <= 5.0
    assert 0.25 <= pools["h200"].latency_seconds.value <= 0.5
    # Each pool's prompt tokens (scraped on each engine's own schedule), and the role's rate is
    # theirs summed, from the same query.
    slow_rate = pools["s5000"].served_tokens_per_second.value
    fast_rate = pools["h200"].served_tokens_per_second.value
    assert slow_rate > 0 and fast_rate > 0
    assert prefill.prompt_tokens_per_second.value == pytest.approx(slow_rate + fast_rate)
    assert report.errors == []


def test_queries_per_cycle_do_not_grow_with_the_number_of_objects(prometheus, engines):
    engines("one-decode", {"namespace": "ns", "deployment": "one", "role": "decode"}).itl.labels(
        model_name="m"
    ).observe(0.01)
    reader = PrometheusReader(prometheus.url)

    def both_reads():
        _, few = reader.read([target("one")])
        _, many = reader.read([target(f"obj-{i}") for i in range(200)])
        # A scrape that times out on a busy machine marks the engine's series stale until the
        # next one, and a read then finds no engine at all (one query): compare two reads that
        # both saw it.
        return (few, many) if few.adapters and many.adapters else None

    few, many = wait_for(both_reads, timeout=20, what="two reads that both see the engine")
    assert many.queries == few.queries <= 16, (few, many)  # detection + 15 signals
    # An object with a role of several pools adds each role's latency per pool, once.
    _, pooled = reader.read([target("one", several_pools=True), target("two", several_pools=True)])
    assert pooled.queries == few.queries + 2, (few, pooled)


def test_an_engine_without_series_is_unavailable_and_names_what_was_looked_for(prometheus, engines):
    engines("v-decode", {"namespace": "ns", "deployment": "v", "role": "decode"}).itl.labels(
        model_name="m"
    ).observe(0.01)
    reader = PrometheusReader(prometheus.url)
    wait_for(lambda: reader.read([target("v")])[1].adapters, timeout=20, what="detection")
    signals, _ = reader.read([target("s", engine="SGLang")])
    reading = signals[("ns", "s", "decode")].itl_seconds
    assert reading.kind is ReadingKind.UNAVAILABLE
    assert "sglang:inter_token_latency_seconds" in reading.reason  # says what it looked for


def test_an_object_with_no_series_reports_the_failing_query(prometheus, engines):
    engines("w-decode", {"namespace": "ns", "deployment": "w", "role": "decode"}).itl.labels(
        model_name="m"
    ).observe(0.01)
    reader = PrometheusReader(prometheus.url)
    wait_for(lambda: reader.read([target("w")])[1].adapters, timeout=20, what="detection")
    signals, report = reader.read([target("missing")])
    assert signals[("ns", "missing", "prefill")].ttft_seconds.kind is ReadingKind.UNAVAILABLE
    assert "time_to_first_token" in report.failing_queries[("ns", "missing", "prefill")]


def test_an_engine_without_prefix_cache_counters_is_not_reported_misconfigured(prometheus, engines):
    """vLLM with prefix caching off, or an older version, has no prefix_cache_hits series:
    the share cached is unknown (seeds then count every prompt token computed), and the
    object's MetricsConfigured condition must not blame that query."""
    engine = engines("c-prefill", {"namespace": "ns", "deployment": "c", "role": "prefill"})
    reader = PrometheusReader(prometheus.url)

    def read_with_every_series():
        engine.ttft.labels(model_name="m").observe(0.2)
        engine.prompt.labels(model_name="m").inc(1000)
        engine.generation.labels(model_name="m").inc(10)
        for gauge in (engine.waiting, engine.running, engine.kv_usage):
            gauge.labels(model_name="m").set(0)
        signals, report = reader.read([target("c")])
        prefill = signals[("ns", "c", "prefill")]
        # Every series the engine has, read as a value: from then on only the missing prefix
        # cache counter could be blamed.
        read = (prefill.prompt_tokens_per_second, prefill.ttft_seconds, prefill.queue_depth)
        return (prefill, report) if all(r.kind is ReadingKind.VALUE for r in read) else None

    prefill, report = wait_for(read_with_every_series, timeout=40, what="a rate over scrapes")
    assert prefill.cached_prompt_tokens_per_second.kind is ReadingKind.UNAVAILABLE
    assert ("ns", "c", "prefill") not in report.failing_queries, report.failing_queries


def test_prometheus_down_is_unavailable_never_zero():
    reader = PrometheusReader(f"http://127.0.0.1:{free_port()}", timeout_seconds=1)
    signals, report = reader.read([target("x")])
    for role in ("prefill", "decode"):
        role_signals = signals[("ns", "x", role)]
        assert role_signals.ttft_seconds.kind is ReadingKind.UNAVAILABLE
        assert role_signals.requests_per_second.rate_or_zero() is None
    assert report.errors


def counter_history(now: float, seasons: dict[int, float]) -> str:
    """OpenMetrics samples of ns/seasonal's prefill prompt-token counter around this moment one
    or more days ago, every 15 s: 1,000 tokens/s, rising to `seasons[k]` 300 s after it `k`
    days ago."""
    series = 'vllm_prompt_tokens_total{namespace="ns",deployment="seasonal",role="prefill"}'
    lines, total = ["# TYPE vllm_prompt_tokens counter"], 0.0
    for k in sorted(seasons, reverse=True):  # oldest first
        moment = now - k * 86_400
        for i in range(2400 // 15 + 1):  # from 10 minutes before to 30 after
            t = moment - 600 + 15 * i
            total += 15 * (seasons[k] if t > moment + 300 else 1000.0)
            lines.append(f"{series} {total} {t:.3f}")
    return "\n".join([*lines, "# EOF"]) + "\n"


def test_seasons_are_read_from_the_history_prometheus_keeps(prometheus_with_history):
    """Two days of backfilled history (promtool) and a third missing: the reader returns what
    each role served from this moment one, two and three days ago, from grouped range
    queries, and the forecast over them is the least of the two days' peaks."""
    now = time.time()
    server = prometheus_with_history(counter_history(now, {1: 5000.0, 2: 4000.0}), "4d")
    engine = FakeEngine(
        server, "seasonal-prefill", {"namespace": "ns", "deployment": "seasonal", "role": "prefill"}
    )
    try:
        engine.ttft.labels(model_name="m").observe(0.2)  # a live series, for detection
        reader = PrometheusReader(server.url)
        seasonal = SignalTarget(
            "ns", "seasonal", "VLLM", "P50", "P90", 10, seasonal=("Day", 3, "UTC")
        )
        signals, report = wait_for(
            lambda: (found := reader.read([seasonal], now))[1].adapters and found,
            timeout=20,
            what="the engine detected",
        )
        assert report.errors == []
        yesterday, before, third = signals[("ns", "seasonal", "prefill")].seasons
        assert third == ()  # no history three days ago
        for season, rise in ((yesterday, 5000.0), (before, 4000.0)):
            offsets = [offset for offset, _ in season]
            assert offsets[0] == pytest.approx(0, abs=1) and offsets[-1] == pytest.approx(
                900, abs=1
            )
            assert dict(season)[offsets[0]] == pytest.approx(1000, rel=0.02)
            assert max(value for _, value in season) == pytest.approx(rise, rel=0.02)
        assert signals[("ns", "seasonal", "decode")].seasons == ((), (), ())
        found = forecast((yesterday, before), lead_seconds=420, today=1000.0)
        assert found is not None and found.tokens_per_second == pytest.approx(4000, rel=0.02)
        assert forecast((yesterday, before, third), lead_seconds=420, today=1000.0) is None
        # Without seasonal, nothing more is read.
        plain = SignalTarget("ns", "seasonal", "VLLM", "P50", "P90", 10)
        _, without = reader.read([plain], now)
        assert report.queries == without.queries + 2 * 3  # a range query per role and season
    finally:
        engine.close()


def test_the_routers_activator_is_read_even_when_no_engine_runs(prometheus):
    """At zero the activator's series are the only ones an object has: they are read in one
    grouped query, whatever the engines' state, and only for objects with idleSeconds."""
    registry = CollectorRegistry()
    requests = Counter("pd_activator_requests", "r", registry=registry)
    pending = Gauge("pd_activator_pending_requests", "p", registry=registry)
    in_flight = Gauge("pd_activator_in_flight_requests", "f", registry=registry)
    port = free_port()
    server, thread = start_http_server(port, addr="127.0.0.1", registry=registry)
    labels = {"namespace": "ns", "deployment": "asleep", "role": "router"}
    prometheus.set_targets("asleep-router", [f"127.0.0.1:{port}"], labels)
    try:
        requests.inc(7)
        pending.set(2)
        in_flight.set(3)
        reader = PrometheusReader(prometheus.url)
        idle = SignalTarget("ns", "asleep", "VLLM", "P50", "P90", 10, router_traffic=True)
        signals, report = wait_for(
            lambda: (
                (found := reader.read([idle]))[0][("ns", "asleep", "decode")].router_traffic
                and found
            ),
            timeout=20,
            what="the activator scraped",
        )
        for role in ("prefill", "decode"):
            role_signals = signals[("ns", "asleep", role)]
            assert role_signals.router_traffic == RouterTraffic(7.0, 2.0, 3.0)
            assert role_signals.ttft_seconds.kind is ReadingKind.UNAVAILABLE  # no engine runs
        # Without idleSeconds the query is not sent.
        plain_signals, plain = reader.read([target("asleep")])
        assert plain_signals[("ns", "asleep", "prefill")].router_traffic is None
        assert report.queries == plain.queries + 1
    finally:
        prometheus.set_targets("asleep-router", [], {})
        server.shutdown()
        thread.join(timeout=5)
