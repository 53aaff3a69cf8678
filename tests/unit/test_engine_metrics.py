"""The simulator writes the metric names the operator's Prometheus reader looks for."""

import threading

import pytest

from pd_operator.adapters import promql
from pd_operator.core import engine_metrics
from pd_operator.core.hardware import GLM_45_FP8, H200_SXM, MTT_S5000
from pd_tools.enginesim import metrics as sim_metrics
from pd_tools.enginesim.engine import PDEngine, ReplicaSpec, Role
from pd_tools.enginesim.metrics import Dialect, EngineMetricsServer, SimPod
from pd_tools.workloads.traces import Request

# The spec engine (spec.model.engine) each simulator dialect stands in for.
SIMULATED = {
    sim_metrics.VLLM: "VLLM",
    sim_metrics.SGLANG: "SGLang",
    sim_metrics.SGLANG_UNDERSCORE: "SGLang",
}


def exposed_samples(dialect: Dialect) -> set[str]:
    """The sample names in one simulated pod's exposition."""
    engine = PDEngine([], model=GLM_45_FP8, buckets=dialect.buckets)
    engine.add_instance("p0", Role.PREFILL, ReplicaSpec.from_profiles(MTT_S5000, GLM_45_FP8, 8))
    server = EngineMetricsServer(engine, threading.Lock(), dialect=dialect)
    try:
        server.add_pod(SimPod("ns", "prefill-0", "p0", "demo", "prefill", "s5000", "glm"))
        text = server.render("ns", "prefill-0") or ""
    finally:
        server.stop()
    return {line.split("{", 1)[0] for line in text.splitlines() if not line.startswith("#")}


def test_every_simulator_dialect_is_listed_here():
    dialects = {v for v in vars(sim_metrics).values() if isinstance(v, Dialect)}
    assert dialects == set(SIMULATED)


@pytest.mark.parametrize("dialect", SIMULATED, ids=lambda d: d.name)
def test_the_reader_detects_each_simulated_engine_and_finds_every_name_it_reads(dialect):
    present = exposed_samples(dialect)
    adapter = promql.detect(present, SIMULATED[dialect])
    assert adapter == promql.EngineMetrics.of(dialect.metrics)
    histograms = {adapter.ttft_histogram, adapter.itl_histogram}
    read = {f"{h}_{suffix}" for h in histograms for suffix in ("bucket", "count")}
    read |= {adapter.waiting, adapter.running, adapter.kv_usage}
    read |= {adapter.prompt_tokens, adapter.generation_tokens}
    assert None not in read  # the simulator writes every signal the reader can use
    assert read <= present, read - present


def test_underscored_names_replace_only_the_colon_after_the_prefix():
    names = engine_metrics.VLLM_UNDERSCORE
    assert names.name == "vllm-underscore"
    assert names.ttft_histogram == "vllm_time_to_first_token_seconds"
    assert names.cache_query_tokens == "vllm_prefix_cache_queries"
    assert engine_metrics.SGLANG_UNDERSCORE.cache_query_tokens is None


def test_every_engine_table_entry_is_a_reader_adapter():
    assert {a.name for a in promql.ALL_ADAPTERS} == {
        n.name
        for n in vars(engine_metrics).values()
        if isinstance(n, engine_metrics.EngineMetricNames)
    }


def samples(text: str) -> dict[str, float]:
    """Each sample line's value by its full name and labels."""
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            out[name] = float(value)
    return out


def test_a_time_compressed_engine_reports_rates_per_simulated_second():
    # 20 simulated seconds per wall second: Prometheus rates counters per wall second, so the
    # exposition scales every counter by 0.05 and rates come out per simulated second (what a
    # replica serves, what the profiles' capacities are in); gauges, means and quantiles stay.
    requests = [Request(t * 0.5, 2000, 50) for t in range(40)]
    engine = PDEngine(requests, model=GLM_45_FP8)
    prefill, decode = (ReplicaSpec.from_profiles(c, GLM_45_FP8, 8) for c in (MTT_S5000, H200_SXM))
    engine.add_instance("p0", Role.PREFILL, prefill, ready_after_s=0)
    engine.add_instance("d0", Role.DECODE, decode, ready_after_s=0)
    engine.advance_to(19.0)  # requests still in flight: gauges are not all zero
    pod = SimPod("ns", "prefill-0", "p0", "demo", "prefill", "s5000", "glm")
    rendered = {}
    for scale in (1.0, 0.05):
        server = EngineMetricsServer(engine, threading.Lock(), counter_scale=scale)
        try:
            server.add_pod(pod)
            rendered[scale] = samples(server.render("ns", "prefill-0") or "")
        finally:
            server.stop()
    real, compressed = rendered[1.0], rendered[0.05]
    assert real.keys() == compressed.keys()
    counters = [
        k for k in real if k.split("{")[0].endswith(("_total", "_bucket", "_sum", "_count"))
    ]
    assert any(real[k] > 0 for k in counters)
    for key in counters:
        assert compressed[key] == pytest.approx(real[key] * 0.05)
    for key in real.keys() - set(counters):  # gauges
        assert compressed[key] == real[key]
    with pytest.raises(ValueError, match="counter_scale"):
        EngineMetricsServer(engine, threading.Lock(), counter_scale=0)
