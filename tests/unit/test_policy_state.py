"""The policy's memory between decisions: plain JSON that a restart resumes from."""

import json

import pytest

from pd_operator.core.policy import decide
from pd_operator.core.policy_state import PolicyState, PoolMemory, RoleMemory
from policycases import PROFILED, T0, observe, run


def test_the_state_survives_a_json_round_trip():
    decisions = run(
        PROFILED,
        PolicyState(),
        {("prefill", "p"): 1, ("decode", "d"): 1},
        5,
        prefill={"ratio": 1.5, "tokens": 20000.0},
    )
    state = decisions[-1].state
    restored = PolicyState.from_dict(json.loads(json.dumps(state.to_dict())))
    assert restored == state
    observation = observe(PROFILED, T0 + 600, {("prefill", "p"): 3, ("decode", "d"): 1})
    assert decide(PROFILED, observation, restored, T0 + 600) == decide(
        PROFILED, observation, state, T0 + 600
    )
    with pytest.raises(ValueError, match="unreadable"):
        PolicyState.from_dict({"pools": {"prefill/p": {"since": "yesterday"}}})


def test_every_field_of_the_state_is_plain_json():
    full = PolicyState(
        pools={
            "prefill/p": PoolMemory(
                recommendations=((T0, T0 + 30, 3),),
                since=T0,
                capacity_per_replica=1234.5,
                load_seconds=80.0,
                scaled_up_at=T0,
                scaled_up_to=4,
                ready_by=T0 + 80,
                ready_runs=((T0, 2), (T0 + 30, 3)),
                shed_at=T0 - 60,
                shed_wait=420.0,
            )
        },
        roles={
            "prefill": RoleMemory(
                capacity_basis="observed",
                capacity_factor=0.62,
                latency_ratio_at_scale_up=1.4,
                demand_at_scale_up=5e4,
                ready_at_scale_up=3,
                futile_ratio=1.3,
                no_traffic_since=T0,
                unavailable_since=T0,
                stuck_since=T0,
                running_mean=24.0,
                running_change_square_mean=700.0,
                running_last=20.0,
                kv_tokens_mean=2.9e5,
                kv_sequences_mean=100.0,
                recent=((T0, 5e4, 0.4), (T0 + 30, None, None)),
            )
        },
    )
    data = full.to_dict()
    assert json.loads(json.dumps(data, allow_nan=False)) == data  # lists, not tuples; no NaN
    assert PolicyState.from_dict(data) == full
    assert PolicyState.from_dict({**data, "future": 1}) == full
    for bad in ({"ready_runs": [[T0, -1]]}, {"ready_runs": [[T0, 2.5]]}, {"scaled_up_to": True}):
        with pytest.raises(ValueError, match="unreadable"):
            PolicyState.from_dict({"pools": {"prefill/p": bad}})
    with pytest.raises(ValueError, match="unreadable"):
        PolicyState.from_dict({"roles": {"prefill": {"ready_at_scale_up": "3"}}})
    with pytest.raises(ValueError, match="unreadable"):
        PolicyState.from_dict({"roles": {"prefill": {"recent": [[T0, "lots", 0.4]]}}})
