"""The HTTP load client against a tiny in-process OpenAI-style server: what a user would see."""

import asyncio
import csv
import json
import statistics
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from aiohttp import web

from pd_tools.workloads.http_load import (
    BAD_RESPONSE,
    DEADLINE,
    DISCONNECT,
    REJECTED,
    TIMEOUT,
    LoadConfig,
    LoadResult,
    main,
    prompt_text,
    run,
)
from pd_tools.workloads.traces import MOONCAKE_BLOCK_TOKENS, Request


@dataclass
class FakeEngine:
    """How the fake answers, and what it saw."""

    ttft_s: float = 0.05
    gap_s: float = 0.01
    tokens_per_chunk: int = 1
    status: int = 200
    hold_s: float = 0.0  # before answering at all
    cut_after: int | None = None  # tokens sent before ending the stream without [DONE]
    garbage: bool = False  # a data line that is not JSON
    bodies: list[dict[str, object]] = field(default_factory=list)
    concurrent: int = 0
    max_concurrent: int = 0


ENGINE = web.AppKey("engine", FakeEngine)


async def _answer(request: web.Request) -> web.StreamResponse:
    engine = request.app[ENGINE]
    body = await request.json()
    engine.bodies.append(body)
    engine.concurrent += 1
    engine.max_concurrent = max(engine.max_concurrent, engine.concurrent)
    try:
        await asyncio.sleep(engine.hold_s)
        if engine.status != 200:
            return web.Response(status=engine.status, text="engine overloaded, retry later")
        chat = request.path.endswith("/chat/completions")
        n = body["max_tokens"]
        if not body["stream"]:
            await asyncio.sleep(engine.ttft_s + engine.gap_s * (n - 1))
            text = " tok" * n
            choice = {"message": {"content": text}} if chat else {"text": text}
            return web.json_response({"choices": [choice], "usage": {"completion_tokens": n}})
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        if engine.garbage:
            await response.write(b"data: {not json\n\n")
            return response
        if chat:  # vLLM's chat stream opens with a role-only chunk
            await response.write(b'data: {"choices":[{"delta":{"role":"assistant"}}]}\n\n')
        await asyncio.sleep(engine.ttft_s)
        sent = 0
        while sent < n:
            if engine.cut_after is not None and sent >= engine.cut_after:
                return response
            if sent:
                await asyncio.sleep(engine.gap_s * engine.tokens_per_chunk)
            count = min(engine.tokens_per_chunk, n - sent)
            text = " tok" * count
            choice = {"delta": {"content": text}} if chat else {"text": text}
            await response.write(f"data: {json.dumps({'choices': [choice]})}\n\n".encode())
            sent += count
        usage = {"choices": [], "usage": {"completion_tokens": sent}}
        await response.write(f"data: {json.dumps(usage)}\n\ndata: [DONE]\n\n".encode())
        return response
    finally:
        engine.concurrent -= 1


@dataclass
class Server:
    url: str
    engine: FakeEngine


@pytest.fixture
def server() -> Iterator[Server]:
    """The fake on 127.0.0.1 in a thread of its own, so that the client runs its own loop."""
    engine = FakeEngine()
    app = web.Application()
    app[ENGINE] = engine
    app.router.add_post("/v1/completions", _answer)
    app.router.add_post("/v1/chat/completions", _answer)
    loop = asyncio.new_event_loop()
    runner = web.AppRunner(app, shutdown_timeout=0.5)
    loop.run_until_complete(runner.setup())
    site = web.TCPSite(runner, "127.0.0.1", 0)
    loop.run_until_complete(site.start())
    port = runner.addresses[0][1]
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    yield Server(f"http://127.0.0.1:{port}", engine)
    asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(timeout=5)
    loop.call_soon_threadsafe(loop.stop)
    thread.join(timeout=5)
    loop.close()


def requests_at(times: list[float], output_tokens: int = 10) -> list[Request]:
    return [Request(t, 32, output_tokens) for t in times]


def replay(server: Server, requests: list[Request], **options: object) -> LoadResult:
    return run(requests, LoadConfig(url=server.url, model="fake", **options))  # type: ignore[arg-type]


# --- what a user sees -------------------------------------------------------------------------


def test_a_stream_gives_every_token_with_the_first_after_ttft_and_the_rest_at_the_gap(server):
    server.engine.ttft_s, server.engine.gap_s = 0.1, 0.02
    result = replay(server, requests_at([0.0, 0.01, 0.02], output_tokens=20))
    assert result.summary.completed == 3 and result.summary.failed == {}
    for record in result.records:
        assert record.status == 200 and record.tokens == 20
        assert record.ttft_s == pytest.approx(0.1, abs=0.05)
        assert len(record.itl_s) == 19
        assert statistics.median(record.itl_s) == pytest.approx(0.02, abs=0.01)
        assert sum(record.itl_s) == pytest.approx(19 * 0.02, rel=0.3)
    assert result.summary.ttft_p50_s == pytest.approx(0.1, abs=0.05)
    assert result.summary.itl_p50_s == pytest.approx(0.02, abs=0.01)
    assert result.summary.tokens == 60


def test_a_chunk_of_several_tokens_spreads_its_gap_over_them(server):
    server.engine.gap_s, server.engine.tokens_per_chunk = 0.02, 4
    result = replay(server, requests_at([0.0], output_tokens=20))
    (record,) = result.records
    assert record.tokens == 20
    # The first chunk's 4 tokens give TTFT and no gaps; the other 16 share their chunks' gaps.
    assert len(record.itl_s) == 16
    assert statistics.median(record.itl_s) == pytest.approx(0.02, abs=0.01)


def test_the_chat_endpoint_streams_too(server):
    result = replay(server, requests_at([0.0], output_tokens=8), endpoint="chat")
    (record,) = result.records
    assert record.reason is None and record.tokens == 8 and len(record.itl_s) == 7
    assert "messages" in server.engine.bodies[0]


def test_without_streaming_the_tokens_come_from_usage_and_no_ttft_is_claimed(server):
    result = replay(server, requests_at([0.0, 0.0], output_tokens=5), stream=False)
    assert result.summary.completed == 2
    assert all(r.tokens == 5 and r.ttft_s is None and r.itl_s == [] for r in result.records)
    assert "stream_options" not in server.engine.bodies[0]


def test_the_request_asks_for_exactly_the_output_length(server):
    replay(server, [Request(0.0, 700, 33, hash_ids=(7, 8))])
    (body,) = server.engine.bodies
    assert body["max_tokens"] == body["min_tokens"] == 33
    assert body["ignore_eos"] is True and body["stream"] is True
    assert body["stream_options"] == {"include_usage": True}
    assert body["model"] == "fake"
    assert len(str(body["prompt"]).split()) == 700


# --- failures ---------------------------------------------------------------------------------


def test_503_answers_are_failures_with_their_reason_and_body(server):
    server.engine.status = 503
    result = replay(server, requests_at([0.0, 0.01, 0.02]))
    assert result.summary.completed == 0 and result.summary.failed == {"http_503": 3}
    assert all(r.status == 503 and "overloaded" in r.error for r in result.records)
    assert result.summary.sent == 3


def test_a_request_past_its_timeout_fails_as_a_timeout_without_waiting_for_the_answer(server):
    server.engine.hold_s = 5.0
    began = time.monotonic()
    result = replay(server, requests_at([0.0]), timeout_s=0.3)
    assert time.monotonic() - began < 2.0
    (record,) = result.records
    assert record.reason == TIMEOUT and record.status is None
    assert record.end_s is not None and record.start_s is not None
    assert record.end_s - record.start_s == pytest.approx(0.3, abs=0.2)


def test_the_run_deadline_ends_requests_still_in_flight(server):
    server.engine.hold_s = 5.0
    began = time.monotonic()
    result = replay(server, requests_at([0.0, 0.1, 2.0]), timeout_s=30, deadline_s=0.5)
    assert time.monotonic() - began < 2.0
    # The third arrival lies past the deadline: never offered.
    assert [r.reason for r in result.records] == [DEADLINE, DEADLINE]


def test_a_stream_that_ends_before_done_is_a_disconnect(server):
    server.engine.cut_after = 3
    (record,) = replay(server, requests_at([0.0])).records
    assert record.reason == DISCONNECT and record.tokens == 3 and record.status == 200


def test_a_data_line_that_is_not_json_is_a_bad_response(server):
    server.engine.garbage = True
    (record,) = replay(server, requests_at([0.0])).records
    assert record.reason == BAD_RESPONSE


def test_nothing_listening_is_a_disconnect(server):
    dead = "http://127.0.0.1:9"  # the discard port: nobody listens on it here
    result = run(requests_at([0.0]), LoadConfig(url=dead, model="fake", timeout_s=2))
    assert result.records[0].reason == DISCONNECT


# --- load shape -------------------------------------------------------------------------------


def test_requests_beyond_the_in_flight_bound_are_rejected_by_the_client_not_queued(server):
    server.engine.hold_s = 0.5
    result = replay(server, requests_at([i * 0.01 for i in range(10)]), max_in_flight=3)
    assert server.engine.max_concurrent <= 3
    assert result.summary.peak_in_flight == 3
    assert result.summary.sent == 3 and result.summary.completed == 3
    assert result.summary.failed == {REJECTED: 7}
    assert result.summary.offered == 10


def test_requests_go_out_at_their_arrival_times_whatever_the_answers(server):
    # Each answer takes 0.5 s; a closed-loop client would send the third at ~1 s.
    server.engine.hold_s = 0.5
    result = replay(server, requests_at([0.0, 0.2, 0.4]))
    starts = [r.start_s for r in result.records]
    assert starts == pytest.approx([0.0, 0.2, 0.4], abs=0.05)
    assert result.summary.peak_in_flight == 3
    assert result.summary.send_lag_p99_s < 0.05


def test_time_compression_replays_arrivals_faster(server):
    result = replay(server, requests_at([0.0, 1.0, 2.0]), time_compression=10)
    assert [r.start_s for r in result.records] == pytest.approx([0.0, 0.1, 0.2], abs=0.05)


def test_max_requests_bounds_an_endless_workload(server):
    endless = (Request(i * 0.001, 8, 2) for i in range(10**9))
    result = replay(server, endless, max_requests=5)  # type: ignore[arg-type]
    assert result.summary.offered == 5 and result.summary.completed == 5


# --- prompts ----------------------------------------------------------------------------------


def test_prompts_have_one_word_per_input_token():
    for tokens, ids in [(1, ()), (100, ()), (512, (1,)), (700, (1, 2)), (3000, (1, 2))]:
        assert len(prompt_text(Request(0, tokens, 1, hash_ids=ids), 0).split()) == tokens


def test_identical_prefix_blocks_give_identical_leading_words_and_different_ones_differ():
    block = MOONCAKE_BLOCK_TOKENS
    a = prompt_text(Request(0, 3 * block, 1, hash_ids=(10, 11, 12)), 0).split()
    b = prompt_text(Request(0, 3 * block, 1, hash_ids=(10, 11, 99)), 1).split()
    c = prompt_text(Request(0, 3 * block, 1, hash_ids=(20, 11, 12)), 2).split()
    assert a[: 2 * block] == b[: 2 * block]
    assert a[2 * block] != b[2 * block]
    assert a[0] != c[0]


def test_requests_without_a_shared_prefix_differ_from_the_first_word():
    a = prompt_text(Request(0, 50, 1), 0).split()
    b = prompt_text(Request(0, 50, 1), 1).split()
    assert a[0] != b[0]


def test_cached_tokens_without_block_ids_share_that_many_leading_words():
    a = prompt_text(Request(0, 100, 1, cached_tokens=40), 0).split()
    b = prompt_text(Request(0, 100, 1, cached_tokens=40), 1).split()
    assert a[:40] == b[:40] and a[40] != b[40]


# --- loopback only ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "url",
    ["http://10.0.0.1:8000", "http://example.com", "http://localhost:8000", "ftp://127.0.0.1"],
)
def test_only_loopback_addresses_are_dialed(url: str):
    with pytest.raises(ValueError, match="--url"):
        LoadConfig(url=url, model="m")


def test_the_command_line_refuses_a_non_loopback_url_naming_the_flag(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["--url", "http://192.168.1.1:80", "--model", "m", "--rate", "1"])
    assert exit_info.value.code == 2
    error = capsys.readouterr().err
    assert "--url" in error and "loopback" in error


# --- command line -----------------------------------------------------------------------------


def test_the_command_line_prints_the_summary_and_writes_a_row_per_request(
    server, capsys, tmp_path: Path
):
    out = tmp_path / "records.csv"
    code = main(
        [
            *("--url", server.url, "--model", "fake", "--rate", "20", "--duration", "0.5"),
            *("--input-tokens", "16", "--output-tokens", "4", "--csv", str(out)),
        ]
    )
    assert code == 0
    table = capsys.readouterr().out
    assert "TTFT p50 / p99" in table and "completed" in table
    rows = list(csv.DictReader(out.open()))
    assert rows and all(row["reason"] == "" and row["tokens"] == "4" for row in rows)


def test_the_command_line_replays_a_trace(server, capsys, tmp_path: Path):
    trace = tmp_path / "trace.jsonl"
    lines = [
        {"timestamp": 0, "input_length": 600, "output_length": 3, "hash_ids": [1, 2]},
        {"timestamp": 100, "input_length": 600, "output_length": 3, "hash_ids": [1, 3]},
    ]
    trace.write_text("".join(json.dumps(line) + "\n" for line in lines))
    code = main(["--url", server.url, "--model", "fake", "--trace", str(trace), "--duration", "1"])
    assert code == 0
    first, second = (str(b["prompt"]).split() for b in server.engine.bodies)
    block = MOONCAKE_BLOCK_TOKENS
    assert first[:block] == second[:block] and first[block] != second[block]
