"""Seasonal pre-warming (`spec.scaling.seasonal`): a load that came at this time in each of the
last seasons is expected again, and its replicas are started one model load ahead of it.

Prometheus keeps what each role served. For each of the last `seasons` periods (a day or a
week), the adapter reads the role's demand from the same moment then to HORIZON_SECONDS later:
one `Season` of samples. The forecast for the next `lead` seconds (a model load and a decision
interval) is the least, over the seasons, of each one's peak within the lead: a load that one
season lacked is not expected. It is scaled to how today compares so far: by today's demand over
the seasons' demand at this moment, at most 1. That moment must itself have been busy (at least
TRACKING_FLOOR of the peak): the quiet minutes before a peak say nothing of today, and there the
forecast stands. A holiday's missing peak therefore ends the pre-warming a decision or two into
it.

Pure functions: the operator feeds them Prometheus' history, the simulator its own.
"""

import bisect
import zoneinfo
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from pd_operator.api.spec import SEASON_DAYS

# The furthest ahead a forecast looks: a lead beyond it (a model load over 14 minutes) is
# capped, and its replicas are Ready a little after the load they were started for.
HORIZON_SECONDS = 900
# Samples a season is read at, seconds apart (the default decision interval).
STEP_SECONDS = 30
# The seasons' demand at this moment, as a share of their peak, from which today's demand is
# compared with it.
TRACKING_FLOOR = 0.25

# One past period's demand: (seconds after the moment one or more periods ago, tokens/s).
Season = tuple[tuple[float, float], ...]


@dataclass(frozen=True)
class Forecast:
    """The demand to have capacity for within the lead, and how it was made."""

    tokens_per_second: float
    peak: float  # the least of the seasons' peaks within the lead
    scale: float  # today's demand over the seasons' at this moment, at most 1 (1: not compared)


def forecast(
    seasons: Sequence[Season], lead_seconds: float, today: float | None
) -> Forecast | None:
    """The forecast for the next `lead_seconds`, given today's demand now (tokens/s; None:
    unknown, not compared). None when a season has no sample within the lead."""
    if not seasons:
        return None
    lead = min(lead_seconds, HORIZON_SECONDS)
    peaks = []
    for season in seasons:
        within = [value for offset, value in season if offset <= lead]
        if not within:
            return None
        peaks.append(max(within))
    peak = min(peaks)
    then = min(min(season)[1] for season in seasons)  # each season's earliest sample
    scale = 1.0
    if today is not None and then > 0 and then >= TRACKING_FLOOR * peak:
        scale = min(1.0, today / then)
    return Forecast(peak * scale, peak, scale)


def season_starts(now: float, period: str, seasons: int, time_zone: str) -> tuple[float, ...]:
    """This moment's local time in `time_zone` one, two, ... `seasons` periods ago, as Unix
    times: across a daylight-saving change a day is 23 or 25 hours."""
    local = datetime.fromtimestamp(now, zoneinfo.ZoneInfo(time_zone))
    days = SEASON_DAYS[period]
    # Aware datetime arithmetic moves the wall clock; the zone then gives that day's offset.
    return tuple((local - timedelta(days=k * days)).timestamp() for k in range(1, seasons + 1))


def seasons_from_history(
    times: Sequence[float], values: Sequence[float], starts: Sequence[float]
) -> tuple[Season, ...]:
    """The seasons from `starts` (`season_starts`) in a history of served tokens/s (`values`
    at `times`, in time order), as the adapter reads them from Prometheus; a season the
    history does not reach is empty."""
    out = []
    for start in starts:
        first = bisect.bisect_left(times, start)
        last = bisect.bisect_right(times, start + HORIZON_SECONDS)
        out.append(tuple((times[i] - start, values[i]) for i in range(first, last)))
    return tuple(out)
