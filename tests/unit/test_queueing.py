"""The queueing estimates behind the planner's TTFT and the autoscaler's prefill margins."""

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pd_operator.core.queueing import (
    MAX_UTILISATION,
    attained_share,
    erlang_c,
    exponential_lengths,
    pooled_utilisation,
)


@pytest.mark.parametrize(
    ("servers", "utilisation", "expected"),
    [
        (1, 0.5, 0.5),  # M/M/1: an arrival waits whenever the server is busy
        (1, 0.9, 0.9),
        (2, 0.5, 2 * 0.5**2 / (1 + 0.5)),  # M/M/2's closed form
        (2, 0.8, 2 * 0.8**2 / (1 + 0.8)),
        (4, 1.0, 1.0),  # saturated: everyone waits
    ],
)
def test_erlang_c_matches_closed_forms(servers, utilisation, expected):
    assert erlang_c(servers, utilisation) == pytest.approx(expected)


@given(st.floats(0.05, 0.95), st.integers(1, 31))
def test_a_larger_pool_at_the_same_utilisation_makes_fewer_wait(utilisation, servers):
    assert erlang_c(servers + 1, utilisation) < erlang_c(servers, utilisation)


def test_attained_share_counts_only_requests_that_can_make_it():
    latencies = [(0.5, 0.5), (2.0, 0.3), (9.0, 0.2)]  # the last is slower than 6 s alone
    assert attained_share(latencies, 0.0, 1.0, 6.0) == pytest.approx(0.8)
    # Waiting with probability 0.5 an exponential 1 s: the first misses with e^-5.5 / 2.
    expected = 0.5 * (1 - 0.5 * math.exp(-5.5)) + 0.3 * (1 - 0.5 * math.exp(-4.0))
    assert attained_share(latencies, 0.5, 1.0, 6.0) == pytest.approx(expected)


def test_exponential_lengths_have_the_mean():
    lengths = exponential_lengths(1000.0, 64)
    assert sum(lengths) / len(lengths) == pytest.approx(1000.0, rel=0.03)
    assert lengths == sorted(lengths)


def service_times(mean_s: float) -> list[float]:
    return [x / 1000 * mean_s for x in exponential_lengths(1000.0, 16)]


def test_short_services_against_a_long_target_allow_the_highest_utilisation():
    # 40 ms prompts against 6 s: the queue stays far under the target even at 95%.
    assert pooled_utilisation(service_times(0.04), 6.0, 0.99, 1) == MAX_UTILISATION


def test_services_long_against_the_target_allow_less_and_a_larger_pool_more():
    alone = pooled_utilisation(service_times(0.8), 6.0, 0.99, 1)
    pooled = [pooled_utilisation(service_times(0.8), 6.0, 0.99, k) for k in (2, 4, 8)]
    assert 0 < alone < 0.6
    assert [alone, *pooled] == sorted([alone, *pooled])
    assert pooled[-1] > 0.8  # eight replicas pool their queue: waits are short and rare


@given(st.floats(0.01, 2.0), st.floats(0.5, 0.999), st.integers(1, 16))
def test_the_utilisation_found_meets_the_share_and_a_tighter_one_does_not_allow_more(
    mean_s, share, servers
):
    services = service_times(mean_s)
    found = pooled_utilisation(services, 6.0, share, servers)
    assert 0 <= found <= MAX_UTILISATION
    assert pooled_utilisation(services, 6.0, min(share + 0.0005, 0.9999), servers) <= found
    # A tighter target allows no more while the same requests stay feasible (a request slower
    # than the target alone leaves the share's base, which can raise what the rest allow).
    if max(services) <= 3.0:
        assert pooled_utilisation(services, 3.0, share, servers) <= found


def test_nothing_feasible_allows_nothing():
    assert pooled_utilisation([7.0, 8.0], 6.0, 0.99, 4) == 0.0
