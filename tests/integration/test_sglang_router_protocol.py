"""The real sglang-router drives the PD hand-off between two simulated SGLang engine processes.

A prefill engine (`--disaggregation-mode prefill`, MTT S5000) and a decode engine (`decode`,
H200) run as `python -m pd_tools.enginesim.http_engine python3 -m sglang.launch_server ...` on their
own loopback addresses; the unmodified `sglang_router.launch_router --pd-disaggregation` (the
pinned sglang-router wheel) starts while they still load the model, so it has to wait for their
/health. It sends every request to both engines at once with the same bootstrap room; the decode
engine waits at the prefill engine's bootstrap server until the room's prefill is done. Every
answer through the router must hold exactly the tokens asked for, and both engines' /metrics
must show every request: one token each on the prefill engine, every answer token on the decode
engine. No Kubernetes: this needs only the router's wheel.
"""

import asyncio
import importlib.util
import json
import os
import signal
import sys
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest

from pd_tools.enginesim.vllm_api import FILLER_TOKEN
from servingtools import (
    REQUEST_TIMEOUT,
    START_TIMEOUT_S,
    STOP_TIMEOUT_S,
    PDStack,
    complete,
    difference,
    free_port,
    metric_samples,
    missing,
    processes,
    wait_until_serving,
)

MODEL = "zai-org/GLM-4.6-FP8"
PREFILL_HOST, DECODE_HOST, ROUTER_HOST = "127.0.78.1", "127.0.78.2", "127.0.78.3"
LOAD_SECONDS = 2.0  # long enough that the router starts before the engines are ready
ROUTER_FIX = "make install  (the dev extra installs sglang-router)"


def require_router() -> None:
    """sglang-router importable by this Python; with CI=true its absence fails."""
    if importlib.util.find_spec("sglang_router") is None:
        missing("sglang-router is not installed in this Python", ROUTER_FIX)


def engine_argv(role: str, host: str, port: int, bootstrap_port: int) -> list[str]:
    """The command line the operator gives a pool pod (core/engine_args.py), with its own
    --host, --port and bootstrap port."""
    argv = [
        sys.executable, "-m", "pd_tools.enginesim.http_engine",
        "python3", "-m", "sglang.launch_server", "--model-path", MODEL,
        "--host", host, "--port", str(port), "--tp-size", "8", "--enable-metrics",
        "--context-length", "65536", "--kv-cache-dtype", "fp8_e4m3",
        "--disaggregation-mode", role, "--disaggregation-transfer-backend", "mooncake",
    ]  # fmt: skip
    if role == "prefill":
        argv += ["--disaggregation-bootstrap-port", str(bootstrap_port)]
    return argv


@pytest.fixture
def pd_stack(tmp_path: Path) -> Iterator[PDStack]:
    require_router()
    ports = {host: free_port(host) for host in (PREFILL_HOST, DECODE_HOST, ROUTER_HOST)}
    bootstrap_port = free_port(PREFILL_HOST)
    metrics_port = free_port(ROUTER_HOST)
    base_env = {
        **os.environ,
        "PD_SIM_MODEL": "glm-4.5-fp8",
        "PD_SIM_LOAD_SECONDS": str(LOAD_SECONDS),
        # Bounded well below the client's timeout: a lost room fails, never hangs.
        "SGLANG_DISAGGREGATION_WAITING_TIMEOUT": "30",
    }
    prefill_url = f"http://{PREFILL_HOST}:{ports[PREFILL_HOST]}"
    decode_url = f"http://{DECODE_HOST}:{ports[DECODE_HOST]}"
    with processes(tmp_path) as running:
        engines = [
            running.start(
                "prefill",
                engine_argv("prefill", PREFILL_HOST, ports[PREFILL_HOST], bootstrap_port),
                base_env | {"PD_SIM_HARDWARE": "mtt-s5000"},
            ),
            running.start(
                "decode",
                engine_argv("decode", DECODE_HOST, ports[DECODE_HOST], bootstrap_port),
                base_env | {"PD_SIM_HARDWARE": "h200"},
            ),
        ]
        running.start(
            "router",
            [sys.executable, "-m", "sglang_router.launch_router", "--pd-disaggregation",
             "--prefill", prefill_url, str(bootstrap_port), "--decode", decode_url,
             "--host", ROUTER_HOST, "--port", str(ports[ROUTER_HOST]),
             "--prometheus-host", ROUTER_HOST, "--prometheus-port", str(metrics_port),
             # The default re-checks an unready worker after 30 s.
             "--worker-startup-check-interval", "1",
             "--worker-startup-timeout-secs", str(int(START_TIMEOUT_S))],
            dict(os.environ),
        )  # fmt: skip
        router_url = f"http://{ROUTER_HOST}:{ports[ROUTER_HOST]}"
        yield PDStack(router_url, prefill_url, decode_url, engines, MODEL)


async def generate(
    session: aiohttp.ClientSession, url: str, stream: bool, tokens: int, words: int
) -> int:
    """Tokens in one answer of SGLang's native /generate (streamed: the whole text so far in
    every event, then [DONE])."""
    body = {"text": " ".join(["word"] * words), "stream": stream,
            "sampling_params": {"max_new_tokens": tokens, "ignore_eos": True}}  # fmt: skip
    async with session.post(url + "/generate", json=body) as response:
        assert response.status == 200, await response.text()
        if not stream:
            answer = await response.json()
            assert answer["meta_info"]["completion_tokens"] == answer["text"].count(FILLER_TOKEN)
            return int(answer["text"].count(FILLER_TOKEN))
        last, done = "", False
        async for line in response.content:
            if line == b"data: [DONE]\n":
                done = True
            elif line.startswith(b"data: "):
                last = json.loads(line[6:])["text"]
        assert done, "the stream ended without [DONE]"
        return last.count(FILLER_TOKEN)


@pytest.mark.integration
async def test_sglang_router_hands_every_request_from_prefill_to_decode(pd_stack: PDStack):
    url = pd_stack.router_url
    async with aiohttp.ClientSession(timeout=REQUEST_TIMEOUT) as session:
        waited = await wait_until_serving(session, pd_stack)
        assert waited >= LOAD_SECONDS * 0.5  # it did wait for the engines to load
        # The router names the model after the engines' /get_server_info (its own answer says
        # text/plain).
        async with session.get(url + "/v1/models") as response:
            assert [m["id"] for m in json.loads(await response.text())["data"]] == [MODEL]
        engines = (pd_stack.prefill_url, pd_stack.decode_url)
        before = [await metric_samples(session, engine) for engine in engines]
        # (chat, stream, max tokens, prompt words): every OpenAI endpoint and mode one at a time,
        # then a concurrent burst of them; and the native /generate, streamed and not.
        modes = [(False, False), (False, True), (True, False), (True, True)]
        cases = [(chat, stream, 3 + 4 * i, 5 + i) for i, (chat, stream) in enumerate(modes)]
        burst = [(n % 2 == 0, n % 3 == 0, 2 + n, 20 + n) for n in range(24)]
        native = [(False, 6, 9), (True, 7, 11)]
        results = [await complete(session, url, MODEL, *case) for case in cases]
        results += await asyncio.gather(*(complete(session, url, MODEL, *case) for case in burst))
        results += [await generate(session, url, *case) for case in native]
        cases += burst
        assert results == [tokens for _, _, tokens, _ in cases] + [t for _, t, _ in native]
        after = [await metric_samples(session, engine) for engine in engines]
    prefill, decode = (difference(old, new) for old, new in zip(before, after, strict=True))
    requests = len(cases) + len(native)
    prompt_tokens = sum(words for *_, words in cases) + sum(w for *_, w in native)
    answer_tokens = sum(tokens for _, _, tokens, _ in cases) + sum(t for _, t, _ in native)
    # Prefill: computed every prompt and made its one token (the router discards the answer).
    assert prefill["sglang:num_requests_total"] == requests
    assert prefill["sglang:time_to_first_token_seconds_count"] == requests
    assert prefill["sglang:prompt_tokens_total"] == prompt_tokens
    assert prefill["sglang:generation_tokens_total"] == requests
    # Decode: waited for each room's prefill, pulled the KV and generated every answer token.
    assert decode["sglang:num_requests_total"] == requests
    assert decode["sglang:prompt_tokens_total"] == prompt_tokens
    assert decode["sglang:generation_tokens_total"] == answer_tokens
    assert decode["sglang:inter_token_latency_seconds_count"] == answer_tokens - requests
    assert after[1]["sglang:num_queue_reqs"] == after[1]["sglang:num_running_reqs"] == 0
    # Both engines drain and exit 0 on SIGTERM.
    for engine in pd_stack.engines:
        engine.popen.send_signal(signal.SIGTERM)
        assert engine.popen.wait(STOP_TIMEOUT_S) == 0, engine.tail()
