"""Seasonal forecasts (`core.seasonal`): the least of the seasons' peaks within the lead, scaled
to how today compares with them, and the floor such a forecast sets in the policy's decisions."""

from dataclasses import replace
from datetime import datetime
from typing import Any
from zoneinfo import ZoneInfo

import pytest

from pd_operator.api.spec import PDDeploymentSpec
from pd_operator.core.policy import Decision, decide
from pd_operator.core.policy_state import PolicyState
from pd_operator.core.seasonal import (
    HORIZON_SECONDS,
    STEP_SECONDS,
    Season,
    forecast,
    season_starts,
    seasons_from_history,
)
from policycases import SPEC, T0, calibrated, limit, observe, on_nodes, replicas, spec_of


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


# ---------------------------------------------------------------- floors in the policy's decisions


SEASONAL = spec_of({"scaling.seasonal": {"period": "Day", "seasons": 2}})
# Without a profile a replica loads in TUNING.default_load_seconds (300 s): the lead is 330 s.
LEAD = 330.0


def seasons_of(*peaks: tuple[float, float]) -> tuple[tuple[tuple[float, float], ...], ...]:
    """Seasons at 300 tokens/s that each rise to `peak` tokens/s `at` seconds from now."""
    return tuple(
        tuple((float(t), peak if t >= at else 300.0) for t in range(0, 901, 30))
        for peak, at in peaks
    )


def seasonal_decision(
    spec: PDDeploymentSpec,
    seasons: tuple[tuple[tuple[float, float], ...], ...],
    *,
    today: dict[str, Any] | None = None,
    state: PolicyState | None = None,
) -> Decision:
    now = T0
    observation = observe(
        spec,
        now,
        {**{("prefill", p.name): 1 for p in spec.prefill.pools}, ("decode", "d"): 1},
        prefill=today or {"ratio": 0.3, "tokens": 300.0},
    )
    with_seasons = replace(
        observation,
        signals={
            **observation.signals,
            "prefill": replace(observation.signals["prefill"], seasons=seasons),
        },
    )
    state = state or calibrated(spec, {"prefill": 1000.0, "decode": 500.0})
    decision = decide(spec, with_seasons, state, now)
    assert decision is not None
    return decision


def test_a_load_every_season_showed_starts_its_replicas_one_load_ahead():
    # Both past days rose to 3,000 tokens/s two minutes from now, within a load and an interval.
    decision = seasonal_decision(SEASONAL, seasons_of((3000, 120), (3200, 120)))
    # 3,000 tokens/s at 80% of 1,000 per replica: 4 replicas, where today's 300 needs 1.
    assert replicas(decision) == 4 and limit(decision) == "forecast"
    assert decision.limited_by == "forecast"
    assert "prefill: p 1->4 limited by forecast" in decision.reason
    (pool,) = [d for d in decision.pools if d.role == "prefill"]
    assert "seasonal forecast (the last 2 days at this time) keeps at least 4" in pool.reason
    assert replicas(decision, "decode", "d") == 1  # no decode history: decode as before


@pytest.mark.parametrize(
    "seasons",
    [
        seasons_of((3000, LEAD + 60), (3000, LEAD + 60)),  # after the lead: not yet
        seasons_of((3000, 120), (300, 120)),  # one day lacked it
        (),  # no history
    ],
)
def test_no_floor_for_a_load_not_due_within_the_lead_or_not_in_every_season(seasons):
    assert replicas(seasonal_decision(SEASONAL, seasons)) == 1


def test_without_seasonal_on_history_changes_nothing():
    assert replicas(seasonal_decision(SPEC, seasons_of((3000, 120), (3000, 120)))) == 1


def test_a_day_without_the_load_its_seasons_had_by_now_gets_no_floor():
    # The seasons already ran 3,000 tokens/s at this moment, and kept it up. Today has no
    # traffic (a holiday), or a tenth of it: the forecast is scaled to today's share.
    busy = tuple(tuple((float(t), 3000.0) for t in range(0, 901, 30)) for _ in range(2))
    holiday = seasonal_decision(SEASONAL, busy, today={"ratio": None, "tokens": None})
    assert replicas(holiday) == 1 and "forecast" not in holiday.reason
    tenth = seasonal_decision(SEASONAL, busy, today={"ratio": 0.3, "tokens": 300.0})
    assert replicas(tenth) == 1 and "forecast" not in tenth.reason
    # Where the seasons were as quiet as today at this moment, today tells nothing: the peak
    # they had two minutes later is expected whole.
    rising = seasonal_decision(SEASONAL, seasons_of((3000, 120), (3000, 120)))
    assert replicas(rising) == 4


def test_a_forecast_fills_the_pools_in_their_order_of_preference():
    spec = spec_of(
        {
            "prefill.pools": [
                {"name": "a", "accelerator": on_nodes("a"), "replicas": {"min": 1, "max": 2}},
                {"name": "b", "accelerator": on_nodes("b"), "replicas": {"min": 0, "max": 10}},
            ],
            "decode.pools.0.accelerator": on_nodes("d"),
            "scaling.seasonal": {"seasons": 2},
        }
    )
    decision = seasonal_decision(spec, seasons_of((3000, 120), (3000, 120)))
    assert replicas(decision, "prefill", "a") == 2  # its max, then the next pool
    assert replicas(decision, "prefill", "b") == 2
    assert limit(decision, "prefill", "b") == "forecast"
