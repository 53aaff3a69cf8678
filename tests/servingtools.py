"""Engine simulator processes behind a real PD router: ports, processes and a bounded stop, a
router found or the test skipped (failed under CI), and clients that count an answer's tokens.

Shared by the router protocol tests (tests/integration/test_*_router_protocol.py); everything is
bounded in time, and every process started is stopped when the test ends.
"""

import asyncio
import json
import os
import re
import signal
import socket
import subprocess
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from pd_tools.enginesim.vllm_api import FILLER_TOKEN

START_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 15.0
REQUEST_TIMEOUT = aiohttp.ClientTimeout(total=60)
_ANSI_COLOUR = re.compile(r"\x1b\[[0-9;]*m")  # sglang-router colours its log


def free_port(host: str) -> int:
    with socket.socket() as sock:
        sock.bind((host, 0))
        port: int = sock.getsockname()[1]
        return port


def missing(message: str, fix: str) -> NoReturn:
    """A tool the test needs is missing: skip, saying the fix; with CI=true, fail."""
    if os.environ.get("CI", "").lower() in {"1", "true", "yes"}:
        pytest.fail(message, pytrace=False)
    pytest.skip(f"{message}\n  fix: {fix}")


@dataclass
class Process:
    name: str
    popen: subprocess.Popen[bytes]
    log: Path

    def tail(self) -> str:
        text = _ANSI_COLOUR.sub("", self.log.read_text(errors="replace"))
        return f"--- {self.name} ({self.log}) ---\n{text[-3000:]}"

    def stop(self) -> int:
        """SIGTERM, then its exit code (killed when it does not exit in time)."""
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGTERM)
        try:
            return self.popen.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self.popen.kill()
            return self.popen.wait(STOP_TIMEOUT_S)


class Processes:
    """The processes a test started, each logging to its own file under `logs`."""

    def __init__(self, logs: Path) -> None:
        self.logs = logs
        self.started: list[Process] = []

    def start(self, name: str, argv: list[str], env: dict[str, str]) -> Process:
        log = self.logs / f"{name}.log"
        with log.open("wb") as out:
            popen = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env)
        process = Process(name, popen, log)
        self.started.append(process)
        return process


@contextmanager
def processes(logs: Path) -> Iterator[Processes]:
    """Start processes inside; all are stopped at the end, and their logs printed (pytest shows
    them when the test fails)."""
    running = Processes(logs)
    try:
        yield running
    finally:
        for process in running.started:
            if process.popen.poll() is None:
                process.popen.send_signal(signal.SIGTERM)
        for process in running.started:
            process.stop()
        print("\n".join(process.tail() for process in running.started))


@dataclass
class PDStack:
    """A router in front of one prefill and one decode engine process."""

    router_url: str
    prefill_url: str
    decode_url: str
    engines: list[Process]
    model: str


async def wait_until_serving(session: aiohttp.ClientSession, stack: PDStack) -> float:
    """Seconds until the router answers a completion (it waits for both engines' /health)."""
    started = time.monotonic()
    body = {"model": stack.model, "prompt": "warm up", "max_tokens": 1}
    while time.monotonic() - started < START_TIMEOUT_S:
        for engine in stack.engines:
            assert engine.popen.poll() is None, engine.tail()
        try:
            async with session.post(stack.router_url + "/v1/completions", json=body) as response:
                if response.status == 200:
                    return time.monotonic() - started
        except aiohttp.ClientConnectionError:
            pass  # vllm-router listens only once its workers are healthy
        await asyncio.sleep(0.2)
    raise AssertionError(f"the router did not serve within {START_TIMEOUT_S} s")


async def metric_samples(
    session: aiohttp.ClientSession, url: str, labels: Iterable[str] = ()
) -> dict[str, float]:
    """Every sample but histogram buckets on `url`/metrics, keyed by name and the values of
    `labels` (`name[value]`)."""
    keep = set(labels)
    async with session.get(url + "/metrics") as response:
        text = await response.text()
    return {
        sample.name + "".join(f"[{v}]" for k, v in sorted(sample.labels.items()) if k in keep):
        sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if "le" not in sample.labels
    }  # fmt: skip


def difference(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    return {key: value - before.get(key, 0.0) for key, value in after.items()}


async def complete(
    session: aiohttp.ClientSession,
    url: str,
    model: str,
    chat: bool,
    stream: bool,
    tokens: int,
    words: int,
) -> int:
    """Tokens in one OpenAI answer (a stream must end with [DONE])."""
    prompt = " ".join(["word"] * words)
    body: dict[str, Any] = {"model": model, "stream": stream, "ignore_eos": True}
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
