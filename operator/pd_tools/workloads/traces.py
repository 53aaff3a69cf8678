"""Requests and load: synthetic generators and readers for public request traces.

Pure and streaming: every function returns an iterator that reads or draws one request at a
time, in arrival order, and stops at the end of its profile, window or file. Everything random
is drawn from `random.Random(seed)`, so a seed fixes the output.

Arrivals are a renewal process in *operational time* (the integral of the rate): gaps of mean 1
and coefficient of variation `cv`, mapped back through the rate profile. `cv=1` gives a Poisson
process; `cv>1` a Gamma-bursty one with the same mean rate (ServeGen fits CV 1-3 to real
traffic). Trace formats are described in shared/traces/README.md.
"""

import csv
import json
import math
import random
import re
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, replace
from datetime import date
from pathlib import Path

# One Mooncake `hash_ids` entry stands for this many prompt tokens (trace README).
MOONCAKE_BLOCK_TOKENS = 512
# Copies made by `rate_scale > 1` get their own prefix-block ids (id + copy * stride), so a copy
# is a different user and does not hit the original's cache. Trace ids stay far below it.
COPY_HASH_ID_STRIDE = 1 << 48


@dataclass(frozen=True, slots=True)
class Request:
    """One inference request.

    `hash_ids` are prefix-block ids (equal ids in two requests are reusable KV blocks); when a
    request has none, `cached_tokens` says how many of its prompt tokens hit the prefix cache.
    """

    arrival_s: float
    input_tokens: int
    output_tokens: int
    cached_tokens: int = 0
    hash_ids: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if self.input_tokens < 1 or self.output_tokens < 1:
            raise ValueError(f"a request has at least one input and one output token: {self}")
        if not 0 <= self.cached_tokens <= self.input_tokens:
            raise ValueError(f"cached tokens must lie between 0 and the input length: {self}")
        if not math.isfinite(self.arrival_s) or self.arrival_s < 0:
            raise ValueError(f"arrival time must be finite and >= 0: {self}")


def reused_prefix_tokens(
    requests: Iterable[Request], block_tokens: int = MOONCAKE_BLOCK_TOKENS
) -> list[int]:
    """Each request's prompt tokens found cached if every earlier prompt's blocks stayed in one
    unbounded cache that all replicas share (the best case): its leading blocks seen before, or
    its own `cached_tokens` when it carries no block ids; never the last prompt token, which
    yields the first output token."""
    seen: set[int] = set()
    out = []
    for request in requests:
        cached = request.cached_tokens
        if request.hash_ids:
            hits = 0
            for block in request.hash_ids:
                if block not in seen:
                    break
                hits += 1
            seen.update(request.hash_ids)
            cached = hits * block_tokens
        out.append(min(cached, request.input_tokens - 1))
    return out


# --- rate profiles --------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class RateSegment:
    """Request rate moving linearly from `start_rps` to `end_rps` over `duration_s`."""

    start_s: float
    duration_s: float
    start_rps: float
    end_rps: float

    def __post_init__(self) -> None:
        if self.duration_s <= 0 or self.start_rps < 0 or self.end_rps < 0:
            raise ValueError(f"need a positive duration and rates >= 0: {self}")

    @property
    def expected_requests(self) -> float:
        """Integral of the rate over the segment."""
        return (self.start_rps + self.end_rps) / 2 * self.duration_s

    def time_at(self, requests: float) -> float:
        """Time at which the integral of the rate from the start reaches `requests`."""
        slope = (self.end_rps - self.start_rps) / self.duration_s
        # r0*t + slope*t^2/2 = n, solved in the form that is stable when r0 or slope is 0.
        root = math.sqrt(max(0.0, self.start_rps**2 + 2 * slope * requests))
        denominator = self.start_rps + root
        offset = 2 * requests / denominator if denominator > 0 else 0.0
        return self.start_s + min(offset, self.duration_s)


@dataclass(frozen=True)
class RateProfile:
    """A request rate over time: consecutive linear segments starting at 0 s."""

    segments: tuple[RateSegment, ...]

    def __post_init__(self) -> None:
        if not self.segments:
            raise ValueError("a rate profile needs at least one segment")
        end = 0.0
        for segment in self.segments:
            if not math.isclose(segment.start_s, end, abs_tol=1e-9):
                raise ValueError(f"segments must be consecutive from 0 s, got {segment}")
            end = segment.start_s + segment.duration_s

    @property
    def duration_s(self) -> float:
        last = self.segments[-1]
        return last.start_s + last.duration_s

    @property
    def mean_rps(self) -> float:
        return sum(s.expected_requests for s in self.segments) / self.duration_s

    def scaled(self, factor: float) -> "RateProfile":
        """The same shape with every rate multiplied by `factor`."""
        if factor < 0:
            raise ValueError("the rate factor must not be negative")
        return RateProfile(
            tuple(
                replace(s, start_rps=s.start_rps * factor, end_rps=s.end_rps * factor)
                for s in self.segments
            )
        )


def constant_rate(rate_rps: float, duration_s: float) -> RateProfile:
    """A constant rate."""
    return RateProfile((RateSegment(0.0, duration_s, rate_rps, rate_rps),))


def step_rate(rates_rps: Sequence[float], step_s: float) -> RateProfile:
    """A staircase: each rate in turn for `step_s` seconds."""
    return RateProfile(
        tuple(RateSegment(i * step_s, step_s, rate, rate) for i, rate in enumerate(rates_rps))
    )


def ramp_rate(start_rps: float, end_rps: float, duration_s: float) -> RateProfile:
    """A rate moving linearly from `start_rps` to `end_rps`."""
    return RateProfile((RateSegment(0.0, duration_s, start_rps, end_rps),))


# --- lengths --------------------------------------------------------------------------------


@dataclass(frozen=True)
class TokenLengths:
    """Gamma-distributed prompt and output lengths with given means and CVs (0: constant).

    `cached_fraction` of each prompt is marked as a prefix-cache hit.
    """

    input_mean: float
    output_mean: float
    input_cv: float = 0.0
    output_cv: float = 0.0
    cached_fraction: float = 0.0

    def __post_init__(self) -> None:
        if self.input_mean < 1 or self.output_mean < 1:
            raise ValueError(f"mean lengths must be at least one token: {self}")
        if self.input_cv < 0 or self.output_cv < 0:
            raise ValueError(f"CVs must not be negative: {self}")
        if not 0 <= self.cached_fraction <= 1:
            raise ValueError(f"cached fraction must lie in [0, 1]: {self}")

    def sample(self, rng: random.Random) -> tuple[int, int, int]:
        """(input, output, cached) tokens of one request."""
        input_tokens = _gamma_tokens(rng, self.input_mean, self.input_cv)
        output_tokens = _gamma_tokens(rng, self.output_mean, self.output_cv)
        return input_tokens, output_tokens, math.floor(self.cached_fraction * input_tokens)


def _gamma_tokens(rng: random.Random, mean: float, cv: float) -> int:
    if cv == 0:
        return max(1, round(mean))
    shape = 1 / cv**2
    return max(1, round(rng.gammavariate(shape, mean / shape)))


# --- arrivals -------------------------------------------------------------------------------


def _renewal_arrivals(
    segments: Iterable[tuple[RateSegment, TokenLengths]], cv: float, rng: random.Random
) -> Iterator[Request]:
    """Gamma renewal arrivals (mean gap 1, CV `cv`) in operational time, mapped to real time."""
    if cv <= 0:
        raise ValueError(f"the arrival CV must be positive, got {cv}")
    shape = 1 / cv**2
    scale = cv**2
    # Operational time from the current segment's start to the next arrival: the renewal
    # process runs on across segments, so a rate change does not restart it.
    ahead = rng.gammavariate(shape, scale)
    for segment, lengths in segments:
        area = segment.expected_requests
        while ahead < area:
            input_tokens, output_tokens, cached = lengths.sample(rng)
            yield Request(segment.time_at(ahead), input_tokens, output_tokens, cached)
            ahead += rng.gammavariate(shape, scale)
        ahead -= area


def synthetic_requests(
    profile: RateProfile, lengths: TokenLengths, *, arrival_cv: float = 1.0, seed: int = 0
) -> Iterator[Request]:
    """Requests arriving at `profile`'s rate: Poisson for `arrival_cv=1`, Gamma-bursty above."""
    rng = random.Random(seed)
    return _renewal_arrivals(((s, lengths) for s in profile.segments), arrival_cv, rng)


# --- trace replay ---------------------------------------------------------------------------


@dataclass(frozen=True)
class ReplayOptions:
    """Which part of a trace to replay, and how.

    `start_s` and `duration_s` select a window in trace time (None: to the end); arrivals are
    relative to its start. `rate_scale` keeps the time axis and changes the number of requests
    (below 1 keeps each with that probability; above 1 adds copies spread before the next
    request). `time_compression` replays the same requests that many times faster.
    """

    start_s: float = 0.0
    duration_s: float | None = None
    rate_scale: float = 1.0
    time_compression: float = 1.0
    seed: int = 0

    def __post_init__(self) -> None:
        if self.start_s < 0 or (self.duration_s is not None and self.duration_s <= 0):
            raise ValueError(f"need start >= 0 and a positive duration: {self}")
        if self.rate_scale < 0 or self.time_compression <= 0:
            raise ValueError(f"need rate_scale >= 0 and time_compression > 0: {self}")

    @property
    def end_s(self) -> float:
        return math.inf if self.duration_s is None else self.start_s + self.duration_s

    def with_warmup(self, warmup_s: float) -> "ReplayOptions":
        """These options with `warmup_s` replayed seconds of the trace before the window.

        The replay then starts `warmup_s` before the window, which begins at `warmup_s` in
        replay time (pass it to `simulate(warmup_s=...)`). Where the trace has less than that
        before `start_s`, the replay starts at the trace's beginning and the window moves
        later, to `warmup_s` replayed seconds in (`measured_start_s`), keeping its duration.
        """
        if warmup_s < 0:
            raise ValueError(f"the warm-up must not be negative, got {warmup_s}")
        trace_warmup = warmup_s * self.time_compression
        return replace(
            self,
            start_s=max(0.0, self.start_s - trace_warmup),
            duration_s=None if self.duration_s is None else self.duration_s + trace_warmup,
        )

    def measured_start_s(self, warmup_s: float) -> float:
        """Where the measured window starts in trace time once `with_warmup(warmup_s)`."""
        return max(self.start_s, warmup_s * self.time_compression)


@dataclass(frozen=True, slots=True)
class _Row:
    trace_s: float
    input_tokens: int
    output_tokens: int
    hash_ids: tuple[int, ...] = ()


def _replay(rows: Iterable[_Row], options: ReplayOptions) -> Iterator[Request]:
    rng = random.Random(options.seed)
    whole, fraction = divmod(options.rate_scale, 1.0)
    copies_base = int(whole)

    def emit(row: _Row, next_trace_s: float) -> Iterator[Request]:
        copies = copies_base + (1 if fraction and rng.random() < fraction else 0)
        if copies == 0:
            return
        # Extra copies land uniformly before the next original, which keeps the output sorted.
        extra = sorted(rng.uniform(row.trace_s, next_trace_s) for _ in range(copies - 1))
        times = [row.trace_s, *extra]
        for copy, trace_s in enumerate(times):
            ids = row.hash_ids
            if copy and ids:
                ids = tuple(h + copy * COPY_HASH_ID_STRIDE for h in ids)
            yield Request(
                (trace_s - options.start_s) / options.time_compression,
                row.input_tokens,
                row.output_tokens,
                hash_ids=ids,
            )

    previous: _Row | None = None
    last_s = -math.inf
    for row in rows:
        if row.trace_s < last_s:
            raise ValueError(f"trace is not sorted by time at {row.trace_s} s")
        last_s = row.trace_s
        if row.trace_s < options.start_s:
            continue
        if row.trace_s >= options.end_s:
            break
        if previous is not None:
            yield from emit(previous, row.trace_s)
        previous = row
    if previous is not None:
        yield from emit(previous, previous.trace_s)


MOONCAKE_FIELDS = "timestamp (ms), input_length, output_length and optionally hash_ids"


def _token_count(value: object, name: str) -> int:
    """A token count from a trace: a whole number of at least 0; 0 reads as 1 (a request holds
    at least one prompt token and yields at least one output token)."""
    if value is None:
        raise ValueError(f"no {name}")
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise ValueError(f"{name} {value!r} is not a whole number")
    try:
        number = float(value)
    except ValueError:
        raise ValueError(f"{name} {value!r} is not a whole number") from None
    if not number.is_integer() or number < 0:
        raise ValueError(f"{name} {value!r} is not a whole number of at least 0")
    return max(1, int(number))


def _mooncake_row(record: object) -> _Row:
    if not isinstance(record, dict):
        raise ValueError(f"want a JSON object with {MOONCAKE_FIELDS}")
    missing = [k for k in ("timestamp", "input_length", "output_length") if k not in record]
    if missing:
        raise ValueError(f"no {', '.join(missing)}; a record holds {MOONCAKE_FIELDS}")
    stamp = record["timestamp"]
    if isinstance(stamp, bool) or not isinstance(stamp, int | float) or not math.isfinite(stamp):
        raise ValueError(f"timestamp {stamp!r} is not a number of milliseconds")
    ids = record.get("hash_ids", [])
    if not isinstance(ids, list) or not all(type(i) is int for i in ids):  # not bool either
        raise ValueError("hash_ids is not a list of whole numbers")
    return _Row(
        stamp / 1000.0,
        _token_count(record["input_length"], "input_length"),
        _token_count(record["output_length"], "output_length"),
        tuple(ids),
    )


def _mooncake_rows(path: Path) -> Iterator[_Row]:
    with path.open() as lines:
        for number, line in enumerate(lines, start=1):
            text = line.strip()
            if not text:
                continue
            try:
                yield _mooncake_row(json.loads(text))
            except json.JSONDecodeError as error:
                raise ValueError(
                    f"{path}, line {number}: not JSON ({error.msg}, column {error.colno})"
                ) from None
            except ValueError as error:
                raise ValueError(f"{path}, line {number}: {error}") from None


def read_mooncake(path: str | Path, options: ReplayOptions = ReplayOptions()) -> Iterator[Request]:
    """Mooncake JSONL: `timestamp` (ms), `input_length`, `output_length`, `hash_ids`."""
    return _replay(_mooncake_rows(Path(path)), options)


# 'YYYY-MM-DD HH:MM:SS' with any fraction digits (the 2023 traces write 100 ns ones), a 'T'
# for the space, and an optional zone ('Z', '+00:00': the 2024 traces write one).
_WALL_CLOCK = re.compile(
    r"(\d{4}-\d{2}-\d{2})[ T](\d{1,2}):(\d{2}):(\d{2}(?:\.\d+)?)\s*(Z|[+-]\d{2}:?\d{2})?"
)
AZURE_COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")


def _wall_clock_s(text: str) -> tuple[int, float]:
    """(day ordinal, seconds into the UTC day, which may run past either end) of a TIMESTAMP."""
    match = _WALL_CLOCK.fullmatch(text.strip())
    if match is None:
        raise ValueError(
            f"TIMESTAMP {text!r}: want 'YYYY-MM-DD HH:MM:SS.fffffff', optionally with a zone"
        )
    day, hours, minutes, seconds, zone = match.groups()
    into_day_s = int(hours) * 3600 + int(minutes) * 60 + float(seconds)
    if zone and zone != "Z":
        offset = zone[1:].replace(":", "")
        offset_s = int(offset[:2]) * 3600 + int(offset[2:]) * 60
        into_day_s -= offset_s if zone[0] == "+" else -offset_s  # local time less its offset
    return date.fromisoformat(day).toordinal(), into_day_s


def _azure_rows(path: Path) -> Iterator[_Row]:
    with path.open(newline="") as handle:
        reader = csv.DictReader(handle)
        missing = [c for c in AZURE_COLUMNS if c not in (reader.fieldnames or ())]
        if missing:
            raise ValueError(f"{path}: no {', '.join(missing)} column; want {AZURE_COLUMNS}")
        first: tuple[int, float] | None = None
        for line, record in enumerate(reader, start=2):
            try:
                day, seconds = _wall_clock_s(record["TIMESTAMP"])
                prompt = _token_count(record["ContextTokens"], "ContextTokens")
                output = _token_count(record["GeneratedTokens"], "GeneratedTokens")
            except (TypeError, ValueError) as error:
                raise ValueError(f"{path}, line {line}: {error}") from None
            if first is None:
                first = (day, seconds)
            # Relative to the first row; subtracting days first keeps sub-microsecond precision.
            trace_s = (day - first[0]) * 86400 + (seconds - first[1])
            yield _Row(trace_s, prompt, output)


def read_azure(path: str | Path, options: ReplayOptions = ReplayOptions()) -> Iterator[Request]:
    """Azure LLM inference CSV: `TIMESTAMP` (wall clock), `ContextTokens`, `GeneratedTokens`."""
    return _replay(_azure_rows(Path(path)), options)


SERVEGEN_COLUMNS = (
    "window_start_s",
    "total_rate_rps",
    "mean_input_tokens",
    "mean_output_tokens",
)


def _float_or_nan(text: str | None) -> float:
    try:
        return float(text) if text else math.nan
    except ValueError:
        return math.nan


def _servegen_windows(path: Path) -> Iterator[tuple[float, float, float, float, float]]:
    """(start, length, rate, mean input, mean output) per window; the last repeats the length."""
    with path.open(newline="") as handle:
        reader = csv.DictReader(handle)
        missing = [c for c in SERVEGEN_COLUMNS if c not in (reader.fieldnames or ())]
        if missing:
            raise ValueError(f"{path}: no {', '.join(missing)} column; want {SERVEGEN_COLUMNS}")
        previous: tuple[float, float, float, float] | None = None
        length = 600.0
        for line, record in enumerate(reader, start=2):
            row = (
                _float_or_nan(record["window_start_s"]),
                _float_or_nan(record["total_rate_rps"]),
                _float_or_nan(record["mean_input_tokens"]),
                _float_or_nan(record["mean_output_tokens"]),
            )
            if not math.isfinite(row[0]):
                raise ValueError(f"{path}, line {line}: window_start_s is not a number")
            if row[1] < 0:
                raise ValueError(f"{path}, line {line}: total_rate_rps {row[1]:g} is negative")
            if previous is not None:
                length = row[0] - previous[0]
                if not length > 0:
                    raise ValueError(
                        f"{path}, line {line}: windows are not sorted by time at {row[0]:g} s"
                    )
                yield previous[0], length, previous[1], previous[2], previous[3]
            previous = row
        if previous is not None:
            yield previous[0], length, previous[1], previous[2], previous[3]


def _servegen_segments(
    path: Path, options: ReplayOptions, length_cv: float
) -> Iterator[tuple[RateSegment, TokenLengths]]:
    replay_s = 0.0
    for start, length, rate, mean_in, mean_out in _servegen_windows(path):
        begin, end = max(start, options.start_s), min(start + length, options.end_s)
        if start >= options.end_s:
            return
        # A window with no rate or no lengths is a collection gap: skipped, so the replay
        # neither invents a load nor shows an idle period that never happened.
        if end <= begin or not rate > 0 or not (mean_in >= 1 and mean_out >= 1):
            continue
        duration = (end - begin) / options.time_compression
        scaled_rps = rate * options.rate_scale * options.time_compression
        lengths = TokenLengths(mean_in, mean_out, length_cv, length_cv)
        yield RateSegment(replay_s, duration, scaled_rps, scaled_rps), lengths
        replay_s += duration


def read_servegen(
    path: str | Path,
    options: ReplayOptions = ReplayOptions(),
    *,
    arrival_cv: float = 2.0,
    length_cv: float = 1.0,
) -> Iterator[Request]:
    """ServeGen aggregate CSV: per-window rate and mean lengths turned into Gamma arrivals.

    Windows with rate 0 or no lengths are skipped (the replay closes the gap). Lengths are
    Gamma around each window's means with CV `length_cv`; ServeGen's rates are large and of
    uncertain scale, so set `options.rate_scale` for the target cluster.
    """
    rng = random.Random(options.seed)
    return _renewal_arrivals(_servegen_segments(Path(path), options, length_cv), arrival_cv, rng)


def read_trace(path: str | Path, options: ReplayOptions = ReplayOptions()) -> Iterator[Request]:
    """A Mooncake JSONL, Azure CSV or ServeGen aggregate CSV trace, told apart by its first line.

    ValueError names the file when it is empty or none of the three; a malformed record comes
    out as the iterator reaches it, naming its line.
    """
    path = Path(path)
    with path.open(newline="") as handle:
        first = next((line for line in handle if line.strip()), "")
    if not first:
        raise ValueError(f"{path}: the file is empty")
    if first.lstrip().startswith("{"):
        return read_mooncake(path, options)
    header = next(csv.reader([first]), [])
    if "TIMESTAMP" in header:
        return read_azure(path, options)
    if "window_start_s" in header:
        return read_servegen(path, options)
    raise ValueError(
        f"{path}: not a trace this reads: want Mooncake JSONL (a JSON object per line), an Azure"
        " CSV (a TIMESTAMP column) or a ServeGen aggregate CSV (a window_start_s column)"
    )
