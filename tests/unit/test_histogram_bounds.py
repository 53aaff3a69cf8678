"""Latency histogram bounds: what the policy assumes the engines export (SGLang's defaults, or
the bounds the user's args give it), what the simulated engines export, and the offline
replay's `buckets="at-targets"`, which measures what bounds at the targets are worth."""

from collections.abc import Mapping
from typing import Any

import aiohttp
import pytest

from pd_operator.api.spec import PDDeploymentSpec
from pd_operator.core.children import PoolKey
from pd_operator.core.engine_args import engine_command
from pd_operator.core.engine_metrics import SGLANG_BOUNDS, VLLM_BOUNDS
from pd_operator.core.hardware import GLM_45_FP8
from pd_operator.core.histogram_bounds import at_target
from pd_operator.core.policy import decide
from pd_operator.core.policy_state import PolicyState
from pd_operator.core.resolved import resolve
from pd_operator.core.signals import bucket_of
from pd_tools.enginesim import http_engine
from pd_tools.enginesim.metrics import SGLANG, VLLM
from pd_tools.replay import offline
from pd_tools.replay.baselines import OperatorPolicy, View
from pd_tools.replay.offline_metrics import Scrape
from pd_tools.simcluster.cluster import pod_dialect
from pd_tools.workloads.traces import TokenLengths, step_rate, synthetic_requests
from policycases import PROFILED_CHANGES, T0, observe, replicas, spec_of

TTFT_FLAG, ITL_FLAG = "--bucket-time-to-first-token", "--bucket-inter-token-latency"
# Targets between SGLang's default bounds (2 and 4 s; 10 and 15 ms).
SGLANG_SPEC = spec_of(
    {
        "model.engine": "SGLang",
        "kvTransfer": {"connector": "None"},
        "slo.ttft.targetMilliseconds": 2500,
        "slo.itl.targetMilliseconds": 12,
    }
)
SIM_ENV = {"PD_SIM_HARDWARE": "h200", "PD_SIM_MODEL": "glm-4.5-fp8", "PD_SIM_LOAD_SECONDS": "0"}


def values(argv: list[str], flag: str) -> list[str]:
    """The arguments after `flag`, up to the next flag; [] when it is not there."""
    if flag not in argv:
        return []
    rest = argv[argv.index(flag) + 1 :]
    return rest[: next((i for i, a in enumerate(rest) if a.startswith("--")), len(rest))]


def with_args(spec: PDDeploymentSpec, *args: str) -> PDDeploymentSpec:
    return spec.model_copy(update={"model": spec.model.model_copy(update={"args": list(args)})})


# ---------------------------------------------------------------- the engine command


# The user's bounds at the targets (12 ms, 2.5 s), as SGLang takes them.
AT_TARGETS = with_args(
    SGLANG_SPEC, ITL_FLAG, "0.01", "0.012", "0.015", "0.025", TTFT_FLAG, "2", "2.5", "4"
)


@pytest.mark.parametrize("role", ["prefill", "decode"])
def test_sglang_is_told_no_bounds_and_read_with_its_own(role):
    """The operator adds no bound flags (an SGLang without them would not start, and every SLO
    edit would restart the pools): the policy reads SGLang's default bounds."""
    argv = engine_command(SGLANG_SPEC, role, SGLANG_SPEC.pools(role)[0])
    assert not any(arg.startswith("--bucket") for arg in argv)
    resolved = resolve(SGLANG_SPEC)
    assert resolved.role("prefill").latency_buckets == SGLANG_BOUNDS.ttft
    assert resolved.role("decode").latency_buckets == SGLANG_BOUNDS.itl


def test_a_target_already_a_default_bound_is_not_repeated():
    spec = spec_of({"model.engine": "SGLang", "slo.itl.targetMilliseconds": 20})
    itl = at_target(spec, "decode")
    assert itl.count(0.02) == 1
    assert itl == tuple(sorted({*SGLANG_BOUNDS.itl, 0.017}))


@pytest.mark.parametrize("engine", ["VLLM", "SGLang"])
@pytest.mark.parametrize("milliseconds", [12, 20, 30, 45])
def test_the_bucket_under_a_target_is_narrow_enough_to_read_near_the_slo(engine, milliseconds):
    """vLLM's ITL bounds with 20 ms alone would leave (10, 20] ms under it: a P99 interpolated
    at 19.8 ms there says nothing about where the gaps are."""
    spec = spec_of({"model.engine": engine, "slo.itl.targetMilliseconds": milliseconds})
    target = milliseconds / 1000
    lower, upper = bucket_of(at_target(spec, "decode"), target * 0.99)
    assert upper == target
    assert lower >= target * 0.85 - 0.0005


def test_vllm_is_told_no_bounds_and_read_with_its_own():
    spec = spec_of({"slo.itl.targetMilliseconds": 12})
    argv = engine_command(spec, "decode", spec.pools("decode")[0])
    assert not any(arg.startswith("--bucket") for arg in argv)
    assert resolve(spec).role("decode").latency_buckets == VLLM_BOUNDS.itl


def test_bounds_the_user_sets_are_kept_and_known_to_the_policy():
    spec = with_args(SGLANG_SPEC, ITL_FLAG, "0.01", "0.025", "0.05", "--trust-remote-code")
    argv = engine_command(spec, "decode", spec.pools("decode")[0])
    assert argv.count(ITL_FLAG) == 1
    assert values(argv, ITL_FLAG) == ["0.01", "0.025", "0.05"]
    assert TTFT_FLAG not in argv  # the flag the user left alone: SGLang's own bounds
    resolved = resolve(spec)
    assert resolved.role("decode").latency_buckets == (0.01, 0.025, 0.05)
    assert resolved.role("prefill").latency_buckets == SGLANG_BOUNDS.ttft
    equals_form = resolve(with_args(SGLANG_SPEC, f"{TTFT_FLAG}=3"))
    assert equals_form.role("prefill").latency_buckets == (3.0,)


# ---------------------------------------------------------------- the policy reads them


@pytest.mark.parametrize(
    ("spec", "grows"),
    [
        # vLLM: a P50 ITL of 14 ms against 12 ms lies in the (10, 25] ms bucket, which cannot
        # tell a breach; alone it grows nothing.
        (spec_of({"slo.itl.targetMilliseconds": 12}), False),
        # SGLang's defaults: the (10, 15] ms bucket holds the target; as vLLM.
        (SGLANG_SPEC, False),
        # SGLang with the user's bound at 12 ms: the (12, 15] ms bucket is wholly over it.
        (AT_TARGETS, True),
        # SGLang with the user's bounds, none at the target: as vLLM.
        (with_args(SGLANG_SPEC, ITL_FLAG, "0.01", "0.025", "0.05"), False),
    ],
)
def test_a_reading_just_over_the_target_is_a_breach_only_with_a_bound_at_it(spec, grows):
    observation = observe(
        spec,
        T0,
        {("prefill", "p"): 2, ("decode", "d"): 2},
        decode={"ratio": 14 / 12, "tokens": 2000.0},
    )
    decision = decide(spec, observation, PolicyState(), T0)
    assert (replicas(decision, "decode", "d") > 2) is grows


# ---------------------------------------------------------------- the simulated engines


def served_config(spec: PDDeploymentSpec, role: str) -> http_engine.EngineConfig:
    """The operator's command line for `role`, served on a free loopback port."""
    argv = engine_command(spec, role, spec.pools(role)[0])
    return http_engine.parse_config(
        [*argv, "--host", "127.0.0.1", "--port", "0", "--tp-size", "8"], SIM_ENV
    )


@pytest.mark.parametrize(
    "spec", [SGLANG_SPEC, AT_TARGETS, with_args(SGLANG_SPEC, ITL_FLAG, "0.01", "0.025", "0.05")]
)
def test_the_simulated_sglang_engine_exports_what_the_policy_assumes(spec):
    config = served_config(spec, "decode")
    assert config.ignored_args == ()
    resolved = resolve(spec)
    assert config.buckets.ttft_s == resolved.role("prefill").latency_buckets
    assert config.buckets.itl_s == resolved.role("decode").latency_buckets


async def test_the_simulated_sglang_engine_serves_the_bounds_its_args_set():
    server, runner = await http_engine.start_engine(served_config(AT_TARGETS, "decode"))
    host, port = runner.addresses[0][:2]
    try:
        async with aiohttp.ClientSession() as session:
            body = {"prompt": "a b c", "max_tokens": 4}
            async with session.post(f"http://{host}:{port}/v1/completions", json=body) as answer:
                assert answer.status == 200
            async with session.get(f"http://{host}:{port}/metrics") as answer:
                text = await answer.text()
    finally:
        await http_engine.stop_engine(server, runner)
    assert 'sglang:inter_token_latency_seconds_bucket{model_name="m",le="0.012"}' in text
    assert 'sglang:time_to_first_token_seconds_bucket{model_name="m",le="2.5"}' in text


def engine_pod(spec: PDDeploymentSpec, role: str) -> dict[str, Any]:
    argv = engine_command(spec, role, spec.pools(role)[0])
    return {"spec": {"containers": [{"name": "sidecar"}, {"name": "engine", "command": argv}]}}


@pytest.mark.parametrize("role", ["prefill", "decode"])
def test_the_simulated_cluster_exports_the_bounds_a_pods_command_sets(role):
    dialect = pod_dialect(SGLANG, engine_pod(AT_TARGETS, role))
    resolved = resolve(AT_TARGETS)
    assert 0.012 in dialect.buckets.itl_s
    assert dialect.buckets.ttft_s == resolved.role("prefill").latency_buckets
    assert dialect.buckets.itl_s == resolved.role("decode").latency_buckets
    vllm = spec_of()
    assert pod_dialect(VLLM, engine_pod(vllm, role)) is VLLM


# ---------------------------------------------------------------- the offline replay


class Watching(OperatorPolicy):
    """pd-operator, keeping the bounds each decision assumed."""

    def __init__(self) -> None:
        super().__init__(interval_s=30.0)
        self.assumed: set[tuple[float, ...]] = set()

    def decide(self, view: View) -> Mapping[PoolKey, int]:
        self.assumed.add(view.resolved.role("decode").latency_buckets)
        return super().decide(view)


PROFILED = spec_of(PROFILED_CHANGES)  # GLM-4.5 on vLLM, TTFT 6 s, ITL 20 ms
LOAD = list(
    synthetic_requests(
        step_rate([1.0], 300.0), TokenLengths(2000, 200, input_cv=1.0, output_cv=1.0), seed=1
    )
)


@pytest.mark.parametrize("buckets", ["engine", "at-targets"])
def test_the_replay_at_targets_exports_and_assumes_bounds_at_the_targets(monkeypatch, buckets):
    scrapes: list[Scrape] = []

    def scrape(engine: Any, time_s: float, pool_of: Any = None) -> Scrape:
        scrapes.append(offline_scrape(engine, time_s, pool_of))
        return scrapes[-1]

    offline_scrape = offline.scrape
    monkeypatch.setattr(offline, "scrape", scrape)
    policy = Watching()
    offline.simulate(PROFILED, LOAD, policy, model=GLM_45_FP8, buckets=buckets)
    decode, prefill = scrapes[-1].roles["decode"], scrapes[-1].roles["prefill"]
    assert decode.buckets[-1] > 0  # tokens were generated
    assert policy.assumed == {decode.bounds}
    if buckets == "engine":
        assert decode.bounds == VLLM_BOUNDS.itl and 0.02 not in decode.bounds
    else:
        assert decode.bounds == tuple(sorted({*VLLM_BOUNDS.itl, 0.017, 0.02}))
        assert prefill.bounds == tuple(sorted({*VLLM_BOUNDS.ttft, 5.1, 6.0}))


def test_the_oracle_reads_no_histogram():
    runs = [
        offline.simulate(PROFILED, LOAD, "oracle", model=GLM_45_FP8, buckets=buckets)
        for buckets in ("engine", "at-targets")
    ]
    assert runs[0].card_hours == runs[1].card_hours
    assert runs[0].attainment() == runs[1].attainment()
