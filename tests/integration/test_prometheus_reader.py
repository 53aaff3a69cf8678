"""The Prometheus reader against a real Prometheus scraping vLLM-named metrics."""

import pytest

from fakeengine import FakeEngine
from kubetools import wait_for
from pd_operator.adapters.prometheus import PrometheusReader, SignalTarget
from pd_operator.core.signals import ReadingKind
from pd_operator.localcluster.processes import free_port


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


def target(name: str, engine: str = "VLLM", window: int = 10) -> SignalTarget:
    return SignalTarget("ns", name, engine, "P50", "P90", window)


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
    assert signals[("ns", "fast", "prefill")].prompt_tokens_per_second.value > 0
    # A histogram without requests in the window is no traffic, not zero latency.
    assert signals[("ns", "idle", "prefill")].ttft_seconds.kind is ReadingKind.NO_TRAFFIC
    assert report.adapters == {"VLLM": "vllm-underscore"}
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
    assert many.queries == few.queries <= 12, (few, many)  # detection + 11 signals


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


def test_prometheus_down_is_unavailable_never_zero():
    reader = PrometheusReader(f"http://127.0.0.1:{free_port()}", timeout_seconds=1)
    signals, report = reader.read([target("x")])
    for role in ("prefill", "decode"):
        role_signals = signals[("ns", "x", role)]
        assert role_signals.ttft_seconds.kind is ReadingKind.UNAVAILABLE
        assert role_signals.requests_per_second.rate_or_zero() is None
    assert report.errors
