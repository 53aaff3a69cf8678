"""Progress of an offline replay (or of a hindsight search's look-ahead) and its display."""

import math
import time
from dataclasses import dataclass
from typing import TextIO


@dataclass(frozen=True)
class Progress:
    """Where a run is: simulated time against the last arrival, requests finished."""

    policy: str
    simulated_s: float
    span_s: float
    finished: int
    requests: int
    phase: str = "replay"  # "look-ahead": the oracle searching its schedule

    @property
    def fraction(self) -> float:
        return min(1.0, self.simulated_s / self.span_s) if self.span_s > 0 else 1.0

    def __str__(self) -> str:
        what = self.policy if self.phase == "replay" else f"{self.policy} {self.phase}"
        return (
            f"{what}: t={self.simulated_s:,.0f}s of {self.span_s:,.0f}s, "
            f"{self.finished:,}/{self.requests:,} done"
        )


class ProgressBar:
    """Shows `Progress` on a stream: a bar redrawn in place on a terminal, else one line per
    tenth of each run (or look-ahead). Pass it as `simulate(progress=...)`."""

    WIDTH = 30
    REDRAW_S = 0.2

    def __init__(self, stream: TextIO, *, terminal: bool | None = None) -> None:
        self.stream = stream
        self.terminal = stream.isatty() if terminal is None else terminal
        self.drawn = False
        self.last_draw = -math.inf
        self.last_tenth: tuple[str, str, int] | None = None

    def __call__(self, progress: Progress) -> None:
        if not self.terminal:
            tenth = (progress.policy, progress.phase, math.floor(progress.fraction * 10))
            if tenth != self.last_tenth:
                self.last_tenth = tenth
                print(progress, file=self.stream, flush=True)
            return
        now = time.monotonic()
        if now - self.last_draw < self.REDRAW_S and progress.fraction < 1:
            return
        self.last_draw = now
        filled = round(progress.fraction * self.WIDTH)
        bar = "#" * filled + "." * (self.WIDTH - filled)
        self.stream.write(f"\r[{bar}] {progress.fraction:4.0%} {progress}\x1b[K")
        self.stream.flush()
        self.drawn = True

    def close(self) -> None:
        """End the bar's line (call after each run)."""
        if self.drawn:
            self.stream.write("\n")
            self.stream.flush()
        self.drawn = False
        self.last_draw = -math.inf
