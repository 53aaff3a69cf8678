"""Scheduled floors: which wall-clock windows are open, with their lead, across days and DST,
and the floor the policy holds a pool at while one is open."""

import math
from dataclasses import replace
from datetime import datetime

import pytest

from pd_operator.api import parse_pddeployment
from pd_operator.api.spec import PDDeploymentSpec, ScheduleSpec
from pd_operator.core.policy import Decision, Observation, PoolObservation, decide
from pd_operator.core.policy_state import PolicyState
from pd_operator.core.schedules import active_floors, floor_open
from pd_operator.core.signals import RoleSignals, unavailable
from pdcases import minimal
from policycases import (
    INTERVAL,
    LONG_WINDOW_ONLY,
    calibrated,
    limit,
    observe,
    replicas,
    run,
    spec_of,
)


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


# ---------------------------------------------------------------- floors in the policy's decisions


OFFICE_HOURS = spec_of(
    {
        "scaling.schedules": [
            {
                "name": "office",
                "timeZone": "Asia/Shanghai",
                "days": ["Mon", "Tue", "Wed", "Thu", "Fri"],
                "start": "09:00",
                "end": "18:00",
                "prefill": {"p": 4},
            }
        ]
    }
)
MONDAY_9 = datetime.fromisoformat("2026-11-30T09:00:00+08:00").timestamp()
QUIET = {"ratio": 0.3, "tokens": 300.0}


def across(
    spec: PDDeploymentSpec, start: float, end: float, prefill: int, state: PolicyState
) -> list[Decision]:
    """Decide every INTERVAL from `start` to before `end` under a quiet load."""
    steps = math.ceil((end - start) / INTERVAL)
    initial = {("prefill", "p"): prefill, ("decode", "d"): 1}
    return run(spec, state, initial, steps, now=start, prefill=QUIET)


def test_a_schedule_holds_its_floor_from_one_model_load_before_it_opens_until_it_closes():
    # No profile: a replica is expected to take TUNING.default_load_seconds (300 s) to load, so the
    # floor starts 330 s (one load and one interval) before 09:00.
    state = calibrated(OFFICE_HOURS, {"prefill": 1000.0, "decode": 500.0})
    before = across(OFFICE_HOURS, MONDAY_9 - 600, MONDAY_9 - 330, 1, state)
    assert {d.role_replicas("prefill") for d in before} == {1}
    opening = across(OFFICE_HOURS, MONDAY_9 - 330, MONDAY_9 - 300, 1, before[-1].state)[0]
    assert replicas(opening) == 4 and limit(opening) == "schedule"
    assert opening.limited_by == "schedule"
    assert "prefill: p 1->4 limited by schedule office" in opening.reason
    (pool,) = [d for d in opening.pools if d.role == "prefill"]
    assert "schedule office (09:00-18:00 Asia/Shanghai) keeps at least 4" in pool.reason
    # The quiet load would have 1 replica; the floor holds 4 all day.
    day = across(OFFICE_HOURS, MONDAY_9, MONDAY_9 + 9 * 3600, 4, opening.state)
    assert {d.role_replicas("prefill") for d in day} == {4}
    # At 18:00 the floor lifts and the pool sheds as after lowering replicas.min, under the
    # scale-down rules: this quiet load was steady all day, so the short window (60 s), one
    # step per decision...
    evening = across(OFFICE_HOURS, MONDAY_9 + 9 * 3600, MONDAY_9 + 9 * 3600 + 600, 4, day[-1].state)
    assert [d.role_replicas("prefill") for d in evening][:5] == [4, 3, 2, 1, 1]
    # ...and with the long window only, 300 s first.
    patient = OFFICE_HOURS.model_copy(
        update={
            "scaling": LONG_WINDOW_ONLY.scaling.model_copy(
                update={"schedules": OFFICE_HOURS.scaling.schedules}
            )
        }
    )
    day = across(patient, MONDAY_9 + 8 * 3600, MONDAY_9 + 9 * 3600, 4, day[-1].state)
    evening = across(patient, MONDAY_9 + 9 * 3600, MONDAY_9 + 9 * 3600 + 600, 4, day[-1].state)
    sizes = [d.role_replicas("prefill") for d in evening]
    assert sizes[:9] == [4] * 9 and sizes[9] == 3 and sizes[-1] == 1  # 300 s after 17:59:30


def test_a_floor_beyond_one_step_applies_at_once_and_is_said_once():
    # Like a raised min, a floor is a bound: the step limit (4 per decision) does not apply.
    spec = spec_of(
        {
            "scaling.schedules": [
                {"name": "launch", "start": "00:00", "end": "00:00", "prefill": {"p": 9}}
            ]
        }
    )
    state = calibrated(spec, {"prefill": 1000.0, "decode": 500.0})
    quiet = observe(spec, MONDAY_9, {("prefill", "p"): 1, ("decode", "d"): 1}, prefill=QUIET)
    decision = decide(spec, quiet, state, MONDAY_9)
    assert replicas(decision) == 9 and limit(decision) == "schedule"
    assert decision is not None
    (pool,) = [d for d in decision.pools if d.role == "prefill"]
    assert pool.reason.count("schedule launch") == 1


def test_a_schedule_is_a_floor_not_a_cap_and_applies_on_its_days_only():
    state = calibrated(OFFICE_HOURS, {"prefill": 1000.0, "decode": 500.0})
    busy = observe(
        OFFICE_HOURS,
        MONDAY_9 + 3600,
        {("prefill", "p"): 4, ("decode", "d"): 1},
        prefill={"ratio": 1.5, "tokens": 6000.0},
    )
    assert replicas(decide(OFFICE_HOURS, busy, state, MONDAY_9 + 3600)) > 4
    saturday = MONDAY_9 + 5 * 86400 + 3600
    quiet = observe(OFFICE_HOURS, saturday, {("prefill", "p"): 1, ("decode", "d"): 1})
    decision = decide(OFFICE_HOURS, quiet, state, saturday)
    assert replicas(decision) == 1 and limit(decision) != "schedule"


def test_a_schedule_warms_its_pools_even_while_the_metrics_are_unreadable():
    now, refused = MONDAY_9 - 60, unavailable("prometheus: connection refused")
    observation = Observation(
        {
            "prefill": RoleSignals(now, ttft_seconds=refused),
            "decode": RoleSignals(now, itl_seconds=refused),
        },
        {("prefill", "p"): PoolObservation(1, 1), ("decode", "d"): PoolObservation(1, 1)},
    )
    decision = decide(OFFICE_HOURS, observation, PolicyState(), now)
    assert replicas(decision) == 4 and limit(decision) == "schedule"
    assert replicas(decision, "decode", "d") == 1 and limit(decision, "decode", "d") == "metrics"


@pytest.mark.parametrize(
    ("load_seconds", "lead_seconds", "floored_from"),
    [
        (600.0, None, 630.0),  # the pool's measured load time, and one interval
        (600.0, 0, 0.0),  # leadSeconds 0: from the start exactly
        (600.0, 120, 120.0),
    ],
)
def test_the_floor_starts_one_measured_load_ahead_unless_lead_seconds_says(
    load_seconds, lead_seconds, floored_from
):
    schedule = dict(OFFICE_HOURS.scaling.schedules[0].model_dump(by_alias=True))
    schedule["leadSeconds"] = lead_seconds
    spec = spec_of({"scaling.schedules": [schedule]})
    state = calibrated(spec, {"prefill": 1000.0, "decode": 500.0})
    state = replace(
        state,
        pools={
            **state.pools,
            "prefill/p": replace(state.pool("prefill", "p"), load_seconds=load_seconds),
        },
    )

    def size(now: float) -> int:
        observation = observe(spec, now, {("prefill", "p"): 1, ("decode", "d"): 1}, prefill=QUIET)
        return replicas(decide(spec, observation, state, now))

    assert size(MONDAY_9 - floored_from) == 4
    assert size(MONDAY_9 - floored_from - 1) == 1
