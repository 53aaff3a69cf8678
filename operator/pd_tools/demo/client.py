"""The client: its own process (so that its timing does not share a GIL) sends the load
through the router and sends back a record of each request."""

import asyncio
import contextlib
import multiprocessing
import queue
import signal
import time
from dataclasses import dataclass, replace
from typing import Any

from pd_tools.demo.load import Load
from pd_tools.workloads.http_load import REJECTED, LoadConfig, RequestRecord, quantile, replay
from pd_tools.workloads.traces import Request

REQUEST_TIMEOUT_S = 120.0
END_GRACE_S = 10.0  # after the load: how long requests in flight may finish
MAX_IN_FLIGHT = 256  # the client's bound; beyond it a request is rejected, never queued


@dataclass(frozen=True)
class Order:
    """What the client process is told once the endpoint is there."""

    url: str
    model: str
    start_wall: float  # time.time() of the load's start
    end_s: float  # no arrival after this many seconds


def _client(requests: list[Request], go: Any, records: Any) -> None:
    """The client process: waits for an `Order` on `go` (None: stop), then sends."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the demo stops it, after its own cleanup
    order = go.get()
    if order is not None:
        asyncio.run(_send_all(requests, order, records))


async def _send_all(requests: list[Request], order: Order, out: Any) -> None:
    """Open loop: each request at its arrival, as its own one-request `replay`, so that its
    record comes back the moment it is answered (times shifted to seconds since the start)."""
    loop = asyncio.get_running_loop()
    began = loop.time() + (order.start_wall - time.time())
    end_s = order.end_s
    in_flight: set[asyncio.Task[None]] = set()

    async def one(index: int, request: Request, sent_s: float) -> None:
        out.put(sent_s)  # the demo counts what is sent as it goes, not when it is answered
        config = LoadConfig(
            url=order.url,
            model=order.model,
            max_in_flight=1,
            timeout_s=REQUEST_TIMEOUT_S,
            deadline_s=max(end_s + END_GRACE_S - sent_s, 0.1),
        )
        (record,) = (await replay([replace(request, arrival_s=0.0)], config)).records
        record.index, record.arrival_s = index, request.arrival_s
        record.start_s = None if record.start_s is None else record.start_s + sent_s
        record.end_s = None if record.end_s is None else record.end_s + sent_s
        out.put(record)

    for index, request in enumerate(requests):
        if request.arrival_s >= end_s:
            break
        await asyncio.sleep(max(0.0, began + request.arrival_s - loop.time()))
        if len(in_flight) >= MAX_IN_FLIGHT:
            record = RequestRecord(
                index, request.arrival_s, request.input_tokens, request.output_tokens
            )
            record.fail(REJECTED, f"{MAX_IN_FLIGHT} requests already in flight")
            out.put(record)
            continue
        task = asyncio.create_task(one(index, request, loop.time() - began))
        in_flight.add(task)
        task.add_done_callback(in_flight.discard)
    if in_flight:
        await asyncio.wait(set(in_flight))  # each ends by its own deadline


class Client:
    """The client process and the records it has sent back so far."""

    def __init__(self, load: Load) -> None:
        context = multiprocessing.get_context("spawn")
        self._go: Any = context.Queue()
        self._records: Any = context.Queue()
        self.records: list[RequestRecord] = []
        self.sent: list[float] = []  # seconds since the start at which requests went out
        self.process = context.Process(
            target=_client,
            args=(load.requests, self._go, self._records),
            name="pd-demo-client",
            daemon=True,
        )

    def start(self) -> None:
        self.process.start()  # imports while the cluster comes up; sends only on `go`

    def go(self, order: Order) -> None:
        self._go.put(order)

    def collect(self) -> None:
        """Take what the client has sent back: send times and answered requests' records."""
        with contextlib.suppress(queue.Empty):
            while True:
                item = self._records.get_nowait()
                if isinstance(item, RequestRecord):
                    self.records.append(item)
                else:
                    self.sent.append(item)

    def finish(self, timeout_s: float) -> None:
        """Wait up to `timeout_s` for the client to end on its own, collecting as it goes."""
        deadline = time.monotonic() + timeout_s
        while self.process.is_alive() and time.monotonic() < deadline:
            self.collect()
            self.process.join(0.2)
        self.collect()

    def stop(self) -> None:
        """End the client now (its open connections close with it)."""
        if self.process.pid is None:
            return
        with contextlib.suppress(ValueError, OSError):
            self._go.put(None)  # still waiting for `go`: it returns
        self.process.join(1.0)
        if self.process.is_alive():
            self.process.terminate()
            self.process.join(5.0)
        if self.process.is_alive():
            self.process.kill()
            self.process.join(5.0)
        self.collect()
        for channel in (self._go, self._records):
            channel.close()
            channel.cancel_join_thread()


def client_window(
    records: list[RequestRecord], sent_s: list[float], t: float, window_s: float
) -> dict[str, float]:
    """What users saw over the last `window_s`: TTFT and ITL P50 (ms) of requests answered in
    it (every gap counts, as in the engines' histograms), requests sent and completed per s."""
    done = [
        r for r in records if r.reason is None and r.end_s is not None and t - window_s < r.end_s
    ]
    ttft = sorted(r.ttft_s for r in done if r.ttft_s is not None)
    itl = sorted(gap for r in done for gap in r.itl_s)
    sent = sum(1 for at in sent_s if t - window_s < at <= t)
    return {
        "ttft_ms": quantile(ttft, 0.5) * 1000,
        "itl_ms": quantile(itl, 0.5) * 1000,
        "sent_per_s": sent / window_s,
        "completed_per_s": len(done) / window_s,
    }
