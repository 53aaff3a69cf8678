"""The load options `pdctl sim replay` and `pdctl plan` share: a trace's window, or synthetic."""

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeVar

import click

from pd_operator.cli.arguments import FRACTION, NON_NEGATIVE, POSITIVE, TOKENS, about

if TYPE_CHECKING:
    from pd_tools.workloads.traces import Request

F = TypeVar("F", bound=Callable[..., object])

TRACE_HELP = "Mooncake .jsonl, Azure or ServeGen CSV trace (default: synthetic, --rate)"
RATE_SCALE_HELP = "trace: keep this many copies of each request (a fraction thins it)"
TRACE_COMPRESSION_HELP = "trace: replay it this many times faster"
SEED_HELP = "seed of the synthetic arrivals and lengths, and of --rate-scale's copies"


@dataclass(frozen=True, kw_only=True)
class Load:
    """The load options' values."""

    trace: str | None
    start: float
    duration: float | None
    rate: float
    input_tokens: float
    output_tokens: float
    cache_hit: float | None


def load_options(command: F) -> F:
    """Add the load options (the fields of `Load`) to `command`."""
    options = [
        click.option("--trace", help=TRACE_HELP),
        click.option("--start", type=NON_NEGATIVE, default=0.0, help="trace seconds to skip"),
        click.option(
            "--duration",
            type=POSITIVE,
            help="seconds of trace or synthetic load (default: the whole trace, 600 synthetic)",
        ),
        click.option("--rate", type=POSITIVE, default=1.0, help="synthetic requests per second"),
        click.option("--input-tokens", type=TOKENS, default=8000.0, help="mean prompt length"),
        click.option("--output-tokens", type=TOKENS, default=300.0, help="mean output length"),
        click.option(
            "--cache-hit",
            type=FRACTION,
            help="prefix-cache hit rate (default 0; plan --trace with block hashes: the trace's "
            "own)",
        ),
    ]
    for option in reversed(options):
        command = option(command)
    return command


def trace_requests(
    path: str,
    load: Load,
    *,
    warmup_s: float = 0.0,
    rate_scale: float = 1.0,
    trace_compression: float = 1.0,
    seed: int = 0,
) -> list["Request"]:
    """The `--trace` window's requests (after `warmup_s` of lead-in); an error when empty."""
    from pd_tools.replay.offline import load_trace
    from pd_tools.workloads.traces import ReplayOptions

    options = ReplayOptions(
        start_s=load.start,
        duration_s=load.duration,
        rate_scale=rate_scale,
        time_compression=trace_compression,
        seed=seed,
    )
    with about(f"--trace {path}"):
        requests = load_trace(path, options.with_warmup(warmup_s))
        if not requests:
            whole = load_trace(path)
            if not whole:
                raise ValueError("the trace holds no request")
            span = f"{whole[-1].arrival_s:,.0f} s"
            window = f"[{load.start:g}, {load.start + load.duration:g})" if load.duration else ""
            raise ValueError(
                f"no request in the window --start {load.start:g}"
                + (f" --duration {load.duration:g} {window}" if window else "")
                + f"; the trace's last arrival is at {span}"
            )
    return requests
