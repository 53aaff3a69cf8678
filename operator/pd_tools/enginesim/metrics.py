"""Prometheus metrics of many simulated engine pods, served by one HTTP server.

Every pod is a path, `/pods/<namespace>/<pod>/metrics`, on one loopback port. Prometheus file
SD lists each pod as its own target group: the shared address, `__metrics_path__` set to the
pod's path, and the labels Kubernetes SD relabelling would give a real pod (`namespace`, `pod`,
and the `pdoperator.io/` labels as `deployment`, `role`, `pool`). The exposition carries only
what the engine itself would put there (metric names, `model_name`), in vLLM's or SGLang's
names (core/engine_metrics.py, the table the operator's reader reads too). The text is written
directly from the engine's counters: one registry per pod would be thousands of objects to keep
in step with the simulation.
"""

import asyncio
import re
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from operator import attrgetter
from types import TracebackType

from pd_operator.core import engine_metrics
from pd_operator.core.engine_metrics import EngineMetricNames
from pd_tools.enginesim.engine import (
    SGLANG_BUCKETS,
    VLLM_BUCKETS,
    Histogram,
    Instance,
    LatencyBuckets,
    PDEngine,
)

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
_PATH = re.compile(r"^/pods/([^/]+)/([^/]+)/metrics$")


@dataclass(frozen=True)
class Dialect:
    """How the simulator writes as one engine: its metric names, constant labels and bounds."""

    metrics: EngineMetricNames  # counters without `_total`
    constant_labels: tuple[tuple[str, str], ...]
    buckets: LatencyBuckets

    @property
    def name(self) -> str:
        return self.metrics.name


# vLLM v1 (vllm/v1/metrics/loggers.py): labels model_name and engine (the engine-core index).
VLLM = Dialect(engine_metrics.VLLM, constant_labels=(("engine", "0"),), buckets=VLLM_BUCKETS)
# SGLang (python/sglang/srt/metrics/collector.py): label model_name.
SGLANG = Dialect(engine_metrics.SGLANG, constant_labels=(), buckets=SGLANG_BUCKETS)
SGLANG_UNDERSCORE = replace(SGLANG, metrics=engine_metrics.SGLANG_UNDERSCORE)


@dataclass(frozen=True)
class SimPod:
    """A simulated pod: where it is, what it is, and the engine instance behind it."""

    namespace: str
    pod: str
    instance: str
    deployment: str
    role: str
    pool: str
    model_name: str

    @property
    def metrics_path(self) -> str:
        return f"/pods/{self.namespace}/{self.pod}/metrics"


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _number(value: float) -> str:
    if value == float("inf"):
        return "+Inf"
    return repr(float(value))


@dataclass(frozen=True)
class _HistogramLines:
    header: str
    buckets: tuple[str, ...]
    sum: str
    count: str

    def render(self, histogram: Histogram, scale: float) -> str:
        counter = _counter_text(scale)
        lines = [self.header]
        lines += [
            f"{line}{counter(n)}\n"
            for line, n in zip(self.buckets, histogram.cumulative(), strict=True)
        ]
        lines.append(
            f"{self.sum}{histogram.sum * scale!r}\n{self.count}{counter(histogram.count)}\n"
        )
        return "".join(lines)


def _counter_text(scale: float) -> Callable[[float], str]:
    """How a counter's value is written: as it is, or scaled (see EngineMetricsServer)."""
    return str if scale == 1.0 else lambda value: repr(value * scale)


class _Template:
    """The fixed parts of one pod's exposition, built once per pod."""

    def __init__(self, dialect: Dialect, pod: SimPod) -> None:
        pairs = [("model_name", pod.model_name), *dialect.constant_labels]
        labels = ",".join(f'{k}="{_escape(v)}"' for k, v in pairs)

        def histogram(name: str, bounds: tuple[float, ...], help_text: str) -> _HistogramLines:
            les = [*(_number(b) for b in bounds), "+Inf"]
            return _HistogramLines(
                f"# HELP {name} {help_text}\n# TYPE {name} histogram\n",
                tuple(f'{name}_bucket{{{labels},le="{le}"}} ' for le in les),
                f"{name}_sum{{{labels}}} ",
                f"{name}_count{{{labels}}} ",
            )

        def scalar(name: str, kind: str, help_text: str) -> str:
            sample = f"{name}_total" if kind == "counter" else name
            return f"# HELP {name} {help_text}\n# TYPE {name} {kind}\n{sample}{{{labels}}} "

        names, buckets = dialect.metrics, dialect.buckets
        # (name, kind, help, the instance's value); a name of None is a metric the engine lacks.
        scalars = (
            (names.waiting, "gauge", "Requests waiting.", "waiting"),
            (names.running, "gauge", "Requests running.", "running"),
            (names.kv_usage, "gauge", "KV-cache usage, 1 is full.", "kv_usage"),
            (names.prompt_tokens, "counter", "Prompt tokens processed.", "prompt_tokens_total"),
            (names.generation_tokens, "counter", "Tokens generated.", "generation_tokens_total"),
            (names.cache_hit_tokens, "counter", "Prompt tokens found cached.",
             "prefix_cache_hits_total"),
            (names.cache_query_tokens, "counter", "Prompt tokens looked up.",
             "prefix_cache_queries_total"),
        )  # fmt: skip
        self.scalars = tuple(
            (scalar(name, kind, help_text), attrgetter(value), kind == "counter")
            for name, kind, help_text, value in scalars
            if name
        )
        histograms = (
            (names.ttft_histogram, buckets.ttft_s, "Time to first token in seconds.", "ttft"),
            (names.itl_histogram, buckets.itl_s, "Inter-token latency in seconds.", "itl"),
            (names.e2e_histogram, buckets.e2e_s, "End-to-end request latency.", "e2e"),
            (names.queue_time_histogram, buckets.e2e_s, "Time waiting for prefill.", "queue_time"),
            (names.prefill_time_histogram, buckets.e2e_s, "Time in prefill.", "prefill_time"),
            (names.kv_transfer_histogram, buckets.kv_transfer_s, "KV transfer time.",
             "kv_transfer"),
        )  # fmt: skip
        # The simulator's histograms are in seconds: a histogram in milliseconds (SGLang's KV
        # transfer latency) is not written.
        self.histograms = tuple(
            (histogram(name, bounds, help_text), attrgetter(value))
            for name, bounds, help_text, value in histograms
            if name and not name.endswith("_ms")
        )

    def render(self, instance: Instance, counter_scale: float) -> str:
        scaled = _counter_text(counter_scale)
        out = [
            f"{line}{(scaled if counter else str)(value(instance))}\n"
            for line, value, counter in self.scalars
        ]
        out += [lines.render(value(instance), counter_scale) for lines, value in self.histograms]
        return "".join(out)


class EngineMetricsServer:
    """Serves each registered pod's metrics from the engine, read under `lock`.

    A minimal asyncio HTTP/1.1 server on its own thread: http.server's per-request overhead
    (~0.5 ms) alone would exceed the scrape budget for a thousand pods.

    `counter_scale` multiplies every counter (histogram buckets, sums and counts included) when
    the engine runs faster than the wall clock that Prometheus rates by: at wall seconds per
    simulated second, rates come out per simulated second (tokens/s a replica really serves,
    what the profile seeds are in) and means and quantiles are unchanged.
    """

    def __init__(
        self,
        engine: PDEngine,
        lock: threading.Lock,
        *,
        dialect: Dialect = VLLM,
        host: str = "127.0.0.1",
        port: int = 0,
        counter_scale: float = 1.0,
    ) -> None:
        if dialect.buckets != engine.buckets:
            raise ValueError(f"the engine's histogram bounds are not {dialect.name}'s")
        if counter_scale <= 0:
            raise ValueError(f"counter_scale must be positive, got {counter_scale}")
        self.engine = engine
        self.counter_scale = counter_scale
        self.lock = lock
        self.dialect = dialect
        self._pods: dict[tuple[str, str], tuple[SimPod, _Template]] = {}
        self._socket = socket.create_server((host, port))
        self._loop: asyncio.AbstractEventLoop | None = None
        self._connections: set[asyncio.Transport] = set()
        self._thread: threading.Thread | None = None

    @property
    def address(self) -> str:
        """`host:port` to scrape."""
        host, port = self._socket.getsockname()[:2]
        return f"{host}:{port}"

    def __enter__(self) -> "EngineMetricsServer":
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def start(self) -> None:
        """Serve in a background thread."""
        loop = asyncio.new_event_loop()
        server = loop.run_until_complete(
            loop.create_server(lambda: _Connection(self), sock=self._socket)
        )
        self._loop = loop

        def run() -> None:
            loop.run_forever()
            server.close()
            # Scrapers keep their connections open: close them before the loop closes.
            for transport in list(self._connections):
                transport.close()
            loop.run_until_complete(asyncio.sleep(0))
            loop.close()

        self._thread = threading.Thread(target=run, name="engine-metrics", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        if self._loop and self._thread:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join()
        self._loop = self._thread = None
        self._socket.close()

    def add_pod(self, pod: SimPod) -> None:
        """Serve `pod`'s metrics (its engine instance must exist)."""
        self.engine.instance(pod.instance)
        self._pods[(pod.namespace, pod.pod)] = (pod, _Template(self.dialect, pod))

    def remove_pod(self, namespace: str, pod: str) -> None:
        self._pods.pop((namespace, pod), None)

    def target_labels(self, namespace: str, pod: str) -> dict[str, str]:
        """File-SD labels of one pod, its metrics path included."""
        sim_pod = self._pods[(namespace, pod)][0]
        return {
            "__metrics_path__": sim_pod.metrics_path,
            "namespace": sim_pod.namespace,
            "pod": sim_pod.pod,
            "deployment": sim_pod.deployment,
            "role": sim_pod.role,
            "pool": sim_pod.pool,
        }

    def file_sd_groups(self) -> list[dict[str, object]]:
        """Every pod as a file-SD target group (one file can list them all)."""
        return [
            {"targets": [self.address], "labels": self.target_labels(namespace, pod)}
            for namespace, pod in self._pods
        ]

    def render(self, namespace: str, pod: str) -> str | None:
        """One pod's exposition text; None for an unknown pod."""
        entry = self._pods.get((namespace, pod))
        if entry is None:
            return None
        sim_pod, template = entry
        with self.lock:
            return template.render(self.engine.instance(sim_pod.instance), self.counter_scale)

    def _respond(self, head: bytes) -> bytes:
        request_line = head.split(b"\r\n", 1)[0].decode("latin-1").split(" ")
        text = None
        if len(request_line) == 3 and request_line[0] == "GET":
            match = _PATH.match(request_line[1].split("?", 1)[0])
            text = self.render(match.group(1), match.group(2)) if match else None
        if text is None:
            return b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n"
        body = text.encode()
        return (
            f"HTTP/1.1 200 OK\r\nContent-Type: {CONTENT_TYPE}\r\n"
            f"Content-Length: {len(body)}\r\n\r\n"
        ).encode() + body


class _Connection(asyncio.Protocol):
    """One scraper's keep-alive connection: GET requests without bodies, answered in order."""

    MAX_HEAD_BYTES = 65536

    def __init__(self, server: EngineMetricsServer) -> None:
        self.server = server
        self.buffer = b""
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        self.server._connections.add(transport)

    def connection_lost(self, exc: Exception | None) -> None:
        if self.transport:
            self.server._connections.discard(self.transport)

    def data_received(self, data: bytes) -> None:
        assert self.transport is not None
        self.buffer += data
        while (end := self.buffer.find(b"\r\n\r\n")) >= 0:
            head, self.buffer = self.buffer[:end], self.buffer[end + 4 :]
            self.transport.write(self.server._respond(head))
            if b"connection: close" in head.lower():
                self.transport.close()
                return
        if len(self.buffer) > self.MAX_HEAD_BYTES:
            self.transport.close()


class LiveDriver:
    """Advances an engine with the wall clock, `speed` simulated seconds per second."""

    def __init__(
        self, engine: PDEngine, lock: threading.Lock, *, speed: float = 1.0, tick_s: float = 0.05
    ) -> None:
        if speed <= 0 or tick_s <= 0:
            raise ValueError("speed and tick must be positive")
        self.engine = engine
        self.lock = lock
        self.speed = speed
        self.tick_s = tick_s
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._start_monotonic = 0.0
        self._start_unix = 0.0
        self._start_sim = 0.0

    def sim_time_at(self, unix_s: float) -> float:
        """Simulated time the engine reaches at wall-clock time `unix_s`."""
        return self._start_sim + (unix_s - self._start_unix) * self.speed

    def start(self) -> None:
        self._start_sim = self.engine.now_s
        self._start_monotonic = time.monotonic()
        self._start_unix = time.time()
        self._thread = threading.Thread(target=self._loop, name="engine-clock", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread:
            self._thread.join()
            self._thread = None

    def _loop(self) -> None:
        while not self._stop.wait(self.tick_s):
            elapsed = time.monotonic() - self._start_monotonic
            with self.lock:
                self.engine.advance_to(self._start_sim + elapsed * self.speed)
