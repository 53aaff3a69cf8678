"""One simulated engine's scheduler in wall-clock time: the core that `http_engine.py` serves.

One asyncio task per engine (never one per request or token) runs vLLM-like steps whose
durations come from the performance model through `ReplicaSpec`: a prefill batch (FIFO, under the
token budget, never chunked) while prompts wait, otherwise one decode step in which every running
sequence gets one token. A request whose KV cache comes from a prefill engine skips the prefill:
its KV is reserved, transferred (prompt tokens x KV bytes per token / link bandwidth) and it joins
the decode batch at the next step boundary. The transfer starts once the prefill engine is done
with the prompt: at once when the request says so (vLLM's decode request carries the prefill's
answer), or when the server calls `kv_ready` (SGLang's decode learns it from the prefill engine's
bootstrap server). No HTTP here: a server awaits `LiveRequest` progress.

Time: steps follow an absolute schedule (each ends `duration` after the previous one's scheduled
end), so a busy host's late wake-ups do not add up; after idling, or when the host lags by more
than `MAX_LAG_S`, the schedule restarts at the current time. The histograms record the
schedule's times in model seconds, so they show the performance model, not the host's jitter.
"""

import asyncio
import logging
from collections import deque
from collections.abc import Callable
from enum import Enum, auto

from pd_tools.enginesim.engine import (
    DEFAULT_LINK_BYTES_PER_SECOND,
    MS_PER_SECOND,
    VLLM_BUCKETS,
    Histogram,
    LatencyBuckets,
    ReplicaSpec,
)

log = logging.getLogger(__name__)

# Beyond this lag behind its schedule the engine stops catching up (which would emit a burst of
# steps at once) and restarts the schedule from now.
MAX_LAG_S = 0.25


class OverloadedError(Exception):
    """The waiting queue is full: the request is refused before the engine holds anything."""


class State(Enum):
    QUEUED = auto()  # waiting for a prefill batch
    KV_WAIT = auto()  # its KV comes from a prefill engine; waiting for KV memory
    TRANSFER = auto()  # KV memory reserved; the transfer is on the wire (or awaits `kv_ready`)
    READY = auto()  # KV arrived; joins the decode batch at the next step with a free slot
    PREFILL = auto()  # in the prefill batch that runs now
    RUNNING = auto()  # in the decode batch
    DONE = auto()
    ABORTED = auto()


class LiveRequest:
    """One request inside the engine; the server waits on its progress."""

    __slots__ = (
        "arrival",
        "emitted",
        "id",
        "kv_need",
        "kv_ready",
        "last_token",
        "max_tokens",
        "prompt_tokens",
        "state",
        "waiter",
        "wake_at",
    )

    def __init__(
        self,
        seq_id: int,
        prompt_tokens: int,
        max_tokens: int,
        remote_kv: bool,
        arrival: float,
        *,
        kv_ready: bool = True,
    ) -> None:
        self.id = seq_id
        self.prompt_tokens = prompt_tokens
        self.max_tokens = max_tokens
        self.arrival = arrival  # wall clock (the event loop's time)
        self.emitted = 0
        self.last_token = arrival
        self.state = State.KV_WAIT if remote_kv else State.QUEUED
        # KV reserved for the whole answer at admission, so nothing is ever preempted.
        self.kv_need = prompt_tokens + max_tokens
        # For remote KV: the prefill engine is done with the prompt, so the transfer may start.
        self.kv_ready = kv_ready
        self.waiter: asyncio.Future[None] | None = None
        self.wake_at = 0

    @property
    def finished(self) -> bool:
        return self.state in (State.DONE, State.ABORTED)

    async def wait_for(self, tokens: int) -> int:
        """Tokens emitted so far, once there are at least `tokens` (or the sequence ended).

        A stream waits for its next token, a plain answer for its last: the step loop wakes
        each waiter only when it has something to do.
        """
        while self.emitted < tokens and not self.finished:
            self.wake_at = tokens
            self.waiter = asyncio.get_running_loop().create_future()
            await self.waiter
        return self.emitted

    def notify(self) -> None:
        waiter = self.waiter
        if waiter is not None and (self.emitted >= self.wake_at or self.finished):
            self.waiter = None
            if not waiter.done():
                waiter.set_result(None)


class EngineStats:
    """The counters and histograms an engine's /metrics shows (latencies in model seconds)."""

    def __init__(self, buckets: LatencyBuckets) -> None:
        self.prompt_tokens_local = 0  # computed here
        self.prompt_tokens_transferred = 0  # KV pulled from a prefill engine
        self.generation_tokens_total = 0
        self.requests_total = 0  # finished by max_tokens (aborts are not counted)
        self.ttft = Histogram(buckets.ttft_s)
        self.itl = Histogram(buckets.itl_s)
        self.e2e = Histogram(buckets.e2e_s)

    @property
    def prompt_tokens_total(self) -> int:
        return self.prompt_tokens_local + self.prompt_tokens_transferred


class LiveEngine:
    """A vLLM-like engine in wall-clock time: submit requests, await their tokens.

    `time_scale` multiplies every model duration into wall time (0.05: 20 times faster than
    the model); the histograms stay in model seconds. `max_waiting` bounds the requests held
    but not running; `spec.max_batch_sequences` (vLLM's --max-num-seqs) bounds those running.
    Create it in the event loop it is to run in.
    """

    def __init__(
        self,
        spec: ReplicaSpec,
        *,
        kv_bytes_per_token: int,
        max_waiting: int,
        time_scale: float = 1.0,
        link_bytes_per_second: float = DEFAULT_LINK_BYTES_PER_SECOND,
        buckets: LatencyBuckets = VLLM_BUCKETS,
    ) -> None:
        if time_scale <= 0 or max_waiting < 0 or link_bytes_per_second <= 0:
            raise ValueError("time scale and link rate must be positive, max_waiting >= 0")
        self.spec = spec
        self.time_scale = time_scale
        self.max_waiting = max_waiting
        self.stats = EngineStats(buckets)
        self._transfer_s_per_token = kv_bytes_per_token / link_bytes_per_second
        self._prefill_queue: deque[LiveRequest] = deque()
        self._kv_queue: deque[LiveRequest] = deque()
        self._ready: deque[LiveRequest] = deque()
        self._transfers: set[LiveRequest] = set()
        self._batch: list[LiveRequest] = []
        self._running: dict[int, LiveRequest] = {}
        self._context = 0  # tokens held by the decode batch (its step time grows with them)
        self._kv_reserved = 0
        self._next_id = 0
        self._schedule: float | None = None  # wall time the last step ended; None: idle
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._clock: Callable[[], float] = asyncio.get_running_loop().time

    # --- what /metrics shows ----------------------------------------------------------------

    @property
    def waiting(self) -> int:
        return (
            len(self._prefill_queue) + len(self._kv_queue) + len(self._transfers) + len(self._ready)
        )

    @property
    def running(self) -> int:
        return len(self._batch) + len(self._running)

    @property
    def kv_usage(self) -> float:
        return min(1.0, self._kv_reserved / self.spec.kv_capacity_tokens)

    # --- lifecycle --------------------------------------------------------------------------

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name="engine-steps")
        self._task.add_done_callback(self._stopped)

    def _stopped(self, task: "asyncio.Task[None]") -> None:
        # A step loop that died would leave every client waiting: say why and end them.
        if not task.cancelled() and task.exception() is not None:
            log.error("the engine's step loop failed", exc_info=task.exception())
            for seq in self._held():
                seq.state = State.ABORTED
                seq.notify()

    def _held(self) -> list[LiveRequest]:
        return [
            *self._prefill_queue, *self._kv_queue, *self._transfers, *self._ready,
            *self._batch, *self._running.values(),
        ]  # fmt: skip

    async def stop(self) -> None:
        """Abort what is held and stop stepping."""
        for seq in self._held():
            seq.state = State.ABORTED
            seq.notify()
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None

    def submit(
        self, prompt_tokens: int, max_tokens: int, *, remote_kv: bool, kv_ready: bool = True
    ) -> LiveRequest:
        """Queue a request; `remote_kv`: its KV cache is transferred from a prefill engine, once
        the prefill is done (`kv_ready`, or a later `kv_ready(seq)` call)."""
        if self.waiting >= self.max_waiting:
            raise OverloadedError(
                f"{self.waiting} requests are waiting (the most this engine holds)"
            )
        seq = LiveRequest(
            self._next_id, prompt_tokens, max_tokens, remote_kv, self._clock(), kv_ready=kv_ready
        )
        self._next_id += 1
        (self._kv_queue if remote_kv else self._prefill_queue).append(seq)
        self._wake.set()
        return seq

    def kv_ready(self, seq: LiveRequest) -> None:
        """The prefill engine is done with `seq`'s prompt: its KV transfer may start."""
        if seq.kv_ready or seq.finished:
            return
        seq.kv_ready = True
        if seq.state is State.TRANSFER:  # memory reserved already: the transfer starts now
            self._start_transfer(seq)

    def release(self, seq: LiveRequest) -> None:
        """The client is gone (or was answered): free whatever the sequence still holds."""
        state = seq.state
        if seq.finished:
            return
        seq.state = State.ABORTED
        if state is State.QUEUED:
            self._prefill_queue.remove(seq)
        elif state is State.KV_WAIT:
            self._kv_queue.remove(seq)
        elif state is State.READY:
            self._ready.remove(seq)
            self._kv_reserved -= seq.kv_need
        elif state is State.TRANSFER and not seq.kv_ready:
            # Still waiting for the prefill engine: it holds memory and no timer yet.
            self._transfers.discard(seq)
            self._kv_reserved -= seq.kv_need
        elif state is State.RUNNING:
            del self._running[seq.id]
            self._context -= seq.prompt_tokens + seq.emitted
            self._kv_reserved -= seq.kv_need
        # TRANSFER and PREFILL free their KV when the transfer or the batch ends.
        seq.notify()
        self._wake.set()  # freed memory may admit a waiting request

    # --- the step loop ----------------------------------------------------------------------

    async def _run(self) -> None:
        while True:
            self._admit_transfers()
            self._join_ready()
            batch = self._form_prefill_batch()
            if batch:
                prompts = [seq.prompt_tokens for seq in batch]
                # A batch starts no earlier than its last request arrived, even when catching up.
                latest = max(seq.arrival for seq in batch)
                end = await self._step(self.spec.prefill.batch_ms(prompts), latest)
                self._finish_prefill(end)
            elif self._running:
                end = await self._step(self.spec.decode.step_ms(len(self._running), self._context))
                self._finish_decode_step(end)
            else:
                self._schedule = None
                self._wake.clear()
                await self._wake.wait()

    async def _step(self, duration_ms: float, not_before: float = 0.0) -> float:
        """Wait out one step on the schedule; returns its scheduled end (wall seconds)."""
        now = self._clock()
        start = self._schedule
        if start is None or now - start > MAX_LAG_S:
            start = now
        start = max(start, not_before)
        end = start + duration_ms / MS_PER_SECOND * self.time_scale
        if end > now:
            await asyncio.sleep(end - now)
        self._schedule = end
        return end

    def _fits(self, need: int) -> bool:
        # A request larger than the whole cache still runs, alone, so nothing waits forever.
        return self._kv_reserved + need <= self.spec.kv_capacity_tokens or self._kv_reserved == 0

    def _admit_transfers(self) -> None:
        while self._kv_queue and self._fits(self._kv_queue[0].kv_need):
            seq = self._kv_queue.popleft()
            seq.state = State.TRANSFER
            self._kv_reserved += seq.kv_need
            self._transfers.add(seq)
            if seq.kv_ready:
                self._start_transfer(seq)

    def _start_transfer(self, seq: LiveRequest) -> None:
        delay = seq.prompt_tokens * self._transfer_s_per_token * self.time_scale
        asyncio.get_running_loop().call_later(delay, self._kv_arrived, seq)

    def _kv_arrived(self, seq: LiveRequest) -> None:
        self._transfers.discard(seq)
        if seq.state is State.ABORTED:
            self._kv_reserved -= seq.kv_need
            self._wake.set()
            return
        seq.state = State.READY
        self._ready.append(seq)
        self._wake.set()

    def _join_ready(self) -> None:
        limit = self.spec.max_batch_sequences
        while self._ready and len(self._running) < limit:
            seq = self._ready.popleft()
            seq.state = State.RUNNING
            self._running[seq.id] = seq
            self._context += seq.prompt_tokens

    def _form_prefill_batch(self) -> list[LiveRequest]:
        queue, batch = self._prefill_queue, self._batch
        budget = self.spec.max_batch_tokens
        slots = self.spec.max_batch_sequences - len(self._running)
        tokens = 0
        while queue and len(batch) < slots:
            seq = queue[0]
            if batch and tokens + seq.prompt_tokens > budget:
                break
            if not self._fits(seq.kv_need):
                break
            queue.popleft()
            seq.state = State.PREFILL
            self._kv_reserved += seq.kv_need
            tokens += seq.prompt_tokens
            batch.append(seq)
        return batch

    def _finish_prefill(self, end: float) -> None:
        stats, scale = self.stats, self.time_scale
        batch, self._batch = self._batch, []
        for seq in batch:
            if seq.state is State.ABORTED:
                self._kv_reserved -= seq.kv_need
                continue
            stats.prompt_tokens_local += seq.prompt_tokens
            stats.generation_tokens_total += 1
            stats.ttft.observe((end - seq.arrival) / scale)
            seq.emitted = 1
            seq.last_token = end
            if seq.max_tokens == 1:
                self._finish(seq, end)
            else:
                seq.state = State.RUNNING
                self._running[seq.id] = seq
                self._context += seq.prompt_tokens + 1
            seq.notify()

    def _finish_decode_step(self, end: float) -> None:
        stats, scale = self.stats, self.time_scale
        running = self._running
        # Gaps since each sequence's previous token, grouped: a batch mostly shares one.
        gaps: dict[float, int] = {}
        finished: list[LiveRequest] = []
        for seq in running.values():
            seq.emitted += 1
            if seq.emitted == 1:
                # A transferred request's first token comes from its first decode step.
                stats.prompt_tokens_transferred += seq.prompt_tokens
                stats.ttft.observe((end - seq.arrival) / scale)
            else:
                gap = end - seq.last_token
                gaps[gap] = gaps.get(gap, 0) + 1
            seq.last_token = end
            if seq.emitted >= seq.max_tokens:
                finished.append(seq)
            seq.notify()
        for gap, count in gaps.items():
            stats.itl.observe(gap / scale, count)
        stats.generation_tokens_total += len(running)
        self._context += len(running)
        for seq in finished:
            del running[seq.id]
            self._context -= seq.prompt_tokens + seq.emitted
            self._finish(seq, end)

    def _finish(self, seq: LiveRequest, end: float) -> None:
        seq.state = State.DONE
        self._kv_reserved -= seq.kv_need
        self.stats.requests_total += 1
        self.stats.e2e.observe((end - seq.arrival) / self.time_scale)
