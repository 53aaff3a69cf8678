"""The KV hand-off in live decisions: a TTFT breach that the transfer from prefill to decode
explains does not grow prefill, says so, and names the fabric in status (issue #31, item 5)."""

from dataclasses import replace

import pytest

from pd_operator.adapters import promql
from pd_operator.api.document import parse_pddeployment
from pd_operator.core.decision import Decision, Observation, PoolObservation
from pd_operator.core.hardware import GLM_45_FP8, H200_SXM, MTT_S5000
from pd_operator.core.policy import decide
from pd_operator.core.policy_state import PolicyState
from pd_operator.core.scaling_view import scaling_outcome
from pd_operator.core.signals import (
    NO_TRAFFIC,
    NOT_READ,
    Reading,
    ReadingKind,
    RoleSignals,
    hand_off_seconds,
    unavailable,
)
from pd_tools.enginesim.engine import PDEngine, ReplicaSpec
from pd_tools.enginesim.engine import Role as EngineRole
from pd_tools.replay.baselines import OperatorPolicy
from pd_tools.replay.cluster import Cluster, NodeType
from pd_tools.replay.offline import simulate
from pd_tools.replay.offline_metrics import role_signals, scrape
from pd_tools.workloads.traces import Request
from pdcases import minimal
from policycases import PROFILED_CHANGES, T0, limit, observe, replicas, spec_of

# TTFT target 6 s; NIXL over TCP, as `spec.kvTransfer` says it.
FABRIC = {
    "slo.ttft.targetMilliseconds": 6000,
    "kvTransfer": {"connector": "NIXL", "protocol": "TCP"},
}
SPEC = spec_of(FABRIC)
PROFILED = spec_of({**PROFILED_CHANGES, **FABRIC})


@pytest.mark.parametrize(
    ("ttft", "queue", "prefill", "connector", "expected"),
    [
        (Reading.of(5.0), Reading.of(1.0), Reading.of(1.0), Reading.of(2.5), 2.5),  # connector
        (Reading.of(5.0), Reading.of(1.0), Reading.of(1.0), Reading.of(4.0), 3.0),  # <= the rest
        (Reading.of(2.0), Reading.of(1.5), Reading.of(1.0), Reading.of(4.0), 0.0),  # TTFT w/o it
        (Reading.of(5.0), Reading.of(1.0), Reading.of(1.0), NOT_READ, 3.0),  # inferred
        (Reading.of(5.0), NOT_READ, NOT_READ, Reading.of(2.5), 2.5),  # no parts: the connector
        (NO_TRAFFIC, NOT_READ, NOT_READ, NO_TRAFFIC, None),
        (Reading.of(5.0), unavailable("no series: q"), Reading.of(1.0), NOT_READ, None),
    ],
)
def test_the_hand_off_is_the_connector_time_the_ttft_holds(
    ttft, queue, prefill, connector, expected
):
    reading = hand_off_seconds(ttft, queue, prefill, connector)
    if expected is None:
        assert reading.kind is not ReadingKind.VALUE
    else:
        assert reading.value == pytest.approx(expected)


def with_transfer(observation: Observation, seconds: float) -> Observation:
    prefill = replace(observation.signals["prefill"], kv_transfer_seconds=Reading.of(seconds))
    return replace(observation, signals={**observation.signals, "prefill": prefill})


def test_a_breach_the_transfer_explains_does_not_grow_prefill_and_names_the_fabric():
    # TTFT 9 s over the 6 s target, of which the transfer is 4 s: prefill's part meets it.
    observation = observe(
        SPEC, T0, {("prefill", "p"): 2, ("decode", "d"): 2}, prefill={"ratio": 1.5}
    )
    decision = decide(SPEC, with_transfer(observation, 4.0), PolicyState(), T0)
    assert replicas(decision) == 2 and limit(decision) == "fabric"
    assert decision is not None
    assert (
        "TTFT 9.0s over 6s target, of which KV transfer 4.0s: the fabric (NIXL over TCP), "
        "not prefill" in decision.reason
    )
    # Without the transfer read, as before: the same breach grows prefill.
    assert replicas(decide(SPEC, observation, PolicyState(), T0)) > 2


@pytest.mark.parametrize("transfer", [0.5, 2.0])
def test_a_breach_the_transfer_does_not_explain_still_grows_prefill(transfer):
    # TTFT 9 s: less 0.5 s or 2 s it is still over the target (and its tolerance).
    observation = observe(
        SPEC, T0, {("prefill", "p"): 2, ("decode", "d"): 2}, prefill={"ratio": 1.5}
    )
    decision = decide(SPEC, with_transfer(observation, transfer), PolicyState(), T0)
    assert replicas(decision) > 2 and limit(decision) != "fabric"
    assert decision is not None and "fabric" not in decision.reason


def test_a_fabric_bound_breach_still_holds_prefill_from_shrinking():
    observation = observe(
        SPEC, T0, {("prefill", "p"): 3, ("decode", "d"): 2}, prefill={"ratio": 1.5, "tokens": 1.0}
    )
    assert replicas(decide(SPEC, with_transfer(observation, 4.0), PolicyState(), T0)) == 3


def test_status_shows_the_transfer_and_slo_met_names_the_fabric():
    spec = parse_pddeployment(
        {
            **minimal(),
            "spec": {**minimal()["spec"], "kvTransfer": {"connector": "NIXL", "protocol": "TCP"}},
        }
    ).spec  # TTFT target 1 s
    prefill = RoleSignals(
        sample_time=T0, ttft_seconds=Reading.of(1.6), kv_transfer_seconds=Reading.of(0.8)
    )
    decode = RoleSignals(sample_time=T0, itl_seconds=Reading.of(0.01))
    observation = Observation(
        {"prefill": prefill, "decode": decode},
        {("prefill", "p"): PoolObservation(1, 1), ("decode", "d"): PoolObservation(1, 1)},
    )
    decision = Decision(
        time=T0, replicas={("prefill", "p"): 1, ("decode", "d"): 1}, pools=(), reason="",
        limited_by="fabric", state=PolicyState(),
    )  # fmt: skip
    outcome = scaling_outcome(spec, observation, decision, no_series={}, now=T0)
    assert outcome.view.observed["kvTransferMilliseconds"] == 800
    slo = next(c for c in outcome.view.conditions if c.type == "SLOMet")
    assert (slo.status, slo.reason) == (False, "KVTransferBound")
    assert "the fabric (NIXL over TCP), not prefill (spec.kvTransfer)" in slo.message
    # A transfer too short to explain the breach: the SLO is violated as before.
    short = replace(prefill, kv_transfer_seconds=Reading.of(0.1))
    observation = replace(observation, signals={"prefill": short, "decode": decode})
    outcome = scaling_outcome(spec, observation, decision, no_series={}, now=T0)
    slo = next(c for c in outcome.view.conditions if c.type == "SLOMet")
    assert (slo.status, slo.reason) == (False, "SLOViolated")


def test_the_reader_asks_for_the_connector_mean_as_the_prefill_roles():
    query = promql.transfer_mean_query("vllm:nixl_xfer_time_seconds", 60)
    assert query == (
        "label_replace(sum by (namespace, deployment) (rate(vllm:nixl_xfer_time_seconds_sum[60s]))"
        " / sum by (namespace, deployment) (rate(vllm:nixl_xfer_time_seconds_count[60s])), "
        '"role", "prefill", "deployment", ".*")'
    )
    assert " / 1000 / " in promql.transfer_mean_query("sglang:kv_transfer_latency_ms", 60)
    assert promql.VLLM.kv_transfer == "vllm:nixl_xfer_time_seconds"
    assert promql.VLLM.queue_time == "vllm:request_queue_time_seconds"
    assert promql.VLLM.prefill_time == "vllm:request_prefill_time_seconds"


def test_the_engine_simulator_on_a_slow_fabric_breaches_ttft_and_prefill_is_not_grown():
    """One S5000 prefill and one H200 decode replica, an 8K-token prompt every 4 s, the KV link
    at 188 MB/s (congested TCP): each hand-off takes 8 s, prefill 0.3 s. TTFT breaches its 6 s
    target; prefill is not grown for it. Read without the transfer and the prompts' wait,
    prefill grew."""
    prompt, link = 8000, 188e6
    requests = [Request(4.0 * i, prompt, 20) for i in range(100)]
    engine = PDEngine(requests, model=GLM_45_FP8, link_bytes_per_second=link)
    for name, role, card in (
        ("p", EngineRole.PREFILL, MTT_S5000),
        ("d", EngineRole.DECODE, H200_SXM),
    ):
        replica = ReplicaSpec.from_profiles(card, GLM_45_FP8, 8)
        engine.add_instance(name, role, replica, ready_after_s=0)
    scrapes = []
    for step in range(1, 21):
        engine.advance_to(15.0 * step)
        scrapes.append(scrape(engine, 15.0 * step))
    now = scrapes[-1].time_s
    signals = role_signals(PROFILED, scrapes, now, 60.0)
    transfer = signals["prefill"].kv_transfer_seconds.value
    assert transfer == pytest.approx(prompt * 188416 / link, rel=0.01)
    ttft = signals["prefill"].ttft_seconds.value
    assert ttft is not None and ttft > 1.1 * 6
    pools = {("prefill", "p"): PoolObservation(1, 1), ("decode", "d"): PoolObservation(1, 1)}
    decision = decide(PROFILED, Observation(signals, pools), PolicyState(), now)
    assert replicas(decision) == 1 and limit(decision) == "fabric"
    assert decision is not None and "the fabric (NIXL over TCP), not prefill" in decision.reason
    # Without the transfer, the prompts' mean wait (about none) still says that waiting did not
    # make the breach: prefill is not grown, and the reason says why. Without either, it grew.
    no_transfer = replace(signals["prefill"], kv_transfer_seconds=NOT_READ)
    waits_only = decide(PROFILED, Observation({**signals, "prefill": no_transfer}, pools),
                        PolicyState(), now)  # fmt: skip
    assert replicas(waits_only) == 1
    assert waits_only is not None and "with prompts waiting 0s on average" in waits_only.reason
    blind = {**signals, "prefill": replace(no_transfer, queue_seconds=NOT_READ)}
    assert replicas(decide(PROFILED, Observation(blind, pools), PolicyState(), now)) > 1


def test_a_replay_on_a_slow_fabric_holds_prefill_and_says_it_is_the_fabric():
    """The offline replay's cluster carries its KV link: at 188 MB/s each 8K-token hand-off takes
    8 s, TTFT breaches the 6 s target, and pd-operator's replay keeps one prefill replica, saying
    why; on the default 100 GB/s link the same load meets its target on one replica too."""
    requests = [Request(4.0 * i, 8000, 20) for i in range(150)]
    nodes = (NodeType("mtt-s5000", 2), NodeType("h200", 2))
    operator = OperatorPolicy(interval_s=30.0)
    slow = simulate(
        PROFILED,
        requests,
        operator,
        model=GLM_45_FP8,
        cluster=Cluster(nodes, link_bytes_per_second=188e6),
    )
    assert slow.attainment()["feasible"] < 0.5  # the fabric breaches TTFT for nearly every one
    assert all(replicas["prefill/p"] == 1 for _, replicas in slow.timeline)
    # The last decision's reason, as the PDDeployment's status would show it.
    assert "the fabric (NIXL over TCP), not prefill" in operator.reason, operator.reason
    fast = simulate(PROFILED, requests, "pd-operator", model=GLM_45_FP8, cluster=Cluster(nodes))
    assert fast.attainment()["feasible"] > 0.99
    assert all(replicas["prefill/p"] == 1 for _, replicas in fast.timeline)
