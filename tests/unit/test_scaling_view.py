"""What a decision puts into status: conditions, events on transitions only, and no status write
for a steady object."""

from dataclasses import replace

from pd_operator.api.document import parse_pddeployment
from pd_operator.core.capacity import free_capacity
from pd_operator.core.decision import Decision, Observation, PoolObservation, ScaleRecord
from pd_operator.core.observe import NodeSummary, PodSummary
from pd_operator.core.policy_state import PolicyState
from pd_operator.core.scaling_view import (
    REFRESH_SECONDS,
    damp_churn,
    finish_scales,
    iso,
    scaling_outcome,
    transition_events,
    unreported_scales,
)
from pd_operator.core.signals import Reading, RoleSignals, unavailable
from pdcases import minimal

SPEC = parse_pddeployment({**minimal(), "metadata": {"name": "m", "namespace": "llm"}}).spec
NOW = 1_000_000.0


def observation(ttft: Reading, itl: Reading, ready: int = 1) -> Observation:
    prefill = RoleSignals(sample_time=NOW, ttft_seconds=ttft, requests_per_second=Reading.of(2.0))
    return Observation(
        signals={"prefill": prefill, "decode": RoleSignals(sample_time=NOW, itl_seconds=itl)},
        pools={
            ("prefill", "p"): PoolObservation(1, ready),
            ("decode", "d"): PoolObservation(1, ready),
        },
    )


def decision(prefill: int = 1, limited_by: str = "none") -> Decision:
    return Decision(
        time=NOW, replicas={("prefill", "p"): prefill, ("decode", "d"): 1}, pools=(),
        reason="because", limited_by=limited_by, state=PolicyState(),
    )  # fmt: skip


def conditions(view) -> dict[str, tuple[bool | None, str]]:
    return {c.type: (c.status, c.reason) for c in view.conditions}


def status_of(view) -> dict:
    """What the reconciler writes from a view."""
    return {
        "observed": view.observed,
        "lastDecision": view.last_decision,
        "policyMemory": view.policy_memory,
        "conditions": [
            {"type": c.type, "status": {True: "True", False: "False", None: "Unknown"}[c.status]}
            for c in view.conditions
        ],
    }


def test_slo_and_metrics_conditions_follow_the_readings():
    # Targets: TTFT 1000 ms, ITL 20 ms.
    ok = scaling_outcome(SPEC, observation(Reading.of(0.5), Reading.of(0.01)), decision(),
                         no_series={}, now=NOW)  # fmt: skip
    assert conditions(ok.view) == {
        "MetricsAvailable": (True, "AsExpected"),
        "MetricsConfigured": (True, "AsExpected"),
        "SLOMet": (True, "WithinSLO"),
        "CapacityAvailable": (True, "AsExpected"),
    }
    assert ok.view.observed == {
        "ttftMilliseconds": 500, "itlMilliseconds": 10, "requestsPerSecond": 2.0,
        "sampleTime": "1970-01-12T13:46:40Z",
    }  # fmt: skip
    breach = scaling_outcome(
        SPEC, observation(Reading.of(1.5), Reading.of(0.01)), decision(2, "capacity"),
        no_series={}, now=NOW,
    )  # fmt: skip
    assert conditions(breach.view)["SLOMet"] == (False, "SLOViolated")
    assert conditions(breach.view)["CapacityAvailable"] == (False, "CapacityExhausted")
    unknown = scaling_outcome(
        SPEC, observation(unavailable("timeout"), Reading.of(0.01)), decision(), no_series={},
        now=NOW,
    )  # fmt: skip
    assert conditions(unknown.view)["SLOMet"] == (None, "MetricsUnavailable")
    assert conditions(unknown.view)["MetricsAvailable"] == (False, "MetricsUnavailable")
    assert unknown.slo_met == (None, True) and set(unknown.missing) == {"prefill"}
    assert "ttftMilliseconds" not in unknown.view.observed  # unknown is absent, never 0


def test_no_series_is_misconfigured_only_with_ready_pods_after_the_grace():
    # Grace: the SLO window (60 s) plus one interval (30 s).
    lost = unavailable('no series: histogram_quantile(0.5, ...{role="prefill"}...)')
    seen = observation(lost, Reading.of(0.01))
    early = scaling_outcome(SPEC, seen, decision(), no_series={"prefill": NOW - 60}, now=NOW)
    assert conditions(early.view)["MetricsConfigured"] == (None, "NoReadyPods")
    late = scaling_outcome(SPEC, seen, decision(), no_series={"prefill": NOW - 91}, now=NOW)
    configured = next(c for c in late.view.conditions if c.type == "MetricsConfigured")
    assert (configured.status, configured.reason) == (False, "MetricsMisconfigured")
    assert configured.message.startswith("prefill: 1 pods Ready but no series: histogram_quantile")
    not_ready = scaling_outcome(
        SPEC, observation(lost, Reading.of(0.01), ready=0), decision(),
        no_series={"prefill": None}, now=NOW,
    )  # fmt: skip
    assert conditions(not_ready.view)["MetricsConfigured"] == (None, "NoReadyPods")
    outage = scaling_outcome(SPEC, seen, decision(), no_series={}, now=NOW)  # not a no-series
    assert conditions(outage.view)["MetricsConfigured"] == (True, "AsExpected")


def test_a_steady_object_keeps_its_status_until_the_refresh():
    first = scaling_outcome(SPEC, observation(Reading.of(0.5), Reading.of(0.01)), decision(),
                            no_series={}, now=NOW).view  # fmt: skip
    status = status_of(first)
    # 1% later the latency moved by 2%, within the tolerance: the view is the status as it is.
    later = scaling_outcome(SPEC, observation(Reading.of(0.51), Reading.of(0.01)), decision(),
                            no_series={}, now=NOW + 30).view  # fmt: skip
    damp_churn(later, status, NOW + 30)
    assert status_of(later) == status
    # A new decision is written (with the memory of that moment).
    grown = scaling_outcome(SPEC, observation(Reading.of(0.51), Reading.of(0.01)), decision(2),
                            no_series={}, now=NOW + 30).view  # fmt: skip
    damp_churn(grown, status, NOW + 30)
    assert grown.last_decision["prefillReplicas"] == 2
    assert grown.last_decision["time"] != status["lastDecision"]["time"]
    # After the refresh interval, the same values are written again, with their new time.
    stale = scaling_outcome(SPEC, observation(Reading.of(0.5), Reading.of(0.01)), decision(),
                            no_series={}, now=NOW + REFRESH_SECONDS).view  # fmt: skip
    damp_churn(stale, status, NOW + REFRESH_SECONDS)
    assert stale.observed["sampleTime"] != status["observed"]["sampleTime"]


def test_events_come_on_transitions_only():
    seen = observation(Reading.of(1.5), Reading.of(0.01))
    view = scaling_outcome(SPEC, seen, decision(2), no_series={}, now=NOW).view
    events = transition_events({}, view, decision(2), seen, advisory=False)
    assert [(e.type, e.reason) for e in events] == [
        ("Warning", "SLOViolated"), ("Normal", "ScaledUp")
    ]  # fmt: skip
    assert events[1].message == "prefill pool p: 1 -> 2: because"
    # The same breach again, already in status, and no scale step: nothing new to say.
    again = transition_events(status_of(view), view, decision(1), seen, advisory=False)
    assert again == []
    advisory = transition_events(status_of(view), view, decision(2), seen, advisory=True)
    assert advisory[0].message == "prefill pool p: 1 -> 2 (advisory): because"


def test_seasonal_history_says_whether_prometheus_holds_every_season():
    seasonal = parse_pddeployment(
        {
            **minimal(),
            "metadata": {"name": "m", "namespace": "llm"},
            "spec": {**minimal()["spec"], "scaling": {"seasonal": {"seasons": 3}}},
        }
    ).spec
    sample = ((0.0, 300.0), (30.0, 300.0))

    def history(prefill: int, decode: int, itl: Reading | None = None) -> dict:
        seen = observation(Reading.of(0.5), itl or Reading.of(0.01))
        signals = {
            "prefill": replace(
                seen.signals["prefill"], seasons=(sample,) * prefill + ((),) * (3 - prefill)
            ),
            "decode": replace(
                seen.signals["decode"], seasons=(sample,) * decode + ((),) * (3 - decode)
            ),
        }
        view = scaling_outcome(
            seasonal, replace(seen, signals=signals), decision(), no_series={}, now=NOW
        ).view
        return {c.type: c for c in view.conditions}

    found = history(3, 3)["SeasonalHistory"]
    assert (found.status, found.reason) == (True, "HistoryFound")
    assert found.message == "the last 3 days found for every role"
    short = history(1, 3)["SeasonalHistory"]
    assert (short.status, short.reason) == (False, "HistoryMissing")
    assert short.message.startswith("history found for prefill 1 of 3 days")
    assert "lower spec.scaling.seasonal.seasons" in short.message
    unknown = history(0, 0, itl=unavailable("down"))["SeasonalHistory"]
    assert (unknown.status, unknown.reason) == (None, "MetricsUnavailable")
    # Without seasonal, no such condition.
    plain = scaling_outcome(
        SPEC, observation(Reading.of(0.5), Reading.of(0.01)), decision(), no_series={}, now=NOW
    )
    assert "SeasonalHistory" not in conditions(plain.view)


def on_nodes(
    seen: Observation, nodes: list[NodeSummary], pods: list[PodSummary], unschedulable: int = 0
) -> Observation:
    """`seen` with the free capacity of `nodes` after `pods`, and unschedulable pods per pool."""
    pools = {k: replace(p, unschedulable=unschedulable) for k, p in seen.pools.items()}
    return replace(seen, pools=pools, capacity=free_capacity(nodes, pods))


def gpu_node(name: str, resource: str) -> NodeSummary:
    return NodeSummary(name, {}, (), {resource: "8"}, ready=True)


def test_capacity_is_judged_from_the_nodes_while_metrics_are_unavailable():
    held = decision(limited_by="metrics")  # no metrics: the autoscaler holds
    lost = observation(unavailable("down"), unavailable("down"), ready=0)
    nodes = [gpu_node("s5000", "mthreads.com/gpu"), gpu_node("h200", "nvidia.com/gpu")]

    def capacity(seen: Observation) -> tuple[bool | None, str, str]:
        found = next(
            c
            for c in scaling_outcome(SPEC, seen, held, no_series={}, now=NOW).view.conditions
            if c.type == "CapacityAvailable"
        )
        return found.status, found.reason, found.message

    # Every node gone: the pools' replicas have nowhere to run, whatever the metrics say.
    status, reason, message = capacity(on_nodes(lost, [], []))
    assert (status, reason) == (False, "CapacityExhausted")
    assert message.startswith("prefill pool p: no Ready, schedulable node matching its ")
    assert "decode pool d: no Ready, schedulable node" in message
    assert capacity(on_nodes(lost, nodes, []))[:2] == (True, "AsExpected")
    # Nodes full of other pods, and the pools' pods wait for room.
    others = [
        PodSummary(f"other-{n.name}", "", "", True, False, n.name, requests=n.allocatable)
        for n in nodes
    ]
    status, _, message = capacity(on_nodes(lost, nodes, others, unschedulable=1))
    assert status is False
    assert "prefill pool p: 1 pod(s) cannot be scheduled, room for 0" in message
    assert capacity(on_nodes(lost, nodes, [], unschedulable=1))[0] is True  # room comes
    # Unknown node view: not judged.
    assert capacity(lost)[0] is True


def test_a_decision_that_moves_replicas_between_pools_is_written():
    first = scaling_outcome(SPEC, observation(Reading.of(0.5), Reading.of(0.01)), decision(),
                            no_series={}, now=NOW).view  # fmt: skip
    status = status_of(first)
    # Same role totals and limit, but a pool's replicas change: status must say so.
    moved = scaling_outcome(SPEC, observation(Reading.of(0.5), Reading.of(0.01)), decision(),
                            no_series={}, now=NOW + 30).view  # fmt: skip
    damp_churn(moved, status, NOW + 30, scaled=True)
    assert moved.last_decision["time"] == iso(NOW + 30)


def test_a_scale_status_never_reported_is_reported_once_after_a_restart():
    recorded = ScaleRecord("prefill", "p", 1, 2, {
        "time": iso(NOW), "prefillReplicas": 2, "decodeReplicas": 1, "reason": "because",
        "limitedBy": "none",
    })  # fmt: skip
    # Status still shows the decision before it: the operator stopped before writing it.
    before = {"lastDecision": {**recorded.last_decision, "time": iso(NOW - 60),
                               "prefillReplicas": 1}}  # fmt: skip
    unreported = unreported_scales([recorded.to_json(), "{not json"], iso(NOW - 60))
    assert unreported == [recorded]
    finished, events = finish_scales(before, unreported)
    assert [(e.type, e.reason, e.message) for e in events] == [
        ("Normal", "ScaledUp", "prefill pool p: 1 -> 2: because")
    ]
    # The restarted operator's first decision keeps the two replicas: status shows the
    # recorded decision, not one of its own that says nothing new.
    at_two = replace(
        observation(Reading.of(0.5), Reading.of(0.01)),
        pools={("prefill", "p"): PoolObservation(2, 2), ("decode", "d"): PoolObservation(1, 1)},
    )
    view = scaling_outcome(SPEC, at_two, decision(2), no_series={}, now=NOW + 30).view
    damp_churn(view, finished, NOW + 30)
    assert view.last_decision == recorded.last_decision
    assert transition_events(before, view, decision(2), at_two, advisory=False) == []
    # Reported (by status, or by this operator's own decision of that time): nothing more.
    assert unreported_scales([recorded.to_json()], iso(NOW)) == []
    assert unreported_scales([recorded.to_json()], None) == [recorded]
