"""The real vllm-router drives the PD hand-off between two simulated engine processes.

A prefill engine (kv_producer, MTT S5000) and a decode engine (kv_consumer, H200) run as
`python -m pd_operator.sim.http_engine vllm serve ...` on their own loopback addresses; the
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
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from pd_operator.sim.vllm_api import FILLER_TOKEN

MODEL = "zai-org/GLM-4.6-FP8"
PREFILL_HOST, DECODE_HOST, ROUTER_HOST = "127.0.77.1", "127.0.77.2", "127.0.77.3"
LOAD_SECONDS = 2.0  # long enough that the router starts before the engines are ready
START_TIMEOUT_S = 60.0
REQUEST_TIMEOUT = aiohttp.ClientTimeout(total=60)
STOP_TIMEOUT_S = 15.0
ROUTER_FIX = "make install  (the dev extra installs vllm-router, which ships the binary)"


def free_port(host: str) -> int:
    with socket.socket() as sock:
        sock.bind((host, 0))
        port: int = sock.getsockname()[1]
        return port


def router_binary() -> str:
    """The vllm-router beside this Python (or on PATH); with CI=true its absence fails."""
    beside = Path(sys.executable).with_name("vllm-router")
    found = str(beside) if beside.exists() else shutil.which("vllm-router")
    if found:
        return found
    message = "vllm-router not found beside the interpreter or on PATH"
    if os.environ.get("CI", "").lower() in {"1", "true", "yes"}:
        pytest.fail(message, pytrace=False)
    pytest.skip(f"{message}\n  fix: {ROUTER_FIX}")


@dataclass
class Process:
    name: str
    popen: subprocess.Popen[bytes]
    log: Path

    def tail(self) -> str:
        return f"--- {self.name} ({self.log}) ---\n{self.log.read_text()[-3000:]}"


def start(name: str, argv: list[str], env: dict[str, str], logs: Path) -> Process:
    log = logs / f"{name}.log"
    with log.open("wb") as out:
        popen = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env)
    return Process(name, popen, log)


def engine_argv(host: str, port: int, kv_role: str) -> list[str]:
    """The command line the operator gives a pool pod (core/engine_args.py), with a --host."""
    config = json.dumps({"kv_connector": "NixlConnector", "kv_role": kv_role})
    return [
        sys.executable, "-m", "pd_operator.sim.http_engine",
        "vllm", "serve", MODEL, "--port", str(port), "--host", host,
        "--tensor-parallel-size", "8", "--max-model-len", "65536", "--kv-cache-dtype", "fp8",
        "--kv-transfer-config", config,
    ]  # fmt: skip


@dataclass
class PDStack:
    router_url: str
    prefill_url: str
    decode_url: str
    engines: list[Process]


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
    processes: list[Process] = []
    try:
        processes.append(start(
            "prefill", engine_argv(PREFILL_HOST, ports[PREFILL_HOST], "kv_producer"),
            base_env | {"PD_SIM_HARDWARE": "mtt-s5000",
                        "VLLM_NIXL_SIDE_CHANNEL_HOST": PREFILL_HOST},
            tmp_path,
        ))  # fmt: skip
        processes.append(start(
            "decode", engine_argv(DECODE_HOST, ports[DECODE_HOST], "kv_consumer"),
            base_env | {"PD_SIM_HARDWARE": "h200", "VLLM_NIXL_SIDE_CHANNEL_HOST": DECODE_HOST},
            tmp_path,
        ))  # fmt: skip
        processes.append(start(
            "router",
            [router, "--vllm-pd-disaggregation", "--prefill", prefill_url, "--decode", decode_url,
             "--host", ROUTER_HOST, "--port", str(ports[ROUTER_HOST]),
             "--prometheus-host", ROUTER_HOST, "--prometheus-port", str(metrics_port),
             # The default re-checks an unready worker every 30 s.
             "--worker-startup-check-interval", "1",
             "--worker-startup-timeout-secs", str(int(START_TIMEOUT_S))],
            dict(os.environ), tmp_path,
        ))  # fmt: skip
        yield PDStack(f"http://{ROUTER_HOST}:{ports[ROUTER_HOST]}", prefill_url, decode_url,
                      processes[:2])  # fmt: skip
    finally:
        for process in processes:
            if process.popen.poll() is None:
                process.popen.send_signal(signal.SIGTERM)
        for process in processes:
            try:
                process.popen.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                process.popen.kill()
                process.popen.wait(STOP_TIMEOUT_S)
        # Captured: pytest shows the logs when the test fails.
        print("\n".join(process.tail() for process in processes))


async def wait_until_serving(session: aiohttp.ClientSession, stack: PDStack) -> float:
    """Seconds until the router answers a completion (it waits for both engines' /health)."""
    started = time.monotonic()
    body = {"model": MODEL, "prompt": "warm up", "max_tokens": 1}
    while time.monotonic() - started < START_TIMEOUT_S:
        for engine in stack.engines:
            assert engine.popen.poll() is None, engine.tail()
        try:
            async with session.post(stack.router_url + "/v1/completions", json=body) as response:
                if response.status == 200:
                    return time.monotonic() - started
        except aiohttp.ClientConnectionError:
            pass  # the router listens only once its workers are healthy
        await asyncio.sleep(0.2)
    raise AssertionError(f"the router did not serve within {START_TIMEOUT_S} s")


async def engine_metrics(session: aiohttp.ClientSession, url: str) -> dict[str, float]:
    async with session.get(url + "/metrics") as response:
        text = await response.text()
    return {
        sample.name + "".join(f"[{v}]" for k, v in sorted(sample.labels.items()) if k == "source"):
        sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if "le" not in sample.labels
    }  # fmt: skip


async def complete(
    session: aiohttp.ClientSession, url: str, chat: bool, stream: bool, tokens: int, words: int
) -> int:
    """Tokens in one answer through the router (a stream must end with [DONE])."""
    prompt = " ".join(["word"] * words)
    body: dict[str, Any] = {"model": MODEL, "stream": stream, "ignore_eos": True}
    if chat:
        path = "/v1/chat/completions"
        body |= {"messages": [{"role": "user", "content": prompt}], "max_completion_tokens": tokens}
    else:
        path = "/v1/completions"
        body |= {"prompt": prompt, "max_tokens": tokens}
    async with session.post(url + path, json=body) as response:
        assert response.status == 200, await response.text()
        if not stream:
            answer = await response.json()
            choice = answer["choices"][0]
            text = choice["message"]["content"] if chat else choice["text"]
            assert answer["usage"]["completion_tokens"] == text.count(FILLER_TOKEN)
            return int(text.count(FILLER_TOKEN))
        counted, done = 0, False
        async for line in response.content:
            if line == b"data: [DONE]\n":
                done = True
            elif line.startswith(b"data: "):
                for choice in json.loads(line[6:])["choices"]:
                    text = choice["delta"].get("content") if chat else choice["text"]
                    counted += (text or "").count(FILLER_TOKEN)
        assert done, "the stream ended without [DONE]"
        return counted


@pytest.mark.integration
async def test_vllm_router_hands_every_request_from_prefill_to_decode(pd_stack: PDStack):
    async with aiohttp.ClientSession(timeout=REQUEST_TIMEOUT) as session:
        waited = await wait_until_serving(session, pd_stack)
        assert waited >= LOAD_SECONDS * 0.5  # it did wait for the engines to load
        urls = (pd_stack.prefill_url, pd_stack.decode_url)
        before = [await engine_metrics(session, url) for url in urls]
        # (chat, stream, max tokens, prompt words): every endpoint and mode one at a time, then
        # a concurrent burst of them.
        modes = [(False, False), (False, True), (True, False), (True, True)]
        cases = [(chat, stream, 3 + 4 * i, 5 + i) for i, (chat, stream) in enumerate(modes)]
        burst = [(n % 2 == 0, n % 3 == 0, 2 + n, 20 + n) for n in range(24)]
        results = [await complete(session, pd_stack.router_url, *case) for case in cases]
        results += await asyncio.gather(
            *(complete(session, pd_stack.router_url, *case) for case in burst)
        )
        cases += burst
        assert results == [tokens for _, _, tokens, _ in cases]
        after = [await engine_metrics(session, url) for url in urls]
    prefill, decode = ({k: v - old.get(k, 0.0) for k, v in new.items()}
                       for old, new in zip(before, after, strict=True))  # fmt: skip
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
