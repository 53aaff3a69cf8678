"""Sends a workload through an OpenAI-compatible endpoint and measures what its users see.

Open loop: each `Request` is sent at its arrival time (divided by the time compression) whatever
the answers so far; one that arrives while `max_in_flight` requests are outstanding is recorded
as rejected by the client, never queued. Prompts are whitespace-separated words, one word per
token: a request's prefix blocks (`hash_ids`) become identical leading words, so a cache-aware
router or engine sees the prefix that the trace shares. Only loopback addresses (127.0.0.0/8)
are dialed, so a load test never reaches a real service.

Client-side latencies, streaming: TTFT is the time from sending to the first chunk that carries
text. A chunk's token count is the growth of its `usage.completion_tokens` when the chunk carries
one, else the number of words in its text. A chunk of k tokens arriving g seconds after the
previous text chunk adds k gaps of g/k to the ITL samples (the tokens are taken as evenly spaced
over the gap, so the gaps add up to the decode time); the extra tokens of the first chunk add
none, since nothing measures their spacing. A final usage-only chunk corrects the token total.
"""

import argparse
import asyncio
import csv
import ipaddress
import itertools
import json
import math
import sys
import urllib.parse
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import aiohttp

from pd_tools.workloads.traces import (
    MOONCAKE_BLOCK_TOKENS,
    ReplayOptions,
    Request,
    TokenLengths,
    constant_rate,
    read_trace,
    synthetic_requests,
)

Endpoint = Literal["completions", "chat"]
ENDPOINT_PATHS: dict[Endpoint, str] = {
    "completions": "/v1/completions",
    "chat": "/v1/chat/completions",
}
LOOPBACK = ipaddress.ip_network("127.0.0.0/8")

# Failure reasons (RequestRecord.reason); an HTTP error reads `http_<status>`.
REJECTED = "rejected_by_client"
TIMEOUT = "timeout"
DISCONNECT = "disconnect"
DEADLINE = "deadline"
ENGINE_ERROR = "engine_error"
BAD_RESPONSE = "bad_response"

ERROR_BODY_BYTES = 300  # how much of an error answer a record keeps
MAX_LINE_BYTES = 1 << 20  # an SSE line longer than this is a broken stream, not a big token
# Leading words of a request that has cached tokens but no block ids: one prompt all such share.
SHARED_PREFIX_WORD = "shared"


@dataclass(frozen=True)
class LoadConfig:
    """Where to send a workload and how hard; every bound is a limit the run stops by."""

    url: str  # base URL, e.g. http://127.0.0.9:8000; a loopback address only
    model: str
    stream: bool = True
    endpoint: Endpoint = "completions"
    max_in_flight: int = 256  # requests outstanding at once; also the connection pool size
    timeout_s: float = 60.0  # per request, from sending to the last byte
    deadline_s: float = 600.0  # the whole run: no arrival after it, none in flight past it
    time_compression: float = 1.0  # arrivals replayed this many times faster
    max_requests: int = 1_000_000

    def __post_init__(self) -> None:
        loopback_url(self.url)
        if self.max_in_flight < 1 or self.max_requests < 1:
            raise ValueError(f"need max_in_flight >= 1 and max_requests >= 1: {self}")
        if not (self.timeout_s > 0 and self.deadline_s > 0 and self.time_compression > 0):
            raise ValueError(f"need a positive timeout, deadline and time compression: {self}")
        if self.endpoint not in ENDPOINT_PATHS:
            raise ValueError(f"endpoint {self.endpoint!r}: want one of {sorted(ENDPOINT_PATHS)}")


@dataclass(slots=True)
class RequestRecord:
    """What one user saw; times in seconds from the start of the run."""

    index: int
    arrival_s: float  # when the workload sends it (after compression)
    input_tokens: int
    output_tokens: int  # asked for
    start_s: float | None = None  # None: never sent (rejected by the client)
    ttft_s: float | None = None  # None: no text arrived, or not streamed
    itl_s: list[float] = field(default_factory=list)
    end_s: float | None = None
    tokens: int = 0  # received
    status: int | None = None  # HTTP status; None: no answer
    reason: str | None = None  # None: completed; else why not (REJECTED, TIMEOUT, http_503...)
    error: str = ""

    def fail(self, reason: str, error: str) -> None:
        # The first failure is the cause; later ones (a cancel while reading) are consequences.
        if self.reason is None:
            self.reason, self.error = reason, error


@dataclass(frozen=True)
class LoadSummary:
    """A run in figures; latencies in seconds, NaN where nothing was measured."""

    offered: int  # arrivals before the deadline: completed + all failures
    sent: int
    completed: int
    failed: dict[str, int]  # by reason, rejected by the client included
    tokens: int  # received, all requests
    duration_s: float  # first send to last answer
    requests_per_s: float  # completed per second of `duration_s`
    tokens_per_s: float
    peak_in_flight: int  # concurrent requests (streams, when streaming) at most
    ttft_p50_s: float
    ttft_p99_s: float
    itl_p50_s: float
    itl_p99_s: float
    latency_p50_s: float  # send to last byte, completed requests
    latency_p99_s: float
    send_lag_p99_s: float  # how late the client sent: a large value means it was the bottleneck


@dataclass(frozen=True)
class LoadResult:
    records: list[RequestRecord]
    summary: LoadSummary


def loopback_url(url: str, flag: str = "--url") -> str:
    """`url` less a trailing slash; ValueError unless it is HTTP to an address in 127.0.0.0/8."""
    parsed = urllib.parse.urlsplit(url)
    if parsed.scheme not in {"http", "https"} or not parsed.hostname:
        raise ValueError(f"{flag} {url!r}: want http://127.x.y.z:PORT")
    try:
        address = ipaddress.ip_address(parsed.hostname)
    except ValueError:
        address = None
    if address is None or address not in LOOPBACK:
        raise ValueError(
            f"{flag} {url!r}: host {parsed.hostname!r} is not a loopback address (127.0.0.0/8);"
            " a load test dials only simulated services on this machine, never a real one"
        )
    return url.rstrip("/")


def quantile(ordered: Sequence[float], q: float) -> float:
    """The q-quantile of sorted values, interpolated linearly; NaN when there are none."""
    if not ordered:
        return math.nan
    position = q * (len(ordered) - 1)
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


# --- requests -------------------------------------------------------------------------------


def prompt_text(request: Request, index: int, block_tokens: int = MOONCAKE_BLOCK_TOKENS) -> str:
    """Exactly `input_tokens` words: `block_tokens` words per prefix block id, then words of
    this request alone. Equal block ids give equal leading words; the words diverge where the
    ids do. A request with cached tokens but no ids leads with that many words all such share."""
    runs: list[tuple[str, int]] = []
    left = request.input_tokens
    if request.hash_ids:
        for block in request.hash_ids:
            if left <= 0:
                break
            runs.append((f"b{block:x}", min(block_tokens, left)))
            left -= block_tokens
    elif request.cached_tokens:
        runs.append((SHARED_PREFIX_WORD, request.cached_tokens))
        left -= request.cached_tokens
    if left > 0:
        runs.append((f"r{index:x}", left))
    return " ".join(" ".join(itertools.repeat(word, count)) for word, count in runs)


def request_body(
    request: Request, index: int, model: str, *, stream: bool, endpoint: Endpoint
) -> dict[str, object]:
    """The OpenAI request for `request`: exactly its output length (EOS ignored)."""
    prompt = prompt_text(request, index)
    body: dict[str, object] = {
        "model": model,
        "max_tokens": request.output_tokens,
        "min_tokens": request.output_tokens,
        "ignore_eos": True,
        "stream": stream,
    }
    if endpoint == "chat":
        body["messages"] = [{"role": "user", "content": prompt}]
    else:
        body["prompt"] = prompt
    if stream:
        body["stream_options"] = {"include_usage": True}
    return body


# --- answers --------------------------------------------------------------------------------


def _text(chunk: dict[str, object], endpoint: Endpoint) -> str:
    """The text of a chunk (streaming) or an answer (not streaming); '' when none."""
    choices = chunk.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        return ""
    choice: dict[str, object] = choices[0]
    if endpoint == "completions":
        text = choice.get("text")
    else:
        holder = choice.get("delta", choice.get("message"))
        text = holder.get("content") if isinstance(holder, dict) else None
    return text if isinstance(text, str) else ""


def _completion_tokens(chunk: dict[str, object]) -> int | None:
    usage = chunk.get("usage")
    count = usage.get("completion_tokens") if isinstance(usage, dict) else None
    return count if isinstance(count, int) else None


def _engine_error(chunk: dict[str, object]) -> str | None:
    if "error" in chunk:
        return json.dumps(chunk["error"])[:ERROR_BODY_BYTES]
    if chunk.get("object") == "error":
        return str(chunk.get("message", chunk))[:ERROR_BODY_BYTES]
    return None


def _parse(data: bytes) -> dict[str, object]:
    chunk = json.loads(data)
    if not isinstance(chunk, dict):
        raise ValueError(f"want a JSON object, got {data[:80]!r}")
    return chunk


class _Stream:
    """One streamed answer's progress: takes `data:` payloads, records tokens and their gaps."""

    __slots__ = ("endpoint", "last_s", "record", "start_s")

    def __init__(self, record: RequestRecord, endpoint: Endpoint, start_s: float) -> None:
        self.record, self.endpoint = record, endpoint
        self.start_s = self.last_s = start_s

    def take(self, data: bytes, now: float) -> bool:
        """Records one payload received at `now`; True when the stream is over."""
        record = self.record
        if data == b"[DONE]":
            return True
        chunk = _parse(data)
        error = _engine_error(chunk)
        if error is not None:
            record.fail(ENGINE_ERROR, error)
            return True
        text = _text(chunk, self.endpoint)
        usage_tokens = _completion_tokens(chunk)
        if not text:
            if usage_tokens is not None:  # the closing usage chunk: the true total
                record.tokens = usage_tokens
            return False
        count = max(1, len(text.split()))
        if usage_tokens is not None and usage_tokens > record.tokens:
            count = usage_tokens - record.tokens
        if record.ttft_s is None:
            record.ttft_s = now - self.start_s
        else:
            gap = (now - self.last_s) / count
            record.itl_s.extend(itertools.repeat(gap, count))
        record.tokens += count
        self.last_s = now
        return False


async def _read_stream(
    response: aiohttp.ClientResponse,
    record: RequestRecord,
    endpoint: Endpoint,
    clock: Callable[[], float],
    start_s: float,
) -> None:
    """Reads SSE `data:` lines to `data: [DONE]`. Whatever one read brings, the user saw at
    once: its lines share one arrival time (and reading by the buffer, not by the line, keeps
    the client's own CPU per token low)."""
    stream = _Stream(record, endpoint, start_s)
    pending = b""
    async for data in response.content.iter_any():
        now = clock()
        *lines, pending = (pending + data).split(b"\n")
        if len(pending) > MAX_LINE_BYTES:
            raise ValueError(f"an SSE line longer than {MAX_LINE_BYTES:,} bytes")
        for raw in lines:
            line = raw.strip()
            # Blank separators and `:` keep-alive comments carry nothing.
            if line.startswith(b"data:") and stream.take(line[5:].strip(), now):
                return
    record.fail(DISCONNECT, "the stream ended before data: [DONE]")


async def _read_whole(
    response: aiohttp.ClientResponse, record: RequestRecord, endpoint: Endpoint
) -> None:
    answer = _parse(await response.read())
    error = _engine_error(answer)
    if error is not None:
        record.fail(ENGINE_ERROR, error)
        return
    counted = _completion_tokens(answer)
    record.tokens = counted if counted is not None else len(_text(answer, endpoint).split())


async def _send(
    session: aiohttp.ClientSession,
    url: str,
    body: dict[str, object],
    record: RequestRecord,
    *,
    config: LoadConfig,
    clock: Callable[[], float],
) -> None:
    record.start_s = start_s = clock()
    try:
        # No redirects: a redirect could lead off the loopback addresses this client keeps to.
        async with session.post(url, json=body, allow_redirects=False) as response:
            record.status = response.status
            if response.status != 200:
                text = (await response.content.read(ERROR_BODY_BYTES)).decode(errors="replace")
                record.fail(f"http_{response.status}", f"HTTP {response.status}: {text}")
            elif config.stream:
                await _read_stream(response, record, config.endpoint, clock, start_s)
            else:
                await _read_whole(response, record, config.endpoint)
    except TimeoutError:
        record.fail(TIMEOUT, f"no whole answer within {config.timeout_s:g} s")
    except aiohttp.ClientError as error:
        record.fail(DISCONNECT, f"{type(error).__name__}: {error}"[:ERROR_BODY_BYTES])
    except ValueError as error:  # JSON that does not parse, or a line over MAX_LINE_BYTES
        record.fail(BAD_RESPONSE, str(error)[:ERROR_BODY_BYTES])
    except asyncio.CancelledError:
        record.fail(DEADLINE, f"still in flight at the run's deadline ({config.deadline_s:g} s)")
        raise
    finally:
        record.end_s = clock()


# --- the run --------------------------------------------------------------------------------


async def replay(requests: Iterable[Request], config: LoadConfig) -> LoadResult:
    """Sends `requests` (in arrival order) open loop and records each; stops at the deadline,
    after `max_requests`, or at the end of the workload once every answer is in."""
    url = loopback_url(config.url) + ENDPOINT_PATHS[config.endpoint]
    loop = asyncio.get_running_loop()
    began = loop.time()

    def clock() -> float:
        return loop.time() - began

    records: list[RequestRecord] = []
    in_flight: set[asyncio.Task[None]] = set()
    peak = 0
    connector = aiohttp.TCPConnector(limit=config.max_in_flight, limit_per_host=0)
    timeout = aiohttp.ClientTimeout(total=config.timeout_s)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:

        async def dispatch() -> None:
            nonlocal peak
            for index, request in enumerate(itertools.islice(requests, config.max_requests)):
                at = request.arrival_s / config.time_compression
                if at >= config.deadline_s:
                    break
                await asyncio.sleep(max(0.0, at - clock()))
                record = RequestRecord(index, at, request.input_tokens, request.output_tokens)
                records.append(record)
                if len(in_flight) >= config.max_in_flight:
                    record.fail(REJECTED, f"{config.max_in_flight} requests already in flight")
                    continue
                body = request_body(
                    request, index, config.model, stream=config.stream, endpoint=config.endpoint
                )
                task = asyncio.create_task(
                    _send(session, url, body, record, config=config, clock=clock)
                )
                in_flight.add(task)
                task.add_done_callback(in_flight.discard)
                peak = max(peak, len(in_flight))
            while in_flight:
                await asyncio.wait(set(in_flight))

        try:
            await asyncio.wait_for(dispatch(), timeout=config.deadline_s)
        except TimeoutError:
            pass  # the deadline: what is still in flight is cancelled below
        finally:
            # Also on an error (a malformed trace record): no request outlives the session.
            for task in list(in_flight):
                task.cancel()
            await asyncio.gather(*in_flight, return_exceptions=True)
    return LoadResult(records, summarize(records, peak))


def run(requests: Iterable[Request], config: LoadConfig) -> LoadResult:
    """`replay` on a fresh event loop."""
    return asyncio.run(replay(requests, config))


def summarize(records: Sequence[RequestRecord], peak_in_flight: int) -> LoadSummary:
    """Counts, rates and latency quantiles of a run's records."""
    sent = [r for r in records if r.start_s is not None]
    completed = [r for r in sent if r.reason is None]
    failed: dict[str, int] = {}
    for record in records:
        if record.reason is not None:
            failed[record.reason] = failed.get(record.reason, 0) + 1
    first = min((r.start_s for r in sent if r.start_s is not None), default=0.0)
    last = max((r.end_s for r in sent if r.end_s is not None), default=first)
    duration = last - first
    tokens = sum(r.tokens for r in records)
    ttft = sorted(r.ttft_s for r in records if r.ttft_s is not None)
    itl = sorted(gap for r in records for gap in r.itl_s)
    latency = sorted(
        r.end_s - r.start_s for r in completed if r.end_s is not None and r.start_s is not None
    )
    lag = sorted(r.start_s - r.arrival_s for r in sent if r.start_s is not None)
    return LoadSummary(
        offered=len(records),
        sent=len(sent),
        completed=len(completed),
        failed=dict(sorted(failed.items())),
        tokens=tokens,
        duration_s=duration,
        requests_per_s=len(completed) / duration if duration > 0 else math.nan,
        tokens_per_s=tokens / duration if duration > 0 else math.nan,
        peak_in_flight=peak_in_flight,
        ttft_p50_s=quantile(ttft, 0.5),
        ttft_p99_s=quantile(ttft, 0.99),
        itl_p50_s=quantile(itl, 0.5),
        itl_p99_s=quantile(itl, 0.99),
        latency_p50_s=quantile(latency, 0.5),
        latency_p99_s=quantile(latency, 0.99),
        send_lag_p99_s=quantile(lag, 0.99),
    )


def format_summary(summary: LoadSummary) -> str:
    """The summary as a two-column table."""

    def ms(value: float) -> str:
        return "-" if math.isnan(value) else f"{value * 1000:,.1f} ms"

    failures = ", ".join(f"{k} {v:,}" for k, v in summary.failed.items()) or "none"
    rows = [
        ("offered", f"{summary.offered:,}"),
        ("sent", f"{summary.sent:,}"),
        ("completed", f"{summary.completed:,}"),
        ("failed", failures),
        ("duration", f"{summary.duration_s:,.1f} s"),
        ("requests/s", f"{summary.requests_per_s:,.2f}"),
        ("tokens received", f"{summary.tokens:,}"),
        ("tokens/s", f"{summary.tokens_per_s:,.1f}"),
        ("peak in flight", f"{summary.peak_in_flight:,}"),
        ("TTFT p50 / p99", f"{ms(summary.ttft_p50_s)} / {ms(summary.ttft_p99_s)}"),
        ("ITL p50 / p99", f"{ms(summary.itl_p50_s)} / {ms(summary.itl_p99_s)}"),
        ("latency p50 / p99", f"{ms(summary.latency_p50_s)} / {ms(summary.latency_p99_s)}"),
        ("send lag p99", ms(summary.send_lag_p99_s)),
    ]
    width = max(len(name) for name, _ in rows)
    return "\n".join(f"{name:<{width}}  {value}" for name, value in rows)


CSV_COLUMNS = (
    "index",
    "arrival_s",
    "start_s",
    "ttft_s",
    "end_s",
    "input_tokens",
    "output_tokens",
    "tokens",
    "itl_mean_s",
    "status",
    "reason",
    "error",
)


def write_csv(records: Iterable[RequestRecord], path: str | Path) -> None:
    """One row per request (CSV_COLUMNS); empty cells where nothing was measured."""
    with Path(path).open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(CSV_COLUMNS)
        for r in records:
            itl_mean = sum(r.itl_s) / len(r.itl_s) if r.itl_s else None
            cells = (
                *(r.index, r.arrival_s, r.start_s, r.ttft_s, r.end_s, r.input_tokens),
                *(r.output_tokens, r.tokens, itl_mean, r.status, r.reason, r.error),
            )
            writer.writerow("" if cell is None else cell for cell in cells)


# --- command line ---------------------------------------------------------------------------


def _workload(args: argparse.Namespace) -> Iterator[Request]:
    # Both sources describe time before compression; the replay divides it, so --duration
    # is wall-clock seconds either way.
    trace_s = args.duration * args.time_compression
    if args.trace:
        return read_trace(args.trace, ReplayOptions(duration_s=trace_s, seed=args.seed))
    lengths = TokenLengths(args.input_tokens, args.output_tokens)
    return synthetic_requests(constant_rate(args.rate, trace_s), lengths, seed=args.seed)


def main(argv: Sequence[str] | None = None) -> int:
    """Command line: replay a trace or a constant rate and print the summary."""
    parser = argparse.ArgumentParser(
        prog="python -m pd_tools.workloads.http_load", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--url", required=True, help="base URL on 127.0.0.0/8")
    parser.add_argument("--model", required=True)
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--trace", help="Mooncake JSONL, Azure CSV or ServeGen aggregate CSV")
    source.add_argument("--rate", type=float, help="Poisson arrivals, requests/s")
    parser.add_argument("--duration", type=float, default=60.0, help="arrivals for S s")
    parser.add_argument("--input-tokens", type=int, default=1024, help="with --rate")
    parser.add_argument("--output-tokens", type=int, default=128, help="with --rate")
    parser.add_argument("--stream", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument("--endpoint", choices=sorted(ENDPOINT_PATHS), default="completions")
    parser.add_argument("--max-in-flight", type=int, default=256)
    parser.add_argument("--timeout", type=float, default=60.0, help="per request, s")
    parser.add_argument("--deadline", type=float, help="whole run, s (default duration+timeout)")
    parser.add_argument("--time-compression", type=float, default=1.0)
    parser.add_argument("--max-requests", type=int, default=1_000_000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--csv", help="write one row per request here")
    args = parser.parse_args(argv)
    if not args.duration > 0 or not args.time_compression > 0:
        parser.error("--duration and --time-compression must be positive")
    if args.rate is not None and not args.rate > 0:
        parser.error("--rate must be positive")
    try:
        config = LoadConfig(
            url=args.url,
            model=args.model,
            stream=args.stream,
            endpoint=args.endpoint,
            max_in_flight=args.max_in_flight,
            timeout_s=args.timeout,
            deadline_s=args.duration + args.timeout if args.deadline is None else args.deadline,
            time_compression=args.time_compression,
            max_requests=args.max_requests,
        )
        requests = _workload(args)
    except (OSError, ValueError) as error:
        parser.error(str(error))
    try:
        result = run(requests, config)
    except ValueError as error:  # a malformed trace record, found as the replay reaches it
        print(f"error: {error}", file=sys.stderr)
        return 2
    print(format_summary(result.summary))
    if args.csv:
        write_csv(result.records, args.csv)
    return 0 if result.summary.completed else 1


if __name__ == "__main__":
    raise SystemExit(main())
