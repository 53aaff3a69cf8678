"""Coupled scale to zero (`spec.scaling.idleSeconds`): the rule (`core.idle`) and the autoscaler
acting on it. A fake stands in for the Prometheus reader only."""

import copy

import pytest

from pd_operator.adapters.cache import ClusterCache
from pd_operator.adapters.prometheus import ReadReport
from pd_operator.api import parse_pddeployment
from pd_operator.core.idle import IdleMemory, apply_idle
from pd_operator.core.signals import RoleSignals, RouterTraffic, unavailable
from pd_operator.handlers.autoscaler import WAKE_CHECK_SECONDS, Autoscaler
from pdcases import IDLE, pool_deployment

IDLE_SECONDS = 300
SPEC = parse_pddeployment(IDLE).spec
P, D = ("prefill", "p"), ("decode", "d")
UP = {P: 1, D: 1}
ZERO = {P: 0, D: 0}


def traffic(requests: float = 10, pending: float = 0, in_flight: float = 0) -> RouterTraffic:
    return RouterTraffic(requests_total=requests, pending=pending, in_flight=in_flight)


def test_without_idle_seconds_the_policy_replicas_pass_through() -> None:
    spec = parse_pddeployment(copy.deepcopy(IDLE) | {"spec": {**IDLE["spec"], "scaling": {}}}).spec
    out = apply_idle(spec, None, UP, ZERO, memory=IdleMemory(), now=0)
    assert out.replicas == ZERO and not out.scaled_to_zero and out.reason == ""


@pytest.mark.parametrize(
    ("case", "now", "seen", "expected", "at_zero"),
    [
        # Quiet for less than idleSeconds: stays up.
        ("quiet-299s", 1299, traffic(), UP, False),
        # Quiet for idleSeconds, nothing in flight: both roles to zero in one decision.
        ("quiet-300s", 1300, traffic(), ZERO, True),
        # A request in flight (a long generation) is traffic, however long ago it came.
        ("in-flight", 5000, traffic(in_flight=1), UP, False),
        # A new request (the counter moved) is traffic.
        ("new-request", 5000, traffic(requests=11), UP, False),
        # A router restart resets the counter: also a change, so also traffic.
        ("counter-reset", 5000, traffic(requests=0), UP, False),
    ],
)
def test_awake_pools_go_to_zero_together_only_after_idle_seconds_of_no_traffic(
    case, now, seen, expected, at_zero
) -> None:
    memory = IdleMemory(requests_total=10, active_at=1000)
    out = apply_idle(SPEC, seen, UP, UP, memory=memory, now=now)
    assert out.replicas == expected, case
    assert out.scaled_to_zero is at_zero, case
    if at_zero:
        assert "no request at the router for 300s" in out.reason


def test_awake_no_role_drops_to_zero_while_the_other_serves() -> None:
    # With replicas.min 0 the policy may shed a role's last replica; a request needs both.
    memory = IdleMemory(requests_total=10, active_at=1000)
    out = apply_idle(SPEC, traffic(), UP, {P: 0, D: 2}, memory=memory, now=1100)
    assert out.replicas == {P: 1, D: 2} and not out.scaled_to_zero


def test_at_zero_a_held_request_wakes_both_roles_in_one_decision() -> None:
    memory = IdleMemory(requests_total=10, active_at=0)
    out = apply_idle(SPEC, traffic(requests=11, pending=1, in_flight=1), ZERO, ZERO,
                     memory=memory, now=9000)  # fmt: skip
    assert out.replicas == UP and not out.scaled_to_zero
    assert out.reason == "waking from zero: 1 request(s) held at the router, both roles start"
    assert out.memory.active_at == 9000  # the idle clock starts again


def test_at_zero_without_traffic_stays_at_zero() -> None:
    memory = IdleMemory(requests_total=10, active_at=0)
    out = apply_idle(SPEC, traffic(), ZERO, UP, memory=memory, now=9000)
    assert out.replicas == ZERO and out.scaled_to_zero


def test_unknown_traffic_is_never_idleness() -> None:
    memory = IdleMemory(requests_total=10, active_at=0)
    awake = apply_idle(SPEC, None, UP, UP, memory=memory, now=99999)
    assert awake.replicas == UP and not awake.scaled_to_zero and not awake.traffic_known
    # At zero nothing can be woken without it; the reason says why.
    asleep = apply_idle(SPEC, None, ZERO, UP, memory=memory, now=99999)
    assert asleep.replicas == ZERO and "no activator metrics" in asleep.reason


def test_the_idle_clock_starts_at_the_first_reading() -> None:
    # A restarted operator knows no history: it waits a whole idleSeconds again.
    out = apply_idle(SPEC, traffic(), UP, UP, memory=IdleMemory(), now=5000)
    assert out.replicas == UP and out.memory == IdleMemory(requests_total=10, active_at=5000)


class RouterOnlyReader:
    """A Prometheus with the activator's series only: no engine latency (none runs at zero, and
    a quiet engine has no percentile either)."""

    seen: RouterTraffic | None = None

    def __init__(self, url, *, bearer_token=None, ca_path=None):
        self.url = url

    def read(self, targets, now):
        signals = {}
        for t in targets:
            assert t.router_traffic, "an object with idleSeconds asks for the router's traffic"
            for role in ("prefill", "decode"):
                signals[(t.namespace, t.name, role)] = RoleSignals(
                    sample_time=now,
                    ttft_seconds=unavailable("no series: no traffic"),
                    itl_seconds=unavailable("no series: no traffic"),
                    router_traffic=RouterOnlyReader.seen,
                )
        return signals, ReadReport(queries=1)


def conditions(view) -> dict[str, tuple[bool | None, str, str]]:
    return {c.type: (c.status, c.reason, c.message) for c in view.conditions}


def test_the_autoscaler_takes_an_idle_object_to_zero_and_wakes_it_for_a_held_request() -> None:
    body = copy.deepcopy(IDLE)
    body["metadata"] |= {"namespace": "llm", "uid": "u1", "generation": 1}
    body["spec"]["scaling"] |= {"prometheus": {"url": "http://prometheus:9090"}}
    key = ("llm", "minimal")
    cache = ClusterCache()
    cache.put_pdd(body)
    cache.put_child(pool_deployment("prefill", "p", 1))
    cache.put_child(pool_deployment("decode", "d", 1))
    clock = [1000.0]
    scaler = Autoscaler(cache, lambda keys: None, readers=RouterOnlyReader, clock=lambda: clock[0])
    RouterOnlyReader.seen = traffic(requests=5)
    assert scaler.cycle() == 1
    assert scaler.decisions_for(key).replicas == UP

    clock[0] += IDLE_SECONDS  # no new request since the first reading
    assert scaler.cycle() == 1
    assert scaler.decisions_for(key).replicas == ZERO
    view = scaler.view_for(key)
    status, reason, message = conditions(view)["ScaledToZero"]
    assert (status, reason) == (True, "Idle") and "idleSeconds 300" in message
    # No engine runs, so none exports: that is not a metrics fault while at zero.
    assert conditions(view)["MetricsAvailable"][:2] == (True, "ScaledToZero")

    # The reconciler applied the zero; a request arrives and is held by the activator.
    cache.put_child(pool_deployment("prefill", "p", 0))
    cache.put_child(pool_deployment("decode", "d", 0))
    RouterOnlyReader.seen = traffic(requests=6, pending=1, in_flight=1)
    clock[0] += WAKE_CHECK_SECONDS  # looked at again long before the 30 s interval
    assert scaler.cycle() == 1
    assert scaler.decisions_for(key).replicas == UP
    status, reason, message = conditions(scaler.view_for(key))["ScaledToZero"]
    assert (status, reason) == (False, "Serving") and "1 request(s) held" in message
