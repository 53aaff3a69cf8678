"""Scheduled floors: which wall-clock windows are open, with their lead, across days and DST."""

from datetime import datetime

import pytest

from pd_operator.api import parse_pddeployment
from pd_operator.api.spec import ScheduleSpec
from pd_operator.core.schedules import active_floors, floor_open
from pdcases import minimal


def at(text: str) -> float:
    """Unix time of an ISO 8601 time with its offset."""
    return datetime.fromisoformat(text).timestamp()


def schedule(**fields: object) -> ScheduleSpec:
    return ScheduleSpec.model_validate({"name": "peak", "prefill": {"p": 4}, **fields})


OFFICE = schedule(
    timeZone="Asia/Shanghai", days=["Mon", "Tue", "Wed", "Thu", "Fri"], start="09:00", end="18:00"
)


@pytest.mark.parametrize(
    ("when", "lead", "open_"),
    [
        ("2026-11-30T08:59:59+08:00", 0, False),  # Monday, a second before
        ("2026-11-30T09:00:00+08:00", 0, True),
        ("2026-11-30T17:59:59+08:00", 0, True),
        ("2026-11-30T18:00:00+08:00", 0, False),  # the end is not in the window
        ("2026-11-30T08:55:00+08:00", 330, True),  # within the lead
        ("2026-11-30T08:54:00+08:00", 330, False),
        ("2026-11-30T01:00:00+00:00", 0, True),  # the same instant written in UTC
        ("2026-12-05T10:00:00+08:00", 0, False),  # Saturday
        ("2026-12-06T08:56:00+08:00", 330, False),  # Sunday: the lead of no window
        ("2026-12-07T08:56:00+08:00", 330, True),  # Monday's lead
    ],
)
def test_a_window_is_open_on_its_days_from_its_lead_until_its_end(when, lead, open_):
    assert floor_open(OFFICE, at(when), lead) is open_


NIGHT = schedule(days=["Fri"], start="22:00", end="06:00")  # UTC


@pytest.mark.parametrize(
    ("when", "open_"),
    [
        ("2026-12-04T22:00:00+00:00", True),  # Friday night
        ("2026-12-05T05:59:00+00:00", True),  # Saturday morning: Friday's window still open
        ("2026-12-05T06:00:00+00:00", False),
        ("2026-12-05T22:30:00+00:00", False),  # Saturday night: no window starts on Saturday
        ("2026-12-04T05:00:00+00:00", False),  # Friday morning: Thursday has none
    ],
)
def test_a_window_ending_at_or_before_its_start_runs_into_the_next_day(when, open_):
    assert floor_open(NIGHT, at(when), 0) is open_


def test_a_window_from_midnight_to_midnight_is_its_whole_day():
    monday = schedule(days=["Mon"], start="00:00", end="00:00")
    assert floor_open(monday, at("2026-11-30T00:00:00+00:00"), 0)
    assert floor_open(monday, at("2026-11-30T23:59:59+00:00"), 0)
    assert not floor_open(monday, at("2026-12-01T00:00:00+00:00"), 0)


def test_a_lead_reaches_a_window_that_opens_the_next_day():
    early = schedule(days=["Mon"], start="00:30", end="02:00")
    assert floor_open(early, at("2026-11-29T23:45:00+00:00"), 3600)  # Sunday night
    assert not floor_open(early, at("2026-11-29T23:25:00+00:00"), 3600)


def test_windows_are_wall_clock_times_across_a_daylight_saving_change():
    # New York moves its clocks forward on 2026-03-08: 09:30 is 14:30 UTC the day before and
    # 13:30 UTC that day.
    morning = schedule(timeZone="America/New_York", start="09:00", end="10:00")
    assert floor_open(morning, at("2026-03-07T14:30:00+00:00"), 0)
    assert not floor_open(morning, at("2026-03-08T14:30:00+00:00"), 0)
    assert floor_open(morning, at("2026-03-08T13:30:00+00:00"), 0)


DOCUMENT = minimal()
DOCUMENT["spec"]["scaling"] = {
    "schedules": [
        {"name": "day", "start": "08:00", "end": "20:00", "prefill": {"p": 2}},
        {"name": "peak", "start": "12:00", "end": "13:00", "prefill": {"p": 5}, "decode": {"d": 3}},
        {"name": "soon", "start": "14:00", "end": "15:00", "leadSeconds": 0, "prefill": {"p": 9}},
    ]
}
TWO = parse_pddeployment(DOCUMENT).spec


def test_the_highest_open_floor_holds_each_pool_and_the_default_lead_is_a_load_and_an_interval():
    def floors(when: str, load: float = 300.0) -> dict[tuple[str, str], tuple[int, str]]:
        found = active_floors(TWO, at(when), lambda role, pool: load)
        return {key: (floor.replicas, floor.name) for key, floor in found.items()}

    assert floors("2026-11-30T12:30:00+00:00") == {
        ("prefill", "p"): (5, "peak"),
        ("decode", "d"): (3, "peak"),
    }
    # 330 s ahead (300 s to load, 30 s decision interval) peak's floors apply; 331 s, not.
    assert floors("2026-11-30T11:54:30+00:00") == {
        ("prefill", "p"): (5, "peak"),
        ("decode", "d"): (3, "peak"),
    }
    assert floors("2026-11-30T11:54:29+00:00") == {("prefill", "p"): (2, "day")}
    # A slower load starts earlier.
    assert floors("2026-11-30T11:50:00+00:00", load=600.0)[("prefill", "p")] == (5, "peak")
    # leadSeconds 0: from the start exactly.
    assert floors("2026-11-30T13:59:59+00:00")[("prefill", "p")] == (2, "day")
    assert floors("2026-11-30T14:00:00+00:00")[("prefill", "p")] == (9, "soon")
    assert floors("2026-11-30T21:00:00+00:00") == {}
