"""The engine simulator over HTTP: the vLLM command line, the PD hand-off vllm-router relies on,
answers of exactly max_tokens, the overload bound, readiness, /metrics and the model's timing.

Each test serves an engine in-process on 127.0.0.1 (a free port) with a short load time. Timing
assertions compare against the performance model with generous bounds or compare orderings, so
that a loaded 2-core machine does not fail them.
"""

import asyncio
import json
import math
import time
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from prometheus_client.parser import text_string_to_metric_families

from pd_operator.api import parse_pddeployment
from pd_operator.core.engine_args import engine_command
from pd_operator.core.hardware import GLM_45_FP8, LLAMA2_70B
from pd_tools.enginesim import http_engine
from pd_tools.enginesim.http_engine import ConfigError, EngineConfig, parse_config
from pd_tools.enginesim.live_engine import LiveEngine
from pd_tools.enginesim.vllm_api import FILLER_TOKEN
from pdcases import SAMPLES, load_sample

NIXL_PRODUCER = '{"kv_connector":"NixlConnector","kv_role":"kv_producer"}'
NIXL_CONSUMER = '{"kv_connector":"NixlConnector","kv_role":"kv_consumer"}'
BASE_ENV = {"PD_SIM_HARDWARE": "h200", "PD_SIM_MODEL": "glm-4.5-fp8", "PD_SIM_LOAD_SECONDS": "0"}
MODEL = "zai-org/GLM-4.6-FP8"
TIMEOUT = aiohttp.ClientTimeout(total=30)


def config_of(*flags: str, **env: str) -> EngineConfig:
    """An engine's configuration on 127.0.0.1, any free port."""
    argv = ["vllm", "serve", MODEL, "--host", "127.0.0.1", "--port", "0", "-tp", "8", *flags]
    return parse_config(argv, BASE_ENV | env)


class Served:
    """A running engine and a client session to it."""

    def __init__(
        self,
        server: http_engine.EngineServer,
        runner: web.AppRunner,
        url: str,
        session: aiohttp.ClientSession,
    ) -> None:
        self.server = server
        self.runner = runner
        self.url = url
        self.session = session

    @property
    def engine(self) -> LiveEngine:
        return self.server.engine

    async def post(
        self, path: str, body: Mapping[str, Any], headers: Mapping[str, str] | None = None
    ) -> tuple[int, Any]:
        async with self.session.post(self.url + path, json=body, headers=headers) as response:
            return response.status, await response.json()

    async def stream(self, path: str, body: Mapping[str, Any]) -> list[dict[str, Any]]:
        """Every SSE event's JSON until [DONE] (which must come)."""
        events: list[dict[str, Any]] = []
        async with self.session.post(self.url + path, json=body) as response:
            assert response.status == 200, await response.text()
            assert response.headers["Content-Type"].startswith("text/event-stream")
            async for line in response.content:
                if line == b"data: [DONE]\n":
                    return events
                if line.startswith(b"data: "):
                    events.append(json.loads(line[6:]))
        raise AssertionError("the stream ended without [DONE]")

    async def metrics(self) -> dict[str, float]:
        """Every sample on /metrics (parsed by prometheus_client: the text must be valid)."""
        async with self.session.get(self.url + "/metrics") as response:
            text = await response.text()
        samples: dict[str, float] = {}
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                extra = {
                    k: v for k, v in sample.labels.items() if k not in ("model_name", "engine")
                }
                key = sample.name + "".join(f"[{k}={v}]" for k, v in sorted(extra.items()))
                samples[key] = sample.value
        return samples


@asynccontextmanager
async def serving(config: EngineConfig) -> AsyncIterator[Served]:
    server, runner = await http_engine.start_engine(config)
    host, port = runner.addresses[0][:2]
    try:
        async with aiohttp.ClientSession(timeout=TIMEOUT) as session:
            yield Served(server, runner, f"http://{host}:{port}", session)
    finally:
        await http_engine.stop_engine(server, runner)


def tokens_in_stream(events: list[dict[str, Any]]) -> int:
    texts = [
        choice.get("text") or choice.get("delta", {}).get("content") or ""
        for event in events
        for choice in event["choices"]
    ]
    return sum(text.count(FILLER_TOKEN) for text in texts)


# --- the command line -----------------------------------------------------------------------


VLLM_SAMPLES = [
    p for p in SAMPLES if parse_pddeployment(load_sample(p)).spec.model.engine == "VLLM"
]


@pytest.mark.parametrize("sample", VLLM_SAMPLES, ids=lambda p: p.stem)
@pytest.mark.parametrize("role", ["prefill", "decode"])
def test_the_operators_engine_command_line_is_taken_verbatim(sample, role):
    spec = parse_pddeployment(load_sample(sample)).spec
    pool = spec.pools(role)[0]
    argv = engine_command(spec, role, pool)
    env = BASE_ENV | {"PD_SIM_HARDWARE": pool.accelerator.profile or "h200"}
    config = parse_config(argv, env)
    assert config.served_names == (spec.model.name,)
    assert config.role == role
    assert config.kv_endpoint.tp_size == pool.accelerator.per_replica
    assert config.max_model_len == (spec.model.context_length or GLM_45_FP8.max_context_tokens)
    assert config.host == "127.0.0.1"  # no --host: loopback, never every address


def test_flags_it_does_not_model_are_ignored_and_kv_dtype_sizes_the_cache():
    fp8 = config_of(
        "--kv-cache-dtype", "fp8", "--gpu-memory-utilization", "0.95", "--trust-remote-code"
    )
    bf16 = config_of("--kv-cache-dtype", "bfloat16")
    assert fp8.ignored_args == ("--gpu-memory-utilization", "0.95", "--trust-remote-code")
    assert bf16.kv_bytes_per_token == 2 * fp8.kv_bytes_per_token
    assert fp8.spec.kv_capacity_tokens > bf16.spec.kv_capacity_tokens
    assert config_of("--max-num-seqs", "7").spec.max_batch_sequences == 7
    assert config_of().max_waiting == 1024  # vLLM's --max-num-seqs default on >= 70 GiB cards


SERVE = ["vllm", "serve", "m", "-tp", "8"]


@pytest.mark.parametrize(
    ("argv", "env", "names"),
    [
        (SERVE, {"PD_SIM_MODEL": "glm-4.5-fp8"}, "PD_SIM_HARDWARE"),
        (SERVE, BASE_ENV | {"PD_SIM_MODEL": "gpt-9"}, "PD_SIM_MODEL"),
        (SERVE, BASE_ENV | {"PD_SIM_HARDWAR": "h200"}, "PD_SIM_HARDWAR"),
        (SERVE, BASE_ENV | {"PD_SIM_TIME_SCALE": "0"}, "PD_SIM_TIME_SCALE"),
        (SERVE, BASE_ENV | {"PD_SIM_MAX_WAITING": "-1"}, "PD_SIM_MAX_WAITING"),
        ([*SERVE, "--kv-transfer-config", "{x"], BASE_ENV, "--kv-transfer-config"),
        ([*SERVE, "--kv-transfer-config", '{"kv_connector":"NixlConnector",'
          '"kv_role":"sender"}'], BASE_ENV, "kv_role"),
        ([*SERVE, "-tp", "two"], BASE_ENV, "--tensor-parallel-size"),
        ([*SERVE, "-tp", "1"], BASE_ENV, "--tensor-parallel-size"),  # doesn't fit
        ([*SERVE, "--kv-cache-dtype", "int3"], BASE_ENV, "--kv-cache-dtype"),
        (["python3", "-m", "sglang.launch_server"], BASE_ENV, "vllm serve"),
    ],
)  # fmt: skip
def test_bad_input_names_the_flag_or_variable(argv, env, names):
    with pytest.raises(ConfigError, match=names):
        parse_config(argv, env)


def test_bad_input_exits_2_with_the_fix(monkeypatch, capsys):
    monkeypatch.delenv("PD_SIM_HARDWARE", raising=False)
    assert http_engine.main(["vllm", "serve", "m"]) == 2
    error = capsys.readouterr().err
    assert "PD_SIM_HARDWARE is not set" in error and "h200" in error


# --- the PD hand-off, as vllm-router 0.1.17 drives it ---------------------------------------

# What vllm-router sends a prefill engine for a client's /v1/completions (recorded from the
# binary: docs/engine-simulator.md): max_tokens and min_tokens 1, no streaming, and
# kv_transfer_params asking to keep the KV for a remote decode; X-Request-ID names both ends.
ROUTER_REQUEST_ID = "___prefill_addr_127.0.77.1:8000___decode_addr_127.0.77.2:8000_0c2f5e"
ROUTER_PREFILL_BODY = {
    "model": MODEL,
    "prompt": " ".join(["word"] * 40),
    "max_tokens": 1,
    "stream": False,
    "echo": False,
    "min_tokens": 1,
    "ignore_eos": True,
    "skip_special_tokens": True,
    "kv_transfer_params": {
        "do_remote_decode": True,
        "do_remote_prefill": False,
        "remote_engine_id": None,
        "remote_block_ids": None,
        "remote_host": None,
        "remote_port": None,
    },
}


async def test_prefill_answers_the_kv_transfer_params_the_router_forwards(monkeypatch):
    monkeypatch.setenv("VLLM_NIXL_SIDE_CHANNEL_HOST", "127.0.77.1")
    config = parse_config(
        ["vllm", "serve", MODEL, "--host", "127.0.0.1", "--port", "0", "-tp", "8",
         "--kv-transfer-config", NIXL_PRODUCER],
        BASE_ENV | {"VLLM_NIXL_SIDE_CHANNEL_HOST": "127.0.77.1"},
    )  # fmt: skip
    async with serving(config) as served:
        status, body = await served.post(
            "/v1/completions", ROUTER_PREFILL_BODY, {"X-Request-ID": ROUTER_REQUEST_ID}
        )
    assert status == 200
    assert body["id"] == f"cmpl-{ROUTER_REQUEST_ID}"
    assert body["usage"]["completion_tokens"] == 1
    assert body["choices"][0]["finish_reason"] == "length"
    params = body["kv_transfer_params"]
    # NixlConnectorScheduler.request_finished's shape: what the decode side needs to pull.
    assert params == {
        "do_remote_prefill": True,
        "do_remote_decode": False,
        "remote_block_ids": params["remote_block_ids"],
        "remote_engine_id": config.kv_endpoint.engine_id,
        "remote_request_id": f"cmpl-{ROUTER_REQUEST_ID}-0",
        "remote_host": "127.0.77.1",
        "remote_port": 5600,
        "tp_size": 8,
    }
    assert len(params["remote_block_ids"]) == math.ceil(40 / 16)


async def test_decode_pulls_the_kv_the_prefill_handed_off_and_computes_it_without():
    async with serving(config_of("--kv-transfer-config", NIXL_PRODUCER)) as prefill:
        _, handed = await prefill.post("/v1/completions", ROUTER_PREFILL_BODY)
    original = ROUTER_PREFILL_BODY | {"max_tokens": 12, "min_tokens": 3}
    async with serving(config_of("--kv-transfer-config", NIXL_CONSUMER)) as decode:
        # The router's decode request: the client's own body plus the prefill's params.
        decode_body = original | {"kv_transfer_params": handed["kv_transfer_params"]}
        status, body = await decode.post("/v1/completions", decode_body)
        assert status == 200 and body["usage"]["completion_tokens"] == 12
        assert body["kv_transfer_params"] is None
        metrics = await decode.metrics()
        assert metrics["vllm:prompt_tokens_by_source_total[source=external_kv_transfer]"] == 40
        assert metrics["vllm:prompt_tokens_by_source_total[source=local_compute]"] == 0
        # No usable params (a prefill that answered none): vLLM computes the prompt itself.
        status, body = await decode.post("/v1/completions", original | {"kv_transfer_params": {}})
        assert status == 200 and body["usage"]["completion_tokens"] == 12
        metrics = await decode.metrics()
        assert metrics["vllm:prompt_tokens_by_source_total[source=local_compute]"] == 40
        assert metrics["vllm:prompt_tokens_total"] == 80


async def test_mooncake_hands_off_host_and_port_only():
    mooncake = '{"kv_connector":"MooncakeConnector","kv_role":"kv_producer"}'
    async with serving(config_of("--kv-transfer-config", mooncake)) as served:
        _, body = await served.post("/v1/completions", ROUTER_PREFILL_BODY)
    assert body["kv_transfer_params"] == {
        "do_remote_prefill": True,
        "do_remote_decode": False,
        "remote_host": "127.0.0.1",
        "remote_port": 8998,
    }


async def test_model_list_health_and_unknown_model():
    async with serving(config_of("--served-model-name", "glm", "glm-alias")) as served:
        async with served.session.get(served.url + "/v1/models") as response:
            models = await response.json()
        assert [m["id"] for m in models["data"]] == ["glm", "glm-alias"]
        status, body = await served.post("/v1/completions", {"model": "other", "prompt": "x"})
        assert status == 404 and body["error"]["type"] == "NotFoundError"


# --- answers ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/completions", {"prompt": "one two three", "max_tokens": 9}),
        ("/v1/completions", {"prompt": [1, 2, 3], "max_tokens": 9, "ignore_eos": True}),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "one two three"}],
                                  "max_completion_tokens": 9, "min_tokens": 9}),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": [
            {"type": "text", "text": "one two three"}]}], "max_tokens": 9}),
    ],
)  # fmt: skip
async def test_answers_have_exactly_max_tokens_streamed_or_not(path, body):
    async with serving(config_of()) as served:
        status, answer = await served.post(path, body)
        assert status == 200
        choice = answer["choices"][0]
        text = choice.get("text") or choice["message"]["content"]
        assert text.count(FILLER_TOKEN) == 9 and answer["usage"]["completion_tokens"] == 9
        assert answer["usage"]["prompt_tokens"] == 3
        events = await served.stream(
            path, body | {"stream": True, "stream_options": {"include_usage": True}}
        )
    assert tokens_in_stream(events) == 9
    finishes = [c["finish_reason"] for e in events for c in e["choices"] if c["finish_reason"]]
    assert finishes == ["length"]
    assert events[-1]["choices"] == [] and events[-1]["usage"]["completion_tokens"] == 9


async def test_defaults_and_refusals_follow_vllm():
    async with serving(config_of("--max-model-len", "100")) as served:
        _, answer = await served.post("/v1/completions", {"prompt": "a b"})
        assert answer["usage"]["completion_tokens"] == 16  # CompletionRequest's default
        _, answer = await served.post("/v1/chat/completions", {"messages": [{"content": "a b"}]})
        assert answer["usage"]["completion_tokens"] == 98  # the rest of the context
        for bad in (
            {"prompt": "a", "max_tokens": 100},  # beyond --max-model-len
            {"prompt": "a", "max_tokens": 0},
            {"prompt": "a", "max_tokens": 2, "min_tokens": 3},
            {"prompt": "a", "n": 2},
            {"prompt": "a", "stream_options": {"include_usage": True}},
            {"prompt": ["a", "b"]},
        ):
            status, body = await served.post("/v1/completions", bad)
            assert status == 400 and body["error"]["type"] == "BadRequestError", bad


# --- bounded, like vLLM ------------------------------------------------------------------------


async def test_beyond_running_and_waiting_bounds_requests_get_429_at_once():
    # One sequence runs, two wait; each stream is long in wall time (time scale 20).
    config = config_of("--max-num-seqs", "1", PD_SIM_MAX_WAITING="2", PD_SIM_TIME_SCALE="20")
    async with serving(config) as served:
        body = {"prompt": "a b c", "max_tokens": 1000, "stream": True}
        held = [await served.session.post(served.url + "/v1/completions", json=body)]
        for _ in range(2):
            held.append(await served.session.post(served.url + "/v1/completions", json=body))
        assert all(r.status == 200 for r in held)
        started = time.monotonic()
        async with served.session.post(served.url + "/v1/completions", json=body) as refused:
            assert refused.status == 429 and refused.headers["Retry-After"] == "1"
            assert (await refused.json())["error"]["code"] == 429
        assert time.monotonic() - started < 5  # at once, not after a queue
        metrics = await served.metrics()
        assert metrics["vllm:num_requests_running"] == 1
        assert metrics["vllm:num_requests_waiting"] == 2
        async with served.session.get(served.url + "/health") as health:
            assert health.status == 200  # full is not unhealthy: the router keeps the engine
        # A client that hangs up frees its sequence; the next request is taken.
        for response in held:
            response.close()
        for _ in range(100):
            if served.engine.running + served.engine.waiting == 0:
                break
            await asyncio.sleep(0.05)
        assert (served.engine.running, served.engine.waiting, served.engine.kv_usage) == (0, 0, 0)
        status, _ = await served.post("/v1/completions", {"prompt": "a", "max_tokens": 1})
        assert status == 200


# --- readiness, metrics, shutdown ---------------------------------------------------------------


async def test_health_is_503_while_the_model_loads_then_200():
    async with serving(config_of(PD_SIM_LOAD_SECONDS="0.5")) as served:
        async with served.session.get(served.url + "/health") as response:
            assert response.status == 503
        status, body = await served.post("/v1/completions", {"prompt": "a"})
        assert status == 503 and "loading" in body["error"]["message"]
        for _ in range(100):
            async with served.session.get(served.url + "/health") as response:
                if response.status == 200:
                    break
            await asyncio.sleep(0.05)
        assert response.status == 200
        status, _ = await served.post("/v1/completions", {"prompt": "a"})
        assert status == 200


async def test_metrics_count_every_request_and_token():
    lengths = [1, 2, 5, 8]
    async with serving(config_of()) as served:
        prompt = "a b c d"
        await asyncio.gather(
            *(served.post("/v1/completions", {"prompt": prompt, "max_tokens": n}) for n in lengths),
            served.stream("/v1/chat/completions", {"messages": [{"content": "a b c d"}],
                                                   "max_tokens": 10, "stream": True}),
        )  # fmt: skip
        metrics = await served.metrics()
    lengths.append(10)
    assert metrics["vllm:time_to_first_token_seconds_count"] == len(lengths)
    assert metrics["vllm:e2e_request_latency_seconds_count"] == len(lengths)
    assert metrics["vllm:inter_token_latency_seconds_count"] == sum(n - 1 for n in lengths)
    assert metrics["vllm:inter_token_latency_seconds_bucket[le=+Inf]"] == sum(lengths) - 5
    assert metrics["vllm:generation_tokens_total"] == sum(lengths)
    assert metrics["vllm:prompt_tokens_total"] == 4 * len(lengths)
    assert metrics["vllm:request_success_total[finished_reason=length]"] == len(lengths)
    assert metrics["vllm:num_requests_running"] == metrics["vllm:kv_cache_usage_perc"] == 0


async def test_time_scale_keeps_latencies_in_model_seconds_and_counters_per_model_second():
    async with serving(config_of(PD_SIM_TIME_SCALE="0.5")) as served:
        await served.post("/v1/completions", {"prompt": "a b", "max_tokens": 11})
        metrics = await served.metrics()
    decode = served.server.config.spec.decode
    # Ten decode steps of one sequence holding the prompt and the tokens so far.
    model_itl_s = sum(decode.step_ms(1, 2 + k) for k in range(1, 11)) / 10 / 1000
    itl_mean = metrics["vllm:inter_token_latency_seconds_sum"] / (10 * 0.5)
    assert itl_mean == pytest.approx(model_itl_s, rel=1e-6)
    assert metrics["vllm:generation_tokens_total"] == 11 * 0.5


async def test_timing_follows_the_performance_model():
    # Llama-2-70B on two H200s: a dense model whose every decode step reads all weights (~20 ms).
    config = config_of("-tp", "2", PD_SIM_MODEL=LLAMA2_70B.name, PD_SIM_HARDWARE="h200")
    spec = config.spec
    short, long_prompt, tokens = 10, 3500, 40
    model_ttft = {n: spec.prefill.batch_ms([n]) / 1000 for n in (short, long_prompt)}
    model_decode_s = sum(spec.decode.step_ms(1, short + k) for k in range(1, tokens)) / 1000
    async with serving(config) as served:
        started = time.monotonic()
        events = await served.stream(
            "/v1/completions", {"prompt": "w " * short, "max_tokens": tokens, "stream": True}
        )
        wall = time.monotonic() - started
        assert tokens_in_stream(events) == tokens
        # Never faster than the model; slower only by what a loaded host adds.
        model_total = model_ttft[short] + model_decode_s
        assert 0.9 * model_total <= wall <= 3 * model_total + 1
        metrics = await served.metrics()
        itl_mean = metrics["vllm:inter_token_latency_seconds_sum"] / (tokens - 1)
        assert itl_mean == pytest.approx(model_decode_s / (tokens - 1), rel=0.05)
        # A user notices a long prompt's first token coming later, by about the model's gap.
        first: dict[int, float] = {}
        for prompt in (short, long_prompt):
            started = time.monotonic()
            async with served.session.post(
                served.url + "/v1/completions",
                json={"prompt": "w " * prompt, "max_tokens": 2, "stream": True},
            ) as response:
                await response.content.readline()
                first[prompt] = time.monotonic() - started
                await response.read()
    assert model_ttft[long_prompt] - model_ttft[short] > 0.3
    assert first[long_prompt] - first[short] > 0.5 * (model_ttft[long_prompt] - model_ttft[short])


async def test_draining_refuses_new_requests_and_lets_in_flight_streams_finish():
    async with serving(config_of(PD_SIM_TIME_SCALE="20")) as served:
        body = {"prompt": "a", "max_tokens": 30, "stream": True}
        in_flight = asyncio.ensure_future(served.stream("/v1/completions", body))
        await asyncio.sleep(0.3)
        stopping = asyncio.ensure_future(http_engine.stop_engine(served.server, served.runner))
        await asyncio.sleep(0.1)
        assert not served.server.ready  # /health answers 503 to whoever still asks
        with pytest.raises(aiohttp.ClientConnectionError):
            await served.post("/v1/completions", {"prompt": "a"})  # no longer listening
        events = await asyncio.wait_for(in_flight, 30)
        await asyncio.wait_for(stopping, 30)
    assert tokens_in_stream(events) == 30


async def test_a_drain_that_runs_out_aborts_what_is_left():
    async with serving(config_of(PD_SIM_TIME_SCALE="20", PD_SIM_DRAIN_SECONDS="0.2")) as served:
        body = {"prompt": "a", "max_tokens": 10_000, "stream": True}
        in_flight = asyncio.ensure_future(served.stream("/v1/completions", body))
        await asyncio.sleep(0.3)
        started = time.monotonic()
        await http_engine.stop_engine(served.server, served.runner)
        assert time.monotonic() - started < 5
        with pytest.raises((AssertionError, aiohttp.ClientPayloadError)):
            await asyncio.wait_for(in_flight, 10)  # cut off, without [DONE]
