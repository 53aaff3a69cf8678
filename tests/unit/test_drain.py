"""The preStop drain hook, run as the kubelet runs it, against engine-shaped /metrics."""

import os
import subprocess
import sys
import time

import pytest
from prometheus_client import CollectorRegistry, Gauge, start_http_server

from pd_operator.core.drain import KV_HANDOFF_SECONDS, SETTLE_SECONDS, drain_command
from pd_tools.localcluster.processes import free_port

# Keep the tests short: the settle wait is the only part that is the same for every engine.
SETTLE = 0.2


class Engine:
    """The request gauges of one replica, served the way the engine serves them."""

    def __init__(self, running: str, waiting: str) -> None:
        registry = CollectorRegistry()
        labels = ["model_name", "engine"]
        self.running = Gauge(running, "running", labels, registry=registry).labels("m", "0")
        self.waiting = Gauge(waiting, "waiting", labels, registry=registry).labels("m", "0")
        self.port = free_port()
        self.server, self.thread = start_http_server(self.port, addr="127.0.0.1", registry=registry)

    def close(self) -> None:
        self.server.shutdown()
        self.thread.join(timeout=5)


@pytest.fixture
def vllm():
    engine = Engine("vllm:num_requests_running", "vllm:num_requests_waiting")
    yield engine
    engine.close()


def start_hook(port: int, role="decode", limit=30, tail=None, engine="VLLM", env=None):
    """The hook's own command, pointed at `port`, with a short settle (and tail) wait."""
    python, flag, script, url, names, settle, kv_tail, seconds = drain_command(engine, role, limit)
    assert (python, flag) == ("python3", "-c") and settle == str(SETTLE_SECONDS)
    url = url.replace(url.split("/")[2], f"127.0.0.1:{port}")
    tail = kv_tail if tail is None else str(tail)
    argv = [sys.executable, "-c", script, url, names, str(SETTLE), tail, seconds]
    return subprocess.Popen(argv, env={**os.environ, **(env or {})}), time.monotonic()


def test_the_hook_holds_the_stop_while_requests_run_and_returns_once_idle(vllm):
    vllm.running.set(3)
    vllm.waiting.set(1)
    hook, started = start_hook(vllm.port)
    time.sleep(2.5)
    assert hook.poll() is None  # still serving: SIGTERM must wait
    vllm.waiting.set(0)
    time.sleep(1.5)
    assert hook.poll() is None  # three still running
    vllm.running.set(0)
    assert hook.wait(timeout=5) == 0
    assert time.monotonic() - started < 10  # well before its 30 s limit


def test_the_hook_gives_up_at_drain_seconds(vllm):
    vllm.running.set(1)  # a request longer than the drain
    hook, started = start_hook(vllm.port, limit=3)
    assert hook.wait(timeout=10) == 0
    assert 3 <= time.monotonic() - started < 6


def test_an_engine_that_no_longer_answers_ends_the_wait_at_once():
    hook, started = start_hook(free_port())
    assert hook.wait(timeout=10) == 0
    assert time.monotonic() - started < 3


def test_a_prefill_replica_keeps_its_kv_cache_a_while_after_its_last_request(vllm):
    assert drain_command("VLLM", "prefill", 60)[6] == str(KV_HANDOFF_SECONDS)
    assert drain_command("VLLM", "decode", 60)[6] == "0"
    hook, started = start_hook(vllm.port, role="prefill", tail=2)
    assert hook.wait(timeout=10) == 0
    assert time.monotonic() - started >= SETTLE + 2  # idle at once, then the hand-off wait


def test_the_engine_pods_proxy_settings_do_not_take_the_loopback_read(vllm):
    vllm.running.set(1)
    dead_proxy = f"http://127.0.0.1:{free_port()}"
    hook, _ = start_hook(vllm.port, env={"HTTP_PROXY": dead_proxy, "http_proxy": dead_proxy})
    time.sleep(2)
    assert hook.poll() is None  # read the engine, not the proxy
    vllm.running.set(0)
    assert hook.wait(timeout=5) == 0


@pytest.mark.parametrize(
    ("running", "waiting"),
    [
        ("sglang:num_running_reqs", "sglang:num_queue_reqs"),
        ("sglang_num_running_reqs", "sglang_num_queue_reqs"),  # some SGLang versions
    ],
)
def test_sglang_replicas_are_read_in_their_own_names(running, waiting):
    engine = Engine(running, waiting)
    try:
        engine.waiting.set(2)
        hook, _ = start_hook(engine.port, engine="SGLang")
        time.sleep(2)
        assert hook.poll() is None
        engine.waiting.set(0)
        assert hook.wait(timeout=5) == 0
    finally:
        engine.close()
