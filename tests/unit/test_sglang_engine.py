"""The engine simulator as SGLang: its command line, the PD hand-off sglang-router 0.3.2 drives
(the same body, with a bootstrap room, to a prefill and a decode engine at once; the decode
engine waits at the prefill engine's bootstrap server for the room's prefill), the bounds on that
wait and on the engine, and the endpoints and metric names the router and the operator read.

Each test serves engines in-process on 127.0.0.1 (free ports) with no load time.
"""

import asyncio
import itertools
import json
import time
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from typing import Any

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from pd_operator.api import parse_pddeployment
from pd_operator.core.engine_args import engine_command
from pd_tools.enginesim import http_engine
from pd_tools.enginesim.http_engine import ConfigError, EngineConfig, EngineServer, parse_config
from pd_tools.enginesim.sglang_api import RoomOutcome, RoomState, RoomTable, bootstrap_of
from pd_tools.enginesim.vllm_api import FILLER_TOKEN
from pdcases import SAMPLES, load_sample

MODEL = "zai-org/GLM-4.6-FP8"
BASE_ENV = {"PD_SIM_HARDWARE": "h200", "PD_SIM_MODEL": "glm-4.5-fp8", "PD_SIM_LOAD_SECONDS": "0"}
LAUNCH = ["python3", "-m", "sglang.launch_server"]
TIMEOUT = aiohttp.ClientTimeout(total=30)


def config_of(mode: str, *flags: str, **env: str) -> EngineConfig:
    """An SGLang engine on 127.0.0.1, any free port (the bootstrap server's too)."""
    argv = [*LAUNCH, "--model-path", MODEL, "--host", "127.0.0.1", "--port", "0",
            "--tp-size", "8", "--enable-metrics", "--disaggregation-mode", mode,
            "--disaggregation-bootstrap-port", "0", *flags]  # fmt: skip
    return parse_config(argv, BASE_ENV | env)


class Served:
    """A running engine and a client session to it."""

    def __init__(self, server: EngineServer, url: str, session: aiohttp.ClientSession) -> None:
        self.server = server
        self.url = url
        self.session = session

    @property
    def bootstrap_port(self) -> int:
        assert self.server.bootstrap_runner is not None
        port: int = self.server.bootstrap_runner.addresses[0][1]
        return port

    async def post(self, path: str, body: Mapping[str, Any]) -> tuple[int, Any]:
        async with self.session.post(self.url + path, json=body) as response:
            return response.status, await response.json()

    async def get(self, path: str) -> tuple[int, str]:
        async with self.session.get(self.url + path) as response:
            return response.status, await response.text()

    async def metrics(self) -> dict[str, float]:
        _, text = await self.get("/metrics")
        return {
            sample.name: sample.value
            for family in text_string_to_metric_families(text)
            for sample in family.samples
            if "le" not in sample.labels
        }


@asynccontextmanager
async def serving(config: EngineConfig) -> AsyncIterator[Served]:
    server, runner = await http_engine.start_engine(config)
    host, port = runner.addresses[0][:2]
    try:
        async with aiohttp.ClientSession(timeout=TIMEOUT) as session:
            yield Served(server, f"http://{host}:{port}", session)
    finally:
        await http_engine.stop_engine(server, runner)


@asynccontextmanager
async def pd_pair(**decode_env: str) -> AsyncIterator[tuple[Served, Served]]:
    prefill_config, decode_config = config_of("prefill"), config_of("decode", **decode_env)
    async with serving(prefill_config) as prefill, serving(decode_config) as decode:
        yield prefill, decode


def routed(body: Mapping[str, Any], prefill: Served, room: int) -> dict[str, Any]:
    """`body` as sglang-router 0.3.2 sends it to both engines: the bootstrap fields injected."""
    return {**body, "bootstrap_host": "127.0.0.1", "bootstrap_port": prefill.bootstrap_port,
            "bootstrap_room": room}  # fmt: skip


def answer_tokens(answer: Mapping[str, Any]) -> int:
    choice = answer["choices"][0]
    text = choice["text"] if "text" in choice else choice["message"]["content"]
    assert answer["usage"]["completion_tokens"] == text.count(FILLER_TOKEN)
    return int(text.count(FILLER_TOKEN))


# --- the command line -----------------------------------------------------------------------


SGLANG_SAMPLES = [
    p for p in SAMPLES if parse_pddeployment(load_sample(p)).spec.model.engine == "SGLang"
]


@pytest.mark.parametrize("sample", SGLANG_SAMPLES, ids=lambda p: p.stem)
@pytest.mark.parametrize("role", ["prefill", "decode"])
def test_the_operators_engine_command_line_is_taken_verbatim(sample, role):
    spec = parse_pddeployment(load_sample(sample)).spec
    pool = spec.pools(role)[0]
    argv = engine_command(spec, role, pool)
    config = parse_config(argv, BASE_ENV | {"PD_SIM_HARDWARE": pool.accelerator.profile or "h200"})
    assert config.sglang and config.role == role
    assert config.served_names == (spec.model.name,)
    assert config.kv_endpoint.tp_size == pool.accelerator.per_replica
    assert config.max_model_len == spec.model.context_length
    assert (config.host, config.port, config.bootstrap_port) == ("0.0.0.0", 30000, 8998)
    assert config.metrics_enabled and config.ignored_args == ()


def test_defaults_and_a_whole_engine_without_disaggregation():
    config = parse_config([*LAUNCH, "--model-path", "m", "--tp-size", "8"], BASE_ENV)
    assert (config.host, config.port, config.role) == ("127.0.0.1", 30000, "both")
    assert not config.metrics_enabled  # SGLang serves /metrics only with --enable-metrics
    assert config.max_waiting == config.spec.max_batch_sequences == 1024
    queued = parse_config(
        [*LAUNCH, "--model", "m", "--tp-size", "8", "--max-running-requests", "4",
         "--max-queued-requests", "9", "--kv-cache-dtype", "bf16", "--page-size", "64"],
        BASE_ENV,
    )  # fmt: skip
    assert (queued.spec.max_batch_sequences, queued.max_waiting) == (4, 9)
    assert queued.kv_bytes_per_token == 2 * config.kv_bytes_per_token  # the profile's is fp8
    assert queued.ignored_args == ("--page-size", "64")


@pytest.mark.parametrize(
    ("flags", "names"),
    [
        (["--disaggregation-mode", "encode"], "--disaggregation-mode"),
        (["--tp-size", "1"], "--tp-size"),  # the weights do not fit
        (["--kv-cache-dtype", "fp8"], "--kv-cache-dtype"),  # vLLM's name, not SGLang's
        (["--max-queued-requests", "0"], "--max-queued-requests"),
        (["--disaggregation-bootstrap-port", "70000"], "--disaggregation-bootstrap-port"),
    ],
)
def test_bad_input_names_the_flag(flags, names):
    with pytest.raises(ConfigError, match=names):
        parse_config([*LAUNCH, "--model-path", "m", "--tp-size", "8", *flags], BASE_ENV)
    with pytest.raises(ConfigError, match="--model-path"):
        parse_config([*LAUNCH, "--tp-size", "8"], BASE_ENV)


# --- the PD hand-off, as sglang-router 0.3.2 drives it ------------------------------------------

# What sglang-router 0.3.2 sends both engines for a client's /v1/completions (recorded from the
# binary: docs/engine-simulator.md): the client's request re-serialized with the router's
# defaults, plus the prefill's bootstrap host and port and a random 64-bit room.
ROUTER_COMPLETION = {
    "model": MODEL,
    "prompt": " ".join(["word"] * 40),
    "max_tokens": 12,
    "stream": False,
    "echo": False,
    "no_stop_trim": False,
    "ignore_eos": False,
    "skip_special_tokens": True,
    "return_hidden_states": False,
}
ROUTER_CHAT = {
    "messages": [{"role": "user", "content": " ".join(["word"] * 40)}],
    "model": MODEL,
    "logprobs": False,
    "max_completion_tokens": 12,
    "stream": True,
    "no_stop_trim": False,
    "ignore_eos": False,
    "continue_final_message": False,
    "skip_special_tokens": True,
    "separate_reasoning": True,
    "stream_reasoning": True,
    "return_hidden_states": False,
}
ROOM = 5416380228813222319


async def test_prefill_makes_one_token_and_the_decode_pulls_the_kv_and_makes_the_answer():
    async with pd_pair() as (prefill, decode):
        body = routed(ROUTER_COMPLETION, prefill, ROOM)
        (d_status, d_answer), (p_status, p_answer) = await asyncio.gather(
            decode.post("/v1/completions", body), prefill.post("/v1/completions", body)
        )
        assert (p_status, answer_tokens(p_answer)) == (200, 1)  # SGLang's prefill: one token
        assert p_answer["choices"][0]["finish_reason"] == "length"
        assert (d_status, answer_tokens(d_answer)) == (200, 12)
        assert "kv_transfer_params" not in d_answer  # vLLM's, not SGLang's
        stats = decode.server.engine.stats
        assert (stats.prompt_tokens_transferred, stats.prompt_tokens_local) == (40, 0)
        assert prefill.server.engine.stats.prompt_tokens_local == 40
        assert prefill.server.rooms is not None and len(prefill.server.rooms) == 0  # collected


async def test_streamed_chat_through_both_engines():
    async with pd_pair() as (prefill, decode):
        body = routed(ROUTER_CHAT, prefill, ROOM)

        async def stream(served: Served) -> int:
            tokens, done = 0, False
            async with served.session.post(served.url + "/v1/chat/completions", json=body) as r:
                assert r.status == 200
                async for line in r.content:
                    if line.startswith(b"data: {"):
                        tokens += line.count(FILLER_TOKEN.encode())
                    done = done or line == b"data: [DONE]\n"
            assert done
            return tokens

        assert await asyncio.gather(stream(decode), stream(prefill)) == [12, 1]


async def test_the_decode_answer_waits_for_the_prefill_of_its_own_room():
    async with pd_pair() as (prefill, decode):
        waiting = asyncio.ensure_future(
            decode.post("/v1/completions", routed(ROUTER_COMPLETION, prefill, ROOM))
        )
        # Another room's prefill does not let it go.
        other = routed(ROUTER_COMPLETION, prefill, ROOM + 1)
        assert (await prefill.post("/v1/completions", other))[0] == 200
        await asyncio.sleep(0.5)
        assert not waiting.done()
        assert decode.server.engine.waiting == 1  # held, counted as waiting, KV reserved
        assert decode.server.engine.kv_usage > 0
        started = time.monotonic()
        status, _ = await prefill.post("/v1/completions", routed(ROUTER_COMPLETION, prefill, ROOM))
        assert status == 200
        status, answer = await asyncio.wait_for(waiting, 10)
        assert (status, answer_tokens(answer)) == (200, 12)
        # After the prefill: the transfer (40 tokens' KV) and 12 decode steps, no more.
        assert time.monotonic() - started < 5
        # The other room's outcome waits for a decode engine that never comes.
        assert prefill.server.rooms is not None and len(prefill.server.rooms) == 1


async def test_a_client_gone_while_its_decode_waits_frees_the_engine_and_the_wait():
    async with pd_pair() as (prefill, decode):
        rooms, engine = prefill.server.rooms, decode.server.engine
        assert rooms is not None
        waiting = asyncio.ensure_future(
            decode.post("/v1/completions", routed(ROUTER_COMPLETION, prefill, ROOM))
        )
        await asyncio.sleep(0.3)
        assert (engine.waiting, rooms.waiting) == (1, 1)
        waiting.cancel()
        for _ in range(100):
            if engine.waiting + rooms.waiting == 0:
                break
            await asyncio.sleep(0.02)
        assert (engine.running, engine.waiting, engine.kv_usage, rooms.waiting) == (0, 0, 0, 0)


async def test_a_room_whose_prefill_never_comes_fails_after_the_bound():
    async with pd_pair(SGLANG_DISAGGREGATION_WAITING_TIMEOUT="0.5") as (prefill, decode):
        started = time.monotonic()
        status, answer = await decode.post(
            "/v1/completions", routed(ROUTER_COMPLETION, prefill, ROOM)
        )
        waited = time.monotonic() - started
        assert status == 500 and answer["object"] == "error"
        assert "SGLANG_DISAGGREGATION_WAITING_TIMEOUT" in answer["message"]
        assert 0.4 <= waited < 5
        engine = decode.server.engine
        assert (engine.running, engine.waiting, engine.kv_usage) == (0, 0, 0)


async def test_a_prefill_engine_that_refuses_fails_the_room_at_once():
    # The prefill engine holds one request and queues one; each takes seconds (time scale 20).
    prefill_config = config_of(
        "prefill", "--max-running-requests", "1", "--max-queued-requests", "1",
        PD_SIM_TIME_SCALE="20",
    )  # fmt: skip
    async with serving(prefill_config) as prefill, serving(config_of("decode")) as decode:
        long_prompt = ROUTER_COMPLETION | {"prompt": " ".join(["w"] * 3000)}
        held = []
        for room in (1, 2):  # one in the prefill batch, then one queued
            post = prefill.post("/v1/completions", routed(long_prompt, prefill, room))
            held.append(asyncio.ensure_future(post))
            await asyncio.sleep(0.1)
        body = routed(ROUTER_COMPLETION, prefill, ROOM)
        started = time.monotonic()
        (d_status, d_answer), (p_status, p_answer) = await asyncio.gather(
            decode.post("/v1/completions", body), prefill.post("/v1/completions", body)
        )
        # 503, which sglang-router passes on and retries (it turns a 429 into a 500).
        assert p_status == 503 and p_answer["code"] == 503
        assert d_status == 503 and f"room {ROOM}" in d_answer["message"]
        assert time.monotonic() - started < 2
        for future in held:
            future.cancel()


async def test_an_unreachable_bootstrap_server_fails_at_once():
    async with serving(config_of("decode")) as decode:
        body = ROUTER_COMPLETION | {"bootstrap_host": "127.0.0.1", "bootstrap_port": 9,
                                    "bootstrap_room": ROOM}  # fmt: skip
        started = time.monotonic()
        status, answer = await decode.post("/v1/completions", body)
        assert status == 500 and "cannot reach the bootstrap server" in answer["message"]
        assert time.monotonic() - started < 5
        assert decode.server.engine.waiting == 0


async def test_without_a_room_the_decode_engine_computes_the_prompt_itself():
    async with serving(config_of("decode")) as decode:
        status, answer = await decode.post("/v1/completions", ROUTER_COMPLETION)
        assert (status, answer_tokens(answer)) == (200, 12)
        assert decode.server.engine.stats.prompt_tokens_local == 40


def test_a_missing_bootstrap_port_is_the_engines_own():
    boot = bootstrap_of({"bootstrap_host": "10.0.0.5", "bootstrap_port": None,
                         "bootstrap_room": 7})  # fmt: skip
    assert boot is not None and boot.port == 8998
    assert boot.room_url == "http://10.0.0.5:8998/pd-sim/rooms/7"
    assert bootstrap_of({"prompt": "x"}) is None


# --- bounded ---------------------------------------------------------------------------------


async def test_beyond_running_and_waiting_bounds_requests_get_503_at_once():
    config = config_of("null", "--max-running-requests", "1", "--max-queued-requests", "1",
                       PD_SIM_TIME_SCALE="20")  # fmt: skip
    async with serving(config) as served:
        body = {"prompt": "a b c", "max_tokens": 1000, "stream": True}
        held = []
        for _ in range(2):  # one runs, one waits
            held.append(await served.session.post(served.url + "/v1/completions", json=body))
            await asyncio.sleep(0.1)
        assert [response.status for response in held] == [200, 200]
        started = time.monotonic()
        status, answer = await served.post("/v1/completions", body)
        assert status == 503 and answer["code"] == 503
        assert time.monotonic() - started < 5
        for response in held:
            response.close()


async def test_room_outcomes_are_bounded_in_number_and_time():
    clock = [0.0]
    table = RoomTable(ttl_s=10, clock=lambda: clock[0], capacity=3)
    for room in range(5):
        table.finish(room, RoomOutcome(RoomState.READY))
    assert len(table) == 3  # the oldest were dropped
    assert (await table.wait(0, 0)).state is RoomState.PENDING
    assert (await table.wait(4, 0)).state is RoomState.READY
    assert (await table.wait(4, 0)).state is RoomState.PENDING  # handed out once
    clock[0] = 11
    assert (await table.wait(3, 0)).state is RoomState.PENDING  # expired
    table.finish(9, RoomOutcome(RoomState.FAILED, 503, "full"))
    assert len(table) == 1  # expired ones go as new ones come


# --- what the router and the operator read ---------------------------------------------------


async def test_server_and_model_info_name_the_model_and_no_tokenizer_to_download():
    async with serving(config_of("prefill")) as served:
        for path in ("/get_server_info", "/server_info", "/get_model_info", "/model_info"):
            status, text = await served.get(path)
            assert status == 200 and "model_path" not in text and "tokenizer_path" not in text
        async with served.session.get(served.url + "/get_server_info") as response:
            info = await response.json()
        assert info["served_model_name"] == MODEL
        assert info["disaggregation_mode"] == "prefill"
        assert (await served.get("/health"))[0] == (await served.get("/health_generate"))[0] == 200
        async with served.session.get(f"http://127.0.0.1:{served.bootstrap_port}/health") as r:
            assert r.status == 200


async def test_metrics_in_sglangs_names_and_only_when_enabled():
    async with serving(config_of("null")) as served:
        await served.post("/v1/completions", {"prompt": "a b c", "max_tokens": 4})
        metrics = await served.metrics()
    assert metrics["sglang:num_requests_total"] == 1
    assert metrics["sglang:prompt_tokens_total"] == 3
    assert metrics["sglang:generation_tokens_total"] == 4
    assert metrics["sglang:time_to_first_token_seconds_count"] == 1
    assert metrics["sglang:inter_token_latency_seconds_count"] == 3
    assert metrics["sglang:cached_tokens_total"] == 0
    gauges = {"sglang:num_queue_reqs", "sglang:num_running_reqs", "sglang:token_usage"}
    assert gauges <= set(metrics)
    config = parse_config([*LAUNCH, "--model-path", "m", "--tp-size", "8", "--port", "0"], BASE_ENV)
    async with serving(config) as served:
        assert (await served.get("/metrics"))[0] == 404


async def test_native_generate_streamed_and_not():
    async with serving(config_of("null")) as served:
        status, answer = await served.post("/generate", {"text": "a b c"})
        assert status == 200 and answer["text"].count(FILLER_TOKEN) == 128  # SamplingParams'
        assert answer["meta_info"]["finish_reason"] == {"type": "length", "length": 128}
        assert answer["meta_info"]["prompt_tokens"] == 3
        body = {"input_ids": [1, 2, 3, 4], "sampling_params": {"max_new_tokens": 7},
                "stream": True}  # fmt: skip
        async with served.session.post(served.url + "/generate", json=body) as response:
            lines = [line async for line in response.content if line.startswith(b"data: ")]
        assert lines[-1] == b"data: [DONE]\n"
        texts = [json.loads(line[6:])["text"] for line in lines[:-1]]
        assert texts[-1].count(FILLER_TOKEN) == 7  # the whole text so far in every event
        assert all(a in b for a, b in itertools.pairwise(texts))
        status, answer = await served.post("/generate", {"text": ["a", "b"]})
        assert status == 400 and answer["object"] == "error"


async def test_a_prefill_engine_still_loading_fails_the_room_at_once():
    loading = config_of("prefill", PD_SIM_LOAD_SECONDS="30")
    async with serving(loading) as prefill, serving(config_of("decode")) as decode:
        assert (await prefill.get("/health"))[0] == 503
        body = routed(ROUTER_COMPLETION, prefill, ROOM)
        started = time.monotonic()
        (d_status, d_answer), (p_status, _) = await asyncio.gather(
            decode.post("/v1/completions", body), prefill.post("/v1/completions", body)
        )
        assert (p_status, d_status) == (503, 503) and "loading" in d_answer["message"]
        assert time.monotonic() - started < 5
