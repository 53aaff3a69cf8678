"""Discrete-event simulation of one disaggregated prefill/decode deployment.

Pure: no clock, no I/O, no randomness. Requests flow router -> prefill instance (FIFO queue,
batches under a token budget, per-instance prefix cache) -> decode instance (KV reserved, then
transferred) -> continuous-batching decode -> done. Times come from `core.perfmodel`.

Decode is simulated per *batch change*, not per step: between two joins or leaves a batch of B
sequences takes steps whose times form an arithmetic progression (each step adds B tokens of
context), so the time, the token counts and the inter-token-latency histograms of any number of
steps have closed forms. That keeps an hour of a busy trace to seconds of wall time. The event
model and its assumptions are in docs/engine-simulator.md.
"""

import heapq
import itertools
import math
from abc import ABC, abstractmethod
from bisect import bisect_left
from collections import OrderedDict, deque
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, replace
from enum import StrEnum
from typing import Literal, TypeVar

from pd_operator.core.engine_metrics import SGLANG_BOUNDS, VLLM_BOUNDS
from pd_operator.core.hardware import HardwareProfile, ModelProfile
from pd_operator.core.perfmodel import (
    DecodeCoefficients,
    PrefillCoefficients,
    kv_bytes_per_token,
    kv_capacity_tokens,
    model_load_seconds,
)
from pd_tools.workloads.traces import MOONCAKE_BLOCK_TOKENS, Request

MS_PER_SECOND = 1000.0
# vLLM's serving defaults on cards with >= 70 GiB (vllm/engine/arg_utils.py,
# EngineArgs.get_batch_defaults): max_num_batched_tokens 8192 new tokens per step and
# max_num_seqs 1024 sequences at once.
DEFAULT_MAX_BATCH_TOKENS = 8192
DEFAULT_MAX_BATCH_SEQUENCES = 1024
# Prefill-to-decode KV link. Assumption: Mooncake measured 87-190 GB/s per 8-GPU node
# (CONTEXT.md); 100 GB/s sits at the low end, which a deployment reaches without tuning.
DEFAULT_LINK_BYTES_PER_SECOND = 100e9
# How the router picks a prefill instance. "prefix-aware": the least outstanding prompt tokens
# once the request's prefix cached there is taken off its own work, as the cache-aware routers
# do (llm-d's prefix-cache scorer, Dynamo's KV router, Mooncake's Conductor): a request goes
# where its prefix is cached unless the queue there costs more than recomputing it elsewhere.
# "least-loaded": the least outstanding prompt tokens, blind to the caches.
Routing = Literal["prefix-aware", "least-loaded"]
ROUTINGS: tuple[Routing, ...] = ("prefix-aware", "least-loaded")


class Role(StrEnum):
    PREFILL = "prefill"
    DECODE = "decode"


class State(StrEnum):
    LOADING = "Loading"  # started, weights loading: not routable
    READY = "Ready"  # routable
    DRAINING = "Draining"  # removed: finishes what it holds, takes nothing new
    GONE = "Gone"  # drained


@dataclass(frozen=True)
class LatencyBuckets:
    """Upper bounds (seconds) of the per-instance latency histograms an engine exposes."""

    ttft_s: tuple[float, ...]
    itl_s: tuple[float, ...]
    e2e_s: tuple[float, ...]
    # The KV connector's transfer time (vLLM's NIXL buckets for both engines).
    kv_transfer_s: tuple[float, ...] = VLLM_BOUNDS.kv_transfer

    def __post_init__(self) -> None:
        for bounds in (self.ttft_s, self.itl_s, self.e2e_s, self.kv_transfer_s):
            if not bounds or any(b >= c for b, c in itertools.pairwise(bounds)):
                raise ValueError("bucket bounds must be non-empty and strictly increasing")

    def with_latency(
        self, ttft_s: tuple[float, ...] | None, itl_s: tuple[float, ...] | None
    ) -> "LatencyBuckets":
        """These bounds with the TTFT and ITL ones replaced where given (SGLang's --bucket-*
        flags); empty or None keeps them."""
        return replace(self, ttft_s=ttft_s or self.ttft_s, itl_s=itl_s or self.itl_s)


VLLM_BUCKETS = LatencyBuckets(VLLM_BOUNDS.ttft, VLLM_BOUNDS.itl, VLLM_BOUNDS.e2e)
SGLANG_BUCKETS = LatencyBuckets(SGLANG_BOUNDS.ttft, SGLANG_BOUNDS.itl, SGLANG_BOUNDS.e2e)


def _count_progression_le(first: float, step: float, n: int, bound: float) -> int:
    """How many of `first + step*j`, j = 0..n-1 (step >= 0), are <= `bound`."""
    if first > bound:
        return 0
    if step <= 0:
        return n
    return min(n, math.floor((bound - first) / step) + 1)


class Histogram:
    """A Prometheus-style histogram: counts per bucket (last one +Inf), sum and count."""

    __slots__ = ("bounds", "count", "counts", "sum")

    def __init__(self, bounds: Sequence[float]) -> None:
        self.bounds = tuple(bounds)
        self.counts = [0] * (len(self.bounds) + 1)
        self.sum = 0.0
        self.count = 0

    def observe(self, value: float, weight: int = 1) -> None:
        self.counts[bisect_left(self.bounds, value)] += weight
        self.sum += value * weight
        self.count += weight

    def observe_progression(self, first: float, step: float, n: int, weight: int) -> None:
        """Observe `first + step*j` for j = 0..n-1, each `weight` times."""
        if n <= 0 or weight <= 0:
            return
        low = bisect_left(self.bounds, first)
        high = bisect_left(self.bounds, first + step * (n - 1))
        if low == high:
            self.counts[low] += n * weight
        else:
            below = 0
            for index in range(low, high):
                at_most = _count_progression_le(first, step, n, self.bounds[index])
                self.counts[index] += (at_most - below) * weight
                below = at_most
            self.counts[high] += (n - below) * weight
        self.sum += (n * first + step * n * (n - 1) / 2) * weight
        self.count += n * weight

    def cumulative(self) -> list[int]:
        """Counts of observations <= each bound, then the total (the +Inf bucket)."""
        total = 0
        out = []
        for count in self.counts:
            total += count
            out.append(total)
        return out


class LogHistogram:
    """Observations in bins 1% wide (log scale): quantiles within 0.5% at any count."""

    RATIO = 1.01
    SMALLEST = 1e-6

    __slots__ = ("bins", "count", "sum")

    def __init__(self) -> None:
        self.bins: dict[int, int] = {}
        self.count = 0
        self.sum = 0.0

    @classmethod
    def _index(cls, value: float) -> int:
        if value <= cls.SMALLEST:
            return 0
        return math.floor(math.log(value / cls.SMALLEST) / math.log(cls.RATIO))

    @classmethod
    def _upper(cls, index: int) -> float:
        return cls.SMALLEST * cls.RATIO ** (index + 1)

    def observe(self, value: float, weight: int = 1) -> None:
        index = self._index(value)
        self.bins[index] = self.bins.get(index, 0) + weight
        self.count += weight
        self.sum += value * weight

    def observe_progression(self, first: float, step: float, n: int, weight: int) -> None:
        """Observe `first + step*j` for j = 0..n-1, each `weight` times."""
        if n <= 0 or weight <= 0:
            return
        low, high = self._index(first), self._index(first + step * (n - 1))
        below = 0
        for index in range(low, high):
            at_most = _count_progression_le(first, step, n, self._upper(index))
            if at_most > below:
                self.bins[index] = self.bins.get(index, 0) + (at_most - below) * weight
            below = at_most
        self.bins[high] = self.bins.get(high, 0) + (n - below) * weight
        self.count += n * weight
        self.sum += (n * first + step * n * (n - 1) / 2) * weight

    @property
    def mean(self) -> float:
        return self.sum / self.count if self.count else math.nan

    def quantile(self, q: float) -> float:
        """The q-quantile (bin's geometric middle); NaN when empty."""
        if not 0 <= q <= 1:
            raise ValueError(f"quantile must lie in [0, 1], got {q}")
        if not self.count:
            return math.nan
        rank = q * self.count
        seen = 0
        for index in sorted(self.bins):
            seen += self.bins[index]
            if seen >= rank:
                return self._upper(index) / math.sqrt(self.RATIO)
        return self._upper(max(self.bins)) / math.sqrt(self.RATIO)

    def fraction_at_most(self, value: float) -> float:
        """Share of observations <= `value` (to the bin)."""
        if not self.count:
            return math.nan
        top = self._index(value)
        return sum(c for i, c in self.bins.items() if i <= top) / self.count


@dataclass(frozen=True)
class ReplicaSpec:
    """What one replica (one engine instance) can do, in either role."""

    prefill: PrefillCoefficients
    decode: DecodeCoefficients
    kv_capacity_tokens: int
    load_seconds: float
    max_batch_tokens: int = DEFAULT_MAX_BATCH_TOKENS
    max_batch_sequences: int = DEFAULT_MAX_BATCH_SEQUENCES

    def __post_init__(self) -> None:
        if self.kv_capacity_tokens < 1:
            raise ValueError("the replica holds no KV cache (do the weights fit?)")
        if self.prefill.batch_ms([1]) <= 0 or self.decode.step_ms(1, 1) <= 0:
            raise ValueError("prefill and decode must take time")
        if self.load_seconds < 0 or self.max_batch_tokens < 1 or self.max_batch_sequences < 1:
            raise ValueError(f"invalid replica limits: {self}")

    @classmethod
    def from_profiles(
        cls,
        hardware: HardwareProfile,
        model: ModelProfile,
        cards: int,
        *,
        max_batch_tokens: int = DEFAULT_MAX_BATCH_TOKENS,
        max_batch_sequences: int = DEFAULT_MAX_BATCH_SEQUENCES,
    ) -> "ReplicaSpec":
        """A replica of `cards` cards from the performance model."""
        return cls(
            prefill=PrefillCoefficients.from_profiles(hardware, model, cards),
            decode=DecodeCoefficients.from_profiles(hardware, model, cards),
            kv_capacity_tokens=kv_capacity_tokens(hardware, model, cards),
            load_seconds=model_load_seconds(hardware, model, cards),
            max_batch_tokens=max_batch_tokens,
            max_batch_sequences=max_batch_sequences,
        )


class _Req:
    __slots__ = (
        "arrival_s",
        "cached_hint",
        "cached_tokens",
        "decode",
        "decode_start_s",
        "finish_s",
        "first_token_s",
        "hash_ids",
        "id",
        "input_tokens",
        "output_tokens",
        "prefill",
        "prefill_end_s",
        "prefill_start_s",
    )

    def __init__(self, request_id: int, request: Request) -> None:
        self.id = request_id
        self.arrival_s = request.arrival_s
        self.input_tokens = request.input_tokens
        self.output_tokens = request.output_tokens
        self.cached_hint = request.cached_tokens
        self.hash_ids = request.hash_ids
        self.cached_tokens = 0
        self.prefill: Instance | None = None
        self.decode: Instance | None = None
        self.prefill_start_s = math.nan
        self.prefill_end_s = math.nan
        self.first_token_s = math.nan
        self.decode_start_s = math.nan
        self.finish_s = math.nan


@dataclass(frozen=True, slots=True)
class RequestRecord:
    """What happened to one finished request (times in simulated seconds)."""

    id: int
    arrival_s: float
    input_tokens: int
    output_tokens: int
    cached_tokens: int
    prefill_instance: str
    decode_instance: str | None  # None when the prefill's first token was the only one
    prefill_start_s: float
    prefill_end_s: float
    first_token_s: float
    finish_s: float
    # When it joined the running decode batch (the step boundary after its KV arrived); NaN
    # for a one-token answer. vLLM's P/D decode emits the first token from that step, so the
    # wait for the step in progress is part of its TTFT there, not of an inter-token gap.
    decode_start_s: float = math.nan

    @property
    def ttft_s(self) -> float:
        return self.first_token_s - self.arrival_s

    @property
    def e2e_s(self) -> float:
        return self.finish_s - self.arrival_s

    @property
    def itl_mean_s(self) -> float:
        """Mean gap between output tokens (TPOT); NaN for a one-token answer."""
        if self.output_tokens < 2:
            return math.nan
        return (self.finish_s - self.first_token_s) / (self.output_tokens - 1)


class Instance(ABC):
    """One engine instance: its state and the counters its /metrics would show."""

    def __init__(
        self, name: str, role: Role, spec: ReplicaSpec, ready_at_s: float, buckets: LatencyBuckets
    ) -> None:
        self.name = name
        self.role = role
        self.spec = spec
        self.ready_at_s = ready_at_s
        self.state = State.LOADING
        self.prompt_tokens_total = 0
        self.generation_tokens_total = 0
        self.prefix_cache_queries_total = 0  # prompt tokens looked up
        self.prefix_cache_hits_total = 0  # of which found in the cache
        self.requests_total = 0  # requests that finished here
        self.ttft = Histogram(buckets.ttft_s)
        self.itl = Histogram(buckets.itl_s)
        self.e2e = Histogram(buckets.e2e_s)
        # Prefill: a request's wait for its batch and the batch's time (vLLM's request queue
        # and prefill time, on the e2e bounds as there); decode: each KV transfer it received.
        self.queue_time = Histogram(buckets.e2e_s)
        self.prefill_time = Histogram(buckets.e2e_s)
        self.kv_transfer = Histogram(buckets.kv_transfer_s)

    @property
    @abstractmethod
    def waiting(self) -> int:
        """Requests held but not running (queued, or waiting for KV memory or transfer)."""

    @property
    @abstractmethod
    def running(self) -> int:
        """Requests in the batch that runs now."""

    @property
    @abstractmethod
    def kv_usage(self) -> float:
        """Share of the KV cache held by requests (0..1)."""

    @property
    def idle(self) -> bool:
        return self.waiting == 0 and self.running == 0

    def in_flight(self) -> list[tuple["_Req", int]]:
        """The requests running here now, each with the tokens of its work still ahead here
        (prompt tokens on prefill, output tokens to come on decode): what a replica removed now
        would hold on to, or cut when its drain runs out."""
        return []

    def done_with(self, req: "_Req") -> float:
        """When a request running here ends its work here (NaN: not yet)."""
        return req.finish_s


class _Prefill(Instance):
    def __init__(
        self, name: str, spec: ReplicaSpec, ready_at_s: float, buckets: LatencyBuckets
    ) -> None:
        super().__init__(name, Role.PREFILL, spec, ready_at_s, buckets)
        self.queue: deque[_Req] = deque()
        self.batch: list[_Req] = []
        self.queued_tokens = 0
        self.batch_tokens = 0
        self.cache: OrderedDict[int, None] = OrderedDict()

    @property
    def waiting(self) -> int:
        return len(self.queue)

    @property
    def running(self) -> int:
        return len(self.batch)

    def done_with(self, req: "_Req") -> float:
        return req.prefill_end_s  # then its KV cache is handed off to decode

    def in_flight(self) -> list[tuple["_Req", int]]:
        return [(req, req.input_tokens) for req in self.batch]  # prompt tokens being prefilled

    @property
    def kv_usage(self) -> float:
        return min(1.0, self.batch_tokens / self.spec.kv_capacity_tokens)

    @property
    def load(self) -> int:
        return self.queued_tokens + self.batch_tokens


class _Decode(Instance):
    def __init__(
        self, name: str, spec: ReplicaSpec, ready_at_s: float, buckets: LatencyBuckets
    ) -> None:
        super().__init__(name, Role.DECODE, spec, ready_at_s, buckets)
        self.fixed_ms = spec.decode.fixed_ms  # the step's cost that does not grow with context
        self.b_ms = spec.decode.b_ms_per_context_token
        self.admission: deque[_Req] = deque()  # routed here, waiting for KV memory
        self.queued_need = 0
        self.transferring = 0
        self.joiners: list[_Req] = []  # KV arrived, join at the next step boundary
        self.inflight_kv = 0  # KV tokens of transferring and joining requests
        self.reserved = 0  # KV tokens promised to admitted requests (prompt + output)
        # Running batch: finish heap of (finish step, id, request).
        self.finishes: list[tuple[int, int, _Req]] = []
        self.context_offset = 0  # sum of (context at join - step at join) over the batch
        self.steps = 0  # steps taken since start
        self.t0_s = 0.0  # time of step boundary `steps`
        self.alpha_ms = 0.0  # duration of the next step
        self.target_step = 0  # step boundary the pending event lands on
        self.version = 0  # invalidates superseded boundary events

    @property
    def batch(self) -> int:
        return len(self.finishes)

    @property
    def waiting(self) -> int:
        return len(self.admission) + self.transferring + len(self.joiners)

    @property
    def running(self) -> int:
        return len(self.finishes)

    def in_flight(self) -> list[tuple["_Req", int]]:
        return [(req, max(0, step - self.steps)) for step, _, req in self.finishes]

    @property
    def kv_usage(self) -> float:
        held = self.context_offset + self.batch * self.steps + self.inflight_kv
        return min(1.0, held / self.spec.kv_capacity_tokens)

    @property
    def load(self) -> float:
        return (self.reserved + self.queued_need) / self.spec.kv_capacity_tokens

    def steps_ms(self, n: int) -> float:
        """Duration of the next n steps of the current batch."""
        beta = self.b_ms * self.batch
        return n * self.alpha_ms + beta * n * (n - 1) / 2

    def steps_done_by(self, elapsed_ms: float) -> int:
        """Whole steps of the current batch finished `elapsed_ms` after `t0_s`."""
        if elapsed_ms <= 0:
            return 0
        beta = self.b_ms * self.batch
        if beta == 0:
            n = math.floor(elapsed_ms / self.alpha_ms)
        else:
            linear = self.alpha_ms - beta / 2
            n = math.floor((-linear + math.sqrt(linear * linear + 2 * beta * elapsed_ms)) / beta)
        # The closed form can be off by one in floating point.
        while n > 0 and self.steps_ms(n) > elapsed_ms:
            n -= 1
        while self.steps_ms(n + 1) <= elapsed_ms:
            n += 1
        return n


_I = TypeVar("_I", bound=Instance)

_ARRIVAL, _PREFILL_DONE, _TRANSFER_DONE, _DECODE_BOUNDARY, _READY = range(5)


@dataclass(frozen=True)
class SimulationResult:
    """Finished requests, every output token's inter-token latency, the instances' counters."""

    records: list[RequestRecord]
    token_itl_s: LogHistogram
    instances: list[Instance]
    unfinished: int
    end_s: float


class PDEngine:
    """The event-driven simulation. Feed requests, add instances, then `run` or `advance_to`."""

    def __init__(
        self,
        requests: Iterable[Request] = (),
        *,
        model: ModelProfile,
        link_bytes_per_second: float = DEFAULT_LINK_BYTES_PER_SECOND,
        buckets: LatencyBuckets = VLLM_BUCKETS,
        prefix_block_tokens: int = MOONCAKE_BLOCK_TOKENS,
        routing: Routing = "prefix-aware",
    ) -> None:
        if link_bytes_per_second <= 0 or prefix_block_tokens < 1:
            raise ValueError("link bandwidth and prefix block size must be positive")
        if routing not in ROUTINGS:
            raise ValueError(f"routing {routing!r}: choose one of {', '.join(ROUTINGS)}")
        self.buckets = buckets
        self.routing = routing
        self.prefix_block_tokens = prefix_block_tokens
        self._transfer_s_per_token = kv_bytes_per_token(model) / link_bytes_per_second
        self._source: Iterator[Request] = iter(requests)
        self._source_done = False
        self._last_arrival_s = 0.0
        self._events: list[tuple[float, int, int, object, int]] = []
        self._seq = 0
        self._now = 0.0
        self._next_id = 0
        self._instances: dict[str, Instance] = {}
        self._prefills: list[_Prefill] = []  # ready
        self._decodes: list[_Decode] = []  # ready
        self._pending_prefill: deque[_Req] = deque()  # no prefill instance ready
        self._pending_decode: deque[_Req] = deque()  # no decode instance ready
        self._active = 0
        self._turn = 0  # round-robin offset for routing ties
        self._finished: list[RequestRecord] = []
        self.token_itl_s = LogHistogram()
        self._pull_arrival()

    # --- public API -------------------------------------------------------------------------

    @property
    def now_s(self) -> float:
        return self._now

    @property
    def active_requests(self) -> int:
        """Requests arrived and not finished."""
        return self._active

    @property
    def done(self) -> bool:
        """No request left to arrive or to finish."""
        return not self._events and self._active == 0

    @property
    def pending_requests(self) -> int:
        """Requests waiting at the router because no instance of their role is ready."""
        return len(self._pending_prefill) + len(self._pending_decode)

    def instance(self, name: str) -> Instance:
        """An instance by name (also after it is gone, so its counters stay readable)."""
        return self._instances[name]

    def instances(self) -> list[Instance]:
        """Every instance ever added, in order."""
        return list(self._instances.values())

    def add_instance(
        self, name: str, role: Role, spec: ReplicaSpec, *, ready_after_s: float | None = None
    ) -> Instance:
        """Start an instance; it takes requests from now + `ready_after_s` (default: its load
        time)."""
        if name in self._instances:
            raise ValueError(f"instance {name!r} exists")
        delay = spec.load_seconds if ready_after_s is None else ready_after_s
        if delay < 0:
            raise ValueError("the ready delay must not be negative")
        cls = _Prefill if role is Role.PREFILL else _Decode
        instance = cls(name, spec, self._now + delay, self.buckets)
        self._instances[name] = instance
        self._push(instance.ready_at_s, _READY, instance)
        return instance

    def remove_instance(self, name: str) -> None:
        """Stop routing to an instance; it finishes what runs and gives back what waits."""
        instance = self._instances[name]
        if instance.state in (State.DRAINING, State.GONE):
            return
        was_ready = instance.state is State.READY
        instance.state = State.DRAINING
        if isinstance(instance, _Prefill):
            if was_ready:
                self._prefills.remove(instance)
            requeue = list(instance.queue)
            instance.queue.clear()
            instance.queued_tokens = 0
            for req in requeue:
                self._route_prefill(req)
        elif isinstance(instance, _Decode):
            if was_ready:
                self._decodes.remove(instance)
            requeue = list(instance.admission)
            instance.admission.clear()
            instance.queued_need = 0
            for req in requeue:
                self._route_decode(req)
        self._retire_if_drained(instance)

    def submit(self, request: Request) -> None:
        """Add one request (arriving now or later) besides those from the constructor."""
        if request.arrival_s < self._now:
            raise ValueError(f"request arrives at {request.arrival_s} s, before now {self._now} s")
        self._push(request.arrival_s, _ARRIVAL, _Req(self._take_id(), request))

    def advance_to(self, t_s: float) -> None:
        """Process every event up to `t_s` and bring the counters to that time."""
        if t_s < self._now:
            raise ValueError(f"cannot go back from {self._now} s to {t_s} s")
        self._process(t_s)
        self._now = t_s
        for instance in self._instances.values():
            if isinstance(instance, _Decode) and instance.batch:
                done = instance.steps_done_by((t_s - instance.t0_s) * MS_PER_SECOND)
                self._commit_steps(instance, min(done, instance.target_step - instance.steps))

    def run(self) -> SimulationResult:
        """Process every event; return all finished requests not yet taken."""
        self._process(math.inf)
        return SimulationResult(
            records=self.take_finished(),
            token_itl_s=self.token_itl_s,
            instances=self.instances(),
            unfinished=self._active,
            end_s=self._now,
        )

    def take_finished(self) -> list[RequestRecord]:
        """Requests finished since the last call (a live driver's memory stays bounded)."""
        finished, self._finished = self._finished, []
        return finished

    # --- events -----------------------------------------------------------------------------

    def _take_id(self) -> int:
        self._next_id += 1
        return self._next_id - 1

    def _push(self, time_s: float, kind: int, payload: object, version: int = 0) -> None:
        self._seq += 1
        heapq.heappush(self._events, (time_s, self._seq, kind, payload, version))

    def _pull_arrival(self) -> None:
        request = next(self._source, None)
        if request is None:
            self._source_done = True
            return
        if request.arrival_s < self._last_arrival_s:
            raise ValueError(f"requests must arrive in order; {request.arrival_s} s came late")
        self._last_arrival_s = request.arrival_s
        req = _Req(self._take_id(), request)
        self._push(request.arrival_s, _ARRIVAL, req, 1)  # version 1: pull the next one

    def _process(self, until_s: float) -> None:
        events = self._events
        while events and events[0][0] <= until_s:
            time_s, _, kind, payload, version = heapq.heappop(events)
            self._now = time_s
            if kind == _ARRIVAL:
                assert isinstance(payload, _Req)
                if version:
                    self._pull_arrival()
                self._active += 1
                self._route_prefill(payload)
            elif kind == _PREFILL_DONE:
                assert isinstance(payload, _Prefill)
                self._finish_prefill(payload)
            elif kind == _TRANSFER_DONE:
                assert isinstance(payload, _Req)
                self._transfer_done(payload)
            elif kind == _DECODE_BOUNDARY:
                assert isinstance(payload, _Decode)
                if version == payload.version:
                    self._decode_boundary(payload)
            else:
                assert isinstance(payload, Instance)
                self._ready(payload)

    def _ready(self, instance: Instance) -> None:
        if instance.state is not State.LOADING:
            return
        instance.state = State.READY
        if isinstance(instance, _Prefill):
            self._prefills.append(instance)
            pending, self._pending_prefill = self._pending_prefill, deque()
            for req in pending:
                self._route_prefill(req)
        elif isinstance(instance, _Decode):
            self._decodes.append(instance)
            pending, self._pending_decode = self._pending_decode, deque()
            for req in pending:
                self._route_decode(req)

    def _retire_if_drained(self, instance: Instance) -> None:
        if instance.state is State.DRAINING and instance.idle:
            instance.state = State.GONE

    # --- prefill ----------------------------------------------------------------------------

    def _route_prefill(self, req: _Req) -> None:
        if not self._prefills:
            self._pending_prefill.append(req)
            return
        # Least outstanding prompt tokens (less the prefix cached there when the router sees the
        # caches); ties rotate, as a router's round robin would.
        candidates = self._rotated(self._prefills)
        if self.routing == "prefix-aware" and req.hash_ids:
            target = min(candidates, key=lambda i: i.load - self._cached_prefix(i, req))
        else:
            target = min(candidates, key=_prefill_load)
        target.queue.append(req)
        target.queued_tokens += req.input_tokens
        if not target.batch:
            self._start_prefill(target)

    def _rotated(self, instances: list[_I]) -> list[_I]:
        self._turn += 1
        start = self._turn % len(instances)
        return instances[start:] + instances[:start]

    @staticmethod
    def _leading_hits(instance: _Prefill, req: _Req) -> int:
        """Blocks of the request's prefix in the instance's cache, up to the first missing one."""
        cache, hits = instance.cache, 0
        for block in req.hash_ids:
            if block not in cache:
                break
            hits += 1
        return hits

    def _cached_prefix(self, instance: _Prefill, req: _Req) -> int:
        """Tokens of the request's prefix in the instance's cache now (the LRU order untouched:
        looking is not using)."""
        hits = self._leading_hits(instance, req)
        return min(hits * self.prefix_block_tokens, req.input_tokens - 1)

    def _cached_tokens(self, instance: _Prefill, req: _Req) -> int:
        if req.hash_ids:
            hits = self._leading_hits(instance, req)
            for block in req.hash_ids[:hits]:  # used now: the most recent in the LRU order
                instance.cache.move_to_end(block)
            cached = hits * self.prefix_block_tokens
        else:
            cached = req.cached_hint
        # The last prompt token is always computed: it yields the first output token.
        return min(cached, req.input_tokens - 1)

    def _start_prefill(self, instance: _Prefill) -> None:
        queue = instance.queue
        batch: list[_Req] = []
        budget = instance.spec.max_batch_tokens
        new_tokens = 0
        while queue:
            req = queue[0]
            cached = self._cached_tokens(instance, req)
            uncached = req.input_tokens - cached
            if batch and new_tokens + uncached > budget:
                break
            queue.popleft()
            req.cached_tokens = cached
            req.prefill = instance
            req.prefill_start_s = self._now
            batch.append(req)
            new_tokens += uncached
        if not batch:
            return
        tokens = [r.input_tokens for r in batch]
        batch_tokens = sum(tokens)
        instance.queued_tokens -= batch_tokens
        instance.batch = batch
        instance.batch_tokens = batch_tokens
        duration_ms = instance.spec.prefill.batch_ms(tokens, [r.cached_tokens for r in batch])
        self._push(self._now + duration_ms / MS_PER_SECOND, _PREFILL_DONE, instance)

    def _finish_prefill(self, instance: _Prefill) -> None:
        batch = instance.batch
        instance.batch = []
        instance.batch_tokens = 0
        cache = instance.cache
        capacity_blocks = instance.spec.kv_capacity_tokens // self.prefix_block_tokens
        now = self._now
        for req in batch:
            instance.prompt_tokens_total += req.input_tokens
            instance.generation_tokens_total += 1  # the first token comes from prefill
            instance.prefix_cache_queries_total += req.input_tokens
            instance.prefix_cache_hits_total += req.cached_tokens
            for block in req.hash_ids:
                cache[block] = None
                cache.move_to_end(block)
            while len(cache) > capacity_blocks:
                cache.popitem(last=False)
            req.prefill_end_s = now
            instance.queue_time.observe(req.prefill_start_s - req.arrival_s)
            instance.prefill_time.observe(now - req.prefill_start_s)
            if req.output_tokens == 1:
                self._first_token(req)
                self._finish(req, instance)
            else:
                self._route_decode(req)
        if instance.state is State.DRAINING:
            self._retire_if_drained(instance)
        elif instance.queue:
            self._start_prefill(instance)

    # --- decode -----------------------------------------------------------------------------

    def _route_decode(self, req: _Req) -> None:
        if not self._decodes:
            self._pending_decode.append(req)
            return
        target = min(self._rotated(self._decodes), key=_decode_load)
        target.admission.append(req)
        target.queued_need += req.input_tokens + req.output_tokens
        self._admit(target)

    def _admit(self, instance: _Decode) -> None:
        """Reserve KV for waiting requests in order, and start their transfers."""
        capacity = instance.spec.kv_capacity_tokens
        limit = instance.spec.max_batch_sequences
        queue = instance.admission
        while queue:
            req = queue[0]
            need = req.input_tokens + req.output_tokens
            holding = instance.batch + instance.transferring + len(instance.joiners)
            # A request larger than the whole cache still runs, alone, so nothing waits forever.
            fits = instance.reserved + need <= capacity or holding == 0
            if not fits or holding >= limit:
                break
            queue.popleft()
            instance.queued_need -= need
            instance.reserved += need
            instance.transferring += 1
            instance.inflight_kv += req.input_tokens
            req.decode = instance
            transfer_s = req.input_tokens * self._transfer_s_per_token
            self._push(self._now + transfer_s, _TRANSFER_DONE, req)

    def _transfer_done(self, req: _Req) -> None:
        instance = req.decode
        assert isinstance(instance, _Decode)
        instance.transferring -= 1
        # Recorded when it completes, as the connector records it.
        instance.kv_transfer.observe(req.input_tokens * self._transfer_s_per_token)
        instance.inflight_kv += 1  # the first token's KV joins the prompt's
        self._first_token(req)
        instance.joiners.append(req)
        if not instance.batch:
            self._start_segment(instance)
            return
        # Joins happen at the end of the step in progress: bring the next event forward to it.
        elapsed_ms = (self._now - instance.t0_s) * MS_PER_SECOND
        boundary = instance.steps + instance.steps_done_by(elapsed_ms) + 1
        if boundary < instance.target_step:
            instance.target_step = boundary
            instance.version += 1
            when = instance.t0_s + instance.steps_ms(boundary - instance.steps) / MS_PER_SECOND
            self._push(when, _DECODE_BOUNDARY, instance, instance.version)

    def _commit_steps(self, instance: _Decode, n: int) -> None:
        """Account for the next n steps of the running batch (they have happened)."""
        if n <= 0:
            return
        batch = instance.batch
        first_s = instance.alpha_ms / MS_PER_SECOND
        step_s = instance.b_ms * batch / MS_PER_SECOND
        # Joiners waited for the step in progress before their first step. vLLM's
        # disaggregated decode counts that wait in the time to first token, not in the first
        # inter-token gap (as the per-request outcomes do), so every first gap is one step.
        for histogram in (instance.itl, self.token_itl_s):
            histogram.observe_progression(first_s, step_s, n, batch)
        instance.generation_tokens_total += batch * n
        instance.t0_s += instance.steps_ms(n) / MS_PER_SECOND
        instance.alpha_ms += instance.b_ms * batch * n
        instance.steps += n

    def _decode_boundary(self, instance: _Decode) -> None:
        self._commit_steps(instance, instance.target_step - instance.steps)
        # Land exactly on the event time; the closed form drifts by float rounding only.
        instance.t0_s = self._now
        finishes = instance.finishes
        while finishes and finishes[0][0] <= instance.steps:
            finish_step, _, req = heapq.heappop(finishes)
            # The offset added at join: prompt + 1 - join step, join step = finish - output + 1.
            instance.context_offset -= req.input_tokens + req.output_tokens - finish_step
            instance.reserved -= req.input_tokens + req.output_tokens
            self._finish(req, instance)
        self._start_segment(instance)
        self._admit(instance)
        if instance.state is State.DRAINING:
            self._retire_if_drained(instance)

    def _start_segment(self, instance: _Decode) -> None:
        """Add the joiners to the batch and schedule the next finish."""
        now = self._now
        instance.t0_s = now
        for req in instance.joiners:
            # Context at join is prompt + first token; it grows by one per step from here.
            instance.context_offset += req.input_tokens + 1 - instance.steps
            instance.inflight_kv -= req.input_tokens + 1
            heapq.heappush(instance.finishes, (instance.steps + req.output_tokens - 1, req.id, req))
            req.decode_start_s = now
        instance.joiners.clear()
        batch = instance.batch
        if batch == 0:
            return
        context = instance.context_offset + batch * instance.steps
        instance.alpha_ms = instance.fixed_ms(batch) + instance.b_ms * context
        n = instance.finishes[0][0] - instance.steps
        instance.target_step = instance.steps + n
        instance.version += 1
        self._push(
            now + instance.steps_ms(n) / MS_PER_SECOND,
            _DECODE_BOUNDARY,
            instance,
            instance.version,
        )

    # --- completion -------------------------------------------------------------------------

    def _first_token(self, req: _Req) -> None:
        req.first_token_s = self._now
        prefill = req.prefill
        assert prefill is not None
        prefill.ttft.observe(self._now - req.arrival_s)

    def _finish(self, req: _Req, instance: Instance) -> None:
        req.finish_s = self._now
        instance.requests_total += 1
        instance.e2e.observe(self._now - req.arrival_s)
        self._active -= 1
        assert req.prefill is not None
        self._finished.append(
            RequestRecord(
                id=req.id,
                arrival_s=req.arrival_s,
                input_tokens=req.input_tokens,
                output_tokens=req.output_tokens,
                cached_tokens=req.cached_tokens,
                prefill_instance=req.prefill.name,
                decode_instance=req.decode.name if req.decode else None,
                prefill_start_s=req.prefill_start_s,
                prefill_end_s=req.prefill_end_s,
                first_token_s=req.first_token_s,
                finish_s=req.finish_s,
                decode_start_s=req.decode_start_s,
            )
        )


def _prefill_load(instance: _Prefill) -> int:
    return instance.load


def _decode_load(instance: _Decode) -> float:
    return instance.load
