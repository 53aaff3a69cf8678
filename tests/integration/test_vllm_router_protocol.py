"""The real vllm-router drives the PD hand-off between two simulated engine processes.

A prefill engine (kv_producer, MTT S5000) and a decode engine (kv_consumer, H200) run as
`python -m pd_tools.enginesim.http_engine vllm serve ...` on their own loopback addresses; the
unmodified `vllm-router --vllm-pd-disaggregation` (the binary of the pinned wheel) starts while
they still load the model, so it has to wait for their /health. Every answer through the router
must hold exactly the tokens asked for, and both engines' /metrics must show that every request
went through both: its prompt computed on the prefill engine, its KV pulled by the decode engine,
which generated every answer token. No Kubernetes: this needs only the router binary.
"""

import asyncio
import json
import os
import shutil
import signal
import sys
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest

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
PREFILL_HOST, DECODE_HOST, ROUTER_HOST = "127.0.77.1", "127.0.77.2", "127.0.77.3"
LOAD_SECONDS = 2.0  # long enough that the router starts before the engines are ready
ROUTER_FIX = "make install  (the dev extra installs vllm-router, which ships the binary)"


def router_binary() -> str:
    """The vllm-router beside this Python (or on PATH); with CI=true its absence fails."""
    beside = Path(sys.executable).with_name("vllm-router")
    found = str(beside) if beside.exists() else shutil.which("vllm-router")
    if found:
        return found
    missing("vllm-router not found beside the interpreter or on PATH", ROUTER_FIX)


def engine_argv(host: str, port: int, kv_role: str) -> list[str]:
    """The command line the operator gives a pool pod (core/engine_args.py), with a --host."""
    config = json.dumps({"kv_connector": "NixlConnector", "kv_role": kv_role})
    return [
        sys.executable, "-m", "pd_tools.enginesim.http_engine",
        "vllm", "serve", MODEL, "--port", str(port), "--host", host,
        "--tensor-parallel-size", "8", "--max-model-len", "65536", "--kv-cache-dtype", "fp8",
        "--kv-transfer-config", config,
    ]  # fmt: skip


@pytest.fixture
def pd_stack(tmp_path: Path) -> Iterator[PDStack]:
    router = router_binary()
    ports = {host: free_port(host) for host in (PREFILL_HOST, DECODE_HOST, ROUTER_HOST)}
    metrics_port = free_port(ROUTER_HOST)
    base_env = {
        **os.environ,
        "PD_SIM_MODEL": "glm-4.5-fp8",
        "PD_SIM_LOAD_SECONDS": str(LOAD_SECONDS),
    }
    prefill_url = f"http://{PREFILL_HOST}:{ports[PREFILL_HOST]}"
    decode_url = f"http://{DECODE_HOST}:{ports[DECODE_HOST]}"
    with processes(tmp_path) as running:
        engines = [
            running.start(
                "prefill", engine_argv(PREFILL_HOST, ports[PREFILL_HOST], "kv_producer"),
                base_env | {"PD_SIM_HARDWARE": "mtt-s5000",
                            "VLLM_NIXL_SIDE_CHANNEL_HOST": PREFILL_HOST},
            ),
            running.start(
                "decode", engine_argv(DECODE_HOST, ports[DECODE_HOST], "kv_consumer"),
                base_env | {"PD_SIM_HARDWARE": "h200", "VLLM_NIXL_SIDE_CHANNEL_HOST": DECODE_HOST},
            ),
        ]  # fmt: skip
        running.start(
            "router",
            [router, "--vllm-pd-disaggregation", "--prefill", prefill_url, "--decode", decode_url,
             "--host", ROUTER_HOST, "--port", str(ports[ROUTER_HOST]),
             "--prometheus-host", ROUTER_HOST, "--prometheus-port", str(metrics_port),
             # The default re-checks an unready worker every 30 s.
             "--worker-startup-check-interval", "1",
             "--worker-startup-timeout-secs", str(int(START_TIMEOUT_S))],
            dict(os.environ),
        )  # fmt: skip
        router_url = f"http://{ROUTER_HOST}:{ports[ROUTER_HOST]}"
        yield PDStack(router_url, prefill_url, decode_url, engines, MODEL)


@pytest.mark.integration
async def test_vllm_router_hands_every_request_from_prefill_to_decode(pd_stack: PDStack):
    async with aiohttp.ClientSession(timeout=REQUEST_TIMEOUT) as session:
        waited = await wait_until_serving(session, pd_stack)
        assert waited >= LOAD_SECONDS * 0.5  # it did wait for the engines to load
        urls = (pd_stack.prefill_url, pd_stack.decode_url)
        before = [await metric_samples(session, url, ["source"]) for url in urls]
        # (chat, stream, max tokens, prompt words): every endpoint and mode one at a time, then
        # a concurrent burst of them.
        modes = [(False, False), (False, True), (True, False), (True, True)]
        cases = [(chat, stream, 3 + 4 * i, 5 + i) for i, (chat, stream) in enumerate(modes)]
        burst = [(n % 2 == 0, n % 3 == 0, 2 + n, 20 + n) for n in range(24)]
        url = pd_stack.router_url
        results = [await complete(session, url, MODEL, *case) for case in cases]
        results += await asyncio.gather(*(complete(session, url, MODEL, *case) for case in burst))
        cases += burst
        assert results == [tokens for _, _, tokens, _ in cases]
        after = [await metric_samples(session, url, ["source"]) for url in urls]
    prefill, decode = (difference(old, new) for old, new in zip(before, after, strict=True))
    requests = len(cases)
    prompt_tokens = sum(words for *_, words in cases)
    answer_tokens = sum(tokens for _, _, tokens, _ in cases)
    # Prefill: computed every prompt and made one token each (the router discards it).
    assert prefill["vllm:request_success_total"] == requests
    assert prefill["vllm:time_to_first_token_seconds_count"] == requests
    assert prefill["vllm:prompt_tokens_by_source_total[local_compute]"] == prompt_tokens
    assert prefill["vllm:generation_tokens_total"] == requests
    # Decode: pulled every prompt's KV (computed none) and generated every answer token.
    assert decode["vllm:request_success_total"] == requests
    assert decode["vllm:prompt_tokens_by_source_total[external_kv_transfer]"] == prompt_tokens
    assert decode["vllm:prompt_tokens_by_source_total[local_compute]"] == 0
    assert decode["vllm:generation_tokens_total"] == answer_tokens
    assert decode["vllm:inter_token_latency_seconds_count"] == answer_tokens - requests
    # Both engines drain and exit 0 on SIGTERM.
    for engine in pd_stack.engines:
        engine.popen.send_signal(signal.SIGTERM)
        assert engine.popen.wait(STOP_TIMEOUT_S) == 0, engine.tail()
