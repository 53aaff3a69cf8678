"""Each baseline autoscaler behaves as its documentation says, on small scripted loads."""

from pd_operator.api.document import parse_pddeployment
from pd_operator.api.spec import Role
from pd_operator.core.children import PoolKey
from pd_operator.core.decision import Observation, PoolObservation
from pd_operator.core.resolved import resolve
from pd_operator.core.signals import Reading, RoleSignals
from pd_tools.replay.baselines import (
    HPA,
    Arrivals,
    DynamoSLA,
    Frontend,
    LlmdSLO,
    Oracle,
    Prescient,
    View,
    _arima_forecast,
    per_replica,
)
from pd_tools.replay.example import example_document
from pd_tools.replay.offline import peak_replicas
from pd_tools.replay.offline_metrics import WindowStats
from pd_tools.workloads.traces import Request

PREFILL: PoolKey = ("prefill", "s5000")
DECODE: PoolKey = ("decode", "h200")
# Room for 20 replicas per pool is passed in each view; the spec's bounds are not reached.
SPEC = parse_pddeployment(example_document()).spec
PROMPT = 8000.0
QUIET = Frontend(0.0, PROMPT, 300.0, 0.0)


def view(
    now: float,
    replicas: dict[PoolKey, int],
    *,
    inflight: float = 0.0,
    kv: float = 0.5,
    p90: tuple[float | None, float | None] = (None, None),
    mean: tuple[float | None, float | None] = (None, None),
    frontend: Frontend = QUIET,
) -> View:
    signals: dict[Role, RoleSignals] = {
        "prefill": RoleSignals(
            now, queue_depth=Reading.of(inflight), running_requests=Reading.of(0)
        ),
        "decode": RoleSignals(now, kv_cache_usage=Reading.of(kv)),
    }
    pools = {k: PoolObservation(replicas=n, ready=n) for k, n in replicas.items()}
    stats: dict[Role, WindowStats] = {
        "prefill": WindowStats(p90[0], mean[0]),
        "decode": WindowStats(p90[1], mean[1]),
    }
    return View(
        now,
        resolve(SPEC),
        Observation(signals, pools),
        stats,
        frontend,
        replicas,
        {PREFILL: 20, DECODE: 20},
    )


def capacity() -> float:
    pool = SPEC.prefill.pools[0]
    return per_replica(resolve(SPEC), "prefill", pool, PROMPT)


def per_pod() -> float:
    """In-flight requests the HPA aims for on one prefill pod."""
    return float(0.8 * capacity() * SPEC.slo.ttft.target_milliseconds / 1000 / PROMPT)


def test_hpa_never_scales_down_inside_its_300s_window() -> None:
    hpa = HPA()
    each = per_pod()
    replicas = {PREFILL: 4, DECODE: 1}
    now = 0.0
    replicas = dict(hpa.decide(view(now, replicas, inflight=4 * each)))
    assert replicas[PREFILL] == 4  # at target: hold
    seen = []
    while now < 600:
        now += 15
        replicas = dict(hpa.decide(view(now, replicas, inflight=1 * each)))
        seen.append((now, replicas[PREFILL]))
    assert all(n == 4 for t, n in seen if t < 300)
    assert seen[-1][1] == 1


def test_hpa_ignores_changes_within_its_tolerance() -> None:
    each = per_pod()
    answer = HPA().decide(view(0, {PREFILL: 4, DECODE: 1}, inflight=4 * each * 1.09))
    assert answer[PREFILL] == 4


def test_hpa_scale_up_is_limited_to_double_or_plus_four_per_minute() -> None:
    hpa = HPA()
    each = per_pod()
    replicas = {PREFILL: 1, DECODE: 1}
    replicas = dict(hpa.decide(view(0, replicas, inflight=19 * each)))
    assert replicas[PREFILL] == 5  # max(2 x 1, 1 + 4)
    replicas = dict(hpa.decide(view(15, replicas, inflight=19 * each)))
    assert replicas[PREFILL] == 5  # the minute's allowance is spent
    replicas = dict(hpa.decide(view(75, replicas, inflight=19 * each)))
    assert replicas[PREFILL] == 10  # a new minute: x2 of 5


def test_llmd_scales_up_above_055_and_down_below_040_at_documented_rates() -> None:
    llmd = LlmdSLO()
    target = SPEC.slo.ttft.target_milliseconds / 1000
    replicas = {PREFILL: 2, DECODE: 2}
    hold = llmd.decide(view(0, replicas, p90=(0.5 * target, 0.5 * 0.020)))
    assert hold == replicas  # inside the 0.40-0.55 dead band
    grown = dict(llmd.decide(view(15, replicas, p90=(5 * target, 0.5 * 0.020))))
    assert grown[PREFILL] == 6  # 4 pods per 60 s at most
    again = dict(llmd.decide(view(30, grown, p90=(5 * target, 0.5 * 0.020))))
    assert again[PREFILL] == 6
    low = (0.1 * target, 0.1 * 0.020)
    first = dict(llmd.decide(view(100, again, p90=low)))
    assert first[PREFILL] == 5 and first[DECODE] == 1
    second = dict(llmd.decide(view(160, first, p90=low)))
    assert second[PREFILL] == 5  # 1 pod per 120 s down
    third = dict(llmd.decide(view(221, second, p90=low)))
    assert third[PREFILL] == 4


def test_dynamo_predicts_every_180s_and_reacts_by_one_in_between() -> None:
    dynamo = DynamoSLA()
    each = capacity()
    demand = Frontend(
        rate_rps=3 * each / PROMPT,
        mean_input_tokens=PROMPT,
        mean_output_tokens=300,
        cached_fraction=0.0,
    )
    replicas = dict(dynamo.decide(view(0, {PREFILL: 1, DECODE: 1}, frontend=demand)))
    assert replicas[PREFILL] == 3  # ceil(demand / capacity) at the SLO
    target = SPEC.slo.ttft.target_milliseconds / 1000
    late = dict(dynamo.decide(view(5, replicas, mean=(2 * target, None), frontend=demand)))
    assert late[PREFILL] == 4  # reactive +1 on the average TTFT
    quiet = Frontend(0.0, PROMPT, 300, 0.0)
    held = dict(dynamo.decide(view(10, late, frontend=quiet)))
    assert held == late  # no sample (NaN at zero traffic): hold
    resized = dict(dynamo.decide(view(180, late, frontend=demand)))
    assert resized[PREFILL] == 3  # the predictive loop resets the size


def test_arima_extrapolates_a_trend_and_constant_does_not() -> None:
    assert _arima_forecast([1.0, 2.0, 3.0, 4.0]) > 4.0
    assert _arima_forecast([5.0]) == 5.0
    assert _arima_forecast([3.0, 3.0, 3.0]) == 3.0


def test_oracle_replays_its_hindsight_schedule_per_interval_without_warm_up() -> None:
    quiet, busy = {PREFILL: 1, DECODE: 1}, {PREFILL: 3, DECODE: 2}
    oracle = Oracle([quiet, busy, quiet])
    assert not oracle.warm_up
    assert oracle.decide(view(0, {PREFILL: 1, DECODE: 1})) == quiet
    assert oracle.decide(view(60, {PREFILL: 1, DECODE: 1})) == busy
    assert oracle.decide(view(119.9, {PREFILL: 1, DECODE: 1})) == busy
    assert oracle.decide(view(600, busy)) == quiet  # past the trace: its last interval


def test_prescient_starts_each_replica_its_load_time_before_the_minute_that_needs_it() -> None:
    quiet, busy = {PREFILL: 1, DECODE: 1}, {PREFILL: 3, DECODE: 2}
    prescient = Prescient([quiet, quiet, busy, quiet], lead_s=83.0)
    assert prescient.warm_up and prescient.interval_s == 1.0
    assert prescient.decide(view(36, quiet)) == quiet  # 120 - 83 = 37: not yet
    assert prescient.decide(view(37, quiet)) == busy  # loads for 83 s, serves from 120
    assert prescient.decide(view(179, busy)) == busy  # the busy minute has not ended
    assert prescient.decide(view(180, busy)) == quiet
    assert prescient.decide(view(600, quiet)) == quiet  # past the trace: its last interval
    # Without a lead it is the oracle's replay.
    oracle, same = Oracle([quiet, busy, quiet]), Prescient([quiet, busy, quiet], lead_s=0.0)
    for now in (0, 59, 60, 119, 120, 400):
        assert same.decide(view(now, quiet)) == oracle.decide(view(now, quiet))


def test_prescient_keeps_a_replica_for_a_minute_it_was_started_for() -> None:
    """A dip shorter than the load time keeps the replicas the next rise needs."""
    quiet, busy = {PREFILL: 1, DECODE: 1}, {PREFILL: 3, DECODE: 1}
    prescient = Prescient([busy, quiet, busy], lead_s=90.0)
    assert [prescient.decide(view(t, busy))[PREFILL] for t in (0, 60, 119, 120, 179)] == [3] * 5
    assert prescient.decide(view(180, busy))[PREFILL] == 3  # the last entry holds


def test_static_peak_is_sized_for_the_busiest_minute() -> None:
    quiet = [Request(k * 4.0, int(PROMPT), 100) for k in range(150)]  # 0.25 req/s for 10 min
    burst_rate = 3 * capacity() / PROMPT  # three replicas' worth, for one minute
    burst = [Request(300 + k / burst_rate, int(PROMPT), 100) for k in range(int(60 * burst_rate))]
    room = {PREFILL: 20, DECODE: 20}
    calm = peak_replicas(resolve(SPEC), Arrivals(quiet), room)
    busy = peak_replicas(
        resolve(SPEC), Arrivals(sorted(quiet + burst, key=lambda r: r.arrival_s)), room
    )
    assert calm[PREFILL] == 1
    assert busy[PREFILL] >= 4  # three replicas' work at 80% utilisation
