"""Scheduled replica floors (`spec.scaling.schedules`): a known peak, pre-warmed.

A schedule raises the `replicas.min` of the pools it names while its window is open, and from
a lead time before it opens: by default the pool's model-load time plus one decision interval,
so the replicas are Ready when the window opens. A load that only grows when the latency shows
it waits one model load for its replicas; a peak that comes at a known hour need not.
Windows are wall-clock times in the schedule's time zone, so they follow daylight-saving
changes. Pure functions of the spec and the time: the simulator and the operator call the same.
"""

import functools
import zoneinfo
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import date, datetime, time, timedelta

from pd_operator.api.spec import (
    ROLE_NAMES,
    WEEKDAYS,
    PDDeploymentSpec,
    PoolSpec,
    Role,
    ScheduleSpec,
)
from pd_operator.api.status import LimitedBy
from pd_operator.core.children import PoolKey


@dataclass(frozen=True)
class Floor:
    """The fewest replicas a schedule (or the seasonal forecast, `core.seasonal`) keeps a pool
    at now: a raised `replicas.min`."""

    replicas: int
    # In words, the same for the floor's whole window: it lands in status, and a text that
    # changed every cycle would cost a status write every cycle.
    note: str
    limit: LimitedBy = "schedule"
    name: str = ""  # the schedule's


def schedule_floor(schedule: ScheduleSpec, replicas: int) -> Floor:
    s = schedule
    note = f"schedule {s.name} ({s.start}-{s.end} {s.time_zone}) keeps at least {replicas}"
    return Floor(replicas, note, "schedule", s.name)


def windows(schedule: ScheduleSpec, first: date, last: date) -> Iterator[tuple[float, float]]:
    """The schedule's windows, as (open, close) Unix times, that start on a day from `first`
    to `last` (local dates, both included), in order."""
    zone = zoneinfo.ZoneInfo(schedule.time_zone)
    start, end = _clock(schedule.start), _clock(schedule.end)
    day = first
    while day <= last:
        if WEEKDAYS[day.weekday()] in schedule.days:
            opens = datetime.combine(day, start, zone)
            closes = datetime.combine(day + timedelta(days=end <= start), end, zone)
            yield opens.timestamp(), closes.timestamp()
        day += timedelta(days=1)


@functools.lru_cache(maxsize=64)
def _clock(text: str) -> time:
    hours, minutes = text.split(":")
    return time(int(hours), int(minutes))


def floor_open(schedule: ScheduleSpec, now: float, lead_seconds: float) -> bool:
    """Whether the schedule's floors apply at `now`: a window is open, or opens within
    `lead_seconds`."""
    zone = zoneinfo.ZoneInfo(schedule.time_zone)
    # A window that started the day before may still be open; one that opens within the lead
    # may start on a later day.
    first = datetime.fromtimestamp(now, zone).date() - timedelta(days=1)
    last = datetime.fromtimestamp(now + lead_seconds, zone).date()
    return any(
        opens - lead_seconds <= now < closes for opens, closes in windows(schedule, first, last)
    )


def active_floors(
    spec: PDDeploymentSpec, now: float, load_seconds: Callable[[Role, PoolSpec], float]
) -> dict[PoolKey, Floor]:
    """The highest floor each pool is held at now, for pools some schedule holds.
    `load_seconds(role, pool)`: the pool's expected model-load time, for the default lead."""
    floors: dict[PoolKey, Floor] = {}
    interval = float(spec.scaling.interval_seconds)
    for schedule in spec.scaling.schedules:
        for role in ROLE_NAMES:
            named: dict[str, int] = getattr(schedule, role)
            for pool in spec.pools(role):
                replicas, held = named.get(pool.name), floors.get((role, pool.name))
                if replicas is None or (held is not None and replicas <= held.replicas):
                    continue
                lead = (
                    load_seconds(role, pool) + interval
                    if schedule.lead_seconds is None
                    else float(schedule.lead_seconds)
                )
                if floor_open(schedule, now, lead):
                    floors[(role, pool.name)] = schedule_floor(schedule, replicas)
    return floors
