"""CPU the demo's processes and the machine use while the load runs."""

import os
import textwrap
from pathlib import Path

from pd_tools.demo.settings import WIDTH, WINDOW_SECONDS

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float | None:
    """User + system CPU seconds of a process (all its threads); None when it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


def machine_busy_seconds() -> float:
    """CPU seconds all cores spent not idle since boot."""
    values = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = values[3] + (values[4] if len(values) > 4 else 0)
    return (sum(values) - idle) / CLOCK_TICKS


class CpuMeter:
    """CPU of the demo's processes, sampled as the load runs: on average, in its busiest
    window, per kind of process; and of the whole machine (other work on it included)."""

    def __init__(self) -> None:
        self.start: dict[int, float] = {}  # CPU seconds when first seen (0: started in the run)
        self.last: dict[int, float] = {}
        self.names: dict[int, str] = {}
        self.totals: list[tuple[float, float]] = []  # (t, the processes' CPU seconds so far)
        self.machine: list[tuple[float, float]] = []

    def sample(self, t: float, named: dict[int, str]) -> None:
        """Read every process's CPU at `t` (seconds since the load started)."""
        for pid, name in named.items():
            seconds = cpu_seconds(pid)
            if seconds is None:
                continue  # gone: what it used until the last sample is kept
            if pid not in self.last:
                self.start[pid] = seconds if not self.totals else 0.0
            self.last[pid], self.names[pid] = seconds, name
        self.totals.append((t, sum(self.last[pid] - self.start[pid] for pid in self.last)))
        self.machine.append((t, machine_busy_seconds()))

    def report(self, window_s: float = WINDOW_SECONDS) -> str:
        """One line: cores used on average and at the busiest `window_s`, who used them."""
        if len(self.totals) < 2 or self.totals[-1][0] - self.totals[0][0] < window_s:
            return "CPU: not measured (the load ran too short)"
        wall = self.totals[-1][0] - self.totals[0][0]
        used: dict[str, float] = {}
        for pid, seconds in self.last.items():
            used[self.names[pid]] = used.get(self.names[pid], 0.0) + seconds - self.start[pid]
        peak = max(
            (b[1] - a[1]) / (b[0] - a[0])
            for i, a in enumerate(self.totals)
            for b in self.totals[i + 1 :]
            if b[0] - a[0] >= window_s
        )
        machine = (self.machine[-1][1] - self.machine[0][1]) / wall
        ranked = sorted(used.items(), key=lambda item: -item[1])
        parts = ", ".join(f"{name} {seconds / wall:.2f}" for name, seconds in ranked)
        by_process = textwrap.fill(
            f"by process: {parts};", WIDTH, initial_indent="  ", subsequent_indent="    "
        )
        return (
            f"CPU during the load, in cores of {os.cpu_count()}: the demo's processes "
            f"{sum(used.values()) / wall:.2f} on average, {peak:.2f} in the busiest {window_s} s;\n"
            f"{by_process}\n  the whole machine: {machine:.2f} (with whatever else runs on it)"
        )
