"""Seasonal forecasts (`core.seasonal`): the least of the seasons' peaks within the lead, scaled
to how today compares with them."""

from datetime import datetime
from zoneinfo import ZoneInfo

import pytest

from pd_operator.core.seasonal import (
    HORIZON_SECONDS,
    STEP_SECONDS,
    Season,
    forecast,
    season_starts,
    seasons_from_history,
)


def season(before: float, after: float, at: float) -> Season:
    """A season's samples: `before` tokens/s, then `after` from `at` seconds on."""
    return tuple(
        (float(t), after if t >= at else before)
        for t in range(0, HORIZON_SECONDS + 1, STEP_SECONDS)
    )


def test_a_peak_every_season_showed_within_the_lead_is_expected_at_the_least_of_them():
    seasons = (season(300, 3000, at=120), season(300, 2500, at=180))
    found = forecast(seasons, lead_seconds=330, today=300)
    assert found is not None
    assert found.peak == 2500 and found.scale == 1 and found.tokens_per_second == 2500


def test_a_peak_after_the_lead_is_not_expected_yet():
    seasons = (season(300, 3000, at=600), season(300, 3000, at=600))
    found = forecast(seasons, lead_seconds=330, today=300)
    assert found is not None and found.tokens_per_second == 300


def test_a_peak_one_season_lacked_is_not_expected():
    seasons = (season(300, 3000, at=120), season(300, 300, at=120))
    found = forecast(seasons, lead_seconds=330, today=300)
    assert found is not None and found.tokens_per_second == 300


def test_a_lead_beyond_the_horizon_is_capped():
    seasons = (season(300, 3000, at=HORIZON_SECONDS),)
    found = forecast(seasons, lead_seconds=10 * HORIZON_SECONDS, today=None)
    assert found is not None and found.peak == 3000


@pytest.mark.parametrize(
    ("today", "expected"),
    [
        (3000.0, 3000.0),  # today as busy as the seasons were: the peak as they had it
        (1500.0, 1500.0),  # half as busy: half of it
        (6000.0, 3000.0),  # busier: no more than they had (the latency loop does the rest)
        (0.0, 0.0),  # a holiday: nothing
        (None, 3000.0),  # today unknown: not compared
    ],
)
def test_a_busy_moment_scales_the_forecast_to_how_today_compares(today, expected):
    seasons = (season(3000, 3000, at=0), season(3000, 3000, at=0))
    found = forecast(seasons, lead_seconds=330, today=today)
    assert found is not None and found.tokens_per_second == pytest.approx(expected)


def test_a_quiet_moment_before_a_peak_says_nothing_of_today():
    # At this moment the seasons ran 300 tokens/s, a tenth of their peak: today's 0 or 600
    # is no sign that the peak will not come.
    seasons = (season(300, 3000, at=120),)
    for today in (0.0, 600.0):
        found = forecast(seasons, lead_seconds=330, today=today)
        assert found is not None and found.tokens_per_second == 3000


def test_no_forecast_without_a_sample_of_every_season():
    assert forecast((), lead_seconds=330, today=0) is None
    assert forecast((season(300, 3000, at=0), ()), lead_seconds=330, today=0) is None


def test_seasons_from_history_are_the_horizon_after_each_season_start():
    day = 86_400.0
    times = [float(t) for t in range(0, 4 * 86_400, 30)]
    values = [t // day for t in times]  # the day's number
    now = 3 * day + 3600
    starts = season_starts(now, "Day", 3, "UTC")
    assert starts == (now - day, now - 2 * day, now - 3 * day)
    found = seasons_from_history(times, values, starts)
    assert [len(s) for s in found] == [HORIZON_SECONDS // 30 + 1] * 3
    assert [s[0] for s in found] == [(0.0, 2.0), (0.0, 1.0), (0.0, 0.0)]
    assert found[0][-1][0] == HORIZON_SECONDS
    # A history that does not reach back four days leaves the fourth season empty.
    assert seasons_from_history(times, values, season_starts(now, "Day", 4, "UTC"))[3] == ()


def test_a_season_is_the_same_local_time_across_a_daylight_saving_change():
    # New York moved its clocks forward on 2026-03-08: 09:00 on the 7th was 47 hours before
    # 09:00 on the 9th, not 48.
    now = datetime(2026, 3, 9, 9, 0, tzinfo=ZoneInfo("America/New_York")).timestamp()
    assert [(now - s) / 3600 for s in season_starts(now, "Day", 2, "America/New_York")] == [24, 47]
    assert [(now - s) / 3600 for s in season_starts(now, "Day", 2, "UTC")] == [24, 48]
    assert [(now - s) / 3600 for s in season_starts(now, "Week", 1, "America/New_York")] == [167]
